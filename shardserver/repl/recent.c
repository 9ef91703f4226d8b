/*
 * recent.c - the spans of the records a backup applied last from one
 * primary (see recent.h and doc/replication.md "Reconciliation after a
 * transfer").
 */
#include "shardserver/repl/recent.h"

#include <stdlib.h>
#include <string.h>

/* A slot of 128 bytes, its keys one after the other: the lowest at key,
 * the highest at key + lolen, so that a record of short keys writes one
 * cache line. */
typedef struct {
	uint64_t lsn;
	uint8_t kind;  /* kv_dur_span_kind */
	bool hi_cut;   /* the highest key is the first KV_RECENT_KEY bytes of a longer one */
	uint8_t lolen; /* bytes kept */
	uint8_t hilen;
	uint8_t key[2 * KV_RECENT_KEY];
} rec;

_Static_assert(sizeof(rec) == 128, "a ring slot is two cache lines");

struct kv_recent {
	rec *v;         /* KV_RECENT_CAP entries, a ring */
	size_t next;    /* where the next record goes */
	size_t n;       /* entries held */
	bool known;     /* a record was added since the start or the last clear */
	uint64_t floor; /* every applied record above it is held */
	uint64_t last;  /* the highest lsn added */
};

kv_recent *
kv_recent_new(void)
{
	kv_recent *r = calloc(1, sizeof(*r));

	if (r == NULL)
		return NULL;
	/* Slots on cache-line boundaries (the size is a multiple of 64). */
	if ((r->v = aligned_alloc(64, KV_RECENT_CAP * sizeof(*r->v))) == NULL) {
		free(r);
		return NULL;
	}
	return r;
}

void
kv_recent_free(kv_recent *r)
{
	if (r == NULL)
		return;
	free(r->v);
	free(r);
}

void
kv_recent_clear(kv_recent *r)
{
	r->next = r->n = 0;
	r->known = false;
	r->floor = r->last = 0;
}

/* Keeps k, or its first KV_RECENT_KEY bytes: returns whether it cut. */
static bool
keep(uint8_t *dst, uint8_t *len, kv_bytes k)
{
	size_t n = k.len < KV_RECENT_KEY ? k.len : KV_RECENT_KEY;

	*len = (uint8_t)n;
	if (n > 0)
		memcpy(dst, k.p, n);
	return k.len > n;
}

void
kv_recent_add(kv_recent *r, uint64_t lsn, const kv_dur_span *sp)
{
	rec *e;

	if (r->known && lsn <= r->last)
		return;
	if (!r->known) {
		/* Records at or below lsn - 1 were applied before this ring knew
		 * of them, if at all. */
		r->known = true;
		r->floor = lsn - 1;
	}
	e = &r->v[r->next];
	if (r->n == KV_RECENT_CAP)
		r->floor = e->lsn; /* the oldest goes */
	else
		r->n++;
	r->next = (r->next + 1) % KV_RECENT_CAP;
	r->last = lsn;
	e->lsn = lsn;
	e->kind = (uint8_t)sp->kind;
	e->hi_cut = false;
	e->lolen = e->hilen = 0;
	if (sp->kind == KV_DUR_SPAN_KEYS || sp->kind == KV_DUR_SPAN_RANGE) {
		/* A cut lowest key is at least its first bytes, which is all
		 * the test on that side needs: only the highest's cut matters
		 * (may_touch). */
		(void)keep(e->key, &e->lolen, sp->lo);
		e->hi_cut = keep(e->key + e->lolen, &e->hilen, sp->hi);
	}
}

/* Whether record e may touch [start, end). A cut key is known only to
 * begin with the bytes kept: it is at least those bytes (enough for the
 * lowest key's test against the end), and it lies below start for sure only
 * when every longer key that begins with them does, that is when they sort
 * below start and start does not begin with them. */
static bool
may_touch(const rec *e, kv_bytes start, kv_bytes end)
{
	const uint8_t *lo = e->key, *hi = e->key + e->lolen;

	if (e->kind != KV_DUR_SPAN_KEYS && e->kind != KV_DUR_SPAN_RANGE)
		return true; /* no key known, or any key */
	/* Its lowest key must lie below the end ... */
	if (end.len > 0 && kv_key_cmp(lo, e->lolen, end.p, end.len) >= 0)
		return false;
	/* ... and its highest at or above the start: a key span [lo, hi], a
	 * range delete [lo, hi) (an empty hi: no bound). */
	if (e->hi_cut)
		return kv_key_cmp(hi, e->hilen, start.p, start.len) >= 0 ||
		       (start.len >= e->hilen && memcmp(start.p, hi, e->hilen) == 0);
	if (e->kind == KV_DUR_SPAN_KEYS)
		return kv_key_cmp(hi, e->hilen, start.p, start.len) >= 0;
	return e->hilen == 0 || kv_key_cmp(hi, e->hilen, start.p, start.len) > 0;
}

bool
kv_recent_touches(const kv_recent *r, uint64_t after, uint64_t upto, kv_bytes start, kv_bytes end)
{
	if (upto <= after)
		return false;
	if (!r->known || after < r->floor)
		return true;
	/* Newest first, down to the first record at or below after. */
	for (size_t k = 0; k < r->n; k++) {
		const rec *e = &r->v[(r->next + KV_RECENT_CAP - 1 - k) % KV_RECENT_CAP];
		if (e->lsn <= after)
			break;
		if (e->lsn <= upto && may_touch(e, start, end))
			return true;
	}
	return false;
}
