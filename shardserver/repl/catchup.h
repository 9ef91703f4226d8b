/*
 * catchup.h - the data of a catch-up from a replica's own data
 * (doc/replication.md "Catch-up from the replica's own data"), without
 * locks or I/O: the primary's buffer of its recent records, and a
 * replica's positions with their file format. repl.c holds both under its
 * own locks (the buffer under buf_mu, the positions under in_mu).
 */
#ifndef KV_SHARDSERVER_REPL_CATCHUP_H
#define KV_SHARDSERVER_REPL_CATCHUP_H

#include "common/key.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kv_cu_slab kv_cu_slab;

/* One buffered record: immutable once made, inside a slab of the buffer
 * (records are laid one after the other in slabs, so that dropping the
 * oldest reads memory in order, with no allocation or free per record).
 * A catch-up that takes a record holds its slab. */
typedef struct kv_cu_rec {
	kv_cu_slab *slab;      /* where it lives */
	uint64_t lsn;          /* the primary's lsn */
	uint64_t leader_epoch; /* its range's leader epoch */
	size_t slen, elen;     /* its range's bounds at the write (empty end: none) */
	size_t plen;           /* the log record payload */
	uint8_t data[];        /* start, end, payload */
} kv_cu_rec;

/* The buffer: every record added with lsn > trim is held, in lsn order. */
typedef struct {
	kv_cu_slab *head, *tail; /* slabs, oldest first */
	kv_cu_slab *spare;       /* an emptied slab kept for the next, or NULL */
	size_t slab;             /* bytes of a slab (a larger record gets its own) */
	size_t n;                /* records held */
	uint64_t bytes;          /* their payload bytes */
	uint64_t cap;            /* most payload bytes held (the oldest go first) */
	uint64_t trim;           /* records at or below it may be missing */
} kv_cu_buf;

void kv_cu_buf_init(kv_cu_buf *b, uint64_t cap, uint64_t trim);
void kv_cu_buf_fini(kv_cu_buf *b);

/* Adds a record whose lsn is above every one added before, then drops the
 * oldest slab of records (a 64th of cap, at most 1 MiB; trim moves to its
 * last record) while more than cap bytes are held, never the newest slab:
 * past cap once, the buffer holds at most cap bytes and at least cap less
 * a slab's, besides a newest slab larger than cap. Out of
 * memory it drops everything and trim becomes lsn: the buffer never claims
 * a record it lacks. */
void kv_cu_buf_add(kv_cu_buf *b, uint64_t lsn, uint64_t leader_epoch, const kv_bytes *start,
                   const kv_bytes *end, const uint8_t *p, size_t n);

/* Every held record whose range overlaps [start, end) (empty end: none),
 * in lsn order, each with a reference to its slab taken (kv_cu_release) into a new
 * array *out (NULL when none) of *n; *from gets trim: the records of the
 * range with lsn > *from are exactly these. Returns 0, KV_EINVAL when one
 * of them has another leader epoch or a range not inside [start, end)
 * (nothing taken: a catch-up cannot be offered), or KV_ENOMEM. */
int kv_cu_buf_select(kv_cu_buf *b, const kv_bytes *start, const kv_bytes *end,
                     uint64_t leader_epoch, kv_cu_rec ***out, size_t *n, uint64_t *from);

/* Drops the reference of each of v[0..n) and frees v. Accepts NULL. */
void kv_cu_release(kv_cu_rec **v, size_t n);

/* A record's payload. */
kv_bytes kv_cu_payload(const kv_cu_rec *r);

/* A replica's position: applying every record `from` (in its start
 * `boot`) logged for a key of [start, end) at leader_epoch with lsn > lsn,
 * in lsn order, to this replica's data yields that primary's state of
 * the range. */
typedef struct {
	uint32_t from;
	uint64_t boot;
	uint64_t leader_epoch;
	kv_buf start, end;   /* empty end: none */
	uint64_t lsn;        /* covered from */
	uint64_t local;      /* the local lsn the log must have synced before lsn is saved */
	uint64_t saved;      /* the value the file may hold ... */
	bool has_saved;      /* ... when set */
	uint64_t cand_lsn;   /* lsn when the file was last written, to save once ... */
	uint64_t cand_local; /* ... the log has synced this */
	bool has_cand;
	bool live; /* moves with the stream (no break since it was made) */
} kv_cu_pos;

typedef struct {
	kv_cu_pos *v;
	size_t n, cap;
} kv_cu_pos_set;

/* Most positions kept (a set past it refuses more: a copy follows). */
#define KV_CU_POS_MAX 4096u

void kv_cu_pos_set_fini(kv_cu_pos_set *s);

/* Whether p lets a catch-up of [start, end) from (from, boot) at
 * leader_epoch, with the records after from_lsn, make this replica's data
 * the primary's: the same primary start and leader epoch, bounds the same
 * or wider, and p's lsn at or above from_lsn. */
bool kv_cu_pos_covers(const kv_cu_pos *p, uint32_t from, uint64_t boot, uint64_t leader_epoch,
                      const kv_bytes *start, const kv_bytes *end, uint64_t from_lsn);

/* The index of the first position covering (as kv_cu_pos_covers), or -1. */
long kv_cu_pos_find(const kv_cu_pos_set *s, uint32_t from, uint64_t boot, uint64_t leader_epoch,
                    const kv_bytes *start, const kv_bytes *end, uint64_t from_lsn);

/* Sets the position of exactly [start, end) from (from, boot) at
 * leader_epoch (replacing every other position overlapping it; the parts
 * of a wider one outside it are kept as positions of their own, not live).
 * Returns 0, KV_ENOMEM or KV_ELIMIT. */
int kv_cu_pos_put(kv_cu_pos_set *s, uint32_t from, uint64_t boot, uint64_t leader_epoch,
                  const kv_bytes *start, const kv_bytes *end, uint64_t lsn, uint64_t local,
                  bool live);

/* Removes every position overlapping [start, end) whole. Returns how many. */
size_t kv_cu_pos_forget(kv_cu_pos_set *s, const kv_bytes *start, const kv_bytes *end);

/* A range of the replica's configuration that positions may cover: led by
 * primary at leader_epoch, with the replica among its backups. */
typedef struct {
	kv_bytes start, end;
	uint32_t primary;
	uint64_t leader_epoch;
} kv_cu_range;

/* Cuts each position to its parts inside ranges r[0..n) (sorted by start,
 * disjoint) of its primary and leader epoch; the rest is forgotten.
 * *dropped tells whether a part was forgotten. Returns 0 or KV_ENOMEM (the
 * set is then empty and *dropped true). */
int kv_cu_pos_reshape(kv_cu_pos_set *s, const kv_cu_range *r, size_t n, bool *dropped);

/* The file: the positions whose saved value is set, at that value.
 * Returns 0 or KV_ENOMEM. */
int kv_cu_pos_encode(const kv_cu_pos_set *s, kv_buf *out);

/* Reads a file made by kv_cu_pos_encode into an empty set (positions not
 * live, saved = lsn). Returns 0, KV_ECORRUPT (wrong magic, lengths or
 * checksum: the set stays empty) or KV_ENOMEM. */
int kv_cu_pos_decode(const uint8_t *p, size_t n, kv_cu_pos_set *s);

/* The keys of the last records a restarted node recovered from its log
 * (doc/replication.md "Case (b): the old primary", "After a restart"):
 * for each lsn from..to, the span of keys its record may change. */
typedef struct {
	uint8_t kind;            /* kv_dur_span_kind */
	uint32_t lo_off, lo_len; /* into keys */
	uint32_t hi_off, hi_len;
} kv_cu_span;

typedef struct {
	uint64_t from, to; /* lsns held: from..to (to < from: none) */
	kv_cu_span *v;     /* v[i] is lsn from + i */
	size_t n, cap;
	kv_buf keys;       /* the spans' bounds */
	uint64_t max_keys; /* most key bytes held (past it kv_cu_tail_add fails) */
} kv_cu_tail;

/* An empty summary that will hold lsns from `from` on, at most max_keys
 * key bytes. */
void kv_cu_tail_init(kv_cu_tail *t, uint64_t from, uint64_t max_keys);
void kv_cu_tail_fini(kv_cu_tail *t);

/* Adds the span of record lsn (to + 1 exactly) of kind (kv_dur_span_kind)
 * with bounds lo, hi (copied). Returns 0, KV_EINVAL (not the next lsn),
 * KV_ELIMIT (max_keys) or KV_ENOMEM. */
int kv_cu_tail_add(kv_cu_tail *t, uint64_t lsn, int kind, kv_bytes lo, kv_bytes hi);

/* Whether a record with lsn in (after, upto] may change a key of
 * [start, end) (empty end: none): 1 when one may, 0 when none does, -1
 * when the summary does not hold every one of those lsns (cannot tell). */
int kv_cu_tail_touches(const kv_cu_tail *t, uint64_t after, uint64_t upto, const kv_bytes *start,
                       const kv_bytes *end);

#endif
