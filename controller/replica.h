/*
 * replica.h - the controller's Raft replication: one replica of a group of
 * controllers that agree, through canonical raft (libraft, its libuv
 * backend and TCP transport), on one log of opaque commands.
 *
 * The module knows nothing of configurations. The controller gives it three
 * callbacks (apply, snapshot, restore) that make the log a state machine;
 * they run on the replica's loop thread, one at a time, in log order. The
 * replica persists its log, term and snapshots under DIR (created if
 * missing) and takes a snapshot every `snapshot_threshold` entries, keeping
 * `snapshot_trailing` entries after it, so the log stays bounded.
 *
 * Thread-safety: every function may be called from any thread except from
 * inside a callback (which runs on the loop thread), unless said otherwise.
 */
#ifndef KV_CONTROLLER_REPLICA_H
#define KV_CONTROLLER_REPLICA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KV_REPL_MAX_PEERS 9

typedef struct kv_repl kv_repl;

/* The state machine. Each callback runs on the loop thread. */
typedef struct {
	void *arg;
	/* Applies the committed command p[0..n) (deterministically: every
	 * replica gets the same commands in the same order). Returns a result
	 * (>= 0, or a negative KV_E*) handed to the submitter's done callback
	 * on the replica that submitted it. */
	int (*apply)(void *arg, const uint8_t *p, size_t n);
	/* Serialises the whole state into *out (malloc'd; the replica frees it)
	 * and its length into *len. Returns 0 or KV_ENOMEM. */
	int (*snapshot)(void *arg, uint8_t **out, size_t *len);
	/* Replaces the whole state by a snapshot (borrowed). Returns 0,
	 * KV_ECORRUPT or KV_ENOMEM. */
	int (*restore)(void *arg, const uint8_t *p, size_t n);
} kv_repl_fsm;

/* Start-up parameters (borrowed during kv_repl_create only). */
typedef struct {
	uint32_t id;                   /* this replica, 1 .. npeers */
	size_t npeers;                 /* replicas in the group */
	const char *const *raft_addrs; /* HOST:PORT raft listens on, per replica */
	const char *dir;               /* raft's own data dir */
	unsigned election_ms;          /* 0: 1000 */
	unsigned heartbeat_ms;         /* 0: 100 */
	unsigned snapshot_threshold;   /* 0: 256 */
	unsigned snapshot_trailing;    /* 0: 64 */
	/* How long a leader waits for a follower to answer the snapshot it
	 * sent before it sends it again (replica.c, "A snapshot the follower
	 * drops"). 0: twice the election timeout, at least 1000. */
	unsigned install_snapshot_ms;
	kv_repl_fsm fsm; /* the state machine */
} kv_repl_cfg;

/* Roles, as the status report shows them. */
enum { KV_REPL_UNKNOWN = 0, KV_REPL_FOLLOWER = 1, KV_REPL_CANDIDATE = 2, KV_REPL_LEADER = 3 };

/* What one replica knows of the group (copied out, a few ms old). */
typedef struct {
	int role;              /* KV_REPL_* of this replica */
	uint64_t term;         /* its current term */
	uint32_t leader_id;    /* the known leader (1-based); 0: none known */
	uint64_t commit_index; /* highest committed entry */
	uint64_t applied;      /* highest entry applied to the state machine */
	uint64_t last_index;   /* highest entry in its log */
	size_t npeers;         /* entries below */
	/* Leader only: per replica, the highest entry known replicated there
	 * and whether it answered within an election timeout. */
	uint64_t match[KV_REPL_MAX_PEERS];
	bool reachable[KV_REPL_MAX_PEERS];
} kv_repl_info;

/*
 * Opens (or creates and bootstraps with every peer as a voter) the replica's
 * state in cfg->dir, restores its snapshot and starts its loop thread.
 * Before it returns the state machine has been restored from the latest
 * snapshot; the log entries after it are applied as the thread runs. On
 * error writes a one-line reason into err and returns KV_EINVAL,
 * KV_EADDRINUSE, KV_EIO, KV_ECORRUPT or KV_ENOMEM. The caller stops it with
 * kv_repl_destroy().
 */
int kv_repl_create(const kv_repl_cfg *cfg, kv_repl **out, char *err, size_t errlen);

/* Called once when a submitted command has been applied (status 0, result
 * is what apply returned) or could not be: KV_EUNAVAIL (not the leader, or
 * leadership was lost before it committed: it may still commit later under
 * another leader), KV_ECLOSED (shutting down), KV_ENOMEM, KV_EIO. Runs on
 * the loop thread with no lock of this module held. */
typedef void (*kv_repl_done_cb)(void *arg, int status, int result);

/* Submits a command (copied). On 0, done is called exactly once; on error
 * it is never called. Returns 0, KV_ENOMEM or KV_ECLOSED. */
int kv_repl_submit(kv_repl *r, const void *p, size_t n, kv_repl_done_cb done, void *arg);

/* Submits a barrier: done(arg, 0, 0) once every entry before it has been
 * applied. Same errors as kv_repl_submit. */
int kv_repl_barrier(kv_repl *r, kv_repl_done_cb done, void *arg);

/* Copies the latest known state into *out. */
void kv_repl_get_info(kv_repl *r, kv_repl_info *out);

/* Stops the loop thread: pending submissions complete with KV_ECLOSED,
 * later ones are refused. Idempotent; kv_repl_get_info stays usable. */
void kv_repl_stop(kv_repl *r);

/* Stops (if not yet) and frees everything. Accepts NULL. */
void kv_repl_destroy(kv_repl *r);

#endif
