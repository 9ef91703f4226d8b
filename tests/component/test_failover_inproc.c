/*
 * test_failover_inproc.c - replica placement and failover with a real
 * controller (--replicas 2, short leases through its create options) and
 * real shard servers inside the test process (doc/replication.md): the
 * first server holds the key space alone, the second becomes a replica
 * outside the ISR; the primary's IsrChange adds it (and a stale one is
 * refused); a stopped primary's range gets the in-sync replica as its new
 * primary in the configuration that declares it down, with that epoch as
 * its leader epoch, and the old primary stays a replica outside the ISR when
 * it returns; a range without another in-sync member keeps its primary
 * (unavailable; check reports it). status --json shows replicas, insync and
 * leader_epoch; the metrics count failovers and ISR changes.
 *
 * Every wait polls with a deadline; bounds on timings are generous (the
 * machine is shared) except the lower ones, which are what safety needs.
 */
#include "common/err.h"
#include "tests/support/inproc_cluster.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <stdio.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define NSRV     INPROC_CLUSTER_NSRV
#define RENEW    INPROC_CLUSTER_RENEW_MS
#define DOWN_MS  (INPROC_CLUSTER_LEASE_MS + INPROC_CLUSTER_MARGIN_MS)
#define PATIENCE INPROC_CLUSTER_PATIENCE_MS

/* The controller with --replicas 2 and NSRV servers, short leases. The
 * servers copy a replica outside the ISR but never ask to add it: the test
 * sends the IsrChange itself. */
static inproc_cluster cl = {.o = {.name = "kvfail", .replicas = 2, .no_expand = true}};

/* Starts both servers and waits until the one range has replicas {1, 2}
 * with ISR {1}; returns that configuration. */
static kv_config *
replicated_up(void)
{
	uint64_t t0;
	kv_config *cfg = NULL;

	inproc_cluster_srv_up(&cl, 0);
	srv_wait_ready(cl.srv[0].url, 1, PATIENCE, NULL);
	inproc_cluster_srv_up(&cl, 1);
	t0 = kv_test_now_ms();
	for (;;) {
		cfg = inproc_cluster_config(&cl);
		if (cfg && cfg->nnodes == NSRV && cfg->nranges == 1 &&
		    kv_range_nreplicas(&cfg->ranges[0]) == 2)
			break;
		kv_config_free(cfg);
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the second server never became a replica");
		kv_test_sleep_ms(20);
	}
	assert_int_equal(cfg->ranges[0].node, 1);
	assert_int_equal(kv_range_replica(&cfg->ranges[0], 1), 2);
	assert_int_equal(kv_range_ninsync(&cfg->ranges[0]), 1); /* not in sync yet */
	assert_int_equal(cfg->nmigs, 0);
	assert_int_equal(cfg->min_insync, 2); /* the default with two replicas */
	for (size_t i = 0; i < cfg->nnodes; i++)
		assert_int_equal(cfg->nodes[i].state, KV_NODE_ACTIVE);
	return cfg;
}

static void
a_stopped_primary_fails_over_to_the_in_sync_replica(void **state)
{
	char out[8192], err[2048], why[300];
	kv_config *cfg, *now = NULL;
	uint64_t epoch = 0, le, t0, took;

	(void)state;
	cfg = replicated_up();
	le = cfg->ranges[0].leader_epoch;

	/* The primary's request at a stale leader epoch is refused... */
	kv_admin_req q = {.op = KV_ADM_ISR_CHANGE,
	                  .request_id = 7,
	                  .node_id = 1,
	                  .leader_epoch = le + 1,
	                  .add_node = 2};
	assert_int_equal(inproc_cluster_admin(&cl, &q, NULL, NULL, why, sizeof(why)), KV_ESTALE);
	assert_non_null(strstr(why, "leader epoch"));
	/* ...so is another node's... */
	q.node_id = 2;
	q.leader_epoch = le;
	assert_int_equal(inproc_cluster_admin(&cl, &q, NULL, NULL, why, sizeof(why)), KV_ESTALE);
	assert_non_null(strstr(why, "not the primary"));
	/* ...and the primary's at its leader epoch commits one configuration. */
	q.node_id = 1;
	assert_int_equal(inproc_cluster_admin(&cl, &q, NULL, &epoch, why, sizeof(why)), KV_OK);
	assert_int_equal(epoch, cfg->epoch + 1);
	now = inproc_cluster_config(&cl);
	assert_non_null(now);
	assert_int_equal(kv_range_ninsync(&now->ranges[0]), 2);
	assert_int_equal(now->ranges[0].leader_epoch, le);
	kv_config_free(now);
	kv_config_free(cfg);
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "status", "--json", NULL),
	    0);
	assert_non_null(strstr(out, "\"node\": 1, \"replicas\": [1, 2], \"insync\": [1, 2]"));
	assert_non_null(strstr(out, "\"under_replicated\": 0, \"min_insync\": 2, "));
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "status", NULL), 0);
	assert_non_null(strstr(out, "\nmin-insync: 2 (in-sync replicas a write needs)\n"));

	/* The primary stops: the configuration that declares it down makes
	 * the in-sync replica the primary. */
	t0 = kv_test_now_ms();
	inproc_srv_down(&cl.srv[0]);
	inproc_cluster_wait_node_state(&cl, 1, KV_NODE_DOWN);
	took = kv_test_now_ms() - t0;
	assert_true(took + RENEW >= DOWN_MS); /* never before the lease and margin */
	now = inproc_cluster_config(&cl);
	assert_non_null(now);
	assert_int_equal(now->nranges, 1);
	assert_int_equal(now->ranges[0].node, 2);
	/* The same configuration: the leader epoch is the epoch that said down. */
	assert_int_equal(now->ranges[0].leader_epoch, now->epoch);
	assert_int_equal(kv_range_ninsync(&now->ranges[0]), 1);
	assert_true(kv_range_has_replica(&now->ranges[0], 1, false));
	assert_false(kv_range_has_replica(&now->ranges[0], 1, true));
	le = now->ranges[0].leader_epoch;
	kv_config_free(now);
	char ptn[128];
	snprintf(ptn, sizeof(ptn),
	         "\"node\": 2, \"replicas\": [2, 1], \"insync\": [2], \"leader_epoch\": %llu",
	         (unsigned long long)le);
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "status", "--json", NULL),
	    0);
	assert_non_null(strstr(out, ptn));
	char m[16384];
	inproc_cluster_scrape_metrics(&cl, m, sizeof(m));
	assert_non_null(strstr(m, "\nshardkv_controller_failovers_total 1\n"));
	assert_non_null(strstr(m, "\nshardkv_controller_isr_shrinks_total 1\n"));
	assert_non_null(strstr(m, "\nshardkv_controller_isr_expands_total 1\n"));
	/* Two replicas, one in sync. */
	assert_non_null(strstr(m, "\nshardkv_controller_ranges_under_replicated 1\n"));

	/* The old primary comes back: active, a replica, outside the ISR. */
	inproc_cluster_srv_up(&cl, 0);
	inproc_cluster_wait_node_state(&cl, 1, KV_NODE_ACTIVE);
	now = inproc_cluster_config(&cl);
	assert_non_null(now);
	assert_int_equal(now->ranges[0].node, 2);
	assert_int_equal(now->ranges[0].leader_epoch, le);
	assert_true(kv_range_has_replica(&now->ranges[0], 1, false));
	assert_false(kv_range_has_replica(&now->ranges[0], 1, true));
	kv_config_free(now);
}

static void
a_primary_without_another_in_sync_member_keeps_its_range(void **state)
{
	char out[8192], err[2048];
	kv_config *cfg, *now;

	(void)state;
	cfg = replicated_up(); /* ISR {1}: node 2 never caught up */
	inproc_srv_down(&cl.srv[0]);
	inproc_cluster_wait_node_state(&cl, 1, KV_NODE_DOWN);
	now = inproc_cluster_config(&cl);
	assert_non_null(now);
	assert_int_equal(now->ranges[0].node, 1);
	assert_int_equal(now->ranges[0].leader_epoch, cfg->ranges[0].leader_epoch);
	kv_config_free(now);
	kv_config_free(cfg);
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "check", NULL),
	                 3);
	assert_non_null(strstr(out, "has no live primary: node 1 is down"));
	char m[16384];
	inproc_cluster_scrape_metrics(&cl, m, sizeof(m));
	assert_non_null(strstr(m, "\nshardkv_controller_failovers_total 0\n"));
	/* remove refuses to lose the range's acknowledged writes. */
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "remove", "1", NULL), 4);
	assert_non_null(strstr(err, "holds the only copy of 1 range"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    INPROC_CLUSTER_TEST(a_stopped_primary_fails_over_to_the_in_sync_replica, &cl),
	    INPROC_CLUSTER_TEST(a_primary_without_another_in_sync_member_keeps_its_range, &cl),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
