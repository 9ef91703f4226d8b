/*
 * workload.c - the clients of shardkv-checker: each thread runs random
 * appends, puts and gets on the key table through its own shardkv_client
 * and records every operation (invocation and completion time, result) in
 * its own buffer, so recording takes no lock.
 *
 * Keys live under the run's prefix: registers "<prefix>r<NNN>" and append
 * keys "<prefix>a<NNN>.<gen>". Every value is unique: client c writes
 * "c<c>.<seq>" (put) or appends "c<c>.<seq>;" with a per-client sequence.
 * An append key rolls to its next generation once its value passes
 * CHK_ROLL_BYTES, which bounds every value (and every get) whatever the
 * duration. Memory is bounded by the operation budget (--max-ops).
 */
#include "checker/checker.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One client thread. */
typedef struct {
	struct chk_workload *w; /* the workload */
	uint32_t id;            /* client id, from 1 */
	shardkv_client *cl;     /* its own handle */
	chk_rng rng;            /* its random stream */
	uint32_t seq;           /* last value sequence used */
	chk_op *ops;            /* its history, in order */
	size_t nops, cap;       /* used and allocated */
	pthread_t thr;          /* the thread */
	bool started;           /* thr is running */
	bool oom;               /* stopped because memory ran out */
} client;

struct chk_workload {
	const chk_opts *o;          /* options */
	unsigned nreg;              /* registers */
	unsigned nslot;             /* append keys (each with generations) */
	size_t nkeys;               /* nreg + nslot * CHK_MAX_GEN */
	chk_key *keys;              /* key table of the model */
	char **names;               /* key names (NUL-terminated), per key */
	uint8_t **finals;           /* final values of append keys (owned) */
	_Atomic unsigned *gen;      /* current generation per append slot */
	client *cl;                 /* clients */
	unsigned ncl;               /* their number */
	atomic_bool stop;           /* ask the clients to stop */
	atomic_size_t budget;       /* operations started so far (against max_ops) */
	atomic_uint_fast64_t ndone; /* operations recorded */
	atomic_uint_fast64_t nfail; /* failed operations */
	_Atomic uint64_t errs[32];  /* failed operations by -err */
	uint64_t deadline;          /* when the clients stop (ns) */
	chk_op *all;                /* the merged history (after the run) */
	size_t nall;                /* its length */
	chk_op *final_ops;          /* register reads of the final pass */
	size_t nfinal;              /* their number */
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
	return w->nreg + slot * CHK_MAX_GEN + gen;
}

chk_workload *
chk_workload_create(const chk_opts *o, const char *controllers, const char *prefix)
{
	chk_workload *w = calloc(1, sizeof(*w));
	shardkv_options so = {.timeout_ms = o->op_timeout_ms,
	                      .tls_cert = o->tls_cert,
	                      .tls_key = o->tls_key,
	                      .tls_ca = o->tls_ca};

	if (w == NULL)
		return NULL;
	w->o = o;
	w->nslot = o->keys / 2 > 0 ? o->keys / 2 : 1;
	w->nreg = o->keys - w->nslot > 0 ? o->keys - w->nslot : 1;
	w->nkeys = w->nreg + (size_t)w->nslot * CHK_MAX_GEN;
	w->keys = calloc(w->nkeys, sizeof(*w->keys));
	w->names = calloc(w->nkeys, sizeof(*w->names));
	w->finals = calloc(w->nkeys, sizeof(*w->finals));
	w->gen = calloc(w->nslot, sizeof(*w->gen));
	w->ncl = o->clients;
	w->cl = calloc(w->ncl, sizeof(*w->cl));
	if (!w->keys || !w->names || !w->finals || !w->gen || !w->cl)
		goto err;
	for (size_t k = 0; k < w->nkeys; k++) {
		char buf[512];
		if (k < w->nreg)
			snprintf(buf, sizeof(buf), "%sr%03zu", prefix, k);
		else
			snprintf(buf, sizeof(buf), "%sa%03zu.%03zu", prefix,
			         (k - w->nreg) / CHK_MAX_GEN, (k - w->nreg) % CHK_MAX_GEN);
		if ((w->names[k] = strdup(buf)) == NULL)
			goto err;
		w->keys[k].name = w->names[k];
		w->keys[k].append = k >= w->nreg;
		/* Unused generations hold nothing: checked as empty. */
		w->keys[k].final_known = true;
	}
	for (unsigned i = 0; i < w->ncl; i++) {
		client *c = &w->cl[i];
		c->w = w;
		c->id = i + 1;
		c->rng.s = o->seed ^ (0x9e3779b97f4a7c15ull * (i + 1));
		if (shardkv_open(controllers, &so, &c->cl) != 0) {
			fprintf(stderr, "checker: cannot open a client on %s\n", controllers);
			goto err;
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
	size_t nk = w->nreg + w->nslot, m = 0;
	int rv = 0;

	if (kb == NULL || val == NULL) {
		free(kb);
		free(val);
		return SHARDKV_ENOMEM;
	}
	for (unsigned i = 0; i < size; i++)
		val[i] = (char)('a' + i % 26);
	for (unsigned i = 0; i < n && rv == 0; i++) {
		size_t k = i % nk;
		const char *base =
		    k < w->nreg ? w->names[k] : w->names[append_key(w, (unsigned)(k - w->nreg), 0)];
		int kl = snprintf(kb[m], sizeof(kb[m]), "%s/f%06u", base, i);
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

/* Appends an operation to the client's history. */
static bool
record(client *c, const chk_op *op)
{
	if (c->nops == c->cap) {
		size_t cap = c->cap ? c->cap * 2 : 4096;
		chk_op *p = realloc(c->ops, cap * sizeof(*p));
		if (p == NULL) {
			c->oom = true;
			return false;
		}
		c->ops = p;
		c->cap = cap;
	}
	c->ops[c->nops++] = *op;
	return true;
}

static void
count_failure(chk_workload *w, int err)
{
	int e = -err;
	atomic_fetch_add(&w->nfail, 1);
	atomic_fetch_add(&w->errs[e > 0 && e < 32 ? e : 0], 1);
}

/* One random operation; returns false to stop. */
static bool
one_op(client *c)
{
	chk_workload *w = c->w;
	uint64_t r = chk_rng_below(&c->rng, 100);
	chk_op op = {.client = c->id};
	char val[40];
	int rv;

	if (r < 30) { /* append */
		unsigned slot = (unsigned)chk_rng_below(&c->rng, w->nslot);
		unsigned g = atomic_load(&w->gen[slot]);
		const char *key = w->names[append_key(w, slot, g)];
		uint64_t nl = 0;
		op.kind = CHK_APPEND;
		op.key = append_key(w, slot, g);
		op.val = chk_val_id(c->id, ++c->seq);
		int n = chk_format_val(val, sizeof(val) - 1, op.val);
		val[n++] = ';';
		op.invoke = chk_now_ns();
		rv = shardkv_append(c->cl, key, strlen(key), val, (size_t)n, &nl);
		op.complete = chk_now_ns();
		if (rv == 0) {
			op.len = nl;
			if (nl > CHK_ROLL_BYTES && g + 1 < CHK_MAX_GEN)
				atomic_compare_exchange_strong(&w->gen[slot], &g, g + 1);
		}
	} else if (r < 55) { /* put */
		unsigned k = (unsigned)chk_rng_below(&c->rng, w->nreg);
		const char *key = w->names[reg_key(w, k)];
		op.kind = CHK_PUT;
		op.key = reg_key(w, k);
		op.val = chk_val_id(c->id, ++c->seq);
		int n = chk_format_val(val, sizeof(val), op.val);
		op.invoke = chk_now_ns();
		rv = shardkv_put(c->cl, key, strlen(key), val, (size_t)n);
		op.complete = chk_now_ns();
	} else { /* get: registers mostly, append keys sometimes */
		shardkv_buf b = {0};
		bool app = r >= 85;
		if (app) {
			unsigned slot = (unsigned)chk_rng_below(&c->rng, w->nslot);
			op.key = append_key(w, slot, atomic_load(&w->gen[slot]));
		} else {
			op.key = reg_key(w, (unsigned)chk_rng_below(&c->rng, w->nreg));
		}
		const char *key = w->names[op.key];
		op.kind = CHK_GET;
		op.invoke = chk_now_ns();
		rv = shardkv_get(c->cl, key, strlen(key), &b);
		op.complete = chk_now_ns();
		if (rv == 0) {
			op.len = b.len;
			if (app) {
				op.hash = chk_hash(CHK_HASH_INIT, b.data, b.len);
			} else if (!chk_parse_val(b.data, b.len, &op.val)) {
				op.status = CHK_GARBAGE;
				op.val = 0;
			}
			shardkv_free(b.data);
		} else if (rv == SHARDKV_ENOTFOUND) {
			op.status = CHK_NOTFOUND;
			rv = 0;
		}
	}
	op.ret = op.complete;
	if (rv != 0) {
		op.status = CHK_FAILED;
		op.err = (int16_t)rv;
		op.complete = CHK_NEVER;
		count_failure(w, rv);
	}
	return record(c, &op);
}

static void *
client_main(void *arg)
{
	client *c = arg;
	chk_workload *w = c->w;

	while (!atomic_load(&w->stop) && !chk_stop_requested && chk_now_ns() < w->deadline) {
		if (atomic_fetch_add(&w->budget, 1) >= w->o->max_ops)
			break;
		if (!one_op(c))
			break;
		atomic_fetch_add(&w->ndone, 1);
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
			if (w->cl[i].oom)
				fprintf(stderr, "checker: client %u ran out of memory\n",
				        w->cl[i].id);
		}
}

void
chk_workload_counts(chk_workload *w, uint64_t *ops, uint64_t *failed)
{
	*ops = atomic_load(&w->ndone);
	*failed = atomic_load(&w->nfail);
}

const uint64_t *
chk_workload_errors(chk_workload *w)
{
	return (const uint64_t *)w->errs;
}

static int
str_cmp(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

const char **
chk_workload_boundaries(chk_workload *w, size_t *n)
{
	const char **b = malloc((w->nreg + w->nslot) * sizeof(*b));
	size_t m = 0;

	if (b == NULL) {
		*n = 0;
		return NULL;
	}
	for (unsigned r = 0; r < w->nreg; r++)
		b[m++] = w->names[reg_key(w, r)];
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

	w->final_ops = calloc(w->nreg + 1, sizeof(*w->final_ops));
	if (done == NULL || w->final_ops == NULL) {
		free(done);
		return w->nkeys;
	}
	/* Keys never used need no read; the others are unknown until read. */
	for (size_t k = w->nreg; k < w->nkeys; k++) {
		unsigned slot = (unsigned)((k - w->nreg) / CHK_MAX_GEN);
		unsigned g = (unsigned)((k - w->nreg) % CHK_MAX_GEN);
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
			done[k] = k < w->nreg ? final_read_register(w, admin, (unsigned)k)
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
	free(done);
	return pending;
}

void
chk_workload_history(chk_workload *w, const chk_key **keys, size_t *nkeys, const chk_op **ops,
                     size_t *nops)
{
	if (w->all == NULL) {
		size_t n = w->nfinal;
		for (unsigned i = 0; i < w->ncl; i++)
			n += w->cl[i].nops;
		w->all = malloc((n + 1) * sizeof(*w->all));
		if (w->all != NULL) {
			for (unsigned i = 0; i < w->ncl; i++) {
				if (w->cl[i].nops)
					memcpy(w->all + w->nall, w->cl[i].ops,
					       w->cl[i].nops * sizeof(*w->all));
				w->nall += w->cl[i].nops;
				free(w->cl[i].ops);
				w->cl[i].ops = NULL;
				w->cl[i].nops = 0;
			}
			if (w->nfinal)
				memcpy(w->all + w->nall, w->final_ops, w->nfinal * sizeof(*w->all));
			w->nall += w->nfinal;
		}
	}
	*keys = w->keys;
	*nkeys = w->nkeys;
	*ops = w->all;
	*nops = w->nall;
}

void
chk_workload_destroy(chk_workload *w)
{
	if (w == NULL)
		return;
	chk_workload_stop(w);
	for (unsigned i = 0; w->cl && i < w->ncl; i++) {
		shardkv_close(w->cl[i].cl);
		free(w->cl[i].ops);
	}
	for (size_t k = 0; k < w->nkeys; k++) {
		if (w->names)
			free(w->names[k]);
		if (w->finals)
			shardkv_free(w->finals[k]);
	}
	free(w->names);
	free(w->finals);
	free(w->keys);
	free((void *)w->gen);
	free(w->cl);
	free(w->all);
	free(w->final_ops);
	free(w);
}
