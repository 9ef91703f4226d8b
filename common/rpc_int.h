/*
 * rpc_int.h - what rpc.c and rpc_tcp.c share inside the rpc module: the
 * request slot both kinds of server hand their handler, and the event-loop
 * server's entry points. Not a public header: users include rpc.h.
 */
#ifndef KV_COMMON_RPC_INT_H
#define KV_COMMON_RPC_INT_H

#include "common/rpc.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

/* Longest backtrace a request may carry (nng's REP: 8 hops of 4 bytes). */
#define RPC_BT_MAX 32

/* nng's SP protocol numbers, and the 8 bytes each side of a TCP connection
 * sends first: 00 'S' 'P' 00, its protocol (16 bits, big endian), 00 00
 * (rpc_tcp.c is the REP side, rpc_link.c the REQ side). */
#define SP_PROTO_REQ 0x30u
#define SP_PROTO_REP 0x31u

static inline void
rpc_sp_hello(uint8_t h[8], unsigned proto)
{
	const uint8_t v[8] = {0, 'S', 'P', 0, (uint8_t)(proto >> 8), (uint8_t)proto, 0, 0};
	for (int i = 0; i < 8; i++)
		h[i] = v[i];
}

/* Whether the 8 bytes at h are the header of a peer speaking proto. */
static inline bool
rpc_sp_hello_is(const uint8_t *h, unsigned proto)
{
	uint8_t want[8];
	rpc_sp_hello(want, proto);
	for (int i = 0; i < 8; i++)
		if (h[i] != want[i])
			return false;
	return true;
}

/*
 * The asynchronous callers of a plain tcp:// client on a link and a thread
 * of the client's own (rpc_lcall.c): kv_rpc_async on such a client is one
 * of these. The thread starts with the first caller.
 */
typedef struct rpc_lc rpc_lc;
typedef struct rpc_lc_caller rpc_lc_caller;

/* Makes the link state of a client of url (nothing connects yet). */
int rpc_lc_create(const char *url, rpc_lc **out);

/* Stops the thread and closes the connection. The callers are destroyed
 * first. Never from a callback. Accepts NULL. */
void rpc_lc_destroy(rpc_lc *k);

/* Whether a connection is open now. */
bool rpc_lc_connected(const rpc_lc *k);

/* The next connection attempt is made at once, not after a backoff. */
void rpc_lc_kick(rpc_lc *k);

/* A caller: one call at a time, done called once per call (on the link
 * thread, or on the calling thread when refused at once). */
int rpc_lc_caller_create(rpc_lc *k, kv_rpc_done_fn done, void *arg, rpc_lc_caller **out);

/* Sends req (taken) on the connection, or once there is one: done gets the
 * answer, KV_EUNAVAIL (no connection within connect_wait_ms, or 0: the
 * timeout; or the connection failed), KV_ETIMEDOUT, or KV_ECLOSED. */
void rpc_lc_call(rpc_lc_caller *c, nng_msg *req, uint32_t timeout_ms, uint32_t connect_wait_ms);

/* Cancels the call in flight (done gets KV_ECLOSED), waits for a callback
 * running, and frees the caller. Never from a callback of the same client
 * (they run on one thread: the wait could be for that thread). Accepts
 * NULL. */
void rpc_lc_caller_destroy(rpc_lc_caller *c);

struct rpc_tcp;
struct rpc_conn;

struct kv_rpc_pending {
	kv_rpc_server *s; /* owner (nng slots only) */
	/* nng's request slots (conn == NULL). */
	nng_ctx ctx;  /* this request slot's context */
	nng_aio *aio; /* its aio; the callback is rpc_ctx_cb */
	/* mu protects state and early: a deferred request can be answered from
	 * another thread before its handler has even returned. */
	pthread_mutex_t mu;
	int state;      /* RPC_* */
	nng_msg *early; /* answer given while the handler still ran (RPC_HANDLING) */
	bool answered;  /* kv_rpc_reply was called while RPC_HANDLING */
	/* The event-loop server's requests (conn != NULL): one per request
	 * handed to the handler, owned by whoever answers it. */
	struct rpc_conn *conn;  /* the connection the answer goes back on */
	bool may_block;         /* handled on a worker thread, not a loop */
	uint8_t btlen;          /* bytes of bt */
	uint8_t bt[RPC_BT_MAX]; /* the request's backtrace, echoed in the answer */
	nng_msg *req;           /* the request, while it waits for a worker */
	kv_rpc_pending *next;   /* the worker queue */
};

/* Starts the event-loop server of o (a tcp:// url, o->loops > 0). Returns
 * 0, KV_EADDRINUSE, KV_EINVAL (an address that does not resolve) or
 * another KV_E* code. */
int rpc_tcp_create(const kv_rpc_server_opts *o, struct rpc_tcp **out);

/* Stops the loops and the workers (handlers in progress are waited for),
 * closes the listener and every connection. Deferred requests answered
 * later are dropped; their slots stay valid until then. */
void rpc_tcp_destroy(struct rpc_tcp *t);

/* Connections now open. */
unsigned rpc_tcp_conns(const struct rpc_tcp *t);

/* kv_rpc_reply for a request of the event-loop server. */
void rpc_tcp_reply(kv_rpc_pending *p, nng_msg *msg);

/* Whether url is one the event-loop server serves (tcp://, tcp4://, tcp6://). */
bool rpc_tcp_url(const char *url);

/* Splits a SCHEME://HOST:PORT url (HOST may be a [v6 address]; "*" gives
 * "": every address) into host and its numeric port; *family is AF_INET
 * for tcp4://, AF_INET6 for tcp6://, else AF_UNSPEC. Returns 0 or
 * KV_EINVAL. */
int rpc_url_split(const char *url, char *host, size_t hostlen, char *port, size_t portlen,
                  int *family);

#endif
