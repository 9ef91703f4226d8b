/*
 * server_codec.c - the shard server's protobuf boundary (server_codec.h).
 *
 * DESIGN. Decoding unpacks with protobuf-c and then walks the message once,
 * checking everything a peer could get wrong (version, oneofs, counts, hard
 * byte limits, enum values) before copying pointers into plain C structs, so
 * the dispatcher never sees an unchecked field. Encoding builds a temporary
 * message tree that borrows the caller's bytes, packs it straight into an
 * nng message body, and frees only the tree's own arrays (never with
 * free_unpacked). Transfer values may come in slices (KeyValue.value_total
 * != 0): each slice is checked here on its own, and migrate_in.c checks that
 * consecutive slices form one value.
 */
#include "shardserver/server_codec.h"
#include "common/err.h"
#include "proto/codec.h"
#include "proto/shardkv.pb-c.h"
#include "proto/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kv_bytes
bx(ProtobufCBinaryData d)
{
	kv_bytes b = {.p = d.data, .len = d.len};
	return b;
}

static ProtobufCBinaryData
pbb(const void *p, size_t n)
{
	ProtobufCBinaryData d = {.len = n, .data = (uint8_t *)p};
	return d;
}

static ProtobufCBinaryData
pbk(kv_bytes b)
{
	return pbb(b.p, b.len);
}

static ProtobufCBinaryData
pbuf(const kv_buf *b)
{
	return pbb(b->data, b->len);
}

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
		op->key = bx(o->get->key);
		break;
	case SHARDKV__OP__OP_PUT:
		op->kind = KV_OP_PUT;
		op->key = bx(o->put->key);
		op->value = bx(o->put->value);
		break;
	case SHARDKV__OP__OP_DEL:
		op->kind = KV_OP_DEL;
		op->key = bx(o->del->key);
		op->no_value = o->del->no_value;
		break;
	case SHARDKV__OP__OP_APPEND:
		op->kind = KV_OP_APPEND;
		op->key = bx(o->append->key);
		op->value = bx(o->append->value);
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
		if (nk > KV_SC_MAX_MULTI || nv > KV_SC_MAX_MULTI) {
			*why = "too many keys in one mget/mput";
			return KV_ELIMIT;
		}
		if (nk && (op->keys = calloc(nk, sizeof(kv_bytes))) == NULL)
			return KV_ENOMEM;
		if (nv && (op->vals = calloc(nv, sizeof(kv_bytes))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < nk; i++)
			op->keys[i] = bx(ks[i]);
		for (size_t i = 0; i < nv; i++)
			op->vals[i] = bx(vs[i]);
		op->nkeys = nk;
		op->nvals = nv;
		break;
	}
	case SHARDKV__OP__OP_SCAN:
		op->kind = KV_OP_SCAN;
		op->start = bx(o->scan->start);
		op->end = bx(o->scan->end);
		op->prefix = bx(o->scan->prefix);
		op->cursor = bx(o->scan->cursor);
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

static int
decode_dedup(const Shardkv__DedupEntry *d, kv_sc_dedup *out)
{
	memset(out, 0, sizeof(*out));
	if (d == NULL || d->client_id == 0 || d->request_id == 0 || !key_ok(d->key))
		return KV_EINVAL;
	out->client_id = d->client_id;
	out->request_id = d->request_id;
	out->key = bx(d->key);
	out->time_ms = d->time_ms;
	if (d->result) {
		out->status = kv_err_from_wire(d->result->status);
		out->value_len = d->result->value_len;
		out->value = bx(d->result->value);
	}
	return KV_OK;
}

/*
 * Decodes one transfer entry. A whole entry (value_total 0) must have offset
 * 0; a slice must carry at least one byte and lie inside a total of at most
 * KV_HARD_MAX_VALUE (the server's own --max-value is checked by migrate_in.c).
 * Sets *why and returns KV_EINVAL otherwise.
 */
static int
decode_kv(const Shardkv__KeyValue *kv, kv_sc_kv *out, const char **why)
{
	if (kv == NULL || kv->key.len == 0 || !key_ok(kv->key) ||
	    kv->value.len > KV_HARD_MAX_VALUE) {
		*why = "bad transfer entry (key or value size)";
		return KV_EINVAL;
	}
	if (kv->value_total == 0 && kv->value_offset != 0) {
		*why = "bad transfer entry (offset without value_total)";
		return KV_EINVAL;
	}
	if (kv->value_total != 0 && (kv->value_total > KV_HARD_MAX_VALUE || kv->value.len == 0 ||
	                             kv->value_offset > kv->value_total ||
	                             kv->value.len > kv->value_total - kv->value_offset)) {
		*why = "bad value slice (empty, or outside value_total, or value_total over the "
		       "hard limit)";
		return KV_EINVAL;
	}
	out->key = bx(kv->key);
	out->value = bx(kv->value);
	out->value_offset = kv->value_offset;
	out->value_total = kv->value_total;
	return KV_OK;
}

static int
decode_xfer(const Shardkv__Transfer *t, kv_xfer *x, const char **why)
{
	int rv;

	memset(x, 0, sizeof(*x));
	x->migration_id = t->migration_id;
	x->seq = t->seq;
	if (t->migration_id == 0 || t->seq == 0) {
		*why = "transfer without migration id or seq";
		return KV_EINVAL;
	}
	switch (t->msg_case) {
	case SHARDKV__TRANSFER__MSG_BEGIN:
		x->kind = KV_XFER_BEGIN;
		x->epoch = t->begin->epoch;
		x->start = bx(t->begin->start);
		x->end = bx(t->begin->end);
		x->from_node = t->begin->from_node;
		x->to_node = t->begin->to_node;
		x->keys = t->begin->keys_total;
		x->bytes = t->begin->bytes_total;
		if (!key_ok(t->begin->start) || !key_ok(t->begin->end) ||
		    kv_range_is_empty(x->start.p, x->start.len, x->end.p, x->end.len)) {
			*why = "bad transfer range";
			return KV_EINVAL;
		}
		return KV_OK;
	case SHARDKV__TRANSFER__MSG_CHUNK: {
		const Shardkv__TransferChunk *c = t->chunk;
		x->kind = KV_XFER_CHUNK;
		x->last = c->last;
		if (c->n_entries > KV_SC_MAX_XFER_RECS || c->n_dedup > KV_SC_MAX_XFER_RECS) {
			*why = "chunk too large";
			return KV_ELIMIT;
		}
		if (c->n_entries && (x->kv = calloc(c->n_entries, sizeof(*x->kv))) == NULL)
			return KV_ENOMEM;
		if (c->n_dedup && (x->dedup = calloc(c->n_dedup, sizeof(*x->dedup))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < c->n_entries; i++, x->nkv++)
			if ((rv = decode_kv(c->entries[i], &x->kv[i], why)) != 0)
				return rv;
		for (size_t i = 0; i < c->n_dedup; i++, x->ndedup++)
			if ((rv = decode_dedup(c->dedup[i], &x->dedup[i])) != 0) {
				*why = "bad dedup entry";
				return rv;
			}
		return KV_OK;
	}
	case SHARDKV__TRANSFER__MSG_DELTA: {
		const Shardkv__TransferDelta *d = t->delta;
		x->kind = KV_XFER_DELTA;
		if (d->n_records > KV_SC_MAX_XFER_RECS) {
			*why = "delta too large";
			return KV_ELIMIT;
		}
		if (d->n_records && (x->delta = calloc(d->n_records, sizeof(*x->delta))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < d->n_records; i++, x->ndelta++) {
			const Shardkv__DeltaRecord *r = d->records[i];
			kv_sc_delta *o = &x->delta[i];
			kv_sc_kv kv;
			if (r->op != SHARDKV__DELTA_OP__DELTA_OP_PUT &&
			    r->op != SHARDKV__DELTA_OP__DELTA_OP_DEL) {
				*why = "bad delta op";
				return KV_EINVAL;
			}
			if ((rv = decode_kv(r->kv, &kv, why)) != 0)
				return rv;
			o->seq = r->seq;
			o->del = r->op == SHARDKV__DELTA_OP__DELTA_OP_DEL;
			o->key = kv.key;
			o->value = kv.value;
			o->value_offset = kv.value_offset;
			o->value_total = kv.value_total;
			if (r->dedup) {
				if ((rv = decode_dedup(r->dedup, &o->dedup)) != 0) {
					*why = "bad dedup entry";
					return rv;
				}
				o->has_dedup = true;
			}
		}
		return KV_OK;
	}
	case SHARDKV__TRANSFER__MSG_FENCE:
		x->kind = KV_XFER_FENCE;
		x->last_write_seq = t->fence->last_write_seq;
		x->keys = t->fence->keys;
		x->bytes = t->fence->bytes;
		return KV_OK;
	case SHARDKV__TRANSFER__MSG_COMMIT:
		x->kind = KV_XFER_COMMIT;
		x->epoch = t->commit->epoch;
		return KV_OK;
	case SHARDKV__TRANSFER__MSG_ABORT:
		x->kind = KV_XFER_ABORT;
		x->reason = kv_err_from_wire(t->abort->reason);
		return KV_OK;
	default:
		*why = "transfer without a message";
		return KV_EINVAL;
	}
}

int
kv_sc_req_decode(const void *p, size_t n, kv_req *out, const char **why)
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
	out->auth = bx(rq->auth_token);
	if (rq->version != SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1) {
		*why = "unsupported protocol version; this server speaks version 1";
		return KV_EINVAL;
	}
	if (rq->n_ops && rq->transfer) {
		*why = "a request carries ops or a transfer, not both";
		return KV_EINVAL;
	}
	if (rq->n_ops > KV_SC_MAX_OPS) {
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
		if ((rv = decode_xfer(rq->transfer, &out->xfer, why)) != 0)
			return rv;
	}
	return KV_OK;
}

void
kv_sc_req_fini(kv_req *r)
{
	if (r == NULL)
		return;
	for (size_t i = 0; i < r->nops; i++) {
		free(r->ops[i].keys);
		free(r->ops[i].vals);
	}
	free(r->ops);
	free(r->xfer.kv);
	free(r->xfer.dedup);
	free(r->xfer.delta);
	if (r->pb)
		shardkv__request__free_unpacked(r->pb, NULL);
	memset(r, 0, sizeof(*r));
}

void
kv_sc_result_fini(kv_sc_result *r)
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

/* Packs any message into a new nng message. */
static int
pack_msg(const ProtobufCMessage *m, nng_msg **out)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	nng_msg *msg;

	if (nng_msg_alloc(&msg, n) != 0)
		return KV_ENOMEM;
	protobuf_c_message_pack(m, nng_msg_body(msg));
	*out = msg;
	return KV_OK;
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
fill_result(enc_result *e, const kv_sc_result *r)
{
	Shardkv__OpResult init = SHARDKV__OP_RESULT__INIT;
	Shardkv__OwnerHint hinit = SHARDKV__OWNER_HINT__INIT;

	e->r = init;
	e->h = hinit;
	e->r.status = kv_wire_from_err(r->status);
	if (r->error)
		e->r.error = (char *)r->error;
	if (r->has_value)
		e->r.value = pbuf(&r->value);
	e->r.value_len = r->value_len;
	if (r->nvalues) {
		if ((e->values = calloc(r->nvalues, sizeof(*e->values))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < r->nvalues; i++)
			e->values[i] = pbuf(&r->values[i]);
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
			e->kvs[i].key = pbuf(&r->entries[i].key);
			e->kvs[i].value = pbuf(&r->entries[i].value);
			e->kvp[i] = &e->kvs[i];
		}
		e->r.n_entries = r->nentries;
		e->r.entries = e->kvp;
	}
	e->r.more = r->more;
	e->r.next_cursor = pbuf(&r->next_cursor);
	if (r->has_hint) {
		e->h.epoch = r->hint.epoch;
		e->h.start = pbuf(&r->hint.start);
		e->h.end = pbuf(&r->hint.end);
		e->h.node_id = r->hint.node_id;
		e->h.address = (char *)r->hint.address;
		e->r.owner = &e->h;
	}
	return KV_OK;
}

int
kv_sc_resp_encode(const kv_resp *r, nng_msg **out)
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
	rv = pack_msg(&m.base, out);
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

static void
fill_dedup(Shardkv__DedupEntry *d, Shardkv__OpResult *res, const kv_sc_dedup *s)
{
	Shardkv__DedupEntry dinit = SHARDKV__DEDUP_ENTRY__INIT;
	Shardkv__OpResult rinit = SHARDKV__OP_RESULT__INIT;
	*d = dinit;
	*res = rinit;
	d->client_id = s->client_id;
	d->request_id = s->request_id;
	d->key = pbk(s->key);
	d->time_ms = s->time_ms;
	res->status = kv_wire_from_err(s->status);
	res->value_len = s->value_len;
	res->value = pbk(s->value);
	d->result = res;
}

int
kv_sc_xfer_encode(const kv_xfer *x, uint64_t epoch, uint32_t from_node, nng_msg **out)
{
	return kv_sc_xfer_encode_auth(x, epoch, from_node, (kv_bytes){0}, out);
}

int
kv_sc_xfer_encode_auth(const kv_xfer *x, uint64_t epoch, uint32_t from_node, kv_bytes auth,
                       nng_msg **out)
{
	Shardkv__Request m = SHARDKV__REQUEST__INIT;
	Shardkv__Transfer t = SHARDKV__TRANSFER__INIT;
	Shardkv__TransferBegin b = SHARDKV__TRANSFER_BEGIN__INIT;
	Shardkv__TransferChunk c = SHARDKV__TRANSFER_CHUNK__INIT;
	Shardkv__TransferDelta d = SHARDKV__TRANSFER_DELTA__INIT;
	Shardkv__TransferFence f = SHARDKV__TRANSFER_FENCE__INIT;
	Shardkv__TransferCommit cm = SHARDKV__TRANSFER_COMMIT__INIT;
	Shardkv__TransferAbort ab = SHARDKV__TRANSFER_ABORT__INIT;
	Shardkv__KeyValue *kvs = NULL, **kvp = NULL;
	Shardkv__DedupEntry *des = NULL, **dep = NULL;
	Shardkv__OpResult *dres = NULL;
	Shardkv__DeltaRecord *recs = NULL, **recp = NULL;
	size_t nd = x->kind == KV_XFER_DELTA ? x->ndelta : x->ndedup;
	int rv = KV_ENOMEM;

	m.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	m.epoch = epoch;
	m.from_node = from_node;
	m.auth_token = pbk(auth);
	m.transfer = &t;
	t.migration_id = x->migration_id;
	t.seq = x->seq;
	if (nd) {
		des = calloc(nd, sizeof(*des));
		dep = calloc(nd, sizeof(*dep));
		dres = calloc(nd, sizeof(*dres));
		if (des == NULL || dep == NULL || dres == NULL)
			goto cleanup;
	}
	switch (x->kind) {
	case KV_XFER_BEGIN:
		t.msg_case = SHARDKV__TRANSFER__MSG_BEGIN;
		t.begin = &b;
		b.epoch = x->epoch;
		b.start = pbk(x->start);
		b.end = pbk(x->end);
		b.from_node = x->from_node;
		b.to_node = x->to_node;
		b.keys_total = x->keys;
		b.bytes_total = x->bytes;
		break;
	case KV_XFER_CHUNK:
		t.msg_case = SHARDKV__TRANSFER__MSG_CHUNK;
		t.chunk = &c;
		c.last = x->last;
		if (x->nkv) {
			Shardkv__KeyValue kinit = SHARDKV__KEY_VALUE__INIT;
			kvs = calloc(x->nkv, sizeof(*kvs));
			kvp = calloc(x->nkv, sizeof(*kvp));
			if (kvs == NULL || kvp == NULL)
				goto cleanup;
			for (size_t i = 0; i < x->nkv; i++) {
				kvs[i] = kinit;
				kvs[i].key = pbk(x->kv[i].key);
				kvs[i].value = pbk(x->kv[i].value);
				kvs[i].value_offset = x->kv[i].value_offset;
				kvs[i].value_total = x->kv[i].value_total;
				kvp[i] = &kvs[i];
			}
			c.n_entries = x->nkv;
			c.entries = kvp;
		}
		for (size_t i = 0; i < x->ndedup; i++) {
			fill_dedup(&des[i], &dres[i], &x->dedup[i]);
			dep[i] = &des[i];
		}
		c.n_dedup = x->ndedup;
		c.dedup = dep;
		break;
	case KV_XFER_DELTA: {
		Shardkv__DeltaRecord rinit = SHARDKV__DELTA_RECORD__INIT;
		Shardkv__KeyValue kinit = SHARDKV__KEY_VALUE__INIT;
		t.msg_case = SHARDKV__TRANSFER__MSG_DELTA;
		t.delta = &d;
		if (x->ndelta) {
			recs = calloc(x->ndelta, sizeof(*recs));
			recp = calloc(x->ndelta, sizeof(*recp));
			kvs = calloc(x->ndelta, sizeof(*kvs));
			if (recs == NULL || recp == NULL || kvs == NULL)
				goto cleanup;
		}
		for (size_t i = 0; i < x->ndelta; i++) {
			const kv_sc_delta *s = &x->delta[i];
			recs[i] = rinit;
			kvs[i] = kinit;
			recs[i].seq = s->seq;
			recs[i].op = s->del ? SHARDKV__DELTA_OP__DELTA_OP_DEL
			                    : SHARDKV__DELTA_OP__DELTA_OP_PUT;
			kvs[i].key = pbk(s->key);
			kvs[i].value = pbk(s->value);
			kvs[i].value_offset = s->value_offset;
			kvs[i].value_total = s->value_total;
			recs[i].kv = &kvs[i];
			if (s->has_dedup) {
				fill_dedup(&des[i], &dres[i], &s->dedup);
				recs[i].dedup = &des[i];
			}
			recp[i] = &recs[i];
		}
		d.n_records = x->ndelta;
		d.records = recp;
		break;
	}
	case KV_XFER_FENCE:
		t.msg_case = SHARDKV__TRANSFER__MSG_FENCE;
		t.fence = &f;
		f.last_write_seq = x->last_write_seq;
		f.keys = x->keys;
		f.bytes = x->bytes;
		break;
	case KV_XFER_COMMIT:
		t.msg_case = SHARDKV__TRANSFER__MSG_COMMIT;
		t.commit = &cm;
		cm.epoch = x->epoch;
		break;
	case KV_XFER_ABORT:
		t.msg_case = SHARDKV__TRANSFER__MSG_ABORT;
		t.abort = &ab;
		ab.reason = kv_wire_from_err(x->reason);
		break;
	}
	rv = pack_msg(&m.base, out);
cleanup:
	free(kvs);
	free(kvp);
	free(des);
	free(dep);
	free(dres);
	free(recs);
	free(recp);
	return rv;
}

int
kv_sc_ack_decode(const void *p, size_t n, kv_sc_ack *ack)
{
	Shardkv__Response *r = shardkv__response__unpack(NULL, n, p);
	int rv;

	memset(ack, 0, sizeof(*ack));
	if (r == NULL)
		return KV_EPROTO;
	if (r->status != SHARDKV__STATUS__STATUS_OK) {
		rv = kv_err_from_wire(r->status);
		goto out;
	}
	if (r->transfer_ack == NULL) {
		rv = KV_EPROTO;
		goto out;
	}
	ack->migration_id = r->transfer_ack->migration_id;
	ack->status = kv_err_from_wire(r->transfer_ack->status);
	ack->seq = r->transfer_ack->seq;
	ack->keys = r->transfer_ack->keys;
	ack->bytes = r->transfer_ack->bytes;
	rv = KV_OK;
out:
	shardkv__response__free_unpacked(r, NULL);
	return rv;
}

int
kv_sc_adm_encode(const kv_adm_req *r, nng_msg **out)
{
	Shardkv__AdminRequest m = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__Register reg = SHARDKV__REGISTER__INIT;
	Shardkv__Watch w = SHARDKV__WATCH__INIT;
	Shardkv__Heartbeat hb = SHARDKV__HEARTBEAT__INIT;
	Shardkv__MigrationProgress pr = SHARDKV__MIGRATION_PROGRESS__INIT;
	Shardkv__MigrationDone dn = SHARDKV__MIGRATION_DONE__INIT;
	Shardkv__AdminLeave lv = SHARDKV__ADMIN_LEAVE__INIT;
	Shardkv__NodeRef ref = SHARDKV__NODE_REF__INIT;
	Shardkv__RangeStats *rs = NULL, **rsp = NULL;
	ProtobufCBinaryData *sk = NULL;
	int rv = KV_ENOMEM;

	m.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	m.client_id = r->client_id;
	m.request_id = r->request_id;
	m.timeout_ms = r->timeout_ms;
	m.auth_token = pbk(r->auth);
	switch (r->kind) {
	case KV_ADM_REGISTER:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_REGISTER_NODE;
		m.register_node = &reg;
		reg.address = (char *)r->address;
		reg.resume_node_id = r->node_id;
		reg.join = r->join;
		reg.boot_id = r->boot_id;
		if (r->cluster_id)
			reg.cluster_id = (char *)r->cluster_id;
		reg.epoch_applied = r->epoch;
		break;
	case KV_ADM_WATCH:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_WATCH;
		m.watch = &w;
		w.known_epoch = r->epoch;
		w.history = true;
		w.node_id = r->node_id;
		break;
	case KV_ADM_HEARTBEAT:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_HEARTBEAT;
		m.heartbeat = &hb;
		hb.node_id = r->node_id;
		hb.boot_id = r->boot_id;
		hb.epoch_applied = r->epoch;
		hb.keys = r->keys;
		hb.bytes = r->bytes;
		hb.ops_per_sec = r->ops_per_sec;
		hb.memory_bytes = r->memory_bytes;
		if (r->nranges) {
			Shardkv__RangeStats rinit = SHARDKV__RANGE_STATS__INIT;
			rs = calloc(r->nranges, sizeof(*rs));
			rsp = calloc(r->nranges, sizeof(*rsp));
			sk = calloc(r->nranges * 3, sizeof(*sk));
			if (rs == NULL || rsp == NULL || sk == NULL)
				goto cleanup;
			for (size_t i = 0; i < r->nranges; i++) {
				const kv_sc_range_stats *s = &r->ranges[i];
				rs[i] = rinit;
				rs[i].start = pbk(s->start);
				rs[i].end = pbk(s->end);
				rs[i].keys = s->keys;
				rs[i].bytes = s->bytes;
				rs[i].ops_per_sec = s->ops_per_sec;
				for (size_t j = 0; j < s->nsplit && j < 3; j++)
					sk[3 * i + j] = pbk(s->split[j]);
				rs[i].n_split_keys = s->nsplit < 3 ? s->nsplit : 3;
				rs[i].split_keys = &sk[3 * i];
				rsp[i] = &rs[i];
			}
			hb.n_ranges = r->nranges;
			hb.ranges = rsp;
		}
		break;
	case KV_ADM_PROGRESS:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_MIGRATION_PROGRESS;
		m.migration_progress = &pr;
		pr.migration_id = r->migration_id;
		pr.node_id = r->node_id;
		pr.phase = (Shardkv__MigrationPhase)r->phase;
		pr.keys_copied = r->keys;
		pr.bytes_copied = r->bytes;
		pr.keys_total = r->keys_total;
		pr.bytes_total = r->bytes_total;
		pr.rate_bytes_s = r->rate_bytes_s;
		break;
	case KV_ADM_DONE:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_MIGRATION_DONE;
		m.migration_done = &dn;
		dn.migration_id = r->migration_id;
		dn.node_id = r->node_id;
		dn.status = kv_wire_from_err(r->status);
		dn.keys = r->keys;
		dn.bytes = r->bytes;
		dn.last_seq = r->last_seq;
		break;
	case KV_ADM_LEAVE:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_LEAVE;
		m.leave = &lv;
		lv.node = &ref;
		ref.ref_case = SHARDKV__NODE_REF__REF_ID;
		ref.id = r->node_id;
		break;
	}
	rv = pack_msg(&m.base, out);
cleanup:
	free(rs);
	free(rsp);
	free(sk);
	return rv;
}

int
kv_sc_adm_decode(const void *p, size_t n, kv_adm_resp *out)
{
	Shardkv__AdminResponse *r = shardkv__admin_response__unpack(NULL, n, p);
	size_t nc;
	int rv = KV_OK;

	memset(out, 0, sizeof(*out));
	if (r == NULL)
		return KV_EPROTO;
	out->status = kv_err_from_wire(r->status);
	if (r->error)
		snprintf(out->error, sizeof(out->error), "%s", r->error);
	out->epoch = r->epoch;
	out->node_id = r->node_id;
	nc = r->n_configs + (r->config ? 1 : 0);
	if (nc > 100000) {
		rv = KV_EPROTO;
		goto out;
	}
	if (nc && (out->configs = calloc(nc, sizeof(kv_config *))) == NULL) {
		rv = KV_ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < r->n_configs && rv == 0; i++) {
		if ((rv = kv_codec_config_from_pb(r->configs[i], &out->configs[out->nconfigs])) ==
		    0)
			out->nconfigs++;
	}
	if (rv == 0 && r->n_configs == 0 && r->config) {
		if ((rv = kv_codec_config_from_pb(r->config, &out->configs[0])) == 0)
			out->nconfigs = 1;
	}
	if (rv != 0)
		kv_sc_adm_resp_fini(out);
out:
	shardkv__admin_response__free_unpacked(r, NULL);
	return rv;
}

void
kv_sc_adm_resp_fini(kv_adm_resp *r)
{
	if (r == NULL)
		return;
	for (size_t i = 0; i < r->nconfigs; i++)
		kv_config_free(r->configs[i]);
	free(r->configs);
	r->configs = NULL;
	r->nconfigs = 0;
}
