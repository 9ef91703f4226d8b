/*
 * recent.c - the spans of the records a backup applied last from one
 * primary (see recent.h and doc/replication.md "Reconciliation after a
 * transfer").
 */
#include "shardserver/repl/recent.h"

#include <stdlib.h>
#include <string.h>

/* A key longer than a slot keeps is also written whole, up to
 * WHOLE_MAX bytes, into a byte ring of KB_CAP bytes (made when the first
 * comes), where it stays until KB_CAP more bytes of such keys came after
 * it; until then it is compared whole, after that by the bytes its slot
 * kept. */
#define KB_CAP    (1u << 20)
#define WHOLE_MAX 1024u
#define NOT_HELD  0xffffu /* rec.lofull, hifull: longer than kept, not in kb */

/* A slot of 128 bytes, its keys one after the other: the lowest at key,
 * the highest at key + lolen, so that a record of short keys writes one
 * cache line. */
typedef struct {
	uint64_t lsn;
	uint8_t kind;  /* kv_dur_span_kind */
	uint8_t lolen; /* bytes kept; the key is longer when lofull > lolen */
	uint8_t hilen; /* ... */
	uint8_t pad;
	uint16_t lofull; /* the keys' lengths: the bytes kept, or a longer key's */
	uint16_t hifull; /* whole in kb, or NOT_HELD (longer than WHOLE_MAX, no kb) */
	uint32_t lopos;  /* where their bytes begin in kb (positions count every byte */
	uint32_t hipos;  /* written to it, modulo 2^32) */
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
	uint8_t *kb;    /* KB_CAP bytes of long keys, or NULL (none yet, or no memory) */
	uint32_t kbpos; /* bytes written to kb, modulo 2^32 (a slot's record is
	                 * at most KV_RECENT_CAP records of two keys of WHOLE_MAX
	                 * bytes old, 16 MiB: its distance never wraps) */
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
	free(r->kb);
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

/* Keeps k's first KV_RECENT_KEY bytes at dst, and a longer key of at most
 * WHOLE_MAX bytes whole in kb (when kb can be had): sets *len, *full and
 * *pos. */
static void
keep(kv_recent *r, uint8_t *dst, uint8_t *len, uint16_t *full, uint32_t *pos, kv_bytes k)
{
	size_t n = k.len < KV_RECENT_KEY ? k.len : KV_RECENT_KEY;

	*len = (uint8_t)n;
	*full = (uint16_t)n;
	if (n > 0)
		memcpy(dst, k.p, n);
	if (k.len <= n)
		return;
	*full = NOT_HELD; /* the bytes kept bound it */
	if (k.len > WHOLE_MAX || (r->kb == NULL && (r->kb = malloc(KB_CAP)) == NULL))
		return;
	size_t off = r->kbpos % KB_CAP, first = KB_CAP - off; /* bytes before kb's end */
	if (first >= k.len) {
		memcpy(r->kb + off, k.p, k.len);
	} else {
		memcpy(r->kb + off, k.p, first);
		memcpy(r->kb, k.p + first, k.len - first);
	}
	*full = (uint16_t)k.len;
	*pos = r->kbpos;
	r->kbpos += (uint32_t)k.len;
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
	e->lolen = e->hilen = 0;
	e->lofull = e->hifull = 0;
	if (sp->kind == KV_DUR_SPAN_KEYS || sp->kind == KV_DUR_SPAN_RANGE) {
		keep(r, e->key, &e->lolen, &e->lofull, &e->lopos, sp->lo);
		keep(r, e->key + e->lolen, &e->hilen, &e->hifull, &e->hipos, sp->hi);
	}
}

/* One of a slot's keys: whole while it lies in kb still (in place, or
 * copied into buf when it wraps around kb's end), or the bytes the slot
 * kept with *cut set. */
static kv_bytes
key_of(const kv_recent *r, const uint8_t *kept, uint8_t len, uint16_t full, uint32_t pos,
       uint8_t *buf, bool *cut)
{
	*cut = false;
	if (full <= len)
		return (kv_bytes){kept, len};
	/* Intact while at most KB_CAP bytes were written since its first. */
	if (full != NOT_HELD && (uint32_t)(r->kbpos - pos) <= KB_CAP) {
		size_t off = pos % KB_CAP, first = KB_CAP - off;
		if (first >= full)
			return (kv_bytes){r->kb + off, full};
		memcpy(buf, r->kb + off, first);
		memcpy(buf + first, r->kb, full - first);
		return (kv_bytes){buf, full};
	}
	*cut = true;
	return (kv_bytes){kept, len};
}

/* Whether record e may touch [start, end). A cut key is known only to
 * begin with the bytes kept: it is at least those bytes (enough for the
 * lowest key's test against the end), and it lies below start for sure
 * only when every longer key that begins with them does, that is when they
 * sort below start and start does not begin with them. */
static bool
may_touch(const kv_recent *r, const rec *e, kv_bytes start, kv_bytes end)
{
	uint8_t buf[WHOLE_MAX];
	bool cut;

	if (e->kind != KV_DUR_SPAN_KEYS && e->kind != KV_DUR_SPAN_RANGE)
		return true; /* no key known, or any key */
	/* Its lowest key must lie below the end ... */
	kv_bytes lo = key_of(r, e->key, e->lolen, e->lofull, e->lopos, buf, &cut);
	if (end.len > 0 && kv_key_cmp(lo.p, lo.len, end.p, end.len) >= 0)
		return false;
	/* ... and its highest at or above the start: a key span [lo, hi], a
	 * range delete [lo, hi) (an empty hi: no bound). */
	kv_bytes hi = key_of(r, e->key + e->lolen, e->hilen, e->hifull, e->hipos, buf, &cut);
	if (cut)
		return kv_key_cmp(hi.p, hi.len, start.p, start.len) >= 0 ||
		       (start.len >= hi.len && memcmp(start.p, hi.p, hi.len) == 0);
	if (e->kind == KV_DUR_SPAN_KEYS)
		return kv_key_cmp(hi.p, hi.len, start.p, start.len) >= 0;
	return hi.len == 0 || kv_key_cmp(hi.p, hi.len, start.p, start.len) > 0;
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
		if (e->lsn <= upto && may_touch(r, e, start, end))
			return true;
	}
	return false;
}
