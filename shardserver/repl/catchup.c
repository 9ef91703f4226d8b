/*
 * catchup.c - the primary's buffer of recent records and a replica's
 * positions (catchup.h; doc/replication.md "Catch-up from the replica's
 * own data").
 *
 * Ranges are [start, end) with an empty end meaning "no upper bound"; a
 * record's range is the route it was written under.
 */
#include "shardserver/repl/catchup.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

#define POS_MAGIC "KVCUPOS1"

/* ------------------------------------------------------------------------
 * Ranges
 * ------------------------------------------------------------------------ */

/* Whether end a is below end b (empty: no bound). */
static int
end_cmp(const void *a, size_t al, const void *b, size_t bl)
{
	if (al == 0 || bl == 0)
		return al == bl ? 0 : al == 0 ? 1 : -1;
	return kv_key_cmp(a, al, b, bl);
}

static bool
overlaps(const void *as, size_t asl, const void *ae, size_t ael, const void *bs, size_t bsl,
         const void *be, size_t bel)
{
	return (ael == 0 || kv_key_cmp(bs, bsl, ae, ael) < 0) &&
	       (bel == 0 || kv_key_cmp(as, asl, be, bel) < 0);
}

/* ------------------------------------------------------------------------
 * The buffer
 * ------------------------------------------------------------------------ */

/* Most bytes of a slab: records are carved from slabs of the buffer's
 * slab size (kv_cu_buf.slab: a 64th of its cap, at most this); a larger
 * record gets a slab of its own size. */
#define CU_SLAB (1u << 20)

/* The buffer drops whole slabs, never single records: what it drops is
 * told by the slab's own counts, so that no old record is read again (the
 * record at the buffer's far end was written a buffer's worth of writes
 * ago, often by another CPU: a cache miss for every record dropped). */
struct kv_cu_slab {
	kv_cu_slab *next; /* the next newer slab */
	atomic_uint refs; /* the buffer's one while listed, plus one per record taken */
	size_t used, cap; /* bytes of data carved, and allocated */
	size_t n;         /* records carved */
	uint64_t bytes;   /* their payload bytes */
	uint64_t last;    /* the lsn of the newest */
	uint8_t data[];
};

/* The bytes a record takes in its slab (8-byte aligned). */
static size_t
rec_size(size_t slen, size_t elen, size_t plen)
{
	return (sizeof(kv_cu_rec) + slen + elen + plen + 7) & ~(size_t)7;
}

static void
slab_unref(kv_cu_slab *sl)
{
	if (atomic_fetch_sub(&sl->refs, 1) == 1)
		free(sl);
}

void
kv_cu_buf_init(kv_cu_buf *b, uint64_t cap, uint64_t trim)
{
	*b = (kv_cu_buf){.cap = cap, .trim = trim, .slab = cap / 64 < CU_SLAB ? cap / 64 : CU_SLAB};
}

/* Drops the head slab and its records (trim moves to the last of them).
 * One that no catch-up holds is kept as the spare for the next slab (no
 * mapping and first touch of fresh pages each slab), if none is kept. */
static void
slab_drop(kv_cu_buf *b)
{
	kv_cu_slab *sl = b->head;

	b->head = sl->next;
	if (b->head == NULL)
		b->tail = NULL;
	if (sl->n > 0) {
		b->n -= sl->n;
		b->bytes -= sl->bytes;
		b->trim = sl->last;
	}
	if (b->spare == NULL && sl->cap == b->slab && b->slab > 0 &&
	    atomic_load_explicit(&sl->refs, memory_order_acquire) == 1) {
		sl->next = NULL;
		sl->used = 0;
		sl->n = 0;
		sl->bytes = 0;
		sl->last = 0;
		b->spare = sl;
		return;
	}
	slab_unref(sl);
}

void
kv_cu_buf_fini(kv_cu_buf *b)
{
	uint64_t trim = b->trim;

	while (b->head)
		slab_drop(b);
	if (b->spare != NULL)
		slab_unref(b->spare);
	b->spare = NULL;
	b->trim = trim;
}

void
kv_cu_buf_add(kv_cu_buf *b, uint64_t lsn, uint64_t leader_epoch, const kv_bytes *start,
              const kv_bytes *end, const uint8_t *p, size_t n)
{
	size_t sz = rec_size(start->len, end->len, n);
	kv_cu_slab *sl = b->tail;
	kv_cu_rec *r;

	if (lsn <= b->trim)
		return;
	if (sl == NULL || sl->cap - sl->used < sz) {
		size_t cap = sz > b->slab ? sz : b->slab;
		if (cap == b->slab && b->spare != NULL) {
			sl = b->spare;
			b->spare = NULL;
		} else if ((sl = malloc(sizeof(*sl) + cap)) != NULL) {
			sl->next = NULL;
			atomic_init(&sl->refs, 1);
			sl->used = 0;
			sl->cap = cap;
			sl->n = 0;
			sl->bytes = 0;
			sl->last = 0;
		} else {
			kv_cu_buf_fini(b);
			b->trim = lsn;
			return;
		}
		if (b->tail)
			b->tail->next = sl;
		else
			b->head = sl;
		b->tail = sl;
		if (b->n == 0) {
			/* Nothing held before it: older slabs hold no record. */
			while (b->head != sl)
				slab_drop(b);
		}
	}
	r = (kv_cu_rec *)(sl->data + sl->used);
	sl->used += sz;
	r->slab = sl;
	r->lsn = lsn;
	r->leader_epoch = leader_epoch;
	r->slen = start->len;
	r->elen = end->len;
	r->plen = n;
	if (start->len)
		memcpy(r->data, start->p, start->len);
	if (end->len)
		memcpy(r->data + start->len, end->p, end->len);
	if (n)
		memcpy(r->data + start->len + end->len, p, n);
	sl->n++;
	sl->bytes += n;
	sl->last = lsn;
	b->n++;
	b->bytes += n;
	while (b->bytes > b->cap && b->head != b->tail)
		slab_drop(b);
}

/* Walks every held record r, oldest first. */
#define FOR_EACH_REC(b, r)                                                                         \
	for (kv_cu_slab *sl_ = (b)->head; sl_ != NULL; sl_ = sl_->next)                            \
		for (size_t off_ = 0;                                                              \
		     off_ < sl_->used && ((r) = (kv_cu_rec *)(sl_->data + off_)) != NULL;          \
		     off_ += rec_size((r)->slen, (r)->elen, (r)->plen))

int
kv_cu_buf_select(kv_cu_buf *b, const kv_bytes *start, const kv_bytes *end, uint64_t leader_epoch,
                 kv_cu_rec ***out, size_t *n, uint64_t *from)
{
	size_t k = 0;
	kv_cu_rec **v, *r;

	*out = NULL;
	*n = 0;
	*from = b->trim;
	FOR_EACH_REC(b, r)
	{
		const uint8_t *rs = r->data, *re = r->data + r->slen;
		if (!overlaps(rs, r->slen, re, r->elen, start->p, start->len, end->p, end->len))
			continue;
		if (r->leader_epoch != leader_epoch ||
		    !kv_range_within(rs, r->slen, re, r->elen, start->p, start->len, end->p,
		                     end->len))
			return KV_EINVAL;
		k++;
	}
	if (k == 0)
		return KV_OK;
	if ((v = malloc(k * sizeof(*v))) == NULL)
		return KV_ENOMEM;
	k = 0;
	FOR_EACH_REC(b, r)
	{
		if (!overlaps(r->data, r->slen, r->data + r->slen, r->elen, start->p, start->len,
		              end->p, end->len))
			continue;
		atomic_fetch_add(&r->slab->refs, 1);
		v[k++] = r;
	}
	*out = v;
	*n = k;
	return KV_OK;
}

void
kv_cu_release(kv_cu_rec **v, size_t n)
{
	for (size_t i = 0; v && i < n; i++)
		slab_unref(v[i]->slab);
	free(v);
}

kv_bytes
kv_cu_payload(const kv_cu_rec *r)
{
	return (kv_bytes){r->data + r->slen + r->elen, r->plen};
}

/* ------------------------------------------------------------------------
 * Positions
 * ------------------------------------------------------------------------ */

static void
pos_fini(kv_cu_pos *p)
{
	kv_buf_fini(&p->start);
	kv_buf_fini(&p->end);
}

void
kv_cu_pos_set_fini(kv_cu_pos_set *s)
{
	for (size_t i = 0; i < s->n; i++)
		pos_fini(&s->v[i]);
	free(s->v);
	*s = (kv_cu_pos_set){0};
}

bool
kv_cu_pos_covers(const kv_cu_pos *p, uint32_t from, uint64_t boot, uint64_t leader_epoch,
                 const kv_bytes *start, const kv_bytes *end, uint64_t from_lsn)
{
	return p->from == from && p->boot == boot && p->leader_epoch == leader_epoch &&
	       p->lsn >= from_lsn &&
	       kv_range_within(start->p, start->len, end->p, end->len, p->start.data, p->start.len,
	                       p->end.data, p->end.len);
}

long
kv_cu_pos_find(const kv_cu_pos_set *s, uint32_t from, uint64_t boot, uint64_t leader_epoch,
               const kv_bytes *start, const kv_bytes *end, uint64_t from_lsn)
{
	for (size_t i = 0; i < s->n; i++)
		if (kv_cu_pos_covers(&s->v[i], from, boot, leader_epoch, start, end, from_lsn))
			return (long)i;
	return -1;
}

/* Appends a position (its bounds copied). */
static int
push(kv_cu_pos_set *s, const kv_cu_pos *p, const void *st, size_t sl, const void *en, size_t el)
{
	kv_cu_pos q = *p;

	if (s->n >= KV_CU_POS_MAX)
		return KV_ELIMIT;
	if (s->n == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 8;
		kv_cu_pos *v = realloc(s->v, cap * sizeof(*v));
		if (v == NULL)
			return KV_ENOMEM;
		s->v = v;
		s->cap = cap;
	}
	q.start = (kv_buf){0};
	q.end = (kv_buf){0};
	if (kv_buf_set(&q.start, st, sl) != 0 || kv_buf_set(&q.end, en, el) != 0) {
		pos_fini(&q);
		return KV_ENOMEM;
	}
	s->v[s->n++] = q;
	return KV_OK;
}

int
kv_cu_pos_put(kv_cu_pos_set *s, uint32_t from, uint64_t boot, uint64_t leader_epoch,
              const kv_bytes *start, const kv_bytes *end, uint64_t lsn, uint64_t local, bool live)
{
	kv_cu_pos_set keep = {0};
	kv_cu_pos np = {.from = from,
	                .boot = boot,
	                .leader_epoch = leader_epoch,
	                .lsn = lsn,
	                .local = local,
	                .live = live};
	int rv = KV_OK;

	for (size_t i = 0; i < s->n && rv == KV_OK; i++) {
		kv_cu_pos *p = &s->v[i];
		if (!overlaps(p->start.data, p->start.len, p->end.data, p->end.len, start->p,
		              start->len, end->p, end->len)) {
			rv = push(&keep, p, p->start.data, p->start.len, p->end.data, p->end.len);
			continue;
		}
		/* The parts of an overlapping position outside [start, end)
		 * still hold; they stop moving with the stream. */
		kv_cu_pos part = *p;
		part.live = false;
		if (kv_key_cmp(p->start.data, p->start.len, start->p, start->len) < 0)
			rv = push(&keep, &part, p->start.data, p->start.len, start->p, start->len);
		if (rv == KV_OK && end->len != 0 &&
		    end_cmp(end->p, end->len, p->end.data, p->end.len) < 0)
			rv = push(&keep, &part, end->p, end->len, p->end.data, p->end.len);
	}
	if (rv == KV_OK)
		rv = push(&keep, &np, start->p, start->len, end->p, end->len);
	if (rv != KV_OK) {
		kv_cu_pos_set_fini(&keep);
		return rv;
	}
	kv_cu_pos_set_fini(s);
	*s = keep;
	return KV_OK;
}

size_t
kv_cu_pos_forget(kv_cu_pos_set *s, const kv_bytes *start, const kv_bytes *end)
{
	size_t k = 0, gone = 0;

	for (size_t i = 0; i < s->n; i++) {
		kv_cu_pos *p = &s->v[i];
		if (overlaps(p->start.data, p->start.len, p->end.data, p->end.len, start->p,
		             start->len, end->p, end->len)) {
			pos_fini(p);
			gone++;
			continue;
		}
		s->v[k++] = *p;
	}
	s->n = k;
	return gone;
}

int
kv_cu_pos_reshape(kv_cu_pos_set *s, const kv_cu_range *r, size_t n, bool *dropped)
{
	kv_cu_pos_set out = {0};
	int rv = KV_OK;

	*dropped = false;
	for (size_t i = 0; i < s->n && rv == KV_OK; i++) {
		kv_cu_pos *p = &s->v[i];
		/* The key space of p covered by matching ranges, in order: a gap or
		 * a range of another primary or epoch inside p is a part dropped. */
		kv_bytes at = {p->start.data, p->start.len};
		bool done = false;
		for (size_t k = 0; k < n && rv == KV_OK && !done; k++) {
			const kv_cu_range *q = &r[k];
			if (!overlaps(p->start.data, p->start.len, p->end.data, p->end.len,
			              q->start.p, q->start.len, q->end.p, q->end.len))
				continue;
			if (q->primary != p->from || q->leader_epoch != p->leader_epoch) {
				*dropped = true;
				continue;
			}
			const kv_bytes *st =
			    kv_key_cmp(q->start.p, q->start.len, p->start.data, p->start.len) > 0
			        ? &q->start
			        : &(kv_bytes){p->start.data, p->start.len};
			kv_bytes pe = {p->end.data, p->end.len};
			const kv_bytes *en =
			    end_cmp(q->end.p, q->end.len, pe.p, pe.len) < 0 ? &q->end : &pe;
			if (kv_key_cmp(st->p, st->len, at.p, at.len) > 0)
				*dropped = true; /* a gap before this range */
			rv = push(&out, p, st->p, st->len, en->p, en->len);
			at = *en;
			done = en->len == 0 || end_cmp(en->p, en->len, pe.p, pe.len) >= 0;
		}
		if (!done)
			*dropped = true;
	}
	if (rv != KV_OK) {
		kv_cu_pos_set_fini(&out);
		*dropped = true;
	}
	kv_cu_pos_set_fini(s);
	*s = out;
	return rv;
}

/* File: magic, u32 count, then per position u32 from, u64 boot, u64
 * leader_epoch, u64 lsn, u32 start length, start, u32 end length, end;
 * then the u64 hash (kv_hash64) of everything before. Host byte order: the
 * file never leaves its machine. */

static int
put(kv_buf *b, const void *p, size_t n)
{
	return kv_buf_append(b, p, n);
}

int
kv_cu_pos_encode(const kv_cu_pos_set *s, kv_buf *out)
{
	uint32_t cnt = 0;
	int rv;

	out->len = 0;
	for (size_t i = 0; i < s->n; i++)
		cnt += s->v[i].has_saved;
	if ((rv = put(out, POS_MAGIC, 8)) != 0 || (rv = put(out, &cnt, 4)) != 0)
		return rv;
	for (size_t i = 0; i < s->n; i++) {
		const kv_cu_pos *p = &s->v[i];
		uint32_t sl = (uint32_t)p->start.len, el = (uint32_t)p->end.len;
		if (!p->has_saved)
			continue;
		if ((rv = put(out, &p->from, 4)) != 0 || (rv = put(out, &p->boot, 8)) != 0 ||
		    (rv = put(out, &p->leader_epoch, 8)) != 0 ||
		    (rv = put(out, &p->saved, 8)) != 0 || (rv = put(out, &sl, 4)) != 0 ||
		    (rv = put(out, p->start.data, sl)) != 0 || (rv = put(out, &el, 4)) != 0 ||
		    (rv = put(out, p->end.data, el)) != 0)
			return rv;
	}
	uint64_t h = kv_hash64(out->data, out->len);
	return put(out, &h, 8);
}

/* Reads n bytes at *off into dst. */
static bool
take(const uint8_t *p, size_t len, size_t *off, void *dst, size_t n)
{
	if (len - *off < n)
		return false;
	memcpy(dst, p + *off, n);
	*off += n;
	return true;
}

int
kv_cu_pos_decode(const uint8_t *p, size_t n, kv_cu_pos_set *s)
{
	size_t off = 8;
	uint32_t cnt;
	uint64_t h;

	if (n < 8 + 4 + 8 || memcmp(p, POS_MAGIC, 8) != 0)
		return KV_ECORRUPT;
	memcpy(&h, p + n - 8, 8);
	if (h != kv_hash64(p, n - 8))
		return KV_ECORRUPT;
	n -= 8;
	if (!take(p, n, &off, &cnt, 4) || cnt > KV_CU_POS_MAX)
		return KV_ECORRUPT;
	for (uint32_t i = 0; i < cnt; i++) {
		kv_cu_pos q = {0};
		uint32_t sl, el;
		const uint8_t *st, *en;
		if (!take(p, n, &off, &q.from, 4) || !take(p, n, &off, &q.boot, 8) ||
		    !take(p, n, &off, &q.leader_epoch, 8) || !take(p, n, &off, &q.lsn, 8) ||
		    !take(p, n, &off, &sl, 4) || sl > KV_HARD_MAX_KEY || n - off < sl)
			goto bad;
		st = p + off;
		off += sl;
		if (!take(p, n, &off, &el, 4) || el > KV_HARD_MAX_KEY || n - off < el)
			goto bad;
		en = p + off;
		off += el;
		q.saved = q.lsn;
		q.has_saved = true;
		int rv = push(s, &q, st, sl, en, el);
		if (rv != KV_OK) {
			kv_cu_pos_set_fini(s);
			return rv;
		}
	}
	if (off != n)
		goto bad;
	return KV_OK;
bad:
	kv_cu_pos_set_fini(s);
	return KV_ECORRUPT;
}

/* ------------------------------------------------------------------------
 * A restarted node's recovered tail (kv_cu_tail)
 * ------------------------------------------------------------------------ */

void
kv_cu_tail_init(kv_cu_tail *t, uint64_t from, uint64_t max_keys)
{
	*t = (kv_cu_tail){.from = from, .to = from - 1, .max_keys = max_keys};
}

void
kv_cu_tail_fini(kv_cu_tail *t)
{
	free(t->v);
	kv_buf_fini(&t->keys);
	*t = (kv_cu_tail){0};
}

int
kv_cu_tail_add(kv_cu_tail *t, uint64_t lsn, int kind, kv_bytes lo, kv_bytes hi)
{
	kv_cu_span sp = {.kind = (uint8_t)kind};

	if (lsn != t->to + 1)
		return KV_EINVAL;
	if (t->keys.len + lo.len + hi.len > t->max_keys ||
	    t->keys.len + lo.len + hi.len > UINT32_MAX)
		return KV_ELIMIT;
	if (t->n == t->cap) {
		size_t cap = t->cap ? 2 * t->cap : 1024;
		kv_cu_span *v = realloc(t->v, cap * sizeof(*v));
		if (v == NULL)
			return KV_ENOMEM;
		t->v = v;
		t->cap = cap;
	}
	sp.lo_off = (uint32_t)t->keys.len;
	sp.lo_len = (uint32_t)lo.len;
	if (lo.len && kv_buf_append(&t->keys, lo.p, lo.len) != KV_OK)
		return KV_ENOMEM;
	sp.hi_off = (uint32_t)t->keys.len;
	sp.hi_len = (uint32_t)hi.len;
	if (hi.len && kv_buf_append(&t->keys, hi.p, hi.len) != KV_OK)
		return KV_ENOMEM;
	t->v[t->n++] = sp;
	t->to = lsn;
	return KV_OK;
}

/* Whether span sp may change a key of [start, end). */
static bool
span_touches(const kv_cu_tail *t, const kv_cu_span *sp, const kv_bytes *start, const kv_bytes *end)
{
	const uint8_t *lo = t->keys.data + sp->lo_off, *hi = t->keys.data + sp->hi_off;

	switch (sp->kind) {
	case 0: /* KV_DUR_SPAN_NONE */
		return false;
	case 1: /* KV_DUR_SPAN_KEYS: [lo, hi] */
		return (end->len == 0 || kv_key_cmp(lo, sp->lo_len, end->p, end->len) < 0) &&
		       kv_key_cmp(hi, sp->hi_len, start->p, start->len) >= 0;
	case 2: /* KV_DUR_SPAN_RANGE: [lo, hi) */
		return (end->len == 0 || kv_key_cmp(lo, sp->lo_len, end->p, end->len) < 0) &&
		       (sp->hi_len == 0 || kv_key_cmp(start->p, start->len, hi, sp->hi_len) < 0);
	default:
		return true;
	}
}

int
kv_cu_tail_touches(const kv_cu_tail *t, uint64_t after, uint64_t upto, const kv_bytes *start,
                   const kv_bytes *end)
{
	if (upto <= after)
		return 0;
	if (after + 1 < t->from || upto > t->to)
		return -1;
	for (uint64_t l = after + 1; l <= upto; l++)
		if (span_touches(t, &t->v[l - t->from], start, end))
			return 1;
	return 0;
}
