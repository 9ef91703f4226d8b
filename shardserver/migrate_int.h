/*
 * migrate_int.h - the migration set shared by migrate_out.c (source),
 * migrate_in.c (destination) and migrate_hand.c (the handover file's
 * entries). Nothing else includes it.
 */
#ifndef KV_SHARDSERVER_MIGRATE_INT_H
#define KV_SHARDSERVER_MIGRATE_INT_H

#include "shardserver/migrate.h"
#include "shardserver/nodefile.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define KV_MIG_DELETE_STEP  1000u   /* entries deleted per step */
#define KV_MIG_DELETE_PAUSE 200u    /* microseconds between two steps (no lock held) */
#define KV_MIG_COUNT_SAMPLE 131072u /* keys the Begin's estimate walks at least */
#define KV_MIG_LOG_GROUP    256u    /* whole chunk entries per log record on the destination */
#define KV_MIG_PIPE         4u      /* transfer messages a source may have in flight */
#define KV_MIG_GAP_WAIT_MS  200u    /* a message that overtook its predecessor waits */

struct kv_mig_in;
struct kv_mig_applier;

struct kv_mig {
	kv_mig_env env;                  /* the server's side (immutable) */
	atomic_bool stopping;            /* kv_mig_stop: tasks return */
	atomic_uint_fast64_t bytes_sent; /* bulk copy bytes acked, for /metrics */

	pthread_mutex_t mu;    /* protects outs and ins (the lists, not the items): a leaf */
	kv_mig_out *outs;      /* every outgoing migration started since creation */
	struct kv_mig_in *ins; /* every incoming stream seen since creation */

	struct kv_mig_applier *applier; /* migrate_in.c: applies bulk-copy chunks */

	pthread_mutex_t hmu;   /* protects hand and nhand, and is held while the
	                          handover file is written: a leaf */
	kv_handover_ent *hand; /* the handover file's entries (KV_HANDFILE_MAX) */
	size_t nhand;          /* entries in hand */
};

/* migrate_hand.c: the handover file's entries, read from env.data_dir
 * (0, KV_ENOMEM, or the file's KV_ECORRUPT/KV_EIO, logged); their end. */
int kv_mig__hand_init(kv_mig *g);
void kv_mig__hand_fini(kv_mig *g);

/* Whether configuration c lists migration id. */
bool kv_mig__listed(const kv_config *c, uint64_t id);

/* Whether the handover file lists migration id in direction `out`. */
bool kv_mig__hand_has(kv_mig *g, uint64_t id, bool out);

/* Forgets the entries of migrations that configuration c no longer lists
 * though it is as new as the one that listed them first (they have ended);
 * the file itself drops them with its next write. */
void kv_mig__hand_prune(kv_mig *g, const kv_config *c);

/* Adds migration id (first listed at `epoch`) in direction `out` to the
 * handover file and writes the file (fsync) before it returns. Returns 0,
 * KV_ELIMIT (full), or the write's error (the entry is then not added). */
int kv_mig__hand_add(kv_mig *g, uint64_t id, uint64_t epoch, bool out);

/* This node's id (0 until registered). */
static inline uint32_t
kv_mig__node_id(kv_mig *g)
{
	return g->env.node_id(g->env.arg);
}

/* The epoch of the server's latest configuration. */
static inline uint64_t
kv_mig__epoch(kv_mig *g)
{
	return g->env.epoch(g->env.arg);
}

/* A controller call (kv_mig_env.ctl_call). */
static inline int
kv_mig__ctl_call(kv_mig *g, kv_admin_req *rq, kv_admin_resp *resp, uint32_t timeout_ms)
{
	return g->env.ctl_call(g->env.arg, rq, resp, timeout_ms);
}

/* Tells the server that what this node holds changed (kv_mig_env.held_changed). */
static inline void
kv_mig__held_changed(kv_mig *g)
{
	if (g->env.held_changed != NULL)
		g->env.held_changed(g->env.arg);
}

/* Sleeps up to ms, returning early once the set stops. */
static inline void
kv_mig__nap(kv_mig *g, unsigned ms)
{
	while (ms > 0 && !atomic_load(&g->stopping)) {
		unsigned step = ms < 20 ? ms : 20;
		struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)step * 1000000L};
		nanosleep(&ts, NULL);
		ms -= step;
	}
}

/* migrate_in.c: frees every incoming stream of the list (no call in
 * progress). */
void kv_mig__ins_free(struct kv_mig_in *in);

/* migrate_in.c: the bulk-copy applier's state (its thread starts with the
 * first chunk); 0 or KV_ENOMEM. Its end stops and joins the thread (no call
 * in progress). */
int kv_mig__applier_init(kv_mig *g);
void kv_mig__applier_fini(kv_mig *g);

#endif
