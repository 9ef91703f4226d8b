/*
 * codec.c - data requests and replies in the client's own terms: plain C
 * requests (kvc_op) go out through proto/data_codec.h, and decoded
 * Responses become kvc_reply, which owns everything it holds (buffers are
 * moved out of the decoded message, never copied twice).
 *
 * No wire coding happens here: validation and the protobuf messages are
 * proto/'s. What is left is the mapping between the client's structs and
 * the shared ones, and the rule the client adds on top of a decoded reply
 * (a reply to n ops carries n results). The controller's messages need no
 * mapping: client.c and admin.c use proto/admin_codec.h directly.
 */
#include "client/client_int.h"
#include "common/err.h"
#include "proto/data_codec.h"

#include <stdlib.h>
#include <string.h>

/* Moves a decoded buffer into dst, leaving src empty. */
static void
buf_move(kv_buf *dst, kv_buf *src)
{
	*dst = *src;
	memset(src, 0, sizeof(*src));
}

static int
copy_str(char **dst, const char *s)
{
	*dst = NULL;
	if (s == NULL || s[0] == 0)
		return KV_OK;
	*dst = strdup(s);
	return *dst ? KV_OK : KV_ENOMEM;
}

static kv_op_kind
op_kind(kvc_op_kind k)
{
	switch (k) {
	case KVC_GET:
		return KV_OP_GET;
	case KVC_PUT:
		return KV_OP_PUT;
	case KVC_DEL:
		return KV_OP_DEL;
	case KVC_APPEND:
		return KV_OP_APPEND;
	case KVC_MGET:
		return KV_OP_MGET;
	case KVC_MPUT:
		return KV_OP_MPUT;
	case KVC_SCAN:
		return KV_OP_SCAN;
	default:
		return KV_OP__COUNT; /* refused by the encoder */
	}
}

static void
op_fill(kv_op *o, const kvc_op *op)
{
	memset(o, 0, sizeof(*o));
	o->kind = op_kind(op->kind);
	o->request_id = op->request_id;
	o->key = op->key;
	o->value = op->value;
	if (op->kind == KVC_MGET || op->kind == KVC_MPUT) {
		o->nkeys = op->n;
		o->keys = op->keys;
	}
	if (op->kind == KVC_MPUT) {
		o->nvals = op->n;
		o->vals = op->values;
	}
	o->start = op->start;
	o->end = op->end;
	o->prefix = op->prefix;
	o->cursor = op->cursor;
	o->limit = op->limit;
	o->keys_only = op->keys_only;
}

static void
req_fill(kv_req *r, const kvc_envelope *env, kv_op *ops, size_t n)
{
	memset(r, 0, sizeof(*r));
	r->client_id = env->client_id;
	r->request_id = env->request_id;
	r->epoch = env->epoch;
	r->auth = env->auth;
	r->timeout_ms = env->timeout_ms;
	r->nops = n;
	r->ops = ops;
}

int
kvc_encode_request(const kvc_envelope *env, const kvc_op *op, nng_msg **out)
{
	kv_op o;
	kv_req r;

	op_fill(&o, op);
	req_fill(&r, env, &o, 1);
	return kv_data_req_encode(&r, out);
}

int
kvc_encode_request_batch(const kvc_envelope *env, const kvc_op *const *ops, size_t n, nng_msg **out)
{
	kv_op *o = calloc(n ? n : 1, sizeof(*o));
	kv_req r;
	int rv = KV_OK;

	if (o == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < n && rv == KV_OK; i++) {
		if (ops[i]->kind != KVC_GET && ops[i]->kind != KVC_PUT && ops[i]->kind != KVC_DEL &&
		    ops[i]->kind != KVC_APPEND)
			rv = KV_EINVAL; /* only single-key ops are coalesced */
		op_fill(&o[i], ops[i]);
	}
	req_fill(&r, env, o, n);
	if (rv == KV_OK)
		rv = kv_data_req_encode(&r, out);
	free(o);
	return rv;
}

/* The envelope of a decoded response into r (zeroed first). */
static int
reply_envelope(const kv_resp *d, kvc_reply *r)
{
	memset(r, 0, sizeof(*r));
	r->op_status = KV_EPROTO;
	r->status = d->status;
	r->epoch = d->epoch;
	r->node_id = d->node_id;
	return copy_str(&r->error, d->error);
}

/* Moves one decoded result into r, whose envelope is set. */
static int
reply_result(kv_data_result *res, kvc_reply *r)
{
	int rv;

	r->op_status = res->status;
	if (r->error == NULL && (rv = copy_str(&r->error, res->error)) != KV_OK)
		return rv;
	if (res->has_hint) {
		r->hint.set = true;
		r->hint.epoch = res->hint.epoch;
		r->hint.node = res->hint.node_id;
		buf_move(&r->hint.start, &res->hint.start);
		buf_move(&r->hint.end, &res->hint.end);
		r->hint.address = res->hint.address;
		res->hint.address = NULL;
	}
	buf_move(&r->value, &res->value);
	r->value_len = res->value_len;
	r->values = res->values;
	r->nvalues = res->nvalues;
	res->values = NULL;
	res->nvalues = 0;
	r->missing = res->missing;
	r->nmissing = res->nmissing;
	res->missing = NULL;
	res->nmissing = 0;
	r->entries = res->entries;
	r->nentries = res->nentries;
	res->entries = NULL;
	res->nentries = 0;
	r->more = res->more;
	buf_move(&r->next_cursor, &res->next_cursor);
	return KV_OK;
}

int
kvc_decode_reply(const void *p, size_t n, kvc_reply *r)
{
	kv_resp d;
	int rv;

	memset(r, 0, sizeof(*r));
	r->op_status = KV_EPROTO;
	if ((rv = kv_data_resp_decode(p, n, &d)) != KV_OK)
		return rv;
	if ((rv = reply_envelope(&d, r)) != KV_OK)
		goto err;
	if (d.status == KV_OK) {
		if (d.nresults != 1) {
			rv = KV_EPROTO;
			goto err;
		}
		if ((rv = reply_result(&d.results[0], r)) != KV_OK)
			goto err;
	}
	kv_data_resp_fini(&d);
	return KV_OK;
err:
	kv_data_resp_fini(&d);
	kvc_reply_fini(r);
	return rv;
}

int
kvc_decode_reply_batch(const void *p, size_t n, kvc_reply *const *rs, size_t nr)
{
	kv_resp d;
	size_t done = 0;
	int rv;

	for (size_t i = 0; i < nr; i++) {
		memset(rs[i], 0, sizeof(*rs[i]));
		rs[i]->op_status = KV_EPROTO;
	}
	if ((rv = kv_data_resp_decode(p, n, &d)) != KV_OK)
		return rv;
	if (d.status == KV_OK && d.nresults != nr) {
		rv = KV_EPROTO;
		goto err;
	}
	for (; done < nr; done++) {
		kvc_reply *r = rs[done];
		if ((rv = reply_envelope(&d, r)) != KV_OK ||
		    (d.status == KV_OK && (rv = reply_result(&d.results[done], r)) != KV_OK)) {
			done++;
			goto err;
		}
	}
	kv_data_resp_fini(&d);
	return KV_OK;
err:
	kv_data_resp_fini(&d);
	for (size_t i = 0; i < done; i++)
		kvc_reply_fini(rs[i]);
	return rv;
}

void
kvc_reply_fini(kvc_reply *r)
{
	if (r == NULL)
		return;
	free(r->error);
	kv_buf_fini(&r->hint.start);
	kv_buf_fini(&r->hint.end);
	free(r->hint.address);
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
	memset(r, 0, sizeof(*r));
}
