/*
 * repl.h - the replication stream of a shard server (doc/replication.md
 * "Writes"): as a primary, every logged client write to a range with
 * in-sync backups goes to each of them, and replies wait for their
 * acknowledgements; as a backup, the records a primary sends are checked,
 * applied and logged.
 *
 * (kv_rs: "replication stream"; the controller's own Raft replication owns
 * the kv_repl_ names, and the wire messages are proto/repl_codec.h's.)
 *
 * The cut. The server creates one kv_rs with a kv_rs_env (the log, what
 * it sends to peers, a few callbacks into the server) and calls down: the
 * configuration thread gives it every configuration it applies
 * (kv_rs_apply_config); the request path brackets each write with
 * kv_rs_write_begin/end (which hands it a log tap, kv_dur_tap) and holds
 * replies until kv_rs_covered; incoming Replicate requests go to
 * kv_rs_handle. This module never includes the server's headers.
 *
 * Primary side. One stream per backup node, carrying every range this node
 * leads whose ISR holds that node, or that it is copying to that node. The log tap runs under the
 * log's mutex (kv_dur_tap), so each stream's queue is in lsn order; a stream thread sends batches
 * (several in flight) and the backup answers with cumulative watermarks (ReplicateAck.acked_lsn).
 * The commit point covers lsn L when every stream has acknowledged every queued record <= L.
 *
 * Backup side. A batch is applied in stream order (seq; a gap is answered
 * with the sequence held), record by record, each only when the
 * configuration names the sender as the range's primary at the record's
 * leader epoch and this node as one of its replicas; records at or below the lsn
 * already applied from that stream are skipped. Records are applied and
 * logged with kv_dur_apply_record (recovery's own apply), and acknowledged
 * once the local log holds them by its --fsync mode.
 *
 * Shrink. A stream with records outstanding and no acknowledgement for
 * SHRINK_MS asks (env.isr_remove) that its backup leave the ISR of every
 * range this node leads with it; replies keep waiting for that backup
 * until the configuration without it is applied.
 *
 * Catch-up and expand (doc/replication.md "Catch-up"). A replica outside
 * the ISR of a range this node leads (and not down) gets the stream too:
 * under the routing table's write lock its range's records start going to
 * it behind a copy marker, and the stream sends the copy (the range's
 * exactly-once entries and keys as log records, in steps, the first
 * dropping what the replica held of the range) before them. Its
 * acknowledgements count for nothing until it has caught up; then it is
 * counted and, once it has every record queued before that, this node asks
 * for it to join the ISR (env.isr_add). A replica applies copy steps only
 * while outside the range's ISR in its own configuration.
 *
 * Failover. A range this node now leads after a failover gets streams to
 * its new ISR, each starting with this node's end of the previous leader
 * epoch (reconciliation): a backup whose own end differs answers diverged,
 * and this node asks for it to leave the ISR (then copies it). Until every
 * end is answered in sync the commit point covers nothing. A range it led
 * with backups and no longer leads (demoted) fences the writes in flight:
 * their replies fail (they may or may not survive), never succeed
 * (kv_rs_fenced). Before a primary transfer takes effect here, the range
 * refuses writes while its backups acknowledge its records (at most 30 ms,
 * the drain); the old primary then answers the new one's end in sync when
 * nothing of the range was outstanding on its stream to it, and the new
 * primary asks the controller to end the transfer fence (env.isr_unfence)
 * instead of having it copied again.
 */
#ifndef KV_SHARDSERVER_REPL_REPL_H
#define KV_SHARDSERVER_REPL_REPL_H

#include "common/config.h"
#include "common/key.h"
#include "common/tls.h"
#include "shardserver/dedup/dedup.h"
#include "shardserver/durable/durable.h"
#include "shardserver/store/store.h"
#include "proto/data_codec.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What replication uses of the server. Fixed at kv_rs_create; the log and
 * the token are borrowed and must outlive kv_rs_destroy. The callbacks
 * take only leaf locks and never call back into kv_rs. */
typedef struct {
	kv_dur *dur;      /* the log (and through it the store and dedup memory) */
	kv_store *store;  /* the data, read by copies to replicas outside the ISR */
	kv_dedup *dedup;  /* the exactly-once memory, read by those copies */
	kv_tls *tls;      /* client configuration towards peers; NULL: plain tcp */
	kv_bytes auth;    /* token sent to peers; empty: none */
	void *arg;        /* passed to the callbacks */
	uint32_t wait_ms; /* how long a reply waits for the backups; 0: 3000 */
	uint64_t boot_id; /* random per start: names this start's streams */
	/* The data dir: this node's positions as a replica are kept there
	 * (doc/replication.md "Catch-up from the replica's own data"); NULL:
	 * none kept, every return is copied. Borrowed. */
	const char *dir;
	/* A restart of this node on its data dir (doc/replication.md "Case (b):
	 * the old primary", "After a restart"): the boot id of the previous
	 * start (0: unknown, or its log may have lost synced records: a
	 * restarted old primary is copied), and what recovery found: its
	 * snapshot's lsn (every record below it folded into it; 1: none) and
	 * the last lsn it replayed (kv_dur_last_lsn before anything is
	 * logged). */
	uint64_t prev_boot;
	uint64_t rec_snap_lsn;
	uint64_t rec_last;
	/* --copy-rate: MB/s (10^6 bytes) of copy steps this node sends to
	 * replicas outside the ISR, all copies together (doc/replication.md
	 * "Catch-up"); 0: unlimited. */
	uint32_t copy_rate_mb_s;
	/* This node's id, 0 until registered. */
	uint32_t (*node_id)(void *arg);
	/* The last configuration epoch the server applied. */
	uint64_t (*epoch)(void *arg);
	/* A peer named a leader epoch newer than the applied configuration:
	 * the configuration thread should ask the controller soon. */
	void (*hurry)(void *arg);
	/* Asks the controller to take `node` out of the ISR of [start, end),
	 * which this node leads at leader_epoch (doc/replication.md "ISR
	 * changes", Shrink). Called from a stream thread with no lock of ours
	 * held; may block up to about a second. Returns KV_OK (asked: the
	 * smaller ISR comes with a configuration), KV_ESTALE or KV_EINVAL (the
	 * controller refused: do not ask again before a new configuration), or
	 * another code (ask again later). NULL: never asks. */
	int (*isr_remove)(void *arg, const kv_bytes *start, const kv_bytes *end,
	                  uint64_t leader_epoch, uint32_t node);
	/* Asks the controller to add `node` to the ISR of [start, end) (Expand):
	 * the same contract as isr_remove. NULL: never asks. */
	int (*isr_add)(void *arg, const kv_bytes *start, const kv_bytes *end, uint64_t leader_epoch,
	               uint32_t node);
	/* Asks the controller to end the transfer fence `node` of [start, end),
	 * which answered this node's end of the previous leader epoch in sync
	 * (doc/replication.md "Primary transfer"): the same contract as
	 * isr_remove. NULL: never asks (the fence then leaves the ISR and is
	 * copied again). */
	int (*isr_unfence)(void *arg, const kv_bytes *start, const kv_bytes *end,
	                   uint64_t leader_epoch, uint32_t node);
} kv_rs_env;

typedef struct kv_rs kv_rs;

/* Creates the replication state (copies env). Returns 0 or KV_ENOMEM. */
int kv_rs_create(const kv_rs_env *env, kv_rs **out);

/* Fails every waiting reply with KV_ECLOSED and makes later waits fail at
 * once; the stream threads return soon. Does not wait. Thread-safe. */
void kv_rs_stop(kv_rs *g);

/* Stops, joins the stream threads and frees everything. Accepts NULL. No
 * other call may be in progress or follow. */
void kv_rs_destroy(kv_rs *g);

/* The minimum ISR size a write needs, from the configuration
 * (Config.min_insync; 1 in configurations from before it existed). */
uint32_t kv_rs_min_insync(const kv_config *c);

/* Takes the ranges of configuration c (borrowed during the call): which
 * this node leads with in-sync backups (streams to new backups start), and
 * who leads the ranges it backs up. Called by the configuration thread,
 * before the configuration is published. Returns 0 or KV_ENOMEM (the old
 * table stays). */
int kv_rs_apply_config(kv_rs *g, const kv_config *c);

/* Whether any stream exists, a range led here has too small an ISR, or a
 * replicated range lists this node among its replicas: false means no
 * write needs kv_rs_write_begin and no reply needs to wait (relaxed atomic
 * loads). */
bool kv_rs_active(kv_rs *g);

/* Whether a stream exists: from then on kv_rs_active stays true, so every
 * write takes the routing table (kv_rs_write_begin) and a new table waits
 * for all of them. */
bool kv_rs_streaming(kv_rs *g);

/* One write's hold on the routing table (kv_rs_write_begin). */
typedef struct {
	kv_rs *g;       /* NULL: nothing held */
	kv_dur_tap tap; /* tap.fn NULL: the range has no in-sync backups */
	/* A write over several replicated ranges none of which has a backup
	 * in sync or being copied: the catch-up buffer keeps its record under
	 * the span of those ranges (borrowed from the routing table, held). */
	kv_bytes span_start, span_end; /* empty end: no bound */
	uint64_t span_epoch;
} kv_rs_op;

/*
 * Before a write to keys[0..n) that this node serves: takes the routing
 * table's read lock (held until kv_rs_write_end, across the apply and the
 * log append) and, when the keys' range has in-sync backups, fills op->tap
 * for the log append. Refuses with KV_EUNAVAIL when the ISR is smaller than
 * the minimum, with KV_EINVAL when the keys span ranges one of which has
 * backups in sync or being copied (one record goes to one set of
 * backups), with
 * KV_EBUSY when the routing table still names another primary of a
 * replicated range (the server's owner table took the range over first;
 * the configuration is still being applied); *why says why. On error
 * nothing is held.
 */
int kv_rs_write_begin(kv_rs *g, const kv_bytes *keys, size_t n, kv_rs_op *op, const char **why);
void kv_rs_write_end(kv_rs_op *op);

/* Whether a write whose request began at t0_ns (kv_now_ns) may have logged
 * records of a range this node has since stopped leading (a demotion): its
 * reply must then fail (timeout-class), never succeed. One relaxed atomic
 * load. */
bool kv_rs_fenced(kv_rs *g, uint64_t t0_ns);

/* Whether every in-sync backup has acknowledged every record <= lsn
 * (lock-free). */
bool kv_rs_covered(kv_rs *g, uint64_t lsn);

/* Calls done(arg, 0) once kv_rs_covered(lsn) (inline when it already
 * is), done(arg, KV_ETIMEDOUT) after env.wait_ms without, or done(arg,
 * KV_ECLOSED) on kv_rs_stop. done runs on a stream thread (or nng's, over
 * TLS) or the caller's, and
 * must not call into kv_rs. Returns 0 (done will be called exactly once)
 * or KV_ENOMEM / KV_ECLOSED (never called). */
int kv_rs_notify(kv_rs *g, uint64_t lsn, kv_wal_done_fn done, void *arg);

/* Answers one Replicate request (rq->has_repl) into *ack, on a thread that
 * may wait (an rpc worker): at most about 50 ms for an earlier batch, then
 * for the local log. */
void kv_rs_handle(kv_rs *g, const kv_req *rq, kv_repl_ack *ack);

/* As kv_rs_handle, on a thread that must not wait (an event loop): returns
 * KV_EBUSY, having changed nothing, for a message whose handling may wait
 * (a copy or catch-up step, an end, a batch ahead of its predecessor, the
 * followers' state held by another thread); else 0 with *ack made, to be
 * sent once the local log holds *lsn (0: at once). */
int kv_rs_handle_nowait(kv_rs *g, const kv_req *rq, kv_repl_ack *ack, uint64_t *lsn);

/* Figures for status and tests. */
typedef struct {
	uint64_t streams;      /* streams to backups */
	uint64_t queued;       /* records sent or to send, not yet acknowledged */
	uint64_t sent_batches; /* Replicate requests sent */
	uint64_t sent_packed;  /* ... of them records packed in one field (the backup reads them) */
	uint64_t resends;      /* times a stream started again from its watermark */
	uint64_t applied;      /* records applied as a backup */
	uint64_t refused;      /* batches refused as a backup */
	uint64_t shrink_asks;  /* IsrChange{remove} requests sent (one per range) */
	uint64_t demotions;    /* configurations that took a range with backups away */
	uint64_t copies;       /* copies to replicas outside the ISR started (attempts) */
	uint64_t copied;       /* ... completed */
	uint64_t copy_recs;    /* records sent in copy steps */
	uint64_t expand_asks;  /* IsrChange{add} requests sent (one per range) */
	uint64_t diverged;     /* backups found diverged after a failover (reconciliation) */
	/* Primary transfers away from this node (ranges) with nothing
	 * outstanding on the stream to the new primary (it stays in sync) and
	 * with something (it is copied again). */
	uint64_t clean_demotions;
	uint64_t unclean_demotions;
	uint64_t ends_in_sync; /* old primaries that answered this node's end in sync */
	/* New primaries' ends this node answered in sync as a backup although it
	 * had applied more of the old primary's records, all of other ranges
	 * (doc/replication.md "Reconciliation after a transfer"). */
	uint64_t ends_ahead_in_sync;
	uint64_t unfence_asks; /* IsrChange{unfence} requests sent (one per range) */
	/* Replicas outside the ISR caught up from their own data, without a copy
	 * (ranges), and catch-ups offered that the replica refused (a copy
	 * followed). */
	uint64_t catchups;
	uint64_t catchup_refusals;
	uint64_t copy_bytes; /* record payload bytes sent in copy and catch-up steps */
	/* ... of which in copies of ranges below their --min-insync when
	 * queued, which --copy-rate does not hold back */
	uint64_t copy_urgent_bytes;
	uint64_t copy_holds; /* waits of a stream thread for --copy-rate before a copy step */
} kv_rs_stats;
void kv_rs_stats_get(kv_rs *g, kv_rs_stats *st);

/* How far one backup is behind this primary (the stream to it). */
typedef struct {
	uint32_t node;    /* the backup */
	uint64_t records; /* records queued for it and not acknowledged */
	uint64_t lsns;    /* lsn of the last record queued minus its watermark (0: none) */
	uint64_t ms;      /* with records outstanding, ms since its last acknowledgement
	                     progress (or since they became outstanding); else 0 */
} kv_rs_lag;

/* Fills out[0..max) with the lag of each stream (by backup); returns how
 * many there are (more than max when out was short). */
size_t kv_rs_lag_get(kv_rs *g, kv_rs_lag *out, size_t max);

#endif
