/*
 * client_int.h - what the modules of libshardkv share among themselves.
 *
 *   client.c  the handle: configuration cache, owner hints, watch thread,
 *             per-address rpc clients, controller calls
 *   engine.c  the request engine: per-server queues and request slots,
 *             routing and retries of data requests, the retry thread, close
 *   ops.c     data operations (get ... scan, mget/mput, async) as requests
 *             of the engine
 *   admin.c   admin operations and the public configuration result
 *   batch.c   pure logic: splitting keys per node, scan plans, merging
 *
 * Data requests and replies are proto/data_codec.h's structs as they are: an
 * op is a kv_op, and the answer to it the kv_data_result moved out of the
 * decoded Response (engine.c). The controller's messages are
 * proto/admin_codec.h's, likewise.
 *
 * Nothing here is exported from the shared library.
 */
#ifndef KV_CLIENT_CLIENT_INT_H
#define KV_CLIENT_CLIENT_INT_H

#include "client/include/shardkv.h"
#include "common/config.h"
#include "common/key.h"
#include "common/rpc.h"
#include "proto/admin_codec.h"
#include "proto/data_codec.h"

#include <nng/nng.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---------------------------------------------------------------------------
 * admin.c: the controller's messages are proto/admin_codec.h's
 * ------------------------------------------------------------------------- */

/* Returns the static name of a KV_ADMIN_ROLE_* value. */
const char *kvc_role_name(int role);

/* ---------------------------------------------------------------------------
 * batch.c: pure routing and merging logic (tested with hand-built configs)
 * ------------------------------------------------------------------------- */

/* The keys of a multi-key op that go to one node. */
typedef struct {
	uint32_t node; /* the node (0: no route) */
	size_t n;      /* keys in this part */
	size_t *idx;   /* their indexes into the caller's key array, ascending */
} kvc_part;

/*
 * Splits n keys by the node each routes to under `cfg` (kv_config_route).
 * Parts are ordered by node id; within a part the indexes ascend, so results
 * can be put back in key order. On 0 the caller frees *parts with
 * kvc_parts_free(*parts, *nparts). Returns 0 or KV_ENOMEM.
 */
int kvc_split_keys(const kv_config *cfg, size_t n, const kv_bytes *keys, kvc_part **parts,
                   size_t *nparts);

/* Frees parts made by kvc_split_keys(). Accepts NULL. */
void kvc_parts_free(kvc_part *parts, size_t nparts);

/* One piece of a scan: the part of the scanned range one node owns. */
typedef struct {
	kv_buf start;  /* inclusive */
	kv_buf end;    /* exclusive; empty: end of key space */
	uint32_t node; /* the node to ask (the migration source when moving) */
} kvc_span;

/*
 * Cuts [start, end) (empty end: no bound) into spans at every range and
 * migration boundary of cfg, in key order, each with the node that serves it
 * now. On 0 the caller frees *spans with kvc_spans_free(). Returns 0,
 * KV_EINVAL (empty range) or KV_ENOMEM.
 */
int kvc_scan_plan(const kv_config *cfg, kv_bytes start, kv_bytes end, kvc_span **spans,
                  size_t *nspans);

/* Frees spans. Accepts NULL. */
void kvc_spans_free(kvc_span *spans, size_t n);

/* A growing list of scan entries in key order. Zero-initialise. */
typedef struct {
	size_t n;               /* entries */
	size_t cap;             /* allocated */
	kv_data_entry *entries; /* owned */
} kvc_entries;

/*
 * Moves the entries of a per-server reply (in key order) to the end of `acc`,
 * keeping `acc` strictly increasing: entries not greater than acc's last key
 * are dropped (a server may repeat keys after a configuration change), and
 * at most `limit` entries are kept in total (0: no limit). The taken buffers
 * are cleared in `src`. Returns the number appended, or KV_ENOMEM.
 */
long kvc_entries_merge(kvc_entries *acc, kv_data_entry *src, size_t nsrc, size_t limit);

/* Frees the entries. Accepts NULL. */
void kvc_entries_fini(kvc_entries *e);

/* ---------------------------------------------------------------------------
 * client.c: the handle
 * ------------------------------------------------------------------------- */

struct kvc_queue;

/* A reference-counted configuration snapshot. */
typedef struct {
	kv_config *cfg;  /* immutable */
	atomic_int refs; /* holders */
	/* The engine's queue of each node, by index in cfg->nodes: set by
	 * route() the first time it sends there (NULL: not yet; the array
	 * NULL: none is remembered). A queue lives until the handle closes. */
	_Atomic(struct kvc_queue *) *queues;
} kvc_cfgref;

/* An owner hint remembered until the next configuration arrives. */
typedef struct {
	kv_buf start;   /* the owner's range [start, end) */
	kv_buf end;     /* empty: end of the key space */
	char *address;  /* where its keys go now (owned) */
	uint64_t epoch; /* the cached epoch the hint amends */
} kvc_hintent;

#define KVC_MAX_HINTS 8

/* An rpc client for one server or controller address. Heap-allocated, so
 * that the engine's queue pointer stays put while the table grows. */
typedef struct {
	char *address;                     /* the URL */
	kv_rpc_client *rpc;                /* dials it */
	_Atomic(struct kvc_queue *) queue; /* its engine queue (engine.c), made on first use */
} kvc_conn;

/* Runs after ref, a newer configuration, was installed in the cache (no
 * lock held, never on an nng thread); ref is valid during the call. */
typedef void (*kvc_cfg_hook_fn)(shardkv_client *c, kvc_cfgref *ref);

struct shardkv_client {
	uint64_t client_id; /* random, non-zero */
	/* next_id is taken per op by every thread that submits: kept off the
	 * cache lines of the fields read per op (a line of padding each side,
	 * as the handle is calloc'd without extra alignment). */
	char pad_id0[64];
	atomic_uint_fast64_t next_id; /* request ids, envelope and op */
	char pad_id1[64];
	atomic_uint timeout_ms; /* per-call deadline */
	kv_buf auth;            /* auth token */
	kv_tls *tls;            /* TLS configuration (immutable); NULL: none */
	bool no_watch;          /* no watch thread */

	size_t nctl;      /* controller addresses */
	char **ctl_addrs; /* from shardkv_open, owned */

	pthread_mutex_t conn_mu; /* protects everything down to the blank line */
	kvc_conn **conns;        /* one per address, created lazily, never removed */
	size_t nconns;           /* entries */
	size_t capconns;         /* allocated */
	size_t ctl_next;         /* the controller that answered last */
	bool ctl_known;          /* some controller has answered */

	pthread_mutex_t cfg_mu; /* protects everything down to the blank line */
	pthread_cond_t cfg_cv;  /* signalled on a new config and on close */
	kvc_cfgref *cfg;        /* the newest configuration, NULL before the first */
	atomic_bool cfg_known;  /* cfg is set (it never goes back to NULL); read without cfg_mu */
	bool watch_started;     /* the watch thread exists */
	bool closing;           /* shardkv_close is running */
	nng_aio *watch_aio;     /* the watch thread's send or receive, cancelled to stop it */
	kvc_hintent hints[KVC_MAX_HINTS]; /* owner hints since the cached config, newest first */
	atomic_size_t nhints;             /* entries (written under cfg_mu; read without it
	                                   * only to skip the lookup when 0) */

	pthread_t watch_thread;             /* long-polls the controller */
	atomic_uint_fast64_t refused_since; /* kv_now_ns() of the first of the controller
	                                     * attempts refused in a row; 0: the last was not */

	pthread_mutex_t eng_mu;       /* protects everything down to the blank line (engine.c) */
	pthread_cond_t eng_cv;        /* pending fell to 0 */
	pthread_cond_t rq_cv;         /* the retry queue grew, or closing (CLOCK_MONOTONIC) */
	struct kvc_queue *eng_queues; /* every server's queue */
	struct kvc_req *rq_head;      /* reqs for the retry thread, in arrival order */
	struct kvc_req *rq_tail;      /* the newest */
	atomic_ulong eng_pending;     /* reqs taken and not yet completed: atomic, and its
	                               * fall to 0 is made under eng_mu (engine.c pending_down) */
	atomic_bool eng_closing;      /* shardkv_close has begun (set under eng_mu) */
	bool rq_started;              /* the retry thread exists */
	unsigned eng_walkers;         /* threads re-routing after a new configuration
	                               * (engine.c kvc_engine_follow); close waits for 0 */

	pthread_t rq_thread; /* backoffs, configuration fetches and TLS probes of retries */
	atomic_uint_fast64_t refresh_ns;   /* kv_now_ns() of the retry thread's last
	                                    * refresh fetch (engine.c); 0: none yet */
	_Atomic(kvc_cfg_hook_fn) cfg_hook; /* run after a newer configuration is
	                                    * installed (set by the engine); NULL: none */
};

/* Returns a fresh request id (never 0). */
uint64_t kvc_next_id(shardkv_client *c);

/* Returns the per-call deadline as an absolute kv_now_ns() value. */
uint64_t kvc_deadline(shardkv_client *c);

/* kvc_deadline from the cheaper kv_now_late_ns(): at most one clock tick
 * later, never earlier. For the async ops, one read per op. */
uint64_t kvc_deadline_late(shardkv_client *c);

/* Milliseconds left until `deadline_ns`, at least 1; 0 when it passed. */
uint32_t kvc_remaining_ms(uint64_t deadline_ns);

/* The timeout one attempt may take: a lost reply must leave time for a
 * retry, so half of what is left (at least a second, at most everything). */
uint32_t kvc_attempt_ms(uint64_t deadline_ns);

/* Sleeps *backoff_ms (bounded by the deadline), then doubles it up to 100. */
void kvc_backoff(uint64_t deadline_ns, uint32_t *backoff_ms);

/*
 * Returns a reference to the cached configuration, fetching it from the
 * controller first when there is none or when `min_epoch` is newer than the
 * cached one. Release with kvc_cfg_put(). Returns 0 or a KV_E* code.
 */
int kvc_cfg_get(shardkv_client *c, uint64_t min_epoch, uint64_t deadline_ns, kvc_cfgref **out);

/* Whether a retry may fetch a configuration to refresh the cache now (at
 * most one fetch per 100 ms per handle, so that a dead cluster does not
 * make a tight loop at the controller); if so, the fetch is counted. */
bool kvc_refresh_due(shardkv_client *c, uint64_t now);

/* Releases a configuration reference. Accepts NULL. */
void kvc_cfg_put(kvc_cfgref *r);

/* The cached configuration with a reference, without fetching or waiting;
 * NULL before the first. Release with kvc_cfg_put(). */
kvc_cfgref *kvc_cfg_peek(shardkv_client *c);

/* The rpc client of `address` and its table entry (*conn stays valid until
 * the handle is freed), made on first use. Returns 0, KV_ENOMEM or a
 * transport error. */
int kvc_conn_get(shardkv_client *c, const char *address, kv_rpc_client **rpc, kvc_conn **conn);

/* After a request to `address` found no connection: lets its dialer start
 * over, as kv_rpc_call does by itself (kv_rpc_client_redial). Never on an
 * nng thread. */
void kvc_conn_redial(shardkv_client *c, const char *address);

/*
 * Remembers that keys of [h->start, h->end) go to `address` while the cached
 * configuration is still at `epoch` (a newer configuration clears every
 * hint). Copies what it keeps; ignores a hint that does not contain `key`.
 */
void kvc_hint_learn(shardkv_client *c, uint64_t epoch, const kv_data_hint *h, const char *address,
                    kv_bytes key);

/* Returns a copy of the hinted address for key under the cached `epoch`
 * (the caller frees it), or NULL. */
char *kvc_hint_lookup(shardkv_client *c, uint64_t epoch, kv_bytes key);

/* Forgets every hint that points at address (it did not answer). */
void kvc_hint_forget(shardkv_client *c, const char *address);

/* Installs cfg (taken) if it is newer than the cached one, then runs the
 * handle's cfg_hook (no lock held); frees it otherwise. */
void kvc_cfg_install(shardkv_client *c, kv_config *cfg);

/*
 * Sends an admin request to the controllers: the last one that answered
 * first, then the others, following NOT_LEADER hints, retrying transport
 * errors until the deadline. q->client_id/request_id/auth are filled here.
 * On 0 *r holds a decoded reply whose status is not a transport problem
 * (free it with kv_admin_resp_fini).
 */
int kvc_controller_call(shardkv_client *c, kv_admin_req *q, uint64_t deadline_ns, kv_admin_resp *r);

/* Whether the last kvc_controller_call on this thread failed because every
 * controller address refused connections for KVC_REFUSED_MS (nothing listens
 * there): the caller reports it instead of retrying until its deadline. */
bool kvc_ctl_refused(void);

/* Sets the thread's error detail (printf-style). Returns err. */
int kvc_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clears the thread's error detail. */
void kvc_clear_error(void);

/* Returns whether err is worth retrying within the deadline. */
bool kvc_retryable(int err);

/* Stops the watch thread, closes every connection and frees the handle and
 * what it owns. The engine must be closed first (kvc_engine_close). */
void kvc_handle_free(shardkv_client *c);

/* ---------------------------------------------------------------------------
 * engine.c: the request engine
 * ------------------------------------------------------------------------- */

/* A countdown a caller waits on: one per blocking call (count 1) or per
 * round of mget/mput parts (count = parts). Only the last count down takes
 * the lock, so parts finishing together do not queue on it. */
typedef struct {
	atomic_uint count;  /* reqs still to finish */
	pthread_mutex_t mu; /* protects zero */
	pthread_cond_t cv;  /* signalled when zero is set */
	bool zero;          /* count reached 0 */
} kvc_latch;

/* Sets the latch to count. */
void kvc_latch_init(kvc_latch *l, unsigned count);

/* Counts one down (a req that finished, or one that was never submitted)
 * and wakes the waiter at zero. */
void kvc_latch_down(kvc_latch *l);

/* Waits until every req of the latch has finished. */
void kvc_latch_wait(kvc_latch *l);

/* Frees the latch (no req of it left). */
void kvc_latch_fini(kvc_latch *l);

typedef struct kvc_req kvc_req;

/* Runs when a req without a latch finishes: rv 0 with q->status and *r,
 * the op's result where it lies in the decoded Response (an empty result
 * with KV_EPROTO when the Response was refused whole), or a KV_E* code with
 * q->why and r NULL. The callee may take r's buffers (clearing them); the
 * rest is freed with the Response after it returns. On a library thread,
 * no lock held; the callee may free q. */
typedef void (*kvc_req_done_fn)(kvc_req *q, int rv, kv_data_result *r);

/*
 * One request of the engine. The submitter fills the fields above the blank
 * line but next (zero the rest) and keeps q, with what op points to, until
 * it finishes, then frees it with kvc_req_fini. What the engine reads of
 * every queued req to send it (next, the deadline, the op's kind and sizes)
 * comes first, in one cache line. Routed reqs finish with rv 0 and a
 * result whose status is final, or with an error; a part req (kvc_submit_to) finishes with rv 0 and
 * whatever answer came (the envelope's status in q->status, the op's in q->res.status; either may
 * be a refusal), or a transport error.
 *
 * With a latch, the answer is the op's kv_data_result moved out of the
 * decoded Response into *out, so its buffers are the waiter's
 * (kv_data_result_fini frees them) and its error is always NULL: the
 * decoded strings die with the Response, so the detail of a refusal is
 * copied to why. Without one, the done callback reads the result in place.
 * A req stays small (its result and detail live elsewhere): an async op
 * allocates one per op, written on one core and sent from another.
 */
struct kvc_req {
	kvc_req *next;        /* queue link (the engine's; zero it) */
	uint64_t deadline_ns; /* the caller's deadline (kv_now_ns) */
	kv_op op;             /* the op; its pointers borrowed from the submitter */
	shardkv_client *c;    /* the handle */
	kv_bytes key;         /* routed: the routing key (op.key, or a scan's start) */
	kvc_latch *latch;     /* counted down when it finishes; NULL: done runs */
	kv_data_result *out;  /* with a latch: receives the op's result on rv 0 */
	kvc_req_done_fn done; /* with latch NULL */
	void *arg;            /* for done */

	int rv;              /* the result, once finished */
	int status;          /* rv 0: the Response's envelope status */
	uint64_t srv_epoch;  /* rv 0: the answering server's epoch */
	char *why;           /* the detail of a failure, or of the last refusal
	                      * (owned, KVC_WHY_LEN bytes once set; NULL: none) */
	bool routed;         /* the engine routes and retries it */
	bool task;           /* a wait of the retry thread (kvc_defer): done runs there */
	bool refresh;        /* fetch a configuration before the next attempt */
	uint64_t epoch;      /* the epoch of its current attempt */
	char *hint_addr;     /* the next attempt goes here (owned); NULL: route */
	char *quiet_addr;    /* its last request found no connection to this server
	                      * (owned): redial it (and probe its TLS) first */
	uint64_t min_epoch;  /* the next attempt needs at least this epoch (0: any) */
	uint64_t not_before; /* the next attempt, not before (kv_now_ns) */
	uint32_t backoff_ms; /* the next backoff */
	int last;            /* the last refusal or transport error */
	uint64_t down_since; /* when routing first found its owner `down`
	                      * (kv_now_ns; 0: not yet) */
};

/* How long a request (or an mget/mput part) whose owner is `down` waits
 * for another primary or the node's return before it fails as unavailable
 * (doc/library.md "A `down` owner"). */
#define KVC_DOWN_GIVEUP_MS 1000u

/* The room of a req's detail (longer ones are cut). */
#define KVC_WHY_LEN 256

/* The detail of q's failure or last refusal; "" when none. */
const char *kvc_req_detail(const kvc_req *q);

/* Frees what a finished req still owns (its detail). Accepts a zeroed req. */
void kvc_req_fini(kvc_req *q);

/*
 * Decodes the Response `p` (len bytes) to a request of n ops into *d. A
 * Response that cannot be decoded, or whose status is OK but that carries
 * other than n results, is KV_EPROTO. On 0 the caller frees *d with
 * kv_data_resp_fini; on error *d is zeroed. Returns 0, KV_EPROTO or
 * KV_ENOMEM.
 */
int kvc_reply_decode(const void *p, size_t len, size_t n, kv_resp *d);

/*
 * Takes a routed req: routes it by q->key and retries it until a final
 * answer or its deadline (owner hints, backoff, request id kept). Returns 0
 * (q will finish), or KV_ECLOSED once shardkv_close has begun (it will not).
 */
int kvc_submit_routed(kvc_req *q);

/* Takes a part req for one attempt at `address` with `epoch`. Returns 0 (q
 * will finish) or KV_ECLOSED (it will not). */
int kvc_submit_to(kvc_req *q, const char *address, uint64_t epoch);

/*
 * Runs one op routed by `key` as a routed req and waits for it. On 0 *out
 * holds the op's result, its status final (the thread's error detail set
 * when it is not OK); free it with kv_data_result_fini(). On error the
 * thread's error detail says why.
 */
int kvc_run_routed(shardkv_client *c, const kv_op *op, kv_bytes key, uint64_t deadline,
                   kv_data_result *out);

/* Marks this thread as a blocking call's while it submits (on) and after
 * (off): the engine may then send on it and wait for the send. */
void kvc_may_wait(bool on);

/*
 * Hands q to the retry thread (starting it the first time) as a task: at
 * not_before (kv_now_ns) the thread runs q->done(q, 0, NULL), or
 * q->done(q, KV_ECLOSED, NULL) once shardkv_close has begun, then forgets
 * q. For what must wait or may block (a backoff, a configuration fetch, a
 * redial) on behalf of an op driven by completions (ops.c's mget, mput and
 * scan machines). A task is not counted pending: its op holds a count of
 * its own (kvc_pending_take). Returns 0, or KV_ECLOSED (closing) or
 * KV_ENOMEM (no thread) and done will not run.
 */
int kvc_defer(kvc_req *q, uint64_t not_before);

/* Counts one op of the handle that is not a req (an async mget, mput or
 * scan, driven by the completions of its reqs) as pending, so that
 * shardkv_close waits for it. Returns 0, or KV_ECLOSED once shardkv_close
 * has begun. */
int kvc_pending_take(shardkv_client *c);

/* The op counted by kvc_pending_take finished; c may be freed after. */
void kvc_pending_release(shardkv_client *c);

/*
 * Follows a newer configuration (the handle's cfg_hook, set on the first
 * submit): routed reqs queued for a server that no longer owns their key
 * are routed again at once; those queued for, or on the wire to, a server
 * that ref marks `down` are taken back (a request on the wire is abandoned,
 * its reply ignored) and routed again with their request ids, and the part
 * reqs among them fail with KV_EUNAVAIL for ops.c to split again.
 */
void kvc_engine_follow(shardkv_client *c, kvc_cfgref *ref);

/* Refuses new reqs, finishes the queued ones with KV_ECLOSED, waits for
 * those on the wire, stops the retry thread and frees the queues. First in
 * shardkv_close. */
void kvc_engine_close(shardkv_client *c);

#endif
