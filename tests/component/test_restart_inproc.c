/*
 * test_restart_inproc.c - a restarted server never counts as in sync by
 * accident (doc/replication.md "Failover"), with a real controller and two
 * real shard servers in the test process (--replicas 2, --min-insync 2,
 * leases of 2 s so that no node is declared down in these tests):
 *
 * - the restarted process's first lease renewal reaches the controller
 *   before its registration (played by the test: a renewal of node 2 with
 *   a new boot id that says it restarted, while node 2's server is
 *   stopped): the renewal gets no lease, and the controller fails node 2's
 *   range over and takes it out of every ISR before any registration; the
 *   server then starts, is copied and rejoins every ISR, nothing
 *   acknowledged lost;
 * - the controller restarts, then the server restarts: the new controller
 *   never saw the old boot id, and still fails the range over on the
 *   server's registration (it says it restarted).
 *
 * Node 2 leads the range [w1, w2): a failover shows as node 1 leading it.
 * Every wait polls with a deadline.
 */
#include "common/err.h"
#include "shardserver/server.h"
#include "tests/support/inproc_cluster.h"
#include "tests/support/inproc_srv.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <stdio.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define PATIENCE INPROC_CLUSTER_PATIENCE_MS
#define NK       300 /* keys written before the restart */

static inproc_cluster rf = {.o = {.name = "kvrsfirst",
                                  .replicas = 2,
                                  .min_insync = 2,
                                  .lease_ms = 2000,
                                  .lease_margin_ms = 1000}};
static inproc_cluster rc = {.o = {.name = "kvrsctl",
                                  .replicas = 2,
                                  .min_insync = 2,
                                  .lease_ms = 2000,
                                  .lease_margin_ms = 1000}};

/* The primary of the range holding key in cfg, or 0. */
static uint32_t
primary_of(const kv_config *cfg, const char *key)
{
	long i = kv_config_find_range(cfg, key, strlen(key));
	return i >= 0 ? cfg->ranges[i].node : 0;
}

/* Whether node is in the ISR of some range of cfg with another member. */
static bool
in_a_shared_isr(const kv_config *cfg, uint32_t node)
{
	for (size_t i = 0; i < cfg->nranges; i++) {
		const kv_range *r = &cfg->ranges[i];
		if (kv_range_ninsync(r) < 2)
			continue;
		for (uint32_t j = 0; j < kv_range_ninsync(r); j++)
			if (kv_range_insync(r, j) == node)
				return true;
	}
	return false;
}

/* Whether every range has two in-sync members. */
static bool
all_in_sync(inproc_cluster *c)
{
	kv_config *cfg = inproc_cluster_config(c);
	bool ok = cfg != NULL && cfg->nranges > 0;

	for (size_t i = 0; ok && i < cfg->nranges; i++)
		ok = kv_range_ninsync(&cfg->ranges[i]) == 2;
	kv_config_free(cfg);
	return ok;
}

static void
wait_all_in_sync(inproc_cluster *c, const char *when)
{
	uint64_t t0 = kv_test_now_ms();

	while (!all_in_sync(c)) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("%s: a range never had both nodes in its ISR", when);
		kv_test_sleep_ms(10);
	}
}

/* Whether node 1 leads [w1, w2) in the latest configuration (nothing
 * moves it back to node 2 in these tests). */
static bool
led_by_1(inproc_cluster *c)
{
	kv_config *cfg = inproc_cluster_config(c);
	bool ok = cfg != NULL && primary_of(cfg, "w15") == 1;

	kv_config_free(cfg);
	return ok;
}

/* Waits until node 2's restart is handled: the first configuration after
 * `before` in which node 1 leads [w1, w2) also has node 2 in no shared
 * ISR, and the controller declared no node down. */
static void
wait_failed_over(inproc_cluster *c, uint64_t before, const char *when)
{
	uint64_t t0 = kv_test_now_ms(), e;
	char m[16384];
	kv_config *cfg = NULL;

	while (!led_by_1(c)) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("%s: node 2 still leads [w1, w2)", when);
		kv_test_sleep_ms(10);
	}
	print_message("%s: node 1 led [w1, w2) %llu ms into the wait\n", when,
	              (unsigned long long)(kv_test_now_ms() - t0));
	for (e = before + 1;; e++) {
		kv_admin_req q = {.op = KV_ADM_GET_CONFIG, .epoch = e};
		assert_int_equal(inproc_cluster_admin(c, &q, &cfg, NULL, NULL, 0), KV_OK);
		assert_non_null(cfg);
		if (primary_of(cfg, "w15") == 1)
			break;
		kv_config_free(cfg);
	}
	if (in_a_shared_isr(cfg, 2))
		fail_msg("%s: epoch %llu failed [w1, w2) over but left node 2 in an ISR", when,
		         (unsigned long long)e);
	kv_config_free(cfg);
	inproc_cluster_scrape_metrics(c, m, sizeof(m));
	assert_non_null(strstr(m, "\nshardkv_controller_nodes_declared_down_total 0\n"));
}

/* The latest epoch. */
static uint64_t
latest_epoch(inproc_cluster *c)
{
	kv_config *cfg = inproc_cluster_config(c);
	uint64_t e;

	assert_non_null(cfg);
	e = cfg->epoch;
	kv_config_free(cfg);
	return e;
}

/* Two servers in sync, node 2 leading [w1, w2), NK keys written through
 * the primaries. */
static void
two_in_sync(inproc_cluster *c)
{
	char why[300], key[16], val[16];

	inproc_cluster_srv_up(c, 0);
	srv_wait_ready(c->srv[0].url, 1, PATIENCE, NULL);
	inproc_cluster_srv_up(c, 1);
	wait_all_in_sync(c, "at the start");
	kv_admin_req q = {.op = KV_ADM_MOVE,
	                  .request_id = 1,
	                  .node_id = 2,
	                  .start = {(const uint8_t *)"w1", 2},
	                  .end = {(const uint8_t *)"w2", 2}};
	assert_int_equal(inproc_cluster_admin(c, &q, NULL, NULL, why, sizeof(why)), KV_OK);
	wait_all_in_sync(c, "after the move");
	for (int k = 0; k < NK; k++) {
		snprintf(key, sizeof(key), "w%04d", k * 7);
		snprintf(val, sizeof(val), "v%d", k);
		res1 r;
		uint64_t t0 = kv_test_now_ms();
		/* The owner by key: node 2 leads [w1, w2). */
		const char *url = strncmp(key, "w1", 2) == 0 ? c->srv[1].url : c->srv[0].url;
		while ((r = do_put(url, key, val, 0, 0)).status != 0) {
			if (kv_test_now_ms() - t0 > PATIENCE)
				fail_msg("put %s refused: %d", key, r.status);
			kv_test_sleep_ms(10);
		}
	}
}

/* After the restart: both servers hold every key written before it. */
static void
check_keys(inproc_cluster *c)
{
	char key[16], val[16];

	for (int k = 0; k < NK; k++) {
		snprintf(key, sizeof(key), "w%04d", k * 7);
		snprintf(val, sizeof(val), "v%d", k);
		for (int i = 0; i < 2; i++)
			if (!inproc_srv_holds(c->srv[i].s, key, val))
				fail_msg("server %d lacks %s=%s", i + 1, key, val);
	}
}

static void
a_renewal_before_the_registration_still_fails_the_restarted_node_over(void **state)
{
	char why[300];

	(void)state;
	two_in_sync(&rf);
	uint64_t before = latest_epoch(&rf);
	inproc_srv_down(&rf.srv[1]);
	/* The new process's first renewal, before it registers: no lease. */
	kv_admin_req hb = {.op = KV_ADM_HEARTBEAT,
	                   .request_id = 2,
	                   .node_id = 2,
	                   .boot_id = 0x5eed0001u,
	                   .restarted = true,
	                   .lease_only = true};
	int rv = inproc_cluster_admin(&rf, &hb, NULL, NULL, why, sizeof(why));
	assert_int_equal(rv, KV_EBUSY);
	/* Failed over before any registration. */
	wait_failed_over(&rf, before, "renewal first");
	/* The same renewal again, once handled: a lease. */
	hb.request_id = 3;
	assert_int_equal(inproc_cluster_admin(&rf, &hb, NULL, NULL, why, sizeof(why)), KV_OK);
	inproc_cluster_srv_up(&rf, 1);
	wait_all_in_sync(&rf, "after the restart");
	check_keys(&rf);
}

static void
a_new_controller_fails_over_a_server_that_restarts_after_it(void **state)
{
	(void)state;
	two_in_sync(&rc);
	uint64_t before = latest_epoch(&rc);
	inproc_cluster_ctl_down(&rc);
	inproc_srv_down(&rc.srv[1]);
	inproc_cluster_ctl_up(&rc);
	inproc_cluster_srv_up(&rc, 1);
	wait_failed_over(&rc, before, "new controller");
	wait_all_in_sync(&rc, "after the restart");
	check_keys(&rc);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    INPROC_CLUSTER_TEST(
	        a_renewal_before_the_registration_still_fails_the_restarted_node_over, &rf),
	    INPROC_CLUSTER_TEST(a_new_controller_fails_over_a_server_that_restarts_after_it, &rc),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
