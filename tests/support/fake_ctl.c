/*
 * fake_ctl.c - the fake controller of the tests (fake_ctl.h). One mutex
 * (fake_ctl.mu) protects its state; the handler runs on nng's threads, a
 * ticker thread answers watches held for 300 ms, and fake_cfg_publish
 * answers the held watches at once.
 */
#include "tests/support/fake_ctl.h"
#include "common/err.h"
#include "proto/codec_int.h"
#include "proto/config_codec.h"
#include "proto/shardkv.pb-c.h"
#include "tests/support/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define WATCH_HOLD_MS 300 /* how long a watch is held before it is answered unchanged */

static uint64_t
now_ms(void)
{
	return kv_test_now_ms();
}

/* The latest published epoch, 0 before the first. Caller holds mu. */
static uint64_t
latest_locked(const fake_ctl *f)
{
	return f->ncfgs ? f->first + f->ncfgs - 1 : 0;
}

/* The published configuration of epoch e, NULL for one never published.
 * Caller holds mu. */
static const kv_config *
cfg_at_locked(const fake_ctl *f, uint64_t e)
{
	if (f->ncfgs == 0 || e < f->first || e > latest_locked(f))
		return NULL;
	return f->cfgs[e - f->first];
}

/* The id of the known node ref names (by id or address), 0 for none.
 * Caller holds mu. */
static uint32_t
ref_node_locked(const fake_ctl *f, const Shardkv__NodeRef *ref)
{
	if (ref == NULL)
		return 0;
	if (ref->ref_case == SHARDKV__NODE_REF__REF_ID)
		return ref->id >= 1 && ref->id <= f->nnodes ? ref->id : 0;
	if (ref->ref_case == SHARDKV__NODE_REF__REF_ADDRESS)
		for (uint32_t i = 0; i < f->nnodes; i++)
			if (strcmp(f->addrs[i], ref->address) == 0)
				return i + 1;
	return 0;
}

/* The id of the known node listening on address, 0 for none. Caller holds mu. */
static uint32_t
node_by_addr_locked(const fake_ctl *f, const char *address)
{
	for (uint32_t i = 0; i < f->nnodes; i++)
		if (strcmp(f->addrs[i], address) == 0)
			return i + 1;
	return 0;
}

/*
 * Packs r with cfg as its config (NULL: none) and, with history, every
 * published configuration after `known` as its configs, oldest first.
 * Caller holds mu.
 */
static nng_msg *
pack_locked(fake_ctl *f, Shardkv__AdminResponse *r, const kv_config *cfg, bool history,
            uint64_t known)
{
	Shardkv__Config *pbs[FAKE_CTL_MAX_CFGS];
	size_t n = 0;
	nng_msg *m;

	r->version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	/* known < latest whenever history is asked for (watch_reply_locked). */
	if (history && f->ncfgs > 0)
		for (uint64_t e = known < f->first ? f->first : known + 1; e <= latest_locked(f);
		     e++) {
			pbs[n] = kv_codec_config_to_pb(cfg_at_locked(f, e));
			assert_non_null(pbs[n++]);
		}
	r->n_configs = n;
	r->configs = n ? pbs : NULL;
	if (cfg != NULL) {
		r->config = kv_codec_config_to_pb(cfg);
		assert_non_null(r->config);
	}
	size_t len = shardkv__admin_response__get_packed_size(r);
	assert_int_equal(nng_msg_alloc(&m, len), 0);
	shardkv__admin_response__pack(r, nng_msg_body(m));
	for (size_t i = 0; i < n; i++)
		kv_codec_config_pb_free(pbs[i]);
	if (r->config != NULL)
		kv_codec_config_pb_free(r->config);
	r->config = NULL;
	return m;
}

/* The answer to a watch that has a newer configuration, or has waited long
 * enough (then nothing but the latest epoch). Caller holds mu. */
static nng_msg *
watch_reply_locked(fake_ctl *f, uint64_t reqid, uint64_t known, bool history)
{
	Shardkv__AdminResponse r = SHARDKV__ADMIN_RESPONSE__INIT;
	uint64_t latest = latest_locked(f);

	r.request_id = reqid;
	r.epoch = latest;
	if (latest <= known)
		return pack_locked(f, &r, NULL, false, 0);
	return pack_locked(f, &r, history ? NULL : cfg_at_locked(f, latest), history, known);
}

/* Status: the latest configuration, made-up statistics of every known node
 * and one standalone controller replica (this one). Caller holds mu. */
static nng_msg *
status_reply_locked(fake_ctl *f, Shardkv__AdminResponse *r)
{
	Shardkv__StatusReport rep = SHARDKV__STATUS_REPORT__INIT;
	Shardkv__NodeStats ns[FAKE_CTL_MAX_NODES], *nsp[FAKE_CTL_MAX_NODES];
	Shardkv__ControllerReplica cr = SHARDKV__CONTROLLER_REPLICA__INIT, *crp = &cr;

	for (uint32_t i = 0; i < f->nnodes; i++) {
		shardkv__node_stats__init(&ns[i]);
		ns[i].node_id = i + 1;
		ns[i].keys = 10u * ((uint64_t)i + 1);
		ns[i].bytes = 100u * ((uint64_t)i + 1);
		ns[i].ops_per_sec = 1.5;
		nsp[i] = &ns[i];
	}
	cr.id = 1;
	cr.address = f->url;
	cr.role = SHARDKV__REPLICA_ROLE__REPLICA_ROLE_STANDALONE;
	rep.n_nodes = f->nnodes;
	rep.nodes = nsp;
	rep.n_controllers = 1;
	rep.controllers = &crp;
	r->report = &rep;
	return pack_locked(f, r, cfg_at_locked(f, latest_locked(f)), false, 0);
}

static int
ctl_handler(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p)
{
	fake_ctl *f = arg;
	Shardkv__AdminRequest *rq =
	    shardkv__admin_request__unpack(NULL, nng_msg_len(req), nng_msg_body(req));
	Shardkv__AdminResponse r = SHARDKV__ADMIN_RESPONSE__INIT;
	const kv_config *cfg = NULL;
	uint64_t mig_ids[1] = {FAKE_CTL_MIG_ID};
	int rv = 0;

	if (rq == NULL)
		return KV_EPROTO;
	r.request_id = rq->request_id;
	pthread_mutex_lock(&f->mu);
	uint64_t latest = latest_locked(f);
	r.epoch = latest;
	switch (rq->cmd_case) {
	case SHARDKV__ADMIN_REQUEST__CMD_REGISTER_NODE: {
		const Shardkv__Register *reg = rq->register_node;
		uint32_t id = node_by_addr_locked(f, reg->address);
		f->registers++;
		f->last_resume = reg->resume_node_id;
		if (id == 0 && f->nnodes < FAKE_CTL_MAX_NODES) {
			snprintf(f->addrs[f->nnodes], sizeof(f->addrs[0]), "%s", reg->address);
			id = ++f->nnodes;
		}
		r.node_id = id;
		cfg = cfg_at_locked(f, latest);
		break;
	}
	case SHARDKV__ADMIN_REQUEST__CMD_WATCH: {
		const Shardkv__Watch *w = rq->watch;
		if (latest > w->known_epoch || f->npend == FAKE_CTL_MAX_WATCH) {
			*reply = watch_reply_locked(f, rq->request_id, w->known_epoch, w->history);
		} else {
			f->pend[f->npend++] = (fake_ctl_watch){.p = p,
			                                       .reqid = rq->request_id,
			                                       .known = w->known_epoch,
			                                       .history = w->history,
			                                       .since = now_ms()};
			rv = KV_RPC_DEFERRED;
		}
		goto out;
	}
	case SHARDKV__ADMIN_REQUEST__CMD_HEARTBEAT:
		f->heartbeats++;
		for (size_t i = 0; i < rq->heartbeat->n_ranges; i++)
			if (rq->heartbeat->ranges[i]->keys > f->hb_range_keys)
				f->hb_range_keys = rq->heartbeat->ranges[i]->keys;
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_MIGRATION_DONE:
		if (f->ndone < 256)
			f->done[f->ndone++] = rq->migration_done->migration_id;
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_MIGRATION_PROGRESS:
		if (rq->migration_progress->phase ==
		    SHARDKV__MIGRATION_PHASE__MIGRATION_PHASE_FENCED) {
			f->fenced_seen += f->hold_fence;
			r.status = f->hold_fence ? SHARDKV__STATUS__STATUS_BUSY : f->fence_status;
		}
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_GET_CONFIG: {
		/* The latest (or the epoch the test pinned), or the one asked for. */
		uint64_t e = rq->get_config->epoch;
		f->get_configs++;
		if (e == 0)
			e = f->getconfig_epoch != 0 && f->getconfig_epoch < latest
			        ? f->getconfig_epoch
			        : latest;
		cfg = cfg_at_locked(f, e);
		if (cfg != NULL) {
			r.epoch = e;
		} else if (e != 0) {
			r.status = SHARDKV__STATUS__STATUS_NOT_FOUND;
			r.error = "no configuration with that epoch";
		}
		break;
	}
	case SHARDKV__ADMIN_REQUEST__CMD_STATUS:
		*reply = status_reply_locked(f, &r);
		goto out;
	case SHARDKV__ADMIN_REQUEST__CMD_JOIN:
		if (node_by_addr_locked(f, rq->join->address) != 0) {
			r.status = SHARDKV__STATUS__STATUS_EXISTS;
			r.error = "address already registered";
		} else {
			r.epoch = latest + 1;
			r.node_id = f->nnodes + 1;
			r.wait_ms = rq->wait ? 1500 : 0;
		}
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_LEAVE:
	case SHARDKV__ADMIN_REQUEST__CMD_MOVE: {
		bool leave = rq->cmd_case == SHARDKV__ADMIN_REQUEST__CMD_LEAVE;
		uint32_t id = ref_node_locked(f, leave ? rq->leave->node : rq->move->node);
		if (leave)
			f->leave_from = id;
		if (id == 0) {
			r.status = SHARDKV__STATUS__STATUS_NOT_FOUND;
			r.error = "unknown node";
		} else if (leave && !f->accept_leave) {
			r.status = SHARDKV__STATUS__STATUS_INVALID;
			r.error = "leave refused";
		} else {
			r.epoch = latest + 1;
			r.n_migration_ids = 1;
			r.migration_ids = mig_ids;
		}
		break;
	}
	case SHARDKV__ADMIN_REQUEST__CMD_REBALANCE:
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_ISR_CHANGE:
		/* Recorded and answered with the latest epoch: the test publishes
		 * the change when it wants it. */
		if (rq->isr_change->add_node) {
			f->isr_adds++;
			f->isr_added = rq->isr_change->add_node;
		} else if (rq->isr_change->unfence_node) {
			/* The configurations the tests publish carry no fence. */
		} else {
			f->isr_removes++;
			f->isr_removed = rq->isr_change->remove_node;
		}
		r.epoch = latest;
		break;
	default:
		r.status = SHARDKV__STATUS__STATUS_INVALID;
		r.error = "not served by the fake controller";
		break;
	}
	*reply = pack_locked(f, &r, cfg, false, 0);
out:
	pthread_mutex_unlock(&f->mu);
	shardkv__admin_request__free_unpacked(rq, NULL);
	return rv;
}

static void *
ctl_ticker(void *arg)
{
	fake_ctl *f = arg;
	while (!atomic_load(&f->stop)) {
		kv_test_sleep_ms(50);
		pthread_mutex_lock(&f->mu);
		size_t j = 0;
		for (size_t i = 0; i < f->npend; i++) {
			fake_ctl_watch *w = &f->pend[i];
			if (now_ms() - w->since >= WATCH_HOLD_MS)
				kv_rpc_reply(w->p,
				             watch_reply_locked(f, w->reqid, w->known, w->history));
			else
				f->pend[j++] = *w;
		}
		f->npend = j;
		pthread_mutex_unlock(&f->mu);
	}
	return NULL;
}

fake_ctl *
fake_ctl_start(void)
{
	fake_ctl *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	pthread_mutex_init(&f->mu, NULL);
	kv_test_free_url(f->url, sizeof(f->url));
	kv_rpc_server_opts o = {.url = f->url, .contexts = 256, .handler = ctl_handler, .arg = f};
	assert_int_equal(kv_rpc_server_create(&o, &f->rpc), 0);
	assert_int_equal(pthread_create(&f->ticker, NULL, ctl_ticker, f), 0);
	return f;
}

void
fake_ctl_stop(fake_ctl *f)
{
	if (f == NULL)
		return;
	atomic_store(&f->stop, true);
	pthread_join(f->ticker, NULL);
	kv_rpc_server_destroy(f->rpc);
	for (size_t i = 0; i < f->ncfgs; i++)
		kv_config_free(f->cfgs[i]);
	pthread_mutex_destroy(&f->mu);
	free(f);
}

void
fake_ctl_add_node(fake_ctl *f, const char *url)
{
	pthread_mutex_lock(&f->mu);
	assert_true(f->nnodes < FAKE_CTL_MAX_NODES);
	snprintf(f->addrs[f->nnodes++], sizeof(f->addrs[0]), "%s", url);
	pthread_mutex_unlock(&f->mu);
}

fake_cfg
fake_cfg_at(fake_ctl *f, uint64_t epoch)
{
	fake_cfg b = {.c = kv_config_new()};
	assert_non_null(b.c);
	pthread_mutex_lock(&f->mu);
	b.c->epoch = epoch;
	b.c->cluster_id = strdup("test-cluster");
	b.c->nnodes = f->nnodes;
	b.c->nodes = calloc(f->nnodes, sizeof(kv_node));
	assert_true(b.c->cluster_id != NULL && b.c->nodes != NULL);
	for (uint32_t i = 0; i < f->nnodes; i++) {
		b.c->nodes[i].id = i + 1;
		b.c->nodes[i].address = strdup(f->addrs[i]);
		assert_non_null(b.c->nodes[i].address);
		b.c->nodes[i].state = KV_NODE_ACTIVE;
	}
	pthread_mutex_unlock(&f->mu);
	return b;
}

fake_cfg
fake_cfg_new(fake_ctl *f)
{
	pthread_mutex_lock(&f->mu);
	uint64_t e = latest_locked(f) + 1;
	pthread_mutex_unlock(&f->mu);
	return fake_cfg_at(f, e);
}

fake_cfg
fake_cfg_owners(fake_ctl *f, uint64_t epoch, const char *split, uint32_t lo, uint32_t hi)
{
	fake_cfg b = epoch ? fake_cfg_at(f, epoch) : fake_cfg_new(f);
	fake_cfg_range(&b, "", lo);
	if (split != NULL && lo != hi)
		fake_cfg_range(&b, split, hi);
	return b;
}

uint64_t
fake_ctl_publish_owners(fake_ctl *f, const char *split, uint32_t lo, uint32_t hi)
{
	fake_cfg b = fake_cfg_owners(f, 0, split, lo, hi);
	return fake_cfg_publish(f, &b);
}

void
fake_cfg_range(fake_cfg *b, const char *start, uint32_t node)
{
	kv_config *c = b->c;
	c->ranges = realloc(c->ranges, (c->nranges + 1) * sizeof(kv_range));
	assert_non_null(c->ranges);
	memset(&c->ranges[c->nranges], 0, sizeof(kv_range));
	assert_int_equal(kv_buf_set(&c->ranges[c->nranges].start, start, strlen(start)), KV_OK);
	c->ranges[c->nranges].node = node;
	if (c->nranges > 0)
		assert_int_equal(kv_buf_set(&c->ranges[c->nranges - 1].end, start, strlen(start)),
		                 KV_OK);
	c->nranges++;
}

void
fake_cfg_replicas(fake_cfg *b, const uint32_t *replicas, uint32_t nrep, const uint32_t *isr,
                  uint32_t nisr, uint64_t leader_epoch)
{
	kv_config *c = b->c;
	kv_range *r;

	assert_true(c->nranges > 0);
	assert_true(nrep >= 1 && nrep <= KV_MAX_REPLICAS && nisr >= 1 && nisr <= nrep);
	r = &c->ranges[c->nranges - 1];
	r->node = replicas[0];
	r->nreplicas = nrep;
	r->ninsync = nisr;
	memcpy(r->replicas, replicas, nrep * sizeof(uint32_t));
	memcpy(r->insync, isr, nisr * sizeof(uint32_t));
	r->leader_epoch = leader_epoch ? leader_epoch : c->epoch;
}

uint64_t
fake_ctl_publish_replicas(fake_ctl *f, const uint32_t *rep, uint32_t nrep, const uint32_t *isr,
                          uint32_t nisr, uint64_t le)
{
	fake_cfg b = fake_cfg_new(f);
	fake_cfg_range(&b, "", rep[0]);
	fake_cfg_replicas(&b, rep, nrep, isr, nisr, le);
	return fake_cfg_publish(f, &b);
}

void
fake_cfg_mig(fake_cfg *b, uint64_t id, const char *start, const char *end, uint32_t from,
             uint32_t to)
{
	kv_config *c = b->c;
	c->migs = realloc(c->migs, (c->nmigs + 1) * sizeof(kv_migration));
	assert_non_null(c->migs);
	kv_migration *m = &c->migs[c->nmigs++];
	memset(m, 0, sizeof(*m));
	m->id = id;
	m->epoch = c->epoch;
	assert_int_equal(kv_buf_set(&m->start, start, strlen(start)), KV_OK);
	assert_int_equal(kv_buf_set(&m->end, end, strlen(end)), KV_OK);
	m->from = from;
	m->to = to;
	m->phase = KV_MIG_PENDING;
}

uint64_t
fake_cfg_publish(fake_ctl *f, fake_cfg *b)
{
	uint64_t e = b->c->epoch;
	assert_int_equal(kv_config_validate(b->c), 0);
	pthread_mutex_lock(&f->mu);
	assert_true(f->ncfgs < FAKE_CTL_MAX_CFGS);
	if (f->ncfgs == 0)
		f->first = e;
	assert_int_equal(e, f->first + f->ncfgs);
	f->cfgs[f->ncfgs++] = b->c;
	for (size_t i = 0; i < f->npend; i++) {
		fake_ctl_watch *w = &f->pend[i];
		kv_rpc_reply(w->p, watch_reply_locked(f, w->reqid, w->known, w->history));
	}
	f->npend = 0;
	pthread_mutex_unlock(&f->mu);
	b->c = NULL;
	return e;
}

/* A condition on the fake's state, checked with mu held. */
typedef bool fake_ctl_cond(const fake_ctl *f, uint64_t arg);

/* Polls until cond(f, arg) holds; false when ms pass first. */
static bool
wait_for(fake_ctl *f, fake_ctl_cond *cond, uint64_t arg, unsigned ms)
{
	uint64_t deadline = now_ms() + ms;
	for (;;) {
		pthread_mutex_lock(&f->mu);
		bool ok = cond(f, arg);
		pthread_mutex_unlock(&f->mu);
		if (ok)
			return true;
		if (now_ms() > deadline)
			return false;
		kv_test_sleep_ms(5);
	}
}

static bool
done_locked(const fake_ctl *f, uint64_t id)
{
	for (size_t i = 0; i < f->ndone; i++)
		if (f->done[i] == id)
			return true;
	return false;
}

static bool
done_twice_locked(const fake_ctl *f, uint64_t id)
{
	unsigned n = 0;
	for (size_t i = 0; i < f->ndone; i++)
		n += f->done[i] == id;
	return n >= 2;
}

static bool
registered_after_locked(const fake_ctl *f, uint64_t after)
{
	return f->registers > after;
}

static bool
left_locked(const fake_ctl *f, uint64_t node)
{
	return f->leave_from == node;
}

static bool
fenced_locked(const fake_ctl *f, uint64_t unused)
{
	(void)unused;
	return f->fenced_seen > 0;
}

bool
fake_ctl_done(fake_ctl *f, uint64_t id)
{
	pthread_mutex_lock(&f->mu);
	bool d = done_locked(f, id);
	pthread_mutex_unlock(&f->mu);
	return d;
}

void
fake_ctl_wait_done(fake_ctl *f, uint64_t id, unsigned ms)
{
	if (!wait_for(f, done_locked, id, ms))
		fail_msg("migration %llu not done within %u ms", (unsigned long long)id, ms);
}

void
fake_ctl_wait_done_again(fake_ctl *f, uint64_t id, unsigned ms)
{
	if (!wait_for(f, done_twice_locked, id, ms))
		fail_msg("migration %llu not reported done a second time within %u ms",
		         (unsigned long long)id, ms);
}

uint32_t
fake_ctl_wait_register(fake_ctl *f, unsigned after, unsigned ms)
{
	if (!wait_for(f, registered_after_locked, after, ms))
		fail_msg("no Register within %u ms", ms);
	pthread_mutex_lock(&f->mu);
	uint32_t resume = f->last_resume;
	pthread_mutex_unlock(&f->mu);
	return resume;
}

void
fake_ctl_wait_leave(fake_ctl *f, uint32_t node, unsigned ms)
{
	if (!wait_for(f, left_locked, node, ms))
		fail_msg("no Leave of node %u within %u ms", node, ms);
}

uint64_t
fake_ctl_drain(fake_ctl *f, uint32_t node, uint32_t to, uint64_t mig_id, unsigned ms)
{
	fake_cfg b = fake_cfg_new(f);
	b.c->nodes[node - 1].state = KV_NODE_DRAINING;
	fake_cfg_range(&b, "", to);
	fake_cfg_mig(&b, mig_id, "", "", node, to);
	fake_cfg_publish(f, &b);
	fake_ctl_wait_done(f, mig_id, ms);
	b = fake_cfg_new(f);
	b.c->nodes[node - 1].state = KV_NODE_GONE;
	fake_cfg_range(&b, "", to);
	return fake_cfg_publish(f, &b);
}

void
fake_ctl_hold_fence(fake_ctl *f)
{
	pthread_mutex_lock(&f->mu);
	f->hold_fence = true;
	f->fenced_seen = 0;
	pthread_mutex_unlock(&f->mu);
}

void
fake_ctl_wait_fenced(fake_ctl *f, unsigned ms)
{
	if (!wait_for(f, fenced_locked, 0, ms))
		fail_msg("no FENCED report within %u ms", ms);
}

void
fake_ctl_release_fence(fake_ctl *f, int status)
{
	pthread_mutex_lock(&f->mu);
	f->hold_fence = false;
	f->fence_status = status;
	pthread_mutex_unlock(&f->mu);
}
