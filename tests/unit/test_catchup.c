/*
 * test_catchup.c - the catch-up's pure parts (shardserver/repl/catchup.h;
 * doc/replication.md "Catch-up from the replica's own data"): the
 * primary's buffer (trimming, what it offers for a range), a replica's
 * positions (comparison, narrowing, reshaping to a new configuration) and
 * their file.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "common/err.h"
#include "shardserver/durable/durable.h"
#include "shardserver/repl/catchup.h"

#define B(s) ((kv_bytes){(const uint8_t *)(s), sizeof(s) - 1})

static void
add(kv_cu_buf *b, uint64_t lsn, uint64_t e, kv_bytes st, kv_bytes en, const char *pay)
{
	kv_cu_buf_add(b, lsn, e, &st, &en, (const uint8_t *)pay, strlen(pay));
}

static void
the_buffer_drops_its_oldest_records_past_its_cap_and_says_from_where_it_is_whole(void **state)
{
	kv_cu_buf b;
	kv_cu_rec **v;
	size_t n;
	uint64_t from;

	(void)state;
	kv_cu_buf_init(&b, 10, 4);
	add(&b, 3, 1, B("a"), B("m"), "old"); /* at or below trim: not taken */
	assert_int_equal(b.n, 0);
	add(&b, 5, 1, B("a"), B("m"), "1234");
	add(&b, 6, 1, B("a"), B("m"), "5678");
	assert_int_equal(b.n, 2);
	assert_int_equal(b.trim, 4);
	add(&b, 7, 1, B("a"), B("m"), "90ab"); /* 12 bytes > 10: lsn 5 goes */
	assert_int_equal(b.n, 2);
	assert_int_equal(b.bytes, 8);
	assert_int_equal(b.trim, 5);
	assert_int_equal(kv_cu_buf_select(&b, &B("a"), &B("m"), 1, &v, &n, &from), KV_OK);
	assert_int_equal(from, 5);
	assert_int_equal(n, 2);
	assert_int_equal(v[0]->lsn, 6);
	assert_int_equal(v[1]->lsn, 7);
	/* A taken record outlives its trimming. */
	add(&b, 8, 1, B("a"), B("m"), "0123456789");
	assert_int_equal(b.n, 1);
	assert_int_equal(b.trim, 7);
	assert_memory_equal(kv_cu_payload(v[0]).p, "5678", 4);
	kv_cu_release(v, n);
	kv_cu_buf_fini(&b);
}

static void
the_buffer_holds_between_its_cap_less_a_slab_and_its_cap_and_every_record_above_its_trim(
    void **state)
{
	kv_cu_buf b;
	kv_cu_rec **v;
	size_t n;
	uint64_t from, lsn;
	const uint64_t cap = 64 * 640; /* slabs of 640 bytes: 11 records of 4 bytes each */

	(void)state;
	kv_cu_buf_init(&b, cap, 0);
	for (lsn = 1; lsn <= 20000; lsn++) {
		add(&b, lsn, 1, B("a"), B("m"), "1234");
		if (lsn * 4 > cap) {
			assert_true(b.bytes <= cap);
			assert_true(b.bytes + 11 * 4 > cap);
		}
		/* Every record above trim is held, none at or below it. */
		assert_int_equal(b.n, lsn - b.trim);
		assert_int_equal(b.bytes, 4 * b.n);
	}
	assert_true(b.trim > 0);
	assert_int_equal(kv_cu_buf_select(&b, &B("a"), &B("m"), 1, &v, &n, &from), KV_OK);
	assert_int_equal(from, b.trim);
	assert_int_equal(n, b.n);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(v[i]->lsn, from + 1 + i);
	/* Taken records outlive the slabs' drop. */
	for (; lsn <= 40000; lsn++)
		add(&b, lsn, 1, B("a"), B("m"), "5678");
	assert_true(b.trim >= v[n - 1]->lsn);
	assert_memory_equal(kv_cu_payload(v[0]).p, "1234", 4);
	kv_cu_release(v, n);
	kv_cu_buf_fini(&b);
}

static void
the_buffer_offers_a_range_only_when_every_record_touching_it_lies_inside_it(void **state)
{
	kv_cu_buf b;
	kv_cu_rec **v;
	size_t n;
	uint64_t from;

	(void)state;
	kv_cu_buf_init(&b, 1 << 20, 0);
	add(&b, 1, 2, B("a"), B("f"), "x");
	add(&b, 2, 2, B("f"), B("m"), "y");
	add(&b, 3, 2, B("m"), B(""), "z");
	/* [f, m): one record; one untouched range. */
	assert_int_equal(kv_cu_buf_select(&b, &B("f"), &B("m"), 2, &v, &n, &from), KV_OK);
	assert_int_equal(n, 1);
	assert_int_equal(v[0]->lsn, 2);
	kv_cu_release(v, n);
	assert_int_equal(kv_cu_buf_select(&b, &B("g"), &B("g\x01"), 3, &v, &n, &from), KV_EINVAL);
	/* A record of a wider range (written before a split): no offer. */
	assert_int_equal(kv_cu_buf_select(&b, &B("h"), &B("k"), 2, &v, &n, &from), KV_EINVAL);
	assert_null(v);
	/* ... nor over two ranges merged since, nor at another leader epoch. */
	assert_int_equal(kv_cu_buf_select(&b, &B("a"), &B("m"), 2, &v, &n, &from), KV_OK);
	assert_int_equal(n, 2);
	kv_cu_release(v, n);
	assert_int_equal(kv_cu_buf_select(&b, &B("m"), &B(""), 3, &v, &n, &from), KV_EINVAL);
	assert_int_equal(kv_cu_buf_select(&b, &B("m"), &B(""), 2, &v, &n, &from), KV_OK);
	assert_int_equal(n, 1);
	kv_cu_release(v, n);
	/* No record of it: an empty offer. */
	kv_cu_buf_fini(&b);
	kv_cu_buf_init(&b, 1 << 20, 9);
	assert_int_equal(kv_cu_buf_select(&b, &B("a"), &B(""), 2, &v, &n, &from), KV_OK);
	assert_int_equal(n, 0);
	assert_int_equal(from, 9);
	kv_cu_buf_fini(&b);
}

static void
a_position_covers_the_same_start_and_epoch_over_the_same_or_a_narrower_range(void **state)
{
	kv_cu_pos_set s = {0};
	(void)state;

	assert_int_equal(kv_cu_pos_put(&s, 1, 77, 5, &B("b"), &B("p"), 100, 40, true), KV_OK);
	const kv_cu_pos *p = &s.v[0];
	assert_true(kv_cu_pos_covers(p, 1, 77, 5, &B("b"), &B("p"), 100));
	assert_true(kv_cu_pos_covers(p, 1, 77, 5, &B("c"), &B("d"), 90));
	assert_false(kv_cu_pos_covers(p, 1, 77, 5, &B("b"), &B("p"), 101)); /* trimmed past it */
	assert_false(kv_cu_pos_covers(p, 2, 77, 5, &B("b"), &B("p"), 0));   /* another primary */
	assert_false(kv_cu_pos_covers(p, 1, 78, 5, &B("b"), &B("p"), 0));   /* it restarted */
	assert_false(kv_cu_pos_covers(p, 1, 77, 6, &B("b"), &B("p"), 0));   /* another epoch */
	assert_false(kv_cu_pos_covers(p, 1, 77, 5, &B("a"), &B("p"), 0));   /* wider */
	assert_false(kv_cu_pos_covers(p, 1, 77, 5, &B("b"), &B(""), 0));    /* to the end */
	assert_int_equal(kv_cu_pos_find(&s, 1, 77, 5, &B("c"), &B("d"), 50), 0);
	assert_int_equal(kv_cu_pos_find(&s, 1, 77, 5, &B("c"), &B("q"), 50), -1);
	/* Narrowed by a catch-up of [f, h): the parts outside stay, not live. */
	assert_int_equal(kv_cu_pos_put(&s, 1, 77, 5, &B("f"), &B("h"), 120, 60, true), KV_OK);
	assert_int_equal(s.n, 3);
	long i = kv_cu_pos_find(&s, 1, 77, 5, &B("f"), &B("h"), 120);
	assert_true(i >= 0 && s.v[i].live);
	i = kv_cu_pos_find(&s, 1, 77, 5, &B("b"), &B("f"), 100);
	assert_true(i >= 0 && !s.v[i].live);
	i = kv_cu_pos_find(&s, 1, 77, 5, &B("h"), &B("p"), 100);
	assert_true(i >= 0 && !s.v[i].live);
	assert_int_equal(kv_cu_pos_find(&s, 1, 77, 5, &B("e"), &B("g"), 0), -1);
	/* A copy of [g, i) forgets every position touching it whole. */
	assert_int_equal(kv_cu_pos_forget(&s, &B("g"), &B("i")), 2);
	assert_int_equal(s.n, 1);
	kv_cu_pos_set_fini(&s);
}

static void
a_new_configuration_cuts_positions_to_the_ranges_still_led_by_their_primary(void **state)
{
	kv_cu_pos_set s = {0};
	bool dropped;
	(void)state;

	assert_int_equal(kv_cu_pos_put(&s, 1, 7, 5, &B("b"), &B("p"), 100, 0, true), KV_OK);
	/* A split at h, same primary and epoch: two positions, nothing lost. */
	kv_cu_range split[] = {{B(""), B("b"), 2, 3},
	                       {B("b"), B("h"), 1, 5},
	                       {B("h"), B("p"), 1, 5},
	                       {B("p"), B(""), 1, 5}};
	assert_int_equal(kv_cu_pos_reshape(&s, split, 4, &dropped), KV_OK);
	assert_false(dropped);
	assert_int_equal(s.n, 2);
	assert_true(kv_cu_pos_covers(&s.v[0], 1, 7, 5, &B("b"), &B("h"), 100));
	assert_true(kv_cu_pos_covers(&s.v[1], 1, 7, 5, &B("h"), &B("p"), 100));
	assert_true(s.v[1].live);
	/* [h, p) moved to another primary (a new epoch): that part goes. */
	kv_cu_range moved[] = {{B("b"), B("h"), 1, 5}, {B("h"), B("p"), 2, 9}};
	assert_int_equal(kv_cu_pos_reshape(&s, moved, 2, &dropped), KV_OK);
	assert_true(dropped);
	assert_int_equal(s.n, 1);
	assert_true(kv_cu_pos_covers(&s.v[0], 1, 7, 5, &B("b"), &B("h"), 100));
	/* A range this node no longer holds (not listed): gone. */
	assert_int_equal(kv_cu_pos_reshape(&s, NULL, 0, &dropped), KV_OK);
	assert_true(dropped);
	assert_int_equal(s.n, 0);
	kv_cu_pos_set_fini(&s);
}

static void
the_positions_file_keeps_only_saved_positions_and_refuses_damage(void **state)
{
	kv_cu_pos_set s = {0}, d = {0};
	kv_buf f = {0};
	(void)state;

	assert_int_equal(kv_cu_pos_put(&s, 1, 7, 5, &B("b"), &B("h"), 100, 0, true), KV_OK);
	assert_int_equal(kv_cu_pos_put(&s, 3, 8, 6, &B("h"), &B(""), 200, 0, true), KV_OK);
	s.v[0].saved = 90; /* the log had synced what lsn 90 needs, not 100's */
	s.v[0].has_saved = true;
	assert_int_equal(kv_cu_pos_encode(&s, &f), KV_OK);
	assert_int_equal(kv_cu_pos_decode(f.data, f.len, &d), KV_OK);
	assert_int_equal(d.n, 1);
	assert_int_equal(d.v[0].from, 1);
	assert_int_equal(d.v[0].lsn, 90);
	assert_false(d.v[0].live);
	assert_true(kv_cu_pos_covers(&d.v[0], 1, 7, 5, &B("b"), &B("h"), 90));
	kv_cu_pos_set_fini(&d);
	/* Every flipped byte and every cut is refused, leaving no position. */
	for (size_t i = 0; i < f.len; i++) {
		f.data[i] ^= 0x40;
		assert_int_equal(kv_cu_pos_decode(f.data, f.len, &d), KV_ECORRUPT);
		assert_int_equal(d.n, 0);
		f.data[i] ^= 0x40;
	}
	for (size_t n = 0; n < f.len; n++)
		assert_int_equal(kv_cu_pos_decode(f.data, n, &d), KV_ECORRUPT);
	kv_buf_fini(&f);
	kv_cu_pos_set_fini(&s);
}

/* Adds the span of the record in b (emptied after) as lsn. */
static void
tail_add_rec(kv_cu_tail *t, uint64_t lsn, kv_buf *b)
{
	kv_dur_span sp;
	assert_int_equal(kv_dur_rec_span(b->data, b->len, &sp), KV_OK);
	assert_int_equal(kv_cu_tail_add(t, lsn, (int)sp.kind, sp.lo, sp.hi), KV_OK);
	b->len = 0;
}

static void
a_restarted_nodes_tail_tells_whether_a_record_after_an_lsn_touches_a_range(void **state)
{
	kv_dur_dedup dd = {.client = 7, .req = 9};
	kv_cu_tail t;
	kv_buf b = {0};
	kv_bytes c = B("c"), e = B("e"), l = B("l"), o = B("o"), q = B("q"), pp = B("p"),
	         w = B("w"), none = {0};
	(void)state;

	kv_cu_tail_init(&t, 5, 1024);
	assert_int_equal(kv_dur_rec_put(&b, "b", 1, "v", 1), KV_OK);
	tail_add_rec(&t, 5, &b);
	assert_int_equal(kv_dur_rec_range_del(&b, "m", 1, "p", 1), KV_OK);
	tail_add_rec(&t, 6, &b);
	assert_int_equal(kv_dur_rec_dedup(&b, &dd, 0, "x", 1), KV_OK);
	tail_add_rec(&t, 7, &b);
	assert_int_equal(kv_dur_rec_put(&b, "d", 1, "v", 1), KV_OK);
	tail_add_rec(&t, 8, &b);
	assert_int_equal(kv_cu_tail_add(&t, 10, KV_DUR_SPAN_NONE, none, none), KV_EINVAL);

	assert_int_equal(kv_cu_tail_touches(&t, 4, 8, &c, &e), 1);    /* d at 8 */
	assert_int_equal(kv_cu_tail_touches(&t, 8, 8, &c, &e), 0);    /* nothing after 8 */
	assert_int_equal(kv_cu_tail_touches(&t, 5, 7, &c, &l), 0);    /* b is at 5, not after */
	assert_int_equal(kv_cu_tail_touches(&t, 5, 7, &o, &q), 1);    /* the range delete */
	assert_int_equal(kv_cu_tail_touches(&t, 5, 7, &pp, &w), 0);   /* its end is excluded */
	assert_int_equal(kv_cu_tail_touches(&t, 5, 7, &w, &none), 1); /* the entry of x */
	assert_int_equal(kv_cu_tail_touches(&t, 3, 8, &c, &e), -1);   /* 4 is not held */
	assert_int_equal(kv_cu_tail_touches(&t, 5, 9, &c, &e), -1);   /* 9 is not held */
	assert_int_equal(kv_cu_tail_add(&t, 9, KV_DUR_SPAN_ALL, none, none), KV_OK);
	assert_int_equal(kv_cu_tail_touches(&t, 8, 9, &pp, &w), 1); /* an adoption */
	kv_cu_tail_fini(&t);

	kv_cu_tail_init(&t, 1, 3);
	assert_int_equal(kv_cu_tail_add(&t, 1, KV_DUR_SPAN_KEYS, c, e), KV_OK);
	assert_int_equal(kv_cu_tail_add(&t, 2, KV_DUR_SPAN_KEYS, c, e), KV_ELIMIT);
	kv_cu_tail_fini(&t);
	kv_buf_fini(&b);
}

/* Payload of record lsn in the test below: its lsn in the first bytes. */
static void
fill(uint8_t *p, size_t n, uint64_t lsn)
{
	memset(p, (int)(lsn & 0xff), n);
	memcpy(p, &lsn, sizeof(lsn));
}

static void
records_taken_across_many_slabs_stay_whole_while_the_buffer_moves_past_them(void **state)
{
	static uint8_t pay[2000000];
	kv_cu_buf b;
	kv_cu_rec **v;
	size_t n, held;
	uint64_t from, first, lsn = 1;

	(void)state;
	/* 3 MB of 100-byte records: about 300 to a slab (a 64th of the cap). */
	kv_cu_buf_init(&b, 3000000, 0);
	for (; lsn <= 40000; lsn++) {
		fill(pay, 100, lsn);
		kv_cu_buf_add(&b, lsn, 1, &B("a"), &B("m"), pay, 100);
	}
	assert_true(b.bytes <= 3000000 && b.bytes > 3000000 - 3000000 / 64);
	assert_int_equal(b.bytes, 100 * b.n);
	assert_int_equal(b.n, 40000 - b.trim);
	assert_int_equal(kv_cu_buf_select(&b, &B("a"), &B("m"), 1, &v, &n, &from), KV_OK);
	assert_int_equal(from, b.trim);
	assert_int_equal(n, b.n);
	held = n;
	/* A record larger than a slab (2 MB: two thirds of the oldest go),
	 * then enough to move past every record taken. */
	fill(pay, sizeof(pay), lsn);
	kv_cu_buf_add(&b, lsn++, 1, &B("a"), &B("m"), pay, sizeof(pay));
	assert_true(b.bytes <= 3000000 && b.bytes > 3000000 - 3000000 / 64);
	assert_int_equal(b.n, 40001 - b.trim);
	assert_true(b.n > 9000 && b.n <= 10001);
	for (; lsn <= 70001; lsn++) {
		fill(pay, 100, lsn);
		kv_cu_buf_add(&b, lsn, 1, &B("a"), &B("m"), pay, 100);
	}
	assert_true(b.trim >= 40001); /* the large record went too */
	assert_int_equal(b.bytes, 100 * b.n);
	assert_int_equal(b.n, 70001 - b.trim);
	assert_true(b.bytes <= 3000000 && b.bytes > 3000000 - 3000000 / 64);
	first = from + 1;
	for (size_t i = 0; i < held; i++) {
		kv_bytes pl = kv_cu_payload(v[i]);
		uint64_t got;
		assert_int_equal(v[i]->lsn, first + i);
		assert_int_equal(pl.len, 100);
		memcpy(&got, pl.p, sizeof(got));
		assert_int_equal(got, first + i);
		assert_int_equal(pl.p[99], (uint8_t)((first + i) & 0xff));
	}
	kv_cu_release(v, held);
	/* The records held now are the newest, in order. */
	assert_int_equal(kv_cu_buf_select(&b, &B("a"), &B("m"), 1, &v, &n, &from), KV_OK);
	assert_int_equal(n, b.n);
	assert_int_equal(from, b.trim);
	assert_int_equal(v[0]->lsn, b.trim + 1);
	assert_int_equal(v[n - 1]->lsn, 70001);
	kv_cu_buf_fini(&b);
	/* Taken records outlive the buffer too. */
	assert_int_equal(kv_cu_payload(v[n - 1]).p[50], (uint8_t)(70001 & 0xff));
	kv_cu_release(v, n);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(
	        the_buffer_drops_its_oldest_records_past_its_cap_and_says_from_where_it_is_whole),
	    cmocka_unit_test(
	        the_buffer_holds_between_its_cap_less_a_slab_and_its_cap_and_every_record_above_its_trim),
	    cmocka_unit_test(
	        the_buffer_offers_a_range_only_when_every_record_touching_it_lies_inside_it),
	    cmocka_unit_test(
	        records_taken_across_many_slabs_stay_whole_while_the_buffer_moves_past_them),
	    cmocka_unit_test(
	        a_position_covers_the_same_start_and_epoch_over_the_same_or_a_narrower_range),
	    cmocka_unit_test(
	        a_new_configuration_cuts_positions_to_the_ranges_still_led_by_their_primary),
	    cmocka_unit_test(the_positions_file_keeps_only_saved_positions_and_refuses_damage),
	    cmocka_unit_test(
	        a_restarted_nodes_tail_tells_whether_a_record_after_an_lsn_touches_a_range),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
