/*
 * test_cluster_raft.c - a replicated control plane (three shardkv-controller
 * replicas, Raft) with real servers: the leader is killed with SIGKILL
 * while a join, a move and a rebalance are in flight. Each operation either
 * completes (and then its configuration is never lost) or fails cleanly
 * (and then nothing of it is applied); the data plane keeps serving
 * throughout, with no acknowledged write lost; the killed replica catches
 * up when it comes back (through a snapshot: the controllers snapshot every
 * 4 entries); a follower serves configurations but sends changes to the
 * leader.
 */
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define NKEYS 300
#define VLEN  40
#define NW    200000 /* writer keys (more than it can write in the test) */

static kv_tc tc;
static const char *const ctl_args[] = {"--snapshot-threshold", "4", "--election-timeout", "600",
                                       NULL};

static int
setup(void **state)
{
	(void)state;
	return kv_tc_start_replicated(&tc, "cluster-raft", 3, ctl_args, 2);
}

static int
teardown(void **state)
{
	(void)state;
	kv_tc_destroy(&tc);
	return 0;
}

/* ---- the data plane: one writer that reads back what it wrote ---- */

struct writer {
	pthread_t t;
	atomic_bool stop;
	atomic_ulong ops, errors;
	unsigned acked;      /* keys w000000 .. acked-1 were acknowledged */
	char first_err[256]; /* the first failure */
	shardkv_client *cl;
};

static void *
writer_main(void *arg)
{
	struct writer *w = arg;
	char k[32], v[64];

	for (unsigned i = 0; i < NW && !atomic_load(&w->stop); i++) {
		size_t kl = kv_tc_key(k, sizeof(k), "w", i);
		size_t vl = kv_tc_value(v, sizeof(v), 1, i, 24);
		int rv = shardkv_put(w->cl, k, kl, v, vl);
		if (rv == 0) {
			w->acked = i + 1;
		} else {
			if (atomic_fetch_add(&w->errors, 1) == 0)
				snprintf(w->first_err, sizeof(w->first_err), "put %s: %s", k,
				         shardkv_errmsg());
			break; /* keep `acked` a prefix */
		}
		atomic_fetch_add(&w->ops, 1);
		kv_test_sleep_ms(2);
	}
	return NULL;
}

/* ---- an admin operation run while the leader dies ---- */

enum { OP_JOIN, OP_MOVE, OP_REBALANCE };

struct admin_op {
	pthread_t t;
	int kind;
	char addr[64]; /* join: the server; move: the destination node id */
	int rv;
	shardkv_admin_result res;
	char err[256];
};

static void *
admin_main(void *arg)
{
	struct admin_op *a = arg;
	shardkv_client *cl = kv_tc_client(&tc, true, 30000);

	if (cl == NULL) {
		a->rv = SHARDKV_EUNAVAIL;
		return NULL;
	}
	switch (a->kind) {
	case OP_JOIN:
		a->rv = shardkv_join(cl, a->addr, 0, &a->res);
		break;
	case OP_MOVE:
		a->rv = shardkv_move(cl, "k000100", 7, "k000200", 7, a->addr, 0, 0, &a->res);
		break;
	default:
		a->rv = shardkv_rebalance(cl, 0, 0, &a->res);
	}
	snprintf(a->err, sizeof(a->err), "%s", shardkv_errmsg());
	shardkv_close(cl);
	return NULL;
}

/* The configuration at epoch e, asked of whichever replica answers. */
static shardkv_config *
config_at(uint64_t e)
{
	shardkv_config *cfg = NULL;

	if (shardkv_config_get(tc.admin, e, &cfg) != 0)
		return NULL;
	return cfg;
}

static bool
has_node_at(const shardkv_config *cfg, const char *addr)
{
	for (size_t i = 0; i < cfg->nnodes; i++)
		if (strcmp(cfg->nodes[i].address, addr) == 0 &&
		    strcmp(shardkv_node_state_name(cfg->nodes[i].state), "gone") != 0)
			return true;
	return false;
}

/* Waits until replica k answers with at least epoch `e`. */
static bool
wait_replica_epoch(int k, long long e, unsigned ms)
{
	uint64_t t0 = kv_test_now_ms();

	while (kv_test_now_ms() - t0 < ms) {
		if (kv_tc_replica_epoch(&tc, k) >= e)
			return true;
		kv_test_sleep_ms(50);
	}
	return false;
}

/*
 * Runs one admin operation, kills the leader `delay_ms` after it was sent,
 * and checks the outcome: completed (its epoch survives, with the change in
 * it) or failed cleanly (a retry then does the work exactly once). Then
 * restarts the killed replica and waits until it has caught up.
 */
static void
kill_leader_during(int kind, const char *arg, unsigned delay_ms)
{
	struct admin_op a;
	int leader = kv_tc_wait_leader(&tc, KV_TC_READY_MS), nl;
	shardkv_config *cfg, *cur;

	KV_TC_ASSERT(&tc, leader >= 0, "no leader");
	memset(&a, 0, sizeof(a));
	a.kind = kind;
	snprintf(a.addr, sizeof(a.addr), "%s", arg);
	assert_int_equal(pthread_create(&a.t, NULL, admin_main, &a), 0);
	if (delay_ms)
		kv_test_sleep_ms(delay_ms);
	assert_int_equal(kv_tc_stop_replica(&tc, leader, SIGKILL, KV_TC_STOP_MS), 0);
	pthread_join(a.t, NULL);
	nl = kv_tc_wait_leader(&tc, KV_TC_READY_MS);
	KV_TC_ASSERT(&tc, nl >= 0 && nl != leader, "no new leader after killing replica %d",
	             leader + 1);
	fprintf(stderr, "op %d: killed leader %d after %u ms: rv=%s (%s) epoch=%llu\n", kind,
	        leader + 1, delay_ms, shardkv_strerror(a.rv), a.rv ? a.err : "",
	        (unsigned long long)a.res.epoch);
	if (a.rv == 0) {
		/* Acknowledged: the new leader has that configuration. */
		cfg = config_at(a.res.epoch);
		KV_TC_ASSERT(&tc, cfg != NULL, "acknowledged epoch %llu is lost",
		             (unsigned long long)a.res.epoch);
		if (kind == OP_JOIN)
			KV_TC_ASSERT(&tc, has_node_at(cfg, arg),
			             "the acknowledged join is not in it");
		if (kind == OP_MOVE)
			KV_TC_ASSERT(&tc, kv_tc_owner(cfg, "k000150", 7) == (uint32_t)atoi(arg),
			             "the acknowledged move is not in it");
		shardkv_config_free(cfg);
	} else {
		/* A clean failure: an error code the caller can act on, and a
		 * retry completes the operation. */
		KV_TC_ASSERT(&tc,
		             a.rv == SHARDKV_EUNAVAIL || a.rv == SHARDKV_ETIMEDOUT ||
		                 a.rv == SHARDKV_EBUSY,
		             "unclean failure %s", shardkv_strerror(a.rv));
		cur = config_at(0);
		KV_TC_ASSERT(&tc, cur != NULL, "no config");
		if (kind == OP_JOIN && has_node_at(cur, arg)) {
			/* It committed before the leader died: not half-applied. */
		} else {
			/* A move is refused busy while a newcomer is still being
			 * copied: the retry waits until every replica is in sync. */
			if (a.rv == SHARDKV_EBUSY)
				KV_TC_ASSERT(&tc, kv_tc_wait_in_sync(&tc, KV_TC_READY_MS) == 0,
				             "replicas never in sync");
			memset(&a.res, 0, sizeof(a.res));
			assert_int_equal(pthread_create(&a.t, NULL, admin_main, &a), 0);
			pthread_join(a.t, NULL);
			KV_TC_EXPECT(&tc, 0, a.rv);
		}
		shardkv_config_free(cur);
	}
	/* Everything settles, and the replica that was down catches up. */
	KV_TC_ASSERT(&tc, kv_tc_wait_settled(&tc, KV_TC_READY_MS) == 0, "migrations stuck");
	cur = config_at(0);
	KV_TC_ASSERT(&tc, cur != NULL, "no config");
	assert_int_equal(kv_tc_start_replica(&tc, leader), 0);
	KV_TC_ASSERT(&tc, wait_replica_epoch(leader, (long long)cur->epoch, KV_TC_READY_MS),
	             "replica %d did not catch up to epoch %llu", leader + 1,
	             (unsigned long long)cur->epoch);
	shardkv_config_free(cur);
}

static void
leader_killed_during_join_move_rebalance_loses_nothing_acknowledged(void **state)
{
	struct writer w;
	char msg[256] = "", node[16];
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	int s3;
	(void)state;

	assert_non_null(cl);
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(cl, "k", NKEYS, 1, VLEN, msg, sizeof(msg)));
	memset(&w, 0, sizeof(w));
	w.cl = cl;
	assert_int_equal(pthread_create(&w.t, NULL, writer_main, &w), 0);

	/* A join: the new server is started without --join. */
	s3 = kv_tc_add_server(&tc, false);
	assert_true(s3 >= 0);
	kill_leader_during(OP_JOIN, tc.srv[s3].url, 0);
	KV_TC_ASSERT(&tc, kv_tc_wait_node_state(&tc, s3, SHARDKV_NODE_ACTIVE, KV_TC_READY_MS) == 0,
	             "the joined server is not active");
	unsigned long before = atomic_load(&w.ops);

	/* A move of [k000100, k000200) to the new node. */
	snprintf(node, sizeof(node), "%u", tc.srv[s3].id);
	kill_leader_during(OP_MOVE, node, 2);

	/* A rebalance. */
	kill_leader_during(OP_REBALANCE, "", 1);

	atomic_store(&w.stop, true);
	pthread_join(w.t, NULL);
	KV_TC_ASSERT(&tc, atomic_load(&w.errors) == 0, "the data plane failed: %s", w.first_err);
	KV_TC_ASSERT(&tc, atomic_load(&w.ops) > before, "the data plane made no progress");
	/* Nothing acknowledged is lost. */
	long bad = kv_tc_verify(cl, "k", NKEYS, 1, VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld keys wrong: %s", bad, msg);
	bad = kv_tc_verify(cl, "w", w.acked, 1, 24, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld of %u acknowledged writes wrong: %s", bad, w.acked, msg);
	fprintf(stderr, "writer: %u acknowledged writes, all read back\n", w.acked);
	shardkv_close(cl);
}

static void
follower_serves_configs_and_redirects_changes(void **state)
{
	int leader = kv_tc_wait_leader(&tc, KV_TC_READY_MS), f = (leader + 1) % 3;
	shardkv_options o = {.timeout_ms = 5000, .no_watch = true};
	shardkv_client *cl = NULL;
	shardkv_config *cfg = NULL, *lcfg = config_at(0);
	shardkv_admin_result res;
	(void)state;

	assert_true(leader >= 0);
	assert_non_null(lcfg);
	/* A handle on the follower alone: configs come from it... */
	assert_int_equal(shardkv_open(tc.rurl[f], &o, &cl), 0);
	KV_TC_ASSERT(&tc, wait_replica_epoch(f, (long long)lcfg->epoch, KV_TC_READY_MS),
	             "follower behind");
	KV_TC_EXPECT(&tc, 0, shardkv_config_get(cl, 0, &cfg));
	assert_int_equal(cfg->epoch, lcfg->epoch);
	shardkv_config_free(cfg);
	/* ...but a change it cannot make: NOT_LEADER, which the client follows
	 * to the leader even though the leader is not in its list. */
	memset(&res, 0, sizeof(res));
	KV_TC_EXPECT(&tc, 0, shardkv_rebalance(cl, 0, 0, &res));
	assert_true(res.epoch >= lcfg->epoch);
	/* The status shows three replicas, one leader, all in the same term
	 * (a follower the leader has not heard from lately shows as unknown,
	 * term 0: on a loaded machine that can last a moment). */
	uint64_t t0 = kv_test_now_ms();
	for (;;) {
		KV_TC_EXPECT(&tc, 0, shardkv_status(tc.admin, &cfg));
		assert_int_equal(cfg->ncontrollers, 3);
		bool heard = true;
		for (size_t i = 0; i < cfg->ncontrollers; i++)
			heard = heard && cfg->controllers[i].term > 0;
		if (heard || kv_test_now_ms() - t0 > KV_TC_READY_MS)
			break;
		shardkv_config_free(cfg);
		kv_test_sleep_ms(50);
	}
	int leaders = 0;
	for (size_t i = 0; i < cfg->ncontrollers; i++) {
		leaders += strcmp(cfg->controllers[i].role, "leader") == 0;
		assert_true(cfg->controllers[i].term > 0);
		assert_true(cfg->controllers[i].index > 0);
	}
	assert_int_equal(leaders, 1);
	shardkv_config_free(cfg);
	shardkv_config_free(lcfg);
	shardkv_close(cl);
}

static void
retried_join_at_a_new_leader_is_answered_not_applied_again(void **state)
{
	int leader = kv_tc_wait_leader(&tc, KV_TC_READY_MS), nl, s = kv_tc_add_server(&tc, false);
	kv_tc_raw_admin first, again, other;
	(void)state;

	assert_true(leader >= 0 && s >= 0);
	/* The join commits at the leader, which then dies before the caller
	 * could be sure (here: it did answer, and the caller retries anyway). */
	KV_TC_EXPECT(&tc, 0,
	             kv_tc_raw_join(tc.rurl[leader], 0x5eed, 1, tc.srv[s].url, 5000, &first));
	KV_TC_ASSERT(&tc, first.status == 0 && first.node_id != 0, "join: status %d", first.status);
	assert_int_equal(kv_tc_stop_replica(&tc, leader, SIGKILL, KV_TC_STOP_MS), 0);
	nl = kv_tc_wait_leader(&tc, KV_TC_READY_MS);
	KV_TC_ASSERT(&tc, nl >= 0 && nl != leader, "no new leader");
	/* The same command (same ids) at the new leader: the same answer, no
	 * second node and no new epoch. The retry may reach the new leader
	 * before it has taken over (NOT_LEADER): try until it answers. */
	uint64_t t0 = kv_test_now_ms();
	do {
		KV_TC_EXPECT(&tc, 0,
		             kv_tc_raw_join(tc.rurl[nl], 0x5eed, 1, tc.srv[s].url, 5000, &again));
	} while (again.not_leader && kv_test_now_ms() - t0 < KV_TC_READY_MS);
	KV_TC_ASSERT(&tc, again.status == 0, "retried join: status %d", again.status);
	assert_int_equal(again.epoch, first.epoch);
	assert_int_equal(again.node_id, first.node_id);
	/* A new command (new request id) for the same address is a duplicate
	 * join, which shows the retry was recognised, not ignored. */
	KV_TC_EXPECT(&tc, 0, kv_tc_raw_join(tc.rurl[nl], 0x5eed, 2, tc.srv[s].url, 5000, &other));
	assert_int_equal(other.status, SHARDKV_EEXISTS);
	shardkv_config *cfg = config_at(0);
	assert_non_null(cfg);
	size_t same = 0;
	for (size_t i = 0; i < cfg->nnodes; i++)
		same += strcmp(cfg->nodes[i].address, tc.srv[s].url) == 0;
	assert_int_equal(same, 1);
	shardkv_config_free(cfg);
}

/* An administrator's move pins its range against the automatic balancer
 * in the configuration it publishes (doc/scheduler.md "Pins"): a new leader
 * has the pin, and the next rebalance clears it. */
static void
a_pin_survives_a_change_of_leader(void **state)
{
	int leader = kv_tc_wait_leader(&tc, KV_TC_READY_MS), nl;
	shardkv_admin_result res;
	shardkv_config *cfg;
	char to[16], st[64], en[64];
	size_t np = 0, sl = 0, el = 0;
	uint64_t ep = 0;
	(void)state;

	KV_TC_ASSERT(&tc, leader >= 0, "no leader");
	KV_TC_ASSERT(&tc, kv_tc_wait_in_sync(&tc, KV_TC_READY_MS) == 0, "replicas never in sync");
	cfg = config_at(0);
	KV_TC_ASSERT(&tc, cfg != NULL && cfg->nnodes >= 2, "no config with two nodes");
	uint32_t owner = kv_tc_owner(cfg, "k000150", 7), other = 0;
	for (size_t i = 0; i < cfg->nnodes && other == 0; i++)
		if (cfg->nodes[i].id != owner)
			other = cfg->nodes[i].id;
	shardkv_config_free(cfg);
	snprintf(to, sizeof(to), "%u", other);
	memset(&res, 0, sizeof(res));
	KV_TC_EXPECT(&tc, 0, shardkv_move(tc.admin, "k000100", 7, "k000200", 7, to, 0, 0, &res));
	KV_TC_EXPECT(&tc, 0, kv_tc_raw_pins(tc.rurl[leader], 5000, &ep, &np, st, &sl, en, &el));
	KV_TC_ASSERT(&tc, ep >= res.epoch && np == 1, "the move's pin is not in epoch %llu (%zu)",
	             (unsigned long long)ep, np);
	/* The leader dies: the new one has the pin. */
	assert_int_equal(kv_tc_stop_replica(&tc, leader, SIGKILL, KV_TC_STOP_MS), 0);
	nl = kv_tc_wait_leader(&tc, KV_TC_READY_MS);
	KV_TC_ASSERT(&tc, nl >= 0 && nl != leader, "no new leader");
	KV_TC_EXPECT(&tc, 0, kv_tc_raw_pins(tc.rurl[nl], 5000, &ep, &np, st, &sl, en, &el));
	KV_TC_ASSERT(&tc,
	             np == 1 && sl == 7 && el == 7 && memcmp(st, "k000100", 7) == 0 &&
	                 memcmp(en, "k000200", 7) == 0,
	             "the new leader lost the pin (%zu pins at epoch %llu)", np,
	             (unsigned long long)ep);
	/* rebalance unpins, at the new leader. */
	memset(&res, 0, sizeof(res));
	KV_TC_EXPECT(&tc, 0, shardkv_rebalance(tc.admin, 0, 0, &res));
	KV_TC_EXPECT(&tc, 0, kv_tc_raw_pins(tc.rurl[nl], 5000, &ep, &np, st, &sl, en, &el));
	KV_TC_ASSERT(&tc, np == 0, "rebalance left %zu pins at epoch %llu", np,
	             (unsigned long long)ep);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(
	        leader_killed_during_join_move_rebalance_loses_nothing_acknowledged, setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(follower_serves_configs_and_redirects_changes, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(
	        retried_join_at_a_new_leader_is_answered_not_applied_again, setup, teardown),
	    cmocka_unit_test_setup_teardown(a_pin_survives_a_change_of_leader, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
