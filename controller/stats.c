/*
 * stats.c - live statistics of the shard servers, from their heartbeats:
 * totals per node and, per range, its bytes and split keys, which
 * placement uses to cut ranges by data size (kv_ctl__points_locked).
 *
 * Statistics are not durable and not replicated: a new leader or a
 * restarted controller knows nothing until the servers report again (at
 * most a second). A node's entry is replaced as a whole by its next
 * heartbeat; its key bytes live in one blob the entry owns.
 */
#include "common/err.h"
#include "common/log.h"
#include "controller/controller_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ctl_stat *
kv_ctl__stat_find_locked(kv_controller *c, uint32_t id, bool create)
{
	struct ctl_stat *s;

	for (size_t i = 0; i < c->nstats; i++)
		if (c->stats[i].id == id)
			return &c->stats[i];
	if (!create)
		return NULL;
	s = realloc(c->stats, (c->nstats + 1) * sizeof(*s));
	if (s == NULL)
		return NULL;
	c->stats = s;
	s = &c->stats[c->nstats++];
	memset(s, 0, sizeof(*s));
	s->id = id;
	return s;
}

void
kv_ctl__stat_clear(struct ctl_stat *s)
{
	free(s->ranges);
	free(s->splits);
	free(s->blob);
	s->ranges = NULL;
	s->splits = NULL;
	s->blob = NULL;
	s->nranges = 0;
}

static kv_bytes
blob_put(uint8_t **w, kv_bytes b)
{
	kv_bytes r = {*w, b.len};
	if (b.len)
		memcpy(*w, b.p, b.len);
	*w += b.len;
	return r;
}

/* Copies a heartbeat's per-range statistics into s. */
int
kv_ctl__stat_store(struct ctl_stat *s, const kv_admin_req *rq)
{
	size_t bytes = 0, nsplit = 0;
	kv_admin_range_stat *r = NULL;
	kv_bytes *sp = NULL;
	uint8_t *blob = NULL, *w;

	for (size_t i = 0; i < rq->nranges; i++) {
		bytes += rq->ranges[i].start.len + rq->ranges[i].end.len +
		         rq->ranges[i].load_split.len + rq->ranges[i].hot_key.len;
		nsplit += rq->ranges[i].nsplit + rq->ranges[i].nlsplit;
		for (size_t j = 0; j < rq->ranges[i].nsplit; j++)
			bytes += rq->ranges[i].split[j].len;
		for (size_t j = 0; j < rq->ranges[i].nlsplit; j++)
			bytes += rq->ranges[i].lsplit[j].len;
	}
	if ((rq->nranges && (r = calloc(rq->nranges, sizeof(*r))) == NULL) ||
	    (nsplit && (sp = calloc(nsplit, sizeof(*sp))) == NULL) ||
	    (blob = malloc(bytes ? bytes : 1)) == NULL) {
		free(r);
		free(sp);
		return KV_ENOMEM;
	}
	w = blob;
	nsplit = 0;
	for (size_t i = 0; i < rq->nranges; i++) {
		r[i] = rq->ranges[i];
		r[i].start = blob_put(&w, rq->ranges[i].start);
		r[i].end = blob_put(&w, rq->ranges[i].end);
		r[i].load_split = blob_put(&w, rq->ranges[i].load_split);
		r[i].hot_key = blob_put(&w, rq->ranges[i].hot_key);
		r[i].split = sp != NULL ? sp + nsplit : NULL; /* no splits at all: sp is NULL */
		for (size_t j = 0; j < rq->ranges[i].nsplit; j++)
			sp[nsplit++] = blob_put(&w, rq->ranges[i].split[j]);
		r[i].lsplit = rq->ranges[i].nlsplit ? sp + nsplit : NULL;
		for (size_t j = 0; j < rq->ranges[i].nlsplit; j++)
			sp[nsplit++] = blob_put(&w, rq->ranges[i].lsplit[j]);
	}
	kv_ctl__stat_clear(s);
	s->ranges = r;
	s->nranges = rq->nranges;
	s->splits = sp;
	s->blob = blob;
	return KV_OK;
}

/*
 * Builds the data samples for placement: for every range a node reported,
 * its bytes spread evenly over its start and split keys, keeping only the
 * samples in key space the reporter serves in cur (so a range reported by a
 * source and a destination is not counted twice). The caller frees *out;
 * the keys borrow from c->stats.
 */
int
kv_ctl__points_locked(kv_controller *c, const kv_config *cur, kv_place_point **out, size_t *n)
{
	size_t cap = 0, k = 0;
	kv_place_point *pts;

	for (size_t i = 0; i < c->nstats; i++)
		for (size_t j = 0; j < c->stats[i].nranges; j++)
			cap += 1 + c->stats[i].ranges[j].nsplit;
	pts = calloc(cap ? cap : 1, sizeof(*pts));
	if (pts == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < c->nstats; i++) {
		const struct ctl_stat *s = &c->stats[i];
		for (size_t j = 0; j < s->nranges; j++) {
			const kv_admin_range_stat *r = &s->ranges[j];
			uint64_t each = r->bytes / (r->nsplit + 1);
			if (r->bytes == 0)
				continue;
			for (size_t q = 0; q <= r->nsplit; q++) {
				kv_bytes key = q == 0 ? r->start : r->split[q - 1];
				if (kv_config_route(cur, key.p, key.len) != s->id)
					continue;
				pts[k].key = key;
				pts[k].bytes = each ? each : 1;
				k++;
			}
		}
	}
	*out = pts;
	*n = k;
	return KV_OK;
}

/* Compares two range ends, an empty one being the end of the key space. */
static int
end_cmp(kv_bytes a, kv_bytes b)
{
	if (a.len == 0 || b.len == 0)
		return (a.len == 0) - (b.len == 0);
	return kv_key_cmp(a.p, a.len, b.p, b.len);
}

void
kv_ctl__estimate_locked(kv_controller *c, uint32_t node, kv_bytes start, kv_bytes end,
                        uint64_t *keys, uint64_t *bytes)
{
	const struct ctl_stat *s = kv_ctl__stat_find_locked(c, node, false);

	*keys = *bytes = 0;
	for (size_t i = 0; s != NULL && i < s->nranges; i++) {
		const kv_admin_range_stat *r = &s->ranges[i];
		uint64_t np = r->nsplit + 1;
		for (size_t q = 0; q <= r->nsplit; q++) {
			kv_bytes a = q == 0 ? r->start : r->split[q - 1];
			kv_bytes b = q == r->nsplit ? r->end : r->split[q];
			/* The piece [a, b) holds an even share of the range (the last
			 * one the remainder). */
			uint64_t k = r->keys / np, y = r->bytes / np;
			if (q == r->nsplit) {
				k = r->keys - k * r->nsplit;
				y = r->bytes - y * r->nsplit;
			}
			bool overlaps =
			    (end.len == 0 || kv_key_cmp(a.p, a.len, end.p, end.len) < 0) &&
			    (b.len == 0 || kv_key_cmp(start.p, start.len, b.p, b.len) < 0);
			if (!overlaps)
				continue;
			/* Inside [start, end): all of it; cut by an end: about half. */
			bool inside =
			    kv_key_cmp(a.p, a.len, start.p, start.len) >= 0 && end_cmp(b, end) <= 0;
			*keys += inside ? k : k / 2;
			*bytes += inside ? y : y / 2;
		}
	}
}

/* Whether k is strictly inside [start, end). */
static bool
strictly_in(kv_bytes k, kv_bytes start, kv_bytes end)
{
	return k.len && kv_key_cmp(k.p, k.len, start.p, start.len) > 0 &&
	       (end.len == 0 || kv_key_cmp(k.p, k.len, end.p, end.len) < 0);
}

/* The larger of two range starts / the smaller of two range ends. */
static kv_bytes
max_start(kv_bytes a, kv_bytes b)
{
	return kv_key_cmp(a.p, a.len, b.p, b.len) >= 0 ? a : b;
}
static kv_bytes
min_end(kv_bytes a, kv_bytes b)
{
	return end_cmp(a, b) <= 0 ? a : b;
}

/* Up to KV_SCHED_QUANTS of keys[0..n) (in key order), evenly chosen, into
 * out (*nout of them). */
static void
pick_even(const kv_bytes *keys, size_t n, kv_bytes *out, size_t *nout)
{
	*nout = 0;
	for (size_t t = 0; t < KV_SCHED_QUANTS && n > 0; t++) {
		size_t at = n <= KV_SCHED_QUANTS ? t : (t + 1) * n / (KV_SCHED_QUANTS + 1);
		if (at >= n)
			break;
		out[(*nout)++] = keys[at];
	}
}

void
kv_ctl__figs_locked(kv_controller *c, const kv_config *cur, uint64_t fresh_ns, kv_sched_fig *f)
{
	uint64_t now = kv_now_ns();

	for (size_t i = 0; i < cur->nranges; i++) {
		const kv_range *r = &cur->ranges[i];
		const struct ctl_stat *s = kv_ctl__stat_find_locked(c, r->node, false);
		kv_bytes rs = {r->start.data, r->start.len}, re = {r->end.data, r->end.len};
		kv_bytes keys[64], lkeys[64];
		size_t nk = 0, nl = 0;
		uint64_t k;

		memset(&f[i], 0, sizeof(f[i]));
		if (s == NULL || s->stats_ns == 0 || now - s->stats_ns > fresh_ns)
			continue;
		for (size_t j = 0; j < s->nranges; j++) {
			const kv_admin_range_stat *q = &s->ranges[j];
			if (!((re.len == 0 ||
			       kv_key_cmp(q->start.p, q->start.len, re.p, re.len) < 0) &&
			      (q->end.len == 0 ||
			       kv_key_cmp(rs.p, rs.len, q->end.p, q->end.len) < 0)))
				continue;
			uint64_t in = 0;
			f[i].known = true;
			kv_ctl__estimate_locked(c, r->node, max_start(rs, q->start),
			                        min_end(re, q->end), &k, &in);
			f[i].bytes += in;
			f[i].ops +=
			    q->bytes ? q->ops * (in < q->bytes ? (double)in / (double)q->bytes : 1)
			             : q->ops;
			for (size_t t = 0; t < q->nsplit && nk < 64; t++)
				if (strictly_in(q->split[t], rs, re))
					keys[nk++] = q->split[t];
			for (size_t t = 0; t < q->nlsplit && nl < 64; t++)
				if (strictly_in(q->lsplit[t], rs, re))
					lkeys[nl++] = q->lsplit[t];
			if (strictly_in(q->load_split, rs, re))
				f[i].load_key = q->load_split;
			if (q->hot_key.len &&
			    (strictly_in(q->hot_key, rs, re) ||
			     kv_key_cmp(q->hot_key.p, q->hot_key.len, rs.p, rs.len) == 0)) {
				f[i].hot_key = q->hot_key;
				f[i].hot_share = q->hot_share;
			}
		}
		/* Up to KV_SCHED_QUANTS of the split keys inside, evenly chosen:
		 * the eighths when the range is one reported range. */
		pick_even(keys, nk, f[i].q, &f[i].nq);
		/* The same of the load split keys (an older server reports none:
		 * the planner then cuts at the load split key alone). */
		pick_even(lkeys, nl, f[i].lq, &f[i].nlq);
	}
}
