/*
 * test_client_fake.c - libshardkv and the CLI against an in-process fake
 * cluster (support/fake_cluster.h): a fake controller (get_config, watch,
 * status, join) and two fake shard servers (get, put, del, append, mget,
 * mput, scan with ownership checks, OwnerHints and exactly-once memory), all
 * on free loopback ports.
 *
 * The fakes implement just enough of doc/protocol.md to test the client's
 * side of it: routing with the cached configuration, following
 * WRONG_OWNER hints to a newer owner, reusing a write's request id when a
 * reply is lost, splitting mget/mput per node and sending the parts
 * concurrently, merging scans across servers, and learning new epochs from
 * the watch.
 */
#include "client/cli/cli.h"
#include "client/client_int.h"
#include "common/err.h"
#include "common/rpc.h"
#include "proto/shardkv.pb-c.h"
#include "proto/wire.h"
#include "tests/support/fake_cluster.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#define ARGC(a) ((int)(sizeof(a) / sizeof((a)[0])))

static kv_fake_cluster *g; /* the cluster of the running test (set up per test) */

/* ---------------------------------------------------------------------------
 * Fixture (support/fake_cluster.h)
 * ------------------------------------------------------------------------- */

/* A config of the cluster's servers with ranges split at `split` (NULL: one
 * range) owned by owner_lo and owner_hi. */
static kv_config *
make_cfg(uint64_t epoch, const char *split, uint32_t owner_lo, uint32_t owner_hi)
{
	return kv_fake_cluster_config(g, epoch, split, owner_lo, owner_hi);
}

/* Publishes cfg (taken) as the controller's latest and answers the watches. */
static void
publish(kv_config *cfg)
{
	kv_fake_cluster_publish(g, cfg);
}

/* Sets what the servers serve (cfg taken). */
static void
set_truth(kv_config *cfg)
{
	kv_fake_cluster_set_truth(g, cfg);
}

static int
setup(void **state)
{
	(void)state;
	return kv_fake_cluster_create(&g);
}

static int
teardown(void **state)
{
	(void)state;
	kv_fake_cluster_destroy(g);
	g = NULL;
	return 0;
}

static shardkv_client *
open_client(uint32_t timeout_ms, bool watch)
{
	shardkv_options o = {.timeout_ms = timeout_ms, .no_watch = !watch};
	shardkv_client *c;
	char list[160];
	/* A dead controller first: the client must go on to the next one. */
	char dead[64];
	kv_test_free_url(dead, sizeof(dead));
	snprintf(list, sizeof(list), "%s,%s", dead, g->ctl->url);
	assert_int_equal(shardkv_open(list, &o, &c), 0);
	return c;
}

static size_t
server_keys(int i)
{
	return kv_fake_server_nkeys(g, i);
}

/* ---------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------- */

static void
single_key_ops_are_routed_to_the_owner(void **state)
{
	shardkv_client *c = open_client(3000, false);
	shardkv_buf v;
	uint64_t len;
	(void)state;

	assert_int_equal(shardkv_put(c, "apple", 5, "red", 3), 0);
	assert_int_equal(shardkv_put(c, "zebra", 5, "striped", 7), 0);
	assert_int_equal(server_keys(0), 1);
	assert_int_equal(server_keys(1), 1);
	assert_int_equal(shardkv_get(c, "zebra", 5, &v), 0);
	assert_int_equal(v.len, 7);
	assert_string_equal((char *)v.data, "striped");
	shardkv_free(v.data);
	assert_int_equal(shardkv_append(c, "apple", 5, "!", 1, &len), 0);
	assert_int_equal(len, 4);
	assert_int_equal(shardkv_append(c, "new", 3, "x", 1, &len), 0);
	assert_int_equal(len, 1);
	assert_int_equal(shardkv_del(c, "apple", 5, &v), 0);
	assert_string_equal((char *)v.data, "red!");
	shardkv_free(v.data);
	assert_int_equal(shardkv_del(c, "apple", 5, NULL), SHARDKV_ENOTFOUND);
	assert_int_equal(shardkv_get(c, "apple", 5, &v), SHARDKV_ENOTFOUND);
	/* Empty values are values. */
	assert_int_equal(shardkv_put(c, "empty", 5, "", 0), 0);
	assert_int_equal(shardkv_get(c, "empty", 5, &v), 0);
	assert_int_equal(v.len, 0);
	assert_non_null(v.data);
	shardkv_free(v.data);
	shardkv_close(c);
}

static void
client_retries_after_wrong_owner_with_new_epoch(void **state)
{
	shardkv_client *c = open_client(3000, false);
	shardkv_buf v;
	(void)state;

	assert_int_equal(shardkv_put(c, "apple", 5, "one", 3), 0); /* caches epoch 5 */
	/* Node 2 now serves everything; the controller has not published it. */
	set_truth(make_cfg(6, NULL, 2, 2));
	assert_int_equal(shardkv_put(c, "banana", 6, "two", 3), 0);
	assert_true(g->srv[0].wrong_owner >= 1);
	assert_int_equal(server_keys(1), 1); /* banana went to node 2 via the hint */
	assert_int_equal(shardkv_get(c, "banana", 6, &v), 0);
	assert_string_equal((char *)v.data, "two");
	shardkv_free(v.data);
	/* The hint's epoch was newer: the client asked the controller again. */
	assert_true(g->ctl->get_configs >= 2);
	/* The hint is remembered: other keys of its range go to node 2 directly. */
	int wrong = g->srv[0].wrong_owner;
	assert_int_equal(shardkv_put(c, "cherry", 6, "three", 5), 0);
	assert_int_equal(g->srv[0].wrong_owner, wrong);
	assert_int_equal(server_keys(1), 2);
	/* Until the controller publishes a newer configuration, which replaces it. */
	publish(make_cfg(6, NULL, 2, 2));
	assert_int_equal(shardkv_put(c, "date", 4, "four", 4), 0);
	assert_int_equal(g->srv[0].wrong_owner, wrong);
	shardkv_close(c);
}

static void
lost_reply_is_retried_with_the_same_request_id(void **state)
{
	shardkv_client *c = open_client(2500, false);
	shardkv_buf v;
	(void)state;

	g->srv[0].drop_lossy = true;
	assert_int_equal(shardkv_put(c, "lossy", 5, "once", 4), 0);
	assert_int_equal(g->srv[0].received_lossy, 2);
	assert_int_equal(g->srv[0].lossy_ids[0], g->srv[0].lossy_ids[1]);
	assert_int_equal(g->srv[0].applied_lossy, 1);
	/* A new put is a new write: a new id. */
	assert_int_equal(shardkv_put(c, "lossy", 5, "twice", 5), 0);
	assert_int_equal(g->srv[0].received_lossy, 3);
	assert_true(g->srv[0].lossy_ids[2] != g->srv[0].lossy_ids[0]);
	assert_int_equal(g->srv[0].applied_lossy, 2);
	assert_int_equal(shardkv_get(c, "lossy", 5, &v), 0);
	assert_string_equal((char *)v.data, "twice");
	shardkv_free(v.data);
	shardkv_close(c);
}

static void
mput_and_mget_split_per_node_concurrently_in_key_order(void **state)
{
	shardkv_client *c = open_client(3000, false);
	shardkv_bytes keys[] = {{"zz", 2}, {"aa", 2}, {"mm", 2}, {"bb", 2}};
	shardkv_bytes vals[] = {{"4", 1}, {"1", 1}, {"3", 1}, {"2", 1}};
	shardkv_mput_result *mr = NULL;
	shardkv_mget_result *gr = NULL;
	(void)state;

	assert_int_equal(shardkv_put(c, "warm", 4, "up", 2), 0); /* config cached */
	g->srv[0].mput_delay_ms = 300;
	g->srv[1].mput_delay_ms = 300;
	atomic_store(&g->mput_max_inflight, 0);
	assert_int_equal(shardkv_mput(c, 4, keys, 4, vals, &mr), 0);
	assert_non_null(mr);
	assert_int_equal(mr->nfailed, 0);
	shardkv_mput_result_free(mr);
	/* One MPutOp per node, and both ran at once. */
	assert_int_equal(g->srv[0].mput_ops, 1);
	assert_int_equal(g->srv[1].mput_ops, 1);
	assert_int_equal(atomic_load(&g->mput_max_inflight), 2);
	assert_int_equal(server_keys(0), 2);
	assert_int_equal(server_keys(1), 3);

	assert_int_equal(shardkv_mget(c, 4, keys, &gr), 0);
	assert_int_equal(gr->n, 4);
	assert_int_equal(gr->nmissing, 0);
	for (size_t i = 0; i < 4; i++) {
		assert_int_equal(gr->values[i].len, 1);
		assert_memory_equal(gr->values[i].data, vals[i].data, 1);
	}
	shardkv_mget_result_free(gr);
	assert_int_equal(g->srv[0].mget_ops, 1);
	assert_int_equal(g->srv[1].mget_ops, 1);

	/* Missing keys are named by index, in key order; the others are there. */
	shardkv_bytes some[] = {{"zz", 2}, {"nope", 4}, {"aa", 2}, {"none", 4}};
	assert_int_equal(shardkv_mget(c, 4, some, &gr), SHARDKV_ENOTFOUND);
	assert_non_null(gr);
	assert_int_equal(gr->nmissing, 2);
	assert_int_equal(gr->missing[0], 1);
	assert_int_equal(gr->missing[1], 3);
	assert_null(gr->values[1].data);
	assert_memory_equal(gr->values[2].data, "1", 1);
	shardkv_mget_result_free(gr);
	shardkv_close(c);
}

static void
mput_reports_the_node_that_failed(void **state)
{
	shardkv_client *c = open_client(2000, false);
	shardkv_bytes keys[] = {{"aa", 2}, {"zz", 2}, {"zy", 2}};
	shardkv_bytes vals[] = {{"1", 1}, {"2", 1}, {"3", 1}};
	shardkv_mput_result *mr = NULL;
	(void)state;

	g->srv[1].mput_fail = SHARDKV__STATUS__STATUS_NO_SPACE;
	assert_int_equal(shardkv_mput(c, 3, keys, 3, vals, &mr), SHARDKV_ENOSPC);
	assert_non_null(mr);
	assert_int_equal(mr->nfailed, 1);
	assert_int_equal(mr->failed[0].node_id, 2);
	assert_int_equal(mr->failed[0].err, SHARDKV_ENOSPC);
	assert_int_equal(mr->failed[0].nkeys, 2);
	assert_string_equal(mr->failed[0].address, g->srv[1].url);
	shardkv_mput_result_free(mr);
	assert_int_equal(server_keys(0), 1); /* node 1's part was written */
	assert_int_equal(server_keys(1), 0);
	shardkv_close(c);
}

static void
scan_merges_servers_in_key_order_and_resumes(void **state)
{
	shardkv_client *c = open_client(3000, false);
	const char *k[] = {"k1", "k2", "k3", "k4", "k5", "n1", "n2", "x", "y"};
	shardkv_scan_result *r;
	(void)state;

	for (size_t i = 0; i < 9; i++)
		assert_int_equal(shardkv_put(c, k[i], strlen(k[i]), k[i], strlen(k[i])), 0);
	/* Everything, across both nodes and several pages of 3. */
	assert_int_equal(shardkv_scan(c, "", 0, "", 0, 0, &r), 0);
	assert_int_equal(r->n, 9);
	assert_false(r->more);
	for (size_t i = 0; i < 9; i++) {
		assert_string_equal((char *)r->entries[i].key.data, k[i]);
		assert_string_equal((char *)r->entries[i].value.data, k[i]);
	}
	shardkv_scan_result_free(r);
	/* A limited page that crosses the node boundary, then its resumption. */
	assert_int_equal(shardkv_scan(c, "k3", 2, "y", 1, 4, &r), 0);
	assert_int_equal(r->n, 4);
	assert_true(r->more);
	assert_string_equal((char *)r->entries[3].key.data, "n1");
	shardkv_buf next = r->next;
	r->next.data = NULL;
	shardkv_scan_result_free(r);
	assert_int_equal(shardkv_scan(c, next.data, next.len, "y", 1, 4, &r), 0);
	shardkv_free(next.data);
	assert_int_equal(r->n, 2);
	assert_string_equal((char *)r->entries[0].key.data, "n2");
	assert_string_equal((char *)r->entries[1].key.data, "x");
	assert_false(r->more);
	shardkv_scan_result_free(r);
	/* keys with a prefix. */
	assert_int_equal(shardkv_keys(c, "n", 1, &r), 0);
	assert_int_equal(r->n, 2);
	assert_string_equal((char *)r->entries[1].key.data, "n2");
	assert_int_equal(r->entries[1].value.len, 0);
	shardkv_scan_result_free(r);
	assert_int_equal(shardkv_scan(c, "b", 1, "a", 1, 0, &r), SHARDKV_EINVAL);
	shardkv_close(c);
}

/* The epoch the handle has cached. */
static uint64_t
cached_epoch(shardkv_client *c)
{
	uint64_t e = 0;
	pthread_mutex_lock(&c->cfg_mu);
	if (c->cfg)
		e = c->cfg->cfg->epoch;
	pthread_mutex_unlock(&c->cfg_mu);
	return e;
}

/* Waits until a watch is parked at the fake controller. */
static void
wait_watch_parked(void)
{
	for (uint64_t t0 = kv_test_now_ms(); kv_test_now_ms() - t0 < 3000;) {
		pthread_mutex_lock(&g->ctl->mu);
		size_t n = g->ctl->npend;
		pthread_mutex_unlock(&g->ctl->mu);
		if (n > 0)
			return;
		kv_test_sleep_ms(2);
	}
	fail_msg("the watch never reached the controller");
}

static void
watch_learns_a_new_epoch_within_milliseconds(void **state)
{
	shardkv_client *c = open_client(3000, true);
	(void)state;

	assert_int_equal(shardkv_put(c, "a", 1, "1", 1), 0);
	assert_int_equal(cached_epoch(c), 5);
	/* Wait until the watch is parked at the controller, then publish. */
	wait_watch_parked();
	unsigned calls = g->ctl->get_configs;
	set_truth(make_cfg(6, "q", 1, 2));
	publish(make_cfg(6, "q", 1, 2));
	uint64_t t0 = kv_test_now_ms();
	while (cached_epoch(c) < 6 && kv_test_now_ms() - t0 < 2000)
		kv_test_sleep_ms(1);
	assert_int_equal(cached_epoch(c), 6);
	assert_int_equal(g->ctl->get_configs, calls); /* learnt by the watch alone */
	/* "n" now belongs to node 1 and goes there directly. */
	int wrong = g->srv[1].wrong_owner + g->srv[0].wrong_owner;
	assert_int_equal(shardkv_put(c, "n", 1, "1", 1), 0);
	assert_int_equal(g->srv[1].wrong_owner + g->srv[0].wrong_owner, wrong);
	shardkv_close(c); /* stops the parked watch at once */
}

/* The local ports of this process's established TCP connections to
 * 127.0.0.1:port (from /proc/net/tcp): into ports[0..max), returns how
 * many. */
static size_t
ports_connected_to(unsigned port, unsigned *ports, size_t max)
{
	FILE *f = fopen("/proc/net/tcp", "r");
	char line[512];
	size_t n = 0;

	assert_non_null(f);
	while (fgets(line, sizeof(line), f) != NULL) {
		unsigned lip, lport, rip, rport, st;
		if (sscanf(line, " %*u: %8X:%4X %8X:%4X %2X", &lip, &lport, &rip, &rport, &st) ==
		        5 &&
		    st == 1 && rport == port && n < max)
			ports[n++] = lport;
	}
	fclose(f);
	return n;
}

/* The watch keeps its connection from one poll to the next: each
 * configuration change used to cost every handle a new socket, a dial and
 * a closing thread (a bench of 16 handles made about 100 at a move). */
static void
a_watch_keeps_its_connection_across_configuration_changes(void **state)
{
	shardkv_client *c = open_client(3000, true);
	unsigned port = 0, before[64], after[64];
	(void)state;

	assert_int_equal(sscanf(g->ctl->url, "tcp://127.0.0.1:%u", &port), 1);
	assert_int_equal(shardkv_put(c, "a", 1, "1", 1), 0);
	wait_watch_parked();
	size_t nb = ports_connected_to(port, before, 64);
	assert_true(nb >= 1);
	for (uint64_t e = 6; e <= 10; e++) {
		set_truth(make_cfg(e, "q", 1, 2));
		publish(make_cfg(e, "q", 1, 2));
		uint64_t t0 = kv_test_now_ms();
		while (cached_epoch(c) < e && kv_test_now_ms() - t0 < 2000)
			kv_test_sleep_ms(1);
		assert_int_equal(cached_epoch(c), e);
		wait_watch_parked();
	}
	size_t na = ports_connected_to(port, after, 64);
	for (size_t i = 0; i < na; i++) {
		bool known = false;
		for (size_t j = 0; j < nb; j++)
			known |= after[i] == before[j];
		if (!known)
			fail_msg("a new connection to the controller (local port %u) after five "
			         "configuration changes",
			         after[i]);
	}
	shardkv_close(c);
}

/* ---------------------------------------------------------------------------
 * Following failovers (doc/library.md "Failover")
 * ------------------------------------------------------------------------- */

/* Upper bound of a wait in these tests. Their handles have a 60 s deadline,
 * so one attempt may take 30 s (kvc_attempt_ms): finishing within this
 * bound shows the request followed the new configuration instead of
 * waiting out its attempt. */
#define FOLLOW_PATIENCE_MS 15000u

/* The outcome of an async op. */
typedef struct {
	atomic_int done;   /* the callback ran */
	atomic_int status; /* its status */
} async_res;

static void
async_done(void *arg, int status, const void *val, size_t vlen)
{
	async_res *r = arg;

	(void)val;
	(void)vlen;
	atomic_store(&r->status, status);
	atomic_store(&r->done, 1);
}

/* Waits for the async op; returns its status. */
static int
async_wait(async_res *r)
{
	uint64_t t0 = kv_test_now_ms();

	while (!atomic_load(&r->done)) {
		if (kv_test_now_ms() - t0 > FOLLOW_PATIENCE_MS)
			fail_msg("the op did not finish within %u ms", FOLLOW_PATIENCE_MS);
		kv_test_sleep_ms(2);
	}
	return atomic_load(&r->status);
}

/* A configuration at epoch in which node 2 owns everything and node 1 is
 * down (the failover a controller publishes when node 1 stops). */
static kv_config *
failed_over_cfg(uint64_t epoch)
{
	kv_config *cfg = make_cfg(epoch, NULL, 2, 2);
	kv_node *n = (kv_node *)kv_config_node(cfg, 1);
	n->state = KV_NODE_DOWN;
	return cfg;
}

/* A configuration at epoch in which node 1 owns everything and is down
 * (no other in-sync replica to take its ranges). */
static kv_config *
owner_down_cfg(uint64_t epoch)
{
	kv_config *cfg = make_cfg(epoch, NULL, 1, 1);
	((kv_node *)kv_config_node(cfg, 1))->state = KV_NODE_DOWN;
	return cfg;
}

/* Whether fake server i remembers the write (client, id). */
static bool
server_saw(int i, uint64_t client, uint64_t id)
{
	bool seen = false;
	pthread_mutex_lock(&g->srv[i].mu);
	for (size_t k = 0; k < g->srv[i].nseen; k++)
		seen |= g->srv[i].seen[k].client_id == client && g->srv[i].seen[k].request_id == id;
	pthread_mutex_unlock(&g->srv[i].mu);
	return seen;
}

static void
a_write_waiting_on_a_primary_that_fails_over_goes_to_the_new_one(void **state)
{
	shardkv_client *c = open_client(60000, true);
	async_res r = {0};
	shardkv_buf v;
	(void)state;

	assert_int_equal(shardkv_put(c, "apple", 5, "one", 3), 0); /* node 1, epoch 5 */
	/* Node 1 stops answering; a put is sent to it and waits there. */
	pthread_mutex_lock(&g->srv[0].mu);
	g->srv[0].silent = true;
	pthread_mutex_unlock(&g->srv[0].mu);
	assert_int_equal(shardkv_put_async(c, "apple", 5, "two", 3, async_done, &r), 0);
	for (uint64_t t0 = kv_test_now_ms();;) {
		pthread_mutex_lock(&g->srv[0].mu);
		int seen = g->srv[0].silent_seen;
		pthread_mutex_unlock(&g->srv[0].mu);
		if (seen > 0)
			break;
		if (kv_test_now_ms() - t0 > FOLLOW_PATIENCE_MS)
			fail_msg("the put never reached node 1");
		kv_test_sleep_ms(2);
	}
	assert_false(atomic_load(&r.done));
	/* The controller fails node 1 over to node 2; the watch brings it. */
	set_truth(failed_over_cfg(6));
	publish(failed_over_cfg(6));
	assert_int_equal(async_wait(&r), 0);
	assert_int_equal(cached_epoch(c), 6);
	/* Re-sent to node 2 with the same request id, and never again to node 1. */
	pthread_mutex_lock(&g->srv[0].mu);
	uint64_t id = g->srv[0].silent_put_id;
	int silent = g->srv[0].silent_seen;
	pthread_mutex_unlock(&g->srv[0].mu);
	assert_true(server_saw(1, c->client_id, id));
	assert_int_equal(silent, 1);
	assert_int_equal(shardkv_get(c, "apple", 5, &v), 0);
	assert_int_equal(v.len, 3);
	assert_memory_equal(v.data, "two", 3);
	shardkv_free(v.data);
	/* The abandoned request is answered at last (its reply ignored):
	 * shardkv_close waits for requests on the wire. */
	kv_fake_server_release(&g->srv[0]);
	shardkv_close(c);
}

static void
mput_done(void *arg, int status, shardkv_mput_result *mr)
{
	async_done(arg, status, NULL, 0);
	shardkv_mput_result_free(mr);
}

/* Node 1 stops answering (it holds what it receives); an async mput of
 * keys is sent and waits until its part reaches node 1; then node 1 fails
 * over to node 2 (epoch 6) and the mput must complete. */
static void
mput_across_a_failover(shardkv_client *c, const shardkv_bytes *keys)
{
	shardkv_bytes vals[] = {{"1", 1}, {"2", 1}};
	async_res r = {0};

	assert_int_equal(shardkv_put(c, "apple", 5, "one", 3), 0); /* node 1, epoch 5 */
	pthread_mutex_lock(&g->srv[0].mu);
	g->srv[0].silent = true;
	pthread_mutex_unlock(&g->srv[0].mu);
	assert_int_equal(shardkv_mput_async(c, 2, keys, 2, vals, mput_done, &r), 0);
	for (uint64_t t0 = kv_test_now_ms();;) {
		pthread_mutex_lock(&g->srv[0].mu);
		int seen = g->srv[0].silent_seen;
		pthread_mutex_unlock(&g->srv[0].mu);
		if (seen > 0)
			break;
		if (kv_test_now_ms() - t0 > FOLLOW_PATIENCE_MS)
			fail_msg("the mput never reached node 1");
		kv_test_sleep_ms(2);
	}
	set_truth(failed_over_cfg(6));
	publish(failed_over_cfg(6));
	assert_int_equal(async_wait(&r), 0);
}

static void
an_mput_part_waiting_on_a_primary_that_fails_over_is_split_again(void **state)
{
	shardkv_client *c = open_client(60000, true);
	/* "aa" goes to node 1, which holds it; "zz" to node 2, which answers. */
	shardkv_bytes keys[] = {{"aa", 2}, {"zz", 2}};
	(void)state;

	mput_across_a_failover(c, keys);
	assert_int_equal(server_keys(1), 2); /* aa, split again to node 2, and zz */
	kv_fake_server_release(&g->srv[0]);
	shardkv_close(c);
}

static void
an_mput_waiting_on_a_primary_that_fails_over_goes_whole_to_the_new_one_with_its_id(void **state)
{
	shardkv_client *c = open_client(60000, true);
	/* Both keys go to node 1, which holds the mput (it may have applied
	 * it, and its backup with it). */
	shardkv_bytes keys[] = {{"aa", 2}, {"ab", 2}};
	(void)state;

	mput_across_a_failover(c, keys);
	/* Re-sent whole to node 2 under the same request id: a new primary
	 * that has the first attempt answers it from its exactly-once memory
	 * instead of applying it a second time. */
	pthread_mutex_lock(&g->srv[0].mu);
	uint64_t id = g->srv[0].silent_put_id;
	pthread_mutex_unlock(&g->srv[0].mu);
	assert_true(id != 0);
	assert_true(server_saw(1, c->client_id, id));
	assert_int_equal(server_keys(1), 2);
	kv_fake_server_release(&g->srv[0]);
	shardkv_close(c);
}

/* The outcome of an async mget, mput or scan. */
typedef struct {
	atomic_int calls;  /* callbacks run */
	atomic_int status; /* the last one's status */
	void *result;      /* its result (set before calls) */
} multi_res;

/* Records one callback of an async multi-key op. */
static void
multi_note(void *arg, int status, void *r)
{
	multi_res *m = arg;
	m->result = r;
	atomic_store(&m->status, status);
	atomic_fetch_add(&m->calls, 1);
}

static void
multi_mget_done(void *arg, int status, shardkv_mget_result *r)
{
	multi_note(arg, status, r);
}

static void
multi_mput_done(void *arg, int status, shardkv_mput_result *r)
{
	multi_note(arg, status, r);
}

static void
multi_scan_done(void *arg, int status, shardkv_scan_result *r)
{
	multi_note(arg, status, r);
}

/* Waits for the async multi-key op's callback; returns its status. */
static int
multi_wait(multi_res *m)
{
	uint64_t t0 = kv_test_now_ms();

	while (atomic_load(&m->calls) == 0) {
		if (kv_test_now_ms() - t0 > FOLLOW_PATIENCE_MS)
			fail_msg("the op did not finish within %u ms", FOLLOW_PATIENCE_MS);
		kv_test_sleep_ms(2);
	}
	return atomic_load(&m->status);
}

static int
wrong_owners(int i)
{
	pthread_mutex_lock(&g->srv[i].mu);
	int n = g->srv[i].wrong_owner;
	pthread_mutex_unlock(&g->srv[i].mu);
	return n;
}

static void
async_mget_and_mput_refused_as_wrong_owner_are_split_again(void **state)
{
	shardkv_client *ca = open_client(10000, false), *cb = open_client(10000, false);
	shardkv_client *fresh;
	shardkv_bytes keys[] = {{"aa", 2}, {"zz", 2}}, more[] = {{"ab", 2}, {"zy", 2}};
	shardkv_bytes vals[] = {{"1", 1}, {"2", 1}};
	shardkv_mput_result *pr = NULL;
	multi_res m = {0};
	(void)state;

	/* Both handles cache epoch 5: node 1 owns [, "m"). */
	assert_int_equal(shardkv_put(ca, "apple", 5, "one", 3), 0);
	assert_int_equal(shardkv_put(cb, "avocado", 7, "two", 3), 0);
	/* Node 2 now owns everything, published; neither handle watches. */
	set_truth(make_cfg(6, NULL, 2, 2));
	publish(make_cfg(6, NULL, 2, 2));
	fresh = open_client(10000, false);
	assert_int_equal(shardkv_mput(fresh, 2, keys, 2, vals, &pr), 0);
	shardkv_mput_result_free(pr);
	shardkv_close(fresh);
	assert_int_equal(server_keys(1), 2);

	/* mget: node 1 refuses "aa" (WRONG_OWNER, epoch 6); the part is split
	 * again with the newer configuration and read from node 2. */
	int wrong = wrong_owners(0);
	assert_int_equal(shardkv_mget_async(ca, 2, keys, multi_mget_done, &m), 0);
	assert_int_equal(multi_wait(&m), 0);
	assert_int_equal(atomic_load(&m.calls), 1);
	shardkv_mget_result *gr = m.result;
	assert_non_null(gr);
	assert_int_equal(gr->nmissing, 0);
	assert_memory_equal(gr->values[0].data, "1", 1);
	assert_memory_equal(gr->values[1].data, "2", 1);
	shardkv_mget_result_free(gr);
	assert_true(wrong_owners(0) > wrong);

	/* mput likewise: both keys end on node 2, written once. */
	wrong = wrong_owners(0);
	memset(&m, 0, sizeof(m));
	assert_int_equal(shardkv_mput_async(cb, 2, more, 2, vals, multi_mput_done, &m), 0);
	assert_int_equal(multi_wait(&m), 0);
	pr = m.result;
	assert_non_null(pr);
	assert_int_equal(pr->nfailed, 0);
	shardkv_mput_result_free(pr);
	assert_true(wrong_owners(0) > wrong);
	assert_int_equal(server_keys(1), 4);
	shardkv_close(ca);
	shardkv_close(cb);
}

static void
close_fails_async_multi_ops_held_by_a_silent_server(void **state)
{
	shardkv_client *c = open_client(2000, false);
	shardkv_bytes keys[] = {{"aa", 2}, {"zz", 2}}, vals[] = {{"1", 1}, {"2", 1}};
	shardkv_scan_args sa = {.prefix = {"a", 1}};
	multi_res m[3];
	(void)state;

	memset(m, 0, sizeof(m));
	assert_int_equal(shardkv_put(c, "apple", 5, "one", 3), 0); /* epoch 5 cached */
	pthread_mutex_lock(&g->srv[0].mu);
	g->srv[0].silent = true;
	pthread_mutex_unlock(&g->srv[0].mu);
	assert_int_equal(shardkv_mget_async(c, 2, keys, multi_mget_done, &m[0]), 0);
	assert_int_equal(shardkv_mput_async(c, 2, keys, 2, vals, multi_mput_done, &m[1]), 0);
	assert_int_equal(shardkv_scan_async(c, &sa, multi_scan_done, &m[2]), 0);
	for (uint64_t t0 = kv_test_now_ms();;) {
		pthread_mutex_lock(&g->srv[0].mu);
		int seen = g->srv[0].silent_seen;
		pthread_mutex_unlock(&g->srv[0].mu);
		if (seen >= 3)
			break;
		if (kv_test_now_ms() - t0 > FOLLOW_PATIENCE_MS)
			fail_msg("node 1 held %d of the 3 requests", seen);
		kv_test_sleep_ms(2);
	}
	/* Each op has a request on the wire to node 1: close waits for it
	 * (its timeout), then the op ends once, closed. */
	shardkv_close(c);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(atomic_load(&m[i].calls), 1);
		assert_int_equal(atomic_load(&m[i].status), SHARDKV_ECLOSED);
	}
	assert_null(m[0].result);
	shardkv_mput_result_free(m[1].result);
	assert_null(m[2].result);
	kv_fake_server_release(&g->srv[0]);
}

static void
a_refused_connection_refreshes_the_configuration_at_once(void **state)
{
	shardkv_client *c = open_client(60000, false); /* no watch: only a refresh can learn */
	async_res r = {0};
	char dead[64];
	(void)state;

	assert_int_equal(shardkv_put(c, "apple", 5, "one", 3), 0); /* epoch 5 cached */
	/* The cached configuration names node 1 at an address where nothing
	 * listens any more (the server stopped); the controller has moved on
	 * to node 2. */
	kv_test_free_url(dead, sizeof(dead));
	kv_config *stale = make_cfg(6, NULL, 1, 1);
	kv_node *n1 = (kv_node *)kv_config_node(stale, 1);
	free(n1->address);
	n1->address = strdup(dead);
	assert_non_null(n1->address);
	kvc_cfg_install(c, stale);
	assert_int_equal(cached_epoch(c), 6);
	publish(make_cfg(6, NULL, 1, 1));
	publish(make_cfg(7, NULL, 2, 2));
	set_truth(make_cfg(7, NULL, 2, 2));
	pthread_mutex_lock(&g->ctl->mu);
	unsigned calls = g->ctl->get_configs;
	pthread_mutex_unlock(&g->ctl->mu);

	assert_int_equal(shardkv_put_async(c, "kiwi", 4, "green", 5, async_done, &r), 0);
	assert_int_equal(async_wait(&r), 0);
	assert_int_equal(cached_epoch(c), 7);
	pthread_mutex_lock(&g->ctl->mu);
	assert_true(g->ctl->get_configs > calls);
	pthread_mutex_unlock(&g->ctl->mu);
	assert_int_equal(server_keys(1), 1); /* kiwi, on node 2 */
	shardkv_close(c);
}

static void
a_server_that_refuses_connections_is_named_at_the_deadline(void **state)
{
	shardkv_client *c = open_client(800, false);
	char dead[64];
	(void)state;

	assert_int_equal(shardkv_put(c, "apple", 5, "one", 3), 0); /* epoch 5 cached */
	/* Node 1 stopped and the controller has not moved its range yet. */
	kv_test_free_url(dead, sizeof(dead));
	for (int i = 0; i < 2; i++) {
		kv_config *cfg = make_cfg(6, NULL, 1, 1);
		kv_node *n1 = (kv_node *)kv_config_node(cfg, 1);
		free(n1->address);
		n1->address = strdup(dead);
		assert_non_null(n1->address);
		if (i == 0)
			kvc_cfg_install(c, cfg);
		else
			publish(cfg);
	}
	assert_int_equal(shardkv_put(c, "kiwi", 4, "green", 5), SHARDKV_EUNAVAIL);
	assert_non_null(strstr(shardkv_errmsg(), "connection refused"));
	assert_non_null(strstr(shardkv_errmsg(), dead));
	shardkv_close(c);
}

static void
an_owner_down_in_the_cached_configuration_is_not_waited_on(void **state)
{
	shardkv_client *c = open_client(60000, false);
	async_res r = {0};
	(void)state;

	assert_int_equal(shardkv_put(c, "apple", 5, "one", 3), 0); /* epoch 5 cached */
	/* Cached: node 1 down and still the owner (no other in-sync replica
	 * yet); the controller's next configuration gives its range to node 2. */
	kvc_cfg_install(c, owner_down_cfg(6));
	publish(make_cfg(6, NULL, 1, 1));
	publish(failed_over_cfg(7));
	set_truth(failed_over_cfg(7));
	pthread_mutex_lock(&g->srv[0].mu);
	int before = g->srv[0].requests;
	pthread_mutex_unlock(&g->srv[0].mu);

	assert_int_equal(shardkv_put_async(c, "kiwi", 4, "green", 5, async_done, &r), 0);
	assert_int_equal(async_wait(&r), 0);
	assert_int_equal(cached_epoch(c), 7);
	pthread_mutex_lock(&g->srv[0].mu);
	assert_int_equal(g->srv[0].requests, before); /* nothing was sent to the down node */
	pthread_mutex_unlock(&g->srv[0].mu);
	assert_int_equal(server_keys(1), 1);
	shardkv_close(c);
}

/*
 * A range whose owner is `down` and stays so (no other copy takes it over,
 * the node does not come back) is reported unavailable after about a
 * second of waiting, naming the node, not at the call's deadline.
 */
static void
an_owner_that_stays_down_fails_as_unavailable_long_before_the_deadline(void **state)
{
	shardkv_client *c = open_client(30000, false);
	shardkv_buf v = {0};
	(void)state;

	assert_int_equal(shardkv_put(c, "apple", 5, "one", 3), 0); /* epoch 5 cached */
	kvc_cfg_install(c, owner_down_cfg(6));
	set_truth(owner_down_cfg(6));

	uint64_t t0 = kv_test_now_ms();
	assert_int_equal(shardkv_get(c, "apple", 5, &v), SHARDKV_EUNAVAIL);
	uint64_t took = kv_test_now_ms() - t0;
	assert_non_null(strstr(shardkv_errmsg(), "is down in epoch 6"));
	/* About a second (ENG_DOWN_GIVEUP_MS); the deadline is 30 s away. */
	if (took < 900 || took > 10000)
		fail_msg("get failed after %llu ms", (unsigned long long)took);

	/* mget likewise: its part for the down node is never sent. */
	shardkv_bytes keys[] = {{"apple", 5}, {"kiwi", 4}};
	shardkv_mget_result *gr = NULL;
	t0 = kv_test_now_ms();
	assert_int_equal(shardkv_mget(c, 2, keys, &gr), SHARDKV_EUNAVAIL);
	took = kv_test_now_ms() - t0;
	assert_non_null(strstr(shardkv_errmsg(), "is down in epoch 6"));
	if (took < 900 || took > 10000)
		fail_msg("mget failed after %llu ms", (unsigned long long)took);
	shardkv_mget_result_free(gr);
	shardkv_close(c);
}

static void
admin_results_and_config_are_reported(void **state)
{
	shardkv_client *c = open_client(2000, false);
	shardkv_admin_result ar;
	shardkv_config *cfg;
	(void)state;

	assert_int_equal(shardkv_join(c, "tcp://127.0.0.1:1", SHARDKV_WAIT, &ar), 0);
	assert_int_equal(ar.epoch, 6);
	assert_int_equal(ar.node_id, 3);
	assert_int_equal(ar.wait_ms, 1500);
	assert_int_equal(shardkv_join(c, g->srv[0].url, 0, &ar), SHARDKV_EEXISTS);
	assert_non_null(strstr(shardkv_errmsg(), "already registered"));
	assert_int_equal(shardkv_leave(c, "9", 0, &ar), SHARDKV_ENOTFOUND);
	assert_int_equal(shardkv_move(c, "a", 1, "b", 1, "2", 10, 0, &ar), 0);
	assert_int_equal(ar.nmigrations, 1);
	assert_int_equal(ar.first_mig_id, 42);
	assert_int_equal(shardkv_config_get(c, 0, &cfg), 0);
	assert_int_equal(cfg->epoch, 5);
	assert_int_equal(cfg->nnodes, 2);
	assert_int_equal(cfg->nranges, 2);
	assert_string_equal((char *)cfg->ranges[1].start.data, "m");
	shardkv_config_free(cfg);
	assert_int_equal(shardkv_config_get(c, 3, &cfg), SHARDKV_ENOTFOUND);
	assert_int_equal(shardkv_status(c, &cfg), 0);
	assert_int_equal(cfg->nodes[1].keys, 20);
	assert_true(cfg->nodes[1].has_stats);
	assert_int_equal(cfg->ncontrollers, 1);
	assert_string_equal(cfg->controllers[0].role, "standalone");
	shardkv_config_free(cfg);
	shardkv_close(c);
}

/* Runs the CLI against the fake cluster; returns stdout (owned) and the code. */
static int
cli(char **out, size_t *nout, char **err, int argc, const char **args)
{
	const char *argv[32] = {"shardkv", "-c", g->ctl->url, "--timeout", "2000"};
	size_t nerr;
	char *e = NULL;
	FILE *fo = open_memstream(out, nout), *fe = open_memstream(&e, &nerr);
	int rc;

	for (int i = 0; i < argc; i++)
		argv[5 + i] = args[i];
	rc = kv_cli_main(5 + argc, (char **)argv, fo, fe);
	fclose(fo);
	fclose(fe);
	if (err)
		*err = e;
	else
		free(e);
	return rc;
}

/* Whether output o is want (NULL: anything). */
static bool
out_matches(const char *o, const char *want)
{
	return want == NULL || strcmp(o, want) == 0;
}

#define CLI_EXPECT(code, expect_out, ...)                                                          \
	do {                                                                                       \
		const char *a_[] = {__VA_ARGS__};                                                  \
		char *o_ = NULL, *e_ = NULL;                                                       \
		size_t n_;                                                                         \
		int rc_ = cli(&o_, &n_, &e_, ARGC(a_), a_);                                        \
		if (rc_ != (code) || !out_matches(o_, (expect_out)))                               \
			fail_msg("%s: rc %d (want %d) out '%s' err '%s'", a_[0], rc_, (code), o_,  \
			         e_);                                                              \
		free(o_);                                                                          \
		free(e_);                                                                          \
	} while (0)

static void
conditional_put_answers_the_current_value_without_a_read(void **state)
{
	shardkv_client *c = open_client(3000, false);
	shardkv_put_options absent = {.if_absent = true};
	shardkv_put_options eq = {.if_equal = true, .expect = {"v1", 2}};
	shardkv_buf cur, v;
	(void)state;

	assert_int_equal(shardkv_put_ex(c, "lock", 4, "me", 2, &absent, &cur), 0);
	assert_int_equal(shardkv_put_ex(c, "lock", 4, "you", 3, &absent, &cur), SHARDKV_EEXISTS);
	assert_non_null(cur.data);
	assert_int_equal(cur.len, 2);
	assert_memory_equal(cur.data, "me", 2);
	shardkv_free(cur.data);
	/* if-equal on an absent key: a mismatch, the key said absent. */
	assert_int_equal(shardkv_put_ex(c, "zreg", 4, "v2", 2, &eq, &cur), SHARDKV_EMISMATCH);
	assert_null(cur.data);
	assert_int_equal(shardkv_put(c, "zreg", 4, "v1", 2), 0);
	assert_int_equal(shardkv_put_ex(c, "zreg", 4, "v2", 2, &eq, &cur), 0);
	assert_int_equal(shardkv_put_ex(c, "zreg", 4, "v3", 2, &eq, &cur), SHARDKV_EMISMATCH);
	assert_int_equal(cur.len, 2);
	assert_memory_equal(cur.data, "v2", 2);
	shardkv_free(cur.data);
	assert_int_equal(shardkv_get(c, "zreg", 4, &v), 0);
	assert_memory_equal(v.data, "v2", 2);
	shardkv_free(v.data);
	/* del if-equal */
	assert_int_equal(shardkv_del_if_equal(c, "zreg", 4, "v1", 2, &cur), SHARDKV_EMISMATCH);
	assert_memory_equal(cur.data, "v2", 2);
	shardkv_free(cur.data);
	assert_int_equal(shardkv_del_if_equal(c, "zreg", 4, "v2", 2, NULL), 0);
	assert_int_equal(shardkv_exists(c, "zreg", 4), SHARDKV_ENOTFOUND);
	assert_int_equal(shardkv_exists(c, "lock", 4), 0);
	/* Refused before sending: two conditions, a TTL over the bound. */
	shardkv_put_options both = {.if_absent = true, .if_equal = true};
	shardkv_put_options huge = {.ttl_ms = SHARDKV_MAX_TTL_MS + 1};
	assert_int_equal(shardkv_put_ex(c, "k", 1, "v", 1, &both, NULL), SHARDKV_EINVAL);
	assert_int_equal(shardkv_put_ex(c, "k", 1, "v", 1, &huge, NULL), SHARDKV_EINVAL);
	shardkv_close(c);
}

/* The reply of an applied if-absent put is lost: the retry keeps its
 * request id, so the server answers it as applied, not as "exists". */
static void
lost_reply_of_a_conditional_put_is_answered_as_applied(void **state)
{
	shardkv_client *c = open_client(3000, false);
	shardkv_put_options absent = {.if_absent = true};
	shardkv_buf cur = {0};
	(void)state;

	g->srv[0].drop_lossy = true;
	assert_int_equal(shardkv_put_ex(c, "lossy", 5, "mine", 4, &absent, &cur), 0);
	assert_int_equal(g->srv[0].received_lossy, 2);
	assert_int_equal(g->srv[0].lossy_ids[0], g->srv[0].lossy_ids[1]);
	assert_int_equal(g->srv[0].applied_lossy, 1);
	/* A new put if absent is a new request: refused. */
	assert_int_equal(shardkv_put_ex(c, "lossy", 5, "other", 5, &absent, &cur), SHARDKV_EEXISTS);
	assert_memory_equal(cur.data, "mine", 4);
	shardkv_free(cur.data);
	shardkv_close(c);
}

static void
expiry_ttl_persist_and_incr(void **state)
{
	shardkv_client *c = open_client(3000, false);
	shardkv_put_options ttl = {.ttl_ms = 60000};
	int64_t left, n;
	shardkv_buf v;
	(void)state;

	assert_int_equal(shardkv_put_ex(c, "sess", 4, "x", 1, &ttl, NULL), 0);
	assert_int_equal(shardkv_ttl(c, "sess", 4, &left), 0);
	assert_true(left > 50000 && left <= 60000);
	assert_int_equal(shardkv_persist(c, "sess", 4), 0);
	assert_int_equal(shardkv_ttl(c, "sess", 4, &left), 0);
	assert_int_equal(left, -1);
	assert_int_equal(shardkv_expire(c, "sess", 4, 1), 0);
	/* Gone once its millisecond passed (polled, with a deadline). */
	uint64_t until = kv_now_ns() + 2000000000ull;
	while (shardkv_exists(c, "sess", 4) == 0 && kv_now_ns() < until)
		kv_test_sleep_ms(1);
	assert_int_equal(shardkv_exists(c, "sess", 4), SHARDKV_ENOTFOUND);
	assert_int_equal(shardkv_ttl(c, "sess", 4, &left), SHARDKV_ENOTFOUND);
	assert_int_equal(shardkv_expire(c, "nope", 4, 10), SHARDKV_ENOTFOUND);
	assert_int_equal(shardkv_expire(c, "sess", 4, 0), SHARDKV_EINVAL);
	assert_int_equal(shardkv_incr(c, "ctr", 3, 5, &n), 0);
	assert_int_equal(n, 5);
	assert_int_equal(shardkv_incr(c, "ctr", 3, -7, &n), 0);
	assert_int_equal(n, -2);
	assert_int_equal(shardkv_get(c, "ctr", 3, &v), 0);
	assert_string_equal((char *)v.data, "-2");
	shardkv_free(v.data);
	assert_int_equal(shardkv_put(c, "word", 4, "abc", 3), 0);
	assert_int_equal(shardkv_incr(c, "word", 4, 1, &n), SHARDKV_EINVAL);
	/* mput with a TTL */
	shardkv_bytes ks[] = {{"a1", 2}, {"z1", 2}}, vs[] = {{"1", 1}, {"2", 1}};
	assert_int_equal(shardkv_mput_ex(c, 2, ks, 2, vs, 30000, NULL), 0);
	assert_int_equal(shardkv_ttl(c, "z1", 2, &left), 0);
	assert_true(left > 0 && left <= 30000);
	shardkv_close(c);
}

static void
count_and_delrange_sum_the_steps_of_every_node(void **state)
{
	shardkv_client *c = open_client(3000, false);
	const char *keys[] = {"a", "b", "c", "d", "e", "m", "n", "o", "p", "x"};
	uint64_t n;
	(void)state;

	for (size_t i = 0; i < ARGC(keys); i++)
		assert_int_equal(shardkv_put(c, keys[i], 1, "v", 1), 0);
	assert_int_equal(shardkv_count(c, "", 0, "", 0, &n), 0);
	assert_int_equal(n, 10);
	assert_int_equal(shardkv_count(c, "b", 1, "o", 1, &n), 0); /* b..e, m, n */
	assert_int_equal(n, 6);
	assert_int_equal(shardkv_count(c, "o", 1, "b", 1, &n), SHARDKV_EINVAL);
	assert_int_equal(shardkv_delrange(c, "c", 1, "p", 1, &n), 0); /* c d e m n o */
	assert_int_equal(n, 6);
	assert_int_equal(server_keys(0) + server_keys(1), 4);
	assert_int_equal(shardkv_count(c, "", 0, "", 0, &n), 0);
	assert_int_equal(n, 4);
	assert_int_equal(shardkv_delrange(c, "", 0, "", 0, &n), 0);
	assert_int_equal(n, 4);
	assert_int_equal(server_keys(0) + server_keys(1), 0);
	shardkv_close(c);
}

/* Completions of the async forms. */
typedef struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
	int status[8];
	int64_t num[8];
	char val[8][16];
	bool null_val[8];
} ex_rec;

static ex_rec exr = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

static void
ex_done(void *arg, int status, const void *val, size_t vlen)
{
	int i = (int)(intptr_t)arg;
	pthread_mutex_lock(&exr.mu);
	exr.status[i] = status;
	exr.null_val[i] = val == NULL;
	if (val && vlen < sizeof(exr.val[i]))
		memcpy(exr.val[i], val, vlen);
	exr.done++;
	pthread_cond_signal(&exr.cv);
	pthread_mutex_unlock(&exr.mu);
}

static void
ex_num(void *arg, int status, int64_t n)
{
	int i = (int)(intptr_t)arg;
	pthread_mutex_lock(&exr.mu);
	exr.status[i] = status;
	exr.num[i] = n;
	exr.done++;
	pthread_cond_signal(&exr.cv);
	pthread_mutex_unlock(&exr.mu);
}

static void
ex_wait(int n)
{
	pthread_mutex_lock(&exr.mu);
	while (exr.done < n)
		pthread_cond_wait(&exr.cv, &exr.mu);
	exr.done = 0;
	pthread_mutex_unlock(&exr.mu);
}

static void
ex_mput(void *arg, int status, shardkv_mput_result *r)
{
	shardkv_mput_result_free(r);
	ex_num(arg, status, 0);
}

static void
async_forms_of_the_new_single_key_ops(void **state)
{
	shardkv_client *c = open_client(3000, false);
	shardkv_put_options absent = {.if_absent = true};
	(void)state;

	memset(exr.val, 0, sizeof(exr.val));
	assert_int_equal(shardkv_put(c, "held", 4, "old", 3), 0);
	/* One at a time: the fake servers answer requests of one op. */
	assert_int_equal(shardkv_put_ex_async(c, "held", 4, "new", 3, &absent, ex_done, (void *)0),
	                 0);
	ex_wait(1);
	assert_int_equal(shardkv_del_if_equal_async(c, "none", 4, "x", 1, ex_done, (void *)1), 0);
	ex_wait(1);
	assert_int_equal(shardkv_incr_async(c, "n", 1, 41, ex_num, (void *)2), 0);
	ex_wait(1);
	assert_int_equal(shardkv_exists_async(c, "held", 4, ex_done, (void *)3), 0);
	ex_wait(1);
	assert_int_equal(shardkv_expire_async(c, "held", 4, 50000, ex_done, (void *)4), 0);
	ex_wait(1);
	assert_int_equal(exr.status[0], SHARDKV_EEXISTS);
	assert_string_equal(exr.val[0], "old");
	assert_int_equal(exr.status[1], SHARDKV_EMISMATCH);
	assert_true(exr.null_val[1]); /* absent */
	assert_int_equal(exr.status[2], 0);
	assert_int_equal(exr.num[2], 41);
	assert_int_equal(exr.status[3], 0);
	assert_int_equal(exr.status[4], 0);
	assert_int_equal(shardkv_ttl_async(c, "held", 4, ex_num, (void *)5), 0);
	ex_wait(1);
	assert_int_equal(shardkv_persist_async(c, "n", 1, ex_done, (void *)6), 0);
	ex_wait(1);
	assert_int_equal(exr.status[5], 0);
	assert_true(exr.num[5] > 0 && exr.num[5] <= 50000);
	assert_int_equal(exr.status[6], 0);
	assert_int_equal(shardkv_ttl_async(c, "held", 4, NULL, NULL), SHARDKV_EINVAL);
	/* mput with a TTL, async: both keys expire. */
	shardkv_bytes ks[] = {{"a2", 2}, {"z2", 2}}, vs[] = {{"1", 1}, {"2", 1}};
	assert_int_equal(shardkv_mput_ex_async(c, 2, ks, 2, vs, 40000, ex_mput, (void *)7), 0);
	ex_wait(1);
	assert_int_equal(exr.status[7], 0);
	int64_t left;
	assert_int_equal(shardkv_ttl(c, "a2", 2, &left), 0);
	assert_true(left > 0 && left <= 40000);
	assert_int_equal(shardkv_ttl(c, "z2", 2, &left), 0);
	assert_true(left > 0 && left <= 40000);
	shardkv_close(c);
}

static void
cli_round_trip_of_every_command(void **state)
{
	(void)state;
	CLI_EXPECT(0, "", "put", "apple", "red");
	CLI_EXPECT(0, "", "put", "zoo", "animals");
	CLI_EXPECT(0, "red\n", "get", "apple");
	CLI_EXPECT(1, "", "get", "pear");
	CLI_EXPECT(0, "", "append", "apple", "dish");
	CLI_EXPECT(0, "", "mput", "b", "2", "y", "25");
	CLI_EXPECT(0, "reddish\n25\n2\n", "mget", "apple", "y", "b");
	CLI_EXPECT(1, "", "mget", "apple", "nope");
	CLI_EXPECT(0, "apple\nb\ny\nzoo\n", "keys");
	CLI_EXPECT(0, "y\n", "keys", "--prefix", "y");
	CLI_EXPECT(0, "b\t2\ny\t25\n", "scan", "b", "z");
	CLI_EXPECT(0, "apple\treddish\n", "scan", "", "", "--limit", "1");
	CLI_EXPECT(0, "reddish\n", "del", "apple");
	CLI_EXPECT(1, "", "del", "apple");
	CLI_EXPECT(0, NULL, "config");
	CLI_EXPECT(0, NULL, "status");
	CLI_EXPECT(0, "{\"epoch\": 6, \"command\": \"join\", \"migrations\": 0, \"node\": 3}\n",
	           "--json", "join", "tcp://127.0.0.1:9");
	CLI_EXPECT(2, "", "join", g->srv[0].url);
	CLI_EXPECT(2, "", "leave", "7"); /* unknown node: an invalid request */
	CLI_EXPECT(0, "moving [a, b) to node 2 in epoch 6 (1 migration)\n", "move", "a", "b", "2");
	CLI_EXPECT(0, "rebalancing in epoch 5 (0 migrations)\n", "rebalance");
}

/* Runs the CLI; checks its exit code, stdout and that stderr contains `err_has`. */
static void
cli_expect_err(int code, const char *want_out, const char *err_has, int argc, const char **argv)
{
	char *o = NULL, *e = NULL;
	size_t n;
	int rc = cli(&o, &n, &e, argc, argv);

	if (rc != code || !out_matches(o, want_out) || (err_has && strstr(e, err_has) == NULL))
		fail_msg("%s %s: rc %d (want %d) out '%s' err '%s'", argv[0], argv[1], rc, code, o,
		         e);
	free(o);
	free(e);
}

#define CLI_EXPECT_ERR(code, out, err_has, ...)                                                    \
	do {                                                                                       \
		const char *a_[] = {__VA_ARGS__};                                                  \
		cli_expect_err((code), (out), (err_has), ARGC(a_), a_);                            \
	} while (0)

static void
cli_conditional_writes_expiry_counters_and_ranges(void **state)
{
	(void)state;
	CLI_EXPECT(0, "", "put", "lock", "me", "--if-absent");
	CLI_EXPECT_ERR(1, "", "exists: current value \"me\"", "put", "lock", "you", "--if-absent");
	CLI_EXPECT(1,
	           "{\"key\": \"lock\", \"written\": false, \"condition\": \"exists\", "
	           "\"current\": \"me\"}\n",
	           "--json", "put", "lock", "you", "--if-absent");
	CLI_EXPECT(0, "", "put", "lock", "you", "--if-equal", "me");
	CLI_EXPECT_ERR(1, "", "mismatch: current value \"you\"", "put", "lock", "x", "--if-equal",
	               "me");
	CLI_EXPECT_ERR(1, "", "mismatch: the key is absent", "put", "nolock", "x", "--if-equal",
	               "me");
	CLI_EXPECT_ERR(1, "", "mismatch: current value \"you\"", "del", "lock", "--if-equal", "me");
	CLI_EXPECT(0, "you\n", "del", "lock", "--if-equal", "you");
	CLI_EXPECT(1, "", "exists", "lock");
	CLI_EXPECT(1, "{\"key\": \"lock\", \"exists\": false}\n", "--json", "exists", "lock");
	CLI_EXPECT(0, "", "put", "s", "v", "--ttl", "60000");
	CLI_EXPECT(0, "", "exists", "s");
	CLI_EXPECT(0, "", "persist", "s");
	CLI_EXPECT(0, "-1\n", "ttl", "s");
	CLI_EXPECT(0, "", "expire", "s", "90000");
	CLI_EXPECT(1, "", "ttl", "nope");
	CLI_EXPECT(1, "", "expire", "nope", "5");
	CLI_EXPECT(0, "1\n", "incr", "n");
	CLI_EXPECT(0, "-4\n", "incr", "n", "-5");
	CLI_EXPECT(0, "{\"key\": \"n\", \"value\": 6}\n", "--json", "incr", "n", "10");
	CLI_EXPECT(2, "", "incr", "s");
	CLI_EXPECT(0, "", "mput", "a", "1", "b", "2", "y", "3", "--ttl", "60000");
	CLI_EXPECT(0, "5\n", "count", "", "");
	CLI_EXPECT(0, "{\"count\": 2}\n", "--json", "count", "a", "c");
	CLI_EXPECT(0, "{\"deleted\": 4}\n", "--json", "delrange", "b", "");
	CLI_EXPECT(0, "1\n", "delrange", "", "");
	CLI_EXPECT(0, "0\n", "count", "", "");
	CLI_EXPECT(2, "", "count", "z", "a");
}

static void
cli_json_config_and_status_have_the_spec_shape(void **state)
{
	char *out, want[1024];
	size_t n;
	const char *cfg[] = {"--json", "config"};
	(void)state;

	assert_int_equal(cli(&out, &n, NULL, 2, cfg), 0);
	assert_int_equal(
	    snprintf(want, sizeof(want),
	             "{\"epoch\": 5, \"nodes\": [{\"id\": 1, \"address\": \"%s\", "
	             "\"state\": \"active\"}, {\"id\": 2, \"address\": \"%s\", "
	             "\"state\": \"active\"}], \"ranges\": [{\"start\": \"\", \"end\": "
	             "\"m\", \"node\": 1, \"replicas\": [1], \"insync\": [1], "
	             "\"leader_epoch\": 0}, {\"start\": \"m\", \"end\": \"\", \"node\": "
	             "2, \"replicas\": [2], \"insync\": [2], \"leader_epoch\": 0}], "
	             "\"pins\": [], \"migrations\": []}\n",
	             g->srv[0].url, g->srv[1].url) > 0,
	    true);
	assert_string_equal(out, want);
	free(out);

	const char *st[] = {"--json", "status"};
	assert_int_equal(cli(&out, &n, NULL, 2, st), 0);
	assert_non_null(strstr(out, "\"keys\": 20, \"bytes\": 200, \"ops_per_sec\": 1.5"));
	assert_non_null(strstr(out, "\"migrations\": []"));
	assert_non_null(strstr(out, "\"controllers\": [{\"id\": 1, \"address\": \""));
	assert_non_null(strstr(out, "\"role\": \"standalone\", \"term\": 0, \"index\": 0}]"));
	/* the balancer's latest decisions, an added field: none from a fake controller */
	assert_non_null(strstr(out, "\"balancer\": []}\n"));
	free(out);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(single_key_ops_are_routed_to_the_owner, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(client_retries_after_wrong_owner_with_new_epoch, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(lost_reply_is_retried_with_the_same_request_id, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(mput_and_mget_split_per_node_concurrently_in_key_order,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(mput_reports_the_node_that_failed, setup, teardown),
	    cmocka_unit_test_setup_teardown(scan_merges_servers_in_key_order_and_resumes, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(
	        a_watch_keeps_its_connection_across_configuration_changes, setup, teardown),
	    cmocka_unit_test_setup_teardown(watch_learns_a_new_epoch_within_milliseconds, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(
	        a_write_waiting_on_a_primary_that_fails_over_goes_to_the_new_one, setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        a_refused_connection_refreshes_the_configuration_at_once, setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        an_mput_part_waiting_on_a_primary_that_fails_over_is_split_again, setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        an_mput_waiting_on_a_primary_that_fails_over_goes_whole_to_the_new_one_with_its_id,
	        setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        a_server_that_refuses_connections_is_named_at_the_deadline, setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        async_mget_and_mput_refused_as_wrong_owner_are_split_again, setup, teardown),
	    cmocka_unit_test_setup_teardown(close_fails_async_multi_ops_held_by_a_silent_server,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        an_owner_down_in_the_cached_configuration_is_not_waited_on, setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        an_owner_that_stays_down_fails_as_unavailable_long_before_the_deadline, setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(admin_results_and_config_are_reported, setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        conditional_put_answers_the_current_value_without_a_read, setup, teardown),
	    cmocka_unit_test_setup_teardown(lost_reply_of_a_conditional_put_is_answered_as_applied,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(expiry_ttl_persist_and_incr, setup, teardown),
	    cmocka_unit_test_setup_teardown(count_and_delrange_sum_the_steps_of_every_node, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(async_forms_of_the_new_single_key_ops, setup, teardown),
	    cmocka_unit_test_setup_teardown(cli_round_trip_of_every_command, setup, teardown),
	    cmocka_unit_test_setup_teardown(cli_conditional_writes_expiry_counters_and_ranges,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(cli_json_config_and_status_have_the_spec_shape, setup,
	                                    teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
