/*
 * test_readd_inproc.c - a restarted backup is taken back into the ISR
 * (doc/replication.md "ISR changes" Expand, "Catch-up", "Failure cases"),
 * with a real controller and two real shard servers in the test process:
 *
 * - two servers, --replicas 2, --min-insync 2, --fsync always, a writer
 *   on the primary: the backup stops and starts again at once on its data
 *   dir, several rounds; each time it is copied and back in the ISR within
 *   a deadline, writes succeed again, and at the end both servers hold
 *   every acknowledged write.
 *
 * Every wait polls with a deadline.
 */
#include "common/err.h"
#include "shardserver/server.h"
#include "tests/support/inproc_cluster.h"
#include "tests/support/inproc_srv.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define PATIENCE INPROC_CLUSTER_PATIENCE_MS
#define READD_MS 8000u /* a restarted backup is back in the ISR within this */
#define ROUNDS   6
#define NW       2000 /* keys the writer may touch */

static inproc_cluster rb = {.o = {.name = "kvreadd", .replicas = 2, .min_insync = 2}};

/* Whether every range of the configuration has two in-sync members (and,
 * when primary is not 0, is led by it). */
static bool
all_in_sync(inproc_cluster *c, uint32_t primary)
{
	kv_config *cfg = inproc_cluster_config(c);
	bool ok = cfg != NULL && cfg->nranges > 0;

	for (size_t i = 0; ok && i < cfg->nranges; i++)
		ok = kv_range_ninsync(&cfg->ranges[i]) == 2 &&
		     (primary == 0 || cfg->ranges[i].node == primary);
	kv_config_free(cfg);
	return ok;
}

/* Whether some range has a single in-sync member. */
static bool
some_isr_short(inproc_cluster *c)
{
	kv_config *cfg = inproc_cluster_config(c);
	bool shrt = false;

	for (size_t i = 0; cfg != NULL && i < cfg->nranges; i++)
		shrt |= kv_range_ninsync(&cfg->ranges[i]) == 1;
	kv_config_free(cfg);
	return shrt;
}

/* Waits until every range has two in-sync members (see all_in_sync). */
static void
wait_all_in_sync(inproc_cluster *c, uint32_t primary, const char *when)
{
	uint64_t t0 = kv_test_now_ms();

	while (!all_in_sync(c, primary)) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("%s: a range never had both nodes in its ISR", when);
		kv_test_sleep_ms(10);
	}
}

/* The writer: puts on the primary until told to stop, remembering what was
 * acknowledged. */
typedef struct {
	const char *url;
	atomic_bool stop;
	atomic_uint acked;
	int state[NW]; /* 0: never written; v > 0: value v acknowledged; -2: unknown */
} writer;

static void *
writer_main(void *arg)
{
	writer *w = arg;
	char key[16], val[16];

	for (unsigned i = 1; !atomic_load(&w->stop); i++) {
		unsigned k = (i * 7919u) % NW;
		snprintf(key, sizeof(key), "w%04u", k);
		snprintf(val, sizeof(val), "%u", i);
		res1 r = do_put(w->url, key, val, 0, 0);
		w->state[k] = r.status == 0 ? (int)i : -2;
		if (r.status == 0)
			atomic_fetch_add(&w->acked, 1);
		else
			kv_test_sleep_ms(5); /* refused while the ISR is short */
	}
	return NULL;
}

/* Checks that server s holds every write w had acknowledged. */
static void
check_writer(const writer *w, kv_server *s)
{
	char key[16], val[16];
	unsigned checked = 0;

	for (unsigned k = 0; k < NW; k++) {
		if (w->state[k] <= 0)
			continue;
		snprintf(key, sizeof(key), "w%04u", k);
		snprintf(val, sizeof(val), "%d", w->state[k]);
		if (!inproc_srv_holds(s, key, val))
			fail_msg("%s: acknowledged value %s not held", key, val);
		checked++;
	}
	assert_true(checked > 0);
}

static writer w;
static pthread_t wt;
static bool wt_running;

/* Stops the writer (before a failure too: teardown stops the servers). */
static void
writer_stop(void)
{
	if (!wt_running)
		return;
	atomic_store(&w.stop, true);
	pthread_join(wt, NULL);
	wt_running = false;
}

/* Waits until the writer has had `more` further writes acknowledged. */
static void
wait_acked(unsigned more, const char *when)
{
	unsigned base = atomic_load(&w.acked);
	uint64_t t0 = kv_test_now_ms();

	while (atomic_load(&w.acked) < base + more) {
		if (kv_test_now_ms() - t0 > READD_MS) {
			writer_stop();
			fail_msg("%s: writes refused for more than %u ms", when, READD_MS);
		}
		kv_test_sleep_ms(10);
	}
}

static void
a_restarted_backup_rejoins_the_isr_and_writes_go_on(void **state)
{
	char why[300];

	(void)state;
	for (int i = 0; i < 2; i++)
		rb.srv[i].cfg.fsync = KV_FSYNC_ALWAYS;
	inproc_cluster_srv_up(&rb, 0);
	srv_wait_ready(rb.srv[0].url, 1, PATIENCE, NULL);
	inproc_cluster_srv_up(&rb, 1);
	wait_all_in_sync(&rb, 1, "at the start");
	/* Node 2 leads a middle range: after its restart node 1 leads three
	 * ranges (two leader epochs) and copies them one after the other. */
	kv_admin_req q = {.op = KV_ADM_MOVE,
	                  .request_id = 1,
	                  .node_id = 2,
	                  .start = {(const uint8_t *)"w1", 2},
	                  .end = {(const uint8_t *)"w2", 2}};
	assert_int_equal(inproc_cluster_admin(&rb, &q, NULL, NULL, why, sizeof(why)), KV_OK);
	wait_all_in_sync(&rb, 0, "after the move");
	w.url = rb.srv[0].url;
	assert_int_equal(pthread_create(&wt, NULL, writer_main, &w), 0);
	wt_running = true;
	wait_acked(200, "before the first restart");
	for (int round = 1; round <= ROUNDS; round++) {
		char when[64];
		kv_config *cfg = inproc_cluster_config(&rb);
		assert_non_null(cfg);
		uint64_t before = cfg->epoch, t0;
		kv_config_free(cfg);
		/* The backup stops. Odd rounds: it starts again at once on its
		 * data dir (it registers with a new boot id while still in the
		 * ISR). Even rounds: once the primary has had it taken out of an
		 * ISR for its silence. */
		inproc_srv_down(&rb.srv[1]);
		if (round % 2 == 0) {
			t0 = kv_test_now_ms();
			while (!some_isr_short(&rb)) {
				if (kv_test_now_ms() - t0 > PATIENCE) {
					writer_stop();
					fail_msg("round %d: the silent backup never left the ISR",
					         round);
				}
				kv_test_sleep_ms(10);
			}
		}
		inproc_cluster_srv_up(&rb, 1);
		t0 = kv_test_now_ms();
		/* Registered and serving again, then in every ISR. (The
		 * controller fails the ranges of a restarted node over on its
		 * first registration or renewal, which say it restarted, so the
		 * middle range goes to node 1; test_restart_inproc.) */
		srv_wait_ready(rb.srv[1].url, before, READD_MS, NULL);
		while (!all_in_sync(&rb, 0)) {
			if (kv_test_now_ms() - t0 > READD_MS) {
				writer_stop();
				fail_msg("round %d: the restarted backup was not back in every ISR "
				         "within %u ms",
				         round, READD_MS);
			}
			kv_test_sleep_ms(10);
		}
		print_message("round %d: back in every ISR %llu ms after its restart\n", round,
		              (unsigned long long)(kv_test_now_ms() - t0));
		snprintf(when, sizeof(when), "round %d, after the rejoin", round);
		wait_acked(100, when);
	}
	writer_stop();
	/* Every acknowledged write is on the primary, and on the backup (in
	 * every ISR: they were acknowledged with it). */
	check_writer(&w, rb.srv[0].s);
	check_writer(&w, rb.srv[1].s);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    INPROC_CLUSTER_TEST(a_restarted_backup_rejoins_the_isr_and_writes_go_on, &rb),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
