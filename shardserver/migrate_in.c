/*
 * migrate_in.c - the destination side of range transfer (migrate.h;
 * doc/protocol.md "Migrations"; wire: Transfer in shardkv.proto).
 *
 * DESIGN. Transfer messages are applied on the nng thread that receives
 * them, in seq order per stream (kv_mig_in.mu), without waiting for anyone.
 * Begin is refused with BUSY until the configuration of the migration's
 * epoch is applied, marks the range INCOMING (clients get MOVING), and
 * clears stale data in bounded steps; Commit makes it SERVE. Duplicates
 * (seq <= acked) are acknowledged again without being applied, gaps are
 * refused with KV_EINVAL.
 *
 * Large values arrive in slices (KeyValue.value_offset and value_total)
 * over consecutive messages. They are reassembled into one buffer per
 * stream (at most the server's max value); any slice that does not continue
 * the value in progress (offset, total, key, seq, interleaving, a value
 * still incomplete at the end of the copy or at the fence) is refused with
 * KV_EPROTO and the partial buffer dropped, and a value reaches the store
 * only when it is complete. Duplicates and refusals need nothing more: a
 * duplicate is never applied, and a refusal makes the source restart from
 * Begin, which drops any partial value.
 *
 * Nothing here waits for another server or decides ownership beyond the
 * stream; the server's configuration thread forgets streams it drops
 * (kv_mig_in_forget). This file reaches the server only through
 * kv_mig_env.
 */
#include "common/err.h"
#include "common/log.h"
#include "common/slice.h"
#include "shardserver/migrate_int.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define COMP "migrate"

/*
 * Reassembly of one value that arrives in slices (KeyValue.value_total != 0),
 * in chunk entries or in DeltaRecords. The sender must send the slices of a
 * value in order, from offset 0, with the same key and total (and, in
 * deltas, the same record seq), and nothing else in between; anything else
 * is KV_EPROTO and the partial value is dropped. The value reaches the store
 * only when complete. One buffer per incoming stream, of at most the
 * server's max value.
 */
typedef struct {
	bool active;    /* a value is being assembled */
	bool delta;     /* its slices are DeltaRecords (else chunk entries) */
	uint64_t seq;   /* delta: the DeltaRecord.seq of every slice */
	kv_buf key;     /* its key */
	kv_buf val;     /* the bytes so far; reserved to `total` at the first slice */
	uint64_t total; /* value_total */
} slice_rx;

/* An incoming stream: this node is the destination. */
typedef struct kv_mig_in {
	uint64_t id;           /* Migration.id */
	pthread_mutex_t mu;    /* serialises the stream; protects down to the blank line */
	pthread_cond_t cv;     /* acked moved (a message waiting for its predecessor) */
	uint64_t epoch;        /* Migration.epoch from Begin */
	kv_buf start;          /* the range */
	kv_buf end;            /* empty: end of the key space */
	uint32_t from;         /* source node */
	uint64_t acked;        /* highest contiguous seq applied */
	uint64_t keys;         /* keys received */
	uint64_t bytes;        /* bytes received */
	bool committed;        /* serving the range */
	slice_rx rx;           /* the split value being reassembled */
	uint64_t split_chunks; /* split values assembled from chunks, this attempt */
	uint64_t split_deltas; /* split values assembled from delta records */
	/* Where what arrives of the range is logged (doc/durability.md
	 * "Migrations"): opened by Begin, adopted by the fence, closed by the
	 * commit, an abort, a new Begin or the end of the stream. */
	kv_dur_side *side;
	bool fenced; /* the side log is adopted: only Commit or Abort may follow */

	struct kv_mig_in *next; /* kv_mig.ins list */
} kv_mig_in;

/* Drops a partially assembled value (caller holds in->mu). */
static void
rx_drop(slice_rx *rx)
{
	kv_buf_fini(&rx->val);
	rx->active = false;
	rx->total = 0;
}

/*
 * Takes one slice (caller holds in->mu). `delta`/`seq` say where it came
 * from. On 0, *complete tells whether rx->key/rx->val now hold the whole
 * value (the caller applies it, then calls rx_drop). Returns KV_EPROTO (with
 * *why) for a slice that does not continue the value in progress, or
 * KV_ENOMEM. The codec has checked that the slice is not empty and lies
 * inside its total.
 */
static int
rx_slice(kv_mig *s, slice_rx *rx, bool delta, uint64_t seq, kv_bytes key, kv_bytes val,
         uint64_t off, uint64_t total, bool *complete, const char **why)
{
	*complete = false;
	if (!rx->active) {
		if (off != 0) {
			*why = "split value does not start at offset 0";
			return KV_EPROTO;
		}
		if (total > s->env.max_value) {
			*why = "split value larger than this server's max value";
			return KV_EPROTO;
		}
		/* Exactly `total` (kv_buf_reserve would round up to a power of 2). */
		kv_buf_fini(&rx->val);
		if (kv_buf_set(&rx->key, key.p, key.len) != 0 ||
		    (rx->val.data = malloc((size_t)total)) == NULL)
			return KV_ENOMEM;
		rx->val.cap = (size_t)total;
		rx->active = true;
		rx->delta = delta;
		rx->seq = seq;
		rx->total = total;
	} else if (rx->delta != delta || (delta && rx->seq != seq) || rx->key.len != key.len ||
	           memcmp(rx->key.data, key.p, key.len) != 0) {
		*why = "another entry interleaved with a split value";
		return KV_EPROTO;
	} else if (total != rx->total) {
		*why = "value_total differs between slices of one value";
		return KV_EPROTO;
	} else if (off != rx->val.len) {
		*why = "slices of a split value are not contiguous";
		return KV_EPROTO;
	}
	if (kv_buf_append(&rx->val, val.p, val.len) != 0)
		return KV_ENOMEM; /* cannot happen: reserved */
	*complete = rx->val.len == rx->total;
	return KV_OK;
}

static kv_mig_in *
in_find(kv_mig *s, uint64_t id, bool create)
{
	kv_mig_in *in;

	pthread_mutex_lock(&s->mu);
	for (in = s->ins; in && in->id != id; in = in->next)
		;
	if (in == NULL && create) {
		in = calloc(1, sizeof(*in));
		if (in != NULL) {
			in->id = id;
			pthread_mutex_init(&in->mu, NULL);
			pthread_condattr_t ca;
			pthread_condattr_init(&ca);
			pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
			pthread_cond_init(&in->cv, &ca);
			pthread_condattr_destroy(&ca);
			in->next = s->ins;
			s->ins = in;
		}
	}
	pthread_mutex_unlock(&s->mu);
	return in;
}

/* Drops the stream's range: its keys and its exactly-once entries, applied
 * and logged as one range-delete record inside one barrier section, as a
 * replica's copy drops a range and as the log's replay does (durable.h).
 * The entries matter: an earlier attempt's (taken in live, apply_dedup)
 * may name writes that its source lost in a crash and this attempt's copy
 * does not bring; a retry of one would be answered "done" here without
 * being applied. Forgotten, such a retry is refused (its client's floor
 * rises), and the copy brings back the entries of writes it holds. Caller
 * holds in->mu. */
static int
clear_range(kv_mig *s, kv_mig_in *in)
{
	kv_buf rd = {0};
	uint64_t lsn;
	int rv =
	    kv_dur_rec_range_del(&rd, in->start.data, in->start.len, in->end.data, in->end.len);

	if (rv == 0) {
		kv_dur_begin(s->env.dur);
		rv = kv_dur_apply_record(s->env.dur, rd.data, rd.len, &lsn);
		kv_dur_end(s->env.dur);
	}
	kv_buf_fini(&rd);
	return rv;
}

static int
apply_dedup(kv_mig *s, kv_mig_in *in, const kv_xfer_dedup *d)
{
	kv_dedup_result r = {.status = d->status,
	                     .value_len = d->value_len,
	                     .has_value = d->has_value && d->value.len <= KV_DEDUP_MAX_VALUE};
	if (r.has_value && d->value.len && kv_buf_set(&r.value, d->value.p, d->value.len) != 0)
		return KV_ENOMEM;
	kv_dur_dedup dd = {.client = d->client_id,
	                   .req = d->request_id,
	                   .value_len = d->value_len,
	                   .time_ms = d->time_ms,
	                   .has_del_value = r.has_value,
	                   .del_value = {d->value.p, d->value.len}};
	int rv = kv_dedup_insert(s->env.dedup, d->client_id, d->request_id, &r, d->key.p,
	                         d->key.len, d->time_ms);
	if (rv == 0)
		rv = kv_dur_side_dedup(in->side, &dd, d->status, d->key.p, d->key.len);
	kv_buf_fini(&r.value);
	return rv;
}

/* Raises a client's floor to the source's (the source may have forgotten
 * its writes up to there, in this range too), logged as a replica copy
 * logs it (a DEDUP record without a key), so that a restart keeps it. */
static int
apply_floor(kv_mig *s, kv_mig_in *in, const kv_xfer_floor *f)
{
	uint64_t now_ms = kv_unix_ms();
	kv_dur_dedup dd = {.client = f->client_id, .req = f->floor, .time_ms = now_ms};
	int rv = kv_dedup_raise_floor(s->env.dedup, f->client_id, f->floor, now_ms);

	if (rv == 0)
		rv = kv_dur_side_dedup(in->side, &dd, KV_DUR_DEDUP_FLOOR, NULL, 0);
	return rv;
}

static int
in_begin(kv_mig *s, kv_mig_in *in, const kv_req *rq, kv_xfer_ack *ack)
{
	const kv_xfer *x = &rq->xfer;
	char addr[256] = "";
	bool ok;
	int rv;

	if (x->to_node != kv_mig__node_id(s)) {
		ack->error = "this node is not the destination";
		return KV_EINVAL;
	}
	if (kv_mig__epoch(s) < x->epoch) {
		ack->error = "configuration of the migration not applied yet";
		return KV_EBUSY;
	}
	s->env.node_addr(s->env.arg, x->from_node, addr, sizeof(addr));
	rx_drop((&in->rx)); /* a restarted stream resends every slice */
	in->split_chunks = in->split_deltas = 0;
	kv_buf_fini(&in->start);
	kv_buf_fini(&in->end);
	if (kv_buf_set(&in->start, x->start.p, x->start.len) != 0 ||
	    kv_buf_set(&in->end, x->end.p, x->end.len) != 0)
		return KV_ENOMEM;
	in->epoch = x->epoch;
	in->from = x->from_node;
	in->acked = 0;
	in->keys = in->bytes = 0;
	rv = kv_owner_fill(s->env.owner, x->start.p, x->start.len, x->end.p, x->end.len,
	                   KV_OWN_INCOMING, x->from_node, addr[0] ? addr : NULL, 0, in->id);
	if (rv != 0)
		return rv;
	kv_owner_rdlock(s->env.owner);
	ok = kv_owner_covers_locked(s->env.owner, x->start.p, x->start.len, x->end.p, x->end.len,
	                            KV_OWN_INCOMING);
	kv_owner_unlock(s->env.owner);
	if (!ok) {
		ack->error = "part of the range is served here";
		return KV_EINVAL;
	}
	if ((rv = clear_range(s, in)) != 0)
		return rv;
	/* What an earlier attempt logged is superseded: this one copies the
	 * whole range again after the range delete above. */
	kv_dur_side_close(in->side);
	in->side = NULL;
	in->fenced = false;
	if ((rv = kv_dur_side_open(s->env.dur, &in->side)) != 0) {
		ack->error = "cannot open a side log for the range";
		return rv;
	}
	in->acked = 1;
	KV_INFO(COMP, "incoming transfer", "id=%llu from=%u", (unsigned long long)in->id, in->from);
	return KV_OK;
}

/* Puts one whole value of the stream into the store (caller holds in->mu).
 * No stripe lock: the range is not served here until the commit, and the
 * stream is serialised by in->mu. No barrier either: the side log is
 * replayed where its ADOPT record is, which is appended after every one of
 * its records is applied (doc/durability.md "Migrations"). */
static int
in_put(kv_mig *s, kv_mig_in *in, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
       uint64_t at)
{
	const uint8_t *v = vlen ? val : (const uint8_t *)"";
	int rv = kv_store_put_x(s->env.store, key, klen, v, vlen, at);
	if (rv == 0)
		rv = kv_dur_side_put_x(in->side, key, klen, v, vlen, at);
	return rv;
}

/* Whole chunk entries with one deadline, applied and logged together. */
typedef struct {
	size_t n;                        /* entries held */
	uint64_t at;                     /* their deadline */
	kv_bytes keys[KV_MIG_LOG_GROUP]; /* into the chunk being applied */
	kv_bytes vals[KV_MIG_LOG_GROUP]; /* the same */
} put_group;

/* Puts the group's entries into the store and logs them as one MPUT record
 * of the side log (one append instead of one per key), then yields the core
 * so that client requests waiting for it go first (caller holds in->mu).
 * The range is served here only after the fence adopted the side log, and
 * a restart mid-copy makes the source start over (doc/durability.md
 * "Migrations"). */
static int
group_flush(kv_mig *s, kv_mig_in *in, put_group *g)
{
	int rv = KV_OK;
	if (g->n == 0)
		return KV_OK;
	for (size_t i = 0; i < g->n && rv == 0; i++)
		rv = kv_store_put_x(s->env.store, g->keys[i].p, g->keys[i].len, g->vals[i].p,
		                    g->vals[i].len, g->at);
	if (rv == 0)
		rv = kv_dur_side_mput_x(in->side, g->n, g->keys, g->vals, g->at);
	g->n = 0;
	sched_yield();
	return rv;
}

/* Adds one whole entry to the group, flushing it first when full or when the
 * deadline differs. */
static int
group_add(kv_mig *s, kv_mig_in *in, put_group *g, kv_bytes key, kv_bytes val, uint64_t at)
{
	int rv;
	if (g->n > 0 && (g->n == KV_MIG_LOG_GROUP || g->at != at) &&
	    (rv = group_flush(s, in, g)) != 0)
		return rv;
	if (val.len == 0)
		val.p = (const uint8_t *)"";
	g->at = at;
	g->keys[g->n] = key;
	g->vals[g->n] = val;
	g->n++;
	return KV_OK;
}

/* Applies the chunk entries of x, reassembling split values. */
static int
in_chunk(kv_mig *s, kv_mig_in *in, const kv_xfer *x, kv_xfer_ack *ack)
{
	slice_rx *rx = (&in->rx);
	put_group *g;
	int rv = KV_OK;

	if (x->packed && s->env.chunks_unpacked) {
		ack->error = "packed chunk entries, which this destination did not ask for";
		return KV_EPROTO;
	}
	if ((g = malloc(sizeof(*g))) == NULL)
		return KV_ENOMEM;
	g->n = 0;

	for (size_t i = 0; i < x->ndedup && rv == 0; i++)
		rv = apply_dedup(s, in, &x->dedup[i]);
	for (size_t i = 0; i < x->nfloors && rv == 0; i++)
		rv = apply_floor(s, in, &x->floors[i]);
	for (size_t i = 0; i < x->nkv && rv == 0; i++) {
		const kv_xfer_kv *kv = &x->kv[i];
		bool complete;
		if (!kv_range_contains(in->start.data, in->start.len, in->end.data, in->end.len,
		                       kv->key.p, kv->key.len)) {
			ack->error = "chunk entry outside the range";
			rv = KV_EINVAL;
			break;
		}
		if (kv->value_total == 0) {
			if (rx->active) {
				ack->error = "a whole entry interleaved with a split value";
				rv = KV_EPROTO;
				break;
			}
			rv = group_add(s, in, g, (kv_bytes){kv->key.p, kv->key.len},
			               (kv_bytes){kv->value.p, kv->value.len}, kv->expire_at);
			in->keys++;
			in->bytes += kv->key.len + kv->value.len;
			continue;
		}
		if ((rv = group_flush(s, in, g)) != 0)
			break;
		rv = rx_slice(s, rx, false, 0, kv->key, kv->value, kv->value_offset,
		              kv->value_total, &complete, &ack->error);
		if (rv == 0 && complete) {
			rv = in_put(s, in, rx->key.data, rx->key.len, rx->val.data, rx->val.len,
			            kv->expire_at);
			in->keys++;
			in->bytes += rx->key.len + rx->val.len;
			KV_DEBUG(COMP, "split value assembled", "id=%llu bytes=%zu delta=0",
			         (unsigned long long)in->id, rx->val.len);
			in->split_chunks++;
			rx_drop(rx);
		}
	}
	if (rv == 0)
		rv = group_flush(s, in, g);
	free(g);
	if (rv == 0 && x->last && rx->active) {
		ack->error = "bulk copy ended inside a split value";
		return KV_EPROTO;
	}
	/* The copy is in: sync it now, so that the fence (during which the
	 * range refuses writes at the source) waits only for the deltas. */
	if (rv == 0 && x->last && (rv = kv_dur_side_sync(in->side)) != 0)
		ack->error = "cannot make the copy durable here";
	return rv;
}

/*
 * The bulk-copy applier: one thread per server, at a lower priority (nice
 * +10 from the process's) and with a bulk thread's slice (common/slice.h),
 * applies the TransferChunk messages for the nng thread that received
 * them, which waits for it (holding the stream's
 * mutex: the applier works for it). When the cores are busy, the requests
 * of the ranges this node serves then go before the copy; when they are
 * not, the copy runs at full speed. Deltas, the fence and the commit are
 * applied on the receiving thread, at its priority: they are small and the
 * fence is on the moving range's critical path. One chunk at a time for
 * all incoming streams (the balancer starts at most one per node).
 */
struct kv_mig_applier {
	pthread_mutex_t submit; /* one submitter at a time (after kv_mig_in.mu) */
	pthread_mutex_t mu;     /* protects everything below (a leaf) */
	pthread_cond_t cv;      /* a job, its end, or stop */
	pthread_t thr;
	bool started; /* thr runs */
	bool stop;    /* thr returns */
	bool has_job; /* in, x, ack hold a chunk to apply */
	bool done;    /* ... applied: rv */
	int rv;
	kv_mig_in *in;
	const kv_xfer *x;
	kv_xfer_ack *ack;
};

static int in_chunk(kv_mig *s, kv_mig_in *in, const kv_xfer *x, kv_xfer_ack *ack);

static void *
applier_main(void *arg)
{
	kv_mig *s = arg;
	struct kv_mig_applier *a = s->applier;
	pid_t tid = (pid_t)syscall(SYS_gettid);

	kv_log_thread_name("kv-mig-apply");
	(void)kv_thread_slice(KV_BULK_SLICE_US);
	errno = 0;
	int nice = getpriority(PRIO_PROCESS, (id_t)tid);
	if (errno == 0 &&
	    setpriority(PRIO_PROCESS, (id_t)tid, nice + 10 > 19 ? 19 : nice + 10) != 0)
		KV_WARN(COMP, "bulk-copy applier keeps its priority", "err=\"%s\"",
		        strerror(errno));
	pthread_mutex_lock(&a->mu);
	for (;;) {
		while (!a->has_job && !a->stop)
			pthread_cond_wait(&a->cv, &a->mu);
		if (!a->has_job)
			break;
		a->has_job = false;
		pthread_mutex_unlock(&a->mu);
		int rv = in_chunk(s, a->in, a->x, a->ack);
		pthread_mutex_lock(&a->mu);
		a->rv = rv;
		a->done = true;
		pthread_cond_broadcast(&a->cv);
	}
	pthread_mutex_unlock(&a->mu);
	return NULL;
}

int
kv_mig__applier_init(kv_mig *g)
{
	struct kv_mig_applier *a = calloc(1, sizeof(*a));

	if (a == NULL)
		return KV_ENOMEM;
	pthread_mutex_init(&a->submit, NULL);
	pthread_mutex_init(&a->mu, NULL);
	pthread_cond_init(&a->cv, NULL);
	g->applier = a;
	return KV_OK;
}

void
kv_mig__applier_fini(kv_mig *g)
{
	struct kv_mig_applier *a = g->applier;

	if (a == NULL)
		return;
	pthread_mutex_lock(&a->mu);
	a->stop = true;
	pthread_cond_broadcast(&a->cv);
	pthread_mutex_unlock(&a->mu);
	if (a->started)
		pthread_join(a->thr, NULL);
	pthread_cond_destroy(&a->cv);
	pthread_mutex_destroy(&a->mu);
	pthread_mutex_destroy(&a->submit);
	free(a);
	g->applier = NULL;
}

/* Applies a chunk on the applier's thread and waits (caller holds in->mu);
 * inline when that thread cannot start. */
static int
apply_chunk(kv_mig *s, kv_mig_in *in, const kv_xfer *x, kv_xfer_ack *ack)
{
	struct kv_mig_applier *a = s->applier;
	int rv;

	pthread_mutex_lock(&a->submit);
	pthread_mutex_lock(&a->mu);
	if (!a->started && !a->stop)
		a->started = pthread_create(&a->thr, NULL, applier_main, s) == 0;
	if (!a->started) {
		pthread_mutex_unlock(&a->mu);
		pthread_mutex_unlock(&a->submit);
		return in_chunk(s, in, x, ack);
	}
	a->in = in;
	a->x = x;
	a->ack = ack;
	a->done = false;
	a->has_job = true;
	pthread_cond_broadcast(&a->cv);
	while (!a->done)
		pthread_cond_wait(&a->cv, &a->mu);
	rv = a->rv;
	pthread_mutex_unlock(&a->mu);
	pthread_mutex_unlock(&a->submit);
	return rv;
}

/* Applies one whole delta record: key, value (NULL for a delete), dedup. */
static int
in_delta_rec(kv_mig *s, kv_mig_in *in, const kv_xfer_delta *d, const uint8_t *val, size_t vlen)
{
	int rv;
	if (d->del) {
		rv = kv_store_del(s->env.store, d->key.p, d->key.len, NULL);
		if (rv == KV_ENOTFOUND)
			rv = KV_OK;
		if (rv == 0)
			rv = kv_dur_side_del(in->side, d->key.p, d->key.len);
	} else {
		rv = in_put(s, in, d->key.p, d->key.len, val, vlen, d->expire_at);
	}
	if (rv == 0 && d->has_dedup)
		rv = apply_dedup(s, in, &d->dedup);
	return rv;
}

/* Applies the records of a TransferDelta in order, reassembling split puts. */
static int
in_delta(kv_mig *s, kv_mig_in *in, const kv_xfer *x, kv_xfer_ack *ack)
{
	slice_rx *rx = (&in->rx);
	int rv = KV_OK;

	for (size_t i = 0; i < x->ndelta && rv == 0; i++) {
		const kv_xfer_delta *d = &x->delta[i];
		bool complete;
		if (!kv_range_contains(in->start.data, in->start.len, in->end.data, in->end.len,
		                       d->key.p, d->key.len)) {
			ack->error = "delta entry outside the range";
			return KV_EINVAL;
		}
		if (d->value_total == 0) {
			if (rx->active) {
				ack->error = "a whole record interleaved with a split value";
				return KV_EPROTO;
			}
			rv = in_delta_rec(s, in, d, d->value.p, d->value.len);
			continue;
		}
		if (d->del) {
			ack->error = "a delete record cannot be split";
			return KV_EPROTO;
		}
		rv = rx_slice(s, rx, true, d->seq, d->key, d->value, d->value_offset,
		              d->value_total, &complete, &ack->error);
		if (rv != 0)
			break;
		/* The record's dedup rides on its last slice: applied with the value. */
		if (d->has_dedup && !complete) {
			ack->error = "dedup record on a slice that is not the last";
			return KV_EPROTO;
		}
		if (complete) {
			rv = in_delta_rec(s, in, d, rx->val.data, rx->val.len);
			KV_DEBUG(COMP, "split value assembled", "id=%llu bytes=%zu delta=1",
			         (unsigned long long)in->id, rx->val.len);
			in->split_deltas++;
			rx_drop(rx);
		}
	}
	return rv;
}

static int
in_apply(kv_mig *s, kv_mig_in *in, const kv_xfer *x, kv_xfer_ack *ack)
{
	int rv = KV_OK;

	/* Slices of one value are consecutive: only chunks or deltas may follow. */
	if ((&in->rx)->active && x->kind != KV_XFER_CHUNK && x->kind != KV_XFER_DELTA &&
	    x->kind != KV_XFER_ABORT) {
		ack->error = "split value incomplete at the fence";
		return KV_EPROTO;
	}
	if ((in->fenced || in->side == NULL) && x->kind != KV_XFER_COMMIT &&
	    x->kind != KV_XFER_ABORT) {
		ack->error = "transfer data after the fence";
		return KV_EPROTO;
	}
	switch (x->kind) {
	case KV_XFER_CHUNK:
		return apply_chunk(s, in, x, ack);
	case KV_XFER_DELTA:
		return in_delta(s, in, x, ack);
	case KV_XFER_FENCE:
		/* The source forgets the range once this is acknowledged and the
		 * handover published: the range must be on disk here first, its
		 * side log adopted by this node's log. A failure past the ADOPT
		 * append leaves it adopted (and fenced): the source starts over
		 * from Begin, which opens a new side log. */
		rv = kv_dur_side_adopt(in->side);
		in->fenced = true;
		if (rv != 0) {
			ack->error = "cannot make the range durable here";
			return rv;
		}
		KV_DEBUG(COMP, "incoming fence", "id=%llu keys=%llu", (unsigned long long)in->id,
		         (unsigned long long)in->keys);
		return KV_OK;
	case KV_XFER_COMMIT:
		/* Recorded first: a restart before the handover is published
		 * must find that this node serves the range (kv_mig_in_resume). */
		if ((rv = kv_mig__hand_add(s, in->id, in->epoch, false)) != 0) {
			ack->error = "cannot record the commit in the handover file";
			return rv;
		}
		rv = kv_owner_set(s->env.owner, in->start.data, in->start.len, in->end.data,
		                  in->end.len, KV_OWN_SERVE, 0, NULL, x->epoch, 0, NULL);
		if (rv == 0) {
			in->committed = true;
			kv_dur_side_close(in->side);
			in->side = NULL;
			kv_mig__held_changed(s);
			KV_INFO(COMP, "incoming range committed",
			        "id=%llu keys=%llu split_chunk_values=%llu split_delta_values=%llu",
			        (unsigned long long)in->id, (unsigned long long)in->keys,
			        (unsigned long long)in->split_chunks,
			        (unsigned long long)in->split_deltas);
		}
		return rv;
	case KV_XFER_ABORT:
		rx_drop((&in->rx));
		kv_owner_drop_incoming(s->env.owner, in->id);
		clear_range(s, in);
		kv_dur_side_close(in->side);
		in->side = NULL;
		in->fenced = false;
		KV_INFO(COMP, "incoming transfer aborted", "id=%llu", (unsigned long long)in->id);
		return KV_OK;
	default:
		return KV_EINVAL;
	}
}

void
kv_mig_in_handle(kv_mig *s, const kv_req *rq, kv_xfer_ack *ack)
{
	const kv_xfer *x = &rq->xfer;
	kv_mig_in *in;
	int rv;

	memset(ack, 0, sizeof(*ack));
	ack->migration_id = x->migration_id;
	ack->packed_ok = !s->env.chunks_unpacked; /* chunks may come packed (xfer_codec.h) */
	in = in_find(s, x->migration_id, x->kind == KV_XFER_BEGIN);
	if (in == NULL) {
		ack->status = x->kind == KV_XFER_BEGIN ? KV_ENOMEM : KV_EINVAL;
		ack->error = "unknown transfer stream";
		return;
	}
	pthread_mutex_lock(&in->mu);
	/* A source has up to KV_MIG_PIPE messages in flight, handled on
	 * different threads here: one that overtook its predecessor waits for
	 * it, briefly, rather than being refused as a gap. */
	if (x->kind != KV_XFER_BEGIN && in->acked > 0 && x->seq > in->acked + 1 &&
	    x->seq <= in->acked + KV_MIG_PIPE) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += (long)KV_MIG_GAP_WAIT_MS * 1000000L;
		ts.tv_sec += ts.tv_nsec / 1000000000L;
		ts.tv_nsec %= 1000000000L;
		while (in->acked > 0 && x->seq > in->acked + 1)
			if (pthread_cond_timedwait(&in->cv, &in->mu, &ts) != 0)
				break;
	}
	if (in->committed && x->kind == KV_XFER_ABORT) {
		/* The range is served here now: dropping it would lose it. */
		ack->error = "transfer already committed";
		rv = KV_EINVAL;
	} else if (in->committed) {
		/* A source that restarted after its commit, or resent it: it
		 * reads `committed` below and hands the range over. */
		rv = KV_OK;
		if (x->seq > in->acked)
			in->acked = x->seq;
	} else if (x->kind == KV_XFER_BEGIN) {
		rv = in_begin(s, in, rq, ack);
	} else if (in->acked == 0) {
		ack->error = "transfer stream not begun";
		rv = KV_EINVAL;
	} else if (rq->epoch < in->epoch) {
		ack->error = "transfer from an older epoch";
		rv = KV_ESTALE;
	} else if (x->seq <= in->acked) {
		rv = KV_OK; /* duplicate: acknowledged again, not applied */
	} else if (x->seq != in->acked + 1) {
		ack->error = "gap in the transfer stream";
		rv = KV_EINVAL;
	} else {
		rv = in_apply(s, in, x, ack);
		if (rv == 0) {
			in->acked = x->kind == KV_XFER_ABORT ? 0 : x->seq;
		} else {
			/* Refused: the source restarts from Begin (which clears the
			 * range), so a partial value is never continued. */
			rx_drop((&in->rx));
			KV_WARN(COMP, "transfer message refused",
			        "id=%llu seq=%llu err=%s why=\"%s\"", (unsigned long long)in->id,
			        (unsigned long long)x->seq, kv_errname(rv),
			        ack->error ? ack->error : "");
		}
	}
	ack->status = rv;
	ack->committed = in->committed;
	ack->seq = in->acked;
	ack->keys = in->keys;
	ack->bytes = in->bytes;
	pthread_cond_broadcast(&in->cv);
	pthread_mutex_unlock(&in->mu);
}

bool
kv_mig_in_resume(kv_mig *s, const kv_migration *m)
{
	kv_mig_in *in;

	if (!kv_mig__hand_has(s, m->id, false))
		return false;
	if ((in = in_find(s, m->id, true)) == NULL)
		return true; /* served all the same; the source retries Begin */
	pthread_mutex_lock(&in->mu);
	if (!in->committed) {
		if (kv_buf_set(&in->start, m->start.data, m->start.len) == 0 &&
		    kv_buf_set(&in->end, m->end.data, m->end.len) == 0) {
			in->epoch = m->epoch;
			in->from = m->from;
			in->committed = true;
			KV_INFO(COMP, "incoming range committed before a restart", "id=%llu",
			        (unsigned long long)in->id);
		}
	}
	pthread_mutex_unlock(&in->mu);
	kv_mig__held_changed(s);
	return true;
}

void
kv_mig_in_forget(kv_mig *s, uint64_t id)
{
	kv_mig_in *in = in_find(s, id, false);

	kv_owner_drop_incoming(s->env.owner, id);
	if (in == NULL)
		return;
	pthread_mutex_lock(&in->mu);
	if (!in->committed && in->acked > 0) {
		/* The range is not served here: drop what arrived of it. */
		kv_owner_rdlock(s->env.owner);
		bool unserved = !kv_owner_covers_locked(s->env.owner, in->start.data, in->start.len,
		                                        in->end.data, in->end.len, KV_OWN_SERVE);
		kv_owner_unlock(s->env.owner);
		if (unserved)
			clear_range(s, in);
		in->acked = 0;
	}
	kv_dur_side_close(in->side);
	in->side = NULL;
	in->fenced = false;
	rx_drop((&in->rx));
	pthread_mutex_unlock(&in->mu);
	KV_INFO(COMP, "incoming transfer forgotten", "id=%llu", (unsigned long long)id);
}

void
kv_mig__ins_free(kv_mig_in *in)
{
	kv_mig_in *inn;

	for (; in; in = inn) {
		inn = in->next;
		kv_dur_side_close(in->side);
		rx_drop(&in->rx);
		kv_buf_fini(&in->rx.key);
		kv_buf_fini(&in->start);
		kv_buf_fini(&in->end);
		pthread_cond_destroy(&in->cv);
		pthread_mutex_destroy(&in->mu);
		free(in);
	}
}
