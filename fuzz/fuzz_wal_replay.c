/*
 * fuzz_wal_replay.c - the write-ahead log reader (kv_wal_replay) on
 * segment files built from the input, in a fresh directory.
 *
 * Input: one control byte, then the bytes of one or more segment files,
 * back to back; every later occurrence of the segment magic "SKVWAL\0\0"
 * starts the next file (at most 4). A file is named after the first lsn in
 * its header (wal-<lsn>.log), or after the previous one + 1 (the next free
 * one) when that is 0, missing or taken. Control bits:
 *   0x01  fix checksums: the header checksum and those of the records a
 *         reader can frame are recomputed, so the fuzzer gets past them
 *   0x02  fix lsns: records are renumbered from the header's first lsn
 *   0x04  truncate_corrupt (--wal-truncate-corrupt)
 *   0x38  from_lsn - 1 (0..7)
 *   0x40  recycled: every header gets version 2 (a recycled segment, whose
 *         own records may be followed by older ones); with 0x02 the second
 *         half of each segment's records is numbered below its first lsn,
 *         as the older records of a reused file are
 *
 * Checks: records come in lsn order, contiguous, from from_lsn; the report
 * matches them; without truncate_corrupt an error changes no file and a
 * success changes at most the last segment (torn tail or torn creation);
 * and with from_lsn 1 (every segment read) a successful replay leaves a log
 * that replays again to the same records with nothing more to cut.
 */
#include "common/bytes.h"
#include "common/err.h"
#include "fuzz/fuzz_util.h"
#include "shardserver/durable/wal.h"

#include <string.h>
#include <sys/stat.h>
#include <xxhash.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_SEGS 4

static const uint8_t magic[8] = {'S', 'K', 'V', 'W', 'A', 'L', 0, 0};

typedef struct {
	uint64_t from;   /* from_lsn */
	uint64_t n;      /* records seen */
	uint64_t first;  /* lsn of the first */
	uint64_t last;   /* lsn of the last */
	uint64_t bytes;  /* payload bytes */
	uint64_t digest; /* of every (lsn, payload) */
} seen;

static int
cb(void *arg, uint64_t lsn, const uint8_t *p, size_t n)
{
	seen *s = arg;

	FZ_CHECK(n >= 1 && n <= KV_WAL_MAX_RECORD);
	FZ_CHECK(lsn >= s->from);
	if (s->n == 0)
		s->first = lsn;
	else
		FZ_CHECK(lsn == s->last + 1);
	s->last = lsn;
	s->n++;
	s->bytes += n;
	s->digest = XXH3_64bits_withSeed(p, n, s->digest ^ lsn);
	return 0;
}

/* Counts the records a reader can frame in one segment image. */
static size_t
count_framed(const uint8_t *p, size_t n)
{
	size_t off = KV_WAL_HEADER_SIZE, k = 0;

	while (n - off >= KV_WAL_RECORD_HEADER) {
		uint32_t len = kv_get32(p + off + 8);
		if (len == 0 || len > n - off - KV_WAL_RECORD_HEADER)
			break;
		off += KV_WAL_RECORD_HEADER + len;
		k++;
	}
	return k;
}

/* Recomputes checksums (and lsns) of one segment image in place; recycled
 * sets the header's version to 2 and numbers the second half of the
 * records as older ones. */
static void
fix_segment(uint8_t *p, size_t n, int fix_sums, int fix_lsns, int recycled)
{
	uint64_t lsn, first;
	size_t off = KV_WAL_HEADER_SIZE, k = 0, half;

	if (n < KV_WAL_HEADER_SIZE)
		return;
	if (recycled)
		kv_put32(p + 8, KV_WAL_VERSION_RECYCLED);
	if (fix_sums)
		kv_put64(p + 24, XXH3_64bits(p, 24));
	first = lsn = kv_get64(p + 16);
	half = recycled ? (count_framed(p, n) + 1) / 2 : SIZE_MAX;
	while (n - off >= KV_WAL_RECORD_HEADER) {
		uint32_t len = kv_get32(p + off + 8);
		if (len == 0 || len > n - off - KV_WAL_RECORD_HEADER)
			break;
		if (fix_lsns && k++ == half)
			lsn = first > 1000 ? first - 1000 : 0;
		if (fix_lsns)
			kv_put64(p + off + 16, lsn++);
		if (fix_sums)
			kv_put64(p + off, XXH3_64bits(p + off + 8, 16 + (size_t)len));
		off += KV_WAL_RECORD_HEADER + len;
	}
}

static int
taken(const uint64_t *names, size_t n, uint64_t first)
{
	for (size_t i = 0; i < n; i++)
		if (names[i] == first)
			return 1;
	return 0;
}

static size_t
find_magic(const uint8_t *p, size_t n, size_t from)
{
	for (size_t i = from; i + sizeof(magic) <= n; i++)
		if (p[i] == 'S' && memcmp(p + i, magic, sizeof(magic)) == 0)
			return i;
	return n;
}

/* Returns the size of dir/wal-<first>.log, -1 when it does not exist. */
static long long
seg_size(const char *dir, uint64_t first)
{
	char path[512];
	struct stat st;

	snprintf(path, sizeof(path), "%s/wal-%016llx.log", dir, (unsigned long long)first);
	return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

static int
replay(const char *dir, uint64_t from, int cut, seen *s, kv_wal_report *rep)
{
	char err[1024];
	int rv;

	memset(s, 0, sizeof(*s));
	s->from = from;
	rv = kv_wal_replay(dir, from, cut, cb, s, rep, err, sizeof(err));
	FZ_CHECK(memchr(err, 0, sizeof(err)) != NULL);
	if (rv != KV_OK)
		return rv;
	FZ_CHECK(rep->records == s->n && rep->bytes == s->bytes);
	if (s->n) {
		FZ_CHECK(s->first == from);
		FZ_CHECK(rep->next_lsn == s->last + 1);
	} else {
		FZ_CHECK(rep->next_lsn >= from);
	}
	return rv;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char dir[256], name[64];
	uint8_t *img;
	uint64_t names[MAX_SEGS], from, last = 0;
	long long sizes[MAX_SEGS];
	size_t nseg = 0, pos;
	int ctl, rv;
	seen s1, s2;
	kv_wal_report r1, r2;

	if (size < 1)
		return 0;
	ctl = data[0];
	from = 1 + (uint64_t)((ctl >> 3) & 7);
	size--;
	if ((img = malloc(size ? size : 1)) == NULL)
		return 0;
	memcpy(img, data + 1, size);
	fz_tmpdir(dir, sizeof(dir));
	pos = 0;
	while (nseg < MAX_SEGS && (pos < size || nseg == 0)) {
		size_t end = nseg + 1 < MAX_SEGS ? find_magic(img, size, pos + 1) : size;
		uint8_t *p = img + pos;
		size_t n = end - pos;
		uint64_t first = n >= 24 ? kv_get64(p + 16) : 0;
		if (first == 0 || taken(names, nseg, first))
			first = nseg ? names[nseg - 1] + 1 : 1;
		while (first == 0 || taken(names, nseg, first))
			first++;
		fix_segment(p, n, ctl & 1, ctl & 2, ctl & 0x40);
		snprintf(name, sizeof(name), "wal-%016llx.log", (unsigned long long)first);
		fz_write_file(dir, name, p, n);
		sizes[nseg] = (long long)n;
		names[nseg++] = first;
		if (first > last)
			last = first;
		pos = end;
	}
	free(img);

	rv = replay(dir, from, (ctl & 4) != 0, &s1, &r1);
	if (!(ctl & 4))
		for (size_t i = 0; i < nseg; i++)
			if (rv != KV_OK || names[i] != last)
				FZ_CHECK(seg_size(dir, names[i]) == sizes[i]);
	if (rv == KV_OK && from == 1) {
		rv = replay(dir, from, (ctl & 4) != 0, &s2, &r2);
		FZ_CHECK(rv == KV_OK);
		FZ_CHECK(!r2.torn);
		FZ_CHECK(s2.n == s1.n && s2.digest == s1.digest && r2.next_lsn == r1.next_lsn);
	}
	fz_rmdir(dir);
	return 0;
}
