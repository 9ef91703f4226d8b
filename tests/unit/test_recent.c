/*
 * test_recent.c - a backup's memory of the records it applied last from a
 * primary (shardserver/repl/recent.h; doc/replication.md "Reconciliation
 * after a transfer"): whether any of them between two lsns may touch a
 * range, and every case where it cannot tell.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "shardserver/repl/recent.h"

#define B(s) ((kv_bytes){(const uint8_t *)(s), sizeof(s) - 1})
/* 58 bytes, more than a slot keeps of a key: a long key's first part. */
#define LONG58 "m-a-key-longer-than-the-fifty-eight-bytes-that-a-ring-slot"

static kv_dur_span
keys(kv_bytes lo, kv_bytes hi)
{
	return (kv_dur_span){.kind = KV_DUR_SPAN_KEYS, .lo = lo, .hi = hi};
}

static void
records_past_the_end_touch_a_range_only_when_a_key_lies_in_it(void **state)
{
	static const char long_key[] = LONG58 "-keeps-of-it";
	kv_recent *r = kv_recent_new();
	kv_dur_span sp;

	(void)state;
	assert_non_null(r);
	sp = keys(B("a"), B("a"));
	kv_recent_add(r, 10, &sp);
	sp = keys(B("c"), B("e"));
	kv_recent_add(r, 11, &sp);
	sp = keys(B("x"), B("x"));
	kv_recent_add(r, 12, &sp);
	sp = (kv_dur_span){.kind = KV_DUR_SPAN_RANGE, .lo = B("p"), .hi = B("r")};
	kv_recent_add(r, 14, &sp);
	sp = keys((kv_bytes){(const uint8_t *)long_key, sizeof(long_key) - 1},
	          (kv_bytes){(const uint8_t *)long_key, sizeof(long_key) - 1});
	kv_recent_add(r, 20, &sp);
	sp = (kv_dur_span){.kind = KV_DUR_SPAN_NONE};
	kv_recent_add(r, 30, &sp);
	sp = keys(B("b"), B("b"));
	kv_recent_add(r, 30, &sp); /* not above the last: ignored */

	static const struct {
		uint64_t after, upto;
		const char *start, *end; /* "" end: no bound */
		bool touches;
	} cases[] = {
	    {10, 12, "f", "w", false}, /* c..e below, x above */
	    {10, 12, "e", "w", true},  /* e is the span's highest key */
	    {10, 12, "a", "c", false}, /* the end is exclusive */
	    {10, 12, "w", "", true},   /* x, no end */
	    {9, 12, "", "b", true},    /* a at 10 */
	    {10, 12, "", "b", false},  /* a is at or below after */
	    {12, 14, "r", "w", false}, /* the range delete ends before r */
	    {12, 14, "q", "w", true},  /* ... and holds q */
	    {12, 14, "a", "p", false}, /* ... and starts at p */
	    /* A key longer than the KV_RECENT_KEY bytes a slot keeps, held
	     * whole beside the slots. */
	    {14, 20, "a", "b", false},                       /* below it */
	    {12, 20, "a", LONG58, false},                    /* ... up to its first bytes */
	    {14, 20, "a", LONG58 "-l", true},                /* it lies in [a, ..-l) */
	    {14, 20, "m-a-key-longer-than-thf", "z", false}, /* above it */
	    {14, 20, LONG58 "-keeps", "z", true},
	    {14, 20, LONG58 "-z", "z", false}, /* whole, it lies below ..-z */
	    {20, 30, "a", "b", true},          /* a record of no known key */
	    {12, 12, "", "", false},           /* nothing in between */
	    {5, 12, "y", "z", true},           /* 6..9 were applied before the ring knew */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		kv_bytes st = {(const uint8_t *)cases[i].start, strlen(cases[i].start)};
		kv_bytes en = {(const uint8_t *)cases[i].end, strlen(cases[i].end)};
		bool got = kv_recent_touches(r, cases[i].after, cases[i].upto, st, en);
		if (got != cases[i].touches)
			fail_msg("case %zu: (%llu, %llu] against [%s, %s): %d", i,
			         (unsigned long long)cases[i].after,
			         (unsigned long long)cases[i].upto, cases[i].start, cases[i].end,
			         got);
	}
	kv_recent_free(r);
}

static void
a_ring_that_dropped_or_forgot_records_cannot_vouch_for_them(void **state)
{
	kv_recent *r = kv_recent_new();
	kv_dur_span far = keys(B("z"), B("z"));

	(void)state;
	assert_non_null(r);
	/* Nothing known yet. */
	assert_true(kv_recent_touches(r, 1, 2, B("a"), B("b")));
	for (uint64_t lsn = 1; lsn <= KV_RECENT_CAP + 100; lsn++)
		kv_recent_add(r, lsn, &far);
	/* The oldest 100 went: an interval reaching below them is a doubt;
	 * one the ring holds whole is answered. */
	assert_true(kv_recent_touches(r, 50, KV_RECENT_CAP + 100, B("a"), B("b")));
	assert_false(kv_recent_touches(r, 100, KV_RECENT_CAP + 100, B("a"), B("b")));
	assert_true(kv_recent_touches(r, 100, KV_RECENT_CAP + 100, B("y"), B("")));
	/* A copy replaced the data: what came before is unknown again. */
	kv_recent_clear(r);
	assert_true(kv_recent_touches(r, 100, KV_RECENT_CAP + 100, B("a"), B("b")));
	kv_recent_add(r, KV_RECENT_CAP + 200, &far);
	assert_true(kv_recent_touches(r, KV_RECENT_CAP + 100, KV_RECENT_CAP + 200, B("a"), B("b")));
	assert_false(
	    kv_recent_touches(r, KV_RECENT_CAP + 199, KV_RECENT_CAP + 200, B("a"), B("b")));
	kv_recent_free(r);
}

/* The exact answer for one record of full keys. */
static bool
truly_touches(const kv_dur_span *sp, kv_bytes start, kv_bytes end)
{
	if (end.len > 0 && kv_key_cmp(sp->lo.p, sp->lo.len, end.p, end.len) >= 0)
		return false;
	if (sp->kind == KV_DUR_SPAN_KEYS)
		return kv_key_cmp(sp->hi.p, sp->hi.len, start.p, start.len) >= 0;
	return sp->hi.len == 0 || kv_key_cmp(sp->hi.p, sp->hi.len, start.p, start.len) > 0;
}

static size_t
random_key(uint8_t *k, uint64_t *x, size_t min, size_t max)
{
	size_t n;

	*x = *x * 6364136223846793005ull + 1442695040888963407ull;
	n = min + (size_t)((*x >> 33) % (max - min + 1));
	for (size_t i = 0; i < n; i++) {
		*x = *x * 6364136223846793005ull + 1442695040888963407ull;
		k[i] = (uint8_t)('a' + (*x >> 33) % 3);
	}
	return n;
}

/* A key that shares a random part of k's first bytes, then goes on at
 * random: ranges whose bounds fall near a record's keys. */
static size_t
near_key(uint8_t *d, const uint8_t *k, size_t kl, uint64_t *x)
{
	uint8_t tail[8];
	size_t m, tl;

	*x = *x * 6364136223846793005ull + 1442695040888963407ull;
	m = KV_RECENT_KEY - 8 + (size_t)((*x >> 33) % (kl - KV_RECENT_KEY + 9));
	tl = random_key(tail, x, 0, 6);
	memcpy(d, k, m);
	memcpy(d + m, tail, tl);
	return m + tl;
}

/* One record a ring, 20,000 times: keys of klen - 6 to klen + 6 bytes
 * over three letters (many sharing long beginnings), ranges drawn at
 * random or near the record's keys. Fails when a record that touches its
 * range is cleared; counts the records apart from their range and those
 * of them cleared. */
static void
random_records(size_t klen, size_t *cleared, size_t *apart)
{
	static uint8_t a[1200], b[1200], st[1220], en[1220];
	uint64_t x = 42 + klen;

	assert_true(klen + 6 <= sizeof(a));
	*cleared = *apart = 0;
	for (int t = 0; t < 20000; t++) {
		kv_recent *r = kv_recent_new();
		size_t al = random_key(a, &x, klen - 6, klen + 6);
		size_t bl = random_key(b, &x, klen - 6, klen + 6);
		kv_bytes lo = {a, al}, hi = {b, bl};
		if (kv_key_cmp(a, al, b, bl) > 0) {
			lo = (kv_bytes){b, bl};
			hi = (kv_bytes){a, al};
		}
		kv_dur_span sp = {
		    .kind = t % 2 ? KV_DUR_SPAN_KEYS : KV_DUR_SPAN_RANGE, .lo = lo, .hi = hi};
		kv_bytes s, e;
		switch (t % 3) {
		case 0:
			s = (kv_bytes){st, random_key(st, &x, 0, klen + 6)};
			e = (kv_bytes){en, random_key(en, &x, 0, klen + 6)};
			break;
		case 1:
			s = (kv_bytes){st, near_key(st, hi.p, hi.len, &x)};
			e = (kv_bytes){en, near_key(en, hi.p, hi.len, &x)};
			break;
		default:
			s = (kv_bytes){st, near_key(st, lo.p, lo.len, &x)};
			e = (kv_bytes){en, near_key(en, lo.p, lo.len, &x)};
			break;
		}
		if (e.len > 0 && kv_key_cmp(s.p, s.len, e.p, e.len) >= 0)
			e.len = 0;
		assert_non_null(r);
		kv_recent_add(r, 1, &sp);
		bool got = kv_recent_touches(r, 0, 1, s, e);
		if (truly_touches(&sp, s, e)) {
			if (!got)
				fail_msg("case %d: a record that touches the range was cleared", t);
		} else {
			(*apart)++;
			*cleared += !got;
		}
		kv_recent_free(r);
	}
	print_message(
	    "keys of about %zu bytes: %zu of %zu records apart from their range cleared\n", klen,
	    *cleared, *apart);
}

static void
a_long_key_held_whole_is_told_apart_from_a_range_exactly(void **state)
{
	size_t cleared, apart;

	(void)state;
	random_records(KV_RECENT_KEY, &cleared, &apart);
	assert_true(apart > 1000);
	assert_int_equal(cleared, apart);
}

static void
a_key_too_long_to_hold_is_bounded_by_its_first_bytes(void **state)
{
	size_t cleared, apart;

	(void)state;
	/* Longer than any key held whole (1,024 bytes): only the slot's
	 * bytes are known, and every doubt counts as touching. */
	random_records(1106, &cleared, &apart);
	assert_true(apart > 1000);
	assert_true(cleared * 4 > apart);
	assert_true(cleared < apart);
}

static void
a_long_key_whose_whole_bytes_were_written_over_is_bounded_by_its_first_bytes(void **state)
{
	static const char first[] = LONG58 "-keeps-of-it";
	static uint8_t other[200];
	kv_recent *r = kv_recent_new();
	kv_bytes k = {(const uint8_t *)first, sizeof(first) - 1};
	kv_dur_span sp = keys(k, k);
	uint64_t lsn = 1;

	(void)state;
	assert_non_null(r);
	memset(other, 'z', sizeof(other));
	kv_recent_add(r, lsn, &sp);
	/* [..-z, y) holds no key of the records: the first lies below it,
	 * the others above. */
	sp = keys((kv_bytes){other, sizeof(other)}, (kv_bytes){other, sizeof(other)});
	for (lsn = 2; lsn <= 100; lsn++)
		kv_recent_add(r, lsn, &sp);
	assert_false(kv_recent_touches(r, 0, lsn - 1, B(LONG58 "-z"), B("y")));
	/* 400 bytes of long keys a record: after 3,000 records the first
	 * key's bytes are written over (the slots still hold its record).
	 * Only its first bytes are known then: a doubt. */
	for (; lsn <= 3000; lsn++)
		kv_recent_add(r, lsn, &sp);
	assert_true(kv_recent_touches(r, 0, lsn - 1, B(LONG58 "-z"), B("y")));
	assert_false(kv_recent_touches(r, 1, lsn - 1, B(LONG58 "-z"), B("y")));
	/* A key whose bytes are still whole is answered exactly. */
	assert_false(kv_recent_touches(r, 1, lsn - 1, B("y"), B("yz")));
	assert_true(kv_recent_touches(r, 1, lsn - 1, B("y"), B("{")));
	kv_recent_free(r);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(records_past_the_end_touch_a_range_only_when_a_key_lies_in_it),
	    cmocka_unit_test(a_ring_that_dropped_or_forgot_records_cannot_vouch_for_them),
	    cmocka_unit_test(a_long_key_held_whole_is_told_apart_from_a_range_exactly),
	    cmocka_unit_test(a_key_too_long_to_hold_is_bounded_by_its_first_bytes),
	    cmocka_unit_test(
	        a_long_key_whose_whole_bytes_were_written_over_is_bounded_by_its_first_bytes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
