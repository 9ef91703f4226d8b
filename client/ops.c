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
 * their servers' queues, all at once; the last part's completion
 * classifies the round (mrun): no thread per part, none per call. A part
 * refused for ownership is split again with a fresher configuration in the
 * next round, which the engine's retry thread starts (kvc_defer) after the
 * backoff; a part whose membership is unchanged keeps its request id.
 * Results are written back in key order. The blocking calls wait on a
 * latch for the machine to end; the async ones end with the callback.
 *
 * Scans walk the requested range in key order, one server page at a time,
 * each page clipped to the span the owner serves (kvc_scan_plan), continuing
 * at next_cursor; pages are merged with kvc_entries_merge (scan_st). An
 * async scan sends each page from the retry thread and takes its answer in
 * the page's completion.
 */
#include "client/client_int.h"
#include "common/err.h"

#include <pthread.h>
#include <stdarg.h>
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
	bool rec;             /* an ASYNC_REC_BYTES record (async_rec_free caches it) */
	uint8_t buf[];        /* key, then value */
} async_op;

/*
 * Async op records. An op is allocated on the thread that submits it and
 * freed on the nng thread that completes it, so glibc's per-thread cache
 * (7 blocks of a size) overflows at once under a pipeline and every op
 * went through malloc's locked arena paths (_int_malloc, _int_free,
 * consolidation: 8-10% of the pipelined client's cycles). Ops whose key
 * and value fit in ASYNC_REC_BYTES take a record of that one size from a
 * cache of the thread's own instead, up to ASYNC_REC_CACHE of them; no
 * lock, as each cache is its thread's only. A thread's cache is freed when
 * the thread exits (a pthread key's destructor); with no key, every record
 * is malloc'd and freed.
 */
#define ASYNC_REC_BYTES 512u
#define ASYNC_REC_CACHE 256u

typedef struct async_rec {
	struct async_rec *next;
} async_rec;

typedef struct {
	async_rec *head; /* free records */
	unsigned n;      /* in head */
	bool keyed;      /* registered with async_rec_key (its destructor frees head) */
} async_rec_cache;

static _Thread_local async_rec_cache async_recs;
static pthread_key_t async_rec_key;
static pthread_once_t async_rec_once = PTHREAD_ONCE_INIT;
static bool async_rec_have_key; /* written once, under async_rec_once */

static void
async_rec_drain(void *arg)
{
	async_rec_cache *rc = arg;

	while (rc->head != NULL) {
		async_rec *r = rc->head;
		rc->head = r->next;
		free(r);
	}
	rc->n = 0;
}

static void
async_rec_key_init(void)
{
	async_rec_have_key = pthread_key_create(&async_rec_key, async_rec_drain) == 0;
}

/* A record for an op of `bytes` key and value bytes, from the thread's
 * cache when it fits and one is there. */
static async_op *
async_rec_alloc(size_t bytes)
{
	async_rec_cache *rc = &async_recs;
	async_op *a;

	if (sizeof(async_op) + bytes > ASYNC_REC_BYTES) {
		if ((a = malloc(sizeof(*a) + bytes)) != NULL)
			a->rec = false;
		return a;
	}
	if (rc->head != NULL) {
		async_rec *r = rc->head;
		rc->head = r->next;
		rc->n--;
		a = (async_op *)r;
	} else if ((a = malloc(ASYNC_REC_BYTES)) == NULL) {
		return NULL;
	}
	a->rec = true;
	return a;
}

/* Frees an op's record: into the thread's cache when it is a record and
 * there is room. */
static void
async_rec_free(async_op *a)
{
	async_rec_cache *rc = &async_recs;

	if (!a->rec || rc->n >= ASYNC_REC_CACHE) {
		free(a);
		return;
	}
	if (!rc->keyed) {
		pthread_once(&async_rec_once, async_rec_key_init);
		if (!async_rec_have_key || pthread_setspecific(async_rec_key, rc) != 0) {
			free(a);
			return;
		}
		rc->keyed = true;
	}
	async_rec *r = (async_rec *)a;
	r->next = rc->head;
	rc->head = r;
	rc->n++;
}

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
	async_rec_free(a);
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
	if ((a = async_rec_alloc(klen + vlen)) == NULL)
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
	a->req.deadline_ns = kvc_deadline_late(c);
	a->req.done = fin;
	/* The first op of a handle fetches the configuration here (the only
	 * wait an async call makes), so that the ops after it route at once. */
	if (!atomic_load(&c->cfg_known)) {
		kvc_cfgref *ref = kvc_cfg_peek(c);
		if (ref == NULL && kvc_cfg_get(c, 0, a->req.deadline_ns, &ref) != KV_OK)
			ref = NULL;
		kvc_cfg_put(ref);
	}
	if ((rv = kvc_submit_routed(&a->req)) != KV_OK) {
		kvc_req_fini(&a->req);
		async_rec_free(a);
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
	shardkv_client *c;    /* the handle */
	kv_op_kind kind;      /* KV_OP_MGET or KV_OP_MPUT over keys/vals below */
	uint64_t op_id;       /* mput: its Op.request_id, the same in every round */
	const kv_bytes *keys; /* the part's keys (owned array unless borrowed; borrowed bytes) */
	const kv_bytes *vals; /* mput: the part's values, likewise */
	size_t *idx;          /* indexes into the caller's arrays, ascending (owned);
	                       * NULL: every key, in the caller's order */
	bool borrowed;        /* keys and vals are the caller's arrays */
	size_t n;             /* keys in the part */
	uint32_t node;        /* where it goes */
	char *address;        /* node's address this round (owned) */
	uint64_t epoch;       /* the epoch it was routed with */
	uint64_t deadline;    /* the call's deadline */
	int rv;               /* this round: transport result */
	kv_data_result res;   /* this round, rv 0: the part's result */
	int err;              /* the part's final or last error */
	bool done;            /* finished (successfully or not) */
	bool tried;           /* submitted in an earlier round (its op is a retry) */
	bool redial;          /* this round found no connection: redial before the next */
	bool down;            /* this round's node is `down`: not sent */
	struct mrun *m;       /* the op it belongs to */
	kvc_req req;          /* this round's request; rv 0: its answer (req.status, res) */
} mpart;

static void
mpart_free(mpart *p)
{
	if (p == NULL)
		return;
	if (!p->borrowed) {
		free((kv_bytes *)p->keys);
		free((kv_bytes *)p->vals);
	}
	free(p->idx);
	free(p->address);
	kv_data_result_fini(&p->res);
	kvc_req_fini(&p->req);
	free(p);
}

/* The index into the caller's arrays of the part's key j. */
static size_t
mpart_at(const mpart *p, size_t j)
{
	return p->idx ? p->idx[j] : j;
}

/* Builds a part of the caller's keys idx[0..n) (idx NULL: all n keys, the
 * caller's arrays borrowed). Takes nothing. */
static mpart *
mpart_new(shardkv_client *c, kv_op_kind kind, const kv_bytes *keys, const kv_bytes *vals,
          const size_t *idx, size_t n, uint64_t deadline)
{
	mpart *p = calloc(1, sizeof(*p));

	if (p == NULL)
		return NULL;
	if (idx == NULL) {
		/* Every key: the caller's arrays, borrowed for the op's life. */
		p->keys = keys;
		p->vals = vals;
		p->borrowed = true;
	} else {
		kv_bytes *k = malloc(n * sizeof(kv_bytes));
		kv_bytes *v = vals ? malloc(n * sizeof(kv_bytes)) : NULL;
		p->keys = k;
		p->vals = v;
		p->idx = malloc(n * sizeof(size_t));
		if (k == NULL || p->idx == NULL || (vals && v == NULL)) {
			mpart_free(p);
			return NULL;
		}
		for (size_t i = 0; i < n; i++) {
			p->idx[i] = idx[i];
			k[i] = keys[idx[i]];
			if (vals)
				v[i] = vals[idx[i]];
		}
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
 * Routes every pending part with cfg: a part whose keys all go to one node
 * (its own or a new one) keeps its identity (and request id); others are
 * split into new parts.
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
		/* Most often every key still goes to one node: no split made. */
		uint32_t one = kv_config_route(cfg, p->keys[0].p, p->keys[0].len);
		size_t same = 1;
		while (same < p->n &&
		       kv_config_route(cfg, p->keys[same].p, p->keys[same].len) == one)
			same++;
		/* Every key still goes to one node, the same or another (a new
		 * primary, or the range moved with its exactly-once memory): the
		 * part keeps its request id, so that a node holding the first
		 * attempt's outcome answers it from memory instead of applying
		 * it again. Only a split makes new parts (new ids). */
		if (same == p->n) {
			p->node = one;
			if ((rv = mparts_push(&out, p)) != KV_OK)
				goto err;
			l->v[i] = NULL;
			continue;
		}
		if ((rv = kvc_split_keys(cfg, p->n, p->keys, &parts, &np)) != KV_OK)
			goto err;
		if (np == 1) {
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
				gidx[k] = mpart_at(p, parts[j].idx[k]);
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

/* ---------------------------------------------------------------------------
 * The multi-key machine: mget and mput, blocking or async
 * ------------------------------------------------------------------------- */

#define MRUN_FETCH_MS   1000u /* one configuration fetch of the retry thread, at most */
#define MRUN_BACKOFF_MS 100u  /* the longest backoff between rounds */

typedef struct mrun mrun;

/* Runs once every part of m is done (err set, or its reply kept); may free
 * m. On a library thread: an nng callback, the retry thread, or the
 * submitting thread when nothing could be sent. */
typedef void (*mrun_fin_fn)(mrun *m);

/*
 * One mget or mput, driven by the completions of its parts. A round routes
 * every part that is not done with one configuration (mparts_route),
 * submits them all (kvc_submit_to) and counts them in `left`; the
 * completion that brings it to 0 classifies the answers (round_end): when
 * every part is done, fin runs; else the next round is a task of the
 * engine's retry thread (mrun_task), which waits for the backoff, redials
 * the servers that gave no connection, fetches a newer configuration when
 * one is needed, and starts the round there. Nothing waits on an nng thread:
 * a completion there only classifies; the first round starts on the
 * submitting thread (which may be a callback's, as for the single-key async
 * ops), every later one on the retry thread. The blocking calls run the
 * same machine and wait on a latch.
 */
struct mrun {
	kvc_req task;          /* first: the retry thread's wait (kvc_defer) */
	shardkv_client *c;     /* the handle */
	kv_op_kind kind;       /* KV_OP_MGET or KV_OP_MPUT */
	size_t n;              /* keys */
	const kv_bytes *keys;  /* the keys (borrowed for the op's life) */
	const kv_bytes *vals;  /* mput: the values, likewise */
	mparts l;              /* the parts */
	uint64_t deadline;     /* the op's deadline (kv_now_ns) */
	uint64_t min_epoch;    /* the next round needs at least this epoch (0: any) */
	uint64_t epoch;        /* this round's epoch */
	uint32_t backoff;      /* the next backoff, ms */
	bool progress;         /* this round finished some part */
	bool refresh;          /* a part's node was `down`: re-read the configuration */
	uint64_t down_since;   /* when a round first found a part's node `down` (0: none) */
	uint64_t ttl_ms;       /* mput: every key expires this long after the write (0: never) */
	atomic_uint left;      /* this round's parts still out, plus one while it starts */
	int rv;                /* 0, or KV_ENOMEM (then l is empty) */
	int why_err;           /* the code of the last failure noted (0: none) */
	char why[KVC_WHY_LEN]; /* its detail: the caller's thread error at the end */
	mrun_fin_fn fin;       /* the end */
	void *owner;           /* for fin */
};

/* Notes a failure's detail, as kvc_fail would on the caller's thread. */
static void mrun_why(mrun *m, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void
mrun_why(mrun *m, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(m->why, sizeof(m->why), fmt, ap);
	va_end(ap);
	m->why_err = err;
}

/* Every part not done ends with err. */
static void
mrun_fail_rest(mrun *m, int err, const char *why)
{
	for (size_t i = 0; i < m->l.n; i++)
		if (!m->l.v[i]->done) {
			m->l.v[i]->done = true;
			m->l.v[i]->err = err;
		}
	mrun_why(m, err, "%s", why);
}

static void mrun_task(kvc_req *q, int err, kv_data_result *r);

/* The next round, on the retry thread at `at` (kv_now_ns). */
static void
mrun_defer(mrun *m, uint64_t at)
{
	int rv = kvc_defer(&m->task, at);

	if (rv != KV_OK)
		mrun_task(&m->task, rv, NULL); /* fails what is left */
}

/* When the next round may start after one without progress: after the
 * backoff (bounded by the deadline), which then doubles. */
static uint64_t
mrun_backoff(mrun *m)
{
	uint32_t left = kvc_remaining_ms(m->deadline);
	uint32_t ms = m->backoff < left ? m->backoff : left;

	m->backoff = m->backoff * 2 > MRUN_BACKOFF_MS ? MRUN_BACKOFF_MS : m->backoff * 2;
	return kv_now_ns() + (uint64_t)ms * 1000000u;
}

/* Classifies the round's answers (the last part's completion): finishes m,
 * or schedules the next round. */
static void
round_end(mrun *m)
{
	uint64_t e = m->epoch;
	size_t pending = 0;

	for (size_t i = 0; i < m->l.n; i++) {
		mpart *p = m->l.v[i];
		kv_data_result *r = &p->res;
		if (p->done)
			continue;
		if (p->down) {
			/* Not sent: wait for another primary or the node's return,
			 * then give up (a refusal of the whole range). */
			p->err = KV_EUNAVAIL;
			mrun_why(m, KV_EUNAVAIL, "node %u (%s) is down in epoch %llu", p->node,
			         p->address ? p->address : "?", (unsigned long long)e);
			if (kv_now_ns() - m->down_since >= (uint64_t)KVC_DOWN_GIVEUP_MS * 1000000u)
				p->done = true;
			m->refresh = true;
			continue;
		}
		if (p->rv != KV_OK) {
			p->err = p->rv == KV_ECLOSED ? KV_EUNAVAIL : p->rv;
			if (p->rv == KV_EUNAVAIL && p->address) /* no connection came */
				p->redial = true;               /* by the retry thread */
			if (!kvc_retryable(p->rv) && p->rv != KV_EPROTO) {
				p->done = true;
				mrun_why(m, p->err, "server %s: %s", p->address ? p->address : "?",
				         kv_strerror(p->err));
			}
			m->min_epoch = e + 1;
			continue;
		}
		int st = p->req.status != KV_OK ? p->req.status : r->status;
		if (p->req.srv_epoch > e && p->req.srv_epoch > m->min_epoch)
			m->min_epoch = p->req.srv_epoch;
		if (r->has_hint && r->hint.epoch > e && r->hint.epoch > m->min_epoch)
			m->min_epoch = r->hint.epoch;
		p->err = st;
		if (!kvc_retryable(st)) {
			p->done = true;
			m->progress = true;
			if (st != KV_OK && st != KV_ENOTFOUND)
				mrun_why(m, st, "server %s: %s", p->address,
				         kvc_req_detail(&p->req)[0] ? kvc_req_detail(&p->req)
				                                    : kv_strerror(st));
			continue;
		}
		if (st == KV_EWRONGOWNER && m->min_epoch == 0)
			m->min_epoch = e + 1;
		kv_data_result_fini(r);
	}
	for (size_t i = 0; i < m->l.n; i++)
		pending += !m->l.v[i]->done;
	if (pending == 0) {
		m->fin(m);
		return;
	}
	if (kvc_remaining_ms(m->deadline) == 0) {
		for (size_t i = 0; i < m->l.n; i++) {
			mpart *p = m->l.v[i];
			if (p->done)
				continue;
			p->done = true;
			if (p->err == KV_EWRONGOWNER || p->err == KV_EMOVING ||
			    p->err == KV_EBUSY || p->err == KV_ESTALE)
				p->err = KV_ETIMEDOUT;
			mrun_why(m, p->err, "server %s: %s", p->address ? p->address : "?",
			         kv_strerror(p->err));
		}
		m->fin(m);
		return;
	}
	mrun_defer(m, m->progress ? kv_now_ns() : mrun_backoff(m));
}

/* A part's request finished: keeps its answer; the last one ends the round. */
static void
part_done(kvc_req *q, int rv, kv_data_result *r)
{
	mpart *p = q->arg;
	mrun *m = p->m;

	p->rv = rv;
	if (rv == KV_OK && r != NULL) {
		p->res = *r; /* its buffers are the part's now */
		memset(r, 0, sizeof(*r));
		p->res.error = NULL; /* the detail was copied to q->why */
	}
	if (atomic_fetch_sub(&m->left, 1) == 1)
		round_end(m);
}

/* Routes the parts with ref (taken) and submits every one not done; the
 * last completion ends the round. The submitting thread or the retry
 * thread. */
static void
round_start(mrun *m, kvc_cfgref *ref)
{
	int rv;

	m->min_epoch = 0;
	if ((rv = mparts_route(m->c, &m->l, ref->cfg, m->keys, m->vals, m->kind)) != KV_OK) {
		kvc_cfg_put(ref);
		mparts_fini(&m->l);
		m->rv = rv;
		mrun_why(m, rv, "out of memory");
		m->fin(m);
		return;
	}
	m->epoch = ref->cfg->epoch;
	m->progress = false;
	/* One count held while submitting, so that parts answered meanwhile
	 * do not end the round before every part is out. */
	atomic_store(&m->left, 1);
	for (size_t i = 0; i < m->l.n; i++) {
		mpart *p = m->l.v[i];
		const char *a;
		if (p->done)
			continue;
		free(p->address);
		p->address = NULL;
		kv_data_result_fini(&p->res);
		kvc_req_fini(&p->req);
		p->m = m;
		p->epoch = m->epoch;
		p->down = false;
		a = node_address(ref->cfg, p->node);
		if (a == NULL || (p->address = strdup(a)) == NULL) {
			p->rv = a == NULL ? KV_EUNAVAIL : KV_ENOMEM;
			continue;
		}
		const kv_node *nd = kv_config_node(ref->cfg, p->node);
		if (nd != NULL && nd->state == KV_NODE_DOWN) {
			/* Nothing answers there (doc/contract.md §2). */
			p->down = true;
			p->rv = KV_EUNAVAIL;
			if (m->down_since == 0)
				m->down_since = kv_now_ns();
			continue;
		}
		/* Field by field (no compound literal copied per part). */
		memset(&p->req, 0, sizeof(p->req));
		p->req.c = m->c;
		p->req.op.kind = p->kind;
		p->req.op.request_id = p->op_id;
		p->req.op.retry = p->tried;
		p->tried = true;
		p->req.op.nkeys = p->n;
		p->req.op.keys = p->keys;
		p->req.op.nvals = p->vals ? p->n : 0;
		p->req.op.vals = p->vals;
		p->req.op.ttl_ms = p->kind == KV_OP_MPUT ? m->ttl_ms : 0;
		p->req.deadline_ns = p->deadline;
		p->req.done = part_done;
		p->req.arg = p;
		/* Once taken, p is its completion's to write (p->rv too). */
		p->rv = KV_OK;
		atomic_fetch_add(&m->left, 1);
		if ((rv = kvc_submit_to(&p->req, p->address, p->epoch)) != KV_OK) {
			p->rv = rv; /* not taken: it never finishes */
			atomic_fetch_sub(&m->left, 1);
		}
	}
	kvc_cfg_put(ref);
	if (atomic_fetch_sub(&m->left, 1) == 1)
		round_end(m);
}

/* The retry thread's part of m: the wait is over (err 0) or the handle is
 * closing (err KV_ECLOSED, what is left fails): redials the servers that
 * gave no connection, fetches the configuration the next round needs, and
 * starts it. */
static void
mrun_task(kvc_req *q, int err, kv_data_result *r)
{
	mrun *m = (mrun *)q;
	kvc_cfgref *ref = NULL;
	int rv;

	(void)r;
	if (err != KV_OK) {
		mrun_fail_rest(m, err,
		               err == KV_ECLOSED ? "the handle is closing"
		                                 : "cannot start the retry thread");
		m->fin(m);
		return;
	}
	for (size_t i = 0; i < m->l.n; i++) {
		mpart *p = m->l.v[i];
		if (p->redial && !p->done && p->address != NULL)
			kvc_conn_redial(m->c, p->address); /* not on an nng thread */
		p->redial = false;
	}
	/* Bounded, so that one slow fetch does not hold every retry. */
	uint64_t d = kv_now_ns() + (uint64_t)MRUN_FETCH_MS * 1000000u;
	uint64_t min = m->min_epoch;
	bool only_refresh = false;
	if (min == 0 && m->refresh && kvc_refresh_due(m->c, kv_now_ns()) &&
	    (ref = kvc_cfg_peek(m->c)) != NULL) {
		/* A part's node was down: one fetch of what the controller has
		 * now (shared with the handle's other retries); if it fails, the
		 * cached configuration does. */
		min = ref->cfg->epoch + 1;
		only_refresh = true;
		kvc_cfg_put(ref);
		ref = NULL;
	}
	m->refresh = false;
	rv = kvc_cfg_get(m->c, min, d < m->deadline ? d : m->deadline, &ref);
	if (rv != KV_OK && only_refresh && (ref = kvc_cfg_peek(m->c)) != NULL)
		rv = KV_OK;
	if (rv != KV_OK) {
		if (!kvc_retryable(rv) || kvc_ctl_refused() || kvc_remaining_ms(m->deadline) == 0) {
			mrun_fail_rest(m, rv, shardkv_errmsg());
			m->fin(m);
			return;
		}
		mrun_defer(m, mrun_backoff(m));
		return;
	}
	round_start(m, ref);
}

static void
mrun_init(mrun *m, shardkv_client *c, kv_op_kind kind, size_t n, const kv_bytes *keys,
          const kv_bytes *vals, uint64_t deadline, mrun_fin_fn fin, void *owner)
{
	memset(m, 0, sizeof(*m));
	m->task.c = c;
	m->task.done = mrun_task;
	m->c = c;
	m->kind = kind;
	m->n = n;
	m->keys = keys;
	m->vals = vals;
	m->deadline = deadline;
	m->backoff = 1;
	m->fin = fin;
	m->owner = owner;
}

/*
 * Starts m: its first part (every key), then the first round. With
 * fetch_here, a configuration that is not cached yet is fetched on the
 * calling thread (a blocking call, so that a refusal is reported as the
 * controller states it); else the retry thread fetches it. Returns 0 (fin
 * will run) or KV_ENOMEM (it will not).
 */
static int
mrun_start(mrun *m, bool fetch_here)
{
	mpart *p0;
	kvc_cfgref *ref;
	int rv;

	p0 = mpart_new(m->c, m->kind, m->keys, m->vals, NULL, m->n, m->deadline);
	if (p0 == NULL || mparts_push(&m->l, p0) != KV_OK) {
		mpart_free(p0);
		return KV_ENOMEM;
	}
	if ((ref = kvc_cfg_peek(m->c)) == NULL) {
		if (!fetch_here) {
			mrun_defer(m, kv_now_ns());
			return KV_OK;
		}
		rv = kvc_cfg_get(m->c, 0, m->deadline, &ref);
		if (rv != KV_OK) {
			if (!kvc_retryable(rv) || kvc_ctl_refused() ||
			    kvc_remaining_ms(m->deadline) == 0) {
				mrun_fail_rest(m, rv, shardkv_errmsg());
				m->fin(m);
				return KV_OK;
			}
			mrun_defer(m, mrun_backoff(m));
			return KV_OK;
		}
	}
	round_start(m, ref);
	return KV_OK;
}

/* A blocking call's end: wakes its waiter. */
static void
mrun_wake(mrun *m)
{
	kvc_latch_down(m->owner);
}

/*
 * Runs a multi-key op to completion on the calling thread's behalf: every
 * part ends done, with err 0 and its reply kept, or with its error (the
 * thread's error detail says the last). Returns 0 or KV_ENOMEM (then l is
 * empty).
 */
static int
multi_run(shardkv_client *c, kv_op_kind kind, size_t n, const kv_bytes *keys, const kv_bytes *vals,
          uint64_t ttl_ms, mparts *l)
{
	kvc_latch lt;
	mrun m;
	int rv;

	kvc_latch_init(&lt, 1);
	mrun_init(&m, c, kind, n, keys, vals, kvc_deadline(c), mrun_wake, &lt);
	m.ttl_ms = ttl_ms;
	kvc_may_wait(true); /* the first round's sends, on this thread */
	rv = mrun_start(&m, true);
	kvc_may_wait(false);
	if (rv != KV_OK) {
		kvc_latch_fini(&lt);
		mparts_fini(&m.l);
		return rv;
	}
	kvc_latch_wait(&lt);
	kvc_latch_fini(&lt);
	if (m.why_err != KV_OK)
		kvc_fail(m.why_err, "%s", m.why);
	*l = m.l;
	return m.rv;
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

/* An mget's result from its finished parts (l) of n keys: sets *out on 0
 * and KV_ENOTFOUND, the thread's error detail otherwise. */
static int
mget_collect(size_t n, mparts *lp, shardkv_mget_result **out)
{
	shardkv_mget_result *res = NULL;
	mparts l = *lp;
	bool *missing = NULL;
	int rv;

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
			missing[mpart_at(p, r->missing[j])] = true;
		}
		if (r->nvalues != p->n) {
			rv = kvc_fail(KV_EPROTO, "server %s: %zu values for %zu keys", p->address,
			              r->nvalues, p->n);
			goto out;
		}
		for (size_t j = 0; j < p->n; j++) {
			size_t at = mpart_at(p, j);
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
	return rv;
}

int
shardkv_mget(shardkv_client *c, size_t n, const shardkv_bytes *keys, shardkv_mget_result **out)
{
	mparts l = {0};
	kv_bytes *k = NULL;
	int rv;

	kvc_clear_error();
	if (c == NULL || out == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	if ((rv = check_keys(n, keys, &k)) != KV_OK)
		return rv;
	if ((rv = multi_run(c, KV_OP_MGET, n, k, NULL, 0, &l)) == KV_OK)
		rv = mget_collect(n, &l, out);
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

static int mput_collect(mparts *lp, shardkv_mput_result **out);

int
shardkv_mput(shardkv_client *c, size_t nkeys, const shardkv_bytes *keys, size_t nvals,
             const shardkv_bytes *vals, shardkv_mput_result **out)
{
	return shardkv_mput_ex(c, nkeys, keys, nvals, vals, 0, out);
}

int
shardkv_mput_ex(shardkv_client *c, size_t nkeys, const shardkv_bytes *keys, size_t nvals,
                const shardkv_bytes *vals, uint64_t ttl_ms, shardkv_mput_result **out)
{
	mparts l = {0};
	kv_bytes *k = NULL, *v = NULL;
	int rv;

	kvc_clear_error();
	if (c == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	if (ttl_ms > KV_MAX_TTL_MS)
		return kvc_fail(KV_EINVAL, "TTL of %llu ms over the limit of %llu",
		                (unsigned long long)ttl_ms, (unsigned long long)KV_MAX_TTL_MS);
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
	if ((rv = multi_run(c, KV_OP_MPUT, nkeys, k, v, ttl_ms, &l)) != KV_OK)
		goto out;
	rv = mput_collect(&l, out);
out:
	mparts_fini(&l);
	free(k);
	free(v);
	return rv;
}

/* An mput's result from its finished parts: the first part's error (the
 * thread's error detail set), *out (when not NULL) listing the parts that
 * failed. Returns KV_ENOMEM without a result. */
static int
mput_collect(mparts *lp, shardkv_mput_result **out)
{
	shardkv_mput_result *res = NULL;
	mparts l = *lp;
	int rv, first = KV_OK;

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

/* A scan in progress: the blocking scan and the async one run page by page
 * on it. */
typedef struct {
	kv_buf cur;      /* where the next page starts */
	kv_buf end;      /* the scan's end (empty: none) */
	kv_buf pend;     /* the prefix's end */
	kv_bytes prefix; /* borrowed from the caller's arguments */
	size_t limit;    /* entries at most (0: no limit) */
	bool keys_only;  /* values left empty */
	bool finished;   /* the range is read to its end */
	kvc_entries acc; /* the entries so far */
	kvc_span *spans; /* the page in flight's plan (its first span) */
	size_t nspans;   /* entries */
} scan_st;

/* Checks the arguments and sets s up (zero it first). Returns 0, or an error
 * with the thread's error detail; scan_fini frees s either way. */
static int
scan_begin(scan_st *s, const shardkv_scan_args *a)
{
	if (kv_range_is_empty(a->start.data, a->start.len, a->end.data, a->end.len))
		return kvc_fail(KV_EINVAL, "empty or inverted range");
	if (a->start.len > KV_HARD_MAX_KEY || a->end.len > KV_HARD_MAX_KEY ||
	    a->prefix.len > KV_HARD_MAX_KEY)
		return kvc_fail(KV_ETOOBIG, "range bound longer than the key limit");
	s->prefix = (kv_bytes){a->prefix.data, a->prefix.len};
	s->limit = a->limit;
	s->keys_only = a->keys_only;
	if (kv_buf_set(&s->cur, a->start.data, a->start.len) != KV_OK ||
	    kv_buf_set(&s->end, a->end.data, a->end.len) != KV_OK)
		return KV_ENOMEM;
	/* A prefix narrows the range to [prefix, prefix_end). */
	if (a->prefix.len) {
		if (kv_buf_reserve(&s->pend, a->prefix.len) != KV_OK)
			return KV_ENOMEM;
		kv_prefix_end(a->prefix.data, a->prefix.len, s->pend.data, &s->pend.len);
		if (kv_key_cmp(s->cur.data, s->cur.len, a->prefix.data, a->prefix.len) < 0 &&
		    kv_buf_set(&s->cur, a->prefix.data, a->prefix.len) != KV_OK)
			return KV_ENOMEM;
		if (s->pend.len &&
		    (s->end.len == 0 ||
		     kv_key_cmp(s->pend.data, s->pend.len, s->end.data, s->end.len) < 0) &&
		    kv_buf_set(&s->end, s->pend.data, s->pend.len) != KV_OK)
			return KV_ENOMEM;
		if (kv_range_is_empty(s->cur.data, s->cur.len, s->end.data, s->end.len))
			s->finished = true;
	}
	return KV_OK;
}

/* Whether another page is to be read. */
static bool
scan_more(const scan_st *s)
{
	return !s->finished && !(s->limit && s->acc.n >= s->limit);
}

/* The next page under cfg: the first span of what is left, served by one
 * node. *op borrows from s until scan_page_done. Returns 0 or KV_ENOMEM. */
static int
scan_page(scan_st *s, const kv_config *cfg, kv_op *op)
{
	int rv;

	kvc_spans_free(s->spans, s->nspans);
	s->spans = NULL;
	s->nspans = 0;
	rv = kvc_scan_plan(cfg, (kv_bytes){s->cur.data, s->cur.len},
	                   (kv_bytes){s->end.data, s->end.len}, &s->spans, &s->nspans);
	if (rv != KV_OK)
		return rv;
	memset(op, 0, sizeof(*op));
	op->kind = KV_OP_SCAN;
	op->keys_only = s->keys_only;
	op->start = (kv_bytes){s->cur.data, s->cur.len};
	op->end = (kv_bytes){s->spans[0].end.data, s->spans[0].end.len};
	op->prefix = s->prefix;
	if (s->limit) {
		size_t left = s->limit - s->acc.n;
		op->limit = left > 100000 ? 100000 : (uint32_t)left;
	}
	return KV_OK;
}

/* Takes the page's answer r (status OK; its entries' buffers are taken) and
 * moves to where the next page starts. Returns 0 or an error. */
static int
scan_page_done(scan_st *s, kv_data_result *r)
{
	kvc_span *sp = &s->spans[0];
	int rv;

	long added = kvc_entries_merge(&s->acc, r->entries, r->nentries, s->limit);
	if (added < 0)
		return (int)added;
	if (s->limit && s->acc.n >= s->limit && (size_t)added < r->nentries) {
		/* Cut short inside this page: resume after the last key taken. */
		const kv_buf *last = &s->acc.entries[s->acc.n - 1].key;
		if (kv_buf_set(&s->cur, last->data, last->len) != KV_OK ||
		    kv_buf_append(&s->cur, "", 1) != KV_OK)
			return KV_ENOMEM;
		rv = KV_OK;
	} else if (r->more && r->next_cursor.len &&
	           kv_key_cmp(r->next_cursor.data, r->next_cursor.len, s->cur.data, s->cur.len) >
	               0) {
		rv = kv_buf_set(&s->cur, r->next_cursor.data, r->next_cursor.len);
	} else if (r->more && r->nentries > 0) {
		/* No usable cursor: continue after the last key returned. */
		const kv_buf *last = &r->entries[r->nentries - 1].key;
		kv_buf tmp = {0};
		rv = kv_buf_set(&tmp, last->data ? last->data : (const uint8_t *)"", last->len);
		if (rv == KV_OK)
			rv = kv_buf_append(&tmp, "", 1);
		if (rv == KV_OK) {
			kv_buf_fini(&s->cur);
			s->cur = tmp;
		} else {
			kv_buf_fini(&tmp);
		}
	} else if (r->more) {
		rv = kvc_fail(KV_EPROTO, "server said more without a cursor or entries");
	} else if (sp->end.len == 0 || (s->end.len && kv_key_cmp(sp->end.data, sp->end.len,
	                                                         s->end.data, s->end.len) >= 0)) {
		s->finished = true;
		rv = KV_OK;
	} else {
		rv = kv_buf_set(&s->cur, sp->end.data, sp->end.len);
	}
	kvc_spans_free(s->spans, s->nspans);
	s->spans = NULL;
	s->nspans = 0;
	if (rv != KV_OK)
		return rv;
	if (!s->finished && s->end.len &&
	    kv_key_cmp(s->cur.data, s->cur.len, s->end.data, s->end.len) >= 0)
		s->finished = true;
	return KV_OK;
}

/* The scan's result (its entries taken from s). Returns 0 or KV_ENOMEM. */
static int
scan_collect(scan_st *s, shardkv_scan_result **out)
{
	shardkv_scan_result *res;
	kvc_entries *acc = &s->acc;

	if ((res = calloc(1, sizeof(*res))) == NULL)
		return KV_ENOMEM;
	if (acc->n && (res->entries = calloc(acc->n, sizeof(shardkv_entry))) == NULL)
		goto nomem;
	for (size_t i = 0; i < acc->n; i++) {
		kv_data_entry *e = &acc->entries[i];
		res->entries[i].key.data = e->key.data;
		res->entries[i].key.len = e->key.len;
		if (e->value.data == NULL && (e->value.data = calloc(1, 1)) == NULL)
			goto nomem;
		res->entries[i].value.data = e->value.data;
		res->entries[i].value.len = e->value.len;
		memset(e, 0, sizeof(*e));
		res->n++;
	}
	res->more = !s->finished;
	if (res->more) {
		res->next.data = s->cur.data;
		res->next.len = s->cur.len;
		memset(&s->cur, 0, sizeof(s->cur));
		if (res->next.data == NULL && (res->next.data = calloc(1, 1)) == NULL)
			goto nomem;
	}
	*out = res;
	return KV_OK;
nomem:
	shardkv_scan_result_free(res);
	return KV_ENOMEM;
}

/* Frees what s holds. */
static void
scan_fini(scan_st *s)
{
	kvc_spans_free(s->spans, s->nspans);
	kvc_entries_fini(&s->acc);
	kv_buf_fini(&s->cur);
	kv_buf_fini(&s->end);
	kv_buf_fini(&s->pend);
}

int
shardkv_scan_ex(shardkv_client *c, const shardkv_scan_args *a, shardkv_scan_result **out)
{
	scan_st s = {0};
	int rv;

	kvc_clear_error();
	if (c == NULL || a == NULL || out == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	if ((rv = scan_begin(&s, a)) != KV_OK)
		goto out;
	while (scan_more(&s)) {
		uint64_t deadline = kvc_deadline(c); /* per page: a scan may take long */
		kvc_cfgref *ref = NULL;
		kv_op op;
		kv_data_result r;

		if ((rv = kvc_cfg_get(c, 0, deadline, &ref)) != KV_OK)
			goto out;
		rv = scan_page(&s, ref->cfg, &op);
		kvc_cfg_put(ref);
		if (rv != KV_OK)
			goto out;
		rv = kvc_run_routed(c, &op, op.start, deadline, &r);
		if (rv == KV_OK && r.status != KV_OK) {
			rv = r.status;
			kv_data_result_fini(&r);
		}
		if (rv != KV_OK)
			goto out;
		rv = scan_page_done(&s, &r);
		kv_data_result_fini(&r);
		if (rv != KV_OK)
			goto out;
	}
	rv = scan_collect(&s, out);
out:
	scan_fini(&s);
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
	async_rec_free(a);
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
 * Async mget, mput and scan: the same machines, ended by a callback
 * ------------------------------------------------------------------------- */

enum { MULTI_MGET, MULTI_MPUT, MULTI_SCAN };

/* The caller's callback, of the op's kind. */
typedef union {
	shardkv_mget_done_fn mget;
	shardkv_mput_done_fn mput;
	shardkv_scan_done_fn scan;
} multi_done;

/*
 * One async multi-key op: its copies of the arguments and its machine. An
 * mget or mput is an mrun whose fin builds the result and calls back; a
 * scan reads one page at a time as a routed req (page), each next page
 * started by the retry thread (m.task), as a page's plan may have to make
 * a server's queue. The op counts as pending (kvc_pending_take) from its
 * submission until its callback has returned.
 */
typedef struct {
	mrun m;               /* first: mget/mput's machine; a scan uses its task */
	shardkv_client *c;    /* the handle */
	int kind;             /* MULTI_* */
	size_t n;             /* keys (and values for mput) */
	kv_bytes *keys;       /* n, pointing into buf */
	kv_bytes *vals;       /* mput: n, pointing into buf */
	shardkv_scan_args sa; /* scan: pointing into buf */
	scan_st s;            /* scan: its progress */
	kvc_req page;         /* scan: the page in flight */
	uint32_t page_ms;     /* scan: each page's deadline, fixed at submission */
	multi_done done;      /* the caller's callback */
	void *arg;            /* its argument */
	uint8_t *buf;         /* the copied bytes (owned) */
} multi_op;

static void
multi_free(multi_op *m)
{
	mparts_fini(&m->m.l);
	scan_fini(&m->s);
	kvc_req_fini(&m->page);
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

/* An async mget or mput is done: its result as the blocking call makes it
 * (and the thread's error detail as it leaves it), the callback, the end. */
static void
multi_fin(mrun *mr)
{
	multi_op *m = (multi_op *)mr;
	shardkv_client *c = m->c;

	kvc_clear_error();
	if (mr->why_err != KV_OK)
		kvc_fail(mr->why_err, "%s", mr->why);
	if (m->kind == MULTI_MGET) {
		shardkv_mget_result *r = NULL;
		int rv = mr->rv != KV_OK ? mr->rv : mget_collect(m->n, &mr->l, &r);
		m->done.mget(m->arg, closing_status(c, rv), r);
	} else {
		shardkv_mput_result *r = NULL;
		int rv = mr->rv != KV_OK ? mr->rv : mput_collect(&mr->l, &r);
		m->done.mput(m->arg, closing_status(c, rv), r);
	}
	multi_free(m);
	kvc_pending_release(c); /* last: c may be freed once it is released */
}

/* An async scan ends with rv (its detail `why` when not 0). */
static void
scan_end(multi_op *m, int rv, const char *why)
{
	shardkv_client *c = m->c;
	shardkv_scan_result *r = NULL;

	kvc_clear_error();
	if (rv != KV_OK)
		kvc_fail(rv, "%s", why);
	else
		rv = scan_collect(&m->s, &r);
	m->done.scan(m->arg, closing_status(c, rv), r);
	multi_free(m);
	kvc_pending_release(c);
}

static void scan_page_cb(kvc_req *q, int rv, kv_data_result *r);

/* The retry thread's part of an async scan: the next page, or the end. */
static void
scan_task(kvc_req *q, int err, kv_data_result *unused)
{
	multi_op *m = (multi_op *)q;
	shardkv_client *c = m->c;
	kvc_cfgref *ref = NULL;
	int rv;

	(void)unused;
	if (err != KV_OK) {
		scan_end(m, err,
		         err == KV_ECLOSED ? "the handle is closing"
		                           : "cannot start the retry thread");
		return;
	}
	if (!scan_more(&m->s)) {
		scan_end(m, KV_OK, "");
		return;
	}
	uint64_t deadline = kv_now_ns() + (uint64_t)m->page_ms * 1000000u;
	kvc_clear_error();
	if ((rv = kvc_cfg_get(c, 0, deadline, &ref)) != KV_OK) {
		scan_end(m, rv, shardkv_errmsg());
		return;
	}
	kv_op op;
	rv = scan_page(&m->s, ref->cfg, &op);
	kvc_cfg_put(ref);
	if (rv != KV_OK) {
		scan_end(m, rv, kv_strerror(rv));
		return;
	}
	kvc_req_fini(&m->page);
	memset(&m->page, 0, sizeof(m->page));
	m->page.c = c;
	m->page.op = op;
	m->page.key = op.start;
	m->page.deadline_ns = deadline;
	m->page.done = scan_page_cb;
	m->page.arg = m;
	if ((rv = kvc_submit_routed(&m->page)) != KV_OK)
		scan_end(m, rv, "the handle is closing");
}

/* A page of an async scan is answered (any library thread). */
static void
scan_page_cb(kvc_req *q, int rv, kv_data_result *r)
{
	multi_op *m = q->arg;

	if (rv == KV_OK && r == NULL)
		rv = KV_EPROTO;
	if (rv == KV_OK && r->status != KV_OK)
		rv = r->status;
	if (rv != KV_OK) {
		scan_end(m, rv, kvc_req_detail(q));
		return;
	}
	kvc_clear_error();
	if ((rv = scan_page_done(&m->s, r)) != KV_OK) {
		scan_end(m, rv, shardkv_errmsg()[0] ? shardkv_errmsg() : kv_strerror(rv));
		return;
	}
	/* The next page is planned (and may make a queue) on the retry thread. */
	if ((rv = kvc_defer(&m->m.task, kv_now_ns())) != KV_OK)
		scan_end(m, rv, "the handle is closing");
}

/* Copies n byte strings into m->buf from offset *off; sets out[i]. */
static void
copy_bytes(multi_op *m, size_t *off, size_t n, const shardkv_bytes *in, kv_bytes *out)
{
	for (size_t i = 0; i < n; i++) {
		if (in[i].len)
			memcpy(m->buf + *off, in[i].data, in[i].len);
		out[i].p = m->buf + *off;
		out[i].len = in[i].len;
		*off += in[i].len;
	}
}

/* Sums the lengths of n byte strings, checking each as a key (or a value). */
static int
sum_bytes(size_t n, const shardkv_bytes *b, bool key, size_t *total)
{
	for (size_t i = 0; i < n; i++) {
		int rv;
		if (b[i].data == NULL && b[i].len)
			return kvc_fail(KV_EINVAL, "null key or value");
		if ((rv = key ? check_key(b[i].data, b[i].len) : check_value(b[i].len)) != KV_OK)
			return rv;
		if (b[i].len > SIZE_MAX - *total)
			return kvc_fail(KV_ETOOBIG, "arguments too large");
		*total += b[i].len;
	}
	return KV_OK;
}

/* Checks, copies and starts an async multi-key op. */
static int
multi_submit(shardkv_client *c, int kind, size_t n, const shardkv_bytes *keys, size_t nvals,
             const shardkv_bytes *vals, uint64_t ttl_ms, const shardkv_scan_args *sa,
             multi_done done, void *arg)
{
	multi_op *m;
	size_t total = 0, off = 0;
	int rv;

	kvc_clear_error();
	if (c == NULL || done.mget == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	if (ttl_ms > KV_MAX_TTL_MS)
		return kvc_fail(KV_EINVAL, "TTL of %llu ms over the limit of %llu",
		                (unsigned long long)ttl_ms, (unsigned long long)KV_MAX_TTL_MS);
	if (kind == MULTI_SCAN) {
		if (sa == NULL || (sa->start.data == NULL && sa->start.len) ||
		    (sa->end.data == NULL && sa->end.len) ||
		    (sa->prefix.data == NULL && sa->prefix.len))
			return kvc_fail(KV_EINVAL, "null argument");
		total = sa->start.len + sa->end.len + sa->prefix.len;
	} else {
		if (n == 0 || (n && keys == NULL) ||
		    (kind == MULTI_MPUT && (nvals != n || vals == NULL)))
			return kvc_fail(KV_EINVAL, "no keys, or as many values as keys needed");
		if ((rv = sum_bytes(n, keys, true, &total)) != KV_OK ||
		    (kind == MULTI_MPUT && (rv = sum_bytes(n, vals, false, &total)) != KV_OK))
			return rv;
	}
	if ((m = calloc(1, sizeof(*m))) == NULL)
		return kvc_fail(KV_ENOMEM, "out of memory");
	m->c = c;
	m->kind = kind;
	m->n = n;
	m->done = done;
	m->arg = arg;
	if ((m->buf = malloc(total ? total : 1)) == NULL ||
	    (kind != MULTI_SCAN && (m->keys = calloc(n, sizeof(*m->keys))) == NULL) ||
	    (kind == MULTI_MPUT && (m->vals = calloc(n, sizeof(*m->vals))) == NULL)) {
		multi_free(m);
		return kvc_fail(KV_ENOMEM, "out of memory");
	}
	mrun_init(&m->m, c, kind == MULTI_MGET ? KV_OP_MGET : KV_OP_MPUT, n, m->keys, m->vals,
	          kvc_deadline(c), multi_fin, m);
	m->m.ttl_ms = ttl_ms;
	if (kind == MULTI_SCAN) {
		kv_bytes b[3];
		shardkv_bytes in[3] = {sa->start, sa->end, sa->prefix};
		copy_bytes(m, &off, 3, in, b);
		m->sa = *sa;
		m->sa.start = (shardkv_bytes){b[0].p, b[0].len};
		m->sa.end = (shardkv_bytes){b[1].p, b[1].len};
		m->sa.prefix = (shardkv_bytes){b[2].p, b[2].len};
		if ((rv = scan_begin(&m->s, &m->sa)) != KV_OK) {
			multi_free(m);
			return rv == KV_ENOMEM ? kvc_fail(rv, "out of memory") : rv;
		}
		m->page_ms = kvc_remaining_ms(m->m.deadline);
		m->m.task.done = scan_task;
	} else {
		copy_bytes(m, &off, n, keys, m->keys);
		if (kind == MULTI_MPUT)
			copy_bytes(m, &off, n, vals, m->vals);
	}
	if ((rv = kvc_pending_take(c)) != KV_OK) {
		multi_free(m);
		return rv;
	}
	if (kind == MULTI_SCAN) {
		/* Every page is planned and sent from the retry thread. */
		if ((rv = kvc_defer(&m->m.task, kv_now_ns())) != KV_OK) {
			multi_free(m);
			kvc_pending_release(c);
			return kvc_fail(rv, "%s",
			                rv == KV_ECLOSED ? "the handle is closing"
			                                 : "cannot start the retry thread");
		}
		return KV_OK;
	}
	if ((rv = mrun_start(&m->m, false)) != KV_OK) {
		multi_free(m);
		kvc_pending_release(c);
		return kvc_fail(rv, "out of memory");
	}
	return KV_OK;
}

int
shardkv_mget_async(shardkv_client *c, size_t n, const shardkv_bytes *keys,
                   shardkv_mget_done_fn done, void *arg)
{
	return multi_submit(c, MULTI_MGET, n, keys, 0, NULL, 0, NULL, (multi_done){.mget = done},
	                    arg);
}

int
shardkv_mput_async(shardkv_client *c, size_t nkeys, const shardkv_bytes *keys, size_t nvals,
                   const shardkv_bytes *vals, shardkv_mput_done_fn done, void *arg)
{
	return multi_submit(c, MULTI_MPUT, nkeys, keys, nvals, vals, 0, NULL,
	                    (multi_done){.mput = done}, arg);
}

int
shardkv_mput_ex_async(shardkv_client *c, size_t nkeys, const shardkv_bytes *keys, size_t nvals,
                      const shardkv_bytes *vals, uint64_t ttl_ms, shardkv_mput_done_fn done,
                      void *arg)
{
	return multi_submit(c, MULTI_MPUT, nkeys, keys, nvals, vals, ttl_ms, NULL,
	                    (multi_done){.mput = done}, arg);
}

int
shardkv_scan_async(shardkv_client *c, const shardkv_scan_args *a, shardkv_scan_done_fn done,
                   void *arg)
{
	return multi_submit(c, MULTI_SCAN, 0, NULL, 0, NULL, 0, a, (multi_done){.scan = done}, arg);
}

/* ---------------------------------------------------------------------------
 * Expiry, conditional writes, incr, exists, count, delrange
 * ------------------------------------------------------------------------- */

/* Checks the options of a put; sets op's ttl and condition. */
static int
put_options(kv_op *op, const shardkv_put_options *opt)
{
	if (opt == NULL)
		return KV_OK;
	if (opt->if_absent && opt->if_equal)
		return kvc_fail(KV_EINVAL, "if-absent and if-equal together");
	if (opt->ttl_ms > KV_MAX_TTL_MS)
		return kvc_fail(KV_EINVAL, "TTL of %llu ms over the limit of %llu",
		                (unsigned long long)opt->ttl_ms, (unsigned long long)KV_MAX_TTL_MS);
	if (opt->if_equal && opt->expect.data == NULL && opt->expect.len)
		return kvc_fail(KV_EINVAL, "null expected value");
	op->ttl_ms = opt->ttl_ms;
	if (opt->if_absent)
		op->cond = KV_COND_IF_ABSENT;
	if (opt->if_equal) {
		op->cond = KV_COND_IF_EQUAL;
		op->expect = (kv_bytes){opt->expect.data, opt->expect.len};
	}
	return check_value(op->expect.len);
}

/* Runs a single-key op; on 0 *r is its result whatever its status (the
 * thread's error detail set when it is not OK): the caller frees it. */
static int
single_res(shardkv_client *c, kv_op *op, kv_data_result *r)
{
	int rv;

	kvc_clear_error();
	if ((rv = check_key(op->key.p, op->key.len)) != KV_OK ||
	    (rv = check_value(op->value.len)) != KV_OK ||
	    (rv = check_value(op->expect.len)) != KV_OK)
		return rv;
	return kvc_run_routed(c, op, op->key, kvc_deadline(c), r);
}

/* The key's current value after a failed condition: data NULL when absent. */
static int
take_current(kv_data_result *r, shardkv_buf *cur)
{
	if (cur == NULL)
		return KV_OK;
	cur->data = NULL;
	cur->len = 0;
	if (r->current_absent)
		return KV_OK;
	return take_value(&r->value, cur);
}

/* A conditional write's end: 0, or its status with *cur for a failed
 * condition. Frees r. */
static int
cond_end(kv_data_result *r, shardkv_buf *cur)
{
	int rv = r->status;

	if ((rv == KV_EEXISTS || rv == KV_EMISMATCH) && take_current(r, cur) != KV_OK)
		rv = kvc_fail(KV_ENOMEM, "out of memory");
	kv_data_result_fini(r);
	return rv;
}

int
shardkv_put_ex(shardkv_client *c, const void *key, size_t klen, const void *val, size_t vlen,
               const shardkv_put_options *opt, shardkv_buf *current)
{
	kv_op op = {.kind = KV_OP_PUT, .key = {key, klen}, .value = {val, vlen}};
	kv_data_result r;
	int rv;

	kvc_clear_error();
	if (c == NULL || (val == NULL && vlen))
		return kvc_fail(KV_EINVAL, "null argument");
	if ((rv = put_options(&op, opt)) != KV_OK)
		return rv;
	op.request_id = kvc_next_id(c);
	if ((rv = single_res(c, &op, &r)) != KV_OK)
		return rv;
	return cond_end(&r, current);
}

int
shardkv_del_if_equal(shardkv_client *c, const void *key, size_t klen, const void *expect,
                     size_t elen, shardkv_buf *current)
{
	kv_op op = {.kind = KV_OP_DEL,
	            .key = {key, klen},
	            .no_value = true,
	            .cond = KV_COND_IF_EQUAL,
	            .expect = {expect, elen}};
	kv_data_result r;
	int rv;

	kvc_clear_error();
	if (c == NULL || (expect == NULL && elen))
		return kvc_fail(KV_EINVAL, "null argument");
	op.request_id = kvc_next_id(c);
	if ((rv = single_res(c, &op, &r)) != KV_OK)
		return rv;
	return cond_end(&r, current);
}

int
shardkv_expire(shardkv_client *c, const void *key, size_t klen, uint64_t ttl_ms)
{
	kv_op op = {.kind = KV_OP_EXPIRE, .key = {key, klen}, .ttl_ms = ttl_ms};
	kv_data_result r;
	int rv;

	kvc_clear_error();
	if (c == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	if (ttl_ms == 0 || ttl_ms > KV_MAX_TTL_MS)
		return kvc_fail(KV_EINVAL, "TTL must be 1..%llu ms",
		                (unsigned long long)KV_MAX_TTL_MS);
	op.request_id = kvc_next_id(c);
	if ((rv = single(c, &op, &r)) != KV_OK)
		return rv;
	kv_data_result_fini(&r);
	return KV_OK;
}

int
shardkv_persist(shardkv_client *c, const void *key, size_t klen)
{
	kv_op op = {.kind = KV_OP_EXPIRE, .key = {key, klen}, .persist = true};
	kv_data_result r;
	int rv;

	if (c == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	op.request_id = kvc_next_id(c);
	if ((rv = single(c, &op, &r)) != KV_OK)
		return rv;
	kv_data_result_fini(&r);
	return KV_OK;
}

int
shardkv_ttl(shardkv_client *c, const void *key, size_t klen, int64_t *ms_left)
{
	kv_op op = {.kind = KV_OP_TTL, .key = {key, klen}};
	kv_data_result r;
	int rv;

	if (c == NULL || ms_left == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	if ((rv = single(c, &op, &r)) != KV_OK)
		return rv;
	if (r.ttl_ms < -1) {
		kv_data_result_fini(&r);
		return kvc_fail(KV_EPROTO, "server answered a TTL of %lld ms", (long long)r.ttl_ms);
	}
	*ms_left = r.ttl_ms;
	kv_data_result_fini(&r);
	return KV_OK;
}

int
shardkv_incr(shardkv_client *c, const void *key, size_t klen, int64_t delta, int64_t *result)
{
	kv_op op = {.kind = KV_OP_INCR, .key = {key, klen}, .delta = delta};
	kv_data_result r;
	int rv;

	if (c == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	op.request_id = kvc_next_id(c);
	if ((rv = single(c, &op, &r)) != KV_OK)
		return rv;
	if (result)
		*result = r.number;
	kv_data_result_fini(&r);
	return KV_OK;
}

int
shardkv_exists(shardkv_client *c, const void *key, size_t klen)
{
	kv_op op = {.kind = KV_OP_EXISTS, .key = {key, klen}};
	kv_data_result r;
	int rv;

	if (c == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	if ((rv = single(c, &op, &r)) != KV_OK)
		return rv;
	kv_data_result_fini(&r);
	return KV_OK;
}

/*
 * count and delrange: the range is walked in key order like a scan, one
 * step per request, each clipped to the span one node serves now
 * (kvc_scan_plan) and routed by where it starts; a step that says `more`
 * continues at its next_cursor, one that does not at the span's end. The
 * counts of the steps are summed. A delrange step is a write: it has its
 * own request id, kept across its retries.
 */
static int
range_walk(shardkv_client *c, kv_op_kind kind, const void *start, size_t slen, const void *end,
           size_t elen, uint64_t *total)
{
	uint64_t deadline, sum = 0;
	kv_buf cur = {0}, stop = {0};
	kvc_span *spans = NULL;
	size_t nspans = 0;
	int rv;

	kvc_clear_error();
	if (c == NULL || (start == NULL && slen) || (end == NULL && elen))
		return kvc_fail(KV_EINVAL, "null argument");
	if (slen > KV_HARD_MAX_KEY || elen > KV_HARD_MAX_KEY)
		return kvc_fail(KV_ETOOBIG, "range bound longer than the key limit");
	if (kv_range_is_empty(start, slen, end, elen))
		return kvc_fail(KV_EINVAL, "empty or inverted range");
	if (kv_buf_set(&cur, start, slen) != KV_OK || kv_buf_set(&stop, end, elen) != KV_OK) {
		rv = kvc_fail(KV_ENOMEM, "out of memory");
		goto out;
	}
	deadline = kvc_deadline(c);
	for (;;) {
		kvc_cfgref *ref;
		kv_data_result r;
		kv_op op = {.kind = kind};

		if ((rv = kvc_cfg_get(c, 0, deadline, &ref)) != KV_OK)
			goto out;
		kvc_spans_free(spans, nspans);
		spans = NULL;
		nspans = 0;
		rv = kvc_scan_plan(ref->cfg, (kv_bytes){cur.data, cur.len},
		                   (kv_bytes){stop.data, stop.len}, &spans, &nspans);
		kvc_cfg_put(ref);
		if (rv != KV_OK || nspans == 0) {
			rv = kvc_fail(rv != KV_OK ? rv : KV_EINTERNAL, "cannot plan the range");
			goto out;
		}
		op.start = (kv_bytes){cur.data, cur.len};
		op.end = (kv_bytes){spans[0].end.data, spans[0].end.len};
		if (kind == KV_OP_DELRANGE)
			op.request_id = kvc_next_id(c);
		if ((rv = kvc_run_routed(c, &op, op.start, deadline, &r)) != KV_OK)
			goto out;
		if ((rv = r.status) != KV_OK) {
			kv_data_result_fini(&r);
			goto out;
		}
		sum += r.count;
		if (r.more) {
			if (r.next_cursor.len == 0 ||
			    kv_key_cmp(r.next_cursor.data, r.next_cursor.len, cur.data, cur.len) <=
			        0) {
				kv_data_result_fini(&r);
				rv = kvc_fail(KV_EPROTO,
				              "server said more without a cursor past the start");
				goto out;
			}
			rv = kv_buf_set(&cur, r.next_cursor.data, r.next_cursor.len);
			kv_data_result_fini(&r);
		} else {
			kv_data_result_fini(&r);
			kvc_span *sp = &spans[0];
			if (sp->end.len == 0 || (stop.len && kv_key_cmp(sp->end.data, sp->end.len,
			                                                stop.data, stop.len) >= 0))
				break;
			rv = kv_buf_set(&cur, sp->end.data, sp->end.len);
		}
		if (rv != KV_OK) {
			rv = kvc_fail(KV_ENOMEM, "out of memory");
			goto out;
		}
		if (stop.len && kv_key_cmp(cur.data, cur.len, stop.data, stop.len) >= 0)
			break;
	}
	*total = sum;
	rv = KV_OK;
out:
	kvc_spans_free(spans, nspans);
	kv_buf_fini(&cur);
	kv_buf_fini(&stop);
	return rv;
}

int
shardkv_count(shardkv_client *c, const void *start, size_t slen, const void *end, size_t elen,
              uint64_t *count)
{
	if (count == NULL)
		return kvc_fail(KV_EINVAL, "null argument");
	return range_walk(c, KV_OP_COUNT, start, slen, end, elen, count);
}

int
shardkv_delrange(shardkv_client *c, const void *start, size_t slen, const void *end, size_t elen,
                 uint64_t *deleted)
{
	uint64_t n = 0;
	int rv = range_walk(c, KV_OP_DELRANGE, start, slen, end, elen, &n);

	if (rv == KV_OK && deleted)
		*deleted = n;
	return rv;
}

/* An async op of this section: its request, its callback and its copies of
 * key, value and expected value. */
typedef struct {
	kvc_req req;               /* first: the engine hands back &req */
	shardkv_done_fn done;      /* put_ex, del_if_equal, expire, persist, exists */
	shardkv_num_done_fn ndone; /* ttl, incr */
	void *arg;                 /* their argument */
	uint8_t buf[];             /* key, value, expected value */
} async_ex;

static void
async_ex_done(kvc_req *q, int rv, kv_data_result *r)
{
	async_ex *a = (async_ex *)q;
	int st = rv != KV_OK ? rv : r == NULL ? KV_EPROTO : r->status;

	if (a->ndone) {
		int64_t n = 0;
		if (st == KV_OK)
			n = a->req.op.kind == KV_OP_TTL ? r->ttl_ms : r->number;
		a->ndone(a->arg, st, n);
	} else if ((st == KV_EEXISTS || st == KV_EMISMATCH) && r != NULL && !r->current_absent) {
		a->done(a->arg, st, r->value.data ? r->value.data : (const void *)"", r->value.len);
	} else {
		a->done(a->arg, st, NULL, 0);
	}
	kvc_req_fini(q);
	free(a);
}

/* Checks t's key, copies t's bytes and submits a copy of t. */
static int
submit_ex(shardkv_client *c, const kv_op *t, shardkv_done_fn done, shardkv_num_done_fn ndone,
          void *arg)
{
	size_t klen = t->key.len, vlen = t->value.len, elen = t->expect.len;
	async_ex *a;
	int rv;

	if (c == NULL || (done == NULL && ndone == NULL) || (t->key.p == NULL && klen) ||
	    (t->value.p == NULL && vlen) || (t->expect.p == NULL && elen))
		return kvc_fail(KV_EINVAL, "null argument");
	if ((rv = check_key(t->key.p, klen)) != KV_OK || (rv = check_value(vlen)) != KV_OK ||
	    (rv = check_value(elen)) != KV_OK)
		return rv;
	if ((a = calloc(1, sizeof(*a) + klen + vlen + elen)) == NULL)
		return kvc_fail(KV_ENOMEM, "out of memory");
	memcpy(a->buf, t->key.p, klen);
	if (vlen)
		memcpy(a->buf + klen, t->value.p, vlen);
	if (elen)
		memcpy(a->buf + klen + vlen, t->expect.p, elen);
	a->done = done;
	a->ndone = ndone;
	a->arg = arg;
	a->req.c = c;
	a->req.op = *t;
	a->req.op.key = (kv_bytes){a->buf, klen};
	a->req.op.value = (kv_bytes){a->buf + klen, vlen};
	a->req.op.expect = (kv_bytes){a->buf + klen + vlen, elen};
	bool write = t->kind != KV_OP_TTL && t->kind != KV_OP_EXISTS && t->kind != KV_OP_GET;
	a->req.op.request_id = write ? kvc_next_id(c) : 0;
	a->req.key = a->req.op.key;
	a->req.deadline_ns = kvc_deadline(c);
	a->req.done = async_ex_done;
	kvc_cfgref *ref = kvc_cfg_peek(c); /* as submit_with: the first op fetches */
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

int
shardkv_put_ex_async(shardkv_client *c, const void *key, size_t klen, const void *val, size_t vlen,
                     const shardkv_put_options *opt, shardkv_done_fn done, void *arg)
{
	kv_op t = {.kind = KV_OP_PUT, .key = {key, klen}, .value = {val, vlen}};
	int rv;

	kvc_clear_error();
	if ((rv = put_options(&t, opt)) != KV_OK)
		return rv;
	return submit_ex(c, &t, done, NULL, arg);
}

int
shardkv_del_if_equal_async(shardkv_client *c, const void *key, size_t klen, const void *expect,
                           size_t elen, shardkv_done_fn done, void *arg)
{
	kv_op t = {.kind = KV_OP_DEL,
	           .key = {key, klen},
	           .no_value = true,
	           .cond = KV_COND_IF_EQUAL,
	           .expect = {expect, elen}};

	kvc_clear_error();
	return submit_ex(c, &t, done, NULL, arg);
}

int
shardkv_expire_async(shardkv_client *c, const void *key, size_t klen, uint64_t ttl_ms,
                     shardkv_done_fn done, void *arg)
{
	kv_op t = {.kind = KV_OP_EXPIRE, .key = {key, klen}, .ttl_ms = ttl_ms};

	kvc_clear_error();
	if (ttl_ms == 0 || ttl_ms > KV_MAX_TTL_MS)
		return kvc_fail(KV_EINVAL, "TTL must be 1..%llu ms",
		                (unsigned long long)KV_MAX_TTL_MS);
	return submit_ex(c, &t, done, NULL, arg);
}

int
shardkv_persist_async(shardkv_client *c, const void *key, size_t klen, shardkv_done_fn done,
                      void *arg)
{
	kv_op t = {.kind = KV_OP_EXPIRE, .key = {key, klen}, .persist = true};

	kvc_clear_error();
	return submit_ex(c, &t, done, NULL, arg);
}

int
shardkv_exists_async(shardkv_client *c, const void *key, size_t klen, shardkv_done_fn done,
                     void *arg)
{
	kv_op t = {.kind = KV_OP_EXISTS, .key = {key, klen}};

	kvc_clear_error();
	return submit_ex(c, &t, done, NULL, arg);
}

int
shardkv_ttl_async(shardkv_client *c, const void *key, size_t klen, shardkv_num_done_fn done,
                  void *arg)
{
	kv_op t = {.kind = KV_OP_TTL, .key = {key, klen}};

	kvc_clear_error();
	return submit_ex(c, &t, NULL, done, arg);
}

int
shardkv_incr_async(shardkv_client *c, const void *key, size_t klen, int64_t delta,
                   shardkv_num_done_fn done, void *arg)
{
	kv_op t = {.kind = KV_OP_INCR, .key = {key, klen}, .delta = delta};

	kvc_clear_error();
	return submit_ex(c, &t, NULL, done, arg);
}
