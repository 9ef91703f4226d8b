/*
 * lease.h - the lease rule (doc/replication.md "Liveness and leases"), as
 * arithmetic on times the caller passes in, so that tests can drive it
 * with clocks of their own (tests/unit/test_lease.c).
 *
 * A server holds its lease for lease_ns from the send time of the last
 * renewal the controller leader answered OK, on the server's monotonic
 * clock. The leader counts a node as heard at the receive time of its
 * last heartbeat, or at the moment it started counting as leader
 * (whichever is later), on its own monotonic clock, and declares it down
 * once down_ns has passed since: down_ns = lease + margin + election
 * timeout (0 for a single controller). The send comes before the receive,
 * and the margin covers drift between the two clocks' rates up to
 * margin / (2 lease + margin); the election timeout covers a deposed
 * leader that renews leases after its successor started counting. So a
 * server has stopped serving before its node can be declared down.
 *
 * All times are nanoseconds; 0 as a send or receive time means "never".
 */
#ifndef KV_COMMON_LEASE_H
#define KV_COMMON_LEASE_H

#include <stdbool.h>
#include <stdint.h>

/* Server: whether the lease renewed by the heartbeat sent at sent_ns
 * (0: none yet) still holds at now_ns. */
bool kv_lease_held(uint64_t sent_ns, uint64_t lease_ns, uint64_t now_ns);

/* Controller: the silence after which a node is declared down. election_ns
 * is the Raft election timeout, 0 for a single controller. */
uint64_t kv_lease_down_ns(uint64_t lease_ns, uint64_t margin_ns, uint64_t election_ns);

/* Controller: when a node counts as last heard: its last heartbeat's
 * receive time (0: none), but never before since_ns, the moment this
 * leader started counting. */
uint64_t kv_lease_heard(uint64_t last_seen_ns, uint64_t since_ns);

/* Controller: whether a node heard at heard_ns may be declared down at
 * now_ns (false while now_ns is not past heard_ns). */
bool kv_lease_down_due(uint64_t heard_ns, uint64_t down_ns, uint64_t now_ns);

#endif
