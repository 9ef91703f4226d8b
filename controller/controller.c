/*
 * controller.c - controller state, request dispatch and held requests
 * (controller.h).
 *
 * DESIGN. The state is the history of configurations (hist[i] has epoch
 * i + 1; each is immutable once published and lives until the controller is
 * destroyed, so a pointer to it may be used without the lock), plus live
 * statistics from heartbeats and migration progress, which are not durable.
 * A command that changes something asks placement.c for the next
 * configuration, appends it to the config log (fsync) and only then
 * publishes it: appends it to hist and marks the held requests it answers.
 *
 * Requests arrive on nng threads (rpc.h) and are dispatched through the
 * command table below. Watches and --wait commands are held (deferred
 * replies); one reaper thread answers them when they are due and when their
 * time runs out. Only the reaper calls kv_rpc_reply (rpc.c accepts an answer
 * even before the handler that deferred the request has returned).
 *
 * THREADS. nng's threads run ctl_handle (which takes mu for the whole
 * command, including the config log's write and fsync, and encodes the
 * answer under it); the reaper thread sleeps on cv and answers held
 * requests, encoding and sending with mu released; the metrics thread takes
 * mu briefly to read gauges; the main thread only waits for a signal. mu is
 * the only lock: nothing else is taken while it is held and it is never
 * held across an rpc call or kv_rpc_reply.
 *
 * Bounds: at most max_watches watches and CTL_MAX_WAITS waits are held; a
 * watch beyond the cap answers the oldest watch early, a wait beyond it is
 * refused with STATUS_BUSY before the command runs. The rest of the nng
 * contexts stay free for admin commands and heartbeats.
 */
#include "controller/controller.h"
#include "common/auth.h"
#include "common/err.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/rpc.h"
#include "controller/admin_codec.h"
#include "controller/clog.h"
#include "controller/placement.h"
#include "controller/replica.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

_Static_assert(KV_CONTROLLER_MAX_PEERS == KV_REPL_MAX_PEERS,
               "--peers (args.c) and raft agree on the most replicas");

#define CTL_GRACE_NS        0u /* delay before a due held request is answered */
#define CTL_MAX_WAITS       128u
#define CTL_DEFAULT_CONFIGS 256u
#define CTL_MAX_FAILS       64u
#define CTL_DEDUP           256u
#define CTL_STATS_GRACE_NS  1500000000u /* a new leader's wait for heartbeats */

/* Live statistics of one node, from its latest heartbeat. */
struct ctl_stat {
	uint32_t id;                  /* node id */
	uint64_t boot_id;             /* from Register / Heartbeat */
	uint64_t epoch_applied;       /* epoch the node routes with */
	uint64_t keys, bytes, memory; /* node totals */
	double ops;                   /* op rate */
	uint64_t last_seen_ns;        /* monotonic time of the last report; 0: never */
	size_t nranges;               /* entries in ranges */
	kv_admin_range_stat *ranges;  /* owned; bytes point into blob, split into splits */
	kv_bytes *splits;             /* owned */
	uint8_t *blob;                /* owned key bytes */
};

/* Live progress of a migration (not durable, not in the config). */
struct ctl_prog {
	uint64_t id;                                    /* migration id */
	kv_mig_phase phase;                             /* phase reached */
	uint64_t keys_copied, bytes_copied;             /* acknowledged so far */
	uint64_t keys_total, bytes_total, rate_bytes_s; /* estimates */
};

/* A migration that ended without success, for --wait answers. */
struct ctl_fail {
	uint64_t id;   /* migration id; 0: unused slot */
	int err;       /* KV_E* code */
	char msg[160]; /* detail */
};

/* A change committed through Raft by a request that carried a client id:
 * replicated, so that a retry sent to a new leader after the old one died
 * is answered with what it did instead of being applied twice. */
struct ctl_rdedup {
	uint64_t client_id;  /* 0: unused slot */
	uint64_t request_id; /* the sender's request id */
	uint64_t epoch;      /* the epoch it published */
};

/* A mutating request waiting for the proposer thread (replicated mode). */
struct ctl_job {
	struct ctl_job *next;      /* queue link */
	kv_rpc_pending *p;         /* the request slot */
	kv_admin_req rq;           /* the decoded request (owned) */
	const struct ctl_cmd *cmd; /* its command */
};

/* One proposal (or barrier) in flight; the proposer waits for `done`. */
struct ctl_prop {
	kv_controller *c; /* whose mu and pcv */
	bool done;        /* the replica called back */
	int status;       /* KV_OK or why it did not commit */
	int result;       /* what apply returned */
};

/* The answer to a command that changed something, kept so that a retry of
 * the same (client_id, request_id) is answered again instead of applied
 * twice (AdminRequest.client_id). */
struct ctl_dedup {
	uint64_t client_id;  /* 0: unused slot */
	uint64_t request_id; /* the sender's request id */
	void *reply;         /* the packed answer (owned) */
	size_t len;          /* its length */
};

enum { HELD_WATCH = 1, HELD_WAIT = 2 };

/* A request held for a later answer. */
struct ctl_held {
	struct ctl_held *prev, *next; /* the held list, oldest first */
	kv_rpc_pending *p;            /* the request slot */
	int kind;                     /* HELD_* */
	uint64_t request_id;          /* echoed */
	uint64_t born_ns;             /* when it was held */
	uint64_t deadline_ns;         /* when it times out */
	bool ready;                   /* answer as soon as the grace period is over */
	/* watch */
	uint64_t known;       /* known epoch */
	bool history;         /* answer with every config after known */
	uint32_t max_configs; /* at most this many */
	/* wait */
	uint64_t epoch;          /* epoch the command published */
	const kv_config *config; /* that config (immutable) */
	uint32_t node_id;        /* join: the new node */
	uint64_t *migs;          /* migrations the command created (owned) */
	size_t nmigs;            /* entries in migs */
	uint64_t wait_ms;        /* set when it became ready */
	int err;                 /* result to answer with */
	char error[200];         /* its detail */
};

struct kv_controller {
	char *listen;          /* --listen (owned) */
	char *data_dir;        /* --data-dir (owned) */
	uint32_t watch_max_ms; /* longest watch */
	uint32_t wait_max_ms;  /* default wait bound */
	unsigned max_watches;  /* held watches cap */
	kv_rpc_server *rpc;    /* the listener */
	kv_clog *log;          /* the config log; used under mu */
	kv_metrics *metrics;   /* the /metrics listener, or NULL */
	char *metrics_addr;    /* --metrics HOST:PORT (owned); NULL: off */
	unsigned contexts;     /* nng contexts of the listener */
	bool started;          /* kv_controller_start ran (once only) */
	pthread_t reaper;      /* answers held requests */
	bool reaper_started;   /* reaper must be joined */
	char cluster_id[25];   /* from the log header */
	kv_buf auth;           /* --auth-token-file secret (immutable); empty: none */
	kv_tls *tls;           /* --tls-* configuration (immutable); NULL: plain tcp */

	pthread_mutex_t mu;                   /* protects everything down to the blank line */
	pthread_cond_t cv;                    /* wakes the reaper (CLOCK_MONOTONIC) */
	kv_config **hist;                     /* every published config; hist[i].epoch == i + 1 */
	size_t nhist, caphist;                /* entries, capacity */
	kv_config *empty;                     /* answered before the first config (epoch 0) */
	uint64_t next_mig_id;                 /* next migration id */
	struct ctl_stat *stats;               /* one per node that reported */
	size_t nstats;                        /* entries in stats */
	struct ctl_prog *prog;                /* progress of migrations in flight */
	size_t nprog;                         /* entries in prog */
	struct ctl_fail fails[CTL_MAX_FAILS]; /* recent failures, a ring */
	size_t nextfail;                      /* next ring slot */
	struct ctl_dedup dedup[CTL_DEDUP];    /* recent answers to changes, a ring */
	size_t nextdedup;                     /* its next slot */
	struct ctl_held held;                 /* list head of held requests */
	size_t nwatches, nwaits;              /* held requests by kind */
	bool closing;                         /* stopping: hold nothing more */

	uint64_t started_ns; /* for the metrics */

	/* Replication; repl is NULL for a standalone controller. peers and
	 * self_id are immutable. */
	kv_repl *repl;                          /* the Raft replica */
	uint32_t self_id;                       /* --id */
	size_t npeers;                          /* replicas */
	char **peers;                           /* their controller URLs (owned) */
	pthread_t proposer;                     /* runs mutating commands one at a time */
	bool proposer_started;                  /* proposer must be joined */
	char raft_addr[KV_REPL_MAX_PEERS][128]; /* HOST:PORT raft uses, per replica */
	char raft_dir[4096];                    /* DATA_DIR/raft */
	unsigned election_ms;                   /* --election-timeout; 0: raft's default */
	unsigned snapshot_threshold;            /* --snapshot-threshold; 0: raft's default */
	/* The following are protected by mu too. */
	pthread_cond_t pcv;                  /* wakes the proposer; proposal done
	                                        (CLOCK_MONOTONIC) */
	struct ctl_job *jobs, *jobs_tail;    /* mutating requests, oldest first */
	uint64_t barrier_term;               /* term whose barrier has been applied */
	uint64_t leader_since_ns;            /* when that barrier committed */
	uint64_t cur_client_id, cur_req_id;  /* the command being proposed */
	struct ctl_rdedup rdedup[CTL_DEDUP]; /* replicated answers, a ring */
	size_t nextrdedup;                   /* its next slot */
};

/* The result of one handler, encoded by the dispatcher. */
struct ctl_ctx {
	kv_admin_resp resp;                       /* the answer */
	kv_admin_replica reps[KV_REPL_MAX_PEERS]; /* status: controller replicas */
	char msg[512];                            /* resp.error storage */
	kv_rpc_pending *p;                        /* the request slot, for handlers that hold it */
	bool held;                                /* the handler kept the request */
	uint64_t *migs;                           /* created migrations; freed after encoding */
	kv_admin_node_stat *nstat;                /* status: freed after encoding */
	kv_migration *rmigs;                      /* status: freed after encoding */
	kv_admin_report report;                   /* status */
	const kv_config **cfgs;                   /* watch: freed after encoding */
};

static uint64_t
now_ns(void)
{
	return kv_now_ns();
}

static uint64_t
unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static const kv_config *
latest_locked(const kv_controller *c)
{
	return c->nhist ? c->hist[c->nhist - 1] : c->empty;
}

static void
held_unlink(kv_controller *c, struct ctl_held *h)
{
	h->prev->next = h->next;
	h->next->prev = h->prev;
	h->prev = h->next = NULL;
	if (h->kind == HELD_WATCH)
		c->nwatches--;
	else
		c->nwaits--;
}

static void
held_push(kv_controller *c, struct ctl_held *h)
{
	h->next = &c->held;
	h->prev = c->held.prev;
	c->held.prev->next = h;
	c->held.prev = h;
	if (h->kind == HELD_WATCH)
		c->nwatches++;
	else
		c->nwaits++;
}

static void
held_free(struct ctl_held *h)
{
	if (h == NULL)
		return;
	free(h->migs);
	free(h);
}

/* ---- statistics ---- */

static struct ctl_stat *
stat_find_locked(kv_controller *c, uint32_t id, bool create)
{
	struct ctl_stat *s;

	for (size_t i = 0; i < c->nstats; i++)
		if (c->stats[i].id == id)
			return &c->stats[i];
	if (!create)
		return NULL;
	s = realloc(c->stats, (c->nstats + 1) * sizeof(*s));
	if (s == NULL)
		return NULL;
	c->stats = s;
	s = &c->stats[c->nstats++];
	memset(s, 0, sizeof(*s));
	s->id = id;
	return s;
}

static void
stat_clear(struct ctl_stat *s)
{
	free(s->ranges);
	free(s->splits);
	free(s->blob);
	s->ranges = NULL;
	s->splits = NULL;
	s->blob = NULL;
	s->nranges = 0;
}

static kv_bytes
blob_put(uint8_t **w, kv_bytes b)
{
	kv_bytes r = {*w, b.len};
	if (b.len)
		memcpy(*w, b.p, b.len);
	*w += b.len;
	return r;
}

/* Copies a heartbeat's per-range statistics into s. */
static int
stat_store(struct ctl_stat *s, const kv_admin_req *rq)
{
	size_t bytes = 0, nsplit = 0;
	kv_admin_range_stat *r = NULL;
	kv_bytes *sp = NULL;
	uint8_t *blob = NULL, *w;

	for (size_t i = 0; i < rq->nranges; i++) {
		bytes += rq->ranges[i].start.len + rq->ranges[i].end.len;
		nsplit += rq->ranges[i].nsplit;
		for (size_t j = 0; j < rq->ranges[i].nsplit; j++)
			bytes += rq->ranges[i].split[j].len;
	}
	if ((rq->nranges && (r = calloc(rq->nranges, sizeof(*r))) == NULL) ||
	    (nsplit && (sp = calloc(nsplit, sizeof(*sp))) == NULL) ||
	    (blob = malloc(bytes ? bytes : 1)) == NULL) {
		free(r);
		free(sp);
		return KV_ENOMEM;
	}
	w = blob;
	nsplit = 0;
	for (size_t i = 0; i < rq->nranges; i++) {
		r[i] = rq->ranges[i];
		r[i].start = blob_put(&w, rq->ranges[i].start);
		r[i].end = blob_put(&w, rq->ranges[i].end);
		r[i].split = sp != NULL ? sp + nsplit : NULL; /* no splits at all: sp is NULL */
		for (size_t j = 0; j < rq->ranges[i].nsplit; j++)
			sp[nsplit++] = blob_put(&w, rq->ranges[i].split[j]);
	}
	stat_clear(s);
	s->ranges = r;
	s->nranges = rq->nranges;
	s->splits = sp;
	s->blob = blob;
	return KV_OK;
}

/*
 * Builds the data samples for placement: for every range a node reported,
 * its bytes spread evenly over its start and split keys, keeping only the
 * samples in key space the reporter serves in cur (so a range reported by a
 * source and a destination is not counted twice). The caller frees *out;
 * the keys borrow from c->stats.
 */
static int
points_locked(kv_controller *c, const kv_config *cur, kv_place_point **out, size_t *n)
{
	size_t cap = 0, k = 0;
	kv_place_point *pts;

	for (size_t i = 0; i < c->nstats; i++)
		for (size_t j = 0; j < c->stats[i].nranges; j++)
			cap += 1 + c->stats[i].ranges[j].nsplit;
	pts = calloc(cap ? cap : 1, sizeof(*pts));
	if (pts == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < c->nstats; i++) {
		const struct ctl_stat *s = &c->stats[i];
		for (size_t j = 0; j < s->nranges; j++) {
			const kv_admin_range_stat *r = &s->ranges[j];
			uint64_t each = r->bytes / (r->nsplit + 1);
			if (r->bytes == 0)
				continue;
			for (size_t q = 0; q <= r->nsplit; q++) {
				kv_bytes key = q == 0 ? r->start : r->split[q - 1];
				if (kv_config_route(cur, key.p, key.len) != s->id)
					continue;
				pts[k].key = key;
				pts[k].bytes = each ? each : 1;
				k++;
			}
		}
	}
	*out = pts;
	*n = k;
	return KV_OK;
}

static void
prog_prune_locked(kv_controller *c, const kv_config *cur)
{
	size_t k = 0;

	for (size_t i = 0; i < c->nprog; i++) {
		bool live = false;
		for (size_t j = 0; j < cur->nmigs && !live; j++)
			live = cur->migs[j].id == c->prog[i].id;
		if (live)
			c->prog[k++] = c->prog[i];
	}
	c->nprog = k;
}

static struct ctl_prog *
prog_find_locked(kv_controller *c, uint64_t id, bool create)
{
	struct ctl_prog *p;

	for (size_t i = 0; i < c->nprog; i++)
		if (c->prog[i].id == id)
			return &c->prog[i];
	if (!create)
		return NULL;
	p = realloc(c->prog, (c->nprog + 1) * sizeof(*p));
	if (p == NULL)
		return NULL;
	c->prog = p;
	p = &c->prog[c->nprog++];
	memset(p, 0, sizeof(*p));
	p->id = id;
	return p;
}

static const struct ctl_fail *
fail_find_locked(const kv_controller *c, uint64_t id)
{
	for (size_t i = 0; i < CTL_MAX_FAILS; i++)
		if (c->fails[i].id == id)
			return &c->fails[i];
	return NULL;
}

static bool
mig_in(const kv_config *cfg, uint64_t id)
{
	for (size_t i = 0; i < cfg->nmigs; i++)
		if (cfg->migs[i].id == id)
			return true;
	return false;
}

/* ---- publishing ---- */

/* Marks the held requests that the latest config answers. */
static void
wake_locked(kv_controller *c)
{
	const kv_config *cur = latest_locked(c);
	uint64_t now = now_ns();
	bool any = false;

	for (struct ctl_held *h = c->held.next; h != &c->held; h = h->next) {
		if (h->ready)
			continue;
		if (h->kind == HELD_WATCH) {
			h->ready = cur->epoch > h->known;
		} else {
			bool done = true;
			for (size_t i = 0; i < h->nmigs && done; i++)
				done = !mig_in(cur, h->migs[i]);
			if (!done)
				continue;
			h->ready = true;
			h->wait_ms = (now - h->born_ns) / 1000000u;
			for (size_t i = 0; i < h->nmigs; i++) {
				const struct ctl_fail *f = fail_find_locked(c, h->migs[i]);
				if (f != NULL) {
					h->err = f->err;
					snprintf(h->error, sizeof(h->error), "migration %llu %s",
					         (unsigned long long)f->id, f->msg);
					break;
				}
			}
		}
		any = any || h->ready;
	}
	if (any)
		pthread_cond_signal(&c->cv);
}

/* Appends a configuration (taken; its epoch is nhist + 1 and the history
 * has room) to the history and answers the held requests it concerns. */
static void
install_locked(kv_controller *c, kv_config *next)
{
	c->hist[c->nhist++] = next;
	for (size_t i = 0; i < next->nmigs; i++)
		if (next->migs[i].id >= c->next_mig_id)
			c->next_mig_id = next->migs[i].id + 1;
	prog_prune_locked(c, next);
	wake_locked(c);
}

static int
hist_reserve_locked(kv_controller *c, size_t more)
{
	while (c->nhist + more > c->caphist) {
		size_t cap = c->caphist ? c->caphist * 2 : 64;
		kv_config **h = realloc(c->hist, cap * sizeof(*h));
		if (h == NULL)
			return KV_ENOMEM;
		c->hist = h;
		c->caphist = cap;
	}
	return KV_OK;
}

static void
random_cluster_id(char out[25])
{
	uint8_t b[8] = {0};
	uint64_t v = 0;
	int fd = open("/dev/urandom", O_RDONLY);

	if (fd >= 0) {
		if (read(fd, b, sizeof(b)) != (ssize_t)sizeof(b))
			memset(b, 0, sizeof(b));
		close(fd);
	}
	for (int i = 0; i < 8; i++)
		v = (v << 8) | b[i];
	v ^= kv_now_ns() ^ ((uint64_t)getpid() << 32);
	snprintf(out, 25, "%016llx", (unsigned long long)v);
}

/* ---- replication: the command log ----
 *
 * A Raft command publishes one configuration. Layout (little-endian):
 *
 *   offset  size  field
 *   0       4     magic "SKVE"
 *   4       4     format version (CTL_ENTRY_VERSION)
 *   8       8     client id of the admin request (0: none)
 *   16      8     its request id
 *   24      4     length L of the packed Config
 *   28      4     zero
 *   32      L     the packed Config (epoch = the epoch it must follow + 1)
 *   32+L    0..7  zero padding to a multiple of 8 bytes (libraft's disk
 *                 format pads entries; padding them here keeps the length
 *                 that comes back from disk equal to what was proposed)
 *
 * Applying is a compare-and-set on the epoch: a command whose epoch is not
 * the latest + 1 (planned on a state that another leader changed first)
 * changes nothing, so a configuration is never applied twice nor out of
 * order, and every replica decides the same way. Raft checksums entries.
 */
#define CTL_ENTRY_VERSION 1u
#define CTL_ENTRY_HDR     32u
#define CTL_SNAP_VERSION  1u

static void
put64le(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t
get64le(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static void
put32le(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t
get32le(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void
rdedup_put_locked(kv_controller *c, uint64_t client_id, uint64_t request_id, uint64_t epoch)
{
	struct ctl_rdedup *d = &c->rdedup[c->nextrdedup++ % CTL_DEDUP];

	d->client_id = client_id;
	d->request_id = request_id;
	d->epoch = epoch;
}

static const struct ctl_rdedup *
rdedup_find_locked(const kv_controller *c, uint64_t client_id, uint64_t request_id)
{
	for (size_t i = 0; i < CTL_DEDUP; i++)
		if (c->rdedup[i].client_id == client_id && c->rdedup[i].request_id == request_id &&
		    c->rdedup[i].epoch != 0 && c->rdedup[i].epoch <= c->nhist)
			return &c->rdedup[i];
	return NULL;
}

/* The state machine's apply (the replica's loop thread). */
static int
fsm_apply(void *arg, const uint8_t *p, size_t n)
{
	kv_controller *c = arg;
	kv_config *cfg = NULL;
	int rv;

	if (n < CTL_ENTRY_HDR || memcmp(p, "SKVE", 4) != 0 || get32le(p + 4) != CTL_ENTRY_VERSION) {
		KV_ERROR("controller", "ignored a raft entry of unknown format", "len=%zu", n);
		return KV_EPROTO;
	}
	if (get32le(p + 24) > n - CTL_ENTRY_HDR) {
		KV_ERROR("controller", "ignored a truncated raft entry", "len=%zu", n);
		return KV_EPROTO;
	}
	if ((rv = kv_admin_config_unpack(p + CTL_ENTRY_HDR, get32le(p + 24), &cfg)) != KV_OK) {
		KV_ERROR("controller", "ignored a raft entry that does not decode", "err=%s",
		         kv_errname(rv));
		return rv;
	}
	pthread_mutex_lock(&c->mu);
	if (cfg->epoch != c->nhist + 1) {
		KV_INFO("controller", "stale proposal not applied", "epoch=%llu latest=%zu",
		        (unsigned long long)cfg->epoch, c->nhist);
		kv_config_free(cfg);
		rv = KV_ESTALE;
	} else if ((rv = hist_reserve_locked(c, 1)) != KV_OK) {
		kv_config_free(cfg); /* cannot happen twice the same way on all replicas */
	} else {
		if (c->cluster_id[0] == '\0' && cfg->cluster_id != NULL)
			snprintf(c->cluster_id, sizeof(c->cluster_id), "%s", cfg->cluster_id);
		if (get64le(p + 8) != 0)
			rdedup_put_locked(c, get64le(p + 8), get64le(p + 16), cfg->epoch);
		KV_DEBUG("controller", "applied configuration", "epoch=%llu",
		         (unsigned long long)cfg->epoch);
		install_locked(c, cfg);
		rv = KV_OK;
	}
	pthread_mutex_unlock(&c->mu);
	return rv;
}

/*
 * Snapshot layout (little-endian): magic "SKVCSNAP", u32 version, u32
 * dedup entries D, u64 configurations N, then D times (u64 client id, u64
 * request id, u64 epoch), then N times (u32 length, packed Config) in epoch
 * order from 1.
 */
static int
fsm_snapshot(void *arg, uint8_t **out, size_t *len)
{
	kv_controller *c = arg;
	kv_buf *bufs = NULL;
	size_t total = 24 + CTL_DEDUP * 24 + 7, n;
	uint8_t *p, *w;
	int rv = KV_OK;

	pthread_mutex_lock(&c->mu);
	n = c->nhist;
	if ((bufs = calloc(n ? n : 1, sizeof(*bufs))) == NULL)
		rv = KV_ENOMEM;
	for (size_t i = 0; rv == KV_OK && i < n; i++) {
		rv = kv_admin_config_pack(c->hist[i], &bufs[i]);
		total += 4 + bufs[i].len;
	}
	total &= ~(size_t)7; /* a multiple of 8, like the log entries */
	if (rv == KV_OK && (p = calloc(1, total)) != NULL) {
		memcpy(p, "SKVCSNAP", 8);
		put32le(p + 8, CTL_SNAP_VERSION);
		put32le(p + 12, CTL_DEDUP);
		put64le(p + 16, n);
		w = p + 24;
		for (size_t i = 0; i < CTL_DEDUP; i++, w += 24) {
			put64le(w, c->rdedup[i].client_id);
			put64le(w + 8, c->rdedup[i].request_id);
			put64le(w + 16, c->rdedup[i].epoch);
		}
		for (size_t i = 0; i < n; i++) {
			put32le(w, (uint32_t)bufs[i].len);
			memcpy(w + 4, bufs[i].data, bufs[i].len);
			w += 4 + bufs[i].len;
		}
		*out = p;
		*len = total;
		KV_INFO("controller", "raft snapshot taken", "configs=%zu bytes=%zu", n, total);
	} else if (rv == KV_OK) {
		rv = KV_ENOMEM;
	}
	pthread_mutex_unlock(&c->mu);
	for (size_t i = 0; bufs && i < n; i++)
		kv_buf_fini(&bufs[i]);
	free(bufs);
	return rv;
}

/*
 * Restores a snapshot. The history is append-only and the same on every
 * replica, so only the configurations this replica lacks are added: the
 * ones it has stay where they are (held requests and watches point at them).
 */
static int
fsm_restore(void *arg, const uint8_t *p, size_t len)
{
	kv_controller *c = arg;
	uint64_t n;
	uint32_t nd;
	size_t off;
	kv_config **cfgs = NULL;
	int rv = KV_OK;

	if (len < 24 || memcmp(p, "SKVCSNAP", 8) != 0 || get32le(p + 8) != CTL_SNAP_VERSION)
		return KV_ECORRUPT;
	nd = get32le(p + 12);
	n = get64le(p + 16);
	if (nd > CTL_DEDUP || (len - 24) / 24 < nd || n > len)
		return KV_ECORRUPT;
	off = 24 + (size_t)nd * 24;
	if ((cfgs = calloc(n ? n : 1, sizeof(*cfgs))) == NULL)
		return KV_ENOMEM;
	for (uint64_t i = 0; i < n && rv == KV_OK; i++) {
		uint32_t l;
		if (len - off < 4 || (l = get32le(p + off)) > len - off - 4) {
			rv = KV_ECORRUPT;
			break;
		}
		rv = kv_admin_config_unpack(p + off + 4, l, &cfgs[i]);
		if (rv == KV_OK && cfgs[i]->epoch != i + 1)
			rv = KV_ECORRUPT;
		off += 4 + l;
	}
	pthread_mutex_lock(&c->mu);
	if (rv == KV_OK &&
	    (rv = hist_reserve_locked(c, n > c->nhist ? n - c->nhist : 0)) == KV_OK) {
		for (uint64_t i = c->nhist; i < n; i++) {
			install_locked(c, cfgs[i]);
			cfgs[i] = NULL;
		}
		memset(c->rdedup, 0, sizeof(c->rdedup));
		c->nextrdedup = 0;
		for (uint32_t i = 0; i < nd; i++) {
			const uint8_t *e = p + 24 + (size_t)i * 24;
			rdedup_put_locked(c, get64le(e), get64le(e + 8), get64le(e + 16));
		}
		if (c->cluster_id[0] == '\0' && c->nhist && c->hist[0]->cluster_id)
			snprintf(c->cluster_id, sizeof(c->cluster_id), "%s",
			         c->hist[0]->cluster_id);
		KV_INFO("controller", "raft snapshot restored", "epoch=%zu", c->nhist);
	}
	pthread_mutex_unlock(&c->mu);
	for (uint64_t i = 0; i < n; i++)
		kv_config_free(cfgs[i]);
	free(cfgs);
	return rv == KV_ENOMEM ? rv : (rv == KV_OK ? KV_OK : KV_ECORRUPT);
}

/* The replica's callback for a proposal or barrier (loop thread). */
static void
prop_done_cb(void *arg, int status, int result)
{
	struct ctl_prop *pr = arg;
	kv_controller *c = pr->c;

	pthread_mutex_lock(&c->mu);
	pr->status = status;
	pr->result = result;
	pr->done = true;
	pthread_cond_broadcast(&c->pcv);
	pthread_mutex_unlock(&c->mu);
}

/* Submits a barrier or (cmd != NULL) a command and waits, with mu released,
 * until the replica calls back. Returns the status; *result gets apply's. */
static int
repl_wait_locked(kv_controller *c, const kv_buf *cmd, int *result)
{
	struct ctl_prop *w = calloc(1, sizeof(*w));
	int rv;

	if (w == NULL)
		return KV_ENOMEM;
	w->c = c;
	rv = cmd ? kv_repl_submit(c->repl, cmd->data, cmd->len, prop_done_cb, w)
	         : kv_repl_barrier(c->repl, prop_done_cb, w);
	if (rv == KV_OK) {
		/* The replica always calls back, with KV_ECLOSED at shutdown. */
		while (!w->done)
			pthread_cond_wait(&c->pcv, &c->mu);
		rv = w->status;
		*result = w->result;
	}
	free(w);
	return rv;
}

/* Commits a packed configuration of epoch `epoch` through Raft (the
 * proposer thread, mu held; released while waiting). */
static int
propose_locked(kv_controller *c, const kv_buf *cfg, uint64_t epoch, char *msg, size_t msglen)
{
	kv_buf e = {0};
	int result = 0, rv;

	e.len = (CTL_ENTRY_HDR + cfg->len + 7) & ~(size_t)7;
	if (cfg->len > UINT32_MAX || (e.data = calloc(1, e.len)) == NULL)
		return KV_ENOMEM;
	memcpy(e.data, "SKVE", 4);
	put32le(e.data + 24, (uint32_t)cfg->len);
	put32le(e.data + 4, CTL_ENTRY_VERSION);
	put64le(e.data + 8, c->cur_client_id);
	put64le(e.data + 16, c->cur_req_id);
	memcpy(e.data + CTL_ENTRY_HDR, cfg->data, cfg->len);
	rv = repl_wait_locked(c, &e, &result);
	kv_buf_fini(&e);
	if (rv != KV_OK) {
		snprintf(msg, msglen,
		         "the change did not commit: %s (leadership changed; retry at the leader)",
		         kv_strerror(rv));
		return rv == KV_ECLOSED ? rv : KV_EUNAVAIL;
	}
	if (result != KV_OK || c->nhist < epoch) {
		snprintf(msg, msglen, "the configuration changed concurrently; retry");
		return KV_EBUSY;
	}
	return KV_OK;
}

/*
 * Makes `next` (taken) durable and publishes it. On error writes the reason
 * into msg; nothing changes.
 */
static int
publish_locked(kv_controller *c, kv_config *next, const char *why, char *msg, size_t msglen)
{
	const kv_config *cur = latest_locked(c);
	kv_buf buf = {0};
	int rv;

	next->epoch = cur->epoch + 1;
	next->time_ms = unix_ms();
	if (c->cluster_id[0] == '\0')
		random_cluster_id(c->cluster_id); /* replicated: the first change names it */
	if (next->cluster_id == NULL && (next->cluster_id = strdup(c->cluster_id)) == NULL) {
		rv = KV_ENOMEM;
		goto err;
	}
	if (kv_config_validate(next) != KV_OK) {
		snprintf(msg, msglen, "internal error: the planned configuration is invalid");
		KV_ERROR("controller", "planned configuration is invalid", "epoch=%llu why=%s",
		         (unsigned long long)next->epoch, why);
		rv = KV_EINTERNAL;
		goto err;
	}
	if ((rv = hist_reserve_locked(c, 1)) != KV_OK)
		goto err;
	if ((rv = kv_admin_config_pack(next, &buf)) != KV_OK)
		goto err;
	if (c->repl != NULL) {
		rv = propose_locked(c, &buf, next->epoch, msg, msglen);
		kv_buf_fini(&buf);
		if (rv == KV_OK)
			KV_INFO("controller", "committed configuration",
			        "epoch=%llu why=%s nodes=%zu ranges=%zu migrations=%zu",
			        (unsigned long long)next->epoch, why, next->nnodes, next->nranges,
			        next->nmigs);
		kv_config_free(next); /* apply installed its own copy */
		return rv;
	}
	rv = kv_clog_append(c->log, buf.data, buf.len);
	kv_buf_fini(&buf);
	if (rv != KV_OK) {
		snprintf(msg, msglen, "cannot write the config log %s: %s", kv_clog_path(c->log),
		         kv_strerror(rv));
		kv_config_free(next);
		return rv;
	}
	install_locked(c, next);
	KV_INFO("controller", "published configuration",
	        "epoch=%llu why=%s nodes=%zu ranges=%zu migrations=%zu",
	        (unsigned long long)next->epoch, why, next->nnodes, next->nranges, next->nmigs);
	return KV_OK;
err:
	if (msg[0] == '\0')
		snprintf(msg, msglen, "%s", kv_strerror(rv));
	kv_config_free(next);
	return rv;
}

/* Fills the usual answer of a command that published cfg: epoch, config and
 * the ids of the migrations it created (those not in prev). */
static void
answer_published(struct ctl_ctx *x, const kv_config *prev, const kv_config *cfg)
{
	size_t n = 0;

	x->resp.epoch = cfg->epoch;
	x->resp.config = cfg;
	free(x->migs);
	/* Out of memory: the ids are not reported (the command is done). */
	x->migs = calloc(cfg->nmigs ? cfg->nmigs : 1, sizeof(uint64_t));
	for (size_t i = 0; x->migs && i < cfg->nmigs; i++)
		if (!mig_in(prev, cfg->migs[i].id))
			x->migs[n++] = cfg->migs[i].id;
	x->resp.mig_ids = x->migs;
	x->resp.nmig_ids = n;
}

/* Holds a --wait command until its migrations finish. */
static int
hold_wait_locked(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	struct ctl_held *h;
	uint64_t now = now_ns();
	uint32_t t = rq->timeout_ms ? rq->timeout_ms : c->wait_max_ms;

	if (x->resp.nmig_ids == 0)
		return KV_OK; /* nothing moves: wait_ms 0 */
	if ((h = calloc(1, sizeof(*h))) == NULL ||
	    (h->migs = calloc(x->resp.nmig_ids, sizeof(uint64_t))) == NULL) {
		held_free(h);
		return KV_OK; /* answer at once rather than fail a done command */
	}
	h->kind = HELD_WAIT;
	h->p = x->p;
	h->request_id = rq->request_id;
	h->born_ns = now;
	h->deadline_ns = now + (uint64_t)t * 1000000u;
	h->epoch = x->resp.epoch;
	h->config = x->resp.config;
	h->node_id = x->resp.node_id;
	memcpy(h->migs, x->resp.mig_ids, x->resp.nmig_ids * sizeof(uint64_t));
	h->nmigs = x->resp.nmig_ids;
	held_push(c, h);
	x->held = true;
	pthread_cond_signal(&c->cv); /* the reaper learns the new deadline */
	return KV_OK;
}

static int
refuse(struct ctl_ctx *x, int err, const kv_place_ctx *px)
{
	snprintf(x->msg, sizeof(x->msg), "%s", px->msg[0] ? px->msg : kv_strerror(err));
	return err;
}

/* Runs a planning result: publishes it (if anything changed) and answers. */
static int
commit_locked(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x, kv_place_ctx *px, int rv,
              kv_config *next, const char *why)
{
	const kv_config *prev = latest_locked(c);

	if (rv != KV_OK)
		return refuse(x, rv, px);
	if (next == NULL) { /* nothing to change */
		x->resp.epoch = prev->epoch;
		x->resp.config = prev;
		return KV_OK;
	}
	if ((rv = publish_locked(c, next, why, x->msg, sizeof(x->msg))) != KV_OK)
		return rv;
	answer_published(x, prev, latest_locked(c));
	if (rq->wait)
		return hold_wait_locked(c, rq, x);
	return KV_OK;
}

/* ---- handlers (called with mu held) ---- */

static int
with_points(kv_controller *c, const kv_config *cur, kv_place_ctx *px, kv_place_point **pts)
{
	size_t n = 0;
	int rv = points_locked(c, cur, pts, &n);

	memset(px, 0, sizeof(*px));
	px->next_mig_id = c->next_mig_id;
	px->points = *pts;
	px->npoints = n;
	return rv;
}

static int
h_join(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = latest_locked(c);
	kv_place_point *pts = NULL;
	kv_config *next = NULL;
	kv_place_ctx px;
	uint32_t id = 0;
	int rv;

	if ((rv = with_points(c, cur, &px, &pts)) != KV_OK)
		return rv;
	rv = kv_place_join(cur, rq->address, !rq->no_rebalance, &px, &next, &id);
	free(pts);
	if (rv == KV_OK) {
		KV_INFO("controller", "node joined", "node=%u address=%s rebalance=%d", id,
		        rq->address, !rq->no_rebalance);
		x->resp.node_id = id;
	}
	return commit_locked(c, rq, x, &px, rv, next, "join");
}

static int
node_of(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x, uint32_t *id)
{
	kv_place_ctx px = {0};
	int rv = kv_place_find_node(latest_locked(c), rq->node_id, rq->address, &px, id);

	return rv == KV_OK ? KV_OK : refuse(x, rv, &px);
}

static int
h_leave(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = latest_locked(c);
	kv_place_point *pts = NULL;
	kv_config *next = NULL;
	kv_place_ctx px;
	uint32_t id;
	int rv;

	if ((rv = node_of(c, rq, x, &id)) != KV_OK)
		return rv;
	if ((rv = with_points(c, cur, &px, &pts)) != KV_OK)
		return rv;
	rv = kv_place_leave(cur, id, &px, &next);
	free(pts);
	if (rv == KV_OK)
		KV_INFO("controller", "node leaving", "node=%u", id);
	x->resp.node_id = id;
	return commit_locked(c, rq, x, &px, rv, next, "leave");
}

static int
h_move(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = latest_locked(c);
	kv_config *next = NULL;
	kv_place_ctx px = {0};
	uint32_t id;
	int rv;

	if ((rv = node_of(c, rq, x, &id)) != KV_OK)
		return rv;
	px.next_mig_id = c->next_mig_id;
	px.rate_limit_mb_s = rq->rate_mb_s;
	rv = kv_place_move(cur, rq->start, rq->end, id, &px, &next);
	if (rv == KV_OK && next != NULL) {
		char a[96], b[96];
		kv_place_fmt_key(rq->start.p, rq->start.len, a, sizeof(a));
		kv_place_fmt_key(rq->end.p, rq->end.len, b, sizeof(b));
		KV_INFO("controller", "range moving", "start=%s end=%s node=%u", a, b, id);
	}
	return commit_locked(c, rq, x, &px, rv, next, "move");
}

static int
h_rebalance(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = latest_locked(c);
	kv_place_point *pts = NULL;
	kv_config *next = NULL;
	kv_place_ctx px;
	int rv;

	if ((rv = with_points(c, cur, &px, &pts)) != KV_OK)
		return rv;
	px.rate_limit_mb_s = rq->rate_mb_s;
	rv = kv_place_rebalance(cur, &px, &next);
	free(pts);
	return commit_locked(c, rq, x, &px, rv, next, "rebalance");
}

static int
h_get_config(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = latest_locked(c);

	if (rq->epoch > cur->epoch) {
		snprintf(x->msg, sizeof(x->msg), "epoch %llu was never published (latest is %llu)",
		         (unsigned long long)rq->epoch, (unsigned long long)cur->epoch);
		return KV_ENOTFOUND;
	}
	x->resp.epoch = cur->epoch;
	x->resp.config = rq->epoch ? c->hist[rq->epoch - 1] : cur;
	return KV_OK;
}

static int
h_status(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = latest_locked(c);
	uint64_t now = now_ns();
	(void)rq;

	x->nstat = calloc(cur->nnodes ? cur->nnodes : 1, sizeof(*x->nstat));
	x->rmigs = calloc(cur->nmigs ? cur->nmigs : 1, sizeof(*x->rmigs));
	if (x->nstat == NULL || x->rmigs == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < cur->nnodes; i++) {
		const struct ctl_stat *s = stat_find_locked(c, cur->nodes[i].id, false);
		kv_admin_node_stat *n = &x->nstat[i];
		n->node_id = cur->nodes[i].id;
		/* A gone node holds nothing; its last heartbeat is history. */
		if (s == NULL || cur->nodes[i].state == KV_NODE_GONE)
			continue;
		n->keys = s->keys;
		n->bytes = s->bytes;
		n->memory = s->memory;
		n->ops = s->ops;
		n->epoch_applied = s->epoch_applied;
		n->last_seen_ms = s->last_seen_ns ? (now - s->last_seen_ns) / 1000000u : 0;
		n->nranges = s->nranges;
		n->ranges = s->ranges;
	}
	for (size_t i = 0; i < cur->nmigs; i++) {
		kv_migration *m = &x->rmigs[i];
		const struct ctl_prog *p = prog_find_locked(c, cur->migs[i].id, false);
		*m = cur->migs[i];
		if (p == NULL)
			continue;
		m->phase = p->phase ? p->phase : m->phase;
		m->keys_copied = p->keys_copied;
		m->bytes_copied = p->bytes_copied;
		m->keys_total = p->keys_total;
		m->bytes_total = p->bytes_total;
		m->rate_bytes_s = p->rate_bytes_s;
		if (p->rate_bytes_s && p->bytes_total > p->bytes_copied)
			m->eta_ms = (p->bytes_total - p->bytes_copied) * 1000u / p->rate_bytes_s;
	}
	x->report.nnodes = cur->nnodes;
	x->report.nodes = x->nstat;
	x->report.nmigs = cur->nmigs;
	x->report.migs = x->rmigs;
	x->report.address = c->listen;
	if (c->repl != NULL) {
		kv_repl_info in;
		kv_repl_get_info(c->repl, &in);
		for (size_t i = 0; i < c->npeers && i < KV_REPL_MAX_PEERS; i++) {
			kv_admin_replica *r = &x->reps[i];
			r->id = (uint32_t)i + 1;
			r->address = c->peers[i];
			if (r->id == c->self_id) {
				r->role = in.role == KV_REPL_LEADER ? KV_ADMIN_ROLE_LEADER
				                                    : KV_ADMIN_ROLE_FOLLOWER;
				r->term = in.term;
				r->index = in.applied;
			} else if (in.role == KV_REPL_LEADER && in.reachable[i]) {
				r->role = KV_ADMIN_ROLE_FOLLOWER;
				r->term = in.term; /* it accepted this term's entries */
				r->index = in.match[i];
			} else {
				r->role = KV_ADMIN_ROLE_UNKNOWN; /* not heard from lately */
				r->index = in.match[i];
			}
		}
		x->report.nreplicas = c->npeers;
		x->report.replicas = x->reps;
	}
	x->resp.report = &x->report;
	x->resp.epoch = cur->epoch;
	x->resp.config = cur;
	return KV_OK;
}

/* Ends a migration (ok or not) and publishes the result. */
static int
finish_locked(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x, uint64_t id, bool ok,
              int err, const char *detail, const char *why)
{
	const kv_config *cur = latest_locked(c);
	kv_config *next = NULL;
	kv_place_ctx px = {0};
	int rv;

	px.next_mig_id = c->next_mig_id;
	rv = kv_place_finish(cur, id, ok, &px, &next);
	if (rv != KV_OK)
		return refuse(x, rv, &px);
	if (!ok) {
		struct ctl_fail *f = &c->fails[c->nextfail++ % CTL_MAX_FAILS];
		f->id = id;
		f->err = err;
		snprintf(f->msg, sizeof(f->msg), "%s", detail);
	}
	(void)rq;
	if ((rv = publish_locked(c, next, why, x->msg, sizeof(x->msg))) != KV_OK)
		return rv;
	x->resp.epoch = latest_locked(c)->epoch;
	x->resp.config = latest_locked(c);
	return KV_OK;
}

static const kv_migration *
mig_find(const kv_config *cfg, uint64_t id)
{
	for (size_t i = 0; i < cfg->nmigs; i++)
		if (cfg->migs[i].id == id)
			return &cfg->migs[i];
	return NULL;
}

static int
h_cancel(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_migration *m = mig_find(latest_locked(c), rq->mig_id);
	const struct ctl_prog *p = prog_find_locked(c, rq->mig_id, false);

	if (m == NULL) {
		snprintf(x->msg, sizeof(x->msg), "migration %llu is not in flight",
		         (unsigned long long)rq->mig_id);
		return KV_ENOTFOUND;
	}
	if (p == NULL && c->repl != NULL) {
		/* A new leader has not heard from the source yet: the migration may
		 * be fenced already, and cancelling it then would lose writes. */
		snprintf(x->msg, sizeof(x->msg),
		         "migration %llu has not reported its progress to this leader yet; "
		         "retry in a few seconds",
		         (unsigned long long)rq->mig_id);
		return KV_EBUSY;
	}
	if (p != NULL && p->phase >= KV_MIG_FENCED) {
		snprintf(x->msg, sizeof(x->msg),
		         "migration %llu is already fenced and will complete",
		         (unsigned long long)rq->mig_id);
		return KV_EBUSY;
	}
	KV_INFO("controller", "migration cancelled", "migration=%llu",
	        (unsigned long long)rq->mig_id);
	return finish_locked(c, rq, x, rq->mig_id, false, KV_ECLOSED, "was cancelled", "cancel");
}

static int
h_register(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = latest_locked(c);
	const kv_node *n = NULL;
	struct ctl_stat *s;
	int rv;

	if (rq->cluster_id && rq->cluster_id[0] && strcmp(rq->cluster_id, c->cluster_id) != 0) {
		snprintf(
		    x->msg, sizeof(x->msg),
		    "cluster id mismatch: the server belongs to cluster %.40s, this controller "
		    "runs cluster %s",
		    rq->cluster_id, c->cluster_id);
		return KV_EINVAL;
	}
	if (rq->address == NULL || rq->address[0] == '\0') {
		snprintf(x->msg, sizeof(x->msg), "register without an address");
		return KV_EINVAL;
	}
	if (rq->node_id != 0) {
		n = kv_config_node(cur, rq->node_id);
		if (n == NULL) {
			snprintf(x->msg, sizeof(x->msg), "unknown node %u", rq->node_id);
			return KV_ENOTFOUND;
		}
		if (n->state == KV_NODE_GONE) {
			snprintf(x->msg, sizeof(x->msg),
			         "node %u has left the cluster; start it with an empty data dir "
			         "and --join",
			         n->id);
			return KV_EINVAL;
		}
		if (strcmp(n->address, rq->address) != 0) {
			kv_config *next = NULL;
			kv_place_ctx px = {0};
			uint32_t id = n->id;
			rv = kv_place_readdress(cur, id, rq->address, &px, &next);
			if (rv != KV_OK)
				return refuse(x, rv, &px);
			if ((rv = publish_locked(c, next, "readdress", x->msg, sizeof(x->msg))) !=
			    KV_OK)
				return rv;
			KV_INFO("controller", "node address changed", "node=%u address=%s", id,
			        rq->address);
			cur = latest_locked(c);
			n = kv_config_node(cur, id);
		}
	} else {
		n = kv_config_node_by_address(cur, rq->address);
	}
	if (n == NULL) {
		if (!rq->join) {
			snprintf(x->msg, sizeof(x->msg),
			         "%.200s is not a member of the cluster; start the server with "
			         "--join or run `shardkv join %.200s`",
			         rq->address, rq->address);
			return KV_ENOTFOUND;
		}
		kv_admin_req j = *rq;
		j.wait = false;
		if ((rv = h_join(c, &j, x)) != KV_OK)
			return rv;
		cur = latest_locked(c);
		n = kv_config_node(cur, x->resp.node_id);
	}
	if ((s = stat_find_locked(c, n->id, true)) != NULL) {
		s->boot_id = rq->boot_id;
		s->epoch_applied = rq->epoch;
		s->last_seen_ns = now_ns();
	}
	KV_INFO("controller", "node registered", "node=%u address=%s boot_id=%llx", n->id,
	        n->address, (unsigned long long)rq->boot_id);
	x->resp.node_id = n->id;
	x->resp.epoch = cur->epoch;
	x->resp.config = cur;
	return KV_OK;
}

static int
h_heartbeat(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = latest_locked(c);
	const kv_node *n = kv_config_node(cur, rq->node_id);
	struct ctl_stat *s;
	int rv;

	if (n == NULL || n->state == KV_NODE_GONE) {
		snprintf(x->msg, sizeof(x->msg), "node %u is not a member of the cluster",
		         rq->node_id);
		return KV_ENOTFOUND;
	}
	if ((s = stat_find_locked(c, n->id, true)) == NULL)
		return KV_ENOMEM;
	if ((rv = stat_store(s, rq)) != KV_OK)
		return rv;
	s->boot_id = rq->boot_id;
	s->epoch_applied = rq->epoch;
	s->keys = rq->keys;
	s->bytes = rq->bytes;
	s->memory = rq->memory;
	s->ops = rq->ops;
	s->last_seen_ns = now_ns();
	x->resp.epoch = cur->epoch;
	return KV_OK;
}

static int
h_progress(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_migration *m = mig_find(latest_locked(c), rq->mig_id);
	struct ctl_prog *p;

	if (m == NULL) {
		snprintf(x->msg, sizeof(x->msg), "migration %llu is not in flight",
		         (unsigned long long)rq->mig_id);
		return KV_ENOTFOUND;
	}
	if (rq->node_id != 0 && rq->node_id != m->from) {
		snprintf(x->msg, sizeof(x->msg), "node %u is not the source of migration %llu",
		         rq->node_id, (unsigned long long)rq->mig_id);
		return KV_EINVAL;
	}
	if ((p = prog_find_locked(c, m->id, true)) == NULL)
		return KV_ENOMEM;
	if (rq->phase >= KV_MIG_PENDING && rq->phase <= KV_MIG_FENCED)
		p->phase = rq->phase;
	p->keys_copied = rq->keys_copied;
	p->bytes_copied = rq->bytes_copied;
	p->keys_total = rq->keys_total;
	p->bytes_total = rq->bytes_total;
	p->rate_bytes_s = rq->rate_bytes_s;
	x->resp.epoch = latest_locked(c)->epoch;
	return KV_OK;
}

static int
h_done(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = latest_locked(c);
	const kv_migration *m = mig_find(cur, rq->mig_id);
	char detail[160];

	if (m == NULL) {
		if (rq->mig_id != 0 && rq->mig_id < c->next_mig_id) {
			x->resp.epoch = cur->epoch; /* a retried report: already finished */
			x->resp.config = cur;
			return KV_OK;
		}
		snprintf(x->msg, sizeof(x->msg), "unknown migration %llu",
		         (unsigned long long)rq->mig_id);
		return KV_ENOTFOUND;
	}
	if (rq->node_id != 0 && rq->node_id != m->from) {
		snprintf(x->msg, sizeof(x->msg), "node %u is not the source of migration %llu",
		         rq->node_id, (unsigned long long)rq->mig_id);
		return KV_EINVAL;
	}
	if (rq->result == KV_OK) {
		KV_INFO("controller", "migration done",
		        "migration=%llu from=%u to=%u keys=%llu "
		        "bytes=%llu",
		        (unsigned long long)m->id, m->from, m->to, (unsigned long long)rq->keys,
		        (unsigned long long)rq->bytes);
		return finish_locked(c, rq, x, rq->mig_id, true, KV_OK, "", "migration done");
	}
	snprintf(detail, sizeof(detail), "failed: %s%s%.120s", kv_strerror(rq->result),
	         rq->error && rq->error[0] ? ": " : "", rq->error ? rq->error : "");
	KV_WARN("controller", "migration failed", "migration=%llu from=%u to=%u err=%s",
	        (unsigned long long)m->id, m->from, m->to, kv_errname(rq->result));
	return finish_locked(c, rq, x, rq->mig_id, false, rq->result, detail, "migration failed");
}

/* Fills a watch answer from the history: the configs after known (history)
 * or the latest. Allocates *cfgs when it lists several. */
static int
watch_answer_locked(kv_controller *c, uint64_t known, bool history, uint32_t max,
                    kv_admin_resp *resp, const kv_config ***cfgs)
{
	const kv_config *cur = latest_locked(c);

	resp->epoch = cur->epoch;
	if (!history || known >= cur->epoch) {
		resp->config = cur->epoch ? cur : NULL;
		return KV_OK;
	}
	if (max == 0 || max > 1024)
		max = CTL_DEFAULT_CONFIGS;
	size_t n = (size_t)(cur->epoch - known);
	if (n > max)
		n = max;
	const kv_config **a = calloc(n, sizeof(*a));
	if (a == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < n; i++)
		a[i] = c->hist[known + i];
	resp->configs = a;
	resp->nconfigs = n;
	*cfgs = a;
	return KV_OK;
}

static int
h_watch(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = latest_locked(c);
	struct ctl_held *h;
	uint64_t now = now_ns();
	uint32_t t =
	    rq->timeout_ms && rq->timeout_ms < c->watch_max_ms ? rq->timeout_ms : c->watch_max_ms;

	if (cur->epoch > rq->epoch || c->closing)
		return watch_answer_locked(c, rq->epoch, rq->history, rq->max_configs, &x->resp,
		                           &x->cfgs);
	if ((h = calloc(1, sizeof(*h))) == NULL)
		return KV_ENOMEM;
	if (c->nwatches >= c->max_watches) {
		/* Answer the oldest watch now (as on a timeout) to make room. */
		for (struct ctl_held *o = c->held.next; o != &c->held; o = o->next)
			if (o->kind == HELD_WATCH && !o->ready) {
				o->ready = true;
				pthread_cond_signal(&c->cv);
				break;
			}
	}
	h->kind = HELD_WATCH;
	h->p = x->p;
	h->request_id = rq->request_id;
	h->born_ns = now;
	h->deadline_ns = now + (uint64_t)t * 1000000u;
	h->known = rq->epoch;
	h->history = rq->history;
	h->max_configs = rq->max_configs;
	held_push(c, h);
	pthread_cond_signal(&c->cv);
	x->held = true;
	return KV_OK;
}

/* ---- dispatch ---- */

enum {
	CTL_ADMIN = 1u << 0,   /* an operator command (SPEC §4) */
	CTL_MUTATES = 1u << 1, /* may publish a configuration */
	CTL_WAITS = 1u << 2,   /* honours AdminRequest.wait */
	CTL_SERVER = 1u << 3,  /* sent by shard servers */
	CTL_QUIET = 1u << 4,   /* frequent: log at debug level only */
};

/* The controller's commands: op, name, handler, flags. */
static const struct ctl_cmd {
	kv_admin_op op;
	const char *name;
	int (*fn)(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x);
	unsigned flags;
} ctl_cmds[] = {
    {KV_ADM_JOIN, "join", h_join, CTL_ADMIN | CTL_MUTATES | CTL_WAITS},
    {KV_ADM_LEAVE, "leave", h_leave, CTL_ADMIN | CTL_MUTATES | CTL_WAITS},
    {KV_ADM_MOVE, "move", h_move, CTL_ADMIN | CTL_MUTATES | CTL_WAITS},
    {KV_ADM_REBALANCE, "rebalance", h_rebalance, CTL_ADMIN | CTL_MUTATES | CTL_WAITS},
    {KV_ADM_GET_CONFIG, "config", h_get_config, CTL_QUIET},
    {KV_ADM_STATUS, "status", h_status, CTL_ADMIN},
    {KV_ADM_CANCEL, "cancel", h_cancel, CTL_ADMIN | CTL_MUTATES},
    {KV_ADM_REGISTER, "register", h_register, CTL_SERVER | CTL_MUTATES},
    {KV_ADM_HEARTBEAT, "heartbeat", h_heartbeat, CTL_SERVER | CTL_QUIET},
    {KV_ADM_PROGRESS, "migration-progress", h_progress, CTL_SERVER | CTL_QUIET},
    {KV_ADM_DONE, "migration-done", h_done, CTL_SERVER | CTL_MUTATES},
    {KV_ADM_WATCH, "watch", h_watch, CTL_QUIET},
};

static const struct ctl_cmd *
cmd_find(kv_admin_op op)
{
	for (size_t i = 0; i < sizeof(ctl_cmds) / sizeof(ctl_cmds[0]); i++)
		if (ctl_cmds[i].op == op)
			return &ctl_cmds[i];
	return NULL;
}

static const struct ctl_dedup *
dedup_find_locked(const kv_controller *c, uint64_t client_id, uint64_t request_id)
{
	for (size_t i = 0; i < CTL_DEDUP; i++)
		if (c->dedup[i].client_id == client_id && c->dedup[i].request_id == request_id)
			return &c->dedup[i];
	return NULL;
}

/* Keeps a copy of an answer; when out of memory the retry is simply not
 * recognised. */
static void
dedup_store_locked(kv_controller *c, uint64_t client_id, uint64_t request_id, nng_msg *reply)
{
	struct ctl_dedup *d = &c->dedup[c->nextdedup++ % CTL_DEDUP];
	void *copy = malloc(nng_msg_len(reply) ? nng_msg_len(reply) : 1);

	free(d->reply);
	memset(d, 0, sizeof(*d));
	if (copy == NULL)
		return;
	memcpy(copy, nng_msg_body(reply), nng_msg_len(reply));
	d->client_id = client_id;
	d->request_id = request_id;
	d->reply = copy;
	d->len = nng_msg_len(reply);
}

/* Answers a retry of a change that was committed through Raft (perhaps by
 * a leader that died before answering) with what the change did. */
static void
answer_rdedup_locked(kv_controller *c, const kv_admin_req *rq, const struct ctl_rdedup *d,
                     struct ctl_ctx *x)
{
	const kv_config *cfg = c->hist[d->epoch - 1];
	const kv_config *prev = d->epoch > 1 ? c->hist[d->epoch - 2] : c->empty;
	const kv_node *n = NULL;

	answer_published(x, prev, cfg);
	if (rq->op == KV_ADM_JOIN || rq->op == KV_ADM_REGISTER)
		n = rq->address ? kv_config_node_by_address(cfg, rq->address) : NULL;
	x->resp.node_id = n ? n->id : rq->node_id;
}

/*
 * Runs one decoded request with mu held: the dedup memories, the command and
 * the encoding of its answer into *reply (unless the command held it).
 * `rv` is the result of decoding and authentication so far. Returns 0 or the
 * encoding error.
 */
static int
exec_locked(kv_controller *c, const struct ctl_cmd *cmd, kv_admin_req *rq, bool authed, int rv,
            struct ctl_ctx *x, nng_msg **reply)
{
	if (rv == KV_OK && (cmd->flags & CTL_MUTATES) && rq->client_id != 0) {
		const struct ctl_dedup *d = dedup_find_locked(c, rq->client_id, rq->request_id);
		const struct ctl_rdedup *rd =
		    c->repl ? rdedup_find_locked(c, rq->client_id, rq->request_id) : NULL;
		if (d != NULL) {
			rv = nng_msg_alloc(reply, d->len) == 0 ? KV_OK : KV_ENOMEM;
			if (rv == KV_OK)
				memcpy(nng_msg_body(*reply), d->reply, d->len);
			return rv;
		}
		if (rd != NULL) {
			answer_rdedup_locked(c, rq, rd, x);
			return kv_admin_encode(&x->resp, reply);
		}
	}
	if (rv == KV_OK) {
		if (c->closing && (cmd->flags & CTL_MUTATES)) {
			snprintf(x->msg, sizeof(x->msg), "the controller is shutting down");
			rv = KV_ECLOSED;
		} else if (rq->wait && (cmd->flags & CTL_WAITS) && c->nwaits >= CTL_MAX_WAITS) {
			snprintf(x->msg, sizeof(x->msg),
			         "too many commands are waiting for migrations (%u); retry later",
			         CTL_MAX_WAITS);
			rv = KV_EBUSY;
		} else {
			if (!(cmd->flags & CTL_WAITS))
				rq->wait = false;
			c->cur_client_id = rq->client_id;
			c->cur_req_id = rq->request_id;
			rv = cmd->fn(c, rq, x);
			c->cur_client_id = c->cur_req_id = 0;
		}
		if (rv != KV_OK && !(cmd->flags & CTL_QUIET))
			KV_INFO("controller", "request refused", "cmd=%s err=%s msg=\"%s\"",
			        cmd->name, kv_errname(rv), x->msg[0] ? x->msg : kv_strerror(rv));
	}
	if (rv != KV_OK) {
		memset(&x->resp, 0, sizeof(x->resp));
		x->resp.request_id = rq->request_id;
		x->resp.epoch = authed ? latest_locked(c)->epoch : 0;
		x->resp.err = rv;
		x->resp.error = x->msg;
		x->held = false;
	}
	rv = KV_OK;
	if (!x->held)
		rv = kv_admin_encode(&x->resp, reply);
	if (!x->held && rv == KV_OK && cmd != NULL && (cmd->flags & CTL_MUTATES) && rq->client_id)
		dedup_store_locked(c, rq->client_id, rq->request_id, *reply);
	return rv;
}

static void
ctx_fini(struct ctl_ctx *x)
{
	free(x->nstat);
	free(x->rmigs);
	free(x->cfgs);
	free(x->migs);
}

/* Encodes a NOT_LEADER answer naming the leader this replica knows. */
static int
answer_not_leader(kv_controller *c, const kv_repl_info *in, uint64_t request_id, nng_msg **reply)
{
	kv_admin_resp r;

	memset(&r, 0, sizeof(r));
	r.request_id = request_id;
	r.err = KV_EUNAVAIL;
	r.error = in->leader_id ? "this controller replica is not the leader"
	                        : "no controller leader at the moment (election in progress)";
	r.epoch = kv_controller_epoch(c);
	r.not_leader = true;
	r.leader_id = in->leader_id != c->self_id ? in->leader_id : 0;
	r.leader_address = r.leader_id ? c->peers[r.leader_id - 1] : NULL;
	r.term = in->term;
	r.commit_index = in->commit_index;
	return kv_admin_encode(&r, reply);
}

static int
ctl_handle(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p)
{
	kv_controller *c = arg;
	kv_admin_req rq;
	struct ctl_ctx x;
	const struct ctl_cmd *cmd = NULL;
	bool authed;
	int rv;

	memset(&x, 0, sizeof(x));
	x.p = p;
	rv = kv_admin_decode(nng_msg_body(req), nng_msg_len(req), &rq, x.msg, sizeof(x.msg));
	/* Before anything else (the dedup memory included): a request without
	 * the secret changes nothing and learns nothing, not even the epoch.
	 * A request that did not decode carries no token to check; it is
	 * refused for that, still without the epoch. */
	authed = kv_auth_ok(&c->auth, rq.auth.p, rq.auth.len);
	if (rv == KV_OK && !authed) {
		const struct ctl_cmd *k = cmd_find(rq.op);
		kv_auth_log_refused("controller", k ? k->name : "unknown", req, rq.auth.len);
		snprintf(x.msg, sizeof(x.msg),
		         "missing or wrong auth token (this controller requires the cluster's "
		         "--auth-token-file)");
		rv = KV_EAUTH;
	}
	if (rv == KV_OK && (cmd = cmd_find(rq.op)) == NULL) {
		snprintf(x.msg, sizeof(x.msg), "unknown command %d", (int)rq.op);
		rv = KV_EINVAL;
	}
	x.resp.request_id = rq.request_id;
	/* Replicated: any replica serves configs and watches from what it has
	 * applied (never older than what it served before); everything else
	 * is the leader's, and changes go through the proposer thread. */
	if (rv == KV_OK && c->repl != NULL && rq.op != KV_ADM_WATCH) {
		kv_repl_info in;
		kv_repl_get_info(c->repl, &in);
		/* A follower serves configs it has; one it has not applied yet may
		 * exist, so only the leader may say "never published". */
		if (rq.op == KV_ADM_GET_CONFIG &&
		    (in.role == KV_REPL_LEADER || rq.epoch <= kv_controller_epoch(c)))
			goto local;
		if (in.role != KV_REPL_LEADER) {
			rv = answer_not_leader(c, &in, rq.request_id, reply);
			kv_admin_req_fini(&rq);
			return rv;
		}
		if (cmd->flags & CTL_MUTATES) {
			struct ctl_job *j = calloc(1, sizeof(*j));
			pthread_mutex_lock(&c->mu);
			if (j != NULL && !c->closing) {
				j->p = p;
				j->rq = rq;
				j->cmd = cmd;
				if (c->jobs_tail)
					c->jobs_tail->next = j;
				else
					c->jobs = j;
				c->jobs_tail = j;
				pthread_cond_broadcast(&c->pcv);
				pthread_mutex_unlock(&c->mu);
				return KV_RPC_DEFERRED;
			}
			pthread_mutex_unlock(&c->mu);
			free(j);
			snprintf(x.msg, sizeof(x.msg), "%s",
			         j ? "the controller is shutting down" : "out of memory");
			rv = j ? KV_ECLOSED : KV_ENOMEM;
		}
	}
local:
	pthread_mutex_lock(&c->mu);
	rv = exec_locked(c, cmd, &rq, authed, rv, &x, reply);
	pthread_mutex_unlock(&c->mu);
	ctx_fini(&x);
	kv_admin_req_fini(&rq);
	if (x.held)
		return KV_RPC_DEFERRED;
	return rv;
}

/*
 * The proposer thread (replicated mode): runs the mutating commands one at a
 * time, so each is planned on the state the previous one committed. On the
 * first command of a new term it first commits a barrier, so that entries a
 * previous leader left in the log are applied before anything is planned.
 */
static void *
proposer_main(void *arg)
{
	kv_controller *c = arg;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		struct ctl_job *j;
		struct ctl_ctx x;
		nng_msg *reply = NULL;
		kv_repl_info in;
		int rv = KV_OK;
		bool answered = false;

		while (c->jobs == NULL && !c->closing)
			pthread_cond_wait(&c->pcv, &c->mu);
		if ((j = c->jobs) == NULL)
			break;
		if ((c->jobs = j->next) == NULL)
			c->jobs_tail = NULL;
		memset(&x, 0, sizeof(x));
		x.p = j->p;
		x.resp.request_id = j->rq.request_id;
		kv_repl_get_info(c->repl, &in);
		if (!c->closing && in.role == KV_REPL_LEADER && c->barrier_term != in.term) {
			int res = 0;
			if (repl_wait_locked(c, NULL, &res) == KV_OK) {
				c->barrier_term = in.term;
				c->leader_since_ns = now_ns();
			}
			kv_repl_get_info(c->repl, &in);
		}
		/* Placement by data size needs the servers' heartbeats, which a
		 * new leader has only after a second: commands that place data
		 * wait for them (bounded) rather than plan on empty statistics. */
		if (!c->closing && (j->cmd->op == KV_ADM_JOIN || j->cmd->op == KV_ADM_LEAVE ||
		                    j->cmd->op == KV_ADM_REBALANCE)) {
			uint64_t ready = c->leader_since_ns + CTL_STATS_GRACE_NS;
			while (!c->closing && now_ns() < ready) {
				struct timespec ts = {.tv_sec = (time_t)(ready / 1000000000u),
				                      .tv_nsec = (long)(ready % 1000000000u)};
				pthread_cond_timedwait(&c->pcv, &c->mu, &ts);
			}
		}
		if (!c->closing && (in.role != KV_REPL_LEADER || c->barrier_term != in.term)) {
			pthread_mutex_unlock(&c->mu);
			rv = answer_not_leader(c, &in, j->rq.request_id, &reply);
			pthread_mutex_lock(&c->mu);
			answered = true;
		}
		if (!answered)
			rv = exec_locked(c, j->cmd, &j->rq, true, KV_OK, &x, &reply);
		pthread_mutex_unlock(&c->mu);
		ctx_fini(&x);
		if (!x.held)
			kv_rpc_reply(j->p, rv == KV_OK ? reply : NULL);
		kv_admin_req_fini(&j->rq);
		free(j);
		pthread_mutex_lock(&c->mu);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/* ---- the reaper: answers held requests ---- */

static void
reply_held(struct ctl_held *h, const kv_admin_resp *resp)
{
	nng_msg *m = NULL;

	if (kv_admin_encode(resp, &m) != KV_OK)
		m = NULL; /* drop: the caller times out and retries */
	kv_rpc_reply(h->p, m);
}

static void *
reaper_main(void *arg)
{
	kv_controller *c = arg;

	pthread_mutex_lock(&c->mu);
	for (;;) {
		uint64_t now = now_ns(), wake = now + 1000000000u;
		struct ctl_held *due = NULL, **tail = &due;

		for (struct ctl_held *h = c->held.next, *nx; h != &c->held; h = nx) {
			uint64_t at =
			    (h->ready || c->closing) ? h->born_ns + CTL_GRACE_NS : h->deadline_ns;
			nx = h->next;
			if (at > now) {
				if (at < wake)
					wake = at;
				continue;
			}
			held_unlink(c, h);
			h->next = NULL;
			*tail = h;
			tail = &h->next;
		}
		if (due == NULL && c->closing && c->held.next == &c->held)
			break;
		if (due != NULL) {
			/* Fill the answers under the lock (the history is read), send
			 * them without it. */
			struct ctl_ans {
				kv_admin_resp r;
				const kv_config **cfgs;
			} * ans;
			size_t n = 0, k = 0;
			for (struct ctl_held *h = due; h; h = h->next)
				n++;
			ans = calloc(n, sizeof(*ans));
			for (struct ctl_held *h = due; h && ans; h = h->next, k++) {
				kv_admin_resp *r = &ans[k].r;
				r->request_id = h->request_id;
				if (h->kind == HELD_WATCH) {
					if (watch_answer_locked(c, h->known, h->history,
					                        h->max_configs, r,
					                        &ans[k].cfgs) != KV_OK)
						r->err = KV_ENOMEM;
				} else if (!h->ready) {
					r->err = c->closing ? KV_ECLOSED : KV_ETIMEDOUT;
					r->error = c->closing
					               ? "the controller is shutting down"
					               : "timed out waiting for the migrations; "
					                 "they continue";
					r->epoch = h->epoch;
					r->config = h->config;
					r->node_id = h->node_id;
					r->mig_ids = h->migs;
					r->nmig_ids = h->nmigs;
				} else {
					r->err = h->err;
					r->error = h->error;
					r->epoch = h->epoch;
					r->config = h->config;
					r->node_id = h->node_id;
					r->mig_ids = h->migs;
					r->nmig_ids = h->nmigs;
					r->wait_ms = h->wait_ms;
				}
			}
			pthread_mutex_unlock(&c->mu);
			k = 0;
			for (struct ctl_held *h = due, *nx; h; h = nx, k++) {
				nx = h->next;
				if (ans != NULL) {
					reply_held(h, &ans[k].r);
					free(ans[k].cfgs);
				} else {
					kv_rpc_reply(h->p, NULL);
				}
				held_free(h);
			}
			free(ans);
			pthread_mutex_lock(&c->mu);
			continue;
		}
		struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000u),
		                      .tv_nsec = (long)(wake % 1000000000u)};
		pthread_cond_timedwait(&c->cv, &c->mu, &ts);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/* ---- life cycle ---- */

struct replay_ctx {
	kv_controller *c;
	int err;
};

static int
replay_cb(void *arg, const uint8_t *p, size_t n, uint64_t offset)
{
	struct replay_ctx *r = arg;
	kv_controller *c = r->c;
	kv_config *cfg;
	int rv;

	(void)offset;
	if ((rv = kv_admin_config_unpack(p, n, &cfg)) != KV_OK)
		return rv == KV_ENOMEM ? rv : KV_ECORRUPT;
	if (cfg->epoch != c->nhist + 1) {
		kv_config_free(cfg);
		return KV_ECORRUPT; /* epochs must follow each other */
	}
	if (c->nhist == c->caphist) {
		size_t cap = c->caphist ? c->caphist * 2 : 64;
		kv_config **h = realloc(c->hist, cap * sizeof(*h));
		if (h == NULL) {
			kv_config_free(cfg);
			return KV_ENOMEM;
		}
		c->hist = h;
		c->caphist = cap;
	}
	c->hist[c->nhist++] = cfg;
	for (size_t i = 0; i < cfg->nmigs; i++)
		if (cfg->migs[i].id >= c->next_mig_id)
			c->next_mig_id = cfg->migs[i].id + 1;
	return KV_OK;
}

uint64_t
kv_controller_epoch(kv_controller *c)
{
	uint64_t e;

	pthread_mutex_lock(&c->mu);
	e = latest_locked(c)->epoch;
	pthread_mutex_unlock(&c->mu);
	return e;
}

/* Renders the gauges for /metrics (on the metrics thread): reads them under
 * mu, formats with mu released. The names are part of the interface. */
static int
metrics_render(void *arg, kv_buf *out)
{
	static const char *const states[] = {"joining", "active", "draining", "gone"};
	kv_controller *c = arg;
	uint64_t nodes[5] = {0}, epoch, ranges, migs, watches, waits, uptime;
	const kv_config *cur;

	pthread_mutex_lock(&c->mu);
	cur = latest_locked(c);
	epoch = cur->epoch;
	for (size_t i = 0; i < cur->nnodes; i++)
		nodes[cur->nodes[i].state < 5 ? cur->nodes[i].state : 0]++;
	ranges = cur->nranges;
	migs = cur->nmigs;
	watches = c->nwatches;
	waits = c->nwaits;
	uptime = (now_ns() - c->started_ns) / 1000000000u;
	pthread_mutex_unlock(&c->mu);
	kv_repl_info in = {0};
	if (c->repl != NULL)
		kv_repl_get_info(c->repl, &in);

	kv_metric m[] = {
	    {"shardkv_controller_epoch", KV_METRIC_GAUGE, "Latest published configuration epoch.",
	     .u = epoch},
	    {"shardkv_controller_nodes", KV_METRIC_GAUGE, "Nodes by state.", "state", states[0],
	     .u = nodes[1]},
	    {"shardkv_controller_nodes", KV_METRIC_GAUGE, "Nodes by state.", "state", states[1],
	     .u = nodes[2]},
	    {"shardkv_controller_nodes", KV_METRIC_GAUGE, "Nodes by state.", "state", states[2],
	     .u = nodes[3]},
	    {"shardkv_controller_nodes", KV_METRIC_GAUGE, "Nodes by state.", "state", states[3],
	     .u = nodes[4]},
	    {"shardkv_controller_ranges", KV_METRIC_GAUGE, "Entries in the range map.",
	     .u = ranges},
	    {"shardkv_controller_migrations", KV_METRIC_GAUGE, "Migrations in flight.", .u = migs},
	    {"shardkv_controller_held_watches", KV_METRIC_GAUGE, "Watches held.", .u = watches},
	    {"shardkv_controller_held_waits", KV_METRIC_GAUGE, "Commands waiting for migrations.",
	     .u = waits},
	    {"shardkv_controller_uptime_seconds", KV_METRIC_GAUGE, "Seconds since start.",
	     .u = uptime},
	    {"shardkv_controller_raft_leader", KV_METRIC_GAUGE,
	     "1 when this replica is the Raft leader (replicated controllers only).",
	     .u = in.role == KV_REPL_LEADER},
	    {"shardkv_controller_raft_term", KV_METRIC_GAUGE, "Current Raft term.", .u = in.term},
	    {"shardkv_controller_raft_commit_index", KV_METRIC_GAUGE, "Raft commit index.",
	     .u = in.commit_index},
	    {"shardkv_controller_raft_applied_index", KV_METRIC_GAUGE,
	     "Raft index applied to the configuration history.", .u = in.applied},
	};
	/* A standalone controller has no Raft gauges. */
	return kv_metrics_write(out, m, sizeof(m) / sizeof(m[0]) - (c->repl ? 0 : 4));
}

int
kv_controller_raft_addr(const char *url, char *out, size_t outlen)
{
	const char *hp, *colon;
	char *end;
	unsigned long port;

	/* tls+tcp:// too: TLS is the controller's listener only; raft's own
	 * transport (raft_uv_tcp) is plain TCP either way. */
	if (url != NULL && strncmp(url, "tcp://", 6) == 0)
		hp = url + 6;
	else if (url != NULL && strncmp(url, "tls+tcp://", 10) == 0)
		hp = url + 10;
	else
		return KV_EINVAL;
	if ((colon = strrchr(hp, ':')) == NULL || colon == hp || colon[1] < '0' || colon[1] > '9' ||
	    strchr(hp, '/') != NULL)
		return KV_EINVAL; /* (strtoul would take "-5" or " 5") */
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno != 0 || *end != '\0' || port == 0 || port > 65535 - 1000)
		return KV_EINVAL;
	if ((size_t)snprintf(out, outlen, "%.*s:%lu", (int)(colon - hp), hp, port + 1000) >= outlen)
		return KV_EINVAL;
	return KV_OK;
}

/* Checks the replication flags and keeps what kv_controller_start needs to
 * start the Raft replica: the peers' controller URLs and raft addresses.
 * Its state (history, cluster id, dedup) comes from raft's snapshot and
 * log, not config.log. */
static int
repl_prepare(kv_controller *c, const kv_controller_cfg *cfg, char *err, size_t errlen)
{
	if (cfg->npeers > KV_REPL_MAX_PEERS)
		return kv_errf(err, errlen, KV_EINVAL, "--peers lists %zu controllers (at most %d)",
		               cfg->npeers, KV_REPL_MAX_PEERS);
	if (cfg->id < 1 || cfg->id > cfg->npeers)
		return kv_errf(err, errlen, KV_EINVAL, "--id %u does not index --peers (1 .. %zu)",
		               cfg->id, cfg->npeers);
	if ((c->peers = calloc(cfg->npeers, sizeof(*c->peers))) == NULL)
		return KV_ENOMEM;
	c->npeers = cfg->npeers;
	c->self_id = cfg->id;
	c->election_ms = cfg->election_ms;
	c->snapshot_threshold = cfg->snapshot_threshold;
	for (size_t i = 0; i < cfg->npeers; i++) {
		if ((c->peers[i] = strdup(cfg->peers[i])) == NULL)
			return KV_ENOMEM;
		if (cfg->raft_peers != NULL) {
			snprintf(c->raft_addr[i], sizeof(c->raft_addr[i]), "%s",
			         cfg->raft_peers[i]);
		} else if (kv_controller_raft_addr(cfg->peers[i], c->raft_addr[i],
		                                   sizeof(c->raft_addr[i])) != KV_OK) {
			return kv_errf(err, errlen, KV_EINVAL,
			               "cannot derive a raft address from peer %s (need "
			               "tcp:// or tls+tcp://HOST:PORT with PORT <= 64535, or "
			               "--raft-peers)",
			               cfg->peers[i]);
		}
	}
	if ((c->empty->cluster_id = strdup("")) == NULL)
		return KV_ENOMEM;
	if (mkdir(c->data_dir, 0755) != 0 && errno != EEXIST)
		return kv_errf(err, errlen, kv_err_from_errno(errno), "cannot create %s: %s",
		               c->data_dir, strerror(errno));
	if ((size_t)snprintf(c->raft_dir, sizeof(c->raft_dir), "%s/raft", c->data_dir) >=
	    sizeof(c->raft_dir))
		return kv_errf(err, errlen, KV_EINVAL, "--data-dir is too long");
	return KV_OK;
}

/* Starts the Raft replica (which restores its snapshot and replays its log
 * into the history) and the proposer thread. */
static int
repl_start(kv_controller *c, char *err, size_t errlen)
{
	const char *ra[KV_REPL_MAX_PEERS];
	int rv;

	for (size_t i = 0; i < c->npeers; i++)
		ra[i] = c->raft_addr[i];
	kv_repl_cfg rc = {
	    .id = c->self_id,
	    .npeers = c->npeers,
	    .raft_addrs = ra,
	    .dir = c->raft_dir,
	    .election_ms = c->election_ms,
	    .snapshot_threshold = c->snapshot_threshold,
	    .snapshot_trailing = c->snapshot_threshold ? (c->snapshot_threshold + 3) / 4 : 0,
	    .fsm = {.arg = c, .apply = fsm_apply, .snapshot = fsm_snapshot, .restore = fsm_restore},
	};
	if ((rv = kv_repl_create(&rc, &c->repl, err, errlen)) != KV_OK)
		return rv;
	if (pthread_create(&c->proposer, NULL, proposer_main, c) != 0)
		return kv_errf(err, errlen, KV_ENOMEM, "cannot start a thread");
	c->proposer_started = true;
	KV_INFO("controller", "raft replica started", "id=%u peers=%zu raft=%s dir=%s epoch=%llu",
	        c->self_id, c->npeers, ra[c->self_id - 1], c->raft_dir,
	        (unsigned long long)kv_controller_epoch(c));
	return KV_OK;
}

int
kv_controller_create(const kv_controller_cfg *cfg, kv_controller **out, char *err, size_t errlen)
{
	kv_controller *c;
	pthread_condattr_t ca;
	struct replay_ctx rc;
	kv_clog_info info;
	int rv;

	if (cfg == NULL || cfg->listen == NULL || cfg->data_dir == NULL || out == NULL) {
		snprintf(err, errlen, "--listen and --data-dir are required");
		return KV_EINVAL;
	}
	if ((c = calloc(1, sizeof(*c))) == NULL)
		return KV_ENOMEM;
	c->started_ns = now_ns();
	c->held.next = c->held.prev = &c->held;
	c->next_mig_id = 1;
	c->watch_max_ms = cfg->watch_max_ms ? cfg->watch_max_ms : 60000;
	c->wait_max_ms = cfg->wait_max_ms ? cfg->wait_max_ms : 600000;
	c->contexts = cfg->contexts ? cfg->contexts : 1024;
	c->max_watches = cfg->max_watches ? cfg->max_watches : c->contexts * 3 / 4;
	if (c->max_watches + CTL_MAX_WAITS + 16 > c->contexts)
		c->max_watches =
		    c->contexts > CTL_MAX_WAITS + 32 ? c->contexts - CTL_MAX_WAITS - 16 : 1;
	pthread_mutex_init(&c->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cv, &ca);
	pthread_cond_init(&c->pcv, &ca);
	pthread_condattr_destroy(&ca);
	if ((c->listen = strdup(cfg->listen)) == NULL ||
	    (c->data_dir = strdup(cfg->data_dir)) == NULL || (c->empty = kv_config_new()) == NULL ||
	    (cfg->metrics != NULL && (c->metrics_addr = strdup(cfg->metrics)) == NULL)) {
		rv = KV_ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto err;
	}
	if (cfg->auth_token_file != NULL) {
		bool loose = false;
		if ((rv = kv_auth_load(cfg->auth_token_file, &c->auth, &loose, err, errlen)) != 0) {
			rv = KV_EINVAL;
			goto err;
		}
		if (loose)
			KV_WARN("controller", "auth token file is accessible by group or others",
			        "file=%s hint=\"chmod 600 it\"", cfg->auth_token_file);
	}
	if (kv_tls_files_any(&cfg->tls) &&
	    (rv = kv_tls_create(&cfg->tls, true, &c->tls, err, errlen)) != KV_OK)
		goto err;
	if ((rv = kv_tls_check_url(c->tls != NULL, "--listen", c->listen, err, errlen)) != KV_OK)
		goto err;
	if (cfg->npeers > 0) {
		if ((rv = repl_prepare(c, cfg, err, errlen)) != KV_OK)
			goto err;
	} else {
		rc.c = c;
		rc.err = 0;
		rv = kv_clog_open(c->data_dir, replay_cb, &rc, &c->log, &info, err, errlen);
		if (rv != KV_OK)
			goto err;
		snprintf(c->cluster_id, sizeof(c->cluster_id), "%s", kv_clog_cluster_id(c->log));
		if ((c->empty->cluster_id = strdup(c->cluster_id)) == NULL) {
			rv = KV_ENOMEM;
			goto err;
		}
		KV_INFO("controller", "config log opened",
		        "file=%s records=%llu epoch=%zu cluster=%s created=%d dropped_bytes=%llu",
		        kv_clog_path(c->log), (unsigned long long)info.records, c->nhist,
		        c->cluster_id, info.created, (unsigned long long)info.dropped_bytes);
	}
	*out = c;
	return KV_OK;
err:
	kv_controller_destroy(c);
	return rv;
}

int
kv_controller_start(kv_controller *c, char *err, size_t errlen)
{
	int rv;

	if (c->started) {
		snprintf(err, errlen, "the controller was started before");
		return KV_EINVAL;
	}
	c->started = true;
	if (c->npeers > 0 && (rv = repl_start(c, err, errlen)) != KV_OK)
		goto err;
	if (pthread_create(&c->reaper, NULL, reaper_main, c) != 0) {
		rv = KV_ENOMEM;
		snprintf(err, errlen, "cannot start a thread");
		goto err;
	}
	c->reaper_started = true;
	kv_rpc_server_opts o = {.url = c->listen,
	                        .contexts = c->contexts,
	                        .handler = ctl_handle,
	                        .arg = c,
	                        .tls = c->tls};
	if ((rv = kv_rpc_server_create(&o, &c->rpc)) != KV_OK) {
		if (rv == KV_EADDRINUSE)
			snprintf(err, errlen, "cannot listen on %s: address in use", c->listen);
		else
			snprintf(err, errlen, "cannot listen on %s: %s", c->listen,
			         kv_strerror(rv));
		goto err;
	}
	if (c->metrics_addr && (rv = kv_metrics_create(c->metrics_addr, metrics_render, c,
	                                               &c->metrics, err, errlen)) != KV_OK)
		goto err;
	KV_INFO("controller", "listening", "address=%s epoch=%llu metrics=%s auth=%s tls=%s",
	        c->listen, (unsigned long long)kv_controller_epoch(c),
	        c->metrics_addr ? c->metrics_addr : "off", c->auth.len ? "token" : "off",
	        c->tls ? "mutual" : "off");
	return KV_OK;
err:
	kv_controller_stop(c);
	return rv;
}

void
kv_controller_stop(kv_controller *c)
{
	if (c == NULL)
		return;
	kv_metrics_destroy(c->metrics);
	c->metrics = NULL;
	pthread_mutex_lock(&c->mu);
	c->closing = true;
	pthread_cond_signal(&c->cv);
	pthread_cond_broadcast(&c->pcv);
	pthread_mutex_unlock(&c->mu);
	/* Replicated: stop raft first (a proposal in flight completes with
	 * KV_ECLOSED), then the proposer (it answers what is queued), then the
	 * reaper (it answers what the proposer held). */
	if (c->repl != NULL)
		kv_repl_stop(c->repl);
	if (c->proposer_started)
		pthread_join(c->proposer, NULL);
	c->proposer_started = false;
	if (c->reaper_started)
		pthread_join(c->reaper, NULL);
	c->reaper_started = false;
	/* Handlers still running see `closing`: they answer at once and hold
	 * nothing, so the server's wait for them is short. */
	kv_rpc_server_destroy(c->rpc);
	c->rpc = NULL;
}

void
kv_controller_destroy(kv_controller *c)
{
	if (c == NULL)
		return;
	kv_controller_stop(c);
	/* Requests held after the reaper stopped (none: closing refuses them). */
	while (c->held.next != &c->held) {
		struct ctl_held *h = c->held.next;
		held_unlink(c, h);
		held_free(h);
	}
	kv_clog_close(c->log);
	kv_repl_destroy(c->repl);
	for (size_t i = 0; i < c->npeers; i++)
		free(c->peers[i]);
	free(c->peers);
	for (size_t i = 0; i < c->nhist; i++)
		kv_config_free(c->hist[i]);
	free(c->hist);
	kv_config_free(c->empty);
	for (size_t i = 0; i < c->nstats; i++)
		stat_clear(&c->stats[i]);
	free(c->stats);
	free(c->prog);
	for (size_t i = 0; i < CTL_DEDUP; i++)
		free(c->dedup[i].reply);
	pthread_cond_destroy(&c->cv);
	pthread_cond_destroy(&c->pcv);
	pthread_mutex_destroy(&c->mu);
	free(c->listen);
	free(c->data_dir);
	free(c->metrics_addr);
	if (c->auth.data != NULL)
		memset(c->auth.data, 0, c->auth.len);
	kv_buf_fini(&c->auth);
	kv_tls_destroy(c->tls);
	free(c);
}
