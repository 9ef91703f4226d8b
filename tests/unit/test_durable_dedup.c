/*
 * test_durable_dedup.c - the exactly-once memory survives a restart with
 * what each write answered: a delete's returned value comes back from the
 * log and from a snapshot, so a retry after a crash gets the same answer
 * (shardserver/durable/durable.h, shardserver/dedup/dedup.h); a range
 * delete takes the range's exactly-once entries with it (a retry of one
 * is then refused, not applied again), and a copy brings its source's floors.
 */
#include "common/err.h"
#include "shardserver/dedup/dedup.h"
#include "shardserver/durable/durable.h"
#include "shardserver/store/store.h"
#include "tests/support/testutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* A store, an exactly-once memory and the log over one data dir. */
typedef struct {
	kv_store *store;
	kv_dedup *dedup;
	kv_dur *dur;
} node;

static void
node_open(node *n, const char *dir)
{
	kv_dur_opts o = {.dir = dir, .mode = KV_FSYNC_NONE};
	kv_dur_report rep;
	char err[256];

	memset(n, 0, sizeof(*n));
	assert_int_equal(kv_store_create(NULL, &n->store), KV_OK);
	assert_non_null(n->dedup = kv_dedup_create(0, 0, 0));
	o.store = n->store;
	o.dedup = n->dedup;
	assert_int_equal(kv_dur_open(&o, &n->dur, &rep, err, sizeof(err)), KV_OK);
}

static void
node_close(node *n)
{
	kv_dur_close(n->dur);
	kv_dedup_destroy(n->dedup);
	kv_store_destroy(n->store);
}

/* Applies and logs `del key` from (client 7, request req) as the server
 * does: the store first, then the record with the value it returned. */
static void
logged_del(node *n, const char *key, uint64_t req)
{
	kv_buf old = {0};
	kv_dedup_result out;

	assert_int_equal(kv_dedup_begin(n->dedup, 7, req, true, 1000, &out), KV_ENOTFOUND);
	assert_int_equal(kv_store_del(n->store, key, strlen(key), &old), KV_OK);
	kv_dur_dedup dd = {.client = 7,
	                   .req = req,
	                   .time_ms = 1000,
	                   .has_del_value = old.len <= KV_DEDUP_MAX_VALUE,
	                   .del_value = {old.data, old.len}};
	kv_dur_begin(n->dur);
	assert_int_equal(kv_dur_log_del(n->dur, key, strlen(key), &dd, NULL, NULL), KV_OK);
	kv_dur_end(n->dur);
	kv_dedup_result r = {.has_value = dd.has_del_value, .value = old};
	kv_dedup_finish(n->dedup, 7, req, &r, key, strlen(key), 1000);
	kv_buf_fini(&old);
}

static void
logged_put(node *n, const char *key, const void *val, size_t vlen)
{
	assert_int_equal(kv_store_put(n->store, key, strlen(key), val, vlen), KV_OK);
	kv_dur_begin(n->dur);
	assert_int_equal(kv_dur_log_put(n->dur, key, strlen(key), val, vlen, NULL, NULL, NULL),
	                 KV_OK);
	kv_dur_end(n->dur);
}

/* The remembered answer of (client 7, req): 0 and has_value/value. */
static kv_dedup_result
remembered(node *n, uint64_t req)
{
	kv_dedup_result out;
	memset(&out, 0, sizeof(out));
	assert_int_equal(kv_dedup_begin(n->dedup, 7, req, true, 2000, &out), 0);
	return out;
}

/* (client, req) is held with the value length `vlen` it answered. */
static void
assert_held(node *n, uint64_t client, uint64_t req, uint64_t vlen)
{
	kv_dedup_result r;
	assert_int_equal(kv_dedup_begin(n->dedup, client, req, true, 1000, &r), 0);
	assert_int_equal(r.value_len, vlen);
	kv_buf_fini(&r.value);
}

/* Deletes of a short, an empty and a too-long value, then a restart;
 * snap: with a snapshot taken before the restart. */
static void
restart_keeps_deleted_values(const char *dir, bool snap)
{
	static uint8_t big[KV_DEDUP_MAX_VALUE + 1];
	node n;

	node_open(&n, dir);
	logged_put(&n, "a", "v17", 3);
	logged_put(&n, "b", "", 0);
	logged_put(&n, "c", big, sizeof(big));
	logged_del(&n, "a", 1);
	logged_del(&n, "b", 2);
	logged_del(&n, "c", 3);
	if (snap)
		assert_int_equal(kv_dur_snapshot(n.dur), KV_OK);
	node_close(&n);

	node_open(&n, dir);
	kv_dedup_result r = remembered(&n, 1);
	assert_true(r.has_value);
	assert_int_equal(r.value.len, 3);
	assert_memory_equal(r.value.data, "v17", 3);
	kv_buf_fini(&r.value);
	r = remembered(&n, 2);
	assert_true(r.has_value); /* an empty value is a value */
	assert_int_equal(r.value.len, 0);
	kv_buf_fini(&r.value);
	r = remembered(&n, 3);
	assert_false(r.has_value); /* over the bound: applied, value not kept */
	kv_buf_fini(&r.value);
	node_close(&n);
}

static void
a_deleted_value_comes_back_from_the_log(void **state)
{
	const kv_test_dir *d = *state;
	restart_keeps_deleted_values(d->path, false);
}

static void
a_deleted_value_comes_back_from_a_snapshot(void **state)
{
	const kv_test_dir *d = *state;
	restart_keeps_deleted_values(d->path, true);
}

/* Applies and logs the record in b as a replica does, then empties b. */
static void
apply_rec(node *n, kv_buf *b)
{
	assert_int_equal(kv_dur_apply_record(n->dur, b->data, b->len, NULL), KV_OK);
	b->len = 0;
}

/* A backup applies a batch's records together (kv_dur_apply_records):
 * those before a malformed one are applied and logged, with consecutive
 * local lsns, and come back after a restart; the malformed one and those
 * after it are not applied. */
static void
records_applied_together_stop_at_a_malformed_one(void **state)
{
	const kv_test_dir *d = *state;
	kv_buf b[4] = {{0}};
	kv_bytes recs[4];
	kv_buf v = {0};
	size_t done = 99;
	uint64_t last = 0, before = 0;
	node n;

	node_open(&n, d->path);
	assert_int_equal(kv_dur_rec_put(&b[0], "a", 1, "va", 2), KV_OK);
	assert_int_equal(kv_dur_rec_put(&b[1], "b", 1, "vb", 2), KV_OK);
	assert_int_equal(kv_buf_append(&b[2], "\x7f\x00", 2), KV_OK); /* no such type */
	assert_int_equal(kv_dur_rec_put(&b[3], "c", 1, "vc", 2), KV_OK);
	for (int i = 0; i < 4; i++)
		recs[i] = (kv_bytes){b[i].data, b[i].len};
	kv_dur_begin(n.dur);
	assert_int_equal(kv_dur_apply_records(n.dur, recs, 2, &done, &before), KV_OK);
	assert_int_equal(done, 2);
	assert_int_equal(kv_dur_apply_records(n.dur, recs, 4, &done, &last), KV_ECORRUPT);
	kv_dur_end(n.dur);
	assert_int_equal(done, 2);
	assert_int_equal(last, before + 2);
	for (int pass = 0; pass < 2; pass++) {
		/* live, then after a restart from the log */
		assert_int_equal(kv_store_get(n.store, "b", 1, &v), KV_OK);
		assert_memory_equal(v.data, "vb", 2);
		kv_buf_fini(&v);
		assert_int_equal(kv_store_get(n.store, "c", 1, &v), KV_ENOTFOUND);
		node_close(&n);
		if (pass == 0)
			node_open(&n, d->path);
	}
	for (int i = 0; i < 4; i++)
		kv_buf_fini(&b[i]);
}

/* What a replica does with a copy (doc/replication.md "Catch-up"): records
 * built by kv_dur_rec_* and applied with kv_dur_apply_record. The range
 * delete takes the range's exactly-once entries with it (a retry of one
 * is then refused, not applied again), and a copy brings its source's floors. keys; the copy's
 * own entries come after it; entries outside the range stay. */
static void
a_copied_range_replaces_its_exactly_once_entries(void **state)
{
	const kv_test_dir *d = *state;
	kv_dur_dedup in = {.client = 7, .req = 1, .value_len = 3, .time_ms = 5};
	kv_dur_dedup out = {.client = 7, .req = 2, .value_len = 4, .time_ms = 5};
	kv_dur_dedup copied = {.client = 8, .req = 3, .value_len = 5, .time_ms = 6};
	kv_dedup_result r;
	kv_buf b = {0}, v = {0};
	node n;

	(void)d;
	node_open(&n, d->path);
	assert_int_equal(kv_dur_rec_dedup(&b, &in, KV_OK, "k", 1), KV_OK);
	apply_rec(&n, &b);
	assert_int_equal(kv_dur_rec_dedup(&b, &out, KV_OK, "z", 1), KV_OK);
	apply_rec(&n, &b);
	assert_int_equal(kv_dur_rec_put(&b, "k", 1, "old", 3), KV_OK);
	apply_rec(&n, &b);
	/* The copy of [a, m): drop, then its own entry and key. */
	assert_int_equal(kv_dur_rec_range_del(&b, "a", 1, "m", 1), KV_OK);
	apply_rec(&n, &b);
	assert_int_equal(kv_dur_rec_dedup(&b, &copied, KV_OK, "c", 1), KV_OK);
	apply_rec(&n, &b);
	assert_int_equal(kv_dur_rec_put(&b, "c", 1, "new", 3), KV_OK);
	apply_rec(&n, &b);
	/* ... and the floor of a client its source had forgotten writes of. */
	assert_int_equal(kv_dur_rec_floor(&b, 9, 50, 6), KV_OK);
	apply_rec(&n, &b);
	kv_buf_fini(&b);
	for (int pass = 0; pass < 2; pass++) {
		/* Live, then after a restart from the log. The dropped entry's
		 * write may have been applied and the copy did not bring it: a
		 * retry is refused, not applied again; a first attempt is new. */
		assert_int_equal(kv_dedup_begin(n.dedup, 7, 1, true, 1000, &r), KV_ESTALE);
		assert_int_equal(kv_dedup_begin(n.dedup, 7, 1, false, 1000, &r), KV_ENOTFOUND);
		kv_dedup_abort(n.dedup, 7, 1);
		/* The copied floor: retries at or below it are refused. */
		assert_int_equal(kv_dedup_begin(n.dedup, 9, 50, true, 1000, &r), KV_ESTALE);
		assert_int_equal(kv_dedup_begin(n.dedup, 9, 51, true, 1000, &r), KV_ENOTFOUND);
		kv_dedup_abort(n.dedup, 9, 51);
		assert_held(&n, 7, 2, 4);
		assert_held(&n, 8, 3, 5);
		assert_int_equal(kv_store_get(n.store, "k", 1, &v), KV_ENOTFOUND);
		assert_int_equal(kv_store_get(n.store, "c", 1, &v), KV_OK);
		assert_memory_equal(v.data, "new", 3);
		kv_buf_fini(&v);
		node_close(&n);
		if (pass == 0)
			node_open(&n, d->path);
	}
}

/* The same records as a backup applies a batch (kv_dur_apply_records,
 * whose exactly-once results go into the memory together): an entry
 * applied before a range delete in the same batch is forgotten with the
 * range, one after it is kept, and entries of several clients interleaved
 * each land, live and after a restart from the log. */
static void
a_batch_forgets_the_entries_before_its_range_delete_and_keeps_those_after(void **state)
{
	const kv_test_dir *d = *state;
	kv_dur_dedup in = {.client = 7, .req = 1, .value_len = 3, .time_ms = 5};
	kv_dur_dedup out = {.client = 8, .req = 2, .value_len = 4, .time_ms = 5};
	kv_dur_dedup other = {.client = 7, .req = 4, .value_len = 6, .time_ms = 5};
	kv_dur_dedup copied = {.client = 7, .req = 3, .value_len = 5, .time_ms = 6};
	kv_dedup_result r;
	kv_buf b[6] = {{0}};
	kv_bytes recs[6];
	size_t done = 0;
	uint64_t last = 0;
	node n;

	node_open(&n, d->path);
	assert_int_equal(kv_dur_rec_dedup(&b[0], &in, KV_OK, "k", 1), KV_OK);
	assert_int_equal(kv_dur_rec_dedup(&b[1], &out, KV_OK, "z", 1), KV_OK);
	assert_int_equal(kv_dur_rec_dedup(&b[2], &other, KV_OK, "y", 1), KV_OK);
	assert_int_equal(kv_dur_rec_range_del(&b[3], "a", 1, "m", 1), KV_OK);
	assert_int_equal(kv_dur_rec_dedup(&b[4], &copied, KV_OK, "c", 1), KV_OK);
	assert_int_equal(kv_dur_rec_floor(&b[5], 9, 50, 6), KV_OK);
	for (int i = 0; i < 6; i++)
		recs[i] = (kv_bytes){b[i].data, b[i].len};
	kv_dur_begin(n.dur);
	assert_int_equal(kv_dur_apply_records(n.dur, recs, 6, &done, &last), KV_OK);
	kv_dur_end(n.dur);
	assert_int_equal(done, 6);
	for (int pass = 0; pass < 2; pass++) {
		/* (7, 1) was in [a, m) when the range went: refused, not held. */
		assert_int_equal(kv_dedup_begin(n.dedup, 7, 1, true, 1000, &r), KV_ESTALE);
		assert_held(&n, 8, 2, 4);
		assert_held(&n, 7, 4, 6);
		assert_held(&n, 7, 3, 5);
		assert_int_equal(kv_dedup_begin(n.dedup, 9, 50, true, 1000, &r), KV_ESTALE);
		node_close(&n);
		if (pass == 0)
			node_open(&n, d->path);
	}
	for (int i = 0; i < 6; i++)
		kv_buf_fini(&b[i]);
}

/* A client's floor (a copy's, a transfer's, or a range forgotten here)
 * survives a snapshot that covers the record that raised it, and a
 * restart from that snapshot: a retry at or below it is still refused. */
static void
a_floor_comes_back_from_a_snapshot(void **state)
{
	const kv_test_dir *d = *state;
	kv_dedup_result r;
	kv_buf b = {0};
	node n;

	node_open(&n, d->path);
	assert_int_equal(kv_dur_rec_floor(&b, 9, 50, 6), KV_OK);
	apply_rec(&n, &b);
	kv_buf_fini(&b);
	/* A range forgotten here raises client 7's floor to its entry's id. */
	logged_put(&n, "a", "v", 1);
	logged_del(&n, "a", 40);
	kv_dedup_forget_range(n.dedup, "a", 1, "b", 1);
	assert_int_equal(kv_dur_snapshot(n.dur), KV_OK);
	node_close(&n);

	node_open(&n, d->path);
	assert_int_equal(kv_dedup_begin(n.dedup, 9, 50, true, 1000, &r), KV_ESTALE);
	assert_int_equal(kv_dedup_begin(n.dedup, 9, 51, true, 1000, &r), KV_ENOTFOUND);
	kv_dedup_abort(n.dedup, 9, 51);
	assert_int_equal(kv_dedup_begin(n.dedup, 7, 40, true, 1000, &r), KV_ESTALE);
	assert_int_equal(kv_dedup_begin(n.dedup, 7, 41, true, 1000, &r), KV_ENOTFOUND);
	kv_dedup_abort(n.dedup, 7, 41);
	node_close(&n);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(a_deleted_value_comes_back_from_the_log,
	                                    kv_test_dir_setup, kv_test_dir_teardown),
	    cmocka_unit_test_setup_teardown(a_deleted_value_comes_back_from_a_snapshot,
	                                    kv_test_dir_setup, kv_test_dir_teardown),
	    cmocka_unit_test_setup_teardown(a_copied_range_replaces_its_exactly_once_entries,
	                                    kv_test_dir_setup, kv_test_dir_teardown),
	    cmocka_unit_test_setup_teardown(
	        a_batch_forgets_the_entries_before_its_range_delete_and_keeps_those_after,
	        kv_test_dir_setup, kv_test_dir_teardown),
	    cmocka_unit_test_setup_teardown(records_applied_together_stop_at_a_malformed_one,
	                                    kv_test_dir_setup, kv_test_dir_teardown),
	    cmocka_unit_test_setup_teardown(a_floor_comes_back_from_a_snapshot, kv_test_dir_setup,
	                                    kv_test_dir_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
