/*
 * ctl_client.h - raw AdminRequests to a controller, for the controller
 * tests that build requests field by field (retried, malformed or held
 * ones included): the request goes out exactly as given (its version and
 * request id are the caller's), the answer comes back as the generated
 * protobuf struct of proto/shardkv.pb-c.h.
 */
#ifndef KV_TESTS_SUPPORT_CTL_CLIENT_H
#define KV_TESTS_SUPPORT_CTL_CLIENT_H

#include "common/rpc.h"
#include "proto/shardkv.pb-c.h"

#include <stdint.h>

/*
 * Packs rq, sends it over cli and waits up to timeout_ms. Returns the
 * answer (free it with ctl_client_free), or NULL with *rv (may be NULL) set
 * to the transport's error, or to KV_EPROTO when the answer does not
 * unpack; *rv is KV_OK with an answer.
 */
Shardkv__AdminResponse *ctl_client_call(kv_rpc_client *cli, const Shardkv__AdminRequest *rq,
                                        uint32_t timeout_ms, int *rv);

/* Frees an answer of ctl_client_call. Accepts NULL. */
void ctl_client_free(Shardkv__AdminResponse *r);

/* The answer's status as a code of common/err.h (KV_OK or a KV_E*). */
int ctl_client_err(const Shardkv__AdminResponse *r);

#endif
