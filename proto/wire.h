/*
 * wire.h - translation between the wire status codes of shardkv.proto
 * (enum shardkv.Status, C type Shardkv__Status) and the KV_E* codes of
 * common/err.h.
 *
 * These are the only two places where one vocabulary becomes the other: a
 * codec calls kv_wire_from_err() when it fills a reply and kv_err_from_wire()
 * when it reads one. Every KV_E* code has a wire status of its own, so
 * err -> wire -> err is the identity. The reverse is the identity for every
 * wire status except STATUS_NOT_LEADER, which has no KV_E* code and reads as
 * KV_EUNAVAIL (the caller retries another controller replica).
 *
 * The statuses are passed as int so that callers need not include the
 * generated header; the values are those of Shardkv__Status. Both functions
 * are pure and thread-safe.
 */
#ifndef KV_PROTO_WIRE_H
#define KV_PROTO_WIRE_H

/*
 * Returns the KV_E* code (or KV_OK) for a wire status. A status this build
 * does not know (from a newer peer) reads as KV_EPROTO.
 */
int kv_err_from_wire(int status);

/*
 * Returns the wire status for KV_OK or a KV_E* code. A value that is not in
 * the KV_E* table goes out as STATUS_INTERNAL.
 */
int kv_wire_from_err(int err);

#endif
