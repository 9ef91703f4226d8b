/*
 * scheduler.h - the automatic balancer's planner (doc/scheduler.md): a
 * deterministic function of the configuration (its pins included:
 * kv_config_pin), per-range figures from the heartbeats and the planner's
 * own memory (cool-downs, hot windows)
 * that proposes the next changes: moves (single ranges, data migrates),
 * primary transfers (replicated ranges, no data moves), merges of small
 * cold neighbours, and reports of hot keys. It changes no configuration:
 * the controller carries a decision out through kv_place_move, like the
 * `move` command. Nothing here does I/O, takes a lock or reads a clock.
 */
#ifndef KV_CONTROLLER_SCHEDULER_H
#define KV_CONTROLLER_SCHEDULER_H

#include "common/config.h"
#include "common/key.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Quantile keys per range and dimension the planner uses (the eighths). */
#define KV_SCHED_QUANTS 7

/* The figures of one range of the configuration, from its primary's
 * heartbeats (borrowed keys). */
typedef struct {
	bool known;                   /* the primary reported the range */
	uint64_t bytes;               /* key + value bytes */
	double ops;                   /* reads + writes per second (decayed) */
	size_t nq;                    /* entries in q (0..KV_SCHED_QUANTS) */
	kv_bytes q[KV_SCHED_QUANTS];  /* strictly inside, in key order, cutting the
	                                 range into nq + 1 parts of about equal bytes */
	size_t nlq;                   /* entries in lq (0..KV_SCHED_QUANTS) */
	kv_bytes lq[KV_SCHED_QUANTS]; /* strictly inside, in key order, cutting the
	                                 range into nlq + 1 parts of about equal
	                                 load; none: load_key alone is used */
	kv_bytes load_key;            /* strictly inside, halves the load; empty: none */
	kv_bytes hot_key;             /* one key with at least half the load; empty: none */
	double hot_share;             /* its share, 0..1 */
} kv_sched_fig;

/* Tunables (controller flags, doc/scheduler.md). */
typedef struct {
	uint64_t split_bytes;    /* --split-bytes: largest piece moved at once, and
	                            ranges larger are cut before they move */
	double split_ops;        /* --split-ops: a range busier than this for
	                            sustain_ms is cut at its load key */
	uint32_t max_migrations; /* --max-migrations K: in flight cluster-wide */
	double tolerance;        /* a node more than this fraction above the mean
	                            (bytes or ops) starts a balancing step */
	uint64_t sustain_ms;     /* how long a range must stay hot */
	uint64_t cooldown_ms;    /* a range changed by a decision is left alone */
	bool cut_replicated;     /* a replicated range may be cut for a transfer
	                            (off by default: doc/scheduler.md "Limits") */
} kv_sched_params;

/* The defaults (doc/scheduler.md "Defaults"). */
void kv_sched_params_default(kv_sched_params *p);

/* The data per node below which the planner does not balance on bytes:
 * a sixteenth of split_bytes, at most 1 MiB (doc/scheduler.md). A join
 * with the balancer on moves nothing below it either. */
uint64_t kv_sched_bytes_floor(const kv_sched_params *p);

typedef enum {
	KV_SCHED_MOVE = 1,     /* a single range's data moves to `to` */
	KV_SCHED_TRANSFER = 2, /* a replicated range's primary role goes to `to` */
	KV_SCHED_MERGE = 3,    /* a small cold range moves onto its neighbour's node */
	KV_SCHED_HOT = 4,      /* a hot single key: reported, never split */
	KV_SCHED_SPLIT = 5,    /* a replicated range is cut in place (from == to):
	                          [start, end) is its upper part, which takes a new
	                          leader epoch; nothing else changes */
} kv_sched_kind;

/* Kinds are below this bound (arrays indexed by kv_sched_kind). */
#define KV_SCHED_KIND_MAX 6

typedef enum {
	KV_SCHED_WHY_BYTES = 1,    /* a node holds more than its share of the bytes */
	KV_SCHED_WHY_OPS = 2,      /* a node serves more than its share of the load */
	KV_SCHED_WHY_COLD = 3,     /* merge: both neighbours small and cold */
	KV_SCHED_WHY_HOTKEY = 4,   /* report: one key takes most of a range's load */
	KV_SCHED_WHY_PRIMARIES = 5 /* a node leads more than its share of the ranges */
} kv_sched_why;

/* Reasons are below this bound (arrays indexed by kv_sched_why). */
#define KV_SCHED_WHY_MAX 6

/* A node leading more than this fraction above the mean count of ranges
 * starts a count step (doc/scheduler.md "Primary counts"). */
#define KV_SCHED_COUNT_TOLERANCE 0.20

/* One decision; free its keys with kv_sched_decisions_fini. */
typedef struct {
	kv_sched_kind kind;
	kv_sched_why why;
	kv_buf start, end; /* the piece [start, end) (owned); end empty: the end of
	                      the key space */
	bool split;        /* the piece is part of a range: publishing cuts it */
	uint32_t from, to; /* the current primary, the new one (equal for
	                      KV_SCHED_SPLIT) */
	uint64_t bytes;    /* the piece's estimated bytes */
	double ops;        /* its estimated load */
} kv_sched_decision;

/* Frees the keys of d[0..n). */
void kv_sched_decisions_fini(kv_sched_decision *d, size_t n);

/* The planner's memory across rounds (opaque). */
typedef struct kv_sched kv_sched;

/* Returns a new memory, or NULL out of memory. */
kv_sched *kv_sched_new(void);
void kv_sched_free(kv_sched *s);

/*
 * Plans the next decisions on cfg (figs: cfg->nranges entries, aligned with
 * cfg->ranges) at time now_ms: at most cap into out, *n gets the count. With
 * commit, the hot windows advance and the decided ranges start their
 * cool-down (a dry run passes false and leaves the memory as it was).
 * Returns 0 or KV_ENOMEM.
 */
int kv_sched_plan(kv_sched *s, const kv_config *cfg, const kv_sched_fig *figs,
                  const kv_sched_params *p, uint64_t now_ms, bool commit, kv_sched_decision *out,
                  size_t cap, size_t *n);

/* Names for logs, status and metrics. */
const char *kv_sched_kind_name(kv_sched_kind k);
const char *kv_sched_why_name(kv_sched_why w);

#endif
