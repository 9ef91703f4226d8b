/*
 * clog.c - the configuration log (clog.h).
 *
 * The whole file is read at open (configurations are small and few), checked
 * record by record, and then only appended to. Every append is one write(2)
 * of the framed record followed by fsync(2); a failed append truncates the
 * file back so the log never holds a half record that later records follow.
 * The invariant: bytes [0, size) of the file are a valid header followed by
 * intact records.
 */
#include "controller/clog.h"
#include "common/bytes.h"
#include "common/err.h"
#include "common/fileio.h"
#include "common/frame.h"
#include "common/key.h"
#include "common/log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static const char clog_magic[8] = {'S', 'K', 'V', 'C', 'L', 'O', 'G', '\0'};

#define CLOG_REC_HDR 12u /* length and checksum before each payload */

struct kv_clog {
	int fd;           /* the open, locked log file */
	uint64_t size;    /* bytes of valid data (header + intact records) */
	bool broken;      /* a failed append could not be undone: refuse appends */
	char cluster[25]; /* cluster id from the header */
	char *path;       /* DIR/config.log */
};

/* Returns a record's checksum: that of its 4-byte length field XOR that of
 * its payload (clog.h). */
static uint64_t
rec_sum(const uint8_t *len_field, const void *p, size_t n)
{
	return kv_frame_sum(len_field, 4) ^ kv_frame_sum(p, n);
}

static void
random_id(char out[25])
{
	uint8_t b[8] = {0};
	int fd = open("/dev/urandom", O_RDONLY);
	uint64_t v;

	if (fd >= 0) {
		if (read(fd, b, sizeof(b)) != (ssize_t)sizeof(b))
			memset(b, 0, sizeof(b));
		close(fd);
	}
	v = kv_get64(b) ^ kv_now_ns() ^ ((uint64_t)getpid() << 32);
	memset(out, 0, 25);
	snprintf(out, 25, "%016llx", (unsigned long long)v);
}

/* Writes a fresh header at offset 0 of an empty file and makes it durable,
 * with the directory entry. */
static int
init_file(kv_clog *l, const char *dir, char *err, size_t errlen)
{
	uint8_t h[KV_CLOG_HEADER_SIZE];
	int rv = KV_OK;

	random_id(l->cluster);
	kv_frame_header_init(h, clog_magic, KV_CLOG_VERSION, KV_CLOG_HEADER_SIZE);
	memcpy(h + 16, l->cluster, 24);
	kv_frame_header_seal(h, KV_CLOG_HEADER_SIZE);
	if (ftruncate(l->fd, 0) != 0 || lseek(l->fd, 0, SEEK_SET) != 0)
		rv = kv_err_from_errno(errno);
	if (rv == KV_OK)
		rv = kv_write_all(l->fd, h, sizeof(h));
	if (rv == KV_OK && fsync(l->fd) != 0)
		rv = kv_err_from_errno(errno);
	if (rv == KV_OK)
		rv = kv_fsync_dir(dir);
	if (rv != KV_OK)
		return kv_errf(err, errlen, rv, "cannot initialise config log %s: %s", l->path,
		               kv_strerror(rv));
	l->size = KV_CLOG_HEADER_SIZE;
	return KV_OK;
}

static int
read_file(int fd, uint8_t **out, size_t *outlen)
{
	struct stat st;
	uint8_t *buf;
	size_t n = 0;

	if (fstat(fd, &st) != 0)
		return kv_err_from_errno(errno);
	buf = malloc(st.st_size > 0 ? (size_t)st.st_size : 1);
	if (buf == NULL)
		return KV_ENOMEM;
	while (n < (size_t)st.st_size) {
		ssize_t r = pread(fd, buf + n, (size_t)st.st_size - n, (off_t)n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	*out = buf;
	*outlen = n;
	return KV_OK;
}

static bool
all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != 0)
			return false;
	return true;
}

/* Returns whether an intact record (a length that fits the file, a matching
 * checksum) starts anywhere in b[from, n). */
static bool
intact_after(const uint8_t *b, size_t n, size_t from)
{
	for (size_t off = from; off < n && n - off >= CLOG_REC_HDR; off++) {
		uint32_t len = kv_get32(b + off);
		if (len == 0 || len > KV_CLOG_MAX_RECORD || (size_t)len > n - off - CLOG_REC_HDR)
			continue;
		if (kv_get64(b + off + 4) == rec_sum(b + off, b + off + CLOG_REC_HDR, len))
			return true;
	}
	return false;
}

/* Checks the header and replays the records; sets l->size to the end of the
 * last intact record. */
static int
replay(kv_clog *l, const uint8_t *b, size_t n, kv_clog_record_cb cb, void *arg, kv_clog_info *info,
       char *err, size_t errlen)
{
	size_t off = KV_CLOG_HEADER_SIZE;

	switch (kv_frame_header_check(b, clog_magic, KV_CLOG_VERSION, KV_CLOG_HEADER_SIZE)) {
	case KV_FRAME_OK:
		break;
	case KV_FRAME_BAD_MAGIC:
		return kv_errf(err, errlen, KV_EINVAL, "%s is not a shardkv config log (bad magic)",
		               l->path);
	case KV_FRAME_BAD_VERSION:
		return kv_errf(err, errlen, KV_EINVAL,
		               "%s has format version %u; this controller reads version %u",
		               l->path, kv_frame_header_version(b), KV_CLOG_VERSION);
	case KV_FRAME_BAD_SIZE:
	case KV_FRAME_BAD_SUM:
		return kv_errf(err, errlen, KV_ECORRUPT,
		               "config log %s: corrupt header at offset 0 (checksum mismatch)",
		               l->path);
	}
	memcpy(l->cluster, b + 16, 24);
	l->cluster[24] = '\0';
	while (off < n) {
		size_t left = n - off;
		uint32_t len;
		bool torn;
		if (left < CLOG_REC_HDR)
			break; /* torn frame header */
		len = kv_get32(b + off);
		if (len == 0 || len > KV_CLOG_MAX_RECORD) {
			if (all_zero(b + off, left))
				break; /* zero-filled tail of an interrupted append */
			return kv_errf(
			    err, errlen, KV_ECORRUPT,
			    "config log %s: corrupt record at offset %zu (bad length %u)", l->path,
			    off, len);
		}
		/* A last record that runs past the end or fails its checksum
		 * where the file ends is a torn append, cut off below - unless
		 * an intact record follows it anywhere: then its length field
		 * is damaged, and cutting would drop the records after it. */
		torn = (size_t)len > left - CLOG_REC_HDR;
		if (!torn &&
		    kv_get64(b + off + 4) != rec_sum(b + off, b + off + CLOG_REC_HDR, len)) {
			if (off + CLOG_REC_HDR + len != n)
				return kv_errf(err, errlen, KV_ECORRUPT,
				               "config log %s: corrupt record at offset %zu "
				               "(checksum mismatch)",
				               l->path, off);
			torn = true;
		}
		if (torn) {
			if (intact_after(b, n, off + 1))
				return kv_errf(
				    err, errlen, KV_ECORRUPT,
				    "config log %s: corrupt record at offset %zu (bad length "
				    "%u or checksum, and intact records follow)",
				    l->path, off, len);
			break; /* the last append did not reach the disk whole */
		}
		if (cb != NULL) {
			int rv = cb(arg, b + off + CLOG_REC_HDR, len, off);
			if (rv != KV_OK)
				return kv_errf(err, errlen, rv,
				               "config log %s: record at offset %zu rejected: %s",
				               l->path, off, kv_strerror(rv));
		}
		info->records++;
		off += CLOG_REC_HDR + len;
	}
	l->size = off;
	info->dropped_bytes = n - off;
	return KV_OK;
}

int
kv_clog_open(const char *dir, kv_clog_record_cb cb, void *arg, kv_clog **out, kv_clog_info *info,
             char *err, size_t errlen)
{
	kv_clog_info dummy;
	kv_clog *l;
	struct stat st;
	uint8_t *buf = NULL;
	size_t n = 0;
	int rv;

	if (info == NULL)
		info = &dummy;
	memset(info, 0, sizeof(*info));
	if (dir == NULL || dir[0] == '\0')
		return kv_errf(err, errlen, KV_EINVAL, "no data dir given");
	if (stat(dir, &st) != 0) {
		if (errno != ENOENT || mkdir(dir, 0755) != 0)
			return kv_errf(err, errlen, kv_err_from_errno(errno),
			               "cannot create data dir %s: %s", dir, strerror(errno));
		kv_fsync_parent(dir);
	} else if (!S_ISDIR(st.st_mode)) {
		return kv_errf(err, errlen, KV_EINVAL, "data dir %s is not a directory", dir);
	}
	if ((l = calloc(1, sizeof(*l))) == NULL)
		return KV_ENOMEM;
	l->fd = -1;
	if ((l->path = malloc(strlen(dir) + sizeof(KV_CLOG_FILE) + 1)) == NULL) {
		rv = KV_ENOMEM;
		goto err;
	}
	sprintf(l->path, "%s/%s", dir, KV_CLOG_FILE);
	l->fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (l->fd < 0) {
		rv = kv_errf(err, errlen, kv_err_from_errno(errno), "cannot open config log %s: %s",
		             l->path, strerror(errno));
		goto err;
	}
	if (flock(l->fd, LOCK_EX | LOCK_NB) != 0) {
		rv = kv_errf(
		    err, errlen, errno == EWOULDBLOCK ? KV_EBUSY : kv_err_from_errno(errno),
		    "config log %s is locked: another controller uses data dir %s", l->path, dir);
		goto err;
	}
	if ((rv = read_file(l->fd, &buf, &n)) != KV_OK) {
		kv_errf(err, errlen, rv, "cannot read config log %s: %s", l->path, kv_strerror(rv));
		goto err;
	}
	if (n < KV_CLOG_HEADER_SIZE) {
		if (memcmp(buf, clog_magic, n < 8 ? n : 8) != 0) {
			rv = kv_errf(err, errlen, KV_EINVAL,
			             "%s is not a shardkv config log (bad magic)", l->path);
			goto err;
		}
		if (n > 0)
			KV_WARN("clog", "re-initialising truncated config log header",
			        "file=%s size=%zu", l->path, n);
		if ((rv = init_file(l, dir, err, errlen)) != KV_OK)
			goto err;
		info->created = 1;
	} else {
		if ((rv = replay(l, buf, n, cb, arg, info, err, errlen)) != KV_OK)
			goto err;
		if (info->dropped_bytes > 0) {
			KV_WARN("clog", "dropped torn tail of config log",
			        "file=%s offset=%llu bytes=%llu", l->path,
			        (unsigned long long)l->size,
			        (unsigned long long)info->dropped_bytes);
			if (ftruncate(l->fd, (off_t)l->size) != 0 || fsync(l->fd) != 0) {
				rv = kv_errf(err, errlen, kv_err_from_errno(errno),
				             "cannot truncate config log %s: %s", l->path,
				             strerror(errno));
				goto err;
			}
		}
	}
	free(buf);
	if (lseek(l->fd, (off_t)l->size, SEEK_SET) < 0) {
		rv = kv_errf(err, errlen, kv_err_from_errno(errno), "cannot seek in %s: %s",
		             l->path, strerror(errno));
		buf = NULL;
		goto err;
	}
	*out = l;
	return KV_OK;
err:
	free(buf);
	kv_clog_close(l);
	return rv;
}

int
kv_clog_append(kv_clog *l, const void *p, size_t n)
{
	uint8_t hdr[CLOG_REC_HDR];
	uint8_t *frame;
	int rv;

	if (n == 0 || n > KV_CLOG_MAX_RECORD)
		return KV_EINVAL;
	if (l->broken)
		return KV_EIO;
	if ((frame = malloc(CLOG_REC_HDR + n)) == NULL)
		return KV_ENOMEM;
	kv_put32(hdr, (uint32_t)n);
	kv_put64(hdr + 4, rec_sum(hdr, p, n));
	memcpy(frame, hdr, CLOG_REC_HDR);
	memcpy(frame + CLOG_REC_HDR, p, n);
	rv = kv_write_all(l->fd, frame, CLOG_REC_HDR + n);
	free(frame);
	if (rv == KV_OK && fsync(l->fd) != 0)
		rv = kv_err_from_errno(errno);
	if (rv != KV_OK) {
		if (ftruncate(l->fd, (off_t)l->size) != 0 ||
		    lseek(l->fd, (off_t)l->size, SEEK_SET) < 0)
			l->broken = true;
		KV_ERROR("clog", "config log append failed", "file=%s err=%s", l->path,
		         kv_strerror(rv));
		return rv;
	}
	l->size += CLOG_REC_HDR + n;
	return KV_OK;
}

const char *
kv_clog_cluster_id(const kv_clog *l)
{
	return l->cluster;
}

const char *
kv_clog_path(const kv_clog *l)
{
	return l->path;
}

void
kv_clog_close(kv_clog *l)
{
	if (l == NULL)
		return;
	if (l->fd >= 0)
		close(l->fd);
	free(l->path);
	free(l);
}
