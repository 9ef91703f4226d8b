/*
 * key.h - byte-string keys, half-open key ranges and the wrapped ids that
 * cross module boundaries.
 *
 * Keys order bytewise (memcmp; a proper prefix sorts first). A range is
 * [start, end) where an empty start is the beginning of the key space and an
 * empty end is its end. These helpers never allocate except kv_buf_*.
 */
#ifndef KV_COMMON_KEY_H
#define KV_COMMON_KEY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Default and hard limits of doc/contract.md §2. */
#define KV_DEFAULT_MAX_KEY   1024u
#define KV_DEFAULT_MAX_VALUE (1024u * 1024u)
#define KV_HARD_MAX_KEY      (64u * 1024u)
#define KV_HARD_MAX_VALUE    (64u * 1024u * 1024u)

/* Ids are wrapped so that an epoch cannot be passed where a node id is meant. */
typedef struct {
	uint64_t v;
} kv_epoch;
typedef struct {
	uint32_t v;
} kv_node_id;

/* A borrowed byte string: the pointer is not owned. */
typedef struct {
	const uint8_t *p; /* bytes, may be NULL when len is 0 */
	size_t len;       /* number of bytes */
} kv_bytes;

/* A growable owned byte buffer. Zero-initialise; free with kv_buf_fini(). */
typedef struct {
	uint8_t *data; /* heap bytes, NULL until the first reserve */
	size_t len;    /* bytes in use */
	size_t cap;    /* bytes allocated */
} kv_buf;

/* Makes sure `b` can hold `n` bytes. Returns 0 or KV_ENOMEM (b unchanged). */
int kv_buf_reserve(kv_buf *b, size_t n);
/* Replaces the contents with a copy of `n` bytes at `p`. Returns 0 or KV_ENOMEM. */
int kv_buf_set(kv_buf *b, const void *p, size_t n);
/* Appends a copy of `n` bytes at `p`. Returns 0 or KV_ENOMEM. */
int kv_buf_append(kv_buf *b, const void *p, size_t n);
/* Frees the bytes and zeroes `b`. Accepts NULL. */
void kv_buf_fini(kv_buf *b);

/* Compares two keys bytewise; a proper prefix sorts first. Returns <0, 0, >0. */
static inline int
kv_key_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
	size_t n = alen < blen ? alen : blen;
	int c = n ? __builtin_memcmp(a, b, n) : 0;
	if (c != 0)
		return c;
	return alen < blen ? -1 : alen > blen ? 1 : 0;
}

/* Returns whether `key` lies in [start, end); an empty end means no upper bound. */
static inline bool
kv_range_contains(const void *start, size_t slen, const void *end, size_t elen, const void *key,
                  size_t klen)
{
	if (kv_key_cmp(key, klen, start, slen) < 0)
		return false;
	return elen == 0 || kv_key_cmp(key, klen, end, elen) < 0;
}

/* Returns whether [is, ie) lies inside [os, oe); an empty end means no
 * upper bound. */
static inline bool
kv_range_within(const void *is, size_t isl, const void *ie, size_t iel, const void *os, size_t osl,
                const void *oe, size_t oel)
{
	if (kv_key_cmp(is, isl, os, osl) < 0)
		return false;
	return oel == 0 || (iel != 0 && kv_key_cmp(ie, iel, oe, oel) <= 0);
}

/* Returns whether [start, end) is empty (end not empty and end <= start). */
static inline bool
kv_range_is_empty(const void *start, size_t slen, const void *end, size_t elen)
{
	return elen != 0 && kv_key_cmp(end, elen, start, slen) <= 0;
}

/*
 * Computes the end of the range of keys that start with `prefix`: the
 * shortest key greater than every key with that prefix. Writes it to `out`
 * (capacity at least plen) and its length to `*outlen`; a length of 0 means
 * "no upper bound" (the prefix is empty or all 0xff bytes).
 */
void kv_prefix_end(const void *prefix, size_t plen, uint8_t *out, size_t *outlen);

/* Returns a 64-bit hash of `n` bytes (xxh3). */
uint64_t kv_hash64(const void *p, size_t n);

/* Returns CLOCK_MONOTONIC in nanoseconds. */
uint64_t kv_now_ns(void);

/* Returns CLOCK_REALTIME in milliseconds since the Unix epoch: the clock of
 * the exactly-once memory's times (dedup.h) and of log records' times. */
uint64_t kv_unix_ms(void);

/* Returns CLOCK_MONOTONIC in nanoseconds read from the kernel's last tick
 * (CLOCK_MONOTONIC_COARSE) plus that clock's resolution: never earlier than
 * kv_now_ns() read at the same moment, at most one tick (1-10 ms) later,
 * and cheaper to read. For deadlines, which may end a little late but
 * never early; falls back to kv_now_ns(). */
uint64_t kv_now_late_ns(void);

#endif
