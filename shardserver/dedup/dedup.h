/*
 * dedup.h - the exactly-once memory of a shard server: (client_id,
 * request_id) -> the result of a write, so that a retried write is answered
 * from memory instead of being applied twice (doc/contract.md §3, doc/protocol.md).
 *
 * Bounded: at most `per_client` results per client (the oldest result
 * is forgotten first, and a retried write older than what is held is refused, never
 * applied again), at most `max_clients` clients, and a client idle for
 * `ttl_ms` is forgotten. Thread-safe: striped mutexes by client id, leaves in the lock
 * order (no other lock is taken while one is held).
 */
#ifndef KV_SHARDSERVER_DEDUP_DEDUP_H
#define KV_SHARDSERVER_DEDUP_DEDUP_H

#include "common/key.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kv_dedup kv_dedup;

/* The remembered result of one write. */
typedef struct {
	int status;         /* KV_OK or a KV_E* code the write returned */
	uint64_t value_len; /* append: the length after the append */
	kv_buf value;       /* del: the deleted value, when has_value */
	bool has_value;     /* del: value is the deleted value (at most KV_DEDUP_MAX_VALUE
	                       bytes); false: not remembered, a retry gets no value */
} kv_dedup_result;

/* Deleted values longer than this are not remembered (the retry gets OK
 * without a value: has_value false). The remembered ones travel with the
 * memory through the log, snapshots and range transfers. */
#define KV_DEDUP_MAX_VALUE 4096u

/*
 * Results remembered per client by default. A client handle keeps up to
 * 512 ops in flight per server (4 requests of 128), and while a retry
 * waits (a failover, a primary transfer, backoffs of up to 100 ms) the same
 * handle goes on writing. With 1024, retries after a primary transfer
 * under pipelined load (about 1,000 writes in flight on one handle) were
 * refused as too old: 43-407 timed-out writes in each 6 s run; 0 in 6
 * runs with 4096, and with 16384 too, but the larger ring cost a
 * one-handle pipelined SET about 6% more server CPU per op, 4096 none that
 * the noise shows (bench/README.md, 2026-12-03 afternoon). A ring grows
 * from 8 slots as its client writes, so only clients that write this much
 * hold this many (about 130 bytes plus the key each).
 */
#define KV_DEDUP_PER_CLIENT 4096u

/* Creates a table. 0 arguments take defaults (KV_DEDUP_PER_CLIENT, 65536,
 * 10 minutes).
 * Returns NULL when out of memory. Free with kv_dedup_destroy (accepts NULL). */
kv_dedup *kv_dedup_create(size_t per_client, size_t max_clients, uint64_t ttl_ms);
void kv_dedup_destroy(kv_dedup *d);

/*
 * Starts a write. Returns KV_ENOTFOUND when the write is new (it is now
 * marked in progress: the caller must call kv_dedup_finish or kv_dedup_abort),
 * 0 when it was applied before (*out gets a copy of the result; the caller
 * frees out->value with kv_buf_fini), KV_EBUSY while the first attempt is
 * still in progress, KV_ESTALE when the memory cannot tell (retry: the
 * client sent this request id before, and it is older than what the
 * client's results still held: it may have been applied and forgotten; the
 * write must be refused, not applied), or KV_ENOMEM. A first attempt
 * (retry false) cannot have been applied before: it is never refused so.
 */
int kv_dedup_begin(kv_dedup *d, uint64_t client, uint64_t req, bool retry, uint64_t now_ms,
                   kv_dedup_result *out);

/* Records the result of a write started with kv_dedup_begin. Copies res and key. */
void kv_dedup_finish(kv_dedup *d, uint64_t client, uint64_t req, const kv_dedup_result *res,
                     const void *key, size_t klen, uint64_t now_ms);

/* Forgets a write started with kv_dedup_begin that was not applied. */
void kv_dedup_abort(kv_dedup *d, uint64_t client, uint64_t req);

/* Inserts a result received from another server (range transfer, a
 * replication record); a finished entry already present is kept, a pending
 * one (an attempt of the same write begun here) takes the result: that
 * attempt's kv_dedup_abort then keeps it. Copies everything. Returns 0 or
 * KV_ENOMEM. */
int kv_dedup_insert(kv_dedup *d, uint64_t client, uint64_t req, const kv_dedup_result *res,
                    const void *key, size_t klen, uint64_t time_ms);

/* One result for kv_dedup_insert_many; nothing of it is owned. */
typedef struct {
	uint64_t client;
	uint64_t req;
	kv_dedup_result res;
	const void *key;
	size_t klen;
	uint64_t time_ms;
} kv_dedup_entry;

/* kv_dedup_insert of v[0], ..., v[n - 1] in that order, holding a stripe's
 * lock once for each run of entries in that stripe (a replication batch's
 * records, mostly of a few clients). Every entry is tried; returns 0 or the
 * error of the last that failed (KV_EINVAL for a zero id, KV_ENOMEM). */
int kv_dedup_insert_many(kv_dedup *d, const kv_dedup_entry *v, size_t n);

/* Calls cb for every finished entry whose key lies in [start, end) (empty
 * end: no bound). cb runs with a stripe lock held and must not call into
 * the table. */
typedef void (*kv_dedup_visit_cb)(void *arg, uint64_t client, uint64_t req,
                                  const kv_dedup_result *res, const uint8_t *key, size_t klen,
                                  uint64_t time_ms);
void kv_dedup_visit_range(kv_dedup *d, const void *start, size_t slen, const void *end, size_t elen,
                          kv_dedup_visit_cb cb, void *arg);

/* The table is in KV_DEDUP_PARTS parts (a client's entries are all in one),
 * each under a lock of its own. kv_dedup_visit_part is kv_dedup_visit_range
 * for part `part` alone, with only its lock held: a caller with slow work
 * per entry copies one part out, then works with no lock held, so that
 * writes wait for a copy, not for that work. */
#define KV_DEDUP_PARTS 16u
void kv_dedup_visit_part(kv_dedup *d, unsigned part, const void *start, size_t slen,
                         const void *end, size_t elen, kv_dedup_visit_cb cb, void *arg);

/* Forgets every finished entry whose key lies in [start, end) (a range
 * deleted as a whole: replication copies replace a range wholesale). Each
 * client's floor rises to the highest id it forgets, so that a retry of a
 * forgotten write that the range's replacement does not bring along is
 * refused (KV_ESTALE), not applied a second time. */
void kv_dedup_forget_range(kv_dedup *d, const void *start, size_t slen, const void *end,
                           size_t elen);

/* Calls cb for every client with a floor (the highest id it may have
 * forgotten: at or below it a retry that is not held is refused). cb runs
 * with a stripe lock held and must not call into the table. */
typedef void (*kv_dedup_floor_cb)(void *arg, uint64_t client, uint64_t floor);
void kv_dedup_visit_floors(kv_dedup *d, kv_dedup_floor_cb cb, void *arg);

/* Raises client's floor to at least `floor` (a copy's source had forgotten
 * writes up to it). Returns 0 or KV_ENOMEM. */
int kv_dedup_raise_floor(kv_dedup *d, uint64_t client, uint64_t floor, uint64_t now_ms);

/* Returns the number of clients remembered (for tests and statistics). */
size_t kv_dedup_clients(kv_dedup *d);

#endif
