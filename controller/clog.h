/*
 * clog.h - the controller's configuration log: an append-only file in the
 * data dir that holds every published configuration, in epoch order.
 *
 * The log stores opaque records (the controller stores packed Config
 * messages); it knows nothing of their contents. A record is durable (written
 * and fsynced) when kv_clog_append() returns 0. Not thread-safe: the caller
 * serialises calls (the controller holds its mutex).
 *
 * File layout (all integers little-endian; the header is the file header
 * of common/frame.h, with the cluster id as its one field, and every
 * checksum is its kv_frame_sum):
 *
 *   offset  size  field
 *   ------  ----  --------------------------------------------------------
 *   0       8     magic "SKVCLOG\0"
 *   8       4     format version (KV_CLOG_VERSION)
 *   12      4     header size (KV_CLOG_HEADER_SIZE)
 *   16      24    cluster id, ASCII, NUL padded
 *   40      8     XXH3-64 of bytes [0, 40)
 *   48      ...   records
 *
 *   record: 4 bytes payload length N (1 .. KV_CLOG_MAX_RECORD)
 *           8 bytes XXH3-64 of the length field XOR XXH3-64 of the payload
 *           N bytes payload
 *
 * Recovery on open: a file shorter than the header (a crash while creating
 * it) is re-initialised; a partial or unchecksummed last record (a crash
 * while appending) is cut off and reported; any other damage - a bad header,
 * or a bad record followed by more data - refuses to open with a message
 * naming the file and the offset.
 */
#ifndef KV_CONTROLLER_CLOG_H
#define KV_CONTROLLER_CLOG_H

#include <stddef.h>
#include <stdint.h>

#define KV_CLOG_FILE        "config.log"
#define KV_CLOG_VERSION     1u
#define KV_CLOG_HEADER_SIZE 48u
#define KV_CLOG_MAX_RECORD  (64u * 1024u * 1024u)

typedef struct kv_clog kv_clog;

/* Called once per intact record, in file order. A non-zero return stops the
 * open with that code. p is valid during the call only. */
typedef int (*kv_clog_record_cb)(void *arg, const uint8_t *p, size_t n, uint64_t offset);

/* What kv_clog_open found. */
typedef struct {
	uint64_t records;       /* intact records read */
	uint64_t dropped_bytes; /* torn tail cut off */
	int created;            /* 1 when the file was created (or re-initialised) */
} kv_clog_info;

/*
 * Opens DIR/config.log, creating DIR (one level) and the file when missing,
 * locks it against a second controller, replays the records through cb, and
 * recovers as described above. On error writes a one-line reason naming the
 * file (and offset) into err. Returns 0, KV_ECORRUPT, KV_EIO, KV_EPERM,
 * KV_EBUSY (locked by another process), KV_EINVAL (not a config log or an
 * unknown version) or KV_ENOMEM. The caller closes the log with kv_clog_close().
 */
int kv_clog_open(const char *dir, kv_clog_record_cb cb, void *arg, kv_clog **out,
                 kv_clog_info *info, char *err, size_t errlen);

/* Appends one record and fsyncs it. On error the file is cut back to its
 * previous length, so a later append starts clean. Returns 0, KV_EINVAL
 * (empty or too big), KV_EIO or KV_ENOSPC. */
int kv_clog_append(kv_clog *l, const void *p, size_t n);

/* Returns the cluster id stored in the header (16 hex digits). */
const char *kv_clog_cluster_id(const kv_clog *l);

/* Returns the path of the log file. */
const char *kv_clog_path(const kv_clog *l);

/* Closes the file and frees the log. Accepts NULL. */
void kv_clog_close(kv_clog *l);

#endif
