/*
 * cluster_util.h - a real shardkv cluster for end-to-end tests: one
 * shardkv-controller and up to KV_TC_MAX_SERVERS shardkv-server processes on
 * free loopback ports, each with its own data directory under one temporary
 * directory, plus helpers to wait for configurations, to write and check
 * numbered keys, and to run the `shardkv` binary.
 *
 * Every process is started from the calling (main) thread through
 * common/proc.h: with PR_SET_PDEATHSIG, so it dies with the test process
 * even on SIGKILL (a ctest timeout), and recorded in its process table, which
 * its atexit and fatal-signal handlers empty; kv_tc_destroy() stops the
 * cluster's processes on the normal path. Readiness is always a poll with a
 * deadline, never a fixed sleep.
 *
 * The binaries come from compile definitions: KV_CONTROLLER_BIN,
 * KV_SERVER_BIN and KV_CLI_BIN (absolute paths). Not thread-safe: one thread
 * (the test's main thread) starts and stops processes; clients made by
 * kv_tc_client() may be used from any thread.
 */
#ifndef KV_TESTS_SUPPORT_CLUSTER_UTIL_H
#define KV_TESTS_SUPPORT_CLUSTER_UTIL_H

#include "client/include/shardkv.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define KV_TC_MAX_SERVERS 8
#define KV_TC_MAX_CTLS    5   /* controller replicas (kv_tc_create_replicated) */
#define KV_TC_MAX_ARGS    8   /* extra flags per server (kv_tc_set_server_args) */
#define KV_TC_ARG_LEN     128 /* bytes per extra flag, with the NUL */

/* Deadlines of the helpers, generous for a loaded 2-core machine. */
#define KV_TC_READY_MS 20000u /* a process answers / a configuration settles */
#define KV_TC_STOP_MS  5000u  /* a process exits after a signal */

/* One shardkv-server of a test cluster. */
typedef struct {
	char url[64];   /* its --listen URL */
	char data[320]; /* its --data-dir */
	char log[320];  /* its stderr (appended across restarts) */
	pid_t pid;      /* the running process; 0: not running */
	uint32_t id;    /* its node id once registered; 0 before */
	int nargs;      /* extra flags given to every start (kv_tc_set_server_args) */
	char args[KV_TC_MAX_ARGS][KV_TC_ARG_LEN];
} kv_tc_server;

/* A test cluster. Zero-initialise, then kv_tc_start() or kv_tc_create(). */
typedef struct {
	char dir[256];                       /* temporary directory, removed by kv_tc_destroy */
	char ctl_url[400];                   /* the controller's URL; replicated: all of
	                                        them, comma-separated (what servers and
	                                        clients are given) */
	char ctl_data[320];                  /* its --data-dir */
	char ctl_log[320];                   /* its stderr (appended across restarts) */
	pid_t ctl_pid;                       /* the running controller; 0: none */
	int nservers;                        /* servers added (running or not) */
	kv_tc_server srv[KV_TC_MAX_SERVERS]; /* by index, in order of kv_tc_add_server */
	shardkv_client *admin;               /* the helpers' own client (no watch) */
	/* Replicated control plane (kv_tc_create_replicated); nctl 0: one
	 * standalone controller (the ctl_* fields above). */
	int nctl;                        /* replicas */
	char rurl[KV_TC_MAX_CTLS][64];   /* replica k's URL (--id k + 1) */
	char rraft[KV_TC_MAX_CTLS][32];  /* its raft HOST:PORT */
	char rdata[KV_TC_MAX_CTLS][320]; /* its --data-dir */
	char rlog[KV_TC_MAX_CTLS][320];  /* its stderr */
	pid_t rpid[KV_TC_MAX_CTLS];      /* running process; 0: none */
	int nargs;                       /* extra flags of servers added later */
	char args[KV_TC_MAX_ARGS][KV_TC_ARG_LEN];
	int nctl_args; /* extra flags of the standalone controller (every start) */
	char ctl_args[KV_TC_MAX_ARGS][KV_TC_ARG_LEN];
} kv_tc;

/*
 * Makes the temporary directory and starts the controller, then waits until
 * it answers. `tag` names the directory. Returns 0 or -1 (the reason on
 * stderr; everything started is stopped again).
 */
int kv_tc_create(kv_tc *c, const char *tag);

/*
 * kv_tc_create(), then `nservers` servers started with --join one after the
 * other, each waited for until it is active, owns a range and no migration
 * is in flight. Returns 0 or -1 (logs printed, everything stopped).
 */
int kv_tc_start(kv_tc *c, const char *tag, int nservers);

/*
 * Gives the standalone controller of every cluster created afterwards in
 * this process (at each of its starts) the extra flags `args`
 * (NULL-terminated, may be NULL: none; at most KV_TC_MAX_ARGS), e.g.
 * KV_TC_ONE_COPY for a test of single-copy behaviour (the controller's
 * default is three replicas, doc/contract.md §2). KV_TC_ONE_COPY also turns
 * the automatic balancer off: these tests need the layout the joins and
 * their own moves make (with the balancer on, a join into a cluster with
 * next to no data moves nothing, doc/scheduler.md "A new cluster").
 * Returns 0 or -1.
 */
int kv_tc_set_controller_args(const char *const *args);
#define KV_TC_ONE_COPY ((const char *const[]){"--replicas", "1", "--auto-balance", "off", NULL})

/* Waits until no range moves, every range's in-sync set is its whole
 * replica set and no range has a transfer fence (with replicas, joins and
 * changes of primary copy replicas and add them to the ISR, or end the
 * fence, in configurations of their own). Returns 0 or -1. */
int kv_tc_wait_in_sync(kv_tc *c, unsigned ms);

/* shardkv_move(admin, start, sl, end, el, node, 0, flags, res), sent again
 * for up to KV_TC_READY_MS while it answers SHARDKV_EBUSY (with replicas: a
 * replica outside the ISR is refused the primary role until it is in sync,
 * e.g. an old primary copied again after the last move). */
int kv_tc_move(shardkv_client *admin, const char *start, size_t sl, const char *end, size_t el,
               const char *node, unsigned flags, shardkv_admin_result *res);

/* kv_tc_start() with a controller that keeps one copy per range
 * (KV_TC_ONE_COPY for this cluster only). Returns 0 or -1. */
int kv_tc_start_one_copy(kv_tc *c, const char *tag, int nservers);

/*
 * kv_tc_create() and kv_tc_start() with extra shardkv-server flags: every
 * server added gets `server_args` (NULL-terminated, may be NULL; at most
 * KV_TC_MAX_ARGS of fewer than KV_TC_ARG_LEN bytes each) after its usual
 * ones, e.g. {"--fsync", "always", NULL}. Returns 0 or -1.
 */
int kv_tc_create_ex(kv_tc *c, const char *tag, const char *const *server_args);
int kv_tc_start_ex(kv_tc *c, const char *tag, int nservers, const char *const *server_args);

/* Replaces the extra flags of server i for its next starts (restarts and
 * kv_tc_server_argv); NULL: none. Returns 0 or -1 (too many or too long). */
int kv_tc_set_server_args(kv_tc *c, int i, const char *const *args);

/*
 * Fills argv (max entries with the NULL) with the command line that starts
 * server i (binary path first), for running it with kv_tc_run(). The strings
 * point into c. Returns the number of arguments or -1 when max is too small.
 */
int kv_tc_server_argv(kv_tc *c, int i, bool join, char **argv, size_t max);

/*
 * Waits until server i (just started or restarted) serves: it answers a
 * read of a key of one of its ranges (in the latest configuration) with OK,
 * NOT_FOUND or MOVING, or answers at all when it owns no range. Fails at
 * once, with its log, when the process exits. Returns 0 or -1.
 */
int kv_tc_wait_serving(kv_tc *c, int i, unsigned ms);

/* Counts the lines of `path` (a log) that contain `needle`; -1 when the file
 * cannot be read. */
long kv_tc_count_lines(const char *path, const char *needle);

/* Waits up to ms until `path` (a log) has a line containing `needle`;
 * returns whether it came. */
bool kv_tc_wait_log_line(const char *path, const char *needle, unsigned ms);

/* Stops every process of the cluster, servers first with SIGKILL (their data
 * is scratch, and no drain must start), then the controller with SIGTERM
 * (SIGKILL after KV_TC_STOP_MS), and removes the directory unless the
 * environment has KV_TC_KEEP. Accepts a cluster that never started. */
void kv_tc_destroy(kv_tc *c);

/*
 * Adds a server on a free port and starts it (with --join when `join`).
 * Returns its index, or -1. Does not wait for it; see kv_tc_wait_member().
 */
int kv_tc_add_server(kv_tc *c, bool join);

/* Starts server i again with its data dir and URL (with --join when `join`).
 * Returns 0 or -1. */
int kv_tc_restart_server(kv_tc *c, int i, bool join);

/*
 * Waits until the latest configuration names server i with state `state`
 * (a shardkv_node_state) and records its node id. Returns 0 or -1 on the
 * deadline.
 */
int kv_tc_wait_node_state(kv_tc *c, int i, int state, unsigned ms);

/* Waits until the latest configuration has no migration in flight. Returns
 * 0 or -1. */
int kv_tc_wait_settled(kv_tc *c, unsigned ms);

/*
 * Sends `sig` to server i and waits up to `ms` for it to exit. On 0 *status
 * (may be NULL) holds the waitpid status. On the deadline the process is
 * killed with SIGKILL and -1 is returned.
 */
int kv_tc_stop_server(kv_tc *c, int i, int sig, unsigned ms, int *status);

/* kv_tc_stop_server() for the controller. */
int kv_tc_stop_controller(kv_tc *c, int sig, unsigned ms, int *status);

/* Starts the controller again with the same URL and data dir and waits
 * until it answers. Returns 0 or -1. */
int kv_tc_start_controller(kv_tc *c);

/*
 * Like kv_tc_create(), with a replicated control plane of `nctl` (1 ..
 * KV_TC_MAX_CTLS) controllers on free ports (--id/--peers/--raft-peers,
 * plus `ctl_args`, NULL-terminated, may be NULL), and waits until one of
 * them leads. Servers and clients get the comma-separated list. Returns 0
 * or -1.
 */
int kv_tc_create_replicated(kv_tc *c, const char *tag, int nctl, const char *const *ctl_args);

/* kv_tc_create_replicated(), then `nservers` servers as kv_tc_start(). */
int kv_tc_start_replicated(kv_tc *c, const char *tag, int nctl, const char *const *ctl_args,
                           int nservers);

/* Sends `sig` to replica k and waits up to `ms` for it to exit (SIGKILL on
 * the deadline, then -1). */
int kv_tc_stop_replica(kv_tc *c, int k, int sig, unsigned ms);

/* Starts replica k again with its data dir. Does not wait. Returns 0 or -1. */
int kv_tc_start_replica(kv_tc *c, int k);

/* Waits until some replica reports itself leader in a status; returns its
 * index k (0-based), or -1 on the deadline. */
int kv_tc_wait_leader(kv_tc *c, unsigned ms);

/* Asks replica k alone for its latest configuration; returns its epoch or
 * -1 when it does not answer. */
long long kv_tc_replica_epoch(kv_tc *c, int k);

/* Prints the last `lines` lines of every log of the cluster to stderr. */
void kv_tc_dump_logs(const kv_tc *c, int lines);

/* Opens a client on the cluster (watch unless no_watch). Returns NULL on
 * failure. The caller closes it with shardkv_close(). */
shardkv_client *kv_tc_client(const kv_tc *c, bool no_watch, uint32_t timeout_ms);

/* Returns the latest configuration (the caller frees it with
 * shardkv_config_free()), or NULL. */
shardkv_config *kv_tc_config(kv_tc *c);

/* Returns the owner of key in cfg's range map (ignoring migrations), or 0. */
uint32_t kv_tc_owner(const shardkv_config *cfg, const void *key, size_t klen);

/* Returns the node `id` of cfg, or NULL. */
const shardkv_node *kv_tc_node(const shardkv_config *cfg, uint32_t id);

/* Returns how many ranges of cfg node `id` owns (is the primary of). */
size_t kv_tc_nranges_of(const shardkv_config *cfg, uint32_t id);

/* Returns how many ranges of cfg have node `id` in their in-sync set (the
 * primary's included). */
size_t kv_tc_ninsync_of(const shardkv_config *cfg, uint32_t id);

/* Writes "node id" of server i into buf (for the admin calls). */
void kv_tc_node_arg(const kv_tc *c, int i, char *buf, size_t len);

/* ---------------------------------------------------------------------------
 * Numbered keys: key i of `prefix` is prefix + "%06u", its value of
 * generation g is "g<g>-<i>-" followed by filler up to `vlen` bytes.
 * ------------------------------------------------------------------------- */

/* Writes the key and returns its length. */
size_t kv_tc_key(char *buf, size_t len, const char *prefix, unsigned i);

/* Writes the value and returns its length (at most len - 1). */
size_t kv_tc_value(char *buf, size_t len, unsigned gen, unsigned i, size_t vlen);

/*
 * Writes keys [0, n) of prefix with generation gen (values of vlen bytes,
 * at least the header) with mput in batches. Returns 0 or the first error
 * (the detail in msg).
 */
int kv_tc_fill(shardkv_client *cl, const char *prefix, unsigned n, unsigned gen, size_t vlen,
               char *msg, size_t msglen);

/*
 * Reads keys [0, n) of prefix with mget in batches and compares them with
 * generation gen. Returns the number of wrong or missing keys (0: all
 * good), or a negative SHARDKV_E* when a call failed; msg names the first
 * problem.
 */
long kv_tc_verify(shardkv_client *cl, const char *prefix, unsigned n, unsigned gen, size_t vlen,
                  char *msg, size_t msglen);

/* Counts how many keys [0, n) of prefix each node owns under cfg;
 * counts[id] for id < ncounts. */
void kv_tc_count_owners(const shardkv_config *cfg, const char *prefix, unsigned n, unsigned *counts,
                        size_t ncounts);

/*
 * Gives the keys [0, n) of prefix to servers idx[0..k) in k even slices
 * with moves (--wait): slice j is [key(j*n/k), key((j+1)*n/k)), the last
 * one ending where the prefix ends. Returns 0 or the first error.
 */
int kv_tc_spread(kv_tc *c, const char *prefix, unsigned n, const int *idx, int k);

/*
 * Waits until the status reports, summed over the nodes that are not gone,
 * exactly `keys` keys (the heartbeats caught up). Returns 0 or -1.
 */
int kv_tc_wait_status_keys(kv_tc *c, uint64_t keys, unsigned ms);

/*
 * Waits until the status reports for every node id < ncounts exactly
 * counts[id] keys (ids with no node must have count 0; gone nodes are not
 * checked). Returns 0 or -1.
 */
int kv_tc_wait_status_counts(kv_tc *c, const unsigned *counts, size_t ncounts, unsigned ms);

/* ---------------------------------------------------------------------------
 * Raw requests: one op sent straight to one server, with the client id and
 * request id the caller chooses, bypassing libshardkv's routing and retries
 * (for exactly-once tests, which must replay a write byte for byte).
 * ------------------------------------------------------------------------- */

/* The ops kv_tc_raw_op() can send. */
typedef enum {
	KV_TC_RAW_GET = 1, /* read key */
	KV_TC_RAW_PUT,     /* key = val */
	KV_TC_RAW_APPEND,  /* key += val */
	KV_TC_RAW_DEL,     /* delete key, returning its value */
} kv_tc_raw_kind;

/* What one server answered to kv_tc_raw_op(). Free with kv_tc_raw_free(). */
typedef struct {
	int status;         /* SHARDKV_E* of the op, or of the whole request when refused */
	uint64_t value_len; /* append: the length after the append */
	uint32_t hint_node; /* WRONG_OWNER, MOVING: the node the server named; 0: none */
	uint32_t node_id;   /* the answering server's node id */
	shardkv_buf value;  /* get, del: the value (data NULL when none) */
	bool value_unknown; /* del retried: applied, the value was not kept */
} kv_tc_raw_result;

/*
 * Sends one op to the server at `url` in a Request with `client_id` and the
 * op's `request_id` (0 for either: no exactly-once) and waits up to `ms`.
 * Returns 0 when the server answered (out->status says how), or a negative
 * SHARDKV_E* when it could not be reached or its answer was malformed.
 */
int kv_tc_raw_op(const char *url, uint64_t client_id, uint64_t request_id, kv_tc_raw_kind kind,
                 const void *key, size_t klen, const void *val, size_t vlen, unsigned ms,
                 kv_tc_raw_result *out);

/* Frees what kv_tc_raw_op() returned. Accepts a zeroed result. */
void kv_tc_raw_free(kv_tc_raw_result *r);

/* What a controller answered to kv_tc_raw_join(). */
typedef struct {
	int status;       /* SHARDKV_E* (NOT_LEADER reads as SHARDKV_EUNAVAIL) */
	bool not_leader;  /* the answer was STATUS_NOT_LEADER */
	uint64_t epoch;   /* AdminResponse.epoch */
	uint32_t node_id; /* AdminResponse.node_id */
} kv_tc_raw_admin;

/*
 * Sends one AdminRequest{join address} to the controller replica at `url`
 * with the client id and request id the caller chooses (a retry of one
 * command is the same ids), and waits up to `ms`. Returns 0 when it
 * answered (*out says how), or a negative SHARDKV_E*.
 */
int kv_tc_raw_join(const char *url, uint64_t client_id, uint64_t request_id, const char *address,
                   unsigned ms, kv_tc_raw_admin *out);

/*
 * Asks the controller replica at `url` for its latest configuration and
 * writes its epoch and its pins (the key spans an administrator's move
 * pinned against the balancer, doc/scheduler.md "Pins", which the client
 * library does not show) into *epoch, *npins and, for the first one,
 * start[0..*start_len) and end[0..*end_len) (each at most 64 bytes kept).
 * Returns 0, or a negative SHARDKV_E* (unreachable, or not answering 0).
 */
int kv_tc_raw_pins(const char *url, unsigned ms, uint64_t *epoch, size_t *npins, char *start,
                   size_t *start_len, char *end, size_t *end_len);

/*
 * Waits until the status lists migration `id` in phase `phase` ("copying",
 * ...) with at least `min_keys` keys copied. On 0 *out (may be NULL) gets
 * that entry's figures (its start and end are left empty). Returns 0, or -1
 * on the deadline or when the migration is no longer listed (it ended).
 */
int kv_tc_wait_migration(kv_tc *c, uint64_t id, const char *phase, uint64_t min_keys, unsigned ms,
                         shardkv_migration *out);

/* ---------------------------------------------------------------------------
 * Processes
 * ------------------------------------------------------------------------- */

/* What kv_tc_run() captured. Free with kv_tc_run_free(). */
typedef struct {
	int code;  /* exit code; 128 + signal when killed; -1 when it could not run */
	char *out; /* stdout, NUL-terminated (may contain NULs) */
	size_t nout;
	char *err; /* stderr, NUL-terminated */
	size_t nerr;
} kv_tc_run_result;

/*
 * Runs the program `argv[0]` (a path) with argv, feeding `in` (inlen bytes,
 * may be NULL) to its stdin, and captures its output; kills it after `ms`.
 * Extra environment entries "NAME=VALUE" may be given in env (NULL-ended,
 * may be NULL). Returns 0 when it ran (r->code says how it ended) or -1.
 */
int kv_tc_run(char *const argv[], char *const env[], const void *in, size_t inlen, unsigned ms,
              kv_tc_run_result *r);

/* Frees what kv_tc_run() captured. */
void kv_tc_run_free(kv_tc_run_result *r);

/*
 * Runs the `shardkv` binary (KV_CLI_BIN) as `shardkv -c URL ARGS...` (no -c
 * when url is NULL) with kv_tc_run(.., env, in, inlen, ms, r); the
 * arguments end with NULL (at most KV_TC_CLI_MAX_ARGS, or -1). kv_tc_cliv
 * takes them as a va_list, for a test's own variadic wrapper.
 */
#define KV_TC_CLI_MAX_ARGS 60
int kv_tc_cli(kv_tc_run_result *r, const char *url, char *const env[], const void *in, size_t inlen,
              unsigned ms, const char *arg, ...);
int kv_tc_cliv(kv_tc_run_result *r, const char *url, char *const env[], const void *in,
               size_t inlen, unsigned ms, const char *arg, va_list ap);

/* Milliseconds since the first call of any kv_tc_* helper (for messages). */
uint64_t kv_tc_elapsed_ms(void);

/* ---------------------------------------------------------------------------
 * Authentication (test_cluster_auth.c)
 * ------------------------------------------------------------------------- */

/*
 * Gives every cluster created afterwards in this process a shared secret:
 * its controller is started with --auth-token-file `file` (which the caller
 * wrote, holding `token`), and the helpers' own client, kv_tc_client() and
 * kv_tc_raw_op() send `token`. Servers get the flag only through their extra
 * flags (kv_tc_start_ex, kv_tc_set_server_args), so that a test can start
 * one without it. NULL for both: no secret (the default). The strings are
 * copied. Returns 0 or -1 (too long).
 */
int kv_tc_set_auth(const char *file, const char *token);

/* ---------------------------------------------------------------------------
 * TLS (test_cluster_tls.c)
 * ------------------------------------------------------------------------- */

/*
 * Puts every cluster created afterwards in this process on TLS: the
 * controller and every server listen on tls+tcp:// URLs and are started with
 * --tls-cert `cert` --tls-key `key` --tls-ca `ca`; the helpers' own client,
 * kv_tc_client() and kv_tc_raw_op() use `ca` and the client certificate
 * `client_cert`/`client_key` (NULL: none). `ca` NULL: no TLS (the default).
 * The strings are copied. Returns 0 or -1 (too long).
 */
int kv_tc_set_tls(const char *cert, const char *key, const char *ca, const char *client_cert,
                  const char *client_key);

/*
 * For test files (after <cmocka.h>): fails the test, with the tail of the
 * cluster's logs, when the libshardkv call `expr` does not return `want`.
 */
#define KV_TC_EXPECT(c, want, expr)                                                                \
	do {                                                                                       \
		int rv_ = (expr);                                                                  \
		if (rv_ != (want)) {                                                               \
			char m_[512];                                                              \
			snprintf(m_, sizeof(m_), "%s", shardkv_errmsg());                          \
			kv_tc_dump_logs((c), 40);                                                  \
			fail_msg("%s:%d: %s returned %s (%s), want %s", __FILE__, __LINE__, #expr, \
			         shardkv_strerror(rv_), m_, shardkv_strerror(want));               \
		}                                                                                  \
	} while (0)

/* For test files: fails the test with the cluster's logs unless `cond`. */
#define KV_TC_ASSERT(c, cond, ...)                                                                 \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			kv_tc_dump_logs((c), 40);                                                  \
			fail_msg(__VA_ARGS__);                                                     \
		}                                                                                  \
	} while (0)

#endif
