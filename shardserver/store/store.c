/*
 * store.c - the partitioned local store (see store.h and doc/threads.md).
 *
 * DESIGN. The store is an array of partitions. A partition is an adaptive
 * radix tree (art.c) whose leaves are items in the partition's own slab arena
 * (arena.c), plus live-key and byte counters. A key's partition is the xxh3
 * hash of the key without its last byte, so dense keys keep dense leaf nodes.
 *
 * Everything that touches a partition's tree or arena runs inside
 * store__with_part(), which is the one place that knows the mode:
 *   - striped: it takes the partition mutex around the function;
 *   - percore: it runs the function directly on the owner thread, or hands it
 *     to the owner (a task on the owner's queue) and waits for it.
 * Multi-partition operations first acquire every partition they touch, in
 * ascending order (mutexes, or parked owner threads), then run, then release.
 * Ascending order is the whole deadlock argument: no cycle can form.
 *
 * Expiry: a partition has a second tree, `exp`, from key to its deadline
 * (8 bytes, little-endian Unix ms), holding only the keys that have one, in
 * the same arena. A key without a deadline costs nothing, and reads check
 * `exp` only when it is not empty. Reads treat a key whose deadline has
 * passed as absent; the server removes such keys with KV_UPD_RECLAIM after
 * kv_store_expire_sample found them (doc/store.md "Expiry").
 *
 * Counters are relaxed atomics written only by the partition's holder, so
 * statistics can be read from any thread without locks.
 *
 * Walks (range steps, counts, split keys, range deletes, scan chunks) hold
 * a striped partition's mutex for at most KV_STORE_HOLD entries at a time
 * and let threads waiting for it go first between two holds (part__lock,
 * part__yield): a request waits for one hold at most, never a whole walk.
 * A thread that asked for it (kv_store_thread_walk_pause: the heartbeat's
 * statistics) also sleeps between the holds of its walks.
 *
 * Invariant: a partition's tree, arena and counters are touched only by the
 * holder of that partition (its mutex, or its owner thread).
 *
 * What this module does not do: durability, ownership checks, epochs. Those
 * belong to the shard server above it (and to shardserver/durable/).
 */
#define _GNU_SOURCE /* pthread_setaffinity_np */
#include "shardserver/store/store.h"
#include "shardserver/store/art.h"
#include "common/bytes.h"
#include "common/err.h"
#include "common/key.h"
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KV_STORE_MAX_PARTITIONS 4096u
#define KV_STORE_HOLD           256u       /* entries a walk or scan chunk visits per lock */
#define KV_STORE_YIELD_NS       200000u    /* a walk's longest wait for a writer to go first */
#define KV_STORE_SCRATCH_KEEP   (1u << 20) /* scratch kept between appends */

/* A unit of work for a percore owner thread. */
typedef struct kv_task kv_task;
struct kv_task {
	kv_store_task_fn fn; /* what to run */
	void *arg;           /* its argument */
	sem_t *done;         /* posted after fn returns, or NULL: the poster does not wait */
	kv_task *next;       /* queue link */
};

typedef struct {
	/* Striped: protects everything down to the blank line. Percore: unused;
	 * the owner thread is the only one that touches these. */
	pthread_mutex_t mu;
	kv_art art;                   /* the ordered index */
	kv_arena arena;               /* slab memory of nodes and items */
	kv_buf scratch;               /* room to build appended values */
	_Atomic uint64_t keys;        /* live keys (written by the holder only) */
	_Atomic uint64_t bytes;       /* key+value bytes (written by the holder only) */
	_Atomic uint64_t index_bytes; /* copy of art.index_bytes for stats */
	_Atomic uint64_t changes;     /* counter changes (written by the holder only) */
	kv_art exp;                   /* key -> deadline, only keys that have one */
	_Atomic uint64_t nexp;        /* keys in exp (written by the holder only) */
	kv_buf exp_next;              /* where kv_store_expire_sample resumes */

	/* Striped: threads blocked in part__lock for mu; no lock (atomic).
	 * A walk in steps lets them go first between its steps. */
	_Atomic unsigned waiters;
	/* Striped: a thread is making this arena's spare block (part__spare);
	 * no lock (atomic). */
	atomic_bool sparing;

	/* Percore owner queue: qmu protects qhead, qtail and stop. */
	pthread_mutex_t qmu;
	pthread_cond_t qcv; /* signalled when a task arrives or stop is set */
	kv_task *qhead;     /* oldest task */
	kv_task *qtail;     /* newest task */
	bool stop;          /* the owner exits once the queue is empty */
	bool started;       /* the owner thread exists (for destroy) */
	pthread_t thread;   /* the owner thread */
	kv_store *store;    /* back pointer for the owner thread */
	unsigned index;     /* this partition's number */
} __attribute__((aligned(64))) kv_part;

struct kv_store {
	kv_store_opts o;           /* options, immutable after create */
	unsigned nparts;           /* partitions, a power of two */
	unsigned mask;             /* nparts - 1 */
	_Atomic uint64_t mem_used; /* bytes taken from the system by every arena */
	kv_part *parts;            /* nparts partitions */
};

/* The owner identity of the current thread (percore). */
static _Thread_local const kv_store *kv_tls_store;
static _Thread_local unsigned kv_tls_part;

void
kv_store_opts_init(kv_store_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->mode = KV_STORE_STRIPED;
}

unsigned
kv_store_partitions(const kv_store *s)
{
	return s->nparts;
}

kv_store_mode
kv_store_get_mode(const kv_store *s)
{
	return s->o.mode;
}

unsigned
kv_store_partition_of(const kv_store *s, const void *key, size_t klen)
{
	if (s->nparts == 1 || klen <= 1)
		return 0;
	return (unsigned)(kv_hash64(key, klen - 1) & s->mask);
}

/* --- percore owner threads ---------------------------------------------- */

static void
store__enqueue(kv_part *p, kv_task *t)
{
	t->next = NULL;
	pthread_mutex_lock(&p->qmu);
	if (p->qtail)
		p->qtail->next = t;
	else
		p->qhead = t;
	p->qtail = t;
	pthread_cond_signal(&p->qcv);
	pthread_mutex_unlock(&p->qmu);
}

static void *
store__owner_main(void *arg)
{
	kv_part *p = arg;

	kv_log_thread_name("kv-store-part");
	kv_tls_store = p->store;
	kv_tls_part = p->index;
	if (p->store->o.pin_threads) {
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET((int)(p->index % (unsigned)(ncpu > 0 ? ncpu : 1)), &set);
		(void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	}
	for (;;) {
		kv_task *t;

		pthread_mutex_lock(&p->qmu);
		while (p->qhead == NULL && !p->stop)
			pthread_cond_wait(&p->qcv, &p->qmu);
		t = p->qhead;
		p->qhead = p->qtail = NULL;
		pthread_mutex_unlock(&p->qmu);
		if (t == NULL)
			break; /* stop with an empty queue */
		while (t != NULL) {
			/* Read everything first: after fn or the post, t may be gone. */
			kv_task *next = t->next;
			sem_t *done = t->done;
			t->fn(p->store, p->index, t->arg);
			if (done)
				sem_post(done);
			t = next;
		}
	}
	return NULL;
}

/* Runs fn on the owner of partition pi and waits for it. */
static void
store__post_wait(kv_store *s, unsigned pi, kv_store_task_fn fn, void *arg)
{
	sem_t done;
	kv_task t = {.fn = fn, .arg = arg, .done = &done};

	sem_init(&done, 0, 0);
	store__enqueue(&s->parts[pi], &t);
	while (sem_wait(&done) != 0)
		;
	sem_destroy(&done);
}

/* Whether the calling thread is an owner thread of this store. */
static inline bool
store__on_owner(const kv_store *s)
{
	return kv_tls_store == s;
}

/* --- partition access --------------------------------------------------- */

typedef int (*part_fn)(kv_store *s, kv_part *p, void *arg);

struct part_call {
	part_fn fn;
	void *arg;
	int rv;
};

static void
store__part_call_task(kv_store *s, unsigned pi, void *arg)
{
	struct part_call *c = arg;
	c->rv = c->fn(s, &s->parts[pi], c->arg);
}

/*
 * Takes a striped partition's mutex. A thread that finds it held counts
 * itself in `waiters` while it blocks, so that a walk in steps (part__yield)
 * lets it in before its next step: glibc's mutex is not fair, and a walk
 * that unlocks and locks again at once would keep the loop waiting through
 * many steps.
 */
static inline void
part__lock(kv_part *p)
{
	if (pthread_mutex_trylock(&p->mu) == 0)
		return;
	atomic_fetch_add_explicit(&p->waiters, 1, memory_order_relaxed);
	pthread_mutex_lock(&p->mu);
	atomic_fetch_sub_explicit(&p->waiters, 1, memory_order_relaxed);
}

/*
 * Makes partition p's arena a spare block (arena.h "The spare block"), with
 * no lock held: the page faults of fresh memory are taken here, by the
 * thread that just wrote, not by a holder of the mutex that every request
 * for the partition waits for. One thread at a time per partition.
 */
static void
part__spare(kv_part *p)
{
	if (atomic_exchange_explicit(&p->sparing, true, memory_order_acquire))
		return;
	void *b = kv_arena_block_make();
	if (b != NULL) {
		part__lock(p);
		int rv = kv_arena_spare_put(&p->arena, b);
		pthread_mutex_unlock(&p->mu);
		if (rv != KV_OK)
			kv_arena_block_free(b);
	}
	atomic_store_explicit(&p->sparing, false, memory_order_release);
}

/* Lets go of a striped partition's mutex after a write; then makes its
 * arena's next block if it wants one. */
static inline void
part__unlock(kv_part *p)
{
	bool spare = kv_arena_wants_spare(&p->arena);
	pthread_mutex_unlock(&p->mu);
	if (__builtin_expect(spare, 0))
		part__spare(p);
}

/* The calling thread's pause between two holds of its walks, in
 * microseconds (kv_store_thread_walk_pause). */
static _Thread_local uint32_t walk_pause_us;

void
kv_store_thread_walk_pause(uint32_t us)
{
	walk_pause_us = us;
}

/*
 * Between two steps of a walk over partition pi (its mutex not held):
 * sleeps the calling thread's walk pause, if it has one; then, striped,
 * while threads wait for the mutex, gives them the CPU, for at most
 * KV_STORE_YIELD_NS, so that a long walk (a snapshot, a count, a copy)
 * delays a request by one step at most.
 */
static void
part__yield(kv_store *s, unsigned pi)
{
	kv_part *p = &s->parts[pi];

	if (walk_pause_us != 0) {
		struct timespec ts = {.tv_sec = walk_pause_us / 1000000u,
		                      .tv_nsec = (long)(walk_pause_us % 1000000u) * 1000};
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
	}
	if (s->o.mode != KV_STORE_STRIPED ||
	    atomic_load_explicit(&p->waiters, memory_order_relaxed) == 0)
		return;
	uint64_t until = kv_now_ns() + KV_STORE_YIELD_NS;
	do
		sched_yield();
	while (atomic_load_explicit(&p->waiters, memory_order_relaxed) != 0 && kv_now_ns() < until);
}

/* Runs fn with exclusive access to partition pi (see DESIGN). */
static int
store__with_part(kv_store *s, unsigned pi, part_fn fn, void *arg)
{
	kv_part *p = &s->parts[pi];
	int rv;

	if (s->o.mode == KV_STORE_STRIPED) {
		part__lock(p);
		rv = fn(s, p, arg);
		part__unlock(p);
		return rv;
	}
	if (store__on_owner(s))
		return kv_tls_part == pi ? fn(s, p, arg) : KV_EPERM;
	struct part_call c = {.fn = fn, .arg = arg, .rv = KV_OK};
	store__post_wait(s, pi, store__part_call_task, &c);
	return c.rv;
}

/* A parked owner: it waits in park_task until released. */
struct park {
	sem_t parked;  /* owner -> coordinator: the owner stopped touching the partition */
	sem_t release; /* coordinator -> owner: go on */
	sem_t left;    /* owner -> coordinator: the owner no longer touches this struct */
	kv_task task;  /* the queued task */
};

static void
store__park_task(kv_store *s, unsigned pi, void *arg)
{
	struct park *pk = arg;
	(void)s;
	(void)pi;
	sem_post(&pk->parked);
	while (sem_wait(&pk->release) != 0)
		;
	sem_post(&pk->left);
}

/* The set of partitions a multi-key operation touches, as a bitmap. */
typedef struct {
	uint64_t bits[KV_STORE_MAX_PARTITIONS / 64];
	unsigned count;     /* partitions in the set */
	unsigned single;    /* the partition when count == 1 */
	struct park *parks; /* percore: one per member, in ascending order */
} part_set;

static void
part_set_add(part_set *ps, unsigned pi)
{
	uint64_t m = 1ull << (pi & 63);
	if (!(ps->bits[pi >> 6] & m)) {
		ps->bits[pi >> 6] |= m;
		ps->count++;
		ps->single = pi;
	}
}

#define PART_SET_FOREACH(s, ps, pi)                                                                \
	for (unsigned pi = 0; pi < (s)->nparts; pi++)                                              \
		if ((ps)->bits[pi >> 6] & (1ull << (pi & 63)))

/* Acquires every partition of the set in ascending order. Returns 0,
 * KV_EPERM (percore owner asking for other partitions) or KV_ENOMEM. */
static int
store__acquire(kv_store *s, part_set *ps)
{
	if (s->o.mode == KV_STORE_STRIPED) {
		PART_SET_FOREACH(s, ps, pi)
		part__lock(&s->parts[pi]);
		return KV_OK;
	}
	if (store__on_owner(s)) {
		/* An owner may run multi-key operations on its own partition only. */
		if (ps->count != 1 || ps->single != kv_tls_part)
			return KV_EPERM;
		return KV_OK;
	}
	ps->parks = calloc(ps->count, sizeof(struct park));
	if (ps->parks == NULL)
		return KV_ENOMEM;
	unsigned i = 0;
	PART_SET_FOREACH(s, ps, pi)
	{
		struct park *pk = &ps->parks[i++];
		sem_init(&pk->parked, 0, 0);
		sem_init(&pk->release, 0, 0);
		sem_init(&pk->left, 0, 0);
		pk->task.fn = store__park_task;
		pk->task.arg = pk;
		pk->task.done = NULL;
		store__enqueue(&s->parts[pi], &pk->task);
		/* Wait before asking the next owner: ascending acquisition. */
		while (sem_wait(&pk->parked) != 0)
			;
	}
	return KV_OK;
}

static void
store__release(kv_store *s, part_set *ps)
{
	if (s->o.mode == KV_STORE_STRIPED) {
		/* Rare: a few at most are noted; one not noted gets its spare
		 * after a later write. */
		unsigned spare[4], nspare = 0;
		for (unsigned pi = s->nparts; pi-- > 0;)
			if (ps->bits[pi >> 6] & (1ull << (pi & 63))) {
				if (nspare < 4 && kv_arena_wants_spare(&s->parts[pi].arena))
					spare[nspare++] = pi;
				pthread_mutex_unlock(&s->parts[pi].mu);
			}
		/* Every mutex let go first: no block is made while one is held. */
		for (unsigned i = 0; i < nspare; i++)
			part__spare(&s->parts[spare[i]]);
		return;
	}
	if (ps->parks == NULL)
		return;
	for (unsigned i = 0; i < ps->count; i++)
		sem_post(&ps->parks[i].release);
	for (unsigned i = 0; i < ps->count; i++) {
		struct park *pk = &ps->parks[i];
		while (sem_wait(&pk->left) != 0)
			;
		sem_destroy(&pk->parked);
		sem_destroy(&pk->release);
		sem_destroy(&pk->left);
	}
	free(ps->parks);
	ps->parks = NULL;
}

/* --- validation --------------------------------------------------------- */

static inline int
store__check_key(const kv_store *s, const void *key, size_t klen)
{
	if (key == NULL || klen == 0)
		return KV_EINVAL;
	if (klen > s->o.max_key)
		return KV_ETOOBIG;
	return KV_OK;
}

static inline int
store__check_val(const kv_store *s, const void *val, size_t vlen)
{
	if (val == NULL && vlen != 0)
		return KV_EINVAL;
	if (vlen > s->o.max_value)
		return KV_ETOOBIG;
	return KV_OK;
}

/* --- partition primitives (caller has exclusive access) ----------------- */

uint64_t
kv_store_now_ms(kv_store *s)
{
	if (s->o.clock != NULL)
		return s->o.clock(s->o.clock_arg);
	return kv_unix_ms();
}

/* The deadline of key in p (0: none). */
static inline uint64_t
part__deadline(const kv_part *p, const uint8_t *key, size_t klen)
{
	const uint8_t *v;
	size_t vl;

	if (p->exp.root == NULL || !kv_art_find(&p->exp, key, klen, &v, &vl) || vl != 8)
		return 0;
	return kv_get64(v);
}

/* Whether a deadline has passed. */
static inline bool
store__expired(kv_store *s, uint64_t at)
{
	return at != 0 && at <= kv_store_now_ms(s);
}

static inline void
part__nexp(kv_part *p, int64_t d)
{
	atomic_store_explicit(&p->nexp,
	                      atomic_load_explicit(&p->nexp, memory_order_relaxed) + (uint64_t)d,
	                      memory_order_relaxed);
}

/* Sets (at > 0) or clears the deadline of key. Clearing never allocates;
 * replacing an existing deadline neither (same size). Returns 0 or
 * KV_ENOMEM (unchanged). */
static int
part__set_deadline(kv_part *p, const uint8_t *key, size_t klen, uint64_t at)
{
	uint8_t b[8];
	bool existed = false;
	size_t ovl = 0;
	int rv;

	if (at == 0) {
		if (p->exp.root != NULL && kv_art_remove(&p->exp, &p->arena, key, klen, NULL))
			part__nexp(p, -1);
		return KV_OK;
	}
	kv_put64(b, at);
	rv = kv_art_upsert(&p->exp, &p->arena, key, klen, b, 8, &existed, &ovl);
	if (rv == KV_OK && !existed)
		part__nexp(p, 1);
	return rv;
}

static inline void
part__count(kv_part *p, int64_t dkeys, int64_t dbytes)
{
	atomic_store_explicit(
	    &p->keys, atomic_load_explicit(&p->keys, memory_order_relaxed) + (uint64_t)dkeys,
	    memory_order_relaxed);
	atomic_store_explicit(
	    &p->bytes, atomic_load_explicit(&p->bytes, memory_order_relaxed) + (uint64_t)dbytes,
	    memory_order_relaxed);
	atomic_store_explicit(&p->index_bytes, p->art.index_bytes + p->exp.index_bytes,
	                      memory_order_relaxed);
	if (dkeys != 0 || dbytes != 0)
		atomic_store_explicit(&p->changes,
		                      atomic_load_explicit(&p->changes, memory_order_relaxed) + 1,
		                      memory_order_relaxed);
}

/* Inserts or overwrites, keeping the counters. */
static int
part__put(kv_part *p, const uint8_t *key, size_t klen, const void *val, size_t vlen)
{
	bool existed;
	size_t ovl;
	int rv = kv_art_upsert(&p->art, &p->arena, key, klen, val, vlen, &existed, &ovl);

	if (rv != KV_OK)
		return rv;
	if (existed)
		part__count(p, 0, (int64_t)vlen - (int64_t)ovl);
	else
		part__count(p, 1, (int64_t)(klen + vlen));
	return KV_OK;
}

/* Inserts or overwrites with a deadline (0: none), all or nothing. */
static inline __attribute__((always_inline)) int
part__put_x(kv_part *p, const uint8_t *key, size_t klen, const void *val, size_t vlen, uint64_t at)
{
	uint64_t old = part__deadline(p, key, klen);
	int rv;

	if (old != at && (rv = part__set_deadline(p, key, klen, at)) != KV_OK)
		return rv;
	rv = part__put(p, key, klen, val, vlen);
	if (rv != KV_OK && old != at)
		(void)part__set_deadline(p, key, klen, old); /* allocates nothing */
	return rv;
}

/* Finds a live key: false when absent or expired. *at gets its deadline. */
static inline __attribute__((always_inline)) bool
part__find_live(kv_store *s, kv_part *p, const uint8_t *key, size_t klen, const uint8_t **v,
                size_t *vl, uint64_t *at)
{
	*at = 0;
	if (!kv_art_find(&p->art, key, klen, v, vl))
		return false;
	*at = part__deadline(p, key, klen);
	return !store__expired(s, *at);
}

static inline __attribute__((always_inline)) int
part__get(kv_store *s, kv_part *p, const uint8_t *key, size_t klen, kv_buf *out, uint64_t *at)
{
	const uint8_t *v;
	size_t vl;
	uint64_t a;

	if (!part__find_live(s, p, key, klen, &v, &vl, &a))
		return KV_ENOTFOUND;
	if (at)
		*at = a;
	return out ? kv_buf_set(out, v, vl) : KV_OK;
}

/* Removes key (and its deadline); *ovl gets its value length. */
static void
part__remove(kv_part *p, const uint8_t *key, size_t klen)
{
	size_t ovl = 0;

	(void)part__set_deadline(p, key, klen, 0);
	if (kv_art_remove(&p->art, &p->arena, key, klen, &ovl))
		part__count(p, -1, -(int64_t)(klen + ovl));
}

/* --- single-key operations ---------------------------------------------- */

struct op1 {
	const uint8_t *key;
	size_t klen;
	const uint8_t *val;
	size_t vlen;
	kv_buf *out;
	size_t *newlen;
	uint64_t at;     /* put: the deadline */
	uint64_t *atp;   /* get: where the deadline goes, or NULL */
	kv_store_upd *u; /* update */
};

static int
op_get(kv_store *s, kv_part *p, void *arg)
{
	struct op1 *o = arg;
	return part__get(s, p, o->key, o->klen, o->out, o->atp);
}

static int
op_put(kv_store *s, kv_part *p, void *arg)
{
	struct op1 *o = arg;
	(void)s;
	return part__put_x(p, o->key, o->klen, o->val, o->vlen, o->at);
}

static int
op_del(kv_store *s, kv_part *p, void *arg)
{
	struct op1 *o = arg;
	const uint8_t *v;
	size_t vl;
	uint64_t at;
	bool live;
	int rv;

	if (!kv_art_find(&p->art, o->key, o->klen, &v, &vl))
		return KV_ENOTFOUND;
	at = part__deadline(p, o->key, o->klen);
	live = !store__expired(s, at);
	/* Copy the value out first, so ENOMEM leaves the key in place. */
	if (live && o->out && (rv = kv_buf_set(o->out, v, vl)) != KV_OK)
		return rv;
	part__remove(p, o->key, o->klen);
	return live ? KV_OK : KV_ENOTFOUND;
}

int
kv_store_parse_i64(const void *p, size_t n, int64_t *out)
{
	const uint8_t *b = p;
	size_t i = 0;
	bool neg = false;
	uint64_t v = 0, lim;

	if (n > 0 && b[0] == '-') {
		neg = true;
		i = 1;
	}
	if (i == n || n - i > 19)
		return KV_EINVAL;
	lim = neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX;
	for (; i < n; i++) {
		if (b[i] < '0' || b[i] > '9')
			return KV_EINVAL;
		if (v > (lim - (uint64_t)(b[i] - '0')) / 10u)
			return KV_EINVAL;
		v = v * 10u + (uint64_t)(b[i] - '0');
	}
	*out = neg ? (int64_t)(0u - v) : (int64_t)v;
	return KV_OK;
}

/* Writes the new value of an update and copies it out. at: the deadline. */
static int
upd__write(kv_store *s, kv_part *p, struct op1 *o, const uint8_t *val, size_t vlen, uint64_t at)
{
	kv_store_upd *u = o->u;
	int rv;
	(void)s;

	if (u->cur && u->kind != KV_UPD_PUT &&
	    (rv = kv_buf_set(u->cur, vlen ? val : (const uint8_t *)"", vlen)) != KV_OK)
		return rv;
	if ((rv = part__put_x(p, o->key, o->klen, val, vlen, at)) != KV_OK)
		return rv;
	u->newlen = vlen;
	u->new_at = at;
	return KV_OK;
}

static int
op_update(kv_store *s, kv_part *p, void *arg)
{
	struct op1 *o = arg;
	kv_store_upd *u = o->u;
	const uint8_t *v = NULL;
	size_t vl = 0, nl;
	uint64_t at = 0;
	bool live;
	int rv;

	/* A plain put reads nothing: no lookup before the write. */
	if (u->kind == KV_UPD_PUT && u->cond == KV_UPD_ANY)
		return upd__write(s, p, o, u->value.p, u->value.len, u->expire_at);
	live = part__find_live(s, p, o->key, o->klen, &v, &vl, &at);

	if (!live)
		at = 0; /* an expired key is absent: a write to it starts afresh */
	if (u->cond == KV_UPD_IF_ABSENT && live)
		rv = KV_EEXISTS;
	else if (u->cond == KV_UPD_IF_EQUAL &&
	         (!live || vl != u->expect.len || (vl && memcmp(v, u->expect.p, vl) != 0)))
		rv = KV_EMISMATCH;
	else
		rv = KV_OK;
	if (rv != KV_OK) {
		u->cur_absent = !live;
		if (live && u->cur && kv_buf_set(u->cur, vl ? v : (const uint8_t *)"", vl) != KV_OK)
			return KV_ENOMEM;
		return rv;
	}
	switch (u->kind) {
	case KV_UPD_PUT:
		return upd__write(s, p, o, u->value.p, u->value.len, u->expire_at);
	case KV_UPD_DEL:
		if (!live)
			return KV_ENOTFOUND;
		if (u->cur && (rv = kv_buf_set(u->cur, vl ? v : (const uint8_t *)"", vl)) != KV_OK)
			return rv;
		part__remove(p, o->key, o->klen);
		return KV_OK;
	case KV_UPD_APPEND:
		if (!live)
			return upd__write(s, p, o, u->value.p, u->value.len, 0);
		if (u->value.len > s->o.max_value - vl)
			return KV_ETOOBIG;
		nl = vl + u->value.len;
		/* Build the new value beside the tree, then store it like a put. */
		if ((rv = kv_buf_reserve(&p->scratch, nl ? nl : 1)) != KV_OK)
			return rv;
		if (vl)
			memcpy(p->scratch.data, v, vl);
		if (u->value.len)
			memcpy(p->scratch.data + vl, u->value.p, u->value.len);
		rv = upd__write(s, p, o, p->scratch.data, nl, at);
		if (p->scratch.cap > KV_STORE_SCRATCH_KEEP)
			kv_buf_fini(&p->scratch);
		return rv;
	case KV_UPD_INCR: {
		int64_t cur = 0;
		char txt[24];
		int n;
		if (live && kv_store_parse_i64(v, vl, &cur) != KV_OK) {
			u->why = "the value is not a decimal signed 64-bit integer";
			return KV_EINVAL;
		}
		if ((u->delta > 0 && cur > INT64_MAX - u->delta) ||
		    (u->delta < 0 && cur < INT64_MIN - u->delta)) {
			u->why = "the increment would overflow a signed 64-bit integer";
			return KV_EINVAL;
		}
		cur += u->delta;
		n = snprintf(txt, sizeof(txt), "%lld", (long long)cur);
		if ((size_t)n > s->o.max_value)
			return KV_ETOOBIG;
		u->number = cur;
		return upd__write(s, p, o, (const uint8_t *)txt, (size_t)n, at);
	}
	case KV_UPD_EXPIRE:
		if (!live)
			return KV_ENOTFOUND;
		if (u->cur && (rv = kv_buf_set(u->cur, vl ? v : (const uint8_t *)"", vl)) != KV_OK)
			return rv;
		if ((rv = part__set_deadline(p, o->key, o->klen, u->expire_at)) != KV_OK)
			return rv;
		u->newlen = vl;
		u->new_at = u->expire_at;
		return KV_OK;
	case KV_UPD_RECLAIM:
		if (live || v == NULL)
			return KV_ENOTFOUND;
		part__remove(p, o->key, o->klen);
		return KV_OK;
	}
	return KV_EINVAL;
}

static inline __attribute__((always_inline)) int
store__get(kv_store *s, const void *key, size_t klen, kv_buf *val, uint64_t *expire_at)
{
	int rv;

	if (expire_at)
		*expire_at = 0;
	if (s == NULL || (val == NULL && expire_at == NULL))
		return KV_EINVAL;
	if ((rv = store__check_key(s, key, klen)) != KV_OK)
		return rv;
	unsigned pi = kv_store_partition_of(s, key, klen);
	if (s->o.mode == KV_STORE_STRIPED) {
		/* The hot path, spelt out: through store__with_part it costs an
		 * indirect call per read (doc/store.md "Expiry"). */
		kv_part *p = &s->parts[pi];
		part__lock(p);
		rv = part__get(s, p, key, klen, val, expire_at);
		pthread_mutex_unlock(&p->mu);
		return rv;
	}
	struct op1 o = {.key = key, .klen = klen, .out = val, .atp = expire_at};
	return store__with_part(s, pi, op_get, &o);
}

int
kv_store_get(kv_store *s, const void *key, size_t klen, kv_buf *val)
{
	return store__get(s, key, klen, val, NULL);
}

int
kv_store_get_x(kv_store *s, const void *key, size_t klen, kv_buf *val, uint64_t *expire_at)
{
	return store__get(s, key, klen, val, expire_at);
}

static inline __attribute__((always_inline)) int
store__put(kv_store *s, const void *key, size_t klen, const void *val, size_t vlen,
           uint64_t expire_at)
{
	int rv;

	if (s == NULL)
		return KV_EINVAL;
	if ((rv = store__check_key(s, key, klen)) != KV_OK ||
	    (rv = store__check_val(s, val, vlen)) != KV_OK)
		return rv;
	unsigned pi = kv_store_partition_of(s, key, klen);
	if (s->o.mode == KV_STORE_STRIPED) {
		kv_part *p = &s->parts[pi];
		part__lock(p);
		rv = part__put_x(p, key, klen, val, vlen, expire_at);
		part__unlock(p);
		return rv;
	}
	struct op1 o = {.key = key, .klen = klen, .val = val, .vlen = vlen, .at = expire_at};
	return store__with_part(s, pi, op_put, &o);
}

int
kv_store_put(kv_store *s, const void *key, size_t klen, const void *val, size_t vlen)
{
	return store__put(s, key, klen, val, vlen, 0);
}

int
kv_store_put_x(kv_store *s, const void *key, size_t klen, const void *val, size_t vlen,
               uint64_t expire_at)
{
	return store__put(s, key, klen, val, vlen, expire_at);
}

int
kv_store_del(kv_store *s, const void *key, size_t klen, kv_buf *old)
{
	struct op1 o = {.key = key, .klen = klen, .out = old};
	int rv;

	if (s == NULL)
		return KV_EINVAL;
	if ((rv = store__check_key(s, key, klen)) != KV_OK)
		return rv;
	return store__with_part(s, kv_store_partition_of(s, key, klen), op_del, &o);
}

int
kv_store_append(kv_store *s, const void *key, size_t klen, const void *val, size_t vlen,
                size_t *newlen)
{
	kv_store_upd u = {.kind = KV_UPD_APPEND, .value = {val, vlen}};
	int rv = kv_store_update(s, key, klen, &u);

	if (rv == KV_OK && newlen)
		*newlen = u.newlen;
	return rv;
}

int
kv_store_update(kv_store *s, const void *key, size_t klen, kv_store_upd *u)
{
	struct op1 o = {.key = key, .klen = klen, .u = u};
	int rv;

	if (s == NULL || u == NULL)
		return KV_EINVAL;
	u->cur_absent = false;
	u->why = NULL;
	if ((rv = store__check_key(s, key, klen)) != KV_OK ||
	    (rv = store__check_val(s, u->value.p, u->value.len)) != KV_OK)
		return rv;
	if (u->cond != KV_UPD_ANY &&
	    !(u->kind == KV_UPD_PUT || (u->kind == KV_UPD_DEL && u->cond == KV_UPD_IF_EQUAL)))
		return KV_EINVAL;
	return store__with_part(s, kv_store_partition_of(s, key, klen), op_update, &o);
}

/* --- multi-key operations ----------------------------------------------- */

/* Computes each key's partition into parts[] and the set they form. */
static int
store__partition_keys(kv_store *s, size_t n, const kv_bytes *keys, unsigned *parts, part_set *ps)
{
	memset(ps->bits, 0, sizeof(ps->bits));
	ps->count = 0;
	ps->single = 0;
	ps->parks = NULL;
	for (size_t i = 0; i < n; i++) {
		int rv = store__check_key(s, keys[i].p, keys[i].len);
		if (rv != KV_OK)
			return rv;
		parts[i] = kv_store_partition_of(s, keys[i].p, keys[i].len);
		part_set_add(ps, parts[i]);
	}
	return KV_OK;
}

/* Percore coordinator that runs a whole multi-key operation on one owner. */
struct multi_call {
	int (*fn)(kv_store *s, void *arg);
	void *arg;
	int rv;
};

static void
store__multi_task(kv_store *s, unsigned pi, void *arg)
{
	struct multi_call *c = arg;
	(void)pi;
	c->rv = c->fn(s, c->arg);
}

/* Runs fn with every partition of ps held (see DESIGN). */
static int
store__with_set(kv_store *s, part_set *ps, int (*fn)(kv_store *s, void *arg), void *arg)
{
	int rv;

	if (ps->count == 0)
		return fn(s, arg);
	if (s->o.mode == KV_STORE_PERCORE && !store__on_owner(s) && ps->count == 1) {
		/* One partition: let its owner do all of it. */
		struct multi_call c = {.fn = fn, .arg = arg, .rv = KV_OK};
		store__post_wait(s, ps->single, store__multi_task, &c);
		return c.rv;
	}
	rv = store__acquire(s, ps);
	if (rv != KV_OK)
		return rv;
	rv = fn(s, arg);
	store__release(s, ps);
	return rv;
}

struct mget_args {
	size_t n;
	const kv_bytes *keys;
	const unsigned *parts;
	kv_buf *vals;
	bool *missing;
};

static int
mget_run(kv_store *s, void *arg)
{
	struct mget_args *a = arg;
	int rv = KV_OK;

	for (size_t i = 0; i < a->n; i++) {
		int r = part__get(s, &s->parts[a->parts[i]], a->keys[i].p, a->keys[i].len,
		                  &a->vals[i], NULL);
		if (a->missing)
			a->missing[i] = r == KV_ENOTFOUND;
		if (r == KV_ENOTFOUND) {
			rv = KV_ENOTFOUND;
		} else if (r != KV_OK) {
			return r;
		}
	}
	return rv;
}

_Static_assert(KV_STORE_PREFETCH_GROUP == KV_ART_PREFETCH_MAX, "one group is one interleaved walk");

void
kv_store_prefetch(kv_store *s, size_t n, const kv_bytes *keys)
{
	if (s == NULL || keys == NULL || n < 2 || s->o.mode != KV_STORE_STRIPED)
		return;
	for (size_t at = 0; at < n; at += KV_ART_PREFETCH_MAX) {
		const kv_art *trees[KV_ART_PREFETCH_MAX];
		const uint8_t *kp[KV_ART_PREFETCH_MAX];
		size_t kl[KV_ART_PREFETCH_MAX], m = 0;
		unsigned held[KV_ART_PREFETCH_MAX], nheld = 0;

		for (size_t i = at; i < n && i < at + KV_ART_PREFETCH_MAX; i++) {
			if (store__check_key(s, keys[i].p, keys[i].len) != KV_OK)
				continue;
			unsigned pi = kv_store_partition_of(s, keys[i].p, keys[i].len);
			bool mine = false;
			for (unsigned j = 0; j < nheld && !mine; j++)
				mine = held[j] == pi;
			/* Never waits: a partition in use is simply not warmed. */
			if (!mine) {
				if (pthread_mutex_trylock(&s->parts[pi].mu) != 0)
					continue;
				held[nheld++] = pi;
			}
			trees[m] = &s->parts[pi].art;
			kp[m] = keys[i].p;
			kl[m++] = keys[i].len;
		}
		kv_art_prefetch(trees, kp, kl, m);
		while (nheld > 0)
			pthread_mutex_unlock(&s->parts[held[--nheld]].mu);
	}
}

int
kv_store_mget(kv_store *s, size_t n, const kv_bytes *keys, kv_buf *vals, bool *missing)
{
	unsigned stackparts[64], *parts = stackparts;
	part_set *ps;
	int rv;

	if (s == NULL || (n > 0 && (keys == NULL || vals == NULL)))
		return KV_EINVAL;
	if (n == 0)
		return KV_OK;
	ps = malloc(sizeof(*ps));
	if (ps == NULL)
		return KV_ENOMEM;
	if (n > 64 && (parts = malloc(n * sizeof(*parts))) == NULL) {
		free(ps);
		return KV_ENOMEM;
	}
	rv = store__partition_keys(s, n, keys, parts, ps);
	if (rv == KV_OK) {
		struct mget_args a = {
		    .n = n, .keys = keys, .parts = parts, .vals = vals, .missing = missing};
		rv = store__with_set(s, ps, mget_run, &a);
	}
	if (parts != stackparts)
		free(parts);
	free(ps);
	return rv;
}

struct mput_args {
	size_t n;
	const kv_bytes *keys;
	const kv_bytes *vals;
	const unsigned *parts;
	kv_leaf *leaves; /* new leaves, then replaced leaves */
	uint64_t at;     /* the deadline of every key; 0: none */
	uint64_t *olds;  /* at != 0: the deadlines before */
};

/* Restores the deadlines of keys [0, n) of an mput that failed (replacing
 * or removing an entry allocates nothing). */
static void
mput_undo_deadlines(kv_store *s, struct mput_args *a, size_t n)
{
	for (size_t i = n; i-- > 0;) {
		kv_part *p = &s->parts[a->parts[i]];
		(void)part__set_deadline(p, a->keys[i].p, a->keys[i].len, a->olds[i]);
	}
}

/* Applies every pair or none: leaves are made first (the step that needs
 * item memory); if putting one fails, the earlier puts are undone in reverse
 * order by putting the old leaves back, which allocates nothing. */
static int
mput_run(kv_store *s, void *arg)
{
	struct mput_args *a = arg;
	kv_leaf *neu = a->leaves, *old = a->leaves + a->n;
	size_t i, done;
	int rv = KV_OK;

	if (a->at != 0) {
		for (i = 0; i < a->n; i++) {
			kv_part *p = &s->parts[a->parts[i]];
			a->olds[i] = part__deadline(p, a->keys[i].p, a->keys[i].len);
			if (part__set_deadline(p, a->keys[i].p, a->keys[i].len, a->at) != KV_OK) {
				mput_undo_deadlines(s, a, i);
				return KV_ENOMEM;
			}
		}
	}
	for (i = 0; i < a->n; i++) {
		kv_part *p = &s->parts[a->parts[i]];
		if (kv_art_leaf_new(&p->art, &p->arena, a->keys[i].p, a->keys[i].len, a->vals[i].p,
		                    a->vals[i].len, &neu[i]) != KV_OK) {
			while (i-- > 0)
				kv_art_leaf_free(&s->parts[a->parts[i]].art,
				                 &s->parts[a->parts[i]].arena, neu[i]);
			if (a->at != 0)
				mput_undo_deadlines(s, a, a->n);
			return KV_ENOMEM;
		}
	}
	for (done = 0; done < a->n; done++) {
		kv_part *p = &s->parts[a->parts[done]];
		rv = kv_art_put_leaf(&p->art, &p->arena, a->keys[done].p, a->keys[done].len,
		                     neu[done], &old[done]);
		if (rv != KV_OK)
			break;
	}
	if (rv != KV_OK) {
		for (i = a->n; i-- > done;)
			kv_art_leaf_free(&s->parts[a->parts[i]].art, &s->parts[a->parts[i]].arena,
			                 neu[i]);
		while (done-- > 0) {
			kv_part *p = &s->parts[a->parts[done]];
			kv_leaf back;
			if (old[done] != 0) {
				(void)kv_art_put_leaf(&p->art, &p->arena, a->keys[done].p,
				                      a->keys[done].len, old[done], &back);
			} else {
				back = kv_art_take(&p->art, &p->arena, a->keys[done].p,
				                   a->keys[done].len);
			}
			kv_art_leaf_free(&p->art, &p->arena, back);
		}
		if (a->at != 0)
			mput_undo_deadlines(s, a, a->n);
		return rv;
	}
	for (i = 0; i < a->n; i++) {
		kv_part *p = &s->parts[a->parts[i]];
		if (old[i] != 0) {
			part__count(p, 0,
			            (int64_t)a->vals[i].len - (int64_t)kv_art_leaf_vlen(old[i]));
			kv_art_leaf_free(&p->art, &p->arena, old[i]);
		} else {
			part__count(p, 1, (int64_t)(a->keys[i].len + a->vals[i].len));
		}
		if (a->at == 0)
			(void)part__set_deadline(p, a->keys[i].p, a->keys[i].len, 0);
	}
	return KV_OK;
}

int
kv_store_mput(kv_store *s, size_t nk, const kv_bytes *keys, size_t nv, const kv_bytes *vals)
{
	return kv_store_mput_x(s, nk, keys, nv, vals, 0);
}

int
kv_store_mput_x(kv_store *s, size_t nk, const kv_bytes *keys, size_t nv, const kv_bytes *vals,
                uint64_t expire_at)
{
	unsigned *parts = NULL;
	kv_leaf *items = NULL;
	uint64_t *olds = NULL;
	part_set *ps = NULL;
	int rv;

	if (s == NULL || nk != nv || (nk > 0 && (keys == NULL || vals == NULL)))
		return KV_EINVAL;
	if (nk == 0)
		return KV_OK;
	for (size_t i = 0; i < nv; i++)
		if ((rv = store__check_val(s, vals[i].p, vals[i].len)) != KV_OK)
			return rv;
	ps = malloc(sizeof(*ps));
	parts = malloc(nk * sizeof(*parts));
	items = malloc(2 * nk * sizeof(*items));
	if (expire_at != 0)
		olds = malloc(nk * sizeof(*olds));
	if (ps == NULL || parts == NULL || items == NULL || (expire_at != 0 && olds == NULL)) {
		rv = KV_ENOMEM;
		goto out;
	}
	rv = store__partition_keys(s, nk, keys, parts, ps);
	if (rv == KV_OK) {
		struct mput_args a = {.n = nk,
		                      .keys = keys,
		                      .vals = vals,
		                      .parts = parts,
		                      .leaves = items,
		                      .at = expire_at,
		                      .olds = olds};
		rv = store__with_set(s, ps, mput_run, &a);
	}
out:
	free(olds);
	free(items);
	free(parts);
	free(ps);
	return rv;
}

/* --- ordered reads ------------------------------------------------------ */

struct walk_args {
	const uint8_t *start;
	size_t slen;
	const uint8_t *end;
	size_t elen;
	size_t max;
	bool with_values;
	kv_store_visit_cb cb;   /* the visitor, or NULL when xcb is set */
	kv_store_visitx_cb xcb; /* the visitor with deadlines: expired entries too */
	void *arg;
	bool more;
	size_t visited;
};

/*
 * Walks partition p from `start` (inclusive) while keys are below `end`,
 * calling the visitor for at most `max` entries (0: no limit): cb for live
 * entries only, or xcb for all of them with their deadline. Sets w->more
 * when an entry of the range remains after the last visited one. Exclusive
 * access to p is the caller's.
 */
static inline __attribute__((always_inline)) int
walk(kv_store *s, kv_part *p, struct walk_args *w, bool dl)
{
	kv_art_iter it;
	kv_art_entry e;
	size_t n = 0;
	/* Read once: the visitor may write through w's pointers, so the
	 * compiler would load every field again after each call. */
	kv_store_visitx_cb xcb = w->xcb;
	kv_store_visit_cb cb = w->cb;
	void *cbarg = w->arg;
	const uint8_t *end = w->end;
	size_t elen = w->elen, max = w->max;
	bool vals = w->with_values;
	uint64_t now = dl && xcb == NULL ? kv_store_now_ms(s) : 0;
	int rv;

	w->more = false;
	kv_art_iter_init(&it);
	rv = kv_art_iter_seek(&it, &p->art, w->start, w->slen);
	while (rv == KV_OK && kv_art_iter_next(&it, &e)) {
		const uint8_t *k = e.key, *v = vals ? e.val : NULL;
		size_t kl = e.klen, vl = vals ? e.vlen : 0;
		uint64_t at = dl ? part__deadline(p, k, kl) : 0;
		int stop;
		if (elen != 0 && kv_key_cmp(k, kl, end, elen) >= 0)
			break;
		if (at != 0 && xcb == NULL && at <= now)
			continue; /* expired: absent for readers */
		if (max != 0 && n == max) {
			w->more = true;
			break;
		}
		n++;
		stop = xcb != NULL ? xcb(cbarg, k, kl, v, vl, at) : cb(cbarg, k, kl, v, vl);
		if (stop != 0) {
			w->more = true; /* stopped by the visitor: more may follow */
			break;
		}
	}
	if (rv == KV_OK && it.err != 0)
		rv = it.err;
	kv_art_iter_fini(&it);
	w->visited = n;
	return rv;
}

/* walk, compiled twice: for a partition where no key has a deadline the
 * deadline checks vanish (keys without a TTL pay nothing, doc/store.md
 * "Expiry"). */
static int
op_walk(kv_store *s, kv_part *p, void *arg)
{
	return p->exp.root == NULL ? walk(s, p, arg, false) : walk(s, p, arg, true);
}

int
kv_store_scan_partition(kv_store *s, unsigned part, const void *start, size_t slen, const void *end,
                        size_t elen, size_t limit, bool with_values, kv_store_visit_cb cb,
                        void *arg, bool *more)
{
	struct walk_args w = {.start = start,
	                      .slen = slen,
	                      .end = end,
	                      .elen = elen,
	                      .max = limit,
	                      .with_values = with_values,
	                      .cb = cb,
	                      .arg = arg};
	int rv;

	if (s == NULL || cb == NULL || part >= s->nparts || (slen && !start) || (elen && !end))
		return KV_EINVAL;
	rv = store__with_part(s, part, op_walk, &w);
	if (more)
		*more = w.more;
	return rv;
}

/* One partition's window of a merged scan: a chunk of entries copied out. */
typedef struct {
	kv_buf data;    /* entries: u32 klen, u32 vlen, key, value */
	size_t *offs;   /* offset of each entry in data */
	size_t n;       /* entries in the chunk */
	size_t cap;     /* room in offs */
	size_t pos;     /* next entry to merge */
	bool exhausted; /* nothing of the range is left after this chunk */
	size_t chunk;   /* entries to ask for next time (grows by doubling) */
	kv_buf next;    /* where the next chunk starts */
	int err;        /* an allocation failed while copying */
} scan_src;

static int
scan_copy_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	scan_src *src = arg;
	uint32_t h[2] = {(uint32_t)klen, (uint32_t)vlen};
	int rv;

	if (src->n == src->cap) {
		size_t ncap = src->cap ? src->cap * 2 : 16;
		size_t *no = realloc(src->offs, ncap * sizeof(*no));
		if (no == NULL) {
			src->err = KV_ENOMEM;
			return 1;
		}
		src->offs = no;
		src->cap = ncap;
	}
	if (val == NULL)
		h[1] = 0;
	src->offs[src->n] = src->data.len;
	if ((rv = kv_buf_reserve(&src->data, src->data.len + sizeof(h) + klen + h[1])) != KV_OK) {
		src->err = rv;
		return 1;
	}
	uint8_t *d = src->data.data + src->data.len;
	memcpy(d, h, sizeof(h));
	memcpy(d + sizeof(h), key, klen);
	if (h[1])
		memcpy(d + sizeof(h) + klen, val, h[1]);
	src->data.len += sizeof(h) + klen + h[1];
	src->n++;
	return 0;
}

static inline void
scan_entry(const scan_src *src, size_t i, const uint8_t **k, size_t *kl, const uint8_t **v,
           size_t *vl)
{
	const uint8_t *e = src->data.data + src->offs[i];
	uint32_t h[2];
	memcpy(h, e, sizeof(h));
	*kl = h[0];
	*vl = h[1];
	*k = e + sizeof(h);
	*v = e + sizeof(h) + h[0];
}

/* Refills a source with the next chunk of its partition. */
static int
scan_fill(kv_store *s, unsigned pi, scan_src *src, const uint8_t *end, size_t elen, size_t chunk,
          bool with_values)
{
	bool more = false;
	int rv;

	src->data.len = 0;
	src->n = 0;
	src->pos = 0;
	src->chunk = chunk;
	rv = kv_store_scan_partition(s, pi, src->next.data, src->next.len, end, elen, chunk,
	                             with_values, scan_copy_cb, src, &more);
	part__yield(s, pi);
	if (rv == KV_OK && src->err != 0)
		rv = src->err;
	if (rv != KV_OK)
		return rv;
	if (!more || src->n == 0) {
		src->exhausted = true;
		return KV_OK;
	}
	/* Resume after the last key copied: that key plus one 0x00 byte. */
	const uint8_t *k, *v;
	size_t kl, vl;
	scan_entry(src, src->n - 1, &k, &kl, &v, &vl);
	rv = kv_buf_set(&src->next, k, kl);
	if (rv == KV_OK)
		rv = kv_buf_append(&src->next, "", 1);
	return rv;
}

/* Heap order of sources by their current key. */
static inline bool
scan_less(const scan_src *srcs, unsigned a, unsigned b)
{
	const uint8_t *ka, *kb, *v;
	size_t la, lb, vl;
	scan_entry(&srcs[a], srcs[a].pos, &ka, &la, &v, &vl);
	scan_entry(&srcs[b], srcs[b].pos, &kb, &lb, &v, &vl);
	return kv_key_cmp(ka, la, kb, lb) < 0;
}

static void
scan_sift_down(const scan_src *srcs, unsigned *heap, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, m = i;
		if (l < n && scan_less(srcs, heap[l], heap[m]))
			m = l;
		if (r < n && scan_less(srcs, heap[r], heap[m]))
			m = r;
		if (m == i)
			return;
		unsigned t = heap[i];
		heap[i] = heap[m];
		heap[m] = t;
		i = m;
	}
}

int
kv_store_scan(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
              size_t limit, bool with_values, kv_store_visit_cb cb, void *arg, bool *more)
{
	scan_src *srcs = NULL;
	unsigned *heap = NULL;
	size_t hn = 0, emitted = 0, chunk;
	bool stopped = false;
	int rv = KV_OK;

	if (more)
		*more = false;
	if (s == NULL || cb == NULL || (slen && !start) || (elen && !end))
		return KV_EINVAL;
	if (kv_range_is_empty(start, slen, end, elen))
		return KV_OK;

	if (s->o.mode == KV_STORE_PERCORE && store__on_owner(s))
		return KV_EPERM;
	/* Start small (a limited scan takes about limit/partitions entries from
	 * each partition), then double the chunk of the partitions that are
	 * actually consumed: the copying stays near limit + partitions. */
	chunk = limit ? limit / s->nparts + 1 : KV_STORE_HOLD;
	if (chunk > KV_STORE_HOLD)
		chunk = KV_STORE_HOLD;
	srcs = calloc(s->nparts, sizeof(*srcs));
	heap = calloc(s->nparts, sizeof(*heap));
	if (srcs == NULL || heap == NULL) {
		rv = KV_ENOMEM;
		goto out;
	}
	for (unsigned pi = 0; pi < s->nparts; pi++) {
		if ((rv = kv_buf_set(&srcs[pi].next, start, slen)) != KV_OK ||
		    (rv = scan_fill(s, pi, &srcs[pi], end, elen, chunk, with_values)) != KV_OK)
			goto out;
		if (srcs[pi].n > 0)
			heap[hn++] = pi;
	}
	for (size_t i = hn / 2; i-- > 0;)
		scan_sift_down(srcs, heap, hn, i);
	while (hn > 0) {
		unsigned pi = heap[0];
		scan_src *src = &srcs[pi];
		const uint8_t *k, *v;
		size_t kl, vl;

		if (limit != 0 && emitted == limit) {
			if (more)
				*more = true;
			break;
		}
		scan_entry(src, src->pos, &k, &kl, &v, &vl);
		emitted++;
		if (cb(arg, k, kl, with_values ? v : NULL, with_values ? vl : 0) != 0) {
			stopped = true;
			break;
		}
		src->pos++;
		if (src->pos == src->n) {
			size_t want = src->chunk * 2;
			if (want > KV_STORE_HOLD)
				want = KV_STORE_HOLD;
			if (limit != 0 && want > limit - emitted + 1)
				want = limit - emitted + 1;
			if (!src->exhausted &&
			    (rv = scan_fill(s, pi, src, end, elen, want, with_values)) != KV_OK)
				goto out;
			if (src->pos == src->n)
				heap[0] = heap[--hn]; /* this partition is done */
		}
		scan_sift_down(srcs, heap, hn, 0);
	}
	(void)stopped;
out:
	if (srcs != NULL) {
		for (unsigned pi = 0; pi < s->nparts; pi++) {
			kv_buf_fini(&srcs[pi].data);
			kv_buf_fini(&srcs[pi].next);
			free(srcs[pi].offs);
		}
	}
	free(srcs);
	free(heap);
	return rv;
}

int
kv_scan_resume_key(const void *key, size_t klen, kv_buf *out)
{
	int rv;

	if (out == NULL || (klen && key == NULL))
		return KV_EINVAL;
	rv = kv_buf_set(out, key, klen);
	return rv == KV_OK ? kv_buf_append(out, "", 1) : rv;
}

/* --- range maintenance -------------------------------------------------- */

void
kv_store_cursor_init(kv_store_cursor *c)
{
	memset(c, 0, sizeof(*c));
}

void
kv_store_cursor_fini(kv_store_cursor *c)
{
	if (c == NULL)
		return;
	kv_buf_fini(&c->last);
	memset(c, 0, sizeof(*c));
}

struct step_args {
	kv_store_visit_cb cb;   /* the caller's visitor, or NULL */
	kv_store_visitx_cb xcb; /* ... with deadlines, or NULL */
	void *arg;              /* its argument */
	kv_buf *last;           /* records the last key visited */
	int err;                /* recording failed */
	bool stopped;           /* the visitor asked to stop */
};

static int
step_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen, uint64_t at)
{
	struct step_args *a = arg;
	int rv = kv_buf_set(a->last, key, klen);

	if (rv != KV_OK) {
		a->err = rv;
		return 1;
	}
	if ((a->xcb ? a->xcb(a->arg, key, klen, val, vlen, at)
	            : a->cb(a->arg, key, klen, val, vlen)) != 0) {
		a->stopped = true;
		return 1;
	}
	return 0;
}

/* step_cb for a walk of live entries only (walk_args.cb). */
static int
step_live_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	return step_cb(arg, key, klen, val, vlen, 0);
}

static int
store__range_step(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                  kv_store_cursor *c, size_t max, kv_store_visit_cb cb, kv_store_visitx_cb xcb,
                  void *arg)
{
	size_t budget = max;
	kv_buf from = {0};
	int rv = KV_OK;

	if (s == NULL || c == NULL || (cb == NULL && xcb == NULL) || max == 0 || (slen && !start) ||
	    (elen && !end))
		return KV_EINVAL;
	while (!c->done && budget > 0) {
		struct step_args a = {.cb = cb, .xcb = xcb, .arg = arg, .last = &c->last};
		bool more = false;
		size_t visited = 0;

		if (c->part >= s->nparts) {
			c->done = true;
			break;
		}
		if (c->started)
			rv = kv_scan_resume_key(c->last.data, c->last.len, &from);
		else
			rv = kv_buf_set(&from, start, slen);
		if (rv != KV_OK)
			break;
		struct walk_args w = {.start = from.data,
		                      .slen = from.len,
		                      .end = end,
		                      .elen = elen,
		                      .max = budget < KV_STORE_HOLD ? budget : KV_STORE_HOLD,
		                      .with_values = true,
		                      .xcb = step_cb,
		                      .arg = &a};
		rv = store__with_part(s, c->part, op_walk, &w);
		part__yield(s, c->part);
		more = w.more;
		visited = w.visited;
		if (rv == KV_OK && a.err != 0)
			rv = a.err;
		if (rv != KV_OK)
			break;
		if (visited > 0)
			c->started = true;
		budget -= visited;
		if (a.stopped)
			break;
		if (!more) {
			/* This partition has nothing more in the range. */
			c->part++;
			c->started = false;
			c->last.len = 0;
		}
	}
	kv_buf_fini(&from);
	return rv;
}

/*
 * Visits every live entry of [start, end) in partition pi, in key order, in
 * steps of KV_STORE_HOLD entries per lock (part__yield between them), until
 * cb returns non-zero. Entries written between steps may or may not be seen.
 */
static int
part__walk_steps(kv_store *s, unsigned pi, const void *start, size_t slen, const void *end,
                 size_t elen, kv_store_visit_cb cb, void *arg)
{
	kv_buf last = {0}, from = {0};
	int rv = kv_buf_set(&from, start, slen);

	while (rv == KV_OK) {
		struct step_args a = {.cb = cb, .arg = arg, .last = &last};
		struct walk_args w = {.start = from.data,
		                      .slen = from.len,
		                      .end = end,
		                      .elen = elen,
		                      .max = KV_STORE_HOLD,
		                      .with_values = true,
		                      .cb = step_live_cb,
		                      .arg = &a};
		rv = store__with_part(s, pi, op_walk, &w);
		if (rv == KV_OK && a.err != 0)
			rv = a.err;
		if (rv != KV_OK || a.stopped || !w.more || w.visited == 0)
			break;
		part__yield(s, pi);
		rv = kv_scan_resume_key(last.data, last.len, &from);
	}
	kv_buf_fini(&last);
	kv_buf_fini(&from);
	return rv;
}

int
kv_store_range_step(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                    kv_store_cursor *c, size_t max, kv_store_visit_cb cb, void *arg)
{
	return store__range_step(s, start, slen, end, elen, c, max, cb, NULL, arg);
}

int
kv_store_range_step_x(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                      kv_store_cursor *c, size_t max, kv_store_visitx_cb cb, void *arg)
{
	return store__range_step(s, start, slen, end, elen, c, max, NULL, cb, arg);
}

static int
store__found_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
                uint64_t at)
{
	(void)key;
	(void)klen;
	(void)val;
	(void)vlen;
	(void)at;
	*(bool *)arg = true;
	return 1;
}

struct rdel_args {
	const uint8_t *start;
	size_t slen;
	const uint8_t *end;
	size_t elen;
	size_t max;     /* deletions allowed */
	uint64_t count; /* deletions done */
};

/*
 * Removes up to d->max keys of [start, end) from the partition: one walk
 * collects them (a removal would invalidate the walk's path) and looks one
 * key further, then each is removed. KV_EBUSY when keys of the range are
 * left after the budget.
 */
static int
op_range_delete(kv_store *s, kv_part *p, void *arg)
{
	struct rdel_args *d = arg;
	size_t offs[KV_STORE_HOLD + 1], n = 0;
	kv_buf keys = {0};
	kv_art_iter it;
	kv_art_entry e;
	bool left = false;
	int rv;
	(void)s;

	if (d->max > KV_STORE_HOLD)
		return KV_EINVAL;
	kv_art_iter_init(&it);
	rv = kv_art_iter_seek(&it, &p->art, d->start, d->slen);
	offs[0] = 0;
	while (rv == KV_OK) {
		if (!kv_art_iter_next(&it, &e)) {
			rv = it.err;
			break;
		}
		if (d->elen != 0 && kv_key_cmp(e.key, e.klen, d->end, d->elen) >= 0)
			break;
		if (n == d->max) {
			left = true;
			break;
		}
		if ((rv = kv_buf_append(&keys, e.key, e.klen)) == KV_OK)
			offs[++n] = keys.len;
	}
	kv_art_iter_fini(&it);
	/* Even after a failed walk: what it collected goes. */
	for (size_t i = 0; i < n; i++) {
		const uint8_t *k = keys.data + offs[i];
		size_t kl = offs[i + 1] - offs[i], vl = 0;
		(void)part__set_deadline(p, k, kl, 0);
		if (!kv_art_remove(&p->art, &p->arena, k, kl, &vl))
			continue;
		part__count(p, -1, -(int64_t)(kl + vl));
		d->count++;
	}
	kv_buf_fini(&keys);
	if (rv == KV_OK && left)
		rv = KV_EBUSY;
	return rv;
}

int
kv_store_range_delete(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                      size_t max, uint64_t *deleted)
{
	uint64_t total = 0;
	int rv = KV_OK;

	if (s == NULL || max == 0 || (slen && !start) || (elen && !end))
		return KV_EINVAL;
	for (unsigned pi = 0; pi < s->nparts; pi++) {
		if (total == max) {
			/* Budget spent at a partition boundary: anything left here? */
			bool left = false;
			struct walk_args w = {.start = start,
			                      .slen = slen,
			                      .end = end,
			                      .elen = elen,
			                      .max = 1,
			                      .xcb = store__found_cb,
			                      .arg = &left};
			rv = store__with_part(s, pi, op_walk, &w);
			if (rv == KV_OK && left)
				rv = KV_EBUSY;
			if (rv != KV_OK)
				break;
			continue;
		}
		/* At most KV_STORE_HOLD removals per lock: a partition with more
		 * of the range takes several steps, writers going first between. */
		for (;;) {
			size_t step = max - total < KV_STORE_HOLD ? max - total : KV_STORE_HOLD;
			struct rdel_args d = {
			    .start = start, .slen = slen, .end = end, .elen = elen, .max = step};
			rv = store__with_part(s, pi, op_range_delete, &d);
			total += d.count;
			if (rv != KV_EBUSY || total == max)
				break;
			part__yield(s, pi);
		}
		if (rv != KV_OK)
			break;
	}
	if (deleted)
		*deleted += total;
	return rv;
}

struct count_args {
	uint64_t keys;
	uint64_t bytes;
};

static int
count_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	struct count_args *c = arg;
	(void)key;
	(void)val;
	c->keys++;
	c->bytes += klen + vlen;
	return 0;
}

int
kv_store_range_count(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                     uint64_t *keys, uint64_t *bytes)
{
	uint64_t k, b;
	int rv;

	/* No sample is large enough: every partition is walked, exactly. */
	rv = kv_store_range_estimate(s, start, slen, end, elen, UINT64_MAX, &k, &b, NULL);
	if (rv == KV_OK) {
		if (keys)
			*keys = k;
		if (bytes)
			*bytes = b;
	}
	return rv;
}

int
kv_store_range_estimate(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                        uint64_t min_keys, uint64_t *keys, uint64_t *bytes, bool *exact)
{
	struct count_args c = {0, 0};
	unsigned walked = 0;

	if (s == NULL || keys == NULL || bytes == NULL || (slen && !start) || (elen && !end))
		return KV_EINVAL;
	while (walked < s->nparts && (walked == 0 || c.keys < min_keys)) {
		int rv = part__walk_steps(s, walked, start, slen, end, elen, count_cb, &c);
		if (rv != KV_OK)
			return rv;
		walked++;
	}
	if (walked == s->nparts) {
		*keys = c.keys;
		*bytes = c.bytes;
	} else {
		/* Rounded to the nearest: the sample's share is walked / nparts. */
		*keys = (c.keys * s->nparts + walked / 2) / walked;
		*bytes = (c.bytes * s->nparts + walked / 2) / walked;
	}
	if (exact != NULL)
		*exact = walked == s->nparts;
	return KV_OK;
}

struct split_args {
	uint64_t half;  /* bytes to pass before picking a key */
	uint64_t seen;  /* bytes passed */
	uint64_t index; /* entries passed */
	kv_buf *key;    /* the pick */
	bool found;
	int err;
};

static int
split_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	struct split_args *a = arg;
	(void)val;

	/* Never the first key: the split must leave the left side non-empty. */
	if (a->index > 0 && a->seen >= a->half) {
		a->err = kv_buf_set(a->key, key, klen);
		a->found = true;
		return 1;
	}
	a->seen += klen + vlen;
	a->index++;
	return 0;
}

int
kv_store_range_split_key(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                         kv_buf *key)
{
	int rv;

	if (s == NULL || key == NULL || (slen && !start) || (elen && !end))
		return KV_EINVAL;
	if ((rv = kv_store_range_split_keys(s, start, slen, end, elen, 1, key)) != KV_OK)
		return rv;
	if (key->len > 0)
		return KV_OK;
	/* No key has half the bytes before it (a heavy last key, or one key
	 * a partition): the second smallest, when there is one. */
	struct split_args a = {.half = 0, .key = key};
	rv = kv_store_scan(s, start, slen, end, elen, 2, false, split_cb, &a, NULL);
	if (rv == KV_OK && a.err != 0)
		rv = a.err;
	if (rv != KV_OK)
		return rv;
	return a.found ? KV_OK : KV_ENOTFOUND;
}

struct splits_args {
	uint64_t total; /* bytes of the keys walked over */
	uint64_t seen;  /* bytes passed */
	uint64_t index; /* entries passed */
	unsigned n;     /* cuts wanted */
	unsigned got;   /* cuts placed (keys[got] is the next) */
	kv_buf *keys;
	int err;
};

static int
splits_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	struct splits_args *a = arg;
	bool first = true;
	(void)val;

	/* Never the first key: every part keeps a key on its left. */
	while (a->index > 0 && a->got < a->n &&
	       a->seen >= a->total * (a->got + 1) / ((uint64_t)a->n + 1)) {
		if (first) {
			if ((a->err = kv_buf_set(&a->keys[a->got], key, klen)) != KV_OK)
				return 1;
			first = false;
		}
		a->got++;
	}
	if (a->got == a->n)
		return 1;
	a->seen += klen + vlen;
	a->index++;
	return 0;
}

/* Keys of partitions too small to stand for the range alone, with their
 * entries' bytes, gathered to be sorted (kv_store_range_split_keys). */
typedef struct {
	uint8_t *key;
	size_t klen;
	uint64_t bytes;
} split_sample;

struct gather_args {
	split_sample *v;
	size_t n, cap;
	int err;
};

static int
gather_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	struct gather_args *g = arg;
	(void)val;

	if (g->n == g->cap) {
		size_t ncap = g->cap ? 2 * g->cap : 256;
		split_sample *nv = realloc(g->v, ncap * sizeof(*nv));
		if (nv == NULL)
			goto oom;
		g->v = nv;
		g->cap = ncap;
	}
	if ((g->v[g->n].key = malloc(klen ? klen : 1)) == NULL)
		goto oom;
	memcpy(g->v[g->n].key, key, klen);
	g->v[g->n].klen = klen;
	g->v[g->n].bytes = klen + vlen;
	g->n++;
	return 0;
oom:
	g->err = KV_ENOMEM;
	return 1;
}

static int
split_sample_cmp(const void *a, const void *b)
{
	const split_sample *x = a, *y = b;
	return kv_key_cmp(x->key, x->klen, y->key, y->klen);
}

int
kv_store_range_split_keys(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                          unsigned n, kv_buf *keys)
{
	struct gather_args g = {0};
	int rv = KV_OK;

	if (s == NULL || (n > 0 && keys == NULL) || (slen && !start) || (elen && !end))
		return KV_EINVAL;
	for (unsigned i = 0; i < n; i++)
		keys[i].len = 0;
	if (n == 0)
		return KV_OK;
	for (unsigned pi = 0; pi < s->nparts && g.n < KV_STORE_SPLIT_SAMPLE; pi++) {
		struct count_args c = {0, 0};
		if ((rv = part__walk_steps(s, pi, start, slen, end, elen, count_cb, &c)) != KV_OK)
			goto out;
		if (c.keys == 0)
			continue;
		if (g.n == 0 && c.keys >= KV_STORE_SPLIT_SAMPLE) {
			/* One partition holds enough: its cuts, in a second pass. */
			struct splits_args a = {.total = c.bytes, .n = n, .keys = keys};
			rv = part__walk_steps(s, pi, start, slen, end, elen, splits_cb, &a);
			if (rv == KV_OK)
				rv = a.err;
			goto out;
		}
		rv = part__walk_steps(s, pi, start, slen, end, elen, gather_cb, &g);
		if (rv == KV_OK)
			rv = g.err;
		if (rv != KV_OK)
			goto out;
	}
	/* The partitions gathered, in key order: all of a small range, exact. */
	if (g.n > 1)
		qsort(g.v, g.n, sizeof(*g.v), split_sample_cmp);
	struct splits_args a = {.n = n, .keys = keys};
	for (size_t i = 0; i < g.n; i++)
		a.total += g.v[i].bytes;
	for (size_t i = 0; i < g.n && a.got < n && a.err == KV_OK; i++)
		splits_cb(&a, g.v[i].key, g.v[i].klen, NULL, g.v[i].bytes - g.v[i].klen);
	rv = a.err;
out:
	for (size_t i = 0; i < g.n; i++)
		free(g.v[i].key);
	free(g.v);
	if (rv != KV_OK)
		for (unsigned i = 0; i < n; i++)
			keys[i].len = 0;
	return rv;
}

/* --- range delete, count, active expiry ---------------------------------- */

/* One partition's position in a delrange step's merge. */
typedef struct {
	kv_art_iter it; /* over the partition's tree */
	kv_art_entry e; /* its current entry, when has */
	bool has;       /* e is an entry of the range */
} dr_head;

struct drange_args {
	const uint8_t *start, *end;
	size_t slen, elen;
	size_t limit;    /* live keys to remove */
	kv_buf *removed; /* gets every removed key (u32 klen, key), or NULL */
	uint64_t count;  /* live keys removed */
	bool more;       /* keys of the range remain */
	kv_buf *next;    /* where to resume, or NULL */
};

static void
dr_advance(dr_head *h, const uint8_t *end, size_t elen)
{
	h->has = kv_art_iter_next(&h->it, &h->e) &&
	         (elen == 0 || kv_key_cmp(h->e.key, h->e.klen, end, elen) < 0);
}

/* With every partition held: merges the partitions' trees in key order to
 * pick the keys, then removes them (the iterators are gone by then). */
static int
drange_run(kv_store *s, void *arg)
{
	struct drange_args *d = arg;
	dr_head *h = calloc(s->nparts, sizeof(*h));
	kv_buf keys = {0}; /* picked keys: u32 part, u32 klen, u8 expired, key */
	size_t npicked = 0, live = 0, cap = 2 * d->limit; /* expired ones bounded too */
	uint64_t now = kv_store_now_ms(s);
	int rv = KV_OK;

	if (h == NULL)
		return KV_ENOMEM;
	for (unsigned pi = 0; pi < s->nparts && rv == KV_OK; pi++) {
		kv_art_iter_init(&h[pi].it);
		rv = kv_art_iter_seek(&h[pi].it, &s->parts[pi].art, d->start, d->slen);
		if (rv == KV_OK)
			dr_advance(&h[pi], d->end, d->elen);
	}
	while (rv == KV_OK && live < d->limit && npicked < cap) {
		int m = -1;
		for (unsigned pi = 0; pi < s->nparts; pi++)
			if (h[pi].has && (m < 0 || kv_key_cmp(h[pi].e.key, h[pi].e.klen, h[m].e.key,
			                                      h[m].e.klen) < 0))
				m = (int)pi;
		if (m < 0)
			break;
		uint64_t at = part__deadline(&s->parts[m], h[m].e.key, h[m].e.klen);
		uint8_t hdr[9];
		bool expired = at != 0 && at <= now;
		kv_put32(hdr, (uint32_t)m);
		kv_put32(hdr + 4, (uint32_t)h[m].e.klen);
		hdr[8] = expired;
		if (kv_buf_append(&keys, hdr, sizeof(hdr)) != KV_OK ||
		    kv_buf_append(&keys, h[m].e.key, h[m].e.klen) != KV_OK ||
		    (d->removed != NULL &&
		     (kv_buf_append(d->removed, hdr + 4, 4) != KV_OK ||
		      kv_buf_append(d->removed, h[m].e.key, h[m].e.klen) != KV_OK))) {
			rv = KV_ENOMEM;
			break;
		}
		npicked++;
		live += !expired;
		dr_advance(&h[m], d->end, d->elen);
	}
	for (unsigned pi = 0; pi < s->nparts; pi++) {
		if (rv == KV_OK && h[pi].it.err != 0)
			rv = h[pi].it.err;
		d->more |= h[pi].has;
		kv_art_iter_fini(&h[pi].it);
	}
	free(h);
	if (rv == KV_OK && d->more && d->next != NULL && npicked > 0) {
		const uint8_t *last = NULL;
		size_t ll = 0;
		for (size_t off = 0; off < keys.len;) {
			ll = kv_get32(keys.data + off + 4);
			last = keys.data + off + 9;
			off += 9 + ll;
		}
		rv = kv_scan_resume_key(last, ll, d->next);
	}
	if (rv != KV_OK) {
		kv_buf_fini(&keys);
		return rv;
	}
	for (size_t off = 0; off < keys.len;) {
		unsigned pi = kv_get32(keys.data + off);
		size_t kl = kv_get32(keys.data + off + 4);
		bool expired = keys.data[off + 8] != 0;
		const uint8_t *k = keys.data + off + 9;
		part__remove(&s->parts[pi], k, kl);
		d->count += !expired;
		off += 9 + kl;
	}
	kv_buf_fini(&keys);
	return KV_OK;
}

int
kv_store_delrange(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                  size_t limit, kv_buf *removed, uint64_t *count, bool *more, kv_buf *next)
{
	struct drange_args d = {.start = start,
	                        .slen = slen,
	                        .end = end,
	                        .elen = elen,
	                        .limit = limit,
	                        .removed = removed,
	                        .next = next};
	part_set *ps;
	int rv;

	if (count)
		*count = 0;
	if (more)
		*more = false;
	if (s == NULL || limit == 0 || (slen && !start) || (elen && !end))
		return KV_EINVAL;
	if (kv_range_is_empty(start, slen, end, elen))
		return KV_OK;
	if ((ps = calloc(1, sizeof(*ps))) == NULL)
		return KV_ENOMEM;
	for (unsigned pi = 0; pi < s->nparts; pi++)
		part_set_add(ps, pi);
	if (removed != NULL)
		removed->len = 0;
	rv = store__with_set(s, ps, drange_run, &d);
	free(ps);
	if (rv != KV_OK && removed != NULL)
		removed->len = 0;
	if (rv == KV_OK) {
		if (count)
			*count = d.count;
		if (more)
			*more = d.more;
	}
	return rv;
}

struct cnt_args {
	uint64_t n;   /* keys counted */
	kv_buf *last; /* the last one */
	int err;
};

static int
cnt_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	struct cnt_args *c = arg;
	(void)val;
	(void)vlen;
	c->n++;
	if (c->last != NULL && (c->err = kv_buf_set(c->last, key, klen)) != KV_OK)
		return 1;
	return 0;
}

int
kv_store_count(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
               size_t limit, uint64_t *count, bool *more, kv_buf *next)
{
	kv_buf last = {0};
	struct cnt_args c = {.last = next ? &last : NULL};
	bool m = false;
	int rv;

	rv = kv_store_scan(s, start, slen, end, elen, limit, false, cnt_cb, &c, &m);
	if (rv == KV_OK && c.err != KV_OK)
		rv = c.err;
	if (rv == KV_OK && m && next != NULL && c.n > 0)
		rv = kv_scan_resume_key(last.data, last.len, next);
	kv_buf_fini(&last);
	if (rv == KV_OK) {
		if (count)
			*count = c.n;
		if (more)
			*more = m;
	}
	return rv;
}

struct esample_args {
	size_t max;
	kv_store_key_cb cb;
	void *arg;
	size_t seen;
};

static int
op_expire_sample(kv_store *s, kv_part *p, void *arg)
{
	struct esample_args *a = arg;
	kv_art_iter it;
	kv_art_entry e;
	uint64_t now;
	bool end = true;
	int rv;

	if (p->exp.root == NULL)
		return KV_OK;
	now = kv_store_now_ms(s);
	kv_art_iter_init(&it);
	rv = kv_art_iter_seek(&it, &p->exp, p->exp_next.data, p->exp_next.len);
	while (rv == KV_OK && kv_art_iter_next(&it, &e)) {
		if (a->seen == a->max) {
			end = false;
			rv = kv_buf_set(&p->exp_next, e.key, e.klen);
			break;
		}
		a->seen++;
		if (e.vlen == 8 && kv_get64(e.val) <= now)
			a->cb(a->arg, e.key, e.klen, true);
	}
	if (rv == KV_OK && it.err != 0)
		rv = it.err;
	kv_art_iter_fini(&it);
	if (rv == KV_OK && end)
		p->exp_next.len = 0; /* wrap around */
	return rv;
}

int
kv_store_expire_sample(kv_store *s, unsigned part, size_t max, kv_store_key_cb cb, void *arg,
                       size_t *seen)
{
	struct esample_args a = {.max = max, .cb = cb, .arg = arg};
	int rv;

	if (seen)
		*seen = 0;
	if (s == NULL || cb == NULL || part >= s->nparts || max == 0)
		return KV_EINVAL;
	rv = store__with_part(s, part, op_expire_sample, &a);
	if (seen)
		*seen = a.seen;
	return rv;
}

/* --- statistics, tasks, life cycle -------------------------------------- */

void
kv_store_get_stats(kv_store *s, kv_store_stats *st)
{
	memset(st, 0, sizeof(*st));
	if (s == NULL)
		return;
	for (unsigned pi = 0; pi < s->nparts; pi++) {
		kv_part *p = &s->parts[pi];
		st->keys += atomic_load_explicit(&p->keys, memory_order_relaxed);
		st->bytes += atomic_load_explicit(&p->bytes, memory_order_relaxed);
		st->index_bytes += atomic_load_explicit(&p->index_bytes, memory_order_relaxed);
		st->expiring += atomic_load_explicit(&p->nexp, memory_order_relaxed);
		st->changes += atomic_load_explicit(&p->changes, memory_order_relaxed);
	}
	st->mem_bytes = atomic_load_explicit(&s->mem_used, memory_order_relaxed);
}

int
kv_store_run_on(kv_store *s, unsigned part, kv_store_task_fn fn, void *arg)
{
	if (s == NULL || fn == NULL || part >= s->nparts)
		return KV_EINVAL;
	if (s->o.mode == KV_STORE_STRIPED) {
		fn(s, part, arg);
		return KV_OK;
	}
	if (store__on_owner(s)) {
		if (kv_tls_part != part)
			return KV_EPERM;
		fn(s, part, arg);
		return KV_OK;
	}
	store__post_wait(s, part, fn, arg);
	return KV_OK;
}

static unsigned
store__round_pow2(unsigned n)
{
	unsigned p = 1;
	while (p < n)
		p <<= 1;
	return p;
}

int
kv_store_create(const kv_store_opts *opts, kv_store **out)
{
	kv_store_opts o;
	kv_store *s;

	if (out == NULL)
		return KV_EINVAL;
	if (opts)
		o = *opts;
	else
		kv_store_opts_init(&o);
	if (o.mode != KV_STORE_STRIPED && o.mode != KV_STORE_PERCORE)
		return KV_EINVAL;
	if (o.partitions == 0) {
		long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
		/* Striped: a few stripes per core keep lock collisions rare, and
		 * few enough that a merged scan's per-partition seeks stay cheap. */
		o.partitions = o.mode == KV_STORE_STRIPED ? (unsigned)(ncpu > 4 ? 4 * ncpu : 16)
		                                          : (unsigned)(ncpu > 0 ? ncpu : 1);
	}
	if (o.partitions > KV_STORE_MAX_PARTITIONS)
		return KV_EINVAL;
	if (o.max_key == 0)
		o.max_key = KV_DEFAULT_MAX_KEY;
	if (o.max_value == 0)
		o.max_value = KV_DEFAULT_MAX_VALUE;
	if (o.max_key > KV_HARD_MAX_KEY || o.max_value > KV_HARD_MAX_VALUE)
		return KV_EINVAL;
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return KV_ENOMEM;
	s->o = o;
	s->nparts = o.mode == KV_STORE_STRIPED ? store__round_pow2(o.partitions) : o.partitions;
	if (o.mode == KV_STORE_PERCORE)
		s->nparts = store__round_pow2(o.partitions);
	s->o.partitions = s->nparts;
	s->mask = s->nparts - 1;
	atomic_init(&s->mem_used, 0);
	if (posix_memalign((void **)&s->parts, 64, s->nparts * sizeof(kv_part)) != 0) {
		free(s);
		return KV_ENOMEM;
	}
	memset(s->parts, 0, s->nparts * sizeof(kv_part));
	/* A partition is held for well under a microsecond at a time (a
	 * prefetch walk of a group of keys, kv_store_prefetch, holds several):
	 * a thread that finds it held spins briefly before it sleeps, instead
	 * of paying a futex sleep and wake-up for a wait shorter than both. */
	pthread_mutexattr_t adaptive;
	pthread_mutexattr_init(&adaptive);
	pthread_mutexattr_settype(&adaptive, PTHREAD_MUTEX_ADAPTIVE_NP);
	for (unsigned pi = 0; pi < s->nparts; pi++) {
		kv_part *p = &s->parts[pi];
		pthread_mutex_init(&p->mu, &adaptive);
		pthread_mutex_init(&p->qmu, NULL);
		pthread_cond_init(&p->qcv, NULL);
		kv_art_init(&p->art);
		kv_art_init(&p->exp);
		kv_arena_init(&p->arena, &s->mem_used, o.mem_limit);
		p->store = s;
		p->index = pi;
	}
	pthread_mutexattr_destroy(&adaptive);
	if (o.mode == KV_STORE_PERCORE) {
		for (unsigned pi = 0; pi < s->nparts; pi++) {
			kv_part *p = &s->parts[pi];
			if (pthread_create(&p->thread, NULL, store__owner_main, p) != 0) {
				kv_store_destroy(s);
				return KV_ENOMEM;
			}
			p->started = true;
		}
	}
	*out = s;
	return KV_OK;
}

void
kv_store_destroy(kv_store *s)
{
	if (s == NULL)
		return;
	for (unsigned pi = 0; pi < s->nparts; pi++) {
		kv_part *p = &s->parts[pi];
		if (!p->started)
			continue;
		pthread_mutex_lock(&p->qmu);
		p->stop = true;
		pthread_cond_signal(&p->qcv);
		pthread_mutex_unlock(&p->qmu);
		pthread_join(p->thread, NULL);
	}
	for (unsigned pi = 0; pi < s->nparts; pi++) {
		kv_part *p = &s->parts[pi];
		/* Slab memory goes with the blocks; only large items need a walk. */
		kv_art_clear(&p->art, &p->arena);
		kv_art_clear(&p->exp, &p->arena);
		kv_buf_fini(&p->scratch);
		kv_buf_fini(&p->exp_next);
		kv_arena_fini(&p->arena);
		pthread_mutex_destroy(&p->mu);
		pthread_mutex_destroy(&p->qmu);
		pthread_cond_destroy(&p->qcv);
	}
	free(s->parts);
	free(s);
}

uint64_t
kv_store_mem_used(kv_store *s)
{
	return atomic_load_explicit(&s->mem_used, memory_order_relaxed);
}
