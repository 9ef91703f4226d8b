/*
 * ctlcall.c - the shard server's calls to the controller (ctlcall.h): one
 * AdminRequest at a time per caller, over one client per --controller
 * address, rotating to the next address on a transport failure or a
 * NOT_LEADER answer. The watch, heartbeat and migration threads and the
 * graceful leave all call through here; ctl_mu (a leaf) protects only the
 * index of the address to try first. No lock is held across the call.
 */
#include "shardserver/ctlcall.h"
#include "common/err.h"

int
kv_server__ctl_call(kv_server *s, kv_admin_req *rq, kv_admin_resp *resp, uint32_t timeout_ms)
{
	int rv = KV_EUNAVAIL;

	rq->client_id = s->admin_client_id;
	rq->auth = kv_server__auth(s);
	for (size_t attempt = 0; attempt < s->cfg->nctl; attempt++) {
		nng_msg *req = NULL, *rep = NULL;
		size_t idx;

		pthread_mutex_lock(&s->ctl_mu);
		idx = s->ctl_idx;
		pthread_mutex_unlock(&s->ctl_mu);
		rq->request_id = atomic_fetch_add(&s->admin_req_id, 1);
		if ((rv = kv_admin_req_encode(rq, &req)) != 0)
			return rv;
		rv = kv_rpc_call(s->ctl[idx], req, &rep, timeout_ms);
		if (rv == 0) {
			rv = kv_admin_resp_decode(nng_msg_body(rep), nng_msg_len(rep), resp);
			nng_msg_free(rep);
			/* A follower answers NOT_LEADER, which reads as EUNAVAIL. */
			if (rv == 0 && !(resp->err == KV_EUNAVAIL && s->cfg->nctl > 1))
				return KV_OK;
			if (rv == 0) {
				kv_admin_resp_fini(resp);
				rv = KV_EUNAVAIL;
			}
		}
		pthread_mutex_lock(&s->ctl_mu);
		if (s->ctl_idx == idx)
			s->ctl_idx = (idx + 1) % s->cfg->nctl;
		pthread_mutex_unlock(&s->ctl_mu);
		if (rv == KV_ETIMEDOUT && rq->op == KV_ADM_WATCH)
			return rv;
	}
	return rv;
}
