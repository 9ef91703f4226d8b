/*
 * test_cluster_dedup.c - exactly-once across a migration, with real
 * daemons: a write sent with a fixed (client id, request id) straight to the
 * key's owner, then replayed byte for byte to the new owner after the key's
 * range moved, is answered with the remembered result and not applied
 * again. Twice: the first attempt before the move, and the first attempt
 * while the range is being copied (for a key already copied, whose write
 * travels as a delta, and for one not yet copied, which travels in a chunk),
 * the retry after the commit.
 *
 * The requests bypass libshardkv (kv_tc_raw_op), which would otherwise pick
 * its own ids and route by itself.
 */
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <inttypes.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define RAW_MS 10000u /* one raw request */

static kv_tc tc;

static int
setup2(void **state)
{
	(void)state;
	/* One copy on purpose: the exactly-once memory must travel with a
	 * migration, which a move starts only with one copy per range (with
	 * replicas the memory is in every replica's log: doc/replication.md). */
	return kv_tc_start_one_copy(&tc, "cluster-dedup", 2);
}

static int
teardown(void **state)
{
	(void)state;
	kv_tc_destroy(&tc);
	return 0;
}

/* Sends one append of `tok` to `key` as (client, req) to server i and
 * returns the answer; fails the test unless that server answered OK. (Not
 * routed by the configuration: while a range moves, the map already names
 * the destination, but the source serves it until the commit.) */
static kv_tc_raw_result
append_at(int i, const char *what, const char *key, uint64_t client, uint64_t req, const char *tok)
{
	kv_tc_raw_result r;
	int rv = kv_tc_raw_op(tc.srv[i].url, client, req, KV_TC_RAW_APPEND, key, strlen(key), tok,
	                      strlen(tok), RAW_MS, &r);

	KV_TC_ASSERT(&tc, rv == 0, "%s: append to %s at %s: %s", what, key, tc.srv[i].url,
	             shardkv_strerror(rv));
	KV_TC_ASSERT(&tc, r.status == 0 && r.node_id == tc.srv[i].id,
	             "%s: append to %s: %s from node %u (want node %u; hint node %u)", what, key,
	             shardkv_strerror(r.status), r.node_id, tc.srv[i].id, r.hint_node);
	return r;
}

/* Fails unless the latest configuration gives key to server i. */
static void
check_owner(const char *what, const char *key, int i)
{
	shardkv_config *cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	uint32_t o = kv_tc_owner(cfg, key, strlen(key));
	shardkv_config_free(cfg);
	KV_TC_ASSERT(&tc, o == tc.srv[i].id, "%s: %s is on node %u, want node %u", what, key, o,
	             tc.srv[i].id);
}

/* Counts the occurrences of tok in v. */
static unsigned
occurrences(const shardkv_buf *v, const char *tok)
{
	size_t tl = strlen(tok);
	unsigned n = 0;

	for (size_t i = 0; i + tl <= v->len; i++)
		n += memcmp(v->data + i, tok, tl) == 0;
	return n;
}

/* Fails unless key reads (through the library) as exactly `want`. */
static void
check_value(const char *what, const char *key, const char *want, const char *tok)
{
	shardkv_buf v = {0};
	int rv = shardkv_get(tc.admin, key, strlen(key), &v);

	KV_TC_ASSERT(&tc, rv == 0, "%s: get %s: %s (%s)", what, key, shardkv_strerror(rv),
	             shardkv_errmsg());
	bool ok = v.len == strlen(want) && memcmp(v.data, want, v.len) == 0;
	unsigned n = occurrences(&v, tok);
	if (!ok || n != 1) {
		char got[160];
		snprintf(got, sizeof(got), "%.*s", (int)(v.len < 150 ? v.len : 150),
		         (const char *)v.data);
		shardkv_free(v.data);
		kv_tc_dump_logs(&tc, 40);
		fail_msg("%s: %s = '%s' (token %s %u times), want '%s'", what, key, got, tok, n,
		         want);
	}
	shardkv_free(v.data);
}

static void
a_retry_after_a_move_is_answered_from_memory_by_the_new_owner(void **state)
{
	const uint64_t client = 0x5eed0000c11e0001ull, req = 41;
	const char *key = "dd/key", *tok = "<tok-41>";
	int idx[1] = {0};
	char n2[16];
	(void)state;

	KV_TC_EXPECT(&tc, 0, kv_tc_spread(&tc, "dd/", 1, idx, 1));
	KV_TC_EXPECT(&tc, 0, shardkv_put(tc.admin, key, strlen(key), "base:", 5));

	/* The first attempt, on node 1. */
	check_owner("before the move", key, 0);
	kv_tc_raw_result r = append_at(0, "first attempt", key, client, req, tok);
	const uint64_t len1 = r.value_len;
	assert_int_equal(len1, 5 + strlen(tok));
	kv_tc_raw_free(&r);

	/* The range moves to node 2 (--wait: the move has committed). */
	kv_tc_node_arg(&tc, 1, n2, sizeof(n2));
	KV_TC_EXPECT(&tc, 0, shardkv_move(tc.admin, "dd/", 3, "dd0", 3, n2, 0, SHARDKV_WAIT, NULL));

	/* The old owner no longer takes it: it names the new one. */
	char old_url[64];
	snprintf(old_url, sizeof(old_url), "%s", tc.srv[0].url);
	KV_TC_EXPECT(&tc, 0,
	             kv_tc_raw_op(old_url, client, req, KV_TC_RAW_APPEND, key, strlen(key), tok,
	                          strlen(tok), RAW_MS, &r));
	KV_TC_ASSERT(&tc, r.status == SHARDKV_EWRONGOWNER && r.hint_node == tc.srv[1].id,
	             "the old owner answered %s (hint node %u)", shardkv_strerror(r.status),
	             r.hint_node);
	kv_tc_raw_free(&r);

	/* The identical retry, on node 2: the remembered result, not a second
	 * append. */
	check_owner("after the move", key, 1);
	r = append_at(1, "retry after the move", key, client, req, tok);
	KV_TC_ASSERT(&tc, r.value_len == len1,
	             "the retry was applied again: length %" PRIu64 ", first attempt %" PRIu64,
	             r.value_len, len1);
	kv_tc_raw_free(&r);
	char want[64];
	snprintf(want, sizeof(want), "base:%s", tok);
	check_value("after the retry", key, want, tok);

	/* A new request id from the same client is a new write. */
	r = append_at(1, "new request", key, client, req + 1, "+");
	assert_int_equal(r.value_len, len1 + 1);
	kv_tc_raw_free(&r);
}

static void
a_write_made_during_the_copy_is_applied_once_when_retried_after_the_commit(void **state)
{
	enum { N = 4000, VLEN = 1000, RATE_MB_S = 1 };
	const uint64_t client = 0x5eed0000c11e0002ull;
	/* First key: copied before the write (it travels as a delta). Last key:
	 * not copied yet (the write travels in a chunk). */
	const char *keys[2] = {"de/000000", "de/003999"};
	const char *toks[2] = {"<tok-early>", "<tok-late>"};
	const uint64_t reqs[2] = {7, 8};
	uint64_t len1[2];
	int idx[1] = {0};
	char msg[512], n2[16], want[2][1100];
	shardkv_admin_result ar;
	(void)state;

	/* About 4 MB on node 1, moved to node 2 at 1 MB/s. */
	KV_TC_EXPECT(&tc, 0, kv_tc_spread(&tc, "de/", N, idx, 1));
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(tc.admin, "de/", N, 1, VLEN, msg, sizeof(msg)));
	kv_tc_node_arg(&tc, 1, n2, sizeof(n2));
	KV_TC_EXPECT(&tc, 0, shardkv_move(tc.admin, "de/", 3, "de0", 3, n2, RATE_MB_S, 0, &ar));
	assert_int_equal(ar.nmigrations, 1);
	KV_TC_ASSERT(
	    &tc,
	    kv_tc_wait_migration(&tc, ar.first_mig_id, "copying", 1, KV_TC_READY_MS, NULL) == 0,
	    "migration %" PRIu64 " never showed progress", ar.first_mig_id);

	/* The first attempts, on node 1 while it copies. */
	for (int i = 0; i < 2; i++) {
		kv_tc_raw_result r = append_at(0, "first attempt during the copy", keys[i], client,
		                               reqs[i], toks[i]);
		len1[i] = r.value_len;
		kv_tc_raw_free(&r);
		unsigned k = (unsigned)strtoul(keys[i] + 3, NULL, 10);
		size_t vl = kv_tc_value(want[i], sizeof(want[i]), 1, k, VLEN);
		snprintf(want[i] + vl, sizeof(want[i]) - vl, "%s", toks[i]);
		assert_int_equal(len1[i], strlen(want[i]));
	}
	/* They really landed before the commit: the migration is still listed
	 * (and a fenced source would have answered MOVING, not OK). */
	shardkv_config *st = NULL;
	bool listed = false;
	KV_TC_EXPECT(&tc, 0, shardkv_status(tc.admin, &st));
	for (size_t i = 0; i < st->nmigrations; i++)
		listed |= st->migrations[i].id == ar.first_mig_id;
	shardkv_config_free(st);
	KV_TC_ASSERT(&tc, listed,
	             "migration %" PRIu64 " had ended when the writes were acknowledged: the "
	             "test proves nothing (raise N)",
	             ar.first_mig_id);

	/* The commit: node 2 owns the range. */
	KV_TC_ASSERT(&tc, kv_tc_wait_settled(&tc, 60000) == 0, "the move did not finish");

	/* The identical retries, on node 2. */
	for (int i = 0; i < 2; i++) {
		check_owner("after the commit", keys[i], 1);
		kv_tc_raw_result r =
		    append_at(1, "retry after the commit", keys[i], client, reqs[i], toks[i]);
		KV_TC_ASSERT(&tc, r.value_len == len1[i],
		             "%s: the retry was applied again: length %" PRIu64
		             ", first attempt %" PRIu64,
		             keys[i], r.value_len, len1[i]);
		kv_tc_raw_free(&r);
		check_value("after the retry", keys[i], want[i], toks[i]);
	}
	/* Every other key arrived unchanged. */
	long bad = kv_tc_verify(tc.admin, "de/", N, 1, VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 2,
	             "%ld keys differ from their first value (want the 2 appended): %s", bad, msg);
}

/* Sends the delete of key as (client, req) to server i; fails unless that
 * server answered OK with the value `want` (not "value unknown"). */
static void
del_answers(int i, const char *what, const char *key, uint64_t client, uint64_t req,
            const char *want)
{
	kv_tc_raw_result r;
	int rv = kv_tc_raw_op(tc.srv[i].url, client, req, KV_TC_RAW_DEL, key, strlen(key), NULL, 0,
	                      RAW_MS, &r);

	KV_TC_ASSERT(&tc, rv == 0, "%s: del %s at %s: %s", what, key, tc.srv[i].url,
	             shardkv_strerror(rv));
	KV_TC_ASSERT(&tc, r.status == 0 && r.node_id == tc.srv[i].id,
	             "%s: del %s: %s from node %u (want node %u)", what, key,
	             shardkv_strerror(r.status), r.node_id, tc.srv[i].id);
	KV_TC_ASSERT(&tc,
	             !r.value_unknown && r.value.len == strlen(want) &&
	                 memcmp(r.value.data, want, r.value.len) == 0,
	             "%s: del %s answered '%.*s'%s, want '%s'", what, key, (int)r.value.len,
	             r.value.data ? (const char *)r.value.data : "",
	             r.value_unknown ? " (value unknown)" : "", want);
	kv_tc_raw_free(&r);
}

static void
a_retried_delete_gets_the_deleted_value_after_a_move_and_a_crash(void **state)
{
	const uint64_t client = 0x5eed0000c11e0003ull, req = 77;
	const char *key = "dl/key", *val = "v-deleted-once";
	int idx[1] = {0};
	char n2[16];
	(void)state;

	KV_TC_EXPECT(&tc, 0, kv_tc_spread(&tc, "dl/", 1, idx, 1));
	KV_TC_EXPECT(&tc, 0, shardkv_put(tc.admin, key, strlen(key), val, strlen(val)));
	check_owner("before the move", key, 0);
	del_answers(0, "first attempt", key, client, req, val);

	/* The answer comes back from the log after a SIGKILL. */
	KV_TC_EXPECT(&tc, 0, kv_tc_stop_server(&tc, 0, SIGKILL, KV_TC_STOP_MS, NULL));
	KV_TC_EXPECT(&tc, 0, kv_tc_restart_server(&tc, 0, false));
	KV_TC_EXPECT(&tc, 0, kv_tc_wait_serving(&tc, 0, KV_TC_READY_MS));
	del_answers(0, "retry after a crash", key, client, req, val);

	/* The exactly-once memory moves with the range. */
	kv_tc_node_arg(&tc, 1, n2, sizeof(n2));
	KV_TC_EXPECT(&tc, 0, shardkv_move(tc.admin, "dl/", 3, "dl0", 3, n2, 0, SHARDKV_WAIT, NULL));
	check_owner("after the move", key, 1);
	del_answers(1, "retry after the move", key, client, req, val);

	/* ... and comes back from the new owner's log after its SIGKILL. */
	KV_TC_EXPECT(&tc, 0, kv_tc_stop_server(&tc, 1, SIGKILL, KV_TC_STOP_MS, NULL));
	KV_TC_EXPECT(&tc, 0, kv_tc_restart_server(&tc, 1, false));
	KV_TC_EXPECT(&tc, 0, kv_tc_wait_serving(&tc, 1, KV_TC_READY_MS));
	del_answers(1, "retry after the new owner's crash", key, client, req, val);

	/* The key is gone: a new delete finds nothing. */
	shardkv_buf v = {0};
	KV_TC_EXPECT(&tc, SHARDKV_ENOTFOUND, shardkv_get(tc.admin, key, strlen(key), &v));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(a_retry_after_a_move_is_answered_from_memory_by_the_new_owner),
	    cmocka_unit_test(
	        a_write_made_during_the_copy_is_applied_once_when_retried_after_the_commit),
	    cmocka_unit_test(a_retried_delete_gets_the_deleted_value_after_a_move_and_a_crash),
	};
	return cmocka_run_group_tests(tests, setup2, teardown);
}
