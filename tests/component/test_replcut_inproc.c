/*
 * test_replcut_inproc.c - cutting a replicated range under writes
 * (doc/replication.md "Moves and rebalance with replicas"): a real
 * controller with --replicas 3 and three real shard servers in the test
 * process, one range, four writers putting keys all the while. An admin
 * `move` of the lower part of the range (the part holding its start) to
 * another in-sync replica cuts it; in the second case the balancer cuts it
 * by itself. The primary of the part it keeps must not lose its backups
 * for good: within a deadline every range is back to a full in-sync set
 * (checked again after 3 s more of writes), no writer is refused for
 * longer than a bound, and nothing acknowledged is lost. Before the
 * servers dropped a cut range's queued records, both cases ended with the
 * kept part at one in-sync member.
 *
 * Every wait polls with a deadline.
 */
#include "common/err.h"
#include "tests/support/inproc_cluster.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define NSRV     3
#define NKEYS    1000
#define DEADLINE 30000u /* ms: every range back in sync by then */
#define STALL_MS 8000u  /* the longest a writer may go without an acknowledged put */
#define NWRITERS 4
#define VALLEN   1000
#define SPREAD   UINT32_MAX /* wait_in_sync: at least two primaries */

static inproc_cluster cl = {.o = {.name = "kvreplcut", .nsrv = NSRV, .replicas = 3}};
/* The same with the balancer on, which cuts the replicated range itself. */
static inproc_cluster clb = {.o = {.name = "kvreplcutb",
                                   .nsrv = NSRV,
                                   .replicas = 3,
                                   .auto_balance = true,
                                   .split_bytes = 256u * 1024u,
                                   .max_migrations = 2}};

/* The writer's state: the last value acknowledged and the last tried per
 * key (a put that failed with a timeout may have been applied). */
typedef struct {
	inproc_cluster *c;
	atomic_bool *stop;
	int first; /* keys first, first + NWRITERS, ... */
	unsigned acked[NKEYS], tried[NKEYS];
	uint64_t longest_ms; /* the longest run of refused puts */
	atomic_uint nok, nfail;
} writer;

static void
key_of(int i, char *buf, size_t cap)
{
	snprintf(buf, cap, "k:%05d", i);
}

static void *
writer_main(void *arg)
{
	writer *w = arg;
	kv_config *cfg = inproc_cluster_config(w->c);
	uint64_t last_ok = kv_test_now_ms(), reqid = 0;
	char key[32], val[VALLEN + 1];

	for (unsigned n = 1; !atomic_load(w->stop); n++) {
		int i = (int)((n * NWRITERS + (unsigned)w->first) % NKEYS);
		key_of(i, key, sizeof(key));
		snprintf(val, sizeof(val), "v%u-", n);
		memset(val + strlen(val), 'x', sizeof(val) - 1 - strlen(val));
		val[sizeof(val) - 1] = '\0';
		w->tried[i] = n;
		const kv_node *nd =
		    cfg ? kv_config_node(cfg, kv_config_route(cfg, key, strlen(key))) : NULL;
		res1 r = {.status = -1};
		if (nd != NULL)
			r = do_put(nd->address, key, val, 77 + (uint64_t)w->first, ++reqid);
		uint64_t now = kv_test_now_ms();
		if (r.status == 0) {
			w->acked[i] = n;
			w->nok++;
			last_ok = now;
			continue;
		}
		w->nfail++;
		if (now - last_ok > w->longest_ms)
			w->longest_ms = now - last_ok;
		kv_test_sleep_ms(5);
		kv_config_free(cfg);
		cfg = inproc_cluster_config(w->c);
	}
	kv_config_free(cfg);
	return NULL;
}

static unsigned
oks(const writer *w)
{
	unsigned n = 0;
	for (int t = 0; t < NWRITERS; t++)
		n += atomic_load(&w[t].nok);
	return n;
}

static bool
all_in_sync(const kv_config *c)
{
	for (size_t i = 0; i < c->nranges; i++)
		if (kv_range_nreplicas(&c->ranges[i]) != NSRV ||
		    kv_range_ninsync(&c->ranges[i]) != NSRV)
			return false;
	return c->nranges > 0;
}

static kv_config *
wait_in_sync(inproc_cluster *c, uint32_t want_primary, const char *key)
{
	kv_config *cfg = NULL;

	for (uint64_t t0 = kv_test_now_ms();;) {
		kv_config_free(cfg);
		cfg = inproc_cluster_config(c);
		assert_non_null(cfg);
		bool spread = false;
		for (size_t i = 1; i < cfg->nranges; i++)
			spread |= cfg->ranges[i].node != cfg->ranges[0].node;
		if (all_in_sync(cfg) && cfg->nmigs == 0 &&
		    (want_primary == 0 || (want_primary == SPREAD && spread) ||
		     kv_config_route(cfg, key, strlen(key)) == want_primary))
			return cfg;
		if (kv_test_now_ms() - t0 > DEADLINE) {
			for (size_t i = 0; i < cfg->nranges; i++)
				print_message("range %zu: primary %u, %u replicas, %u in sync\n", i,
				              cfg->ranges[i].node,
				              kv_range_nreplicas(&cfg->ranges[i]),
				              kv_range_ninsync(&cfg->ranges[i]));
			fail_msg("the ranges are not all in sync after %u ms", DEADLINE);
		}
		kv_test_sleep_ms(20);
	}
}

static void
moving_part_of_a_replicated_range_under_writes_keeps_every_part_in_sync(void **state)
{
	inproc_cluster *c = *state;
	static writer w[NWRITERS];
	static atomic_bool stop;
	static char out[1 << 14], err[4096];
	char key[32], id[8];
	pthread_t th[NWRITERS];
	kv_config *cfg;
	uint32_t primary, to = 0;

	for (int i = 0; i < NSRV; i++)
		inproc_cluster_srv_up(c, i);
	for (uint32_t n = 1; n <= NSRV; n++)
		inproc_cluster_wait_node_state(c, n, KV_NODE_ACTIVE);
	cfg = wait_in_sync(c, 0, "");
	assert_int_equal(cfg->nranges, 1);
	primary = cfg->ranges[0].node;
	to = primary % NSRV + 1;
	kv_config_free(cfg);
	memset(w, 0, sizeof(w));
	atomic_store(&stop, false);
	for (int t = 0; t < NWRITERS; t++) {
		w[t].c = c;
		w[t].stop = &stop;
		w[t].first = t;
		assert_int_equal(pthread_create(&th[t], NULL, writer_main, &w[t]), 0);
	}
	while (oks(w) < 2 * NKEYS)
		kv_test_sleep_ms(10);
	uint64_t t0 = kv_test_now_ms();
	if (c->o.auto_balance) {
		/* The balancer cuts the range and hands a part to another node. */
		to = SPREAD;
	} else {
		/* The lower half of the keys, from the start of the range, goes
		 * to another in-sync replica: the records queued before the cut
		 * name the range by its start, which is now the other part. */
		snprintf(id, sizeof(id), "%u", to);
		int rc = inproc_cluster_cli(c, out, sizeof(out), err, sizeof(err), "move", "",
		                            "k:00500", id, NULL);
		if (rc != 0)
			fail_msg("move: %d %s", rc, err);
	}
	cfg = wait_in_sync(c, to, "k:00100");
	print_message("in sync %llu ms after the writes started (move), %zu ranges\n",
	              (unsigned long long)(kv_test_now_ms() - t0), cfg->nranges);
	if (!c->o.auto_balance)
		assert_int_equal(kv_config_route(cfg, "k:00700", 7), primary);
	/* Writes go on at both primaries, for at least 3 s (a backup that
	 * falls out of an ISR does so within 1 s of silence), and every part
	 * is in sync again afterwards. */
	unsigned ok0 = oks(w);
	for (uint64_t t1 = kv_test_now_ms();
	     oks(w) < ok0 + 4 * NKEYS || kv_test_now_ms() - t1 < 3000;) {
		if (kv_test_now_ms() - t1 > DEADLINE)
			fail_msg("writes stalled after the move: %u acknowledged", oks(w) - ok0);
		kv_test_sleep_ms(10);
	}
	kv_config_free(cfg);
	cfg = wait_in_sync(c, to, "k:00100");
	atomic_store(&stop, true);
	for (int t = 0; t < NWRITERS; t++) {
		pthread_join(th[t], NULL);
		print_message(
		    "writer %d: %u puts acknowledged, %u refused, longest refusal %llu ms\n", t,
		    w[t].nok, w[t].nfail, (unsigned long long)w[t].longest_ms);
		assert_true(w[t].longest_ms < STALL_MS);
	}
	/* Nothing acknowledged is lost: each key holds its last acknowledged
	 * value or a later one that was tried. */
	kv_config_free(cfg);
	cfg = inproc_cluster_config(c);
	assert_non_null(cfg);
	for (int i = 0; i < NKEYS; i++) {
		key_of(i, key, sizeof(key));
		const writer *wi = &w[i % NWRITERS];
		if (wi->acked[i] == 0)
			continue;
		const kv_node *nd = kv_config_node(cfg, kv_config_route(cfg, key, strlen(key)));
		assert_non_null(nd);
		res1 r = do_get(nd->address, key);
		assert_int_equal(r.status, 0);
		unsigned v = (unsigned)strtoul(r.value + 1, NULL, 10);
		if (v < wi->acked[i] || v > wi->tried[i])
			fail_msg("%s: value %s, last acknowledged v%u", key, r.value, wi->acked[i]);
	}
	kv_config_free(cfg);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    INPROC_CLUSTER_TEST(
	        moving_part_of_a_replicated_range_under_writes_keeps_every_part_in_sync, &cl),
	    INPROC_CLUSTER_TEST(
	        moving_part_of_a_replicated_range_under_writes_keeps_every_part_in_sync, &clb),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
