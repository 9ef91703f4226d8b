/*
 * migrate_out.c - the source side of range transfer (migrate.h;
 * doc/protocol.md "Migrations"; wire: Transfer in shardkv.proto), and the
 * migration set's life cycle.
 *
 * DESIGN. One thread per outgoing migration. It first attaches
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
 * waits for the destination and nothing else is blocked. The stream is a
 * state machine (stream_phase): Begin, the exactly-once entries, the bulk
 * copy, the catch-up and the fence, one function each. The bulk copy's
 * entries travel packed in one field (TransferChunk.packed_entries) when the
 * destination's answer to Begin says it reads them, else one KeyValue each.
 *
 * Large values. Every chunk and delta message carries about CHUNK_BYTES of
 * keys and values at most (plus one key), whatever the value sizes: a value
 * larger than CHUNK_BYTES is sent in slices (KeyValue.value_offset and
 * value_total) over consecutive messages with nothing in between; a delta
 * put sends its slices as DeltaRecords with the same seq, the dedup record
 * on the last one. The source holds one chunk of copies plus the value
 * being sliced (copied once from the store: there is no ranged read), and
 * the delta records it has taken, which it slices in place. The destination
 * (migrate_in.c) reassembles them and puts a value into the store only when
 * it is complete.
 *
 * Correctness of copy + deltas: every write that can miss the bulk copy
 * happens after the attach, so it is in the deltas, and deltas are applied
 * after every chunk in write order, so the destination ends with the last
 * write of every key. Nothing here decides ownership beyond the stream:
 * the server's configuration thread starts and cancels migrations
 * (kv_mig_out_start, kv_mig_out_reconcile). This file reaches the server
 * only through kv_mig_env.
 */
#include "common/err.h"
#include "common/key.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/slice.h"
#include "shardserver/migrate_int.h"

#include <errno.h>
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
#define CATCHUP_STALLS    3     /* rounds in a row whose backlog did not shrink: fence */
#define XFER_TIMEOUT_MS   5000u /* one transfer message */
#define COPY_PIPE         2u    /* bulk-copy chunks in flight (<= KV_MIG_PIPE) */
#define PROGRESS_MS       500u  /* MigrationProgress period */

/* One write recorded while its range is being copied (a DeltaRecord). */
typedef struct {
	uint64_t seq;       /* source write sequence */
	bool del;           /* delete, else put */
	kv_buf key;         /* the key */
	kv_buf value;       /* put: the whole value after the write */
	uint64_t expire_at; /* put: the key's deadline after the write; 0: none */
	bool has_dedup;     /* the write had (client, request) ids */
	uint64_t client;    /* dedup: client id */
	uint64_t req;       /* dedup: request id */
	int status;         /* dedup: result status */
	uint64_t value_len; /* dedup: append result */
	uint64_t time_ms;   /* dedup: when applied */
	bool has_del_value; /* dedup of a delete: value holds what it returned */
} kv_delta_rec;

/* An outgoing migration: this node is the source. */
struct kv_mig_out {
	kv_mig *mig;                       /* the set it belongs to */
	uint64_t id;                       /* Migration.id */
	uint64_t epoch;                    /* Migration.epoch */
	kv_buf start;                      /* the moving range */
	kv_buf end;                        /* empty: end of the key space */
	uint32_t to;                       /* destination node */
	uint32_t rate_mb_s;                /* bulk copy rate limit, MB/s; 0: unlimited */
	char to_addr[256];                 /* its URL */
	pthread_t thr;                     /* the task thread */
	bool thr_started;                  /* thr runs (set under kv_mig.mu) */
	atomic_bool fenced;                /* writes refused (MOVING); set under mu */
	atomic_bool cancel;                /* the configuration dropped the migration */
	atomic_bool handed_over;           /* ... and gives the range to `to`: it was done */
	atomic_bool reclaimed;             /* the configuration dropped it while fenced and
	                                      gives the range back here (the destination was
	                                      removed): the task ends, the range is served */
	atomic_bool must_commit;           /* this run or an earlier one may have sent
	                                      TransferCommit (the handover file lists it): the
	                                      fence never lifts, the range only leaves */
	atomic_bool finished;              /* the thread has returned */
	atomic_bool reported;              /* committed and MigrationDone acknowledged */
	atomic_uint_fast64_t keys_copied;  /* acknowledged keys */
	atomic_uint_fast64_t bytes_copied; /* acknowledged bytes */
	uint64_t keys_total;  /* keys in the range when the copy began, estimated (task thread) */
	uint64_t bytes_total; /* their key + value bytes (task thread) */

	pthread_mutex_t mu; /* orders writes to the range with `fenced`,
	                       protects everything down to the blank line */
	kv_delta_rec *recs; /* writes since the copy started */
	size_t nrecs;       /* records in recs */
	size_t caprecs;     /* capacity of recs */
	size_t rec_bytes;   /* key + value bytes in recs */
	uint32_t *rix;      /* recs by key (open addressing): an index + 1, 0 empty */
	size_t rixcap;      /* slots of rix, a power of 2 (0: none) */
	uint64_t write_seq; /* last DeltaRecord.seq assigned */
	bool lost;          /* a record could not be kept: restart the stream */

	struct kv_mig_out *next; /* kv_mig.outs list */
};

/* ------------------------------------------------------------------------
 * Delta buffer
 * ------------------------------------------------------------------------ */

static void
rec_fini(kv_delta_rec *r)
{
	kv_buf_fini(&r->key);
	kv_buf_fini(&r->value);
}

/* Puts recs[i] into the key index; returns the index of the record of the
 * same key it replaces there, or SIZE_MAX. The index has room (caller). */
static size_t
rix_put(kv_mig_out *m, size_t i)
{
	const kv_buf *k = &m->recs[i].key;
	size_t mask = m->rixcap - 1, slot = (size_t)kv_hash64(k->data, k->len) & mask;

	for (;; slot = (slot + 1) & mask) {
		uint32_t v = m->rix[slot];
		if (v == 0) {
			m->rix[slot] = (uint32_t)i + 1;
			return SIZE_MAX;
		}
		const kv_buf *o = &m->recs[v - 1].key;
		if (o->len == k->len && (k->len == 0 || memcmp(o->data, k->data, k->len) == 0)) {
			m->rix[slot] = (uint32_t)i + 1;
			return v - 1;
		}
	}
}

/*
 * A newer record of the key of recs[i] makes the value of an older one that
 * is still buffered useless: the destination applies the records in order
 * and serves the range only after the last, so only the key's last value
 * is ever read there. The older record stays (its exactly-once entry, and
 * a delete's returned value, are needed) but its put carries an empty
 * value. Without this, a key appended to during a move sent its whole
 * value once per append, and a catch-up of such writes could not converge.
 * No index (out of memory, or too many records): nothing is dropped.
 */
static void
supersede_locked(kv_mig_out *m, size_t i)
{
	if (i >= UINT32_MAX - 1)
		return;
	if (m->rixcap < 2 * (i + 1)) {
		size_t nc = m->rixcap ? m->rixcap * 2 : 512;
		while (nc < 2 * (i + 1))
			nc *= 2;
		uint32_t *n = calloc(nc, sizeof(*n));
		if (n == NULL)
			return;
		free(m->rix);
		m->rix = n;
		m->rixcap = nc;
		for (size_t j = 0; j < i; j++)
			(void)rix_put(m, j);
	}
	size_t old = rix_put(m, i);
	if (old == SIZE_MAX)
		return;
	kv_delta_rec *o = &m->recs[old];
	if (!o->del && o->value.len > 0) {
		m->rec_bytes -= o->value.len;
		kv_buf_fini(&o->value);
	}
}

void
kv_mig_out_record_locked(kv_mig_out *m, const void *key, size_t klen, const void *value,
                         size_t vlen, const kv_mig_dedup *dedup)
{
	kv_mig_out_record_x_locked(m, key, klen, value, vlen, 0, dedup);
}

void
kv_mig_out_record_x_locked(kv_mig_out *m, const void *key, size_t klen, const void *value,
                           size_t vlen, uint64_t expire_at, const kv_mig_dedup *dedup)
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
	/* A delete's record keeps the value it returned in `value`, for its
	 * dedup entry; the delete itself carries no value. */
	bool dv = value == NULL && dedup != NULL && dedup->has_del_value;
	if (kv_buf_set(&r->key, key, klen) != 0 ||
	    (value && kv_buf_set(&r->value, vlen ? value : "", vlen) != 0) ||
	    (dv && dedup->del_value.len &&
	     kv_buf_set(&r->value, dedup->del_value.p, dedup->del_value.len) != 0)) {
		rec_fini(r);
		m->lost = true;
		return;
	}
	r->has_del_value = dv;
	r->del = value == NULL;
	r->expire_at = r->del ? 0 : expire_at;
	r->seq = ++m->write_seq;
	if (dedup != NULL) {
		r->has_dedup = true;
		r->client = dedup->client;
		r->req = dedup->req;
		r->status = KV_OK;
		r->value_len = dedup->value_len;
		r->time_ms = dedup->time_ms;
	}
	m->nrecs++;
	m->rec_bytes += klen + vlen;
	supersede_locked(m, m->nrecs - 1);
}

/* Takes the buffered records (caller holds mu). */
static void
take_recs_locked(kv_mig_out *o, kv_delta_rec **recs, size_t *n)
{
	*recs = o->recs;
	*n = o->nrecs;
	o->recs = NULL;
	o->nrecs = o->caprecs = o->rec_bytes = 0;
	if (o->rix != NULL)
		memset(o->rix, 0, o->rixcap * sizeof(*o->rix));
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
	return atomic_load(&o->mig->stopping) || (cancellable && atomic_load(&o->cancel)) ||
	       atomic_load(&o->reclaimed);
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
 * Sends one transfer message, x encoded as msg (kept by the caller; each
 * attempt sends a copy), until the destination acknowledges it. Returns 0
 * (acknowledged), KV_ECLOSED (stopping or cancelled), or the destination's
 * refusal (the caller restarts the stream).
 */
static int
xfer_send_msg(kv_mig_out *o, kv_rpc_client *cli, const kv_xfer *x, const nng_msg *msg,
              bool cancellable, kv_xfer_ack *ack)
{
	kv_mig *s = o->mig;
	unsigned backoff = 20;

	while (!should_quit(o, cancellable)) {
		nng_msg *req = NULL, *rep = NULL;
		int rv = nng_msg_dup(&req, msg) == 0 ? KV_OK : KV_ENOMEM;
		if (rv != 0)
			return rv;
		rv = kv_rpc_call(cli, req, &rep, XFER_TIMEOUT_MS);
		if (rv == 0) {
			rv = kv_xfer_ack_decode(nng_msg_body(rep), nng_msg_len(rep), ack);
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
		kv_mig__nap(s, backoff);
		backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
	}
	return KV_ECLOSED;
}

/* xfer_send_msg of x, encoded here. */
static int
xfer_send(kv_mig_out *o, kv_rpc_client *cli, const kv_xfer *x, bool cancellable, kv_xfer_ack *ack)
{
	kv_mig *s = o->mig;
	nng_msg *req = NULL;
	int rv = kv_xfer_encode(x, o->epoch, kv_mig__node_id(s), s->env.auth, &req);
	if (rv != 0)
		return rv;
	rv = xfer_send_msg(o, cli, x, req, cancellable, ack);
	nng_msg_free(req);
	return rv;
}

static void
report_progress(kv_mig_out *o, kv_mig_phase phase, uint64_t start_ns)
{
	kv_admin_resp r;
	uint64_t el = kv_now_ns() - start_ns + 1;
	uint64_t bytes = atomic_load(&o->bytes_copied);
	kv_admin_req rq = {.op = KV_ADM_PROGRESS,
	                   .node_id = kv_mig__node_id(o->mig),
	                   .mig_id = o->id,
	                   /* Once committed anywhere, the controller must keep
	                    * refusing to cancel it, whatever a new attempt does. */
	                   .phase = atomic_load(&o->must_commit) ? KV_MIG_FENCED : phase,
	                   .keys_copied = atomic_load(&o->keys_copied),
	                   .bytes_copied = bytes,
	                   .keys_total = o->keys_total,
	                   .bytes_total = o->bytes_total,
	                   .rate_bytes_s = (uint64_t)((double)bytes * 1e9 / (double)el)};
	if (kv_mig__ctl_call(o->mig, &rq, &r, 300) == 0)
		kv_admin_resp_fini(&r);
}

/*
 * Tells the controller the range is fenced, and waits for its answer: once
 * it has acknowledged, it refuses to cancel the migration, so the handover
 * that follows cannot contradict the configuration. A migration it no
 * longer lists (cancelled meanwhile) returns KV_ECLOSED; so does stopping.
 */
static int
confirm_fence(kv_mig_out *o, uint64_t start_ns)
{
	kv_mig *s = o->mig;
	unsigned backoff = 20;

	while (!atomic_load(&s->stopping)) {
		kv_admin_resp r;
		uint64_t el = kv_now_ns() - start_ns + 1;
		uint64_t bytes = atomic_load(&o->bytes_copied);
		kv_admin_req rq = {.op = KV_ADM_PROGRESS,
		                   .node_id = kv_mig__node_id(s),
		                   .mig_id = o->id,
		                   .phase = KV_MIG_FENCED,
		                   .keys_copied = atomic_load(&o->keys_copied),
		                   .bytes_copied = bytes,
		                   .keys_total = o->keys_total,
		                   .bytes_total = o->bytes_total,
		                   .rate_bytes_s = (uint64_t)((double)bytes * 1e9 / (double)el)};
		if (kv_mig__ctl_call(s, &rq, &r, 1000) == 0) {
			int st = r.err;
			kv_admin_resp_fini(&r);
			if (st == KV_OK)
				return KV_OK;
			if (st == KV_ENOTFOUND) {
				KV_INFO(COMP, "fence refused: migration no longer listed",
				        "id=%llu", (unsigned long long)o->id);
				return KV_ECLOSED;
			}
		}
		kv_mig__nap(s, backoff);
		backoff = backoff * 2 > 500 ? 500 : backoff * 2;
	}
	return KV_ECLOSED;
}

/* Bytes left in a message budget of CHUNK_BYTES after `used`. */
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
	uint64_t expire_at;    /* the key's deadline; 0: none */
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
	uint64_t carry_at; /* the carried key's deadline */
	size_t carry_off;  /* bytes of carry_val already in chunks */
} chunk_acc;

/* Appends an entry (or a slice: total != 0) to the chunk. Returns 0 or
 * KV_ENOMEM. */
static int
chunk_add(chunk_acc *a, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
          uint64_t off, uint64_t total, uint64_t at)
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
	e->expire_at = at;
	a->n++;
	return KV_OK;
}

/* Store visitor of the bulk copy: copies entries that fit the chunk, stops
 * at the first one that does not and keeps it in the carry. */
static int
chunk_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen, uint64_t at)
{
	chunk_acc *a = arg;
	if (vlen > CHUNK_BYTES || (a->n > 0 && klen + vlen > budget_left(a->data.len))) {
		if (kv_buf_set(&a->carry_key, key, klen) != 0 ||
		    kv_buf_set(&a->carry_val, vlen ? val : (const uint8_t *)"", vlen) != 0)
			a->oom = true;
		a->carrying = !a->oom;
		a->carry_off = 0;
		a->carry_at = at;
		return 1;
	}
	if (chunk_add(a, key, klen, vlen ? val : (const uint8_t *)"", vlen, 0, 0, at) != 0) {
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
		               vlen ? a->carry_val.data : (const uint8_t *)"", vlen, 0, 0,
		               a->carry_at);
	} else {
		if (a->n > 0 && left < SLICE_MIN)
			return 0;
		size_t take = vlen - a->carry_off < left ? vlen - a->carry_off : left;
		rv = chunk_add(a, a->carry_key.data, klen, a->carry_val.data + a->carry_off, take,
		               a->carry_off, vlen, a->carry_at);
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

/* Dedup entries of the range and every client's floor, collected for the
 * first chunks. */
typedef struct {
	kv_xfer_dedup *d;  /* entries (bytes in bufs) */
	kv_buf *bufs;      /* 2 per entry: key, value */
	size_t n;          /* entries */
	size_t cap;        /* capacity */
	kv_xfer_floor *fl; /* floors */
	size_t nfl, flcap; /* floors, capacity */
	bool oom;          /* allocation failed */
} dedup_acc;

/* Collects a client's floor: the destination must refuse, like this node,
 * a retry of a write this node may have forgotten, whose entry the copy
 * therefore cannot bring (doc/replication.md "Exactly-once across copies"
 * does the same for replica copies). The floor is the client's, over every
 * key. */
static void
floor_cb(void *arg, uint64_t client, uint64_t floor)
{
	dedup_acc *a = arg;
	if (a->oom)
		return;
	if (a->nfl == a->flcap) {
		size_t nc = a->flcap ? a->flcap * 2 : 64;
		kv_xfer_floor *nf = realloc(a->fl, nc * sizeof(*nf));
		if (nf == NULL) {
			a->oom = true;
			return;
		}
		a->fl = nf;
		a->flcap = nc;
	}
	a->fl[a->nfl++] = (kv_xfer_floor){.client_id = client, .floor = floor};
}

static void
dedup_cb(void *arg, uint64_t client, uint64_t req, const kv_dedup_result *res, const uint8_t *key,
         size_t klen, uint64_t time_ms)
{
	dedup_acc *a = arg;
	if (a->oom)
		return;
	if (a->n == a->cap) {
		size_t nc = a->cap ? a->cap * 2 : 64;
		kv_xfer_dedup *nd = realloc(a->d, nc * sizeof(*nd));
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
	a->d[a->n] = (kv_xfer_dedup){.client_id = client,
	                             .request_id = req,
	                             .status = res->status,
	                             .value_len = res->value_len,
	                             .has_value = res->has_value,
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
	kv_xfer_delta *d = calloc(DELTA_RECS, sizeof(*d));
	kv_xfer_ack ack;
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
			kv_xfer_delta *x = &d[k];
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
			x->expire_at = r->expire_at;
			x->key = (kv_bytes){r->key.data, klen};
			x->value =
			    r->del ? (kv_bytes){0}
			           : (kv_bytes){r->value.data ? r->value.data + voff : NULL, take};
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
				x->dedup = (kv_xfer_dedup){.client_id = r->client,
				                           .request_id = r->req,
				                           .status = r->status,
				                           .value_len = r->value_len,
				                           .key = x->key,
				                           .time_ms = r->time_ms};
				if (r->del && r->has_del_value) {
					x->dedup.has_value = true;
					x->dedup.value = (kv_bytes){r->value.data, r->value.len};
				}
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

/*
 * The stream as a state machine: one function per phase, each returning the
 * next phase, or STREAM_FAILED with the error in x->rv. Every attempt starts
 * at STREAM_BEGIN (a refused message restarts from there); STREAM_FENCED
 * means the destination holds everything and the range is fenced here.
 */
typedef enum {
	STREAM_BEGIN,   /* TransferBegin: the destination clears the range */
	STREAM_DEDUP,   /* the range's exactly-once entries, in chunks */
	STREAM_COPY,    /* the bulk copy, with recorded writes between chunks */
	STREAM_CATCHUP, /* recorded writes until few are left */
	STREAM_FENCE,   /* fence, the last writes, TransferFence, controller ack */
	STREAM_FENCED,  /* done: the destination holds everything */
	STREAM_FAILED,  /* x->rv says why */
} stream_phase;

/* The state of one attempt at streaming, shared by the phases. */
typedef struct {
	kv_mig_out *o;          /* the migration */
	kv_rpc_client *cli;     /* to the destination */
	uint64_t *seq;          /* last seq sent */
	uint64_t start_ns;      /* when the migration started (progress rates) */
	uint64_t copy_start;    /* when the bulk copy started (pacing) */
	uint64_t last_progress; /* last MigrationProgress of the copy */
	kv_xfer_ack ack;        /* the last acknowledgement */
	bool packed;            /* the destination reads packed chunk entries (its ack
	                           to Begin said so) */
	bool committed;         /* the destination said it has committed already */
	kv_store_cursor cur;    /* bulk copy position */
	chunk_acc ca;           /* the chunk being assembled */
	dedup_acc da;           /* the range's exactly-once entries */
	kv_xfer_kv *kvs;        /* CHUNK_ENTRIES wire entries pointing into ca */
	kv_delta_rec *recs;     /* records taken and not yet freed */
	size_t nrecs;           /* entries in recs */
	int rv;                 /* STREAM_FAILED: the error */
} stream_ctx;

/* Fails the attempt with rv. */
static stream_phase
stream_fail(stream_ctx *x, int rv)
{
	x->rv = rv;
	return STREAM_FAILED;
}

/* Sends the records taken into x->recs and frees them. */
static int
stream_send_recs(stream_ctx *x, bool cancellable)
{
	int rv = send_recs(x->o, x->cli, x->seq, x->recs, x->nrecs, cancellable);
	free_recs(x->recs, x->nrecs);
	x->recs = NULL;
	x->nrecs = 0;
	return rv;
}

/* Drops what earlier attempts recorded, counts the range and sends Begin. */
static stream_phase
phase_begin(stream_ctx *x)
{
	kv_mig_out *o = x->o;
	kv_mig *s = o->mig;
	int rv;

	pthread_mutex_lock(&o->mu);
	take_recs_locked(o, &x->recs, &x->nrecs);
	o->lost = false;
	pthread_mutex_unlock(&o->mu);
	free_recs(x->recs, x->nrecs);
	x->recs = NULL;
	x->nrecs = 0;
	atomic_store(&o->keys_copied, 0);
	atomic_store(&o->bytes_copied, 0);

	/* Totals for progress and ETA, estimated from a sample of the range's
	 * partitions (exact for a small range): counting every key would walk
	 * the range once more before the copy walks it. */
	if (kv_store_range_estimate(s->env.store, o->start.data, o->start.len, o->end.data,
	                            o->end.len, KV_MIG_COUNT_SAMPLE, &o->keys_total,
	                            &o->bytes_total, NULL) != 0)
		o->keys_total = o->bytes_total = 0;
	*x->seq = 1;
	kv_xfer b = {.migration_id = o->id,
	             .seq = 1,
	             .kind = KV_XFER_BEGIN,
	             .epoch = o->epoch,
	             .start = {o->start.data, o->start.len},
	             .end = {o->end.data, o->end.len},
	             .from_node = kv_mig__node_id(s),
	             .to_node = o->to,
	             .keys = o->keys_total,
	             .bytes = o->bytes_total};
	if ((rv = xfer_send(o, x->cli, &b, true, &x->ack)) != 0)
		return stream_fail(x, rv);
	if (x->ack.committed) {
		/* An earlier run of this node committed it: the destination
		 * serves the range. Nothing is to be copied or fenced again. */
		if (!atomic_load(&o->must_commit))
			KV_WARN(COMP, "destination committed a migration this node never recorded",
			        "id=%llu", (unsigned long long)o->id);
		pthread_mutex_lock(&o->mu);
		atomic_store(&o->fenced, true);
		atomic_store(&o->must_commit, true);
		pthread_mutex_unlock(&o->mu);
		x->committed = true;
		return STREAM_FENCED;
	}
	x->packed = x->ack.packed_ok;
	KV_INFO(COMP, "copy started", "id=%llu to=%u rate_mb_s=%u packed=%d",
	        (unsigned long long)o->id, o->to, o->rate_mb_s, (int)x->packed);
	report_progress(o, KV_MIG_COPYING, x->start_ns);
	x->copy_start = kv_now_ns();
	return STREAM_DEDUP;
}

/* Sends the exactly-once memory of the range, before any data. */
static stream_phase
phase_dedup(stream_ctx *x)
{
	kv_mig_out *o = x->o;
	dedup_acc *da = &x->da;
	int rv;

	kv_dedup_visit_range(o->mig->env.dedup, o->start.data, o->start.len, o->end.data,
	                     o->end.len, dedup_cb, da);
	kv_dedup_visit_floors(o->mig->env.dedup, floor_cb, da);
	if (da->oom)
		return stream_fail(x, KV_ENOMEM);
	for (size_t i = 0; i < da->n; i++) {
		da->d[i].key = (kv_bytes){da->bufs[2 * i].data, da->bufs[2 * i].len};
		da->d[i].value = (kv_bytes){da->bufs[2 * i + 1].data, da->bufs[2 * i + 1].len};
	}
	for (size_t off = 0, foff = 0; off < da->n || foff < da->nfl;) {
		/* At most DEDUP_ENTRIES entries and about CHUNK_BYTES per message,
		 * and as many floors. */
		size_t k = 0, bytes = 0;
		size_t kf = da->nfl - foff < DEDUP_ENTRIES ? da->nfl - foff : DEDUP_ENTRIES;
		while (off + k < da->n && k < DEDUP_ENTRIES && (k == 0 || bytes < CHUNK_BYTES)) {
			bytes += da->d[off + k].key.len + da->d[off + k].value.len;
			k++;
		}
		kv_xfer c = {.migration_id = o->id,
		             .seq = ++*x->seq,
		             .kind = KV_XFER_CHUNK,
		             .ndedup = k,
		             .dedup = k ? da->d + off : NULL,
		             .nfloors = kf,
		             .floors = kf ? da->fl + foff : NULL};
		if ((rv = xfer_send(o, x->cli, &c, true, &x->ack)) != 0)
			return stream_fail(x, rv);
		off += k;
		foff += kf;
	}
	return STREAM_COPY;
}

/*
 * Bulk-copy chunks in flight (COPY_PIPE): the next chunk is read and encoded
 * while the destination applies the previous one. Each slot is an async
 * caller on the stream's client; the destination applies messages in seq
 * order (one that overtakes its predecessor waits for it, migrate_in.c).
 * Any failure drains the pipe and sends what is not acknowledged again, in
 * order, one at a time with xfer_send's retries, so the outcome is that of
 * sending the chunks one after the other.
 */
typedef struct {
	kv_rpc_async *a; /* its caller */
	bool busy;       /* sent, not yet settled */
	bool done;       /* the answer (or failure) came: rv says which */
	int rv;          /* 0: acknowledged */
	uint64_t seq;    /* its message's seq */
	nng_msg *copy;   /* the message, for a resend */
	size_t whole;    /* keys the chunk completes */
	size_t bytes;    /* its key and value bytes */
	struct copy_pipe *p;
} pipe_slot;

typedef struct copy_pipe {
	pthread_mutex_t mu; /* protects the slots' done and rv */
	pthread_cond_t cv;  /* a slot is done */
	pipe_slot s[COPY_PIPE];
	size_t n; /* slots created (0: send one at a time) */
} copy_pipe;

static void
pipe_done(void *arg, int rv, nng_msg *reply)
{
	pipe_slot *sl = arg;
	kv_xfer_ack ack;

	if (rv == 0) {
		rv = kv_xfer_ack_decode(nng_msg_body(reply), nng_msg_len(reply), &ack);
		if (rv == 0 && (ack.status != 0 || ack.seq < sl->seq))
			rv = ack.status ? ack.status : KV_EPROTO;
		nng_msg_free(reply);
	}
	pthread_mutex_lock(&sl->p->mu);
	sl->rv = rv;
	sl->done = true;
	pthread_cond_broadcast(&sl->p->cv);
	pthread_mutex_unlock(&sl->p->mu);
}

/* Creates the slots; with none (an error) the copy sends one at a time. */
static void
pipe_init(copy_pipe *p, kv_rpc_client *cli)
{
	memset(p, 0, sizeof(*p));
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	for (size_t i = 0; i < COPY_PIPE; i++) {
		p->s[i].p = p;
		if (kv_rpc_async_create(cli, pipe_done, &p->s[i], &p->s[i].a) != 0)
			break;
		p->n++;
	}
	if (p->n < 2) {
		kv_rpc_async_destroy(p->s[0].a);
		p->s[0].a = NULL;
		p->n = 0;
	}
}

/* Waits until slot sl has its answer. */
static void
pipe_wait(copy_pipe *p, pipe_slot *sl)
{
	pthread_mutex_lock(&p->mu);
	while (!sl->done)
		pthread_cond_wait(&p->cv, &p->mu);
	pthread_mutex_unlock(&p->mu);
}

/* Counts an acknowledged chunk. */
static void
chunk_acked(kv_mig_out *o, size_t whole, size_t bytes)
{
	atomic_fetch_add(&o->keys_copied, whole);
	atomic_fetch_add(&o->bytes_copied, bytes);
	atomic_fetch_add_explicit(&o->mig->bytes_sent, bytes, memory_order_relaxed);
}

/*
 * Waits for every slot in flight, in seq order, and settles it: counted when
 * acknowledged; after the first failure, that message and every later one
 * are sent again one at a time (xfer_send_msg) when `resend`, else only
 * waited for. Returns 0, or the error of a resend or the first failure (the
 * stream then starts over).
 */
static int
pipe_drain(copy_pipe *p, kv_mig_out *o, kv_rpc_client *cli, kv_xfer_ack *ack, bool resend)
{
	bool failed = false;
	int rv = KV_OK;

	for (;;) {
		pipe_slot *sl = NULL;
		for (size_t i = 0; i < p->n; i++)
			if (p->s[i].busy && (sl == NULL || p->s[i].seq < sl->seq))
				sl = &p->s[i];
		if (sl == NULL)
			return rv;
		pipe_wait(p, sl);
		if (!failed && sl->rv == 0) {
			chunk_acked(o, sl->whole, sl->bytes);
		} else if (!resend) {
			if (rv == 0)
				rv = sl->rv ? sl->rv : KV_ECLOSED;
		} else if (rv == 0) {
			if (!failed)
				KV_DEBUG(COMP, "pipelined chunk failed, resending in order",
				         "id=%llu seq=%llu err=%s", (unsigned long long)o->id,
				         (unsigned long long)sl->seq, kv_errname(sl->rv));
			failed = true;
			kv_xfer c = {.migration_id = o->id, .seq = sl->seq, .kind = KV_XFER_CHUNK};
			rv = xfer_send_msg(o, cli, &c, sl->copy, true, ack);
			if (rv == 0)
				chunk_acked(o, sl->whole, sl->bytes);
		}
		nng_msg_free(sl->copy);
		sl->copy = NULL;
		sl->busy = false;
	}
}

/* Sends chunk c (encoded as req, taken) from a free slot, settling the
 * oldest one first when none is free. Returns 0 or pipe_drain's error. */
static int
pipe_send(copy_pipe *p, kv_mig_out *o, kv_rpc_client *cli, const kv_xfer *c, nng_msg *req,
          size_t whole, size_t bytes, kv_xfer_ack *ack)
{
	pipe_slot *sl = NULL;

	for (size_t i = 0; i < p->n && sl == NULL; i++)
		if (!p->s[i].busy)
			sl = &p->s[i];
	if (sl == NULL) {
		pipe_slot *old = &p->s[0];
		for (size_t i = 1; i < p->n; i++)
			if (p->s[i].seq < old->seq)
				old = &p->s[i];
		pipe_wait(p, old);
		if (old->rv != 0) {
			int rv = pipe_drain(p, o, cli, ack, true);
			if (rv != 0) {
				nng_msg_free(req);
				return rv;
			}
		} else {
			chunk_acked(o, old->whole, old->bytes);
			nng_msg_free(old->copy);
			old->copy = NULL;
			old->busy = false;
		}
		for (size_t i = 0; i < p->n && sl == NULL; i++)
			if (!p->s[i].busy)
				sl = &p->s[i];
	}
	if (nng_msg_dup(&sl->copy, req) != 0) {
		nng_msg_free(req);
		return KV_ENOMEM;
	}
	sl->busy = true;
	sl->done = false;
	sl->rv = 0;
	sl->seq = c->seq;
	sl->whole = whole;
	sl->bytes = bytes;
	kv_rpc_async_call_wait_send(sl->a, req, XFER_TIMEOUT_MS);
	return KV_OK;
}

/* Frees the slots: nothing may be in flight (pipe_drain first). */
static void
pipe_fini(copy_pipe *p)
{
	for (size_t i = 0; i < p->n; i++) {
		kv_rpc_async_destroy(p->s[i].a);
		nng_msg_free(p->s[i].copy);
	}
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
}

/*
 * Bulk copy: chunks of at most CHUNK_ENTRIES entries and about CHUNK_BYTES
 * (plus one key); a value larger than a chunk goes in slices over
 * consecutive chunks, with nothing in between.
 */
static int phase_copy_loop(stream_ctx *x, copy_pipe *pipe);

static stream_phase
phase_copy(stream_ctx *x)
{
	kv_mig_out *o = x->o;
	chunk_acc *ca = &x->ca;
	copy_pipe pipe;
	int rv;

	ca->ents = calloc(CHUNK_ENTRIES, sizeof(*ca->ents));
	x->kvs = calloc(CHUNK_ENTRIES, sizeof(*x->kvs));
	if (ca->ents == NULL || x->kvs == NULL)
		return stream_fail(x, KV_ENOMEM);
	pipe_init(&pipe, x->cli);
	rv = phase_copy_loop(x, &pipe);
	/* On an error only waits for what is in flight: the stream starts over. */
	int drv = pipe_drain(&pipe, o, x->cli, &x->ack, rv == 0);
	pipe_fini(&pipe);
	if (rv == 0)
		rv = drv;
	if (rv != 0)
		return stream_fail(x, rv);
	return STREAM_CATCHUP;
}

/* The chunks of the bulk copy, through the pipe. Returns 0 or an error. */
static int
phase_copy_loop(stream_ctx *x, copy_pipe *pipe)
{
	kv_mig_out *o = x->o;
	kv_mig *s = o->mig;
	chunk_acc *ca = &x->ca;
	uint64_t sent = 0; /* key and value bytes of the chunks sent */
	int rv;

	while (!x->cur.done || ca->carrying) {
		size_t whole = 0; /* keys this chunk completes: whole entries, last slices */
		ca->n = 0;
		ca->data.len = 0;
		for (;;) {
			if (ca->carrying && (rv = carry_emit(ca)) <= 0) {
				if (rv < 0)
					return rv;
				break; /* chunk full, the carry goes on in the next */
			}
			if (x->cur.done || ca->n == CHUNK_ENTRIES || ca->data.len >= CHUNK_BYTES)
				break;
			rv = kv_store_range_step_x(s->env.store, o->start.data, o->start.len,
			                           o->end.data, o->end.len, &x->cur,
			                           CHUNK_ENTRIES - ca->n, chunk_cb, ca);
			if (rv != 0 || ca->oom)
				return rv ? rv : KV_ENOMEM;
		}
		for (size_t i = 0; i < ca->n; i++) {
			const chunk_ent *e = &ca->ents[i];
			x->kvs[i].key = (kv_bytes){ca->data.data + e->koff, e->klen};
			x->kvs[i].value = (kv_bytes){ca->data.data + e->voff, e->vlen};
			x->kvs[i].value_offset = e->value_offset;
			x->kvs[i].value_total = e->value_total;
			x->kvs[i].expire_at = e->expire_at;
			if (e->value_total == 0 || e->value_offset + e->vlen == e->value_total)
				whole++;
		}
		kv_xfer c = {.migration_id = o->id,
		             .seq = ++*x->seq,
		             .kind = KV_XFER_CHUNK,
		             .nkv = ca->n,
		             .kv = x->kvs,
		             .last = x->cur.done && !ca->carrying,
		             .packed = x->packed};
		if (pipe->n == 0) {
			if ((rv = xfer_send(o, x->cli, &c, true, &x->ack)) != 0)
				return rv;
			chunk_acked(o, whole, ca->data.len);
		} else {
			nng_msg *req = NULL;
			if ((rv = kv_xfer_encode(&c, o->epoch, kv_mig__node_id(s), s->env.auth,
			                         &req)) != 0 ||
			    (rv = pipe_send(pipe, o, x->cli, &c, req, whole, ca->data.len,
			                    &x->ack)) != 0)
				return rv;
			if (should_quit(o, true))
				return KV_ECLOSED;
		}
		/* Paced on what is sent: chunks in flight count. */
		sent += ca->data.len;
		pace(o, x->copy_start, sent);
		/* Bound the recorded writes while the copy runs (a slow copy
		 * under heavy writes): send them between chunks. Safe because the
		 * next chunk is read after them and holds the newer state, and
		 * never inside a split value, whose slices must be consecutive. */
		if (!ca->carrying && !c.last) {
			pthread_mutex_lock(&o->mu);
			if (!o->lost &&
			    (o->rec_bytes >= DELTA_FLUSH_BYTES || o->nrecs >= DELTA_FLUSH_RECS))
				take_recs_locked(o, &x->recs, &x->nrecs);
			pthread_mutex_unlock(&o->mu);
			/* After the chunks in flight: the destination applies by seq
			 * anyway, and a drain keeps one sender at a time. */
			if (x->nrecs > 0 &&
			    ((rv = pipe_drain(pipe, o, x->cli, &x->ack, true)) != 0 ||
			     (rv = stream_send_recs(x, true)) != 0))
				return rv;
		}
		uint64_t now = kv_now_ns();
		if (now - x->last_progress > PROGRESS_MS * 1000000ull) {
			report_progress(o, KV_MIG_COPYING, x->start_ns);
			x->last_progress = now;
		}
	}
	return KV_OK;
}

/*
 * Catches up until few writes are left: at most CATCHUP_ROUNDS rounds, and
 * no longer once CATCHUP_STALLS rounds in a row found at least as many
 * writes (records and bytes) as the round before. Then the writes to the
 * range come at least as fast as a round sends them, and more rounds only
 * delay the fence that ends the chase (the fence then sends a backlog of
 * about one round).
 */
static stream_phase
phase_catchup(stream_ctx *x)
{
	kv_mig_out *o = x->o;
	size_t prev_recs = SIZE_MAX, prev_bytes = SIZE_MAX;
	int rv, stalls = 0;

	report_progress(o, KV_MIG_CATCHUP, x->start_ns);
	for (int round = 0; round < CATCHUP_ROUNDS; round++) {
		pthread_mutex_lock(&o->mu);
		if (o->lost) {
			pthread_mutex_unlock(&o->mu);
			return stream_fail(x, KV_ENOMEM);
		}
		if (o->nrecs < FENCE_RECS && o->rec_bytes < FENCE_BYTES) {
			pthread_mutex_unlock(&o->mu);
			break;
		}
		stalls = o->nrecs >= prev_recs && o->rec_bytes >= prev_bytes ? stalls + 1 : 0;
		if (stalls == CATCHUP_STALLS) {
			KV_INFO(COMP, "catch-up not converging: fencing",
			        "id=%llu round=%d deltas=%zu bytes=%zu", (unsigned long long)o->id,
			        round, o->nrecs, o->rec_bytes);
			pthread_mutex_unlock(&o->mu);
			break;
		}
		prev_recs = o->nrecs;
		prev_bytes = o->rec_bytes;
		take_recs_locked(o, &x->recs, &x->nrecs);
		pthread_mutex_unlock(&o->mu);
		if ((rv = stream_send_recs(x, true)) != 0)
			return stream_fail(x, rv);
	}
	if (should_quit(o, true))
		return stream_fail(x, KV_ECLOSED);
	return STREAM_FENCE;
}

/* Fence: from here writes to the range answer MOVING. Sends the last
 * writes and TransferFence, then has the controller acknowledge the fence. */
static stream_phase
phase_fence(stream_ctx *x)
{
	kv_mig_out *o = x->o;
	int rv;

	pthread_mutex_lock(&o->mu);
	if (o->lost) {
		pthread_mutex_unlock(&o->mu);
		return stream_fail(x, KV_ENOMEM);
	}
	atomic_store(&o->fenced, true);
	take_recs_locked(o, &x->recs, &x->nrecs);
	uint64_t last_write = o->write_seq;
	pthread_mutex_unlock(&o->mu);
	uint64_t fence_ns = kv_now_ns();
	size_t nlast = x->nrecs;
	rv = stream_send_recs(x, false);
	if (rv == 0) {
		kv_xfer f = {.migration_id = o->id,
		             .seq = ++*x->seq,
		             .kind = KV_XFER_FENCE,
		             .last_write_seq = last_write};
		rv = xfer_send(o, x->cli, &f, false, &x->ack);
	}
	if (rv != 0) {
		/* The destination does not serve before Commit: lifting the fence
		 * is safe, unless a Commit may have left already. */
		if (!atomic_load(&o->must_commit)) {
			pthread_mutex_lock(&o->mu);
			atomic_store(&o->fenced, false);
			pthread_mutex_unlock(&o->mu);
		}
		return stream_fail(x, rv);
	}
	if ((rv = confirm_fence(o, x->start_ns)) != 0) {
		if (atomic_load(&o->must_commit))
			return stream_fail(x, rv); /* handed over, or stopping */
		/* Cancelled before the controller learnt of the fence: the cancel
		 * wins, the range stays here (the destination never served it). */
		pthread_mutex_lock(&o->mu);
		atomic_store(&o->fenced, false);
		atomic_store(&o->cancel, true);
		pthread_mutex_unlock(&o->mu);
		return stream_fail(x, rv);
	}
	/* On disk before the Commit leaves: a restart from here on must not
	 * serve the range before it knows how the handover ended. */
	if (!atomic_load(&o->must_commit)) {
		if ((rv = kv_mig__hand_add(o->mig, o->id, o->epoch, true)) != 0) {
			KV_ERROR(COMP, "cannot record the handover; the fence is lifted",
			         "id=%llu err=%s", (unsigned long long)o->id, kv_errname(rv));
			pthread_mutex_lock(&o->mu);
			atomic_store(&o->fenced, false);
			pthread_mutex_unlock(&o->mu);
			return stream_fail(x, rv);
		}
		atomic_store(&o->must_commit, true);
	}
	KV_INFO(COMP, "fenced", "id=%llu deltas=%zu fence_us=%llu", (unsigned long long)o->id,
	        nlast, (unsigned long long)((kv_now_ns() - fence_ns) / 1000));
	return STREAM_FENCED;
}

/* The phases that run, in order (STREAM_FENCED and STREAM_FAILED end). */
static stream_phase (*const stream_phases[])(stream_ctx *) = {
    [STREAM_BEGIN] = phase_begin,     [STREAM_DEDUP] = phase_dedup, [STREAM_COPY] = phase_copy,
    [STREAM_CATCHUP] = phase_catchup, [STREAM_FENCE] = phase_fence,
};

/* Streams Begin, chunks, deltas and the fence. Returns 0 when the
 * destination holds everything (o->fenced is then set; *committed when it
 * had committed already), else an error. */
static int
stream(kv_mig_out *o, kv_rpc_client *cli, uint64_t *seq, uint64_t start_ns, bool *committed)
{
	stream_ctx x = {.o = o, .cli = cli, .seq = seq, .start_ns = start_ns};
	stream_phase ph = STREAM_BEGIN;

	kv_store_cursor_init(&x.cur);
	while (ph != STREAM_FENCED && ph != STREAM_FAILED)
		ph = stream_phases[ph](&x);
	free_recs(x.recs, x.nrecs);
	kv_buf_fini(&x.ca.data);
	kv_buf_fini(&x.ca.carry_key);
	kv_buf_fini(&x.ca.carry_val);
	free(x.ca.ents);
	free(x.kvs);
	for (size_t i = 0; i < 2 * x.da.cap; i++)
		kv_buf_fini(&x.da.bufs[i]);
	free(x.da.bufs);
	free(x.da.d);
	free(x.da.fl);
	kv_store_cursor_fini(&x.cur);
	*committed = x.committed;
	return ph == STREAM_FENCED ? KV_OK : x.rv;
}

/* Deletes the moved range in bounded steps while it stays MOVED, pausing
 * between them with no lock held: the range is served elsewhere now, so
 * its memory can come back at a fraction of a core while the requests of
 * the ranges this node still serves go first. */
static void
delete_moved(kv_mig_out *o)
{
	kv_mig *s = o->mig;
	uint64_t deleted = 0;
	int rv = KV_EBUSY;

	while (!atomic_load(&s->stopping)) {
		rv = KV_EBUSY;
		kv_owner_rdlock(s->env.owner);
		bool moved = kv_owner_covers_locked(s->env.owner, o->start.data, o->start.len,
		                                    o->end.data, o->end.len, KV_OWN_MOVED);
		if (moved) {
			kv_dur_begin(s->env.dur);
			rv = kv_store_range_delete(s->env.store, o->start.data, o->start.len,
			                           o->end.data, o->end.len, KV_MIG_DELETE_STEP,
			                           &deleted);
			/* Logged once the range is empty; a crash before that leaves
			 * keys of a range this node does not serve, dropped when the
			 * range next arrives (Begin clears it). */
			if (rv == 0)
				rv = kv_dur_log_range_del(s->env.dur, o->start.data, o->start.len,
				                          o->end.data, o->end.len, NULL);
			kv_dur_end(s->env.dur);
		}
		kv_owner_unlock(s->env.owner);
		if (!moved || rv != KV_EBUSY)
			break;
		struct timespec ts = {0, KV_MIG_DELETE_PAUSE * 1000L};
		while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
			;
	}
	kv_mig__held_changed(s);
	if (rv == KV_EBUSY) {
		/* Stopping, or the range is no longer MOVED here: what is left
		 * goes when the range next arrives (Begin clears it). */
		KV_INFO(COMP, "moved range delete ended", "id=%llu keys=%llu why=%s",
		        (unsigned long long)o->id, (unsigned long long)deleted,
		        atomic_load(&s->stopping) ? "stopping" : "no_longer_moved");
		return;
	}
	if (rv != KV_OK) {
		/* What is left stays until the range next arrives (Begin clears it). */
		KV_WARN(COMP, "moved range not deleted", "id=%llu keys=%llu err=%s",
		        (unsigned long long)o->id, (unsigned long long)deleted, kv_errname(rv));
		return;
	}
	KV_INFO(COMP, "moved range deleted", "id=%llu keys=%llu", (unsigned long long)o->id,
	        (unsigned long long)deleted);
}

static void
report_done(kv_mig_out *o, uint64_t seq)
{
	unsigned backoff = 50;

	while (!atomic_load(&o->mig->stopping)) {
		kv_admin_resp r;
		kv_admin_req rq = {.op = KV_ADM_DONE,
		                   .node_id = kv_mig__node_id(o->mig),
		                   .mig_id = o->id,
		                   .result = KV_OK,
		                   .keys = atomic_load(&o->keys_copied),
		                   .bytes = atomic_load(&o->bytes_copied),
		                   .last_seq = seq};
		int rv = kv_mig__ctl_call(o->mig, &rq, &r, 2000);
		if (rv == 0) {
			int st = r.err;
			kv_admin_resp_fini(&r);
			if (st != 0)
				KV_WARN(COMP, "controller refused migration done", "id=%llu err=%s",
				        (unsigned long long)o->id, kv_errname(st));
			atomic_store(&o->reported, true);
			return;
		}
		kv_mig__nap(o->mig, backoff);
		backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
	}
}

static void *
mig_out_main(void *arg)
{
	kv_mig_out *o = arg;
	kv_mig *s = o->mig;
	kv_rpc_client *cli = NULL;
	uint64_t seq = 0, start_ns = kv_now_ns();
	unsigned backoff = 50;
	bool served;
	int rv;

	kv_log_thread_name("kv-mig-out");
	(void)kv_thread_slice(KV_BULK_SLICE_US);
	kv_owner_rdlock(s->env.owner);
	served = kv_owner_covers_locked(s->env.owner, o->start.data, o->start.len, o->end.data,
	                                o->end.len, KV_OWN_SERVE);
	kv_owner_unlock(s->env.owner);
	if (!served) {
		KV_WARN(COMP, "migration of a range not served here ignored", "id=%llu",
		        (unsigned long long)o->id);
		goto out;
	}
	if ((rv = kv_owner_set(s->env.owner, o->start.data, o->start.len, o->end.data, o->end.len,
	                       KV_OWN_SERVE, 0, NULL, o->epoch, o->id, o)) != 0 ||
	    (rv = kv_rpc_client_create_tls(o->to_addr, s->env.tls, &cli)) != 0) {
		KV_ERROR(COMP, "cannot start migration", "id=%llu err=%s",
		         (unsigned long long)o->id, kv_errname(rv));
		goto detach;
	}
	KV_INFO(COMP, "migration started", "id=%llu to=%u addr=%s", (unsigned long long)o->id,
	        o->to, o->to_addr);
	for (;;) {
		bool committed = false;
		rv = stream(o, cli, &seq, start_ns, &committed);
		if (rv == 0 && !committed) {
			/* Commit: the destination serves from now on. */
			kv_xfer_ack ack;
			kv_xfer c = {.migration_id = o->id,
			             .seq = ++seq,
			             .kind = KV_XFER_COMMIT,
			             .epoch = o->epoch};
			rv = xfer_send(o, cli, &c, false, &ack);
			if (rv != 0 && rv != KV_ECLOSED)
				/* The destination lost the stream (it restarted before
				 * the commit): copy again, still fenced. */
				KV_WARN(COMP, "commit refused; the range is sent again",
				        "id=%llu err=%s", (unsigned long long)o->id,
				        kv_errname(rv));
		}
		if (rv == 0)
			break;
		if (atomic_load(&s->stopping))
			goto out; /* stopping while fenced: the range stays unavailable here */
		if (should_quit(o, !atomic_load(&o->fenced) || atomic_load(&o->handed_over) ||
		                       atomic_load(&o->reclaimed)))
			goto abort;
		kv_mig__nap(s, backoff);
		backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
	}
	kv_owner_set(s->env.owner, o->start.data, o->start.len, o->end.data, o->end.len,
	             KV_OWN_MOVED, o->to, o->to_addr, o->epoch, o->id, NULL);
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
		kv_owner_set(s->env.owner, o->start.data, o->start.len, o->end.data, o->end.len,
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
		if (kv_xfer_encode(&a, o->epoch, kv_mig__node_id(s), s->env.auth, &req) == 0 &&
		    kv_rpc_call(cli, req, &rep, 1000) == 0)
			nng_msg_free(rep);
		if (atomic_load(&o->reclaimed))
			KV_WARN(COMP,
			        "migration failed by the controller while fenced; the range is "
			        "served here again",
			        "id=%llu to=%u commit_sent=%d", (unsigned long long)o->id, o->to,
			        (int)atomic_load(&o->must_commit));
		else
			KV_INFO(COMP, "migration cancelled", "id=%llu", (unsigned long long)o->id);
	}
detach:
	/* Still ours: serve it without the migration. */
	if (!atomic_load(&s->stopping))
		kv_owner_set(s->env.owner, o->start.data, o->start.len, o->end.data, o->end.len,
		             KV_OWN_SERVE, 0, NULL, o->epoch, 0, NULL);
out:
	kv_rpc_client_destroy(cli);
	atomic_store(&o->finished, true);
	return NULL;
}

/* Whether a task of migration id was started. */
static bool
out_known(kv_mig *s, uint64_t id)
{
	bool known = false;

	pthread_mutex_lock(&s->mu);
	for (kv_mig_out *o = s->outs; o; o = o->next)
		known |= o->id == id;
	pthread_mutex_unlock(&s->mu);
	return known;
}

/* Starts the task of migration m (fenced: taken back fenced, its range
 * claimed with the task attached). */
static int
out_start(kv_mig *s, const kv_migration *m, const char *to_addr, bool fenced, uint64_t epoch)
{
	kv_mig_out *o;

	if ((o = calloc(1, sizeof(*o))) == NULL)
		return KV_ENOMEM;
	o->mig = s;
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
	if (fenced) {
		atomic_store(&o->fenced, true);
		atomic_store(&o->must_commit, true);
		/* Nothing of the range is served from here on (own_check_locked
		 * answers MOVING), until the task learns how the handover ended. */
		int rv = kv_owner_set(s->env.owner, o->start.data, o->start.len, o->end.data,
		                      o->end.len, KV_OWN_SERVE, 0, NULL, epoch, o->id, o);
		if (rv != 0) {
			pthread_mutex_destroy(&o->mu);
			kv_buf_fini(&o->start);
			kv_buf_fini(&o->end);
			free(o);
			return rv;
		}
		KV_INFO(COMP, "migration taken back fenced: its commit may have been sent",
		        "id=%llu to=%u", (unsigned long long)o->id, o->to);
	}
	pthread_mutex_lock(&s->mu);
	o->next = s->outs;
	s->outs = o;
	if (pthread_create(&o->thr, NULL, mig_out_main, o) != 0) {
		atomic_store(&o->finished, true);
		pthread_mutex_unlock(&s->mu);
		return KV_ENOMEM;
	}
	o->thr_started = true;
	pthread_mutex_unlock(&s->mu);
	return KV_OK;
}

int
kv_mig_out_start(kv_mig *s, const kv_migration *m, const char *to_addr)
{
	if (out_known(s, m->id))
		return KV_OK;
	return out_start(s, m, to_addr, false, 0);
}

int
kv_mig_out_claim(kv_mig *s, const kv_migration *m, const char *to_addr, uint64_t epoch)
{
	if (kv_range_is_empty(m->start.data, m->start.len, m->end.data, m->end.len))
		return KV_EINVAL;
	if (out_known(s, m->id) || !kv_mig__hand_has(s, m->id, true))
		return kv_owner_claim(s->env.owner, m->start.data, m->start.len, m->end.data,
		                      m->end.len, epoch);
	return out_start(s, m, to_addr, true, epoch);
}

void
kv_mig_out_reconcile(kv_mig *g, const kv_config *c)
{
	kv_mig__hand_prune(g, c);
	pthread_mutex_lock(&g->mu);
	for (kv_mig_out *o = g->outs; o; o = o->next) {
		if (kv_mig__listed(c, o->id))
			continue;
		/* Dropped with the range given to the destination: an earlier
		 * run of this node finished it (this one restarted meanwhile). */
		long ri = kv_config_find_range(c, o->start.data, o->start.len);
		if (ri >= 0 && c->ranges[ri].node == o->to)
			atomic_store(&o->handed_over, true);
		else if (atomic_load(&o->fenced) && ri >= 0 &&
		         c->ranges[ri].node == kv_mig__node_id(g))
			/* Failed by the controller with the range given back: it
			 * refuses that after a confirmed fence unless the operator
			 * removed the destination and accepted the loss. */
			atomic_store(&o->reclaimed, true);
		if (!atomic_load(&o->fenced) || atomic_load(&o->handed_over) ||
		    atomic_load(&o->reclaimed))
			atomic_store(&o->cancel, true);
	}
	pthread_mutex_unlock(&g->mu);
}

bool
kv_mig_out_pending(kv_mig *g)
{
	bool pending = false;

	pthread_mutex_lock(&g->mu);
	for (kv_mig_out *o = g->outs; o; o = o->next)
		pending |= !atomic_load(&o->reported) && !atomic_load(&o->finished);
	pthread_mutex_unlock(&g->mu);
	return pending;
}

void
kv_mig_stats(kv_mig *g, uint64_t *active_out, uint64_t *bytes_sent)
{
	uint64_t active = 0;

	pthread_mutex_lock(&g->mu);
	for (kv_mig_out *o = g->outs; o; o = o->next)
		active += !atomic_load(&o->finished);
	pthread_mutex_unlock(&g->mu);
	*active_out = active;
	*bytes_sent = atomic_load_explicit(&g->bytes_sent, memory_order_relaxed);
}

uint64_t
kv_mig_out_id(const kv_mig_out *m)
{
	return m->id;
}

void
kv_mig_out_lock(kv_mig_out *m)
{
	pthread_mutex_lock(&m->mu);
}

void
kv_mig_out_unlock(kv_mig_out *m)
{
	pthread_mutex_unlock(&m->mu);
}

bool
kv_mig_out_fenced(kv_mig_out *m)
{
	return atomic_load(&m->fenced);
}

void
kv_mig_out_target(const kv_mig_out *m, kv_bytes *start, kv_bytes *end, uint32_t *to,
                  const char **to_addr)
{
	*start = (kv_bytes){m->start.data, m->start.len};
	*end = (kv_bytes){m->end.data, m->end.len};
	*to = m->to;
	*to_addr = m->to_addr;
}

/* ------------------------------------------------------------------------
 * The migration set
 * ------------------------------------------------------------------------ */

int
kv_mig_create(const kv_mig_env *env, kv_mig **out)
{
	kv_mig *g = calloc(1, sizeof(*g));
	int rv;

	if (g == NULL)
		return KV_ENOMEM;
	g->env = *env;
	if ((rv = kv_mig__hand_init(g)) != 0) {
		free(g);
		return rv;
	}
	if (kv_mig__applier_init(g) != KV_OK) {
		kv_mig__hand_fini(g);
		free(g);
		return KV_ENOMEM;
	}
	pthread_mutex_init(&g->mu, NULL);
	*out = g;
	return KV_OK;
}

void
kv_mig_stop(kv_mig *g)
{
	atomic_store(&g->stopping, true);
}

void
kv_mig_destroy(kv_mig *g)
{
	kv_mig_out *o, *on;
	struct kv_mig_in *in;

	if (g == NULL)
		return;
	kv_mig_stop(g);
	pthread_mutex_lock(&g->mu);
	o = g->outs;
	in = g->ins;
	g->outs = NULL;
	g->ins = NULL;
	pthread_mutex_unlock(&g->mu);
	for (; o; o = on) {
		on = o->next;
		if (o->thr_started)
			pthread_join(o->thr, NULL);
		free_recs(o->recs, o->nrecs);
		free(o->rix);
		kv_buf_fini(&o->start);
		kv_buf_fini(&o->end);
		pthread_mutex_destroy(&o->mu);
		free(o);
	}
	kv_mig__applier_fini(g);
	kv_mig__ins_free(in);
	pthread_mutex_destroy(&g->mu);
	kv_mig__hand_fini(g);
	free(g);
}
