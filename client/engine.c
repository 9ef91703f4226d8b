/*
 * engine.c - the one request engine of libshardkv: every data request to a
 * shard server (blocking single-key ops, scan pages, mget/mput parts and the
 * async ops) is a kvc_req queued on its server's connection and sent from
 * one of that connection's request slots.
 *
 * DESIGN. Each server address has a queue (kvc_queue) and ENG_SLOTS request
 * slots, each an asynchronous caller of the rpc layer (common/rpc.h
 * kv_rpc_async: on the server's link and its thread for tcp://, an nng
 * context with its aio over TLS), kept for the life of the handle.
 * Submitting a req queues it and pumps: with no request in flight, whatever
 * is queued leaves at once as one Request (up to ENG_MAX_OPS single-key ops
 * and ENG_MAX_BYTES; an mget, mput or scan goes alone); with one in flight,
 * a further slot is used only once as many ops wait as a request in flight
 * carries on average (at least ENG_MORE_OPS), else the reply's callback
 * sends them. Fewer, fuller requests: on two cores shared by client and
 * server, 50 callers ran 1.2-1.4x faster this way than with four slots
 * always open, and three nodes under 16 ops in flight per caller 1.08x
 * faster with the average than with 16 alone. No thread waits per request: a
 * blocking call is a submit and a wait on its own latch, an mget/mput is one
 * submit per server part and one wait for all of them. A blocking call sends
 * what it submits on its own thread and waits for the send (eng_may_wait): a
 * send's completion handed to nng's threads only to post the receive cost a
 * wake-up per request.
 *
 * Routed reqs (single-key ops and scan pages) are routed here with the
 * cached configuration and the remembered owner hints, and retried here
 * until a final answer or their deadline: a WRONG_OWNER that names the
 * owner is sent there at once (and the hint remembered for its range), a
 * MOVING / STALE / BUSY refusal after a backoff of 1 ms doubling to 100 ms,
 * a request that got no answer after a configuration refresh (the server
 * may be gone); the op's request id never changes, so a write is applied
 * once. Anything that must wait (a backoff, a configuration fetch, a TLS
 * probe) runs on the handle's retry thread, started the first time a req
 * needs it. Part reqs (mget/mput parts) make one attempt at the address
 * they are given; ops.c decides what to do with the answer, so that a part
 * that must be split again is split with a fresh configuration. The retry
 * thread also runs tasks (kvc_defer): the waits of ops.c's mget/mput and
 * scan machines, which are driven by their reqs' completions.
 *
 * FAILOVER (doc/library.md "Failover"). A newer configuration is followed
 * at once (kvc_engine_follow, run by whichever thread installs it): routed
 * reqs queued for a server that lost their key are routed again, and reqs
 * queued for or on the wire to a server marked `down` are taken back and
 * routed again (parts fail for ops.c to split again). A request on the wire
 * is abandoned, not cancelled (cancelling before the socket closes can
 * hang nng 1.5's close): its slot stays busy until its reply or timeout,
 * ignored, and counts as pending so that shardkv_close lets it finish. A
 * send that finds no connection fails after ENG_CONNECT_WAIT_MS; the retry
 * thread then probes for a refused connection and refreshes the
 * configuration (at most one refresh per ENG_REFRESH_MS per handle), as it
 * does before routing to an owner that is `down` in the cache.
 *
 * Locks: kvc_queue.mu protects one server's queue and its slots' flags
 * (and their reqs once on the wire); c->eng_mu protects the retry queue,
 * the list of queues and the count of eng_walkers, and is
 * held where the closing flag is set and the pending count falls to 0 (both
 * atomics otherwise: a req taken or finished while others are pending
 * takes no handle-wide lock); kvc_latch.mu protects a latch's zero flag.
 * All are leaves, never held together, nor across a callback, a completion
 * or a network call. Completions run with no lock held, on the server's
 * link thread or nng's threads (a reply), the retry thread, or the
 * submitting thread (a req refused at once).
 */
#include "client/client_int.h"
#include "common/err.h"
#include "common/log.h"
#include "common/tls.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ENG_SLOTS      4u
#define ENG_MORE_OPS   16u /* queued ops that open a further slot */
#define ENG_MAX_OPS    128u
#define ENG_MAX_BYTES  (1024u * 1024u)
#define ENG_BACKOFF_MS 100u  /* the longest backoff */
#define ENG_FETCH_MS   1000u /* one configuration fetch of the retry thread, at most */
#define ENG_PROBE_MS   1000u /* one TLS probe, at most */
/* A send that finds no connection to its server waits this long for one,
 * then the retry thread finds out why: a refused connection (nothing
 * listens: the server stopped) re-reads the configuration at once. */
#define ENG_CONNECT_WAIT_MS 100u
#define ENG_REFUSE_PROBE_MS 50u  /* one plain connection probe, at most */
#define ENG_REFUSE_MEMO_MS  100u /* how long a probe's outcome is shared */
/* The retry thread's refresh fetches (after no answer, a refused
 * connection, or a route to a `down` node) are at most one per this, so
 * a dead cluster does not make a tight loop at the controller. */
#define ENG_REFRESH_MS 100u
/* A req whose owner is `down` in the cached configuration waits this long
 * (and a refresh) before it is routed again, instead of being sent; after
 * KVC_DOWN_GIVEUP_MS of that it fails as unavailable, as a refused
 * connection does, rather than at its deadline. */
#define ENG_DOWN_WAIT_MS 50u

typedef struct kvc_queue kvc_queue;

/* One request slot of a server. n and reqs are written under sq->mu (by
 * pump, and by kvc_engine_follow, which takes the reqs back from a slot on
 * the wire); pump reads them unlocked only between taking the slot and
 * setting wire, when nothing else touches them. */
typedef struct {
	kvc_queue *sq;              /* its server */
	kv_rpc_async *rpc;          /* context and aio */
	bool busy;                  /* taken by pump until its reply (under sq->mu) */
	bool wire;                  /* its request is encoded and sent (under sq->mu) */
	bool abandoned;             /* its reqs were taken back: the reply is ignored,
	                             * and counts one pending (under sq->mu) */
	size_t n;                   /* reqs in it */
	kvc_req *reqs[ENG_MAX_OPS]; /* them */
} kvc_slot;

struct kvc_queue {
	shardkv_client *c;    /* the handle */
	char *address;        /* the server (owned) */
	pthread_mutex_t mu;   /* protects head, tail, queued, closed and the slots' busy flags */
	kvc_req *head, *tail; /* reqs waiting for a slot, oldest first */
	size_t queued;        /* reqs in that queue */
	bool closed;          /* shardkv_close has taken the queue */

	kvc_slot slot[ENG_SLOTS]; /* request slots (immutable after creation) */
	kvc_queue *next;          /* every queue of the handle, under c->eng_mu */
};

static void to_retry(kvc_req *q);

/* Set while a blocking call submits on this thread (kvc_run_routed, and an
 * mget/mput's first round): pump then sends on this thread and waits for
 * the send (kv_rpc_async_call_wait_send), which saves the hand-off of the
 * send's completion to one of nng's threads. Cleared in slot_done, so that
 * an nng thread never waits for a send. */
static _Thread_local bool eng_may_wait;

/* ---------------------------------------------------------------------------
 * Requests and latches
 * ------------------------------------------------------------------------- */

/* Sets q->why, allocating it on first use (without memory, the code alone
 * says what happened). */
static void why_vset(kvc_req *q, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));

static void
why_vset(kvc_req *q, const char *fmt, va_list ap)
{
	if (q->why == NULL && (q->why = malloc(KVC_WHY_LEN)) == NULL)
		return;
	vsnprintf(q->why, KVC_WHY_LEN, fmt, ap);
}

/* Sets q->why (printf-style). */
static void kvc_req_why(kvc_req *q, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
kvc_req_why(kvc_req *q, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	why_vset(q, fmt, ap);
	va_end(ap);
}

const char *
kvc_req_detail(const kvc_req *q)
{
	return q->why ? q->why : "";
}

void
kvc_req_fini(kvc_req *q)
{
	free(q->why);
	q->why = NULL;
}

void
kvc_latch_init(kvc_latch *l, unsigned count)
{
	pthread_mutex_init(&l->mu, NULL);
	pthread_cond_init(&l->cv, NULL);
	atomic_init(&l->count, count);
	l->zero = count == 0;
}

void
kvc_latch_fini(kvc_latch *l)
{
	pthread_cond_destroy(&l->cv);
	pthread_mutex_destroy(&l->mu);
}

void
kvc_latch_down(kvc_latch *l)
{
	if (atomic_fetch_sub(&l->count, 1) != 1)
		return;
	/* The last one: the waiter returns (and may free l) only once it
	 * sees zero under the lock, so l stays valid until the unlock. */
	pthread_mutex_lock(&l->mu);
	l->zero = true;
	pthread_cond_signal(&l->cv);
	pthread_mutex_unlock(&l->mu);
}

void
kvc_latch_wait(kvc_latch *l)
{
	pthread_mutex_lock(&l->mu);
	while (!l->zero)
		pthread_cond_wait(&l->cv, &l->mu);
	pthread_mutex_unlock(&l->mu);
}

/*
 * Counts one req of the handle as finished. A fall from n > 1 is a bare
 * atomic step; the fall to 0 is made under eng_mu, so that shardkv_close,
 * which waits under eng_mu for 0, cannot see it and free the handle before
 * this thread is done with the lock.
 */
static void
pending_down(shardkv_client *c)
{
	unsigned long n = atomic_load(&c->eng_pending);

	while (n > 1)
		if (atomic_compare_exchange_weak(&c->eng_pending, &n, n - 1))
			return;
	pthread_mutex_lock(&c->eng_mu);
	if (atomic_fetch_sub(&c->eng_pending, 1) == 1)
		pthread_cond_broadcast(&c->eng_cv);
	pthread_mutex_unlock(&c->eng_mu);
}

/*
 * Finishes q: rv 0 with the answer in q->status and *r (a result of the
 * decoded Response, whose buffers the finished req may take; NULL: none),
 * or an error with q->why. A req with a latch moves *r into *q->out (its
 * waiter reads it after the slot's Response is freed) and counts the latch
 * down (its waiter may free q and the handle right after); else its done
 * callback reads *r in place. Then the handle's pending count falls.
 */
static void
complete_with(kvc_req *q, int rv, kv_data_result *r)
{
	shardkv_client *c = q->c;
	kvc_latch *l = q->latch;

	free(q->hint_addr);
	q->hint_addr = NULL;
	free(q->quiet_addr);
	q->quiet_addr = NULL;
	q->rv = rv;
	if (l != NULL) {
		if (rv == KV_OK && r != NULL && q->out != NULL) {
			*q->out = *r;
			memset(r, 0, sizeof(*r));
			q->out->error = NULL;
		}
		pending_down(c);
		kvc_latch_down(l);
		return;
	}
	q->done(q, rv, rv == KV_OK ? r : NULL);
	pending_down(c);
}

/* Finishes q without a result: an error, or rv 0 with a refusal of the
 * whole Response in q->status. */
static void
complete(kvc_req *q, int rv)
{
	complete_with(q, rv, NULL);
}

/* Fails q with code err and a message (printf-style). */
static void fail(kvc_req *q, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void
fail(kvc_req *q, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	why_vset(q, fmt, ap);
	va_end(ap);
	complete(q, err);
}

/* Fails q whose deadline passed, with what stopped it last. */
static void
fail_deadline(kvc_req *q)
{
	int st = q->last;

	if (st == KV_EWRONGOWNER || st == KV_EMOVING || st == KV_ESTALE || st == KV_EBUSY) {
		char tmp[KVC_WHY_LEN];
		snprintf(tmp, sizeof(tmp), "%s", kvc_req_detail(q));
		fail(q, KV_ETIMEDOUT, "timed out while the key's range is moving (%.200s)", tmp);
		return;
	}
	if (kvc_req_detail(q)[0] == 0)
		kvc_req_why(q, "timed out");
	complete(q, st);
}

/* ---------------------------------------------------------------------------
 * Server queues and slots
 * ------------------------------------------------------------------------- */

static void slot_done(void *arg, int rv, nng_msg *rep);
static void slot_finish(void *arg, int rv, nng_msg *rep);

static bool
single_key(const kv_op *op)
{
	switch (op->kind) {
	case KV_OP_GET:
	case KV_OP_PUT:
	case KV_OP_DEL:
	case KV_OP_APPEND:
	case KV_OP_EXPIRE:
	case KV_OP_TTL:
	case KV_OP_INCR:
	case KV_OP_EXISTS:
		return true;
	default: /* mget, mput, scan, count, delrange: a request of their own */
		return false;
	}
}

/* How many queued single-key ops open a further slot while others are in
 * flight: as many as a request in flight carries on average, at least
 * ENG_MORE_OPS, so that a deep pipeline keeps its requests full while a
 * few callers still overlap their requests. Sets *busy to the slots in
 * flight. sq->mu held. */
static size_t
more_ops_locked(const kvc_queue *sq, unsigned *busy)
{
	size_t ops = 0, avg;

	*busy = 0;
	for (size_t i = 0; i < ENG_SLOTS; i++)
		if (sq->slot[i].busy) {
			(*busy)++;
			ops += sq->slot[i].n;
		}
	avg = *busy ? ops / *busy : 0;
	return avg > ENG_MORE_OPS ? avg : ENG_MORE_OPS;
}

/* Fills free slots with what is queued and sends. Takes sq->mu. */
static void
pump(kvc_queue *sq)
{
	shardkv_client *c = sq->c;

	for (;;) {
		kvc_slot *sl = NULL;
		kvc_req *late = NULL;
		size_t bytes = 0;
		unsigned busy = 0;
		/* One clock read per request, not one per op it takes. */
		uint64_t now = kv_now_ns();

		pthread_mutex_lock(&sq->mu);
		size_t more = more_ops_locked(sq, &busy);
		for (size_t i = 0; i < ENG_SLOTS && sl == NULL; i++)
			if (!sq->slot[i].busy)
				sl = &sq->slot[i];
		/* With a request in flight, another goes out only for a batch
		 * worth a message: fewer, fuller requests cost the server less
		 * per op, and its reply will take what queued meanwhile. An op
		 * that is a batch of its own (mget, mput, scan) goes at once. */
		if (sq->head == NULL ||
		    (busy > 0 && sq->queued < more && single_key(&sq->head->op)))
			sl = NULL;
		if (sl == NULL) {
			pthread_mutex_unlock(&sq->mu);
			return;
		}
		sl->n = 0;
		while (sq->head != NULL && sl->n < ENG_MAX_OPS) {
			kvc_req *q = sq->head;
			size_t b = q->op.key.len + q->op.value.len + q->op.expect.len;
			bool alone = !single_key(&q->op);
			if (sl->n > 0 && (alone || bytes + b > ENG_MAX_BYTES))
				break;
			sq->head = q->next;
			q->next = NULL;
			sq->queued--;
			if (now >= q->deadline_ns) {
				q->next = late; /* failed below, outside the lock */
				late = q;
				continue;
			}
			sl->reqs[sl->n++] = q;
			bytes += b;
			if (alone)
				break;
		}
		if (sq->head == NULL)
			sq->tail = NULL;
		/* A slot that took nothing is free again at the unlock, and
		 * another thread may fill it at once: past the unlock only
		 * `mine` says whether it is ours, never sl->n. */
		bool mine = sl->n > 0;
		sl->busy = mine;
		sl->wire = false;
		sl->abandoned = false;
		pthread_mutex_unlock(&sq->mu);
		while (late != NULL) {
			kvc_req *next = late->next;
			if (kvc_req_detail(late)[0] == 0)
				kvc_req_why(late, "timed out waiting to be sent to %s",
				            sq->address);
			fail_deadline(late);
			late = next;
		}
		if (!mine)
			continue;

		/* One op is encoded where it lies; a batch of single-key ops
		 * is gathered into one array (only those are ever batched). */
		kv_op ops[ENG_MAX_OPS];
		uint64_t deadline = 0;
		nng_msg *req;
		int rv;
		for (size_t i = 0; i < sl->n; i++) {
			if (sl->n > 1)
				ops[i] = sl->reqs[i]->op;
			if (sl->reqs[i]->deadline_ns > deadline)
				deadline = sl->reqs[i]->deadline_ns;
		}
		kv_req env = {
		    .client_id = c->client_id,
		    .request_id = kvc_next_id(c),
		    .epoch = sl->reqs[0]->epoch,
		    .auth = {.p = c->auth.data, .len = c->auth.len},
		    .timeout_ms = kvc_attempt_ms(deadline),
		    .nops = sl->n,
		    .ops = sl->n > 1 ? ops : &sl->reqs[0]->op,
		};
		rv = kv_data_req_encode(&env, &req);
		/* Any later send of these ops is a retry (Op.retry): the server may
		 * then refuse a write its exactly-once memory has forgotten. */
		for (size_t i = 0; i < sl->n; i++)
			sl->reqs[i]->op.retry = true;
		if (rv != KV_OK) {
			size_t n = sl->n;
			kvc_req *taken[ENG_MAX_OPS];
			memcpy(taken, sl->reqs, n * sizeof(taken[0]));
			pthread_mutex_lock(&sq->mu);
			sl->busy = false;
			pthread_mutex_unlock(&sq->mu);
			for (size_t i = 0; i < n; i++)
				fail(taken[i], rv, "encoding the request: %s", kv_strerror(rv));
			continue;
		}
		/* From here on kvc_engine_follow may take the reqs back: the
		 * message holds copies of what it needs of them. */
		pthread_mutex_lock(&sq->mu);
		sl->wire = true;
		pthread_mutex_unlock(&sq->mu);
		if (eng_may_wait)
			kv_rpc_async_call_wait_send(sl->rpc, req, env.timeout_ms);
		else
			kv_rpc_async_call(sl->rpc, req, env.timeout_ms);
	}
}

/* Schedules q for another try: at once, or after its backoff. */
static void
retry_later(kvc_req *q, bool now)
{
	uint64_t t = kv_now_ns();

	if (now) {
		q->not_before = t;
	} else {
		q->not_before = t + (uint64_t)q->backoff_ms * 1000000u;
		q->backoff_ms =
		    q->backoff_ms * 2 > ENG_BACKOFF_MS ? ENG_BACKOFF_MS : q->backoff_ms * 2;
	}
	to_retry(q);
}

/* Schedules q for another try in ms milliseconds. */
static void
retry_after(kvc_req *q, uint32_t ms)
{
	q->not_before = kv_now_ns() + (uint64_t)ms * 1000000u;
	to_retry(q);
}

/* A routed req's request got no answer (rv): retry after a configuration
 * refresh (the server may be down or gone), or fail when rv is final. */
static void
no_answer(kvc_req *q, const char *address, int rv)
{
	char refused[300];

	q->last = rv == KV_ECLOSED ? KV_EUNAVAIL : rv;
	/* A refusal found by the retry thread's probe stays the detail. */
	snprintf(refused, sizeof(refused), "server %s: connection refused", address);
	if (rv != KV_EUNAVAIL || q->why == NULL || strcmp(q->why, refused) != 0)
		kvc_req_why(q, "server %s: %s", address, kv_strerror(rv));
	kvc_hint_forget(q->c, address);
	if (!kvc_retryable(rv) && rv != KV_EPROTO) {
		complete(q, q->last);
		return;
	}
	q->refresh = true;
	/* KV_EUNAVAIL: the send found no connection within
	 * ENG_CONNECT_WAIT_MS. The retry thread, at once, kicks the dialer,
	 * finds out whether the connection is refused (over TLS: whether the
	 * handshake is), refreshes the configuration and routes q again
	 * (without memory for the address, it only refreshes). */
	free(q->quiet_addr);
	q->quiet_addr = rv == KV_EUNAVAIL ? strdup(address) : NULL;
	retry_later(q, rv == KV_EUNAVAIL);
}

/* Classifies the answer to routed req q from `address` (q->status, and *r,
 * its result in the decoded Response; err: the Response's detail, NULL when
 * none): completes q or schedules its retry. */
static void
answered(kvc_req *q, const char *address, const char *err, kv_data_result *r)
{
	shardkv_client *c = q->c;

	if (q->status != KV_OK) {
		/* The whole request was refused (stale, busy, auth...). */
		q->last = q->status;
		kvc_req_why(q, "server %s: %s", address, err ? err : kv_strerror(q->status));
		if (q->srv_epoch > q->epoch)
			q->min_epoch = q->srv_epoch;
		/* An unavailable server (its lease ran out, or the range's ISR
		 * is short) may have been replaced: the retry refreshes the
		 * configuration (rate-limited), watched or not. */
		q->refresh |= q->last == KV_EUNAVAIL;
		if (!kvc_retryable(q->last))
			complete(q, q->last);
		else
			retry_later(q, false);
		return;
	}
	if (!kvc_retryable(r->status)) {
		if (r->status != KV_OK)
			kvc_req_why(q, "%s", err ? err : kv_strerror(r->status));
		complete_with(q, KV_OK, r);
		return;
	}
	/* WRONG_OWNER, MOVING or a transient refusal: go where the hint says. */
	bool moved = false;
	q->last = r->status;
	kvc_req_why(q, "server %s: %s", address, err ? err : kv_strerror(r->status));
	if (r->has_hint && r->hint.epoch > q->epoch)
		q->min_epoch = r->hint.epoch;
	if (q->srv_epoch > q->epoch && q->srv_epoch > q->min_epoch)
		q->min_epoch = q->srv_epoch;
	/* A hint from an epoch older than the one q was routed with is the
	 * server's stale view (a backup that has not yet applied the
	 * configuration promoting it names the old primary): it is not
	 * followed, and q tries the same owner again after a backoff. */
	bool stale = r->has_hint && r->hint.epoch != 0 && r->hint.epoch < q->epoch;
	if (r->status == KV_EWRONGOWNER && r->has_hint && !stale) {
		kvc_cfgref *ref = r->hint.address ? NULL : kvc_cfg_peek(c);
		const kv_node *nd = ref ? kv_config_node(ref->cfg, r->hint.node_id) : NULL;
		const char *h = r->hint.address ? r->hint.address : nd ? nd->address : NULL;
		if (h != NULL && strcmp(h, address) != 0) {
			/* Later calls for the hint's range go there directly too. */
			kvc_hint_learn(c, q->epoch, &r->hint, h, q->key);
			q->hint_addr = strdup(h);
			moved = q->hint_addr != NULL;
		}
		kvc_cfg_put(ref);
	}
	if (r->status == KV_EWRONGOWNER && !r->has_hint && q->min_epoch == 0)
		q->min_epoch = q->epoch + 1;
	q->refresh |= r->status == KV_EUNAVAIL; /* as above */
	retry_later(q, moved);
}

int
kvc_reply_decode(const void *p, size_t len, size_t n, kv_resp *d)
{
	int rv = kv_data_resp_decode(p, len, d);

	if (rv != KV_OK) {
		memset(d, 0, sizeof(*d));
		return rv;
	}
	if (d->status == KV_OK && d->nresults != n) {
		kv_data_resp_fini(d);
		memset(d, 0, sizeof(*d));
		return KV_EPROTO;
	}
	return KV_OK;
}

/* A slot's request is answered (or failed): finishes or retries its reqs. */
static void
slot_done(void *arg, int rv, nng_msg *rep)
{
	bool may_wait = eng_may_wait;

	eng_may_wait = false; /* an nng thread (or a failed send: done at once) */
	slot_finish(arg, rv, rep);
	eng_may_wait = may_wait;
}

/* slot_done's work. */
static void
slot_finish(void *arg, int rv, nng_msg *rep)
{
	kvc_slot *sl = arg;
	kvc_queue *sq = sl->sq;
	size_t n;
	bool abandoned;
	kvc_req *reqs[ENG_MAX_OPS];
	kv_resp d = {0};

	/* The slot is free for the next request before the reqs finish. */
	pthread_mutex_lock(&sq->mu);
	n = sl->n;
	memcpy(reqs, sl->reqs, n * sizeof(reqs[0]));
	abandoned = sl->abandoned;
	sl->n = 0;
	sl->busy = false;
	sl->wire = false;
	sl->abandoned = false;
	pthread_mutex_unlock(&sq->mu);
	if (abandoned) {
		/* Its reqs were routed again (kvc_engine_follow): the reply, if
		 * any, is nobody's. */
		if (rep != NULL)
			nng_msg_free(rep);
		pump(sq);
		pending_down(sq->c);
		return;
	}
	if (rv == KV_OK) {
		rv = kvc_reply_decode(nng_msg_body(rep), nng_msg_len(rep), n, &d);
		nng_msg_free(rep);
	}
	pump(sq);

	/* Each req reads its result where it lies in d (a refused Response
	 * has none: an empty result with KV_EPROTO stands in); a req with a
	 * latch moves it out, d frees what the others left. */
	for (size_t i = 0; i < n; i++) {
		kvc_req *q = reqs[i];
		kv_data_result none = {.status = KV_EPROTO};
		kv_data_result *r = rv == KV_OK && d.status == KV_OK ? &d.results[i] : &none;
		/* The envelope's detail, else the op's (both borrowed from d). */
		const char *err = d.error ? d.error : r->error && r->error[0] ? r->error : NULL;
		if (rv == KV_OK) {
			q->status = d.status;
			q->srv_epoch = d.epoch;
		}
		if (!q->routed) {
			if (rv != KV_OK) {
				fail(q, rv, "server %s: %s", sq->address, kv_strerror(rv));
			} else {
				if (q->why != NULL)
					q->why[0] = 0;
				if (err != NULL)
					kvc_req_why(q, "%s", err);
				complete_with(q, KV_OK, r);
			}
		} else if (rv != KV_OK) {
			no_answer(q, sq->address, rv);
		} else {
			answered(q, sq->address, err, r);
		}
	}
	kv_data_resp_fini(&d);
}

/* Frees a queue made by queue_get (its slots idle). */
static void
queue_free(kvc_queue *sq)
{
	for (size_t i = 0; i < ENG_SLOTS; i++)
		kv_rpc_async_destroy(sq->slot[i].rpc);
	pthread_mutex_destroy(&sq->mu);
	free(sq->address);
	free(sq);
}

/* Returns the queue of the server at `address`, making it on first use.
 * Returns 0, KV_ENOMEM or a transport error. */
static int
queue_get(shardkv_client *c, const char *address, kvc_queue **out)
{
	kv_rpc_client *rpc;
	kvc_conn *k;
	kvc_queue *sq;
	int rv;

	if ((rv = kvc_conn_get(c, address, &rpc, &k)) != KV_OK)
		return rv;
	if ((sq = atomic_load_explicit(&k->queue, memory_order_acquire)) != NULL) {
		*out = sq;
		return KV_OK;
	}
	if ((sq = calloc(1, sizeof(*sq))) == NULL || (sq->address = strdup(address)) == NULL) {
		free(sq);
		return KV_ENOMEM;
	}
	sq->c = c;
	pthread_mutex_init(&sq->mu, NULL);
	kv_rpc_client_connect_wait(rpc, ENG_CONNECT_WAIT_MS);
	for (size_t i = 0; i < ENG_SLOTS; i++) {
		sq->slot[i].sq = sq;
		if ((rv = kv_rpc_async_create(rpc, slot_done, &sq->slot[i], &sq->slot[i].rpc)) !=
		    KV_OK) {
			queue_free(sq);
			return rv;
		}
	}
	kvc_queue *none = NULL;
	if (!atomic_compare_exchange_strong(&k->queue, &none, sq)) {
		queue_free(sq); /* another thread made it first */
		*out = none;
		return KV_OK;
	}
	pthread_mutex_lock(&c->eng_mu);
	sq->next = c->eng_queues;
	c->eng_queues = sq;
	pthread_mutex_unlock(&c->eng_mu);
	*out = sq;
	return KV_OK;
}

/* Queues q on sq and pumps; fails it when the handle is closing. */
static void
enqueue(kvc_queue *sq, kvc_req *q)
{
	pthread_mutex_lock(&sq->mu);
	if (sq->closed) {
		pthread_mutex_unlock(&sq->mu);
		fail(q, KV_ECLOSED, "the handle is closing");
		return;
	}
	q->next = NULL;
	if (sq->tail)
		sq->tail->next = q;
	else
		sq->head = q;
	sq->tail = q;
	sq->queued++;
	/* pump's own test, made here under the same lock: while a request is
	 * in flight and fewer single-key ops wait than more_ops_locked asks,
	 * its reply sends them (no second lock per op). */
	unsigned busy;
	size_t more = more_ops_locked(sq, &busy);
	bool wait = busy > 0 && sq->queued < more && single_key(&sq->head->op);
	pthread_mutex_unlock(&sq->mu);
	if (!wait)
		pump(sq);
}

/* ---------------------------------------------------------------------------
 * Routing and the retry thread
 * ------------------------------------------------------------------------- */

/* Routes a routed req without blocking and queues it, or hands it to the
 * retry thread (no configuration yet, no owner). */
static void
route(kvc_req *q)
{
	shardkv_client *c = q->c;
	kvc_cfgref *ref = kvc_cfg_peek(c);
	kvc_queue *sq = NULL;
	char *hinted = NULL;
	const char *to;
	int rv;

	if (ref == NULL) {
		q->refresh = true;
		retry_later(q, false);
		return;
	}
	q->epoch = ref->cfg->epoch;
	/* Where to go: the last hint for this req, a hint remembered for the
	 * cached configuration, or the configuration's owner (whose address
	 * stays valid while ref is held). */
	hinted = q->hint_addr;
	q->hint_addr = NULL;
	if (hinted == NULL)
		hinted = kvc_hint_lookup(c, q->epoch, q->key);
	const kv_node *hn = hinted ? kv_config_node_by_address(ref->cfg, hinted) : NULL;
	if (hn != NULL && hn->state == KV_NODE_DOWN) {
		/* A hint that names a down node is out of date: forget it and
		 * go by the configuration. */
		kvc_hint_forget(c, hinted);
		free(hinted);
		hinted = NULL;
	}
	to = hinted;
	const kv_node *owner = NULL; /* routed by the configuration: its node */
	if (to == NULL) {
		owner = kv_config_node(ref->cfg, kv_config_route(ref->cfg, q->key.p, q->key.len));
		to = owner ? owner->address : NULL;
	}
	if (to == NULL) {
		kvc_cfg_put(ref);
		q->last = KV_EUNAVAIL;
		kvc_req_why(q, "no server owns the key in epoch %llu",
		            (unsigned long long)q->epoch);
		q->min_epoch = q->epoch + 1;
		retry_later(q, false);
		return;
	}
	const kv_node *down = kv_config_node_by_address(ref->cfg, to);
	if (down != NULL && down->state == KV_NODE_DOWN) {
		/* Nothing answers there (doc/contract.md §2): wait a little for
		 * the configuration that gives the range another primary, or
		 * that has the node back, then report the range unavailable. */
		uint64_t now = kv_now_ns();
		if (q->down_since == 0)
			q->down_since = now;
		q->last = KV_EUNAVAIL;
		kvc_req_why(q, "node %u (%s) is down in epoch %llu", down->id, to,
		            (unsigned long long)q->epoch);
		kvc_cfg_put(ref);
		free(hinted);
		if (now - q->down_since >= (uint64_t)KVC_DOWN_GIVEUP_MS * 1000000u) {
			complete(q, KV_EUNAVAIL); /* with the detail just set */
			return;
		}
		q->refresh = true;
		retry_after(q, ENG_DOWN_WAIT_MS);
		return;
	}
	/* The owner's queue as remembered in ref: no connection table lock
	 * and address compare per op. */
	_Atomic(kvc_queue *) *memo =
	    owner && ref->queues ? &ref->queues[owner - ref->cfg->nodes] : NULL;
	if (memo != NULL)
		sq = atomic_load_explicit(memo, memory_order_acquire);
	if (sq != NULL) {
		rv = KV_OK;
	} else if ((rv = queue_get(c, to, &sq)) == KV_OK && memo != NULL) {
		atomic_store_explicit(memo, sq, memory_order_release);
	}
	if (rv != KV_OK) {
		char addr[256];
		snprintf(addr, sizeof(addr), "%s", to);
		kvc_cfg_put(ref);
		free(hinted);
		no_answer(q, addr, rv);
		return;
	}
	kvc_cfg_put(ref);
	free(hinted);
	enqueue(sq, q);
}

/* The retry thread's last TLS probe: many reqs to one server that went
 * quiet share its outcome for ENG_PROBE_MS instead of probing each. */
typedef struct {
	char address[256]; /* the server probed; "" before the first */
	uint64_t at;       /* when (kv_now_ns) */
	int rv;            /* kv_tls_probe's result */
	bool refused;      /* plain tcp: kv_rpc_probe_refused's result */
	char why[384];     /* and its reason */
} probe_memo;

bool
kvc_refresh_due(shardkv_client *c, uint64_t now)
{
	uint64_t last = atomic_load(&c->refresh_ns);

	if (last != 0 && now - last < (uint64_t)ENG_REFRESH_MS * 1000000u)
		return false;
	return atomic_compare_exchange_strong(&c->refresh_ns, &last, now);
}

/* Runs the waiting part of a routed req's retry (retry thread): after a
 * request that found no connection, a redial and (TLS) a probe; a
 * configuration fetch when one is due; then routes it again. */
static void
retry_route(kvc_req *q, probe_memo *pm)
{
	shardkv_client *c = q->c;
	uint64_t now = kv_now_ns();

	if (kvc_remaining_ms(q->deadline_ns) == 0) {
		fail_deadline(q);
		return;
	}
	if (q->quiet_addr != NULL) {
		kvc_conn_redial(c, q->quiet_addr); /* not on an nng thread */
		/* Over TLS a refused handshake looks like a server that is down. */
		if (c->tls != NULL && (strcmp(pm->address, q->quiet_addr) != 0 ||
		                       now - pm->at > (uint64_t)ENG_PROBE_MS * 1000000u)) {
			uint32_t ms = kvc_remaining_ms(q->deadline_ns);
			pm->why[0] = 0;
			pm->rv = kv_tls_probe(q->quiet_addr, c->tls,
			                      ms < ENG_PROBE_MS ? ms : ENG_PROBE_MS, pm->why,
			                      sizeof(pm->why));
			snprintf(pm->address, sizeof(pm->address), "%s", q->quiet_addr);
			pm->at = kv_now_ns();
		}
		if (c->tls != NULL && pm->rv == KV_EAUTH &&
		    strcmp(pm->address, q->quiet_addr) == 0) {
			fail(q, KV_EAUTH, "%s", pm->why[0] ? pm->why : "TLS handshake failed");
			return;
		}
		/* A plain address: is the connection refused (nothing listens:
		 * the server stopped)? Then say so; the refresh below follows. */
		if (c->tls == NULL && (strcmp(pm->address, q->quiet_addr) != 0 ||
		                       now - pm->at > (uint64_t)ENG_REFUSE_MEMO_MS * 1000000u)) {
			uint32_t ms = kvc_remaining_ms(q->deadline_ns);
			pm->refused = kv_rpc_probe_refused(
			    q->quiet_addr, ms < ENG_REFUSE_PROBE_MS ? ms : ENG_REFUSE_PROBE_MS);
			snprintf(pm->address, sizeof(pm->address), "%s", q->quiet_addr);
			pm->at = kv_now_ns();
			now = pm->at;
		}
		if (c->tls == NULL && pm->refused && strcmp(pm->address, q->quiet_addr) == 0)
			kvc_req_why(q, "server %s: connection refused", q->quiet_addr);
		free(q->quiet_addr);
		q->quiet_addr = NULL;
	}
	kvc_cfgref *ref = kvc_cfg_peek(c);
	/* A newer epoch is needed (a server named one), or a refresh is due:
	 * the request got no answer, or its owner is down. */
	bool need = ref == NULL || ref->cfg->epoch < q->min_epoch;
	bool refresh = !need && q->refresh && kvc_refresh_due(c, now);
	uint64_t min = need ? q->min_epoch : refresh ? ref->cfg->epoch + 1 : 0;
	kvc_cfg_put(ref);
	if (need || refresh) {
		/* Bounded, so that one slow fetch does not hold every retry. */
		uint64_t d = now + (uint64_t)ENG_FETCH_MS * 1000000u;
		int rv = kvc_cfg_get(c, min, d < q->deadline_ns ? d : q->deadline_ns, &ref);
		if (rv != KV_OK && !need) {
			/* Only a refresh: route with what is cached (the
			 * controller may be what is unreachable). */
			rv = KV_OK;
			ref = NULL;
		}
		if (rv != KV_OK) {
			q->last = rv;
			kvc_req_why(q, "%s", shardkv_errmsg());
			if (!kvc_retryable(rv) || kvc_ctl_refused()) {
				complete(q, rv);
				return;
			}
			retry_later(q, false);
			return;
		}
		kvc_cfg_put(ref);
	}
	q->refresh = false;
	q->min_epoch = 0;
	route(q);
}

/* The retry thread: takes the reqs that are due, oldest first, and sleeps
 * until the next one is. */
static void *
retry_main(void *arg)
{
	shardkv_client *c = arg;
	probe_memo pm = {.rv = KV_OK};

	kv_log_thread_name("shardkv-retry");
	pthread_mutex_lock(&c->eng_mu);
	for (;;) {
		uint64_t now = kv_now_ns(), next = UINT64_MAX;
		kvc_req **pp = &c->rq_head, *prev = NULL, *q = NULL;

		for (kvc_req *x = c->rq_head; x; prev = x, x = x->next, pp = &prev->next) {
			if (c->eng_closing || x->not_before <= now) {
				q = x;
				break;
			}
			if (x->not_before < next)
				next = x->not_before;
		}
		if (q == NULL) {
			if (c->eng_closing)
				break;
			if (next == UINT64_MAX) {
				pthread_cond_wait(&c->rq_cv, &c->eng_mu);
			} else {
				struct timespec ts = {.tv_sec = (time_t)(next / 1000000000u),
				                      .tv_nsec = (long)(next % 1000000000u)};
				pthread_cond_timedwait(&c->rq_cv, &c->eng_mu, &ts);
			}
			continue;
		}
		*pp = q->next;
		if (c->rq_tail == q)
			c->rq_tail = prev;
		q->next = NULL;
		bool closing = c->eng_closing;
		pthread_mutex_unlock(&c->eng_mu);
		if (q->task)
			q->done(q, closing ? KV_ECLOSED : KV_OK, NULL); /* may free q */
		else if (closing)
			fail(q, KV_ECLOSED, "the handle is closing");
		else
			retry_route(q, &pm);
		pthread_mutex_lock(&c->eng_mu);
	}
	pthread_mutex_unlock(&c->eng_mu);
	return NULL;
}

/* Queues q for the retry thread, starting it the first time. Returns 0,
 * KV_ECLOSED (the handle is closing) or KV_ENOMEM (no thread). */
static int
rq_push(kvc_req *q)
{
	shardkv_client *c = q->c;
	int err = KV_ECLOSED;

	pthread_mutex_lock(&c->eng_mu);
	if (!c->eng_closing && !c->rq_started) {
		if (pthread_create(&c->rq_thread, NULL, retry_main, c) == 0)
			c->rq_started = true;
		else
			err = KV_ENOMEM;
	}
	if (!c->eng_closing && c->rq_started) {
		q->next = NULL;
		if (c->rq_tail)
			c->rq_tail->next = q;
		else
			c->rq_head = q;
		c->rq_tail = q;
		pthread_cond_signal(&c->rq_cv);
		err = KV_OK;
	}
	pthread_mutex_unlock(&c->eng_mu);
	return err;
}

/* Hands q to the retry thread, or fails it when the handle is closing or no
 * thread can be started. */
static void
to_retry(kvc_req *q)
{
	int err = rq_push(q);

	if (err != KV_OK)
		fail(q, err,
		     err == KV_ECLOSED ? "the handle is closing" : "cannot start the retry thread");
}

void
kvc_may_wait(bool on)
{
	eng_may_wait = on;
}

int
kvc_defer(kvc_req *q, uint64_t not_before)
{
	q->task = true;
	q->not_before = not_before;
	return rq_push(q);
}

/* ---------------------------------------------------------------------------
 * Following a new configuration
 * ------------------------------------------------------------------------- */

/* Whether cfg says that the server at address is down. */
static bool
server_down(const kv_config *cfg, const char *address)
{
	const kv_node *n = kv_config_node_by_address(cfg, address);

	return n != NULL && n->state == KV_NODE_DOWN;
}

/* Whether routed req q, queued for address, must go elsewhere under cfg. */
static bool
owner_moved(const kv_config *cfg, const kvc_req *q, const char *address)
{
	const kv_node *n = kv_config_node(cfg, kv_config_route(cfg, q->key.p, q->key.len));

	return n == NULL || strcmp(n->address, address) != 0;
}

void
kvc_engine_follow(shardkv_client *c, kvc_cfgref *ref)
{
	const kv_config *cfg = ref->cfg;
	kvc_req *moved = NULL, *failed = NULL;
	kvc_queue *list;

	pthread_mutex_lock(&c->eng_mu);
	if (c->eng_closing) {
		pthread_mutex_unlock(&c->eng_mu);
		return;
	}
	c->eng_walkers++; /* the queues stay until it falls back */
	list = c->eng_queues;
	pthread_mutex_unlock(&c->eng_mu);

	for (kvc_queue *sq = list; sq; sq = sq->next) {
		bool down = server_down(cfg, sq->address);
		unsigned abandoned = 0;

		pthread_mutex_lock(&sq->mu);
		if (sq->closed) {
			pthread_mutex_unlock(&sq->mu);
			continue;
		}
		/* Queued reqs: a routed one whose key has another owner now,
		 * and anything for a server that is down. */
		kvc_req **pp = &sq->head, *prev = NULL;
		while (*pp != NULL) {
			kvc_req *q = *pp;
			bool go = down || (q->routed && owner_moved(cfg, q, sq->address));
			if (!go) {
				prev = q;
				pp = &q->next;
				continue;
			}
			*pp = q->next;
			if (sq->tail == q)
				sq->tail = prev;
			sq->queued--;
			q->next = q->routed ? moved : failed;
			if (q->routed)
				moved = q;
			else
				failed = q;
		}
		/* Requests on the wire to a server that is down: abandoned (nng
		 * would hold them until their timeout, waiting for a connection
		 * that does not come). The slot stays busy until that reply or
		 * timeout, which nobody waits for, and counts as one pending req
		 * meanwhile, so shardkv_close still lets it finish (engine close). */
		for (size_t i = 0; down && i < ENG_SLOTS; i++) {
			kvc_slot *sl = &sq->slot[i];
			if (!sl->busy || !sl->wire || sl->abandoned || sl->n == 0)
				continue;
			for (size_t k = 0; k < sl->n; k++) {
				kvc_req *q = sl->reqs[k];
				q->next = q->routed ? moved : failed;
				if (q->routed)
					moved = q;
				else
					failed = q;
			}
			sl->n = 0;
			sl->abandoned = true;
			abandoned++;
		}
		if (abandoned > 0)
			atomic_fetch_add(&c->eng_pending, abandoned); /* its reqs still count */
		pthread_mutex_unlock(&sq->mu);
		if (down && abandoned > 0)
			KV_INFO("client", "requests to a down server routed again",
			        "server=%s epoch=%llu", sq->address,
			        (unsigned long long)cfg->epoch);
	}

	/* Routed again with the newest configuration, request ids kept. */
	while (moved != NULL) {
		kvc_req *q = moved;
		moved = q->next;
		q->next = NULL;
		route(q);
	}
	while (failed != NULL) {
		kvc_req *q = failed;
		failed = q->next;
		q->next = NULL;
		fail(q, KV_EUNAVAIL, "its server is down in epoch %llu",
		     (unsigned long long)cfg->epoch);
	}

	pthread_mutex_lock(&c->eng_mu);
	if (--c->eng_walkers == 0)
		pthread_cond_broadcast(&c->eng_cv);
	pthread_mutex_unlock(&c->eng_mu);
}

/* ---------------------------------------------------------------------------
 * Submitting
 * ------------------------------------------------------------------------- */

/* Counts q as pending. Returns 0, or KV_ECLOSED once shardkv_close began. */
static int
take(kvc_req *q)
{
	shardkv_client *c = q->c;

	if (q->last == KV_OK)
		q->last = KV_ETIMEDOUT; /* what a req that never got an answer says */
	if (atomic_load_explicit(&c->cfg_hook, memory_order_relaxed) == NULL)
		atomic_store(&c->cfg_hook, kvc_engine_follow);
	/* Counted first, then the flag checked: shardkv_close sets the flag
	 * first, then waits for the count (both sequentially consistent), so
	 * either it waits for this req or this req sees it closing. */
	atomic_fetch_add(&c->eng_pending, 1);
	if (atomic_load(&c->eng_closing)) {
		pending_down(c);
		return kvc_fail(KV_ECLOSED, "the handle is closing");
	}
	return KV_OK;
}

int
kvc_pending_take(shardkv_client *c)
{
	atomic_fetch_add(&c->eng_pending, 1);
	if (atomic_load(&c->eng_closing)) {
		pending_down(c);
		return kvc_fail(KV_ECLOSED, "the handle is closing");
	}
	return KV_OK;
}

void
kvc_pending_release(shardkv_client *c)
{
	pending_down(c);
}

int
kvc_submit_routed(kvc_req *q)
{
	int rv;

	q->routed = true;
	q->down_since = 0;
	if (q->backoff_ms == 0)
		q->backoff_ms = 1;
	if ((rv = take(q)) != KV_OK)
		return rv;
	route(q);
	return KV_OK;
}

int
kvc_submit_to(kvc_req *q, const char *address, uint64_t epoch)
{
	kvc_queue *sq;
	int rv;

	q->routed = false;
	q->epoch = epoch;
	if ((rv = take(q)) != KV_OK)
		return rv;
	if ((rv = queue_get(q->c, address, &sq)) != KV_OK) {
		fail(q, rv, "server %s: %s", address, kv_strerror(rv));
		return KV_OK;
	}
	enqueue(sq, q);
	return KV_OK;
}

int
kvc_run_routed(shardkv_client *c, const kv_op *op, kv_bytes key, uint64_t deadline,
               kv_data_result *out)
{
	kvc_latch l;
	kv_data_result res = {0};
	kvc_req q = {
	    .c = c, .op = *op, .key = key, .deadline_ns = deadline, .latch = &l, .out = &res};
	kvc_cfgref *ref;
	int rv;

	/* The first call of a handle fetches the configuration here, on the
	 * caller's thread, so that a refusal (a wrong token, a TLS handshake)
	 * is reported as the controller call states it. */
	if ((ref = kvc_cfg_peek(c)) == NULL) {
		rv = kvc_cfg_get(c, 0, deadline, &ref);
		if (rv != KV_OK &&
		    (!kvc_retryable(rv) || kvc_ctl_refused() || kvc_remaining_ms(deadline) == 0))
			return rv;
		if (rv != KV_OK) {
			q.last = rv; /* what the call says if nothing better comes */
			kvc_req_why(&q, "%s", shardkv_errmsg());
		}
	}
	kvc_cfg_put(ref);
	kvc_latch_init(&l, 1);
	eng_may_wait = true; /* this thread waits anyway: it may wait for the send */
	rv = kvc_submit_routed(&q);
	eng_may_wait = false;
	if (rv != KV_OK) {
		kvc_latch_fini(&l);
		kvc_req_fini(&q);
		return rv;
	}
	kvc_latch_wait(&l);
	kvc_latch_fini(&l);
	rv = q.rv;
	if (rv != KV_OK)
		kvc_fail(rv, "%s", kvc_req_detail(&q));
	else if (res.status != KV_OK)
		kvc_fail(res.status, "%s", kvc_req_detail(&q));
	kvc_req_fini(&q);
	if (rv == KV_OK)
		*out = res;
	return rv;
}

/* ---------------------------------------------------------------------------
 * Close
 * ------------------------------------------------------------------------- */

void
kvc_engine_close(shardkv_client *c)
{
	kvc_queue *list;
	bool started;

	pthread_mutex_lock(&c->eng_mu);
	c->eng_closing = true;
	pthread_cond_broadcast(&c->rq_cv);
	list = c->eng_queues;
	started = c->rq_started;
	pthread_mutex_unlock(&c->eng_mu);
	for (kvc_queue *sq = list; sq; sq = sq->next) {
		pthread_mutex_lock(&sq->mu);
		sq->closed = true;
		kvc_req *q = sq->head;
		sq->head = sq->tail = NULL;
		sq->queued = 0;
		pthread_mutex_unlock(&sq->mu);
		while (q != NULL) {
			kvc_req *next = q->next;
			fail(q, KV_ECLOSED, "the handle is closing");
			q = next;
		}
		/* Requests on the wire are left to finish (answered, or failed at
		 * their timeout, at most half the op's deadline): cancelling a
		 * request context and then closing the socket can hang nng 1.5's
		 * nng_close. */
	}
	pthread_mutex_lock(&c->eng_mu);
	while (atomic_load(&c->eng_pending) > 0 || c->eng_walkers > 0)
		pthread_cond_wait(&c->eng_cv, &c->eng_mu);
	pthread_mutex_unlock(&c->eng_mu);
	if (started)
		pthread_join(c->rq_thread, NULL);
	while (list != NULL) {
		kvc_queue *next = list->next;
		queue_free(list);
		list = next;
	}
}

void
shardkv_close(shardkv_client *c)
{
	if (c == NULL)
		return;
	/* The engine first: its slots are contexts on the handle's sockets. */
	kvc_engine_close(c);
	kvc_handle_free(c);
}
