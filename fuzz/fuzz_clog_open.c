/*
 * fuzz_clog_open.c - the controller's config log reader (kv_clog_open) on a
 * config.log built from the input, in a fresh directory, with the record
 * callback the controller uses (every record a packed Config, epochs
 * 1, 2, 3, ... in order; kv_ctl__replay_cb in controller/history.c).
 *
 * Input: one control byte, then the bytes of the file. Control bit 0x01
 * fixes checksums: the header checksum and those of the records a reader
 * can frame are recomputed, so the fuzzer gets past them.
 *
 * Checks: a failed open changes nothing; only a torn last append may be
 * cut off (clog.h): no intact
 * record may start in the bytes a successful open dropped; after a
 * successful open the log takes one more record, and opening it again
 * replays exactly the records seen before plus that one, with nothing left
 * to cut.
 */
#include "common/bytes.h"
#include "common/config.h"
#include "common/err.h"
#include "common/key.h"
#include "proto/config_codec.h"
#include "controller/clog.h"
#include "fuzz/fuzz_util.h"

#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_HIST 64

typedef struct {
	kv_config *hist[MAX_HIST];
	size_t nhist;
	size_t nrec;
} history;

/* As the controller's replay_cb: a packed configuration, next epoch. */
static int
cb(void *arg, const uint8_t *p, size_t n, uint64_t offset)
{
	history *h = arg;
	kv_config *cfg;
	int rv;

	(void)offset;
	FZ_CHECK(n >= 1 && n <= KV_CLOG_MAX_RECORD);
	h->nrec++;
	if ((rv = kv_codec_config_unpack(p, n, &cfg)) != KV_OK)
		return rv == KV_ENOMEM ? rv : KV_ECORRUPT;
	if (cfg->epoch != h->nhist + 1 || h->nhist == MAX_HIST) {
		kv_config_free(cfg);
		return KV_ECORRUPT;
	}
	h->hist[h->nhist++] = cfg;
	return KV_OK;
}

static void
hist_free(history *h)
{
	for (size_t i = 0; i < h->nhist; i++)
		kv_config_free(h->hist[i]);
	memset(h, 0, sizeof(*h));
}

static void
fix_file(uint8_t *p, size_t n)
{
	size_t off = KV_CLOG_HEADER_SIZE;

	if (n < KV_CLOG_HEADER_SIZE)
		return;
	kv_put64(p + 40, kv_hash64(p, 40));
	while (n - off >= 12) {
		uint32_t len = kv_get32(p + off);
		if (len == 0 || len > KV_CLOG_MAX_RECORD || len > n - off - 12)
			break;
		kv_put64(p + off + 4, kv_hash64(p + off, 4) ^ kv_hash64(p + off + 12, len));
		off += 12 + (size_t)len;
	}
}

/* Returns whether an intact record (a length that fits, a matching
 * checksum) starts anywhere in p[from, n). */
static int
intact_record_in(const uint8_t *p, size_t n, size_t from)
{
	for (size_t off = from; off + 12 <= n; off++) {
		uint32_t len = kv_get32(p + off);
		if (len == 0 || len > KV_CLOG_MAX_RECORD || len > n - off - 12)
			continue;
		if (kv_get64(p + off + 4) == (kv_hash64(p + off, 4) ^ kv_hash64(p + off + 12, len)))
			return 1;
	}
	return 0;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char dir[256], err[1024];
	uint8_t *img;
	history h1 = {0}, h2 = {0};
	kv_clog_info i1, i2;
	kv_clog *l = NULL;
	kv_config *next;
	kv_buf rec = {0};
	int rv;

	if (size < 1)
		return 0;
	size--;
	if ((img = malloc(size ? size : 1)) == NULL)
		return 0;
	memcpy(img, data + 1, size);
	if (data[0] & 1)
		fix_file(img, size);
	fz_tmpdir(dir, sizeof(dir));
	fz_write_file(dir, KV_CLOG_FILE, img, size);

	err[0] = 0;
	rv = kv_clog_open(dir, cb, &h1, &l, &i1, err, sizeof(err));
	FZ_CHECK(memchr(err, 0, sizeof(err)) != NULL);
	if (rv != KV_OK) {
		struct stat st;
		char path[512];
		FZ_CHECK(err[0] != 0 || rv == KV_ENOMEM);
		snprintf(path, sizeof(path), "%s/%s", dir, KV_CLOG_FILE);
		FZ_CHECK(stat(path, &st) == 0 && (size_t)st.st_size == size);
		goto out;
	}
	FZ_CHECK(i1.records == h1.nrec && h1.nrec == h1.nhist);
	FZ_CHECK(strlen(kv_clog_cluster_id(l)) <= 24);
	FZ_CHECK(i1.dropped_bytes <= size);
	if (i1.dropped_bytes > 0 && !i1.created)
		FZ_CHECK(!intact_record_in(img, size, size - i1.dropped_bytes + 1));

	/* One more configuration, as the controller would publish it. */
	FZ_CHECK((next = kv_config_new()) != NULL);
	next->epoch = h1.nhist + 1;
	FZ_CHECK(kv_codec_config_pack(next, &rec) == KV_OK);
	kv_config_free(next);
	FZ_CHECK(kv_clog_append(l, rec.data, rec.len) == KV_OK);
	kv_buf_fini(&rec);
	kv_clog_close(l);
	l = NULL;

	if (h1.nhist < MAX_HIST) {
		rv = kv_clog_open(dir, cb, &h2, &l, &i2, err, sizeof(err));
		if (rv != KV_OK)
			fprintf(stderr, "reopen: %s\n", err);
		FZ_CHECK(rv == KV_OK);
		FZ_CHECK(i2.records == i1.records + 1 && i2.dropped_bytes == 0 && !i2.created);
		FZ_CHECK(h2.nhist == h1.nhist + 1);
		kv_clog_close(l);
	}
out:
	free(img);
	hist_free(&h1);
	hist_free(&h2);
	fz_rmdir(dir);
	return 0;
}
