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

static kv_dur_span
keys(kv_bytes lo, kv_bytes hi)
{
	return (kv_dur_span){.kind = KV_DUR_SPAN_KEYS, .lo = lo, .hi = hi};
}

static void
records_past_the_end_touch_a_range_only_when_a_key_lies_in_it(void **state)
{
	static const char long_key[] = "m-a-key-longer-than-the-twenty-four-bytes-kept";
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
	    {14, 20, "a", "b", true},  /* a key too long to keep: a doubt */
	    {12, 20, "a", "b", true},  /* ... in a longer interval too */
	    {20, 30, "a", "b", true},  /* a record of no known key */
	    {12, 12, "", "", false},   /* nothing in between */
	    {5, 12, "y", "z", true},   /* 6..9 were applied before the ring knew */
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

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(records_past_the_end_touch_a_range_only_when_a_key_lies_in_it),
	    cmocka_unit_test(a_ring_that_dropped_or_forgot_records_cannot_vouch_for_them),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
