/*
 * heartbeat.h - the heartbeat thread of the shard server (heartbeat.c).
 */
#ifndef KV_SHARDSERVER_HEARTBEAT_H
#define KV_SHARDSERVER_HEARTBEAT_H

#include "shardserver/server_int.h"

/* The heartbeat thread (arg: the kv_server): reports every second until
 * s->stopping. */
void *kv_srv_heartbeat_main(void *arg);

/*
 * The decayed read and write rates (rd, wr) of the ranges rs[0..n) a node
 * leads after its ranges changed, from those of the ranges ors[0..m) it led
 * at its last count (ord, owr): a range with the bounds of one led before
 * keeps its rates; one inside a range led before (a cut) takes that
 * range's rates in the share of its counted bytes (none when that range
 * held none); one made of ranges led before (a merge) takes the sum of
 * theirs. Any other part starts from zero: a range new to the node, or the
 * part of one that overlaps a range led before only in part. Both lists in
 * key order, without overlaps (an empty end: the end of the key space).
 */
void kv_srv_carry_rates(const kv_admin_range_stat *ors, const double *ord, const double *owr,
                        size_t m, const kv_admin_range_stat *rs, double *rd, double *wr, size_t n);

/* The lease thread (arg: the kv_server): renews the lease with a light
 * heartbeat every renew_ns, logs its loss and regain once each, and marks
 * the server gone when the controller says so, until s->stopping. */
void *kv_srv_lease_main(void *arg);

#endif
