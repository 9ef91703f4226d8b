/*
 * migrate.c - range transfer between shard servers, both ends
 * (doc/protocol.md "Migrations"; wire: Transfer in shardkv.proto).
 *
 * DESIGN. Source: one thread per outgoing migration. It first attaches
 * itself to the ownership entry of the range (from then on every write to
 * the range takes the migration mutex and is appended to the delta buffer),
 * then streams Begin, the bulk copy in chunks of at most CHUNK_ENTRIES
 * entries and about CHUNK_BYTES bytes (kv_store_range_step, bounded per
 * step), the deltas until few are left, and the fence: under the mutex it sets
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
 * Large values. Every chunk and delta message carries about CHUNK_BYTES of
 * keys and values at most (plus one key), whatever the value sizes: a value
 * larger than CHUNK_BYTES is sent in slices (KeyValue.value_offset and
 * value_total) over consecutive messages with nothing in between; a delta
 * put sends its slices as DeltaRecords with the same seq, the dedup record
 * on the last one. The source holds one chunk of copies plus the value
 * being sliced (copied once from the store: there is no ranged read), and
 * the delta records it has taken, which it slices in place. The destination
 * reassembles into one buffer per stream (at most --max-value bytes),
 * refuses with KV_EPROTO any slice that does not continue the value in
 * progress (offset, total, key, seq, interleaving, a value still incomplete
 * at the end of the copy or at the fence) and drops the partial buffer, and
 * puts the value into the store only when it is complete. Duplicates and
 * refusals need nothing more: a duplicate is never applied, and a refusal
 * makes the source restart from Begin, which drops any partial value.
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

#define CHUNK_ENTRIES     4096u                /* entries per TransferChunk */
#define CHUNK_BYTES       (1024u * 1024u)      /* bytes per TransferChunk/Delta */
#define SLICE_MIN         (64u * 1024u)        /* smallest slice started in a message */
#define DEDUP_ENTRIES     5000u                /* dedup entries per TransferChunk */
#define DELTA_RECS        1000u                /* records per TransferDelta */
#define FENCE_RECS        256u                 /* fence when fewer deltas are left */
#define FENCE_BYTES       (256u * 1024u)       /* ... and fewer bytes */
#define DELTA_FLUSH_BYTES (8u * 1024u * 1024u) /* during the bulk copy, send the */
#define DELTA_FLUSH_RECS  65536u               /* recorded writes past either */
#define CATCHUP_ROUNDS    64                   /* then fence anyway */
#define DELETE_STEP       1000u                /* entries deleted per step */
#define XFER_TIMEOUT_MS   5000u                /* one transfer message */
#define PROGRESS_MS       500u                 /* MigrationProgress period */

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
		int rv = kv_sc_xfer_encode_auth(x, o->epoch, atomic_load(&s->node_id),
		                                kv_server__auth(s), &req);
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
	                 .keys_total = o->keys_total,
	                 .bytes_total = o->bytes_total,
	                 .rate_bytes_s = (uint64_t)((double)bytes * 1e9 / (double)el)};
	if (kv_server__ctl_call(o->srv, &rq, &r, 300) == 0)
		kv_sc_adm_resp_fini(&r);
}

/* Bytes left in a message budget of CHUNK_BYTES after `used`. */
/*
 * Tells the controller the range is fenced, and waits for its answer: once
 * it has acknowledged, it refuses to cancel the migration, so the handover
 * that follows cannot contradict the configuration. A migration it no
 * longer lists (cancelled meanwhile) returns KV_ECLOSED; so does stopping.
 */
static int
confirm_fence(kv_mig_out *o, uint64_t start_ns)
{
	kv_server *s = o->srv;
	unsigned backoff = 20;

	while (!atomic_load(&s->stopping)) {
		kv_adm_resp r;
		uint64_t el = kv_now_ns() - start_ns + 1;
		uint64_t bytes = atomic_load(&o->bytes_copied);
		kv_adm_req rq = {.kind = KV_ADM_PROGRESS,
		                 .node_id = atomic_load(&s->node_id),
		                 .migration_id = o->id,
		                 .phase = (int)KV_MIG_FENCED,
		                 .keys = atomic_load(&o->keys_copied),
		                 .bytes = bytes,
		                 .keys_total = o->keys_total,
		                 .bytes_total = o->bytes_total,
		                 .rate_bytes_s = (uint64_t)((double)bytes * 1e9 / (double)el)};
		if (kv_server__ctl_call(s, &rq, &r, 1000) == 0) {
			int st = r.status;
			kv_sc_adm_resp_fini(&r);
			if (st == KV_OK)
				return KV_OK;
			if (st == KV_ENOTFOUND) {
				KV_INFO(COMP, "fence refused: migration no longer listed",
				        "id=%llu", (unsigned long long)o->id);
				return KV_ECLOSED;
			}
		}
		kv_server__nap(s, backoff);
		backoff = backoff * 2 > 500 ? 500 : backoff * 2;
	}
	return KV_ECLOSED;
}

static size_t
budget_left(size_t used)
{
	return used < CHUNK_BYTES ? CHUNK_BYTES - used : 0;
}

/* Where one entry of a chunk being assembled lies in chunk_acc.data. */
typedef struct {
	size_t koff, klen;     /* the key */
	size_t voff, vlen;     /* the value or slice */
	uint64_t value_offset; /* slice: offset in the whole value; 0 when whole */
	uint64_t value_total;  /* slice: whole length; 0 when whole */
} chunk_ent;

/*
 * A chunk being assembled. Copied keys and values go back to back into one
 * buffer that is reused for every chunk, so what the copy keeps between
 * chunks is about CHUNK_BYTES plus one entry, whatever the mix of sizes.
 *
 * An entry that does not fit the rest of the budget waits in `carry`: the
 * store has no ranged read (kv_store_range_step hands the visitor the whole
 * value under a partition lock, and the value may change once the lock is
 * released), so a value too large for one chunk is copied out once, whole,
 * and then sent in slices of the budget from carry_off on. That one copy is
 * the only place the bulk copy holds more than a chunk.
 */
typedef struct {
	kv_buf data;     /* keys and values of the chunk */
	chunk_ent *ents; /* CHUNK_ENTRIES entries */
	size_t n;        /* entries */
	bool oom;        /* an allocation failed */
	bool carrying;   /* carry_key/carry_val hold an entry still to send */
	kv_buf carry_key;
	kv_buf carry_val;
	size_t carry_off; /* bytes of carry_val already in chunks */
} chunk_acc;

/* Appends an entry (or a slice: total != 0) to the chunk. Returns 0 or
 * KV_ENOMEM. */
static int
chunk_add(chunk_acc *a, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
          uint64_t off, uint64_t total)
{
	chunk_ent *e = &a->ents[a->n];
	e->koff = a->data.len;
	e->klen = klen;
	if (kv_buf_append(&a->data, key, klen) != 0)
		return KV_ENOMEM;
	e->voff = a->data.len;
	e->vlen = vlen;
	if (vlen && kv_buf_append(&a->data, val, vlen) != 0)
		return KV_ENOMEM;
	e->value_offset = off;
	e->value_total = total;
	a->n++;
	return KV_OK;
}

/* Store visitor of the bulk copy: copies entries that fit the chunk, stops
 * at the first one that does not and keeps it in the carry. */
static int
chunk_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	chunk_acc *a = arg;
	if (vlen > CHUNK_BYTES || (a->n > 0 && klen + vlen > budget_left(a->data.len))) {
		if (kv_buf_set(&a->carry_key, key, klen) != 0 ||
		    kv_buf_set(&a->carry_val, vlen ? val : (const uint8_t *)"", vlen) != 0)
			a->oom = true;
		a->carrying = !a->oom;
		a->carry_off = 0;
		return 1;
	}
	if (chunk_add(a, key, klen, vlen ? val : (const uint8_t *)"", vlen, 0, 0) != 0) {
		a->oom = true;
		return 1;
	}
	return 0;
}

/*
 * Moves what it can of the carried entry into the chunk: the whole entry
 * when it fits (values up to CHUNK_BYTES are never split), else a slice of
 * what is left of the budget. A slice is not started in a chunk that has
 * less than SLICE_MIN left, so slices stay large. Returns 1 when the carry
 * is all in the chunk (and released), 0 when the chunk is full, or KV_ENOMEM.
 */
static int
carry_emit(chunk_acc *a)
{
	size_t klen = a->carry_key.len, vlen = a->carry_val.len, left = budget_left(a->data.len);
	int rv;

	if (a->n == CHUNK_ENTRIES)
		return 0;
	if (vlen <= CHUNK_BYTES) {
		if (a->n > 0 && klen + vlen > left)
			return 0;
		rv = chunk_add(a, a->carry_key.data, klen,
		               vlen ? a->carry_val.data : (const uint8_t *)"", vlen, 0, 0);
	} else {
		if (a->n > 0 && left < SLICE_MIN)
			return 0;
		size_t take = vlen - a->carry_off < left ? vlen - a->carry_off : left;
		rv = chunk_add(a, a->carry_key.data, klen, a->carry_val.data + a->carry_off, take,
		               a->carry_off, vlen);
		a->carry_off += take;
		if (rv == 0 && a->carry_off < vlen)
			return 0;
	}
	if (rv != 0)
		return rv;
	/* Give a large value's memory back now rather than at the next carry. */
	if (a->carry_val.cap > CHUNK_BYTES)
		kv_buf_fini(&a->carry_val);
	a->carrying = false;
	return 1;
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

/*
 * Sends records as TransferDelta messages, in record order, each of at most
 * DELTA_RECS records and about CHUNK_BYTES of keys and values. A put whose
 * value is larger than CHUNK_BYTES goes as consecutive DeltaRecords with the
 * same seq, each carrying a slice (value_offset/value_total); its dedup
 * record rides on the last slice, so the destination applies both when the
 * value is complete. Slices point into the records: nothing is copied here.
 */
static int
send_recs(kv_mig_out *o, kv_rpc_client *cli, uint64_t *seq, kv_delta_rec *recs, size_t n,
          bool cancellable)
{
	kv_sc_delta *d = calloc(DELTA_RECS, sizeof(*d));
	kv_sc_ack ack;
	size_t i = 0;    /* next record */
	size_t voff = 0; /* bytes of recs[i].value already sent (split puts) */
	int rv = KV_OK;

	if (d == NULL)
		return KV_ENOMEM;
	while (i < n && rv == 0) {
		size_t k = 0, bytes = 0;
		while (i < n && k < DELTA_RECS) {
			const kv_delta_rec *r = &recs[i];
			size_t klen = r->key.len, vlen = r->value.len, left = budget_left(bytes);
			bool split = !r->del && vlen > CHUNK_BYTES;
			size_t take = vlen;
			kv_sc_delta *x = &d[k];
			if (!split && k > 0 && klen + vlen > left)
				break; /* whole records are never split: next message */
			if (split) {
				if (k > 0 && left < SLICE_MIN)
					break;
				take = vlen - voff < left ? vlen - voff : left;
			}
			memset(x, 0, sizeof(*x));
			x->seq = r->seq;
			x->del = r->del;
			x->key = (kv_bytes){r->key.data, klen};
			x->value = (kv_bytes){r->value.data ? r->value.data + voff : NULL, take};
			if (split) {
				x->value_offset = voff;
				x->value_total = vlen;
			}
			k++;
			bytes += klen + take;
			voff += take;
			if (voff < vlen)
				break; /* the message is full; the value goes on in the next */
			voff = 0;
			i++;
			if (r->has_dedup) {
				x->has_dedup = true;
				x->dedup = (kv_sc_dedup){.client_id = r->client,
				                         .request_id = r->req,
				                         .status = r->status,
				                         .value_len = r->value_len,
				                         .key = x->key,
				                         .time_ms = r->time_ms};
			}
		}
		kv_xfer x = {.migration_id = o->id,
		             .seq = ++*seq,
		             .kind = KV_XFER_DELTA,
		             .ndelta = k,
		             .delta = d};
		rv = xfer_send(o, cli, &x, cancellable, &ack);
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

	/* Totals for progress and ETA: a walk in bounded steps, writes go on. */
	if (kv_store_range_count(s->store, o->start.data, o->start.len, o->end.data, o->end.len,
	                         &o->keys_total, &o->bytes_total) != 0)
		o->keys_total = o->bytes_total = 0;
	*seq = 1;
	kv_xfer b = {.migration_id = o->id,
	             .seq = 1,
	             .kind = KV_XFER_BEGIN,
	             .epoch = o->epoch,
	             .start = {o->start.data, o->start.len},
	             .end = {o->end.data, o->end.len},
	             .from_node = atomic_load(&s->node_id),
	             .to_node = o->to,
	             .keys = o->keys_total,
	             .bytes = o->bytes_total};
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
		/* At most DEDUP_ENTRIES entries and about CHUNK_BYTES per message. */
		size_t k = 0, bytes = 0;
		while (off + k < da.n && k < DEDUP_ENTRIES && (k == 0 || bytes < CHUNK_BYTES)) {
			bytes += da.d[off + k].key.len + da.d[off + k].value.len;
			k++;
		}
		kv_xfer c = {.migration_id = o->id,
		             .seq = ++*seq,
		             .kind = KV_XFER_CHUNK,
		             .ndedup = k,
		             .dedup = da.d + off};
		if ((rv = xfer_send(o, cli, &c, true, &ack)) != 0)
			goto cleanup;
		off += k;
	}

	/* Bulk copy: chunks of at most CHUNK_ENTRIES entries and about
	 * CHUNK_BYTES (plus one key); a value larger than a chunk goes in
	 * slices over consecutive chunks, with nothing in between. */
	ca.ents = calloc(CHUNK_ENTRIES, sizeof(*ca.ents));
	kvs = calloc(CHUNK_ENTRIES, sizeof(*kvs));
	if (ca.ents == NULL || kvs == NULL) {
		rv = KV_ENOMEM;
		goto cleanup;
	}
	while (!cur.done || ca.carrying) {
		size_t whole = 0; /* keys this chunk completes: whole entries, last slices */
		ca.n = 0;
		ca.data.len = 0;
		for (;;) {
			if (ca.carrying && (rv = carry_emit(&ca)) <= 0) {
				if (rv < 0)
					goto cleanup;
				break; /* chunk full, the carry goes on in the next */
			}
			if (cur.done || ca.n == CHUNK_ENTRIES || ca.data.len >= CHUNK_BYTES)
				break;
			rv = kv_store_range_step(s->store, o->start.data, o->start.len, o->end.data,
			                         o->end.len, &cur, CHUNK_ENTRIES - ca.n, chunk_cb,
			                         &ca);
			if (rv != 0 || ca.oom) {
				rv = rv ? rv : KV_ENOMEM;
				goto cleanup;
			}
		}
		for (size_t i = 0; i < ca.n; i++) {
			const chunk_ent *e = &ca.ents[i];
			kvs[i].key = (kv_bytes){ca.data.data + e->koff, e->klen};
			kvs[i].value = (kv_bytes){ca.data.data + e->voff, e->vlen};
			kvs[i].value_offset = e->value_offset;
			kvs[i].value_total = e->value_total;
			if (e->value_total == 0 || e->value_offset + e->vlen == e->value_total)
				whole++;
		}
		kv_xfer c = {.migration_id = o->id,
		             .seq = ++*seq,
		             .kind = KV_XFER_CHUNK,
		             .nkv = ca.n,
		             .kv = kvs,
		             .last = cur.done && !ca.carrying};
		if ((rv = xfer_send(o, cli, &c, true, &ack)) != 0)
			goto cleanup;
		atomic_fetch_add(&o->keys_copied, whole);
		atomic_fetch_add(&o->bytes_copied, ca.data.len);
		atomic_fetch_add_explicit(&s->mig_bytes_sent, ca.data.len, memory_order_relaxed);
		pace(o, copy_start, atomic_load(&o->bytes_copied));
		/* Bound the recorded writes while the copy runs (a slow copy
		 * under heavy writes): send them between chunks. Safe because the
		 * next chunk is read after them and holds the newer state, and
		 * never inside a split value, whose slices must be consecutive. */
		if (!ca.carrying && !c.last) {
			pthread_mutex_lock(&o->mu);
			if (!o->lost &&
			    (o->rec_bytes >= DELTA_FLUSH_BYTES || o->nrecs >= DELTA_FLUSH_RECS))
				take_recs_locked(o, &recs, &nrecs);
			pthread_mutex_unlock(&o->mu);
			if (nrecs > 0) {
				rv = send_recs(o, cli, seq, recs, nrecs, true);
				free_recs(recs, nrecs);
				recs = NULL;
				nrecs = 0;
				if (rv != 0)
					goto cleanup;
			}
		}
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
	if ((rv = confirm_fence(o, start_ns)) != 0) {
		/* Cancelled before the controller learnt of the fence: the cancel
		 * wins, the range stays here (the destination never served it). */
		pthread_mutex_lock(&o->mu);
		atomic_store(&o->fenced, false);
		atomic_store(&o->cancel, true);
		pthread_mutex_unlock(&o->mu);
		goto cleanup;
	}
	KV_INFO(COMP, "fenced", "id=%llu deltas=%zu fence_us=%llu", (unsigned long long)o->id,
	        nrecs, (unsigned long long)((kv_now_ns() - fence_ns) / 1000));
cleanup:
	free_recs(recs, nrecs);
	kv_buf_fini(&ca.data);
	kv_buf_fini(&ca.carry_key);
	kv_buf_fini(&ca.carry_val);
	free(ca.ents);
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
		if (moved) {
			kv_dur_begin(s->dur);
			rv = kv_store_range_delete(s->store, o->start.data, o->start.len,
			                           o->end.data, o->end.len, DELETE_STEP, &deleted);
			/* Logged once the range is empty; a crash before that leaves
			 * keys of a range this node does not serve, dropped when the
			 * range next arrives (Begin clears it). */
			if (rv == 0)
				rv = kv_dur_log_range_del(s->dur, o->start.data, o->start.len,
				                          o->end.data, o->end.len, NULL);
			kv_dur_end(s->dur);
		}
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
	    (rv = kv_rpc_client_create_tls(o->to_addr, s->tls, &cli)) != 0) {
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
		if (should_quit(o, !atomic_load(&o->fenced) || atomic_load(&o->handed_over)))
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
	if (atomic_load(&o->handed_over)) {
		/* The destination serves the range (the configuration says so):
		 * never serve it here again, and drop the copy. */
		kv_owner_set(&s->owner, o->start.data, o->start.len, o->end.data, o->end.len,
		             KV_OWN_MOVED, o->to, o->to_addr, o->epoch, o->id, NULL);
		KV_INFO(COMP, "migration was completed before a restart", "id=%llu",
		        (unsigned long long)o->id);
		delete_moved(o);
		goto out;
	}
	if (atomic_load(&o->cancel) && cli != NULL) {
		kv_xfer a = {.migration_id = o->id,
		             .seq = ++seq,
		             .kind = KV_XFER_ABORT,
		             .reason = KV_ECLOSED};
		nng_msg *req = NULL, *rep = NULL;
		if (kv_sc_xfer_encode_auth(&a, o->epoch, atomic_load(&s->node_id),
		                           kv_server__auth(s), &req) == 0 &&
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

/*
 * An incoming stream as this file allocates it: kv_mig_in (server_int.h)
 * first, so that the two pointers are the same, then the state only the
 * destination code here uses. Every kv_mig_in is allocated by in_find and
 * freed by kv_mig_fini_all.
 */
typedef struct {
	kv_mig_in in;          /* must stay first */
	slice_rx rx;           /* protected by in.mu, as are the counters */
	uint64_t split_chunks; /* split values assembled from chunks, this attempt */
	uint64_t split_deltas; /* split values assembled from delta records */
} mig_in_ext;

/* The extension of a kv_mig_in allocated by in_find. */
static mig_in_ext *
ext_of(kv_mig_in *in)
{
	return (mig_in_ext *)in;
}

static slice_rx *
rx_of(kv_mig_in *in)
{
	return &ext_of(in)->rx;
}

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
rx_slice(kv_server *s, slice_rx *rx, bool delta, uint64_t seq, kv_bytes key, kv_bytes val,
         uint64_t off, uint64_t total, bool *complete, const char **why)
{
	*complete = false;
	if (!rx->active) {
		if (off != 0) {
			*why = "split value does not start at offset 0";
			return KV_EPROTO;
		}
		if (total > s->max_value) {
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
in_find(kv_server *s, uint64_t id, bool create)
{
	kv_mig_in *in;

	pthread_mutex_lock(&s->mig_mu);
	for (in = s->ins; in && in->id != id; in = in->next)
		;
	if (in == NULL && create) {
		mig_in_ext *x = calloc(1, sizeof(*x));
		if (x != NULL) {
			in = &x->in;
			in->id = id;
			pthread_mutex_init(&in->mu, NULL);
			in->next = s->ins;
			s->ins = in;
		}
	}
	pthread_mutex_unlock(&s->mig_mu);
	return in;
}

/* Drops every key of the stream's range (bounded steps, caller holds in->mu). */
static int
clear_range(kv_server *s, kv_mig_in *in)
{
	int rv;
	/* Applied, then logged, inside one barrier section (durable.h). */
	kv_dur_begin(s->dur);
	do
		rv = kv_store_range_delete(s->store, in->start.data, in->start.len, in->end.data,
		                           in->end.len, DELETE_STEP, NULL);
	while (rv == KV_EBUSY);
	if (rv == 0)
		rv = kv_dur_log_range_del(s->dur, in->start.data, in->start.len, in->end.data,
		                          in->end.len, NULL);
	kv_dur_end(s->dur);
	return rv;
}

static int
apply_dedup(kv_server *s, const kv_sc_dedup *d)
{
	kv_dedup_result r = {.status = d->status, .value_len = d->value_len};
	if (d->value.len && kv_buf_set(&r.value, d->value.p, d->value.len) != 0)
		return KV_ENOMEM;
	kv_dur_dedup dd = {.client = d->client_id,
	                   .req = d->request_id,
	                   .value_len = d->value_len,
	                   .time_ms = d->time_ms};
	kv_dur_begin(s->dur);
	int rv = kv_dedup_insert(s->dedup, d->client_id, d->request_id, &r, d->key.p, d->key.len,
	                         d->time_ms);
	if (rv == 0)
		rv = kv_dur_log_dedup(s->dur, &dd, d->status, d->key.p, d->key.len, NULL);
	kv_dur_end(s->dur);
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
	rx_drop(rx_of(in)); /* a restarted stream resends every slice */
	ext_of(in)->split_chunks = ext_of(in)->split_deltas = 0;
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

/* Puts one whole value of the stream into the store (caller holds in->mu). */
static int
in_put(kv_server *s, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	const uint8_t *v = vlen ? val : (const uint8_t *)"";
	/* No stripe lock: the range is not served here until the commit, and
	 * the stream is serialised by in->mu. */
	kv_dur_begin(s->dur);
	int rv = kv_store_put(s->store, key, klen, v, vlen);
	if (rv == 0)
		rv = kv_dur_log_put(s->dur, key, klen, v, vlen, NULL, NULL);
	kv_dur_end(s->dur);
	return rv;
}

/* Applies the chunk entries of x, reassembling split values. */
static int
in_chunk(kv_server *s, kv_mig_in *in, const kv_xfer *x, kv_sc_ack *ack)
{
	slice_rx *rx = rx_of(in);
	int rv = KV_OK;

	for (size_t i = 0; i < x->ndedup && rv == 0; i++)
		rv = apply_dedup(s, &x->dedup[i]);
	for (size_t i = 0; i < x->nkv && rv == 0; i++) {
		const kv_sc_kv *kv = &x->kv[i];
		bool complete;
		if (!kv_range_contains(in->start.data, in->start.len, in->end.data, in->end.len,
		                       kv->key.p, kv->key.len)) {
			ack->error = "chunk entry outside the range";
			return KV_EINVAL;
		}
		if (kv->value_total == 0) {
			if (rx->active) {
				ack->error = "a whole entry interleaved with a split value";
				return KV_EPROTO;
			}
			rv = in_put(s, kv->key.p, kv->key.len, kv->value.p, kv->value.len);
			in->keys++;
			in->bytes += kv->key.len + kv->value.len;
			continue;
		}
		rv = rx_slice(s, rx, false, 0, kv->key, kv->value, kv->value_offset,
		              kv->value_total, &complete, &ack->error);
		if (rv == 0 && complete) {
			rv = in_put(s, rx->key.data, rx->key.len, rx->val.data, rx->val.len);
			in->keys++;
			in->bytes += rx->key.len + rx->val.len;
			KV_DEBUG(COMP, "split value assembled", "id=%llu bytes=%zu delta=0",
			         (unsigned long long)in->id, rx->val.len);
			ext_of(in)->split_chunks++;
			rx_drop(rx);
		}
	}
	if (rv == 0 && x->last && rx->active) {
		ack->error = "bulk copy ended inside a split value";
		return KV_EPROTO;
	}
	return rv;
}

/* Applies one whole delta record: key, value (NULL for a delete), dedup. */
static int
in_delta_rec(kv_server *s, const kv_sc_delta *d, const uint8_t *val, size_t vlen)
{
	int rv;
	if (d->del) {
		kv_dur_begin(s->dur);
		rv = kv_store_del(s->store, d->key.p, d->key.len, NULL);
		if (rv == KV_ENOTFOUND)
			rv = KV_OK;
		if (rv == 0)
			rv = kv_dur_log_del(s->dur, d->key.p, d->key.len, NULL, NULL);
		kv_dur_end(s->dur);
	} else {
		rv = in_put(s, d->key.p, d->key.len, val, vlen);
	}
	if (rv == 0 && d->has_dedup)
		rv = apply_dedup(s, &d->dedup);
	return rv;
}

/* Applies the records of a TransferDelta in order, reassembling split puts. */
static int
in_delta(kv_server *s, kv_mig_in *in, const kv_xfer *x, kv_sc_ack *ack)
{
	slice_rx *rx = rx_of(in);
	int rv = KV_OK;

	for (size_t i = 0; i < x->ndelta && rv == 0; i++) {
		const kv_sc_delta *d = &x->delta[i];
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
			rv = in_delta_rec(s, d, d->value.p, d->value.len);
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
			rv = in_delta_rec(s, d, rx->val.data, rx->val.len);
			KV_DEBUG(COMP, "split value assembled", "id=%llu bytes=%zu delta=1",
			         (unsigned long long)in->id, rx->val.len);
			ext_of(in)->split_deltas++;
			rx_drop(rx);
		}
	}
	return rv;
}

static int
in_apply(kv_server *s, kv_mig_in *in, const kv_xfer *x, kv_sc_ack *ack)
{
	int rv = KV_OK;

	/* Slices of one value are consecutive: only chunks or deltas may follow. */
	if (rx_of(in)->active && x->kind != KV_XFER_CHUNK && x->kind != KV_XFER_DELTA &&
	    x->kind != KV_XFER_ABORT) {
		ack->error = "split value incomplete at the fence";
		return KV_EPROTO;
	}
	switch (x->kind) {
	case KV_XFER_CHUNK:
		return in_chunk(s, in, x, ack);
	case KV_XFER_DELTA:
		return in_delta(s, in, x, ack);
	case KV_XFER_FENCE:
		/* The source forgets the range once this is acknowledged and the
		 * handover published: the range must be on disk here first. */
		if ((rv = kv_dur_sync(s->dur)) != 0) {
			ack->error = "cannot make the range durable here";
			return rv;
		}
		KV_DEBUG(COMP, "incoming fence", "id=%llu keys=%llu", (unsigned long long)in->id,
		         (unsigned long long)in->keys);
		return KV_OK;
	case KV_XFER_COMMIT:
		rv = kv_owner_set(&s->owner, in->start.data, in->start.len, in->end.data,
		                  in->end.len, KV_OWN_SERVE, 0, NULL, x->epoch, 0, NULL);
		if (rv == 0) {
			in->committed = true;
			KV_INFO(COMP, "incoming range committed",
			        "id=%llu keys=%llu split_chunk_values=%llu split_delta_values=%llu",
			        (unsigned long long)in->id, (unsigned long long)in->keys,
			        (unsigned long long)ext_of(in)->split_chunks,
			        (unsigned long long)ext_of(in)->split_deltas);
		}
		return rv;
	case KV_XFER_ABORT:
		rx_drop(rx_of(in));
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
	} else if (in->committed && x->kind == KV_XFER_ABORT) {
		/* The range is served here now: dropping it would lose it. */
		ack->error = "transfer already committed";
		rv = KV_EINVAL;
	} else if (in->committed) {
		rv = KV_OK;
		in->acked = x->seq;
	} else {
		rv = in_apply(s, in, x, ack);
		if (rv == 0) {
			in->acked = x->kind == KV_XFER_ABORT ? 0 : x->seq;
		} else {
			/* Refused: the source restarts from Begin (which clears the
			 * range), so a partial value is never continued. */
			rx_drop(rx_of(in));
			KV_WARN(COMP, "transfer message refused",
			        "id=%llu seq=%llu err=%s why=\"%s\"", (unsigned long long)in->id,
			        (unsigned long long)x->seq, kv_errname(rv),
			        ack->error ? ack->error : "");
		}
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
	rx_drop(rx_of(in));
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
		rx_drop(rx_of(in));
		kv_buf_fini(&rx_of(in)->key);
		kv_buf_fini(&in->start);
		kv_buf_fini(&in->end);
		pthread_mutex_destroy(&in->mu);
		free(ext_of(in));
	}
}
