/*
 * test_transfer_inproc.c - a primary transfer that does not copy the old
 * primary again (doc/replication.md "Primary transfer"): a real controller
 * with --replicas 3 and three real shard servers in the test process, one
 * range.
 *
 * With no write in flight, a `move` of the range to an in-sync backup
 * leaves the old primary in the ISR: it answers the new primary's end of
 * the previous leader epoch in sync, the new primary asks the controller
 * to end the transfer fence, and no copy starts anywhere (the servers'
 * shardkv_replica_copies_total stay as they were). The role can then move
 * straight back. Under writes, the controller holds the transfer back from
 * the new primary until the old one has applied it (and drained the
 * range), and nothing acknowledged is lost; with that order switched off
 * (a controller built for tests), a transfer that leaves records
 * outstanding on the stream to the new primary copies the old primary
 * again, and nothing acknowledged is lost either.
 *
 * Every wait polls with a deadline; the servers' metrics listeners and
 * every port are picked free at run time on 127.0.0.1.
 */
#include "common/err.h"
#include "tests/support/http_client.h"
#include "tests/support/inproc_cluster.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <math.h>
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
#define NKEYS    200
#define DEADLINE 30000u /* ms: any wait for a configuration */
#define NWRITERS 4      /* NKEYS is a multiple: each key has one writer */
#define VALLEN   200
#define TRIES    20 /* transfers under writes until one leaves records outstanding */

static inproc_cluster cl = {.o = {.name = "kvtransfer", .nsrv = NSRV, .replicas = 3}};
/* The same, with every server told of a transfer at once. */
static inproc_cluster cl_unordered = {
    .o = {.name = "kvtransfer", .nsrv = NSRV, .replicas = 3, .handover_unordered = true}};
static char mport[NSRV][32]; /* each server's --metrics */
static uint64_t reqid = 1;

static void
key_of(int i, char *buf, size_t cap)
{
	snprintf(buf, cap, "t:%05d", i);
}

/* Sample `name` of server i's /metrics (0 when absent). */
static uint64_t
srv_metric(int i, const char *name)
{
	int port = atoi(strrchr(mport[i], ':') + 1);
	kv_http_answer a = kv_http_get(port, "/metrics");
	assert_int_equal(a.status, 200);
	double v = kv_http_sample(a.body, name);
	kv_http_answer_free(&a);
	return isnan(v) ? 0 : (uint64_t)v;
}

static uint64_t
copies(int i)
{
	return srv_metric(i, "shardkv_replica_copies_total");
}

/* Starts the three servers, each with a metrics listener, and waits for
 * the one range to be on all three, in sync, with no fence. Returns its
 * primary. */
static uint32_t
three_in_sync(inproc_cluster *c)
{
	for (int i = 0; i < NSRV; i++) {
		snprintf(mport[i], sizeof(mport[i]), "127.0.0.1:%d", kv_test_free_port());
		c->srv[i].cfg.metrics = mport[i];
		inproc_cluster_srv_up(c, i);
	}
	for (uint32_t n = 1; n <= NSRV; n++)
		inproc_cluster_wait_node_state(c, n, KV_NODE_ACTIVE);
	for (uint64_t t0 = kv_test_now_ms();;) {
		kv_config *cfg = inproc_cluster_config(c);
		assert_non_null(cfg);
		if (cfg->nranges == 1 && kv_range_ninsync(&cfg->ranges[0]) == NSRV &&
		    cfg->ranges[0].fence == 0 && cfg->nmigs == 0) {
			uint32_t p = cfg->ranges[0].node;
			kv_config_free(cfg);
			return p;
		}
		kv_config_free(cfg);
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("the range is not on three in-sync replicas after %u ms",
			         DEADLINE);
		kv_test_sleep_ms(20);
	}
}

/* Asks the controller to move the whole key space to node `to`; returns
 * the answer's code (KV_EBUSY: the fence still stands). */
static int
move_to(inproc_cluster *c, uint32_t to, uint64_t *epoch)
{
	char why[300];
	kv_admin_req q = {.op = KV_ADM_MOVE, .request_id = ++reqid, .node_id = to};
	return inproc_cluster_admin(c, &q, NULL, epoch, why, sizeof(why));
}

/* Waits until `to` leads the range with all three in sync and no fence;
 * returns the configuration (the caller frees it). */
static kv_config *
wait_unfenced(inproc_cluster *c, uint32_t to)
{
	for (uint64_t t0 = kv_test_now_ms();;) {
		kv_config *cfg = inproc_cluster_config(c);
		assert_non_null(cfg);
		if (cfg->nranges == 1 && cfg->ranges[0].node == to && cfg->ranges[0].fence == 0 &&
		    kv_range_ninsync(&cfg->ranges[0]) == NSRV)
			return cfg;
		if (kv_test_now_ms() - t0 > DEADLINE) {
			print_message("ranges %zu: primary %u, fence %u, %u in sync\n",
			              cfg->nranges, cfg->ranges[0].node, cfg->ranges[0].fence,
			              kv_range_ninsync(&cfg->ranges[0]));
			fail_msg("node %u does not lead the range in sync without a fence", to);
		}
		kv_config_free(cfg);
		kv_test_sleep_ms(10);
	}
}

/* The index of node's server (node ids follow the order the servers
 * registered in, not the order they started in). */
static int
idx_of(inproc_cluster *c, uint32_t node)
{
	kv_config *cfg = inproc_cluster_config(c);
	assert_non_null(cfg);
	const kv_node *nd = kv_config_node(cfg, node);
	assert_non_null(nd);
	for (int i = 0; i < NSRV; i++)
		if (strcmp(c->srv[i].url, nd->address) == 0) {
			kv_config_free(cfg);
			return i;
		}
	kv_config_free(cfg);
	fail_msg("no server has node %u's address", node);
	return -1;
}

static const char *
url_of(inproc_cluster *c, uint32_t node)
{
	return c->srv[idx_of(c, node)].url;
}

static void
a_transfer_with_nothing_in_flight_keeps_the_old_primary_in_sync_without_a_copy(void **state)
{
	inproc_cluster *c = *state;
	char key[32], val[64];
	uint64_t epoch = 0, before[NSRV];
	uint32_t p = three_in_sync(c), q = p % NSRV + 1;

	/* Writes the new primary applies from the old one's stream (its end of
	 * the old leader epoch is then known), all acknowledged by the ISR. */
	for (int i = 0; i < NKEYS; i++) {
		key_of(i, key, sizeof(key));
		snprintf(val, sizeof(val), "v%d", i);
		res1 r = do_put(url_of(c, p), key, val, 41, ++reqid);
		assert_int_equal(r.status, 0);
	}
	for (int i = 0; i < NSRV; i++)
		before[i] = copies(i);

	assert_int_equal(move_to(c, q, &epoch), KV_OK);
	kv_config *cfg = inproc_cluster_config(c);
	assert_non_null(cfg);
	assert_int_equal(cfg->ranges[0].node, q);
	assert_int_equal(cfg->ranges[0].fence, p);
	kv_config_free(cfg);

	/* The fence ends with the old primary still in the ISR. */
	cfg = wait_unfenced(c, q);
	assert_true(kv_range_has_replica(&cfg->ranges[0], p, true));
	assert_true(cfg->epoch > epoch);
	kv_config_free(cfg);
	assert_int_equal(srv_metric(idx_of(c, p), "shardkv_replica_transfers_clean_total"), 1);
	assert_int_equal(srv_metric(idx_of(c, p), "shardkv_replica_transfers_unclean_total"), 0);
	char m[1 << 15];
	inproc_cluster_scrape_metrics(c, m, sizeof(m));
	assert_true(kv_http_sample(m, "shardkv_controller_fences_in_sync_total") >= 1);

	/* No copy anywhere, every key where it was, and the old primary gets
	 * the new primary's writes as a plain member. */
	for (int i = 0; i < NSRV; i++)
		assert_int_equal(copies(i), before[i]);
	for (int i = 0; i < NKEYS; i += 17) {
		key_of(i, key, sizeof(key));
		snprintf(val, sizeof(val), "v%d", i);
		res1 r = do_get(url_of(c, q), key);
		assert_int_equal(r.status, 0);
		assert_string_equal(r.value, val);
		assert_true(inproc_srv_holds(c->srv[idx_of(c, p)].s, key, val));
	}
	res1 r = do_put(url_of(c, q), "t:after", "w", 41, ++reqid);
	assert_int_equal(r.status, 0);
	assert_true(inproc_srv_holds(c->srv[idx_of(c, p)].s, "t:after", "w"));

	/* Nothing stands in the way of moving the role straight back. */
	assert_int_equal(move_to(c, p, &epoch), KV_OK);
	cfg = wait_unfenced(c, p);
	kv_config_free(cfg);
	for (int i = 0; i < NSRV; i++)
		assert_int_equal(copies(i), before[i]);
	r = do_get(url_of(c, p), "t:after");
	assert_int_equal(r.status, 0);
	assert_string_equal(r.value, "w");
}

/* A writer putting its keys over and over at whichever node leads. */
typedef struct {
	inproc_cluster *c;
	atomic_bool *stop;
	int first;
	int span; /* it writes keys 0 .. span - 1 (a multiple of NWRITERS) */
	unsigned acked[NKEYS], tried[NKEYS];
	atomic_uint nok;
} writer;

static void *
writer_main(void *arg)
{
	writer *w = arg;
	kv_config *cfg = inproc_cluster_config(w->c);
	uint64_t id = 0;
	char key[32], val[VALLEN + 1];

	for (unsigned n = 1; !atomic_load(w->stop); n++) {
		int i = (int)((n * NWRITERS + (unsigned)w->first) % (unsigned)w->span);
		key_of(i, key, sizeof(key));
		snprintf(val, sizeof(val), "v%u-", n);
		memset(val + strlen(val), 'x', sizeof(val) - 1 - strlen(val));
		val[sizeof(val) - 1] = '\0';
		w->tried[i] = n;
		const kv_node *nd =
		    cfg ? kv_config_node(cfg, kv_config_route(cfg, key, strlen(key))) : NULL;
		res1 r = {.status = -1};
		if (nd != NULL)
			r = do_put(nd->address, key, val, 90 + (uint64_t)w->first, ++id);
		if (r.status == 0) {
			w->acked[i] = n;
			w->nok++;
			continue;
		}
		kv_test_sleep_ms(2);
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

/* The writers of a test: one thread per writer, each with its keys. */
static writer wr[NWRITERS];
static atomic_bool wr_stop;
static pthread_t wr_th[NWRITERS];

static void
writers_start_span(inproc_cluster *c, int span)
{
	memset(wr, 0, sizeof(wr));
	atomic_store(&wr_stop, false);
	for (int t = 0; t < NWRITERS; t++) {
		wr[t].c = c;
		wr[t].stop = &wr_stop;
		wr[t].first = t;
		wr[t].span = span;
		assert_int_equal(pthread_create(&wr_th[t], NULL, writer_main, &wr[t]), 0);
	}
}

static void
writers_start(inproc_cluster *c)
{
	writers_start_span(c, NKEYS);
}

static void
writers_stop(void)
{
	atomic_store(&wr_stop, true);
	for (int t = 0; t < NWRITERS; t++)
		pthread_join(wr_th[t], NULL);
}

/* Waits until the writers have had n more writes acknowledged. */
static void
writers_wait(unsigned n, const char *what)
{
	unsigned ok0 = oks(wr);
	for (uint64_t t0 = kv_test_now_ms(); oks(wr) < ok0 + n;) {
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("writes stalled%s: %u acknowledged", what, oks(wr) - ok0);
		kv_test_sleep_ms(2);
	}
}

/* Moves the range to q, asking again while the previous fence stands, and
 * waits until q leads it in sync without a fence. */
static void
transfer_to(inproc_cluster *c, uint32_t q)
{
	uint64_t epoch = 0;
	int rv;

	for (uint64_t t0 = kv_test_now_ms(); (rv = move_to(c, q, &epoch)) == KV_EBUSY;) {
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("the move is still refused busy");
		kv_test_sleep_ms(10);
	}
	assert_int_equal(rv, KV_OK);
	kv_config_free(wait_unfenced(c, q));
}

/* Nothing the (stopped) writers had acknowledged is lost, at the primary
 * p and at each replica. */
static void
writers_nothing_lost(inproc_cluster *c, uint32_t p)
{
	char key[32];

	kv_config_free(wait_unfenced(c, p));
	for (int i = 0; i < NKEYS; i++) {
		const writer *wi = &wr[i % NWRITERS];
		if (wi->acked[i] == 0)
			continue;
		key_of(i, key, sizeof(key));
		res1 r = do_get(url_of(c, p), key);
		assert_int_equal(r.status, 0);
		unsigned v = (unsigned)strtoul(r.value + 1, NULL, 10);
		if (v < wi->acked[i] || v > wi->tried[i])
			fail_msg("%s: value %s, last acknowledged v%u", key, r.value, wi->acked[i]);
		for (int n = 0; n < NSRV; n++)
			for (uint64_t t0 = kv_test_now_ms();
			     !inproc_srv_holds(c->srv[n].s, key, r.value);) {
				if (kv_test_now_ms() - t0 > DEADLINE)
					fail_msg("server %d does not hold %s = %s", n, key,
					         r.value);
				kv_test_sleep_ms(10);
			}
	}
}

static void
a_transfer_with_records_outstanding_copies_the_old_primary_again(void **state)
{
	inproc_cluster *c = *state;
	uint32_t p = three_in_sync(c), q = p % NSRV + 1;

	writers_start(c);
	/* Transfers under writes until one leaves records outstanding on the
	 * stream to the new primary (almost always the first). */
	int k;
	for (k = 0; k < TRIES; k++) {
		uint64_t copies_q = copies(idx_of(c, q));
		writers_wait(200, "");
		transfer_to(c, q);
		uint64_t unclean =
		    srv_metric(idx_of(c, p), "shardkv_replica_transfers_unclean_total");
		print_message("transfer %d, %u to %u: %llu unclean so far, %llu copies by %u\n", k,
		              p, q, (unsigned long long)unclean,
		              (unsigned long long)(copies(idx_of(c, q)) - copies_q), q);
		if (unclean > 0) {
			/* The old primary left the ISR and was copied back by the
			 * new one. */
			assert_true(copies(idx_of(c, q)) > copies_q);
			break;
		}
		uint32_t t = p;
		p = q;
		q = t;
	}
	if (k == TRIES)
		fail_msg("no transfer under writes left a record outstanding in %d tries", TRIES);
	/* Writes go on in sync at the new primary. */
	writers_wait(200, " after the transfer");
	writers_stop();
	writers_nothing_lost(c, q);
}

/* Under writes, each transfer reaches the new primary only after the old
 * one applied it: the controller counts the watches it held for that, and
 * every acknowledged write survives at the new primary and every replica. */
static void
transfers_under_writes_reach_the_new_primary_after_the_old_one_applied_them(void **state)
{
	inproc_cluster *c = *state;
	char m[1 << 15];
	uint32_t p = three_in_sync(c), q = p % NSRV + 1;
	uint64_t clean = 0, unclean = 0;
	const int moves = 6;

	writers_start(c);
	for (int k = 0; k < moves; k++) {
		writers_wait(200, "");
		transfer_to(c, q);
		uint32_t t = p;
		p = q;
		q = t;
	}
	writers_stop();
	for (int i = 0; i < NSRV; i++) {
		clean += srv_metric(i, "shardkv_replica_transfers_clean_total");
		unclean += srv_metric(i, "shardkv_replica_transfers_unclean_total");
	}
	inproc_cluster_scrape_metrics(c, m, sizeof(m));
	double holds = kv_http_sample(m, "shardkv_controller_handover_holds_total");
	double timeouts = kv_http_sample(m, "shardkv_controller_handover_hold_timeouts_total");
	print_message("%d transfers under writes: %llu clean, %llu unclean; %.0f watches held, "
	              "%.0f answered at the longest wait\n",
	              moves, (unsigned long long)clean, (unsigned long long)unclean, holds,
	              timeouts);
	assert_int_equal(clean + unclean, (uint64_t)moves);
	/* The new primary's watch is at the controller when a transfer is
	 * installed, so it is held (at the latest) once per transfer. */
	assert_true(holds >= 1);
	assert_true(timeouts <= holds);
	writers_nothing_lost(c, p);
}

/* Moves [start, "") ... or [start, end) to node `to`, asking again while a
 * fence stands, and waits until `to` leads the range starting at start
 * with every range on three in-sync replicas and no fence anywhere. */
static void
transfer_part_to(inproc_cluster *c, const char *start, const char *end, uint32_t to)
{
	char why[300];
	uint64_t epoch = 0;
	int rv;

	for (uint64_t t0 = kv_test_now_ms();;) {
		kv_admin_req q = {.op = KV_ADM_MOVE,
		                  .request_id = ++reqid,
		                  .node_id = to,
		                  .start = {(const uint8_t *)start, strlen(start)},
		                  .end = {(const uint8_t *)end, strlen(end)}};
		if ((rv = inproc_cluster_admin(c, &q, NULL, &epoch, why, sizeof(why))) != KV_EBUSY)
			break;
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("the move is still refused busy: %s", why);
		kv_test_sleep_ms(10);
	}
	assert_int_equal(rv, KV_OK);
	for (uint64_t t0 = kv_test_now_ms();;) {
		kv_config *cfg = inproc_cluster_config(c);
		bool done = false, settled = true;
		assert_non_null(cfg);
		for (size_t i = 0; i < cfg->nranges; i++) {
			const kv_range *r = &cfg->ranges[i];
			settled &= r->fence == 0 && kv_range_ninsync(r) == NSRV;
			done |= r->start.len == strlen(start) &&
			        memcmp(r->start.data, start, r->start.len) == 0 && r->node == to;
		}
		kv_config_free(cfg);
		if (done && settled)
			return;
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("node %u does not lead [%s, %s) with every range in sync", to,
			         start, end);
		kv_test_sleep_ms(10);
	}
}

/* The old primary of a part of its range goes on writing the rest: the
 * third replica's position in its records passes the new primary's end of
 * the old leader epoch with records of the rest only, and it stays in the
 * ISR with no copy (it used to be found diverged and copied again: 14
 * copies in 20 of the balancer's transfers under a pipelined load). */
static void
a_transfer_of_part_of_a_range_copies_no_replica_while_the_old_primary_writes_the_rest(void **state)
{
	inproc_cluster *c = *state;
	uint64_t before[NSRV];
	uint32_t p = three_in_sync(c), q = p % NSRV + 1, r = q % NSRV + 1;
	/* Parts of the keys "t:00000".."t:00199", two keys each from the top
	 * down to "t:00050", moved from p in turn to q and r while p keeps
	 * leading the keys below them, which the writers write (every key was
	 * written first). Whether the third replica passes the new primary's
	 * end with records of p's rest depends on timing: the transfers go on
	 * until one did (shardkv_replication_ends_ahead_in_sync_total), so
	 * that the run shows the rule, or the parts run out. */
	writers_start(c);
	writers_wait(400, "");
	writers_stop();
	writers_start_span(c, 48);
	for (int i = 0; i < NSRV; i++)
		before[i] = copies(i);
	uint64_t ahead = 0;
	int k;
	for (k = 0; k < 75 && ahead == 0; k++) {
		char cut[16], upto[16];
		snprintf(cut, sizeof(cut), "t:%05d", 198 - 2 * k);
		upto[0] = '\0';
		if (k > 0)
			snprintf(upto, sizeof(upto), "t:%05d", 200 - 2 * k);
		writers_wait(50, "");
		transfer_part_to(c, cut, upto, k % 2 ? r : q);
		ahead = 0;
		for (int i = 0; i < NSRV; i++)
			ahead += srv_metric(i, "shardkv_replication_ends_ahead_in_sync_total");
	}
	print_message("%d transfers: %llu ends answered in sync ahead of them\n", k,
	              (unsigned long long)ahead);
	for (int i = 0; i < NSRV; i++)
		print_message("server %d has made %llu copies\n", i,
		              (unsigned long long)(copies(i) - before[i]));
	if (ahead == 0)
		fail_msg("in %d transfers no backup was ahead of a new primary's end", k);
	writers_wait(200, " after the transfers");
	writers_stop();
	for (int i = 0; i < NSRV; i++)
		assert_int_equal(copies(i), before[i]);
	assert_int_equal(srv_metric(idx_of(c, p), "shardkv_replica_transfers_unclean_total"), 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    INPROC_CLUSTER_TEST(
	        a_transfer_with_nothing_in_flight_keeps_the_old_primary_in_sync_without_a_copy,
	        &cl),
	    INPROC_CLUSTER_TEST(a_transfer_with_records_outstanding_copies_the_old_primary_again,
	                        &cl_unordered),
	    INPROC_CLUSTER_TEST(
	        transfers_under_writes_reach_the_new_primary_after_the_old_one_applied_them, &cl),
	    INPROC_CLUSTER_TEST(
	        a_transfer_of_part_of_a_range_copies_no_replica_while_the_old_primary_writes_the_rest,
	        &cl),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
