/*
 * test_cluster_ops.c - what an operator relies on, with the real daemons: a
 * controller and two servers started with --metrics on free loopback ports.
 *
 * - /healthz answers 200 "ok" on every metrics listener while the daemon
 *   serves; a server's answers 503, naming the lease, once its controller
 *   lease expired (the controller stopped with SIGSTOP), and 200 again after;
 * - every /metrics has shardkv_build_info{version,commit} and the process
 *   figures; a server counts the keys reads found and did not find, and
 *   exports at most 21 range series (the 20 largest and "other");
 * - a server started again on the data dir of a node that left the cluster
 *   exits 4 at once, naming the reason, instead of retrying forever.
 *
 * Every wait is a poll with a deadline; kv_tc_destroy stops every process.
 */
#include "common/proc.h"
#include "tests/support/cluster_util.h"
#include "tests/support/http_client.h"
#include "tests/support/testutil.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#ifndef KV_PROJECT_VERSION
#error "KV_PROJECT_VERSION must be the project version"
#endif

#define WAIT_MS 20000u
#define NSRV    2

static kv_tc tc;
static int mport[NSRV];  /* the servers' --metrics ports */
static bool ctl_stopped; /* the controller is SIGSTOPped */

/* ------------------------------------------------------------------------
 * HTTP
 * ------------------------------------------------------------------------ */

/* Polls GET path until it answers `status`; returns the last answer. */
static kv_http_answer
wait_status(int port, const char *path, int status, unsigned ms)
{
	uint64_t end = kv_test_now_ms() + ms;
	for (;;) {
		kv_http_answer a = kv_http_get(port, path);
		if (a.status == status || kv_test_now_ms() > end)
			return a;
		kv_http_answer_free(&a);
		kv_test_sleep_ms(50);
	}
}

/* Scrapes /metrics on port (200 expected) and returns sample `series`. */
static double
scrape(int port, const char *series)
{
	kv_http_answer a = kv_http_get(port, "/metrics");
	double v = NAN;
	if (a.status == 200 && a.body)
		v = kv_http_sample(a.body, series);
	kv_http_answer_free(&a);
	return v;
}

/* Checks the figures every daemon exports on its /metrics. */
static void
assert_common_figures(int port)
{
	char want[128];
	kv_http_answer a = kv_http_get(port, "/metrics");
	time_t now = time(NULL);

	assert_int_equal(a.status, 200);
	assert_non_null(a.body);
	snprintf(want, sizeof(want), "\nshardkv_build_info{version=\"%s\",commit=\"",
	         KV_PROJECT_VERSION);
	if (strstr(a.body, want) == NULL)
		fail_msg("no %s in:\n%.2000s", want + 1, a.body);
	assert_non_null(strstr(a.body, "# TYPE shardkv_build_info gauge\n"));
	assert_true(kv_http_sample(a.body, "process_cpu_seconds_total") >= 0);
	assert_true(kv_http_sample(a.body, "process_resident_memory_bytes") > 1e5);
	assert_true(kv_http_sample(a.body, "process_open_fds") >= 3);
	assert_true(kv_http_sample(a.body, "process_max_fds") >=
	            kv_http_sample(a.body, "process_open_fds"));
	double start = kv_http_sample(a.body, "process_start_time_seconds");
	assert_true(start > (double)now - 600 && start <= (double)now + 5);
	kv_http_answer_free(&a);
}

/* ------------------------------------------------------------------------
 * The cluster
 * ------------------------------------------------------------------------ */

static int
setup(void **state)
{
	(void)state;
	ctl_stopped = false;
	if (kv_tc_create(&tc, "ops") != 0)
		return -1;
	for (int i = 0; i < NSRV; i++) {
		mport[i] = kv_test_free_port();
		tc.nargs = 2;
		snprintf(tc.args[0], sizeof(tc.args[0]), "--metrics");
		snprintf(tc.args[1], sizeof(tc.args[1]), "127.0.0.1:%d", mport[i]);
		int idx = kv_tc_add_server(&tc, true);
		if (idx != i ||
		    kv_tc_wait_node_state(&tc, idx, SHARDKV_NODE_ACTIVE, WAIT_MS) != 0) {
			kv_tc_dump_logs(&tc, 30);
			kv_tc_destroy(&tc);
			return -1;
		}
	}
	if (kv_tc_wait_settled(&tc, WAIT_MS) != 0) {
		kv_tc_destroy(&tc);
		return -1;
	}
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	if (ctl_stopped && tc.ctl_pid > 0)
		kill(tc.ctl_pid, SIGCONT);
	kv_tc_destroy(&tc);
	return 0;
}

/* ------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------ */

static void
servers_answer_healthz_and_export_build_and_process_figures(void **state)
{
	(void)state;
	for (int i = 0; i < NSRV; i++) {
		kv_http_answer a = wait_status(mport[i], "/healthz", 200, WAIT_MS);
		if (a.status != 200)
			fail_msg("server %d /healthz: %d %s", i, a.status, a.body ? a.body : "");
		assert_string_equal(a.body, "ok\n");
		kv_http_answer_free(&a);
		a = kv_http_get(mport[i], "/healthz?verbose=1");
		assert_int_equal(a.status, 200);
		kv_http_answer_free(&a);
		assert_common_figures(mport[i]);
		assert_true(scrape(mport[i], "shardkv_server_lease_valid") == 1);
	}
}

static void
healthz_is_503_while_the_lease_is_expired(void **state)
{
	(void)state;
	kv_http_answer a = wait_status(mport[0], "/healthz", 200, WAIT_MS);
	assert_int_equal(a.status, 200);
	kv_http_answer_free(&a);
	/* The controller stops answering: renewals fail, the lease runs out. */
	assert_int_equal(kill(tc.ctl_pid, SIGSTOP), 0);
	ctl_stopped = true;
	a = wait_status(mport[0], "/healthz", 503, WAIT_MS);
	if (a.status != 503)
		fail_msg("/healthz answered %d, not 503, with the controller stopped", a.status);
	assert_non_null(a.body);
	if (strstr(a.body, "lease expired") == NULL)
		fail_msg("503 body does not name the lease: %s", a.body);
	kv_http_answer_free(&a);
	assert_true(scrape(mport[0], "shardkv_server_lease_valid") == 0);
	/* The metrics are still served while unhealthy. */
	assert_common_figures(mport[0]);
	assert_int_equal(kill(tc.ctl_pid, SIGCONT), 0);
	ctl_stopped = false;
	a = wait_status(mport[0], "/healthz", 200, WAIT_MS);
	assert_int_equal(a.status, 200);
	kv_http_answer_free(&a);
}

/* Hits and misses summed over the servers. */
static void
reads_sum(double *hits, double *misses)
{
	*hits = *misses = 0;
	for (int i = 0; i < NSRV; i++) {
		double h = scrape(mport[i], "shardkv_server_read_hits_total");
		double m = scrape(mport[i], "shardkv_server_read_misses_total");
		assert_false(isnan(h) || isnan(m));
		*hits += h;
		*misses += m;
	}
}

static void
reads_count_keys_found_and_not_found(void **state)
{
	shardkv_client *cl = kv_tc_client(&tc, false, 5000);
	shardkv_buf got = {0};
	double h0, m0, h1, m1;
	(void)state;

	assert_non_null(cl);
	assert_int_equal(shardkv_put(cl, "ops/hit", 7, "v", 1), 0);
	reads_sum(&h0, &m0);
	assert_int_equal(shardkv_get(cl, "ops/hit", 7, &got), 0);
	shardkv_free(got.data);
	got = (shardkv_buf){0};
	assert_int_equal(shardkv_get(cl, "ops/miss1", 9, &got), SHARDKV_ENOTFOUND);
	assert_int_equal(shardkv_get(cl, "ops/miss2", 9, &got), SHARDKV_ENOTFOUND);
	reads_sum(&h1, &m1);
	assert_true(h1 - h0 == 1);
	assert_true(m1 - m0 == 2);
	shardkv_close(cl);
}

/* Counts the sample lines of family `name` (with labels) in body. */
static int
count_series(const char *body, const char *name)
{
	char want[128];
	int n = 0;

	snprintf(want, sizeof(want), "\n%s{", name);
	for (const char *p = strstr(body, want); p; p = strstr(p + 1, want))
		n++;
	return n;
}

static void
range_series_are_capped_with_the_rest_summed_as_other(void **state)
{
	char n1[16], n2[16];
	shardkv_admin_result ar;
	(void)state;

	kv_tc_node_arg(&tc, 0, n1, sizeof(n1));
	kv_tc_node_arg(&tc, 1, n2, sizeof(n2));
	/* Everything to node 1, then 24 small disjoint ranges to node 2:
	 * node 1 serves 25 ranges, node 2 24, more than the 20 series kept. */
	assert_int_equal(kv_tc_move(tc.admin, "", 0, "", 0, n1, SHARDKV_WAIT, &ar), 0);
	for (int i = 0; i < 24; i++) {
		char start[16], end[16];
		snprintf(start, sizeof(start), "r%02d", 2 * i);
		snprintf(end, sizeof(end), "r%02d", 2 * i + 1);
		int rv = kv_tc_move(tc.admin, start, strlen(start), end, strlen(end), n2,
		                    SHARDKV_WAIT, &ar);
		if (rv != 0)
			fail_msg("move %s: %s (%s)", start, shardkv_strerror(rv), shardkv_errmsg());
	}
	for (int i = 0; i < NSRV; i++) {
		uint64_t end = kv_test_now_ms() + WAIT_MS;
		kv_http_answer a = {0};
		/* The figures follow the next heartbeat's count. */
		for (;;) {
			a = kv_http_get(mport[i], "/metrics");
			if (a.status == 200 && a.body &&
			    strstr(a.body, "\nshardkv_server_range_keys{range=\"other\"}"))
				break;
			if (kv_test_now_ms() > end)
				fail_msg("server %d: no range=\"other\" series:\n%.3000s", i,
				         a.body ? a.body : "");
			kv_http_answer_free(&a);
			kv_test_sleep_ms(100);
		}
		assert_int_equal(count_series(a.body, "shardkv_server_range_keys"), 21);
		assert_int_equal(count_series(a.body, "shardkv_server_range_bytes"), 21);
		assert_non_null(strstr(a.body, "\nshardkv_server_range_bytes{range=\"other\"}"));
		kv_http_answer_free(&a);
	}
}

static void
the_controller_answers_healthz_and_exports_build_and_process_figures(void **state)
{
	char data[400], log[400], listen[64], metrics[64];
	int port = kv_test_free_port();
	(void)state;

	snprintf(data, sizeof(data), "%s/ctl-metrics", tc.dir);
	snprintf(log, sizeof(log), "%s/ctl-metrics.log", tc.dir);
	kv_test_free_url(listen, sizeof(listen));
	snprintf(metrics, sizeof(metrics), "127.0.0.1:%d", port);
	char *argv[] = {KV_CONTROLLER_BIN, "--listen", listen, "--data-dir", data,
	                "--metrics",       metrics,    NULL};
	pid_t pid = kv_proc_spawn(argv[0], argv, log);
	assert_true(pid > 0);
	kv_http_answer a = wait_status(port, "/healthz", 200, WAIT_MS);
	if (a.status != 200) {
		kv_proc_print_log_tail(log, 20);
		fail_msg("controller /healthz: %d", a.status);
	}
	assert_string_equal(a.body, "ok\n");
	kv_http_answer_free(&a);
	assert_common_figures(port);
	assert_false(isnan(scrape(port, "shardkv_controller_nodes{state=\"down\"}")));
	int st = 0;
	assert_int_equal(kv_proc_stop(pid, SIGTERM, 5000, &st), 0);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void
a_server_started_again_after_it_left_exits_4_naming_the_reason(void **state)
{
	char node[16];
	shardkv_admin_result ar;
	int st = 0;
	(void)state;

	kv_tc_node_arg(&tc, 1, node, sizeof(node));
	assert_int_equal(shardkv_leave(tc.admin, node, SHARDKV_WAIT, &ar), 0);
	/* Drained and gone: the server stops by itself, exit 4. */
	if (kv_proc_wait(tc.srv[1].pid, WAIT_MS, &st) != 0) {
		kv_tc_dump_logs(&tc, 20);
		fail_msg("the server that left still runs");
	}
	tc.srv[1].pid = 0;
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 4);

	/* `cluster.sh restart N` after the leave: same data dir, no --join. */
	long before = kv_tc_count_lines(tc.srv[1].log, "register failed, retrying");
	assert_int_equal(kv_tc_restart_server(&tc, 1, false), 0);
	if (kv_proc_wait(tc.srv[1].pid, WAIT_MS, &st) != 0) {
		kv_tc_dump_logs(&tc, 20);
		fail_msg("a server restarted after its node left keeps running");
	}
	tc.srv[1].pid = 0;
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 4);
	/* Once: the refusal is not retried. */
	assert_int_equal(kv_tc_count_lines(tc.srv[1].log, "register failed, retrying"), before);
	assert_true(kv_tc_count_lines(tc.srv[1].log, "node is gone from the cluster: ") >= 1);
	assert_true(kv_tc_count_lines(tc.srv[1].log, "it left or was removed from the cluster") >=
	            1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(
	        servers_answer_healthz_and_export_build_and_process_figures, setup, teardown),
	    cmocka_unit_test_setup_teardown(healthz_is_503_while_the_lease_is_expired, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(reads_count_keys_found_and_not_found, setup, teardown),
	    cmocka_unit_test_setup_teardown(range_series_are_capped_with_the_rest_summed_as_other,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        the_controller_answers_healthz_and_exports_build_and_process_figures, setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        a_server_started_again_after_it_left_exits_4_naming_the_reason, setup, teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	if (getenv("KV_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KV_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
