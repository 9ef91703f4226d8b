/*
 * test_store_model.c - the store against a naive reference model: random
 * puts, deletes, gets, appends and bounded scans over small key alphabets
 * (many keys are prefixes of others, many share long prefixes), in both
 * modes and several partition counts. Every answer must equal the model's.
 */
#include "common/err.h"
#include "shardserver/store/store.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define MODEL_MAX_KEY     24
#define MODEL_MAX_ENTRIES 20000

typedef struct {
	uint8_t k[MODEL_MAX_KEY]; /* key bytes */
	size_t kl;                /* key length */
	uint8_t v[64];            /* value bytes */
	size_t vl;                /* value length */
	bool live;                /* present in the model */
} model_ent;

typedef struct {
	model_ent ents[MODEL_MAX_ENTRIES]; /* every key ever used */
	int n;                             /* entries in use */
	model_ent got[MODEL_MAX_ENTRIES];  /* what a scan returned */
	int ngot;                          /* entries in got */
	uint64_t rng;                      /* xorshift state */
	bool long_keys;                    /* shape: long shared prefixes */
} model;

static uint64_t
rnd(model *m)
{
	m->rng ^= m->rng << 13;
	m->rng ^= m->rng >> 7;
	m->rng ^= m->rng << 17;
	return m->rng;
}

static void
gen_key(model *m, uint8_t *k, size_t *kl)
{
	static const uint8_t small[] = {0x00, 0x01, 0x02, 0x41, 0xff};

	if (m->long_keys) {
		*kl = 1 + rnd(m) % MODEL_MAX_KEY;
		for (size_t i = 0; i < *kl; i++)
			k[i] = (i < 12 && rnd(m) % 8) ? 0x41 : (uint8_t)(0x41 + rnd(m) % 2);
	} else {
		*kl = 1 + rnd(m) % 6;
		for (size_t i = 0; i < *kl; i++)
			k[i] = small[rnd(m) % 5];
	}
}

static model_ent *
find(model *m, const uint8_t *k, size_t kl)
{
	for (int i = 0; i < m->n; i++)
		if (m->ents[i].kl == kl && memcmp(m->ents[i].k, k, kl) == 0)
			return &m->ents[i];
	return NULL;
}

static model_ent *
add(model *m, const uint8_t *k, size_t kl)
{
	model_ent *e = find(m, k, kl);

	if (e == NULL) {
		assert_true(m->n < MODEL_MAX_ENTRIES);
		e = &m->ents[m->n++];
		memcpy(e->k, k, kl);
		e->kl = kl;
		e->live = false;
	}
	return e;
}

static int
cmp_ent(const void *a, const void *b)
{
	const model_ent *x = a, *y = b;
	return kv_key_cmp(x->k, x->kl, y->k, y->kl);
}

static int
collect_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	model *m = arg;
	model_ent *e = &m->got[m->ngot++];

	memcpy(e->k, key, klen);
	e->kl = klen;
	e->vl = vlen;
	if (val)
		memcpy(e->v, val, vlen);
	return 0;
}

static void
check_scan(model *m, kv_store *s)
{
	static model_ent want[MODEL_MAX_ENTRIES];
	uint8_t st[MODEL_MAX_KEY], en[MODEL_MAX_KEY];
	size_t sl, el, lim;
	int nw = 0, expect;
	bool more;

	gen_key(m, st, &sl);
	gen_key(m, en, &el);
	if (rnd(m) % 4 == 0)
		el = 0;
	if (rnd(m) % 5 == 0)
		sl = 0;
	lim = rnd(m) % 3 == 0 ? rnd(m) % 10 : 0;
	m->ngot = 0;
	assert_int_equal(kv_store_scan(s, st, sl, en, el, lim, true, collect_cb, m, &more), KV_OK);
	for (int i = 0; i < m->n; i++)
		if (m->ents[i].live &&
		    kv_range_contains(st, sl, en, el, m->ents[i].k, m->ents[i].kl))
			want[nw++] = m->ents[i];
	qsort(want, (size_t)nw, sizeof(want[0]), cmp_ent);
	expect = lim && (size_t)nw > lim ? (int)lim : nw;
	assert_int_equal(m->ngot, expect);
	for (int i = 0; i < expect; i++) {
		assert_int_equal(m->got[i].kl, want[i].kl);
		assert_memory_equal(m->got[i].k, want[i].k, want[i].kl);
		assert_int_equal(m->got[i].vl, want[i].vl);
		if (want[i].vl)
			assert_memory_equal(m->got[i].v, want[i].v, want[i].vl);
	}
	assert_int_equal(more, lim != 0 && (size_t)nw > lim);
}

static void
run_model(kv_store_mode mode, unsigned partitions, bool long_keys, int iterations)
{
	model *m = calloc(1, sizeof(*m));
	kv_store_opts o;
	kv_store *s;
	kv_buf b = {0};
	kv_store_stats st;
	uint64_t live = 0, bytes = 0;

	assert_non_null(m);
	m->rng = 88172645463325252ull ^ (uint64_t)partitions ^ ((uint64_t)long_keys << 40);
	m->long_keys = long_keys;
	kv_store_opts_init(&o);
	o.mode = mode;
	o.partitions = partitions;
	assert_int_equal(kv_store_create(&o, &s), KV_OK);
	for (int it = 0; it < iterations; it++) {
		uint8_t k[MODEL_MAX_KEY], v[64];
		size_t kl, vl = rnd(m) % 20, nl;
		int op = (int)(rnd(m) % 10), r;
		model_ent *e;

		gen_key(m, k, &kl);
		for (size_t i = 0; i < vl; i++)
			v[i] = (uint8_t)rnd(m);
		e = find(m, k, kl);
		if (op < 4) {
			assert_int_equal(kv_store_put(s, k, kl, v, vl), KV_OK);
			e = add(m, k, kl);
			memcpy(e->v, v, vl);
			e->vl = vl;
			e->live = true;
		} else if (op < 6) {
			r = kv_store_del(s, k, kl, &b);
			if (e && e->live) {
				assert_int_equal(r, KV_OK);
				assert_int_equal(b.len, e->vl);
				if (e->vl)
					assert_memory_equal(b.data, e->v, e->vl);
				e->live = false;
			} else {
				assert_int_equal(r, KV_ENOTFOUND);
			}
		} else if (op < 8) {
			r = kv_store_get(s, k, kl, &b);
			if (e && e->live) {
				assert_int_equal(r, KV_OK);
				assert_int_equal(b.len, e->vl);
				if (e->vl)
					assert_memory_equal(b.data, e->v, e->vl);
			} else {
				assert_int_equal(r, KV_ENOTFOUND);
			}
		} else if (op < 9) {
			size_t al = rnd(m) % 5;
			if (e && e->live && e->vl + al > 60)
				al = 0;
			assert_int_equal(kv_store_append(s, k, kl, v, al, &nl), KV_OK);
			e = add(m, k, kl);
			if (!e->live) {
				e->vl = 0;
				e->live = true;
			}
			memcpy(e->v + e->vl, v, al);
			e->vl += al;
			assert_int_equal(nl, e->vl);
		} else {
			check_scan(m, s);
		}
	}
	kv_store_get_stats(s, &st);
	for (int i = 0; i < m->n; i++) {
		if (m->ents[i].live) {
			live++;
			bytes += m->ents[i].kl + m->ents[i].vl;
		}
	}
	assert_int_equal(st.keys, live);
	assert_int_equal(st.bytes, bytes);
	kv_buf_fini(&b);
	kv_store_destroy(s);
	free(m);
}

static void
striped_store_matches_the_model_with_one_partition(void **state)
{
	(void)state;
	run_model(KV_STORE_STRIPED, 1, false, 50000);
	run_model(KV_STORE_STRIPED, 1, true, 10000);
}

static void
striped_store_matches_the_model_with_many_partitions(void **state)
{
	(void)state;
	run_model(KV_STORE_STRIPED, 64, false, 50000);
	run_model(KV_STORE_STRIPED, 4, true, 10000);
}

static void
percore_store_matches_the_model(void **state)
{
	(void)state;
	run_model(KV_STORE_PERCORE, 2, false, 30000);
	run_model(KV_STORE_PERCORE, 2, true, 10000);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(striped_store_matches_the_model_with_one_partition),
	    cmocka_unit_test(striped_store_matches_the_model_with_many_partitions),
	    cmocka_unit_test(percore_store_matches_the_model),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
