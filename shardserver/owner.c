/*
 * owner.c - the ownership table (owner.h).
 *
 * DESIGN. The table is a small sorted array of non-overlapping entries (a
 * node serves a handful of ranges), so a lookup is a binary search and a
 * change rebuilds the array: every change makes deep copies of the surviving
 * pieces first and swaps the array only when all allocations succeeded, so
 * out of memory never leaves a half-changed table. Changes are rare (one per
 * configuration or migration step) and take the write lock; lookups take the
 * read lock for the duration of the op that needs the answer. The rwlock
 * prefers writers so that a stream of reads cannot starve a handover.
 * This module does not know about migrations beyond an opaque pointer and
 * does no I/O.
 */
#include "shardserver/owner.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

/* Returns whether key k (as start-side bound) is before end e (empty: +inf). */
static bool
before_end(const void *k, size_t klen, const void *e, size_t elen)
{
	return elen == 0 || kv_key_cmp(k, klen, e, elen) < 0;
}

static void
entry_fini(kv_owner_entry *x)
{
	kv_buf_fini(&x->start);
	kv_buf_fini(&x->end);
	free(x->peer_addr);
	memset(x, 0, sizeof(*x));
}

/* Deep-copies src into dst with new bounds. */
static int
entry_copy(kv_owner_entry *dst, const kv_owner_entry *src, const void *s, size_t slen,
           const void *e, size_t elen)
{
	memset(dst, 0, sizeof(*dst));
	dst->state = src->state;
	dst->peer = src->peer;
	dst->epoch = src->epoch;
	dst->mig_id = src->mig_id;
	dst->mig = src->mig;
	if (kv_buf_set(&dst->start, s, slen) != 0 || kv_buf_set(&dst->end, e, elen) != 0)
		goto err;
	if (src->peer_addr && (dst->peer_addr = strdup(src->peer_addr)) == NULL)
		goto err;
	return KV_OK;
err:
	entry_fini(dst);
	return KV_ENOMEM;
}

static int
entry_start_cmp(const void *a, const void *b)
{
	const kv_owner_entry *x = a, *y = b;
	return kv_key_cmp(x->start.data, x->start.len, y->start.data, y->start.len);
}

int
kv_owner_init(kv_owner *t)
{
	pthread_rwlockattr_t a;
	int rv;

	memset(t, 0, sizeof(*t));
	if (pthread_rwlockattr_init(&a) != 0)
		return KV_ENOMEM;
#if defined(__GLIBC__)
	pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
	rv = pthread_rwlock_init(&t->lock, &a);
	pthread_rwlockattr_destroy(&a);
	return rv == 0 ? KV_OK : KV_ENOMEM;
}

void
kv_owner_fini(kv_owner *t)
{
	if (t == NULL)
		return;
	for (size_t i = 0; i < t->n; i++)
		entry_fini(&t->e[i]);
	free(t->e);
	t->e = NULL;
	t->n = 0;
	pthread_rwlock_destroy(&t->lock);
}

void
kv_owner_rdlock(kv_owner *t)
{
	pthread_rwlock_rdlock(&t->lock);
}

void
kv_owner_unlock(kv_owner *t)
{
	pthread_rwlock_unlock(&t->lock);
}

void
kv_owner_quiesce(kv_owner *t)
{
	pthread_rwlock_wrlock(&t->lock);
	pthread_rwlock_unlock(&t->lock);
}

const kv_owner_entry *
kv_owner_lookup_locked(const kv_owner *t, const void *key, size_t klen)
{
	size_t lo = 0, hi = t->n;

	/* Find the last entry whose start <= key. */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const kv_owner_entry *x = &t->e[mid];
		if (kv_key_cmp(x->start.data, x->start.len, key, klen) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return NULL;
	const kv_owner_entry *x = &t->e[lo - 1];
	return before_end(key, klen, x->end.data, x->end.len) ? x : NULL;
}

/* Rebuilds the array with [s, e) replaced by `nw`. Caller holds the write lock. */
static int
owner_set_locked(kv_owner *t, const void *s, size_t slen, const void *e, size_t elen,
                 const kv_owner_entry *nw)
{
	kv_owner_entry *ne;
	size_t n = 0;

	ne = calloc(t->n * 2 + 1, sizeof(*ne));
	if (ne == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < t->n; i++) {
		const kv_owner_entry *x = &t->e[i];
		bool left_of = x->end.len != 0 && kv_key_cmp(x->end.data, x->end.len, s, slen) <= 0;
		bool right_of = elen != 0 && kv_key_cmp(x->start.data, x->start.len, e, elen) >= 0;
		if (left_of || right_of) {
			if (entry_copy(&ne[n], x, x->start.data, x->start.len, x->end.data,
			               x->end.len) != 0)
				goto err;
			n++;
			continue;
		}
		if (kv_key_cmp(x->start.data, x->start.len, s, slen) < 0) {
			if (entry_copy(&ne[n], x, x->start.data, x->start.len, s, slen) != 0)
				goto err;
			n++;
		}
		if (elen != 0 && before_end(e, elen, x->end.data, x->end.len)) {
			if (entry_copy(&ne[n], x, e, elen, x->end.data, x->end.len) != 0)
				goto err;
			n++;
		}
	}
	if (entry_copy(&ne[n], nw, s, slen, e, elen) != 0)
		goto err;
	n++;
	qsort(ne, n, sizeof(*ne), entry_start_cmp);
	/* Merge adjacent plain SERVE entries, so a scan is clipped only where
	 * ownership really changes. */
	size_t m = 0;
	for (size_t i = 0; i < n; i++) {
		kv_owner_entry *prev = m ? &ne[m - 1] : NULL;
		if (prev && prev->state == KV_OWN_SERVE && ne[i].state == KV_OWN_SERVE &&
		    prev->mig == NULL && ne[i].mig == NULL && prev->end.len != 0 &&
		    kv_key_cmp(prev->end.data, prev->end.len, ne[i].start.data, ne[i].start.len) ==
		        0) {
			kv_buf tmp = prev->end;
			prev->end = ne[i].end;
			ne[i].end = tmp;
			entry_fini(&ne[i]);
			continue;
		}
		if (m != i)
			ne[m] = ne[i];
		m++;
	}
	n = m;
	for (size_t i = 0; i < t->n; i++)
		entry_fini(&t->e[i]);
	free(t->e);
	t->e = ne;
	t->n = n;
	return KV_OK;
err:
	for (size_t i = 0; i < n; i++)
		entry_fini(&ne[i]);
	free(ne);
	return KV_ENOMEM;
}

int
kv_owner_set(kv_owner *t, const void *start, size_t slen, const void *end, size_t elen,
             kv_own_state state, uint32_t peer, const char *peer_addr, uint64_t epoch,
             uint64_t mig_id, void *mig)
{
	kv_owner_entry nw = {.state = state,
	                     .peer = peer,
	                     .peer_addr = (char *)peer_addr,
	                     .epoch = epoch,
	                     .mig_id = mig_id,
	                     .mig = mig};
	int rv;

	if (kv_range_is_empty(start, slen, end, elen))
		return KV_EINVAL;
	pthread_rwlock_wrlock(&t->lock);
	rv = owner_set_locked(t, start, slen, end, elen, &nw);
	pthread_rwlock_unlock(&t->lock);
	return rv;
}

/* Appends the parts of [s, e) not covered by entries in `state` (any state
 * when `state` is 0) to gaps (pairs). */
static int
owner_gaps_locked(const kv_owner *t, const void *s, size_t slen, const void *e, size_t elen,
                  kv_own_state state, kv_buf **gaps, size_t *ngaps)
{
	kv_buf cur = {0}, *g = NULL;
	size_t n = 0;
	bool inf = false; /* cur is +infinity: nothing left */
	int rv = KV_ENOMEM;

	if (kv_buf_set(&cur, s, slen) != 0)
		return KV_ENOMEM;
	g = calloc(2 * (t->n + 1), sizeof(*g));
	if (g == NULL)
		goto err;
	for (size_t i = 0; i < t->n && !inf; i++) {
		const kv_owner_entry *x = &t->e[i];
		if (state != 0 && x->state != state)
			continue;
		if (!before_end(cur.data, cur.len, x->end.data, x->end.len))
			continue; /* entirely before cur */
		if (!before_end(x->start.data, x->start.len, e, elen))
			break; /* at or after e */
		if (kv_key_cmp(x->start.data, x->start.len, cur.data, cur.len) > 0) {
			if (kv_buf_set(&g[2 * n], cur.data, cur.len) != 0 ||
			    kv_buf_set(&g[2 * n + 1], x->start.data, x->start.len) != 0) {
				n++;
				goto err;
			}
			n++;
		}
		if (x->end.len == 0)
			inf = true;
		else if (kv_buf_set(&cur, x->end.data, x->end.len) != 0)
			goto err;
	}
	if (!inf && before_end(cur.data, cur.len, e, elen)) {
		if (kv_buf_set(&g[2 * n], cur.data, cur.len) != 0 ||
		    kv_buf_set(&g[2 * n + 1], e, elen) != 0) {
			n++;
			goto err;
		}
		n++;
	}
	kv_buf_fini(&cur);
	*gaps = g;
	*ngaps = n;
	return KV_OK;
err:
	kv_buf_fini(&cur);
	kv_owner_ranges_free(g, n);
	return rv;
}

/*
 * Whether [s, e) has a part not covered by entries in `state` (any state
 * when 0), looked at under the read lock. A change that would find no gap
 * returns without the write lock: every configuration is applied on every
 * node, mostly leaving its table as it was, and the write lock stops every
 * new request of the node until the ops in flight end. No gap means the
 * change is a no-op at this instant, which is where it then takes effect;
 * a gap found here is looked for again under the write lock. On out of
 * memory, says yes (the caller then does the work under the write lock
 * and reports it).
 */
static bool
owner_has_gaps(kv_owner *t, const void *s, size_t slen, const void *e, size_t elen,
               kv_own_state state)
{
	bool covered;

	pthread_rwlock_rdlock(&t->lock);
	covered = kv_owner_covers_locked(t, s, slen, e, elen, state);
	pthread_rwlock_unlock(&t->lock);
	return !covered;
}

int
kv_owner_fill(kv_owner *t, const void *start, size_t slen, const void *end, size_t elen,
              kv_own_state state, uint32_t peer, const char *peer_addr, uint64_t epoch,
              uint64_t mig_id)
{
	kv_owner_entry nw = {.state = state,
	                     .peer = peer,
	                     .peer_addr = (char *)peer_addr,
	                     .epoch = epoch,
	                     .mig_id = mig_id};
	kv_buf *g = NULL;
	size_t n = 0;
	int rv;

	if (kv_range_is_empty(start, slen, end, elen))
		return KV_EINVAL;
	if (!owner_has_gaps(t, start, slen, end, elen, KV_OWN_SERVE))
		return KV_OK;
	pthread_rwlock_wrlock(&t->lock);
	rv = owner_gaps_locked(t, start, slen, end, elen, KV_OWN_SERVE, &g, &n);
	for (size_t i = 0; rv == 0 && i < n; i++)
		rv = owner_set_locked(t, g[2 * i].data, g[2 * i].len, g[2 * i + 1].data,
		                      g[2 * i + 1].len, &nw);
	pthread_rwlock_unlock(&t->lock);
	kv_owner_ranges_free(g, n);
	return rv;
}

int
kv_owner_claim(kv_owner *t, const void *start, size_t slen, const void *end, size_t elen,
               uint64_t epoch)
{
	kv_owner_entry nw = {.state = KV_OWN_SERVE, .epoch = epoch};
	kv_buf *g = NULL;
	size_t n = 0;
	int rv;

	if (kv_range_is_empty(start, slen, end, elen))
		return KV_EINVAL;
	if (!owner_has_gaps(t, start, slen, end, elen, 0))
		return KV_OK;
	pthread_rwlock_wrlock(&t->lock);
	rv = owner_gaps_locked(t, start, slen, end, elen, 0, &g, &n);
	for (size_t i = 0; rv == 0 && i < n; i++)
		rv = owner_set_locked(t, g[2 * i].data, g[2 * i].len, g[2 * i + 1].data,
		                      g[2 * i + 1].len, &nw);
	pthread_rwlock_unlock(&t->lock);
	kv_owner_ranges_free(g, n);
	return rv;
}

size_t
kv_owner_drop_incoming(kv_owner *t, uint64_t mig_id)
{
	size_t removed = 0, j = 0;

	pthread_rwlock_wrlock(&t->lock);
	for (size_t i = 0; i < t->n; i++) {
		if (t->e[i].state == KV_OWN_INCOMING && t->e[i].mig_id == mig_id) {
			entry_fini(&t->e[i]);
			removed++;
			continue;
		}
		if (j != i)
			t->e[j] = t->e[i];
		j++;
	}
	t->n = j;
	pthread_rwlock_unlock(&t->lock);
	return removed;
}

bool
kv_owner_covers_locked(const kv_owner *t, const void *start, size_t slen, const void *end,
                       size_t elen, kv_own_state state)
{
	kv_buf *g = NULL;
	size_t n = 0;

	if (owner_gaps_locked(t, start, slen, end, elen, state, &g, &n) != 0)
		return false;
	kv_owner_ranges_free(g, n);
	return n == 0;
}

int
kv_owner_served(kv_owner *t, kv_buf **out, size_t *nout)
{
	kv_buf *r;
	size_t n = 0;
	int rv = KV_OK;

	pthread_rwlock_rdlock(&t->lock);
	r = calloc(2 * (t->n + 1), sizeof(*r));
	if (r == NULL) {
		rv = KV_ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < t->n; i++) {
		const kv_owner_entry *x = &t->e[i];
		if (x->state != KV_OWN_SERVE)
			continue;
		if (n > 0 && r[2 * n - 1].len != 0 &&
		    kv_key_cmp(r[2 * n - 1].data, r[2 * n - 1].len, x->start.data, x->start.len) ==
		        0) {
			if (kv_buf_set(&r[2 * n - 1], x->end.data, x->end.len) != 0)
				rv = KV_ENOMEM;
		} else {
			if (kv_buf_set(&r[2 * n], x->start.data, x->start.len) != 0 ||
			    kv_buf_set(&r[2 * n + 1], x->end.data, x->end.len) != 0)
				rv = KV_ENOMEM;
			n++;
		}
		if (rv != 0)
			break;
	}
	if (rv != 0) {
		kv_owner_ranges_free(r, n);
		goto out;
	}
	*out = r;
	*nout = n;
out:
	pthread_rwlock_unlock(&t->lock);
	return rv;
}

void
kv_owner_ranges_free(kv_buf *r, size_t n)
{
	if (r == NULL)
		return;
	for (size_t i = 0; i < 2 * n; i++)
		kv_buf_fini(&r[i]);
	free(r);
}
