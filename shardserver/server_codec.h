/*
 * server_codec.h - the shard server's wire boundary: Request/Response (data
 * plane and range transfer) and the AdminRequest/AdminResponse messages a
 * server exchanges with the controller, as plain C values.
 *
 * This is the only server module (besides tests) that includes the generated
 * protobuf header (STYLE §8). Decoding validates structure: protocol version,
 * that every oneof is set, counts and enum values, byte lengths against the
 * hard limits of doc/contract.md §2. Size limits configured on the server (--max-key,
 * --max-value) are checked by the dispatcher, per op.
 *
 * Decoded values borrow bytes from the unpacked message: they are valid until
 * the matching *_fini call.
 */
#ifndef KV_SHARDSERVER_SERVER_CODEC_H
#define KV_SHARDSERVER_SERVER_CODEC_H

#include "common/config.h"
#include "common/key.h"
#include "shardserver/dedup/dedup.h"

#include <nng/nng.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Upper bounds on a decoded request, beyond which it is refused whole. */
#define KV_SC_MAX_OPS       10000u  /* ops per Request */
#define KV_SC_MAX_MULTI     10000u  /* keys per mget/mput */
#define KV_SC_MAX_XFER_RECS 100000u /* entries or records per transfer message */

typedef enum {
	KV_OP_GET = 1,
	KV_OP_PUT,
	KV_OP_DEL,
	KV_OP_APPEND,
	KV_OP_MGET,
	KV_OP_MPUT,
	KV_OP_SCAN,
	KV_OP__COUNT, /* number of kinds + 1 */
} kv_op_kind;

/* One decoded op; which fields are meaningful depends on kind. */
typedef struct {
	kv_op_kind kind;     /* what to do */
	uint64_t request_id; /* Op.request_id, for exactly-once of writes */
	kv_bytes key;        /* get, put, del, append */
	kv_bytes value;      /* put, append */
	bool no_value;       /* del: do not return the value */
	size_t nkeys;        /* mget, mput: keys */
	kv_bytes *keys;      /* mget, mput (owned array, borrowed bytes) */
	size_t nvals;        /* mput: values (may differ from nkeys: INVALID) */
	kv_bytes *vals;      /* mput (owned array, borrowed bytes) */
	kv_bytes start;      /* scan: inclusive start */
	kv_bytes end;        /* scan: exclusive end; empty: no bound */
	kv_bytes prefix;     /* scan: only keys with this prefix */
	kv_bytes cursor;     /* scan: replaces start when not empty */
	uint32_t limit;      /* scan: max entries; 0: default */
	bool keys_only;      /* scan: no values */
	uint64_t max_bytes;  /* scan: reply payload bound; 0: default */
} kv_op;

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
} kv_sc_kv;

/* One exactly-once record on the wire (DedupEntry). */
typedef struct {
	uint64_t client_id;  /* Request.client_id */
	uint64_t request_id; /* Op.request_id */
	int status;          /* KV_E* result */
	uint64_t value_len;  /* append result */
	kv_bytes value;      /* del result (may be empty) */
	kv_bytes key;        /* the key written */
	uint64_t time_ms;    /* when applied */
} kv_sc_dedup;

/* One write recorded during a copy (DeltaRecord). */
typedef struct {
	uint64_t seq;          /* source write sequence */
	bool del;              /* true: delete, false: put */
	kv_bytes key;          /* the key */
	kv_bytes value;        /* put: the value, or this slice of it */
	uint64_t value_offset; /* put, split: offset of the slice (as kv_sc_kv) */
	uint64_t value_total;  /* put, split: whole length; 0 when whole */
	bool has_dedup;        /* dedup is set */
	kv_sc_dedup dedup;     /* the write's exactly-once record */
} kv_sc_delta;

typedef enum {
	KV_XFER_BEGIN = 1,
	KV_XFER_CHUNK,
	KV_XFER_DELTA,
	KV_XFER_FENCE,
	KV_XFER_COMMIT,
	KV_XFER_ABORT,
} kv_xfer_kind;

/* One transfer message, decoded or to be encoded. Arrays are borrowed when
 * encoding and owned (bytes borrowed) when decoded. */
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
	kv_sc_kv *kv;            /* chunk entries */
	size_t ndedup;           /* chunk: dedup entries */
	kv_sc_dedup *dedup;      /* chunk dedup entries */
	bool last;               /* chunk: bulk copy complete */
	size_t ndelta;           /* delta: records */
	kv_sc_delta *delta;      /* delta records */
	uint64_t last_write_seq; /* fence */
	int reason;              /* abort: KV_E* reason */
} kv_xfer;

/* A decoded Request. */
typedef struct {
	uint64_t client_id;  /* 0: no exactly-once */
	uint64_t request_id; /* envelope id, echoed */
	uint64_t epoch;      /* the sender's epoch */
	uint32_t from_node;  /* peer server id, 0 for clients */
	kv_bytes auth;       /* Request.auth_token (common/auth.h); empty: none */
	size_t nops;         /* ops */
	kv_op *ops;          /* the batch (owned) */
	bool has_xfer;       /* xfer is set */
	kv_xfer xfer;        /* Request.transfer */
	void *pb;            /* the unpacked message the bytes borrow from */
} kv_req;

/*
 * Decodes and validates a Request. On 0 the caller calls kv_sc_req_fini.
 * Returns KV_EPROTO (undecodable), KV_EINVAL (wrong version, missing oneof,
 * ops and transfer both set, over a hard limit; *why names it), KV_ELIMIT
 * (too many ops or keys) or KV_ENOMEM.
 */
int kv_sc_req_decode(const void *p, size_t n, kv_req *out, const char **why);
void kv_sc_req_fini(kv_req *r);

/* Where a key lives now (OwnerHint). */
typedef struct {
	uint64_t epoch;    /* epoch of the hint */
	kv_buf start;      /* the owner's range */
	kv_buf end;        /* empty: end of the key space */
	uint32_t node_id;  /* the owner / destination / source */
	char address[256]; /* its URL, "" when unknown */
} kv_sc_hint;

/* A scanned entry (owned bytes). */
typedef struct {
	kv_buf key;   /* the key */
	kv_buf value; /* the value (empty in keys-only scans) */
} kv_sc_entry;

/* The result of one op (all buffers owned; kv_sc_result_fini frees them). */
typedef struct {
	int status;           /* KV_OK or KV_E* */
	const char *error;    /* static detail, or NULL */
	bool has_value;       /* value is set */
	kv_buf value;         /* get, del */
	size_t nvalues;       /* mget */
	kv_buf *values;       /* mget values */
	size_t nmissing;      /* mget */
	uint32_t *missing;    /* mget missing indexes */
	size_t nentries;      /* scan */
	kv_sc_entry *entries; /* scan entries */
	bool more;            /* scan */
	kv_buf next_cursor;   /* scan */
	uint64_t value_len;   /* append */
	bool has_hint;        /* hint is set */
	kv_sc_hint hint;      /* WRONG_OWNER, MOVING */
} kv_sc_result;

void kv_sc_result_fini(kv_sc_result *r);

/* The answer to a transfer message (TransferAck). */
typedef struct {
	uint64_t migration_id; /* echoed */
	int status;            /* KV_OK or why refused */
	const char *error;     /* detail or NULL */
	uint64_t seq;          /* highest contiguous seq applied */
	uint64_t keys;         /* keys held so far */
	uint64_t bytes;        /* bytes held so far */
} kv_sc_ack;

/* A Response to encode (borrowed). */
typedef struct {
	uint64_t request_id;   /* echoed */
	uint64_t epoch;        /* server's epoch */
	uint32_t node_id;      /* server's id */
	int status;            /* envelope status */
	const char *error;     /* detail or NULL */
	size_t nresults;       /* results */
	kv_sc_result *results; /* one per op */
	bool has_ack;          /* ack is set */
	kv_sc_ack ack;         /* transfer answer */
} kv_resp;

/* Packs a Response into a new nng message. Returns 0 or KV_ENOMEM. */
int kv_sc_resp_encode(const kv_resp *r, nng_msg **out);

/* Packs a transfer Request into a new nng message. Returns 0 or KV_ENOMEM. */
int kv_sc_xfer_encode(const kv_xfer *x, uint64_t epoch, uint32_t from_node, nng_msg **out);

/* kv_sc_xfer_encode with the sender's auth token (empty: none). */
int kv_sc_xfer_encode_auth(const kv_xfer *x, uint64_t epoch, uint32_t from_node, kv_bytes auth,
                           nng_msg **out);

/* Reads the TransferAck of a Response. Returns 0 (ack filled), KV_EPROTO,
 * or the envelope status of a refused request. */
int kv_sc_ack_decode(const void *p, size_t n, kv_sc_ack *ack);

/*
 * Controller messages.
 */
typedef enum {
	KV_ADM_REGISTER = 1,
	KV_ADM_WATCH,
	KV_ADM_HEARTBEAT,
	KV_ADM_PROGRESS,
	KV_ADM_DONE,
	KV_ADM_LEAVE,
} kv_adm_kind;

/* Per-range statistics for a heartbeat. */
typedef struct {
	kv_bytes start;     /* range start */
	kv_bytes end;       /* range end */
	uint64_t keys;      /* keys */
	uint64_t bytes;     /* bytes */
	double ops_per_sec; /* op rate */
	size_t nsplit;      /* split keys */
	kv_bytes split[3];  /* quantile split keys, in key order */
} kv_sc_range_stats;

/* One request to the controller (borrowed fields). */
typedef struct {
	kv_adm_kind kind;          /* which command */
	uint64_t client_id;        /* sender id */
	uint64_t request_id;       /* echoed */
	uint32_t timeout_ms;       /* watch: long-poll bound */
	const char *address;       /* register */
	uint32_t node_id;          /* register resume id; everything else: sender */
	bool join;                 /* register */
	uint64_t boot_id;          /* register, heartbeat */
	const char *cluster_id;    /* register */
	uint64_t epoch;            /* register/heartbeat: applied; watch: known */
	size_t nranges;            /* heartbeat */
	kv_sc_range_stats *ranges; /* heartbeat */
	uint64_t keys;             /* heartbeat totals; progress/done: copied */
	uint64_t bytes;            /* idem */
	double ops_per_sec;        /* heartbeat */
	uint64_t memory_bytes;     /* heartbeat */
	uint64_t migration_id;     /* progress, done */
	int phase;                 /* progress: kv_mig_phase */
	uint64_t keys_total;       /* progress */
	uint64_t bytes_total;      /* progress */
	uint64_t rate_bytes_s;     /* progress */
	int status;                /* done: KV_E* */
	uint64_t last_seq;         /* done */
	kv_bytes auth;             /* AdminRequest.auth_token; empty: none */
} kv_adm_req;

/* Packs an AdminRequest. Returns 0 or KV_ENOMEM. */
int kv_sc_adm_encode(const kv_adm_req *r, nng_msg **out);

/* A decoded AdminResponse (owned). */
typedef struct {
	int status;          /* KV_OK or KV_E* */
	char error[256];     /* detail */
	uint64_t epoch;      /* controller's latest epoch */
	uint32_t node_id;    /* register */
	size_t nconfigs;     /* configs, oldest first (watch history, or the single config) */
	kv_config **configs; /* owned, free with kv_sc_adm_resp_fini */
} kv_adm_resp;

/* Decodes an AdminResponse. Returns 0, KV_EPROTO or KV_ENOMEM. */
int kv_sc_adm_decode(const void *p, size_t n, kv_adm_resp *out);
void kv_sc_adm_resp_fini(kv_adm_resp *r);

#endif
