/*
 * nodefile.h - the small files of a shard server's data dir, kept across
 * restarts: the node file (DATA_DIR/node.id: node id and cluster id), the
 * boot file (boot.id) and the handover file (handover.ids: migrations whose
 * commit this node may have sent or has applied). Layouts: nodefile.c.
 */
#ifndef KV_SHARDSERVER_NODEFILE_H
#define KV_SHARDSERVER_NODEFILE_H

#include <stdbool.h>
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

/* One migration of the handover file (doc/protocol.md "Migrations", after a
 * crash). */
typedef struct {
	uint64_t id;    /* Migration.id */
	uint64_t epoch; /* Migration.epoch: the configuration that listed it first */
	bool out;       /* this node is the source and may have sent TransferCommit;
	                   else the destination and has applied it */
} kv_handover_ent;

#define KV_HANDFILE_MAX 1024u /* entries the file holds at most */

/* Reads the handover file of dir into ents (cap entries), *n of them (0
 * when the file is absent). Returns 0, KV_ECORRUPT (a file that does not
 * check, or holds more than cap entries) or KV_EIO. */
int kv_handfile_load(const char *dir, kv_handover_ent *ents, size_t cap, size_t *n);

/* Writes the handover file atomically, as kv_nodefile_save (n at most
 * KV_HANDFILE_MAX, else KV_EINVAL). */
int kv_handfile_save(const char *dir, const kv_handover_ent *ents, size_t n);

#endif
