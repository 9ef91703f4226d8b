/*
 * repl.c - the replication stream (repl.h; doc/replication.md "Writes").
 *
 * DESIGN.
 *
 * Routing table. kv_rs_apply_config builds an immutable array of routes,
 * one per range of the configuration (start, end, primary, leader epoch,
 * ISR, and - for ranges this node leads - the streams of its in-sync
 * backups), and swaps it in under tab_lock (write). Writes hold tab_lock
 * for reading from kv_rs_write_begin to kv_rs_write_end, so the route a
 * log tap points to stays valid through the append; backups hold it while
 * they check records.
 *
 * Streams (primary side). One per backup node, never freed before
 * kv_rs_destroy (a stream no route uses just idles). The log tap
 * (tap_fn, under the log's mutex) copies each record into the queue of
 * every in-sync backup of its range, so a queue is in lsn order. The
 * stream thread sends batches from `unsent` with up to WINDOW requests in
 * flight (kv_rpc_async callers); answers arrive on nng threads
 * (call_done), which advance the watermark `acked_lsn` and `unacked`, the
 * first record not acknowledged, whose lsn is published in the atomic
 * `pending` for the lock-free kv_rs_covered. Any failure (timeout, gap,
 * refusal) makes the stream start again: once nothing is in flight, a new
 * stream id (boot_id << 32 | generation), seq 1, from `unacked`. A stream id
 * never carries two different batches under one seq, so a backup can
 * answer a repeated seq from memory.
 *
 * Backup side. One `insrc` per primary node: the stream id it follows, the
 * next seq, the last primary lsn applied and the local lsn that logged it.
 * Batches apply under in_mu, in seq order (a later one waits up to
 * GAP_WAIT_MS for its predecessor, then is refused), record by record, and
 * the answer waits until the local log holds the last applied record.
 *
 * Waiting replies. kv_rs_notify parks (lsn, done) in the waiter list; a
 * sweep after every acknowledgement, and every POLL_MS from each stream
 * thread, completes those covered or past their deadline.
 *
 * Lock order (doc/threads.md): tab_lock (read) -> [dur barrier, stripes,
 * store, log mutex] -> stream.mu; in_mu -> tab_lock (read) -> [dur];
 * wmu is a leaf, and callbacks run with no lock of ours held.
 */
#include "shardserver/repl/repl.h"
#include "common/err.h"
#include "common/log.h"
#include "common/rpc.h"
#include "proto/repl_codec.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define COMP "repl"

#define WINDOW       4                    /* Replicate requests in flight per stream */
#define BATCH_RECS   1024u                /* records per Replicate */
#define BATCH_BYTES  (4u * 1024u * 1024u) /* payload bytes per Replicate (at least one record) */
#define CALL_MS      2000u                /* a Replicate's answer deadline */
#define POLL_MS      50                   /* stream threads wake at least this often */
#define RETRY_MS     100u                 /* pause before a stream starts again */
#define GAP_WAIT_MS  50                   /* a backup waits this long for a missing batch */
#define MAX_STREAMS  64u                  /* backups one node streams to */
#define MAX_SOURCES  64u                  /* primaries one node follows */
#define DEFAULT_WAIT 3000u                /* default env.wait_ms */
#define SHRINK_MS    1000u /* a backup silent this long with records outstanding: shrink */
#define ASK_AGAIN_MS 500u  /* pause between two shrink requests for one backup */

/* One queued record. */
typedef struct entry {
	struct entry *next;    /* the next in lsn order */
	uint64_t lsn;          /* the primary's lsn */
	uint64_t leader_epoch; /* its range's leader epoch */
	size_t slen;           /* bytes of the range start at data */
	size_t plen;           /* payload bytes after it */
	uint8_t data[];        /* start, then payload */
} entry;

typedef struct stream stream;

/* A request in flight on a stream. */
typedef struct {
	stream *s;    /* its stream */
	int slot;     /* index in calls */
	uint64_t gen; /* the generation it was sent in */
} call_arg;

struct stream {
	kv_rs *g;                     /* owner */
	uint32_t node;                /* the backup */
	char addr[256];               /* its address (immutable after creation) */
	pthread_t thr;                /* the stream thread */
	bool started;                 /* thr runs */
	kv_rpc_client *cli;           /* thread only: the connection, NULL until made */
	kv_rpc_async *calls[WINDOW];  /* thread only (and destroy): async callers */
	call_arg cargs[WINDOW];       /* argument of each caller */
	atomic_uint_fast64_t pending; /* lsn of the first unacknowledged record; UINT64_MAX: none */
	atomic_uint_fast64_t hole;    /* lsn of a record the queue could not take (no memory); 0 */
	pthread_mutex_t mu;           /* protects everything below */
	pthread_cond_t cv;            /* signalled on a new record or an answer */
	entry *head, *tail;           /* the queue, lsn order; entries before unacked are freed
	                                 by the thread */
	entry *unacked;               /* first record not acknowledged */
	entry *unsent;                /* first record not sent in this generation */
	uint64_t acked_lsn;           /* the backup's watermark */
	uint64_t gen;                 /* generation: names the stream id */
	uint64_t next_seq;            /* seq of the next batch of this generation */
	bool busy[WINDOW];            /* caller in use */
	int inflight;                 /* callers in use */
	bool need_reset;              /* start again once nothing is in flight */
	uint64_t retry_ns;            /* not before this (monotonic) */
	bool warned;                  /* a refusal was logged in this generation */
	uint64_t progress_ns;         /* last acknowledgement progress, or when records became
	                                 outstanding (monotonic) */
	uint64_t ask_ns;              /* no shrink request before this (monotonic) */
	uint64_t refused_epoch;       /* configuration epoch of the last refused request */
};

/* One range of the configuration. */
typedef struct {
	kv_buf start, end;                /* the range */
	uint32_t primary;                 /* its primary */
	uint64_t leader_epoch;            /* its leader epoch */
	uint32_t ninsync;                 /* ISR size (1 for a single range) */
	uint32_t insync[KV_MAX_REPLICAS]; /* the ISR */
	uint32_t min_insync;              /* writes need at least this many */
	uint32_t nbackups;                /* this node leads it: ISR members but this one */
	stream *backups[KV_MAX_REPLICAS]; /* ... their streams */
} route;

/* A primary this node backs up. */
typedef struct {
	uint32_t from;       /* its node id; 0: free slot */
	uint64_t stream_id;  /* the stream followed */
	uint64_t next_seq;   /* the batch expected next */
	uint64_t last_lsn;   /* the primary's lsn of the last record applied */
	uint64_t last_local; /* the local lsn that logged it */
} insrc;

/* A reply waiting for the commit point. */
typedef struct waiter {
	struct waiter *next;
	uint64_t lsn;         /* covered when every stream has it */
	uint64_t deadline_ns; /* monotonic */
	kv_wal_done_fn done;
	void *arg;
} waiter;

struct kv_rs {
	kv_rs_env env;        /* immutable */
	atomic_bool stopping; /* kv_rs_stop ran */

	pthread_rwlock_t tab_lock; /* protects routes, nroutes (write: apply_config) */
	route *routes;             /* sorted by start */
	size_t nroutes;

	pthread_mutex_t smu;          /* protects stream creation (streams, nstreams writes) */
	stream *streams[MAX_STREAMS]; /* published before nstreams grows */
	atomic_size_t nstreams;       /* streams usable (lock-free reads) */
	atomic_bool short_isr;        /* a range this node leads has too small an ISR */
	/* Demotion fence (kv_rs_fenced): the monotonic time of the last
	 * demotion; 0: none. Written by the configuration thread only. */
	atomic_uint_fast64_t fence_ns;

	pthread_mutex_t in_mu; /* protects src and the backup-side counters */
	pthread_cond_t in_cv;  /* a batch was applied */
	insrc src[MAX_SOURCES];

	pthread_mutex_t wmu; /* protects waiters */
	waiter *waiters;

	atomic_uint_fast64_t st_batches, st_resends, st_applied, st_refused, st_asks, st_demotions;
};

/* ------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------ */

static void
deadline_in(struct timespec *ts, unsigned ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

uint32_t
kv_rs_min_insync(const kv_config *c)
{
	/* The controller's --min-insync, published with every configuration
	 * (0 in configurations from before it existed: the primary alone). */
	return c->min_insync ? c->min_insync : 1;
}

/* The route containing key, or NULL. Caller holds tab_lock. */
static const route *
find_route(const kv_rs *g, const void *key, size_t klen)
{
	size_t lo = 0, hi = g->nroutes;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const route *r = &g->routes[mid];
		if (kv_key_cmp(r->start.data, r->start.len, key, klen) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return NULL;
	const route *r = &g->routes[lo - 1];
	if (r->end.len && kv_key_cmp(key, klen, r->end.data, r->end.len) >= 0)
		return NULL;
	return r;
}

static void
routes_free(route *r, size_t n)
{
	for (size_t i = 0; r && i < n; i++) {
		kv_buf_fini(&r[i].start);
		kv_buf_fini(&r[i].end);
	}
	free(r);
}

/* ------------------------------------------------------------------------
 * Waiters
 * ------------------------------------------------------------------------ */

bool
kv_rs_covered(kv_rs *g, uint64_t lsn)
{
	size_t n = atomic_load_explicit(&g->nstreams, memory_order_acquire);

	for (size_t i = 0; i < n; i++) {
		stream *s = g->streams[i];
		uint64_t h = atomic_load(&s->hole);
		if (atomic_load(&s->pending) <= lsn || (h != 0 && h <= lsn))
			return false;
	}
	return true;
}

/* Completes the waiters that are covered, past their deadline, or all of
 * them with `force` (non-zero). Called with no lock held. */
static void
sweep(kv_rs *g, int force)
{
	waiter *done = NULL, **pp;
	uint64_t now = kv_now_ns();

	pthread_mutex_lock(&g->wmu);
	pp = &g->waiters;
	while (*pp) {
		waiter *w = *pp;
		if (force || kv_rs_covered(g, w->lsn) || now >= w->deadline_ns) {
			*pp = w->next;
			w->next = done;
			done = w;
		} else {
			pp = &w->next;
		}
	}
	pthread_mutex_unlock(&g->wmu);
	while (done) {
		waiter *w = done;
		done = w->next;
		int st = force ? force : kv_rs_covered(g, w->lsn) ? KV_OK : KV_ETIMEDOUT;
		w->done(w->arg, st);
		free(w);
	}
}

int
kv_rs_notify(kv_rs *g, uint64_t lsn, kv_wal_done_fn done, void *arg)
{
	waiter *w;
	unsigned ms = g->env.wait_ms ? g->env.wait_ms : DEFAULT_WAIT;

	if (atomic_load(&g->stopping))
		return KV_ECLOSED;
	if (kv_rs_covered(g, lsn)) {
		done(arg, KV_OK);
		return KV_OK;
	}
	if ((w = calloc(1, sizeof(*w))) == NULL)
		return KV_ENOMEM;
	*w = (waiter){.lsn = lsn,
	              .deadline_ns = kv_now_ns() + (uint64_t)ms * 1000000u,
	              .done = done,
	              .arg = arg};
	pthread_mutex_lock(&g->wmu);
	w->next = g->waiters;
	g->waiters = w;
	pthread_mutex_unlock(&g->wmu);
	/* An acknowledgement may have come between the check and the push;
	 * a stop too. */
	sweep(g, atomic_load(&g->stopping) ? KV_ECLOSED : 0);
	return KV_OK;
}

/* ------------------------------------------------------------------------
 * Primary side: the tap and the streams
 * ------------------------------------------------------------------------ */

/* The log tap: queues the record for every in-sync backup of its range.
 * Runs under the log's mutex, in lsn order. */
static void
tap_fn(void *arg, uint64_t lsn, const uint8_t *p, size_t n)
{
	const route *r = arg;

	for (uint32_t i = 0; i < r->nbackups; i++) {
		stream *s = r->backups[i];
		entry *e = malloc(sizeof(*e) + r->start.len + n);
		if (e == NULL) {
			/* The stream can never cover this lsn: replies that need it
			 * time out rather than claim a copy that does not exist. */
			uint_fast64_t zero = 0;
			atomic_compare_exchange_strong(&s->hole, &zero, lsn);
			continue;
		}
		e->next = NULL;
		e->lsn = lsn;
		e->leader_epoch = r->leader_epoch;
		e->slen = r->start.len;
		e->plen = n;
		if (r->start.len)
			memcpy(e->data, r->start.data, r->start.len);
		memcpy(e->data + r->start.len, p, n);
		pthread_mutex_lock(&s->mu);
		if (s->tail)
			s->tail->next = e;
		else
			s->head = e;
		s->tail = e;
		if (s->unacked == NULL) {
			s->unacked = e;
			s->progress_ns = kv_now_ns();
			atomic_store(&s->pending, lsn);
		}
		if (s->unsent == NULL)
			s->unsent = e;
		pthread_cond_signal(&s->cv);
		pthread_mutex_unlock(&s->mu);
	}
}

/* Moves the watermark to lsn. Caller holds s->mu. Returns whether it moved. */
static bool
advance_locked(stream *s, uint64_t lsn)
{
	if (lsn <= s->acked_lsn)
		return false;
	s->acked_lsn = lsn;
	s->progress_ns = kv_now_ns();
	while (s->unacked && s->unacked->lsn <= lsn) {
		if (s->unsent == s->unacked)
			s->unsent = s->unacked->next;
		s->unacked = s->unacked->next;
	}
	atomic_store(&s->pending, s->unacked ? s->unacked->lsn : UINT64_MAX);
	return true;
}

/* The answer to one Replicate (nng thread). */
static void
call_done(void *arg, int rv, nng_msg *reply)
{
	call_arg *ca = arg;
	stream *s = ca->s;
	kv_repl_ack a = {0};
	bool moved = false;

	if (rv == 0) {
		rv = kv_repl_ack_decode(nng_msg_body(reply), nng_msg_len(reply), &a);
		nng_msg_free(reply);
	}
	pthread_mutex_lock(&s->mu);
	s->busy[ca->slot] = false;
	s->inflight--;
	if (rv == 0 && a.status == KV_OK) {
		moved = advance_locked(s, a.acked_lsn);
		s->warned = false;
	} else if (ca->gen == s->gen && !s->need_reset) {
		int why = rv ? rv : a.status;
		s->need_reset = true;
		s->retry_ns = kv_now_ns() + RETRY_MS * 1000000ull;
		if (!s->warned && why != KV_EBUSY)
			KV_WARN(COMP, "backup refused or did not answer, starting the stream again",
			        "node=%u err=%s", s->node, kv_errname(why));
		s->warned = true;
	}
	pthread_cond_signal(&s->cv);
	pthread_mutex_unlock(&s->mu);
	if (moved)
		sweep(s->g, 0);
}

/* Connects (thread only). Returns 0 or an error. */
static int
stream_connect(stream *s)
{
	int rv;

	if (s->cli != NULL)
		return KV_OK;
	if ((rv = kv_rpc_client_create_tls(s->addr, s->g->env.tls, &s->cli)) != 0)
		return rv;
	for (int i = 0; i < WINDOW; i++) {
		s->cargs[i] = (call_arg){.s = s, .slot = i};
		if ((rv = kv_rpc_async_create(s->cli, call_done, &s->cargs[i], &s->calls[i])) != 0)
			return rv;
	}
	return KV_OK;
}

/* Sends the batch from s->unsent. Caller holds s->mu; it is released while
 * encoding and sending (only this thread frees entries). */
static void
send_batch_locked(stream *s)
{
	kv_rs *g = s->g;
	kv_repl_rec *rp;
	size_t n = 0, bytes = 0, cap = BATCH_RECS;
	entry *e = s->unsent;
	int slot = 0;
	nng_msg *msg = NULL;
	kv_repl_msg r;

	while (s->busy[slot])
		slot++;
	rp = malloc(cap * sizeof(*rp));
	if (rp == NULL)
		return;
	while (e && n < cap && (n == 0 || bytes + e->plen <= BATCH_BYTES)) {
		rp[n++] = (kv_repl_rec){.leader_epoch = e->leader_epoch,
		                        .lsn = e->lsn,
		                        .start = {e->data, e->slen},
		                        .payload = {e->data + e->slen, e->plen}};
		bytes += e->plen;
		e = e->next;
	}
	s->unsent = e;
	s->busy[slot] = true;
	s->inflight++;
	s->cargs[slot].gen = s->gen;
	r = (kv_repl_msg){.from_node = g->env.node_id(g->env.arg),
	                  .stream_id = (g->env.boot_id << 32) | (s->gen & 0xffffffffu),
	                  .seq = s->next_seq++,
	                  .nrecs = n,
	                  .recs = rp};
	pthread_mutex_unlock(&s->mu);
	int rv = kv_repl_encode(&r, g->env.epoch(g->env.arg), r.from_node, g->env.auth, &msg);
	free(rp);
	atomic_fetch_add(&g->st_batches, 1);
	if (rv == 0) {
		kv_rpc_async_call(s->calls[slot], msg, CALL_MS);
		pthread_mutex_lock(&s->mu);
		return;
	}
	pthread_mutex_lock(&s->mu);
	s->busy[slot] = false;
	s->inflight--;
	s->need_reset = true;
	s->retry_ns = kv_now_ns() + RETRY_MS * 1000000ull;
}

/* Asks the controller to take s's backup out of the ISR of every range this
 * node leads with it (doc/replication.md "ISR changes", Shrink). Called by
 * the stream thread with no lock held. */
static void
ask_shrink(stream *s)
{
	kv_rs *g = s->g;
	uint32_t me = g->env.node_id(g->env.arg);
	uint64_t epoch = g->env.epoch(g->env.arg);
	route *ask = NULL;
	size_t n = 0;
	bool refused = false;

	pthread_rwlock_rdlock(&g->tab_lock);
	ask = calloc(g->nroutes ? g->nroutes : 1, sizeof(*ask));
	for (size_t i = 0; ask && i < g->nroutes; i++) {
		const route *r = &g->routes[i];
		bool with = false;
		for (uint32_t j = 0; j < r->nbackups; j++)
			with |= r->backups[j] == s;
		if (!with || r->primary != me)
			continue;
		if (kv_buf_set(&ask[n].start, r->start.data, r->start.len) != 0 ||
		    kv_buf_set(&ask[n].end, r->end.data, r->end.len) != 0) {
			kv_buf_fini(&ask[n].start);
			continue;
		}
		ask[n++].leader_epoch = r->leader_epoch;
	}
	pthread_rwlock_unlock(&g->tab_lock);
	for (size_t i = 0; i < n; i++) {
		kv_bytes st = {ask[i].start.data, ask[i].start.len};
		kv_bytes en = {ask[i].end.data, ask[i].end.len};
		int rv = g->env.isr_remove(g->env.arg, &st, &en, ask[i].leader_epoch, s->node);
		atomic_fetch_add(&g->st_asks, 1);
		KV_WARN(COMP, "in-sync backup silent: asked the controller to shrink the ISR",
		        "node=%u leader_epoch=%llu result=%s", s->node,
		        (unsigned long long)ask[i].leader_epoch, kv_errname(rv));
		refused |= rv == KV_ESTALE || rv == KV_EINVAL;
	}
	routes_free(ask, n);
	if (refused) {
		pthread_mutex_lock(&s->mu);
		s->refused_epoch = epoch;
		pthread_mutex_unlock(&s->mu);
	}
}

/* Whether s should ask for a shrink now (caller holds s->mu); moves the
 * next ask on when it should. */
static bool
shrink_due_locked(stream *s, uint64_t now)
{
	kv_rs *g = s->g;

	if (g->env.isr_remove == NULL || atomic_load(&g->stopping) || s->unacked == NULL ||
	    now < s->ask_ns || now - s->progress_ns < SHRINK_MS * 1000000ull ||
	    (s->refused_epoch != 0 && s->refused_epoch == g->env.epoch(g->env.arg)))
		return false;
	s->ask_ns = now + ASK_AGAIN_MS * 1000000ull;
	return true;
}

static void *
stream_main(void *arg)
{
	stream *s = arg;
	kv_rs *g = s->g;

	pthread_mutex_lock(&s->mu);
	while (!atomic_load(&g->stopping)) {
		struct timespec ts;
		/* Free what the backup has. */
		while (s->head && s->head != s->unacked) {
			entry *e = s->head;
			s->head = e->next;
			free(e);
		}
		if (s->head == NULL)
			s->tail = NULL;
		if (s->need_reset && s->inflight == 0 && kv_now_ns() >= s->retry_ns) {
			s->gen++;
			s->next_seq = 1;
			s->unsent = s->unacked;
			s->need_reset = false;
			atomic_fetch_add(&g->st_resends, 1);
		}
		if (!s->need_reset && s->unsent && s->inflight < WINDOW) {
			if (s->cli == NULL) {
				pthread_mutex_unlock(&s->mu);
				int rv = stream_connect(s);
				pthread_mutex_lock(&s->mu);
				if (rv != 0) {
					s->need_reset = true;
					s->retry_ns = kv_now_ns() + RETRY_MS * 1000000ull;
					continue;
				}
			}
			send_batch_locked(s);
			continue;
		}
		if (shrink_due_locked(s, kv_now_ns())) {
			pthread_mutex_unlock(&s->mu);
			ask_shrink(s);
			pthread_mutex_lock(&s->mu);
			continue;
		}
		deadline_in(&ts, POLL_MS);
		pthread_cond_timedwait(&s->cv, &s->mu, &ts);
		pthread_mutex_unlock(&s->mu);
		sweep(g, 0);
		pthread_mutex_lock(&s->mu);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* The stream to node, made (and its thread started) when new. Called by
 * the configuration thread. Returns NULL when out of memory or streams. */
static stream *
stream_get(kv_rs *g, uint32_t node, const char *addr)
{
	stream *s = NULL;
	size_t n;

	pthread_mutex_lock(&g->smu);
	n = atomic_load(&g->nstreams);
	for (size_t i = 0; i < n; i++)
		if (g->streams[i]->node == node) {
			s = g->streams[i];
			goto out;
		}
	if (n == MAX_STREAMS || addr == NULL || addr[0] == '\0' ||
	    (s = calloc(1, sizeof(*s))) == NULL)
		goto out;
	s->g = g;
	s->node = node;
	snprintf(s->addr, sizeof(s->addr), "%s", addr);
	atomic_init(&s->pending, UINT64_MAX);
	atomic_init(&s->hole, 0);
	s->gen = 1;
	s->next_seq = 1;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	if (pthread_create(&s->thr, NULL, stream_main, s) != 0) {
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->cv);
		free(s);
		s = NULL;
		goto out;
	}
	s->started = true;
	g->streams[n] = s;
	atomic_store_explicit(&g->nstreams, n + 1, memory_order_release);
	KV_INFO(COMP, "stream to backup started", "node=%u addr=%s", node, addr);
out:
	pthread_mutex_unlock(&g->smu);
	return s;
}

bool
kv_rs_active(kv_rs *g)
{
	return atomic_load_explicit(&g->nstreams, memory_order_relaxed) != 0 ||
	       atomic_load_explicit(&g->short_isr, memory_order_relaxed);
}

int
kv_rs_write_begin(kv_rs *g, const kv_bytes *keys, size_t n, kv_rs_op *op, const char **why)
{
	const route *r;

	op->g = NULL;
	op->tap = (kv_dur_tap){0};
	pthread_rwlock_rdlock(&g->tab_lock);
	r = n ? find_route(g, keys[0].p, keys[0].len) : NULL;
	for (size_t i = 0; r && i < n; i++) {
		const route *o = i ? find_route(g, keys[i].p, keys[i].len) : r;
		if (o == NULL)
			continue;
		if (o->ninsync < o->min_insync) {
			pthread_rwlock_unlock(&g->tab_lock);
			*why = "the range has fewer in-sync replicas than the minimum: writes are "
			       "refused until the set grows";
			return KV_EUNAVAIL;
		}
		if (o != r && (o->nbackups || r->nbackups)) {
			pthread_rwlock_unlock(&g->tab_lock);
			*why = "a multi-key write to replicated ranges must stay within one range";
			return KV_EINVAL;
		}
	}
	op->g = g;
	if (r && r->nbackups)
		op->tap = (kv_dur_tap){.fn = tap_fn, .arg = (void *)r};
	return KV_OK;
}

void
kv_rs_write_end(kv_rs_op *op)
{
	if (op->g == NULL)
		return;
	pthread_rwlock_unlock(&op->g->tab_lock);
	op->g = NULL;
}

/* Whether [as, ae) and [bs, be) share a key (empty end: the end of the key
 * space). */
static bool
overlap(const kv_buf *as, const kv_buf *ae, const kv_buf *bs, const kv_buf *be)
{
	return (ae->len == 0 || kv_key_cmp(bs->data, bs->len, ae->data, ae->len) < 0) &&
	       (be->len == 0 || kv_key_cmp(as->data, as->len, be->data, be->len) < 0);
}

/* Whether a range that old led here with backups has another primary in nr. */
static bool
demoted(const route *old, size_t oldn, const route *nr, size_t n, uint32_t me)
{
	for (size_t i = 0; i < oldn; i++) {
		if (old[i].primary != me || old[i].nbackups == 0)
			continue;
		for (size_t j = 0; j < n; j++)
			if (nr[j].primary != me &&
			    overlap(&old[i].start, &old[i].end, &nr[j].start, &nr[j].end))
				return true;
	}
	return false;
}

bool
kv_rs_fenced(kv_rs *g, uint64_t t0_ns)
{
	uint64_t f = atomic_load_explicit(&g->fence_ns, memory_order_relaxed);

	return f != 0 && t0_ns <= f;
}

int
kv_rs_apply_config(kv_rs *g, const kv_config *c)
{
	uint32_t me = g->env.node_id(g->env.arg);
	route *nr = calloc(c->nranges ? c->nranges : 1, sizeof(*nr));
	route *old;
	size_t oldn;
	bool short_isr = false;

	if (nr == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < c->nranges; i++) {
		const kv_range *r = &c->ranges[i];
		route *t = &nr[i];
		if (kv_buf_set(&t->start, r->start.data, r->start.len) != 0 ||
		    kv_buf_set(&t->end, r->end.data, r->end.len) != 0) {
			routes_free(nr, c->nranges);
			return KV_ENOMEM;
		}
		t->primary = r->node;
		t->leader_epoch = r->leader_epoch;
		t->ninsync = kv_range_ninsync(r);
		for (uint32_t j = 0; j < t->ninsync && j < KV_MAX_REPLICAS; j++)
			t->insync[j] = kv_range_insync(r, j);
		/* Never more than the range's replicas (doc/contract.md §2). */
		t->min_insync = r->nreplicas ? kv_rs_min_insync(c) : 1;
		if (t->min_insync > kv_range_nreplicas(r))
			t->min_insync = kv_range_nreplicas(r);
		if (r->node != me || me == 0)
			continue;
		short_isr |= t->ninsync < t->min_insync;
		for (uint32_t j = 0; j < t->ninsync; j++) {
			const kv_node *nd;
			stream *s;
			if (t->insync[j] == me)
				continue;
			nd = kv_config_node(c, t->insync[j]);
			s = stream_get(g, t->insync[j], nd ? nd->address : NULL);
			if (s == NULL) {
				/* Without a stream no write of the range could be acknowledged
				 * truthfully: count the member as missing. */
				KV_ERROR(COMP, "cannot stream to an in-sync backup", "node=%u",
				         t->insync[j]);
				t->min_insync = UINT32_MAX;
				short_isr = true;
				continue;
			}
			t->backups[t->nbackups++] = s;
		}
	}
	pthread_rwlock_wrlock(&g->tab_lock);
	old = g->routes;
	oldn = g->nroutes;
	g->routes = nr;
	g->nroutes = c->nranges;
	atomic_store(&g->short_isr, short_isr);
	pthread_rwlock_unlock(&g->tab_lock);
	/* Demotion: a range this node led with backups has another primary
	 * (a failover while it was cut off or paused). What it logged for the
	 * range may be missing at the new primary, and the backups that have
	 * not acknowledged it are about to leave every stream: the replies of
	 * writes that began before now must fail, not succeed (kv_rs_fenced).
	 * Every write of the old routes has logged (the swap waited for them);
	 * a later one is refused by the ownership table. */
	if (me != 0 && demoted(old, oldn, nr, c->nranges, me)) {
		atomic_store(&g->fence_ns, kv_now_ns());
		atomic_fetch_add(&g->st_demotions, 1);
		KV_WARN(COMP, "a range this node led has another primary: writes in flight fail",
		        "epoch=%llu", (unsigned long long)c->epoch);
	}
	routes_free(old, oldn);
	/* A backup no range streams to any more (left the ISR, or the range
	 * left this node) holds up nothing: what it has not acknowledged is no
	 * longer needed for the commit point. No write taps it now: they all
	 * began after the swap. */
	size_t ns = atomic_load(&g->nstreams);
	for (size_t i = 0; i < ns; i++) {
		stream *s = g->streams[i];
		bool used = false;
		for (size_t j = 0; j < c->nranges && !used; j++)
			for (uint32_t k = 0; k < nr[j].nbackups; k++)
				used |= nr[j].backups[k] == s;
		if (used)
			continue;
		pthread_mutex_lock(&s->mu);
		if (s->unacked != NULL)
			KV_INFO(COMP, "backup left every in-sync set: its queue is dropped",
			        "node=%u", s->node);
		s->unacked = NULL;
		s->unsent = NULL;
		atomic_store(&s->pending, UINT64_MAX);
		atomic_store(&s->hole, 0);
		pthread_cond_signal(&s->cv);
		pthread_mutex_unlock(&s->mu);
	}
	sweep(g, 0);
	return KV_OK;
}

/* ------------------------------------------------------------------------
 * Backup side
 * ------------------------------------------------------------------------ */

/* Whether this node may apply r from node `from`. Caller holds tab_lock. */
static int
check_rec(kv_rs *g, uint32_t me, uint32_t from, const kv_repl_rec *r, const char **why)
{
	const route *t = find_route(g, r->start.p, r->start.len);
	bool member = false;

	if (t == NULL) {
		*why = "no range of this node's configuration holds the record";
		return KV_EWRONGOWNER;
	}
	if (r->leader_epoch < t->leader_epoch) {
		*why = "leader epoch older than this node's configuration: the sender is no "
		       "longer the primary";
		return KV_ESTALE;
	}
	if (r->leader_epoch > t->leader_epoch) {
		if (g->env.hurry)
			g->env.hurry(g->env.arg);
		*why = "leader epoch newer than this node's configuration; retry";
		return KV_EBUSY;
	}
	if (t->primary != from) {
		*why = "the sender is not the range's primary in this node's configuration";
		return KV_EWRONGOWNER;
	}
	for (uint32_t i = 0; i < t->ninsync; i++)
		member |= t->insync[i] == me;
	if (!member || me == from) {
		*why = "this node is not an in-sync backup of the range";
		return KV_EWRONGOWNER;
	}
	return KV_OK;
}

/* Finds or makes the state of primary `from`. Caller holds in_mu. */
static insrc *
src_get(kv_rs *g, uint32_t from)
{
	insrc *fr = NULL;

	for (size_t i = 0; i < MAX_SOURCES; i++) {
		if (g->src[i].from == from)
			return &g->src[i];
		if (fr == NULL && g->src[i].from == 0)
			fr = &g->src[i];
	}
	if (fr)
		*fr = (insrc){.from = from};
	return fr;
}

/* Blocks until the local log holds lsn by its mode. */
typedef struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
	int st;
} dwait;

static void
dwait_cb(void *arg, int st)
{
	dwait *w = arg;
	pthread_mutex_lock(&w->mu);
	w->done = true;
	w->st = st;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

static int
wait_durable(kv_dur *d, uint64_t lsn)
{
	dwait w = {.done = false};
	int rv;

	if (lsn == 0 || kv_dur_durable_lsn(d) >= lsn)
		return KV_OK;
	pthread_mutex_init(&w.mu, NULL);
	pthread_cond_init(&w.cv, NULL);
	rv = kv_dur_notify(d, lsn, dwait_cb, &w);
	if (rv == 0) {
		pthread_mutex_lock(&w.mu);
		while (!w.done)
			pthread_cond_wait(&w.cv, &w.mu);
		rv = w.st;
		pthread_mutex_unlock(&w.mu);
	}
	pthread_mutex_destroy(&w.mu);
	pthread_cond_destroy(&w.cv);
	return rv;
}

void
kv_rs_handle(kv_rs *g, const kv_req *rq, kv_repl_ack *ack)
{
	const kv_repl_msg *m = &rq->repl;
	uint32_t me = g->env.node_id(g->env.arg);
	const char *why = NULL;
	uint64_t local = 0;
	struct timespec ts;
	insrc *in;
	int st = KV_OK;

	memset(ack, 0, sizeof(*ack));
	if (me == 0 || m->from_node != rq->from_node) {
		ack->status = KV_EINVAL;
		ack->error = me == 0 ? "this node has not registered yet"
		                     : "Replicate.from_node differs from Request.from_node";
		atomic_fetch_add(&g->st_refused, 1);
		return;
	}
	pthread_mutex_lock(&g->in_mu);
	if ((in = src_get(g, m->from_node)) == NULL) {
		pthread_mutex_unlock(&g->in_mu);
		ack->status = KV_ELIMIT;
		ack->error = "this node follows too many primaries";
		atomic_fetch_add(&g->st_refused, 1);
		return;
	}
	deadline_in(&ts, GAP_WAIT_MS);
	while (in->stream_id == m->stream_id && m->seq > in->next_seq &&
	       pthread_cond_timedwait(&g->in_cv, &g->in_mu, &ts) == 0)
		;
	if (in->stream_id != m->stream_id) {
		/* A new stream starts at seq 1; one of the same start must have a
		 * higher generation (a late batch of an old one is refused). */
		bool new_boot = (m->stream_id >> 32) != (in->stream_id >> 32);
		if (m->seq != 1 || (!new_boot && m->stream_id < in->stream_id)) {
			st = KV_EBUSY;
			why = "unknown or old stream: start again at seq 1";
			goto answer;
		}
		in->stream_id = m->stream_id;
		in->next_seq = 1;
		if (new_boot)
			in->last_lsn = 0;
	}
	if (m->seq > in->next_seq) {
		st = KV_EBUSY;
		why = "a batch is missing: resend after acked_seq";
		goto answer;
	}
	if (m->seq == in->next_seq) {
		pthread_rwlock_rdlock(&g->tab_lock);
		for (size_t i = 0; i < m->nrecs && st == KV_OK; i++) {
			const kv_repl_rec *r = &m->recs[i];
			uint64_t l = 0;
			if (r->lsn <= in->last_lsn)
				continue;
			if ((st = check_rec(g, me, m->from_node, r, &why)) != KV_OK)
				break;
			kv_dur_begin(g->env.dur);
			st = kv_dur_apply_record(g->env.dur, r->payload.p, r->payload.len, &l);
			kv_dur_end(g->env.dur);
			if (st != KV_OK) {
				why = st == KV_ECORRUPT
				          ? "malformed record payload"
				          : "the record could not be applied or logged";
				if (st == KV_ECORRUPT)
					st = KV_EINVAL;
				break;
			}
			in->last_lsn = r->lsn;
			in->last_local = l;
			atomic_fetch_add(&g->st_applied, 1);
		}
		pthread_rwlock_unlock(&g->tab_lock);
		if (st == KV_OK)
			in->next_seq = m->seq + 1;
		pthread_cond_broadcast(&g->in_cv);
	}
	/* else: a batch applied before (seq < next_seq): its records are in. */
answer:
	ack->acked_seq = in->next_seq - 1;
	ack->acked_lsn = in->last_lsn;
	local = in->last_local;
	pthread_mutex_unlock(&g->in_mu);
	if (st == KV_OK && (st = wait_durable(g->env.dur, local)) != KV_OK)
		why = "the write-ahead log cannot be written";
	ack->status = st;
	ack->error = why;
	if (st != KV_OK) {
		atomic_fetch_add(&g->st_refused, 1);
		KV_DEBUG(COMP, "replicate refused", "from=%u seq=%llu err=%s why=\"%s\"",
		         m->from_node, (unsigned long long)m->seq, kv_errname(st), why ? why : "");
	}
}

/* ------------------------------------------------------------------------
 * Life cycle
 * ------------------------------------------------------------------------ */

int
kv_rs_create(const kv_rs_env *env, kv_rs **out)
{
	kv_rs *g = calloc(1, sizeof(*g));

	if (g == NULL)
		return KV_ENOMEM;
	g->env = *env;
	/* Writer-preferring, as the log's barrier: a steady flow of writes
	 * (readers) must not hold a new configuration back. No thread takes it
	 * for reading twice. */
	pthread_rwlockattr_t ra;
	pthread_rwlockattr_init(&ra);
	pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&g->tab_lock, &ra);
	pthread_rwlockattr_destroy(&ra);
	pthread_mutex_init(&g->smu, NULL);
	pthread_mutex_init(&g->in_mu, NULL);
	pthread_cond_init(&g->in_cv, NULL);
	pthread_mutex_init(&g->wmu, NULL);
	atomic_init(&g->nstreams, 0);
	*out = g;
	return KV_OK;
}

void
kv_rs_stop(kv_rs *g)
{
	if (g == NULL)
		return;
	atomic_store(&g->stopping, true);
	sweep(g, KV_ECLOSED);
	size_t n = atomic_load(&g->nstreams);
	for (size_t i = 0; i < n; i++) {
		stream *s = g->streams[i];
		pthread_mutex_lock(&s->mu);
		pthread_cond_signal(&s->cv);
		pthread_mutex_unlock(&s->mu);
	}
}

void
kv_rs_destroy(kv_rs *g)
{
	if (g == NULL)
		return;
	kv_rs_stop(g);
	size_t n = atomic_load(&g->nstreams);
	for (size_t i = 0; i < n; i++) {
		stream *s = g->streams[i];
		uint64_t until = kv_now_ns() + (CALL_MS + 500ull) * 1000000ull;
		if (s->started)
			pthread_join(s->thr, NULL);
		/* Calls in flight end by their deadline; closing under one can hang. */
		pthread_mutex_lock(&s->mu);
		while (s->inflight > 0 && kv_now_ns() < until) {
			struct timespec ts;
			deadline_in(&ts, 10);
			pthread_cond_timedwait(&s->cv, &s->mu, &ts);
		}
		pthread_mutex_unlock(&s->mu);
		for (int j = 0; j < WINDOW; j++)
			kv_rpc_async_destroy(s->calls[j]);
		kv_rpc_client_destroy(s->cli);
		while (s->head) {
			entry *e = s->head;
			s->head = e->next;
			free(e);
		}
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->cv);
		free(s);
	}
	routes_free(g->routes, g->nroutes);
	sweep(g, KV_ECLOSED);
	pthread_rwlock_destroy(&g->tab_lock);
	pthread_mutex_destroy(&g->smu);
	pthread_mutex_destroy(&g->in_mu);
	pthread_cond_destroy(&g->in_cv);
	pthread_mutex_destroy(&g->wmu);
	free(g);
}

void
kv_rs_stats_get(kv_rs *g, kv_rs_stats *st)
{
	size_t n = atomic_load(&g->nstreams);

	memset(st, 0, sizeof(*st));
	st->streams = n;
	for (size_t i = 0; i < n; i++) {
		stream *s = g->streams[i];
		pthread_mutex_lock(&s->mu);
		for (entry *e = s->unacked; e; e = e->next)
			st->queued++;
		pthread_mutex_unlock(&s->mu);
	}
	st->sent_batches = atomic_load(&g->st_batches);
	st->resends = atomic_load(&g->st_resends);
	st->applied = atomic_load(&g->st_applied);
	st->refused = atomic_load(&g->st_refused);
	st->shrink_asks = atomic_load(&g->st_asks);
	st->demotions = atomic_load(&g->st_demotions);
}
