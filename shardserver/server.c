/*
 * server.c - the shard server daemon: request dispatch, configuration
 * following, heartbeats, the node file and the process life cycle.
 *
 * DESIGN. Threads: nng's worker threads run the request handler
 * (rpc_handler) for up to `contexts` requests at once and execute ops
 * directly against the store, so every core serves requests without a
 * hand-off (striped store: partition locks; percore store: the store hands
 * each op to its partition owner). One watch thread registers with the
 * controller and keeps one Watch(history) long poll outstanding, applying
 * configurations strictly in epoch order. One heartbeat thread reports
 * statistics every second. Each outgoing migration has its own thread
 * (migrate.c); incoming transfer messages are applied on the nng thread that
 * receives them and never wait for another server. With --metrics, one
 * thread answers scrapes (metrics_srv.c). The main thread waits for
 * SIGTERM/SIGINT (blocked everywhere, taken with sigtimedwait); on SIGTERM
 * it runs the graceful leave (drain, then exit), on SIGINT it stops at once
 * and keeps its ranges for a restart.
 *
 * Ownership is decided by the local ownership table (owner.h), not by the
 * epoch: the dispatcher looks every key of a KEYED/MULTI/RANGE op up once,
 * with the table's read lock held for the whole op, so a handover (write
 * lock) never overlaps an op on the old owner. Writes to a range with an
 * outgoing migration also take that migration's mutex, which orders them
 * with the fence and appends them to the migration's delta buffer; ranges
 * that are not moving take no lock of ours beyond the read lock.
 *
 * Lock order: server_int.h. This module does not implement the transfer
 * stream itself (migrate.c) nor touch protobuf (server_codec.c).
 */
#include "shardserver/server.h"
#include "common/auth.h"
#include "common/err.h"
#include "common/log.h"
#include "shardserver/server_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define COMP "server"

/* Defaults and bounds of the data path. */
#define SCAN_DEFAULT_LIMIT 1000u
#define SCAN_MAX_LIMIT     10000u
#define SCAN_DEFAULT_BYTES (4u * 1024u * 1024u)
#define SCAN_MAX_BYTES     (64u * 1024u * 1024u)
#define REPLY_MAX_BYTES    (64u * 1024u * 1024u)

/* ------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------ */

uint64_t
kv_server__unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void
kv_server__nap(kv_server *s, unsigned ms)
{
	while (ms > 0 && !atomic_load(&s->stopping)) {
		unsigned step = ms < 20 ? ms : 20;
		struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)step * 1000000L};
		nanosleep(&ts, NULL);
		ms -= step;
	}
}

static uint64_t
rand64(void)
{
	uint64_t v = 0;
	if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
		v = kv_now_ns() ^ ((uint64_t)getpid() << 32);
	return v ? v : 1;
}

/* ------------------------------------------------------------------------
 * Node file: the identity that survives a restart.
 *
 *   offset  size  field
 *   0       4     magic "SKVN"
 *   4       4     format version, 1 (little endian, as every integer here)
 *   8       4     node id
 *   12      4     cluster id length n (< 128)
 *   16      n     cluster id bytes
 *   16+n    8     xxh3-64 of bytes [0, 16+n)
 *
 * Written to node.id.tmp, fsynced, renamed over node.id, directory fsynced.
 * ------------------------------------------------------------------------ */

#define NODEFILE_MAGIC   "SKVN"
#define NODEFILE_VERSION 1u

static void
put32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t
get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void
put64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t
get64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* Reads the node file. Returns 0 (found), KV_ENOTFOUND (first start),
 * KV_ECORRUPT or KV_EIO. */
static int
kv_nodefile_load(const char *dir, uint32_t *id, char *cluster, size_t clen)
{
	char path[4096];
	uint8_t buf[16 + 128 + 8];
	ssize_t n;
	int fd, rv = KV_ECORRUPT;

	snprintf(path, sizeof(path), "%s/node.id", dir);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return errno == ENOENT ? KV_ENOTFOUND : KV_EIO;
	n = read(fd, buf, sizeof(buf));
	close(fd);
	if (n < 24 || memcmp(buf, NODEFILE_MAGIC, 4) != 0 || get32(buf + 4) != NODEFILE_VERSION)
		return rv;
	uint32_t cl = get32(buf + 12);
	if (cl >= 128 || (size_t)n != 16 + cl + 8 || cl >= clen)
		return rv;
	if (get64(buf + 16 + cl) != kv_hash64(buf, 16 + cl))
		return rv;
	*id = get32(buf + 8);
	memcpy(cluster, buf + 16, cl);
	cluster[cl] = '\0';
	return KV_OK;
}

/* Writes the node file atomically. Returns 0 or KV_EIO/KV_ENOSPC/KV_EPERM. */
static int
kv_nodefile_save(const char *dir, uint32_t id, const char *cluster)
{
	char path[4096], tmp[4096];
	uint8_t buf[16 + 128 + 8];
	size_t cl = strlen(cluster), n;
	int fd, rv = KV_OK;

	if (cl >= 128)
		cl = 127;
	memcpy(buf, NODEFILE_MAGIC, 4);
	put32(buf + 4, NODEFILE_VERSION);
	put32(buf + 8, id);
	put32(buf + 12, (uint32_t)cl);
	memcpy(buf + 16, cluster, cl);
	put64(buf + 16 + cl, kv_hash64(buf, 16 + cl));
	n = 16 + cl + 8;
	snprintf(path, sizeof(path), "%s/node.id", dir);
	snprintf(tmp, sizeof(tmp), "%s/node.id.tmp", dir);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0)
		return kv_err_from_errno(errno);
	if (write(fd, buf, n) != (ssize_t)n || fsync(fd) != 0)
		rv = kv_err_from_errno(errno ? errno : EIO);
	close(fd);
	if (rv == 0 && rename(tmp, path) != 0)
		rv = kv_err_from_errno(errno);
	if (rv == 0 && (fd = open(dir, O_RDONLY | O_DIRECTORY)) >= 0) {
		fsync(fd);
		close(fd);
	}
	return rv;
}

/* ------------------------------------------------------------------------
 * Controller calls
 * ------------------------------------------------------------------------ */

int
kv_server__ctl_call(kv_server *s, kv_adm_req *rq, kv_adm_resp *resp, uint32_t timeout_ms)
{
	int rv = KV_EUNAVAIL;

	rq->client_id = s->admin_client_id;
	rq->auth = kv_server__auth(s);
	for (size_t attempt = 0; attempt < s->cfg->nctl; attempt++) {
		nng_msg *req = NULL, *rep = NULL;
		size_t idx;

		pthread_mutex_lock(&s->ctl_mu);
		idx = s->ctl_idx;
		pthread_mutex_unlock(&s->ctl_mu);
		rq->request_id = atomic_fetch_add(&s->admin_req_id, 1);
		if ((rv = kv_sc_adm_encode(rq, &req)) != 0)
			return rv;
		rv = kv_rpc_call(s->ctl[idx], req, &rep, timeout_ms);
		if (rv == 0) {
			rv = kv_sc_adm_decode(nng_msg_body(rep), nng_msg_len(rep), resp);
			nng_msg_free(rep);
			/* A follower answers NOT_LEADER, which reads as EUNAVAIL. */
			if (rv == 0 && !(resp->status == KV_EUNAVAIL && s->cfg->nctl > 1))
				return KV_OK;
			if (rv == 0) {
				kv_sc_adm_resp_fini(resp);
				rv = KV_EUNAVAIL;
			}
		}
		pthread_mutex_lock(&s->ctl_mu);
		if (s->ctl_idx == idx)
			s->ctl_idx = (idx + 1) % s->cfg->nctl;
		pthread_mutex_unlock(&s->ctl_mu);
		if (rv == KV_ETIMEDOUT && rq->kind == KV_ADM_WATCH)
			return rv;
	}
	return rv;
}

/* ------------------------------------------------------------------------
 * Owner hints
 * ------------------------------------------------------------------------ */

static void
hint_set(kv_sc_result *res, int status, uint64_t epoch, const void *st, size_t sl, const void *en,
         size_t el, uint32_t node, const char *addr)
{
	res->status = status;
	res->has_hint = true;
	res->hint.epoch = epoch;
	res->hint.node_id = node;
	snprintf(res->hint.address, sizeof(res->hint.address), "%s", addr ? addr : "");
	if (kv_buf_set(&res->hint.start, st, sl) != 0 || kv_buf_set(&res->hint.end, en, el) != 0)
		res->has_hint = false;
}

/* Fills a WRONG_OWNER answer from the latest configuration. */
static void
hint_from_config(kv_server *s, const void *key, size_t klen, kv_sc_result *res)
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
hint_moving(kv_sc_result *res, const kv_mig_out *m)
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
                 kv_sc_result *res)
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
	kv_server *s;                  /* the server */
	const kv_req *rq;              /* the request */
	const kv_op *op;               /* the op */
	kv_sc_result *res;             /* its result */
	const kv_owner_entry *ent;     /* KEYED/RANGE: the entry serving the key */
	const kv_owner_entry **ents;   /* MULTI: one entry per key */
	kv_mig_out *migs[MAX_OP_MIGS]; /* WRITE: locked outgoing migrations */
	size_t nmigs;                  /* entries in migs */
	bool has_dd;                   /* DEDUP: the op has (client, request) ids */
	kv_mig_dedup dd;               /* ... the fields for log and delta records */
	uint64_t lsn;                  /* WRITE: the log record's lsn; 0: none */
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

/* Records a write to key for its migration, if it has one. */
static void
record(op_ctx *x, const kv_owner_entry *e, const void *key, size_t klen, const void *val,
       size_t vlen, bool with_dedup)
{
	if (e == NULL || e->mig == NULL)
		return;
	kv_mig_out_record_locked(e->mig, key, klen, val, vlen,
	                         with_dedup && x->has_dd ? &x->dd : NULL);
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
	int rv = kv_store_put(x->s->store, op->key.p, op->key.len, op->value.p, op->value.len);
	if (rv != 0)
		return rv;
	record(x, x->ent, op->key.p, op->key.len, op->value.p, op->value.len, true);
	if (x->s->dur)
		rv = kv_dur_log_put(x->s->dur, op->key.p, op->key.len, op->value.p, op->value.len,
		                    dur_dd(x, &dd), &x->lsn);
	return rv;
}

static int
op_del(op_ctx *x)
{
	const kv_op *op = x->op;
	kv_dur_dedup dd;
	int rv = kv_store_del(x->s->store, op->key.p, op->key.len, &x->res->value);
	if (rv != 0)
		return rv;
	x->res->has_value = !op->no_value;
	record(x, x->ent, op->key.p, op->key.len, NULL, 0, true);
	if (x->s->dur)
		rv = kv_dur_log_del(x->s->dur, op->key.p, op->key.len, dur_dd(x, &dd), &x->lsn);
	return rv;
}

static int
op_append(op_ctx *x)
{
	const kv_op *op = x->op;
	size_t newlen = 0;
	int rv = kv_store_append(x->s->store, op->key.p, op->key.len, op->value.p, op->value.len,
	                         &newlen);
	if (rv != 0)
		return rv;
	x->res->value_len = newlen;
	x->dd.value_len = newlen;
	if (x->ent->mig != NULL || x->s->dur) {
		/* Deltas and log records carry the whole value; the migration mutex
		 * and the key's stripe keep it current. */
		kv_buf v = {0};
		kv_dur_dedup dd;
		rv = kv_store_get(x->s->store, op->key.p, op->key.len, &v);
		if (rv == 0) {
			const uint8_t *vp = v.data ? v.data : (const uint8_t *)"";
			record(x, x->ent, op->key.p, op->key.len, vp, v.len, true);
			if (x->s->dur)
				rv = kv_dur_log_put(x->s->dur, op->key.p, op->key.len, vp, v.len,
				                    dur_dd(x, &dd), &x->lsn);
		}
		kv_buf_fini(&v);
	}
	return rv;
}

static int
op_mget(op_ctx *x)
{
	const kv_op *op = x->op;
	kv_sc_result *r = x->res;
	bool *missing = NULL;
	int rv;

	r->values = calloc(op->nkeys, sizeof(kv_buf));
	missing = calloc(op->nkeys, sizeof(bool));
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
		r->missing = calloc(nm ? nm : 1, sizeof(uint32_t));
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
	int rv = kv_store_mput(x->s->store, op->nkeys, op->keys, op->nvals, op->vals);
	if (rv != 0)
		return rv;
	if (x->nmigs > 0)
		for (size_t i = 0; i < op->nkeys; i++)
			record(x, x->ents[i], op->keys[i].p, op->keys[i].len,
			       op->vals[i].p ? op->vals[i].p : (const uint8_t *)"", op->vals[i].len,
			       i == 0);
	if (x->s->dur)
		rv = kv_dur_log_mput(x->s->dur, op->nkeys, op->keys, op->vals, dur_dd(x, &dd),
		                     &x->lsn);
	return rv;
}

/* Collects scan entries up to a byte bound. */
typedef struct {
	kv_sc_result *res;  /* where entries go */
	size_t cap;         /* capacity of res->entries */
	uint64_t bytes;     /* payload so far */
	uint64_t max_bytes; /* stop after this much */
	bool stopped;       /* stopped on the byte bound */
	bool oom;           /* allocation failed */
} scan_acc;

static int
scan_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	scan_acc *a = arg;
	kv_sc_result *r = a->res;

	if (r->nentries == a->cap) {
		size_t nc = a->cap ? a->cap * 2 : 64;
		kv_sc_entry *ne = realloc(r->entries, nc * sizeof(*ne));
		if (ne == NULL) {
			a->oom = true;
			return 1;
		}
		memset(ne + a->cap, 0, (nc - a->cap) * sizeof(*ne));
		r->entries = ne;
		a->cap = nc;
	}
	kv_sc_entry *e = &r->entries[r->nentries];
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
	kv_sc_result *r = x->res;
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

static const struct op_def {
	const char *name; /* for logs */
	unsigned flags;   /* OPF_* */
	op_fn fn;         /* the handler */
} op_table[KV_OP__COUNT] = {
    [KV_OP_GET] = {"get", OPF_READ | OPF_KEYED, op_get},
    [KV_OP_PUT] = {"put", OPF_WRITE | OPF_KEYED | OPF_DEDUP, op_put},
    [KV_OP_DEL] = {"del", OPF_WRITE | OPF_KEYED | OPF_DEDUP, op_del},
    [KV_OP_APPEND] = {"append", OPF_WRITE | OPF_KEYED | OPF_DEDUP, op_append},
    [KV_OP_MGET] = {"mget", OPF_READ | OPF_MULTI, op_mget},
    [KV_OP_MPUT] = {"mput", OPF_WRITE | OPF_MULTI | OPF_DEDUP, op_mput},
    [KV_OP_SCAN] = {"scan", OPF_READ | OPF_RANGE, op_scan},
};

/* Checks sizes against the configured limits. Returns 0 or fills res. */
static int
validate_op(kv_server *s, const kv_op *op, unsigned flags, kv_sc_result *res)
{
	if (flags & OPF_KEYED) {
		if (op->key.len == 0) {
			res->error = "empty key";
			return KV_EINVAL;
		}
		if (op->key.len > s->max_key || op->value.len > s->max_value) {
			res->error = "key or value over the configured limit";
			return KV_ETOOBIG;
		}
	}
	if ((flags & OPF_WRITE) && op->kind != KV_OP_DEL && s->cfg->max_memory != 0 &&
	    kv_store_mem_used(s->store) >= s->cfg->max_memory) {
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

/* Runs one op: validation, ownership, exactly-once, fence, handler. */
static void
dispatch(kv_server *s, const kv_req *rq, const kv_op *op, kv_sc_result *res)
{
	const struct op_def *def = &op_table[op->kind];
	op_ctx x = {.s = s, .rq = rq, .op = op, .res = res};
	bool dedup = false, owned = true;
	const kv_owner_entry *single[1];
	bool durw = s->dur != NULL && (def->flags & OPF_WRITE);
	kv_dur_held held;
	int rv;

	atomic_fetch_add_explicit(&s->op_count[op->kind], 1, memory_order_relaxed);
	if ((rv = validate_op(s, op, def->flags, res)) != 0) {
		res->status = rv;
		return;
	}
	atomic_fetch_add_explicit(&s->ops, op->nkeys ? op->nkeys : 1, memory_order_relaxed);
	kv_owner_rdlock(&s->owner);
	if (def->flags & OPF_KEYED) {
		owned = own_check_locked(s, op->key.p, op->key.len, &x.ent, res);
		single[0] = x.ent;
		x.ents = single;
	} else if (def->flags & OPF_RANGE) {
		kv_bytes from = op->cursor.len ? op->cursor : op->start;
		if (op->prefix.len &&
		    kv_key_cmp(from.p, from.len, op->prefix.p, op->prefix.len) < 0)
			from = op->prefix;
		owned = own_check_locked(s, from.p, from.len, &x.ent, res);
	} else if (def->flags & OPF_MULTI) {
		x.ents = calloc(op->nkeys, sizeof(*x.ents));
		if (x.ents == NULL) {
			res->status = KV_ENOMEM;
			goto unlock;
		}
		for (size_t i = 0; i < op->nkeys && owned; i++)
			owned =
			    own_check_locked(s, op->keys[i].p, op->keys[i].len, &x.ents[i], res);
		if (!owned)
			res->error = "a key of the multi-key op is not served here";
	}
	if (!owned)
		goto unlock;
	if ((def->flags & OPF_DEDUP) && rq->client_id != 0 && op->request_id != 0) {
		kv_dedup_result old;
		uint64_t now = kv_server__unix_ms();
		rv = kv_dedup_begin(s->dedup, rq->client_id, op->request_id, now, &old);
		if (rv == 0) {
			res->status = old.status;
			res->value_len = old.value_len;
			if (op->kind == KV_OP_DEL && old.status == 0 && !op->no_value) {
				res->value = old.value;
				res->has_value = true;
			} else {
				kv_buf_fini(&old.value);
			}
			goto unlock;
		}
		if (rv != KV_ENOTFOUND) {
			res->status = rv;
			res->error =
			    rv == KV_EBUSY ? "the first attempt is still in progress" : NULL;
			goto unlock;
		}
		dedup = true;
		x.has_dd = true;
		x.dd.client = rq->client_id;
		x.dd.req = op->request_id;
		x.dd.time_ms = now;
	}
	if (def->flags & OPF_WRITE) {
		size_t nk = (def->flags & OPF_MULTI) ? op->nkeys : 1;
		for (size_t i = 0; i < nk; i++) {
			kv_mig_out *m = x.ents[i]->mig;
			bool seen = false;
			if (m == NULL)
				continue;
			for (size_t j = 0; j < x.nmigs; j++)
				seen |= x.migs[j] == m;
			if (!seen && x.nmigs == MAX_OP_MIGS) {
				res->status = KV_ELIMIT;
				res->error = "write spans too many moving ranges";
				goto undo_dedup;
			}
			if (!seen)
				x.migs[x.nmigs++] = m;
		}
		qsort(x.migs, x.nmigs, sizeof(x.migs[0]), mig_id_cmp);
		for (size_t j = 0; j < x.nmigs; j++)
			kv_mig_out_lock(x.migs[j]);
		for (size_t j = 0; j < x.nmigs; j++) {
			if (kv_mig_out_fenced(x.migs[j])) {
				hint_moving(res, x.migs[j]);
				goto unlock_migs;
			}
		}
	}
	if (durw) {
		/* Refuse writes the log cannot take; then apply and log under the
		 * key stripes so the log holds them in the store's order. */
		if ((rv = kv_dur_health(s->dur)) != 0) {
			res->status = rv;
			res->error = "the write-ahead log cannot be written (disk full or I/O "
			             "error): writes are refused until it can";
			goto unlock_migs;
		}
		kv_dur_begin(s->dur);
		if (def->flags & OPF_MULTI)
			rv = kv_dur_lock_keys(s->dur, op->keys, op->nkeys, &held);
		else
			kv_dur_lock_key(s->dur, op->key.p, op->key.len, &held);
		if (rv != 0) {
			kv_dur_end(s->dur);
			res->status = rv;
			goto unlock_migs;
		}
	}
	res->status = def->fn(&x);
	if (durw) {
		kv_dur_unlock(s->dur, &held);
		kv_dur_end(s->dur);
		if (x.lsn != 0)
			visible(s, x.lsn);
	}
	if (dedup && rememberable(res->status)) {
		kv_dedup_result r = {.status = res->status, .value_len = res->value_len};
		if (op->kind == KV_OP_DEL && res->status == 0)
			r.value = res->value;
		const void *k = (def->flags & OPF_MULTI) ? op->keys[0].p : op->key.p;
		size_t kl = (def->flags & OPF_MULTI) ? op->keys[0].len : op->key.len;
		kv_dedup_finish(s->dedup, rq->client_id, op->request_id, &r, k, kl, x.dd.time_ms);
		dedup = false;
	}
unlock_migs:
	for (size_t j = x.nmigs; j > 0; j--)
		kv_mig_out_unlock(x.migs[j - 1]);
undo_dedup:
	if (dedup)
		kv_dedup_abort(s->dedup, rq->client_id, op->request_id);
unlock:
	kv_owner_unlock(&s->owner);
	if (x.ents != single)
		free(x.ents);
}

/* Returns the payload bytes of a result, to bound a reply. */
static uint64_t
result_bytes(const kv_sc_result *r)
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
	bool wrote;        /* some op put a record in the log */
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
	kv_sc_result *res = calloc(h->nops ? h->nops : 1, sizeof(*res));
	kv_resp fail = {.request_id = h->req_id, .epoch = h->epoch, .node_id = h->node_id};
	nng_msg *msg = NULL;

	if (res == NULL) {
		fail.status = status;
		fail.error = "the write-ahead log could not be written";
	} else {
		for (size_t i = 0; i < h->nops; i++) {
			res[i].status = h->logged[i] ? status : KV_EBUSY;
			res[i].error = h->logged[i]
			                   ? "the write-ahead log could not be written: the write "
			                     "may or may not survive a restart"
			                   : "the reply was shared with a write the log could not "
			                     "take; retry";
		}
		fail.results = res;
		fail.nresults = h->nops;
	}
	if (kv_sc_resp_encode(&fail, &msg) != 0)
		msg = NULL;
	free(res);
	return msg;
}

static void
held_reply_done(void *arg, int status)
{
	held_reply *h = arg;
	nng_msg *msg = h->msg;

	if (status != 0 && h->wrote) {
		nng_msg_free(msg);
		msg = held_reply_failure(h, status);
	}
	kv_rpc_reply(h->p, msg);
	observe_latency(h->s, h->kinds, h->t0);
	atomic_fetch_sub(&h->s->inflight, 1);
	free(h);
}

static int
rpc_handler(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p)
{
	kv_server *s = arg;
	kv_req rq;
	kv_resp resp = {0};
	const char *why = NULL;
	bool wrote = false;
	held_reply *h = NULL;
	uint64_t lsn = 0, t0 = kv_now_ns();
	unsigned kinds = 0;
	int rv;

	/* Counted before `closing` is read: shutdown waits for zero after
	 * setting it, so no request can start a log wait it misses. */
	atomic_fetch_add(&s->inflight, 1);
	rv = kv_sc_req_decode(nng_msg_body(req), nng_msg_len(req), &rq, &why);
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
	} else if (rq.nops > 0 && resp.epoch == 0) {
		resp.status = KV_EUNAVAIL;
		resp.error = "server has no configuration yet";
	} else if (rq.nops > 0 && batch_size(&rq) > s->max_batch) {
		resp.status = KV_ELIMIT;
		resp.error = "too many operations in one request (--max-batch)";
	} else if (rq.nops > 0) {
		uint64_t total = 0;
		kinds = op_kinds(&rq);
		resp.results = calloc(rq.nops, sizeof(kv_sc_result));
		if (resp.results == NULL) {
			resp.status = KV_ENOMEM;
		} else {
			resp.nresults = rq.nops;
			for (size_t i = 0; i < rq.nops; i++) {
				if (total > REPLY_MAX_BYTES) {
					resp.results[i].status = KV_ELIMIT;
					resp.results[i].error = "reply too large; send fewer ops";
					kv_srv_count_error(s, KV_ELIMIT);
					continue;
				}
				dispatch(s, &rq, &rq.ops[i], &resp.results[i]);
				kv_srv_count_error(s, resp.results[i].status);
				total += result_bytes(&resp.results[i]);
				wrote |= logged_write(&rq, &resp, i);
			}
		}
	}
	kv_srv_count_error(s, resp.status);
	rv = kv_sc_resp_encode(&resp, reply);
	if (rv != 0) {
		kv_resp small = {.request_id = resp.request_id,
		                 .epoch = resp.epoch,
		                 .node_id = resp.node_id,
		                 .status = KV_ENOMEM,
		                 .error = "out of memory encoding the reply"};
		rv = kv_sc_resp_encode(&small, reply);
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
	if (lsn > 0 && lsn > kv_dur_durable_lsn(s->dur) && (wrote || kv_dur_health(s->dur) == 0)) {
		h = calloc(1, sizeof(*h) + resp.nresults * sizeof(bool));
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
			rv = kv_sc_resp_encode(&small, reply);
		}
	}
	for (size_t i = 0; i < resp.nresults; i++)
		kv_sc_result_fini(&resp.results[i]);
	free(resp.results);
	kv_sc_req_fini(&rq);
	if (h != NULL) {
		if (kv_dur_notify(s->dur, lsn, held_reply_done, h) != 0)
			held_reply_done(h, KV_ECLOSED);
		return KV_RPC_DEFERRED;
	}
	observe_latency(s, kinds, t0);
	atomic_fetch_sub(&s->inflight, 1);
	return rv;
}

/* ------------------------------------------------------------------------
 * Configuration following
 * ------------------------------------------------------------------------ */

/* Splits the pieces (pairs in p, *n of them, capacity cap) by removing [s, e). */
static int
pieces_subtract(kv_buf *p, size_t *n, size_t cap, const kv_buf *s, const kv_buf *e)
{
	size_t cnt = *n;
	for (size_t i = 0; i < cnt; i++) {
		kv_buf *ps = &p[2 * i], *pe = &p[2 * i + 1];
		bool before = e->len && kv_key_cmp(ps->data, ps->len, e->data, e->len) >= 0;
		bool after = pe->len && kv_key_cmp(s->data, s->len, pe->data, pe->len) >= 0;
		if (before || after || kv_range_is_empty(ps->data, ps->len, pe->data, pe->len))
			continue;
		/* right remainder [e, pe) */
		if (e->len &&
		    (pe->len == 0 || kv_key_cmp(e->data, e->len, pe->data, pe->len) < 0)) {
			if (*n >= cap)
				return KV_ENOMEM;
			if (kv_buf_set(&p[2 * *n], e->data, e->len) != 0 ||
			    kv_buf_set(&p[2 * *n + 1], pe->data, pe->len) != 0)
				return KV_ENOMEM;
			(*n)++;
		}
		/* left remainder [ps, s), or nothing */
		if (kv_key_cmp(ps->data, ps->len, s->data, s->len) < 0) {
			if (kv_buf_set(pe, s->data, s->len) != 0)
				return KV_ENOMEM;
		} else {
			/* empty piece: make it [x, x) */
			if (kv_buf_set(pe, ps->data, ps->len) != 0)
				return KV_ENOMEM;
			if (pe->len == 0 && kv_buf_set(pe, "\0", 1) == 0 &&
			    kv_buf_set(ps, "\0", 1) != 0)
				return KV_ENOMEM;
		}
	}
	return KV_OK;
}

static bool
mig_listed(const kv_config *c, uint64_t id)
{
	for (size_t i = 0; i < c->nmigs; i++)
		if (c->migs[i].id == id)
			return true;
	return false;
}

static void
save_identity(kv_server *s)
{
	char cid[128];
	int rv;

	pthread_mutex_lock(&s->cfg_mu);
	memcpy(cid, s->cluster_id, sizeof(cid));
	pthread_mutex_unlock(&s->cfg_mu);
	rv = kv_nodefile_save(s->cfg->data_dir, atomic_load(&s->node_id), cid);
	if (rv != 0)
		KV_ERROR(COMP, "cannot write node file", "dir=%s err=%s", s->cfg->data_dir,
		         kv_errname(rv));
}

/* Applies one configuration (takes c). Called only by the watch thread. */
static void
apply_config(kv_server *s, kv_config *c)
{
	uint32_t me = atomic_load(&s->node_id);
	uint64_t *drop = NULL;
	size_t ndrop = 0;
	bool new_cluster = false;

	if (c->epoch <= atomic_load(&s->epoch)) {
		kv_config_free(c);
		return;
	}
	/* 1. Incoming streams the configuration no longer lists are forgotten. */
	kv_owner_rdlock(&s->owner);
	drop = calloc(s->owner.n + 1, sizeof(*drop));
	for (size_t i = 0; drop && i < s->owner.n; i++) {
		const kv_owner_entry *e = &s->owner.e[i];
		if (e->state == KV_OWN_INCOMING && !mig_listed(c, e->mig_id))
			drop[ndrop++] = e->mig_id;
	}
	kv_owner_unlock(&s->owner);
	for (size_t i = 0; i < ndrop; i++)
		kv_mig_in_forget(s->mig, drop[i]);
	free(drop);
	/* 2. Migrations into this node: MOVING until their commit. */
	for (size_t i = 0; i < c->nmigs; i++) {
		const kv_migration *m = &c->migs[i];
		const kv_node *src = kv_config_node(c, m->from);
		if (m->to != me)
			continue;
		kv_owner_fill(&s->owner, m->start.data, m->start.len, m->end.data, m->end.len,
		              KV_OWN_INCOMING, m->from, src ? src->address : NULL, 0, m->id);
	}
	/* 3. The initial assignment: ranges of the map owned here, minus ranges
	 * arriving by migration. */
	for (size_t i = 0; i < c->nranges; i++) {
		const kv_range *r = &c->ranges[i];
		size_t cap = 2 * c->nmigs + 2, n = 1;
		kv_buf *p;
		if (r->node != me)
			continue;
		p = calloc(2 * cap, sizeof(kv_buf));
		if (p == NULL || kv_buf_set(&p[0], r->start.data, r->start.len) != 0 ||
		    kv_buf_set(&p[1], r->end.data, r->end.len) != 0) {
			kv_owner_ranges_free(p, cap);
			KV_ERROR(COMP, "out of memory applying config", "epoch=%llu",
			         (unsigned long long)c->epoch);
			continue;
		}
		for (size_t j = 0; j < c->nmigs; j++)
			if (c->migs[j].to == me)
				pieces_subtract(p, &n, cap, &c->migs[j].start, &c->migs[j].end);
		for (size_t j = 0; j < n; j++)
			if (!kv_range_is_empty(p[2 * j].data, p[2 * j].len, p[2 * j + 1].data,
			                       p[2 * j + 1].len))
				kv_owner_fill(&s->owner, p[2 * j].data, p[2 * j].len,
				              p[2 * j + 1].data, p[2 * j + 1].len, KV_OWN_SERVE, 0,
				              NULL, c->epoch, 0);
		kv_owner_ranges_free(p, cap);
	}
	/* 3b. Ranges moving away from here are still ours until the handover
	 * is published; after a restart nothing in the table says so. */
	for (size_t i = 0; i < c->nmigs; i++) {
		const kv_migration *m = &c->migs[i];
		if (m->from == me &&
		    !kv_range_is_empty(m->start.data, m->start.len, m->end.data, m->end.len))
			kv_owner_claim(&s->owner, m->start.data, m->start.len, m->end.data,
			               m->end.len, c->epoch);
	}
	/* 4. Outgoing migrations: start new ones, cancel dropped ones. */
	for (size_t i = 0; i < c->nmigs; i++) {
		const kv_migration *m = &c->migs[i];
		const kv_node *dst = kv_config_node(c, m->to);
		if (m->from != me || dst == NULL)
			continue;
		if (kv_mig_out_start(s->mig, m, dst->address) != 0)
			KV_ERROR(COMP, "cannot start migration", "id=%llu",
			         (unsigned long long)m->id);
	}
	kv_mig_out_reconcile(s->mig, c);
	/* 5. Publish. */
	pthread_mutex_lock(&s->cfg_mu);
	if (s->cluster_id[0] == '\0' && c->cluster_id && c->cluster_id[0]) {
		snprintf(s->cluster_id, sizeof(s->cluster_id), "%s", c->cluster_id);
		new_cluster = true;
	}
	kv_config_free(s->cur);
	s->cur = c;
	atomic_store(&s->epoch, c->epoch);
	pthread_mutex_unlock(&s->cfg_mu);
	if (new_cluster)
		save_identity(s);
	KV_INFO(COMP, "config applied", "epoch=%llu ranges=%zu migrations=%zu",
	        (unsigned long long)c->epoch, c->nranges, c->nmigs);
}

static void
apply_resp_configs(kv_server *s, kv_adm_resp *r)
{
	for (size_t i = 0; i < r->nconfigs; i++) {
		apply_config(s, r->configs[i]);
		r->configs[i] = NULL;
	}
	r->nconfigs = 0;
}

/* Registers with the controller; retries until it answers or the server stops. */
static int
do_register(kv_server *s)
{
	unsigned backoff = 50;
	bool warned = false, auth_warned = false;

	while (!atomic_load(&s->stopping)) {
		char cid[128];
		kv_adm_resp r;
		pthread_mutex_lock(&s->cfg_mu);
		memcpy(cid, s->cluster_id, sizeof(cid));
		pthread_mutex_unlock(&s->cfg_mu);
		kv_adm_req rq = {.kind = KV_ADM_REGISTER,
		                 .address = s->cfg->listen,
		                 .node_id = atomic_load(&s->node_id),
		                 .join = s->cfg->join,
		                 .boot_id = s->boot_id,
		                 .cluster_id = cid,
		                 .epoch = atomic_load(&s->epoch)};
		int rv = kv_server__ctl_call(s, &rq, &r, 3000);
		if (rv == 0 && r.status == 0 && r.node_id != 0) {
			uint32_t old = atomic_load(&s->node_id);
			atomic_store(&s->node_id, r.node_id);
			KV_INFO(COMP, "registered", "node_id=%u epoch=%llu", r.node_id,
			        (unsigned long long)r.epoch);
			if (old != r.node_id)
				save_identity(s);
			apply_resp_configs(s, &r);
			kv_sc_adm_resp_fini(&r);
			return KV_OK;
		}
		if (rv == 0 && r.status == KV_EAUTH) {
			/* Misconfigured, not transient: say so once, clearly, and keep
			 * asking quietly (the controller may be given the secret). */
			if (!auth_warned)
				KV_ERROR(COMP,
				         "controller refused registration: authentication failed",
				         "detail=\"%s\" hint=\"start the server with the cluster's "
				         "--auth-token-file\"",
				         r.error);
			auth_warned = true;
		} else if (!warned || rv == 0) {
			/* A refused TLS handshake: kv_rpc_why() names the reason. */
			KV_WARN(COMP, "register failed, retrying", "err=%s detail=\"%s\"",
			        kv_errname(rv ? rv : r.status), rv ? kv_rpc_why() : r.error);
		}
		warned = true;
		if (rv == 0)
			kv_sc_adm_resp_fini(&r);
		kv_server__nap(s, backoff);
		backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
	}
	return KV_ECLOSED;
}

static void *
watch_main(void *arg)
{
	kv_server *s = arg;
	unsigned backoff = 50;
	uint32_t wt = s->cfg->watch_timeout_ms ? s->cfg->watch_timeout_ms : 1000;
	bool auth_warned = false;

	if (do_register(s) != 0)
		return NULL;
	while (!atomic_load(&s->stopping)) {
		kv_adm_resp r;
		kv_adm_req rq = {.kind = KV_ADM_WATCH,
		                 .timeout_ms = wt,
		                 .node_id = atomic_load(&s->node_id),
		                 .epoch = atomic_load(&s->epoch)};
		int rv = kv_server__ctl_call(s, &rq, &r, wt + 2000);
		if (rv == 0 && r.status == 0) {
			apply_resp_configs(s, &r);
			kv_sc_adm_resp_fini(&r);
			backoff = 50;
			continue;
		}
		if (rv == 0) {
			/* An auth refusal repeats every second until fixed: once. */
			if (r.status != KV_EAUTH || !auth_warned)
				KV_WARN(COMP, "watch refused", "err=%s detail=\"%s\"",
				        kv_errname(r.status), r.error);
			auth_warned |= r.status == KV_EAUTH;
			kv_sc_adm_resp_fini(&r);
		} else {
			KV_DEBUG(COMP, "watch failed", "err=%s", kv_errname(rv));
		}
		kv_server__nap(s, backoff);
		backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
	}
	return NULL;
}

/* ------------------------------------------------------------------------
 * Heartbeats
 * ------------------------------------------------------------------------ */

static uint64_t
rss_bytes(void)
{
	unsigned long size = 0, rss = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (f == NULL)
		return 0;
	if (fscanf(f, "%lu %lu", &size, &rss) != 2)
		rss = 0;
	fclose(f);
	return (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Fills the statistics of one range: counts and up to three quantile keys. */
static void
range_stats(kv_server *s, const kv_buf *st, const kv_buf *en, kv_sc_range_stats *out,
            kv_buf split[3])
{
	kv_buf mid = {0};

	kv_store_range_count(s->store, st->data, st->len, en->data, en->len, &out->keys,
	                     &out->bytes);
	out->start.p = st->data;
	out->start.len = st->len;
	out->end.p = en->data;
	out->end.len = en->len;
	out->nsplit = 0;
	if (kv_store_range_split_key(s->store, st->data, st->len, en->data, en->len, &mid) != 0)
		return;
	if (kv_store_range_split_key(s->store, st->data, st->len, mid.data, mid.len, &split[0]) ==
	    0)
		out->split[out->nsplit++] = (kv_bytes){split[0].data, split[0].len};
	kv_buf_set(&split[1], mid.data, mid.len);
	out->split[out->nsplit++] = (kv_bytes){split[1].data, split[1].len};
	if (kv_store_range_split_key(s->store, mid.data, mid.len, en->data, en->len, &split[2]) ==
	    0)
		out->split[out->nsplit++] = (kv_bytes){split[2].data, split[2].len};
	kv_buf_fini(&mid);
}

/* Per-range statistics of the last count, reused between counts. */
typedef struct {
	kv_buf *rg;            /* served ranges (start, end pairs) */
	size_t n;              /* ranges */
	kv_sc_range_stats *rs; /* n statistics, borrowing rg and split */
	kv_buf *split;         /* 3 split keys per range */
} hb_cache;

static void
hb_cache_fini(hb_cache *c)
{
	if (c->split)
		for (size_t i = 0; i < 3 * (c->n + 1); i++)
			kv_buf_fini(&c->split[i]);
	free(c->split);
	free(c->rs);
	kv_owner_ranges_free(c->rg, c->n);
	memset(c, 0, sizeof(*c));
}

/* Whether two range lists are the same. */
static bool
ranges_equal(const kv_buf *a, size_t na, const kv_buf *b, size_t nb)
{
	if (na != nb)
		return false;
	for (size_t i = 0; i < 2 * na; i++)
		if (kv_key_cmp(a[i].data, a[i].len, b[i].data, b[i].len) != 0)
			return false;
	return true;
}

/*
 * Counting a range walks it (kv_store_range_count), so the per-range figures
 * are recounted every heartbeat only for small stores: every
 * 1 + keys / 500000 heartbeats otherwise, and whenever the served ranges
 * change. Node totals come from the store's counters every time.
 */
static void *
heartbeat_main(void *arg)
{
	kv_server *s = arg;
	uint64_t last_ops = 0, last_ns = kv_now_ns(), tick = 0;
	hb_cache cache = {0};

	while (!atomic_load(&s->stopping)) {
		kv_buf *rg = NULL;
		kv_store_stats st;
		kv_adm_resp r;
		size_t n = 0;

		kv_server__nap(s, 1000);
		if (atomic_load(&s->stopping))
			break;
		uint32_t me = atomic_load(&s->node_id);
		uint64_t now = kv_now_ns(), ops = atomic_load(&s->ops);
		double rate = (double)(ops - last_ops) * 1e9 / (double)(now - last_ns + 1);
		last_ops = ops;
		last_ns = now;
		if (me == 0 || kv_owner_served(&s->owner, &rg, &n) != 0)
			continue;
		kv_store_get_stats(s->store, &st);
		uint64_t period = 1 + st.keys / 500000u;
		if (tick++ % period == 0 || !ranges_equal(rg, n, cache.rg, cache.n)) {
			hb_cache_fini(&cache);
			cache.rg = rg;
			cache.n = n;
			rg = NULL;
			cache.rs = calloc(n + 1, sizeof(*cache.rs));
			cache.split = calloc(3 * (n + 1), sizeof(*cache.split));
			if (cache.rs == NULL || cache.split == NULL) {
				hb_cache_fini(&cache);
				continue;
			}
			for (size_t i = 0; i < n; i++)
				range_stats(s, &cache.rg[2 * i], &cache.rg[2 * i + 1], &cache.rs[i],
				            &cache.split[3 * i]);
			kv_srv_metrics_set_ranges(s, cache.rs, cache.n);
		}
		kv_owner_ranges_free(rg, n);
		for (size_t i = 0; i < cache.n; i++)
			cache.rs[i].ops_per_sec = rate / (double)cache.n;
		kv_adm_req rq = {.kind = KV_ADM_HEARTBEAT,
		                 .node_id = me,
		                 .boot_id = s->boot_id,
		                 .epoch = atomic_load(&s->epoch),
		                 .nranges = cache.n,
		                 .ranges = cache.rs,
		                 .keys = st.keys,
		                 .bytes = st.bytes,
		                 .ops_per_sec = rate,
		                 .memory_bytes = rss_bytes()};
		if (kv_server__ctl_call(s, &rq, &r, 1000) == 0)
			kv_sc_adm_resp_fini(&r);
	}
	hb_cache_fini(&cache);
	return NULL;
}

/* ------------------------------------------------------------------------
 * Life cycle
 * ------------------------------------------------------------------------ */

/* Whether the controller marks this node gone and every outgoing migration
 * has been reported. */
static bool
leave_complete(kv_server *s)
{
	bool gone = false;
	uint32_t me = atomic_load(&s->node_id);

	pthread_mutex_lock(&s->cfg_mu);
	if (s->cur) {
		const kv_node *n = kv_config_node(s->cur, me);
		gone = n == NULL || n->state == KV_NODE_GONE;
	}
	pthread_mutex_unlock(&s->cfg_mu);
	return gone && !kv_mig_out_pending(s->mig);
}

/* Waits up to ms through the caller's callback, or sleeps. Returns true
 * when the callback cuts the leave short. */
static bool
leave_wait(kv_server *s, kv_server_wait_cb wait, void *arg, unsigned ms)
{
	if (wait != NULL)
		return wait(arg, ms);
	kv_server__nap(s, ms);
	return false;
}

kv_server_leave_result
kv_server_leave(kv_server *s, uint32_t timeout_ms, kv_server_wait_cb wait, void *arg)
{
	uint32_t me = atomic_load(&s->node_id);
	uint32_t limit = timeout_ms ? timeout_ms : 60000;
	kv_adm_resp r;
	int rv;

	uint64_t deadline = kv_now_ns() + (uint64_t)limit * 1000000u;

	/* Leave even when serving nothing, or the node would stay active and be
	 * picked as a migration destination after it exited. While the node is
	 * the destination of a migration in flight the controller answers BUSY:
	 * keep serving and ask again until the deadline. */
	if (me == 0)
		return KV_LEAVE_UNREGISTERED;
	kv_adm_req rq = {.kind = KV_ADM_LEAVE, .node_id = me};
	for (;;) {
		rv = kv_server__ctl_call(s, &rq, &r, 2000);
		if (rv == 0 && r.status == 0)
			break;
		bool busy = rv == 0 && r.status == KV_EBUSY;
		if (!busy || kv_now_ns() >= deadline) {
			KV_WARN(COMP, "leave not accepted, stopping now", "err=%s detail=\"%s\"",
			        kv_errname(rv ? rv : r.status), rv ? "" : r.error);
			if (rv == 0)
				kv_sc_adm_resp_fini(&r);
			return KV_LEAVE_REFUSED;
		}
		kv_sc_adm_resp_fini(&r);
		if (leave_wait(s, wait, arg, 200))
			return KV_LEAVE_CUT_ASKING;
	}
	kv_sc_adm_resp_fini(&r);
	atomic_store(&s->leaving, true);
	KV_INFO(COMP, "leaving: draining ranges", "node_id=%u timeout_ms=%u", me, limit);
	while (kv_now_ns() < deadline) {
		if (leave_complete(s)) {
			KV_INFO(COMP, "drained", "node_id=%u", me);
			return KV_LEAVE_DRAINED;
		}
		if (leave_wait(s, wait, arg, 100))
			return KV_LEAVE_CUT_DRAINING;
	}
	KV_WARN(COMP, "drain timed out, stopping", "timeout_ms=%u", limit);
	return KV_LEAVE_TIMED_OUT;
}

/* Refuses new requests and waits (bounded) until every request taken has
 * been answered, so no log notification outlives the rpc server. */
static bool
drain_requests(kv_server *s)
{
	uint64_t deadline = kv_now_ns() + 10ull * 1000000000ull;

	atomic_store(&s->closing, true);
	while (atomic_load(&s->inflight) > 0) {
		if (kv_now_ns() > deadline)
			return false;
		struct timespec ts = {0, 2 * 1000000L};
		nanosleep(&ts, NULL);
	}
	return true;
}

static int
check_data_dir(const char *dir)
{
	struct stat st;

	if (stat(dir, &st) != 0) {
		if (errno != ENOENT || mkdir(dir, 0755) != 0)
			return kv_err_from_errno(errno);
		return KV_OK;
	}
	if (!S_ISDIR(st.st_mode))
		return KV_EINVAL;
	if (access(dir, R_OK | W_OK | X_OK) != 0)
		return kv_err_from_errno(errno);
	return KV_OK;
}

/* kv_mig_env callbacks: what migrations read of the server. */
static uint32_t
mig_node_id(void *arg)
{
	return atomic_load(&((kv_server *)arg)->node_id);
}

static uint64_t
mig_epoch(void *arg)
{
	return atomic_load(&((kv_server *)arg)->epoch);
}

static int
mig_ctl_call(void *arg, kv_adm_req *rq, kv_adm_resp *resp, uint32_t timeout_ms)
{
	return kv_server__ctl_call(arg, rq, resp, timeout_ms);
}

static void
mig_node_addr(void *arg, uint32_t id, char *addr, size_t len)
{
	kv_server *s = arg;

	addr[0] = '\0';
	pthread_mutex_lock(&s->cfg_mu);
	const kv_node *n = s->cur ? kv_config_node(s->cur, id) : NULL;
	if (n)
		snprintf(addr, len, "%s", n->address);
	pthread_mutex_unlock(&s->cfg_mu);
}

/* Copies a one-line reason for the caller of kv_server_create. */
static void
set_err(char *err, size_t errlen, const char *msg)
{
	if (err != NULL && errlen > 0)
		snprintf(err, errlen, "%s", msg);
}

/* Frees what kv_server_create set up before the store: the parts every
 * path owns. */
static void
free_base(kv_server *s)
{
	kv_config_free(s->cur);
	pthread_mutex_destroy(&s->cfg_mu);
	pthread_mutex_destroy(&s->ctl_mu);
	kv_srv_metrics_set_ranges(s, NULL, 0);
	pthread_mutex_destroy(&s->rfig_mu);
	if (s->auth.data != NULL)
		memset(s->auth.data, 0, s->auth.len);
	kv_buf_fini(&s->auth);
	kv_tls_destroy(s->tls);
	free(s);
}

int
kv_server_create(const kv_server_cfg *cfg, kv_server **out, char *err, size_t errlen)
{
	kv_server *s;
	kv_store_opts so;
	int rv;

	set_err(err, errlen, "");
	if (cfg->nctl == 0 || cfg->listen == NULL || cfg->data_dir == NULL) {
		set_err(err, errlen, "a listen address, a controller and a data dir are required");
		return KV_EINVAL;
	}
	s = calloc(1, sizeof(*s));
	if (s == NULL)
		return KV_ENOMEM;
	s->cfg_copy = *cfg;
	s->cfg = &s->cfg_copy;
	cfg = s->cfg;
	s->max_key = cfg->max_key ? cfg->max_key : KV_DEFAULT_MAX_KEY;
	s->max_value = cfg->max_value ? cfg->max_value : KV_DEFAULT_MAX_VALUE;
	s->max_batch = cfg->max_batch ? cfg->max_batch : 65536;
	s->boot_id = rand64();
	s->admin_client_id = rand64();
	atomic_store(&s->admin_req_id, 1);
	pthread_mutex_init(&s->cfg_mu, NULL);
	pthread_mutex_init(&s->ctl_mu, NULL);
	pthread_mutex_init(&s->rfig_mu, NULL);

	if (cfg->auth_token_file != NULL) {
		char aerr[512];
		bool loose = false;
		if ((rv = kv_auth_load(cfg->auth_token_file, &s->auth, &loose, aerr,
		                       sizeof(aerr))) != 0) {
			KV_ERROR(COMP, "cannot use the auth token", "err=%s detail=\"%s\"",
			         kv_errname(rv), aerr);
			set_err(err, errlen, "cannot use the auth token");
			rv = KV_EINVAL;
			goto err_after_alloc;
		}
		if (loose)
			KV_WARN(COMP, "auth token file is accessible by group or others",
			        "file=%s hint=\"chmod 600 it\"", cfg->auth_token_file);
	}
	if (kv_tls_files_any(&cfg->tls)) {
		char terr[512];
		if ((rv = kv_tls_create(&cfg->tls, true, &s->tls, terr, sizeof(terr))) != 0) {
			KV_ERROR(COMP, "cannot use the TLS files", "err=%s detail=\"%s\"",
			         kv_errname(rv), terr);
			set_err(err, errlen, "cannot use the TLS files");
			rv = KV_EINVAL;
			goto err_after_alloc;
		}
	}
	{
		char uerr[512];
		rv = kv_tls_check_url(s->tls != NULL, "--listen", cfg->listen, uerr, sizeof(uerr));
		for (size_t i = 0; rv == 0 && i < cfg->nctl; i++)
			rv = kv_tls_check_url(s->tls != NULL, "--controller", cfg->ctl[i], uerr,
			                      sizeof(uerr));
		if (rv != 0) {
			KV_ERROR(COMP, "cannot start", "err=EINVAL detail=\"%s\"", uerr);
			set_err(err, errlen, uerr);
			goto err_after_alloc;
		}
	}
	if ((rv = check_data_dir(cfg->data_dir)) != 0) {
		KV_ERROR(COMP, "cannot use data dir", "dir=%s err=\"%s\"", cfg->data_dir,
		         rv == KV_EINVAL ? "not a directory" : strerror(errno));
		set_err(err, errlen, "cannot use data dir");
		goto err_after_alloc;
	}
	uint32_t id = 0;
	rv = kv_nodefile_load(cfg->data_dir, &id, s->cluster_id, sizeof(s->cluster_id));
	if (rv != 0 && rv != KV_ENOTFOUND) {
		KV_ERROR(COMP, "cannot read node file", "dir=%s err=%s", cfg->data_dir,
		         kv_strerror(rv));
		set_err(err, errlen, "cannot read node file");
		goto err_after_alloc;
	}
	atomic_store(&s->node_id, id);
	if (rv == KV_ENOTFOUND && (rv = kv_nodefile_save(cfg->data_dir, 0, "")) != 0) {
		KV_ERROR(COMP, "cannot write to data dir", "dir=%s err=%s", cfg->data_dir,
		         kv_strerror(rv));
		set_err(err, errlen, "cannot write to data dir");
		goto err_after_alloc;
	}
	if (kv_owner_init(&s->owner) != 0 || (s->dedup = kv_dedup_create(0, 0, 0)) == NULL) {
		rv = KV_ENOMEM;
		goto err_after_alloc;
	}
	kv_store_opts_init(&so);
	so.mode = cfg->store_mode;
	so.max_key = s->max_key;
	so.max_value = s->max_value;
	if (cfg->store_mode == KV_STORE_PERCORE && cfg->threads)
		so.partitions = cfg->threads;
	if ((rv = kv_store_create(&so, &s->store)) != 0) {
		KV_ERROR(COMP, "cannot create store", "err=%s", kv_strerror(rv));
		set_err(err, errlen, "cannot create store");
		goto err_after_owner;
	}
	kv_dur_opts dopts = {.dir = cfg->data_dir,
	                     .mode = cfg->fsync,
	                     .snapshot_bytes = cfg->snapshot_bytes,
	                     .truncate_corrupt = cfg->wal_truncate_corrupt,
	                     .store = s->store,
	                     .dedup = s->dedup};
	kv_dur_report drep;
	char derr[768] = "";
	if ((rv = kv_dur_open(&dopts, &s->dur, &drep, derr, sizeof(derr))) != 0) {
		KV_ERROR(COMP, "cannot recover the data dir", "dir=%s err=%s detail=\"%s\"%s",
		         cfg->data_dir, kv_errname(rv), derr,
		         rv == KV_ECORRUPT ? " hint=\"--wal-truncate-corrupt cuts the log at the "
		                             "corrupt record, losing what follows it\""
		                           : "");
		set_err(err, errlen, "cannot recover the data dir");
		goto err_after_store;
	}
	if (drep.torn)
		KV_WARN(COMP, "dropped a torn log tail", "file=%s bytes=%llu", drep.torn_file,
		        (unsigned long long)drep.torn_bytes);
	{
		double secs = (double)drep.elapsed_ns / 1e9;
		double mb = (double)(drep.snap_bytes + drep.log_bytes) / 1e6;
		KV_INFO(COMP, "recovered",
		        "snapshot_lsn=%llu snapshot_keys=%llu log_records=%llu "
		        "mb=%.1f secs=%.3f mb_per_s=%.1f fsync=%s",
		        (unsigned long long)drep.snap_lsn, (unsigned long long)drep.snap_entries,
		        (unsigned long long)drep.log_records, mb, secs, secs > 0 ? mb / secs : 0.0,
		        kv_fsync_mode_name(cfg->fsync));
	}
	s->ctl = calloc(cfg->nctl, sizeof(*s->ctl));
	if (s->ctl == NULL) {
		rv = KV_ENOMEM;
		goto err_after_dur;
	}
	for (size_t i = 0; i < cfg->nctl; i++)
		if ((rv = kv_rpc_client_create_tls(cfg->ctl[i], s->tls, &s->ctl[i])) != 0) {
			KV_ERROR(COMP, "bad controller address", "addr=%s err=%s", cfg->ctl[i],
			         kv_strerror(rv));
			set_err(err, errlen, "bad controller address");
			goto err_after_ctl;
		}
	kv_mig_env env = {.store = s->store,
	                  .dur = s->dur,
	                  .owner = &s->owner,
	                  .dedup = s->dedup,
	                  .tls = s->tls,
	                  .auth = kv_server__auth(s),
	                  .max_value = s->max_value,
	                  .arg = s,
	                  .node_id = mig_node_id,
	                  .epoch = mig_epoch,
	                  .ctl_call = mig_ctl_call,
	                  .node_addr = mig_node_addr};
	if ((rv = kv_mig_create(&env, &s->mig)) != 0)
		goto err_after_ctl;
	*out = s;
	return KV_OK;

err_after_ctl:
	for (size_t i = 0; i < cfg->nctl; i++)
		kv_rpc_client_destroy(s->ctl[i]);
	free(s->ctl);
err_after_dur:
	kv_dur_close(s->dur);
err_after_store:
	kv_store_destroy(s->store);
err_after_owner:
	kv_owner_fini(&s->owner);
	kv_dedup_destroy(s->dedup);
err_after_alloc:
	free_base(s);
	return rv;
}

int
kv_server_start(kv_server *s)
{
	const kv_server_cfg *cfg = s->cfg;
	int rv;

	if (s->started || s->stopped)
		return KV_EINVAL;
	if ((rv = kv_srv_metrics_start(s)) != 0)
		return rv;
	kv_rpc_server_opts ro = {.url = cfg->listen,
	                         .contexts = cfg->contexts ? cfg->contexts : 256,
	                         .max_msg = cfg->max_message,
	                         .max_conns = cfg->max_connections ? cfg->max_connections : 4096,
	                         .handler = rpc_handler,
	                         .arg = s,
	                         .tls = s->tls};
	if ((rv = kv_rpc_server_create(&ro, &s->rpc)) != 0) {
		KV_ERROR(COMP, "cannot listen", "addr=%s err=%s", cfg->listen, kv_strerror(rv));
		kv_srv_metrics_stop(s);
		return rv;
	}
	atomic_store(&s->rpc_pub, s->rpc);
	KV_INFO(COMP, "listening",
	        "addr=%s node_id=%u store=%s contexts=%u metrics=%s auth=%s tls=%s", cfg->listen,
	        atomic_load(&s->node_id),
	        cfg->store_mode == KV_STORE_PERCORE ? "percore" : "striped", ro.contexts,
	        cfg->metrics ? cfg->metrics : "off", s->auth.len ? "token" : "off",
	        s->tls ? "mutual" : "off");
	s->started = true;
	if (pthread_create(&s->watch_thr, NULL, watch_main, s) == 0)
		s->watch_started = true;
	if (pthread_create(&s->hb_thr, NULL, heartbeat_main, s) == 0)
		s->hb_started = true;
	if (!s->watch_started || !s->hb_started) {
		kv_server_stop(s);
		return KV_ENOMEM;
	}
	return KV_OK;
}

/*
 * Stop order: refuse new requests and wait for the ones taken (their held
 * replies use the log), stop the metrics listener (it walks the migration
 * list), close the rpc server, join the watch and heartbeat threads, join
 * the migration threads, close the controller clients, close the log.
 */
int
kv_server_stop(kv_server *s)
{
	if (s->stopped)
		return s->stop_rv;
	s->stopped = true;
	atomic_store(&s->stopping, true);
	kv_mig_stop(s->mig);
	if (s->started && !drain_requests(s)) {
		/* Replies still wait for a failing disk: they cannot be answered
		 * truthfully, and freeing what they use would be unsafe. */
		KV_ERROR(COMP, "stopping with writes not on disk", "inflight=%d",
		         atomic_load(&s->inflight));
		s->wedged = true;
		s->stop_rv = KV_EIO;
		return s->stop_rv;
	}
	kv_srv_metrics_stop(s); /* before the migration lists are freed */
	kv_rpc_server_destroy(s->rpc);
	s->rpc = NULL;
	if (s->watch_started)
		pthread_join(s->watch_thr, NULL);
	if (s->hb_started)
		pthread_join(s->hb_thr, NULL);
	kv_mig_destroy(s->mig);
	s->mig = NULL;
	if (s->started)
		KV_INFO(COMP, "stopped", "node_id=%u", atomic_load(&s->node_id));
	for (size_t i = 0; i < s->cfg->nctl; i++)
		kv_rpc_client_destroy(s->ctl[i]);
	free(s->ctl);
	s->ctl = NULL;
	kv_dur_close(s->dur);
	s->dur = NULL;
	s->stop_rv = KV_OK;
	return s->stop_rv;
}

void
kv_server_destroy(kv_server *s)
{
	if (s == NULL)
		return;
	kv_server_stop(s);
	if (s->wedged)
		return; /* held replies may still use it: kept, on purpose */
	kv_store_destroy(s->store);
	kv_owner_fini(&s->owner);
	kv_dedup_destroy(s->dedup);
	free_base(s);
}
