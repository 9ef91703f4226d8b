/*
 * test_liveness_inproc.c - node liveness and server leases with a real
 * controller and real shard servers inside the test process, with short
 * leases through their create options (doc/contract.md §2, §4): a stopped
 * server is declared down within the lease and its margin and active again
 * when it comes back; a freshly started controller declares nobody down
 * before a full lease and margin; a server cut off from the controller stops
 * answering data requests after its lease and serves again once the
 * controller is back; remove refuses a live node and data loss without the
 * flag, forgets a down node with it, and the removed server learns it is
 * gone; locate and check (through the CLI's kv_cli_main) report the primary
 * and the problems with their exit codes.
 *
 * Every wait polls with a deadline; bounds on timings are generous (the
 * machine is shared) except the lower ones, which are what safety needs.
 */
#include "client/cli/cli.h"
#include "common/err.h"
#include "controller/controller.h"
#include "proto/admin_codec.h"
#include "shardserver/server.h"
#include "tests/support/inproc_srv.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define NSRV     2
#define LEASE    500u /* ms, controller and servers */
#define MARGIN   300u /* ms: down after LEASE + MARGIN */
#define RENEW    50u  /* ms */
#define DOWN_MS  (LEASE + MARGIN)
#define PATIENCE 15000u /* ms: upper bound of any wait on a busy machine */

static inproc_srv srvs[NSRV];
static kv_controller *ctl;
static kv_controller_cfg ccfg;
static char ctl_url[64], ctl_dir[200], tmpdir[128], ctl_metrics[32];

static void
ctl_up(void)
{
	char err[256];

	ccfg = (kv_controller_cfg){.listen = ctl_url,
	                           .data_dir = ctl_dir,
	                           .metrics = ctl_metrics,
	                           .lease_ms = LEASE,
	                           .lease_margin_ms = MARGIN};
	if (kv_controller_create(&ccfg, &ctl, err, sizeof(err)) != KV_OK)
		fail_msg("controller create: %s", err);
	if (kv_controller_start(ctl, err, sizeof(err)) != KV_OK)
		fail_msg("controller start: %s", err);
}

static void
ctl_down(void)
{
	kv_controller_destroy(ctl);
	ctl = NULL;
}

static void
srv_up(int i)
{
	srvs[i].cfg.lease_ms = LEASE;
	srvs[i].cfg.lease_renew_ms = RENEW;
	inproc_srv_up(&srvs[i]);
}

static int
setup(void **state)
{
	(void)state;
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvlive.XXXXXX");
	assert_non_null(mkdtemp(tmpdir));
	kv_test_free_url(ctl_url, sizeof(ctl_url));
	do /* a port of its own, not the one ctl_url names */
		snprintf(ctl_metrics, sizeof(ctl_metrics), "127.0.0.1:%d", kv_test_free_port());
	while (strstr(ctl_url, strchr(ctl_metrics, ':')) != NULL);
	snprintf(ctl_dir, sizeof(ctl_dir), "%s/ctl", tmpdir);
	ctl_up();
	for (int i = 0; i < NSRV; i++)
		inproc_srv_init(&srvs[i], tmpdir, i, ctl_url, 16);
	return 0;
}

static int
teardown(void **state)
{
	char cmd[300];

	(void)state;
	clients_close();
	for (int i = 0; i < NSRV; i++) {
		kv_server_destroy(srvs[i].s);
		srvs[i].s = NULL;
	}
	ctl_down();
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", tmpdir);
	return 0;
}

/* The controller's latest configuration (the caller frees it), or NULL
 * when it does not answer. */
static kv_config *
get_config(void)
{
	kv_admin_req q = {.op = KV_ADM_GET_CONFIG, .request_id = 1};
	kv_rpc_client *cli = client_for(ctl_url);
	nng_msg *m = NULL, *reply = NULL;
	kv_admin_resp r;
	kv_config *cfg = NULL;

	assert_int_equal(kv_admin_req_encode(&q, &m), KV_OK);
	if (kv_rpc_call(cli, m, &reply, 2000) != KV_OK)
		return NULL;
	if (kv_admin_resp_decode(nng_msg_body(reply), nng_msg_len(reply), &r) == KV_OK) {
		if (r.err == KV_OK)
			cfg = kv_admin_resp_take_config(&r);
		kv_admin_resp_fini(&r);
	}
	nng_msg_free(reply);
	return cfg;
}

/* Scrapes the controller's /metrics into buf (NUL-terminated). */
static void
scrape(char *buf, size_t cap)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	const char *req = "GET /metrics HTTP/1.0\r\n\r\n";
	size_t n = 0;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	a.sin_port = htons((uint16_t)atoi(strchr(ctl_metrics, ':') + 1));
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0)
		fail_msg("cannot connect to %s: %s", ctl_metrics, strerror(errno));
	assert_true(write(fd, req, strlen(req)) == (ssize_t)strlen(req));
	for (ssize_t r; n < cap - 1 && (r = read(fd, buf + n, cap - 1 - n)) > 0;)
		n += (size_t)r;
	close(fd);
	buf[n] = '\0';
}

/* The state of node id in the latest configuration; 0 when unknown. */
static int
node_state(uint32_t id)
{
	kv_config *cfg = get_config();
	const kv_node *n = cfg ? kv_config_node(cfg, id) : NULL;
	int st = n ? (int)n->state : 0;

	kv_config_free(cfg);
	return st;
}

/* Waits until node id is in state st; returns the ms it took. */
static uint64_t
wait_state(uint32_t id, kv_node_state st)
{
	uint64_t t0 = kv_test_now_ms();

	while (node_state(id) != (int)st) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("node %u never became %s", id, kv_node_state_name(st));
		kv_test_sleep_ms(10);
	}
	return kv_test_now_ms() - t0;
}

/* Waits until both servers are active, own ranges and nothing moves. */
static void
wait_settled(void)
{
	uint64_t t0 = kv_test_now_ms();

	for (;;) {
		kv_config *cfg = get_config();
		bool ok = cfg && cfg->nmigs == 0 && cfg->nnodes == NSRV && cfg->nranges >= 2;
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

/* Starts both servers (the first owns everything, the second takes half). */
static void
cluster_up(void)
{
	srv_up(0);
	srv_wait_ready(srvs[0].url, 1, PATIENCE, NULL);
	srv_up(1);
	wait_settled();
	srv_wait_ready(srvs[1].url, 1, PATIENCE, NULL);
}

/* A key node id owns (the two nodes split the key space somewhere). */
static const char *
key_on(uint32_t id)
{
	static const char *const keys[] = {"!", "A", "O", "a", "zz", "~~"};
	kv_config *cfg = get_config();

	assert_non_null(cfg);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
		if (kv_config_route(cfg, keys[i], strlen(keys[i])) == id) {
			kv_config_free(cfg);
			return keys[i];
		}
	fail_msg("node %u owns none of the probe keys", id);
	return NULL;
}

/* One get at url: the wire status of the request or of its op, and the
 * request's error message into why. */
static int
get_status(const char *url, const char *key, char *why, size_t whylen)
{
	Shardkv__GetOp g = SHARDKV__GET_OP__INIT;
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__Op *ops[1] = {&op};
	Shardkv__Request rq = SHARDKV__REQUEST__INIT;
	Shardkv__Response *r;
	int st;

	g.key = bd(key);
	op.op_case = SHARDKV__OP__OP_GET;
	op.get = &g;
	rq.n_ops = 1;
	rq.ops = ops;
	rq.epoch = 1;
	why[0] = 0;
	if ((r = call(url, &rq)) == NULL)
		return -1;
	st = r->status ? (int)r->status : r->n_results == 1 ? (int)r->results[0]->status : -2;
	snprintf(why, whylen, "%s", r->error ? r->error : "");
	shardkv__response__free_unpacked(r, NULL);
	return st;
}

/* Puts k = v at url, retrying until the server serves (a loaded machine
 * may delay its first lease renewals). */
static void
put_ok(const char *url, const char *k, const char *v)
{
	uint64_t t0 = kv_test_now_ms();

	while (do_put(url, k, v, 0, 0).status != 0) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("%s never served", url);
		kv_test_sleep_ms(10);
	}
}

/* Runs `shardkv -c CTL args...` in process; returns the exit code, with
 * stdout and stderr in out and err (NUL-terminated, truncated). */
static int
cli(char *out, size_t outlen, char *err, size_t errlen, ...)
{
	char *argv[16] = {"shardkv", "-c", ctl_url};
	int argc = 3, rv;
	char *obuf = NULL, *ebuf = NULL;
	size_t olen = 0, elen = 0;
	FILE *o = open_memstream(&obuf, &olen), *e = open_memstream(&ebuf, &elen);
	va_list ap;

	va_start(ap, errlen);
	for (char *a; argc < 15 && (a = va_arg(ap, char *)) != NULL;)
		argv[argc++] = a;
	va_end(ap);
	rv = kv_cli_main(argc, argv, o, e);
	fclose(o);
	fclose(e);
	snprintf(out, outlen, "%s", obuf ? obuf : "");
	snprintf(err, errlen, "%s", ebuf ? ebuf : "");
	free(obuf);
	free(ebuf);
	return rv;
}

static void
stopped_server_is_declared_down_after_the_lease_and_active_again_when_it_returns(void **state)
{
	char why[200];
	uint64_t t0, took;

	(void)state;
	cluster_up();
	const char *k2 = key_on(2);
	put_ok(srvs[1].url, k2, "v");
	t0 = kv_test_now_ms();
	inproc_srv_down(&srvs[1]); /* no leave: the node keeps its ranges */
	wait_state(2, KV_NODE_DOWN);
	took = kv_test_now_ms() - t0;
	/* Never before the lease and margin since its last renewal (at most
	 * one renewal period before the stop). */
	assert_true(took + RENEW >= DOWN_MS);
	assert_int_equal(node_state(1), KV_NODE_ACTIVE);
	/* Its ranges stayed its own while it was down. */
	kv_config *cfg = get_config();
	assert_non_null(cfg);
	assert_int_equal(kv_config_route(cfg, k2, strlen(k2)), 2);
	kv_config_free(cfg);
	/* The metrics count it. */
	char m[16384];
	scrape(m, sizeof(m));
	assert_non_null(strstr(m, "\nshardkv_controller_nodes{state=\"down\"} 1\n"));
	assert_non_null(strstr(m, "\nshardkv_controller_nodes{state=\"active\"} 1\n"));
	assert_non_null(strstr(m, "\nshardkv_controller_nodes_declared_down_total 1\n"));
	assert_non_null(strstr(m, "\nshardkv_controller_node_heartbeat_age_seconds{node=\"2\"} "));
	assert_non_null(strstr(m, "\nshardkv_controller_node_heartbeat_age_seconds{node=\"1\"} "));

	srv_up(1); /* the same data dir: the same node */
	wait_state(2, KV_NODE_ACTIVE);
	t0 = kv_test_now_ms();
	while (get_status(srvs[1].url, k2, why, sizeof(why)) != 0) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the returned server never served: %s", why);
		kv_test_sleep_ms(20);
	}
}

static void
fresh_controller_declares_nobody_down_before_a_full_lease_and_margin(void **state)
{
	uint64_t t0, took;

	(void)state;
	cluster_up();
	ctl_down();
	inproc_srv_down(&srvs[1]);
	t0 = kv_test_now_ms();
	ctl_up();
	assert_int_equal(node_state(2), KV_NODE_ACTIVE);
	wait_state(2, KV_NODE_DOWN);
	took = kv_test_now_ms() - t0;
	assert_true(took >= DOWN_MS);
	/* The live one was never declared down. */
	assert_int_equal(node_state(1), KV_NODE_ACTIVE);
}

static void
server_cut_off_from_the_controller_stops_serving_after_its_lease_until_it_returns(void **state)
{
	char why[200];
	uint64_t t0, took;
	int st;

	(void)state;
	srv_up(0);
	srv_wait_ready(srvs[0].url, 1, PATIENCE, NULL);
	put_ok(srvs[0].url, "k", "v");
	t0 = kv_test_now_ms();
	ctl_down();
	while ((st = get_status(srvs[0].url, "k", why, sizeof(why))) == 0) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the server kept serving without the controller");
		kv_test_sleep_ms(10);
	}
	took = kv_test_now_ms() - t0;
	assert_int_equal(st, SHARDKV__STATUS__STATUS_UNAVAILABLE);
	assert_non_null(strstr(why, "lease expired: controller unreachable for"));
	/* Not before a lease has passed since the last renewal (sent at most a
	 * renewal period, plus its round trip, before the controller stopped). */
	assert_true(took + 2 * RENEW >= LEASE);
	/* Writes too. */
	assert_int_equal(do_put(srvs[0].url, "k", "w", 0, 0).status,
	                 SHARDKV__STATUS__STATUS_UNAVAILABLE);

	ctl_up();
	t0 = kv_test_now_ms();
	while ((st = get_status(srvs[0].url, "k", why, sizeof(why))) != 0) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the server never served again: %d %s", st, why);
		kv_test_sleep_ms(20);
	}
	assert_int_equal(node_state(1), KV_NODE_ACTIVE);
}

static void
remove_refuses_live_nodes_and_data_loss_and_forgets_a_down_node_with_the_flag(void **state)
{
	char out[2048], err[2048], why[200];
	uint64_t t0;

	(void)state;
	cluster_up();
	assert_int_equal(cli(out, sizeof(out), err, sizeof(err), "remove", "2", NULL), 4);
	assert_non_null(strstr(err, "node 2 is active: use leave"));

	inproc_srv_down(&srvs[1]);
	wait_state(2, KV_NODE_DOWN);
	assert_int_equal(cli(out, sizeof(out), err, sizeof(err), "remove", "2", NULL), 4);
	assert_non_null(strstr(err, "holds the only copy of 1 range"));
	assert_int_equal(node_state(2), KV_NODE_DOWN);

	assert_int_equal(cli(out, sizeof(out), err, sizeof(err), "remove", "2",
	                     "--accept-data-loss", "--json", NULL),
	                 0);
	assert_non_null(strstr(out, "\"removed\": 2, \"ranges_lost\": 1}"));
	kv_config *cfg = get_config();
	assert_non_null(cfg);
	assert_int_equal(kv_config_node(cfg, 2)->state, KV_NODE_GONE);
	for (size_t i = 0; i < cfg->nranges; i++)
		assert_int_equal(cfg->ranges[i].node, 1);
	kv_config_free(cfg);

	/* The removed server comes back on its data dir: it learns it is gone
	 * and answers no data request. */
	srv_up(1);
	t0 = kv_test_now_ms();
	while (!kv_server_gone(srvs[1].s, why, sizeof(why))) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the removed server never learnt it is gone");
		kv_test_sleep_ms(10);
	}
	assert_non_null(strstr(why, "gone"));
	assert_int_equal(get_status(srvs[1].url, "!", why, sizeof(why)),
	                 SHARDKV__STATUS__STATUS_UNAVAILABLE);
	assert_int_equal(node_state(2), KV_NODE_GONE);
}

static void
locate_and_check_report_the_primary_and_the_problems(void **state)
{
	char out[4096], err[2048];

	(void)state;
	cluster_up();
	assert_int_equal(cli(out, sizeof(out), err, sizeof(err), "check", NULL), 0);
	assert_non_null(strstr(out, "every range has a live primary"));
	const char *k1 = key_on(1), *k2 = key_on(2);
	char key2[16], key1[16];
	snprintf(key1, sizeof(key1), "%s", k1);
	snprintf(key2, sizeof(key2), "%s", k2);
	assert_int_equal(cli(out, sizeof(out), err, sizeof(err), "locate", key2, "--json", NULL),
	                 0);
	assert_non_null(strstr(out, "\"key\": \""));
	assert_non_null(strstr(out, "\"node\": 2, \"address\": \""));
	assert_non_null(strstr(out, srvs[1].url));
	assert_non_null(strstr(out, "\"replicas\": [2]"));
	assert_int_equal(cli(out, sizeof(out), err, sizeof(err), "locate", key1, NULL), 0);
	assert_non_null(strstr(out, "primary: node 1 "));

	inproc_srv_down(&srvs[1]);
	wait_state(2, KV_NODE_DOWN);
	assert_int_equal(cli(out, sizeof(out), err, sizeof(err), "check", NULL), 3);
	assert_non_null(strstr(out, "node 2 ("));
	assert_non_null(strstr(out, ") is down: no heartbeat for"));
	assert_non_null(strstr(out, "has no live primary: node 2 is down"));
	assert_int_equal(cli(out, sizeof(out), err, sizeof(err), "check", "--json", NULL), 3);
	assert_non_null(strstr(out, "\"kind\": \"node_down\", \"node\": 2"));
	assert_non_null(strstr(out, "\"ok\": false"));
	assert_int_equal(cli(out, sizeof(out), err, sizeof(err), "status", "--json", NULL), 0);
	assert_non_null(strstr(out, "\"state\": \"down\""));
	assert_non_null(strstr(out, "\"last_seen_ms\": "));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(
	        stopped_server_is_declared_down_after_the_lease_and_active_again_when_it_returns,
	        setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        fresh_controller_declares_nobody_down_before_a_full_lease_and_margin, setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        server_cut_off_from_the_controller_stops_serving_after_its_lease_until_it_returns,
	        setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        remove_refuses_live_nodes_and_data_loss_and_forgets_a_down_node_with_the_flag,
	        setup, teardown),
	    cmocka_unit_test_setup_teardown(locate_and_check_report_the_primary_and_the_problems,
	                                    setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
