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
#define ROUNDS   10
#define NW       2000 /* keys the writer may touch */

static inproc_cluster rb = {.o = {.name = "kvreadd", .replicas = 2, .min_insync = 2}};

/* The number of in-sync members of the one range led by `primary`, or 0
 * when the configuration says otherwise or does not answer. */
static uint32_t
isr_size(inproc_cluster *c, uint32_t primary)
{
	kv_config *cfg = inproc_cluster_config(c);
	uint32_t n = 0;

	if (cfg && cfg->nranges == 1 && cfg->ranges[0].node == primary)
		n = kv_range_ninsync(&cfg->ranges[0]);
	kv_config_free(cfg);
	return n;
}

/* Whether server s holds key (with value want unless NULL). */
static bool
holds(kv_server *s, const char *key, const char *want)
{
	kv_buf v = {0};
	bool ok = kv_server_get_for_test(s, key, strlen(key), &v) == 0;

	if (ok && want != NULL)
		ok = v.len == strlen(want) && memcmp(v.data, want, v.len) == 0;
	kv_buf_fini(&v);
	return ok;
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

/* Waits until the writer has had `more` further writes acknowledged. */
static void
wait_acked(writer *w, unsigned more, const char *when)
{
	unsigned base = atomic_load(&w->acked);
	uint64_t t0 = kv_test_now_ms();

	while (atomic_load(&w->acked) < base + more) {
		if (kv_test_now_ms() - t0 > READD_MS)
			fail_msg("%s: writes refused for more than %u ms", when, READD_MS);
		kv_test_sleep_ms(10);
	}
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
		if (!holds(s, key, val))
			fail_msg("%s: acknowledged value %s not held", key, val);
		checked++;
	}
	assert_true(checked > 0);
}

static void
a_restarted_backup_rejoins_the_isr_and_writes_go_on(void **state)
{
	static writer w;
	pthread_t t;

	(void)state;
	for (int i = 0; i < 2; i++)
		rb.srv[i].cfg.fsync = KV_FSYNC_ALWAYS;
	inproc_cluster_srv_up(&rb, 0);
	srv_wait_ready(rb.srv[0].url, 1, PATIENCE, NULL);
	inproc_cluster_srv_up(&rb, 1);
	uint64_t t0 = kv_test_now_ms();
	while (isr_size(&rb, 1) != 2) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("node 2 never joined the ISR");
		kv_test_sleep_ms(20);
	}
	w.url = rb.srv[0].url;
	assert_int_equal(pthread_create(&t, NULL, writer_main, &w), 0);
	wait_acked(&w, 200, "before the first restart");
	for (int round = 1; round <= ROUNDS; round++) {
		char when[64];
		kv_config *cfg = inproc_cluster_config(&rb);
		assert_non_null(cfg);
		uint64_t before = cfg->epoch;
		kv_config_free(cfg);
		/* The backup stops. Odd rounds: it starts again at once on its
		 * data dir (it registers with a new boot id while still in the
		 * ISR). Even rounds: once the primary has had it taken out of the
		 * ISR for its silence. */
		inproc_srv_down(&rb.srv[1]);
		if (round % 2 == 0) {
			t0 = kv_test_now_ms();
			while (isr_size(&rb, 1) != 1) {
				if (kv_test_now_ms() - t0 > PATIENCE)
					fail_msg("round %d: the silent backup never left the ISR",
					         round);
				kv_test_sleep_ms(10);
			}
		}
		inproc_cluster_srv_up(&rb, 1);
		t0 = kv_test_now_ms();
		/* Registered and serving again, then in the ISR. */
		srv_wait_ready(rb.srv[1].url, before, READD_MS, NULL);
		while (isr_size(&rb, 1) != 2) {
			if (kv_test_now_ms() - t0 > READD_MS) {
				atomic_store(&w.stop, true);
				pthread_join(t, NULL);
				fail_msg("round %d: the restarted backup was not back in the ISR "
				         "within %u ms",
				         round, READD_MS);
			}
			kv_test_sleep_ms(10);
		}
		print_message("round %d: back in the ISR %llu ms after its restart\n", round,
		              (unsigned long long)(kv_test_now_ms() - t0));
		snprintf(when, sizeof(when), "round %d, after the rejoin", round);
		wait_acked(&w, 100, when);
	}
	atomic_store(&w.stop, true);
	pthread_join(t, NULL);
	/* Every acknowledged write is on the primary, and on the backup once it
	 * has the last records (it is in the ISR: they were acknowledged). */
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
