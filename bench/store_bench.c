/*
 * store_bench.c - shardkv-store-bench, the throughput benchmark of the local
 * store (shardserver/store.h), modelled on the published SharedHashFile
 * experiment: N small keys, one thread per core, each thread working on its
 * own keys, phases timed separately.
 *
 * Keys 0..N-1 are B-byte big-endian integers (zero-padded on the left). Every
 * thread owns a fixed set of them for the whole run: in striped mode thread t
 * owns [t*N/T, (t+1)*N/T) and calls the ordinary API; in percore mode the
 * store has T partitions, thread t runs on the owner thread of partition t
 * (kv_store_run_on) and owns exactly the keys of that partition. The key sets
 * are computed before anything is timed. Threads never share keys.
 *
 * Phases, in this order (--phases picks a subset; put is required):
 *
 *   PUT   insert every key           value tag (key, PUT)
 *   UPD   overwrite every key        value tag (key, UPD)
 *   MIX   per key: one in 50 (2%) delete + put (one op, tag (key, MIX)),
 *         the others get and check the UPD value
 *   GET   get every key and check its latest value
 *   SCAN  one ordered pass with values (see below)
 *
 * With --order random, PUT and every later key phase visit the thread's keys
 * in a fresh random permutation, shuffled before the phase's barrier. A
 * phase's time runs from the barrier that releases all threads to the end of
 * the slowest one; ops/s is the number of keys visited over that time.
 *
 * SCAN: in striped mode thread t calls kv_store_scan over its own key range
 * (a merge of all partitions, globally ordered). In percore mode an owner
 * thread may not call kv_store_scan (KV_EPERM: it spans every partition), so
 * each owner walks its own partition with one kv_store_scan_partition over
 * the whole key space: ordered within the partition, not globally. Every
 * visited entry is checked (key order, value) and the number visited must
 * equal the keys owned.
 *
 * The peer (--peer lfht) is liburcu's lock-free hash table (cds_lfht, QSBR
 * flavour) run through the same threads, key sets and permutations. The table
 * is presized to the power of two at or above N buckets, its best case, and
 * may still auto-resize: grown from a small table it lets chains reach about
 * 8 before each resize, and under load here its lazy resize sometimes never
 * ran at all (--lfht-buckets 1024 shows it). A node holds key and value
 * inline and is hashed with kv_hash64 (the store's own xxh3). Lookups run
 * under rcu_read_lock and copy the value out, as the store does; writes
 * allocate a node and cds_lfht_add_replace it; replaced and deleted nodes are
 * freed by their own thread in batches of RETIRE_BATCH after one
 * synchronize_rcu, and every thread passes a quiescent state every QS_EVERY
 * operations. A hash table has no ordered traversal and no way to split one,
 * so its SCAN is a full unordered cds_lfht_for_each by every thread: T*N
 * visits.
 *
 * Memory: bytes_per_key is the growth of the resident set (/proc/self/statm)
 * from just before the PUT phase to just after it, divided by N (for the peer
 * from before the table is created, so its bucket array counts). With a peer,
 * the store and then the peer each run in a child forked from the parent
 * while it is still single-threaded and has allocated nothing, so neither
 * reuses memory the other freed; each child prints its own lines and hands
 * its figures to the parent through a pipe for the ratios and the JSON.
 *
 * It does not measure latency, contention between threads on the same keys,
 * or anything over the network (that is `shardkv bench`).
 */
#define _GNU_SOURCE /* pthread_setaffinity_np, CPU_SET, malloc_trim */

#include "common/err.h"
#include "common/key.h"
#include "shardserver/store/store.h"

/* Inline the QSBR fast paths (rcu_read_lock is then free, and a quiescent
 * state a load and a compare), as liburcu allows for its short functions. */
#define _LGPL_SOURCE
#include <urcu-qsbr.h>
#include <urcu/rculfhash.h>

#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

enum { PH_PUT, PH_UPD, PH_MIX, PH_GET, PH_SCAN, PH_COUNT };

static const char *const phase_names[PH_COUNT] = {"PUT", "UPD", "MIX", "GET", "SCAN"};
static const char *const phase_flags[PH_COUNT] = {"put", "upd", "mix", "get", "scan"};

#define MIX_WRITE_EVERY 50u    /* MIX: one key in 50 (2%) is deleted and put again */
#define QS_EVERY        128u   /* lfht: operations between quiescent states */
#define RETIRE_BATCH    65536u /* lfht: replaced nodes freed per grace period */
#define MAX_THREADS     4096u  /* the store's partition limit */

/* Key numbers are kept as uint32_t. */
#define MAX_KEYS (UINT64_C(1) << 32)

/* The parsed command line; read-only once parsed. */
typedef struct {
	uint64_t keys;              /* N: keys 0..N-1 */
	unsigned threads;           /* T: worker threads (percore: partitions) */
	kv_store_mode mode;         /* store concurrency mode */
	unsigned partitions;        /* striped: partitions, 0 for the store default */
	size_t key_size;            /* bytes per key */
	size_t value_size;          /* bytes per value */
	bool random;                /* --order random */
	bool peer;                  /* --peer lfht */
	unsigned phases;            /* bit i set: phase i runs */
	uint64_t seed;              /* seeds the permutations, MIX choice and values */
	bool json;                  /* also print one JSON object */
	bool pin;                   /* pin worker threads to CPUs */
	unsigned long lfht_buckets; /* lfht: initial buckets, 0: the power of two >= N */
	uint64_t ttl_ms;            /* --ttl-ms: store writes carry an expiry this far ahead */
	bool reclaim;               /* --reclaim: then time the reclaim of every key */
	bool prefetch;              /* --prefetch: warm each group of keys (kv_store_prefetch) */
} bench_cfg;

/* The figures of one run (store or peer); passed from a child by value. */
typedef struct {
	uint64_t ops[PH_COUNT];     /* keys visited per phase, 0 if it did not run */
	uint64_t ns[PH_COUNT];      /* wall time per phase */
	double bytes_per_key;       /* RSS growth over PUT / N */
	double mem_bytes_per_key;   /* store: stats mem_bytes after PUT / N */
	double index_bytes_per_key; /* store: stats index_bytes after PUT / N */
	uint64_t errors;            /* failed operations and wrong results */
	unsigned partitions;        /* store partitions (0 for the peer) */
	int fatal;                  /* 0, or the KV_E* code that stopped the run */
	bool done;                  /* the run finished */
} bench_result;

typedef struct bench bench;

/* One worker thread's state; touched only by that thread during a phase, and
 * cache-line aligned so that neighbours do not share a line. */
typedef struct {
	bench *b;                  /* the run */
	unsigned t;                /* thread number; percore: its partition */
	uint64_t lo, hi;           /* striped: the key range [lo, hi) */
	uint32_t *idx;             /* keys to visit; NULL: lo..hi-1 in order */
	size_t n;                  /* keys owned */
	uint8_t *kbuf;             /* key being encoded, max(B, 8) bytes */
	uint8_t *pbuf;             /* --prefetch: the next group's keys, G x max(B, 8) bytes */
	uint8_t *vbuf;             /* value being written, max(V, 8) bytes */
	uint8_t *ebuf;             /* value expected, max(V, 8) bytes */
	kv_buf got;                /* value read back, reused by every get */
	void **retired;            /* lfht: unlinked nodes awaiting a grace period */
	size_t nretired;           /* lfht: entries in `retired` */
	uint64_t start_ns, end_ns; /* timed part of the current phase */
	uint64_t ops;              /* keys visited in the current phase */
	uint64_t errors;           /* wrong results, all phases */
	uint64_t scan_prev;        /* SCAN: last key seen */
	bool scan_started;         /* SCAN: scan_prev is valid */
	bool scan_ordered;         /* SCAN: keys must ascend */
	int fatal;                 /* 0, or the error that stopped this worker */
} __attribute__((aligned(64))) worker;

/* One run: the system under test and its workers. */
struct bench {
	const bench_cfg *cfg;    /* parameters */
	kv_store *store;         /* the store under test, or NULL */
	struct cds_lfht *ht;     /* the peer under test, or NULL */
	worker *w;               /* cfg->threads workers */
	uint32_t *idx_all;       /* storage of the workers' idx arrays, or NULL */
	pthread_barrier_t start; /* releases the workers of a phase together */
	int phase;               /* the phase being run */
	bool ran_upd;            /* UPD is among the phases */
	bool ran_mix;            /* MIX is among the phases */
	uint64_t value_seed;     /* seeds the value tags */
	uint64_t mix_seed;       /* seeds the MIX write choice */
	uint64_t ttl_at;         /* --ttl-ms: the deadline store writes carry; 0: none */
	int *cpus;               /* CPUs this process may run on */
	unsigned ncpus;          /* entries in cpus */
};

/* An lfht node: linkage, then key and value inline. */
typedef struct {
	struct cds_lfht_node node; /* linkage in the table */
	uint32_t klen;             /* key bytes */
	uint32_t vlen;             /* value bytes */
	uint8_t data[];            /* key, then value */
} lf_item;

/* Prints a one-line reason and exits 1: for failures that leave nothing to
 * measure (out of memory, no threads). */
static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void
die(const char *fmt, ...)
{
	va_list ap;

	fflush(stdout);
	fputs("shardkv-store-bench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

static void *
xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);

	if (p == NULL)
		die("out of memory (%zu x %zu bytes)", n, size);
	return p;
}

/* Returns zeroed memory of whole cache lines, so that the scratch buffers of
 * different workers never share a line. free() releases it. */
static void *
xalloc_lines(size_t n)
{
	size_t size = (n + 63) / 64 * 64;
	void *p = aligned_alloc(64, size ? size : 64);

	if (p == NULL)
		die("out of memory (%zu bytes)", n);
	memset(p, 0, size ? size : 64);
	return p;
}

/* splitmix64's finaliser: a bijection that mixes every input bit. */
static inline uint64_t
mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= UINT64_C(0xbf58476d1ce4e5b9);
	x ^= x >> 27;
	x *= UINT64_C(0x94d049bb133111eb);
	return x ^ (x >> 31);
}

/* splitmix64: the PRNG of the permutations. */
static inline uint64_t
rng_next(uint64_t *s)
{
	*s += UINT64_C(0x9e3779b97f4a7c15);
	return mix64(*s);
}

/* Writes key number k as a B-byte big-endian integer into kb (at least
 * max(B, 8) bytes, zero beyond the last 8 bytes of the key). */
static inline void
key_encode(uint8_t *kb, size_t ksz, uint64_t k)
{
	uint64_t be;

	if (ksz >= 8) {
		be = htobe64(k);
		memcpy(kb + ksz - 8, &be, 8);
	} else {
		be = htobe64(k << (64 - 8 * ksz));
		memcpy(kb, &be, 8);
	}
}

/* Returns the key number of an encoded key (its last 8 bytes at most). */
static inline uint64_t
key_decode(const uint8_t *kb, size_t ksz)
{
	uint64_t be = 0;

	if (ksz >= 8) {
		memcpy(&be, kb + ksz - 8, 8);
		return be64toh(be);
	}
	memcpy(&be, kb, ksz);
	return be64toh(be) >> (64 - 8 * ksz);
}

/* Writes the tag of (k, phase) into the first 8 bytes of a value buffer; the
 * rest of the buffer holds a fixed filler. */
static inline void
value_tag(const bench *b, uint8_t *buf, uint64_t k, int vphase)
{
	uint64_t tag = mix64(b->value_seed ^ (k * 4 + (uint64_t)vphase));

	memcpy(buf, &tag, 8);
}

/* Returns whether MIX deletes and puts key k rather than reading it. */
static inline bool
mix_writes(const bench *b, uint64_t k)
{
	return mix64(b->mix_seed ^ k) % MIX_WRITE_EVERY == 0;
}

/* Returns the phase whose value key k holds after the write phases. */
static inline int
final_vphase(const bench *b, uint64_t k)
{
	if (b->ran_mix && mix_writes(b, k))
		return PH_MIX;
	return b->ran_upd ? PH_UPD : PH_PUT;
}

/* Returns whether `val` is the value key k got in `vphase`. */
static inline bool
value_ok(worker *w, const uint8_t *val, size_t vlen, uint64_t k, int vphase)
{
	size_t vsz = w->b->cfg->value_size;

	if (vlen != vsz)
		return false;
	if (vsz == 0)
		return true;
	value_tag(w->b, w->ebuf, k, vphase);
	return memcmp(val, w->ebuf, vsz) == 0;
}

/* Returns the key number of the i-th key the worker visits. */
static inline uint64_t
worker_key(const worker *w, size_t i)
{
	return w->idx != NULL ? w->idx[i] : w->lo + i;
}

/*
 * The peer: cds_lfht. Every function is called by a registered, online QSBR
 * thread.
 */

static int
lf_match(struct cds_lfht_node *node, const void *key)
{
	const lf_item *it = caa_container_of(node, lf_item, node);
	const kv_bytes *k = key;

	return it->klen == k->len && memcmp(it->data, k->p, k->len) == 0;
}

/* Frees the retired nodes after a grace period. */
static void
lf_flush(worker *w)
{
	size_t i;

	if (w->nretired == 0)
		return;
	synchronize_rcu();
	for (i = 0; i < w->nretired; i++)
		free(w->retired[i]);
	w->nretired = 0;
}

/* Frees `it` once no reader can hold it: batched per thread. */
static inline void
lf_retire(worker *w, lf_item *it)
{
	w->retired[w->nretired++] = it;
	if (w->nretired == RETIRE_BATCH)
		lf_flush(w);
}

static int
lf_put(worker *w, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	kv_bytes k = {key, klen};
	struct cds_lfht_node *old;
	lf_item *it = malloc(sizeof(*it) + klen + vlen);

	if (it == NULL)
		return KV_ENOMEM;
	cds_lfht_node_init(&it->node);
	it->klen = (uint32_t)klen;
	it->vlen = (uint32_t)vlen;
	memcpy(it->data, key, klen);
	if (vlen)
		memcpy(it->data + klen, val, vlen);
	rcu_read_lock();
	old = cds_lfht_add_replace(w->b->ht, kv_hash64(key, klen), lf_match, &k, &it->node);
	rcu_read_unlock();
	if (old != NULL)
		lf_retire(w, caa_container_of(old, lf_item, node));
	return KV_OK;
}

/* Copies the value into w->got, as kv_store_get does. */
static int
lf_get(worker *w, const uint8_t *key, size_t klen)
{
	kv_bytes k = {key, klen};
	struct cds_lfht_iter iter;
	struct cds_lfht_node *node;
	int rv = KV_ENOTFOUND;

	rcu_read_lock();
	cds_lfht_lookup(w->b->ht, kv_hash64(key, klen), lf_match, &k, &iter);
	node = cds_lfht_iter_get_node(&iter);
	if (node != NULL) {
		const lf_item *it = caa_container_of(node, lf_item, node);
		rv = kv_buf_set(&w->got, it->data + it->klen, it->vlen);
	}
	rcu_read_unlock();
	return rv;
}

static int
lf_del(worker *w, const uint8_t *key, size_t klen)
{
	kv_bytes k = {key, klen};
	struct cds_lfht_iter iter;
	struct cds_lfht_node *node;
	lf_item *victim = NULL;

	rcu_read_lock();
	cds_lfht_lookup(w->b->ht, kv_hash64(key, klen), lf_match, &k, &iter);
	node = cds_lfht_iter_get_node(&iter);
	if (node != NULL && cds_lfht_del(w->b->ht, node) == 0)
		victim = caa_container_of(node, lf_item, node);
	rcu_read_unlock();
	if (victim == NULL)
		return KV_ENOTFOUND;
	lf_retire(w, victim);
	return KV_OK;
}

/*
 * The operations of the system under test. The branch on b->ht is the same
 * for a whole run, so it predicts perfectly.
 */

static inline int
sut_put(worker *w, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	if (w->b->ht != NULL)
		return lf_put(w, key, klen, val, vlen);
	if (w->b->ttl_at != 0)
		return kv_store_put_x(w->b->store, key, klen, val, vlen, w->b->ttl_at);
	return kv_store_put(w->b->store, key, klen, val, vlen);
}

static inline int
sut_get(worker *w, const uint8_t *key, size_t klen)
{
	if (w->b->ht != NULL)
		return lf_get(w, key, klen);
	return kv_store_get(w->b->store, key, klen, &w->got);
}

static inline int
sut_del(worker *w, const uint8_t *key, size_t klen)
{
	if (w->b->ht != NULL)
		return lf_del(w, key, klen);
	return kv_store_del(w->b->store, key, klen, NULL);
}

/* Lets a QSBR grace period through every QS_EVERY operations (peer only). */
static inline void
sut_tick(worker *w, size_t i)
{
	if (w->b->ht != NULL && i % QS_EVERY == QS_EVERY - 1)
		rcu_quiescent_state();
}

/*
 * Phases. Each visits the worker's keys once and counts one op per key.
 */

/*
 * --prefetch: at the start of each group of KV_STORE_PREFETCH_GROUP keys,
 * warms the paths of the whole group at once, as the server does for the
 * ops of a request (store only; the peer has no such call).
 */
static inline void
warm_group(worker *w, size_t i)
{
	const bench *b = w->b;
	size_t ksz = b->cfg->key_size, kcap = ksz < 8 ? 8 : ksz;
	kv_bytes keys[KV_STORE_PREFETCH_GROUP];
	size_t n = 0;

	if (!b->cfg->prefetch || b->ht != NULL || i % KV_STORE_PREFETCH_GROUP != 0)
		return;
	for (size_t j = i; j < w->n && n < KV_STORE_PREFETCH_GROUP; j++, n++) {
		uint8_t *k = w->pbuf + n * kcap;
		key_encode(k, ksz, worker_key(w, j));
		keys[n] = (kv_bytes){k, ksz};
	}
	kv_store_prefetch(b->store, n, keys);
}

/* PUT and UPD: writes every key with the tag of `vphase`. */
static void
phase_write(worker *w, int vphase)
{
	const bench *b = w->b;
	size_t ksz = b->cfg->key_size, vsz = b->cfg->value_size, i;
	uint64_t errors = 0;

	for (i = 0; i < w->n; i++) {
		uint64_t k = worker_key(w, i);

		warm_group(w, i);
		key_encode(w->kbuf, ksz, k);
		value_tag(b, w->vbuf, k, vphase);
		if (sut_put(w, w->kbuf, ksz, w->vbuf, vsz) != KV_OK)
			errors++;
		sut_tick(w, i);
	}
	w->ops = w->n;
	w->errors += errors;
}

/* MIX: 2% of the keys are deleted and put again (one op), the rest read. */
static void
phase_mix(worker *w)
{
	const bench *b = w->b;
	size_t ksz = b->cfg->key_size, vsz = b->cfg->value_size, i;
	int prev = b->ran_upd ? PH_UPD : PH_PUT;
	uint64_t errors = 0;

	for (i = 0; i < w->n; i++) {
		uint64_t k = worker_key(w, i);

		key_encode(w->kbuf, ksz, k);
		if (mix_writes(b, k)) {
			if (sut_del(w, w->kbuf, ksz) != KV_OK)
				errors++;
			value_tag(b, w->vbuf, k, PH_MIX);
			if (sut_put(w, w->kbuf, ksz, w->vbuf, vsz) != KV_OK)
				errors++;
		} else if (sut_get(w, w->kbuf, ksz) != KV_OK ||
		           !value_ok(w, w->got.data, w->got.len, k, prev)) {
			errors++;
		}
		sut_tick(w, i);
	}
	w->ops = w->n;
	w->errors += errors;
}

/* GET: reads every key and checks its latest value. */
static void
phase_get(worker *w)
{
	const bench *b = w->b;
	size_t ksz = b->cfg->key_size, i;
	uint64_t errors = 0;

	for (i = 0; i < w->n; i++) {
		uint64_t k = worker_key(w, i);

		warm_group(w, i);
		key_encode(w->kbuf, ksz, k);
		if (sut_get(w, w->kbuf, ksz) != KV_OK ||
		    !value_ok(w, w->got.data, w->got.len, k, final_vphase(b, k)))
			errors++;
		sut_tick(w, i);
	}
	w->ops = w->n;
	w->errors += errors;
}

/* Checks one scanned entry: its size, its order when the scan is ordered, and
 * its value. */
static int
scan_visit_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	worker *w = arg;
	uint64_t k;

	w->ops++;
	if (klen != w->b->cfg->key_size || val == NULL) {
		w->errors++;
		return 0;
	}
	k = key_decode(key, klen);
	if (w->scan_ordered && w->scan_started && k <= w->scan_prev)
		w->errors++;
	w->scan_prev = k;
	w->scan_started = true;
	if (!value_ok(w, val, vlen, k, final_vphase(w->b, k)))
		w->errors++;
	return 0;
}

/* Striped SCAN: kv_store_scan over the worker's own key range. */
static void
scan_store_range(worker *w)
{
	size_t ksz = w->b->cfg->key_size;
	uint8_t *lo = xcalloc(1, ksz + 8), *hi = xcalloc(1, ksz + 8);
	size_t hlen = ksz;
	int rv;

	key_encode(lo, ksz, w->lo);
	if (w->hi >= w->b->cfg->keys)
		hlen = 0; /* the last range is open: N may not be encodable */
	else
		key_encode(hi, ksz, w->hi);
	if (w->hi > w->lo) {
		rv = kv_store_scan(w->b->store, lo, ksz, hi, hlen, 0, true, scan_visit_cb, w, NULL);
		if (rv != KV_OK)
			w->errors++;
	}
	free(lo);
	free(hi);
}

/* Percore SCAN: the owner walks its own partition in key order, directly
 * (nothing else runs on that partition during the phase). */
static void
scan_store_partition(worker *w)
{
	int rv = kv_store_scan_partition(w->b->store, w->t, "", 0, "", 0, 0, true, scan_visit_cb, w,
	                                 NULL);

	if (rv != KV_OK)
		w->errors++;
}

/* Peer SCAN: a full unordered traversal of the table. */
static void
scan_lfht(worker *w)
{
	struct cds_lfht_iter iter;
	lf_item *it;

	rcu_read_lock();
	cds_lfht_for_each_entry(w->b->ht, &iter, it, node)
	{
		scan_visit_cb(w, it->data, it->klen, it->data + it->klen, it->vlen);
	}
	rcu_read_unlock();
}

/* SCAN: one pass; the entries visited must be exactly the keys expected. */
static void
phase_scan(worker *w)
{
	const bench *b = w->b;
	uint64_t expect;

	w->scan_started = false;
	w->scan_ordered = b->ht == NULL;
	if (b->ht != NULL) {
		scan_lfht(w);
		expect = b->cfg->keys;
	} else if (b->cfg->mode == KV_STORE_PERCORE) {
		scan_store_partition(w);
		expect = w->n;
	} else {
		scan_store_range(w);
		expect = w->hi - w->lo;
	}
	if (w->ops != expect)
		w->errors += w->ops > expect ? w->ops - expect : expect - w->ops;
}

/* Shuffles the worker's keys (Fisher-Yates) with a per-thread, per-phase seed,
 * so the store and the peer get the same permutations. */
static void
worker_shuffle(worker *w, int phase)
{
	uint64_t s = mix64(w->b->cfg->seed ^ ((uint64_t)w->t << 8 | (uint64_t)phase));
	size_t i;

	for (i = w->n; i > 1; i--) {
		size_t j = (size_t)(((rng_next(&s) >> 32) * (uint64_t)i) >> 32);
		uint32_t tmp = w->idx[i - 1];

		w->idx[i - 1] = w->idx[j];
		w->idx[j] = tmp;
	}
}

/* Runs the current phase on the calling thread: prepares, waits for the
 * others, runs timed. */
static void
worker_phase(worker *w)
{
	bench *b = w->b;
	int ph = b->phase;

	w->ops = 0;
	if (b->cfg->random && w->idx != NULL && ph != PH_SCAN)
		worker_shuffle(w, ph);
	if (b->ht != NULL) {
		rcu_register_thread();
		rcu_thread_offline(); /* do not hold up grace periods while waiting */
	}
	pthread_barrier_wait(&b->start);
	if (b->ht != NULL)
		rcu_thread_online();
	w->start_ns = kv_now_ns();
	switch (ph) {
	case PH_PUT:
	case PH_UPD:
		phase_write(w, ph);
		break;
	case PH_MIX:
		phase_mix(w);
		break;
	case PH_GET:
		phase_get(w);
		break;
	default:
		phase_scan(w);
		break;
	}
	if (b->ht != NULL)
		lf_flush(w); /* freeing what the phase replaced is part of its cost */
	w->end_ns = kv_now_ns();
	if (b->ht != NULL)
		rcu_unregister_thread();
}

static void
owner_task(kv_store *s, unsigned part, void *arg)
{
	(void)s;
	(void)part;
	worker_phase(arg);
}

static void
pin_self(const bench *b, unsigned t)
{
	cpu_set_t set;

	CPU_ZERO(&set);
	CPU_SET(b->cpus[t % b->ncpus], &set);
	(void)pthread_setaffinity_np(pthread_self(), sizeof(set), &set); /* best effort */
}

static void *
worker_main(void *arg)
{
	worker *w = arg;
	bench *b = w->b;
	int rv;

	if (b->store != NULL && b->cfg->mode == KV_STORE_PERCORE) {
		rv = kv_store_run_on(b->store, w->t, owner_task, w);
		if (rv != KV_OK) {
			/* The task never ran: release the others, then report. */
			w->fatal = rv;
			pthread_barrier_wait(&b->start);
		}
		return NULL;
	}
	if (b->cfg->pin)
		pin_self(b, w->t);
	worker_phase(w);
	return NULL;
}

/* Runs one phase on every worker and records its figures in r. */
static void
bench_run_phase(bench *b, int ph, bench_result *r)
{
	unsigned nt = b->cfg->threads, t;
	pthread_t *th = xcalloc(nt, sizeof(*th));
	uint64_t start = UINT64_MAX, end = 0, ops = 0;
	int rv;

	b->phase = ph;
	for (t = 0; t < nt; t++) {
		rv = pthread_create(&th[t], NULL, worker_main, &b->w[t]);
		if (rv != 0)
			die("pthread_create: %s", strerror(rv));
	}
	for (t = 0; t < nt; t++)
		pthread_join(th[t], NULL);
	free(th);
	for (t = 0; t < nt; t++) {
		const worker *w = &b->w[t];

		if (w->fatal != KV_OK) {
			r->fatal = w->fatal;
			continue;
		}
		start = w->start_ns < start ? w->start_ns : start;
		end = w->end_ns > end ? w->end_ns : end;
		ops += w->ops;
	}
	r->ops[ph] = ops;
	r->ns[ph] = end > start ? end - start : 1;
}

/* Returns the resident set size in bytes, or 0 when it cannot be read. */
static uint64_t
rss_bytes(void)
{
	unsigned long size = 0, resident = 0;
	FILE *f = fopen("/proc/self/statm", "r");

	if (f == NULL)
		return 0;
	if (fscanf(f, "%lu %lu", &size, &resident) != 2)
		resident = 0;
	fclose(f);
	return (uint64_t)resident * (uint64_t)sysconf(_SC_PAGESIZE);
}

static double
ops_per_sec(const bench_result *r, int ph)
{
	return (double)r->ops[ph] * 1e9 / (double)r->ns[ph];
}

/* Runs the selected phases, printing one line per phase as it completes and
 * the memory and error lines at the end, each prefixed with `prefix`. Memory
 * growth is counted from `rss_base`, or from just before PUT when it is 0. */
static void
bench_run_all(bench *b, bench_result *r, const char *prefix, uint64_t rss_base)
{
	const bench_cfg *cfg = b->cfg;
	uint64_t before = rss_base, after;
	unsigned t;
	int ph;

	for (ph = 0; ph < PH_COUNT && r->fatal == KV_OK; ph++) {
		if (!(cfg->phases & (1u << ph)))
			continue;
		if (ph == PH_PUT && before == 0)
			before = rss_bytes();
		bench_run_phase(b, ph, r);
		if (r->fatal != KV_OK)
			break;
		if (ph == PH_PUT) {
			after = rss_bytes();
			r->bytes_per_key =
			    after > before ? (double)(after - before) / (double)cfg->keys : 0.0;
			if (b->store != NULL) {
				kv_store_stats st;

				kv_store_get_stats(b->store, &st);
				r->mem_bytes_per_key = (double)st.mem_bytes / (double)cfg->keys;
				r->index_bytes_per_key = (double)st.index_bytes / (double)cfg->keys;
			}
		}
		printf("%s%s %.0f\n", prefix, phase_names[ph], ops_per_sec(r, ph));
		fflush(stdout);
	}
	for (t = 0; t < cfg->threads; t++)
		r->errors += b->w[t].errors;
	if (r->fatal != KV_OK) {
		fprintf(stderr, "shardkv-store-bench: %s%s: %s\n", prefix, phase_names[b->phase],
		        kv_strerror(r->fatal));
		return;
	}
	printf("%sbytes_per_key %.1f\n", prefix, r->bytes_per_key);
	if (b->store != NULL)
		printf("# store mem_bytes_per_key %.1f index_bytes_per_key %.1f partitions %u\n",
		       r->mem_bytes_per_key, r->index_bytes_per_key, r->partitions);
	printf("%serrors %" PRIu64 "\n", prefix, r->errors);
	fflush(stdout);
	r->done = true;
}

/* Finds the CPUs the process may run on, for pinning. */
static void
bench_find_cpus(bench *b)
{
	cpu_set_t set;
	int c, n = 0;

	b->cpus = xcalloc(CPU_SETSIZE, sizeof(*b->cpus));
	if (sched_getaffinity(0, sizeof(set), &set) == 0) {
		for (c = 0; c < CPU_SETSIZE; c++)
			if (CPU_ISSET(c, &set))
				b->cpus[n++] = c;
	}
	if (n == 0)
		b->cpus[n++] = 0;
	b->ncpus = (unsigned)n;
}

/*
 * Sets up a run against `store` or `ht`. `parts` gives the key placement in
 * percore mode (the store itself, or a store created only for that). Every
 * allocation the phases need is made here, before anything is measured.
 */
static void
bench_init(bench *b, const bench_cfg *cfg, kv_store *store, bool peer, kv_store *parts)
{
	unsigned nt = cfg->threads, t;
	size_t kcap = (cfg->key_size > 8 ? cfg->key_size : 8) + 8;
	size_t vcap = (cfg->value_size > 8 ? cfg->value_size : 8) + 8;
	uint64_t k, N = cfg->keys;
	size_t i;

	memset(b, 0, sizeof(*b));
	b->cfg = cfg;
	b->store = store;
	b->ran_upd = cfg->phases & (1u << PH_UPD);
	b->ran_mix = cfg->phases & (1u << PH_MIX);
	b->value_seed = mix64(cfg->seed ^ UINT64_C(0x76616c7565)); /* "value" */
	b->mix_seed = mix64(cfg->seed ^ UINT64_C(0x6d6978));       /* "mix" */
	bench_find_cpus(b);
	if (pthread_barrier_init(&b->start, NULL, nt) != 0)
		die("pthread_barrier_init failed");
	b->w = xalloc_lines(nt * sizeof(*b->w));
	for (t = 0; t < nt; t++) {
		worker *w = &b->w[t];

		w->b = b;
		w->t = t;
		w->kbuf = xalloc_lines(kcap);
		w->pbuf = xalloc_lines(kcap * KV_STORE_PREFETCH_GROUP);
		w->vbuf = xalloc_lines(vcap);
		w->ebuf = xalloc_lines(vcap);
		for (i = 8; i < vcap; i++)
			w->vbuf[i] = w->ebuf[i] = (uint8_t)(i * 131 + 7);
		if (peer)
			w->retired = xalloc_lines(RETIRE_BATCH * sizeof(*w->retired));
		/* The get buffer too: kv_buf_fini frees it, and it never grows. */
		w->got.cap = (vcap + 63) / 64 * 64;
		w->got.data = xalloc_lines(w->got.cap);
	}

	if (cfg->mode == KV_STORE_PERCORE) {
		/* Two passes over the keys (count, then place) instead of a
		 * temporary array of N partition numbers. */
		size_t *fill = xcalloc(nt, sizeof(*fill));
		uint8_t *kb = b->w[0].kbuf;

		for (k = 0; k < N; k++) {
			unsigned p;

			key_encode(kb, cfg->key_size, k);
			p = kv_store_partition_of(parts, kb, cfg->key_size);
			if (p >= nt)
				die("key %" PRIu64 " maps to partition %u of %u", k, p, nt);
			b->w[p].n++;
		}
		b->idx_all = xcalloc(N, sizeof(*b->idx_all));
		for (t = 0, i = 0; t < nt; t++) {
			b->w[t].idx = b->idx_all + i;
			i += b->w[t].n;
		}
		for (k = 0; k < N; k++) {
			unsigned p;

			key_encode(kb, cfg->key_size, k);
			p = kv_store_partition_of(parts, kb, cfg->key_size);
			b->w[p].idx[fill[p]++] = (uint32_t)k;
		}
		memset(kb, 0, kcap);
		free(fill);
	} else {
		if (cfg->random)
			b->idx_all = xcalloc(N, sizeof(*b->idx_all));
		for (t = 0; t < nt; t++) {
			worker *w = &b->w[t];

			w->lo = N * t / nt;
			w->hi = N * (t + 1) / nt;
			w->n = w->hi - w->lo;
			if (cfg->random) {
				w->idx = b->idx_all + w->lo;
				for (i = 0; i < w->n; i++)
					w->idx[i] = (uint32_t)(w->lo + i);
			}
		}
	}
}

static void
bench_fini(bench *b)
{
	unsigned t;

	for (t = 0; t < b->cfg->threads; t++) {
		worker *w = &b->w[t];

		free(w->kbuf);
		free(w->pbuf);
		free(w->vbuf);
		free(w->ebuf);
		free(w->retired);
		kv_buf_fini(&w->got);
	}
	free(b->w);
	free(b->idx_all);
	free(b->cpus);
	pthread_barrier_destroy(&b->start);
}

static void
store_opts_from_cfg(const bench_cfg *cfg, kv_store_opts *o, bool pin)
{
	kv_store_opts_init(o);
	o->mode = cfg->mode;
	o->partitions = cfg->mode == KV_STORE_PERCORE ? cfg->threads : cfg->partitions;
	if (cfg->key_size > KV_DEFAULT_MAX_KEY)
		o->max_key = cfg->key_size;
	if (cfg->value_size > KV_DEFAULT_MAX_VALUE)
		o->max_value = cfg->value_size;
	o->pin_threads = pin && cfg->mode == KV_STORE_PERCORE;
}

/* Expired keys found by one sample (the server's active expiry does the
 * same through its write path: shardserver/expire.c). */
typedef struct {
	kv_buf keys; /* u32 klen, key, ... */
} reclaim_acc;

static void
reclaim_cb(void *arg, const uint8_t *key, size_t klen, bool expired)
{
	reclaim_acc *a = arg;
	uint32_t kl = (uint32_t)klen;
	(void)expired;
	if (kv_buf_append(&a->keys, &kl, sizeof(kl)) != KV_OK ||
	    kv_buf_append(&a->keys, key, klen) != KV_OK)
		die("out of memory sampling expired keys");
}

/*
 * --reclaim: once every key has expired, removes them all as active expiry
 * does, one thread, partition by partition: samples of 20 keys with a
 * deadline (kv_store_expire_sample, one partition lock each), then one
 * KV_UPD_RECLAIM per expired key. Prints RECLAIM keys_per_sec (store work
 * only: the server adds a log record and a replication tap per key).
 */
static void
measure_reclaim(kv_store *s, uint64_t at, uint64_t nkeys)
{
	reclaim_acc a = {{0}};
	uint64_t t0, t1, done = 0;
	struct timespec ts;

	while (kv_store_now_ms(s) <= at) {
		ts = (struct timespec){0, 1000000L};
		nanosleep(&ts, NULL);
	}
	clock_gettime(CLOCK_MONOTONIC, &ts);
	t0 = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	for (unsigned p = 0; p < kv_store_partitions(s); p++) {
		for (;;) {
			size_t seen = 0;
			a.keys.len = 0;
			if (kv_store_expire_sample(s, p, 20, reclaim_cb, &a, &seen) != KV_OK)
				die("kv_store_expire_sample failed");
			if (seen == 0)
				break;
			for (size_t off = 0; off < a.keys.len;) {
				uint32_t kl;
				kv_store_upd u = {.kind = KV_UPD_RECLAIM};
				memcpy(&kl, a.keys.data + off, sizeof(kl));
				if (kv_store_update(s, a.keys.data + off + sizeof(kl), kl, &u) ==
				    KV_OK)
					done++;
				off += sizeof(kl) + kl;
			}
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &ts);
	t1 = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
	if (done != nkeys)
		die("reclaimed %" PRIu64 " of %" PRIu64 " keys", done, nkeys);
	printf("RECLAIM %.0f\n", (double)done * 1e9 / (double)(t1 > t0 ? t1 - t0 : 1));
	kv_buf_fini(&a.keys);
}

/* Runs the phases against the store. */
static void
run_store(const bench_cfg *cfg, bench_result *r)
{
	kv_store_opts o;
	kv_store *s;
	bench b;
	int rv;

	store_opts_from_cfg(cfg, &o, cfg->pin);
	rv = kv_store_create(&o, &s);
	if (rv != KV_OK) {
		fprintf(stderr, "shardkv-store-bench: kv_store_create: %s\n", kv_strerror(rv));
		r->fatal = rv;
		return;
	}
	r->partitions = kv_store_partitions(s);
	if (cfg->mode == KV_STORE_PERCORE && r->partitions != cfg->threads)
		die("the store made %u partitions for %u threads", r->partitions, cfg->threads);
	bench_init(&b, cfg, s, false, s);
	if (cfg->ttl_ms != 0)
		b.ttl_at = kv_store_now_ms(s) + cfg->ttl_ms;
	bench_run_all(&b, r, "", 0);
	if (cfg->reclaim)
		measure_reclaim(s, b.ttl_at, cfg->keys);
	bench_fini(&b);
	kv_store_destroy(s);
}

/* Returns the initial bucket count of the peer's table: --lfht-buckets, else
 * the power of two at or above N (a presized table: its best case). */
static unsigned long
lfht_init_buckets(const bench_cfg *cfg)
{
	unsigned long n = 1;

	if (cfg->lfht_buckets != 0)
		return cfg->lfht_buckets;
	while (n < cfg->keys)
		n <<= 1;
	return n;
}

/* Runs the phases against cds_lfht. Meant for a child process: the table is
 * not torn down, the process exits instead. Memory is counted from before the
 * table is created, so a presized bucket array counts. */
static void
run_lfht(const bench_cfg *cfg, bench_result *r)
{
	unsigned long init = lfht_init_buckets(cfg), max_buckets = 1;
	kv_store *parts = NULL;
	uint64_t rss_base;
	kv_store_opts o;
	bench b;
	int rv;

	if (cfg->mode == KV_STORE_PERCORE) {
		/* The same key sets as the store's: ask an empty store. */
		store_opts_from_cfg(cfg, &o, false);
		rv = kv_store_create(&o, &parts);
		if (rv != KV_OK) {
			fprintf(stderr, "shardkv-store-bench: kv_store_create: %s\n",
			        kv_strerror(rv));
			r->fatal = rv;
			return;
		}
	}
	bench_init(&b, cfg, NULL, true, parts);
	kv_store_destroy(parts);
	malloc_trim(0); /* give back what the placement store used */
	rss_base = rss_bytes();
	/* A bounded maximum selects liburcu's mmap bucket allocator, its fastest;
	 * the table may still grow to twice what N needs. */
	while (max_buckets < 2 * cfg->keys && max_buckets < (1ul << 32))
		max_buckets <<= 1;
	if (max_buckets < init)
		max_buckets = init;
	b.ht = cds_lfht_new(init, 1, max_buckets, CDS_LFHT_AUTO_RESIZE | CDS_LFHT_ACCOUNTING, NULL);
	if (b.ht == NULL)
		die("cds_lfht_new failed");
	bench_run_all(&b, r, "lfht ", rss_base);
}

static bool
write_all(int fd, const void *p, size_t n)
{
	const uint8_t *q = p;

	while (n > 0) {
		ssize_t k = write(fd, q, n);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return false;
		q += k;
		n -= (size_t)k;
	}
	return true;
}

static size_t
read_all(int fd, void *p, size_t n)
{
	uint8_t *q = p;
	size_t got = 0;

	while (got < n) {
		ssize_t k = read(fd, q + got, n - got);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		got += (size_t)k;
	}
	return got;
}

/* Runs fn in a forked child and collects its result. */
static void
run_in_child(void (*fn)(const bench_cfg *, bench_result *), const bench_cfg *cfg, bench_result *r)
{
	int fds[2], status = 0;
	pid_t pid;

	memset(r, 0, sizeof(*r));
	fflush(stdout);
	fflush(stderr);
	if (pipe(fds) != 0)
		die("pipe: %s", strerror(errno));
	pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		close(fds[0]);
		fn(cfg, r);
		fflush(stdout);
		_exit(write_all(fds[1], r, sizeof(*r)) ? 0 : 1);
	}
	close(fds[1]);
	if (read_all(fds[0], r, sizeof(*r)) != sizeof(*r)) {
		memset(r, 0, sizeof(*r));
		r->fatal = KV_EINTERNAL;
	}
	close(fds[0]);
	if (waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "shardkv-store-bench: a benchmark child failed (status %d)\n",
		        status);
		r->fatal = KV_EINTERNAL;
	}
}

/*
 * Command line.
 */

static void
usage(FILE *f)
{
	fputs("usage: shardkv-store-bench [options]\n"
	      "Measures the local store (shardserver/store.h) phase by phase: PUT, UPD,\n"
	      "MIX (98% get, 2% delete+put), GET, SCAN; keys 0..N-1 as B-byte big-endian\n"
	      "integers, each thread on its own keys.\n"
	      "\n"
	      "  --keys N            number of keys; suffixes K, M, G (x1000) (default 1M)\n"
	      "  --threads T         worker threads (default: CPUs; percore: a power of two)\n"
	      "  --mode M            striped | percore (default striped)\n"
	      "                      striped: thread t owns keys [t*N/T, (t+1)*N/T)\n"
	      "                      percore: T partitions, thread t runs on partition t's\n"
	      "                      owner thread and owns that partition's keys\n"
	      "  --key-size B        key bytes, 1..65536 (default 4)\n"
	      "  --value-size B      value bytes, 0..67108864 (default 4)\n"
	      "  --order O           seq | random: key order, or a fresh permutation per\n"
	      "                      phase (default seq)\n"
	      "  --partitions P      striped: store partitions (default: the store's)\n"
	      "  --phases LIST       comma-separated subset of put,upd,mix,get,scan; always\n"
	      "                      run in that order; put is required (default: all)\n"
	      "  --seed S            seed of permutations, MIX choices, values (default 1)\n"
	      "  --peer lfht         also run the phases on liburcu's cds_lfht and print\n"
	      "                      store/lfht ratios\n"
	      "  --lfht-buckets N    lfht: initial buckets, a power of two (default: the\n"
	      "                      one at or above N; the table also resizes itself)\n"
	      "  --ttl-ms MS         every store write carries an expiry MS ms ahead (keys\n"
	      "                      stay live: choose MS longer than the run); measures\n"
	      "                      the cost of keys with a deadline (default: none)\n"
	      "  --reclaim           with --ttl-ms, after the phases wait until every key\n"
	      "                      has expired and print 'RECLAIM keys_per_sec': one\n"
	      "                      thread removing them as active expiry does (sample,\n"
	      "                      then remove); use --phases put, a short --ttl-ms\n"
	      "  --prefetch          PUT, UPD and GET warm each group of 16 keys at once\n"
	      "                      (kv_store_prefetch), as the server does for a request\n"
	      "  --no-pin            do not pin worker threads to CPUs\n"
	      "  --json              also print one JSON object with every figure\n"
	      "  --help              print this text\n"
	      "\n"
	      "Output: a '#' line with the parameters, then per phase 'PHASE ops_per_sec',\n"
	      "then 'bytes_per_key X' (RSS growth over PUT / N) and 'errors N'; the peer's\n"
	      "lines are prefixed 'lfht ' and followed by 'RATIO PHASE store/lfht X.XX'.\n"
	      "Exit status: 0 ok, 1 wrong results or failure, 2 usage error.\n",
	      f);
}

/* Prints a one-line reason and exits 2. */
static void usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));

static void
usage_error(const char *fmt, ...)
{
	va_list ap;

	fputs("shardkv-store-bench: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputs(" (see --help)\n", stderr);
	exit(2);
}

/* Parses a decimal number with an optional K/M/G (x1000) suffix when `suffix`. */
static uint64_t
parse_u64(const char *flag, const char *s, bool suffix, uint64_t min, uint64_t max)
{
	uint64_t v, mult = 1;
	char *end;

	if (*s < '0' || *s > '9')
		usage_error("%s: expected a number, got '%s'", flag, s);
	errno = 0;
	v = strtoull(s, &end, 10);
	if (suffix && *end != '\0' && end[1] == '\0') {
		switch (*end) {
		case 'k':
		case 'K':
			mult = UINT64_C(1000);
			end++;
			break;
		case 'm':
		case 'M':
			mult = UINT64_C(1000000);
			end++;
			break;
		case 'g':
		case 'G':
			mult = UINT64_C(1000000000);
			end++;
			break;
		default:
			break;
		}
	}
	if (errno != 0 || *end != '\0')
		usage_error("%s: expected a number, got '%s'", flag, s);
	if (v > UINT64_MAX / mult || v * mult < min || v * mult > max)
		usage_error("%s: %s is out of range %" PRIu64 "..%" PRIu64, flag, s, min, max);
	return v * mult;
}

static unsigned
parse_phases(const char *s)
{
	unsigned set = 0;
	const char *p = s;

	while (*p != '\0') {
		size_t len = strcspn(p, ",");
		int ph;

		for (ph = 0; ph < PH_COUNT; ph++)
			if (strlen(phase_flags[ph]) == len && strncmp(p, phase_flags[ph], len) == 0)
				break;
		if (ph == PH_COUNT)
			usage_error("--phases: unknown phase '%.*s'", (int)len, p);
		set |= 1u << ph;
		p += len;
		if (*p == ',')
			p++;
	}
	if (!(set & (1u << PH_PUT)))
		usage_error("--phases: '%s' lacks put, which every other phase needs", s);
	return set;
}

static bool
is_pow2(uint64_t v)
{
	return v != 0 && (v & (v - 1)) == 0;
}

/* Returns whether `name` is an option that takes a value. */
static bool
takes_value(const char *name)
{
	static const char *const names[] = {
	    "--keys", "--threads",    "--mode",   "--key-size", "--value-size",   "--order",
	    "--peer", "--partitions", "--phases", "--seed",     "--lfht-buckets", "--ttl-ms",
	};
	size_t i;

	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(name, names[i]) == 0)
			return true;
	return false;
}

static void
parse_args(int argc, char **argv, bench_cfg *cfg)
{
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	bool threads_set = false;
	int i;

	memset(cfg, 0, sizeof(*cfg));
	cfg->keys = 1000000;
	cfg->mode = KV_STORE_STRIPED;
	cfg->key_size = 4;
	cfg->value_size = 4;
	cfg->phases = (1u << PH_COUNT) - 1;
	cfg->seed = 1;
	cfg->pin = true;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *v = NULL, *eq;
		char name[32];

		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			usage(stdout);
			exit(0);
		}
		if (strncmp(a, "--", 2) != 0)
			usage_error("unexpected argument '%s'", a);
		eq = strchr(a, '=');
		if (eq != NULL) {
			if ((size_t)(eq - a) >= sizeof(name))
				usage_error("unknown option '%s'", a);
			memcpy(name, a, (size_t)(eq - a));
			name[eq - a] = '\0';
			v = eq + 1;
		} else {
			snprintf(name, sizeof(name), "%s", a);
		}
		if (strcmp(name, "--json") == 0 || strcmp(name, "--no-pin") == 0 ||
		    strcmp(name, "--reclaim") == 0 || strcmp(name, "--prefetch") == 0) {
			if (v != NULL)
				usage_error("%s takes no value", name);
			if (strcmp(name, "--json") == 0)
				cfg->json = true;
			else if (strcmp(name, "--reclaim") == 0)
				cfg->reclaim = true;
			else if (strcmp(name, "--prefetch") == 0)
				cfg->prefetch = true;
			else
				cfg->pin = false;
			continue;
		}
		if (!takes_value(name))
			usage_error("unknown option '%s'", name);
		if (v == NULL) {
			if (i + 1 >= argc)
				usage_error("%s needs a value", a);
			v = argv[++i];
		}
		if (strcmp(name, "--keys") == 0) {
			cfg->keys = parse_u64(name, v, true, 1, MAX_KEYS);
		} else if (strcmp(name, "--threads") == 0) {
			cfg->threads = (unsigned)parse_u64(name, v, false, 1, MAX_THREADS);
			threads_set = true;
		} else if (strcmp(name, "--mode") == 0) {
			if (strcmp(v, "striped") == 0)
				cfg->mode = KV_STORE_STRIPED;
			else if (strcmp(v, "percore") == 0)
				cfg->mode = KV_STORE_PERCORE;
			else
				usage_error("--mode: expected striped or percore, got '%s'", v);
		} else if (strcmp(name, "--key-size") == 0) {
			cfg->key_size = parse_u64(name, v, false, 1, KV_HARD_MAX_KEY);
		} else if (strcmp(name, "--value-size") == 0) {
			cfg->value_size = parse_u64(name, v, false, 0, KV_HARD_MAX_VALUE);
		} else if (strcmp(name, "--order") == 0) {
			if (strcmp(v, "seq") == 0)
				cfg->random = false;
			else if (strcmp(v, "random") == 0)
				cfg->random = true;
			else
				usage_error("--order: expected seq or random, got '%s'", v);
		} else if (strcmp(name, "--peer") == 0) {
			if (strcmp(v, "lfht") != 0)
				usage_error("--peer: the only peer is lfht, got '%s'", v);
			cfg->peer = true;
		} else if (strcmp(name, "--ttl-ms") == 0) {
			cfg->ttl_ms = parse_u64(name, v, false, 1, UINT64_C(1) << 40);
		} else if (strcmp(name, "--partitions") == 0) {
			cfg->partitions = (unsigned)parse_u64(name, v, false, 1, MAX_THREADS);
		} else if (strcmp(name, "--phases") == 0) {
			cfg->phases = parse_phases(v);
		} else if (strcmp(name, "--seed") == 0) {
			cfg->seed = parse_u64(name, v, false, 0, UINT64_MAX);
		} else if (strcmp(name, "--lfht-buckets") == 0) {
			cfg->lfht_buckets =
			    (unsigned long)parse_u64(name, v, true, 1, UINT64_C(1) << 32);
			if (!is_pow2(cfg->lfht_buckets))
				usage_error("--lfht-buckets: %s is not a power of two", v);
		} else {
			usage_error("unknown option '%s'", name);
		}
	}

	if (!threads_set) {
		cfg->threads = ncpu > 0 ? (unsigned)ncpu : 1;
		if (cfg->threads > MAX_THREADS)
			cfg->threads = MAX_THREADS;
		if (cfg->mode == KV_STORE_PERCORE)
			while (!is_pow2(cfg->threads))
				cfg->threads &= cfg->threads - 1;
	}
	if (cfg->mode == KV_STORE_PERCORE) {
		if (!is_pow2(cfg->threads))
			usage_error("--threads: percore needs a power of two (one partition per "
			            "thread), got %u",
			            cfg->threads);
		if (cfg->partitions != 0 && cfg->partitions != cfg->threads)
			usage_error("--partitions: percore uses one partition per thread (%u)",
			            cfg->threads);
	}
	if (cfg->reclaim && (cfg->ttl_ms == 0 || cfg->phases != (1u << PH_PUT) || cfg->peer))
		usage_error("--reclaim needs --ttl-ms, --phases put and no --peer (every key "
		            "must be written once and then expire)");
	if (cfg->key_size < 8 && cfg->keys > (UINT64_C(1) << (8 * cfg->key_size)))
		usage_error("--keys: %" PRIu64 " keys do not fit in %zu-byte keys", cfg->keys,
		            cfg->key_size);
}

static void
phase_list(const bench_cfg *cfg, char *buf, size_t cap)
{
	size_t len = 0;
	int ph;

	buf[0] = '\0';
	for (ph = 0; ph < PH_COUNT; ph++)
		if (cfg->phases & (1u << ph))
			len += (size_t)snprintf(buf + len, cap - len, "%s%s", len ? "," : "",
			                        phase_flags[ph]);
}

static void
print_header(const bench_cfg *cfg)
{
	char phases[64];
	char parts[16];

	phase_list(cfg, phases, sizeof(phases));
	if (cfg->mode == KV_STORE_PERCORE)
		snprintf(parts, sizeof(parts), "%u", cfg->threads);
	else if (cfg->partitions != 0)
		snprintf(parts, sizeof(parts), "%u", cfg->partitions);
	else
		snprintf(parts, sizeof(parts), "default");
	printf("# shardkv-store-bench keys=%" PRIu64 " threads=%u mode=%s partitions=%s "
	       "key_size=%zu value_size=%zu order=%s phases=%s seed=%" PRIu64
	       " peer=%s pin=%s cpus=%ld ttl_ms=%" PRIu64 "\n",
	       cfg->keys, cfg->threads, cfg->mode == KV_STORE_PERCORE ? "percore" : "striped",
	       parts, cfg->key_size, cfg->value_size, cfg->random ? "random" : "seq", phases,
	       cfg->seed, cfg->peer ? "lfht" : "none", cfg->pin ? "yes" : "no",
	       sysconf(_SC_NPROCESSORS_ONLN), cfg->ttl_ms);
	if (cfg->peer)
		printf(
		    "# lfht: cds_lfht (liburcu-qsbr), kv_hash64, %lu initial buckets, auto-resize; "
		    "SCAN is unordered: every thread traverses the whole table (T*N ops); "
		    "store and lfht each run in a fresh child process\n",
		    lfht_init_buckets(cfg));
	fflush(stdout);
}

static void
print_json_result(const char *name, const bench_result *r)
{
	const char *sep = "";
	int ph;

	printf(", \"%s\": {\"phases\": {", name);
	for (ph = 0; ph < PH_COUNT; ph++) {
		if (r->ops[ph] == 0 && r->ns[ph] == 0)
			continue;
		printf("%s\"%s\": {\"ops\": %" PRIu64 ", \"seconds\": %.6f, \"ops_per_sec\": %.0f}",
		       sep, phase_names[ph], r->ops[ph], (double)r->ns[ph] / 1e9,
		       ops_per_sec(r, ph));
		sep = ", ";
	}
	printf("}, \"bytes_per_key\": %.2f, \"errors\": %" PRIu64 ", \"ok\": %s", r->bytes_per_key,
	       r->errors, r->done && r->fatal == KV_OK ? "true" : "false");
	if (r->partitions != 0)
		printf(", \"partitions\": %u, \"mem_bytes_per_key\": %.2f, "
		       "\"index_bytes_per_key\": %.2f",
		       r->partitions, r->mem_bytes_per_key, r->index_bytes_per_key);
	printf("}");
}

static void
print_json(const bench_cfg *cfg, const bench_result *st, const bench_result *lf)
{
	char phases[64];
	const char *sep = "";
	int ph;

	phase_list(cfg, phases, sizeof(phases));
	printf("{\"params\": {\"keys\": %" PRIu64 ", \"threads\": %u, \"mode\": \"%s\", "
	       "\"partitions\": %u, \"key_size\": %zu, \"value_size\": %zu, \"order\": \"%s\", "
	       "\"phases\": \"%s\", \"seed\": %" PRIu64 ", \"peer\": %s, \"pin\": %s, "
	       "\"cpus\": %ld}",
	       cfg->keys, cfg->threads, cfg->mode == KV_STORE_PERCORE ? "percore" : "striped",
	       st->partitions, cfg->key_size, cfg->value_size, cfg->random ? "random" : "seq",
	       phases, cfg->seed, cfg->peer ? "\"lfht\"" : "null", cfg->pin ? "true" : "false",
	       sysconf(_SC_NPROCESSORS_ONLN));
	print_json_result("store", st);
	if (lf != NULL) {
		print_json_result("lfht", lf);
		printf(", \"ratio\": {");
		for (ph = 0; ph < PH_COUNT; ph++) {
			if (st->ops[ph] == 0 || lf->ops[ph] == 0)
				continue;
			printf("%s\"%s\": %.3f", sep, phase_names[ph],
			       ops_per_sec(st, ph) / ops_per_sec(lf, ph));
			sep = ", ";
		}
		printf("}");
	}
	printf("}\n");
}

int
main(int argc, char **argv)
{
	bench_cfg cfg;
	bench_result st, lf;
	bool ok;
	int ph;

	parse_args(argc, argv, &cfg);
	print_header(&cfg);
	memset(&st, 0, sizeof(st));
	memset(&lf, 0, sizeof(lf));
	if (!cfg.peer) {
		run_store(&cfg, &st);
	} else {
		run_in_child(run_store, &cfg, &st);
		run_in_child(run_lfht, &cfg, &lf);
		for (ph = 0; ph < PH_COUNT; ph++) {
			if (st.ops[ph] == 0 || lf.ops[ph] == 0)
				continue;
			printf("RATIO %s store/lfht %.2f\n", phase_names[ph],
			       ops_per_sec(&st, ph) / ops_per_sec(&lf, ph));
		}
	}
	if (cfg.json)
		print_json(&cfg, &st, cfg.peer ? &lf : NULL);
	fflush(stdout);
	ok = st.done && st.fatal == KV_OK && st.errors == 0;
	if (cfg.peer)
		ok = ok && lf.done && lf.fatal == KV_OK && lf.errors == 0;
	return ok ? 0 : 1;
}
