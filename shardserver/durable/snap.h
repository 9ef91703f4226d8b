/*
 * snap.h - snapshot files of the shard server's state.
 *
 * A snapshot `snap-<lsn, 16 hex digits>.dat` in the data dir contains the
 * effect of every log record with lsn < LSN (see wal.h): recovery loads the
 * newest snapshot and replays the log from its lsn. The file holds a stream
 * of entries {type, key, value}; the type is the caller's (0..255, e.g. 0 =
 * key/value, 1 = metadata blob) and the module knows nothing of it.
 *
 * File layout (all integers little-endian):
 *
 *   header (KV_SNAP_HEADER_SIZE bytes; the file header of common/frame.h,
 *   with the lsn as its one field)
 *   offset  size  field
 *   ------  ----  --------------------------------------------------------
 *   0       8     magic "SKVSNAP\0"
 *   8       4     format version (KV_SNAP_VERSION)
 *   12      4     header size (KV_SNAP_HEADER_SIZE)
 *   16      8     lsn (equals the lsn in the file name)
 *   24      8     XXH3-64 of bytes [0, 24)
 *   32      ...   data blocks, then the trailer block, then end of file
 *
 *   block:  4 bytes payload length N
 *           4 bytes entry count C (1 .. ; 0xffffffff marks the trailer)
 *           8 bytes XXH3-64 (kv_frame_sum) of the 8 bytes above followed
 *                   by the payload
 *           N bytes payload: C entries back to back, each
 *             1 byte type, 4 bytes key length K, 4 bytes value length V,
 *             K bytes key, V bytes value
 *           N <= KV_SNAP_BLOCK unless the block holds one bigger entry.
 *   trailer: a block with C = 0xffffffff and N = 32, payload
 *             8 bytes total entry count
 *             8 bytes total key + value bytes
 *             8 bytes file offset of the trailer block
 *             8 bytes XXH3-64 of the header checksum and every data block
 *                     checksum, each as 8 bytes, in file order
 *
 * Writing: the file is written as `snap-<lsn>.tmp`, the trailer appended,
 * fsynced, renamed to `.dat`, the dir fsynced; then older snapshots and
 * stale .tmp files are removed. So a `.dat` file is always complete, and
 * any damage to one is corruption (the log before it is gone).
 *
 * Thread safety: a writer is used by one thread at a time; one snapshot is
 * written per data dir at a time (commit removes other .tmp files).
 * kv_snap_load() may run at any time.
 *
 * A module header of kv_durable: included by the files of
 * shardserver/durable/, the snapshot unit tests and fuzzers. Everything else
 * includes durable.h.
 */
#ifndef KV_SHARDSERVER_DURABLE_SNAP_H
#define KV_SHARDSERVER_DURABLE_SNAP_H

#include <stddef.h>
#include <stdint.h>

#define KV_SNAP_VERSION     1u
#define KV_SNAP_HEADER_SIZE 32u
#define KV_SNAP_BLOCK       (1024u * 1024u)       /* payload bytes per block */
#define KV_SNAP_MAX_KEY     (64u * 1024u)         /* key bytes per entry */
#define KV_SNAP_MAX_VALUE   (80u * 1024u * 1024u) /* value bytes per entry */

typedef struct kv_snap_writer kv_snap_writer;

/*
 * Starts DIR/snap-<lsn>.tmp (lsn >= 1; an older .tmp of that name is
 * replaced) and writes its header. On error writes a one-line reason naming
 * the file into err and leaves no file behind. Returns 0, KV_EINVAL, KV_EIO,
 * KV_ENOSPC, KV_EPERM or KV_ENOMEM.
 */
int kv_snap_begin(const char *dir, uint64_t lsn, kv_snap_writer **out, char *err, size_t errlen);

/*
 * Adds one entry (key and value are copied or written before this returns).
 * Returns 0; KV_EINVAL for a key over KV_SNAP_MAX_KEY or a value over
 * KV_SNAP_MAX_VALUE (the writer stays usable); or KV_ENOSPC / KV_EIO when a
 * write failed - then the .tmp is already removed, every later call fails
 * the same way, and the caller ends with kv_snap_commit() or
 * kv_snap_abort().
 */
int kv_snap_add(kv_snap_writer *w, uint8_t type, const void *key, size_t klen, const void *val,
                size_t vlen);

/*
 * Writes the trailer, fsyncs, renames the file to snap-<lsn>.dat, fsyncs the
 * dir, then removes older snapshots and stale .tmp files (a failure to remove
 * them is only logged). Frees w in all cases. On error the .tmp is removed
 * and err names the file. Returns 0, KV_ENOSPC, KV_EIO or the error of an
 * earlier kv_snap_add().
 */
int kv_snap_commit(kv_snap_writer *w, char *err, size_t errlen);

/* Removes the .tmp and frees w. Accepts NULL. */
void kv_snap_abort(kv_snap_writer *w);

/* Called once per entry, in file order. key and val are valid during the
 * call only. A non-zero return stops the load with that code. */
typedef int (*kv_snap_cb)(void *arg, uint8_t type, const uint8_t *key, size_t klen,
                          const uint8_t *val, size_t vlen);

/*
 * Loads the newest snapshot in DIR (.tmp files are ignored): calls cb for
 * every entry and sets *lsn to its lsn, *entries and *bytes (key + value
 * bytes) to what was loaded (any of them may be NULL). Without a snapshot (or
 * without DIR) *lsn = 1 and cb is never called. Any damage - bad header,
 * checksum, length, entry or trailer, missing trailer, data after it - is
 * KV_ECORRUPT with the file and offset in err; there is no fallback to an
 * older snapshot, because the log before the newest one may be gone. cb may
 * have run for entries before the damage; the caller discards them.
 * Memory is bounded by one block. Returns 0, KV_ECORRUPT, KV_EIO, KV_ENOMEM
 * or the callback's code.
 */
int kv_snap_load(const char *dir, kv_snap_cb cb, void *arg, uint64_t *lsn, uint64_t *entries,
                 uint64_t *bytes, char *err, size_t errlen);

#endif
