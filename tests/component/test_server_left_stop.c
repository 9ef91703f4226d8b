/*
 * test_server_left_stop.c - a node that an operator made leave (`shardkv
 * leave`: the controller marks it DRAINING, moves its ranges away, then
 * marks it GONE) ends normally: the server notices it is gone, and the
 * stop that follows (kv_server_leave, what SIGTERM runs, then
 * kv_server_stop) is logged at info level, with no warning and no error.
 * A node removed without a drain still logs the error. Servers run in the
 * test process against the fake controller; their stderr is captured in a
 * file and read back.
 */
#include "common/err.h"
#include "shardserver/server.h"
#include "tests/support/fake_ctl.h"
#include "tests/support/inproc_srv.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define NSRV    2
#define WAIT_MS 15000u

static inproc_srv srvs[NSRV];
static fake_ctl *ctl;
static char tmpdir[128];
static char logpath[200];
static int saved_stderr = -1;

static int
setup(void **state)
{
	int fd;
	(void)state;
	inproc_srv_setup(srvs, NSRV, &ctl, tmpdir, sizeof(tmpdir), "kvleftstop", 16);
	snprintf(logpath, sizeof(logpath), "%s/stderr.log", tmpdir);
	fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	saved_stderr = dup(STDERR_FILENO);
	assert_true(saved_stderr >= 0);
	assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
	close(fd);
	return 0;
}

/* Puts stderr back (and shows the captured lines when asked). */
static void
restore_stderr(void)
{
	if (saved_stderr < 0)
		return;
	dup2(saved_stderr, STDERR_FILENO);
	close(saved_stderr);
	saved_stderr = -1;
	if (getenv("KV_TEST_SHOW_LOG")) {
		char cmd[256];
		snprintf(cmd, sizeof(cmd), "cat '%s' >&2", logpath);
		(void)!system(cmd);
	}
}

static int
teardown(void **state)
{
	(void)state;
	restore_stderr();
	inproc_srv_cleanup(srvs, NSRV, &ctl, tmpdir);
	return 0;
}

/* Registers every server (server i is node i+1), publishes a configuration
 * where node `owner` owns the whole key space, starts the first nup servers
 * and waits until they serve it. */
static void
nodes_up(uint32_t owner, int nup)
{
	uint64_t e;

	for (int i = 0; i < NSRV; i++)
		fake_ctl_add_node(ctl, srvs[i].url);
	e = fake_ctl_publish_owners(ctl, NULL, owner, owner);
	for (int i = 0; i < nup; i++)
		inproc_srv_up(&srvs[i]);
	for (int i = 0; i < nup; i++)
		srv_wait_ready(srvs[i].url, e, WAIT_MS, NULL);
}

/* Waits up to ms until server v says it is gone. */
static bool
wait_gone(inproc_srv *v, unsigned ms)
{
	uint64_t end = kv_test_now_ms() + ms;
	char why[256];

	while (!kv_server_gone(v->s, why, sizeof(why))) {
		if (kv_test_now_ms() > end)
			return false;
		kv_test_sleep_ms(20);
	}
	return true;
}

/* Counts the captured lines that contain needle, leaving out those that
 * contain `except` (may be NULL). */
static long
count_lines_except(const char *needle, const char *except)
{
	char line[4096];
	long n = 0;
	FILE *f = fopen(logpath, "r");

	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL &&
		     (except == NULL || strstr(line, except) == NULL);
	fclose(f);
	return n;
}

static long
count_lines(const char *needle)
{
	return count_lines_except(needle, NULL);
}

static void
a_node_drained_by_an_operator_stops_with_info_lines_only(void **state)
{
	(void)state;
	nodes_up(1, NSRV);
	assert_int_equal(do_put(srvs[0].url, "k", "v", 0, 0).status, 0);

	/* `shardkv leave 1`: DRAINING with its ranges moving to node 2, then
	 * GONE. The server itself was asked nothing. */
	fake_ctl_drain(ctl, 1, 2, 1, 30000);
	assert_true(wait_gone(&srvs[0], WAIT_MS));
	/* Then the operator stops the process: SIGTERM runs the leave. */
	assert_int_equal(kv_server_leave(srvs[0].s, 2000, NULL, NULL), KV_LEAVE_DRAINED);
	inproc_srv_down(&srvs[0]);
	inproc_srv_down(&srvs[1]);
	restore_stderr();

	assert_int_equal(count_lines(" info server node left the cluster: stopping"), 1);
	assert_int_equal(count_lines(" info server already left the cluster: stopping"), 1);
	assert_int_equal(count_lines(" info server stopped"), 2);
	/* A lease lost on a loaded machine (its renewals late) is not part of
	 * the stop, and is logged as a warning on purpose. */
	if (count_lines_except(" warn server ", "lease lost") != 0 ||
	    count_lines(" error server ") != 0) {
		char cmd[256];
		snprintf(cmd, sizeof(cmd), "grep -E ' (warn|error) server ' '%s' >&2", logpath);
		(void)!system(cmd);
		fail_msg("warnings or errors in the stop of a node that left");
	}
}

static void
a_node_removed_without_a_drain_still_logs_the_error(void **state)
{
	(void)state;
	nodes_up(2, 1);
	/* Active, then GONE at once: a removal, not a leave. */
	fake_cfg b = fake_cfg_new(ctl);
	b.c->nodes[0].state = KV_NODE_GONE;
	fake_cfg_range(&b, "", 2);
	fake_cfg_publish(ctl, &b);
	assert_true(wait_gone(&srvs[0], WAIT_MS));
	inproc_srv_down(&srvs[0]);
	restore_stderr();
	assert_int_equal(count_lines(" error server node is gone from the cluster"), 1);
	assert_int_equal(count_lines(" info server node left the cluster"), 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(
	        a_node_drained_by_an_operator_stops_with_info_lines_only, setup, teardown),
	    cmocka_unit_test_setup_teardown(a_node_removed_without_a_drain_still_logs_the_error,
	                                    setup, teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	if (getenv("KV_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KV_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
