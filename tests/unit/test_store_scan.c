/*
 * test_store_scan.c - ordered reads and range maintenance of the local store:
 * kv_store_scan (order, bounds, limits, resumption, keys-only), the per-
 * partition scan, and the bounded range operations used by migration
 * (range_step, range_delete, range_count, range_split_key). Single-threaded;
 * the same operations racing writers are in test_store_concurrency.c.
 */
#include "tests/support/store_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FX(state) ((store_fixture *)*(state))

/* A value derived from the key, so that any entry can be checked on its own. */
static size_t
value_of_key(const void *key, size_t klen, uint8_t *out, size_t cap)
{
	const uint8_t *k = key;
	size_t n = 0;

	if (cap < 2 * klen + 1)
		abort();
	out[n++] = (uint8_t)klen;
	for (size_t i = klen; i-- > 0;)
		out[n++] = k[i];
	for (size_t i = 0; i < klen; i++)
		out[n++] = (uint8_t)(k[i] ^ 0x5a);
	return n;
}

static void
put_keyed(kv_store *s, const void *key, size_t klen)
{
	uint8_t v[2 * 128 + 1];
	size_t vlen = value_of_key(key, klen, v, sizeof v);

	assert_int_equal(kv_store_put(s, key, klen, v, vlen), KV_OK);
}

/* Returns whether entry i's value is the one put_keyed wrote for its key. */
static bool
entry_value_matches_key(const entry_list *l, size_t i)
{
	uint8_t v[2 * 128 + 1];
	size_t vlen = value_of_key(l->keys[i].data, l->keys[i].len, v, sizeof v);

	return l->val_set[i] && l->vals[i].len == vlen && memcmp(l->vals[i].data, v, vlen) == 0;
}

/* Puts keys "<prefix><i>" for i in [0, n), values from put_keyed. */
static void
put_numbered(kv_store *s, const char *prefix, size_t n)
{
	char key[32];

	for (size_t i = 0; i < n; i++) {
		size_t klen = fmt_key(key, sizeof key, prefix, i);
		put_keyed(s, key, klen);
	}
}

/* Asserts that `l` holds exactly the keys model[0..n) in this order, with keyed values. */
static void
assert_entries_are(const entry_list *l, const kv_bytes *model, size_t n)
{
	assert_int_equal(l->n, n);
	for (size_t i = 0; i < n; i++) {
		if (!entry_key_is(l, i, model[i].p, model[i].len))
			fail_msg("entry %zu of %zu is not the expected key", i, n);
		assert_true(entry_value_matches_key(l, i));
	}
}

static void
assert_strictly_increasing(const entry_list *l)
{
	for (size_t i = 1; i < l->n; i++) {
		if (kv_key_cmp(l->keys[i - 1].data, l->keys[i - 1].len, l->keys[i].data,
		               l->keys[i].len) >= 0)
			fail_msg("entries %zu and %zu are out of order", i - 1, i);
	}
}

/*
 * Order.
 */

static void
scan_returns_keys_in_bytewise_order(void **state)
{
	/* Sorted bytewise; inserted in a scrambled order below. */
	static const kv_bytes sorted[] = {
	    {(const uint8_t *)"\0", 1},
	    {(const uint8_t *)"\0\0", 2},
	    {(const uint8_t *)"\0\0\0", 3},
	    {(const uint8_t *)"\0\x01", 2},
	    {(const uint8_t *)"\0\xff", 2},
	    {(const uint8_t *)"\x01", 1},
	    {(const uint8_t *)"A", 1},
	    {(const uint8_t *)"a", 1},
	    {(const uint8_t *)"a\0", 2},
	    {(const uint8_t *)"a\0\0", 3},
	    {(const uint8_t *)"a\0b", 3},
	    {(const uint8_t *)"a\x01", 2},
	    {(const uint8_t *)"ab", 2},
	    {(const uint8_t *)"abc", 3},
	    {(const uint8_t *)"abcd", 4},
	    {(const uint8_t *)"abd", 3},
	    {(const uint8_t *)"a\x7f", 2},
	    {(const uint8_t *)"a\x80", 2},
	    {(const uint8_t *)"a\xff", 2},
	    {(const uint8_t *)"a\xff\0", 3},
	    {(const uint8_t *)"a\xff\xff", 3},
	    {(const uint8_t *)"b", 1},
	    {(const uint8_t *)"\x7f", 1},
	    {(const uint8_t *)"\x80", 1},
	    {(const uint8_t *)"\x80\0", 2},
	    {(const uint8_t *)"\xfe\xff", 2},
	    {(const uint8_t *)"\xff", 1},
	    {(const uint8_t *)"\xff\0", 2},
	    {(const uint8_t *)"\xff\xfe", 2},
	    {(const uint8_t *)"\xff\xff", 2},
	    {(const uint8_t *)"\xff\xff\xff", 3},
	};
	size_t n = sizeof sorted / sizeof sorted[0];
	kv_store *s = FX(state)->s;
	entry_list l = {0};

	for (size_t i = 1; i < n; i++)
		assert_true(bytes_cmp(&sorted[i - 1], &sorted[i]) < 0);
	/* 7 is coprime to n, so this visits every index once. */
	for (size_t i = 0; i < n; i++) {
		const kv_bytes *k = &sorted[(i * 7) % n];
		put_keyed(s, k->p, k->len);
	}
	scan_all(s, NULL, 0, NULL, 0, &l);
	assert_entries_are(&l, sorted, n);
	assert_int_equal(stats_of(s).keys, n);
	entry_list_fini(&l);
}

/* A sorted, duplicate-free set of random binary keys, with a presence flag each. */
typedef struct {
	size_t n;
	kv_bytes *keys;
	uint8_t *bytes;
	bool *present;
} key_model;

/*
 * Makes n random keys (duplicates dropped). With shared_prefix 0 they are 1..12
 * bytes over a small alphabet; otherwise each starts with a random-length
 * piece (0..shared_prefix bytes) of one fixed long prefix, so that keys share
 * long prefixes that end at every possible depth.
 */
static void
key_model_init_ex(key_model *m, size_t n, uint64_t seed, size_t shared_prefix)
{
	/* Few distinct bytes, so that keys share prefixes and hit 0x00 / 0xff often. */
	static const uint8_t alphabet[] = {0x00, 0x01, 'a', 'b', 0x7f, 0x80, 0xfe, 0xff};
	size_t tail = 12, maxlen = shared_prefix + tail, w = 0;

	m->keys = xcalloc(n, sizeof *m->keys);
	m->bytes = xcalloc(n, maxlen);
	m->present = xcalloc(n, sizeof *m->present);
	for (size_t i = 0; i < n; i++) {
		uint8_t *k = m->bytes + i * maxlen;
		size_t plen = shared_prefix ? rng_below(&seed, shared_prefix + 1) : 0;
		size_t len = plen + (plen ? rng_below(&seed, tail) : 1 + rng_below(&seed, tail));
		for (size_t j = 0; j < plen; j++)
			k[j] = (uint8_t)('A' + j % 26);
		for (size_t j = plen; j < len; j++)
			k[j] = alphabet[rng_below(&seed, sizeof alphabet)];
		m->keys[i] = (kv_bytes){k, len};
	}
	qsort(m->keys, n, sizeof *m->keys, bytes_cmp);
	for (size_t i = 0; i < n; i++) {
		if (w > 0 && bytes_cmp(&m->keys[w - 1], &m->keys[i]) == 0)
			continue;
		m->keys[w++] = m->keys[i];
	}
	m->n = w;
}

static void
key_model_init(key_model *m, size_t n, uint64_t seed)
{
	key_model_init_ex(m, n, seed, 0);
}

static void
key_model_fini(key_model *m)
{
	free(m->keys);
	free(m->bytes);
	free(m->present);
}

/* Asserts that a scan of [start, end) returns exactly the present model keys in it. */
static void
assert_scan_matches_model(kv_store *s, const key_model *m, const kv_bytes *start,
                          const kv_bytes *end)
{
	entry_list l = {0};
	size_t j = 0;

	scan_all(s, start->p, start->len, end->p, end->len, &l);
	for (size_t i = 0; i < m->n; i++) {
		const kv_bytes *k = &m->keys[i];
		if (!m->present[i] ||
		    !kv_range_contains(start->p, start->len, end->p, end->len, k->p, k->len))
			continue;
		if (!entry_key_is(&l, j, k->p, k->len))
			fail_msg("scan entry %zu differs from the model (model key %zu)", j, i);
		assert_true(entry_value_matches_key(&l, j));
		j++;
	}
	assert_int_equal(l.n, j);
	entry_list_fini(&l);
}

static void
scan_of_random_binary_keys_matches_a_sorted_model(void **state)
{
	kv_store *s = store_open_extra(FX(state), FX(state)->cfg->big_partitions, 0, 0, 0);
	uint64_t seed = 42;
	key_model m;
	kv_bytes all = {NULL, 0};

	key_model_init(&m, 3000, 7);
	for (size_t i = 0; i < m.n; i++) {
		size_t r = (i * 7919) % m.n; /* 7919 is prime and m.n < 7919 */
		put_keyed(s, m.keys[r].p, m.keys[r].len);
		m.present[r] = true;
	}
	assert_int_equal(stats_of(s).keys, m.n);
	assert_scan_matches_model(s, &m, &all, &all);

	for (int round = 0; round < 2; round++) {
		for (int q = 0; q < 40; q++) {
			kv_bytes a = m.keys[rng_below(&seed, m.n)];
			kv_bytes b = m.keys[rng_below(&seed, m.n)];
			if (q % 4 == 0)
				a.len = a.len > 1 ? a.len - 1 : a.len; /* a prefix, maybe absent */
			if (bytes_cmp(&a, &b) > 0) {
				kv_bytes t = a;
				a = b;
				b = t;
			}
			assert_scan_matches_model(s, &m, &a, q % 5 == 0 ? &all : &b);
		}
		/* Delete about half of the keys and check again. */
		for (size_t i = 0; i < m.n && round == 0; i++) {
			if (rng_below(&seed, 2) == 0)
				continue;
			assert_int_equal(kv_store_del(s, m.keys[i].p, m.keys[i].len, NULL), KV_OK);
			m.present[i] = false;
		}
		assert_scan_matches_model(s, &m, &all, &all);
	}
	key_model_fini(&m);
}

static void
keys_with_long_shared_prefixes_stay_distinct_and_ordered(void **state)
{
	kv_store *s = FX(state)->s;
	key_model m;
	kv_bytes all = {NULL, 0};
	uint64_t seed = 3;

	/* A 60-byte prefix cut at every depth, then short tails: path compression. */
	key_model_init_ex(&m, 2500, 17, 60);
	for (size_t i = 0; i < m.n; i++) {
		size_t r = (i * 7919) % m.n;
		put_keyed(s, m.keys[r].p, m.keys[r].len);
		m.present[r] = true;
	}
	assert_int_equal(stats_of(s).keys, m.n);
	for (size_t i = 0; i < m.n; i++) {
		uint8_t v[2 * 128 + 1];
		size_t vlen = value_of_key(m.keys[i].p, m.keys[i].len, v, sizeof v);
		assert_value(s, m.keys[i].p, m.keys[i].len, v, vlen);
	}
	assert_scan_matches_model(s, &m, &all, &all);
	for (int q = 0; q < 20; q++) {
		kv_bytes a = m.keys[rng_below(&seed, m.n)], b = m.keys[rng_below(&seed, m.n)];
		if (bytes_cmp(&a, &b) > 0) {
			kv_bytes t = a;
			a = b;
			b = t;
		}
		assert_scan_matches_model(s, &m, &a, &b);
	}
	/* Deleting keys collapses inner nodes; the rest must stay reachable. */
	for (size_t i = 0; i < m.n; i++) {
		if (rng_below(&seed, 3) == 0)
			continue;
		assert_int_equal(kv_store_del(s, m.keys[i].p, m.keys[i].len, NULL), KV_OK);
		m.present[i] = false;
	}
	for (size_t i = 0; i < m.n; i++) {
		uint8_t v[2 * 128 + 1];
		size_t vlen = value_of_key(m.keys[i].p, m.keys[i].len, v, sizeof v);
		if (m.present[i])
			assert_value(s, m.keys[i].p, m.keys[i].len, v, vlen);
		else
			assert_absent(s, m.keys[i].p, m.keys[i].len);
	}
	assert_scan_matches_model(s, &m, &all, &all);
	key_model_fini(&m);
}

static void
node_with_256_children_grows_and_shrinks_in_order(void **state)
{
	kv_store *s = FX(state)->s;
	key_model m;
	uint8_t *bytes = xcalloc(256 * 2 + 1, 3);
	size_t n = 0;
	kv_bytes all = {NULL, 0};

	/* "n", "n"+b for every byte b, and "n"+b+"x" for every other b. */
	m.keys = xcalloc(1 + 256 + 128, sizeof *m.keys);
	m.present = xcalloc(1 + 256 + 128, sizeof *m.present);
	m.bytes = bytes;
	bytes[0] = 'n';
	m.keys[n++] = (kv_bytes){bytes, 1};
	for (unsigned b = 0; b < 256; b++) {
		uint8_t *k = bytes + 3 * (1 + b);
		k[0] = 'n';
		k[1] = (uint8_t)b;
		k[2] = 'x';
		m.keys[n++] = (kv_bytes){k, 2};
		if (b % 2 == 0)
			m.keys[n++] = (kv_bytes){k, 3};
	}
	m.n = n;
	qsort(m.keys, n, sizeof *m.keys, bytes_cmp);

	/* Grow: insert in an order that is neither ascending nor descending. */
	for (size_t i = 0; i < n; i++) {
		size_t r = (i * 101) % n;
		put_keyed(s, m.keys[r].p, m.keys[r].len);
		m.present[r] = true;
		if (i == 3 || i == 15 || i == 47 || i == 100)
			assert_scan_matches_model(s, &m, &all, &all);
	}
	assert_scan_matches_model(s, &m, &all, &all);

	/* Shrink, checking at the sizes where nodes typically change type. */
	for (size_t i = 0; i < n; i++) {
		size_t r = (i * 37) % n;
		size_t left = n - i - 1;
		assert_int_equal(kv_store_del(s, m.keys[r].p, m.keys[r].len, NULL), KV_OK);
		m.present[r] = false;
		if (left == 300 || left == 48 || left == 47 || left == 16 || left == 15 ||
		    left == 4 || left == 3 || left == 1 || left == 0)
			assert_scan_matches_model(s, &m, &all, &all);
	}
	assert_int_equal(stats_of(s).keys, 0);
	key_model_fini(&m);
}

static void
scan_sees_overwrites_and_deletes(void **state)
{
	kv_store *s = FX(state)->s;
	entry_list l = {0};

	put_s(s, "a", "1");
	put_s(s, "b", "2");
	put_s(s, "c", "3");
	put_s(s, "b", "two");
	assert_int_equal(kv_store_del(s, "a", 1, NULL), KV_OK);
	assert_int_equal(kv_store_append(s, "c", 1, "33", 2, NULL), KV_OK);
	scan_all(s, NULL, 0, NULL, 0, &l);
	assert_int_equal(l.n, 2);
	assert_true(entry_key_is(&l, 0, "b", 1));
	assert_int_equal(l.vals[0].len, 3);
	assert_memory_equal(l.vals[0].data, "two", 3);
	assert_true(entry_key_is(&l, 1, "c", 1));
	assert_int_equal(l.vals[1].len, 3);
	assert_memory_equal(l.vals[1].data, "333", 3);
	entry_list_fini(&l);
}

/*
 * Bounds, limits and resumption.
 */

static void
scan_includes_start_and_excludes_end(void **state)
{
	kv_store *s = FX(state)->s;
	entry_list l = {0};
	char key[32];

	put_numbered(s, "k", 10); /* k000000 .. k000009 */

	scan_all(s, "k000003", 7, "k000007", 7, &l);
	assert_int_equal(l.n, 4);
	for (size_t i = 0; i < 4; i++) {
		size_t klen = fmt_key(key, sizeof key, "k", 3 + i);
		assert_true(entry_key_is(&l, i, key, klen));
		assert_true(entry_value_matches_key(&l, i));
	}

	/* Bounds that are not keys: a longer start and a prefix end. */
	scan_all(s, "k0000035", 8, "k000008", 7, &l);
	assert_int_equal(l.n, 4);
	assert_true(entry_key_is(&l, 0, "k000004", 7));
	scan_all(s, "k", 1, "k00000", 6, &l);
	assert_int_equal(l.n, 0);
	scan_all(s, "k00000", 6, "k000001", 7, &l);
	assert_int_equal(l.n, 1);
	assert_true(entry_key_is(&l, 0, "k000000", 7));

	/* The end key itself, as start, is included. */
	scan_all(s, "k000009", 7, "l", 1, &l);
	assert_int_equal(l.n, 1);
	assert_true(entry_key_is(&l, 0, "k000009", 7));

	/* The resume key of a key excludes exactly that key. */
	scan_all(s, "k000009\0", 8, NULL, 0, &l);
	assert_int_equal(l.n, 0);
	entry_list_fini(&l);
}

static void
scan_with_empty_end_is_unbounded(void **state)
{
	kv_store *s = FX(state)->s;
	entry_list l = {0};

	put_s(s, "\xff\xff\xff\xff", "top");
	put_s(s, "m", "mid");
	assert_int_equal(kv_store_put(s, "\0", 1, "bottom", 6), KV_OK);

	scan_all(s, "m", 1, NULL, 0, &l);
	assert_int_equal(l.n, 2);
	assert_true(entry_key_is(&l, 0, "m", 1));
	assert_true(entry_key_is(&l, 1, "\xff\xff\xff\xff", 4));

	scan_all(s, "", 0, "", 0, &l);
	assert_int_equal(l.n, 3);
	assert_true(entry_key_is(&l, 0, "\0", 1));

	scan_all(s, NULL, 0, "m", 1, &l);
	assert_int_equal(l.n, 1);
	assert_true(entry_key_is(&l, 0, "\0", 1));
	entry_list_fini(&l);
}

static void
scan_with_limit_sets_more_only_when_entries_remain(void **state)
{
	kv_store *s = FX(state)->s;
	entry_list l = {0};
	bool more;

	put_numbered(s, "k", 10);

	more = false;
	assert_int_equal(kv_store_scan(s, NULL, 0, NULL, 0, 3, true, entry_list_cb, &l, &more),
	                 KV_OK);
	assert_int_equal(l.n, 3);
	assert_true(more);
	assert_true(entry_key_is(&l, 2, "k000002", 7));

	for (size_t limit = 9; limit <= 11; limit++) {
		entry_list_fini(&l);
		more = limit == 9 ? false : true;
		assert_int_equal(
		    kv_store_scan(s, NULL, 0, NULL, 0, limit, true, entry_list_cb, &l, &more),
		    KV_OK);
		assert_int_equal(l.n, limit < 10 ? limit : 10);
		assert_int_equal(more, limit < 10);
	}

	/* Keys past the end of the range do not count as more. */
	entry_list_fini(&l);
	more = true;
	assert_int_equal(
	    kv_store_scan(s, "k000002", 7, "k000005", 7, 3, true, entry_list_cb, &l, &more), KV_OK);
	assert_int_equal(l.n, 3);
	assert_false(more);
	entry_list_fini(&l);
	more = false;
	assert_int_equal(
	    kv_store_scan(s, "k000002", 7, "k000005", 7, 2, true, entry_list_cb, &l, &more), KV_OK);
	assert_int_equal(l.n, 2);
	assert_true(more);

	/* `more` may be NULL. */
	entry_list_fini(&l);
	assert_int_equal(kv_store_scan(s, NULL, 0, NULL, 0, 4, true, entry_list_cb, &l, NULL),
	                 KV_OK);
	assert_int_equal(l.n, 4);
	entry_list_fini(&l);
}

/* Pages through [start, end) with `limit` entries a page, resuming after the last key. */
static void
scan_in_pages(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
              size_t limit, bool with_values, entry_list *out, size_t *pages)
{
	kv_buf from = {0};
	bool more = true;

	assert_int_equal(kv_buf_set(&from, start, slen), KV_OK);
	*pages = 0;
	while (more) {
		size_t before = out->n;
		more = false;
		assert_int_equal(kv_store_scan(s, from.data, from.len, end, elen, limit,
		                               with_values, entry_list_cb, out, &more),
		                 KV_OK);
		assert_true(out->n - before <= limit);
		if (more)
			assert_int_equal(out->n - before, limit);
		(*pages)++;
		assert_true(*pages <= 100000);
		if (out->n > before)
			assert_int_equal(kv_scan_resume_key(out->keys[out->n - 1].data,
			                                    out->keys[out->n - 1].len, &from),
			                 KV_OK);
		else
			assert_false(more);
	}
	kv_buf_fini(&from);
}

static void
scan_resumed_with_resume_key_visits_every_key_once_across_partitions(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = store_open_extra(fx, fx->cfg->big_partitions, 0, 0, 0);
	unsigned nparts = kv_store_partitions(s);
	size_t n = 3000, pages = 0;
	bool *seen_part = xcalloc(nparts, sizeof *seen_part);
	entry_list l = {0};
	char key[32];

	/* Keys r<10 i>: the last byte is always '0', so that every key has its own
	 * partition hash (which ignores the last byte) and they spread over all. */
	for (size_t i = 0; i < n; i++) {
		size_t klen = fmt_key(key, sizeof key, "r", 10 * i);
		put_keyed(s, key, klen);
		seen_part[kv_store_partition_of(s, key, klen)] = true;
	}
	for (unsigned p = 0; p < nparts; p++)
		assert_true(seen_part[p]);

	scan_in_pages(s, NULL, 0, NULL, 0, 17, true, &l, &pages);
	assert_int_equal(l.n, n);
	assert_int_equal(pages, (n + 16) / 17);
	for (size_t i = 0; i < n; i++) {
		size_t klen = fmt_key(key, sizeof key, "r", 10 * i);
		assert_true(entry_key_is(&l, i, key, klen));
		assert_true(entry_value_matches_key(&l, i));
	}

	/* Bounded, keys only, page size 1. */
	entry_list_fini(&l);
	scan_in_pages(s, "r001000", 7, "r002500", 7, 1, false, &l, &pages);
	assert_int_equal(l.n, 150);
	assert_int_equal(pages, 150);
	assert_strictly_increasing(&l);
	assert_true(entry_key_is(&l, 0, "r001000", 7));
	assert_true(entry_key_is(&l, 149, "r002490", 7));

	entry_list_fini(&l);
	free(seen_part);
}

static void
scan_resumes_after_keys_of_the_maximum_length(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = store_open_extra(fx, fx->cfg->big_partitions, 16, 0, 0);
	uint8_t key[16];
	entry_list l = {0};
	size_t pages = 0;

	/* 16-byte keys (the limit) that differ in their last two bytes, 0xff included. */
	memset(key, 'L', sizeof key);
	for (unsigned i = 0; i < 300; i++) {
		key[14] = (uint8_t)(0xff - i % 7);
		key[15] = (uint8_t)(i * 13);
		put_keyed(s, key, sizeof key);
	}
	put_s(s, "M", "after");
	for (size_t page = 1; page <= 5; page += 4) {
		entry_list_fini(&l);
		/* Every resume key is 17 bytes, one more than max_key: still a valid bound. */
		scan_in_pages(s, NULL, 0, NULL, 0, page, true, &l, &pages);
		assert_int_equal(l.n, stats_of(s).keys);
		assert_strictly_increasing(&l);
		assert_true(entry_key_is(&l, l.n - 1, "M", 1));
	}
	entry_list_fini(&l);
	scan_all(s, "LLLLLLLLLLLLLL\xff\xff\0", 17, NULL, 0, &l);
	for (size_t i = 0; i + 1 < l.n; i++)
		assert_true(
		    kv_key_cmp(l.keys[i].data, l.keys[i].len, "LLLLLLLLLLLLLL\xff\xff\0", 17) > 0);
	assert_true(entry_key_is(&l, l.n - 1, "M", 1));
	entry_list_fini(&l);
}

static void
keys_only_scan_passes_null_values(void **state)
{
	kv_store *s = FX(state)->s;
	entry_list l = {0};
	bool more = true;

	put_numbered(s, "ko", 50);
	put_s(s, "empty", "");
	assert_int_equal(kv_store_scan(s, NULL, 0, NULL, 0, 0, false, entry_list_cb, &l, &more),
	                 KV_OK);
	assert_false(more);
	assert_int_equal(l.n, 51);
	assert_true(entry_key_is(&l, 0, "empty", 5));
	assert_strictly_increasing(&l);
	for (size_t i = 0; i < l.n; i++)
		assert_false(l.val_set[i]);
	entry_list_fini(&l);
}

static void
scan_of_an_empty_range_visits_nothing(void **state)
{
	kv_store *s = FX(state)->s;
	entry_list l = {0};
	bool more = true;
	int rv;

	/* An empty store. */
	scan_all(s, NULL, 0, NULL, 0, &l);
	assert_int_equal(l.n, 0);

	put_numbered(s, "k", 20);
	/* start == end, on a key and off keys. */
	scan_all(s, "k000005", 7, "k000005", 7, &l);
	assert_int_equal(l.n, 0);
	scan_all(s, "a", 1, "a", 1, &l);
	assert_int_equal(l.n, 0);
	/* A non-empty range that holds no keys, before, between and after them. */
	scan_all(s, "a", 1, "b", 1, &l);
	assert_int_equal(l.n, 0);
	scan_all(s, "k0000051", 8, "k000006", 7, &l);
	assert_int_equal(l.n, 0);
	scan_all(s, "l", 1, NULL, 0, &l);
	assert_int_equal(l.n, 0);
	/* An inverted range is empty, or refused. */
	rv = kv_store_scan(s, "k000009", 7, "k000002", 7, 0, true, entry_list_cb, &l, &more);
	assert_true(rv == KV_OK || rv == KV_EINVAL);
	assert_int_equal(l.n, 0);
	if (rv == KV_OK)
		assert_false(more);
	entry_list_fini(&l);
}

static void
scan_stops_when_the_callback_returns_nonzero(void **state)
{
	kv_store *s = FX(state)->s;
	entry_list l = {.stop_after = 5};

	put_numbered(s, "st", 100);
	assert_int_equal(kv_store_scan(s, NULL, 0, NULL, 0, 0, true, entry_list_cb, &l, NULL),
	                 KV_OK);
	assert_int_equal(l.n, 5);
	assert_true(entry_key_is(&l, 4, "st000004", 8));
	entry_list_fini(&l);
}

static void
scan_partition_visits_the_keys_of_one_partition_in_order(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = store_open_extra(fx, fx->cfg->big_partitions, 0, 0, 0);
	unsigned nparts = kv_store_partitions(s);
	size_t total = 0, n = 1000;
	entry_list l = {0};
	bool more;

	put_numbered(s, "sp", n);
	for (unsigned p = 0; p < nparts; p++) {
		entry_list_fini(&l);
		more = true;
		assert_int_equal(kv_store_scan_partition(s, p, NULL, 0, NULL, 0, 0, true,
		                                         entry_list_cb, &l, &more),
		                 KV_OK);
		assert_false(more);
		assert_strictly_increasing(&l);
		for (size_t i = 0; i < l.n; i++) {
			assert_int_equal(kv_store_partition_of(s, l.keys[i].data, l.keys[i].len),
			                 p);
			assert_true(entry_value_matches_key(&l, i));
		}
		total += l.n;
	}
	assert_int_equal(total, n);

	/* Bounds and limit. */
	entry_list_fini(&l);
	more = false;
	assert_int_equal(kv_store_scan_partition(s, 0, "sp000100", 8, "sp000900", 8, 1, false,
	                                         entry_list_cb, &l, &more),
	                 KV_OK);
	assert_true(l.n <= 1);
	if (l.n == 1) {
		assert_false(l.val_set[0]);
		assert_true(
		    kv_range_contains("sp000100", 8, "sp000900", 8, l.keys[0].data, l.keys[0].len));
	}
	assert_int_equal(
	    kv_store_scan_partition(s, nparts, NULL, 0, NULL, 0, 0, true, entry_list_cb, &l, NULL),
	    KV_EINVAL);
	entry_list_fini(&l);
}

/*
 * Range maintenance.
 */

/* Collects range_step visits and counts the entries of the current step. */
typedef struct {
	entry_list l;   /* every entry visited */
	size_t in_step; /* entries visited by the current step */
} step_visits;

static int
step_visits_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	step_visits *v = arg;

	v->in_step++;
	return entry_list_cb(&v->l, key, klen, val, vlen);
}

/* Walks [start, end) with steps of at most `max` entries; returns the step count. */
static size_t
walk_range(kv_store *s, const void *start, size_t slen, const void *end, size_t elen, size_t max,
           step_visits *v)
{
	kv_store_cursor c;
	size_t steps = 0;
	size_t bound = 100000;

	kv_store_cursor_init(&c);
	while (!c.done) {
		v->in_step = 0;
		assert_int_equal(
		    kv_store_range_step(s, start, slen, end, elen, &c, max, step_visits_cb, v),
		    KV_OK);
		assert_true(v->in_step <= max);
		assert_true(++steps < bound);
	}
	kv_store_cursor_fini(&c);
	return steps;
}

/* Sorts the visited keys and asserts they are exactly "<prefix><from..to)", once each. */
static void
assert_visited_exactly(step_visits *v, const char *prefix, size_t from, size_t to)
{
	kv_bytes *got = xcalloc(v->l.n, sizeof *got);
	char key[32];

	for (size_t i = 0; i < v->l.n; i++)
		got[i] = (kv_bytes){v->l.keys[i].data, v->l.keys[i].len};
	qsort(got, v->l.n, sizeof *got, bytes_cmp);
	for (size_t i = 1; i < v->l.n; i++)
		if (bytes_cmp(&got[i - 1], &got[i]) == 0)
			fail_msg("a key was visited twice");
	assert_int_equal(v->l.n, to - from);
	for (size_t i = from; i < to; i++) {
		size_t klen = fmt_key(key, sizeof key, prefix, i);
		assert_int_equal(got[i - from].len, klen);
		assert_memory_equal(got[i - from].p, key, klen);
	}
	free(got);
}

static void
range_step_visits_each_key_of_the_range_once_in_bounded_steps(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = store_open_extra(fx, fx->cfg->big_partitions, 0, 0, 0);
	unsigned nparts = kv_store_partitions(s);
	step_visits v = {0};
	size_t steps;

	put_numbered(s, "rs", 2000);
	put_s(s, "a-before", "x");
	put_s(s, "z-after", "x");

	steps = walk_range(s, "rs000500", 8, "rs001500", 8, 7, &v);
	assert_visited_exactly(&v, "rs", 500, 1500);
	for (size_t i = 0; i < v.l.n; i++)
		assert_true(entry_value_matches_key(&v.l, i));
	assert_true(steps <= 1000 / 7 + 2 * (size_t)nparts + 4);

	/* The whole key space, including the keys outside "rs". */
	entry_list_fini(&v.l);
	walk_range(s, NULL, 0, NULL, 0, 7, &v);
	assert_int_equal(v.l.n, 2002);

	/* max = 1. */
	entry_list_fini(&v.l);
	walk_range(s, "rs001990", 8, NULL, 0, 1, &v);
	assert_int_equal(v.l.n, 11); /* rs001990..rs001999 and z-after */
	entry_list_fini(&v.l);
}

static void
range_step_over_an_empty_range_finishes_without_visiting(void **state)
{
	kv_store *s = FX(state)->s;
	step_visits v = {0};

	walk_range(s, NULL, 0, NULL, 0, 7, &v); /* empty store */
	assert_int_equal(v.l.n, 0);
	put_numbered(s, "e", 100);
	walk_range(s, "f", 1, "g", 1, 7, &v);
	assert_int_equal(v.l.n, 0);
	walk_range(s, "e000050", 7, "e000050", 7, 7, &v);
	assert_int_equal(v.l.n, 0);
	entry_list_fini(&v.l);
}

static void
range_step_between_writes_visits_each_original_key_once(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = store_open_extra(fx, fx->cfg->big_partitions, 0, 0, 0);
	kv_store_cursor c;
	step_visits v = {0};
	char key[32], val[32];
	size_t steps = 0, outside = 0;

	put_numbered(s, "in", 700);
	kv_store_cursor_init(&c);
	while (!c.done) {
		/* Between steps: new keys on both sides of the range, updates inside it. */
		for (int j = 0; j < 5; j++) {
			size_t klen = fmt_key(key, sizeof key, outside % 2 ? "im" : "io", outside);
			assert_int_equal(kv_store_put(s, key, klen, "new", 3), KV_OK);
			outside++;
			klen = fmt_key(key, sizeof key, "in", (steps * 37 + (size_t)j * 101) % 700);
			int vlen = snprintf(val, sizeof val, "upd-%zu", steps);
			assert_int_equal(kv_store_put(s, key, klen, val, (size_t)vlen), KV_OK);
		}
		v.in_step = 0;
		assert_int_equal(
		    kv_store_range_step(s, "in", 2, "io", 2, &c, 7, step_visits_cb, &v), KV_OK);
		assert_true(v.in_step <= 7);
		assert_true(++steps < 10000);
	}
	kv_store_cursor_fini(&c);
	assert_visited_exactly(&v, "in", 0, 700);
	entry_list_fini(&v.l);
}

static void
nested_prefix_keys_of_every_length_scan_in_order(void **state)
{
	kv_store *s = FX(state)->s;
	size_t maxk = KV_DEFAULT_MAX_KEY, n = 0, from500 = 0;
	uint8_t *as = xmalloc(maxk), *branches = xcalloc(maxk / 50 + 1, maxk + 1);
	kv_bytes *sorted = xcalloc(maxk + maxk / 50 + 1, sizeof *sorted);
	step_visits v = {0};
	entry_list l = {0};

	/* "a", "aa", ... up to max_key bytes, every key a prefix of the next, and
	 * branches "a...ab" every 50 lengths: a chain as deep as a key is long. */
	memset(as, 'a', maxk);
	for (size_t len = 1; len <= maxk; len++) {
		sorted[n++] = (kv_bytes){as, len};
		if (len % 50 == 0 && len < maxk) {
			uint8_t *b = branches + (len / 50) * (maxk + 1);
			memset(b, 'a', len);
			b[len] = 'b';
			sorted[n++] = (kv_bytes){b, len + 1};
		}
	}
	qsort(sorted, n, sizeof *sorted, bytes_cmp);
	for (size_t i = 0; i < n; i++) {
		size_t r = (i * 7919) % n;
		assert_int_equal(kv_store_put(s, sorted[r].p, sorted[r].len, "", 0), KV_OK);
		if (kv_key_cmp(sorted[i].p, sorted[i].len, as, 500) >= 0)
			from500++;
	}
	assert_int_equal(stats_of(s).keys, n);

	scan_all(s, NULL, 0, NULL, 0, &l);
	assert_int_equal(l.n, n);
	for (size_t i = 0; i < n; i++)
		assert_true(entry_key_is(&l, i, sorted[i].p, sorted[i].len));
	walk_range(s, as, 500, NULL, 0, 7, &v);
	assert_int_equal(v.l.n, from500);

	/* Every other key gone: the chain keeps nodes whose only leaf went away. */
	for (size_t i = 0; i < n; i += 2)
		assert_int_equal(kv_store_del(s, sorted[i].p, sorted[i].len, NULL), KV_OK);
	scan_all(s, NULL, 0, NULL, 0, &l);
	assert_int_equal(l.n, n / 2);
	for (size_t i = 1, j = 0; i < n; i += 2, j++)
		assert_true(entry_key_is(&l, j, sorted[i].p, sorted[i].len));
	for (size_t i = 1; i < n; i += 2)
		assert_int_equal(kv_store_del(s, sorted[i].p, sorted[i].len, NULL), KV_OK);
	assert_int_equal(stats_of(s).keys, 0);
	scan_all(s, NULL, 0, NULL, 0, &l);
	assert_int_equal(l.n, 0);

	entry_list_fini(&l);
	entry_list_fini(&v.l);
	free(sorted);
	free(branches);
	free(as);
}

/* Deletes [start, end) with steps of at most `max`; returns the number deleted. */
static uint64_t
delete_range(kv_store *s, const void *start, size_t slen, const void *end, size_t elen, size_t max,
             size_t max_calls)
{
	uint64_t deleted = 0;
	size_t calls = 0;
	int rv;

	do {
		uint64_t before = deleted, keys = 0, bytes = 0;
		rv = kv_store_range_delete(s, start, slen, end, elen, max, &deleted);
		assert_true(rv == KV_OK || rv == KV_EBUSY);
		assert_true(deleted - before <= max);
		assert_true(++calls <= max_calls);
		if (rv == KV_EBUSY) {
			/* EBUSY means entries remain. */
			assert_int_equal(
			    kv_store_range_count(s, start, slen, end, elen, &keys, &bytes), KV_OK);
			assert_true(keys > 0);
		}
	} while (rv == KV_EBUSY);
	return deleted;
}

static void
range_delete_in_bounded_steps_returns_ebusy_until_the_range_is_empty(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = store_open_extra(fx, fx->cfg->big_partitions, 0, 0, 0);
	unsigned nparts = kv_store_partitions(s);
	entry_list l = {0};
	char key[32];

	put_numbered(s, "d", 1000);
	put_s(s, "d", "prefix of every key, before the range");
	assert_int_equal(delete_range(s, "d000100", 7, "d000600", 7, 7, 500 / 7 + 2 * nparts + 4),
	                 500);

	scan_all(s, NULL, 0, NULL, 0, &l);
	assert_int_equal(l.n, 501);
	assert_true(entry_key_is(&l, 0, "d", 1));
	for (size_t i = 1; i < l.n; i++) {
		size_t k = i - 1 < 100 ? i - 1 : i - 1 + 500;
		size_t klen = fmt_key(key, sizeof key, "d", k);
		assert_true(entry_key_is(&l, i, key, klen));
		assert_true(entry_value_matches_key(&l, i));
	}
	assert_int_equal(stats_of(s).keys, 501);

	/* Deleting the now empty range again finishes at once. */
	assert_int_equal(delete_range(s, "d000100", 7, "d000600", 7, 7, 1), 0);
	entry_list_fini(&l);
}

static void
range_delete_that_empties_the_range_on_a_full_step_returns_zero(void **state)
{
	kv_store *s = FX(state)->s;
	uint64_t deleted = 0;
	int rv;

	/* Exactly 2 * max entries: the second step deletes the last ones. */
	put_numbered(s, "x", 14);
	put_s(s, "y", "outside");
	assert_int_equal(kv_store_range_delete(s, "x", 1, "y", 1, 7, &deleted), KV_EBUSY);
	rv = kv_store_range_delete(s, "x", 1, "y", 1, 14 - (size_t)deleted, &deleted);
	assert_int_equal(deleted, 14);
	/* The range is empty now, so this is 0, not KV_EBUSY. */
	assert_int_equal(rv, KV_OK);
	assert_int_equal(stats_of(s).keys, 1);
}

static void
range_delete_with_a_null_count_still_deletes(void **state)
{
	kv_store *s = FX(state)->s;
	size_t calls = 0;
	int rv;

	put_numbered(s, "nc", 30);
	do {
		rv = kv_store_range_delete(s, NULL, 0, NULL, 0, 4, NULL);
		assert_true(rv == KV_OK || rv == KV_EBUSY);
		assert_true(++calls < 1000);
	} while (rv == KV_EBUSY);
	assert_int_equal(stats_of(s).keys, 0);
}

static void
range_delete_of_the_whole_key_space_empties_the_store(void **state)
{
	kv_store *s = FX(state)->s;
	unsigned nparts = kv_store_partitions(s);
	entry_list l = {0};
	kv_store_stats st;

	put_numbered(s, "w", 300);
	assert_int_equal(kv_store_put(s, "\0", 1, "", 0), KV_OK);
	assert_int_equal(kv_store_put(s, "\xff\xff", 2, "v", 1), KV_OK);
	assert_int_equal(delete_range(s, NULL, 0, NULL, 0, 7, 302 / 7 + 2 * nparts + 4), 302);
	st = stats_of(s);
	assert_int_equal(st.keys, 0);
	assert_int_equal(st.bytes, 0);
	scan_all(s, NULL, 0, NULL, 0, &l);
	assert_int_equal(l.n, 0);
	/* The store is usable afterwards. */
	put_s(s, "w000001", "again");
	assert_value_s(s, "w000001", "again");
	entry_list_fini(&l);
}

static void
range_count_matches_a_brute_force_count(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = store_open_extra(fx, fx->cfg->big_partitions, 0, 0, 0);
	uint64_t seed = 9;
	entry_list all = {0};
	key_model m;

	key_model_init(&m, 2000, 11);
	for (size_t i = 0; i < m.n; i++)
		put_keyed(s, m.keys[i].p, m.keys[i].len);
	scan_all(s, NULL, 0, NULL, 0, &all);
	assert_int_equal(all.n, m.n);

	for (int q = 0; q < 60; q++) {
		kv_bytes a = m.keys[rng_below(&seed, m.n)];
		kv_bytes b = m.keys[rng_below(&seed, m.n)];
		uint64_t want_keys = 0, want_bytes = 0, keys = 7, bytes = 7;

		if (q == 0)
			a.len = b.len = 0; /* everything */
		else if (q % 6 == 0)
			b.len = 0; /* unbounded end */
		else if (q % 7 == 0)
			a.len = 0; /* from the beginning */
		if (b.len > 0 && bytes_cmp(&a, &b) > 0) {
			kv_bytes t = a;
			a = b;
			b = t;
		}
		for (size_t i = 0; i < all.n; i++) {
			if (!kv_range_contains(a.p, a.len, b.p, b.len, all.keys[i].data,
			                       all.keys[i].len))
				continue;
			want_keys++;
			want_bytes += all.keys[i].len + all.vals[i].len;
		}
		assert_int_equal(kv_store_range_count(s, a.p, a.len, b.p, b.len, &keys, &bytes),
		                 KV_OK);
		assert_int_equal(keys, want_keys);
		assert_int_equal(bytes, want_bytes);
	}
	{
		uint64_t keys = 0, bytes = 0;
		kv_store_stats st = stats_of(s);
		assert_int_equal(kv_store_range_count(s, NULL, 0, NULL, 0, &keys, &bytes), KV_OK);
		assert_int_equal(keys, st.keys);
		assert_int_equal(bytes, st.bytes);
	}
	entry_list_fini(&all);
	key_model_fini(&m);
}

/* Asserts |got - want| <= want * pct / 100. */
static void
assert_near(uint64_t got, uint64_t want, unsigned pct)
{
	uint64_t d = got > want ? got - want : want - got;
	if (d * 100 > want * pct)
		fail_msg("%llu is more than %u%% away from %llu", (unsigned long long)got, pct,
		         (unsigned long long)want);
}

static void
range_estimate_is_exact_below_its_sample_and_close_above_it(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = store_open_extra(fx, fx->cfg->big_partitions, 0, 0, 0);
	const struct {
		const char *start, *end;
	} rs[] = {{"", ""}, {"e010000", "e030000"}, {"e", "e040000"}};

	put_numbered(s, "e", 40000);
	put_numbered(s, "f", 100);
	for (size_t i = 0; i < sizeof rs / sizeof rs[0]; i++) {
		size_t sl = strlen(rs[i].start), el = strlen(rs[i].end);
		uint64_t keys = 0, bytes = 0, ek = 0, eb = 0;
		bool exact = false;
		assert_int_equal(
		    kv_store_range_count(s, rs[i].start, sl, rs[i].end, el, &keys, &bytes), KV_OK);
		/* A sample larger than the range: walked whole. */
		assert_int_equal(kv_store_range_estimate(s, rs[i].start, sl, rs[i].end, el, 1000000,
		                                         &ek, &eb, &exact),
		                 KV_OK);
		assert_true(exact);
		assert_int_equal(ek, keys);
		assert_int_equal(eb, bytes);
		/* A sample of 8,000 keys: a part of the partitions, scaled. */
		assert_int_equal(kv_store_range_estimate(s, rs[i].start, sl, rs[i].end, el, 8000,
		                                         &ek, &eb, &exact),
		                 KV_OK);
		assert_int_equal(exact, kv_store_partitions(s) == 1);
		assert_near(ek, keys, 10);
		assert_near(eb, bytes, 10);
	}
	{
		/* Nothing there: zero, exactly. */
		uint64_t ek = 7, eb = 7;
		bool exact = false;
		assert_int_equal(kv_store_range_estimate(s, "g", 1, "h", 1, 8000, &ek, &eb, &exact),
		                 KV_OK);
		assert_true(exact);
		assert_int_equal(ek, 0);
		assert_int_equal(eb, 0);
	}
	assert_int_equal(kv_store_range_estimate(NULL, NULL, 0, NULL, 0, 1, &(uint64_t){0},
	                                         &(uint64_t){0}, NULL),
	                 KV_EINVAL);
}

static void
range_split_keys_cut_a_range_in_parts_of_about_equal_bytes(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = store_open_extra(fx, fx->cfg->big_partitions, 0, 0, 0);
	kv_buf k[7] = {{0}};
	uint64_t total = 0, keys, part;

	put_numbered(s, "e", 40000);
	put_numbered(s, "f", 100);
	assert_int_equal(kv_store_range_count(s, "e", 1, "f", 1, &keys, &total), KV_OK);
	assert_int_equal(kv_store_range_split_keys(s, "e", 1, "f", 1, 7, k), KV_OK);
	for (int i = 0; i < 7; i++) {
		const kv_buf *lo = i ? &k[i - 1] : NULL;
		assert_true(k[i].len > 0);
		assert_true(kv_range_contains("e", 1, "f", 1, k[i].data, k[i].len));
		if (lo != NULL)
			assert_true(kv_key_cmp(lo->data, lo->len, k[i].data, k[i].len) < 0);
		/* Each eighth holds an eighth of the bytes, give or take the
		 * sample's error (one partition of several). */
		assert_int_equal(kv_store_range_count(s, lo ? lo->data : (const uint8_t *)"e",
		                                      lo ? lo->len : 1, k[i].data, k[i].len, &keys,
		                                      &part),
		                 KV_OK);
		assert_near(part, total / 8, 25);
	}
	/* A small range is cut exactly: two keys of the same size, one cut
	 * (the second key; never the first), the others empty. */
	assert_int_equal(kv_store_range_split_keys(s, "f000010", 7, "f000012", 7, 7, k), KV_OK);
	assert_int_equal(k[0].len, 7);
	assert_memory_equal(k[0].data, "f000011", 7);
	for (int i = 1; i < 7; i++)
		assert_int_equal(k[i].len, 0);
	/* One key, or none: nothing to cut. */
	assert_int_equal(kv_store_range_split_keys(s, "f000010", 7, "f000011", 7, 7, k), KV_OK);
	assert_int_equal(kv_store_range_split_keys(s, "g", 1, "h", 1, 7, k), KV_OK);
	for (int i = 0; i < 7; i++)
		assert_int_equal(k[i].len, 0);
	assert_int_equal(kv_store_range_split_keys(s, "e", 1, "f", 1, 0, NULL), KV_OK);
	assert_int_equal(kv_store_range_split_keys(NULL, "e", 1, "f", 1, 7, k), KV_EINVAL);
	for (int i = 0; i < 7; i++)
		kv_buf_fini(&k[i]);
}

/* Asserts that `k` splits [start, end) into two ranges that both hold keys. */
static void
assert_splits(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
              const kv_buf *k, uint64_t *left_out, uint64_t *right_out)
{
	uint64_t left = 0, right = 0, bytes;

	assert_true(k->len > 0);
	assert_true(kv_range_contains(start, slen, end, elen, k->data, k->len));
	assert_true(kv_key_cmp(k->data, k->len, start, slen) > 0);
	assert_int_equal(kv_store_range_count(s, start, slen, k->data, k->len, &left, &bytes),
	                 KV_OK);
	assert_int_equal(kv_store_range_count(s, k->data, k->len, end, elen, &right, &bytes),
	                 KV_OK);
	assert_true(left > 0);
	assert_true(right > 0);
	if (left_out)
		*left_out = left;
	if (right_out)
		*right_out = right;
}

static void
range_split_key_returns_a_key_strictly_inside_a_populated_range(void **state)
{
	kv_store *s = FX(state)->s;
	kv_buf k = {0};
	uint64_t left = 0, right = 0;

	put_numbered(s, "sk", 4000);
	put_s(s, "a", "outside");
	put_s(s, "z", "outside");

	assert_int_equal(kv_store_range_split_key(s, "sk", 2, "sl", 2, &k), KV_OK);
	assert_splits(s, "sk", 2, "sl", 2, &k, &left, &right);
	/* About half on each side (one partition's sample of ~60+ keys). */
	assert_true(left > 4000 / 5);
	assert_true(right > 4000 / 5);

	assert_int_equal(kv_store_range_split_key(s, "sk001000", 8, "sk003000", 8, &k), KV_OK);
	assert_splits(s, "sk001000", 8, "sk003000", 8, &k, NULL, NULL);

	assert_int_equal(kv_store_range_split_key(s, NULL, 0, NULL, 0, &k), KV_OK);
	assert_splits(s, "", 0, "", 0, &k, NULL, NULL);

	/* One partition of 4,000 keys: the pick is read over many steps of
	 * the partition's lock, and still halves the range by bytes. */
	kv_store *one = store_open_extra(FX(state), 1, 0, 0, 0);
	put_numbered(one, "sk", 4000);
	assert_int_equal(kv_store_range_split_key(one, "sk", 2, "sl", 2, &k), KV_OK);
	assert_splits(one, "sk", 2, "sl", 2, &k, &left, &right);
	assert_true(left >= 1999 && left <= 2001);
	assert_true(right >= 1999 && right <= 2001);
	kv_buf_fini(&k);
}

static void
range_split_key_of_two_keys_sharing_a_partition_separates_them(void **state)
{
	kv_store *s = FX(state)->s;
	kv_buf k = {0};

	put_s(s, "pair1", "a value");
	put_s(s, "pair2", "another value");
	put_s(s, "outside", "x");
	assert_int_equal(kv_store_range_split_key(s, "pair", 4, "pais", 4, &k), KV_OK);
	assert_splits(s, "pair", 4, "pais", 4, &k, NULL, NULL);
	kv_buf_fini(&k);
}

static void
range_split_key_of_a_sparse_range_over_many_partitions_separates_its_keys(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = store_open_extra(fx, fx->cfg->big_partitions, 0, 0, 0);
	kv_buf k = {0};

	/* Few keys, most likely each in its own partition. */
	put_numbered(s, "sparse-a", 3);
	put_numbered(s, "sparse-b", 3);
	put_numbered(s, "zzz", 500);
	assert_int_equal(kv_store_range_split_key(s, "sparse", 6, "sparsf", 6, &k), KV_OK);
	assert_splits(s, "sparse", 6, "sparsf", 6, &k, NULL, NULL);
	kv_buf_fini(&k);
}

static void
range_split_key_returns_enotfound_for_fewer_than_two_keys(void **state)
{
	kv_store *s = FX(state)->s;
	kv_buf k = {0};

	assert_int_equal(kv_store_range_split_key(s, NULL, 0, NULL, 0, &k), KV_ENOTFOUND);
	put_numbered(s, "one", 1);
	put_numbered(s, "two", 50);
	assert_int_equal(kv_store_range_split_key(s, "one", 3, "onf", 3, &k), KV_ENOTFOUND);
	assert_int_equal(kv_store_range_split_key(s, "p", 1, "q", 1, &k), KV_ENOTFOUND);
	assert_int_equal(kv_store_range_split_key(s, "two000007", 9, "two000008", 9, &k),
	                 KV_ENOTFOUND);
	assert_int_equal(k.len, 0);
	kv_buf_fini(&k);
}

static const store_test scan_tests[] = {
    STORE_TEST(scan_returns_keys_in_bytewise_order),
    STORE_TEST(scan_of_random_binary_keys_matches_a_sorted_model),
    STORE_TEST(keys_with_long_shared_prefixes_stay_distinct_and_ordered),
    STORE_TEST(node_with_256_children_grows_and_shrinks_in_order),
    STORE_TEST(nested_prefix_keys_of_every_length_scan_in_order),
    STORE_TEST(scan_sees_overwrites_and_deletes),
    STORE_TEST(scan_includes_start_and_excludes_end),
    STORE_TEST(scan_with_empty_end_is_unbounded),
    STORE_TEST(scan_with_limit_sets_more_only_when_entries_remain),
    STORE_TEST(scan_resumed_with_resume_key_visits_every_key_once_across_partitions),
    STORE_TEST(scan_resumes_after_keys_of_the_maximum_length),
    STORE_TEST(keys_only_scan_passes_null_values),
    STORE_TEST(scan_of_an_empty_range_visits_nothing),
    STORE_TEST(scan_stops_when_the_callback_returns_nonzero),
    STORE_TEST(scan_partition_visits_the_keys_of_one_partition_in_order),
    STORE_TEST(range_step_visits_each_key_of_the_range_once_in_bounded_steps),
    STORE_TEST(range_step_over_an_empty_range_finishes_without_visiting),
    STORE_TEST(range_step_between_writes_visits_each_original_key_once),
    STORE_TEST(range_delete_in_bounded_steps_returns_ebusy_until_the_range_is_empty),
    STORE_TEST(range_delete_that_empties_the_range_on_a_full_step_returns_zero),
    STORE_TEST(range_delete_with_a_null_count_still_deletes),
    STORE_TEST(range_delete_of_the_whole_key_space_empties_the_store),
    STORE_TEST(range_count_matches_a_brute_force_count),
    STORE_TEST(range_estimate_is_exact_below_its_sample_and_close_above_it),
    STORE_TEST(range_split_keys_cut_a_range_in_parts_of_about_equal_bytes),
    STORE_TEST(range_split_key_returns_a_key_strictly_inside_a_populated_range),
    STORE_TEST(range_split_key_of_two_keys_sharing_a_partition_separates_them),
    STORE_TEST(range_split_key_of_a_sparse_range_over_many_partitions_separates_its_keys),
    STORE_TEST(range_split_key_returns_enotfound_for_fewer_than_two_keys),
};

int
main(void)
{
	int failed =
	    run_store_groups("test_store_scan", scan_tests,
	                     sizeof scan_tests / sizeof scan_tests[0], store_cfgs, store_ncfgs);
	return failed == 0 ? 0 : 1;
}
