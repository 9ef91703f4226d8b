/*
 * dispatch.c - the shard server's request path (dispatch.h): decodes a
 * Request, checks auth, state and limits, runs each op through the op
 * table, encodes the Response and holds it until the log has what it may
 * reveal.
 *
 * DESIGN. nng's worker threads run kv_srv_rpc_handler for up to `contexts`
 * requests at once and execute ops directly against the store, so every
 * core serves requests without a hand-off (striped store: partition locks;
 * percore store: the store hands each op to its partition owner). Incoming
 * transfer messages go to the migrations (kv_mig_in_handle) on the same
 * thread.
 *
 * The op table (op_table) is the list of ops: name, flags, handler. The
 * flags say what the dispatcher does before the handler runs, once per op:
 * READ/WRITE (writes are refused past --max-memory, check the fence of a
 * moving range and are logged), KEYED/MULTI/RANGE (which keys are looked up
 * in the ownership table: a KEYED op's key, every key of a MULTI op, the
 * start of a RANGE op), DEDUP (exactly-once by client and request id).
 * Handlers only touch the store, the log and the delta record.
 *
 * Ownership is decided by the local ownership table (owner.h), not by the
 * epoch: the dispatcher looks every key up once, with the table's read lock
 * held for the whole op, so a handover (write lock) never overlaps an op on
 * the old owner. Writes to a range with an outgoing migration also take that
 * migration's mutex (kv_mig_out_lock), which orders them with the fence and
 * appends them to the migration's delta buffer; ranges that are not moving
 * take no lock of ours beyond the read lock. A request with ops is refused
 * as a whole until the first configuration is applied (epoch 0).
 *
 * This file does not touch protobuf (proto/data_codec.c) nor implement the
 * transfer stream (migrate_in.c). Lock order: doc/threads.md.
 */
#include "shardserver/dispatch.h"
#include "common/mem.h"
#include "common/auth.h"
#include "common/bytes.h"
#include "common/defer.h"
#include "common/err.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COMP "server"

/* Defaults and bounds of the data path. */
#define SCAN_DEFAULT_LIMIT     1000u
#define SCAN_MAX_LIMIT         10000u
#define SCAN_DEFAULT_BYTES     (4u * 1024u * 1024u)
#define SCAN_MAX_BYTES         (64u * 1024u * 1024u)
#define REPLY_MAX_BYTES        (64u * 1024u * 1024u)
#define COUNT_DEFAULT_LIMIT    100000u
#define COUNT_MAX_LIMIT        1000000u
#define DELRANGE_DEFAULT_LIMIT 1000u
#define DELRANGE_MAX_LIMIT     10000u
#define DELRANGE_MORE          (1ull << 63) /* dedup value_len of a delrange: more */

/* Each thread keeps the results array of its last request, with each
 * result's value buffer of up to RES_KEEP_VALUE bytes, for requests of up
 * to RES_KEEP_OPS ops: a read's value is copied into a buffer the thread
 * already has, not into a fresh allocation freed after the reply. At most
 * about 512 KiB a thread; freed when the thread exits. */
#define RES_KEEP_OPS   512u
#define RES_KEEP_VALUE 1024u

typedef struct {
	bool busy;                      /* handed out (a handler on this thread has it) */
	kv_data_result r[RES_KEEP_OPS]; /* emptied between requests */
} res_cache;

static pthread_key_t res_key;
static pthread_once_t res_once = PTHREAD_ONCE_INIT;
static bool res_key_ok;

static void
res_cache_free(void *arg)
{
	res_cache *c = arg;

	for (size_t i = 0; i < RES_KEEP_OPS; i++)
		kv_data_result_fini(&c->r[i]);
	free(c);
}

static void
res_key_make(void)
{
	res_key_ok = pthread_key_create(&res_key, res_cache_free) == 0;
}

/* n zeroed results for a request: the thread's kept ones when they fit
 * and are not in use, else a fresh array. NULL when out of memory. */
static kv_data_result *
res_take(size_t n)
{
	res_cache *c;

	pthread_once(&res_once, res_key_make);
	if (n > RES_KEEP_OPS || !res_key_ok)
		return kv_zalloc(n, sizeof(kv_data_result));
	if ((c = pthread_getspecific(res_key)) == NULL) {
		if ((c = kv_zalloc(1, sizeof(*c))) == NULL ||
		    pthread_setspecific(res_key, c) != 0) {
			free(c);
			return kv_zalloc(n, sizeof(kv_data_result));
		}
	}
	if (c->busy)
		return kv_zalloc(n, sizeof(kv_data_result));
	c->busy = true;
	return c->r;
}

/* Gives back res (n results) from res_take: the kept array is emptied for
 * the next request, keeping small value buffers; any other is freed. */
static void
res_give(kv_data_result *res, size_t n)
{
	res_cache *c = res_key_ok ? pthread_getspecific(res_key) : NULL;

	if (c != NULL && c->busy && res == c->r) {
		for (size_t i = 0; i < n; i++)
			kv_data_result_reuse(&res[i], RES_KEEP_VALUE);
		c->busy = false;
		return;
	}
	for (size_t i = 0; i < n; i++)
		kv_data_result_fini(&res[i]);
	free(res);
}

/* ------------------------------------------------------------------------
 * Owner hints
 * ------------------------------------------------------------------------ */

static void
hint_set(kv_data_result *res, int status, uint64_t epoch, const void *st, size_t sl, const void *en,
         size_t el, uint32_t node, const char *addr)
{
	res->status = status;
	res->has_hint = true;
	res->hint.epoch = epoch;
	res->hint.node_id = node;
	free(res->hint.address);
	res->hint.address = addr && addr[0] ? strdup(addr) : NULL; /* NULL: sent without one */
	if (kv_buf_set(&res->hint.start, st, sl) != 0 || kv_buf_set(&res->hint.end, en, el) != 0)
		res->has_hint = false;
}

/* Fills a WRONG_OWNER answer from the latest configuration. */
static void
hint_from_config(kv_server *s, const void *key, size_t klen, kv_data_result *res)
{
	uint32_t me = atomic_load(&s->node_id);

	res->status = KV_EWRONGOWNER;
	res->error = "this node does not serve the key";
	pthread_mutex_lock(&s->cfg_mu);
	if (s->cur != NULL) {
		const kv_config *c = s->cur;
		const kv_migration *m = kv_config_migration_for(c, key, klen);
		long i = kv_config_find_range(c, key, klen);
		uint32_t node = kv_config_route(c, key, klen);
		const kv_node *n = kv_config_node(c, node);
		const kv_buf *st = m ? &m->start : i >= 0 ? &c->ranges[i].start : NULL;
		const kv_buf *en = m ? &m->end : i >= 0 ? &c->ranges[i].end : NULL;
		int status = node == me ? KV_EMOVING : KV_EWRONGOWNER;
		if (st != NULL)
			hint_set(res, status, c->epoch, st->data, st->len, en->data, en->len, node,
			         n ? n->address : "");
		if (node == me)
			res->error = "range is not ready on this node yet";
	}
	pthread_mutex_unlock(&s->cfg_mu);
}

/* Fills a MOVING answer for a range whose handover has begun. */
static void
hint_moving(kv_data_result *res, const kv_mig_out *m)
{
	kv_bytes st, en;
	uint32_t to;
	const char *addr;

	kv_mig_out_target(m, &st, &en, &to, &addr);
	hint_set(res, KV_EMOVING, 0, st.p, st.len, en.p, en.len, to, addr);
	res->error = "range is being handed over";
}

/* Checks that key is served here. Caller holds the owner read lock. Returns
 * true and sets *ent when it is; otherwise fills res and returns false. */
static bool
own_check_locked(kv_server *s, const void *key, size_t klen, const kv_owner_entry **ent,
                 kv_data_result *res)
{
	const kv_owner_entry *e = kv_owner_lookup_locked(&s->owner, key, klen);

	if (e != NULL && e->state == KV_OWN_SERVE) {
		kv_mig_out *m = e->mig;
		if (m != NULL && kv_mig_out_fenced(m)) {
			hint_moving(res, m);
			return false;
		}
		*ent = e;
		return true;
	}
	if (e != NULL && e->state == KV_OWN_INCOMING) {
		hint_set(res, KV_EMOVING, 0, e->start.data, e->start.len, e->end.data, e->end.len,
		         e->peer, e->peer_addr);
		res->error = "range is arriving on this node";
		return false;
	}
	if (e != NULL && e->state == KV_OWN_MOVED) {
		hint_set(res, KV_EWRONGOWNER, e->epoch, e->start.data, e->start.len, e->end.data,
		         e->end.len, e->peer, e->peer_addr);
		res->error = "range has moved";
		return false;
	}
	hint_from_config(s, key, klen, res);
	return false;
}

/* ------------------------------------------------------------------------
 * Ops and the dispatch table
 * ------------------------------------------------------------------------ */

enum {
	OPF_READ = 1u << 0,  /* reads only */
	OPF_WRITE = 1u << 1, /* changes data: fence check, delta record */
	OPF_KEYED = 1u << 2, /* one key: op->key */
	OPF_MULTI = 1u << 3, /* several keys: op->keys, all must be served */
	OPF_RANGE = 1u << 4, /* a key range starting at the scan start/cursor */
	OPF_DEDUP = 1u << 5, /* exactly-once with (client_id, request_id) */
};

#define MAX_OP_MIGS 8 /* distinct moving ranges one op may write to */

/* Everything a handler needs; built by the dispatcher. */
typedef struct {
	kv_server *s;                    /* the server */
	const kv_req *rq;                /* the request */
	const kv_op *op;                 /* the op */
	kv_data_result *res;             /* its result */
	const kv_owner_entry *ent;       /* KEYED/RANGE: the entry serving the key */
	const kv_owner_entry **ents;     /* KEYED, MULTI: one entry per key */
	const kv_owner_entry *single[1]; /* KEYED: ents points here */
	kv_mig_out *migs[MAX_OP_MIGS];   /* WRITE: locked outgoing migrations */
	size_t nmigs;                    /* entries in migs */
	bool has_dd;                     /* DEDUP: the op has (client, request) ids */
	kv_mig_dedup dd;                 /* ... the fields for log and delta records */
	uint64_t lsn;                    /* WRITE: the log record's lsn; 0: none */
	bool durw;                       /* WRITE with a log: applied and logged under stripes */
	kv_rs_op rop;                    /* WRITE to a replicated range: the routing hold and the
	                                      log tap (kv_rs_write_begin) */
	bool dedup_begun;                /* kv_dedup_begin ran: finish or abort it */
	bool migs_locked;                /* the mutexes of migs are held */
} op_ctx;

typedef int (*op_fn)(op_ctx *x);

/* Raises the highest lsn a reply may reveal to l. */
static void
visible(kv_server *s, uint64_t l)
{
	uint64_t cur = atomic_load(&s->visible_lsn);
	while (cur < l && !atomic_compare_exchange_weak(&s->visible_lsn, &cur, l))
		;
}

/* The dedup fields of the op for its log record, or NULL. */
static const kv_dur_dedup *
dur_dd(const op_ctx *x, kv_dur_dedup *out)
{
	if (!x->has_dd)
		return NULL;
	*out = (kv_dur_dedup){.client = x->dd.client,
	                      .req = x->dd.req,
	                      .value_len = x->dd.value_len,
	                      .time_ms = x->dd.time_ms};
	return out;
}

/* The log tap of the write (its range's in-sync backups), or NULL. */
static const kv_dur_tap *
tap_of(const op_ctx *x)
{
	return x->rop.tap.fn ? &x->rop.tap : NULL;
}

/* Records a write to key (a put leaving the deadline `at`, 0: none; a
 * delete when val is NULL) for its migration, if it has one. */
static void
record_x(op_ctx *x, const kv_owner_entry *e, const void *key, size_t klen, const void *val,
         size_t vlen, uint64_t at, bool with_dedup)
{
	if (e == NULL || e->mig == NULL)
		return;
	kv_mig_out_record_x_locked(e->mig, key, klen, val, vlen, at,
	                           with_dedup && x->has_dd ? &x->dd : NULL);
}

static void
record(op_ctx *x, const kv_owner_entry *e, const void *key, size_t klen, const void *val,
       size_t vlen, bool with_dedup)
{
	record_x(x, e, key, klen, val, vlen, 0, with_dedup);
}

/* The deadline of a write with ttl_ms (0: none), on the store's clock. */
static uint64_t
deadline_of(op_ctx *x, uint64_t ttl_ms)
{
	return ttl_ms ? kv_store_now_ms(x->s->store) + ttl_ms : 0;
}

/* Fills a failed condition's answer (EXISTS, MISMATCH) and counts it. */
static int
cond_failed(op_ctx *x, int rv, const kv_store_upd *u)
{
	kv_data_result *r = x->res;

	r->current_absent = u->cur_absent;
	r->has_value = !u->cur_absent;
	if (u->cur_absent)
		r->value.len = 0;
	r->error = rv == KV_EEXISTS ? "the key exists (put if absent)"
	                            : "the key does not hold the expected value";
	atomic_fetch_add_explicit(&x->s->cond_conflicts, 1, memory_order_relaxed);
	return rv;
}

/* Logs and records a put of key that leaves value v with deadline at (the
 * result of an append, incr, expire). */
static int
log_value(op_ctx *x, const kv_buf *v, uint64_t at)
{
	const kv_op *op = x->op;
	const uint8_t *vp = v->data ? v->data : (const uint8_t *)"";
	kv_dur_dedup dd;

	record_x(x, x->ent, op->key.p, op->key.len, vp, v->len, at, true);
	if (x->s->dur)
		return kv_dur_log_put_x(x->s->dur, op->key.p, op->key.len, vp, v->len, at,
		                        dur_dd(x, &dd), &x->lsn, tap_of(x));
	return KV_OK;
}

static int
op_get(op_ctx *x)
{
	int rv = kv_store_get(x->s->store, x->op->key.p, x->op->key.len, &x->res->value);
	x->res->has_value = rv == 0;
	return rv;
}

static int
op_put(op_ctx *x)
{
	const kv_op *op = x->op;
	kv_dur_dedup dd;
	uint64_t at = deadline_of(x, op->ttl_ms);
	kv_store_upd u = {.kind = KV_UPD_PUT,
	                  .cond = (kv_upd_cond)op->cond,
	                  .expect = op->expect,
	                  .value = op->value,
	                  .expire_at = at,
	                  .cur = &x->res->value};
	int rv = kv_store_update(x->s->store, op->key.p, op->key.len, &u);
	if (rv == KV_EEXISTS || rv == KV_EMISMATCH)
		return cond_failed(x, rv, &u);
	if (rv != 0)
		return rv;
	record_x(x, x->ent, op->key.p, op->key.len, op->value.p, op->value.len, at, true);
	if (x->s->dur)
		rv = kv_dur_log_put_x(x->s->dur, op->key.p, op->key.len, op->value.p, op->value.len,
		                      at, dur_dd(x, &dd), &x->lsn, tap_of(x));
	return rv;
}

static int
op_del(op_ctx *x)
{
	const kv_op *op = x->op;
	kv_dur_dedup dd;
	kv_store_upd u = {.kind = KV_UPD_DEL,
	                  .cond = (kv_upd_cond)op->cond,
	                  .expect = op->expect,
	                  .cur = &x->res->value};
	int rv = kv_store_update(x->s->store, op->key.p, op->key.len, &u);
	if (rv == KV_EMISMATCH)
		return cond_failed(x, rv, &u);
	if (rv != 0)
		return rv;
	x->res->has_value = !op->no_value;
	/* The exactly-once memory keeps what the delete returned, so a retry
	 * gets the same answer after a restart or a move (dedup.h). */
	const kv_buf *dv = &x->res->value;
	x->dd.has_del_value = dv->len <= KV_DEDUP_MAX_VALUE;
	x->dd.del_value = (kv_bytes){dv->data, dv->len};
	record(x, x->ent, op->key.p, op->key.len, NULL, 0, true);
	if (x->s->dur) {
		const kv_dur_dedup *d = dur_dd(x, &dd);
		if (d != NULL) {
			dd.has_del_value = x->dd.has_del_value;
			dd.del_value = x->dd.del_value;
		}
		rv = kv_dur_log_del(x->s->dur, op->key.p, op->key.len, d, &x->lsn, tap_of(x));
	}
	return rv;
}

static int
op_append(op_ctx *x)
{
	const kv_op *op = x->op;
	/* Deltas and log records carry the whole value (and the kept deadline),
	 * copied out by the update itself. */
	bool whole = x->ent->mig != NULL || x->s->dur;
	kv_buf v = {0};
	kv_store_upd u = {.kind = KV_UPD_APPEND, .value = op->value, .cur = whole ? &v : NULL};
	int rv = kv_store_update(x->s->store, op->key.p, op->key.len, &u);
	if (rv != 0)
		return rv;
	x->res->value_len = u.newlen;
	x->dd.value_len = u.newlen;
	if (whole)
		rv = log_value(x, &v, u.new_at);
	kv_buf_fini(&v);
	return rv;
}

static int
op_incr(op_ctx *x)
{
	const kv_op *op = x->op;
	kv_buf v = {0};
	kv_store_upd u = {.kind = KV_UPD_INCR, .delta = op->delta, .cur = &v};
	int rv = kv_store_update(x->s->store, op->key.p, op->key.len, &u);
	if (rv == KV_EINVAL)
		x->res->error = u.why;
	if (rv == 0) {
		x->res->number = u.number;
		/* The exactly-once memory answers a retry with the number. */
		x->dd.value_len = (uint64_t)u.number;
		rv = log_value(x, &v, u.new_at);
	}
	kv_buf_fini(&v);
	return rv;
}

static int
op_expire(op_ctx *x)
{
	const kv_op *op = x->op;
	kv_buf v = {0};
	kv_store_upd u = {.kind = KV_UPD_EXPIRE,
	                  .expire_at = op->persist ? 0 : deadline_of(x, op->ttl_ms),
	                  .cur = &v};
	int rv = kv_store_update(x->s->store, op->key.p, op->key.len, &u);
	if (rv == 0)
		rv = log_value(x, &v, u.new_at); /* a blind put: "key is now v until at" */
	kv_buf_fini(&v);
	return rv;
}

static int
op_ttl(op_ctx *x)
{
	uint64_t at = 0, now;
	int rv = kv_store_get_x(x->s->store, x->op->key.p, x->op->key.len, NULL, &at);
	if (rv != 0)
		return rv;
	now = kv_store_now_ms(x->s->store);
	x->res->ttl_ms = at == 0 ? -1 : at > now ? (int64_t)(at - now) : 0;
	return KV_OK;
}

static int
op_exists(op_ctx *x)
{
	uint64_t at;
	return kv_store_get_x(x->s->store, x->op->key.p, x->op->key.len, NULL, &at);
}

static int
op_mget(op_ctx *x)
{
	const kv_op *op = x->op;
	kv_data_result *r = x->res;
	bool *missing = NULL;
	int rv;

	r->values = kv_zalloc(op->nkeys, sizeof(kv_buf));
	missing = kv_zalloc(op->nkeys, sizeof(bool));
	if (r->values == NULL || missing == NULL) {
		free(missing);
		return KV_ENOMEM;
	}
	r->nvalues = op->nkeys;
	rv = kv_store_mget(x->s->store, op->nkeys, op->keys, r->values, missing);
	if (rv == KV_ENOTFOUND) {
		size_t nm = 0;
		for (size_t i = 0; i < op->nkeys; i++)
			nm += missing[i];
		r->missing = kv_zalloc(nm ? nm : 1, sizeof(uint32_t));
		if (r->missing == NULL) {
			free(missing);
			return KV_ENOMEM;
		}
		for (size_t i = 0; i < op->nkeys; i++)
			if (missing[i]) {
				r->missing[r->nmissing++] = (uint32_t)i;
				r->values[i].len = 0;
			}
		r->error = "some keys are missing";
	}
	free(missing);
	return rv;
}

static int
op_mput(op_ctx *x)
{
	const kv_op *op = x->op;
	kv_dur_dedup dd;
	uint64_t at = deadline_of(x, op->ttl_ms);
	int rv = kv_store_mput_x(x->s->store, op->nkeys, op->keys, op->nvals, op->vals, at);
	if (rv != 0)
		return rv;
	if (x->nmigs > 0)
		for (size_t i = 0; i < op->nkeys; i++)
			record_x(x, x->ents[i], op->keys[i].p, op->keys[i].len,
			         op->vals[i].p ? op->vals[i].p : (const uint8_t *)"",
			         op->vals[i].len, at, i == 0);
	if (x->s->dur)
		rv = kv_dur_log_mput_x(x->s->dur, op->nkeys, op->keys, op->vals, at, dur_dd(x, &dd),
		                       &x->lsn, tap_of(x));
	return rv;
}

/* Collects scan entries up to a byte bound. */
typedef struct {
	kv_data_result *res; /* where entries go */
	size_t cap;          /* capacity of res->entries */
	uint64_t bytes;      /* payload so far */
	uint64_t max_bytes;  /* stop after this much */
	bool stopped;        /* stopped on the byte bound */
	bool oom;            /* allocation failed */
} scan_acc;

static int
scan_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	scan_acc *a = arg;
	kv_data_result *r = a->res;

	if (r->nentries == a->cap) {
		size_t nc = a->cap ? a->cap * 2 : 64;
		kv_data_entry *ne = realloc(r->entries, nc * sizeof(*ne));
		if (ne == NULL) {
			a->oom = true;
			return 1;
		}
		memset(ne + a->cap, 0, (nc - a->cap) * sizeof(*ne));
		r->entries = ne;
		a->cap = nc;
	}
	kv_data_entry *e = &r->entries[r->nentries];
	if (kv_buf_set(&e->key, key, klen) != 0 || (val && kv_buf_set(&e->value, val, vlen) != 0)) {
		kv_buf_fini(&e->key);
		a->oom = true;
		return 1;
	}
	r->nentries++;
	a->bytes += klen + vlen;
	if (a->bytes >= a->max_bytes) {
		a->stopped = true;
		return 1;
	}
	return 0;
}

static int
op_scan(op_ctx *x)
{
	const kv_op *op = x->op;
	const kv_owner_entry *e = x->ent;
	kv_data_result *r = x->res;
	kv_bytes from = op->cursor.len ? op->cursor : op->start;
	kv_bytes to = op->end;
	uint8_t pend[KV_HARD_MAX_KEY];
	size_t pendlen = 0;
	bool clipped = false, more = false;
	scan_acc a = {.res = r};
	size_t limit = op->limit ? op->limit : SCAN_DEFAULT_LIMIT;
	int rv;

	if (limit > SCAN_MAX_LIMIT)
		limit = SCAN_MAX_LIMIT;
	a.max_bytes = op->max_bytes ? op->max_bytes : SCAN_DEFAULT_BYTES;
	if (a.max_bytes > SCAN_MAX_BYTES)
		a.max_bytes = SCAN_MAX_BYTES;
	if (op->prefix.len) {
		if (kv_key_cmp(from.p, from.len, op->prefix.p, op->prefix.len) < 0)
			from = op->prefix;
		kv_prefix_end(op->prefix.p, op->prefix.len, pend, &pendlen);
		if (pendlen && (to.len == 0 || kv_key_cmp(pend, pendlen, to.p, to.len) < 0)) {
			to.p = pend;
			to.len = pendlen;
		}
	}
	/* Clip to the served entry that holds the start. */
	if (e->end.len && (to.len == 0 || kv_key_cmp(e->end.data, e->end.len, to.p, to.len) < 0)) {
		to.p = e->end.data;
		to.len = e->end.len;
		clipped = true;
	}
	if (kv_range_is_empty(from.p, from.len, to.p, to.len))
		goto at_end;
	rv = kv_store_scan(x->s->store, from.p, from.len, to.p, to.len, limit, !op->keys_only,
	                   scan_cb, &a, &more);
	if (a.oom)
		return KV_ENOMEM;
	if (rv != 0)
		return rv;
	if ((more || a.stopped) && r->nentries > 0) {
		const kv_buf *last = &r->entries[r->nentries - 1].key;
		r->more = true;
		return kv_scan_resume_key(last->data, last->len, &r->next_cursor);
	}
at_end:
	if (clipped) {
		r->more = true;
		return kv_buf_set(&r->next_cursor, e->end.data, e->end.len);
	}
	return KV_OK;
}

/* The start of a count or delrange: its cursor, else its start; never
 * before its start (a cursor from elsewhere deletes nothing outside the
 * range asked for). */
static kv_bytes
range_from(const kv_op *op)
{
	if (op->cursor.len == 0 ||
	    kv_key_cmp(op->cursor.p, op->cursor.len, op->start.p, op->start.len) < 0)
		return op->start;
	return op->cursor;
}

/* The [from, to) of a count or delrange clipped to the served entry that
 * holds the start; *clipped when the entry ends first. */
static void
range_clip(const op_ctx *x, kv_bytes *from, kv_bytes *to, bool *clipped)
{
	const kv_owner_entry *e = x->ent;

	*from = range_from(x->op);
	*to = x->op->end;
	*clipped = false;
	if (e->end.len &&
	    (to->len == 0 || kv_key_cmp(e->end.data, e->end.len, to->p, to->len) < 0)) {
		to->p = e->end.data;
		to->len = e->end.len;
		*clipped = true;
	}
}

/* Ends a step as scan does: more with the resume key when the step stopped
 * early, else more with the entry's end when it was clipped there. */
static int
range_more(op_ctx *x, bool more, kv_buf *next, bool clipped)
{
	kv_data_result *r = x->res;

	if (more && next->len > 0) {
		r->more = true;
		kv_buf_fini(&r->next_cursor);
		r->next_cursor = *next;
		*next = (kv_buf){0};
		return KV_OK;
	}
	if (clipped) {
		r->more = true;
		return kv_buf_set(&r->next_cursor, x->ent->end.data, x->ent->end.len);
	}
	return KV_OK;
}

static int
op_count(op_ctx *x)
{
	const kv_op *op = x->op;
	kv_bytes from, to;
	kv_buf next = {0};
	bool clipped, more = false;
	uint64_t n = 0;
	size_t limit = op->limit ? op->limit : COUNT_DEFAULT_LIMIT;
	int rv = KV_OK;

	if (limit > COUNT_MAX_LIMIT)
		limit = COUNT_MAX_LIMIT;
	range_clip(x, &from, &to, &clipped);
	if (!kv_range_is_empty(from.p, from.len, to.p, to.len))
		rv = kv_store_count(x->s->store, from.p, from.len, to.p, to.len, limit, &n, &more,
		                    &next);
	x->res->count = n;
	if (rv == KV_OK)
		rv = range_more(x, more, &next, clipped);
	kv_buf_fini(&next);
	return rv;
}

/*
 * One delrange step: the store removes up to `limit` keys with every
 * partition held (atomic with respect to every other op), and the keys it
 * removed become one MDEL log record (replicated through the log tap) and
 * one delete delta each for a migration of the range. With a log, the
 * dispatcher holds the log's barrier exclusively (step_log_begin), so no
 * write to any of those keys can fall between the store and the log.
 */
static int
op_delrange(op_ctx *x)
{
	const kv_op *op = x->op;
	kv_bytes from, to, *keys = NULL;
	kv_buf next = {0}, removed = {0};
	bool clipped, more = false;
	uint64_t n = 0;
	size_t nk = 0;
	size_t limit = op->limit ? op->limit : DELRANGE_DEFAULT_LIMIT;
	kv_dur_dedup dd;
	int rv = KV_OK;

	if (limit > DELRANGE_MAX_LIMIT)
		limit = DELRANGE_MAX_LIMIT;
	/* Room for every key the step may remove (at most 2 * limit, expired
	 * ones included), taken before anything is removed: once the store
	 * has removed them, nothing may keep them out of the log. */
	if ((keys = kv_zalloc(2 * limit, sizeof(*keys))) == NULL)
		return KV_ENOMEM;
	range_clip(x, &from, &to, &clipped);
	if (!kv_range_is_empty(from.p, from.len, to.p, to.len))
		rv = kv_store_delrange(x->s->store, from.p, from.len, to.p, to.len, limit, &removed,
		                       &n, &more, &next);
	if (rv != KV_OK)
		goto out;
	x->res->count = n;
	for (size_t off = 0; off + 4 <= removed.len && nk < 2 * limit;) {
		uint32_t kl = kv_get32(removed.data + off);
		keys[nk++] = (kv_bytes){removed.data + off + 4, kl};
		off += 4 + kl;
	}
	/* An allocation failing here leaves the answer without its cursor;
	 * the step is logged all the same. */
	int mrv = range_more(x, more, &next, clipped);
	/* The exactly-once memory answers a retry with the count, `more` (the
	 * top bit: a cursor too long for the memory is not kept, and the retry
	 * then resumes at its own start) and the cursor. */
	x->dd.value_len = n | (x->res->more ? DELRANGE_MORE : 0);
	x->dd.has_del_value = x->res->more;
	x->dd.del_value = (kv_bytes){x->res->next_cursor.data, x->res->next_cursor.len};
	for (size_t i = 0; i < nk; i++)
		record(x, x->ent, keys[i].p, keys[i].len, NULL, 0, i == 0);
	if (x->s->dur && (nk > 0 || x->has_dd)) {
		const kv_dur_dedup *d = dur_dd(x, &dd);
		if (d != NULL) {
			dd.has_del_value = x->dd.has_del_value;
			dd.del_value = x->dd.del_value;
		}
		rv = kv_dur_log_mdel(x->s->dur, from, nk, keys, d, &x->lsn, tap_of(x));
	}
	if (rv == KV_OK)
		rv = mrv;
out:
	free(keys);
	kv_buf_fini(&next);
	kv_buf_fini(&removed);
	return rv;
}

/* The expiry reclaim of one key (kv_srv_reclaim_key): removed only if it
 * has expired, then logged and replicated as a delete. */
static int
op_reclaim(op_ctx *x)
{
	const kv_op *op = x->op;
	kv_store_upd u = {.kind = KV_UPD_RECLAIM};
	int rv = kv_store_update(x->s->store, op->key.p, op->key.len, &u);
	if (rv != 0)
		return rv;
	record(x, x->ent, op->key.p, op->key.len, NULL, 0, false);
	if (x->s->dur)
		rv = kv_dur_log_del(x->s->dur, op->key.p, op->key.len, NULL, &x->lsn, tap_of(x));
	return rv;
}

/*
 * The ops. The flags are what the dispatcher does for the op before its
 * handler runs, once: validate_op checks sizes (KEYED, MULTI) and the memory
 * bound (WRITE but del); step_owner_locked checks ownership (KEYED: the key,
 * MULTI: every key, RANGE: the first key); step_dedup answers retries
 * (DEDUP); step_fence and step_log_begin order writes with a moving range's
 * fence and with the log (WRITE). A handler only touches the store, the log
 * and the delta record.
 */
static const struct op_def {
	const char *name; /* for logs */
	unsigned flags;   /* OPF_* */
	op_fn fn;         /* the handler */
	const char *what; /* what the op does */
} op_table[KV_OP__COUNT] = {
    [KV_OP_GET] = {"get", OPF_READ | OPF_KEYED, op_get, "the value of one key"},
    [KV_OP_PUT] = {"put", OPF_WRITE | OPF_KEYED | OPF_DEDUP, op_put, "sets one key"},
    [KV_OP_DEL] = {"del", OPF_WRITE | OPF_KEYED | OPF_DEDUP, op_del,
                   "removes one key, answering its last value"},
    [KV_OP_APPEND] = {"append", OPF_WRITE | OPF_KEYED | OPF_DEDUP, op_append,
                      "appends to one key's value, answering the new length"},
    [KV_OP_MGET] = {"mget", OPF_READ | OPF_MULTI, op_mget,
                    "the values of several keys, all served here"},
    [KV_OP_MPUT] = {"mput", OPF_WRITE | OPF_MULTI | OPF_DEDUP, op_mput,
                    "sets several keys, all or none"},
    [KV_OP_SCAN] = {"scan", OPF_READ | OPF_RANGE, op_scan,
                    "entries in key order from a start, clipped to the served range"},
    [KV_OP_EXPIRE] = {"expire", OPF_WRITE | OPF_KEYED | OPF_DEDUP, op_expire,
                      "sets or clears one key's expiry"},
    [KV_OP_TTL] = {"ttl", OPF_READ | OPF_KEYED, op_ttl, "the time left before one key expires"},
    [KV_OP_INCR] = {"incr", OPF_WRITE | OPF_KEYED | OPF_DEDUP, op_incr,
                    "adds to the decimal integer in one key"},
    [KV_OP_EXISTS] = {"exists", OPF_READ | OPF_KEYED, op_exists, "whether one key is present"},
    [KV_OP_COUNT] = {"count", OPF_READ | OPF_RANGE, op_count,
                     "the number of keys of a range from the index, clipped like scan"},
    [KV_OP_DELRANGE] = {"delrange", OPF_WRITE | OPF_RANGE | OPF_DEDUP, op_delrange,
                        "deletes the keys of a range in atomic bounded steps"},
};

/* The expiry reclaim: not a client op (kv_srv_reclaim_key). */
static const struct op_def reclaim_def = {"reclaim", OPF_WRITE | OPF_KEYED, op_reclaim,
                                          "removes one expired key"};

/* Checks sizes against the configured limits. Returns 0 or fills res. */
static int
validate_op(kv_server *s, const kv_op *op, unsigned flags, kv_data_result *res)
{
	if (flags & OPF_KEYED) {
		if (op->key.len == 0) {
			res->error = "empty key";
			return KV_EINVAL;
		}
		if (op->key.len > s->max_key || op->value.len > s->max_value ||
		    op->expect.len > s->max_value) {
			res->error = "key or value over the configured limit";
			return KV_ETOOBIG;
		}
	}
	if ((flags & OPF_WRITE) && op->kind != KV_OP_DEL && op->kind != KV_OP_DELRANGE &&
	    s->cfg->max_memory != 0 && kv_store_mem_used(s->store) >= s->cfg->max_memory) {
		res->error = "memory limit reached (--max-memory): writes are refused, reads and "
		             "deletes go on";
		return KV_ENOMEM;
	}
	if (flags & OPF_MULTI) {
		if (op->nkeys == 0) {
			res->error = "no keys";
			return KV_EINVAL;
		}
		if (op->kind == KV_OP_MPUT && op->nkeys != op->nvals) {
			res->error = "key and value counts differ";
			return KV_EINVAL;
		}
		for (size_t i = 0; i < op->nkeys; i++) {
			if (op->keys[i].len == 0) {
				res->error = "empty key";
				return KV_EINVAL;
			}
			if (op->keys[i].len > s->max_key ||
			    (op->vals && op->vals[i].len > s->max_value)) {
				res->error = "key or value over the configured limit";
				return KV_ETOOBIG;
			}
		}
	}
	return KV_OK;
}

static int
mig_id_cmp(const void *a, const void *b)
{
	uint64_t x = kv_mig_out_id(*(kv_mig_out *const *)a);
	uint64_t y = kv_mig_out_id(*(kv_mig_out *const *)b);
	return x < y ? -1 : x > y;
}

/* Whether a result is deterministic enough to answer a retry with. */
static bool
rememberable(int status)
{
	return status == KV_OK || status == KV_ENOTFOUND || status == KV_ETOOBIG ||
	       status == KV_EINVAL;
}

/*
 * The steps of dispatch, in order. Each returns true to go on, or false
 * once it has answered the op in x->res; dispatch then undoes what earlier
 * steps did (x->dedup_begun, x->migs_locked). All run with the ownership
 * table's read lock held.
 */

/* Ownership, once per op: the key of a KEYED op, every key of a MULTI op,
 * the first key of a RANGE op must be served here. */
static bool
step_owner_locked(op_ctx *x, unsigned flags)
{
	const kv_op *op = x->op;
	bool owned = true;

	if (flags & OPF_KEYED) {
		owned = own_check_locked(x->s, op->key.p, op->key.len, &x->ent, x->res);
		x->single[0] = x->ent;
		x->ents = x->single;
	} else if (flags & OPF_RANGE) {
		kv_bytes from = op->kind == KV_OP_SCAN ? (op->cursor.len ? op->cursor : op->start)
		                                       : range_from(op);
		if (op->prefix.len &&
		    kv_key_cmp(from.p, from.len, op->prefix.p, op->prefix.len) < 0)
			from = op->prefix;
		owned = own_check_locked(x->s, from.p, from.len, &x->ent, x->res);
		x->single[0] = x->ent;
		x->ents = x->single;
	} else if (flags & OPF_MULTI) {
		x->ents = kv_zalloc(op->nkeys, sizeof(*x->ents));
		if (x->ents == NULL) {
			x->res->status = KV_ENOMEM;
			return false;
		}
		for (size_t i = 0; i < op->nkeys && owned; i++)
			owned = own_check_locked(x->s, op->keys[i].p, op->keys[i].len, &x->ents[i],
			                         x->res);
		if (!owned)
			x->res->error = "a key of the multi-key op is not served here";
	}
	return owned;
}

/* Exactly-once (DEDUP with both ids): a retry is answered from memory, a
 * first attempt is begun (x->dedup_begun). */
static bool
step_dedup(op_ctx *x, unsigned flags)
{
	const kv_op *op = x->op;
	kv_data_result *res = x->res;
	kv_dedup_result old;
	uint64_t now;
	int rv;

	if (!(flags & OPF_DEDUP) || x->rq->client_id == 0 || op->request_id == 0)
		return true;
	now = kv_unix_ms();
	rv = kv_dedup_begin(x->s->dedup, x->rq->client_id, op->request_id, op->retry, now, &old);
	if (rv == 0) {
		res->status = old.status;
		res->value_len = old.value_len;
		if (op->kind == KV_OP_INCR) {
			res->number = (int64_t)old.value_len;
			res->value_len = 0;
		} else if (op->kind == KV_OP_DELRANGE) {
			kv_bytes from = range_from(op);
			res->count = old.value_len & ~DELRANGE_MORE;
			res->value_len = 0;
			res->more = (old.value_len & DELRANGE_MORE) != 0;
			if (res->more && old.has_value && old.value.len > 0) {
				res->next_cursor = old.value;
				old.value = (kv_buf){0};
			} else if (res->more &&
			           kv_buf_set(&res->next_cursor, from.p, from.len) != 0) {
				res->status = KV_ENOMEM;
			}
		}
		if (op->kind == KV_OP_DELRANGE || op->kind == KV_OP_INCR) {
			kv_buf_fini(&old.value);
		} else if (op->kind == KV_OP_DEL && old.status == 0 && !op->no_value &&
		           old.has_value) {
			res->value = old.value;
			res->has_value = true;
		} else {
			res->value_unknown =
			    op->kind == KV_OP_DEL && old.status == 0 && !op->no_value;
			kv_buf_fini(&old.value);
		}
		return false;
	}
	if (rv == KV_ESTALE) {
		/* Older than what the memory still holds of this client: it may
		 * have been applied and forgotten. Not applied again; the outcome
		 * stays unknown (timeout class). */
		res->status = KV_ETIMEDOUT;
		res->error = "request id older than the exactly-once memory of this client "
		             "holds: it may have been applied; not applied again";
		return false;
	}
	if (rv != KV_ENOTFOUND) {
		res->status = rv;
		res->error = rv == KV_EBUSY ? "the first attempt is still in progress" : NULL;
		return false;
	}
	x->dedup_begun = true;
	x->has_dd = true;
	x->dd.client = x->rq->client_id;
	x->dd.req = op->request_id;
	x->dd.time_ms = now;
	return true;
}

/* The fence (WRITE): locks the outgoing migrations of the keys' ranges in
 * ascending id (x->migs_locked) and refuses the write once one is fenced. */
static bool
step_fence(op_ctx *x, unsigned flags)
{
	size_t nk = (flags & OPF_MULTI) ? x->op->nkeys : 1;

	if (!(flags & OPF_WRITE))
		return true;
	for (size_t i = 0; i < nk; i++) {
		kv_mig_out *m = x->ents[i]->mig;
		bool seen = false;
		if (m == NULL)
			continue;
		for (size_t j = 0; j < x->nmigs; j++)
			seen |= x->migs[j] == m;
		if (!seen && x->nmigs == MAX_OP_MIGS) {
			x->res->status = KV_ELIMIT;
			x->res->error = "write spans too many moving ranges";
			return false;
		}
		if (!seen)
			x->migs[x->nmigs++] = m;
	}
	qsort(x->migs, x->nmigs, sizeof(x->migs[0]), mig_id_cmp);
	for (size_t j = 0; j < x->nmigs; j++)
		kv_mig_out_lock(x->migs[j]);
	x->migs_locked = true;
	for (size_t j = 0; j < x->nmigs; j++) {
		if (kv_mig_out_fenced(x->migs[j])) {
			hint_moving(x->res, x->migs[j]);
			return false;
		}
	}
	return true;
}

/* Replication (WRITE, only once some range has in-sync backups here:
 * kv_rs_active): refuses a write to a range whose ISR is below the
 * minimum, else holds the routing table and takes the log tap of the
 * range's backups (x->rop, released in dispatch's undo). */
static bool
step_repl(op_ctx *x, unsigned flags)
{
	const char *why = NULL;
	int rv;

	if (!x->durw || !kv_rs_active(x->s->repl))
		return true;
	if (flags & OPF_MULTI) {
		rv = kv_rs_write_begin(x->s->repl, x->op->keys, x->op->nkeys, &x->rop, &why);
	} else if (flags & OPF_RANGE) {
		kv_bytes from = range_from(x->op);
		rv = kv_rs_write_begin(x->s->repl, &from, 1, &x->rop, &why);
	} else {
		rv = kv_rs_write_begin(x->s->repl, &x->op->key, 1, &x->rop, &why);
	}
	if (rv != 0) {
		x->res->status = rv;
		x->res->error = why;
		return false;
	}
	return true;
}

/* The log (WRITE with a data dir): refuses writes the log cannot take, then
 * enters the barrier and takes the keys' stripes, so that the log holds
 * writes in the store's order. */
static bool
step_log_begin(op_ctx *x, unsigned flags, kv_dur_held *held)
{
	kv_dur *dur = x->s->dur;
	int rv = KV_OK;

	if (!x->durw)
		return true;
	if ((rv = kv_dur_health(dur)) != 0) {
		x->res->status = rv;
		x->res->error = "the write-ahead log cannot be written (disk full or I/O "
		                "error): writes are refused until it can";
		return false;
	}
	if (flags & OPF_RANGE) {
		/* The keys are found only under the lock: exclude every other
		 * apply+log section instead of taking stripes. */
		kv_dur_begin_exclusive(dur);
		held->idx = held->inl;
		held->n = 0;
		return true;
	}
	kv_dur_begin(dur);
	if (flags & OPF_MULTI)
		rv = kv_dur_lock_keys(dur, x->op->keys, x->op->nkeys, held);
	else
		kv_dur_lock_key(dur, x->op->key.p, x->op->key.len, held);
	if (rv != 0) {
		kv_dur_end(dur);
		x->res->status = rv;
		return false;
	}
	return true;
}

/* Counts the keys a get or mget found and did not find, for /metrics
 * (shardkv_server_read_hits_total, shardkv_server_read_misses_total). A
 * failed read (wrong owner, moving, ...) counts in neither. */
static void
count_read(kv_server *s, const kv_op *op, const kv_data_result *res)
{
	uint64_t hits = 0, misses = 0;

	if (op->kind == KV_OP_GET) {
		hits = res->status == KV_OK;
		misses = res->status == KV_ENOTFOUND;
	} else if (op->kind == KV_OP_MGET &&
	           (res->status == KV_OK || res->status == KV_ENOTFOUND)) {
		misses = res->status == KV_ENOTFOUND ? res->nmissing : 0;
		hits = res->nvalues > misses ? res->nvalues - misses : 0;
	}
	if (hits)
		atomic_fetch_add_explicit(&s->read_hits, hits, memory_order_relaxed);
	if (misses)
		atomic_fetch_add_explicit(&s->read_misses, misses, memory_order_relaxed);
}

/*
 * A read waits out the writes of its keys that were between their apply to
 * the store and visible() as it read: a write holds its keys' stripes (a
 * range write the barrier) from before its apply until after it raised
 * visible_lsn (run_op), so taking and releasing each stripe the read's
 * keys hash to (a range read: the barrier's write side) once, after the
 * read, makes the request's later load of visible_lsn cover every write
 * whose effect the read saw, and its reply waits for that write's log and
 * commit point like the writer's own (doc/replication.md "Writes"). Without
 * it a read could answer a value whose write a crash or a failover then
 * took back. Only where replies wait for something: a synced log or
 * in-sync backups.
 */
static void
read_pass(kv_server *s, const kv_op *op, unsigned flags)
{
	kv_dur_held h;

	if (kv_dur_mode(s->dur) == KV_FSYNC_NONE && !kv_rs_active(s->repl))
		return;
	if ((flags & OPF_RANGE) ||
	    ((flags & OPF_MULTI) && kv_dur_lock_keys(s->dur, op->keys, op->nkeys, &h) != 0)) {
		kv_dur_begin_exclusive(s->dur);
		kv_dur_end(s->dur);
		return;
	}
	if (!(flags & OPF_MULTI))
		kv_dur_lock_key(s->dur, op->key.p, op->key.len, &h);
	kv_dur_unlock(s->dur, &h);
}

/* Runs one op: validation, then the steps above (ownership, exactly-once,
 * fence, log), the handler from op_table, and the undo in reverse. */
static void
run_op(kv_server *s, const kv_req *rq, const kv_op *op, const struct op_def *def,
       kv_data_result *res)
{
	op_ctx x = {.s = s, .rq = rq, .op = op, .res = res};
	kv_dur_held held;

	x.durw = s->dur != NULL && (def->flags & OPF_WRITE);
	kv_owner_rdlock(&s->owner);
	if (step_owner_locked(&x, def->flags) && step_dedup(&x, def->flags) &&
	    step_fence(&x, def->flags) && step_repl(&x, def->flags) &&
	    step_log_begin(&x, def->flags, &held)) {
		res->status = def->fn(&x);
		if (x.durw) {
			/* Visible before the stripes go: a read that saw this
			 * write's effect and then passes its key's stripe
			 * (read_pass) loads a visible_lsn that covers it. */
			if (x.lsn != 0)
				visible(s, x.lsn);
			kv_dur_unlock(s->dur, &held);
			kv_dur_end(s->dur);
		} else if (s->dur != NULL && (def->flags & OPF_READ) &&
		           (res->status == KV_OK || res->status == KV_ENOTFOUND)) {
			/* Only a read that read the store: a refused one
			 * revealed nothing. */
			read_pass(s, op, def->flags);
		}
		if (x.dedup_begun && rememberable(res->status)) {
			kv_dedup_result r = {.status = res->status, .value_len = res->value_len};
			kv_bytes k = (def->flags & OPF_MULTI)   ? op->keys[0]
			             : (def->flags & OPF_RANGE) ? range_from(op)
			                                        : op->key;
			if (op->kind == KV_OP_DEL && res->status == 0) {
				r.value = res->value;
				r.has_value = true;
			} else if (op->kind == KV_OP_INCR) {
				r.value_len = x.dd.value_len;
			} else if (op->kind == KV_OP_DELRANGE && res->status == 0) {
				r.value_len = x.dd.value_len;
				r.value = res->next_cursor;
				r.has_value = res->more;
			}
			kv_dedup_finish(s->dedup, rq->client_id, op->request_id, &r, k.p, k.len,
			                x.dd.time_ms);
			x.dedup_begun = false;
		}
	}
	kv_rs_write_end(&x.rop);
	if (x.migs_locked)
		for (size_t j = x.nmigs; j > 0; j--)
			kv_mig_out_unlock(x.migs[j - 1]);
	if (x.dedup_begun)
		kv_dedup_abort(s->dedup, rq->client_id, op->request_id);
	kv_owner_unlock(&s->owner);
	if (x.ents != x.single)
		free(x.ents);
}

/*
 * Before a request's ops run one by one: brings the index paths of the keys
 * of the ops from `from` on (up to KV_STORE_PREFETCH_GROUP of them) into
 * cache at once, so that the ops do not stall on one cache miss after
 * another (kv_store_prefetch). Returns the index of the first op not
 * covered.
 */
static size_t
warm_ops(kv_server *s, const kv_req *rq, size_t from)
{
	kv_bytes keys[KV_STORE_PREFETCH_GROUP];
	size_t n = 0, i;

	for (i = from; i < rq->nops && n < KV_STORE_PREFETCH_GROUP; i++)
		if (rq->ops[i].key.len > 0)
			keys[n++] = rq->ops[i].key;
	kv_store_prefetch(s->store, n, keys);
	return i;
}

/* Runs one op: validation, then run_op. */
static void
dispatch(kv_server *s, const kv_req *rq, const kv_op *op, kv_data_result *res)
{
	const struct op_def *def = &op_table[op->kind];
	int rv;

	atomic_fetch_add_explicit(&s->op_count[op->kind], 1, memory_order_relaxed);
	if (def->fn == NULL) {
		res->error = "operation not supported by this server";
		res->status = KV_EINVAL;
		return;
	}
	if ((rv = validate_op(s, op, def->flags, res)) != 0) {
		res->status = rv;
		return;
	}
	atomic_fetch_add_explicit(&s->ops, op->nkeys ? op->nkeys : 1, memory_order_relaxed);
	kv_srv_load_note(s, op, (def->flags & OPF_WRITE) != 0);
	run_op(s, rq, op, def, res);
}

int
kv_srv_reclaim_key(kv_server *s, const void *key, size_t klen)
{
	kv_req rq = {0};
	kv_op op = {.kind = KV_OP_DEL, .key = {key, klen}};
	kv_data_result res = {0};
	const kv_owner_entry *e;
	bool serving;

	/* A cheap look first: on a backup every expired key is someone else's
	 * to reclaim, and the full refusal builds an owner hint. */
	kv_owner_rdlock(&s->owner);
	e = kv_owner_lookup_locked(&s->owner, key, klen);
	serving = e != NULL && e->state == KV_OWN_SERVE;
	kv_owner_unlock(&s->owner);
	if (!serving)
		return KV_EWRONGOWNER;

	/* Served here and not fenced, like any write: a backup's copy, a range
	 * arriving or one handed over is left to its primary. */
	run_op(s, &rq, &op, &reclaim_def, &res);
	kv_data_result_fini(&res);
	if (res.status == KV_OK)
		atomic_fetch_add_explicit(&s->expired_reclaimed, 1, memory_order_relaxed);
	return res.status;
}

/* Returns the payload bytes of a result, to bound a reply. */
static uint64_t
result_bytes(const kv_data_result *r)
{
	uint64_t n = r->value.len + 64;
	for (size_t i = 0; i < r->nvalues; i++)
		n += r->values[i].len + 4;
	for (size_t i = 0; i < r->nentries; i++)
		n += r->entries[i].key.len + r->entries[i].value.len + 8;
	return n;
}

/* Operations in a request, each key of a multi-key op counted. */
static size_t
batch_size(const kv_req *rq)
{
	size_t n = 0;
	for (size_t i = 0; i < rq->nops; i++)
		n += rq->ops[i].nkeys ? rq->ops[i].nkeys : 1;
	return n;
}

/* A reply held until the log has what the request did (kv_dur_notify). */
typedef struct {
	kv_server *s;      /* the server */
	kv_rpc_pending *p; /* the request */
	nng_msg *msg;      /* the answer when the log succeeds */
	uint64_t req_id;   /* Request.request_id, for the failure answer */
	uint64_t epoch;    /* Response.epoch */
	uint32_t node_id;  /* Response.node_id */
	size_t nops;       /* ops in the request */
	uint64_t t0;       /* kv_now_ns() at receipt */
	unsigned kinds;    /* bit k: the request carried an op of kind k */
	uint64_t repl_lsn; /* then wait until the backups have this lsn; 0: no wait */
	bool repl_failed;  /* the backups' wait failed (timeout or stop) */
	bool wrote;        /* some op put a record in the log */
	bool rack;         /* the answer to a Replicate (kv_rs_handle_nowait) */
	bool logged[];     /* per op: it put a record in the log */
} held_reply;

/* Bit k set for each kv_op_kind k among the request's ops. */
static unsigned
op_kinds(const kv_req *rq)
{
	unsigned kinds = 0;
	for (size_t i = 0; i < rq->nops; i++)
		kinds |= 1u << rq->ops[i].kind;
	return kinds;
}

/* Counts the request received at t0 and answered now in the latency
 * histogram of each op kind it carried (a transfer or ping carries none). */
static void
observe_latency(kv_server *s, unsigned kinds, uint64_t t0)
{
	uint64_t ns;

	if (kinds == 0)
		return;
	ns = kv_now_ns() - t0;
	for (int k = 1; k < KV_OP__COUNT; k++)
		if (kinds & (1u << k))
			kv_lat_hist_observe(&s->op_lat[k], ns);
}

/* Whether op i of the request put a record in the log: a successful write
 * (a retry answered from memory has one from its first attempt). */
static bool
logged_write(const kv_req *rq, const kv_resp *resp, size_t i)
{
	return (op_table[rq->ops[i].kind].flags & OPF_WRITE) && resp->results[i].status == KV_OK;
}

/* The answer when the log failed: ops that logged a record get the log's
 * error (they are applied in memory and the log keeps retrying them, so
 * they may or may not survive a restart); the others shared the reply and
 * get a retryable BUSY. Returns NULL when out of memory. */
static nng_msg *
held_reply_failure(const held_reply *h, int status)
{
	const char *wmsg =
	    h->repl_failed ? "the in-sync backups did not acknowledge the write in time: it may "
	                     "or may not survive a failover"
	                   : "the write-ahead log could not be written: the write "
	                     "may or may not survive a restart";
	const char *omsg = h->repl_failed ? "the reply waited for writes the in-sync backups "
	                                    "have not acknowledged; retry"
	                                  : "the reply was shared with a write the log could not "
	                                    "take; retry";
	kv_data_result *res = kv_zalloc(h->nops ? h->nops : 1, sizeof(*res));
	kv_resp fail = {.request_id = h->req_id, .epoch = h->epoch, .node_id = h->node_id};
	nng_msg *msg = NULL;

	if (res == NULL) {
		fail.status = status;
		fail.error = "the write-ahead log could not be written";
	} else {
		for (size_t i = 0; i < h->nops; i++) {
			res[i].status = h->logged[i] ? status : KV_EBUSY;
			res[i].error = h->logged[i] ? wmsg : omsg;
		}
		fail.results = res;
		fail.nresults = h->nops;
	}
	if (kv_data_resp_encode(&fail, &msg) != 0)
		msg = NULL;
	free(res);
	return msg;
}

static void
held_reply_done(void *arg, int status)
{
	held_reply *h = arg;
	nng_msg *msg = h->msg;

	/* A write in flight when this node lost a range it led with backups
	 * may be missing at the new primary (doc/replication.md "Failover").
	 * So may a write a held read saw: a reply held for the backups
	 * (repl_lsn) that a demotion fence overtook is not sent either, since
	 * the fence drops the records it waited for and so moves the commit
	 * point past writes the new primary never had; its reads fail busy and
	 * the client asks again (doc/replication.md "Primary transfer"). */
	if (status == 0 && (h->wrote || h->repl_lsn != 0) && kv_rs_fenced(h->s->repl, h->t0)) {
		status = KV_ETIMEDOUT;
		h->repl_failed = true;
	}
	if (status != 0 && h->rack) {
		/* The log failed under a Replicate's records: the primary
		 * starts its stream again. */
		kv_resp fail = {
		    .request_id = h->req_id,
		    .epoch = h->epoch,
		    .node_id = h->node_id,
		    .has_rack = true,
		    .rack = {.status = status, .error = "the write-ahead log cannot be written"}};
		nng_msg_free(msg);
		if (kv_data_resp_encode(&fail, &msg) != 0)
			msg = NULL;
	} else if (status != 0 && (h->wrote || h->repl_failed)) {
		nng_msg_free(msg);
		msg = held_reply_failure(h, status);
	}
	kv_rpc_reply(h->p, msg);
	observe_latency(h->s, h->kinds, h->t0);
	atomic_fetch_sub(&h->s->inflight, 1);
	free(h);
}

/* The backups' answer for a held reply (kv_rs_notify). */
static void
held_reply_replicated(void *arg, int status)
{
	held_reply *h = arg;

	h->repl_failed = status != 0;
	held_reply_done(h, status);
}

/* The log's answer for a held reply: then wait for the backups if needed. */
static void
held_reply_logged(void *arg, int status)
{
	held_reply *h = arg;

	if (status != 0 || h->repl_lsn == 0) {
		held_reply_done(h, status);
		return;
	}
	if (kv_rs_notify(h->s->repl, h->repl_lsn, held_reply_replicated, h) != 0)
		held_reply_replicated(h, KV_ECLOSED);
}

int
kv_srv_rpc_handler(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p)
{
	kv_server *s = arg;
	kv_req rq;
	kv_resp resp = {0};
	const char *why = NULL;
	bool wrote = false;
	held_reply *h = NULL;
	uint64_t lsn = 0, rlsn = 0, rack_lsn = 0, t0 = kv_now_ns();
	bool logwait = false, peer_on_loop = false;
	unsigned kinds = 0;
	char lease_why[128];
	int rv;

	/* A transfer or replication message may wait (for the bulk applier,
	 * for its predecessor in the stream, for the log): not on an event
	 * loop, whose other connections would wait with it. A transfer goes
	 * to a worker at once; a Replicate goes there only when it would wait
	 * (kv_rs_handle_nowait). */
	if (!kv_rpc_can_block(p)) {
		int kind = kv_data_req_peer_kind(nng_msg_body(req), nng_msg_len(req));
		if (kind == KV_PEER_TRANSFER)
			return KV_RPC_BLOCKING; /* not even decoded here: chunks are big */
		peer_on_loop = kind == KV_PEER_REPLICATE;
	}
	/* Counted before `closing` is read: shutdown waits for zero after
	 * setting it, so no request can start a log wait it misses. */
	atomic_fetch_add(&s->inflight, 1);
	rv = kv_data_req_decode(nng_msg_body(req), nng_msg_len(req), &rq, &why);
	resp.request_id = rq.request_id;
	resp.epoch = atomic_load(&s->epoch);
	resp.node_id = atomic_load(&s->node_id);
	if (!kv_auth_ok(&s->auth, rq.auth.p, rq.auth.len)) {
		/* First, so that a peer without the secret learns nothing, not
		 * even whether its message decoded, nor the epoch or node id. */
		resp.status = KV_EAUTH;
		resp.error = "missing or wrong auth token (this server requires the cluster's "
		             "--auth-token-file)";
		resp.epoch = 0;
		resp.node_id = 0;
		kv_auth_log_refused(COMP,
		                    rv != 0       ? "undecodable"
		                    : rq.has_xfer ? "transfer"
		                    : rq.has_repl ? "replicate"
		                    : rq.nops > 0 ? "ops"
		                                  : "ping",
		                    req, rq.auth.len);
	} else if (rv != 0) {
		resp.status = rv;
		resp.error = why;
		KV_DEBUG(COMP, "request refused", "err=%s why=\"%s\"", kv_errname(rv),
		         why ? why : "");
	} else if (atomic_load(&s->closing)) {
		resp.status = KV_EUNAVAIL;
		resp.error = "server is stopping";
	} else if (rq.has_xfer) {
		resp.has_ack = true;
		kv_mig_in_handle(s->mig, &rq, &resp.ack);
	} else if (rq.has_repl && peer_on_loop) {
		/* A batch of records that needs no wait is applied here, in the
		 * loop's round, whose end writes its log records; the answer is
		 * held until the log has them (below). The others (a copy step, a
		 * batch ahead of its predecessor) go to a worker. */
		resp.has_rack = true;
		if (kv_rs_handle_nowait(s->repl, &rq, &resp.rack, &rack_lsn) != 0)
			goto blocking;
	} else if (rq.has_repl) {
		resp.has_rack = true;
		/* a round (common/defer.h): the batch's log records do not wake
		 * the log writer; the handler writes them itself before it
		 * waits for them (wait_durable), and the round's end writes
		 * any left */
		kv_defer_begin();
		kv_rs_handle(s->repl, &rq, &resp.rack);
		kv_defer_end();
	} else if (rq.nops > 0 && resp.epoch == 0) {
		resp.status = KV_EUNAVAIL;
		resp.error = "server has no configuration yet";
	} else if (rq.nops > 0 && !kv_srv_lease_ok(s, lease_why, sizeof(lease_why))) {
		/* Reads and writes need the lease (doc/contract.md §2): without it
		 * the controller may have given the ranges away. Transfers this
		 * node receives (above) do not. */
		resp.status = KV_EUNAVAIL;
		resp.error = lease_why;
	} else if (rq.nops > 0 && batch_size(&rq) > s->max_batch) {
		resp.status = KV_ELIMIT;
		resp.error = "too many operations in one request (--max-batch)";
	} else if (rq.nops > 0) {
		uint64_t total = 0;
		kinds = op_kinds(&rq);
		resp.results = res_take(rq.nops);
		if (resp.results == NULL) {
			resp.status = KV_ENOMEM;
		} else {
			resp.nresults = rq.nops;
			for (size_t i = 0, warm = 0; i < rq.nops; i++) {
				if (i == warm)
					warm = warm_ops(s, &rq, i);
				if (total > REPLY_MAX_BYTES) {
					resp.results[i].status = KV_ELIMIT;
					resp.results[i].error = "reply too large; send fewer ops";
					kv_srv_count_error(s, KV_ELIMIT);
					continue;
				}
				dispatch(s, &rq, &rq.ops[i], &resp.results[i]);
				kv_srv_count_error(s, resp.results[i].status);
				count_read(s, &rq.ops[i], &resp.results[i]);
				total += result_bytes(&resp.results[i]);
				wrote |= logged_write(&rq, &resp, i);
			}
		}
	}
	kv_srv_count_error(s, resp.status);
	rv = kv_data_resp_encode(&resp, reply);
	if (rv != 0) {
		kv_resp small = {.request_id = resp.request_id,
		                 .epoch = resp.epoch,
		                 .node_id = resp.node_id,
		                 .status = KV_ENOMEM,
		                 .error = "out of memory encoding the reply"};
		rv = kv_data_resp_encode(&small, reply);
	}
	/* Answer only once the log holds everything this request may have
	 * seen or done: its own writes, and writes by others it read (so no
	 * reply reveals a write a crash could still take back). Only client
	 * writes count: an incoming transfer's records are synced before the
	 * range is served, so a copy in progress holds up no reply. A log that
	 * is failing does not hold up reads. The common cases (--fsync none,
	 * or the log already there) allocate nothing. */
	if (s->dur && rv == 0 && resp.nresults > 0 && kv_dur_mode(s->dur) != KV_FSYNC_NONE)
		lsn = atomic_load(&s->visible_lsn);
	logwait =
	    lsn > 0 && lsn > kv_dur_durable_lsn(s->dur) && (wrote || kv_dur_health(s->dur) == 0);
	if (rv == 0 && rack_lsn > 0 && rack_lsn > kv_dur_durable_lsn(s->dur)) {
		lsn = rack_lsn;
		logwait = true;
	}
	/* With in-sync backups, also until the commit point covers it
	 * (doc/replication.md "Writes"): one atomic load when no range here
	 * has backups. */
	if (rv == 0 && resp.nresults > 0 && kv_rs_active(s->repl)) {
		uint64_t v = atomic_load(&s->visible_lsn);
		/* Not covered with nothing written here yet: a reconciliation
		 * after a failover is in progress (kv_rs_covered). A demotion
		 * fence since t0 holds every reply, reads too, so that
		 * held_reply_done fails it: the fence may have moved the commit
		 * point past writes this request saw and the new primary lacks. */
		if (!kv_rs_covered(s->repl, v) || kv_rs_fenced(s->repl, t0))
			rlsn = v ? v : 1;
	}
	if (logwait || rlsn > 0) {
		h = kv_zalloc(1, sizeof(*h) + resp.nresults * sizeof(bool));
		if (h != NULL) {
			*h = (held_reply){.s = s,
			                  .p = p,
			                  .msg = *reply,
			                  .wrote = wrote,
			                  .nops = resp.nresults,
			                  .req_id = resp.request_id,
			                  .epoch = resp.epoch,
			                  .node_id = resp.node_id,
			                  .t0 = t0,
			                  .repl_lsn = rlsn,
			                  .rack = rack_lsn > 0,
			                  .kinds = kinds};
			for (size_t i = 0; i < resp.nresults; i++)
				h->logged[i] = logged_write(&rq, &resp, i);
			*reply = NULL;
		} else {
			nng_msg_free(*reply);
			*reply = NULL;
			kv_resp small = {.request_id = resp.request_id,
			                 .epoch = resp.epoch,
			                 .node_id = resp.node_id,
			                 .status = KV_ENOMEM,
			                 .error = "out of memory holding the reply"};
			rv = kv_data_resp_encode(&small, reply);
		}
	}
	if (resp.results != NULL)
		res_give(resp.results, resp.nresults);
	kv_data_req_fini(&rq);
	if (h != NULL) {
		if (!logwait)
			held_reply_logged(h, KV_OK);
		else if (kv_dur_notify(s->dur, lsn, held_reply_logged, h) != 0)
			held_reply_done(h, KV_ECLOSED);
		return KV_RPC_DEFERRED;
	}
	observe_latency(s, kinds, t0);
	atomic_fetch_sub(&s->inflight, 1);
	return rv;

blocking:
	/* On an event loop, for a peer's message that may wait: again on a
	 * worker, from the start. */
	kv_data_req_fini(&rq);
	atomic_fetch_sub(&s->inflight, 1);
	return KV_RPC_BLOCKING;
}
