/*
 * tls.c - loading the TLS files into nng configurations and applying them
 * (tls.h).
 *
 * The files are read here rather than by nng so that a missing, unreadable
 * or oversized file is reported with its flag and name, and parsed once
 * with mbedtls (the engine of Debian's nng) so that a file that is not what
 * its flag says, a key that is not the certificate's, or an expired
 * certificate stops the start with a line naming it, instead of failing
 * every handshake later. Private key bytes are wiped from our buffers after
 * use.
 */
#include "common/tls.h"
#include "common/err.h"
#include "common/fileio.h"
#include "common/rpc.h"

#include <errno.h>
#include <fcntl.h>
#include <mbedtls/pk.h>
#include <mbedtls/x509_crt.h>
#include <nng/supplemental/tls/tls.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct kv_tls {
	nng_tls_config *server; /* for listeners; NULL without --tls-cert */
	nng_tls_config *client; /* for dialers */
};

bool
kv_tls_files_any(const kv_tls_files *f)
{
	return f != NULL && (f->cert != NULL || f->key != NULL || f->ca != NULL);
}

bool
kv_tls_url(const char *url)
{
	return url != NULL && strncmp(url, "tls+tcp", 7) == 0 &&
	       (strncmp(url + 7, "://", 3) == 0 || strncmp(url + 7, "4://", 4) == 0 ||
	        strncmp(url + 7, "6://", 4) == 0);
}

static void
wipe(char *p, size_t n)
{
	if (p == NULL)
		return;
	memset(p, 0, n);
	__asm__ __volatile__("" : : "r"(p) : "memory");
}

/* Reads a whole PEM file into a NUL-terminated heap string (*out, *len
 * without the NUL). */
static int
read_pem(const char *flag, const char *path, char **out, size_t *len, char *err, size_t errlen)
{
	const size_t cap = KV_TLS_MAX_FILE;
	struct stat st;
	char *buf = NULL;
	size_t n = 0;
	int fd, rv;

	if (path == NULL || path[0] == '\0')
		return kv_errf(err, errlen, KV_EINVAL, "%s needs a file name", flag);
	/* O_NONBLOCK: a FIFO with no writer must not hang the start. */
	if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) < 0)
		return kv_errf(err, errlen, kv_err_from_errno(errno), "cannot read %s %s: %s", flag,
		               path, strerror(errno));
	if (fstat(fd, &st) != 0) {
		rv = kv_errf(err, errlen, kv_err_from_errno(errno), "cannot read %s %s: %s", flag,
		             path, strerror(errno));
		goto out;
	}
	if (S_ISDIR(st.st_mode)) {
		rv = kv_errf(err, errlen, KV_EINVAL, "%s %s is a directory", flag, path);
		goto out;
	}
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	if ((buf = malloc(cap + 2)) == NULL) {
		rv = kv_errf(err, errlen, KV_ENOMEM, "out of memory reading %s %s", flag, path);
		goto out;
	}
	while (n <= cap) {
		ssize_t r = read(fd, buf + n, cap + 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rv = kv_errf(err, errlen, kv_err_from_errno(errno), "cannot read %s %s: %s",
			             flag, path, strerror(errno));
			goto out;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	if (n > cap) {
		rv = kv_errf(err, errlen, KV_ETOOBIG, "%s %s is larger than %u bytes", flag, path,
		             KV_TLS_MAX_FILE);
		goto out;
	}
	buf[n] = '\0';
	/* mbedtls reads the PEM as a C string: an embedded NUL would cut it. */
	if (n == 0 || memchr(buf, '\0', n) != NULL || strstr(buf, "-----BEGIN ") == NULL) {
		rv = kv_errf(err, errlen, KV_EINVAL, "%s %s is not a PEM file", flag, path);
		goto out;
	}
	*out = buf;
	*len = n;
	buf = NULL;
	rv = KV_OK;
out:
	if (buf != NULL)
		wipe(buf, cap + 2);
	free(buf);
	close(fd);
	return rv;
}

void
kv_tls_destroy(kv_tls *t)
{
	if (t == NULL)
		return;
	if (t->server != NULL)
		nng_tls_config_free(t->server);
	if (t->client != NULL)
		nng_tls_config_free(t->client);
	free(t);
}

/* Parses the PEM files (NUL-terminated, len without the NUL) and checks
 * that they are usable together. */
static int
files_check(const kv_tls_files *f, const char *ca, size_t calen, const char *cert, size_t certlen,
            const char *key, size_t keylen, char *err, size_t errlen)
{
	mbedtls_x509_crt chain, own;
	mbedtls_pk_context pk;
	int rv = KV_OK;

	mbedtls_x509_crt_init(&chain);
	mbedtls_x509_crt_init(&own);
	mbedtls_pk_init(&pk);
	/* A CA file may hold other PEM blocks; it needs one CA certificate. */
	if (mbedtls_x509_crt_parse(&chain, (const unsigned char *)ca, calen + 1) < 0 ||
	    chain.version == 0) {
		rv = kv_errf(err, errlen, KV_EINVAL, "--tls-ca %s holds no valid certificate",
		             f->ca);
		goto out;
	}
	if (cert == NULL)
		goto out;
	if (mbedtls_x509_crt_parse(&own, (const unsigned char *)cert, certlen + 1) != 0) {
		rv = kv_errf(err, errlen, KV_EINVAL, "--tls-cert %s is not a valid certificate",
		             f->cert);
		goto out;
	}
	if (mbedtls_x509_time_is_past(&own.valid_to)) {
		rv = kv_errf(err, errlen, KV_EINVAL, "--tls-cert %s expired on %04d-%02d-%02d",
		             f->cert, own.valid_to.year, own.valid_to.mon, own.valid_to.day);
		goto out;
	}
	if (mbedtls_pk_parse_key(&pk, (const unsigned char *)key, keylen + 1, NULL, 0) != 0) {
		rv = kv_errf(err, errlen, KV_EINVAL,
		             "--tls-key %s is not a valid unencrypted private key", f->key);
		goto out;
	}
	if (mbedtls_pk_check_pair(&own.pk, &pk) != 0)
		rv = kv_errf(err, errlen, KV_EINVAL, "--tls-key %s is not the key of --tls-cert %s",
		             f->key, f->cert);
out:
	mbedtls_pk_free(&pk);
	mbedtls_x509_crt_free(&own);
	mbedtls_x509_crt_free(&chain);
	return rv;
}

/* Loads the CA and (when given) our own certificate into one config. */
static int
config_load(nng_tls_config *cfg, const kv_tls_files *f, const char *ca, const char *cert,
            const char *key, char *err, size_t errlen)
{
	int rv;

	if ((rv = nng_tls_config_ca_chain(cfg, ca, NULL)) != 0)
		return kv_errf(err, errlen, KV_EINVAL,
		               "--tls-ca %s holds no usable CA certificate (PEM): %s", f->ca,
		               nng_strerror(rv));
	if ((rv = nng_tls_config_auth_mode(cfg, NNG_TLS_AUTH_MODE_REQUIRED)) != 0)
		return kv_errf(err, errlen, kv_err_from_nng(rv),
		               "cannot require peer certificates: %s", nng_strerror(rv));
	if (cert != NULL && (rv = nng_tls_config_own_cert(cfg, cert, key, NULL)) != 0)
		return kv_errf(err, errlen, KV_EINVAL,
		               "cannot use --tls-cert %s with --tls-key %s: %s (a PEM certificate "
		               "and its unencrypted private key are needed)",
		               f->cert, f->key, nng_strerror(rv));
	return KV_OK;
}

int
kv_tls_check_files(const kv_tls_files *f, bool need_cert, char *err, size_t errlen)
{
	if (f == NULL)
		return kv_errf(err, errlen, KV_EINVAL, "no TLS files");
	if (f->ca == NULL)
		return kv_errf(err, errlen, KV_EINVAL,
		               "TLS needs --tls-ca (the CA that signs the cluster's certificates)");
	if ((f->cert == NULL) != (f->key == NULL))
		return kv_errf(err, errlen, KV_EINVAL, "--tls-cert and --tls-key go together");
	if (need_cert && f->cert == NULL)
		return kv_errf(err, errlen, KV_EINVAL,
		               "TLS needs --tls-cert and --tls-key as well as --tls-ca");
	return KV_OK;
}

int
kv_tls_create(const kv_tls_files *f, bool need_cert, kv_tls **out, char *err, size_t errlen)
{
	char *ca = NULL, *cert = NULL, *key = NULL;
	size_t calen = 0, certlen = 0, keylen = 0;
	kv_tls *t = NULL;
	int rv;

	if (out == NULL)
		return kv_errf(err, errlen, KV_EINVAL, "no TLS files");
	if ((rv = kv_tls_check_files(f, need_cert, err, errlen)) != 0)
		return rv;
	if ((rv = read_pem("--tls-ca", f->ca, &ca, &calen, err, errlen)) != 0)
		goto out;
	if (f->cert != NULL &&
	    ((rv = read_pem("--tls-cert", f->cert, &cert, &certlen, err, errlen)) != 0 ||
	     (rv = read_pem("--tls-key", f->key, &key, &keylen, err, errlen)) != 0))
		goto out;
	if ((rv = files_check(f, ca, calen, cert, certlen, key, keylen, err, errlen)) != 0)
		goto out;
	if ((t = calloc(1, sizeof(*t))) == NULL) {
		rv = kv_errf(err, errlen, KV_ENOMEM, "out of memory");
		goto out;
	}
	if ((rv = nng_tls_config_alloc(&t->client, NNG_TLS_MODE_CLIENT)) != 0 ||
	    (cert != NULL && (rv = nng_tls_config_alloc(&t->server, NNG_TLS_MODE_SERVER)) != 0)) {
		rv = kv_errf(err, errlen, kv_err_from_nng(rv), "cannot set up TLS: %s",
		             nng_strerror(rv));
		goto out;
	}
	if ((rv = config_load(t->client, f, ca, cert, key, err, errlen)) != 0 ||
	    (t->server != NULL &&
	     (rv = config_load(t->server, f, ca, cert, key, err, errlen)) != 0))
		goto out;
	*out = t;
	t = NULL;
	rv = KV_OK;
out:
	kv_tls_destroy(t);
	free(ca);
	free(cert);
	wipe(key, keylen);
	free(key);
	return rv;
}

bool
kv_tls_has_cert(const kv_tls *t)
{
	return t != NULL && t->server != NULL;
}

int
kv_tls_check_url(bool tls, const char *flag, const char *url, char *err, size_t errlen)
{
	bool is_tls = kv_tls_url(url);

	if (is_tls && !tls)
		return kv_errf(err, errlen, KV_EINVAL,
		               "%s %s is a TLS address: give --tls-ca (and --tls-cert, --tls-key)",
		               flag, url);
	if (!is_tls && tls)
		return kv_errf(err, errlen, KV_EINVAL,
		               "%s %s is not a tls+tcp:// address, but TLS files were given", flag,
		               url ? url : "(none)");
	return KV_OK;
}

int
kv_tls_listen(nng_socket sock, const char *url, const kv_tls *t)
{
	nng_listener l;
	int rv;

	if ((rv = nng_listener_create(&l, sock, url)) != 0)
		return kv_err_from_nng(rv);
	if (kv_tls_url(url)) {
		if (t == NULL || t->server == NULL) {
			nng_listener_close(l);
			return KV_EINVAL;
		}
		if ((rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, t->server)) != 0) {
			nng_listener_close(l);
			return kv_err_from_nng(rv);
		}
	}
	if ((rv = nng_listener_start(l, 0)) != 0) {
		nng_listener_close(l);
		return kv_err_from_nng(rv);
	}
	return KV_OK;
}

int
kv_tls_dial(nng_socket sock, const char *url, const kv_tls *t, int flags, nng_dialer *out)
{
	nng_dialer d;
	int rv;

	if ((rv = nng_dialer_create(&d, sock, url)) != 0)
		return kv_err_from_nng(rv);
	if (kv_tls_url(url)) {
		if (t == NULL) {
			nng_dialer_close(d);
			return KV_EINVAL;
		}
		if ((rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, t->client)) != 0) {
			nng_dialer_close(d);
			return kv_err_from_nng(rv);
		}
	}
	if ((rv = nng_dialer_start(d, flags)) != 0) {
		nng_dialer_close(d);
		return kv_err_from_nng(rv);
	}
	if (out != NULL)
		*out = d;
	return KV_OK;
}

int
kv_tls_probe(const char *url, const kv_tls *t, uint32_t timeout_ms, char *why, size_t len)
{
	/* The SP header of a REQ socket: sending it needs a finished handshake. */
	uint8_t hdr[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0};
	nng_iov iov = {.iov_buf = hdr, .iov_len = sizeof(hdr)};
	nng_stream_dialer *d = NULL;
	nng_stream *s = NULL;
	nng_aio *aio = NULL;
	int rv;

	if (why != NULL && len > 0)
		why[0] = '\0';
	if (!kv_tls_url(url) || t == NULL)
		return KV_EINVAL;
	if ((rv = nng_aio_alloc(&aio, NULL, NULL)) != 0)
		return kv_err_from_nng(rv);
	if ((rv = nng_stream_dialer_alloc(&d, url)) != 0 ||
	    (rv = nng_stream_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, t->client)) != 0) {
		rv = rv == NNG_ENOMEM ? KV_ENOMEM : KV_EINVAL;
		goto out;
	}
	nng_aio_set_timeout(aio, (nng_duration)timeout_ms);
	nng_stream_dialer_dial(d, aio);
	nng_aio_wait(aio);
	if ((rv = nng_aio_result(aio)) != 0) {
		rv = kv_errf(why, len, KV_EUNAVAIL, "cannot connect to %s: %s", url,
		             nng_strerror(rv));
		goto out;
	}
	s = nng_aio_get_output(aio, 0);
	nng_aio_set_timeout(aio, (nng_duration)timeout_ms);
	nng_aio_set_iov(aio, 1, &iov);
	nng_stream_send(s, aio);
	nng_aio_wait(aio);
	switch ((rv = nng_aio_result(aio))) {
	case 0:
		rv = KV_OK;
		break;
	case NNG_EPEERAUTH:
		rv = kv_errf(why, len, KV_EAUTH,
		             "TLS handshake with %s failed: its certificate is not signed by our "
		             "--tls-ca",
		             url);
		break;
	case NNG_ECRYPTO:
	case NNG_ECONNSHUT:
	case NNG_ECONNRESET:
	case NNG_ECLOSED:
		rv = kv_errf(why, len, KV_EAUTH,
		             "TLS handshake with %s failed: %s (the peer refused our certificate: "
		             "%s)",
		             url, nng_strerror(rv),
		             t->server ? "not signed by its CA?" : "none was given (--tls-cert)");
		break;
	default:
		rv = kv_errf(why, len, KV_EUNAVAIL, "TLS handshake with %s did not finish: %s", url,
		             nng_strerror(rv));
		break;
	}
out:
	if (s != NULL)
		nng_stream_free(s);
	if (d != NULL)
		nng_stream_dialer_free(d);
	nng_aio_free(aio);
	return rv;
}
