/*
 * test_controller_inproc.c - controllers run inside the test process through
 * their life cycle (kv_controller_create / start / stop / destroy), driven
 * over loopback TCP with raw AdminRequest messages (common/rpc.h): a
 * standalone controller restarted on its data dir keeps its epochs, stop
 * answers a held watch and returns at once, start and create refuse a taken
 * address and a data dir in use, and a three-replica Raft group in one
 * process elects a leader, commits a join on every replica, survives the
 * leader's stop and lets the stopped replica catch up when it starts again;
 * and the group's leader declares a silent node down through Raft and
 * back when it heartbeats.
 *
 * Nothing here needs a process of its own: killing a controller with
 * SIGKILL is what test_cluster_raft and checker_kill_controller do.
 */
#include "common/err.h"
#include "common/rpc.h"
#include "controller/controller.h"
#include "proto/shardkv.pb-c.h"
#include "proto/wire.h"
#include "tests/support/ctl_client.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include <cmocka.h>

#define NREPL 3

/* Removes the test dir with everything in it (the controllers make
 * subdirectories that kv_test_dir_teardown does not remove). */
static int
teardown(void **state)
{
	kv_test_dir *d = *state;

	kv_test_rmtree(d->path);
	return kv_test_dir_teardown(state);
}

/* ---- requests ---- */

/* Sends rq (with a new request id unless it has one) and returns the
 * answer, or NULL when none came within timeout_ms. The caller frees it
 * with ctl_client_free(). */
static Shardkv__AdminResponse *
call(kv_rpc_client *cli, Shardkv__AdminRequest *rq, uint32_t timeout_ms)
{
	static _Atomic uint64_t next_rid = 1;
	int rv;

	rq->version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	if (rq->request_id == 0)
		rq->request_id = next_rid++;
	Shardkv__AdminResponse *r = ctl_client_call(cli, rq, timeout_ms, &rv);
	if (r == NULL) {
		assert_int_not_equal(rv, KV_EPROTO);
		return NULL;
	}
	assert_int_equal(r->request_id, rq->request_id);
	return r;
}

/* A join; client_id and request_id 0: none / a new one. */
static Shardkv__AdminResponse *
join_as(kv_rpc_client *cli, const char *addr, uint64_t client_id, uint64_t request_id)
{
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminJoin j = SHARDKV__ADMIN_JOIN__INIT;

	j.address = (char *)addr;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_JOIN;
	rq.join = &j;
	rq.client_id = client_id;
	rq.request_id = request_id;
	return call(cli, &rq, 10000);
}

static Shardkv__AdminResponse *
join(kv_rpc_client *cli, const char *addr)
{
	return join_as(cli, addr, 0, 0);
}

static Shardkv__AdminResponse *
get_config(kv_rpc_client *cli, uint64_t epoch)
{
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminGetConfig g = SHARDKV__ADMIN_GET_CONFIG__INIT;

	g.epoch = epoch;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_GET_CONFIG;
	rq.get_config = &g;
	return call(cli, &rq, 10000);
}

/* move START END NODE --dry-run, raw. */
static Shardkv__AdminResponse *
move_dry_run(kv_rpc_client *cli, const char *start, const char *end, uint32_t node)
{
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminDryRun d = SHARDKV__ADMIN_DRY_RUN__INIT;
	Shardkv__AdminMove m = SHARDKV__ADMIN_MOVE__INIT;
	Shardkv__NodeRef ref = SHARDKV__NODE_REF__INIT;

	ref.ref_case = SHARDKV__NODE_REF__REF_ID;
	ref.id = node;
	m.start.data = (uint8_t *)start;
	m.start.len = strlen(start);
	m.end.data = (uint8_t *)end;
	m.end.len = strlen(end);
	m.node = &ref;
	d.cmd_case = SHARDKV__ADMIN_DRY_RUN__CMD_MOVE;
	d.move = &m;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_DRY_RUN;
	rq.dry_run = &d;
	rq.client_id = 5;
	rq.request_id = 1;
	return call(cli, &rq, 10000);
}

/* ---- one controller ---- */

struct ctl {
	char url[64];             /* --listen */
	char raft[64];            /* its raft address (replicated) */
	char dir[300];            /* --data-dir */
	kv_controller_cfg cfg;    /* points into the fields above */
	kv_controller *c;         /* NULL: not running */
	kv_rpc_client *cli;       /* a client to it */
	const char *peers[NREPL]; /* replicated: every replica's url */
	const char *rpeers[NREPL];
};

static void
ctl_init(struct ctl *k, const char *base, const char *name)
{
	memset(k, 0, sizeof(*k));
	kv_test_free_url(k->url, sizeof(k->url));
	snprintf(k->raft, sizeof(k->raft), "127.0.0.1:%d", kv_test_free_port());
	snprintf(k->dir, sizeof(k->dir), "%s/%s", base, name);
	k->cfg.listen = k->url;
	k->cfg.data_dir = k->dir;
	/* The joins here name addresses where no server runs: a lease long
	 * enough that no liveness change adds epochs the tests count. The
	 * liveness tests set their own. */
	k->cfg.lease_ms = 600000;
	assert_int_equal(kv_rpc_client_create(k->url, &k->cli), KV_OK);
}

static void
ctl_start(struct ctl *k)
{
	char err[512] = "";

	assert_null(k->c);
	assert_int_equal(kv_controller_create(&k->cfg, &k->c, err, sizeof(err)), KV_OK);
	if (kv_controller_start(k->c, err, sizeof(err)) != KV_OK)
		fail_msg("start: %s", err);
}

static void
ctl_stop(struct ctl *k)
{
	kv_controller_stop(k->c);
	kv_controller_destroy(k->c);
	k->c = NULL;
}

static void
ctl_fini(struct ctl *k)
{
	kv_rpc_client_destroy(k->cli);
	k->cli = NULL;
	ctl_stop(k);
}

/* ---- standalone ---- */

static void
standalone_controller_restarted_on_its_data_dir_keeps_its_epochs(void **state)
{
	kv_test_dir *d = *state;
	struct ctl k;
	Shardkv__AdminResponse *r;
	char cluster[32];

	ctl_init(&k, d->path, "ctl");
	ctl_start(&k);
	r = join(k.cli, "tcp://127.0.0.1:7101");
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 1);
	snprintf(cluster, sizeof(cluster), "%s", r->config->cluster_id);
	ctl_client_free(r);
	r = join(k.cli, "tcp://127.0.0.1:7102");
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 2);
	ctl_client_free(r);
	kv_controller_stop(k.c);
	assert_int_equal(kv_controller_epoch(k.c), 2); /* still readable after stop */
	kv_controller_stop(k.c);                       /* idempotent */
	kv_controller_destroy(k.c);
	k.c = NULL;

	/* Created again: the log is replayed before anything starts. */
	char err[512] = "";
	assert_int_equal(kv_controller_create(&k.cfg, &k.c, err, sizeof(err)), KV_OK);
	assert_int_equal(kv_controller_epoch(k.c), 2);
	assert_int_equal(kv_controller_start(k.c, err, sizeof(err)), KV_OK);
	r = get_config(k.cli, 1);
	assert_non_null(r);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->config->epoch, 1);
	assert_int_equal(r->config->n_nodes, 1);
	assert_string_equal(r->config->cluster_id, cluster);
	ctl_client_free(r);
	r = join(k.cli, "tcp://127.0.0.1:7103");
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->node_id, 3); /* ids continue */
	assert_int_equal(r->epoch, 3);
	ctl_client_free(r);
	ctl_fini(&k);
}

struct watcher {
	kv_rpc_client *cli;
	Shardkv__AdminResponse *r; /* the answer; NULL: none came */
};

static void *
watch_main(void *arg)
{
	struct watcher *w = arg;
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__Watch wa = SHARDKV__WATCH__INIT;

	wa.known_epoch = 0;
	rq.timeout_ms = 30000;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_WATCH;
	rq.watch = &wa;
	w->r = call(w->cli, &rq, 40000);
	return NULL;
}

static void
stop_answers_a_held_watch_and_returns_at_once(void **state)
{
	kv_test_dir *d = *state;
	struct ctl k;
	struct watcher w = {0};
	pthread_t t;

	ctl_init(&k, d->path, "ctl");
	ctl_start(&k);
	w.cli = k.cli;
	assert_int_equal(pthread_create(&t, NULL, watch_main, &w), 0);
	kv_test_sleep_ms(300); /* the watch is held: nothing has changed */
	assert_null(w.r);
	uint64_t t0 = kv_test_now_ms();
	kv_controller_stop(k.c);
	uint64_t took = kv_test_now_ms() - t0;
	assert_true(took < 2000);
	pthread_join(t, NULL);
	assert_non_null(w.r); /* answered with the current (empty) config */
	assert_int_equal(ctl_client_err(w.r), KV_OK);
	assert_int_equal(w.r->epoch, 0);
	ctl_client_free(w.r);
	ctl_fini(&k);
}

static void
start_refuses_a_taken_address_and_create_a_data_dir_in_use(void **state)
{
	kv_test_dir *d = *state;
	struct ctl a, b;
	kv_controller *c = NULL;
	char err[512] = "";

	kv_controller_destroy(NULL);
	kv_controller_stop(NULL);
	ctl_init(&a, d->path, "a");
	ctl_start(&a);
	/* The same --listen, another data dir: create works, start does not. */
	ctl_init(&b, d->path, "b");
	b.cfg.listen = a.url;
	assert_int_equal(kv_controller_create(&b.cfg, &c, err, sizeof(err)), KV_OK);
	assert_int_equal(kv_controller_start(c, err, sizeof(err)), KV_EADDRINUSE);
	assert_non_null(strstr(err, "address in use"));
	assert_int_equal(kv_controller_start(c, err, sizeof(err)), KV_EINVAL); /* once only */
	kv_controller_destroy(c);
	c = NULL;
	/* Another --listen, the same data dir: create refuses, *out untouched. */
	b.cfg.listen = b.url;
	b.cfg.data_dir = a.dir;
	err[0] = '\0';
	assert_int_equal(kv_controller_create(&b.cfg, &c, err, sizeof(err)), KV_EBUSY);
	assert_null(c);
	assert_non_null(strstr(err, "another controller"));
	/* The controller that runs is unharmed. */
	Shardkv__AdminResponse *r = join(a.cli, "tcp://127.0.0.1:7101");
	assert_int_equal(ctl_client_err(r), KV_OK);
	ctl_client_free(r);
	ctl_fini(&b);
	ctl_fini(&a);
}

/* ---- a replicated group in one process ---- */

static void
group_init(struct ctl g[NREPL], const char *base)
{
	char name[16];

	for (int i = 0; i < NREPL; i++) {
		snprintf(name, sizeof(name), "ctl%d", i + 1);
		ctl_init(&g[i], base, name);
	}
	for (int i = 0; i < NREPL; i++) {
		for (int j = 0; j < NREPL; j++) {
			g[i].peers[j] = g[j].url;
			g[i].rpeers[j] = g[j].raft;
		}
		g[i].cfg.id = (uint32_t)i + 1;
		g[i].cfg.npeers = NREPL;
		g[i].cfg.peers = g[i].peers;
		g[i].cfg.raft_peers = g[i].rpeers;
		g[i].cfg.election_ms = 400;
	}
}

/*
 * Sends a join to the running replicas until the leader commits it, within
 * 20 s. Tries refused with NOT_LEADER or unanswered keep their request id,
 * so one that committed without an answer is answered, not applied again;
 * after any other refusal (a leader that lost its term, or planned on a
 * state another leader changed first) the next try is a new request, and
 * "already a member" then means an earlier try committed. Returns the index
 * of the replica that answered; *epoch gets the epoch it published and
 * *rid_out the request id of the last try.
 */
static int
join_at_leader(struct ctl g[NREPL], const char *addr, uint64_t client_id, uint64_t *epoch,
               uint64_t *rid_out)
{
	uint64_t deadline = kv_test_now_ms() + 20000, rid = 1;

	for (int i = 0;; i = (i + 1) % NREPL) {
		assert_true(kv_test_now_ms() < deadline);
		if (g[i].c == NULL)
			continue;
		Shardkv__AdminResponse *r = join_as(g[i].cli, addr, client_id, rid);
		int rv = r ? ctl_client_err(r) : KV_ETIMEDOUT;
		if (rv == KV_OK || (rv == KV_EEXISTS && rid > 1)) {
			*epoch = r->epoch;
			*rid_out = rid;
			ctl_client_free(r);
			return i;
		}
		if (r != NULL && r->status != SHARDKV__STATUS__STATUS_NOT_LEADER) {
			assert_true(rv == KV_EUNAVAIL || rv == KV_EBUSY);
			rid++;
		}
		ctl_client_free(r);
		kv_test_sleep_ms(50);
	}
}

/* Waits (at most 10 s) until every running replica has applied `epoch`. */
static void
wait_applied(struct ctl g[NREPL], uint64_t epoch)
{
	uint64_t deadline = kv_test_now_ms() + 10000;

	for (int i = 0; i < NREPL; i++)
		while (g[i].c != NULL && kv_controller_epoch(g[i].c) < epoch) {
			assert_true(kv_test_now_ms() < deadline);
			kv_test_sleep_ms(20);
		}
	for (int i = 0; i < NREPL; i++)
		if (g[i].c != NULL)
			assert_int_equal(kv_controller_epoch(g[i].c), epoch);
}

static void
three_replicas_in_one_process_elect_a_leader_and_commit_a_join(void **state)
{
	kv_test_dir *d = *state;
	struct ctl g[NREPL];
	uint64_t epoch = 0, e2 = 0, rid1 = 0, rid2 = 0;
	int leader, next;

	group_init(g, d->path);
	for (int i = 0; i < NREPL; i++)
		ctl_start(&g[i]);
	leader = join_at_leader(g, "tcp://127.0.0.1:7101", 11, &epoch, &rid1);
	assert_int_equal(epoch, 1);
	wait_applied(g, 1);
	/* A follower serves the config it applied, and sends changes to the
	 * leader. */
	Shardkv__AdminResponse *r = get_config(g[(leader + 1) % NREPL].cli, 1);
	assert_non_null(r);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->config->n_nodes, 1);
	ctl_client_free(r);
	r = join(g[(leader + 1) % NREPL].cli, "tcp://127.0.0.1:7109");
	assert_non_null(r);
	assert_int_equal(r->status, SHARDKV__STATUS__STATUS_NOT_LEADER);
	assert_non_null(r->leader);
	assert_int_equal(r->leader->id, leader + 1);
	assert_string_equal(r->leader->address, g[leader].url);
	ctl_client_free(r);
	/* A dry run is redirected like any admin command; at the leader it
	 * answers the plan and commits nothing (nothing to move: one node). */
	r = move_dry_run(g[(leader + 1) % NREPL].cli, "a", "b", 1);
	assert_non_null(r);
	assert_int_equal(r->status, SHARDKV__STATUS__STATUS_NOT_LEADER);
	assert_non_null(r->leader);
	assert_int_equal(r->leader->id, leader + 1);
	ctl_client_free(r);
	r = move_dry_run(g[leader].cli, "a", "b", 1);
	assert_non_null(r);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 1);
	assert_int_equal(r->n_plan, 0);
	ctl_client_free(r);
	r = move_dry_run(g[leader].cli, "b", "a", 1); /* refused like the move */
	assert_non_null(r);
	assert_int_equal(ctl_client_err(r), KV_EINVAL);
	ctl_client_free(r);
	assert_int_equal(kv_controller_epoch(g[leader].c), 1);

	/* The leader stops: the other two elect another and commit. */
	ctl_stop(&g[leader]);
	next = join_at_leader(g, "tcp://127.0.0.1:7102", 12, &e2, &rid2);
	assert_true(next != leader);
	assert_int_equal(e2, 2);
	wait_applied(g, 2);
	/* The first join retried at the new leader (the old one might have died
	 * before answering) is answered with what it did, not applied again. */
	r = join_as(g[next].cli, "tcp://127.0.0.1:7101", 11, rid1);
	assert_non_null(r);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 1);
	assert_int_equal(r->node_id, 1);
	ctl_client_free(r);
	assert_int_equal(kv_controller_epoch(g[next].c), 2);

	/* The stopped replica starts again in the same process and catches up. */
	ctl_start(&g[leader]);
	wait_applied(g, 2);
	for (int i = 0; i < NREPL; i++)
		ctl_fini(&g[i]);
}

/* ---- liveness in a replicated group ---- */

/* The status of an answer as a KV_E* code. */
static int
live_err(const Shardkv__AdminResponse *r)
{
	return kv_err_from_wire(r->status);
}

/* Frees an answer; accepts NULL. */
static void
live_free(Shardkv__AdminResponse *r)
{
	if (r != NULL)
		shardkv__admin_response__free_unpacked(r, NULL);
}

/* The state of node id in the config r carries; 0 when absent. */
static int
state_in(const Shardkv__AdminResponse *r, uint32_t id)
{
	for (size_t i = 0; r->config && i < r->config->n_nodes; i++)
		if (r->config->nodes[i]->id == id)
			return (int)r->config->nodes[i]->state;
	return 0;
}

/* Makes rq a lease-only heartbeat from node id (hb holds its body). */
static void
lease_heartbeat(Shardkv__AdminRequest *rq, Shardkv__Heartbeat *hb, uint32_t id)
{
	*rq = (Shardkv__AdminRequest)SHARDKV__ADMIN_REQUEST__INIT;
	*hb = (Shardkv__Heartbeat)SHARDKV__HEARTBEAT__INIT;
	hb->node_id = id;
	hb->lease_only = true;
	rq->cmd_case = SHARDKV__ADMIN_REQUEST__CMD_HEARTBEAT;
	rq->heartbeat = hb;
}

static void
replicated_leader_declares_a_silent_node_down_through_raft(void **state)
{
	kv_test_dir *d = *state;
	struct ctl g[NREPL];
	uint64_t epoch = 0, rid = 0, t0;
	int leader;

	group_init(g, d->path);
	for (int i = 0; i < NREPL; i++) {
		g[i].cfg.lease_ms = 200;
		g[i].cfg.lease_margin_ms = 100; /* down after 200 + 100 + 400 (election) */
	}
	for (int i = 0; i < NREPL; i++)
		ctl_start(&g[i]);
	t0 = kv_test_now_ms();
	leader = join_at_leader(g, "tcp://127.0.0.1:7101", 21, &epoch, &rid);
	assert_int_equal(epoch, 1);
	/* Nothing heartbeats for it: the leader commits it down, and every
	 * replica applies that. */
	wait_applied(g, 2);
	assert_true(kv_test_now_ms() - t0 >= 700);
	for (int i = 0; i < NREPL; i++) {
		Shardkv__AdminResponse *r = get_config(g[i].cli, 2);
		assert_non_null(r);
		assert_int_equal(live_err(r), KV_OK);
		assert_int_equal(state_in(r, 1), SHARDKV__NODE_STATE__NODE_STATE_DOWN);
		live_free(r);
	}
	/* A heartbeat from it is refused (no lease for a down node) and brings
	 * it back by another commit. */
	Shardkv__AdminRequest rq;
	Shardkv__Heartbeat hb;
	lease_heartbeat(&rq, &hb, 1);
	Shardkv__AdminResponse *r = call(g[leader].cli, &rq, 10000);
	assert_non_null(r);
	assert_int_equal(live_err(r), KV_EBUSY);
	live_free(r);
	/* (Exactly epoch 3: it goes down again 700 ms later, silent.) */
	for (t0 = kv_test_now_ms();; kv_test_sleep_ms(10)) {
		assert_true(kv_test_now_ms() - t0 < 10000);
		r = get_config(g[leader].cli, 3);
		assert_non_null(r);
		if (live_err(r) == KV_OK)
			break;
		live_free(r);
	}
	assert_int_equal(state_in(r, 1), SHARDKV__NODE_STATE__NODE_STATE_ACTIVE);
	live_free(r);
	/* Once back, its renewals are granted. */
	for (t0 = kv_test_now_ms();; kv_test_sleep_ms(10)) {
		assert_true(kv_test_now_ms() - t0 < 10000);
		rq.request_id = 0;
		r = call(g[leader].cli, &rq, 10000);
		assert_non_null(r);
		int rv = live_err(r);
		live_free(r);
		if (rv == KV_OK)
			break;
		assert_int_equal(rv, KV_EBUSY);
	}
	for (int i = 0; i < NREPL; i++)
		ctl_fini(&g[i]);
}

/* With --replicas 2 the leader's liveness change fails a silent primary's
 * range over to its in-sync replica through Raft, and every replica applies
 * the same configuration. */
static void
replicated_leader_fails_a_silent_primary_over_through_raft(void **state)
{
	kv_test_dir *d = *state;
	struct ctl g[NREPL];
	uint64_t epoch = 0, rid = 0, t0, down_epoch = 0;
	int leader;

	group_init(g, d->path);
	for (int i = 0; i < NREPL; i++) {
		g[i].cfg.lease_ms = 1000;
		g[i].cfg.lease_margin_ms = 500; /* down after 1000 + 500 + 400 (election) */
		g[i].cfg.replicas = 2;
	}
	for (int i = 0; i < NREPL; i++)
		ctl_start(&g[i]);
	leader = join_at_leader(g, "tcp://127.0.0.1:7101", 31, &epoch, &rid);
	assert_int_equal(epoch, 1);
	Shardkv__AdminResponse *r = join_as(g[leader].cli, "tcp://127.0.0.1:7102", 32, 1);
	assert_non_null(r);
	assert_int_equal(live_err(r), KV_OK);
	assert_int_equal(r->epoch, 2);
	assert_int_equal(r->config->n_ranges, 1);
	assert_int_equal(r->config->ranges[0]->n_replicas, 2);
	assert_int_equal(r->config->ranges[0]->n_insync, 1);
	uint64_t le = r->config->ranges[0]->leader_epoch;
	live_free(r);
	/* Node 1, the primary, asks to add node 2 to the ISR. */
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__IsrChange ic = SHARDKV__ISR_CHANGE__INIT;
	ic.node_id = 1;
	ic.leader_epoch = le;
	ic.add_node = 2;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_ISR_CHANGE;
	rq.isr_change = &ic;
	r = call(g[leader].cli, &rq, 10000);
	assert_non_null(r);
	assert_int_equal(live_err(r), KV_OK);
	assert_int_equal(r->epoch, 3);
	live_free(r);
	/* Node 2 renews its lease, node 1 is silent. */
	Shardkv__AdminRequest hq;
	Shardkv__Heartbeat hb;
	lease_heartbeat(&hq, &hb, 2);
	for (t0 = kv_test_now_ms(); down_epoch == 0; kv_test_sleep_ms(50)) {
		assert_true(kv_test_now_ms() - t0 < 15000);
		hq.request_id = 0;
		live_free(call(g[leader].cli, &hq, 10000));
		r = get_config(g[leader].cli, 0);
		assert_non_null(r);
		if (state_in(r, 1) == SHARDKV__NODE_STATE__NODE_STATE_DOWN)
			down_epoch = r->epoch;
		live_free(r);
	}
	wait_applied(g, down_epoch);
	for (int i = 0; i < NREPL; i++) {
		r = get_config(g[i].cli, down_epoch);
		assert_non_null(r);
		assert_int_equal(live_err(r), KV_OK);
		assert_int_equal(state_in(r, 2), SHARDKV__NODE_STATE__NODE_STATE_ACTIVE);
		const Shardkv__Range *rg = r->config->ranges[0];
		assert_int_equal(rg->node_id, 2);
		assert_int_equal(rg->leader_epoch, down_epoch);
		assert_int_equal(rg->n_insync, 1);
		assert_int_equal(rg->insync[0], 2);
		assert_int_equal(rg->n_replicas, 2);
		live_free(r);
	}
	for (int i = 0; i < NREPL; i++)
		ctl_fini(&g[i]);
}

/* Sends rq to whichever running replica leads (NOT_LEADER: the next),
 * within 20 s; returns the answer (the caller frees it) and the leader's
 * index in *at. */
static Shardkv__AdminResponse *
call_leader(struct ctl g[NREPL], Shardkv__AdminRequest *rq, int *at)
{
	uint64_t deadline = kv_test_now_ms() + 20000;

	for (int i = 0;; i = (i + 1) % NREPL) {
		assert_true(kv_test_now_ms() < deadline);
		if (g[i].c == NULL)
			continue;
		Shardkv__AdminResponse *r = call(g[i].cli, rq, 10000);
		if (r != NULL && r->status != SHARDKV__STATUS__STATUS_NOT_LEADER &&
		    kv_err_from_wire(r->status) != KV_EUNAVAIL) {
			*at = i;
			return r;
		}
		live_free(r);
		kv_test_sleep_ms(20);
	}
}

/* Lease-only heartbeats from nodes 1 and 3 to whichever replica leads. */
static void
heartbeat_1_and_3(struct ctl g[NREPL])
{
	Shardkv__AdminRequest hq;
	Shardkv__Heartbeat hb;
	int at;

	for (uint32_t id = 1; id <= 3; id += 2) {
		lease_heartbeat(&hq, &hb, id);
		live_free(call_leader(g, &hq, &at));
	}
}

/* With --replicas 2 and --down-after 1, the leader replaces a node down
 * for longer than that by the free node, outside the ISR, through Raft;
 * the replacement is recorded in the configuration, so after the leader
 * stops, the new leader drops the right member when the primary adds the
 * replacement to the ISR. */
static void
replicated_leader_replaces_a_node_down_past_down_after_and_a_new_leader_ends_it(void **state)
{
	kv_test_dir *d = *state;
	struct ctl g[NREPL];
	uint64_t epoch = 0, rid = 0, t0, rep_epoch = 0;
	int leader, at;
	Shardkv__AdminResponse *r;

	group_init(g, d->path);
	for (int i = 0; i < NREPL; i++) {
		g[i].cfg.lease_ms = 1000;
		g[i].cfg.lease_margin_ms = 500; /* down after 1000 + 500 + 400 (election) */
		g[i].cfg.replicas = 2;
		g[i].cfg.down_after_s = 1;
	}
	for (int i = 0; i < NREPL; i++)
		ctl_start(&g[i]);
	leader = join_at_leader(g, "tcp://127.0.0.1:7101", 41, &epoch, &rid);
	uint64_t t_join = kv_test_now_ms(); /* node 2 is last heard after this */
	r = join_as(g[leader].cli, "tcp://127.0.0.1:7102", 42, 1);
	assert_non_null(r);
	assert_int_equal(live_err(r), KV_OK);
	live_free(r);
	r = join_as(g[leader].cli, "tcp://127.0.0.1:7103", 43, 1);
	assert_non_null(r);
	assert_int_equal(live_err(r), KV_OK);
	/* Two replicas already: the third node holds nothing. */
	assert_int_equal(r->config->ranges[0]->n_replicas, 2);
	uint64_t le = r->config->ranges[0]->leader_epoch;
	live_free(r);
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__IsrChange ic = SHARDKV__ISR_CHANGE__INIT;
	ic.node_id = 1;
	ic.leader_epoch = le;
	ic.add_node = 2;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_ISR_CHANGE;
	rq.isr_change = &ic;
	r = call_leader(g, &rq, &at);
	assert_int_equal(live_err(r), KV_OK);
	live_free(r);

	/* Node 2 is silent: down, then past --down-after, replaced by 3. */
	for (t0 = kv_test_now_ms(); rep_epoch == 0; kv_test_sleep_ms(50)) {
		assert_true(kv_test_now_ms() - t0 < 20000);
		heartbeat_1_and_3(g);
		r = get_config(g[leader].cli, 0);
		assert_non_null(r);
		const Shardkv__Range *rg = r->config->ranges[0];
		if (rg->n_replacing == 1) {
			assert_int_equal(rg->replacing[0], 3);
			assert_int_equal(rg->replaced[0], 2);
			assert_int_equal(rg->n_replicas, 3);
			assert_int_equal(rg->n_insync, 1);
			assert_int_equal(state_in(r, 2), SHARDKV__NODE_STATE__NODE_STATE_DOWN);
			rep_epoch = r->epoch;
		}
		live_free(r);
	}
	/* Down after 1.9 s of silence, replaced at least 1 s later. */
	assert_true(kv_test_now_ms() - t_join >= 2900);
	wait_applied(g, rep_epoch);

	/* The leader stops; the primary's expand at the new leader drops 2. */
	ctl_stop(&g[leader]);
	ic.leader_epoch = le;
	ic.add_node = 3;
	for (t0 = kv_test_now_ms();; kv_test_sleep_ms(50)) {
		assert_true(kv_test_now_ms() - t0 < 20000);
		heartbeat_1_and_3(g);
		rq.request_id = 0;
		r = call_leader(g, &rq, &at);
		if (live_err(r) == KV_OK)
			break;
		live_free(r);
	}
	assert_true(at != leader);
	uint64_t e = r->epoch;
	live_free(r);
	wait_applied(g, e);
	r = get_config(g[at].cli, e);
	assert_non_null(r);
	const Shardkv__Range *rg = r->config->ranges[0];
	assert_int_equal(rg->n_replicas, 2);
	assert_int_equal(rg->replicas[0], 1);
	assert_int_equal(rg->replicas[1], 3);
	assert_int_equal(rg->n_insync, 2);
	assert_int_equal(rg->n_replacing, 0);
	assert_int_equal(state_in(r, 2), SHARDKV__NODE_STATE__NODE_STATE_DOWN);
	live_free(r);
	for (int i = 0; i < NREPL; i++)
		ctl_fini(&g[i]);
}

/* --replicas and --min-insync: the parser refuses values out of range with
 * a one-line reason, --replicas defaults to 3, --help names them, and
 * create refuses the same values given through the options. */
static void
replica_flags_are_checked_by_the_parser_and_by_create(void **state)
{
	kv_test_dir *d = *state;
	kv_controller_args a;
	kv_controller *c = NULL;
	struct ctl k;
	char err[512];
	static const char *const bad[][2] = {
	    {"--replicas", "0"},   {"--replicas", "6"},   {"--replicas", "x"},
	    {"--min-insync", "0"}, {"--min-insync", "4"}, /* more than the default --replicas 3 */
	};

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char *argv[] = {"shardkv-controller", "--listen", "tcp://127.0.0.1:1",
		                "--data-dir",         "/tmp/x",   (char *)bad[i][0],
		                (char *)bad[i][1],    NULL};
		err[0] = '\0';
		assert_int_equal(kv_controller_parse_args(7, argv, &a, err, sizeof(err)),
		                 KV_EINVAL);
		assert_non_null(strstr(err, bad[i][0]));
		assert_null(strchr(err, '\n'));
	}
	/* With neither flag: three replicas (doc/contract.md §2), M left to
	 * create (the smaller of 2 and R). */
	char *dflt[] = {"shardkv-controller", "--listen", "tcp://127.0.0.1:1",
	                "--data-dir",         "/tmp/x",   NULL};
	assert_int_equal(kv_controller_parse_args(5, dflt, &a, err, sizeof(err)), KV_OK);
	assert_int_equal(a.cfg.replicas, 3);
	assert_int_equal(a.cfg.min_insync, 0);
	char *ok[] = {"shardkv-controller", "--listen", "tcp://127.0.0.1:1", "--data-dir", "/tmp/x",
	              "--replicas",         "3",        "--min-insync",      "3",          NULL};
	assert_int_equal(kv_controller_parse_args(9, ok, &a, err, sizeof(err)), KV_OK);
	assert_int_equal(a.cfg.replicas, 3);
	assert_int_equal(a.cfg.min_insync, 3);
	char *over[] = {
	    "shardkv-controller", "--listen", "tcp://127.0.0.1:1", "--data-dir", "/tmp/x",
	    "--replicas",         "2",        "--min-insync",      "3",          NULL};
	assert_int_equal(kv_controller_parse_args(9, over, &a, err, sizeof(err)), KV_EINVAL);
	assert_non_null(strstr(err, "--min-insync 3 is larger than --replicas 2"));
	assert_non_null(strstr(kv_controller_usage, "--replicas R"));
	assert_non_null(strstr(kv_controller_usage, "--min-insync M"));

	ctl_init(&k, d->path, "r");
	k.cfg.replicas = 6;
	assert_int_equal(kv_controller_create(&k.cfg, &c, err, sizeof(err)), KV_EINVAL);
	assert_null(c);
	k.cfg.replicas = 2;
	k.cfg.min_insync = 3;
	assert_int_equal(kv_controller_create(&k.cfg, &c, err, sizeof(err)), KV_EINVAL);
	assert_null(c);
	assert_non_null(strstr(err, "--min-insync"));
	ctl_fini(&k);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(
	        standalone_controller_restarted_on_its_data_dir_keeps_its_epochs, kv_test_dir_setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(stop_answers_a_held_watch_and_returns_at_once,
	                                    kv_test_dir_setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        start_refuses_a_taken_address_and_create_a_data_dir_in_use, kv_test_dir_setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        three_replicas_in_one_process_elect_a_leader_and_commit_a_join, kv_test_dir_setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        replicated_leader_declares_a_silent_node_down_through_raft, kv_test_dir_setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        replicated_leader_fails_a_silent_primary_over_through_raft, kv_test_dir_setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        replicated_leader_replaces_a_node_down_past_down_after_and_a_new_leader_ends_it,
	        kv_test_dir_setup, teardown),
	    cmocka_unit_test_setup_teardown(replica_flags_are_checked_by_the_parser_and_by_create,
	                                    kv_test_dir_setup, teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
