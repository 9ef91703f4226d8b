/*
 * server.h - the shard server daemon (shardkv-server): serves Request
 * batches from the local store for the ranges this node owns, follows the
 * controller's configurations, and moves ranges to other servers
 * (doc/protocol.md).
 *
 * A server is a handle with a life cycle: kv_server_create (opens the data
 * dir, recovers), kv_server_start (listens, follows the controller),
 * optionally kv_server_leave (hands the ranges away), kv_server_stop and
 * kv_server_destroy. It keeps no process-wide state, so one process can run
 * several servers and a controller; signals are the business of main.c,
 * which parses flags into a kv_server_cfg and drives that life cycle. A
 * process that embeds a server should ignore SIGPIPE and SIGXFSZ as main.c
 * does (a file size limit is then an I/O error of the log, not a death).
 * Thread model and lock order: doc/threads.md.
 */
#ifndef KV_SHARDSERVER_SERVER_H
#define KV_SHARDSERVER_SERVER_H

#include "common/log.h"
#include "common/tls.h"
#include "shardserver/store/store.h"
#include "shardserver/durable/durable.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The immutable start-up configuration (flags). kv_server_create copies the
 * struct; the strings and the ctl array stay borrowed and must outlive
 * kv_server_destroy. */
typedef struct {
	const char *listen;     /* --listen nng URL */
	const char *const *ctl; /* --controller addresses */
	size_t nctl;            /* number of controller addresses, >= 1 */
	const char *data_dir;   /* --data-dir */
	bool join;              /* --join: register as a new node on first start */
	unsigned threads;       /* --threads: percore owner threads; 0: default */
	/* --io-loops: the event loops requests are read and answered on
	 * (common/rpc.h, kv_rpc_server_opts.loops); 0: one per CPU. io_nng
	 * (--io-loops 0): nng's threads instead. */
	unsigned io_loops;
	bool io_nng;
	kv_store_mode store_mode; /* --store */
	kv_fsync_mode fsync;      /* --fsync */
	uint64_t
	    snapshot_bytes; /* --snapshot-bytes: log growth that triggers a snapshot; 0: default */
	bool wal_truncate_corrupt; /* --wal-truncate-corrupt: cut the log at a corrupt record */
	size_t max_key;            /* --max-key; 0: default */
	size_t max_value;          /* --max-value; 0: default */
	uint64_t max_memory;       /* --max-memory: refuse puts past this; 0: no bound */
	size_t max_batch;          /* --max-batch: ops (keys) per request; 0: 65536 */
	size_t max_message;        /* --max-message: request size bound; 0: KV_RPC_MAX_MSG */
	unsigned max_connections;  /* --max-connections; 0: 4096 */
	/* --copy-rate: MB/s (10^6 bytes) of the copies this node sends to
	 * replicas outside an ISR, all together (doc/replication.md
	 * "Catch-up"); 0: unlimited (the command line's default is
	 * KV_SERVER_COPY_RATE_MB_S). */
	uint32_t copy_rate_mb_s;
	const char *metrics;       /* --metrics HOST:PORT for /metrics, or NULL: off */
	unsigned contexts;         /* concurrent requests served; 0: 256 */
	uint32_t watch_timeout_ms; /* long-poll bound sent to the controller; 0: 1000 */
	uint32_t leave_timeout_ms; /* graceful leave bound on SIGTERM; 0: 60000 */
	/* --auth-token-file: the cluster's shared secret, required of every
	 * request and sent with every call (common/auth.h); NULL: none. */
	const char *auth_token_file;
	/* --tls-cert, --tls-key, --tls-ca (common/tls.h): all three with
	 * tls+tcp:// --listen and --controller addresses, none with others. The
	 * server's certificate is also its client certificate towards the
	 * controller and other servers. NULL: not given. */
	kv_tls_files tls;
	/* The lease (common/config.h KV_LEASE_*), for tests only (no flag): 0
	 * takes the default. lease_ms must not exceed the controller's. */
	unsigned lease_ms;       /* how long a renewal lasts from its send time */
	unsigned lease_renew_ms; /* how often the lease is renewed */
	/* For tests only (no flag): never ask the controller to add a copied
	 * replica to an ISR (doc/replication.md "ISR changes"), so that a test
	 * of the controller can keep one outside. */
	bool no_expand;
	/* For tests only (no flag): as a migration's destination, behave as a
	 * server that reads no packed chunk entries (older than
	 * TransferChunk.packed_entries): never say so in an ack, and refuse a
	 * chunk that comes packed all the same. */
	bool chunks_unpacked;
	/* For tests only (no flag): results the exactly-once memory keeps per
	 * client (dedup.h); 0: KV_DEDUP_PER_CLIENT. */
	size_t dedup_per_client;
	/* For tests only (no flag): the expiry clock, Unix ms (store.h
	 * kv_store_opts.clock); NULL: CLOCK_REALTIME. */
	uint64_t (*clock)(void *arg);
	void *clock_arg;
} kv_server_cfg;

/* Controller addresses --controller takes at most. */
#define KV_SERVER_MAX_CTL 16

/* The parsed command line of shardkv-server. */
typedef struct {
	kv_server_cfg cfg;                  /* strings point into argv; ctl into ctl below */
	const char *ctl[KV_SERVER_MAX_CTL]; /* the --controller addresses */
	enum kv_log_level level;            /* --log-level (default info) */
	bool help;                          /* --help: print kv_server_usage, exit 0 */
} kv_server_args;

/* --copy-rate when not given (MB/s; bench/README.md "Paced replica
 * copies"). */
#define KV_SERVER_COPY_RATE_MB_S 20u

/* The --help text. */
extern const char kv_server_usage[];

/*
 * Parses the command line (argv[0] is the program) into *out without
 * opening or reading anything. Checks what flags alone can tell: values and
 * their bounds, required flags, the --tls-* combination and the schemes of
 * --listen and --controller. On KV_EINVAL err holds a one-line reason (main
 * prints it and exits 2) and *out is partly filled. Cuts the --controller
 * value in place and may reorder argv (getopt); can be called again.
 */
int kv_server_parse_args(int argc, char **argv, kv_server_args *out, char *err, size_t errlen);

/* A shard server (opaque). */
typedef struct kv_server kv_server;

/*
 * Creates a server from cfg: checks the options, loads the auth token and
 * the TLS files, opens (creating if needed) the data dir, reads the node
 * file and recovers the store from the snapshot and the log. Listens on
 * nothing yet. On 0 *out is the server (free it with kv_server_destroy);
 * otherwise returns KV_EINVAL (a bad option, --auth-token-file or TLS file),
 * KV_EPERM/KV_EIO/KV_ECORRUPT (the data dir) or KV_ENOMEM, the reason has
 * been logged, and err holds a one-line summary.
 */
int kv_server_create(const kv_server_cfg *cfg, kv_server **out, char *err, size_t errlen);

/*
 * Starts the --metrics listener and the --listen endpoint, then the watch
 * thread (registers and follows the configurations) and the heartbeat
 * thread. Returns 0, KV_EADDRINUSE (--listen or --metrics taken; logged),
 * KV_EINVAL (called twice or after stop) or KV_ENOMEM. On failure the server
 * serves nothing; destroy it.
 */
int kv_server_start(kv_server *s);

/* The outcome of kv_server_leave. */
typedef enum {
	KV_LEAVE_DRAINED = 0,  /* the controller marks the node gone, migrations reported */
	KV_LEAVE_UNREGISTERED, /* never registered: nothing to leave */
	KV_LEAVE_REFUSED,      /* the controller did not accept the leave (logged) */
	KV_LEAVE_TIMED_OUT,    /* the drain did not finish in time (logged) */
	KV_LEAVE_CUT_ASKING,   /* the wait callback cut it short before it was accepted */
	KV_LEAVE_CUT_DRAINING, /* ... after it was accepted, while draining */
	KV_LEAVE_NOT_RUNNING,  /* not started, or stopped already */
} kv_server_leave_result;

/* Waits up to ms; returns true to cut a leave short (main.c: a second
 * signal arrived). */
typedef bool (*kv_server_wait_cb)(void *arg, unsigned ms);

/*
 * The graceful leave (SIGTERM): asks the controller to move every range
 * away (asking again while it answers BUSY), keeps serving while they move,
 * and returns once the controller marks the node gone and every outgoing
 * migration is reported, or after timeout_ms (0: 60000). Between attempts
 * and polls it waits through wait(arg, ms) (NULL: sleeps), which may cut the
 * leave short. Blocks the caller; does not stop the server. Call it between
 * kv_server_start and kv_server_stop, never concurrently with the latter.
 */
kv_server_leave_result kv_server_leave(kv_server *s, uint32_t timeout_ms, kv_server_wait_cb wait,
                                       void *arg);

/*
 * Stops: refuses new requests, waits (at most 10 s) until every request
 * taken has been answered, stops the metrics listener, closes the
 * endpoint, joins the watch, heartbeat and migration threads, closes the
 * controller clients and the log. The ranges stay the node's (a restart on
 * the same data dir resumes them). Returns 0, or KV_EIO when replies still
 * wait for a failing disk: the server is then left as it is (destroy frees
 * nothing). Idempotent; not concurrent with another call on s.
 */
int kv_server_stop(kv_server *s);

/*
 * Whether the controller has said this node is gone (removed, or left by
 * `shardkv leave` rather than kv_server_leave): the server then answers no
 * data request and stops registering; the caller should stop it and exit
 * non-zero (main.c exits 4). Copies the reason into why. Thread-safe.
 */
bool kv_server_gone(kv_server *s, char *why, size_t whylen);

/* Stops the server if needed and frees it. Accepts NULL. */
void kv_server_destroy(kv_server *s);

/* Test hook: copies the value of key in the server's store into *val
 * (whatever the node serves: a backup's copy too). Returns 0, KV_ENOTFOUND
 * or KV_ENOMEM. */
int kv_server_get_for_test(kv_server *s, const void *key, size_t klen, kv_buf *val);

#endif
