/*
 * test_failover_inproc.c - replica placement and failover with a real
 * controller (--replicas 2, short leases through its create options) and
 * real shard servers inside the test process (doc/replication.md): the
 * first server holds the key space alone, the second becomes a replica
 * outside the ISR; the primary's IsrChange adds it (and a stale one is
 * refused); a stopped primary's range gets the in-sync replica as its new
 * primary in the configuration that declares it down, with that epoch as
 * its leader epoch, and the old primary stays a replica outside the ISR when
 * it returns; a range without another in-sync member keeps its primary
 * (unavailable; check reports it). status --json shows replicas, insync and
 * leader_epoch; the metrics count failovers and ISR changes.
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
srv_up(int i)
{
	srvs[i].cfg.lease_ms = LEASE;
	srvs[i].cfg.lease_renew_ms = RENEW;
	inproc_srv_up(&srvs[i]);
}

static int
setup(void **state)
{
	char err[256];

	(void)state;
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvfail.XXXXXX");
	assert_non_null(mkdtemp(tmpdir));
	kv_test_free_url(ctl_url, sizeof(ctl_url));
	do /* a port of its own, not the one ctl_url names */
		snprintf(ctl_metrics, sizeof(ctl_metrics), "127.0.0.1:%d", kv_test_free_port());
	while (strstr(ctl_url, strchr(ctl_metrics, ':')) != NULL);
	snprintf(ctl_dir, sizeof(ctl_dir), "%s/ctl", tmpdir);
	ccfg = (kv_controller_cfg){.listen = ctl_url,
	                           .data_dir = ctl_dir,
	                           .metrics = ctl_metrics,
	                           .lease_ms = LEASE,
	                           .lease_margin_ms = MARGIN,
	                           .replicas = 2};
	if (kv_controller_create(&ccfg, &ctl, err, sizeof(err)) != KV_OK)
		fail_msg("controller create: %s", err);
	if (kv_controller_start(ctl, err, sizeof(err)) != KV_OK)
		fail_msg("controller start: %s", err);
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
	kv_controller_destroy(ctl);
	ctl = NULL;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "cannot remove %s\n", tmpdir);
	return 0;
}

/* Sends q to the controller; returns the answer's error code (the
 * configuration it carries into *cfg when cfg is not NULL), or -1 when it
 * does not answer. why gets the error message. */
static int
admin(const kv_admin_req *q, kv_config **cfg, uint64_t *epoch, char *why, size_t whylen)
{
	kv_rpc_client *cli = client_for(ctl_url);
	nng_msg *m = NULL, *reply = NULL;
	kv_admin_resp r;
	int rv = -1;

	if (why)
		why[0] = '\0';
	assert_int_equal(kv_admin_req_encode(q, &m), KV_OK);
	if (kv_rpc_call(cli, m, &reply, 2000) != KV_OK)
		return -1;
	if (kv_admin_resp_decode(nng_msg_body(reply), nng_msg_len(reply), &r) == KV_OK) {
		rv = r.err;
		if (epoch)
			*epoch = r.epoch;
		if (why)
			snprintf(why, whylen, "%s", r.error ? r.error : "");
		if (cfg)
			*cfg = r.err == KV_OK ? kv_admin_resp_take_config(&r) : NULL;
		kv_admin_resp_fini(&r);
	}
	nng_msg_free(reply);
	return rv;
}

static kv_config *
get_config(void)
{
	kv_admin_req q = {.op = KV_ADM_GET_CONFIG, .request_id = 1};
	kv_config *cfg = NULL;

	return admin(&q, &cfg, NULL, NULL, 0) == KV_OK ? cfg : NULL;
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

static int
node_state(uint32_t id)
{
	kv_config *cfg = get_config();
	const kv_node *n = cfg ? kv_config_node(cfg, id) : NULL;
	int st = n ? (int)n->state : 0;

	kv_config_free(cfg);
	return st;
}

static void
wait_state(uint32_t id, kv_node_state st)
{
	uint64_t t0 = kv_test_now_ms();

	while (node_state(id) != (int)st) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("node %u never became %s", id, kv_node_state_name(st));
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

/* Starts both servers and waits until the one range has replicas {1, 2}
 * with ISR {1}; returns that configuration. */
static kv_config *
replicated_up(void)
{
	uint64_t t0;
	kv_config *cfg = NULL;

	srv_up(0);
	srv_wait_ready(srvs[0].url, 1, PATIENCE, NULL);
	srv_up(1);
	t0 = kv_test_now_ms();
	for (;;) {
		cfg = get_config();
		if (cfg && cfg->nnodes == NSRV && cfg->nranges == 1 &&
		    kv_range_nreplicas(&cfg->ranges[0]) == 2)
			break;
		kv_config_free(cfg);
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the second server never became a replica");
		kv_test_sleep_ms(20);
	}
	assert_int_equal(cfg->ranges[0].node, 1);
	assert_int_equal(kv_range_replica(&cfg->ranges[0], 1), 2);
	assert_int_equal(kv_range_ninsync(&cfg->ranges[0]), 1); /* not in sync yet */
	assert_int_equal(cfg->nmigs, 0);
	assert_int_equal(cfg->min_insync, 2); /* the default with two replicas */
	for (size_t i = 0; i < cfg->nnodes; i++)
		assert_int_equal(cfg->nodes[i].state, KV_NODE_ACTIVE);
	return cfg;
}

static void
a_stopped_primary_fails_over_to_the_in_sync_replica(void **state)
{
	char out[8192], err[2048], why[300];
	kv_config *cfg, *now = NULL;
	uint64_t epoch = 0, le, t0, took;

	(void)state;
	cfg = replicated_up();
	le = cfg->ranges[0].leader_epoch;

	/* The primary's request at a stale leader epoch is refused... */
	kv_admin_req q = {.op = KV_ADM_ISR_CHANGE,
	                  .request_id = 7,
	                  .node_id = 1,
	                  .leader_epoch = le + 1,
	                  .add_node = 2};
	assert_int_equal(admin(&q, NULL, NULL, why, sizeof(why)), KV_ESTALE);
	assert_non_null(strstr(why, "leader epoch"));
	/* ...so is another node's... */
	q.node_id = 2;
	q.leader_epoch = le;
	assert_int_equal(admin(&q, NULL, NULL, why, sizeof(why)), KV_ESTALE);
	assert_non_null(strstr(why, "not the primary"));
	/* ...and the primary's at its leader epoch commits one configuration. */
	q.node_id = 1;
	assert_int_equal(admin(&q, NULL, &epoch, why, sizeof(why)), KV_OK);
	assert_int_equal(epoch, cfg->epoch + 1);
	now = get_config();
	assert_non_null(now);
	assert_int_equal(kv_range_ninsync(&now->ranges[0]), 2);
	assert_int_equal(now->ranges[0].leader_epoch, le);
	kv_config_free(now);
	kv_config_free(cfg);
	assert_int_equal(cli(out, sizeof(out), err, sizeof(err), "status", "--json", NULL), 0);
	assert_non_null(strstr(out, "\"node\": 1, \"replicas\": [1, 2], \"insync\": [1, 2]"));

	/* The primary stops: the configuration that declares it down makes
	 * the in-sync replica the primary. */
	t0 = kv_test_now_ms();
	inproc_srv_down(&srvs[0]);
	wait_state(1, KV_NODE_DOWN);
	took = kv_test_now_ms() - t0;
	assert_true(took + RENEW >= DOWN_MS); /* never before the lease and margin */
	now = get_config();
	assert_non_null(now);
	assert_int_equal(now->nranges, 1);
	assert_int_equal(now->ranges[0].node, 2);
	/* The same configuration: the leader epoch is the epoch that said down. */
	assert_int_equal(now->ranges[0].leader_epoch, now->epoch);
	assert_int_equal(kv_range_ninsync(&now->ranges[0]), 1);
	assert_true(kv_range_has_replica(&now->ranges[0], 1, false));
	assert_false(kv_range_has_replica(&now->ranges[0], 1, true));
	le = now->ranges[0].leader_epoch;
	kv_config_free(now);
	char ptn[128];
	snprintf(ptn, sizeof(ptn),
	         "\"node\": 2, \"replicas\": [2, 1], \"insync\": [2], \"leader_epoch\": %llu",
	         (unsigned long long)le);
	assert_int_equal(cli(out, sizeof(out), err, sizeof(err), "status", "--json", NULL), 0);
	assert_non_null(strstr(out, ptn));
	char m[16384];
	scrape(m, sizeof(m));
	assert_non_null(strstr(m, "\nshardkv_controller_failovers_total 1\n"));
	assert_non_null(strstr(m, "\nshardkv_controller_isr_shrinks_total 1\n"));
	assert_non_null(strstr(m, "\nshardkv_controller_isr_expands_total 1\n"));

	/* The old primary comes back: active, a replica, outside the ISR. */
	srv_up(0);
	wait_state(1, KV_NODE_ACTIVE);
	now = get_config();
	assert_non_null(now);
	assert_int_equal(now->ranges[0].node, 2);
	assert_int_equal(now->ranges[0].leader_epoch, le);
	assert_true(kv_range_has_replica(&now->ranges[0], 1, false));
	assert_false(kv_range_has_replica(&now->ranges[0], 1, true));
	kv_config_free(now);
}

static void
a_primary_without_another_in_sync_member_keeps_its_range(void **state)
{
	char out[8192], err[2048];
	kv_config *cfg, *now;

	(void)state;
	cfg = replicated_up(); /* ISR {1}: node 2 never caught up */
	inproc_srv_down(&srvs[0]);
	wait_state(1, KV_NODE_DOWN);
	now = get_config();
	assert_non_null(now);
	assert_int_equal(now->ranges[0].node, 1);
	assert_int_equal(now->ranges[0].leader_epoch, cfg->ranges[0].leader_epoch);
	kv_config_free(now);
	kv_config_free(cfg);
	assert_int_equal(cli(out, sizeof(out), err, sizeof(err), "check", NULL), 3);
	assert_non_null(strstr(out, "has no live primary: node 1 is down"));
	char m[16384];
	scrape(m, sizeof(m));
	assert_non_null(strstr(m, "\nshardkv_controller_failovers_total 0\n"));
	/* remove refuses to lose the range's acknowledged writes. */
	assert_int_equal(cli(out, sizeof(out), err, sizeof(err), "remove", "1", NULL), 4);
	assert_non_null(strstr(err, "holds the only copy of 1 range"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(a_stopped_primary_fails_over_to_the_in_sync_replica,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        a_primary_without_another_in_sync_member_keeps_its_range, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
