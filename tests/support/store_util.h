/*
 * store_util.h - fixtures and helpers shared by the store test programs.
 *
 * Every semantic test runs once per store configuration (mode x partition
 * count): run_store_groups() runs the same table of tests as one cmocka group
 * per configuration, handing the configuration to each test as its prestate.
 * The fixture creates a fresh store for every test and destroys it, and any
 * extra store the test opened, on every path.
 *
 * cmocka's assertions longjmp, so they may be used only on the thread that
 * runs the test: store callbacks and worker threads record failures in plain
 * fields that the test thread checks afterwards.
 */
#ifndef KV_TESTS_SUPPORT_STORE_UTIL_H
#define KV_TESTS_SUPPORT_STORE_UTIL_H

// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "common/err.h"
#include "common/key.h"
#include "shardserver/store/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* One store configuration the tests run under. */
typedef struct {
	const char *name;        /* printed before the group */
	kv_store_mode mode;      /* concurrency mode */
	unsigned partitions;     /* partition count of the fixture's store */
	unsigned big_partitions; /* partition count for "many partitions" tests */
} store_cfg;

/* Striped and percore, each with one partition and with several. */
extern const store_cfg store_cfgs[];
extern const size_t store_ncfgs;

#define STORE_FIXTURE_EXTRA 4

/* The state a test receives: its configuration and a fresh store. */
typedef struct {
	const store_cfg *cfg;                 /* configuration of this run */
	kv_store *s;                          /* store with cfg's mode and partitions */
	kv_store *extra[STORE_FIXTURE_EXTRA]; /* stores opened by store_open_extra */
} store_fixture;

/* Prestate setup: turns the store_cfg in *state into a store_fixture. */
int store_fixture_setup(void **state);
/* Destroys the fixture's stores. */
int store_fixture_teardown(void **state);

/* A test that runs on a fresh store of every configuration. */
typedef struct {
	const char *name;      /* the behaviour, as cmocka prints it */
	CMUnitTestFunction fn; /* receives a store_fixture * */
} store_test;
// clang-format off
#define STORE_TEST(f) {#f, f}
// clang-format on

/*
 * Opens another store in the fixture's mode (partitions 0: the fixture's
 * count) with the given limits; the fixture destroys it. Fails the test when
 * creation fails.
 */
kv_store *store_open_extra(store_fixture *fx, unsigned partitions, size_t max_key, size_t max_value,
                           size_t mem_limit);

/* Runs `tests` as one cmocka group per configuration in cfgs[0..ncfgs), each
 * test on a fresh store_fixture; returns the number of failed tests. */
int run_store_groups(const char *program, const store_test *tests, size_t ntests,
                     const store_cfg *cfgs, size_t ncfgs);

/* Deterministic pseudo-random numbers (splitmix64). */
static inline uint64_t
rng_next(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Returns a uniform number in [0, n). */
static inline uint64_t
rng_below(uint64_t *state, uint64_t n)
{
	return rng_next(state) % n;
}

/* Writes prefix followed by a zero-padded decimal `i` into buf; returns the
 * length. Aborts when buf is too small; safe on any thread. */
size_t fmt_key(char *buf, size_t cap, const char *prefix, size_t i);

/* Asserting wrappers for NUL-terminated keys and values. */
void put_s(kv_store *s, const char *key, const char *val);
void assert_value(kv_store *s, const void *key, size_t klen, const void *val, size_t vlen);
void assert_value_s(kv_store *s, const char *key, const char *val);
void assert_absent(kv_store *s, const void *key, size_t klen);
void assert_absent_s(kv_store *s, const char *key);
kv_store_stats stats_of(kv_store *s);

/* Entries collected by a visit callback, in visit order. */
typedef struct {
	size_t n;          /* entries collected */
	size_t cap;        /* slots allocated */
	kv_buf *keys;      /* copied keys */
	kv_buf *vals;      /* copied values (empty when val was NULL) */
	bool *val_set;     /* whether the callback got a non-NULL val */
	size_t stop_after; /* 0, or return 1 once this many entries were collected */
} entry_list;

/* kv_store_visit_cb that appends to the entry_list `arg`. Aborts on malloc failure. */
int entry_list_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen);
void entry_list_fini(entry_list *l);

/* Scans [start, end) completely into `out` (which it resets), with values. */
void scan_all(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
              entry_list *out);

/* Returns whether the entry's key equals (key, klen). */
bool entry_key_is(const entry_list *l, size_t i, const void *key, size_t klen);

/* Failures seen by worker threads, checked by the test thread after joining them. */
typedef struct {
	pthread_mutex_t mu; /* protects first */
	char first[256];    /* the first failure's message */
	atomic_int count;   /* failures so far */
} race_log;

void race_log_init(race_log *r);
/* Records a failure; safe on any thread. */
void race_fail(race_log *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Fails the test when any failure was recorded; call on the test thread. */
void race_log_check(race_log *r);

/* Starts n threads running fn(args + i * stride), joins them all, then fails
 * the test if one could not be started. */
void run_threads(size_t n, void *(*fn)(void *), void *args, size_t stride);

/* Asserts that the key and byte counts of the stats agree with a full scan. */
void assert_stats_match_scan(kv_store *s);

/* qsort comparator of kv_bytes by kv_key_cmp. */
int bytes_cmp(const void *a, const void *b);

/* malloc/calloc that abort on failure (test code only). */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);

#endif
