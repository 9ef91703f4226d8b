/*
 * test_client_cluster.c - the shardkv CLI and libshardkv against real
 * daemons: one shardkv-controller and two shardkv-server processes on free
 * loopback ports, each with its own data directory under a temporary
 * directory.
 *
 * The fixture starts the processes, waits (with a deadline) until the
 * configuration names both servers and a range map, and stops every process
 * it started on every path: the teardown, and an atexit handler for the case
 * where a failed assertion leaves the test early. The CLI runs in-process
 * (kv_cli_main, the code of the `shardkv` binary), and once as the real
 * binary to check the program itself.
 */
#include "client/cli/cli.h"
#include "client/include/shardkv.h"
#include "tests/support/cli_run.h"
#include "tests/support/testutil.h"
#include "tests/support/two_node_cluster.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#ifndef KV_BIN_DIR
#error "KV_BIN_DIR must name the directory of the built binaries"
#endif

#define ARGC(a) ((int)(sizeof(a) / sizeof((a)[0])))
static test_cluster tc;

static void
print_logs(void)
{
	test_cluster_print_logs(&tc);
}

static int
setup(void **state)
{
	(void)state;
	return test_cluster_start(&tc, KV_BIN_DIR, "client-cluster");
}

static int
teardown(void **state)
{
	(void)state;
	test_cluster_destroy(&tc);
	return 0;
}

/* Runs the CLI in-process against the cluster; *out is owned by the caller. */
static int
cli(char **out, char **err, int argc, const char **args)
{
	const char *argv[40] = {"shardkv", "-c", tc.ctl_url, "--timeout", "5000"};
	kv_cli_run_result r;

	assert_true(argc <= 35);
	for (int i = 0; i < argc; i++)
		argv[5 + i] = args[i];
	assert_int_equal(kv_cli_run(5 + argc, argv, &r), 0);
	*out = r.out;
	if (err)
		*err = r.err;
	else
		free(r.err);
	return r.rc;
}

static bool
out_matches(const char *o, const char *want)
{
	return want == NULL || strcmp(o, want) == 0;
}

#define CLI_EXPECT(code, expect_out, ...)                                                          \
	do {                                                                                       \
		const char *a_[] = {__VA_ARGS__};                                                  \
		char *o_ = NULL, *e_ = NULL;                                                       \
		int rc_ = cli(&o_, &e_, ARGC(a_), a_);                                             \
		if (rc_ != (code) || !out_matches(o_, (expect_out))) {                             \
			print_logs();                                                              \
			fail_msg("%s: rc %d (want %d) out '%s' err '%s'", a_[0], rc_, (code), o_,  \
			         e_);                                                              \
		}                                                                                  \
		free(o_);                                                                          \
		free(e_);                                                                          \
	} while (0)

static void
cli_round_trip_of_every_data_command(void **state)
{
	(void)state;
	CLI_EXPECT(0, "", "put", "apple", "red");
	CLI_EXPECT(0, "red\n", "get", "apple");
	CLI_EXPECT(1, "", "get", "pear");
	CLI_EXPECT(0, "", "append", "apple", "dish");
	CLI_EXPECT(0, "", "append", "fresh", "new");
	CLI_EXPECT(0, "reddish\n", "get", "apple");
	CLI_EXPECT(0, "", "mput", "A", "1", "z", "26", "M", "13", "b", "2");
	CLI_EXPECT(0, "1\n26\n13\nreddish\n", "mget", "A", "z", "M", "apple");
	CLI_EXPECT(1, "", "mget", "A", "missing");
	CLI_EXPECT(0, "A\nM\napple\nb\nfresh\nz\n", "keys");
	CLI_EXPECT(0, "apple\n", "keys", "--prefix", "ap");
	CLI_EXPECT(0, "M\t13\napple\treddish\nb\t2\n", "scan", "B", "c");
	CLI_EXPECT(0, "A\t1\nM\t13\n", "scan", "", "", "--limit", "2");
	CLI_EXPECT(0, "reddish\n", "del", "apple");
	CLI_EXPECT(1, "", "del", "apple");
	CLI_EXPECT(2, "", "scan", "z", "a");
}

static void
mget_and_mput_span_both_nodes(void **state)
{
	shardkv_options o = {.timeout_ms = 5000};
	shardkv_client *c;
	shardkv_config *cfg;
	enum { N = 200 };
	shardkv_bytes keys[N], vals[N];
	char kbuf[N][16], vbuf[N][16];
	shardkv_mput_result *mr = NULL;
	shardkv_mget_result *gr = NULL;
	(void)state;

	assert_int_equal(shardkv_open(tc.ctl_url, &o, &c), 0);
	for (int i = 0; i < N; i++) {
		/* Spread over the key space: upper case, digits and lower case. */
		snprintf(kbuf[i], sizeof(kbuf[i]), "%c%03d", "0aZz"[i % 4], i);
		snprintf(vbuf[i], sizeof(vbuf[i]), "v%d", i);
		keys[i] = (shardkv_bytes){kbuf[i], strlen(kbuf[i])};
		vals[i] = (shardkv_bytes){vbuf[i], strlen(vbuf[i])};
	}
	assert_int_equal(shardkv_mput(c, N, keys, N, vals, &mr), 0);
	assert_int_equal(mr->nfailed, 0);
	shardkv_mput_result_free(mr);
	assert_int_equal(shardkv_mget(c, N, keys, &gr), 0);
	for (int i = 0; i < N; i++) {
		assert_int_equal(gr->values[i].len, vals[i].len);
		assert_memory_equal(gr->values[i].data, vals[i].data, vals[i].len);
	}
	shardkv_mget_result_free(gr);
	/* The keys really live on both nodes. */
	assert_int_equal(shardkv_config_get(c, 0, &cfg), 0);
	bool owner_seen[NSERVERS + 1] = {false};
	for (size_t r = 0; r < cfg->nranges; r++)
		for (int i = 0; i < N; i++) {
			const shardkv_range *rg = &cfg->ranges[r];
			bool ge = strcmp(kbuf[i], (char *)rg->start.data) >= 0;
			bool lt = rg->end.len == 0 || strcmp(kbuf[i], (char *)rg->end.data) < 0;
			if (ge && lt && rg->node <= NSERVERS)
				owner_seen[rg->node] = true;
		}
	shardkv_config_free(cfg);
	assert_true(owner_seen[1] && owner_seen[2]);
	/* The scan of everything sees them all, once, in order. */
	shardkv_scan_result *sr;
	assert_int_equal(shardkv_scan(c, "", 0, "", 0, 0, &sr), 0);
	assert_int_equal(sr->n, N);
	for (size_t i = 1; i < sr->n; i++)
		assert_true(strcmp((char *)sr->entries[i - 1].key.data,
		                   (char *)sr->entries[i].key.data) < 0);
	shardkv_scan_result_free(sr);
	shardkv_close(c);
}

static void
cli_admin_commands_report_epochs(void **state)
{
	char *out = NULL, *err = NULL;
	(void)state;

	const char *cfg[] = {"--json", "config"};
	assert_int_equal(cli(&out, &err, 2, cfg), 0);
	assert_memory_equal(out, "{\"epoch\": ", 10);
	assert_non_null(strstr(out, "\"nodes\": [{\"id\": "));
	assert_non_null(strstr(out, "\"state\": \"active\""));
	assert_non_null(strstr(out, "\"ranges\": [{\"start\": \"\", \"end\": "));
	free(out);
	free(err);

	const char *st[] = {"--json", "status"};
	assert_int_equal(cli(&out, &err, 2, st), 0);
	assert_non_null(strstr(out, "\"keys\": "));
	assert_non_null(strstr(out, "\"ops_per_sec\": "));
	assert_non_null(strstr(out, "\"migrations\": ["));
	assert_non_null(strstr(out, "\"controllers\": [{"));
	free(out);
	free(err);

	CLI_EXPECT(0, NULL, "config");
	CLI_EXPECT(0, NULL, "status");
	CLI_EXPECT(0, NULL, "config", "1");
	CLI_EXPECT(1, NULL, "config", "999999");
	CLI_EXPECT(0, NULL, "put", "mover", "x");
	CLI_EXPECT(0, NULL, "move", "m", "n", "1", "--wait");
	CLI_EXPECT(0, "x\n", "get", "mover");
	CLI_EXPECT(0, NULL, "move", "m", "n", tc.srv_url[1], "--wait");
	CLI_EXPECT(0, "x\n", "get", "mover");
	CLI_EXPECT(0, NULL, "--json", "rebalance", "--wait");
	CLI_EXPECT(2, "", "move", "n", "m", "1");
	CLI_EXPECT(2, "", "leave", "99"); /* unknown node: an invalid request */
	CLI_EXPECT(2, "", "join", tc.srv_url[0]);
	/* A server that never runs can be registered without a rebalance. */
	char ghost[64];
	kv_test_free_url(ghost, sizeof(ghost));
	CLI_EXPECT(0, NULL, "--json", "join", ghost, "--no-rebalance");
	CLI_EXPECT(0, "x\n", "get", "mover");
}

/* Writes keys in a loop until told to stop, remembering what was acknowledged. */
typedef struct {
	shardkv_client *c; /* the handle (shared by both workers) */
	volatile int stop; /* set by the main thread */
	int failures;      /* writes that failed */
	int last[300];     /* last acknowledged value per key; -1: none */
	int appends;       /* acknowledged appends to "counter" */
	char msg[256];     /* the first failure */
} load;

static void *
load_writer(void *arg)
{
	load *l = arg;
	for (int i = 0; !__atomic_load_n(&l->stop, __ATOMIC_ACQUIRE); i++) {
		char k[16], v[16];
		snprintf(k, sizeof(k), "w%04d", i % 300);
		snprintf(v, sizeof(v), "%d", i);
		int rv = shardkv_put(l->c, k, strlen(k), v, strlen(v));
		if (rv == 0) {
			l->last[i % 300] = i;
		} else if (__atomic_fetch_add(&l->failures, 1, __ATOMIC_RELAXED) == 0) {
			snprintf(l->msg, sizeof(l->msg), "put %s: %s (%s)", k, shardkv_strerror(rv),
			         shardkv_errmsg());
		}
	}
	return NULL;
}

static void *
load_appender(void *arg)
{
	load *l = arg;
	while (!__atomic_load_n(&l->stop, __ATOMIC_ACQUIRE)) {
		int rv = shardkv_append(l->c, "counter", 7, "x", 1, NULL);
		if (rv == 0)
			l->appends++;
		else if (__atomic_fetch_add(&l->failures, 1, __ATOMIC_RELAXED) == 0)
			snprintf(l->msg, sizeof(l->msg), "append: %s (%s)", shardkv_strerror(rv),
			         shardkv_errmsg());
	}
	return NULL;
}

static void
writes_during_moves_are_neither_lost_nor_duplicated(void **state)
{
	shardkv_options o = {.timeout_ms = 10000};
	static load l;
	pthread_t w, a;
	shardkv_admin_result ar;
	(void)state;

	memset(&l, 0, sizeof(l));
	for (int i = 0; i < 300; i++)
		l.last[i] = -1;
	assert_int_equal(shardkv_open(tc.ctl_url, &o, &l.c), 0);
	assert_int_equal(pthread_create(&w, NULL, load_writer, &l), 0);
	assert_int_equal(pthread_create(&a, NULL, load_appender, &l), 0);
	kv_test_sleep_ms(200);
	/* Move the written range back and forth while the writers run. */
	for (int round = 0; round < 4; round++) {
		const char *to = round % 2 ? "2" : "1";
		int rv = shardkv_move(l.c, "w", 1, "x", 1, to, 0, SHARDKV_WAIT, &ar);
		if (rv != 0 && rv != SHARDKV_EBUSY)
			fail_msg("move to %s: %s (%s)", to, shardkv_strerror(rv), shardkv_errmsg());
		kv_test_sleep_ms(100);
	}
	__atomic_store_n(&l.stop, 1, __ATOMIC_RELEASE);
	pthread_join(w, NULL);
	pthread_join(a, NULL);
	if (l.failures)
		fail_msg("%d writes failed; first: %s", l.failures, l.msg);

	/* Every key holds its last acknowledged value; the appends happened once each. */
	shardkv_bytes keys[300];
	char kbuf[300][16];
	size_t n = 0;
	int want[300];
	for (int i = 0; i < 300; i++) {
		if (l.last[i] < 0)
			continue;
		snprintf(kbuf[n], sizeof(kbuf[n]), "w%04d", i);
		keys[n] = (shardkv_bytes){kbuf[n], strlen(kbuf[n])};
		want[n++] = l.last[i];
	}
	assert_true(n > 0);
	shardkv_mget_result *gr;
	assert_int_equal(shardkv_mget(l.c, n, keys, &gr), 0);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(atoi((char *)gr->values[i].data), want[i]);
	shardkv_mget_result_free(gr);
	shardkv_buf v;
	assert_int_equal(shardkv_get(l.c, "counter", 7, &v), 0);
	assert_int_equal(v.len, (size_t)l.appends);
	shardkv_free(v.data);
	shardkv_close(l.c);
}

/* One of many threads sharing one client handle. */
typedef struct {
	shardkv_client *c; /* shared */
	int id;            /* thread number */
	int bad;           /* replies that did not match the op */
	int failed;        /* calls that failed */
	char msg[200];     /* first problem */
} sharer;

#define SHARERS      32
#define SHARER_ROUND 150

static void *
sharer_main(void *arg)
{
	sharer *t = arg;
	char k[32], v[48], tok[16];
	shardkv_buf got;
	uint64_t len, want_len = 0;

	for (int i = 0; i < SHARER_ROUND; i++) {
		/* A value only this thread writes, read straight back: a reply
		 * handed to the wrong caller shows as a wrong value. */
		snprintf(k, sizeof(k), "share/%02d/%03d", t->id, i % 40);
		snprintf(v, sizeof(v), "t%02d-i%05d-%s", t->id, i, i % 3 ? "x" : "longer-value");
		int rv = shardkv_put(t->c, k, strlen(k), v, strlen(v));
		if (rv == 0)
			rv = shardkv_get(t->c, k, strlen(k), &got);
		if (rv != 0) {
			if (t->failed++ == 0)
				snprintf(t->msg, sizeof(t->msg), "%s: %s", k, shardkv_strerror(rv));
			continue;
		}
		if (got.len != strlen(v) || memcmp(got.data, v, got.len) != 0) {
			if (t->bad++ == 0)
				snprintf(t->msg, sizeof(t->msg), "%s: wrote %s, read %.*s", k, v,
				         (int)got.len, (char *)got.data);
		}
		shardkv_free(got.data);
		/* Appends to a per-thread key report the length after each. */
		snprintf(k, sizeof(k), "share/app/%02d", t->id);
		snprintf(tok, sizeof(tok), "%04d,", i);
		rv = shardkv_append(t->c, k, strlen(k), tok, strlen(tok), &len);
		if (rv != 0) {
			if (t->failed++ == 0)
				snprintf(t->msg, sizeof(t->msg), "append %s: %s", k,
				         shardkv_strerror(rv));
			continue;
		}
		want_len += strlen(tok);
		if (len != want_len && t->bad++ == 0)
			snprintf(t->msg, sizeof(t->msg), "append %s: length %llu, expected %llu", k,
			         (unsigned long long)len, (unsigned long long)want_len);
	}
	return NULL;
}

static void
threads_sharing_one_handle_each_get_their_own_replies(void **state)
{
	shardkv_options o = {.timeout_ms = 10000};
	shardkv_client *c;
	static sharer t[SHARERS];
	pthread_t th[SHARERS];
	(void)state;

	/* Many callers on one handle queue up behind the per-server request
	 * slots and go out coalesced: every caller must still get the reply to
	 * its own op. */
	assert_int_equal(shardkv_open(tc.ctl_url, &o, &c), 0);
	for (int i = 0; i < SHARERS; i++) {
		t[i] = (sharer){.c = c, .id = i};
		assert_int_equal(pthread_create(&th[i], NULL, sharer_main, &t[i]), 0);
	}
	for (int i = 0; i < SHARERS; i++)
		pthread_join(th[i], NULL);
	for (int i = 0; i < SHARERS; i++) {
		if (t[i].bad || t[i].failed)
			fail_msg("thread %d: %d wrong replies, %d failures; first: %s", i, t[i].bad,
			         t[i].failed, t[i].msg);
	}
	shardkv_close(c);
}

static void
the_shardkv_binary_runs_a_round_trip(void **state)
{
	char cmd[700], buf[64] = "";
	FILE *p;
	(void)state;

	snprintf(cmd, sizeof(cmd),
	         "printf 'from\\0stdin' | %s/shardkv -c %s put bin - && %s/shardkv -c %s get bin",
	         KV_BIN_DIR, tc.ctl_url, KV_BIN_DIR, tc.ctl_url);
	p = popen(cmd, "r");
	assert_non_null(p);
	size_t n = fread(buf, 1, sizeof(buf), p);
	assert_int_equal(pclose(p), 0);
	assert_int_equal(n, 11);
	assert_memory_equal(buf, "from\0stdin\n", 11);
	snprintf(cmd, sizeof(cmd), "%s/shardkv -c %s get no-such-key 2>/dev/null", KV_BIN_DIR,
	         tc.ctl_url);
	int st = system(cmd);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(cli_round_trip_of_every_data_command, setup, teardown),
	    cmocka_unit_test_setup_teardown(mget_and_mput_span_both_nodes, setup, teardown),
	    cmocka_unit_test_setup_teardown(cli_admin_commands_report_epochs, setup, teardown),
	    cmocka_unit_test_setup_teardown(writes_during_moves_are_neither_lost_nor_duplicated,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(threads_sharing_one_handle_each_get_their_own_replies,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(the_shardkv_binary_runs_a_round_trip, setup, teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
