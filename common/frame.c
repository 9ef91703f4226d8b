/*
 * frame.c - the shared on-disk framing (frame.h): file headers and the
 * record checksum.
 *
 * The invariant is byte compatibility: a header is magic, version, size,
 * format fields and an XXH3-64 of everything before the checksum, exactly as
 * the log, snapshot and config log files written before this module existed
 * lay it out, so existing data dirs still open. The checksum is XXH3-64 with
 * the default seed, in one-shot and streaming form (they agree).
 *
 * What this module does not do: I/O, record layouts (each format frames its
 * own records), or error messages (callers name their file and offset).
 */
#include "common/frame.h"
#include "common/bytes.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* The streaming state is libxxhash's own, behind the opaque name. */
struct kv_frame_sum_state {
	XXH3_state_t *x; /* from XXH3_createState */
};

void
kv_frame_header_init(uint8_t *h, const char magic[KV_FRAME_MAGIC_LEN], uint32_t version,
                     uint32_t size)
{
	memset(h, 0, size);
	memcpy(h, magic, KV_FRAME_MAGIC_LEN);
	kv_put32(h + 8, version);
	kv_put32(h + 12, size);
}

uint64_t
kv_frame_header_seal(uint8_t *h, uint32_t size)
{
	uint64_t sum = kv_frame_sum(h, size - 8u);

	kv_put64(h + size - 8u, sum);
	return sum;
}

kv_frame_check
kv_frame_header_check(const uint8_t *h, const char magic[KV_FRAME_MAGIC_LEN], uint32_t version,
                      uint32_t size)
{
	if (memcmp(h, magic, KV_FRAME_MAGIC_LEN) != 0)
		return KV_FRAME_BAD_MAGIC;
	if (kv_get32(h + 8) != version)
		return KV_FRAME_BAD_VERSION;
	if (kv_get32(h + 12) != size)
		return KV_FRAME_BAD_SIZE;
	if (kv_get64(h + size - 8u) != kv_frame_sum(h, size - 8u))
		return KV_FRAME_BAD_SUM;
	return KV_FRAME_OK;
}

uint32_t
kv_frame_header_version(const uint8_t *h)
{
	return kv_get32(h + 8);
}

uint32_t
kv_frame_header_size(const uint8_t *h)
{
	return kv_get32(h + 12);
}

uint64_t
kv_frame_sum(const void *p, size_t n)
{
	return XXH3_64bits(p, n);
}

kv_frame_sum_state *
kv_frame_sum_create(void)
{
	kv_frame_sum_state *st = malloc(sizeof(*st));

	if (st == NULL)
		return NULL;
	if ((st->x = XXH3_createState()) == NULL) {
		free(st);
		return NULL;
	}
	XXH3_64bits_reset(st->x);
	return st;
}

void
kv_frame_sum_destroy(kv_frame_sum_state *st)
{
	if (st == NULL)
		return;
	XXH3_freeState(st->x);
	free(st);
}

void
kv_frame_sum_reset(kv_frame_sum_state *st)
{
	XXH3_64bits_reset(st->x);
}

void
kv_frame_sum_update(kv_frame_sum_state *st, const void *p, size_t n)
{
	XXH3_64bits_update(st->x, p, n);
}

uint64_t
kv_frame_sum_digest(const kv_frame_sum_state *st)
{
	return XXH3_64bits_digest(st->x);
}
