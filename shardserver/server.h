/*
 * server.h - the shard server daemon (shardkv-server): serves Request
 * batches from the local store for the ranges this node owns, follows the
 * controller's configurations, and moves ranges to other servers
 * (doc/protocol.md).
 *
 * main.c parses flags into a kv_server_cfg and calls kv_server_run; tests
 * start the real binary. Thread model and lock order: doc/threads.md and the
 * DESIGN paragraph of server.c.
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

/* The immutable start-up configuration (flags). Strings are borrowed and
 * must outlive kv_server_run. */
typedef struct {
	const char *listen;       /* --listen nng URL */
	const char *const *ctl;   /* --controller addresses */
	size_t nctl;              /* number of controller addresses, >= 1 */
	const char *data_dir;     /* --data-dir */
	bool join;                /* --join: register as a new node on first start */
	unsigned threads;         /* --threads: percore owner threads; 0: default */
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

/*
 * Runs the server until SIGTERM or SIGINT (a second one exits at once
 * during a graceful leave). Blocks both signals in the calling thread and
 * every thread it starts. Returns 0 after a clean stop, or a KV_E* code
 * when it cannot start (KV_EADDRINUSE, KV_EPERM/KV_EIO for the data dir,
 * KV_EINVAL for a bad option or an unusable --auth-token-file or TLS file); the reason
 * has been logged.
 */
int kv_server_run(const kv_server_cfg *cfg);

#endif
