/*
 * ctl_client.c - raw AdminRequests to a controller (ctl_client.h).
 */
#include "tests/support/ctl_client.h"
#include "common/err.h"
#include "proto/wire.h"

#include <stddef.h>

Shardkv__AdminResponse *
ctl_client_call(kv_rpc_client *cli, const Shardkv__AdminRequest *rq, uint32_t timeout_ms, int *rv)
{
	nng_msg *m, *reply = NULL;
	Shardkv__AdminResponse *r;
	int dummy, *err = rv != NULL ? rv : &dummy;

	size_t n = shardkv__admin_request__get_packed_size(rq);
	if ((*err = nng_msg_alloc(&m, n) != 0 ? KV_ENOMEM : KV_OK) != KV_OK)
		return NULL;
	shardkv__admin_request__pack(rq, nng_msg_body(m));
	if ((*err = kv_rpc_call(cli, m, &reply, timeout_ms)) != KV_OK)
		return NULL;
	r = shardkv__admin_response__unpack(NULL, nng_msg_len(reply), nng_msg_body(reply));
	nng_msg_free(reply);
	if (r == NULL)
		*err = KV_EPROTO;
	return r;
}

void
ctl_client_free(Shardkv__AdminResponse *r)
{
	if (r != NULL)
		shardkv__admin_response__free_unpacked(r, NULL);
}

int
ctl_client_err(const Shardkv__AdminResponse *r)
{
	return kv_err_from_wire(r->status);
}
