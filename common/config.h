/*
 * config.h - a cluster configuration as plain C values: epoch, nodes, the
 * range map and the migrations in flight (doc/contract.md §2, doc/protocol.md).
 *
 * A kv_config is a value: every pointer in it is owned by it, it is never
 * changed after it is published, and it is freed with kv_config_free().
 * Conversions to and from the wire live in proto/config_codec.h.
 *
 * Range map invariant (kv_config_validate): ranges are sorted by start, the
 * first starts at "" and the last ends at "" (the end of the key space), each
 * starts where the previous ends, none is empty, every replica is a node of
 * the configuration that is not gone (at most once per range), the primary
 * leads both the replica set and the ISR, the ISR is a subset of the
 * replicas, and adjacent ranges differ in placement
 * (kv_range_same_placement).
 */
#ifndef KV_COMMON_CONFIG_H
#define KV_COMMON_CONFIG_H

#include "common/key.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Liveness and leases (doc/contract.md §2, doc/operations.md "Leases"), the
 * one place these numbers live. A server renews its lease with a light
 * heartbeat every KV_LEASE_RENEW_MS; its lease runs from the send time of
 * the last renewal the controller answered OK, for KV_LEASE_MS on the
 * monotonic clock, and it answers no data request once it has run out.
 * The controller leader declares a node down when it has received no
 * heartbeat for KV_LEASE_MS + KV_LEASE_MARGIN_MS (+ the Raft election
 * timeout when replicated: a deposed leader may renew leases for up to
 * one election timeout). The server measures from the send time, the
 * controller from the receive time, which is later, so the server always
 * stops first; the margin covers clock-rate drift between the two. Tests
 * shorten them through the create options of the controller and server.
 */
#define KV_LEASE_RENEW_MS  250u
#define KV_LEASE_MS        2000u
#define KV_LEASE_MARGIN_MS 1000u

typedef enum {
	KV_NODE_JOINING = 1,  /* registered, may not own ranges yet */
	KV_NODE_ACTIVE = 2,   /* serving */
	KV_NODE_DRAINING = 3, /* leaving: its ranges are moving away */
	KV_NODE_GONE = 4,     /* left or removed; owns nothing; its id is never reused */
	KV_NODE_DOWN = 5,     /* was active, missed heartbeats for longer than the lease
	                         (doc/contract.md §2); keeps its ranges */
} kv_node_state;

typedef enum {
	KV_MIG_PENDING = 1,   /* decided, the source has not started */
	KV_MIG_COPYING = 2,   /* bulk copy */
	KV_MIG_CATCHUP = 3,   /* sending writes that arrived during the copy */
	KV_MIG_FENCED = 4,    /* writes stopped, final handoff */
	KV_MIG_DONE = 5,      /* the destination serves the range */
	KV_MIG_CANCELLED = 6, /* cancelled before the fence */
	KV_MIG_FAILED = 7,    /* gave up; see error */
} kv_mig_phase;

typedef struct {
	uint32_t id;         /* assigned by the controller from 1, never reused */
	char *address;       /* the server's --listen URL (owned) */
	kv_node_state state; /* life-cycle state */
} kv_node;

/* The most replicas a range can have (controller --replicas). */
#define KV_MAX_REPLICAS 5

/*
 * One range of the map and its replica set (doc/replication.md). With
 * several replicas, replicas[0] and insync[0] are the primary (node) and
 * the ISR is a subset of the replicas. nreplicas == ninsync == 0 means the
 * primary is the only replica and the whole ISR: one copy, the form every
 * configuration had before replica sets (kv_range_set_single). Read the
 * sets through kv_range_nreplicas/kv_range_replica/kv_range_ninsync/
 * kv_range_insync, which see a single range as {node}. leader_epoch is the
 * configuration epoch in which the range's primary last changed, or in
 * which the balancer's self-split made it the upper part of a range cut in
 * place (kv_place_split); it never decreases for any key.
 */
typedef struct {
	kv_buf start;                       /* inclusive; empty: beginning of the key space */
	kv_buf end;                         /* exclusive; empty: end of the key space */
	uint32_t node;                      /* the primary: serves reads and writes */
	uint32_t nreplicas;                 /* 0 (single), or 2..KV_MAX_REPLICAS */
	uint32_t ninsync;                   /* 0 (single), or 1..nreplicas */
	uint32_t replicas[KV_MAX_REPLICAS]; /* node ids, primary first */
	uint32_t insync[KV_MAX_REPLICAS];   /* in-sync replicas, primary first */
	uint64_t leader_epoch;              /* epoch of the last change of primary */
	/* Replacements in progress (doc/replication.md, "Repair"):
	 * replacing[i] is a replica added in place of the member replaced[i]
	 * (a down, leaving or moved-away node), which leaves the replica set
	 * when replacing[i] joins the ISR. Both are replicas of the range. */
	uint32_t nreplacing;                 /* pairs; 0 for a single range */
	uint32_t replacing[KV_MAX_REPLICAS]; /* the new members */
	uint32_t replaced[KV_MAX_REPLICAS];  /* the members they replace */
	/* The previous primary, kept in the ISR only as the transfer fence
	 * (doc/replication.md, "Primary transfer"): it counts for the commit
	 * point but is never made primary, because what it applied and failed
	 * at its demotion stays in its store and exactly-once memory; it
	 * leaves the ISR at reconciliation and joins again after a copy. 0:
	 * none; else an ISR member other than the primary. */
	uint32_t fence;
} kv_range;

/* The replica set and ISR as lists, a single range being {node}. */
static inline uint32_t
kv_range_nreplicas(const kv_range *r)
{
	return r->nreplicas ? r->nreplicas : 1;
}
static inline uint32_t
kv_range_replica(const kv_range *r, uint32_t i)
{
	return r->nreplicas ? r->replicas[i] : r->node;
}
static inline uint32_t
kv_range_ninsync(const kv_range *r)
{
	return r->nreplicas ? r->ninsync : 1;
}
static inline uint32_t
kv_range_insync(const kv_range *r, uint32_t i)
{
	return r->nreplicas ? r->insync[i] : r->node;
}

typedef struct {
	uint64_t id;              /* assigned by the controller, never reused */
	uint64_t epoch;           /* the epoch that decided the move */
	kv_buf start;             /* the moving range [start, end) */
	kv_buf end;               /* empty: end of the key space */
	uint32_t from;            /* source node */
	uint32_t to;              /* destination node */
	kv_mig_phase phase;       /* progress as last reported */
	uint64_t keys_copied;     /* acknowledged by the destination */
	uint64_t bytes_copied;    /* acknowledged by the destination */
	uint64_t keys_total;      /* estimate; 0: unknown */
	uint64_t bytes_total;     /* estimate; 0: unknown */
	uint64_t rate_bytes_s;    /* measured copy rate */
	uint64_t eta_ms;          /* estimate; 0: unknown */
	uint32_t rate_limit_mb_s; /* 0: unlimited */
	uint64_t progress_age_ms; /* status only: since the last progress report */
} kv_migration;

/* A key span [start, end); an empty end is the end of the key space. */
typedef struct {
	kv_buf start, end;
} kv_span;

/* The most pins a configuration holds (kv_config_pin). */
#define KV_MAX_PINS 64

typedef struct {
	uint64_t epoch;     /* grows by one on every change, from 1 */
	uint64_t time_ms;   /* publication time, Unix milliseconds */
	char *cluster_id;   /* random id fixed at the first start (owned, may be NULL) */
	size_t nnodes;      /* entries in nodes */
	kv_node *nodes;     /* sorted by id */
	size_t nranges;     /* entries in ranges */
	kv_range *ranges;   /* the range map, sorted by start */
	size_t nmigs;       /* entries in migs */
	kv_migration *migs; /* migrations not finished, sorted by id */
	/* The minimum ISR size for a write to be acknowledged (controller
	 * --min-insync, doc/replication.md); 0 (configurations written before
	 * it existed) means 1. */
	uint32_t min_insync;
	/* Key spans an administrator's move pinned against the automatic
	 * balancer until the next rebalance (doc/scheduler.md "Pins"): sorted
	 * by start, disjoint and not adjacent (kv_config_pin keeps them so),
	 * independent of the range map, so cuts and merges keep them as they
	 * are. */
	size_t npins;
	kv_span *pins;
} kv_config;

/* Returns a new empty configuration (epoch 0, nothing in it), or NULL. */
kv_config *kv_config_new(void);

/* Frees a configuration and everything in it. Accepts NULL. */
void kv_config_free(kv_config *c);

/* Returns a deep copy, or NULL when out of memory. */
kv_config *kv_config_clone(const kv_config *c);

/* Checks the range map invariant above and that node ids are unique and
 * sorted and migrations name existing nodes. Returns 0 or KV_EINVAL. */
int kv_config_validate(const kv_config *c);

/* kv_config_validate that also says which rule failed (*why, static text)
 * and where (*at: the index of the node, range or migration it concerns). */
int kv_config_check(const kv_config *c, const char **why, size_t *at);

/* Returns the index of the range that contains key (binary search), or -1
 * when the map is empty. */
long kv_config_find_range(const kv_config *c, const void *key, size_t klen);

/* Makes node the range's primary and only replica. The leader epoch is
 * left to the caller. */
void kv_range_set_single(kv_range *r, uint32_t node);

/* True when two ranges have the same primary, replica set, ISR, leader
 * epoch and replacements, so that adjacent ones are one range. */
bool kv_range_same_placement(const kv_range *a, const kv_range *b);

/* The member that node is replacing in r, or 0 (replacing: node is a new
 * member) / the member replacing node, or 0 (!replacing). */
uint32_t kv_range_replacement(const kv_range *r, uint32_t node, bool replacing);

/* True when node is one of the range's replicas (in_isr: of its ISR). */
bool kv_range_has_replica(const kv_range *r, uint32_t node, bool in_isr);

/* Pins [start, end) (an empty end: the end of the key space) in c, merged
 * with the pins it overlaps or touches. Returns 0, KV_EINVAL for an empty
 * span, KV_ELIMIT when c would hold more than KV_MAX_PINS (c unchanged), or
 * KV_ENOMEM (c unchanged). */
int kv_config_pin(kv_config *c, kv_bytes start, kv_bytes end);

/* Removes every pin of c. */
void kv_config_unpin_all(kv_config *c);

/* True when [start, end) shares a key with a pin of c (covered: lies wholly
 * inside one). */
bool kv_config_pinned(const kv_config *c, kv_bytes start, kv_bytes end, bool covered);

/* Returns the node with this id, or NULL. */
const kv_node *kv_config_node(const kv_config *c, uint32_t id);

/* Returns the first node (not gone) with this address, or NULL. */
const kv_node *kv_config_node_by_address(const kv_config *c, const char *address);

/* Returns the migration in flight that covers key, or NULL. */
const kv_migration *kv_config_migration_for(const kv_config *c, const void *key, size_t klen);

/* Returns the node a client should send a request for key to: the source of
 * a migration in flight that covers the key, else the range owner; 0 when
 * the map is empty. */
uint32_t kv_config_route(const kv_config *c, const void *key, size_t klen);

/* Returns the name of a node state ("joining", "active", "draining", "gone",
 * "down"). */
const char *kv_node_state_name(kv_node_state s);

/* Returns the name of a migration phase ("pending", "copying", ...). */
const char *kv_mig_phase_name(kv_mig_phase p);

#endif
