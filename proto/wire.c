/*
 * wire.c - KV_E* codes to wire statuses and back.
 *
 * Both directions are generated from one table of pairs, so a pair cannot be
 * changed on one side only; a KV_E* code added to common/err.h without a row
 * here fails the build (the _Static_assert below), and tests/test_wire.c
 * states every pair a second time. The only wire status outside the table is
 * STATUS_NOT_LEADER: it has no KV_E* code and reads as KV_EUNAVAIL, the
 * closest meaning ("not here, try again elsewhere").
 *
 * This module never allocates and keeps no state.
 */
#include "proto/wire.h"

#include "common/err.h"
#include "proto/shardkv.pb-c.h"

/* X(KV_E* name without KV_E, STATUS_* name without STATUS_), one row per code of KV_ERR_MAP. */
#define KV_WIRE_MAP(X)                                                                             \
	X(NOTFOUND, NOT_FOUND)                                                                     \
	X(INVAL, INVALID)                                                                          \
	X(NOMEM, NO_MEMORY)                                                                        \
	X(TOOBIG, TOO_BIG)                                                                         \
	X(WRONGOWNER, WRONG_OWNER)                                                                 \
	X(STALE, STALE_EPOCH)                                                                      \
	X(TIMEDOUT, TIMED_OUT)                                                                     \
	X(UNAVAIL, UNAVAILABLE)                                                                    \
	X(EXISTS, EXISTS)                                                                          \
	X(IO, IO_ERROR)                                                                            \
	X(CORRUPT, CORRUPT)                                                                        \
	X(PROTO, PROTOCOL_ERROR)                                                                   \
	X(AUTH, AUTH_FAILED)                                                                       \
	X(CLOSED, CLOSED)                                                                          \
	X(BUSY, BUSY)                                                                              \
	X(MOVING, MOVING)                                                                          \
	X(PERM, PERMISSION)                                                                        \
	X(NOSPC, NO_SPACE)                                                                         \
	X(LIMIT, LIMIT)                                                                            \
	X(ADDRINUSE, ADDR_IN_USE)                                                                  \
	X(INTERNAL, INTERNAL)                                                                      \
	X(MISMATCH, MISMATCH)

/*
 * Every KV_E* code has a row: with the switch below refusing duplicate cases,
 * equal counts make the table a one-to-one map.
 */
#define KV__COUNT(...) +1
_Static_assert(0 KV_WIRE_MAP(KV__COUNT) == 0 KV_ERR_MAP(KV__COUNT),
               "KV_WIRE_MAP needs exactly one row per KV_ERR_MAP code");
#undef KV__COUNT

int
kv_err_from_wire(int status)
{
	switch (status) {
	case SHARDKV__STATUS__STATUS_OK:
		return KV_OK;
#define KV__WIRE_TO_ERR(kv, wire)                                                                  \
	case SHARDKV__STATUS__STATUS_##wire:                                                       \
		return KV_E##kv;
		KV_WIRE_MAP(KV__WIRE_TO_ERR)
#undef KV__WIRE_TO_ERR
	case SHARDKV__STATUS__STATUS_NOT_LEADER:
		return KV_EUNAVAIL;
	default:
		return KV_EPROTO;
	}
}

int
kv_wire_from_err(int err)
{
	switch (err) {
	case KV_OK:
		return SHARDKV__STATUS__STATUS_OK;
#define KV__ERR_TO_WIRE(kv, wire)                                                                  \
	case KV_E##kv:                                                                             \
		return SHARDKV__STATUS__STATUS_##wire;
		KV_WIRE_MAP(KV__ERR_TO_WIRE)
#undef KV__ERR_TO_WIRE
	default:
		return SHARDKV__STATUS__STATUS_INTERNAL;
	}
}
