/*
 * test_cluster_admin.c - the admin rules of doc/contract.md §4 against real daemons: a
 * join rebalances so that the newcomer takes a share of the data, and every
 * bad request (duplicate join, leave of an unknown node, empty or inverted
 * move, move to an unknown or inactive node) fails with its own error and
 * changes nothing: the configuration epoch and range map stay as they were.
 *
 * Each test starts its own controller and servers (cluster_util.h) and
 * stops them in its teardown.
 */
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static kv_tc tc;

/* One copy per range: a join then moves data to the newcomer by migration
 * (with replicas it becomes a replica instead and nothing migrates). */
static int
setup1_one_copy(void **state)
{
	(void)state;
	return kv_tc_start_one_copy(&tc, "cluster-admin", 1);
}

static int
setup2(void **state)
{
	(void)state;
	return kv_tc_start(&tc, "cluster-admin", 2);
}

static int
teardown(void **state)
{
	(void)state;
	kv_tc_destroy(&tc);
	return 0;
}

/* Fails unless the latest configuration equals `before` (epoch, nodes and
 * range map). */
static void
assert_config_unchanged(const shardkv_config *before, const char *after_what)
{
	shardkv_config *now = kv_tc_config(&tc);

	KV_TC_ASSERT(&tc, now != NULL, "config after %s: unavailable", after_what);
	KV_TC_ASSERT(&tc, now->epoch == before->epoch, "%s changed the epoch from %llu to %llu",
	             after_what, (unsigned long long)before->epoch, (unsigned long long)now->epoch);
	assert_int_equal(now->nnodes, before->nnodes);
	for (size_t i = 0; i < now->nnodes; i++) {
		assert_int_equal(now->nodes[i].id, before->nodes[i].id);
		assert_int_equal(now->nodes[i].state, before->nodes[i].state);
		assert_string_equal(now->nodes[i].address, before->nodes[i].address);
	}
	assert_int_equal(now->nranges, before->nranges);
	for (size_t i = 0; i < now->nranges; i++) {
		assert_int_equal(now->ranges[i].node, before->ranges[i].node);
		assert_int_equal(now->ranges[i].start.len, before->ranges[i].start.len);
		assert_int_equal(now->ranges[i].end.len, before->ranges[i].end.len);
		assert_memory_equal(now->ranges[i].start.data, before->ranges[i].start.data,
		                    before->ranges[i].start.len);
		assert_memory_equal(now->ranges[i].end.data, before->ranges[i].end.data,
		                    before->ranges[i].end.len);
	}
	shardkv_config_free(now);
}

/* Fails when a migration of [first, first + n) is still in the config. */
static void
assert_migrations_finished(const shardkv_config *cfg, const shardkv_admin_result *ar)
{
	for (size_t i = 0; i < cfg->nmigrations; i++)
		KV_TC_ASSERT(&tc,
		             cfg->migrations[i].id < ar->first_mig_id ||
		                 cfg->migrations[i].id >= ar->first_mig_id + ar->nmigrations,
		             "migration %llu of epoch %llu is still in flight after --wait",
		             (unsigned long long)cfg->migrations[i].id,
		             (unsigned long long)ar->epoch);
}

/*
 * Waits until every node in `status` has sent two more heartbeats (its
 * last_seen_ms fell twice), so that the controller plans the next join on
 * the figures the servers counted on their current ranges rather than on
 * its estimates of a range just moved. A join 5 ms after the previous
 * join's migration ended gave the third node 275 of 3000 keys in two
 * fresh-clone CI runs (it cut only the other node's range).
 */
static void
wait_heartbeats(void)
{
	uint64_t prev[KV_TC_MAX_SERVERS + 2] = {0}, t0 = kv_test_now_ms();
	int seen[KV_TC_MAX_SERVERS + 2] = {0};

	for (bool first = true;; first = false) {
		shardkv_config *st = NULL;
		bool all = true;
		if (shardkv_status(tc.admin, &st) == 0) {
			for (size_t k = 0; k < st->nnodes; k++) {
				const shardkv_node *n = &st->nodes[k];
				if (n->id >= KV_TC_MAX_SERVERS + 2 ||
				    n->state != SHARDKV_NODE_ACTIVE)
					continue;
				if (!first && n->last_seen_ms < prev[n->id])
					seen[n->id]++;
				prev[n->id] = n->last_seen_ms;
				all = all && seen[n->id] >= 2;
			}
			shardkv_config_free(st);
		} else {
			all = false;
		}
		if (all && !first)
			return;
		KV_TC_ASSERT(&tc, kv_test_now_ms() - t0 < KV_TC_READY_MS,
		             "no two heartbeats from every node in %u ms", KV_TC_READY_MS);
		kv_test_sleep_ms(20);
	}
}

/*
 * Joins a new server (started without --join) with the admin command and
 * --wait, then checks that it owns a range, that every node owns some of
 * the keys and holds them (as its heartbeats say), and that every key
 * reads back. Returns the new server's index.
 */
static int
join_and_check(shardkv_client *cl, unsigned n, size_t vlen)
{
	shardkv_admin_result ar = {0};
	shardkv_config *before, *cfg;
	unsigned counts[KV_TC_MAX_SERVERS + 2];
	char msg[512];

	wait_heartbeats();
	before = kv_tc_config(&tc);
	assert_non_null(before);
	int i = kv_tc_add_server(&tc, false);
	assert_true(i >= 0);
	KV_TC_EXPECT(&tc, 0, shardkv_join(tc.admin, tc.srv[i].url, SHARDKV_WAIT, &ar));
	assert_true(ar.epoch > before->epoch);
	assert_true(ar.node_id != 0);
	KV_TC_ASSERT(&tc, ar.nmigrations > 0, "the join started no migration");
	tc.srv[i].id = ar.node_id;
	shardkv_config_free(before);

	cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	assert_migrations_finished(cfg, &ar);
	const shardkv_node *nd = kv_tc_node(cfg, ar.node_id);
	assert_non_null(nd);
	assert_int_equal(nd->state, SHARDKV_NODE_ACTIVE);
	assert_string_equal(nd->address, tc.srv[i].url);
	kv_tc_count_owners(cfg, "join/", n, counts, KV_TC_MAX_SERVERS + 2);
	for (int k = 0; k <= i; k++) {
		uint32_t id = tc.srv[k].id;
		KV_TC_ASSERT(&tc, kv_tc_nranges_of(cfg, id) > 0, "node %u owns no range", id);
		KV_TC_ASSERT(&tc, counts[id] > 0, "node %u owns none of the keys", id);
	}
	/* An even share by size is 1/(i+1); accept anything from half of it. */
	KV_TC_ASSERT(&tc, counts[ar.node_id] >= n / (2u * (unsigned)(i + 1)),
	             "the new node owns %u of %u keys, far from an even share", counts[ar.node_id],
	             n);
	shardkv_config_free(cfg);

	/* The nodes hold what the map says (their heartbeats catch up), and
	 * every key reads back. */
	KV_TC_ASSERT(
	    &tc, kv_tc_wait_status_counts(&tc, counts, KV_TC_MAX_SERVERS + 2, KV_TC_READY_MS) == 0,
	    "the nodes do not hold the keys the range map gives them");
	long bad = kv_tc_verify(cl, "join/", n, 1, vlen, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld keys wrong after the join: %s", bad, msg);
	return i;
}

static void
join_of_a_new_server_rebalances_so_it_takes_a_share(void **state)
{
	enum { N = 3000, VLEN = 100 };
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	unsigned counts[KV_TC_MAX_SERVERS + 2] = {0};
	char msg[512];
	(void)state;

	assert_non_null(cl);
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(cl, "join/", N, 1, VLEN, msg, sizeof(msg)));
	/* The controller balances by the sizes the heartbeats report. */
	counts[tc.srv[0].id] = N;
	KV_TC_ASSERT(&tc, kv_tc_wait_status_counts(&tc, counts, 3, KV_TC_READY_MS) == 0,
	             "no heartbeats");
	assert_int_equal(join_and_check(cl, N, VLEN), 1);
	assert_int_equal(join_and_check(cl, N, VLEN), 2);
	shardkv_close(cl);
}

static void
duplicate_join_is_rejected_and_changes_nothing(void **state)
{
	shardkv_config *before = kv_tc_config(&tc);
	shardkv_admin_result ar = {0};
	(void)state;

	assert_non_null(before);
	KV_TC_EXPECT(&tc, SHARDKV_EEXISTS, shardkv_join(tc.admin, tc.srv[0].url, 0, &ar));
	assert_non_null(strstr(shardkv_errmsg(), "already"));
	KV_TC_EXPECT(&tc, SHARDKV_EEXISTS,
	             shardkv_join(tc.admin, tc.srv[1].url, SHARDKV_NO_REBALANCE, &ar));
	KV_TC_EXPECT(&tc, SHARDKV_EEXISTS,
	             shardkv_join(tc.admin, tc.srv[1].url, SHARDKV_WAIT, &ar));
	assert_config_unchanged(before, "a duplicate join");
	KV_TC_EXPECT(&tc, SHARDKV_EINVAL, shardkv_join(tc.admin, "not a url", 0, &ar));
	KV_TC_EXPECT(&tc, SHARDKV_EINVAL, shardkv_join(tc.admin, "", 0, &ar));
	assert_config_unchanged(before, "a join of an invalid address");
	shardkv_config_free(before);
}

static void
leave_of_an_unknown_node_is_rejected_and_changes_nothing(void **state)
{
	shardkv_config *before = kv_tc_config(&tc);
	shardkv_admin_result ar = {0};
	char ghost[64];
	(void)state;

	assert_non_null(before);
	KV_TC_EXPECT(&tc, SHARDKV_ENOTFOUND, shardkv_leave(tc.admin, "99", 0, &ar));
	KV_TC_EXPECT(&tc, SHARDKV_ENOTFOUND, shardkv_leave(tc.admin, "99", SHARDKV_WAIT, &ar));
	kv_test_free_url(ghost, sizeof(ghost));
	KV_TC_EXPECT(&tc, SHARDKV_ENOTFOUND, shardkv_leave(tc.admin, ghost, 0, &ar));
	assert_config_unchanged(before, "a leave of an unknown node");
	shardkv_config_free(before);
}

static void
move_of_an_empty_or_inverted_range_is_rejected_and_changes_nothing(void **state)
{
	shardkv_config *before = kv_tc_config(&tc);
	shardkv_admin_result ar = {0};
	char id2[16];
	(void)state;

	assert_non_null(before);
	kv_tc_node_arg(&tc, 1, id2, sizeof(id2));
	KV_TC_EXPECT(&tc, SHARDKV_EINVAL, shardkv_move(tc.admin, "n", 1, "m", 1, id2, 0, 0, &ar));
	KV_TC_EXPECT(&tc, SHARDKV_EINVAL,
	             shardkv_move(tc.admin, "m", 1, "m", 1, id2, 0, SHARDKV_WAIT, &ar));
	KV_TC_EXPECT(&tc, SHARDKV_EINVAL,
	             shardkv_move(tc.admin, "ab", 2, "a", 1, tc.srv[0].url, 0, 0, &ar));
	assert_config_unchanged(before, "a move of an empty or inverted range");
	shardkv_config_free(before);
}

static void
move_to_an_unknown_or_inactive_node_is_rejected_and_changes_nothing(void **state)
{
	shardkv_admin_result ar = {0};
	char ghost[64], id2[16];
	(void)state;

	/* Make node 2 gone: it leaves (it holds data, which moves to node 1). */
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	char msg[512];
	assert_non_null(cl);
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(cl, "gone/", 500, 1, 20, msg, sizeof(msg)));
	kv_tc_node_arg(&tc, 1, id2, sizeof(id2));
	KV_TC_EXPECT(&tc, 0, shardkv_leave(tc.admin, id2, SHARDKV_WAIT, &ar));
	KV_TC_ASSERT(&tc, kv_tc_wait_node_state(&tc, 1, SHARDKV_NODE_GONE, KV_TC_READY_MS) == 0,
	             "node 2 never became gone");

	shardkv_config *before = kv_tc_config(&tc);
	assert_non_null(before);
	KV_TC_EXPECT(&tc, SHARDKV_ENOTFOUND,
	             shardkv_move(tc.admin, "a", 1, "b", 1, "99", 0, 0, &ar));
	kv_test_free_url(ghost, sizeof(ghost));
	KV_TC_EXPECT(&tc, SHARDKV_ENOTFOUND,
	             shardkv_move(tc.admin, "a", 1, "b", 1, ghost, 0, SHARDKV_WAIT, &ar));
	KV_TC_EXPECT(&tc, SHARDKV_EINVAL, shardkv_move(tc.admin, "a", 1, "b", 1, id2, 0, 0, &ar));
	assert_non_null(strstr(shardkv_errmsg(), "gone"));
	/* A gone node cannot leave again, and the last node cannot leave. */
	KV_TC_EXPECT(&tc, SHARDKV_EINVAL, shardkv_leave(tc.admin, id2, 0, &ar));
	char id1[16];
	kv_tc_node_arg(&tc, 0, id1, sizeof(id1));
	KV_TC_EXPECT(&tc, SHARDKV_EINVAL, shardkv_leave(tc.admin, id1, 0, &ar));
	assert_config_unchanged(before, "a move to an unknown or gone node");
	shardkv_config_free(before);

	/* Nothing was lost on the way. */
	long bad = kv_tc_verify(cl, "gone/", 500, 1, 20, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld keys wrong: %s", bad, msg);
	shardkv_close(cl);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(join_of_a_new_server_rebalances_so_it_takes_a_share,
	                                    setup1_one_copy, teardown),
	    cmocka_unit_test_setup_teardown(duplicate_join_is_rejected_and_changes_nothing, setup2,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(
	        leave_of_an_unknown_node_is_rejected_and_changes_nothing, setup2, teardown),
	    cmocka_unit_test_setup_teardown(
	        move_of_an_empty_or_inverted_range_is_rejected_and_changes_nothing, setup2,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        move_to_an_unknown_or_inactive_node_is_rejected_and_changes_nothing, setup2,
	        teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
