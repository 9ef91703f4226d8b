/*
 * rpc.h - request/reply messaging over nng, shared by every component.
 *
 * A server listens on one nng URL (REP protocol) and serves requests with a
 * fixed pool of contexts; each request is handed to a handler callback on an
 * nng thread. The handler either answers at once or keeps the request
 * (KV_RPC_DEFERRED) and answers later with kv_rpc_reply() from any thread,
 * which is how long polls (watch) and waits (fence) are done without
 * blocking an nng thread.
 *
 * A client (REQ protocol) dials one URL and can have many calls in flight,
 * each on its own nng context; request resending is switched off, so a
 * request is never silently sent twice.
 *
 * Messages are opaque bytes here; the protobuf codec lives elsewhere.
 */
#ifndef KV_COMMON_RPC_H
#define KV_COMMON_RPC_H

#include "common/tls.h"

#include <nng/nng.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Largest message either side accepts: a 64 MiB value plus framing. */
#define KV_RPC_MAX_MSG (80u * 1024u * 1024u)

typedef struct kv_rpc_server kv_rpc_server;
typedef struct kv_rpc_pending kv_rpc_pending;
typedef struct kv_rpc_client kv_rpc_client;

/* Returned by a handler that keeps the request to answer later. */
#define KV_RPC_DEFERRED 1

/* Returned by a handler called on an event loop (kv_rpc_can_block(p) is
 * false) for a request whose handling may wait: the server calls the
 * handler again with the same request on a thread where it may. */
#define KV_RPC_BLOCKING 2

/*
 * Called for every request: on an nng thread, or on one of the server's event
 * loops (kv_rpc_server_opts.loops), where it must not wait for anything
 * (see KV_RPC_BLOCKING). `req` is the request message;
 * it stays the caller's. To answer now, set *reply to a new message (the
 * server takes it) and return 0. To answer later, keep `p` and return
 * KV_RPC_DEFERRED; then call kv_rpc_reply(p, msg) exactly once. Returning
 * a negative KV_E* code (or 0 with *reply NULL) drops the request: the
 * client times out, so handlers should answer errors with a message instead.
 */
typedef int (*kv_rpc_handler)(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p);

typedef struct {
	const char *url;        /* nng URL to listen on */
	unsigned contexts;      /* concurrent requests served; 0: 64 */
	size_t max_msg;         /* receive limit; 0: KV_RPC_MAX_MSG */
	unsigned max_conns;     /* connections at once; more are closed at once; 0: no bound */
	kv_rpc_handler handler; /* request handler */
	void *arg;              /* its argument */
	const kv_tls *tls;      /* for a tls+tcp:// url (required there); borrowed */
	/* For a tcp:// url: serve on this many event loops of the server's own
	 * (one thread each, epoll) instead of nng's threads, speaking nng's
	 * wire protocol (SP over TCP, REP side), so nng clients are served
	 * alike. A request is handled on the loop that read it, and its answer
	 * written from there without a hand-off. 0: nng's threads. */
	unsigned loops;
} kv_rpc_server_opts;

/* Starts listening. Returns 0, KV_EADDRINUSE, KV_EINVAL (bad URL) or another
 * KV_E* code. The caller destroys the server with kv_rpc_server_destroy(). */
int kv_rpc_server_create(const kv_rpc_server_opts *o, kv_rpc_server **out);

/* Stops listening, waits for handlers in progress, drops deferred requests
 * that were never answered. Accepts NULL. Not from a handler. */
void kv_rpc_server_destroy(kv_rpc_server *s);

/* Returns the number of connections now open to the server. */
unsigned kv_rpc_server_conns(const kv_rpc_server *s);

/* Answers a deferred request; takes `msg` (NULL: drop the request). Safe
 * from any thread, exactly once per deferred request. */
void kv_rpc_reply(kv_rpc_pending *p, nng_msg *msg);

/* Whether the handler called with p may wait (false on an event loop:
 * return KV_RPC_BLOCKING instead). */
bool kv_rpc_can_block(const kv_rpc_pending *p);

/* Dials `url` (reconnecting in the background). Returns 0 or a KV_E* code. */
int kv_rpc_client_create(const char *url, kv_rpc_client **out);

/* kv_rpc_client_create with the TLS configuration for a tls+tcp:// url
 * (required there, KV_EINVAL without; ignored for other URLs). tls is
 * borrowed: it must outlive the client. */
int kv_rpc_client_create_tls(const char *url, const kv_tls *tls, kv_rpc_client **out);

/* Closes the socket; calls in progress fail with KV_ECLOSED. Accepts NULL. */
void kv_rpc_client_destroy(kv_rpc_client *c);

/* Closes a socket opened outside this module (the client library's watch
 * socket) the way kv_rpc_client_destroy closes its own: on a thread of its
 * own, waited for a bounded time, so that nng's stuck reaper (see rpc.c)
 * never blocks the caller; what names the socket in the warning of a close
 * left to finish in the background. Nothing may be in progress on s. */
void kv_rpc_socket_close(nng_socket s, const char *what);

/* What kv_rpc_call does after a send that found no connection, for callers
 * of kv_rpc_async: when there is still none and the dialer has tried for a
 * while, starts a fresh one. It closes the old dialer, which waits on nng's
 * threads: never call it from an nng callback. Accepts NULL. */
void kv_rpc_client_redial(kv_rpc_client *c);

/*
 * Makes kv_rpc_call on this client fail early with KV_EUNAVAIL when its
 * tcp:// or tls+tcp:// address refuses connections (nothing listens there): a call that
 * has no connection after a few hundred milliseconds tries one plain TCP
 * connection,
 * and a refusal ends the call (kv_rpc_refused() then says so) instead of
 * waiting for its deadline. Off by default: peers that restart briefly are
 * waited for. Thread-safe.
 */
void kv_rpc_client_fail_refused(kv_rpc_client *c, bool on);

/* Whether the last kv_rpc_call on this thread failed because its address
 * refused the connection (see kv_rpc_client_fail_refused). */
bool kv_rpc_refused(void);

/*
 * One plain TCP connection attempt to a tcp:// url, on a socket of its own
 * (no nng object), waiting at most timeout_ms. Returns whether it was
 * refused: the host is reachable and nothing listens on the port. Any
 * other outcome (connected, timed out, not tcp://, not resolved) is false.
 * Blocks: never on an nng thread.
 */
bool kv_rpc_probe_refused(const char *url, uint32_t timeout_ms);

/* Makes a kv_rpc_async_call on this client that finds no connection wait
 * at most ms for one (0, the default: its whole timeout); past that it
 * fails with KV_EUNAVAIL, and the caller may probe why. Thread-safe. */
void kv_rpc_client_connect_wait(kv_rpc_client *c, uint32_t ms);

/* Whether the client has a connection now. */
bool kv_rpc_client_connected(const kv_rpc_client *c);

/* Returns the URL this client dials. */
const char *kv_rpc_client_url(const kv_rpc_client *c);

/*
 * Sends `req` and waits up to timeout_ms for the reply. On 0 the request
 * was taken and *reply is the caller's (free with nng_msg_free). On error
 * the request was freed too. Returns 0, KV_ETIMEDOUT, KV_EUNAVAIL (no
 * connection could be made in time), KV_EAUTH (a TLS client found that the
 * handshake fails: kv_rpc_why() says why), KV_ECLOSED or KV_ENOMEM.
 * Thread-safe: many calls may be in flight on one client.
 */
int kv_rpc_call(kv_rpc_client *c, nng_msg *req, nng_msg **reply, uint32_t timeout_ms);

/*
 * An asynchronous caller on a client: one request at a time, answered by a
 * callback. On a client of a plain tcp:// address the callers share one
 * connection and one thread of the client's (rpc_lcall.c): a call is
 * written on the calling thread, the answers are read and the callbacks
 * run on the client's thread, and a connection that fails fails the calls
 * written on it at once (KV_EUNAVAIL). Otherwise (TLS) a caller is an nng
 * context and aio, kept between calls, and callbacks run on nng's threads.
 * For pipelines of requests, use several.
 */
typedef struct kv_rpc_async kv_rpc_async;

/* Called once per kv_rpc_async_call: rv 0 with the reply (the callee's to
 * free), or a KV_E* code as kv_rpc_call's and reply NULL. It may start the
 * next call on the same caller. */
typedef void (*kv_rpc_done_fn)(void *arg, int rv, nng_msg *reply);

/* Makes a caller on c. Returns 0, KV_ENOMEM or a transport error. */
int kv_rpc_async_create(kv_rpc_client *c, kv_rpc_done_fn done, void *arg, kv_rpc_async **out);

/* Sends req (taken in every case) and calls done when the reply comes, the
 * timeout passes or the call is cancelled. At most one call in flight. */
void kv_rpc_async_call(kv_rpc_async *a, nng_msg *req, uint32_t timeout_ms);

/*
 * As kv_rpc_async_call, but on an nng caller (TLS) the send is made and
 * waited for on the calling thread, with an aio of its own that has no
 * callback: a send that nng completes at once costs no hand-off to one of
 * nng's threads, and the receive is posted only once the send is done
 * (never while it is queued). Only the reply (or the receive's failure)
 * comes through done; a failed send calls done before this returns. For a
 * thread that may wait up to the send's timeout (a blocking call's); never
 * from a done callback. On a link it is kv_rpc_async_call (whose send is
 * made on the calling thread anyway).
 */
void kv_rpc_async_call_wait_send(kv_rpc_async *a, nng_msg *req, uint32_t timeout_ms);

/* Stops the caller (a call still in flight is cancelled and its callback
 * waited for) and frees it. Not from its own callback, nor (tcp://) from
 * a callback of another caller of the same client. Accepts NULL. Call
 * before destroying the client, and preferably with no call in flight:
 * nng 1.5 can hang closing a socket whose request context was cancelled. */
void kv_rpc_async_destroy(kv_rpc_async *a);

/* Returns the detail of the last kv_rpc_call on this thread that failed with
 * more known than its code ("" otherwise): the reason a TLS handshake fails.
 * Valid until the next call on this thread. */
const char *kv_rpc_why(void);

/*
 * A link: one connection to a tcp:// server (REQ side of nng's wire) with
 * no thread of its own, for a thread that runs a loop of its own (the
 * replication stream): it sends requests under ids of its choosing, polls
 * kv_link_fd with whatever else it waits for, and takes the answers as
 * they come, in any order. Nothing of nng's runs: a request costs no
 * hand-off to another thread, in either direction. Not thread-safe: one
 * thread uses a link. Plain TCP only (a TLS peer needs kv_rpc_client).
 */
typedef struct kv_link kv_link;

/* Whether url is one a link can dial (tcp://, tcp4://, tcp6://). */
bool kv_link_url_ok(const char *url);

/* Connects to url and exchanges the protocol header, within timeout_ms.
 * Answers over max_msg bytes (0: KV_RPC_MAX_MSG) fail the link. Returns 0,
 * KV_EINVAL (url), KV_EUNAVAIL (refused, unreachable), KV_ETIMEDOUT,
 * KV_EPROTO (the peer speaks another protocol) or KV_ENOMEM. */
int kv_link_open(const char *url, uint32_t timeout_ms, size_t max_msg, kv_link **out);

/* The descriptor to poll: POLLIN for answers, and POLLOUT while
 * kv_link_want_write. */
int kv_link_fd(const kv_link *l);

/* Queues request id (below 2^31) with body's len bytes (copied) and
 * writes what the kernel takes. Returns 0, KV_ECLOSED (the link failed:
 * close it) or KV_ENOMEM. */
int kv_link_send(kv_link *l, uint32_t id, const void *body, size_t len);

/* Whether queued bytes wait for the kernel (poll for POLLOUT, then
 * kv_link_flush). */
bool kv_link_want_write(const kv_link *l);

/* Writes what the kernel takes of the queued bytes. Returns 0 or
 * KV_ECLOSED. */
int kv_link_flush(kv_link *l);

/* Takes the next whole answer, reading the socket when none is buffered:
 * *got true with its request id and body (valid until the next call on the
 * link), false when none has come yet. Returns 0, or KV_ECLOSED (the peer
 * closed, the connection failed) or KV_EPROTO (a malformed or oversized
 * answer), after which the link only fails: close it. */
int kv_link_recv(kv_link *l, bool *got, uint32_t *id, const uint8_t **body, size_t *len);

/* Closes the connection at once and frees the link. Accepts NULL. */
void kv_link_close(kv_link *l);

#endif
