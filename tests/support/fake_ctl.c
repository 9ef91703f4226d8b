/*
 * fake_ctl.c - the fake controller of the shard server tests (fake_ctl.h).
 * One mutex (fake_ctl.mu) protects its state; the handler runs on nng's
 * threads, a ticker thread answers watches held for 300 ms.
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

static uint64_t
now_ms(void)
{
	return kv_test_now_ms();
}

/* Packs an AdminResponse with the configurations (known, latest]. Caller holds mu. */
static nng_msg *
ctl_reply_locked(fake_ctl *f, uint64_t reqid, int status, uint32_t node_id, uint64_t known,
                 bool history, bool single)
{
	Shardkv__AdminResponse r = SHARDKV__ADMIN_RESPONSE__INIT;
	Shardkv__Config *pbs[FAKE_CTL_MAX_CFGS];
	size_t n = 0;
	nng_msg *m;

	r.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	r.request_id = reqid;
	r.status = status;
	r.epoch = f->ncfgs;
	r.node_id = node_id;
	if (history)
		for (uint64_t e = known + 1; e <= f->ncfgs; e++)
			pbs[n++] = kv_codec_config_to_pb(f->cfgs[e - 1]);
	if (single && f->ncfgs > 0) {
		pbs[n++] = kv_codec_config_to_pb(f->cfgs[f->ncfgs - 1]);
		r.config = pbs[0];
	} else {
		r.n_configs = n;
		r.configs = pbs;
	}
	size_t len = shardkv__admin_response__get_packed_size(&r);
	assert_int_equal(nng_msg_alloc(&m, len), 0);
	shardkv__admin_response__pack(&r, nng_msg_body(m));
	for (size_t i = 0; i < n; i++)
		kv_codec_config_pb_free(pbs[i]);
	return m;
}

static int
ctl_handler(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p)
{
	fake_ctl *f = arg;
	Shardkv__AdminRequest *rq =
	    shardkv__admin_request__unpack(NULL, nng_msg_len(req), nng_msg_body(req));
	int rv = 0;

	if (rq == NULL)
		return KV_EPROTO;
	pthread_mutex_lock(&f->mu);
	switch (rq->cmd_case) {
	case SHARDKV__ADMIN_REQUEST__CMD_REGISTER_NODE: {
		uint32_t id = 0;
		f->registers++;
		f->last_resume = rq->register_node->resume_node_id;
		for (uint32_t i = 0; i < f->nnodes; i++)
			if (strcmp(f->addrs[i], rq->register_node->address) == 0)
				id = i + 1;
		if (id == 0 && f->nnodes < FAKE_CTL_MAX_NODES) {
			snprintf(f->addrs[f->nnodes], sizeof(f->addrs[0]), "%s",
			         rq->register_node->address);
			id = ++f->nnodes;
		}
		*reply = ctl_reply_locked(f, rq->request_id, 0, id, 0, false, true);
		break;
	}
	case SHARDKV__ADMIN_REQUEST__CMD_WATCH:
		if (f->ncfgs > rq->watch->known_epoch || f->npend == 128) {
			*reply = ctl_reply_locked(f, rq->request_id, 0, 0, rq->watch->known_epoch,
			                          true, false);
		} else {
			f->pend[f->npend++] = (fake_ctl_watch){
			    .p = p, .known = rq->watch->known_epoch, .since = now_ms()};
			rv = KV_RPC_DEFERRED;
		}
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_HEARTBEAT:
		f->heartbeats++;
		for (size_t i = 0; i < rq->heartbeat->n_ranges; i++)
			if (rq->heartbeat->ranges[i]->keys > f->hb_range_keys)
				f->hb_range_keys = rq->heartbeat->ranges[i]->keys;
		*reply = ctl_reply_locked(f, rq->request_id, 0, 0, 0, false, false);
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_MIGRATION_DONE:
		if (f->ndone < 256)
			f->done[f->ndone++] = rq->migration_done->migration_id;
		*reply = ctl_reply_locked(f, rq->request_id, 0, 0, 0, false, false);
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_MIGRATION_PROGRESS: {
		int st = 0;
		if (rq->migration_progress->phase ==
		    SHARDKV__MIGRATION_PHASE__MIGRATION_PHASE_FENCED) {
			f->fenced_seen += f->hold_fence;
			st = f->hold_fence ? SHARDKV__STATUS__STATUS_BUSY : f->fence_status;
		}
		*reply = ctl_reply_locked(f, rq->request_id, st, 0, 0, false, false);
		break;
	}
	case SHARDKV__ADMIN_REQUEST__CMD_GET_CONFIG: {
		/* single: the latest, or the one the test pinned. */
		size_t n = f->ncfgs;
		if (f->getconfig_epoch != 0 && f->getconfig_epoch < n)
			f->ncfgs = f->getconfig_epoch;
		*reply = ctl_reply_locked(f, rq->request_id, 0, 0, 0, false, true);
		f->ncfgs = n;
		break;
	}
	case SHARDKV__ADMIN_REQUEST__CMD_LEAVE:
		f->leave_from = rq->leave->node->id;
		*reply = ctl_reply_locked(f, rq->request_id,
		                          f->accept_leave ? 0 : SHARDKV__STATUS__STATUS_INVALID, 0,
		                          0, false, false);
		break;
	default:
		*reply = ctl_reply_locked(f, rq->request_id, 0, 0, 0, false, false);
		break;
	}
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
			if (now_ms() - f->pend[i].since >= 300)
				kv_rpc_reply(f->pend[i].p,
				             ctl_reply_locked(f, 0, 0, 0, f->ncfgs, true, false));
			else
				f->pend[j++] = f->pend[i];
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

/* Pre-assigns node ids to addresses (node i + 1 is addrs[i]). */
void
fake_ctl_add_node(fake_ctl *f, const char *url)
{
	pthread_mutex_lock(&f->mu);
	snprintf(f->addrs[f->nnodes++], sizeof(f->addrs[0]), "%s", url);
	pthread_mutex_unlock(&f->mu);
}

fake_cfg
fake_cfg_new(fake_ctl *f)
{
	fake_cfg b = {.c = kv_config_new()};
	assert_non_null(b.c);
	pthread_mutex_lock(&f->mu);
	b.c->epoch = f->ncfgs + 1;
	b.c->cluster_id = strdup("test-cluster");
	b.c->nnodes = f->nnodes;
	b.c->nodes = calloc(f->nnodes, sizeof(kv_node));
	for (uint32_t i = 0; i < f->nnodes; i++) {
		b.c->nodes[i].id = i + 1;
		b.c->nodes[i].address = strdup(f->addrs[i]);
		b.c->nodes[i].state = KV_NODE_ACTIVE;
	}
	pthread_mutex_unlock(&f->mu);
	return b;
}

/* Appends a range starting at start (ranges in key order; ends filled later). */
void
fake_cfg_range(fake_cfg *b, const char *start, uint32_t node)
{
	kv_config *c = b->c;
	c->ranges = realloc(c->ranges, (c->nranges + 1) * sizeof(kv_range));
	memset(&c->ranges[c->nranges], 0, sizeof(kv_range));
	kv_buf_set(&c->ranges[c->nranges].start, start, strlen(start));
	c->ranges[c->nranges].node = node;
	if (c->nranges > 0)
		kv_buf_set(&c->ranges[c->nranges - 1].end, start, strlen(start));
	c->nranges++;
}

void
fake_cfg_mig(fake_cfg *b, uint64_t id, const char *start, const char *end, uint32_t from,
             uint32_t to)
{
	kv_config *c = b->c;
	c->migs = realloc(c->migs, (c->nmigs + 1) * sizeof(kv_migration));
	kv_migration *m = &c->migs[c->nmigs++];
	memset(m, 0, sizeof(*m));
	m->id = id;
	m->epoch = c->epoch;
	kv_buf_set(&m->start, start, strlen(start));
	kv_buf_set(&m->end, end, strlen(end));
	m->from = from;
	m->to = to;
	m->phase = KV_MIG_PENDING;
}

/* Publishes the configuration and answers every held watch. Returns its epoch. */
uint64_t
fake_cfg_publish(fake_ctl *f, fake_cfg *b)
{
	uint64_t e;
	assert_int_equal(kv_config_validate(b->c), 0);
	pthread_mutex_lock(&f->mu);
	assert_int_equal(b->c->epoch, f->ncfgs + 1);
	f->cfgs[f->ncfgs++] = b->c;
	e = f->ncfgs;
	for (size_t i = 0; i < f->npend; i++)
		kv_rpc_reply(f->pend[i].p,
		             ctl_reply_locked(f, 0, 0, 0, f->pend[i].known, true, false));
	f->npend = 0;
	pthread_mutex_unlock(&f->mu);
	b->c = NULL;
	return e;
}

bool
fake_ctl_done(fake_ctl *f, uint64_t id)
{
	bool d = false;
	pthread_mutex_lock(&f->mu);
	for (size_t i = 0; i < f->ndone; i++)
		d |= f->done[i] == id;
	pthread_mutex_unlock(&f->mu);
	return d;
}

void
fake_ctl_wait_done(fake_ctl *f, uint64_t id, unsigned ms)
{
	uint64_t deadline = now_ms() + ms;
	while (!fake_ctl_done(f, id)) {
		if (now_ms() > deadline)
			fail_msg("migration %llu not done within %u ms", (unsigned long long)id,
			         ms);
		kv_test_sleep_ms(5);
	}
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
	uint64_t deadline = now_ms() + ms;
	for (;;) {
		pthread_mutex_lock(&f->mu);
		bool seen = f->fenced_seen > 0;
		pthread_mutex_unlock(&f->mu);
		if (seen)
			return;
		if (now_ms() > deadline)
			fail_msg("no FENCED report within %u ms", ms);
		kv_test_sleep_ms(5);
	}
}

void
fake_ctl_release_fence(fake_ctl *f, int status)
{
	pthread_mutex_lock(&f->mu);
	f->hold_fence = false;
	f->fence_status = status;
	pthread_mutex_unlock(&f->mu);
}
