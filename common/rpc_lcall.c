/*
 * rpc_lcall.c - the asynchronous callers of a plain tcp:// client on a link
 * (rpc_int.h, rpc.h kv_rpc_async).
 *
 * DESIGN. A client of a tcp:// address with no TLS sends its asynchronous
 * calls on one link (rpc_link.c) and one thread of its own, the client's
 * link thread, instead of an nng socket and nng's threads. A call is
 * written on the calling thread, under the client's mutex, straight onto
 * the connection (what the kernel does not take waits in the link for the
 * link thread's POLLOUT); the link thread sleeps in poll on the connection
 * and an eventfd, reads the answers, matches each to its caller by the
 * request id and runs the caller's callback itself. So a call costs the
 * caller's thread no hand-off and the answer one wake-up, of the link
 * thread; a callback that starts the next call writes it at once. With
 * nng, the same call took a task thread for the send's completion, the
 * poller and another task thread for the answer.
 *
 * Ids: a caller has an index (its slot in the client's table) and a
 * generation, bumped by every call; the id is gen << LC_IDX_BITS | index.
 * An answer whose caller is gone or has moved on to another call (it
 * timed out or was cancelled) matches nothing and is dropped.
 *
 * Connection: made by the link thread when a call waits for one, within
 * LC_CONNECT_MS or the call's connection wait, whichever is shorter; after
 * a failure the next attempt waits LC_RETRY_MIN_MS doubling to
 * LC_RETRY_MAX_MS (nng's reconnect times in rpc.c). A call that finds no
 * connection waits for one until its connection wait
 * (kv_rpc_client_connect_wait) or its timeout, then fails with
 * KV_EUNAVAIL, as nng's send does. A connection that fails fails the
 * calls sent on it with KV_EUNAVAIL at once (nng's REQ would keep them
 * until their timeout: the caller retries sooner, with the same request
 * ids, so a write is still applied once); calls not yet written wait for
 * the next connection. A call past its timeout fails with KV_ETIMEDOUT.
 *
 * Locks: rpc_lc.mu protects everything of the client's link state and of
 * its callers but the thread and the eventfd (set before the first caller
 * and constant after). It is a leaf: never held across a callback, a
 * connect or a wait, only across the link's non-blocking reads and writes.
 * Callbacks run with no lock held, on the link thread, or on the calling
 * thread for a call refused at once (the client closing) or cancelled by
 * rpc_lc_caller_destroy.
 */
#define _GNU_SOURCE
#include "common/err.h"
#include "common/key.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/rpc_int.h"

#include <errno.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#define LC_IDX_BITS     12u
#define LC_MAX_CALLERS  (1u << LC_IDX_BITS)
#define LC_GEN_MASK     ((1u << (31u - LC_IDX_BITS)) - 1u)
#define LC_CONNECT_MS   1000u /* one connection attempt, at most */
#define LC_RETRY_MIN_MS 10u   /* the wait after a failed attempt, first */
#define LC_RETRY_MAX_MS 500u  /* and at most */
#define LC_IDLE_MS      1000u /* the thread's longest sleep */

struct rpc_lc_caller {
	rpc_lc *k;           /* its client */
	uint32_t idx;        /* its slot in k->callers */
	uint32_t gen;        /* its call's generation */
	kv_rpc_done_fn done; /* the owner's callback */
	void *arg;           /* its argument */
	/* Under k->mu: */
	bool busy;           /* a call is in flight */
	bool sent;           /* and written to the connection (or the link's queue) */
	bool in_cb;          /* the link thread runs its callback now */
	nng_msg *req;        /* a call not sent yet */
	uint64_t due_ms;     /* the call's deadline */
	uint64_t connect_by; /* when an unsent call gives up waiting for a connection */
};

struct rpc_lc {
	char *url;               /* the address (owned) */
	pthread_mutex_t mu;      /* see "Locks" */
	pthread_cond_t cv;       /* a callback has returned (in_cb cleared) */
	kv_link *link;           /* the connection, NULL when there is none */
	bool broken;             /* a write on it failed: the thread closes it */
	bool out;                /* the thread polls for POLLOUT */
	uint64_t next_try;       /* no connection attempt before (ms) */
	uint32_t backoff;        /* the wait after the next failed attempt (ms) */
	uint64_t sleep_until;    /* when the sleeping thread wakes on its own (0: awake) */
	bool stop;               /* rpc_lc_destroy has begun */
	bool started;            /* the thread runs (th, efd valid) */
	rpc_lc_caller **callers; /* by index; NULL: a free slot */
	size_t ncallers;         /* slots in use or free, below LC_MAX_CALLERS */
	atomic_bool connected;   /* a connection is open (rpc_lc_connected) */
	pthread_t th;            /* the link thread */
	int efd;                 /* wakes it */
};

/* A finished call, for its callback outside the lock. */
typedef struct {
	rpc_lc_caller *c;
	int rv;
	nng_msg *rep;
} lc_done;

static uint64_t
now_ms(void)
{
	return kv_now_ns() / 1000000u;
}

static void
lc_wake(rpc_lc *k)
{
	uint64_t one = 1;
	ssize_t n;

	do
		n = write(k->efd, &one, sizeof(one));
	while (n < 0 && errno == EINTR);
}

static uint32_t
lc_id(const rpc_lc_caller *c)
{
	return c->gen << LC_IDX_BITS | c->idx;
}

int
rpc_lc_create(const char *url, rpc_lc **out)
{
	rpc_lc *k = calloc(1, sizeof(*k));

	if (k == NULL || (k->url = strdup(url)) == NULL) {
		free(k);
		return KV_ENOMEM;
	}
	pthread_mutex_init(&k->mu, NULL);
	pthread_cond_init(&k->cv, NULL);
	atomic_init(&k->connected, false);
	k->backoff = LC_RETRY_MIN_MS;
	k->efd = -1;
	*out = k;
	return KV_OK;
}

bool
rpc_lc_connected(const rpc_lc *k)
{
	return k != NULL && atomic_load(&((rpc_lc *)k)->connected);
}

void
rpc_lc_kick(rpc_lc *k)
{
	if (k == NULL)
		return;
	pthread_mutex_lock(&k->mu);
	k->next_try = 0;
	k->backoff = LC_RETRY_MIN_MS;
	bool wake = k->started && k->sleep_until != 0;
	pthread_mutex_unlock(&k->mu);
	if (wake)
		lc_wake(k);
}

/* Ends caller c's call with rv (and rep): into d for the callback. */
static void
lc_finish_locked(rpc_lc_caller *c, int rv, nng_msg *rep, lc_done *d, size_t *nd)
{
	if (c->req != NULL) {
		nng_msg_free(c->req);
		c->req = NULL;
	}
	c->busy = false;
	c->sent = false;
	c->in_cb = true;
	d[*nd].c = c;
	d[*nd].rv = rv;
	d[*nd].rep = rep;
	(*nd)++;
}

/* Runs the callbacks of d with k->mu released; returns with it held. */
static void
lc_run_locked(rpc_lc *k, lc_done *d, size_t nd)
{
	if (nd == 0)
		return;
	pthread_mutex_unlock(&k->mu);
	for (size_t i = 0; i < nd; i++)
		d[i].c->done(d[i].c->arg, d[i].rv, d[i].rep);
	pthread_mutex_lock(&k->mu);
	for (size_t i = 0; i < nd; i++)
		d[i].c->in_cb = false;
	pthread_cond_broadcast(&k->cv);
}

/* Writes caller c's waiting request on the connection. */
static void
lc_send_locked(rpc_lc *k, rpc_lc_caller *c)
{
	nng_msg *m = c->req;

	if (kv_link_send(k->link, lc_id(c), nng_msg_body(m), nng_msg_len(m)) != KV_OK) {
		k->broken = true; /* the request stays, for the next connection */
		return;
	}
	nng_msg_free(m);
	c->req = NULL;
	c->sent = true;
}

/* Closes a failed connection: its calls fail (KV_EUNAVAIL). */
static void
lc_drop_locked(rpc_lc *k, lc_done *d, size_t *nd)
{
	KV_DEBUG("rpc", "link to server lost", "url=%s", k->url);
	kv_link_close(k->link);
	k->link = NULL;
	k->broken = false;
	k->out = false;
	atomic_store(&k->connected, false);
	for (size_t i = 0; i < k->ncallers; i++) {
		rpc_lc_caller *c = k->callers[i];
		if (c != NULL && c->busy && c->sent)
			lc_finish_locked(c, KV_EUNAVAIL, NULL, d, nd);
	}
}

/* Whether a call waits for a connection; *by the earliest it gives up. */
static bool
lc_waiting_locked(const rpc_lc *k, uint64_t *by)
{
	bool any = false;

	*by = UINT64_MAX;
	for (size_t i = 0; i < k->ncallers; i++) {
		const rpc_lc_caller *c = k->callers[i];
		if (c != NULL && c->busy && !c->sent) {
			any = true;
			if (c->connect_by < *by)
				*by = c->connect_by;
		}
	}
	return any;
}

/* Connects (k->mu released meanwhile) and sends what waits. */
static void
lc_connect_locked(rpc_lc *k, uint64_t now, uint64_t by)
{
	uint64_t ms = by > now ? by - now : 1;
	kv_link *l = NULL;
	int rv;

	pthread_mutex_unlock(&k->mu);
	rv = kv_link_open(k->url, ms < LC_CONNECT_MS ? (uint32_t)ms : LC_CONNECT_MS, 0, &l);
	pthread_mutex_lock(&k->mu);
	if (rv != KV_OK || k->stop) {
		kv_link_close(l);
		k->next_try = now_ms() + k->backoff;
		k->backoff = k->backoff * 2 < LC_RETRY_MAX_MS ? k->backoff * 2 : LC_RETRY_MAX_MS;
		return;
	}
	k->link = l;
	k->backoff = LC_RETRY_MIN_MS;
	atomic_store(&k->connected, true);
	for (size_t i = 0; i < k->ncallers && !k->broken; i++) {
		rpc_lc_caller *c = k->callers[i];
		if (c != NULL && c->busy && !c->sent)
			lc_send_locked(k, c);
	}
}

/* Reads the answers that have come and matches them to their callers. */
static void
lc_read_locked(rpc_lc *k, lc_done *d, size_t *nd)
{
	for (;;) {
		bool got;
		uint32_t id;
		const uint8_t *body;
		size_t len;
		nng_msg *m;

		if (kv_link_recv(k->link, &got, &id, &body, &len) != KV_OK) {
			k->broken = true;
			return;
		}
		if (!got)
			return;
		uint32_t idx = id & (LC_MAX_CALLERS - 1u);
		rpc_lc_caller *c = idx < k->ncallers ? k->callers[idx] : NULL;
		if (c == NULL || !c->busy || !c->sent || c->gen != id >> LC_IDX_BITS)
			continue; /* its call timed out or was cancelled */
		if (nng_msg_alloc(&m, len) != 0) {
			lc_finish_locked(c, KV_ENOMEM, NULL, d, nd);
			continue;
		}
		if (len > 0)
			memcpy(nng_msg_body(m), body, len);
		lc_finish_locked(c, KV_OK, m, d, nd);
	}
}

/* Makes d hold a finished call of every caller. */
static bool
lc_room(const rpc_lc *k, lc_done **d, size_t *dcap)
{
	if (*dcap >= k->ncallers)
		return true;
	lc_done *n = realloc(*d, k->ncallers * sizeof(**d));
	if (n == NULL)
		return false;
	*d = n;
	*dcap = k->ncallers;
	return true;
}

static void *
lc_main(void *arg)
{
	rpc_lc *k = arg;
	lc_done *d = NULL;
	size_t dcap = 0, nd;

	kv_log_thread_name("kv-rpc-link");
	pthread_mutex_lock(&k->mu);
	while (!k->stop) {
		uint64_t now = now_ms(), by, wake = now + LC_IDLE_MS;

		nd = 0;
		if (!lc_room(k, &d, &dcap)) {
			/* Without room for the callbacks nothing can finish. */
			pthread_mutex_unlock(&k->mu);
			poll(NULL, 0, 10);
			pthread_mutex_lock(&k->mu);
			continue;
		}
		if (k->link != NULL && k->broken)
			lc_drop_locked(k, d, &nd);
		bool waiting = lc_waiting_locked(k, &by);
		if (k->link == NULL && waiting && now >= k->next_try) {
			lc_run_locked(k, d, nd);
			lc_connect_locked(k, now, by);
			continue;
		}
		/* Calls past their time. */
		for (size_t i = 0; i < k->ncallers; i++) {
			rpc_lc_caller *c = k->callers[i];
			if (c == NULL || !c->busy)
				continue;
			uint64_t due = c->sent ? c->due_ms : c->connect_by;
			if (now >= due)
				lc_finish_locked(c, c->sent ? KV_ETIMEDOUT : KV_EUNAVAIL, NULL, d,
				                 &nd);
			else if (due < wake)
				wake = due;
		}
		if (nd > 0) {
			lc_run_locked(k, d, nd);
			continue;
		}
		if (k->link == NULL && waiting && k->next_try < wake)
			wake = k->next_try;

		struct pollfd p[2] = {{.fd = k->efd, .events = POLLIN}, {.fd = -1}};
		if (k->link != NULL) {
			p[1].fd = kv_link_fd(k->link);
			k->out = kv_link_want_write(k->link);
			p[1].events = (short)(POLLIN | (k->out ? POLLOUT : 0));
		}
		k->sleep_until = wake > now ? wake : now + 1;
		pthread_mutex_unlock(&k->mu);
		int n = poll(p, 2, (int)(wake > now ? wake - now : 1));
		pthread_mutex_lock(&k->mu);
		k->sleep_until = 0;
		if (n <= 0)
			continue;
		if (p[0].revents & POLLIN) {
			uint64_t v;
			if (read(k->efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
				KV_DEBUG("rpc", "eventfd read failed", "errno=%d", errno);
		}
		/* Callers made while it slept: room first (the socket stays
		 * readable). Another connection than the one polled: next round. */
		if (k->link == NULL || p[1].fd != kv_link_fd(k->link) || !lc_room(k, &d, &dcap))
			continue;
		if ((p[1].revents & POLLOUT) && kv_link_flush(k->link) != KV_OK)
			k->broken = true;
		if (!k->broken && (p[1].revents & (POLLIN | POLLERR | POLLHUP)))
			lc_read_locked(k, d, &nd);
		lc_run_locked(k, d, nd);
	}
	/* Stopping: a call still in flight fails (there is none when the
	 * callers were destroyed first, as they must be). */
	nd = 0;
	if (lc_room(k, &d, &dcap)) {
		for (size_t i = 0; i < k->ncallers; i++) {
			rpc_lc_caller *c = k->callers[i];
			if (c != NULL && c->busy)
				lc_finish_locked(c, KV_ECLOSED, NULL, d, &nd);
		}
		lc_run_locked(k, d, nd);
	}
	pthread_mutex_unlock(&k->mu);
	free(d);
	return NULL;
}

int
rpc_lc_caller_create(rpc_lc *k, kv_rpc_done_fn done, void *arg, rpc_lc_caller **out)
{
	rpc_lc_caller *c = calloc(1, sizeof(*c));
	int rv = KV_OK;

	if (c == NULL)
		return KV_ENOMEM;
	c->k = k;
	c->done = done;
	c->arg = arg;
	pthread_mutex_lock(&k->mu);
	if (k->stop) {
		rv = KV_ECLOSED;
		goto out;
	}
	if (!k->started) {
		if ((k->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
			rv = KV_ENOMEM;
			goto out;
		}
		if (pthread_create(&k->th, NULL, lc_main, k) != 0) {
			close(k->efd);
			k->efd = -1;
			rv = KV_ENOMEM;
			goto out;
		}
		k->started = true;
	}
	size_t i = 0;
	while (i < k->ncallers && k->callers[i] != NULL)
		i++;
	if (i == k->ncallers) {
		if (i == LC_MAX_CALLERS) {
			rv = KV_ELIMIT;
			goto out;
		}
		rpc_lc_caller **n = realloc(k->callers, (i + 1) * sizeof(*n));
		if (n == NULL) {
			rv = KV_ENOMEM;
			goto out;
		}
		k->callers = n;
		k->callers[k->ncallers++] = NULL;
	}
	c->idx = (uint32_t)i;
	k->callers[i] = c;
out:
	pthread_mutex_unlock(&k->mu);
	if (rv != KV_OK) {
		free(c);
		return rv;
	}
	*out = c;
	return KV_OK;
}

void
rpc_lc_call(rpc_lc_caller *c, nng_msg *req, uint32_t timeout_ms, uint32_t connect_wait_ms)
{
	rpc_lc *k = c->k;
	uint64_t now = now_ms();
	bool wake = false;

	if (timeout_ms == 0)
		timeout_ms = 1;
	pthread_mutex_lock(&k->mu);
	if (k->stop || c->busy) {
		pthread_mutex_unlock(&k->mu);
		nng_msg_free(req);
		c->done(c->arg, k->stop ? KV_ECLOSED : KV_EINVAL, NULL);
		return;
	}
	c->gen = (c->gen + 1u) & LC_GEN_MASK;
	c->busy = true;
	c->sent = false;
	c->req = req;
	c->due_ms = now + timeout_ms;
	c->connect_by =
	    connect_wait_ms > 0 && connect_wait_ms < timeout_ms ? now + connect_wait_ms : c->due_ms;
	if (k->link != NULL && !k->broken)
		lc_send_locked(k, c);
	/* A thread awake looks at every call before it sleeps again. A
	 * sleeping one is woken only when it must act: connect, drop a broken
	 * connection, poll for POLLOUT, or wake before this call's deadline
	 * (rarely: calls of one caller take about as long). */
	if (k->sleep_until != 0)
		wake = !c->sent || k->broken || (kv_link_want_write(k->link) && !k->out) ||
		       c->due_ms < k->sleep_until;
	pthread_mutex_unlock(&k->mu);
	if (wake)
		lc_wake(k);
}

void
rpc_lc_caller_destroy(rpc_lc_caller *c)
{
	rpc_lc *k;
	bool cancel = false;

	if (c == NULL)
		return;
	k = c->k;
	pthread_mutex_lock(&k->mu);
	if (c->busy) {
		if (c->req != NULL)
			nng_msg_free(c->req);
		c->req = NULL;
		c->busy = false;
		c->sent = false;
		cancel = true;
	}
	while (c->in_cb)
		pthread_cond_wait(&k->cv, &k->mu);
	k->callers[c->idx] = NULL;
	pthread_mutex_unlock(&k->mu);
	if (cancel)
		c->done(c->arg, KV_ECLOSED, NULL);
	free(c);
}

void
rpc_lc_destroy(rpc_lc *k)
{
	if (k == NULL)
		return;
	pthread_mutex_lock(&k->mu);
	k->stop = true;
	bool started = k->started;
	pthread_mutex_unlock(&k->mu);
	if (started) {
		lc_wake(k);
		pthread_join(k->th, NULL);
		close(k->efd);
	}
	kv_link_close(k->link);
	free(k->callers);
	pthread_cond_destroy(&k->cv);
	pthread_mutex_destroy(&k->mu);
	free(k->url);
	free(k);
}
