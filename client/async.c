/*
 * async.c - the asynchronous single-key ops of libshardkv
 * (shardkv_get_async and friends, include/shardkv.h).
 *
 * An op is routed with the cached configuration (and the remembered owner
 * hints) without blocking and queued on its server's async queue. Each
 * server has ASYNC_SLOTS request slots (an nng context with its aio, kept
 * for the life of the handle). With no request in flight, whatever is
 * queued leaves at once as one Request (up to ASYNC_MAX_OPS ops and
 * ASYNC_MAX_BYTES); with one in flight, a further slot is used only once
 * ASYNC_MORE_OPS ops wait, else the reply's callback sends them. Fewer,
 * fuller requests: on two cores shared by client and server, 50 callers
 * ran 1.2-1.4x faster this way than with four slots always open. No thread
 * waits per op, so one caller thread can keep hundreds of ops in flight and
 * the messages per op fall with the queue length.
 *
 * A refusal that names a retry (WRONG_OWNER, MOVING, STALE, BUSY) goes to
 * the handle's retry thread with a time to try again: at once after a
 * WRONG_OWNER that came with the owner's hint (the hint is also remembered
 * for the range, as the blocking calls do), else after a backoff of 1 ms
 * doubling to 100 ms; the thread fetches a newer configuration first when
 * the server knew of one, then routes the op again, asynchronously, with
 * its request id unchanged. So a range that moves under thousands of async
 * ops costs them a round trip or a backoff each, not a thread each. An op
 * whose request got no answer at all (a lost connection, a timeout) is
 * retried by the blocking path instead (ops.c, kvc_run_routed), run on the
 * retry thread within the op's deadline: the server may be gone, and that
 * path asks the controller for news.
 *
 * Locks: kvc_aconn.mu protects a server's queue and slot flags; c->async_mu
 * protects the retry queue, the pending count and async_closing. They are
 * leaves and never held together, nor across a callback or a network call.
 */
#include "client/client_int.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ASYNC_SLOTS     4u
#define ASYNC_MORE_OPS  16u /* queued ops that open a further slot */
#define ASYNC_MAX_OPS   128u
#define ASYNC_MAX_BYTES (1024u * 1024u)

typedef struct kvc_aop kvc_aop;
typedef struct kvc_aconn kvc_aconn;

struct kvc_aop {
	shardkv_client *c;    /* the handle */
	kvc_op op;            /* key and value point into buf */
	uint64_t deadline_ns; /* the caller's deadline */
	uint64_t epoch;       /* routing epoch */
	shardkv_done_fn done; /* the caller's callback */
	void *arg;            /* its argument */
	uint64_t min_epoch;   /* route with at least this epoch (0: any) */
	uint64_t not_before;  /* retry: not before this time (ns) */
	uint32_t backoff_ms;  /* retry: the next backoff */
	int last;             /* retry: the last refusal */
	bool blocking;        /* retry: by the blocking path */
	kvc_aop *next;        /* queue link */
	uint8_t buf[];        /* key, then value */
};

typedef struct {
	kvc_aconn *ac;               /* its server */
	kv_rpc_async *rpc;           /* context and aio */
	bool busy;                   /* a request is on the wire (under ac->mu) */
	size_t n;                    /* ops in it */
	kvc_aop *ops[ASYNC_MAX_OPS]; /* them */
} kvc_aslot;

struct kvc_aconn {
	shardkv_client *c;    /* the handle */
	pthread_mutex_t mu;   /* protects head, tail, queued, closed and the slots' busy flags */
	kvc_aop *head, *tail; /* ops waiting for a slot, oldest first */
	size_t queued;        /* ops in that queue */
	bool closed;          /* shardkv_close has taken the queue */
	kvc_aslot slot[ASYNC_SLOTS];
	kvc_aconn *next; /* every server's queue, in c->aconns */
};

/* Runs the caller's callback and frees the op. */
static void
complete(kvc_aop *op, int status, const void *val, size_t vlen)
{
	shardkv_client *c = op->c;

	op->done(op->arg, status, val, vlen);
	free(op);
	pthread_mutex_lock(&c->async_mu);
	if (--c->async_pending == 0)
		pthread_cond_broadcast(&c->async_cv);
	pthread_mutex_unlock(&c->async_mu);
}

/* Hands op to the retry thread (or completes it when closing). */
static void
to_retry(kvc_aop *op)
{
	shardkv_client *c = op->c;

	pthread_mutex_lock(&c->async_mu);
	if (!c->async_closing) {
		op->next = NULL;
		if (c->rq_tail)
			c->rq_tail->next = op;
		else
			c->rq_head = op;
		c->rq_tail = op;
		pthread_cond_signal(&c->async_cv);
		pthread_mutex_unlock(&c->async_mu);
		return;
	}
	pthread_mutex_unlock(&c->async_mu);
	complete(op, KV_ECLOSED, NULL, 0);
}

/* Schedules an op refused with `st` for another try: at once after a
 * hint, else after its backoff. */
static void
retry_later(kvc_aop *op, int st, bool now)
{
	uint64_t t = kv_now_ns();

	op->last = st;
	if (now) {
		op->not_before = t;
	} else {
		op->not_before = t + (uint64_t)op->backoff_ms * 1000000u;
		op->backoff_ms = op->backoff_ms * 2 > 100 ? 100 : op->backoff_ms * 2;
	}
	to_retry(op);
}

/* Fills free slots with what is queued and sends. Takes ac->mu. */
static void
pump(kvc_aconn *ac)
{
	shardkv_client *c = ac->c;

	for (;;) {
		kvc_aslot *sl = NULL;
		kvc_aop *late = NULL;
		size_t bytes = 0;

		unsigned busy = 0;
		pthread_mutex_lock(&ac->mu);
		for (size_t i = 0; i < ASYNC_SLOTS; i++) {
			if (ac->slot[i].busy)
				busy++;
			else if (sl == NULL)
				sl = &ac->slot[i];
		}
		/* With a request in flight, another goes out only for a batch
		 * worth a message: fewer, fuller requests cost the server less
		 * per op, and its reply will take what queued meanwhile. */
		if (ac->head == NULL || (busy > 0 && ac->queued < ASYNC_MORE_OPS))
			sl = NULL;
		if (sl == NULL) {
			pthread_mutex_unlock(&ac->mu);
			return;
		}
		sl->n = 0;
		while (ac->head != NULL && sl->n < ASYNC_MAX_OPS) {
			kvc_aop *op = ac->head;
			size_t b = op->op.key.len + op->op.value.len;
			if (sl->n > 0 && bytes + b > ASYNC_MAX_BYTES)
				break;
			ac->head = op->next;
			op->next = NULL;
			ac->queued--;
			if (kvc_remaining_ms(op->deadline_ns) == 0) {
				op->next = late; /* answered below, outside the lock */
				late = op;
				continue;
			}
			sl->ops[sl->n++] = op;
			bytes += b;
		}
		if (ac->head == NULL)
			ac->tail = NULL;
		sl->busy = sl->n > 0;
		pthread_mutex_unlock(&ac->mu);
		while (late != NULL) {
			kvc_aop *next = late->next;
			complete(late, KV_ETIMEDOUT, NULL, 0);
			late = next;
		}
		if (sl->n == 0)
			continue;

		const kvc_op *ops[ASYNC_MAX_OPS];
		uint64_t deadline = 0;
		nng_msg *req;
		for (size_t i = 0; i < sl->n; i++) {
			ops[i] = &sl->ops[i]->op;
			if (sl->ops[i]->deadline_ns > deadline)
				deadline = sl->ops[i]->deadline_ns;
		}
		kvc_envelope env = {
		    .client_id = c->client_id,
		    .request_id = kvc_next_id(c),
		    .epoch = sl->ops[0]->epoch,
		    .auth = {.p = c->auth.data, .len = c->auth.len},
		    .timeout_ms = kvc_attempt_ms(deadline),
		};
		if (kvc_encode_request_batch(&env, ops, sl->n, &req) != KV_OK) {
			size_t n = sl->n;
			kvc_aop *taken[ASYNC_MAX_OPS];
			memcpy(taken, sl->ops, n * sizeof(taken[0]));
			pthread_mutex_lock(&ac->mu);
			sl->busy = false;
			pthread_mutex_unlock(&ac->mu);
			for (size_t i = 0; i < n; i++)
				to_retry(taken[i]);
			continue;
		}
		kv_rpc_async_call(sl->rpc, req, env.timeout_ms);
	}
}

/* A slot's request is answered (or failed): completes its ops. */
static void
slot_done(void *arg, int rv, nng_msg *rep)
{
	kvc_aslot *sl = arg;
	kvc_aconn *ac = sl->ac;
	size_t n = sl->n;
	kvc_aop *ops[ASYNC_MAX_OPS];
	kvc_reply *rp[ASYNC_MAX_OPS];

	memcpy(ops, sl->ops, n * sizeof(ops[0]));
	kvc_reply local[ASYNC_MAX_OPS];
	for (size_t i = 0; i < n; i++)
		rp[i] = &local[i];
	if (rv == KV_OK) {
		rv = kvc_decode_reply_batch(nng_msg_body(rep), nng_msg_len(rep), rp, n);
		nng_msg_free(rep);
	}
	/* The slot is free for the next request before the callbacks run. */
	pthread_mutex_lock(&ac->mu);
	sl->busy = false;
	pthread_mutex_unlock(&ac->mu);
	pump(ac);

	for (size_t i = 0; i < n; i++) {
		kvc_reply *r = &local[i];
		kvc_aop *op = ops[i];
		if (rv != KV_OK) {
			/* No answer: the blocking path asks the controller for news. */
			op->blocking = true;
			op->last = rv;
			to_retry(op);
			continue;
		}
		if (r->status != KV_OK) {
			/* The whole request was refused (stale, busy, auth...). */
			if (!kvc_retryable(r->status)) {
				complete(op, r->status, NULL, 0);
			} else {
				if (r->epoch > op->epoch)
					op->min_epoch = r->epoch;
				retry_later(op, r->status, false);
			}
		} else if (!kvc_retryable(r->op_status)) {
			complete(op, r->op_status, r->value.data, r->value.len);
		} else {
			bool hinted = false;
			if (r->hint.set && r->hint.epoch > op->epoch)
				op->min_epoch = r->hint.epoch;
			if (r->epoch > op->epoch && r->epoch > op->min_epoch)
				op->min_epoch = r->epoch;
			if (r->op_status == KV_EWRONGOWNER && r->hint.set) {
				kvc_cfgref *ref = kvc_cfg_peek(ac->c);
				const kv_node *nd = ref && !r->hint.address
				                        ? kv_config_node(ref->cfg, r->hint.node)
				                        : NULL;
				const char *h = r->hint.address ? r->hint.address
				                : nd            ? nd->address
				                                : NULL;
				if (h != NULL) {
					/* Later ops for the range go there directly. */
					kvc_hint_learn(ac->c, op->epoch, &r->hint, h, op->op.key);
					hinted = true;
				}
				kvc_cfg_put(ref);
			} else if (r->op_status == KV_EWRONGOWNER && op->min_epoch == 0) {
				op->min_epoch = op->epoch + 1;
			}
			retry_later(op, r->op_status, hinted);
		}
		kvc_reply_fini(r);
	}
}

/* Frees a queue made by aconn_new (its slots must be idle). */
static void
aconn_free(kvc_aconn *ac)
{
	for (size_t i = 0; i < ASYNC_SLOTS; i++)
		kv_rpc_async_destroy(ac->slot[i].rpc);
	pthread_mutex_destroy(&ac->mu);
	free(ac);
}

/* Returns the async queue of the server at `address`, making it on first use. */
static int
aconn_get(shardkv_client *c, const char *address, kvc_aconn **out)
{
	kv_rpc_client *rpc;
	kvc_coal *q;
	kvc_aconn *ac;
	int rv;

	if ((rv = kvc_conn_get(c, address, &rpc, &q)) != KV_OK)
		return rv;
	pthread_mutex_lock(&q->mu);
	if ((ac = q->aconn) != NULL) {
		pthread_mutex_unlock(&q->mu);
		*out = ac;
		return KV_OK;
	}
	if ((ac = calloc(1, sizeof(*ac))) == NULL) {
		pthread_mutex_unlock(&q->mu);
		return KV_ENOMEM;
	}
	ac->c = c;
	pthread_mutex_init(&ac->mu, NULL);
	for (size_t i = 0; i < ASYNC_SLOTS; i++) {
		ac->slot[i].ac = ac;
		if ((rv = kv_rpc_async_create(rpc, slot_done, &ac->slot[i], &ac->slot[i].rpc)) !=
		    KV_OK) {
			aconn_free(ac);
			pthread_mutex_unlock(&q->mu);
			return rv;
		}
	}
	q->aconn = ac;
	pthread_mutex_unlock(&q->mu);
	pthread_mutex_lock(&c->async_mu);
	ac->next = c->aconns;
	c->aconns = ac;
	pthread_mutex_unlock(&c->async_mu);
	*out = ac;
	return KV_OK;
}

/* Routes op without blocking and queues it, or hands it to the retry thread. */
static void
route(kvc_aop *op)
{
	shardkv_client *c = op->c;
	kvc_cfgref *ref = kvc_cfg_peek(c);
	kvc_aconn *ac = NULL;
	char *addr = NULL;

	if (ref == NULL) {
		op->blocking = true; /* it fetches the configuration */
		to_retry(op);
		return;
	}
	op->epoch = ref->cfg->epoch;
	/* A remembered hint wins; else the configuration's owner, whose
	 * address stays valid while ref is held. */
	addr = kvc_hint_lookup(c, op->epoch, op->op.key);
	const char *to = addr;
	if (to == NULL) {
		const kv_node *n = kv_config_node(
		    ref->cfg, kv_config_route(ref->cfg, op->op.key.p, op->op.key.len));
		to = n ? n->address : NULL;
	}
	int rv = to ? aconn_get(c, to, &ac) : KV_EUNAVAIL;
	kvc_cfg_put(ref);
	free(addr);
	if (rv != KV_OK) {
		op->blocking = true;
		to_retry(op);
		return;
	}
	pthread_mutex_lock(&ac->mu);
	if (ac->closed) {
		pthread_mutex_unlock(&ac->mu);
		complete(op, KV_ECLOSED, NULL, 0);
		return;
	}
	if (ac->tail)
		ac->tail->next = op;
	else
		ac->head = op;
	ac->tail = op;
	ac->queued++;
	pthread_mutex_unlock(&ac->mu);
	pump(ac);
}

/* Runs the blocking path for op and completes it (retry thread). */
static void
retry_blocking(kvc_aop *op)
{
	kvc_reply r;
	int rv = kvc_run_routed(op->c, &op->op, op->op.key, op->deadline_ns, &r);

	if (rv != KV_OK) {
		complete(op, rv, NULL, 0);
	} else {
		complete(op, r.op_status, r.value.data, r.value.len);
		kvc_reply_fini(&r);
	}
}

/* Routes a due op again (retry thread): with a newer configuration first
 * when the server knew of one, unless its deadline has passed. */
static void
retry_route(kvc_aop *op)
{
	shardkv_client *c = op->c;

	if (kvc_remaining_ms(op->deadline_ns) == 0) {
		int st = op->last;
		if (st == KV_EWRONGOWNER || st == KV_EMOVING || st == KV_ESTALE || st == KV_EBUSY)
			st = KV_ETIMEDOUT;
		complete(op, st, NULL, 0);
		return;
	}
	if (op->min_epoch > 0) {
		kvc_cfgref *ref = kvc_cfg_peek(c);
		bool old = ref == NULL || ref->cfg->epoch < op->min_epoch;
		kvc_cfg_put(ref);
		if (old) {
			/* Bounded by a short wait: the watch may bring it meanwhile. */
			uint64_t d = kv_now_ns() + 200000000u;
			if (kvc_cfg_get(c, op->min_epoch, d < op->deadline_ns ? d : op->deadline_ns,
			                &ref) == KV_OK)
				kvc_cfg_put(ref);
		}
		op->min_epoch = 0;
	}
	route(op);
}

/* The retry thread: takes the ops that are due, oldest first, and sleeps
 * until the next one is. */
static void *
retry_main(void *arg)
{
	shardkv_client *c = arg;

	pthread_mutex_lock(&c->async_mu);
	for (;;) {
		uint64_t now = kv_now_ns(), next = UINT64_MAX;
		kvc_aop **pp = &c->rq_head, *prev = NULL, *op = NULL;

		for (kvc_aop *x = c->rq_head; x; prev = x, x = x->next, pp = &prev->next) {
			if (c->async_closing || x->blocking || x->not_before <= now) {
				op = x;
				break;
			}
			if (x->not_before < next)
				next = x->not_before;
		}
		if (op == NULL) {
			if (c->async_closing)
				break;
			if (next == UINT64_MAX) {
				pthread_cond_wait(&c->async_cv, &c->async_mu);
			} else {
				struct timespec ts = {.tv_sec = (time_t)(next / 1000000000u),
				                      .tv_nsec = (long)(next % 1000000000u)};
				pthread_cond_timedwait(&c->async_cv, &c->async_mu, &ts);
			}
			continue;
		}
		*pp = op->next;
		if (c->rq_tail == op)
			c->rq_tail = prev;
		op->next = NULL;
		bool closing = c->async_closing;
		pthread_mutex_unlock(&c->async_mu);
		if (closing)
			complete(op, KV_ECLOSED, NULL, 0);
		else if (op->blocking)
			retry_blocking(op);
		else
			retry_route(op);
		pthread_mutex_lock(&c->async_mu);
	}
	pthread_mutex_unlock(&c->async_mu);
	return NULL;
}

int
kvc_async_submit(shardkv_client *c, kvc_op_kind kind, const void *key, size_t klen, const void *val,
                 size_t vlen, shardkv_done_fn done, void *arg)
{
	kvc_aop *op;

	if ((op = malloc(sizeof(*op) + klen + vlen)) == NULL)
		return kvc_fail(KV_ENOMEM, "out of memory");
	*op = (kvc_aop){
	    .c = c, .done = done, .arg = arg, .deadline_ns = kvc_deadline(c), .backoff_ms = 1};
	if (klen)
		memcpy(op->buf, key, klen);
	if (vlen)
		memcpy(op->buf + klen, val, vlen);
	op->op = (kvc_op){.kind = kind,
	                  .key = {op->buf, klen},
	                  .value = {op->buf + klen, vlen},
	                  .request_id = kind == KVC_GET ? 0 : kvc_next_id(c)};
	pthread_mutex_lock(&c->async_mu);
	if (c->async_closing) {
		pthread_mutex_unlock(&c->async_mu);
		free(op);
		return kvc_fail(KV_ECLOSED, "the handle is closing");
	}
	if (!c->rq_started) {
		if (pthread_create(&c->rq_thread, NULL, retry_main, c) != 0) {
			pthread_mutex_unlock(&c->async_mu);
			free(op);
			return kvc_fail(KV_ENOMEM, "cannot start the retry thread");
		}
		c->rq_started = true;
	}
	c->async_pending++;
	pthread_mutex_unlock(&c->async_mu);
	/* The first op of a handle fetches the configuration here (the only
	 * wait an async call makes), so that the ops after it route at once. */
	kvc_cfgref *ref = kvc_cfg_peek(c);
	if (ref == NULL && kvc_cfg_get(c, 0, op->deadline_ns, &ref) != KV_OK)
		ref = NULL;
	kvc_cfg_put(ref);
	route(op);
	return KV_OK;
}

void
kvc_async_close(shardkv_client *c)
{
	kvc_aconn *list;
	bool started;

	pthread_mutex_lock(&c->async_mu);
	c->async_closing = true;
	pthread_cond_broadcast(&c->async_cv);
	list = c->aconns;
	started = c->rq_started;
	pthread_mutex_unlock(&c->async_mu);
	if (!started)
		return; /* no async op was ever taken */
	for (kvc_aconn *ac = list; ac; ac = ac->next) {
		pthread_mutex_lock(&ac->mu);
		ac->closed = true;
		kvc_aop *op = ac->head;
		ac->head = ac->tail = NULL;
		ac->queued = 0;
		pthread_mutex_unlock(&ac->mu);
		while (op != NULL) {
			kvc_aop *next = op->next;
			complete(op, KV_ECLOSED, NULL, 0);
			op = next;
		}
		/* Requests on the wire are left to finish (answered, or failed at
		 * their timeout, at most half the op's deadline): cancelling a
		 * request context and then closing the socket can hang nng 1.5's
		 * nng_close. */
	}
	pthread_mutex_lock(&c->async_mu);
	while (c->async_pending > 0)
		pthread_cond_wait(&c->async_cv, &c->async_mu);
	pthread_mutex_unlock(&c->async_mu);
	pthread_join(c->rq_thread, NULL);
	while (list != NULL) {
		kvc_aconn *next = list->next;
		aconn_free(list);
		list = next;
	}
}
