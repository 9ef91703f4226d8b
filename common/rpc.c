/*
 * rpc.c - nng request/reply plumbing (see rpc.h).
 *
 * Server: one REP socket, a fixed pool of contexts, each with one aio whose
 * callback walks RECV -> (handler) -> SEND -> RECV. A deferred request parks
 * its context until kv_rpc_reply() sends the answer; the pool size bounds
 * how many requests can wait at once. No lock is needed: each context is
 * touched only by its own callback chain, and kv_rpc_reply() only starts a
 * send on an idle context.
 */
#include "common/rpc.h"
#include "common/rpc_int.h"
#include "common/err.h"
#include "common/log.h"

#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <dirent.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { RPC_RECV = 1, RPC_SEND = 2, RPC_DEFERRED = 3, RPC_HANDLING = 4 };

struct kv_rpc_server {
	struct rpc_tcp *tcp;          /* the event-loop server (opts.loops); NULL: nng's */
	nng_socket sock;              /* REP socket */
	kv_rpc_handler handler;       /* request handler */
	void *arg;                    /* its argument */
	unsigned n;                   /* contexts */
	kv_rpc_pending *slots;        /* n request slots */
	atomic_bool closing;          /* destroy has begun: callbacks stop re-arming */
	unsigned max_conns;           /* connections accepted at once; 0: no bound */
	atomic_uint conns;            /* connections now (npipes, for lock-free reads) */
	atomic_uint_fast64_t refused; /* connections refused over max_conns */
	pthread_mutex_t pipe_mu;      /* protects pipes, npipes, cappipes (a leaf) */
	uint32_t *pipes;              /* ids of the counted connections */
	size_t npipes;                /* entries in pipes */
	size_t cappipes;              /* allocated */
};

/* Pipe events. A connection is counted in ADD_PRE when there is room and
 * its id remembered; one over the bound is closed there and never counted.
 * REM_POST uncounts only remembered ids, so the count stays exact whichever
 * events nng delivers for a pipe closed while it is being set up. */
static void
rpc_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	kv_rpc_server *s = arg;
	uint32_t id = (uint32_t)nng_pipe_id(p);

	pthread_mutex_lock(&s->pipe_mu);
	if (ev == NNG_PIPE_EV_ADD_PRE) {
		bool room = s->max_conns == 0 || s->npipes < s->max_conns;
		if (room && s->npipes == s->cappipes) {
			size_t nc = s->cappipes ? s->cappipes * 2 : 64;
			uint32_t *n = realloc(s->pipes, nc * sizeof(*n));
			if (n == NULL) {
				room = false;
			} else {
				s->pipes = n;
				s->cappipes = nc;
			}
		}
		if (room) {
			s->pipes[s->npipes++] = id;
			atomic_store(&s->conns, (unsigned)s->npipes);
		}
		pthread_mutex_unlock(&s->pipe_mu);
		if (!room) {
			if (atomic_fetch_add(&s->refused, 1) % 1000 == 0)
				KV_WARN("rpc", "connection refused: too many connections", "max=%u",
				        s->max_conns);
			nng_pipe_close(p);
		}
		return;
	}
	if (ev == NNG_PIPE_EV_REM_POST) {
		for (size_t i = 0; i < s->npipes; i++) {
			if (s->pipes[i] == id) {
				s->pipes[i] = s->pipes[--s->npipes];
				atomic_store(&s->conns, (unsigned)s->npipes);
				break;
			}
		}
	}
	pthread_mutex_unlock(&s->pipe_mu);
}

/*
 * A dialer whose connect attempt hangs (the peer's SYNs are dropped, e.g.
 * by a partition) only tries again when the kernel gives up, after its SYN
 * retransmissions (about two minutes); its next SYN can come a minute after
 * the network healed. So a call that finds no connection at all for
 * RPC_REDIAL_MS replaces the dialer, which starts a fresh connect at once.
 * A client with a connection never redials (a slow pipe is left alone).
 */
#define RPC_REDIAL_MS 2000

struct kv_rpc_client {
	nng_socket sock;          /* REQ socket */
	char *url;                /* dialed URL */
	const kv_tls *tls;        /* TLS configuration of a tls+tcp:// url (borrowed); else NULL */
	atomic_int pipes;         /* connections open now (pipe events) */
	pthread_mutex_t mu;       /* protects dialer and dial_time */
	nng_dialer dialer;        /* the current dialer */
	nng_time dial_time;       /* when it was started */
	atomic_bool fail_refused; /* kv_rpc_client_fail_refused */
	atomic_uint connect_wait; /* kv_rpc_client_connect_wait (ms; 0: none) */
	/* A plain tcp:// client's asynchronous callers run on a link
	 * (rpc_lcall.c), and its socket dials only for the first
	 * kv_rpc_call: a data server's client makes one connection, not two. */
	rpc_lc *lc;  /* the link state (tcp:// only), or NULL */
	bool dialed; /* the socket has a dialer (under mu) */
};

/* The detail of the last failed kv_rpc_call on this thread (kv_rpc_why). */
static _Thread_local char rpc_why[384];

/* The last failed kv_rpc_call on this thread met a refused connection. */
static _Thread_local bool rpc_refused;

/* A TLS call that has no connection after RPC_PROBE_AFTER_MS spends up to
 * RPC_PROBE_MS finding out whether the handshake is what fails. */
#define RPC_PROBE_AFTER_MS 300u
#define RPC_PROBE_MS       1000u

const char *
kv_rpc_why(void)
{
	return rpc_why;
}

bool
kv_rpc_refused(void)
{
	return rpc_refused;
}

void
kv_rpc_client_fail_refused(kv_rpc_client *c, bool on)
{
	if (c != NULL)
		atomic_store(&c->fail_refused, on);
}

void
kv_rpc_client_connect_wait(kv_rpc_client *c, uint32_t ms)
{
	if (c != NULL)
		atomic_store(&c->connect_wait, ms);
}

bool
kv_rpc_client_connected(const kv_rpc_client *c)
{
	return atomic_load(&((kv_rpc_client *)c)->pipes) > 0 || rpc_lc_connected(c->lc);
}

/*
 * One plain TCP connection attempt to a tcp:// (or tls+tcp://) url, with a socket of its
 * own (not nng: none of nng 1.5's close traps of REQ sockets, and no nng
 * object to reap). Returns whether it was refused: the host is reachable
 * and nothing listens on the port. A connection that is made, times out,
 * or an address that is not tcp:// or tls+tcp:// or does not resolve says nothing and
 * returns false.
 */
bool
kv_rpc_probe_refused(const char *url, uint32_t timeout_ms)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
	char host[256], port[16];
	bool refused = false;
	int family;

	/* TLS rides TCP: a refused port is refused the same. */
	if (strncmp(url, "tcp://", 6) != 0 && strncmp(url, "tls+tcp://", 10) != 0)
		return false;
	if (rpc_url_split(url, host, sizeof(host), port, sizeof(port), &family) != KV_OK ||
	    host[0] == '\0')
		return false;
	if (getaddrinfo(host, port, &hints, &ai) != 0 || ai == NULL)
		return false;
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd >= 0) {
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
			if (errno == ECONNREFUSED) {
				refused = true;
			} else if (errno == EINPROGRESS) {
				struct pollfd pfd = {.fd = fd, .events = POLLOUT};
				int err = 0;
				socklen_t len = sizeof(err);
				if (poll(&pfd, 1, (int)timeout_ms) == 1 &&
				    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0)
					refused = err == ECONNREFUSED;
			}
		}
		close(fd);
	}
	freeaddrinfo(ai);
	return refused;
}

static void
rpc_ctx_cb(void *arg)
{
	kv_rpc_pending *p = arg;
	kv_rpc_server *s = p->s;
	nng_msg *req, *reply = NULL;
	bool drop;
	int rv, state;

	pthread_mutex_lock(&p->mu);
	state = p->state;
	pthread_mutex_unlock(&p->mu);
	if (atomic_load(&s->closing)) {
		nng_msg *m = nng_aio_get_msg(p->aio);
		nng_aio_set_msg(p->aio, NULL);
		if (m)
			nng_msg_free(m);
		return;
	}
	switch (state) {
	case RPC_RECV:
		rv = nng_aio_result(p->aio);
		if (rv != 0) {
			if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
				return;
			nng_ctx_recv(p->ctx, p->aio);
			return;
		}
		req = nng_aio_get_msg(p->aio);
		nng_aio_set_msg(p->aio, NULL);
		pthread_mutex_lock(&p->mu);
		p->state = RPC_HANDLING;
		p->answered = false;
		p->early = NULL;
		pthread_mutex_unlock(&p->mu);
		rv = s->handler(s->arg, req, &reply, p);
		nng_msg_free(req);
		if (rv == KV_RPC_DEFERRED) {
			pthread_mutex_lock(&p->mu);
			if (!p->answered) {
				p->state = RPC_DEFERRED;
				pthread_mutex_unlock(&p->mu);
				return;
			}
			reply = p->early; /* answered already, maybe with NULL (drop) */
			p->early = NULL;
			rv = 0;
			pthread_mutex_unlock(&p->mu);
		}
		drop = rv != 0 || reply == NULL;
		pthread_mutex_lock(&p->mu);
		p->state = drop ? RPC_RECV : RPC_SEND;
		pthread_mutex_unlock(&p->mu);
		if (drop) {
			if (reply)
				nng_msg_free(reply);
			nng_ctx_recv(p->ctx, p->aio); /* drop: REP forgets the request */
			return;
		}
		nng_aio_set_msg(p->aio, reply);
		nng_ctx_send(p->ctx, p->aio);
		return;
	case RPC_SEND:
		if (nng_aio_result(p->aio) != 0) {
			nng_msg *m = nng_aio_get_msg(p->aio);
			if (m)
				nng_msg_free(m);
			nng_aio_set_msg(p->aio, NULL);
			if (nng_aio_result(p->aio) == NNG_ECLOSED)
				return;
		}
		pthread_mutex_lock(&p->mu);
		p->state = RPC_RECV;
		pthread_mutex_unlock(&p->mu);
		nng_ctx_recv(p->ctx, p->aio);
		return;
	default:
		return;
	}
}

void
kv_rpc_reply(kv_rpc_pending *p, nng_msg *msg)
{
	if (p == NULL) {
		if (msg)
			nng_msg_free(msg);
		return;
	}
	if (p->conn != NULL) {
		rpc_tcp_reply(p, msg);
		return;
	}
	pthread_mutex_lock(&p->mu);
	if (atomic_load(&p->s->closing)) {
		pthread_mutex_unlock(&p->mu);
		if (msg)
			nng_msg_free(msg);
		return;
	}
	if (p->state == RPC_HANDLING && !p->answered) {
		/* The handler has not returned yet: it sends this when it does. */
		p->answered = true;
		p->early = msg;
		pthread_mutex_unlock(&p->mu);
		return;
	}
	if (p->state != RPC_DEFERRED) {
		pthread_mutex_unlock(&p->mu);
		if (msg)
			nng_msg_free(msg);
		return;
	}
	p->state = msg ? RPC_SEND : RPC_RECV;
	pthread_mutex_unlock(&p->mu);
	if (msg == NULL) {
		nng_ctx_recv(p->ctx, p->aio);
		return;
	}
	nng_aio_set_msg(p->aio, msg);
	nng_ctx_send(p->ctx, p->aio);
}

int
kv_rpc_server_create(const kv_rpc_server_opts *o, kv_rpc_server **out)
{
	kv_rpc_server *s;
	unsigned i;
	int rv;

	if (o == NULL || o->url == NULL || o->handler == NULL || out == NULL)
		return KV_EINVAL;
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return KV_ENOMEM;
	if (o->loops > 0 && rpc_tcp_url(o->url)) {
		if ((rv = rpc_tcp_create(o, &s->tcp)) != 0) {
			free(s);
			return rv;
		}
		*out = s;
		return KV_OK;
	}
	s->handler = o->handler;
	s->arg = o->arg;
	s->n = o->contexts ? o->contexts : 64;
	s->slots = calloc(s->n, sizeof(*s->slots));
	if (s->slots == NULL) {
		free(s);
		return KV_ENOMEM;
	}
	if ((rv = nng_rep0_open(&s->sock)) != 0)
		goto err_after_alloc;
	nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ, o->max_msg ? o->max_msg : KV_RPC_MAX_MSG);
	s->max_conns = o->max_conns;
	pthread_mutex_init(&s->pipe_mu, NULL);
	if ((rv = nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_PRE, rpc_pipe_cb, s)) != 0 ||
	    (rv = nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, rpc_pipe_cb, s)) != 0)
		goto err_after_open;
	for (i = 0; i < s->n; i++) {
		kv_rpc_pending *p = &s->slots[i];
		p->s = s;
		pthread_mutex_init(&p->mu, NULL);
		if ((rv = nng_ctx_open(&p->ctx, s->sock)) != 0 ||
		    (rv = nng_aio_alloc(&p->aio, rpc_ctx_cb, p)) != 0)
			goto err_after_open;
	}
	if ((rv = kv_tls_listen(s->sock, o->url, o->tls)) != 0)
		goto err_after_open_kv;
	for (i = 0; i < s->n; i++) {
		s->slots[i].state = RPC_RECV;
		nng_ctx_recv(s->slots[i].ctx, s->slots[i].aio);
	}
	*out = s;
	return KV_OK;

err_after_open:
	rv = kv_err_from_nng(rv);
err_after_open_kv: /* rv is a KV_E* code already */
	nng_close(s->sock);
	for (i = 0; i < s->n; i++)
		if (s->slots[i].aio)
			nng_aio_free(s->slots[i].aio);
	pthread_mutex_destroy(&s->pipe_mu);
	free(s->pipes);
	free(s->slots);
	free(s);
	return rv;
err_after_alloc:
	free(s->slots);
	free(s);
	return kv_err_from_nng(rv);
}

static void rpc_close_bounded(void (*close)(void *), void *arg, const char *what, bool server);

/* Closes the socket and frees the server: on the closing thread of
 * rpc_close_bounded, once every slot has stopped. */
static void
rpc_server_free_cb(void *arg)
{
	kv_rpc_server *s = arg;

	nng_close(s->sock);
	for (unsigned i = 0; i < s->n; i++) {
		nng_msg *m = nng_aio_get_msg(s->slots[i].aio);
		if (m)
			nng_msg_free(m);
		nng_aio_free(s->slots[i].aio);
		if (s->slots[i].early)
			nng_msg_free(s->slots[i].early);
		pthread_mutex_destroy(&s->slots[i].mu);
	}
	pthread_mutex_destroy(&s->pipe_mu);
	free(s->pipes);
	free(s->slots);
	free(s);
}

/* How long a server's destroy waits for its connections to go away after
 * it shut them down under nng: a read in flight fails at once, on nng's
 * poller; a pipe with no read in flight (no request slot was waiting) stays
 * and is closed after, with nothing arriving any more. */
#define RPC_DRAIN_MS 50

/* Whether a socket address of the kernel (sa) is nng's na. */
static bool
same_addr(const struct sockaddr_storage *sa, const nng_sockaddr *na)
{
	if (sa->ss_family == AF_INET && na->s_family == NNG_AF_INET) {
		const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
		return a->sin_port == na->s_in.sa_port && a->sin_addr.s_addr == na->s_in.sa_addr;
	}
	if (sa->ss_family == AF_INET6 && na->s_family == NNG_AF_INET6) {
		const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
		return a->sin6_port == na->s_in6.sa_port &&
		       memcmp(&a->sin6_addr, na->s_in6.sa_addr, 16) == 0;
	}
	return false;
}

/* Closes a descriptor made by a raw system call (pidfd_open, pidfd_getfd)
 * with one too. ThreadSanitizer tracks descriptors by number and never saw
 * these made: through its interceptors, a use or close of one would look
 * like a race with an earlier life of the same number in another thread.
 * So every call on them is a raw system call. */
static void
sys_close(int fd)
{
	(void)syscall(SYS_close, fd);
}

/*
 * Shuts down (shutdown(2), both ways) the TCP connection under each pipe of
 * ids[0..n), found by its local and peer addresses among this process's
 * sockets; nng keeps its descriptor and closes it itself once its read has
 * failed. Returns how many were shut down. A pipe whose addresses nng does
 * not give (not TCP) or whose connection is not found is left alone.
 *
 * The descriptors are nng's, which its threads may close (and the numbers
 * be reused) at any moment, so none is used by number: each socket listed
 * in /proc/self/fd is first duplicated with pidfd_getfd(2), and only that
 * duplicate, which keeps the socket itself whatever happens to the number,
 * is asked its addresses and shut down. Without pidfd_getfd (Linux before
 * 5.6, or refused) nothing is shut down.
 */
static size_t
rpc_shutdown_pipes(const uint32_t *ids, size_t n)
{
	nng_sockaddr *loc = calloc(n, sizeof(*loc)), *rem = calloc(n, sizeof(*rem));
	size_t done = 0, want = 0;
	int pidfd = -1;
	DIR *d = NULL;

	if (loc == NULL || rem == NULL)
		goto out;
	for (size_t i = 0; i < n; i++) {
		nng_pipe p = NNG_PIPE_INITIALIZER;
		p.id = ids[i];
		if (nng_pipe_get_addr(p, NNG_OPT_LOCADDR, &loc[i]) != 0 ||
		    nng_pipe_get_addr(p, NNG_OPT_REMADDR, &rem[i]) != 0 ||
		    (loc[i].s_family != NNG_AF_INET && loc[i].s_family != NNG_AF_INET6))
			loc[i].s_family = NNG_AF_UNSPEC;
		else
			want++;
	}
	if (want == 0 || (pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0)) < 0 ||
	    (d = opendir("/proc/self/fd")) == NULL)
		goto out;
	for (struct dirent *e; (e = readdir(d)) != NULL && done < want;) {
		char path[64], link[64];
		char *end;
		long fd = strtol(e->d_name, &end, 10);
		if (*end != 0 || end == e->d_name || fd < 0 || fd > INT32_MAX)
			continue;
		snprintf(path, sizeof(path), "/proc/self/fd/%ld", fd);
		ssize_t ll = readlink(path, link, sizeof(link) - 1);
		if (ll <= 0)
			continue;
		link[ll] = 0;
		if (strncmp(link, "socket:[", 8) != 0)
			continue;
		int dup = (int)syscall(SYS_pidfd_getfd, pidfd, (int)fd, 0);
		if (dup < 0)
			continue;
		struct sockaddr_storage a, b;
		socklen_t al = sizeof(a), bl = sizeof(b);
		/* Raw system calls on the duplicate (see sys_close). */
		if (syscall(SYS_getsockname, dup, (struct sockaddr *)&a, &al) == 0 &&
		    syscall(SYS_getpeername, dup, (struct sockaddr *)&b, &bl) == 0) {
			for (size_t i = 0; i < n; i++) {
				if (loc[i].s_family != NNG_AF_UNSPEC && same_addr(&a, &loc[i]) &&
				    same_addr(&b, &rem[i])) {
					if (syscall(SYS_shutdown, dup, SHUT_RDWR) == 0)
						done++;
					loc[i].s_family = NNG_AF_UNSPEC;
					break;
				}
			}
		}
		sys_close(dup);
	}
out:
	if (d != NULL)
		closedir(d);
	if (pidfd >= 0)
		sys_close(pidfd);
	free(loc);
	free(rem);
	return done;
}

void
kv_rpc_server_destroy(kv_rpc_server *s)
{
	if (s == NULL)
		return;
	if (s->tcp != NULL) {
		rpc_tcp_destroy(s->tcp);
		free(s);
		return;
	}
	/* Stop every slot before closing the socket: callbacks see `closing`
	 * and do not re-arm, deferred answers are dropped, and nng_close then
	 * has no operation in flight to wait for (closing first could hang when
	 * a deferred request was answered during shutdown). After the stops no
	 * callback runs again, so the handler's argument may go once this
	 * returns, even when the close itself is left to finish later. */
	atomic_store(&s->closing, true);
	for (unsigned i = 0; i < s->n; i++) {
		pthread_mutex_lock(&s->slots[i].mu);
		pthread_mutex_unlock(&s->slots[i].mu);
		nng_aio_stop(s->slots[i].aio);
	}
	for (unsigned i = 0; i < s->n; i++)
		nng_ctx_close(s->slots[i].ctx);
	/* Its connections first. Each is shut down under nng (shutdown(2) of
	 * its descriptor): nothing arrives on it any more, and a read nng has
	 * in flight fails, so that nng tears that pipe down from its own read
	 * callback. Closing a pipe from here while a message is arriving on it
	 * is what leaves nng 1.5's reaper stuck (doc/threads.md). The pipes
	 * still there after RPC_DRAIN_MS (no read in flight), or whose
	 * descriptor was not found, are then closed: closing a pipe closes its
	 * TCP connection at once, even when the reaper would leave nng_close
	 * waiting. The ids are copied out, since closing may call rpc_pipe_cb. */
	pthread_mutex_lock(&s->pipe_mu);
	size_t np = s->npipes;
	uint32_t *ids = np ? malloc(np * sizeof(*ids)) : NULL;
	if (ids)
		memcpy(ids, s->pipes, np * sizeof(*ids));
	pthread_mutex_unlock(&s->pipe_mu);
	size_t shut = ids != NULL ? rpc_shutdown_pipes(ids, np) : 0;
	if (shut > 0) {
		for (int waited = 0; waited < RPC_DRAIN_MS; waited += 2) {
			pthread_mutex_lock(&s->pipe_mu);
			size_t left = s->npipes;
			pthread_mutex_unlock(&s->pipe_mu);
			if (left == 0)
				break;
			nng_msleep(2);
		}
	}
	/* What is left now (a connection may have come meanwhile). */
	pthread_mutex_lock(&s->pipe_mu);
	size_t left = s->npipes;
	uint32_t *more = left > np ? realloc(ids, left * sizeof(*ids)) : ids;
	if (more != NULL) {
		ids = more;
		np = left;
		if (np)
			memcpy(ids, s->pipes, np * sizeof(*ids));
	} else {
		np = 0; /* no memory: nng_close below closes them */
	}
	pthread_mutex_unlock(&s->pipe_mu);
	if (shut > 0 || np > 0)
		KV_DEBUG("rpc", "server connections closed", "shut_down=%zu closed_after=%zu", shut,
		         np);
	for (size_t i = 0; i < np; i++) {
		nng_pipe p = NNG_PIPE_INITIALIZER;
		p.id = ids[i];
		nng_pipe_close(p);
	}
	free(ids);
	rpc_close_bounded(rpc_server_free_cb, s, "server", true);
}

/* Counts the client's connections. Runs on an nng thread. */
static void
rpc_client_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	kv_rpc_client *c = arg;

	(void)p;
	if (ev == NNG_PIPE_EV_ADD_POST)
		atomic_fetch_add(&c->pipes, 1);
	else if (ev == NNG_PIPE_EV_REM_POST)
		atomic_fetch_sub(&c->pipes, 1);
}

/* After a send found no connection: when there is still none and the
 * dialer has tried for RPC_REDIAL_MS, replaces it (see RPC_REDIAL_MS). */
static void
rpc_client_maybe_redial(kv_rpc_client *c)
{
	if (c == NULL)
		return;
	nng_dialer d;

	rpc_lc_kick(c->lc);
	if (atomic_load(&c->pipes) > 0)
		return;
	pthread_mutex_lock(&c->mu);
	if (c->dialed && atomic_load(&c->pipes) == 0 &&
	    nng_clock() - c->dial_time >= RPC_REDIAL_MS &&
	    kv_tls_dial(c->sock, c->url, c->tls, NNG_FLAG_NONBLOCK, &d) == KV_OK) {
		nng_dialer_close(c->dialer); /* aborts its pending connect */
		c->dialer = d;
		c->dial_time = nng_clock();
		KV_INFO("rpc", "redialing", "url=%s", c->url);
	}
	pthread_mutex_unlock(&c->mu);
}

/*
 * nng 1.5's nng_close can wait forever (seen about once in 200 closes
 * under test). The mechanism, read in nng 1.5.2's source: when a TCP
 * connection is closed on this side while a message is arriving on it (its
 * header read has completed, or part of the message, and the read's
 * callback has not run yet), the callback issues the next read on the
 * already closed read aio; that read is refused silently, so the
 * protocol's receive waiting on the connection is never finished, and the
 * connection's teardown, which runs on nng's one reaper thread, waits for
 * it forever (nng 1.6 checks for the close there). The reaper then stays
 * stuck, and every later nng_close of a socket with connections waits for
 * it too, a server's REP socket included (seen as a server stop that never
 * returned, once in about 80 runs of a restart test on a loaded machine).
 * Only a close on this side while a peer is sending can trigger it: a
 * client's close with replies still coming, a server's close while
 * requests arrive; in a daemon that is the process's exit, in the
 * in-process tests a stop under load. So every socket is closed on a thread of its own
 * (rpc_close_bounded), and its destroy waits for it at most
 * RPC_CLOSE_WAIT_MS (a server's: RPC_SERVER_CLOSE_WAIT_MS): past that the
 * caller goes on and the socket, with what its callbacks use, is freed if
 * and when the close returns.
 */
#define RPC_CLOSE_WAIT_MS 2000

/* Set once a close has not finished in time: nng's reaper is then stuck for
 * the life of the process, and later closes wait only RPC_CLOSE_STUCK_MS. */
static atomic_bool rpc_close_stuck;
#define RPC_CLOSE_STUCK_MS 50

/* A server's close never marks the reaper stuck, and always waits this
 * long: one stuck close must not shorten the next server's. Its accepted
 * connections are closed before (kv_rpc_server_destroy), so that a close
 * left to finish later keeps none open to swallow the requests of clients
 * that would otherwise reach a server started again on the same address. */
#define RPC_SERVER_CLOSE_WAIT_MS 5000

struct rpc_closer {
	pthread_mutex_t mu;    /* protects done and refs */
	pthread_cond_t cv;     /* done set */
	void (*close)(void *); /* closes the socket and frees arg */
	void *arg;             /* what is being closed */
	bool done;             /* close returned */
	int refs;              /* the destroyer and the closing thread */
};

/* Dials the socket when it has not yet (a link client's first kv_rpc_call). */
static int
rpc_client_dial(kv_rpc_client *c)
{
	int rv = KV_OK;

	pthread_mutex_lock(&c->mu);
	if (!c->dialed) {
		c->dial_time = nng_clock();
		if ((rv = kv_tls_dial(c->sock, c->url, c->tls, NNG_FLAG_NONBLOCK, &c->dialer)) == 0)
			c->dialed = true;
	}
	pthread_mutex_unlock(&c->mu);
	return rv;
}

static void
rpc_client_free(kv_rpc_client *c)
{
	rpc_lc_destroy(c->lc);
	nng_close(c->sock);
	pthread_mutex_destroy(&c->mu);
	free(c->url);
	free(c);
}

static void
rpc_closer_put(struct rpc_closer *x)
{
	pthread_mutex_lock(&x->mu);
	int left = --x->refs;
	pthread_mutex_unlock(&x->mu);
	if (left == 0) {
		pthread_cond_destroy(&x->cv);
		pthread_mutex_destroy(&x->mu);
		free(x);
	}
}

static void *
rpc_closer_main(void *arg)
{
	struct rpc_closer *x = arg;

	kv_log_thread_name("kv-rpc-closer");
	x->close(x->arg);
	pthread_mutex_lock(&x->mu);
	x->done = true;
	pthread_cond_signal(&x->cv);
	pthread_mutex_unlock(&x->mu);
	rpc_closer_put(x);
	return NULL;
}

int
kv_rpc_client_create(const char *url, kv_rpc_client **out)
{
	return kv_rpc_client_create_tls(url, NULL, out);
}

int
kv_rpc_client_create_tls(const char *url, const kv_tls *tls, kv_rpc_client **out)
{
	kv_rpc_client *c;
	int rv;

	if (url == NULL || out == NULL)
		return KV_EINVAL;
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return KV_ENOMEM;
	c->url = strdup(url);
	if (c->url == NULL) {
		free(c);
		return KV_ENOMEM;
	}
	if ((rv = nng_req0_open(&c->sock)) != 0) {
		free(c->url);
		free(c);
		return kv_err_from_nng(rv);
	}
	pthread_mutex_init(&c->mu, NULL);
	atomic_init(&c->pipes, 0);
	atomic_init(&c->connect_wait, 0);
	if ((rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_ADD_POST, rpc_client_pipe_cb, c)) != 0 ||
	    (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, rpc_client_pipe_cb, c)) != 0) {
		nng_close(c->sock);
		pthread_mutex_destroy(&c->mu);
		free(c->url);
		free(c);
		return kv_err_from_nng(rv);
	}
	/* Never resend on our own: a retried write must be the caller's choice. */
	nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
	nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, KV_RPC_MAX_MSG);
	nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 10);
	nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 500);
	c->tls = kv_tls_url(url) ? tls : NULL;
	if (kv_link_url_ok(url)) {
		/* Not dialled yet, but a malformed address fails here, as a
		 * dial would. */
		nng_dialer d;
		if ((rv = nng_dialer_create(&d, c->sock, url)) != 0)
			rv = kv_err_from_nng(rv);
		else
			nng_dialer_close(d);
		if (rv == 0)
			rv = rpc_lc_create(url, &c->lc);
	} else {
		rv = rpc_client_dial(c);
	}
	if (rv != 0) {
		nng_close(c->sock);
		pthread_mutex_destroy(&c->mu);
		free(c->url);
		free(c);
		return rv;
	}
	*out = c;
	return KV_OK;
}

/* Runs close(arg) on a thread of its own and waits for it at most
 * RPC_CLOSE_WAIT_MS, or RPC_SERVER_CLOSE_WAIT_MS for a server (see above);
 * what names the socket in the warning. */
static void
rpc_close_bounded(void (*close)(void *), void *arg, const char *what, bool server)
{
	struct rpc_closer *x;
	pthread_t th;
	struct timespec ts;
	bool done;

	if ((x = calloc(1, sizeof(*x))) == NULL) {
		close(arg);
		return;
	}
	x->close = close;
	x->arg = arg;
	x->refs = 2;
	pthread_mutex_init(&x->mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&x->cv, &ca);
	pthread_condattr_destroy(&ca);
	if (pthread_create(&th, NULL, rpc_closer_main, x) != 0) {
		close(arg);
		x->refs = 1;
		rpc_closer_put(x);
		return;
	}
	pthread_detach(th);
	clock_gettime(CLOCK_MONOTONIC, &ts);
	long wait_ms = server                          ? RPC_SERVER_CLOSE_WAIT_MS
	               : atomic_load(&rpc_close_stuck) ? RPC_CLOSE_STUCK_MS
	                                               : RPC_CLOSE_WAIT_MS;
	ts.tv_sec += wait_ms / 1000;
	ts.tv_nsec += (wait_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	pthread_mutex_lock(&x->mu);
	while (!x->done)
		if (pthread_cond_timedwait(&x->cv, &x->mu, &ts) != 0)
			break;
	done = x->done;
	pthread_mutex_unlock(&x->mu);
	if (!done && (server || !atomic_exchange(&rpc_close_stuck, true)))
		KV_WARN("rpc", "socket close did not finish; left to finish in the background",
		        "socket=\"%s\" wait_ms=%ld", what, wait_ms);
	rpc_closer_put(x);
}

static void
rpc_client_free_cb(void *arg)
{
	rpc_client_free(arg);
}

/* Closes the socket *arg and frees arg: on the closing thread. */
static void
rpc_socket_free_cb(void *arg)
{
	nng_socket *s = arg;

	nng_close(*s);
	free(s);
}

void
kv_rpc_socket_close(nng_socket s, const char *what)
{
	nng_socket *p = malloc(sizeof(*p));

	if (p == NULL) {
		nng_close(s);
		return;
	}
	*p = s;
	rpc_close_bounded(rpc_socket_free_cb, p, what, false);
}

void
kv_rpc_client_destroy(kv_rpc_client *c)
{
	char what[300];

	if (c == NULL)
		return;
	snprintf(what, sizeof(what), "client %s", c->url); /* c may be gone when it is logged */
	rpc_close_bounded(rpc_client_free_cb, c, what, false);
}

void
kv_rpc_client_redial(kv_rpc_client *c)
{
	rpc_client_maybe_redial(c);
}

const char *
kv_rpc_client_url(const kv_rpc_client *c)
{
	return c->url;
}

struct kv_rpc_async {
	kv_rpc_client *c;    /* its client */
	rpc_lc_caller *lc;   /* on a link client: the caller (nothing below is used) */
	nng_ctx ctx;         /* the request context, reused */
	nng_aio *aio;        /* its aio, reused; its callback is async_cb */
	nng_aio *saio;       /* no callback: kv_rpc_async_call_wait_send's send */
	kv_rpc_done_fn done; /* the user's callback */
	void *arg;           /* its argument */
	nng_time deadline;   /* of the call in flight */
	bool receiving;      /* the call is past its send */
};

/* Both phases of a call: the send completing starts the receive. */
static void
async_cb(void *arg)
{
	kv_rpc_async *a = arg;
	int rv = nng_aio_result(a->aio);

	if (!a->receiving) {
		if (rv != 0) {
			if (nng_aio_get_msg(a->aio) != NULL) /* a failed send leaves it to us */
				nng_msg_free(nng_aio_get_msg(a->aio));
			nng_aio_set_msg(a->aio, NULL);
			a->done(a->arg, rv == NNG_ETIMEDOUT ? KV_EUNAVAIL : kv_err_from_nng(rv),
			        NULL);
			return;
		}
		nng_time now = nng_clock();
		a->receiving = true;
		nng_aio_set_timeout(a->aio,
		                    now >= a->deadline ? 1 : (nng_duration)(a->deadline - now));
		nng_ctx_recv(a->ctx, a->aio);
		return;
	}
	if (rv != 0) {
		a->done(a->arg, kv_err_from_nng(rv), NULL);
		return;
	}
	nng_msg *rep = nng_aio_get_msg(a->aio);
	nng_aio_set_msg(a->aio, NULL);
	a->done(a->arg, KV_OK, rep);
}

int
kv_rpc_async_create(kv_rpc_client *c, kv_rpc_done_fn done, void *arg, kv_rpc_async **out)
{
	kv_rpc_async *a;
	int rv;

	if (c == NULL || done == NULL || out == NULL)
		return KV_EINVAL;
	if ((a = calloc(1, sizeof(*a))) == NULL)
		return KV_ENOMEM;
	a->c = c;
	a->done = done;
	a->arg = arg;
	if (c->lc != NULL) {
		if ((rv = rpc_lc_caller_create(c->lc, done, arg, &a->lc)) != KV_OK) {
			free(a);
			return rv;
		}
		*out = a;
		return KV_OK;
	}
	if ((rv = nng_ctx_open(&a->ctx, c->sock)) != 0) {
		free(a);
		return kv_err_from_nng(rv);
	}
	if ((rv = nng_aio_alloc(&a->aio, async_cb, a)) != 0) {
		nng_ctx_close(a->ctx);
		free(a);
		return kv_err_from_nng(rv);
	}
	if ((rv = nng_aio_alloc(&a->saio, NULL, NULL)) != 0) {
		nng_aio_free(a->aio);
		nng_ctx_close(a->ctx);
		free(a);
		return kv_err_from_nng(rv);
	}
	*out = a;
	return KV_OK;
}

/* Sets the call's deadline; returns how long its send may wait. */
static uint32_t
async_start(kv_rpc_async *a, uint32_t *timeout_ms)
{
	uint32_t wait = atomic_load(&a->c->connect_wait);

	if (*timeout_ms == 0)
		*timeout_ms = 1; /* 0 is nng's "poll": no expiry would be scheduled */
	a->deadline = nng_clock() + *timeout_ms;
	a->receiving = false;
	/* With no connection, the send waits for one at most connect_wait:
	 * the caller then finds out why (kv_rpc_probe_refused) instead of
	 * waiting for the whole timeout on a peer that is gone. */
	return wait > 0 && wait < *timeout_ms && atomic_load(&a->c->pipes) == 0 ? wait
	                                                                        : *timeout_ms;
}

void
kv_rpc_async_call(kv_rpc_async *a, nng_msg *req, uint32_t timeout_ms)
{
	if (a->lc != NULL) {
		rpc_lc_call(a->lc, req, timeout_ms, atomic_load(&a->c->connect_wait));
		return;
	}
	uint32_t send_ms = async_start(a, &timeout_ms);

	nng_aio_set_timeout(a->aio, (nng_duration)send_ms);
	nng_aio_set_msg(a->aio, req);
	nng_ctx_send(a->ctx, a->aio);
}

void
kv_rpc_async_call_wait_send(kv_rpc_async *a, nng_msg *req, uint32_t timeout_ms)
{
	if (a->lc != NULL) {
		kv_rpc_async_call(a, req, timeout_ms); /* its send is made on this thread anyway */
		return;
	}
	uint32_t send_ms = async_start(a, &timeout_ms);
	int rv;

	nng_aio_set_timeout(a->saio, (nng_duration)send_ms);
	nng_aio_set_msg(a->saio, req);
	nng_ctx_send(a->ctx, a->saio);
	nng_aio_wait(a->saio);
	if ((rv = nng_aio_result(a->saio)) != 0) {
		if (nng_aio_get_msg(a->saio) != NULL) /* a failed send leaves it to us */
			nng_msg_free(nng_aio_get_msg(a->saio));
		nng_aio_set_msg(a->saio, NULL);
		a->done(a->arg, rv == NNG_ETIMEDOUT ? KV_EUNAVAIL : kv_err_from_nng(rv), NULL);
		return;
	}
	nng_aio_set_msg(a->saio, NULL);
	/* The send is done: the receive may be posted (never while the send
	 * is still queued: cancelling a queued send with a receive pending
	 * aborts the process in nng 1.5's REQ protocol). */
	nng_time now = nng_clock();
	a->receiving = true;
	nng_aio_set_timeout(a->aio, now >= a->deadline ? 1 : (nng_duration)(a->deadline - now));
	nng_ctx_recv(a->ctx, a->aio);
}

void
kv_rpc_async_destroy(kv_rpc_async *a)
{
	if (a == NULL)
		return;
	if (a->lc != NULL) {
		rpc_lc_caller_destroy(a->lc);
		free(a);
		return;
	}
	nng_aio_stop(a->aio); /* cancels, waits for the callback, and refuses new work */
	nng_aio_stop(a->saio);
	if (nng_aio_get_msg(a->aio) != NULL)
		nng_msg_free(nng_aio_get_msg(a->aio));
	if (nng_aio_get_msg(a->saio) != NULL)
		nng_msg_free(nng_aio_get_msg(a->saio));
	nng_aio_free(a->aio);
	nng_aio_free(a->saio);
	nng_ctx_close(a->ctx);
	free(a);
}

int
kv_rpc_call(kv_rpc_client *c, nng_msg *req, nng_msg **reply, uint32_t timeout_ms)
{
	nng_ctx ctx;
	nng_aio *aio;
	nng_time deadline;
	bool probe;
	int rv;

	rpc_why[0] = '\0';
	rpc_refused = false;
	if (c == NULL || req == NULL || reply == NULL) {
		if (req)
			nng_msg_free(req);
		return KV_EINVAL;
	}
	if ((rv = rpc_client_dial(c)) != KV_OK) {
		nng_msg_free(req);
		return rv;
	}
	if ((rv = nng_ctx_open(&ctx, c->sock)) != 0) {
		nng_msg_free(req);
		return kv_err_from_nng(rv);
	}
	if ((rv = nng_aio_alloc(&aio, NULL, NULL)) != 0) {
		nng_ctx_close(ctx);
		nng_msg_free(req);
		return kv_err_from_nng(rv);
	}
	deadline = nng_clock() + timeout_ms;
	/* Over TLS a refused handshake looks just like a peer that is down:
	 * the send waits for a connection that never comes. So when none has
	 * come after RPC_PROBE_AFTER_MS, one probe finds out which it is, and
	 * a refusal fails the call at once instead of at its deadline. A
	 * client asked to (kv_rpc_client_fail_refused) likewise probes a plain
	 * address, and a refused connection ends the call. */
	probe =
	    (c->tls != NULL || atomic_load(&c->fail_refused)) && timeout_ms > RPC_PROBE_AFTER_MS;
	nng_aio_set_timeout(aio, (nng_duration)(probe ? RPC_PROBE_AFTER_MS : timeout_ms));
	nng_aio_set_msg(aio, req);
	nng_ctx_send(ctx, aio);
	nng_aio_wait(aio);
	nng_time t = nng_clock();
	if (probe && nng_aio_result(aio) == NNG_ETIMEDOUT && t < deadline) {
		nng_time left = deadline - t;
		if ((c->tls == NULL || atomic_load(&c->fail_refused)) &&
		    kv_rpc_probe_refused(c->url,
		                         left < RPC_PROBE_MS ? (uint32_t)left + 1 : RPC_PROBE_MS)) {
			snprintf(rpc_why, sizeof(rpc_why), "connection refused by %s", c->url);
			rpc_refused = true;
			nng_msg_free(req);
			rv = KV_EUNAVAIL;
			goto out;
		}
		if (c->tls != NULL &&
		    kv_tls_probe(c->url, c->tls,
		                 left < RPC_PROBE_MS ? (uint32_t)left + 1 : RPC_PROBE_MS, rpc_why,
		                 sizeof(rpc_why)) == KV_EAUTH) {
			nng_msg_free(req);
			rv = KV_EAUTH;
			goto out;
		}
		rpc_why[0] = '\0';
		nng_time now = nng_clock();
		nng_aio_set_timeout(aio, now >= deadline ? 1 : (nng_duration)(deadline - now));
		nng_aio_set_msg(aio, req);
		nng_ctx_send(ctx, aio);
		nng_aio_wait(aio);
	}
	if ((rv = nng_aio_result(aio)) != 0) {
		nng_msg_free(req); /* a failed send leaves the message with us */
		if (rv == NNG_ETIMEDOUT)
			rpc_client_maybe_redial(c);
		rv = rv == NNG_ETIMEDOUT ? KV_EUNAVAIL : kv_err_from_nng(rv);
		goto out;
	}
	nng_time now = nng_clock();
	nng_aio_set_timeout(aio, now >= deadline ? 1 : (nng_duration)(deadline - now));
	nng_ctx_recv(ctx, aio);
	nng_aio_wait(aio);
	if ((rv = nng_aio_result(aio)) != 0) {
		rv = kv_err_from_nng(rv);
		goto out;
	}
	*reply = nng_aio_get_msg(aio);
	rv = KV_OK;
out:
	nng_aio_free(aio);
	nng_ctx_close(ctx);
	return rv;
}

unsigned
kv_rpc_server_conns(const kv_rpc_server *s)
{
	if (s->tcp != NULL)
		return rpc_tcp_conns(s->tcp);
	return atomic_load(&((kv_rpc_server *)s)->conns);
}

bool
kv_rpc_can_block(const kv_rpc_pending *p)
{
	return p == NULL || p->conn == NULL || p->may_block;
}
