/*
 * history.c - the checks of a recorded history (see history.h).
 *
 * DESIGN. Operations are grouped per key; each key is checked on its own
 * (single-key operations are linearizable per key, doc/contract.md §3). Every check is
 * a sweep over operations sorted by one of their two times, so a history of
 * n operations costs O(n log n) time and O(n) memory, allocated once per
 * call. A failed write has complete = CHK_NEVER: it never constrains what
 * comes after it, and it may or may not show up.
 *
 * Each operation is reported at most once (the first check that finds it
 * wrong), so one lost write does not drown the report in echoes.
 */
#include "checker/history.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#define NONE SIZE_MAX

/* A time and an operation (or token) index, for sorting. */
typedef struct {
	uint64_t t; /* the sort key */
	size_t i;   /* what it belongs to */
} ev;

/* One token of an append key's final value. */
typedef struct {
	size_t op;     /* the append that wrote it; NONE for bytes nobody appended */
	uint64_t end;  /* offset just after its ';' */
	uint64_t hash; /* chk_hash of the value up to end */
	bool first;    /* the first occurrence of its append */
} tok;

/* Value identity -> index of the write that wrote it (open addressing). */
typedef struct {
	uint64_t *ids; /* 0: empty slot */
	size_t *idx;   /* op index per slot */
	size_t mask;   /* slots - 1 */
} wtab;

/* State of one chk_check() call. */
typedef struct {
	const chk_key *keys; /* the key table */
	size_t nkeys;        /* its size */
	const chk_op *ops;   /* the history */
	size_t nops;         /* its size */
	chk_result *res;     /* the result being filled */
	wtab w;              /* writers by value identity */
	size_t *pos;         /* per op: first position of its token in the final value, or NONE */
	bool *flagged;       /* per op: already reported */
	bool *has_del;       /* per key: a delete of it is in the history */
	bool *mark;          /* per op: scratch of the search (all false between keys) */
	size_t max_states;   /* bound of the search of one register with deletes */
} ctx;

/* Whether an op reads a register like a get (a get or a scan's part). */
static bool
is_read(uint8_t kind)
{
	return kind == CHK_GET || kind == CHK_SCAN;
}

int
chk_format_val(char *buf, size_t len, uint64_t id)
{
	return snprintf(buf, len, "c%" PRIu32 ".%" PRIu32, (uint32_t)(id >> 32), (uint32_t)id);
}

/* Parses decimal digits of p[*i..n) as a uint32 with no leading zeros. */
static bool
parse_u32(const uint8_t *p, size_t n, size_t *i, uint32_t *out)
{
	uint64_t v = 0;
	size_t start = *i;

	while (*i < n && p[*i] >= '0' && p[*i] <= '9') {
		v = v * 10 + (uint64_t)(p[*i] - '0');
		if (v > UINT32_MAX)
			return false;
		(*i)++;
	}
	if (*i == start || (p[start] == '0' && *i - start > 1))
		return false;
	*out = (uint32_t)v;
	return true;
}

bool
chk_parse_val(const void *pv, size_t n, uint64_t *id)
{
	const uint8_t *p = pv;
	size_t i = 1;
	uint32_t c, s;

	if (n < 4 || p[0] != 'c')
		return false;
	if (!parse_u32(p, n, &i, &c) || i >= n || p[i] != '.')
		return false;
	i++;
	if (!parse_u32(p, n, &i, &s) || i != n || c == 0 || s == 0)
		return false;
	*id = chk_val_id(c, s);
	return true;
}

size_t
chk_loosen(chk_op *ops, size_t nops, const chk_loose_win *win, size_t nwin)
{
	size_t n = 0;

	for (size_t i = 0; i < nops; i++) {
		chk_op *o = &ops[i];
		if (o->txn == 0 || (o->txn & CHK_TXN_LOOSE) ||
		    (o->kind != CHK_PUT && o->kind != CHK_GET))
			continue;
		uint64_t end = o->complete == CHK_NEVER ? UINT64_MAX : o->complete;
		for (size_t j = 0; j < nwin; j++) {
			const chk_loose_win *w = &win[j];
			if (o->key >= w->first && o->key - w->first < w->n && o->invoke <= w->to &&
			    end >= w->from) {
				o->txn |= CHK_TXN_LOOSE;
				n++;
				break;
			}
		}
	}
	return n;
}

uint64_t
chk_hash(uint64_t h, const void *pv, size_t n)
{
	const uint8_t *p = pv;

	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

const char *
chk_violation_name(int kind)
{
	switch (kind) {
	case CHK_V_LOST:
		return "lost append";
	case CHK_V_DUPLICATE:
		return "duplicated append";
	case CHK_V_REORDER:
		return "appends out of real-time order";
	case CHK_V_APPEND_LEN:
		return "append length mismatch";
	case CHK_V_UNKNOWN_TOKEN:
		return "unknown bytes in value";
	case CHK_V_STALE_READ:
		return "stale read";
	case CHK_V_FUTURE_READ:
		return "read from the future";
	case CHK_V_NEVER_WRITTEN:
		return "read of a value never written";
	case CHK_V_NOT_PREFIX:
		return "read is not a prefix of the final value";
	case CHK_V_BAD_HISTORY:
		return "malformed history";
	case CHK_V_UNORDERED:
		return "no linearization of the writes";
	case CHK_V_FRACTURED:
		return "mput seen in part";
	case CHK_V_TXN_CYCLE:
		return "mput orders in a circle";
	default:
		return "unknown violation";
	}
}

/* Records a violation of op (once per op unless op is NONE). */
static void __attribute__((format(printf, 6, 7)))
violation(ctx *x, int kind, uint32_t key, size_t op, size_t other, const char *fmt, ...)
{
	chk_result *r = x->res;
	va_list ap;

	if (op != NONE) {
		if (x->flagged[op])
			return;
		x->flagged[op] = true;
	}
	r->nviolations++;
	if (r->nkept >= CHK_MAX_KEPT)
		return;
	chk_violation *v = &r->v[r->nkept++];
	v->kind = kind;
	v->key = key;
	v->op = op;
	v->other = other;
	va_start(ap, fmt);
	vsnprintf(v->msg, sizeof(v->msg), fmt, ap);
	va_end(ap);
}

static int
ev_cmp(const void *a, const void *b)
{
	const ev *x = a, *y = b;

	if (x->t != y->t)
		return x->t < y->t ? -1 : 1;
	return x->i < y->i ? -1 : x->i > y->i;
}

/* Orders events by t alone (bsearch on a sorted array of distinct t). */
static int
ev_t_cmp(const void *a, const void *b)
{
	const ev *x = a, *y = b;

	return x->t < y->t ? -1 : x->t > y->t;
}

static void
ev_sort(ev *e, size_t n)
{
	if (n > 1)
		qsort(e, n, sizeof(*e), ev_cmp);
}

/* ------------------------------------------------------------------------
 * Writers by value identity
 * ------------------------------------------------------------------------ */

static uint64_t
mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return x;
}

static int
wtab_init(wtab *t, size_t nwrites)
{
	size_t slots = 16;

	while (slots < nwrites * 2)
		slots *= 2;
	t->ids = calloc(slots, sizeof(*t->ids));
	t->idx = calloc(slots, sizeof(*t->idx));
	t->mask = slots - 1;
	return t->ids && t->idx ? 0 : -1;
}

static void
wtab_fini(wtab *t)
{
	free(t->ids);
	free(t->idx);
}

/* Returns the index of the write of id, or NONE. */
static size_t
wtab_find(const wtab *t, uint64_t id)
{
	if (id == 0)
		return NONE;
	for (size_t s = mix(id) & t->mask;; s = (s + 1) & t->mask) {
		if (t->ids[s] == 0)
			return NONE;
		if (t->ids[s] == id)
			return t->idx[s];
	}
}

/* Adds the write op of id; returns the index already there, or NONE. */
static size_t
wtab_add(wtab *t, uint64_t id, size_t op)
{
	for (size_t s = mix(id) & t->mask;; s = (s + 1) & t->mask) {
		if (t->ids[s] == 0) {
			t->ids[s] = id;
			t->idx[s] = op;
			return NONE;
		}
		if (t->ids[s] == id)
			return t->idx[s];
	}
}

/* ------------------------------------------------------------------------
 * Append keys
 * ------------------------------------------------------------------------ */

static const char *
val_str(char *buf, size_t len, uint64_t id)
{
	chk_format_val(buf, len, id);
	return buf;
}

/* Splits the final value of key k into tokens and checks each one names an
 * append of k, once. Returns the token count, or -1 on ENOMEM (*out NULL). */
static long
tokenize(ctx *x, uint32_t k, tok **out)
{
	const chk_key *key = &x->keys[k];
	const uint8_t *p = key->final;
	size_t n = key->final_found ? key->final_len : 0, ntok = 0, start = 0;
	uint64_t h = CHK_HASH_INIT;
	tok *t;
	char b1[40];

	for (size_t i = 0; i < n; i++)
		ntok += p[i] == ';';
	*out = t = calloc(ntok + 1, sizeof(*t));
	if (t == NULL)
		return -1;
	ntok = 0;
	for (size_t i = 0; i < n; i++) {
		if (p[i] != ';')
			continue;
		uint64_t id;
		size_t op = NONE;
		h = chk_hash(h, p + start, i + 1 - start);
		if (!chk_parse_val(p + start, i - start, &id)) {
			violation(x, CHK_V_UNKNOWN_TOKEN, k, NONE, NONE,
			          "bytes %zu..%zu of the final value (\"%.*s\") are not a token",
			          start, i, (int)(i - start > 40 ? 40 : i - start), p + start);
		} else if ((op = wtab_find(&x->w, id)) == NONE) {
			violation(x, CHK_V_UNKNOWN_TOKEN, k, NONE, NONE,
			          "token %s at offset %zu was never appended",
			          val_str(b1, sizeof(b1), id), start);
		} else if (x->ops[op].kind != CHK_APPEND || x->ops[op].key != k) {
			violation(x, CHK_V_UNKNOWN_TOKEN, k, NONE, op,
			          "token %s at offset %zu was written to key %s, not here",
			          val_str(b1, sizeof(b1), id), start, x->keys[x->ops[op].key].name);
			op = NONE;
		}
		t[ntok].op = op;
		t[ntok].end = i + 1;
		t[ntok].hash = h;
		if (op != NONE) {
			if (x->pos[op] == NONE) {
				x->pos[op] = ntok;
				t[ntok].first = true;
			} else {
				violation(
				    x, CHK_V_DUPLICATE, k, op, NONE,
				    "token %s appears at positions %zu and %zu of the final value",
				    val_str(b1, sizeof(b1), id), x->pos[op], ntok);
			}
		}
		ntok++;
		start = i + 1;
	}
	if (start < n)
		violation(x, CHK_V_UNKNOWN_TOKEN, k, NONE, NONE,
		          "the final value ends with %zu bytes that are not a token (\"%.*s\")",
		          n - start, (int)(n - start > 40 ? 40 : n - start), p + start);
	x->res->tokens += ntok;
	return (long)ntok;
}

/* Finds how many tokens a get of an append key read: the k with
 * t[k-1].end == len and a matching hash (0 for len 0). NONE: not a prefix. */
static size_t
prefix_tokens(const tok *t, size_t ntok, uint64_t len, uint64_t hash)
{
	size_t lo = 0, hi = ntok;

	if (len == 0)
		return hash == CHK_HASH_INIT ? 0 : NONE;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (t[mid].end < len)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo < ntok && t[lo].end == len && t[lo].hash == hash)
		return lo + 1;
	return NONE;
}

static int
check_append_key(ctx *x, uint32_t k, const size_t *idx, size_t n)
{
	const chk_op *o = x->ops;
	tok *t = NULL;
	size_t *rk = NULL, *rop = NULL, nreads = 0, ne, nr;
	ev *e = NULL, *r = NULL;
	long ntl;
	char b1[40], b2[40];
	int rv = -1;

	for (size_t j = 0; j < n; j++)
		if (o[idx[j]].kind == CHK_APPEND) {
			if (o[idx[j]].status == CHK_OK)
				x->res->appends_acked++;
			else
				x->res->appends_failed++;
		}
	if (!x->keys[k].final_known) {
		x->res->keys_unchecked++;
		return 0;
	}
	if ((ntl = tokenize(x, k, &t)) < 0)
		return -1;
	size_t ntok = (size_t)ntl;

	/* Lost and misplaced appends. */
	for (size_t j = 0; j < n; j++) {
		size_t a = idx[j];
		if (o[a].kind != CHK_APPEND)
			continue;
		if (o[a].status == CHK_OK) {
			/* A partial final value (the longest read) need only hold
			 * the appends completed before that read began. */
			bool owed =
			    !x->keys[k].final_partial || o[a].complete < x->keys[k].final_invoke;
			if (x->pos[a] == NONE && owed)
				violation(x, CHK_V_LOST, k, a, NONE,
				          "acknowledged append %s is not in the %s",
				          val_str(b1, sizeof(b1), o[a].val),
				          x->keys[k].final_partial
				              ? "longest read, which began after it completed"
				              : "final value");
			else if (x->pos[a] == NONE)
				continue;
			else if (o[a].len != 0 && o[a].len != t[x->pos[a]].end)
				violation(x, CHK_V_APPEND_LEN, k, a, NONE,
				          "append %s returned length %" PRIu64
				          " but its token ends at offset %" PRIu64,
				          val_str(b1, sizeof(b1), o[a].val), o[a].len,
				          t[x->pos[a]].end);
		} else if (x->pos[a] != NONE) {
			x->res->appends_failed_applied++;
		}
	}

	/* Real-time order: no token may follow one whose append began after
	 * it completed. Scan from the end keeping the earliest completion. */
	uint64_t minc = CHK_NEVER;
	size_t mino = NONE;
	for (size_t j = ntok; j-- > 0;) {
		size_t b = t[j].op;
		if (b == NONE || !t[j].first)
			continue;
		if (minc < o[b].invoke)
			violation(x, CHK_V_REORDER, k, mino, b,
			          "append %s completed before append %s began, but its token comes "
			          "after it (positions %zu and %zu)",
			          val_str(b1, sizeof(b1), o[mino].val),
			          val_str(b2, sizeof(b2), o[b].val), x->pos[mino], j);
		if (o[b].complete < minc) {
			minc = o[b].complete;
			mino = b;
		}
	}

	/* Gets: which prefix each one read. rop[q] is the q-th checked get,
	 * rk[q] the number of tokens it read. */
	rk = malloc((n + 1) * sizeof(*rk));
	rop = malloc((n + 1) * sizeof(*rop));
	e = malloc((n + ntok + 1) * sizeof(*e));
	r = malloc((n + 1) * sizeof(*r));
	if (rk == NULL || rop == NULL || e == NULL || r == NULL)
		goto out;
	for (size_t j = 0; j < n; j++) {
		size_t g = idx[j];
		if (o[g].kind != CHK_GET || o[g].status == CHK_FAILED)
			continue;
		size_t kk = 0;
		if (o[g].status != CHK_NOTFOUND) {
			kk = prefix_tokens(t, ntok, o[g].len, o[g].hash);
			if (kk == NONE) {
				violation(x, CHK_V_NOT_PREFIX, k, g, NONE,
				          "a get read %" PRIu64
				          " bytes that are not a prefix of the final value "
				          "(%zu bytes)",
				          o[g].len,
				          x->keys[k].final_found ? x->keys[k].final_len : 0);
				continue;
			}
		}
		x->res->reads_checked++;
		rk[nreads] = kk;
		rop[nreads] = g;
		nreads++;
	}

	/* Every append completed before a get began is in what it read. */
	ne = 0;
	for (size_t j = 0; j < ntok; j++)
		if (t[j].op != NONE && t[j].first && o[t[j].op].complete != CHK_NEVER)
			e[ne++] = (ev){o[t[j].op].complete, j};
	ev_sort(e, ne);
	for (size_t j = 0; j < nreads; j++)
		r[j] = (ev){o[rop[j]].invoke, j};
	ev_sort(r, nreads);
	{
		size_t c = 0, maxp = NONE;
		for (size_t j = 0; j < nreads; j++) {
			while (c < ne && e[c].t < r[j].t) {
				if (maxp == NONE || e[c].i > maxp)
					maxp = e[c].i;
				c++;
			}
			size_t q = r[j].i;
			if (maxp != NONE && maxp >= rk[q])
				violation(x, CHK_V_STALE_READ, k, rop[q], t[maxp].op,
				          "a get read %zu tokens, but append %s (position %zu) "
				          "completed before the get began",
				          rk[q], val_str(b1, sizeof(b1), o[t[maxp].op].val), maxp);
		}
	}

	/* No append begun after a get ended is in what it read. */
	ne = 0;
	for (size_t j = 0; j < ntok; j++)
		if (t[j].op != NONE && t[j].first)
			e[ne++] = (ev){UINT64_MAX - o[t[j].op].invoke, j};
	ev_sort(e, ne);
	for (size_t j = 0; j < nreads; j++)
		r[j] =
		    (ev){o[rop[j]].complete == CHK_NEVER ? 0 : UINT64_MAX - o[rop[j]].complete, j};
	ev_sort(r, nreads);
	{
		size_t c = 0, minp = NONE;
		for (size_t j = 0; j < nreads; j++) {
			/* descending times: tokens whose append began after the get ended */
			while (c < ne && e[c].t < r[j].t) {
				if (minp == NONE || e[c].i < minp)
					minp = e[c].i;
				c++;
			}
			size_t q = r[j].i;
			if (minp != NONE && minp < rk[q])
				violation(
				    x, CHK_V_FUTURE_READ, k, rop[q], t[minp].op,
				    "a get read %zu tokens, including append %s (position %zu) "
				    "that began after the get ended",
				    rk[q], val_str(b1, sizeof(b1), o[t[minp].op].val), minp);
		}
	}

	/* A get reads no fewer tokens than a get that ended before it began. */
	nr = 0;
	for (size_t j = 0; j < nreads; j++)
		if (o[rop[j]].complete != CHK_NEVER)
			e[nr++] = (ev){o[rop[j]].complete, j};
	ev_sort(e, nr);
	for (size_t j = 0; j < nreads; j++)
		r[j] = (ev){o[rop[j]].invoke, j};
	ev_sort(r, nreads);
	{
		size_t c = 0, best = NONE;
		for (size_t j = 0; j < nreads; j++) {
			while (c < nr && e[c].t < r[j].t) {
				if (best == NONE || rk[e[c].i] > rk[best])
					best = e[c].i;
				c++;
			}
			size_t q = r[j].i;
			if (best != NONE && rk[best] > rk[q])
				violation(
				    x, CHK_V_STALE_READ, k, rop[q], rop[best],
				    "a get read %zu tokens, but a get that ended before it began "
				    "read %zu",
				    rk[q], rk[best]);
		}
	}
	rv = 0;
out:
	free(rop);
	free(t);
	free(rk);
	free(e);
	free(r);
	return rv;
}

/* ------------------------------------------------------------------------
 * Registers
 * ------------------------------------------------------------------------ */

/*
 * The complete check of one register (Gibbons and Korach's zones). The two
 * sweeps above compare only operations ordered in real time and give the
 * common anomalies a precise message; this one also uses the write order
 * that the reads imply, and decides linearizability exactly.
 *
 * A cluster is a written value with the gets that read it; the value
 * "absent" is written by a virtual put that completes at time 0. A failed
 * put completes at infinity and its cluster is dropped when nobody read
 * it (it may never have taken effect). A cluster's low end lo is the first
 * completion among its operations, its high end hi the last invocation.
 * When lo < hi the zone is forward, [lo, hi]: the value must be the
 * register's from before lo until after hi, so nothing else is written in
 * it. Otherwise it is backward, [hi, lo]: the put and all its reads fit in
 * it. With every read after its put (checked above), the register is
 * linearizable exactly when no two forward zones intersect and no
 * backward zone lies strictly inside a forward one.
 *
 * Sorting the zones makes it O(n log n) in the key's operations.
 */
typedef struct {
	uint64_t lo;  /* the first completion among the cluster's ops */
	uint64_t hi;  /* the last invocation among them */
	size_t lo_op; /* the op that completes at lo; NONE: the virtual put */
	size_t hi_op; /* the op that is invoked at hi */
	size_t put;   /* the put; NONE: the virtual put of "absent" */
	bool used;    /* a real op belongs to it (the virtual one needs a read) */
} zone;

static int
zone_cmp(const void *a, const void *b)
{
	const zone *x = a, *y = b;

	if (x->lo != y->lo)
		return x->lo < y->lo ? -1 : 1;
	return x->hi < y->hi ? -1 : x->hi > y->hi;
}

static int
zones_check(ctx *x, uint32_t k, const size_t *idx, size_t n, const size_t *rw, const size_t *rop,
            size_t nreads)
{
	const chk_op *o = x->ops;
	size_t nz = 0, nf = 0, nb = 0, nput = 0;
	ev *byop = NULL;
	zone *z = NULL, *fw = NULL, *bw = NULL;
	char b1[40], b2[40];
	int rv = -1;

	byop = malloc((n + 1) * sizeof(*byop)); /* (put's op index, its zone) */
	z = malloc((n + 1) * sizeof(*z));
	fw = malloc((n + 1) * sizeof(*fw));
	bw = malloc((n + 1) * sizeof(*bw));
	if (byop == NULL || z == NULL || fw == NULL || bw == NULL)
		goto out;
	z[nz++] = (zone){.lo = 0, .hi = 0, .lo_op = NONE, .hi_op = NONE, .put = NONE};
	for (size_t j = 0; j < n; j++) {
		size_t g = idx[j];
		if (o[g].kind != CHK_PUT)
			continue;
		byop[nput++] = (ev){g, nz};
		z[nz++] = (zone){.lo = o[g].complete,
		                 .hi = o[g].invoke,
		                 .lo_op = g,
		                 .hi_op = g,
		                 .put = g,
		                 .used = o[g].status == CHK_OK};
	}
	ev_sort(byop, nput);
	for (size_t q = 0; q < nreads; q++) {
		size_t g = rop[q];
		zone *c = &z[0];
		if (rw[q] != NONE) {
			ev want = {rw[q], 0};
			ev *hit = bsearch(&want, byop, nput, sizeof(*byop), ev_t_cmp);
			if (hit == NULL)
				continue; /* reported above: never put to this key */
			c = &z[hit->i];
		}
		if (o[g].complete < c->lo) {
			c->lo = o[g].complete;
			c->lo_op = g;
		}
		if (o[g].invoke > c->hi) {
			c->hi = o[g].invoke;
			c->hi_op = g;
		}
		c->used = true;
	}
	for (size_t c = 0; c < nz; c++) {
		if (!z[c].used || z[c].lo == CHK_NEVER)
			continue;
		if (z[c].lo < z[c].hi)
			fw[nf++] = z[c];
		else
			bw[nb++] = (zone){.lo = z[c].hi,
			                  .hi = z[c].lo,
			                  .lo_op = z[c].hi_op,
			                  .hi_op = z[c].lo_op,
			                  .put = z[c].put};
	}
	if (nf > 1)
		qsort(fw, nf, sizeof(*fw), zone_cmp);
	if (nb > 1)
		qsort(bw, nb, sizeof(*bw), zone_cmp);

	/* No two forward zones intersect: sorted by start, each begins after
	 * the furthest end so far. fw[far] is the zone that reaches furthest. */
	for (size_t i = 1, far = 0; i < nf; i++) {
		if (fw[i].lo < fw[far].hi) {
			violation(x, CHK_V_UNORDERED, k, fw[far].hi_op, fw[i].lo_op,
			          "no order of the puts explains the reads: %s stays visible until "
			          "this get, but %s was written and seen in that time",
			          fw[far].put == NONE ? "absent"
			                              : val_str(b1, sizeof(b1), o[fw[far].put].val),
			          fw[i].put == NONE ? "absent"
			                            : val_str(b2, sizeof(b2), o[fw[i].put].val));
		}
		if (fw[i].hi > fw[far].hi)
			far = i;
	}
	/* No backward zone inside a forward one: walk the backward zones by
	 * start; among the forward zones that start before, the one that ends
	 * latest is the only candidate. */
	for (size_t b = 0, f = 0, far = NONE; b < nb; b++) {
		while (f < nf && fw[f].lo < bw[b].lo) {
			if (far == NONE || fw[f].hi > fw[far].hi)
				far = f;
			f++;
		}
		if (far == NONE || !(bw[b].hi < fw[far].hi))
			continue;
		violation(x, CHK_V_UNORDERED, k, fw[far].hi_op, bw[b].put,
		          "no order of the puts explains the reads: %s stays visible until this "
		          "get, but put %s took effect (with every read of it) in that time",
		          fw[far].put == NONE ? "absent"
		                              : val_str(b1, sizeof(b1), o[fw[far].put].val),
		          bw[b].put == NONE ? "absent" : val_str(b2, sizeof(b2), o[bw[b].put].val));
	}
	rv = 0;
out:
	free(byop);
	free(z);
	free(fw);
	free(bw);
	return rv;
}

/*
 * Registers with deletes: the search (Wing and Gong's, with Lowe's memo).
 *
 * The operations of the key become a list of call and return entries in
 * time order (at equal times calls first: operations that touch are
 * concurrent). The search walks the list from its head: a call whose
 * operation may take effect now (a put always; a get or delete when the
 * register holds what it returned; a failed delete when the register holds
 * a value) is placed, its entries lifted out of the list, and the walk
 * starts over; a return entry reached means the operation it ends could
 * not be placed before it, so the last placement is undone and the walk
 * goes on after it. Every acknowledged operation placed is a
 * linearization. A state, the set of operations placed and the register's
 * value, is visited once: the set is kept as a 128-bit sum of random
 * words per operation (a collision could only hide a valid order, never a
 * violation), and the states visited are bounded by x->max_states.
 *
 * A failed put that no get or delete read is left out: whatever it
 * overwrote, the next operation that looks at the register is a write, so
 * an order with it is valid without it too. A failed delete is placed only
 * where the register holds a value (where it is absent the delete changes
 * nothing). Failed gets and scans were dropped before.
 */

/* One entry of the search's list. */
typedef struct {
	size_t op;    /* the key's op (index into ops) */
	size_t match; /* a call: its return entry (NONE: a failed op, none); a return: NONE */
	bool call;    /* call or return */
	uint64_t t;   /* its time (for sorting) */
} sentry;

/* One visited state of the memo. */
typedef struct {
	uint64_t h1, h2; /* the set of placed ops (h1 | 1: used) */
	uint64_t val;    /* the register's value (0: absent) */
} sstate;

typedef struct {
	sstate *s;   /* slots */
	size_t mask; /* slots - 1 */
	size_t n;    /* used */
} smemo;

/* Adds a state; returns 1 when it is new, 0 when it was seen, -1 on ENOMEM. */
static int
smemo_add(smemo *m, uint64_t h1, uint64_t h2, uint64_t val)
{
	if (2 * (m->n + 1) > m->mask + 1) {
		size_t slots = m->s ? 2 * (m->mask + 1) : 1024;
		sstate *s = calloc(slots, sizeof(*s));
		if (s == NULL)
			return -1;
		for (size_t i = 0; m->s && i <= m->mask; i++) {
			if (m->s[i].h1 == 0)
				continue;
			size_t j = mix(m->s[i].h1 ^ m->s[i].val) & (slots - 1);
			while (s[j].h1 != 0)
				j = (j + 1) & (slots - 1);
			s[j] = m->s[i];
		}
		free(m->s);
		m->s = s;
		m->mask = slots - 1;
	}
	h1 |= 1;
	for (size_t j = mix(h1 ^ val) & m->mask;; j = (j + 1) & m->mask) {
		if (m->s[j].h1 == 0) {
			m->s[j] = (sstate){h1, h2, val};
			m->n++;
			return 1;
		}
		if (m->s[j].h1 == h1 && m->s[j].h2 == h2 && m->s[j].val == val)
			return 0;
	}
}

static int
sentry_cmp(const void *a, const void *b)
{
	const sentry *x = a, *y = b;

	if (x->t != y->t)
		return x->t < y->t ? -1 : 1;
	if (x->call != y->call)
		return x->call ? -1 : 1; /* calls first: touching ops are concurrent */
	return x->op < y->op ? -1 : x->op > y->op;
}

/* What op does to the register holding `cur`: false when it cannot take
 * effect there, else true and *next is the value after it. */
static bool
search_apply(const chk_op *o, uint64_t cur, uint64_t *next)
{
	uint64_t seen = o->status == CHK_OK ? o->val : 0;

	switch (o->kind) {
	case CHK_PUT:
		*next = o->val;
		return true;
	case CHK_DEL:
		*next = 0;
		return o->status == CHK_FAILED ? cur != 0 : seen == cur;
	case CHK_CAS:
		if (o->status == CHK_MISMATCH) {
			*next = cur;
			return cur != o->hash && (o->len == CHK_CUR_UNKNOWN || o->len == cur);
		}
		*next = o->val; /* applied, or (failed) applied here */
		return cur == o->hash;
	default:
		*next = cur;
		return seen == cur;
	}
}

/* Counts a put of a register key as acknowledged or not. */
static void
count_put(ctx *x, const chk_op *op)
{
	if (op->status == CHK_OK)
		x->res->writes_acked++;
	else
		x->res->writes_failed++;
}

static int
search_register_key(ctx *x, uint32_t k, const size_t *idx, size_t n)
{
	const chk_op *o = x->ops;
	size_t *keep = NULL, nkeep = 0, ne = 0, nreq = 0, *next = NULL, *prev = NULL;
	sentry *en = NULL;
	uint64_t *z = NULL;
	bool bad = false;
	smemo memo = {0};
	struct frame {
		size_t e;     /* the call entry placed */
		uint64_t val; /* the value before it */
	} *stack = NULL;
	char b1[40];
	int rv = -1;

	keep = malloc((n + 1) * sizeof(*keep));
	if (keep == NULL)
		goto out;
	bool cas_blind = false; /* a refused cas whose current value is not known */
	for (size_t j = 0; j < n; j++)
		cas_blind |= o[idx[j]].kind == CHK_CAS && o[idx[j]].status == CHK_MISMATCH &&
		             o[idx[j]].len == CHK_CUR_UNKNOWN;

	/* What each get and delete read must have been put to this key, and
	 * not after the read ended. */
	for (size_t j = 0; j < n; j++) {
		size_t g = idx[j];
		if (o[g].kind == CHK_PUT) {
			count_put(x, &o[g]);
			continue;
		}
		if (o[g].kind == CHK_CAS) {
			if (o[g].status == CHK_OK)
				x->res->cas_applied++;
			else if (o[g].status == CHK_MISMATCH)
				x->res->cas_mismatched++;
			else
				x->res->cas_failed++;
			/* What an applied cas expected, or a refused one was told,
			 * must have been written to this key. */
			uint64_t seen = o[g].status == CHK_OK         ? o[g].hash
			                : o[g].status == CHK_MISMATCH ? o[g].len
			                                              : 0;
			if (seen == 0 || seen == CHK_CUR_UNKNOWN)
				continue;
			size_t w = wtab_find(&x->w, seen);
			if (w == NONE || (o[w].kind != CHK_PUT && o[w].kind != CHK_CAS) ||
			    o[w].key != k) {
				violation(x, CHK_V_NEVER_WRITTEN, k, g, w,
				          "a cas %s %s, which was never written to this key",
				          o[g].status == CHK_OK ? "expected"
				                                : "was told the key held",
				          val_str(b1, sizeof(b1), seen));
				bad = true;
				continue;
			}
			if (o[w].invoke > o[g].complete) {
				violation(x, CHK_V_FUTURE_READ, k, g, w,
				          "a cas saw %s, whose write began after the cas ended",
				          val_str(b1, sizeof(b1), seen));
				bad = true;
			}
			x->mark[w] = true; /* read: a failed write of it is kept */
			continue;
		}
		if (o[g].kind == CHK_DEL) {
			if (o[g].status == CHK_FAILED)
				x->res->deletes_failed++;
			else
				x->res->deletes_acked++;
		}
		if (o[g].status == CHK_FAILED)
			continue;
		const char *what = o[g].kind == CHK_DEL ? "a delete" : "a get";
		if (o[g].status == CHK_GARBAGE) {
			violation(x, CHK_V_NEVER_WRITTEN, k, g, NONE,
			          "%s read %" PRIu64 " bytes that are no value of the checker",
			          what, o[g].len);
			bad = true;
			continue;
		}
		if (o[g].status != CHK_OK)
			continue;
		size_t w = wtab_find(&x->w, o[g].val);
		if (w == NONE || (o[w].kind != CHK_PUT && o[w].kind != CHK_CAS) || o[w].key != k) {
			violation(x, CHK_V_NEVER_WRITTEN, k, g, w,
			          "%s read %s, which was never put to this key", what,
			          val_str(b1, sizeof(b1), o[g].val));
			bad = true;
			continue;
		}
		if (o[w].invoke > o[g].complete) {
			violation(x, CHK_V_FUTURE_READ, k, g, w,
			          "%s read %s, whose put began after it ended", what,
			          val_str(b1, sizeof(b1), o[g].val));
			bad = true;
			continue;
		}
		x->mark[w] = true;
	}
	for (size_t j = 0; j < n; j++) {
		size_t g = idx[j];
		/* With a cas refused on a value it was not told, an unread failed
		 * put may be what made it refuse: kept then. */
		bool unread = o[g].kind == CHK_PUT && !x->mark[g] && !cas_blind;
		x->mark[g] = false;
		if (o[g].status == CHK_FAILED && (is_read(o[g].kind) || unread))
			continue;
		if (is_read(o[g].kind) || (o[g].kind == CHK_CAS && o[g].status == CHK_MISMATCH))
			x->res->reads_checked++;
		keep[nkeep++] = g;
	}
	if (bad) { /* reported above: the search would only echo it */
		rv = 0;
		goto out;
	}
	x->res->registers_searched++;

	/* The list: entries 1..ne in time order between the sentinels 0 and
	 * ne + 1. */
	en = malloc((2 * nkeep + 2) * sizeof(*en));
	z = malloc((2 * nkeep + 1) * sizeof(*z));
	stack = malloc((nkeep + 1) * sizeof(*stack));
	if (en == NULL || z == NULL || stack == NULL)
		goto out;
	for (size_t j = 0; j < nkeep; j++) {
		const chk_op *a = &o[keep[j]];
		en[ne++] = (sentry){.op = keep[j], .match = NONE, .call = true, .t = a->invoke};
		if (a->complete != CHK_NEVER) {
			en[ne++] =
			    (sentry){.op = keep[j], .match = NONE, .call = false, .t = a->complete};
			nreq++;
		}
	}
	if (ne > 1)
		qsort(en, ne, sizeof(*en), sentry_cmp);
	memmove(en + 1, en, ne * sizeof(*en));
	next = malloc((ne + 2) * sizeof(*next));
	prev = malloc((ne + 2) * sizeof(*prev));
	if (next == NULL || prev == NULL)
		goto out;
	{
		/* Pair each call with its return: by op, the entries sorted. */
		ev *byop = malloc((ne + 1) * sizeof(*byop));
		if (byop == NULL)
			goto out;
		for (size_t i = 1; i <= ne; i++)
			byop[i - 1] = (ev){.t = (uint64_t)en[i].op * 2 + !en[i].call, .i = i};
		ev_sort(byop, ne);
		for (size_t i = 0; i + 1 < ne; i++)
			if (byop[i].t / 2 == byop[i + 1].t / 2)
				en[byop[i].i].match = byop[i + 1].i;
		free(byop);
	}
	uint64_t seed = 0x9e3779b97f4a7c15ull * (k + 1);
	for (size_t i = 0; i <= ne; i++) {
		next[i] = i + 1;
		prev[i + 1] = i;
		seed += 0x9e3779b97f4a7c15ull;
		z[i] = mix(seed) ^ mix(seed ^ 0x5555555555555555ull) << 1;
	}

	/* The walk. h1, h2: the set placed (per call entry e: z[e], and z[e] mixed
	 * again); val: the register's value (0: absent). */
	uint64_t h1 = 0, h2 = 0, val = 0;
	size_t sp = 0, done = 0, best = 0, blocker = NONE, last = NONE, e = next[0];
	int m = smemo_add(&memo, h1, h2, val);
	if (m < 0)
		goto out;
	while (done < nreq) {
		if (e == ne + 1 || !en[e].call) {
			/* The op of this return could not be placed before it. */
			if (e <= ne && (blocker == NONE || done > best)) {
				best = done;
				blocker = en[e].op;
				last = sp ? en[stack[sp - 1].e].op : NONE;
			}
			if (sp == 0)
				break;
			struct frame f = stack[--sp];
			size_t c = f.e, r = en[c].match;
			/* Put its entries back (the reverse of lifting). */
			if (r != NONE) {
				next[prev[r]] = r;
				prev[next[r]] = r;
				done--;
			}
			next[prev[c]] = c;
			prev[next[c]] = c;
			h1 ^= z[c];
			h2 ^= mix(z[c]);
			val = f.val;
			e = next[c];
			continue;
		}
		uint64_t nv;
		if (search_apply(&o[en[e].op], val, &nv)) {
			m = smemo_add(&memo, h1 ^ z[e], h2 ^ mix(z[e]), nv);
			if (m < 0)
				goto out;
			if (m > 0) {
				if (memo.n > x->max_states) {
					x->res->registers_unchecked++;
					rv = 0;
					goto out;
				}
				stack[sp++] = (struct frame){e, val};
				h1 ^= z[e];
				h2 ^= mix(z[e]);
				val = nv;
				next[prev[e]] = next[e];
				prev[next[e]] = prev[e];
				size_t r = en[e].match;
				if (r != NONE) {
					next[prev[r]] = next[r];
					prev[next[r]] = prev[r];
					done++;
				}
				e = next[0];
				continue;
			}
		}
		e = next[e];
	}
	if (done < nreq && blocker != NONE)
		violation(
		    x, CHK_V_UNORDERED, k, blocker, last,
		    "no order of the writes explains what the gets, deletes and cas "
		    "operations returned: at most %zu of the key's %zu completed operations can be "
		    "placed in order before this one (the other one marked is the last "
		    "of the longest such order)",
		    best, nreq);
	rv = 0;
out:
	free(keep);
	free(en);
	free(z);
	free(stack);
	free(next);
	free(prev);
	free(memo.s);
	return rv;
}

static int
check_register_key(ctx *x, uint32_t k, const size_t *idx, size_t n)
{
	const chk_op *o = x->ops;
	size_t *rw = NULL, *rop = NULL, nreads = 0, nw = 0;
	ev *e = NULL, *r = NULL;
	char b1[40], b2[40];
	int rv = -1;

	if (x->has_del[k])
		return search_register_key(x, k, idx, n);
	rw = malloc((n + 1) * sizeof(*rw));
	rop = malloc((n + 1) * sizeof(*rop));
	e = malloc((n + 1) * sizeof(*e));
	r = malloc((n + 1) * sizeof(*r));
	if (rw == NULL || rop == NULL || e == NULL || r == NULL)
		goto out;

	/* What each get read: rop[q] is the q-th checked get, rw[q] the put
	 * it read (NONE: not found). */
	for (size_t j = 0; j < n; j++) {
		size_t g = idx[j];
		if (o[g].kind == CHK_PUT) {
			count_put(x, &o[g]);
			continue;
		}
		if (!is_read(o[g].kind) || o[g].status == CHK_FAILED)
			continue;
		size_t w = NONE;
		if (o[g].status == CHK_GARBAGE) {
			violation(x, CHK_V_NEVER_WRITTEN, k, g, NONE,
			          "a get read %" PRIu64 " bytes that are no value of the checker",
			          o[g].len);
			continue;
		}
		if (o[g].status == CHK_OK) {
			w = wtab_find(&x->w, o[g].val);
			if (w == NONE || o[w].kind != CHK_PUT || o[w].key != k) {
				violation(x, CHK_V_NEVER_WRITTEN, k, g, w,
				          "a get read %s, which was never put to this key",
				          val_str(b1, sizeof(b1), o[g].val));
				continue;
			}
			if (o[w].invoke > o[g].complete) {
				violation(x, CHK_V_FUTURE_READ, k, g, w,
				          "a get read %s, whose put began after the get ended",
				          val_str(b1, sizeof(b1), o[g].val));
				continue;
			}
		}
		x->res->reads_checked++;
		rw[nreads] = w;
		rop[nreads] = g;
		nreads++;
	}

	/* A get returns no value that a later put definitely overwrote before
	 * the get began: with puts sorted by completion, track the latest
	 * invocation among those completed before the get began. */
	for (size_t j = 0; j < n; j++)
		if (o[idx[j]].kind == CHK_PUT && o[idx[j]].complete != CHK_NEVER)
			e[nw++] = (ev){o[idx[j]].complete, idx[j]};
	ev_sort(e, nw);
	for (size_t q = 0; q < nreads; q++)
		r[q] = (ev){o[rop[q]].invoke, q};
	ev_sort(r, nreads);
	{
		size_t c = 0, latest = NONE;
		for (size_t j = 0; j < nreads; j++) {
			while (c < nw && e[c].t < r[j].t) {
				if (latest == NONE || o[e[c].i].invoke > o[latest].invoke)
					latest = e[c].i;
				c++;
			}
			size_t q = r[j].i, g = rop[q], w = rw[q];
			if (latest == NONE)
				continue;
			if (w == NONE)
				violation(
				    x, CHK_V_STALE_READ, k, g, latest,
				    "a get found no value, but put %s completed before it began",
				    val_str(b1, sizeof(b1), o[latest].val));
			else if (o[latest].invoke > o[w].complete)
				violation(
				    x, CHK_V_STALE_READ, k, g, latest,
				    "a get read %s, but put %s began after that put completed "
				    "and completed before the get began",
				    val_str(b1, sizeof(b1), o[w].val),
				    val_str(b2, sizeof(b2), o[latest].val));
		}
	}

	/* Nor a value older than what a get that ended before it began read:
	 * track, among such gets, the latest invocation of the put they read. */
	nw = 0;
	for (size_t q = 0; q < nreads; q++)
		if (o[rop[q]].complete != CHK_NEVER)
			e[nw++] = (ev){o[rop[q]].complete, q};
	ev_sort(e, nw);
	{
		size_t c = 0, best = NONE; /* a get index q */
		for (size_t j = 0; j < nreads; j++) {
			while (c < nw && e[c].t < r[j].t) {
				size_t q1 = e[c].i;
				if (rw[q1] != NONE &&
				    (best == NONE || o[rw[q1]].invoke > o[rw[best]].invoke))
					best = q1;
				c++;
			}
			size_t q = r[j].i, g = rop[q], w = rw[q];
			if (best == NONE)
				continue;
			if (w == NONE)
				violation(
				    x, CHK_V_STALE_READ, k, g, rop[best],
				    "a get found no value, but a get that ended before it began "
				    "read %s",
				    val_str(b1, sizeof(b1), o[rw[best]].val));
			else if (o[rw[best]].invoke > o[w].complete)
				violation(
				    x, CHK_V_STALE_READ, k, g, rop[best],
				    "a get read %s, but a get that ended before it began read %s, "
				    "put after that one completed",
				    val_str(b1, sizeof(b1), o[w].val),
				    val_str(b2, sizeof(b2), o[rw[best]].val));
		}
	}
	rv = zones_check(x, k, idx, n, rw, rop, nreads);
out:
	free(rw);
	free(rop);
	free(e);
	free(r);
	return rv;
}

/* ------------------------------------------------------------------------
 * Multi-key operations
 * ------------------------------------------------------------------------ */

/* One multi-key operation: its ops, sorted by key, are grp[at .. at + n). */
typedef struct {
	uint32_t txn; /* its id */
	size_t at;    /* first position in grp */
	size_t n;     /* keys */
} txn_span;

typedef struct {
	const chk_op *ops;
	size_t *grp;     /* op indices of multi-key ops, by (txn, key) */
	size_t ngrp;     /* their count */
	txn_span *spans; /* one per multi-key op, by txn */
	size_t nspans;   /* their count */
	ev *edges;       /* (from node, to node) as (t, i): nodes are op indices */
	size_t nedges;   /* used */
	size_t capedges; /* allocated */
} txn_ctx;

static int
span_cmp(const void *a, const void *b)
{
	const txn_span *x = a, *y = b;

	return x->txn < y->txn ? -1 : x->txn > y->txn;
}

static const txn_span *
span_find(const txn_ctx *t, uint32_t txn)
{
	txn_span want = {.txn = txn};

	return bsearch(&want, t->spans, t->nspans, sizeof(*t->spans), span_cmp);
}

/* The op of multi-key op s on key k, or NONE. */
static size_t
span_key(const txn_ctx *t, const txn_span *s, uint32_t k)
{
	size_t lo = s->at, hi = s->at + s->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		uint32_t mk = t->ops[t->grp[mid]].key;
		if (mk == k)
			return t->grp[mid];
		if (mk < k)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NONE;
}

/* The node of a write in the order graph: a multi-key op is one node, named
 * by its first op; a single put is its own. */
static size_t
txn_node(const txn_ctx *t, size_t w)
{
	if (t->ops[w].txn == 0)
		return w;
	const txn_span *s = span_find(t, t->ops[w].txn);
	return s ? t->grp[s->at] : w;
}

static int
edge_add(txn_ctx *t, size_t from, size_t to)
{
	if (t->nedges == t->capedges) {
		size_t cap = t->capedges ? 2 * t->capedges : 64;
		ev *e = realloc(t->edges, cap * sizeof(*e));
		if (e == NULL)
			return -1;
		t->edges = e;
		t->capedges = cap;
	}
	t->edges[t->nedges++] = (ev){from, to};
	return 0;
}

/* Groups the multi-key ops and checks each is well formed. Returns 0, 1
 * when the history is malformed (reported), -1 when memory ran out. */
static int
txn_group(ctx *x, txn_ctx *t)
{
	const chk_op *o = x->ops;

	ev *by = malloc((x->nops + 1) * sizeof(*by)); /* ((txn, key), op) */
	size_t nby = 0;

	if (by == NULL)
		return -1;
	for (size_t i = 0; i < x->nops; i++)
		if (o[i].txn != 0 && (o[i].txn & CHK_TXN_LOOSE) == 0 && o[i].kind != CHK_SCAN)
			by[nby++] = (ev){((uint64_t)o[i].txn << 32) | o[i].key, i};
	ev_sort(by, nby);
	for (size_t j = 0; j < nby; j++)
		t->grp[t->ngrp++] = by[j].i;
	free(by);
	for (size_t j = 0; j < t->ngrp;) {
		size_t first = t->grp[j], e = j + 1;
		while (e < t->ngrp && o[t->grp[e]].txn == o[first].txn)
			e++;
		for (size_t m = j; m < e; m++) {
			const chk_op *a = &o[t->grp[m]];
			bool bad = x->keys[a->key].append || a->kind != o[first].kind ||
			           a->invoke != o[first].invoke ||
			           a->complete != o[first].complete ||
			           a->client != o[first].client ||
			           (a->kind == CHK_PUT && a->status != o[first].status) ||
			           (a->status == CHK_FAILED) != (o[first].status == CHK_FAILED) ||
			           (m > j && o[t->grp[m - 1]].key == a->key);
			if (bad) {
				violation(x, CHK_V_BAD_HISTORY, a->key, NONE, t->grp[m],
				          "multi-key operation %" PRIu32
				          " is malformed (its parts differ "
				          "in kind, times, status or client, name a key twice, or "
				          "name an append key)",
				          a->txn);
				return 1;
			}
		}
		t->spans[t->nspans++] = (txn_span){.txn = o[first].txn, .at = j, .n = e - j};
		if (o[first].kind == CHK_PUT)
			x->res->mputs++;
		j = e;
	}
	return 0;
}

/* Colours of the circle search. */
enum { WHITE = 0, GREY = 1, BLACK = 2 };

/* Looks for a circle in the order graph (iterative depth-first search) and
 * reports the first one it meets. */
static int
txn_cycles(ctx *x, txn_ctx *t)
{
	uint8_t *colour = NULL;
	size_t *stack = NULL, *next = NULL;
	int rv = -1;

	if (t->nedges == 0)
		return 0;
	ev_sort(t->edges, t->nedges);
	colour = calloc(x->nops, 1);
	stack = malloc(x->nops * sizeof(*stack));
	next = malloc(x->nops * sizeof(*next)); /* per grey node: next edge to follow */
	if (colour == NULL || stack == NULL || next == NULL)
		goto out;
	for (size_t e0 = 0; e0 < t->nedges; e0++) {
		size_t root = t->edges[e0].t, sp = 0;
		if (colour[root] != WHITE)
			continue;
		stack[sp++] = root;
		colour[root] = GREY;
		next[root] = e0;
		while (sp > 0) {
			size_t u = stack[sp - 1];
			size_t e = next[u];
			if (e < t->nedges && t->edges[e].t == u) {
				next[u] = e + 1;
				size_t v = t->edges[e].i;
				if (colour[v] == GREY) {
					char b1[40], b2[40];
					violation(x, CHK_V_TXN_CYCLE, x->ops[v].key, v, u,
					          "mgets order the writes of %s and %s both ways",
					          val_str(b1, sizeof(b1), x->ops[u].val),
					          val_str(b2, sizeof(b2), x->ops[v].val));
					continue;
				}
				if (colour[v] == WHITE) {
					/* Its first edge, by binary search. */
					size_t lo = 0, hi = t->nedges;
					while (lo < hi) {
						size_t mid = lo + (hi - lo) / 2;
						if (t->edges[mid].t < v)
							lo = mid + 1;
						else
							hi = mid;
					}
					colour[v] = GREY;
					next[v] = lo;
					stack[sp++] = v;
				}
				continue;
			}
			colour[u] = BLACK;
			sp--;
		}
	}
	rv = 0;
out:
	free(colour);
	free(stack);
	free(next);
	return rv;
}

/* The atomicity of every mget with respect to every mput (history.h). */
static int
check_txns(ctx *x)
{
	const chk_op *o = x->ops;
	txn_ctx t = {.ops = o};
	char b1[40], b2[40];
	int rv = -1, g;

	t.grp = malloc((x->nops + 1) * sizeof(*t.grp));
	t.spans = malloc((x->nops + 1) * sizeof(*t.spans));
	if (t.grp == NULL || t.spans == NULL)
		goto out;
	if ((g = txn_group(x, &t)) != 0) {
		rv = g < 0 ? -1 : 0;
		goto out;
	}
	for (size_t s = 0; s < t.nspans; s++) {
		const txn_span *m = &t.spans[s];
		const chk_op *m0 = &o[t.grp[m->at]];
		if (m0->kind != CHK_GET || m0->status == CHK_FAILED)
			continue;
		x->res->mgets_checked++;
		for (size_t a = m->at; a < m->at + m->n; a++) {
			size_t ga = t.grp[a];
			size_t wa = o[ga].status == CHK_OK ? wtab_find(&x->w, o[ga].val) : NONE;
			if (wa == NONE || o[wa].txn == 0 || o[wa].key != o[ga].key)
				continue;
			const txn_span *p = span_find(&t, o[wa].txn);
			if (p == NULL)
				continue;
			/* The mget saw mput p on key(ga): on its other keys it must
			 * see p or later. */
			for (size_t b = m->at; b < m->at + m->n; b++) {
				size_t gb = t.grp[b];
				size_t pb = b == a ? NONE : span_key(&t, p, o[gb].key);
				if (pb == NONE)
					continue;
				size_t wb =
				    o[gb].status == CHK_OK ? wtab_find(&x->w, o[gb].val) : NONE;
				if (wb == pb)
					continue;
				/* A delete after the mput may explain "absent" on a
				 * key that has deletes: the key's own check judges it. */
				if (wb == NONE && x->has_del[o[gb].key])
					continue;
				if (wb == NONE || o[wb].key != o[gb].key ||
				    (o[wb].complete != CHK_NEVER &&
				     o[wb].complete < o[pb].invoke)) {
					violation(x, CHK_V_FRACTURED, o[gb].key, gb, pb,
					          "an mget read %s of an mput on one key but %s on "
					          "another key the mput wrote %s",
					          val_str(b1, sizeof(b1), o[wa].val),
					          wb == NONE ? "nothing"
					                     : val_str(b2, sizeof(b2), o[wb].val),
					          wb == NONE ? "(not found)"
					                     : "(put before the mput began)");
					continue;
				}
				if (edge_add(&t, txn_node(&t, pb), txn_node(&t, wb)) != 0)
					goto out;
			}
		}
	}
	rv = txn_cycles(x, &t);
out:
	free(t.grp);
	free(t.spans);
	free(t.edges);
	return rv;
}

/* ------------------------------------------------------------------------
 * The whole history
 * ------------------------------------------------------------------------ */

/* Checks what every key's check takes for granted. */
static bool
history_valid(ctx *x)
{
	for (size_t i = 0; i < x->nops; i++) {
		const chk_op *o = &x->ops[i];
		bool write = o->kind == CHK_APPEND || o->kind == CHK_PUT;
		bool cas = o->kind == CHK_CAS;
		bool bad = o->key >= x->nkeys || o->kind < CHK_APPEND || o->kind > CHK_CAS ||
		           o->status > CHK_MISMATCH || o->complete < o->invoke ||
		           (write && o->status != CHK_OK && o->status != CHK_FAILED) ||
		           (o->status == CHK_MISMATCH) != (cas && o->status == CHK_MISMATCH) ||
		           (cas && (o->status == CHK_NOTFOUND || o->status == CHK_GARBAGE ||
		                    o->txn != 0 || (o->val != 0 && o->val == o->hash)));
		if (!bad && o->kind != CHK_GET && x->keys[o->key].append != (o->kind == CHK_APPEND))
			bad = true; /* puts, deletes and scans of registers, appends of the rest */
		if (!bad && o->status == CHK_FAILED && o->complete != CHK_NEVER)
			bad = true;
		if (!bad && write &&
		    (o->val == 0 || (uint32_t)o->val == 0 || wtab_add(&x->w, o->val, i) != NONE))
			bad = true;
		/* A cas's value is unique like a put's ("absent" is none). */
		if (!bad && cas && o->val != 0 &&
		    ((uint32_t)o->val == 0 || wtab_add(&x->w, o->val, i) != NONE))
			bad = true;
		if (!bad && (o->kind == CHK_DEL || cas))
			x->has_del[o->key] = true;
		if (bad) {
			violation(x, CHK_V_BAD_HISTORY, o->key < x->nkeys ? o->key : 0, NONE, i,
			          "operation %zu is malformed (kind %u status %u key %u, or a "
			          "value identity written twice)",
			          i, o->kind, o->status, o->key);
			return false;
		}
	}
	return true;
}

int
chk_check(const chk_key *keys, size_t nkeys, const chk_op *ops, size_t nops, chk_result *res)
{
	return chk_check_bounded(keys, nkeys, ops, nops, CHK_SEARCH_STATES, res);
}

int
chk_check_bounded(const chk_key *keys, size_t nkeys, const chk_op *ops, size_t nops,
                  size_t max_states, chk_result *res)
{
	ctx x = {.keys = keys,
	         .nkeys = nkeys,
	         .ops = ops,
	         .nops = nops,
	         .res = res,
	         .max_states = max_states};
	size_t *start = NULL, *idx = NULL, *fill = NULL, nwrites = 0;
	int rv = -1;

	memset(res, 0, sizeof(*res));
	for (size_t i = 0; i < nops; i++)
		nwrites +=
		    ops[i].kind == CHK_PUT || ops[i].kind == CHK_APPEND || ops[i].kind == CHK_CAS;
	x.pos = malloc((nops + 1) * sizeof(*x.pos));
	x.flagged = calloc(nops + 1, sizeof(*x.flagged));
	x.has_del = calloc(nkeys + 1, sizeof(*x.has_del));
	x.mark = calloc(nops + 1, sizeof(*x.mark));
	start = calloc(nkeys + 1, sizeof(*start));
	fill = calloc(nkeys + 1, sizeof(*fill));
	idx = malloc((nops + 1) * sizeof(*idx));
	if (x.pos == NULL || x.flagged == NULL || x.has_del == NULL || x.mark == NULL ||
	    start == NULL || fill == NULL || idx == NULL || wtab_init(&x.w, nwrites) != 0)
		goto out;
	for (size_t i = 0; i < nops; i++)
		x.pos[i] = NONE;
	if (!history_valid(&x)) {
		rv = 0;
		goto out;
	}

	/* Group the operations per key, in history order. */
	for (size_t i = 0; i < nops; i++)
		start[ops[i].key + 1]++;
	for (size_t k = 0; k < nkeys; k++)
		start[k + 1] += start[k];
	for (size_t i = 0; i < nops; i++)
		idx[start[ops[i].key] + fill[ops[i].key]++] = i;

	for (uint32_t k = 0; k < nkeys; k++) {
		const size_t *ki = idx + start[k];
		size_t kn = start[k + 1] - start[k];
		if ((keys[k].append ? check_append_key(&x, k, ki, kn)
		                    : check_register_key(&x, k, ki, kn)) != 0)
			goto out;
	}
	if (check_txns(&x) != 0)
		goto out;
	rv = 0;
out:
	wtab_fini(&x.w);
	free(x.pos);
	free(x.flagged);
	free(x.has_del);
	free(x.mark);
	free(start);
	free(fill);
	free(idx);
	if (rv != 0)
		memset(res, 0, sizeof(*res));
	return rv;
}

/* ------------------------------------------------------------------------
 * Reports
 * ------------------------------------------------------------------------ */

static double
ms_since(uint64_t t, uint64_t t0)
{
	return t >= t0 ? (double)(t - t0) / 1e6 : -(double)(t0 - t) / 1e6;
}

void
chk_print_op(FILE *f, const chk_key *keys, const chk_op *op, uint64_t t0)
{
	char v[40], when[64];
	const char *name = keys[op->key].name;

	if (op->complete == CHK_NEVER)
		snprintf(when, sizeof(when), "[%.3f, ?]", ms_since(op->invoke, t0));
	else
		snprintf(when, sizeof(when), "[%.3f, %.3f]", ms_since(op->invoke, t0),
		         ms_since(op->complete, t0));
	fprintf(f, "c%-3" PRIu32 " ", op->client);
	switch (op->kind) {
	case CHK_APPEND:
		chk_format_val(v, sizeof(v), op->val);
		if (op->status == CHK_OK)
			fprintf(f, "append %s %s; -> ok len=%" PRIu64, name, v, op->len);
		else
			fprintf(f, "append %s %s; -> failed (%d)", name, v, op->err);
		break;
	case CHK_PUT:
		chk_format_val(v, sizeof(v), op->val);
		if (op->status == CHK_OK)
			fprintf(f, "put    %s %s -> ok", name, v);
		else
			fprintf(f, "put    %s %s -> failed (%d)", name, v, op->err);
		break;
	case CHK_DEL:
		fprintf(f, "del    %s -> ", name);
		if (op->status == CHK_FAILED)
			fprintf(f, "failed (%d)", op->err);
		else if (op->status == CHK_NOTFOUND)
			fprintf(f, "not found");
		else if (op->status == CHK_GARBAGE)
			fprintf(f, "%" PRIu64 " bytes", op->len);
		else
			fprintf(f, "%s", (chk_format_val(v, sizeof(v), op->val), v));
		break;
	case CHK_CAS: {
		char e[40], c[40];
		if (op->hash)
			chk_format_val(e, sizeof(e), op->hash);
		else
			snprintf(e, sizeof(e), "absent");
		if (op->val)
			chk_format_val(v, sizeof(v), op->val);
		else
			snprintf(v, sizeof(v), "absent");
		fprintf(f, "cas    %s %s => %s -> ", name, e, v);
		if (op->status == CHK_OK)
			fprintf(f, "ok");
		else if (op->status == CHK_FAILED)
			fprintf(f, "failed (%d)", op->err);
		else if (op->len == CHK_CUR_UNKNOWN)
			fprintf(f, "mismatch");
		else if (op->len == 0)
			fprintf(f, "mismatch (absent)");
		else
			fprintf(f, "mismatch (%s)", (chk_format_val(c, sizeof(c), op->len), c));
		break;
	}
	default:
		fprintf(f, "%s %s -> ", op->kind == CHK_SCAN ? "scan  " : "get   ", name);
		if (op->status == CHK_FAILED)
			fprintf(f, "failed (%d)", op->err);
		else if (op->status == CHK_NOTFOUND)
			fprintf(f, "not found");
		else if (keys[op->key].append || op->status == CHK_GARBAGE)
			fprintf(f, "%" PRIu64 " bytes", op->len);
		else
			fprintf(f, "%s", (chk_format_val(v, sizeof(v), op->val), v));
		break;
	}
	fprintf(f, "  %s ms\n", when);
}

void
chk_print_violation(FILE *f, const chk_key *keys, const chk_op *ops, size_t nops,
                    const chk_violation *v, uint64_t t0, size_t max_lines)
{
	uint64_t lo = UINT64_MAX, hi = 0;
	size_t inv[2] = {v->op, v->other}, n = 0;
	ev *e;

	fprintf(f, "VIOLATION: %s on key %s: %s\n", chk_violation_name(v->kind), keys[v->key].name,
	        v->msg);
	for (int j = 0; j < 2; j++) {
		if (inv[j] == NONE || inv[j] >= nops)
			continue;
		const chk_op *o = &ops[inv[j]];
		lo = o->invoke < lo ? o->invoke : lo;
		uint64_t end = o->complete == CHK_NEVER ? o->invoke : o->complete;
		hi = end > hi ? end : hi;
	}
	if (lo == UINT64_MAX)
		return;
	if ((e = malloc(nops * sizeof(*e))) == NULL)
		return;
	for (size_t i = 0; i < nops; i++) {
		const chk_op *o = &ops[i];
		if (o->key == v->key && o->invoke <= hi && o->complete >= lo)
			e[n++] = (ev){o->invoke, i};
	}
	ev_sort(e, n);
	fprintf(f, "  history of %s between %.3f and %.3f ms (* marks the operations above):\n",
	        keys[v->key].name, ms_since(lo, t0), ms_since(hi, t0));
	size_t shown = 0, skipped = 0;
	for (size_t j = 0; j < n; j++) {
		bool mark = e[j].i == v->op || e[j].i == v->other;
		if (!mark && shown >= max_lines) {
			skipped++;
			continue;
		}
		fprintf(f, "  %c ", mark ? '*' : ' ');
		chk_print_op(f, keys, &ops[e[j].i], t0);
		shown++;
	}
	if (skipped)
		fprintf(f, "    ... %zu more concurrent operations on the key\n", skipped);
	free(e);
}
