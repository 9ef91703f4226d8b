/*
 * test_cluster_data.c - data survives every change of the range map, with
 * real daemons: what was written before a join, a move, a leave and a
 * rebalance reads back after each; two ranges swapped between two servers
 * by back-to-back moves end swapped with all their data; a node that leaves
 * gracefully (the admin command, or SIGTERM to its process) hands all its
 * data to the others, ends `gone`, and (SIGTERM) exits 0 on its own; writes
 * that keep coming during a join, a rebalance and a leave are neither lost
 * nor applied twice.
 */
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#define NCOUNT (KV_TC_MAX_SERVERS + 2)

static kv_tc tc;

static int
setup2(void **state)
{
	(void)state;
	return kv_tc_start(&tc, "cluster-data", 2);
}

/* One copy per range, on purpose: these tests follow the data as it
 * migrates (a join, a move, a leave, a rebalance each copy it to another
 * node and the heartbeats show it there). With replicas those steps move
 * no data (a joining node becomes a replica, a move or rebalance hands the
 * primary role to an in-sync replica); the last test runs with them. */
static int
setup2_one_copy(void **state)
{
	(void)state;
	return kv_tc_start_one_copy(&tc, "cluster-data", 2);
}

static int
setup3_one_copy(void **state)
{
	(void)state;
	return kv_tc_start_one_copy(&tc, "cluster-data", 3);
}

static int
teardown(void **state)
{
	(void)state;
	kv_tc_destroy(&tc);
	return 0;
}

/* One batch of numbered keys written at some step. */
typedef struct {
	const char *prefix; /* key prefix */
	unsigned n;         /* keys */
	unsigned gen;       /* value generation */
} batch;

#define VLEN 64

/* Fails unless every key of every batch reads back with its value. */
static void
verify_all(shardkv_client *cl, const batch *b, size_t nb, const char *after)
{
	char msg[512];

	for (size_t i = 0; i < nb; i++) {
		long bad = kv_tc_verify(cl, b[i].prefix, b[i].n, b[i].gen, VLEN, msg, sizeof(msg));
		KV_TC_ASSERT(&tc, bad == 0, "after %s: %ld keys of %s wrong: %s", after, bad,
		             b[i].prefix, msg);
	}
}

static void
write_batch(shardkv_client *cl, const batch *b)
{
	char msg[512];
	int rv = kv_tc_fill(cl, b->prefix, b->n, b->gen, VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, rv == 0, "%s", msg);
}

/* Waits until the status shows the nodes holding what the map gives them
 * (so that the controller balances by the real sizes). */
static void
wait_stats_match(const batch *b, size_t nb)
{
	unsigned counts[NCOUNT] = {0}, c1[NCOUNT];
	shardkv_config *cfg = kv_tc_config(&tc);

	assert_non_null(cfg);
	for (size_t i = 0; i < nb; i++) {
		kv_tc_count_owners(cfg, b[i].prefix, b[i].n, c1, NCOUNT);
		for (size_t k = 0; k < NCOUNT; k++)
			counts[k] += c1[k];
	}
	shardkv_config_free(cfg);
	KV_TC_ASSERT(&tc, kv_tc_wait_status_counts(&tc, counts, NCOUNT, KV_TC_READY_MS) == 0,
	             "the heartbeats do not show the keys where the range map puts them");
}

static void
data_written_before_join_move_leave_and_rebalance_reads_back_after_each(void **state)
{
	shardkv_client *cl = kv_tc_client(&tc, false, 15000);
	shardkv_admin_result ar;
	batch b[5] = {{"d0/", 5000, 1},
	              {"d1/", 1000, 2},
	              {"d2/", 1000, 3},
	              {"d3/", 1000, 4},
	              {"d4/", 1000, 5}};
	char node[16];
	(void)state;

	assert_non_null(cl);
	write_batch(cl, &b[0]);
	verify_all(cl, b, 1, "the first write");
	wait_stats_match(b, 1);

	/* Join: a third server takes a share. */
	int i = kv_tc_add_server(&tc, false);
	assert_true(i >= 0);
	KV_TC_EXPECT(&tc, 0, shardkv_join(tc.admin, tc.srv[i].url, SHARDKV_WAIT, &ar));
	tc.srv[i].id = ar.node_id;
	verify_all(cl, b, 1, "a join");
	write_batch(cl, &b[1]);

	/* Move: the middle of d0/ and all of d1/ to server 2. */
	kv_tc_node_arg(&tc, 1, node, sizeof(node));
	KV_TC_EXPECT(
	    &tc, 0,
	    shardkv_move(tc.admin, "d0/001000", 9, "d1/000500", 9, node, 0, SHARDKV_WAIT, &ar));
	verify_all(cl, b, 2, "a move");
	write_batch(cl, &b[2]);

	/* Leave: server 1 drains to the others. */
	kv_tc_node_arg(&tc, 0, node, sizeof(node));
	KV_TC_EXPECT(&tc, 0, shardkv_leave(tc.admin, node, SHARDKV_WAIT, &ar));
	KV_TC_ASSERT(&tc, kv_tc_wait_node_state(&tc, 0, SHARDKV_NODE_GONE, KV_TC_READY_MS) == 0,
	             "server 1 never became gone");
	verify_all(cl, b, 3, "a leave");
	write_batch(cl, &b[3]);

	/* Rebalance: first put everything on server 3, then even it out. */
	kv_tc_node_arg(&tc, 2, node, sizeof(node));
	KV_TC_EXPECT(&tc, 0, shardkv_move(tc.admin, "", 0, "", 0, node, 0, SHARDKV_WAIT, &ar));
	verify_all(cl, b, 4, "a move of everything");
	wait_stats_match(b, 4);
	KV_TC_EXPECT(&tc, 0, shardkv_rebalance(tc.admin, 0, SHARDKV_WAIT, &ar));
	KV_TC_ASSERT(&tc, ar.nmigrations > 0, "the rebalance moved nothing");
	verify_all(cl, b, 4, "a rebalance");
	shardkv_config *cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	/* Both nodes hold part of the data. Where the cut falls depends on
	 * what the rebalance weighs first: bytes cut inside d0/ (5,000 of the
	 * 8,000 keys), the load of the reads just made may cut between the
	 * prefixes. */
	unsigned counts[NCOUNT] = {0}, c1[NCOUNT];
	for (size_t k = 0; k < 4; k++) {
		kv_tc_count_owners(cfg, b[k].prefix, b[k].n, c1, NCOUNT);
		for (size_t j = 0; j < NCOUNT; j++)
			counts[j] += c1[j];
	}
	KV_TC_ASSERT(&tc, counts[tc.srv[1].id] > 0 && counts[tc.srv[2].id] > 0,
	             "after the rebalance the keys are on nodes %u: %u keys, %u: %u keys",
	             tc.srv[1].id, counts[tc.srv[1].id], tc.srv[2].id, counts[tc.srv[2].id]);
	shardkv_config_free(cfg);
	write_batch(cl, &b[4]);
	verify_all(cl, b, 5, "the last write");
	shardkv_close(cl);
}

static void
a_range_swap_by_back_to_back_moves_keeps_all_data(void **state)
{
	enum { N = 4000 };
	shardkv_client *cl = kv_tc_client(&tc, false, 15000);
	shardkv_admin_result a1, a2;
	batch b = {"sw/", N, 7};
	char ka[32], kb[32], na[16], nb[16];
	int idx[2] = {0, 1};
	(void)state;

	assert_non_null(cl);
	/* [sw/000000, sw/002000) on server 1, [sw/002000, sw0) on server 2. */
	KV_TC_EXPECT(&tc, 0, kv_tc_spread(&tc, "sw/", N, idx, 2));
	write_batch(cl, &b);
	size_t la = kv_tc_key(ka, sizeof(ka), "sw/", 0),
	       lb = kv_tc_key(kb, sizeof(kb), "sw/", N / 2);
	kv_tc_node_arg(&tc, 0, na, sizeof(na));
	kv_tc_node_arg(&tc, 1, nb, sizeof(nb));

	/* Both moves are accepted before either has finished. */
	KV_TC_EXPECT(&tc, 0, shardkv_move(tc.admin, ka, la, kb, lb, nb, 0, 0, &a1));
	KV_TC_EXPECT(&tc, 0, shardkv_move(tc.admin, kb, lb, "sw0", 3, na, 0, 0, &a2));
	assert_int_equal(a2.epoch, a1.epoch + 1);
	assert_true(a1.nmigrations > 0 && a2.nmigrations > 0);
	KV_TC_ASSERT(&tc, kv_tc_wait_settled(&tc, KV_TC_READY_MS) == 0, "the swap never finished");

	shardkv_config *cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	assert_int_equal(kv_tc_owner(cfg, ka, la), tc.srv[1].id);
	assert_int_equal(kv_tc_owner(cfg, kb, lb), tc.srv[0].id);
	char last[32];
	size_t ll = kv_tc_key(last, sizeof(last), "sw/", N - 1);
	assert_int_equal(kv_tc_owner(cfg, last, ll), tc.srv[0].id);
	shardkv_config_free(cfg);
	verify_all(cl, &b, 1, "a range swap");
	/* The servers hold what the map says, nothing twice. */
	wait_stats_match(&b, 1);
	shardkv_close(cl);
}

/* Spreads `b` over the three servers, so that server 2 holds a third. */
static void
spread_over_three(shardkv_client *cl, const batch *b)
{
	int idx[3] = {0, 1, 2};
	KV_TC_EXPECT(&tc, 0, kv_tc_spread(&tc, b->prefix, b->n, idx, 3));
	write_batch(cl, b);
	shardkv_config *cfg = kv_tc_config(&tc);
	unsigned counts[NCOUNT];
	assert_non_null(cfg);
	kv_tc_count_owners(cfg, b->prefix, b->n, counts, NCOUNT);
	assert_true(counts[tc.srv[1].id] >= b->n / 3);
	shardkv_config_free(cfg);
	wait_stats_match(b, 1);
}

/* Fails unless node id is gone and owns nothing in the latest config. */
static void
assert_gone(uint32_t id)
{
	shardkv_config *cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	const shardkv_node *n = kv_tc_node(cfg, id);
	assert_non_null(n);
	KV_TC_ASSERT(&tc, n->state == SHARDKV_NODE_GONE, "node %u is %s, not gone", id,
	             shardkv_node_state_name(n->state));
	assert_int_equal(kv_tc_nranges_of(cfg, id), 0);
	for (size_t i = 0; i < cfg->nmigrations; i++)
		assert_true(cfg->migrations[i].from != id);
	shardkv_config_free(cfg);
}

static void
admin_leave_of_a_node_with_data_hands_it_all_to_the_others(void **state)
{
	shardkv_client *cl = kv_tc_client(&tc, false, 15000);
	shardkv_admin_result ar;
	batch b = {"lv/", 3000, 3};
	char node[16];
	(void)state;

	assert_non_null(cl);
	spread_over_three(cl, &b);
	kv_tc_node_arg(&tc, 1, node, sizeof(node));
	KV_TC_EXPECT(&tc, 0, shardkv_leave(tc.admin, node, SHARDKV_WAIT, &ar));
	assert_true(ar.nmigrations > 0);
	/* --wait returned: every migration of the drain has finished, so the
	 * node is gone already. */
	assert_gone(tc.srv[1].id);
	verify_all(cl, &b, 1, "an admin leave");
	shardkv_close(cl);
}

static void
sigterm_of_a_server_drains_it_and_it_exits_0(void **state)
{
	shardkv_client *cl = kv_tc_client(&tc, false, 15000);
	batch b = {"tm/", 3000, 4};
	int status = 0;
	(void)state;

	assert_non_null(cl);
	spread_over_three(cl, &b);
	uint64_t t0 = kv_test_now_ms();
	KV_TC_ASSERT(&tc, kv_tc_stop_server(&tc, 1, SIGTERM, 20000, &status) == 0,
	             "server 2 did not exit within 20 s of SIGTERM");
	KV_TC_ASSERT(&tc, WIFEXITED(status) && WEXITSTATUS(status) == 0,
	             "server 2 ended with status 0x%x after SIGTERM", status);
	fprintf(stderr, "server 2 drained and exited in %llu ms\n",
	        (unsigned long long)(kv_test_now_ms() - t0));
	assert_gone(tc.srv[1].id);
	verify_all(cl, &b, 1, "a SIGTERM leave");
	/* The survivors take new writes for the whole key space. */
	batch b2 = {"tm/", 3000, 5};
	write_batch(cl, &b2);
	verify_all(cl, &b2, 1, "writes after the leave");
	shardkv_close(cl);
}

/* Writers that keep going through the changes: puts of numbered keys and
 * appends to one counter, remembering what was acknowledged. */
#define LOAD_KEYS 400

typedef struct {
	shardkv_client *c;    /* shared by both workers */
	atomic_int stop;      /* set by the main thread */
	atomic_long failures; /* failed calls */
	char first[512];      /* the first failure */
	int last[LOAD_KEYS];  /* last acknowledged value per key; -1: none */
	long appends;         /* acknowledged appends to "load/counter" */
	atomic_long puts;     /* acknowledged puts */
} load;

static void
load_fail(load *l, const char *what, int rv)
{
	if (atomic_fetch_add(&l->failures, 1) == 0)
		snprintf(l->first, sizeof(l->first), "%s: %s (%s)", what, shardkv_strerror(rv),
		         shardkv_errmsg());
}

static void *
load_writer(void *arg)
{
	load *l = arg;
	for (int i = 0; !atomic_load(&l->stop); i++) {
		char k[32], v[32];
		snprintf(k, sizeof(k), "load/%04d", i % LOAD_KEYS);
		snprintf(v, sizeof(v), "%d", i);
		int rv = shardkv_put(l->c, k, strlen(k), v, strlen(v));
		if (rv == 0) {
			l->last[i % LOAD_KEYS] = i;
			atomic_fetch_add(&l->puts, 1);
		} else {
			load_fail(l, k, rv);
		}
	}
	return NULL;
}

static void *
load_appender(void *arg)
{
	load *l = arg;
	while (!atomic_load(&l->stop)) {
		int rv = shardkv_append(l->c, "load/counter", 12, "x", 1, NULL);
		if (rv == 0)
			l->appends++;
		else
			load_fail(l, "append load/counter", rv);
	}
	return NULL;
}

/* Waits until the writers made `n` more puts. */
static void
let_load_run(load *l, long n)
{
	long start = atomic_load(&l->puts);
	for (uint64_t t0 = kv_test_now_ms();
	     atomic_load(&l->puts) - start < n && kv_test_now_ms() - t0 < 10000;)
		kv_test_sleep_ms(5);
}

static void
writes_during_join_rebalance_and_leave_are_neither_lost_nor_duplicated(void **state)
{
	static load l;
	pthread_t w, a;
	shardkv_admin_result ar;
	char node[16];
	int status = 0;
	(void)state;

	memset(&l, 0, sizeof(l));
	for (int i = 0; i < LOAD_KEYS; i++)
		l.last[i] = -1;
	l.c = kv_tc_client(&tc, false, 15000);
	assert_non_null(l.c);
	assert_int_equal(pthread_create(&w, NULL, load_writer, &l), 0);
	assert_int_equal(pthread_create(&a, NULL, load_appender, &l), 0);
	let_load_run(&l, 200);

	/* A join with rebalance, under load. */
	int i = kv_tc_add_server(&tc, false);
	assert_true(i >= 0);
	int rv = shardkv_join(tc.admin, tc.srv[i].url, SHARDKV_WAIT, &ar);
	if (rv == 0)
		tc.srv[i].id = ar.node_id;
	else
		load_fail(&l, "join", rv);
	let_load_run(&l, 200);
	/* Everything to server 1, then a rebalance, under load. */
	kv_tc_node_arg(&tc, 0, node, sizeof(node));
	if ((rv = shardkv_move(tc.admin, "", 0, "", 0, node, 0, SHARDKV_WAIT, NULL)) != 0)
		load_fail(&l, "move everything", rv);
	let_load_run(&l, 200);
	if ((rv = shardkv_rebalance(tc.admin, 0, SHARDKV_WAIT, NULL)) != 0)
		load_fail(&l, "rebalance", rv);
	let_load_run(&l, 200);
	/* A SIGTERM leave of server 1, under load. */
	if (kv_tc_stop_server(&tc, 0, SIGTERM, 20000, &status) != 0)
		load_fail(&l, "server 1 did not exit within 20 s of SIGTERM", SHARDKV_ETIMEDOUT);
	let_load_run(&l, 200);
	atomic_store(&l.stop, 1);
	pthread_join(w, NULL);
	pthread_join(a, NULL);
	KV_TC_ASSERT(&tc, atomic_load(&l.failures) == 0, "%ld failures; first: %s",
	             atomic_load(&l.failures), l.first);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);

	/* Every key holds its last acknowledged value; every acknowledged
	 * append happened exactly once. */
	for (int k = 0; k < LOAD_KEYS; k++) {
		char key[32], want[32];
		shardkv_buf v = {0};
		if (l.last[k] < 0)
			continue;
		snprintf(key, sizeof(key), "load/%04d", k);
		snprintf(want, sizeof(want), "%d", l.last[k]);
		KV_TC_EXPECT(&tc, 0, shardkv_get(l.c, key, strlen(key), &v));
		KV_TC_ASSERT(&tc, v.len == strlen(want) && memcmp(v.data, want, v.len) == 0,
		             "%s = '%s', want the last acknowledged '%s'", key, (char *)v.data,
		             want);
		shardkv_free(v.data);
	}
	shardkv_buf cnt = {0};
	KV_TC_EXPECT(&tc, 0, shardkv_get(l.c, "load/counter", 12, &cnt));
	KV_TC_ASSERT(&tc, (long)cnt.len == l.appends,
	             "the counter has %zu appends, %ld were acknowledged", cnt.len, l.appends);
	shardkv_free(cnt.data);
	fprintf(stderr, "%ld puts and %ld appends under load\n", atomic_load(&l.puts), l.appends);
	shardkv_close(l.c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(
	        data_written_before_join_move_leave_and_rebalance_reads_back_after_each,
	        setup2_one_copy, teardown),
	    cmocka_unit_test_setup_teardown(a_range_swap_by_back_to_back_moves_keeps_all_data,
	                                    setup2_one_copy, teardown),
	    cmocka_unit_test_setup_teardown(
	        admin_leave_of_a_node_with_data_hands_it_all_to_the_others, setup3_one_copy,
	        teardown),
	    cmocka_unit_test_setup_teardown(sigterm_of_a_server_drains_it_and_it_exits_0,
	                                    setup3_one_copy, teardown),
	    cmocka_unit_test_setup_teardown(
	        writes_during_join_rebalance_and_leave_are_neither_lost_nor_duplicated, setup2,
	        teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
