/*
 * server_int.h - the shard server's shared state (struct kv_server), for
 * the server's own files: server.c (life cycle), dispatch.c, follow.c,
 * heartbeat.c, ctlcall.c and metrics_srv.c. The migration files do not
 * include it (they see the server through kv_mig_env, migrate.h), and
 * nothing outside shardserver/ does.
 *
 * Threads, what each owns and the lock order: doc/threads.md.
 */
#ifndef KV_SHARDSERVER_SERVER_INT_H
#define KV_SHARDSERVER_SERVER_INT_H

#include "common/config.h"
#include "common/err.h"
#include "common/metrics.h"
#include "common/rpc.h"
#include "shardserver/dedup/dedup.h"
#include "shardserver/durable/durable.h"
#include "shardserver/migrate.h"
#include "shardserver/owner.h"
#include "shardserver/repl/repl.h"
#include "shardserver/server.h"
#include "proto/admin_codec.h"
#include "proto/data_codec.h"
#include "shardserver/store/store.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

/* Slots of kv_server.err_count: slot -code for each KV_E* code, slot 0 for a
 * status outside the table. */
#define KV_SRV_ERR_SLOTS (1 - KV_ERR_MIN)

/* One served range's figures for /metrics. */
typedef struct {
	char *label;    /* "[start, end)", keys escaped for a label value */
	uint64_t keys;  /* live keys */
	uint64_t bytes; /* their key + value bytes */
} kv_srv_range_fig;

/* Load sampling (heartbeat.c; doc/scheduler.md "Statistics"): one op in
 * KV_LOAD_EVERY is recorded with its first key (cut to KV_LOAD_KEYMAX bytes)
 * in a ring the heartbeat thread empties every second. */
#define KV_LOAD_EVERY  16u
#define KV_LOAD_SLOTS  512u
#define KV_LOAD_KEYMAX 48u

typedef struct {
	uint8_t len;                 /* bytes of key used */
	bool write;                  /* a write op */
	uint8_t key[KV_LOAD_KEYMAX]; /* the op's first key (a prefix of it) */
} kv_load_sample;

struct kv_server {
	const kv_server_cfg *cfg;          /* flags (immutable): &cfg_copy */
	kv_server_cfg cfg_copy;            /* the caller's kv_server_cfg, copied */
	kv_store *store;                   /* the data */
	kv_owner owner;                    /* what this node serves (own rwlock) */
	kv_dedup *dedup;                   /* exactly-once memory (own locks) */
	kv_dur *dur;                       /* log and snapshots (own locks) */
	atomic_uint_fast64_t visible_lsn;  /* highest log record of a client write: what
	                                      a reply may reveal (incoming transfers are
	                                      synced before they are served) */
	atomic_int inflight;               /* requests between handler entry and final reply */
	atomic_bool closing;               /* shutting down: refuse new requests */
	kv_rpc_server *rpc;                /* the --listen endpoint */
	kv_rpc_server *_Atomic rpc_pub;    /* rpc once it listens, for /metrics */
	size_t max_key;                    /* effective key limit */
	size_t max_value;                  /* effective value limit */
	size_t max_batch;                  /* ops (keys) per request */
	uint64_t boot_id;                  /* random per start */
	atomic_bool restarted;             /* this process recovered the node from its
	                                      data dir and no OK answer to a Register or
	                                      Heartbeat saying so came yet
	                                      (doc/replication.md "Failover") */
	uint64_t created_ns;               /* kv_now_ns() at create: where the uptime that
	                                      heartbeats report starts (immutable) */
	atomic_bool hb_now;                /* send the next heartbeat now, not at the
	                                      next second (a migration changed the
	                                      data this node holds) */
	uint64_t admin_client_id;          /* client id of our AdminRequests */
	atomic_uint_fast64_t admin_req_id; /* next AdminRequest.request_id */
	atomic_uint node_id;               /* 0 until registered */
	atomic_uint_fast64_t epoch;        /* last applied configuration epoch */
	atomic_bool stopping;              /* shutting down: background loops return */
	atomic_bool leaving;               /* graceful leave requested */
	atomic_uint_fast64_t ops;          /* ops served, for ops/s */
	kv_metrics *metrics;               /* the --metrics listener, or NULL (metrics_srv.c) */
	/* The lease (doc/contract.md §2; heartbeat.c). lease_ns and renew_ns
	 * are immutable. */
	uint64_t lease_ns;                  /* a renewal lasts this long from its send */
	uint64_t renew_ns;                  /* renewal period */
	atomic_uint_fast64_t lease_sent_ns; /* send time of the last renewal answered OK;
	                                       0: none yet */
	atomic_bool gone;                   /* the controller said the node is gone */
	atomic_bool drained;                /* a configuration marked this node DRAINING:
	                                       an operator's leave, so GONE is its
	                                       normal end (follow.c) */
	kv_buf auth;                        /* --auth-token-file secret (immutable); empty: none */
	kv_tls *tls;                        /* --tls-* configuration (immutable); NULL: plain tcp */

	/* Life cycle, used only by the thread that calls create/start/stop. */
	pthread_t watch_thr; /* follows the configurations (kv_srv_watch_main) */
	pthread_t hb_thr;    /* heartbeats (kv_srv_heartbeat_main) */
	pthread_t lease_thr; /* lease renewals (kv_srv_lease_main) */
	bool lease_started;  /* lease_thr runs */
	bool watch_started;  /* watch_thr runs */
	bool hb_started;     /* hb_thr runs */
	pthread_t exp_thr;   /* active expiry (kv_srv_expire_main) */
	bool exp_started;    /* exp_thr runs */
	bool started;        /* kv_server_start got as far as listening */
	bool stopped;        /* kv_server_stop ran */
	bool wedged;         /* stop found replies waiting for a failing disk */
	int stop_rv;         /* what kv_server_stop returned */

	/* Counters for /metrics only, updated with relaxed atomics. */
	atomic_uint_fast64_t op_count[KV_OP__COUNT];      /* ops received, by kv_op_kind */
	atomic_uint_fast64_t err_count[KV_SRV_ERR_SLOTS]; /* failed ops and requests */
	atomic_uint_fast64_t read_hits;                   /* keys get and mget found */
	atomic_uint_fast64_t read_misses;                 /* keys get and mget did not find */
	atomic_uint_fast64_t expired_reclaimed;           /* expired keys removed (expire.c) */
	atomic_uint_fast64_t cond_conflicts;              /* conditional writes refused */
	atomic_uint_fast64_t range_counts;                /* heartbeat walks of the ranges */
	kv_lat_hist op_lat[KV_OP__COUNT]; /* receipt to reply of requests, by op kind in them */

	pthread_mutex_t cfg_mu; /* protects cur, cluster_id and gone_why */
	kv_config *cur;         /* latest applied configuration, NULL before */
	char cluster_id[128];   /* from the node file or the first config */
	char gone_why[256];     /* why the node is gone (with `gone`) */

	pthread_mutex_t ctl_mu; /* protects ctl_idx */
	kv_rpc_client **ctl;    /* one client per controller address */
	size_t ctl_idx;         /* the one to try first */

	kv_mig *mig; /* the migrations, both directions (migrate.h; own locks) */
	kv_rs *repl; /* the replication stream, both sides (repl/repl.h; own locks) */

	/* The load sample (heartbeat.c); load_busy is a try-lock (zero: free)
	 * that protects load and nload. */
	atomic_uint_fast64_t load_tick;     /* ops seen by kv_srv_load_note */
	atomic_bool load_busy;              /* held while load is written or emptied */
	size_t nload;                       /* samples since the last emptying */
	kv_load_sample load[KV_LOAD_SLOTS]; /* a ring: the latest KV_LOAD_SLOTS */

	pthread_mutex_t rfig_mu; /* protects rfig and nrfig */
	kv_srv_range_fig *rfig;  /* per served range, as of the heartbeat's last count */
	size_t nrfig;
};

/* Records one op in the load sample when its turn comes (one relaxed atomic
 * add; one op in KV_LOAD_EVERY also copies its key under a try-lock and is
 * dropped rather than waiting when the heartbeat thread holds it). */
void kv_srv_load_note(kv_server *s, const kv_op *op, bool write);

/* The token this server sends to the controller and to other servers. */
static inline kv_bytes
kv_server__auth(const kv_server *s)
{
	return (kv_bytes){.p = s->auth.data, .len = s->auth.len};
}

/* Sleeps up to ms, returning early when the server stops. */
static inline void
kv_server__nap(kv_server *s, unsigned ms)
{
	while (ms > 0 && !atomic_load(&s->stopping)) {
		unsigned step = ms < 20 ? ms : 20;
		struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)step * 1000000L};
		nanosleep(&ts, NULL);
		ms -= step;
	}
}

/* Counts a failed op or request in s->err_count for /metrics; 0 and
 * KV_ENOTFOUND (an answer, not a failure) are not counted. Cheap: one
 * relaxed atomic add on the failure path only. */
static inline void
kv_srv_count_error(kv_server *s, int status)
{
	if (status == KV_OK || status == KV_ENOTFOUND)
		return;
	size_t slot = status < 0 && status >= KV_ERR_MIN ? (size_t)-status : 0;
	atomic_fetch_add_explicit(&s->err_count[slot], 1, memory_order_relaxed);
}

/* Records a renewal the controller answered OK (register or heartbeat),
 * sent at sent_ns (monotonic): the lease runs until sent_ns + lease_ns. */
static inline void
kv_srv_lease_renewed(kv_server *s, uint64_t sent_ns)
{
	uint64_t old = atomic_load(&s->lease_sent_ns);
	while (old < sent_ns && !atomic_compare_exchange_weak(&s->lease_sent_ns, &old, sent_ns))
		;
}

/* Whether the server may answer data requests now: it holds a lease and is
 * not gone. Otherwise writes why into msg. Cheap: two atomic loads and a
 * clock read. */
bool kv_srv_lease_ok(kv_server *s, char *msg, size_t msglen);

/* An OK answer to a Register or Heartbeat that said (said) the process
 * restarted: the controller has handled the restart, stop saying so
 * (heartbeat.c; doc/replication.md "Failover"). */
void kv_srv_restart_confirmed(kv_server *s, bool said);

/* The controller said the node is gone: stop serving for good (heartbeat.c). */
void kv_srv_set_gone(kv_server *s, const char *detail);

/* metrics_srv.c: starts the --metrics listener when configured. On failure
 * logs the reason and returns KV_EINVAL, KV_EADDRINUSE or KV_ENOMEM. Call
 * once the store and the log are open; stop it before they close. */
int kv_srv_metrics_start(kv_server *s);

/* Publishes the per-range figures of the heartbeat's last count for
 * /metrics (copies them; on out of memory the old ones stay). */
void kv_srv_metrics_set_ranges(kv_server *s, const kv_admin_range_stat *rs, size_t n);

/* metrics_srv.c: stops the listener (waits for a scrape in progress).
 * Idempotent. */
void kv_srv_metrics_stop(kv_server *s);

#endif
