/*
 * test_store_concurrency.c - the local store under concurrent use, in striped
 * and percore mode: mget never sees half an mput, scans racing deletes stay
 * ordered and finish, 200 threads of mixed operations leave only values that
 * were written, and range walks and range deletes stay exact while writers
 * run. Concurrent appends have their own program, test_store_append.c.
 *
 * Every test is bounded by an iteration count, not by time, so that it ends
 * under ThreadSanitizer too (CI runs this program there; each configuration
 * must stay well inside the ctest TIMEOUT on two cores). Worker threads never
 * call cmocka assertions: they count failures and keep the first message in a
 * race_log, which the test thread checks after joining them.
 */
#include "tests/support/store_util.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FX(state) ((store_fixture *)*(state))

/*
 * mput / mget atomicity.
 */

#define ATOMIC_KEYS  32
#define ATOMIC_ITERS 2000

typedef struct {
	kv_store *s;
	race_log *log;
	unsigned id;          /* thread number */
	bool writer;          /* mput or mget */
	const kv_bytes *keys; /* the shared ATOMIC_KEYS keys */
	atomic_size_t *torn;  /* mgets that saw mixed values */
} atomic_arg;

static void *
atomic_worker(void *p)
{
	atomic_arg *a = p;
	kv_bytes vals[ATOMIC_KEYS];
	kv_buf got[ATOMIC_KEYS] = {{0}};
	char v[64];

	for (unsigned it = 0; it < ATOMIC_ITERS; it++) {
		if (a->writer) {
			/* Lengths vary so that a torn read cannot hide behind equal sizes. */
			int len = snprintf(v, sizeof v, "w%u-i%u-%.*s", a->id, it, (int)(it % 23),
			                   "xxxxxxxxxxxxxxxxxxxxxxxxx");
			for (size_t k = 0; k < ATOMIC_KEYS; k++)
				vals[k] = (kv_bytes){(const uint8_t *)v, (size_t)len};
			int rv = kv_store_mput(a->s, ATOMIC_KEYS, a->keys, ATOMIC_KEYS, vals);
			if (rv != KV_OK)
				race_fail(a->log, "mput: %s", kv_errname(rv));
			continue;
		}
		int rv = kv_store_mget(a->s, ATOMIC_KEYS, a->keys, got, NULL);
		if (rv != KV_OK) {
			race_fail(a->log, "mget: %s", kv_errname(rv));
			continue;
		}
		for (size_t k = 1; k < ATOMIC_KEYS; k++) {
			if (got[k].len != got[0].len ||
			    memcmp(got[k].data, got[0].data, got[0].len) != 0) {
				atomic_fetch_add(a->torn, 1);
				race_fail(a->log,
				          "mget saw \"%.*s\" for key 0 and \"%.*s\" for key %zu",
				          (int)got[0].len, (const char *)got[0].data,
				          (int)got[k].len, (const char *)got[k].data, k);
				break;
			}
		}
	}
	for (size_t k = 0; k < ATOMIC_KEYS; k++)
		kv_buf_fini(&got[k]);
	return NULL;
}

static void
mget_never_sees_a_half_applied_mput(void **state)
{
	kv_store *s = FX(state)->s;
	char kbuf[ATOMIC_KEYS][16];
	kv_bytes keys[ATOMIC_KEYS], vals[ATOMIC_KEYS];
	atomic_arg args[8];
	atomic_size_t torn;
	race_log log;

	race_log_init(&log);
	atomic_init(&torn, 0);
	for (size_t k = 0; k < ATOMIC_KEYS; k++) {
		keys[k] = (kv_bytes){(const uint8_t *)kbuf[k], fmt_key(kbuf[k], 16, "at", k)};
		vals[k] = (kv_bytes){(const uint8_t *)"initial", 7};
	}
	assert_int_equal(kv_store_mput(s, ATOMIC_KEYS, keys, ATOMIC_KEYS, vals), KV_OK);
	for (unsigned i = 0; i < 8; i++)
		args[i] = (atomic_arg){s, &log, i, i % 2 == 0, keys, &torn};
	run_threads(8, atomic_worker, args, sizeof args[0]);
	race_log_check(&log);
	assert_int_equal(atomic_load(&torn), 0);

	/* The final state is one writer's last mput, on every key. */
	{
		kv_buf got[ATOMIC_KEYS] = {{0}};
		assert_int_equal(kv_store_mget(s, ATOMIC_KEYS, keys, got, NULL), KV_OK);
		assert_true(got[0].len > 4 && got[0].data[0] == 'w');
		for (size_t k = 0; k < ATOMIC_KEYS; k++) {
			assert_int_equal(got[k].len, got[0].len);
			assert_memory_equal(got[k].data, got[0].data, got[0].len);
		}
		for (size_t k = 0; k < ATOMIC_KEYS; k++)
			kv_buf_fini(&got[k]);
	}
	assert_stats_match_scan(s);
}

/*
 * Scans racing deletes and re-puts.
 */

#define SCAN_KEYS   2000
#define SCAN_ROUNDS 30

/* The value of a scan-test key: the key, '=', the key reversed. */
static size_t
scan_value(const uint8_t *key, size_t klen, uint8_t *out)
{
	memcpy(out, key, klen);
	out[klen] = '=';
	for (size_t i = 0; i < klen; i++)
		out[klen + 1 + i] = key[klen - 1 - i];
	return 2 * klen + 1;
}

typedef struct {
	kv_store *s;
	race_log *log;
	unsigned id;      /* thread number */
	atomic_int *stop; /* set when the scanners are done */
	size_t ops;       /* mutations done */
} mutator_arg;

/* Deletes and re-puts keys; keys whose number is a multiple of 10 are never touched. */
static void *
scan_mutator(void *p)
{
	mutator_arg *a = p;
	uint64_t seed = 1000 + a->id;
	uint8_t v[64];
	char key[32];

	while (!atomic_load(a->stop) || a->ops < 200) {
		size_t k = rng_below(&seed, SCAN_KEYS);
		size_t klen;
		int rv;

		if (k % 10 == 0)
			k++;
		klen = fmt_key(key, sizeof key, "sc", k);
		rv = kv_store_del(a->s, key, klen, NULL);
		if (rv != KV_OK && rv != KV_ENOTFOUND)
			race_fail(a->log, "del: %s", kv_errname(rv));
		if (rng_below(&seed, 4) != 0) {
			rv = kv_store_put(a->s, key, klen, v, scan_value((uint8_t *)key, klen, v));
			if (rv != KV_OK)
				race_fail(a->log, "put: %s", kv_errname(rv));
		}
		a->ops++;
	}
	return NULL;
}

typedef struct {
	kv_store *s;
	race_log *log;
	unsigned id;  /* thread number: picks the kind of scan */
	size_t scans; /* scans completed */
} scanner_arg;

/* Checks the order, the values and the presence of the untouched keys in one scan. */
static void
check_scan(scanner_arg *a, const entry_list *l, bool with_values, bool full)
{
	size_t stable = 0;
	uint8_t v[64];

	for (size_t i = 0; i < l->n; i++) {
		const kv_buf *k = &l->keys[i];
		if (i > 0 &&
		    kv_key_cmp(l->keys[i - 1].data, l->keys[i - 1].len, k->data, k->len) >= 0)
			race_fail(a->log, "scan entries %zu and %zu out of order", i - 1, i);
		if (with_values && (l->vals[i].len != scan_value(k->data, k->len, v) ||
		                    memcmp(l->vals[i].data, v, l->vals[i].len) != 0))
			race_fail(a->log, "scan entry %zu has a wrong value", i);
		if (!with_values && l->val_set[i])
			race_fail(a->log, "keys-only scan passed a value");
		if (k->len == 8 && (k->data[7] - '0') == 0)
			stable++;
	}
	if (full && stable != SCAN_KEYS / 10)
		race_fail(a->log, "scan saw %zu of %d untouched keys", stable, SCAN_KEYS / 10);
}

static void *
scan_scanner(void *p)
{
	scanner_arg *a = p;
	entry_list l = {0};

	for (unsigned round = 0; round < SCAN_ROUNDS; round++) {
		bool with_values = (a->id + round) % 3 != 0;
		bool more = false;
		kv_buf from = {0};
		int rv;

		if (a->id % 2 == 0) {
			/* One scan of everything. */
			rv = kv_store_scan(a->s, NULL, 0, NULL, 0, 0, with_values, entry_list_cb,
			                   &l, &more);
			if (rv != KV_OK || more)
				race_fail(a->log, "scan: %s, more %d", kv_errname(rv), more);
			check_scan(a, &l, with_values, true);
		} else {
			/* Pages of 50, resumed after the last key. */
			do {
				more = false;
				rv = kv_store_scan(a->s, from.data, from.len, NULL, 0, 50,
				                   with_values, entry_list_cb, &l, &more);
				if (rv != KV_OK) {
					race_fail(a->log, "paged scan: %s", kv_errname(rv));
					break;
				}
				if (l.n > 0 &&
				    kv_scan_resume_key(l.keys[l.n - 1].data, l.keys[l.n - 1].len,
				                       &from) != KV_OK)
					break;
			} while (more);
			check_scan(a, &l, with_values, true);
		}
		kv_buf_fini(&from);
		entry_list_fini(&l);
		a->scans++;
	}
	return NULL;
}

static void
scans_racing_deletes_and_reputs_stay_ordered_and_finish(void **state)
{
	kv_store *s = FX(state)->s;
	mutator_arg muts[2];
	scanner_arg scans[2];
	atomic_int stop;
	race_log log;
	uint8_t v[64];
	char key[32];
	pthread_t scanners[2], mutators[2];
	unsigned nscan = 0, nmut = 0;
	int rv = 0;

	race_log_init(&log);
	atomic_init(&stop, 0);
	for (size_t k = 0; k < SCAN_KEYS; k++) {
		size_t klen = fmt_key(key, sizeof key, "sc", k);
		assert_int_equal(kv_store_put(s, key, klen, v, scan_value((uint8_t *)key, klen, v)),
		                 KV_OK);
	}
	for (unsigned i = 0; i < 2; i++) {
		muts[i] = (mutator_arg){s, &log, i, &stop, 0};
		scans[i] = (scanner_arg){s, &log, i, 0};
	}
	/* Mutators run until both scanners are done. */
	while (nmut < 2 && rv == 0)
		if ((rv = pthread_create(&mutators[nmut], NULL, scan_mutator, &muts[nmut])) == 0)
			nmut++;
	while (nscan < 2 && rv == 0)
		if ((rv = pthread_create(&scanners[nscan], NULL, scan_scanner, &scans[nscan])) == 0)
			nscan++;
	for (unsigned i = 0; i < nscan; i++)
		pthread_join(scanners[i], NULL);
	atomic_store(&stop, 1);
	for (unsigned i = 0; i < nmut; i++)
		pthread_join(mutators[i], NULL);
	assert_int_equal(rv, 0);
	race_log_check(&log);
	assert_int_equal(scans[0].scans + scans[1].scans, 2 * SCAN_ROUNDS);
	assert_true(muts[0].ops >= 200 && muts[1].ops >= 200);
	assert_stats_match_scan(s);
}

/*
 * Mixed operations by many threads.
 */

#define MIXED_THREADS    200
#define MIXED_OPS        100
#define MIXED_KEYS       256
#define MIXED_BATCH      4
#define MIXED_MAX_WRITES (MIXED_OPS * MIXED_BATCH)

typedef struct {
	kv_store *s;
	race_log *log;
	unsigned id;                      /* thread number */
	size_t writes;                    /* successful key writes */
	uint16_t wrote[MIXED_MAX_WRITES]; /* wrote[seq]: the key written with seq */
} mixed_arg;

/* A value "<key>|<thread>|<seq>" names its key and the write that produced it. */
static size_t
mixed_value(char *out, size_t cap, unsigned key, unsigned id, size_t seq)
{
	return (size_t)snprintf(out, cap, "%03u|%03u|%zu", key, id, seq);
}

static size_t
mixed_key(char *out, size_t cap, unsigned key)
{
	return fmt_key(out, cap, "mx", key);
}

/* Returns whether `v` is a well-formed value of `key`. */
static bool
mixed_value_ok(const kv_buf *v, unsigned key, unsigned *id, size_t *seq)
{
	char buf[48];
	unsigned k, t;
	size_t q;

	if (v->len == 0 || v->len >= sizeof buf)
		return false;
	memcpy(buf, v->data, v->len);
	buf[v->len] = 0;
	if (sscanf(buf, "%u|%u|%zu", &k, &t, &q) != 3 || k != key || t >= MIXED_THREADS ||
	    q >= MIXED_MAX_WRITES)
		return false;
	if (id)
		*id = t;
	if (seq)
		*seq = q;
	return true;
}

static void *
mixed_worker(void *p)
{
	mixed_arg *a = p;
	uint64_t seed = 77 + a->id;
	char kb[MIXED_BATCH][16], vb[MIXED_BATCH][32];
	kv_bytes keys[MIXED_BATCH], vals[MIXED_BATCH];
	unsigned kn[MIXED_BATCH];
	kv_buf got[MIXED_BATCH] = {{0}};
	bool missing[MIXED_BATCH];

	for (unsigned op = 0; op < MIXED_OPS; op++) {
		unsigned kind = (unsigned)rng_below(&seed, 5);
		int rv;

		/* Distinct keys for the batch (a single key for single-key ops). */
		for (unsigned i = 0; i < MIXED_BATCH; i++) {
			bool dup;
			do {
				kn[i] = (unsigned)rng_below(&seed, MIXED_KEYS);
				dup = false;
				for (unsigned j = 0; j < i; j++)
					dup |= kn[j] == kn[i];
			} while (dup);
			keys[i] = (kv_bytes){(const uint8_t *)kb[i], mixed_key(kb[i], 16, kn[i])};
		}
		switch (kind) {
		case 0: /* put */
			vals[0].len = mixed_value(vb[0], 32, kn[0], a->id, a->writes);
			rv = kv_store_put(a->s, keys[0].p, keys[0].len, vb[0], vals[0].len);
			if (rv == KV_OK)
				a->wrote[a->writes++] = (uint16_t)kn[0];
			else
				race_fail(a->log, "put: %s", kv_errname(rv));
			break;
		case 1: /* get */
			rv = kv_store_get(a->s, keys[0].p, keys[0].len, &got[0]);
			if (rv == KV_OK && !mixed_value_ok(&got[0], kn[0], NULL, NULL))
				race_fail(a->log, "get of key %u returned a foreign value", kn[0]);
			else if (rv != KV_OK && rv != KV_ENOTFOUND)
				race_fail(a->log, "get: %s", kv_errname(rv));
			break;
		case 2: /* del */
			rv = kv_store_del(a->s, keys[0].p, keys[0].len, &got[0]);
			if (rv == KV_OK && !mixed_value_ok(&got[0], kn[0], NULL, NULL))
				race_fail(a->log, "del of key %u returned a foreign value", kn[0]);
			else if (rv != KV_OK && rv != KV_ENOTFOUND)
				race_fail(a->log, "del: %s", kv_errname(rv));
			break;
		case 3: /* mput */
			for (unsigned i = 0; i < MIXED_BATCH; i++) {
				vals[i].len = mixed_value(vb[i], 32, kn[i], a->id, a->writes + i);
				vals[i].p = (const uint8_t *)vb[i];
			}
			rv = kv_store_mput(a->s, MIXED_BATCH, keys, MIXED_BATCH, vals);
			if (rv != KV_OK) {
				race_fail(a->log, "mput: %s", kv_errname(rv));
				break;
			}
			for (unsigned i = 0; i < MIXED_BATCH; i++)
				a->wrote[a->writes++] = (uint16_t)kn[i];
			break;
		default: /* mget */
			rv = kv_store_mget(a->s, MIXED_BATCH, keys, got, missing);
			if (rv != KV_OK && rv != KV_ENOTFOUND) {
				race_fail(a->log, "mget: %s", kv_errname(rv));
				break;
			}
			for (unsigned i = 0; i < MIXED_BATCH && rv == KV_OK; i++)
				if (!mixed_value_ok(&got[i], kn[i], NULL, NULL))
					race_fail(a->log, "mget of key %u returned a foreign value",
					          kn[i]);
			break;
		}
	}
	for (unsigned i = 0; i < MIXED_BATCH; i++)
		kv_buf_fini(&got[i]);
	return NULL;
}

static void
mixed_operations_by_200_threads_leave_only_written_values(void **state)
{
	kv_store *s = FX(state)->s;
	mixed_arg *args = xcalloc(MIXED_THREADS, sizeof *args);
	race_log log;
	char key[16];

	race_log_init(&log);
	for (unsigned i = 0; i < MIXED_THREADS; i++) {
		args[i].s = s;
		args[i].log = &log;
		args[i].id = i;
	}
	run_threads(MIXED_THREADS, mixed_worker, args, sizeof args[0]);
	race_log_check(&log);

	/* Every value left is one that its writer acknowledged for that key. */
	for (unsigned k = 0; k < MIXED_KEYS; k++) {
		kv_buf v = {0};
		unsigned id = 0;
		size_t seq = 0, klen = mixed_key(key, sizeof key, k);
		int rv = kv_store_get(s, key, klen, &v);

		if (rv == KV_ENOTFOUND)
			continue;
		assert_int_equal(rv, KV_OK);
		assert_true(mixed_value_ok(&v, k, &id, &seq));
		assert_true(seq < args[id].writes);
		assert_int_equal(args[id].wrote[seq], k);
		kv_buf_fini(&v);
	}
	assert_stats_match_scan(s);
	free(args);
}

/*
 * Range maintenance while writers run.
 */

#define RANGE_KEYS    3000
#define RANGE_LO      1000
#define RANGE_HI      2000
#define RANGE_WRITERS 3

typedef struct {
	kv_store *s;
	race_log *log;
	unsigned id;      /* thread number */
	atomic_int *stop; /* set when the test thread is done */
	bool inside;      /* also update keys inside [RANGE_LO, RANGE_HI) */
	size_t ops;       /* writes done */
	size_t
	    last_put[RANGE_KEYS]; /* outside keys this thread owns: 1 + last round put, 0 absent */
} range_writer_arg;

/* Keys outside the range belong to writer (k % RANGE_WRITERS), so their final state is known. */
static void *
range_writer(void *p)
{
	range_writer_arg *a = p;
	uint64_t seed = 500 + a->id;
	char key[32], val[48];

	while (!atomic_load(a->stop) || a->ops < 100) {
		size_t k = rng_below(&seed, RANGE_KEYS), klen;
		int rv, vlen;

		if (k >= RANGE_LO && k < RANGE_HI) {
			if (!a->inside)
				continue;
			klen = fmt_key(key, sizeof key, "rg", k);
			vlen = snprintf(val, sizeof val, "rg%06zu|upd|%u|%zu", k, a->id, a->ops);
			rv = kv_store_put(a->s, key, klen, val, (size_t)vlen);
		} else {
			k -= k % RANGE_WRITERS;
			k += a->id;
			if (k >= RANGE_KEYS || (k >= RANGE_LO && k < RANGE_HI))
				continue;
			klen = fmt_key(key, sizeof key, "rg", k);
			if (a->last_put[k] != 0 && rng_below(&seed, 3) == 0) {
				rv = kv_store_del(a->s, key, klen, NULL);
				a->last_put[k] = 0;
			} else {
				vlen = snprintf(val, sizeof val, "rg%06zu|out|%u|%zu", k, a->id,
				                a->ops);
				rv = kv_store_put(a->s, key, klen, val, (size_t)vlen);
				a->last_put[k] = a->ops + 1;
			}
		}
		if (rv != KV_OK)
			race_fail(a->log, "writer: %s", kv_errname(rv));
		a->ops++;
	}
	return NULL;
}

typedef struct {
	range_writer_arg w[RANGE_WRITERS];
	pthread_t t[RANGE_WRITERS];
	atomic_int stop;
	race_log log;
} range_writers;

static void
range_writers_start(range_writers *rw, kv_store *s, bool inside)
{
	race_log_init(&rw->log);
	atomic_init(&rw->stop, 0);
	for (unsigned i = 0; i < RANGE_WRITERS; i++) {
		rw->w[i].s = s;
		rw->w[i].log = &rw->log;
		rw->w[i].id = i;
		rw->w[i].stop = &rw->stop;
		rw->w[i].inside = inside;
		if (pthread_create(&rw->t[i], NULL, range_writer, &rw->w[i]) != 0)
			abort();
	}
}

static void
range_writers_stop(range_writers *rw)
{
	atomic_store(&rw->stop, 1);
	for (unsigned i = 0; i < RANGE_WRITERS; i++)
		pthread_join(rw->t[i], NULL);
}

/* Range keys initially hold "rg<k>|init"; returns whether `v` is a value of key k. */
static bool
range_value_ok(const uint8_t *v, size_t vlen, size_t k)
{
	char prefix[16];

	fmt_key(prefix, sizeof prefix, "rg", k);
	return vlen > 9 && memcmp(v, prefix, 8) == 0 && v[8] == '|';
}

static void
put_range_keys(kv_store *s)
{
	char key[32], val[48];

	for (size_t k = 0; k < RANGE_KEYS; k++) {
		size_t klen = fmt_key(key, sizeof key, "rg", k);
		int vlen = snprintf(val, sizeof val, "%s|init", key);
		assert_int_equal(kv_store_put(s, key, klen, val, (size_t)vlen), KV_OK);
	}
}

/* Counts range_step visits per key of the range; checks values without asserting. */
typedef struct {
	uint32_t seen[RANGE_HI - RANGE_LO]; /* visits per key */
	size_t in_step;                     /* visits of the current step */
	size_t foreign;                     /* visits of keys outside the range */
	size_t bad_values;                  /* visits whose value is not the key's */
} walk_counts;

static int
walk_counts_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	walk_counts *w = arg;
	unsigned long k;
	char buf[16];

	w->in_step++;
	if (klen != 8 || memcmp(key, "rg", 2) != 0) {
		w->foreign++;
		return 0;
	}
	memcpy(buf, key + 2, 6);
	buf[6] = 0;
	k = strtoul(buf, NULL, 10);
	if (k < RANGE_LO || k >= RANGE_HI) {
		w->foreign++;
		return 0;
	}
	w->seen[k - RANGE_LO]++;
	if (val == NULL || !range_value_ok(val, vlen, k))
		w->bad_values++;
	return 0;
}

static void
range_step_visits_each_key_once_while_writers_run(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = store_open_extra(fx, fx->cfg->big_partitions, 0, 0, 0);
	walk_counts *w = xcalloc(3, sizeof *w);
	size_t steps[3] = {0}, oversized = 0, errors = 0;
	range_writers *rw = xcalloc(1, sizeof *rw);

	put_range_keys(s);
	range_writers_start(rw, s, true);
	for (unsigned walk = 0; walk < 3; walk++) {
		kv_store_cursor c;
		kv_store_cursor_init(&c);
		while (!c.done && steps[walk] < 100000) {
			w[walk].in_step = 0;
			if (kv_store_range_step(s, "rg001000", 8, "rg002000", 8, &c, 7,
			                        walk_counts_cb, &w[walk]) != KV_OK)
				errors++;
			if (w[walk].in_step > 7)
				oversized++;
			steps[walk]++;
		}
		kv_store_cursor_fini(&c);
	}
	range_writers_stop(rw);
	race_log_check(&rw->log);

	assert_int_equal(errors, 0);
	assert_int_equal(oversized, 0);
	for (unsigned walk = 0; walk < 3; walk++) {
		assert_true(steps[walk] < 100000);
		assert_int_equal(w[walk].foreign, 0);
		assert_int_equal(w[walk].bad_values, 0);
		for (size_t i = 0; i < RANGE_HI - RANGE_LO; i++)
			if (w[walk].seen[i] != 1)
				fail_msg("walk %u visited rg%06zu %u times", walk, RANGE_LO + i,
				         w[walk].seen[i]);
	}
	for (unsigned i = 0; i < RANGE_WRITERS; i++)
		assert_true(rw->w[i].ops >= 100);
	assert_stats_match_scan(s);
	free(w);
	free(rw);
}

static void
range_delete_while_writers_write_outside_keeps_their_keys(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = store_open_extra(fx, fx->cfg->big_partitions, 0, 0, 0);
	range_writers *rw = xcalloc(1, sizeof *rw);
	uint64_t deleted = 0, keys = 1, bytes = 1;
	size_t calls = 0, oversized = 0;
	char key[32];
	int rv;

	put_range_keys(s);
	range_writers_start(rw, s, false);
	do {
		uint64_t before = deleted;
		rv = kv_store_range_delete(s, "rg001000", 8, "rg002000", 8, 7, &deleted);
		if (deleted - before > 7)
			oversized++;
	} while (rv == KV_EBUSY && ++calls < 100000);
	range_writers_stop(rw);
	race_log_check(&rw->log);

	assert_int_equal(rv, KV_OK);
	assert_int_equal(oversized, 0);
	assert_int_equal(deleted, RANGE_HI - RANGE_LO);
	assert_int_equal(kv_store_range_count(s, "rg001000", 8, "rg002000", 8, &keys, &bytes),
	                 KV_OK);
	assert_int_equal(keys, 0);
	assert_int_equal(bytes, 0);

	/* Keys outside the range hold exactly what their writer left there. */
	for (size_t k = 0; k < RANGE_KEYS; k++) {
		size_t klen = fmt_key(key, sizeof key, "rg", k);
		range_writer_arg *w = &rw->w[k % RANGE_WRITERS];
		kv_buf v = {0};
		char want[48];
		int wlen;

		if (k >= RANGE_LO && k < RANGE_HI)
			continue;
		rv = kv_store_get(s, key, klen, &v);
		if (w->last_put[k] == 0) {
			/* Deleted by its writer, or never touched (initial value). */
			if (rv == KV_OK) {
				wlen = snprintf(want, sizeof want, "%s|init", key);
				assert_int_equal(v.len, (size_t)wlen);
				assert_memory_equal(v.data, want, (size_t)wlen);
			} else {
				assert_int_equal(rv, KV_ENOTFOUND);
			}
		} else {
			assert_int_equal(rv, KV_OK);
			wlen = snprintf(want, sizeof want, "%s|out|%u|%zu", key, w->id,
			                w->last_put[k] - 1);
			assert_int_equal(v.len, (size_t)wlen);
			assert_memory_equal(v.data, want, (size_t)wlen);
		}
		kv_buf_fini(&v);
	}
	assert_stats_match_scan(s);
	free(rw);
}

/*
 * A scan holds partition locks only while it copies a chunk.
 */

typedef struct {
	kv_store *s;
	pthread_mutex_t mu; /* protects the fields down to the blank line */
	pthread_cond_t cv;  /* signalled when a field changes */
	bool scan_waiting;  /* the scan callback is waiting for the writer */
	bool writer_done;   /* the writer's put returned */
	int writer_rv;      /* what it returned */

	size_t visits;        /* entries the callback saw */
	bool writer_overtook; /* the put finished while the scan was in its callback */
} scan_block;

static void *
scan_block_writer(void *p)
{
	scan_block *b = p;
	int rv;

	pthread_mutex_lock(&b->mu);
	while (!b->scan_waiting)
		pthread_cond_wait(&b->cv, &b->mu);
	pthread_mutex_unlock(&b->mu);
	rv = kv_store_put(b->s, "sb000500", 8, "written during the scan", 23);
	pthread_mutex_lock(&b->mu);
	b->writer_done = true;
	b->writer_rv = rv;
	pthread_cond_broadcast(&b->cv);
	pthread_mutex_unlock(&b->mu);
	return NULL;
}

static int
scan_block_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	scan_block *b = arg;
	struct timespec deadline;

	(void)key;
	(void)klen;
	(void)val;
	(void)vlen;
	if (++b->visits != 10)
		return 0;
	/* Let the writer go and wait for it, for at most two seconds. */
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += 2;
	pthread_mutex_lock(&b->mu);
	b->scan_waiting = true;
	pthread_cond_broadcast(&b->cv);
	while (!b->writer_done)
		if (pthread_cond_timedwait(&b->cv, &b->mu, &deadline) != 0)
			break;
	b->writer_overtook = b->writer_done;
	pthread_mutex_unlock(&b->mu);
	return 0;
}

static void
writes_proceed_while_a_scan_waits_in_its_callback(void **state)
{
	kv_store *s = FX(state)->s;
	scan_block b = {.s = s};
	pthread_t writer;
	char key[32];
	int rv;

	for (size_t i = 0; i < 1000; i++) {
		size_t klen = fmt_key(key, sizeof key, "sb", i);
		assert_int_equal(kv_store_put(s, key, klen, "v", 1), KV_OK);
	}
	pthread_mutex_init(&b.mu, NULL);
	pthread_cond_init(&b.cv, NULL);
	assert_int_equal(pthread_create(&writer, NULL, scan_block_writer, &b), 0);
	rv = kv_store_scan(s, NULL, 0, NULL, 0, 0, true, scan_block_cb, &b, NULL);
	pthread_join(writer, NULL);
	pthread_mutex_destroy(&b.mu);
	pthread_cond_destroy(&b.cv);

	assert_int_equal(rv, KV_OK);
	assert_int_equal(b.visits, 1000);
	assert_int_equal(b.writer_rv, KV_OK);
	assert_true(b.writer_overtook);
	assert_value_s(s, "sb000500", "written during the scan");
}

/*
 * A long walk in one call lets a writer of its partition in between its
 * steps: one partition of 4,096 keys walked by a single range step, a writer
 * blocked on that partition from the walk's first entry. Without bounded
 * steps the write would wait for the whole walk.
 */
#define LONG_WALK_KEYS 4096

typedef struct {
	kv_store *s;
	pthread_t writer;
	atomic_bool started; /* the writer thread runs */
	atomic_bool done;    /* its put returned */
	int writer_rv;
	size_t visits;  /* entries the walk visited */
	size_t done_at; /* visits when the walk first saw the put done (0: never) */
} long_walk;

static void *
long_walk_writer(void *arg)
{
	long_walk *l = arg;

	atomic_store(&l->started, true);
	/* "0" sorts before every walked key: the walk never visits it. */
	l->writer_rv = kv_store_put(l->s, "0", 1, "w", 1);
	atomic_store(&l->done, true);
	return NULL;
}

static int
long_walk_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	long_walk *l = arg;
	struct timespec pause = {0, 20000};
	(void)key, (void)klen, (void)val, (void)vlen;

	if (l->visits++ == 0) {
		/* The writer starts and blocks on the partition this walk holds. */
		if (pthread_create(&l->writer, NULL, long_walk_writer, l) != 0)
			return 1;
		while (!atomic_load(&l->started))
			sched_yield();
		struct timespec settle = {0, 2000000};
		nanosleep(&settle, NULL);
	}
	if (l->done_at == 0 && atomic_load(&l->done))
		l->done_at = l->visits;
	nanosleep(&pause, NULL); /* a slow visitor: the writer has time to run */
	return 0;
}

static void
a_writer_goes_first_between_the_steps_of_a_long_walk(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = store_open_extra(fx, 1, 0, 0, 0);
	long_walk l = {.s = s};
	kv_store_cursor c;
	char key[32];
	int rv = KV_OK;

	for (size_t i = 0; i < LONG_WALK_KEYS; i++) {
		size_t klen = fmt_key(key, sizeof key, "lw", i);
		assert_int_equal(kv_store_put(s, key, klen, "v", 1), KV_OK);
	}
	kv_store_cursor_init(&c);
	while (!c.done && rv == KV_OK)
		rv = kv_store_range_step(s, "lw", 2, "lx", 2, &c, LONG_WALK_KEYS, long_walk_cb, &l);
	kv_store_cursor_fini(&c);
	if (l.visits > 0)
		pthread_join(l.writer, NULL);

	assert_int_equal(rv, KV_OK);
	assert_int_equal(l.visits, LONG_WALK_KEYS);
	assert_int_equal(l.writer_rv, KV_OK);
	if (l.done_at == 0)
		fail_msg("the write waited for the whole walk of %d keys", LONG_WALK_KEYS);
	assert_value_s(s, "0", "w");
}

/*
 * A thread with a walk pause (the heartbeat's statistics) sleeps between
 * the holds of its counts and split-key walks: one partition of 4,096
 * keys is 16 holds of 256 entries for a count and 8 for the split key (the
 * walk to the middle), so a pause of 3 ms makes them last at least 15 and
 * 7 pauses. Without it they take well under a millisecond.
 */
#define PAUSE_US 3000u

static void
a_thread_with_a_walk_pause_sleeps_between_its_holds(void **state)
{
	store_fixture *fx = FX(state);
	kv_store *s = store_open_extra(fx, 1, 0, 0, 0);
	uint64_t keys = 0, bytes = 0, t0, count_us, split_us;
	kv_buf mid = {0};
	char key[32];
	int rv_count, rv_split;

	for (size_t i = 0; i < LONG_WALK_KEYS; i++) {
		size_t klen = fmt_key(key, sizeof key, "wp", i);
		assert_int_equal(kv_store_put(s, key, klen, "v", 1), KV_OK);
	}
	kv_store_thread_walk_pause(PAUSE_US);
	t0 = kv_now_ns();
	rv_count = kv_store_range_count(s, "wp", 2, "wq", 2, &keys, &bytes);
	count_us = (kv_now_ns() - t0) / 1000u;
	t0 = kv_now_ns();
	rv_split = kv_store_range_split_key(s, "wp", 2, "wq", 2, &mid);
	split_us = (kv_now_ns() - t0) / 1000u;
	kv_store_thread_walk_pause(0); /* the setting outlives the test otherwise */

	assert_int_equal(rv_count, KV_OK);
	assert_int_equal(keys, LONG_WALK_KEYS);
	assert_int_equal(rv_split, KV_OK);
	assert_true(mid.len > 2 && memcmp(mid.data, "wp", 2) == 0);
	kv_buf_fini(&mid);
	if (count_us < 15u * PAUSE_US)
		fail_msg("a count of %d keys took %llu us: no pause between its holds",
		         LONG_WALK_KEYS, (unsigned long long)count_us);
	if (split_us < 7u * PAUSE_US)
		fail_msg("a split-key walk took %llu us: no pause between its holds",
		         (unsigned long long)split_us);
}

/*
 * Prefetching walks racing writers that grow and shrink the same nodes.
 */

#define PF_KEYS   300 /* keys "pf<byte><byte>": one node of up to 256 children */
#define PF_ROUNDS 3000

typedef struct {
	kv_store *s;
	race_log *log;
	atomic_int *stop; /* set by the prefetching thread when it is done */
	size_t ops;       /* mutations done */
} pf_writer_arg;

static size_t
pf_key(char *buf, size_t i)
{
	buf[0] = 'p';
	buf[1] = 'f';
	buf[2] = (char)(i / 256);
	buf[3] = (char)(i % 256);
	return 4;
}

/* Puts and deletes keys at random: nodes grow past N48 and shrink back. */
static void *
pf_writer(void *p)
{
	pf_writer_arg *a = p;
	uint64_t seed = 77;
	char key[4];

	while (!atomic_load(a->stop) || a->ops < 200) {
		size_t i = rng_below(&seed, PF_KEYS);
		size_t klen = pf_key(key, i);
		int rv = rng_below(&seed, 2) ? kv_store_put(a->s, key, klen, key, i % 3 ? 2 : klen)
		                             : kv_store_del(a->s, key, klen, NULL);
		if (rv != KV_OK && rv != KV_ENOTFOUND)
			race_fail(a->log, "write: %s", kv_errname(rv));
		a->ops++;
	}
	return NULL;
}

static void
prefetching_while_writers_reshape_the_same_nodes_is_race_free(void **state)
{
	kv_store *s = FX(state)->s;
	static char keys[PF_KEYS][4];
	kv_bytes all[PF_KEYS];
	atomic_int stop = 0;
	race_log log;
	pf_writer_arg wa[2];
	pthread_t th[2];

	race_log_init(&log);
	for (size_t i = 0; i < PF_KEYS; i++)
		all[i] = (kv_bytes){(const uint8_t *)keys[i], pf_key(keys[i], i)};
	for (int t = 0; t < 2; t++) {
		wa[t] = (pf_writer_arg){.s = s, .log = &log, .stop = &stop};
		assert_int_equal(pthread_create(&th[t], NULL, pf_writer, &wa[t]), 0);
	}
	for (size_t r = 0; r < PF_ROUNDS; r++)
		kv_store_prefetch(s, 16 + r % 48, all + (r * 7) % (PF_KEYS - 64));
	atomic_store(&stop, 1);
	for (int t = 0; t < 2; t++)
		pthread_join(th[t], NULL);
	race_log_check(&log);
	/* The tree the writers left is whole: every key reads as itself. */
	for (size_t i = 0; i < PF_KEYS; i++) {
		kv_buf v = {0};
		int rv = kv_store_get(s, all[i].p, all[i].len, &v);
		if (rv == KV_OK)
			assert_true(v.len == (i % 3 ? 2u : 4u) &&
			            memcmp(v.data, all[i].p, v.len) == 0);
		else
			assert_int_equal(rv, KV_ENOTFOUND);
		kv_buf_fini(&v);
	}
	assert_stats_match_scan(s);
}

static const store_test concurrency_tests[] = {
    STORE_TEST(mget_never_sees_a_half_applied_mput),
    STORE_TEST(scans_racing_deletes_and_reputs_stay_ordered_and_finish),
    STORE_TEST(mixed_operations_by_200_threads_leave_only_written_values),
    STORE_TEST(range_step_visits_each_key_once_while_writers_run),
    STORE_TEST(range_delete_while_writers_write_outside_keeps_their_keys),
    STORE_TEST(writes_proceed_while_a_scan_waits_in_its_callback),
    STORE_TEST(a_writer_goes_first_between_the_steps_of_a_long_walk),
    STORE_TEST(a_thread_with_a_walk_pause_sleeps_between_its_holds),
    STORE_TEST(prefetching_while_writers_reshape_the_same_nodes_is_race_free),
};

int
main(void)
{
	int failed = run_store_groups("test_store_concurrency", concurrency_tests,
	                              sizeof concurrency_tests / sizeof concurrency_tests[0],
	                              store_cfgs, store_ncfgs);
	return failed == 0 ? 0 : 1;
}
