/*
 * shardkv.h - the public C API of libshardkv, the client of a shardkv cluster.
 *
 * A shardkv_client is a handle on one cluster, named by its controller
 * addresses. It caches the cluster configuration (kept fresh by a background
 * watch on the controller), routes every key to the server that owns it,
 * retries transparently while ranges move, and splits multi-key operations
 * per server. Every call blocks until it succeeds, fails, or its deadline
 * (shardkv_options.timeout_ms) passes.
 *
 * Conventions:
 *   - Every function that can fail returns 0 or a negative SHARDKV_E* code;
 *     shardkv_strerror() names the code, shardkv_errmsg() gives the detail of
 *     the last failure on the calling thread.
 *   - Keys and values are byte strings (pointer + length), never NUL-terminated
 *     strings. Inputs are borrowed for the duration of the call only.
 *   - Results are written only on success (exceptions are documented: mget on
 *     SHARDKV_ENOTFOUND and mput on a partial failure also fill their result).
 *   - Every returned buffer or result says who frees it and with what.
 *   - A handle is thread-safe: any number of threads may call operations on
 *     it at once. shardkv_close() must not race with calls in progress.
 *
 * This header includes no protobuf or nng header; the library is linked with
 * `pkg-config --libs shardkv`.
 */
#ifndef SHARDKV_H
#define SHARDKV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SHARDKV_API __attribute__((visibility("default")))
#else
#define SHARDKV_API
#endif

#define SHARDKV_VERSION_MAJOR 0
#define SHARDKV_VERSION_MINOR 1

/*
 * Error codes. The values are those of the server-side vocabulary and are
 * stable: scripts and logs may rely on them.
 */
enum shardkv_err {
	SHARDKV_OK = 0,
	SHARDKV_ENOTFOUND = -1,   /* key (or one of the mget keys) not found; unknown node */
	SHARDKV_EINVAL = -2,      /* invalid argument (empty key, inverted range, count mismatch) */
	SHARDKV_ENOMEM = -3,      /* out of memory */
	SHARDKV_ETOOBIG = -4,     /* key or value over the configured limit */
	SHARDKV_EWRONGOWNER = -5, /* routing did not converge before the deadline */
	SHARDKV_ESTALE = -6,      /* configuration epoch is stale */
	SHARDKV_ETIMEDOUT = -7,   /* the deadline passed */
	SHARDKV_EUNAVAIL = -8,    /* no controller or server could be reached */
	SHARDKV_EEXISTS = -9,     /* already exists (duplicate join) */
	SHARDKV_EIO = -10,        /* a server's disk failed */
	SHARDKV_ECORRUPT = -11,   /* stored data failed a checksum */
	SHARDKV_EPROTO = -12,     /* malformed or unexpected message */
	SHARDKV_EAUTH = -13,      /* authentication failed (missing or wrong token) */
	SHARDKV_ECLOSED = -14,    /* the handle or a peer is shutting down */
	SHARDKV_EBUSY = -15,      /* busy (e.g. the range is moving); try again */
	SHARDKV_EMOVING = -16,    /* the key's range is being handed over */
	SHARDKV_EPERM = -17,      /* operation not permitted */
	SHARDKV_ENOSPC = -18,     /* a server's disk is full */
	SHARDKV_ELIMIT = -19,     /* over a configured limit (batch size, scan limit) */
	SHARDKV_EADDRINUSE = -20, /* address in use */
	SHARDKV_EINTERNAL = -21,  /* internal error */
	SHARDKV_EMISMATCH = -22,  /* a conditional write's condition did not hold */
};

/* Returns a static message for a SHARDKV_E* code ("success" for 0). */
SHARDKV_API const char *shardkv_strerror(int err);

/*
 * Returns a message describing the last failure of a shardkv call on this
 * thread, with the server's detail when it sent one ("" when none). The string
 * is thread-local and valid until the next shardkv call on this thread.
 */
SHARDKV_API const char *shardkv_errmsg(void);

/* Frees memory returned by the library as a plain buffer. Accepts NULL. */
SHARDKV_API void shardkv_free(void *p);

/* An opaque client handle. */
typedef struct shardkv_client shardkv_client;

/* Options of shardkv_open(); zero-initialise, then set what you need. Fields
 * are only ever added at the end, and zero keeps the old behaviour; the
 * library reads the whole struct, so a program is rebuilt with the header of
 * the library it links. */
typedef struct {
	uint32_t timeout_ms;    /* per-call deadline; 0: 5000 */
	const void *auth_token; /* shared secret sent with every request; NULL: none */
	size_t auth_token_len;  /* its length in bytes */
	bool no_watch;          /* true: no background watch thread (short-lived tools) */
	/* TLS (tls+tcp:// addresses; doc/contract.md §5 --tls-*): PEM file names, read by
	 * shardkv_open. tls_ca is needed for TLS (the servers' certificates must
	 * be signed by it); tls_cert and tls_key, given together, are this
	 * client's certificate, which servers started with --tls-ca require. All
	 * NULL (the zero default): no TLS, and tls+tcp:// addresses are refused. */
	const char *tls_cert; /* client certificate */
	const char *tls_key;  /* its private key (unencrypted) */
	const char *tls_ca;   /* CA the servers' certificates must be signed by */
} shardkv_options;

/*
 * Opens a handle on the cluster whose controllers are `controllers`, a
 * comma-separated list of nng URLs ("tcp://10.0.0.1:7000,tcp://10.0.0.2:7000").
 * Connects lazily: an unreachable cluster is reported by the first call.
 * `opt` may be NULL (defaults); it is copied. On 0 the caller owns *out and
 * closes it with shardkv_close(). Returns 0, SHARDKV_EINVAL (also for
 * unusable TLS files, or controller addresses whose scheme does not match the
 * TLS options: shardkv_errmsg() says which) or SHARDKV_ENOMEM. A server that
 * refuses this client's certificate (or whose certificate is not signed by
 * tls_ca) makes calls fail with SHARDKV_EAUTH and a "TLS handshake ... failed"
 * message.
 */
SHARDKV_API int shardkv_open(const char *controllers, const shardkv_options *opt,
                             shardkv_client **out);

/* Stops the watch thread, closes every connection and frees the handle.
 * Accepts NULL. No call may be in progress on the handle. */
SHARDKV_API void shardkv_close(shardkv_client *c);

/* Changes the per-call deadline of the handle (0: 5000 ms). Thread-safe. */
SHARDKV_API void shardkv_set_timeout(shardkv_client *c, uint32_t timeout_ms);

/*
 * Per-call deadline: sets the deadline of every call this thread makes
 * from now on, on any handle, in place of the handle's (0: the handle's
 * again). A blocking call's deadline starts when it is made; an async call's
 * when it is taken (its completion may come later on a library thread: the
 * deadline was fixed at submission). Typical use brackets one call:
 *
 *     shardkv_set_thread_timeout(200);
 *     rv = shardkv_get(c, key, klen, &v);
 *     shardkv_set_thread_timeout(0);
 */
SHARDKV_API void shardkv_set_thread_timeout(uint32_t timeout_ms);

/* This thread's per-call deadline (0: none set, the handle's applies). */
SHARDKV_API uint32_t shardkv_thread_timeout(void);

/*
 * Logging. The library writes diagnostics to stderr, one line each. By
 * default a program that uses the library sees warnings and errors only
 * (set by the first shardkv_open() unless the program chose a level
 * before); info lines (reconnections and the like) and debug lines are
 * for troubleshooting. The level is process-wide; set it before opening
 * handles or while no call is in progress. Returns 0 or SHARDKV_EINVAL.
 */
enum shardkv_log_level {
	SHARDKV_LOG_DEBUG = 0,
	SHARDKV_LOG_INFO = 1,
	SHARDKV_LOG_WARN = 2,
	SHARDKV_LOG_ERROR = 3,
	SHARDKV_LOG_OFF = 4,
};
SHARDKV_API int shardkv_set_log_level(int level);

/* A borrowed byte string (input). */
typedef struct {
	const void *data; /* bytes; may be NULL when len is 0 */
	size_t len;       /* length */
} shardkv_bytes;

/* A byte string returned by the library. `data` has one extra NUL byte after
 * `len` bytes (so text can be printed directly); it is owned by the result
 * that contains it, or, when returned alone, freed with shardkv_free(data). */
typedef struct {
	uint8_t *data; /* bytes, NUL-terminated; NULL for "absent" */
	size_t len;    /* length without the NUL */
} shardkv_buf;

/* ---------------------------------------------------------------------------
 * Data operations (doc/contract.md §3)
 * ------------------------------------------------------------------------- */

/* Reads a key. On 0 *val holds the value; free val->data with shardkv_free().
 * Returns 0, SHARDKV_ENOTFOUND, or another code. */
SHARDKV_API int shardkv_get(shardkv_client *c, const void *key, size_t klen, shardkv_buf *val);

/* Inserts or overwrites a key. Retries reuse the same request id, so the
 * write is applied once. */
SHARDKV_API int shardkv_put(shardkv_client *c, const void *key, size_t klen, const void *val,
                            size_t vlen);

/* Deletes a key. On 0, when `old` is not NULL, *old holds the deleted value
 * (free old->data with shardkv_free()). A delete the library had to retry
 * is answered from the server's exactly-once memory, which keeps deleted
 * values of up to 4096 bytes: for a larger one old->data is NULL (deleted,
 * value not known). Returns SHARDKV_ENOTFOUND when the key is absent. */
SHARDKV_API int shardkv_del(shardkv_client *c, const void *key, size_t klen, shardkv_buf *old);

/* Appends to a key's value (creating it when absent), once even if retried.
 * On 0, when `new_len` is not NULL, it receives the length after the append. */
SHARDKV_API int shardkv_append(shardkv_client *c, const void *key, size_t klen, const void *val,
                               size_t vlen, uint64_t *new_len);

/*
 * Asynchronous single-key operations. Each call routes the op, queues it on
 * the owner's connection and returns at once; `done` then runs exactly once,
 * on a library thread, with the op's status (0, SHARDKV_ENOTFOUND, ...) and,
 * for get and del, the value (valid only during the callback; NULL and 0
 * otherwise). Concurrent ops to one server share requests (up to 128 ops
 * each, a few requests in flight per server), which is how a single thread
 * can keep many operations in flight. Retries, routing corrections and the
 * per-call deadline work as in the blocking calls; a write keeps its
 * request id across retries. `done` must not block for long, may start
 * further async ops, and must not call shardkv_close(). Key and value are
 * copied. Returns 0 when the op was taken (done will run), or an error
 * (SHARDKV_EINVAL, SHARDKV_ETOOBIG, SHARDKV_ENOMEM, SHARDKV_ECLOSED once
 * shardkv_close has begun) and done will not run. shardkv_close() completes
 * the queued ops with SHARDKV_ECLOSED and waits for those already sent
 * (answered, or failed at their timeout) before it returns. A delete's val
 * is the deleted value, or NULL when a retry was answered without it (as
 * shardkv_del's old->data).
 */
typedef void (*shardkv_done_fn)(void *arg, int status, const void *val, size_t vlen);

SHARDKV_API int shardkv_get_async(shardkv_client *c, const void *key, size_t klen,
                                  shardkv_done_fn done, void *arg);
SHARDKV_API int shardkv_put_async(shardkv_client *c, const void *key, size_t klen, const void *val,
                                  size_t vlen, shardkv_done_fn done, void *arg);
SHARDKV_API int shardkv_del_async(shardkv_client *c, const void *key, size_t klen,
                                  shardkv_done_fn done, void *arg);
/* Appends asynchronously (as shardkv_append); done gets val NULL and, on
 * status 0, vlen the value's length after the append. */
SHARDKV_API int shardkv_append_async(shardkv_client *c, const void *key, size_t klen,
                                     const void *val, size_t vlen, shardkv_done_fn done, void *arg);

/* ---------------------------------------------------------------------------
 * Expiry, conditional writes, counters, ranges (doc/contract.md §3)
 * ------------------------------------------------------------------------- */

/* The largest TTL a call may ask for, in ms (2^40, about 35 years). */
#define SHARDKV_MAX_TTL_MS (1ull << 40)

/* Options of shardkv_put_ex(); zero-initialise (all zero: a plain put). */
typedef struct {
	uint64_t ttl_ms; /* > 0: the key expires this many ms after the write; 0: never.
	                  * A put always replaces the key's expiry. */
	bool if_absent;  /* write only when the key does not exist: SHARDKV_EEXISTS */
	bool if_equal;   /* write only when the key holds exactly `expect`: SHARDKV_EMISMATCH */
	shardkv_bytes expect; /* with if_equal: the value the key must hold */
} shardkv_put_options;

/*
 * A put with options: a TTL, and at most one condition, checked atomically
 * with the write on the key's primary. `opt` may be NULL (a plain put).
 * Returns 0 (written), SHARDKV_EEXISTS (if_absent and the key exists),
 * SHARDKV_EMISMATCH (if_equal and the key is absent or holds another value),
 * SHARDKV_EINVAL (both conditions, a TTL over SHARDKV_MAX_TTL_MS), or another
 * code. On a failed condition nothing is written and, when `current` is not
 * NULL, *current is the key's value at that moment (free current->data with
 * shardkv_free()), current->data NULL when the key is absent: no further
 * read is needed. Retries reuse the request id, so the write is applied at
 * most once and a retried write that was applied answers 0.
 */
SHARDKV_API int shardkv_put_ex(shardkv_client *c, const void *key, size_t klen, const void *val,
                               size_t vlen, const shardkv_put_options *opt, shardkv_buf *current);

/* Deletes a key only when it holds exactly `expect` (elen bytes). Returns 0
 * (deleted), SHARDKV_EMISMATCH (absent or another value: nothing deleted;
 * *current as in shardkv_put_ex when not NULL) or another code. Once even if
 * retried. */
SHARDKV_API int shardkv_del_if_equal(shardkv_client *c, const void *key, size_t klen,
                                     const void *expect, size_t elen, shardkv_buf *current);

/* Sets the expiry of an existing key to ttl_ms from now (1..SHARDKV_MAX_TTL_MS)
 * without touching its value. Returns 0, SHARDKV_ENOTFOUND or another code. */
SHARDKV_API int shardkv_expire(shardkv_client *c, const void *key, size_t klen, uint64_t ttl_ms);

/* Clears the expiry of an existing key. Returns 0, SHARDKV_ENOTFOUND, ... */
SHARDKV_API int shardkv_persist(shardkv_client *c, const void *key, size_t klen);

/* On 0 *ms_left is the time left before the key expires, in ms, or -1 when
 * it has no expiry. Returns 0, SHARDKV_ENOTFOUND or another code. */
SHARDKV_API int shardkv_ttl(shardkv_client *c, const void *key, size_t klen, int64_t *ms_left);

/* Adds delta to the decimal signed 64-bit integer a key holds (an absent key
 * counts as 0) and, on 0, sets *result (may be NULL) to the new value. The
 * key's expiry is kept. SHARDKV_EINVAL when the value is not such an integer
 * or the sum would overflow (nothing written). Once even if retried. */
SHARDKV_API int shardkv_incr(shardkv_client *c, const void *key, size_t klen, int64_t delta,
                             int64_t *result);

/* Returns 0 when the key exists, SHARDKV_ENOTFOUND when it does not. */
SHARDKV_API int shardkv_exists(shardkv_client *c, const void *key, size_t klen);

/*
 * The number of keys in [start, end) (empty end: no bound), across every
 * server that owns a part of it, each counting its part in steps; on 0
 * *count is the sum. Not a snapshot: keys written or deleted while the
 * count runs may or may not be counted. SHARDKV_EINVAL for an empty range.
 */
SHARDKV_API int shardkv_count(shardkv_client *c, const void *start, size_t slen, const void *end,
                              size_t elen, uint64_t *count);

/*
 * Deletes every key of [start, end) (empty end: no bound), across every
 * server that owns a part of it, in steps each atomic on its server (a step
 * is retried with its request id: applied once). On 0 *deleted (may be
 * NULL) is how many keys were deleted. On an error the steps before it
 * stay applied; *deleted is then not set. Not atomic as a whole: a key
 * written into the range meanwhile may survive.
 */
SHARDKV_API int shardkv_delrange(shardkv_client *c, const void *start, size_t slen, const void *end,
                                 size_t elen, uint64_t *deleted);

/*
 * Async forms, as the single-key async ops above (same rules for done, the
 * deadline, copies and close). put_ex and del_if_equal: done gets, on
 * SHARDKV_EEXISTS / SHARDKV_EMISMATCH, the key's current value in val
 * (NULL when absent). expire, persist and exists: val NULL. ttl and incr
 * call a shardkv_num_done_fn with the number (ms left or -1; the new
 * value) on status 0.
 */
typedef void (*shardkv_num_done_fn)(void *arg, int status, int64_t n);

SHARDKV_API int shardkv_put_ex_async(shardkv_client *c, const void *key, size_t klen,
                                     const void *val, size_t vlen, const shardkv_put_options *opt,
                                     shardkv_done_fn done, void *arg);
SHARDKV_API int shardkv_del_if_equal_async(shardkv_client *c, const void *key, size_t klen,
                                           const void *expect, size_t elen, shardkv_done_fn done,
                                           void *arg);
SHARDKV_API int shardkv_expire_async(shardkv_client *c, const void *key, size_t klen,
                                     uint64_t ttl_ms, shardkv_done_fn done, void *arg);
SHARDKV_API int shardkv_persist_async(shardkv_client *c, const void *key, size_t klen,
                                      shardkv_done_fn done, void *arg);
SHARDKV_API int shardkv_exists_async(shardkv_client *c, const void *key, size_t klen,
                                     shardkv_done_fn done, void *arg);
SHARDKV_API int shardkv_ttl_async(shardkv_client *c, const void *key, size_t klen,
                                  shardkv_num_done_fn done, void *arg);
SHARDKV_API int shardkv_incr_async(shardkv_client *c, const void *key, size_t klen, int64_t delta,
                                   shardkv_num_done_fn done, void *arg);

/* The result of shardkv_mget(). Free with shardkv_mget_result_free(). */
typedef struct {
	size_t n;            /* number of keys asked */
	shardkv_buf *values; /* values[i] for keys[i]; data NULL when keys[i] is missing */
	size_t nmissing;     /* number of missing keys */
	size_t *missing;     /* indexes of the missing keys, ascending */
} shardkv_mget_result;

/*
 * Reads n keys (the parts owned by different servers concurrently; each part
 * atomically on its server). Returns 0 when all exist and SHARDKV_ENOTFOUND
 * when some are missing; in both cases *out is set (the caller frees it with
 * shardkv_mget_result_free()) and lists the values in key order. On other
 * errors *out is untouched.
 */
SHARDKV_API int shardkv_mget(shardkv_client *c, size_t n, const shardkv_bytes *keys,
                             shardkv_mget_result **out);

/* Frees an mget result. Accepts NULL. */
SHARDKV_API void shardkv_mget_result_free(shardkv_mget_result *r);

/* One server's failure in a multi-node operation. */
typedef struct {
	uint32_t node_id; /* the node, 0 when unknown */
	char *address;    /* its address (owned by the result); may be NULL */
	int err;          /* SHARDKV_E* code */
	size_t nkeys;     /* keys of the operation that went to this node */
} shardkv_node_error;

/* The failures of shardkv_mput(). Free with shardkv_mput_result_free(). */
typedef struct {
	size_t nfailed;             /* failed node parts; 0 on success */
	shardkv_node_error *failed; /* one per failed part */
} shardkv_mput_result;

/*
 * Writes nkeys pairs; keys[i] gets vals[i]. SHARDKV_EINVAL, with nothing
 * written, when nkeys != nvals or nkeys is 0. The pairs of each server are
 * written atomically there; the parts go to their servers concurrently. On a
 * partial failure the return is the first part's error and, when `out` is
 * not NULL, *out lists the failed nodes (the caller frees it with
 * shardkv_mput_result_free()); on 0 *out is set too (nfailed 0).
 */
SHARDKV_API int shardkv_mput(shardkv_client *c, size_t nkeys, const shardkv_bytes *keys,
                             size_t nvals, const shardkv_bytes *vals, shardkv_mput_result **out);

/* Frees an mput result. Accepts NULL. */
SHARDKV_API void shardkv_mput_result_free(shardkv_mput_result *r);

/* Writes nkeys pairs as shardkv_mput() does, every key written expiring
 * ttl_ms after the write (0: never; at most SHARDKV_MAX_TTL_MS). */
SHARDKV_API int shardkv_mput_ex(shardkv_client *c, size_t nkeys, const shardkv_bytes *keys,
                                size_t nvals, const shardkv_bytes *vals, uint64_t ttl_ms,
                                shardkv_mput_result **out);

/* One key/value pair of a scan (value empty for keys-only scans). */
typedef struct {
	shardkv_buf key;   /* the key */
	shardkv_buf value; /* the value */
} shardkv_entry;

/* A page of scan results. Free with shardkv_scan_result_free(). */
typedef struct {
	size_t n;               /* entries */
	shardkv_entry *entries; /* in key order */
	bool more;              /* the range holds more entries after these */
	shardkv_buf next;       /* when more: the start to resume from */
} shardkv_scan_result;

/* What to scan. Zero-initialise. */
typedef struct {
	shardkv_bytes start;  /* inclusive; empty: the beginning of the key space */
	shardkv_bytes end;    /* exclusive; empty: the end of the key space */
	shardkv_bytes prefix; /* non-empty: only keys with this prefix */
	size_t limit;         /* at most this many entries; 0: no limit */
	bool keys_only;       /* leave values empty */
} shardkv_scan_args;

/*
 * Reads the entries of [start, end) in key order, across every server that
 * owns a part of it. Resumable: when the result says `more`, call again with
 * start = result->next. On 0 the caller frees *out with
 * shardkv_scan_result_free().
 */
SHARDKV_API int shardkv_scan_ex(shardkv_client *c, const shardkv_scan_args *a,
                                shardkv_scan_result **out);

/* shardkv_scan_ex() of [start, end) with at most `limit` entries (0: all). */
SHARDKV_API int shardkv_scan(shardkv_client *c, const void *start, size_t slen, const void *end,
                             size_t elen, size_t limit, shardkv_scan_result **out);

/* Every key that starts with `prefix` (plen 0: every key), in key order,
 * values empty. The caller frees *out with shardkv_scan_result_free(). */
SHARDKV_API int shardkv_keys(shardkv_client *c, const void *prefix, size_t plen,
                             shardkv_scan_result **out);

/* Frees a scan result. Accepts NULL. */
SHARDKV_API void shardkv_scan_result_free(shardkv_scan_result *r);

/*
 * A scan cursor the library owns: it fetches pages of `page` entries (0:
 * 256) and keeps the resume key itself, so the caller never sizes a key
 * buffer. shardkv_scan_iter_new copies *a (a->limit bounds the whole
 * iteration, 0: none) and makes no call yet. shardkv_scan_iter_next
 * returns 0 with *entry set to the next entry (valid until the next call on
 * the iterator or its free), 1 at the end, or a negative code (the
 * iterator may be called again: it retries from where it stood). An
 * iterator is used by one thread at a time; free it with
 * shardkv_scan_iter_free before closing the handle.
 */
typedef struct shardkv_scan_iter shardkv_scan_iter;

SHARDKV_API int shardkv_scan_iter_new(shardkv_client *c, const shardkv_scan_args *a, size_t page,
                                      shardkv_scan_iter **out);
SHARDKV_API int shardkv_scan_iter_next(shardkv_scan_iter *it, const shardkv_entry **entry);
SHARDKV_API void shardkv_scan_iter_free(shardkv_scan_iter *it);

/*
 * Asynchronous mget, mput and scan. Each copies its arguments and returns
 * at once: 0 when the op was taken (done will run exactly once, on a
 * library thread), or an error (SHARDKV_EINVAL, SHARDKV_ENOMEM,
 * SHARDKV_ECLOSED once shardkv_close has begun) and done will not run. The
 * op then runs as its blocking form with the deadline fixed at submission,
 * and done gets its status and its result exactly as the blocking form
 * would have filled *out: the callee owns the result (NULL when the
 * blocking form would have left *out untouched) and frees it with its
 * _free function; shardkv_errmsg() in done gives the blocking form's
 * detail. shardkv_close waits for these ops to finish (those that have not
 * reached a server fail with SHARDKV_ECLOSED). done may start further
 * async ops and must not call shardkv_close(). No thread is held per op:
 * its parts are queued like the single-key async ops.
 */
typedef void (*shardkv_mget_done_fn)(void *arg, int status, shardkv_mget_result *r);
typedef void (*shardkv_mput_done_fn)(void *arg, int status, shardkv_mput_result *r);
typedef void (*shardkv_scan_done_fn)(void *arg, int status, shardkv_scan_result *r);

SHARDKV_API int shardkv_mget_async(shardkv_client *c, size_t n, const shardkv_bytes *keys,
                                   shardkv_mget_done_fn done, void *arg);
SHARDKV_API int shardkv_mput_async(shardkv_client *c, size_t nkeys, const shardkv_bytes *keys,
                                   size_t nvals, const shardkv_bytes *vals,
                                   shardkv_mput_done_fn done, void *arg);
SHARDKV_API int shardkv_scan_async(shardkv_client *c, const shardkv_scan_args *a,
                                   shardkv_scan_done_fn done, void *arg);
/* shardkv_mput_async with a TTL, as shardkv_mput_ex. */
SHARDKV_API int shardkv_mput_ex_async(shardkv_client *c, size_t nkeys, const shardkv_bytes *keys,
                                      size_t nvals, const shardkv_bytes *vals, uint64_t ttl_ms,
                                      shardkv_mput_done_fn done, void *arg);

/* ---------------------------------------------------------------------------
 * Admin operations (doc/contract.md §4)
 * ------------------------------------------------------------------------- */

/* Flags of the admin commands. */
#define SHARDKV_WAIT             0x1u /* block until every migration of the new epoch has finished */
#define SHARDKV_NO_REBALANCE     0x2u /* join: register only */
#define SHARDKV_ACCEPT_DATA_LOSS 0x4u /* remove: give away ranges only the node held */

/* What an admin command did. Plain values; nothing to free. */
typedef struct {
	uint64_t epoch;        /* the epoch the command published */
	uint32_t node_id;      /* join: the new node's id */
	size_t nmigrations;    /* migrations the command started */
	uint64_t wait_ms;      /* with SHARDKV_WAIT: how long they took */
	uint64_t first_mig_id; /* the first migration id, 0 when none */
} shardkv_admin_result;

typedef enum {
	SHARDKV_NODE_JOINING = 1,
	SHARDKV_NODE_ACTIVE = 2,
	SHARDKV_NODE_DRAINING = 3,
	SHARDKV_NODE_GONE = 4,
	SHARDKV_NODE_DOWN = 5, /* no heartbeat for longer than the lease; keeps its ranges */
} shardkv_node_state;

/* Returns "joining", "active", "draining", "gone", "down" or "unknown". */
SHARDKV_API const char *shardkv_node_state_name(int state);

/* A node of a configuration. */
typedef struct {
	uint32_t id;           /* node id, from 1 */
	char *address;         /* its URL (owned by the containing result) */
	int state;             /* shardkv_node_state */
	uint64_t keys;         /* status only: keys held */
	uint64_t bytes;        /* status only: key + value bytes held */
	double ops_per_sec;    /* status only: recent op rate */
	uint64_t memory_bytes; /* status only: resident memory */
	uint64_t last_seen_ms; /* status only: ms since its last heartbeat */
	bool has_stats;        /* status only: the fields above are known */
	uint64_t uptime_ms;    /* status only: how long its server has been up; 0: unknown */
} shardkv_node;

/* The most replicas a range can have. */
#define SHARDKV_MAX_REPLICAS 5

/* One entry of the range map: [start, end), its primary (node, which
 * serves reads and writes), its replicas and in-sync replicas (primary
 * first; with one copy both are {node}), its leader epoch (the epoch in
 * which its primary last changed) and its fence: the previous primary of a
 * planned transfer, still in the ISR until it has been copied again, which
 * leads again only when no other member can (0: none). */
typedef struct {
	shardkv_buf start;                       /* inclusive; empty: beginning of the key space */
	shardkv_buf end;                         /* exclusive; empty: end of the key space */
	uint32_t node;                           /* the primary (owner) */
	size_t nreplicas;                        /* 1..SHARDKV_MAX_REPLICAS */
	uint32_t replicas[SHARDKV_MAX_REPLICAS]; /* node ids, primary first */
	size_t ninsync;                          /* 1..nreplicas */
	uint32_t insync[SHARDKV_MAX_REPLICAS];   /* in-sync replicas, primary first */
	uint64_t leader_epoch;                   /* epoch of the last change of primary */
	uint32_t fence;                          /* previous primary being copied again; 0: none */
} shardkv_range;

/* A migration in flight. */
typedef struct {
	uint64_t id;              /* migration id */
	shardkv_buf start;        /* the moving range */
	shardkv_buf end;          /* empty: end of the key space */
	uint32_t from;            /* source node */
	uint32_t to;              /* destination node */
	const char *phase;        /* "pending", "copying", "catchup", "fenced", ... (static) */
	uint64_t keys_copied;     /* acknowledged by the destination */
	uint64_t bytes_copied;    /* acknowledged by the destination */
	uint64_t keys_total;      /* estimate; 0: unknown */
	uint64_t bytes_total;     /* estimate; 0: unknown */
	uint64_t eta_ms;          /* estimate; 0: unknown */
	uint64_t rate_bytes_s;    /* measured copy rate (status only); 0: unknown */
	uint64_t progress_age_ms; /* status only: since the source last reported progress */
} shardkv_migration;

/* A controller replica (status only). */
typedef struct {
	uint32_t id;      /* replica id */
	char *address;    /* its URL (owned by the containing result) */
	const char *role; /* "leader", "follower", "standalone", "candidate", "unknown" (static) */
	uint64_t term;    /* current term; 0 standalone */
	uint64_t index;   /* last applied index; 0 standalone */
} shardkv_controller;

/* One decision of the controller's automatic balancer (doc/scheduler.md):
 * in a status its latest, in a rebalance plan its next. */
typedef struct {
	uint64_t time_ms; /* Unix ms it was published; 0 in a plan */
	char *kind;       /* "move", "transfer", "split", "merge", "hot_key" (owned) */
	char *reason;     /* "bytes", "ops", "primaries", "cold", "hot_key" (owned by the result) */
	char *what;       /* printable detail: range, nodes, sizes (owned by the result) */
} shardkv_balancer_decision;

/* A key span an administrator's move pinned against the automatic balancer
 * (doc/scheduler.md "Pins"): the balancer leaves every range overlapping it
 * alone until the next rebalance. */
typedef struct {
	shardkv_buf start; /* inclusive; empty: beginning of the key space */
	shardkv_buf end;   /* exclusive; empty: end of the key space */
} shardkv_pin;

/* A configuration, or (from shardkv_status) a configuration with live
 * statistics. Free with shardkv_config_free(). */
typedef struct {
	uint64_t epoch;                      /* the configuration's epoch */
	size_t nnodes;                       /* nodes */
	shardkv_node *nodes;                 /* sorted by id */
	size_t nranges;                      /* ranges */
	shardkv_range *ranges;               /* sorted by start, covering the key space */
	size_t nmigrations;                  /* migrations in flight */
	shardkv_migration *migrations;       /* with live progress in a status */
	size_t ncontrollers;                 /* status only */
	shardkv_controller *controllers;     /* status only */
	size_t nbalancer;                    /* status only */
	shardkv_balancer_decision *balancer; /* status only: the latest, oldest first */
	size_t npins;                        /* pins */
	shardkv_pin *pins;                   /* sorted by start, disjoint */
	uint32_t min_insync; /* in-sync replicas a write needs (the controller's --min-insync,
	                        capped per range by its replicas) */
} shardkv_config;

/* Registers the server at `address` (SHARDKV_NO_REBALANCE, SHARDKV_WAIT).
 * On 0 *out (may be NULL) says the new epoch and node id. */
SHARDKV_API int shardkv_join(shardkv_client *c, const char *address, unsigned flags,
                             shardkv_admin_result *out);

/* Drains and removes `node`, a node id ("3") or address (SHARDKV_WAIT). */
SHARDKV_API int shardkv_leave(shardkv_client *c, const char *node, unsigned flags,
                              shardkv_admin_result *out);

/* Gives [start, end) to `node` (id or address), copying at most rate_mb_s
 * MB/s (0: unlimited) (SHARDKV_WAIT). */
SHARDKV_API int shardkv_move(shardkv_client *c, const void *start, size_t slen, const void *end,
                             size_t elen, const char *node, uint32_t rate_mb_s, unsigned flags,
                             shardkv_admin_result *out);

/*
 * Forgets `node` (id or address), which must be down (doc/contract.md §4):
 * SHARDKV_EPERM for a live node (use shardkv_leave) and, without
 * SHARDKV_ACCEPT_DATA_LOSS, for a node that holds the only copy of ranges;
 * with it those ranges go to another node empty. On 0 *out (may be NULL)
 * holds the epoch and *ranges_lost (may be NULL) how many ranges lost
 * their data.
 */
SHARDKV_API int shardkv_remove(shardkv_client *c, const char *node, unsigned flags,
                               shardkv_admin_result *out, uint32_t *ranges_lost);

/*
 * Cancels the migration `migration_id` (shardkv_migration.id, as the status
 * lists it) if it has not fenced yet: the range stays with its source and
 * the destination drops what it received. On 0 *out (may be NULL) holds the
 * epoch that records the cancellation. SHARDKV_ENOTFOUND when no such
 * migration is in flight (unknown, finished or already cancelled),
 * SHARDKV_EBUSY when it has fenced (too late: it completes on its own),
 * SHARDKV_EINVAL for id 0.
 */
SHARDKV_API int shardkv_cancel(shardkv_client *c, uint64_t migration_id, shardkv_admin_result *out);

/* Evens out data size across nodes (SHARDKV_WAIT). */
SHARDKV_API int shardkv_rebalance(shardkv_client *c, uint32_t rate_mb_s, unsigned flags,
                                  shardkv_admin_result *out);

/* One migration of a plan: [start, end) would move from node `from` to
 * node `to`. */
typedef struct {
	shardkv_buf start; /* inclusive; empty: beginning of the key space */
	shardkv_buf end;   /* exclusive; empty: end of the key space */
	uint32_t from;     /* the current owner */
	uint32_t to;       /* the new owner */
	uint64_t keys;     /* estimate from the source's last report; 0: unknown */
	uint64_t bytes;    /* estimate from the source's last report; 0: unknown */
} shardkv_plan_step;

/* What a move or rebalance would do (doc/contract.md §4 --dry-run). Free
 * with shardkv_plan_free(). */
typedef struct {
	uint64_t epoch;           /* the latest epoch, which the dry run left as it was */
	size_t nsteps;            /* migrations the command would start; 0: nothing moves */
	shardkv_plan_step *steps; /* in the order the command would start them */
	size_t nbalancer;         /* rebalance: the balancer's next decisions */
	shardkv_balancer_decision *balancer; /* (empty with --auto-balance off) */
} shardkv_plan;

/*
 * Dry runs: the controller plans the move (arguments as shardkv_move) or
 * the rebalance exactly as the command would, with the same planning code
 * on the same state, and answers the plan without publishing anything. On
 * 0 the caller frees *out with shardkv_plan_free(). Refused like the
 * command itself (SHARDKV_EINVAL for an empty range or an unknown node,
 * SHARDKV_EPERM for replicated ranges, ...); SHARDKV_EINVAL also from a
 * controller too old to know dry runs (it then changes nothing either).
 * The plan is a prediction: a real run afterwards plans again, on the state
 * of that moment.
 */
SHARDKV_API int shardkv_move_plan(shardkv_client *c, const void *start, size_t slen,
                                  const void *end, size_t elen, const char *node,
                                  uint32_t rate_mb_s, shardkv_plan **out);
SHARDKV_API int shardkv_rebalance_plan(shardkv_client *c, uint32_t rate_mb_s, shardkv_plan **out);

/* Frees a plan. Accepts NULL. */
SHARDKV_API void shardkv_plan_free(shardkv_plan *plan);

/* Fetches the configuration at `epoch` (0: the latest). On 0 the caller frees
 * *out with shardkv_config_free(). SHARDKV_ENOTFOUND for an unknown epoch. */
SHARDKV_API int shardkv_config_get(shardkv_client *c, uint64_t epoch, shardkv_config **out);

/* Fetches the latest configuration with live statistics, migrations in
 * flight and controller replicas. On 0 the caller frees *out with
 * shardkv_config_free(). */
SHARDKV_API int shardkv_status(shardkv_client *c, shardkv_config **out);

/* Frees a configuration. Accepts NULL. */
SHARDKV_API void shardkv_config_free(shardkv_config *cfg);

#ifdef __cplusplus
}
#endif

#endif
