/*
 * admin.c - the admin operations of libshardkv (doc/contract.md §4) and the public
 * configuration result.
 *
 * Each command is one AdminRequest to the controllers (kvc_controller_call
 * finds one that answers and follows NOT_LEADER hints). The request id is
 * fixed before the first attempt, so a command retried after a lost reply
 * is applied once by the controller. A command that publishes a new
 * configuration also updates the handle's cache when the reply carries it.
 */
#include "client/client_int.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

const char *
shardkv_node_state_name(int state)
{
	return kv_node_state_name((kv_node_state)state);
}

/* Parses a node given as an id ("3") or an address. */
static void
node_ref(const char *node, kv_admin_req *q)
{
	char *e;
	unsigned long v;

	if (node[0] >= '0' && node[0] <= '9') {
		v = strtoul(node, &e, 10);
		if (*e == 0 && v > 0 && v <= UINT32_MAX) {
			q->node_id = (uint32_t)v;
			return;
		}
	}
	q->address = node;
}

static int buf_dup(shardkv_buf *dst, const kv_buf *src);

static int
admin_run(shardkv_client *c, kv_admin_req *q, kv_admin_resp *r)
{
	int rv;

	kvc_clear_error();
	if ((rv = kvc_controller_call(c, q, kvc_deadline(c), r)) != KV_OK)
		return rv;
	if (r->err != KV_OK) {
		rv = kvc_fail(r->err, "%s",
		              r->error && r->error[0] ? r->error : kv_strerror(r->err));
		kv_admin_resp_fini(r);
		return rv;
	}
	return KV_OK;
}

static int
admin_change(shardkv_client *c, kv_admin_req *q, unsigned flags, shardkv_admin_result *out)
{
	kv_admin_resp r;
	kv_config *cfg;
	int rv;

	q->wait = (flags & SHARDKV_WAIT) != 0;
	if ((rv = admin_run(c, q, &r)) != KV_OK)
		return rv;
	cfg = kv_admin_resp_take_config(&r);
	if (out) {
		memset(out, 0, sizeof(*out));
		out->epoch = r.epoch ? r.epoch : (cfg ? cfg->epoch : 0);
		out->node_id = r.node_id;
		out->nmigrations = r.nmig_ids;
		out->first_mig_id = r.nmig_ids ? r.mig_ids[0] : 0;
		out->wait_ms = r.wait_ms;
	}
	if (cfg)
		kvc_cfg_install(c, cfg);
	kv_admin_resp_fini(&r);
	return KV_OK;
}

int
shardkv_join(shardkv_client *c, const char *address, unsigned flags, shardkv_admin_result *out)
{
	kv_admin_req q = {.op = KV_ADM_JOIN, .address = address};

	if (c == NULL || address == NULL || address[0] == 0)
		return kvc_fail(KV_EINVAL, "no server address given");
	q.no_rebalance = (flags & SHARDKV_NO_REBALANCE) != 0;
	return admin_change(c, &q, flags, out);
}

int
shardkv_leave(shardkv_client *c, const char *node, unsigned flags, shardkv_admin_result *out)
{
	kv_admin_req q = {.op = KV_ADM_LEAVE};

	if (c == NULL || node == NULL || node[0] == 0)
		return kvc_fail(KV_EINVAL, "no node given");
	node_ref(node, &q);
	return admin_change(c, &q, flags, out);
}

int
shardkv_remove(shardkv_client *c, const char *node, unsigned flags, shardkv_admin_result *out,
               uint32_t *ranges_lost)
{
	kv_admin_req q = {.op = KV_ADM_REMOVE};
	kv_admin_resp r;
	kv_config *cfg;
	int rv;

	if (c == NULL || node == NULL || node[0] == 0)
		return kvc_fail(KV_EINVAL, "no node given");
	node_ref(node, &q);
	q.accept_data_loss = (flags & SHARDKV_ACCEPT_DATA_LOSS) != 0;
	if ((rv = admin_run(c, &q, &r)) != KV_OK)
		return rv;
	cfg = kv_admin_resp_take_config(&r);
	if (out) {
		memset(out, 0, sizeof(*out));
		out->epoch = r.epoch ? r.epoch : (cfg ? cfg->epoch : 0);
		out->node_id = r.node_id;
	}
	if (ranges_lost)
		*ranges_lost = r.ranges_lost;
	if (cfg)
		kvc_cfg_install(c, cfg);
	kv_admin_resp_fini(&r);
	return KV_OK;
}

int
shardkv_move(shardkv_client *c, const void *start, size_t slen, const void *end, size_t elen,
             const char *node, uint32_t rate_mb_s, unsigned flags, shardkv_admin_result *out)
{
	kv_admin_req q = {.op = KV_ADM_MOVE, .rate_mb_s = rate_mb_s};

	if (c == NULL || node == NULL || node[0] == 0)
		return kvc_fail(KV_EINVAL, "no node given");
	if (kv_range_is_empty(start, slen, end, elen))
		return kvc_fail(KV_EINVAL, "empty or inverted range");
	q.start = (kv_bytes){start, slen};
	q.end = (kv_bytes){end, elen};
	node_ref(node, &q);
	return admin_change(c, &q, flags, out);
}

int
shardkv_rebalance(shardkv_client *c, uint32_t rate_mb_s, unsigned flags, shardkv_admin_result *out)
{
	kv_admin_req q = {.op = KV_ADM_REBALANCE, .rate_mb_s = rate_mb_s};

	if (c == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	return admin_change(c, &q, flags, out);
}

/* Copies n balancer decisions into *out (allocated) and *nout. Returns 0 or
 * KV_ENOMEM (*out then holds what was copied, *nout its count). */
static int
balance_to_public(const kv_admin_balance *b, size_t n, shardkv_balancer_decision **out,
                  size_t *nout)
{
	*out = NULL;
	*nout = 0;
	if (n == 0)
		return KV_OK;
	if ((*out = calloc(n, sizeof(**out))) == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < n; i++, (*nout)++) {
		shardkv_balancer_decision *d = &(*out)[i];
		d->time_ms = b[i].time_ms;
		if ((d->kind = strdup(b[i].kind ? b[i].kind : "")) == NULL ||
		    (d->reason = strdup(b[i].reason ? b[i].reason : "")) == NULL ||
		    (d->what = strdup(b[i].what ? b[i].what : "")) == NULL) {
			(*nout)++;
			return KV_ENOMEM;
		}
	}
	return KV_OK;
}

static void
balance_free(shardkv_balancer_decision *d, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(d[i].kind);
		free(d[i].reason);
		free(d[i].what);
	}
	free(d);
}

/* Runs a dry run (q->dry_run) and builds the public plan. */
static int
plan_run(shardkv_client *c, kv_admin_req *q, shardkv_plan **out)
{
	kv_admin_resp r;
	shardkv_plan *p;
	int rv;

	if ((rv = admin_run(c, q, &r)) != KV_OK) {
		/* A controller from before dry runs sees no command it knows (and
		 * so changes nothing). */
		if (rv == KV_EINVAL && strstr(shardkv_errmsg(), "without a command") != NULL)
			return kvc_fail(KV_EINVAL,
			                "the controller does not know dry runs (an older "
			                "version); nothing was changed");
		return rv;
	}
	if ((p = calloc(1, sizeof(*p))) == NULL ||
	    (r.nplan && (p->steps = calloc(r.nplan, sizeof(*p->steps))) == NULL)) {
		free(p);
		kv_admin_resp_fini(&r);
		return kvc_fail(KV_ENOMEM, "out of memory");
	}
	p->epoch = r.epoch;
	for (size_t i = 0; i < r.nplan; i++, p->nsteps++) {
		shardkv_plan_step *s = &p->steps[i];
		s->from = r.plan[i].from;
		s->to = r.plan[i].to;
		s->keys = r.plan[i].keys_total;
		s->bytes = r.plan[i].bytes_total;
		if (buf_dup(&s->start, &r.plan[i].start) != KV_OK ||
		    buf_dup(&s->end, &r.plan[i].end) != KV_OK) {
			p->nsteps++; /* freed with the plan */
			shardkv_plan_free(p);
			kv_admin_resp_fini(&r);
			return kvc_fail(KV_ENOMEM, "out of memory");
		}
	}
	if (balance_to_public(r.balance_plan, r.nbalance_plan, &p->balancer, &p->nbalancer) !=
	    KV_OK) {
		shardkv_plan_free(p);
		kv_admin_resp_fini(&r);
		return kvc_fail(KV_ENOMEM, "out of memory");
	}
	kv_admin_resp_fini(&r);
	*out = p;
	return KV_OK;
}

int
shardkv_move_plan(shardkv_client *c, const void *start, size_t slen, const void *end, size_t elen,
                  const char *node, uint32_t rate_mb_s, shardkv_plan **out)
{
	kv_admin_req q = {.op = KV_ADM_MOVE, .dry_run = true, .rate_mb_s = rate_mb_s};

	if (c == NULL || out == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	*out = NULL;
	if (node == NULL || node[0] == 0)
		return kvc_fail(KV_EINVAL, "no node given");
	if ((start == NULL && slen) || (end == NULL && elen))
		return kvc_fail(KV_EINVAL, "null argument");
	if (kv_range_is_empty(start, slen, end, elen))
		return kvc_fail(KV_EINVAL, "empty or inverted range");
	q.start = (kv_bytes){start, slen};
	q.end = (kv_bytes){end, elen};
	node_ref(node, &q);
	return plan_run(c, &q, out);
}

int
shardkv_rebalance_plan(shardkv_client *c, uint32_t rate_mb_s, shardkv_plan **out)
{
	kv_admin_req q = {.op = KV_ADM_REBALANCE, .dry_run = true, .rate_mb_s = rate_mb_s};

	if (c == NULL || out == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	*out = NULL;
	return plan_run(c, &q, out);
}

void
shardkv_plan_free(shardkv_plan *plan)
{
	if (plan == NULL)
		return;
	for (size_t i = 0; i < plan->nsteps; i++) {
		free(plan->steps[i].start.data);
		free(plan->steps[i].end.data);
	}
	free(plan->steps);
	balance_free(plan->balancer, plan->nbalancer);
	free(plan);
}

int
shardkv_cancel(shardkv_client *c, uint64_t migration_id, shardkv_admin_result *out)
{
	kv_admin_req q = {.op = KV_ADM_CANCEL, .mig_id = migration_id};

	if (c == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	if (migration_id == 0)
		return kvc_fail(KV_EINVAL, "no migration id given (ids start at 1)");
	return admin_change(c, &q, 0, out);
}

/* Copies bytes into a NUL-terminated public buffer. */
static int
buf_dup(shardkv_buf *dst, const kv_buf *src)
{
	if ((dst->data = malloc(src->len + 1)) == NULL)
		return KV_ENOMEM;
	if (src->len)
		memcpy(dst->data, src->data, src->len);
	dst->data[src->len] = 0;
	dst->len = src->len;
	return KV_OK;
}

static int
mig_fill(const kv_migration *m, shardkv_migration *x)
{
	x->id = m->id;
	x->from = m->from;
	x->to = m->to;
	x->phase = kv_mig_phase_name(m->phase);
	x->keys_copied = m->keys_copied;
	x->bytes_copied = m->bytes_copied;
	x->keys_total = m->keys_total;
	x->bytes_total = m->bytes_total;
	x->eta_ms = m->eta_ms;
	x->rate_bytes_s = m->rate_bytes_s;
	x->progress_age_ms = m->progress_age_ms;
	if (buf_dup(&x->start, &m->start) != KV_OK || buf_dup(&x->end, &m->end) != KV_OK)
		return KV_ENOMEM;
	return KV_OK;
}

/* Copies the migrations of m[0..n) not finished yet into out. */
static int
migs_to_public(const kv_migration *m, size_t n, shardkv_config *out)
{
	size_t live = 0;

	for (size_t i = 0; i < n; i++)
		live += m[i].phase < KV_MIG_DONE;
	if (live == 0)
		return KV_OK;
	if ((out->migrations = calloc(live, sizeof(*out->migrations))) == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (m[i].phase >= KV_MIG_DONE)
			continue;
		/* Counted before filling, so a failure frees what was copied. */
		if (mig_fill(&m[i], &out->migrations[out->nmigrations++]) != KV_OK)
			return KV_ENOMEM;
	}
	return KV_OK;
}

/* Builds the public form of a configuration (and of the report, when the
 * reply has one). */
static int
config_to_public(const kv_config *cfg, const kv_admin_report *rep, shardkv_config **out)
{
	shardkv_config *p = calloc(1, sizeof(*p));
	size_t nstats = rep ? rep->nnodes : 0, nreplicas = rep ? rep->nreplicas : 0;

	if (p == NULL)
		return KV_ENOMEM;
	p->epoch = cfg->epoch;
	p->min_insync = cfg->min_insync;
	if (cfg->nnodes && (p->nodes = calloc(cfg->nnodes, sizeof(*p->nodes))) == NULL)
		goto err;
	for (size_t i = 0; i < cfg->nnodes; i++, p->nnodes++) {
		shardkv_node *n = &p->nodes[i];
		n->id = cfg->nodes[i].id;
		n->state = (int)cfg->nodes[i].state;
		if ((n->address = strdup(cfg->nodes[i].address)) == NULL)
			goto err;
		for (size_t j = 0; j < nstats; j++) {
			const kv_admin_node_stat *s = &rep->nodes[j];
			if (s->node_id != n->id)
				continue;
			n->has_stats = true;
			n->keys = s->keys;
			n->bytes = s->bytes;
			n->ops_per_sec = s->ops;
			n->memory_bytes = s->memory;
			n->last_seen_ms = s->last_seen_ms;
			n->uptime_ms = s->uptime_ms;
		}
	}
	if (cfg->nranges && (p->ranges = calloc(cfg->nranges, sizeof(*p->ranges))) == NULL)
		goto err;
	for (size_t i = 0; i < cfg->nranges; i++, p->nranges++) {
		const kv_range *cr = &cfg->ranges[i];
		shardkv_range *pr = &p->ranges[i];
		pr->node = cr->node;
		pr->leader_epoch = cr->leader_epoch;
		pr->fence = cr->fence;
		pr->nreplicas = kv_range_nreplicas(cr);
		pr->ninsync = kv_range_ninsync(cr);
		for (uint32_t k = 0; k < pr->nreplicas && k < SHARDKV_MAX_REPLICAS; k++)
			pr->replicas[k] = kv_range_replica(cr, k);
		for (uint32_t k = 0; k < pr->ninsync && k < SHARDKV_MAX_REPLICAS; k++)
			pr->insync[k] = kv_range_insync(cr, k);
		if (buf_dup(&p->ranges[i].start, &cfg->ranges[i].start) != KV_OK ||
		    buf_dup(&p->ranges[i].end, &cfg->ranges[i].end) != KV_OK)
			goto err;
	}
	if (cfg->npins && (p->pins = calloc(cfg->npins, sizeof(*p->pins))) == NULL)
		goto err;
	for (size_t i = 0; i < cfg->npins; i++, p->npins++)
		if (buf_dup(&p->pins[i].start, &cfg->pins[i].start) != KV_OK ||
		    buf_dup(&p->pins[i].end, &cfg->pins[i].end) != KV_OK) {
			p->npins++; /* freed with the rest */
			goto err;
		}
	/* A status report carries the migrations with live progress. */
	if (rep ? migs_to_public(rep->migs, rep->nmigs, p) != KV_OK
	        : migs_to_public(cfg->migs, cfg->nmigs, p) != KV_OK)
		goto err;
	if (nreplicas && (p->controllers = calloc(nreplicas, sizeof(*p->controllers))) == NULL)
		goto err;
	for (size_t i = 0; i < nreplicas; i++, p->ncontrollers++) {
		const kv_admin_replica *y = &rep->replicas[i];
		shardkv_controller *x = &p->controllers[i];
		x->id = y->id;
		x->role = kvc_role_name(y->role);
		x->term = y->term;
		x->index = y->index;
		if (y->address && y->address[0] && (x->address = strdup(y->address)) == NULL)
			goto err;
	}
	if (rep != NULL &&
	    balance_to_public(rep->balance, rep->nbalance, &p->balancer, &p->nbalancer) != KV_OK)
		goto err;
	*out = p;
	return KV_OK;
err:
	shardkv_config_free(p);
	return KV_ENOMEM;
}

static int
fetch(shardkv_client *c, kv_admin_req *q, shardkv_config **out)
{
	kv_admin_resp r;
	const kv_config *cfg;
	int rv;

	if (c == NULL || out == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	if ((rv = admin_run(c, q, &r)) != KV_OK)
		return rv;
	/* The newest: a watch with history answers in configs, oldest first. */
	cfg = r.config ? r.config : (r.nconfigs ? r.configs[r.nconfigs - 1] : NULL);
	if (cfg == NULL) {
		kv_admin_resp_fini(&r);
		return kvc_fail(KV_EPROTO, "the controller sent no configuration");
	}
	rv = config_to_public(cfg, r.report, out);
	kv_admin_resp_fini(&r);
	return rv;
}

int
shardkv_config_get(shardkv_client *c, uint64_t epoch, shardkv_config **out)
{
	kv_admin_req q = {.op = KV_ADM_GET_CONFIG, .epoch = epoch};
	return fetch(c, &q, out);
}

int
shardkv_status(shardkv_client *c, shardkv_config **out)
{
	kv_admin_req q = {.op = KV_ADM_STATUS};
	return fetch(c, &q, out);
}

void
shardkv_config_free(shardkv_config *cfg)
{
	if (cfg == NULL)
		return;
	for (size_t i = 0; i < cfg->nnodes; i++)
		free(cfg->nodes[i].address);
	free(cfg->nodes);
	for (size_t i = 0; i < cfg->nranges; i++) {
		free(cfg->ranges[i].start.data);
		free(cfg->ranges[i].end.data);
	}
	free(cfg->ranges);
	for (size_t i = 0; i < cfg->npins; i++) {
		free(cfg->pins[i].start.data);
		free(cfg->pins[i].end.data);
	}
	free(cfg->pins);
	for (size_t i = 0; i < cfg->nmigrations; i++) {
		free(cfg->migrations[i].start.data);
		free(cfg->migrations[i].end.data);
	}
	free(cfg->migrations);
	for (size_t i = 0; i < cfg->ncontrollers; i++)
		free(cfg->controllers[i].address);
	free(cfg->controllers);
	balance_free(cfg->balancer, cfg->nbalancer);
	free(cfg);
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
