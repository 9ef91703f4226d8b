/*
 * test_durable_expiry.c - a key's deadline survives a restart through the
 * log and through a snapshot, a put without one clears it, a range-delete
 * step (MDEL record) comes back with its exactly-once entry, records written
 * before expiry existed read as before, and malformed expiry flags are
 * refused (shardserver/durable/durable.h, doc/durability.md).
 */
#include "common/bytes.h"
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

/* Far enough ahead of the real clock to stay live during the test. */
#define LATER (4102444800000ull) /* 2100-01-01, Unix ms */

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

static void
put_at(node *n, const char *k, const char *v, uint64_t at)
{
	assert_int_equal(kv_store_put_x(n->store, k, strlen(k), v, strlen(v), at), KV_OK);
	kv_dur_begin(n->dur);
	assert_int_equal(kv_dur_log_put_x(n->dur, k, strlen(k), v, strlen(v), at, NULL, NULL, NULL),
	                 KV_OK);
	kv_dur_end(n->dur);
}

static uint64_t
deadline(node *n, const char *k)
{
	uint64_t at = 1;
	assert_int_equal(kv_store_get_x(n->store, k, strlen(k), NULL, &at), KV_OK);
	return at;
}

static void
write_some(node *n)
{
	kv_bytes keys[2] = {{(const uint8_t *)"m1", 2}, {(const uint8_t *)"m2", 2}};
	kv_bytes vals[2] = {{(const uint8_t *)"a", 1}, {(const uint8_t *)"b", 1}};
	kv_bytes gone[2] = {{(const uint8_t *)"d1", 2}, {(const uint8_t *)"d2", 2}};
	kv_dur_dedup dd = {.client = 9,
	                   .req = 4,
	                   .value_len = 2,
	                   .time_ms = 1000,
	                   .has_del_value = true,
	                   .del_value = {(const uint8_t *)"d2\0", 3}};

	put_at(n, "e", "v", LATER);
	put_at(n, "plain", "v", 0);
	put_at(n, "cleared", "v", LATER + 1);
	put_at(n, "cleared", "w", 0);
	put_at(n, "d1", "x", 0);
	put_at(n, "d2", "x", LATER);
	assert_int_equal(kv_store_mput_x(n->store, 2, keys, 2, vals, LATER + 2), KV_OK);
	kv_dur_begin(n->dur);
	assert_int_equal(kv_dur_log_mput_x(n->dur, 2, keys, vals, LATER + 2, NULL, NULL, NULL),
	                 KV_OK);
	kv_dur_end(n->dur);
	/* A delrange step of d1, d2 with its exactly-once entry. */
	for (int i = 0; i < 2; i++)
		assert_int_equal(kv_store_del(n->store, gone[i].p, gone[i].len, NULL), KV_OK);
	kv_dur_begin(n->dur);
	assert_int_equal(
	    kv_dur_log_mdel(n->dur, (kv_bytes){(const uint8_t *)"d", 1}, 2, gone, &dd, NULL, NULL),
	    KV_OK);
	kv_dur_end(n->dur);
	/* ... and remembered, as the server does once it has logged. */
	kv_dedup_result r = {
	    .value_len = 2, .has_value = true, .value = {.data = (uint8_t *)"d2\0", .len = 3}};
	assert_int_equal(kv_dedup_insert(n->dedup, 9, 4, &r, "d", 1, 1000), KV_OK);
}

static void
check_all(node *n)
{
	kv_dedup_result out;
	kv_buf v = {0};

	assert_int_equal(deadline(n, "e"), LATER);
	assert_int_equal(deadline(n, "plain"), 0);
	assert_int_equal(deadline(n, "cleared"), 0);
	assert_int_equal(deadline(n, "m1"), LATER + 2);
	assert_int_equal(deadline(n, "m2"), LATER + 2);
	assert_int_equal(kv_store_get(n->store, "d1", 2, &v), KV_ENOTFOUND);
	assert_int_equal(kv_store_get(n->store, "d2", 2, &v), KV_ENOTFOUND);
	kv_store_stats st;
	kv_store_get_stats(n->store, &st);
	assert_int_equal(st.keys, 5);
	assert_int_equal(st.expiring, 3);
	memset(&out, 0, sizeof(out));
	assert_int_equal(kv_dedup_begin(n->dedup, 9, 4, true, 2000, &out), 0);
	assert_int_equal(out.value_len, 2);
	assert_true(out.has_value);
	assert_int_equal(out.value.len, 3);
	kv_buf_fini(&out.value);
	kv_buf_fini(&v);
}

static void
deadlines_come_back_from_the_log(void **state)
{
	const kv_test_dir *d = *state;
	node n;

	node_open(&n, d->path);
	write_some(&n);
	node_close(&n);
	node_open(&n, d->path);
	check_all(&n);
	node_close(&n);
}

static void
deadlines_come_back_from_a_snapshot(void **state)
{
	const kv_test_dir *d = *state;
	node n;

	node_open(&n, d->path);
	write_some(&n);
	assert_int_equal(kv_dur_snapshot(n.dur), KV_OK);
	node_close(&n);
	node_open(&n, d->path);
	check_all(&n);
	/* Again from the snapshot this node writes. */
	assert_int_equal(kv_dur_snapshot(n.dur), KV_OK);
	node_close(&n);
	node_open(&n, d->path);
	assert_int_equal(deadline(&n, "e"), LATER);
	node_close(&n);
}

/* A PUT record as written before expiry existed: type 1, flags 0. */
static size_t
old_put(uint8_t *p, const char *k, const char *v)
{
	size_t kl = strlen(k), vl = strlen(v), n = 0;
	p[n++] = 1;
	p[n++] = 0;
	kv_put32(p + n, (uint32_t)kl);
	memcpy(p + n + 4, k, kl);
	n += 4 + kl;
	kv_put32(p + n, (uint32_t)vl);
	memcpy(p + n + 4, v, vl);
	return n + 4 + vl;
}

static void
old_records_read_as_before_and_bad_expiry_flags_are_refused(void **state)
{
	kv_store *s = NULL;
	kv_dedup *dd = kv_dedup_create(0, 0, 0);
	kv_buf rec = {0};
	uint8_t p[64];
	size_t n;

	(void)state;
	assert_non_null(dd);
	assert_int_equal(kv_store_create(NULL, &s), KV_OK);
	assert_int_equal(kv_dur_rec_put_x(&rec, "k", 1, "v", 1, LATER), KV_OK);
	assert_int_equal(kv_dur_replay_record_for_test(s, dd, rec.data, rec.len), KV_OK);
	uint64_t at = 0;
	assert_int_equal(kv_store_get_x(s, "k", 1, NULL, &at), KV_OK);
	assert_int_equal(at, LATER);
	/* An old PUT: the key is now v with no deadline. */
	n = old_put(p, "k", "w");
	assert_int_equal(kv_dur_replay_record_for_test(s, dd, p, n), KV_OK);
	assert_int_equal(kv_store_get_x(s, "k", 1, NULL, &at), KV_OK);
	assert_int_equal(at, 0);
	/* The expiry flag on a PUT without the deadline's bytes. */
	p[1] = 0x04;
	assert_int_equal(kv_dur_replay_record_for_test(s, dd, p, n), KV_ECORRUPT);
	/* A zero deadline, an unknown flag, the flag on a DEL. */
	memcpy(p, rec.data, rec.len);
	memset(p + 2, 0, 8);
	assert_int_equal(kv_dur_replay_record_for_test(s, dd, p, rec.len), KV_ECORRUPT);
	memcpy(p, rec.data, rec.len);
	p[1] = 0x08;
	assert_int_equal(kv_dur_replay_record_for_test(s, dd, p, rec.len), KV_ECORRUPT);
	p[0] = 2;
	p[1] = 0x04;
	assert_int_equal(kv_dur_replay_record_for_test(s, dd, p, rec.len), KV_ECORRUPT);
	/* An MDEL with a count larger than the record. */
	uint8_t m[16] = {6, 0};
	kv_put32(m + 2, 0);
	kv_put32(m + 6, 1000);
	assert_int_equal(kv_dur_replay_record_for_test(s, dd, m, 10), KV_ECORRUPT);
	kv_buf_fini(&rec);
	kv_store_destroy(s);
	kv_dedup_destroy(dd);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(deadlines_come_back_from_the_log, kv_test_dir_setup,
	                                    kv_test_dir_teardown),
	    cmocka_unit_test_setup_teardown(deadlines_come_back_from_a_snapshot, kv_test_dir_setup,
	                                    kv_test_dir_teardown),
	    cmocka_unit_test(old_records_read_as_before_and_bad_expiry_flags_are_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
