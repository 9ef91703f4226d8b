/*
 * expire.c - active expiry (expire.h).
 *
 * DESIGN. Expired keys already read as absent (the store checks deadlines
 * on every read); this thread gives their memory back. Like Redis's active
 * expiry it samples: each period it visits every partition of the store,
 * looks at up to SAMPLE keys with a deadline (kv_store_expire_sample, from
 * where it stopped last time, one partition lock for the sample), and
 * reclaims the expired ones it saw; while more than a quarter of a sample
 * had expired it samples that partition again, up to PASS_MAX keys per
 * pass. Each reclaim is one write through the dispatcher
 * (kv_srv_reclaim_key): ownership, the fence of a moving range, the log
 * and the replication tap, like a client's delete, one key at a time, so
 * requests interleave with a pass and are never held for more than one
 * key's write. Only the primary of a range reclaims: on a backup, a range
 * arriving or one being handed over the write is refused and the key is
 * left to the node that serves it, whose delete reaches the copies.
 *
 * What this does not do: decide expiry for reads (store.c does, at once),
 * or touch keys without a deadline (the sample walks only the partition's
 * deadline index).
 */
#include "shardserver/expire.h"
#include "shardserver/dispatch.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

#define EXPIRE_PERIOD_MS 100u  /* between passes */
#define SAMPLE           20u   /* keys looked at per sample */
#define PASS_MAX         4096u /* keys looked at per partition per pass */

/* Expired keys found by one sample, copied out of the partition. */
typedef struct {
	kv_buf keys; /* u32 klen, key, ... */
	size_t n;    /* keys */
	bool oom;
} found_acc;

static void
found_cb(void *arg, const uint8_t *key, size_t klen, bool expired)
{
	found_acc *a = arg;
	uint32_t kl = (uint32_t)klen;

	(void)expired;
	if (a->oom)
		return;
	if (kv_buf_append(&a->keys, &kl, sizeof(kl)) != 0 ||
	    kv_buf_append(&a->keys, key, klen) != 0) {
		a->oom = true;
		return;
	}
	a->n++;
}

uint64_t
kv_srv_expire_pass(kv_server *s)
{
	unsigned nparts = kv_store_partitions(s->store);
	found_acc a = {0};
	uint64_t reclaimed = 0;

	for (unsigned p = 0; p < nparts && !atomic_load(&s->stopping); p++) {
		size_t looked = 0;
		for (;;) {
			size_t seen = 0;
			a.keys.len = 0;
			a.n = 0;
			a.oom = false;
			if (kv_store_expire_sample(s->store, p, SAMPLE, found_cb, &a, &seen) != 0)
				break;
			size_t got = 0;
			for (size_t off = 0; off < a.keys.len;) {
				uint32_t kl;
				memcpy(&kl, a.keys.data + off, sizeof(kl));
				if (kv_srv_reclaim_key(s, a.keys.data + off + sizeof(kl), kl) ==
				    KV_OK)
					got++;
				off += sizeof(kl) + kl;
			}
			reclaimed += got;
			looked += seen;
			/* Again while the partition looks full of expired keys that
			 * are this node's to reclaim (a backup's are not). */
			if (seen < SAMPLE || got * 4 <= seen || looked >= PASS_MAX ||
			    atomic_load(&s->stopping))
				break;
		}
	}
	kv_buf_fini(&a.keys);
	return reclaimed;
}

void *
kv_srv_expire_main(void *arg)
{
	kv_server *s = arg;

	kv_log_thread_name("kv-expire");
	while (!atomic_load(&s->stopping)) {
		kv_server__nap(s, EXPIRE_PERIOD_MS);
		if (atomic_load(&s->stopping))
			break;
		/* Nothing to do before the first configuration: nothing is served. */
		if (atomic_load(&s->epoch) == 0)
			continue;
		kv_store_stats st;
		kv_store_get_stats(s->store, &st);
		if (st.expiring > 0)
			(void)kv_srv_expire_pass(s);
	}
	return NULL;
}
