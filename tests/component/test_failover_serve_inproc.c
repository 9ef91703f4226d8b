/*
 * test_failover_serve_inproc.c - what the servers do when the controller
 * changes a range's primary or shrinks its ISR (doc/replication.md
 * "Failover", "ISR changes"), with a real controller (--replicas 2,
 * --min-insync 1, short leases through its create options), real shard
 * servers and the client library inside the test process:
 *
 * - a stopped primary: the in-sync backup the controller promotes serves
 *   every acknowledged write, takes new writes, and answers a retried write
 *   (same client and request id) from its exactly-once memory;
 * - a stopped backup: the primary's writes wait, the primary asks the
 *   controller to take the backup out of the ISR, and once it applies that
 *   configuration the writes complete;
 * - demotion, against the fake controller (which publishes what a real one
 *   would after a failover the old primary missed): the old primary stops
 *   serving at once, names the new primary, and keeps its copy; a copy
 *   outside the ISR named primary is not served.
 *
 * The backup joins the ISR before any write, so it is trivially caught up:
 * its primary copies it and asks for it, and the test sends the same
 * IsrChange itself (answered with the current epoch once in effect). Every wait polls with a
 * deadline; timings are printed, and bounded only generously.
 */
#include "common/err.h"
#include "shardkv.h"
#include "shardserver/server.h"
#include "tests/support/fake_ctl.h"
#include "tests/support/inproc_cluster.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define PATIENCE INPROC_CLUSTER_PATIENCE_MS
#define NKEYS    40
#define CLIENT   0x5eedu /* the raw client's id (exactly-once) */

/* Failover: the default short leases (down after 0.8 s). */
static inproc_cluster fo = {.o = {.name = "kvfosrv", .replicas = 2}};
/* Shrink: a lease long enough (down after 5 s) that the primary's request,
 * after about 1 s of silence, is what takes the backup out of the ISR. */
static inproc_cluster sh = {
    .o = {.name = "kvshrink", .replicas = 2, .lease_ms = 4000, .lease_margin_ms = 1000}};

/* Starts the controller again with --min-insync 1 (before any server), so
 * that a range keeps taking writes with its primary alone. */
static void
ctl_min_insync_1(inproc_cluster *c)
{
	char err[256];

	inproc_cluster_ctl_down(c);
	c->ccfg = (kv_controller_cfg){.listen = c->ctl_url,
	                              .data_dir = c->ctl_dir,
	                              .metrics = c->ctl_metrics,
	                              .lease_ms = c->o.lease_ms,
	                              .lease_margin_ms = c->o.lease_margin_ms,
	                              .replicas = c->o.replicas,
	                              .min_insync = 1};
	if (kv_controller_create(&c->ccfg, &c->ctl, err, sizeof(err)) != KV_OK)
		fail_msg("controller create: %s", err);
	if (kv_controller_start(c->ctl, err, sizeof(err)) != KV_OK)
		fail_msg("controller start: %s", err);
}

/* Starts both servers, waits until the one range has replicas {1, 2}, adds
 * node 2 to its ISR (the primary's IsrChange) and waits until both servers
 * applied that configuration. Returns its epoch. */
static uint64_t
in_sync_pair_up(inproc_cluster *c)
{
	kv_config *cfg = NULL;
	uint64_t t0, epoch = 0;
	char why[300];

	ctl_min_insync_1(c);
	inproc_cluster_srv_up(c, 0);
	srv_wait_ready(c->srv[0].url, 1, PATIENCE, NULL);
	inproc_cluster_srv_up(c, 1);
	t0 = kv_test_now_ms();
	for (;;) {
		cfg = inproc_cluster_config(c);
		if (cfg && cfg->nnodes == 2 && cfg->nranges == 1 &&
		    kv_range_nreplicas(&cfg->ranges[0]) == 2)
			break;
		kv_config_free(cfg);
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the second server never became a replica");
		kv_test_sleep_ms(20);
	}
	assert_int_equal(cfg->ranges[0].node, 1);
	assert_int_equal(cfg->min_insync, 1);
	kv_admin_req q = {.op = KV_ADM_ISR_CHANGE,
	                  .request_id = 1,
	                  .node_id = 1,
	                  .leader_epoch = cfg->ranges[0].leader_epoch,
	                  .add_node = 2};
	assert_int_equal(inproc_cluster_admin(c, &q, NULL, &epoch, why, sizeof(why)), KV_OK);
	kv_config_free(cfg);
	srv_wait_ready(c->srv[0].url, epoch, PATIENCE, NULL);
	srv_wait_ready(c->srv[1].url, epoch, PATIENCE, NULL);
	return epoch;
}

static shardkv_client *
lib_open(inproc_cluster *c)
{
	shardkv_options o = {.timeout_ms = 5000};
	shardkv_client *k = NULL;

	assert_int_equal(shardkv_open(c->ctl_url, &o, &k), 0);
	return k;
}

static void
lib_put(shardkv_client *k, const char *key, const char *val)
{
	int rv = shardkv_put(k, key, strlen(key), val, strlen(val));
	if (rv != 0)
		fail_msg("put %s: %s (%s)", key, shardkv_strerror(rv), shardkv_errmsg());
}

static void
lib_expect(shardkv_client *k, const char *key, const char *val)
{
	shardkv_buf v = {0};
	int rv = shardkv_get(k, key, strlen(key), &v);
	if (rv != 0)
		fail_msg("get %s: %s (%s)", key, shardkv_strerror(rv), shardkv_errmsg());
	assert_int_equal(v.len, strlen(val));
	assert_memory_equal(v.data, val, v.len);
	shardkv_free(v.data);
}

static void
the_promoted_backup_serves_every_acknowledged_write(void **state)
{
	shardkv_client *k;
	char key[32], val[32];
	uint64_t t0, took;
	kv_config *now;
	res1 r;

	(void)state;
	in_sync_pair_up(&fo);
	k = lib_open(&fo);
	for (int i = 0; i < NKEYS; i++) {
		snprintf(key, sizeof(key), "k%03d", i);
		snprintf(val, sizeof(val), "v%d", i);
		lib_put(k, key, val);
	}
	/* One write with exactly-once ids, acknowledged by the primary. */
	r = do_append(fo.srv[0].url, "once", "x", CLIENT, 77);
	assert_int_equal(r.status, 0);
	assert_int_equal(r.value_len, 1);

	/* The primary stops without leaving. The first read after it, with
	 * the ordinary deadline (5 s), succeeds: the library follows the
	 * failover (the watched configuration marks node 1 down and names
	 * node 2) within one call. How long it took is printed, not bounded. */
	t0 = kv_test_now_ms();
	inproc_srv_down(&fo.srv[0]);
	{
		shardkv_buf v = {0};
		int rv = shardkv_get(k, "k000", 4, &v);
		if (rv != 0)
			fail_msg("the first read after the primary stopped failed: %s (%s)",
			         shardkv_strerror(rv), shardkv_errmsg());
		assert_int_equal(v.len, 2);
		assert_memory_equal(v.data, "v0", 2);
		shardkv_free(v.data);
	}
	took = kv_test_now_ms() - t0;
	print_message("first successful read through the library %llu ms after the primary "
	              "stopped\n",
	              (unsigned long long)took);
	now = inproc_cluster_config(&fo);
	assert_non_null(now);
	assert_int_equal(now->ranges[0].node, 2);
	assert_int_equal(now->ranges[0].leader_epoch, now->epoch);
	kv_config_free(now);

	/* Every acknowledged write is there. */
	for (int i = 0; i < NKEYS; i++) {
		snprintf(key, sizeof(key), "k%03d", i);
		snprintf(val, sizeof(val), "v%d", i);
		lib_expect(k, key, val);
	}
	/* New writes succeed with the new primary alone (--min-insync 1). */
	lib_put(k, "after", "failover");
	lib_expect(k, "after", "failover");
	/* The retried write is answered from the exactly-once memory. */
	r = do_append(fo.srv[1].url, "once", "x", CLIENT, 77);
	assert_int_equal(r.status, 0);
	assert_int_equal(r.value_len, 1);
	lib_expect(k, "once", "x");
	/* The former backup answers for the range itself; nothing is moving. */
	r = do_get(fo.srv[1].url, "k001");
	assert_int_equal(r.status, 0);
	assert_string_equal(r.value, "v1");
	shardkv_close(k);
}

static void
a_silent_backup_is_taken_out_of_the_isr_and_writes_complete(void **state)
{
	shardkv_client *k;
	uint64_t t0, took;
	kv_config *now;
	char m[16384];

	(void)state;
	in_sync_pair_up(&sh);
	k = lib_open(&sh);
	lib_put(k, "a", "1");

	/* The backup stops: the next write waits for it, then the primary
	 * asks for the smaller ISR and the write completes. */
	inproc_srv_down(&sh.srv[1]);
	t0 = kv_test_now_ms();
	lib_put(k, "b", "2");
	took = kv_test_now_ms() - t0;
	print_message("write completed %llu ms after the backup stopped\n",
	              (unsigned long long)took);
	now = inproc_cluster_config(&sh);
	assert_non_null(now);
	assert_int_equal(now->ranges[0].node, 1);
	assert_int_equal(kv_range_ninsync(&now->ranges[0]), 1);
	assert_true(kv_range_has_replica(&now->ranges[0], 2, false));
	/* Not the down declaration (5 s away): the primary's request. */
	assert_int_equal(kv_config_node(now, 2)->state, KV_NODE_ACTIVE);
	kv_config_free(now);
	inproc_cluster_scrape_metrics(&sh, m, sizeof(m));
	assert_non_null(strstr(m, "\nshardkv_controller_isr_shrinks_total 1\n"));
	assert_non_null(strstr(m, "\nshardkv_controller_failovers_total 0\n"));
	lib_expect(k, "a", "1");
	lib_expect(k, "b", "2");
	lib_put(k, "c", "3");
	shardkv_close(k);
}

/* Demotion: two servers under the fake controller. */
static inproc_srv dsrv[2];
static fake_ctl *dctl;
static char dtmp[128];

static int
demote_setup(void **state)
{
	(void)state;
	inproc_srv_setup(dsrv, 2, &dctl, dtmp, sizeof(dtmp), "kvdemote", 16);
	return 0;
}

static int
demote_teardown(void **state)
{
	(void)state;
	inproc_srv_cleanup(dsrv, 2, &dctl, dtmp);
	return 0;
}

/* Publishes the key space with replicas rep[0..2) (rep[0] the primary),
 * ISR isr[0..nisr), and the new configuration's epoch as leader epoch. */
static uint64_t
publish(const uint32_t *rep, const uint32_t *isr, uint32_t nisr)
{
	return fake_ctl_publish_replicas(dctl, rep, 2, isr, nisr, 0);
}

static void
a_deposed_primary_stops_serving_and_keeps_its_copy(void **state)
{
	const uint32_t r12[2] = {1, 2}, r21[2] = {2, 1}, only1[1] = {1}, only2[1] = {2};
	kv_buf val = {0};
	uint64_t e, t0;
	res1 r;

	(void)state;
	fake_ctl_add_node(dctl, dsrv[0].url);
	fake_ctl_add_node(dctl, dsrv[1].url);
	e = publish(r12, r12, 2);
	inproc_srv_up(&dsrv[0]);
	inproc_srv_up(&dsrv[1]);
	srv_wait_ready(dsrv[0].url, e, PATIENCE, NULL);
	srv_wait_ready(dsrv[1].url, e, PATIENCE, NULL);
	assert_int_equal(do_put(dsrv[0].url, "d", "1", CLIENT, 1).status, 0);

	/* A failover node 1 missed: node 2 leads, node 1 is outside the ISR. */
	e = publish(r21, only2, 1);
	srv_wait_ready(dsrv[0].url, e, PATIENCE, NULL);
	srv_wait_ready(dsrv[1].url, e, PATIENCE, NULL);
	r = do_get(dsrv[0].url, "d");
	assert_int_equal(r.status, SHARDKV__STATUS__STATUS_WRONG_OWNER);
	assert_int_equal(r.hint_node, 2);
	assert_string_equal(r.hint_addr, dsrv[1].url);
	r = do_put(dsrv[0].url, "d", "2", CLIENT, 2);
	assert_int_equal(r.status, SHARDKV__STATUS__STATUS_WRONG_OWNER);
	/* The copy stays, and node 2 serves the range. Node 2, now primary
	 * with node 1 outside its ISR, may meanwhile start its catch-up copy to
	 * node 1, which replaces node 1's copy of the range: the value is then
	 * absent until that copy ends, so the check polls with a deadline. */
	t0 = kv_test_now_ms();
	while (kv_server_get_for_test(dsrv[0].s, "d", 1, &val) != 0) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the deposed primary lost its copy of \"d\"");
		kv_test_sleep_ms(5);
	}
	assert_int_equal(val.len, 1);
	assert_memory_equal(val.data, "1", 1);
	kv_buf_fini(&val);
	r = do_get(dsrv[1].url, "d");
	assert_int_equal(r.status, 0);
	assert_string_equal(r.value, "1");

	/* A copy outside the ISR named primary is not served. */
	e = publish(r12, only1, 1);
	srv_wait_ready(dsrv[0].url, e, PATIENCE, NULL);
	r = do_get(dsrv[0].url, "d");
	assert_int_not_equal(r.status, 0);
	assert_int_not_equal(r.status, SHARDKV__STATUS__STATUS_NOT_FOUND);
}

/* A put in a thread of its own. */
typedef struct {
	const char *url;
	res1 r;
} put_job;

static void *
put_main(void *arg)
{
	put_job *j = arg;
	j->r = do_put(j->url, "w", "1", CLIENT, 9);
	return NULL;
}

static void
a_write_in_flight_when_its_primary_is_deposed_is_not_acknowledged(void **state)
{
	const uint32_t r12[2] = {1, 2}, r21[2] = {2, 1}, only2[1] = {2};
	put_job j = {.url = NULL};
	pthread_t t;
	kv_buf val = {0};
	uint64_t e, t0;

	(void)state;
	fake_ctl_add_node(dctl, dsrv[0].url);
	fake_ctl_add_node(dctl, dsrv[1].url);
	e = publish(r12, r12, 2);
	inproc_srv_up(&dsrv[0]);
	inproc_srv_up(&dsrv[1]);
	srv_wait_ready(dsrv[0].url, e, PATIENCE, NULL);
	srv_wait_ready(dsrv[1].url, e, PATIENCE, NULL);
	assert_int_equal(do_put(dsrv[0].url, "a", "1", CLIENT, 1).status, 0);
	/* The backup stops: the next write is applied on the primary and
	 * waits for it. */
	inproc_srv_down(&dsrv[1]);
	j.url = dsrv[0].url;
	assert_int_equal(pthread_create(&t, NULL, put_main, &j), 0);
	t0 = kv_test_now_ms();
	while (kv_server_get_for_test(dsrv[0].s, "w", 1, &val) != 0) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the write never reached the primary's store");
		kv_test_sleep_ms(5);
	}
	kv_buf_fini(&val);
	/* Deposed meanwhile: its backup's queue is dropped, but the waiting
	 * write is not acknowledged (the new primary may lack it). */
	publish(r21, only2, 1);
	pthread_join(t, NULL);
	assert_int_equal(j.r.status, SHARDKV__STATUS__STATUS_TIMED_OUT);
	assert_int_equal(do_get(dsrv[0].url, "a").status, SHARDKV__STATUS__STATUS_WRONG_OWNER);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    INPROC_CLUSTER_TEST(the_promoted_backup_serves_every_acknowledged_write, &fo),
	    INPROC_CLUSTER_TEST(a_silent_backup_is_taken_out_of_the_isr_and_writes_complete, &sh),
	    cmocka_unit_test_setup_teardown(a_deposed_primary_stops_serving_and_keeps_its_copy,
	                                    demote_setup, demote_teardown),
	    cmocka_unit_test_setup_teardown(
	        a_write_in_flight_when_its_primary_is_deposed_is_not_acknowledged, demote_setup,
	        demote_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
