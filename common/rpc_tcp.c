/*
 * rpc_tcp.c - the rpc server on event loops of its own (rpc_int.h): nng's
 * wire protocol for a REP socket over TCP, served without nng's threads.
 *
 * DESIGN. nng 1.5 completes every receive on its poller thread and runs
 * the context's callback on one of its task threads, and every send the
 * same way: two thread hand-offs per request, which cost the shard server
 * more than the request itself under pipelined load (bench/README.md).
 * Here each of `loops` threads runs an epoll loop over the connections it
 * was given: it reads whatever has arrived, calls the handler for each
 * whole request in turn, queues the answers, and writes them all in one
 * sendmsg at the end of the round. A deferred answer (the log's or the
 * backups' callback) is written from the thread that gives it, unless a
 * round of the loop is in progress on that connection, which then writes
 * it with the others. No request crosses a thread unless its handler
 * asks to wait (KV_RPC_BLOCKING): those go, in arrival order, to a small
 * pool of worker threads.
 *
 * The wire (nng's TCP transport, SP protocol REQ/REP v0): on connect each
 * side sends 8 bytes, 00 'S' 'P' 00, its protocol number (16 bits, big
 * endian; REQ 0x30, REP 0x31) and 00 00; then every message is a 64-bit
 * big-endian length and that many bytes. A request's bytes start with its
 * backtrace, 32-bit words up to the first with the high bit set (one word,
 * the request id, from a REQ socket); the reply carries the same words
 * before its body. As nng does, a peer that speaks another protocol, sends
 * a message over the size limit or one too short for its backtrace is
 * disconnected, and a request over 8 hops is dropped.
 *
 * Connections: accepted by whichever loop the listener wakes (all loops
 * watch it, EPOLLEXCLUSIVE), given to the loops in turn. A connection is
 * read and closed only by its loop; it is written by its loop or by a
 * thread giving a deferred answer, under its wmu. It lives while its loop
 * has it or a request of it waits for an answer (refs). At most
 * `contexts` requests of one connection wait for answers, or answers for
 * the kernel to take them, at once: past that its loop stops reading it
 * (TCP's flow control then holds the client) until an answer goes out, so
 * a peer that sends and never reads holds bounded memory.
 *
 * Locks (all leaves: nothing else is taken under them, doc/threads.md):
 * rpc_conn.wmu (its write queue, dead, in_round, the epoll mask),
 * rpc_loop.mu (its resume list), rpc_tcp.cmu (the list of connections),
 * rpc_tcp.wq_mu (the worker queue). Handlers run with none held.
 */
#define _GNU_SOURCE
#include "common/mem.h"
#include "common/bytes.h"
#include "common/defer.h"
#include "common/err.h"
#include "common/log.h"
#include "common/rpc_int.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define COMP "rpc"

#define SP_MAX_HOPS    8u
#define RBUF_MIN       (64u * 1024u)   /* a connection's read buffer, at least */
#define RBUF_KEEP      (1024u * 1024u) /* larger ones are given back once empty */
#define REQ_KEEP       (64u * 1024u)   /* a request message this large or smaller is reused */
#define WRITE_IOVS     256u            /* iovecs per sendmsg */
#define RPC_WORKERS    4u              /* threads for KV_RPC_BLOCKING requests */
#define EVENTS_PER_RUN 64

enum { TAG_LISTEN = 1, TAG_WAKE = 2, TAG_CONN = 3 };

/* One answer waiting to be written: its length word and backtrace, then
 * msg's body (NULL for the handshake, whose 8 bytes are in pre). */
typedef struct {
	nng_msg *msg;
	size_t off; /* bytes of pre + body written */
	uint8_t prelen;
	uint8_t pre[8 + RPC_BT_MAX];
} rpc_out;

struct rpc_loop;

typedef struct rpc_conn {
	int tag;             /* TAG_CONN: what epoll's data points at */
	struct rpc_loop *l;  /* the loop that reads it */
	struct rpc_tcp *t;   /* its server */
	int fd;              /* closed by the loop, under wmu (with dead) */
	atomic_int refs;     /* the loop's (while it has it) + one per waiting request */
	atomic_uint waiting; /* requests handed out and not answered yet */
	atomic_uint unsent;  /* answers queued and not yet written */
	atomic_bool held;    /* reading stopped: `contexts` requests wait */
	atomic_bool ready;   /* set (release) once built, before its loop sees it:
	                      * the loop's acquire orders the accepting thread's
	                      * writes before its reads (epoll is no fence to
	                      * ThreadSanitizer) */
	/* Read side: the loop's thread only. */
	uint8_t *rbuf;
	size_t rcap, rlen, roff;
	bool hello;                   /* the peer's 8 bytes were checked */
	kv_rpc_pending *spare;        /* the next request's slot */
	nng_msg *req_spare;           /* the last request's message, for the next one */
	bool closed;                  /* the loop closed it */
	struct rpc_conn *rnext;       /* rpc_loop.resume (under rpc_loop.mu) */
	bool rqueued;                 /* on rpc_loop.resume (under rpc_loop.mu) */
	struct rpc_conn *prev, *next; /* rpc_tcp.conns (cmu) */
	/* wmu protects everything below, and writes to fd. */
	pthread_mutex_t wmu;
	bool dead;     /* closed: answers are dropped */
	bool in_round; /* its loop is handling what it read: it writes at the end */
	bool want_out; /* EPOLLOUT armed: the kernel's buffer was full */
	bool reading;  /* EPOLLIN armed */
	rpc_out *q;    /* answers to write, q[qhead..qlen) */
	size_t qhead, qlen, qcap;
} rpc_conn;

typedef struct rpc_loop {
	int tag; /* TAG_WAKE: its eventfd's data */
	struct rpc_tcp *t;
	pthread_t th;
	bool started;
	int ep;             /* epoll */
	int efd;            /* eventfd: stop, or connections to resume */
	pthread_mutex_t mu; /* protects resume */
	rpc_conn *resume;   /* held connections that may read again (each with a ref) */
} rpc_loop;

struct rpc_tcp {
	int ltag; /* TAG_LISTEN */
	kv_rpc_handler handler;
	void *arg;
	unsigned contexts;  /* requests of one connection waiting at once */
	size_t max_msg;     /* largest message read */
	unsigned max_conns; /* 0: no bound */
	int lfd;            /* the listening socket */
	unsigned nloops;
	rpc_loop *loops;
	atomic_uint next_loop; /* accepted connections go round the loops */
	atomic_bool closing;   /* destroy has begun */
	atomic_uint nconns;    /* connections open */
	atomic_uint_fast64_t refused;
	atomic_int refs;       /* 1 (the server) + one per connection not freed */
	pthread_mutex_t cmu;   /* protects conns */
	rpc_conn *conns;       /* every connection not closed */
	pthread_mutex_t wq_mu; /* protects wq_head, wq_tail, wq_stop */
	pthread_cond_t wq_cv;
	kv_rpc_pending *wq_head, *wq_tail;
	bool wq_stop;
	pthread_t workers[RPC_WORKERS];
	unsigned nworkers;
};

bool
rpc_tcp_url(const char *url)
{
	return url != NULL && (strncmp(url, "tcp://", 6) == 0 || strncmp(url, "tcp4://", 7) == 0 ||
	                       strncmp(url, "tcp6://", 7) == 0);
}

/* ------------------------------------------------------------------------
 * Lifetimes
 * ------------------------------------------------------------------------ */

static void
tcp_unref(struct rpc_tcp *t)
{
	if (atomic_fetch_sub(&t->refs, 1) != 1)
		return;
	pthread_mutex_destroy(&t->cmu);
	pthread_mutex_destroy(&t->wq_mu);
	pthread_cond_destroy(&t->wq_cv);
	for (unsigned i = 0; i < t->nloops; i++)
		pthread_mutex_destroy(&t->loops[i].mu);
	free(t->loops);
	free(t);
}

static void
conn_unref(rpc_conn *c)
{
	if (atomic_fetch_sub(&c->refs, 1) != 1)
		return;
	struct rpc_tcp *t = c->t;
	for (size_t i = c->qhead; i < c->qlen; i++)
		if (c->q[i].msg)
			nng_msg_free(c->q[i].msg);
	free(c->q);
	free(c->rbuf);
	free(c->spare);
	nng_msg_free(c->req_spare);
	pthread_mutex_destroy(&c->wmu);
	free(c);
	tcp_unref(t);
}

/* The epoll mask the connection wants now. Under c->wmu. */
static void
conn_arm_locked(rpc_conn *c)
{
	struct epoll_event ev = {
	    .events = (c->reading ? EPOLLIN : 0u) | (c->want_out ? EPOLLOUT : 0u), .data.ptr = c};
	if (!c->dead)
		(void)epoll_ctl(c->l->ep, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Whether c has as many requests waiting for answers, or answers waiting to
 * be written, as it may: its loop then stops reading it, so a peer that
 * sends and never reads holds a bounded amount of the server's memory. */
static bool
conn_full(rpc_conn *c)
{
	return atomic_load(&c->waiting) + atomic_load(&c->unsent) >= c->t->contexts;
}

/* Closes a connection: its loop's thread only (or destroy's, once the loops
 * have stopped). Queued answers are dropped; later ones too. */
static void
conn_close(rpc_conn *c)
{
	struct rpc_tcp *t = c->t;

	if (c->closed)
		return;
	c->closed = true;
	pthread_mutex_lock(&c->wmu);
	c->dead = true;
	(void)epoll_ctl(c->l->ep, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	c->fd = -1;
	for (size_t i = c->qhead; i < c->qlen; i++)
		if (c->q[i].msg)
			nng_msg_free(c->q[i].msg);
	atomic_fetch_sub(&c->unsent, (unsigned)(c->qlen - c->qhead));
	c->qhead = c->qlen = 0;
	pthread_mutex_unlock(&c->wmu);
	pthread_mutex_lock(&t->cmu);
	if (c->prev)
		c->prev->next = c->next;
	else
		t->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	c->prev = c->next = NULL;
	pthread_mutex_unlock(&t->cmu);
	atomic_fetch_sub(&t->nconns, 1);
	free(c->rbuf);
	c->rbuf = NULL;
	c->rcap = c->rlen = c->roff = 0;
	conn_unref(c); /* the loop's */
}

/* ------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------ */

/* Writes what is queued, as far as the kernel takes it. Under c->wmu. A
 * full buffer arms EPOLLOUT; a failed write leaves the connection to its
 * loop, which sees the error on its next read. */
static void
conn_flush_locked(rpc_conn *c)
{
	while (!c->dead && c->qhead < c->qlen) {
		struct iovec iov[WRITE_IOVS];
		unsigned n = 0;
		for (size_t i = c->qhead; i < c->qlen && n + 2 <= WRITE_IOVS; i++) {
			rpc_out *o = &c->q[i];
			if (o->off < o->prelen) {
				iov[n].iov_base = o->pre + o->off;
				iov[n++].iov_len = o->prelen - o->off;
			}
			if (o->msg != NULL) {
				size_t boff = o->off > o->prelen ? o->off - o->prelen : 0;
				size_t blen = nng_msg_len(o->msg);
				if (blen > boff) {
					iov[n].iov_base = (uint8_t *)nng_msg_body(o->msg) + boff;
					iov[n++].iov_len = blen - boff;
				}
			}
		}
		struct msghdr mh = {.msg_iov = iov, .msg_iovlen = n};
		ssize_t w = sendmsg(c->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				if (!c->want_out) {
					c->want_out = true;
					conn_arm_locked(c);
				}
				return;
			}
			/* Broken: drop what is queued; the loop closes it. */
			for (size_t i = c->qhead; i < c->qlen; i++)
				if (c->q[i].msg)
					nng_msg_free(c->q[i].msg);
			atomic_fetch_sub(&c->unsent, (unsigned)(c->qlen - c->qhead));
			c->qhead = c->qlen = 0;
			break;
		}
		size_t left = (size_t)w;
		while (c->qhead < c->qlen) {
			rpc_out *o = &c->q[c->qhead];
			size_t total = o->prelen + (o->msg ? nng_msg_len(o->msg) : 0);
			size_t rest = total - o->off;
			if (left < rest) {
				o->off += left;
				break;
			}
			left -= rest;
			if (o->msg)
				nng_msg_free(o->msg);
			c->qhead++;
			atomic_fetch_sub(&c->unsent, 1);
		}
	}
	if (c->qhead == c->qlen) {
		c->qhead = c->qlen = 0;
		if (c->want_out) {
			c->want_out = false;
			conn_arm_locked(c);
		}
	}
}

/* Queues an answer (taken) with its backtrace; writes it now unless the
 * loop is in a round on this connection. Any thread. */
static void
conn_send(rpc_conn *c, const uint8_t *bt, size_t btlen, nng_msg *msg)
{
	pthread_mutex_lock(&c->wmu);
	if (c->dead) {
		pthread_mutex_unlock(&c->wmu);
		nng_msg_free(msg);
		return;
	}
	if (c->qlen == c->qcap) {
		size_t nc = c->qcap ? c->qcap * 2 : 16;
		rpc_out *q = realloc(c->q, nc * sizeof(*q));
		if (q == NULL) {
			/* No memory: the answer is lost and the client times out,
			 * as with a dropped request. */
			pthread_mutex_unlock(&c->wmu);
			nng_msg_free(msg);
			return;
		}
		c->q = q;
		c->qcap = nc;
	}
	rpc_out *o = &c->q[c->qlen++];
	o->msg = msg;
	o->off = 0;
	o->prelen = (uint8_t)(8 + btlen);
	kv_put64be(o->pre, (uint64_t)btlen + nng_msg_len(msg));
	memcpy(o->pre + 8, bt, btlen);
	atomic_fetch_add(&c->unsent, 1);
	if (!c->in_round && !c->want_out)
		conn_flush_locked(c);
	pthread_mutex_unlock(&c->wmu);
}

/* ------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------ */

/* Lets the loop read c again if it was held and there is room now: one
 * request fewer waits for its answer, or answers have left. Any thread,
 * no lock held. */
static void
conn_maybe_resume(rpc_conn *c)
{
	if (!conn_full(c) && atomic_exchange(&c->held, false)) {
		rpc_loop *l = c->l;
		pthread_mutex_lock(&l->mu);
		/* Not once destroy has closed it; and once only: the loop may
		 * read, fill and be held again (and a second thread clear it)
		 * before it takes the list, and a second link would make c its
		 * own successor, each pass dropping a reference. */
		if (l->efd >= 0 && !c->rqueued) {
			atomic_fetch_add(&c->refs, 1);
			c->rnext = l->resume;
			c->rqueued = true;
			l->resume = c;
			uint64_t one = 1;
			ssize_t w = write(l->efd, &one, sizeof(one));
			(void)w;
		}
		pthread_mutex_unlock(&l->mu);
	}
}

/* A request of c's is answered (or dropped) and its slot given back: lets
 * the loop read again if it was held, and drops the slot's reference. */
static void
request_done(rpc_conn *c)
{
	atomic_fetch_sub(&c->waiting, 1);
	conn_maybe_resume(c);
	conn_unref(c);
}

/* What follows a handler's return, on a loop or a worker. */
static void
request_after(rpc_conn *c, kv_rpc_pending *p, int rv, nng_msg *reply)
{
	if (rv == KV_RPC_DEFERRED)
		return; /* p is the answerer's now */
	if (rv == 0 && reply != NULL)
		conn_send(c, p->bt, p->btlen, reply);
	else if (reply != NULL)
		nng_msg_free(reply);
	free(p);
	request_done(c);
}

void
rpc_tcp_reply(kv_rpc_pending *p, nng_msg *msg)
{
	rpc_conn *c = p->conn;

	if (msg != NULL)
		conn_send(c, p->bt, p->btlen, msg);
	free(p);
	request_done(c);
}

static void
worker_queue(struct rpc_tcp *t, kv_rpc_pending *p)
{
	pthread_mutex_lock(&t->wq_mu);
	p->next = NULL;
	if (t->wq_tail)
		t->wq_tail->next = p;
	else
		t->wq_head = p;
	t->wq_tail = p;
	pthread_cond_signal(&t->wq_cv);
	pthread_mutex_unlock(&t->wq_mu);
}

static void *
worker_main(void *arg)
{
	struct rpc_tcp *t = arg;

	kv_log_thread_name("kv-rpc-worker");
	for (;;) {
		pthread_mutex_lock(&t->wq_mu);
		while (t->wq_head == NULL && !t->wq_stop)
			pthread_cond_wait(&t->wq_cv, &t->wq_mu);
		kv_rpc_pending *p = t->wq_head;
		if (p == NULL) {
			pthread_mutex_unlock(&t->wq_mu);
			return NULL;
		}
		t->wq_head = p->next;
		if (t->wq_head == NULL)
			t->wq_tail = NULL;
		pthread_mutex_unlock(&t->wq_mu);
		rpc_conn *c = p->conn;
		nng_msg *req = p->req, *reply = NULL;
		p->req = NULL;
		p->may_block = true;
		int rv = t->handler(t->arg, req, &reply, p);
		nng_msg_free(req);
		if (rv == KV_RPC_BLOCKING)
			rv = KV_ECLOSED; /* asked again: drop it */
		request_after(c, p, rv, reply);
	}
}

/* Hands one whole request (bt words, then body) to the handler. Returns
 * false when the connection must be closed (no memory for its slot). */
static bool
conn_request(rpc_conn *c, const uint8_t *bt, size_t btlen, const uint8_t *body, size_t len)
{
	struct rpc_tcp *t = c->t;
	kv_rpc_pending *p = c->spare;
	nng_msg *req, *reply = NULL;

	if (p == NULL && (p = kv_zalloc(1, sizeof(*p))) == NULL)
		return false;
	c->spare = NULL;
	/* The handler does not keep the request (rpc.h), so the previous
	 * one's message is filled again: no allocation, no zeroing and no
	 * free per request. */
	if ((req = c->req_spare) != NULL) {
		c->req_spare = NULL;
		nng_msg_clear(req);
		nng_msg_header_clear(req);
		if (nng_msg_append(req, body, len) != 0) {
			nng_msg_free(req);
			req = NULL;
		}
	}
	if (req == NULL) {
		if (nng_msg_alloc(&req, len) != 0) {
			c->spare = p;
			return true; /* dropped, as nng drops what it cannot hold */
		}
		if (len)
			memcpy(nng_msg_body(req), body, len);
	}
	p->conn = c;
	p->may_block = false;
	p->btlen = (uint8_t)btlen;
	memcpy(p->bt, bt, btlen);
	atomic_fetch_add(&c->refs, 1);
	atomic_fetch_add(&c->waiting, 1);
	int rv = t->handler(t->arg, req, &reply, p);
	if (rv == KV_RPC_BLOCKING) {
		if (reply)
			nng_msg_free(reply);
		p->req = req;
		worker_queue(t, p);
		return true;
	}
	if (nng_msg_capacity(req) <= REQ_KEEP)
		c->req_spare = req;
	else
		nng_msg_free(req);
	if (rv == KV_RPC_DEFERRED)
		return true;
	/* Answered now: the slot is kept for the next request. */
	if (rv == 0 && reply != NULL)
		conn_send(c, p->bt, p->btlen, reply);
	else if (reply != NULL)
		nng_msg_free(reply);
	c->spare = p;
	atomic_fetch_sub(&c->waiting, 1);
	atomic_fetch_sub(&c->refs, 1); /* the loop still holds one */
	return true;
}

/* Handles the whole messages in the read buffer. Returns false when the
 * connection must be closed. Stops early when `contexts` requests wait. */
static bool
conn_parse(rpc_conn *c)
{
	struct rpc_tcp *t = c->t;

	if (!c->hello) {
		if (c->rlen - c->roff < 8)
			return true;
		const uint8_t *h = c->rbuf + c->roff;
		if (!rpc_sp_hello_is(h, SP_PROTO_REQ))
			return false;
		c->hello = true;
		c->roff += 8;
	}
	while (c->rlen - c->roff >= 8) {
		if (conn_full(c)) {
			atomic_store(&c->held, true);
			/* An answer may have come or left in between: whoever
			 * clears `held` first carries on. */
			if (conn_full(c) || !atomic_exchange(&c->held, false))
				return true;
		}
		const uint8_t *f = c->rbuf + c->roff;
		uint64_t len = kv_get64be(f);
		if (len > t->max_msg || len < 4)
			return false;
		if (c->rlen - c->roff - 8 < len) {
			/* Make room for the whole message. */
			size_t need = 8 + (size_t)len;
			if (c->roff > 0) {
				memmove(c->rbuf, c->rbuf + c->roff, c->rlen - c->roff);
				c->rlen -= c->roff;
				c->roff = 0;
			}
			if (need > c->rcap) {
				uint8_t *nb = realloc(c->rbuf, need);
				if (nb == NULL)
					return false;
				c->rbuf = nb;
				c->rcap = need;
			}
			return true;
		}
		const uint8_t *m = f + 8;
		size_t bt = 0;
		unsigned hops = 0;
		bool end = false, drop = false;
		while (!end) {
			if (bt + 4 > len)
				return false; /* garbage: nng disconnects too */
			if (++hops > SP_MAX_HOPS) {
				drop = true;
				break;
			}
			end = (m[bt] & 0x80u) != 0;
			bt += 4;
		}
		c->roff += 8 + (size_t)len;
		if (!drop && !conn_request(c, m, bt, m + bt, (size_t)len - bt))
			return false;
	}
	return true;
}

/* Reads what has arrived and handles it; answers given meanwhile go out
 * in one write at the end. Returns false when the connection must close. */
static bool
conn_read(rpc_conn *c)
{
	bool ok = true;
	int reads = 0;

	pthread_mutex_lock(&c->wmu);
	c->in_round = true;
	pthread_mutex_unlock(&c->wmu);
	kv_defer_begin();
	while (ok && !atomic_load(&c->held)) {
		if (c->roff == c->rlen) {
			c->roff = c->rlen = 0;
			if (c->rcap > RBUF_KEEP) {
				free(c->rbuf);
				c->rbuf = NULL;
				c->rcap = 0;
			}
		}
		if (c->rbuf == NULL) {
			if ((c->rbuf = malloc(RBUF_MIN)) == NULL) {
				ok = false;
				break;
			}
			c->rcap = RBUF_MIN;
		}
		if (c->rlen == c->rcap) {
			if (c->roff > 0) {
				memmove(c->rbuf, c->rbuf + c->roff, c->rlen - c->roff);
				c->rlen -= c->roff;
				c->roff = 0;
			} else {
				break; /* conn_parse sized it for the message */
			}
		}
		size_t want = c->rcap - c->rlen;
		ssize_t n = recv(c->fd, c->rbuf + c->rlen, want, MSG_DONTWAIT);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n <= 0) {
			ok = false;
			break;
		}
		c->rlen += (size_t)n;
		ok = conn_parse(c);
		/* A short read emptied the kernel's buffer; a few full ones in a
		 * row yield to the loop's other connections. */
		if ((size_t)n < want || ++reads >= 4)
			break;
	}
	/* what the handlers left to the round's end (the log's write, whose
	 * answers then go out with the others below) */
	kv_defer_end();
	pthread_mutex_lock(&c->wmu);
	c->in_round = false;
	if (ok && atomic_load(&c->held) && c->reading) {
		c->reading = false;
		conn_arm_locked(c);
	}
	conn_flush_locked(c);
	pthread_mutex_unlock(&c->wmu);
	if (ok)
		conn_maybe_resume(c); /* the answers just written made room */
	return ok;
}

/* A held connection may read again: what is buffered first. */
static void
conn_resume(rpc_conn *c)
{
	bool ok;

	if (c->closed)
		return;
	pthread_mutex_lock(&c->wmu);
	c->in_round = true;
	pthread_mutex_unlock(&c->wmu);
	ok = conn_parse(c);
	pthread_mutex_lock(&c->wmu);
	c->in_round = false;
	if (ok && !atomic_load(&c->held) && !c->reading) {
		c->reading = true;
		conn_arm_locked(c);
	}
	conn_flush_locked(c);
	pthread_mutex_unlock(&c->wmu);
	if (!ok)
		conn_close(c);
	else
		conn_maybe_resume(c);
}

/* ------------------------------------------------------------------------
 * Accepting and the loops
 * ------------------------------------------------------------------------ */

static void
accept_all(struct rpc_tcp *t)
{
	for (;;) {
		int fd = accept4(t->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EMFILE || errno == ENFILE)
				KV_WARN(COMP, "cannot accept a connection", "err=\"%s\"",
				        strerror(errno));
			return;
		}
		if (atomic_load(&t->closing)) {
			close(fd);
			continue;
		}
		/* The place is taken before the check, so that loops accepting
		 * at once cannot all pass it. */
		if (atomic_fetch_add(&t->nconns, 1) >= t->max_conns && t->max_conns) {
			atomic_fetch_sub(&t->nconns, 1);
			if (atomic_fetch_add(&t->refused, 1) % 1000 == 0)
				KV_WARN(COMP, "connection refused: too many connections", "max=%u",
				        t->max_conns);
			close(fd);
			continue;
		}
		int one = 1;
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		rpc_conn *c = calloc(1, sizeof(*c));
		if (c == NULL) {
			atomic_fetch_sub(&t->nconns, 1);
			close(fd);
			continue;
		}
		c->tag = TAG_CONN;
		c->t = t;
		c->fd = fd;
		c->l = &t->loops[atomic_fetch_add(&t->next_loop, 1) % t->nloops];
		atomic_init(&c->refs, 1);
		c->reading = true;
		pthread_mutex_init(&c->wmu, NULL);
		/* Our half of the greeting: 8 bytes always fit a new socket's
		 * buffer; one that does not take them is closed. */
		uint8_t hello[8];
		rpc_sp_hello(hello, SP_PROTO_REP);
		if (send(fd, hello, sizeof(hello), MSG_NOSIGNAL | MSG_DONTWAIT) !=
		    (ssize_t)sizeof(hello)) {
			pthread_mutex_destroy(&c->wmu);
			free(c);
			atomic_fetch_sub(&t->nconns, 1);
			close(fd);
			continue;
		}
		atomic_fetch_add(&t->refs, 1);
		pthread_mutex_lock(&t->cmu);
		c->next = t->conns;
		if (t->conns)
			t->conns->prev = c;
		t->conns = c;
		pthread_mutex_unlock(&t->cmu);
		struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
		atomic_store_explicit(&c->ready, true, memory_order_release);
		if (epoll_ctl(c->l->ep, EPOLL_CTL_ADD, fd, &ev) != 0)
			conn_close(c); /* never seen by its loop */
	}
}

static void
loop_resume(rpc_loop *l)
{
	uint64_t v;
	ssize_t r = read(l->efd, &v, sizeof(v));
	(void)r;
	pthread_mutex_lock(&l->mu);
	rpc_conn *c = l->resume;
	l->resume = NULL;
	pthread_mutex_unlock(&l->mu);
	while (c != NULL) {
		/* Its successor is read before it may be queued again (which
		 * rewrites rnext, with a reference of its own). */
		pthread_mutex_lock(&l->mu);
		rpc_conn *n = c->rnext;
		c->rqueued = false;
		pthread_mutex_unlock(&l->mu);
		conn_resume(c);
		conn_unref(c);
		c = n;
	}
}

static void *
loop_main(void *arg)
{
	rpc_loop *l = arg;
	struct rpc_tcp *t = l->t;
	struct epoll_event ev[EVENTS_PER_RUN];

	kv_log_thread_name("kv-rpc-loop");
	while (!atomic_load(&t->closing)) {
		int n = epoll_wait(l->ep, ev, EVENTS_PER_RUN, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			KV_ERROR(COMP, "event loop failed", "err=\"%s\"", strerror(errno));
			break;
		}
		for (int i = 0; i < n && !atomic_load(&t->closing); i++) {
			int tag = *(int *)ev[i].data.ptr;
			if (tag == TAG_LISTEN) {
				accept_all(t);
			} else if (tag == TAG_WAKE) {
				loop_resume(l);
			} else {
				rpc_conn *c = ev[i].data.ptr;
				bool ok = atomic_load_explicit(&c->ready, memory_order_acquire);
				if (ev[i].events & EPOLLOUT) {
					pthread_mutex_lock(&c->wmu);
					conn_flush_locked(c);
					pthread_mutex_unlock(&c->wmu);
					conn_maybe_resume(c);
				}
				if (ev[i].events & (EPOLLERR | EPOLLHUP))
					ok = false; /* the peer is gone: no answer can reach it */
				else if (ev[i].events & EPOLLIN)
					ok = conn_read(c);
				if (!ok)
					conn_close(c);
			}
		}
	}
	return NULL;
}

/* ------------------------------------------------------------------------
 * Create and destroy
 * ------------------------------------------------------------------------ */

int
rpc_url_split(const char *url, char *host, size_t hostlen, char *port, size_t portlen, int *family)
{
	const char *rest = strstr(url, "://");
	const char *colon;

	if (rest == NULL)
		return KV_EINVAL;
	*family = AF_UNSPEC;
	if (strncmp(url, "tcp4://", 7) == 0)
		*family = AF_INET;
	else if (strncmp(url, "tcp6://", 7) == 0)
		*family = AF_INET6;
	rest += 3;
	if (*rest == '[') {
		const char *end = strchr(rest, ']');
		if (end == NULL || end[1] != ':' || (size_t)(end - rest - 1) >= hostlen)
			return KV_EINVAL;
		memcpy(host, rest + 1, (size_t)(end - rest - 1));
		host[end - rest - 1] = 0;
		colon = end + 1;
	} else {
		colon = strrchr(rest, ':');
		if (colon == NULL || (size_t)(colon - rest) >= hostlen)
			return KV_EINVAL;
		memcpy(host, rest, (size_t)(colon - rest));
		host[colon - rest] = 0;
	}
	if (strlen(colon + 1) == 0 || strlen(colon + 1) >= portlen ||
	    strspn(colon + 1, "0123456789") != strlen(colon + 1))
		return KV_EINVAL;
	strcpy(port, colon + 1);
	if (strcmp(host, "*") == 0)
		host[0] = 0;
	return KV_OK;
}

static int
listen_on(const char *url, int *out)
{
	char host[256], port[16];
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai = NULL;
	int family, rv, fd = -1;

	if ((rv = rpc_url_split(url, host, sizeof(host), port, sizeof(port), &family)) != 0)
		return rv;
	hints.ai_family = family;
	if (getaddrinfo(host[0] ? host : NULL, port, &hints, &ai) != 0 || ai == NULL)
		return KV_EINVAL;
	rv = KV_EINVAL;
	for (struct addrinfo *a = ai; a != NULL; a = a->ai_next) {
		fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
		            a->ai_protocol);
		if (fd < 0) {
			rv = kv_err_from_errno(errno);
			continue;
		}
		int one = 1;
		(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0) {
			rv = KV_OK;
			break;
		}
		rv = kv_err_from_errno(errno);
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	*out = fd;
	return rv;
}

unsigned
rpc_tcp_conns(const struct rpc_tcp *t)
{
	return atomic_load(&((struct rpc_tcp *)t)->nconns);
}

static void
stop_threads(struct rpc_tcp *t)
{
	atomic_store(&t->closing, true);
	for (unsigned i = 0; i < t->nloops; i++) {
		if (t->loops[i].efd >= 0) {
			uint64_t one = 1;
			ssize_t w = write(t->loops[i].efd, &one, sizeof(one));
			(void)w;
		}
	}
	for (unsigned i = 0; i < t->nloops; i++)
		if (t->loops[i].started)
			pthread_join(t->loops[i].th, NULL);
	pthread_mutex_lock(&t->wq_mu);
	t->wq_stop = true;
	pthread_cond_broadcast(&t->wq_cv);
	pthread_mutex_unlock(&t->wq_mu);
	for (unsigned i = 0; i < t->nworkers; i++)
		pthread_join(t->workers[i], NULL);
}

void
rpc_tcp_destroy(struct rpc_tcp *t)
{
	if (t == NULL)
		return;
	stop_threads(t);
	/* Requests that never reached a worker are dropped. */
	pthread_mutex_lock(&t->wq_mu);
	kv_rpc_pending *p = t->wq_head;
	t->wq_head = t->wq_tail = NULL;
	pthread_mutex_unlock(&t->wq_mu);
	while (p != NULL) {
		kv_rpc_pending *n = p->next;
		nng_msg_free(p->req);
		p->req = NULL;
		request_after(p->conn, p, KV_ECLOSED, NULL);
		p = n;
	}
	if (t->lfd >= 0)
		close(t->lfd);
	rpc_conn *c;
	for (;;) {
		pthread_mutex_lock(&t->cmu);
		c = t->conns;
		pthread_mutex_unlock(&t->cmu);
		if (c == NULL)
			break;
		conn_close(c);
	}
	for (unsigned i = 0; i < t->nloops; i++) {
		rpc_loop *l = &t->loops[i];
		if (l->ep >= 0)
			close(l->ep);
		pthread_mutex_lock(&l->mu);
		if (l->efd >= 0)
			close(l->efd);
		l->efd = -1;
		c = l->resume; /* posted since the loops stopped */
		l->resume = NULL;
		pthread_mutex_unlock(&l->mu);
		while (c != NULL) {
			rpc_conn *n = c->rnext;
			conn_unref(c);
			c = n;
		}
	}
	tcp_unref(t);
}

int
rpc_tcp_create(const kv_rpc_server_opts *o, struct rpc_tcp **out)
{
	struct rpc_tcp *t = calloc(1, sizeof(*t));
	int rv;

	if (t == NULL)
		return KV_ENOMEM;
	t->ltag = TAG_LISTEN;
	t->handler = o->handler;
	t->arg = o->arg;
	t->contexts = o->contexts ? o->contexts : 64;
	t->max_msg = o->max_msg ? o->max_msg : KV_RPC_MAX_MSG;
	t->max_conns = o->max_conns;
	t->lfd = -1;
	atomic_init(&t->refs, 1);
	pthread_mutex_init(&t->cmu, NULL);
	pthread_mutex_init(&t->wq_mu, NULL);
	pthread_cond_init(&t->wq_cv, NULL);
	t->nloops = o->loops;
	t->loops = calloc(t->nloops, sizeof(*t->loops));
	if (t->loops == NULL) {
		t->nloops = 0;
		tcp_unref(t);
		return KV_ENOMEM;
	}
	for (unsigned i = 0; i < t->nloops; i++) {
		rpc_loop *l = &t->loops[i];
		l->tag = TAG_WAKE;
		l->t = t;
		l->ep = l->efd = -1;
		pthread_mutex_init(&l->mu, NULL);
	}
	if ((rv = listen_on(o->url, &t->lfd)) != 0)
		goto fail;
	for (unsigned i = 0; i < t->nloops; i++) {
		rpc_loop *l = &t->loops[i];
		struct epoll_event wev = {.events = EPOLLIN, .data.ptr = l};
		struct epoll_event lev = {.events = EPOLLIN | EPOLLEXCLUSIVE, .data.ptr = t};
		if ((l->ep = epoll_create1(EPOLL_CLOEXEC)) < 0 ||
		    (l->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0 ||
		    epoll_ctl(l->ep, EPOLL_CTL_ADD, l->efd, &wev) != 0 ||
		    epoll_ctl(l->ep, EPOLL_CTL_ADD, t->lfd, &lev) != 0) {
			rv = kv_err_from_errno(errno);
			goto fail;
		}
	}
	for (unsigned i = 0; i < t->nloops; i++) {
		if (pthread_create(&t->loops[i].th, NULL, loop_main, &t->loops[i]) != 0) {
			rv = KV_ENOMEM;
			goto fail;
		}
		t->loops[i].started = true;
	}
	for (; t->nworkers < RPC_WORKERS; t->nworkers++) {
		if (pthread_create(&t->workers[t->nworkers], NULL, worker_main, t) != 0) {
			rv = KV_ENOMEM;
			goto fail;
		}
	}
	*out = t;
	return KV_OK;
fail:
	rpc_tcp_destroy(t);
	return rv;
}
