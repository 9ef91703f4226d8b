/*
 * admin_codec.c - AdminRequest/AdminResponse <-> plain C values
 * (admin_codec.h). The only controller file that includes the generated
 * header. Decoding checks the version and that a command is set; the
 * meaning of the fields is checked by the controller.
 */
#include "controller/admin_codec.h"
#include "common/err.h"
#include "proto/codec.h"
#include "proto/shardkv.pb-c.h"
#include "proto/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kv_bytes
from_pb(ProtobufCBinaryData d)
{
	kv_bytes b = {d.data, d.len};
	return b;
}

static ProtobufCBinaryData
to_pb(kv_bytes b)
{
	ProtobufCBinaryData d = {b.len, (uint8_t *)b.p};
	return d;
}

static void
node_ref(const Shardkv__NodeRef *r, kv_admin_req *out)
{
	if (r == NULL)
		return;
	if (r->ref_case == SHARDKV__NODE_REF__REF_ID)
		out->node_id = r->id;
	else if (r->ref_case == SHARDKV__NODE_REF__REF_ADDRESS)
		out->address = r->address;
}

static int
heartbeat(const Shardkv__Heartbeat *h, kv_admin_req *out)
{
	out->node_id = h->node_id;
	out->boot_id = h->boot_id;
	out->epoch = h->epoch_applied;
	out->keys = h->keys;
	out->bytes = h->bytes;
	out->ops = h->ops_per_sec;
	out->memory = h->memory_bytes;
	if (h->n_ranges == 0)
		return KV_OK;
	out->ranges = calloc(h->n_ranges, sizeof(kv_admin_range_stat));
	if (out->ranges == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < h->n_ranges; i++, out->nranges++) {
		const Shardkv__RangeStats *r = h->ranges[i];
		kv_admin_range_stat *s = &out->ranges[i];
		s->start = from_pb(r->start);
		s->end = from_pb(r->end);
		s->keys = r->keys;
		s->bytes = r->bytes;
		s->ops = r->ops_per_sec;
		if (r->n_split_keys == 0)
			continue;
		s->split = calloc(r->n_split_keys, sizeof(kv_bytes));
		if (s->split == NULL)
			return KV_ENOMEM;
		for (size_t j = 0; j < r->n_split_keys; j++)
			s->split[j] = from_pb(r->split_keys[j]);
		s->nsplit = r->n_split_keys;
	}
	return KV_OK;
}

int
kv_admin_decode(const void *p, size_t n, kv_admin_req *out, char *msg, size_t msglen)
{
	Shardkv__AdminRequest *rq = shardkv__admin_request__unpack(NULL, n, p);
	int rv = KV_OK;

	memset(out, 0, sizeof(*out));
	if (rq == NULL) {
		snprintf(msg, msglen, "undecodable AdminRequest (%zu bytes)", n);
		return KV_EPROTO;
	}
	out->priv = rq;
	out->request_id = rq->request_id;
	out->client_id = rq->client_id;
	out->wait = rq->wait;
	out->timeout_ms = rq->timeout_ms;
	out->auth = from_pb(rq->auth_token);
	if (rq->version != SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1) {
		snprintf(msg, msglen, "unsupported protocol version %d; this controller speaks 1",
		         (int)rq->version);
		rv = KV_EINVAL;
		goto err;
	}
	out->op = (kv_admin_op)rq->cmd_case;
	switch (rq->cmd_case) {
	case SHARDKV__ADMIN_REQUEST__CMD_JOIN:
		out->address = rq->join->address;
		out->no_rebalance = rq->join->no_rebalance;
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_LEAVE:
		node_ref(rq->leave->node, out);
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_MOVE:
		out->start = from_pb(rq->move->start);
		out->end = from_pb(rq->move->end);
		node_ref(rq->move->node, out);
		out->rate_mb_s = rq->move->rate_mb_s;
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_REBALANCE:
		out->rate_mb_s = rq->rebalance->rate_mb_s;
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_GET_CONFIG:
		out->epoch = rq->get_config->epoch;
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_STATUS:
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_CANCEL_MIGRATION:
		out->mig_id = rq->cancel_migration->migration_id;
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_REGISTER_NODE:
		out->address = rq->register_node->address;
		out->node_id = rq->register_node->resume_node_id;
		out->join = rq->register_node->join;
		out->no_rebalance = rq->register_node->no_rebalance;
		out->boot_id = rq->register_node->boot_id;
		out->cluster_id = rq->register_node->cluster_id;
		out->epoch = rq->register_node->epoch_applied;
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_HEARTBEAT:
		if ((rv = heartbeat(rq->heartbeat, out)) != KV_OK) {
			snprintf(msg, msglen, "%s", kv_strerror(rv));
			goto err;
		}
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_MIGRATION_PROGRESS: {
		const Shardkv__MigrationProgress *m = rq->migration_progress;
		out->mig_id = m->migration_id;
		out->node_id = m->node_id;
		out->phase = (kv_mig_phase)m->phase;
		out->keys_copied = m->keys_copied;
		out->bytes_copied = m->bytes_copied;
		out->keys_total = m->keys_total;
		out->bytes_total = m->bytes_total;
		out->rate_bytes_s = m->rate_bytes_s;
		break;
	}
	case SHARDKV__ADMIN_REQUEST__CMD_MIGRATION_DONE: {
		const Shardkv__MigrationDone *m = rq->migration_done;
		out->mig_id = m->migration_id;
		out->node_id = m->node_id;
		out->result = kv_err_from_wire(m->status);
		out->error = m->error;
		out->keys = m->keys;
		out->bytes = m->bytes;
		break;
	}
	case SHARDKV__ADMIN_REQUEST__CMD_WATCH:
		out->epoch = rq->watch->known_epoch;
		out->history = rq->watch->history;
		out->max_configs = rq->watch->max_configs;
		out->node_id = rq->watch->node_id;
		break;
	default:
		snprintf(msg, msglen, "AdminRequest without a command");
		rv = KV_EINVAL;
		goto err;
	}
	return KV_OK;
err:
	kv_admin_req_fini(out);
	out->request_id = rq == NULL ? 0 : out->request_id;
	return rv;
}

void
kv_admin_req_fini(kv_admin_req *r)
{
	uint64_t id = r->request_id;

	for (size_t i = 0; i < r->nranges; i++)
		free(r->ranges[i].split);
	free(r->ranges);
	if (r->priv)
		shardkv__admin_request__free_unpacked(r->priv, NULL);
	memset(r, 0, sizeof(*r));
	r->request_id = id;
}

/* Frees what report_to_pb allocated (the borrowed bytes stay). */
static void
report_pb_free(Shardkv__StatusReport *pb)
{
	for (size_t i = 0; i < pb->n_nodes; i++) {
		Shardkv__NodeStats *n = pb->nodes[i];
		for (size_t j = 0; n && j < n->n_ranges; j++) {
			free(n->ranges[j]->split_keys);
			free(n->ranges[j]);
		}
		if (n)
			free(n->ranges);
		free(n);
	}
	for (size_t i = 0; i < pb->n_migrations; i++)
		free(pb->migrations[i]);
	for (size_t i = 0; i < pb->n_controllers; i++)
		free(pb->controllers[i]);
	free(pb->nodes);
	free(pb->migrations);
	free(pb->controllers);
}

static int
report_to_pb(const kv_admin_report *r, Shardkv__StatusReport *pb)
{
	shardkv__status_report__init(pb);
	pb->nodes = calloc(r->nnodes ? r->nnodes : 1, sizeof(*pb->nodes));
	pb->migrations = calloc(r->nmigs ? r->nmigs : 1, sizeof(*pb->migrations));
	pb->controllers = calloc(r->nreplicas ? r->nreplicas : 1, sizeof(*pb->controllers));
	if (pb->nodes == NULL || pb->migrations == NULL || pb->controllers == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < r->nnodes; i++) {
		const kv_admin_node_stat *s = &r->nodes[i];
		Shardkv__NodeStats *n = calloc(1, sizeof(*n));
		if (n == NULL)
			return KV_ENOMEM;
		shardkv__node_stats__init(n);
		pb->nodes[pb->n_nodes++] = n;
		n->node_id = s->node_id;
		n->keys = s->keys;
		n->bytes = s->bytes;
		n->ops_per_sec = s->ops;
		n->memory_bytes = s->memory;
		n->epoch_applied = s->epoch_applied;
		n->last_seen_ms = s->last_seen_ms;
		if (s->nranges == 0)
			continue;
		if ((n->ranges = calloc(s->nranges, sizeof(*n->ranges))) == NULL)
			return KV_ENOMEM;
		for (size_t j = 0; j < s->nranges; j++) {
			const kv_admin_range_stat *rs = &s->ranges[j];
			Shardkv__RangeStats *x = calloc(1, sizeof(*x));
			if (x == NULL)
				return KV_ENOMEM;
			shardkv__range_stats__init(x);
			n->ranges[n->n_ranges++] = x;
			x->start = to_pb(rs->start);
			x->end = to_pb(rs->end);
			x->keys = rs->keys;
			x->bytes = rs->bytes;
			x->ops_per_sec = rs->ops;
			if (rs->nsplit == 0)
				continue;
			if ((x->split_keys = calloc(rs->nsplit, sizeof(*x->split_keys))) == NULL)
				return KV_ENOMEM;
			for (size_t k = 0; k < rs->nsplit; k++)
				x->split_keys[k] = to_pb(rs->split[k]);
			x->n_split_keys = rs->nsplit;
		}
	}
	for (size_t i = 0; i < r->nmigs; i++) {
		Shardkv__Migration *m = malloc(sizeof(*m));
		if (m == NULL)
			return KV_ENOMEM;
		kv_codec_migration_to_pb(&r->migs[i], m);
		pb->migrations[pb->n_migrations++] = m;
	}
	for (size_t i = 0; i < (r->nreplicas ? r->nreplicas : 1); i++) {
		Shardkv__ControllerReplica *c = malloc(sizeof(*c));
		if (c == NULL)
			return KV_ENOMEM;
		shardkv__controller_replica__init(c);
		pb->controllers[pb->n_controllers++] = c;
		if (r->nreplicas == 0) {
			c->id = 1;
			c->address = (char *)(r->address ? r->address : "");
			c->role = SHARDKV__REPLICA_ROLE__REPLICA_ROLE_STANDALONE;
			continue;
		}
		c->id = r->replicas[i].id;
		c->address = (char *)(r->replicas[i].address ? r->replicas[i].address : "");
		c->role = (Shardkv__ReplicaRole)r->replicas[i].role;
		c->term = r->replicas[i].term;
		c->index = r->replicas[i].index;
	}
	return KV_OK;
}

int
kv_admin_encode(const kv_admin_resp *r, nng_msg **out)
{
	Shardkv__AdminResponse pb = SHARDKV__ADMIN_RESPONSE__INIT;
	Shardkv__StatusReport rep;
	Shardkv__LeaderHint hint;
	Shardkv__Config **cfgs = NULL;
	nng_msg *m = NULL;
	size_t n;
	int rv = KV_ENOMEM;
	bool have_rep = false;

	pb.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	pb.request_id = r->request_id;
	pb.status = (Shardkv__Status)kv_wire_from_err(r->err);
	if (r->err != KV_OK)
		pb.error = (char *)(r->error && r->error[0] ? r->error : kv_strerror(r->err));
	pb.epoch = r->epoch;
	pb.term = r->term;
	pb.commit_index = r->commit_index;
	if (r->not_leader) {
		pb.status = SHARDKV__STATUS__STATUS_NOT_LEADER;
		shardkv__leader_hint__init(&hint);
		hint.id = r->leader_id;
		hint.address = (char *)(r->leader_address ? r->leader_address : "");
		hint.term = r->term;
		pb.leader = &hint;
	}
	pb.wait_ms = r->wait_ms;
	pb.node_id = r->node_id;
	pb.migration_ids = (uint64_t *)r->mig_ids;
	pb.n_migration_ids = r->nmig_ids;
	if (r->config && (pb.config = kv_codec_config_to_pb(r->config)) == NULL)
		goto out;
	if (r->nconfigs) {
		if ((cfgs = calloc(r->nconfigs, sizeof(*cfgs))) == NULL)
			goto out;
		for (size_t i = 0; i < r->nconfigs; i++, pb.n_configs++)
			if ((cfgs[i] = kv_codec_config_to_pb(r->configs[i])) == NULL)
				goto out;
		pb.configs = cfgs;
	}
	if (r->report) {
		have_rep = true;
		if (report_to_pb(r->report, &rep) != KV_OK)
			goto out;
		pb.report = &rep;
	}
	n = shardkv__admin_response__get_packed_size(&pb);
	if (nng_msg_alloc(&m, n) != 0)
		goto out;
	shardkv__admin_response__pack(&pb, nng_msg_body(m));
	*out = m;
	rv = KV_OK;
out:
	if (have_rep)
		report_pb_free(&rep);
	for (size_t i = 0; i < pb.n_configs; i++)
		kv_codec_config_pb_free(cfgs[i]);
	free(cfgs);
	kv_codec_config_pb_free(pb.config);
	return rv;
}

int
kv_admin_config_pack(const kv_config *c, kv_buf *out)
{
	return kv_codec_config_pack(c, out);
}

int
kv_admin_config_unpack(const uint8_t *p, size_t n, kv_config **out)
{
	return kv_codec_config_unpack(p, n, out);
}
