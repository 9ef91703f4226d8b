/*
 * err.h - the one error vocabulary of shardkv.
 *
 * Every function that can fail returns 0 or one negative KV_E* code from the
 * table below. Foreign codes (errno, nng, protobuf, wire status) are
 * translated once, at the boundary where they enter the program.
 */
#ifndef KV_COMMON_ERR_H
#define KV_COMMON_ERR_H

/* X(name, value, message). Values are stable: they are logged and tested. */
#define KV_ERR_MAP(X)                                                                              \
	X(NOTFOUND, -1, "key not found")                                                           \
	X(INVAL, -2, "invalid argument")                                                           \
	X(NOMEM, -3, "out of memory")                                                              \
	X(TOOBIG, -4, "key or value exceeds the configured size limit")                            \
	X(WRONGOWNER, -5, "this node does not own the key")                                        \
	X(STALE, -6, "configuration epoch is stale")                                               \
	X(TIMEDOUT, -7, "timed out")                                                               \
	X(UNAVAIL, -8, "service unavailable")                                                      \
	X(EXISTS, -9, "already exists")                                                            \
	X(IO, -10, "input/output error")                                                           \
	X(CORRUPT, -11, "data is corrupt")                                                         \
	X(PROTO, -12, "malformed or unexpected message")                                           \
	X(AUTH, -13, "authentication failed")                                                      \
	X(CLOSED, -14, "object is closed")                                                         \
	X(BUSY, -15, "resource busy, try again")                                                   \
	X(MOVING, -16, "range is being handed to another node")                                    \
	X(PERM, -17, "operation not permitted")                                                    \
	X(NOSPC, -18, "no space left on device")                                                   \
	X(LIMIT, -19, "request exceeds a configured limit")                                        \
	X(ADDRINUSE, -20, "address in use")                                                        \
	X(INTERNAL, -21, "internal error")                                                         \
	X(MISMATCH, -22, "condition not met: the current value differs")

enum kv_err {
	KV_OK = 0,
#define KV__ERR_ENUM(name, value, msg) KV_E##name = (value),
	KV_ERR_MAP(KV__ERR_ENUM)
#undef KV__ERR_ENUM
};

/* The lowest (most negative) code in the table. */
#define KV_ERR_MIN KV_EMISMATCH

/* Returns a static message for a KV_E* code ("success" for 0, "unknown error" otherwise). */
const char *kv_strerror(int err);

/* Returns the short upper-case name of a code ("ENOTFOUND"), or "EUNKNOWN". */
const char *kv_errname(int err);

/* Translates a positive errno value into a KV_E* code. */
int kv_err_from_errno(int e);

/* Translates an nng error code into a KV_E* code. */
int kv_err_from_nng(int rv);

#endif
