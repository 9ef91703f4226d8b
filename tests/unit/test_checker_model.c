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
#define K2 2 /* two more registers, for multi-key operations */
#define K3 3
#define NK 4

/* A history under construction. */
typedef struct {
	chk_op ops[64]; /* the operations */
	size_t n;       /* used */
	chk_key keys[NK];
	char final[512]; /* the append key's final value */
	chk_result res;
} hist;

static void
hist_init(hist *h, const char *final)
{
	memset(h, 0, sizeof(*h));
	h->keys[AK] = (chk_key){.name = "k/a", .append = true, .final_known = true};
	h->keys[RK] = (chk_key){.name = "k/r", .append = false};
	h->keys[K2] = (chk_key){.name = "k/2", .append = false};
	h->keys[K3] = (chk_key){.name = "k/3", .append = false};
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

/* A delete of the register that returned c<client>.<seq> (client 0: not
 * found; comp CHK_NEVER: failed). */
static void
del(hist *h, uint32_t client, uint32_t seq, uint64_t inv, uint64_t comp)
{
	chk_op *o = add(h, CHK_DEL, RK, 8, inv, comp);
	if (comp == CHK_NEVER)
		return;
	if (client == 0)
		o->status = CHK_NOTFOUND;
	else
		o->val = chk_val_id(client, seq);
}

/* A scan's part on register `key` that read c<client>.<seq> (client 0: the
 * scan passed over the key), as part of scan `txn`. */
static void
scan_part(hist *h, uint32_t txn, uint32_t key, uint32_t client, uint32_t seq, uint64_t inv,
          uint64_t comp)
{
	chk_op *o = add(h, CHK_SCAN, key, 7, inv, comp);
	o->txn = txn;
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
	assert_int_equal(chk_check(h->keys, NK, h->ops, h->n, &h->res), 0);
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

/*
 * Register histories that pass when only operations ordered in real time
 * are compared, but that no order of the puts explains: the write order the
 * reads imply must be used too. Each has a valid mirror image.
 */

/* Puts A and B overlap; a get reads B after both completed, a later one A. */
static void
flip_flop_between_concurrent_puts_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);  /* A */
	put(&h, 2, 1, 5, 20);  /* B */
	get(&h, 2, 1, 25, 26); /* B */
	get(&h, 1, 1, 30, 31); /* A again */
	expect_one(&h, CHK_V_UNORDERED);
}

static void
reads_of_one_value_after_concurrent_puts_pass(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	put(&h, 2, 1, 5, 20);
	get(&h, 1, 1, 12, 13); /* A before B completed */
	get(&h, 2, 1, 25, 26); /* then B, for good */
	get(&h, 2, 1, 30, 31);
	assert_int_equal(check(&h), 0);
}

/* X is read, Y is written after that read, and X is read again: X was put
 * twice (a retried put applied again). */
static void
put_applied_twice_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 25);  /* X, acknowledged after an internal retry */
	get(&h, 1, 1, 5, 6);   /* X */
	put(&h, 2, 1, 10, 20); /* Y */
	get(&h, 1, 1, 30, 31); /* X again */
	expect_one(&h, CHK_V_UNORDERED);
}

static void
late_effect_of_a_long_put_passes(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 25);  /* X takes effect at 24 */
	put(&h, 2, 1, 10, 20); /* Y before it */
	get(&h, 1, 1, 30, 31);
	assert_int_equal(check(&h), 0);
}

/* The same with X failed: its window closes once a get has seen it. */
static void
failed_put_seen_then_overwritten_then_seen_again_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, CHK_NEVER); /* X, outcome unknown */
	get(&h, 1, 1, 5, 6);
	put(&h, 2, 1, 10, 20);
	get(&h, 1, 1, 30, 31);
	expect_one(&h, CHK_V_UNORDERED);
}

/* W completes; X fails but is read; then W is read again. */
static void
read_of_an_older_value_after_a_failed_put_was_seen_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 3);         /* W */
	put(&h, 2, 1, 1, CHK_NEVER); /* X */
	get(&h, 2, 1, 5, 6);         /* X */
	get(&h, 1, 1, 10, 11);       /* W */
	expect_one(&h, CHK_V_UNORDERED);
}

static void
failed_put_seen_after_the_older_value_passes(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 3);
	put(&h, 2, 1, 1, CHK_NEVER);
	get(&h, 1, 1, 5, 6);   /* W */
	get(&h, 2, 1, 10, 11); /* X took effect late */
	assert_int_equal(check(&h), 0);
}

/* Three overlapping puts: B is read after C completed, then C. */
static void
order_of_three_puts_contradicted_by_two_reads_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);  /* A */
	put(&h, 2, 1, 5, 20);  /* B */
	put(&h, 3, 1, 15, 30); /* C */
	get(&h, 2, 1, 35, 40); /* B */
	get(&h, 3, 1, 45, 50); /* C */
	expect_one(&h, CHK_V_UNORDERED);
}

static void
order_of_three_puts_confirmed_by_two_reads_passes(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	put(&h, 2, 1, 5, 20);
	put(&h, 3, 1, 15, 30);
	get(&h, 2, 1, 22, 23); /* B before C took effect */
	get(&h, 3, 1, 45, 50);
	assert_int_equal(check(&h), 0);
}

/* Not found after a get saw a put that had not completed yet. */
static void
absent_after_a_value_was_seen_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 20);
	get(&h, 1, 1, 5, 6);
	get(&h, 0, 0, 10, 11);
	assert_int_equal(check(&h), 1);
}

/*
 * Brute force: a register history is linearizable when some order of its
 * operations that respects real time (a before b when a completed before b
 * began), leaving out any subset of the failed puts, gives every get the
 * value it read. Small random histories must be judged alike by it and by
 * chk_check.
 */
typedef struct {
	const chk_op *ops;
	size_t n;
	bool placed[8];
	bool dropped[8];
} brute;

static bool
brute_dfs(brute *b, size_t done, uint64_t cur)
{
	if (done == b->n)
		return true;
	for (size_t i = 0; i < b->n; i++) {
		if (b->placed[i] || b->dropped[i])
			continue;
		bool ready = true;
		for (size_t j = 0; j < b->n && ready; j++)
			if (j != i && !b->placed[j] && !b->dropped[j] &&
			    b->ops[j].complete < b->ops[i].invoke)
				ready = false;
		if (!ready)
			continue;
		const chk_op *o = &b->ops[i];
		uint64_t next = cur;
		if (o->kind == CHK_PUT)
			next = o->val;
		else if (o->kind == CHK_DEL && o->status == CHK_FAILED)
			next = 0;
		else if ((o->status == CHK_NOTFOUND ? 0 : o->val) != cur)
			continue;
		else if (o->kind == CHK_DEL)
			next = 0;
		b->placed[i] = true;
		bool ok = brute_dfs(b, done + 1, next);
		b->placed[i] = false;
		if (ok)
			return true;
	}
	return false;
}

static bool
brute_linearizable(const chk_op *ops, size_t n)
{
	size_t failed[8], nf = 0;

	for (size_t i = 0; i < n; i++)
		if (ops[i].kind != CHK_GET && ops[i].status == CHK_FAILED)
			failed[nf++] = i;
	for (unsigned m = 0; m < (1u << nf); m++) {
		brute b = {.ops = ops, .n = n};
		size_t dropped = 0;
		for (size_t f = 0; f < nf; f++)
			if (m & (1u << f)) {
				b.dropped[failed[f]] = true;
				dropped++;
			}
		if (brute_dfs(&b, dropped, 0))
			return true;
	}
	return false;
}

static void
register_check_agrees_with_brute_force_on_random_histories(void **state)
{
	uint64_t seed = 0x5eed;
	size_t bad = 0, good = 0;
	(void)state;

	for (int round = 0; round < 20000; round++) {
		hist h;
		hist_init(&h, NULL);
		size_t nput = 1 + (seed >> 7) % 3, nget = 1 + (seed >> 11) % 4;
		for (size_t i = 0; i < nput + nget; i++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			uint64_t inv = (seed >> 33) % 40, len = 1 + (seed >> 45) % 15;
			if (i < nput) {
				bool fail = ((seed >> 20) & 7) == 0;
				put(&h, (uint32_t)i + 1, 1, inv, fail ? CHK_NEVER : inv + len);
			} else {
				uint32_t r = (uint32_t)((seed >> 25) % (nput + 1)); /* 0: absent */
				get(&h, r, r ? 1 : 0, inv, inv + len);
			}
		}
		bool want = brute_linearizable(h.ops, h.n);
		assert_int_equal(chk_check(h.keys, NK, h.ops, h.n, &h.res), 0);
		bool got = h.res.nviolations == 0;
		if (want != got) {
			fprintf(stderr, "round %d: brute force says %s, chk_check %s\n", round,
			        want ? "valid" : "invalid", got ? "valid" : "invalid");
			for (size_t i = 0; i < h.n; i++)
				chk_print_op(stderr, h.keys, &h.ops[i], 0);
		}
		assert_true(want == got);
		if (want)
			good++;
		else
			bad++;
	}
	/* Both kinds came up often enough to mean something. */
	assert_true(good > 2000 && bad > 2000);
}

/*
 * Deletes. A delete writes "absent" and returns what it removed, so the
 * register is decided by the search; each case below is a violation (or
 * not) that the zones alone, with deletes read as nothing, judge the other
 * way.
 */

/* A cas of the register from c<ec>.<es> (ec 0: absent) to c<vc>.<vs> (vc 0:
 * absent, a delete if equal), by client 6. Applied (CHK_OK) unless changed. */
static chk_op *
cas(hist *h, uint32_t ec, uint32_t es, uint32_t vc, uint32_t vs, uint64_t inv, uint64_t comp)
{
	chk_op *o = add(h, CHK_CAS, RK, 6, inv, comp);
	o->hash = ec ? chk_val_id(ec, es) : 0;
	o->val = vc ? chk_val_id(vc, vs) : 0;
	return o;
}

/* A refused cas that was told the register held c<cc>.<cs> (cc 0: absent). */
static void
cas_refused(hist *h, uint32_t ec, uint32_t es, uint32_t cc, uint32_t cs, uint64_t inv,
            uint64_t comp)
{
	chk_op *o = cas(h, ec, es, 0, 0, inv, comp);
	o->status = CHK_MISMATCH;
	o->len = cc ? chk_val_id(cc, cs) : 0;
}

/* A chain of increments, each from the value the last one wrote, with a
 * lock taken (if absent) and released (if equal) around them. */
static void
cas_chain_with_refusals_passes(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	cas(&h, 0, 0, 1, 1, 0, 10);          /* put if absent */
	cas_refused(&h, 0, 0, 1, 1, 5, 15);  /* a second if-absent: exists */
	cas(&h, 1, 1, 2, 1, 20, 30);         /* c1.1 -> c2.1 */
	cas_refused(&h, 1, 1, 2, 1, 25, 40); /* raced and lost: told c2.1 */
	cas(&h, 2, 1, 3, 1, 45, 50);
	get(&h, 3, 1, 55, 60);
	cas(&h, 3, 1, 0, 0, 65, 70); /* delete if equal */
	get(&h, 0, 0, 75, 80);
	assert_int_equal(check(&h), 0);
	assert_int_equal(h.res.cas_applied, 4);
	assert_int_equal(h.res.cas_mismatched, 2);
	assert_int_equal(h.res.registers_searched, 1);
}

/* Two concurrent cas from the same value both applied: one of them must
 * have seen the other's value (a server that ignores the condition). */
static void
two_cas_from_one_value_both_applied_are_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	cas(&h, 1, 1, 2, 1, 20, 40);
	cas(&h, 1, 1, 3, 1, 25, 45);
	get(&h, 3, 1, 50, 60);
	expect_one(&h, CHK_V_UNORDERED);
}

/* A cas refused while the register held exactly what it expected. */
static void
cas_refused_on_its_expected_value_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	cas_refused(&h, 1, 1, 1, 1, 20, 30);
	expect_one(&h, CHK_V_UNORDERED);
}

/* Two if-absent puts both applied on an absent key: a lock taken twice. */
static void
lock_taken_twice_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	cas(&h, 0, 0, 1, 1, 0, 10);
	cas(&h, 0, 0, 2, 1, 20, 30);
	expect_one(&h, CHK_V_UNORDERED);
}

/* A cas told a current value no write produced. */
static void
cas_told_a_value_never_written_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	cas_refused(&h, 2, 1, 4, 4, 20, 30);
	expect_one(&h, CHK_V_NEVER_WRITTEN);
}

/* A cas of unknown outcome explains a later read of its value, or not
 * applied, a later refusal. */
static void
failed_cas_applied_or_not_passes(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	cas(&h, 1, 1, 2, 1, 20, CHK_NEVER);
	get(&h, 2, 1, 40, 50);
	assert_int_equal(check(&h), 0);
	assert_int_equal(h.res.cas_failed, 1);

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	cas(&h, 1, 1, 2, 1, 20, CHK_NEVER);
	cas(&h, 1, 1, 3, 1, 40, 50); /* the failed one was not applied */
	get(&h, 3, 1, 60, 70);
	assert_int_equal(check(&h), 0);
}

/* A get reads a value after a delete that removed it completed (the
 * delete began after the put completed, and ended before the get began). */
static void
read_of_a_deleted_value_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	del(&h, 1, 1, 20, 30);
	get(&h, 1, 1, 40, 50);
	expect_one(&h, CHK_V_UNORDERED);
	assert_int_equal(h.res.registers_searched, 1);
}

/* Mirror: the get overlaps the delete, so it may come first. */
static void
read_of_a_value_during_its_delete_passes(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	del(&h, 1, 1, 20, 45);
	get(&h, 1, 1, 40, 50);
	get(&h, 0, 0, 60, 70);
	assert_int_equal(check(&h), 0);
	assert_int_equal(h.res.deletes_acked, 1);
}

/* A delete returns a value nobody put. */
static void
delete_returning_a_value_never_written_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	del(&h, 5, 5, 20, 30);
	expect_one(&h, CHK_V_NEVER_WRITTEN);
}

/* A delete returns a value a later put overwrote before it began. */
static void
delete_returning_an_overwritten_value_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	put(&h, 2, 1, 12, 15);
	del(&h, 1, 1, 20, 30);
	expect_one(&h, CHK_V_UNORDERED);
}

/* Mirror: the delete returns the value that was there, and the next one
 * finds nothing. */
static void
deletes_returning_what_was_there_pass(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	put(&h, 2, 1, 12, 15);
	del(&h, 2, 1, 20, 30);
	del(&h, 0, 0, 40, 50);
	put(&h, 3, 1, 60, 70);
	get(&h, 3, 1, 80, 90);
	assert_int_equal(check(&h), 0);
}

/* Two deletes of one value that both found it. */
static void
value_deleted_twice_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	del(&h, 1, 1, 20, 30);
	del(&h, 1, 1, 25, 35);
	expect_one(&h, CHK_V_UNORDERED);
}

/* Absent read between two puts, on a key that has deletes elsewhere but
 * none there. */
static void
absent_between_two_puts_without_a_delete_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	get(&h, 0, 0, 20, 30);
	put(&h, 2, 1, 40, 50);
	del(&h, 2, 1, 60, 70);
	expect_one(&h, CHK_V_UNORDERED);
}

/* Mirror: a failed delete in between may explain the absent read. */
static void
absent_between_two_puts_after_a_failed_delete_passes(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	del(&h, 0, 0, 12, CHK_NEVER);
	get(&h, 0, 0, 20, 30);
	put(&h, 2, 1, 40, 50);
	del(&h, 2, 1, 60, 70);
	assert_int_equal(check(&h), 0);
	assert_int_equal(h.res.deletes_failed, 1);
}

/* Not found from a delete while the key certainly held a value. */
static void
delete_finding_nothing_while_a_value_is_there_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	del(&h, 0, 0, 20, 30);
	get(&h, 1, 1, 40, 50);
	expect_one(&h, CHK_V_UNORDERED);
}

/* A search bounded too tightly reports the register unchecked, not valid
 * and not violated. */
static void
register_whose_search_is_cut_off_is_unchecked(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	for (uint32_t i = 0; i < 8; i++)
		put(&h, i + 1, 1, 0, 100); /* eight concurrent puts: 2^8 sets */
	del(&h, 0, 0, 0, 100);
	get(&h, 0, 0, 200, 210);
	assert_int_equal(chk_check_bounded(h.keys, NK, h.ops, h.n, 50, &h.res), 0);
	assert_int_equal(h.res.nviolations, 0);
	assert_int_equal(h.res.registers_unchecked, 1);
	assert_int_equal(chk_check(h.keys, NK, h.ops, h.n, &h.res), 0);
	assert_int_equal(h.res.nviolations, 1); /* a delete of nothing, then absent: no */
	assert_int_equal(h.res.registers_unchecked, 0);
}

static void
register_with_deletes_agrees_with_brute_force_on_random_histories(void **state)
{
	uint64_t seed = 0xde1e7e;
	size_t bad = 0, good = 0;
	(void)state;

	for (int round = 0; round < 20000; round++) {
		hist h;
		hist_init(&h, NULL);
		size_t nput = 1 + (seed >> 7) % 3, ndel = 1 + (seed >> 9) % 2,
		       nget = (seed >> 11) % 4;
		for (size_t i = 0; i < nput + ndel + nget; i++) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			uint64_t inv = (seed >> 33) % 40, len = 1 + (seed >> 45) % 15;
			bool fail = ((seed >> 20) & 7) == 0;
			uint32_t r = (uint32_t)((seed >> 25) % (nput + 1)); /* 0: absent */
			if (i < nput)
				put(&h, (uint32_t)i + 1, 1, inv, fail ? CHK_NEVER : inv + len);
			else if (i < nput + ndel)
				del(&h, r, r ? 1 : 0, inv, fail ? CHK_NEVER : inv + len);
			else
				get(&h, r, r ? 1 : 0, inv, inv + len);
		}
		bool want = brute_linearizable(h.ops, h.n);
		assert_int_equal(chk_check(h.keys, NK, h.ops, h.n, &h.res), 0);
		bool got = h.res.nviolations == 0;
		if (want != got) {
			fprintf(stderr, "round %d: brute force says %s, chk_check %s\n", round,
			        want ? "valid" : "invalid", got ? "valid" : "invalid");
			for (size_t i = 0; i < h.n; i++)
				chk_print_op(stderr, h.keys, &h.ops[i], 0);
		}
		assert_true(want == got);
		assert_int_equal(h.res.registers_unchecked, 0);
		if (want)
			good++;
		else
			bad++;
	}
	assert_true(good > 2000 && bad > 2000);
}

/*
 * Scans: each key's part is a get over the scan's call; a key the scan
 * passed over reads absent.
 */

/* A scan returns a value overwritten before it began. */
static void
scan_returning_a_stale_value_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	put(&h, 2, 1, 20, 30);
	scan_part(&h, 1, RK, 1, 1, 40, 50);
	scan_part(&h, 1, K2, 0, 0, 40, 50);
	expect_one(&h, CHK_V_STALE_READ);
}

/* A scan passes over a key that was there all along. */
static void
scan_missing_a_present_key_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	add(&h, CHK_PUT, K2, 1, 0, 10)->val = chk_val_id(1, 2);
	scan_part(&h, 1, RK, 1, 1, 40, 50);
	scan_part(&h, 1, K2, 0, 0, 40, 50);
	expect_one(&h, CHK_V_STALE_READ);
}

/* Mirrors: a scan overlapping a put may see the old or the new value on one
 * key, and its parts need not be atomic together (unlike an mget's). */
static void
scans_overlapping_writes_pass(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	add(&h, CHK_PUT, K2, 1, 0, 10)->val = chk_val_id(1, 2);
	put(&h, 2, 1, 20, 60);
	add(&h, CHK_PUT, K3, 2, 20, 60)->val = chk_val_id(2, 2);
	scan_part(&h, 1, RK, 2, 1, 30, 40); /* new value on RK ... */
	scan_part(&h, 1, K2, 1, 2, 30, 40);
	scan_part(&h, 1, K3, 0, 0, 30, 40); /* ... K3 not yet */
	scan_part(&h, 2, RK, 1, 1, 25, 45); /* old value on RK */
	scan_part(&h, 2, K3, 2, 2, 25, 45);
	assert_int_equal(check(&h), 0);
	assert_int_equal(h.res.mgets_checked, 0);
}

/* A scan on a key with deletes goes through the search like a get. */
static void
scan_of_a_deleted_key_is_checked_by_the_search(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	del(&h, 1, 1, 20, 30);
	scan_part(&h, 1, RK, 1, 1, 40, 50);
	expect_one(&h, CHK_V_UNORDERED);
	hist_init(&h, NULL);
	put(&h, 1, 1, 0, 10);
	del(&h, 1, 1, 20, 30);
	scan_part(&h, 1, RK, 0, 0, 40, 50);
	assert_int_equal(check(&h), 0);
}

/* The final read of an append key failed: the longest read stands in for
 * it, so its reads and appends are still checked. */
static void
append_key_without_final_read_is_checked_against_its_longest_read(void **state)
{
	hist h;
	(void)state;

	/* Lost: c1.1 completed before the longest read began, and is not in it. */
	hist_init(&h, "c2.1;");
	h.keys[AK].final_partial = true;
	h.keys[AK].final_invoke = 30;
	h.keys[AK].final_complete = 31;
	app(&h, 1, 1, 0, 10, 0);
	app(&h, 2, 1, 5, 20, 0);
	aget(&h, "c2.1;", 30, 31);
	app(&h, 3, 1, 40, 50, 0); /* after the read: need not be in it */
	expect_one(&h, CHK_V_LOST);
	assert_int_equal(h.res.keys_unchecked, 0);

	/* A read out of real-time order with the longest one is still caught. */
	hist_init(&h, "c1.1;c2.1;");
	h.keys[AK].final_partial = true;
	h.keys[AK].final_invoke = 40;
	h.keys[AK].final_complete = 41;
	app(&h, 1, 1, 0, 10, 5);
	app(&h, 2, 1, 12, 20, 10);
	aget(&h, "c1.1;c2.1;", 22, 23);
	aget(&h, "c1.1;", 30, 31); /* fewer tokens than a read that ended before */
	aget(&h, "c1.1;c2.1;", 40, 41);
	app(&h, 3, 1, 35, 50, 0);
	expect_one(&h, CHK_V_STALE_READ);

	/* Mirror: the same history with the reads in order passes. */
	hist_init(&h, "c1.1;c2.1;");
	h.keys[AK].final_partial = true;
	h.keys[AK].final_invoke = 40;
	h.keys[AK].final_complete = 41;
	app(&h, 1, 1, 0, 10, 5);
	app(&h, 2, 1, 12, 20, 10);
	aget(&h, "c1.1;", 11, 13);
	aget(&h, "c1.1;c2.1;", 40, 41);
	app(&h, 3, 1, 35, 50, 0);
	assert_int_equal(check(&h), 0);
}

/*
 * Multi-key operations over K2 and K3: an mget sees all or none of each
 * mput's writes.
 */

/* An mput of c<client>.1 to K2 and c<client>.2 to K3, as multi-key op txn. */
static void
mput2(hist *h, uint32_t txn, uint32_t client, uint64_t inv, uint64_t comp)
{
	for (uint32_t j = 0; j < 2; j++) {
		chk_op *o = add(h, CHK_PUT, j ? K3 : K2, client, inv, comp);
		o->val = chk_val_id(client, j + 1);
		o->txn = txn;
	}
}

/* An mget of K2 and K3 that read the values named (client 0: not found). */
static void
mget2(hist *h, uint32_t txn, uint64_t inv, uint64_t comp, uint32_t c2, uint32_t s2, uint32_t c3,
      uint32_t s3)
{
	uint32_t c[2] = {c2, c3}, sq[2] = {s2, s3};
	for (int j = 0; j < 2; j++) {
		chk_op *o = add(h, CHK_GET, j ? K3 : K2, 9, inv, comp);
		o->txn = txn;
		if (c[j] == 0)
			o->status = CHK_NOTFOUND;
		else
			o->val = chk_val_id(c[j], sq[j]);
	}
}

/* While an mput is in flight, an mget sees its write to one key only. */
static void
mget_seeing_half_an_mput_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	mput2(&h, 1, 1, 0, 30);
	mget2(&h, 2, 5, 6, 1, 1, 0, 0);
	expect_one(&h, CHK_V_FRACTURED);
}

/* The same, the mget not atomic (its keys lived on two nodes): each key's
 * read is checked on its own, and the pair is not. */
static void
an_mget_that_was_not_atomic_may_see_half_an_mput(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	mput2(&h, 1, 1, 0, 30);
	mget2(&h, 2 | CHK_TXN_LOOSE, 5, 6, 1, 1, 0, 0);
	assert_int_equal(check(&h), 0);
	assert_int_equal(h.res.mgets_checked, 0);
	/* Nor is an mput that was not atomic seen in part by an atomic mget. */
	hist_init(&h, NULL);
	mput2(&h, 1 | CHK_TXN_LOOSE, 1, 0, 30);
	mget2(&h, 2, 5, 6, 1, 1, 0, 0);
	assert_int_equal(check(&h), 0);
	assert_int_equal(h.res.mgets_checked, 1);
	/* A key's part is still a read: one after the mput completed that
	 * does not see it is stale. */
	hist_init(&h, NULL);
	mput2(&h, 1, 1, 0, 30);
	mget2(&h, 2 | CHK_TXN_LOOSE, 40, 41, 1, 1, 0, 0);
	expect_one(&h, CHK_V_STALE_READ);
}

/* chk_loosen: the mputs and mgets of a group that overlap a window in which
 * its keys were split are marked not atomic, and nothing else. */
static void
multi_key_ops_overlapping_a_split_of_their_group_are_marked_not_atomic(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	mput2(&h, 1, 1, 0, 10);                            /* completed before the window */
	mget2(&h, 2, 5, 20, 1, 1, 1, 2);                   /* overlaps its start */
	mput2(&h, 3, 1, 30, 40);                           /* inside */
	mget2(&h, 4, 45, 60, 1, 1, 1, 2);                  /* overlaps its end */
	mget2(&h, 5, 60, 70, 1, 1, 1, 2);                  /* after */
	chk_op *f = add(&h, CHK_PUT, K2, 2, 8, CHK_NEVER); /* failed mput before: may land */
	f->status = CHK_FAILED;
	f->txn = 6;
	add(&h, CHK_PUT, K2, 2, 30, 40)->txn = 0; /* a single put: not multi-key */
	add(&h, CHK_GET, RK, 3, 30, 40)->txn = 7; /* a key outside the group */
	chk_loose_win win = {.first = K2, .n = 2, .from = 15, .to = 50};
	assert_int_equal(chk_loosen(h.ops, h.n, &win, 1), 7);
	uint32_t want[] = {1,
	                   1,
	                   2 | CHK_TXN_LOOSE,
	                   2 | CHK_TXN_LOOSE,
	                   3 | CHK_TXN_LOOSE,
	                   3 | CHK_TXN_LOOSE,
	                   4 | CHK_TXN_LOOSE,
	                   4 | CHK_TXN_LOOSE,
	                   5,
	                   5,
	                   6 | CHK_TXN_LOOSE,
	                   0,
	                   7};
	assert_int_equal(h.n, sizeof(want) / sizeof(want[0]));
	for (size_t i = 0; i < h.n; i++)
		assert_int_equal(h.ops[i].txn, want[i]);
	/* Marked once only. */
	assert_int_equal(chk_loosen(h.ops, h.n, &win, 1), 0);
}

static void
mget_seeing_all_or_none_of_an_mput_passes(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	mput2(&h, 1, 1, 0, 30);
	mget2(&h, 2, 5, 6, 0, 0, 0, 0);
	mget2(&h, 3, 10, 11, 1, 1, 1, 2);
	mget2(&h, 4, 40, 41, 1, 1, 1, 2);
	assert_int_equal(check(&h), 0);
	assert_int_equal(h.res.mputs, 1);
	assert_int_equal(h.res.mgets_checked, 3);
}

/* The mget sees the mput on K2 but, on K3, a put that completed before the
 * mput began. */
static void
mget_seeing_an_mput_beside_an_older_put_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	add(&h, CHK_PUT, K3, 3, 0, 2)->val = chk_val_id(3, 1);
	mput2(&h, 1, 1, 5, 30);
	mget2(&h, 2, 10, 11, 1, 1, 3, 1);
	expect_one(&h, CHK_V_FRACTURED);
}

static void
mget_seeing_a_later_put_beside_an_mput_passes(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	mput2(&h, 1, 1, 0, 5);
	add(&h, CHK_PUT, K3, 3, 8, 30)->val = chk_val_id(3, 1); /* overwrites K3 */
	mget2(&h, 2, 10, 11, 1, 1, 3, 1);
	assert_int_equal(check(&h), 0);
}

/* Two concurrent mputs of both keys; an mget sees one on K2, the other on
 * K3: each is ordered before the other. */
static void
mget_seeing_two_mputs_interleaved_is_caught(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	mput2(&h, 1, 1, 0, 30);
	mput2(&h, 2, 2, 0, 30);
	mget2(&h, 3, 10, 11, 1, 1, 2, 2);
	expect_one(&h, CHK_V_TXN_CYCLE);
}

static void
mgets_seeing_two_mputs_in_turn_pass(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	mput2(&h, 1, 1, 0, 30);
	mput2(&h, 2, 2, 0, 30);
	mget2(&h, 3, 10, 11, 1, 1, 1, 2);
	mget2(&h, 4, 20, 21, 2, 1, 2, 2);
	assert_int_equal(check(&h), 0);
}

static void
malformed_multi_key_operation_is_reported(void **state)
{
	hist h;
	(void)state;

	hist_init(&h, NULL);
	mput2(&h, 1, 1, 0, 30);
	h.ops[1].complete = 31; /* its parts disagree on the time */
	expect_one(&h, CHK_V_BAD_HISTORY);
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
	    cmocka_unit_test(flip_flop_between_concurrent_puts_is_caught),
	    cmocka_unit_test(reads_of_one_value_after_concurrent_puts_pass),
	    cmocka_unit_test(put_applied_twice_is_caught),
	    cmocka_unit_test(late_effect_of_a_long_put_passes),
	    cmocka_unit_test(failed_put_seen_then_overwritten_then_seen_again_is_caught),
	    cmocka_unit_test(read_of_an_older_value_after_a_failed_put_was_seen_is_caught),
	    cmocka_unit_test(failed_put_seen_after_the_older_value_passes),
	    cmocka_unit_test(order_of_three_puts_contradicted_by_two_reads_is_caught),
	    cmocka_unit_test(order_of_three_puts_confirmed_by_two_reads_passes),
	    cmocka_unit_test(absent_after_a_value_was_seen_is_caught),
	    cmocka_unit_test(register_check_agrees_with_brute_force_on_random_histories),
	    cmocka_unit_test(read_of_a_deleted_value_is_caught),
	    cmocka_unit_test(read_of_a_value_during_its_delete_passes),
	    cmocka_unit_test(delete_returning_a_value_never_written_is_caught),
	    cmocka_unit_test(delete_returning_an_overwritten_value_is_caught),
	    cmocka_unit_test(deletes_returning_what_was_there_pass),
	    cmocka_unit_test(value_deleted_twice_is_caught),
	    cmocka_unit_test(absent_between_two_puts_without_a_delete_is_caught),
	    cmocka_unit_test(absent_between_two_puts_after_a_failed_delete_passes),
	    cmocka_unit_test(delete_finding_nothing_while_a_value_is_there_is_caught),
	    cmocka_unit_test(register_whose_search_is_cut_off_is_unchecked),
	    cmocka_unit_test(register_with_deletes_agrees_with_brute_force_on_random_histories),
	    cmocka_unit_test(scan_returning_a_stale_value_is_caught),
	    cmocka_unit_test(scan_missing_a_present_key_is_caught),
	    cmocka_unit_test(scans_overlapping_writes_pass),
	    cmocka_unit_test(scan_of_a_deleted_key_is_checked_by_the_search),
	    cmocka_unit_test(append_key_without_final_read_is_checked_against_its_longest_read),
	    cmocka_unit_test(mget_seeing_half_an_mput_is_caught),
	    cmocka_unit_test(mget_seeing_all_or_none_of_an_mput_passes),
	    cmocka_unit_test(an_mget_that_was_not_atomic_may_see_half_an_mput),
	    cmocka_unit_test(
	        multi_key_ops_overlapping_a_split_of_their_group_are_marked_not_atomic),
	    cmocka_unit_test(mget_seeing_an_mput_beside_an_older_put_is_caught),
	    cmocka_unit_test(mget_seeing_a_later_put_beside_an_mput_passes),
	    cmocka_unit_test(mget_seeing_two_mputs_interleaved_is_caught),
	    cmocka_unit_test(mgets_seeing_two_mputs_in_turn_pass),
	    cmocka_unit_test(malformed_multi_key_operation_is_reported),
	    cmocka_unit_test(cas_chain_with_refusals_passes),
	    cmocka_unit_test(two_cas_from_one_value_both_applied_are_caught),
	    cmocka_unit_test(cas_refused_on_its_expected_value_is_caught),
	    cmocka_unit_test(lock_taken_twice_is_caught),
	    cmocka_unit_test(cas_told_a_value_never_written_is_caught),
	    cmocka_unit_test(failed_cas_applied_or_not_passes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
