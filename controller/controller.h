/*
 * controller.h - the shardkv controller: keeps the configuration history,
 * answers admin commands, server reports and watches (doc/contract.md §4, §5;
 * doc/protocol.md).
 *
 * Standalone (one replica, no --id/--peers): every configuration is made
 * durable in the config log (clog.h) before anyone can see it. Replicated
 * (--id/--peers): every configuration is committed through Raft
 * (replica.h) by a majority of the replicas before anyone can see it; the
 * leader plans and proposes, every replica applies and serves watches.
 */
#ifndef KV_CONTROLLER_CONTROLLER_H
#define KV_CONTROLLER_CONTROLLER_H

#include "common/log.h"
#include "common/tls.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Immutable start-up configuration (from the command line). */
typedef struct {
	const char *listen;    /* nng URL to serve AdminRequest on */
	const char *data_dir;  /* where the config log lives (created if missing) */
	const char *metrics;   /* HOST:PORT for Prometheus text at /metrics; NULL: off */
	unsigned contexts;     /* concurrent requests; 0: 1024 */
	uint32_t watch_max_ms; /* longest a watch is held; 0: 60000 */
	uint32_t wait_max_ms;  /* default bound on --wait; 0: 600000 */
	unsigned max_watches;  /* watches held at once; 0: contexts * 3 / 4 */
	/* --auth-token-file: the shared secret every request must carry
	 * (common/auth.h); NULL: none. */
	const char *auth_token_file;
	/* --tls-cert, --tls-key, --tls-ca (common/tls.h): all three with a
	 * tls+tcp:// --listen, none with another; NULL: not given. */
	kv_tls_files tls;
	/* Replication (all zero/NULL: standalone). */
	uint32_t id;                   /* --id: this replica, 1 .. npeers */
	size_t npeers;                 /* entries in peers */
	const char *const *peers;      /* --peers: every replica's controller URL */
	const char *const *raft_peers; /* HOST:PORT raft uses per replica; NULL:
	                                  the controller URL's host, port + 1000 */
	unsigned snapshot_threshold;   /* raft entries between snapshots; 0: 256 */
	unsigned election_ms;          /* raft election timeout; 0: 1000 */
	/* --down-after: seconds a node may stay down before its replicas get
	 * replacements on other nodes (with replicated ranges); 0: 60
	 * (doc/contract.md §4, doc/replication.md "Repair"). */
	unsigned down_after_s;
	/* --replicas R: the replicas each range should have (1 to
	 * KV_MAX_REPLICAS; 0: 1, while the command line's default is 3, args.c) and --min-insync M,
	 * the minimum ISR size published in every configuration (1 to R; 0: min(2, R)).
	 * kv_controller_create refuses values out of range
	 * (doc/replication.md). */
	unsigned replicas;
	unsigned min_insync;
	/* Liveness (common/config.h KV_LEASE_*), for tests only (no flag):
	 * 0 takes the default. A node is declared down after lease_ms +
	 * lease_margin_ms (+ the election timeout when replicated) without a
	 * heartbeat; servers must use the same lease_ms. */
	unsigned lease_ms;
	unsigned lease_margin_ms;
	/* The automatic balancer (doc/scheduler.md): on (the command line's
	 * default) or off (the library's: 0), --split-bytes (0: 64 MiB),
	 * --split-ops (0: 20000) and --max-migrations (0: 2). */
	bool auto_balance;
	bool handover_unordered;     /* tests only: publish a primary transfer to its new
	                                primary as to everyone else, without waiting for
	                                the old primary to apply it first (doc/replication.md
	                                "Primary transfer") */
	bool balance_cut_replicated; /* tests only: cut replicated ranges for
	                                transfers (doc/scheduler.md "Limits") */
	uint64_t split_bytes;
	unsigned split_ops;
	unsigned max_migrations;
} kv_controller_cfg;

/* Derives the raft address of a controller URL tcp://HOST:PORT (or
 * tls+tcp://HOST:PORT): HOST:PORT+1000 into out. Returns 0 or KV_EINVAL (not
 * tcp:// or tls+tcp://, no port, port too big). */
int kv_controller_raft_addr(const char *url, char *out, size_t outlen);

typedef struct kv_controller kv_controller;

/* Most replicas --peers may list. */
#define KV_CONTROLLER_MAX_PEERS 9

/* The parsed command line of shardkv-controller. */
typedef struct {
	kv_controller_cfg cfg;   /* strings point into argv, the lists below */
	enum kv_log_level level; /* --log-level (default info) */
	bool help;               /* --help: print kv_controller_usage, exit 0 */
	/* What cfg.peers and cfg.raft_peers point to: copies of --peers and
	 * --raft-peers split at the commas (argv is left intact). */
	const char *peers[KV_CONTROLLER_MAX_PEERS];
	const char *raft_peers[KV_CONTROLLER_MAX_PEERS];
	char peers_buf[4096];
	char raft_buf[4096];
} kv_controller_args;

/* The --help text. */
extern const char kv_controller_usage[];

/*
 * Parses the command line (argv[0] is the program) into *out without
 * opening or reading anything. Checks what flags alone can tell: required
 * flags, --log-level, the --tls-* combination, the --listen and --peers
 * schemes and the replication flags (--id with --peers, as many --raft-peers
 * as --peers, the numbers' ranges, --min-insync no larger than --replicas). On
 * KV_EINVAL err holds a one-line reason (main prints it and exits 2) and
 * *out is untouched. May reorder argv (getopt) and can be called again.
 */
int kv_controller_parse_args(int argc, char **argv, kv_controller_args *out, char *err,
                             size_t errlen);

/*
 * Life cycle: kv_controller_create, kv_controller_start, kv_controller_stop,
 * kv_controller_destroy, each called once, in that order, from one thread
 * (stop and destroy may be skipped to destroy; destroy also stops). Nothing
 * here touches signals or other process-wide state: one process may run
 * several controllers (a Raft group in a test), each on its own --listen,
 * --data-dir and raft addresses.
 */

/*
 * Checks the configuration, loads the auth token and TLS files and opens
 * the data dir: standalone, locks and replays the config log; replicated,
 * creates DATA_DIR and checks the peers. Starts no thread and opens no
 * socket. Copies what it keeps of cfg. On error writes a one-line reason
 * into err, leaves *out untouched and returns KV_EINVAL (bad URL, unusable
 * --auth-token-file or TLS files, peers), KV_ECORRUPT (damaged log),
 * KV_EBUSY (data dir in use) or another KV_E* code. On 0 the caller frees
 * *out with kv_controller_destroy().
 */
int kv_controller_create(const kv_controller_cfg *cfg, kv_controller **out, char *err,
                         size_t errlen);

/*
 * Starts serving: the Raft replica and its proposer (replicated), the
 * thread that answers held requests, the listener and --metrics. On error
 * writes a one-line reason into err and returns KV_EADDRINUSE (listen or
 * raft address taken), KV_EINVAL (called twice, or after stop) or another KV_E* code;
 * what was started is stopped again and the caller still destroys c.
 */
int kv_controller_start(kv_controller *c, char *err, size_t errlen);

/* Returns the latest published epoch (0 before the first join). Thread-safe. */
uint64_t kv_controller_epoch(kv_controller *c);

/*
 * Answers every held request (watches with the current config, waits with
 * STATUS_CLOSED), stops the Raft replica and the threads and closes the
 * listener; it waits for nothing but requests already being handled, which
 * answer at once. kv_controller_epoch stays usable. Idempotent; before
 * start it only makes start refuse. Accepts NULL. Not from a request
 * handler.
 */
void kv_controller_stop(kv_controller *c);

/* Stops (if not yet) and frees everything. Accepts NULL. */
void kv_controller_destroy(kv_controller *c);

#endif
