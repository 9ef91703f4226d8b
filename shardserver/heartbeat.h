/*
 * heartbeat.h - the heartbeat thread of the shard server (heartbeat.c).
 */
#ifndef KV_SHARDSERVER_HEARTBEAT_H
#define KV_SHARDSERVER_HEARTBEAT_H

#include "shardserver/server_int.h"

/* The heartbeat thread (arg: the kv_server): reports every second until
 * s->stopping. */
void *kv_srv_heartbeat_main(void *arg);

/* The lease thread (arg: the kv_server): renews the lease with a light
 * heartbeat every renew_ns, logs its loss and regain once each, and marks
 * the server gone when the controller says so, until s->stopping. */
void *kv_srv_lease_main(void *arg);

#endif
