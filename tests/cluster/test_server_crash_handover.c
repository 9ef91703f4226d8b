/*
 * test_server_crash_handover.c - a source shard server (the real
 * shardkv-server binary, KV_SERVER_BIN) SIGKILLed between the destination's
 * fence acknowledgement and the controller's answer, then restarted on its
 * data dir: the handover completes and every key reaches the destination.
 * The controller is the fake of tests/support/fake_ctl.h, which holds its
 * answer to the fence; the destination runs in the test process.
 *
 * component/test_server_migration.c covers the same gap with an in-process
 * stop (which also aborts the stream at the destination); this one is the
 * crash: no abort, no clean close of the log.
 */
#include "common/err.h"
#include "common/proc.h"
#include "shardserver/server.h"
#include "tests/support/fake_ctl.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#ifndef KV_SERVER_BIN
#error "KV_SERVER_BIN must name the shardkv-server binary"
#endif

#define NKEYS 500

static fake_ctl *ctl;
static char tmpdir[128];
static char src_url[64], src_dir[200], src_log[220];
static pid_t src_pid;
static char dst_url[64], dst_dir[200];
static const char *dst_ctl[1];
static kv_server_cfg dst_cfg;
static kv_server *dst;

static int
setup(void **state)
{
	(void)state;
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvcrash.XXXXXX");
	assert_non_null(mkdtemp(tmpdir));
	ctl = fake_ctl_start();
	kv_test_free_url(src_url, sizeof(src_url));
	kv_test_free_url(dst_url, sizeof(dst_url));
	snprintf(src_dir, sizeof(src_dir), "%s/n1", tmpdir);
	snprintf(src_log, sizeof(src_log), "%s/n1.log", tmpdir);
	snprintf(dst_dir, sizeof(dst_dir), "%s/n2", tmpdir);
	fake_ctl_add_node(ctl, src_url);
	fake_ctl_add_node(ctl, dst_url);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	clients_close();
	if (src_pid > 0)
		kv_proc_stop(src_pid, SIGKILL, 5000, NULL);
	src_pid = 0;
	kv_server_destroy(dst);
	dst = NULL;
	fake_ctl_stop(ctl);
	ctl = NULL;
	kv_test_rmtree(tmpdir);
	return 0;
}

static void
src_start(void)
{
	char *argv[] = {(char *)KV_SERVER_BIN, "--listen", src_url,  "--controller", ctl->url,
	                "--data-dir",          src_dir,    "--join", "--fsync",      "batch",
	                "--log-level",         "info",     NULL};
	src_pid = kv_proc_spawn(KV_SERVER_BIN, argv, src_log);
	assert_true(src_pid > 0);
}

static void
print_src_log(void)
{
	kv_proc_print_log_tail(src_log, 30);
}

static void
wait_ready(const char *url, uint64_t epoch)
{
	srv_wait_ready(url, epoch, 15000, print_src_log);
}

static void
source_sigkilled_between_fence_ack_and_commit_restarts_and_hands_over_every_key(void **state)
{
	(void)state;
	char err[256], k[32], v[64];
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 1, 1);
	src_start();
	dst_ctl[0] = ctl->url;
	dst_cfg = (kv_server_cfg){.listen = dst_url,
	                          .ctl = dst_ctl,
	                          .nctl = 1,
	                          .data_dir = dst_dir,
	                          .join = true,
	                          .fsync = KV_FSYNC_BATCH,
	                          .contexts = 16,
	                          .watch_timeout_ms = 500};
	int rv = kv_server_create(&dst_cfg, &dst, err, sizeof(err));
	if (rv != 0)
		fail_msg("create: %s: %s", kv_errname(rv), err);
	assert_int_equal(kv_server_start(dst), 0);
	wait_ready(src_url, e);
	wait_ready(dst_url, e);
	for (int i = 0; i < NKEYS; i++) {
		snprintf(k, sizeof(k), "p%04d", i);
		snprintf(v, sizeof(v), "value-%d", i);
		assert_int_equal(do_put(src_url, k, v, 0, 0).status, 0);
	}
	fake_ctl_hold_fence(ctl);
	fake_cfg b = fake_cfg_owners(ctl, 0, "m", 1, 2);
	fake_cfg_mig(&b, 1, "m", "", 1, 2);
	fake_cfg_publish(ctl, &b);
	/* The destination has the range and acked the fence; the source dies
	 * before the controller answers. */
	fake_ctl_wait_fenced(ctl, 15000);
	assert_int_equal(kill(src_pid, SIGKILL), 0);
	kv_proc_reap(src_pid, 5000, NULL);
	src_pid = 0;
	clients_close();
	fake_ctl_release_fence(ctl, 0);
	src_start();
	fake_ctl_wait_done(ctl, 1, 30000);
	e = fake_ctl_publish_owners(ctl, "m", 1, 2);
	wait_ready(dst_url, e);
	for (int i = 0; i < NKEYS; i++) {
		snprintf(k, sizeof(k), "p%04d", i);
		snprintf(v, sizeof(v), "value-%d", i);
		res1 r = do_get(dst_url, k);
		if (r.status != 0)
			fail_msg("key %s lost: status %d at the destination", k, r.status);
		assert_string_equal(r.value, v);
	}
	wait_ready(src_url, e);
	res1 r = do_get(src_url, "p0000");
	assert_int_equal(r.status, SHARDKV__STATUS__STATUS_WRONG_OWNER);
	assert_int_equal(r.hint_node, 2);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(
	        source_sigkilled_between_fence_ack_and_commit_restarts_and_hands_over_every_key,
	        setup, teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	kv_proc_install_exit_paths(NULL);
	if (getenv("KV_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KV_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
