/*
 * test_client_fake.c - libshardkv and the CLI against an in-process fake
 * cluster: a fake controller (get_config, watch, status, join) and two fake
 * shard servers (get, put, del, append, mget, mput, scan with ownership
 * checks, OwnerHints and exactly-once memory), all on free loopback ports.
 *
 * The fakes implement just enough of doc/protocol.md to test the client's
 * side of it: routing with the cached configuration, following
 * WRONG_OWNER hints to a newer owner, reusing a write's request id when a
 * reply is lost, splitting mget/mput per node and sending the parts
 * concurrently, merging scans across servers, and learning new epochs from
 * the watch.
 */
#include "client/cli/cli.h"
#include "client/client_int.h"
#include "common/err.h"
#include "common/rpc.h"
#include "proto/codec.h"
#include "proto/shardkv.pb-c.h"
#include "proto/wire.h"
#include "tests/testutil.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#define ARGC(a)  ((int)(sizeof(a) / sizeof((a)[0])))
#define NSERVERS 2

typedef struct cluster cluster;

/* One stored pair of a fake server. */
typedef struct {
	kv_buf key; /* the key */
	kv_buf val; /* the value */
} pair;

/* A remembered write (exactly-once). */
typedef struct {
	uint64_t client_id;  /* Request.client_id */
	uint64_t request_id; /* Op.request_id */
} seen_write;

/* A fake shard server. */
typedef struct {
	cluster *cl;            /* the cluster it belongs to */
	uint32_t id;            /* node id */
	char url[64];           /* listen URL */
	kv_rpc_server *rpc;     /* the listener */
	pthread_mutex_t mu;     /* protects everything below */
	pair *kv;               /* the data */
	size_t nkv;             /* entries */
	seen_write seen[256];   /* writes applied, by id */
	size_t nseen;           /* entries */
	int requests;           /* requests answered */
	int wrong_owner;        /* WRONG_OWNER answers */
	int mput_ops;           /* MPutOp received */
	int mget_ops;           /* MGetOp received */
	int applied_lossy;      /* puts of key "lossy" applied */
	int received_lossy;     /* puts of key "lossy" received */
	uint64_t lossy_ids[8];  /* their Op.request_ids */
	bool drop_lossy;        /* drop the reply of the first "lossy" put */
	unsigned mput_delay_ms; /* sleep in mput (concurrency check) */
	int mput_fail;          /* wire status to answer mput with; 0: none */
} fake_server;

struct cluster {
	pthread_mutex_t mu;   /* protects everything down to the blank line */
	kv_config *truth;     /* what the servers serve */
	kv_config *published; /* what the controller hands out */
	pthread_cond_t cv;    /* signalled on publish */
	int watching;         /* watches waiting on cv */
	int get_config_calls; /* AdminGetConfig received */

	char ctl_url[64];          /* controller URL */
	kv_rpc_server *ctl;        /* controller listener */
	fake_server srv[NSERVERS]; /* the servers */
};

static cluster *g; /* the cluster of the running test (set up per test) */

/* ---------------------------------------------------------------------------
 * Configurations
 * ------------------------------------------------------------------------- */

static void
bset(kv_buf *b, const char *s)
{
	assert_int_equal(kv_buf_set(b, s, strlen(s)), KV_OK);
}

/* A config of the cluster's servers with ranges split at `split` (NULL: one
 * range) owned by owners[]. */
static kv_config *
make_cfg(uint64_t epoch, const char *split, uint32_t owner_lo, uint32_t owner_hi)
{
	kv_config *c = kv_config_new();
	assert_non_null(c);
	c->epoch = epoch;
	c->nnodes = NSERVERS;
	c->nodes = calloc(NSERVERS, sizeof(kv_node));
	for (uint32_t i = 0; i < NSERVERS; i++) {
		c->nodes[i].id = i + 1;
		c->nodes[i].address = strdup(g->srv[i].url);
		c->nodes[i].state = KV_NODE_ACTIVE;
	}
	if (split == NULL || owner_lo == owner_hi) {
		c->nranges = 1;
		c->ranges = calloc(1, sizeof(kv_range));
		c->ranges[0].node = owner_lo;
	} else {
		c->nranges = 2;
		c->ranges = calloc(2, sizeof(kv_range));
		bset(&c->ranges[0].end, split);
		c->ranges[0].node = owner_lo;
		bset(&c->ranges[1].start, split);
		c->ranges[1].node = owner_hi;
	}
	assert_int_equal(kv_config_validate(c), KV_OK);
	return c;
}

/* Packs an AdminResponse into a reply message. */
static nng_msg *
pack_admin(Shardkv__AdminResponse *r)
{
	nng_msg *m;
	size_t n = protobuf_c_message_get_packed_size(&r->base);
	assert_int_equal(nng_msg_alloc(&m, n), 0);
	protobuf_c_message_pack(&r->base, nng_msg_body(m));
	return m;
}

/* Builds the reply to a watch or get_config with cfg. Call with cl->mu held. */
static nng_msg *
config_reply(const kv_config *cfg, uint64_t request_id)
{
	Shardkv__AdminResponse r = SHARDKV__ADMIN_RESPONSE__INIT;
	Shardkv__Config *pb = kv_codec_config_to_pb(cfg);
	nng_msg *m;

	r.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	r.request_id = request_id;
	r.epoch = cfg->epoch;
	r.config = pb;
	m = pack_admin(&r);
	kv_codec_config_pb_free(pb);
	return m;
}

/* Publishes cfg (taken) as the controller's latest and answers the watches. */
static void
publish(kv_config *cfg)
{
	pthread_mutex_lock(&g->mu);
	kv_config_free(g->published);
	g->published = cfg;
	pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/* Sets what the servers serve (cfg taken). */
static void
set_truth(kv_config *cfg)
{
	pthread_mutex_lock(&g->mu);
	kv_config_free(g->truth);
	g->truth = cfg;
	pthread_mutex_unlock(&g->mu);
}

/* ---------------------------------------------------------------------------
 * Fake controller
 * ------------------------------------------------------------------------- */

static int
ctl_handler(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p)
{
	(void)p;
	cluster *cl = arg;
	Shardkv__AdminRequest *q =
	    shardkv__admin_request__unpack(NULL, nng_msg_len(req), nng_msg_body(req));
	Shardkv__AdminResponse r = SHARDKV__ADMIN_RESPONSE__INIT;
	if (q == NULL)
		return KV_EPROTO;
	r.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	r.request_id = q->request_id;
	pthread_mutex_lock(&cl->mu);
	switch (q->cmd_case) {
	case SHARDKV__ADMIN_REQUEST__CMD_GET_CONFIG:
		cl->get_config_calls++;
		if (q->get_config->epoch && q->get_config->epoch != cl->published->epoch) {
			r.status = SHARDKV__STATUS__STATUS_NOT_FOUND;
			r.error = "no configuration with that epoch";
			*reply = pack_admin(&r);
		} else {
			*reply = config_reply(cl->published, q->request_id);
		}
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_WATCH: {
		/* A short long poll held on this thread, not deferred: answering a
		 * deferred request from another thread races in common/rpc.c (see
		 * the report of this change). */
		uint64_t t0 = kv_test_now_ms();
		while (q->watch->known_epoch >= cl->published->epoch &&
		       kv_test_now_ms() - t0 < 100) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 10 * 1000000L;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			cl->watching++;
			pthread_cond_timedwait(&cl->cv, &cl->mu, &ts);
			cl->watching--;
		}
		if (q->watch->known_epoch < cl->published->epoch) {
			*reply = config_reply(cl->published, q->request_id);
		} else {
			r.epoch = cl->published->epoch;
			*reply = pack_admin(&r);
		}
		break;
	}
	case SHARDKV__ADMIN_REQUEST__CMD_STATUS: {
		Shardkv__StatusReport rep = SHARDKV__STATUS_REPORT__INIT;
		Shardkv__NodeStats ns[NSERVERS], *nsp[NSERVERS];
		Shardkv__ControllerReplica cr = SHARDKV__CONTROLLER_REPLICA__INIT, *crp = &cr;
		for (int i = 0; i < NSERVERS; i++) {
			shardkv__node_stats__init(&ns[i]);
			ns[i].node_id = (uint32_t)i + 1;
			ns[i].keys = 10u * ((uint64_t)i + 1);
			ns[i].bytes = 100u * ((uint64_t)i + 1);
			ns[i].ops_per_sec = 1.5;
			nsp[i] = &ns[i];
		}
		cr.id = 1;
		cr.address = cl->ctl_url;
		cr.role = SHARDKV__REPLICA_ROLE__REPLICA_ROLE_STANDALONE;
		rep.n_nodes = NSERVERS;
		rep.nodes = nsp;
		rep.n_controllers = 1;
		rep.controllers = &crp;
		r.report = &rep;
		r.config = kv_codec_config_to_pb(cl->published);
		r.epoch = cl->published->epoch;
		*reply = pack_admin(&r);
		kv_codec_config_pb_free(r.config);
		break;
	}
	case SHARDKV__ADMIN_REQUEST__CMD_JOIN:
		if (strcmp(q->join->address, cl->srv[0].url) == 0) {
			r.status = SHARDKV__STATUS__STATUS_EXISTS;
			r.error = "address already registered";
		} else {
			r.epoch = cl->published->epoch + 1;
			r.node_id = 3;
			r.wait_ms = q->wait ? 1500 : 0;
		}
		*reply = pack_admin(&r);
		break;
	case SHARDKV__ADMIN_REQUEST__CMD_LEAVE:
	case SHARDKV__ADMIN_REQUEST__CMD_MOVE: {
		Shardkv__NodeRef *ref = q->cmd_case == SHARDKV__ADMIN_REQUEST__CMD_LEAVE
		                            ? q->leave->node
		                            : q->move->node;
		uint64_t ids[1] = {42};
		if (ref == NULL || ref->ref_case != SHARDKV__NODE_REF__REF_ID ||
		    ref->id > NSERVERS) {
			r.status = SHARDKV__STATUS__STATUS_NOT_FOUND;
			r.error = "unknown node";
		} else {
			r.epoch = cl->published->epoch + 1;
			r.n_migration_ids = 1;
			r.migration_ids = ids;
		}
		*reply = pack_admin(&r);
		break;
	}
	case SHARDKV__ADMIN_REQUEST__CMD_REBALANCE:
		r.epoch = cl->published->epoch;
		*reply = pack_admin(&r);
		break;
	default:
		r.status = SHARDKV__STATUS__STATUS_INVALID;
		*reply = pack_admin(&r);
		break;
	}
	pthread_mutex_unlock(&cl->mu);
	shardkv__admin_request__free_unpacked(q, NULL);
	return 0;
}

/* ---------------------------------------------------------------------------
 * Fake shard server
 * ------------------------------------------------------------------------- */

static pair *
find(fake_server *s, ProtobufCBinaryData k)
{
	for (size_t i = 0; i < s->nkv; i++)
		if (kv_key_cmp(s->kv[i].key.data, s->kv[i].key.len, k.data, k.len) == 0)
			return &s->kv[i];
	return NULL;
}

static void
store_put(fake_server *s, ProtobufCBinaryData k, ProtobufCBinaryData v)
{
	pair *p = find(s, k);
	if (p == NULL) {
		s->kv = realloc(s->kv, (s->nkv + 1) * sizeof(pair));
		p = &s->kv[s->nkv++];
		memset(p, 0, sizeof(*p));
		assert_int_equal(kv_buf_set(&p->key, k.data, k.len), KV_OK);
	}
	assert_int_equal(kv_buf_set(&p->val, v.data, v.len), KV_OK);
}

static int
pair_cmp(const void *a, const void *b)
{
	const pair *x = a, *y = b;
	return kv_key_cmp(x->key.data, x->key.len, y->key.data, y->key.len);
}

/* Whether this server serves key under the truth. Call with cl->mu held. */
static bool
serves(fake_server *s, const void *k, size_t n)
{
	return kv_config_route(s->cl->truth, k, n) == s->id;
}

/* Fills a WRONG_OWNER result for key. Call with cl->mu held. */
static void
wrong_owner(fake_server *s, Shardkv__OpResult *res, Shardkv__OwnerHint *h, const void *k, size_t n)
{
	const kv_config *t = s->cl->truth;
	long ri = kv_config_find_range(t, k, n);
	const kv_node *node = kv_config_node(t, t->ranges[ri].node);

	res->status = SHARDKV__STATUS__STATUS_WRONG_OWNER;
	h->epoch = t->epoch;
	h->node_id = node->id;
	h->address = node->address;
	h->start.data = t->ranges[ri].start.data;
	h->start.len = t->ranges[ri].start.len;
	h->end.data = t->ranges[ri].end.data;
	h->end.len = t->ranges[ri].end.len;
	res->owner = h;
	s->wrong_owner++;
}

/* Returns whether (client, id) was applied before; remembers it if not. */
static bool
seen_before(fake_server *s, uint64_t client, uint64_t id)
{
	if (client == 0 || id == 0)
		return false;
	for (size_t i = 0; i < s->nseen; i++)
		if (s->seen[i].client_id == client && s->seen[i].request_id == id)
			return true;
	if (s->nseen < 256)
		s->seen[s->nseen++] = (seen_write){client, id};
	return false;
}

static int
srv_handler(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p)
{
	fake_server *s = arg;
	cluster *cl = s->cl;
	Shardkv__Request *q = shardkv__request__unpack(NULL, nng_msg_len(req), nng_msg_body(req));
	Shardkv__Response r = SHARDKV__RESPONSE__INIT;
	Shardkv__OpResult res = SHARDKV__OP_RESULT__INIT, *resp = &res;
	Shardkv__OwnerHint hint = SHARDKV__OWNER_HINT__INIT;
	Shardkv__KeyValue *kvs = NULL, **kvp = NULL;
	ProtobufCBinaryData *vals = NULL;
	uint32_t *missing = NULL;
	uint8_t *app = NULL;
	bool drop = false;
	unsigned delay = 0;
	nng_msg *m;

	(void)p;
	if (q == NULL)
		return KV_EPROTO;
	assert_int_equal(q->n_ops, 1);
	assert_int_equal(q->version, SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1);
	assert_true(q->client_id != 0);
	assert_true(q->request_id != 0);
	Shardkv__Op *op = q->ops[0];
	pthread_mutex_lock(&cl->mu);
	pthread_mutex_lock(&s->mu);
	s->requests++;
	r.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	r.request_id = q->request_id;
	r.epoch = cl->truth->epoch;
	r.node_id = s->id;
	r.n_results = 1;
	r.results = &resp;
	switch (op->op_case) {
	case SHARDKV__OP__OP_GET: {
		ProtobufCBinaryData k = op->get->key;
		pair *e;
		if (!serves(s, k.data, k.len)) {
			wrong_owner(s, &res, &hint, k.data, k.len);
		} else if ((e = find(s, k)) == NULL) {
			res.status = SHARDKV__STATUS__STATUS_NOT_FOUND;
		} else {
			res.value.data = e->val.data;
			res.value.len = e->val.len;
		}
		break;
	}
	case SHARDKV__OP__OP_PUT: {
		ProtobufCBinaryData k = op->put->key;
		bool lossy = k.len == 5 && memcmp(k.data, "lossy", 5) == 0;
		assert_true(op->request_id != 0);
		if (!serves(s, k.data, k.len)) {
			wrong_owner(s, &res, &hint, k.data, k.len);
			break;
		}
		if (lossy && s->received_lossy < 8)
			s->lossy_ids[s->received_lossy++] = op->request_id;
		if (!seen_before(s, q->client_id, op->request_id)) {
			store_put(s, k, op->put->value);
			if (lossy)
				s->applied_lossy++;
		}
		if (lossy && s->drop_lossy) {
			s->drop_lossy = false;
			drop = true;
		}
		break;
	}
	case SHARDKV__OP__OP_DEL: {
		ProtobufCBinaryData k = op->del->key;
		pair *e;
		if (!serves(s, k.data, k.len)) {
			wrong_owner(s, &res, &hint, k.data, k.len);
		} else if ((e = find(s, k)) == NULL) {
			res.status = SHARDKV__STATUS__STATUS_NOT_FOUND;
		} else {
			/* Hand the buffers to the reply; the slot is refilled from the end. */
			app = e->val.data;
			res.value.data = app;
			res.value.len = e->val.len;
			kv_buf_fini(&e->key);
			*e = s->kv[--s->nkv];
		}
		break;
	}
	case SHARDKV__OP__OP_APPEND: {
		ProtobufCBinaryData k = op->append->key, v = op->append->value;
		pair *e;
		if (!serves(s, k.data, k.len)) {
			wrong_owner(s, &res, &hint, k.data, k.len);
			break;
		}
		if (!seen_before(s, q->client_id, op->request_id)) {
			if ((e = find(s, k)) == NULL) {
				store_put(s, k, v);
			} else {
				assert_int_equal(kv_buf_append(&e->val, v.data, v.len), KV_OK);
			}
		}
		res.value_len = find(s, k)->val.len;
		break;
	}
	case SHARDKV__OP__OP_MGET: {
		Shardkv__MGetOp *mg = op->mget;
		s->mget_ops++;
		vals = calloc(mg->n_keys, sizeof(*vals));
		missing = calloc(mg->n_keys, sizeof(*missing));
		for (size_t i = 0; i < mg->n_keys; i++) {
			if (!serves(s, mg->keys[i].data, mg->keys[i].len)) {
				wrong_owner(s, &res, &hint, mg->keys[i].data, mg->keys[i].len);
				break;
			}
		}
		if (res.status != 0)
			break;
		for (size_t i = 0; i < mg->n_keys; i++) {
			pair *e = find(s, mg->keys[i]);
			if (e == NULL) {
				missing[res.n_missing++] = (uint32_t)i;
				continue;
			}
			vals[i].data = e->val.data;
			vals[i].len = e->val.len;
		}
		res.n_values = mg->n_keys;
		res.values = vals;
		res.missing = missing;
		if (res.n_missing)
			res.status = SHARDKV__STATUS__STATUS_NOT_FOUND;
		break;
	}
	case SHARDKV__OP__OP_MPUT: {
		Shardkv__MPutOp *mp = op->mput;
		s->mput_ops++;
		delay = s->mput_delay_ms;
		if (s->mput_fail) {
			res.status = (Shardkv__Status)s->mput_fail;
			res.error = "injected failure";
			break;
		}
		for (size_t i = 0; i < mp->n_keys; i++) {
			if (!serves(s, mp->keys[i].data, mp->keys[i].len)) {
				wrong_owner(s, &res, &hint, mp->keys[i].data, mp->keys[i].len);
				break;
			}
		}
		if (res.status != 0 || seen_before(s, q->client_id, op->request_id))
			break;
		for (size_t i = 0; i < mp->n_keys; i++)
			store_put(s, mp->keys[i], mp->values[i]);
		break;
	}
	case SHARDKV__OP__OP_SCAN: {
		Shardkv__ScanOp *sc = op->scan;
		ProtobufCBinaryData st = sc->cursor.len ? sc->cursor : sc->start;
		const kv_config *t = cl->truth;
		if (!serves(s, st.data, st.len)) {
			wrong_owner(s, &res, &hint, st.data, st.len);
			break;
		}
		/* Clip to the requested end and to this server's range. */
		long ri = kv_config_find_range(t, st.data, st.len);
		const kv_buf *rend = &t->ranges[ri].end;
		qsort(s->kv, s->nkv, sizeof(pair), pair_cmp);
		kvs = calloc(s->nkv + 1, sizeof(*kvs));
		kvp = calloc(s->nkv + 1, sizeof(*kvp));
		size_t limit = sc->limit ? sc->limit : 3; /* small pages: exercise paging */
		for (size_t i = 0; i < s->nkv; i++) {
			const pair *e = &s->kv[i];
			if (!kv_range_contains(st.data, st.len, sc->end.data, sc->end.len,
			                       e->key.data, e->key.len) ||
			    !kv_range_contains(st.data, st.len, rend->data, rend->len, e->key.data,
			                       e->key.len))
				continue;
			if (sc->prefix.len &&
			    (e->key.len < sc->prefix.len ||
			     memcmp(e->key.data, sc->prefix.data, sc->prefix.len)))
				continue;
			if (res.n_entries == limit) {
				res.more = true;
				res.next_cursor.data = e->key.data;
				res.next_cursor.len = e->key.len;
				break;
			}
			shardkv__key_value__init(&kvs[res.n_entries]);
			kvs[res.n_entries].key.data = e->key.data;
			kvs[res.n_entries].key.len = e->key.len;
			if (!sc->keys_only) {
				kvs[res.n_entries].value.data = e->val.data;
				kvs[res.n_entries].value.len = e->val.len;
			}
			kvp[res.n_entries] = &kvs[res.n_entries];
			res.n_entries++;
		}
		res.entries = kvp;
		/* Stopped at the end of its own range before the requested end. */
		if (!res.more && rend->len &&
		    (sc->end.len == 0 ||
		     kv_key_cmp(rend->data, rend->len, sc->end.data, sc->end.len) < 0)) {
			res.more = true;
			res.next_cursor.data = rend->data;
			res.next_cursor.len = rend->len;
		}
		break;
	}
	default:
		res.status = SHARDKV__STATUS__STATUS_INVALID;
		break;
	}
	size_t n = protobuf_c_message_get_packed_size(&r.base);
	assert_int_equal(nng_msg_alloc(&m, n), 0);
	protobuf_c_message_pack(&r.base, nng_msg_body(m));
	pthread_mutex_unlock(&s->mu);
	pthread_mutex_unlock(&cl->mu);
	free(kvs);
	free(kvp);
	free(vals);
	free(missing);
	free(app);
	shardkv__request__free_unpacked(q, NULL);
	if (delay)
		kv_test_sleep_ms(delay);
	if (drop) {
		nng_msg_free(m);
		return KV_EIO; /* the reply is lost; the client must retry */
	}
	*reply = m;
	return 0;
}

/* ---------------------------------------------------------------------------
 * Fixture
 * ------------------------------------------------------------------------- */

static int
setup(void **state)
{
	(void)state;
	g = calloc(1, sizeof(*g));
	pthread_mutex_init(&g->mu, NULL);
	pthread_cond_init(&g->cv, NULL);
	for (int i = 0; i < NSERVERS; i++) {
		fake_server *s = &g->srv[i];
		kv_rpc_server_opts o = {.handler = srv_handler, .arg = s, .contexts = 16};
		s->cl = g;
		s->id = (uint32_t)i + 1;
		pthread_mutex_init(&s->mu, NULL);
		kv_test_free_url(s->url, sizeof(s->url));
		o.url = s->url;
		if (kv_rpc_server_create(&o, &s->rpc) != KV_OK)
			return -1;
	}
	/* Node 1 owns [, "m"), node 2 owns ["m", ). */
	g->truth = make_cfg(5, "m", 1, 2);
	g->published = make_cfg(5, "m", 1, 2);
	kv_test_free_url(g->ctl_url, sizeof(g->ctl_url));
	kv_rpc_server_opts o = {.url = g->ctl_url, .handler = ctl_handler, .arg = g};
	return kv_rpc_server_create(&o, &g->ctl) == KV_OK ? 0 : -1;
}

static int
teardown(void **state)
{
	(void)state;
	kv_rpc_server_destroy(g->ctl);
	for (int i = 0; i < NSERVERS; i++) {
		fake_server *s = &g->srv[i];
		kv_rpc_server_destroy(s->rpc);
		for (size_t j = 0; j < s->nkv; j++) {
			kv_buf_fini(&s->kv[j].key);
			kv_buf_fini(&s->kv[j].val);
		}
		free(s->kv);
		pthread_mutex_destroy(&s->mu);
	}
	kv_config_free(g->truth);
	kv_config_free(g->published);
	pthread_cond_destroy(&g->cv);
	pthread_mutex_destroy(&g->mu);
	free(g);
	g = NULL;
	return 0;
}

static shardkv_client *
open_client(uint32_t timeout_ms, bool watch)
{
	shardkv_options o = {.timeout_ms = timeout_ms, .no_watch = !watch};
	shardkv_client *c;
	char list[160];
	/* A dead controller first: the client must go on to the next one. */
	char dead[64];
	kv_test_free_url(dead, sizeof(dead));
	snprintf(list, sizeof(list), "%s,%s", dead, g->ctl_url);
	assert_int_equal(shardkv_open(list, &o, &c), 0);
	return c;
}

static size_t
server_keys(int i)
{
	pthread_mutex_lock(&g->srv[i].mu);
	size_t n = g->srv[i].nkv;
	pthread_mutex_unlock(&g->srv[i].mu);
	return n;
}

/* ---------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------- */

static void
single_key_ops_are_routed_to_the_owner(void **state)
{
	shardkv_client *c = open_client(3000, false);
	shardkv_buf v;
	uint64_t len;
	(void)state;

	assert_int_equal(shardkv_put(c, "apple", 5, "red", 3), 0);
	assert_int_equal(shardkv_put(c, "zebra", 5, "striped", 7), 0);
	assert_int_equal(server_keys(0), 1);
	assert_int_equal(server_keys(1), 1);
	assert_int_equal(shardkv_get(c, "zebra", 5, &v), 0);
	assert_int_equal(v.len, 7);
	assert_string_equal((char *)v.data, "striped");
	shardkv_free(v.data);
	assert_int_equal(shardkv_append(c, "apple", 5, "!", 1, &len), 0);
	assert_int_equal(len, 4);
	assert_int_equal(shardkv_append(c, "new", 3, "x", 1, &len), 0);
	assert_int_equal(len, 1);
	assert_int_equal(shardkv_del(c, "apple", 5, &v), 0);
	assert_string_equal((char *)v.data, "red!");
	shardkv_free(v.data);
	assert_int_equal(shardkv_del(c, "apple", 5, NULL), SHARDKV_ENOTFOUND);
	assert_int_equal(shardkv_get(c, "apple", 5, &v), SHARDKV_ENOTFOUND);
	/* Empty values are values. */
	assert_int_equal(shardkv_put(c, "empty", 5, "", 0), 0);
	assert_int_equal(shardkv_get(c, "empty", 5, &v), 0);
	assert_int_equal(v.len, 0);
	assert_non_null(v.data);
	shardkv_free(v.data);
	shardkv_close(c);
}

static void
client_retries_after_wrong_owner_with_new_epoch(void **state)
{
	shardkv_client *c = open_client(3000, false);
	shardkv_buf v;
	(void)state;

	assert_int_equal(shardkv_put(c, "apple", 5, "one", 3), 0); /* caches epoch 5 */
	/* Node 2 now serves everything; the controller has not published it. */
	set_truth(make_cfg(6, NULL, 2, 2));
	assert_int_equal(shardkv_put(c, "banana", 6, "two", 3), 0);
	assert_true(g->srv[0].wrong_owner >= 1);
	assert_int_equal(server_keys(1), 1); /* banana went to node 2 via the hint */
	assert_int_equal(shardkv_get(c, "banana", 6, &v), 0);
	assert_string_equal((char *)v.data, "two");
	shardkv_free(v.data);
	/* The hint's epoch was newer: the client asked the controller again. */
	assert_true(g->get_config_calls >= 2);
	/* The hint is remembered: other keys of its range go to node 2 directly. */
	int wrong = g->srv[0].wrong_owner;
	assert_int_equal(shardkv_put(c, "cherry", 6, "three", 5), 0);
	assert_int_equal(g->srv[0].wrong_owner, wrong);
	assert_int_equal(server_keys(1), 2);
	/* Until the controller publishes a newer configuration, which replaces it. */
	publish(make_cfg(6, NULL, 2, 2));
	assert_int_equal(shardkv_put(c, "date", 4, "four", 4), 0);
	assert_int_equal(g->srv[0].wrong_owner, wrong);
	shardkv_close(c);
}

static void
lost_reply_is_retried_with_the_same_request_id(void **state)
{
	shardkv_client *c = open_client(2500, false);
	shardkv_buf v;
	(void)state;

	g->srv[0].drop_lossy = true;
	assert_int_equal(shardkv_put(c, "lossy", 5, "once", 4), 0);
	assert_int_equal(g->srv[0].received_lossy, 2);
	assert_int_equal(g->srv[0].lossy_ids[0], g->srv[0].lossy_ids[1]);
	assert_int_equal(g->srv[0].applied_lossy, 1);
	/* A new put is a new write: a new id. */
	assert_int_equal(shardkv_put(c, "lossy", 5, "twice", 5), 0);
	assert_int_equal(g->srv[0].received_lossy, 3);
	assert_true(g->srv[0].lossy_ids[2] != g->srv[0].lossy_ids[0]);
	assert_int_equal(g->srv[0].applied_lossy, 2);
	assert_int_equal(shardkv_get(c, "lossy", 5, &v), 0);
	assert_string_equal((char *)v.data, "twice");
	shardkv_free(v.data);
	shardkv_close(c);
}

static void
mput_and_mget_split_per_node_concurrently_in_key_order(void **state)
{
	shardkv_client *c = open_client(3000, false);
	shardkv_bytes keys[] = {{"zz", 2}, {"aa", 2}, {"mm", 2}, {"bb", 2}};
	shardkv_bytes vals[] = {{"4", 1}, {"1", 1}, {"3", 1}, {"2", 1}};
	shardkv_mput_result *mr = NULL;
	shardkv_mget_result *gr = NULL;
	(void)state;

	assert_int_equal(shardkv_put(c, "warm", 4, "up", 2), 0); /* config cached */
	g->srv[0].mput_delay_ms = 300;
	g->srv[1].mput_delay_ms = 300;
	uint64_t t0 = kv_test_now_ms();
	assert_int_equal(shardkv_mput(c, 4, keys, 4, vals, &mr), 0);
	uint64_t took = kv_test_now_ms() - t0;
	assert_non_null(mr);
	assert_int_equal(mr->nfailed, 0);
	shardkv_mput_result_free(mr);
	/* One MPutOp per node, and both ran at once. */
	assert_int_equal(g->srv[0].mput_ops, 1);
	assert_int_equal(g->srv[1].mput_ops, 1);
	assert_true(took < 550);
	assert_int_equal(server_keys(0), 2);
	assert_int_equal(server_keys(1), 3);

	assert_int_equal(shardkv_mget(c, 4, keys, &gr), 0);
	assert_int_equal(gr->n, 4);
	assert_int_equal(gr->nmissing, 0);
	for (size_t i = 0; i < 4; i++) {
		assert_int_equal(gr->values[i].len, 1);
		assert_memory_equal(gr->values[i].data, vals[i].data, 1);
	}
	shardkv_mget_result_free(gr);
	assert_int_equal(g->srv[0].mget_ops, 1);
	assert_int_equal(g->srv[1].mget_ops, 1);

	/* Missing keys are named by index, in key order; the others are there. */
	shardkv_bytes some[] = {{"zz", 2}, {"nope", 4}, {"aa", 2}, {"none", 4}};
	assert_int_equal(shardkv_mget(c, 4, some, &gr), SHARDKV_ENOTFOUND);
	assert_non_null(gr);
	assert_int_equal(gr->nmissing, 2);
	assert_int_equal(gr->missing[0], 1);
	assert_int_equal(gr->missing[1], 3);
	assert_null(gr->values[1].data);
	assert_memory_equal(gr->values[2].data, "1", 1);
	shardkv_mget_result_free(gr);
	shardkv_close(c);
}

static void
mput_reports_the_node_that_failed(void **state)
{
	shardkv_client *c = open_client(2000, false);
	shardkv_bytes keys[] = {{"aa", 2}, {"zz", 2}, {"zy", 2}};
	shardkv_bytes vals[] = {{"1", 1}, {"2", 1}, {"3", 1}};
	shardkv_mput_result *mr = NULL;
	(void)state;

	g->srv[1].mput_fail = SHARDKV__STATUS__STATUS_NO_SPACE;
	assert_int_equal(shardkv_mput(c, 3, keys, 3, vals, &mr), SHARDKV_ENOSPC);
	assert_non_null(mr);
	assert_int_equal(mr->nfailed, 1);
	assert_int_equal(mr->failed[0].node_id, 2);
	assert_int_equal(mr->failed[0].err, SHARDKV_ENOSPC);
	assert_int_equal(mr->failed[0].nkeys, 2);
	assert_string_equal(mr->failed[0].address, g->srv[1].url);
	shardkv_mput_result_free(mr);
	assert_int_equal(server_keys(0), 1); /* node 1's part was written */
	assert_int_equal(server_keys(1), 0);
	shardkv_close(c);
}

static void
scan_merges_servers_in_key_order_and_resumes(void **state)
{
	shardkv_client *c = open_client(3000, false);
	const char *k[] = {"k1", "k2", "k3", "k4", "k5", "n1", "n2", "x", "y"};
	shardkv_scan_result *r;
	(void)state;

	for (size_t i = 0; i < 9; i++)
		assert_int_equal(shardkv_put(c, k[i], strlen(k[i]), k[i], strlen(k[i])), 0);
	/* Everything, across both nodes and several pages of 3. */
	assert_int_equal(shardkv_scan(c, "", 0, "", 0, 0, &r), 0);
	assert_int_equal(r->n, 9);
	assert_false(r->more);
	for (size_t i = 0; i < 9; i++) {
		assert_string_equal((char *)r->entries[i].key.data, k[i]);
		assert_string_equal((char *)r->entries[i].value.data, k[i]);
	}
	shardkv_scan_result_free(r);
	/* A limited page that crosses the node boundary, then its resumption. */
	assert_int_equal(shardkv_scan(c, "k3", 2, "y", 1, 4, &r), 0);
	assert_int_equal(r->n, 4);
	assert_true(r->more);
	assert_string_equal((char *)r->entries[3].key.data, "n1");
	shardkv_buf next = r->next;
	r->next.data = NULL;
	shardkv_scan_result_free(r);
	assert_int_equal(shardkv_scan(c, next.data, next.len, "y", 1, 4, &r), 0);
	shardkv_free(next.data);
	assert_int_equal(r->n, 2);
	assert_string_equal((char *)r->entries[0].key.data, "n2");
	assert_string_equal((char *)r->entries[1].key.data, "x");
	assert_false(r->more);
	shardkv_scan_result_free(r);
	/* keys with a prefix. */
	assert_int_equal(shardkv_keys(c, "n", 1, &r), 0);
	assert_int_equal(r->n, 2);
	assert_string_equal((char *)r->entries[1].key.data, "n2");
	assert_int_equal(r->entries[1].value.len, 0);
	shardkv_scan_result_free(r);
	assert_int_equal(shardkv_scan(c, "b", 1, "a", 1, 0, &r), SHARDKV_EINVAL);
	shardkv_close(c);
}

/* The epoch the handle has cached. */
static uint64_t
cached_epoch(shardkv_client *c)
{
	uint64_t e = 0;
	pthread_mutex_lock(&c->cfg_mu);
	if (c->cfg)
		e = c->cfg->cfg->epoch;
	pthread_mutex_unlock(&c->cfg_mu);
	return e;
}

static void
watch_learns_a_new_epoch_within_milliseconds(void **state)
{
	shardkv_client *c = open_client(3000, true);
	(void)state;

	assert_int_equal(shardkv_put(c, "a", 1, "1", 1), 0);
	assert_int_equal(cached_epoch(c), 5);
	/* Wait until the watch is parked at the controller, then publish. */
	for (uint64_t t0 = kv_test_now_ms(); kv_test_now_ms() - t0 < 3000;) {
		pthread_mutex_lock(&g->mu);
		int n = g->watching;
		pthread_mutex_unlock(&g->mu);
		if (n > 0)
			break;
		kv_test_sleep_ms(2);
	}
	int calls = g->get_config_calls;
	set_truth(make_cfg(6, "q", 1, 2));
	publish(make_cfg(6, "q", 1, 2));
	uint64_t t0 = kv_test_now_ms();
	while (cached_epoch(c) < 6 && kv_test_now_ms() - t0 < 2000)
		kv_test_sleep_ms(1);
	assert_int_equal(cached_epoch(c), 6);
	assert_true(kv_test_now_ms() - t0 < 200);
	assert_int_equal(g->get_config_calls, calls); /* learnt by the watch alone */
	/* "n" now belongs to node 1 and goes there directly. */
	int wrong = g->srv[1].wrong_owner + g->srv[0].wrong_owner;
	assert_int_equal(shardkv_put(c, "n", 1, "1", 1), 0);
	assert_int_equal(g->srv[1].wrong_owner + g->srv[0].wrong_owner, wrong);
	shardkv_close(c); /* stops the parked watch at once */
}

static void
admin_results_and_config_are_reported(void **state)
{
	shardkv_client *c = open_client(2000, false);
	shardkv_admin_result ar;
	shardkv_config *cfg;
	(void)state;

	assert_int_equal(shardkv_join(c, "tcp://127.0.0.1:1", SHARDKV_WAIT, &ar), 0);
	assert_int_equal(ar.epoch, 6);
	assert_int_equal(ar.node_id, 3);
	assert_int_equal(ar.wait_ms, 1500);
	assert_int_equal(shardkv_join(c, g->srv[0].url, 0, &ar), SHARDKV_EEXISTS);
	assert_non_null(strstr(shardkv_errmsg(), "already registered"));
	assert_int_equal(shardkv_leave(c, "9", 0, &ar), SHARDKV_ENOTFOUND);
	assert_int_equal(shardkv_move(c, "a", 1, "b", 1, "2", 10, 0, &ar), 0);
	assert_int_equal(ar.nmigrations, 1);
	assert_int_equal(ar.first_mig_id, 42);
	assert_int_equal(shardkv_config_get(c, 0, &cfg), 0);
	assert_int_equal(cfg->epoch, 5);
	assert_int_equal(cfg->nnodes, 2);
	assert_int_equal(cfg->nranges, 2);
	assert_string_equal((char *)cfg->ranges[1].start.data, "m");
	shardkv_config_free(cfg);
	assert_int_equal(shardkv_config_get(c, 3, &cfg), SHARDKV_ENOTFOUND);
	assert_int_equal(shardkv_status(c, &cfg), 0);
	assert_int_equal(cfg->nodes[1].keys, 20);
	assert_true(cfg->nodes[1].has_stats);
	assert_int_equal(cfg->ncontrollers, 1);
	assert_string_equal(cfg->controllers[0].role, "standalone");
	shardkv_config_free(cfg);
	shardkv_close(c);
}

/* Runs the CLI against the fake cluster; returns stdout (owned) and the code. */
static int
cli(char **out, size_t *nout, char **err, int argc, const char **args)
{
	const char *argv[32] = {"shardkv", "-c", g->ctl_url, "--timeout", "2000"};
	size_t nerr;
	char *e = NULL;
	FILE *fo = open_memstream(out, nout), *fe = open_memstream(&e, &nerr);
	int rc;

	for (int i = 0; i < argc; i++)
		argv[5 + i] = args[i];
	rc = kv_cli_main(5 + argc, (char **)argv, fo, fe);
	fclose(fo);
	fclose(fe);
	if (err)
		*err = e;
	else
		free(e);
	return rc;
}

/* Whether output o is want (NULL: anything). */
static bool
out_matches(const char *o, const char *want)
{
	return want == NULL || strcmp(o, want) == 0;
}

#define CLI_EXPECT(code, expect_out, ...)                                                          \
	do {                                                                                       \
		const char *a_[] = {__VA_ARGS__};                                                  \
		char *o_ = NULL, *e_ = NULL;                                                       \
		size_t n_;                                                                         \
		int rc_ = cli(&o_, &n_, &e_, ARGC(a_), a_);                                        \
		if (rc_ != (code) || !out_matches(o_, (expect_out)))                               \
			fail_msg("%s: rc %d (want %d) out '%s' err '%s'", a_[0], rc_, (code), o_,  \
			         e_);                                                              \
		free(o_);                                                                          \
		free(e_);                                                                          \
	} while (0)

static void
cli_round_trip_of_every_command(void **state)
{
	(void)state;
	CLI_EXPECT(0, "", "put", "apple", "red");
	CLI_EXPECT(0, "", "put", "zoo", "animals");
	CLI_EXPECT(0, "red\n", "get", "apple");
	CLI_EXPECT(1, "", "get", "pear");
	CLI_EXPECT(0, "", "append", "apple", "dish");
	CLI_EXPECT(0, "", "mput", "b", "2", "y", "25");
	CLI_EXPECT(0, "reddish\n25\n2\n", "mget", "apple", "y", "b");
	CLI_EXPECT(1, "", "mget", "apple", "nope");
	CLI_EXPECT(0, "apple\nb\ny\nzoo\n", "keys");
	CLI_EXPECT(0, "y\n", "keys", "--prefix", "y");
	CLI_EXPECT(0, "b\t2\ny\t25\n", "scan", "b", "z");
	CLI_EXPECT(0, "apple\treddish\n", "scan", "", "", "--limit", "1");
	CLI_EXPECT(0, "reddish\n", "del", "apple");
	CLI_EXPECT(1, "", "del", "apple");
	CLI_EXPECT(0, NULL, "config");
	CLI_EXPECT(0, NULL, "status");
	CLI_EXPECT(0, "{\"epoch\": 6, \"command\": \"join\", \"migrations\": 0, \"node\": 3}\n",
	           "--json", "join", "tcp://127.0.0.1:9");
	CLI_EXPECT(2, "", "join", g->srv[0].url);
	CLI_EXPECT(2, "", "leave", "7"); /* unknown node: an invalid request */
	CLI_EXPECT(0, "moving [a, b) to node 2 in epoch 6 (1 migration)\n", "move", "a", "b", "2");
	CLI_EXPECT(0, "rebalancing in epoch 5 (0 migrations)\n", "rebalance");
}

static void
cli_json_config_and_status_have_the_spec_shape(void **state)
{
	char *out, want[1024];
	size_t n;
	const char *cfg[] = {"--json", "config"};
	(void)state;

	assert_int_equal(cli(&out, &n, NULL, 2, cfg), 0);
	assert_int_equal(
	    snprintf(want, sizeof(want),
	             "{\"epoch\": 5, \"nodes\": [{\"id\": 1, \"address\": \"%s\", "
	             "\"state\": \"active\"}, {\"id\": 2, \"address\": \"%s\", "
	             "\"state\": \"active\"}], \"ranges\": [{\"start\": \"\", \"end\": "
	             "\"m\", \"node\": 1}, {\"start\": \"m\", \"end\": \"\", \"node\": "
	             "2}], \"migrations\": []}\n",
	             g->srv[0].url, g->srv[1].url) > 0,
	    true);
	assert_string_equal(out, want);
	free(out);

	const char *st[] = {"--json", "status"};
	assert_int_equal(cli(&out, &n, NULL, 2, st), 0);
	assert_non_null(strstr(out, "\"keys\": 20, \"bytes\": 200, \"ops_per_sec\": 1.5"));
	assert_non_null(strstr(out, "\"migrations\": []"));
	assert_non_null(strstr(out, "\"controllers\": [{\"id\": 1, \"address\": \""));
	assert_non_null(strstr(out, "\"role\": \"standalone\", \"term\": 0, \"index\": 0}]}\n"));
	free(out);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(single_key_ops_are_routed_to_the_owner, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(client_retries_after_wrong_owner_with_new_epoch, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(lost_reply_is_retried_with_the_same_request_id, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(mput_and_mget_split_per_node_concurrently_in_key_order,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(mput_reports_the_node_that_failed, setup, teardown),
	    cmocka_unit_test_setup_teardown(scan_merges_servers_in_key_order_and_resumes, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(watch_learns_a_new_epoch_within_milliseconds, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(admin_results_and_config_are_reported, setup, teardown),
	    cmocka_unit_test_setup_teardown(cli_round_trip_of_every_command, setup, teardown),
	    cmocka_unit_test_setup_teardown(cli_json_config_and_status_have_the_spec_shape, setup,
	                                    teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
