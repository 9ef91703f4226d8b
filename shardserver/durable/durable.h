/*
 * durable.h - what a shard server keeps on disk: every change to its store
 * goes to the write-ahead log (wal.h) before it is acknowledged, a
 * background snapshot (snap.h) lets the log be cut, and a restart rebuilds
 * the store from the newest snapshot plus the log.
 *
 * Log records are blind writes ("key is now V", "key is now V until T",
 * "keys K1..Kn are gone", "key is gone", "range is gone", "this (client,
 * request) was applied"), so replaying a record that
 * a fuzzy snapshot already holds changes nothing: the state of a key after
 * replay is the effect of the last record that touched it. Appends are
 * logged as the whole value after the append.
 *
 * Ordering. Per key, the log must hold writes in the order the store applied
 * them. Writes take the key's stripe lock (kv_dur_lock_keys) around "apply
 * to the store, then append the record", so two writes to one key are
 * applied and logged in the same order. Every apply+log section also holds
 * the barrier lock for reading (kv_dur_begin/kv_dur_end); the snapshotter
 * takes it for writing only to start a new log segment, after which every
 * record before that segment is in the store.
 *
 * Lock order: owner.lock -> kv_mig_out.mu -> the replication routing table
 * (read) -> barrier (read) -> key stripes (ascending) -> store partition
 * locks / dedup stripes -> the log's mutex -> what a log tap takes (a
 * replication stream's mutex; kv_dur_tap).
 *
 * This is the public header of kv_durable (shardserver/durable/): the
 * server includes it, and only it. It also holds the few types of the log
 * that the server sees (the fsync mode, the completion callback, the log's
 * statistics). The dependency points one way: durability loads into and
 * snapshots the store (store.h) and the exactly-once memory (dedup.h) and
 * never calls into the server.
 */
#ifndef KV_SHARDSERVER_DURABLE_DURABLE_H
#define KV_SHARDSERVER_DURABLE_DURABLE_H

#include "common/key.h"
#include "shardserver/dedup/dedup.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kv_dur kv_dur;
typedef struct kv_store kv_store;

/* When an append counts as done. */
typedef enum {
	KV_FSYNC_ALWAYS, /* fdatasync before a record is reported durable (group commit) */
	KV_FSYNC_BATCH,  /* write(2) promptly, fdatasync at most every batch_ms */
	KV_FSYNC_NONE    /* write(2) promptly, fsync only at rotate and close */
} kv_fsync_mode;

/* Parses "always", "batch" or "none". Returns 0 or KV_EINVAL. */
int kv_fsync_mode_parse(const char *s, kv_fsync_mode *out);

/* Returns "always", "batch", "none" or "unknown". */
const char *kv_fsync_mode_name(kv_fsync_mode m);

/* Completion callback of kv_wal_notify() and kv_dur_notify(). Must not block or call into the log
 * except kv_wal_health() and kv_wal_stats_get(). */
typedef void (*kv_wal_done_fn)(void *arg, int status);

/* The log's counters and positions (kv_wal_stats_get, read under the
 * log's mutex; kv_dur_stats.wal). */
typedef struct {
	uint64_t records;     /* records appended since open */
	uint64_t bytes;       /* their payload bytes */
	uint64_t writes;      /* successful pwritev(2) batches */
	uint64_t fsyncs;      /* successful fdatasync(2) calls */
	uint64_t segments;    /* segments started since open, the first included */
	uint64_t reused;      /* ... of them made of a dropped segment (wal.h) */
	uint64_t next_lsn;    /* lsn the next append gets */
	uint64_t written_lsn; /* every record <= this is written */
	uint64_t synced_lsn;  /* every record <= this is fsynced */
	int health;           /* kv_wal_health() */
} kv_wal_stats;

/* Dedup fields of a logged write. */
typedef struct {
	uint64_t client;    /* Request.client_id */
	uint64_t req;       /* Op.request_id */
	uint64_t value_len; /* append: length after the append */
	uint64_t time_ms;   /* when applied, Unix ms */
	bool has_del_value; /* del and dedup records: del_value is the deleted value */
	kv_bytes del_value; /* ... (at most KV_DEDUP_MAX_VALUE bytes) */
} kv_dur_dedup;

typedef struct {
	const char *dir;         /* the data dir */
	kv_fsync_mode mode;      /* --fsync */
	uint64_t snapshot_bytes; /* log bytes that trigger a snapshot; 0: default */
	bool truncate_corrupt;   /* --wal-truncate-corrupt */
	kv_store *store;         /* where recovery loads data */
	kv_dedup *dedup;         /* where recovery loads exactly-once memory */
} kv_dur_opts;

/* What recovery found, for the start-up log line. */
typedef struct {
	uint64_t snap_lsn;     /* snapshot loaded (1: none) */
	uint64_t snap_entries; /* its entries */
	uint64_t snap_bytes;   /* its payload bytes */
	uint64_t log_records;  /* log records replayed */
	uint64_t log_bytes;    /* their bytes */
	uint64_t elapsed_ns;   /* wall time of recovery */
	bool torn;             /* a torn tail was dropped */
	uint64_t torn_bytes;   /* its size */
	char torn_file[512];   /* where */
} kv_dur_report;

/* Recovers the store from DIR (snapshot + log), opens the log for appending
 * and starts the snapshot thread. On failure writes the reason (naming the
 * file and offset for corruption) into err. Returns 0, KV_ECORRUPT, KV_EIO,
 * KV_ENOSPC or KV_ENOMEM. */
int kv_dur_open(const kv_dur_opts *o, kv_dur **out, kv_dur_report *rep, char *err, size_t errlen);

/* Stops the snapshot thread, writes and fsyncs what is buffered, closes.
 * Accepts NULL. */
void kv_dur_close(kv_dur *d);

/* The fsync mode. */
kv_fsync_mode kv_dur_mode(const kv_dur *d);

/* 0 while the log accepts writes, else KV_ENOSPC/KV_EIO: refuse writes. */
int kv_dur_health(kv_dur *d);

/* Enter/leave an apply+log section (the snapshot barrier, read side). */
void kv_dur_begin(kv_dur *d);
void kv_dur_end(kv_dur *d);

/* Enter an apply+log section that excludes every other one (the barrier's
 * write side; leave it with kv_dur_end): a write whose keys are found only
 * once it runs, a delrange step, so that no write to those keys falls
 * between the store and the log. Takes no stripe. */
void kv_dur_begin_exclusive(kv_dur *d);

/* Key stripe locks held by one write (kv_dur_lock_keys). */
#define KV_DUR_STRIPES 1024u
typedef struct {
	uint16_t *idx;   /* stripe indexes held, ascending (inl or heap) */
	size_t n;        /* how many */
	uint16_t inl[8]; /* storage for up to 8 */
} kv_dur_held;

/* Locks the stripes of n keys (duplicates once, ascending order). Returns 0
 * or KV_ENOMEM (nothing held). Release with kv_dur_unlock. */
int kv_dur_lock_keys(kv_dur *d, const kv_bytes *keys, size_t n, kv_dur_held *h);
void kv_dur_lock_key(kv_dur *d, const void *key, size_t klen, kv_dur_held *h);
void kv_dur_unlock(kv_dur *d, kv_dur_held *h);

/* A tap on one append: fn(arg, lsn, payload, n) runs under the log's
 * mutex right after the record got its lsn, so taps see records in lsn
 * order (the replication stream is fed this way: doc/replication.md
 * "Writes"). payload is valid during the call only. fn must be quick and
 * take only leaf locks (lock order: doc/threads.md). */
typedef void (*kv_dur_tap_fn)(void *arg, uint64_t lsn, const uint8_t *payload, size_t n);
typedef struct {
	kv_dur_tap_fn fn; /* called once for the record */
	void *arg;        /* its first argument */
} kv_dur_tap;

/* Log records. Each copies its arguments and returns the record's lsn in
 * *lsn (may be NULL). dd may be NULL; tap may be NULL (no tap). Return 0,
 * KV_ENOMEM or KV_ECLOSED. */
int kv_dur_log_put(kv_dur *d, const void *key, size_t klen, const void *val, size_t vlen,
                   const kv_dur_dedup *dd, uint64_t *lsn, const kv_dur_tap *tap);
int kv_dur_log_del(kv_dur *d, const void *key, size_t klen, const kv_dur_dedup *dd, uint64_t *lsn,
                   const kv_dur_tap *tap);
int kv_dur_log_mput(kv_dur *d, size_t n, const kv_bytes *keys, const kv_bytes *vals,
                    const kv_dur_dedup *dd, uint64_t *lsn, const kv_dur_tap *tap);
/* The same with the keys' deadline (Unix ms; 0: none, which clears one). */
int kv_dur_log_put_x(kv_dur *d, const void *key, size_t klen, const void *val, size_t vlen,
                     uint64_t expire_at, const kv_dur_dedup *dd, uint64_t *lsn,
                     const kv_dur_tap *tap);
int kv_dur_log_mput_x(kv_dur *d, size_t n, const kv_bytes *keys, const kv_bytes *vals,
                      uint64_t expire_at, const kv_dur_dedup *dd, uint64_t *lsn,
                      const kv_dur_tap *tap);
/* n keys are gone (a delrange step, an expiry reclaim); dd's entry is
 * remembered under the anchor key (its del_value: the step's cursor). */
int kv_dur_log_mdel(kv_dur *d, kv_bytes anchor, size_t n, const kv_bytes *keys,
                    const kv_dur_dedup *dd, uint64_t *lsn, const kv_dur_tap *tap);

/* Applies one log record payload received from a primary (replication)
 * to the store and the exactly-once memory exactly as recovery does, and
 * appends it to this log; *lsn gets the local lsn. The caller holds the
 * barrier (kv_dur_begin). Returns 0, KV_ECORRUPT (malformed record), the
 * store's error or the log's. */
int kv_dur_apply_record(kv_dur *d, const uint8_t *p, size_t n, uint64_t *lsn);
/* kv_dur_apply_record for n records in turn, logged together (one hold of
 * the log's mutex), their exactly-once results inserted together after
 * the store has them (kv_dedup_insert_many): *done gets how many were applied and logged, the
 * first *done, *last_lsn the local lsn of the last of them. On an error
 * (the record *done's) the ones before it are logged all the same. */
int kv_dur_apply_records(kv_dur *d, const kv_bytes *recs, size_t n, size_t *done,
                         uint64_t *last_lsn);
int kv_dur_log_range_del(kv_dur *d, const void *start, size_t slen, const void *end, size_t elen,
                         uint64_t *lsn);
/* A dedup entry received with a range (migration). */
int kv_dur_log_dedup(kv_dur *d, const kv_dur_dedup *dd, int status, const void *key, size_t klen,
                     uint64_t *lsn);

/* Record payloads for a bulk copy to a replica (doc/replication.md
 * "Catch-up"): the records kv_dur_log_put (without dedup fields),
 * kv_dur_log_range_del and kv_dur_log_dedup would log, appended to out
 * instead; the replica applies them with kv_dur_apply_record. Return 0 or
 * KV_ENOMEM (out may then hold part of a record). */
int kv_dur_rec_put(kv_buf *out, const void *key, size_t klen, const void *val, size_t vlen);
int kv_dur_rec_put_x(kv_buf *out, const void *key, size_t klen, const void *val, size_t vlen,
                     uint64_t expire_at);
int kv_dur_rec_range_del(kv_buf *out, const void *start, size_t slen, const void *end, size_t elen);
int kv_dur_rec_dedup(kv_buf *out, const kv_dur_dedup *dd, int status, const void *key, size_t klen);
/* A client's floor (kv_dedup_raise_floor) for a copy: a DEDUP record with
 * no key and status KV_DUR_DEDUP_FLOOR, dd->req the floor. */
#define KV_DUR_DEDUP_FLOOR INT32_MIN
int kv_dur_rec_floor(kv_buf *out, uint64_t client, uint64_t floor, uint64_t time_ms);

/* The keys one log record touches (kv_dur_rec_span). */
typedef enum {
	KV_DUR_SPAN_NONE,  /* no key */
	KV_DUR_SPAN_KEYS,  /* keys from lo to hi, both included */
	KV_DUR_SPAN_RANGE, /* every key of [lo, hi) (empty hi: no bound): a range delete */
	KV_DUR_SPAN_ALL    /* not known here (a side log's adoption): any key */
} kv_dur_span_kind;

typedef struct {
	kv_dur_span_kind kind;
	kv_bytes lo, hi; /* point into the record */
} kv_dur_span;

/* Sets *out to what the record payload p[0..n) (a log record as
 * kv_wal_replay passes it) may change: its keys, the key of an
 * exactly-once entry and a delrange step's anchor included. Returns 0 or
 * KV_ECORRUPT (malformed or unknown record). */
int kv_dur_rec_span(const uint8_t *p, size_t n, kv_dur_span *out);

/* Reads the records from_lsn .. to_lsn of d's log, read-only (kv_wal_read):
 * only records of segments closed before this start (to_lsn below the
 * first lsn of this start). cb as kv_wal_replay's. Returns 0, KV_ECORRUPT
 * (anything but exactly those records: a segment dropped after a snapshot,
 * damage), KV_EIO, KV_EINVAL, KV_ENOMEM or the callback's code. */
int kv_dur_read_log(kv_dur *d, uint64_t from_lsn, uint64_t to_lsn,
                    int (*cb)(void *arg, uint64_t lsn, const uint8_t *p, size_t n), void *arg,
                    char *err, size_t errlen);

/* The lsn of the last record appended (0: none since start). */
uint64_t kv_dur_last_lsn(kv_dur *d);

/* Every record <= this lsn is durable by the mode (lock-free read). */
uint64_t kv_dur_durable_lsn(kv_dur *d);

/* Calls done(arg, status) once lsn is durable by the mode (see wal.h). */
int kv_dur_notify(kv_dur *d, uint64_t lsn, kv_wal_done_fn done, void *arg);

/* Blocks until every record so far is on disk (fsynced unless the mode is
 * none). For migration handoffs. Returns 0 or the log's error. */
int kv_dur_sync(kv_dur *d);

/* Blocks until every record so far is fsynced, whatever the mode: with
 * none the log syncs nothing on its own, and a replica's catch-up
 * positions may only name synced records. Returns 0 or the log's error. */
int kv_dur_fsync(kv_dur *d);

/* --fsync batch: writes what is appended to the log on the calling thread,
 * unless a write is in progress elsewhere (kv_wal_write_here). For a
 * thread about to wait for its own records (a backup's Replicate). */
void kv_dur_write_here(kv_dur *d);

/*
 * Side logs (doc/durability.md "Migrations"): what an incoming range
 * transfer receives is logged in a log directory of its own, side-<n>/ in
 * the data dir, so that the copy's bytes never sit in front of client
 * writes in the server's log. kv_dur_side_adopt appends one ADOPT record to
 * the server's log, after which recovery replays the side log there, whole;
 * a side log never adopted is deleted by kv_dur_side_close and at the next
 * start. One side log is used by one thread at a time (the transfer's).
 */
typedef struct kv_dur_side kv_dur_side;

/* Creates a new side log (a new directory and its writer thread; with
 * --fsync always or batch it syncs by itself every 50 ms). Returns 0,
 * KV_ENOMEM, or the log's open error (KV_EIO, KV_ENOSPC, ...). */
int kv_dur_side_open(kv_dur *d, kv_dur_side **out);

/* Records of the side log, as kv_dur_log_put_x, kv_dur_log_mput_x,
 * kv_dur_log_del (no dedup fields) and kv_dur_log_dedup would log them.
 * KV_EINVAL once the side log is adopted. Return 0, KV_EINVAL, KV_ENOMEM or
 * KV_ECLOSED. */
int kv_dur_side_put_x(kv_dur_side *s, const void *key, size_t klen, const void *val, size_t vlen,
                      uint64_t expire_at);
int kv_dur_side_mput_x(kv_dur_side *s, size_t n, const kv_bytes *keys, const kv_bytes *vals,
                       uint64_t expire_at);
int kv_dur_side_del(kv_dur_side *s, const void *key, size_t klen);
int kv_dur_side_dedup(kv_dur_side *s, const kv_dur_dedup *dd, int status, const void *key,
                      size_t klen);

/* Waits until the side log holds every record so far (synced unless
 * --fsync none): the end of a bulk copy syncs it, so that the fence waits
 * only for what came after. Returns 0 or the log's error. */
int kv_dur_side_sync(kv_dur_side *s);

/* Makes the side log part of the server's durable state: waits until it
 * holds every record (synced unless --fsync none), appends ADOPT to the
 * server's log in an apply-and-log section and waits for that as
 * kv_dur_sync does. Every record of the side log must already be applied
 * to the store. Returns 0, KV_EINVAL (adopted already) or the logs' error
 * (then it is not adopted, or, past the append, may be: close it like an
 * adopted one, the caller refuses the fence either way). */
int kv_dur_side_adopt(kv_dur_side *s);

/* Stops the side log's writer and frees it: an adopted side log stays on
 * disk until a snapshot covers its ADOPT record, any other is deleted.
 * Accepts NULL. */
void kv_dur_side_close(kv_dur_side *s);

/* Statistics for status and metrics. */
typedef struct {
	kv_wal_stats wal;        /* the log */
	uint64_t snapshots;      /* snapshots written since start */
	uint64_t snapshot_ms;    /* duration of the last one */
	uint64_t snapshot_bytes; /* its payload bytes */
	uint64_t snapshot_lsn;   /* its lsn */
} kv_dur_stats;
void kv_dur_stats_get(kv_dur *d, kv_dur_stats *st);

/* Takes a snapshot now (tests and shutdown); 0 or an error. */
int kv_dur_snapshot(kv_dur *d);

/* Test hook (unit tests, fuzz/): applies one log record payload (the bytes
 * of a wal.h record) to store and dedup exactly as recovery does. Returns 0,
 * KV_ECORRUPT for a malformed record, or the store's error. */
int kv_dur_replay_record_for_test(kv_store *store, kv_dedup *dedup, const uint8_t *p, size_t n);

#endif
