/*
 * follow.h - following the controller's configurations (follow.c).
 */
#ifndef KV_SHARDSERVER_FOLLOW_H
#define KV_SHARDSERVER_FOLLOW_H

#include "shardserver/server_int.h"

/* The watch thread (arg: the kv_server): registers, then applies every
 * configuration in epoch order until s->stopping. */
void *kv_srv_watch_main(void *arg);

#endif
