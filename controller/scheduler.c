/*
 * scheduler.c - the automatic balancer's planner (scheduler.h,
 * doc/scheduler.md).
 *
 * One round, on the latest configuration and the figures of its ranges:
 *   1. hot windows: a range busier than split_ops starts (or keeps) its
 *      window; a sustained hot range whose load is one key is reported;
 *   2. balancing steps: while some active node is more than `tolerance`
 *      above the mean in bytes or in ops (primaries only: what a node leads
 *      is what it serves), the piece of one of its ranges that best takes
 *      the excess goes to the least loaded eligible node: for a replicated
 *      range an in-sync replica (a primary transfer, no data moves, so
 *      preferred), for a single range any active node (a migration, at most
 *      max_migrations in flight cluster-wide and one per node). A piece is
 *      a whole range or the part on either side of one of its split keys
 *      (eighths of the bytes) or load split keys (eighths of the load), the
 *      one closest to the excess; a single piece larger than split_bytes
 *      is only ever moved as the smallest piece there is. A step must
 *      lower the larger of the two nodes' loads and move at least half the
 *      tolerance of the mean, so balanced and unbalanceable states propose
 *      nothing (hysteresis);
 *   3. primary counts: while some node leads more than
 *      KV_SCHED_COUNT_TOLERANCE above the mean count of ranges, the node
 *      leading the fewest gets a whole range from a node leading at least
 *      two more (a transfer for a replicated range) or a part of any range
 *      (a cut: the map gains a range), the cheapest in data that keeps its
 *      bytes and ops within the tolerance; when no piece fits, the
 *      receiver's own largest replicated range is cut in place (a
 *      self-split: its count rises, nothing moves);
 *   4. merges, once the map has more than MERGE_PER_NODE ranges per active
 *      node: two adjacent single ranges on different nodes that are both
 *      small (together under split_bytes / 4) and cold (under split_ops / 4)
 *      become one by moving the smaller onto its neighbour's node, when
 *      that node stays within the tolerance.
 * Each node takes part in one decision per round. Ranges overlapping a pin
 * of the configuration (kv_config_pin: an administrator's move), a migration
 * in flight or a cool-down are left alone.
 */
#include "controller/scheduler.h"
#include "common/err.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MERGE_PER_NODE 8
/* Count steps cut ranges only below this many ranges per active node: with
 * n >= 5N ranges, ceil(n / N) is within KV_SCHED_COUNT_TOLERANCE of the mean. */
#define COUNT_CUT_PER_NODE 5
/* A count step counts its piece this much larger than estimated when it
 * checks the receiver against the bytes and ops tolerance. */
#define COUNT_MARGIN 1.1
#define MAX_NODES    256
/* A range new to a server starts its decayed rates from zero
 * (shardserver/heartbeat.c; each second weighs 0.3), and a server from
 * before 2026-12-07 starts all of its ranges' again whenever the ranges it
 * leads change, so for a while after a decision its nodes report less
 * load than they serve, the receiver most: after 10 s a rate is at 97% of
 * the load. Until then neither takes part in a load step
 * (doc/scheduler.md "Settling"). */
#define LOAD_SETTLE_MS 10000u

/* A key interval with a time. */
struct span {
	kv_buf start, end;
	uint64_t until; /* cool-down: left alone until then; hot window: since */
};

struct span_list {
	struct span *v;
	size_t n;
};

/* A node whose led ranges a decision changed: its load figures settle. */
struct settle {
	uint32_t id;
	uint64_t until;
};

struct kv_sched {
	struct span_list cool;           /* recently decided pieces */
	struct span_list hot;            /* ranges hot since `until` (keyed by start, end) */
	struct span_list rep;            /* hot keys reported, [key, key): not again until */
	struct settle settle[MAX_NODES]; /* nodes whose load figures settle */
	size_t nsettle;
};

void
kv_sched_params_default(kv_sched_params *p)
{
	p->split_bytes = 64u << 20;
	p->split_ops = 20000;
	p->max_migrations = 2;
	p->tolerance = 0.10;
	p->sustain_ms = 10000;
	p->cooldown_ms = 15000;
	p->cut_replicated = false;
}

uint64_t
kv_sched_bytes_floor(const kv_sched_params *p)
{
	uint64_t f = p->split_bytes / 16;

	return f < 1048576u ? f : 1048576u;
}

const char *
kv_sched_kind_name(kv_sched_kind k)
{
	switch (k) {
	case KV_SCHED_MOVE:
		return "move";
	case KV_SCHED_TRANSFER:
		return "transfer";
	case KV_SCHED_MERGE:
		return "merge";
	case KV_SCHED_HOT:
		return "hot_key";
	case KV_SCHED_SPLIT:
		return "split";
	}
	return "unknown";
}

const char *
kv_sched_why_name(kv_sched_why w)
{
	switch (w) {
	case KV_SCHED_WHY_BYTES:
		return "bytes";
	case KV_SCHED_WHY_OPS:
		return "ops";
	case KV_SCHED_WHY_COLD:
		return "cold";
	case KV_SCHED_WHY_HOTKEY:
		return "hot_key";
	case KV_SCHED_WHY_PRIMARIES:
		return "primaries";
	}
	return "unknown";
}

static void
span_fini(struct span *x)
{
	kv_buf_fini(&x->start);
	kv_buf_fini(&x->end);
}

static void
list_clear(struct span_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		span_fini(&l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

static int
list_add(struct span_list *l, kv_bytes start, kv_bytes end, uint64_t until)
{
	struct span *v = realloc(l->v, (l->n + 1) * sizeof(*v));

	if (v == NULL)
		return KV_ENOMEM;
	l->v = v;
	memset(&v[l->n], 0, sizeof(v[l->n]));
	if (kv_buf_set(&v[l->n].start, start.p, start.len) != 0 ||
	    kv_buf_set(&v[l->n].end, end.p, end.len) != 0) {
		span_fini(&v[l->n]);
		return KV_ENOMEM;
	}
	v[l->n++].until = until;
	return KV_OK;
}

static void
list_del(struct span_list *l, size_t i)
{
	span_fini(&l->v[i]);
	l->v[i] = l->v[--l->n];
}

kv_sched *
kv_sched_new(void)
{
	return calloc(1, sizeof(kv_sched));
}

void
kv_sched_free(kv_sched *s)
{
	if (s == NULL)
		return;
	list_clear(&s->cool);
	list_clear(&s->hot);
	list_clear(&s->rep);
	free(s);
}

void
kv_sched_decisions_fini(kv_sched_decision *d, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		kv_buf_fini(&d[i].start);
		kv_buf_fini(&d[i].end);
	}
}

/* [s1, e1) and [s2, e2) share a key (an empty end is the end of the key
 * space). */
static bool
overlap(const void *s1, size_t s1l, const void *e1, size_t e1l, const void *s2, size_t s2l,
        const void *e2, size_t e2l)
{
	return (e2l == 0 || kv_key_cmp(s1, s1l, e2, e2l) < 0) &&
	       (e1l == 0 || kv_key_cmp(s2, s2l, e1, e1l) < 0);
}

static bool
span_hit(const struct span_list *l, const kv_range *r, uint64_t now, bool timed)
{
	for (size_t i = 0; i < l->n; i++)
		if ((!timed || l->v[i].until > now) &&
		    overlap(l->v[i].start.data, l->v[i].start.len, l->v[i].end.data,
		            l->v[i].end.len, r->start.data, r->start.len, r->end.data, r->end.len))
			return true;
	return false;
}

static bool
migrating(const kv_config *c, const kv_range *r)
{
	for (size_t i = 0; i < c->nmigs; i++)
		if (overlap(c->migs[i].start.data, c->migs[i].start.len, c->migs[i].end.data,
		            c->migs[i].end.len, r->start.data, r->start.len, r->end.data,
		            r->end.len))
			return true;
	return false;
}

/* Where a range's hot window began (the entry with its exact bounds). */
static struct span *
hot_find(struct span_list *l, const kv_range *r)
{
	for (size_t i = 0; i < l->n; i++)
		if (kv_key_cmp(l->v[i].start.data, l->v[i].start.len, r->start.data,
		               r->start.len) == 0 &&
		    kv_key_cmp(l->v[i].end.data, l->v[i].end.len, r->end.data, r->end.len) == 0)
			return &l->v[i];
	return NULL;
}

static kv_bytes
kb(const kv_buf *b)
{
	return (kv_bytes){b->data, b->len};
}

/* The bounds of a piece of range r: the whole range (part 0), the part below
 * key (1) or the part from key on (2). */
static void
piece_bounds(const kv_range *r, int part, kv_bytes key, kv_bytes *st, kv_bytes *en)
{
	*st = kb(&r->start);
	*en = kb(&r->end);
	if (part == 1)
		*en = key;
	else if (part == 2)
		*st = key;
}

/* Per-node loads of one round. */
struct load {
	uint32_t id;
	double b, o;   /* bytes and ops it leads */
	uint32_t np;   /* ranges it leads */
	bool used;     /* in a decision of this round */
	bool busy;     /* a migration in flight starts or ends here */
	bool settling; /* its load figures are settling: no load step */
};

struct round {
	const kv_config *c;
	const kv_sched_fig *f;
	const kv_sched_params *p;
	kv_sched *s;
	uint64_t now;
	struct load L[MAX_NODES];
	size_t nl;
	double mb, mo;  /* means */
	bool use_ops;   /* the load is large enough to balance on */
	bool use_bytes; /* the data is large enough to balance on */
	uint32_t moves; /* migrations still allowed */
	bool *hotsus;   /* per range: hot for sustain_ms */
};

static struct load *
load_of(struct round *R, uint32_t id)
{
	for (size_t i = 0; i < R->nl; i++)
		if (R->L[i].id == id)
			return &R->L[i];
	return NULL;
}

/* A range the planner may touch this round. */
static bool
free_range(struct round *R, size_t i)
{
	const kv_range *r = &R->c->ranges[i];
	return R->f[i].known && !kv_config_pinned(R->c, kb(&r->start), kb(&r->end), false) &&
	       !span_hit(&R->s->cool, r, R->now, true) && !migrating(R->c, r) && r->nreplacing == 0;
}

static double
ratio(double v, double mean)
{
	return mean > 0 ? v / mean : 0;
}

struct cand {
	bool ok;
	size_t range;
	int part; /* 0 whole, 1 below the key, 2 from the key on */
	kv_bytes key;
	struct load *dst;
	double amt_b, amt_o;
	double score;
	bool transfer;
};

/* The best destination for range r's piece: the eligible node with the
 * lowest value in the dimension. */
static struct load *
pick_dst(struct round *R, const kv_range *r, struct load *src, bool ops)
{
	struct load *best = NULL;

	for (size_t i = 0; i < R->nl; i++) {
		struct load *d = &R->L[i];
		if (d == src || d->used || (ops && d->settling))
			continue;
		if (r->nreplicas) {
			bool in = false;
			/* an ISR member, and no transfer while the previous primary is
			 * still the fence (doc/replication.md) */
			for (uint32_t k = 0; k < r->ninsync; k++)
				in = in || r->insync[k] == d->id;
			if (!in || r->fence != 0)
				continue;
		} else if (d->busy) {
			continue;
		}
		if (best == NULL || (ops ? d->o < best->o : d->b < best->b))
			best = d;
	}
	return best;
}

/* A piece of a range: the whole (part 0), [start, key) (part 1) or
 * [key, end) (part 2), with its estimated shares of the range's bytes and
 * load; kb / ko: the share comes from quantile keys of that dimension. */
struct piece {
	int part;
	kv_bytes key;
	double sb, so;
	bool kb, ko;
};

#define MAX_PIECES (1 + 4 * KV_SCHED_QUANTS)

/* The share of a dimension below key, from the n keys qs cutting it into
 * n + 1 equal parts: exact at one of them, else the middle of the part key
 * falls in. */
static double
share_below(kv_bytes key, const kv_bytes *qs, size_t n)
{
	size_t lt = 0;

	for (size_t i = 0; i < n; i++) {
		int c = kv_key_cmp(qs[i].p, qs[i].len, key.p, key.len);
		if (c == 0)
			return (double)(i + 1) / (double)(n + 1);
		lt += c < 0;
	}
	return ((double)lt + 0.5) / (double)(n + 1);
}

/*
 * The pieces of range f (doc/scheduler.md "The planner"): the whole range,
 * then the parts below and from each byte split key and each load split
 * key. A key's share of the bytes comes from the byte keys and its share
 * of the load from the load keys; a dimension without keys takes the
 * other's share (an older server reports one load key: the load then
 * counts as spread like the bytes, and its key halves the load). Returns
 * the number of pieces in out (MAX_PIECES).
 */
static size_t
pieces_of(const kv_sched_fig *f, struct piece *out)
{
	const kv_bytes *lq = f->nlq ? f->lq : &f->load_key;
	size_t nlq = f->nlq ? f->nlq : f->load_key.len ? 1 : 0, n = 0;

	out[n++] = (struct piece){.part = 0, .sb = 1, .so = 1, .kb = true, .ko = true};
	for (size_t i = 0; i < f->nq + nlq; i++) {
		kv_bytes key = i < f->nq ? f->q[i] : lq[i - f->nq];
		bool kb = f->nq > 0, ko = f->nlq > 0 || i >= f->nq;
		double b = kb ? share_below(key, f->q, f->nq) : 0;
		double o = ko ? share_below(key, lq, nlq) : 0;
		if (key.len == 0)
			continue;
		if (!kb)
			b = o;
		if (!ko)
			o = b;
		out[n++] = (struct piece){1, key, b, o, kb, ko};
		out[n++] = (struct piece){2, key, 1 - b, 1 - o, kb, ko};
	}
	return n;
}

static void
consider(struct round *R, struct load *src, bool ops, size_t i, struct cand *best)
{
	const kv_range *r = &R->c->ranges[i];
	const kv_sched_fig *f = &R->f[i];
	bool single = r->nreplicas == 0;
	struct load *d;
	double excess = ops ? src->o - R->mo : src->b - R->mb;
	double mean = ops ? R->mo : R->mb;
	double min_step = R->p->tolerance / 2 * mean;
	struct piece pc[MAX_PIECES];
	size_t np = pieces_of(f, pc);
	double smallest = 1;

	if (single && (R->moves == 0 || src->busy))
		return;
	if ((d = pick_dst(R, r, src, ops)) == NULL)
		return;
	/* The ideal piece brings the source down to the mean without taking
	 * the destination above it. */
	double room = mean - (ops ? d->o : d->b);
	double want = room < excess ? room : excess;
	bool hot = f->hot_key.len && f->hot_share >= 0.5 && f->ops > R->p->split_ops;
	/* Pieces cut at a key whose share in the dimension balanced is known
	 * from that dimension's own keys: the whole range, then the parts
	 * before and from each byte or load split key. */
	for (size_t c = 1; c < np; c++)
		if (ops ? pc[c].ko : pc[c].kb)
			smallest = fmin(smallest, pc[c].sb);
	for (size_t c = 0; c < np; c++) {
		int part = pc[c].part;
		kv_bytes key = pc[c].key;
		double ab = (double)f->bytes * pc[c].sb, ao = f->ops * pc[c].so;
		double amt = ops ? ao : ab;
		if (part > 0 && !(ops ? pc[c].ko : pc[c].kb))
			continue;
		/* A replicated range is cut too (the primary of the part it
		 * keeps drops what it queued for the other part: doc/replication.md
		 * "Moves and rebalance with replicas"). */
		/* A range whose load is one key is not split: the key would stay
		 * hot on one side (it is reported once the heat lasts). */
		if (part > 0 && hot)
			continue;
		/* Data moves in pieces of at most split_bytes, or the smallest
		 * piece there is when even that is larger. */
		if (single && ab > (double)R->p->split_bytes && pc[c].sb > smallest + 1e-9)
			continue;
		if (amt < min_step || amt <= 0)
			continue;
		/* Strictly lowers the larger of the two nodes' loads... */
		if ((ops ? d->o : d->b) + amt >= (ops ? src->o : src->b))
			continue;
		/* ...and keeps the other dimension of the destination within the
		 * tolerance, or no worse than the source's now (no flapping). */
		double other_after = ops ? d->b + ab : d->o + ao;
		double other_mean = ops ? R->mb : R->mo;
		double other_src = ops ? src->b : src->o;
		if ((ops ? R->use_bytes : R->use_ops) && other_mean > 0 &&
		    other_after > (1 + R->p->tolerance) * other_mean && other_after > other_src)
			continue;
		double score = fabs(want - amt) + (single ? 1e-9 * ab : 0);
		if (!best->ok || score < best->score ||
		    (score == best->score && !single && !best->transfer)) {
			*best = (struct cand){.ok = true,
			                      .range = i,
			                      .part = part,
			                      .key = key,
			                      .dst = d,
			                      .amt_b = ab,
			                      .amt_o = ao,
			                      .score = score,
			                      .transfer = !single};
		}
	}
}

static int
emit(kv_sched_decision *d, kv_sched_kind kind, kv_sched_why why, kv_bytes start, kv_bytes end,
     bool split, uint32_t from, uint32_t to, uint64_t bytes, double ops)
{
	memset(d, 0, sizeof(*d));
	d->kind = kind;
	d->why = why;
	d->split = split;
	d->from = from;
	d->to = to;
	d->bytes = bytes;
	d->ops = ops;
	if (kv_buf_set(&d->start, start.p, start.len) != 0 ||
	    kv_buf_set(&d->end, end.p, end.len) != 0) {
		kv_sched_decisions_fini(d, 1);
		return KV_ENOMEM;
	}
	return KV_OK;
}

/* One balancing step. Returns 1 with *d filled, 0 when balanced or stuck,
 * or KV_ENOMEM. */
static int
balance_step(struct round *R, kv_sched_decision *d)
{
	struct load *src = NULL;
	double worst = 1 + R->p->tolerance;
	bool ops = false;
	struct cand best = {0};

	for (size_t i = 0; i < R->nl; i++) {
		struct load *l = &R->L[i];
		double rb = R->use_bytes ? ratio(l->b, R->mb) : 0;
		double ro = R->use_ops && !l->settling ? ratio(l->o, R->mo) : 0;
		if (l->used)
			continue;
		if (rb > worst) {
			worst = rb;
			src = l;
			ops = false;
		}
		if (ro > worst) {
			worst = ro;
			src = l;
			ops = true;
		}
	}
	if (src == NULL)
		return 0;
	for (size_t i = 0; i < R->c->nranges; i++)
		if (R->c->ranges[i].node == src->id && free_range(R, i))
			consider(R, src, ops, i, &best);
	if (!best.ok) {
		src->used = true; /* nothing to do for it: look at the next one */
		return 0;
	}
	const kv_range *r = &R->c->ranges[best.range];
	kv_bytes st, en;
	piece_bounds(r, best.part, best.key, &st, &en);
	int rv = emit(d, best.transfer ? KV_SCHED_TRANSFER : KV_SCHED_MOVE,
	              ops ? KV_SCHED_WHY_OPS : KV_SCHED_WHY_BYTES, st, en, best.part != 0, src->id,
	              best.dst->id, (uint64_t)best.amt_b, best.amt_o);
	if (rv != 0)
		return rv;
	src->b -= best.amt_b;
	src->o -= best.amt_o;
	best.dst->b += best.amt_b;
	best.dst->o += best.amt_o;
	src->used = best.dst->used = true;
	if (!best.transfer)
		R->moves--;
	return 1;
}

/* Some active node leads more than KV_SCHED_COUNT_TOLERANCE above the mean
 * count of ranges; *cmin gets the lowest count. */
static bool
count_skewed(const struct round *R, uint32_t *cmin)
{
	double n = 0;
	uint32_t mx = 0;

	*cmin = UINT32_MAX;
	for (size_t i = 0; i < R->nl; i++) {
		n += R->L[i].np;
		mx = R->L[i].np > mx ? R->L[i].np : mx;
		*cmin = R->L[i].np < *cmin ? R->L[i].np : *cmin;
	}
	return R->nl >= 2 && (double)mx > (1 + KV_SCHED_COUNT_TOLERANCE) * n / (double)R->nl + 1e-9;
}

/* A piece of single range i that begins at its start (at_start) or ends at
 * its end (at_end), given to node `to`, would merge with a neighbour that
 * node owns alone (the map merges those): the counts would not change. */
static bool
merges_with_neighbour(const struct round *R, size_t i, bool at_start, bool at_end, uint32_t to)
{
	const kv_config *c = R->c;

	return (at_start && i > 0 && c->ranges[i - 1].nreplicas == 0 &&
	        c->ranges[i - 1].node == to) ||
	       (at_end && i + 1 < c->nranges && c->ranges[i + 1].nreplicas == 0 &&
	        c->ranges[i + 1].node == to);
}

struct ccand {
	bool ok;
	size_t range;
	int part; /* 0 whole, 1 below the key, 2 from the key on */
	kv_bytes key;
	struct load *src, *dst;
	double ab, ao;
	double cost; /* bytes copied */
};

/* Better: cheaper in data, then colder, then from a node leading more. */
static bool
ccand_better(const struct ccand *a, const struct ccand *b)
{
	if (!b->ok)
		return true;
	if (a->cost != b->cost)
		return a->cost < b->cost;
	if (a->ao != b->ao)
		return a->ao < b->ao;
	return a->src->np > b->src->np;
}

/*
 * The best piece of a count step for the receivers (the nodes leading cmin)
 * into *best (doc/scheduler.md "Primary counts"). loose: also the pieces
 * only this round rules out (a node in a decision already, a cool-down, a
 * migration or replacement in flight, no migration left, a transfer fence,
 * a replica outside the ISR), so that a self-split waits for them.
 */
static void
count_search(struct round *R, uint32_t cmin, bool loose, struct ccand *best)
{
	for (size_t i = 0; i < R->c->nranges; i++) {
		const kv_range *r = &R->c->ranges[i];
		const kv_sched_fig *f = &R->f[i];
		struct load *src = load_of(R, r->node);
		bool single = r->nreplicas == 0;
		bool hot = f->hot_key.len && f->hot_share >= 0.5 && f->ops > R->p->split_ops;
		struct piece pc[MAX_PIECES];
		size_t np = pieces_of(f, pc);
		double smallest = 1;
		if (src == NULL || (!loose && src->used) ||
		    !(loose ? f->known && !kv_config_pinned(R->c, kb(&r->start), kb(&r->end), false)
		            : free_range(R, i)))
			continue;
		for (size_t c = 1; c < np; c++)
			smallest = fmin(smallest, pc[c].sb);
		if (!loose && single && (R->moves == 0 || src->busy))
			continue;
		for (size_t j = 0; j < R->nl; j++) {
			struct load *dst = &R->L[j];
			if (dst == src || (!loose && dst->used) || dst->np != cmin)
				continue;
			if (!loose && single && dst->busy)
				continue;
			if (!single && !kv_range_has_replica(r, dst->id, !loose))
				continue;
			if (!single && !loose && r->fence != 0)
				continue;
			for (size_t c = 0; c < np; c++) {
				int part = pc[c].part;
				double ab = (double)f->bytes * pc[c].sb, ao = f->ops * pc[c].so;
				/* A whole range only from a node leading two more (else
				 * the counts just swap); a part from any node. */
				if (part == 0 && src->np < cmin + 2)
					continue;
				/* Cuts only in a map of fewer than COUNT_CUT_PER_NODE
				 * ranges per node: from there one range over the mean
				 * is within the tolerance, whole ranges even the counts,
				 * and no cut meets the merges (MERGE_PER_NODE). */
				if (part > 0 && R->c->nranges >= COUNT_CUT_PER_NODE * R->nl)
					continue;
				if (part > 0 && hot)
					continue;
				if (single && ab > (double)R->p->split_bytes &&
				    pc[c].sb > smallest + 1e-9)
					continue;
				/* The piece's size is an estimate (split keys, decayed
				 * rates): with COUNT_MARGIN on it a count step does not
				 * start a bytes or ops step by a few bytes. */
				if (R->use_bytes && ab > 0 &&
				    dst->b + COUNT_MARGIN * ab > (1 + R->p->tolerance) * R->mb)
					continue;
				if (R->use_ops && ao > 0 &&
				    dst->o + COUNT_MARGIN * ao > (1 + R->p->tolerance) * R->mo)
					continue;
				if (single &&
				    merges_with_neighbour(R, i, part != 2, part != 1, dst->id))
					continue;
				struct ccand cand = {.ok = true,
				                     .range = i,
				                     .part = part,
				                     .key = pc[c].key,
				                     .src = src,
				                     .dst = dst,
				                     .ab = ab,
				                     .ao = ao,
				                     .cost = single      ? ab
				                             : part == 0 ? 0
				                                         : (double)f->bytes};
				if (ccand_better(&cand, best))
					*best = cand;
			}
		}
	}
}

/*
 * The self-split of a count step (doc/scheduler.md "Primary counts"): no
 * piece fits any receiver, so the receiver dst cuts its own largest
 * replicated range at its middle byte split key; both parts keep the
 * replica set, the ISR and the primary (the upper part takes a new leader
 * epoch when published), so no node's bytes or ops change and dst leads
 * one range more. Only a range the planner may touch (free_range), not
 * hot, with every replica in sync (a copy in progress would start again),
 * no transfer fence and byte split keys; never a single range (the map
 * merges single neighbours on one node). Returns 1 with *d filled, 0 when
 * dst has no such range, or KV_ENOMEM.
 */
static int
self_split(struct round *R, struct load *dst, kv_sched_decision *d)
{
	long best = -1;

	for (size_t i = 0; i < R->c->nranges; i++) {
		const kv_range *r = &R->c->ranges[i];
		const kv_sched_fig *f = &R->f[i];
		bool hot = f->hot_key.len && f->hot_share >= 0.5 && f->ops > R->p->split_ops;
		if (r->node != dst->id || r->nreplicas < 2 || r->ninsync != r->nreplicas ||
		    r->fence != 0 || f->nq == 0 || hot || !free_range(R, i))
			continue;
		if (best < 0 || f->bytes > R->f[best].bytes)
			best = (long)i;
	}
	if (best < 0)
		return 0;
	const kv_range *r = &R->c->ranges[best];
	const kv_sched_fig *f = &R->f[best];
	kv_bytes key = f->q[f->nq / 2];
	double sb = share_below(key, f->q, f->nq);
	int rv = emit(d, KV_SCHED_SPLIT, KV_SCHED_WHY_PRIMARIES, key, kb(&r->end), true, dst->id,
	              dst->id, (uint64_t)((double)f->bytes * (1 - sb)), f->ops * (1 - sb));
	if (rv != 0)
		return rv;
	dst->np++;
	dst->used = true;
	return 1;
}

/*
 * One count step (doc/scheduler.md "Primary counts"): the node leading the
 * fewest ranges (dst, not in a decision of this round) gets either a whole
 * range of a node leading at least two more, or a part of a range of any
 * other node (the range is cut: the source keeps its count, dst gains one,
 * the map one range). The piece must keep dst within the tolerance of the
 * mean in bytes and ops (those keep priority), and the cheapest in data
 * wins: a transfer of a whole replicated range copies nothing, a move
 * copies the piece, a cut replicated range has its replicas copied again
 * (counted as the range's bytes). Returns 1 with *d filled, 0 when there is
 * nothing to do, or KV_ENOMEM.
 */
static int
count_step(struct round *R, kv_sched_decision *d)
{
	uint32_t cmin;
	struct ccand best = {0};

	if (!count_skewed(R, &cmin))
		return 0;
	count_search(R, cmin, false, &best);
	if (!best.ok) {
		/* Nothing fits any receiver: a self-split, under the same cap as
		 * the count cuts (it adds a range too), unless a piece would fit
		 * but for this round (a node already in a decision, a cool-down, a
		 * migration, a fence): that one is taken in a later round. */
		if (R->c->nranges >= COUNT_CUT_PER_NODE * R->nl)
			return 0;
		count_search(R, cmin, true, &best);
		if (best.ok)
			return 0;
		for (size_t j = 0; j < R->nl; j++) {
			struct load *dst = &R->L[j];
			int rv;
			if (dst->used || dst->np != cmin)
				continue;
			if ((rv = self_split(R, dst, d)) != 0)
				return rv;
		}
		return 0;
	}
	const kv_range *r = &R->c->ranges[best.range];
	kv_bytes st, en;
	piece_bounds(r, best.part, best.key, &st, &en);
	bool single = r->nreplicas == 0;
	int rv = emit(d, single ? KV_SCHED_MOVE : KV_SCHED_TRANSFER, KV_SCHED_WHY_PRIMARIES, st, en,
	              best.part != 0, best.src->id, best.dst->id, (uint64_t)best.ab, best.ao);
	if (rv != 0)
		return rv;
	best.src->b -= best.ab;
	best.src->o -= best.ao;
	best.dst->b += best.ab;
	best.dst->o += best.ao;
	if (best.part == 0)
		best.src->np--;
	best.dst->np++;
	best.src->used = best.dst->used = true;
	if (single)
		R->moves--;
	return 1;
}

/* Node id's load figures settle from now on (its led ranges change). */
static void
settle_mark(kv_sched *s, uint32_t id, uint64_t now)
{
	size_t i = 0;

	while (i < s->nsettle && s->settle[i].id != id)
		i++;
	if (i == s->nsettle) {
		if (s->nsettle == MAX_NODES)
			return; /* more nodes than a round counts */
		s->nsettle++;
	}
	s->settle[i] = (struct settle){.id = id, .until = now + LOAD_SETTLE_MS};
}

/* Fills the loads and the means; false when fewer than two active nodes. */
static bool
round_init(struct round *R)
{
	const kv_config *c = R->c;
	double tb = 0, to = 0;

	for (size_t i = 0; i < c->nnodes && R->nl < MAX_NODES; i++)
		if (c->nodes[i].state == KV_NODE_ACTIVE)
			R->L[R->nl++] = (struct load){.id = c->nodes[i].id};
	for (size_t i = 0; i < R->s->nsettle; i++) {
		struct load *l = load_of(R, R->s->settle[i].id);
		if (l != NULL)
			l->settling = true;
	}
	for (size_t i = 0; i < c->nranges; i++) {
		struct load *l = load_of(R, c->ranges[i].node);
		tb += (double)R->f[i].bytes;
		to += R->f[i].ops;
		if (l != NULL) {
			l->b += (double)R->f[i].bytes;
			l->o += R->f[i].ops;
			l->np++;
		}
	}
	for (size_t i = 0; i < c->nmigs; i++) {
		struct load *a = load_of(R, c->migs[i].from), *b = load_of(R, c->migs[i].to);
		if (a != NULL)
			a->busy = true;
		if (b != NULL)
			b->busy = true;
	}
	R->moves = R->p->max_migrations > c->nmigs ? R->p->max_migrations - (uint32_t)c->nmigs : 0;
	if (R->nl < 2)
		return false;
	/* A range without figures (a heartbeat late, a leader that just took
	 * over) would look empty and draw data to its node: no balancing until
	 * every range is known, but for those a migration is bringing in (the
	 * destination reports them once they arrive). */
	for (size_t i = 0; i < c->nranges; i++)
		if (!R->f[i].known && !migrating(c, &c->ranges[i]))
			return false;
	R->mb = tb / (double)R->nl;
	R->mo = to / (double)R->nl;
	/* Load below a tenth of --split-ops per node is noise, not work. */
	R->use_ops = R->mo > R->p->split_ops / 10;
	/* Nor is data below a sixteenth of --split-bytes, or 1 MiB, per node. */
	R->use_bytes = R->mb > (double)kv_sched_bytes_floor(R->p);
	return true;
}

/* Advances the hot windows (commit) and marks the sustained ones. */
static int
hot_windows(struct round *R, bool commit)
{
	kv_sched *s = R->s;

	for (size_t i = 0; i < R->c->nranges; i++) {
		const kv_range *r = &R->c->ranges[i];
		struct span *h = hot_find(&s->hot, r);
		bool hot = R->f[i].known && R->f[i].ops > R->p->split_ops;
		if (hot && h == NULL && commit) {
			if (list_add(&s->hot, kb(&r->start), kb(&r->end), R->now) != 0)
				return KV_ENOMEM;
			h = &s->hot.v[s->hot.n - 1];
		}
		R->hotsus[i] = hot && h != NULL && R->now - h->until >= R->p->sustain_ms;
	}
	if (commit) /* forget windows of ranges that cooled or are gone */
		for (size_t i = 0; i < s->hot.n;) {
			long j = kv_config_find_range(R->c, s->hot.v[i].start.data,
			                              s->hot.v[i].start.len);
			const kv_range *r = j >= 0 ? &R->c->ranges[j] : NULL;
			if (r == NULL || hot_find(&s->hot, r) != &s->hot.v[i] ||
			    !(R->f[j].known && R->f[j].ops > R->p->split_ops))
				list_del(&s->hot, i);
			else
				i++;
		}
	return KV_OK;
}

int
kv_sched_plan(kv_sched *s, const kv_config *cfg, const kv_sched_fig *figs, const kv_sched_params *p,
              uint64_t now_ms, bool commit, kv_sched_decision *out, size_t cap, size_t *n)
{
	struct round *R = calloc(1, sizeof(*R));
	size_t k = 0;
	int rv = KV_OK;

	*n = 0;
	if (R == NULL || (R->hotsus = calloc(cfg->nranges + 1, sizeof(bool))) == NULL) {
		free(R);
		return KV_ENOMEM;
	}
	R->c = cfg;
	R->f = figs;
	R->p = p;
	R->s = s;
	R->now = now_ms;
	for (size_t i = 0; i < s->cool.n;) /* expired cool-downs */
		if (s->cool.v[i].until <= now_ms)
			list_del(&s->cool, i);
		else
			i++;
	for (size_t i = 0; commit && i < s->rep.n;)
		if (s->rep.v[i].until <= now_ms)
			list_del(&s->rep, i);
		else
			i++;
	for (size_t i = 0; i < s->nsettle;) /* settled nodes */
		if (s->settle[i].until <= now_ms)
			s->settle[i] = s->settle[--s->nsettle];
		else
			i++;
	if ((rv = hot_windows(R, commit)) != 0)
		goto out;
	/* 1. Hot single keys: reported. */
	for (size_t i = 0; i < cfg->nranges && k < cap; i++) {
		const kv_range *r = &cfg->ranges[i];
		bool told = false;
		if (!R->hotsus[i] || figs[i].hot_key.len == 0 || figs[i].hot_share < 0.5)
			continue;
		for (size_t j = 0; j < s->rep.n && !told; j++)
			told = kv_key_cmp(s->rep.v[j].start.data, s->rep.v[j].start.len,
			                  figs[i].hot_key.p, figs[i].hot_key.len) == 0;
		if (told)
			continue;
		if ((rv = emit(&out[k], KV_SCHED_HOT, KV_SCHED_WHY_HOTKEY, figs[i].hot_key,
		               figs[i].hot_key, false, r->node, r->node, 0,
		               figs[i].ops * figs[i].hot_share)) != 0)
			goto out;
		k++;
	}
	if (!round_init(R))
		goto out;
	/* 2. Balancing steps. */
	size_t nbal = k; /* decisions before them (hot-key reports) */
	while (k < cap) {
		rv = balance_step(R, &out[k]);
		if (rv < 0)
			goto out;
		if (rv == 1) {
			k++;
			continue;
		}
		/* Nothing for the worst node: is there another one to look at? */
		bool more = false;
		for (size_t i = 0; i < R->nl; i++)
			more = more ||
			       (!R->L[i].used &&
			        ((R->use_bytes && ratio(R->L[i].b, R->mb) > 1 + p->tolerance) ||
			         (R->use_ops && !R->L[i].settling &&
			          ratio(R->L[i].o, R->mo) > 1 + p->tolerance)));
		if (!more)
			break;
	}
	rv = KV_OK;
	/* 3. Primary counts: only once no node is above the tolerance in bytes
	 * or ops (those keep priority: while data or load still moves, as
	 * during a load, the counts it leaves are not final), and only where
	 * there is data or load worth balancing (a young cluster's empty
	 * ranges stay where they are). */
	bool even = (R->use_bytes || R->use_ops) && k == nbal;
	for (size_t i = 0; i < R->nl; i++)
		even = even && !(R->use_ops && R->L[i].settling) &&
		       !((R->use_bytes && ratio(R->L[i].b, R->mb) > 1 + p->tolerance) ||
		         (R->use_ops && ratio(R->L[i].o, R->mo) > 1 + p->tolerance));
	while (k < cap && even) {
		rv = count_step(R, &out[k]);
		if (rv < 0)
			goto out;
		if (rv == 0)
			break;
		k++;
	}
	rv = KV_OK;
	/* 4. Merges of small cold single neighbours. */
	/* Only a map with more than MERGE_PER_NODE ranges per active node
	 * merges: a few ranges cost nothing, and a young cluster's first
	 * ranges stay where a join put them. */
	for (size_t i = 0; cfg->nranges > MERGE_PER_NODE * R->nl && i + 1 < cfg->nranges &&
	                   k < cap && R->moves > 0;
	     i++) {
		const kv_range *a = &cfg->ranges[i], *b = &cfg->ranges[i + 1];
		if (a->nreplicas || b->nreplicas || a->node == b->node || !free_range(R, i) ||
		    !free_range(R, i + 1))
			continue;
		if ((double)(figs[i].bytes + figs[i + 1].bytes) >= (double)p->split_bytes / 4 ||
		    figs[i].ops + figs[i + 1].ops >= p->split_ops / 4)
			continue;
		size_t small = figs[i].bytes <= figs[i + 1].bytes ? i : i + 1;
		size_t big = small == i ? i + 1 : i;
		struct load *from = load_of(R, cfg->ranges[small].node);
		struct load *to = load_of(R, cfg->ranges[big].node);
		if (from == NULL || to == NULL || from->used || to->used || from->busy || to->busy)
			continue;
		if (R->use_bytes &&
		    to->b + (double)figs[small].bytes > (1 + p->tolerance) * R->mb &&
		    figs[small].bytes > 0)
			continue;
		const kv_range *r = &cfg->ranges[small];
		if ((rv = emit(&out[k], KV_SCHED_MERGE, KV_SCHED_WHY_COLD, kb(&r->start),
		               kb(&r->end), false, from->id, to->id, figs[small].bytes,
		               figs[small].ops)) != 0)
			goto out;
		from->b -= (double)figs[small].bytes;
		to->b += (double)figs[small].bytes;
		from->used = to->used = true;
		R->moves--;
		k++;
	}
out:
	if (rv == KV_OK && commit)
		for (size_t i = 0; i < k && rv == KV_OK; i++) {
			rv = list_add(out[i].kind == KV_SCHED_HOT ? &s->rep : &s->cool,
			              kb(&out[i].start), kb(&out[i].end), now_ms + p->cooldown_ms);
			if (out[i].kind != KV_SCHED_HOT) {
				settle_mark(s, out[i].from, now_ms);
				settle_mark(s, out[i].to, now_ms);
			}
		}
	if (rv != KV_OK) {
		kv_sched_decisions_fini(out, k);
		k = 0;
	}
	*n = k;
	free(R->hotsus);
	free(R);
	return rv;
}
