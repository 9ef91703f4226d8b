/*
 * codec_int.h - what the codec modules of proto/ share below their public
 * headers: byte conversions, packing into an nng message, and the
 * message-level halves of the configuration codec (config_codec.c) that the
 * admin codec nests in its replies and the transfer codec's helpers that the
 * data codec nests in Request/Response.
 *
 * It includes the generated header, so only the .c files of proto/ include it, plus
 * tests and fuzzers that build raw wire messages (layering.sh allows them).
 */
#ifndef KV_PROTO_CODEC_INT_H
#define KV_PROTO_CODEC_INT_H

#include "common/config.h"
#include "common/key.h"
#include "proto/shardkv.pb-c.h"
#include "proto/repl_codec.h"
#include "proto/xfer_codec.h"

#include <nng/nng.h>

/* Returns a view of d; borrows d's bytes. */
static inline kv_bytes
kv_codec__bytes(ProtobufCBinaryData d)
{
	kv_bytes b = {.p = d.data, .len = d.len};
	return b;
}

/* Returns a wire field that borrows b's bytes. */
static inline ProtobufCBinaryData
kv_codec__pb(kv_bytes b)
{
	ProtobufCBinaryData d = {.len = b.len, .data = (uint8_t *)b.p};
	return d;
}

/* Returns a wire field that borrows b's bytes. */
static inline ProtobufCBinaryData
kv_codec__pbuf(const kv_buf *b)
{
	ProtobufCBinaryData d = {.len = b->len, .data = b->data};
	return d;
}

/* Packs m straight into the body of a new nng message; on 0 *out is the
 * caller's. Returns 0 or KV_ENOMEM. */
int kv_codec__pack(const ProtobufCMessage *m, nng_msg **out);

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

/* Fills *x (zeroed first) from a Migration message; the bytes are copied
 * (on error too, the caller frees start and end with kv_buf_fini). Returns
 * 0, KV_EPROTO (phase or sizes) or KV_ENOMEM. */
int kv_codec_migration_from_pb(const Shardkv__Migration *m, kv_migration *x);

/*
 * The transfer message of a Request (xfer_codec.c). Decodes and validates t
 * into *x, whose arrays are owned (free them with kv_xfer__fini) and whose
 * bytes borrow from t. Returns 0, KV_EINVAL or KV_ELIMIT (*why says why) or
 * KV_ENOMEM.
 */
int kv_xfer__from_pb(const Shardkv__Transfer *t, kv_xfer *x, const char **why);

/* Frees the arrays kv_xfer__from_pb allocated. Accepts a zeroed x. */
void kv_xfer__fini(kv_xfer *x);

/* The replicate message of a Request (repl_codec.c): decodes and validates m
 * into *r, whose array is owned (free it with kv_repl__fini) and whose bytes
 * borrow from m. Returns 0, KV_EINVAL or KV_ELIMIT (*why says why) or
 * KV_ENOMEM. */
int kv_repl__from_pb(const Shardkv__Replicate *m, kv_repl_msg *r, const char **why);

/* Frees the array kv_repl__from_pb allocated. Accepts a zeroed r. */
void kv_repl__fini(kv_repl_msg *r);

#endif
