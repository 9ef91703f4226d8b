/*
 * dedup.c - the exactly-once table (dedup.h).
 *
 * DESIGN. 16 stripes by client id, each a mutex over a chained hash of
 * clients. A client holds a ring of the results of its last writes, at
 * most `per_client`: the ring starts small and doubles as needed up to that
 * bound (a client that writes once costs a few hundred bytes); past it a
 * new write overwrites the oldest slot (KV_DEDUP_PER_CLIENT by default).
 * A lookup probes the client's index (an open-addressing hash of request
 * id to slot, twice the ring's size,
 * linear probing with backward-shift deletion) under one stripe lock: one
 * client with its full ring of 1024 results used to scan 8 KiB of ids per
 * write, twice (begin and finish), about a fifth of a server's cycles under
 * pipelined writes from one handle. A slot
 * is "in progress" between begin and finish, which turns a retry that races
 * with its first attempt into KV_EBUSY instead of a second application. A
 * write the ring does not hold but may have held (too_old) is refused,
 * never applied: the memory is bounded, so a retry that comes after more
 * than per_client newer writes of its client cannot be told apart from a
 * write that was applied and forgotten.
 * Request id 0 marks an empty slot (0 means "no dedup" on the wire). When a
 * stripe is full, the least recently used client of the stripe is dropped;
 * clients idle past the TTL are dropped whenever a stripe is full or every
 * 4096th insertion. The table never applies writes itself.
 */
#include "shardserver/dedup/dedup.h"
#include "common/err.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define DEDUP_STRIPES     KV_DEDUP_PARTS
#define DEDUP_BUCKETS     256u
#define DEDUP_AHEAD       8u /* slots of a ring prefetched ahead of the one written */
#define DEDUP_FIRST_SLOTS 8u /* slots of a new client; doubled up to per_client */

/* Keys up to this long are kept in their slot: no buffer of their own,
 * and no second place in memory for a write to wait for. */
#define KEY_IN 32u

typedef struct {
	uint64_t req;        /* Op.request_id; 0: empty slot */
	bool pending;        /* begun, not finished */
	uint32_t klen;       /* the key the write touched: its bytes */
	uint64_t time_ms;    /* when applied, Unix ms */
	kv_dedup_result res; /* the result (value owned) */
	uint8_t *kout;       /* ... the key, when klen > KEY_IN (owned) */
	uint8_t kin[KEY_IN]; /* ... the key, when klen <= KEY_IN */
} dedup_slot;

/* The key of slot s. */
static const uint8_t *
slot_key(const dedup_slot *s)
{
	return s->klen > KEY_IN ? s->kout : s->kin;
}

/* Sets the key of slot s; KV_ENOMEM leaves it empty. */
static int
slot_key_set(dedup_slot *s, const void *key, size_t klen)
{
	if (klen > UINT32_MAX)
		return KV_EINVAL;
	if (klen <= KEY_IN) {
		free(s->kout);
		s->kout = NULL;
		if (klen)
			memcpy(s->kin, key, klen);
		s->klen = (uint32_t)klen;
		return KV_OK;
	}
	uint8_t *k = realloc(s->kout, klen);
	if (k == NULL) {
		free(s->kout);
		s->kout = NULL;
		s->klen = 0;
		return KV_ENOMEM;
	}
	memcpy(k, key, klen);
	s->kout = k;
	s->klen = (uint32_t)klen;
	return KV_OK;
}

typedef struct dedup_client {
	uint64_t id;               /* Request.client_id */
	uint64_t last_ms;          /* last use, for LRU and expiry */
	uint64_t floor;            /* the highest request id overwritten (forgotten) */
	size_t cap;                /* slots allocated, at most per_client */
	size_t head;               /* next slot of the ring to fill; cap: grow or wrap */
	dedup_slot *slots;         /* cap slots */
	uint64_t *ids;             /* cap ids, ids[i] == slots[i].req (0: empty) */
	uint32_t *idx;             /* icap entries: slot + 1 of a nonzero id, or 0 (free) */
	size_t icap;               /* entries in idx: a power of two, at least 2 * cap */
	struct dedup_client *next; /* hash chain */
} dedup_client;

typedef struct {
	pthread_mutex_t mu;                   /* protects everything down to the blank line */
	dedup_client *buckets[DEDUP_BUCKETS]; /* chained hash of clients */
	size_t nclients;                      /* clients in this stripe */
	uint64_t inserts;                     /* for periodic expiry */

} dedup_stripe;

struct kv_dedup {
	size_t per_client;                   /* ring size per client */
	size_t max_per_stripe;               /* client bound per stripe */
	uint64_t ttl_ms;                     /* idle clients are dropped after this */
	dedup_stripe stripes[DEDUP_STRIPES]; /* the table */
};

static void
slot_clear(dedup_slot *s)
{
	kv_buf_fini(&s->res.value);
	free(s->kout);
	memset(s, 0, sizeof(*s));
}

static void
client_free(dedup_client *c)
{
	for (size_t i = 0; i < c->cap; i++)
		slot_clear(&c->slots[i]);
	free(c->slots);
	free(c->ids);
	free(c->idx);
	free(c);
}

static uint64_t
mix(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	return x;
}

/* The first index entry to probe for request id req. */
static size_t
idx_home(const dedup_client *c, uint64_t req)
{
	return (size_t)mix(req ^ 0x9e3779b97f4a7c15ULL) & (c->icap - 1);
}

/* The index entry holding req, or SIZE_MAX. */
static size_t
idx_pos(const dedup_client *c, uint64_t req)
{
	size_t m = c->icap - 1;
	for (size_t h = idx_home(c, req);; h = (h + 1) & m) {
		uint32_t e = c->idx[h];
		if (e == 0)
			return SIZE_MAX;
		if (c->ids[e - 1] == req)
			return h;
	}
}

/* Indexes slot i (ids[i] nonzero, not indexed yet). The index always has
 * free entries: it is at least twice the ring. */
static void
idx_add(dedup_client *c, size_t i)
{
	size_t m = c->icap - 1, h = idx_home(c, c->ids[i]);
	while (c->idx[h] != 0)
		h = (h + 1) & m;
	c->idx[h] = (uint32_t)(i + 1);
}

/* Removes req from the index (a no-op when absent), shifting back the
 * entries after it that would otherwise become unreachable. */
static void
idx_del(dedup_client *c, uint64_t req)
{
	size_t m = c->icap - 1, pos = idx_pos(c, req);
	if (pos == SIZE_MAX)
		return;
	c->idx[pos] = 0;
	for (size_t j = (pos + 1) & m; c->idx[j] != 0; j = (j + 1) & m) {
		size_t k = idx_home(c, c->ids[c->idx[j] - 1]);
		/* j's entry may move to pos when its home is not in (pos, j]. */
		bool stays = pos <= j ? (k > pos && k <= j) : (k > pos || k <= j);
		if (!stays) {
			c->idx[pos] = c->idx[j];
			c->idx[j] = 0;
			pos = j;
		}
	}
}

/* Allocates an index for cap slots and fills it from ids; false when out of
 * memory (the old index is kept then). */
static bool
idx_build(dedup_client *c, size_t cap)
{
	size_t n = 16;
	while (n < 2 * cap)
		n *= 2;
	uint32_t *x = calloc(n, sizeof(*x));
	if (x == NULL)
		return false;
	free(c->idx);
	c->idx = x;
	c->icap = n;
	for (size_t i = 0; i < cap; i++)
		if (c->ids[i] != 0)
			idx_add(c, i);
	return true;
}

kv_dedup *
kv_dedup_create(size_t per_client, size_t max_clients, uint64_t ttl_ms)
{
	kv_dedup *d = calloc(1, sizeof(*d));
	if (d == NULL)
		return NULL;
	d->per_client = per_client ? per_client : KV_DEDUP_PER_CLIENT;
	max_clients = max_clients ? max_clients : 65536;
	d->max_per_stripe = (max_clients + DEDUP_STRIPES - 1) / DEDUP_STRIPES;
	d->ttl_ms = ttl_ms ? ttl_ms : 10u * 60u * 1000u;
	for (unsigned i = 0; i < DEDUP_STRIPES; i++)
		pthread_mutex_init(&d->stripes[i].mu, NULL);
	return d;
}

void
kv_dedup_destroy(kv_dedup *d)
{
	if (d == NULL)
		return;
	for (unsigned i = 0; i < DEDUP_STRIPES; i++) {
		dedup_stripe *st = &d->stripes[i];
		for (unsigned b = 0; b < DEDUP_BUCKETS; b++) {
			dedup_client *c = st->buckets[b], *nx;
			for (; c; c = nx) {
				nx = c->next;
				client_free(c);
			}
		}
		pthread_mutex_destroy(&st->mu);
	}
	free(d);
}

static dedup_stripe *
stripe_of(kv_dedup *d, uint64_t client)
{
	return &d->stripes[mix(client) % DEDUP_STRIPES];
}

/* Drops idle clients; with `force`, also the least recently used one. */
static void
stripe_expire_locked(kv_dedup *d, dedup_stripe *st, uint64_t now_ms, bool force)
{
	dedup_client **lru = NULL;
	for (unsigned b = 0; b < DEDUP_BUCKETS; b++) {
		dedup_client **pp = &st->buckets[b];
		while (*pp) {
			dedup_client *c = *pp;
			if (now_ms > c->last_ms && now_ms - c->last_ms > d->ttl_ms) {
				*pp = c->next;
				client_free(c);
				st->nclients--;
				continue;
			}
			if (lru == NULL || c->last_ms < (*lru)->last_ms)
				lru = pp;
			pp = &c->next;
		}
	}
	if (force && st->nclients >= d->max_per_stripe && lru != NULL) {
		dedup_client *c = *lru;
		*lru = c->next;
		client_free(c);
		st->nclients--;
	}
}

static dedup_client *
client_find_locked(dedup_stripe *st, uint64_t client)
{
	dedup_client *c = st->buckets[(mix(client) >> 8) % DEDUP_BUCKETS];
	while (c && c->id != client)
		c = c->next;
	return c;
}

static dedup_client *
client_get_locked(kv_dedup *d, dedup_stripe *st, uint64_t client, uint64_t now_ms)
{
	dedup_client *c = client_find_locked(st, client);
	if (c)
		return c;
	if (st->nclients >= d->max_per_stripe || (++st->inserts & 4095u) == 0)
		stripe_expire_locked(d, st, now_ms, true);
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return NULL;
	c->cap = d->per_client < DEDUP_FIRST_SLOTS ? d->per_client : DEDUP_FIRST_SLOTS;
	c->slots = calloc(c->cap, sizeof(*c->slots));
	c->ids = calloc(c->cap, sizeof(*c->ids));
	if (c->slots == NULL || c->ids == NULL || !idx_build(c, c->cap)) {
		free(c->slots);
		free(c->ids);
		free(c);
		return NULL;
	}
	c->id = client;
	c->last_ms = now_ms;
	unsigned b = (mix(client) >> 8) % DEDUP_BUCKETS;
	c->next = st->buckets[b];
	st->buckets[b] = c;
	st->nclients++;
	return c;
}

static dedup_slot *
slot_find(dedup_client *c, uint64_t req)
{
	size_t h = idx_pos(c, req);
	return h == SIZE_MAX ? NULL : &c->slots[c->idx[h] - 1];
}

/* Empties slot s of c. */
static void
slot_drop(dedup_client *c, dedup_slot *s)
{
	size_t i = (size_t)(s - c->slots);
	if (c->ids[i] != 0)
		idx_del(c, c->ids[i]);
	c->ids[i] = 0;
	slot_clear(s);
}

/* Doubles c's ring (up to per_client); false when it cannot. */
static bool
client_grow(kv_dedup *d, dedup_client *c)
{
	size_t ncap = c->cap * 2 < d->per_client ? c->cap * 2 : d->per_client;
	dedup_slot *v;
	uint64_t *ids;

	if (ncap <= c->cap || (v = realloc(c->slots, ncap * sizeof(*v))) == NULL)
		return false;
	memset(v + c->cap, 0, (ncap - c->cap) * sizeof(*v));
	c->slots = v;
	if ((ids = realloc(c->ids, ncap * sizeof(*ids))) == NULL)
		return false; /* the slots are bigger; cap is not, so unused */
	memset(ids + c->cap, 0, (ncap - c->cap) * sizeof(*ids));
	c->ids = ids;
	if (!idx_build(c, ncap))
		return false; /* the arrays are bigger; cap is not, so unused */
	c->cap = ncap;
	return true;
}

/* The slot for req: the next of the ring, in the order written, after the
 * ring grows (while it may) or wraps. A result it overwrites is forgotten:
 * floor remembers the highest such id. */
static dedup_slot *
slot_new(kv_dedup *d, dedup_client *c, uint64_t req)
{
	if (c->head == c->cap && !client_grow(d, c))
		c->head = 0;
	size_t i = c->head++;
	dedup_slot *s = &c->slots[i];

	/* The ring is written in order and a full one is larger than the
	 * caches keep between two turns: the slot DEDUP_AHEAD writes ahead is
	 * brought in now, so that its write does not wait for memory under
	 * the stripe's lock. */
	if (c->cap == d->per_client) {
		size_t a = i + DEDUP_AHEAD < c->cap ? i + DEDUP_AHEAD : i + DEDUP_AHEAD - c->cap;
		__builtin_prefetch(&c->slots[a], 1);
		__builtin_prefetch((const char *)&c->slots[a] + sizeof(dedup_slot) - 1, 1);
		__builtin_prefetch(&c->ids[a], 1);
		/* The index: the entry of the id this ring evicts DEDUP_AHEAD / 2
		 * writes from now (that id's line came with an earlier call's
		 * prefetch), and the one the client's next id would take (ids
		 * grow by one per write of a client). Both are random places of
		 * the index, each a miss otherwise. */
		size_t e = i + DEDUP_AHEAD / 2 < c->cap ? i + DEDUP_AHEAD / 2
		                                        : i + DEDUP_AHEAD / 2 - c->cap;
		if (c->ids[e] != 0)
			__builtin_prefetch(&c->idx[idx_home(c, c->ids[e])], 1);
		__builtin_prefetch(&c->idx[idx_home(c, req + 1)], 1);
	}

	if (c->ids[i] > c->floor)
		c->floor = c->ids[i];
	if (c->ids[i] != 0)
		idx_del(c, c->ids[i]);
	slot_clear(s);
	s->req = req;
	c->ids[i] = req;
	idx_add(c, i);
	return s;
}

/*
 * Whether a write with id req that the ring does not hold may have been
 * applied and forgotten: at or below the highest id overwritten here, or,
 * when the ring is full, below every id it holds (a ring refilled from a
 * snapshot, a transfer or a copy does not know what was forgotten before,
 * and ids grow per client: what came before the oldest id held may be
 * gone). Applying it again could apply it twice; refusing it is always
 * safe.
 */
static bool
too_old(kv_dedup *d, const dedup_client *c, uint64_t req)
{
	uint64_t lo = UINT64_MAX;

	if (req <= c->floor)
		return true;
	if (c->cap < d->per_client)
		return false; /* never full yet */
	for (size_t i = 0; i < c->cap; i++) {
		if (c->ids[i] == 0)
			return false; /* not full */
		if (c->ids[i] < lo)
			lo = c->ids[i];
	}
	return req < lo;
}

static int
result_copy(kv_dedup_result *dst, const kv_dedup_result *src)
{
	memset(dst, 0, sizeof(*dst));
	dst->status = src->status;
	dst->value_len = src->value_len;
	dst->has_value = src->has_value && src->value.len <= KV_DEDUP_MAX_VALUE;
	if (dst->has_value && src->value.len)
		return kv_buf_set(&dst->value, src->value.data, src->value.len);
	return KV_OK;
}

int
kv_dedup_begin(kv_dedup *d, uint64_t client, uint64_t req, bool retry, uint64_t now_ms,
               kv_dedup_result *out)
{
	dedup_stripe *st = stripe_of(d, client);
	dedup_client *c;
	dedup_slot *s;
	int rv;

	if (client == 0 || req == 0)
		return KV_EINVAL;
	pthread_mutex_lock(&st->mu);
	c = client_get_locked(d, st, client, now_ms);
	if (c == NULL) {
		rv = KV_ENOMEM;
		goto out;
	}
	c->last_ms = now_ms;
	s = slot_find(c, req);
	if (s != NULL) {
		rv = s->pending ? KV_EBUSY : result_copy(out, &s->res);
		goto out;
	}
	if (retry && too_old(d, c, req)) {
		rv = KV_ESTALE;
		goto out;
	}
	s = slot_new(d, c, req);
	s->pending = true;
	rv = KV_ENOTFOUND;
out:
	pthread_mutex_unlock(&st->mu);
	return rv;
}

/* Stores a finished result into slot s. */
static int
slot_fill(dedup_slot *s, const kv_dedup_result *res, const void *key, size_t klen, uint64_t time_ms)
{
	kv_buf_fini(&s->res.value);
	s->pending = false;
	s->time_ms = time_ms;
	if (result_copy(&s->res, res) != 0)
		return KV_ENOMEM;
	return slot_key_set(s, key, klen);
}

void
kv_dedup_finish(kv_dedup *d, uint64_t client, uint64_t req, const kv_dedup_result *res,
                const void *key, size_t klen, uint64_t now_ms)
{
	dedup_stripe *st = stripe_of(d, client);
	dedup_client *c;
	dedup_slot *s;

	if (client == 0 || req == 0)
		return;
	pthread_mutex_lock(&st->mu);
	c = client_get_locked(d, st, client, now_ms);
	if (c != NULL) {
		s = slot_find(c, req);
		if (s == NULL)
			s = slot_new(d, c, req);
		if (slot_fill(s, res, key, klen, now_ms) != 0) {
			/* Not remembered: a retry must be refused, not applied
			 * again (too_old), and a wrong memory is worse. */
			if (req > c->floor)
				c->floor = req;
			slot_drop(c, s);
		}
	}
	pthread_mutex_unlock(&st->mu);
}

void
kv_dedup_abort(kv_dedup *d, uint64_t client, uint64_t req)
{
	dedup_stripe *st = stripe_of(d, client);
	dedup_client *c;
	dedup_slot *s;

	pthread_mutex_lock(&st->mu);
	c = client_find_locked(st, client);
	if (c != NULL && (s = slot_find(c, req)) != NULL && s->pending)
		slot_drop(c, s);
	pthread_mutex_unlock(&st->mu);
}

/* kv_dedup_insert with st's lock held. */
static int
insert_locked(kv_dedup *d, dedup_stripe *st, uint64_t client, uint64_t req,
              const kv_dedup_result *res, const void *key, size_t klen, uint64_t time_ms)
{
	dedup_client *c = client_get_locked(d, st, client, time_ms);
	dedup_slot *s;
	int rv = KV_OK;

	if (c == NULL)
		return KV_ENOMEM;
	if ((s = slot_find(c, req)) == NULL || s->pending) {
		/* A pending slot is an attempt of the same write begun here
		 * (a retry at a node that serves the range while it still
		 * applies the old primary's records, refused until its
		 * routing table changes). The write was applied elsewhere:
		 * the result goes into the slot, so that the attempt's abort
		 * (which drops only a pending slot) does not lose it and the
		 * next retry is answered from memory, not applied again. */
		if (s == NULL)
			s = slot_new(d, c, req);
		if ((rv = slot_fill(s, res, key, klen, time_ms)) != 0) {
			if (req > c->floor)
				c->floor = req;
			slot_drop(c, s);
		}
	}
	return rv;
}

int
kv_dedup_insert(kv_dedup *d, uint64_t client, uint64_t req, const kv_dedup_result *res,
                const void *key, size_t klen, uint64_t time_ms)
{
	dedup_stripe *st = stripe_of(d, client);
	int rv;

	if (client == 0 || req == 0)
		return KV_EINVAL;
	pthread_mutex_lock(&st->mu);
	rv = insert_locked(d, st, client, req, res, key, klen, time_ms);
	pthread_mutex_unlock(&st->mu);
	return rv;
}

int
kv_dedup_insert_many(kv_dedup *d, const kv_dedup_entry *v, size_t n)
{
	dedup_stripe *held = NULL;
	int rv = KV_OK;

	for (size_t i = 0; i < n; i++) {
		const kv_dedup_entry *e = &v[i];
		dedup_stripe *st;
		int r;

		if (e->client == 0 || e->req == 0) {
			rv = KV_EINVAL;
			continue;
		}
		/* One hold for a run of entries of one stripe: a batch's
		 * records mostly come from a few clients. */
		if ((st = stripe_of(d, e->client)) != held) {
			if (held != NULL)
				pthread_mutex_unlock(&held->mu);
			pthread_mutex_lock(&st->mu);
			held = st;
		}
		r = insert_locked(d, st, e->client, e->req, &e->res, e->key, e->klen, e->time_ms);
		if (r != KV_OK)
			rv = r;
	}
	if (held != NULL)
		pthread_mutex_unlock(&held->mu);
	return rv;
}

/* Calls cb for the finished entries whose key lies in [start, end), or
 * forgets them when cb is NULL. */
static void
range_walk(kv_dedup *d, unsigned from, unsigned to, const void *start, size_t slen, const void *end,
           size_t elen, kv_dedup_visit_cb cb, void *arg)
{
	for (unsigned i = from; i < to && i < DEDUP_STRIPES; i++) {
		dedup_stripe *st = &d->stripes[i];
		pthread_mutex_lock(&st->mu);
		for (unsigned b = 0; b < DEDUP_BUCKETS; b++)
			for (dedup_client *c = st->buckets[b]; c; c = c->next)
				for (size_t j = 0; j < c->cap; j++) {
					dedup_slot *s = &c->slots[j];
					if (s->req == 0 || s->pending || s->klen == 0)
						continue;
					if (!kv_range_contains(start, slen, end, elen, slot_key(s),
					                       s->klen))
						continue;
					if (cb == NULL) {
						/* The write it names may have been
						 * applied, and what replaces the range
						 * (a copy) may not know it (its source
						 * had forgotten it): a retry at or below
						 * it is refused, never applied again. */
						if (s->req > c->floor)
							c->floor = s->req;
						slot_drop(c, s);
					} else
						cb(arg, c->id, s->req, &s->res, slot_key(s),
						   s->klen, s->time_ms);
				}
		pthread_mutex_unlock(&st->mu);
	}
}

void
kv_dedup_visit_range(kv_dedup *d, const void *start, size_t slen, const void *end, size_t elen,
                     kv_dedup_visit_cb cb, void *arg)
{
	range_walk(d, 0, DEDUP_STRIPES, start, slen, end, elen, cb, arg);
}

void
kv_dedup_visit_part(kv_dedup *d, unsigned part, const void *start, size_t slen, const void *end,
                    size_t elen, kv_dedup_visit_cb cb, void *arg)
{
	range_walk(d, part, part + 1, start, slen, end, elen, cb, arg);
}

void
kv_dedup_forget_range(kv_dedup *d, const void *start, size_t slen, const void *end, size_t elen)
{
	range_walk(d, 0, DEDUP_STRIPES, start, slen, end, elen, NULL, NULL);
}

void
kv_dedup_visit_floors(kv_dedup *d, kv_dedup_floor_cb cb, void *arg)
{
	for (unsigned i = 0; i < DEDUP_STRIPES; i++) {
		dedup_stripe *st = &d->stripes[i];
		pthread_mutex_lock(&st->mu);
		for (unsigned b = 0; b < DEDUP_BUCKETS; b++)
			for (dedup_client *c = st->buckets[b]; c; c = c->next)
				if (c->floor > 0)
					cb(arg, c->id, c->floor);
		pthread_mutex_unlock(&st->mu);
	}
}

int
kv_dedup_raise_floor(kv_dedup *d, uint64_t client, uint64_t floor, uint64_t now_ms)
{
	dedup_stripe *st = stripe_of(d, client);
	dedup_client *c;

	if (client == 0 || floor == 0)
		return KV_EINVAL;
	pthread_mutex_lock(&st->mu);
	c = client_get_locked(d, st, client, now_ms);
	if (c != NULL && floor > c->floor)
		c->floor = floor;
	pthread_mutex_unlock(&st->mu);
	return c != NULL ? KV_OK : KV_ENOMEM;
}

size_t
kv_dedup_clients(kv_dedup *d)
{
	size_t n = 0;
	for (unsigned i = 0; i < DEDUP_STRIPES; i++) {
		pthread_mutex_lock(&d->stripes[i].mu);
		n += d->stripes[i].nclients;
		pthread_mutex_unlock(&d->stripes[i].mu);
	}
	return n;
}
