/*
 * fuzz_dur_record.c - the shard server's log record replay (durable.c,
 * through kv_dur_replay_record_for_test): the payloads of write-ahead log
 * records applied to a fresh store and exactly-once table, as recovery
 * applies them after a restart.
 *
 * Input: records back to back, each a 2-byte little-endian length and that
 * many bytes (the last one takes whatever is left).
 *
 * Checks: when every record is accepted, the record must parse completely
 * by the format of durable.c (a second, independent reader here), and the
 * store must then hold exactly what a model of the records (a plain list
 * of keys and values) holds, in key order; replaying every record a second
 * time over that state must be accepted and change nothing.
 */
#include "common/bytes.h"
#include "common/err.h"
#include "common/key.h"
#include "fuzz/fuzz_util.h"
#include "shardserver/dedup/dedup.h"
#include "shardserver/durable/durable.h"
#include "shardserver/store/store.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { REC_PUT = 1, REC_DEL = 2, REC_MPUT = 3, REC_RANGE_DEL = 4, REC_DEDUP = 5, REC_MDEL = 6 };

/* The store's expiry clock, fixed (Unix ms): a key whose deadline is at or
 * before it is absent, after it present, whatever the machine's time. */
#define NOW_MS 1700000000000ull

static uint64_t
fixed_clock(void *arg)
{
	(void)arg;
	return NOW_MS;
}

/* The model: unsorted key/value pairs. */
typedef struct {
	kv_buf k, v;
} pair;

typedef struct {
	pair *e;
	size_t n, cap;
} model;

static long
m_find(const model *m, kv_bytes k)
{
	for (size_t i = 0; i < m->n; i++)
		if (kv_key_cmp(m->e[i].k.data, m->e[i].k.len, k.p, k.len) == 0)
			return (long)i;
	return -1;
}

static void
m_remove(model *m, size_t i)
{
	kv_buf_fini(&m->e[i].k);
	kv_buf_fini(&m->e[i].v);
	m->e[i] = m->e[m->n - 1];
	m->n--;
}

static void
m_put(model *m, kv_bytes k, kv_bytes v)
{
	long i = m_find(m, k);

	if (i < 0) {
		if (m->n == m->cap) {
			m->cap = m->cap ? 2 * m->cap : 16;
			FZ_CHECK((m->e = realloc(m->e, m->cap * sizeof(pair))) != NULL);
		}
		i = (long)m->n++;
		memset(&m->e[i], 0, sizeof(pair));
		FZ_CHECK(kv_buf_set(&m->e[i].k, k.p, k.len) == KV_OK);
	}
	FZ_CHECK(kv_buf_set(&m->e[i].v, v.len ? v.p : (const uint8_t *)"", v.len) == KV_OK);
}

static void
m_del(model *m, kv_bytes k)
{
	long i = m_find(m, k);
	if (i >= 0)
		m_remove(m, (size_t)i);
}

static void
m_range_del(model *m, kv_bytes s, kv_bytes e)
{
	for (size_t i = m->n; i > 0; i--)
		if (kv_range_contains(s.p, s.len, e.p, e.len, m->e[i - 1].k.data,
		                      m->e[i - 1].k.len))
			m_remove(m, i - 1);
}

static void
m_fini(model *m)
{
	for (size_t i = 0; i < m->n; i++) {
		kv_buf_fini(&m->e[i].k);
		kv_buf_fini(&m->e[i].v);
	}
	free(m->e);
}

static int
m_cmp(const void *a, const void *b)
{
	const pair *x = a, *y = b;
	return kv_key_cmp(x->k.data, x->k.len, y->k.data, y->k.len);
}

/* A strict reader of an accepted record: running out of bytes is a bug of
 * the replay, which accepted it. */
typedef struct {
	const uint8_t *p;
	size_t n;
} rd;

static uint32_t
rd32(rd *r)
{
	FZ_CHECK(r->n >= 4);
	uint32_t v = kv_get32(r->p);
	r->p += 4;
	r->n -= 4;
	return v;
}

static kv_bytes
rdbytes(rd *r)
{
	uint32_t len = rd32(r);
	kv_bytes b = {r->p, len};
	FZ_CHECK(len <= r->n);
	r->p += len;
	r->n -= len;
	return b;
}

/* Applies an accepted record to the model. */
static void
model_apply(model *m, const uint8_t *p, size_t n)
{
	rd r = {p, n};

	uint64_t at = 0;

	FZ_CHECK(n >= 2);
	r.p += 2;
	r.n -= 2;
	if (p[1] & 1) {
		FZ_CHECK(r.n >= 32);
		r.p += 32;
		r.n -= 32;
	}
	if (p[1] & 4) { /* PUT, MPUT: the deadline (Unix ms) */
		FZ_CHECK(p[0] == REC_PUT || p[0] == REC_MPUT);
		FZ_CHECK(r.n >= 8);
		at = kv_get64(r.p);
		r.p += 8;
		r.n -= 8;
	}
	bool gone = at != 0 && at <= NOW_MS; /* written already expired: absent */
	switch (p[0]) {
	case REC_PUT: {
		kv_bytes k = rdbytes(&r), v = rdbytes(&r);
		FZ_CHECK(k.len > 0);
		if (gone)
			m_del(m, k);
		else
			m_put(m, k, v);
		break;
	}
	case REC_DEL: {
		kv_bytes k = rdbytes(&r);
		FZ_CHECK(k.len > 0);
		if (p[1] & 2) /* the value the delete returned, for the dedup memory */
			(void)rdbytes(&r);
		m_del(m, k);
		break;
	}
	case REC_MPUT: {
		uint32_t cnt = rd32(&r);
		FZ_CHECK(cnt > 0);
		for (uint32_t i = 0; i < cnt; i++) {
			kv_bytes k = rdbytes(&r), v = rdbytes(&r);
			FZ_CHECK(k.len > 0);
			if (gone)
				m_del(m, k);
			else
				m_put(m, k, v);
		}
		break;
	}
	case REC_MDEL: { /* delrange's step: an anchor, then the keys it deleted */
		(void)rdbytes(&r);
		uint32_t cnt = rd32(&r);
		for (uint32_t i = 0; i < cnt; i++) {
			kv_bytes k = rdbytes(&r);
			FZ_CHECK(k.len > 0);
			m_del(m, k);
		}
		if (p[1] & 2)
			(void)rdbytes(&r);
		break;
	}
	case REC_RANGE_DEL: {
		kv_bytes s = rdbytes(&r), e = rdbytes(&r);
		m_range_del(m, s, e);
		break;
	}
	case REC_DEDUP:
		FZ_CHECK(p[1] & 1);
		(void)rd32(&r);
		(void)rdbytes(&r);
		if (p[1] & 2)
			(void)rdbytes(&r);
		break;
	default:
		FZ_CHECK(!"replay accepted an unknown record type");
	}
	FZ_CHECK(r.n == 0);
}

typedef struct {
	const model *m;
	size_t i;
} cmp_ctx;

static int
visit(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	cmp_ctx *c = arg;
	const model *m = c->m;

	FZ_CHECK(c->i < m->n);
	FZ_CHECK(kv_key_cmp(key, klen, m->e[c->i].k.data, m->e[c->i].k.len) == 0);
	FZ_CHECK(vlen == m->e[c->i].v.len &&
	         (vlen == 0 || memcmp(val, m->e[c->i].v.data, vlen) == 0));
	c->i++;
	return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kv_store_opts o;
	kv_store *s = NULL;
	kv_dedup *d;
	model m = {0};
	int ok = 1;

	kv_store_opts_init(&o);
	o.partitions = 4;
	o.clock = fixed_clock;
	FZ_CHECK(kv_store_create(&o, &s) == KV_OK);
	FZ_CHECK((d = kv_dedup_create(8, 64, 0)) != NULL);
	/* Twice: records are blind writes, so replaying them again over their
	 * own result (a fuzzy snapshot holds some of them) changes nothing. */
	for (int pass = 0; pass < 2 && ok; pass++) {
		for (size_t pos = 0; pos + 2 <= size;) {
			size_t n = kv_get16(data + pos);
			pos += 2;
			if (n > size - pos)
				n = size - pos;
			/* A copy of exactly the record's bytes, so ASan sees an overread. */
			uint8_t *rec = malloc(n ? n : 1);
			FZ_CHECK(rec != NULL);
			memcpy(rec, data + pos, n);
			pos += n;
			int rv = kv_dur_replay_record_for_test(s, d, rec, n);
			FZ_CHECK(pass == 0 || rv == KV_OK);
			if (rv == KV_OK && pass == 0)
				model_apply(&m, rec, n);
			free(rec);
			if (rv != KV_OK) {
				ok = 0; /* recovery stops at the first refused record */
				break;
			}
		}
		if (ok) {
			cmp_ctx c = {&m, 0};
			bool more = false;
			if (pass == 0 && m.n > 1)
				qsort(m.e, m.n, sizeof(pair), m_cmp);
			FZ_CHECK(kv_store_scan(s, "", 0, "", 0, 0, true, visit, &c, &more) ==
			         KV_OK);
			FZ_CHECK(c.i == m.n && !more);
		}
	}
	m_fini(&m);
	kv_dedup_destroy(d);
	kv_store_destroy(s);
	return 0;
}
