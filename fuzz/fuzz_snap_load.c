/*
 * fuzz_snap_load.c - the snapshot loader (kv_snap_load) on a snapshot file
 * built from the input, in a fresh directory.
 *
 * Input: one control byte, then the bytes of the file, named
 * snap-<lsn>.dat after the lsn in its header (1 when that is 0 or the file
 * is shorter than a header). Control bits:
 *   0x01  fix checksums: the header checksum, the checksum of every block a
 *         reader can frame and, for the trailer, its totals, offset and
 *         checksum of checksums are recomputed, so the fuzzer gets past them
 *   0x02  also put an older snapshot (garbage) and stale .tmp files next to
 *         it, which the loader must ignore
 *
 * Checks: the counts the loader reports are those of the entries it handed
 * out, and every entry is within the format's limits.
 */
#include "common/bytes.h"
#include "common/err.h"
#include "fuzz/fuzz_util.h"
#include "shardserver/durable/snap.h"

#include <string.h>
#include <xxhash.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define BLOCK_HDR 16u
#define ENTRY_HDR 9u
#define TRAILER   0xffffffffu

typedef struct {
	uint64_t entries;
	uint64_t bytes;
} seen;

static int
cb(void *arg, uint8_t type, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	seen *s = arg;

	(void)type;
	FZ_CHECK(klen <= KV_SNAP_MAX_KEY && vlen <= KV_SNAP_MAX_VALUE);
	fz_touch(key, klen);
	fz_touch(val, vlen);
	s->entries++;
	s->bytes += klen + vlen;
	return 0;
}

/* Counts the entries of a block payload the way the loader walks them. */
static void
count_entries(const uint8_t *p, uint32_t len, uint32_t count, uint64_t *entries, uint64_t *bytes)
{
	size_t pos = 0;

	for (uint32_t i = 0; i < count && len - pos >= ENTRY_HDR; i++) {
		uint64_t k = kv_get32(p + pos + 1), v = kv_get32(p + pos + 5);
		if (k + v > len - pos - ENTRY_HDR)
			return;
		pos += ENTRY_HDR + k + v;
		(*entries)++;
		*bytes += k + v;
	}
}

static void
fix_file(uint8_t *p, size_t n)
{
	XXH3_state_t *sums;
	uint64_t off = KV_SNAP_HEADER_SIZE, entries = 0, bytes = 0;
	uint8_t b[8];

	if (n < KV_SNAP_HEADER_SIZE)
		return;
	kv_put64(p + 24, XXH3_64bits(p, 24));
	FZ_CHECK((sums = XXH3_createState()) != NULL);
	XXH3_64bits_reset(sums);
	XXH3_64bits_update(sums, p + 24, 8);
	while (n - off >= BLOCK_HDR) {
		uint8_t *h = p + off;
		uint32_t len = kv_get32(h), count = kv_get32(h + 4);
		XXH3_state_t *st;
		if (len > n - off - BLOCK_HDR)
			break;
		if (count == TRAILER && len == 32) {
			kv_put64(h + 16, entries);
			kv_put64(h + 24, bytes);
			kv_put64(h + 32, off);
			kv_put64(h + 40, XXH3_64bits_digest(sums));
		} else if (count != TRAILER) {
			count_entries(h + BLOCK_HDR, len, count, &entries, &bytes);
		}
		FZ_CHECK((st = XXH3_createState()) != NULL);
		XXH3_64bits_reset(st);
		XXH3_64bits_update(st, h, 8);
		XXH3_64bits_update(st, h + BLOCK_HDR, len);
		kv_put64(h + 8, XXH3_64bits_digest(st));
		XXH3_freeState(st);
		memcpy(b, h + 8, 8);
		XXH3_64bits_update(sums, b, 8);
		if (count == TRAILER)
			break;
		off += BLOCK_HDR + (uint64_t)len;
	}
	XXH3_freeState(sums);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char dir[256], name[64], err[1024];
	uint8_t *img;
	uint64_t lsn = 0, entries = 0, bytes = 0;
	seen s = {0};
	int ctl, rv;

	if (size < 1)
		return 0;
	ctl = data[0];
	size--;
	if ((img = malloc(size ? size : 1)) == NULL)
		return 0;
	memcpy(img, data + 1, size);
	if (ctl & 1)
		fix_file(img, size);
	lsn = size >= 24 ? kv_get64(img + 16) : 0;
	if (lsn == 0)
		lsn = 1;
	fz_tmpdir(dir, sizeof(dir));
	snprintf(name, sizeof(name), "snap-%016llx.dat", (unsigned long long)lsn);
	fz_write_file(dir, name, img, size);
	if ((ctl & 2) && lsn > 1) {
		snprintf(name, sizeof(name), "snap-%016llx.dat", (unsigned long long)(lsn - 1));
		fz_write_file(dir, name, "old", 3);
		snprintf(name, sizeof(name), "snap-%016llx.tmp", (unsigned long long)(lsn + 1));
		fz_write_file(dir, name, img, size);
		fz_write_file(dir, "snap-zzzzzzzzzzzzzzzz.dat", "x", 1);
	}
	free(img);

	rv = kv_snap_load(dir, cb, &s, &lsn, &entries, &bytes, err, sizeof(err));
	FZ_CHECK(memchr(err, 0, sizeof(err)) != NULL);
	if (rv == KV_OK)
		FZ_CHECK(entries == s.entries && bytes == s.bytes);
	else
		FZ_CHECK(lsn == 1 && (err[0] != 0 || rv == KV_ENOMEM));
	fz_rmdir(dir);
	return 0;
}
