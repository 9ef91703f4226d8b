/*
 * test_cluster_moves.c - reads and writes around moves, with real daemons:
 * a write acknowledged by the new owner right after a move is never replaced
 * by the value the old owner had (not by later reads, not after the old
 * owner's cleanup, not when the range comes back to the old owner), and a
 * client whose cached configuration is several epochs old still reads and
 * writes every key correctly, corrected by the servers' owner hints.
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

#define NCOUNT (KV_TC_MAX_SERVERS + 2)

static kv_tc tc;

/* One copy per range, on purpose: every test here is about moves that
 * migrate data (the new owner's first write against the old owner's copy,
 * clients stale by the moves' epochs, a move's copy rate). With replicas a
 * move hands the primary role to an in-sync replica and copies nothing. */
static int
setup2(void **state)
{
	(void)state;
	return kv_tc_start_one_copy(&tc, "cluster-moves", 2);
}

static int
setup3(void **state)
{
	(void)state;
	return kv_tc_start_one_copy(&tc, "cluster-moves", 3);
}

static int
teardown(void **state)
{
	(void)state;
	kv_tc_destroy(&tc);
	return 0;
}

/* Fails unless key reads back as want through cl. */
static void
check_reads_back(shardkv_client *cl, const char *who, const char *key, const char *want, int rep)
{
	shardkv_buf v = {0};
	int rv = shardkv_get(cl, key, strlen(key), &v);

	if (rv != 0) {
		char m[512];
		snprintf(m, sizeof(m), "%s", shardkv_errmsg());
		kv_tc_dump_logs(&tc, 40);
		fail_msg("rep %d: %s get %s: %s (%s)", rep, who, key, shardkv_strerror(rv), m);
	}
	bool ok = v.len == strlen(want) && memcmp(v.data, want, v.len) == 0;
	if (!ok) {
		char got[128];
		snprintf(got, sizeof(got), "%.*s", (int)(v.len < 100 ? v.len : 100),
		         (const char *)v.data);
		shardkv_free(v.data);
		kv_tc_dump_logs(&tc, 40);
		fail_msg("rep %d: %s read %s = '%s', want '%s'", rep, who, key, got, want);
	}
	shardkv_free(v.data);
}

static void
a_write_acknowledged_after_a_move_is_never_replaced_by_the_old_value(void **state)
{
	enum { REPS = 50, BURST = 20 };
	shardkv_client *w = kv_tc_client(&tc, false, 10000); /* writer, with watch */
	shardkv_client *r = kv_tc_client(&tc, true, 10000);  /* reader, no watch */
	char key[REPS][32], oldv[32], newv[REPS][32];
	(void)state;

	assert_non_null(w);
	assert_non_null(r);
	for (int rep = 0; rep < REPS; rep++) {
		const int to = (rep + 1) % 2; /* alternate: server 2, 1, 2, ... */
		char node[16];
		shardkv_admin_result ar;

		snprintf(key[rep], sizeof(key[rep]), "mv/%03d", rep);
		snprintf(oldv, sizeof(oldv), "old-%d", rep);
		snprintf(newv[rep], sizeof(newv[rep]), "new-%d", rep);
		KV_TC_EXPECT(&tc, 0,
		             shardkv_put(w, key[rep], strlen(key[rep]), oldv, strlen(oldv)));
		kv_tc_node_arg(&tc, to, node, sizeof(node));
		KV_TC_EXPECT(
		    &tc, 0, shardkv_move(tc.admin, "mv/", 3, "mv0", 3, node, 0, SHARDKV_WAIT, &ar));
		KV_TC_ASSERT(&tc, rep == 0 || ar.nmigrations == 1,
		             "rep %d: the move started %zu "
		             "migrations",
		             rep, ar.nmigrations);
		shardkv_config *cfg = kv_tc_config(&tc);
		assert_non_null(cfg);
		assert_int_equal(kv_tc_owner(cfg, key[rep], strlen(key[rep])), tc.srv[to].id);
		shardkv_config_free(cfg);
		KV_TC_EXPECT(
		    &tc, 0,
		    shardkv_put(w, key[rep], strlen(key[rep]), newv[rep], strlen(newv[rep])));
		check_reads_back(w, "writer", key[rep], newv[rep], rep);
		for (int k = 0; k < BURST; k++)
			check_reads_back(k % 2 ? r : w, k % 2 ? "reader" : "writer", key[rep],
			                 newv[rep], rep);
		/* Every earlier key kept its new value through the moves back and
		 * forth (a stale copy left on a node never resurfaces). */
		for (int j = 0; j < rep; j++)
			check_reads_back(r, "reader", key[j], newv[j], rep);
	}
	/* After the old owners' cleanup: the heartbeats show every key once,
	 * on the last owner; the values are still the new ones. */
	unsigned counts[NCOUNT] = {0};
	counts[tc.srv[REPS % 2].id] = REPS;
	KV_TC_ASSERT(&tc, kv_tc_wait_status_counts(&tc, counts, NCOUNT, KV_TC_READY_MS) == 0,
	             "the moved keys are not exactly once on their last owner");
	for (int j = 0; j < REPS; j++) {
		check_reads_back(r, "reader", key[j], newv[j], REPS);
		check_reads_back(w, "writer", key[j], newv[j], REPS);
	}
	shardkv_close(w);
	shardkv_close(r);
}

static void
a_client_stale_by_several_epochs_reads_and_writes_every_key(void **state)
{
	enum { N = 3000, VLEN = 40 };
	shardkv_client *a = kv_tc_client(&tc, true, 15000); /* no watch: its cache goes stale */
	shardkv_client *b = kv_tc_client(&tc, false, 15000);
	int idx[3] = {0, 1, 2};
	char msg[512], n1[16], n2[16], n3[16];
	(void)state;

	assert_non_null(a);
	assert_non_null(b);
	KV_TC_EXPECT(&tc, 0, kv_tc_spread(&tc, "st/", N, idx, 3));
	/* Client A learns the configuration of this epoch by using it. */
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(a, "st/", N, 1, VLEN, msg, sizeof(msg)));
	KV_TC_ASSERT(&tc, kv_tc_verify(a, "st/", N, 1, VLEN, msg, sizeof(msg)) == 0, "%s", msg);
	shardkv_config *before = kv_tc_config(&tc);
	assert_non_null(before);

	/* Four moves through another client: every key changes owner, some
	 * twice. */
	kv_tc_node_arg(&tc, 0, n1, sizeof(n1));
	kv_tc_node_arg(&tc, 1, n2, sizeof(n2));
	kv_tc_node_arg(&tc, 2, n3, sizeof(n3));
	KV_TC_EXPECT(&tc, 0,
	             shardkv_move(b, "st/000000", 9, "st/001000", 9, n2, 0, SHARDKV_WAIT, NULL));
	KV_TC_EXPECT(&tc, 0,
	             shardkv_move(b, "st/001000", 9, "st/002000", 9, n3, 0, SHARDKV_WAIT, NULL));
	KV_TC_EXPECT(&tc, 0, shardkv_move(b, "st/002000", 9, "st0", 3, n1, 0, SHARDKV_WAIT, NULL));
	KV_TC_EXPECT(&tc, 0,
	             shardkv_move(b, "st/000500", 9, "st/001500", 9, n1, 0, SHARDKV_WAIT, NULL));
	shardkv_config *after = kv_tc_config(&tc);
	assert_non_null(after);
	KV_TC_ASSERT(&tc, after->epoch >= before->epoch + 4, "epochs %llu -> %llu",
	             (unsigned long long)before->epoch, (unsigned long long)after->epoch);
	shardkv_config_free(before);
	shardkv_config_free(after);

	/* A, still on the old configuration, reads every key (single gets on
	 * a sample first, so that each moved slice is met by a single-key op
	 * before any batch), then batches, then overwrites and reads back. */
	for (unsigned i = 0; i < N; i += 97) {
		char k[32], want[64];
		kv_tc_key(k, sizeof(k), "st/", i);
		kv_tc_value(want, sizeof(want), 1, i, VLEN);
		check_reads_back(a, "stale client", k, want, 0);
	}
	long bad = kv_tc_verify(a, "st/", N, 1, VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "stale client: %ld keys wrong: %s", bad, msg);
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(a, "st/", N, 2, VLEN, msg, sizeof(msg)));
	bad = kv_tc_verify(b, "st/", N, 2, VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "fresh client after the stale client's writes: %ld: %s", bad,
	             msg);
	shardkv_scan_result *sr = NULL;
	KV_TC_EXPECT(&tc, 0, shardkv_keys(a, "st/", 3, &sr));
	assert_int_equal(sr->n, N);
	shardkv_scan_result_free(sr);
	shardkv_close(a);
	shardkv_close(b);
}

static void
a_stale_client_first_meets_the_moves_with_a_batch(void **state)
{
	enum { N = 2000, VLEN = 40 };
	shardkv_client *a = kv_tc_client(&tc, true, 15000);
	int idx[3] = {0, 1, 2};
	char msg[512], n1[16], n2[16], n3[16];
	(void)state;

	assert_non_null(a);
	KV_TC_EXPECT(&tc, 0, kv_tc_spread(&tc, "sb/", N, idx, 3));
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(a, "sb/", N, 1, VLEN, msg, sizeof(msg)));
	kv_tc_node_arg(&tc, 0, n1, sizeof(n1));
	kv_tc_node_arg(&tc, 1, n2, sizeof(n2));
	kv_tc_node_arg(&tc, 2, n3, sizeof(n3));
	/* Rotate the three slices twice: six epochs of moves. */
	const char *cut[4] = {"sb/000000", "sb/000666", "sb/001333", "sb0"};
	const char *to[2][3] = {{n2, n3, n1}, {n3, n1, n2}};
	for (int round = 0; round < 2; round++)
		for (int j = 0; j < 3; j++)
			KV_TC_EXPECT(&tc, 0,
			             shardkv_move(tc.admin, cut[j], strlen(cut[j]), cut[j + 1],
			                          strlen(cut[j + 1]), to[round][j], 0, SHARDKV_WAIT,
			                          NULL));
	/* The first thing A does is a batch write over all of them. */
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(a, "sb/", N, 2, VLEN, msg, sizeof(msg)));
	long bad = kv_tc_verify(a, "sb/", N, 2, VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "stale client: %ld keys wrong: %s", bad, msg);
	shardkv_close(a);
}

static void
a_move_with_a_rate_limit_copies_no_faster_than_the_limit(void **state)
{
	enum { N = 3000, VLEN = 1000, RATE_MB_S = 2 };
	shardkv_client *cl = kv_tc_client(&tc, false, 15000);
	shardkv_admin_result ar;
	int idx[1] = {0};
	char msg[512], n2[16];
	(void)state;

	assert_non_null(cl);
	/* About 3 MB on server 1, moved to server 2 at 2 MB/s: at least a
	 * second and a half; accept anything from a second. */
	KV_TC_EXPECT(&tc, 0, kv_tc_spread(&tc, "rt/", N, idx, 1));
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(cl, "rt/", N, 1, VLEN, msg, sizeof(msg)));
	kv_tc_node_arg(&tc, 1, n2, sizeof(n2));
	uint64_t t0 = kv_test_now_ms();
	KV_TC_EXPECT(&tc, 0,
	             shardkv_move(tc.admin, "rt/", 3, "rt0", 3, n2, RATE_MB_S, SHARDKV_WAIT, &ar));
	uint64_t took = kv_test_now_ms() - t0;
	assert_int_equal(ar.nmigrations, 1);
	long bad = kv_tc_verify(cl, "rt/", N, 1, VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld keys wrong after the move: %s", bad, msg);
	KV_TC_ASSERT(&tc, took >= 1000,
	             "%u keys of %u bytes moved in %llu ms with a limit of %u MB/s: the rate "
	             "limit is not applied",
	             N, VLEN, (unsigned long long)took, RATE_MB_S);
	shardkv_close(cl);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(
	        a_write_acknowledged_after_a_move_is_never_replaced_by_the_old_value, setup2,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        a_client_stale_by_several_epochs_reads_and_writes_every_key, setup3, teardown),
	    cmocka_unit_test_setup_teardown(a_stale_client_first_meets_the_moves_with_a_batch,
	                                    setup3, teardown),
	    cmocka_unit_test_setup_teardown(
	        a_move_with_a_rate_limit_copies_no_faster_than_the_limit, setup2, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
