/*
 * store.h - the local in-memory key-value store of a shard server.
 *
 * Keys are byte strings of 1..max_key bytes, values 0..max_value bytes, with
 * the semantics of doc/contract.md §3. The store is split into partitions; a key's
 * partition is a hash of the key without its last byte, so keys that differ
 * only in their last byte share a partition (and a leaf node of its index).
 * Each partition is an ordered index (an adaptive radix tree) over items kept
 * in the partition's own slab arena.
 *
 * Two concurrency modes, chosen at creation:
 *
 *  - KV_STORE_STRIPED: any thread may call any operation. Every partition has
 *    its own mutex. Multi-key operations lock the partitions they touch in
 *    ascending partition order, which makes mget/mput atomic with respect to
 *    each other without a global lock.
 *  - KV_STORE_PERCORE: the store starts one owner thread per partition. A
 *    partition is touched only by its owner, without locks. Operations called
 *    from other threads are handed to the owners and waited for; multi-key
 *    operations park every owner they touch (in ascending order) for the
 *    duration, which gives the same atomicity. Code running on an owner thread
 *    (see kv_store_run_on) may call the single-key and range operations for
 *    keys of its own partition directly; anything else it calls returns
 *    KV_EPERM.
 *
 * Thread model and lock order: doc/threads.md.
 *
 * Returned values are copied into caller-owned kv_buf buffers, so no pointer
 * into the store ever escapes a lock.
 *
 * This is the one public header of kv_store (shardserver/store/): any
 * component may include it. art.h and arena.h are internal to that folder.
 */
#ifndef KV_SHARDSERVER_STORE_STORE_H
#define KV_SHARDSERVER_STORE_STORE_H

#include "common/key.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kv_store kv_store;

/* The clock of expiry: Unix time in ms (kv_store_opts.clock). */
typedef uint64_t (*kv_store_clock_fn)(void *arg);

typedef enum {
	KV_STORE_STRIPED = 0, /* partitions with their own locks */
	KV_STORE_PERCORE = 1, /* one owner thread per partition, no locks */
} kv_store_mode;

typedef struct {
	kv_store_mode mode;  /* concurrency mode */
	unsigned partitions; /* 0: striped max(16, 4/CPU), percore 1/CPU; power of 2, max 4096 */
	size_t max_key;      /* 0: KV_DEFAULT_MAX_KEY; at most KV_HARD_MAX_KEY */
	size_t max_value;    /* 0: KV_DEFAULT_MAX_VALUE; at most KV_HARD_MAX_VALUE */
	size_t mem_limit; /* 0: none; else allocations past this many bytes fail with KV_ENOMEM */
	bool pin_threads; /* percore: pin owner thread i to CPU i % ncpu */
	kv_store_clock_fn clock; /* expiry clock, Unix ms; NULL: CLOCK_REALTIME */
	void *clock_arg;         /* its argument */
} kv_store_opts;

/* Fills `o` with the defaults (striped, default partitions and limits). */
void kv_store_opts_init(kv_store_opts *o);

/*
 * Creates a store. `opts` may be NULL for the defaults. In percore mode the
 * owner threads are running when this returns. The caller destroys the result
 * with kv_store_destroy(). Returns 0, KV_EINVAL (bad option) or KV_ENOMEM.
 */
int kv_store_create(const kv_store_opts *opts, kv_store **out);

/* Stops the owner threads (percore) and frees everything. Accepts NULL. No
 * other call may be in progress. */
void kv_store_destroy(kv_store *s);

/* Returns the number of partitions. */
unsigned kv_store_partitions(const kv_store *s);

/* Returns the partition that holds `key`. */
unsigned kv_store_partition_of(const kv_store *s, const void *key, size_t klen);

/* Returns the configured mode. */
kv_store_mode kv_store_get_mode(const kv_store *s);

/*
 * Expiry. A key may carry an absolute deadline (Unix ms, the store's clock).
 * Once the clock reaches it the key reads as absent everywhere (get, mget,
 * scan, count, kv_store_update) although it stays in memory until removed
 * (kv_store_update KV_UPD_RECLAIM, a delete, a range delete). Deadlines live
 * in a second index per partition, so a key without one costs nothing.
 * kv_store_range_step_x, which migrations, snapshots and catch-up copies use,
 * visits expired keys too, with their deadline: those copies are blind.
 */

/* The store's clock now, Unix ms. */
uint64_t kv_store_now_ms(kv_store *s);

/*
 * Single-key operations. Keys must be 1..max_key bytes and values at most
 * max_value bytes, else KV_EINVAL (NULL or empty key) or KV_ETOOBIG.
 */

/*
 * Brings the index paths of up to n keys into the CPU cache, many keys at
 * a time, before a batch of single-key operations on them: their cache
 * misses overlap instead of following each other. Changes nothing and
 * never waits (a partition in use is skipped); striped stores only, others
 * return at once. Invalid keys are ignored. Keys are taken
 * KV_STORE_PREFETCH_GROUP at a time: a caller warming a long batch does
 * best to warm each group just before it uses it.
 */
#define KV_STORE_PREFETCH_GROUP 16u
void kv_store_prefetch(kv_store *s, size_t n, const kv_bytes *keys);

/* Copies the value of `key` into `val` (replacing its contents). Returns 0 or
 * KV_ENOTFOUND (nothing is allocated or changed then). */
int kv_store_get(kv_store *s, const void *key, size_t klen, kv_buf *val);

/* Inserts or overwrites. Copies key and value. Returns 0 or KV_ENOMEM (the
 * old value, if any, is kept then). */
int kv_store_put(kv_store *s, const void *key, size_t klen, const void *val, size_t vlen);

/* Like kv_store_get; also copies the key's deadline (0: none) into *expire_at
 * (may be NULL). val may be NULL (only whether the key is live) when
 * expire_at is not. */
int kv_store_get_x(kv_store *s, const void *key, size_t klen, kv_buf *val, uint64_t *expire_at);

/* Inserts or overwrites with the deadline expire_at (0: none; an old one is
 * cleared). A blind write: for log replay, transfers and replication. Returns
 * 0 or KV_ENOMEM (nothing changed). kv_store_put is this with 0. */
int kv_store_put_x(kv_store *s, const void *key, size_t klen, const void *val, size_t vlen,
                   uint64_t expire_at);

/* Removes `key` and copies the removed value into `old` (may be NULL), even
 * when the key has expired (a blind delete, for replay), but returns
 * KV_ENOTFOUND then as for an absent key. Returns 0 or KV_ENOTFOUND. */
int kv_store_del(kv_store *s, const void *key, size_t klen, kv_buf *old);

/* Appends `val` to the value of `key`, creating it with `val` when absent.
 * Copies the new length into `*newlen` (may be NULL). Returns 0, KV_ETOOBIG
 * when the result would exceed max_value (nothing changes), or KV_ENOMEM. */
int kv_store_append(kv_store *s, const void *key, size_t klen, const void *val, size_t vlen,
                    size_t *newlen);

/* Read-modify-write of one key, atomic under its partition (kv_store_update). */
typedef enum {
	KV_UPD_PUT = 1, /* value, expire_at (0 clears); cond NONE, IF_ABSENT, IF_EQUAL */
	KV_UPD_DEL,     /* cond NONE or IF_EQUAL; cur gets the deleted value */
	KV_UPD_APPEND,  /* value; absent: created with it; the deadline is kept */
	KV_UPD_INCR,    /* delta on a decimal int64 (absent: 0); the deadline is kept */
	KV_UPD_EXPIRE,  /* expire_at (0: persist); KV_ENOTFOUND when absent */
	KV_UPD_RECLAIM, /* remove the key if it has expired; else KV_ENOTFOUND */
} kv_upd_kind;

typedef enum {
	KV_UPD_ANY = 0,       /* unconditional */
	KV_UPD_IF_ABSENT = 1, /* put: KV_EEXISTS when the key is present */
	KV_UPD_IF_EQUAL = 2,  /* put, del: KV_EMISMATCH unless the key holds expect */
} kv_upd_cond;

typedef struct {
	kv_upd_kind kind;   /* what to do */
	kv_upd_cond cond;   /* the condition */
	kv_bytes expect;    /* IF_EQUAL: the value the key must hold */
	kv_bytes value;     /* put, append */
	int64_t delta;      /* incr */
	uint64_t expire_at; /* put, expire: the deadline, Unix ms; 0: none */
	kv_buf *cur;        /* may be NULL. Out: del: the deleted value; a failed
	                       condition: the current value (unless cur_absent);
	                       append, incr, expire: the key's value afterwards */
	bool cur_absent;    /* out: a failed condition found the key absent */
	int64_t number;     /* out: incr: the new value */
	size_t newlen;      /* out: put, append, incr: the value's length afterwards */
	uint64_t new_at;    /* out: the key's deadline afterwards (0: none) */
	const char *why;    /* out: static detail of KV_EINVAL */
} kv_store_upd;

/*
 * Applies u to key atomically (one partition held); expired keys are absent.
 * Returns 0, KV_ENOTFOUND (del, expire of an absent key; reclaim of a key
 * that has not expired), KV_EEXISTS, KV_EMISMATCH (condition failed, nothing
 * written), KV_EINVAL (incr of a value that is not a decimal int64, or
 * overflow; u->why says which), KV_ETOOBIG or KV_ENOMEM (nothing written).
 */
int kv_store_update(kv_store *s, const void *key, size_t klen, kv_store_upd *u);

/* Parses a whole value as a decimal signed 64-bit integer: optional '-',
 * then 1..19 digits, nothing else, in range. Returns 0 or KV_EINVAL. */
int kv_store_parse_i64(const void *p, size_t n, int64_t *out);

/*
 * Multi-key operations, atomic with respect to each other.
 */

/* Reads n keys. On 0, vals[i] holds the value of keys[i]. When any key is
 * missing returns KV_ENOTFOUND, sets missing[i] (when `missing` is not NULL)
 * for each absent key, and the contents of vals are unspecified. */
int kv_store_mget(kv_store *s, size_t n, const kv_bytes *keys, kv_buf *vals, bool *missing);

/* Writes nk pairs, all or nothing. Returns KV_EINVAL without writing anything
 * when nk != nv or any key or value is invalid, KV_ENOMEM (nothing written). */
int kv_store_mput(kv_store *s, size_t nk, const kv_bytes *keys, size_t nv, const kv_bytes *vals);

/* kv_store_mput with one deadline for every key written (0: none, cleared). */
int kv_store_mput_x(kv_store *s, size_t nk, const kv_bytes *keys, size_t nv, const kv_bytes *vals,
                    uint64_t expire_at);

/* Called for each key kv_store_expire_sample finds, with the partition held:
 * must not call into the store. */
typedef void (*kv_store_key_cb)(void *arg, const uint8_t *key, size_t klen, bool expired);

/*
 * One step of a range delete: removes the first `limit` (> 0) live keys of
 * [start, end) in key order, and the expired ones among them, with every
 * partition held, so the step is atomic with respect to every other
 * operation. `removed` (may be NULL) gets every key removed, expired ones
 * too, as u32 length (little-endian) and key bytes, in key order. *count
 * gets the live keys removed; *more is set when keys of the range remain,
 * and then `next` (may be NULL) gets the key to resume from. Returns 0,
 * KV_EINVAL or KV_ENOMEM (nothing removed).
 */
int kv_store_delrange(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                      size_t limit, kv_buf *removed, uint64_t *count, bool *more, kv_buf *next);

/*
 * Counts up to `limit` (0: no limit) live keys of [start, end) from the
 * index, copying no value. *more and `next` as kv_store_delrange. Returns 0,
 * KV_EINVAL or KV_ENOMEM.
 */
int kv_store_count(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                   size_t limit, uint64_t *count, bool *more, kv_buf *next);

/*
 * Active expiry: looks at up to `max` keys with a deadline in partition
 * `part`, from where the previous call stopped (wrapping around), and calls
 * cb(arg, key, klen, false) for each that has expired, with the partition
 * held (cb must not call into the store; copy the key and remove it with
 * KV_UPD_RECLAIM afterwards). *seen gets the keys looked at. Returns 0 or
 * KV_ENOMEM.
 */
int kv_store_expire_sample(kv_store *s, unsigned part, size_t max, kv_store_key_cb cb, void *arg,
                           size_t *seen);

/*
 * Ordered reads.
 */

/* Called once per entry in key order; return non-zero to stop early. The
 * pointers are valid only during the call. `val` is NULL when values were not
 * asked for. */
typedef int (*kv_store_visit_cb)(void *arg, const uint8_t *key, size_t klen, const uint8_t *val,
                                 size_t vlen);

/*
 * Visits up to `limit` (0: no limit) entries of [start, end) in key order,
 * values included when `with_values`. An empty end means no upper bound. To
 * resume after a last seen key K, call again with start = K followed by one
 * 0x00 byte (kv_scan_resume_key). Sets `*more` (may be NULL) when entries
 * beyond the limit exist. The work is proportional to the entries visited
 * plus the number of partitions; partition locks are held only while a
 * bounded chunk is copied out, so writers are never blocked for a whole scan.
 * Returns 0, KV_EINVAL or KV_ENOMEM.
 */
int kv_store_scan(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                  size_t limit, bool with_values, kv_store_visit_cb cb, void *arg, bool *more);

/*
 * Visits up to `limit` (0: no limit) entries of [start, end) that live in
 * partition `part`, in key order, with the partition locked (striped) or on
 * its owner thread (percore; allowed directly from that owner). `cb` must not
 * call into the store. Sets `*more` as kv_store_scan does. Returns 0,
 * KV_EINVAL, KV_ENOMEM or KV_EPERM (percore, from another owner thread).
 */
int kv_store_scan_partition(kv_store *s, unsigned part, const void *start, size_t slen,
                            const void *end, size_t elen, size_t limit, bool with_values,
                            kv_store_visit_cb cb, void *arg, bool *more);

/*
 * Range maintenance for migration and rebalancing. A cursor walks one range
 * partition by partition, in key order within a partition; every step does
 * bounded work and holds one partition lock for at most `max` entries, and
 * never more than 256 at a time whatever `max` is (a step may take several
 * holds, letting threads that wait for the lock go first between them), so
 * writes continue between and within steps. Entries written behind the
 * cursor after it
 * passed are not revisited: migration catches those separately.
 */
typedef struct {
	unsigned part; /* partition being walked */
	bool started;  /* whether `last` holds a key */
	bool done;     /* the whole range has been walked */
	kv_buf last;   /* last key visited in `part` */
} kv_store_cursor;

/* Zeroes a cursor; free it with kv_store_cursor_fini. */
void kv_store_cursor_init(kv_store_cursor *c);
void kv_store_cursor_fini(kv_store_cursor *c);

/* A visitor that also gets the entry's deadline (0: none). */
typedef int (*kv_store_visitx_cb)(void *arg, const uint8_t *key, size_t klen, const uint8_t *val,
                                  size_t vlen, uint64_t expire_at);

/* kv_store_range_step with the deadline of every entry; expired entries are
 * visited too. */
int kv_store_range_step_x(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                          kv_store_cursor *c, size_t max, kv_store_visitx_cb cb, void *arg);

/* Visits at most `max` entries of [start, end) from the cursor on (with
 * values), advancing it; sets c->done at the end. Expired entries too. `cb` runs with one
 * partition locked (or on its owner thread) and must not call into the
 * store. Returns 0 or an error. */
int kv_store_range_step(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                        kv_store_cursor *c, size_t max, kv_store_visit_cb cb, void *arg);

/* Deletes at most `max` entries of [start, end), at most 256 per partition
 * lock, adding the count to `*deleted` (may be NULL). Returns 0 when the
 * range is empty afterwards, KV_EBUSY when entries remain (call again). */
int kv_store_range_delete(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                          size_t max, uint64_t *deleted);

/* Counts the keys and the key+value bytes of [start, end) by walking it in
 * bounded steps. Returns 0 or an error. */
int kv_store_range_count(kv_store *s, const void *start, size_t slen, const void *end, size_t elen,
                         uint64_t *keys, uint64_t *bytes);

/*
 * Estimates the keys and the key+value bytes of [start, end) from the
 * first partitions that hold at least `min_keys` of its keys, scaled to
 * all of them: a key's partition is a hash of its bytes (all but the
 * last), so each partition holds about the same share of any range; the
 * error grows with how many keys share a partition's hash (keys that
 * differ only in their last byte). A range with fewer keys than that is
 * walked whole: *exact (may be NULL) says so. Returns 0 or an error.
 */
int kv_store_range_estimate(kv_store *s, const void *start, size_t slen, const void *end,
                            size_t elen, uint64_t min_keys, uint64_t *keys, uint64_t *bytes,
                            bool *exact);

/* Makes the calling thread's walks (range steps, counts, split keys, range
 * deletes, scan chunks) sleep `us` microseconds between two holds, so that
 * a background statistic takes a bounded share of a core instead of
 * running flat out beside the requests (doc/store.md "Range operations").
 * 0, every thread's default: no pause. The setting is the thread's own: a
 * client's count on an event loop is never slowed. */
void kv_store_thread_walk_pause(uint32_t us);

/* Finds an approximate median key of [start, end) (a split point that leaves
 * about half the bytes on each side: kv_store_range_split_keys with one
 * cut, or the range's second key when no key has half the bytes before
 * it), read in holds of at most 256 entries, and copies it into `key`.
 * Returns 0, or KV_ENOTFOUND when the range has fewer than two keys. */
int kv_store_range_split_key(kv_store *s, const void *start, size_t slen, const void *end,
                             size_t elen, kv_buf *key);

/*
 * Finds the n keys that cut [start, end) into n + 1 parts of about equal
 * bytes, in key order, into keys[0..n): keys[i] is the first key with at
 * least (i + 1) / (n + 1) of the bytes before it, never the range's first
 * key. From a sample (see kv_store_range_estimate for why a partition
 * stands for all): when the first partition holding any of the range
 * holds KV_STORE_SPLIT_SAMPLE of its keys, two passes over it; otherwise
 * the keys of the partitions, in turn, until they hold that many, copied
 * and sorted (all of a smaller range: exact). A cut that falls on the key
 * of the cut before it, or past the last key, is left empty (len 0);
 * keys[] is reused (kv_buf_set). Returns 0 or an error (keys then all
 * empty).
 */
#define KV_STORE_SPLIT_SAMPLE 4096u
int kv_store_range_split_keys(kv_store *s, const void *start, size_t slen, const void *end,
                              size_t elen, unsigned n, kv_buf *keys);

/*
 * Statistics and owner threads.
 */
typedef struct {
	uint64_t keys;        /* live keys */
	uint64_t bytes;       /* key + value bytes of live keys */
	uint64_t mem_bytes;   /* bytes taken from the system (arenas, nodes, large items) */
	uint64_t index_bytes; /* of which index nodes */
	uint64_t expiring;    /* keys with a deadline (expired or not) */
	/* Changes of the counts: keys added or removed, or a value's size
	 * changed. Equal in two calls: keys and bytes of every range are the
	 * same (an overwrite of the same size does not count). */
	uint64_t changes;
} kv_store_stats;

/* Sums the per-partition counters. Never blocks writers for long. */
void kv_store_get_stats(kv_store *s, kv_store_stats *st);

/* Returns the bytes taken from the system (kv_store_stats.mem_bytes), one
 * atomic read. */
uint64_t kv_store_mem_used(kv_store *s);

/* Percore: runs fn(s, part, arg) on the owner thread of `part` and returns
 * when it has finished. In striped mode runs it on the calling thread with
 * the partition unlocked. Returns 0, KV_EINVAL (bad part) or KV_EPERM (called
 * from an owner thread for another partition). */
typedef void (*kv_store_task_fn)(kv_store *s, unsigned part, void *arg);
int kv_store_run_on(kv_store *s, unsigned part, kv_store_task_fn fn, void *arg);

/* Returns the key that resumes a scan after `key`: `key` + one 0x00 byte.
 * Returns 0 or KV_ENOMEM. */
int kv_scan_resume_key(const void *key, size_t klen, kv_buf *out);

#endif
