/*
 * test_dryrun_inproc.c - dry runs and the status figures with a real
 * controller and real shard servers inside the test process
 * (doc/contract.md §4, §5): a dry run of move and of rebalance answers the
 * very migrations the real command then starts and leaves the epoch as it
 * was; the CLI prints the plan as text and as JSON; refused dry runs
 * change nothing; status reports each server's uptime, and right after a
 * move the keys where they are now.
 *
 * Every wait polls with a deadline.
 */
#include "common/err.h"
#include "shardkv.h"
#include "tests/support/inproc_cluster.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define PATIENCE INPROC_CLUSTER_PATIENCE_MS
#define NKEYS    200

/* The controller and two servers. */
static inproc_cluster cl = {.o = {.name = "kvdry"}};

/* Waits until both servers are active and nothing moves. */
static void
wait_settled(void)
{
	uint64_t t0 = kv_test_now_ms();

	for (;;) {
		kv_config *cfg = inproc_cluster_config(&cl);
		bool ok = cfg && cfg->nmigs == 0 && cfg->nnodes == 2;
		for (size_t i = 0; ok && i < cfg->nnodes; i++)
			ok = cfg->nodes[i].state == KV_NODE_ACTIVE;
		kv_config_free(cfg);
		if (ok)
			return;
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the cluster never settled");
		kv_test_sleep_ms(20);
	}
}

static shardkv_client *
client(void)
{
	shardkv_options o = {.timeout_ms = 5000};
	shardkv_client *k = NULL;

	assert_int_equal(shardkv_open(cl.ctl_url, &o, &k), 0);
	return k;
}

/* Both servers up (the second takes half), NKEYS keys written. */
static shardkv_client *
cluster_with_data(void)
{
	shardkv_client *k;
	char key[16];

	inproc_cluster_srv_up(&cl, 0);
	srv_wait_ready(cl.srv[0].url, 1, PATIENCE, NULL);
	inproc_cluster_srv_up(&cl, 1);
	wait_settled();
	srv_wait_ready(cl.srv[1].url, 1, PATIENCE, NULL);
	k = client();
	for (int i = 0; i < NKEYS; i++) {
		uint64_t t0 = kv_test_now_ms();
		/* First letters A..Z: both halves of the key space get some. */
		snprintf(key, sizeof(key), "%c%03d", 'A' + i % 26, i);
		while (shardkv_put(k, key, strlen(key), "value", 5) != 0) {
			if (kv_test_now_ms() - t0 > PATIENCE)
				fail_msg("put %s: %s", key, shardkv_errmsg());
			kv_test_sleep_ms(20);
		}
	}
	return k;
}

/* The keys status reports for node id (-1: no figures yet). */
static long long
status_keys(shardkv_client *k, uint32_t id)
{
	shardkv_config *st = NULL;
	long long n = -1;

	assert_int_equal(shardkv_status(k, &st), 0);
	for (size_t i = 0; i < st->nnodes; i++)
		if (st->nodes[i].id == id && st->nodes[i].has_stats)
			n = (long long)st->nodes[i].keys;
	shardkv_config_free(st);
	return n;
}

/* Waits until status reports n1 keys on node 1 and n2 on node 2. */
static void
wait_counts(shardkv_client *k, long long n1, long long n2)
{
	uint64_t t0 = kv_test_now_ms();

	while (status_keys(k, 1) != n1 || status_keys(k, 2) != n2) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("status never reported %lld and %lld keys (%lld, %lld)", n1, n2,
			         status_keys(k, 1), status_keys(k, 2));
		kv_test_sleep_ms(50);
	}
}

/* Waits until both nodes have reported all the keys between them; returns
 * node 2's count. */
static long long
wait_reported(shardkv_client *k)
{
	uint64_t t0 = kv_test_now_ms();
	long long n1, n2;

	while ((n1 = status_keys(k, 1)) < 0 || (n2 = status_keys(k, 2)) < 0 || n1 + n2 != NKEYS) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("status never reported the %d keys", NKEYS);
		kv_test_sleep_ms(50);
	}
	return n2;
}

/* Waits until no migration is in flight. */
static void
wait_no_migration(void)
{
	uint64_t t0 = kv_test_now_ms();

	for (;;) {
		kv_config *cfg = inproc_cluster_config(&cl);
		bool idle = cfg && cfg->nmigs == 0;
		kv_config_free(cfg);
		if (idle)
			return;
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the migrations never finished");
		kv_test_sleep_ms(20);
	}
}

static uint64_t
latest_epoch(void)
{
	kv_config *cfg = inproc_cluster_config(&cl);
	uint64_t e;

	assert_non_null(cfg);
	e = cfg->epoch;
	kv_config_free(cfg);
	return e;
}

/* Asserts that the migrations the configuration at `epoch` started are the
 * plan's steps, in order. */
static void
assert_plan_carried_out(const shardkv_plan *p, uint64_t epoch)
{
	kv_config *cfg = inproc_cluster_config(&cl);
	size_t n = 0;

	assert_non_null(cfg);
	assert_int_equal(cfg->epoch, epoch);
	for (size_t i = 0; i < cfg->nmigs; i++) {
		const kv_migration *m = &cfg->migs[i];
		if (m->epoch != epoch)
			continue;
		assert_true(n < p->nsteps);
		const shardkv_plan_step *s = &p->steps[n++];
		assert_int_equal(m->from, s->from);
		assert_int_equal(m->to, s->to);
		assert_int_equal(m->start.len, s->start.len);
		assert_int_equal(m->end.len, s->end.len);
		assert_memory_equal(m->start.data ? (void *)m->start.data : (void *)"",
		                    s->start.data, s->start.len);
		assert_memory_equal(m->end.data ? (void *)m->end.data : (void *)"", s->end.data,
		                    s->end.len);
	}
	assert_int_equal(n, p->nsteps);
	kv_config_free(cfg);
}

static void
move_dry_run_returns_the_plan_the_move_then_starts_and_changes_nothing(void **state)
{
	shardkv_client *k;
	shardkv_plan *p = NULL;
	shardkv_admin_result r;
	char out[8192], err[2048];
	uint64_t e0;
	long long on2;

	(void)state;
	k = cluster_with_data();
	/* The estimates come from heartbeats: wait until both have reported. */
	on2 = wait_reported(k);
	assert_true(on2 > 0 && on2 < NKEYS);
	e0 = latest_epoch();

	/* Everything to node 1: node 2's ranges are the plan. */
	assert_int_equal(shardkv_move_plan(k, "", 0, "", 0, "1", 0, &p), 0);
	assert_int_equal(p->epoch, e0);
	assert_true(p->nsteps >= 1);
	uint64_t keys = 0;
	for (size_t i = 0; i < p->nsteps; i++) {
		assert_int_equal(p->steps[i].from, 2);
		assert_int_equal(p->steps[i].to, 1);
		keys += p->steps[i].keys;
		assert_true(p->steps[i].keys == 0 || p->steps[i].bytes > p->steps[i].keys);
	}
	/* Whole ranges move: the estimate is node 2's count. */
	assert_int_equal(keys, (uint64_t)on2);
	assert_int_equal(latest_epoch(), e0);
	shardkv_plan_free(p);
	/* Part of a range: an estimate from the split keys (40 keys start
	 * with A to E, all on node 2, which took the lower half at its join). */
	assert_int_equal(shardkv_move_plan(k, "A", 1, "F", 1, "1", 0, &p), 0);
	assert_int_equal(p->nsteps, 1);
	assert_int_equal(p->steps[0].from, 2);
	/* Node 2 reports its range in four pieces of about 30 keys: a piece
	 * cut by START or END counts half, so the estimate is off by at most
	 * half a piece at each end. */
	assert_true(p->steps[0].keys >= 10 && p->steps[0].keys <= 70);
	assert_true(p->steps[0].bytes > p->steps[0].keys);
	shardkv_plan_free(p);
	assert_int_equal(shardkv_move_plan(k, "", 0, "", 0, "1", 0, &p), 0);

	/* The CLI: the same plan as text and as JSON, exit 0, nothing changed. */
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "move", "", "",
	                                    "1", "--dry-run", NULL),
	                 0);
	assert_non_null(strstr(out, "dry run: moving [, ) to node 1 would start "));
	assert_non_null(strstr(out, "(nothing changed, epoch stays "));
	assert_non_null(strstr(out, ") 2 -> 1 keys=~"));
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "--json",
	                                    "move", "", "", "1", "--dry-run", NULL),
	                 0);
	char head[128];
	snprintf(head, sizeof(head),
	         "{\"epoch\": %llu, \"command\": \"move\", \"dry_run\": true, \"migrations\": %zu, "
	         "\"plan\": [{\"start\": ",
	         (unsigned long long)e0, p->nsteps);
	assert_non_null(strstr(out, head));
	assert_non_null(strstr(out, "\"from\": 2, \"to\": 1, \"keys\": "));
	assert_int_equal(latest_epoch(), e0);

	/* The real move starts exactly those migrations. */
	assert_int_equal(shardkv_move(k, "", 0, "", 0, "1", 0, 0, &r), 0);
	assert_int_equal(r.epoch, e0 + 1);
	assert_int_equal(r.nmigrations, p->nsteps);
	assert_plan_carried_out(p, e0 + 1);
	shardkv_plan_free(p);
	wait_no_migration();

	/* Nothing left to move: an empty plan. */
	assert_int_equal(shardkv_move_plan(k, "", 0, "", 0, "1", 0, &p), 0);
	assert_int_equal(p->nsteps, 0);
	shardkv_plan_free(p);
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "move", "a",
	                                    "b", "1", "--dry-run", NULL),
	                 0);
	assert_non_null(strstr(out, "would start 0 migrations"));
	shardkv_close(k);
}

static void
rebalance_dry_run_returns_the_plan_the_rebalance_then_starts(void **state)
{
	shardkv_client *k;
	shardkv_plan *p = NULL;
	shardkv_admin_result r;
	char out[8192], err[2048];
	uint64_t e0;

	(void)state;
	k = cluster_with_data();
	/* All the data on node 1, and the figures say so. */
	assert_int_equal(shardkv_move(k, "", 0, "", 0, "1", 0, SHARDKV_WAIT, &r), 0);
	wait_no_migration();
	wait_counts(k, NKEYS, 0);
	e0 = latest_epoch();

	assert_int_equal(shardkv_rebalance_plan(k, 0, &p), 0);
	assert_int_equal(p->epoch, e0);
	assert_true(p->nsteps >= 1);
	for (size_t i = 0; i < p->nsteps; i++) {
		assert_int_equal(p->steps[i].from, 1);
		assert_int_equal(p->steps[i].to, 2);
		assert_true(p->steps[i].keys > 0);
	}
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "--json",
	                                    "rebalance", "--dry-run", NULL),
	                 0);
	assert_non_null(strstr(out, "\"command\": \"rebalance\", \"dry_run\": true"));
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "rebalance",
	                                    "--dry-run", NULL),
	                 0);
	assert_non_null(strstr(out, "dry run: rebalancing would start "));
	assert_int_equal(latest_epoch(), e0);

	assert_int_equal(shardkv_rebalance(k, 0, 0, &r), 0);
	assert_int_equal(r.epoch, e0 + 1);
	assert_int_equal(r.nmigrations, p->nsteps);
	assert_plan_carried_out(p, e0 + 1);
	shardkv_plan_free(p);
	wait_no_migration();
	shardkv_close(k);
}

static void
refused_dry_runs_change_nothing_and_exit_like_the_command(void **state)
{
	shardkv_client *k;
	shardkv_plan *p = (shardkv_plan *)&p;
	char out[4096], err[2048];
	uint64_t e0;

	(void)state;
	k = cluster_with_data();
	e0 = latest_epoch();
	/* An unknown node: exit 2, as the move itself. */
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "move", "a",
	                                    "b", "9", "--dry-run", NULL),
	                 2);
	assert_non_null(strstr(err, "shardkv: move: "));
	assert_int_equal(shardkv_move_plan(k, "a", 1, "b", 1, "9", 0, &p), SHARDKV_ENOTFOUND);
	assert_null(p);
	/* An inverted range, refused before the controller is asked. */
	assert_int_equal(shardkv_move_plan(k, "b", 1, "a", 1, "1", 0, &p), SHARDKV_EINVAL);
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "move", "b",
	                                    "a", "1", "--dry-run", NULL),
	                 2);
	/* --wait with --dry-run: a usage error. */
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "rebalance",
	                                    "--dry-run", "--wait", NULL),
	                 2);
	assert_non_null(strstr(err, "--wait and --dry-run exclude each other"));
	assert_int_equal(latest_epoch(), e0);

	/* A raw dry run with wait, or of a command that has none, is refused
	 * by the controller itself. */
	kv_admin_req q = {.op = KV_ADM_REBALANCE, .dry_run = true, .wait = true, .request_id = 77};
	char why[200];
	assert_int_equal(inproc_cluster_admin(&cl, &q, NULL, NULL, why, sizeof(why)), KV_EINVAL);
	assert_non_null(strstr(why, "exclude each other"));
	assert_int_equal(latest_epoch(), e0);
	shardkv_close(k);
}

static void
status_reports_each_servers_uptime(void **state)
{
	shardkv_client *k;
	shardkv_config *st = NULL;
	char out[8192], err[2048];
	uint64_t t0 = kv_test_now_ms();

	(void)state;
	k = cluster_with_data();
	/* Known once each server has sent a full heartbeat. */
	for (;;) {
		bool known = true;
		assert_int_equal(shardkv_status(k, &st), 0);
		for (size_t i = 0; i < st->nnodes; i++)
			known = known && st->nodes[i].uptime_ms > 0;
		shardkv_config_free(st);
		if (known)
			break;
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("status never reported the uptimes");
		kv_test_sleep_ms(50);
	}
	assert_int_equal(shardkv_status(k, &st), 0);
	for (size_t i = 0; i < st->nnodes; i++)
		/* Not longer than the test has been running. */
		assert_true(st->nodes[i].uptime_ms <= kv_test_now_ms() - t0 + 2000);
	shardkv_config_free(st);
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "status", NULL), 0);
	assert_non_null(strstr(out, " up="));
	assert_null(strstr(out, " up=?"));
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "--json", "status", NULL),
	    0);
	assert_non_null(strstr(out, ", \"uptime_ms\": "));
	assert_null(strstr(out, ", \"uptime_ms\": 0,"));
	shardkv_close(k);
}

/* The status right after `move --wait` counts the keys where they are now,
 * not where they were before the move (heartbeats are a second apart). */
static void
status_right_after_a_move_counts_the_keys_where_they_are_now(void **state)
{
	shardkv_client *k;
	shardkv_admin_result r;
	char out[8192], err[2048];

	(void)state;
	k = cluster_with_data();
	long long on2 = wait_reported(k);
	assert_true(on2 > 0);
	assert_int_equal(shardkv_move(k, "", 0, "", 0, "1", 0, SHARDKV_WAIT, &r), 0);
	assert_int_equal(status_keys(k, 1), NKEYS);
	assert_int_equal(status_keys(k, 2), 0);
	/* And back, through the CLI. */
	assert_int_equal(inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "move", "", "",
	                                    "2", "--wait", NULL),
	                 0);
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "--json", "status", NULL),
	    0);
	char want[64];
	snprintf(want, sizeof(want), "\"state\": \"active\", \"keys\": %d,", NKEYS);
	assert_non_null(strstr(out, want));
	assert_non_null(strstr(out, "\"state\": \"active\", \"keys\": 0,"));
	/* The servers' own reports then say the same (they come at once). */
	wait_counts(k, 0, NKEYS);
	shardkv_close(k);
}

/* An administrator's move pins its span against the balancer; the library
 * and `config` (text and JSON) list the pin until a rebalance clears it. */
static void
config_lists_the_pins_a_move_set_until_a_rebalance(void **state)
{
	shardkv_client *k;
	shardkv_config *cfg = NULL;
	shardkv_admin_result r;
	char out[8192], err[2048];

	(void)state;
	k = cluster_with_data();
	assert_int_equal(shardkv_config_get(k, 0, &cfg), 0);
	assert_int_equal(cfg->npins, 0);
	shardkv_config_free(cfg);
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "--json", "config", NULL),
	    0);
	assert_non_null(strstr(out, "\"pins\": []"));
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "config", NULL), 0);
	assert_null(strstr(out, "pins"));

	/* [B, D) and [C, E) to node 1: one pin [B, E) (pins that overlap merge). */
	assert_int_equal(shardkv_move(k, "B", 1, "D", 1, "1", 0, SHARDKV_WAIT, &r), 0);
	assert_int_equal(shardkv_move(k, "C", 1, "E", 1, "1", 0, SHARDKV_WAIT, &r), 0);
	wait_no_migration();
	assert_int_equal(shardkv_config_get(k, 0, &cfg), 0);
	assert_int_equal(cfg->npins, 1);
	assert_int_equal(cfg->pins[0].start.len, 1);
	assert_memory_equal(cfg->pins[0].start.data, "B", 1);
	assert_int_equal(cfg->pins[0].end.len, 1);
	assert_memory_equal(cfg->pins[0].end.data, "E", 1);
	shardkv_config_free(cfg);
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "--json", "config", NULL),
	    0);
	assert_non_null(strstr(out, "\"pins\": [{\"start\": \"B\", \"end\": \"E\"}]"));
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "--json", "status", NULL),
	    0);
	assert_non_null(strstr(out, "\"pins\": [{\"start\": \"B\", \"end\": \"E\"}]"));
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "config", NULL), 0);
	assert_non_null(strstr(out, "pins (left alone by the balancer until a rebalance):\n"
	                            "  [\"B\", \"E\")\n"));

	/* A rebalance unpins everything. */
	assert_int_equal(shardkv_rebalance(k, 0, SHARDKV_WAIT, &r), 0);
	wait_no_migration();
	assert_int_equal(shardkv_config_get(k, 0, &cfg), 0);
	assert_int_equal(cfg->npins, 0);
	assert_null(cfg->pins);
	shardkv_config_free(cfg);
	assert_int_equal(
	    inproc_cluster_cli(&cl, out, sizeof(out), err, sizeof(err), "--json", "config", NULL),
	    0);
	assert_non_null(strstr(out, "\"pins\": []"));
	shardkv_close(k);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    INPROC_CLUSTER_TEST(
	        move_dry_run_returns_the_plan_the_move_then_starts_and_changes_nothing, &cl),
	    INPROC_CLUSTER_TEST(rebalance_dry_run_returns_the_plan_the_rebalance_then_starts, &cl),
	    INPROC_CLUSTER_TEST(refused_dry_runs_change_nothing_and_exit_like_the_command, &cl),
	    INPROC_CLUSTER_TEST(status_reports_each_servers_uptime, &cl),
	    INPROC_CLUSTER_TEST(status_right_after_a_move_counts_the_keys_where_they_are_now, &cl),
	    INPROC_CLUSTER_TEST(config_lists_the_pins_a_move_set_until_a_rebalance, &cl),
	};

	if (getenv("KV_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KV_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
