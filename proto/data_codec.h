/*
 * data_codec.h - the data family: Request and Response between clients and
 * shard servers (shardkv.proto "Data plane"), as plain C values. The
 * Request envelope also carries the transfers between servers, whose
 * messages are xfer_codec.h's: kv_req.xfer and kv_resp.ack.
 *
 * Decoding validates structure: protocol version, that every oneof is set,
 * counts and enum values (a condition valid for its op, an expire that sets
 * or clears, a TTL within KV_MAX_TTL_MS), byte lengths against the hard limits of
 * doc/contract.md §2. Size limits configured on the server (--max-key,
 * --max-value) are checked by the dispatcher, per op.
 */
#ifndef KV_PROTO_DATA_CODEC_H
#define KV_PROTO_DATA_CODEC_H

#include "common/config.h"
#include "common/key.h"
#include "proto/repl_codec.h"
#include "proto/xfer_codec.h"

#include <nng/nng.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Upper bounds on a decoded request, beyond which it is refused whole. */
#define KV_DATA_MAX_OPS   10000u /* ops per Request */
#define KV_DATA_MAX_MULTI 10000u /* keys per mget/mput */

typedef enum {
	KV_OP_GET = 1,
	KV_OP_PUT,
	KV_OP_DEL,
	KV_OP_APPEND,
	KV_OP_MGET,
	KV_OP_MPUT,
	KV_OP_SCAN,
	KV_OP_EXPIRE,
	KV_OP_TTL,
	KV_OP_INCR,
	KV_OP_EXISTS,
	KV_OP_COUNT,
	KV_OP_DELRANGE,
	KV_OP__COUNT, /* number of kinds + 1 */
} kv_op_kind;

/* The condition of a conditional put or del (shardkv.proto Cond). */
typedef enum {
	KV_COND_NONE = 0,      /* unconditional */
	KV_COND_IF_ABSENT = 1, /* put only: the key must not exist */
	KV_COND_IF_EQUAL = 2,  /* put, del: the key must hold exactly expect */
} kv_cond;

/* The largest TTL a request may carry (2^40 ms, about 35 years): now + ttl
 * never overflows a 64-bit count of ns or ms. */
#define KV_MAX_TTL_MS (1ull << 40)

/* One op of a Request, to encode (everything borrowed from the caller) or
 * decoded (see kv_req); which fields are meaningful depends on kind. */
typedef struct {
	kv_op_kind kind;      /* what to do */
	uint64_t request_id;  /* Op.request_id, for exactly-once of writes */
	bool retry;           /* Op.retry: sent before with this request_id */
	kv_bytes key;         /* get, put, del, append, expire, ttl, incr, exists */
	kv_bytes value;       /* put, append */
	bool no_value;        /* del: do not return the value */
	kv_cond cond;         /* put, del: the condition (decoded: valid for the kind) */
	kv_bytes expect;      /* put, del with KV_COND_IF_EQUAL: the expected value */
	uint64_t ttl_ms;      /* put, mput, expire: > 0 expires that long after; <= KV_MAX_TTL_MS */
	bool persist;         /* expire: clear the expiry instead (ttl_ms is then 0) */
	int64_t delta;        /* incr: what to add */
	size_t nkeys;         /* mget, mput: keys */
	const kv_bytes *keys; /* mget, mput (decoded: the request's array, borrowed bytes) */
	size_t nvals;         /* mput: values (decoded: may differ from nkeys: INVALID) */
	const kv_bytes *vals; /* mput (decoded: the request's array, borrowed bytes) */
	kv_bytes start;       /* scan, count, delrange: inclusive start */
	kv_bytes end;         /* scan, count, delrange: exclusive end; empty: no bound */
	kv_bytes prefix;      /* scan: only keys with this prefix */
	kv_bytes cursor;      /* scan, count, delrange: replaces start when not empty */
	uint32_t limit;       /* scan: max entries, count/delrange: max keys; 0: default */
	bool keys_only;       /* scan: no values */
	uint64_t max_bytes;   /* scan: reply payload bound; 0: default */
} kv_op;

/* A Request. To encode, everything is borrowed from the caller. Decoded,
 * ops and the arrays of xfer are owned by it and every byte borrows from the
 * unpacked message in pb, all until kv_data_req_fini. */
typedef struct {
	uint64_t client_id;  /* 0: no exactly-once */
	uint64_t request_id; /* envelope id, echoed */
	uint64_t epoch;      /* the sender's epoch */
	uint32_t from_node;  /* peer server id, 0 for clients */
	uint32_t timeout_ms; /* the sender gives up after this long; 0: no deadline */
	kv_bytes auth;       /* Request.auth_token (common/auth.h); empty: none */
	size_t nops;         /* ops */
	kv_op *ops;          /* the batch (owned) */
	bool has_xfer;       /* xfer is set */
	kv_xfer xfer;        /* Request.transfer */
	bool has_repl;       /* repl is set */
	kv_repl_msg repl;    /* Request.replicate */
	void *pb;            /* decoded: the unpacked message; NULL to encode */
} kv_req;

/*
 * Decodes and validates a Request. On 0 and on error alike the caller calls
 * kv_data_req_fini (on error the envelope fields decoded so far are set).
 * Returns KV_EPROTO (undecodable), KV_EINVAL (wrong version, missing oneof,
 * ops and transfer both set, over a hard limit; *why names it), KV_ELIMIT
 * (too many ops or keys) or KV_ENOMEM.
 */
int kv_data_req_decode(const void *p, size_t n, kv_req *out, const char **why);

/* Frees what kv_data_req_decode kept. Accepts a zeroed request. */
void kv_data_req_fini(kv_req *r);

/* Whether an encoded Request carries a transfer or a replication message
 * (a peer's bulk traffic, whose handling may wait), from its top-level
 * fields alone, without decoding it. False for anything undecodable. */
bool kv_data_req_is_peer(const void *p, size_t n);

/* Which peer's message an encoded Request carries, the same way. */
enum { KV_PEER_NONE = 0, KV_PEER_TRANSFER = 1, KV_PEER_REPLICATE = 2 };
int kv_data_req_peer_kind(const void *p, size_t n);

/*
 * Packs the ops of a Request (r->has_xfer must be false: transfers are
 * kv_xfer_encode's) into a new nng message; reads r only; on 0 *out is the
 * caller's. Returns 0, KV_EINVAL (an unknown kind, an mget/mput without keys
 * or with counts that differ) or KV_ENOMEM.
 */
int kv_data_req_encode(const kv_req *r, nng_msg **out);

/* Where a key lives now (OwnerHint). */
typedef struct {
	uint64_t epoch;   /* epoch of the hint */
	kv_buf start;     /* the owner's range */
	kv_buf end;       /* empty: end of the key space */
	uint32_t node_id; /* the owner / destination / source */
	char *address;    /* its URL (owned, freed by kv_data_result_fini); NULL: unknown */
} kv_data_hint;

/* A scanned entry (owned bytes). */
typedef struct {
	kv_buf key;   /* the key */
	kv_buf value; /* the value (empty in keys-only scans) */
} kv_data_entry;

/* The result of one op. All buffers are owned (kv_data_result_fini frees
 * them); error is borrowed: a static string of the server's, or when decoded
 * a string of the response's unpacked message. Decoded byte buffers are
 * always allocated and NUL-terminated, even when empty. */
typedef struct {
	int status;             /* KV_OK or KV_E* */
	const char *error;      /* static detail, or NULL */
	bool has_value;         /* value is set */
	bool value_unknown;     /* del retried: applied, the deleted value is not known */
	kv_buf value;           /* get, del */
	size_t nvalues;         /* mget */
	kv_buf *values;         /* mget values */
	size_t nmissing;        /* mget */
	uint32_t *missing;      /* mget missing indexes */
	size_t nentries;        /* scan */
	kv_data_entry *entries; /* scan entries */
	bool more;              /* scan */
	kv_buf next_cursor;     /* scan */
	uint64_t value_len;     /* append */
	int64_t ttl_ms;         /* ttl: ms left, -1 when none */
	int64_t number;         /* incr: the new value */
	uint64_t count;         /* count, delrange: keys counted / deleted in this step */
	bool current_absent;    /* EXISTS/MISMATCH of a conditional write: the key is absent
	                           (else value, has_value, is its current value) */
	bool has_hint;          /* hint is set */
	kv_data_hint hint;      /* WRONG_OWNER, MOVING */
} kv_data_result;

/* Frees the buffers of one result. Accepts NULL. */
void kv_data_result_fini(kv_data_result *r);

/* Empties r for another op but keeps its value buffer when it holds at
 * most keep bytes (value.len 0, has_value false; kv_buf_set fills it again
 * without an allocation); frees everything else, as kv_data_result_fini. */
void kv_data_result_reuse(kv_data_result *r, size_t keep);

/* A Response. To encode, everything is borrowed from the caller. Decoded,
 * results (with their buffers) belong to it and the strings borrow from the
 * unpacked message in pb, all until kv_data_resp_fini. */
typedef struct {
	uint64_t request_id;     /* echoed */
	uint64_t epoch;          /* server's epoch */
	uint32_t node_id;        /* server's id */
	int status;              /* envelope status */
	const char *error;       /* detail or NULL */
	size_t nresults;         /* results */
	kv_data_result *results; /* one per op */
	bool has_ack;            /* ack is set */
	kv_xfer_ack ack;         /* transfer answer */
	bool has_rack;           /* rack is set */
	kv_repl_ack rack;        /* replicate answer */
	void *pb;                /* decoded: the unpacked message; NULL to encode */
} kv_resp;

/* Packs a Response into a new nng message; reads r only; on 0 *out is the
 * caller's. Returns 0 or KV_ENOMEM. */
int kv_data_resp_encode(const kv_resp *r, nng_msg **out);

/*
 * Decodes and validates a Response: byte fields within the hard limits,
 * counts within KV_DATA_MAX_OPS / KV_DATA_MAX_MULTI, strings within 64 KiB,
 * scan entries never split. Whether the number of results fits the request
 * is the caller's to check. On 0 the caller calls kv_data_resp_fini(); on
 * error nothing is left to free. Returns 0, KV_EPROTO or KV_ENOMEM.
 */
int kv_data_resp_decode(const void *p, size_t n, kv_resp *out);

/* Frees what kv_data_resp_decode kept. Accepts a zeroed response. */
void kv_data_resp_fini(kv_resp *r);

#endif
