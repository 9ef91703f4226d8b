/*
 * heartbeat.h - the heartbeat thread of the shard server (heartbeat.c).
 */
#ifndef KV_SHARDSERVER_HEARTBEAT_H
#define KV_SHARDSERVER_HEARTBEAT_H

#include "shardserver/server_int.h"

/* The heartbeat thread (arg: the kv_server): reports every second until
 * s->stopping. */
void *kv_srv_heartbeat_main(void *arg);

#endif
