/*
 * test_repair_inproc.c - the controller's repairs with replicas
 * (doc/replication.md, "Repair" and "Primary transfer"), with a real
 * controller (--replicas 2, --down-after 1, short leases through its create
 * options) and three real shard servers in the test process. The servers
 * do not copy ranges to a new replica yet: the test plays the primary and
 * sends the IsrChange{add} it would send once the copy has caught up.
 *
 * - a node down for longer than --down-after gets a replacement outside the
 *   ISR in every replica set, stays down, and leaves the replica set when
 *   its replacement joins the ISR;
 * - `leave --wait` of a backup answers once its replacement is in the ISR
 *   and the node is gone;
 * - `leave` of a primary moves the primary role to the in-sync backup with
 *   the old primary kept in the ISR; the old primary answers WRONG_OWNER
 *   naming the new one, and is gone once the replacement is in sync;
 * - `move` gives the primary role to an in-sync backup at once, or to a new
 *   node through a replacement of the primary, which leaves once the new
 *   node leads.
 *
 * Every wait polls with a deadline.
 */
#include "common/err.h"
#include "tests/support/inproc_cluster.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define NSRV       3
#define PATIENCE   INPROC_CLUSTER_PATIENCE_MS
#define DOWN_AFTER 1u /* seconds */

static inproc_cluster cl = {
    .o = {.name = "kvrepair", .nsrv = NSRV, .replicas = 2, .down_after_s = DOWN_AFTER}};

/* Polls the configuration until pred holds (failing after the patience
 * with `what`); returns it (the caller frees it). */
static kv_config *
wait_config(bool (*pred)(const kv_config *, const void *), const void *arg, const char *what)
{
	uint64_t t0 = kv_test_now_ms();

	for (;;) {
		kv_config *cfg = inproc_cluster_config(&cl);
		if (cfg != NULL && pred(cfg, arg))
			return cfg;
		kv_config_free(cfg);
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("timed out waiting for %s", what);
		kv_test_sleep_ms(10);
	}
}

static bool
is_replicated_pair(const kv_config *c, const void *arg)
{
	(void)arg;
	return c->nnodes == NSRV && c->nranges == 1 && kv_range_nreplicas(&c->ranges[0]) == 2;
}

/* The primary of every range asks the controller to add node to its ISR
 * (what a server sends once a new replica has caught up). */
static void
isr_add(uint32_t node)
{
	kv_config *cfg = inproc_cluster_config(&cl);
	char why[300];

	assert_non_null(cfg);
	for (size_t i = 0; i < cfg->nranges; i++) {
		const kv_range *r = &cfg->ranges[i];
		kv_admin_req q = {.op = KV_ADM_ISR_CHANGE,
		                  .request_id = 100 + i,
		                  .node_id = r->node,
		                  .start = {r->start.data, r->start.len},
		                  .end = {r->end.data, r->end.len},
		                  .leader_epoch = r->leader_epoch,
		                  .add_node = node};
		if (!kv_range_has_replica(r, node, false) || kv_range_has_replica(r, node, true))
			continue;
		if (inproc_cluster_admin(&cl, &q, NULL, NULL, why, sizeof(why)) != KV_OK)
			fail_msg("IsrChange{add %u} refused: %s", node, why);
	}
	kv_config_free(cfg);
}

/* Three servers; node 1 leads the one range with node 2 in its ISR, node
 * 3 holds nothing. */
static void
three_up(void)
{
	kv_config *cfg;

	inproc_cluster_srv_up(&cl, 0);
	srv_wait_ready(cl.srv[0].url, 1, PATIENCE, NULL);
	inproc_cluster_srv_up(&cl, 1); /* registered before the third: node 2 */
	srv_wait_ready(cl.srv[1].url, 2, PATIENCE, NULL);
	inproc_cluster_srv_up(&cl, 2);
	cfg = wait_config(is_replicated_pair, NULL, "two replicas of the range");
	assert_int_equal(cfg->ranges[0].node, 1);
	assert_int_equal(kv_range_replica(&cfg->ranges[0], 1), 2);
	kv_config_free(cfg);
	isr_add(2);
	cfg = inproc_cluster_config(&cl);
	assert_non_null(cfg);
	assert_int_equal(kv_range_ninsync(&cfg->ranges[0]), 2);
	for (size_t i = 0; i < cfg->nnodes; i++)
		assert_int_equal(cfg->nodes[i].state, KV_NODE_ACTIVE);
	kv_config_free(cfg);
}

static bool
has_replacement(const kv_config *c, const void *arg)
{
	const uint32_t *p = arg; /* {new, old} */
	for (size_t i = 0; i < c->nranges; i++)
		if (kv_range_replacement(&c->ranges[i], p[0], true) != p[1])
			return false;
	return c->nranges > 0;
}

static bool
node_in_no_replica_set(const kv_config *c, const void *arg)
{
	uint32_t node = *(const uint32_t *)arg;
	for (size_t i = 0; i < c->nranges; i++)
		if (kv_range_has_replica(&c->ranges[i], node, false))
			return false;
	return true;
}

static void
a_node_down_past_down_after_is_replaced_and_stays_down(void **state)
{
	static const uint32_t pair[2] = {3, 2};
	uint32_t two = 2;
	char out[4096], err[2048], m[16384], why[300];
	uint64_t t_stop, took;
	kv_config *cfg;

	(void)state;
	three_up();
	t_stop = kv_test_now_ms();
	inproc_srv_down(&cl.srv[1]);
	inproc_cluster_wait_node_state(&cl, 2, KV_NODE_DOWN);
	cfg = inproc_cluster_config(&cl);
	assert_false(kv_range_has_replica(&cfg->ranges[0], 3, false)); /* not yet */
	kv_config_free(cfg);

	cfg = wait_config(has_replacement, pair, "node 3 to replace node 2");
	took = kv_test_now_ms() - t_stop;
	/* Never before --down-after. Counted from the stop, not from when this
	 * test saw the node down (which a loaded machine can delay): the node
	 * is declared down a lease and margin after its last heartbeat, at
	 * most a renewal period before the stop, and replaced --down-after
	 * later, so at least --down-after after the stop. */
	assert_true(took >= DOWN_AFTER * 1000u);
	assert_int_equal(cfg->ranges[0].node, 1);
	assert_true(kv_range_has_replica(&cfg->ranges[0], 2, false));
	assert_false(kv_range_has_replica(&cfg->ranges[0], 3, true)); /* outside the ISR */
	assert_int_equal(kv_config_node(cfg, 2)->state, KV_NODE_DOWN);
	kv_config_free(cfg);
	/* Under-replicated until it is in sync. */
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "check", NULL),
	                 3);

	/* The primary adds it to the ISR: node 2 leaves the replica set in the
	 * same configuration, and stays down. */
	isr_add(3);
	cfg = inproc_cluster_config(&cl);
	assert_non_null(cfg);
	assert_true(node_in_no_replica_set(cfg, &two));
	assert_int_equal(kv_range_nreplicas(&cfg->ranges[0]), 2);
	assert_int_equal(kv_range_ninsync(&cfg->ranges[0]), 2);
	assert_int_equal(cfg->ranges[0].nreplacing, 0);
	assert_int_equal(kv_config_node(cfg, 2)->state, KV_NODE_DOWN);
	kv_config_free(cfg);
	inproc_cluster_scrape_metrics(&cl, m, sizeof(m));
	assert_non_null(strstr(m, "\nshardkv_controller_replacements_total 1\n"));

	/* remove forgets it, with nothing lost. */
	kv_admin_req q = {.op = KV_ADM_REMOVE, .request_id = 9, .node_id = 2};
	assert_int_equal(inproc_cluster_admin(&cl, &q, NULL, NULL, why, sizeof(why)), KV_OK);
	assert_int_equal(inproc_cluster_node_state(&cl, 2), KV_NODE_GONE);
}

struct leave_run {
	uint32_t node;
	int rc;
	char out[4096], err[2048];
};

static void *
leave_wait_main(void *arg)
{
	struct leave_run *l = arg;
	char id[16];

	snprintf(id, sizeof(id), "%u", l->node);
	l->rc = inproc_cluster_cli(&cl, l->out, sizeof(l->out), l->err, sizeof(l->err), "leave", id,
	                           "--wait", NULL);
	return NULL;
}

static void
leave_wait_of_a_backup_ends_once_its_replacement_is_in_sync(void **state)
{
	static const uint32_t pair[2] = {3, 2};
	static struct leave_run l = {.node = 2};
	uint32_t two = 2;
	pthread_t th;
	kv_config *cfg;

	(void)state;
	three_up();
	l.rc = -1;
	assert_int_equal(pthread_create(&th, NULL, leave_wait_main, &l), 0);
	cfg = wait_config(has_replacement, pair, "node 3 to replace leaving node 2");
	assert_int_equal(kv_config_node(cfg, 2)->state, KV_NODE_DRAINING);
	assert_int_equal(cfg->ranges[0].node, 1); /* a backup leaves: no transfer */
	assert_true(kv_range_has_replica(&cfg->ranges[0], 2, true));
	assert_int_equal(cfg->nmigs, 0);
	kv_config_free(cfg);

	isr_add(3);
	assert_int_equal(pthread_join(th, NULL), 0);
	if (l.rc != 0)
		fail_msg("leave --wait exited %d: %s%s", l.rc, l.out, l.err);
	cfg = inproc_cluster_config(&cl);
	assert_non_null(cfg);
	assert_int_equal(kv_config_node(cfg, 2)->state, KV_NODE_GONE);
	assert_true(node_in_no_replica_set(cfg, &two));
	assert_int_equal(kv_range_ninsync(&cfg->ranges[0]), 2);
	kv_config_free(cfg);
}

static void
leave_of_the_primary_moves_its_role_behind_the_isr_fence(void **state)
{
	static const uint32_t pair[2] = {3, 1};
	uint32_t one = 1;
	char why[300];
	uint64_t epoch = 0;
	kv_config *cfg;
	res1 r;

	(void)state;
	three_up();
	kv_admin_req q = {.op = KV_ADM_LEAVE, .request_id = 5, .node_id = 1};
	assert_int_equal(inproc_cluster_admin(&cl, &q, &cfg, &epoch, why, sizeof(why)), KV_OK);
	kv_config_free(cfg);
	cfg = inproc_cluster_config(&cl);
	assert_non_null(cfg);
	assert_int_equal(cfg->epoch, epoch);
	assert_int_equal(cfg->ranges[0].node, 2);
	assert_int_equal(cfg->ranges[0].leader_epoch, epoch);
	/* The old primary stays in the ISR: the new one acknowledges nothing
	 * it has not applied. */
	assert_true(kv_range_has_replica(&cfg->ranges[0], 1, true));
	assert_true(has_replacement(cfg, pair));
	assert_int_equal(kv_config_node(cfg, 1)->state, KV_NODE_DRAINING);
	kv_config_free(cfg);

	/* The old primary stops serving the range and names the new one. */
	uint64_t t0 = kv_test_now_ms();
	for (;;) {
		r = do_get(cl.srv[0].url, "k");
		if (r.status == SHARDKV__STATUS__STATUS_WRONG_OWNER)
			break;
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the old primary still answers %d", r.status);
		kv_test_sleep_ms(10);
	}
	assert_int_equal(r.hint_node, 2);

	isr_add(3);
	cfg = wait_config(node_in_no_replica_set, &one, "node 1 to leave the replica set");
	assert_int_equal(cfg->ranges[0].node, 2);
	assert_int_equal(kv_range_ninsync(&cfg->ranges[0]), 2);
	assert_true(kv_range_has_replica(&cfg->ranges[0], 3, true));
	kv_config_free(cfg);
	inproc_cluster_wait_node_state(&cl, 1, KV_NODE_GONE);
}

static bool
led_by_3_without_2(const kv_config *c, const void *arg)
{
	(void)arg;
	return c->nranges == 1 && c->ranges[0].node == 3 &&
	       !kv_range_has_replica(&c->ranges[0], 2, false);
}

/* ... and node 1 in its ISR: the servers reconcile each change of primary
 * (a backup that may differ leaves the ISR, is copied again and rejoins),
 * so node 1 can be out of the ISR for a moment. */
static bool
led_by_3_without_2_with_1_in_sync(const kv_config *c, const void *arg)
{
	return led_by_3_without_2(c, arg) && kv_range_has_replica(&c->ranges[0], 1, true);
}

/* Waits until server i answers WRONG_OWNER for key k naming node hint. */
static void
wait_wrong_owner(int i, const char *k, uint32_t hint)
{
	uint64_t t0 = kv_test_now_ms();
	res1 r;

	for (;;) {
		r = do_get(cl.srv[i].url, k);
		if (r.status == SHARDKV__STATUS__STATUS_WRONG_OWNER && r.hint_node == hint)
			return;
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("server %d still answers %d (hint %u)", i, r.status, r.hint_node);
		kv_test_sleep_ms(10);
	}
}

static void
move_gives_the_primary_role_to_the_in_sync_backup_or_through_a_replacement(void **state)
{
	char why[300];
	uint64_t epoch = 0;
	kv_config *cfg;

	(void)state;
	three_up();
	/* To the in-sync backup: at once, the old primary kept in the ISR. */
	kv_admin_req q = {.op = KV_ADM_MOVE, .request_id = 6, .node_id = 2};
	assert_int_equal(inproc_cluster_admin(&cl, &q, NULL, &epoch, why, sizeof(why)), KV_OK);
	cfg = inproc_cluster_config(&cl);
	assert_non_null(cfg);
	assert_int_equal(cfg->nranges, 1);
	assert_int_equal(cfg->ranges[0].node, 2);
	assert_int_equal(cfg->ranges[0].leader_epoch, epoch);
	assert_true(kv_range_has_replica(&cfg->ranges[0], 1, true));
	assert_int_equal(cfg->nmigs, 0);
	kv_config_free(cfg);
	wait_wrong_owner(0, "k", 2);

	/* To a node outside the replica set: it replaces the primary, takes
	 * the role once in sync, and the old primary leaves. */
	q.request_id = 7;
	q.node_id = 3;
	/* The transfer above copies node 1 again (doc/replication.md "Primary
	 * transfer"): until it is back in sync the range is being repaired and
	 * a move is refused busy, at once. */
	int rv;
	uint64_t t0 = kv_test_now_ms();
	while ((rv = inproc_cluster_admin(&cl, &q, NULL, NULL, why, sizeof(why))) == KV_EBUSY &&
	       kv_test_now_ms() - t0 < PATIENCE) {
		kv_test_sleep_ms(20);
		q.request_id++;
	}
	assert_int_equal(rv, KV_OK);
	cfg = inproc_cluster_config(&cl);
	assert_non_null(cfg);
	assert_int_equal(cfg->ranges[0].node, 2);
	assert_int_equal(kv_range_replacement(&cfg->ranges[0], 3, true), 2);
	kv_config_free(cfg);
	isr_add(3);
	cfg = wait_config(led_by_3_without_2_with_1_in_sync, NULL,
	                  "node 3 to lead without node 2, node 1 in sync");
	assert_true(kv_range_has_replica(&cfg->ranges[0], 3, true));
	assert_int_equal(kv_config_node(cfg, 2)->state, KV_NODE_ACTIVE);
	kv_config_free(cfg);
	wait_wrong_owner(1, "k", 3);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    INPROC_CLUSTER_TEST(a_node_down_past_down_after_is_replaced_and_stays_down, &cl),
	    INPROC_CLUSTER_TEST(leave_wait_of_a_backup_ends_once_its_replacement_is_in_sync, &cl),
	    INPROC_CLUSTER_TEST(leave_of_the_primary_moves_its_role_behind_the_isr_fence, &cl),
	    INPROC_CLUSTER_TEST(
	        move_gives_the_primary_role_to_the_in_sync_backup_or_through_a_replacement, &cl),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
