/*
 * ctlcall.h - calls from the shard server to the controller (ctlcall.c).
 */
#ifndef KV_SHARDSERVER_CTLCALL_H
#define KV_SHARDSERVER_CTLCALL_H

#include "shardserver/server_int.h"

/* Sends an AdminRequest to the controller (rotating through the addresses
 * on failure) and decodes the answer. Fills the sender ids. On 0 the caller
 * frees *resp with kv_admin_resp_fini. Returns 0 or a transport KV_E* code.
 * Thread-safe; blocks the caller up to timeout_ms per address tried. */
int kv_server__ctl_call(kv_server *s, kv_admin_req *rq, kv_admin_resp *resp, uint32_t timeout_ms);

#endif
