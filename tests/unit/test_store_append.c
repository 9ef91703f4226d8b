/*
 * test_store_append.c - 8 threads append their own letter 10 times to each of
 * 10,000 initially absent keys (2,500 under ThreadSanitizer); afterwards
 * every value holds each of the 8 letters exactly 10 times. A program of its
 * own because it is the longest of the concurrency tests (3.2 million
 * appends over the four configurations: about 20 s under ThreadSanitizer on
 * two cores with every key, most of it in percore mode, where every append
 * is a hand-off to an owner thread).
 */
#include "tests/support/store_util.h"

#include <stdlib.h>

#define FX(state) ((store_fixture *)*(state))

#define APPEND_THREADS 8
#define APPEND_REPS    10
/* Under ThreadSanitizer (CI's concurrency run) a quarter of the keys: the
 * same interleavings of the same code, a quarter of the 20 s; the other
 * builds run all of them. */
#if defined(__SANITIZE_THREAD__)
#define APPEND_KEYS 2500
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define APPEND_KEYS 2500
#endif
#endif
#ifndef APPEND_KEYS
#define APPEND_KEYS 10000
#endif

typedef struct {
	kv_store *s;
	race_log *log;
	unsigned id; /* thread number; appends 'A' + id */
} append_arg;

static void *
append_worker(void *p)
{
	append_arg *a = p;
	char letter = (char)('A' + a->id), key[32];

	for (unsigned rep = 0; rep < APPEND_REPS; rep++) {
		/* Threads start at different keys so they meet everywhere, not in lockstep. */
		for (size_t j = 0; j < APPEND_KEYS; j++) {
			size_t k = (j + a->id * (APPEND_KEYS / APPEND_THREADS)) % APPEND_KEYS;
			size_t klen = fmt_key(key, sizeof key, "ap", k), newlen = 0;
			int rv = kv_store_append(a->s, key, klen, &letter, 1, &newlen);
			if (rv != KV_OK)
				race_fail(a->log, "append %s: %s", key, kv_errname(rv));
			else if (newlen < rep + 1 || newlen > APPEND_THREADS * APPEND_REPS)
				race_fail(a->log, "append %s: new length %zu", key, newlen);
		}
	}
	return NULL;
}

static void
concurrent_appends_of_distinct_letters_are_all_kept(void **state)
{
	kv_store *s = FX(state)->s;
	append_arg args[APPEND_THREADS];
	entry_list l = {0};
	race_log log;
	kv_store_stats st;

	race_log_init(&log);
	for (unsigned i = 0; i < APPEND_THREADS; i++)
		args[i] = (append_arg){s, &log, i};
	run_threads(APPEND_THREADS, append_worker, args, sizeof args[0]);
	race_log_check(&log);

	scan_all(s, NULL, 0, NULL, 0, &l);
	assert_int_equal(l.n, APPEND_KEYS);
	for (size_t i = 0; i < l.n; i++) {
		size_t count[APPEND_THREADS] = {0};
		assert_int_equal(l.vals[i].len, APPEND_THREADS * APPEND_REPS);
		for (size_t j = 0; j < l.vals[i].len; j++) {
			unsigned c = (unsigned)(l.vals[i].data[j] - 'A');
			assert_true(c < APPEND_THREADS);
			count[c]++;
		}
		for (unsigned t = 0; t < APPEND_THREADS; t++)
			assert_int_equal(count[t], APPEND_REPS);
	}
	st = stats_of(s);
	assert_int_equal(st.keys, APPEND_KEYS);
	assert_int_equal(st.bytes, APPEND_KEYS * (8 + APPEND_THREADS * APPEND_REPS));
	entry_list_fini(&l);
}

static const store_test append_tests[] = {
    STORE_TEST(concurrent_appends_of_distinct_letters_are_all_kept),
};

int
main(void)
{
	int failed =
	    run_store_groups("test_store_append", append_tests,
	                     sizeof append_tests / sizeof append_tests[0], store_cfgs, store_ncfgs);
	return failed == 0 ? 0 : 1;
}
