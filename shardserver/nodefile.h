/*
 * nodefile.h - the node file (DATA_DIR/node.id): node id and cluster id of
 * a shard server, kept across restarts. Layout: nodefile.c.
 */
#ifndef KV_SHARDSERVER_NODEFILE_H
#define KV_SHARDSERVER_NODEFILE_H

#include <stddef.h>
#include <stdint.h>

/* Reads the node file of dir into *id and cluster (clen bytes, NUL
 * terminated). Returns 0 (found), KV_ENOTFOUND (first start), KV_ECORRUPT
 * or KV_EIO. */
int kv_nodefile_load(const char *dir, uint32_t *id, char *cluster, size_t clen);

/* Writes the node file atomically (temporary file, fsync, rename, directory
 * fsync); a cluster id is cut at 127 bytes. Returns 0 or
 * KV_EIO/KV_ENOSPC/KV_EPERM. */
int kv_nodefile_save(const char *dir, uint32_t id, const char *cluster);

/* The boot file (DATA_DIR/boot.id): the boot id of the last start on the
 * data dir, written before that start logs anything. Reads it into *boot
 * (0 when absent or unreadable: unknown). */
void kv_bootfile_load(const char *dir, uint64_t *boot);

/* Writes the boot file atomically, as kv_nodefile_save. Returns 0 or
 * KV_EIO/KV_ENOSPC/KV_EPERM. */
int kv_bootfile_save(const char *dir, uint64_t boot);

#endif
