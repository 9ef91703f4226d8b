/*
 * dedup.c - the exactly-once table (dedup.h).
 *
 * DESIGN. 16 stripes by client id, each a mutex over a chained hash of
 * clients. A client holds a ring of its last `per_client` writes; a new
 * write overwrites the oldest slot, so the memory per client is fixed and a
 * lookup is a scan of at most per_client slots under one stripe lock. A slot
 * is "in progress" between begin and finish, which turns a retry that races
 * with its first attempt into KV_EBUSY instead of a second application.
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

#define DEDUP_STRIPES 16u
#define DEDUP_BUCKETS 256u

typedef struct {
	uint64_t req;        /* Op.request_id; 0: empty slot */
	bool pending;        /* begun, not finished */
	uint64_t time_ms;    /* when applied, Unix ms */
	kv_dedup_result res; /* the result (value owned) */
	kv_buf key;          /* the key the write touched (owned) */
} dedup_slot;

typedef struct dedup_client {
	uint64_t id;               /* Request.client_id */
	uint64_t last_ms;          /* last use, for LRU and expiry */
	size_t head;               /* next slot to overwrite */
	dedup_slot *slots;         /* per_client slots */
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
	kv_buf_fini(&s->key);
	memset(s, 0, sizeof(*s));
}

static void
client_free(dedup_client *c, size_t per_client)
{
	for (size_t i = 0; i < per_client; i++)
		slot_clear(&c->slots[i]);
	free(c->slots);
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

kv_dedup *
kv_dedup_create(size_t per_client, size_t max_clients, uint64_t ttl_ms)
{
	kv_dedup *d = calloc(1, sizeof(*d));
	if (d == NULL)
		return NULL;
	d->per_client = per_client ? per_client : 128;
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
				client_free(c, d->per_client);
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
				client_free(c, d->per_client);
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
		client_free(c, d->per_client);
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
	c->slots = calloc(d->per_client, sizeof(*c->slots));
	if (c->slots == NULL) {
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
slot_find(kv_dedup *d, dedup_client *c, uint64_t req)
{
	for (size_t i = 0; i < d->per_client; i++)
		if (c->slots[i].req == req)
			return &c->slots[i];
	return NULL;
}

static dedup_slot *
slot_new(kv_dedup *d, dedup_client *c, uint64_t req)
{
	dedup_slot *s = &c->slots[c->head];
	c->head = (c->head + 1) % d->per_client;
	slot_clear(s);
	s->req = req;
	return s;
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
kv_dedup_begin(kv_dedup *d, uint64_t client, uint64_t req, uint64_t now_ms, kv_dedup_result *out)
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
	s = slot_find(d, c, req);
	if (s != NULL) {
		rv = s->pending ? KV_EBUSY : result_copy(out, &s->res);
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
	return kv_buf_set(&s->key, key, klen);
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
		s = slot_find(d, c, req);
		if (s == NULL)
			s = slot_new(d, c, req);
		if (slot_fill(s, res, key, klen, now_ms) != 0)
			slot_clear(s); /* forgetting is safe; a wrong memory is not */
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
	if (c != NULL && (s = slot_find(d, c, req)) != NULL && s->pending)
		slot_clear(s);
	pthread_mutex_unlock(&st->mu);
}

int
kv_dedup_insert(kv_dedup *d, uint64_t client, uint64_t req, const kv_dedup_result *res,
                const void *key, size_t klen, uint64_t time_ms)
{
	dedup_stripe *st = stripe_of(d, client);
	dedup_client *c;
	dedup_slot *s;
	int rv = KV_OK;

	if (client == 0 || req == 0)
		return KV_EINVAL;
	pthread_mutex_lock(&st->mu);
	c = client_get_locked(d, st, client, time_ms);
	if (c == NULL) {
		rv = KV_ENOMEM;
	} else if (slot_find(d, c, req) == NULL) {
		s = slot_new(d, c, req);
		if ((rv = slot_fill(s, res, key, klen, time_ms)) != 0)
			slot_clear(s);
	}
	pthread_mutex_unlock(&st->mu);
	return rv;
}

/* Calls cb for the finished entries whose key lies in [start, end), or
 * forgets them when cb is NULL. */
static void
range_walk(kv_dedup *d, const void *start, size_t slen, const void *end, size_t elen,
           kv_dedup_visit_cb cb, void *arg)
{
	for (unsigned i = 0; i < DEDUP_STRIPES; i++) {
		dedup_stripe *st = &d->stripes[i];
		pthread_mutex_lock(&st->mu);
		for (unsigned b = 0; b < DEDUP_BUCKETS; b++)
			for (dedup_client *c = st->buckets[b]; c; c = c->next)
				for (size_t j = 0; j < d->per_client; j++) {
					dedup_slot *s = &c->slots[j];
					if (s->req == 0 || s->pending || s->key.len == 0)
						continue;
					if (!kv_range_contains(start, slen, end, elen, s->key.data,
					                       s->key.len))
						continue;
					if (cb == NULL)
						slot_clear(s);
					else
						cb(arg, c->id, s->req, &s->res, s->key.data,
						   s->key.len, s->time_ms);
				}
		pthread_mutex_unlock(&st->mu);
	}
}

void
kv_dedup_visit_range(kv_dedup *d, const void *start, size_t slen, const void *end, size_t elen,
                     kv_dedup_visit_cb cb, void *arg)
{
	range_walk(d, start, slen, end, elen, cb, arg);
}

void
kv_dedup_forget_range(kv_dedup *d, const void *start, size_t slen, const void *end, size_t elen)
{
	range_walk(d, start, slen, end, elen, NULL, NULL);
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
