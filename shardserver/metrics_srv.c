/*
 * metrics_srv.c - the shard server's /metrics (doc/contract.md §5, doc/metrics.md):
 * starts the shared listener (common/metrics.h) and renders the server's
 * counters and gauges on its thread.
 *
 * Everything is read without stopping requests: the op and error counters
 * are relaxed atomics bumped by dispatch.c, store and log figures come from
 * their own statistics calls (kv_store_get_stats, kv_dur_stats_get), and the
 * migration figures from kv_mig_stats (the list walked under its mutex, a
 * leaf, reading only the atomics of its items). A scrape therefore sees each figure at a slightly
 * different moment; no figure is torn. The listener is stopped before the store, the log or the
 * migration lists are freed.
 */
#include "common/err.h"
#include "common/log.h"
#include "common/metrics.h"
#include "shardserver/server_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COMP "server"

/* The status label of each KV_E* code, by -code (see KV_ERR_MAP): the same
 * words as the benchmark's errors by kind. Slot 0 is any status outside the
 * table. */
static const char *const err_label[KV_SRV_ERR_SLOTS] = {
    [0] = "other",
    [-KV_ENOTFOUND] = "not_found",
    [-KV_EINVAL] = "invalid",
    [-KV_ENOMEM] = "no_memory",
    [-KV_ETOOBIG] = "too_big",
    [-KV_EWRONGOWNER] = "wrong_owner",
    [-KV_ESTALE] = "stale",
    [-KV_ETIMEDOUT] = "timed_out",
    [-KV_EUNAVAIL] = "unavailable",
    [-KV_EEXISTS] = "exists",
    [-KV_EIO] = "io",
    [-KV_ECORRUPT] = "corrupt",
    [-KV_EPROTO] = "protocol",
    [-KV_EAUTH] = "auth",
    [-KV_ECLOSED] = "closed",
    [-KV_EBUSY] = "busy",
    [-KV_EMOVING] = "moving",
    [-KV_EPERM] = "not_permitted",
    [-KV_ENOSPC] = "no_space",
    [-KV_ELIMIT] = "limit",
    [-KV_EADDRINUSE] = "addr_in_use",
    [-KV_EINTERNAL] = "internal",
    [-KV_EMISMATCH] = "mismatch",
};

/* The op label of each kv_op_kind. */
static const char *const op_label[KV_OP__COUNT] = {
    [KV_OP_GET] = "get",           [KV_OP_PUT] = "put",       [KV_OP_DEL] = "del",
    [KV_OP_APPEND] = "append",     [KV_OP_MGET] = "mget",     [KV_OP_MPUT] = "mput",
    [KV_OP_SCAN] = "scan",         [KV_OP_EXPIRE] = "expire", [KV_OP_TTL] = "ttl",
    [KV_OP_INCR] = "incr",         [KV_OP_EXISTS] = "exists", [KV_OP_COUNT] = "count",
    [KV_OP_DELRANGE] = "delrange",
};

/* Samples of one scrape: every op and error label plus the plain figures. */
#define MAX_SAMPLES (KV_OP__COUNT + KV_SRV_ERR_SLOTS + 48)

/* Appends a sample without a label. */
static void
add(kv_metric *m, size_t *n, const char *name, const char *type, const char *help, uint64_t v)
{
	m[(*n)++] = (kv_metric){.name = name, .type = type, .help = help, .u = v};
}

static int
render_latency(kv_server *s, kv_buf *out)
{
	const char *lv[KV_OP__COUNT];
	const kv_lat_hist *h[KV_OP__COUNT];
	size_t n = 0;

	for (int k = 1; k < KV_OP__COUNT; k++) {
		lv[n] = op_label[k];
		h[n++] = &s->op_lat[k];
	}
	return kv_metrics_write_hist(
	    out, "shardkv_server_request_duration_seconds",
	    "Receipt to reply of requests carrying each op kind (a request with several "
	    "kinds counts in each; held replies include the log wait).",
	    "op", lv, h, n);
}

/* Ranges with a series of their own: the largest by bytes. The others are
 * summed into one series labelled range="other", so a server with many
 * ranges exports at most KV_SRV_RANGE_SERIES + 1 series per family
 * (doc/metrics.md). */
#define KV_SRV_RANGE_SERIES 20
#define MAX_LAG_SERIES      64 /* backups shown (a node streams to at most 64) */

static _Thread_local const kv_srv_range_fig *sort_base; /* qsort's array (per metrics thread) */

/* qsort order of range indexes: bytes descending, then index. */
static int
by_bytes_desc(const void *a, const void *b)
{
	size_t i = *(const size_t *)a, j = *(const size_t *)b;
	uint64_t bi = sort_base[i].bytes, bj = sort_base[j].bytes;
	return bi != bj ? (bi < bj ? 1 : -1) : (i > j) - (i < j);
}

/* The per-range gauges, from the heartbeat's last count. */
static int
render_ranges(kv_server *s, kv_buf *out)
{
	kv_metric *m;
	size_t n = 0, *idx, shown;
	uint64_t other_keys = 0, other_bytes = 0;
	int rv;

	pthread_mutex_lock(&s->rfig_mu);
	m = calloc(2 * KV_SRV_RANGE_SERIES + 3, sizeof(*m));
	idx = calloc(s->nrfig + 1, sizeof(*idx));
	if (m == NULL || idx == NULL) {
		pthread_mutex_unlock(&s->rfig_mu);
		free(m);
		free(idx);
		return KV_ENOMEM;
	}
	for (size_t i = 0; i < s->nrfig; i++)
		idx[i] = i;
	shown = s->nrfig;
	if (s->nrfig > KV_SRV_RANGE_SERIES) {
		/* sort_base is this thread's: servers in one process sort apart. */
		sort_base = s->rfig;
		qsort(idx, s->nrfig, sizeof(*idx), by_bytes_desc);
		shown = KV_SRV_RANGE_SERIES;
		for (size_t i = shown; i < s->nrfig; i++) {
			other_keys += s->rfig[idx[i]].keys;
			other_bytes += s->rfig[idx[i]].bytes;
		}
	}
	for (int fam = 0; fam < 2; fam++) {
		for (size_t i = 0; i <= shown; i++) {
			bool other = i == shown;
			if (other && shown == s->nrfig)
				break;
			const kv_srv_range_fig *f = other ? NULL : &s->rfig[idx[i]];
			m[n++] = (kv_metric){
			    .name = fam == 0 ? "shardkv_server_range_keys"
			                     : "shardkv_server_range_bytes",
			    .type = KV_METRIC_GAUGE,
			    .help = fam == 0
			                ? "Live keys per served range (recounted every heartbeat, "
			                  "less often for large stores; past 20 ranges, the "
			                  "largest 20 and range=\"other\" for the rest)."
			                : "Key and value bytes per served range (past 20 ranges, "
			                  "the largest 20 and range=\"other\" for the rest).",
			    .label = "range",
			    .lvalue = other ? "other" : f->label,
			    .u = fam == 0 ? (other ? other_keys : f->keys)
			                  : (other ? other_bytes : f->bytes)};
		}
	}
	rv = kv_metrics_write(out, m, n);
	pthread_mutex_unlock(&s->rfig_mu);
	free(m);
	free(idx);
	return rv;
}

/* Appends key k to b: printable ASCII as is, other bytes as \xHH. Returns
 * the new length, or 0 when it would not fit in cap. */
static size_t
put_key(char *b, size_t len, size_t cap, const uint8_t *k, size_t klen)
{
	for (size_t i = 0; i < klen; i++) {
		if (len + 5 >= cap)
			break;
		if (k[i] >= 0x20 && k[i] < 0x7f && k[i] != '\\')
			b[len++] = (char)k[i];
		else
			len += (size_t)snprintf(b + len, cap - len, "\\x%02x", k[i]);
	}
	return len;
}

/* "[start, end)" for a range, keys escaped (an empty end is the end of the
 * key space: "[start, )"). Returns NULL when out of memory. */
static char *
range_label(const kv_admin_range_stat *r)
{
	size_t cap = 4 * (r->start.len + r->end.len) + 8, len = 0;
	char *b = malloc(cap);

	if (b == NULL)
		return NULL;
	b[len++] = '[';
	len = put_key(b, len, cap, r->start.p, r->start.len);
	b[len++] = ',';
	b[len++] = ' ';
	len = put_key(b, len, cap, r->end.p, r->end.len);
	b[len++] = ')';
	b[len] = 0;
	return b;
}

void
kv_srv_metrics_set_ranges(kv_server *s, const kv_admin_range_stat *rs, size_t n)
{
	kv_srv_range_fig *f = NULL, *old;
	size_t nold;

	if (n > 0) {
		if ((f = calloc(n, sizeof(*f))) == NULL)
			return;
		for (size_t i = 0; i < n; i++) {
			f[i] = (kv_srv_range_fig){
			    .label = range_label(&rs[i]), .keys = rs[i].keys, .bytes = rs[i].bytes};
			if (f[i].label == NULL) {
				for (size_t j = 0; j < i; j++)
					free(f[j].label);
				free(f);
				return;
			}
		}
	}
	pthread_mutex_lock(&s->rfig_mu);
	old = s->rfig;
	nold = s->nrfig;
	s->rfig = f;
	s->nrfig = n;
	pthread_mutex_unlock(&s->rfig_mu);
	for (size_t i = 0; i < nold; i++)
		free(old[i].label);
	free(old);
}

/* The replication lag of each backup this node streams to (repl.h
 * kv_rs_lag): records, lsns and seconds behind, labelled backup="NODE". */
static int
render_lag(kv_server *s, kv_buf *out)
{
	kv_rs_lag lag[MAX_LAG_SERIES];
	size_t k = kv_rs_lag_get(s->repl, lag, MAX_LAG_SERIES);
	char node[MAX_LAG_SERIES][12];
	kv_metric m[3 * MAX_LAG_SERIES];
	size_t n = 0;

	if (k > MAX_LAG_SERIES)
		k = MAX_LAG_SERIES;
	for (size_t i = 0; i < k; i++)
		snprintf(node[i], sizeof(node[i]), "%u", lag[i].node);
	static const struct {
		const char *name, *help;
	} fams[3] = {
	    {"shardkv_replication_lag_records",
	     "Records this primary queued for the backup and the backup has not acknowledged."},
	    {"shardkv_replication_lag_lsns", "Log sequence numbers between the last record queued "
	                                     "for the backup and its acknowledged watermark."},
	    {"shardkv_replication_lag_seconds",
	     "With records outstanding, seconds since the backup last acknowledged progress (it "
	     "leaves the ISR after about 1 s); 0 when it has everything."},
	};
	for (int fam = 0; fam < 3; fam++) {
		for (size_t i = 0; i < k; i++) {
			m[n++] = (kv_metric){.name = fams[fam].name,
			                     .type = KV_METRIC_GAUGE,
			                     .help = fams[fam].help,
			                     .label = "backup",
			                     .lvalue = node[i],
			                     .real = fam == 2,
			                     .u = fam == 0 ? lag[i].records : lag[i].lsns,
			                     .f = (double)lag[i].ms / 1000.0};
		}
	}
	return n ? kv_metrics_write(out, m, n) : KV_OK;
}

static int
render(void *arg, kv_buf *out)
{
	kv_server *s = arg;
	kv_metric m[MAX_SAMPLES];
	size_t n = 0;
	kv_store_stats st = {0};
	kv_dur_stats ds = {0};
	uint64_t active = 0, bytes_sent = 0;

	for (int k = 1; k < KV_OP__COUNT; k++)
		m[n++] =
		    (kv_metric){.name = "shardkv_server_ops_total",
		                .type = KV_METRIC_COUNTER,
		                .help = "Ops received, by kind (a multi-key op counts once).",
		                .label = "op",
		                .lvalue = op_label[k],
		                .u = atomic_load_explicit(&s->op_count[k], memory_order_relaxed)};
	for (size_t i = 1; i <= KV_SRV_ERR_SLOTS; i++) {
		size_t slot = i % KV_SRV_ERR_SLOTS; /* "other" last */
		if (slot == (size_t)-KV_ENOTFOUND)
			continue; /* an answer, not a failure: never counted */
		m[n++] = (kv_metric){
		    .name = "shardkv_server_errors_total",
		    .type = KV_METRIC_COUNTER,
		    .help = "Ops and requests that failed, by status (not found is not a failure).",
		    .label = "status",
		    .lvalue = err_label[slot],
		    .u = atomic_load_explicit(&s->err_count[slot], memory_order_relaxed)};
	}
	kv_store_get_stats(s->store, &st);
	add(m, &n, "shardkv_server_keys", KV_METRIC_GAUGE, "Live keys in the store.", st.keys);
	add(m, &n, "shardkv_server_bytes", KV_METRIC_GAUGE, "Key and value bytes of the live keys.",
	    st.bytes);
	add(m, &n, "shardkv_server_memory_bytes", KV_METRIC_GAUGE,
	    "Bytes the store has taken from the system.", st.mem_bytes);
	add(m, &n, "shardkv_server_epoch", KV_METRIC_GAUGE,
	    "Configuration epoch applied (0: none yet).", atomic_load(&s->epoch));
	add(m, &n, "shardkv_server_node_id", KV_METRIC_GAUGE,
	    "Node id of this server (0: not registered yet).", atomic_load(&s->node_id));
	kv_rpc_server *rpc = atomic_load(&s->rpc_pub);
	add(m, &n, "shardkv_server_connections", KV_METRIC_GAUGE,
	    "Client and peer connections open on the --listen address.",
	    rpc ? kv_rpc_server_conns(rpc) : 0);
	add(m, &n, "shardkv_server_read_hits_total", KV_METRIC_COUNTER,
	    "Keys that get and mget found.",
	    atomic_load_explicit(&s->read_hits, memory_order_relaxed));
	add(m, &n, "shardkv_server_read_misses_total", KV_METRIC_COUNTER,
	    "Keys that get and mget did not find (not found; failed reads count in neither).",
	    atomic_load_explicit(&s->read_misses, memory_order_relaxed));
	add(m, &n, "shardkv_server_expired_reclaimed_total", KV_METRIC_COUNTER,
	    "Expired keys removed by active expiry (each logged and replicated as a delete).",
	    atomic_load_explicit(&s->expired_reclaimed, memory_order_relaxed));
	add(m, &n, "shardkv_server_range_counts_total", KV_METRIC_COUNTER,
	    "Walks of the served ranges counting their keys and bytes (none while nothing "
	    "changes them).",
	    atomic_load_explicit(&s->range_counts, memory_order_relaxed));
	add(m, &n, "shardkv_server_cond_conflicts_total", KV_METRIC_COUNTER,
	    "Conditional writes refused because their condition did not hold (EXISTS, MISMATCH).",
	    atomic_load_explicit(&s->cond_conflicts, memory_order_relaxed));
	add(m, &n, "shardkv_server_expiring_keys", KV_METRIC_GAUGE,
	    "Keys in the store with an expiry (expired ones not yet reclaimed included).",
	    st.expiring);
	char why[160];
	add(m, &n, "shardkv_server_lease_valid", KV_METRIC_GAUGE,
	    "1 while the controller lease is held (data requests answered), else 0.",
	    kv_srv_lease_ok(s, why, sizeof(why)));
	int inflight = atomic_load(&s->inflight);
	add(m, &n, "shardkv_server_requests_inflight", KV_METRIC_GAUGE,
	    "Requests received and not yet answered.", inflight > 0 ? (uint64_t)inflight : 0);

	if (s->dur != NULL)
		kv_dur_stats_get(s->dur, &ds);
	add(m, &n, "shardkv_wal_records_total", KV_METRIC_COUNTER,
	    "Records appended to the write-ahead log since start.", ds.wal.records);
	add(m, &n, "shardkv_wal_bytes_total", KV_METRIC_COUNTER,
	    "Payload bytes of the records appended since start.", ds.wal.bytes);
	add(m, &n, "shardkv_wal_writes_total", KV_METRIC_COUNTER,
	    "Batches written to the log since start.", ds.wal.writes);
	add(m, &n, "shardkv_wal_fsyncs_total", KV_METRIC_COUNTER, "Log fsyncs since start.",
	    ds.wal.fsyncs);
	add(m, &n, "shardkv_wal_segments_total", KV_METRIC_COUNTER,
	    "Log segments started since start, the first included.", ds.wal.segments);
	add(m, &n, "shardkv_wal_segments_reused_total", KV_METRIC_COUNTER,
	    "Log segments started since start that were made of a dropped one.", ds.wal.reused);
	add(m, &n, "shardkv_wal_healthy", KV_METRIC_GAUGE,
	    "1 while the log accepts writes, 0 while writes are refused (disk full, I/O error).",
	    s->dur != NULL && ds.wal.health == KV_OK);
	add(m, &n, "shardkv_snapshots_total", KV_METRIC_COUNTER, "Snapshots written since start.",
	    ds.snapshots);
	m[n++] = (kv_metric){.name = "shardkv_snapshot_last_duration_seconds",
	                     .type = KV_METRIC_GAUGE,
	                     .help = "Duration of the last snapshot (0: none since start).",
	                     .real = true,
	                     .f = (double)ds.snapshot_ms / 1000.0};
	add(m, &n, "shardkv_snapshot_last_bytes", KV_METRIC_GAUGE,
	    "Payload bytes of the last snapshot (0: none since start).", ds.snapshot_bytes);

	kv_rs_stats rs;
	kv_rs_stats_get(s->repl, &rs);
	add(m, &n, "shardkv_replication_batches_total", KV_METRIC_COUNTER,
	    "Replicate requests this node sent to its backups (records, markers and copy steps).",
	    rs.sent_batches);
	add(m, &n, "shardkv_replication_records_applied_total", KV_METRIC_COUNTER,
	    "Records this node applied as a backup from its primaries' streams.", rs.applied);
	add(m, &n, "shardkv_replica_copies_total", KV_METRIC_COUNTER,
	    "Copies of a range to a replica outside its ISR started (a copy sent again "
	    "counts again).",
	    rs.copies);
	add(m, &n, "shardkv_replica_copies_done_total", KV_METRIC_COUNTER,
	    "Copies of a range to a replica outside its ISR completed.", rs.copied);
	add(m, &n, "shardkv_replica_catchups_total", KV_METRIC_COUNTER,
	    "Replicas outside an ISR caught up from their own data with the records they "
	    "lacked, without a copy (ranges).",
	    rs.catchups);
	add(m, &n, "shardkv_replica_copy_bytes_total", KV_METRIC_COUNTER,
	    "Record payload bytes sent in the steps of copies and catch-ups to replicas "
	    "outside an ISR.",
	    rs.copy_bytes);
	add(m, &n, "shardkv_replica_copy_urgent_bytes_total", KV_METRIC_COUNTER,
	    "Of those, bytes of copies of ranges that had fewer in-sync replicas than "
	    "--min-insync (they take no write until the copy ends): not held back by "
	    "--copy-rate.",
	    rs.copy_urgent_bytes);
	add(m, &n, "shardkv_replica_catchup_refusals_total", KV_METRIC_COUNTER,
	    "Catch-ups from a replica's own data offered and refused by the replica (no "
	    "position covering them): the range was copied instead.",
	    rs.catchup_refusals);
	add(m, &n, "shardkv_isr_expand_requests_total", KV_METRIC_COUNTER,
	    "IsrChange{add} requests sent for caught-up replicas (one per range and try).",
	    rs.expand_asks);
	add(m, &n, "shardkv_replication_diverged_total", KV_METRIC_COUNTER,
	    "In-sync backups whose end of the previous leader epoch differed from this "
	    "new primary's (each is taken out of the ISR and copied again).",
	    rs.diverged);
	add(m, &n, "shardkv_replication_ends_ahead_in_sync_total", KV_METRIC_COUNTER,
	    "New primaries' ends of the previous leader epoch this backup answered in sync "
	    "although it had applied more of the old primary's records, all of other ranges.",
	    rs.ends_ahead_in_sync);
	add(m, &n, "shardkv_replica_transfers_clean_total", KV_METRIC_COUNTER,
	    "Ranges this node led handed to another primary, this node kept in the ISR, with "
	    "nothing outstanding on the stream to it: this node stays in sync without a copy.",
	    rs.clean_demotions);
	add(m, &n, "shardkv_replica_transfers_unclean_total", KV_METRIC_COUNTER,
	    "Ranges this node led handed to another primary, this node kept in the ISR, with "
	    "records outstanding on the stream to it: this node is copied again.",
	    rs.unclean_demotions);

	kv_mig_stats(s->mig, &active, &bytes_sent);
	add(m, &n, "shardkv_migrations_out_active", KV_METRIC_GAUGE,
	    "Outgoing migrations whose task is running.", active);
	add(m, &n, "shardkv_migration_bytes_copied_total", KV_METRIC_COUNTER,
	    "Bytes of outgoing bulk copies acknowledged by destinations since start.", bytes_sent);

	int rv = kv_metrics_write(out, m, n);
	if (rv == KV_OK)
		rv = render_latency(s, out);
	if (rv == KV_OK)
		rv = render_ranges(s, out);
	if (rv == KV_OK)
		rv = render_lag(s, out);
	return rv;
}

/* /healthz: healthy while the server answers data requests, i.e. it holds
 * its controller lease and is not gone or stopping. */
static int
health(void *arg, char *why, size_t whylen)
{
	kv_server *s = arg;

	if (atomic_load(&s->closing) || atomic_load(&s->stopping)) {
		snprintf(why, whylen, "stopping");
		return KV_ECLOSED;
	}
	if (!kv_srv_lease_ok(s, why, whylen))
		return KV_EUNAVAIL;
	return KV_OK;
}

int
kv_srv_metrics_start(kv_server *s)
{
	char err[300] = "";
	int rv;

	if (s->cfg->metrics == NULL)
		return KV_OK;
	rv =
	    kv_metrics_create_ex(s->cfg->metrics, render, health, s, &s->metrics, err, sizeof(err));
	if (rv != KV_OK)
		KV_ERROR(COMP, "cannot serve metrics", "metrics=%s err=%s detail=\"%s\"",
		         s->cfg->metrics, kv_errname(rv), err);
	return rv;
}

void
kv_srv_metrics_stop(kv_server *s)
{
	kv_metrics_destroy(s->metrics);
	s->metrics = NULL;
}
