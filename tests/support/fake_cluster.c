/*
 * fake_cluster.c - see fake_cluster.h: the fake shard servers' request
 * handler and the cluster's life cycle; the controller is fake_ctl.c.
 *
 * Lock order: the cluster's mu before a server's mu; neither is held while
 * calling into the fake controller (its mu is a leaf here). Handlers run on
 * nng's threads.
 */
#include "tests/support/fake_cluster.h"
#include "common/err.h"
#include "common/key.h"
#include "proto/shardkv.pb-c.h"
#include "proto/wire.h"
#include "tests/support/testutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* ---------------------------------------------------------------------------
 * Configurations
 * ------------------------------------------------------------------------- */

kv_config *
kv_fake_cluster_config(kv_fake_cluster *fc, uint64_t epoch, const char *split, uint32_t owner_lo,
                       uint32_t owner_hi)
{
	fake_cfg b = fake_cfg_owners(fc->ctl, epoch, split, owner_lo, owner_hi);
	assert_int_equal(kv_config_validate(b.c), KV_OK);
	return b.c;
}

void
kv_fake_cluster_publish(kv_fake_cluster *fc, kv_config *cfg)
{
	fake_cfg b = {.c = cfg};
	fake_cfg_publish(fc->ctl, &b);
}

void
kv_fake_cluster_set_truth(kv_fake_cluster *fc, kv_config *cfg)
{
	pthread_mutex_lock(&fc->mu);
	kv_config_free(fc->truth);
	fc->truth = cfg;
	pthread_mutex_unlock(&fc->mu);
}

/* ---------------------------------------------------------------------------
 * Fake shard server
 * ------------------------------------------------------------------------- */

/* Drops entry i (its slot refilled from the end). */
static void
drop_at(kv_fake_server *s, size_t i)
{
	kv_buf_fini(&s->kv[i].key);
	kv_buf_fini(&s->kv[i].val);
	s->kv[i] = s->kv[--s->nkv];
}

/* Drops the entries whose expiry passed. */
static void
expire_all(kv_fake_server *s)
{
	uint64_t now = kv_now_ns();
	for (size_t i = 0; i < s->nkv;)
		if (s->kv[i].exp_ns && s->kv[i].exp_ns <= now)
			drop_at(s, i);
		else
			i++;
}

static kv_fake_pair *
find(kv_fake_server *s, ProtobufCBinaryData k)
{
	expire_all(s);
	for (size_t i = 0; i < s->nkv; i++)
		if (kv_key_cmp(s->kv[i].key.data, s->kv[i].key.len, k.data, k.len) == 0)
			return &s->kv[i];
	return NULL;
}

/* A failed condition: status, and the current value (borrowed) or absence. */
static void
cond_failed(Shardkv__OpResult *res, Shardkv__Status st, const kv_fake_pair *e)
{
	res->status = st;
	if (e == NULL) {
		res->current_absent = true;
	} else {
		res->value.data = e->val.data;
		res->value.len = e->val.len;
	}
}

/* Whether e holds exactly x. */
static bool
holds(const kv_fake_pair *e, ProtobufCBinaryData x)
{
	return e != NULL && e->val.len == x.len &&
	       (x.len == 0 || memcmp(e->val.data, x.data, x.len) == 0);
}

static void
store_put(kv_fake_server *s, ProtobufCBinaryData k, ProtobufCBinaryData v)
{
	kv_fake_pair *p = find(s, k);
	if (p == NULL) {
		s->kv = realloc(s->kv, (s->nkv + 1) * sizeof(kv_fake_pair));
		p = &s->kv[s->nkv++];
		memset(p, 0, sizeof(*p));
		assert_int_equal(kv_buf_set(&p->key, k.data, k.len), KV_OK);
	}
	assert_int_equal(kv_buf_set(&p->val, v.data, v.len), KV_OK);
	p->exp_ns = 0;
}

static int
pair_cmp(const void *a, const void *b)
{
	const kv_fake_pair *x = a, *y = b;
	return kv_key_cmp(x->key.data, x->key.len, y->key.data, y->key.len);
}

/* Whether this server serves key under the truth. Call with cl->mu held. */
static bool
serves(kv_fake_server *s, const void *k, size_t n)
{
	return kv_config_route(s->cl->truth, k, n) == s->id;
}

/* Fills a WRONG_OWNER result for key. Call with cl->mu held. */
static void
wrong_owner(kv_fake_server *s, Shardkv__OpResult *res, Shardkv__OwnerHint *h, const void *k,
            size_t n)
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

/* Returns whether (client, id) was applied before, remembering nothing. */
static bool
seen_already(kv_fake_server *s, uint64_t client, uint64_t id)
{
	if (client == 0 || id == 0)
		return false;
	for (size_t i = 0; i < s->nseen; i++)
		if (s->seen[i].client_id == client && s->seen[i].request_id == id)
			return true;
	return false;
}

/* Returns whether (client, id) was applied before; remembers it if not. */
static bool
seen_before(kv_fake_server *s, uint64_t client, uint64_t id)
{
	if (client == 0 || id == 0)
		return false;
	for (size_t i = 0; i < s->nseen; i++)
		if (s->seen[i].client_id == client && s->seen[i].request_id == id)
			return true;
	if (s->nseen < 256)
		s->seen[s->nseen++] = (kv_fake_seen){client, id};
	return false;
}

static int
srv_handler(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p)
{
	kv_fake_server *s = arg;
	kv_fake_cluster *cl = s->cl;
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
	if (s->silent) {
		/* A server that stopped answering: the request is held, and stays
		 * on the wire at the client until kv_fake_server_release. */
		bool held = s->nheld < KV_FAKE_HELD;
		s->silent_seen++;
		if (op->op_case == SHARDKV__OP__OP_PUT || op->op_case == SHARDKV__OP__OP_MPUT)
			s->silent_put_id = op->request_id;
		if (held)
			s->held[s->nheld++] = p;
		pthread_mutex_unlock(&s->mu);
		pthread_mutex_unlock(&cl->mu);
		shardkv__request__free_unpacked(q, NULL);
		return held ? KV_RPC_DEFERRED : KV_EINTERNAL;
	}
	r.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	r.request_id = q->request_id;
	r.epoch = cl->truth->epoch;
	r.node_id = s->id;
	r.n_results = 1;
	r.results = &resp;
	switch (op->op_case) {
	case SHARDKV__OP__OP_GET: {
		ProtobufCBinaryData k = op->get->key;
		kv_fake_pair *e;
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
		/* A retry of a write applied before is answered as applied,
		 * before its condition is looked at again. */
		bool again = seen_already(s, q->client_id, op->request_id);
		if (!again && op->put->cond == SHARDKV__COND__COND_IF_ABSENT &&
		    find(s, k) != NULL) {
			cond_failed(&res, SHARDKV__STATUS__STATUS_EXISTS, find(s, k));
			break;
		}
		if (!again && op->put->cond == SHARDKV__COND__COND_IF_EQUAL &&
		    !holds(find(s, k), op->put->expect)) {
			cond_failed(&res, SHARDKV__STATUS__STATUS_MISMATCH, find(s, k));
			break;
		}
		if (!seen_before(s, q->client_id, op->request_id)) {
			store_put(s, k, op->put->value);
			if (op->put->ttl_ms)
				find(s, k)->exp_ns = kv_now_ns() + op->put->ttl_ms * 1000000ull;
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
		kv_fake_pair *e;
		if (!serves(s, k.data, k.len)) {
			wrong_owner(s, &res, &hint, k.data, k.len);
		} else if (op->del->cond == SHARDKV__COND__COND_IF_EQUAL &&
		           !holds(find(s, k), op->del->expect)) {
			cond_failed(&res, SHARDKV__STATUS__STATUS_MISMATCH, find(s, k));
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
		kv_fake_pair *e;
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
			kv_fake_pair *e = find(s, mg->keys[i]);
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
		for (size_t i = 0; i < mp->n_keys; i++) {
			store_put(s, mp->keys[i], mp->values[i]);
			if (mp->ttl_ms)
				find(s, mp->keys[i])->exp_ns =
				    kv_now_ns() + mp->ttl_ms * 1000000ull;
		}
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
		qsort(s->kv, s->nkv, sizeof(kv_fake_pair), pair_cmp);
		kvs = calloc(s->nkv + 1, sizeof(*kvs));
		kvp = calloc(s->nkv + 1, sizeof(*kvp));
		size_t limit = sc->limit ? sc->limit : 3; /* small pages: exercise paging */
		for (size_t i = 0; i < s->nkv; i++) {
			const kv_fake_pair *e = &s->kv[i];
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
	case SHARDKV__OP__OP_EXPIRE: {
		ProtobufCBinaryData k = op->expire->key;
		kv_fake_pair *e;
		assert_true(op->request_id != 0);
		assert_true((op->expire->ttl_ms != 0) != op->expire->persist);
		if (!serves(s, k.data, k.len))
			wrong_owner(s, &res, &hint, k.data, k.len);
		else if ((e = find(s, k)) == NULL)
			res.status = SHARDKV__STATUS__STATUS_NOT_FOUND;
		else
			e->exp_ns =
			    op->expire->persist ? 0 : kv_now_ns() + op->expire->ttl_ms * 1000000ull;
		break;
	}
	case SHARDKV__OP__OP_TTL: {
		ProtobufCBinaryData k = op->ttl->key;
		kv_fake_pair *e;
		if (!serves(s, k.data, k.len)) {
			wrong_owner(s, &res, &hint, k.data, k.len);
		} else if ((e = find(s, k)) == NULL) {
			res.status = SHARDKV__STATUS__STATUS_NOT_FOUND;
		} else {
			uint64_t now = kv_now_ns();
			res.ttl_ms =
			    e->exp_ns ? (int64_t)((e->exp_ns - now + 999999) / 1000000) : -1;
		}
		break;
	}
	case SHARDKV__OP__OP_INCR: {
		ProtobufCBinaryData k = op->incr->key;
		kv_fake_pair *e;
		long long v = 0;
		char tmp[32];
		assert_true(op->request_id != 0);
		if (!serves(s, k.data, k.len)) {
			wrong_owner(s, &res, &hint, k.data, k.len);
			break;
		}
		if ((e = find(s, k)) != NULL) {
			char *endp;
			if (e->val.len == 0 || e->val.len >= sizeof(tmp)) {
				res.status = SHARDKV__STATUS__STATUS_INVALID;
				break;
			}
			memcpy(tmp, e->val.data, e->val.len);
			tmp[e->val.len] = 0;
			v = strtoll(tmp, &endp, 10);
			if (*endp) {
				res.status = SHARDKV__STATUS__STATUS_INVALID;
				break;
			}
		}
		if (!seen_before(s, q->client_id, op->request_id)) {
			v += op->incr->delta;
			int len = snprintf(tmp, sizeof(tmp), "%lld", v);
			uint64_t exp = e ? e->exp_ns : 0;
			store_put(s, k, (ProtobufCBinaryData){(size_t)len, (uint8_t *)tmp});
			find(s, k)->exp_ns = exp;
		}
		res.number = v;
		break;
	}
	case SHARDKV__OP__OP_EXISTS: {
		ProtobufCBinaryData k = op->exists->key;
		if (!serves(s, k.data, k.len))
			wrong_owner(s, &res, &hint, k.data, k.len);
		else if (find(s, k) == NULL)
			res.status = SHARDKV__STATUS__STATUS_NOT_FOUND;
		break;
	}
	case SHARDKV__OP__OP_COUNT:
	case SHARDKV__OP__OP_DELRANGE: {
		bool del = op->op_case == SHARDKV__OP__OP_DELRANGE;
		ProtobufCBinaryData st = del ? op->delrange->start : op->count->start;
		ProtobufCBinaryData en = del ? op->delrange->end : op->count->end;
		ProtobufCBinaryData cu = del ? op->delrange->cursor : op->count->cursor;
		const kv_config *t = cl->truth;
		if (cu.len)
			st = cu;
		if (del)
			assert_true(op->request_id != 0);
		if (!serves(s, st.data, st.len)) {
			wrong_owner(s, &res, &hint, st.data, st.len);
			break;
		}
		if (del && seen_before(s, q->client_id, op->request_id))
			break; /* the fake does not keep the count of a retried step */
		long ri = kv_config_find_range(t, st.data, st.len);
		const kv_buf *rend = &t->ranges[ri].end;
		expire_all(s);
		qsort(s->kv, s->nkv, sizeof(kv_fake_pair), pair_cmp);
		/* Steps of 2 keys: exercise the client's loop. */
		for (size_t i = 0; i < s->nkv;) {
			const kv_fake_pair *e = &s->kv[i];
			if (!kv_range_contains(st.data, st.len, en.data, en.len, e->key.data,
			                       e->key.len) ||
			    !kv_range_contains(st.data, st.len, rend->data, rend->len, e->key.data,
			                       e->key.len)) {
				i++;
				continue;
			}
			if (res.count == 2) {
				res.more = true;
				assert_int_equal(kv_buf_set(&s->cursor, e->key.data, e->key.len),
				                 KV_OK);
				res.next_cursor.data = s->cursor.data;
				res.next_cursor.len = s->cursor.len;
				break;
			}
			res.count++;
			if (del) {
				drop_at(s, i);
				qsort(s->kv, s->nkv, sizeof(kv_fake_pair), pair_cmp);
			} else {
				i++;
			}
		}
		if (!res.more && rend->len &&
		    (en.len == 0 || kv_key_cmp(rend->data, rend->len, en.data, en.len) < 0)) {
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
	if (delay) {
		/* How many delayed mputs overlap, over both servers: the client
		 * sends the parts of one mput at once when this reaches 2. */
		int now = atomic_fetch_add(&cl->mput_inflight, 1) + 1;
		for (int most = atomic_load(&cl->mput_max_inflight); now > most;)
			if (atomic_compare_exchange_weak(&cl->mput_max_inflight, &most, now))
				break;
		kv_test_sleep_ms(delay);
		atomic_fetch_sub(&cl->mput_inflight, 1);
	}
	if (drop) {
		nng_msg_free(m);
		return KV_EIO; /* the reply is lost; the client must retry */
	}
	*reply = m;
	return 0;
}

/* ---------------------------------------------------------------------------
 * Life cycle
 * ------------------------------------------------------------------------- */

int
kv_fake_cluster_create(kv_fake_cluster **out)
{
	kv_fake_cluster *fc = calloc(1, sizeof(*fc));

	if (fc == NULL)
		return -1;
	*out = fc;
	pthread_mutex_init(&fc->mu, NULL);
	fc->ctl = fake_ctl_start();
	for (int i = 0; i < KV_FAKE_NSERVERS; i++) {
		kv_fake_server *s = &fc->srv[i];
		kv_rpc_server_opts o = {.handler = srv_handler, .arg = s, .contexts = 16};
		s->cl = fc;
		s->id = (uint32_t)i + 1;
		pthread_mutex_init(&s->mu, NULL);
		kv_test_free_url(s->url, sizeof(s->url));
		o.url = s->url;
		if (kv_rpc_server_create(&o, &s->rpc) != KV_OK)
			goto err;
		fake_ctl_add_node(fc->ctl, s->url);
	}
	/* Node 1 owns [, "m"), node 2 owns ["m", ). */
	fc->truth = kv_fake_cluster_config(fc, 5, "m", 1, 2);
	kv_fake_cluster_publish(fc, kv_fake_cluster_config(fc, 5, "m", 1, 2));
	return 0;
err:
	kv_fake_cluster_destroy(fc);
	*out = NULL;
	return -1;
}

void
kv_fake_server_release(kv_fake_server *s)
{
	kv_rpc_pending *held[KV_FAKE_HELD];
	size_t n;

	pthread_mutex_lock(&s->mu);
	s->silent = false;
	n = s->nheld;
	memcpy(held, s->held, n * sizeof(held[0]));
	s->nheld = 0;
	pthread_mutex_unlock(&s->mu);
	for (size_t i = 0; i < n; i++) {
		nng_msg *m;
		assert_int_equal(nng_msg_alloc(&m, 0), 0);
		kv_rpc_reply(held[i], m);
	}
}

void
kv_fake_cluster_destroy(kv_fake_cluster *fc)
{
	if (fc == NULL)
		return;
	fake_ctl_stop(fc->ctl);
	for (int i = 0; i < KV_FAKE_NSERVERS; i++) {
		kv_fake_server *s = &fc->srv[i];
		kv_rpc_server_destroy(s->rpc);
		for (size_t j = 0; j < s->nkv; j++) {
			kv_buf_fini(&s->kv[j].key);
			kv_buf_fini(&s->kv[j].val);
		}
		free(s->kv);
		kv_buf_fini(&s->cursor);
		pthread_mutex_destroy(&s->mu);
	}
	kv_config_free(fc->truth);
	pthread_mutex_destroy(&fc->mu);
	free(fc);
}

size_t
kv_fake_server_nkeys(kv_fake_cluster *fc, int i)
{
	pthread_mutex_lock(&fc->srv[i].mu);
	size_t n = fc->srv[i].nkv;
	pthread_mutex_unlock(&fc->srv[i].mu);
	return n;
}
