/*
 * fake_ctl.h - the fake controller of the tests: a kv_rpc_server in the test
 * process that serves both sides of the admin protocol (doc/protocol.md,
 * "Servers and the controller") from one configuration history that the
 * test publishes in epoch order:
 *
 * - servers: Register (node ids by address), Heartbeat, MigrationProgress
 *   (a FENCED report can be held: fake_ctl_hold_fence), MigrationDone, the
 *   graceful Leave (refused unless accept_leave);
 * - clients and the CLI: GetConfig (the latest, a pinned epoch, or a given
 *   one; NOT_FOUND for an epoch never published), Status (made-up
 *   statistics: node i has 10 * i keys and 100 * i bytes), Join, Leave,
 *   IsrChange (recorded, answered OK with the latest epoch),
 *   Move and Rebalance answered as a controller would (the next epoch, a
 *   new node the next id, Leave and Move of a known node the migration
 *   FAKE_CTL_MIG_ID, an unknown node NOT_FOUND) without changing the
 *   configuration: the test publishes what it wants;
 * - both: Watch, answered at once when a newer configuration exists, else
 *   held (deferred) until fake_cfg_publish or for 300 ms; with history it
 *   answers every configuration after the known epoch, else the latest.
 *
 * It records what it saw (counters below). The struct is open: tests read
 * and set the fields mu protects while holding mu. The fake shard servers
 * of the client tests are in fake_cluster.h, built on this one.
 * Failures abort the test (cmocka asserts).
 */
#ifndef KV_TESTS_FAKE_CTL_H
#define KV_TESTS_FAKE_CTL_H

#include "common/config.h"
#include "common/rpc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define FAKE_CTL_MAX_NODES 4   /* nodes the fake knows */
#define FAKE_CTL_MAX_CFGS  512 /* configurations it can publish */
#define FAKE_CTL_MAX_WATCH 128 /* watches it holds at once */
#define FAKE_CTL_MIG_ID    42  /* the migration id answered to Leave and Move */

typedef struct {
	kv_rpc_pending *p; /* the deferred watch */
	uint64_t reqid;    /* its request_id, echoed */
	uint64_t known;    /* its known_epoch */
	bool history;      /* it asked for every configuration after known */
	uint64_t since;    /* when it arrived, ms */
} fake_ctl_watch;

typedef struct {
	kv_rpc_server *rpc;                      /* the endpoint */
	char url[64];                            /* its URL */
	pthread_mutex_t mu;                      /* protects everything down to the blank line */
	kv_config *cfgs[FAKE_CTL_MAX_CFGS];      /* cfgs[i] has epoch first + i */
	size_t ncfgs;                            /* published configurations */
	uint64_t first;                          /* epoch of cfgs[0]; 0 before the first publish */
	char addrs[FAKE_CTL_MAX_NODES][64];      /* node i + 1 listens on addrs[i] */
	uint32_t nnodes;                         /* nodes known */
	fake_ctl_watch pend[FAKE_CTL_MAX_WATCH]; /* held watches */
	size_t npend;                            /* entries in pend: watches parked now */
	uint64_t done[256];                      /* MigrationDone ids received */
	size_t ndone;                            /* entries in done */
	unsigned heartbeats;                     /* heartbeats received */
	uint64_t hb_range_keys;                  /* largest per-range key count reported */
	unsigned registers;                      /* Register requests received */
	uint32_t last_resume;                    /* resume_node_id of the last Register */
	unsigned get_configs;                    /* GetConfig requests received */
	bool accept_leave;                       /* answer Leave of a known node with OK */
	uint32_t leave_from;                     /* node named by the last Leave */
	bool hold_fence;          /* answer FENCED progress BUSY (the source retries) */
	int fence_status;         /* else answer it with this wire status (0: OK) */
	unsigned fenced_seen;     /* FENCED progress reports received */
	uint64_t getconfig_epoch; /* GetConfig of the latest answers this epoch; 0: the latest */
	unsigned isr_adds;        /* IsrChange{add} requests received (answered OK) */
	uint32_t isr_added;       /* ... the node named by the last one */
	unsigned isr_removes;     /* IsrChange{remove} requests received (answered OK) */
	uint32_t isr_removed;     /* ... the node named by the last one */

	pthread_t ticker; /* answers held watches after 300 ms */
	atomic_bool stop; /* stops the ticker */
} fake_ctl;

/* A configuration under construction. */
typedef struct {
	kv_config *c; /* the configuration */
} fake_cfg;

/* Starts a fake controller on a free loopback port (f->url). */
fake_ctl *fake_ctl_start(void);

/* Stops it and frees every published configuration. Accepts NULL. */
void fake_ctl_stop(fake_ctl *f);

/* Pre-assigns node ids to addresses (node i + 1 is addrs[i]). */
void fake_ctl_add_node(fake_ctl *f, const char *url);

/* A new configuration of the next epoch listing every known node, ACTIVE. */
fake_cfg fake_cfg_new(fake_ctl *f);

/* The same at a given epoch (a configuration the test serves elsewhere, or
 * publishes first: the history may start at any epoch). */
fake_cfg fake_cfg_at(fake_ctl *f, uint64_t epoch);

/* A configuration at `epoch` (0: the next) listing every known node, with
 * [, split) owned by node lo and [split, ) by node hi, or one range owned by
 * lo when split is NULL or lo == hi. */
fake_cfg fake_cfg_owners(fake_ctl *f, uint64_t epoch, const char *split, uint32_t lo, uint32_t hi);

/* Appends a range starting at start (ranges in key order; ends filled later). */
void fake_cfg_range(fake_cfg *b, const char *start, uint32_t node);

/* Gives the last range appended the replica set replicas[0..nrep) (the
 * first is its primary, `node`) and the in-sync set isr[0..nisr) (primary
 * first), at leader epoch leader_epoch (0: the configuration's epoch). */
void fake_cfg_replicas(fake_cfg *b, const uint32_t *replicas, uint32_t nrep, const uint32_t *isr,
                       uint32_t nisr, uint64_t leader_epoch);

/* Appends a migration of [start, end) from node `from` to node `to`. */
void fake_cfg_mig(fake_cfg *b, uint64_t id, const char *start, const char *end, uint32_t from,
                  uint32_t to);

/* Publishes one range over the whole key space with replicas rep[0..nrep)
 * (rep[0] its primary), ISR isr[0..nisr) and leader epoch le (0: the new
 * configuration's epoch); returns its epoch. */
uint64_t fake_ctl_publish_replicas(fake_ctl *f, const uint32_t *rep, uint32_t nrep,
                                   const uint32_t *isr, uint32_t nisr, uint64_t le);

/* Publishes the configuration (takes it; its epoch must follow the latest)
 * and answers every held watch. Returns its epoch. */
uint64_t fake_cfg_publish(fake_ctl *f, fake_cfg *b);

/* Publishes fake_cfg_owners(f, 0, split, lo, hi); returns its epoch. */
uint64_t fake_ctl_publish_owners(fake_ctl *f, const char *split, uint32_t lo, uint32_t hi);

/* Whether MigrationDone arrived for migration id. */
bool fake_ctl_done(fake_ctl *f, uint64_t id);

/* Waits up to ms for MigrationDone of id; fails the test otherwise. */
void fake_ctl_wait_done(fake_ctl *f, uint64_t id, unsigned ms);

/* Waits up to ms until MigrationDone of id arrived twice (its source reported
 * it, restarted, and handed the range over again); fails the test otherwise. */
void fake_ctl_wait_done_again(fake_ctl *f, uint64_t id, unsigned ms);

/* Waits up to ms until more than `after` Register requests arrived (read
 * `registers` under mu first); returns the resume_node_id of the last one.
 * Fails the test otherwise. */
uint32_t fake_ctl_wait_register(fake_ctl *f, unsigned after, unsigned ms);

/* Waits up to ms until a Leave named node; fails the test otherwise. */
void fake_ctl_wait_leave(fake_ctl *f, uint32_t node, unsigned ms);

/* The drain of a leaving node as a controller runs it: publishes `node`
 * DRAINING with the whole key space moving to node `to` (migration mig_id),
 * waits up to ms for its MigrationDone, then publishes `node` GONE. Returns
 * the last epoch. */
uint64_t fake_ctl_drain(fake_ctl *f, uint32_t node, uint32_t to, uint64_t mig_id, unsigned ms);

/* Holds the fence: from now on the controller's answer to a source's FENCED
 * report is BUSY, so the source stays fenced between the destination's fence
 * acknowledgement and the commit (it asks again with backoff). */
void fake_ctl_hold_fence(fake_ctl *f);

/* Waits up to ms until a FENCED report arrived while the fence was held;
 * fails the test otherwise. */
void fake_ctl_wait_fenced(fake_ctl *f, unsigned ms);

/* Stops holding: the next FENCED reports get `status` (0: OK, the source
 * commits; SHARDKV__STATUS__STATUS_NOT_FOUND: the migration is no longer
 * listed, the source lifts the fence and keeps the range). */
void fake_ctl_release_fence(fake_ctl *f, int status);

#endif
