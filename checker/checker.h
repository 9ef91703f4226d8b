/*
 * checker.h - the parts of shardkv-checker: the options, the spawned
 * cluster (procs.c), the client workload that records the history
 * (workload.c) and the reconfiguration driver (driver.c). main.c wires them
 * together; history.h is the model that judges the history.
 *
 * Threads: the main thread parses options, starts and stops every process
 * (children die with the thread that forked them, PR_SET_PDEATHSIG) and runs
 * the reconfiguration driver; one thread per client runs operations on its
 * own shardkv_client handles (--handles) and records them. A client thread
 * is one process of the history for its blocking calls and one more per
 * async slot (--async): each process has its own buffer, written by the
 * client thread (blocking calls) or by the library thread that runs the
 * slot's callback (one op in flight per slot), so recording takes no lock.
 * The shared state is atomics: the stop flag, the operation budget, the
 * current generation of each append key, the "hot" keys the driver is
 * moving, and the multi-key gate (chk_workload_mk_block); and the longest
 * read of each append key, under one mutex that is a leaf (taken by client
 * threads and library callbacks, with no other lock of the checker held).
 */
#ifndef KV_CHECKER_CHECKER_H
#define KV_CHECKER_CHECKER_H

#include "checker/histfile.h"
#include "checker/history.h"
#include "shardkv.h"

#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

/* Bounds. */
#define CHK_MAX_CLIENTS    256        /* --clients */
#define CHK_MAX_KEYS       4096       /* --keys */
#define CHK_MAX_SERVERS    64         /* servers of one --spawn run at a time */
#define CHK_MAX_CTLS       5          /* --controllers */
#define CHK_MAX_GEN        256        /* generations of one append key */
#define CHK_ROLL_BYTES     (64 << 10) /* an append key past this size rolls to a new generation */
#define CHK_DEFAULT_OPS    2000000u   /* --max-ops: operations recorded at most (64 bytes each) */
#define CHK_MAX_ASYNC      64         /* --async: ops in flight per client thread */
#define CHK_MAX_HANDLES    16         /* --handles: handles per client thread */
#define CHK_MAX_GROUPS     256        /* --multi: groups of keys for mput/mget */
#define CHK_MAX_HOT        256        /* keys the driver marks as moving at once */
#define CHK_MAX_NEM        65536      /* nemesis events kept for the history file */
#define CHK_WHOLE_GRACE_MS 1000 /* a split group takes mputs again this long after it is whole */
#define CHK_CAS_COUNTERS   8    /* --cas: registers moved on by compare-and-set */
#define CHK_CAS_LOCKS      4    /* --cas: locks taken (if absent) and released (if equal) */

/* The options of one run; read-only once parsed. */
typedef struct {
	const char *controllers; /* -c: the cluster to test (not with --spawn) */
	unsigned clients;        /* --clients: concurrent client threads */
	unsigned keys;           /* --keys: half append keys, half registers */
	double duration_s;       /* --duration: seconds of load */
	unsigned reconfig_ms;    /* --reconfig-interval: mean pause between steps */
	uint64_t seed;           /* --seed */
	const char *spawn_dir;   /* --spawn DIR: start a cluster under DIR */
	unsigned servers;        /* --servers: servers of the spawned cluster */
	bool kill;               /* --kill: also SIGKILL and restart servers */
	unsigned kill_ms;        /* --kill-interval: SIGKILL a server this often (mean ms), in a
	                            log write when one is seen, restarted at once; 0: off */
	bool kill_handover;      /* --kill-at-handover: aim those kills at a migration's
	                            handover instead (a fence or a commit just logged) */
	const char *fsync;       /* --fsync for spawned servers, or NULL */
	const char *split_bytes; /* --split-bytes for spawned controllers, or NULL */
	unsigned nctl;           /* --controllers: spawned controller replicas (1: standalone) */
	bool kill_ctl;           /* --kill-controller: SIGKILL the controller leader during steps */
	bool kill_ctl_failover;  /* --kill-controller-in-failover: SIGKILL the controller leader
	                            during the failover of each --kill-no-restart or --wipe */
	bool no_reconfig;        /* --no-reconfig: load only */
	bool json;               /* --json: the summary as one JSON object on stdout */
	bool keep;               /* --keep: keep the spawned cluster's directory */
	bool verbose;            /* -v: log every reconfiguration step */
	unsigned op_timeout_ms;  /* --op-timeout: per-operation deadline */
	size_t max_ops;          /* --max-ops: operations recorded at most */
	unsigned fill;           /* --fill: filler keys written before the run */
	unsigned fill_size;      /* --fill-size: their value size */
	const char *tls_cert;    /* --tls-cert or $SHARDKV_TLS_CERT (-c only); NULL: none */
	const char *tls_key;     /* --tls-key or $SHARDKV_TLS_KEY */
	const char *tls_ca;      /* --tls-ca or $SHARDKV_TLS_CA; NULL: no TLS */
	const char *history;     /* --history FILE, or NULL: the default path */
	const char *check;       /* --check FILE: check that history and exit */
	unsigned async;          /* --async: async ops in flight per client thread (0: none) */
	unsigned handles;        /* --handles: handles per client thread (>= 1) */
	unsigned groups;         /* --multi: groups of 2-4 registers for mput/mget (0: none) */
	unsigned hot_pct;        /* --hot: % of ops on keys the driver is moving */
	unsigned move_rate;      /* --move-rate: MB/s of half the unwaited copies (0: unpaced) */
	unsigned del_pct;        /* --deletes: % of single-key ops that delete a register */
	unsigned scan_pct;       /* --scans: % of blocking ops that scan registers (0: none) */
	unsigned cas_pct;     /* --cas: % of ops (blocking, async) that compare-and-set a counter or
	                         take or release a lock (0: none) */
	unsigned scan_limit;  /* --scan-limit: entries a scan asks for at most */
	unsigned pause_ms;    /* --pause: SIGSTOP a server this long, then SIGCONT; 0: off */
	unsigned pause_iv_ms; /* --pause-interval: mean time between two pauses' starts */
	bool kill_no_restart; /* --kill-no-restart: SIGKILL a server for good, remove it
	                         once down, join a replacement (needs replicas >= 2) */
	bool wipe;            /* --wipe: SIGKILL a server, delete its data dir, start it
	                         again as a new node (needs replicas >= 2) */
	unsigned fault_iv_ms; /* --fault-interval: mean ms between --kill-no-restart and
	                         --wipe faults */
	unsigned replicas;    /* --replicas: the controller's --replicas (0: not passed;
	                         --spawn sets 3, the controller's default) */
	bool replicas_default; /* replicas was not given: 1 with a controller that does not
	                          accept --replicas */
	bool one_copy_faults;  /* $SHARDKV_CHECKER_ONE_COPY_FAULTS=1: run --kill-no-restart
	                          and --wipe with one copy (removes with data loss; the
	                          history then shows the lost writes) */
} chk_opts;

/* Monotonic nanoseconds. */
uint64_t chk_now_ns(void);

/* A splitmix64 random generator; seed it with any value. */
typedef struct {
	uint64_t s; /* state */
} chk_rng;

uint64_t chk_rng_next(chk_rng *r);

/* A uniform integer in [0, n) (n > 0). */
uint64_t chk_rng_below(chk_rng *r, uint64_t n);

/* Set by SIGINT/SIGTERM: finish early and check what was recorded. */
extern volatile sig_atomic_t chk_stop_requested;

/*
 * Installs the exit paths: the first SIGINT/SIGTERM sets chk_stop_requested,
 * a second one (or SIGHUP, SIGQUIT, a crash) SIGKILLs every spawned child
 * and dies; atexit does the same for a plain exit(). Idempotent.
 */
void chk_install_signals(void);

/* Whether key (klen bytes) is in [start, end) (end empty: unbounded). */
bool chk_in_range(const void *key, size_t klen, const void *start, size_t sl, const void *end,
                  size_t el);

/* The index of the range of cfg that holds key, or SIZE_MAX. */
size_t chk_config_range(const shardkv_config *cfg, const void *key, size_t klen);

/* Whether key is in a range that a migration of cfg moves (NULL: no). Until
 * the move commits, its source still serves it, whichever node the
 * configuration names as the range's owner. */
bool chk_config_moving(const shardkv_config *cfg, const void *key, size_t klen);

/* Starts chk_log's clock: later lines show the seconds since this call. */
void chk_log_start(void);

/* Logs a line to stderr: "checker: <t> s <msg>". */
void chk_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---------------------------------------------------------------------------
 * The spawned cluster (procs.c)
 * ------------------------------------------------------------------------- */

/* What the checker did with a server it started. */
typedef enum {
	CHK_SRV_RUNNING = 1, /* started; a member once registered */
	CHK_SRV_LEAVING,     /* `leave` accepted; stopped with SIGINT once gone */
	CHK_SRV_TERMINATING, /* SIGTERM sent: it drains and exits */
	CHK_SRV_STOPPING,    /* SIGINT sent after it was gone */
	CHK_SRV_KILLED,      /* SIGKILLed (--kill); restarted at restart_ns */
	CHK_SRV_STOPPED,     /* exited; not restarted */
	CHK_SRV_PAUSED,      /* SIGSTOPped (--pause); SIGCONT at the pause's end */
	CHK_SRV_DEAD,        /* SIGKILLed for good (--kill-no-restart, --wipe): its node is
	                        removed once the controller says it is down */
} chk_srv_state;

/* One shardkv-server started by the checker. */
typedef struct {
	char url[64];        /* --listen */
	char data[1100];     /* --data-dir */
	char log[1100];      /* stderr and stdout */
	pid_t pid;           /* running process; 0: none */
	int state;           /* chk_srv_state */
	uint64_t restart_ns; /* CHK_SRV_KILLED: when to start it again */
	bool crashed;        /* it exited when nobody asked it to */
	int exit_status;     /* waitpid status of its last exit */
} chk_server;

/* A controller and servers on free loopback ports under one directory. */
typedef struct {
	char dir[1024];                     /* DIR/run-XXXXXX */
	char bindir[1024];                  /* where the daemons are */
	char fsync[8];                      /* --fsync for servers; empty: their default */
	char split_bytes[16];               /* --split-bytes for controllers; empty: none */
	char replicas[12];                  /* --replicas for the controller; empty: none */
	char ctl_url[400];                  /* the controller's --listen; replicated: every
	                                       replica's, comma-separated */
	int nctl;                           /* controller replicas; 1: standalone (ctl_*) */
	char rurl[CHK_MAX_CTLS][64];        /* replica k's URL */
	char rraft[CHK_MAX_CTLS][64];       /* its raft HOST:PORT */
	char rlog[CHK_MAX_CTLS][1100];      /* its log */
	pid_t rpid[CHK_MAX_CTLS];           /* running replica; 0: not running */
	bool rkilled[CHK_MAX_CTLS];         /* killed on purpose, to be restarted */
	uint64_t rrestart_ns[CHK_MAX_CTLS]; /* when to restart it */
	char ctl_log[1100];                 /* its log */
	pid_t ctl_pid;                      /* 0: not running */
	bool ctl_crashed;                   /* it exited when nobody asked it to */
	int nservers;                       /* slots of srv[] in use */
	int nstarted;                       /* servers ever added (names their dirs) */
	chk_server srv[CHK_MAX_SERVERS];    /* by index */
} chk_cluster;

/*
 * Makes DIR (if needed) and a fresh DIR/run-XXXXXX in it, finds the daemons
 * (`$SHARDKV_BIN_DIR`, else the checker's own directory) and starts the
 * controller. Installs the exit paths that kill every child. Servers get
 * `--fsync FSYNC` when it is not NULL; the controller(s) `--split-bytes S`
 * when split_bytes is not NULL, and `--replicas R` when
 * replicas is not 0. Returns 0, -1 (reason on stderr) or -2 when the
 * controller does not accept --replicas (its --help does not list it).
 */
int chk_cluster_create(chk_cluster *c, const char *dir, const char *fsync, const char *split_bytes,
                       unsigned nctl, unsigned replicas);

/* Whether the controller binary lists `opt` (say "--replicas") in its
 * --help output. */
bool chk_cluster_controller_accepts(chk_cluster *c, const char *opt);

/* SIGKILLs server i and reaps it (waits for its exit). Returns 0, or -1
 * when it did not run. */
int chk_cluster_kill_server(chk_cluster *c, int i);

/* Deletes server i's data dir (it must not run) and gives it a new free
 * address, so that it starts again as a new node. Returns 0 or -1. */
int chk_cluster_wipe_server(chk_cluster *c, int i);

/* Starts server i again with its URL and (possibly wiped) data dir, with
 * --join when `join`. Returns 0 or -1. */
int chk_cluster_start_server(chk_cluster *c, int i, bool join);

/* Replicated control plane: SIGKILLs replica k at once (no reaping; see
 * chk_cluster_controller_alive), marks it to be restarted at restart_ns. */
void chk_cluster_kill_replica(chk_cluster *c, int k, uint64_t restart_ns);

/* Restarts the killed replicas whose time has come (all with `now`).
 * Returns how many were started. */
int chk_cluster_restart_replicas(chk_cluster *c, bool now);

/* Starts a new server on a free port (with --join when `join`), in the slot
 * of a server that was stopped as asked, or a new one. Returns its index or
 * -1. Does not wait for it. */
int chk_cluster_add_server(chk_cluster *c, bool join);

/* Starts server i again with its data dir and URL, without --join.
 * Returns 0 or -1. */
int chk_cluster_restart_server(chk_cluster *c, int i);

/*
 * Whether a thread of server i is inside one of the system calls nrs[0..n)
 * now (/proc/PID/task/TID/syscall; the checker is the parent, so it may read
 * it). Returns the first number found, or -1 (none, not running, or /proc
 * not readable).
 */
long chk_cluster_server_syscall(chk_cluster *c, int i, const long *nrs, size_t n);

/* Sends sig to server i when it runs. */
void chk_cluster_signal(chk_cluster *c, int i, int sig);

/* Whether server i runs and accepts connections on its URL (a loopback
 * connect): it has started, so it takes SIGTERM as a leave. A process just
 * spawned may not have reached the point where it takes signals, and dies
 * of a SIGTERM sent then. */
bool chk_cluster_server_listens(chk_cluster *c, int i);

/* Reaps server i when it has exited (no wait). Returns true when it had. */
bool chk_cluster_poll_exit(chk_cluster *c, int i);

/* Checks that the controller still runs (reaps it when not). */
bool chk_cluster_controller_alive(chk_cluster *c);

/*
 * Stops everything (servers with SIGINT, the controller with SIGTERM,
 * SIGKILL after 5 s) and removes the directory when `remove`.
 */
void chk_cluster_destroy(chk_cluster *c, bool remove);

/* ---------------------------------------------------------------------------
 * The workload (workload.c)
 * ------------------------------------------------------------------------- */

typedef struct chk_workload chk_workload;

/*
 * Makes the key table (keys under `prefix`) and opens o->handles client
 * handles per client. Returns NULL on failure (reason on stderr).
 *
 * Multi-key groups (--multi G): group g is the registers
 * "<prefix>m<GGG>/<i>" (i from 0, 2 to 4 of them), and only the group's
 * prefix "<prefix>m<GGG>/" is a boundary (chk_workload_boundaries), so a
 * move between boundaries never splits a group. Rebalance, join and leave
 * cut ranges at keys the servers sample, which may fall inside a group:
 * the driver closes the multi-key gate around such steps and marks the
 * groups they split (chk_workload_mk_audit); mputs and mgets run only on
 * groups that one range holds.
 */
chk_workload *chk_workload_create(const chk_opts *o, const char *controllers, const char *prefix);

/*
 * Writes `n` filler keys of `size` bytes with `admin` (mput batches), spread
 * over the gaps between the checker's keys ("<key>/f<NNNNNN>"), so that the
 * ranges the driver moves carry data and migrations take time. The clients
 * never touch them. Returns 0 or the first error.
 */
int chk_workload_fill(chk_workload *w, shardkv_client *admin, unsigned n, unsigned size);

/* Starts the client threads; they run until `deadline_ns`, the operation
 * budget or chk_workload_stop(). Returns 0 or -1. */
int chk_workload_start(chk_workload *w, uint64_t deadline_ns);

/* Stops and joins the client threads. */
void chk_workload_stop(chk_workload *w);

/* Operations recorded so far and how many of them failed (any thread). */
void chk_workload_counts(chk_workload *w, uint64_t *ops, uint64_t *failed);

/* More counts of the run (any thread, after chk_workload_stop for the final
 * numbers). */
typedef struct {
	uint64_t indeterminate; /* failed writes (put, append, mput): outcome unknown */
	uint64_t timeouts;      /* operations that failed with SHARDKV_ETIMEDOUT */
	uint64_t mputs, mgets;  /* multi-key operations issued */
	uint64_t mk_skipped;    /* multi-key ops not issued: gate closed or group split */
	uint64_t mk_loose;      /* parts of multi-key ops a gate leak made not atomic (after
	                           chk_workload_history) */
	uint64_t async_ops;     /* operations issued through the async API */
	uint64_t hot_ops;       /* operations on keys the driver was moving */
	uint64_t dels, scans;   /* deletes and scans issued */
	uint64_t cas;           /* compare-and-set operations issued (counters and locks) */
} chk_workload_more;

void chk_workload_more_counts(chk_workload *w, chk_workload_more *out);

/*
 * The multi-key gate. chk_workload_mk_block closes it (nestable) and waits
 * up to `ms` for the mputs and mgets in flight to finish; while it is
 * closed no new one starts. Returns true when none is in flight.
 * chk_workload_mk_unblock opens it one level. Driver thread only.
 */
bool chk_workload_mk_block(chk_workload *w, unsigned ms);
void chk_workload_mk_unblock(chk_workload *w);

/*
 * Marks each group split or whole in cfg. Split: its keys are not all in
 * one range, or a migration in flight takes part of it only (its pieces
 * move from different nodes). A split group takes mputs and mgets again
 * CHK_WHOLE_GRACE_MS after it is first seen whole (clients may still route
 * by a configuration that splits it). Called with the gate closed it just
 * records; with it open a group found split that was whole is a leak of
 * the gate (a step cut it while mputs could run, such as the servers'
 * automatic balancer): it is marked, logged, and counted in the return
 * value, and the group's mputs and mgets that overlap the time since
 * `since` (when the last configuration that did not list cfg's epoch was
 * read, less CHK_LOOSE_MARGIN_NS) to now are recorded as not atomic
 * (CHK_TXN_LOOSE, set by chk_workload_history): by the contract they were
 * not, since their keys did not all live on one node.
 */
size_t chk_workload_mk_audit(chk_workload *w, const shardkv_config *cfg, bool gated,
                             uint64_t since);

/* How long before the last configuration read a leak is taken to have
 * begun: a read may be served a moment stale. */
#define CHK_LOOSE_MARGIN_NS 1000000000ull

/* Whether the gate is closed now. */
bool chk_workload_mk_blocked(chk_workload *w);

/*
 * The hot keys: chk_workload_hot_add marks every key of [start, end) (end
 * empty: to the end) as moving, so that --hot percent of the operations
 * pick one of them; chk_workload_hot_clear unmarks all. Driver thread only;
 * the clients read the marks lock-free.
 */
void chk_workload_hot_add(chk_workload *w, const void *start, size_t sl, const void *end,
                          size_t el);
void chk_workload_hot_clear(chk_workload *w);
bool chk_workload_hot_any(chk_workload *w);

/* The keys the driver may use as range boundaries: every key in use (of a
 * group, its prefix only), sorted. The caller frees the array (not the strings, which live as long
 * as w) with free(). */
const char **chk_workload_boundaries(chk_workload *w, size_t *n);

/*
 * After the run: reads every key once more with `admin` (retrying; all keys
 * within `ms` together), records register reads in the history and keeps the final value of
 * every append key. Returns the number of keys it could not read.
 */
size_t chk_workload_final_reads(chk_workload *w, shardkv_client *admin, unsigned ms);

/* The history and key table (valid until chk_workload_destroy). */
void chk_workload_history(chk_workload *w, const chk_key **keys, size_t *nkeys, const chk_op **ops,
                          size_t *nops);

/* The scans of the history, for the history file (valid until
 * chk_workload_destroy; after chk_workload_history). */
void chk_workload_scans(chk_workload *w, const chk_scan **scans, size_t *n);

/* Counts of failed operations by error code (index -err, up to 31). */
const uint64_t *chk_workload_errors(chk_workload *w);

/* Frees everything. Accepts NULL. */
void chk_workload_destroy(chk_workload *w);

/* ---------------------------------------------------------------------------
 * The reconfiguration driver (driver.c)
 * ------------------------------------------------------------------------- */

/* What the driver did. */
typedef struct {
	uint64_t reconfigs; /* successful steps (each published a new epoch) */
	uint64_t noops;     /* accepted steps that changed nothing */
	uint64_t busy;      /* steps refused because a range was moving (retried later) */
	uint64_t failed;    /* steps that failed otherwise */
	uint64_t moves, rebalances, joins, leaves, kills, restarts; /* successful, by kind */
	uint64_t waited;                                            /* steps run with --wait */
	uint64_t wait_timeouts;     /* --wait steps that did not finish in time */
	uint64_t crashes;           /* processes that exited when nobody asked */
	uint64_t migrations;        /* migrations the steps started */
	uint64_t ctl_kills;         /* --kill-controller: leader replicas killed */
	uint64_t gate_leaks;        /* groups found split while mputs could run (see workload) */
	uint64_t kills_in_log;      /* --kill-interval kills that landed in a log write or sync */
	uint64_t kills_at_handover; /* --kill-at-handover kills, each just after a fence or a
	                               commit was logged */
	uint64_t pauses;            /* --pause: servers SIGSTOPped and resumed */
	uint64_t pause_downs;       /* ... seen `down` in a configuration while paused or after */
	uint64_t pause_backs;       /* ... seen `active` again after that */
	uint64_t dead_kills;   /* --kill-no-restart, --wipe: servers killed for good or wiped */
	uint64_t removes;      /* ... their down nodes removed (`shardkv remove`) */
	uint64_t replacements; /* ... replacement (or wiped) servers started with --join */
	uint64_t fo_ctl_kills; /* --kill-controller-in-failover: leaders killed in a failover */
	uint64_t fo_ctl_before_down; /* ... of them before the node was seen `down` */
	uint64_t fo_unfinished;      /* failovers a new leader did not finish (must be 0): the node
	                                never seen down, or a range still led by a node that is not
	                                active at the end */
} chk_driver_stats;

/* What the pauses look like in the history (chk_driver_pause_check). */
typedef struct {
	uint64_t keys;         /* keys the paused servers owned, summed over the pauses */
	uint64_t acked_paused; /* operations on them that succeeded while their owner was
	                          stopped (must be 0: one copy, nobody else may answer) */
	uint64_t held;         /* operations on them begun while their owner was stopped
	                          that succeeded after its SIGCONT */
	uint64_t failed;       /* operations on them, begun before a SIGCONT, that failed */
	uint64_t unavailable;  /* ... of which refused as unavailable (lease expired) */
	uint64_t served_again; /* pauses after which an operation on those keys succeeded */
	uint64_t back_ms_max;  /* the longest SIGCONT-to-first-success, ms */
} chk_pause_check;

typedef struct chk_driver chk_driver;

/* A driver over the cluster of `admin` (a handle the driver borrows);
 * `cl` is the spawned cluster or NULL. */
chk_driver *chk_driver_create(const chk_opts *o, shardkv_client *admin, chk_cluster *cl,
                              chk_workload *w);

/* Runs one tick: reaps and restarts processes as due, then, when the pause
 * is over, one random step. Returns how long to sleep before the next tick
 * (ms). Main thread only. */
unsigned chk_driver_tick(chk_driver *d, bool steps);

/* Restarts killed servers, resumes a paused one and stops leaving ones
 * that are gone (end of run). */
void chk_driver_settle_procs(chk_driver *d);

/*
 * Lines each pause up with the operations on the keys its server owned
 * (before the SIGSTOP and after the SIGCONT: keys that moved meanwhile are
 * left out), fills *out and adds to each pause's nemesis event what it
 * found. Call after the run, before chk_driver_nemesis.
 */
void chk_driver_pause_check(chk_driver *d, const chk_key *keys, size_t nkeys, const chk_op *ops,
                            size_t nops, chk_pause_check *out);

const chk_driver_stats *chk_driver_get_stats(const chk_driver *d);

/* The driver's record of its steps (in the order they began; at most
 * CHK_MAX_NEM), valid until the next tick or chk_driver_destroy. */
void chk_driver_nemesis(const chk_driver *d, const chk_nemesis **nem, size_t *n);

void chk_driver_destroy(chk_driver *d);

#endif
