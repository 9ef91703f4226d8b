/*
 * test_balance_inproc.c - the automatic balancer (doc/scheduler.md) with a
 * real controller (--auto-balance on, a small --split-bytes) and three real
 * shard servers in the test process:
 *
 * - sequential keys loaded into the one node that owns their part of the
 *   key space spread over the three nodes within a deadline, with no admin
 *   command, every key still readable from its owner afterwards, `status`
 *   listing the decisions, `rebalance --dry-run` answering the balancer's
 *   next ones, and the controller's /metrics counting the moves;
 * - with --replicas 3 and the one range a new cluster has, the balancer
 *   cuts the range and gives parts' primary roles to in-sync replicas: the
 *   primaries spread and every part is back in sync.
 *
 * Every wait polls with a deadline.
 */
#include "common/err.h"
#include "tests/support/inproc_cluster.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define NSRV     3
#define NKEYS    4000
#define VALLEN   400
#define DEADLINE 90000u /* ms: spread by then, on a busy machine */

static inproc_cluster cl = {.o = {.name = "kvbalance",
                                  .nsrv = NSRV,
                                  .auto_balance = true,
                                  .split_bytes = 512u * 1024u,
                                  .max_migrations = 2}};
/* The same with --replicas 3: every node holds every range. */
static inproc_cluster cl3 = {.o = {.name = "kvbalance3",
                                   .nsrv = NSRV,
                                   .replicas = 3,
                                   .auto_balance = true,
                                   .split_bytes = 512u * 1024u,
                                   .max_migrations = 2}};
static inproc_cluster *cur = &cl;

/* The address of the node that routes key in cfg. */
static const char *
owner_url(const kv_config *cfg, const char *key)
{
	const kv_node *n = kv_config_node(cfg, kv_config_route(cfg, key, strlen(key)));
	return n != NULL ? n->address : NULL;
}

/* Puts key = val at its owner, following the configuration through moves
 * (with a deadline). */
static void
put_routed(kv_config **cfg, const char *key, const char *val)
{
	uint64_t t0 = kv_test_now_ms();

	for (;;) {
		const char *url = owner_url(*cfg, key);
		if (url != NULL && do_put(url, key, val, 0, 0).status == 0)
			return;
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("cannot put %s", key);
		kv_test_sleep_ms(5);
		kv_config_free(*cfg);
		*cfg = inproc_cluster_config(cur);
		assert_non_null(*cfg);
	}
}

/* Keys of 0..NKEYS routed to each node (index node id). */
static void
shares(const kv_config *cfg, unsigned per[NSRV + 1])
{
	char key[32];

	memset(per, 0, (NSRV + 1) * sizeof(*per));
	for (int i = 0; i < NKEYS; i++) {
		snprintf(key, sizeof(key), "user:%06d", i);
		uint32_t n = kv_config_route(cfg, key, strlen(key));
		if (n >= 1 && n <= NSRV)
			per[n]++;
	}
}

/* Whether every range of c has a full in-sync set. */
static bool
all_in_sync(const kv_config *c)
{
	for (size_t i = 0; i < c->nranges; i++)
		if (kv_range_nreplicas(&c->ranges[i]) != NSRV ||
		    kv_range_ninsync(&c->ranges[i]) != NSRV)
			return false;
	return c->nranges > 0;
}

static void
sequential_keys_on_one_node_spread_over_three_without_admin_commands(void **state)
{
	cur = *state;
	char key[32], val[VALLEN + 1], mbuf[65536];
	unsigned per[NSRV + 1];
	kv_config *cfg;
	uint64_t t0;

	for (int i = 0; i < NSRV; i++)
		inproc_cluster_srv_up(cur, i);
	for (uint32_t id = 1; id <= NSRV; id++)
		inproc_cluster_wait_node_state(cur, id, KV_NODE_ACTIVE);
	cfg = inproc_cluster_config(cur);
	assert_non_null(cfg);
	shares(cfg, per);
	/* Before: one node routes every key (the join split by key width). */
	assert_true(per[1] == NKEYS || per[2] == NKEYS || per[3] == NKEYS);
	memset(val, 'v', VALLEN);
	val[VALLEN] = '\0';
	for (int i = 0; i < NKEYS; i++) {
		snprintf(key, sizeof(key), "user:%06d", i);
		put_routed(&cfg, key, val);
	}
	/* Spread: every node routes at least a fifth, nothing in flight. */
	t0 = kv_test_now_ms();
	for (;;) {
		kv_config_free(cfg);
		cfg = inproc_cluster_config(cur);
		assert_non_null(cfg);
		shares(cfg, per);
		if (cfg->nmigs == 0 && per[1] >= NKEYS / 5 && per[2] >= NKEYS / 5 &&
		    per[3] >= NKEYS / 5)
			break;
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("not spread after %u ms: %u %u %u keys, %zu migrations", DEADLINE,
			         per[1], per[2], per[3], cfg->nmigs);
		kv_test_sleep_ms(50);
	}
	print_message("spread in %llu ms: %u %u %u keys over %zu ranges\n",
	              (unsigned long long)(kv_test_now_ms() - t0), per[1], per[2], per[3],
	              cfg->nranges);
	/* Every key is still there, at its owner. */
	for (int i = 0; i < NKEYS; i += 7) {
		snprintf(key, sizeof(key), "user:%06d", i);
		uint64_t t1 = kv_test_now_ms();
		res1 r;
		while ((r = do_get(owner_url(cfg, key), key)).status != 0) {
			if (kv_test_now_ms() - t1 > DEADLINE)
				fail_msg("get %s: status %d", key, r.status);
			kv_test_sleep_ms(5);
			kv_config_free(cfg);
			cfg = inproc_cluster_config(cur);
			assert_non_null(cfg);
		}
		assert_int_equal(strlen(r.value), VALLEN > 255 ? 255 : VALLEN);
	}
	/* status lists the decisions; rebalance --dry-run the next ones (none:
	 * nothing to improve, or a cool-down). */
	static char out[1 << 16], err[4096];
	assert_int_equal(
	    inproc_cluster_cli(cur, out, sizeof(out), err, sizeof(err), "status", "--json", NULL),
	    0);
	assert_non_null(strstr(out, "\"balancer\": [{\"time_ms\": "));
	assert_non_null(strstr(out, "\"kind\": \"move\", \"reason\": \"bytes\""));
	assert_int_equal(inproc_cluster_cli(cur, out, sizeof(out), err, sizeof(err), "rebalance",
	                                    "--dry-run", "--json", NULL),
	                 0);
	assert_non_null(strstr(out, "\"balancer_plan\": ["));
	inproc_cluster_scrape_metrics(cur, mbuf, sizeof(mbuf));
	assert_non_null(strstr(mbuf, "shardkv_controller_balance_moves_total{reason=\"bytes\"}"));
	assert_null(strstr(mbuf, "shardkv_controller_balance_moves_total{reason=\"bytes\"} 0\n"));
	/* Count steps have their own reason (doc/scheduler.md "Primary counts"). */
	assert_non_null(
	    strstr(mbuf, "shardkv_controller_balance_moves_total{reason=\"primaries\"} "));
	assert_non_null(
	    strstr(mbuf, "shardkv_controller_balance_transfers_total{reason=\"primaries\"} "));
	assert_non_null(
	    strstr(mbuf, "shardkv_controller_balance_splits_total{reason=\"primaries\"} "));
	kv_config_free(cfg);
}

/* --replicas 3 on three nodes, one range: the balancer cuts it and hands
 * parts' primary roles to in-sync replicas (doc/scheduler.md), so the
 * primaries spread and every part is back in sync, the load running
 * through. */
static void
a_single_replicated_range_is_cut_and_its_primaries_spread(void **state)
{
	char key[32], val[VALLEN + 1];
	kv_config *cfg;

	cur = *state;
	for (int i = 0; i < NSRV; i++)
		inproc_cluster_srv_up(cur, i);
	for (uint32_t id = 1; id <= NSRV; id++)
		inproc_cluster_wait_node_state(cur, id, KV_NODE_ACTIVE);
	cfg = inproc_cluster_config(cur);
	assert_non_null(cfg);
	for (uint64_t t1 = kv_test_now_ms(); !all_in_sync(cfg);) {
		if (kv_test_now_ms() - t1 > DEADLINE)
			fail_msg("the replicas never came in sync");
		kv_test_sleep_ms(20);
		kv_config_free(cfg);
		cfg = inproc_cluster_config(cur);
		assert_non_null(cfg);
	}
	assert_int_equal(cfg->nranges, 1);
	memset(val, 'v', VALLEN);
	val[VALLEN] = '\0';
	for (int i = 0; i < NKEYS; i++) {
		snprintf(key, sizeof(key), "user:%06d", i);
		put_routed(&cfg, key, val);
	}
	/* At least two nodes lead a part, every part in sync. */
	for (uint64_t t1 = kv_test_now_ms();;) {
		bool spread = false;
		for (size_t i = 1; i < cfg->nranges; i++)
			spread |= cfg->ranges[i].node != cfg->ranges[0].node;
		if (spread && all_in_sync(cfg))
			break;
		if (kv_test_now_ms() - t1 > DEADLINE)
			fail_msg("primaries not spread over in-sync parts: %zu ranges",
			         cfg->nranges);
		kv_test_sleep_ms(50);
		kv_config_free(cfg);
		cfg = inproc_cluster_config(cur);
		assert_non_null(cfg);
	}
	kv_config_free(cfg);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    INPROC_CLUSTER_TEST(
	        sequential_keys_on_one_node_spread_over_three_without_admin_commands, &cl),
	    INPROC_CLUSTER_TEST(a_single_replicated_range_is_cut_and_its_primaries_spread, &cl3),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
