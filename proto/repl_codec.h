/*
 * repl_codec.h - the replication family: the primary -> backup stream
 * (Replicate inside Request, ReplicateAck inside Response, shardkv.proto
 * "Replication"; doc/replication.md "Writes") as plain C values. The
 * primary encodes a kv_repl_msg with kv_repl_encode and reads the answer with
 * kv_repl_ack_decode; the backup gets the same kv_repl_msg from
 * kv_data_req_decode (data_codec.h: kv_req.repl) and answers with a
 * kv_repl_ack in kv_data_resp_encode (kv_resp.rack).
 *
 * Decoding validates structure: from_node, stream_id and seq set, at most
 * KV_REPL_MAX_RECS records (one message each, or packed in one field
 * whose lengths must fit it exactly), each with an lsn, a payload of 1 byte ..
 * KV_REPL_MAX_PAYLOAD, a start key within KV_HARD_MAX_KEY, and lsns strictly
 * increasing within the batch; a copy step or an end comes alone (no
 * records, not both), a copy with at most KV_REPL_MAX_RECS payloads of 1 byte
 * .. KV_REPL_MAX_PAYLOAD and keys within KV_HARD_MAX_KEY (implemented in xfer_codec.c, next to the
 * transfer family). What a payload means is the backup's
 * business (the log record format, checked when applied).
 */
#ifndef KV_PROTO_REPL_CODEC_H
#define KV_PROTO_REPL_CODEC_H

#include "common/key.h"

#include <nng/nng.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Records per Replicate beyond which it is refused whole. */
#define KV_REPL_MAX_RECS 100000u
/* Largest record payload (the log's record limit). */
#define KV_REPL_MAX_PAYLOAD (80u * 1024u * 1024u)

/* One replicated log record (ReplRecord). */
typedef struct {
	uint64_t leader_epoch; /* the range's leader epoch at the primary */
	uint64_t lsn;          /* the primary's lsn, > 0 */
	kv_bytes start;        /* the start of the record's range */
	kv_bytes payload;      /* the log record payload */
} kv_repl_rec;

/* A step of a bulk copy (ReplCopy); set: present. */
typedef struct {
	bool set;              /* the batch is a copy step */
	uint64_t leader_epoch; /* the range's leader epoch at the primary */
	kv_bytes start, end;   /* the range (empty end: no bound) */
	bool first;            /* drop what is held of the range first */
	bool last;             /* the copy is complete */
	bool catchup;          /* a catch-up from the replica's own data: records after from_lsn */
	uint64_t from_lsn;     /* ... the replica's position must be at or above it */
	uint64_t next_lsn;     /* last step: the first lsn after it (its base + 1); 0: unknown */
	/* First catch-up step to the previous primary (ReplCopy.old_*): it led
	 * the range at old_epoch in start old_boot; the new primary applied
	 * its records up to old_end, at its own lsn old_at. 0: none. */
	uint32_t old_primary;
	uint64_t old_epoch, old_boot, old_end, old_at;
	size_t nrecs;   /* log record payloads */
	kv_bytes *recs; /* ... each 1 byte .. KV_REPL_MAX_PAYLOAD */
} kv_repl_copy;

/* A new primary's end of the previous leader epoch (ReplEnd); set: present. */
typedef struct {
	bool set;              /* the batch is an end */
	uint64_t leader_epoch; /* the range's new leader epoch */
	kv_bytes start;        /* the range's start */
	uint32_t old_primary;  /* the primary of the previous leader epoch */
	uint64_t end_lsn;      /* its last lsn the new primary applied; 0: unknown */
	uint64_t next_lsn;     /* the new primary's last lsn then, plus one; 0: unknown */
	kv_bytes end;          /* with next_lsn: the range's end there (empty: none) */
} kv_repl_end;

/* One batch of a stream (Replicate). When encoding everything is borrowed
 * from the caller; when decoded the array belongs to the request and the
 * bytes borrow from its unpacked message, both until kv_data_req_fini. */
typedef struct {
	uint32_t from_node;  /* the primary */
	uint64_t stream_id;  /* random per primary start */
	uint64_t seq;        /* batch number from 1 */
	uint64_t commit_lsn; /* the primary's commit point */
	size_t nrecs;        /* records */
	kv_repl_rec *recs;   /* in lsn order */
	kv_repl_copy copy;   /* a copy step (then nrecs is 0) */
	kv_repl_end end;     /* an end (then nrecs is 0 and copy unset) */
	uint64_t breaks;     /* times the stream stopped carrying a range (0: unknown) */
	/* Encoding: the records go in Replicate.packed_records (the backup
	 * said it reads them, kv_repl_ack.packed_ok), not one message each.
	 * Decoding takes either form. */
	bool packed;
} kv_repl_msg;

/* The answer (ReplicateAck). */
typedef struct {
	uint64_t acked_seq; /* highest batch applied in order */
	uint64_t acked_lsn; /* highest record lsn applied */
	int status;         /* KV_OK or why refused */
	const char *error;  /* detail or NULL (not kept by kv_repl_ack_decode) */
	bool diverged;      /* answer to an end: the positions differ; to a catch-up: refused */
	bool caught_up;     /* answer to a catch-up's last step: applied */
	uint64_t position;  /* answer to an accepted first catch-up step: its position */
	bool packed_ok;     /* the backup reads packed records (kv_repl_msg.packed) */
} kv_repl_ack;

/* Packs r as the replicate member of a Request from node from_node acting in
 * epoch, with the sender's auth token (empty: none), into a new nng message.
 * Reads r only; on 0 *out is the caller's. Returns 0 or KV_ENOMEM. */
int kv_repl_encode(const kv_repl_msg *r, uint64_t epoch, uint32_t from_node, kv_bytes auth,
                   nng_msg **out);

/* Reads the ReplicateAck of a packed Response into *ack (ack->error NULL).
 * Returns 0 (ack filled), KV_EPROTO (undecodable, or no ack), or the
 * envelope status of a refused request. */
int kv_repl_ack_decode(const void *p, size_t n, kv_repl_ack *ack);

/* The same, and the answer's error text into detail (cap bytes, cut to
 * fit; "" when there is none or nothing decoded). */
int kv_repl_ack_decode_detail(const void *p, size_t n, kv_repl_ack *ack, char *detail, size_t cap);

#endif
