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
 */
#include "proto/data_codec.h"
#include "common/err.h"
#include "proto/codec_int.h"
#include "proto/wire.h"

#include <stdlib.h>
#include <string.h>

/* Returns whether a byte field fits the hard limit. */
static bool
key_ok(ProtobufCBinaryData d)
{
	return d.len <= KV_HARD_MAX_KEY;
}

static int
decode_op(const Shardkv__Op *o, kv_op *op, const char **why)
{
	memset(op, 0, sizeof(*op));
	op->request_id = o->request_id;
	switch (o->op_case) {
	case SHARDKV__OP__OP_GET:
		op->kind = KV_OP_GET;
		op->key = kv_codec__bytes(o->get->key);
		break;
	case SHARDKV__OP__OP_PUT:
		op->kind = KV_OP_PUT;
		op->key = kv_codec__bytes(o->put->key);
		op->value = kv_codec__bytes(o->put->value);
		break;
	case SHARDKV__OP__OP_DEL:
		op->kind = KV_OP_DEL;
		op->key = kv_codec__bytes(o->del->key);
		op->no_value = o->del->no_value;
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
		}
		if (nk > KV_DATA_MAX_MULTI || nv > KV_DATA_MAX_MULTI) {
			*why = "too many keys in one mget/mput";
			return KV_ELIMIT;
		}
		if (nk && (op->keys = calloc(nk, sizeof(kv_bytes))) == NULL)
			return KV_ENOMEM;
		if (nv && (op->vals = calloc(nv, sizeof(kv_bytes))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < nk; i++)
			op->keys[i] = kv_codec__bytes(ks[i]);
		for (size_t i = 0; i < nv; i++)
			op->vals[i] = kv_codec__bytes(vs[i]);
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
	default:
		*why = "op without a command";
		return KV_EINVAL;
	}
	return KV_OK;
}

int
kv_data_req_decode(const void *p, size_t n, kv_req *out, const char **why)
{
	Shardkv__Request *rq;
	int rv;

	memset(out, 0, sizeof(*out));
	*why = NULL;
	rq = shardkv__request__unpack(NULL, n, p);
	if (rq == NULL) {
		*why = "undecodable request";
		return KV_EPROTO;
	}
	out->pb = rq;
	out->client_id = rq->client_id;
	out->request_id = rq->request_id;
	out->epoch = rq->epoch;
	out->from_node = rq->from_node;
	out->auth = kv_codec__bytes(rq->auth_token);
	if (rq->version != SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1) {
		*why = "unsupported protocol version; this server speaks version 1";
		return KV_EINVAL;
	}
	if (rq->n_ops && rq->transfer) {
		*why = "a request carries ops or a transfer, not both";
		return KV_EINVAL;
	}
	if (rq->n_ops > KV_DATA_MAX_OPS) {
		*why = "too many ops in one request";
		return KV_ELIMIT;
	}
	if (rq->n_ops && (out->ops = calloc(rq->n_ops, sizeof(kv_op))) == NULL)
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
	return KV_OK;
}

void
kv_data_req_fini(kv_req *r)
{
	if (r == NULL)
		return;
	for (size_t i = 0; i < r->nops; i++) {
		free(r->ops[i].keys);
		free(r->ops[i].vals);
	}
	free(r->ops);
	kv_xfer__fini(&r->xfer);
	if (r->pb)
		shardkv__request__free_unpacked(r->pb, NULL);
	memset(r, 0, sizeof(*r));
}

void
kv_data_result_fini(kv_data_result *r)
{
	if (r == NULL)
		return;
	kv_buf_fini(&r->value);
	for (size_t i = 0; i < r->nvalues; i++)
		kv_buf_fini(&r->values[i]);
	free(r->values);
	free(r->missing);
	for (size_t i = 0; i < r->nentries; i++) {
		kv_buf_fini(&r->entries[i].key);
		kv_buf_fini(&r->entries[i].value);
	}
	free(r->entries);
	kv_buf_fini(&r->next_cursor);
	kv_buf_fini(&r->hint.start);
	kv_buf_fini(&r->hint.end);
	memset(r, 0, sizeof(*r));
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
	if (r->nvalues) {
		if ((e->values = calloc(r->nvalues, sizeof(*e->values))) == NULL)
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
		e->kvs = calloc(r->nentries, sizeof(*e->kvs));
		e->kvp = calloc(r->nentries, sizeof(*e->kvp));
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
		e->h.address = (char *)r->hint.address;
		e->r.owner = &e->h;
	}
	return KV_OK;
}

int
kv_data_resp_encode(const kv_resp *r, nng_msg **out)
{
	Shardkv__Response m = SHARDKV__RESPONSE__INIT;
	Shardkv__TransferAck ack = SHARDKV__TRANSFER_ACK__INIT;
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
		er = calloc(r->nresults, sizeof(*er));
		rp = calloc(r->nresults, sizeof(*rp));
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
		m.transfer_ack = &ack;
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
