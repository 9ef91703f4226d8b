/*
 * controller_int.h - what the files of the controller share, and nothing
 * outside controller/ includes: the state (struct kv_controller), the
 * records it keeps and the calls between its files (kv_ctl__*).
 *
 * The files, and who calls whom (an arrow is "calls"; there is no circle,
 * so each file can be read knowing only the ones to its right):
 *
 *   controller.c (life cycle) -> dispatch.c, held.c, history.c, fsm.c,
 *                                metrics_ctl.c, stats.c
 *   dispatch.c (table, dedup, handler, proposer) -> commands.c, fsm.c,
 *                                                   history.c
 *   commands.c (the commands, publishing) -> fsm.c, history.c, held.c,
 *                                            stats.c, migrations.c
 *   fsm.c (the Raft state machine) -> history.c
 *   history.c (the configuration history) -> held.c, migrations.c
 *   held.c (watches, waits, the reaper) -> migrations.c
 *   stats.c, migrations.c, metrics_ctl.c -> nothing of the controller
 *
 * Locking: `mu` protects the fields of struct kv_controller that its
 * comments say; functions that end in _locked are called with mu held.
 * doc/threads.md has the threads and the lock order.
 */
#ifndef KV_CONTROLLER_CONTROLLER_INT_H
#define KV_CONTROLLER_CONTROLLER_INT_H

#include "common/auth.h"
#include "common/config.h"
#include "common/fileio.h"
#include "common/key.h"
#include "common/metrics.h"
#include "common/rpc.h"
#include "common/tls.h"
#include "controller/clog.h"
#include "controller/controller.h"
#include "controller/placement.h"
#include "controller/replica.h"
#include "controller/scheduler.h"
#include "proto/admin_codec.h"
#include "proto/config_codec.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CTL_GRACE_NS         0u /* delay before a due held request is answered */
#define CTL_MAX_WAITS        128u
#define CTL_DEFAULT_CONFIGS  256u
#define CTL_MAX_FAILS        64u
#define CTL_DEDUP            256u
#define CTL_STATS_GRACE_NS   1500000000u /* a new leader's wait for heartbeats */
#define CTL_REPAIR_EVERY_NS  250000000u  /* the liveness thread's look for repairs */
#define CTL_BALANCE_EVERY_NS 2000000000u /* the balancer's rounds (doc/scheduler.md) */
#define CTL_SCHED_RECENT     16u         /* decisions kept for the log and metrics */
/* The longest a new primary's watch waits for the old primary to apply
 * the transfer, and the (old primary, replica) pairs remembered (held.c). */
#define CTL_HANDOVER_HOLD_NS 100000000u
#define CTL_HANDOVERS        32u

/* Live statistics of one node, from its latest heartbeat. */
struct ctl_stat {
	uint32_t id;                  /* node id */
	uint64_t boot_id;             /* from Register / Heartbeat */
	uint64_t restart_pending;     /* boot id of a restart whose failover is still to
	                                 commit (doc/replication.md "Failover"); 0: none */
	uint64_t restart_done;        /* boot id of the last restart handled (failed over,
	                                 or in no shared ISR); 0: none */
	uint64_t epoch_applied;       /* epoch the node routes with */
	uint64_t epoch_watched;       /* the highest epoch its watches said it had applied */
	uint64_t keys, bytes, memory; /* node totals */
	double ops;                   /* op rate */
	uint64_t last_seen_ns;        /* monotonic time of the last report; 0: never */
	uint64_t uptime_ms;           /* the server's uptime in its last full heartbeat;
	                                 0: unknown */
	uint64_t stats_ns;            /* monotonic time the last full heartbeat (the
	                                 figures and the uptime) arrived; 0: never */
	size_t nranges;               /* entries in ranges */
	kv_admin_range_stat *ranges;  /* owned; bytes point into blob, split into splits */
	kv_bytes *splits;             /* owned */
	uint8_t *blob;                /* owned key bytes */
};

/* Live progress of a migration (not durable, not in the config). */
struct ctl_prog {
	uint64_t id;                                    /* migration id */
	kv_mig_phase phase;                             /* phase reached */
	uint64_t keys_copied, bytes_copied;             /* acknowledged so far */
	uint64_t keys_total, bytes_total, rate_bytes_s; /* estimates */
	uint64_t last_ns;                               /* monotonic time of the last report */
	uint64_t born_ns;                               /* monotonic time of the first one */
};

/* A migration that ended without success, for --wait answers. */
struct ctl_fail {
	uint64_t id;   /* migration id; 0: unused slot */
	int err;       /* KV_E* code */
	char msg[160]; /* detail */
};

/* A change committed through Raft by a request that carried a client id:
 * replicated, so that a retry sent to a new leader after the old one died
 * is answered with what it did instead of being applied twice. */
struct ctl_rdedup {
	uint64_t client_id;  /* 0: unused slot */
	uint64_t request_id; /* the sender's request id */
	uint64_t epoch;      /* the epoch it published */
};

/* The answer to a command that changed something, kept so that a retry of
 * the same (client_id, request_id) is answered again instead of applied
 * twice (AdminRequest.client_id). */
struct ctl_dedup {
	uint64_t client_id;  /* 0: unused slot */
	uint64_t request_id; /* the sender's request id */
	void *reply;         /* the packed answer (owned) */
	size_t len;          /* its length */
};

enum { HELD_WATCH = 1, HELD_WAIT = 2 };

/* A request held for a later answer. */
struct ctl_held {
	struct ctl_held *prev, *next; /* the held list, oldest first */
	kv_rpc_pending *p;            /* the request slot */
	int kind;                     /* HELD_* */
	uint64_t request_id;          /* echoed */
	uint64_t born_ns;             /* when it was held */
	uint64_t deadline_ns;         /* when it times out */
	bool ready;                   /* answer as soon as the grace period is over */
	/* watch */
	uint64_t known;       /* known epoch */
	bool history;         /* answer with every config after known */
	uint32_t max_configs; /* at most this many */
	uint32_t watcher;     /* the server's node id; 0: not a server */
	bool handover;        /* held for an old primary's apply (counted once) */
	/* wait */
	uint64_t epoch;          /* epoch the command published */
	const kv_config *config; /* that config (immutable) */
	uint32_t node_id;        /* join: the new node */
	uint64_t *migs;          /* migrations the command created (owned) */
	size_t nmigs;            /* entries in migs */
	uint32_t wait_gone;      /* leave with replicas: also until this node is gone */
	uint64_t wait_ms;        /* set when it became ready */
	int err;                 /* result to answer with */
	char error[200];         /* its detail */
};

struct ctl_job;

struct kv_controller {
	char *listen;          /* --listen (owned) */
	char *data_dir;        /* --data-dir (owned) */
	uint32_t watch_max_ms; /* longest watch */
	uint32_t wait_max_ms;  /* default wait bound */
	unsigned max_watches;  /* held watches cap */
	kv_rpc_server *rpc;    /* the listener */
	kv_clog *log;          /* the config log; used under mu */
	kv_metrics *metrics;   /* the /metrics listener, or NULL */
	char *metrics_addr;    /* --metrics HOST:PORT (owned); NULL: off */
	unsigned contexts;     /* nng contexts of the listener */
	bool started;          /* kv_controller_start ran (once only) */
	pthread_t reaper;      /* answers held requests */
	bool reaper_started;   /* reaper must be joined */
	char cluster_id[25];   /* from the log header */
	kv_buf auth;           /* --auth-token-file secret (immutable); empty: none */
	kv_tls *tls;           /* --tls-* configuration (immutable); NULL: plain tcp */

	pthread_mutex_t mu;                   /* protects everything down to the blank line */
	pthread_cond_t cv;                    /* wakes the reaper (CLOCK_MONOTONIC) */
	kv_config **hist;                     /* every published config; hist[i].epoch == i + 1 */
	size_t nhist, caphist;                /* entries, capacity */
	kv_config *empty;                     /* answered before the first config (epoch 0) */
	uint64_t next_mig_id;                 /* next migration id */
	struct ctl_stat *stats;               /* one per node that reported */
	size_t nstats;                        /* entries in stats */
	struct ctl_prog *prog;                /* progress of migrations in flight */
	size_t nprog;                         /* entries in prog */
	struct ctl_fail fails[CTL_MAX_FAILS]; /* recent failures, a ring */
	size_t nextfail;                      /* next ring slot */
	struct ctl_dedup dedup[CTL_DEDUP];    /* recent answers to changes, a ring */
	size_t nextdedup;                     /* its next slot */
	struct ctl_held held;                 /* list head of held requests */
	size_t nwatches, nwaits;              /* held requests by kind */
	bool closing;                         /* stopping: hold nothing more */
	/* Primary transfers of recent configurations, a ring: a watch of the
	 * new primary that would list one waits until the old primary's
	 * watch says it applied it, or until until_ns (held.c,
	 * doc/replication.md "Primary transfer"). */
	struct ctl_handover {
		uint64_t epoch;    /* the configuration that made the transfer; 0: unused */
		uint32_t from, to; /* old and new primary */
		uint64_t until_ns; /* monotonic end of the wait */
	} hand[CTL_HANDOVERS];
	size_t hand_next;                 /* its next slot */
	bool handover_unordered;          /* immutable: kv_controller_cfg's */
	uint64_t handover_holds_total;    /* watches of a new primary held */
	uint64_t handover_timeouts_total; /* ... and answered before the old primary applied */

	uint64_t started_ns; /* for the metrics */

	/* Liveness (doc/contract.md §2; common/config.h KV_LEASE_*); the
	 * first four are immutable. */
	uint64_t lease_ns;      /* a server's lease */
	uint64_t down_ns;       /* no heartbeat for longer than this: down */
	uint64_t live_tick_ns;  /* how often the liveness thread looks */
	unsigned down_after_s;  /* --down-after: replacements for nodes down longer */
	pthread_t live_thr;     /* the liveness thread (kv_ctl__liveness_main) */
	bool live_started;      /* live_thr must be joined */
	uint64_t live_term;     /* mu: replicated, the term this replica leads; 0: none */
	uint64_t live_since_ns; /* mu: when it became leader (standalone: started);
	                           nobody is older than that to it */
	bool live_queued;       /* mu: a liveness change waits for the proposer */
	/* mu: standalone, the highest id of the migrations in flight when it
	 * started: what their sources reported before is lost, so their phase
	 * is unknown until they report again (replicated: every migration's,
	 * until its source reports to this leader). */
	uint64_t mig_unknown_max;
	uint64_t downs_total; /* mu: nodes declared down, for the metrics */

	/* Replica placement (doc/replication.md); replicas and min_insync are
	 * immutable, the counters are protected by mu. */
	uint32_t replicas;           /* --replicas R */
	uint32_t min_insync;         /* --min-insync M */
	uint64_t failovers_total;    /* mu: ranges given a new primary by a failover */
	uint64_t isr_shrinks_total;  /* mu: ranges whose ISR lost a member */
	uint64_t isr_expands_total;  /* mu: ranges whose ISR gained a member */
	uint64_t unfenced_total;     /* mu: ranges whose transfer fence ended in sync */
	uint64_t repair_next_ns;     /* mu: the next look for repairs (kv_place_repair) */
	uint64_t replacements_total; /* mu: replacement replicas added by repairs */

	/* The automatic balancer (scheduler.h); auto_balance and sched_p are
	 * immutable, the rest is protected by mu. */
	bool auto_balance;        /* --auto-balance */
	kv_sched_params sched_p;  /* --split-bytes, --split-ops, --max-migrations */
	kv_sched *sched;          /* mu: the planner's memory (pins, cool-downs) */
	uint64_t balance_next_ns; /* mu: the next round */
	bool balance_queued;      /* mu: a round waits for the proposer */
	uint64_t sched_total[KV_SCHED_KIND_MAX]
	                    [KV_SCHED_WHY_MAX];  /* mu: decisions carried out, by kind and reason */
	uint64_t sched_splits[KV_SCHED_WHY_MAX]; /* mu: of which cut a range, by reason */
	struct ctl_sched_rec {
		uint64_t unix_ms;         /* when it was published; 0: unused slot */
		const char *kind;         /* kv_sched_kind_name */
		const char *reason;       /* kv_sched_why_name */
		char text[240];           /* what and why, printable */
	} sched_recent[CTL_SCHED_RECENT]; /* mu: the latest decisions, a ring */
	size_t sched_next;                /* mu: its next slot */

	/* Replication; repl is NULL for a standalone controller. peers and
	 * self_id are immutable. */
	kv_repl *repl;                          /* the Raft replica */
	uint32_t self_id;                       /* --id */
	size_t npeers;                          /* replicas */
	char **peers;                           /* their controller URLs (owned) */
	pthread_t proposer;                     /* runs mutating commands one at a time */
	bool proposer_started;                  /* proposer must be joined */
	char raft_addr[KV_REPL_MAX_PEERS][128]; /* HOST:PORT raft uses, per replica */
	char raft_dir[4096];                    /* DATA_DIR/raft */
	unsigned election_ms;                   /* --election-timeout; 0: raft's default */
	unsigned snapshot_threshold;            /* --snapshot-threshold; 0: raft's default */
	/* The following are protected by mu too. */
	pthread_cond_t pcv;                  /* wakes the proposer; proposal done
	                                        (CLOCK_MONOTONIC) */
	struct ctl_job *jobs, *jobs_tail;    /* mutating requests, oldest first */
	uint64_t barrier_term;               /* term whose barrier has been applied */
	uint64_t leader_since_ns;            /* when that barrier committed */
	uint64_t cur_client_id, cur_req_id;  /* the command being proposed */
	struct ctl_rdedup rdedup[CTL_DEDUP]; /* replicated answers, a ring */
	size_t nextrdedup;                   /* its next slot */
};

/* The result of one handler, encoded by the dispatcher. */
struct ctl_ctx {
	kv_admin_resp resp;                       /* the answer */
	kv_admin_replica reps[KV_REPL_MAX_PEERS]; /* status: controller replicas */
	char msg[512];                            /* resp.error storage */
	kv_rpc_pending *p;                        /* the request slot, for handlers that hold it */
	bool held;                                /* the handler kept the request */
	uint64_t *migs;                           /* created migrations; freed after encoding */
	kv_admin_node_stat *nstat;                /* status: freed after encoding */
	kv_migration *rmigs;                      /* status: freed after encoding */
	kv_admin_report report;                   /* status */
	const kv_config **cfgs;                   /* watch: freed after encoding */
	kv_migration *plan;                       /* dry run: the planned migrations, whose
	                                             bytes borrow from plan_cfg; freed after
	                                             encoding */
	kv_config *plan_cfg;                      /* dry run: the configuration planned and
	                                             not published; freed after encoding */
	uint32_t wait_gone;                       /* leave: --wait until this node is gone */
	kv_admin_balance bal[CTL_SCHED_RECENT];   /* status, rebalance dry run: the
	                                             balancer's decisions */
	char btext[CTL_SCHED_RECENT][240];        /* their texts */
};

/* Returns the latest configuration (the empty one, epoch 0, before the
 * first). It stays valid until the controller is destroyed. */
static inline const kv_config *
kv_ctl__latest_locked(const kv_controller *c)
{
	return c->nhist ? c->hist[c->nhist - 1] : c->empty;
}

/* ---- history.c: the configuration history ---- */

/* Makes room for `more` configurations. Returns 0 or KV_ENOMEM. */
int kv_ctl__hist_reserve_locked(kv_controller *c, size_t more);

/* Appends a configuration (taken; its epoch is nhist + 1 and the history
 * has room) to the history and marks the held requests it answers. */
void kv_ctl__install_locked(kv_controller *c, kv_config *next);

/* The config log's replay callback (kv_clog_open; arg is the controller,
 * during create): appends one record to the history. Returns 0,
 * KV_ECORRUPT or KV_ENOMEM. */
int kv_ctl__replay_cb(void *arg, const uint8_t *p, size_t n, uint64_t offset);

/* ---- held.c: requests held for a later answer ---- */

/* Links h (taken) at the end of the held list / unlinks it. */
void kv_ctl__held_push(kv_controller *c, struct ctl_held *h);
void kv_ctl__held_unlink(kv_controller *c, struct ctl_held *h);

/* Notes the primary transfers of a configuration being installed. */
void kv_ctl__handover_note_locked(kv_controller *c, const kv_config *next);

/* Whether a watch of server `node` that knows epoch `known` must wait for
 * an old primary to apply a transfer to node first; lowers *until to the
 * end of that wait. */
bool kv_ctl__handover_held_locked(kv_controller *c, uint32_t node, uint64_t known, uint64_t now,
                                  uint64_t *until);

/* Notes that server `node`'s watch knows epoch `known` (it applied it),
 * and answers the watches that waited for it. */
void kv_ctl__watched_locked(kv_controller *c, uint32_t node, uint64_t known);

/* Frees an unlinked held request. Accepts NULL. */
void kv_ctl__held_free(struct ctl_held *h);

/* Marks the held requests that the latest configuration answers and wakes
 * the reaper if any. */
void kv_ctl__wake_locked(kv_controller *c);

/* Holds a --wait command (x->p) until the migrations in its answer finish:
 * sets x->held. Out of memory it answers at once. Returns 0. */
int kv_ctl__hold_wait_locked(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);

/* Fills a watch answer: the configs after `known` (history, at most max)
 * or the latest. *cfgs gets the array it allocates (the caller frees it
 * after encoding). Returns 0 or KV_ENOMEM. */
int kv_ctl__watch_answer_locked(kv_controller *c, uint64_t known, bool history, uint32_t max,
                                kv_admin_resp *resp, const kv_config ***cfgs);

/* The reaper thread (arg is the controller): answers held requests when
 * they are due, until `closing` and nothing is held. */
void *kv_ctl__reaper_main(void *arg);

/* ---- stats.c: live statistics from heartbeats ---- */

/* Finds the statistics of node id, or (create) adds empty ones. Returns
 * NULL when not found or out of memory. The pointer is valid until the
 * next create. */
struct ctl_stat *kv_ctl__stat_find_locked(kv_controller *c, uint32_t id, bool create);

/* Frees s's per-range statistics. */
void kv_ctl__stat_clear(struct ctl_stat *s);

/* Copies a heartbeat's per-range statistics into s. Returns 0 or
 * KV_ENOMEM (s unchanged). */
int kv_ctl__stat_store(struct ctl_stat *s, const kv_admin_req *rq);

/* Builds the data samples for placement from the statistics, keeping only
 * those in key space the reporter serves in cur. The caller frees *out;
 * the keys borrow from c->stats. Returns 0 or KV_ENOMEM. */
int kv_ctl__points_locked(kv_controller *c, const kv_config *cur, kv_place_point **out, size_t *n);

/* Estimates the keys and bytes node holds in [start, end) from its last
 * heartbeat's per-range figures (a range's figures spread evenly between
 * its split keys; a piece cut by start or end counts half). Both 0 when the
 * node has not reported. */
void kv_ctl__estimate_locked(kv_controller *c, uint32_t node, kv_bytes start, kv_bytes end,
                             uint64_t *keys, uint64_t *bytes);

/* Fills f[0..cur->nranges) with each range's figures from its primary's
 * last full heartbeat when it is younger than fresh_ns (else not known):
 * bytes (kv_ctl__estimate_locked), ops in proportion to them, up to
 * KV_SCHED_QUANTS split keys and load split keys inside, the load split key
 * and the hot key. Keys borrow from
 * c->stats until the next heartbeat (mu held). */
void kv_ctl__figs_locked(kv_controller *c, const kv_config *cur, uint64_t fresh_ns,
                         kv_sched_fig *f);

/* ---- migrations.c: progress and failures of migrations ---- */

/* Drops the progress of migrations no longer in cur. */
void kv_ctl__prog_prune_locked(kv_controller *c, const kv_config *cur);

/* Finds the progress of migration id, or (create) adds an empty one.
 * Returns NULL when not found or out of memory. */
struct ctl_prog *kv_ctl__prog_find_locked(kv_controller *c, uint64_t id, bool create);

/* Remembers that migration id failed (err, detail), in a ring of the
 * CTL_MAX_FAILS latest. */
void kv_ctl__fail_record_locked(kv_controller *c, uint64_t id, int err, const char *detail);

/* Returns the failure of migration id, or NULL. */
const struct ctl_fail *kv_ctl__fail_find_locked(const kv_controller *c, uint64_t id);

/* Whether migration id is in cfg / the migration itself or NULL. */
bool kv_ctl__mig_in(const kv_config *cfg, uint64_t id);
const kv_migration *kv_ctl__mig_find(const kv_config *cfg, uint64_t id);

/* ---- fsm.c: the Raft state machine ---- */

/* Returns the state machine callbacks for c's replica. */
kv_repl_fsm kv_ctl__fsm(kv_controller *c);

/* Returns the replicated dedup entry of (client_id, request_id) whose
 * epoch this replica has applied, or NULL. */
const struct ctl_rdedup *kv_ctl__rdedup_find_locked(const kv_controller *c, uint64_t client_id,
                                                    uint64_t request_id);

/* Submits a barrier (cmd NULL) or a command and waits, with mu released,
 * until the replica calls back. Returns the status (0, KV_EUNAVAIL,
 * KV_ECLOSED, KV_ENOMEM, KV_EIO); *result gets apply's. */
int kv_ctl__repl_wait_locked(kv_controller *c, const kv_buf *cmd, int *result);

/* Commits a packed configuration of epoch `epoch` through Raft (proposer
 * thread; mu released while waiting). On error writes the reason into msg
 * and returns KV_EUNAVAIL, KV_ECLOSED, KV_EBUSY (planned on a stale state)
 * or KV_ENOMEM. */
int kv_ctl__propose_locked(kv_controller *c, const kv_buf *cfg, uint64_t epoch, char *msg,
                           size_t msglen);

/* ---- commands.c: the commands (called with mu held) ---- */

/* A command: decoded request in, answer in x. Returns 0 or a KV_E* code
 * with the reason in x->msg. */
typedef int (*kv_ctl_cmd_fn)(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);

int kv_ctl__cmd_join(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);
int kv_ctl__cmd_leave(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);
int kv_ctl__cmd_move(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);
int kv_ctl__cmd_rebalance(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);
int kv_ctl__cmd_get_config(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);
int kv_ctl__cmd_status(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);
int kv_ctl__cmd_cancel(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);
int kv_ctl__cmd_register(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);
int kv_ctl__cmd_heartbeat(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);
int kv_ctl__cmd_progress(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);
int kv_ctl__cmd_done(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);
int kv_ctl__cmd_watch(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);
int kv_ctl__cmd_remove(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);
int kv_ctl__cmd_isr_change(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);

/* The liveness change (internal, never from the network): declares down
 * the active nodes not heard from for down_ns and active again the down
 * nodes heard from lately, in one configuration; then, when due, the
 * repairs (kv_place_repair: replacements for nodes down longer than
 * --down-after, leaves in progress) in another. rq is unused. */
int kv_ctl__cmd_liveness(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);

/* The balancer's round (internal, never from the network; doc/scheduler.md):
 * plans on the latest configuration and the heartbeats' figures
 * (kv_sched_plan) and publishes the moves and primary transfers it decides
 * in one configuration, through kv_place_move as the move command does.
 * rq is unused. */
int kv_ctl__cmd_balance(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);

/* Whether kv_ctl__cmd_liveness would change something now, or repairs
 * are due a look (at most every CTL_REPAIR_EVERY_NS). */
bool kv_ctl__live_due_locked(kv_controller *c, uint64_t now);

/* When node id was last heard from as far as this leader knows: its last
 * heartbeat, or the moment it became leader if later (monotonic ns). */
uint64_t kv_ctl__live_seen_locked(kv_controller *c, uint32_t id);

/* Fills the usual answer of a command that published cfg: epoch, config
 * and the ids of the migrations it created (those not in prev). */
void kv_ctl__answer_published(struct ctl_ctx *x, const kv_config *prev, const kv_config *cfg);

/* ---- dispatch.c: requests in, answers out ---- */

/* The rpc handler (kv_rpc_handler; arg is the controller). */
int kv_ctl__handle(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p);

/* The proposer thread (replicated; arg is the controller). */
void *kv_ctl__proposer_main(void *arg);

/* The liveness thread (arg is the controller): every live_tick_ns, at the
 * leader, runs kv_ctl__cmd_liveness when it is due (replicated: queued for
 * the proposer), until `closing`. */
void *kv_ctl__liveness_main(void *arg);

/* ---- metrics_ctl.c ---- */

/* Renders the gauges for /metrics (kv_metrics_render_fn; arg is the
 * controller). */
int kv_ctl__metrics_render(void *arg, kv_buf *out);

#endif
