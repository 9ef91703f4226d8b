/*
 * test_store.c - single-threaded semantics of the local store: single-key and
 * multi-key operations, input validation, statistics, the memory limit and
 * owner-thread tasks, each run in striped and percore mode with one and with
 * several partitions. Ordered reads and range maintenance are in
 * test_store_scan.c, races in test_store_concurrency.c and test_store_append.c.
 */
#include "shardserver/store/arena.h"
#include "shardserver/store/art.h"
#include "tests/support/store_util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FX(state) ((store_fixture *)*(state))

/* Writes the first key "part-<n>" that lies in partition `part`; returns its length. */
static size_t
key_in_partition(kv_store *s, unsigned part, char *buf, size_t cap)
{
	for (size_t i = 0; i < 1000000; i++) {
		size_t len = fmt_key(buf, cap, "part-", i);
		if (kv_store_partition_of(s, buf, len) == part)
			return len;
	}
	fail_msg("no key found for partition %u", part);
	return 0;
}

/*
 * Put, get, overwrite, delete.
 */

static void
put_then_get_returns_the_value(void **state)
{
	kv_store *s = FX(state)->s;

	put_s(s, "lang", "C11");
	put_s(s, "std", "ISO/IEC 9899:2011");
	assert_value_s(s, "lang", "C11");
	assert_value_s(s, "std", "ISO/IEC 9899:2011");
}

static void
put_overwrites_the_previous_value(void **state)
{
	kv_store *s = FX(state)->s;
	char big[3000];

	memset(big, 'x', sizeof big);
	put_s(s, "k", "first");
	put_s(s, "k", "a longer second value");
	assert_value_s(s, "k", "a longer second value");
	put_s(s, "k", "3");
	assert_value_s(s, "k", "3");
	assert_int_equal(kv_store_put(s, "k", 1, big, sizeof big), KV_OK);
	assert_value(s, "k", 1, big, sizeof big);
	put_s(s, "k", "small again");
	assert_value_s(s, "k", "small again");
	assert_int_equal(stats_of(s).keys, 1);
}

static void
get_of_missing_key_returns_enotfound_and_leaves_no_state(void **state)
{
	kv_store *s = FX(state)->s;
	kv_store_stats before, after;
	entry_list l = {0};
	kv_buf v = {0};

	put_s(s, "present", "1");
	before = stats_of(s);

	assert_absent_s(s, "absent");
	assert_absent_s(s, "presen");   /* a proper prefix of a key */
	assert_absent_s(s, "present!"); /* a key that has a key as prefix */
	assert_absent_s(s, "presenu");  /* differs in the last byte only */

	/* A buffer with contents is left as it was. */
	assert_int_equal(kv_buf_set(&v, "old", 3), KV_OK);
	assert_int_equal(kv_store_get(s, "absent", 6, &v), KV_ENOTFOUND);
	assert_int_equal(v.len, 3);
	assert_memory_equal(v.data, "old", 3);
	kv_buf_fini(&v);

	after = stats_of(s);
	assert_int_equal(after.keys, before.keys);
	assert_int_equal(after.bytes, before.bytes);
	assert_int_equal(after.mem_bytes, before.mem_bytes);
	assert_int_equal(after.index_bytes, before.index_bytes);

	scan_all(s, NULL, 0, NULL, 0, &l);
	assert_int_equal(l.n, 1);
	assert_true(entry_key_is(&l, 0, "present", 7));
	entry_list_fini(&l);
}

static void
get_replaces_the_contents_of_the_value_buffer(void **state)
{
	kv_store *s = FX(state)->s;
	kv_buf v = {0};

	put_s(s, "k", "new");
	assert_int_equal(kv_buf_set(&v, "a much longer old content", 25), KV_OK);
	assert_int_equal(kv_store_get(s, "k", 1, &v), KV_OK);
	assert_int_equal(v.len, 3);
	assert_memory_equal(v.data, "new", 3);
	kv_buf_fini(&v);
}

static void
del_returns_the_value_and_a_second_del_returns_enotfound(void **state)
{
	kv_store *s = FX(state)->s;
	kv_buf old = {0};

	put_s(s, "k", "the value");
	put_s(s, "k2", "other");
	assert_int_equal(kv_store_del(s, "k", 1, &old), KV_OK);
	assert_int_equal(old.len, 9);
	assert_memory_equal(old.data, "the value", 9);
	assert_absent_s(s, "k");

	assert_int_equal(kv_buf_set(&old, "kept", 4), KV_OK);
	assert_int_equal(kv_store_del(s, "k", 1, &old), KV_ENOTFOUND);
	assert_int_equal(old.len, 4);
	assert_memory_equal(old.data, "kept", 4);
	kv_buf_fini(&old);

	assert_value_s(s, "k2", "other");
	assert_int_equal(stats_of(s).keys, 1);
}

static void
del_without_a_buffer_removes_the_key(void **state)
{
	kv_store *s = FX(state)->s;

	put_s(s, "k", "v");
	assert_int_equal(kv_store_del(s, "k", 1, NULL), KV_OK);
	assert_absent_s(s, "k");
	assert_int_equal(kv_store_del(s, "k", 1, NULL), KV_ENOTFOUND);
	assert_int_equal(stats_of(s).keys, 0);
	assert_int_equal(stats_of(s).bytes, 0);
}

static void
deleted_key_can_be_put_again(void **state)
{
	kv_store *s = FX(state)->s;

	for (int round = 0; round < 3; round++) {
		put_s(s, "phoenix", round == 1 ? "second life" : "life");
		assert_value_s(s, "phoenix", round == 1 ? "second life" : "life");
		assert_int_equal(kv_store_del(s, "phoenix", 7, NULL), KV_OK);
		assert_absent_s(s, "phoenix");
	}
	assert_int_equal(stats_of(s).keys, 0);
}

static void
keys_that_are_prefixes_or_differ_in_the_last_byte_are_distinct(void **state)
{
	static const struct {
		const char *k;
		size_t klen;
	} keys[] = {
	    {"a", 1},  {"a\0", 2},  {"a\xff", 2}, {"ab", 2},       {"abc", 3},   {"abd", 3},
	    {"\0", 1}, {"\0\0", 2}, {"\xff", 1},  {"\xff\xff", 2}, {"ab\0c", 4}, {"abc\0", 4},
	};
	kv_store *s = FX(state)->s;
	size_t n = sizeof keys / sizeof keys[0];
	char val[16];

	for (size_t i = 0; i < n; i++) {
		int len = snprintf(val, sizeof val, "v%zu", i);
		assert_int_equal(kv_store_put(s, keys[i].k, keys[i].klen, val, (size_t)len), KV_OK);
	}
	assert_int_equal(stats_of(s).keys, n);
	for (size_t i = 0; i < n; i++) {
		int len = snprintf(val, sizeof val, "v%zu", i);
		assert_value(s, keys[i].k, keys[i].klen, val, (size_t)len);
	}
	/* Deleting one leaves its neighbours. */
	assert_int_equal(kv_store_del(s, "ab", 2, NULL), KV_OK);
	assert_absent(s, "ab", 2);
	assert_value(s, "a", 1, "v0", 2);
	assert_value(s, "abc", 3, "v4", 2);
	assert_value(s, "ab\0c", 4, "v10", 3);
	assert_int_equal(kv_store_del(s, "a", 1, NULL), KV_OK);
	assert_value(s, "a\0", 2, "v1", 2);
	assert_value(s, "a\xff", 2, "v2", 2);
	assert_int_equal(stats_of(s).keys, n - 2);
}

static void
empty_value_is_legal(void **state)
{
	kv_store *s = FX(state)->s;
	kv_bytes k[2] = {{(const uint8_t *)"m1", 2}, {(const uint8_t *)"m2", 2}};
	kv_bytes v[2] = {{(const uint8_t *)"", 0}, {NULL, 0}};
	kv_buf vals[2] = {{0}, {0}};
	kv_buf old = {0};
	entry_list l = {0};
	size_t newlen = 99;

	assert_int_equal(kv_store_put(s, "e", 1, "", 0), KV_OK);
	assert_value(s, "e", 1, "", 0);
	assert_int_equal(kv_store_put(s, "n", 1, NULL, 0), KV_OK);
	assert_value(s, "n", 1, "", 0);
	assert_int_equal(stats_of(s).keys, 2);
	assert_int_equal(stats_of(s).bytes, 2);

	assert_int_equal(kv_store_mput(s, 2, k, 2, v), KV_OK);
	assert_int_equal(kv_store_mget(s, 2, k, vals, NULL), KV_OK);
	assert_int_equal(vals[0].len, 0);
	assert_int_equal(vals[1].len, 0);

	scan_all(s, NULL, 0, NULL, 0, &l);
	assert_int_equal(l.n, 4);
	for (size_t i = 0; i < l.n; i++) {
		assert_true(l.val_set[i]);
		assert_int_equal(l.vals[i].len, 0);
	}

	assert_int_equal(kv_store_append(s, "e", 1, "", 0, &newlen), KV_OK);
	assert_int_equal(newlen, 0);
	assert_int_equal(kv_store_append(s, "e", 1, "x", 1, &newlen), KV_OK);
	assert_int_equal(newlen, 1);

	assert_int_equal(kv_buf_set(&old, "junk", 4), KV_OK);
	assert_int_equal(kv_store_del(s, "n", 1, &old), KV_OK);
	assert_int_equal(old.len, 0);
	assert_absent_s(s, "n");

	kv_buf_fini(&old);
	kv_buf_fini(&vals[0]);
	kv_buf_fini(&vals[1]);
	entry_list_fini(&l);
}

static void
values_of_every_size_class_round_trip_through_overwrites(void **state)
{
	/* Around the slab class steps (64, 512, 4096) and well into malloc'd sizes. */
	static const size_t sizes[] = {0,   1,   2,    3,    63,   64,   65,    66,     511,
	                               512, 513, 4095, 4096, 4097, 8191, 65536, 100003, 1u << 20};
	size_t nsizes = sizeof sizes / sizeof sizes[0];
	kv_store *s = FX(state)->s;
	uint8_t *buf = xmalloc((1u << 20) + 64);
	kv_store_stats st;

	for (size_t i = 0; i < (1u << 20); i++)
		buf[i] = (uint8_t)(i * 131 + 7);
	/* One key per size, then every key rewritten with every other size. */
	for (size_t i = 0; i < nsizes; i++) {
		char key[32];
		size_t klen = fmt_key(key, sizeof key, "size", i);
		assert_int_equal(kv_store_put(s, key, klen, buf + i, sizes[i]), KV_OK);
	}
	for (size_t r = 1; r < nsizes; r++) {
		for (size_t i = 0; i < nsizes; i++) {
			char key[32];
			size_t klen = fmt_key(key, sizeof key, "size", i);
			size_t j = (i + r) % nsizes;
			assert_value(s, key, klen, buf + (i + r - 1) % nsizes,
			             sizes[(i + r - 1) % nsizes]);
			assert_int_equal(kv_store_put(s, key, klen, buf + j, sizes[j]), KV_OK);
		}
	}
	/* Appends that cross the class steps, one byte at a time around each. */
	for (size_t len = 0; len < 4200; len++) {
		size_t newlen = 0;
		assert_int_equal(kv_store_append(s, "grow", 4, buf + len, 1, &newlen), KV_OK);
		assert_int_equal(newlen, len + 1);
		if (len % 97 == 0 || (len >= 4090 && len <= 4100) || len == 63 || len == 511)
			assert_value(s, "grow", 4, buf, len + 1);
	}
	assert_value(s, "grow", 4, buf, 4200);
	st = stats_of(s);
	assert_int_equal(st.keys, nsizes + 1);
	for (size_t i = 0; i < nsizes; i++) {
		char key[32];
		size_t klen = fmt_key(key, sizeof key, "size", i);
		kv_buf old = {0};
		size_t j = (i + nsizes - 1) % nsizes;
		assert_int_equal(kv_store_del(s, key, klen, &old), KV_OK);
		assert_int_equal(old.len, sizes[j]);
		if (sizes[j] > 0)
			assert_memory_equal(old.data, buf + j, sizes[j]);
		kv_buf_fini(&old);
	}
	st = stats_of(s);
	assert_int_equal(st.keys, 1);
	assert_int_equal(st.bytes, 4 + 4200);
	free(buf);
}

/*
 * Append.
 */

static void
append_builds_the_value_from_five_appends(void **state)
{
	static const char *parts[] = {"concepts", ",modules", ",coroutines", ",ranges", ",jthread"};
	static const char want[] = "concepts,modules,coroutines,ranges,jthread";
	kv_store *s = FX(state)->s;
	size_t total = 0;

	for (size_t i = 0; i < 5; i++) {
		size_t newlen = 0;
		assert_int_equal(
		    kv_store_append(s, "c++20", 5, parts[i], strlen(parts[i]), &newlen), KV_OK);
		total += strlen(parts[i]);
		assert_int_equal(newlen, total);
	}
	assert_value_s(s, "c++20", want);
	assert_int_equal(stats_of(s).keys, 1);
	assert_int_equal(stats_of(s).bytes, 5 + strlen(want));
}

static void
append_creates_an_absent_key(void **state)
{
	kv_store *s = FX(state)->s;
	size_t newlen = 0;

	assert_int_equal(kv_store_append(s, "fresh", 5, "start", 5, &newlen), KV_OK);
	assert_int_equal(newlen, 5);
	assert_value_s(s, "fresh", "start");
	assert_int_equal(kv_store_append(s, "empty", 5, "", 0, NULL), KV_OK);
	assert_value_s(s, "empty", "");
	assert_int_equal(stats_of(s).keys, 2);
}

static void
append_beyond_max_value_returns_etoobig_and_changes_nothing(void **state)
{
	kv_store *s = store_open_extra(FX(state), 0, 0, 64, 0);
	char buf[65];
	kv_store_stats before;
	size_t newlen = 1234;

	memset(buf, 'a', sizeof buf);
	assert_int_equal(kv_store_append(s, "k", 1, buf, 60, &newlen), KV_OK);
	assert_int_equal(newlen, 60);
	before = stats_of(s);

	newlen = 1234;
	assert_int_equal(kv_store_append(s, "k", 1, "12345", 5, &newlen), KV_ETOOBIG);
	assert_int_equal(newlen, 1234);
	assert_value(s, "k", 1, buf, 60);
	assert_int_equal(stats_of(s).bytes, before.bytes);

	/* Up to exactly max_value is fine. */
	assert_int_equal(kv_store_append(s, "k", 1, "1234", 4, &newlen), KV_OK);
	assert_int_equal(newlen, 64);
	assert_int_equal(kv_store_append(s, "k", 1, "x", 1, NULL), KV_ETOOBIG);
	assert_int_equal(kv_store_append(s, "k", 1, "", 0, &newlen), KV_OK);
	assert_int_equal(newlen, 64);

	/* An absent key is not created by a too-big append. */
	assert_int_equal(kv_store_append(s, "new", 3, buf, 65, NULL), KV_ETOOBIG);
	assert_absent_s(s, "new");
	assert_int_equal(stats_of(s).keys, 1);
}

/*
 * Multi-key operations.
 */

/* n pairs "<prefix><i>" -> "value-<i>-<tag>", in a shuffled order. */
typedef struct {
	size_t n;
	kv_bytes *keys;
	kv_bytes *vals;
	char *kbuf;  /* n keys of 32 bytes */
	char *vbuf;  /* n values of 48 bytes */
	size_t *idx; /* idx[j]: the number i of the j-th pair */
} pairs;

static void
pairs_init(pairs *p, size_t n, const char *prefix, const char *tag, uint64_t seed)
{
	p->n = n;
	p->keys = xcalloc(n, sizeof *p->keys);
	p->vals = xcalloc(n, sizeof *p->vals);
	p->kbuf = xcalloc(n, 32);
	p->vbuf = xcalloc(n, 48);
	p->idx = xcalloc(n, sizeof *p->idx);
	for (size_t i = 0; i < n; i++)
		p->idx[i] = i;
	for (size_t i = n; i > 1; i--) {
		size_t j = rng_below(&seed, i);
		size_t t = p->idx[i - 1];
		p->idx[i - 1] = p->idx[j];
		p->idx[j] = t;
	}
	for (size_t j = 0; j < n; j++) {
		char *k = p->kbuf + 32 * j, *v = p->vbuf + 48 * j;
		p->keys[j].len = fmt_key(k, 32, prefix, p->idx[j]);
		p->keys[j].p = (const uint8_t *)k;
		p->vals[j].len = (size_t)snprintf(v, 48, "value-%zu-%s", p->idx[j], tag);
		p->vals[j].p = (const uint8_t *)v;
	}
}

static void
pairs_fini(pairs *p)
{
	free(p->keys);
	free(p->vals);
	free(p->kbuf);
	free(p->vbuf);
	free(p->idx);
}

static void
mput_then_mget_returns_values_in_request_order(kv_store *s, size_t n)
{
	pairs w, r;
	kv_buf *vals = xcalloc(n, sizeof *vals);
	bool *missing = xcalloc(n, sizeof *missing);

	pairs_init(&w, n, "mk", "one", 1);
	pairs_init(&r, n, "mk", "one", 2); /* the same pairs in another order */
	assert_int_equal(kv_store_mput(s, n, w.keys, n, w.vals), KV_OK);
	assert_int_equal(stats_of(s).keys, n);

	assert_int_equal(kv_store_mget(s, n, r.keys, vals, missing), KV_OK);
	for (size_t j = 0; j < n; j++) {
		assert_false(missing[j]);
		assert_int_equal(vals[j].len, r.vals[j].len);
		assert_memory_equal(vals[j].data, r.vals[j].p, r.vals[j].len);
		kv_buf_fini(&vals[j]);
	}
	/* Single-key reads agree. */
	for (size_t j = 0; j < n; j += 1 + n / 64)
		assert_value(s, w.keys[j].p, w.keys[j].len, w.vals[j].p, w.vals[j].len);

	free(vals);
	free(missing);
	pairs_fini(&w);
	pairs_fini(&r);
}

static void
mput_then_mget_of_16_pairs_returns_values_in_request_order(void **state)
{
	mput_then_mget_returns_values_in_request_order(FX(state)->s, 16);
}

static void
mput_then_mget_of_4096_pairs_returns_values_in_request_order(void **state)
{
	mput_then_mget_returns_values_in_request_order(FX(state)->s, 4096);
}

static void
second_mput_overwrites_every_value(void **state)
{
	kv_store *s = FX(state)->s;
	size_t n = 300;
	pairs a, b;
	kv_buf *vals = xcalloc(n, sizeof *vals);

	pairs_init(&a, n, "ow", "first", 3);
	pairs_init(&b, n, "ow", "second-and-longer", 4);
	assert_int_equal(kv_store_mput(s, n, a.keys, n, a.vals), KV_OK);
	assert_int_equal(kv_store_mput(s, n, b.keys, n, b.vals), KV_OK);
	assert_int_equal(kv_store_mget(s, n, a.keys, vals, NULL), KV_OK);
	for (size_t j = 0; j < n; j++) {
		char want[48];
		int len = snprintf(want, sizeof want, "value-%zu-second-and-longer", a.idx[j]);
		assert_int_equal(vals[j].len, (size_t)len);
		assert_memory_equal(vals[j].data, want, (size_t)len);
		kv_buf_fini(&vals[j]);
	}
	assert_int_equal(stats_of(s).keys, n);
	free(vals);
	pairs_fini(&a);
	pairs_fini(&b);
}

static void
mget_with_one_missing_key_returns_enotfound_and_flags_only_that_key(void **state)
{
	kv_store *s = FX(state)->s;
	size_t n = 40;
	pairs p;
	kv_buf *vals = xcalloc(n, sizeof *vals);
	bool *missing = xcalloc(n, sizeof *missing);
	kv_store_stats before;

	pairs_init(&p, n, "mm", "v", 5);
	assert_int_equal(kv_store_mput(s, n, p.keys, n, p.vals), KV_OK);
	assert_int_equal(kv_store_del(s, p.keys[17].p, p.keys[17].len, NULL), KV_OK);
	before = stats_of(s);

	assert_int_equal(kv_store_mget(s, n, p.keys, vals, missing), KV_ENOTFOUND);
	for (size_t j = 0; j < n; j++)
		assert_int_equal(missing[j], j == 17);

	/* Without a `missing` array it fails the same way. */
	assert_int_equal(kv_store_mget(s, n, p.keys, vals, NULL), KV_ENOTFOUND);
	assert_int_equal(stats_of(s).keys, before.keys);
	assert_int_equal(stats_of(s).bytes, before.bytes);
	assert_absent(s, p.keys[17].p, p.keys[17].len);

	for (size_t j = 0; j < n; j++)
		kv_buf_fini(&vals[j]);
	free(vals);
	free(missing);
	pairs_fini(&p);
}

static void
mget_flags_every_missing_key(void **state)
{
	kv_store *s = FX(state)->s;
	kv_bytes k[4] = {{(const uint8_t *)"x1", 2},
	                 {(const uint8_t *)"x2", 2},
	                 {(const uint8_t *)"x3", 2},
	                 {(const uint8_t *)"x4", 2}};
	kv_buf vals[4] = {{0}};
	bool missing[4] = {false, true, false, true};

	put_s(s, "x2", "two");
	put_s(s, "x4", "four");
	assert_int_equal(kv_store_mget(s, 4, k, vals, missing), KV_ENOTFOUND);
	assert_true(missing[0]);
	assert_false(missing[1]);
	assert_true(missing[2]);
	assert_false(missing[3]);
	for (size_t i = 0; i < 4; i++)
		kv_buf_fini(&vals[i]);
	assert_int_equal(stats_of(s).keys, 2);
}

static void
mput_with_unequal_counts_returns_einval_and_writes_nothing(void **state)
{
	kv_store *s = FX(state)->s;
	pairs p;

	pairs_init(&p, 8, "uc", "v", 6);
	assert_int_equal(kv_store_mput(s, 8, p.keys, 7, p.vals), KV_EINVAL);
	assert_int_equal(kv_store_mput(s, 7, p.keys, 8, p.vals), KV_EINVAL);
	assert_int_equal(stats_of(s).keys, 0);
	for (size_t j = 0; j < 8; j++)
		assert_absent(s, p.keys[j].p, p.keys[j].len);
	pairs_fini(&p);
}

static void
mput_with_one_invalid_pair_writes_nothing(void **state)
{
	kv_store *s = store_open_extra(FX(state), 0, 16, 32, 0);
	kv_bytes keys[3] = {
	    {(const uint8_t *)"ok1", 3}, {(const uint8_t *)"ok2", 3}, {(const uint8_t *)"ok3", 3}};
	kv_bytes vals[3] = {
	    {(const uint8_t *)"a", 1}, {(const uint8_t *)"b", 1}, {(const uint8_t *)"c", 1}};
	static const uint8_t long_bytes[40] = {'z'};
	int rv;

	put_s(s, "ok2", "old");

	/* A value over max_value. */
	vals[1] = (kv_bytes){long_bytes, 33};
	rv = kv_store_mput(s, 3, keys, 3, vals);
	assert_true(rv == KV_EINVAL || rv == KV_ETOOBIG);
	vals[1] = (kv_bytes){(const uint8_t *)"b", 1};

	/* A key over max_key. */
	keys[2] = (kv_bytes){long_bytes, 17};
	rv = kv_store_mput(s, 3, keys, 3, vals);
	assert_true(rv == KV_EINVAL || rv == KV_ETOOBIG);
	keys[2] = (kv_bytes){(const uint8_t *)"ok3", 3};

	/* An empty key and a NULL key. */
	keys[0] = (kv_bytes){(const uint8_t *)"", 0};
	assert_int_equal(kv_store_mput(s, 3, keys, 3, vals), KV_EINVAL);
	keys[0] = (kv_bytes){NULL, 3};
	assert_int_equal(kv_store_mput(s, 3, keys, 3, vals), KV_EINVAL);
	keys[0] = (kv_bytes){(const uint8_t *)"ok1", 3};

	/* A NULL value with a length. */
	vals[2] = (kv_bytes){NULL, 4};
	assert_int_equal(kv_store_mput(s, 3, keys, 3, vals), KV_EINVAL);

	assert_absent_s(s, "ok1");
	assert_value_s(s, "ok2", "old");
	assert_absent_s(s, "ok3");
	assert_int_equal(stats_of(s).keys, 1);
}

static void
mget_with_a_repeated_key_returns_the_value_at_every_position(void **state)
{
	kv_store *s = FX(state)->s;
	kv_bytes k[3] = {{(const uint8_t *)"dup", 3},
	                 {(const uint8_t *)"other", 5},
	                 {(const uint8_t *)"dup", 3}};
	kv_buf v[3] = {{0}};

	put_s(s, "dup", "D");
	put_s(s, "other", "O");
	assert_int_equal(kv_store_mget(s, 3, k, v, NULL), KV_OK);
	assert_int_equal(v[0].len, 1);
	assert_memory_equal(v[0].data, "D", 1);
	assert_int_equal(v[1].len, 1);
	assert_memory_equal(v[1].data, "O", 1);
	assert_int_equal(v[2].len, 1);
	assert_memory_equal(v[2].data, "D", 1);
	for (size_t i = 0; i < 3; i++)
		kv_buf_fini(&v[i]);
}

static void
mput_with_a_repeated_key_counts_the_key_once(void **state)
{
	kv_store *s = FX(state)->s;
	kv_bytes k[3] = {{(const uint8_t *)"dup", 3},
	                 {(const uint8_t *)"other", 5},
	                 {(const uint8_t *)"dup", 3}};
	kv_bytes v[3] = {
	    {(const uint8_t *)"first", 5}, {(const uint8_t *)"O", 1}, {(const uint8_t *)"last", 4}};
	kv_buf got = {0};
	kv_store_stats st;

	assert_int_equal(kv_store_mput(s, 3, k, 3, v), KV_OK);
	assert_int_equal(kv_store_get(s, "dup", 3, &got), KV_OK);
	/* The later pair wins, as if the pairs were put in request order. */
	assert_int_equal(got.len, 4);
	assert_memory_equal(got.data, "last", 4);
	st = stats_of(s);
	assert_int_equal(st.keys, 2);
	assert_int_equal(st.bytes, 3 + 4 + 5 + 1);
	kv_buf_fini(&got);
}

/*
 * Bad input.
 */

static void
null_or_empty_key_returns_einval_and_changes_nothing(void **state)
{
	kv_store *s = FX(state)->s;
	kv_buf v = {0};
	kv_bytes k = {NULL, 0};
	bool missing = false;

	put_s(s, "k", "v");
	for (size_t klen = 0; klen < 2; klen++) {
		assert_int_equal(kv_store_get(s, NULL, klen, &v), KV_EINVAL);
		assert_int_equal(kv_store_put(s, NULL, klen, "v", 1), KV_EINVAL);
		assert_int_equal(kv_store_del(s, NULL, klen, &v), KV_EINVAL);
		assert_int_equal(kv_store_append(s, NULL, klen, "v", 1, NULL), KV_EINVAL);
	}
	assert_int_equal(kv_store_get(s, "", 0, &v), KV_EINVAL);
	assert_int_equal(kv_store_put(s, "", 0, "v", 1), KV_EINVAL);
	assert_int_equal(kv_store_del(s, "", 0, &v), KV_EINVAL);
	assert_int_equal(kv_store_append(s, "", 0, "v", 1, NULL), KV_EINVAL);
	assert_int_equal(kv_store_mget(s, 1, &k, &v, &missing), KV_EINVAL);
	assert_int_equal(kv_store_mput(s, 1, &k, 1, &k), KV_EINVAL);
	assert_int_equal(stats_of(s).keys, 1);
	assert_value_s(s, "k", "v");
	kv_buf_fini(&v);
}

static void
oversized_key_or_value_returns_etoobig_and_changes_nothing(void **state)
{
	kv_store *s = FX(state)->s;
	kv_store *small = store_open_extra(FX(state), 0, 8, 16, 0);
	size_t maxv = KV_DEFAULT_MAX_VALUE;
	uint8_t *big = xcalloc(maxv + 1, 1);
	kv_buf v = {0};
	kv_store_stats before;

	memset(big, 'k', maxv + 1);

	/* Default limits: 1024-byte keys, 1 MiB values. */
	assert_int_equal(kv_store_put(s, big, KV_DEFAULT_MAX_KEY, "v", 1), KV_OK);
	assert_value(s, big, KV_DEFAULT_MAX_KEY, "v", 1);
	assert_int_equal(kv_store_put(s, "max", 3, big, maxv), KV_OK);
	assert_value(s, "max", 3, big, maxv);
	before = stats_of(s);
	assert_int_equal(kv_store_put(s, big, KV_DEFAULT_MAX_KEY + 1, "v", 1), KV_ETOOBIG);
	assert_int_equal(kv_store_get(s, big, KV_DEFAULT_MAX_KEY + 1, &v), KV_ETOOBIG);
	assert_int_equal(kv_store_del(s, big, KV_DEFAULT_MAX_KEY + 1, &v), KV_ETOOBIG);
	assert_int_equal(kv_store_append(s, big, KV_DEFAULT_MAX_KEY + 1, "v", 1, NULL), KV_ETOOBIG);
	assert_int_equal(kv_store_put(s, "max", 3, big, maxv + 1), KV_ETOOBIG);
	assert_int_equal(kv_store_put(s, "new", 3, big, maxv + 1), KV_ETOOBIG);
	assert_int_equal(kv_store_append(s, "new", 3, big, maxv + 1, NULL), KV_ETOOBIG);
	assert_value(s, "max", 3, big, maxv);
	assert_absent_s(s, "new");
	assert_int_equal(stats_of(s).keys, before.keys);
	assert_int_equal(stats_of(s).bytes, before.bytes);

	/* Configured limits. */
	assert_int_equal(kv_store_put(small, "12345678", 8, big, 16), KV_OK);
	assert_int_equal(kv_store_put(small, "123456789", 9, "v", 1), KV_ETOOBIG);
	assert_int_equal(kv_store_put(small, "k", 1, big, 17), KV_ETOOBIG);
	assert_int_equal(kv_store_append(small, "12345678", 8, "x", 1, NULL), KV_ETOOBIG);
	assert_value(small, "12345678", 8, big, 16);
	assert_int_equal(stats_of(small).keys, 1);

	kv_buf_fini(&v);
	free(big);
}

static int
count_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	(void)key;
	(void)klen;
	(void)val;
	(void)vlen;
	(*(size_t *)arg)++;
	return 0;
}

static void
null_task(kv_store *s, unsigned part, void *arg)
{
	(void)s;
	(void)part;
	(void)arg;
}

static void
null_store_or_buffer_arguments_return_einval(void **state)
{
	kv_store *s = FX(state)->s;
	kv_bytes k = {(const uint8_t *)"k", 1};
	kv_bytes v = {(const uint8_t *)"v", 1};
	kv_buf buf = {0};
	kv_store_cursor c;
	size_t n = 0;
	uint64_t keys = 0, bytes = 0;

	kv_store_cursor_init(&c);
	/* A NULL store. */
	assert_int_equal(kv_store_get(NULL, "k", 1, &buf), KV_EINVAL);
	assert_int_equal(kv_store_put(NULL, "k", 1, "v", 1), KV_EINVAL);
	assert_int_equal(kv_store_del(NULL, "k", 1, &buf), KV_EINVAL);
	assert_int_equal(kv_store_append(NULL, "k", 1, "v", 1, NULL), KV_EINVAL);
	assert_int_equal(kv_store_mget(NULL, 1, &k, &buf, NULL), KV_EINVAL);
	assert_int_equal(kv_store_mput(NULL, 1, &k, 1, &v), KV_EINVAL);
	assert_int_equal(kv_store_scan(NULL, NULL, 0, NULL, 0, 0, true, count_cb, &n, NULL),
	                 KV_EINVAL);
	assert_int_equal(kv_store_range_step(NULL, NULL, 0, NULL, 0, &c, 7, count_cb, &n),
	                 KV_EINVAL);
	assert_int_equal(kv_store_range_delete(NULL, NULL, 0, NULL, 0, 7, NULL), KV_EINVAL);
	assert_int_equal(kv_store_range_count(NULL, NULL, 0, NULL, 0, &keys, &bytes), KV_EINVAL);
	assert_int_equal(kv_store_range_split_key(NULL, NULL, 0, NULL, 0, &buf), KV_EINVAL);
	assert_int_equal(kv_store_run_on(NULL, 0, null_task, NULL), KV_EINVAL);

	/* NULL buffers and arrays. */
	put_s(s, "k", "v");
	assert_int_equal(kv_store_get(s, "k", 1, NULL), KV_EINVAL);
	assert_int_equal(kv_store_put(s, "k2", 2, NULL, 3), KV_EINVAL);
	assert_int_equal(kv_store_append(s, "k", 1, NULL, 3, NULL), KV_EINVAL);
	assert_int_equal(kv_store_mget(s, 1, NULL, &buf, NULL), KV_EINVAL);
	assert_int_equal(kv_store_mget(s, 1, &k, NULL, NULL), KV_EINVAL);
	assert_int_equal(kv_store_mput(s, 1, NULL, 1, &v), KV_EINVAL);
	assert_int_equal(kv_store_mput(s, 1, &k, 1, NULL), KV_EINVAL);
	assert_int_equal(kv_store_scan(s, NULL, 0, NULL, 0, 0, true, NULL, NULL, NULL), KV_EINVAL);
	assert_int_equal(kv_store_scan(s, NULL, 3, NULL, 0, 0, true, count_cb, &n, NULL),
	                 KV_EINVAL);
	assert_int_equal(kv_store_scan(s, "a", 1, NULL, 3, 0, true, count_cb, &n, NULL), KV_EINVAL);
	assert_int_equal(n, 0);
	assert_int_equal(kv_store_range_step(s, NULL, 0, NULL, 0, NULL, 7, count_cb, &n),
	                 KV_EINVAL);
	assert_int_equal(kv_store_range_step(s, NULL, 0, NULL, 0, &c, 7, NULL, NULL), KV_EINVAL);
	assert_int_equal(kv_store_range_split_key(s, NULL, 0, NULL, 0, NULL), KV_EINVAL);
	assert_int_equal(kv_store_run_on(s, 0, NULL, NULL), KV_EINVAL);
	assert_int_equal(kv_scan_resume_key("k", 1, NULL), KV_EINVAL);
	assert_int_equal(kv_scan_resume_key(NULL, 1, &buf), KV_EINVAL);

	assert_value_s(s, "k", "v");
	assert_absent_s(s, "k2");
	assert_int_equal(stats_of(s).keys, 1);
	kv_store_cursor_fini(&c);
	kv_buf_fini(&buf);
}

/*
 * Statistics.
 */

static void
stats_track_puts_overwrites_deletes_and_appends(void **state)
{
	kv_store *s = FX(state)->s;
	kv_store_stats st = stats_of(s);

	assert_int_equal(st.keys, 0);
	assert_int_equal(st.bytes, 0);

	put_s(s, "alpha", "0123456789"); /* 5 + 10 */
	st = stats_of(s);
	assert_int_equal(st.keys, 1);
	assert_int_equal(st.bytes, 15);

	put_s(s, "beta", "xy"); /* 4 + 2 */
	st = stats_of(s);
	assert_int_equal(st.keys, 2);
	assert_int_equal(st.bytes, 21);

	put_s(s, "alpha", "012"); /* overwrite: 5 + 3 */
	st = stats_of(s);
	assert_int_equal(st.keys, 2);
	assert_int_equal(st.bytes, 14);

	assert_int_equal(kv_store_append(s, "beta", 4, "zzzz", 4, NULL), KV_OK); /* 4 + 6 */
	st = stats_of(s);
	assert_int_equal(st.keys, 2);
	assert_int_equal(st.bytes, 18);

	assert_int_equal(kv_store_append(s, "gamma", 5, "g", 1, NULL), KV_OK); /* new: 5 + 1 */
	st = stats_of(s);
	assert_int_equal(st.keys, 3);
	assert_int_equal(st.bytes, 24);

	assert_int_equal(kv_store_del(s, "alpha", 5, NULL), KV_OK);
	st = stats_of(s);
	assert_int_equal(st.keys, 2);
	assert_int_equal(st.bytes, 16);

	/* Failed operations count nothing. */
	assert_int_equal(kv_store_del(s, "alpha", 5, NULL), KV_ENOTFOUND);
	assert_int_equal(kv_store_put(s, "", 0, "v", 1), KV_EINVAL);
	st = stats_of(s);
	assert_int_equal(st.keys, 2);
	assert_int_equal(st.bytes, 16);

	assert_int_equal(kv_store_del(s, "beta", 4, NULL), KV_OK);
	assert_int_equal(kv_store_del(s, "gamma", 5, NULL), KV_OK);
	st = stats_of(s);
	assert_int_equal(st.keys, 0);
	assert_int_equal(st.bytes, 0);
}

/* The change counter moves when a key comes or goes or a value's size
 * changes, and only then: the heartbeat skips its recount while it stays. */
static void
stats_changes_move_only_when_keys_or_sizes_change(void **state)
{
	kv_store *s = FX(state)->s;
	kv_buf v = {0};
	uint64_t c0 = stats_of(s).changes, c;

	put_s(s, "alpha", "0123456789");
	c = stats_of(s).changes;
	assert_true(c > c0);
	put_s(s, "alpha", "9876543210"); /* the same size */
	assert_int_equal(kv_store_get(s, "alpha", 5, &v), KV_OK);
	assert_int_equal(kv_store_del(s, "beta", 4, NULL), KV_ENOTFOUND);
	assert_int_equal(stats_of(s).changes, c);
	put_s(s, "alpha", "01"); /* smaller */
	assert_true(stats_of(s).changes > c);
	c = stats_of(s).changes;
	assert_int_equal(kv_store_append(s, "alpha", 5, "x", 1, NULL), KV_OK);
	assert_true(stats_of(s).changes > c);
	c = stats_of(s).changes;
	assert_int_equal(kv_store_del(s, "alpha", 5, NULL), KV_OK);
	assert_true(stats_of(s).changes > c);
	kv_buf_fini(&v);
}

static void
stats_track_mput_over_new_and_existing_keys(void **state)
{
	kv_store *s = FX(state)->s;
	kv_bytes k[3] = {
	    {(const uint8_t *)"a", 1}, {(const uint8_t *)"bb", 2}, {(const uint8_t *)"ccc", 3}};
	kv_bytes v[3] = {
	    {(const uint8_t *)"1", 1}, {(const uint8_t *)"22", 2}, {(const uint8_t *)"333", 3}};
	kv_store_stats st;

	put_s(s, "bb", "a long old value"); /* 2 + 16 */
	assert_int_equal(kv_store_mput(s, 3, k, 3, v), KV_OK);
	st = stats_of(s);
	assert_int_equal(st.keys, 3);
	assert_int_equal(st.bytes, 2 + 4 + 6);
}

static void
memory_stats_cover_the_stored_bytes(void **state)
{
	kv_store *s = FX(state)->s;
	char key[32], val[200];
	kv_store_stats st;

	memset(val, 'v', sizeof val);
	for (size_t i = 0; i < 2000; i++) {
		size_t klen = fmt_key(key, sizeof key, "mem", i);
		assert_int_equal(kv_store_put(s, key, klen, val, sizeof val), KV_OK);
	}
	st = stats_of(s);
	assert_int_equal(st.keys, 2000);
	assert_int_equal(st.bytes, 2000 * (9 + sizeof val));
	assert_true(st.mem_bytes >= st.bytes);
	assert_true(st.index_bytes > 0);
	assert_true(st.index_bytes <= st.mem_bytes);
}

/*
 * The memory limit.
 */

#define MEM_LIMIT (4u << 20)
#define MEM_VALUE 500

static void
value_for(char *val, size_t i)
{
	memset(val, 'a' + (int)(i % 26), MEM_VALUE);
	memcpy(val, &i, sizeof i);
}

/* Puts keys "fill<i>" with 500-byte values until KV_ENOMEM; returns how many succeeded. */
static size_t
fill_until_enomem(kv_store *s)
{
	char key[32], val[MEM_VALUE];
	size_t bound = 4 * (MEM_LIMIT / MEM_VALUE) + 1000;

	for (size_t i = 0; i < bound; i++) {
		size_t klen = fmt_key(key, sizeof key, "fill", i);
		int rv;

		value_for(val, i);
		rv = kv_store_put(s, key, klen, val, sizeof val);
		if (rv == KV_ENOMEM)
			return i;
		assert_int_equal(rv, KV_OK);
	}
	fail_msg("no KV_ENOMEM after %zu puts with mem_limit %u", bound, MEM_LIMIT);
	return 0;
}

static void
assert_fill_keys(kv_store *s, size_t from, size_t to, size_t step)
{
	char key[32], val[MEM_VALUE];

	for (size_t i = from; i < to; i += step) {
		size_t klen = fmt_key(key, sizeof key, "fill", i);
		value_for(val, i);
		assert_value(s, key, klen, val, sizeof val);
	}
}

static void
filling_past_mem_limit_returns_enomem_and_keeps_acknowledged_keys(void **state)
{
	kv_store *s = store_open_extra(FX(state), 0, 0, 0, MEM_LIMIT);
	char key[32], val[MEM_VALUE];
	size_t n = fill_until_enomem(s), klen;
	kv_store_stats st = stats_of(s);

	assert_true(n > 100);
	assert_int_equal(st.keys, n);
	assert_true(st.mem_bytes <= MEM_LIMIT);

	/* Every acknowledged key reads back; the refused one is absent. */
	assert_fill_keys(s, 0, n, 1);
	klen = fmt_key(key, sizeof key, "fill", n);
	assert_absent(s, key, klen);

	/* Reads of missing keys keep working and a retry still fails. */
	assert_absent_s(s, "never-written");
	value_for(val, n);
	assert_int_equal(kv_store_put(s, key, klen, val, sizeof val), KV_ENOMEM);
	assert_int_equal(stats_of(s).keys, n);

	/* Deleting half the keys frees room for puts again. */
	for (size_t i = 0; i < n; i += 2) {
		kv_buf old = {0};
		klen = fmt_key(key, sizeof key, "fill", i);
		assert_int_equal(kv_store_del(s, key, klen, &old), KV_OK);
		assert_int_equal(old.len, MEM_VALUE);
		kv_buf_fini(&old);
	}
	assert_int_equal(stats_of(s).keys, n - (n + 1) / 2);
	for (size_t i = 0; i < n / 2; i += 2) {
		klen = fmt_key(key, sizeof key, "fill", i);
		value_for(val, i);
		assert_int_equal(kv_store_put(s, key, klen, val, sizeof val), KV_OK);
	}
	assert_fill_keys(s, 0, n / 2, 2);
	assert_fill_keys(s, 1, n, 2);
}

static void
overwrite_or_append_that_runs_out_of_memory_keeps_the_old_value(void **state)
{
	kv_store *s = store_open_extra(FX(state), 0, 0, 0, MEM_LIMIT);
	size_t n = fill_until_enomem(s);
	size_t big_len = 512 * 1024;
	char *big = xmalloc(big_len);
	char key[32], val[MEM_VALUE];
	size_t klen = fmt_key(key, sizeof key, "fill", 3);
	int rv;

	assert_true(n > 100);
	memset(big, 'B', big_len);
	value_for(val, 3);

	rv = kv_store_put(s, key, klen, big, big_len);
	assert_true(rv == KV_OK || rv == KV_ENOMEM);
	if (rv == KV_OK)
		assert_value(s, key, klen, big, big_len);
	else
		assert_value(s, key, klen, val, sizeof val);

	klen = fmt_key(key, sizeof key, "fill", 4);
	value_for(val, 4);
	rv = kv_store_append(s, key, klen, big, big_len, NULL);
	assert_true(rv == KV_OK || rv == KV_ENOMEM);
	if (rv == KV_ENOMEM)
		assert_value(s, key, klen, val, sizeof val);
	assert_fill_keys(s, 5, n, 1);
	free(big);
}

static void
mput_that_runs_out_of_memory_writes_nothing(void **state)
{
	kv_store *s = store_open_extra(FX(state), 0, 0, 0, MEM_LIMIT);
	size_t n = fill_until_enomem(s);
	size_t npairs = 64;
	kv_bytes *keys = xcalloc(npairs, sizeof *keys);
	kv_bytes *vals = xcalloc(npairs, sizeof *vals);
	char *kbuf = xcalloc(npairs, 32);
	char *vbuf = xcalloc(1, 64 * 1024);
	kv_store_stats before = stats_of(s);

	memset(vbuf, 'M', 64 * 1024);
	for (size_t i = 0; i < npairs; i++) {
		keys[i].len = fmt_key(kbuf + 32 * i, 32, "mput-oom", i);
		keys[i].p = (const uint8_t *)(kbuf + 32 * i);
		vals[i] = (kv_bytes){(const uint8_t *)vbuf, 64 * 1024};
	}
	/* 4 MiB of new values cannot fit into a full 4 MiB store. */
	assert_int_equal(kv_store_mput(s, npairs, keys, npairs, vals), KV_ENOMEM);
	for (size_t i = 0; i < npairs; i++)
		assert_absent(s, keys[i].p, keys[i].len);
	assert_int_equal(stats_of(s).keys, before.keys);
	assert_int_equal(stats_of(s).bytes, before.bytes);
	assert_fill_keys(s, 0, n, 1);

	free(keys);
	free(vals);
	free(kbuf);
	free(vbuf);
}

static void
writes_under_memory_pressure_are_all_or_nothing(void **state)
{
	kv_store *s = store_open_extra(FX(state), 0, 0, 0, MEM_LIMIT);
	size_t n = fill_until_enomem(s), enomem = 0, ok = 0;
	uint64_t seed = 5;
	char *kbuf = xcalloc(50, 32);
	uint8_t vbuf[3000];
	kv_bytes keys[50], vals[50];

	memset(vbuf, 'p', sizeof vbuf);
	/* Batches of new keys with values of assorted size classes: some fit in
	 * the arenas' leftovers, some need new blocks; each batch is all or nothing. */
	for (size_t round = 0; round < 200 && (enomem < 20 || ok < 5); round++) {
		size_t nb = 1 + rng_below(&seed, 50);
		kv_store_stats before = stats_of(s), after;
		int rv;

		for (size_t i = 0; i < nb; i++) {
			keys[i].len = fmt_key(kbuf + 32 * i, 32, "press", round * 64 + i);
			keys[i].p = (const uint8_t *)(kbuf + 32 * i);
			vals[i] = (kv_bytes){vbuf, rng_below(&seed, round % 3 ? 64 : sizeof vbuf)};
		}
		rv = nb == 1 ? kv_store_put(s, keys[0].p, keys[0].len, vals[0].p, vals[0].len)
		             : kv_store_mput(s, nb, keys, nb, vals);
		assert_true(rv == KV_OK || rv == KV_ENOMEM);
		after = stats_of(s);
		for (size_t i = 0; i < nb; i++) {
			if (rv == KV_OK)
				assert_value(s, keys[i].p, keys[i].len, vals[i].p, vals[i].len);
			else
				assert_absent(s, keys[i].p, keys[i].len);
		}
		if (rv == KV_OK) {
			ok++;
			assert_int_equal(after.keys, before.keys + nb);
		} else {
			enomem++;
			assert_int_equal(after.keys, before.keys);
			assert_int_equal(after.bytes, before.bytes);
		}
		assert_true(after.mem_bytes <= MEM_LIMIT);
		/* Free some room now and then, so that later rounds fit partly. */
		if (round % 10 == 9) {
			for (size_t i = round; i < n; i += 40) {
				char key[32];
				size_t klen = fmt_key(key, sizeof key, "fill", i);
				(void)kv_store_del(s, key, klen, NULL);
			}
		}
	}
	assert_true(enomem > 0);
	assert_stats_match_scan(s);
	free(kbuf);
}

/*
 * Owner-thread tasks.
 */

typedef struct {
	pthread_t thread; /* the thread the task ran on */
	unsigned part;    /* the partition it was given */
	int runs;         /* how often it ran */
} where_ran;

static void
record_thread_task(kv_store *s, unsigned part, void *arg)
{
	where_ran *w = arg;

	(void)s;
	w->thread = pthread_self();
	w->part = part;
	w->runs++;
}

static void
run_on_runs_the_task_on_the_partition_owner(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = fx->s;
	unsigned nparts = kv_store_partitions(s);
	where_ran first = {0}, again = {0}, other = {0};

	assert_int_equal(kv_store_run_on(s, nparts - 1, record_thread_task, &first), KV_OK);
	assert_int_equal(first.runs, 1);
	assert_int_equal(first.part, nparts - 1);
	assert_int_equal(kv_store_run_on(s, nparts - 1, record_thread_task, &again), KV_OK);
	assert_int_equal(again.runs, 1);

	if (fx->cfg->mode == KV_STORE_STRIPED) {
		assert_true(pthread_equal(first.thread, pthread_self()));
		return;
	}
	assert_false(pthread_equal(first.thread, pthread_self()));
	assert_true(pthread_equal(first.thread, again.thread));
	if (nparts > 1) {
		assert_int_equal(kv_store_run_on(s, 0, record_thread_task, &other), KV_OK);
		assert_int_equal(other.part, 0);
		assert_false(pthread_equal(other.thread, first.thread));
		assert_false(pthread_equal(other.thread, pthread_self()));
	}
}

static void
run_on_a_bad_partition_returns_einval(void **state)
{
	kv_store *s = FX(state)->s;
	where_ran w = {0};

	assert_int_equal(kv_store_run_on(s, kv_store_partitions(s), record_thread_task, &w),
	                 KV_EINVAL);
	assert_int_equal(kv_store_run_on(s, 1u << 30, record_thread_task, &w), KV_EINVAL);
	assert_int_equal(w.runs, 0);
}

/* What a task did from its owner thread (checked after it returns). */
typedef struct {
	char own[32]; /* a key of the task's partition */
	size_t own_len;
	char other[32]; /* a key of another partition, or empty */
	size_t other_len;
	int put_own, get_own, append_own, del_own, put_again; /* results on own key */
	int put_other, get_other, del_other, append_other;    /* results on other key */
	int mget, mput, run_on_other;                         /* results of the rest */
	int scan, scan_part_own, scan_part_other;             /* results of ordered reads */
	size_t own_visits; /* entries scan_partition visited in the own partition */
	size_t got_len;
	char got[32];
} owner_calls;

static void
owner_calls_task(kv_store *s, unsigned part, void *arg)
{
	owner_calls *t = arg;
	kv_buf v = {0};
	size_t newlen = 0;

	t->put_own = kv_store_put(s, t->own, t->own_len, "from-owner", 10);
	t->get_own = kv_store_get(s, t->own, t->own_len, &v);
	t->append_own = kv_store_append(s, t->own, t->own_len, "+", 1, &newlen);
	t->del_own = kv_store_del(s, t->own, t->own_len, &v);
	if (t->del_own == KV_OK && v.len <= sizeof t->got) {
		memcpy(t->got, v.data, v.len);
		t->got_len = v.len;
	}
	t->put_again = kv_store_put(s, t->own, t->own_len, "kept", 4);
	t->scan_part_own = kv_store_scan_partition(s, part, NULL, 0, NULL, 0, 0, true, count_cb,
	                                           &t->own_visits, NULL);
	if (t->other_len > 0) {
		size_t n = 0;

		t->scan = kv_store_scan(s, NULL, 0, NULL, 0, 0, true, count_cb, &n, NULL);
		t->scan_part_other =
		    kv_store_scan_partition(s, 0, NULL, 0, NULL, 0, 0, true, count_cb, &n, NULL);
		kv_bytes keys[2] = {{(const uint8_t *)t->own, t->own_len},
		                    {(const uint8_t *)t->other, t->other_len}};
		kv_bytes vals[2] = {{(const uint8_t *)"kept", 4}, {(const uint8_t *)"m", 1}};
		kv_buf mv[2] = {{0}, {0}};

		t->put_other = kv_store_put(s, t->other, t->other_len, "x", 1);
		t->get_other = kv_store_get(s, t->other, t->other_len, &v);
		t->append_other = kv_store_append(s, t->other, t->other_len, "x", 1, NULL);
		t->del_other = kv_store_del(s, t->other, t->other_len, NULL);
		t->mput = kv_store_mput(s, 2, keys, 2, vals);
		t->mget = kv_store_mget(s, 2, keys, mv, NULL);
		t->run_on_other = kv_store_run_on(s, part == 0 ? 1 : 0, null_task, NULL);
		kv_buf_fini(&mv[0]);
		kv_buf_fini(&mv[1]);
	}
	kv_buf_fini(&v);
}

static void
task_on_an_owner_thread_may_use_only_keys_of_its_partition(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = fx->s;
	unsigned nparts = kv_store_partitions(s);
	unsigned part = nparts - 1;
	owner_calls t = {0};
	int other_rv = fx->cfg->mode == KV_STORE_PERCORE ? KV_EPERM : KV_OK;

	t.own_len = key_in_partition(s, part, t.own, sizeof t.own);
	if (nparts > 1) {
		t.other_len = key_in_partition(s, 0, t.other, sizeof t.other);
		put_s(s, "unrelated", "u");
	}
	assert_int_equal(kv_store_run_on(s, part, owner_calls_task, &t), KV_OK);

	assert_int_equal(t.put_own, KV_OK);
	assert_int_equal(t.get_own, KV_OK);
	assert_int_equal(t.append_own, KV_OK);
	assert_int_equal(t.del_own, KV_OK);
	assert_int_equal(t.got_len, 11);
	assert_memory_equal(t.got, "from-owner+", 11);
	assert_int_equal(t.put_again, KV_OK);
	assert_value(s, t.own, t.own_len, "kept", 4);
	assert_int_equal(t.scan_part_own, KV_OK);
	assert_int_equal(t.own_visits,
	                 1 + (nparts > 1 && kv_store_partition_of(s, "unrelated", 9) == part));
	if (nparts == 1)
		return;

	assert_int_equal(t.put_other, other_rv);
	assert_int_equal(t.get_other, other_rv);
	assert_int_equal(t.append_other, other_rv);
	assert_int_equal(t.del_other, other_rv);
	assert_int_equal(t.mget, fx->cfg->mode == KV_STORE_PERCORE ? KV_EPERM : KV_OK);
	assert_int_equal(t.mput, fx->cfg->mode == KV_STORE_PERCORE ? KV_EPERM : KV_OK);
	assert_int_equal(t.run_on_other, other_rv);
	assert_int_equal(t.scan, other_rv);
	assert_int_equal(t.scan_part_other, other_rv);
	if (fx->cfg->mode == KV_STORE_PERCORE) {
		/* Nothing the refused calls tried was applied. */
		assert_absent(s, t.other, t.other_len);
		assert_value(s, t.own, t.own_len, "kept", 4);
		assert_int_equal(stats_of(s).keys, 2);
	}
}

/*
 * Prefetching (kv_store_prefetch) walks the index without changing it.
 */

/* The value test_prefetch stores at key i of its set. */
static size_t
prefetch_value(size_t i, char *buf, size_t cap)
{
	/* Every third value is long (an item), the others fit inline. */
	if (i % 3 == 0)
		return (size_t)snprintf(buf, cap, "a long value for key number %zu", i);
	return (size_t)snprintf(buf, cap, "v%zu", i % 100000);
}

static void
prefetching_present_absent_and_invalid_keys_changes_nothing(void **state)
{
	kv_store *s = FX(state)->s;
	enum { NK = 1000 + 256 + 30 + 4 };
	static char keys[NK][24];
	static size_t klens[NK];
	static kv_bytes all[NK + 16];
	char val[64];
	size_t n = 0, na = 0;

	/* Node shapes: a 12-byte shared prefix (past the 8 a node stores) over
	 * three levels of 10 digits (N16), a full byte fan-out (N256), 30
	 * children (N48), and keys that are prefixes of each other (terms). */
	for (size_t i = 0; i < 1000; i++, n++)
		klens[n] = (size_t)snprintf(keys[n], sizeof keys[n], "p00000000000%03zu", i);
	for (unsigned b = 0; b < 256; b++, n++) {
		keys[n][0] = 'w';
		keys[n][1] = (char)b;
		klens[n] = 2;
	}
	for (unsigned b = 0; b < 30; b++, n++) {
		keys[n][0] = 'f';
		keys[n][1] = (char)(b * 7);
		klens[n] = 2;
	}
	for (size_t l = 1; l <= 4; l++, n++) {
		memcpy(keys[n], "team", l);
		klens[n] = l + 1; /* "tt" .. "tteam": prefixes of each other */
		memmove(keys[n] + 1, keys[n], l);
		keys[n][0] = 't';
	}
	assert_int_equal(n, NK);
	for (size_t i = 0; i < n; i++) {
		size_t vl = prefetch_value(i, val, sizeof val);
		assert_int_equal(kv_store_put(s, keys[i], klens[i], val, vl), KV_OK);
		all[na++] = (kv_bytes){(const uint8_t *)keys[i], klens[i]};
	}
	/* Absent keys ending inside a prefix, past a leaf, at a missing
	 * child, and invalid ones (empty, NULL, too long). */
	static const char *absent[] = {"p0000000000", "p00000000000999x", "p1", "q", "w",
	                               "f\001",       "tteamwork",        "t"};
	static char too_long[KV_DEFAULT_MAX_KEY + 1];
	memset(too_long, 'p', sizeof too_long);
	for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
		all[na++] = (kv_bytes){(const uint8_t *)absent[i], strlen(absent[i])};
	all[na++] = (kv_bytes){(const uint8_t *)"x", 0};
	all[na++] = (kv_bytes){NULL, 3};
	all[na++] = (kv_bytes){(const uint8_t *)too_long, sizeof too_long};
	uint64_t before = stats_of(s).keys;

	kv_store_prefetch(s, na, all);
	kv_store_prefetch(s, 1, all);
	kv_store_prefetch(s, 0, NULL);
	kv_store_prefetch(NULL, na, all);

	assert_int_equal(stats_of(s).keys, before);
	for (size_t i = 0; i < n; i++) {
		size_t vl = prefetch_value(i, val, sizeof val);
		assert_value(s, keys[i], klens[i], val, vl);
	}
	for (size_t i = 0; i < sizeof absent / sizeof absent[0]; i++)
		assert_absent_s(s, absent[i]);
}

static const store_test semantic_tests[] = {
    STORE_TEST(prefetching_present_absent_and_invalid_keys_changes_nothing),
    STORE_TEST(put_then_get_returns_the_value),
    STORE_TEST(put_overwrites_the_previous_value),
    STORE_TEST(get_of_missing_key_returns_enotfound_and_leaves_no_state),
    STORE_TEST(get_replaces_the_contents_of_the_value_buffer),
    STORE_TEST(del_returns_the_value_and_a_second_del_returns_enotfound),
    STORE_TEST(del_without_a_buffer_removes_the_key),
    STORE_TEST(deleted_key_can_be_put_again),
    STORE_TEST(keys_that_are_prefixes_or_differ_in_the_last_byte_are_distinct),
    STORE_TEST(empty_value_is_legal),
    STORE_TEST(values_of_every_size_class_round_trip_through_overwrites),
    STORE_TEST(append_builds_the_value_from_five_appends),
    STORE_TEST(append_creates_an_absent_key),
    STORE_TEST(append_beyond_max_value_returns_etoobig_and_changes_nothing),
    STORE_TEST(mput_then_mget_of_16_pairs_returns_values_in_request_order),
    STORE_TEST(mput_then_mget_of_4096_pairs_returns_values_in_request_order),
    STORE_TEST(second_mput_overwrites_every_value),
    STORE_TEST(mget_with_one_missing_key_returns_enotfound_and_flags_only_that_key),
    STORE_TEST(mget_flags_every_missing_key),
    STORE_TEST(mput_with_unequal_counts_returns_einval_and_writes_nothing),
    STORE_TEST(mput_with_one_invalid_pair_writes_nothing),
    STORE_TEST(mget_with_a_repeated_key_returns_the_value_at_every_position),
    STORE_TEST(mput_with_a_repeated_key_counts_the_key_once),
    STORE_TEST(null_or_empty_key_returns_einval_and_changes_nothing),
    STORE_TEST(oversized_key_or_value_returns_etoobig_and_changes_nothing),
    STORE_TEST(null_store_or_buffer_arguments_return_einval),
    STORE_TEST(stats_track_puts_overwrites_deletes_and_appends),
    STORE_TEST(stats_changes_move_only_when_keys_or_sizes_change),
    STORE_TEST(stats_track_mput_over_new_and_existing_keys),
    STORE_TEST(memory_stats_cover_the_stored_bytes),
    STORE_TEST(filling_past_mem_limit_returns_enomem_and_keeps_acknowledged_keys),
    STORE_TEST(overwrite_or_append_that_runs_out_of_memory_keeps_the_old_value),
    STORE_TEST(mput_that_runs_out_of_memory_writes_nothing),
    STORE_TEST(writes_under_memory_pressure_are_all_or_nothing),
    STORE_TEST(run_on_runs_the_task_on_the_partition_owner),
    STORE_TEST(run_on_a_bad_partition_returns_einval),
    STORE_TEST(task_on_an_owner_thread_may_use_only_keys_of_its_partition),
};

/*
 * Options and helpers that do not depend on a configuration.
 */

static void
opts_init_gives_striped_defaults(void **state)
{
	kv_store_opts o;

	(void)state;
	memset(&o, 0xa5, sizeof o);
	kv_store_opts_init(&o);
	assert_int_equal(o.mode, KV_STORE_STRIPED);
	assert_int_equal(o.partitions, 0);
	assert_int_equal(o.max_key, 0);
	assert_int_equal(o.max_value, 0);
	assert_int_equal(o.mem_limit, 0);
	assert_false(o.pin_threads);
}

static void
create_with_null_opts_gives_a_striped_store_of_four_stripes_per_cpu(void **state)
{
	kv_store *s = NULL;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned want = 1, min = ncpu > 4 ? 4u * (unsigned)ncpu : 16u;

	(void)state;
	while (want < min)
		want <<= 1;
	assert_int_equal(kv_store_create(NULL, &s), KV_OK);
	assert_int_equal(kv_store_get_mode(s), KV_STORE_STRIPED);
	assert_int_equal(kv_store_partitions(s), want);
	put_s(s, "k", "v");
	assert_value_s(s, "k", "v");
	kv_store_destroy(s);
}

static void
percore_store_defaults_to_one_partition_per_cpu(void **state)
{
	kv_store_opts o;
	kv_store *s = NULL;
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	unsigned want = 1;

	(void)state;
	while (want < (unsigned)(ncpu > 0 ? ncpu : 1))
		want <<= 1;
	kv_store_opts_init(&o);
	o.mode = KV_STORE_PERCORE;
	assert_int_equal(kv_store_create(&o, &s), KV_OK);
	assert_int_equal(kv_store_get_mode(s), KV_STORE_PERCORE);
	assert_int_equal(kv_store_partitions(s), want);
	kv_store_destroy(s);
}

static void
partition_count_is_rounded_up_to_a_power_of_two(void **state)
{
	static const unsigned cases[][2] = {{1, 1},   {2, 2},     {3, 4},      {5, 8},
	                                    {64, 64}, {100, 128}, {4096, 4096}};
	kv_store_opts o;

	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		kv_store *s = NULL;
		kv_store_opts_init(&o);
		o.partitions = cases[i][0];
		assert_int_equal(kv_store_create(&o, &s), KV_OK);
		assert_int_equal(kv_store_partitions(s), cases[i][1]);
		kv_store_destroy(s);
	}
	kv_store_opts_init(&o);
	o.mode = KV_STORE_PERCORE;
	o.partitions = 3;
	{
		kv_store *s = NULL;
		assert_int_equal(kv_store_create(&o, &s), KV_OK);
		assert_int_equal(kv_store_partitions(s), 4);
		kv_store_destroy(s);
	}
}

static void
out_of_range_options_return_einval(void **state)
{
	kv_store_opts o;
	kv_store *s = (kv_store *)&o; /* must stay untouched */

	(void)state;
	kv_store_opts_init(&o);
	o.partitions = 4097;
	assert_int_equal(kv_store_create(&o, &s), KV_EINVAL);
	kv_store_opts_init(&o);
	o.max_key = KV_HARD_MAX_KEY + 1;
	assert_int_equal(kv_store_create(&o, &s), KV_EINVAL);
	kv_store_opts_init(&o);
	o.max_value = KV_HARD_MAX_VALUE + 1;
	assert_int_equal(kv_store_create(&o, &s), KV_EINVAL);
	kv_store_opts_init(&o);
	o.mode = (kv_store_mode)7;
	assert_int_equal(kv_store_create(&o, &s), KV_EINVAL);
	assert_ptr_equal(s, (kv_store *)&o);
	kv_store_opts_init(&o);
	assert_int_equal(kv_store_create(&o, NULL), KV_EINVAL);
}

static void
hard_limits_are_accepted(void **state)
{
	kv_store_opts o;
	kv_store *s = NULL;
	uint8_t *key = xcalloc(KV_HARD_MAX_KEY + 1, 1);

	(void)state;
	memset(key, 'h', KV_HARD_MAX_KEY + 1);
	kv_store_opts_init(&o);
	o.max_key = KV_HARD_MAX_KEY;
	o.max_value = KV_HARD_MAX_VALUE;
	assert_int_equal(kv_store_create(&o, &s), KV_OK);
	assert_int_equal(kv_store_put(s, key, KV_HARD_MAX_KEY, "v", 1), KV_OK);
	assert_value(s, key, KV_HARD_MAX_KEY, "v", 1);
	assert_int_equal(kv_store_put(s, key, KV_HARD_MAX_KEY + 1, "v", 1), KV_ETOOBIG);
	kv_store_destroy(s);
	free(key);
}

static void
partition_of_ignores_the_last_byte_of_the_key(void **state)
{
	kv_store_opts o;
	kv_store *s = NULL;
	char key[32];
	bool seen[64] = {false};
	size_t distinct = 0;

	(void)state;
	kv_store_opts_init(&o);
	o.partitions = 64;
	assert_int_equal(kv_store_create(&o, &s), KV_OK);
	for (size_t i = 0; i < 2000; i++) {
		size_t len = fmt_key(key, sizeof key, "p", i);
		unsigned p = kv_store_partition_of(s, key, len);
		assert_true(p < 64);
		assert_int_equal(p, kv_store_partition_of(s, key, len));
		key[len - 1] = (char)0xff;
		assert_int_equal(p, kv_store_partition_of(s, key, len));
		key[len - 1] = 0;
		assert_int_equal(p, kv_store_partition_of(s, key, len));
		if (!seen[p]) {
			seen[p] = true;
			distinct++;
		}
	}
	/* Keys spread: 200 distinct prefixes reach most of 64 partitions. */
	assert_true(distinct > 48);
	kv_store_destroy(s);
}

static void
destroy_accepts_null(void **state)
{
	(void)state;
	kv_store_destroy(NULL);
}

static void
scan_resume_key_appends_one_zero_byte(void **state)
{
	kv_buf out = {0};

	(void)state;
	assert_int_equal(kv_scan_resume_key("abc", 3, &out), KV_OK);
	assert_int_equal(out.len, 4);
	assert_memory_equal(out.data, "abc\0", 4);
	assert_int_equal(kv_scan_resume_key("\xff\xff", 2, &out), KV_OK);
	assert_int_equal(out.len, 3);
	assert_memory_equal(out.data, "\xff\xff\0", 3);
	kv_buf_fini(&out);
}

static void
pinned_percore_store_serves_requests(void **state)
{
	kv_store_opts o;
	kv_store *s = NULL;

	(void)state;
	kv_store_opts_init(&o);
	o.mode = KV_STORE_PERCORE;
	o.partitions = 4;
	o.pin_threads = true;
	assert_int_equal(kv_store_create(&o, &s), KV_OK);
	put_s(s, "pinned", "yes");
	assert_value_s(s, "pinned", "yes");
	kv_store_destroy(s);
}

static void
percore_store_with_many_partitions_starts_and_stops(void **state)
{
	kv_store_opts o;
	kv_store *s = NULL;
	char key[32];

	(void)state;
	kv_store_opts_init(&o);
	o.mode = KV_STORE_PERCORE;
	o.partitions = 128;
	assert_int_equal(kv_store_create(&o, &s), KV_OK);
	for (size_t i = 0; i < 1000; i++) {
		size_t len = fmt_key(key, sizeof key, "pc", i);
		assert_int_equal(kv_store_put(s, key, len, key, len), KV_OK);
	}
	assert_int_equal(stats_of(s).keys, 1000);
	kv_store_destroy(s);
}

/* The index's value for key k, or -1 when absent (values are one digit). */
static int
art_value(const kv_art *t, const char *k)
{
	const uint8_t *v;
	size_t vl;

	if (!kv_art_find(t, (const uint8_t *)k, strlen(k), &v, &vl))
		return -1;
	assert_int_equal(vl, 1);
	return v[0] - '0';
}

/* An insert first descends as a lookup does, checking a node's prefix by
 * the 8 bytes it stores: a key that differs past them, in a prefix of 16
 * shared bytes, must still split that prefix (whether its descent ended at
 * a leaf or at a missing child), and an overwrite below it must find the
 * key it replaces. */
static void
inserts_under_a_long_prefix_split_it_where_the_key_leaves_it(void **state)
{
	_Atomic uint64_t used = 0;
	kv_arena a;
	kv_art t;
	bool existed;
	size_t ovl;
	static const char *keys[] = {
	    "abcdefghijklmnop1", /* the two first share 16 bytes */
	    "abcdefghijklmnop2",
	    "abcdefghijXlmnop1", /* leaves at byte 10, its descent ends at a leaf */
	    "abcdefghijklmnoQ3", /* leaves at byte 15 */
	    "abcdefghijklmnop3", /* under the prefix again, at a missing child */
	    "abcdefghYjklmnop9", /* leaves at byte 8, the first not stored */
	};
	const size_t nk = sizeof keys / sizeof keys[0];

	(void)state;
	kv_arena_init(&a, &used, 0);
	kv_art_init(&t);
	for (size_t i = 0; i < nk; i++) {
		char v = (char)('0' + i);
		assert_int_equal(kv_art_upsert(&t, &a, (const uint8_t *)keys[i], strlen(keys[i]),
		                               (const uint8_t *)&v, 1, &existed, &ovl),
		                 KV_OK);
		assert_false(existed);
		for (size_t j = 0; j <= i; j++)
			assert_int_equal(art_value(&t, keys[j]), (int)j);
	}
	/* Overwrites: each key found, the others untouched. */
	for (size_t i = 0; i < nk; i++) {
		char v = (char)('0' + (nk - i));
		assert_int_equal(kv_art_upsert(&t, &a, (const uint8_t *)keys[i], strlen(keys[i]),
		                               (const uint8_t *)&v, 1, &existed, &ovl),
		                 KV_OK);
		assert_true(existed);
		assert_int_equal(ovl, 1);
	}
	for (size_t i = 0; i < nk; i++)
		assert_int_equal(art_value(&t, keys[i]), (int)(nk - i));
	assert_int_equal(art_value(&t, "abcdefghijXlmnop2"), -1);
	assert_int_equal(art_value(&t, "abcdefghijklmnop"), -1);
	kv_art_clear(&t, &a);
	kv_arena_fini(&a);
	assert_int_equal(atomic_load(&used), 0);
}

/* A partition's arena takes one 64 KiB block, then 2 MiB blocks aligned to
 * 2 MiB (what a transparent huge page needs). */
static void
an_arena_past_its_first_block_grows_in_huge_page_blocks(void **state)
{
	_Atomic uint64_t used = 0;
	kv_arena a;
	void *p[4096];
	size_t n = 0;

	(void)state;
	kv_arena_init(&a, &used, 0);
	/* 100-byte chunks: 650 fill the first block, the rest need another. */
	for (n = 0; n < 1000; n++)
		assert_non_null(p[n] = kv_arena_alloc(&a, 100));
	assert_int_equal(a.self_bytes, 64u * 1024u + 2u * 1024u * 1024u);
	assert_int_equal(atomic_load(&used), a.self_bytes);
	uintptr_t last = (uintptr_t)p[n - 1], base = last & ~(uintptr_t)(2u * 1024u * 1024u - 1);
	/* The block starts at the aligned base (its header first). */
	assert_true(last - base < 2u * 1024u * 1024u);
	assert_true(last - base > 0);
	for (; n < 4096; n++)
		assert_non_null(p[n] = kv_arena_alloc(&a, 1000));
	/* 3,096 chunks of 1,024 bytes more than the second block holds: a third
	 * block, also 2 MiB. */
	assert_int_equal(a.self_bytes, 64u * 1024u + 2u * 2u * 1024u * 1024u);
	kv_arena_fini(&a);
	assert_int_equal(atomic_load(&used), 0);
}

/* An arena in use asks for its next block ahead; the block it is given
 * (touched outside any lock) is charged at once and taken by the next
 * growth without another allocation. */
static void
an_arena_grows_into_the_spare_block_it_was_given(void **state)
{
	_Atomic uint64_t used = 0;
	kv_arena a;
	size_t n = 0;
	const uint64_t big = 2u * 1024u * 1024u;

	(void)state;
	kv_arena_init(&a, &used, 0);
	assert_false(kv_arena_wants_spare(&a)); /* nothing allocated yet */
	while (!kv_arena_wants_spare(&a)) {
		assert_non_null(kv_arena_alloc(&a, 100));
		n++;
	}
	/* The first block (64 KiB), less than a quarter of it not yet carved
	 * into runs, and room left in the runs. */
	assert_int_equal(a.self_bytes, 64u * 1024u);
	assert_true(n > 100);
	void *b = kv_arena_block_make();
	assert_non_null(b);
	assert_int_equal(kv_arena_spare_put(&a, b), KV_OK);
	assert_int_equal(a.self_bytes, 64u * 1024u + big);
	assert_int_equal(atomic_load(&used), a.self_bytes);
	assert_false(kv_arena_wants_spare(&a));
	void *again = kv_arena_block_make();
	assert_int_equal(kv_arena_spare_put(&a, again), KV_EEXISTS);
	kv_arena_block_free(again);

	/* Past the first block: the chunks come from the spare, nothing new is
	 * taken from the system. */
	uint8_t *p = NULL;
	for (size_t i = 0; i < 1000; i++)
		assert_non_null(p = kv_arena_alloc(&a, 100));
	assert_true(p > (uint8_t *)b && p < (uint8_t *)b + big);
	assert_int_equal(a.self_bytes, 64u * 1024u + big);
	assert_null(a.spare);
	/* A quarter of that block left: the next spare is wanted. */
	while (!kv_arena_wants_spare(&a))
		assert_non_null(kv_arena_alloc(&a, 1000));
	assert_int_equal(a.self_bytes, 64u * 1024u + big);
	assert_int_equal(kv_arena_spare_put(&a, kv_arena_block_make()), KV_OK);
	kv_arena_fini(&a); /* frees the spare too (ASan: no leak) */
	assert_int_equal(atomic_load(&used), 0);
}

/* A spare the limit refuses is not asked for again: near the limit the
 * arena grows as it did without one. */
static void
an_arena_whose_limit_refuses_a_spare_asks_for_none_again(void **state)
{
	_Atomic uint64_t used = 0;
	kv_arena a;

	(void)state;
	kv_arena_init(&a, &used, 1024u * 1024u);
	while (!kv_arena_wants_spare(&a))
		assert_non_null(kv_arena_alloc(&a, 100));
	void *b = kv_arena_block_make();
	assert_int_equal(kv_arena_spare_put(&a, b), KV_ENOMEM);
	kv_arena_block_free(b);
	assert_int_equal(atomic_load(&used), 64u * 1024u);
	assert_false(kv_arena_wants_spare(&a));
	kv_arena_fini(&a);
	assert_int_equal(atomic_load(&used), 0);
}

/* A striped partition's writer makes the arena's next block after it lets
 * go of the partition, before the newest block is full: the growth under
 * the partition's lock then takes it without touching fresh memory. */
static void
a_striped_partition_has_its_next_block_before_it_needs_it(void **state)
{
	kv_store_opts o;
	kv_store *s;
	char key[32], val[100];
	const uint64_t first = 64u * 1024u, big = 2u * 1024u * 1024u;

	(void)state;
	kv_store_opts_init(&o);
	o.mode = KV_STORE_STRIPED;
	o.partitions = 1;
	assert_int_equal(kv_store_create(&o, &s), KV_OK);
	memset(val, 'v', sizeof val);
	/* 200 items of about 110 bytes: a third of the first block, which
	 * holds nearly 300 of them. The next block is there already. */
	for (int i = 0; i < 200; i++) {
		int n = snprintf(key, sizeof key, "k%06d", i);
		assert_int_equal(kv_store_put(s, key, (size_t)n, val, sizeof val), KV_OK);
	}
	assert_int_equal(kv_store_mem_used(s), first + big);
	/* Well into that block: nothing more taken from the system. */
	for (int i = 200; i < 6000; i++) {
		int n = snprintf(key, sizeof key, "k%06d", i);
		assert_int_equal(kv_store_put(s, key, (size_t)n, val, sizeof val), KV_OK);
	}
	assert_int_equal(kv_store_mem_used(s), first + big);
	/* mput lets go of its partitions the same way: the third block comes
	 * while the second still has room. */
	kv_bytes ks[16], vs[16];
	char kb[16][16];
	int r = 0;
	for (; kv_store_mem_used(s) == first + big; r++) {
		assert_true(r < 2000);
		for (int i = 0; i < 16; i++) {
			int n = snprintf(kb[i], sizeof kb[i], "m%05d%02d", r, i);
			ks[i] = (kv_bytes){(const uint8_t *)kb[i], (size_t)n};
			vs[i] = (kv_bytes){(const uint8_t *)val, sizeof val};
		}
		assert_int_equal(kv_store_mput(s, 16, ks, 16, vs), KV_OK);
	}
	assert_int_equal(kv_store_mem_used(s), first + 2 * big);
	/* The second block was about three quarters full: it holds some 3,000
	 * more items of this size before the third one is needed. */
	for (int i = 0; i < 1000; i++) {
		int n = snprintf(key, sizeof key, "z%06d", i);
		assert_int_equal(kv_store_put(s, key, (size_t)n, val, sizeof val), KV_OK);
	}
	assert_int_equal(kv_store_mem_used(s), first + 2 * big);
	for (int i = 0; i < 6000; i += 997) {
		int n = snprintf(key, sizeof key, "k%06d", i);
		assert_value(s, key, (size_t)n, val, sizeof val);
	}
	kv_store_destroy(s);
}

/* Near its limit an arena takes the smallest block that holds a chunk
 * rather than failing for want of a 2 MiB one, and never passes the limit. */
static void
an_arena_near_its_limit_takes_a_small_block_instead_of_failing(void **state)
{
	_Atomic uint64_t used = 0;
	const uint64_t limit = 64u * 1024u + 200u * 1024u;
	kv_arena a;
	size_t n = 0;

	(void)state;
	kv_arena_init(&a, &used, limit);
	while (kv_arena_alloc(&a, 100) != NULL)
		n++;
	/* 64 KiB, then 64 KiB blocks (a 2 MiB one would not fit) up to the limit. */
	assert_true(a.self_bytes > 64u * 1024u);
	assert_true(atomic_load(&used) <= limit);
	assert_true(limit - atomic_load(&used) < 64u * 1024u);
	assert_true(n > 2000);
	/* A chunk larger than a small block is refused when nothing fits. */
	assert_null(kv_arena_alloc(&a, 4000));
	kv_arena_fini(&a);
	assert_int_equal(atomic_load(&used), 0);
}

int
main(void)
{
	static const struct CMUnitTest config_tests[] = {
	    cmocka_unit_test(opts_init_gives_striped_defaults),
	    cmocka_unit_test(inserts_under_a_long_prefix_split_it_where_the_key_leaves_it),
	    cmocka_unit_test(an_arena_past_its_first_block_grows_in_huge_page_blocks),
	    cmocka_unit_test(an_arena_near_its_limit_takes_a_small_block_instead_of_failing),
	    cmocka_unit_test(an_arena_grows_into_the_spare_block_it_was_given),
	    cmocka_unit_test(an_arena_whose_limit_refuses_a_spare_asks_for_none_again),
	    cmocka_unit_test(a_striped_partition_has_its_next_block_before_it_needs_it),
	    cmocka_unit_test(create_with_null_opts_gives_a_striped_store_of_four_stripes_per_cpu),
	    cmocka_unit_test(percore_store_defaults_to_one_partition_per_cpu),
	    cmocka_unit_test(partition_count_is_rounded_up_to_a_power_of_two),
	    cmocka_unit_test(out_of_range_options_return_einval),
	    cmocka_unit_test(hard_limits_are_accepted),
	    cmocka_unit_test(partition_of_ignores_the_last_byte_of_the_key),
	    cmocka_unit_test(destroy_accepts_null),
	    cmocka_unit_test(scan_resume_key_appends_one_zero_byte),
	    cmocka_unit_test(pinned_percore_store_serves_requests),
	    cmocka_unit_test(percore_store_with_many_partitions_starts_and_stops),
	};
	int failed = cmocka_run_group_tests_name("store options", config_tests, NULL, NULL);

	failed += run_store_groups("test_store", semantic_tests,
	                           sizeof semantic_tests / sizeof semantic_tests[0], store_cfgs,
	                           store_ncfgs);
	return failed == 0 ? 0 : 1;
}
