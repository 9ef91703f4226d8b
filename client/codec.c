/*
 * codec.c - the client's protobuf boundary: plain C requests (kvc_op,
 * kvc_admin_req) become packed Request/AdminRequest messages, and packed
 * Response/AdminResponse messages become plain C replies (kvc_reply,
 * kvc_admin_reply) that own copies of everything they hold.
 *
 * Requests are built on the stack from borrowed bytes, never with
 * free_unpacked; replies are unpacked, copied out and freed with
 * *__free_unpacked on every path. Decoding checks sizes against the hard
 * limits of SPEC §2 so that a hostile reply is KV_EPROTO, never a crash.
 * This is the only file of the client that includes the generated header.
 */
#include "client/client_int.h"
#include "common/err.h"
#include "proto/codec_int.h"
#include "proto/shardkv.pb-c.h"
#include "proto/wire.h"

#include <stdlib.h>
#include <string.h>

static ProtobufCBinaryData
pb_bytes(kv_bytes b)
{
	ProtobufCBinaryData d = {.len = b.len, .data = (uint8_t *)b.p};
	return d;
}

static int
copy_bytes(kv_buf *dst, ProtobufCBinaryData b, size_t max)
{
	memset(dst, 0, sizeof(*dst));
	if (b.len > max)
		return KV_EPROTO;
	/* Always allocate, so that a present empty value is distinguishable and
	 * callers can rely on data != NULL after a successful copy. */
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
copy_str(char **dst, const char *s)
{
	*dst = NULL;
	if (s == NULL || s[0] == 0)
		return KV_OK;
	if (strlen(s) > 64 * 1024)
		return KV_EPROTO;
	*dst = strdup(s);
	return *dst ? KV_OK : KV_ENOMEM;
}

/* Packs msg into a new nng message. */
static int
pack_msg(const ProtobufCMessage *m, nng_msg **out)
{
	size_t len = protobuf_c_message_get_packed_size(m);
	nng_msg *msg;

	if (nng_msg_alloc(&msg, len) != 0)
		return KV_ENOMEM;
	protobuf_c_message_pack(m, nng_msg_body(msg));
	*out = msg;
	return KV_OK;
}

int
kvc_encode_request(const kvc_envelope *env, const kvc_op *op, nng_msg **out)
{
	Shardkv__Request req = SHARDKV__REQUEST__INIT;
	Shardkv__Op pop = SHARDKV__OP__INIT, *pops[1] = {&pop};
	Shardkv__GetOp get = SHARDKV__GET_OP__INIT;
	Shardkv__PutOp put = SHARDKV__PUT_OP__INIT;
	Shardkv__DelOp del = SHARDKV__DEL_OP__INIT;
	Shardkv__AppendOp app = SHARDKV__APPEND_OP__INIT;
	Shardkv__MGetOp mget = SHARDKV__MGET_OP__INIT;
	Shardkv__MPutOp mput = SHARDKV__MPUT_OP__INIT;
	Shardkv__ScanOp scan = SHARDKV__SCAN_OP__INIT;
	ProtobufCBinaryData *keys = NULL, *vals = NULL;
	int rv;

	req.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	req.client_id = env->client_id;
	req.request_id = env->request_id;
	req.epoch = env->epoch;
	req.auth_token = pb_bytes(env->auth);
	req.timeout_ms = env->timeout_ms;
	req.n_ops = 1;
	req.ops = pops;
	pop.request_id = op->request_id;
	switch (op->kind) {
	case KVC_GET:
		get.key = pb_bytes(op->key);
		pop.op_case = SHARDKV__OP__OP_GET;
		pop.get = &get;
		break;
	case KVC_PUT:
		put.key = pb_bytes(op->key);
		put.value = pb_bytes(op->value);
		pop.op_case = SHARDKV__OP__OP_PUT;
		pop.put = &put;
		break;
	case KVC_DEL:
		del.key = pb_bytes(op->key);
		pop.op_case = SHARDKV__OP__OP_DEL;
		pop.del = &del;
		break;
	case KVC_APPEND:
		app.key = pb_bytes(op->key);
		app.value = pb_bytes(op->value);
		pop.op_case = SHARDKV__OP__OP_APPEND;
		pop.append = &app;
		break;
	case KVC_MGET:
	case KVC_MPUT:
		if (op->n == 0 || (keys = calloc(op->n, sizeof(*keys))) == NULL)
			return op->n == 0 ? KV_EINVAL : KV_ENOMEM;
		for (size_t i = 0; i < op->n; i++)
			keys[i] = pb_bytes(op->keys[i]);
		if (op->kind == KVC_MGET) {
			mget.n_keys = op->n;
			mget.keys = keys;
			pop.op_case = SHARDKV__OP__OP_MGET;
			pop.mget = &mget;
			break;
		}
		if ((vals = calloc(op->n, sizeof(*vals))) == NULL) {
			free(keys);
			return KV_ENOMEM;
		}
		for (size_t i = 0; i < op->n; i++)
			vals[i] = pb_bytes(op->values[i]);
		mput.n_keys = mput.n_values = op->n;
		mput.keys = keys;
		mput.values = vals;
		pop.op_case = SHARDKV__OP__OP_MPUT;
		pop.mput = &mput;
		break;
	case KVC_SCAN:
		scan.start = pb_bytes(op->start);
		scan.end = pb_bytes(op->end);
		scan.prefix = pb_bytes(op->prefix);
		scan.cursor = pb_bytes(op->cursor);
		scan.limit = op->limit;
		scan.keys_only = op->keys_only;
		pop.op_case = SHARDKV__OP__OP_SCAN;
		pop.scan = &scan;
		break;
	default:
		return KV_EINVAL;
	}
	rv = pack_msg(&req.base, out);
	free(keys);
	free(vals);
	return rv;
}

/* The sub-messages of one single-key op in a batch. */
typedef struct {
	Shardkv__Op op;
	union {
		Shardkv__GetOp get;
		Shardkv__PutOp put;
		Shardkv__DelOp del;
		Shardkv__AppendOp app;
	} u;
} batch_op;

int
kvc_encode_request_batch(const kvc_envelope *env, const kvc_op *const *ops, size_t n, nng_msg **out)
{
	Shardkv__Request req = SHARDKV__REQUEST__INIT;
	batch_op *b = calloc(n ? n : 1, sizeof(*b));
	Shardkv__Op **pops = calloc(n ? n : 1, sizeof(*pops));
	int rv = KV_OK;

	if (b == NULL || pops == NULL) {
		rv = KV_ENOMEM;
		goto out;
	}
	req.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	req.client_id = env->client_id;
	req.request_id = env->request_id;
	req.epoch = env->epoch;
	req.auth_token = pb_bytes(env->auth);
	req.timeout_ms = env->timeout_ms;
	req.n_ops = n;
	req.ops = pops;
	for (size_t i = 0; i < n && rv == KV_OK; i++) {
		const kvc_op *op = ops[i];
		Shardkv__Op *pop = &b[i].op;
		shardkv__op__init(pop);
		pops[i] = pop;
		pop->request_id = op->request_id;
		switch (op->kind) {
		case KVC_GET:
			shardkv__get_op__init(&b[i].u.get);
			b[i].u.get.key = pb_bytes(op->key);
			pop->op_case = SHARDKV__OP__OP_GET;
			pop->get = &b[i].u.get;
			break;
		case KVC_PUT:
			shardkv__put_op__init(&b[i].u.put);
			b[i].u.put.key = pb_bytes(op->key);
			b[i].u.put.value = pb_bytes(op->value);
			pop->op_case = SHARDKV__OP__OP_PUT;
			pop->put = &b[i].u.put;
			break;
		case KVC_DEL:
			shardkv__del_op__init(&b[i].u.del);
			b[i].u.del.key = pb_bytes(op->key);
			pop->op_case = SHARDKV__OP__OP_DEL;
			pop->del = &b[i].u.del;
			break;
		case KVC_APPEND:
			shardkv__append_op__init(&b[i].u.app);
			b[i].u.app.key = pb_bytes(op->key);
			b[i].u.app.value = pb_bytes(op->value);
			pop->op_case = SHARDKV__OP__OP_APPEND;
			pop->append = &b[i].u.app;
			break;
		default:
			rv = KV_EINVAL; /* only single-key ops are coalesced */
		}
	}
	if (rv == KV_OK)
		rv = pack_msg(&req.base, out);
out:
	free(b);
	free(pops);
	return rv;
}

static int
hint_from_pb(const Shardkv__OwnerHint *h, kvc_hint *out)
{
	int rv;

	if (h == NULL)
		return KV_OK;
	out->set = true;
	out->epoch = h->epoch;
	out->node = h->node_id;
	if ((rv = copy_bytes(&out->start, h->start, KV_HARD_MAX_KEY)) != KV_OK ||
	    (rv = copy_bytes(&out->end, h->end, KV_HARD_MAX_KEY)) != KV_OK ||
	    (rv = copy_str(&out->address, h->address)) != KV_OK)
		return rv;
	return KV_OK;
}

static int
result_from_pb(const Shardkv__OpResult *res, kvc_reply *r)
{
	int rv;

	r->op_status = kv_err_from_wire((int)res->status);
	if (res->error && res->error[0] && r->error == NULL &&
	    (rv = copy_str(&r->error, res->error)) != KV_OK)
		return rv;
	if ((rv = hint_from_pb(res->owner, &r->hint)) != KV_OK)
		return rv;
	if (res->value.len && (rv = copy_bytes(&r->value, res->value, KV_HARD_MAX_VALUE)) != KV_OK)
		return rv;
	r->value_len = res->value_len;
	if (res->n_values) {
		if ((r->values = calloc(res->n_values, sizeof(kv_buf))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < res->n_values; i++, r->nvalues++)
			if ((rv = copy_bytes(&r->values[i], res->values[i], KV_HARD_MAX_VALUE)) !=
			    KV_OK)
				return rv;
	}
	if (res->n_missing) {
		if ((r->missing = calloc(res->n_missing, sizeof(uint32_t))) == NULL)
			return KV_ENOMEM;
		memcpy(r->missing, res->missing, res->n_missing * sizeof(uint32_t));
		r->nmissing = res->n_missing;
	}
	if (res->n_entries) {
		if ((r->entries = calloc(res->n_entries, sizeof(kvc_entry))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < res->n_entries; i++, r->nentries++) {
			const Shardkv__KeyValue *kv = res->entries[i];
			if (kv->value_total != 0)
				return KV_EPROTO; /* scans never split values */
			if ((rv = copy_bytes(&r->entries[i].key, kv->key, KV_HARD_MAX_KEY)) !=
			        KV_OK ||
			    (rv = copy_bytes(&r->entries[i].value, kv->value, KV_HARD_MAX_VALUE)) !=
			        KV_OK)
				return rv;
		}
	}
	r->more = res->more;
	if (res->next_cursor.len &&
	    (rv = copy_bytes(&r->next_cursor, res->next_cursor, KV_HARD_MAX_KEY)) != KV_OK)
		return rv;
	return KV_OK;
}

int
kvc_decode_reply(const void *p, size_t n, kvc_reply *r)
{
	Shardkv__Response *resp;
	int rv;

	memset(r, 0, sizeof(*r));
	r->op_status = KV_EPROTO;
	resp = shardkv__response__unpack(NULL, n, p);
	if (resp == NULL)
		return KV_EPROTO;
	r->status = kv_err_from_wire((int)resp->status);
	r->epoch = resp->epoch;
	r->node_id = resp->node_id;
	if ((rv = copy_str(&r->error, resp->error)) != KV_OK)
		goto err;
	if (r->status == KV_OK) {
		if (resp->n_results != 1) {
			rv = KV_EPROTO;
			goto err;
		}
		if ((rv = result_from_pb(resp->results[0], r)) != KV_OK)
			goto err;
	}
	shardkv__response__free_unpacked(resp, NULL);
	return KV_OK;
err:
	shardkv__response__free_unpacked(resp, NULL);
	kvc_reply_fini(r);
	return rv;
}

int
kvc_decode_reply_batch(const void *p, size_t n, kvc_reply *const *rs, size_t nr)
{
	Shardkv__Response *resp;
	int rv = KV_OK;
	size_t done = 0;

	for (size_t i = 0; i < nr; i++) {
		memset(rs[i], 0, sizeof(*rs[i]));
		rs[i]->op_status = KV_EPROTO;
	}
	resp = shardkv__response__unpack(NULL, n, p);
	if (resp == NULL)
		return KV_EPROTO;
	if (resp->status == SHARDKV__STATUS__STATUS_OK && resp->n_results != nr) {
		rv = KV_EPROTO;
		goto err;
	}
	for (; done < nr; done++) {
		kvc_reply *r = rs[done];
		r->status = kv_err_from_wire((int)resp->status);
		r->epoch = resp->epoch;
		r->node_id = resp->node_id;
		if ((rv = copy_str(&r->error, resp->error)) != KV_OK)
			goto err;
		if (r->status == KV_OK && (rv = result_from_pb(resp->results[done], r)) != KV_OK) {
			done++;
			goto err;
		}
	}
	shardkv__response__free_unpacked(resp, NULL);
	return KV_OK;
err:
	shardkv__response__free_unpacked(resp, NULL);
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

static void
noderef_fill(const kvc_admin_req *q, Shardkv__NodeRef *ref)
{
	if (q->node_id) {
		ref->ref_case = SHARDKV__NODE_REF__REF_ID;
		ref->id = q->node_id;
	} else {
		ref->ref_case = SHARDKV__NODE_REF__REF_ADDRESS;
		ref->address = (char *)(q->node_addr ? q->node_addr : "");
	}
}

int
kvc_encode_admin(const kvc_admin_req *q, nng_msg **out)
{
	Shardkv__AdminRequest req = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminJoin join = SHARDKV__ADMIN_JOIN__INIT;
	Shardkv__AdminLeave leave = SHARDKV__ADMIN_LEAVE__INIT;
	Shardkv__AdminMove move = SHARDKV__ADMIN_MOVE__INIT;
	Shardkv__AdminRebalance reb = SHARDKV__ADMIN_REBALANCE__INIT;
	Shardkv__AdminGetConfig getc = SHARDKV__ADMIN_GET_CONFIG__INIT;
	Shardkv__AdminStatus st = SHARDKV__ADMIN_STATUS__INIT;
	Shardkv__Watch watch = SHARDKV__WATCH__INIT;
	Shardkv__AdminCancelMigration cancel = SHARDKV__ADMIN_CANCEL_MIGRATION__INIT;
	Shardkv__NodeRef ref = SHARDKV__NODE_REF__INIT;

	req.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	req.client_id = q->client_id;
	req.request_id = q->request_id;
	req.auth_token = pb_bytes(q->auth);
	req.wait = q->wait;
	req.timeout_ms = q->timeout_ms;
	switch (q->kind) {
	case KVC_ADMIN_JOIN:
		join.address = (char *)(q->address ? q->address : "");
		join.no_rebalance = q->no_rebalance;
		req.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_JOIN;
		req.join = &join;
		break;
	case KVC_ADMIN_LEAVE:
		noderef_fill(q, &ref);
		leave.node = &ref;
		req.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_LEAVE;
		req.leave = &leave;
		break;
	case KVC_ADMIN_MOVE:
		noderef_fill(q, &ref);
		move.start = pb_bytes(q->start);
		move.end = pb_bytes(q->end);
		move.node = &ref;
		move.rate_mb_s = q->rate_mb_s;
		req.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_MOVE;
		req.move = &move;
		break;
	case KVC_ADMIN_REBALANCE:
		reb.rate_mb_s = q->rate_mb_s;
		req.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_REBALANCE;
		req.rebalance = &reb;
		break;
	case KVC_ADMIN_GET_CONFIG:
		getc.epoch = q->epoch;
		req.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_GET_CONFIG;
		req.get_config = &getc;
		break;
	case KVC_ADMIN_STATUS:
		req.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_STATUS;
		req.status = &st;
		break;
	case KVC_ADMIN_WATCH:
		watch.known_epoch = q->epoch;
		req.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_WATCH;
		req.watch = &watch;
		break;
	case KVC_ADMIN_CANCEL:
		cancel.migration_id = q->mig_id;
		req.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_CANCEL_MIGRATION;
		req.cancel_migration = &cancel;
		break;
	default:
		return KV_EINVAL;
	}
	return pack_msg(&req.base, out);
}

static int
migration_from_pb(const Shardkv__Migration *m, kv_migration *x)
{
	int rv;

	memset(x, 0, sizeof(*x));
	x->id = m->id;
	x->epoch = m->epoch;
	x->from = m->from_node;
	x->to = m->to_node;
	x->phase = (kv_mig_phase)m->phase;
	x->keys_copied = m->keys_copied;
	x->bytes_copied = m->bytes_copied;
	x->keys_total = m->keys_total;
	x->bytes_total = m->bytes_total;
	x->rate_bytes_s = m->rate_bytes_s;
	x->eta_ms = m->eta_ms;
	x->rate_limit_mb_s = m->rate_limit_mb_s;
	if ((rv = copy_bytes(&x->start, m->start, KV_HARD_MAX_KEY)) != KV_OK ||
	    (rv = copy_bytes(&x->end, m->end, KV_HARD_MAX_KEY)) != KV_OK)
		return rv;
	return KV_OK;
}

static int
report_from_pb(const Shardkv__StatusReport *rep, kvc_admin_reply *r)
{
	int rv;

	r->has_report = true;
	if (rep->n_nodes) {
		if ((r->stats = calloc(rep->n_nodes, sizeof(*r->stats))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < rep->n_nodes; i++, r->nstats++) {
			const Shardkv__NodeStats *s = rep->nodes[i];
			r->stats[i].node_id = s->node_id;
			r->stats[i].keys = s->keys;
			r->stats[i].bytes = s->bytes;
			r->stats[i].ops_per_sec = s->ops_per_sec;
			r->stats[i].memory_bytes = s->memory_bytes;
			r->stats[i].last_seen_ms = s->last_seen_ms;
		}
	}
	if (rep->n_migrations) {
		if ((r->rmigs = calloc(rep->n_migrations, sizeof(*r->rmigs))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < rep->n_migrations; i++, r->nrmigs++)
			if ((rv = migration_from_pb(rep->migrations[i], &r->rmigs[i])) != KV_OK)
				return rv;
	}
	if (rep->n_controllers) {
		if ((r->replicas = calloc(rep->n_controllers, sizeof(*r->replicas))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < rep->n_controllers; i++, r->nreplicas++) {
			const Shardkv__ControllerReplica *c = rep->controllers[i];
			r->replicas[i].id = c->id;
			r->replicas[i].role = (int)c->role;
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
	Shardkv__AdminResponse *resp;
	const Shardkv__Config *cfg;
	int rv;

	memset(r, 0, sizeof(*r));
	resp = shardkv__admin_response__unpack(NULL, n, p);
	if (resp == NULL)
		return KV_EPROTO;
	r->not_leader = resp->status == SHARDKV__STATUS__STATUS_NOT_LEADER;
	r->status = kv_err_from_wire((int)resp->status);
	r->epoch = resp->epoch;
	r->wait_ms = resp->wait_ms;
	r->node_id = resp->node_id;
	if ((rv = copy_str(&r->error, resp->error)) != KV_OK)
		goto err;
	if (resp->leader && (rv = copy_str(&r->leader, resp->leader->address)) != KV_OK)
		goto err;
	if (resp->n_migration_ids) {
		if ((r->mig_ids = calloc(resp->n_migration_ids, sizeof(uint64_t))) == NULL) {
			rv = KV_ENOMEM;
			goto err;
		}
		memcpy(r->mig_ids, resp->migration_ids, resp->n_migration_ids * sizeof(uint64_t));
		r->nmig_ids = resp->n_migration_ids;
	}
	/* A watch with history answers in `configs`; the newest is the last. */
	cfg = resp->config;
	if (cfg == NULL && resp->n_configs)
		cfg = resp->configs[resp->n_configs - 1];
	if (cfg && (rv = kv_codec_config_from_pb(cfg, &r->config)) != KV_OK)
		goto err;
	if (resp->report && (rv = report_from_pb(resp->report, r)) != KV_OK)
		goto err;
	shardkv__admin_response__free_unpacked(resp, NULL);
	return KV_OK;
err:
	shardkv__admin_response__free_unpacked(resp, NULL);
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
	case SHARDKV__REPLICA_ROLE__REPLICA_ROLE_STANDALONE:
		return "standalone";
	case SHARDKV__REPLICA_ROLE__REPLICA_ROLE_LEADER:
		return "leader";
	case SHARDKV__REPLICA_ROLE__REPLICA_ROLE_FOLLOWER:
		return "follower";
	case SHARDKV__REPLICA_ROLE__REPLICA_ROLE_CANDIDATE:
		return "candidate";
	default:
		return "unknown";
	}
}
