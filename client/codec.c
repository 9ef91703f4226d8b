/*
 * codec.c - the client's side of the wire in the client's own terms: plain
 * C requests (kvc_op, kvc_admin_req) go out through the codecs of proto/
 * (data_codec.h, admin_codec.h), and their decoded replies become kvc_reply
 * and kvc_admin_reply, which own everything they hold (buffers are moved
 * out of the decoded message, never copied twice).
 *
 * No wire coding happens here: validation and the protobuf messages are
 * proto/'s. What is left is the mapping between the client's structs and
 * the shared ones, and the rules the client adds on top of a decoded reply
 * (a reply to n ops carries n results; the newest configuration of a watch
 * answer is the one installed).
 */
#include "client/client_int.h"
#include "common/err.h"
#include "proto/admin_codec.h"
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
	if (res->nentries) {
		if ((r->entries = calloc(res->nentries, sizeof(*r->entries))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < res->nentries; i++, r->nentries++) {
			buf_move(&r->entries[i].key, &res->entries[i].key);
			buf_move(&r->entries[i].value, &res->entries[i].value);
		}
	}
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

/* ---------------------------------------------------------------------------
 * Controller
 * ------------------------------------------------------------------------- */

int
kvc_encode_admin(const kvc_admin_req *q, nng_msg **out)
{
	kv_admin_req r = {.client_id = q->client_id,
	                  .request_id = q->request_id,
	                  .auth = q->auth,
	                  .wait = q->wait,
	                  .timeout_ms = q->timeout_ms};

	switch (q->kind) {
	case KVC_ADMIN_JOIN:
		r.op = KV_ADM_JOIN;
		r.address = q->address;
		r.no_rebalance = q->no_rebalance;
		break;
	case KVC_ADMIN_LEAVE:
		r.op = KV_ADM_LEAVE;
		r.node_id = q->node_id;
		r.address = q->node_addr;
		break;
	case KVC_ADMIN_MOVE:
		r.op = KV_ADM_MOVE;
		r.node_id = q->node_id;
		r.address = q->node_addr;
		r.start = q->start;
		r.end = q->end;
		r.rate_mb_s = q->rate_mb_s;
		break;
	case KVC_ADMIN_REBALANCE:
		r.op = KV_ADM_REBALANCE;
		r.rate_mb_s = q->rate_mb_s;
		break;
	case KVC_ADMIN_GET_CONFIG:
		r.op = KV_ADM_GET_CONFIG;
		r.epoch = q->epoch;
		break;
	case KVC_ADMIN_STATUS:
		r.op = KV_ADM_STATUS;
		break;
	case KVC_ADMIN_WATCH:
		r.op = KV_ADM_WATCH;
		r.epoch = q->epoch;
		break;
	case KVC_ADMIN_CANCEL:
		r.op = KV_ADM_CANCEL;
		r.mig_id = q->mig_id;
		break;
	default:
		return KV_EINVAL;
	}
	return kv_admin_req_encode(&r, out);
}

static int
migration_copy(kv_migration *dst, const kv_migration *src)
{
	*dst = *src;
	memset(&dst->start, 0, sizeof(dst->start));
	memset(&dst->end, 0, sizeof(dst->end));
	if (kv_buf_set(&dst->start, src->start.data, src->start.len) != KV_OK ||
	    kv_buf_set(&dst->end, src->end.data, src->end.len) != KV_OK)
		return KV_ENOMEM;
	return KV_OK;
}

static int
report_copy(const kv_admin_report *rep, kvc_admin_reply *r)
{
	int rv;

	r->has_report = true;
	if (rep->nnodes) {
		if ((r->stats = calloc(rep->nnodes, sizeof(*r->stats))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < rep->nnodes; i++, r->nstats++) {
			const kv_admin_node_stat *s = &rep->nodes[i];
			r->stats[i].node_id = s->node_id;
			r->stats[i].keys = s->keys;
			r->stats[i].bytes = s->bytes;
			r->stats[i].ops_per_sec = s->ops;
			r->stats[i].memory_bytes = s->memory;
			r->stats[i].last_seen_ms = s->last_seen_ms;
		}
	}
	if (rep->nmigs) {
		if ((r->rmigs = calloc(rep->nmigs, sizeof(*r->rmigs))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < rep->nmigs; i++) {
			r->nrmigs++;
			if ((rv = migration_copy(&r->rmigs[i], &rep->migs[i])) != KV_OK)
				return rv;
		}
	}
	if (rep->nreplicas) {
		if ((r->replicas = calloc(rep->nreplicas, sizeof(*r->replicas))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < rep->nreplicas; i++, r->nreplicas++) {
			const kv_admin_replica *c = &rep->replicas[i];
			r->replicas[i].id = c->id;
			r->replicas[i].role = c->role;
			r->replicas[i].term = c->term;
			r->replicas[i].index = c->index;
			if ((rv = copy_str(&r->replicas[i].address, c->address)) != KV_OK)
				return rv;
		}
	}
	return KV_OK;
}

int
kvc_decode_admin(const void *p, size_t n, kvc_admin_reply *r)
{
	kv_admin_resp d;
	const kv_config *cfg;
	int rv;

	memset(r, 0, sizeof(*r));
	if ((rv = kv_admin_resp_decode(p, n, &d)) != KV_OK)
		return rv;
	r->not_leader = d.not_leader;
	r->status = d.err;
	r->epoch = d.epoch;
	r->wait_ms = d.wait_ms;
	r->node_id = d.node_id;
	if ((rv = copy_str(&r->error, d.error)) != KV_OK ||
	    (rv = copy_str(&r->leader, d.leader_address)) != KV_OK)
		goto err;
	if (d.nmig_ids) {
		if ((r->mig_ids = calloc(d.nmig_ids, sizeof(uint64_t))) == NULL) {
			rv = KV_ENOMEM;
			goto err;
		}
		memcpy(r->mig_ids, d.mig_ids, d.nmig_ids * sizeof(uint64_t));
		r->nmig_ids = d.nmig_ids;
	}
	/* A watch with history answers in `configs`; the newest is the last. */
	cfg = d.config;
	if (cfg == NULL && d.nconfigs)
		cfg = d.configs[d.nconfigs - 1];
	if (cfg && (r->config = kv_config_clone(cfg)) == NULL) {
		rv = KV_ENOMEM;
		goto err;
	}
	if (d.report && (rv = report_copy(d.report, r)) != KV_OK)
		goto err;
	kv_admin_resp_fini(&d);
	return KV_OK;
err:
	kv_admin_resp_fini(&d);
	kvc_admin_reply_fini(r);
	return rv;
}

void
kvc_admin_reply_fini(kvc_admin_reply *r)
{
	if (r == NULL)
		return;
	free(r->error);
	kv_config_free(r->config);
	free(r->mig_ids);
	free(r->leader);
	free(r->stats);
	for (size_t i = 0; i < r->nrmigs; i++) {
		kv_buf_fini(&r->rmigs[i].start);
		kv_buf_fini(&r->rmigs[i].end);
	}
	free(r->rmigs);
	for (size_t i = 0; i < r->nreplicas; i++)
		free(r->replicas[i].address);
	free(r->replicas);
	memset(r, 0, sizeof(*r));
}

const char *
kvc_role_name(int role)
{
	switch (role) {
	case KV_ADMIN_ROLE_STANDALONE:
		return "standalone";
	case KV_ADMIN_ROLE_LEADER:
		return "leader";
	case KV_ADMIN_ROLE_FOLLOWER:
		return "follower";
	case KV_ADMIN_ROLE_CANDIDATE:
		return "candidate";
	default:
		return "unknown";
	}
}
