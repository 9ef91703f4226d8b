/*
 * inproc_cluster.h - a real controller (controller.h) and real shard
 * servers (inproc_srv.h) inside the test process, with short leases through
 * their create options, for the component tests of liveness and failover:
 * the fixture's setup and teardown, the controller stopped and started
 * again on its data dir, the latest configuration through a GetConfig, the
 * controller's /metrics, node states with a deadline, and the `shardkv` CLI
 * against the controller (cli_run.h). A failure fails the test.
 *
 * The struct is open: a test reads its servers (srv[i].url, srv[i].s) and
 * the controller's address (ctl_url); everything else is the module's.
 */
#ifndef KV_TESTS_SUPPORT_INPROC_CLUSTER_H
#define KV_TESTS_SUPPORT_INPROC_CLUSTER_H

#include "common/config.h"
#include "controller/controller.h"
#include "proto/admin_codec.h"
#include "tests/support/inproc_srv.h"

#include <stddef.h>
#include <stdint.h>

#define INPROC_CLUSTER_MAX 4 /* servers at the most */

/* The defaults of the options below (a field left 0 takes its default). */
#define INPROC_CLUSTER_NSRV        2
#define INPROC_CLUSTER_CONTEXTS    16u
#define INPROC_CLUSTER_LEASE_MS    500u /* controller and servers */
#define INPROC_CLUSTER_MARGIN_MS   300u /* down after LEASE + MARGIN */
#define INPROC_CLUSTER_RENEW_MS    50u
#define INPROC_CLUSTER_PATIENCE_MS 15000u /* upper bound of any wait on a busy machine */

/* What inproc_cluster_start() makes; 0 (NULL): the default. */
typedef struct {
	const char *name;         /* scratch directory /tmp/NAME.XXXXXX ("kvcluster") */
	int nsrv;                 /* servers prepared, not started (1..INPROC_CLUSTER_MAX) */
	unsigned contexts;        /* each server's request contexts */
	unsigned lease_ms;        /* the controller's lease and the servers' */
	unsigned lease_margin_ms; /* the controller's margin: down after lease + margin */
	unsigned lease_renew_ms;  /* the servers' renewal period */
	unsigned replicas;        /* the controller's --replicas; 0: its own default */
	unsigned down_after_s;    /* the controller's --down-after; 0: its own default */
	unsigned min_insync;      /* the controller's --min-insync; 0: its own default */
	bool no_expand;           /* servers never ask to add a replica to an ISR (a test
	                             of the controller keeps one outside) */
	unsigned patience_ms;     /* upper bound of any wait of this module */
	bool auto_balance;        /* the controller's --auto-balance on (default off) */
	uint64_t split_bytes;     /* its --split-bytes; 0: its own default */
	unsigned max_migrations;  /* its --max-migrations; 0: its own default */
	bool cut_replicated;      /* its balancer may cut replicated ranges */
	bool handover_unordered;  /* it publishes a primary transfer to the new primary
	                             without waiting for the old one to apply it */
} inproc_cluster_opts;

typedef struct {
	inproc_cluster_opts o;
	kv_controller *ctl; /* NULL: stopped */
	kv_controller_cfg ccfg;
	char ctl_url[64];                   /* the controller's --listen */
	char ctl_metrics[32];               /* its --metrics, a port of its own */
	char ctl_dir[200];                  /* its --data-dir, TMPDIR/ctl */
	char tmpdir[128];                   /* the scratch directory */
	inproc_srv srv[INPROC_CLUSTER_MAX]; /* server i is node i+1 when started in order */
} inproc_cluster;

/* A test's setup: zeroes c, keeps o with the defaults filled in c->o,
 * makes the scratch directory, picks free loopback ports for the
 * controller's RPC and metrics, starts the controller and prepares the
 * servers with inproc_srv_init() (none is started). */
void inproc_cluster_start(inproc_cluster *c, const inproc_cluster_opts *o);

/* A test's teardown, whatever the outcome: closes the cached raw clients,
 * destroys every server still there and the controller, removes the scratch
 * directory. */
void inproc_cluster_stop(inproc_cluster *c);

/* The same as a cmocka setup and teardown, for
 * cmocka_unit_test_prestate_setup_teardown(test, inproc_cluster_setup,
 * inproc_cluster_teardown, &c): *state is the test's inproc_cluster, whose
 * options (c.o) say what to start. Both return 0. */
int inproc_cluster_setup(void **state);
int inproc_cluster_teardown(void **state);

/* A cmocka test entry for test function f on the fixture *c (a pointer to
 * the test's static inproc_cluster). */
#define INPROC_CLUSTER_TEST(f, c)                                                                  \
	cmocka_unit_test_prestate_setup_teardown(f, inproc_cluster_setup, inproc_cluster_teardown, \
	                                         c)

/* Creates and starts the controller on its data dir (again). */
void inproc_cluster_ctl_up(inproc_cluster *c);

/* Stops and destroys the controller. */
void inproc_cluster_ctl_down(inproc_cluster *c);

/* Starts server i with the options' lease and renewal period. */
void inproc_cluster_srv_up(inproc_cluster *c, int i);

/* Sends q to the controller; returns the answer's error code (the
 * configuration it carries into *cfg when cfg is not NULL, NULL when the
 * answer is an error), or -1 when it does not answer within 2 s. *epoch
 * (when not NULL) gets the answer's epoch, why (when not NULL) its error
 * message. */
int inproc_cluster_admin(inproc_cluster *c, const kv_admin_req *q, kv_config **cfg, uint64_t *epoch,
                         char *why, size_t whylen);

/* The controller's latest configuration (the caller frees it), or NULL
 * when it is stopped, or running and not answering within the patience
 * (a call that times out is made again). */
kv_config *inproc_cluster_config(inproc_cluster *c);

/* Scrapes the controller's /metrics into buf (cap bytes, NUL-terminated,
 * truncated). */
void inproc_cluster_scrape_metrics(inproc_cluster *c, char *buf, size_t cap);

/* The state of node id in the latest configuration; 0 when unknown. */
int inproc_cluster_node_state(inproc_cluster *c, uint32_t id);

/* Waits until node id is in state st (polling every 10 ms, failing after
 * the patience); returns the ms it took. */
uint64_t inproc_cluster_wait_node_state(inproc_cluster *c, uint32_t id, kv_node_state st);

/* Runs `shardkv -c CTL_URL args...` (NULL-terminated, at most 12 args) in
 * the test process; returns its exit code, with stdout and stderr in out
 * and err (NUL-terminated, truncated). */
int inproc_cluster_cli(inproc_cluster *c, char *out, size_t outlen, char *err, size_t errlen, ...);

#endif
