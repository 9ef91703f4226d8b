/*
 * workload.c - the clients of shardkv-checker: each thread runs random
 * appends, puts, deletes, gets, (with --scans) scans of registers and
 * (with --multi) mputs and mgets on the key table
 * through its own shardkv_client handles and records every operation
 * (invocation and completion time, result). With --async N a thread also
 * keeps N single-key ops in flight through the async API (get, put and
 * delete; the library has no async append), each slot a process of its own, so that
 * the library's coalescing path runs under the checker.
 *
 * Keys live under the run's prefix: registers "<prefix>r<NNN>", group
 * registers "<prefix>m<GGG>/<i>" and append keys "<prefix>a<NNN>.<gen>".
 * Deletes and scans touch the single registers only (never a group's keys,
 * whose "absent" the mput/mget atomicity check reads as a torn mput). A
 * scan of [r<i>, r<j>) is recorded as one op per register of its range, up
 * to where its limit stopped it (filler keys it returned are left out).
 * Every value is unique: process p writes "c<p>.<seq>" (put, one per key
 * of an mput) or appends "c<p>.<seq>;" with a per-process sequence. An
 * append key rolls to its next generation once its value passes
 * CHK_ROLL_BYTES, which bounds every value (and every get) whatever the
 * duration. Memory is bounded by the operation budget (--max-ops).
 *
 * Recording takes no lock: each process (a thread's blocking calls, or one
 * async slot) appends to its own buffer, and an async slot has at most one
 * op in flight, so its buffer has one writer at a time (the callback
 * records, then frees the slot with a release store the thread acquires).
 */
#include "checker/checker.h"

#include <inttypes.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SLOT_WAIT_MS 20 /* a thread with async slots looks at them this often */

/* One process of the history: a thread's blocking calls, or an async slot. */
typedef struct {
	uint32_t id;      /* its id in the history (chk_op.client), from 1 */
	uint32_t seq;     /* last value sequence used */
	chk_op *ops;      /* its history, in order */
	size_t nops, cap; /* used and allocated */
	bool oom;         /* memory ran out */
} proc;

struct client;

/* One async slot: at most one op in flight. */
typedef struct {
	struct client *c; /* its thread */
	proc p;           /* its process */
	chk_op op;        /* the op in flight */
	atomic_bool busy; /* an op is in flight (the callback clears it) */
	uint64_t cas_seen[CHK_CAS_COUNTERS + CHK_CAS_LOCKS]; /* --cas: as client's, this
	                                                        slot's own */
} aslot;

/* One client thread. */
typedef struct client {
	struct chk_workload *w;             /* the workload */
	uint32_t idx;                       /* thread index, from 0 */
	shardkv_client *h[CHK_MAX_HANDLES]; /* its handles */
	unsigned nh;                        /* how many */
	chk_rng rng;                        /* its random stream */
	proc p;                             /* the process of its blocking calls */
	aslot *slots;                       /* o->async async slots */
	sem_t sem;                          /* posted by every async completion */
	bool sem_ok;                        /* sem is initialised */
	pthread_t thr;                      /* the thread */
	bool started;                       /* thr is running */
	chk_scan *scans;                    /* its scans (for the history file) */
	size_t nscans, capscans;            /* used and allocated */
	/* --cas: per counter, the value this client last saw (0: absent); per
	 * lock, the value it holds the lock with (0: not held) */
	uint64_t cas_seen[CHK_CAS_COUNTERS + CHK_CAS_LOCKS];
	uint64_t mk_t0; /* when its last mk_begin began (the op's invocation) */
} client;

/* The kinds of unit an op picks: a register, a group, an append slot. */
enum { U_REG, U_GROUP, U_SLOT };

struct chk_workload {
	const chk_opts *o;                 /* options */
	unsigned nreg;                     /* single registers */
	unsigned ngrp;                     /* groups */
	unsigned ncas;                     /* --cas: counters, then locks, keys [nreg, nreg+ncas) */
	unsigned nrk;                      /* registers in all: single, cas and group members */
	unsigned nslot;                    /* append keys (each with generations) */
	size_t nkeys;                      /* nrk + nslot * CHK_MAX_GEN */
	chk_key *keys;                     /* key table of the model */
	char **names;                      /* key names (NUL-terminated), per key */
	char **gname;                      /* per group: its prefix "<prefix>m<GGG>/" */
	unsigned *gfirst, *gsize;          /* per group: first key index, keys */
	uint8_t **finals;                  /* final values of append keys (owned) */
	_Atomic unsigned *gen;             /* current generation per append slot */
	atomic_bool *gsplit;               /* per group: not held by one range (no mput/mget) */
	uint64_t *gwhole;                  /* per split group: since when it looks whole (0: not) */
	chk_loose_win *loose;              /* gate leaks (driver thread; used after the run) */
	size_t nloose, caploose;           /* used and allocated */
	bool loose_all;                    /* a leak could not be kept: every group is loose */
	size_t nloose_ops;                 /* parts marked CHK_TXN_LOOSE */
	atomic_int mk_block;               /* gate: > 0 closed (driver) */
	atomic_int mk_inflight;            /* mputs and mgets in flight (clients) */
	_Atomic uint32_t hot_n;            /* hot units in hot[] */
	_Atomic uint32_t hot[CHK_MAX_HOT]; /* units the driver is moving: unit ids */
	atomic_uint_fast32_t txns;         /* multi-key op ids handed out */
	client *cl;                        /* clients */
	unsigned ncl;                      /* their number */
	atomic_bool stop;                  /* ask the clients to stop */
	atomic_size_t budget;              /* operations started so far (against max_ops) */
	atomic_uint_fast64_t ndone;        /* operations recorded */
	atomic_uint_fast64_t nfail;        /* failed operations */
	/* the counts of chk_workload_more, in its order */
	atomic_uint_fast64_t nindet, ntimeout, nmput, nmget, nskip, nasync, nhot;
	_Atomic uint64_t errs[32];        /* failed operations by -err */
	uint64_t deadline;                /* when the clients stop (ns) */
	chk_op *all;                      /* the merged history (after the run) */
	size_t nall;                      /* its length */
	chk_op *final_ops;                /* register reads of the final pass */
	size_t nfinal;                    /* their number */
	atomic_uint_fast64_t ndel, nscan; /* deletes and scans issued */
	atomic_uint_fast64_t ncasops;     /* cas operations issued */
	chk_scan *allscans;               /* every client's scans (after the run) */
	size_t nallscans;                 /* their number */
	/* The longest value a get read of each append key, the final value's
	 * stand-in when the final read fails. */
	pthread_mutex_t longest_mu; /* protects longest, longest_len, longest_t */
	bool longest_mu_ok;         /* longest_mu is initialised */
	uint8_t **longest;          /* per key: the bytes (owned) or NULL */
	size_t *longest_len;        /* per key: their length */
	uint64_t (*longest_t)[2];   /* per key: that get's invocation and completion */
};

static uint32_t
reg_key(const chk_workload *w, unsigned r)
{
	(void)w;
	return r;
}

static uint32_t
append_key(const chk_workload *w, unsigned slot, unsigned gen)
{
	return w->nrk + slot * CHK_MAX_GEN + gen;
}

/* Unit ids: [0, nreg) registers, then groups, then append slots. */
static int
unit_kind(const chk_workload *w, uint32_t u, unsigned *i)
{
	if (u < w->nreg) {
		*i = u;
		return U_REG;
	}
	if (u < w->nreg + w->ngrp) {
		*i = u - w->nreg;
		return U_GROUP;
	}
	*i = u - w->nreg - w->ngrp;
	return U_SLOT;
}

static int
open_handle(const chk_opts *o, const char *controllers, shardkv_client **out)
{
	shardkv_options so = {.timeout_ms = o->op_timeout_ms,
	                      .tls_cert = o->tls_cert,
	                      .tls_key = o->tls_key,
	                      .tls_ca = o->tls_ca};

	if (shardkv_open(controllers, &so, out) != 0) {
		fprintf(stderr, "checker: cannot open a client on %s\n", controllers);
		return -1;
	}
	return 0;
}

chk_workload *
chk_workload_create(const chk_opts *o, const char *controllers, const char *prefix)
{
	chk_workload *w = calloc(1, sizeof(*w));
	uint32_t next_proc = 1;

	if (w == NULL)
		return NULL;
	w->o = o;
	w->nslot = o->keys / 2 > 0 ? o->keys / 2 : 1;
	w->nreg = o->keys - w->nslot > 0 ? o->keys - w->nslot : 1;
	w->ngrp = o->groups;
	w->ncas = o->cas_pct ? CHK_CAS_COUNTERS + CHK_CAS_LOCKS : 0;
	w->nrk = w->nreg + w->ncas;
	w->gname = calloc(w->ngrp + 1, sizeof(*w->gname));
	w->gfirst = calloc(w->ngrp + 1, sizeof(*w->gfirst));
	w->gsize = calloc(w->ngrp + 1, sizeof(*w->gsize));
	w->gsplit = calloc(w->ngrp + 1, sizeof(*w->gsplit));
	w->gwhole = calloc(w->ngrp + 1, sizeof(*w->gwhole));
	if (!w->gname || !w->gfirst || !w->gsize || !w->gsplit || !w->gwhole)
		goto err;
	for (unsigned g = 0; g < w->ngrp; g++) {
		char buf[512];
		w->gfirst[g] = w->nrk;
		w->gsize[g] = 2 + g % 3; /* 2, 3, 4 keys */
		w->nrk += w->gsize[g];
		snprintf(buf, sizeof(buf), "%sm%03u/", prefix, g);
		if ((w->gname[g] = strdup(buf)) == NULL)
			goto err;
	}
	w->nkeys = w->nrk + (size_t)w->nslot * CHK_MAX_GEN;
	w->keys = calloc(w->nkeys, sizeof(*w->keys));
	w->names = calloc(w->nkeys, sizeof(*w->names));
	w->finals = calloc(w->nkeys, sizeof(*w->finals));
	w->gen = calloc(w->nslot, sizeof(*w->gen));
	w->ncl = o->clients;
	w->cl = calloc(w->ncl, sizeof(*w->cl));
	w->longest = calloc(w->nkeys, sizeof(*w->longest));
	w->longest_len = calloc(w->nkeys, sizeof(*w->longest_len));
	w->longest_t = calloc(w->nkeys, sizeof(*w->longest_t));
	if (!w->keys || !w->names || !w->finals || !w->gen || !w->cl || !w->longest ||
	    !w->longest_len || !w->longest_t)
		goto err;
	if (pthread_mutex_init(&w->longest_mu, NULL) != 0)
		goto err;
	w->longest_mu_ok = true;
	for (size_t k = 0; k < w->nkeys; k++) {
		char buf[512];
		if (k < w->nreg) {
			snprintf(buf, sizeof(buf), "%sr%03zu", prefix, k);
		} else if (k < w->nreg + w->ncas) { /* counters c..., locks l... */
			size_t i = k - w->nreg;
			if (i < CHK_CAS_COUNTERS)
				snprintf(buf, sizeof(buf), "%sc%03zu", prefix, i);
			else
				snprintf(buf, sizeof(buf), "%sl%03zu", prefix,
				         i - CHK_CAS_COUNTERS);
		} else if (k < w->nrk) {
			unsigned g = 0;
			while (g + 1 < w->ngrp && w->gfirst[g + 1] <= k)
				g++;
			snprintf(buf, sizeof(buf), "%s%u", w->gname[g],
			         (unsigned)(k - w->gfirst[g]));
		} else {
			snprintf(buf, sizeof(buf), "%sa%03zu.%03zu", prefix,
			         (k - w->nrk) / CHK_MAX_GEN, (k - w->nrk) % CHK_MAX_GEN);
		}
		if ((w->names[k] = strdup(buf)) == NULL)
			goto err;
		w->keys[k].name = w->names[k];
		w->keys[k].append = k >= w->nrk;
		/* Unused generations hold nothing: checked as empty. */
		w->keys[k].final_known = true;
	}
	for (unsigned i = 0; i < w->ncl; i++) {
		client *c = &w->cl[i];
		c->w = w;
		c->idx = i;
		c->rng.s = o->seed ^ (0x9e3779b97f4a7c15ull * (i + 1));
		c->p.id = next_proc++;
		c->nh = o->handles ? o->handles : 1;
		for (unsigned h = 0; h < c->nh; h++)
			if (open_handle(o, controllers, &c->h[h]) != 0)
				goto err;
		if (o->async) {
			if ((c->slots = calloc(o->async, sizeof(*c->slots))) == NULL)
				goto err;
			for (unsigned s = 0; s < o->async; s++) {
				c->slots[s].c = c;
				c->slots[s].p.id = next_proc++;
			}
			if (sem_init(&c->sem, 0, 0) != 0)
				goto err;
			c->sem_ok = true;
		}
	}
	return w;
err:
	chk_workload_destroy(w);
	return NULL;
}

int
chk_workload_fill(chk_workload *w, shardkv_client *admin, unsigned n, unsigned size)
{
	enum { BATCH = 100 };
	shardkv_bytes keys[BATCH], vals[BATCH];
	char(*kb)[600] = malloc(BATCH * sizeof(*kb));
	char *val = malloc(size + 1);
	size_t nk = w->nreg + w->ngrp + w->nslot, m = 0;
	int rv = 0;

	if (kb == NULL || val == NULL) {
		free(kb);
		free(val);
		return SHARDKV_ENOMEM;
	}
	for (unsigned i = 0; i < size; i++)
		val[i] = (char)('a' + i % 26);
	for (unsigned i = 0; i < n && rv == 0; i++) {
		uint32_t u = (uint32_t)(i % nk);
		unsigned x;
		int kl;
		/* After each register and append key; after the last key of a
		 * group ("~" sorts after its digits), never among its keys. */
		switch (unit_kind(w, u, &x)) {
		case U_REG:
			kl = snprintf(kb[m], sizeof(kb[m]), "%s/f%06u", w->names[reg_key(w, x)], i);
			break;
		case U_GROUP:
			kl = snprintf(kb[m], sizeof(kb[m]), "%s~/f%06u", w->gname[x], i);
			break;
		default:
			kl = snprintf(kb[m], sizeof(kb[m]), "%s/f%06u",
			              w->names[append_key(w, x, 0)], i);
			break;
		}
		keys[m] = (shardkv_bytes){kb[m], (size_t)kl};
		vals[m] = (shardkv_bytes){val, size};
		if (++m == BATCH || i + 1 == n) {
			shardkv_mput_result *res = NULL;
			rv = shardkv_mput(admin, m, keys, m, vals, &res);
			shardkv_mput_result_free(res);
			m = 0;
		}
	}
	free(kb);
	free(val);
	return rv;
}

/* Appends an operation to a process's history. */
static bool
record(proc *p, const chk_op *op)
{
	if (p->nops == p->cap) {
		size_t cap = p->cap ? p->cap * 2 : 1024;
		chk_op *x = realloc(p->ops, cap * sizeof(*x));
		if (x == NULL) {
			p->oom = true;
			return false;
		}
		p->ops = x;
		p->cap = cap;
	}
	p->ops[p->nops++] = *op;
	return true;
}

static void
count_failure(chk_workload *w, const chk_op *op, int err)
{
	int e = -err;
	atomic_fetch_add(&w->nfail, 1);
	atomic_fetch_add(&w->errs[e > 0 && e < 32 ? e : 0], 1);
	if (op->kind != CHK_GET)
		atomic_fetch_add(&w->nindet, 1);
	if (err == SHARDKV_ETIMEDOUT)
		atomic_fetch_add(&w->ntimeout, 1);
}

/* Keeps what a get of an append key read when it is the longest so far. */
static void
keep_longest(chk_workload *w, const chk_op *op, const void *data, size_t len)
{
	uint32_t k = op->key;

	pthread_mutex_lock(&w->longest_mu);
	if (w->longest[k] == NULL || len > w->longest_len[k]) {
		uint8_t *b = realloc(w->longest[k], len + 1);
		if (b != NULL) {
			if (len)
				memcpy(b, data, len);
			w->longest[k] = b;
			w->longest_len[k] = len;
			w->longest_t[k][0] = op->invoke;
			w->longest_t[k][1] = op->complete;
		}
	}
	pthread_mutex_unlock(&w->longest_mu);
}

/* Fills in the end of op from the call's result rv (0, ENOTFOUND or an
 * error) and, for a get or delete, the bytes read. */
static void
finish(chk_workload *w, chk_op *op, int rv, const void *data, size_t len)
{
	op->complete = chk_now_ns();
	/* A delete the library retried and the server answered from its
	 * exactly-once memory without the value (over 4096 bytes, which this
	 * workload never writes): applied, what it read unknown. Kept as
	 * indeterminate, which claims less than what happened. */
	if (op->kind == CHK_DEL && rv == 0 && data == NULL)
		rv = SHARDKV_EPROTO;
	if (op->kind == CHK_GET || op->kind == CHK_DEL) {
		if (rv == 0) {
			op->len = len;
			if (w->keys[op->key].append) {
				op->hash = chk_hash(CHK_HASH_INIT, data, len);
				keep_longest(w, op, data, len);
			} else if (!chk_parse_val(data, len, &op->val)) {
				op->status = CHK_GARBAGE;
				op->val = 0;
			}
		} else if (rv == SHARDKV_ENOTFOUND) {
			op->status = CHK_NOTFOUND;
			rv = 0;
		}
	}
	op->ret = op->complete;
	if (rv != 0) {
		op->status = CHK_FAILED;
		op->err = (int16_t)rv;
		op->complete = CHK_NEVER;
		count_failure(w, op, rv);
	}
}

/* Picks a unit of kind `want` (U_SLOT also takes a register's kind for
 * gets when want is U_REG: a register unit is a register or a group's
 * key): --hot percent of the time one the driver is moving, when there is
 * one of that kind. Returns the unit's index within its kind. */
static unsigned
pick(client *c, int want)
{
	chk_workload *w = c->w;
	unsigned n = want == U_REG ? w->nreg : want == U_GROUP ? w->ngrp : w->nslot;
	uint32_t nh = atomic_load(&w->hot_n);

	if (nh > 0 && chk_rng_below(&c->rng, 100) < w->o->hot_pct) {
		for (int tries = 0; tries < 4; tries++) {
			uint32_t u = atomic_load(&w->hot[chk_rng_below(&c->rng, nh)]);
			unsigned i;
			if (unit_kind(w, u, &i) == want) {
				atomic_fetch_add(&w->nhot, 1);
				return i;
			}
		}
	}
	return (unsigned)chk_rng_below(&c->rng, n);
}

/* A register key for a single-key op: a single register, or a key of a
 * group (as often as the group's share of the register keys). */
static uint32_t
pick_register(client *c)
{
	chk_workload *w = c->w;

	if (w->ngrp && chk_rng_below(&c->rng, w->nrk - w->ncas) >= w->nreg) {
		unsigned g = pick(c, U_GROUP);
		return w->gfirst[g] + (uint32_t)chk_rng_below(&c->rng, w->gsize[g]);
	}
	return reg_key(w, pick(c, U_REG));
}

static shardkv_client *
handle(client *c)
{
	return c->h[c->nh > 1 ? chk_rng_below(&c->rng, c->nh) : 0];
}

/* Whether a multi-key op may run on group g now; on true the caller ends
 * it with mk_end(). */
static bool
mk_begin(client *c, unsigned g)
{
	chk_workload *w = c->w;

	/* Counted in flight first, then the gate read: the driver closes the
	 * gate first, then reads the count (both sequentially consistent), so
	 * one of the two sees the other. The op's invocation time is taken
	 * before the read of gsplit, so that an op that passed it before an
	 * audit marked the group began before that mark (see loose_add). */
	atomic_fetch_add(&w->mk_inflight, 1);
	c->mk_t0 = chk_now_ns();
	if (atomic_load(&w->mk_block) > 0 || atomic_load(&w->gsplit[g])) {
		atomic_fetch_sub(&w->mk_inflight, 1);
		atomic_fetch_add(&w->nskip, 1);
		return false;
	}
	return true;
}

static void
mk_end(chk_workload *w)
{
	atomic_fetch_sub(&w->mk_inflight, 1);
}

/* An mput of fresh values to every key of group g, recorded as one op per
 * key. Returns false when recording failed. */
static bool
do_mput(client *c, unsigned g)
{
	chk_workload *w = c->w;
	unsigned n = w->gsize[g];
	shardkv_bytes keys[4], vals[4];
	char vb[4][40];
	chk_op op[4];
	shardkv_mput_result *res = NULL;
	uint32_t txn = (uint32_t)atomic_fetch_add(&w->txns, 1) + 1;

	for (unsigned i = 0; i < n; i++) {
		uint32_t k = w->gfirst[g] + i;
		op[i] = (chk_op){.client = c->p.id, .kind = CHK_PUT, .key = k, .txn = txn};
		op[i].val = chk_val_id(c->p.id, ++c->p.seq);
		int l = chk_format_val(vb[i], sizeof(vb[i]), op[i].val);
		keys[i] = (shardkv_bytes){w->names[k], strlen(w->names[k])};
		vals[i] = (shardkv_bytes){vb[i], (size_t)l};
	}
	uint64_t t0 = c->mk_t0;
	int rv = shardkv_mput(handle(c), n, keys, n, vals, &res);
	shardkv_mput_result_free(res);
	mk_end(w);
	atomic_fetch_add(&w->nmput, 1);
	for (unsigned i = 0; i < n; i++) {
		op[i].invoke = t0;
		finish(w, &op[i], rv, NULL, 0);
		if (i > 0) { /* one failure counted, equal times for all parts */
			op[i].complete = op[0].complete;
			op[i].ret = op[0].ret;
		}
		if (i > 0 && rv != 0) {
			atomic_fetch_sub(&w->nfail, 1);
			atomic_fetch_sub(&w->nindet, 1);
			atomic_fetch_sub(&w->errs[-rv > 0 && -rv < 32 ? -rv : 0], 1);
			if (rv == SHARDKV_ETIMEDOUT)
				atomic_fetch_sub(&w->ntimeout, 1);
		}
		if (!record(&c->p, &op[i]))
			return false;
	}
	return true;
}

/* An mget of every key of group g, recorded as one get per key. */
static bool
do_mget(client *c, unsigned g)
{
	chk_workload *w = c->w;
	unsigned n = w->gsize[g];
	shardkv_bytes keys[4];
	chk_op op[4];
	shardkv_mget_result *res = NULL;
	uint32_t txn = (uint32_t)atomic_fetch_add(&w->txns, 1) + 1;

	for (unsigned i = 0; i < n; i++) {
		uint32_t k = w->gfirst[g] + i;
		op[i] = (chk_op){.client = c->p.id, .kind = CHK_GET, .key = k, .txn = txn};
		keys[i] = (shardkv_bytes){w->names[k], strlen(w->names[k])};
	}
	uint64_t t0 = c->mk_t0;
	int rv = shardkv_mget(handle(c), n, keys, &res);
	mk_end(w);
	atomic_fetch_add(&w->nmget, 1);
	if ((rv == 0 || rv == SHARDKV_ENOTFOUND) && (res == NULL || res->n != n))
		rv = SHARDKV_EPROTO; /* no per-key answer: nothing to check */
	for (unsigned i = 0; i < n; i++) {
		op[i].invoke = t0;
		if (rv == 0 || rv == SHARDKV_ENOTFOUND) {
			const shardkv_buf *b = &res->values[i];
			finish(w, &op[i], b->data ? 0 : SHARDKV_ENOTFOUND, b->data, b->len);
		} else {
			finish(w, &op[i], rv, NULL, 0);
			if (i > 0) {
				atomic_fetch_sub(&w->nfail, 1);
				atomic_fetch_sub(&w->errs[-rv > 0 && -rv < 32 ? -rv : 0], 1);
				if (rv == SHARDKV_ETIMEDOUT)
					atomic_fetch_sub(&w->ntimeout, 1);
			}
		}
		if (i > 0) {
			op[i].complete = op[0].complete;
			op[i].ret = op[0].ret;
		}
	}
	shardkv_mget_result_free(res);
	for (unsigned i = 0; i < n; i++)
		if (!record(&c->p, &op[i]))
			return false;
	return true;
}

/* A delete of a single register. */
static bool
do_del(client *c)
{
	chk_workload *w = c->w;
	chk_op op = {.client = c->p.id, .kind = CHK_DEL, .key = reg_key(w, pick(c, U_REG))};
	const char *key = w->names[op.key];
	shardkv_buf old = {0};

	atomic_fetch_add(&w->ndel, 1);
	op.invoke = chk_now_ns();
	int rv = shardkv_del(handle(c), key, strlen(key), &old);
	finish(w, &op, rv, old.data, old.len);
	shardkv_free(old.data);
	return record(&c->p, &op);
}

/* Byte order of keys (a prefix first), as the servers order them. */
static int
key_order(const void *a, size_t al, const void *b, size_t bl)
{
	int cmp = memcmp(a, b, al < bl ? al : bl);

	return cmp ? cmp : (al > bl) - (al < bl);
}

/* A scan of [r<i>, r<j>) (1 to 4 single registers) with the --scan-limit,
 * recorded as one op per register up to where the limit stopped it. A
 * failed scan is counted, not recorded (a read that failed tells nothing). */
static bool
do_scan(client *c)
{
	chk_workload *w = c->w;
	unsigned i = pick(c, U_REG) % (w->nreg - 1);
	unsigned j = i + 1 + (unsigned)chk_rng_below(&c->rng, 4);
	shardkv_scan_result *res = NULL;
	uint32_t txn = (uint32_t)atomic_fetch_add(&w->txns, 1) + 1;

	if (j > w->nreg - 1)
		j = w->nreg - 1;
	const char *start = w->names[reg_key(w, i)], *end = w->names[reg_key(w, j)];
	chk_op op = {.client = c->p.id, .kind = CHK_SCAN, .txn = txn};
	atomic_fetch_add(&w->nscan, 1);
	op.invoke = chk_now_ns();
	int rv =
	    shardkv_scan(handle(c), start, strlen(start), end, strlen(end), w->o->scan_limit, &res);
	op.complete = op.ret = chk_now_ns();
	if (rv != 0) {
		count_failure(w, &op, rv);
		return true;
	}
	if (c->nscans == c->capscans) {
		size_t cap = c->capscans ? 2 * c->capscans : 256;
		chk_scan *x = realloc(c->scans, cap * sizeof(*x));
		if (x == NULL) {
			shardkv_scan_result_free(res);
			c->p.oom = true;
			return false;
		}
		c->scans = x;
		c->capscans = cap;
	}
	chk_scan *sc = &c->scans[c->nscans++];
	*sc = (chk_scan){.txn = txn, .limit = w->o->scan_limit, .start = start, .end = end};
	const shardkv_buf *last = res->more && res->n ? &res->entries[res->n - 1].key : NULL;
	size_t e = 0, parts = 0;
	for (unsigned q = i; q < j; q++) {
		const char *name = w->names[reg_key(w, q)];
		size_t nl = strlen(name);
		if (res->more && (last == NULL || key_order(name, nl, last->data, last->len) > 0))
			break; /* past where the limit stopped it */
		if (res->more)
			sc->cut = name; /* the last register it looked at */
		while (e < res->n &&
		       key_order(res->entries[e].key.data, res->entries[e].key.len, name, nl) < 0)
			e++;
		op.key = reg_key(w, q);
		op.status = CHK_OK;
		op.val = op.len = 0;
		if (e < res->n &&
		    key_order(res->entries[e].key.data, res->entries[e].key.len, name, nl) == 0) {
			const shardkv_buf *v = &res->entries[e].value;
			op.len = v->len;
			if (!chk_parse_val(v->data, v->len, &op.val)) {
				op.status = CHK_GARBAGE;
				op.val = 0;
			}
		} else {
			op.status = CHK_NOTFOUND;
		}
		if (!record(&c->p, &op)) {
			shardkv_scan_result_free(res);
			return false;
		}
		parts++;
	}
	if (parts == 0) /* cut before its first key: not in the history */
		c->nscans--;
	else
		atomic_fetch_add(&w->budget, parts - 1);
	shardkv_scan_result_free(res);
	return true;
}

/*
 * A compare-and-set (--cas): on a counter, from the value this process last
 * saw (absent: if absent) to a new one, learning the current value when
 * refused; on a lock, take it (put if absent) when this process does not
 * hold it, else release it (delete if equal to the value it holds it
 * with). A take of unknown outcome is released next, refused when it was
 * not applied. `seen` is the process's: per counter the value it last saw,
 * per lock the value it holds it with (0: absent, not held).
 *
 * cas_begin fills op (key i of the cas keys) and the spellings of its
 * expected and new values; cas_end takes the call's result (rv, and on a
 * refusal the current value, NULL when absent).
 */
typedef struct {
	char ev[40], nv[40]; /* the expected and the new value, spelled */
	int ne, nn;          /* their lengths (0: absent) */
} cas_args;

static void
cas_begin(chk_workload *w, proc *p, const uint64_t *seen, unsigned i, chk_op *op, cas_args *a)
{
	bool lock = i >= CHK_CAS_COUNTERS;

	*op = (chk_op){.client = p->id, .kind = CHK_CAS, .key = w->nreg + i};
	op->hash = seen[i];
	op->val = lock && op->hash ? 0 : chk_val_id(p->id, ++p->seq);
	a->ne = op->hash ? chk_format_val(a->ev, sizeof(a->ev), op->hash) : 0;
	a->nn = op->val ? chk_format_val(a->nv, sizeof(a->nv), op->val) : 0;
	atomic_fetch_add(&w->ncasops, 1);
}

static void
cas_end(chk_workload *w, uint64_t *seen, chk_op *op, int rv, const void *cur, size_t curlen)
{
	unsigned i = op->key - w->nreg;
	bool lock = i >= CHK_CAS_COUNTERS;

	op->complete = op->ret = chk_now_ns();
	if (rv == 0) {
		seen[i] = op->val; /* a lock: held with it, or released (0) */
	} else if (rv == SHARDKV_EEXISTS || rv == SHARDKV_EMISMATCH) {
		op->status = CHK_MISMATCH;
		if (cur == NULL) {
			op->len = 0;
		} else if (!chk_parse_val(cur, curlen, &op->len)) {
			/* Bytes no write made: an identity nobody wrote, which the
			 * model reports as never written. */
			op->len = chk_val_id(UINT32_MAX, UINT32_MAX);
		}
		if (!lock)
			seen[i] = op->len;
		else if (op->val == 0)
			seen[i] = 0; /* not held (a take of unknown outcome) */
	} else {
		op->status = CHK_FAILED;
		op->err = (int16_t)rv;
		op->complete = CHK_NEVER;
		count_failure(w, op, rv);
		if (lock && op->val)
			seen[i] = op->val; /* maybe held: released (or refused) next */
	}
}

/* Starts a cas with the handle: blocking (done NULL, the result in *cur)
 * or async. Returns the call's result. */
static int
cas_call(shardkv_client *h, const char *key, const chk_op *op, const cas_args *a, shardkv_buf *cur,
         shardkv_done_fn done, void *arg)
{
	if (op->val == 0)
		return done ? shardkv_del_if_equal_async(h, key, strlen(key), a->ev, (size_t)a->ne,
		                                         done, arg)
		            : shardkv_del_if_equal(h, key, strlen(key), a->ev, (size_t)a->ne, cur);
	shardkv_put_options po = {.if_absent = op->hash == 0,
	                          .if_equal = op->hash != 0,
	                          .expect = {a->ev, (size_t)a->ne}};
	return done
	           ? shardkv_put_ex_async(h, key, strlen(key), a->nv, (size_t)a->nn, &po, done, arg)
	           : shardkv_put_ex(h, key, strlen(key), a->nv, (size_t)a->nn, &po, cur);
}

static bool
do_cas(client *c)
{
	chk_workload *w = c->w;
	unsigned i = (unsigned)chk_rng_below(&c->rng, w->ncas);
	shardkv_buf cur = {0};
	cas_args a;
	chk_op op;

	cas_begin(w, &c->p, c->cas_seen, i, &op, &a);
	op.invoke = chk_now_ns();
	int rv = cas_call(handle(c), w->names[op.key], &op, &a, &cur, NULL, NULL);
	cas_end(w, c->cas_seen, &op, rv, cur.data, cur.len);
	shardkv_free(cur.data);
	return record(&c->p, &op);
}

/* One random blocking operation; returns false to stop. */
static bool
one_op(client *c)
{
	chk_workload *w = c->w;
	uint64_t r = chk_rng_below(&c->rng, 100);
	chk_op op = {.client = c->p.id};
	char val[40];
	int rv;

	if (w->o->scan_pct && w->nreg > 1 && chk_rng_below(&c->rng, 100) < w->o->scan_pct)
		return do_scan(c);
	if (w->o->del_pct && chk_rng_below(&c->rng, 100) < w->o->del_pct)
		return do_del(c);
	if (w->ncas && chk_rng_below(&c->rng, 100) < w->o->cas_pct)
		return do_cas(c);

	if (w->ngrp && r >= 42 && r < 70) { /* mput or mget of a group */
		unsigned g = pick(c, U_GROUP);
		if (mk_begin(c, g)) {
			/* One op of the budget was taken; its other parts too. */
			atomic_fetch_add(&w->budget, w->gsize[g] - 1);
			return r < 55 ? do_mput(c, g) : do_mget(c, g);
		}
		r = r < 55 ? 40 : 75; /* the gate is closed: a single put or get */
	}
	if (r < 30) { /* append */
		unsigned slot = pick(c, U_SLOT);
		unsigned g = atomic_load(&w->gen[slot]);
		const char *key = w->names[append_key(w, slot, g)];
		uint64_t nl = 0;
		op.kind = CHK_APPEND;
		op.key = append_key(w, slot, g);
		op.val = chk_val_id(c->p.id, ++c->p.seq);
		int n = chk_format_val(val, sizeof(val) - 1, op.val);
		val[n++] = ';';
		op.invoke = chk_now_ns();
		rv = shardkv_append(handle(c), key, strlen(key), val, (size_t)n, &nl);
		finish(w, &op, rv, NULL, 0);
		if (rv == 0) {
			op.len = nl;
			if (nl > CHK_ROLL_BYTES && g + 1 < CHK_MAX_GEN)
				atomic_compare_exchange_strong(&w->gen[slot], &g, g + 1);
		}
	} else if (r < 55) { /* put */
		op.kind = CHK_PUT;
		op.key = pick_register(c);
		op.val = chk_val_id(c->p.id, ++c->p.seq);
		const char *key = w->names[op.key];
		int n = chk_format_val(val, sizeof(val), op.val);
		op.invoke = chk_now_ns();
		rv = shardkv_put(handle(c), key, strlen(key), val, (size_t)n);
		finish(w, &op, rv, NULL, 0);
	} else { /* get: registers mostly, append keys sometimes */
		shardkv_buf b = {0};
		if (r >= 85) {
			unsigned slot = pick(c, U_SLOT);
			op.key = append_key(w, slot, atomic_load(&w->gen[slot]));
		} else {
			op.key = pick_register(c);
		}
		const char *key = w->names[op.key];
		op.kind = CHK_GET;
		op.invoke = chk_now_ns();
		rv = shardkv_get(handle(c), key, strlen(key), &b);
		finish(w, &op, rv, b.data, b.len);
		shardkv_free(b.data);
	}
	return record(&c->p, &op);
}

/* The callback of an async slot's op (a library thread). */
static void
slot_done(void *arg, int status, const void *val, size_t vlen)
{
	aslot *s = arg;
	client *c = s->c;

	if (s->op.kind == CHK_CAS)
		cas_end(c->w, s->cas_seen, &s->op, status, val, vlen);
	else
		finish(c->w, &s->op, status, val, vlen);
	record(&s->p, &s->op);
	atomic_fetch_add(&c->w->ndone, 1);
	atomic_store_explicit(&s->busy, false, memory_order_release);
	sem_post(&c->sem);
}

/* Starts the next op of a free slot: a put, delete or get of a register,
 * or a get of an append key. */
static void
slot_start(client *c, aslot *s)
{
	chk_workload *w = c->w;
	uint64_t r = chk_rng_below(&c->rng, 100);
	char val[40];
	int rv;

	s->op = (chk_op){.client = s->p.id};
	if (w->ncas && chk_rng_below(&c->rng, 100) < w->o->cas_pct) {
		/* A cas of the slot's own: its own idea of the values. */
		cas_args a;
		unsigned i = (unsigned)chk_rng_below(&c->rng, w->ncas);
		cas_begin(w, &s->p, s->cas_seen, i, &s->op, &a);
		atomic_store(&s->busy, true);
		atomic_fetch_add(&w->nasync, 1);
		s->op.invoke = chk_now_ns();
		rv = cas_call(handle(c), w->names[s->op.key], &s->op, &a, NULL, slot_done, s);
		if (rv != 0) /* not taken: the callback will not run */
			slot_done(s, rv, NULL, 0);
		return;
	}
	if (w->o->del_pct && chk_rng_below(&c->rng, 100) < w->o->del_pct) {
		s->op.kind = CHK_DEL;
		s->op.key = reg_key(w, pick(c, U_REG));
		atomic_fetch_add(&w->ndel, 1);
	} else if (r < 40) {
		s->op.kind = CHK_PUT;
		s->op.key = pick_register(c);
		s->op.val = chk_val_id(s->p.id, ++s->p.seq);
	} else {
		s->op.kind = CHK_GET;
		if (r >= 85) {
			unsigned slot = pick(c, U_SLOT);
			s->op.key = append_key(w, slot, atomic_load(&w->gen[slot]));
		} else {
			s->op.key = pick_register(c);
		}
	}
	const char *key = w->names[s->op.key];
	atomic_store(&s->busy, true);
	atomic_fetch_add(&w->nasync, 1);
	s->op.invoke = chk_now_ns();
	if (s->op.kind == CHK_PUT) {
		int n = chk_format_val(val, sizeof(val), s->op.val);
		rv = shardkv_put_async(handle(c), key, strlen(key), val, (size_t)n, slot_done, s);
	} else if (s->op.kind == CHK_DEL) {
		rv = shardkv_del_async(handle(c), key, strlen(key), slot_done, s);
	} else {
		rv = shardkv_get_async(handle(c), key, strlen(key), slot_done, s);
	}
	if (rv != 0) /* not taken: the callback will not run */
		slot_done(s, rv, NULL, 0);
}

static bool
may_start(chk_workload *w)
{
	if (atomic_load(&w->stop) || chk_stop_requested || chk_now_ns() >= w->deadline)
		return false;
	return atomic_fetch_add(&w->budget, 1) < w->o->max_ops;
}

static void *
client_main(void *arg)
{
	client *c = arg;
	chk_workload *w = c->w;
	unsigned na = w->o->async;
	bool go = true;

	while (go) {
		/* Refill the free async slots, then one blocking op half the
		 * time, else wait for a completion. */
		for (unsigned i = 0; i < na && go; i++) {
			aslot *s = &c->slots[i];
			if (atomic_load_explicit(&s->busy, memory_order_acquire) || s->p.oom)
				continue;
			if ((go = may_start(w)))
				slot_start(c, s);
		}
		if (!go)
			break;
		if (na == 0 || chk_rng_below(&c->rng, 2) == 0) {
			if (!(go = may_start(w)))
				break;
			if (!(go = one_op(c)))
				break;
			atomic_fetch_add(&w->ndone, 1);
		} else {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += SLOT_WAIT_MS * 1000000L;
			if (ts.tv_nsec >= 1000000000L) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000L;
			}
			sem_timedwait(&c->sem, &ts);
		}
	}
	/* Wait for the slots in flight (each ends by its deadline). */
	for (unsigned i = 0; i < na; i++)
		while (atomic_load_explicit(&c->slots[i].busy, memory_order_acquire)) {
			struct timespec ts = {0, 2000000};
			nanosleep(&ts, NULL);
		}
	return NULL;
}

int
chk_workload_start(chk_workload *w, uint64_t deadline_ns)
{
	w->deadline = deadline_ns;
	for (unsigned i = 0; i < w->ncl; i++) {
		if (pthread_create(&w->cl[i].thr, NULL, client_main, &w->cl[i]) != 0) {
			chk_workload_stop(w);
			return -1;
		}
		w->cl[i].started = true;
	}
	return 0;
}

void
chk_workload_stop(chk_workload *w)
{
	atomic_store(&w->stop, true);
	for (unsigned i = 0; i < w->ncl; i++)
		if (w->cl[i].started) {
			pthread_join(w->cl[i].thr, NULL);
			w->cl[i].started = false;
			bool oom = w->cl[i].p.oom;
			for (unsigned s = 0; s < w->o->async; s++)
				oom |= w->cl[i].slots[s].p.oom;
			if (oom)
				fprintf(stderr, "checker: client %u ran out of memory\n",
				        w->cl[i].idx + 1);
		}
}

void
chk_workload_counts(chk_workload *w, uint64_t *ops, uint64_t *failed)
{
	*ops = atomic_load(&w->ndone);
	*failed = atomic_load(&w->nfail);
}

void
chk_workload_more_counts(chk_workload *w, chk_workload_more *out)
{
	*out = (chk_workload_more){.indeterminate = atomic_load(&w->nindet),
	                           .timeouts = atomic_load(&w->ntimeout),
	                           .mputs = atomic_load(&w->nmput),
	                           .mgets = atomic_load(&w->nmget),
	                           .mk_skipped = atomic_load(&w->nskip),
	                           .mk_loose = w->nloose_ops,
	                           .async_ops = atomic_load(&w->nasync),
	                           .hot_ops = atomic_load(&w->nhot),
	                           .dels = atomic_load(&w->ndel),
	                           .cas = atomic_load(&w->ncasops),
	                           .scans = atomic_load(&w->nscan)};
}

const uint64_t *
chk_workload_errors(chk_workload *w)
{
	return (const uint64_t *)w->errs;
}

bool
chk_workload_mk_block(chk_workload *w, unsigned ms)
{
	uint64_t until = chk_now_ns() + (uint64_t)ms * 1000000u;

	atomic_fetch_add(&w->mk_block, 1);
	while (atomic_load(&w->mk_inflight) > 0) {
		if (chk_now_ns() >= until)
			return false;
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	return true;
}

void
chk_workload_mk_unblock(chk_workload *w)
{
	atomic_fetch_sub(&w->mk_block, 1);
}

bool
chk_workload_mk_blocked(chk_workload *w)
{
	return atomic_load(&w->mk_block) > 0;
}

/* Whether group g lies in one range of cfg and no migration of cfg takes
 * part of it only (pieces of a group moving from different nodes). */
static bool
group_whole(const chk_workload *w, unsigned g, const shardkv_config *cfg)
{
	const char *a = w->names[w->gfirst[g]], *b = w->names[w->gfirst[g] + w->gsize[g] - 1];
	size_t ra = chk_config_range(cfg, a, strlen(a)), rb = chk_config_range(cfg, b, strlen(b));

	if (ra != rb || ra == SIZE_MAX)
		return false;
	for (size_t m = 0; m < cfg->nmigrations; m++) {
		const shardkv_migration *x = &cfg->migrations[m];
		bool ia = chk_in_range(a, strlen(a), x->start.data, x->start.len, x->end.data,
		                       x->end.len);
		bool ib = chk_in_range(b, strlen(b), x->start.data, x->start.len, x->end.data,
		                       x->end.len);
		if (ia != ib)
			return false;
	}
	return true;
}

/* Keeps a gate leak of group g over [from, to]. */
static void
loose_add(chk_workload *w, unsigned g, uint64_t from, uint64_t to)
{
	if (w->nloose == w->caploose) {
		size_t cap = w->caploose ? 2 * w->caploose : 16;
		chk_loose_win *x = realloc(w->loose, cap * sizeof(*x));
		if (x == NULL) {
			w->loose_all = true; /* not kept: no mput or mget counts as atomic */
			return;
		}
		w->loose = x;
		w->caploose = cap;
	}
	w->loose[w->nloose++] = (chk_loose_win){w->gfirst[g], w->gsize[g], from, to};
}

size_t
chk_workload_mk_audit(chk_workload *w, const shardkv_config *cfg, bool gated, uint64_t since)
{
	uint64_t now = chk_now_ns();
	size_t leaks = 0;

	for (unsigned g = 0; g < w->ngrp; g++) {
		bool split = !group_whole(w, g, cfg);
		bool was = atomic_load(&w->gsplit[g]);
		bool leak = split && !was && !gated;
		if (leak) {
			leaks++;
			chk_log("group %s was split (epoch %" PRIu64
			        ") while mputs could run: its mputs and mgets in flight since the "
			        "last configuration read are not atomic",
			        w->gname[g], cfg->epoch);
		}
		if (split) {
			w->gwhole[g] = 0;
			if (!was) {
				atomic_store(&w->gsplit[g], true);
				if (w->o->verbose)
					chk_log("group %s split at epoch %" PRIu64 ": no mput/mget",
					        w->gname[g], cfg->epoch);
			}
			/* An op that passed mk_begin before the store above took
			 * its invocation time before it: every one began by now. */
			if (leak)
				loose_add(w, g,
				          since > CHK_LOOSE_MARGIN_NS ? since - CHK_LOOSE_MARGIN_NS
				                                      : 0,
				          chk_now_ns());
			continue;
		}
		if (!was)
			continue;
		/* Whole again: mputs resume after a grace period, so that the
		 * clients' cached configurations, which may still split it
		 * across nodes, have caught up. */
		if (w->gwhole[g] == 0)
			w->gwhole[g] = now;
		if (now - w->gwhole[g] >= (uint64_t)CHK_WHOLE_GRACE_MS * 1000000u) {
			atomic_store(&w->gsplit[g], false);
			w->gwhole[g] = 0;
			if (w->o->verbose)
				chk_log("group %s whole again at epoch %" PRIu64, w->gname[g],
				        cfg->epoch);
		}
	}
	return leaks;
}

/* Whether key lies in [start, end) (end empty: no end). */
void
chk_workload_hot_add(chk_workload *w, const void *start, size_t sl, const void *end, size_t el)
{
	uint32_t n = atomic_load(&w->hot_n), nu = w->nreg + w->ngrp + w->nslot;

	for (uint32_t u = 0; u < nu && n < CHK_MAX_HOT; u++) {
		unsigned i;
		const char *name;
		switch (unit_kind(w, u, &i)) {
		case U_REG:
			name = w->names[reg_key(w, i)];
			break;
		case U_GROUP:
			name = w->names[w->gfirst[i]];
			break;
		default:
			name = w->names[append_key(w, i, atomic_load(&w->gen[i]))];
			break;
		}
		if (!chk_in_range(name, strlen(name), start, sl, end, el))
			continue;
		atomic_store(&w->hot[n], u);
		atomic_store(&w->hot_n, ++n);
	}
}

void
chk_workload_hot_clear(chk_workload *w)
{
	atomic_store(&w->hot_n, 0);
}

bool
chk_workload_hot_any(chk_workload *w)
{
	return atomic_load(&w->hot_n) > 0;
}

static int
str_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char **
chk_workload_boundaries(chk_workload *w, size_t *n)
{
	const char **b = malloc((w->nreg + w->ncas + w->ngrp + w->nslot + 1) * sizeof(*b));
	size_t m = 0;

	if (b == NULL) {
		*n = 0;
		return NULL;
	}
	for (unsigned r = 0; r < w->nreg; r++)
		b[m++] = w->names[reg_key(w, r)];
	for (unsigned i = 0; i < w->ncas; i++)
		b[m++] = w->names[w->nreg + i];
	for (unsigned g = 0; g < w->ngrp; g++)
		b[m++] = w->gname[g];
	for (unsigned s = 0; s < w->nslot; s++)
		b[m++] = w->names[append_key(w, s, atomic_load(&w->gen[s]))];
	qsort(b, m, sizeof(*b), str_cmp);
	*n = m;
	return b;
}

/* Reads one key. Returns 0, SHARDKV_ENOTFOUND or an error. */
static int
read_once(shardkv_client *cl, const char *key, shardkv_buf *out, uint64_t *t_inv, uint64_t *t_done)
{
	*t_inv = chk_now_ns();
	int rv = shardkv_get(cl, key, strlen(key), out);
	*t_done = chk_now_ns();
	return rv;
}

/* Reads register r (once) into the final history. Returns true when done. */
static bool
final_read_register(chk_workload *w, shardkv_client *admin, unsigned r)
{
	shardkv_buf b = {0};
	chk_op op = {.kind = CHK_GET, .key = reg_key(w, r), .client = 0};
	int rv = read_once(admin, w->names[op.key], &b, &op.invoke, &op.complete);

	if (rv == SHARDKV_ENOTFOUND) {
		op.status = CHK_NOTFOUND;
	} else if (rv == 0) {
		op.len = b.len;
		if (!chk_parse_val(b.data, b.len, &op.val))
			op.status = CHK_GARBAGE;
		shardkv_free(b.data);
	} else {
		chk_log("final read of %s failed (%s: %s)", w->names[op.key], shardkv_strerror(rv),
		        shardkv_errmsg());
		return false;
	}
	op.ret = op.complete;
	w->final_ops[w->nfinal++] = op;
	return true;
}

/* Reads append key k (once) as its final value. Returns true when done. */
static bool
final_read_append(chk_workload *w, shardkv_client *admin, uint32_t k)
{
	shardkv_buf b = {0};
	uint64_t t1, t2;
	int rv = read_once(admin, w->names[k], &b, &t1, &t2);
	chk_key *key = &w->keys[k];

	key->final_invoke = t1;
	key->final_complete = t2;
	if (rv == 0) {
		w->finals[k] = b.data;
		key->final = b.data;
		key->final_len = b.len;
		key->final_found = true;
	} else if (rv != SHARDKV_ENOTFOUND) {
		chk_log("final read of %s failed (%s: %s)", w->names[k], shardkv_strerror(rv),
		        shardkv_errmsg());
		return false;
	}
	key->final_known = true;
	return true;
}

size_t
chk_workload_final_reads(chk_workload *w, shardkv_client *admin, unsigned ms)
{
	uint64_t deadline = chk_now_ns() + (uint64_t)ms * 1000000u;
	size_t pending = 0;
	bool *done = calloc(w->nkeys, sizeof(*done));

	w->final_ops = calloc(w->nrk + 1, sizeof(*w->final_ops));
	if (done == NULL || w->final_ops == NULL) {
		free(done);
		return w->nkeys;
	}
	/* Keys never used need no read; the others are unknown until read. */
	for (size_t k = w->nrk; k < w->nkeys; k++) {
		unsigned slot = (unsigned)((k - w->nrk) / CHK_MAX_GEN);
		unsigned g = (unsigned)((k - w->nrk) % CHK_MAX_GEN);
		done[k] = g > atomic_load(&w->gen[slot]);
		w->keys[k].final_known = done[k];
	}
	/* Rounds over the keys not read yet, so that one unavailable range
	 * does not starve the others. */
	for (int round = 0;; round++) {
		pending = 0;
		for (size_t k = 0; k < w->nkeys; k++) {
			if (done[k])
				continue;
			if (chk_now_ns() >= deadline) {
				pending++;
				continue;
			}
			done[k] = k < w->nrk ? final_read_register(w, admin, (unsigned)k)
			                     : final_read_append(w, admin, (uint32_t)k);
			pending += !done[k];
		}
		if (pending == 0 || chk_now_ns() >= deadline)
			break;
		if (round == 0)
			chk_log("%zu keys could not be read; retrying", pending);
		struct timespec ts = {0, 200000000};
		nanosleep(&ts, NULL);
	}
	/* An append key not read back is checked against its longest read. */
	for (size_t k = w->nrk; k < w->nkeys; k++) {
		if (done[k] || w->longest[k] == NULL)
			continue;
		chk_key *key = &w->keys[k];
		key->final = w->longest[k];
		key->final_len = w->longest_len[k];
		key->final_found = key->final_known = key->final_partial = true;
		key->final_invoke = w->longest_t[k][0];
		key->final_complete = w->longest_t[k][1];
	}
	free(done);
	return pending;
}

/* Moves a process's history into w->all. */
static void
take(chk_workload *w, proc *p)
{
	if (p->nops)
		memcpy(w->all + w->nall, p->ops, p->nops * sizeof(*w->all));
	w->nall += p->nops;
	free(p->ops);
	p->ops = NULL;
	p->nops = 0;
}

void
chk_workload_history(chk_workload *w, const chk_key **keys, size_t *nkeys, const chk_op **ops,
                     size_t *nops)
{
	if (w->all == NULL) {
		size_t n = w->nfinal;
		for (unsigned i = 0; i < w->ncl; i++) {
			n += w->cl[i].p.nops;
			for (unsigned s = 0; s < w->o->async; s++)
				n += w->cl[i].slots[s].p.nops;
		}
		w->all = malloc((n + 1) * sizeof(*w->all));
		if (w->all != NULL) {
			for (unsigned i = 0; i < w->ncl; i++) {
				take(w, &w->cl[i].p);
				for (unsigned s = 0; s < w->o->async; s++)
					take(w, &w->cl[i].slots[s].p);
			}
			if (w->nfinal)
				memcpy(w->all + w->nall, w->final_ops, w->nfinal * sizeof(*w->all));
			w->nall += w->nfinal;
			/* A leak that could not be kept: every mput and mget. */
			chk_loose_win all = {0, UINT32_MAX, 0, UINT64_MAX};
			w->nloose_ops = w->loose_all
			                    ? chk_loosen(w->all, w->nall, &all, 1)
			                    : chk_loosen(w->all, w->nall, w->loose, w->nloose);
		}
	}
	*keys = w->keys;
	*nkeys = w->nkeys;
	*ops = w->all;
	*nops = w->nall;
}

void
chk_workload_scans(chk_workload *w, const chk_scan **scans, size_t *n)
{
	if (w->allscans == NULL) {
		size_t m = 0;
		for (unsigned i = 0; i < w->ncl; i++)
			m += w->cl[i].nscans;
		w->allscans = malloc((m + 1) * sizeof(*w->allscans));
		for (unsigned i = 0; w->allscans && i < w->ncl; i++) {
			if (w->cl[i].nscans)
				memcpy(w->allscans + w->nallscans, w->cl[i].scans,
				       w->cl[i].nscans * sizeof(*w->allscans));
			w->nallscans += w->cl[i].nscans;
		}
	}
	*scans = w->allscans;
	*n = w->allscans ? w->nallscans : 0;
}

void
chk_workload_destroy(chk_workload *w)
{
	if (w == NULL)
		return;
	chk_workload_stop(w);
	for (unsigned i = 0; w->cl && i < w->ncl; i++) {
		client *c = &w->cl[i];
		for (unsigned h = 0; h < c->nh; h++)
			shardkv_close(c->h[h]);
		free(c->p.ops);
		for (unsigned s = 0; c->slots && s < w->o->async; s++)
			free(c->slots[s].p.ops);
		free(c->slots);
		free(c->scans);
		if (c->sem_ok)
			sem_destroy(&c->sem);
	}
	for (size_t k = 0; k < w->nkeys; k++) {
		if (w->names)
			free(w->names[k]);
		if (w->finals)
			shardkv_free(w->finals[k]);
		if (w->longest)
			free(w->longest[k]);
	}
	free(w->longest);
	free(w->longest_len);
	free(w->longest_t);
	free(w->allscans);
	if (w->longest_mu_ok)
		pthread_mutex_destroy(&w->longest_mu);
	for (unsigned g = 0; w->gname && g < w->ngrp; g++)
		free(w->gname[g]);
	free(w->gname);
	free(w->gfirst);
	free(w->gsize);
	free((void *)w->gsplit);
	free(w->gwhole);
	free(w->loose);
	free(w->names);
	free(w->finals);
	free(w->keys);
	free((void *)w->gen);
	free(w->cl);
	free(w->all);
	free(w->final_ops);
	free(w);
}
