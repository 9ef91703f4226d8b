/*
 * placement.h - pure functions that decide who owns which key range.
 *
 * Every function takes the current configuration (never changed), and on
 * success returns a new configuration with epoch cur->epoch + 1 whose range
 * map already names the new owners and whose migrations list every range that
 * changes hands (doc/protocol.md). The caller publishes it (or not). Nothing
 * here includes the generated protobuf header, does I/O or takes a lock.
 *
 * Data sizes come from kv_place_point samples (built by the controller from
 * heartbeat split keys). When no sample carries any bytes (an empty cluster,
 * or no heartbeat yet), sizes are replaced by the width of the key space: a
 * key is read as a base-95 fraction of its first six bytes, each clamped to
 * printable ASCII 0x20..0x7e, and ranges are cut at keys interpolated in
 * that measure (printable, at most six bytes). So two empty nodes each get
 * about half of the printable key space, which is where keys typed by people
 * and tools live; keys outside it still belong to a range, they just do not
 * count when cutting. A join cuts that way only with the automatic balancer
 * off (kv_place_ctx.join_floor_bytes 0): with it on, a join into a cluster
 * with next to no data moves nothing (doc/scheduler.md "A new cluster").
 */
#ifndef KV_CONTROLLER_PLACEMENT_H
#define KV_CONTROLLER_PLACEMENT_H

#include "common/config.h"
#include "common/key.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One sample of the data distribution: about `bytes` bytes of data live in
 * [key, next sample). */
typedef struct {
	kv_bytes key;   /* where the mass starts (borrowed) */
	uint64_t bytes; /* its size */
} kv_place_point;

/* In/out parameters shared by every planning function. */
typedef struct {
	uint64_t next_mig_id;         /* in: first migration id to use; out: next free */
	uint32_t rate_limit_mb_s;     /* copied into the new migrations */
	const kv_place_point *points; /* data samples, any order (borrowed); may be NULL */
	size_t npoints;               /* entries in points */
	uint32_t replicas;            /* --replicas R; 0 or 1: every range is single */
	/* The automatic balancer is on and balances on bytes from this much
	 * data per node (kv_sched_bytes_floor): a single-copy join into a
	 * cluster holding less per node moves no range, and a join never cuts
	 * by key-space width (doc/scheduler.md "A new cluster"). 0: the
	 * balancer is off, a join spreads the key space as before. */
	uint64_t join_floor_bytes;
	/* Whether live `node` may still act as the primary of a key of
	 * [start, end): a configuration it may still be acting on (from the
	 * one it last reported applying to the latest) names it primary
	 * there. Such a member leaves no ISR and no replica set
	 * (doc/replication.md, "Primary transfer"). NULL: never. */
	bool (*serving)(void *arg, uint32_t node, kv_bytes start, kv_bytes end);
	void *serving_arg;
	char msg[256]; /* out: why a request was refused */
} kv_place_ctx;

/* Largest number of migrations one command creates (bounds the plan). */
#define KV_PLACE_MAX_STEPS 64

/*
 * Resolves a node named by id (non-zero) or by address. Gone nodes are
 * found by id only. Returns 0 and *out, or KV_ENOTFOUND / KV_EINVAL with x->msg.
 */
int kv_place_find_node(const kv_config *cur, uint32_t id, const char *address, kv_place_ctx *x,
                       uint32_t *out);

/*
 * Adds a node at `address`. The first node owns the whole key space; with
 * rebalance the newcomer (JOINING until its migrations finish) takes an even
 * share of the data from the others, else it is ACTIVE and owns nothing.
 * With x->join_floor_bytes (the balancer on), a cluster holding less data
 * per node than that (the newcomer counted) moves nothing either, and data
 * that cannot be cut at its samples is left to the balancer rather than cut
 * by key-space width.
 * With x->replicas R >= 2 nothing migrates: the newcomer is ACTIVE at once
 * and, with rebalance, every range with fewer than min(R, active nodes)
 * replicas gains replicas (kv_place_add_replicas), outside the ISR until its
 * primary asks to add them (kv_place_isr_change).
 * Returns 0 with *out and *node_id; KV_EEXISTS for an address registered and
 * not gone; KV_EINVAL for a malformed address. The caller frees *out.
 */
int kv_place_join(const kv_config *cur, const char *address, bool rebalance, kv_place_ctx *x,
                  kv_config **out, uint32_t *node_id);

/*
 * Drains a node: its ranges go to the other active nodes, balanced; it is
 * DRAINING until its last migration finishes and it is in no replica set
 * (GONE at once when it holds nothing). Replicated ranges move no data
 * here: where the node leads, another live ISR member becomes primary at
 * leader epoch n->epoch with the node kept in the ISR (the transfer fence,
 * doc/replication.md "Primary transfer"); where it is a replica, the
 * active node with the least data joins outside the ISR as its
 * replacement (kv_range.replacing), and the node leaves the replica set
 * when that replacement joins the ISR (kv_place_isr_change) or, with no
 * node to replace it, once it no longer serves the range
 * (kv_place_repair). KV_EBUSY when it is the destination of a migration
 * in flight or leads a range with no other active ISR member, KV_EINVAL
 * when gone or when no other node can take its single ranges, KV_EEXISTS
 * when it is already draining and nothing is left to do.
 */
int kv_place_leave(const kv_config *cur, uint32_t node, kv_place_ctx *x, kv_config **out);

/*
 * Gives [start, end) to `node`, carving it out of its current owners (one
 * migration per owner piece). KV_EINVAL for an empty or inverted range,
 * KV_EINVAL when the node is not active, KV_EBUSY when the range overlaps a
 * migration in flight. Replicated ranges (doc/replication.md, "Moves and
 * rebalance with replicas"; a move may not mix them with single ones,
 * KV_EINVAL) move no data here: where the node is in the ISR it becomes
 * primary at once (leader epoch n->epoch, the old primary kept in the ISR);
 * elsewhere it joins outside the ISR as the replacement of the primary, and
 * kv_place_repair gives it the role once it is in the ISR and then drops
 * the old primary. KV_EBUSY when the node is a replica outside the ISR,
 * the primary is down, or the range is being replaced already. *out is
 * NULL when the node owns the range already.
 */
int kv_place_move(const kv_config *cur, kv_bytes start, kv_bytes end, uint32_t node,
                  kv_place_ctx *x, kv_config **out);

/*
 * Cuts the replicated range holding `key` at `key`, in place (the
 * balancer's self-split, doc/scheduler.md "Primary counts"): both parts
 * keep the replica set, the ISR and the primary, and the part from `key`
 * on takes n->epoch as its leader epoch, which keeps the two apart. No
 * data moves. KV_EINVAL when key is empty, starts its range already or
 * lies in a single range (its parts would merge again); KV_EBUSY when the
 * range's primary is down, it has a transfer fence, a replacement or a
 * replica outside the ISR, or overlaps a migration.
 */
int kv_place_split(const kv_config *cur, kv_bytes key, kv_place_ctx *x, kv_config **out);

/*
 * Evens out data size across active nodes, moving as little as possible:
 * only the excess of nodes more than 5% above the mean, in contiguous
 * pieces; ranges left on draining nodes are drained first. *out is NULL
 * when nothing needs to move. With replicated ranges nothing migrates and
 * nothing splits: backups of the node holding the most data get
 * replacements on the node holding the least, then primary roles move to
 * the ISR member leading the least (the transfer fence), whole ranges at a
 * time, only where a step lowers the larger of the two loads.
 */
int kv_place_rebalance(const kv_config *cur, kv_place_ctx *x, kv_config **out);

/*
 * Ends migration `mig_id`. ok: it is dropped (the destination owns the range
 * already). !ok (failed or cancelled): the range goes back to the source.
 * Then a JOINING node with no incoming migration becomes ACTIVE and a
 * DRAINING node that owns nothing and moves nothing becomes GONE.
 * KV_ENOTFOUND for a migration not in flight.
 */
int kv_place_finish(const kv_config *cur, uint64_t mig_id, bool ok, kv_place_ctx *x,
                    kv_config **out);

/* Changes a node's address (a server restarted elsewhere). KV_EEXISTS when
 * another node that is not gone has it. */
int kv_place_readdress(const kv_config *cur, uint32_t node, const char *address, kv_place_ctx *x,
                       kv_config **out);

/*
 * Forgets a DOWN node (doc/contract.md §4 remove), or with `silent` (the
 * controller has not heard from it for the down delay) a JOINING or
 * DRAINING one, which keep their state when silent: its migrations end as
 * failed (their ids go to failed[0..*nfailed), capacity cur->nmigs), and
 * the ranges it then holds alone go, empty, to the active node with the
 * least data; the node becomes GONE. *lost gets the number of those
 * ranges. A replicated range drops the node from its replica set and ISR;
 * where it was the primary, another ISR member is promoted (leader epoch:
 * the new epoch); where it was the only ISR member the range is lost (with
 * accept_loss, its first other replica, else the active node with the least
 * data, becomes its primary alone in the ISR). With x->replicas >= 2 the
 * ranges then gain replicas as at a join. KV_EPERM when the node is not DOWN (nor silent), or when
 * it holds ranges and !accept_loss (nothing changes); KV_EBUSY when no active node can take them;
 * KV_ENOTFOUND for an unknown node.
 */
int kv_place_remove(const kv_config *cur, uint32_t node, bool silent, bool accept_loss,
                    kv_place_ctx *x, kv_config **out, uint32_t *lost, uint64_t *failed,
                    size_t *nfailed);

/* Sets the state of nodes ids[i] to states[i] (liveness: ACTIVE <-> DOWN).
 * KV_ENOTFOUND for an unknown id. Replica sets are left alone: see
 * kv_place_failover. */
int kv_place_set_state(const kv_config *cur, const uint32_t *ids, const kv_node_state *states,
                       size_t nids, kv_config **out);

/* One range that got a new primary in a failover (for the log). */
typedef struct {
	char start[64], end[64]; /* the range's bounds, printable */
	uint32_t from, to;       /* old and new primary */
	uint64_t leader_epoch;   /* the new leader epoch */
} kv_place_failover_ev;

/* What kv_place_failover did. */
typedef struct {
	uint32_t failovers;          /* ranges given a new primary */
	uint32_t stuck;              /* ranges led by a down node without a live ISR member */
	uint32_t shrinks;            /* ranges whose ISR lost a down member */
	size_t nev;                  /* entries in ev (at most the capacity) */
	kv_place_failover_ev ev[16]; /* the first failovers */
} kv_place_failover_stats;

/*
 * Fails over, in place, in n (a configuration being planned, epoch already
 * set) every replicated range led by a DOWN node: a live ISR member (not
 * down or gone; the one leading the fewest ranges, then the first in ISR
 * order) becomes its primary, its leader epoch becomes n->epoch, and the
 * down node leaves the ISR (it stays a replica). A range without a live ISR
 * member keeps its primary (unavailable). Every down node also leaves the
 * ISR of the ranges it does not lead. Single ranges are left alone. Adjacent
 * ranges that end up the same are merged. Returns 0 or KV_ENOMEM; st may
 * be NULL (doc/replication.md, "Failover").
 */
int kv_place_failover(kv_config *n, kv_place_failover_stats *st);

/*
 * Gives, in place, every range of n not covered by a migration in flight
 * and with fewer than min(replicas, active nodes) replicas the active nodes
 * it lacks, those holding the fewest replicas first (ties: the lowest id).
 * New replicas join the replica set only, never the ISR. Returns the number
 * of replicas added, or KV_ENOMEM.
 */
int kv_place_add_replicas(kv_config *n, uint32_t replicas);

/*
 * An ISR change asked by `primary` for [start, end) at leader_epoch
 * (AdminRequest.isr_change): exactly one of add and remove is non-zero.
 * KV_ESTALE unless primary leads every range overlapping [start, end) at
 * that leader epoch; KV_EINVAL for an empty range, a single range, an added
 * node that is not a replica, the primary removed, a removed node that is
 * not a replica; KV_EBUSY when the asking primary or the added node is
 * down. *out is the next
 * configuration (ranges split at start and end), or NULL when the change is
 * in effect already; *changed gets the number of ranges changed.
 */
int kv_place_isr_change(const kv_config *cur, uint32_t primary, kv_bytes start, kv_bytes end,
                        uint64_t leader_epoch, uint32_t add, uint32_t remove, kv_place_ctx *x,
                        kv_config **out, uint32_t *changed);

/*
 * The transfer fence of [start, end) answered the new primary's end of the
 * previous leader epoch in sync (IsrChange.unfence_node; doc/replication.md
 * "Primary transfer"): every range overlapping [start, end) with `member`
 * as its fence loses the fence, the member staying in the ISR. KV_ESTALE
 * unless primary leads every such range at leader_epoch, each fence is
 * `member` or none, and member is still in the ISR of those it fences;
 * KV_EINVAL for a bad request or a single range. *out is the next
 * configuration, or NULL when no fence is left (in effect already);
 * *changed gets the number of ranges changed.
 */
int kv_place_unfence(const kv_config *cur, uint32_t primary, kv_bytes start, kv_bytes end,
                     uint64_t leader_epoch, uint32_t member, kv_place_ctx *x, kv_config **out,
                     uint32_t *changed);

/* What kv_place_repair did (for the log and the metrics). */
typedef struct {
	uint32_t added;     /* replacement replicas added */
	uint32_t dropped;   /* replaced or leaving members dropped */
	uint32_t transfers; /* ranges whose primary role moved off a leaving node */
	uint32_t short_of;  /* ranges left under-replicated: no node to add */
	uint32_t gone;      /* leaving nodes that became gone */
} kv_place_repair_stats;

/*
 * The controller's standing repairs (doc/replication.md, "Repair"), on
 * the latest configuration: every replicated range whose primary is live
 * gets a replacement for each member in expired[0..nexpired) (DOWN nodes
 * past --down-after): the active node with the least data (by samples, or
 * fewest replicas when no sample has bytes), outside the ISR, recorded in
 * kv_range.replacing; with a full replica set the down member is dropped
 * instead of kept. A DRAINING node's ranges get what kv_place_leave gives
 * them. A replaced member whose replacement is in the ISR is dropped
 * (unless it may still serve, x->serving), and a leaving member with no
 * replacement available is dropped once it no longer serves. A range with
 * no node to add stays under-replicated. *out is NULL when nothing is due;
 * st may be NULL. Returns 0 or KV_ENOMEM.
 */
int kv_place_repair(const kv_config *cur, const uint32_t *expired, size_t nexpired, kv_place_ctx *x,
                    kv_config **out, kv_place_repair_stats *st);

/*
 * Writes a key cut strictly inside [start, end) at about the middle of the
 * key-space measure above into out (capacity 8) and its length into *outlen.
 * Returns false when the range is too narrow in that measure.
 */
bool kv_place_midpoint(kv_bytes start, kv_bytes end, uint8_t *out, size_t *outlen);

/* Writes key bytes printably (\xNN for other bytes, "" quoted) into buf. */
void kv_place_fmt_key(const void *key, size_t len, char *buf, size_t buflen);

/* Returns the sum of sample bytes that fall in ranges owned by `node`. */
uint64_t kv_place_node_bytes(const kv_config *cur, const kv_place_ctx *x, uint32_t node);

#endif
