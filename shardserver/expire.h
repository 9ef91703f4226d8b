/*
 * expire.h - active expiry: the thread that removes expired keys
 * (expire.c, doc/store.md "Expiry").
 */
#ifndef KV_SHARDSERVER_EXPIRE_H
#define KV_SHARDSERVER_EXPIRE_H

#include "shardserver/server_int.h"

/* Thread body (arg: the kv_server): every EXPIRE_PERIOD_MS, samples the
 * keys with a deadline of each store partition and reclaims the expired
 * ones, until s->stopping. */
void *kv_srv_expire_main(void *arg);

/* One pass over every partition (what the thread does each period).
 * Returns the keys reclaimed. */
uint64_t kv_srv_expire_pass(kv_server *s);

#endif
