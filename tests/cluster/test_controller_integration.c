/*
 * test_controller_integration.c - a controller on a free loopback port with
 * a temporary data dir, driven over nng with AdminRequest messages: every
 * admin rule and refusal, migrations and --wait, watch long polls, server
 * registration and heartbeats, 1,000 concurrent joins of one address,
 * restart with the same data dir, and the command line.
 *
 * Each test starts its own controller in this process (setup:
 * kv_controller_create and kv_controller_start, with --metrics) and stops
 * it (teardown). The command line test runs the real shardkv-controller
 * binary next to it (PR_SET_PDEATHSIG kills it if this process dies).
 */
#include "common/err.h"
#include "common/proc.h"
#include "common/rpc.h"
#include "controller/controller.h"
#include "proto/shardkv.pb-c.h"
#include "proto/wire.h"
#include "tests/support/ctl_client.h"
#include "tests/support/testutil.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
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
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#ifndef KV_CONTROLLER_BIN
#error "KV_CONTROLLER_BIN must name the shardkv-controller binary"
#endif

struct fx {
	char url[64];       /* --listen */
	char metrics[64];   /* --metrics host:port */
	char dir[128];      /* --data-dir */
	kv_controller *ctl; /* the controller under test; NULL: stopped */
	kv_rpc_client *cli; /* a client to it */
};

/* Starts argv[0] with its output appended to logf (common/proc.h: killed on
 * every exit path of the test). */
static pid_t
spawn(const char *const argv[], const char *logf)
{
	return kv_proc_spawn(argv[0], (char *const *)argv, logf);
}

/* ---- requests ---- */

static uint64_t next_rid = 1;

static Shardkv__AdminResponse *
call_to(kv_rpc_client *cli, Shardkv__AdminRequest *rq, uint32_t timeout_ms, int *rv_out)
{
	if (rq->version == 0)
		rq->version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	rq->request_id = __atomic_fetch_add(&next_rid, 1, __ATOMIC_RELAXED);
	return ctl_client_call(cli, rq, timeout_ms, rv_out);
}

static Shardkv__AdminResponse *
call(kv_rpc_client *cli, Shardkv__AdminRequest *rq)
{
	int rv = 0;
	Shardkv__AdminResponse *r = call_to(cli, rq, 10000, &rv);
	assert_int_equal(rv, KV_OK);
	assert_non_null(r);
	assert_int_equal(r->request_id, rq->request_id);
	return r;
}

static Shardkv__AdminResponse *
do_join(kv_rpc_client *cli, const char *addr, bool no_rebalance, bool wait)
{
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminJoin j = SHARDKV__ADMIN_JOIN__INIT;
	j.address = (char *)addr;
	j.no_rebalance = no_rebalance;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_JOIN;
	rq.join = &j;
	rq.wait = wait;
	return call(cli, &rq);
}

static Shardkv__AdminResponse *
do_leave(kv_rpc_client *cli, uint32_t id, const char *addr)
{
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminLeave l = SHARDKV__ADMIN_LEAVE__INIT;
	Shardkv__NodeRef ref = SHARDKV__NODE_REF__INIT;
	if (addr) {
		ref.ref_case = SHARDKV__NODE_REF__REF_ADDRESS;
		ref.address = (char *)addr;
	} else {
		ref.ref_case = SHARDKV__NODE_REF__REF_ID;
		ref.id = id;
	}
	l.node = &ref;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_LEAVE;
	rq.leave = &l;
	return call(cli, &rq);
}

static Shardkv__AdminResponse *
do_move(kv_rpc_client *cli, const char *s, const char *e, uint32_t id, const char *addr)
{
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminMove mv = SHARDKV__ADMIN_MOVE__INIT;
	Shardkv__NodeRef ref = SHARDKV__NODE_REF__INIT;
	if (addr) {
		ref.ref_case = SHARDKV__NODE_REF__REF_ADDRESS;
		ref.address = (char *)addr;
	} else {
		ref.ref_case = SHARDKV__NODE_REF__REF_ID;
		ref.id = id;
	}
	mv.start.data = (uint8_t *)s;
	mv.start.len = strlen(s);
	mv.end.data = (uint8_t *)e;
	mv.end.len = strlen(e);
	mv.node = &ref;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_MOVE;
	rq.move = &mv;
	return call(cli, &rq);
}

static Shardkv__AdminResponse *
do_rebalance(kv_rpc_client *cli)
{
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminRebalance rb = SHARDKV__ADMIN_REBALANCE__INIT;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_REBALANCE;
	rq.rebalance = &rb;
	return call(cli, &rq);
}

static Shardkv__AdminResponse *
do_config(kv_rpc_client *cli, uint64_t epoch)
{
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminGetConfig g = SHARDKV__ADMIN_GET_CONFIG__INIT;
	g.epoch = epoch;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_GET_CONFIG;
	rq.get_config = &g;
	return call(cli, &rq);
}

static Shardkv__AdminResponse *
do_status(kv_rpc_client *cli)
{
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminStatus st = SHARDKV__ADMIN_STATUS__INIT;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_STATUS;
	rq.status = &st;
	return call(cli, &rq);
}

static Shardkv__AdminResponse *
do_done(kv_rpc_client *cli, uint64_t mig, uint32_t node, Shardkv__Status st)
{
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__MigrationDone d = SHARDKV__MIGRATION_DONE__INIT;
	d.migration_id = mig;
	d.node_id = node;
	d.status = st;
	d.error = (char *)(st ? "destination unreachable" : "");
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_MIGRATION_DONE;
	rq.migration_done = &d;
	return call(cli, &rq);
}

static uint64_t
epoch_of(kv_rpc_client *cli)
{
	Shardkv__AdminResponse *r = do_config(cli, 0);
	uint64_t e = r->epoch;
	ctl_client_free(r);
	return e;
}

static const Shardkv__Node *
node_in(const Shardkv__Config *c, uint32_t id)
{
	for (size_t i = 0; i < c->n_nodes; i++)
		if (c->nodes[i]->id == id)
			return c->nodes[i];
	return NULL;
}

/* Owner of key in a config message. */
static uint32_t
owner_of(const Shardkv__Config *c, const char *key)
{
	uint32_t o = 0;
	for (size_t i = 0; i < c->n_ranges; i++) {
		const Shardkv__Range *r = c->ranges[i];
		size_t n = strlen(key), m = r->start.len < n ? r->start.len : n;
		int cmp = m ? memcmp(r->start.data, key, m) : 0;
		if (cmp < 0 || (cmp == 0 && r->start.len <= n))
			o = r->node_id;
	}
	return o;
}

/* ---- fixture ---- */

static void
start_controller(struct fx *f)
{
	kv_controller_cfg cfg = {.listen = f->url, .data_dir = f->dir, .metrics = f->metrics};
	char err[512] = "";

	assert_null(f->ctl);
	assert_int_equal(kv_controller_create(&cfg, &f->ctl, err, sizeof(err)), KV_OK);
	if (kv_controller_start(f->ctl, err, sizeof(err)) != KV_OK)
		fail_msg("cannot start the controller: %s", err);
	if (f->cli == NULL)
		assert_int_equal(kv_rpc_client_create(f->url, &f->cli), KV_OK);
}

/* Stops it (answering what it holds) and frees it. */
static void
stop_controller(struct fx *f)
{
	kv_controller_stop(f->ctl);
	kv_controller_destroy(f->ctl);
	f->ctl = NULL;
}

static int
setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	kv_test_free_url(f->url, sizeof(f->url));
	snprintf(f->metrics, sizeof(f->metrics), "127.0.0.1:%d", kv_test_free_port());
	snprintf(f->dir, sizeof(f->dir), "/tmp/kv_ctl_it_XXXXXX");
	if (mkdtemp(f->dir) == NULL)
		return -1;
	*state = f;
	start_controller(f);
	return 0;
}

static int
teardown(void **state)
{
	struct fx *f = *state;

	stop_controller(f);
	kv_rpc_client_destroy(f->cli);
	kv_test_rmtree(f->dir);
	free(f);
	return 0;
}

/* ---- tests ---- */

static void
join_rules_and_refusals(void **state)
{
	struct fx *f = *state;
	Shardkv__AdminResponse *r;

	r = do_join(f->cli, "tcp://127.0.0.1:7101", false, false);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 1);
	assert_int_equal(r->node_id, 1);
	assert_int_equal(r->config->n_ranges, 1);
	assert_int_equal(r->config->ranges[0]->node_id, 1);
	assert_true(r->config->cluster_id && strlen(r->config->cluster_id) == 16);
	ctl_client_free(r);

	r = do_join(f->cli, "tcp://127.0.0.1:7102", false, false);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 2);
	assert_int_equal(r->node_id, 2);
	assert_int_equal(r->config->n_ranges, 2); /* node 2 got a share of the key space */
	assert_int_equal(r->n_migration_ids, 1);
	assert_int_equal(r->config->n_migrations, 1);
	assert_int_equal(r->config->migrations[0]->from_node, 1);
	assert_int_equal(r->config->migrations[0]->to_node, 2);
	assert_int_equal(r->config->migrations[0]->phase,
	                 SHARDKV__MIGRATION_PHASE__MIGRATION_PHASE_PENDING);
	assert_int_equal(node_in(r->config, 2)->state, SHARDKV__NODE_STATE__NODE_STATE_JOINING);
	ctl_client_free(r);

	/* refusals: each with a message, none bumps the epoch */
	r = do_join(f->cli, "tcp://127.0.0.1:7101", false, false);
	assert_int_equal(ctl_client_err(r), KV_EEXISTS);
	assert_non_null(strstr(r->error, "already registered"));
	ctl_client_free(r);
	r = do_join(f->cli, "", false, false);
	assert_int_equal(ctl_client_err(r), KV_EINVAL);
	ctl_client_free(r);
	r = do_leave(f->cli, 42, NULL);
	assert_int_equal(ctl_client_err(r), KV_ENOTFOUND);
	assert_non_null(strstr(r->error, "unknown node 42"));
	ctl_client_free(r);
	r = do_leave(f->cli, 0, "tcp://nowhere:1");
	assert_int_equal(ctl_client_err(r), KV_ENOTFOUND);
	ctl_client_free(r);
	r = do_leave(f->cli, 2, NULL); /* destination of the join's migration */
	assert_int_equal(ctl_client_err(r), KV_EBUSY);
	ctl_client_free(r);
	r = do_config(f->cli, 99);
	assert_int_equal(ctl_client_err(r), KV_ENOTFOUND);
	assert_non_null(strstr(r->error, "never published"));
	ctl_client_free(r);
	assert_int_equal(epoch_of(f->cli), 2);

	r = do_config(f->cli, 1);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->config->epoch, 1);
	assert_int_equal(r->config->n_nodes, 1);
	ctl_client_free(r);
}

static void
move_rules_and_refusals(void **state)
{
	struct fx *f = *state;
	Shardkv__AdminResponse *r;
	uint64_t mig;

	ctl_client_free(do_join(f->cli, "tcp://127.0.0.1:7101", false, false));
	ctl_client_free(do_join(f->cli, "tcp://127.0.0.1:7102", true, false)); /* register only */
	ctl_client_free(do_join(f->cli, "tcp://127.0.0.1:7103", true, false));
	assert_int_equal(epoch_of(f->cli), 3);

	r = do_move(f->cli, "b", "a", 2, NULL);
	assert_int_equal(ctl_client_err(r), KV_EINVAL);
	assert_non_null(strstr(r->error, "empty or inverted"));
	ctl_client_free(r);
	r = do_move(f->cli, "b", "b", 2, NULL);
	assert_int_equal(ctl_client_err(r), KV_EINVAL);
	ctl_client_free(r);
	r = do_move(f->cli, "a", "b", 9, NULL);
	assert_int_equal(ctl_client_err(r), KV_ENOTFOUND);
	ctl_client_free(r);

	r = do_move(f->cli, "d", "m", 0, "tcp://127.0.0.1:7102");
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 4);
	assert_int_equal(r->n_migration_ids, 1);
	mig = r->migration_ids[0];
	ctl_client_free(r);
	r = do_move(f->cli, "k", "p", 3, NULL); /* overlaps [d, m) in flight */
	assert_int_equal(ctl_client_err(r), KV_EBUSY);
	assert_non_null(strstr(r->error, "range is moving"));
	ctl_client_free(r);
	r = do_move(f->cli, "m", "p", 3, NULL); /* next to it is fine */
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 5);
	ctl_client_free(r);
	r = do_done(f->cli, mig, 1, SHARDKV__STATUS__STATUS_OK);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 6);
	for (size_t i = 0; i < r->config->n_migrations; i++)
		assert_true(r->config->migrations[i]->id != mig);
	ctl_client_free(r);
	r = do_done(f->cli, mig, 1, SHARDKV__STATUS__STATUS_OK); /* a retried report */
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 6);
	ctl_client_free(r);
	r = do_done(f->cli, 777, 1, SHARDKV__STATUS__STATUS_OK);
	assert_int_equal(ctl_client_err(r), KV_ENOTFOUND);
	ctl_client_free(r);
	/* once done, the range can move again */
	r = do_move(f->cli, "k", "l", 1, NULL);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 7);
	ctl_client_free(r);
	/* a range in flight cannot move, even back to where it is going */
	r = do_move(f->cli, "k", "l", 1, NULL);
	assert_int_equal(ctl_client_err(r), KV_EBUSY);
	ctl_client_free(r);
	/* a move to the current owner changes nothing */
	r = do_move(f->cli, "a", "b", 1, NULL);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 7);
	assert_int_equal(r->n_migration_ids, 0);
	ctl_client_free(r);
}

static void
leave_drains_and_node_becomes_gone(void **state)
{
	struct fx *f = *state;
	Shardkv__AdminResponse *r;
	uint64_t mig;

	ctl_client_free(do_join(f->cli, "tcp://127.0.0.1:7101", false, false));
	ctl_client_free(do_join(f->cli, "tcp://127.0.0.1:7102", false, false));
	r = do_config(f->cli, 0);
	mig = r->config->migrations[0]->id;
	ctl_client_free(r);
	r = do_done(f->cli, mig, 1, SHARDKV__STATUS__STATUS_OK);
	assert_int_equal(node_in(r->config, 2)->state, SHARDKV__NODE_STATE__NODE_STATE_ACTIVE);
	ctl_client_free(r);

	r = do_leave(f->cli, 1, NULL);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(node_in(r->config, 1)->state, SHARDKV__NODE_STATE__NODE_STATE_DRAINING);
	assert_int_equal(r->config->n_ranges, 1); /* node 2 owns everything now */
	assert_int_equal(r->config->ranges[0]->node_id, 2);
	assert_int_equal(r->n_migration_ids, 1);
	mig = r->migration_ids[0];
	ctl_client_free(r);
	r = do_leave(f->cli, 1, NULL);
	assert_int_equal(ctl_client_err(r), KV_EEXISTS);
	ctl_client_free(r);
	r = do_leave(f->cli, 2, NULL);
	assert_int_equal(ctl_client_err(r), KV_EBUSY); /* destination of the drain */
	ctl_client_free(r);
	r = do_done(f->cli, mig, 2, SHARDKV__STATUS__STATUS_OK); /* not the source */
	assert_int_equal(ctl_client_err(r), KV_EINVAL);
	ctl_client_free(r);
	r = do_done(f->cli, mig, 1, SHARDKV__STATUS__STATUS_OK);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(node_in(r->config, 1)->state, SHARDKV__NODE_STATE__NODE_STATE_GONE);
	ctl_client_free(r);
	r = do_leave(f->cli, 2, NULL);
	assert_int_equal(ctl_client_err(r), KV_EINVAL); /* the last active node */
	assert_non_null(strstr(r->error, "last active node"));
	ctl_client_free(r);
	/* the address of a gone node may join again, with a new id */
	r = do_join(f->cli, "tcp://127.0.0.1:7101", true, false);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->node_id, 3);
	ctl_client_free(r);
}

static void
failed_migration_returns_range_to_source(void **state)
{
	struct fx *f = *state;
	Shardkv__AdminResponse *r;
	uint64_t mig, e;

	ctl_client_free(do_join(f->cli, "tcp://127.0.0.1:7101", false, false));
	ctl_client_free(do_join(f->cli, "tcp://127.0.0.1:7102", false, false));
	r = do_config(f->cli, 0);
	mig = r->config->migrations[0]->id;
	e = r->epoch;
	ctl_client_free(r);
	r = do_done(f->cli, mig, 1, SHARDKV__STATUS__STATUS_UNAVAILABLE);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, e + 1);
	assert_int_equal(r->config->n_migrations, 0);
	assert_int_equal(r->config->n_ranges, 1);
	assert_int_equal(r->config->ranges[0]->node_id, 1);
	ctl_client_free(r);
	/* rebalance tries again */
	r = do_rebalance(f->cli);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->n_migration_ids, 1);
	ctl_client_free(r);
	/* and a second rebalance has nothing left to do */
	r = do_rebalance(f->cli);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->n_migration_ids, 0);
	assert_int_equal(r->epoch, e + 2);
	ctl_client_free(r);
}

struct waiter {
	kv_rpc_client *cli;
	Shardkv__AdminRequest *rq;
	Shardkv__AdminResponse *r;
	uint32_t timeout_ms;
	uint64_t t_done;
};

static void *
waiter_main(void *arg)
{
	struct waiter *w = arg;
	int rv = 0;
	w->r = call_to(w->cli, w->rq, w->timeout_ms, &rv);
	w->t_done = kv_test_now_ms();
	return NULL;
}

static void
wait_answers_when_migrations_finish(void **state)
{
	struct fx *f = *state;
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminJoin j = SHARDKV__ADMIN_JOIN__INIT;
	struct waiter w = {.cli = f->cli, .rq = &rq, .timeout_ms = 20000};
	Shardkv__AdminResponse *r;
	pthread_t t;
	uint64_t mig = 0;

	ctl_client_free(do_join(f->cli, "tcp://127.0.0.1:7101", false, false));
	j.address = "tcp://127.0.0.1:7102";
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_JOIN;
	rq.join = &j;
	rq.wait = true;
	assert_int_equal(pthread_create(&t, NULL, waiter_main, &w), 0);
	for (uint64_t deadline = kv_test_now_ms() + 10000; mig == 0;) {
		r = do_config(f->cli, 0);
		if (r->config && r->config->n_migrations)
			mig = r->config->migrations[0]->id;
		ctl_client_free(r);
		assert_true(kv_test_now_ms() < deadline);
		if (mig == 0)
			kv_test_sleep_ms(2);
	}
	kv_test_sleep_ms(30); /* so that wait_ms is visibly non-zero */
	ctl_client_free(do_done(f->cli, mig, 1, SHARDKV__STATUS__STATUS_OK));
	pthread_join(t, NULL);
	assert_non_null(w.r);
	assert_int_equal(ctl_client_err(w.r), KV_OK);
	assert_int_equal(w.r->node_id, 2);
	assert_int_equal(w.r->n_migration_ids, 1);
	assert_int_equal(w.r->migration_ids[0], mig);
	assert_true(w.r->wait_ms >= 20);
	ctl_client_free(w.r);

	/* A wait that runs out of time says so; the command stays done. */
	Shardkv__AdminResponse *mv;
	Shardkv__AdminRequest rq2 = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminMove m = SHARDKV__ADMIN_MOVE__INIT;
	Shardkv__NodeRef ref = SHARDKV__NODE_REF__INIT;
	r = do_config(f->cli, 0);
	ref.ref_case = SHARDKV__NODE_REF__REF_ID;
	ref.id = 3 - owner_of(r->config, "x");
	ctl_client_free(r);
	m.start.data = (uint8_t *)"x";
	m.start.len = 1;
	m.node = &ref;
	rq2.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_MOVE;
	rq2.move = &m;
	rq2.wait = true;
	rq2.timeout_ms = 200;
	uint64_t t0 = kv_test_now_ms();
	mv = call(f->cli, &rq2);
	assert_int_equal(ctl_client_err(mv), KV_ETIMEDOUT);
	assert_true(kv_test_now_ms() - t0 >= 180);
	assert_true(kv_test_now_ms() - t0 < 800);
	assert_int_equal(mv->n_migration_ids, 1);
	ctl_client_free(mv);

	/* A failed migration fails the wait with its reason. */
	rq2.timeout_ms = 20000;
	m.start.data = (uint8_t *)"\x01";
	m.end.data = (uint8_t *)"\x02";
	m.end.len = 1;
	r = do_config(f->cli, 0);
	ref.id = 3 - owner_of(r->config, "\x01");
	ctl_client_free(r);
	w.rq = &rq2;
	w.r = NULL;
	uint64_t before = epoch_of(f->cli);
	assert_int_equal(pthread_create(&t, NULL, waiter_main, &w), 0);
	for (uint64_t deadline = kv_test_now_ms() + 10000; epoch_of(f->cli) == before;) {
		assert_true(kv_test_now_ms() < deadline);
		kv_test_sleep_ms(2);
	}
	r = do_config(f->cli, 0);
	mig = r->config->migrations[r->config->n_migrations - 1]->id;
	ctl_client_free(r);
	ctl_client_free(do_done(f->cli, mig, 0, SHARDKV__STATUS__STATUS_UNAVAILABLE));
	pthread_join(t, NULL);
	assert_non_null(w.r);
	assert_int_equal(ctl_client_err(w.r), KV_EUNAVAIL);
	assert_non_null(strstr(w.r->error, "failed"));
	ctl_client_free(w.r);
}

/* Reads a gauge from the metrics endpoint; -1 when unavailable. */
static long
metric(const struct fx *f, const char *name)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	char buf[8192], *p;
	size_t n = 0;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	const char *port = strchr(f->metrics, ':') + 1;

	a.sin_port = htons((uint16_t)atoi(port));
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		if (fd >= 0)
			close(fd);
		return -1;
	}
	const char *req = "GET /metrics HTTP/1.0\r\n\r\n";
	if (write(fd, req, strlen(req)) < 0) {
		close(fd);
		return -1;
	}
	for (ssize_t r; n < sizeof(buf) - 1 && (r = read(fd, buf + n, sizeof(buf) - 1 - n)) > 0;)
		n += (size_t)r;
	close(fd);
	buf[n] = '\0';
	char want[128];
	snprintf(want, sizeof(want), "\n%s ", name);
	if ((p = strstr(buf, want)) == NULL)
		return -1;
	return atol(p + strlen(want));
}

static Shardkv__AdminRequest
watch_req(Shardkv__Watch *w, uint64_t known, bool history, uint32_t timeout_ms)
{
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	shardkv__watch__init(w);
	w->known_epoch = known;
	w->history = history;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_WATCH;
	rq.watch = w;
	rq.timeout_ms = timeout_ms;
	return rq;
}

static void
watch_is_answered_within_milliseconds_of_a_change(void **state)
{
	struct fx *f = *state;
	Shardkv__Watch wm;
	Shardkv__AdminRequest rq;
	struct waiter w = {.cli = f->cli, .timeout_ms = 20000};
	Shardkv__AdminResponse *r;
	pthread_t t;
	uint64_t t0;

	ctl_client_free(do_join(f->cli, "tcp://127.0.0.1:7101", false, false));
	ctl_client_free(do_join(f->cli, "tcp://127.0.0.1:7102", false, false));

	/* newer config known: answered at once */
	rq = watch_req(&wm, 0, false, 5000);
	t0 = kv_test_now_ms();
	r = call(f->cli, &rq);
	assert_true(kv_test_now_ms() - t0 < 1000);
	assert_int_equal(r->epoch, 2);
	assert_int_equal(r->config->epoch, 2);
	ctl_client_free(r);

	/* history: every config after known, oldest first */
	rq = watch_req(&wm, 0, true, 5000);
	r = call(f->cli, &rq);
	assert_int_equal(r->n_configs, 2);
	assert_int_equal(r->configs[0]->epoch, 1);
	assert_int_equal(r->configs[1]->epoch, 2);
	ctl_client_free(r);
	wm.max_configs = 1;
	r = call(f->cli, &rq);
	assert_int_equal(r->n_configs, 1);
	assert_int_equal(r->configs[0]->epoch, 1);
	ctl_client_free(r);

	/* nothing new: held until the timeout, then the current config */
	rq = watch_req(&wm, 2, false, 300);
	t0 = kv_test_now_ms();
	r = call(f->cli, &rq);
	assert_true(kv_test_now_ms() - t0 >= 250);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 2);
	ctl_client_free(r);

	/* held, then a change: answered within milliseconds */
	rq = watch_req(&wm, 2, false, 15000);
	w.rq = &rq;
	assert_int_equal(pthread_create(&t, NULL, waiter_main, &w), 0);
	for (uint64_t deadline = kv_test_now_ms() + 10000;
	     metric(f, "shardkv_controller_held_watches") != 1;) {
		assert_true(kv_test_now_ms() < deadline);
		kv_test_sleep_ms(2);
	}
	/* t0 before the change: the watch may be answered before the join's
	 * own reply arrives. */
	t0 = kv_test_now_ms();
	r = do_join(f->cli, "tcp://127.0.0.1:7103", true, false);
	assert_int_equal(r->epoch, 3);
	ctl_client_free(r);
	pthread_join(t, NULL);
	assert_non_null(w.r);
	assert_int_equal(w.r->epoch, 3);
	assert_int_equal(w.r->config->epoch, 3);
	/* Answered by the change, not by the 20 s long-poll timeout. The bound is
	 * loose on purpose: sanitizer builds on a busy machine are slow, and
	 * speed is measured by benchmarks, not asserted here. */
	assert_true(w.t_done >= t0 && w.t_done - t0 < 3000);
	ctl_client_free(w.r);
	assert_int_equal(metric(f, "shardkv_controller_epoch"), 3);
	assert_int_equal(metric(f, "shardkv_controller_held_watches"), 0);
}

static void
many_held_watches_leave_room_for_admin_commands(void **state)
{
	struct fx *f = *state;
	enum { N = 800 };
	static struct waiter w[N];
	static Shardkv__AdminRequest rq[N];
	static Shardkv__Watch wm[N];
	static pthread_t t[N];
	Shardkv__AdminResponse *r;
	int ok = 0;

	ctl_client_free(do_join(f->cli, "tcp://127.0.0.1:7101", false, false));
	for (int i = 0; i < N; i++) {
		rq[i] = watch_req(&wm[i], 1, false, 30000);
		w[i] = (struct waiter){.cli = f->cli, .rq = &rq[i], .timeout_ms = 40000};
		assert_int_equal(pthread_create(&t[i], NULL, waiter_main, &w[i]), 0);
	}
	/* more watches than the cap: the oldest are answered early, admin works */
	for (uint64_t deadline = kv_test_now_ms() + 20000;;) {
		long held = metric(f, "shardkv_controller_held_watches");
		if (held >= 700)
			break;
		assert_true(kv_test_now_ms() < deadline);
		kv_test_sleep_ms(5);
	}
	r = do_status(f->cli);
	assert_int_equal(ctl_client_err(r), KV_OK);
	ctl_client_free(r);
	r = do_join(f->cli, "tcp://127.0.0.1:7102", true, false);
	assert_int_equal(ctl_client_err(r), KV_OK);
	ctl_client_free(r);
	for (int i = 0; i < N; i++) {
		pthread_join(t[i], NULL);
		if (w[i].r != NULL && ctl_client_err(w[i].r) == KV_OK)
			ok++;
		ctl_client_free(w[i].r);
	}
	assert_int_equal(ok, N);
}

struct joiner {
	const char *url;
	int ok, exists, other;
};

static void *
joiner_main(void *arg)
{
	struct joiner *j = arg;
	kv_rpc_client *cli;

	if (kv_rpc_client_create(j->url, &cli) != KV_OK) {
		j->other = 125;
		return NULL;
	}
	for (int i = 0; i < 125; i++) {
		Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
		Shardkv__AdminJoin jn = SHARDKV__ADMIN_JOIN__INIT;
		int rv = 0;
		jn.address = "tcp://127.0.0.1:7777";
		rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_JOIN;
		rq.join = &jn;
		Shardkv__AdminResponse *r = call_to(cli, &rq, 20000, &rv);
		if (r == NULL)
			j->other++;
		else if (ctl_client_err(r) == KV_OK)
			j->ok++;
		else if (ctl_client_err(r) == KV_EEXISTS)
			j->exists++;
		else
			j->other++;
		ctl_client_free(r);
	}
	kv_rpc_client_destroy(cli);
	return NULL;
}

static void
thousand_concurrent_joins_of_one_address_give_exactly_one_success(void **state)
{
	struct fx *f = *state;
	struct joiner j[8];
	pthread_t t[8];
	int ok = 0, exists = 0, other = 0;
	Shardkv__AdminResponse *r;

	for (int i = 0; i < 8; i++) {
		j[i] = (struct joiner){.url = f->url};
		assert_int_equal(pthread_create(&t[i], NULL, joiner_main, &j[i]), 0);
	}
	for (int i = 0; i < 8; i++) {
		pthread_join(t[i], NULL);
		ok += j[i].ok;
		exists += j[i].exists;
		other += j[i].other;
	}
	assert_int_equal(ok, 1);
	assert_int_equal(exists, 999);
	assert_int_equal(other, 0);
	r = do_config(f->cli, 0);
	assert_int_equal(r->epoch, 1);
	assert_int_equal(r->config->n_nodes, 1);
	ctl_client_free(r);
}

static void
restart_with_the_same_data_dir_keeps_history(void **state)
{
	struct fx *f = *state;
	Shardkv__AdminResponse *r;
	uint64_t mig1, e;
	char cluster[32];

	ctl_client_free(do_join(f->cli, "tcp://127.0.0.1:7101", false, false));
	r = do_join(f->cli, "tcp://127.0.0.1:7102", false, false);
	mig1 = r->migration_ids[0];
	snprintf(cluster, sizeof(cluster), "%s", r->config->cluster_id);
	ctl_client_free(r);
	ctl_client_free(do_done(f->cli, mig1, 1, SHARDKV__STATUS__STATUS_OK));
	r = do_move(f->cli, "a", "b", 2, NULL);
	assert_int_equal(ctl_client_err(r), KV_OK);
	ctl_client_free(r);
	e = epoch_of(f->cli);
	assert_int_equal(e, 4);

	stop_controller(f);
	start_controller(f);

	assert_int_equal(epoch_of(f->cli), e);
	r = do_config(f->cli, 1);
	assert_int_equal(r->config->epoch, 1);
	assert_int_equal(r->config->n_nodes, 1);
	assert_string_equal(r->config->cluster_id, cluster);
	ctl_client_free(r);
	r = do_config(f->cli, 0);
	assert_int_equal(r->config->n_migrations, 1); /* the move is still in flight */
	uint64_t mig2 = r->config->migrations[0]->id;
	assert_true(mig2 > mig1);
	ctl_client_free(r);
	r = do_join(f->cli, "tcp://127.0.0.1:7103", true, false);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->node_id, 3); /* ids continue */
	assert_int_equal(r->epoch, e + 1);
	for (size_t i = 0; i < r->n_migration_ids; i++)
		assert_true(r->migration_ids[i] > mig2);
	ctl_client_free(r);
	r = do_done(f->cli, mig2, 0, SHARDKV__STATUS__STATUS_OK);
	assert_int_equal(ctl_client_err(r), KV_OK);
	ctl_client_free(r);
}

static void
servers_register_heartbeat_and_show_in_status(void **state)
{
	struct fx *f = *state;
	Shardkv__AdminResponse *r;
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__Register reg = SHARDKV__REGISTER__INIT;

	/* unknown without join */
	reg.address = "tcp://127.0.0.1:7101";
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_REGISTER_NODE;
	rq.register_node = &reg;
	r = call(f->cli, &rq);
	assert_int_equal(ctl_client_err(r), KV_ENOTFOUND);
	assert_non_null(strstr(r->error, "--join"));
	ctl_client_free(r);
	/* join */
	reg.join = true;
	reg.boot_id = 77;
	r = call(f->cli, &rq);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->node_id, 1);
	assert_int_equal(r->epoch, 1);
	ctl_client_free(r);
	/* a restart resumes by id, and by address */
	reg.join = false;
	reg.resume_node_id = 1;
	r = call(f->cli, &rq);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->node_id, 1);
	assert_int_equal(r->epoch, 1);
	ctl_client_free(r);
	reg.cluster_id = "0000000000000000";
	r = call(f->cli, &rq);
	assert_int_equal(ctl_client_err(r), KV_EINVAL);
	assert_non_null(strstr(r->error, "cluster id mismatch"));
	ctl_client_free(r);

	/* heartbeat with split keys: the join cuts at one of them */
	Shardkv__AdminRequest hb = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__Heartbeat h = SHARDKV__HEARTBEAT__INIT;
	Shardkv__RangeStats rs = SHARDKV__RANGE_STATS__INIT, *rsp = &rs;
	ProtobufCBinaryData sk[3] = {
	    {3, (uint8_t *)"k25"}, {3, (uint8_t *)"k50"}, {3, (uint8_t *)"k75"}};
	rs.keys = 1000;
	rs.bytes = 100000;
	rs.split_keys = sk;
	rs.n_split_keys = 3;
	h.node_id = 1;
	h.boot_id = 77;
	h.epoch_applied = 1;
	h.ranges = &rsp;
	h.n_ranges = 1;
	h.keys = 1000;
	h.bytes = 100000;
	h.ops_per_sec = 12.5;
	h.memory_bytes = 1 << 20;
	hb.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_HEARTBEAT;
	hb.heartbeat = &h;
	r = call(f->cli, &hb);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 1);
	ctl_client_free(r);
	h.node_id = 9;
	r = call(f->cli, &hb);
	assert_int_equal(ctl_client_err(r), KV_ENOTFOUND);
	ctl_client_free(r);

	r = do_join(f->cli, "tcp://127.0.0.1:7102", false, false);
	assert_int_equal(r->n_migration_ids, 1);
	const Shardkv__Migration *m = r->config->migrations[0];
	ProtobufCBinaryData cut = m->start.len ? m->start : m->end;
	assert_int_equal(cut.len, 3);
	assert_memory_equal(cut.data, "k50", 3);
	uint64_t mig = m->id;
	ctl_client_free(r);

	/* progress shows in status, not as a new epoch */
	Shardkv__AdminRequest pr = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__MigrationProgress p = SHARDKV__MIGRATION_PROGRESS__INIT;
	p.migration_id = mig;
	p.node_id = 1;
	p.phase = SHARDKV__MIGRATION_PHASE__MIGRATION_PHASE_COPYING;
	p.keys_copied = 100;
	p.bytes_copied = 10000;
	p.bytes_total = 50000;
	p.rate_bytes_s = 10000;
	pr.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_MIGRATION_PROGRESS;
	pr.migration_progress = &p;
	r = call(f->cli, &pr);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 2);
	ctl_client_free(r);

	r = do_status(f->cli);
	assert_int_equal(ctl_client_err(r), KV_OK);
	assert_int_equal(r->epoch, 2);
	assert_non_null(r->report);
	assert_int_equal(r->report->n_nodes, 2);
	assert_int_equal(r->report->nodes[0]->node_id, 1);
	assert_int_equal(r->report->nodes[0]->keys, 1000);
	assert_int_equal(r->report->nodes[0]->bytes, 100000);
	assert_int_equal(r->report->nodes[0]->memory_bytes, 1 << 20);
	assert_int_equal(r->report->nodes[0]->epoch_applied, 1);
	assert_true(r->report->nodes[0]->last_seen_ms < 10000);
	assert_int_equal(r->report->nodes[0]->n_ranges, 1);
	assert_int_equal(r->report->n_migrations, 1);
	assert_int_equal(r->report->migrations[0]->phase,
	                 SHARDKV__MIGRATION_PHASE__MIGRATION_PHASE_COPYING);
	assert_int_equal(r->report->migrations[0]->bytes_copied, 10000);
	assert_int_equal(r->report->migrations[0]->eta_ms, 4000);
	assert_int_equal(r->report->n_controllers, 1);
	assert_int_equal(r->report->controllers[0]->id, 1);
	assert_string_equal(r->report->controllers[0]->address, f->url);
	assert_int_equal(r->report->controllers[0]->role,
	                 SHARDKV__REPLICA_ROLE__REPLICA_ROLE_STANDALONE);
	ctl_client_free(r);
}

static void
retried_command_with_same_request_id_applies_once(void **state)
{
	struct fx *f = *state;
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminJoin j = SHARDKV__ADMIN_JOIN__INIT;
	Shardkv__AdminResponse *a, *b;
	uint64_t rid;

	j.address = "tcp://127.0.0.1:7101";
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_JOIN;
	rq.join = &j;
	rq.client_id = 4242;
	a = call(f->cli, &rq);
	rid = rq.request_id;
	assert_int_equal(ctl_client_err(a), KV_OK);
	/* the same request again: the first answer, nothing applied */
	b = ctl_client_call(f->cli, &rq, 5000, NULL);
	assert_non_null(b);
	assert_int_equal(b->request_id, rid);
	assert_int_equal(ctl_client_err(b), KV_OK);
	assert_int_equal(b->epoch, a->epoch);
	assert_int_equal(b->node_id, a->node_id);
	ctl_client_free(a);
	ctl_client_free(b);
	/* a new request id is a new command */
	a = call(f->cli, &rq);
	assert_int_equal(ctl_client_err(a), KV_EEXISTS);
	ctl_client_free(a);
	assert_int_equal(epoch_of(f->cli), 1);
}

static void
malformed_requests_get_clear_errors(void **state)
{
	struct fx *f = *state;
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminResponse *r;
	nng_msg *m, *reply = NULL;

	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD__NOT_SET;
	r = call(f->cli, &rq);
	assert_int_equal(ctl_client_err(r), KV_EINVAL);
	ctl_client_free(r);

	Shardkv__AdminStatus st = SHARDKV__ADMIN_STATUS__INIT;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_STATUS;
	rq.status = &st;
	rq.version = 7;
	r = call(f->cli, &rq);
	assert_int_equal(ctl_client_err(r), KV_EINVAL);
	assert_non_null(strstr(r->error, "version"));
	ctl_client_free(r);

	assert_int_equal(nng_msg_alloc(&m, 0), 0);
	assert_int_equal(nng_msg_append(m, "\xff\xff\xff\xff garbage", 12), 0);
	assert_int_equal(kv_rpc_call(f->cli, m, &reply, 5000), KV_OK);
	r = shardkv__admin_response__unpack(NULL, nng_msg_len(reply), nng_msg_body(reply));
	nng_msg_free(reply);
	assert_non_null(r);
	assert_int_equal(r->status, SHARDKV__STATUS__STATUS_PROTOCOL_ERROR);
	ctl_client_free(r);
}

static int
run_cli(const char *const argv[], char *out, size_t outlen)
{
	char logf[] = "/tmp/kv_ctl_cli_XXXXXX";
	int fd = mkstemp(logf), st = 0;
	pid_t pid;
	ssize_t n;

	assert_true(fd >= 0);
	close(fd);
	pid = spawn(argv, logf);
	assert_true(pid > 0);
	assert_int_equal(kv_proc_wait(pid, 10000, &st), 0);
	fd = open(logf, O_RDONLY);
	n = read(fd, out, outlen - 1);
	out[n > 0 ? n : 0] = '\0';
	close(fd);
	unlink(logf);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void
command_line_errors_exit_2_and_start_failures_exit_1(void **state)
{
	struct fx *f = *state;
	char out[4096];

	const char *a1[] = {KV_CONTROLLER_BIN, "--bogus", NULL};
	assert_int_equal(run_cli(a1, out, sizeof(out)), 2);
	assert_non_null(strstr(out, "unknown option --bogus"));
	const char *a2[] = {KV_CONTROLLER_BIN, "--listen", f->url, NULL};
	assert_int_equal(run_cli(a2, out, sizeof(out)), 2);
	assert_non_null(strstr(out, "--data-dir"));
	const char *a3[] = {KV_CONTROLLER_BIN, "--help", NULL};
	assert_int_equal(run_cli(a3, out, sizeof(out)), 0);
	assert_non_null(strstr(out, "usage:"));
	/* the port is taken by the fixture's controller */
	char dir2[160];
	snprintf(dir2, sizeof(dir2), "%s/other", f->dir);
	const char *a4[] = {KV_CONTROLLER_BIN, "--listen", f->url, "--data-dir", dir2, NULL};
	assert_int_equal(run_cli(a4, out, sizeof(out)), 1);
	assert_non_null(strstr(out, "address in use"));
	/* the data dir is locked by the fixture's controller */
	char url2[64];
	kv_test_free_url(url2, sizeof(url2));
	const char *a5[] = {KV_CONTROLLER_BIN, "--listen", url2, "--data-dir", f->dir, NULL};
	assert_int_equal(run_cli(a5, out, sizeof(out)), 1);
	assert_non_null(strstr(out, "another controller"));
	const char *a6[] = {KV_CONTROLLER_BIN, "--listen",      url2,
	                    "--data-dir",      "/proc/no/such", NULL};
	assert_int_equal(run_cli(a6, out, sizeof(out)), 1);
	assert_non_null(strstr(out, "cannot create data dir"));
}

/* The binary: SIGTERM answers a held watch, logs "stopping" and "stopped"
 * and exits 0 (main.c is the only place that handles signals). */
static void
binary_stops_on_sigterm_answering_held_watches_with_exit_0(void **state)
{
	struct fx *f = *state;
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__Watch wa = SHARDKV__WATCH__INIT;
	struct waiter w = {.rq = &rq, .timeout_ms = 20000};
	char url[64], dir[160], logf[180], out[8192] = "";
	pthread_t t;
	int st = 0;

	kv_test_free_url(url, sizeof(url));
	snprintf(dir, sizeof(dir), "%s/bin", f->dir);
	snprintf(logf, sizeof(logf), "%s/bin.log", f->dir);
	const char *argv[] = {KV_CONTROLLER_BIN, "--listen", url, "--data-dir", dir, NULL};
	pid_t pid = spawn(argv, logf);
	assert_true(pid > 0);
	assert_int_equal(kv_rpc_client_create(url, &w.cli), KV_OK);
	/* Ready when it answers a config request. */
	for (uint64_t deadline = kv_test_now_ms() + 10000;;) {
		Shardkv__AdminRequest g = SHARDKV__ADMIN_REQUEST__INIT;
		Shardkv__AdminGetConfig gc = SHARDKV__ADMIN_GET_CONFIG__INIT;
		g.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_GET_CONFIG;
		g.get_config = &gc;
		Shardkv__AdminResponse *r = call_to(w.cli, &g, 200, NULL);
		if (r != NULL) {
			ctl_client_free(r);
			break;
		}
		assert_true(kv_test_now_ms() < deadline);
		assert_false(kv_proc_exited(pid, NULL)); /* still running */
		kv_test_sleep_ms(5);
	}
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_WATCH;
	rq.watch = &wa;
	rq.timeout_ms = 15000;
	assert_int_equal(pthread_create(&t, NULL, waiter_main, &w), 0);
	kv_test_sleep_ms(200); /* held: nothing changes */
	uint64_t t0 = kv_test_now_ms();
	kill(pid, SIGTERM);
	assert_int_equal(kv_proc_wait(pid, 10000, &st), 0);
	assert_true(kv_test_now_ms() - t0 < 5000);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	pthread_join(t, NULL);
	assert_non_null(w.r);
	assert_int_equal(ctl_client_err(w.r), KV_OK);
	ctl_client_free(w.r);
	kv_rpc_client_destroy(w.cli);
	int fd = open(logf, O_RDONLY);
	assert_true(fd >= 0);
	ssize_t n = read(fd, out, sizeof(out) - 1);
	out[n > 0 ? n : 0] = '\0';
	close(fd);
	assert_non_null(strstr(out, "stopping signal=SIGTERM"));
	assert_non_null(strstr(out, "controller stopped"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(join_rules_and_refusals, setup, teardown),
	    cmocka_unit_test_setup_teardown(move_rules_and_refusals, setup, teardown),
	    cmocka_unit_test_setup_teardown(leave_drains_and_node_becomes_gone, setup, teardown),
	    cmocka_unit_test_setup_teardown(failed_migration_returns_range_to_source, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(wait_answers_when_migrations_finish, setup, teardown),
	    cmocka_unit_test_setup_teardown(watch_is_answered_within_milliseconds_of_a_change,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(many_held_watches_leave_room_for_admin_commands, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(
	        thousand_concurrent_joins_of_one_address_give_exactly_one_success, setup, teardown),
	    cmocka_unit_test_setup_teardown(restart_with_the_same_data_dir_keeps_history, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(servers_register_heartbeat_and_show_in_status, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(retried_command_with_same_request_id_applies_once,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(malformed_requests_get_clear_errors, setup, teardown),
	    cmocka_unit_test_setup_teardown(command_line_errors_exit_2_and_start_failures_exit_1,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        binary_stops_on_sigterm_answering_held_watches_with_exit_0, setup, teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
