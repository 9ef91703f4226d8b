/*
 * test_server_inproc.c - shard servers run inside the test process through
 * their life cycle (kv_server_create/start/leave/stop/destroy, server.h)
 * against the fake controller (tests/support/fake_ctl.h): serving, two servers in
 * one process moving a range, a restart on the same data dir, the graceful
 * leave, and the failures of create and start; a get that waits out a
 * write in progress on its key.
 *
 * Every server a test creates is destroyed by the teardown, whatever the
 * outcome; every wait polls with a deadline.
 */
#include "common/err.h"
#include "shardserver/durable/durable.h"
#include "shardserver/server.h"
#include "shardserver/server_int.h" /* the server's log, for its key stripes */
#include "tests/support/fake_ctl.h"
#include "tests/support/inproc_srv.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define NSRV 2

typedef inproc_srv srv;

static srv srvs[NSRV];
static fake_ctl *ctl;
static char tmpdir[128];

static int
setup(void **state)
{
	(void)state;
	inproc_srv_setup(srvs, NSRV, &ctl, tmpdir, sizeof(tmpdir), "kvinproc", 16);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	inproc_srv_cleanup(srvs, NSRV, &ctl, tmpdir);
	return 0;
}

static void
server_in_process_serves_after_its_first_configuration_and_stops_cleanly(void **state)
{
	(void)state;
	fake_ctl_add_node(ctl, srvs[0].url);
	fake_ctl_add_node(ctl, srvs[1].url); /* never started */
	uint64_t e = fake_ctl_publish_owners(ctl, "m", 1, 2);
	inproc_srv_up(&srvs[0]);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	const char *u = srvs[0].url;
	assert_int_equal(do_put(u, "apple", "red", 0, 0).status, 0);
	assert_string_equal(do_get(u, "apple").value, "red");
	assert_int_equal(do_append(u, "apple", "!", 9, 1).value_len, 4);
	assert_int_equal(do_append(u, "apple", "!", 9, 1).value_len, 4); /* a retry */
	res1 w = do_put(u, "zebra", "x", 0, 0);
	assert_int_equal(w.status, SHARDKV__STATUS__STATUS_WRONG_OWNER);
	assert_int_equal(w.hint_node, 2);
	assert_string_equal(w.hint_addr, srvs[1].url);
	inproc_srv_down(&srvs[0]);
	/* Stopped: nothing listens any more. */
	clients_close();
	assert_int_equal(do_get(u, "apple").status, -1);
}

static void
two_servers_in_one_process_move_a_range_between_them(void **state)
{
	(void)state;
	fake_ctl_add_node(ctl, srvs[0].url);
	fake_ctl_add_node(ctl, srvs[1].url);
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 1, 1);
	inproc_srv_up(&srvs[0]);
	inproc_srv_up(&srvs[1]);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	char k[32], v[32];
	for (int i = 0; i < 200; i++) {
		snprintf(k, sizeof(k), "%c%03d", i % 2 ? 'a' : 'p', i);
		snprintf(v, sizeof(v), "v%d", i);
		assert_int_equal(do_put(srvs[0].url, k, v, 0, 0).status, 0);
	}
	fake_cfg b = fake_cfg_owners(ctl, 0, "m", 1, 2);
	fake_cfg_mig(&b, 1, "m", "", 1, 2);
	fake_cfg_publish(ctl, &b);
	fake_ctl_wait_done(ctl, 1, 30000);
	e = fake_ctl_publish_owners(ctl, "m", 1, 2);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	for (int i = 0; i < 200; i++) {
		snprintf(k, sizeof(k), "%c%03d", i % 2 ? 'a' : 'p', i);
		snprintf(v, sizeof(v), "v%d", i);
		const char *owner = i % 2 ? srvs[0].url : srvs[1].url;
		res1 r = do_get(owner, k);
		assert_int_equal(r.status, 0);
		assert_string_equal(r.value, v);
	}
	res1 r = do_get(srvs[0].url, "p000");
	assert_int_equal(r.status, SHARDKV__STATUS__STATUS_WRONG_OWNER);
	assert_int_equal(r.hint_node, 2);
	inproc_srv_down(&srvs[1]);
	inproc_srv_down(&srvs[0]);
}

static void
restarted_on_the_same_data_dir_a_server_keeps_its_data_and_node_id(void **state)
{
	(void)state;
	fake_ctl_add_node(ctl, srvs[1].url); /* node 1 is someone else */
	fake_ctl_add_node(ctl, srvs[0].url);
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 2, 2);
	inproc_srv_up(&srvs[0]);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	assert_int_equal(do_put(srvs[0].url, "kept", "yes", 0, 0).status, 0);
	inproc_srv_down(&srvs[0]);
	clients_close();
	pthread_mutex_lock(&ctl->mu);
	unsigned regs = ctl->registers;
	assert_int_equal(ctl->last_resume, 0);
	pthread_mutex_unlock(&ctl->mu);
	inproc_srv_up(&srvs[0]);
	assert_int_equal(fake_ctl_wait_register(ctl, regs, 10000), 2);
	/* Serves what the log held. */
	uint64_t deadline = kv_test_now_ms() + 10000;
	res1 r;
	while ((r = do_get(srvs[0].url, "kept")).status != 0 && kv_test_now_ms() < deadline)
		kv_test_sleep_ms(10);
	assert_int_equal(r.status, 0);
	assert_string_equal(r.value, "yes");
	inproc_srv_down(&srvs[0]);
}

static void
leave_returns_drained_once_the_controller_marks_the_node_gone(void **state)
{
	(void)state;
	ctl->accept_leave = true;
	fake_ctl_add_node(ctl, srvs[0].url);
	fake_ctl_add_node(ctl, srvs[1].url);
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 1, 1);
	inproc_srv_up(&srvs[0]);
	inproc_srv_up(&srvs[1]);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	assert_int_equal(do_put(srvs[0].url, "l1", "v", 0, 0).status, 0);
	/* Nothing published yet: the leave times out, the node still serves. */
	assert_int_equal(kv_server_leave(srvs[0].s, 300, NULL, NULL), KV_LEAVE_TIMED_OUT);
	assert_int_equal(do_get(srvs[0].url, "l1").status, 0);
	fake_ctl_drain(ctl, 1, 2, 1, 30000);
	assert_int_equal(kv_server_leave(srvs[0].s, 15000, NULL, NULL), KV_LEAVE_DRAINED);
	pthread_mutex_lock(&ctl->mu);
	assert_int_equal(ctl->leave_from, 1);
	pthread_mutex_unlock(&ctl->mu);
	inproc_srv_down(&srvs[0]);
	res1 r = do_get(srvs[1].url, "l1");
	assert_int_equal(r.status, 0);
	assert_string_equal(r.value, "v");
	inproc_srv_down(&srvs[1]);
}

/* kv_server_wait_cb that cuts the leave short at once. */
static bool
cut_at_once(void *arg, unsigned ms)
{
	(void)ms;
	(*(int *)arg)++;
	return true;
}

static void
leave_cut_short_by_the_wait_callback_reports_where(void **state)
{
	(void)state;
	int calls = 0;
	ctl->accept_leave = true;
	fake_ctl_add_node(ctl, srvs[0].url);
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 1, 1);
	inproc_srv_up(&srvs[0]);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	assert_int_equal(kv_server_leave(srvs[0].s, 5000, cut_at_once, &calls),
	                 KV_LEAVE_CUT_DRAINING);
	assert_int_equal(calls, 1);
	inproc_srv_down(&srvs[0]);
}

static void
start_on_a_busy_listen_address_fails_and_destroy_cleans_up(void **state)
{
	(void)state;
	char err[256];
	snprintf(srvs[0].url, sizeof(srvs[0].url), "%s", ctl->url);
	assert_int_equal(kv_server_create(&srvs[0].cfg, &srvs[0].s, err, sizeof(err)), 0);
	assert_int_equal(kv_server_start(srvs[0].s), KV_EADDRINUSE);
	kv_server_destroy(srvs[0].s);
	srvs[0].s = NULL;
	kv_server_destroy(NULL);
}

static void
create_refuses_a_data_dir_that_is_a_file(void **state)
{
	(void)state;
	char err[256] = "";
	FILE *f = fopen(srvs[0].dir, "w");
	assert_non_null(f);
	fclose(f);
	assert_int_equal(kv_server_create(&srvs[0].cfg, &srvs[0].s, err, sizeof(err)), KV_EINVAL);
	assert_null(srvs[0].s);
	assert_string_equal(err, "cannot use data dir");
}

static void
server_created_but_never_started_stops_and_is_destroyed(void **state)
{
	(void)state;
	char err[256];
	assert_int_equal(kv_server_create(&srvs[0].cfg, &srvs[0].s, err, sizeof(err)), 0);
	assert_int_equal(kv_server_leave(srvs[0].s, 100, NULL, NULL), KV_LEAVE_NOT_RUNNING);
	assert_int_equal(kv_server_stop(srvs[0].s), 0);
	assert_int_equal(kv_server_stop(srvs[0].s), 0);
	assert_int_equal(kv_server_start(srvs[0].s), KV_EINVAL);
	assert_int_equal(kv_server_leave(srvs[0].s, 100, NULL, NULL), KV_LEAVE_NOT_RUNNING);
	kv_server_destroy(srvs[0].s);
	srvs[0].s = NULL;
}

/* A get from its own thread. */
struct get_call {
	const char *url, *key;
	res1 r;
	atomic_bool done;
};

static void *
get_main(void *arg)
{
	struct get_call *g = arg;

	g->r = do_get(g->url, g->key);
	atomic_store(&g->done, true);
	return NULL;
}

/* A write holds its key's stripe from before its apply to the store until
 * after it raised the server's visible LSN; a get of the key that read
 * while a write was in between answers only once the stripe is free, so
 * that its reply waits for that write's log and commit (doc/replication.md
 * "Writes"). Here the test holds the stripe as such a write would. */
static void
a_get_answers_only_once_a_write_holding_its_key_is_through(void **state)
{
	struct get_call g = {.url = srvs[0].url, .key = "k"};
	pthread_t th;
	kv_dur_held h;

	(void)state;
	fake_ctl_add_node(ctl, srvs[0].url);
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 1, 1);
	inproc_srv_up(&srvs[0]);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	assert_int_equal(do_put(srvs[0].url, "k", "v1", 0, 0).status, 0);

	kv_dur_lock_key(srvs[0].s->dur, "k", 1, &h);
	atomic_store(&g.done, false);
	assert_int_equal(pthread_create(&th, NULL, get_main, &g), 0);
	/* Not answered while the stripe is held (a get that did not wait
	 * would answer within a millisecond or so). */
	for (uint64_t t0 = kv_test_now_ms(); kv_test_now_ms() - t0 < 300;) {
		if (atomic_load(&g.done)) {
			kv_dur_unlock(srvs[0].s->dur, &h);
			pthread_join(th, NULL);
			fail_msg("the get answered while a write held its key's stripe");
		}
		kv_test_sleep_ms(5);
	}
	kv_dur_unlock(srvs[0].s->dur, &h);
	for (uint64_t t0 = kv_test_now_ms(); !atomic_load(&g.done);) {
		if (kv_test_now_ms() - t0 > 15000)
			fail_msg("the get never answered after the stripe was released");
		kv_test_sleep_ms(5);
	}
	pthread_join(th, NULL);
	assert_int_equal(g.r.status, 0);
	assert_string_equal(g.r.value, "v1");
	/* Another key's get does not wait for it. */
	kv_dur_lock_key(srvs[0].s->dur, "k", 1, &h);
	res1 r = do_get(srvs[0].url, "absent-key-of-another-stripe");
	kv_dur_unlock(srvs[0].s->dur, &h);
	assert_int_equal(r.status, SHARDKV__STATUS__STATUS_NOT_FOUND);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(
	        server_in_process_serves_after_its_first_configuration_and_stops_cleanly, setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(two_servers_in_one_process_move_a_range_between_them,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        restarted_on_the_same_data_dir_a_server_keeps_its_data_and_node_id, setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        leave_returns_drained_once_the_controller_marks_the_node_gone, setup, teardown),
	    cmocka_unit_test_setup_teardown(leave_cut_short_by_the_wait_callback_reports_where,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        start_on_a_busy_listen_address_fails_and_destroy_cleans_up, setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        a_get_answers_only_once_a_write_holding_its_key_is_through, setup, teardown),
	    cmocka_unit_test_setup_teardown(create_refuses_a_data_dir_that_is_a_file, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(server_created_but_never_started_stops_and_is_destroyed,
	                                    setup, teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	if (getenv("KV_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KV_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
