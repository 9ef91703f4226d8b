/*
 * snap.c - snapshot files (snap.h).
 *
 * The writer packs small entries into a block buffer of KV_SNAP_BLOCK bytes
 * and writes each full block with one write(2); an entry bigger than a block
 * gets a block of its own, written straight from the caller's buffers with
 * a streaming checksum, so memory stays at one block however big the values
 * are. The first failed write removes the .tmp and makes the writer sticky
 * with that error, so no partial snapshot is ever left behind. The loader
 * reads and checks one block at a time before handing its entries out.
 *
 * Invariant: a `.dat` file is complete (header, blocks, trailer, fsynced
 * before its rename); only a `.tmp` can be partial. The file header and the
 * checksums are the shared framing of common/frame.h.
 *
 * What this module does not do: interpret entries (their types belong to
 * durable.c), walk the store, or fall back to an older snapshot.
 */
#include "shardserver/durable/snap.h"
#include "common/bytes.h"
#include "common/err.h"
#include "common/fileio.h"
#include "common/frame.h"
#include "common/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define SNAP_BLOCK_HDR   16u
#define SNAP_ENTRY_HDR   9u
#define SNAP_TRAILER     0xffffffffu
#define SNAP_TRAILER_LEN 32u
#define SNAP_NAME_LEN    25 /* "snap-" 16 hex ".dat" */
#define SNAP_MAX_ENTRY   (SNAP_ENTRY_HDR + KV_SNAP_MAX_KEY + (uint64_t)KV_SNAP_MAX_VALUE)

static const char snap_magic[8] = {'S', 'K', 'V', 'S', 'N', 'A', 'P', '\0'};

struct kv_snap_writer {
	char *dir;                /* data dir */
	char *tmp;                /* DIR/snap-<lsn>.tmp */
	char *path;               /* DIR/snap-<lsn>.dat */
	uint64_t lsn;             /* the snapshot's lsn */
	int fd;                   /* the .tmp, -1 after an error */
	uint8_t *blk;             /* block header space + payload being filled */
	size_t blen;              /* payload bytes in blk */
	uint32_t bcount;          /* entries in blk */
	uint64_t off;             /* bytes written to the file */
	uint64_t entries;         /* entries added */
	uint64_t bytes;           /* their key + value bytes */
	kv_frame_sum_state *hash; /* block checksum of a big entry */
	kv_frame_sum_state *sums; /* over the header and block checksums */
	int err;                  /* sticky write error, the .tmp is gone */
};

/* Parses "snap-<16 lower-case hex digits><ext>"; returns whether it is one. */
static bool
parse_snap_name(const char *name, const char *ext, uint64_t *lsn)
{
	uint64_t v = 0;

	if (strlen(name) != SNAP_NAME_LEN || strncmp(name, "snap-", 5) != 0 ||
	    strcmp(name + 21, ext) != 0)
		return false;
	for (int i = 5; i < 21; i++) {
		char c = name[i];
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
		if (d < 0)
			return false;
		v = (v << 4) | (uint64_t)d;
	}
	*lsn = v;
	return v > 0;
}

static char *
snap_path(const char *dir, uint64_t lsn, const char *ext)
{
	size_t n = strlen(dir) + SNAP_NAME_LEN + 2;
	char *p = malloc(n);

	if (p != NULL)
		snprintf(p, n, "%s/snap-%016llx%s", dir, (unsigned long long)lsn, ext);
	return p;
}

/* Adds a checksum to the running checksum of checksums. */
static void
add_sum(kv_frame_sum_state *sums, uint64_t sum)
{
	uint8_t b[8];

	kv_put64(b, sum);
	kv_frame_sum_update(sums, b, sizeof(b));
}

/* ---------------------------------------------------------------- writer */

static void
writer_free(kv_snap_writer *w)
{
	if (w->fd >= 0)
		close(w->fd);
	free(w->blk);
	kv_frame_sum_destroy(w->hash);
	kv_frame_sum_destroy(w->sums);
	free(w->dir);
	free(w->tmp);
	free(w->path);
	free(w);
}

/* Makes a write error sticky and removes the .tmp. Returns rv. */
static int
writer_broken(kv_snap_writer *w, int rv)
{
	if (w->err == KV_OK) {
		KV_ERROR("snap", "snapshot write failed", "file=%s offset=%llu err=%s", w->tmp,
		         (unsigned long long)w->off, kv_errname(rv));
		w->err = rv;
		if (w->fd >= 0)
			close(w->fd);
		w->fd = -1;
		unlink(w->tmp);
	}
	return w->err;
}

/* Writes one block: header (filled in here), then the payload pieces. */
static int
write_block(kv_snap_writer *w, uint8_t hdr[SNAP_BLOCK_HDR], uint32_t len, uint32_t count,
            struct iovec *parts, int nparts)
{
	struct iovec iov[5];
	uint64_t sum;
	int rv;

	kv_put32(hdr, len);
	kv_put32(hdr + 4, count);
	kv_frame_sum_reset(w->hash);
	kv_frame_sum_update(w->hash, hdr, 8);
	for (int i = 0; i < nparts; i++)
		kv_frame_sum_update(w->hash, parts[i].iov_base, parts[i].iov_len);
	sum = kv_frame_sum_digest(w->hash);
	kv_put64(hdr + 8, sum);
	iov[0] = (struct iovec){.iov_base = hdr, .iov_len = SNAP_BLOCK_HDR};
	for (int i = 0; i < nparts; i++)
		iov[i + 1] = parts[i];
	if ((rv = kv_writev_all(w->fd, iov, nparts + 1)) != KV_OK)
		return writer_broken(w, rv);
	add_sum(w->sums, sum);
	w->off += SNAP_BLOCK_HDR + (uint64_t)len;
	return KV_OK;
}

/* Writes the buffered entries as one block. */
static int
flush_block(kv_snap_writer *w)
{
	struct iovec part = {.iov_base = w->blk + SNAP_BLOCK_HDR, .iov_len = w->blen};
	int rv;

	if (w->bcount == 0)
		return KV_OK;
	rv = write_block(w, w->blk, (uint32_t)w->blen, w->bcount, &part, 1);
	w->blen = 0;
	w->bcount = 0;
	return rv;
}

static void
encode_entry_header(uint8_t *p, uint8_t type, size_t klen, size_t vlen)
{
	p[0] = type;
	kv_put32(p + 1, (uint32_t)klen);
	kv_put32(p + 5, (uint32_t)vlen);
}

int
kv_snap_begin(const char *dir, uint64_t lsn, kv_snap_writer **out, char *err, size_t errlen)
{
	uint8_t h[KV_SNAP_HEADER_SIZE] = {0};
	struct iovec iov;
	kv_snap_writer *w;
	int rv;

	if (dir == NULL || dir[0] == '\0' || lsn == 0 || out == NULL)
		return kv_errf(err, errlen, KV_EINVAL, "bad snapshot arguments");
	if ((w = calloc(1, sizeof(*w))) == NULL)
		return KV_ENOMEM;
	w->fd = -1;
	w->lsn = lsn;
	w->dir = strdup(dir);
	w->tmp = snap_path(dir, lsn, ".tmp");
	w->path = snap_path(dir, lsn, ".dat");
	w->blk = malloc(SNAP_BLOCK_HDR + KV_SNAP_BLOCK);
	w->hash = kv_frame_sum_create();
	w->sums = kv_frame_sum_create();
	if (!w->dir || !w->tmp || !w->path || !w->blk || !w->hash || !w->sums) {
		writer_free(w);
		return KV_ENOMEM;
	}
	w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (w->fd < 0) {
		rv = kv_errf(err, errlen, kv_err_from_errno(errno), "cannot create snapshot %s: %s",
		             w->tmp, strerror(errno));
		writer_free(w);
		return rv;
	}
	kv_frame_header_init(h, snap_magic, KV_SNAP_VERSION, KV_SNAP_HEADER_SIZE);
	kv_put64(h + 16, lsn);
	kv_frame_header_seal(h, KV_SNAP_HEADER_SIZE);
	iov = (struct iovec){.iov_base = h, .iov_len = sizeof(h)};
	if ((rv = kv_writev_all(w->fd, &iov, 1)) != KV_OK) {
		kv_errf(err, errlen, rv, "cannot write snapshot %s: %s", w->tmp, kv_strerror(rv));
		writer_broken(w, rv);
		writer_free(w);
		return rv;
	}
	add_sum(w->sums, kv_get64(h + 24));
	w->off = KV_SNAP_HEADER_SIZE;
	*out = w;
	return KV_OK;
}

int
kv_snap_add(kv_snap_writer *w, uint8_t type, const void *key, size_t klen, const void *val,
            size_t vlen)
{
	size_t esz;
	int rv;

	if (w->err != KV_OK)
		return w->err;
	if (klen > KV_SNAP_MAX_KEY || vlen > KV_SNAP_MAX_VALUE || (klen > 0 && key == NULL) ||
	    (vlen > 0 && val == NULL))
		return KV_EINVAL;
	esz = SNAP_ENTRY_HDR + klen + vlen;
	if (esz > KV_SNAP_BLOCK) {
		/* a block of its own, written from the caller's buffers */
		uint8_t hdr[SNAP_BLOCK_HDR], eh[SNAP_ENTRY_HDR];
		struct iovec parts[3] = {
		    {.iov_base = eh, .iov_len = sizeof(eh)},
		    {.iov_base = (void *)key, .iov_len = klen},
		    {.iov_base = (void *)val, .iov_len = vlen},
		};
		if ((rv = flush_block(w)) != KV_OK)
			return rv;
		encode_entry_header(eh, type, klen, vlen);
		if ((rv = write_block(w, hdr, (uint32_t)esz, 1, parts, 3)) != KV_OK)
			return rv;
	} else {
		uint8_t *p;
		if (w->blen + esz > KV_SNAP_BLOCK && (rv = flush_block(w)) != KV_OK)
			return rv;
		p = w->blk + SNAP_BLOCK_HDR + w->blen;
		encode_entry_header(p, type, klen, vlen);
		if (klen > 0)
			memcpy(p + SNAP_ENTRY_HDR, key, klen);
		if (vlen > 0)
			memcpy(p + SNAP_ENTRY_HDR + klen, val, vlen);
		w->blen += esz;
		w->bcount++;
	}
	w->entries++;
	w->bytes += klen + vlen;
	return KV_OK;
}

/* Removes snapshots older than keep and every .tmp file. */
static void
remove_stale(const char *dir, uint64_t keep)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	size_t removed = 0;
	uint64_t lsn;

	if (d == NULL) {
		KV_WARN("snap", "cannot list snapshot dir", "dir=%s err=\"%s\"", dir,
		        strerror(errno));
		return;
	}
	while ((e = readdir(d)) != NULL) {
		bool dat = parse_snap_name(e->d_name, ".dat", &lsn);
		if (!(dat && lsn < keep) && !parse_snap_name(e->d_name, ".tmp", &lsn))
			continue;
		if (unlinkat(dirfd(d), e->d_name, 0) == 0)
			removed++;
		else if (errno != ENOENT)
			KV_WARN("snap", "cannot remove stale snapshot", "dir=%s file=%s err=\"%s\"",
			        dir, e->d_name, strerror(errno));
	}
	closedir(d);
	if (removed > 0 && kv_fsync_dir(dir) != KV_OK)
		KV_WARN("snap", "cannot fsync snapshot dir", "dir=%s", dir);
}

int
kv_snap_commit(kv_snap_writer *w, char *err, size_t errlen)
{
	uint8_t hdr[SNAP_BLOCK_HDR], t[SNAP_TRAILER_LEN];
	struct iovec part = {.iov_base = t, .iov_len = sizeof(t)};
	int rv = w->err;

	if (rv != KV_OK) {
		kv_errf(err, errlen, rv, "cannot write snapshot %s: %s", w->tmp, kv_strerror(rv));
		writer_free(w);
		return rv;
	}
	if ((rv = flush_block(w)) != KV_OK)
		goto werr;
	kv_put64(t, w->entries);
	kv_put64(t + 8, w->bytes);
	kv_put64(t + 16, w->off);
	kv_put64(t + 24, kv_frame_sum_digest(w->sums));
	if ((rv = write_block(w, hdr, SNAP_TRAILER_LEN, SNAP_TRAILER, &part, 1)) != KV_OK)
		goto werr;
	if (fsync(w->fd) != 0) {
		rv = writer_broken(w, kv_err_from_errno(errno));
		goto werr;
	}
	close(w->fd);
	w->fd = -1;
	if (rename(w->tmp, w->path) != 0) {
		rv = writer_broken(w, kv_err_from_errno(errno));
		goto werr;
	}
	if ((rv = kv_fsync_dir(w->dir)) != KV_OK) {
		/* the snapshot is complete but maybe not durable: the caller
		 * must keep the log it covers */
		kv_errf(err, errlen, rv, "cannot fsync dir of snapshot %s: %s", w->path,
		        kv_strerror(rv));
		writer_free(w);
		return rv;
	}
	KV_INFO("snap", "wrote snapshot", "file=%s entries=%llu bytes=%llu size=%llu", w->path,
	        (unsigned long long)w->entries, (unsigned long long)w->bytes,
	        (unsigned long long)w->off);
	remove_stale(w->dir, w->lsn);
	writer_free(w);
	return KV_OK;
werr:
	kv_errf(err, errlen, rv, "cannot write snapshot %s: %s", w->tmp, kv_strerror(rv));
	writer_free(w);
	return rv;
}

void
kv_snap_abort(kv_snap_writer *w)
{
	if (w == NULL)
		return;
	if (w->err == KV_OK)
		unlink(w->tmp);
	writer_free(w);
}

/* ---------------------------------------------------------------- loader */

/* Finds the newest DIR/snap-*.dat. Returns 0 with *lsn 0 when there is none. */
static int
newest_snapshot(const char *dir, uint64_t *lsn, char *err, size_t errlen)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	uint64_t v;

	*lsn = 0;
	if (d == NULL) {
		if (errno == ENOENT)
			return KV_OK;
		return kv_errf(err, errlen, kv_err_from_errno(errno),
		               "cannot list snapshot dir %s: %s", dir, strerror(errno));
	}
	while ((e = readdir(d)) != NULL)
		if (parse_snap_name(e->d_name, ".dat", &v) && v > *lsn)
			*lsn = v;
	closedir(d);
	return KV_OK;
}

/* A loader's state, for messages. */
struct loader {
	const char *path;
	int fd;
	uint64_t size;
	char *err;
	size_t errlen;
};

static int corrupt(struct loader *l, uint64_t off, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int
corrupt(struct loader *l, uint64_t off, const char *fmt, ...)
{
	char what[160];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	return kv_errf(l->err, l->errlen, KV_ECORRUPT, "snapshot %s: %s at offset %llu", l->path,
	               what, (unsigned long long)off);
}

static int
read_at(struct loader *l, uint8_t *p, size_t n, uint64_t off)
{
	int rv = kv_pread_full(l->fd, p, n, off);

	if (rv != KV_OK)
		return kv_errf(l->err, l->errlen, rv, "cannot read snapshot %s at offset %llu: %s",
		               l->path, (unsigned long long)off, kv_strerror(rv));
	return KV_OK;
}

/* Checks the header; sets *sum to its checksum. */
static int
load_header(struct loader *l, uint64_t lsn, uint64_t *sum)
{
	uint8_t h[KV_SNAP_HEADER_SIZE];
	int rv;

	if (l->size < KV_SNAP_HEADER_SIZE)
		return corrupt(l, 0, "truncated header (file is %llu bytes)",
		               (unsigned long long)l->size);
	if ((rv = read_at(l, h, sizeof(h), 0)) != KV_OK)
		return rv;
	switch (kv_frame_header_check(h, snap_magic, KV_SNAP_VERSION, KV_SNAP_HEADER_SIZE)) {
	case KV_FRAME_OK:
		break;
	case KV_FRAME_BAD_MAGIC:
		return corrupt(l, 0, "bad magic");
	case KV_FRAME_BAD_VERSION:
	case KV_FRAME_BAD_SIZE:
		return corrupt(l, 0, "unknown version %u or header size %u",
		               kv_frame_header_version(h), kv_frame_header_size(h));
	case KV_FRAME_BAD_SUM:
		return corrupt(l, 0, "header checksum mismatch");
	}
	if (kv_get64(h + 16) != lsn)
		return corrupt(l, 0, "header lsn %llu does not match the file name",
		               (unsigned long long)kv_get64(h + 16));
	*sum = kv_get64(h + 24);
	return KV_OK;
}

/* Checks the entries of a block and hands them to cb. */
static int
load_entries(struct loader *l, uint64_t off, const uint8_t *p, uint32_t len, uint32_t count,
             kv_snap_cb cb, void *arg, uint64_t *entries, uint64_t *bytes)
{
	size_t pos = 0;

	for (uint32_t i = 0; i < count; i++) {
		uint32_t klen, vlen;
		uint8_t type;
		int rv;

		if (len - pos < SNAP_ENTRY_HDR)
			return corrupt(l, off, "block entry %u overruns the block", i);
		type = p[pos];
		klen = kv_get32(p + pos + 1);
		vlen = kv_get32(p + pos + 5);
		if (klen > KV_SNAP_MAX_KEY || vlen > KV_SNAP_MAX_VALUE ||
		    (uint64_t)klen + vlen > len - pos - SNAP_ENTRY_HDR)
			return corrupt(l, off, "block entry %u has bad lengths %u/%u", i, klen,
			               vlen);
		pos += SNAP_ENTRY_HDR;
		if (cb != NULL &&
		    (rv = cb(arg, type, p + pos, klen, p + pos + klen, vlen)) != KV_OK)
			return kv_errf(l->err, l->errlen, rv,
			               "snapshot %s: entry in block at offset %llu rejected: %s",
			               l->path, (unsigned long long)off, kv_strerror(rv));
		pos += (size_t)klen + vlen;
		(*entries)++;
		*bytes += (uint64_t)klen + vlen;
	}
	if (pos != len)
		return corrupt(l, off, "block has %zu bytes after its %u entries", len - pos,
		               count);
	return KV_OK;
}

static int
load_blocks(struct loader *l, kv_snap_cb cb, void *arg, uint64_t hsum, uint64_t *entries,
            uint64_t *bytes)
{
	kv_frame_sum_state *hash = kv_frame_sum_create(), *sums = kv_frame_sum_create();
	uint64_t off = KV_SNAP_HEADER_SIZE;
	uint8_t *buf = NULL;
	size_t cap = 0;
	int rv = KV_OK;

	if (hash == NULL || sums == NULL) {
		rv = KV_ENOMEM;
		goto out;
	}
	add_sum(sums, hsum);
	for (;;) {
		uint8_t h[SNAP_BLOCK_HDR];
		uint32_t len, count;
		uint64_t sum, max;

		if (off == l->size) {
			rv = corrupt(l, off, "missing trailer");
			break;
		}
		if (l->size - off < SNAP_BLOCK_HDR) {
			rv = corrupt(l, off, "truncated block header");
			break;
		}
		if ((rv = read_at(l, h, sizeof(h), off)) != KV_OK)
			break;
		len = kv_get32(h);
		count = kv_get32(h + 4);
		sum = kv_get64(h + 8);
		if (count == SNAP_TRAILER)
			max = SNAP_TRAILER_LEN;
		else if (count == 1)
			max = SNAP_MAX_ENTRY;
		else
			max = KV_SNAP_BLOCK;
		if (count == 0 || len > max || (count == SNAP_TRAILER && len != SNAP_TRAILER_LEN) ||
		    (count != SNAP_TRAILER && (uint64_t)len < (uint64_t)count * SNAP_ENTRY_HDR)) {
			rv = corrupt(l, off, "bad block length %u or entry count %u", len, count);
			break;
		}
		if ((uint64_t)len > l->size - off - SNAP_BLOCK_HDR) {
			rv = corrupt(l, off, "truncated block (%u bytes, %llu left)", len,
			             (unsigned long long)(l->size - off - SNAP_BLOCK_HDR));
			break;
		}
		if (len > cap) {
			uint8_t *nb = realloc(buf, len);
			if (nb == NULL) {
				rv = KV_ENOMEM;
				break;
			}
			buf = nb;
			cap = len;
		}
		if (len > 0 && (rv = read_at(l, buf, len, off + SNAP_BLOCK_HDR)) != KV_OK)
			break;
		kv_frame_sum_reset(hash);
		kv_frame_sum_update(hash, h, 8);
		kv_frame_sum_update(hash, buf, len);
		if (kv_frame_sum_digest(hash) != sum) {
			rv = corrupt(l, off, "block checksum mismatch");
			break;
		}
		if (count == SNAP_TRAILER) {
			if (kv_get64(buf) != *entries || kv_get64(buf + 8) != *bytes ||
			    kv_get64(buf + 16) != off ||
			    kv_get64(buf + 24) != kv_frame_sum_digest(sums))
				rv = corrupt(l, off, "trailer does not match the blocks");
			else if (off + SNAP_BLOCK_HDR + SNAP_TRAILER_LEN != l->size)
				rv = corrupt(l, off + SNAP_BLOCK_HDR + SNAP_TRAILER_LEN,
				             "data after the trailer");
			break;
		}
		rv = load_entries(l, off, buf, len, count, cb, arg, entries, bytes);
		if (rv != KV_OK)
			break;
		add_sum(sums, sum);
		off += SNAP_BLOCK_HDR + (uint64_t)len;
	}
out:
	free(buf);
	kv_frame_sum_destroy(hash);
	kv_frame_sum_destroy(sums);
	return rv;
}

int
kv_snap_load(const char *dir, kv_snap_cb cb, void *arg, uint64_t *lsn, uint64_t *entries,
             uint64_t *bytes, char *err, size_t errlen)
{
	struct loader l = {.fd = -1, .err = err, .errlen = errlen};
	uint64_t newest, n = 0, b = 0, hsum = 0;
	struct stat st;
	char *path = NULL;
	int rv;

	if (lsn)
		*lsn = 1;
	if (entries)
		*entries = 0;
	if (bytes)
		*bytes = 0;
	if (err && errlen)
		err[0] = '\0';
	if (dir == NULL)
		return kv_errf(err, errlen, KV_EINVAL, "no snapshot dir given");
	if ((rv = newest_snapshot(dir, &newest, err, errlen)) != KV_OK || newest == 0)
		return rv;
	if ((path = snap_path(dir, newest, ".dat")) == NULL)
		return KV_ENOMEM;
	l.path = path;
	l.fd = open(path, O_RDONLY | O_CLOEXEC);
	if (l.fd < 0 || fstat(l.fd, &st) != 0) {
		rv = kv_errf(err, errlen, kv_err_from_errno(errno), "cannot open snapshot %s: %s",
		             path, strerror(errno));
		goto out;
	}
	l.size = (uint64_t)st.st_size;
	if ((rv = load_header(&l, newest, &hsum)) != KV_OK)
		goto out;
	if ((rv = load_blocks(&l, cb, arg, hsum, &n, &b)) != KV_OK)
		goto out;
	if (lsn)
		*lsn = newest;
	if (entries)
		*entries = n;
	if (bytes)
		*bytes = b;
out:
	if (l.fd >= 0)
		close(l.fd);
	free(path);
	return rv;
}
