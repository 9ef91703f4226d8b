/*
 * test_client_multi.c - the asynchronous append, mget, mput and scan of
 * libshardkv and its scan cursor against real daemons (two servers, the
 * keys spread over both): an async append gives the new length; async
 * mget, mput and scan complete once with the blocking call's result, and
 * closing the handle waits for those in flight; many async mgets in flight
 * make no thread per call and each gets its own values; a scan cursor reads every
 * key of both servers in order, page by page, with resume keys it keeps
 * itself, and a limit bounds the whole iteration.
 */
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>

#define NKEYS 2000

static kv_tc tc;

static int
setup(void **state)
{
	(void)state;
	if (kv_tc_start(&tc, "client-multi", 2) != 0)
		return -1;
	/* Keys a000000 .. a001999 in two halves, one per server; the tests
	 * use keys between them. */
	const int idx[2] = {0, 1};
	return kv_tc_spread(&tc, "a", NKEYS, idx, 2);
}

static int
teardown(void **state)
{
	(void)state;
	kv_tc_destroy(&tc);
	return 0;
}

/* The outcome of one async multi-key op, and a wait for it. */
typedef struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int calls;
	int status;
	void *result;
} outcome;

static void
outcome_init(outcome *o)
{
	memset(o, 0, sizeof(*o));
	pthread_mutex_init(&o->mu, NULL);
	pthread_cond_init(&o->cv, NULL);
}

static void
outcome_set(outcome *o, int status, void *r)
{
	pthread_mutex_lock(&o->mu);
	o->calls++;
	o->status = status;
	o->result = r;
	pthread_cond_broadcast(&o->cv);
	pthread_mutex_unlock(&o->mu);
}

/* Waits for the callback (the test's own timeout bounds a hang). */
static void
outcome_wait(outcome *o)
{
	pthread_mutex_lock(&o->mu);
	while (o->calls == 0)
		pthread_cond_wait(&o->cv, &o->mu);
	pthread_mutex_unlock(&o->mu);
}

static void
on_mget(void *arg, int status, shardkv_mget_result *r)
{
	outcome_set(arg, status, r);
}

static void
on_mput(void *arg, int status, shardkv_mput_result *r)
{
	outcome_set(arg, status, r);
}

static void
on_scan(void *arg, int status, shardkv_scan_result *r)
{
	outcome_set(arg, status, r);
}

static void
on_append(void *arg, int status, const void *val, size_t vlen)
{
	outcome_set(arg, status, (void *)(uintptr_t)(val == NULL ? vlen + 1 : 0));
}

/* Whether a sorts before b, bytewise (a prefix first). */
static bool
bytes_less(const void *a, size_t alen, const void *b, size_t blen)
{
	int c = memcmp(a, b, alen < blen ? alen : blen);
	return c < 0 || (c == 0 && alen < blen);
}

/* Key i of prefix "a" with `tag` appended: it sorts right after key i, so
 * it lives on the server that holds key i. Returns its length. */
static size_t
tagged_key(char *buf, size_t len, unsigned i, const char *tag)
{
	size_t kl = kv_tc_key(buf, len, "a", i);
	snprintf(buf + kl, len - kl, "%s", tag);
	return kl + strlen(tag);
}

/* Whether key ends with tag. */
static bool
has_tag(const shardkv_buf *key, const char *tag)
{
	size_t tl = strlen(tag);
	return key->len >= tl && memcmp(key->data + key->len - tl, tag, tl) == 0;
}

static void
async_append_mget_mput_and_scan_give_the_blocking_results(void **state)
{
	enum { N = 200 };
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	static char keys_buf[N][32], vals_buf[N][32];
	shardkv_bytes keys[N + 1], vals[N];
	outcome o;
	(void)state;

	/* Keys between those setup spread over both servers. */
	for (unsigned i = 0; i < N; i++) {
		keys[i].len = tagged_key(keys_buf[i], sizeof(keys_buf[i]), i * (NKEYS / N), "-q");
		keys[i].data = keys_buf[i];
		vals[i].len = (size_t)snprintf(vals_buf[i], sizeof(vals_buf[i]), "qv-%u", i);
		vals[i].data = vals_buf[i];
	}
	keys[N] = (shardkv_bytes){"a-missing", 9};

	/* mput across both servers. */
	outcome_init(&o);
	assert_int_equal(shardkv_mput_async(cl, N, keys, N, vals, on_mput, &o), 0);
	outcome_wait(&o);
	assert_int_equal(o.calls, 1);
	assert_int_equal(o.status, 0);
	assert_non_null(o.result);
	assert_int_equal(((shardkv_mput_result *)o.result)->nfailed, 0);
	shardkv_mput_result_free(o.result);

	/* mget with one missing key: ENOTFOUND and every value in order. */
	outcome_init(&o);
	assert_int_equal(shardkv_mget_async(cl, N + 1, keys, on_mget, &o), 0);
	outcome_wait(&o);
	assert_int_equal(o.status, SHARDKV_ENOTFOUND);
	shardkv_mget_result *mr = o.result;
	assert_non_null(mr);
	assert_int_equal(mr->n, N + 1);
	assert_int_equal(mr->nmissing, 1);
	assert_int_equal(mr->missing[0], N);
	for (unsigned i = 0; i < N; i++) {
		assert_int_equal(mr->values[i].len, vals[i].len);
		assert_memory_equal(mr->values[i].data, vals[i].data, vals[i].len);
	}
	shardkv_mget_result_free(mr);

	/* scan of the prefix: every key, in order, across both servers. */
	outcome_init(&o);
	shardkv_scan_args sa = {.start = {keys[0].data, keys[0].len}, .end = {"b", 1}};
	assert_int_equal(shardkv_scan_async(cl, &sa, on_scan, &o), 0);
	outcome_wait(&o);
	assert_int_equal(o.status, 0);
	shardkv_scan_result *sr = o.result;
	size_t tagged = 0;
	for (size_t i = 0; i < sr->n; i++) {
		if (i > 0)
			assert_true(bytes_less(sr->entries[i - 1].key.data,
			                       sr->entries[i - 1].key.len, sr->entries[i].key.data,
			                       sr->entries[i].key.len));
		tagged += has_tag(&sr->entries[i].key, "-q");
	}
	assert_int_equal(tagged, N);
	shardkv_scan_result_free(sr);

	/* append: the new length, twice. */
	outcome_init(&o);
	assert_int_equal(shardkv_append_async(cl, "a-app", 5, "abc", 3, on_append, &o), 0);
	outcome_wait(&o);
	assert_int_equal(o.status, 0);
	assert_int_equal((uintptr_t)o.result, 3 + 1);
	outcome_init(&o);
	assert_int_equal(shardkv_append_async(cl, "a-app", 5, "de", 2, on_append, &o), 0);
	outcome_wait(&o);
	assert_int_equal((uintptr_t)o.result, 5 + 1);
	shardkv_buf b;
	assert_int_equal(shardkv_get(cl, "a-app", 5, &b), 0);
	assert_int_equal(b.len, 5);
	assert_memory_equal(b.data, "abcde", 5);
	shardkv_free(b.data);

	/* Closing with multi-key ops in flight waits for each callback. */
	outcome os[12];
	for (int i = 0; i < 12; i++) {
		outcome_init(&os[i]);
		if (i % 3 == 0)
			assert_int_equal(shardkv_mget_async(cl, N, keys, on_mget, &os[i]), 0);
		else if (i % 3 == 1)
			assert_int_equal(shardkv_mput_async(cl, N, keys, N, vals, on_mput, &os[i]),
			                 0);
		else
			assert_int_equal(shardkv_scan_async(cl, &sa, on_scan, &os[i]), 0);
	}
	shardkv_close(cl);
	for (int i = 0; i < 12; i++) {
		assert_int_equal(os[i].calls, 1);
		if (os[i].status != 0 && os[i].status != SHARDKV_ECLOSED)
			fail_msg("op %d in flight at close: %s", i, shardkv_strerror(os[i].status));
		if (i % 3 == 0)
			shardkv_mget_result_free(os[i].result);
		else if (i % 3 == 1)
			shardkv_mput_result_free(os[i].result);
		else
			shardkv_scan_result_free(os[i].result);
	}
}

/* The threads of this process (entries of /proc/self/task). */
static int
thread_count(void)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	int n = 0;

	assert_non_null(d);
	while ((e = readdir(d)) != NULL)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static void
many_async_mgets_in_flight_make_no_thread_per_call(void **state)
{
	enum { N = 100, OPS = 64, M = 400 };
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	static char base_buf[M][32];
	static shardkv_bytes base[M];
	static shardkv_bytes keys[OPS][N];
	static outcome os[OPS];
	shardkv_mget_result *r;
	shardkv_mput_result *pr = NULL;
	(void)state;

	/* M keys over both servers, each its own value; op k reads a slice. */
	for (unsigned i = 0; i < M; i++) {
		base[i].len = tagged_key(base_buf[i], sizeof(base_buf[i]), i * (NKEYS / M), "-t");
		base[i].data = base_buf[i];
	}
	assert_int_equal(shardkv_mput(cl, M, base, M, base, &pr), 0);
	shardkv_mput_result_free(pr);
	for (unsigned k = 0; k < OPS; k++)
		for (unsigned i = 0; i < N; i++)
			keys[k][i] = base[(k * 7 + i * 3) % M];
	/* A first blocking call makes the handle's connections and threads. */
	assert_int_equal(shardkv_mget(cl, N, keys[0], &r), 0);
	shardkv_mget_result_free(r);
	int before = thread_count();
	for (unsigned k = 0; k < OPS; k++) {
		outcome_init(&os[k]);
		assert_int_equal(shardkv_mget_async(cl, N, keys[k], on_mget, &os[k]), 0);
	}
	int during = thread_count();
	/* The old form ran a thread per call; at most the retry thread may
	 * start now (a part refused by a busy server). */
	if (during > before + 1)
		fail_msg("%d threads before %d async mgets, %d after submitting them", before, OPS,
		         during);
	for (unsigned k = 0; k < OPS; k++) {
		outcome_wait(&os[k]);
		assert_int_equal(os[k].calls, 1);
		assert_int_equal(os[k].status, 0);
		r = os[k].result;
		assert_non_null(r);
		assert_int_equal(r->n, N);
		for (unsigned i = 0; i < N; i++) {
			assert_int_equal(r->values[i].len, keys[k][i].len);
			assert_memory_equal(r->values[i].data, keys[k][i].data, keys[k][i].len);
		}
		shardkv_mget_result_free(r);
	}
	assert_true(thread_count() <= before + 1);
	shardkv_close(cl);
}

static void
scan_cursor_reads_every_key_in_order_page_by_page(void **state)
{
	enum { N = 300 };
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	char key[32];
	(void)state;

	/* Keys between those setup spread over both servers. */
	for (unsigned i = 0; i < N; i++) {
		size_t kl = tagged_key(key, sizeof(key), i * (NKEYS / N), "-s");
		assert_int_equal(shardkv_put(cl, key, kl, key, kl), 0);
	}
	/* Pages of 7 cross the servers' boundary; limit 0 reads all. */
	shardkv_scan_args a = {.prefix = {"a0", 2}};
	shardkv_scan_iter *it;
	const shardkv_entry *e;
	char last[32] = "";
	size_t lastlen = 0, n = 0;
	int rv;
	assert_int_equal(shardkv_scan_iter_new(cl, &a, 7, &it), 0);
	while ((rv = shardkv_scan_iter_next(it, &e)) == 0) {
		assert_true(e->key.len < sizeof(last));
		assert_true(lastlen == 0 || bytes_less(last, lastlen, e->key.data, e->key.len));
		memcpy(last, e->key.data, e->key.len);
		lastlen = e->key.len;
		if (!has_tag(&e->key, "-s"))
			continue;
		assert_int_equal(e->value.len, e->key.len);
		assert_memory_equal(e->value.data, e->key.data, e->key.len);
		n++;
	}
	assert_int_equal(rv, 1);
	assert_int_equal(n, N);
	assert_int_equal(shardkv_scan_iter_next(it, &e), 1); /* stays at the end */
	shardkv_scan_iter_free(it);

	/* A limit bounds the whole iteration, keys only leaves values empty. */
	a.limit = 10;
	a.keys_only = true;
	assert_int_equal(shardkv_scan_iter_new(cl, &a, 3, &it), 0);
	n = 0;
	while ((rv = shardkv_scan_iter_next(it, &e)) == 0) {
		assert_int_equal(e->value.len, 0);
		n++;
	}
	assert_int_equal(rv, 1);
	assert_int_equal(n, 10);
	shardkv_scan_iter_free(it);
	shardkv_close(cl);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(async_append_mget_mput_and_scan_give_the_blocking_results),
	    cmocka_unit_test(many_async_mgets_in_flight_make_no_thread_per_call),
	    cmocka_unit_test(scan_cursor_reads_every_key_in_order_page_by_page),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
