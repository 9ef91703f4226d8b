/*
 * recent.h - the keys of the records a backup applied last from one
 * primary (doc/replication.md "Reconciliation after a transfer").
 *
 * A backup keeps, per primary it follows, a ring of the spans of the last
 * KV_RECENT_CAP records it applied from it, each with the primary's lsn.
 * When a new primary's end of the previous leader epoch names an lsn below
 * the backup's own position in the old primary's records, the ring tells
 * whether any record between the two touched the range: records of the
 * old primary's other ranges, which it goes on writing, do not make the
 * backup's copy of this range differ from the new primary's.
 *
 * A slot keeps up to KV_RECENT_KEY bytes of each key. A longer key of up
 * to 1,024 bytes is also written whole into a byte ring of 1 MiB beside
 * the slots, and compared whole while the ring holds it; otherwise its
 * first KV_RECENT_KEY bytes bound it from below and, with every key that
 * begins with them, from above. A record that may lie in the range by
 * those bounds, a record of no known key and a gap the ring no longer
 * holds answer "touched": every doubt falls on the side of a copy.
 *
 * Not thread-safe: the owner (the backup's state of that primary) holds
 * its lock.
 */
#ifndef KV_REPL_RECENT_H
#define KV_REPL_RECENT_H

#include "common/key.h"
#include "shardserver/durable/durable.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KV_RECENT_CAP 8192u /* records remembered per primary */
#define KV_RECENT_KEY 52u   /* key bytes a slot keeps; of longer keys, their first bytes */

typedef struct kv_recent kv_recent;

/* A new, empty ring (it knows no record yet), or NULL when out of memory. */
kv_recent *kv_recent_new(void);
void kv_recent_free(kv_recent *r);

/* Forgets every record: what was applied before is unknown from now on
 * (a copy or a catch-up replaced the data). */
void kv_recent_clear(kv_recent *r);

/* Notes that the record of lsn with span sp was applied. Lsns rise from one
 * call to the next; one at or below the last is ignored. */
void kv_recent_add(kv_recent *r, uint64_t lsn, const kv_dur_span *sp);

/* Whether a record applied with an lsn in (after, upto] may touch
 * [start, end) (an empty end: no bound). True also when the ring does not
 * hold every record applied in that interval. */
bool kv_recent_touches(const kv_recent *r, uint64_t after, uint64_t upto, kv_bytes start,
                       kv_bytes end);

#endif
