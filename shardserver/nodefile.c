/*
 * nodefile.c - the node file of a shard server's data dir: the identity
 * (node id, cluster id) that survives a restart (nodefile.h). It knows
 * nothing of the server; the server reads it at create and writes it when
 * it registers or learns its cluster.
 *
 * Layout:
 *
 *   offset  size  field
 *   0       4     magic "SKVN"
 *   4       4     format version, 1 (little endian, as every integer here)
 *   8       4     node id
 *   12      4     cluster id length n (< 128)
 *   16      n     cluster id bytes
 *   16+n    8     xxh3-64 of bytes [0, 16+n)
 *
 * Written to node.id.tmp, fsynced, renamed over node.id, directory fsynced.
 *
 * The boot file, boot.id (doc/replication.md "After a restart"), written the
 * same way:
 *
 *   offset  size  field
 *   0       4     magic "SKVB"
 *   4       4     format version, 1
 *   8       8     boot id
 *   16      8     xxh3-64 of bytes [0, 16)
 */
#include "shardserver/nodefile.h"
#include "common/err.h"
#include "common/key.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NODEFILE_MAGIC   "SKVN"
#define NODEFILE_VERSION 1u

static void
put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t
get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void
put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t
get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

int
kv_nodefile_load(const char *dir, uint32_t *id, char *cluster, size_t clen)
{
	char path[4096];
	uint8_t buf[16 + 128 + 8];
	ssize_t n;
	int fd, rv = KV_ECORRUPT;

	snprintf(path, sizeof(path), "%s/node.id", dir);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return errno == ENOENT ? KV_ENOTFOUND : KV_EIO;
	n = read(fd, buf, sizeof(buf));
	close(fd);
	if (n < 24 || memcmp(buf, NODEFILE_MAGIC, 4) != 0 || get32(buf + 4) != NODEFILE_VERSION)
		return rv;
	uint32_t cl = get32(buf + 12);
	if (cl >= 128 || (size_t)n != 16 + cl + 8 || cl >= clen)
		return rv;
	if (get64(buf + 16 + cl) != kv_hash64(buf, 16 + cl))
		return rv;
	*id = get32(buf + 8);
	memcpy(cluster, buf + 16, cl);
	cluster[cl] = '\0';
	return KV_OK;
}

/* Writes n bytes of buf to dir/name via name.tmp, fsync, rename and a
 * directory fsync. */
static int
save_atomic(const char *dir, const char *name, const uint8_t *buf, size_t n)
{
	char path[4096], tmp[4096];
	int fd, rv = KV_OK;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	snprintf(tmp, sizeof(tmp), "%s/%s.tmp", dir, name);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return kv_err_from_errno(errno);
	if (write(fd, buf, n) != (ssize_t)n || fsync(fd) != 0)
		rv = kv_err_from_errno(errno ? errno : EIO);
	close(fd);
	if (rv == 0 && rename(tmp, path) != 0)
		rv = kv_err_from_errno(errno);
	if (rv == 0 && (fd = open(dir, O_RDONLY | O_DIRECTORY)) >= 0) {
		if (fsync(fd) != 0)
			rv = kv_err_from_errno(errno);
		close(fd);
	}
	return rv;
}

#define BOOTFILE_MAGIC   "SKVB"
#define BOOTFILE_VERSION 1u

void
kv_bootfile_load(const char *dir, uint64_t *boot)
{
	char path[4096];
	uint8_t buf[25];
	ssize_t n;
	int fd;

	*boot = 0;
	snprintf(path, sizeof(path), "%s/boot.id", dir);
	if ((fd = open(path, O_RDONLY)) < 0)
		return;
	n = read(fd, buf, sizeof(buf));
	close(fd);
	if (n != 24 || memcmp(buf, BOOTFILE_MAGIC, 4) != 0 || get32(buf + 4) != BOOTFILE_VERSION ||
	    get64(buf + 16) != kv_hash64(buf, 16))
		return;
	*boot = get64(buf + 8);
}

int
kv_bootfile_save(const char *dir, uint64_t boot)
{
	uint8_t buf[24];

	memcpy(buf, BOOTFILE_MAGIC, 4);
	put32(buf + 4, BOOTFILE_VERSION);
	put64(buf + 8, boot);
	put64(buf + 16, kv_hash64(buf, 16));
	return save_atomic(dir, "boot.id", buf, sizeof(buf));
}

int
kv_nodefile_save(const char *dir, uint32_t id, const char *cluster)
{
	uint8_t buf[16 + 128 + 8];
	size_t cl = strlen(cluster);

	if (cl >= 128)
		cl = 127;
	memcpy(buf, NODEFILE_MAGIC, 4);
	put32(buf + 4, NODEFILE_VERSION);
	put32(buf + 8, id);
	put32(buf + 12, (uint32_t)cl);
	memcpy(buf + 16, cluster, cl);
	put64(buf + 16 + cl, kv_hash64(buf, 16 + cl));
	return save_atomic(dir, "node.id", buf, 16 + cl + 8);
}

#define HANDFILE_MAGIC   "SKVH"
#define HANDFILE_VERSION 1u
#define HANDFILE_ENT     17u

int
kv_handfile_load(const char *dir, kv_handover_ent *ents, size_t cap, size_t *n)
{
	char path[4096];
	uint8_t *buf;
	size_t max = 12 + (size_t)KV_HANDFILE_MAX * HANDFILE_ENT + 8, len = 0;
	ssize_t r;
	int fd, rv = KV_ECORRUPT;

	*n = 0;
	snprintf(path, sizeof(path), "%s/handover.ids", dir);
	if ((fd = open(path, O_RDONLY)) < 0)
		return errno == ENOENT ? KV_OK : KV_EIO;
	if ((buf = malloc(max + 1)) == NULL) {
		close(fd);
		return KV_ENOMEM;
	}
	while (len <= max && (r = read(fd, buf + len, max + 1 - len)) > 0)
		len += (size_t)r;
	close(fd);
	if (len >= 20 && len <= max && memcmp(buf, HANDFILE_MAGIC, 4) == 0 &&
	    get32(buf + 4) == HANDFILE_VERSION) {
		uint32_t cnt = get32(buf + 8);
		if (cnt <= KV_HANDFILE_MAX && len == 12 + (size_t)cnt * HANDFILE_ENT + 8 &&
		    get64(buf + len - 8) == kv_hash64(buf, len - 8) && cnt <= cap) {
			for (uint32_t i = 0; i < cnt; i++) {
				const uint8_t *p = buf + 12 + (size_t)i * HANDFILE_ENT;
				ents[i] = (kv_handover_ent){
				    .id = get64(p), .epoch = get64(p + 8), .out = p[16] == 1};
				if (p[16] > 1)
					goto out;
			}
			*n = cnt;
			rv = KV_OK;
		}
	}
out:
	free(buf);
	return rv;
}

int
kv_handfile_save(const char *dir, const kv_handover_ent *ents, size_t n)
{
	uint8_t *buf;
	size_t len = 12 + n * HANDFILE_ENT + 8;
	int rv;

	if (n > KV_HANDFILE_MAX)
		return KV_EINVAL;
	if ((buf = malloc(len)) == NULL)
		return KV_ENOMEM;
	memcpy(buf, HANDFILE_MAGIC, 4);
	put32(buf + 4, HANDFILE_VERSION);
	put32(buf + 8, (uint32_t)n);
	for (size_t i = 0; i < n; i++) {
		uint8_t *p = buf + 12 + i * HANDFILE_ENT;
		put64(p, ents[i].id);
		put64(p + 8, ents[i].epoch);
		p[16] = ents[i].out ? 1 : 0;
	}
	put64(buf + len - 8, kv_hash64(buf, len - 8));
	rv = save_atomic(dir, "handover.ids", buf, len);
	free(buf);
	return rv;
}
