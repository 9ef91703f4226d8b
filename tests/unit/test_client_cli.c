/*
 * test_client_cli.c - the shardkv command line without a cluster: argument
 * parsing, usage errors (exit 2 with a one-line reason, before any network
 * use), --help, exit codes, and an unreachable controller (exit 3).
 */
#include "client/cli/cli.h"
#include "client/include/shardkv.h"
#include "common/log.h"
#include "tests/support/cli_run.h"
#include "tests/support/testutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define ARGC(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Output of one in-process run (cli_run.h). */
typedef kv_cli_run_result run_result;

static run_result
run(int argc, const char **argv)
{
	run_result r;
	assert_int_equal(kv_cli_run(argc, argv, &r), 0);
	return r;
}

/* Asserts a usage error: exit 2, nothing on stdout, exactly one line on stderr. */
static void
assert_usage_error(int argc, const char **argv, const char *needle)
{
	run_result r = run(argc, argv);
	assert_int_equal(r.rc, KV_CLI_USAGE);
	assert_int_equal(r.nout, 0);
	assert_true(r.nerr > 0);
	assert_int_equal(r.err[r.nerr - 1], '\n');
	assert_null(memchr(r.err, '\n', r.nerr - 1));
	if (needle && strstr(r.err, needle) == NULL)
		fail_msg("stderr '%s' lacks '%s'", r.err, needle);
	kv_cli_run_free(&r);
}

static void
parse_reads_global_and_command_options(void **state)
{
	const char *argv[] = {
	    "shardkv", "-c", "tcp://h:1,tcp://h:2", "--json", "--timeout", "250", "scan", "a", "z",
	    "--limit", "10"};
	kv_cli_args a;
	char err[256];
	(void)state;

	assert_int_equal(kv_cli_parse(ARGC(argv), (char **)argv, &a, err, sizeof(err)), 0);
	assert_string_equal(a.controller, "tcp://h:1,tcp://h:2");
	assert_true(a.json);
	assert_int_equal(a.timeout_ms, 250);
	assert_string_equal(a.cmd, "scan");
	assert_int_equal(a.nargs, 2);
	assert_string_equal(a.args[0], "a");
	assert_string_equal(a.args[1], "z");
	assert_int_equal(a.limit, 10);
	kv_cli_args_fini(&a);
}

static void
parse_accepts_equals_forms_and_options_after_the_command(void **state)
{
	const char *argv[] = {"shardkv", "move",     "a",      "m",
	                      "2",       "--rate=5", "--wait", "--controller=tcp://x:9"};
	kv_cli_args a;
	char err[256];
	(void)state;

	assert_int_equal(kv_cli_parse(ARGC(argv), (char **)argv, &a, err, sizeof(err)), 0);
	assert_string_equal(a.cmd, "move");
	assert_int_equal(a.nargs, 3);
	assert_int_equal(a.rate_mb_s, 5);
	assert_true(a.wait);
	assert_string_equal(a.controller, "tcp://x:9");
	kv_cli_args_fini(&a);
}

static void
double_dash_ends_options_for_dash_values(void **state)
{
	const char *argv[] = {"shardkv", "put", "--", "k", "-5"};
	kv_cli_args a;
	char err[256];
	(void)state;

	assert_int_equal(kv_cli_parse(ARGC(argv), (char **)argv, &a, err, sizeof(err)), 0);
	assert_int_equal(a.nargs, 2);
	assert_string_equal(a.args[1], "-5");
	kv_cli_args_fini(&a);

	/* A lone "-" is a value (read from stdin), not an option. */
	const char *argv2[] = {"shardkv", "put", "k", "-"};
	assert_int_equal(kv_cli_parse(ARGC(argv2), (char **)argv2, &a, err, sizeof(err)), 0);
	assert_string_equal(a.args[1], "-");
	kv_cli_args_fini(&a);
}

static void
new_data_commands_parse_and_refuse_bad_arguments(void **state)
{
	const char *put[] = {"shardkv", "put", "k", "v", "--ttl", "1500", "--if-equal=old"};
	const char *incr[] = {"shardkv", "incr", "k", "-7"};
	kv_cli_args a;
	char err[256];
	(void)state;

	assert_int_equal(kv_cli_parse(ARGC(put), (char **)put, &a, err, sizeof(err)), 0);
	assert_int_equal(a.ttl_ms, 1500);
	assert_string_equal(a.if_equal, "old");
	assert_false(a.if_absent);
	kv_cli_args_fini(&a);
	/* A negative N of incr is a number, not an option. */
	assert_int_equal(kv_cli_parse(ARGC(incr), (char **)incr, &a, err, sizeof(err)), 0);
	assert_int_equal(a.nargs, 2);
	assert_string_equal(a.args[1], "-7");
	kv_cli_args_fini(&a);

	const char *both[] = {"shardkv", "put", "k", "v", "--if-absent", "--if-equal", "x"};
	const char *ttl0[] = {"shardkv", "put", "k", "v", "--ttl", "0"};
	const char *ttlbig[] = {"shardkv", "put", "k", "v", "--ttl", "1099511627777"};
	const char *delabs[] = {"shardkv", "del", "k", "--if-absent"};
	const char *getttl[] = {"shardkv", "get", "k", "--ttl", "5"};
	const char *exp0[] = {"shardkv", "expire", "k", "0"};
	const char *expx[] = {"shardkv", "expire", "k", "soon"};
	const char *incrx[] = {"shardkv", "incr", "k", "1.5"};
	const char *incrbig[] = {"shardkv", "incr", "k", "9223372036854775808"};
	const char *count1[] = {"shardkv", "count", "a"};
	const char *typo[] = {"shardkv", "delrang", "a", "b"};
	assert_usage_error(ARGC(both), both, "exclude each other");
	assert_usage_error(ARGC(ttl0), ttl0, "--ttl");
	assert_usage_error(ARGC(ttlbig), ttlbig, "--ttl");
	assert_usage_error(ARGC(delabs), delabs, "--if-absent does not apply");
	assert_usage_error(ARGC(getttl), getttl, "--ttl does not apply");
	assert_usage_error(ARGC(exp0), exp0, "expire: MS");
	assert_usage_error(ARGC(expx), expx, "expire: MS");
	assert_usage_error(ARGC(incrx), incrx, "incr: N");
	assert_usage_error(ARGC(incrbig), incrbig, "incr: N");
	assert_usage_error(ARGC(count1), count1, "missing arguments");
	assert_usage_error(ARGC(typo), typo, "did you mean 'delrange'");
}

static void
usage_errors_exit_2_with_one_line(void **state)
{
	(void)state;
	const char *none[] = {"shardkv"};
	assert_usage_error(ARGC(none), none, "no command");
	const char *unknown[] = {"shardkv", "frobnicate"};
	assert_usage_error(ARGC(unknown), unknown, "unknown command");
	const char *badopt[] = {"shardkv", "--bogus", "get", "k"};
	assert_usage_error(ARGC(badopt), badopt, "unknown option");
	const char *missing[] = {"shardkv", "get"};
	assert_usage_error(ARGC(missing), missing, "usage: shardkv get KEY");
	const char *extra[] = {"shardkv", "get", "a", "b"};
	assert_usage_error(ARGC(extra), extra, "too many");
	const char *odd[] = {"shardkv", "mput", "a", "1", "b"};
	assert_usage_error(ARGC(odd), odd, "differ");
	const char *misplaced[] = {"shardkv", "get", "k", "--wait"};
	assert_usage_error(ARGC(misplaced), misplaced, "--wait does not apply");
	const char *timeout[] = {"shardkv", "--timeout", "soon", "get", "k"};
	assert_usage_error(ARGC(timeout), timeout, "--timeout");
	const char *zero[] = {"shardkv", "--timeout", "0", "get", "k"};
	assert_usage_error(ARGC(zero), zero, "--timeout");
	const char *novalue[] = {"shardkv", "get", "k", "-c"};
	assert_usage_error(ARGC(novalue), novalue, "-c needs");
	const char *limit[] = {"shardkv", "scan", "a", "b", "--limit", "-3"};
	assert_usage_error(ARGC(limit), limit, "--limit");
	const char *epoch[] = {"shardkv", "config", "latest"};
	assert_usage_error(ARGC(epoch), epoch, "EPOCH");
	const char *move[] = {"shardkv", "move", "a", "b"};
	assert_usage_error(ARGC(move), move, "START END NODE");
	const char *bench[] = {"shardkv", "bench", "--threads", "0"};
	assert_usage_error(ARGC(bench), bench, "--threads");
}

static void
help_prints_usage_and_exits_0(void **state)
{
	(void)state;
	const char *global[] = {"shardkv", "--help"};
	run_result r = run(ARGC(global), global);
	assert_int_equal(r.rc, 0);
	assert_non_null(strstr(r.out, "usage: shardkv"));
	for (const char *c = "get put del append mget mput keys scan join leave move rebalance "
	                     "config status";
	     *c;) {
		char name[16];
		size_t n = strcspn(c, " ");
		snprintf(name, sizeof(name), "  %.*s ", (int)n, c);
		if (strstr(r.out, name) == NULL)
			fail_msg("help lacks %s", name);
		c += n + (c[n] == ' ');
	}
	kv_cli_run_free(&r);

	const char *cmd[] = {"shardkv", "join", "--help"};
	r = run(ARGC(cmd), cmd);
	assert_int_equal(r.rc, 0);
	assert_non_null(strstr(r.out, "join ADDR"));
	kv_cli_run_free(&r);
}

static void
exit_codes_follow_the_spec(void **state)
{
	(void)state;
	assert_int_equal(kv_cli_exit_code(0), 0);
	assert_int_equal(kv_cli_exit_code(SHARDKV_ENOTFOUND), 1);
	assert_int_equal(kv_cli_exit_code(SHARDKV_EINVAL), 2);
	assert_int_equal(kv_cli_exit_code(SHARDKV_EEXISTS), 2);
	assert_int_equal(kv_cli_exit_code(SHARDKV_EUNAVAIL), 3);
	assert_int_equal(kv_cli_exit_code(SHARDKV_ETIMEDOUT), 3);
	assert_int_equal(kv_cli_exit_code(SHARDKV_EAUTH), 4);
	assert_int_equal(kv_cli_exit_code(SHARDKV_ETOOBIG), 4);
	assert_int_equal(kv_cli_exit_code(SHARDKV_ELIMIT), 4);
	assert_int_equal(kv_cli_exit_code(SHARDKV_EINTERNAL), 5);
	assert_int_equal(kv_cli_exit_code(SHARDKV_EPROTO), 5);
}

static void
unreachable_controller_exits_3_within_the_timeout(void **state)
{
	char url[64];
	(void)state;
	kv_test_free_url(url, sizeof(url));
	const char *argv[] = {"shardkv", "-c", url, "--timeout", "300", "get", "k"};
	uint64_t t0 = kv_test_now_ms();
	run_result r = run(ARGC(argv), argv);
	assert_int_equal(r.rc, 3);
	assert_true(kv_test_now_ms() - t0 < 3000);
	assert_int_equal(r.nout, 0);
	assert_non_null(strstr(r.err, "shardkv: get:"));
	kv_cli_run_free(&r);

	/* With the default timeout a refused address is reported at once,
	 * naming it and the setting that chose it. */
	const char *dflt[] = {"shardkv", "-c", url, "get", "k"};
	t0 = kv_test_now_ms();
	r = run(ARGC(dflt), dflt);
	assert_int_equal(r.rc, 3);
	assert_true(kv_test_now_ms() - t0 < 4000); /* the timeout is 5000 */
	assert_non_null(strstr(r.err, url));
	assert_non_null(strstr(r.err, "-c or SHARDKV_CONTROLLER sets it"));
	kv_cli_run_free(&r);

	const char *admin[] = {"shardkv", "-c", url, "--timeout", "200", "--json", "status"};
	r = run(ARGC(admin), admin);
	assert_int_equal(r.rc, 3);
	assert_int_equal(r.nout, 0);
	kv_cli_run_free(&r);
}

static void
library_rejects_bad_arguments_before_the_network(void **state)
{
	shardkv_client *c;
	shardkv_buf v;
	shardkv_bytes k[2] = {{"a", 1}, {"b", 1}};
	shardkv_mput_result *mr = NULL;
	(void)state;

	assert_int_equal(shardkv_open("", NULL, &c), SHARDKV_EINVAL);
	assert_int_equal(shardkv_open("tcp://127.0.0.1:1", NULL, &c), 0);
	assert_int_equal(shardkv_get(c, "", 0, &v), SHARDKV_EINVAL);
	assert_int_equal(shardkv_mput(c, 2, k, 1, k, &mr), SHARDKV_EINVAL);
	assert_null(mr);
	assert_non_null(strstr(shardkv_errmsg(), "2 keys but 1 values"));
	assert_int_equal(shardkv_move(c, "z", 1, "a", 1, "1", 0, 0, NULL), SHARDKV_EINVAL);
	assert_string_equal(shardkv_strerror(SHARDKV_ENOTFOUND), "key not found");
	shardkv_close(c);
}

static void
cancel_checks_its_migration_id_before_the_network(void **state)
{
	shardkv_client *c;
	char url[64];
	(void)state;

	const char *missing[] = {"shardkv", "cancel"};
	assert_usage_error(ARGC(missing), missing, "usage: shardkv cancel MIGRATION_ID");
	const char *word[] = {"shardkv", "cancel", "abc"};
	assert_usage_error(ARGC(word), word, "MIGRATION_ID must be a positive number");
	const char *zero[] = {"shardkv", "cancel", "0"};
	assert_usage_error(ARGC(zero), zero, "MIGRATION_ID");
	const char *trailing[] = {"shardkv", "cancel", "12x"};
	assert_usage_error(ARGC(trailing), trailing, "MIGRATION_ID");
	const char *huge[] = {"shardkv", "cancel", "99999999999999999999999"};
	assert_usage_error(ARGC(huge), huge, "MIGRATION_ID");
	const char *extra[] = {"shardkv", "cancel", "1", "2"};
	assert_usage_error(ARGC(extra), extra, "too many");
	const char *wait[] = {"shardkv", "cancel", "1", "--wait"};
	assert_usage_error(ARGC(wait), wait, "--wait does not apply");

	/* --help names the command and its argument. */
	const char *global[] = {"shardkv", "--help"};
	run_result r = run(ARGC(global), global);
	assert_int_equal(r.rc, 0);
	assert_non_null(strstr(r.out, "  cancel    MIGRATION_ID"));
	kv_cli_run_free(&r);
	const char *cmd[] = {"shardkv", "cancel", "--help"};
	r = run(ARGC(cmd), cmd);
	assert_int_equal(r.rc, 0);
	assert_non_null(strstr(r.out, "usage: shardkv [global options] cancel MIGRATION_ID"));
	kv_cli_run_free(&r);

	/* A valid id goes to the controller: unreachable is exit 3. */
	kv_test_free_url(url, sizeof(url));
	const char *unreachable[] = {"shardkv", "-c", url, "--timeout", "200", "cancel", "7"};
	r = run(ARGC(unreachable), unreachable);
	assert_int_equal(r.rc, 3);
	assert_int_equal(r.nout, 0);
	assert_non_null(strstr(r.err, "shardkv: cancel:"));
	kv_cli_run_free(&r);

	/* The library refuses id 0 without a round trip. */
	assert_int_equal(shardkv_open(url, NULL, &c), 0);
	assert_int_equal(shardkv_cancel(c, 0, NULL), SHARDKV_EINVAL);
	assert_non_null(strstr(shardkv_errmsg(), "migration id"));
	assert_int_equal(shardkv_cancel(NULL, 1, NULL), SHARDKV_EINVAL);
	shardkv_close(c);
}

/* The library's log lines (redials and the like) reach stderr only with
 * --verbose: without it the command's own error is the one line printed. */
static void
library_log_lines_only_with_verbose(void **state)
{
	char url[64];
	(void)state;
	kv_test_free_url(url, sizeof(url));
	const char *quiet[] = {"shardkv", "-c", url, "--timeout", "200", "get", "k"};
	const char *loud[] = {"shardkv", "-c", url, "--timeout", "200", "get", "k", "--verbose"};
	const char *shortv[] = {"shardkv", "-v", "-c", url, "--timeout", "200", "get", "k"};

	run_result r = run(ARGC(quiet), quiet);
	assert_int_equal(r.rc, 3);
	assert_int_equal(r.level, KV_LOG_OFF);
	kv_cli_run_free(&r);
	for (int k = 0; k < 2; k++) {
		r = k ? run(ARGC(shortv), shortv) : run(ARGC(loud), loud);
		assert_int_equal(r.rc, 3);
		assert_int_equal(r.level, KV_LOG_INFO);
		kv_cli_run_free(&r);
	}
}

static void
version_prints_shardkv_and_the_project_version(void **state)
{
	const char *argv[] = {"shardkv", "--version"};
	const char *after[] = {"shardkv", "get", "a", "--version"};
	(void)state;

	for (int k = 0; k < 2; k++) {
		run_result r = k ? run(ARGC(after), after) : run(ARGC(argv), argv);
		assert_int_equal(r.rc, 0);
		assert_int_equal(r.nerr, 0);
		if (strncmp(r.out, "shardkv ", 8) != 0 || r.out[8] < '0' || r.out[8] > '9' ||
		    r.out[r.nout - 1] != '\n')
			fail_msg("--version printed '%s'", r.out);
		kv_cli_run_free(&r);
	}
}

static void
a_mistyped_command_suggests_the_nearest_one(void **state)
{
	const char *gte[] = {"shardkv", "gte", "a"};
	const char *stauts[] = {"shardkv", "stauts"};
	const char *rebal[] = {"shardkv", "rebalanse", "--wait"};
	const char *far[] = {"shardkv", "frobnicate"};
	(void)state;

	assert_usage_error(ARGC(gte), gte, "unknown command 'gte': did you mean 'get'?");
	assert_usage_error(ARGC(stauts), stauts, "did you mean 'status'?");
	assert_usage_error(ARGC(rebal), rebal, "did you mean 'rebalance'?");
	assert_usage_error(ARGC(far), far, "unknown command 'frobnicate' (try 'shardkv --help')");
	assert_string_equal(kv_cli_suggest("mvoe"), "move");
	assert_null(kv_cli_suggest("x"));
	assert_null(kv_cli_suggest("zzzzzzzz"));
}

static void
a_controller_that_is_not_a_url_is_a_usage_error_naming_the_form(void **state)
{
	const char *bogus[] = {"shardkv", "-c", "bogus", "get", "a"};
	const char *noport[] = {"shardkv", "-c", "tcp://127.0.0.1", "get", "a"};
	const char *second[] = {"shardkv", "-c", "tcp://127.0.0.1:7000,foo", "status"};
	const char *env[] = {"shardkv", "get", "a"};
	(void)state;

	assert_usage_error(ARGC(bogus), bogus, "must be a URL like tcp://HOST:PORT");
	assert_usage_error(ARGC(bogus), bogus, "'bogus' (-c/--controller)");
	assert_usage_error(ARGC(noport), noport, "tcp://HOST:PORT");
	assert_usage_error(ARGC(second), second, "'foo'");
	setenv("SHARDKV_CONTROLLER", "bogus", 1);
	assert_usage_error(ARGC(env), env, "'bogus' (from $SHARDKV_CONTROLLER)");
	unsetenv("SHARDKV_CONTROLLER");
}

static void
raw_is_an_option_of_get_and_del_only(void **state)
{
	const char *get[] = {"shardkv", "get", "k", "--raw"};
	const char *del[] = {"shardkv", "--raw", "del", "k"};
	const char *put[] = {"shardkv", "put", "k", "v", "--raw"};
	const char *json[] = {"shardkv", "get", "k", "--raw", "--json"};
	kv_cli_args a;
	char err[256];
	(void)state;

	assert_int_equal(kv_cli_parse(ARGC(get), (char **)get, &a, err, sizeof(err)), 0);
	assert_true(a.raw);
	kv_cli_args_fini(&a);
	assert_int_equal(kv_cli_parse(ARGC(del), (char **)del, &a, err, sizeof(err)), 0);
	assert_true(a.raw);
	kv_cli_args_fini(&a);
	assert_usage_error(ARGC(put), put, "put: option --raw does not apply");
	assert_usage_error(ARGC(json), json, "--raw and --json exclude each other");
}

static void
dry_run_is_an_option_of_move_and_rebalance_only_and_never_with_wait(void **state)
{
	const char *move[] = {"shardkv", "move", "a", "b", "2", "--dry-run", "--rate", "5"};
	const char *reb[] = {"shardkv", "--dry-run", "rebalance"};
	const char *status[] = {"shardkv", "status", "--dry-run"};
	const char *leave[] = {"shardkv", "leave", "2", "--dry-run"};
	const char *wait[] = {"shardkv", "rebalance", "--wait", "--dry-run"};
	const char *help[] = {"shardkv", "move", "--help"};
	kv_cli_args a;
	char err[256];
	shardkv_client *c;
	shardkv_plan *p = (shardkv_plan *)&p;
	(void)state;

	assert_int_equal(kv_cli_parse(ARGC(move), (char **)move, &a, err, sizeof(err)), 0);
	assert_true(a.dry_run);
	assert_int_equal(a.rate_mb_s, 5);
	kv_cli_args_fini(&a);
	assert_int_equal(kv_cli_parse(ARGC(reb), (char **)reb, &a, err, sizeof(err)), 0);
	assert_true(a.dry_run);
	kv_cli_args_fini(&a);
	assert_usage_error(ARGC(status), status, "status: option --dry-run does not apply");
	assert_usage_error(ARGC(leave), leave, "leave: option --dry-run does not apply");
	assert_usage_error(ARGC(wait), wait, "--wait and --dry-run exclude each other");
	run_result r = run(ARGC(help), help);
	assert_int_equal(r.rc, 0);
	assert_non_null(strstr(r.out, "[--wait | --dry-run]"));
	assert_non_null(strstr(r.out, "--dry-run prints the migrations"));
	kv_cli_run_free(&r);

	/* The library refuses bad plans before the network. */
	assert_int_equal(shardkv_open("tcp://127.0.0.1:1", NULL, &c), 0);
	assert_int_equal(shardkv_move_plan(c, "z", 1, "a", 1, "1", 0, &p), SHARDKV_EINVAL);
	assert_null(p);
	assert_int_equal(shardkv_move_plan(c, "a", 1, "z", 1, "", 0, &p), SHARDKV_EINVAL);
	assert_int_equal(shardkv_move_plan(c, "a", 1, "z", 1, "1", 0, NULL), SHARDKV_EINVAL);
	assert_int_equal(shardkv_rebalance_plan(NULL, 0, &p), SHARDKV_EINVAL);
	shardkv_plan_free(NULL);
	shardkv_close(c);
}

static void
keys_takes_limit(void **state)
{
	const char *argv[] = {"shardkv", "keys", "--limit", "5", "--prefix", "p"};
	kv_cli_args a;
	char err[256];
	(void)state;

	assert_int_equal(kv_cli_parse(ARGC(argv), (char **)argv, &a, err, sizeof(err)), 0);
	assert_int_equal(a.limit, 5);
	assert_string_equal(a.prefix, "p");
	kv_cli_args_fini(&a);
}

static void
prompt_lines_split_into_words_like_a_shell(void **state)
{
	char **v, *buf, err[128];
	int n;
	(void)state;

	n = kv_cli_split_line("  put 'a b' \"c \\\" d\" e\\ f  -- -x\n", &v, &buf, err,
	                      sizeof(err));
	assert_int_equal(n, 7);
	assert_string_equal(v[0], "shardkv");
	assert_string_equal(v[1], "put");
	assert_string_equal(v[2], "a b");
	assert_string_equal(v[3], "c \" d");
	assert_string_equal(v[4], "e f");
	assert_string_equal(v[5], "--");
	assert_string_equal(v[6], "-x");
	free(v);
	free(buf);

	n = kv_cli_split_line("get ''", &v, &buf, err, sizeof(err));
	assert_int_equal(n, 3);
	assert_string_equal(v[2], "");
	free(v);
	free(buf);

	n = kv_cli_split_line("   ", &v, &buf, err, sizeof(err));
	assert_int_equal(n, 1);
	free(v);
	free(buf);

	assert_int_equal(kv_cli_split_line("get 'a", &v, &buf, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "unterminated ' quote"));
	assert_int_equal(kv_cli_split_line("get \"a", &v, &buf, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "unterminated \" quote"));
}

static void
a_prompt_line_runs_like_the_command_line(void **state)
{
	char **v, *buf, err[128];
	run_result r;
	int n;
	(void)state;

	/* The words of a line are an argv for kv_cli_main: a typo is the
	 * same usage error, --version the same answer. */
	n = kv_cli_split_line("gte 'some key'", &v, &buf, err, sizeof(err));
	assert_int_equal(n, 3);
	r = run(n, (const char **)v);
	assert_int_equal(r.rc, KV_CLI_USAGE);
	assert_non_null(strstr(r.err, "did you mean 'get'?"));
	kv_cli_run_free(&r);
	free(v);
	free(buf);
	n = kv_cli_split_line("--version", &v, &buf, err, sizeof(err));
	r = run(n, (const char **)v);
	assert_int_equal(r.rc, 0);
	assert_non_null(strstr(r.out, "shardkv "));
	kv_cli_run_free(&r);
	free(v);
	free(buf);

	/* Without a terminal, no command stays a usage error (no prompt). */
	const char *none[] = {"shardkv"};
	assert_usage_error(ARGC(none), none, "no command given");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(parse_reads_global_and_command_options),
	    cmocka_unit_test(parse_accepts_equals_forms_and_options_after_the_command),
	    cmocka_unit_test(double_dash_ends_options_for_dash_values),
	    cmocka_unit_test(usage_errors_exit_2_with_one_line),
	    cmocka_unit_test(help_prints_usage_and_exits_0),
	    cmocka_unit_test(exit_codes_follow_the_spec),
	    cmocka_unit_test(unreachable_controller_exits_3_within_the_timeout),
	    cmocka_unit_test(library_rejects_bad_arguments_before_the_network),
	    cmocka_unit_test(cancel_checks_its_migration_id_before_the_network),
	    cmocka_unit_test(version_prints_shardkv_and_the_project_version),
	    cmocka_unit_test(library_log_lines_only_with_verbose),
	    cmocka_unit_test(a_mistyped_command_suggests_the_nearest_one),
	    cmocka_unit_test(a_controller_that_is_not_a_url_is_a_usage_error_naming_the_form),
	    cmocka_unit_test(raw_is_an_option_of_get_and_del_only),
	    cmocka_unit_test(dry_run_is_an_option_of_move_and_rebalance_only_and_never_with_wait),
	    cmocka_unit_test(keys_takes_limit),
	    cmocka_unit_test(new_data_commands_parse_and_refuse_bad_arguments),
	    cmocka_unit_test(prompt_lines_split_into_words_like_a_shell),
	    cmocka_unit_test(a_prompt_line_runs_like_the_command_line),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
