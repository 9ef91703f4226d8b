/*
 * inproc_cluster.c - a real controller and real shard servers in the test
 * process (see inproc_cluster.h).
 */
#include "tests/support/inproc_cluster.h"
#include "tests/support/http_client.h"

#include "common/err.h"
#include "tests/support/cli_run.h"
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

#define CLI_MAX_ARGS 12

/* v, or d when v is 0 (an option left out). */
static unsigned
or_default(unsigned v, unsigned d)
{
	return v != 0 ? v : d;
}

void
inproc_cluster_start(inproc_cluster *c, const inproc_cluster_opts *o)
{
	inproc_cluster_opts d = *o; /* o may be &c->o */

	memset(c, 0, sizeof(*c));
	c->o = d;
	if (c->o.name == NULL)
		c->o.name = "kvcluster";
	if (c->o.nsrv == 0)
		c->o.nsrv = INPROC_CLUSTER_NSRV;
	c->o.contexts = or_default(c->o.contexts, INPROC_CLUSTER_CONTEXTS);
	c->o.lease_ms = or_default(c->o.lease_ms, INPROC_CLUSTER_LEASE_MS);
	c->o.lease_margin_ms = or_default(c->o.lease_margin_ms, INPROC_CLUSTER_MARGIN_MS);
	c->o.lease_renew_ms = or_default(c->o.lease_renew_ms, INPROC_CLUSTER_RENEW_MS);
	c->o.patience_ms = or_default(c->o.patience_ms, INPROC_CLUSTER_PATIENCE_MS);
	assert_true(c->o.nsrv >= 1 && c->o.nsrv <= INPROC_CLUSTER_MAX);
	snprintf(c->tmpdir, sizeof(c->tmpdir), "/tmp/%s.XXXXXX", c->o.name);
	assert_non_null(mkdtemp(c->tmpdir));
	kv_test_free_url(c->ctl_url, sizeof(c->ctl_url));
	do /* a port of its own, not the one ctl_url names */
		snprintf(c->ctl_metrics, sizeof(c->ctl_metrics), "127.0.0.1:%d",
		         kv_test_free_port());
	while (strstr(c->ctl_url, strchr(c->ctl_metrics, ':')) != NULL);
	snprintf(c->ctl_dir, sizeof(c->ctl_dir), "%s/ctl", c->tmpdir);
	inproc_cluster_ctl_up(c);
	for (int i = 0; i < c->o.nsrv; i++)
		inproc_srv_init(&c->srv[i], c->tmpdir, i, c->ctl_url, c->o.contexts);
}

int
inproc_cluster_setup(void **state)
{
	inproc_cluster *c = *state;

	inproc_cluster_start(c, &c->o);
	return 0;
}

int
inproc_cluster_teardown(void **state)
{
	inproc_cluster_stop(*state);
	return 0;
}

void
inproc_cluster_stop(inproc_cluster *c)
{
	clients_close();
	for (int i = 0; i < c->o.nsrv; i++) {
		kv_server_destroy(c->srv[i].s);
		c->srv[i].s = NULL;
	}
	inproc_cluster_ctl_down(c);
	if (c->tmpdir[0] != '\0')
		kv_test_rmtree(c->tmpdir);
	c->tmpdir[0] = '\0';
}

void
inproc_cluster_ctl_up(inproc_cluster *c)
{
	char err[256];

	c->ccfg = (kv_controller_cfg){.listen = c->ctl_url,
	                              .data_dir = c->ctl_dir,
	                              .metrics = c->ctl_metrics,
	                              .lease_ms = c->o.lease_ms,
	                              .lease_margin_ms = c->o.lease_margin_ms,
	                              .replicas = c->o.replicas,
	                              .down_after_s = c->o.down_after_s,
	                              .min_insync = c->o.min_insync,
	                              .auto_balance = c->o.auto_balance,
	                              .split_bytes = c->o.split_bytes,
	                              .max_migrations = c->o.max_migrations,
	                              .balance_cut_replicated = c->o.cut_replicated,
	                              .handover_unordered = c->o.handover_unordered};
	if (kv_controller_create(&c->ccfg, &c->ctl, err, sizeof(err)) != KV_OK)
		fail_msg("controller create: %s", err);
	if (kv_controller_start(c->ctl, err, sizeof(err)) != KV_OK)
		fail_msg("controller start: %s", err);
}

void
inproc_cluster_ctl_down(inproc_cluster *c)
{
	kv_controller_destroy(c->ctl);
	c->ctl = NULL;
}

void
inproc_cluster_srv_up(inproc_cluster *c, int i)
{
	assert_true(i >= 0 && i < c->o.nsrv);
	c->srv[i].cfg.lease_ms = c->o.lease_ms;
	c->srv[i].cfg.lease_renew_ms = c->o.lease_renew_ms;
	c->srv[i].cfg.no_expand = c->o.no_expand;
	inproc_srv_up(&c->srv[i]);
}

int
inproc_cluster_admin(inproc_cluster *c, const kv_admin_req *q, kv_config **cfg, uint64_t *epoch,
                     char *why, size_t whylen)
{
	kv_rpc_client *cli = client_for(c->ctl_url);
	nng_msg *m = NULL, *reply = NULL;
	kv_admin_resp r;
	int rv = -1;

	if (why)
		why[0] = '\0';
	if (cfg)
		*cfg = NULL;
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

kv_config *
inproc_cluster_config(inproc_cluster *c)
{
	kv_admin_req q = {.op = KV_ADM_GET_CONFIG, .request_id = 1};
	uint64_t t0 = kv_test_now_ms();
	kv_config *cfg = NULL;

	for (;;) {
		if (inproc_cluster_admin(c, &q, &cfg, NULL, NULL, 0) == KV_OK)
			return cfg;
		kv_config_free(cfg);
		cfg = NULL;
		/* A running controller that did not answer in time was starved
		 * of the cores (seen for over 2 s under ThreadSanitizer with
		 * other tests running): ask again. A stopped one answers
		 * nothing. */
		if (c->ctl == NULL || kv_test_now_ms() - t0 > c->o.patience_ms)
			return NULL;
		kv_test_sleep_ms(20);
	}
}

void
inproc_cluster_scrape_metrics(inproc_cluster *c, char *buf, size_t cap)
{
	kv_http_answer a;

	assert_true(cap > 0);
	a = kv_http_get(atoi(strchr(c->ctl_metrics, ':') + 1), "/metrics");
	if (a.status != 200) {
		int st = a.status;
		kv_http_answer_free(&a);
		fail_msg("scrape of %s answered %d", c->ctl_metrics, st);
	}
	snprintf(buf, cap, "%s", a.raw);
	kv_http_answer_free(&a);
}

int
inproc_cluster_node_state(inproc_cluster *c, uint32_t id)
{
	kv_config *cfg = inproc_cluster_config(c);
	const kv_node *n = cfg ? kv_config_node(cfg, id) : NULL;
	int st = n ? (int)n->state : 0;

	kv_config_free(cfg);
	return st;
}

uint64_t
inproc_cluster_wait_node_state(inproc_cluster *c, uint32_t id, kv_node_state st)
{
	uint64_t t0 = kv_test_now_ms();

	while (inproc_cluster_node_state(c, id) != (int)st) {
		if (kv_test_now_ms() - t0 > c->o.patience_ms)
			fail_msg("node %u never became %s", id, kv_node_state_name(st));
		kv_test_sleep_ms(10);
	}
	return kv_test_now_ms() - t0;
}

int
inproc_cluster_cli(inproc_cluster *c, char *out, size_t outlen, char *err, size_t errlen, ...)
{
	const char *argv[3 + CLI_MAX_ARGS + 1] = {"shardkv", "-c", c->ctl_url};
	int argc = 3;
	kv_cli_run_result r;
	va_list ap;
	const char *a;

	va_start(ap, errlen);
	while ((a = va_arg(ap, const char *)) != NULL) {
		if (argc == 3 + CLI_MAX_ARGS) {
			va_end(ap);
			fail_msg("more than %d CLI arguments", CLI_MAX_ARGS);
		}
		argv[argc++] = a;
	}
	va_end(ap);
	if (kv_cli_run(argc, argv, &r) != 0)
		fail_msg("cannot capture the CLI's output");
	snprintf(out, outlen, "%s", r.out ? r.out : "");
	snprintf(err, errlen, "%s", r.err ? r.err : "");
	int rc = r.rc;
	kv_cli_run_free(&r);
	return rc;
}
