/*
 * test_cluster_tls.c - TLS (--tls-cert, --tls-key, --tls-ca, doc/contract.md §5) with
 * real daemons. A throw-away PKI is made at run time with the openssl CLI
 * (tests/tls_certs.sh): the cluster's CA, the daemons' certificate, a client
 * certificate, and a certificate signed by another CA. A controller and two
 * servers on tls+tcp:// serve the library and the `shardkv` binary holding a
 * valid client certificate (flags or SHARDKV_TLS_* variables), data, scans
 * and admin commands alike, and move a range between the servers over TLS.
 * A client without a certificate, or with one of another CA, is refused
 * (SHARDKV_EAUTH, exit 4, "TLS handshake ... failed"); a plain tcp:// client
 * gets no answer from a TLS port (SHARDKV_EUNAVAIL, exit 3); none of them
 * changes anything. A server whose certificate is of another CA cannot
 * register. Daemons given a TLS setup that cannot work (flags without a
 * tls+tcp:// address or the reverse, a missing or unusable file, a key that
 * is not the certificate's) refuse to start with a line naming the flag or
 * the file.
 *
 * Without openssl every test is skipped with a message.
 */
#include "common/err.h"
#include "common/rpc.h"
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#ifndef KV_CLI_BIN
#error "KV_CLI_BIN must name the shardkv binary"
#endif
#ifndef KV_TLS_CERTS_SH
#error "KV_TLS_CERTS_SH must name tests/tls_certs.sh"
#endif

#define CLIENT_MS  10000u /* library calls; a refusal takes well under a second */
#define REFUSED_MS 3000u  /* calls that get no answer at all (plain tcp) */
#define MOVE_KEYS  300u   /* keys in the range that moves */

static kv_tc tc;
static bool have_openssl; /* false: every test skips */
static char pki[64];      /* the certificates; removed at teardown */

/* Fills buf with pki/NAME. */
static const char *
pki_file(char *buf, size_t len, const char *name)
{
	snprintf(buf, len, "%s/%s", pki, name);
	return buf;
}

static char ca[96], srv_crt[96], srv_key[96], cli_crt[96], cli_key[96];
static char other_ca[96], rogue_crt[96], rogue_key[96];

/* Returns whether an executable `name` is on $PATH. */
static bool
on_path(const char *name)
{
	const char *path = getenv("PATH");
	char dir[512], file[600];

	while (path && *path) {
		size_t n = strcspn(path, ":");
		snprintf(dir, sizeof(dir), "%.*s", (int)n, path);
		snprintf(file, sizeof(file), "%s/%s", dir[0] ? dir : ".", name);
		if (access(file, X_OK) == 0)
			return true;
		path += n + (path[n] == ':');
	}
	return false;
}

static int
setup(void **state)
{
	kv_tc_run_result r;
	char *argv[] = {"/bin/sh", KV_TLS_CERTS_SH, pki, NULL};

	(void)state;
	if (!(have_openssl = on_path("openssl"))) {
		fprintf(stderr, "test_cluster_tls: openssl not found: skipping every test\n");
		return 0;
	}
	snprintf(pki, sizeof(pki), "/tmp/shardkv-pki-XXXXXX");
	if (mkdtemp(pki) == NULL)
		return -1;
	if (kv_tc_run(argv, NULL, NULL, 0, 60000, &r) != 0)
		return -1;
	if (r.code != 0) {
		fprintf(stderr, "tls_certs.sh failed (%d): %s\n", r.code, r.err);
		kv_tc_run_free(&r);
		return -1;
	}
	kv_tc_run_free(&r);
	pki_file(ca, sizeof(ca), "ca.crt");
	pki_file(srv_crt, sizeof(srv_crt), "server.crt");
	pki_file(srv_key, sizeof(srv_key), "server.key");
	pki_file(cli_crt, sizeof(cli_crt), "client.crt");
	pki_file(cli_key, sizeof(cli_key), "client.key");
	pki_file(other_ca, sizeof(other_ca), "otherca.crt");
	pki_file(rogue_crt, sizeof(rogue_crt), "rogue.crt");
	pki_file(rogue_key, sizeof(rogue_key), "rogue.key");
	if (kv_tc_set_tls(srv_crt, srv_key, ca, cli_crt, cli_key) != 0)
		return -1;
	/* The layout stays as the tests make it: they check that refused
	 * requests publish nothing, which a balancer decision would blur. */
	const char *ctl_args[] = {"--auto-balance", "off", NULL};
	if (kv_tc_set_controller_args(ctl_args) != 0)
		return -1;
	return kv_tc_start(&tc, "cluster-tls", 2);
}

static int
teardown(void **state)
{
	(void)state;
	if (!have_openssl)
		return 0;
	kv_tc_destroy(&tc);
	kv_tc_set_tls(NULL, NULL, NULL, NULL, NULL);
	kv_test_rmtree(pki);
	return 0;
}

#define NEED_OPENSSL()                                                                             \
	do {                                                                                       \
		if (!have_openssl) {                                                               \
			print_message("openssl not found: skipped\n");                             \
			skip();                                                                    \
		}                                                                                  \
	} while (0)

/* ---------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------- */

/* A client of `url` with the TLS files given (NULL: not given). */
static int
client_open(const char *url, const char *cert, const char *key, const char *cafile, uint32_t ms,
            shardkv_client **out)
{
	shardkv_options o = {
	    .timeout_ms = ms, .no_watch = true, .tls_cert = cert, .tls_key = key, .tls_ca = cafile};
	return shardkv_open(url, &o, out);
}

/* The controller's URL as a plain tcp:// one (same port). */
static void
plain_url(const char *tls_url, char *buf, size_t len)
{
	assert_true(strncmp(tls_url, "tls+tcp://", 10) == 0);
	size_t n = strlen(tls_url + 4); /* "tcp://..." */
	assert_true(n < len);
	memcpy(buf, tls_url + 4, n + 1);
}

/* Runs `shardkv -c URL ARGS...` (NULL-terminated) with extra environment
 * entries `env` (may be NULL). */
static void
run_cli(kv_tc_run_result *r, char *const env[], const char *url, const char *arg, ...)
{
	va_list ap;

	va_start(ap, arg);
	int rv = kv_tc_cliv(r, url, env, NULL, 0, 60000, arg, ap);
	va_end(ap);
	assert_int_equal(rv, 0);
}

/* Fails unless the CLI run exited with `code` and, when `says` is set, its
 * stderr contains it. Frees r. */
static void
expect_exit(kv_tc_run_result *r, int code, const char *says, const char *what)
{
	if (r->code != code)
		fail_msg("%s: exit %d, want %d (stdout '%s', stderr '%s')", what, r->code, code,
		         r->out, r->err);
	if (says != NULL && strstr(r->err, says) == NULL)
		fail_msg("%s: stderr does not say '%s': '%s'", what, says, r->err);
	kv_tc_run_free(r);
}

/* The latest epoch, asked with a valid certificate. */
static uint64_t
epoch_now(void)
{
	shardkv_config *cfg = kv_tc_config(&tc);
	uint64_t e;

	assert_non_null(cfg);
	e = cfg->epoch;
	shardkv_config_free(cfg);
	return e;
}

/* Fails unless `key` holds `want` (read with a valid certificate). */
static void
expect_key_holds(const char *key, const char *want)
{
	shardkv_client *c = kv_tc_client(&tc, true, CLIENT_MS);
	shardkv_buf v = {0};

	assert_non_null(c);
	KV_TC_EXPECT(&tc, 0, shardkv_get(c, key, strlen(key), &v));
	assert_int_equal(v.len, strlen(want));
	assert_memory_equal(v.data, want, v.len);
	shardkv_free(v.data);
	shardkv_close(c);
}

/* A refused library client: the call fails with `want`, the message says
 * why when it is a TLS refusal, and the put did not happen. */
static void
expect_refused(const char *url, const char *cert, const char *key, const char *cafile, uint32_t ms,
               int want)
{
	shardkv_client *c = NULL;
	int rv;

	/* With replicas a copy and ISR change may still be committing after an
	 * earlier step: wait for them before taking the epoch that must not
	 * change. */
	KV_TC_ASSERT(&tc, kv_tc_wait_in_sync(&tc, KV_TC_READY_MS) == 0, "ranges not in sync");
	uint64_t epoch = epoch_now();
	assert_int_equal(client_open(url, cert, key, cafile, ms, &c), 0);
	rv = shardkv_put(c, "victim", 6, "evil", 4);
	if (rv != want)
		fail_msg("put returned %s (%s), want %s", shardkv_strerror(rv), shardkv_errmsg(),
		         shardkv_strerror(want));
	if (want == SHARDKV_EAUTH && strstr(shardkv_errmsg(), "TLS handshake") == NULL)
		fail_msg("the refusal does not say why: '%s'", shardkv_errmsg());
	shardkv_config *cfg = NULL;
	assert_int_equal(shardkv_config_get(c, 0, &cfg), want);
	shardkv_close(c);
	expect_key_holds("victim", "original");
	assert_int_equal(epoch_now(), epoch);
}

/* ---------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------- */

/* A valid client certificate: data, scans and admin commands work, from the
 * library and from the CLI (flags or environment). */
static void
a_valid_certificate_serves_data_scans_and_admin(void **state)
{
	shardkv_client *c = NULL;
	shardkv_scan_result *sr = NULL;
	shardkv_buf v = {0};
	kv_tc_run_result r;

	(void)state;
	NEED_OPENSSL();
	KV_TC_EXPECT(&tc, 0, client_open(tc.ctl_url, cli_crt, cli_key, ca, CLIENT_MS, &c));
	KV_TC_EXPECT(&tc, 0, shardkv_put(c, "victim", 6, "original", 8));
	KV_TC_EXPECT(&tc, 0, shardkv_put(c, "s/1", 3, "one", 3));
	KV_TC_EXPECT(&tc, 0, shardkv_put(c, "s/2", 3, "two", 3));
	KV_TC_EXPECT(&tc, 0, shardkv_get(c, "s/1", 3, &v));
	assert_int_equal(v.len, 3);
	assert_memory_equal(v.data, "one", 3);
	shardkv_free(v.data);
	KV_TC_EXPECT(&tc, 0, shardkv_scan(c, "s/", 2, "s0", 2, 0, &sr));
	assert_int_equal(sr->n, 2);
	shardkv_scan_result_free(sr);
	shardkv_close(c);

	run_cli(&r, NULL, tc.ctl_url, "--tls-cert", cli_crt, "--tls-key", cli_key, "--tls-ca", ca,
	        "get", "s/2", NULL);
	assert_string_equal(r.out, "two\n");
	expect_exit(&r, 0, NULL, "get with a valid certificate");
	run_cli(&r, NULL, tc.ctl_url, "--tls-cert", cli_crt, "--tls-key", cli_key, "--tls-ca", ca,
	        "scan", "s/", "s0", NULL);
	assert_string_equal(r.out, "s/1\tone\ns/2\ttwo\n");
	expect_exit(&r, 0, NULL, "scan with a valid certificate");

	char e1[128], e2[128], e3[128];
	snprintf(e1, sizeof(e1), "SHARDKV_TLS_CERT=%s", cli_crt);
	snprintf(e2, sizeof(e2), "SHARDKV_TLS_KEY=%s", cli_key);
	snprintf(e3, sizeof(e3), "SHARDKV_TLS_CA=%s", ca);
	char *env[] = {e1, e2, e3, NULL};
	run_cli(&r, env, tc.ctl_url, "put", "s/3", "three", NULL);
	expect_exit(&r, 0, NULL, "put with the certificate from the environment");
	run_cli(&r, env, tc.ctl_url, "--json", "status", NULL);
	if (strstr(r.out, "\"tls+tcp://") == NULL)
		fail_msg("status does not list the TLS addresses: %s", r.out);
	expect_exit(&r, 0, NULL, "status with the certificate from the environment");
}

/* Two servers move a range between them over TLS, each showing its own
 * certificate to the other. */
static void
a_move_between_servers_over_tls_completes(void **state)
{
	shardkv_client *c;
	kv_tc_run_result r;
	char msg[256], node[16];
	shardkv_config *cfg;

	(void)state;
	NEED_OPENSSL();
	c = kv_tc_client(&tc, true, CLIENT_MS);
	assert_non_null(c);
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(c, "mv/", MOVE_KEYS, 1, 100, msg, sizeof(msg)));
	cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	uint32_t from = kv_tc_owner(cfg, "mv/000000", 9);
	shardkv_config_free(cfg);
	int to = tc.srv[0].id == from ? 1 : 0;
	kv_tc_node_arg(&tc, to, node, sizeof(node));

	run_cli(&r, NULL, tc.ctl_url, "--tls-cert", cli_crt, "--tls-key", cli_key, "--tls-ca", ca,
	        "move", "mv/", "mv0", node, "--wait", NULL);
	if (r.code != 0)
		kv_tc_dump_logs(&tc, 40);
	expect_exit(&r, 0, NULL, "move --wait over TLS");
	cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	assert_int_equal(kv_tc_owner(cfg, "mv/000000", 9), tc.srv[to].id);
	assert_int_equal(cfg->nmigrations, 0);
	shardkv_config_free(cfg);
	long bad = kv_tc_verify(c, "mv/", MOVE_KEYS, 1, 100, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "after the move: %ld bad keys (%s)", bad, msg);
	shardkv_close(c);
}

/* A client that shows no certificate is refused by the handshake. */
static void
a_client_without_a_certificate_is_refused(void **state)
{
	kv_tc_run_result r;

	(void)state;
	NEED_OPENSSL();
	expect_refused(tc.ctl_url, NULL, NULL, ca, CLIENT_MS, SHARDKV_EAUTH);
	run_cli(&r, NULL, tc.ctl_url, "--tls-ca", ca, "put", "victim", "evil", NULL);
	expect_exit(&r, 4, "TLS handshake", "put without a client certificate");
	expect_key_holds("victim", "original");
	/* Servers refuse it too, not only the controller. */
	kv_rpc_client *raw = NULL;
	kv_tls *t = NULL;
	kv_tls_files f = {.ca = ca};
	char err[256];
	nng_msg *req, *rep;
	assert_int_equal(kv_tls_create(&f, false, &t, err, sizeof(err)), 0);
	assert_int_equal(kv_rpc_client_create_tls(tc.srv[0].url, t, &raw), 0);
	assert_int_equal(nng_msg_alloc(&req, 0), 0);
	assert_int_equal(kv_rpc_call(raw, req, &rep, CLIENT_MS), KV_EAUTH);
	assert_non_null(strstr(kv_rpc_why(), "TLS handshake"));
	kv_rpc_client_destroy(raw);
	kv_tls_destroy(t);
}

/* A client whose certificate is signed by another CA is refused, whether
 * it trusts the cluster's CA or its own. */
static void
a_client_with_a_certificate_of_another_ca_is_refused(void **state)
{
	kv_tc_run_result r;

	(void)state;
	NEED_OPENSSL();
	expect_refused(tc.ctl_url, rogue_crt, rogue_key, ca, CLIENT_MS, SHARDKV_EAUTH);
	expect_refused(tc.ctl_url, rogue_crt, rogue_key, other_ca, CLIENT_MS, SHARDKV_EAUTH);
	run_cli(&r, NULL, tc.ctl_url, "--tls-cert", rogue_crt, "--tls-key", rogue_key, "--tls-ca",
	        ca, "put", "victim", "evil", NULL);
	expect_exit(&r, 4, "TLS handshake", "put with a certificate of another CA");
	expect_key_holds("victim", "original");
}

/* A plain tcp:// client gets no answer from a TLS port; a TLS client is
 * refused a plain address at once. */
static void
a_plain_tcp_client_cannot_talk_to_the_tls_port(void **state)
{
	char plain[80], srv_plain[80];
	kv_tc_run_result r;

	(void)state;
	NEED_OPENSSL();
	plain_url(tc.ctl_url, plain, sizeof(plain));
	plain_url(tc.srv[0].url, srv_plain, sizeof(srv_plain));
	expect_refused(plain, NULL, NULL, NULL, REFUSED_MS, SHARDKV_EUNAVAIL);
	run_cli(&r, NULL, plain, "--timeout", "2000", "put", "victim", "evil", NULL);
	expect_exit(&r, 3, NULL, "put over plain tcp to a TLS port");
	/* Straight to a server, too. */
	kv_tc_raw_result rr = {0};
	assert_int_not_equal(
	    kv_tc_raw_op(srv_plain, 0, 0, KV_TC_RAW_PUT, "victim", 6, "evil", 4, REFUSED_MS, &rr),
	    0);
	kv_tc_raw_free(&rr);
	expect_key_holds("victim", "original");
	/* TLS files with a plain address are a usage error. */
	run_cli(&r, NULL, plain, "--tls-ca", ca, "get", "victim", NULL);
	expect_exit(&r, 2, "not a tls+tcp:// address", "TLS files with a tcp:// address");
	run_cli(&r, NULL, tc.ctl_url, "get", "victim", NULL);
	expect_exit(&r, 2, "--tls-ca", "a tls+tcp:// address without TLS files");
}

/* A tls+tcp:// controller address where nothing listens is reported as
 * refused within about a second, like a tcp:// one, not at the deadline. */
static void
a_refused_tls_controller_address_is_reported_at_once(void **state)
{
	char url[80];
	kv_tc_run_result r;

	(void)state;
	NEED_OPENSSL();
	snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", kv_test_free_port());
	uint64_t t0 = kv_test_now_ms();
	run_cli(&r, NULL, url, "--tls-cert", cli_crt, "--tls-key", cli_key, "--tls-ca", ca, "get",
	        "victim", NULL);
	uint64_t took = kv_test_now_ms() - t0;
	if (took >= 4000) /* the deadline is 5000 */
		fail_msg("a refused TLS address took %llu ms to report", (unsigned long long)took);
	expect_exit(&r, 3, url, "get from a refused tls+tcp:// address");
}

/* A server whose certificate is of another CA cannot register. */
static void
a_server_with_a_certificate_of_another_ca_cannot_join(void **state)
{
	const char *args[] = {"--tls-cert", rogue_crt, "--tls-key", rogue_key, NULL};
	uint64_t epoch;
	int saved = tc.nargs, i;
	shardkv_config *cfg;

	(void)state;
	NEED_OPENSSL();
	epoch = epoch_now();
	tc.nargs = 0;
	for (int k = 0; args[k]; k++)
		snprintf(tc.args[tc.nargs++], KV_TC_ARG_LEN, "%s", args[k]);
	i = kv_tc_add_server(&tc, true);
	tc.nargs = saved;
	assert_true(i >= 0);
	KV_TC_ASSERT(&tc, kv_tc_wait_log_line(tc.srv[i].log, "TLS handshake", KV_TC_READY_MS),
	             "the server did not log the refused handshake");
	cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	for (size_t k = 0; k < cfg->nnodes; k++)
		assert_string_not_equal(cfg->nodes[k].address, tc.srv[i].url);
	assert_int_equal(cfg->epoch, epoch);
	shardkv_config_free(cfg);
	assert_int_equal(kv_tc_stop_server(&tc, i, SIGKILL, KV_TC_STOP_MS, NULL), 0);
}

/* Runs a daemon that must refuse to start: exit `code`, stderr with `says`. */
static void
expect_no_start(char **argv, int code, const char *says)
{
	kv_tc_run_result r;

	assert_int_equal(kv_tc_run(argv, NULL, NULL, 0, 20000, &r), 0);
	if (r.code != code || strstr(r.err, says) == NULL)
		fail_msg("%s %s %s...: exit %d, want %d with '%s' (stderr '%s')", argv[0], argv[1],
		         argv[2], r.code, code, says, r.err);
	kv_tc_run_free(&r);
}

/* Daemons refuse a TLS setup that cannot work, naming the flag or file. */
static void
daemons_refuse_to_start_with_an_unusable_tls_setup(void **state)
{
	char url[64], tls_url[80], dir[300], junk[96], missing[96];
	FILE *f;

	(void)state;
	NEED_OPENSSL();
	kv_test_free_url(url, sizeof(url));
	snprintf(tls_url, sizeof(tls_url), "tls+%s", url);
	snprintf(dir, sizeof(dir), "%s/nostart", tc.dir);
	pki_file(junk, sizeof(junk), "junk.pem");
	pki_file(missing, sizeof(missing), "missing.pem");
	assert_non_null(f = fopen(junk, "w"));
	fputs("this is not a certificate\n", f);
	fclose(f);
	char *C = KV_CONTROLLER_BIN, *S = KV_SERVER_BIN;

	/* Usage errors (2): flags and URLs that do not go together. */
	char *a1[] = {C,       "--listen",  url,     "--data-dir", dir, "--tls-cert",
	              srv_crt, "--tls-key", srv_key, "--tls-ca",   ca,  NULL};
	expect_no_start(a1, 2, "not a tls+tcp:// address");
	char *a2[] = {C, "--listen", tls_url, "--data-dir", dir, NULL};
	expect_no_start(a2, 2, "--tls-ca");
	char *a3[] = {C,       "--listen", tls_url, "--data-dir", dir, "--tls-cert",
	              srv_crt, "--tls-ca", ca,      NULL};
	expect_no_start(a3, 2, "--tls-cert and --tls-key go together");
	char *a4[] = {S,   "--listen",   tls_url, "--controller", url,     "--data-dir",
	              dir, "--tls-cert", srv_crt, "--tls-key",    srv_key, "--tls-ca",
	              ca,  NULL};
	expect_no_start(a4, 2, "--controller");
	/* Cannot start (1): files that cannot be read or used, named. */
	char *a5[] = {C,       "--listen",  tls_url, "--data-dir", dir, "--tls-cert",
	              missing, "--tls-key", srv_key, "--tls-ca",   ca,  NULL};
	expect_no_start(a5, 1, missing);
	char *a6[] = {C,       "--listen",  tls_url, "--data-dir", dir,  "--tls-cert",
	              srv_crt, "--tls-key", srv_key, "--tls-ca",   junk, NULL};
	expect_no_start(a6, 1, junk);
	char *a7[] = {C,       "--listen",  tls_url, "--data-dir", dir,     "--tls-cert",
	              srv_crt, "--tls-key", srv_key, "--tls-ca",   srv_key, NULL};
	expect_no_start(a7, 1, "--tls-ca");
	char *a8[] = {S,   "--listen",   tls_url, "--controller", tls_url, "--data-dir",
	              dir, "--tls-cert", srv_crt, "--tls-key",    junk,    "--tls-ca",
	              ca,  NULL};
	expect_no_start(a8, 1, junk);
	char *a9[] = {C,       "--listen",  tls_url, "--data-dir", dir, "--tls-cert",
	              srv_crt, "--tls-key", cli_key, "--tls-ca",   ca,  NULL};
	expect_no_start(a9, 1, "is not the key of --tls-cert");
	char *a10[] = {C,       "--listen",  tls_url, "--data-dir", dir, "--tls-cert",
	               srv_key, "--tls-key", srv_key, "--tls-ca",   ca,  NULL};
	expect_no_start(a10, 1, "is not a valid certificate");
	/* The CLI checks its files the same way: a usage error, nothing sent. */
	kv_tc_run_result r;
	run_cli(&r, NULL, tc.ctl_url, "--tls-cert", cli_crt, "--tls-key", srv_key, "--tls-ca", ca,
	        "get", "victim", NULL);
	expect_exit(&r, 2, "is not the key of --tls-cert", "a client key of another certificate");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(a_valid_certificate_serves_data_scans_and_admin),
	    cmocka_unit_test(a_move_between_servers_over_tls_completes),
	    cmocka_unit_test(a_client_without_a_certificate_is_refused),
	    cmocka_unit_test(a_client_with_a_certificate_of_another_ca_is_refused),
	    cmocka_unit_test(a_plain_tcp_client_cannot_talk_to_the_tls_port),
	    cmocka_unit_test(a_refused_tls_controller_address_is_reported_at_once),
	    cmocka_unit_test(a_server_with_a_certificate_of_another_ca_cannot_join),
	    cmocka_unit_test(daemons_refuse_to_start_with_an_unusable_tls_setup),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
