/*
 * wal.h - the shard server's write-ahead log: opaque records, numbered by a
 * log sequence number (lsn), appended by many threads and made durable in
 * groups by one writer thread.
 *
 * The log knows nothing of record contents. LSNs start at 1 and are
 * contiguous across segment files. A server recovers by loading its newest
 * snapshot (snap.h), whose lsn L says "contains every record < L", and then
 * replaying the log from L with kv_wal_replay(); kv_wal_open() then continues
 * at the lsn replay returned.
 *
 * Files in the data dir: one segment per `wal-<first lsn, 16 hex digits>.log`.
 * All integers little-endian:
 *
 *   segment header (KV_WAL_HEADER_SIZE bytes; the file header of
 *   common/frame.h, with the first lsn as its one field)
 *   offset  size  field
 *   ------  ----  --------------------------------------------------------
 *   0       8     magic "SKVWAL\0\0"
 *   8       4     format version (KV_WAL_VERSION, or KV_WAL_VERSION_RECYCLED
 *                 for a recycled segment: see below)
 *   12      4     header size (KV_WAL_HEADER_SIZE)
 *   16      8     first lsn (equals the lsn in the file name)
 *   24      8     XXH3-64 of bytes [0, 24)
 *   32      ...   records
 *
 *   record (KV_WAL_RECORD_HEADER bytes, then the payload)
 *   0       8     XXH3-64 of bytes [8, 24 + N) (the rest of the header and
 *                 the payload)
 *   8       4     payload length N (1 .. KV_WAL_MAX_RECORD)
 *   12      4     reserved, 0
 *   16      8     lsn (the previous record's lsn + 1; the first record of a
 *                 segment has the segment's first lsn)
 *   24      N     payload
 *
 * Writing: a segment is only ever appended to by the process that created
 * it (kv_wal_open() always starts a new one). Every write is at the end of
 * the last good byte, so a crash leaves at most a torn tail in the newest
 * segment. Recovery rules are those of kv_wal_replay().
 *
 * Recycled segments: with ALWAYS and BATCH (unless no_spares),
 * kv_wal_drop_before() keeps up to eight dropped segments as spares
 * (`spare-<lsn>.wal`, never read, removed by the next kv_wal_open()), and a
 * new segment is made of a spare: its header has version
 * KV_WAL_VERSION_RECYCLED, and records of the file's older use (every one
 * of a lower lsn than the segment's first) may follow its own records until
 * overwritten. Format version 1 readers refuse such a segment's header.
 *
 * Thread safety: every kv_wal_* call on an open log may run concurrently
 * with the others, except kv_wal_close(), which must be the last call.
 * kv_wal_replay() works on a directory and must not run while the log of
 * that directory is open.
 *
 * A module header of kv_durable: included by the files of
 * shardserver/durable/, the log's unit tests, its fuzzers and its
 * benchmark (bench/wal_cost.c). Everything
 * else includes durable.h (which holds kv_fsync_mode, kv_wal_done_fn and
 * kv_wal_stats, used here).
 */
#ifndef KV_SHARDSERVER_DURABLE_WAL_H
#define KV_SHARDSERVER_DURABLE_WAL_H

#include "shardserver/durable/durable.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define KV_WAL_VERSION          1u
#define KV_WAL_VERSION_RECYCLED 2u
#define KV_WAL_HEADER_SIZE      32u
#define KV_WAL_RECORD_HEADER    24u
#define KV_WAL_MAX_RECORD       (80u * 1024u * 1024u)

/* What kv_wal_replay() found. */
typedef struct {
	uint64_t records;    /* records replayed (passed to the callback) */
	uint64_t bytes;      /* their payload bytes */
	uint64_t next_lsn;   /* lsn the next append gets */
	bool torn;           /* a torn tail (or, with truncate_corrupt, damage) was cut off */
	uint64_t torn_bytes; /* bytes dropped there (all files) */
	char file[512];      /* torn tail / corruption: the file */
	uint64_t offset;     /* ... and the offset of the bad record (0: the header) */
} kv_wal_report;

/* Called once per replayed record, in lsn order. p is valid during the call
 * only. A non-zero return stops the replay with that code. */
typedef int (*kv_wal_replay_cb)(void *arg, uint64_t lsn, const uint8_t *p, size_t n);

/*
 * Replays DIR's segments: calls cb for every intact record with
 * lsn >= from_lsn (from_lsn >= 1), in lsn order. Segments all of whose
 * records are below from_lsn (the next segment starts at or below it) are
 * skipped without being opened; every record of the other segments is
 * checked, including those below from_lsn. Rules:
 *
 * - Torn tail: the LAST segment ends in an incomplete record header, an
 *   incomplete record, or a bad record (bad length field or checksum) after
 *   which no intact record follows anywhere in the file (zeros to EOF
 *   included). It is cut off (ftruncate + fsync) and reported in rep
 *   (torn, file, offset, torn_bytes); that is not an error.
 * - Torn creation: a LAST segment shorter than its header, or exactly a
 *   header of zero bytes, is removed (and the dir fsynced) and reported the
 *   same way, with offset 0.
 * - Corruption: a bad record with an intact record after it in the same
 *   file, a bad record in a segment that is not the last, a record with a
 *   good checksum but the wrong lsn, a bad header (or one shorter than the
 *   header) in a segment that is not the last, a full-size header that is
 *   bad, or a gap between segments ("log has a gap"). Returns KV_ECORRUPT,
 *   with rep->file and rep->offset set and a message naming both in err -
 *   unless truncate_corrupt is true: then the log is cut there (that file
 *   truncated to the bad record, or removed when its header is bad, and
 *   every later segment removed, dir fsynced), reported in rep like a torn
 *   tail (torn = true), described in err, and 0 returned.
 * - Recycled segment (header version KV_WAL_VERSION_RECYCLED): its records
 *   end at the first record that is not intact or has an lsn below the
 *   segment's first (one of the file's older use). In the last segment the
 *   bytes from there are a torn tail (cut and reported as above) unless an
 *   intact record of its own follows: corruption. In a segment before the
 *   last, the next segment must start at the lsn after its last record,
 *   else corruption at the offset where its records end.
 * - Missing start: when segments exist but all start after from_lsn, the
 *   records from from_lsn are missing: KV_ECORRUPT "log starts at X, need Y",
 *   even with truncate_corrupt. A dir with no segments (or no dir) is fine:
 *   next_lsn = from_lsn.
 *
 * Records of the segments read must be contiguous, so the first record
 * replayed is from_lsn whenever any record >= from_lsn exists.
 * rep->next_lsn = max(from_lsn, last lsn + 1); callbacks made before an
 * error was found are not undone (the caller discards that state). Memory is
 * bounded by the largest record plus 1 MiB. Returns 0, KV_ECORRUPT, KV_EIO,
 * KV_EINVAL (from_lsn 0), KV_ENOMEM or the callback's code.
 */
int kv_wal_replay(const char *dir, uint64_t from_lsn, bool truncate_corrupt, kv_wal_replay_cb cb,
                  void *arg, kv_wal_report *rep, char *err, size_t errlen);

/*
 * Reads DIR's records from_lsn .. to_lsn (1 <= from_lsn <= to_lsn), in lsn
 * order, calling cb for each, without changing anything: segments are
 * opened read-only, none is treated as the last (no torn tail is cut), and
 * segments starting after to_lsn are never opened. So it may run while the
 * log of DIR is open, as long as to_lsn is below the open log's first lsn
 * (records of closed segments) that no kv_wal_drop_before() drops
 * meanwhile (a spare is overwritten). Every record of the segments read is
 * checked. Anything else than exactly the records from_lsn .. to_lsn -
 * a missing segment (dropped after a snapshot), a gap, damage, a log that
 * ends early - is KV_ECORRUPT, with a message in err. Memory is bounded as
 * for kv_wal_replay. Returns 0, KV_ECORRUPT, KV_EIO, KV_EINVAL, KV_ENOMEM
 * or the callback's code.
 */
int kv_wal_read(const char *dir, uint64_t from_lsn, uint64_t to_lsn, kv_wal_replay_cb cb, void *arg,
                char *err, size_t errlen);

typedef struct kv_wal kv_wal;

/* Options of kv_wal_open(). Zero values take the defaults. */
typedef struct {
	const char *dir;        /* data dir; created (one level) when missing */
	kv_fsync_mode mode;     /* durability policy */
	uint32_t batch_ms;      /* BATCH: fdatasync interval, default 10 */
	uint64_t segment_bytes; /* start a new segment past this, default 64 MiB (a segment
	                           can overshoot by one batch, at most about buffer_bytes) */
	uint64_t buffer_bytes;  /* appends block while this much is unwritten, default 64 MiB
	                           (a single bigger record is still accepted) */
	bool round_writes;      /* BATCH: an append made in a round (common/defer.h)
	                           is written at the round's end on the round's
	                           thread (kv_wal_write_here), not by a woken writer.
	                           The log must then outlive every thread that
	                           appends to it in a round. */
	bool close_unsynced;    /* NONE: kv_wal_close writes what is left but does not
	                           fsync it (a migration's side log, closed on the
	                           transfer's commit path) */
	bool bulk;              /* the writer thread is a bulk thread (common/slice.h):
	                           a migration's side log */
	bool lazy;              /* BATCH: the writer lets the append buffer fill as
	                           with NONE (256 KiB or 2 ms) before it writes it,
	                           unless someone waits for it (a notification,
	                           kv_wal_wait, a rotation, close); the fsyncs keep
	                           their period. For a log that nothing waits for
	                           record by record: a migration's side log */
	bool no_spares;         /* ALWAYS, BATCH: remove dropped segments instead of
	                           keeping them for reuse (as NONE always does) */
} kv_wal_opts;

/*
 * Opens the log for appending at next_lsn (from kv_wal_replay()). Always
 * starts a new segment wal-<next_lsn>.log (never appends to an old one; an
 * existing segment of that name without records is reused), fsyncs it and
 * the dir, and starts the writer thread. Refuses with KV_EEXISTS when a
 * segment with records at or after next_lsn exists. On error writes a
 * one-line reason naming the file into err. Returns 0, KV_EINVAL, KV_EEXISTS,
 * KV_EIO, KV_ENOSPC, KV_EPERM or KV_ENOMEM.
 */
int kv_wal_open(const kv_wal_opts *o, uint64_t next_lsn, kv_wal **out, char *err, size_t errlen);

/*
 * Copies one record, the concatenation of the n pieces of iov, into the
 * in-memory buffer and assigns it the next lsn (*lsn). Thread-safe; the lsn
 * order is the order of the calls. Never fails for I/O reasons (see
 * kv_wal_health()); blocks while the unwritten bytes are at or over
 * buffer_bytes and the log is healthy. Returns 0, KV_EINVAL (empty or over
 * KV_WAL_MAX_RECORD), KV_ENOMEM or KV_ECLOSED (kv_wal_close() has begun).
 */
int kv_wal_appendv(kv_wal *w, const struct iovec *iov, int n, uint64_t *lsn);

/* Appends n records, record i the bytes of recs[i], in that order, with
 * one hold of the log's mutex: *first_lsn gets the first one's lsn, the
 * others follow it one by one. Otherwise as kv_wal_appendv (KV_EINVAL when
 * any record is empty or over KV_WAL_MAX_RECORD: then none is appended). */
int kv_wal_append_many(kv_wal *w, const struct iovec *recs, int n, uint64_t *first_lsn);

/* kv_wal_appendv, then tap(arg, lsn, payload, n) under the log's mutex once
 * the record is copied and numbered (tap NULL: none). See kv_dur_tap. */
int kv_wal_appendv_tap(kv_wal *w, const struct iovec *iov, int n, uint64_t *lsn, kv_dur_tap_fn tap,
                       void *arg);

/*
 * Returns the sticky I/O state: 0 while the writer can write; KV_ENOSPC,
 * KV_EIO (or another code of the failed call) after a failed write, fsync
 * or segment creation, until a retry succeeds. The writer retries by itself
 * every 100 ms, backing off to 1 s, rewriting the unwritten (after a failed
 * fsync: the unsynced) bytes from the last good offset, so no half record is
 * left in the middle of a segment; it never drops a buffered record.
 * Callers refuse new writes while this is non-zero.
 */
int kv_wal_health(kv_wal *w);

/*
 * Asks for done(arg, status) once lsn (an lsn returned by kv_wal_appendv)
 * is durable by the policy - ALWAYS: fdatasynced; BATCH and NONE: written
 * with write(2), so it survives a process crash - with status 0; or with the
 * health error when a write or fsync fails before that (the record stays
 * buffered and is retried; the caller reports an error to its client), also
 * when the log is unhealthy at the time of the call; or with KV_ECLOSED when
 * the log closes without having made it durable. May run inline (already
 * durable, or unhealthy) or on the writer thread, in lsn order there.
 * When this returns 0, done is called exactly once; otherwise never.
 * Returns 0, KV_EINVAL (lsn not assigned), KV_ENOMEM or KV_ECLOSED.
 */
int kv_wal_notify(kv_wal *w, uint64_t lsn, kv_wal_done_fn done, void *arg);

/* Every record <= the returned lsn is durable by the mode (as kv_wal_notify
 * defines it); read without the mutex, for a fast path that skips notify. */
uint64_t kv_wal_durable_lsn(kv_wal *w);

/* Blocks until lsn is written (sync=false) or fsynced (sync=true; forces an
 * fsync in BATCH and NONE mode). Returns 0, the health error (at once when
 * the log is unhealthy), KV_EINVAL (lsn not assigned) or KV_ECLOSED. */
int kv_wal_wait(kv_wal *w, uint64_t lsn, bool sync);

/* Starts a new segment at the next lsn, after writing and fsyncing the
 * current one, so that older segments can be dropped after a snapshot.
 * Sets *first_lsn to that lsn (the open segment's first lsn when it holds no
 * record yet: then nothing changes). Blocks until the new segment exists.
 * Returns 0, the health error, or KV_ECLOSED. */
int kv_wal_rotate(kv_wal *w, uint64_t *first_lsn);

/* kv_wal_rotate in two halves. The start only cuts: records appended from
 * now on go to the new segment, whose first lsn it sets in *first_lsn; it
 * waits only for a rotation still in progress. The wait blocks until the
 * segment at first_lsn exists (the old one written and fsynced). A caller
 * that must hold appenders off while it cuts (the snapshot's barrier) holds
 * them for the start alone. Both return 0, the health error or KV_ECLOSED. */
int kv_wal_rotate_start(kv_wal *w, uint64_t *first_lsn);
int kv_wal_rotate_wait(kv_wal *w, uint64_t first_lsn);

/* Removes every segment all of whose records have lsn < lsn (that is, the
 * next segment starts at or below lsn), never the open one, and fsyncs the
 * dir. With ALWAYS and BATCH up to eight of them become spares for later
 * segments (see "Recycled segments" above): a kv_wal_read() of DIR must not
 * run at the same time on segments this drops. Returns 0, KV_EIO or
 * KV_ENOMEM. */
int kv_wal_drop_before(kv_wal *w, uint64_t lsn);

/* Copies the counters and positions (kv_wal_stats, durable.h) into *st,
 * under the mutex. */
void kv_wal_stats_get(kv_wal *w, kv_wal_stats *st);

/*
 * Writes and fsyncs everything buffered, stops the writer thread and frees
 * the log. On a failed disk it gives up after a few seconds of retrying
 * (the unwritten records are lost; they were never reported durable).
 * Pending notifications get 0 or KV_ECLOSED. Accepts NULL.
 */
void kv_wal_close(kv_wal *w);

/*
 * Test hook: makes every later write, fsync and segment creation of the
 * writer fail with err (a KV_E* code, e.g. KV_ENOSPC; a positive errno is
 * translated), 0 restores normal operation and retries at once. A failing
 * write first writes half of its bytes, as a full disk would.
 */
void kv_wal_test_fail_writes(kv_wal *w, int err);

/*
 * Test hook: while hold is set, BATCH's periodic fsync waits on the syncer
 * thread before it begins (a disk slow to sync); kv_wal_test_syncs_held
 * says whether one waits there now.
 */
void kv_wal_test_hold_syncs(kv_wal *w, bool hold);
bool kv_wal_test_syncs_held(kv_wal *w);

/*
 * round_writes logs: does the writer's take and write of what is appended
 * on the calling thread, and completes the notifications it covers (their
 * callbacks run here), unless a write is in progress elsewhere, the log
 * is failing, or a switch, rotation or sync result is the writer's next
 * step: then the records are the writer's, which is woken. What the end
 * of an event loop's round runs (common/defer.h); also for a thread about
 * to wait for its own records. Other logs: nothing.
 */
void kv_wal_write_here(kv_wal *w);

/* Test hook: whether the writer thread sleeps (waits for work or for its
 * time) with no round of its own or of a loop's in progress: an append
 * made now in a round is left to the round's end (round_writes). */
bool kv_wal_test_writer_sleeps(kv_wal *w);

/* Test hook: the fdatasync calls the writer threads of every log of the
 * process have made on their own thread (a sync, a switch, a close; not
 * the syncer's). */
uint64_t kv_wal_test_fsyncs(void);

#endif
