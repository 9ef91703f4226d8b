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

#endif
