/*
 * test_client_async.c - the asynchronous single-key ops of libshardkv
 * against real daemons: every op taken completes exactly once with its own
 * result (values to the right callers, deletes with their old values,
 * misses as not found); bad arguments are refused with no callback; keys
 * keep their last acknowledged value while their ranges move back and forth
 * under async writes; closing the handle with ops in flight completes
 * every one of them before it returns; and blocking calls from several
 * threads share a handle's connections with async ops in flight, each
 * getting its own answer. (Async append, mget, mput, scan and the scan
 * cursor: test_client_multi.c.)
 */
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define NKEYS  2000
#define WINDOW 64

static kv_tc tc;

static int
setup(void **state)
{
	(void)state;
	return kv_tc_start(&tc, "client-async", 2);
}

static int
teardown(void **state)
{
	(void)state;
	kv_tc_destroy(&tc);
	return 0;
}

/* One op's record: how often its callback ran, with what. */
typedef struct {
	atomic_int calls;
	int status;
	char val[64];
	size_t vlen;
} slot;

/* A window of at most WINDOW ops in flight, with per-op records. */
typedef struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	unsigned inflight;
	slot *slots;
} window;

typedef struct {
	window *w;
	unsigned i;
} ticket;

static void
record(void *arg, int status, const void *val, size_t vlen)
{
	ticket *t = arg;
	window *w = t->w;
	slot *s = &w->slots[t->i];

	s->status = status;
	s->vlen = vlen;
	if (val != NULL && vlen < sizeof(s->val))
		memcpy(s->val, val, vlen);
	atomic_fetch_add(&s->calls, 1);
	free(t);
	pthread_mutex_lock(&w->mu);
	w->inflight--;
	pthread_cond_broadcast(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

static void
window_init(window *w, unsigned n)
{
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	w->inflight = 0;
	w->slots = calloc(n, sizeof(slot));
	assert_non_null(w->slots);
}

static void
window_fini(window *w)
{
	pthread_cond_destroy(&w->cv);
	pthread_mutex_destroy(&w->mu);
	free(w->slots);
}

/* Waits until at most `max` ops are in flight (deadline 30 s). */
static void
window_wait(window *w, unsigned max)
{
	uint64_t deadline = kv_test_now_ms() + 30000;

	pthread_mutex_lock(&w->mu);
	while (w->inflight > max) {
		pthread_mutex_unlock(&w->mu);
		if (kv_test_now_ms() > deadline)
			fail_msg("%u async ops never completed", w->inflight);
		kv_test_sleep_ms(1);
		pthread_mutex_lock(&w->mu);
	}
	pthread_mutex_unlock(&w->mu);
}

static ticket *
take(window *w, unsigned i)
{
	ticket *t = malloc(sizeof(*t));
	assert_non_null(t);
	t->w = w;
	t->i = i;
	window_wait(w, WINDOW - 1);
	pthread_mutex_lock(&w->mu);
	w->inflight++;
	pthread_mutex_unlock(&w->mu);
	return t;
}

static void
give_back(window *w, ticket *t)
{
	pthread_mutex_lock(&w->mu);
	w->inflight--;
	pthread_mutex_unlock(&w->mu);
	free(t);
}

static void
async_ops_complete_once_with_their_own_results(void **state)
{
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	window w;
	char key[32], val[32];
	(void)state;

	/* Two servers, each owning half of the keys, so batches go to both. */
	const int idx[2] = {0, 1};
	assert_int_equal(kv_tc_spread(&tc, "a", NKEYS, idx, 2), 0);

	window_init(&w, NKEYS);
	for (unsigned i = 0; i < NKEYS; i++) {
		size_t kl = kv_tc_key(key, sizeof(key), "a", i);
		int vl = snprintf(val, sizeof(val), "v-%u", i);
		ticket *t = take(&w, i);
		int rv = shardkv_put_async(cl, key, kl, val, (size_t)vl, record, t);
		if (rv != 0) {
			give_back(&w, t);
			fail_msg("put_async %u: %s", i, shardkv_strerror(rv));
		}
	}
	window_wait(&w, 0);
	for (unsigned i = 0; i < NKEYS; i++) {
		assert_int_equal(atomic_load(&w.slots[i].calls), 1);
		if (w.slots[i].status != 0)
			fail_msg("put %u: %s", i, shardkv_strerror(w.slots[i].status));
	}
	window_fini(&w);

	/* Every get answers with its own key's value. */
	window_init(&w, NKEYS + 2);
	for (unsigned i = 0; i < NKEYS; i++) {
		size_t kl = kv_tc_key(key, sizeof(key), "a", i);
		ticket *t = take(&w, i);
		assert_int_equal(shardkv_get_async(cl, key, kl, record, t), 0);
	}
	ticket *t = take(&w, NKEYS);
	assert_int_equal(shardkv_get_async(cl, "a-missing", 9, record, t), 0);
	window_wait(&w, 0);
	for (unsigned i = 0; i < NKEYS; i++) {
		int vl = snprintf(val, sizeof(val), "v-%u", i);
		slot *s = &w.slots[i];
		assert_int_equal(atomic_load(&s->calls), 1);
		assert_int_equal(s->status, 0);
		if (s->vlen != (size_t)vl || memcmp(s->val, val, s->vlen) != 0)
			fail_msg("get %u read '%.*s', want '%s'", i, (int)s->vlen, s->val, val);
	}
	assert_int_equal(atomic_load(&w.slots[NKEYS].calls), 1);
	assert_int_equal(w.slots[NKEYS].status, SHARDKV_ENOTFOUND);
	assert_int_equal(w.slots[NKEYS].vlen, 0);

	/* A delete answers with the old value, then the key is gone. */
	size_t kl = kv_tc_key(key, sizeof(key), "a", 7);
	t = take(&w, NKEYS + 1);
	assert_int_equal(shardkv_del_async(cl, key, kl, record, t), 0);
	window_wait(&w, 0);
	assert_int_equal(w.slots[NKEYS + 1].status, 0);
	assert_int_equal(w.slots[NKEYS + 1].vlen, 3);
	assert_memory_equal(w.slots[NKEYS + 1].val, "v-7", 3);
	shardkv_buf b;
	assert_int_equal(shardkv_get(cl, key, kl, &b), SHARDKV_ENOTFOUND);
	window_fini(&w);
	shardkv_close(cl);
}

/* Async puts of values from empty to a few KiB, interleaved: the small
 * ones reuse the library's fixed-size op records, the large ones cannot;
 * every key reads back its own value, byte for byte. */
static void
async_puts_of_every_size_store_their_own_values(void **state)
{
	enum { N = 600, STEP = 7 };
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	static uint8_t val[N * STEP];
	window w;
	char key[32];
	(void)state;

	for (size_t i = 0; i < sizeof(val); i++)
		val[i] = (uint8_t)(i * 131u + 7u);
	window_init(&w, N);
	for (unsigned round = 0; round < 2; round++) {
		for (unsigned j = 0; j < N; j++) {
			/* Sizes alternate small and large, so records of both
			 * kinds are freed and taken again in between. */
			unsigned i = j % 2 ? j / 2 : N - 1 - j / 2;
			size_t kl = kv_tc_key(key, sizeof(key), "sz", i);
			ticket *t = take(&w, i);
			int rv = shardkv_put_async(cl, key, kl, val + round, (size_t)i * STEP,
			                           record, t);
			if (rv != 0) {
				give_back(&w, t);
				fail_msg("put_async %u: %s", i, shardkv_strerror(rv));
			}
		}
		window_wait(&w, 0);
	}
	for (unsigned i = 0; i < N; i++) {
		assert_int_equal(atomic_load(&w.slots[i].calls), 2);
		assert_int_equal(w.slots[i].status, 0);
		size_t kl = kv_tc_key(key, sizeof(key), "sz", i);
		shardkv_buf b;
		assert_int_equal(shardkv_get(cl, key, kl, &b), 0);
		if (b.len != (size_t)i * STEP || (b.len && memcmp(b.data, val + 1, b.len) != 0))
			fail_msg("key %u: %zu bytes read back, want %u of the second round", i,
			         b.len, i * STEP);
		shardkv_free(b.data);
	}
	window_fini(&w);
	shardkv_close(cl);
}

static atomic_int stray_calls;

static void
stray(void *arg, int status, const void *val, size_t vlen)
{
	(void)arg;
	(void)status;
	(void)val;
	(void)vlen;
	atomic_fetch_add(&stray_calls, 1);
}

/* Counts the completions of incr_async and put_ex_async. */
typedef struct {
	atomic_int done, ok, refused;
	atomic_llong max;
} tally;

static void
incr_done(void *arg, int status, int64_t n)
{
	tally *t = arg;
	if (status == 0) {
		atomic_fetch_add(&t->ok, 1);
		long long m = atomic_load(&t->max);
		while (n > m && !atomic_compare_exchange_weak(&t->max, &m, n))
			;
	}
	atomic_fetch_add(&t->done, 1);
}

static void
cond_done(void *arg, int status, const void *val, size_t vlen)
{
	tally *t = arg;
	(void)val;
	(void)vlen;
	if (status == 0)
		atomic_fetch_add(&t->ok, 1);
	else if (status == SHARDKV_EEXISTS)
		atomic_fetch_add(&t->refused, 1);
	atomic_fetch_add(&t->done, 1);
}

static void
tally_wait(tally *t, int n)
{
	uint64_t deadline = kv_test_now_ms() + 30000;
	while (atomic_load(&t->done) < n) {
		if (kv_test_now_ms() > deadline)
			fail_msg("%d of %d async ops completed", atomic_load(&t->done), n);
		kv_test_sleep_ms(1);
	}
}

/* Many incr and put-if-absent ops of few keys in flight at once, batched
 * into shared requests: every incr applied once (the counters end at the
 * number of incrs), exactly one put-if-absent per key applied. */
static void
async_incr_and_put_if_absent_in_batches_apply_once(void **state)
{
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	tally ti = {0}, tc2 = {0};
	shardkv_put_options absent = {.if_absent = true};
	char key[32];
	enum { N = 2000, KEYS = 4 };
	(void)state;

	for (int i = 0; i < N; i++) {
		int kl = snprintf(key, sizeof(key), "inc-%d", i % KEYS);
		assert_int_equal(shardkv_incr_async(cl, key, (size_t)kl, 1, incr_done, &ti), 0);
		kl = snprintf(key, sizeof(key), "once-%d", i % 50);
		assert_int_equal(
		    shardkv_put_ex_async(cl, key, (size_t)kl, "x", 1, &absent, cond_done, &tc2), 0);
	}
	tally_wait(&ti, N);
	tally_wait(&tc2, N);
	assert_int_equal(atomic_load(&ti.ok), N);
	assert_int_equal(atomic_load(&ti.max), N / KEYS);
	assert_int_equal(atomic_load(&tc2.ok), 50);
	assert_int_equal(atomic_load(&tc2.refused), N - 50);
	for (int k = 0; k < KEYS; k++) {
		int64_t n;
		int kl = snprintf(key, sizeof(key), "inc-%d", k);
		assert_int_equal(shardkv_incr(cl, key, (size_t)kl, 0, &n), 0);
		assert_int_equal(n, N / KEYS);
	}
	shardkv_close(cl);
}

static void
bad_arguments_are_refused_without_a_callback(void **state)
{
	shardkv_client *cl = kv_tc_client(&tc, true, 5000);
	static char big[64 * 1024 + 1];
	window w;
	(void)state;

	memset(big, 'k', sizeof(big));
	atomic_store(&stray_calls, 0);
	assert_int_equal(shardkv_get_async(cl, "k", 1, NULL, NULL), SHARDKV_EINVAL);
	assert_int_equal(shardkv_get_async(NULL, "k", 1, stray, NULL), SHARDKV_EINVAL);
	assert_int_equal(shardkv_put_async(cl, NULL, 3, "v", 1, stray, NULL), SHARDKV_EINVAL);
	assert_int_equal(shardkv_put_async(cl, "k", 1, NULL, 5, stray, NULL), SHARDKV_EINVAL);
	assert_int_equal(shardkv_get_async(cl, big, sizeof(big), stray, NULL), SHARDKV_ETOOBIG);
	assert_int_equal(shardkv_del_async(cl, "", 0, stray, NULL), SHARDKV_EINVAL);
	assert_int_equal(atomic_load(&stray_calls), 0);
	/* Over the server's --max-key (1 KiB) but not the library's bound: the
	 * server refuses it and the callback says so. */
	window_init(&w, 1);
	ticket *t = take(&w, 0);
	assert_int_equal(shardkv_put_async(cl, big, 1100, "v", 1, record, t), 0);
	window_wait(&w, 0);
	assert_int_equal(atomic_load(&w.slots[0].calls), 1);
	assert_int_equal(w.slots[0].status, SHARDKV_ETOOBIG);
	window_fini(&w);
	shardkv_close(cl);
	assert_int_equal(atomic_load(&stray_calls), 0);
}

/* Closed-loop writers: caller j writes its keys in turn with a growing
 * counter, each write issued from the previous one's completion. */
#define CALLERS 16
#define PER     8

typedef struct writer writer;
typedef struct {
	shardkv_client *cl;
	atomic_bool stop;
	atomic_int active;
	atomic_int errors;
	atomic_int first_err;
	unsigned acked[CALLERS * PER]; /* last acknowledged counter per key */
	writer *w;
} loop;

struct writer {
	loop *l;
	unsigned j;    /* caller */
	unsigned next; /* next counter */
	unsigned key;  /* key index of the write in flight */
};

static void writer_issue(writer *w);

static void
writer_done(void *arg, int status, const void *val, size_t vlen)
{
	writer *w = arg;
	(void)val;
	(void)vlen;

	if (status == 0) {
		w->l->acked[w->key] = w->next;
	} else {
		atomic_fetch_add(&w->l->errors, 1);
		atomic_store(&w->l->first_err, status);
	}
	__atomic_store_n(&w->next, w->next + 1, __ATOMIC_RELAXED);
	writer_issue(w);
}

static void
writer_issue(writer *w)
{
	char key[32], val[32];

	if (atomic_load(&w->l->stop)) {
		atomic_fetch_sub(&w->l->active, 1);
		return;
	}
	w->key = w->j * PER + w->next % PER;
	size_t kl = kv_tc_key(key, sizeof(key), "m", w->key);
	int vl = snprintf(val, sizeof(val), "%u", w->next);
	if (shardkv_put_async(w->l->cl, key, kl, val, (size_t)vl, writer_done, w) != 0) {
		atomic_fetch_add(&w->l->errors, 1);
		atomic_fetch_sub(&w->l->active, 1);
	}
}

/* Whether every writer has finished at least n writes. */
static bool
writers_done(writer *ws, unsigned n)
{
	for (unsigned j = 0; j < CALLERS; j++)
		if (__atomic_load_n(&ws[j].next, __ATOMIC_RELAXED) <= n)
			return false;
	return true;
}

static void
writes_keep_their_last_acknowledged_value_across_moves(void **state)
{
	static loop l;
	static writer ws[CALLERS];
	char node[64];
	size_t moves = 0;
	uint64_t epoch = 0;
	(void)state;

	memset(&l, 0, sizeof(l));
	l.cl = kv_tc_client(&tc, false, 20000);
	atomic_store(&l.active, CALLERS);
	for (unsigned j = 0; j < CALLERS; j++) {
		ws[j] = (writer){.l = &l, .j = j, .next = 1};
		writer_issue(&ws[j]);
	}
	/* Move the writers' keys back and forth while they write, and let every
	 * writer cover each of its keys a few times. */
	for (int rep = 0; rep < 4 || !writers_done(ws, 3 * PER); rep++) {
		if (rep > 40)
			fail_msg("the writers made no progress");
		shardkv_admin_result res = {0};
		kv_tc_node_arg(&tc, (rep + 1) % 2, node, sizeof(node));
		/* With replicas the old primary may be out of the ISR for a moment
		 * (copied again by the new one): the move is refused busy until
		 * it is back in sync. */
		int rv;
		uint64_t m0 = kv_test_now_ms();
		while ((rv = shardkv_move(l.cl, "m", 1, "n", 1, node, 0, SHARDKV_WAIT, &res)) ==
		           SHARDKV_EBUSY &&
		       kv_test_now_ms() - m0 < KV_TC_READY_MS)
			kv_test_sleep_ms(20);
		if (rv != 0) {
			atomic_store(&l.stop, true);
			kv_tc_dump_logs(&tc, 40);
			fail_msg("move %d: %s (%s)", rep, shardkv_strerror(rv), shardkv_errmsg());
		}
		/* A migration with one copy; with replicas a change of primary (a
		 * new epoch, no migration). */
		moves += res.nmigrations ? res.nmigrations : res.epoch > epoch && epoch != 0;
		epoch = res.epoch > epoch ? res.epoch : epoch;
		/* With replicas a move only hands the primary role over (no
		 * copy, so it returns at once): let every writer complete a write
		 * under the new primary before the next move. */
		unsigned after[CALLERS];
		for (unsigned j = 0; j < CALLERS; j++)
			after[j] = __atomic_load_n(&ws[j].next, __ATOMIC_RELAXED);
		unsigned behind = CALLERS;
		for (uint64_t t0 = kv_test_now_ms();
		     behind > 0 && atomic_load(&l.active) == (int)CALLERS &&
		     kv_test_now_ms() - t0 < KV_TC_READY_MS;
		     kv_test_sleep_ms(5)) {
			behind = 0;
			for (unsigned j = 0; j < CALLERS; j++)
				behind +=
				    __atomic_load_n(&ws[j].next, __ATOMIC_RELAXED) <= after[j];
		}
		if (behind > 0) {
			atomic_store(&l.stop, true);
			fail_msg("%u writers completed nothing within %u ms after move %d", behind,
			         KV_TC_READY_MS, rep);
		}
	}
	atomic_store(&l.stop, true);
	uint64_t deadline = kv_test_now_ms() + 30000;
	while (atomic_load(&l.active) > 0) {
		if (kv_test_now_ms() > deadline)
			fail_msg("%d writers never finished", atomic_load(&l.active));
		kv_test_sleep_ms(5);
	}
	if (atomic_load(&l.errors) != 0)
		fail_msg("%d async writes failed (last: %s)", atomic_load(&l.errors),
		         shardkv_strerror(atomic_load(&l.first_err)));
	KV_TC_ASSERT(&tc, moves >= 3, "the keys changed hands %zu times under the writers",
	             moves); /* they really changed hands */
	unsigned total = 0;
	for (unsigned j = 0; j < CALLERS; j++)
		total += ws[j].next - 1;
	assert_true(total >= CALLERS * PER);
	for (unsigned k = 0; k < CALLERS * PER; k++) {
		char key[32], want[32];
		size_t kl = kv_tc_key(key, sizeof(key), "m", k);
		int wl = snprintf(want, sizeof(want), "%u", l.acked[k]);
		shardkv_buf b;
		assert_int_equal(shardkv_get(l.cl, key, kl, &b), 0);
		if (b.len != (size_t)wl || memcmp(b.data, want, b.len) != 0)
			fail_msg("key %u reads '%.*s', last acknowledged '%s'", k, (int)b.len,
			         (const char *)b.data, want);
		shardkv_free(b.data);
	}
	shardkv_close(l.cl);
}

static atomic_int closed_calls, closed_bad;

static void
count_close(void *arg, int status, const void *val, size_t vlen)
{
	(void)arg;
	(void)val;
	(void)vlen;
	if (status != 0 && status != SHARDKV_ECLOSED && status != SHARDKV_ENOTFOUND)
		atomic_fetch_add(&closed_bad, 1);
	atomic_fetch_add(&closed_calls, 1);
}

static void
closing_completes_every_op_in_flight(void **state)
{
	enum { N = 3000 };
	char key[32];
	int taken = 0;
	(void)state;

	atomic_store(&closed_calls, 0);
	atomic_store(&closed_bad, 0);
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	for (unsigned i = 0; i < N; i++) {
		size_t kl = kv_tc_key(key, sizeof(key), "c", i);
		if (shardkv_put_async(cl, key, kl, "x", 1, count_close, NULL) == 0)
			taken++;
	}
	shardkv_close(cl);
	assert_int_equal(taken, N);
	assert_int_equal(atomic_load(&closed_calls), N);
	assert_int_equal(atomic_load(&closed_bad), 0);
}

/* A thread of blocking calls on a shared handle: put, get, append, get,
 * del of its own keys, checking every answer. */
typedef struct {
	shardkv_client *cl;
	unsigned id;
	atomic_int *bad;
} blocker;

static void *
blocker_main(void *arg)
{
	blocker *b = arg;
	char key[32], val[32], want[64];

	for (unsigned i = 0; i < 100; i++) {
		shardkv_buf v = {0};
		uint64_t len = 0;
		size_t kl = (size_t)snprintf(key, sizeof(key), "blk/%u/%03u", b->id, i);
		size_t vl = (size_t)snprintf(val, sizeof(val), "v%u.%u", b->id, i);
		int ok = shardkv_put(b->cl, key, kl, val, vl) == 0 &&
		         shardkv_get(b->cl, key, kl, &v) == 0 && v.len == vl &&
		         memcmp(v.data, val, vl) == 0;
		shardkv_free(v.data);
		v = (shardkv_buf){0};
		snprintf(want, sizeof(want), "%s+", val);
		ok = ok && shardkv_append(b->cl, key, kl, "+", 1, &len) == 0 && len == vl + 1 &&
		     shardkv_del(b->cl, key, kl, &v) == 0 && v.len == vl + 1 &&
		     memcmp(v.data, want, vl + 1) == 0;
		shardkv_free(v.data);
		v = (shardkv_buf){0};
		ok = ok && shardkv_get(b->cl, key, kl, &v) == SHARDKV_ENOTFOUND;
		if (!ok)
			atomic_fetch_add(b->bad, 1);
	}
	return NULL;
}

static atomic_int mixed_calls, mixed_bad;

static void
count_mixed(void *arg, int status, const void *val, size_t vlen)
{
	(void)arg;
	(void)val;
	(void)vlen;
	if (status != 0)
		atomic_fetch_add(&mixed_bad, 1);
	atomic_fetch_add(&mixed_calls, 1);
}

static void
blocking_and_async_ops_share_one_handle(void **state)
{
	enum { THREADS = 8, N = 2000 };
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	pthread_t th[THREADS];
	blocker b[THREADS];
	atomic_int bad = 0;
	char key[32];
	(void)state;

	assert_non_null(cl);
	atomic_store(&mixed_calls, 0);
	atomic_store(&mixed_bad, 0);
	for (unsigned i = 0; i < THREADS; i++) {
		b[i] = (blocker){.cl = cl, .id = i, .bad = &bad};
		assert_int_equal(pthread_create(&th[i], NULL, blocker_main, &b[i]), 0);
	}
	for (unsigned i = 0; i < N; i++) {
		size_t kl = kv_tc_key(key, sizeof(key), "mix/", i);
		assert_int_equal(shardkv_put_async(cl, key, kl, "m", 1, count_mixed, NULL), 0);
	}
	for (unsigned i = 0; i < THREADS; i++)
		pthread_join(th[i], NULL);
	uint64_t t0 = kv_test_now_ms();
	while (atomic_load(&mixed_calls) < N && kv_test_now_ms() - t0 < 20000)
		kv_test_sleep_ms(10);
	assert_int_equal(atomic_load(&mixed_calls), N);
	assert_int_equal(atomic_load(&mixed_bad), 0);
	assert_int_equal(atomic_load(&bad), 0);
	shardkv_close(cl);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(async_ops_complete_once_with_their_own_results),
	    cmocka_unit_test(async_puts_of_every_size_store_their_own_values),
	    cmocka_unit_test(async_incr_and_put_if_absent_in_batches_apply_once),
	    cmocka_unit_test(bad_arguments_are_refused_without_a_callback),
	    cmocka_unit_test(writes_keep_their_last_acknowledged_value_across_moves),
	    cmocka_unit_test(closing_completes_every_op_in_flight),
	    cmocka_unit_test(blocking_and_async_ops_share_one_handle),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
