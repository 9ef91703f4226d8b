/*
 * xfer_codec.h - the transfer family: the server-to-server messages of a
 * range migration (Transfer inside Request, TransferAck inside Response,
 * shardkv.proto "Range transfer"), as plain C values. The source encodes a
 * kv_xfer with kv_xfer_encode and reads the answer with kv_xfer_ack_decode;
 * the destination gets the same kv_xfer from kv_data_req_decode (the
 * Request envelope, data_codec.h) and answers with a kv_xfer_ack in
 * kv_data_resp_encode.
 *
 * Decoding validates structure: ids and seq set, a oneof set, counts
 * (KV_XFER_MAX_RECS), enum values, byte lengths against the hard limits of
 * doc/contract.md §2, each value slice on its own. Whether consecutive
 * slices fit together is the receiver's business (migrate_in.c).
 */
#ifndef KV_PROTO_XFER_CODEC_H
#define KV_PROTO_XFER_CODEC_H

#include "common/key.h"

#include <nng/nng.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Entries or records per transfer message beyond which it is refused whole. */
#define KV_XFER_MAX_RECS 100000u

/*
 * One key/value of a transfer, or one slice of a value too large for one
 * message (KeyValue in shardkv.proto): value_total != 0 means `value` holds
 * bytes [value_offset, value_offset + value.len) of a value of value_total
 * bytes. Decoding checks each slice on its own (not empty, inside its total,
 * total within KV_HARD_MAX_VALUE); whether consecutive slices fit together is
 * the receiver's business (migrate_in.c).
 */
typedef struct {
	kv_bytes key;          /* the key */
	kv_bytes value;        /* the value, or this slice of it */
	uint64_t value_offset; /* offset of the slice; 0 when whole */
	uint64_t value_total;  /* length of the whole value when split; 0 when whole */
	uint64_t expire_at;    /* the key's deadline, Unix ms; 0: none */
} kv_xfer_kv;

/* One exactly-once record on the wire (DedupEntry). */
typedef struct {
	uint64_t client_id;  /* Request.client_id */
	uint64_t request_id; /* Op.request_id */
	int status;          /* KV_E* result */
	uint64_t value_len;  /* append result */
	kv_bytes value;      /* del result, when has_value (may be empty) */
	bool has_value;      /* a delete's returned value is known */
	kv_bytes key;        /* the key written */
	uint64_t time_ms;    /* when applied */
} kv_xfer_dedup;

/* A client's exactly-once floor (ClientFloor): the highest request id
 * whose result the source may have forgotten. */
typedef struct {
	uint64_t client_id;
	uint64_t floor;
} kv_xfer_floor;

/* One write recorded during a copy (DeltaRecord). */
typedef struct {
	uint64_t seq;          /* source write sequence */
	bool del;              /* true: delete, false: put */
	kv_bytes key;          /* the key */
	kv_bytes value;        /* put: the value, or this slice of it */
	uint64_t value_offset; /* put, split: offset of the slice (as kv_xfer_kv) */
	uint64_t value_total;  /* put, split: whole length; 0 when whole */
	bool has_dedup;        /* dedup is set */
	kv_xfer_dedup dedup;   /* the write's exactly-once record */
	uint64_t expire_at;    /* put: the key's deadline, Unix ms; 0: none */
} kv_xfer_delta;

typedef enum {
	KV_XFER_BEGIN = 1,
	KV_XFER_CHUNK,
	KV_XFER_DELTA,
	KV_XFER_FENCE,
	KV_XFER_COMMIT,
	KV_XFER_ABORT,
} kv_xfer_kind;

/* One transfer message, decoded or to be encoded. When encoding everything
 * is borrowed from the caller; when decoded (kv_data_req_decode) the arrays
 * belong to the request and the bytes borrow from its unpacked message, both
 * until kv_data_req_fini. */
typedef struct {
	uint64_t migration_id;   /* Migration.id */
	uint64_t seq;            /* stream position from 1 */
	kv_xfer_kind kind;       /* which message */
	uint64_t epoch;          /* begin: Migration.epoch; commit: done epoch */
	kv_bytes start;          /* begin: range start */
	kv_bytes end;            /* begin: range end */
	uint32_t from_node;      /* begin: source */
	uint32_t to_node;        /* begin: destination */
	uint64_t keys;           /* begin: keys_total; fence: keys */
	uint64_t bytes;          /* begin: bytes_total; fence: bytes */
	size_t nkv;              /* chunk: entries */
	kv_xfer_kv *kv;          /* chunk entries */
	size_t ndedup;           /* chunk: dedup entries */
	kv_xfer_dedup *dedup;    /* chunk dedup entries */
	size_t nfloors;          /* chunk: exactly-once floors */
	kv_xfer_floor *floors;   /* chunk floors (client_id and floor non-zero) */
	bool last;               /* chunk: bulk copy complete */
	bool packed;             /* chunk: kv in TransferChunk.packed_entries (to encode: the
	                            destination reads them, kv_xfer_ack.packed_ok;
	                            decoded: they came so) */
	size_t ndelta;           /* delta: records */
	kv_xfer_delta *delta;    /* delta records */
	uint64_t last_write_seq; /* fence */
	int reason;              /* abort: KV_E* reason */
} kv_xfer;

/* The answer to a transfer message (TransferAck). */
typedef struct {
	uint64_t migration_id; /* echoed */
	int status;            /* KV_OK or why refused */
	const char *error;     /* detail or NULL */
	uint64_t seq;          /* highest contiguous seq applied */
	uint64_t keys;         /* keys held so far */
	uint64_t bytes;        /* bytes held so far */
	bool packed_ok;        /* the destination reads TransferChunk.packed_entries */
	bool committed;        /* the destination has applied the TransferCommit */
} kv_xfer_ack;

/*
 * Packs x as the transfer of a Request from node from_node acting in epoch,
 * with the sender's auth token (empty: none), into a new nng message. Reads
 * x only; on 0 *out is the caller's. Returns 0 or KV_ENOMEM.
 */
int kv_xfer_encode(const kv_xfer *x, uint64_t epoch, uint32_t from_node, kv_bytes auth,
                   nng_msg **out);

/*
 * Reads the TransferAck of a packed Response into *ack (copied; ack->error
 * is NULL: the detail is not kept). Returns 0 (ack filled), KV_EPROTO
 * (undecodable, or no ack), or the envelope status of a refused request.
 */
int kv_xfer_ack_decode(const void *p, size_t n, kv_xfer_ack *ack);

#endif
