/*
 * lease.c - the lease rule of lease.h.
 */
#include "common/lease.h"

bool
kv_lease_held(uint64_t sent_ns, uint64_t lease_ns, uint64_t now_ns)
{
	return sent_ns != 0 && now_ns >= sent_ns && now_ns - sent_ns < lease_ns;
}

uint64_t
kv_lease_down_ns(uint64_t lease_ns, uint64_t margin_ns, uint64_t election_ns)
{
	return lease_ns + margin_ns + election_ns;
}

uint64_t
kv_lease_heard(uint64_t last_seen_ns, uint64_t since_ns)
{
	return last_seen_ns > since_ns ? last_seen_ns : since_ns;
}

bool
kv_lease_down_due(uint64_t heard_ns, uint64_t down_ns, uint64_t now_ns)
{
	return now_ns > heard_ns && now_ns - heard_ns > down_ns;
}
