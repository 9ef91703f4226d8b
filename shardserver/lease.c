/*
 * lease.c - whether the server holds its lease (server_int.h
 * kv_srv_lease_ok): the request path (dispatch.c), the lease thread
 * (heartbeat.c) and /healthz (metrics_srv.c) ask it. It reads the lease
 * fields the lease thread writes and changes nothing.
 */
#include "shardserver/server_int.h"
#include "common/lease.h"

#include <stdio.h>

bool
kv_srv_lease_ok(kv_server *s, char *msg, size_t msglen)
{
	uint64_t sent = atomic_load(&s->lease_sent_ns), now;

	if (atomic_load(&s->gone)) {
		snprintf(msg, msglen, "node is gone from the cluster (removed or left)");
		return false;
	}
	now = kv_now_ns();
	if (kv_lease_held(sent, s->lease_ns, now))
		return true;
	if (sent == 0)
		snprintf(msg, msglen, "no lease yet: the controller has not confirmed this node");
	else
		snprintf(msg, msglen, "lease expired: controller unreachable for %llu ms",
		         (unsigned long long)((now - sent) / 1000000u));
	return false;
}
