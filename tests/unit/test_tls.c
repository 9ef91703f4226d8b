/*
 * test_tls.c - TLS files and sockets (common/tls.h) without daemons: which
 * URLs are TLS ones, which flag combinations and URLs go together, the
 * reasons for files that cannot be used (missing, a directory, empty, not
 * PEM, too big, a key that is not the certificate's), and request/reply over
 * tls+tcp:// in one process: a client with a certificate of the CA is
 * served, one without a certificate is refused with KV_EAUTH and a reason
 * well before its deadline, one trusting another CA refuses the server.
 * The last group needs a PKI from tests/tls_certs.sh (openssl) and is
 * skipped without openssl.
 */
#include "common/err.h"
#include "common/rpc.h"
#include "common/tls.h"
#include "tests/support/testutil.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#ifndef KV_TLS_CERTS_SH
#error "KV_TLS_CERTS_SH must name tests/tls_certs.sh"
#endif

/* The PKI of the socket tests, made once by group_setup; "" without openssl. */
static char pki[64];

/* Fills buf with pki/name. */
static const char *
pem(char *buf, size_t len, const char *name)
{
	snprintf(buf, len, "%s/%s", pki, name);
	return buf;
}

static int
group_setup(void **state)
{
	char cmd[256];

	(void)state;
	if (system("command -v openssl >/dev/null 2>&1") != 0) {
		fprintf(stderr, "test_tls: openssl not found: the socket tests are skipped\n");
		return 0;
	}
	snprintf(pki, sizeof(pki), "/tmp/kv_test_pki_XXXXXX");
	if (mkdtemp(pki) == NULL)
		return -1;
	snprintf(cmd, sizeof(cmd), "/bin/sh '%s' '%s'", KV_TLS_CERTS_SH, pki);
	return system(cmd) == 0 ? 0 : -1;
}

static int
group_teardown(void **state)
{
	(void)state;
	if (pki[0] == 0)
		return 0;
	kv_test_rmtree(pki);
	return 0;
}

#define NEED_PKI()                                                                                 \
	do {                                                                                       \
		if (pki[0] == 0) {                                                                 \
			print_message("openssl not found: skipped\n");                             \
			skip();                                                                    \
		}                                                                                  \
	} while (0)

/* Writes n bytes to DIR/name and returns the path (static). */
static const char *
put_file(void **state, const char *name, const void *p, size_t n)
{
	const char *path = kv_test_put_file(*state, name, p, n, 0600);
	assert_non_null(path);
	return path;
}

/* kv_tls_create of a CA file alone; returns the code, err the reason. */
static int
load_ca(const char *path, char *err, size_t len)
{
	kv_tls_files f = {.ca = path};
	kv_tls *t = NULL;
	int rv;

	err[0] = 0;
	rv = kv_tls_create(&f, false, &t, err, len);
	kv_tls_destroy(t);
	return rv;
}

/* ---------------------------------------------------------------------------
 * Rules
 * ------------------------------------------------------------------------- */

static void
only_tls_tcp_schemes_are_tls_urls(void **state)
{
	(void)state;
	assert_true(kv_tls_url("tls+tcp://127.0.0.1:7000"));
	assert_true(kv_tls_url("tls+tcp4://127.0.0.1:7000"));
	assert_true(kv_tls_url("tls+tcp6://[::1]:7000"));
	assert_false(kv_tls_url("tcp://127.0.0.1:7000"));
	assert_false(kv_tls_url("tls+tcp:/x"));
	assert_false(kv_tls_url("tls+tcp5://x:1"));
	assert_false(kv_tls_url("ipc:///tmp/x"));
	assert_false(kv_tls_url(""));
	assert_false(kv_tls_url(NULL));
}

static void
tls_files_and_urls_must_agree(void **state)
{
	char err[256];

	(void)state;
	assert_int_equal(
	    kv_tls_check_url(true, "--listen", "tls+tcp://127.0.0.1:1", err, sizeof(err)), KV_OK);
	assert_int_equal(kv_tls_check_url(false, "--listen", "tcp://127.0.0.1:1", err, sizeof(err)),
	                 KV_OK);
	assert_int_equal(
	    kv_tls_check_url(true, "--controller", "tcp://127.0.0.1:1", err, sizeof(err)),
	    KV_EINVAL);
	assert_non_null(strstr(err, "--controller tcp://127.0.0.1:1 is not a tls+tcp://"));
	assert_int_equal(
	    kv_tls_check_url(false, "--listen", "tls+tcp://127.0.0.1:1", err, sizeof(err)),
	    KV_EINVAL);
	assert_non_null(strstr(err, "give --tls-ca"));
	assert_int_equal(kv_tls_check_url(true, "--listen", NULL, err, sizeof(err)), KV_EINVAL);
}

static void
the_ca_is_required_and_cert_and_key_go_together(void **state)
{
	char err[256];
	kv_tls_files f;

	(void)state;
	f = (kv_tls_files){.cert = "c", .key = "k"};
	assert_int_equal(kv_tls_check_files(&f, false, err, sizeof(err)), KV_EINVAL);
	assert_non_null(strstr(err, "--tls-ca"));
	f = (kv_tls_files){.cert = "c", .ca = "a"};
	assert_int_equal(kv_tls_check_files(&f, false, err, sizeof(err)), KV_EINVAL);
	assert_non_null(strstr(err, "go together"));
	f = (kv_tls_files){.key = "k", .ca = "a"};
	assert_int_equal(kv_tls_check_files(&f, false, err, sizeof(err)), KV_EINVAL);
	f = (kv_tls_files){.ca = "a"};
	assert_int_equal(kv_tls_check_files(&f, false, err, sizeof(err)), KV_OK);
	assert_int_equal(kv_tls_check_files(&f, true, err, sizeof(err)), KV_EINVAL);
	assert_non_null(strstr(err, "--tls-cert and --tls-key"));
	f = (kv_tls_files){.cert = "c", .key = "k", .ca = "a"};
	assert_int_equal(kv_tls_check_files(&f, true, err, sizeof(err)), KV_OK);
	assert_false(kv_tls_files_any(&(kv_tls_files){0}));
	assert_false(kv_tls_files_any(NULL));
}

/* ---------------------------------------------------------------------------
 * Files
 * ------------------------------------------------------------------------- */

static void
unusable_files_are_refused_with_their_name(void **state)
{
	const kv_test_dir *d = *state;
	char err[512], path[320];
	char *big;

	snprintf(path, sizeof(path), "%s/missing.pem", d->path);
	assert_int_equal(load_ca(path, err, sizeof(err)), KV_ENOTFOUND);
	assert_non_null(strstr(err, "cannot read --tls-ca"));
	assert_non_null(strstr(err, path));

	assert_int_equal(load_ca(d->path, err, sizeof(err)), KV_EINVAL);
	assert_non_null(strstr(err, "is a directory"));

	const char *p = put_file(state, "empty.pem", "", 0);
	assert_int_equal(load_ca(p, err, sizeof(err)), KV_EINVAL);
	assert_non_null(strstr(err, "is not a PEM file"));
	assert_non_null(strstr(err, p));

	p = put_file(state, "text.pem", "hello\n", 6);
	assert_int_equal(load_ca(p, err, sizeof(err)), KV_EINVAL);
	assert_non_null(strstr(err, "is not a PEM file"));

	/* A NUL inside would cut the PEM short: refused. */
	p = put_file(state, "nul.pem", "-----BEGIN CERTIFICATE-----\n\0x", 31);
	assert_int_equal(load_ca(p, err, sizeof(err)), KV_EINVAL);

	static const char fake[] = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
	p = put_file(state, "fake.pem", fake, strlen(fake));
	assert_int_equal(load_ca(p, err, sizeof(err)), KV_EINVAL);
	assert_non_null(strstr(err, "--tls-ca"));
	assert_non_null(strstr(err, "no valid certificate"));

	assert_non_null(big = malloc(KV_TLS_MAX_FILE + 1));
	memset(big, 'A', KV_TLS_MAX_FILE + 1);
	memcpy(big, "-----BEGIN ", 11);
	p = put_file(state, "big.pem", big, KV_TLS_MAX_FILE + 1);
	free(big);
	assert_int_equal(load_ca(p, err, sizeof(err)), KV_ETOOBIG);
	assert_non_null(strstr(err, "larger than"));
}

static void
a_key_that_is_not_the_certificates_is_refused(void **state)
{
	char ca[96], crt[96], key[96], other[96], err[512];
	kv_tls *t = NULL;
	kv_tls_files f;

	(void)state;
	NEED_PKI();
	f = (kv_tls_files){.cert = pem(crt, sizeof(crt), "server.crt"),
	                   .key = pem(other, sizeof(other), "client.key"),
	                   .ca = pem(ca, sizeof(ca), "ca.crt")};
	assert_int_equal(kv_tls_create(&f, true, &t, err, sizeof(err)), KV_EINVAL);
	assert_null(t);
	assert_non_null(strstr(err, "is not the key of --tls-cert"));
	assert_non_null(strstr(err, other));

	/* The files swapped: the key where the certificate goes. */
	f = (kv_tls_files){.cert = pem(key, sizeof(key), "server.key"),
	                   .key = pem(crt, sizeof(crt), "server.crt"),
	                   .ca = ca};
	assert_int_equal(kv_tls_create(&f, true, &t, err, sizeof(err)), KV_EINVAL);
	assert_non_null(strstr(err, "--tls-cert"));
	assert_non_null(strstr(err, "not a valid certificate"));

	f = (kv_tls_files){.cert = pem(crt, sizeof(crt), "server.crt"),
	                   .key = pem(key, sizeof(key), "server.key"),
	                   .ca = ca};
	assert_int_equal(kv_tls_create(&f, true, &t, err, sizeof(err)), KV_OK);
	assert_true(kv_tls_has_cert(t));
	kv_tls_destroy(t);
}

/* ---------------------------------------------------------------------------
 * Sockets
 * ------------------------------------------------------------------------- */

static int
echo(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p)
{
	(void)arg;
	(void)p;
	if (nng_msg_dup(reply, req) != 0)
		return KV_ENOMEM;
	return 0;
}

/* A kv_tls of pki files (NULL names: not given). */
static kv_tls *
tls_of(const char *cert, const char *key, const char *ca, bool daemon)
{
	char c[96], k[96], a[96], err[512];
	kv_tls_files f = {.cert = cert ? pem(c, sizeof(c), cert) : NULL,
	                  .key = key ? pem(k, sizeof(k), key) : NULL,
	                  .ca = pem(a, sizeof(a), ca)};
	kv_tls *t = NULL;

	if (kv_tls_create(&f, daemon, &t, err, sizeof(err)) != KV_OK)
		fail_msg("kv_tls_create: %s", err);
	return t;
}

/* One call to url with t; returns its code. */
static int
call(const char *url, const kv_tls *t, uint32_t ms)
{
	kv_rpc_client *c = NULL;
	nng_msg *req, *rep = NULL;
	int rv;

	assert_int_equal(kv_rpc_client_create_tls(url, t, &c), KV_OK);
	assert_int_equal(nng_msg_alloc(&req, 0), 0);
	assert_int_equal(nng_msg_append(req, "ping", 4), 0);
	rv = kv_rpc_call(c, req, &rep, ms);
	if (rv == KV_OK) {
		assert_int_equal(nng_msg_len(rep), 4);
		assert_memory_equal(nng_msg_body(rep), "ping", 4);
		nng_msg_free(rep);
	}
	kv_rpc_client_destroy(c);
	return rv;
}

static void
rpc_over_tls_serves_the_cas_clients_only(void **state)
{
	char port_url[64], url[80];
	kv_tls *srv, *good, *nocert, *rogue, *distrust;
	kv_rpc_server *s = NULL;
	uint64_t t0;

	(void)state;
	NEED_PKI();
	kv_test_free_url(port_url, sizeof(port_url));
	snprintf(url, sizeof(url), "tls+%s", port_url);
	srv = tls_of("server.crt", "server.key", "ca.crt", true);
	good = tls_of("client.crt", "client.key", "ca.crt", false);
	nocert = tls_of(NULL, NULL, "ca.crt", false);
	rogue = tls_of("rogue.crt", "rogue.key", "ca.crt", false);
	distrust = tls_of("client.crt", "client.key", "otherca.crt", false);

	/* A TLS URL needs a configuration with a certificate. */
	kv_rpc_server_opts o = {.url = url, .handler = echo};
	assert_int_equal(kv_rpc_server_create(&o, &s), KV_EINVAL);
	o.tls = nocert;
	assert_int_equal(kv_rpc_server_create(&o, &s), KV_EINVAL);
	o.tls = srv;
	assert_int_equal(kv_rpc_server_create(&o, &s), KV_OK);
	kv_rpc_client *c = NULL;
	assert_int_equal(kv_rpc_client_create_tls(url, NULL, &c), KV_EINVAL);

	assert_int_equal(call(url, good, 5000), KV_OK);
	t0 = kv_test_now_ms();
	assert_int_equal(call(url, nocert, 5000), KV_EAUTH);
	assert_non_null(strstr(kv_rpc_why(), "TLS handshake with"));
	assert_non_null(strstr(kv_rpc_why(), "none was given"));
	assert_true(kv_test_now_ms() - t0 < 3000);
	assert_int_equal(call(url, rogue, 5000), KV_EAUTH);
	assert_int_equal(call(url, distrust, 5000), KV_EAUTH);
	assert_non_null(strstr(kv_rpc_why(), "TLS handshake"));
	/* Plain tcp to the TLS port: no answer, and no TLS reason to give. */
	assert_int_equal(call(port_url, NULL, 1000), KV_EUNAVAIL);
	assert_string_equal(kv_rpc_why(), "");
	/* The good client still gets through after all that. */
	assert_int_equal(call(url, good, 5000), KV_OK);
	assert_int_equal(kv_tls_probe(url, good, 2000, NULL, 0), KV_OK);

	kv_rpc_server_destroy(s);
	kv_tls_destroy(srv);
	kv_tls_destroy(good);
	kv_tls_destroy(nocert);
	kv_tls_destroy(rogue);
	kv_tls_destroy(distrust);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(only_tls_tcp_schemes_are_tls_urls),
	    cmocka_unit_test(tls_files_and_urls_must_agree),
	    cmocka_unit_test(the_ca_is_required_and_cert_and_key_go_together),
	    cmocka_unit_test_setup_teardown(unusable_files_are_refused_with_their_name,
	                                    kv_test_dir_setup, kv_test_dir_teardown),
	    cmocka_unit_test(a_key_that_is_not_the_certificates_is_refused),
	    cmocka_unit_test(rpc_over_tls_serves_the_cas_clients_only),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
