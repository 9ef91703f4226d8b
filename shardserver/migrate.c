/*
 * migrate.c - range transfer between shard servers, both ends
 * (doc/protocol.md "Migrations"; wire: Transfer in shardkv.proto).
 *
 * DESIGN. Source: one thread per outgoing migration. It first attaches
 * itself to the ownership entry of the range (from then on every write to
 * the range takes the migration mutex and is appended to the delta buffer),
 * then streams Begin, the bulk copy in chunks of at most CHUNK_ENTRIES
 * entries or CHUNK_BYTES bytes (kv_store_range_step, bounded per step), the
 * deltas until few are left, and the fence: under the mutex it sets
 * `fenced` (writes now answer MOVING) and takes the last deltas, sends them
 * with TransferFence and waits for the ack; then TransferCommit, then the
 * ownership entry becomes MOVED (WRONG_OWNER with the destination as hint),
 * MigrationDone is reported until the controller acknowledges it, and the
 * local copy is deleted in bounded steps. Every send is retried with backoff
 * while the destination is down; a refused message restarts the stream from
 * Begin (the destination then drops what it had), so only this thread ever
 * waits for the destination and nothing else is blocked.
 *
 * Destination: transfer messages are applied on the nng thread that
 * receives them, in seq order per stream (kv_mig_in.mu), without waiting for
 * anyone. Begin is refused with BUSY until the configuration of the
 * migration's epoch is applied, marks the range INCOMING (clients get
 * MOVING), and clears stale data in bounded steps; Commit makes it SERVE.
 * Duplicates (seq <= acked) are acknowledged again without being applied,
 * gaps are refused with KV_EINVAL.
 *
 * Correctness of copy + deltas: every write that can miss the bulk copy
 * happens after the attach, so it is in the deltas, and deltas are applied
 * after every chunk in write order, so the destination ends with the last
 * write of every key. Nothing here decides ownership beyond the stream:
 * the configuration thread (server.c) starts and cancels migrations.
 */
#include "common/err.h"
#include "common/log.h"
#include "shardserver/server_int.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COMP "migrate"

#define CHUNK_ENTRIES   1000u           /* entries per TransferChunk */
#define CHUNK_BYTES     (1024u * 1024u) /* bytes per TransferChunk */
#define DELTA_RECS      1000u           /* records per TransferDelta */
#define FENCE_RECS      256u            /* fence when fewer deltas are left */
#define FENCE_BYTES     (256u * 1024u)  /* ... and fewer bytes */
#define CATCHUP_ROUNDS  64              /* then fence anyway */
#define DELETE_STEP     1000u           /* entries deleted per step */
#define XFER_TIMEOUT_MS 5000u           /* one transfer message */
#define PROGRESS_MS     500u            /* MigrationProgress period */

/* ------------------------------------------------------------------------
 * Delta buffer
 * ------------------------------------------------------------------------ */

static void
rec_fini(kv_delta_rec *r)
{
	kv_buf_fini(&r->key);
	kv_buf_fini(&r->value);
}

void
kv_mig_out_record_locked(kv_mig_out *m, const void *key, size_t klen, const void *value,
                         size_t vlen, const kv_delta_rec *dedup)
{
	kv_delta_rec *r;

	if (m->nrecs == m->caprecs) {
		size_t nc = m->caprecs ? m->caprecs * 2 : 256;
		kv_delta_rec *nr = realloc(m->recs, nc * sizeof(*nr));
		if (nr == NULL) {
			m->lost = true;
			return;
		}
		m->recs = nr;
		m->caprecs = nc;
	}
	r = &m->recs[m->nrecs];
	memset(r, 0, sizeof(*r));
	if (kv_buf_set(&r->key, key, klen) != 0 ||
	    (value && kv_buf_set(&r->value, vlen ? value : "", vlen) != 0)) {
		rec_fini(r);
		m->lost = true;
		return;
	}
	r->del = value == NULL;
	r->seq = ++m->write_seq;
	if (dedup && dedup->has_dedup) {
		r->has_dedup = true;
		r->client = dedup->client;
		r->req = dedup->req;
		r->status = KV_OK;
		r->value_len = dedup->value_len;
		r->time_ms = dedup->time_ms;
	}
	m->nrecs++;
	m->rec_bytes += klen + vlen;
}

/* Takes the buffered records (caller holds mu). */
static void
take_recs_locked(kv_mig_out *o, kv_delta_rec **recs, size_t *n)
{
	*recs = o->recs;
	*n = o->nrecs;
	o->recs = NULL;
	o->nrecs = o->caprecs = o->rec_bytes = 0;
}

static void
free_recs(kv_delta_rec *recs, size_t n)
{
	for (size_t i = 0; i < n; i++)
		rec_fini(&recs[i]);
	free(recs);
}

/* ------------------------------------------------------------------------
 * Source side
 * ------------------------------------------------------------------------ */

static bool
should_quit(kv_mig_out *o, bool cancellable)
{
	return atomic_load(&o->srv->stopping) || (cancellable && atomic_load(&o->cancel));
}

/*
 * Keeps the bulk copy at or under the migration's rate limit: after `bytes`
 * sent since `t0`, sleeps until the time those bytes are due, in slices of
 * at most 50 ms so that a cancel or a stop is noticed.
 */
static void
pace(kv_mig_out *o, uint64_t t0, uint64_t bytes)
{
	uint64_t rate, due;

	if (o->rate_mb_s == 0)
		return;
	rate = (uint64_t)o->rate_mb_s * 1000000u; /* bytes per second */
	due = t0 + (uint64_t)((double)bytes * 1e9 / (double)rate);
	for (uint64_t now = kv_now_ns(); now < due && !should_quit(o, true); now = kv_now_ns()) {
		uint64_t ns = due - now < 50000000u ? due - now : 50000000u;
		struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)ns};
		nanosleep(&ts, NULL);
	}
}

/*
 * Sends one transfer message until the destination acknowledges it.
 * Returns 0 (acknowledged), KV_ECLOSED (stopping or cancelled), or the
 * destination's refusal (the caller restarts the stream).
 */
static int
xfer_send(kv_mig_out *o, kv_rpc_client *cli, const kv_xfer *x, bool cancellable, kv_sc_ack *ack)
{
	kv_server *s = o->srv;
	unsigned backoff = 20;

	while (!should_quit(o, cancellable)) {
		nng_msg *req = NULL, *rep = NULL;
		int rv = kv_sc_xfer_encode(x, o->epoch, atomic_load(&s->node_id), &req);
		if (rv != 0)
			return rv;
		rv = kv_rpc_call(cli, req, &rep, XFER_TIMEOUT_MS);
		if (rv == 0) {
			rv = kv_sc_ack_decode(nng_msg_body(rep), nng_msg_len(rep), ack);
			nng_msg_free(rep);
			if (rv == 0 && ack->status == 0 && ack->seq >= x->seq)
				return KV_OK;
			if (rv == 0)
				rv = ack->status ? ack->status : KV_EPROTO;
			if (rv != KV_EBUSY && rv != KV_ECLOSED && rv != KV_EUNAVAIL) {
				KV_WARN(COMP, "transfer refused", "id=%llu seq=%llu err=%s",
				        (unsigned long long)o->id, (unsigned long long)x->seq,
				        kv_errname(rv));
				return rv;
			}
		}
		KV_DEBUG(COMP, "transfer retry", "id=%llu seq=%llu err=%s backoff_ms=%u",
		         (unsigned long long)o->id, (unsigned long long)x->seq, kv_errname(rv),
		         backoff);
		kv_server__nap(s, backoff);
		backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
	}
	return KV_ECLOSED;
}

static void
report_progress(kv_mig_out *o, kv_mig_phase phase, uint64_t start_ns)
{
	kv_adm_resp r;
	uint64_t el = kv_now_ns() - start_ns + 1;
	uint64_t bytes = atomic_load(&o->bytes_copied);
	kv_adm_req rq = {.kind = KV_ADM_PROGRESS,
	                 .node_id = atomic_load(&o->srv->node_id),
	                 .migration_id = o->id,
	                 .phase = (int)phase,
	                 .keys = atomic_load(&o->keys_copied),
	                 .bytes = bytes,
	                 .rate_bytes_s = (uint64_t)((double)bytes * 1e9 / (double)el)};
	if (kv_server__ctl_call(o->srv, &rq, &r, 300) == 0)
		kv_sc_adm_resp_fini(&r);
}

/* A chunk being assembled: owned copies of entries. */
typedef struct {
	kv_buf *keys; /* CHUNK_ENTRIES keys */
	kv_buf *vals; /* CHUNK_ENTRIES values */
	size_t n;     /* entries */
	size_t bytes; /* key + value bytes */
	bool oom;     /* an allocation failed */
} chunk_acc;

static int
chunk_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	chunk_acc *a = arg;
	if (kv_buf_set(&a->keys[a->n], key, klen) != 0 ||
	    kv_buf_set(&a->vals[a->n], vlen ? val : (const uint8_t *)"", vlen) != 0) {
		a->oom = true;
		return 1;
	}
	a->n++;
	a->bytes += klen + vlen;
	return 0;
}

/* Dedup entries of the range, collected for the first chunks. */
typedef struct {
	kv_sc_dedup *d; /* entries (bytes in bufs) */
	kv_buf *bufs;   /* 2 per entry: key, value */
	size_t n;       /* entries */
	size_t cap;     /* capacity */
	bool oom;       /* allocation failed */
} dedup_acc;

static void
dedup_cb(void *arg, uint64_t client, uint64_t req, const kv_dedup_result *res, const uint8_t *key,
         size_t klen, uint64_t time_ms)
{
	dedup_acc *a = arg;
	if (a->oom)
		return;
	if (a->n == a->cap) {
		size_t nc = a->cap ? a->cap * 2 : 64;
		kv_sc_dedup *nd = realloc(a->d, nc * sizeof(*nd));
		if (nd == NULL) {
			a->oom = true;
			return;
		}
		a->d = nd;
		kv_buf *nb = realloc(a->bufs, 2 * nc * sizeof(*nb));
		if (nb == NULL) {
			a->oom = true;
			return;
		}
		memset(nb + 2 * a->cap, 0, 2 * (nc - a->cap) * sizeof(*nb));
		a->bufs = nb;
		a->cap = nc;
	}
	kv_buf *kb = &a->bufs[2 * a->n], *vb = &a->bufs[2 * a->n + 1];
	if (kv_buf_set(kb, key, klen) != 0 ||
	    (res->value.len && kv_buf_set(vb, res->value.data, res->value.len) != 0)) {
		a->oom = true;
		return;
	}
	a->d[a->n] = (kv_sc_dedup){.client_id = client,
	                           .request_id = req,
	                           .status = res->status,
	                           .value_len = res->value_len,
	                           .time_ms = time_ms};
	a->n++;
}

/* Sends records as TransferDelta messages. */
static int
send_recs(kv_mig_out *o, kv_rpc_client *cli, uint64_t *seq, kv_delta_rec *recs, size_t n,
          bool cancellable)
{
	kv_sc_delta *d = calloc(DELTA_RECS, sizeof(*d));
	kv_sc_ack ack;
	int rv = KV_OK;

	if (d == NULL)
		return KV_ENOMEM;
	for (size_t off = 0; off < n && rv == 0;) {
		size_t k = 0, bytes = 0;
		while (off + k < n && k < DELTA_RECS && bytes < CHUNK_BYTES) {
			const kv_delta_rec *r = &recs[off + k];
			kv_sc_delta *x = &d[k];
			memset(x, 0, sizeof(*x));
			x->seq = r->seq;
			x->del = r->del;
			x->key = (kv_bytes){r->key.data, r->key.len};
			x->value = (kv_bytes){r->value.data, r->value.len};
			if (r->has_dedup) {
				x->has_dedup = true;
				x->dedup = (kv_sc_dedup){.client_id = r->client,
				                         .request_id = r->req,
				                         .status = r->status,
				                         .value_len = r->value_len,
				                         .key = x->key,
				                         .time_ms = r->time_ms};
			}
			bytes += r->key.len + r->value.len;
			k++;
		}
		kv_xfer x = {.migration_id = o->id,
		             .seq = ++*seq,
		             .kind = KV_XFER_DELTA,
		             .ndelta = k,
		             .delta = d};
		rv = xfer_send(o, cli, &x, cancellable, &ack);
		off += k;
	}
	free(d);
	return rv;
}

/* Streams Begin, chunks, deltas and the fence. Returns 0 when the
 * destination holds everything (o->fenced is then set), else an error. */
static int
stream(kv_mig_out *o, kv_rpc_client *cli, uint64_t *seq, uint64_t start_ns)
{
	kv_server *s = o->srv;
	kv_sc_ack ack;
	kv_store_cursor cur;
	chunk_acc ca = {0};
	dedup_acc da = {0};
	kv_sc_kv *kvs = NULL;
	kv_delta_rec *recs = NULL;
	size_t nrecs = 0;
	uint64_t last_progress = 0;
	int rv;

	pthread_mutex_lock(&o->mu);
	take_recs_locked(o, &recs, &nrecs);
	o->lost = false;
	pthread_mutex_unlock(&o->mu);
	free_recs(recs, nrecs);
	recs = NULL;
	nrecs = 0;
	atomic_store(&o->keys_copied, 0);
	atomic_store(&o->bytes_copied, 0);
	kv_store_cursor_init(&cur);

	*seq = 1;
	kv_xfer b = {.migration_id = o->id,
	             .seq = 1,
	             .kind = KV_XFER_BEGIN,
	             .epoch = o->epoch,
	             .start = {o->start.data, o->start.len},
	             .end = {o->end.data, o->end.len},
	             .from_node = atomic_load(&s->node_id),
	             .to_node = o->to};
	if ((rv = xfer_send(o, cli, &b, true, &ack)) != 0)
		goto cleanup;
	KV_INFO(COMP, "copy started", "id=%llu to=%u rate_mb_s=%u", (unsigned long long)o->id,
	        o->to, o->rate_mb_s);
	report_progress(o, KV_MIG_COPYING, start_ns);
	uint64_t copy_start = kv_now_ns();

	/* Exactly-once memory of the range first. */
	kv_dedup_visit_range(s->dedup, o->start.data, o->start.len, o->end.data, o->end.len,
	                     dedup_cb, &da);
	if (da.oom) {
		rv = KV_ENOMEM;
		goto cleanup;
	}
	for (size_t i = 0; i < da.n; i++) {
		da.d[i].key = (kv_bytes){da.bufs[2 * i].data, da.bufs[2 * i].len};
		da.d[i].value = (kv_bytes){da.bufs[2 * i + 1].data, da.bufs[2 * i + 1].len};
	}
	for (size_t off = 0; off < da.n;) {
		size_t k = da.n - off < 5000 ? da.n - off : 5000;
		kv_xfer c = {.migration_id = o->id,
		             .seq = ++*seq,
		             .kind = KV_XFER_CHUNK,
		             .ndedup = k,
		             .dedup = da.d + off};
		if ((rv = xfer_send(o, cli, &c, true, &ack)) != 0)
			goto cleanup;
		off += k;
	}

	/* Bulk copy. */
	ca.keys = calloc(CHUNK_ENTRIES, sizeof(kv_buf));
	ca.vals = calloc(CHUNK_ENTRIES, sizeof(kv_buf));
	kvs = calloc(CHUNK_ENTRIES, sizeof(*kvs));
	if (ca.keys == NULL || ca.vals == NULL || kvs == NULL) {
		rv = KV_ENOMEM;
		goto cleanup;
	}
	while (!cur.done) {
		ca.n = 0;
		ca.bytes = 0;
		while (!cur.done && ca.n < CHUNK_ENTRIES && ca.bytes < CHUNK_BYTES) {
			rv = kv_store_range_step(s->store, o->start.data, o->start.len, o->end.data,
			                         o->end.len, &cur, CHUNK_ENTRIES - ca.n, chunk_cb,
			                         &ca);
			if (rv != 0 || ca.oom) {
				rv = rv ? rv : KV_ENOMEM;
				goto cleanup;
			}
		}
		for (size_t i = 0; i < ca.n; i++) {
			kvs[i].key = (kv_bytes){ca.keys[i].data, ca.keys[i].len};
			kvs[i].value = (kv_bytes){ca.vals[i].data, ca.vals[i].len};
		}
		kv_xfer c = {.migration_id = o->id,
		             .seq = ++*seq,
		             .kind = KV_XFER_CHUNK,
		             .nkv = ca.n,
		             .kv = kvs,
		             .last = cur.done};
		if ((rv = xfer_send(o, cli, &c, true, &ack)) != 0)
			goto cleanup;
		atomic_fetch_add(&o->keys_copied, ca.n);
		atomic_fetch_add(&o->bytes_copied, ca.bytes);
		pace(o, copy_start, atomic_load(&o->bytes_copied));
		uint64_t now = kv_now_ns();
		if (now - last_progress > PROGRESS_MS * 1000000ull) {
			report_progress(o, KV_MIG_COPYING, start_ns);
			last_progress = now;
		}
	}

	/* Catch up until few writes are left. */
	report_progress(o, KV_MIG_CATCHUP, start_ns);
	for (int round = 0; round < CATCHUP_ROUNDS; round++) {
		pthread_mutex_lock(&o->mu);
		if (o->lost) {
			pthread_mutex_unlock(&o->mu);
			rv = KV_ENOMEM;
			goto cleanup;
		}
		if (o->nrecs < FENCE_RECS && o->rec_bytes < FENCE_BYTES) {
			pthread_mutex_unlock(&o->mu);
			break;
		}
		take_recs_locked(o, &recs, &nrecs);
		pthread_mutex_unlock(&o->mu);
		rv = send_recs(o, cli, seq, recs, nrecs, true);
		free_recs(recs, nrecs);
		recs = NULL;
		nrecs = 0;
		if (rv != 0)
			goto cleanup;
	}
	if (should_quit(o, true)) {
		rv = KV_ECLOSED;
		goto cleanup;
	}

	/* Fence: from here writes to the range answer MOVING. */
	pthread_mutex_lock(&o->mu);
	if (o->lost) {
		pthread_mutex_unlock(&o->mu);
		rv = KV_ENOMEM;
		goto cleanup;
	}
	atomic_store(&o->fenced, true);
	take_recs_locked(o, &recs, &nrecs);
	uint64_t last_write = o->write_seq;
	pthread_mutex_unlock(&o->mu);
	uint64_t fence_ns = kv_now_ns();
	rv = send_recs(o, cli, seq, recs, nrecs, false);
	if (rv == 0) {
		kv_xfer f = {.migration_id = o->id,
		             .seq = ++*seq,
		             .kind = KV_XFER_FENCE,
		             .last_write_seq = last_write};
		rv = xfer_send(o, cli, &f, false, &ack);
	}
	if (rv != 0) {
		/* The destination does not serve before Commit: lifting the fence is safe. */
		pthread_mutex_lock(&o->mu);
		atomic_store(&o->fenced, false);
		pthread_mutex_unlock(&o->mu);
		goto cleanup;
	}
	KV_INFO(COMP, "fenced", "id=%llu deltas=%zu fence_us=%llu", (unsigned long long)o->id,
	        nrecs, (unsigned long long)((kv_now_ns() - fence_ns) / 1000));
	report_progress(o, KV_MIG_FENCED, start_ns);
cleanup:
	free_recs(recs, nrecs);
	for (size_t i = 0; ca.keys && i < CHUNK_ENTRIES; i++) {
		kv_buf_fini(&ca.keys[i]);
		kv_buf_fini(&ca.vals[i]);
	}
	free(ca.keys);
	free(ca.vals);
	free(kvs);
	for (size_t i = 0; i < 2 * da.cap; i++)
		kv_buf_fini(&da.bufs[i]);
	free(da.bufs);
	free(da.d);
	kv_store_cursor_fini(&cur);
	return rv;
}

/* Deletes the moved range in bounded steps while it stays MOVED. */
static void
delete_moved(kv_mig_out *o)
{
	kv_server *s = o->srv;
	uint64_t deleted = 0;

	while (!atomic_load(&s->stopping)) {
		int rv = KV_EBUSY;
		kv_owner_rdlock(&s->owner);
		bool moved = kv_owner_covers_locked(&s->owner, o->start.data, o->start.len,
		                                    o->end.data, o->end.len, KV_OWN_MOVED);
		if (moved)
			rv = kv_store_range_delete(s->store, o->start.data, o->start.len,
			                           o->end.data, o->end.len, DELETE_STEP, &deleted);
		kv_owner_unlock(&s->owner);
		if (!moved || rv != KV_EBUSY)
			break;
		sched_yield();
	}
	KV_INFO(COMP, "moved range deleted", "id=%llu keys=%llu", (unsigned long long)o->id,
	        (unsigned long long)deleted);
}

static void
report_done(kv_mig_out *o, uint64_t seq)
{
	unsigned backoff = 50;

	while (!atomic_load(&o->srv->stopping)) {
		kv_adm_resp r;
		kv_adm_req rq = {.kind = KV_ADM_DONE,
		                 .node_id = atomic_load(&o->srv->node_id),
		                 .migration_id = o->id,
		                 .status = KV_OK,
		                 .keys = atomic_load(&o->keys_copied),
		                 .bytes = atomic_load(&o->bytes_copied),
		                 .last_seq = seq};
		int rv = kv_server__ctl_call(o->srv, &rq, &r, 2000);
		if (rv == 0) {
			int st = r.status;
			kv_sc_adm_resp_fini(&r);
			if (st != 0)
				KV_WARN(COMP, "controller refused migration done", "id=%llu err=%s",
				        (unsigned long long)o->id, kv_errname(st));
			atomic_store(&o->reported, true);
			return;
		}
		kv_server__nap(o->srv, backoff);
		backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
	}
}

static void *
mig_out_main(void *arg)
{
	kv_mig_out *o = arg;
	kv_server *s = o->srv;
	kv_rpc_client *cli = NULL;
	uint64_t seq = 0, start_ns = kv_now_ns();
	unsigned backoff = 50;
	bool served;
	int rv;

	kv_owner_rdlock(&s->owner);
	served = kv_owner_covers_locked(&s->owner, o->start.data, o->start.len, o->end.data,
	                                o->end.len, KV_OWN_SERVE);
	kv_owner_unlock(&s->owner);
	if (!served) {
		KV_WARN(COMP, "migration of a range not served here ignored", "id=%llu",
		        (unsigned long long)o->id);
		goto out;
	}
	if ((rv = kv_owner_set(&s->owner, o->start.data, o->start.len, o->end.data, o->end.len,
	                       KV_OWN_SERVE, 0, NULL, o->epoch, o->id, o)) != 0 ||
	    (rv = kv_rpc_client_create(o->to_addr, &cli)) != 0) {
		KV_ERROR(COMP, "cannot start migration", "id=%llu err=%s",
		         (unsigned long long)o->id, kv_errname(rv));
		goto detach;
	}
	KV_INFO(COMP, "migration started", "id=%llu to=%u addr=%s", (unsigned long long)o->id,
	        o->to, o->to_addr);
	for (;;) {
		rv = stream(o, cli, &seq, start_ns);
		if (rv == 0)
			break;
		if (should_quit(o, !atomic_load(&o->fenced)))
			goto abort;
		kv_server__nap(s, backoff);
		backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
	}
	/* Commit: the destination serves from now on. */
	kv_sc_ack ack;
	kv_xfer c = {
	    .migration_id = o->id, .seq = ++seq, .kind = KV_XFER_COMMIT, .epoch = o->epoch};
	if (xfer_send(o, cli, &c, false, &ack) != 0)
		goto out; /* stopping while fenced: the range stays unavailable here */
	kv_owner_set(&s->owner, o->start.data, o->start.len, o->end.data, o->end.len, KV_OWN_MOVED,
	             o->to, o->to_addr, o->epoch, o->id, NULL);
	KV_INFO(COMP, "migration committed", "id=%llu to=%u keys=%llu ms=%llu",
	        (unsigned long long)o->id, o->to, (unsigned long long)atomic_load(&o->keys_copied),
	        (unsigned long long)((kv_now_ns() - start_ns) / 1000000));
	report_done(o, seq);
	delete_moved(o);
	goto out;
abort:
	if (atomic_load(&o->cancel) && cli != NULL) {
		kv_xfer a = {.migration_id = o->id,
		             .seq = ++seq,
		             .kind = KV_XFER_ABORT,
		             .reason = KV_ECLOSED};
		nng_msg *req = NULL, *rep = NULL;
		if (kv_sc_xfer_encode(&a, o->epoch, atomic_load(&s->node_id), &req) == 0 &&
		    kv_rpc_call(cli, req, &rep, 1000) == 0)
			nng_msg_free(rep);
		KV_INFO(COMP, "migration cancelled", "id=%llu", (unsigned long long)o->id);
	}
detach:
	/* Still ours: serve it without the migration. */
	if (!atomic_load(&s->stopping))
		kv_owner_set(&s->owner, o->start.data, o->start.len, o->end.data, o->end.len,
		             KV_OWN_SERVE, 0, NULL, o->epoch, 0, NULL);
out:
	kv_rpc_client_destroy(cli);
	atomic_store(&o->finished, true);
	return NULL;
}

int
kv_mig_out_start(kv_server *s, const kv_migration *m, const char *to_addr)
{
	kv_mig_out *o = calloc(1, sizeof(*o));

	if (o == NULL)
		return KV_ENOMEM;
	o->srv = s;
	o->id = m->id;
	o->epoch = m->epoch;
	o->to = m->to;
	o->rate_mb_s = m->rate_limit_mb_s;
	snprintf(o->to_addr, sizeof(o->to_addr), "%s", to_addr);
	if (kv_buf_set(&o->start, m->start.data, m->start.len) != 0 ||
	    kv_buf_set(&o->end, m->end.data, m->end.len) != 0) {
		kv_buf_fini(&o->start);
		kv_buf_fini(&o->end);
		free(o);
		return KV_ENOMEM;
	}
	pthread_mutex_init(&o->mu, NULL);
	pthread_mutex_lock(&s->mig_mu);
	o->next = s->outs;
	s->outs = o;
	if (pthread_create(&o->thr, NULL, mig_out_main, o) != 0) {
		atomic_store(&o->finished, true);
		o->thr = pthread_self();
		pthread_mutex_unlock(&s->mig_mu);
		return KV_ENOMEM;
	}
	pthread_mutex_unlock(&s->mig_mu);
	return KV_OK;
}

/* ------------------------------------------------------------------------
 * Destination side
 * ------------------------------------------------------------------------ */

static kv_mig_in *
in_find(kv_server *s, uint64_t id, bool create)
{
	kv_mig_in *in;

	pthread_mutex_lock(&s->mig_mu);
	for (in = s->ins; in && in->id != id; in = in->next)
		;
	if (in == NULL && create && (in = calloc(1, sizeof(*in))) != NULL) {
		in->id = id;
		pthread_mutex_init(&in->mu, NULL);
		in->next = s->ins;
		s->ins = in;
	}
	pthread_mutex_unlock(&s->mig_mu);
	return in;
}

/* Drops every key of the stream's range (bounded steps, caller holds in->mu). */
static int
clear_range(kv_server *s, kv_mig_in *in)
{
	int rv;
	do
		rv = kv_store_range_delete(s->store, in->start.data, in->start.len, in->end.data,
		                           in->end.len, DELETE_STEP, NULL);
	while (rv == KV_EBUSY);
	return rv;
}

static int
apply_dedup(kv_server *s, const kv_sc_dedup *d)
{
	kv_dedup_result r = {.status = d->status, .value_len = d->value_len};
	if (d->value.len && kv_buf_set(&r.value, d->value.p, d->value.len) != 0)
		return KV_ENOMEM;
	int rv = kv_dedup_insert(s->dedup, d->client_id, d->request_id, &r, d->key.p, d->key.len,
	                         d->time_ms);
	kv_buf_fini(&r.value);
	return rv;
}

static int
in_begin(kv_server *s, kv_mig_in *in, const kv_req *rq, kv_sc_ack *ack)
{
	const kv_xfer *x = &rq->xfer;
	char addr[256] = "";
	bool ok;
	int rv;

	if (x->to_node != atomic_load(&s->node_id)) {
		ack->error = "this node is not the destination";
		return KV_EINVAL;
	}
	if (atomic_load(&s->epoch) < x->epoch) {
		ack->error = "configuration of the migration not applied yet";
		return KV_EBUSY;
	}
	if (in->committed) {
		ack->seq = in->acked;
		return KV_OK;
	}
	pthread_mutex_lock(&s->cfg_mu);
	const kv_node *n = s->cur ? kv_config_node(s->cur, x->from_node) : NULL;
	if (n)
		snprintf(addr, sizeof(addr), "%s", n->address);
	pthread_mutex_unlock(&s->cfg_mu);
	kv_buf_fini(&in->start);
	kv_buf_fini(&in->end);
	if (kv_buf_set(&in->start, x->start.p, x->start.len) != 0 ||
	    kv_buf_set(&in->end, x->end.p, x->end.len) != 0)
		return KV_ENOMEM;
	in->epoch = x->epoch;
	in->from = x->from_node;
	in->acked = 0;
	in->keys = in->bytes = 0;
	rv = kv_owner_fill(&s->owner, x->start.p, x->start.len, x->end.p, x->end.len,
	                   KV_OWN_INCOMING, x->from_node, addr[0] ? addr : NULL, 0, in->id);
	if (rv != 0)
		return rv;
	kv_owner_rdlock(&s->owner);
	ok = kv_owner_covers_locked(&s->owner, x->start.p, x->start.len, x->end.p, x->end.len,
	                            KV_OWN_INCOMING);
	kv_owner_unlock(&s->owner);
	if (!ok) {
		ack->error = "part of the range is served here";
		return KV_EINVAL;
	}
	if ((rv = clear_range(s, in)) != 0)
		return rv;
	in->acked = 1;
	KV_INFO(COMP, "incoming transfer", "id=%llu from=%u", (unsigned long long)in->id, in->from);
	return KV_OK;
}

static int
in_apply(kv_server *s, kv_mig_in *in, const kv_xfer *x, kv_sc_ack *ack)
{
	int rv = KV_OK;

	switch (x->kind) {
	case KV_XFER_CHUNK:
		for (size_t i = 0; i < x->ndedup && rv == 0; i++)
			rv = apply_dedup(s, &x->dedup[i]);
		for (size_t i = 0; i < x->nkv && rv == 0; i++) {
			const kv_sc_kv *kv = &x->kv[i];
			if (!kv_range_contains(in->start.data, in->start.len, in->end.data,
			                       in->end.len, kv->key.p, kv->key.len)) {
				ack->error = "chunk entry outside the range";
				return KV_EINVAL;
			}
			rv = kv_store_put(s->store, kv->key.p, kv->key.len,
			                  kv->value.len ? kv->value.p : (const uint8_t *)"",
			                  kv->value.len);
			in->keys++;
			in->bytes += kv->key.len + kv->value.len;
		}
		return rv;
	case KV_XFER_DELTA:
		for (size_t i = 0; i < x->ndelta && rv == 0; i++) {
			const kv_sc_delta *d = &x->delta[i];
			if (!kv_range_contains(in->start.data, in->start.len, in->end.data,
			                       in->end.len, d->key.p, d->key.len)) {
				ack->error = "delta entry outside the range";
				return KV_EINVAL;
			}
			if (d->del) {
				rv = kv_store_del(s->store, d->key.p, d->key.len, NULL);
				if (rv == KV_ENOTFOUND)
					rv = KV_OK;
			} else {
				rv = kv_store_put(s->store, d->key.p, d->key.len,
				                  d->value.len ? d->value.p : (const uint8_t *)"",
				                  d->value.len);
			}
			if (rv == 0 && d->has_dedup)
				rv = apply_dedup(s, &d->dedup);
		}
		return rv;
	case KV_XFER_FENCE:
		KV_DEBUG(COMP, "incoming fence", "id=%llu keys=%llu", (unsigned long long)in->id,
		         (unsigned long long)in->keys);
		return KV_OK;
	case KV_XFER_COMMIT:
		rv = kv_owner_set(&s->owner, in->start.data, in->start.len, in->end.data,
		                  in->end.len, KV_OWN_SERVE, 0, NULL, x->epoch, 0, NULL);
		if (rv == 0) {
			in->committed = true;
			KV_INFO(COMP, "incoming range committed", "id=%llu keys=%llu",
			        (unsigned long long)in->id, (unsigned long long)in->keys);
		}
		return rv;
	case KV_XFER_ABORT:
		kv_owner_drop_incoming(&s->owner, in->id);
		clear_range(s, in);
		KV_INFO(COMP, "incoming transfer aborted", "id=%llu", (unsigned long long)in->id);
		return KV_OK;
	default:
		return KV_EINVAL;
	}
}

void
kv_mig_in_handle(kv_server *s, const kv_req *rq, kv_sc_ack *ack)
{
	const kv_xfer *x = &rq->xfer;
	kv_mig_in *in;
	int rv;

	memset(ack, 0, sizeof(*ack));
	ack->migration_id = x->migration_id;
	in = in_find(s, x->migration_id, x->kind == KV_XFER_BEGIN);
	if (in == NULL) {
		ack->status = x->kind == KV_XFER_BEGIN ? KV_ENOMEM : KV_EINVAL;
		ack->error = "unknown transfer stream";
		return;
	}
	pthread_mutex_lock(&in->mu);
	if (x->kind == KV_XFER_BEGIN) {
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
	} else if (in->committed && x->kind != KV_XFER_ABORT) {
		rv = KV_OK;
		in->acked = x->seq;
	} else {
		rv = in_apply(s, in, x, ack);
		if (rv == 0)
			in->acked = x->kind == KV_XFER_ABORT ? 0 : x->seq;
	}
	ack->status = rv;
	ack->seq = in->acked;
	ack->keys = in->keys;
	ack->bytes = in->bytes;
	pthread_mutex_unlock(&in->mu);
}

void
kv_mig_in_forget(kv_server *s, uint64_t id)
{
	kv_mig_in *in = in_find(s, id, false);

	kv_owner_drop_incoming(&s->owner, id);
	if (in == NULL)
		return;
	pthread_mutex_lock(&in->mu);
	if (!in->committed && in->acked > 0) {
		/* The range is not served here: drop what arrived of it. */
		kv_owner_rdlock(&s->owner);
		bool unserved = !kv_owner_covers_locked(&s->owner, in->start.data, in->start.len,
		                                        in->end.data, in->end.len, KV_OWN_SERVE);
		kv_owner_unlock(&s->owner);
		if (unserved)
			clear_range(s, in);
		in->acked = 0;
	}
	pthread_mutex_unlock(&in->mu);
	KV_INFO(COMP, "incoming transfer forgotten", "id=%llu", (unsigned long long)id);
}

void
kv_mig_fini_all(kv_server *s)
{
	kv_mig_out *o, *on;
	kv_mig_in *in, *inn;

	pthread_mutex_lock(&s->mig_mu);
	o = s->outs;
	in = s->ins;
	s->outs = NULL;
	s->ins = NULL;
	pthread_mutex_unlock(&s->mig_mu);
	for (; o; o = on) {
		on = o->next;
		if (!pthread_equal(o->thr, pthread_self()))
			pthread_join(o->thr, NULL);
		free_recs(o->recs, o->nrecs);
		kv_buf_fini(&o->start);
		kv_buf_fini(&o->end);
		pthread_mutex_destroy(&o->mu);
		free(o);
	}
	for (; in; in = inn) {
		inn = in->next;
		kv_buf_fini(&in->start);
		kv_buf_fini(&in->end);
		pthread_mutex_destroy(&in->mu);
		free(in);
	}
}
