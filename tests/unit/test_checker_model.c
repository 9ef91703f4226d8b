/*
 * test_checker_model.c - the checks of checker/history.c on hand-made
 * histories: each kind of violation is caught, and valid concurrent
 * histories (overlapping writes in either order, failed writes applied or
 * not) are accepted.
 *
 * Key 0 is an append key, key 1 a register. Times are small integers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "checker/history.h"

#include <stdio.h>
#include <string.h>

#define AK 0 /* the append key */
#define RK 1 /* the register */

/* A history under construction. */
typedef struct {
	chk_op ops[64]; /* the operations */
	size_t n;       /* used */
	chk_key keys[2];
	char final[512]; /* the append key's final value */
	chk_result res;
} hist;

static void
hist_init(hist *h, const char *final)
{
	memset(h, 0, sizeof(*h));
	h->keys[AK] = (chk_key){.name = "k/a", .append = true, .final_known = true};
	h->keys[RK] = (chk_key){.name = "k/r", .append = false};
	if (final) {
		snprintf(h->final, sizeof(h->final), "%s", final);
		h->keys[AK].final_found = true;
		h->keys[AK].final = (const uint8_t *)h->final;
		h->keys[AK].final_len = strlen(h->final);
	}
}

static chk_op *
add(hist *h, uint8_t kind, uint32_t key, uint32_t client, uint64_t inv, uint64_t comp)
{
	chk_op *o = &h->ops[h->n++];
	memset(o, 0, sizeof(*o));
	o->kind = kind;
	o->key = key;
	o->client = client;
	o->invoke = inv;
	o->complete = comp;
	if (comp == CHK_NEVER) {
		o->status = CHK_FAILED;
		o->err = -7;
	}
	return o;
}

/* An append of token c<client>.<seq>; that returned length len. */
static void
app(hist *h, uint32_t client, uint32_t seq, uint64_t inv, uint64_t comp, uint64_t len)
{
	chk_op *o = add(h, CHK_APPEND, AK, client, inv, comp);
	o->val = chk_val_id(client, seq);
	o->len = len;
}

static void
put(hist *h, uint32_t client, uint32_t seq, uint64_t inv, uint64_t comp)
{
	add(h, CHK_PUT, RK, client, inv, comp)->val = chk_val_id(client, seq);
}

/* A get of the register that read c<client>.<seq> (client 0: not found). */
static void
get(hist *h, uint32_t client, uint32_t seq, uint64_t inv, uint64_t comp)
{
	chk_op *o = add(h, CHK_GET, RK, 9, inv, comp);
	if (client == 0)
		o->status = CHK_NOTFOUND;
	else
		o->val = chk_val_id(client, seq);
}

/* A get of the append key that read `v` (NULL: not found). */
static void
aget(hist *h, const char *v, uint64_t inv, uint64_t comp)
{
	chk_op *o = add(h, CHK_GET, AK, 9, inv, comp);
	if (v == NULL) {
		o->status = CHK_NOTFOUND;
		return;
	}
	o->len = strlen(v);
	o->hash = chk_hash(CHK_HASH_INIT, v, strlen(v));
}

static size_t
check(hist *h)
{
	assert_int_equal(chk_check(h->keys, 2, h->ops, h->n, &h->res), 0);
	if (h->res.nviolations) {
		/* What the checker would print, for the first two. */
		for (size_t i = 0; i < h->res.nkept && i < 2; i++)
			chk_print_violation(stderr, h->keys, h->ops, h->n, &h->res.v[i], 0, 10);
	}
	return h->res.nviolations;
}

/* Asserts exactly one violation, of `kind`. */
static void
expect_one(hist *h, int kind)
{
	size_t n = check(h);
	assert_int_equal(n, 1);
	assert_int_equal(h->res.v[0].kind, kind);
}

static void
value_spellings_round_trip(void **state)
{
	char b[40];
	uint64_t id;
	(void)state;

	chk_format_val(b, sizeof(b), chk_val_id(12, 345));
	assert_string_equal(b, "c12.345");
	assert_true(chk_parse_val(b, strlen(b), &id));
	assert_true(id == chk_val_id(12, 345));
	assert_false(chk_parse_val("c12.345;", 8, &id));
	assert_false(chk_parse_val("c012.3", 6, &id));
	assert_false(chk_parse_val("c1.0", 4, &id));
	assert_false(chk_parse_val("x1.2", 4, &id));
	assert_false(chk_parse_val("c1.", 3, &id));
	assert_false(chk_parse_val("c99999999999.1", 14, &id));
}

static void
sequential_history_passes(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, "c1.1;c2.1;c1.2;");
	app(&h, 1, 1, 10, 20, 5);
	aget(&h, "c1.1;", 21, 22);
	app(&h, 2, 1, 30, 40, 10);
	app(&h, 1, 2, 50, 60, 15);
	aget(&h, "c1.1;c2.1;c1.2;", 61, 62);
	get(&h, 0, 0, 1, 5);
	put(&h, 1, 3, 10, 20);
	get(&h, 1, 3, 21, 22);
	put(&h, 2, 2, 30, 40);
	get(&h, 2, 2, 41, 42);
	assert_int_equal(check(&h), 0);
	assert_int_equal(h.res.appends_acked, 3);
	assert_int_equal(h.res.tokens, 3);
	assert_int_equal(h.res.reads_checked, 5);
}

static void
concurrent_history_passes(void **state)
{
	hist h;
	(void)state;

	/* Appends 1.1 and 2.1 overlap: either order is fine, and a get that
	 * overlaps both may see none, one or both. 3.1 failed and never
	 * showed up; 4.1 failed but was applied (once). */
	hist_init(&h, "c2.1;c1.1;c4.1;");
	app(&h, 1, 1, 10, 40, 10);
	app(&h, 2, 1, 20, 30, 5);
	app(&h, 3, 1, 25, CHK_NEVER, 0);
	aget(&h, NULL, 5, 22);
	aget(&h, "c2.1;", 15, 35);
	aget(&h, "c2.1;c1.1;", 12, 45);
	app(&h, 4, 1, 50, CHK_NEVER, 0);
	aget(&h, "c2.1;c1.1;", 60, 70); /* 4.1 not applied yet */
	aget(&h, "c2.1;c1.1;c4.1;", 80, 90);

	/* Register: puts 1.5 and 2.5 overlap; reads during them may return
	 * either; a failed put's value may be read any time after it began. */
	get(&h, 0, 0, 1, 3);
	put(&h, 1, 5, 10, 40);
	put(&h, 2, 5, 20, 30);
	get(&h, 0, 0, 5, 15); /* before any put took effect */
	get(&h, 2, 5, 25, 35);
	get(&h, 1, 5, 32, 50); /* 1.5 may have landed after 2.5 */
	get(&h, 1, 5, 55, 60);
	put(&h, 3, 5, 70, CHK_NEVER);
	get(&h, 1, 5, 75, 80);
	get(&h, 3, 5, 85, 90); /* the failed put took effect late */
	assert_int_equal(check(&h), 0);
	assert_int_equal(h.res.appends_failed, 2);
	assert_int_equal(h.res.appends_failed_applied, 1);
}

static void
lost_acknowledged_append_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, "c1.1;c1.3;");
	app(&h, 1, 1, 10, 20, 5);
	app(&h, 1, 2, 30, 40, 10);
	app(&h, 1, 3, 50, 60, 15);
	size_t n = check(&h);
	/* Lost 1.2, and 1.3 reported a length that counted it. */
	assert_int_equal(n, 2);
	assert_int_equal(h.res.v[0].kind, CHK_V_LOST);
	assert_int_equal(h.res.v[0].op, 1);
	assert_int_equal(h.res.v[1].kind, CHK_V_APPEND_LEN);
}

static void
lost_append_of_a_missing_key_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	app(&h, 1, 1, 10, 20, 5);
	expect_one(&h, CHK_V_LOST);
}

static void
duplicated_append_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, "c1.1;c1.2;c1.1;");
	app(&h, 1, 1, 10, 20, 5);
	app(&h, 1, 2, 30, 40, 10);
	expect_one(&h, CHK_V_DUPLICATE);
}

static void
failed_append_applied_twice_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, "c1.1;c1.1;");
	app(&h, 1, 1, 10, CHK_NEVER, 0);
	expect_one(&h, CHK_V_DUPLICATE);
}

static void
reordered_appends_are_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, "c2.1;c1.1;");
	app(&h, 1, 1, 10, 20, 10);
	app(&h, 2, 1, 30, 40, 5);
	size_t n = check(&h);
	assert_true(n >= 1);
	assert_int_equal(h.res.v[0].kind, CHK_V_REORDER);
}

static void
wrong_append_length_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, "c1.1;c2.1;");
	app(&h, 1, 1, 10, 20, 5);
	app(&h, 2, 1, 10, 20, 5); /* ends at 10 */
	expect_one(&h, CHK_V_APPEND_LEN);
}

static void
unknown_bytes_in_final_value_are_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, "c1.1;c7.7;");
	app(&h, 1, 1, 10, 20, 5);
	expect_one(&h, CHK_V_UNKNOWN_TOKEN);

	hist_init(&h, "c1.1;garbage");
	app(&h, 1, 1, 10, 20, 5);
	expect_one(&h, CHK_V_UNKNOWN_TOKEN);

	/* A register value inside an append key. */
	hist_init(&h, "c1.1;c2.2;");
	app(&h, 1, 1, 10, 20, 5);
	put(&h, 2, 2, 10, 20);
	expect_one(&h, CHK_V_UNKNOWN_TOKEN);
}

static void
stale_register_read_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 10, 20);
	put(&h, 2, 1, 30, 40);
	get(&h, 1, 1, 50, 60); /* 2.1 overwrote 1.1 before the get began */
	expect_one(&h, CHK_V_STALE_READ);
	assert_int_equal(h.res.v[0].op, 2);
	assert_int_equal(h.res.v[0].other, 1);
}

static void
not_found_after_a_completed_put_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 10, 20);
	get(&h, 0, 0, 30, 40);
	expect_one(&h, CHK_V_STALE_READ);
}

static void
read_of_a_value_never_written_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 10, 20);
	get(&h, 5, 5, 30, 40);
	expect_one(&h, CHK_V_NEVER_WRITTEN);

	hist_init(&h, NULL);
	chk_op *o = add(&h, CHK_GET, RK, 9, 30, 40);
	o->status = CHK_GARBAGE;
	o->len = 7;
	expect_one(&h, CHK_V_NEVER_WRITTEN);

	/* An append token read through the register. */
	hist_init(&h, "c1.1;");
	app(&h, 1, 1, 10, 20, 5);
	get(&h, 1, 1, 30, 40);
	expect_one(&h, CHK_V_NEVER_WRITTEN);
}

static void
read_from_the_future_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	get(&h, 1, 1, 10, 20);
	put(&h, 1, 1, 30, 40);
	expect_one(&h, CHK_V_FUTURE_READ);
}

static void
reads_going_back_in_time_are_caught(void **state)
{
	hist h;
	(void)state;

	/* 2.1 failed (maybe applied): the first get shows it was; a later get
	 * returning 1.1, which 2.1 followed, goes back in time. Only the
	 * read-after-read rule sees this. */
	hist_init(&h, NULL);
	put(&h, 1, 1, 10, 20);
	put(&h, 2, 1, 30, CHK_NEVER);
	get(&h, 2, 1, 40, 50);
	get(&h, 1, 1, 60, 70);
	expect_one(&h, CHK_V_STALE_READ);
	assert_int_equal(h.res.v[0].op, 3);

	hist_init(&h, NULL);
	put(&h, 2, 1, 30, CHK_NEVER);
	get(&h, 2, 1, 40, 50);
	get(&h, 0, 0, 60, 70);
	expect_one(&h, CHK_V_STALE_READ);
}

static void
stale_append_read_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, "c1.1;c1.2;");
	app(&h, 1, 1, 10, 20, 5);
	app(&h, 1, 2, 30, 40, 10);
	aget(&h, "c1.1;", 50, 60);
	expect_one(&h, CHK_V_STALE_READ);

	hist_init(&h, "c1.1;");
	app(&h, 1, 1, 10, 20, 5);
	aget(&h, NULL, 30, 40);
	expect_one(&h, CHK_V_STALE_READ);
}

static void
append_read_going_back_in_time_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, "c1.1;c1.2;");
	app(&h, 1, 1, 10, CHK_NEVER, 0);
	app(&h, 1, 2, 12, CHK_NEVER, 0);
	aget(&h, "c1.1;c1.2;", 20, 30);
	aget(&h, "c1.1;", 40, 50);
	expect_one(&h, CHK_V_STALE_READ);
}

static void
append_read_from_the_future_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, "c1.1;c1.2;");
	app(&h, 1, 1, 10, 20, 5);
	aget(&h, "c1.1;c1.2;", 25, 28);
	app(&h, 1, 2, 30, 40, 10);
	expect_one(&h, CHK_V_FUTURE_READ);
}

static void
append_read_that_is_no_prefix_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, "c1.1;c1.2;");
	app(&h, 1, 1, 10, 20, 5);
	app(&h, 1, 2, 30, 40, 10);
	aget(&h, "c1.2;", 50, 60);
	expect_one(&h, CHK_V_NOT_PREFIX);

	hist_init(&h, "c1.1;c1.2;");
	app(&h, 1, 1, 10, 20, 5);
	app(&h, 1, 2, 30, 40, 10);
	aget(&h, "c1.1;c1", 35, 60); /* not at a token boundary */
	expect_one(&h, CHK_V_NOT_PREFIX);
}

static void
malformed_history_is_reported(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 10, 20);
	put(&h, 1, 1, 30, 40); /* the same value written twice */
	expect_one(&h, CHK_V_BAD_HISTORY);

	hist_init(&h, NULL);
	put(&h, 1, 1, 30, 20); /* completed before it began */
	expect_one(&h, CHK_V_BAD_HISTORY);
}

static void
unread_append_key_is_counted_not_checked(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	h.keys[AK].final_known = false;
	app(&h, 1, 1, 10, 20, 5);
	assert_int_equal(check(&h), 0);
	assert_int_equal(h.res.keys_unchecked, 1);
}

static void
many_violations_are_counted_and_the_first_kept(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, "");
	h.keys[AK].final_found = true;
	for (uint32_t i = 1; i <= 40; i++)
		app(&h, 1, i, 10 * i, 10 * i + 5, 5 * i);
	assert_int_equal(check(&h), 40);
	assert_int_equal(h.res.nkept, CHK_MAX_KEPT);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(value_spellings_round_trip),
	    cmocka_unit_test(sequential_history_passes),
	    cmocka_unit_test(concurrent_history_passes),
	    cmocka_unit_test(lost_acknowledged_append_is_caught),
	    cmocka_unit_test(lost_append_of_a_missing_key_is_caught),
	    cmocka_unit_test(duplicated_append_is_caught),
	    cmocka_unit_test(failed_append_applied_twice_is_caught),
	    cmocka_unit_test(reordered_appends_are_caught),
	    cmocka_unit_test(wrong_append_length_is_caught),
	    cmocka_unit_test(unknown_bytes_in_final_value_are_caught),
	    cmocka_unit_test(stale_register_read_is_caught),
	    cmocka_unit_test(not_found_after_a_completed_put_is_caught),
	    cmocka_unit_test(read_of_a_value_never_written_is_caught),
	    cmocka_unit_test(read_from_the_future_is_caught),
	    cmocka_unit_test(reads_going_back_in_time_are_caught),
	    cmocka_unit_test(stale_append_read_is_caught),
	    cmocka_unit_test(append_read_going_back_in_time_is_caught),
	    cmocka_unit_test(append_read_from_the_future_is_caught),
	    cmocka_unit_test(append_read_that_is_no_prefix_is_caught),
	    cmocka_unit_test(malformed_history_is_reported),
	    cmocka_unit_test(unread_append_key_is_counted_not_checked),
	    cmocka_unit_test(many_violations_are_counted_and_the_first_kept),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
