/*
 * admin_codec.c - the admin family: AdminRequest/AdminResponse <-> plain C
 * values (admin_codec.h), for both ends of the controller's socket.
 *
 * Request decoding checks the version and that a command is set; the
 * meaning of the fields is checked by the controller. Response decoding
 * validates every configuration and bounds every count and string, since a
 * server or client must survive a hostile controller. Encoders build a
 * temporary tree that borrows the caller's values and free only the tree's
 * own nodes; decoders keep the unpacked message and free it in *_fini, or
 * before returning on error.
 */
#include "proto/admin_codec.h"
#include "common/err.h"
#include "proto/codec_int.h"
#include "proto/wire.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A rate from the network: finite and not negative, else 0. */
static double
rate_ok(double v)
{
	return isfinite(v) && v >= 0 ? v : 0;
}

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
	out->restarted = h->restarted;
	out->epoch = h->epoch_applied;
	out->keys = h->keys;
	out->bytes = h->bytes;
	out->ops = h->ops_per_sec;
	out->memory = h->memory_bytes;
	out->lease_only = h->lease_only;
	out->uptime_ms = h->uptime_ms;
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
		s->reads = rate_ok(r->reads_per_sec);
		s->writes = rate_ok(r->writes_per_sec);
		if (r->load_split_key.len > KV_HARD_MAX_KEY || r->hot_key.len > KV_HARD_MAX_KEY)
			return KV_EPROTO;
		s->load_split = from_pb(r->load_split_key);
		s->hot_key = from_pb(r->hot_key);
		s->hot_share =
		    r->hot_key_share >= 0 && r->hot_key_share <= 1 ? r->hot_key_share : 0;
		for (size_t j = 0; j < r->n_load_split_keys; j++)
			if (r->load_split_keys[j].len > KV_HARD_MAX_KEY)
				return KV_EPROTO;
		if (r->n_load_split_keys != 0) {
			s->lsplit = calloc(r->n_load_split_keys, sizeof(kv_bytes));
			if (s->lsplit == NULL)
				return KV_ENOMEM;
			s->nlsplit = r->n_load_split_keys;
			for (size_t j = 0; j < r->n_load_split_keys; j++)
				s->lsplit[j] = from_pb(r->load_split_keys[j]);
		}
		if (r->n_split_keys == 0)
			continue;
		s->split = calloc(r->n_split_keys, sizeof(kv_bytes));
		if (s->split == NULL) { /* range i is not counted yet: free its own */
			free(s->lsplit);
			s->lsplit = NULL;
			return KV_ENOMEM;
		}
		for (size_t j = 0; j < r->n_split_keys; j++)
			s->split[j] = from_pb(r->split_keys[j]);
		s->nsplit = r->n_split_keys;
	}
	return KV_OK;
}

int
kv_admin_req_decode(const void *p, size_t n, kv_admin_req *out, char *msg, size_t msglen)
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
	case SHARDKV__ADMIN_REQUEST__CMD_DRY_RUN:
		/* The command it plans, with dry_run set. */
		out->dry_run = true;
		if (rq->dry_run->cmd_case == SHARDKV__ADMIN_DRY_RUN__CMD_MOVE) {
			out->op = KV_ADM_MOVE;
			out->start = from_pb(rq->dry_run->move->start);
			out->end = from_pb(rq->dry_run->move->end);
			node_ref(rq->dry_run->move->node, out);
			out->rate_mb_s = rq->dry_run->move->rate_mb_s;
		} else if (rq->dry_run->cmd_case == SHARDKV__ADMIN_DRY_RUN__CMD_REBALANCE) {
			out->op = KV_ADM_REBALANCE;
			out->rate_mb_s = rq->dry_run->rebalance->rate_mb_s;
		} else {
			snprintf(msg, msglen, "dry run without a command (move or rebalance)");
			rv = KV_EINVAL;
			goto err;
		}
		break;
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
		out->restarted = rq->register_node->restarted;
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
		out->last_seq = m->last_seq;
		break;
	}
	case SHARDKV__ADMIN_REQUEST__CMD_REMOVE:
		node_ref(rq->remove->node, out);
		out->accept_data_loss = rq->remove->accept_data_loss;
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_ISR_CHANGE:
		out->node_id = rq->isr_change->node_id;
		out->start = from_pb(rq->isr_change->start);
		out->end = from_pb(rq->isr_change->end);
		out->leader_epoch = rq->isr_change->leader_epoch;
		out->add_node = rq->isr_change->add_node;
		out->remove_node = rq->isr_change->remove_node;
		out->unfence_node = rq->isr_change->unfence_node;
		break;
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

	for (size_t i = 0; i < r->nranges; i++) {
		free(r->ranges[i].split);
		free(r->ranges[i].lsplit);
	}
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
	if (pb->n_balancer)
		free(pb->balancer[0]); /* one array */
	free(pb->balancer);
}

/* Fills n BalancerDecision messages (out) and their pointers (outp). */
static void
balance_to_pb(const kv_admin_balance *b, size_t n, Shardkv__BalancerDecision *out,
              Shardkv__BalancerDecision **outp)
{
	for (size_t i = 0; i < n; i++) {
		shardkv__balancer_decision__init(&out[i]);
		out[i].time_ms = b[i].time_ms;
		out[i].kind = (char *)(b[i].kind ? b[i].kind : "");
		out[i].reason = (char *)(b[i].reason ? b[i].reason : "");
		out[i].what = (char *)(b[i].what ? b[i].what : "");
		outp[i] = &out[i];
	}
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
		n->uptime_ms = s->uptime_ms;
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
			x->reads_per_sec = rs->reads;
			x->writes_per_sec = rs->writes;
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
	if (r->nbalance) {
		Shardkv__BalancerDecision *b = calloc(r->nbalance, sizeof(*b));
		if (b == NULL ||
		    (pb->balancer = calloc(r->nbalance, sizeof(*pb->balancer))) == NULL) {
			free(b);
			return KV_ENOMEM;
		}
		balance_to_pb(r->balance, r->nbalance, b, pb->balancer);
		pb->n_balancer = r->nbalance;
	}
	return KV_OK;
}

int
kv_admin_resp_encode(const kv_admin_resp *r, nng_msg **out)
{
	Shardkv__AdminResponse pb = SHARDKV__ADMIN_RESPONSE__INIT;
	Shardkv__StatusReport rep;
	Shardkv__LeaderHint hint;
	Shardkv__Config **cfgs = NULL;
	Shardkv__Migration *plan = NULL, **planp = NULL;
	Shardkv__BalancerDecision *bplan = NULL, **bplanp = NULL;
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
	pb.ranges_lost = r->ranges_lost;
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
	if (r->nplan) {
		plan = calloc(r->nplan, sizeof(*plan));
		planp = calloc(r->nplan, sizeof(*planp));
		if (plan == NULL || planp == NULL)
			goto out;
		for (size_t i = 0; i < r->nplan; i++) {
			kv_codec_migration_to_pb(&r->plan[i], &plan[i]);
			planp[i] = &plan[i];
		}
		pb.plan = planp;
		pb.n_plan = r->nplan;
	}
	if (r->nbalance_plan) {
		bplan = calloc(r->nbalance_plan, sizeof(*bplan));
		bplanp = calloc(r->nbalance_plan, sizeof(*bplanp));
		if (bplan == NULL || bplanp == NULL)
			goto out;
		balance_to_pb(r->balance_plan, r->nbalance_plan, bplan, bplanp);
		pb.balancer_plan = bplanp;
		pb.n_balancer_plan = r->nbalance_plan;
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
	free(plan);
	free(planp);
	free(bplan);
	free(bplanp);
	return rv;
}

/* Fills a NodeRef: by id when node_id is set, else by address. */
static void
node_ref_fill(const kv_admin_req *r, Shardkv__NodeRef *ref)
{
	if (r->node_id) {
		ref->ref_case = SHARDKV__NODE_REF__REF_ID;
		ref->id = r->node_id;
	} else {
		ref->ref_case = SHARDKV__NODE_REF__REF_ADDRESS;
		ref->address = (char *)(r->address ? r->address : "");
	}
}

int
kv_admin_req_encode(const kv_admin_req *r, nng_msg **out)
{
	Shardkv__AdminRequest m = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminJoin join = SHARDKV__ADMIN_JOIN__INIT;
	Shardkv__AdminLeave lv = SHARDKV__ADMIN_LEAVE__INIT;
	Shardkv__AdminRemove rm = SHARDKV__ADMIN_REMOVE__INIT;
	Shardkv__IsrChange isr = SHARDKV__ISR_CHANGE__INIT;
	Shardkv__AdminMove move = SHARDKV__ADMIN_MOVE__INIT;
	Shardkv__AdminRebalance reb = SHARDKV__ADMIN_REBALANCE__INIT;
	Shardkv__AdminDryRun dry = SHARDKV__ADMIN_DRY_RUN__INIT;
	Shardkv__AdminGetConfig getc = SHARDKV__ADMIN_GET_CONFIG__INIT;
	Shardkv__AdminStatus st = SHARDKV__ADMIN_STATUS__INIT;
	Shardkv__AdminCancelMigration cancel = SHARDKV__ADMIN_CANCEL_MIGRATION__INIT;
	Shardkv__Register reg = SHARDKV__REGISTER__INIT;
	Shardkv__Watch w = SHARDKV__WATCH__INIT;
	Shardkv__Heartbeat hb = SHARDKV__HEARTBEAT__INIT;
	Shardkv__MigrationProgress pr = SHARDKV__MIGRATION_PROGRESS__INIT;
	Shardkv__MigrationDone dn = SHARDKV__MIGRATION_DONE__INIT;
	Shardkv__NodeRef ref = SHARDKV__NODE_REF__INIT;
	Shardkv__RangeStats *rs = NULL, **rsp = NULL;
	ProtobufCBinaryData *sk = NULL;
	size_t nsk = 0;
	int rv = KV_ENOMEM;

	m.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	m.client_id = r->client_id;
	m.request_id = r->request_id;
	m.auth_token = to_pb(r->auth);
	m.wait = r->wait;
	m.timeout_ms = r->timeout_ms;
	if (r->dry_run && r->op != KV_ADM_MOVE && r->op != KV_ADM_REBALANCE)
		return KV_EINVAL; /* only move and rebalance have a dry run */
	switch (r->op) {
	case KV_ADM_JOIN:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_JOIN;
		m.join = &join;
		join.address = (char *)(r->address ? r->address : "");
		join.no_rebalance = r->no_rebalance;
		break;
	case KV_ADM_LEAVE:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_LEAVE;
		m.leave = &lv;
		node_ref_fill(r, &ref);
		lv.node = &ref;
		break;
	case KV_ADM_REMOVE:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_REMOVE;
		m.remove = &rm;
		node_ref_fill(r, &ref);
		rm.node = &ref;
		rm.accept_data_loss = r->accept_data_loss;
		break;
	case KV_ADM_ISR_CHANGE:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_ISR_CHANGE;
		m.isr_change = &isr;
		isr.node_id = r->node_id;
		isr.start = to_pb(r->start);
		isr.end = to_pb(r->end);
		isr.leader_epoch = r->leader_epoch;
		isr.add_node = r->add_node;
		isr.remove_node = r->remove_node;
		isr.unfence_node = r->unfence_node;
		break;
	case KV_ADM_MOVE:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_MOVE;
		m.move = &move;
		node_ref_fill(r, &ref);
		move.start = to_pb(r->start);
		move.end = to_pb(r->end);
		move.node = &ref;
		move.rate_mb_s = r->rate_mb_s;
		if (r->dry_run) { /* the same message, inside AdminDryRun */
			m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_DRY_RUN;
			m.dry_run = &dry;
			dry.cmd_case = SHARDKV__ADMIN_DRY_RUN__CMD_MOVE;
			dry.move = &move;
		}
		break;
	case KV_ADM_REBALANCE:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_REBALANCE;
		m.rebalance = &reb;
		reb.rate_mb_s = r->rate_mb_s;
		if (r->dry_run) {
			m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_DRY_RUN;
			m.dry_run = &dry;
			dry.cmd_case = SHARDKV__ADMIN_DRY_RUN__CMD_REBALANCE;
			dry.rebalance = &reb;
		}
		break;
	case KV_ADM_GET_CONFIG:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_GET_CONFIG;
		m.get_config = &getc;
		getc.epoch = r->epoch;
		break;
	case KV_ADM_STATUS:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_STATUS;
		m.status = &st;
		break;
	case KV_ADM_CANCEL:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_CANCEL_MIGRATION;
		m.cancel_migration = &cancel;
		cancel.migration_id = r->mig_id;
		break;
	case KV_ADM_REGISTER:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_REGISTER_NODE;
		m.register_node = &reg;
		reg.address = (char *)r->address;
		reg.resume_node_id = r->node_id;
		reg.join = r->join;
		reg.no_rebalance = r->no_rebalance;
		reg.boot_id = r->boot_id;
		reg.restarted = r->restarted;
		if (r->cluster_id)
			reg.cluster_id = (char *)r->cluster_id;
		reg.epoch_applied = r->epoch;
		break;
	case KV_ADM_WATCH:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_WATCH;
		m.watch = &w;
		w.known_epoch = r->epoch;
		w.history = r->history;
		w.max_configs = r->max_configs;
		w.node_id = r->node_id;
		break;
	case KV_ADM_HEARTBEAT:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_HEARTBEAT;
		m.heartbeat = &hb;
		hb.node_id = r->node_id;
		hb.boot_id = r->boot_id;
		hb.restarted = r->restarted;
		hb.epoch_applied = r->epoch;
		hb.keys = r->keys;
		hb.bytes = r->bytes;
		hb.ops_per_sec = r->ops;
		hb.memory_bytes = r->memory;
		hb.lease_only = r->lease_only;
		hb.uptime_ms = r->uptime_ms;
		if (r->nranges == 0)
			break;
		for (size_t i = 0; i < r->nranges; i++)
			nsk += r->ranges[i].nsplit + r->ranges[i].nlsplit;
		rs = calloc(r->nranges, sizeof(*rs));
		rsp = calloc(r->nranges, sizeof(*rsp));
		sk = calloc(nsk ? nsk : 1, sizeof(*sk));
		if (rs == NULL || rsp == NULL || sk == NULL)
			goto cleanup;
		nsk = 0;
		for (size_t i = 0; i < r->nranges; i++) {
			const kv_admin_range_stat *s = &r->ranges[i];
			shardkv__range_stats__init(&rs[i]);
			rs[i].start = to_pb(s->start);
			rs[i].end = to_pb(s->end);
			rs[i].keys = s->keys;
			rs[i].bytes = s->bytes;
			rs[i].ops_per_sec = s->ops;
			rs[i].reads_per_sec = s->reads;
			rs[i].writes_per_sec = s->writes;
			rs[i].load_split_key = to_pb(s->load_split);
			rs[i].hot_key = to_pb(s->hot_key);
			rs[i].hot_key_share = s->hot_share;
			rs[i].split_keys = &sk[nsk];
			for (size_t j = 0; j < s->nsplit; j++)
				sk[nsk++] = to_pb(s->split[j]);
			rs[i].n_split_keys = s->nsplit;
			rs[i].load_split_keys = &sk[nsk];
			for (size_t j = 0; j < s->nlsplit; j++)
				sk[nsk++] = to_pb(s->lsplit[j]);
			rs[i].n_load_split_keys = s->nlsplit;
			rsp[i] = &rs[i];
		}
		hb.n_ranges = r->nranges;
		hb.ranges = rsp;
		break;
	case KV_ADM_PROGRESS:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_MIGRATION_PROGRESS;
		m.migration_progress = &pr;
		pr.migration_id = r->mig_id;
		pr.node_id = r->node_id;
		pr.phase = (Shardkv__MigrationPhase)r->phase;
		pr.keys_copied = r->keys_copied;
		pr.bytes_copied = r->bytes_copied;
		pr.keys_total = r->keys_total;
		pr.bytes_total = r->bytes_total;
		pr.rate_bytes_s = r->rate_bytes_s;
		break;
	case KV_ADM_DONE:
		m.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_MIGRATION_DONE;
		m.migration_done = &dn;
		dn.migration_id = r->mig_id;
		dn.node_id = r->node_id;
		dn.status = kv_wire_from_err(r->result);
		if (r->error)
			dn.error = (char *)r->error;
		dn.keys = r->keys;
		dn.bytes = r->bytes;
		dn.last_seq = r->last_seq;
		break;
	default:
		return KV_EINVAL;
	}
	rv = kv_codec__pack(&m.base, out);
cleanup:
	free(rs);
	free(rsp);
	free(sk);
	return rv;
}

/* What a decoded response keeps (kv_admin_resp.priv). */
typedef struct {
	Shardkv__AdminResponse *pb;  /* the unpacked message strings and ids borrow from */
	kv_config *config;           /* AdminResponse.config, decoded; NULL when taken */
	kv_config **configs;         /* AdminResponse.configs, decoded */
	size_t nconfigs;             /* entries in configs */
	kv_admin_report report;      /* points at the arrays below */
	kv_admin_node_stat *nodes;   /* report.nodes */
	kv_admin_range_stat *ranges; /* every node's ranges, one array */
	kv_bytes *splits;            /* every range's split keys, one array */
	kv_migration *migs;          /* report.migs (owned bytes) */
	size_t nmigs;                /* entries in migs that hold bytes */
	kv_admin_replica *replicas;  /* report.replicas */
	kv_migration *plan;          /* AdminResponse.plan (owned bytes) */
	size_t nplan;                /* entries in plan that hold bytes */
	kv_admin_balance *balance;   /* report.balance (strings borrow from pb) */
	kv_admin_balance *bplan;     /* AdminResponse.balancer_plan */
} resp_store;

/* Bounds on a decoded response beyond which it is KV_EPROTO. */
#define RESP_MAX_CONFIGS 100000u     /* configurations in one answer */
#define RESP_MAX_STR     (64 * 1024) /* error, addresses */

static bool
str_ok(const char *s)
{
	return s == NULL || strlen(s) <= RESP_MAX_STR;
}

static void
store_free(resp_store *st)
{
	if (st == NULL)
		return;
	if (st->pb)
		shardkv__admin_response__free_unpacked(st->pb, NULL);
	kv_config_free(st->config);
	for (size_t i = 0; i < st->nconfigs; i++)
		kv_config_free(st->configs[i]);
	free(st->configs);
	free(st->nodes);
	free(st->ranges);
	free(st->splits);
	for (size_t i = 0; i < st->nmigs; i++) {
		kv_buf_fini(&st->migs[i].start);
		kv_buf_fini(&st->migs[i].end);
	}
	free(st->migs);
	free(st->replicas);
	for (size_t i = 0; i < st->nplan; i++) {
		kv_buf_fini(&st->plan[i].start);
		kv_buf_fini(&st->plan[i].end);
	}
	free(st->plan);
	free(st->balance);
	free(st->bplan);
	free(st);
}

/* Decodes n BalancerDecision messages into *out (allocated). */
static int
balance_from_pb(Shardkv__BalancerDecision *const *b, size_t n, kv_admin_balance **out)
{
	if (n == 0)
		return KV_OK;
	if (n > KV_ADMIN_MAX_BALANCE)
		return KV_EPROTO;
	if ((*out = calloc(n, sizeof(**out))) == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (!str_ok(b[i]->kind) || !str_ok(b[i]->reason) || !str_ok(b[i]->what))
			return KV_EPROTO;
		(*out)[i] = (kv_admin_balance){.time_ms = b[i]->time_ms,
		                               .kind = b[i]->kind,
		                               .reason = b[i]->reason,
		                               .what = b[i]->what};
	}
	return KV_OK;
}

static int
report_from_pb(const Shardkv__StatusReport *rep, resp_store *st)
{
	size_t nr = 0, ns = 0;
	int rv;

	for (size_t i = 0; i < rep->n_nodes; i++) {
		nr += rep->nodes[i]->n_ranges;
		for (size_t j = 0; j < rep->nodes[i]->n_ranges; j++)
			ns += rep->nodes[i]->ranges[j]->n_split_keys;
	}
	if ((rep->n_nodes && (st->nodes = calloc(rep->n_nodes, sizeof(*st->nodes))) == NULL) ||
	    (nr && (st->ranges = calloc(nr, sizeof(*st->ranges))) == NULL) ||
	    (ns && (st->splits = calloc(ns, sizeof(*st->splits))) == NULL) ||
	    (rep->n_migrations &&
	     (st->migs = calloc(rep->n_migrations, sizeof(*st->migs))) == NULL) ||
	    (rep->n_controllers &&
	     (st->replicas = calloc(rep->n_controllers, sizeof(*st->replicas))) == NULL))
		return KV_ENOMEM;
	nr = ns = 0;
	for (size_t i = 0; i < rep->n_nodes; i++) {
		const Shardkv__NodeStats *n = rep->nodes[i];
		kv_admin_node_stat *o = &st->nodes[i];
		o->node_id = n->node_id;
		o->keys = n->keys;
		o->bytes = n->bytes;
		o->memory = n->memory_bytes;
		o->epoch_applied = n->epoch_applied;
		o->last_seen_ms = n->last_seen_ms;
		o->uptime_ms = n->uptime_ms;
		o->ops = n->ops_per_sec;
		o->ranges = n->n_ranges ? &st->ranges[nr] : NULL;
		o->nranges = n->n_ranges;
		for (size_t j = 0; j < n->n_ranges; j++) {
			const Shardkv__RangeStats *x = n->ranges[j];
			kv_admin_range_stat *y = &st->ranges[nr++];
			if (x->start.len > KV_HARD_MAX_KEY || x->end.len > KV_HARD_MAX_KEY)
				return KV_EPROTO;
			y->start = from_pb(x->start);
			y->end = from_pb(x->end);
			y->keys = x->keys;
			y->bytes = x->bytes;
			y->ops = x->ops_per_sec;
			y->reads = rate_ok(x->reads_per_sec);
			y->writes = rate_ok(x->writes_per_sec);
			y->split = x->n_split_keys ? &st->splits[ns] : NULL;
			y->nsplit = x->n_split_keys;
			for (size_t k = 0; k < x->n_split_keys; k++) {
				if (x->split_keys[k].len > KV_HARD_MAX_KEY)
					return KV_EPROTO;
				st->splits[ns++] = from_pb(x->split_keys[k]);
			}
		}
	}
	for (size_t i = 0; i < rep->n_migrations; i++, st->nmigs++)
		if ((rv = kv_codec_migration_from_pb(rep->migrations[i], &st->migs[i])) != KV_OK) {
			st->nmigs++;
			return rv;
		}
	for (size_t i = 0; i < rep->n_controllers; i++) {
		const Shardkv__ControllerReplica *c = rep->controllers[i];
		if (!str_ok(c->address))
			return KV_EPROTO;
		st->replicas[i].id = c->id;
		st->replicas[i].address = c->address;
		st->replicas[i].role = (int)c->role;
		st->replicas[i].term = c->term;
		st->replicas[i].index = c->index;
	}
	st->report.nnodes = rep->n_nodes;
	st->report.nodes = st->nodes;
	st->report.nmigs = rep->n_migrations;
	st->report.migs = st->migs;
	st->report.nreplicas = rep->n_controllers;
	st->report.replicas = st->replicas;
	if ((rv = balance_from_pb(rep->balancer, rep->n_balancer, &st->balance)) != KV_OK)
		return rv;
	st->report.nbalance = rep->n_balancer;
	st->report.balance = st->balance;
	return KV_OK;
}

/* A dry run's plan: bounded, each step a migration between two nodes. */
static int
plan_from_pb(const Shardkv__AdminResponse *r, resp_store *st)
{
	int rv;

	if (r->n_plan == 0)
		return KV_OK;
	if (r->n_plan > KV_ADMIN_MAX_PLAN)
		return KV_EPROTO;
	if ((st->plan = calloc(r->n_plan, sizeof(*st->plan))) == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < r->n_plan; i++) {
		kv_migration *m = &st->plan[i];
		rv = kv_codec_migration_from_pb(r->plan[i], m);
		st->nplan++; /* its bytes are freed with the store, on error too */
		if (rv != KV_OK)
			return rv;
		if (m->from == 0 || m->to == 0 || m->from == m->to)
			return KV_EPROTO;
	}
	return KV_OK;
}

int
kv_admin_resp_decode(const void *p, size_t n, kv_admin_resp *out)
{
	resp_store *st;
	Shardkv__AdminResponse *r;
	int rv;

	memset(out, 0, sizeof(*out));
	if ((st = calloc(1, sizeof(*st))) == NULL)
		return KV_ENOMEM;
	if ((st->pb = r = shardkv__admin_response__unpack(NULL, n, p)) == NULL) {
		rv = KV_EPROTO;
		goto err;
	}
	rv = KV_EPROTO;
	if (!str_ok(r->error) || r->n_configs > RESP_MAX_CONFIGS ||
	    (r->leader && !str_ok(r->leader->address)))
		goto err;
	if (r->config && (rv = kv_codec_config_from_pb(r->config, &st->config)) != KV_OK)
		goto err;
	if (r->n_configs && (st->configs = calloc(r->n_configs, sizeof(*st->configs))) == NULL) {
		rv = KV_ENOMEM;
		goto err;
	}
	for (size_t i = 0; i < r->n_configs; i++, st->nconfigs++)
		if ((rv = kv_codec_config_from_pb(r->configs[i], &st->configs[i])) != KV_OK)
			goto err;
	if (r->report && (rv = report_from_pb(r->report, st)) != KV_OK)
		goto err;
	if ((rv = plan_from_pb(r, st)) != KV_OK ||
	    (rv = balance_from_pb(r->balancer_plan, r->n_balancer_plan, &st->bplan)) != KV_OK)
		goto err;
	out->request_id = r->request_id;
	out->not_leader = r->status == SHARDKV__STATUS__STATUS_NOT_LEADER;
	out->err = kv_err_from_wire((int)r->status);
	out->error = r->error ? r->error : "";
	out->epoch = r->epoch;
	out->config = st->config;
	out->configs = (const kv_config *const *)st->configs;
	out->nconfigs = st->nconfigs;
	out->report = r->report ? &st->report : NULL;
	out->wait_ms = r->wait_ms;
	out->node_id = r->node_id;
	out->ranges_lost = r->ranges_lost;
	out->mig_ids = r->migration_ids;
	out->nmig_ids = r->n_migration_ids;
	out->plan = st->plan;
	out->nplan = st->nplan;
	out->balance_plan = st->bplan;
	out->nbalance_plan = r->n_balancer_plan;
	if (r->leader) {
		out->leader_id = r->leader->id;
		out->leader_address = r->leader->address;
	}
	out->term = r->term;
	out->commit_index = r->commit_index;
	out->priv = st;
	return KV_OK;
err:
	store_free(st);
	return rv == KV_ENOMEM ? KV_ENOMEM : KV_EPROTO;
}

size_t
kv_admin_resp_take_configs(kv_admin_resp *r, kv_config ***out)
{
	resp_store *st = r->priv;
	size_t n;

	*out = NULL;
	if (st == NULL)
		return 0;
	if (st->nconfigs) {
		*out = st->configs;
		n = st->nconfigs;
		st->configs = NULL;
		st->nconfigs = 0;
	} else if (st->config && (*out = malloc(sizeof(**out))) != NULL) {
		(*out)[0] = st->config;
		st->config = NULL;
		n = 1;
	} else {
		return 0;
	}
	r->config = NULL;
	r->configs = NULL;
	r->nconfigs = 0;
	return n;
}

kv_config *
kv_admin_resp_take_config(kv_admin_resp *r)
{
	resp_store *st = r->priv;
	kv_config *c = NULL;

	if (st == NULL)
		return NULL;
	if (st->config) {
		c = st->config;
		st->config = NULL;
		r->config = NULL;
	} else if (st->nconfigs) {
		c = st->configs[--st->nconfigs];
		st->configs[st->nconfigs] = NULL;
		r->nconfigs = st->nconfigs;
	}
	return c;
}

void
kv_admin_resp_fini(kv_admin_resp *r)
{
	if (r == NULL)
		return;
	store_free(r->priv);
	memset(r, 0, sizeof(*r));
}
