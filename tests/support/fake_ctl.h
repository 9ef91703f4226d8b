/*
 * fake_ctl.h - a fake controller for shard server tests: a kv_rpc_server in
 * the test process that answers Register (node ids by address), Watch
 * (held up to 300 ms, answered with the configurations the test
 * published), GetConfig (the latest, or a pinned epoch), MigrationProgress
 * (a FENCED report can be held: fake_ctl_hold_fence), Heartbeat,
 * MigrationDone, Leave and the rest with OK, and records what it saw. The
 * test builds configurations with fake_cfg_* and publishes them in epoch
 * order.
 *
 * Used by test_server_integration, test_server_inproc,
 * test_server_migration and test_server_crash_handover until the shared
 * fake controller of tests/support/ replaces it. Failures abort the test
 * (cmocka asserts).
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

typedef struct {
	kv_rpc_pending *p; /* the deferred watch */
	uint64_t known;    /* its known_epoch */
	uint64_t since;    /* when it arrived, ms */
} fake_ctl_watch;

typedef struct {
	kv_rpc_server *rpc;                 /* the endpoint */
	char url[64];                       /* its URL */
	pthread_mutex_t mu;                 /* protects everything down to the blank line */
	kv_config *cfgs[FAKE_CTL_MAX_CFGS]; /* cfgs[i] has epoch i + 1 */
	size_t ncfgs;                       /* published configurations */
	char addrs[FAKE_CTL_MAX_NODES][64]; /* node i + 1 listens on addrs[i] */
	uint32_t nnodes;                    /* nodes known */
	fake_ctl_watch pend[128];           /* held watches */
	size_t npend;                       /* entries in pend */
	uint64_t done[256];                 /* MigrationDone ids received */
	size_t ndone;                       /* entries in done */
	unsigned heartbeats;                /* heartbeats received */
	uint64_t hb_range_keys;             /* largest per-range key count reported */
	unsigned registers;                 /* Register requests received */
	uint32_t last_resume;               /* resume_node_id of the last Register */
	bool accept_leave;                  /* answer AdminLeave with OK */
	uint32_t leave_from;                /* node that asked to leave */
	bool hold_fence;                    /* answer FENCED progress BUSY (the source retries) */
	int fence_status;                   /* else answer it with this wire status (0: OK) */
	unsigned fenced_seen;               /* FENCED progress reports received */
	uint64_t getconfig_epoch;           /* GetConfig answers this epoch; 0: the latest */

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

/* Appends a range starting at start (ranges in key order; ends filled later). */
void fake_cfg_range(fake_cfg *b, const char *start, uint32_t node);

/* Appends a migration of [start, end) from node `from` to node `to`. */
void fake_cfg_mig(fake_cfg *b, uint64_t id, const char *start, const char *end, uint32_t from,
                  uint32_t to);

/* Publishes the configuration (takes it) and answers every held watch.
 * Returns its epoch. */
uint64_t fake_cfg_publish(fake_ctl *f, fake_cfg *b);

/* Whether MigrationDone arrived for migration id. */
bool fake_ctl_done(fake_ctl *f, uint64_t id);

/* Waits up to ms for MigrationDone of id; fails the test otherwise. */
void fake_ctl_wait_done(fake_ctl *f, uint64_t id, unsigned ms);

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
