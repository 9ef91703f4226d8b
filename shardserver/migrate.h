/*
 * migrate.h - moving ranges between shard servers (doc/protocol.md
 * "Migrations"; wire: Transfer in shardkv.proto): the interface between
 * the server and its migrations.
 *
 * The cut. The server creates one kv_mig with a kv_mig_env: the modules a
 * migration works on (store, log, ownership table, exactly-once memory),
 * what it sends to peers (TLS, auth token) and four callbacks into the
 * server (node id, applied epoch, a controller call, a node's address).
 * The server then calls down: it starts and reconciles outgoing migrations
 * from its configuration thread (kv_mig_out_*), hands incoming transfer
 * messages over (kv_mig_in_handle), and on a write to a moving range locks
 * that range's migration and records the write through the accessors below.
 * Migration code never includes the server's headers and reaches the
 * server only through the env; the server never sees a migration struct.
 *
 * migrate_out.c is the source (one thread per outgoing migration),
 * migrate_in.c the destination (on nng's threads), migrate_hand.c the
 * handover file's entries both record commits in; migrate_int.h is shared
 * by those three files only.
 */
#ifndef KV_SHARDSERVER_MIGRATE_H
#define KV_SHARDSERVER_MIGRATE_H

#include "common/config.h"
#include "common/key.h"
#include "common/tls.h"
#include "shardserver/dedup/dedup.h"
#include "shardserver/durable/durable.h"
#include "shardserver/owner.h"
#include "proto/admin_codec.h"
#include "proto/data_codec.h"
#include "shardserver/store/store.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What migrations use of the server. Fixed at kv_mig_create; the modules
 * and the token are borrowed and must outlive kv_mig_destroy. The callbacks
 * are called from migration threads and nng threads, must take only leaf
 * locks and must not call back into kv_mig; node_addr may be called with
 * an incoming stream's mutex held, ctl_call is called with no lock held. */
typedef struct {
	kv_store *store;      /* the data */
	kv_dur *dur;          /* the log and snapshots */
	kv_owner *owner;      /* what this node serves */
	kv_dedup *dedup;      /* exactly-once memory */
	kv_tls *tls;          /* client configuration towards peers; NULL: plain tcp */
	kv_bytes auth;        /* token sent to peers; empty: none */
	size_t max_value;     /* largest value a stream may reassemble */
	bool chunks_unpacked; /* tests only: read no packed chunk entries (server.h) */
	const char *data_dir; /* holds the handover file (nodefile.h); NULL: none kept */
	void *arg;            /* passed to the callbacks */
	/* This node's id, 0 until registered. */
	uint32_t (*node_id)(void *arg);
	/* The last configuration epoch the server applied. */
	uint64_t (*epoch)(void *arg);
	/* Sends an AdminRequest to the controller; on 0 the caller frees *resp
	 * with kv_admin_resp_fini. Returns 0 or a transport KV_E* code. */
	int (*ctl_call)(void *arg, kv_admin_req *rq, kv_admin_resp *resp, uint32_t timeout_ms);
	/* Copies the address of node `id` in the latest configuration into
	 * addr (len bytes), or "" when it lists no such node. */
	void (*node_addr)(void *arg, uint32_t id, char *addr, size_t len);
	/* What this node holds changed for good: an incoming range was
	 * committed here, or a moved range deleted. Takes no lock; may be NULL. */
	void (*held_changed)(void *arg);
} kv_mig_env;

/* The migrations of one server, both directions (opaque). */
typedef struct kv_mig kv_mig;

/* One outgoing migration (opaque): ownership entries of a moving range
 * point to it (kv_owner_entry.mig). */
typedef struct kv_mig_out kv_mig_out;

/* The dedup fields of a recorded write (DeltaRecord.dedup). */
typedef struct {
	uint64_t client;    /* client id */
	uint64_t req;       /* request id */
	uint64_t value_len; /* append result */
	uint64_t time_ms;   /* when applied */
	bool has_del_value; /* a delete: del_value is what it returned */
	kv_bytes del_value; /* ... (at most KV_DEDUP_MAX_VALUE bytes) */
} kv_mig_dedup;

/* Creates the migration set (copies env) and reads the handover file of
 * env->data_dir. Returns 0, KV_ENOMEM, or the file's KV_ECORRUPT/KV_EIO. */
int kv_mig_create(const kv_mig_env *env, kv_mig **out);

/* Tells every migration task to return soon (streams stop retrying); does
 * not wait. Thread-safe. */
void kv_mig_stop(kv_mig *g);

/* Stops (kv_mig_stop), joins every migration thread and frees everything.
 * Accepts NULL. No other call may be in progress or follow. */
void kv_mig_destroy(kv_mig *g);

/* Starts the source task of migration m towards to_addr (copies both), unless
 * one with its id was started already. Returns 0 or KV_ENOMEM. Called by
 * the configuration thread. */
int kv_mig_out_start(kv_mig *g, const kv_migration *m, const char *to_addr);

/* Takes back the range of migration m, which moves away from here and
 * which the configuration still lists, where the ownership table has no
 * entry (after a restart; kv_owner_claim). When an earlier run of this node
 * may have committed m at its destination (the handover file says so), the
 * whole range is taken, fenced, with m's task attached and started, so
 * that nothing of it is served here before the task has learnt how the
 * handover ended.
 * Called by the configuration thread, before kv_mig_out_start. Returns 0,
 * KV_EINVAL (an empty range) or KV_ENOMEM. */
int kv_mig_out_claim(kv_mig *g, const kv_migration *m, const char *to_addr, uint64_t epoch);

/* Brings the outgoing migrations in line with configuration c: one that c
 * no longer lists is cancelled, or, when c gives its range to the
 * destination (an earlier run finished it), marked handed over. Called by
 * the configuration thread before it publishes c. */
void kv_mig_out_reconcile(kv_mig *g, const kv_config *c);

/* Whether an outgoing migration is still running and not yet reported done
 * to the controller (the graceful leave waits for none). */
bool kv_mig_out_pending(kv_mig *g);

/* Figures for /metrics: outgoing tasks running, and bulk copy bytes
 * acknowledged by destinations since start. */
void kv_mig_stats(kv_mig *g, uint64_t *active_out, uint64_t *bytes_sent);

/*
 * Accessors for the request path. The caller holds the ownership table's
 * read lock, which keeps m valid. Writes to a moving range take m's mutex
 * (kv_mig_out_lock, in ascending kv_mig_out_id when several), check
 * kv_mig_out_fenced under it, apply and record (kv_mig_out_record_locked),
 * then unlock: that makes the fence atomic with writes.
 */
uint64_t kv_mig_out_id(const kv_mig_out *m);
void kv_mig_out_lock(kv_mig_out *m);
void kv_mig_out_unlock(kv_mig_out *m);

/* Whether writes to the range are refused (the handover has begun). */
bool kv_mig_out_fenced(kv_mig_out *m);

/* The moving range and its destination, for a MOVING hint: pointers into m,
 * valid while the read lock is held. */
void kv_mig_out_target(const kv_mig_out *m, kv_bytes *start, kv_bytes *end, uint32_t *to,
                       const char **to_addr);

/* Records a write to the moving range for the catch-up (caller holds m's
 * mutex). value NULL means delete; dd NULL: no exactly-once fields. Copies
 * everything; out of memory makes the stream restart. */
void kv_mig_out_record_locked(kv_mig_out *m, const void *key, size_t klen, const void *value,
                              size_t vlen, const kv_mig_dedup *dd);
/* The same for a put that leaves the key with the deadline expire_at (Unix
 * ms; 0: none). */
void kv_mig_out_record_x_locked(kv_mig_out *m, const void *key, size_t klen, const void *value,
                                size_t vlen, uint64_t expire_at, const kv_mig_dedup *dd);

/* Answers one transfer message of rq into *ack (on an nng thread; never
 * waits for another server). */
void kv_mig_in_handle(kv_mig *g, const kv_req *rq, kv_xfer_ack *ack);

/* Whether this node applied the commit of incoming migration id (the
 * handover file says so: a restart between the commit and the published
 * handover). Then the stream is remembered as committed, so that the source
 * learns it, and the caller serves the range. Called by the configuration
 * thread. */
bool kv_mig_in_resume(kv_mig *g, const kv_migration *m);

/* Forgets an incoming stream the configuration dropped: removes its
 * INCOMING entries and, unless committed, the data it brought. Called by
 * the configuration thread. */
void kv_mig_in_forget(kv_mig *g, uint64_t id);

#endif
