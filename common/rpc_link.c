/*
 * rpc_link.c - a link (rpc.h): one REQ connection over nng's TCP wire,
 * driven by its owner's thread.
 *
 * DESIGN. The wire is rpc_tcp.c's (nng's TCP transport, SP REQ/REP v0):
 * 8 bytes of protocol header each way on connect, then messages of a
 * 64-bit big-endian length and that many bytes; a request carries its id
 * (high bit set) in front of its body, and its answer the same word. The
 * owner's thread writes requests (what the kernel does not take waits in
 * wbuf, in order, for kv_link_flush) and reads answers into rbuf, which
 * holds at least one whole message before it is handed out. A failure
 * marks the link failed; from then on every call answers KV_ECLOSED and
 * the owner closes it, which closes the socket at once (none of nng's
 * close paths is involved).
 */
#define _GNU_SOURCE
#include "common/bytes.h"
#include "common/err.h"
#include "common/key.h"
#include "common/rpc.h"
#include "common/rpc_int.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define ID_BIT   0x80000000u
#define RBUF_MIN (64u * 1024u)   /* the read buffer, at least */
#define BUF_KEEP (1024u * 1024u) /* larger buffers are given back once empty */

struct kv_link {
	int fd;
	bool failed;    /* the connection failed: every call answers KV_ECLOSED */
	size_t max_msg; /* largest answer taken */
	uint8_t *rbuf;  /* read bytes, from rpos to rlen unparsed */
	size_t rpos, rlen, rcap;
	uint8_t *wbuf; /* bytes the kernel has not taken, from wpos to wlen */
	size_t wpos, wlen, wcap;
};

bool
kv_link_url_ok(const char *url)
{
	return rpc_tcp_url(url);
}

static uint64_t
now_ms(void)
{
	return kv_now_ns() / 1000000u;
}

/* What a send's or recv's result n means: bytes moved (> 0); 0 to try
 * again (EINTR); KV_EBUSY when the kernel has nothing more for now;
 * KV_ECLOSED when the connection failed, which fails the link. */
static ssize_t
io_result(kv_link *l, ssize_t n)
{
	if (n > 0)
		return n;
	if (n < 0 && errno == EINTR)
		return 0;
	if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
		return KV_EBUSY;
	l->failed = true;
	return KV_ECLOSED;
}

/* Waits for events on fd until deadline (monotonic ms). Returns 0 when
 * they came, KV_ETIMEDOUT or KV_EUNAVAIL (the socket failed). */
static int
wait_fd(int fd, short events, uint64_t deadline)
{
	for (;;) {
		uint64_t now = now_ms();
		struct pollfd p = {.fd = fd, .events = events};
		if (now >= deadline)
			return KV_ETIMEDOUT;
		int n = poll(&p, 1, (int)(deadline - now));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return KV_EUNAVAIL;
		if (n > 0 && (p.revents & events))
			return KV_OK;
		if (n > 0)
			return KV_EUNAVAIL; /* POLLERR, POLLHUP without the event */
	}
}

/* Connects to one address within deadline. Returns the socket or a
 * negative KV_E* code. */
static int
dial_one(const struct addrinfo *a, uint64_t deadline)
{
	int fd =
	    socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
	int rv, err = 0, one = 1;
	socklen_t elen = sizeof(err);

	if (fd < 0)
		return errno == ENOMEM || errno == ENOBUFS ? KV_ENOMEM : KV_EUNAVAIL;
	if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
		if (errno != EINPROGRESS) {
			close(fd);
			return KV_EUNAVAIL;
		}
		if ((rv = wait_fd(fd, POLLOUT, deadline)) != 0 &&
		    rv != KV_EUNAVAIL) { /* POLLERR: SO_ERROR tells */
			close(fd);
			return rv;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0 || err != 0) {
			close(fd);
			return err == ETIMEDOUT ? KV_ETIMEDOUT : KV_EUNAVAIL;
		}
	}
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return fd;
}

/* Sends (out) or receives n bytes at b on fd within deadline. Returns 0,
 * KV_ETIMEDOUT or KV_EUNAVAIL (the connection failed or closed: a server
 * at its connection limit closes at once). */
static int
move_all(int fd, bool out, uint8_t *b, size_t n, uint64_t deadline)
{
	size_t done = 0;
	int rv;

	while (done < n) {
		ssize_t r = out ? send(fd, b + done, n - done, MSG_NOSIGNAL)
		                : recv(fd, b + done, n - done, 0);
		if (r > 0) {
			done += (size_t)r;
		} else if (r < 0 && errno == EINTR) {
			continue;
		} else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
			if ((rv = wait_fd(fd, out ? POLLOUT : POLLIN, deadline)) != 0)
				return rv;
		} else {
			return KV_EUNAVAIL;
		}
	}
	return KV_OK;
}

/* Exchanges the protocol headers within deadline. Returns 0 or an error. */
static int
handshake(int fd, uint64_t deadline)
{
	uint8_t mine[8], theirs[8];
	int rv;

	rpc_sp_hello(mine, SP_PROTO_REQ);
	if ((rv = move_all(fd, true, mine, sizeof(mine), deadline)) != 0 ||
	    (rv = move_all(fd, false, theirs, sizeof(theirs), deadline)) != 0)
		return rv;
	return rpc_sp_hello_is(theirs, SP_PROTO_REP) ? KV_OK : KV_EPROTO;
}

int
kv_link_open(const char *url, uint32_t timeout_ms, size_t max_msg, kv_link **out)
{
	char host[256], port[16];
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV},
	                *ai = NULL;
	uint64_t deadline = now_ms() + timeout_ms;
	int family, rv, fd = KV_EUNAVAIL;
	kv_link *l;

	*out = NULL;
	if (url == NULL || !rpc_tcp_url(url) ||
	    rpc_url_split(url, host, sizeof(host), port, sizeof(port), &family) != 0 ||
	    host[0] == 0)
		return KV_EINVAL;
	hints.ai_family = family;
	if ((rv = getaddrinfo(host, port, &hints, &ai)) != 0 || ai == NULL)
		return rv == EAI_MEMORY ? KV_ENOMEM : KV_EINVAL;
	for (struct addrinfo *a = ai; a != NULL; a = a->ai_next)
		if ((fd = dial_one(a, deadline)) >= 0 || fd == KV_ETIMEDOUT)
			break;
	freeaddrinfo(ai);
	if (fd < 0)
		return fd;
	if ((rv = handshake(fd, deadline)) != 0) {
		close(fd);
		return rv;
	}
	if ((l = calloc(1, sizeof(*l))) == NULL) {
		close(fd);
		return KV_ENOMEM;
	}
	l->fd = fd;
	l->max_msg = max_msg ? max_msg : KV_RPC_MAX_MSG;
	*out = l;
	return KV_OK;
}

int
kv_link_fd(const kv_link *l)
{
	return l->fd;
}

bool
kv_link_want_write(const kv_link *l)
{
	return !l->failed && l->wpos < l->wlen;
}

/* Appends n bytes to the write queue. Returns 0 or KV_ENOMEM. */
static int
wbuf_add(kv_link *l, const void *p, size_t n)
{
	if (l->wpos > 0 && l->wpos == l->wlen)
		l->wpos = l->wlen = 0;
	if (l->wlen + n > l->wcap) {
		size_t cap = l->wcap ? l->wcap : 4096;
		while (cap < l->wlen + n)
			cap *= 2;
		uint8_t *b = realloc(l->wbuf, cap);
		if (b == NULL)
			return KV_ENOMEM;
		l->wbuf = b;
		l->wcap = cap;
	}
	memcpy(l->wbuf + l->wlen, p, n);
	l->wlen += n;
	return KV_OK;
}

int
kv_link_flush(kv_link *l)
{
	if (l->failed)
		return KV_ECLOSED;
	while (l->wpos < l->wlen) {
		ssize_t n =
		    io_result(l, send(l->fd, l->wbuf + l->wpos, l->wlen - l->wpos, MSG_NOSIGNAL));
		if (n == KV_EBUSY)
			return KV_OK;
		if (n < 0)
			return (int)n;
		l->wpos += (size_t)n;
	}
	l->wpos = l->wlen = 0;
	if (l->wcap > BUF_KEEP) {
		free(l->wbuf);
		l->wbuf = NULL;
		l->wcap = 0;
	}
	return KV_OK;
}

int
kv_link_send(kv_link *l, uint32_t id, const void *body, size_t len)
{
	uint8_t hdr[12];
	size_t off = 0;

	if (l->failed)
		return KV_ECLOSED;
	kv_put64be(hdr, (uint64_t)len + 4);
	kv_put32be(hdr + 8, id | ID_BIT);
	if (l->wpos == l->wlen) {
		/* Nothing queued: straight from the caller's memory, and only
		 * what the kernel does not take is copied. */
		struct iovec iov[2] = {{hdr, sizeof(hdr)}, {(void *)(uintptr_t)body, len}};
		struct msghdr mh = {.msg_iov = iov, .msg_iovlen = len ? 2 : 1};
		ssize_t n;
		do
			n = io_result(l, sendmsg(l->fd, &mh, MSG_NOSIGNAL));
		while (n == 0);
		if (n == KV_ECLOSED)
			return KV_ECLOSED;
		off = n == KV_EBUSY ? 0 : (size_t)n;
		if (off == sizeof(hdr) + len)
			return KV_OK;
	}
	int rv = KV_OK;
	if (off < sizeof(hdr))
		rv = wbuf_add(l, hdr + off, sizeof(hdr) - off);
	if (rv == 0) {
		size_t skip = off > sizeof(hdr) ? off - sizeof(hdr) : 0;
		rv = wbuf_add(l, (const uint8_t *)body + skip, len - skip);
	}
	if (rv != 0) {
		/* Part of the message may be on the wire: the stream is broken. */
		l->failed = true;
		return rv;
	}
	return kv_link_flush(l);
}

int
kv_link_recv(kv_link *l, bool *got, uint32_t *id, const uint8_t **body, size_t *len)
{
	*got = false;
	if (l->failed)
		return KV_ECLOSED;
	for (;;) {
		size_t have = l->rlen - l->rpos, need = 8;
		if (have >= 8) {
			uint64_t n = kv_get64be(l->rbuf + l->rpos);
			if (n < 4 || n > l->max_msg) {
				l->failed = true;
				return KV_EPROTO;
			}
			need = 8 + (size_t)n;
			if (have >= need) {
				const uint8_t *m = l->rbuf + l->rpos + 8;
				uint32_t w = kv_get32be(m);
				if (!(w & ID_BIT)) {
					/* Answers to a link's requests carry exactly its id. */
					l->failed = true;
					return KV_EPROTO;
				}
				*got = true;
				*id = w & ~ID_BIT;
				*body = m + 4;
				*len = (size_t)n - 4;
				l->rpos += need;
				return KV_OK;
			}
		}
		/* Room for the rest of this message (and more, to read in bulk). */
		if (l->rpos > 0 && l->rpos == l->rlen) {
			l->rpos = l->rlen = 0;
			if (l->rcap > BUF_KEEP) {
				free(l->rbuf);
				l->rbuf = NULL;
				l->rcap = 0;
			}
		}
		if (l->rcap - l->rpos < need || l->rlen == l->rcap) {
			if (l->rpos > 0) {
				memmove(l->rbuf, l->rbuf + l->rpos, have);
				l->rpos = 0;
				l->rlen = have;
			}
			if (l->rcap < need || l->rlen == l->rcap) {
				size_t cap = l->rcap ? l->rcap : RBUF_MIN;
				while (cap < need || cap == l->rlen)
					cap *= 2;
				uint8_t *b = realloc(l->rbuf, cap);
				if (b == NULL) {
					l->failed = true;
					return KV_ENOMEM;
				}
				l->rbuf = b;
				l->rcap = cap;
			}
		}
		ssize_t n = io_result(l, recv(l->fd, l->rbuf + l->rlen, l->rcap - l->rlen, 0));
		if (n == KV_EBUSY)
			return KV_OK;
		if (n < 0)
			return (int)n;
		l->rlen += (size_t)n;
	}
}

void
kv_link_close(kv_link *l)
{
	if (l == NULL)
		return;
	close(l->fd);
	free(l->rbuf);
	free(l->wbuf);
	free(l);
}
