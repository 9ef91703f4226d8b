/*
 * data_codec.c - the data family (data_codec.h).
 *
 * DESIGN. Decoding unpacks with protobuf-c and then walks the message once,
 * checking everything a peer could get wrong (version, oneofs, counts, hard
 * byte limits, enum values) before copying pointers into plain C structs, so
 * the dispatcher never sees an unchecked field; a transfer inside the
 * Request is checked by xfer_codec.c. Encoding builds a temporary message
 * tree that borrows the caller's bytes, packs it straight into an nng
 * message body, and frees only the tree's own arrays (never with
 * free_unpacked).
 *
 * A decoded Request or Response is unpacked into an arena of its own (pb_arena:
 * one block sized from the message, more only if it does not fit), which
 * the fini frees in one go: protobuf-c otherwise allocates every op, every
 * sub-message and every key and value separately, and frees them one by
 * one, a tenth of a server's and a client's cycles under pipelined load.
 * `pb` points to the arena; its `msg` is the unpacked message.
 */
#include "proto/data_codec.h"
#include "common/mem.h"
#include "common/err.h"
#include "proto/codec_int.h"
#include "proto/wire.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One block of a pb_arena. */
typedef struct pb_blk {
	struct pb_blk *next; /* the block allocated before this one */
	size_t cap;          /* bytes in data */
	size_t used;         /* bytes handed out */
	max_align_t data[];  /* the memory */
} pb_blk;

/* The memory of one unpacked message: what kv_req.pb and kv_resp.pb hold. */
typedef struct {
	ProtobufCAllocator a; /* pb_alloc, pb_free, this arena */
	pb_blk *head;         /* the newest block */
	void *msg;            /* the unpacked message */
} pb_arena;

#define PB_ALIGN     (sizeof(max_align_t))
#define PB_BLOCK_MIN 1024u

static pb_blk *
pb_blk_new(size_t cap)
{
	pb_blk *b = malloc(sizeof(*b) + cap);
	if (b == NULL)
		return NULL;
	b->next = NULL;
	b->cap = cap;
	b->used = 0;
	return b;
}

static void *
pb_alloc(void *arg, size_t size)
{
	pb_arena *ar = arg;
	pb_blk *b = ar->head;

	if (size > SIZE_MAX / 2)
		return NULL;
	size = (size + PB_ALIGN - 1) & ~(PB_ALIGN - 1);
	if (size > b->cap - b->used) {
		size_t cap = b->cap * 2 > size ? b->cap * 2 : size;
		pb_blk *nb = pb_blk_new(cap);
		if (nb == NULL)
			return NULL;
		nb->next = b;
		ar->head = b = nb;
	}
	void *p = (char *)b->data + b->used;
	b->used += size;
	return p;
}

static void
pb_free(void *arg, void *p)
{
	(void)arg, (void)p; /* freed with the arena */
}

/* The largest first block a thread keeps for its next message. */
#define PB_SPARE_MAX (64u * 1024u)

/* Each thread keeps the arena of the last message it freed (one block of
 * at most PB_SPARE_MAX), so that the next message it decodes needs no
 * malloc: a block above the size malloc's per-thread cache holds costs
 * a search of its bins each time. Freed with the thread. */
static pthread_key_t pb_spare_key;
static pthread_once_t pb_spare_once = PTHREAD_ONCE_INIT;
static bool pb_spare_ok;

static void
pb_spare_drop(void *p)
{
	pb_arena *ar = p;
	if (ar != NULL) {
		free(ar->head);
		free(ar);
	}
}

static void
pb_spare_init(void)
{
	pb_spare_ok = pthread_key_create(&pb_spare_key, pb_spare_drop) == 0;
}

/* An arena for unpacking a message of n bytes, or NULL. The unpacked
 * form is a few times the wire form (a struct per message, a pointer per
 * repeated entry): the first block is sized for that. */
static pb_arena *
pb_arena_new(size_t n)
{
	size_t cap = n <= (SIZE_MAX - PB_BLOCK_MIN) / 4 ? 4 * n + PB_BLOCK_MIN : n;
	pb_arena *ar = NULL;

	pthread_once(&pb_spare_once, pb_spare_init);
	if (pb_spare_ok && (ar = pthread_getspecific(pb_spare_key)) != NULL) {
		if (ar->head->cap >= cap) {
			pthread_setspecific(pb_spare_key, NULL);
			ar->head->used = 0;
			ar->msg = NULL;
			return ar;
		}
		ar = NULL;
	}
	if ((ar = malloc(sizeof(*ar))) == NULL)
		return NULL;
	if ((ar->head = pb_blk_new(cap)) == NULL) {
		free(ar);
		return NULL;
	}
	ar->a = (ProtobufCAllocator){.alloc = pb_alloc, .free = pb_free, .allocator_data = ar};
	ar->msg = NULL;
	return ar;
}

static void
pb_arena_free(pb_arena *ar)
{
	if (ar == NULL)
		return;
	if (pb_spare_ok && ar->head->next == NULL && ar->head->cap <= PB_SPARE_MAX) {
		/* Kept for this thread's next message, in place of a smaller one. */
		pb_arena *old = pthread_getspecific(pb_spare_key);
		if (old == NULL || old->head->cap < ar->head->cap) {
			if (pthread_setspecific(pb_spare_key, ar) == 0) {
				pb_spare_drop(old);
				return;
			}
		}
	}
	for (pb_blk *b = ar->head, *nx; b != NULL; b = nx) {
		nx = b->next;
		free(b);
	}
	free(ar);
}

/* Returns whether a byte field fits the hard limit. */
static bool
key_ok(ProtobufCBinaryData d)
{
	return d.len <= KV_HARD_MAX_KEY;
}

/* Checks a condition for a put (IF_ABSENT, IF_EQUAL) or a del (IF_EQUAL). */
static int
decode_cond(int cond, ProtobufCBinaryData expect, bool is_put, kv_op *op, const char **why)
{
	switch (cond) {
	case SHARDKV__COND__COND_NONE:
		op->cond = KV_COND_NONE;
		break;
	case SHARDKV__COND__COND_IF_ABSENT:
		if (!is_put) {
			*why = "a delete cannot be conditional on absence";
			return KV_EINVAL;
		}
		op->cond = KV_COND_IF_ABSENT;
		break;
	case SHARDKV__COND__COND_IF_EQUAL:
		op->cond = KV_COND_IF_EQUAL;
		break;
	default:
		*why = "unknown condition";
		return KV_EINVAL;
	}
	if (op->cond != KV_COND_IF_EQUAL && expect.len != 0) {
		*why = "an expected value without the if-equal condition";
		return KV_EINVAL;
	}
	op->expect = kv_codec__bytes(expect);
	return KV_OK;
}

/* Checks a TTL against KV_MAX_TTL_MS. */
static int
decode_ttl(uint64_t ttl_ms, kv_op *op, const char **why)
{
	if (ttl_ms > KV_MAX_TTL_MS) {
		*why = "TTL over 2^40 ms";
		return KV_EINVAL;
	}
	op->ttl_ms = ttl_ms;
	return KV_OK;
}

/* The bounds of a count or delrange. */
static int
decode_bounds(ProtobufCBinaryData start, ProtobufCBinaryData end, ProtobufCBinaryData cursor,
              uint32_t limit, kv_op *op, const char **why)
{
	if (!key_ok(start) || !key_ok(end) || cursor.len > KV_HARD_MAX_KEY + 1) {
		*why = "range bound longer than the largest key";
		return KV_EINVAL;
	}
	op->start = kv_codec__bytes(start);
	op->end = kv_codec__bytes(end);
	op->cursor = kv_codec__bytes(cursor);
	op->limit = limit;
	return KV_OK;
}

static int
decode_op(const Shardkv__Op *o, kv_op *op, const char **why)
{
	int rv;

	memset(op, 0, sizeof(*op));
	op->request_id = o->request_id;
	op->retry = o->retry;
	switch (o->op_case) {
	case SHARDKV__OP__OP_GET:
		op->kind = KV_OP_GET;
		op->key = kv_codec__bytes(o->get->key);
		break;
	case SHARDKV__OP__OP_PUT:
		op->kind = KV_OP_PUT;
		op->key = kv_codec__bytes(o->put->key);
		op->value = kv_codec__bytes(o->put->value);
		if ((rv = decode_cond(o->put->cond, o->put->expect, true, op, why)) != KV_OK ||
		    (rv = decode_ttl(o->put->ttl_ms, op, why)) != KV_OK)
			return rv;
		break;
	case SHARDKV__OP__OP_DEL:
		op->kind = KV_OP_DEL;
		op->key = kv_codec__bytes(o->del->key);
		op->no_value = o->del->no_value;
		if ((rv = decode_cond(o->del->cond, o->del->expect, false, op, why)) != KV_OK)
			return rv;
		break;
	case SHARDKV__OP__OP_APPEND:
		op->kind = KV_OP_APPEND;
		op->key = kv_codec__bytes(o->append->key);
		op->value = kv_codec__bytes(o->append->value);
		break;
	case SHARDKV__OP__OP_MGET:
	case SHARDKV__OP__OP_MPUT: {
		size_t nk, nv = 0;
		ProtobufCBinaryData *ks, *vs = NULL;
		if (o->op_case == SHARDKV__OP__OP_MGET) {
			op->kind = KV_OP_MGET;
			nk = o->mget->n_keys;
			ks = o->mget->keys;
		} else {
			op->kind = KV_OP_MPUT;
			nk = o->mput->n_keys;
			ks = o->mput->keys;
			nv = o->mput->n_values;
			vs = o->mput->values;
			if ((rv = decode_ttl(o->mput->ttl_ms, op, why)) != KV_OK)
				return rv;
		}
		if (nk > KV_DATA_MAX_MULTI || nv > KV_DATA_MAX_MULTI) {
			*why = "too many keys in one mget/mput";
			return KV_ELIMIT;
		}
		kv_bytes *kk = NULL, *vv = NULL;
		if (nk && (op->keys = kk = kv_zalloc(nk, sizeof(kv_bytes))) == NULL)
			return KV_ENOMEM;
		if (nv && (op->vals = vv = kv_zalloc(nv, sizeof(kv_bytes))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < nk; i++)
			kk[i] = kv_codec__bytes(ks[i]);
		for (size_t i = 0; i < nv; i++)
			vv[i] = kv_codec__bytes(vs[i]);
		op->nkeys = nk;
		op->nvals = nv;
		break;
	}
	case SHARDKV__OP__OP_SCAN:
		op->kind = KV_OP_SCAN;
		op->start = kv_codec__bytes(o->scan->start);
		op->end = kv_codec__bytes(o->scan->end);
		op->prefix = kv_codec__bytes(o->scan->prefix);
		op->cursor = kv_codec__bytes(o->scan->cursor);
		op->limit = o->scan->limit;
		op->keys_only = o->scan->keys_only;
		op->max_bytes = o->scan->max_bytes;
		if (!key_ok(o->scan->start) || !key_ok(o->scan->end) || !key_ok(o->scan->prefix) ||
		    o->scan->cursor.len > KV_HARD_MAX_KEY + 1) {
			*why = "scan bound longer than the largest key";
			return KV_EINVAL;
		}
		break;
	case SHARDKV__OP__OP_EXPIRE:
		op->kind = KV_OP_EXPIRE;
		op->key = kv_codec__bytes(o->expire->key);
		op->persist = o->expire->persist;
		if ((o->expire->ttl_ms == 0) == !o->expire->persist) {
			*why = "expire needs either a TTL over 0 or persist";
			return KV_EINVAL;
		}
		if ((rv = decode_ttl(o->expire->ttl_ms, op, why)) != KV_OK)
			return rv;
		break;
	case SHARDKV__OP__OP_TTL:
		op->kind = KV_OP_TTL;
		op->key = kv_codec__bytes(o->ttl->key);
		break;
	case SHARDKV__OP__OP_INCR:
		op->kind = KV_OP_INCR;
		op->key = kv_codec__bytes(o->incr->key);
		op->delta = o->incr->delta;
		break;
	case SHARDKV__OP__OP_EXISTS:
		op->kind = KV_OP_EXISTS;
		op->key = kv_codec__bytes(o->exists->key);
		break;
	case SHARDKV__OP__OP_COUNT:
		op->kind = KV_OP_COUNT;
		if ((rv = decode_bounds(o->count->start, o->count->end, o->count->cursor,
		                        o->count->limit, op, why)) != KV_OK)
			return rv;
		break;
	case SHARDKV__OP__OP_DELRANGE:
		op->kind = KV_OP_DELRANGE;
		if ((rv = decode_bounds(o->delrange->start, o->delrange->end, o->delrange->cursor,
		                        o->delrange->limit, op, why)) != KV_OK)
			return rv;
		break;
	default:
		*why = "op without a command";
		return KV_EINVAL;
	}
	return KV_OK;
}

/* Reads a varint at *i of b[0..n); false past the end or over 10 bytes. */
static bool
peek_varint(const uint8_t *b, size_t n, size_t *i, uint64_t *v)
{
	*v = 0;
	for (unsigned shift = 0; shift < 70 && *i < n; shift += 7) {
		uint8_t c = b[(*i)++];
		*v |= (uint64_t)(c & 0x7fu) << shift;
		if ((c & 0x80u) == 0)
			return true;
	}
	return false;
}

bool
kv_data_req_is_peer(const void *p, size_t n)
{
	return kv_data_req_peer_kind(p, n) != KV_PEER_NONE;
}

int
kv_data_req_peer_kind(const void *p, size_t n)
{
	const uint8_t *b = p;
	size_t i = 0;
	uint64_t tag, v;

	while (i < n) {
		if (!peek_varint(b, n, &i, &tag))
			return KV_PEER_NONE;
		switch (tag & 7u) {
		case 0:
			if (!peek_varint(b, n, &i, &v))
				return KV_PEER_NONE;
			break;
		case 1:
			i += 8;
			break;
		case 5:
			i += 4;
			break;
		case 2:
			if ((tag >> 3) == 7)
				return KV_PEER_TRANSFER; /* Request.transfer */
			if ((tag >> 3) == 10)
				return KV_PEER_REPLICATE; /* Request.replicate */
			if ((tag >> 3) == 6)
				return KV_PEER_NONE; /* Request.ops: a client's (decoding
				                      * refuses ops beside a transfer or
				                      * replicate) */
			if (!peek_varint(b, n, &i, &v) || v > n - i)
				return KV_PEER_NONE;
			i += (size_t)v;
			break;
		default:
			return KV_PEER_NONE;
		}
	}
	return KV_PEER_NONE;
}

int
kv_data_req_decode(const void *p, size_t n, kv_req *out, const char **why)
{
	Shardkv__Request *rq;
	int rv;

	memset(out, 0, sizeof(*out));
	*why = NULL;
	pb_arena *ar = pb_arena_new(n);
	if (ar == NULL)
		return KV_ENOMEM;
	rq = shardkv__request__unpack(&ar->a, n, p);
	if (rq == NULL) {
		pb_arena_free(ar);
		*why = "undecodable request";
		return KV_EPROTO;
	}
	ar->msg = rq;
	out->pb = ar;
	out->client_id = rq->client_id;
	out->request_id = rq->request_id;
	out->epoch = rq->epoch;
	out->from_node = rq->from_node;
	out->timeout_ms = rq->timeout_ms;
	out->auth = kv_codec__bytes(rq->auth_token);
	if (rq->version != SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1) {
		*why = "unsupported protocol version; this server speaks version 1";
		return KV_EINVAL;
	}
	if ((rq->n_ops != 0) + (rq->transfer != NULL) + (rq->replicate != NULL) > 1) {
		*why = "a request carries ops, a transfer or a replicate, only one of them";
		return KV_EINVAL;
	}
	if (rq->n_ops > KV_DATA_MAX_OPS) {
		*why = "too many ops in one request";
		return KV_ELIMIT;
	}
	if (rq->n_ops && (out->ops = kv_zalloc(rq->n_ops, sizeof(kv_op))) == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < rq->n_ops; i++, out->nops++)
		if ((rv = decode_op(rq->ops[i], &out->ops[i], why)) != 0) {
			out->nops++;
			return rv;
		}
	if (rq->transfer) {
		out->has_xfer = true;
		if ((rv = kv_xfer__from_pb(rq->transfer, &out->xfer, why)) != 0)
			return rv;
	}
	if (rq->replicate) {
		out->has_repl = true;
		if ((rv = kv_repl__from_pb(rq->replicate, &out->repl, why)) != 0)
			return rv;
	}
	return KV_OK;
}

void
kv_data_req_fini(kv_req *r)
{
	if (r == NULL)
		return;
	for (size_t i = 0; i < r->nops; i++) {
		/* Decoded: the arrays are the request's (data_codec.h). */
		free((kv_bytes *)r->ops[i].keys);
		free((kv_bytes *)r->ops[i].vals);
	}
	free(r->ops);
	kv_xfer__fini(&r->xfer);
	kv_repl__fini(&r->repl);
	pb_arena_free(r->pb);
	memset(r, 0, sizeof(*r));
}

/* Frees the buffers of one result, leaving the struct as it is (a kv_buf
 * owns its data alone: kv_buf_fini is free and clear). */
static void
result_free(kv_data_result *r)
{
	free(r->value.data);
	for (size_t i = 0; r->values && i < r->nvalues; i++)
		free(r->values[i].data);
	free(r->values);
	free(r->missing);
	for (size_t i = 0; r->entries && i < r->nentries; i++) {
		free(r->entries[i].key.data);
		free(r->entries[i].value.data);
	}
	free(r->entries);
	free(r->next_cursor.data);
	free(r->hint.start.data);
	free(r->hint.end.data);
	free(r->hint.address);
}

void
kv_data_result_fini(kv_data_result *r)
{
	if (r == NULL)
		return;
	result_free(r);
	memset(r, 0, sizeof(*r));
}

void
kv_data_result_reuse(kv_data_result *r, size_t keep)
{
	kv_buf v = r->value;

	r->value = (kv_buf){0};
	if (v.cap > keep) {
		free(v.data);
		v = (kv_buf){0};
	}
	result_free(r);
	memset(r, 0, sizeof(*r));
	r->value = v;
	r->value.len = 0;
}

/* Per-result temporary storage for encoding. */
typedef struct {
	Shardkv__OpResult r;         /* the result message */
	Shardkv__OwnerHint h;        /* its hint */
	ProtobufCBinaryData *values; /* mget values */
	Shardkv__KeyValue *kvs;      /* scan entries */
	Shardkv__KeyValue **kvp;     /* pointers to kvs */
} enc_result;

static int
fill_result(enc_result *e, const kv_data_result *r)
{
	Shardkv__OpResult init = SHARDKV__OP_RESULT__INIT;
	Shardkv__OwnerHint hinit = SHARDKV__OWNER_HINT__INIT;

	e->r = init;
	e->h = hinit;
	e->r.status = kv_wire_from_err(r->status);
	if (r->error)
		e->r.error = (char *)r->error;
	if (r->has_value)
		e->r.value = kv_codec__pbuf(&r->value);
	e->r.value_len = r->value_len;
	e->r.value_unknown = r->value_unknown;
	e->r.ttl_ms = r->ttl_ms;
	e->r.number = r->number;
	e->r.count = r->count;
	e->r.current_absent = r->current_absent;
	if (r->nvalues) {
		if ((e->values = kv_zalloc(r->nvalues, sizeof(*e->values))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < r->nvalues; i++)
			e->values[i] = kv_codec__pbuf(&r->values[i]);
		e->r.n_values = r->nvalues;
		e->r.values = e->values;
	}
	e->r.n_missing = r->nmissing;
	e->r.missing = r->missing;
	if (r->nentries) {
		Shardkv__KeyValue kinit = SHARDKV__KEY_VALUE__INIT;
		e->kvs = kv_zalloc(r->nentries, sizeof(*e->kvs));
		e->kvp = kv_zalloc(r->nentries, sizeof(*e->kvp));
		if (e->kvs == NULL || e->kvp == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < r->nentries; i++) {
			e->kvs[i] = kinit;
			e->kvs[i].key = kv_codec__pbuf(&r->entries[i].key);
			e->kvs[i].value = kv_codec__pbuf(&r->entries[i].value);
			e->kvp[i] = &e->kvs[i];
		}
		e->r.n_entries = r->nentries;
		e->r.entries = e->kvp;
	}
	e->r.more = r->more;
	e->r.next_cursor = kv_codec__pbuf(&r->next_cursor);
	if (r->has_hint) {
		e->h.epoch = r->hint.epoch;
		e->h.start = kv_codec__pbuf(&r->hint.start);
		e->h.end = kv_codec__pbuf(&r->hint.end);
		e->h.node_id = r->hint.node_id;
		e->h.address = r->hint.address ? r->hint.address : "";
		e->r.owner = &e->h;
	}
	return KV_OK;
}

int
kv_data_resp_encode(const kv_resp *r, nng_msg **out)
{
	Shardkv__Response m = SHARDKV__RESPONSE__INIT;
	Shardkv__TransferAck ack = SHARDKV__TRANSFER_ACK__INIT;
	Shardkv__ReplicateAck rack = SHARDKV__REPLICATE_ACK__INIT;
	enc_result *er = NULL;
	Shardkv__OpResult **rp = NULL;
	int rv = KV_ENOMEM;

	m.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	m.request_id = r->request_id;
	m.epoch = r->epoch;
	m.node_id = r->node_id;
	m.status = kv_wire_from_err(r->status);
	if (r->error)
		m.error = (char *)r->error;
	if (r->nresults) {
		er = kv_zalloc(r->nresults, sizeof(*er));
		rp = kv_zalloc(r->nresults, sizeof(*rp));
		if (er == NULL || rp == NULL)
			goto cleanup;
		for (size_t i = 0; i < r->nresults; i++) {
			if (fill_result(&er[i], &r->results[i]) != 0)
				goto cleanup;
			rp[i] = &er[i].r;
		}
		m.n_results = r->nresults;
		m.results = rp;
	}
	if (r->has_ack) {
		ack.migration_id = r->ack.migration_id;
		ack.status = kv_wire_from_err(r->ack.status);
		if (r->ack.error)
			ack.error = (char *)r->ack.error;
		ack.seq = r->ack.seq;
		ack.keys = r->ack.keys;
		ack.bytes = r->ack.bytes;
		ack.packed_entries = r->ack.packed_ok;
		ack.committed = r->ack.committed;
		m.transfer_ack = &ack;
	}
	if (r->has_rack) {
		rack.acked_seq = r->rack.acked_seq;
		rack.acked_lsn = r->rack.acked_lsn;
		rack.status = kv_wire_from_err(r->rack.status);
		rack.diverged = r->rack.diverged;
		rack.caught_up = r->rack.caught_up;
		rack.position = r->rack.position;
		rack.packed_records = r->rack.packed_ok;
		if (r->rack.error)
			rack.error = (char *)r->rack.error;
		m.replicate_ack = &rack;
	}
	rv = kv_codec__pack(&m.base, out);
cleanup:
	if (er)
		for (size_t i = 0; i < r->nresults; i++) {
			free(er[i].values);
			free(er[i].kvs);
			free(er[i].kvp);
		}
	free(er);
	free(rp);
	return rv;
}

/* The sub-messages of one op of an encoded Request. */
typedef struct {
	Shardkv__Op op;              /* the op */
	ProtobufCBinaryData *keys;   /* mget, mput keys */
	ProtobufCBinaryData *values; /* mput values */
	union {
		Shardkv__GetOp get;
		Shardkv__PutOp put;
		Shardkv__DelOp del;
		Shardkv__AppendOp app;
		Shardkv__MGetOp mget;
		Shardkv__MPutOp mput;
		Shardkv__ScanOp scan;
		Shardkv__ExpireOp expire;
		Shardkv__TtlOp ttl;
		Shardkv__IncrOp incr;
		Shardkv__ExistsOp exists;
		Shardkv__CountOp count;
		Shardkv__DelRangeOp delrange;
	} u; /* the oneof */
} enc_op;

static int
fill_op(enc_op *e, const kv_op *o)
{
	Shardkv__Op *p = &e->op;

	shardkv__op__init(p);
	p->request_id = o->request_id;
	p->retry = o->retry;
	switch (o->kind) {
	case KV_OP_GET:
		shardkv__get_op__init(&e->u.get);
		e->u.get.key = kv_codec__pb(o->key);
		p->op_case = SHARDKV__OP__OP_GET;
		p->get = &e->u.get;
		return KV_OK;
	case KV_OP_PUT:
		shardkv__put_op__init(&e->u.put);
		e->u.put.key = kv_codec__pb(o->key);
		e->u.put.value = kv_codec__pb(o->value);
		e->u.put.ttl_ms = o->ttl_ms;
		e->u.put.cond = (Shardkv__Cond)o->cond;
		e->u.put.expect = kv_codec__pb(o->expect);
		p->op_case = SHARDKV__OP__OP_PUT;
		p->put = &e->u.put;
		return KV_OK;
	case KV_OP_DEL:
		shardkv__del_op__init(&e->u.del);
		e->u.del.key = kv_codec__pb(o->key);
		e->u.del.no_value = o->no_value;
		e->u.del.cond = (Shardkv__Cond)o->cond;
		e->u.del.expect = kv_codec__pb(o->expect);
		p->op_case = SHARDKV__OP__OP_DEL;
		p->del = &e->u.del;
		return KV_OK;
	case KV_OP_APPEND:
		shardkv__append_op__init(&e->u.app);
		e->u.app.key = kv_codec__pb(o->key);
		e->u.app.value = kv_codec__pb(o->value);
		p->op_case = SHARDKV__OP__OP_APPEND;
		p->append = &e->u.app;
		return KV_OK;
	case KV_OP_MGET:
	case KV_OP_MPUT:
		if (o->nkeys == 0 || (o->kind == KV_OP_MPUT && o->nvals != o->nkeys))
			return KV_EINVAL;
		if ((e->keys = kv_zalloc(o->nkeys, sizeof(*e->keys))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < o->nkeys; i++)
			e->keys[i] = kv_codec__pb(o->keys[i]);
		if (o->kind == KV_OP_MGET) {
			shardkv__mget_op__init(&e->u.mget);
			e->u.mget.n_keys = o->nkeys;
			e->u.mget.keys = e->keys;
			p->op_case = SHARDKV__OP__OP_MGET;
			p->mget = &e->u.mget;
			return KV_OK;
		}
		if ((e->values = kv_zalloc(o->nvals, sizeof(*e->values))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < o->nvals; i++)
			e->values[i] = kv_codec__pb(o->vals[i]);
		shardkv__mput_op__init(&e->u.mput);
		e->u.mput.n_keys = o->nkeys;
		e->u.mput.keys = e->keys;
		e->u.mput.n_values = o->nvals;
		e->u.mput.values = e->values;
		e->u.mput.ttl_ms = o->ttl_ms;
		p->op_case = SHARDKV__OP__OP_MPUT;
		p->mput = &e->u.mput;
		return KV_OK;
	case KV_OP_SCAN:
		shardkv__scan_op__init(&e->u.scan);
		e->u.scan.start = kv_codec__pb(o->start);
		e->u.scan.end = kv_codec__pb(o->end);
		e->u.scan.prefix = kv_codec__pb(o->prefix);
		e->u.scan.cursor = kv_codec__pb(o->cursor);
		e->u.scan.limit = o->limit;
		e->u.scan.keys_only = o->keys_only;
		e->u.scan.max_bytes = o->max_bytes;
		p->op_case = SHARDKV__OP__OP_SCAN;
		p->scan = &e->u.scan;
		return KV_OK;
	case KV_OP_EXPIRE:
		shardkv__expire_op__init(&e->u.expire);
		e->u.expire.key = kv_codec__pb(o->key);
		e->u.expire.ttl_ms = o->persist ? 0 : o->ttl_ms;
		e->u.expire.persist = o->persist;
		p->op_case = SHARDKV__OP__OP_EXPIRE;
		p->expire = &e->u.expire;
		return KV_OK;
	case KV_OP_TTL:
		shardkv__ttl_op__init(&e->u.ttl);
		e->u.ttl.key = kv_codec__pb(o->key);
		p->op_case = SHARDKV__OP__OP_TTL;
		p->ttl = &e->u.ttl;
		return KV_OK;
	case KV_OP_INCR:
		shardkv__incr_op__init(&e->u.incr);
		e->u.incr.key = kv_codec__pb(o->key);
		e->u.incr.delta = o->delta;
		p->op_case = SHARDKV__OP__OP_INCR;
		p->incr = &e->u.incr;
		return KV_OK;
	case KV_OP_EXISTS:
		shardkv__exists_op__init(&e->u.exists);
		e->u.exists.key = kv_codec__pb(o->key);
		p->op_case = SHARDKV__OP__OP_EXISTS;
		p->exists = &e->u.exists;
		return KV_OK;
	case KV_OP_COUNT:
		shardkv__count_op__init(&e->u.count);
		e->u.count.start = kv_codec__pb(o->start);
		e->u.count.end = kv_codec__pb(o->end);
		e->u.count.cursor = kv_codec__pb(o->cursor);
		e->u.count.limit = o->limit;
		p->op_case = SHARDKV__OP__OP_COUNT;
		p->count = &e->u.count;
		return KV_OK;
	case KV_OP_DELRANGE:
		shardkv__del_range_op__init(&e->u.delrange);
		e->u.delrange.start = kv_codec__pb(o->start);
		e->u.delrange.end = kv_codec__pb(o->end);
		e->u.delrange.cursor = kv_codec__pb(o->cursor);
		e->u.delrange.limit = o->limit;
		p->op_case = SHARDKV__OP__OP_DELRANGE;
		p->delrange = &e->u.delrange;
		return KV_OK;
	default:
		return KV_EINVAL;
	}
}

int
kv_data_req_encode(const kv_req *r, nng_msg **out)
{
	Shardkv__Request m = SHARDKV__REQUEST__INIT;
	enc_op *eo = NULL;
	Shardkv__Op **po = NULL;
	int rv = KV_ENOMEM;

	if (r->has_xfer || r->has_repl)
		return KV_EINVAL; /* kv_xfer_encode's and kv_repl_encode's */
	m.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	m.client_id = r->client_id;
	m.request_id = r->request_id;
	m.epoch = r->epoch;
	m.auth_token = kv_codec__pb(r->auth);
	m.timeout_ms = r->timeout_ms;
	m.from_node = r->from_node;
	if (r->nops) {
		eo = kv_zalloc(r->nops, sizeof(*eo));
		po = kv_zalloc(r->nops, sizeof(*po));
		if (eo == NULL || po == NULL)
			goto cleanup;
		for (size_t i = 0; i < r->nops; i++) {
			if ((rv = fill_op(&eo[i], &r->ops[i])) != KV_OK)
				goto cleanup;
			po[i] = &eo[i].op;
		}
		m.n_ops = r->nops;
		m.ops = po;
	}
	rv = kv_codec__pack(&m.base, out);
cleanup:
	for (size_t i = 0; eo && i < r->nops; i++) {
		free(eo[i].keys);
		free(eo[i].values);
	}
	free(eo);
	free(po);
	return rv;
}

/* Bound on a decoded string (error details, addresses). */
#define STR_MAX (64 * 1024)

static bool
str_ok(const char *s)
{
	return s == NULL || strlen(s) <= STR_MAX;
}

/* Copies b into dst, always allocating (data != NULL even for an empty
 * field, NUL-terminated), when it fits max. */
static int
copy_bytes(kv_buf *dst, ProtobufCBinaryData b, size_t max)
{
	memset(dst, 0, sizeof(*dst));
	if (b.len > max)
		return KV_EPROTO;
	if ((dst->data = malloc(b.len + 1)) == NULL)
		return KV_ENOMEM;
	dst->cap = b.len + 1;
	if (b.len)
		memcpy(dst->data, b.data, b.len);
	dst->data[b.len] = 0;
	dst->len = b.len;
	return KV_OK;
}

static int
result_from_pb(const Shardkv__OpResult *res, kv_data_result *r)
{
	int rv;

	r->status = kv_err_from_wire((int)res->status);
	if (!str_ok(res->error))
		return KV_EPROTO;
	r->error = res->error && res->error[0] ? res->error : NULL;
	if (res->owner) {
		const Shardkv__OwnerHint *h = res->owner;
		r->has_hint = true;
		r->hint.epoch = h->epoch;
		r->hint.node_id = h->node_id;
		if ((rv = copy_bytes(&r->hint.start, h->start, KV_HARD_MAX_KEY)) != KV_OK ||
		    (rv = copy_bytes(&r->hint.end, h->end, KV_HARD_MAX_KEY)) != KV_OK)
			return rv;
		if (!str_ok(h->address))
			return KV_EPROTO;
		if (h->address && h->address[0] && (r->hint.address = strdup(h->address)) == NULL)
			return KV_ENOMEM;
	}
	if (res->value.len) {
		r->has_value = true;
		if ((rv = copy_bytes(&r->value, res->value, KV_HARD_MAX_VALUE)) != KV_OK)
			return rv;
	}
	r->value_len = res->value_len;
	r->value_unknown = res->value_unknown;
	r->ttl_ms = res->ttl_ms;
	r->number = res->number;
	r->count = res->count;
	r->current_absent = res->current_absent;
	if (res->n_values > KV_DATA_MAX_MULTI || res->n_missing > KV_DATA_MAX_MULTI)
		return KV_EPROTO;
	if (res->n_values) {
		if ((r->values = kv_zalloc(res->n_values, sizeof(kv_buf))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < res->n_values; i++, r->nvalues++)
			if ((rv = copy_bytes(&r->values[i], res->values[i], KV_HARD_MAX_VALUE)) !=
			    KV_OK)
				return rv;
	}
	if (res->n_missing) {
		if ((r->missing = malloc(res->n_missing * sizeof(uint32_t))) == NULL)
			return KV_ENOMEM;
		memcpy(r->missing, res->missing, res->n_missing * sizeof(uint32_t));
		r->nmissing = res->n_missing;
	}
	if (res->n_entries) {
		if ((r->entries = kv_zalloc(res->n_entries, sizeof(kv_data_entry))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < res->n_entries; i++, r->nentries++) {
			const Shardkv__KeyValue *kv = res->entries[i];
			if (kv->value_total != 0)
				return KV_EPROTO; /* scans never split values */
			if ((rv = copy_bytes(&r->entries[i].key, kv->key, KV_HARD_MAX_KEY)) !=
			        KV_OK ||
			    (rv = copy_bytes(&r->entries[i].value, kv->value, KV_HARD_MAX_VALUE)) !=
			        KV_OK) {
				r->nentries++;
				return rv;
			}
		}
	}
	r->more = res->more;
	if (res->next_cursor.len &&
	    (rv = copy_bytes(&r->next_cursor, res->next_cursor, KV_HARD_MAX_KEY)) != KV_OK)
		return rv;
	return KV_OK;
}

int
kv_data_resp_decode(const void *p, size_t n, kv_resp *out)
{
	Shardkv__Response *m;
	kv_data_result *res = NULL;
	int rv = KV_EPROTO;

	memset(out, 0, sizeof(*out));
	pb_arena *ar = pb_arena_new(n);
	if (ar == NULL)
		return KV_ENOMEM;
	if ((m = shardkv__response__unpack(&ar->a, n, p)) == NULL) {
		pb_arena_free(ar);
		return KV_EPROTO;
	}
	ar->msg = m;
	if (!str_ok(m->error) || m->n_results > KV_DATA_MAX_OPS ||
	    (m->transfer_ack && !str_ok(m->transfer_ack->error)) ||
	    (m->replicate_ack && !str_ok(m->replicate_ack->error)))
		goto err;
	if (m->n_results && (res = kv_zalloc(m->n_results, sizeof(*res))) == NULL) {
		rv = KV_ENOMEM;
		goto err;
	}
	out->results = res;
	for (size_t i = 0; i < m->n_results; i++) {
		out->nresults++;
		if ((rv = result_from_pb(m->results[i], &res[i])) != KV_OK)
			goto err;
	}
	out->request_id = m->request_id;
	out->epoch = m->epoch;
	out->node_id = m->node_id;
	out->status = kv_err_from_wire((int)m->status);
	out->error = m->error && m->error[0] ? m->error : NULL;
	if (m->transfer_ack) {
		out->has_ack = true;
		out->ack.migration_id = m->transfer_ack->migration_id;
		out->ack.status = kv_err_from_wire(m->transfer_ack->status);
		out->ack.error = m->transfer_ack->error && m->transfer_ack->error[0]
		                     ? m->transfer_ack->error
		                     : NULL;
		out->ack.seq = m->transfer_ack->seq;
		out->ack.keys = m->transfer_ack->keys;
		out->ack.bytes = m->transfer_ack->bytes;
		out->ack.packed_ok = m->transfer_ack->packed_entries;
		out->ack.committed = m->transfer_ack->committed;
	}
	if (m->replicate_ack) {
		out->has_rack = true;
		out->rack.acked_seq = m->replicate_ack->acked_seq;
		out->rack.acked_lsn = m->replicate_ack->acked_lsn;
		out->rack.status = kv_err_from_wire(m->replicate_ack->status);
		out->rack.diverged = m->replicate_ack->diverged;
		out->rack.caught_up = m->replicate_ack->caught_up;
		out->rack.position = m->replicate_ack->position;
		out->rack.packed_ok = m->replicate_ack->packed_records;
		out->rack.error = m->replicate_ack->error && m->replicate_ack->error[0]
		                      ? m->replicate_ack->error
		                      : NULL;
	}
	out->pb = ar;
	return KV_OK;
err:
	out->pb = ar;
	kv_data_resp_fini(out);
	return rv == KV_ENOMEM ? KV_ENOMEM : KV_EPROTO;
}

void
kv_data_resp_fini(kv_resp *r)
{
	if (r == NULL)
		return;
	/* The results go with their array: no need to clear each. */
	for (size_t i = 0; r->results && i < r->nresults; i++)
		result_free(&r->results[i]);
	free(r->results);
	pb_arena_free(r->pb);
	memset(r, 0, sizeof(*r));
}
