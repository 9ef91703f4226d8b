/*
 * test_cluster_cli.c - the real `shardkv` binary against real daemons: every
 * command of doc/contract.md §5 with its output format and exit code (0 success, 1 not
 * found, 2 usage or invalid request (an unknown node too), 3 unavailable,
 * 4 rejected), `-` values
 * from stdin (binary, with NUL bytes), values that start with '-', keys
 * with bytes outside ASCII, and the JSON shapes of the admin commands with
 * such keys escaped one byte per code point.
 *
 * test_client_cluster.c runs the happy paths of the data commands through
 * the in-process CLI; this file runs the program itself and concentrates on
 * what that one does not check: exit codes, usage errors, stdin, binary
 * bytes and JSON.
 */
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#ifndef KV_CLI_BIN
#error "KV_CLI_BIN must name the shardkv binary"
#endif

static kv_tc tc;

static int
setup2(void **state)
{
	(void)state;
	return kv_tc_start(&tc, "cluster-cli", 2);
}

static int
teardown(void **state)
{
	(void)state;
	kv_tc_destroy(&tc);
	return 0;
}

/*
 * Runs `shardkv -c CONTROLLER ARGS...` (without -c when `ctl` is false),
 * with `in` on stdin. The argument list ends with NULL.
 */
static void
run_cli(kv_tc_run_result *r, bool ctl, const void *in, size_t inlen, char *const env[],
        const char *arg, ...)
{
	va_list ap;

	va_start(ap, arg);
	int rv = kv_tc_cliv(r, ctl ? tc.ctl_url : NULL, env, in, inlen, 30000, arg, ap);
	va_end(ap);
	assert_int_equal(rv, 0);
}

/* Prints bytes with escapes for a failure message. */
static const char *
show(const char *p, size_t n)
{
	static char buf[4][400];
	static int k;
	char *b = buf[k++ % 4];
	size_t o = 0;

	for (size_t i = 0; i < n && o + 5 < sizeof(buf[0]); i++) {
		unsigned char c = (unsigned char)p[i];
		if (c >= 0x20 && c < 0x7f && c != '\\')
			b[o++] = (char)c;
		else
			o += (size_t)snprintf(b + o, sizeof(buf[0]) - o, "\\x%02x", c);
	}
	b[o] = 0;
	return b;
}

/*
 * Fails unless the last run ended with `code` and, when `out` is not NULL,
 * printed exactly outlen bytes of `out`. `what` names the command.
 */
static void
check_run(const kv_tc_run_result *r, const char *what, int code, const char *out, size_t outlen)
{
	bool ok = r->code == code &&
	          (out == NULL || (r->nout == outlen && memcmp(r->out, out, outlen) == 0));
	if (!ok) {
		kv_tc_dump_logs(&tc, 20);
		fail_msg("shardkv %s: exit %d (want %d), stdout '%s' (want '%s'), stderr '%s'",
		         what, r->code, code, show(r->out, r->nout), out ? show(out, outlen) : "*",
		         show(r->err, r->nerr));
	}
}

/* Runs and checks in one go; OUT is a string literal (may hold NUL bytes). */
#define CLI(code, out, ...)                                                                        \
	do {                                                                                       \
		kv_tc_run_result r_;                                                               \
		run_cli(&r_, true, NULL, 0, NULL, __VA_ARGS__, NULL);                              \
		check_run(&r_, #__VA_ARGS__, (code), out, sizeof(out) - 1);                        \
		kv_tc_run_free(&r_);                                                               \
	} while (0)

/* Like CLI with `in` (a string literal, may hold NUL bytes) on stdin. */
#define CLI_IN(in, code, out, ...)                                                                 \
	do {                                                                                       \
		kv_tc_run_result r_;                                                               \
		run_cli(&r_, true, in, sizeof(in) - 1, NULL, __VA_ARGS__, NULL);                   \
		check_run(&r_, #__VA_ARGS__, (code), out, sizeof(out) - 1);                        \
		kv_tc_run_free(&r_);                                                               \
	} while (0)

/* A usage error: exit 2, nothing on stdout, one line on stderr. */
static void
check_usage_error(const kv_tc_run_result *r, const char *what)
{
	check_run(r, what, 2, "", 0);
	const char *nl = memchr(r->err, '\n', r->nerr);
	if (r->nerr == 0 || nl == NULL || (size_t)(nl - r->err) + 1 != r->nerr)
		fail_msg("shardkv %s: want one line on stderr, got '%s'", what,
		         show(r->err, r->nerr));
}

#define USAGE(...)                                                                                 \
	do {                                                                                       \
		kv_tc_run_result r_;                                                               \
		run_cli(&r_, true, NULL, 0, NULL, __VA_ARGS__, NULL);                              \
		check_usage_error(&r_, #__VA_ARGS__);                                              \
		kv_tc_run_free(&r_);                                                               \
	} while (0)

static void
usage_errors_exit_2_with_one_line_and_write_nothing(void **state)
{
	kv_tc_run_result r;
	(void)state;

	run_cli(&r, false, NULL, 0, NULL, NULL);
	check_usage_error(&r, "(no command)");
	kv_tc_run_free(&r);
	USAGE("frobnicate");
	USAGE("get");
	USAGE("get", "a", "b");
	USAGE("put", "a");
	USAGE("--timeout", "soon", "get", "a");
	USAGE("--no-such-option", "get", "a");
	USAGE("keys", "--limit", "3");
	USAGE("get", "a", "--wait");
	USAGE("config", "0");
	USAGE("config", "latest");
	USAGE("scan", "z", "a");
	USAGE("move", "n", "m", "1");
	/* An odd mput writes nothing; two values from stdin are refused too. */
	USAGE("mput", "odd1", "1", "odd2");
	CLI(1, "", "get", "odd1");
	kv_tc_run_result r2;
	run_cli(&r2, true, "x", 1, NULL, "mput", "odd1", "-", "odd2", "-", NULL);
	check_usage_error(&r2, "mput odd1 - odd2 -");
	kv_tc_run_free(&r2);
	CLI(1, "", "get", "odd1");

	/* --help is not an error. */
	run_cli(&r, false, NULL, 0, NULL, "--help", NULL);
	check_run(&r, "--help", 0, NULL, 0);
	assert_non_null(strstr(r.out, "usage: shardkv"));
	kv_tc_run_free(&r);
	run_cli(&r, false, NULL, 0, NULL, "move", "--help", NULL);
	check_run(&r, "move --help", 0, NULL, 0);
	assert_non_null(strstr(r.out, "move START END NODE"));
	kv_tc_run_free(&r);
}

static void
data_commands_print_raw_values_and_exit_1_when_not_found(void **state)
{
	(void)state;

	CLI(0, "", "put", "k", "v");
	CLI(0, "v\n", "get", "k");
	CLI(1, "", "get", "nope");
	/* Binary values from stdin, exactly as given (NUL, newline, 0xff). */
	CLI_IN("a\0b\nc\xff", 0, "", "put", "bin", "-");
	CLI(0, "a\0b\nc\xff\n", "get", "bin");
	CLI_IN("XY", 0, "", "append", "k", "-");
	CLI(0, "vXY\n", "get", "k");
	CLI(0, "", "append", "fresh", "new");
	CLI(0, "new\n", "get", "fresh");
	CLI_IN("TWO", 0, "", "mput", "m1", "one", "m2", "-", "m3", "three");
	CLI(0, "one\nTWO\nthree\n", "mget", "m1", "m2", "m3");
	/* Values that start with '-' after `--`; an empty value. */
	CLI(0, "", "put", "--", "dash", "-x");
	CLI(0, "-x\n", "get", "dash");
	CLI(0, "", "put", "empty", "");
	CLI(0, "\n", "get", "empty");

	/* mget with missing keys: exit 1, nothing on stdout, the keys named. */
	kv_tc_run_result r;
	run_cli(&r, true, NULL, 0, NULL, "mget", "m1", "m9", "m2", "zz-missing", NULL);
	check_run(&r, "mget m1 m9 m2 zz-missing", 1, "", 0);
	assert_non_null(strstr(r.err, "m9"));
	assert_non_null(strstr(r.err, "zz-missing"));
	kv_tc_run_free(&r);

	CLI(0, "m1\tone\nm2\tTWO\n", "scan", "m1", "m3");
	CLI(0, "m1\tone\n", "scan", "m", "n", "--limit", "1");
	CLI(0, "", "scan", "x", "y");
	CLI(0, "m1\nm2\nm3\n", "keys", "--prefix", "m");
	CLI(0, "three\n", "del", "m3");
	CLI(1, "", "del", "m3");
	CLI(1, "", "get", "m3");
	CLI(0, "m1\nm2\n", "keys", "--prefix", "m");

	/* Keys with bytes outside ASCII round-trip as bytes. */
	CLI(0, "", "put", "\xff\xfe-hi", "high");
	CLI(0, "", "put", "\x01low", "low");
	CLI(0, "high\n", "get", "\xff\xfe-hi");
	CLI(0, "\xff\xfe-hi\n", "keys", "--prefix", "\xff");
	CLI(0, "\x01low\tlow\n", "scan", "\x01", "\x02");
	CLI(0, "dash\t-x\nempty\t\n", "scan", "c", "f");
}

static void
data_commands_use_the_controller_from_the_environment(void **state)
{
	char env[440];
	char *envv[] = {env, NULL};
	kv_tc_run_result r;
	(void)state;

	snprintf(env, sizeof(env), "SHARDKV_CONTROLLER=%s", tc.ctl_url);
	CLI(0, "", "put", "envkey", "envval");
	run_cli(&r, false, NULL, 0, envv, "get", "envkey", NULL);
	check_run(&r, "get envkey (SHARDKV_CONTROLLER)", 0, "envval\n", 7);
	kv_tc_run_free(&r);
}

static void
limits_exit_4_and_an_unreachable_cluster_exits_3(void **state)
{
	kv_tc_run_result r;
	char key[1100], dead[64];
	(void)state;

	/* A key over the 1024-byte default limit. */
	memset(key, 'k', 1025);
	key[1025] = 0;
	run_cli(&r, true, NULL, 0, NULL, "put", key, "v", NULL);
	check_run(&r, "put <1025-byte key> v", 4, "", 0);
	kv_tc_run_free(&r);
	key[1024] = 0;
	run_cli(&r, true, NULL, 0, NULL, "put", key, "v", NULL);
	check_run(&r, "put <1024-byte key> v", 0, "", 0);
	kv_tc_run_free(&r);

	/* A value over the 1 MiB default limit, from stdin; nothing is written. */
	size_t big = 1024 * 1024 + 1;
	char *v = malloc(big);
	assert_non_null(v);
	memset(v, 'v', big);
	run_cli(&r, true, v, big, NULL, "put", "bigval", "-", NULL);
	check_run(&r, "put bigval <1 MiB + 1>", 4, "", 0);
	kv_tc_run_free(&r);
	run_cli(&r, true, v, big - 1, NULL, "put", "bigval", "-", NULL);
	check_run(&r, "put bigval <1 MiB>", 0, "", 0);
	kv_tc_run_free(&r);
	free(v);

	/* Nobody listens at `dead`. */
	kv_test_free_url(dead, sizeof(dead));
	char *argv[] = {KV_CLI_BIN, "-c", dead, "--timeout", "300", "get", "a", NULL};
	assert_int_equal(kv_tc_run(argv, NULL, NULL, 0, 30000, &r), 0);
	check_run(&r, "-c <dead> --timeout 300 get a", 3, "", 0);
	kv_tc_run_free(&r);
	char *argv2[] = {KV_CLI_BIN, "-c", dead, "--timeout", "300", "--json", "status", NULL};
	assert_int_equal(kv_tc_run(argv2, NULL, NULL, 0, 30000, &r), 0);
	check_run(&r, "-c <dead> --timeout 300 --json status", 3, "", 0);
	kv_tc_run_free(&r);
}

/*
 * Fails unless s is exactly one JSON object followed by a newline: braces
 * and brackets balance outside strings, strings hold only printable ASCII
 * and valid escapes, and nothing follows the object.
 */
static void
check_one_json_object(const char *s, size_t n, const char *what)
{
	int depth = 0;
	bool in_str = false;
	size_t i = 0;

	if (n < 3 || s[0] != '{' || s[n - 1] != '\n' || s[n - 2] != '}')
		fail_msg("%s: not one JSON object on a line: '%s'", what, show(s, n));
	for (i = 0; i < n - 1; i++) {
		unsigned char c = (unsigned char)s[i];
		if (in_str) {
			if (c == '\\') {
				char e = s[++i];
				if (e == 'u') {
					for (int k = 1; k <= 4; k++)
						if (!strchr("0123456789abcdefABCDEF", s[i + k]) ||
						    s[i + k] == 0)
							fail_msg("%s: bad \\u escape at %zu", what,
							         i);
					i += 4;
				} else if (!strchr("\"\\/bfnrt", e) || e == 0) {
					fail_msg("%s: bad escape at %zu", what, i);
				}
			} else if (c == '"') {
				in_str = false;
			} else if (c < 0x20 || c >= 0x7f) {
				fail_msg("%s: raw byte 0x%02x inside a string at %zu", what, c, i);
			}
			continue;
		}
		if (c == '"')
			in_str = true;
		else if (c == '{' || c == '[')
			depth++;
		else if (c == '}' || c == ']')
			depth--;
		else if (c == '\n')
			fail_msg("%s: newline inside the object", what);
		if (depth == 0 && i != n - 2)
			fail_msg("%s: text after the object at %zu: '%s'", what, i, show(s, n));
	}
	if (in_str || depth != 0)
		fail_msg("%s: unbalanced JSON", what);
}

/* Runs a command that must print one JSON object; returns its "epoch". */
static unsigned long long
json_epoch(kv_tc_run_result *r, const char *what)
{
	check_run(r, what, 0, NULL, 0);
	check_one_json_object(r->out, r->nout, what);
	if (strncmp(r->out, "{\"epoch\": ", 10) != 0)
		fail_msg("%s: the object does not start with \"epoch\": '%s'", what,
		         show(r->out, r->nout));
	return strtoull(r->out + 10, NULL, 10);
}

static void
admin_commands_print_json_with_escaped_binary_keys(void **state)
{
	kv_tc_run_result r;
	char id2[16], ghost[64], gid[16], want[200];
	(void)state;

	/* The node that does not own "\x01" takes [\x01, \x01\xff"): a range of
	 * its own, between two of the other node's. */
	shardkv_config *cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	uint32_t other = kv_tc_owner(cfg, "\x01", 1) == tc.srv[0].id ? tc.srv[1].id : tc.srv[0].id;
	assert_true(kv_tc_owner(cfg, "\x01\xff\"", 3) != other);
	shardkv_config_free(cfg);
	snprintf(id2, sizeof(id2), "%u", other);
	run_cli(&r, true, NULL, 0, NULL, "--json", "config", NULL);
	unsigned long long e0 = json_epoch(&r, "--json config");
	kv_tc_run_free(&r);

	/* A move of a range with binary bounds: one object with the new epoch. */
	run_cli(&r, true, NULL, 0, NULL, "--json", "move", "\x01", "\x01\xff\"", id2, "--wait",
	        NULL);
	unsigned long long e1 = json_epoch(&r, "--json move \\x01 \\x01\\xff\" N --wait");
	assert_true(e1 == e0 + 1);
	assert_non_null(strstr(r.out, "\"wait_ms\": "));
	kv_tc_run_free(&r);

	/* config and status show the bounds one byte per code point. */
	snprintf(want, sizeof(want),
	         "{\"start\": \"\\u0001\", \"end\": \"\\u0001\\u00ff\\\"\", "
	         "\"node\": %s, \"replicas\": [%s], \"insync\": [%s], \"leader_epoch\": ",
	         id2, id2, id2);
	run_cli(&r, true, NULL, 0, NULL, "--json", "config", NULL);
	unsigned long long e2 = json_epoch(&r, "--json config");
	assert_true(e2 >= e1);
	if (strstr(r.out, want) == NULL)
		fail_msg("--json config lacks %s: %s", want, show(r.out, r.nout));
	assert_non_null(strstr(r.out, "\"nodes\": [{\"id\": "));
	assert_non_null(strstr(r.out, "\"state\": \"active\""));
	kv_tc_run_free(&r);
	run_cli(&r, true, NULL, 0, NULL, "--json", "status", NULL);
	json_epoch(&r, "--json status");
	if (strstr(r.out, want) == NULL)
		fail_msg("--json status lacks %s: %s", want, show(r.out, r.nout));
	assert_non_null(strstr(r.out, "\"migrations\": []"));
	assert_non_null(strstr(r.out, "\"ops_per_sec\": "));
	assert_non_null(strstr(r.out, "\"bytes\": "));
	assert_non_null(strstr(r.out, "\"controllers\": [{\"id\": "));
	assert_non_null(strstr(r.out, "\"role\": \""));
	kv_tc_run_free(&r);

	/* The human forms: the epoch and the migrations. */
	run_cli(&r, true, NULL, 0, NULL, "config", NULL);
	check_run(&r, "config", 0, NULL, 0);
	snprintf(want, sizeof(want), "epoch %llu\n", e2);
	assert_memory_equal(r.out, want, strlen(want));
	kv_tc_run_free(&r);
	run_cli(&r, true, NULL, 0, NULL, "move", "a", "b", "1", "--wait", NULL);
	check_run(&r, "move a b 1 --wait", 0, NULL, 0);
	assert_non_null(strstr(r.out, " in epoch "));
	assert_non_null(strstr(r.out, "migrations finished in "));
	kv_tc_run_free(&r);
	run_cli(&r, true, NULL, 0, NULL, "--json", "rebalance", "--wait", NULL);
	json_epoch(&r, "--json rebalance --wait");
	kv_tc_run_free(&r);

	/* An old epoch, an unknown one. */
	run_cli(&r, true, NULL, 0, NULL, "--json", "config", "1", NULL);
	assert_int_equal(json_epoch(&r, "--json config 1"), 1);
	kv_tc_run_free(&r);
	CLI(1, "", "config", "999999");

	/* Join a server that never runs (no rebalance), then make it leave. */
	kv_test_free_url(ghost, sizeof(ghost));
	run_cli(&r, true, NULL, 0, NULL, "--json", "join", ghost, "--no-rebalance", NULL);
	unsigned long long ej = json_epoch(&r, "--json join <ghost> --no-rebalance");
	char *node = strstr(r.out, "\"node\": ");
	assert_non_null(node);
	snprintf(gid, sizeof(gid), "%lu", strtoul(node + 8, NULL, 10));
	kv_tc_run_free(&r);
	run_cli(&r, true, NULL, 0, NULL, "--json", "leave", gid, "--wait", NULL);
	assert_true(json_epoch(&r, "--json leave <ghost> --wait") > ej);
	kv_tc_run_free(&r);
	run_cli(&r, true, NULL, 0, NULL, "--json", "config", NULL);
	json_epoch(&r, "--json config");
	snprintf(want, sizeof(want), "{\"id\": %s, \"address\": \"%s\", \"state\": \"gone\"}", gid,
	         ghost);
	if (strstr(r.out, want) == NULL)
		fail_msg("--json config lacks %s: %s", want, show(r.out, r.nout));
	kv_tc_run_free(&r);

	/* Rejected admin commands: the exit code of their kind, nothing on
	 * stdout, even with --json. */
	CLI(2, "", "join", tc.srv[0].url);
	CLI(2, "", "--json", "join", tc.srv[0].url);
	CLI(2, "", "leave", "99"); /* an unknown node is an invalid request */
	CLI(2, "", "--json", "leave", "99");
	CLI(2, "", "move", "b", "a", "1");
	CLI(2, "", "move", "a", "b", "99");
	CLI(2, "", "move", "a", "b", gid);
	CLI(2, "", "leave", gid);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(usage_errors_exit_2_with_one_line_and_write_nothing),
	    cmocka_unit_test(data_commands_print_raw_values_and_exit_1_when_not_found),
	    cmocka_unit_test(data_commands_use_the_controller_from_the_environment),
	    cmocka_unit_test(limits_exit_4_and_an_unreachable_cluster_exits_3),
	    cmocka_unit_test(admin_commands_print_json_with_escaped_binary_keys),
	};
	/* One cluster for the whole file: the tests use distinct keys. */
	return cmocka_run_group_tests(tests, setup2, teardown);
}
