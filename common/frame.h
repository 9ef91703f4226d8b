/*
 * frame.h - the framing every on-disk format of shardkv shares: the file
 * header that opens each file and the checksum that protects headers and
 * records. Any component may include it; today the write-ahead log and the
 * snapshots (shardserver/durable/wal.c, snap.c) and the controller's
 * configuration log (controller/clog.c) use it.
 *
 * File header (H bytes, H = the format's header size, at least 24; all
 * integers little-endian):
 *
 *   offset  size    field
 *   ------  ------  ------------------------------------------------------
 *   0       8       magic, one per format ("SKVWAL\0\0", "SKVSNAP\0",
 *                   "SKVCLOG\0")
 *   8       4       format version (per format, bumped on any change)
 *   12      4       header size H
 *   16      H - 24  the format's own fields (first lsn, cluster id, ...)
 *   H - 8   8       checksum (kv_frame_sum) of bytes [0, H - 8)
 *
 * Records are framed per format (their layouts are in wal.h, snap.h and
 * clog.h), but every record checksum is kv_frame_sum (XXH3-64) or its
 * streaming form, so the hash is chosen in this one place.
 *
 * This module does no I/O and keeps no state; all of it is thread-safe.
 */
#ifndef KV_COMMON_FRAME_H
#define KV_COMMON_FRAME_H

#include <stddef.h>
#include <stdint.h>

#define KV_FRAME_MAGIC_LEN  8u
#define KV_FRAME_HEADER_MIN 24u /* magic, version, size and checksum */

/* Writes magic, version and header size into the first 16 bytes of h and
 * zeroes the rest of its `size` bytes; the caller then fills in its fields
 * from offset 16 and calls kv_frame_header_seal(). */
void kv_frame_header_init(uint8_t *h, const char magic[KV_FRAME_MAGIC_LEN], uint32_t version,
                          uint32_t size);

/* Writes the checksum of bytes [0, size - 8) into the last 8 bytes of the
 * `size`-byte header h and returns it. */
uint64_t kv_frame_header_seal(uint8_t *h, uint32_t size);

/* What kv_frame_header_check() found, in the order it checks. */
typedef enum {
	KV_FRAME_OK = 0,          /* the header is intact */
	KV_FRAME_BAD_MAGIC = 1,   /* not a file of this format */
	KV_FRAME_BAD_VERSION = 2, /* a format version this build does not read */
	KV_FRAME_BAD_SIZE = 3,    /* the header size field is not `size` */
	KV_FRAME_BAD_SUM = 4,     /* the checksum does not match */
} kv_frame_check;

/* Checks the `size`-byte header h (all of it readable) against the expected
 * magic, version and size, in that order, and returns the first mismatch.
 * The format's own fields are the caller's to check. */
kv_frame_check kv_frame_header_check(const uint8_t *h, const char magic[KV_FRAME_MAGIC_LEN],
                                     uint32_t version, uint32_t size);

/* Returns the version field of a header (for messages). */
uint32_t kv_frame_header_version(const uint8_t *h);

/* Returns the header size field of a header (for messages). */
uint32_t kv_frame_header_size(const uint8_t *h);

/* Returns the checksum (XXH3-64) of n bytes at p. */
uint64_t kv_frame_sum(const void *p, size_t n);

/*
 * A streaming checksum: the same value kv_frame_sum gives for the
 * concatenation of everything added since the last reset. For frames whose
 * bytes are not contiguous (a block header and a caller's buffers). One
 * state is used by one thread at a time.
 */
typedef struct kv_frame_sum_state kv_frame_sum_state;

/* Returns a reset state, or NULL when out of memory. Free it with
 * kv_frame_sum_destroy(), which accepts NULL. */
kv_frame_sum_state *kv_frame_sum_create(void);
void kv_frame_sum_destroy(kv_frame_sum_state *st);

/* Starts a new checksum. */
void kv_frame_sum_reset(kv_frame_sum_state *st);

/* Adds n bytes at p. */
void kv_frame_sum_update(kv_frame_sum_state *st, const void *p, size_t n);

/* Returns the checksum of what was added since the reset (the state stays
 * usable: more may be added). */
uint64_t kv_frame_sum_digest(const kv_frame_sum_state *st);

#endif
