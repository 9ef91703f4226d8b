/*
 * test_liveness_inproc.c - node liveness and server leases with a real
 * controller and real shard servers inside the test process, with short
 * leases through their create options (doc/contract.md §2, §4): a stopped
 * server is declared down within the lease and its margin and active again
 * when it comes back; a freshly started controller declares nobody down
 * before a full lease and margin; a server cut off from the controller stops
 * answering data requests after its lease and serves again once the
 * controller is back; remove refuses a live node and data loss without the
 * flag, forgets a down node with it, and the removed server learns it is
 * gone; remove counts as data loss a range moving into the node whose fence
 * was confirmed (the node may serve it already); locate and check (through the CLI's kv_cli_main)
 * report the primary and the problems with their exit codes.
 *
 * Every wait polls with a deadline; bounds on timings are generous (the
 * machine is shared) except the lower ones, which are what safety needs.
 */
#include "common/err.h"
#include "shardserver/server.h"
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
#define LEASE    INPROC_CLUSTER_LEASE_MS
#define RENEW    INPROC_CLUSTER_RENEW_MS
#define DOWN_MS  (INPROC_CLUSTER_LEASE_MS + INPROC_CLUSTER_MARGIN_MS)
#define PATIENCE INPROC_CLUSTER_PATIENCE_MS

/* The controller and NSRV servers with short leases (the defaults). */
static inproc_cluster cl = {.o = {.name = "kvlive"}};

/* Waits until both servers are active, own ranges and nothing moves. */
static void
wait_settled(void)
{
	uint64_t t0 = kv_test_now_ms();

	for (;;) {
		kv_config *cfg = inproc_cluster_config(&cl);
		bool ok = cfg && cfg->nmigs == 0 && cfg->nnodes == NSRV && cfg->nranges >= 2;
		for (size_t i = 0; ok && i < cfg->nnodes; i++)
			ok = cfg->nodes[i].state == KV_NODE_ACTIVE;
		kv_config_free(cfg);
		if (ok)
			return;
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the cluster never settled");
		kv_test_sleep_ms(20);
	}
}

/* Starts both servers (the first owns everything, the second takes half). */
static void
cluster_up(void)
{
	inproc_cluster_srv_up(&cl, 0);
	srv_wait_ready(cl.srv[0].url, 1, PATIENCE, NULL);
	inproc_cluster_srv_up(&cl, 1);
	wait_settled();
	srv_wait_ready(cl.srv[1].url, 1, PATIENCE, NULL);
}

/* A key node id owns (the two nodes split the key space somewhere). */
static const char *
key_on(uint32_t id)
{
	static const char *const keys[] = {"!", "A", "O", "a", "zz", "~~"};
	kv_config *cfg = inproc_cluster_config(&cl);

	assert_non_null(cfg);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (kv_config_route(cfg, keys[i], strlen(keys[i])) == id) {
			kv_config_free(cfg);
			return keys[i];
		}
	fail_msg("node %u owns none of the probe keys", id);
	return NULL;
}

/* One get at url: the wire status of the request or of its op, and the
 * request's error message into why. */
static int
get_status(const char *url, const char *key, char *why, size_t whylen)
{
	Shardkv__GetOp g = SHARDKV__GET_OP__INIT;
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__Op *ops[1] = {&op};
	Shardkv__Request rq = SHARDKV__REQUEST__INIT;
	Shardkv__Response *r;
	int st;

	g.key = bd(key);
	op.op_case = SHARDKV__OP__OP_GET;
	op.get = &g;
	rq.n_ops = 1;
	rq.ops = ops;
	rq.epoch = 1;
	why[0] = 0;
	if ((r = call(url, &rq)) == NULL)
		return -1;
	st = r->status ? (int)r->status : r->n_results == 1 ? (int)r->results[0]->status : -2;
	snprintf(why, whylen, "%s", r->error ? r->error : "");
	shardkv__response__free_unpacked(r, NULL);
	return st;
}

/* Puts k = v at url, retrying until the server serves (a loaded machine
 * may delay its first lease renewals). */
static void
put_ok(const char *url, const char *k, const char *v)
{
	uint64_t t0 = kv_test_now_ms();

	while (do_put(url, k, v, 0, 0).status != 0) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("%s never served", url);
		kv_test_sleep_ms(10);
	}
}

static void
stopped_server_is_declared_down_after_the_lease_and_active_again_when_it_returns(void **state)
{
	char why[200];
	uint64_t t0, took;

	(void)state;
	cluster_up();
	const char *k2 = key_on(2);
	put_ok(cl.srv[1].url, k2, "v");
	t0 = kv_test_now_ms();
	inproc_srv_down(&cl.srv[1]); /* no leave: the node keeps its ranges */
	inproc_cluster_wait_node_state(&cl, 2, KV_NODE_DOWN);
	took = kv_test_now_ms() - t0;
	/* Never before the lease and margin since its last renewal (at most
	 * one renewal period before the stop). */
	assert_true(took + RENEW >= DOWN_MS);
	assert_int_equal(inproc_cluster_node_state(&cl, 1), KV_NODE_ACTIVE);
	/* Its ranges stayed its own while it was down. */
	kv_config *cfg = inproc_cluster_config(&cl);
	assert_non_null(cfg);
	assert_int_equal(kv_config_route(cfg, k2, strlen(k2)), 2);
	kv_config_free(cfg);
	/* The metrics count it. */
	char m[16384];
	inproc_cluster_scrape_metrics(&cl, m, sizeof(m));
	assert_non_null(strstr(m, "\nshardkv_controller_nodes{state=\"down\"} 1\n"));
	assert_non_null(strstr(m, "\nshardkv_controller_nodes{state=\"active\"} 1\n"));
	assert_non_null(strstr(m, "\nshardkv_controller_nodes_declared_down_total 1\n"));
	assert_non_null(strstr(m, "\nshardkv_controller_node_heartbeat_age_seconds{node=\"2\"} "));
	assert_non_null(strstr(m, "\nshardkv_controller_node_heartbeat_age_seconds{node=\"1\"} "));

	inproc_cluster_srv_up(&cl, 1); /* the same data dir: the same node */
	inproc_cluster_wait_node_state(&cl, 2, KV_NODE_ACTIVE);
	t0 = kv_test_now_ms();
	while (get_status(cl.srv[1].url, k2, why, sizeof(why)) != 0) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the returned server never served: %s", why);
		kv_test_sleep_ms(20);
	}
}

static void
fresh_controller_declares_nobody_down_before_a_full_lease_and_margin(void **state)
{
	uint64_t t0, took;

	(void)state;
	cluster_up();
	inproc_cluster_ctl_down(&cl);
	inproc_srv_down(&cl.srv[1]);
	t0 = kv_test_now_ms();
	inproc_cluster_ctl_up(&cl);
	assert_int_equal(inproc_cluster_node_state(&cl, 2), KV_NODE_ACTIVE);
	inproc_cluster_wait_node_state(&cl, 2, KV_NODE_DOWN);
	took = kv_test_now_ms() - t0;
	assert_true(took >= DOWN_MS);
	/* The live one was never declared down. */
	assert_int_equal(inproc_cluster_node_state(&cl, 1), KV_NODE_ACTIVE);
}

static void
server_cut_off_from_the_controller_stops_serving_after_its_lease_until_it_returns(void **state)
{
	char why[200];
	uint64_t t0, took;
	int st;

	(void)state;
	inproc_cluster_srv_up(&cl, 0);
	srv_wait_ready(cl.srv[0].url, 1, PATIENCE, NULL);
	put_ok(cl.srv[0].url, "k", "v");
	t0 = kv_test_now_ms();
	inproc_cluster_ctl_down(&cl);
	while ((st = get_status(cl.srv[0].url, "k", why, sizeof(why))) == 0) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the server kept serving without the controller");
		kv_test_sleep_ms(10);
	}
	took = kv_test_now_ms() - t0;
	assert_int_equal(st, SHARDKV__STATUS__STATUS_UNAVAILABLE);
	assert_non_null(strstr(why, "lease expired: controller unreachable for"));
	/* Not before a lease has passed since the last renewal (sent at most a
	 * renewal period, plus its round trip, before the controller stopped). */
	assert_true(took + 2 * RENEW >= LEASE);
	/* Writes too. */
	assert_int_equal(do_put(cl.srv[0].url, "k", "w", 0, 0).status,
	                 SHARDKV__STATUS__STATUS_UNAVAILABLE);

	inproc_cluster_ctl_up(&cl);
	t0 = kv_test_now_ms();
	while ((st = get_status(cl.srv[0].url, "k", why, sizeof(why))) != 0) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the server never served again: %d %s", st, why);
		kv_test_sleep_ms(20);
	}
	assert_int_equal(inproc_cluster_node_state(&cl, 1), KV_NODE_ACTIVE);
}

static void
remove_refuses_live_nodes_and_data_loss_and_forgets_a_down_node_with_the_flag(void **state)
{
	char out[2048], err[2048], why[200];
	uint64_t t0;

	(void)state;
	cluster_up();
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "remove", "2", NULL), 4);
	assert_non_null(strstr(err, "node 2 is active: use leave"));

	inproc_srv_down(&cl.srv[1]);
	inproc_cluster_wait_node_state(&cl, 2, KV_NODE_DOWN);
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "remove", "2", NULL), 4);
	assert_non_null(strstr(err, "holds the only copy of 1 range"));
	assert_int_equal(inproc_cluster_node_state(&cl, 2), KV_NODE_DOWN);

	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "remove", "2",
	                                    "--accept-data-loss", "--json", NULL),
	                 0);
	assert_non_null(strstr(out, "\"removed\": 2, \"ranges_lost\": 1}"));
	kv_config *cfg = inproc_cluster_config(&cl);
	assert_non_null(cfg);
	assert_int_equal(kv_config_node(cfg, 2)->state, KV_NODE_GONE);
	for (size_t i = 0; i < cfg->nranges; i++)
		assert_int_equal(cfg->ranges[i].node, 1);
	kv_config_free(cfg);

	/* The removed server comes back on its data dir: it learns it is gone
	 * and answers no data request. */
	inproc_cluster_srv_up(&cl, 1);
	t0 = kv_test_now_ms();
	while (!kv_server_gone(cl.srv[1].s, why, sizeof(why))) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the removed server never learnt it is gone");
		kv_test_sleep_ms(10);
	}
	assert_non_null(strstr(why, "gone"));
	assert_int_equal(get_status(cl.srv[1].url, "!", why, sizeof(why)),
	                 SHARDKV__STATUS__STATUS_UNAVAILABLE);
	assert_int_equal(inproc_cluster_node_state(&cl, 2), KV_NODE_GONE);
}

/* Puts 2 MB into the first range node 1 leads and starts its move to node 2
 * at 1 MB/s (still in flight for the test's next steps); returns the
 * migration's id. */
static uint64_t
slow_move_to_node_2(void)
{
	char why[256], k[40], v[1100];
	kv_admin_req q;
	kv_config *cfg = inproc_cluster_config(&cl);
	const kv_range *r = NULL;
	uint64_t mig;

	assert_non_null(cfg);
	for (size_t i = 0; i < cfg->nranges && r == NULL; i++)
		if (cfg->ranges[i].node == 1)
			r = &cfg->ranges[i];
	assert_non_null(r);
	memset(v, 'v', 1000);
	v[1000] = '\0';
	for (int i = 0; i < 2000; i++) {
		int n = snprintf(k, sizeof(k), "%.*s\x01%05d", (int)r->start.len,
		                 (const char *)r->start.data, i);
		assert_true(n > 0 && (size_t)n < sizeof(k));
		put_ok(cl.srv[0].url, k, v);
	}
	q = (kv_admin_req){.op = KV_ADM_MOVE,
	                   .node_id = 2,
	                   .start = {r->start.data, r->start.len},
	                   .end = {r->end.data, r->end.len},
	                   .rate_mb_s = 1};
	assert_int_equal(inproc_cluster_admin(&cl, &q, NULL, NULL, why, sizeof(why)), 0);
	kv_config_free(cfg);
	cfg = inproc_cluster_config(&cl);
	assert_non_null(cfg);
	assert_int_equal(cfg->nmigs, 1);
	mig = cfg->migs[0].id;
	kv_config_free(cfg);
	return mig;
}

/* A migration into node 2 that its source reported fenced: node 2 may have
 * committed the range and taken writes, so removing node 2 (down) needs the
 * flag, and then counts that range among the lost. */
static void
remove_of_a_node_receiving_a_fenced_range_needs_the_flag(void **state)
{
	char out[2048], err[2048], why[256];
	kv_admin_req q;
	kv_config *cfg;

	(void)state;
	cluster_up();
	/* Node 2's own range goes to node 1 first: node 2 then leads nothing. */
	cfg = inproc_cluster_config(&cl);
	assert_non_null(cfg);
	for (size_t i = 0; i < cfg->nranges; i++) {
		if (cfg->ranges[i].node != 2)
			continue;
		q = (kv_admin_req){.op = KV_ADM_MOVE,
		                   .node_id = 1,
		                   .wait = true,
		                   .start = {cfg->ranges[i].start.data, cfg->ranges[i].start.len},
		                   .end = {cfg->ranges[i].end.data, cfg->ranges[i].end.len}};
		assert_int_equal(inproc_cluster_admin(&cl, &q, NULL, NULL, why, sizeof(why)), 0);
	}
	kv_config_free(cfg);
	cfg = inproc_cluster_config(&cl);
	assert_non_null(cfg);
	for (size_t i = 0; i < cfg->nranges; i++)
		assert_int_equal(cfg->ranges[i].node, 1);
	kv_config_free(cfg);
	uint64_t mig = slow_move_to_node_2();
	inproc_srv_down(&cl.srv[1]);
	/* The source says the destination acknowledged the fence. */
	q = (kv_admin_req){
	    .op = KV_ADM_PROGRESS, .node_id = 1, .mig_id = mig, .phase = KV_MIG_FENCED};
	assert_int_equal(inproc_cluster_admin(&cl, &q, NULL, NULL, why, sizeof(why)), 0);
	inproc_cluster_wait_node_state(&cl, 2, KV_NODE_DOWN);
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "remove", "2", NULL), 4);
	if (strstr(err, "may already serve a range it was receiving") == NULL)
		fail_msg("remove answered: %s", err);
	assert_int_equal(inproc_cluster_node_state(&cl, 2), KV_NODE_DOWN);
	/* A later report of an earlier phase (a restarted source copying
	 * again) does not make the range safe to give back. */
	q.phase = KV_MIG_COPYING;
	assert_int_equal(inproc_cluster_admin(&cl, &q, NULL, NULL, why, sizeof(why)), 0);
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "remove", "2", NULL), 4);
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "remove", "2",
	                                    "--accept-data-loss", "--json", NULL),
	                 0);
	/* The range it was receiving. */
	if (strstr(out, "\"removed\": 2, \"ranges_lost\": 1}") == NULL)
		fail_msg("remove --accept-data-loss answered: %s", out);
	cfg = inproc_cluster_config(&cl);
	assert_non_null(cfg);
	assert_int_equal(cfg->nmigs, 0);
	kv_config_free(cfg);
}

/* A restarted standalone controller lost what the sources reported:
 * a migration in flight when it started may be fenced already, so it
 * refuses to cancel the migration, or to remove its destination without
 * --accept-data-loss, until the source reports again. */
static void
restarted_controller_waits_for_the_source_before_cancelling_a_migration(void **state)
{
	char why[256];
	kv_admin_req q;
	kv_config *cfg;

	(void)state;
	cluster_up();
	uint64_t mig = slow_move_to_node_2();
	/* The source stops (it reports nothing more) and the controller
	 * restarts. */
	inproc_srv_down(&cl.srv[0]);
	inproc_cluster_ctl_down(&cl);
	inproc_cluster_ctl_up(&cl);
	q = (kv_admin_req){.op = KV_ADM_CANCEL, .mig_id = mig};
	assert_int_equal(inproc_cluster_admin(&cl, &q, NULL, NULL, why, sizeof(why)), KV_EBUSY);
	if (strstr(why, "has not reported its progress") == NULL)
		fail_msg("cancel answered: %s", why);
	q = (kv_admin_req){.op = KV_ADM_REMOVE, .node_id = 2};
	int rv = inproc_cluster_admin(&cl, &q, NULL, NULL, why, sizeof(why));
	/* Node 2 is not down yet (a fresh controller declares nobody down
	 * for a full lease and margin): refused either way, never removed. */
	assert_true(rv == KV_EBUSY || rv == KV_EPERM || rv == KV_EINVAL);
	cfg = inproc_cluster_config(&cl);
	assert_non_null(cfg);
	assert_int_equal(cfg->nmigs, 1);
	assert_int_equal(cfg->nnodes, NSRV);
	kv_config_free(cfg);
	/* The source reports copying: the migration can be cancelled. */
	q = (kv_admin_req){
	    .op = KV_ADM_PROGRESS, .node_id = 1, .mig_id = mig, .phase = KV_MIG_COPYING};
	assert_int_equal(inproc_cluster_admin(&cl, &q, NULL, NULL, why, sizeof(why)), 0);
	q = (kv_admin_req){.op = KV_ADM_CANCEL, .mig_id = mig};
	assert_int_equal(inproc_cluster_admin(&cl, &q, NULL, NULL, why, sizeof(why)), 0);
	cfg = inproc_cluster_config(&cl);
	assert_non_null(cfg);
	assert_int_equal(cfg->nmigs, 0);
	kv_config_free(cfg);
}

static void
locate_and_check_report_the_primary_and_the_problems(void **state)
{
	char out[4096], err[2048];

	(void)state;
	cluster_up();
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "check", NULL),
	                 0);
	assert_non_null(strstr(out, "every range has a live primary"));
	const char *k1 = key_on(1), *k2 = key_on(2);
	char key2[16], key1[16];
	snprintf(key1, sizeof(key1), "%s", k1);
	snprintf(key2, sizeof(key2), "%s", k2);
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "locate", key2,
	                                    "--json", NULL),
	                 0);
	assert_non_null(strstr(out, "\"key\": \""));
	assert_non_null(strstr(out, "\"node\": 2, \"address\": \""));
	assert_non_null(strstr(out, cl.srv[1].url));
	assert_non_null(strstr(out, "\"replicas\": [2]"));
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "locate", key1, NULL), 0);
	assert_non_null(strstr(out, "primary: node 1 "));

	inproc_srv_down(&cl.srv[1]);
	inproc_cluster_wait_node_state(&cl, 2, KV_NODE_DOWN);
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "check", NULL),
	                 3);
	assert_non_null(strstr(out, "node 2 ("));
	assert_non_null(strstr(out, ") is down: no heartbeat for"));
	assert_non_null(strstr(out, "has no live primary: node 2 is down"));
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "check", "--json", NULL),
	    3);
	assert_non_null(strstr(out, "\"kind\": \"node_down\", \"node\": 2"));
	assert_non_null(strstr(out, "\"ok\": false"));
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "status", "--json", NULL),
	    0);
	assert_non_null(strstr(out, "\"state\": \"down\""));
	assert_non_null(strstr(out, "\"last_seen_ms\": "));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    INPROC_CLUSTER_TEST(
	        stopped_server_is_declared_down_after_the_lease_and_active_again_when_it_returns,
	        &cl),
	    INPROC_CLUSTER_TEST(
	        fresh_controller_declares_nobody_down_before_a_full_lease_and_margin, &cl),
	    INPROC_CLUSTER_TEST(
	        server_cut_off_from_the_controller_stops_serving_after_its_lease_until_it_returns,
	        &cl),
	    INPROC_CLUSTER_TEST(
	        remove_refuses_live_nodes_and_data_loss_and_forgets_a_down_node_with_the_flag, &cl),
	    INPROC_CLUSTER_TEST(remove_of_a_node_receiving_a_fenced_range_needs_the_flag, &cl),
	    INPROC_CLUSTER_TEST(locate_and_check_report_the_primary_and_the_problems, &cl),
	    INPROC_CLUSTER_TEST(
	        restarted_controller_waits_for_the_source_before_cancelling_a_migration, &cl),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
