/*
 * auth.h - the shared secret of a cluster (--auth-token-file, doc/contract.md §5):
 * loading it from its file, checking the token a request carries, and the
 * log line for a refused request.
 *
 * Every AdminRequest and Request envelope carries `auth_token`. A
 * controller or server started with a secret refuses, with STATUS_AUTH_FAILED
 * and before doing anything else, every request whose token is not exactly
 * that secret; servers send theirs to the controller and to each other.
 * Without a secret nothing is checked.
 */
#ifndef KV_COMMON_AUTH_H
#define KV_COMMON_AUTH_H

#include "common/key.h"

#include <nng/nng.h>
#include <stdbool.h>
#include <stddef.h>

/* Longest secret accepted, in bytes (after the trailing newline is cut). */
#define KV_AUTH_MAX_TOKEN 4096u

/*
 * Reads the secret from `path`: the file's bytes without one trailing "\n"
 * (or "\r\n"), so that `echo secret > F` works. Any other byte is part of the
 * secret. On 0 *out holds it and *loose says whether the file is a regular
 * file that group or others may access (the caller warns: a secret should be
 * mode 0600). On error *out is untouched and err gets a one-line reason
 * naming the file; returns KV_ENOTFOUND, KV_EPERM or KV_EIO (cannot read it),
 * KV_EINVAL (empty), KV_ETOOBIG (longer than KV_AUTH_MAX_TOKEN) or
 * KV_ENOMEM.
 */
int kv_auth_load(const char *path, kv_buf *out, bool *loose, char *err, size_t errlen);

/*
 * Returns whether the token `got` (len bytes, may be NULL when len is 0)
 * matches the secret `want`. An empty `want` (no secret configured) accepts
 * everything. The time taken depends on the secret's length only, never on
 * where the bytes first differ.
 */
bool kv_auth_ok(const kv_buf *want, const void *got, size_t len);

/* Writes the address of the peer that sent `req` ("127.0.0.1:40512",
 * "[::1]:40512", an ipc path) into buf, or "unknown" when nng cannot say. */
void kv_auth_peer(nng_msg *req, char *buf, size_t len);

/*
 * Logs one warning for a request refused for its token: `what` (the
 * command), the peer, and whether the token was missing or wrong. Rate
 * limited per process (a burst of 10 lines, then one per second), so that a
 * flood of bad requests cannot flood the log; the next line logged counts
 * the ones left out (`suppressed=N`). Thread-safe.
 */
void kv_auth_log_refused(const char *component, const char *what, nng_msg *req, size_t token_len);

#endif
