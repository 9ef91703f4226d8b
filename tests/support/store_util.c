/*
 * store_util.c - fixtures and helpers shared by the store test programs
 * (see store_util.h).
 */
#include "tests/support/store_util.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const store_cfg store_cfgs[] = {
    {"striped, 1 partition", KV_STORE_STRIPED, 1, 1},
    {"striped, 64 partitions", KV_STORE_STRIPED, 64, 256},
    {"percore, 1 partition", KV_STORE_PERCORE, 1, 1},
    {"percore, 4 partitions", KV_STORE_PERCORE, 4, 32},
};
const size_t store_ncfgs = sizeof store_cfgs / sizeof store_cfgs[0];

static kv_store *
open_store(kv_store_mode mode, unsigned partitions, size_t max_key, size_t max_value,
           size_t mem_limit)
{
	kv_store_opts o;
	kv_store *s = NULL;
	int rv;

	kv_store_opts_init(&o);
	o.mode = mode;
	o.partitions = partitions;
	o.max_key = max_key;
	o.max_value = max_value;
	o.mem_limit = mem_limit;
	rv = kv_store_create(&o, &s);
	if (rv != KV_OK) {
		print_error("kv_store_create(mode %d, %u partitions, mem_limit %zu): %s\n",
		            (int)mode, partitions, mem_limit, kv_errname(rv));
		return NULL;
	}
	return s;
}

int
store_fixture_setup(void **state)
{
	const store_cfg *cfg = *state;
	store_fixture *fx = xcalloc(1, sizeof *fx);

	fx->cfg = cfg;
	fx->s = open_store(cfg->mode, cfg->partitions, 0, 0, 0);
	if (fx->s == NULL) {
		free(fx);
		return -1;
	}
	*state = fx;
	return 0;
}

int
store_fixture_teardown(void **state)
{
	store_fixture *fx = *state;

	kv_store_destroy(fx->s);
	for (size_t i = 0; i < STORE_FIXTURE_EXTRA; i++)
		kv_store_destroy(fx->extra[i]);
	free(fx);
	return 0;
}

kv_store *
store_open_extra(store_fixture *fx, unsigned partitions, size_t max_key, size_t max_value,
                 size_t mem_limit)
{
	size_t i = 0;

	while (i < STORE_FIXTURE_EXTRA && fx->extra[i] != NULL)
		i++;
	assert_true(i < STORE_FIXTURE_EXTRA);
	fx->extra[i] = open_store(fx->cfg->mode, partitions ? partitions : fx->cfg->partitions,
	                          max_key, max_value, mem_limit);
	assert_non_null(fx->extra[i]);
	return fx->extra[i];
}

int
run_store_groups(const char *program, const store_test *tests, size_t ntests, const store_cfg *cfgs,
                 size_t ncfgs)
{
	struct CMUnitTest *group = xcalloc(ntests, sizeof *group);
	int failed = 0;

	for (size_t c = 0; c < ncfgs; c++) {
		for (size_t i = 0; i < ntests; i++) {
			group[i] = (struct CMUnitTest){
			    .name = tests[i].name,
			    .test_func = tests[i].fn,
			    .setup_func = store_fixture_setup,
			    .teardown_func = store_fixture_teardown,
			    .initial_state = (void *)&cfgs[c],
			};
		}
		print_message("[ CONFIG   ] %s: %s\n", program, cfgs[c].name);
		failed += _cmocka_run_group_tests(cfgs[c].name, group, ntests, NULL, NULL);
	}
	free(group);
	return failed;
}

size_t
fmt_key(char *buf, size_t cap, const char *prefix, size_t i)
{
	int n = snprintf(buf, cap, "%s%06zu", prefix, i);

	if (n <= 0 || (size_t)n >= cap)
		abort();
	return (size_t)n;
}

void
put_s(kv_store *s, const char *key, const char *val)
{
	assert_int_equal(kv_store_put(s, key, strlen(key), val, strlen(val)), KV_OK);
}

void
assert_value(kv_store *s, const void *key, size_t klen, const void *val, size_t vlen)
{
	kv_buf v = {0};

	assert_int_equal(kv_store_get(s, key, klen, &v), KV_OK);
	assert_int_equal(v.len, vlen);
	if (vlen > 0)
		assert_memory_equal(v.data, val, vlen);
	kv_buf_fini(&v);
}

void
assert_value_s(kv_store *s, const char *key, const char *val)
{
	assert_value(s, key, strlen(key), val, strlen(val));
}

void
assert_absent(kv_store *s, const void *key, size_t klen)
{
	kv_buf v = {0};

	assert_int_equal(kv_store_get(s, key, klen, &v), KV_ENOTFOUND);
	assert_null(v.data);
	assert_int_equal(v.len, 0);
}

void
assert_absent_s(kv_store *s, const char *key)
{
	assert_absent(s, key, strlen(key));
}

kv_store_stats
stats_of(kv_store *s)
{
	kv_store_stats st;

	memset(&st, 0xa5, sizeof st);
	kv_store_get_stats(s, &st);
	return st;
}

int
entry_list_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	entry_list *l = arg;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		kv_buf *keys = realloc(l->keys, cap * sizeof *keys);
		kv_buf *vals = keys ? realloc(l->vals, cap * sizeof *vals) : NULL;
		bool *set = vals ? realloc(l->val_set, cap * sizeof *set) : NULL;

		if (set == NULL)
			abort();
		l->keys = keys;
		l->vals = vals;
		l->val_set = set;
		memset(keys + l->cap, 0, (cap - l->cap) * sizeof *keys);
		memset(vals + l->cap, 0, (cap - l->cap) * sizeof *vals);
		l->cap = cap;
	}
	if (kv_buf_set(&l->keys[l->n], key, klen) != KV_OK)
		abort();
	l->vals[l->n].len = 0;
	l->val_set[l->n] = val != NULL;
	if (val != NULL && kv_buf_set(&l->vals[l->n], val, vlen) != KV_OK)
		abort();
	l->n++;
	return l->stop_after != 0 && l->n >= l->stop_after;
}

void
entry_list_fini(entry_list *l)
{
	for (size_t i = 0; i < l->cap; i++) {
		kv_buf_fini(&l->keys[i]);
		kv_buf_fini(&l->vals[i]);
	}
	free(l->keys);
	free(l->vals);
	free(l->val_set);
	memset(l, 0, sizeof *l);
}

void
scan_all(kv_store *s, const void *start, size_t slen, const void *end, size_t elen, entry_list *out)
{
	bool more = true;

	entry_list_fini(out);
	assert_int_equal(
	    kv_store_scan(s, start, slen, end, elen, 0, true, entry_list_cb, out, &more), KV_OK);
	assert_false(more);
}

bool
entry_key_is(const entry_list *l, size_t i, const void *key, size_t klen)
{
	return i < l->n && kv_key_cmp(l->keys[i].data, l->keys[i].len, key, klen) == 0;
}

void
race_log_init(race_log *r)
{
	pthread_mutex_init(&r->mu, NULL);
	r->first[0] = 0;
	atomic_init(&r->count, 0);
}

void
race_fail(race_log *r, const char *fmt, ...)
{
	va_list ap;

	if (atomic_fetch_add(&r->count, 1) != 0)
		return;
	pthread_mutex_lock(&r->mu);
	va_start(ap, fmt);
	vsnprintf(r->first, sizeof r->first, fmt, ap);
	va_end(ap);
	pthread_mutex_unlock(&r->mu);
}

void
race_log_check(race_log *r)
{
	int n = atomic_load(&r->count);

	pthread_mutex_destroy(&r->mu);
	if (n != 0)
		fail_msg("%d failure(s) in worker threads; first: %s", n, r->first);
}

void
run_threads(size_t n, void *(*fn)(void *), void *args, size_t stride)
{
	pthread_t *t = xcalloc(n, sizeof *t);
	size_t started = 0;
	int rv = 0;

	for (; started < n; started++) {
		rv = pthread_create(&t[started], NULL, fn, (char *)args + started * stride);
		if (rv != 0)
			break;
	}
	for (size_t i = 0; i < started; i++)
		pthread_join(t[i], NULL);
	free(t);
	assert_int_equal(rv, 0);
}

void
assert_stats_match_scan(kv_store *s)
{
	entry_list l = {0};
	uint64_t bytes = 0;
	kv_store_stats st = stats_of(s);

	scan_all(s, NULL, 0, NULL, 0, &l);
	for (size_t i = 0; i < l.n; i++)
		bytes += l.keys[i].len + l.vals[i].len;
	assert_int_equal(st.keys, l.n);
	assert_int_equal(st.bytes, bytes);
	entry_list_fini(&l);
}

int
bytes_cmp(const void *a, const void *b)
{
	const kv_bytes *x = a, *y = b;

	return kv_key_cmp(x->p, x->len, y->p, y->len);
}

void *
xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (p == NULL)
		abort();
	return p;
}

void *
xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);

	if (p == NULL)
		abort();
	return p;
}
