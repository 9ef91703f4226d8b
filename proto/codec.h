/*
 * codec.h - conversions between the plain C values of common/ and their
 * protobuf messages. This is the boundary: code above it (the store, the
 * range map, placement) never includes the generated header.
 *
 * Decoding validates: sizes, enum values, and the configuration invariant
 * of common/config.h. A message that fails is KV_EPROTO, never a crash.
 */
#ifndef KV_PROTO_CODEC_H
#define KV_PROTO_CODEC_H

#include "common/config.h"
#include "common/key.h"
#include "proto/shardkv.pb-c.h"

/* Builds a validated kv_config from a decoded message. The caller frees the
 * result with kv_config_free(). Returns 0, KV_EPROTO or KV_ENOMEM. */
int kv_codec_config_from_pb(const Shardkv__Config *pb, kv_config **out);

/* Builds a message tree that borrows c's strings and bytes (c must outlive
 * it). Free it with kv_codec_config_pb_free(), never with free_unpacked.
 * Returns NULL when out of memory. */
Shardkv__Config *kv_codec_config_to_pb(const kv_config *c);

/* Frees a tree made by kv_codec_config_to_pb. Accepts NULL. */
void kv_codec_config_pb_free(Shardkv__Config *pb);

/* Fills a Migration message that borrows m's bytes. */
void kv_codec_migration_to_pb(const kv_migration *m, Shardkv__Migration *pb);

/* Packs a configuration into out (replacing its contents). Returns 0 or KV_ENOMEM. */
int kv_codec_config_pack(const kv_config *c, kv_buf *out);

/* Unpacks and validates a configuration. Returns 0, KV_EPROTO or KV_ENOMEM. */
int kv_codec_config_unpack(const uint8_t *p, size_t n, kv_config **out);

#endif
