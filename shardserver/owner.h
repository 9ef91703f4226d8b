/*
 * owner.h - the ownership table of a shard server: which key ranges this
 * node serves right now, and what to tell a client about the ones it does
 * not (doc/protocol.md "A server therefore serves a range exactly when it
 * holds it").
 *
 * The table is a sorted list of non-overlapping entries. Keys outside every
 * entry are not served and not known locally; the caller answers them from
 * the latest configuration.
 *
 * Thread-safety: one pthread rwlock per table. Request handlers hold the read
 * lock (kv_owner_rdlock) for the whole op, so an entry and the migration it
 * points to stay valid until kv_owner_unlock, and an ownership change (taken
 * under the write lock) waits for ops in flight on the old owner. Changes
 * (kv_owner_set*) take the write lock themselves; never call them while
 * holding the read lock.
 */
#ifndef KV_SHARDSERVER_OWNER_H
#define KV_SHARDSERVER_OWNER_H

#include "common/key.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum {
	KV_OWN_SERVE = 1,    /* served here (maybe with an outgoing migration: see mig) */
	KV_OWN_INCOMING = 2, /* arriving by transfer: answer MOVING, hint = source */
	KV_OWN_MOVED = 3,    /* handed over: answer WRONG_OWNER, hint = destination */
} kv_own_state;

typedef struct {
	kv_buf start;       /* inclusive; empty: beginning of the key space */
	kv_buf end;         /* exclusive; empty: end of the key space */
	kv_own_state state; /* what this node does with keys of the entry */
	uint32_t peer;      /* INCOMING: source node; MOVED: destination; SERVE: 0 */
	char *peer_addr;    /* the peer's URL (owned), NULL when peer is 0 */
	uint64_t epoch;     /* epoch of the hint (the migration's epoch) */
	uint64_t mig_id;    /* migration that created or moves the entry; 0: none */
	void *mig;          /* SERVE: the outgoing migration in flight, NULL otherwise
	                       (not owned; valid while the read lock is held) */
} kv_owner_entry;

typedef struct {
	pthread_rwlock_t lock; /* protects n and e: read for lookups, write for changes */
	size_t n;              /* entries */
	kv_owner_entry *e;     /* sorted by start, non-overlapping */
} kv_owner;

/* Initialises an empty table. Returns 0 or KV_ENOMEM. */
int kv_owner_init(kv_owner *t);
/* Frees every entry. No other call may be in progress. */
void kv_owner_fini(kv_owner *t);

/* Takes / releases the read lock around lookups and ops. */
void kv_owner_rdlock(kv_owner *t);
void kv_owner_unlock(kv_owner *t);

/* Waits until every op holding the read lock when called has released it
 * (takes and releases the write lock). */
void kv_owner_quiesce(kv_owner *t);

/* Returns the entry that contains key, or NULL. Caller holds the read lock;
 * the result is valid until it releases it. */
const kv_owner_entry *kv_owner_lookup_locked(const kv_owner *t, const void *key, size_t klen);

/*
 * Makes [start, end) one entry with the given state, cutting it out of any
 * entries it overlaps. peer_addr is copied (may be NULL). Takes the write
 * lock. Returns 0, KV_EINVAL (empty range) or KV_ENOMEM (table unchanged).
 */
int kv_owner_set(kv_owner *t, const void *start, size_t slen, const void *end, size_t elen,
                 kv_own_state state, uint32_t peer, const char *peer_addr, uint64_t epoch,
                 uint64_t mig_id, void *mig);

/* Makes every part of [start, end) that is not SERVE an entry with the given
 * state: SERVE for the initial assignment of a configuration, INCOMING for a
 * migration into this node (a range already served is left alone). Takes
 * the write lock. Returns 0, KV_EINVAL (empty range) or KV_ENOMEM. */
int kv_owner_fill(kv_owner *t, const void *start, size_t slen, const void *end, size_t elen,
                  kv_own_state state, uint32_t peer, const char *peer_addr, uint64_t epoch,
                  uint64_t mig_id);

/* Makes the parts of [start, end) that have no entry at all SERVE: a
 * restarted source takes back the range it was moving (it still owns it
 * until the handover is published), without overriding an entry a running
 * node holds (a MOVED range stays moved). Takes the write lock. Returns 0,
 * KV_EINVAL (empty range) or KV_ENOMEM. */
int kv_owner_claim(kv_owner *t, const void *start, size_t slen, const void *end, size_t elen,
                   uint64_t epoch);

/* Removes the INCOMING entries of migration mig_id (stream forgotten). Takes
 * the write lock. Returns the number removed. */
size_t kv_owner_drop_incoming(kv_owner *t, uint64_t mig_id);

/* Returns whether every key of [start, end) is in entries of `state` (of
 * any state when 0; false when out of memory). Caller holds the read
 * lock. */
bool kv_owner_covers_locked(const kv_owner *t, const void *start, size_t slen, const void *end,
                            size_t elen, kv_own_state state);

/* Copies the SERVE ranges (adjacent ones merged) into a new array of 2*n
 * kv_bufs (start, end pairs) that the caller frees with kv_owner_ranges_free.
 * Takes the read lock. Returns 0 or KV_ENOMEM. */
int kv_owner_served(kv_owner *t, kv_buf **out, size_t *n);
void kv_owner_ranges_free(kv_buf *r, size_t n);

#endif
