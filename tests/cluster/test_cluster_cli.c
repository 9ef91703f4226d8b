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

#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef KV_CLI_BIN
#error "KV_CLI_BIN must name the shardkv binary"
#endif

static kv_tc tc;

static int
setup2(void **state)
{
	(void)state;
	/* One copy on purpose: the output checked is that of single-copy
	 * ranges (`"replicas": [N]`) and of moves that migrate (progress
	 * lines, cancel on Ctrl-C). */
	return kv_tc_start_one_copy(&tc, "cluster-cli", 2);
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
	USAGE("keys", "--rate", "3");
	USAGE("put", "k", "v", "--raw");
	USAGE("gte", "a"); /* did you mean get */
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

/* The commands of expiry, conditional writes, counters and ranges against
 * real servers (doc/contract.md §3, §5). */
static void
conditional_writes_expiry_counters_and_ranges_on_a_cluster(void **state)
{
	(void)state;
	CLI(0, "", "put", "op18/lock", "me", "--if-absent");
	kv_tc_run_result r;
	run_cli(&r, true, NULL, 0, NULL, "put", "op18/lock", "you", "--if-absent", NULL);
	check_run(&r, "put --if-absent", 1, "", 0);
	assert_non_null(strstr(r.err, "exists: current value \"me\""));
	kv_tc_run_free(&r);
	run_cli(&r, true, NULL, 0, NULL, "del", "op18/lock", "--if-equal", "you", NULL);
	check_run(&r, "del --if-equal", 1, "", 0);
	assert_non_null(strstr(r.err, "mismatch: current value \"me\""));
	kv_tc_run_free(&r);
	CLI(1,
	    "{\"key\": \"op18/none\", \"written\": false, \"condition\": \"mismatch\", "
	    "\"current\": null}\n",
	    "--json", "put", "op18/none", "x", "--if-equal", "y");
	CLI(0, "", "put", "op18/lock", "you", "--if-equal", "me");
	CLI(0, "you\n", "del", "op18/lock", "--if-equal", "you");
	CLI(1, "", "exists", "op18/lock");
	CLI(1, "{\"key\": \"op18/k\", \"exists\": false}\n", "--json", "exists", "op18/k");

	CLI(0, "", "put", "op18/t", "v", "--ttl", "600000");
	CLI(0, "", "exists", "op18/t");
	CLI(0, "", "persist", "op18/t");
	CLI(0, "-1\n", "ttl", "op18/t");
	CLI(0, "", "expire", "op18/t", "600000");
	run_cli(&r, true, NULL, 0, NULL, "ttl", "op18/t", NULL);
	check_run(&r, "ttl", 0, NULL, 0);
	long left = strtol(r.out, NULL, 10);
	assert_true(left > 500000 && left <= 600000);
	kv_tc_run_free(&r);
	CLI(1, "", "ttl", "op18/missing");
	CLI(1, "", "expire", "op18/missing", "10");

	CLI(0, "1\n", "incr", "op18/n");
	CLI(0, "-9\n", "incr", "op18/n", "-10");
	CLI(0, "{\"key\": \"op18/n\", \"value\": 0}\n", "--json", "incr", "op18/n", "9");
	CLI(2, "", "incr", "op18/t");

	CLI(0, "", "mput", "op18/r1", "1", "op18/r2", "2", "op18/r3", "3", "--ttl", "600000");
	CLI(0, "5\n", "count", "op18/", "op18/~"); /* t, n, r1, r2, r3 */
	CLI(0, "{\"count\": 2}\n", "--json", "count", "op18/r", "op18/r3");
	CLI(0, "3\n", "delrange", "op18/r", "op18/s");
	CLI(0, "{\"deleted\": 2}\n", "--json", "delrange", "op18/", "op18/~");
	CLI(0, "0\n", "count", "op18/", "op18/~");
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

/* Number of times needle occurs in the n bytes at p. */
static int
count_of(const char *p, size_t n, const char *needle)
{
	int k = 0;
	size_t l = strlen(needle);

	for (size_t i = 0; i + l <= n; i++)
		k += memcmp(p + i, needle, l) == 0;
	return k;
}

static void
raw_get_and_del_round_trip_binary_values(void **state)
{
	/* NULs, a trailing newline and bytes over 0x7f: `get --raw` gives them
	 * back exactly, so `put k - < f; get --raw k > g; cmp f g` holds. */
	static const char bin[] = "\x00\x01raw\n\xff\xfe\x00\n";
	(void)state;

	CLI_IN(bin, 0, "", "put", "raw16", "-");
	CLI(0, bin, "get", "raw16", "--raw");
	CLI(0, bin, "--raw", "get", "raw16");
	CLI(0, "", "put", "raw16e", "");
	CLI(0, "", "get", "--raw", "raw16e");
	CLI(0, bin, "del", "raw16", "--raw");
	CLI(1, "", "get", "raw16", "--raw");
}

static void
data_commands_print_json_with_escaped_bytes(void **state)
{
	kv_tc_run_result r;
	(void)state;

	CLI_IN("v\x00\n\"", 0, "", "put", "j16a", "-");
	CLI(0, "", "put", "j16b", "two");
	CLI(0, "", "put", "j16c", "three");
	CLI(0, "{\"key\": \"j16a\", \"value\": \"v\\u0000\\u000a\\\"\"}\n", "--json", "get",
	    "j16a");
	CLI(0, "{\"values\": [\"two\", \"three\"]}\n", "mget", "j16b", "j16c", "--json");
	/* A missing key is null; the exit code still says not found. */
	run_cli(&r, true, NULL, 0, NULL, "--json", "mget", "j16b", "j16zz", NULL);
	check_run(&r, "--json mget j16b j16zz", 1, "{\"values\": [\"two\", null]}\n", 26);
	assert_non_null(strstr(r.err, "j16zz"));
	kv_tc_run_free(&r);
	CLI(0, "{\"keys\": [\"j16a\", \"j16b\", \"j16c\"]}\n", "--json", "keys", "--prefix", "j16");
	CLI(0, "{\"keys\": [\"j16a\", \"j16b\"]}\n", "keys", "--prefix", "j16", "--limit", "2",
	    "--json");
	CLI(0, "j16a\n", "keys", "--prefix", "j16", "--limit", "1");
	CLI(0, "{\"keys\": []}\n", "--json", "keys", "--prefix", "j16none");
	/* scan: pairs, and where a --limit stopped it. */
	CLI(0,
	    "{\"pairs\": [[\"j16a\", \"v\\u0000\\u000a\\\"\"], [\"j16b\", \"two\"]], \"next\": "
	    "\"j16c\"}\n",
	    "--json", "scan", "j16", "j17", "--limit", "2");
	CLI(0, "{\"pairs\": [[\"j16c\", \"three\"]], \"next\": null}\n", "--json", "scan", "j16c",
	    "j17");
	CLI(0, "{\"key\": \"j16c\", \"value\": \"three\"}\n", "--json", "del", "j16c");
}

static void
keys_and_scan_page_through_more_than_one_page(void **state)
{
	/* More keys than one page (1000): every one printed once, in order. */
	enum { N = 2500 };
	char **args = calloc(2 * N + 2, sizeof(char *));
	kv_tc_run_result r;
	(void)state;

	assert_non_null(args);
	/* mput in batches that fit the command line helper. */
	for (int base = 0; base < N; base += 25) {
		char kb[25][16];
		const char *a[52];
		int n = 0;
		for (int i = 0; i < 25; i++) {
			snprintf(kb[i], sizeof(kb[i]), "pg16/%05d", base + i);
			a[n++] = kb[i];
			a[n++] = "v";
		}
		a[n] = NULL;
		assert_int_equal(kv_tc_cli(&r, tc.ctl_url, NULL, NULL, 0, 30000, "mput", a[0], a[1],
		                           a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10],
		                           a[11], a[12], a[13], a[14], a[15], a[16], a[17], a[18],
		                           a[19], a[20], a[21], a[22], a[23], a[24], a[25], a[26],
		                           a[27], a[28], a[29], a[30], a[31], a[32], a[33], a[34],
		                           a[35], a[36], a[37], a[38], a[39], a[40], a[41], a[42],
		                           a[43], a[44], a[45], a[46], a[47], a[48], a[49], NULL),
		                 0);
		check_run(&r, "mput pg16/...", 0, "", 0);
		kv_tc_run_free(&r);
	}
	free(args);
	run_cli(&r, true, NULL, 0, NULL, "keys", "--prefix", "pg16/", NULL);
	check_run(&r, "keys --prefix pg16/", 0, NULL, 0);
	assert_int_equal(r.nout, (size_t)N * 11);
	for (int i = 0; i < N; i++) {
		char want[16];
		snprintf(want, sizeof(want), "pg16/%05d\n", i);
		assert_memory_equal(r.out + (size_t)i * 11, want, 11);
	}
	kv_tc_run_free(&r);
	run_cli(&r, true, NULL, 0, NULL, "scan", "pg16/", "pg16/~", "--limit", "1500", NULL);
	check_run(&r, "scan pg16/ pg16/~ --limit 1500", 0, NULL, 0);
	assert_int_equal(count_of(r.out, r.nout, "\n"), 1500);
	assert_non_null(strstr(r.out, "pg16/01499\tv\n"));
	kv_tc_run_free(&r);
}

static void
an_oversized_value_is_reported_once_with_its_size_and_the_limit(void **state)
{
	size_t big = 2 * 1024 * 1024;
	char *v = malloc(big);
	kv_tc_run_result r;
	(void)state;

	assert_non_null(v);
	memset(v, 'v', big);
	run_cli(&r, true, v, big, NULL, "put", "big16", "-", NULL);
	check_run(&r, "put big16 <2 MiB>", 4, "", 0);
	if (strcmp(r.err, "shardkv: put: value of 2097152 bytes is over the limit of 1048576 "
	                  "bytes\n") != 0)
		fail_msg("put of 2 MiB said '%s'", r.err);
	kv_tc_run_free(&r);
	run_cli(&r, true, v, big, NULL, "append", "big16", "-", NULL);
	check_run(&r, "append big16 <2 MiB>", 4, "", 0);
	assert_non_null(strstr(r.err, "value of 2097152 bytes is over the limit of 1048576 bytes"));
	kv_tc_run_free(&r);
	/* A key over the limit, in a read too. */
	v[2000] = 0;
	run_cli(&r, true, NULL, 0, NULL, "get", v, NULL);
	check_run(&r, "get <2000-byte key>", 4, "", 0);
	if (strcmp(r.err, "shardkv: get: key of 2000 bytes is over the limit of 1024 bytes\n") != 0)
		fail_msg("get of a 2000-byte key said '%s'", r.err);
	kv_tc_run_free(&r);
	free(v);
}

static void
bench_load_only_prints_its_load_line_once(void **state)
{
	kv_tc_run_result r;
	(void)state;

	run_cli(&r, true, NULL, 0, NULL, "bench", "--keys", "200", "--load", "--ops", "0", NULL);
	check_run(&r, "bench --keys 200 --load --ops 0", 0, NULL, 0);
	if (count_of(r.out, r.nout, "load: 200 keys in ") != 1)
		fail_msg("bench --load --ops 0 printed: '%s'", show(r.out, r.nout));
	kv_tc_run_free(&r);
}

static void
status_shows_memory_and_last_heartbeat_per_node(void **state)
{
	kv_tc_run_result r;
	(void)state;

	run_cli(&r, true, NULL, 0, NULL, "status", NULL);
	check_run(&r, "status", 0, NULL, 0);
	assert_int_equal(count_of(r.out, r.nout, " memory="), 2);
	assert_int_equal(count_of(r.out, r.nout, "MB last_seen="), 2);
	kv_tc_run_free(&r);
}

/*
 * Starts `shardkv -c CTL ARGS...` with stdout and stderr on one pipe.
 * Returns the pid; *fd is the pipe's read end.
 */
static pid_t
spawn_cli(int *fd, const char *const *args)
{
	const char *argv[16] = {KV_CLI_BIN, "-c", tc.ctl_url};
	int p[2], n = 3;
	pid_t pid;

	while (*args && n < 15)
		argv[n++] = *args++;
	argv[n] = NULL;
	assert_int_equal(pipe(p), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(p[1], 1);
		dup2(p[1], 2);
		close(p[0]);
		close(p[1]);
		execv(KV_CLI_BIN, (char *const *)argv);
		_exit(127);
	}
	close(p[1]);
	*fd = p[0];
	return pid;
}

/* Reads from fd into buf (NUL-terminated) until it holds needle, EOF or
 * the deadline (ms). Returns whether needle came. */
static bool
read_until(int fd, char *buf, size_t cap, size_t *len, const char *needle, unsigned ms)
{
	uint64_t end = kv_test_now_ms() + ms;

	while (strstr(buf, needle) == NULL && kv_test_now_ms() < end && *len + 1 < cap) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		if (poll(&pf, 1, 100) <= 0)
			continue;
		ssize_t k = read(fd, buf + *len, cap - 1 - *len);
		if (k <= 0)
			break;
		*len += (size_t)k;
		buf[*len] = 0;
	}
	return strstr(buf, needle) != NULL;
}

static void
move_wait_says_accepted_at_once_then_progress_and_ctrl_c_explains_cancel(void **state)
{
	/* About 3 MB copied at 1 MB/s: the move takes seconds. */
	size_t vlen = 1000 * 1000;
	char *v = malloc(vlen), id[16], buf[8192] = "";
	kv_tc_run_result r;
	size_t len = 0;
	int fd, status;
	(void)state;

	assert_non_null(v);
	memset(v, 'm', vlen);
	for (int i = 0; i < 3; i++) {
		char k[16];
		snprintf(k, sizeof(k), "mv16/%d", i);
		run_cli(&r, true, v, vlen, NULL, "put", k, "-", NULL);
		check_run(&r, "put mv16/N <1 MB>", 0, "", 0);
		kv_tc_run_free(&r);
	}
	free(v);

	/* Move it to the node that does not hold it, there and back. */
	for (int round = 0; round < 2; round++) {
		shardkv_config *cfg = kv_tc_config(&tc);
		assert_non_null(cfg);
		uint32_t owner = kv_tc_owner(cfg, "mv16/", 5);
		shardkv_config_free(cfg);
		snprintf(id, sizeof(id), "%u", owner == tc.srv[0].id ? tc.srv[1].id : tc.srv[0].id);
		const char *args[] = {"move", "mv16/", "mv16/~", id, "--rate", "1", "--wait", NULL};
		pid_t pid = spawn_cli(&fd, args);
		len = 0;
		buf[0] = 0;
		/* The accepted line comes while the migration is still running. */
		if (!read_until(fd, buf, sizeof(buf), &len, ")\n", 20000))
			fail_msg("no accepted line: '%s'", buf);
		if (strncmp(buf, "moving [mv16/, mv16/~) to node ", 31) != 0 ||
		    strstr(buf, " in epoch ") == NULL)
			fail_msg("first line: '%s'", buf);
		run_cli(&r, true, NULL, 0, NULL, "--json", "status", NULL);
		check_run(&r, "--json status", 0, NULL, 0);
		if (strstr(r.out, "\"migrations\": []") != NULL)
			fail_msg("accepted line printed after the migration ended: '%s'", buf);
		kv_tc_run_free(&r);
		/* Then progress, a plain line at a time (not a terminal). */
		if (!read_until(fd, buf, sizeof(buf), &len, "  migration ", 20000))
			fail_msg("no progress line: '%s'", buf);
		if (round == 0) {
			/* Waits to the end. */
			if (!read_until(fd, buf, sizeof(buf), &len, "migrations finished in ",
			                60000))
				fail_msg("no end line: '%s'", buf);
			assert_int_equal(waitpid(pid, &status, 0), pid);
			assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
			assert_non_null(strstr(buf, " MB/s"));
			assert_non_null(strstr(buf, "ETA"));
		} else {
			/* Ctrl-C: the migration goes on, and the way to cancel it. */
			kill(pid, SIGINT);
			if (!read_until(fd, buf, sizeof(buf), &len, "shardkv cancel ", 20000))
				fail_msg("no cancel advice after SIGINT: '%s'", buf);
			assert_int_equal(waitpid(pid, &status, 0), pid);
			assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 130);
			assert_non_null(strstr(buf, " on in the background"));
			run_cli(&r, true, NULL, 0, NULL, "--json", "status", NULL);
			check_run(&r, "--json status", 0, NULL, 0);
			char *m = strstr(r.out, "\"migrations\": [{\"id\": ");
			if (m != NULL) {
				char mid[24];
				snprintf(mid, sizeof(mid), "%llu", strtoull(m + 23, NULL, 10));
				assert_non_null(strstr(buf, mid));
				kv_tc_run_result c;
				run_cli(&c, true, NULL, 0, NULL, "cancel", mid, NULL);
				kv_tc_run_free(&c);
			}
			kv_tc_run_free(&r);
			/* Cancelled, or done if it fenced first: nothing moves then. */
			uint64_t end = kv_test_now_ms() + 60000;
			bool idle = false;
			while (!idle && kv_test_now_ms() < end) {
				run_cli(&r, true, NULL, 0, NULL, "--json", "status", NULL);
				idle = r.code == 0 && strstr(r.out, "\"migrations\": []") != NULL;
				kv_tc_run_free(&r);
				if (!idle)
					poll(NULL, 0, 100);
			}
			assert_true(idle);
		}
		close(fd);
	}
}

static void
the_prompt_runs_commands_typed_on_a_terminal(void **state)
{
	char buf[8192] = "";
	size_t len = 0;
	int master, status;
	(void)state;

	pid_t pid = forkpty(&master, NULL, NULL, NULL);
	assert_true(pid >= 0);
	if (pid == 0) {
		setenv("HOME", "/nonexistent", 1);
		execl(KV_CLI_BIN, KV_CLI_BIN, "-c", tc.ctl_url, (char *)NULL);
		_exit(127);
	}
	if (!read_until(master, buf, sizeof(buf), &len, "shardkv> ", 10000))
		fail_msg("no prompt: '%s'", buf);
	const char *in = "put tty16 'a b'\nget tty16\ngte tty16\n";
	assert_int_equal(write(master, in, strlen(in)), (ssize_t)strlen(in));
	if (!read_until(master, buf, sizeof(buf), &len, "did you mean 'get'?", 10000))
		fail_msg("no answer: '%s'", buf);
	assert_non_null(strstr(buf, "a b\r\n"));

	/* --wait on a terminal redraws its progress lines in place. */
	shardkv_config *cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	uint32_t owner = kv_tc_owner(cfg, "mv16/", 5);
	shardkv_config_free(cfg);
	char mv[96];
	snprintf(mv, sizeof(mv), "move mv16/ mv16/~ %u --rate 1 --wait\n",
	         owner == tc.srv[0].id ? tc.srv[1].id : tc.srv[0].id);
	assert_int_equal(write(master, mv, strlen(mv)), (ssize_t)strlen(mv));
	if (!read_until(master, buf, sizeof(buf), &len, "migrations finished in ", 60000))
		fail_msg("no end of the move: '%s'", show(buf, len));
	assert_non_null(strstr(buf, "\r\033[K  migration "));
	assert_non_null(strstr(buf, " MB/s"));
	assert_int_equal(write(master, "quit\n", 5), 5);
	read_until(master, buf, sizeof(buf), &len, "\x01never", 3000);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	close(master);
	CLI(0, "a b\n", "get", "tty16");
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
	    cmocka_unit_test(raw_get_and_del_round_trip_binary_values),
	    cmocka_unit_test(data_commands_print_json_with_escaped_bytes),
	    cmocka_unit_test(keys_and_scan_page_through_more_than_one_page),
	    cmocka_unit_test(an_oversized_value_is_reported_once_with_its_size_and_the_limit),
	    cmocka_unit_test(bench_load_only_prints_its_load_line_once),
	    cmocka_unit_test(status_shows_memory_and_last_heartbeat_per_node),
	    cmocka_unit_test(
	        move_wait_says_accepted_at_once_then_progress_and_ctrl_c_explains_cancel),
	    cmocka_unit_test(the_prompt_runs_commands_typed_on_a_terminal),
	    cmocka_unit_test(conditional_writes_expiry_counters_and_ranges_on_a_cluster),
	};
	/* One cluster for the whole file: the tests use distinct keys. */
	return cmocka_run_group_tests(tests, setup2, teardown);
}
