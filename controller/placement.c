/*
 * placement.c - range placement (placement.h).
 *
 * DESIGN. Every plan works on "atoms": the key space cut at every range and
 * migration boundary and at every data sample (or, with no data, at keys
 * interpolated in the key-space measure), so that each atom has one owner,
 * one weight, and is either wholly inside a migration in flight (locked) or
 * wholly outside. A plan only changes the owner of unlocked atoms; the new
 * range map is the atoms merged by owner, and every maximal run of atoms that
 * changed from owner A to owner B becomes one migration. The invariant: a
 * plan never touches a range that is moving, and the result passes
 * kv_config_validate().
 *
 * Work is bounded: at most KV_PLACE_MAX_STEPS chunks per command, each chosen
 * in one pass over the atoms.
 */
#include "controller/placement.h"
#include "common/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Atoms per range in the key-space measure when no data is known. */
#define WIDTH_CUTS 64
/* Weight of the whole key space in the key-space measure. */
#define WIDTH_SCALE 1e12

struct atom {
	kv_buf key;   /* start of the atom; its end is the next atom's key */
	uint64_t w;   /* weight (bytes, or key-space width) */
	uint32_t old; /* owner in the current map */
	uint32_t now; /* owner in the plan */
	bool locked;  /* inside a migration in flight */
};

struct plan {
	struct atom *a; /* sorted by key, a[0].key is "" */
	size_t n;       /* atoms */
	bool bytes;     /* weights are bytes (true) or key-space width (false) */
};

static void say(kv_place_ctx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
say(kv_place_ctx *x, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(x->msg, sizeof(x->msg), fmt, ap);
	va_end(ap);
}

void
kv_place_fmt_key(const void *key, size_t len, char *buf, size_t buflen)
{
	const uint8_t *k = key;
	size_t o = 0;

	if (buflen == 0)
		return;
	buf[0] = '\0';
	if (o + 1 < buflen)
		buf[o++] = '"';
	for (size_t i = 0; i < len && o + 6 < buflen; i++) {
		if (k[i] >= 0x20 && k[i] < 0x7f && k[i] != '"' && k[i] != '\\')
			buf[o++] = (char)k[i];
		else
			o += (size_t)snprintf(buf + o, buflen - o, "\\x%02x", k[i]);
	}
	if (o + 1 < buflen)
		buf[o++] = '"';
	buf[o < buflen ? o : buflen - 1] = '\0';
}

/* ---- key-space measure ---- */

static double
key_pos(const uint8_t *k, size_t n)
{
	double x = 0, scale = 1.0 / 95;

	for (size_t i = 0; i < 6 && i < n; i++) {
		unsigned b = k[i] < 0x20 ? 0x20 : k[i] > 0x7e ? 0x7e : k[i];
		x += (double)(b - 0x20) * scale;
		scale /= 95;
	}
	return x;
}

static double
end_pos(const uint8_t *k, size_t n)
{
	return n == 0 ? 1.0 : key_pos(k, n);
}

static size_t
key_at(double x, uint8_t out[8])
{
	size_t n = 0;

	for (int i = 0; i < 6; i++) {
		double d;
		x *= 95;
		d = floor(x);
		if (d > 94)
			d = 94;
		if (d < 0)
			d = 0;
		out[n++] = (uint8_t)(0x20 + (int)d);
		x -= d;
	}
	while (n > 0 && out[n - 1] == 0x20)
		n--;
	return n;
}

static bool
strictly_inside(const uint8_t *k, size_t n, kv_bytes s, kv_bytes e)
{
	if (kv_key_cmp(k, n, s.p, s.len) <= 0)
		return false;
	return e.len == 0 || kv_key_cmp(k, n, e.p, e.len) < 0;
}

bool
kv_place_midpoint(kv_bytes start, kv_bytes end, uint8_t *out, size_t *outlen)
{
	double a = key_pos(start.p, start.len), b = end_pos(end.p, end.len);
	size_t n;

	if (!(b > a))
		return false;
	n = key_at(a + (b - a) / 2, out);
	if (n == 0 || !strictly_inside(out, n, start, end))
		return false;
	*outlen = n;
	return true;
}

/* ---- atoms ---- */

static kv_bytes
kb(const kv_buf *b)
{
	kv_bytes r = {b->data, b->len};
	return r;
}

struct cuts {
	kv_buf *k; /* owned keys */
	size_t n, cap;
};

static int
cuts_add(struct cuts *c, const void *p, size_t n)
{
	if (c->n == c->cap) {
		size_t cap = c->cap ? c->cap * 2 : 64;
		kv_buf *k = realloc(c->k, cap * sizeof(*k));
		if (k == NULL)
			return KV_ENOMEM;
		c->k = k;
		c->cap = cap;
	}
	memset(&c->k[c->n], 0, sizeof(kv_buf));
	if (n && kv_buf_set(&c->k[c->n], p, n) != KV_OK)
		return KV_ENOMEM;
	c->n++;
	return KV_OK;
}

static int
buf_cmp(const void *a, const void *b)
{
	const kv_buf *x = a, *y = b;
	return kv_key_cmp(x->data, x->len, y->data, y->len);
}

static void
plan_free(struct plan *pl)
{
	for (size_t i = 0; i < pl->n; i++)
		kv_buf_fini(&pl->a[i].key);
	free(pl->a);
	pl->a = NULL;
	pl->n = 0;
}

static bool
is_locked(const kv_config *c, const kv_buf *k)
{
	for (size_t i = 0; i < c->nmigs; i++) {
		const kv_migration *m = &c->migs[i];
		if (kv_range_contains(m->start.data, m->start.len, m->end.data, m->end.len, k->data,
		                      k->len))
			return true;
	}
	return false;
}

/* Index of the atom containing key (the last atom whose key <= key). */
static size_t
atom_find(const struct plan *pl, const void *key, size_t klen)
{
	size_t lo = 0, hi = pl->n;

	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		if (kv_key_cmp(pl->a[mid].key.data, pl->a[mid].key.len, key, klen) <= 0)
			lo = mid;
		else
			hi = mid;
	}
	return lo;
}

static bool
has_bytes(const kv_place_ctx *x)
{
	for (size_t i = 0; x->points && i < x->npoints; i++)
		if (x->points[i].bytes > 0)
			return true;
	return false;
}

/*
 * Cuts the key space of a config with a non-empty map into atoms. `extra`
 * (may be NULL) adds two more cut keys (move's bounds). With width, the
 * key-space measure is used even when samples carry bytes.
 */
static int
plan_build_mode(const kv_config *c, const kv_place_ctx *x, const kv_bytes *extra, bool width,
                struct plan *pl)
{
	struct cuts cu = {0};
	int rv = KV_ENOMEM;

	memset(pl, 0, sizeof(*pl));
	pl->bytes = !width && has_bytes(x);
	for (size_t i = 0; i < c->nranges; i++) {
		const kv_range *r = &c->ranges[i];
		if (cuts_add(&cu, r->start.data, r->start.len) != KV_OK)
			goto out;
		if (pl->bytes)
			continue;
		double a = key_pos(r->start.data, r->start.len),
		       b = end_pos(r->end.data, r->end.len);
		for (int j = 1; b > a && j < WIDTH_CUTS; j++) {
			uint8_t k[8];
			size_t n = key_at(a + (b - a) * j / WIDTH_CUTS, k);
			if (n && strictly_inside(k, n, kb(&r->start), kb(&r->end)) &&
			    cuts_add(&cu, k, n) != KV_OK)
				goto out;
		}
	}
	for (size_t i = 0; i < c->nmigs; i++) {
		if (cuts_add(&cu, c->migs[i].start.data, c->migs[i].start.len) != KV_OK)
			goto out;
		if (c->migs[i].end.len &&
		    cuts_add(&cu, c->migs[i].end.data, c->migs[i].end.len) != KV_OK)
			goto out;
	}
	for (size_t i = 0; extra && i < 2; i++)
		if (extra[i].len && cuts_add(&cu, extra[i].p, extra[i].len) != KV_OK)
			goto out;
	for (size_t i = 0; pl->bytes && i < x->npoints; i++)
		if (x->points[i].key.len &&
		    cuts_add(&cu, x->points[i].key.p, x->points[i].key.len) != KV_OK)
			goto out;
	qsort(cu.k, cu.n, sizeof(kv_buf), buf_cmp);
	pl->a = calloc(cu.n ? cu.n : 1, sizeof(struct atom));
	if (pl->a == NULL)
		goto out;
	for (size_t i = 0; i < cu.n; i++) {
		if (pl->n > 0 && buf_cmp(&pl->a[pl->n - 1].key, &cu.k[i]) == 0) {
			kv_buf_fini(&cu.k[i]);
			continue;
		}
		struct atom *t = &pl->a[pl->n++];
		t->key = cu.k[i];
		memset(&cu.k[i], 0, sizeof(kv_buf));
		long ri = kv_config_find_range(c, t->key.data, t->key.len);
		t->old = t->now = ri < 0 ? 0 : c->ranges[ri].node;
		/* A replicated range never changes hands through a migration
		 * (replacements and transfers instead): plans leave it where it
		 * is. */
		t->locked = is_locked(c, &t->key) || (ri >= 0 && c->ranges[ri].nreplicas > 0);
	}
	for (size_t i = 0; i < pl->n; i++) {
		if (pl->bytes)
			break;
		double a = key_pos(pl->a[i].key.data, pl->a[i].key.len);
		double b =
		    i + 1 < pl->n ? key_pos(pl->a[i + 1].key.data, pl->a[i + 1].key.len) : 1.0;
		pl->a[i].w = b > a ? (uint64_t)((b - a) * WIDTH_SCALE) : 0;
	}
	for (size_t i = 0; pl->bytes && i < x->npoints; i++) {
		size_t j = atom_find(pl, x->points[i].key.p, x->points[i].key.len);
		pl->a[j].w += x->points[i].bytes;
	}
	rv = KV_OK;
out:
	for (size_t i = 0; i < cu.n; i++)
		kv_buf_fini(&cu.k[i]);
	free(cu.k);
	if (rv != KV_OK)
		plan_free(pl);
	return rv;
}

static int
plan_build(const kv_config *c, const kv_place_ctx *x, const kv_bytes *extra, struct plan *pl)
{
	return plan_build_mode(c, x, extra, false, pl);
}

static kv_node *
node_mut(kv_config *c, uint32_t id)
{
	return (kv_node *)kv_config_node(c, id);
}

static bool
eligible(const kv_node *n)
{
	return n != NULL && (n->state == KV_NODE_ACTIVE || n->state == KV_NODE_JOINING);
}

/* Copies a range's placement (primary, replica set, ISR, leader epoch),
 * not its bounds. */
static void
place_copy(kv_range *dst, const kv_range *src)
{
	dst->node = src->node;
	dst->nreplicas = src->nreplicas;
	dst->ninsync = src->ninsync;
	memcpy(dst->replicas, src->replicas, sizeof(dst->replicas));
	memcpy(dst->insync, src->insync, sizeof(dst->insync));
	dst->leader_epoch = src->leader_epoch;
	dst->nreplacing = src->nreplacing;
	memcpy(dst->replacing, src->replacing, sizeof(dst->replacing));
	memcpy(dst->replaced, src->replaced, sizeof(dst->replaced));
	dst->fence = src->fence;
}

/* Whether adjacent ranges a and b are one: two single ranges of the same
 * primary (the larger leader epoch is kept, so none goes down), or the
 * same placement. */
static bool
mergeable(const kv_range *a, const kv_range *b)
{
	if (a->nreplicas == 0 && b->nreplicas == 0)
		return a->node == b->node;
	return kv_range_same_placement(a, b);
}

/*
 * Rewrites n's range map from the plan and, unless revert, appends one
 * migration per run of atoms that changed owner. An atom that keeps its
 * owner keeps its range's replica set and ISR. Returns the number of new
 * migrations or KV_ENOMEM.
 */
static int
plan_apply(const struct plan *pl, kv_config *n, kv_place_ctx *x, bool revert)
{
	kv_range *r = calloc(pl->n ? pl->n : 1, sizeof(*r));
	size_t nr = 0, newm = 0;

	if (r == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < pl->n; i++) {
		/* The leader epoch (config.h) stays while an atom keeps its owner
		 * and becomes this epoch where the owner changes; a merged range
		 * takes the largest, so no key's leader epoch goes down. */
		kv_range v;
		memset(&v, 0, sizeof(v));
		kv_range_set_single(&v, pl->a[i].now);
		v.leader_epoch = n->epoch;
		if (pl->a[i].old == pl->a[i].now) {
			long j = kv_config_find_range(n, pl->a[i].key.data, pl->a[i].key.len);
			if (j >= 0)
				place_copy(&v, &n->ranges[j]);
		}
		if (nr > 0 && mergeable(&r[nr - 1], &v)) {
			if (v.leader_epoch > r[nr - 1].leader_epoch)
				r[nr - 1].leader_epoch = v.leader_epoch;
			continue;
		}
		if (nr > 0 && kv_buf_set(&r[nr - 1].end, pl->a[i].key.data, pl->a[i].key.len) != 0)
			goto err;
		place_copy(&r[nr], &v);
		if (pl->a[i].key.len &&
		    kv_buf_set(&r[nr].start, pl->a[i].key.data, pl->a[i].key.len) != KV_OK) {
			nr++;
			goto err;
		}
		nr++;
	}
	for (size_t i = 0; i < n->nranges; i++) {
		kv_buf_fini(&n->ranges[i].start);
		kv_buf_fini(&n->ranges[i].end);
	}
	free(n->ranges);
	/* configs live for ever in the history: give back the atoms' room */
	kv_range *fit = realloc(r, (nr ? nr : 1) * sizeof(*r));
	n->ranges = fit ? fit : r;
	n->nranges = nr;
	if (revert)
		return 0;
	for (size_t i = 0; i < pl->n;) {
		size_t j = i + 1;
		if (pl->a[i].old == pl->a[i].now) {
			i++;
			continue;
		}
		while (j < pl->n && pl->a[j].old == pl->a[i].old && pl->a[j].now == pl->a[i].now)
			j++;
		kv_migration *m = realloc(n->migs, (n->nmigs + 1) * sizeof(*m));
		if (m == NULL)
			return KV_ENOMEM;
		n->migs = m;
		m = &n->migs[n->nmigs];
		memset(m, 0, sizeof(*m));
		m->id = x->next_mig_id++;
		m->epoch = n->epoch;
		m->from = pl->a[i].old;
		m->to = pl->a[i].now;
		m->phase = KV_MIG_PENDING;
		m->rate_limit_mb_s = x->rate_limit_mb_s;
		n->nmigs++;
		if (kv_buf_set(&m->start, pl->a[i].key.data, pl->a[i].key.len) != KV_OK ||
		    (j < pl->n &&
		     kv_buf_set(&m->end, pl->a[j].key.data, pl->a[j].key.len) != KV_OK))
			return KV_ENOMEM;
		newm++;
		i = j;
	}
	return (int)newm;
err:
	for (size_t i = 0; i < nr; i++) {
		kv_buf_fini(&r[i].start);
		kv_buf_fini(&r[i].end);
	}
	free(r);
	return KV_ENOMEM;
}

/* Makes the next config: a clone with the epoch bumped. */
static kv_config *
next_config(const kv_config *cur)
{
	kv_config *n = kv_config_clone(cur);

	if (n != NULL)
		n->epoch = cur->epoch + 1;
	return n;
}

/* JOINING -> ACTIVE with no incoming migration; DRAINING -> GONE when it owns
 * and moves nothing. */
static void
fix_states(kv_config *n)
{
	for (size_t i = 0; i < n->nnodes; i++) {
		kv_node *nd = &n->nodes[i];
		bool owns = false, in = false, moves = false;
		/* A replica of a replicated range counts as held. */
		for (size_t j = 0; j < n->nranges && !owns; j++)
			owns = kv_range_has_replica(&n->ranges[j], nd->id, false);
		for (size_t j = 0; j < n->nmigs; j++) {
			in = in || n->migs[j].to == nd->id;
			moves = moves || n->migs[j].from == nd->id || n->migs[j].to == nd->id;
		}
		if (nd->state == KV_NODE_JOINING && !in)
			nd->state = KV_NODE_ACTIVE;
		if (nd->state == KV_NODE_DRAINING && !owns && !moves)
			nd->state = KV_NODE_GONE;
	}
}

/* ---- balancing ---- */

struct loads {
	uint32_t *id; /* node ids, as in the config */
	uint64_t *l;  /* weight each owns in the plan */
	size_t n;     /* nodes */
};

static int
loads_init(const struct plan *pl, const kv_config *c, struct loads *L)
{
	L->n = c->nnodes;
	L->id = calloc(L->n ? L->n : 1, sizeof(*L->id));
	L->l = calloc(L->n ? L->n : 1, sizeof(*L->l));
	if (L->id == NULL || L->l == NULL) {
		free(L->id);
		free(L->l);
		return KV_ENOMEM;
	}
	for (size_t i = 0; i < L->n; i++)
		L->id[i] = c->nodes[i].id;
	for (size_t i = 0; i < pl->n; i++)
		for (size_t j = 0; j < L->n; j++)
			if (L->id[j] == pl->a[i].now)
				L->l[j] += pl->a[i].w;
	return KV_OK;
}

static void
loads_fini(struct loads *L)
{
	free(L->id);
	free(L->l);
}

static size_t
loads_idx(const struct loads *L, uint32_t id)
{
	for (size_t j = 0; j < L->n; j++)
		if (L->id[j] == id)
			return j;
	return 0;
}

/* Moves atoms [lo, hi) to r and updates the loads. */
static void
give(struct plan *pl, struct loads *L, size_t lo, size_t hi, uint32_t r)
{
	for (size_t i = lo; i < hi; i++) {
		L->l[loads_idx(L, pl->a[i].now)] -= pl->a[i].w;
		L->l[loads_idx(L, r)] += pl->a[i].w;
		pl->a[i].now = r;
	}
}

/*
 * Finds a contiguous run of unlocked atoms of donor d (a prefix or suffix of
 * one of its runs) weighing more than 0 and less than limit, as close to want
 * as possible; ties go to pieces next to r's atoms (they merge).
 */
static bool
pick_chunk(const struct plan *pl, uint32_t d, uint32_t r, uint64_t want, uint64_t limit, size_t *lo,
           size_t *hi)
{
	bool found = false;
	uint64_t best = 0;
	bool best_adj = false;

	for (size_t i = 0; i < pl->n;) {
		size_t j = i;
		if (pl->a[i].now != d || pl->a[i].locked) {
			i++;
			continue;
		}
		while (j < pl->n && pl->a[j].now == d && !pl->a[j].locked)
			j++;
		/* prefixes [i, k) then suffixes [k, j) */
		for (int dir = 0; dir < 2; dir++) {
			uint64_t w = 0;
			bool adj = dir == 0 ? (i > 0 && pl->a[i - 1].now == r)
			                    : (j < pl->n && pl->a[j].now == r);
			for (size_t s = 0; s < j - i; s++) {
				size_t k = dir == 0 ? i + s : j - 1 - s;
				w += pl->a[k].w;
				if (w >= limit)
					break;
				if (w == 0)
					continue;
				uint64_t diff = w > want ? w - want : want - w;
				if (!found || diff < best || (diff == best && adj && !best_adj)) {
					found = true;
					best = diff;
					best_adj = adj;
					*lo = dir == 0 ? i : k;
					*hi = dir == 0 ? k + 1 : j;
				}
			}
		}
		i = j;
	}
	return found;
}

/*
 * Evens out the loads of the eligible nodes. With only != 0, only that node
 * receives (join). Returns the number of chunks moved.
 */
static int
balance(struct plan *pl, const kv_config *c, uint32_t only)
{
	struct loads L;
	uint64_t total = 0, target;
	size_t ne = 0;
	bool *spent;
	int moved = 0;

	if (loads_init(pl, c, &L) != KV_OK)
		return KV_ENOMEM;
	spent = calloc(L.n ? L.n : 1, sizeof(bool));
	if (spent == NULL) {
		loads_fini(&L);
		return KV_ENOMEM;
	}
	for (size_t j = 0; j < L.n; j++)
		if (eligible(&c->nodes[j])) {
			total += L.l[j];
			ne++;
		}
	target = ne ? total / ne : 0;
	for (int step = 0; ne > 1 && step < KV_PLACE_MAX_STEPS; step++) {
		size_t d = L.n, r = L.n;
		for (size_t j = 0; j < L.n; j++) {
			if (!eligible(&c->nodes[j]))
				continue;
			if (!spent[j] && L.id[j] != only && (d == L.n || L.l[j] > L.l[d]))
				d = j;
			if ((only ? L.id[j] == only : true) && (r == L.n || L.l[j] < L.l[r]))
				r = j;
		}
		if (d == L.n || r == L.n || d == r || L.l[d] <= target || L.l[r] >= target)
			break;
		uint64_t want =
		    L.l[d] - target < target - L.l[r] ? L.l[d] - target : target - L.l[r];
		if (want <= target / 20)
			break;
		size_t lo, hi;
		if (!pick_chunk(pl, L.id[d], L.id[r], want, L.l[d] - L.l[r], &lo, &hi)) {
			spent[d] = true;
			continue;
		}
		give(pl, &L, lo, hi, L.id[r]);
		moved++;
	}
	free(spent);
	loads_fini(&L);
	return moved;
}

/* Gives the unlocked atoms of node `from` to the eligible nodes (not from),
 * contiguous pieces to whoever is furthest below the mean. */
static int
drain(struct plan *pl, const kv_config *c, uint32_t from)
{
	struct loads L;
	uint64_t total = 0, target;
	size_t ne = 0, cur = SIZE_MAX;
	int moved = 0;

	if (loads_init(pl, c, &L) != KV_OK)
		return KV_ENOMEM;
	for (size_t j = 0; j < L.n; j++)
		if (eligible(&c->nodes[j]) && L.id[j] != from) {
			total += L.l[j];
			ne++;
		}
	for (size_t i = 0; i < pl->n; i++)
		if (pl->a[i].now == from && !pl->a[i].locked)
			total += pl->a[i].w;
	target = ne ? total / ne : 0;
	for (size_t i = 0; ne > 0 && i < pl->n; i++) {
		if (pl->a[i].now != from || pl->a[i].locked) {
			cur = SIZE_MAX;
			continue;
		}
		if (cur == SIZE_MAX || L.l[cur] + pl->a[i].w / 2 > target) {
			size_t best = SIZE_MAX;
			for (size_t j = 0; j < L.n; j++)
				if (eligible(&c->nodes[j]) && L.id[j] != from &&
				    (best == SIZE_MAX || L.l[j] < L.l[best]))
					best = j;
			if (best != cur)
				moved++;
			cur = best;
		}
		give(pl, &L, i, i + 1, L.id[cur]);
	}
	loads_fini(&L);
	return moved;
}

static bool
owns_unlocked(const struct plan *pl, uint32_t node)
{
	for (size_t i = 0; i < pl->n; i++)
		if (pl->a[i].now == node && !pl->a[i].locked)
			return true;
	return false;
}

/* ---- public functions ---- */

int
kv_place_find_node(const kv_config *cur, uint32_t id, const char *address, kv_place_ctx *x,
                   uint32_t *out)
{
	const kv_node *n;

	if (id != 0) {
		if ((n = kv_config_node(cur, id)) == NULL) {
			say(x, "unknown node %u", id);
			return KV_ENOTFOUND;
		}
	} else if (address != NULL && address[0] != '\0') {
		if ((n = kv_config_node_by_address(cur, address)) == NULL) {
			say(x, "unknown node %.200s", address);
			return KV_ENOTFOUND;
		}
	} else {
		say(x, "no node given (an id or an address is required)");
		return KV_EINVAL;
	}
	*out = n->id;
	return KV_OK;
}

/* The bytes the samples of x carry. */
static uint64_t
data_bytes(const kv_place_ctx *x)
{
	uint64_t t = 0;

	for (size_t i = 0; x->points && i < x->npoints; i++)
		t += x->points[i].bytes;
	return t;
}

/* Nodes of c that may own ranges (active or joining). */
static size_t
eligible_count(const kv_config *c)
{
	size_t k = 0;

	for (size_t i = 0; i < c->nnodes; i++)
		k += eligible(&c->nodes[i]);
	return k;
}

static bool
address_ok(const char *a)
{
	const char *s = a ? strstr(a, "://") : NULL;
	size_t n = a ? strlen(a) : 0;

	if (s == NULL || s == a || s[3] == '\0' || n > 1024)
		return false;
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)a[i] <= 0x20 || (unsigned char)a[i] >= 0x7f || a[i] == ',')
			return false;
	return true;
}

int
kv_place_join(const kv_config *cur, const char *address, bool rebalance, kv_place_ctx *x,
              kv_config **out, uint32_t *node_id)
{
	const kv_node *old;
	kv_config *n;
	uint32_t id = 0;
	kv_node *nodes;
	struct plan pl;
	int rv;

	if (!address_ok(address)) {
		say(x, "invalid address \"%.200s\" (want an nng URL such as tcp://host:port)",
		    address ? address : "");
		return KV_EINVAL;
	}
	if ((old = kv_config_node_by_address(cur, address)) != NULL) {
		say(x, "address %.200s is already registered as node %u (%s)", address, old->id,
		    kv_node_state_name(old->state));
		return KV_EEXISTS;
	}
	for (size_t i = 0; i < cur->nnodes; i++)
		if (cur->nodes[i].id > id)
			id = cur->nodes[i].id;
	id++;
	if ((n = next_config(cur)) == NULL)
		return KV_ENOMEM;
	nodes = realloc(n->nodes, (n->nnodes + 1) * sizeof(*nodes));
	if (nodes == NULL)
		goto nomem;
	n->nodes = nodes;
	nodes[n->nnodes].id = id;
	nodes[n->nnodes].state = KV_NODE_ACTIVE;
	if ((nodes[n->nnodes].address = strdup(address)) == NULL)
		goto nomem;
	n->nnodes++;
	if (n->nranges == 0) {
		n->ranges = calloc(1, sizeof(kv_range));
		if (n->ranges == NULL)
			goto nomem;
		kv_range_set_single(&n->ranges[0], id);
		n->ranges[0].leader_epoch = cur->epoch + 1;
		n->nranges = 1;
	} else if (x->replicas >= 2) {
		/* Replicated: the newcomer gets replicas (unless it only
		 * registers), never a primary role through a migration
		 * (doc/replication.md). */
		if (rebalance && (rv = kv_place_add_replicas(n, x->replicas)) < 0)
			goto err;
	} else if (rebalance && x->join_floor_bytes > 0 &&
	           data_bytes(x) < x->join_floor_bytes * (uint64_t)eligible_count(n)) {
		/* The balancer is on and the cluster holds (next to) no data:
		 * the newcomer only registers, the balancer cuts and moves ranges
		 * as data arrives (doc/scheduler.md "A new cluster"). */
	} else if (rebalance) {
		nodes[n->nnodes - 1].state = KV_NODE_JOINING;
		if ((rv = plan_build(n, x, NULL, &pl)) != KV_OK)
			goto err;
		rv = balance(&pl, n, id);
		if (rv == 0 && pl.bytes && x->join_floor_bytes == 0) {
			/* The samples cannot be cut (too few split keys): give the
			 * newcomer its share of the key space instead, so that data
			 * written later spreads (with the balancer on, it cuts the
			 * data at the servers' split keys as it grows). */
			plan_free(&pl);
			if ((rv = plan_build_mode(n, x, NULL, true, &pl)) != KV_OK)
				goto err;
			rv = balance(&pl, n, id);
		}
		if (rv >= 0)
			rv = plan_apply(&pl, n, x, false);
		plan_free(&pl);
		if (rv < 0)
			goto err;
		fix_states(n);
	}
	*out = n;
	*node_id = id;
	return KV_OK;
nomem:
	rv = KV_ENOMEM;
err:
	kv_config_free(n);
	say(x, "%s", kv_strerror(rv));
	return rv;
}

static uint32_t transfer_target(const kv_config *n, const kv_range *r, uint32_t skip);
static int leave_replicated(kv_config *n, const kv_place_ctx *x, uint32_t node,
                            kv_place_repair_stats *st, uint32_t *stuck);

int
kv_place_leave(const kv_config *cur, uint32_t node, kv_place_ctx *x, kv_config **out)
{
	const kv_node *nd = kv_config_node(cur, node);
	kv_place_repair_stats rst;
	struct plan pl;
	kv_config *n;
	size_t others = 0;
	uint32_t stuck = 0;
	int rv;

	memset(&rst, 0, sizeof(rst));
	if (nd == NULL) {
		say(x, "unknown node %u", node);
		return KV_ENOTFOUND;
	}
	if (nd->state == KV_NODE_GONE) {
		say(x, "node %u has already left", node);
		return KV_EINVAL;
	}
	for (size_t i = 0; i < cur->nmigs; i++)
		if (cur->migs[i].to == node) {
			say(x,
			    "node %u is the destination of migration %llu in flight; "
			    "retry when it has finished",
			    node, (unsigned long long)cur->migs[i].id);
			return KV_EBUSY;
		}
	for (size_t i = 0; i < cur->nranges; i++) {
		const kv_range *r = &cur->ranges[i];
		char a[96], b[96];
		if (r->nreplicas == 0 || r->node != node || transfer_target(cur, r, node) != 0)
			continue;
		kv_place_fmt_key(r->start.data, r->start.len, a, sizeof(a));
		kv_place_fmt_key(r->end.data, r->end.len, b, sizeof(b));
		say(x,
		    "node %u leads [%s, %s) with no other active in-sync replica to take "
		    "over as its primary; retry once a backup is in sync",
		    node, a, b);
		return KV_EBUSY;
	}
	for (size_t i = 0; i < cur->nnodes; i++)
		if (cur->nodes[i].id != node && eligible(&cur->nodes[i]))
			others++;
	if ((n = next_config(cur)) == NULL)
		return KV_ENOMEM;
	if (n->nranges == 0) {
		pl.a = NULL;
		pl.n = 0;
	} else if ((rv = plan_build(n, x, NULL, &pl)) != KV_OK) {
		kv_config_free(n);
		return rv;
	}
	if (owns_unlocked(&pl, node) && others == 0) {
		say(x, "node %u is the last active node: no other node can take its ranges", node);
		rv = KV_EINVAL;
		goto err;
	}
	node_mut(n, node)->state = KV_NODE_DRAINING;
	/* Replicated ranges first (the plan's atoms leave them alone). */
	if ((rv = leave_replicated(n, x, node, &rst, &stuck)) < 0)
		goto err;
	if (nd->state == KV_NODE_DRAINING && !owns_unlocked(&pl, node) && rv == 0) {
		say(x, "node %u is already draining", node);
		rv = KV_EEXISTS;
		goto err;
	}
	if (pl.n > 0) {
		rv = drain(&pl, n, node);
		if (rv >= 0)
			rv = plan_apply(&pl, n, x, false);
		if (rv < 0)
			goto err;
	}
	plan_free(&pl);
	fix_states(n);
	*out = n;
	return KV_OK;
err:
	plan_free(&pl);
	kv_config_free(n);
	if (rv == KV_ENOMEM)
		say(x, "%s", kv_strerror(rv));
	return rv;
}

static int move_replicated(const kv_config *cur, kv_bytes start, kv_bytes end, uint32_t node,
                           kv_place_ctx *x, kv_config **out);

int
kv_place_move(const kv_config *cur, kv_bytes start, kv_bytes end, uint32_t node, kv_place_ctx *x,
              kv_config **out)
{
	const kv_node *nd = kv_config_node(cur, node);
	kv_bytes ex[2] = {start, end};
	struct plan pl;
	kv_config *n;
	bool changed = false;
	int rv;

	if (kv_range_is_empty(start.p, start.len, end.p, end.len)) {
		char a[96], b[96];
		kv_place_fmt_key(start.p, start.len, a, sizeof(a));
		kv_place_fmt_key(end.p, end.len, b, sizeof(b));
		say(x, "empty or inverted range [%s, %s): the end must sort after the start", a, b);
		return KV_EINVAL;
	}
	if (start.len > KV_HARD_MAX_KEY || end.len > KV_HARD_MAX_KEY) {
		say(x, "range bound longer than %u bytes", KV_HARD_MAX_KEY);
		return KV_EINVAL;
	}
	if (nd == NULL) {
		say(x, "unknown node %u", node);
		return KV_ENOTFOUND;
	}
	if (!eligible(nd)) {
		say(x, "node %u is %s, not active: it cannot take ranges", node,
		    kv_node_state_name(nd->state));
		return KV_EINVAL;
	}
	if (cur->nranges == 0) {
		say(x, "the range map is empty (no node has joined)");
		return KV_EINVAL;
	}
	size_t nrep = 0, nsingle = 0;
	for (size_t i = 0; i < cur->nranges; i++) {
		const kv_range *r = &cur->ranges[i];
		if ((end.len && kv_key_cmp(r->start.data, r->start.len, end.p, end.len) >= 0) ||
		    (r->end.len && kv_key_cmp(r->end.data, r->end.len, start.p, start.len) <= 0))
			continue;
		if (r->nreplicas > 0)
			nrep++;
		else
			nsingle++;
	}
	if (nrep > 0 && nsingle > 0) {
		say(x, "the range spans replicated and single ranges: move them separately");
		return KV_EINVAL;
	}
	if (nrep > 0)
		return move_replicated(cur, start, end, node, x, out);
	if ((rv = plan_build(cur, x, ex, &pl)) != KV_OK)
		return rv;
	for (size_t i = atom_find(&pl, start.p, start.len); i < pl.n; i++) {
		if (end.len && kv_key_cmp(pl.a[i].key.data, pl.a[i].key.len, end.p, end.len) >= 0)
			break;
		if (pl.a[i].locked) {
			const kv_migration *m =
			    kv_config_migration_for(cur, pl.a[i].key.data, pl.a[i].key.len);
			char a[96], b[96];
			kv_place_fmt_key(m->start.data, m->start.len, a, sizeof(a));
			kv_place_fmt_key(m->end.data, m->end.len, b, sizeof(b));
			say(x,
			    "range is moving: it overlaps migration %llu [%s, %s) from node %u to "
			    "%u",
			    (unsigned long long)m->id, a, b, m->from, m->to);
			plan_free(&pl);
			return KV_EBUSY;
		}
		if (pl.a[i].now != node) {
			pl.a[i].now = node;
			changed = true;
		}
	}
	if (!changed) {
		plan_free(&pl);
		*out = NULL;
		return KV_OK;
	}
	if ((n = next_config(cur)) == NULL) {
		plan_free(&pl);
		return KV_ENOMEM;
	}
	rv = plan_apply(&pl, n, x, false);
	plan_free(&pl);
	if (rv < 0) {
		kv_config_free(n);
		return rv;
	}
	fix_states(n);
	*out = n;
	return KV_OK;
}

static int rebalance_replicated(const kv_config *cur, kv_place_ctx *x, kv_config **out);

int
kv_place_rebalance(const kv_config *cur, kv_place_ctx *x, kv_config **out)
{
	struct plan pl;
	kv_config *n;
	int rv, moved = 0;

	*out = NULL;
	if (cur->nranges == 0)
		return KV_OK;
	for (size_t i = 0; i < cur->nranges; i++)
		if (cur->ranges[i].nreplicas > 0)
			return rebalance_replicated(cur, x, out);
	if ((rv = plan_build(cur, x, NULL, &pl)) != KV_OK)
		return rv;
	for (size_t i = 0; i < cur->nnodes; i++)
		if (cur->nodes[i].state == KV_NODE_DRAINING &&
		    owns_unlocked(&pl, cur->nodes[i].id)) {
			if ((rv = drain(&pl, cur, cur->nodes[i].id)) < 0)
				goto out;
			moved += rv;
		}
	if ((rv = balance(&pl, cur, 0)) < 0)
		goto out;
	moved += rv;
	rv = KV_OK;
	if (moved == 0)
		goto out;
	if ((n = next_config(cur)) == NULL) {
		rv = KV_ENOMEM;
		goto out;
	}
	if ((rv = plan_apply(&pl, n, x, false)) < 0) {
		kv_config_free(n);
		goto out;
	}
	rv = KV_OK;
	if (n->nmigs == cur->nmigs) {
		kv_config_free(n); /* the plan ended where it started */
		goto out;
	}
	fix_states(n);
	*out = n;
out:
	plan_free(&pl);
	return rv;
}

int
kv_place_finish(const kv_config *cur, uint64_t mig_id, bool ok, kv_place_ctx *x, kv_config **out)
{
	const kv_migration *m = NULL;
	kv_config *n;
	size_t mi = 0;
	int rv;

	for (size_t i = 0; i < cur->nmigs; i++)
		if (cur->migs[i].id == mig_id) {
			m = &cur->migs[i];
			mi = i;
		}
	if (m == NULL) {
		say(x, "migration %llu is not in flight", (unsigned long long)mig_id);
		return KV_ENOTFOUND;
	}
	if ((n = next_config(cur)) == NULL)
		return KV_ENOMEM;
	if (!ok) {
		struct plan pl;
		kv_bytes ex[2] = {kb(&m->start), kb(&m->end)};
		if ((rv = plan_build(cur, x, ex, &pl)) != KV_OK)
			goto err;
		for (size_t i = atom_find(&pl, m->start.data, m->start.len); i < pl.n; i++) {
			if (m->end.len && kv_key_cmp(pl.a[i].key.data, pl.a[i].key.len, m->end.data,
			                             m->end.len) >= 0)
				break;
			pl.a[i].now = m->from;
		}
		rv = plan_apply(&pl, n, x, true);
		plan_free(&pl);
		if (rv < 0)
			goto err;
	}
	kv_buf_fini(&n->migs[mi].start);
	kv_buf_fini(&n->migs[mi].end);
	memmove(&n->migs[mi], &n->migs[mi + 1], (n->nmigs - mi - 1) * sizeof(kv_migration));
	n->nmigs--;
	fix_states(n);
	*out = n;
	return KV_OK;
err:
	kv_config_free(n);
	return rv;
}

int
kv_place_readdress(const kv_config *cur, uint32_t node, const char *address, kv_place_ctx *x,
                   kv_config **out)
{
	const kv_node *other = kv_config_node_by_address(cur, address);
	kv_config *n;
	kv_node *nd;
	char *a;

	if (!address_ok(address)) {
		say(x, "invalid address \"%.200s\"", address ? address : "");
		return KV_EINVAL;
	}
	if (other != NULL && other->id != node) {
		say(x, "address %.200s is already registered as node %u", address, other->id);
		return KV_EEXISTS;
	}
	if ((n = next_config(cur)) == NULL || (a = strdup(address)) == NULL) {
		kv_config_free(n);
		return KV_ENOMEM;
	}
	if ((nd = node_mut(n, node)) == NULL) {
		free(a);
		kv_config_free(n);
		say(x, "unknown node %u", node);
		return KV_ENOTFOUND;
	}
	free(nd->address);
	nd->address = a;
	*out = n;
	return KV_OK;
}

uint64_t
kv_place_node_bytes(const kv_config *cur, const kv_place_ctx *x, uint32_t node)
{
	uint64_t sum = 0;

	for (size_t i = 0; x->points && i < x->npoints; i++) {
		long r = kv_config_find_range(cur, x->points[i].key.p, x->points[i].key.len);
		if (r >= 0 && cur->ranges[r].node == node)
			sum += x->points[i].bytes;
	}
	return sum;
}

/* Merges adjacent ranges that are one (mergeable; the range map
 * invariant). */
static void
merge_ranges(kv_config *n)
{
	size_t w = 0;

	/* A fence ends when its member leaves the ISR (it joins again only
	 * after a copy) or the range changes primary again (promote sets the
	 * new one). */
	for (size_t i = 0; i < n->nranges; i++) {
		kv_range *r = &n->ranges[i];
		if (r->fence != 0 && (r->nreplicas == 0 || r->fence == r->node ||
		                      !kv_range_has_replica(r, r->fence, true)))
			r->fence = 0;
	}
	for (size_t i = 0; i < n->nranges; i++) {
		if (w > 0 && mergeable(&n->ranges[w - 1], &n->ranges[i])) {
			if (n->ranges[i].leader_epoch > n->ranges[w - 1].leader_epoch)
				n->ranges[w - 1].leader_epoch = n->ranges[i].leader_epoch;
			kv_buf_fini(&n->ranges[w - 1].end);
			n->ranges[w - 1].end = n->ranges[i].end;
			kv_buf_fini(&n->ranges[i].start);
			continue;
		}
		n->ranges[w++] = n->ranges[i];
	}
	n->nranges = w;
}

/* ---- replica sets ---- */

/* Whether node id can serve: known and neither down nor gone. */
static bool
node_live(const kv_config *c, uint32_t id)
{
	const kv_node *nd = kv_config_node(c, id);
	return nd != NULL && nd->state != KV_NODE_DOWN && nd->state != KV_NODE_GONE;
}

/* Removes v from the list a[0..*n), keeping the order of the others. */
static void
set_remove(uint32_t *a, uint32_t *n, uint32_t v)
{
	uint32_t w = 0;

	for (uint32_t i = 0; i < *n; i++)
		if (a[i] != v)
			a[w++] = a[i];
	*n = w;
}

/* Moves v (in a[0..n)) to the front, keeping the order of the others. */
static void
set_front(uint32_t *a, uint32_t n, uint32_t v)
{
	for (uint32_t i = 0; i < n; i++)
		if (a[i] == v) {
			memmove(&a[1], &a[0], i * sizeof(*a));
			a[0] = v;
			return;
		}
}

/* The first member of r's ISR (in_isr) or replica set other than `skip`,
 * live ones first and, in the ISR, the fence last (it leads only when no
 * other member can: doc/replication.md "Primary transfer"); 0 when there
 * is none. */
static uint32_t
other_member(const kv_config *c, const kv_range *r, uint32_t skip, bool in_isr)
{
	uint32_t n = in_isr ? kv_range_ninsync(r) : kv_range_nreplicas(r), any = 0;

	for (uint32_t i = 0; i < n; i++) {
		uint32_t m = in_isr ? kv_range_insync(r, i) : kv_range_replica(r, i);
		if (m == skip || (in_isr && m == r->fence) || kv_config_node(c, m) == NULL ||
		    kv_config_node(c, m)->state == KV_NODE_GONE)
			continue;
		if (node_live(c, m))
			return m;
		if (any == 0)
			any = m;
	}
	if (any == 0 && in_isr && r->fence != 0 && r->fence != skip &&
	    kv_config_node(c, r->fence) != NULL &&
	    kv_config_node(c, r->fence)->state != KV_NODE_GONE)
		any = r->fence;
	return any;
}

/* Makes q (a replica of replicated range r) its primary at leader epoch le,
 * at the front of the replica set and of the ISR (which it joins if it was
 * not in it). The old primary stays in both; callers that remove it (a
 * failover, a removal) use promote_over. */
static void
promote_keep(kv_range *r, uint32_t q, uint64_t le)
{
	if (!kv_range_has_replica(r, q, true) && r->ninsync < KV_MAX_REPLICAS)
		r->insync[r->ninsync++] = q;
	set_front(r->replicas, r->nreplicas, q);
	set_front(r->insync, r->ninsync, q);
	r->node = q;
	r->leader_epoch = le;
}

/* A planned transfer of r's primary role to q (move, leave, balancer, a
 * replacement of the primary): the old primary stays in the ISR as the
 * transfer fence (r->fence, doc/replication.md "Primary transfer"). Only
 * for a range without a fence (transferable). */
static void
promote(kv_range *r, uint32_t q, uint64_t le)
{
	uint32_t old = r->node;

	promote_keep(r, q, le);
	r->fence = old != q ? old : 0;
}

/* A failover or removal of r's primary: q takes over; a fence that is not q
 * stays one. */
static void
promote_over(kv_range *r, uint32_t q, uint64_t le)
{
	promote_keep(r, q, le);
	if (r->fence == q)
		r->fence = 0;
}

/* Whether r's primary role may be handed over in a planned transfer: not
 * while the previous primary is still the fence (it has not been copied
 * again since it was demoted). */
static bool
transferable(const kv_range *r)
{
	return r->fence == 0;
}

/* Whether [s1, e1) and [s2, e2) overlap (an empty end: the end of the key
 * space). */
static bool
overlaps(const kv_buf *s1, const kv_buf *e1, const void *s2, size_t s2len, const void *e2,
         size_t e2len)
{
	if (e2len && kv_key_cmp(s1->data, s1->len, e2, e2len) >= 0)
		return false;
	if (e1->len && kv_key_cmp(e1->data, e1->len, s2, s2len) <= 0)
		return false;
	return true;
}

int
kv_place_failover(kv_config *n, kv_place_failover_stats *st)
{
	kv_place_failover_stats dummy;
	uint32_t *lead = calloc(n->nnodes ? n->nnodes : 1, sizeof(*lead));

	if (st == NULL)
		st = &dummy;
	memset(st, 0, sizeof(*st));
	if (lead == NULL)
		return KV_ENOMEM;
	/* lead[i]: ranges led by nodes[i] */
	for (size_t i = 0; i < n->nranges; i++) {
		const kv_node *nd = kv_config_node(n, n->ranges[i].node);
		if (nd != NULL)
			lead[nd - n->nodes]++;
	}
	for (size_t i = 0; i < n->nranges; i++) {
		kv_range *r = &n->ranges[i];
		uint32_t before = r->ninsync, best = 0;
		if (r->nreplicas == 0)
			continue;
		if (!node_live(n, r->node)) {
			for (uint32_t j = 0; j < r->ninsync; j++) {
				uint32_t m = r->insync[j];
				/* The fence only when no other member is live: what it
				 * failed at its demotion is still in its store
				 * (doc/replication.md "Primary transfer"). */
				if (m == r->node || !node_live(n, m) ||
				    (m == r->fence && best != 0))
					continue;
				if (best != 0 && best == r->fence) {
					best = m;
					continue;
				}
				/* A leaving or replaced member leads only when no
				 * other can. */
				bool mb = kv_config_node(n, m)->state == KV_NODE_DRAINING ||
				          kv_range_replacement(r, m, false) != 0;
				bool bb = best != 0 &&
				          (kv_config_node(n, best)->state == KV_NODE_DRAINING ||
				           kv_range_replacement(r, best, false) != 0);
				if (best == 0 || (bb && !mb) ||
				    (bb == mb && lead[kv_config_node(n, m) - n->nodes] <
				                     lead[kv_config_node(n, best) - n->nodes]))
					best = m;
			}
			if (best == 0) {
				st->stuck++;
			} else {
				uint32_t old = r->node;
				const kv_node *on = kv_config_node(n, old);
				if (on != NULL)
					lead[on - n->nodes]--;
				lead[kv_config_node(n, best) - n->nodes]++;
				promote_over(r, best, n->epoch);
				set_remove(r->insync, &r->ninsync, old);
				st->failovers++;
				if (st->nev < sizeof(st->ev) / sizeof(st->ev[0])) {
					kv_place_failover_ev *e = &st->ev[st->nev++];
					kv_place_fmt_key(r->start.data, r->start.len, e->start,
					                 sizeof(e->start));
					kv_place_fmt_key(r->end.data, r->end.len, e->end,
					                 sizeof(e->end));
					e->from = old;
					e->to = best;
					e->leader_epoch = n->epoch;
				}
			}
		}
		/* A down member of the ISR leaves it (the primary stays in it). */
		for (uint32_t j = r->ninsync; j-- > 1;) {
			const kv_node *m = kv_config_node(n, r->insync[j]);
			if (m == NULL || m->state == KV_NODE_DOWN || m->state == KV_NODE_GONE)
				set_remove(r->insync, &r->ninsync, r->insync[j]);
		}
		if (r->ninsync < before)
			st->shrinks++;
	}
	free(lead);
	merge_ranges(n);
	return KV_OK;
}

int
kv_place_add_replicas(kv_config *n, uint32_t replicas)
{
	uint32_t *cnt, target, na = 0;
	int added = 0;

	if (replicas > KV_MAX_REPLICAS)
		replicas = KV_MAX_REPLICAS;
	for (size_t i = 0; i < n->nnodes; i++)
		na += n->nodes[i].state == KV_NODE_ACTIVE;
	target = replicas < na ? replicas : na;
	if (target < 2)
		return 0;
	if ((cnt = calloc(n->nnodes, sizeof(*cnt))) == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < n->nranges; i++)
		for (uint32_t j = 0; j < kv_range_nreplicas(&n->ranges[i]); j++) {
			const kv_node *nd = kv_config_node(n, kv_range_replica(&n->ranges[i], j));
			if (nd != NULL)
				cnt[nd - n->nodes]++;
		}
	for (size_t i = 0; i < n->nranges; i++) {
		kv_range *r = &n->ranges[i];
		bool moving = false;
		for (size_t j = 0; j < n->nmigs && !moving; j++)
			moving =
			    overlaps(&r->start, &r->end, n->migs[j].start.data,
			             n->migs[j].start.len, n->migs[j].end.data, n->migs[j].end.len);
		while (!moving && kv_range_nreplicas(r) < target) {
			size_t best = n->nnodes;
			for (size_t j = 0; j < n->nnodes; j++)
				if (n->nodes[j].state == KV_NODE_ACTIVE &&
				    !kv_range_has_replica(r, n->nodes[j].id, false) &&
				    (best == n->nnodes || cnt[j] < cnt[best]))
					best = j;
			if (best == n->nnodes)
				break;
			if (r->nreplicas == 0) {
				r->nreplicas = r->ninsync = 1;
				r->replicas[0] = r->insync[0] = r->node;
			}
			r->replicas[r->nreplicas++] = n->nodes[best].id;
			cnt[best]++;
			added++;
		}
	}
	free(cnt);
	merge_ranges(n);
	return added;
}

/* ---- replacements, leave and repair with replicas ---- */

/* Whether member m of r may leave its ISR and replica set now: it is down
 * or gone (its lease has run out), or no configuration it may still act on
 * names it primary of a key of r (x->serving). */
static bool
may_leave(const kv_config *c, const kv_place_ctx *x, const kv_range *r, uint32_t m)
{
	const kv_node *nd = kv_config_node(c, m);

	if (nd == NULL || nd->state == KV_NODE_DOWN || nd->state == KV_NODE_GONE)
		return true;
	return x == NULL || x->serving == NULL ||
	       !x->serving(x->serving_arg, m, kb(&r->start), kb(&r->end));
}

/* Removes member m (not the primary) from r's replica set, ISR and
 * replacements; a range left with one replica becomes single. */
static void
drop_member(kv_range *r, uint32_t m)
{
	uint32_t w = 0;

	set_remove(r->replicas, &r->nreplicas, m);
	set_remove(r->insync, &r->ninsync, m);
	for (uint32_t i = 0; i < r->nreplacing; i++)
		if (r->replacing[i] != m && r->replaced[i] != m) {
			r->replacing[w] = r->replacing[i];
			r->replaced[w++] = r->replaced[i];
		}
	r->nreplacing = w;
	if (r->nreplicas < 2) {
		uint64_t le = r->leader_epoch;
		kv_range_set_single(r, r->node);
		r->leader_epoch = le;
	}
}

/* What each node holds, for choosing a replacement. */
struct rload {
	uint64_t *bytes; /* per n->nodes[i]: sample bytes of the ranges it holds */
	uint32_t *cnt;   /* per n->nodes[i]: replicas it holds */
	bool sized;      /* some sample has bytes */
};

static void
rload_fini(struct rload *L)
{
	free(L->bytes);
	free(L->cnt);
}

static int
rload_init(const kv_config *n, const kv_place_ctx *x, struct rload *L)
{
	L->bytes = calloc(n->nnodes ? n->nnodes : 1, sizeof(*L->bytes));
	L->cnt = calloc(n->nnodes ? n->nnodes : 1, sizeof(*L->cnt));
	L->sized = has_bytes(x);
	if (L->bytes == NULL || L->cnt == NULL) {
		rload_fini(L);
		return KV_ENOMEM;
	}
	for (size_t i = 0; i < n->nranges; i++)
		for (uint32_t j = 0; j < kv_range_nreplicas(&n->ranges[i]); j++) {
			const kv_node *nd = kv_config_node(n, kv_range_replica(&n->ranges[i], j));
			if (nd != NULL)
				L->cnt[nd - n->nodes]++;
		}
	for (size_t i = 0; L->sized && i < x->npoints; i++) {
		long ri = kv_config_find_range(n, x->points[i].key.p, x->points[i].key.len);
		for (uint32_t j = 0; ri >= 0 && j < kv_range_nreplicas(&n->ranges[ri]); j++) {
			const kv_node *nd = kv_config_node(n, kv_range_replica(&n->ranges[ri], j));
			if (nd != NULL)
				L->bytes[nd - n->nodes] += x->points[i].bytes;
		}
	}
	return KV_OK;
}

/* Sample bytes inside r. */
static uint64_t
range_bytes(const kv_range *r, const kv_place_ctx *x)
{
	uint64_t b = 0;

	for (size_t i = 0; x->points && i < x->npoints; i++)
		if (kv_range_contains(r->start.data, r->start.len, r->end.data, r->end.len,
		                      x->points[i].key.p, x->points[i].key.len))
			b += x->points[i].bytes;
	return b;
}

/* The active node that is not a replica of r holding the least data (by
 * bytes when known, then by replica count, then the lowest id); 0: none. */
static uint32_t
pick_replacement(const kv_config *n, const struct rload *L, const kv_range *r)
{
	size_t best = n->nnodes;

	for (size_t j = 0; j < n->nnodes; j++) {
		if (n->nodes[j].state != KV_NODE_ACTIVE ||
		    kv_range_has_replica(r, n->nodes[j].id, false))
			continue;
		if (best == n->nnodes ||
		    (L->sized && L->bytes[j] != L->bytes[best] ? L->bytes[j] < L->bytes[best]
		                                               : L->cnt[j] < L->cnt[best]))
			best = j;
	}
	return best == n->nnodes ? 0 : n->nodes[best].id;
}

/* Gives member m (not the primary) of r a replacement outside the ISR.
 * With a full replica set, m is dropped instead of kept when it may leave.
 * Returns 1 when r changed, 0 when m has a replacement already or no node
 * can be one (*none set). */
static int
replace_member(kv_config *n, const kv_place_ctx *x, struct rload *L, kv_range *r, uint32_t m,
               bool *none)
{
	uint32_t t;
	const kv_node *tn;

	if (kv_range_replacement(r, m, false) != 0 || m == r->node)
		return 0;
	if (kv_range_replacement(r, m, true) != 0) {
		/* A replacement that goes away itself is dropped: the member
		 * it replaced gets another. */
		if (!may_leave(n, x, r, m))
			return 0;
		drop_member(r, m);
		return 1;
	}
	if ((t = pick_replacement(n, L, r)) == 0) {
		*none = true;
		return 0;
	}
	if (r->nreplicas >= KV_MAX_REPLICAS) {
		if (!may_leave(n, x, r, m))
			return 0;
		drop_member(r, m);
		r->replicas[r->nreplicas++] = t;
	} else {
		r->replicas[r->nreplicas++] = t;
		r->replacing[r->nreplacing] = t;
		r->replaced[r->nreplacing++] = m;
	}
	tn = kv_config_node(n, t);
	L->cnt[tn - n->nodes]++;
	L->bytes[tn - n->nodes] += range_bytes(r, x);
	return 1;
}

/* An active ISR member of r other than skip, not being replaced, to lead
 * it (a leaving one would hand the role back); 0: none, or the range is
 * not transferable (its fence stands). */
static uint32_t
transfer_target(const kv_config *n, const kv_range *r, uint32_t skip)
{
	if (!transferable(r))
		return 0;
	for (uint32_t j = 0; j < kv_range_ninsync(r); j++) {
		uint32_t m = kv_range_insync(r, j);
		const kv_node *nd = kv_config_node(n, m);
		if (m != skip && nd != NULL && nd->state == KV_NODE_ACTIVE &&
		    kv_range_replacement(r, m, false) == 0)
			return m;
	}
	return 0;
}

/* What leaving does to replicated range r of which node is a replica:
 * the primary role moves to another live ISR member, with node kept in
 * the ISR (the transfer fence); then node gets a replacement, or without
 * one is dropped once it may leave. Returns the changes made; *stuck is
 * set when node leads r with no live ISR member to take over. */
static int
leave_range(kv_config *n, const kv_place_ctx *x, struct rload *L, kv_range *r, uint32_t node,
            kv_place_repair_stats *st, bool *stuck)
{
	int changed = 0;
	bool none = false;

	if (r->node == node) {
		uint32_t q = transfer_target(n, r, node);
		if (q == 0) {
			*stuck = true;
			return 0;
		}
		promote(r, q, n->epoch);
		st->transfers++;
		changed++;
	}
	if (replace_member(n, x, L, r, node, &none) > 0) {
		st->added++;
		changed++;
	} else if (none && r->node != node && kv_range_replacement(r, node, false) == 0 &&
	           may_leave(n, x, r, node)) {
		/* No node can replace it: the range goes on one replica short. */
		drop_member(r, node);
		st->dropped++;
		st->short_of++;
		changed++;
	} else if (none) {
		st->short_of++;
	}
	return changed;
}

/* Drops the replaced members of r whose replacement is in the ISR and that
 * may leave. With transfer (n is a clone of the latest configuration, so
 * the ISR is the one the servers have), a replaced primary first hands its
 * role to its replacement, at leader epoch n->epoch, and stays in the ISR
 * (the transfer fence): a replica joins the ISR and becomes primary in two
 * configurations, as the servers require. Returns the changes made;
 * *transfers counts the primary roles moved. */
static int
drop_replaced(const kv_config *n, const kv_place_ctx *x, kv_range *r, bool transfer,
              uint32_t *transfers)
{
	int k = 0;

	for (uint32_t i = 0; i < r->nreplacing;) {
		uint32_t t = r->replacing[i], o = r->replaced[i];
		if (!kv_range_has_replica(r, t, true)) {
			i++;
		} else if (o == r->node) {
			if (transfer && kv_config_node(n, t)->state == KV_NODE_ACTIVE &&
			    transferable(r)) {
				promote(r, t, n->epoch);
				(*transfers)++;
				k++;
			}
			i++;
		} else if (may_leave(n, x, r, o)) {
			drop_member(r, o);
			k++;
			i = 0;
		} else {
			i++;
		}
	}
	return k;
}

/* Leave's work on every replicated range of node (already DRAINING in n).
 * Returns the changes made or KV_ENOMEM; *stuck counts the ranges it leads
 * with no live ISR member to take over. */
static int
leave_replicated(kv_config *n, const kv_place_ctx *x, uint32_t node, kv_place_repair_stats *st,
                 uint32_t *stuck)
{
	struct rload L;
	int changed = 0;

	if (rload_init(n, x, &L) != KV_OK)
		return KV_ENOMEM;
	for (size_t i = 0; i < n->nranges; i++) {
		kv_range *r = &n->ranges[i];
		bool s = false;
		if (r->nreplicas == 0 || !kv_range_has_replica(r, node, false))
			continue;
		changed += leave_range(n, x, &L, r, node, st, &s);
		*stuck += s;
	}
	rload_fini(&L);
	merge_ranges(n);
	return changed;
}

int
kv_place_repair(const kv_config *cur, const uint32_t *expired, size_t nexpired, kv_place_ctx *x,
                kv_config **out, kv_place_repair_stats *st)
{
	kv_place_repair_stats dummy;
	kv_config *n;
	struct rload L;
	int changed = 0;

	*out = NULL;
	if (st == NULL)
		st = &dummy;
	memset(st, 0, sizeof(*st));
	if ((n = next_config(cur)) == NULL)
		return KV_ENOMEM;
	if (rload_init(n, x, &L) != KV_OK) {
		kv_config_free(n);
		return KV_ENOMEM;
	}
	for (size_t i = 0; i < n->nranges; i++) {
		kv_range *r = &n->ranges[i];
		bool stuck = false, none = false;
		int k, looks = 0;
		/* Nobody copies to a new replica of a range whose primary is
		 * down: it waits for a failover or the primary's return. */
		if (r->nreplicas == 0 || !node_live(n, r->node))
			continue;
		uint32_t tr = 0;
		k = drop_replaced(n, x, r, true, &tr);
		st->dropped += (uint32_t)k - tr;
		st->transfers += tr;
		changed += k;
		for (uint32_t j = 0; j < r->nreplicas; j++) {
			uint32_t m = r->replicas[j];
			const kv_node *nd = kv_config_node(n, m);
			if (nd != NULL && nd->state == KV_NODE_DRAINING) {
				k = leave_range(n, x, &L, r, m, st, &stuck);
			} else {
				bool exp = false;
				for (size_t e = 0; e < nexpired; e++)
					exp = exp || expired[e] == m;
				if (!exp || nd == NULL || nd->state != KV_NODE_DOWN)
					continue;
				none = false;
				k = replace_member(n, x, &L, r, m, &none);
				st->added += (uint32_t)k;
				st->short_of += none;
			}
			if (k > 0) {
				changed += k;
				/* The set changed: look again (bounded: each change
				 * ends a need, but a bug must not spin here). */
				if (++looks < 4 * KV_MAX_REPLICAS)
					j = (uint32_t)-1;
			}
		}
	}
	rload_fini(&L);
	merge_ranges(n);
	fix_states(n);
	for (size_t i = 0; i < n->nnodes; i++)
		st->gone +=
		    cur->nodes[i].state == KV_NODE_DRAINING && n->nodes[i].state == KV_NODE_GONE;
	if (changed == 0 && st->gone == 0) {
		kv_config_free(n);
		return KV_OK;
	}
	*out = n;
	return KV_OK;
}

/* The weight of range r for rebalance: its sample bytes when the samples
 * carry bytes, else 1 (ranges are counted). */
static uint64_t
range_weight(const kv_range *r, const kv_place_ctx *x, bool sized)
{
	return sized ? range_bytes(r, x) : 1;
}

/* Whether r may take part in a rebalance step: replicated, its primary
 * live, nothing being replaced in it. */
static bool
rebalance_ok(const kv_config *n, const kv_range *r)
{
	return r->nreplicas > 0 && r->nreplacing == 0 && node_live(n, r->node);
}

/*
 * rebalance with replicas: whole ranges only, no migration, no split.
 * First the replicas: while the active node holding the most data (as a
 * replica of any role) holds more than 5% above the mean, one of its
 * backup replicas gets a replacement on the active node holding the least,
 * when that lowers the larger of the two. Then the primaries: while a
 * node leads more than 5% above the mean, a range it leads gets the ISR
 * member leading the least as primary, under the same rule (the old
 * primary stays in the ISR: the transfer fence). A node none of whose
 * ranges can move is passed over. At most KV_PLACE_MAX_STEPS steps of
 * each kind.
 */
static int
rebalance_replicated(const kv_config *cur, kv_place_ctx *x, kv_config **out)
{
	kv_config *n = next_config(cur);
	uint64_t *load = NULL, total, mean;
	bool *spent = NULL, sized = has_bytes(x);
	size_t ne = 0;
	int changed = 0;

	*out = NULL;
	if (n == NULL || (load = calloc(n->nnodes ? n->nnodes : 1, sizeof(*load))) == NULL ||
	    (spent = calloc(n->nnodes ? n->nnodes : 1, sizeof(*spent))) == NULL) {
		free(load);
		kv_config_free(n);
		return KV_ENOMEM;
	}
	for (size_t j = 0; j < n->nnodes; j++)
		ne += n->nodes[j].state == KV_NODE_ACTIVE;
	for (int pass = 0; pass < 2 && ne > 1; pass++) {
		bool primaries = pass == 1;
		memset(load, 0, n->nnodes * sizeof(*load));
		memset(spent, 0, n->nnodes * sizeof(*spent));
		total = 0;
		for (size_t i = 0; i < n->nranges; i++) {
			const kv_range *r = &n->ranges[i];
			uint64_t w = range_weight(r, x, sized);
			for (uint32_t j = 0; j < kv_range_nreplicas(r); j++) {
				uint32_t m = kv_range_replica(r, j);
				const kv_node *nd = kv_config_node(n, m);
				if (nd == NULL || (primaries && m != r->node))
					continue;
				load[nd - n->nodes] += w;
				if (nd->state == KV_NODE_ACTIVE)
					total += w;
			}
		}
		mean = total / ne;
		for (int step = 0; step < KV_PLACE_MAX_STEPS; step++) {
			size_t h = n->nnodes, l = n->nnodes, best_r = n->nranges;
			uint32_t best_m = 0;
			uint64_t best_w = 0;
			for (size_t j = 0; j < n->nnodes; j++) {
				if (n->nodes[j].state != KV_NODE_ACTIVE)
					continue;
				if (!spent[j] && (h == n->nnodes || load[j] > load[h]))
					h = j;
				if (l == n->nnodes || load[j] < load[l])
					l = j;
			}
			if (h == n->nnodes || load[h] <= mean + mean / 20 || h == l)
				break;
			for (size_t i = 0; i < n->nranges; i++) {
				kv_range *r = &n->ranges[i];
				uint64_t w = range_weight(r, x, sized);
				uint32_t to = 0;
				if (!rebalance_ok(n, r) || w == 0)
					continue;
				if (!primaries) {
					/* a backup of h moves to l */
					if (r->node == n->nodes[h].id ||
					    !kv_range_has_replica(r, n->nodes[h].id, false) ||
					    kv_range_has_replica(r, n->nodes[l].id, false) ||
					    r->nreplicas >= KV_MAX_REPLICAS)
						continue;
					to = n->nodes[l].id;
				} else {
					/* h's role goes to the ISR member leading least */
					if (r->node != n->nodes[h].id || !transferable(r))
						continue;
					for (uint32_t j = 0; j < r->ninsync; j++) {
						const kv_node *q = kv_config_node(n, r->insync[j]);
						if (q == NULL || q->state != KV_NODE_ACTIVE ||
						    q->id == r->node)
							continue;
						if (to == 0 ||
						    load[q - n->nodes] <
						        load[kv_config_node(n, to) - n->nodes])
							to = q->id;
					}
					if (to == 0)
						continue;
				}
				/* only a step that lowers the larger of the two */
				if (load[kv_config_node(n, to) - n->nodes] + w >= load[h])
					continue;
				if (best_m == 0 || w > best_w) {
					best_r = i;
					best_m = to;
					best_w = w;
				}
			}
			if (best_m == 0) {
				spent[h] = true; /* nothing of it can move: the next */
				continue;
			}
			kv_range *r = &n->ranges[best_r];
			if (primaries) {
				promote(r, best_m, n->epoch);
			} else {
				r->replicas[r->nreplicas++] = best_m;
				r->replacing[r->nreplacing] = best_m;
				r->replaced[r->nreplacing++] = n->nodes[h].id;
			}
			load[h] -= best_w;
			load[kv_config_node(n, best_m) - n->nodes] += best_w;
			changed++;
		}
	}
	free(load);
	free(spent);
	merge_ranges(n);
	if (changed == 0) {
		kv_config_free(n);
		return KV_OK;
	}
	*out = n;
	return KV_OK;
}

/* Splits the range of n containing key at key (nothing when key is empty or
 * a range starts there). Returns 0 or KV_ENOMEM. */
static int
split_at(kv_config *n, kv_bytes key)
{
	long j;
	kv_range *r;

	if (key.len == 0 || (j = kv_config_find_range(n, key.p, key.len)) < 0 ||
	    kv_key_cmp(n->ranges[j].start.data, n->ranges[j].start.len, key.p, key.len) == 0)
		return KV_OK;
	if ((r = realloc(n->ranges, (n->nranges + 1) * sizeof(*r))) == NULL)
		return KV_ENOMEM;
	n->ranges = r;
	memmove(&r[j + 2], &r[j + 1], (n->nranges - (size_t)j - 1) * sizeof(*r));
	memset(&r[j + 1], 0, sizeof(*r));
	place_copy(&r[j + 1], &r[j]);
	r[j + 1].end = r[j].end;
	memset(&r[j].end, 0, sizeof(r[j].end));
	n->nranges++;
	if (kv_buf_set(&r[j + 1].start, key.p, key.len) != KV_OK ||
	    kv_buf_set(&r[j].end, key.p, key.len) != KV_OK)
		return KV_ENOMEM;
	return KV_OK;
}

/*
 * move with replicas: each replicated range of [start, end) (split at the
 * bounds) gets `node` as its primary. An in-sync replica takes the role at
 * once (the old primary stays in the ISR: the transfer fence, which is
 * refused the role back until it has been copied again); a node
 * outside the replica set joins it outside the ISR as the replacement of
 * the primary, and the repairs hand it the role once it is in the ISR and
 * then drop the old primary.
 */
static int
move_replicated(const kv_config *cur, kv_bytes start, kv_bytes end, uint32_t node, kv_place_ctx *x,
                kv_config **out)
{
	kv_config *n;
	int rv, changed = 0;

	*out = NULL;
	if ((n = next_config(cur)) == NULL)
		return KV_ENOMEM;
	if ((rv = split_at(n, start)) != KV_OK || (rv = split_at(n, end)) != KV_OK)
		goto err;
	for (size_t i = 0; i < n->nranges; i++) {
		kv_range *r = &n->ranges[i];
		char a[96], b[96];
		if (!overlaps(&r->start, &r->end, start.p, start.len, end.p, end.len) ||
		    r->node == node || kv_range_replacement(r, node, true) == r->node)
			continue;
		kv_place_fmt_key(r->start.data, r->start.len, a, sizeof(a));
		kv_place_fmt_key(r->end.data, r->end.len, b, sizeof(b));
		if (!node_live(n, r->node)) {
			say(x,
			    "the primary of [%s, %s), node %u, is %s: retry once it is back or "
			    "failed over",
			    a, b, r->node, kv_node_state_name(kv_config_node(n, r->node)->state));
			rv = KV_EBUSY;
			goto err;
		}
		if (!transferable(r) && kv_range_has_replica(r, node, true)) {
			say(x,
			    "[%s, %s) changed primary at leader epoch %llu and node %u, its "
			    "previous primary, is copied again before the role moves again: retry "
			    "once it is in sync",
			    a, b, (unsigned long long)r->leader_epoch, r->fence);
			rv = KV_EBUSY;
			goto err;
		}
		if (kv_range_has_replica(r, node, true)) {
			promote(r, node, n->epoch);
			changed++;
			continue;
		}
		if (kv_range_has_replica(r, node, false)) {
			say(x,
			    "node %u is a replica of [%s, %s) outside the ISR: retry once it is in "
			    "sync",
			    node, a, b);
			rv = KV_EBUSY;
			goto err;
		}
		/* The primary in no replacement pair, as the replaced member or
		 * as the replacing one (it took over from the member it replaces,
		 * which leaves once it may): a member is in one pair at most. */
		if (kv_range_replacement(r, r->node, false) != 0 ||
		    kv_range_replacement(r, r->node, true) != 0 ||
		    r->nreplicas >= KV_MAX_REPLICAS) {
			say(x,
			    "[%s, %s) is being repaired or moved already: retry when that is done",
			    a, b);
			rv = KV_EBUSY;
			goto err;
		}
		r->replicas[r->nreplicas++] = node;
		r->replacing[r->nreplacing] = node;
		r->replaced[r->nreplacing++] = r->node;
		changed++;
	}
	merge_ranges(n);
	if (changed == 0) {
		kv_config_free(n);
		return KV_OK;
	}
	*out = n;
	return KV_OK;
err:
	kv_config_free(n);
	return rv;
}

int
kv_place_split(const kv_config *cur, kv_bytes key, kv_place_ctx *x, kv_config **out)
{
	kv_config *n;
	long j;
	int rv;
	char a[96], b[96];

	*out = NULL;
	if (key.len == 0 || key.len > KV_HARD_MAX_KEY) {
		say(x, "a split key is 1 to %u bytes", KV_HARD_MAX_KEY);
		return KV_EINVAL;
	}
	if ((j = kv_config_find_range(cur, key.p, key.len)) < 0) {
		say(x, "no range holds the split key");
		return KV_EINVAL;
	}
	const kv_range *r = &cur->ranges[j];
	kv_place_fmt_key(r->start.data, r->start.len, a, sizeof(a));
	kv_place_fmt_key(r->end.data, r->end.len, b, sizeof(b));
	if (kv_key_cmp(r->start.data, r->start.len, key.p, key.len) == 0) {
		say(x, "[%s, %s) starts at the split key already", a, b);
		return KV_EINVAL;
	}
	/* A single range's parts on one node merge again (mergeable). */
	if (r->nreplicas == 0) {
		say(x, "[%s, %s) has one copy: its parts would merge again", a, b);
		return KV_EINVAL;
	}
	if (!node_live(cur, r->node) || !transferable(r) || r->nreplacing != 0 ||
	    r->ninsync != r->nreplicas) {
		say(x,
		    "[%s, %s) has its primary down, a transfer fence, a replacement or a "
		    "replica outside the ISR: retry once it is in sync",
		    a, b);
		return KV_EBUSY;
	}
	if (kv_config_migration_for(cur, key.p, key.len) != NULL) {
		say(x, "[%s, %s) overlaps a migration in flight", a, b);
		return KV_EBUSY;
	}
	if ((n = next_config(cur)) == NULL)
		return KV_ENOMEM;
	if ((rv = split_at(n, key)) != KV_OK) {
		kv_config_free(n);
		return rv;
	}
	/* The upper part: the same primary at a new leader epoch, which is
	 * all that keeps the two parts apart (kv_range_same_placement). */
	n->ranges[j + 1].leader_epoch = n->epoch;
	merge_ranges(n); /* the map invariant, should a neighbour match */
	*out = n;
	return KV_OK;
}

/* The checks an ISR change and an unfence share: the range is well
 * formed, the map is not empty, and the asking primary is live (it holds
 * no lease otherwise: it serves nothing until it is back). */
static int
isr_ask_check(const kv_config *cur, uint32_t primary, kv_bytes start, kv_bytes end, kv_place_ctx *x)
{
	if (start.len > KV_HARD_MAX_KEY || end.len > KV_HARD_MAX_KEY ||
	    kv_range_is_empty(start.p, start.len, end.p, end.len)) {
		say(x, "empty, inverted or oversized range in an ISR change");
		return KV_EINVAL;
	}
	if (cur->nranges == 0) {
		say(x, "the range map is empty (no node has joined)");
		return KV_EINVAL;
	}
	if (kv_config_node(cur, primary) != NULL && !node_live(cur, primary)) {
		say(x, "node %u is %s: it changes no ISR until it is back", primary,
		    kv_node_state_name(kv_config_node(cur, primary)->state));
		return KV_EBUSY;
	}
	return KV_OK;
}

int
kv_place_isr_change(const kv_config *cur, uint32_t primary, kv_bytes start, kv_bytes end,
                    uint64_t leader_epoch, uint32_t add, uint32_t remove, kv_place_ctx *x,
                    kv_config **out, uint32_t *changed)
{
	uint32_t member = add ? add : remove;
	const kv_node *mn = kv_config_node(cur, member);
	bool need = false;
	kv_config *n;
	int rv;

	*out = NULL;
	*changed = 0;
	if ((add == 0) == (remove == 0)) {
		say(x, "an ISR change names exactly one of add_node and remove_node");
		return KV_EINVAL;
	}
	if (primary == 0) {
		say(x, "an ISR change names the asking primary (node_id)");
		return KV_EINVAL;
	}
	if ((rv = isr_ask_check(cur, primary, start, end, x)) != KV_OK)
		return rv;
	for (size_t i = 0; i < cur->nranges; i++) {
		const kv_range *r = &cur->ranges[i];
		char a[96], b[96];
		if (!overlaps(&r->start, &r->end, start.p, start.len, end.p, end.len))
			continue;
		kv_place_fmt_key(r->start.data, r->start.len, a, sizeof(a));
		kv_place_fmt_key(r->end.data, r->end.len, b, sizeof(b));
		if (r->node != primary) {
			say(x,
			    "node %u is not the primary of [%s, %s): node %u is (leader epoch "
			    "%llu)",
			    primary, a, b, r->node, (unsigned long long)r->leader_epoch);
			return KV_ESTALE;
		}
		if (r->leader_epoch != leader_epoch) {
			say(x, "the leader epoch of [%s, %s) is %llu, not %llu", a, b,
			    (unsigned long long)r->leader_epoch, (unsigned long long)leader_epoch);
			return KV_ESTALE;
		}
		if (r->nreplicas == 0) {
			say(x, "[%s, %s) is not replicated: its primary is its only replica", a, b);
			return KV_EINVAL;
		}
		if (remove == primary) {
			say(x, "the primary is never removed from the ISR of [%s, %s)", a, b);
			return KV_EINVAL;
		}
		if (!kv_range_has_replica(r, member, false)) {
			say(x, "node %u is not a replica of [%s, %s)", member, a, b);
			return KV_EINVAL;
		}
		if (add && (mn == NULL || mn->state == KV_NODE_DOWN)) {
			say(x, "node %u is down: it joins an ISR once it is back", add);
			return KV_EBUSY;
		}
		if (remove && kv_range_has_replica(r, remove, true) &&
		    !may_leave(cur, x, r, remove)) {
			say(x,
			    "node %u may still serve [%s, %s) as its primary (it has not applied "
			    "the configuration that made node %u primary): retry",
			    remove, a, b, r->node);
			return KV_EBUSY;
		}
		need = need || kv_range_has_replica(r, member, true) == (remove != 0);
	}
	if (!need)
		return KV_OK;
	if ((n = next_config(cur)) == NULL)
		return KV_ENOMEM;
	if ((rv = split_at(n, start)) != KV_OK || (rv = split_at(n, end)) != KV_OK) {
		kv_config_free(n);
		return rv;
	}
	for (size_t i = 0; i < n->nranges; i++) {
		kv_range *r = &n->ranges[i];
		if (!overlaps(&r->start, &r->end, start.p, start.len, end.p, end.len))
			continue;
		if (add && !kv_range_has_replica(r, add, true)) {
			r->insync[r->ninsync++] = add;
			/* A replacement in the ISR: the member it replaces goes
			 * (doc/replication.md, "Repair"). */
			uint32_t tr = 0;
			(void)drop_replaced(n, x, r, false, &tr);
			(*changed)++;
		} else if (remove && kv_range_has_replica(r, remove, true)) {
			set_remove(r->insync, &r->ninsync, remove);
			(*changed)++;
		}
	}
	merge_ranges(n);
	fix_states(n); /* a leaving node dropped from its last replica set is gone */
	*out = n;
	return KV_OK;
}

/* The fence of every range overlapping [start, end), led by primary at
 * leader_epoch, answered that primary's end of the previous leader epoch in
 * sync: the fence ends, the member stays in the ISR (doc/replication.md
 * "Primary transfer"). The checks of kv_place_isr_change, and the member
 * must still be in the ISR (it would otherwise have joined again only after
 * a copy, which ended the fence). */
int
kv_place_unfence(const kv_config *cur, uint32_t primary, kv_bytes start, kv_bytes end,
                 uint64_t leader_epoch, uint32_t member, kv_place_ctx *x, kv_config **out,
                 uint32_t *changed)
{
	bool need = false;
	kv_config *n;
	int rv;

	*out = NULL;
	*changed = 0;
	if (primary == 0 || member == 0 || member == primary) {
		say(x, "an unfence names the asking primary and another member");
		return KV_EINVAL;
	}
	if ((rv = isr_ask_check(cur, primary, start, end, x)) != KV_OK)
		return rv;
	for (size_t i = 0; i < cur->nranges; i++) {
		const kv_range *r = &cur->ranges[i];
		char a[96], b[96];
		if (!overlaps(&r->start, &r->end, start.p, start.len, end.p, end.len))
			continue;
		kv_place_fmt_key(r->start.data, r->start.len, a, sizeof(a));
		kv_place_fmt_key(r->end.data, r->end.len, b, sizeof(b));
		if (r->node != primary || r->leader_epoch != leader_epoch) {
			say(x,
			    "node %u is not the primary of [%s, %s) at leader epoch %llu: node %u "
			    "is, at %llu",
			    primary, a, b, (unsigned long long)leader_epoch, r->node,
			    (unsigned long long)r->leader_epoch);
			return KV_ESTALE;
		}
		if (r->nreplicas == 0) {
			say(x, "[%s, %s) is not replicated: it has no fence", a, b);
			return KV_EINVAL;
		}
		if (r->fence != 0 && r->fence != member) {
			say(x, "the fence of [%s, %s) is node %u, not node %u", a, b, r->fence,
			    member);
			return KV_ESTALE;
		}
		if (r->fence == member && !kv_range_has_replica(r, member, true)) {
			say(x, "node %u is no longer in the ISR of [%s, %s)", member, a, b);
			return KV_ESTALE;
		}
		need |= r->fence == member;
	}
	if (!need)
		return KV_OK;
	if ((n = next_config(cur)) == NULL)
		return KV_ENOMEM;
	if ((rv = split_at(n, start)) != KV_OK || (rv = split_at(n, end)) != KV_OK) {
		kv_config_free(n);
		return rv;
	}
	for (size_t i = 0; i < n->nranges; i++) {
		kv_range *r = &n->ranges[i];
		if (overlaps(&r->start, &r->end, start.p, start.len, end.p, end.len) &&
		    r->fence == member) {
			r->fence = 0;
			(*changed)++;
		}
	}
	merge_ranges(n);
	*out = n;
	return KV_OK;
}

int
kv_place_remove(const kv_config *cur, uint32_t node, bool silent, bool accept_loss, kv_place_ctx *x,
                kv_config **out, uint32_t *lost, uint64_t *failed, size_t *nfailed)
{
	const kv_node *nd = kv_config_node(cur, node);
	kv_config *n = NULL, *t;
	uint32_t to = 0, k = 0;
	uint64_t best = 0;
	int rv;

	*out = NULL;
	*lost = 0;
	*nfailed = 0;
	if (nd == NULL) {
		say(x, "unknown node %u", node);
		return KV_ENOTFOUND;
	}
	if (nd->state == KV_NODE_GONE) {
		say(x, "node %u is gone already", node);
		return KV_EPERM;
	}
	if (nd->state != KV_NODE_DOWN &&
	    !(silent && (nd->state == KV_NODE_JOINING || nd->state == KV_NODE_DRAINING))) {
		say(x, "node %u is %s: use leave (remove forgets only a node that is down)", node,
		    kv_node_state_name(nd->state));
		return KV_EPERM;
	}
	/* Its migrations end as failed: a range it was receiving goes back to
	 * its source, a range it was sending comes back to it (and is then
	 * counted below). */
	if ((n = kv_config_clone(cur)) == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < cur->nmigs; i++) {
		const kv_migration *m = &cur->migs[i];
		if (m->from != node && m->to != node)
			continue;
		if ((rv = kv_place_finish(n, m->id, false, x, &t)) != KV_OK)
			goto err;
		t->epoch = cur->epoch; /* one change in the end, not one per migration */
		kv_config_free(n);
		n = t;
		failed[(*nfailed)++] = m->id;
	}
	/* Lost: the ranges it leads with no other in-sync member; those
	 * (kk) with no other replica either need a new home. */
	uint32_t kk = 0;
	for (size_t i = 0; i < n->nranges; i++) {
		const kv_range *r = &n->ranges[i];
		if (r->node != node || other_member(n, r, node, true) != 0)
			continue;
		k++;
		kk += other_member(n, r, node, false) == 0;
	}
	if (k > 0 && !accept_loss) {
		say(x,
		    "node %u holds the only copy of %u range%s: they would lose their data "
		    "(add --accept-data-loss to give them to other nodes empty, or restart the "
		    "node)",
		    node, k, k == 1 ? "" : "s");
		rv = KV_EPERM;
		goto err;
	}
	for (size_t i = 0; kk > 0 && i < n->nnodes; i++) {
		uint64_t b;
		if (n->nodes[i].state != KV_NODE_ACTIVE || n->nodes[i].id == node)
			continue;
		b = kv_place_node_bytes(n, x, n->nodes[i].id);
		if (to == 0 || b < best) {
			to = n->nodes[i].id;
			best = b;
		}
	}
	if (kk > 0 && to == 0) {
		say(x, "no active node can take the %u range%s of node %u", kk, kk == 1 ? "" : "s",
		    node);
		rv = KV_EBUSY;
		goto err;
	}
	for (size_t i = 0; i < n->nranges; i++) {
		kv_range *r = &n->ranges[i];
		if (r->nreplicas == 0 ||
		    (r->node == node && other_member(n, r, node, false) == 0)) {
			if (r->node == node) {
				kv_range_set_single(r, to);
				r->leader_epoch = cur->epoch + 1;
			}
			continue;
		}
		if (!kv_range_has_replica(r, node, false))
			continue;
		if (r->node == node) {
			uint32_t q = other_member(n, r, node, true);
			if (q == 0) { /* lost, accepted: an out-of-sync copy leads */
				q = other_member(n, r, node, false);
				r->ninsync = 1;
				r->insync[0] = node;
			}
			promote_over(r, q, cur->epoch + 1);
		}
		drop_member(r, node);
	}
	merge_ranges(n);
	node_mut(n, node)->state = KV_NODE_GONE;
	fix_states(n);
	n->epoch = cur->epoch + 1;
	if (x->replicas >= 2 && (rv = kv_place_add_replicas(n, x->replicas)) < 0)
		goto err;
	*lost = k;
	*out = n;
	return KV_OK;
err:
	kv_config_free(n);
	*nfailed = 0;
	return rv;
}

int
kv_place_set_state(const kv_config *cur, const uint32_t *ids, const kv_node_state *states,
                   size_t nids, kv_config **out)
{
	kv_config *n = next_config(cur);

	*out = NULL;
	if (n == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < nids; i++) {
		kv_node *nd = node_mut(n, ids[i]);
		if (nd == NULL) {
			kv_config_free(n);
			return KV_ENOTFOUND;
		}
		nd->state = states[i];
	}
	*out = n;
	return KV_OK;
}
