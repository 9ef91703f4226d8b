/*
 * test_cluster_controller.c - a controller restart in the middle of a
 * session, with real daemons: while a client keeps reading and writing, the
 * controller stops (SIGTERM, clean exit) and starts again on the same data
 * dir. Data operations never need the controller while the configuration
 * does not change, so none fails, during the outage or after; the
 * restarted controller has the same epoch and the whole history (an old
 * epoch's configuration is still served unchanged); admin commands work
 * again after the restart.
 */
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

static kv_tc tc;

static int
setup2(void **state)
{
	(void)state;
	/* One copy on purpose: the restart must find the epoch where the
	 * outage left it and a move must migrate. With replicas the outage
	 * (about as long as the lease) stalls the backups' streams, the
	 * primaries ask for ISR changes that commit once the controller is
	 * back, and a move only hands the primary role over. */
	return kv_tc_start_one_copy(&tc, "cluster-ctl", 2);
}

static int
teardown(void **state)
{
	(void)state;
	kv_tc_destroy(&tc);
	return 0;
}

/* A loop of puts and gets on its own keys, counting what happened. */
typedef struct {
	shardkv_client *c;    /* the session's client (shared with the main thread) */
	atomic_int stop;      /* set by the main thread */
	atomic_int phase;     /* 0 before the outage, 1 during, 2 after the restart */
	atomic_long ok[3];    /* successful put+get pairs per phase */
	atomic_long failures; /* failed or wrong operations */
	char first[512];      /* the first failure */
} session;

static void *
session_main(void *arg)
{
	session *s = arg;

	for (unsigned i = 0; !atomic_load(&s->stop); i++) {
		char k[32], v[32];
		shardkv_buf got = {0};
		int ph = atomic_load(&s->phase);
		snprintf(k, sizeof(k), "sess/%04u", i % 500);
		snprintf(v, sizeof(v), "v%u", i);
		int rv = shardkv_put(s->c, k, strlen(k), v, strlen(v));
		if (rv == 0)
			rv = shardkv_get(s->c, k, strlen(k), &got);
		bool same = rv == 0 && got.len == strlen(v) && memcmp(got.data, v, got.len) == 0;
		if (rv == 0 && same) {
			atomic_fetch_add(&s->ok[ph], 1);
		} else if (atomic_fetch_add(&s->failures, 1) == 0) {
			snprintf(s->first, sizeof(s->first), "phase %d, %s: %s (%s)%s", ph, k,
			         shardkv_strerror(rv), rv ? shardkv_errmsg() : "",
			         rv == 0 ? " read back a different value" : "");
		}
		shardkv_free(got.data);
	}
	return NULL;
}

/* Fails unless a and b are the same configuration (epoch, nodes, ranges). */
static void
assert_same_config(const shardkv_config *a, const shardkv_config *b)
{
	assert_int_equal(a->epoch, b->epoch);
	assert_int_equal(a->nnodes, b->nnodes);
	for (size_t i = 0; i < a->nnodes; i++) {
		assert_int_equal(a->nodes[i].id, b->nodes[i].id);
		assert_int_equal(a->nodes[i].state, b->nodes[i].state);
		assert_string_equal(a->nodes[i].address, b->nodes[i].address);
	}
	assert_int_equal(a->nranges, b->nranges);
	for (size_t i = 0; i < a->nranges; i++) {
		assert_int_equal(a->ranges[i].node, b->ranges[i].node);
		assert_int_equal(a->ranges[i].start.len, b->ranges[i].start.len);
		assert_memory_equal(a->ranges[i].start.data, b->ranges[i].start.data,
		                    a->ranges[i].start.len);
		assert_int_equal(a->ranges[i].end.len, b->ranges[i].end.len);
		assert_memory_equal(a->ranges[i].end.data, b->ranges[i].end.data,
		                    a->ranges[i].end.len);
	}
	assert_int_equal(a->nmigrations, b->nmigrations);
}

/* Waits until the session made `n` more successful pairs in its phase. */
static bool
session_progresses(session *s, long n, unsigned ms)
{
	int ph = atomic_load(&s->phase);
	long start = atomic_load(&s->ok[ph]);
	uint64_t t0 = kv_test_now_ms();

	while (kv_test_now_ms() - t0 < ms) {
		if (atomic_load(&s->ok[ph]) - start >= n)
			return true;
		kv_test_sleep_ms(10);
	}
	return false;
}

static void
a_controller_restart_keeps_history_and_the_session_working(void **state)
{
	enum { N = 2000, VLEN = 50 };
	static session s;
	pthread_t thr;
	shardkv_config *old, *latest, *cfg;
	char msg[512], n1[16], n2[16];
	int idx[2] = {0, 1}, status = 0;
	(void)state;

	memset(&s, 0, sizeof(s));
	s.c = kv_tc_client(&tc, false, 10000);
	assert_non_null(s.c);
	/* Some history: the keys spread with two moves, written, a third move. */
	KV_TC_EXPECT(&tc, 0, kv_tc_spread(&tc, "cr/", N, idx, 2));
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(s.c, "cr/", N, 1, VLEN, msg, sizeof(msg)));
	kv_tc_node_arg(&tc, 0, n1, sizeof(n1));
	kv_tc_node_arg(&tc, 1, n2, sizeof(n2));
	KV_TC_EXPECT(
	    &tc, 0,
	    shardkv_move(tc.admin, "cr/000500", 9, "cr/001500", 9, n2, 0, SHARDKV_WAIT, NULL));
	latest = kv_tc_config(&tc);
	assert_non_null(latest);
	assert_true(latest->epoch >= 4);
	KV_TC_EXPECT(&tc, 0, shardkv_config_get(tc.admin, 2, &old));

	assert_int_equal(pthread_create(&thr, NULL, session_main, &s), 0);
	KV_TC_ASSERT(&tc, session_progresses(&s, 50, 10000), "the session makes no progress");

	/* The outage. */
	int stopped = kv_tc_stop_controller(&tc, SIGTERM, KV_TC_STOP_MS, &status);
	bool clean = stopped == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
	atomic_store(&s.phase, 1);
	/* An outage long enough for the watches and heartbeats to fail. */
	uint64_t t_down = kv_test_now_ms();
	bool served = session_progresses(&s, 200, 10000);
	while (served && kv_test_now_ms() - t_down < 1500)
		served = session_progresses(&s, 1, 10000);
	KV_TC_ASSERT(&tc, kv_tc_verify(s.c, "cr/", N, 1, VLEN, msg, sizeof(msg)) == 0,
	             "reading during the outage: %s", msg);

	/* The restart. */
	KV_TC_ASSERT(&tc, kv_tc_start_controller(&tc) == 0, "the controller did not restart");
	atomic_store(&s.phase, 2);
	cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	KV_TC_ASSERT(&tc, cfg->epoch == latest->epoch, "the epoch went from %llu to %llu",
	             (unsigned long long)latest->epoch, (unsigned long long)cfg->epoch);
	assert_same_config(cfg, latest);
	shardkv_config_free(cfg);
	for (uint64_t e = 1; e <= latest->epoch; e++) {
		KV_TC_EXPECT(&tc, 0, shardkv_config_get(tc.admin, e, &cfg));
		assert_int_equal(cfg->epoch, e);
		if (e == old->epoch)
			assert_same_config(cfg, old);
		shardkv_config_free(cfg);
	}
	KV_TC_EXPECT(&tc, SHARDKV_ENOTFOUND, shardkv_config_get(tc.admin, latest->epoch + 1, &cfg));
	KV_TC_ASSERT(&tc, session_progresses(&s, 200, 10000),
	             "the session makes no progress after the restart");

	/* Admin commands work again, and the session follows the move. */
	shardkv_admin_result ar;
	KV_TC_EXPECT(&tc, 0, shardkv_move(tc.admin, "cr/", 3, "cr0", 3, n1, 0, SHARDKV_WAIT, &ar));
	assert_true(ar.epoch > latest->epoch);
	assert_true(ar.nmigrations > 0);
	KV_TC_EXPECT(&tc, 0,
	             shardkv_move(tc.admin, "sess/", 5, "sess0", 5, n2, 0, SHARDKV_WAIT, &ar));
	KV_TC_ASSERT(&tc, session_progresses(&s, 200, 10000),
	             "the session makes no progress after the moves");
	atomic_store(&s.stop, 1);
	pthread_join(thr, NULL);
	KV_TC_ASSERT(&tc, atomic_load(&s.failures) == 0, "%ld session operations failed; first: %s",
	             atomic_load(&s.failures), s.first);
	long bad = kv_tc_verify(s.c, "cr/", N, 1, VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld keys wrong after the restart: %s", bad, msg);
	shardkv_config_free(old);
	shardkv_config_free(latest);
	shardkv_close(s.c);
	/* Checked last so that everything above is known too. */
	KV_TC_ASSERT(&tc, served,
	             "data operations stalled while the controller was down "
	             "(%ld done)",
	             atomic_load(&s.ok[1]));
	KV_TC_ASSERT(&tc, clean,
	             "the controller did not stop cleanly on SIGTERM (%s, status 0x%x) while "
	             "servers and a client were connected",
	             stopped ? "killed after 5 s" : "exited", status);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(
	        a_controller_restart_keeps_history_and_the_session_working, setup2, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
