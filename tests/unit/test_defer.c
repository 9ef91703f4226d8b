/*
 * test_defer.c - work left to the end of a thread's round (common/defer.h):
 * it runs once per round, in the order first left, only at the end; a
 * thread in no round, a full list and a function running at the end are
 * told to do the work themselves; an inner round is part of the outer one;
 * rounds are per thread.
 */
#include "common/defer.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

struct trace {
	int calls[16]; /* ids, in call order */
	int n;
};

struct entry {
	struct trace *t;
	int id;
	bool leave_again; /* tries to leave itself while it runs */
	bool left_again;  /* ... and what kv_defer said */
};

static void
record(void *arg)
{
	struct entry *e = arg;
	if (e->t->n < 16)
		e->t->calls[e->t->n] = e->id;
	e->t->n++;
	if (e->leave_again)
		e->left_again = kv_defer(record, e);
}

static void
work_left_runs_once_at_the_end_in_first_left_order(void **state)
{
	(void)state;
	struct trace t = {0};
	struct entry a = {&t, 1, false, false}, b = {&t, 2, false, false};

	kv_defer_begin();
	assert_true(kv_defer(record, &b));
	assert_true(kv_defer(record, &a));
	assert_true(kv_defer(record, &b)); /* already left: once */
	assert_int_equal(t.n, 0);
	kv_defer_end();
	assert_int_equal(t.n, 2);
	assert_int_equal(t.calls[0], 2);
	assert_int_equal(t.calls[1], 1);

	/* a new round starts empty */
	kv_defer_begin();
	kv_defer_end();
	assert_int_equal(t.n, 2);
}

static void
outside_a_round_nothing_is_left(void **state)
{
	(void)state;
	struct trace t = {0};
	struct entry a = {&t, 1, false, false};

	assert_false(kv_defer(record, &a));
	kv_defer_begin();
	kv_defer_end();
	assert_false(kv_defer(record, &a));
	assert_int_equal(t.n, 0);
}

static void
a_full_list_says_so_and_keeps_what_it_holds(void **state)
{
	(void)state;
	struct trace t = {0};
	struct entry e[12];
	int taken = 0;

	kv_defer_begin();
	for (int i = 0; i < 12; i++) {
		e[i] = (struct entry){&t, i, false, false};
		if (kv_defer(record, &e[i]))
			taken++;
		else
			break;
	}
	assert_true(taken >= 4 && taken < 12);
	kv_defer_end();
	assert_int_equal(t.n, taken);
	for (int i = 0; i < taken; i++)
		assert_int_equal(t.calls[i], i);
}

static void
a_function_running_at_the_end_cannot_leave_more(void **state)
{
	(void)state;
	struct trace t = {0};
	struct entry a = {&t, 1, true, true};

	kv_defer_begin();
	assert_true(kv_defer(record, &a));
	kv_defer_end();
	assert_int_equal(t.n, 1);
	assert_false(a.left_again);
}

static void
an_inner_round_is_part_of_the_outer_one(void **state)
{
	(void)state;
	struct trace t = {0};
	struct entry a = {&t, 1, false, false}, b = {&t, 2, false, false};

	kv_defer_begin();
	assert_true(kv_defer(record, &a));
	kv_defer_begin();
	assert_true(kv_defer(record, &b));
	kv_defer_end();
	assert_int_equal(t.n, 0);          /* nothing ran at the inner end */
	assert_true(kv_defer(record, &a)); /* still in the outer round */
	kv_defer_end();
	assert_int_equal(t.n, 2);
	assert_int_equal(t.calls[0], 1);
	assert_int_equal(t.calls[1], 2);
	kv_defer_end(); /* an end without a round does nothing */
	assert_false(kv_defer(record, &a));
}

static void *
other_thread(void *arg)
{
	struct entry *e = arg;
	e->left_again = kv_defer(record, e); /* this thread is in no round */
	return NULL;
}

static void
rounds_are_per_thread(void **state)
{
	(void)state;
	struct trace t = {0};
	struct entry a = {&t, 1, false, true};
	pthread_t th;

	kv_defer_begin();
	assert_int_equal(pthread_create(&th, NULL, other_thread, &a), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_false(a.left_again);
	kv_defer_end();
	assert_int_equal(t.n, 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(work_left_runs_once_at_the_end_in_first_left_order),
	    cmocka_unit_test(outside_a_round_nothing_is_left),
	    cmocka_unit_test(a_full_list_says_so_and_keeps_what_it_holds),
	    cmocka_unit_test(a_function_running_at_the_end_cannot_leave_more),
	    cmocka_unit_test(an_inner_round_is_part_of_the_outer_one),
	    cmocka_unit_test(rounds_are_per_thread),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
