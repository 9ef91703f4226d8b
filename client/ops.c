/*
 * ops.c - the data operations of libshardkv (doc/contract.md §3) as requests of the
 * engine (engine.c).
 *
 * A blocking single-key op or scan page is one routed request and a wait
 * (kvc_run_routed): the engine routes it with the cached configuration (or
 * an OwnerHint) and retries WRONG_OWNER / MOVING / transient failures
 * within the call's deadline; a write keeps its Op.request_id across every
 * retry, so the server's exactly-once memory applies it once. An async op
 * is the same routed request with a callback instead of a wait.
 *
 * mget and mput split the keys per node (batch.c) and submit the parts to
 * their servers' queues, all at once, then wait for all of them on one
 * latch: no thread per part. A part refused for ownership is split again
 * with a fresher configuration in the next round; a part whose membership
 * is unchanged keeps its request id. Results are written back in key order.
 *
 * Scans walk the requested range in key order, one server page at a time,
 * each page clipped to the span the owner serves (kvc_scan_plan), continuing
 * at next_cursor; pages are merged with kvc_entries_merge.
 */
#include "client/client_int.h"
#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Looks up the address of node id in cfg. */
static const char *
node_address(const kv_config *cfg, uint32_t id)
{
	const kv_node *n = kv_config_node(cfg, id);
	return n ? n->address : NULL;
}

static int
check_key(const void *key, size_t klen)
{
	if (key == NULL || klen == 0)
		return kvc_fail(KV_EINVAL, "empty key");
	if (klen > KV_HARD_MAX_KEY)
		return kvc_fail(KV_ETOOBIG, "key of %zu bytes exceeds the limit of %u", klen,
		                KV_HARD_MAX_KEY);
	return KV_OK;
}

static int
check_value(size_t vlen)
{
	if (vlen > KV_HARD_MAX_VALUE)
		return kvc_fail(KV_ETOOBIG, "value of %zu bytes exceeds the limit of %u", vlen,
		                KV_HARD_MAX_VALUE);
	return KV_OK;
}

/* Moves a reply's value into a public buffer (always non-NULL data). */
static int
take_value(kv_buf *v, shardkv_buf *out)
{
	if (v->data == NULL) {
		if ((out->data = calloc(1, 1)) == NULL)
			return KV_ENOMEM;
		out->len = 0;
		return KV_OK;
	}
	out->data = v->data;
	out->len = v->len;
	memset(v, 0, sizeof(*v));
	return KV_OK;
}

static int
single(shardkv_client *c, kv_op *op, kv_data_result *r)
{
	int rv;

	kvc_clear_error();
	if ((rv = check_key(op->key.p, op->key.len)) != KV_OK)
		return rv;
	if ((rv = check_value(op->value.len)) != KV_OK)
		return rv;
	if ((rv = kvc_run_routed(c, op, op->key, kvc_deadline(c), r)) != KV_OK)
		return rv;
	if (r->status != KV_OK) {
		rv = r->status;
		kv_data_result_fini(r);
	}
	return rv;
}

int
shardkv_get(shardkv_client *c, const void *key, size_t klen, shardkv_buf *val)
{
	kv_op op = {.kind = KV_OP_GET, .key = {key, klen}};
	kv_data_result r;
	int rv;

	if (c == NULL || val == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	if ((rv = single(c, &op, &r)) != KV_OK)
		return rv;
	rv = take_value(&r.value, val);
	kv_data_result_fini(&r);
	return rv;
}

int
shardkv_put(shardkv_client *c, const void *key, size_t klen, const void *val, size_t vlen)
{
	kv_op op = {.kind = KV_OP_PUT, .key = {key, klen}, .value = {val, vlen}};
	kv_data_result r;
	int rv;

	if (c == NULL || (val == NULL && vlen))
		return kvc_fail(KV_EINVAL, "null argument");
	op.request_id = kvc_next_id(c);
	if ((rv = single(c, &op, &r)) != KV_OK)
		return rv;
	kv_data_result_fini(&r);
	return KV_OK;
}

int
shardkv_del(shardkv_client *c, const void *key, size_t klen, shardkv_buf *old)
{
	kv_op op = {.kind = KV_OP_DEL, .key = {key, klen}};
	kv_data_result r;
	int rv = KV_OK;

	if (c == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	op.request_id = kvc_next_id(c);
	if ((rv = single(c, &op, &r)) != KV_OK)
		return rv;
	if (old && r.value_unknown) {
		old->data = NULL; /* a retry the server answered without the value */
		old->len = 0;
	} else if (old) {
		rv = take_value(&r.value, old);
	}
	kv_data_result_fini(&r);
	return rv;
}

/* An async op: its request and its copies of key and value. */
typedef struct {
	kvc_req req;          /* first: the engine hands back &req */
	shardkv_done_fn done; /* the caller's callback */
	void *arg;            /* its argument */
	uint8_t buf[];        /* key, then value */
} async_op;

/* An async op finished: runs the caller's callback (the value stays the
 * engine's, freed with the Response after the callback) and frees the op. */
static void
async_done(kvc_req *q, int rv, kv_data_result *r)
{
	async_op *a = (async_op *)q;

	if (rv != KV_OK || r == NULL)
		a->done(a->arg, rv != KV_OK ? rv : KV_EPROTO, NULL, 0);
	else
		a->done(a->arg, r->status, r->value_unknown ? NULL : r->value.data,
		        r->value_unknown ? 0 : r->value.len);
	kvc_req_fini(q);
	free(a);
}

/* Checks an async op's arguments, copies them and submits the op. */
static int
submit_with(shardkv_client *c, kv_op_kind kind, const void *key, size_t klen, const void *val,
            size_t vlen, shardkv_done_fn done, void *arg, kvc_req_done_fn fin)
{
	async_op *a;
	int rv;

	kvc_clear_error();
	if (c == NULL || done == NULL || (key == NULL && klen) || (val == NULL && vlen))
		return kvc_fail(KV_EINVAL, "null argument");
	if ((rv = check_key(key, klen)) != KV_OK || (rv = check_value(vlen)) != KV_OK)
		return rv;
	if ((a = malloc(sizeof(*a) + klen + vlen)) == NULL)
		return kvc_fail(KV_ENOMEM, "out of memory");
	memcpy(a->buf, key, klen);
	if (vlen)
		memcpy(a->buf + klen, val, vlen);
	a->done = done;
	a->arg = arg;
	/* Field by field: a compound literal is built on the stack and then
	 * copied, for every op. */
	memset(&a->req, 0, sizeof(a->req));
	a->req.c = c;
	a->req.op.kind = kind;
	a->req.op.key = (kv_bytes){a->buf, klen};
	a->req.op.value = (kv_bytes){a->buf + klen, vlen};
	a->req.op.request_id = kind == KV_OP_GET ? 0 : kvc_next_id(c);
	a->req.key = a->req.op.key;
	a->req.deadline_ns = kvc_deadline(c);
	a->req.done = fin;
	/* The first op of a handle fetches the configuration here (the only
	 * wait an async call makes), so that the ops after it route at once. */
	kvc_cfgref *ref = kvc_cfg_peek(c);
	if (ref == NULL && kvc_cfg_get(c, 0, a->req.deadline_ns, &ref) != KV_OK)
		ref = NULL;
	kvc_cfg_put(ref);
	if ((rv = kvc_submit_routed(&a->req)) != KV_OK) {
		kvc_req_fini(&a->req);
		free(a);
		return rv;
	}
	return KV_OK;
}

static int
submit(shardkv_client *c, kv_op_kind kind, const void *key, size_t klen, const void *val,
       size_t vlen, shardkv_done_fn done, void *arg)
{
	return submit_with(c, kind, key, klen, val, vlen, done, arg, async_done);
}

int
shardkv_get_async(shardkv_client *c, const void *key, size_t klen, shardkv_done_fn done, void *arg)
{
	return submit(c, KV_OP_GET, key, klen, NULL, 0, done, arg);
}

int
shardkv_put_async(shardkv_client *c, const void *key, size_t klen, const void *val, size_t vlen,
                  shardkv_done_fn done, void *arg)
{
	return submit(c, KV_OP_PUT, key, klen, val, vlen, done, arg);
}

int
shardkv_del_async(shardkv_client *c, const void *key, size_t klen, shardkv_done_fn done, void *arg)
{
	return submit(c, KV_OP_DEL, key, klen, NULL, 0, done, arg);
}

int
shardkv_append(shardkv_client *c, const void *key, size_t klen, const void *val, size_t vlen,
               uint64_t *new_len)
{
	kv_op op = {.kind = KV_OP_APPEND, .key = {key, klen}, .value = {val, vlen}};
	kv_data_result r;
	int rv;

	if (c == NULL || (val == NULL && vlen))
		return kvc_fail(KV_EINVAL, "null argument");
	op.request_id = kvc_next_id(c);
	if ((rv = single(c, &op, &r)) != KV_OK)
		return rv;
	if (new_len)
		*new_len = r.value_len;
	kv_data_result_fini(&r);
	return KV_OK;
}

/* ---------------------------------------------------------------------------
 * mget / mput
 * ------------------------------------------------------------------------- */

/* One node's part of a multi-key op, possibly retried over several rounds. */
typedef struct {
	shardkv_client *c;  /* the handle */
	kv_op_kind kind;    /* KV_OP_MGET or KV_OP_MPUT over keys/vals below */
	uint64_t op_id;     /* mput: its Op.request_id, the same in every round */
	kv_bytes *keys;     /* the part's keys (owned array, borrowed bytes) */
	kv_bytes *vals;     /* mput: the part's values */
	size_t *idx;        /* indexes into the caller's arrays, ascending (owned) */
	size_t n;           /* keys in the part */
	uint32_t node;      /* where it goes */
	char *address;      /* node's address this round (owned) */
	uint64_t epoch;     /* the epoch it was routed with */
	uint64_t deadline;  /* the call's deadline */
	int rv;             /* this round: transport result */
	kv_data_result res; /* this round, rv 0: the part's result */
	int err;            /* the part's final or last error */
	bool done;          /* finished (successfully or not) */
	bool sent;          /* this round: submitted, req finished */
	kvc_req req;        /* this round's request; rv 0: its answer (req.status, req.res) */
} mpart;

static void
mpart_free(mpart *p)
{
	if (p == NULL)
		return;
	free(p->keys);
	free(p->vals);
	free(p->idx);
	free(p->address);
	kv_data_result_fini(&p->res);
	kvc_req_fini(&p->req);
	free(p);
}

/* Builds a part of the caller's keys idx[0..n). Takes nothing. */
static mpart *
mpart_new(shardkv_client *c, kv_op_kind kind, const kv_bytes *keys, const kv_bytes *vals,
          const size_t *idx, size_t n, uint64_t deadline)
{
	mpart *p = calloc(1, sizeof(*p));

	if (p == NULL)
		return NULL;
	p->keys = malloc(n * sizeof(kv_bytes));
	p->idx = malloc(n * sizeof(size_t));
	p->vals = vals ? malloc(n * sizeof(kv_bytes)) : NULL;
	if (p->keys == NULL || p->idx == NULL || (vals && p->vals == NULL)) {
		mpart_free(p);
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		p->idx[i] = idx[i];
		p->keys[i] = keys[idx[i]];
		if (vals)
			p->vals[i] = vals[idx[i]];
	}
	p->c = c;
	p->n = n;
	p->deadline = deadline;
	p->kind = kind;
	p->op_id = kind == KV_OP_MPUT ? kvc_next_id(c) : 0;
	p->err = KV_ETIMEDOUT;
	return p;
}

/* A growable list of parts. */
typedef struct {
	mpart **v; /* parts */
	size_t n;  /* entries */
} mparts;

static int
mparts_push(mparts *l, mpart *p)
{
	mpart **v = realloc(l->v, (l->n + 1) * sizeof(*v));
	if (v == NULL)
		return KV_ENOMEM;
	v[l->n++] = p;
	l->v = v;
	return KV_OK;
}

/*
 * Routes every pending part with cfg: a part whose keys all still go to its
 * node keeps its identity (and request id); others are split into new parts.
 */
static int
mparts_route(shardkv_client *c, mparts *l, const kv_config *cfg, const kv_bytes *keys,
             const kv_bytes *vals, kv_op_kind kind)
{
	mparts out = {0};
	int rv = KV_OK;

	for (size_t i = 0; i < l->n; i++) {
		mpart *p = l->v[i];
		kvc_part *parts = NULL;
		size_t np = 0;

		if (p->done) {
			if ((rv = mparts_push(&out, p)) != KV_OK)
				goto err;
			l->v[i] = NULL;
			continue;
		}
		if ((rv = kvc_split_keys(cfg, p->n, p->keys, &parts, &np)) != KV_OK)
			goto err;
		if (np == 1 && (parts[0].node == p->node || p->node == 0)) {
			p->node = parts[0].node;
			kvc_parts_free(parts, np);
			if ((rv = mparts_push(&out, p)) != KV_OK)
				goto err;
			l->v[i] = NULL;
			continue;
		}
		for (size_t j = 0; j < np; j++) {
			size_t *gidx = malloc(parts[j].n * sizeof(size_t));
			mpart *q;
			if (gidx == NULL) {
				kvc_parts_free(parts, np);
				rv = KV_ENOMEM;
				goto err;
			}
			for (size_t k = 0; k < parts[j].n; k++)
				gidx[k] = p->idx[parts[j].idx[k]];
			q = mpart_new(c, kind, keys, vals, gidx, parts[j].n, p->deadline);
			free(gidx);
			if (q == NULL || mparts_push(&out, q) != KV_OK) {
				mpart_free(q);
				kvc_parts_free(parts, np);
				rv = KV_ENOMEM;
				goto err;
			}
			q->node = parts[j].node;
		}
		kvc_parts_free(parts, np);
		mpart_free(p);
		l->v[i] = NULL;
	}
	free(l->v);
	*l = out;
	return KV_OK;
err:
	for (size_t i = 0; i < l->n; i++)
		mpart_free(l->v[i]);
	free(l->v);
	*l = out;
	return rv;
}

static void
mparts_fini(mparts *l)
{
	for (size_t i = 0; i < l->n; i++)
		mpart_free(l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

/*
 * Runs a multi-key op to completion: every part ends done, with err 0 and
 * its reply kept, or with its error. Returns 0 or KV_ENOMEM (then l is empty).
 */
static int
multi_run(shardkv_client *c, kv_op_kind kind, size_t n, const kv_bytes *keys, const kv_bytes *vals,
          mparts *l)
{
	uint64_t deadline = kvc_deadline(c), min_epoch = 0;
	uint32_t backoff = 1;
	size_t *all;
	mpart *p0;
	int rv;

	if ((all = malloc(n * sizeof(size_t))) == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < n; i++)
		all[i] = i;
	p0 = mpart_new(c, kind, keys, vals, all, n, deadline);
	free(all);
	if (p0 == NULL || mparts_push(l, p0) != KV_OK) {
		mpart_free(p0);
		return KV_ENOMEM;
	}
	for (;;) {
		kvc_cfgref *ref = NULL;
		size_t pending = 0;
		bool progress = false;

		rv = kvc_cfg_get(c, min_epoch, deadline, &ref);
		if (rv != KV_OK) {
			if (!kvc_retryable(rv) || kvc_ctl_refused() ||
			    kvc_remaining_ms(deadline) == 0) {
				for (size_t i = 0; i < l->n; i++)
					if (!l->v[i]->done) {
						l->v[i]->done = true;
						l->v[i]->err = rv;
					}
				return KV_OK;
			}
			kvc_backoff(deadline, &backoff);
			continue;
		}
		min_epoch = 0;
		if ((rv = mparts_route(c, l, ref->cfg, keys, vals, kind)) != KV_OK) {
			kvc_cfg_put(ref);
			mparts_fini(l);
			return rv;
		}
		for (size_t i = 0; i < l->n; i++)
			pending += !l->v[i]->done;
		/* Every part to its server's queue at once, then one wait. */
		kvc_latch lt;
		kvc_latch_init(&lt, (unsigned)pending);
		for (size_t i = 0; i < l->n; i++) {
			mpart *p = l->v[i];
			const char *a;
			if (p->done)
				continue;
			free(p->address);
			p->address = NULL;
			p->sent = false;
			kv_data_result_fini(&p->res);
			kvc_req_fini(&p->req);
			p->epoch = ref->cfg->epoch;
			a = node_address(ref->cfg, p->node);
			if (a == NULL || (p->address = strdup(a)) == NULL) {
				p->rv = a == NULL ? KV_EUNAVAIL : KV_ENOMEM;
				kvc_latch_down(&lt);
				continue;
			}
			p->req = (kvc_req){.c = c,
			                   .op = {.kind = p->kind,
			                          .request_id = p->op_id,
			                          .nkeys = p->n,
			                          .keys = p->keys,
			                          .nvals = p->vals ? p->n : 0,
			                          .vals = p->vals},
			                   .deadline_ns = p->deadline,
			                   .latch = &lt,
			                   .out = &p->res};
			if ((p->rv = kvc_submit_to(&p->req, p->address, p->epoch)) != KV_OK) {
				kvc_latch_down(&lt);
				continue;
			}
			p->sent = true;
		}
		kvc_latch_wait(&lt);
		kvc_latch_fini(&lt);
		for (size_t i = 0; i < l->n; i++) {
			mpart *p = l->v[i];
			if (!p->sent)
				continue;
			p->sent = false;
			p->rv = p->req.rv;
		}
		/* Classify the answers. */
		for (size_t i = 0; i < l->n; i++) {
			mpart *p = l->v[i];
			kv_data_result *r = &p->res;
			if (p->done)
				continue;
			if (p->rv != KV_OK) {
				p->err = p->rv == KV_ECLOSED ? KV_EUNAVAIL : p->rv;
				if (p->rv == KV_EUNAVAIL && p->address) /* no connection came */
					kvc_conn_redial(c, p->address);
				if (!kvc_retryable(p->rv) && p->rv != KV_EPROTO) {
					p->done = true;
					kvc_fail(p->err, "server %s: %s",
					         p->address ? p->address : "?",
					         kv_strerror(p->err));
				}
				min_epoch = ref->cfg->epoch + 1;
				continue;
			}
			int st = p->req.status != KV_OK ? p->req.status : r->status;
			if (p->req.srv_epoch > ref->cfg->epoch && p->req.srv_epoch > min_epoch)
				min_epoch = p->req.srv_epoch;
			if (r->has_hint && r->hint.epoch > ref->cfg->epoch &&
			    r->hint.epoch > min_epoch)
				min_epoch = r->hint.epoch;
			p->err = st;
			if (!kvc_retryable(st)) {
				p->done = true;
				progress = true;
				if (st != KV_OK && st != KV_ENOTFOUND)
					kvc_fail(st, "server %s: %s", p->address,
					         kvc_req_detail(&p->req)[0]
					             ? kvc_req_detail(&p->req)
					             : kv_strerror(st));
				continue;
			}
			if (st == KV_EWRONGOWNER && min_epoch == 0)
				min_epoch = ref->cfg->epoch + 1;
			kv_data_result_fini(r);
		}
		kvc_cfg_put(ref);
		pending = 0;
		for (size_t i = 0; i < l->n; i++)
			pending += !l->v[i]->done;
		if (pending == 0)
			return KV_OK;
		if (kvc_remaining_ms(deadline) == 0) {
			for (size_t i = 0; i < l->n; i++) {
				mpart *p = l->v[i];
				if (p->done)
					continue;
				p->done = true;
				if (p->err == KV_EWRONGOWNER || p->err == KV_EMOVING ||
				    p->err == KV_EBUSY || p->err == KV_ESTALE)
					p->err = KV_ETIMEDOUT;
				kvc_fail(p->err, "server %s: %s", p->address ? p->address : "?",
				         kv_strerror(p->err));
			}
			return KV_OK;
		}
		if (!progress)
			kvc_backoff(deadline, &backoff);
	}
}

static int
check_keys(size_t n, const shardkv_bytes *keys, kv_bytes **out)
{
	kv_bytes *k;

	if (n == 0 || keys == NULL)
		return kvc_fail(KV_EINVAL, "no keys");
	if ((k = malloc(n * sizeof(*k))) == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		int rv = check_key(keys[i].data, keys[i].len);
		if (rv != KV_OK) {
			free(k);
			return rv;
		}
		k[i].p = keys[i].data;
		k[i].len = keys[i].len;
	}
	*out = k;
	return KV_OK;
}

int
shardkv_mget(shardkv_client *c, size_t n, const shardkv_bytes *keys, shardkv_mget_result **out)
{
	shardkv_mget_result *res = NULL;
	mparts l = {0};
	kv_bytes *k = NULL;
	bool *missing = NULL;
	int rv;

	kvc_clear_error();
	if (c == NULL || out == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	if ((rv = check_keys(n, keys, &k)) != KV_OK)
		return rv;
	if ((rv = multi_run(c, KV_OP_MGET, n, k, NULL, &l)) != KV_OK)
		goto out;
	for (size_t i = 0; i < l.n; i++) {
		if (l.v[i]->err != KV_OK && l.v[i]->err != KV_ENOTFOUND) {
			rv = l.v[i]->err;
			goto out;
		}
	}
	rv = KV_ENOMEM;
	if ((res = calloc(1, sizeof(*res))) == NULL ||
	    (res->values = calloc(n, sizeof(shardkv_buf))) == NULL ||
	    (missing = calloc(n, sizeof(bool))) == NULL)
		goto out;
	res->n = n;
	for (size_t i = 0; i < l.n; i++) {
		mpart *p = l.v[i];
		kv_data_result *r = &p->res;
		for (size_t j = 0; j < r->nmissing; j++) {
			if (r->missing[j] >= p->n) {
				rv = kvc_fail(KV_EPROTO, "server %s: missing index out of range",
				              p->address);
				goto out;
			}
			missing[p->idx[r->missing[j]]] = true;
		}
		if (r->nvalues != p->n) {
			rv = kvc_fail(KV_EPROTO, "server %s: %zu values for %zu keys", p->address,
			              r->nvalues, p->n);
			goto out;
		}
		for (size_t j = 0; j < p->n; j++) {
			size_t at = p->idx[j];
			if (missing[at])
				continue;
			res->values[at].data = r->values[j].data;
			res->values[at].len = r->values[j].len;
			memset(&r->values[j], 0, sizeof(kv_buf));
		}
	}
	for (size_t i = 0; i < n; i++)
		res->nmissing += missing[i];
	if (res->nmissing && (res->missing = malloc(res->nmissing * sizeof(size_t))) == NULL)
		goto out;
	res->nmissing = 0;
	for (size_t i = 0; i < n; i++)
		if (missing[i])
			res->missing[res->nmissing++] = i;
	rv = res->nmissing ? kvc_fail(KV_ENOTFOUND, "%zu of %zu keys not found", res->nmissing, n)
	                   : KV_OK;
	*out = res;
	res = NULL;
out:
	shardkv_mget_result_free(res);
	free(missing);
	mparts_fini(&l);
	free(k);
	return rv;
}

void
shardkv_mget_result_free(shardkv_mget_result *r)
{
	if (r == NULL)
		return;
	if (r->values)
		for (size_t i = 0; i < r->n; i++)
			free(r->values[i].data);
	free(r->values);
	free(r->missing);
	free(r);
}

int
shardkv_mput(shardkv_client *c, size_t nkeys, const shardkv_bytes *keys, size_t nvals,
             const shardkv_bytes *vals, shardkv_mput_result **out)
{
	shardkv_mput_result *res = NULL;
	mparts l = {0};
	kv_bytes *k = NULL, *v = NULL;
	int rv, first = KV_OK;

	kvc_clear_error();
	if (c == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	if (nkeys != nvals)
		return kvc_fail(KV_EINVAL, "%zu keys but %zu values", nkeys, nvals);
	if ((rv = check_keys(nkeys, keys, &k)) != KV_OK)
		return rv;
	if ((v = malloc(nvals * sizeof(*v))) == NULL) {
		rv = KV_ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < nvals; i++) {
		if ((vals[i].data == NULL && vals[i].len) ||
		    (rv = check_value(vals[i].len)) != KV_OK) {
			rv = rv ? rv : kvc_fail(KV_EINVAL, "null value");
			goto out;
		}
		v[i].p = vals[i].data;
		v[i].len = vals[i].len;
	}
	if ((rv = multi_run(c, KV_OP_MPUT, nkeys, k, v, &l)) != KV_OK)
		goto out;
	rv = KV_ENOMEM;
	if ((res = calloc(1, sizeof(*res))) == NULL)
		goto out;
	for (size_t i = 0; i < l.n; i++)
		res->nfailed += l.v[i]->err != KV_OK;
	if (res->nfailed && (res->failed = calloc(res->nfailed, sizeof(*res->failed))) == NULL)
		goto out;
	res->nfailed = 0;
	for (size_t i = 0; i < l.n; i++) {
		mpart *p = l.v[i];
		shardkv_node_error *e;
		if (p->err == KV_OK)
			continue;
		e = &res->failed[res->nfailed++];
		e->node_id = p->node;
		e->err = p->err;
		e->nkeys = p->n;
		e->address = p->address ? strdup(p->address) : NULL;
		if (first == KV_OK)
			first = p->err;
	}
	if (first != KV_OK && res->nfailed > 1)
		kvc_fail(first, "%zu of %zu node parts failed (first: %s)", res->nfailed, l.n,
		         kv_strerror(first));
	rv = first;
	if (out) {
		*out = res;
		res = NULL;
	}
out:
	shardkv_mput_result_free(res);
	mparts_fini(&l);
	free(k);
	free(v);
	return rv;
}

void
shardkv_mput_result_free(shardkv_mput_result *r)
{
	if (r == NULL)
		return;
	for (size_t i = 0; i < r->nfailed; i++)
		free(r->failed[i].address);
	free(r->failed);
	free(r);
}

/* ---------------------------------------------------------------------------
 * scan / keys
 * ------------------------------------------------------------------------- */

int
shardkv_scan_ex(shardkv_client *c, const shardkv_scan_args *a, shardkv_scan_result **out)
{
	kv_buf cur = {0}, end = {0}, pend = {0};
	kvc_entries acc = {0};
	shardkv_scan_result *res = NULL;
	bool finished = false;
	int rv;

	kvc_clear_error();
	if (c == NULL || a == NULL || out == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	if (kv_range_is_empty(a->start.data, a->start.len, a->end.data, a->end.len))
		return kvc_fail(KV_EINVAL, "empty or inverted range");
	if (a->start.len > KV_HARD_MAX_KEY || a->end.len > KV_HARD_MAX_KEY ||
	    a->prefix.len > KV_HARD_MAX_KEY)
		return kvc_fail(KV_ETOOBIG, "range bound longer than the key limit");
	rv = KV_ENOMEM;
	if (kv_buf_set(&cur, a->start.data, a->start.len) != KV_OK ||
	    kv_buf_set(&end, a->end.data, a->end.len) != KV_OK)
		goto out;
	/* A prefix narrows the range to [prefix, prefix_end). */
	if (a->prefix.len) {
		if (kv_buf_reserve(&pend, a->prefix.len) != KV_OK)
			goto out;
		kv_prefix_end(a->prefix.data, a->prefix.len, pend.data, &pend.len);
		if (kv_key_cmp(cur.data, cur.len, a->prefix.data, a->prefix.len) < 0 &&
		    kv_buf_set(&cur, a->prefix.data, a->prefix.len) != KV_OK)
			goto out;
		if (pend.len &&
		    (end.len == 0 || kv_key_cmp(pend.data, pend.len, end.data, end.len) < 0) &&
		    kv_buf_set(&end, pend.data, pend.len) != KV_OK)
			goto out;
		if (kv_range_is_empty(cur.data, cur.len, end.data, end.len))
			finished = true;
	}
	while (!finished && !(a->limit && acc.n >= a->limit)) {
		uint64_t deadline = kvc_deadline(c); /* per page: a scan may take long */
		kvc_cfgref *ref = NULL;
		kvc_span *spans = NULL;
		size_t nspans = 0;
		kv_op op = {.kind = KV_OP_SCAN, .keys_only = a->keys_only};
		kv_data_result r;

		if ((rv = kvc_cfg_get(c, 0, deadline, &ref)) != KV_OK)
			goto out;
		rv = kvc_scan_plan(ref->cfg, (kv_bytes){cur.data, cur.len},
		                   (kv_bytes){end.data, end.len}, &spans, &nspans);
		kvc_cfg_put(ref);
		if (rv != KV_OK)
			goto out;
		/* This page: the first span, served by one node. */
		op.start = (kv_bytes){cur.data, cur.len};
		op.end = (kv_bytes){spans[0].end.data, spans[0].end.len};
		op.prefix = (kv_bytes){a->prefix.data, a->prefix.len};
		if (a->limit) {
			size_t left = a->limit - acc.n;
			op.limit = left > 100000 ? 100000 : (uint32_t)left;
		}
		rv = kvc_run_routed(c, &op, op.start, deadline, &r);
		if (rv == KV_OK && r.status != KV_OK) {
			rv = r.status;
			kv_data_result_fini(&r);
		}
		if (rv != KV_OK) {
			kvc_spans_free(spans, nspans);
			goto out;
		}
		long added = kvc_entries_merge(&acc, r.entries, r.nentries, a->limit);
		if (added < 0) {
			rv = (int)added;
			kv_data_result_fini(&r);
			kvc_spans_free(spans, nspans);
			goto out;
		}
		if (a->limit && acc.n >= a->limit && (size_t)added < r.nentries) {
			/* Cut short inside this page: resume after the last key taken. */
			const kv_buf *last = &acc.entries[acc.n - 1].key;
			rv = KV_ENOMEM;
			if (kv_buf_set(&cur, last->data, last->len) != KV_OK ||
			    kv_buf_append(&cur, "", 1) != KV_OK) {
				kv_data_result_fini(&r);
				kvc_spans_free(spans, nspans);
				goto out;
			}
		} else if (r.more && r.next_cursor.len &&
		           kv_key_cmp(r.next_cursor.data, r.next_cursor.len, cur.data, cur.len) >
		               0) {
			rv = kv_buf_set(&cur, r.next_cursor.data, r.next_cursor.len);
		} else if (r.more && r.nentries > 0) {
			/* No usable cursor: continue after the last key returned. */
			const kv_buf *last = &r.entries[r.nentries - 1].key;
			kv_buf tmp = {0};
			rv = kv_buf_set(&tmp, last->data ? last->data : (const uint8_t *)"",
			                last->len);
			if (rv == KV_OK)
				rv = kv_buf_append(&tmp, "", 1);
			if (rv == KV_OK) {
				kv_buf_fini(&cur);
				cur = tmp;
			} else {
				kv_buf_fini(&tmp);
			}
		} else if (r.more) {
			rv = kvc_fail(KV_EPROTO, "server said more without a cursor or entries");
		} else if (spans[0].end.len == 0 ||
		           (end.len && kv_key_cmp(spans[0].end.data, spans[0].end.len, end.data,
		                                  end.len) >= 0)) {
			finished = true;
			rv = KV_OK;
		} else {
			rv = kv_buf_set(&cur, spans[0].end.data, spans[0].end.len);
		}
		kv_data_result_fini(&r);
		kvc_spans_free(spans, nspans);
		if (rv != KV_OK)
			goto out;
		if (!finished && end.len && kv_key_cmp(cur.data, cur.len, end.data, end.len) >= 0)
			finished = true;
	}
	rv = KV_ENOMEM;
	if ((res = calloc(1, sizeof(*res))) == NULL)
		goto out;
	if (acc.n && (res->entries = calloc(acc.n, sizeof(shardkv_entry))) == NULL)
		goto out;
	for (size_t i = 0; i < acc.n; i++) {
		kv_data_entry *e = &acc.entries[i];
		res->entries[i].key.data = e->key.data;
		res->entries[i].key.len = e->key.len;
		if (e->value.data == NULL && (e->value.data = calloc(1, 1)) == NULL)
			goto out;
		res->entries[i].value.data = e->value.data;
		res->entries[i].value.len = e->value.len;
		memset(e, 0, sizeof(*e));
		res->n++;
	}
	res->more = !finished;
	if (res->more) {
		res->next.data = cur.data;
		res->next.len = cur.len;
		memset(&cur, 0, sizeof(cur));
		if (res->next.data == NULL && (res->next.data = calloc(1, 1)) == NULL)
			goto out;
	}
	*out = res;
	res = NULL;
	rv = KV_OK;
out:
	shardkv_scan_result_free(res);
	kvc_entries_fini(&acc);
	kv_buf_fini(&cur);
	kv_buf_fini(&end);
	kv_buf_fini(&pend);
	return rv;
}

int
shardkv_scan(shardkv_client *c, const void *start, size_t slen, const void *end, size_t elen,
             size_t limit, shardkv_scan_result **out)
{
	shardkv_scan_args a = {.start = {start, slen}, .end = {end, elen}, .limit = limit};
	return shardkv_scan_ex(c, &a, out);
}

int
shardkv_keys(shardkv_client *c, const void *prefix, size_t plen, shardkv_scan_result **out)
{
	shardkv_scan_args a = {.prefix = {prefix, plen}, .keys_only = true};
	return shardkv_scan_ex(c, &a, out);
}

void
shardkv_scan_result_free(shardkv_scan_result *r)
{
	if (r == NULL)
		return;
	for (size_t i = 0; i < r->n; i++) {
		free(r->entries[i].key.data);
		free(r->entries[i].value.data);
	}
	free(r->entries);
	free(r->next.data);
	free(r);
}

/* ---------------------------------------------------------------------------
 * append_async
 * ------------------------------------------------------------------------- */

/* An async append finished: done gets the new length as vlen. */
static void
append_done(kvc_req *q, int rv, kv_data_result *r)
{
	async_op *a = (async_op *)q;

	if (rv != KV_OK || r == NULL)
		a->done(a->arg, rv != KV_OK ? rv : KV_EPROTO, NULL, 0);
	else
		a->done(a->arg, r->status, NULL, r->status == KV_OK ? (size_t)r->value_len : 0);
	kvc_req_fini(q);
	free(a);
}

int
shardkv_append_async(shardkv_client *c, const void *key, size_t klen, const void *val, size_t vlen,
                     shardkv_done_fn done, void *arg)
{
	return submit_with(c, KV_OP_APPEND, key, klen, val, vlen, done, arg, append_done);
}

/* ---------------------------------------------------------------------------
 * Scan iterator
 * ------------------------------------------------------------------------- */

struct shardkv_scan_iter {
	shardkv_client *c;        /* the handle */
	kv_buf start;             /* where the next page starts */
	kv_buf end;               /* the scan's end */
	kv_buf prefix;            /* the scan's prefix */
	bool keys_only;           /* values left empty */
	size_t page;              /* entries per page */
	size_t left;              /* entries still allowed; SIZE_MAX: no limit */
	shardkv_scan_result *cur; /* the page being read; NULL before the first */
	size_t idx;               /* the next entry of cur */
	bool end_reached;         /* no page after cur */
};

int
shardkv_scan_iter_new(shardkv_client *c, const shardkv_scan_args *a, size_t page,
                      shardkv_scan_iter **out)
{
	shardkv_scan_iter *it;

	kvc_clear_error();
	if (c == NULL || a == NULL || out == NULL || (a->start.data == NULL && a->start.len) ||
	    (a->end.data == NULL && a->end.len) || (a->prefix.data == NULL && a->prefix.len))
		return kvc_fail(KV_EINVAL, "null argument");
	if (kv_range_is_empty(a->start.data, a->start.len, a->end.data, a->end.len))
		return kvc_fail(KV_EINVAL, "empty or inverted range");
	if ((it = calloc(1, sizeof(*it))) == NULL)
		return kvc_fail(KV_ENOMEM, "out of memory");
	it->c = c;
	it->keys_only = a->keys_only;
	it->page = page ? page : 256;
	it->left = a->limit ? a->limit : SIZE_MAX;
	if (kv_buf_set(&it->start, a->start.data, a->start.len) != KV_OK ||
	    kv_buf_set(&it->end, a->end.data, a->end.len) != KV_OK ||
	    kv_buf_set(&it->prefix, a->prefix.data, a->prefix.len) != KV_OK) {
		shardkv_scan_iter_free(it);
		return kvc_fail(KV_ENOMEM, "out of memory");
	}
	*out = it;
	return KV_OK;
}

int
shardkv_scan_iter_next(shardkv_scan_iter *it, const shardkv_entry **entry)
{
	int rv;

	kvc_clear_error();
	if (it == NULL || entry == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	for (;;) {
		if (it->cur != NULL && it->idx < it->cur->n) {
			*entry = &it->cur->entries[it->idx++];
			return 0;
		}
		if (it->end_reached || it->left == 0)
			return 1;
		/* The next page: from the resume point of the last one. */
		if (it->cur != NULL) {
			if (!it->cur->more) {
				it->end_reached = true;
				continue;
			}
			if (kv_buf_set(&it->start, it->cur->next.data, it->cur->next.len) != KV_OK)
				return kvc_fail(KV_ENOMEM, "out of memory");
			shardkv_scan_result_free(it->cur);
			it->cur = NULL;
		}
		shardkv_scan_args a = {.start = {it->start.data, it->start.len},
		                       .end = {it->end.data, it->end.len},
		                       .prefix = {it->prefix.data, it->prefix.len},
		                       .limit = it->page < it->left ? it->page : it->left,
		                       .keys_only = it->keys_only};
		shardkv_scan_result *r;
		if ((rv = shardkv_scan_ex(it->c, &a, &r)) != KV_OK)
			return rv; /* it->start is kept: the next call retries */
		it->cur = r;
		it->idx = 0;
		if (it->left != SIZE_MAX)
			it->left -= r->n < it->left ? r->n : it->left;
		if (r->n == 0 && !r->more)
			it->end_reached = true;
	}
}

void
shardkv_scan_iter_free(shardkv_scan_iter *it)
{
	if (it == NULL)
		return;
	shardkv_scan_result_free(it->cur);
	kv_buf_fini(&it->start);
	kv_buf_fini(&it->end);
	kv_buf_fini(&it->prefix);
	free(it);
}

/* ---------------------------------------------------------------------------
 * Async mget, mput and scan: the blocking form on a thread of its own
 * ------------------------------------------------------------------------- */

enum { MULTI_MGET, MULTI_MPUT, MULTI_SCAN };

/* The caller's callback, of the op's kind. */
typedef union {
	shardkv_mget_done_fn mget;
	shardkv_mput_done_fn mput;
	shardkv_scan_done_fn scan;
} multi_done;

/* One async multi-key op: its copies of the arguments. */
typedef struct {
	shardkv_client *c;    /* the handle (counted pending) */
	int kind;             /* MULTI_* */
	uint64_t deadline;    /* fixed at submission (kv_now_ns) */
	size_t n;             /* keys (and values for mput) */
	shardkv_bytes *keys;  /* n, pointing into buf */
	shardkv_bytes *vals;  /* mput: n, pointing into buf */
	shardkv_scan_args sa; /* scan: pointing into buf */
	multi_done done;      /* the caller's callback */
	void *arg;            /* its argument */
	uint8_t *buf;         /* the copied bytes (owned) */
} multi_op;

static void
multi_free(multi_op *m)
{
	free(m->keys);
	free(m->vals);
	free(m->buf);
	free(m);
}

/* A failure of an op that ran while shardkv_close began is ECLOSED, as for
 * the queued single-key ops. */
static int
closing_status(shardkv_client *c, int rv)
{
	if (rv != KV_OK && rv != KV_ENOTFOUND && atomic_load(&c->eng_closing))
		return KV_ECLOSED;
	return rv;
}

static void *
multi_main(void *arg)
{
	multi_op *m = arg;
	shardkv_client *c = m->c;
	uint32_t ms = kvc_remaining_ms(m->deadline);

	/* The deadline fixed at submission, through this thread's own timeout. */
	shardkv_set_thread_timeout(ms ? ms : 1);
	if (ms == 0) {
		kvc_fail(KV_ETIMEDOUT, "the deadline passed before the op started");
	}
	switch (m->kind) {
	case MULTI_MGET: {
		shardkv_mget_result *r = NULL;
		int rv = ms ? shardkv_mget(c, m->n, m->keys, &r) : KV_ETIMEDOUT;
		m->done.mget(m->arg, closing_status(c, rv), r);
		break;
	}
	case MULTI_MPUT: {
		shardkv_mput_result *r = NULL;
		int rv = ms ? shardkv_mput(c, m->n, m->keys, m->n, m->vals, &r) : KV_ETIMEDOUT;
		m->done.mput(m->arg, closing_status(c, rv), r);
		break;
	}
	default: {
		shardkv_scan_result *r = NULL;
		int rv = ms ? shardkv_scan_ex(c, &m->sa, &r) : KV_ETIMEDOUT;
		m->done.scan(m->arg, closing_status(c, rv), r);
		break;
	}
	}
	multi_free(m);
	kvc_pending_release(c); /* last: c may be freed once it is released */
	return NULL;
}

/* Copies n byte strings into m->buf from offset *off; sets out[i]. */
static void
copy_bytes(multi_op *m, size_t *off, size_t n, const shardkv_bytes *in, shardkv_bytes *out)
{
	for (size_t i = 0; i < n; i++) {
		if (in[i].len)
			memcpy(m->buf + *off, in[i].data, in[i].len);
		out[i].data = m->buf + *off;
		out[i].len = in[i].len;
		*off += in[i].len;
	}
}

/* Sums the lengths of n byte strings; KV_EINVAL for a NULL one with a length. */
static int
sum_bytes(size_t n, const shardkv_bytes *b, size_t *total)
{
	for (size_t i = 0; i < n; i++) {
		if (b[i].data == NULL && b[i].len)
			return kvc_fail(KV_EINVAL, "null key or value");
		if (b[i].len > SIZE_MAX - *total)
			return kvc_fail(KV_ETOOBIG, "arguments too large");
		*total += b[i].len;
	}
	return KV_OK;
}

/* Checks, copies and starts an async multi-key op. */
static int
multi_submit(shardkv_client *c, int kind, size_t n, const shardkv_bytes *keys, size_t nvals,
             const shardkv_bytes *vals, const shardkv_scan_args *sa, multi_done done, void *arg)
{
	multi_op *m;
	size_t total = 0, off = 0;
	pthread_attr_t at;
	pthread_t th;
	int rv;

	kvc_clear_error();
	if (c == NULL || done.mget == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	if (kind == MULTI_SCAN) {
		if (sa == NULL)
			return kvc_fail(KV_EINVAL, "null argument");
		shardkv_bytes b[3] = {sa->start, sa->end, sa->prefix};
		if ((rv = sum_bytes(3, b, &total)) != KV_OK)
			return rv;
	} else {
		if (n == 0 || (n && keys == NULL) ||
		    (kind == MULTI_MPUT && (nvals != n || vals == NULL)))
			return kvc_fail(KV_EINVAL, "no keys, or as many values as keys needed");
		if ((rv = sum_bytes(n, keys, &total)) != KV_OK ||
		    (kind == MULTI_MPUT && (rv = sum_bytes(n, vals, &total)) != KV_OK))
			return rv;
	}
	if ((m = calloc(1, sizeof(*m))) == NULL)
		return kvc_fail(KV_ENOMEM, "out of memory");
	m->c = c;
	m->kind = kind;
	m->n = n;
	m->done = done;
	m->arg = arg;
	m->deadline = kvc_deadline(c);
	if ((m->buf = malloc(total ? total : 1)) == NULL ||
	    (kind != MULTI_SCAN && (m->keys = calloc(n, sizeof(*m->keys))) == NULL) ||
	    (kind == MULTI_MPUT && (m->vals = calloc(n, sizeof(*m->vals))) == NULL)) {
		multi_free(m);
		return kvc_fail(KV_ENOMEM, "out of memory");
	}
	if (kind == MULTI_SCAN) {
		m->sa = *sa;
		copy_bytes(m, &off, 1, &sa->start, &m->sa.start);
		copy_bytes(m, &off, 1, &sa->end, &m->sa.end);
		copy_bytes(m, &off, 1, &sa->prefix, &m->sa.prefix);
	} else {
		copy_bytes(m, &off, n, keys, m->keys);
		if (kind == MULTI_MPUT)
			copy_bytes(m, &off, n, vals, m->vals);
	}
	if ((rv = kvc_pending_take(c)) != KV_OK) {
		multi_free(m);
		return rv;
	}
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	rv = pthread_create(&th, &at, multi_main, m);
	pthread_attr_destroy(&at);
	if (rv != 0) {
		multi_free(m);
		kvc_pending_release(c);
		return kvc_fail(KV_ENOMEM, "cannot start a thread for the op");
	}
	return KV_OK;
}

int
shardkv_mget_async(shardkv_client *c, size_t n, const shardkv_bytes *keys,
                   shardkv_mget_done_fn done, void *arg)
{
	return multi_submit(c, MULTI_MGET, n, keys, 0, NULL, NULL, (multi_done){.mget = done}, arg);
}

int
shardkv_mput_async(shardkv_client *c, size_t nkeys, const shardkv_bytes *keys, size_t nvals,
                   const shardkv_bytes *vals, shardkv_mput_done_fn done, void *arg)
{
	return multi_submit(c, MULTI_MPUT, nkeys, keys, nvals, vals, NULL,
	                    (multi_done){.mput = done}, arg);
}

int
shardkv_scan_async(shardkv_client *c, const shardkv_scan_args *a, shardkv_scan_done_fn done,
                   void *arg)
{
	return multi_submit(c, MULTI_SCAN, 0, NULL, 0, NULL, a, (multi_done){.scan = done}, arg);
}
