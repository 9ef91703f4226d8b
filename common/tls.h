/*
 * tls.h - TLS for every nng socket of shardkv (--tls-cert, --tls-key,
 * --tls-ca, doc/contract.md §5): loading the PEM files into nng TLS configurations and
 * applying them to listeners and dialers of tls+tcp:// URLs.
 *
 * A kv_tls holds two nng configurations built from the same files: a server
 * one for listeners and a client one for dialers. Authentication is mutual
 * and rests on the CA alone:
 *   - a listener presents --tls-cert and requires of every peer a
 *     certificate signed by --tls-ca (the handshake fails otherwise);
 *   - a dialer presents --tls-cert when it has one and requires the
 *     listener's certificate to be signed by --tls-ca.
 * The server name is not checked: the peer's certificate must chain to the
 * cluster's CA, whatever names or addresses it lists (Debian's mbedtls 2.28
 * cannot match IP-address SANs, and clusters are addressed by IP). Every
 * certificate the CA signs is therefore a member of the cluster.
 *
 * The rules for which files are needed (kv_tls_create) and which URLs go
 * with them (kv_tls_check_url) are in one place so that every binary applies
 * the same ones. A kv_tls is immutable once created and may be shared by any
 * number of threads and sockets; nng keeps its own reference on each
 * configuration it is given.
 */
#ifndef KV_COMMON_TLS_H
#define KV_COMMON_TLS_H

#include <nng/nng.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The three files; NULL: not given. */
typedef struct {
	const char *cert; /* --tls-cert: this side's certificate chain (PEM) */
	const char *key;  /* --tls-key: its private key (PEM, unencrypted) */
	const char *ca;   /* --tls-ca: the CA certificate(s) peers must chain to (PEM) */
} kv_tls_files;

typedef struct kv_tls kv_tls;

/* Largest PEM file read, in bytes. */
#define KV_TLS_MAX_FILE (1024u * 1024u)

/* Returns whether any of the three files is given. */
bool kv_tls_files_any(const kv_tls_files *f);

/*
 * Checks which files are given: --tls-ca is required; --tls-cert and
 * --tls-key go together; need_cert (daemons, which listen) makes them
 * required too. Returns 0 or KV_EINVAL with a one-line reason in err.
 */
int kv_tls_check_files(const kv_tls_files *f, bool need_cert, char *err, size_t errlen);

/*
 * Loads the files after kv_tls_check_files. On 0
 * the caller owns *out and frees it with kv_tls_destroy(). On error *out is
 * untouched and err gets a one-line reason naming the flag and the file;
 * returns KV_EINVAL (a missing flag, a file that is not valid PEM, a key that
 * does not match the certificate), KV_ENOTFOUND, KV_EPERM or KV_EIO (cannot
 * read), KV_ETOOBIG (over KV_TLS_MAX_FILE) or KV_ENOMEM.
 */
int kv_tls_create(const kv_tls_files *f, bool need_cert, kv_tls **out, char *err, size_t errlen);

/* Frees a kv_tls; sockets configured with it keep working. Accepts NULL. */
void kv_tls_destroy(kv_tls *t);

/* Returns whether t holds a certificate of its own (--tls-cert). */
bool kv_tls_has_cert(const kv_tls *t);

/* Returns whether url uses nng's TLS transport (tls+tcp://, tls+tcp4://,
 * tls+tcp6://). */
bool kv_tls_url(const char *url);

/*
 * Checks a URL given at start-up (`flag` names where it came from, e.g.
 * "--listen") against the TLS setting (tls: TLS files were given): a
 * tls+tcp:// URL needs them, and with them every such URL must be
 * tls+tcp://, so that a cluster is never half encrypted by mistake. Returns
 * 0 or KV_EINVAL with the reason in err.
 */
int kv_tls_check_url(bool tls, const char *flag, const char *url, char *err, size_t errlen);

/*
 * Starts listening on url with sock: for a tls+tcp:// URL with the server
 * configuration of t (KV_EINVAL when t is NULL or has no certificate). t is
 * ignored for other URLs. Returns 0 or a KV_E* code (kv_err_from_nng, common/err.h).
 */
int kv_tls_listen(nng_socket sock, const char *url, const kv_tls *t);

/*
 * Dials url with sock and `flags` (NNG_FLAG_NONBLOCK), with the client
 * configuration of t for a tls+tcp:// URL (KV_EINVAL when t is NULL). t is
 * ignored for other URLs. The dialer goes to *out when out is not NULL.
 * Returns 0 or a KV_E* code.
 */
int kv_tls_dial(nng_socket sock, const char *url, const kv_tls *t, int flags, nng_dialer *out);

/*
 * Finds out why no connection to a tls+tcp:// url could be made: opens one
 * TLS connection with t and runs the handshake, waiting up to timeout_ms.
 * Returns 0 (the handshake works), KV_EAUTH (it failed: the peer refused our
 * certificate or we refused its one; the reason in why), KV_EUNAVAIL (no
 * connection), KV_EINVAL (not a TLS URL, or t NULL) or KV_ENOMEM.
 */
int kv_tls_probe(const char *url, const kv_tls *t, uint32_t timeout_ms, char *why, size_t len);

#endif
