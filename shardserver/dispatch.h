/*
 * dispatch.h - the shard server's request handler (dispatch.c).
 */
#ifndef KV_SHARDSERVER_DISPATCH_H
#define KV_SHARDSERVER_DISPATCH_H

#include "shardserver/server_int.h"

/* The kv_rpc_handler of the --listen endpoint (arg: the kv_server). Runs
 * on nng's threads; counts itself in s->inflight until its final reply,
 * which it may defer until the log holds what the request did or saw
 * (returns KV_RPC_DEFERRED then). */
int kv_srv_rpc_handler(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p);

/* Removes key if it has expired, as a write of this node's: only where the
 * key is served here and not fenced, logged and replicated as a delete and
 * recorded for a migration of its range (doc/store.md "Expiry"). Returns 0
 * (removed), KV_ENOTFOUND (absent or not expired) or why the write was
 * refused. */
int kv_srv_reclaim_key(kv_server *s, const void *key, size_t klen);

#endif
