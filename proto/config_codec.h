/*
 * config_codec.h - the configuration family: a kv_config (common/config.h)
 * <-> a packed Config message, as the controller's config log stores it and
 * as AdminResponse carries it (admin_codec.h nests it through codec_int.h).
 *
 * Decoding validates: sizes, enum values, and the configuration invariant
 * of common/config.h. A message that fails is KV_EPROTO, never a crash.
 */
#ifndef KV_PROTO_CONFIG_CODEC_H
#define KV_PROTO_CONFIG_CODEC_H

#include "common/config.h"
#include "common/key.h"

#include <stddef.h>
#include <stdint.h>

/* Packs a configuration into out (replacing its contents; c is only read).
 * Returns 0 or KV_ENOMEM. */
int kv_codec_config_pack(const kv_config *c, kv_buf *out);

/* Unpacks and validates a configuration; on 0 the caller frees *out with
 * kv_config_free(). Returns 0, KV_EPROTO or KV_ENOMEM. */
int kv_codec_config_unpack(const uint8_t *p, size_t n, kv_config **out);

#endif
