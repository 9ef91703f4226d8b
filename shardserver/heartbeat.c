/*
 * heartbeat.c - the shard server's heartbeats (heartbeat.h): once a second
 * the heartbeat thread reports the node's totals (keys, bytes, ops/s, RSS)
 * and per-range figures (keys, bytes, up to seven split keys (eighths of
 * the bytes), read and write rates, the key that halves the load and up to
 * seven keys cutting it in eighths, a hot key) to the controller,
 * and publishes the per-range figures for /metrics. It reads the store's
 * counters, the ownership table and the load sample; it changes nothing.
 *
 * The load sample (kv_srv_load_note, doc/scheduler.md "Statistics") costs
 * the request path one relaxed atomic add per op; one op in KV_LOAD_EVERY
 * also copies up to KV_LOAD_KEYMAX bytes of its first key into a ring
 * under a try-lock it never waits for. Every heartbeat empties the ring,
 * gives each range the rates of the samples that fall in it (decayed:
 * each second weighs LOAD_ALPHA), and from that second's samples alone the
 * key that halves its load, the keys cutting it in eighths and a key taking
 * at least half of it.
 *
 * The lease thread renews the server's lease (doc/contract.md §2, the
 * arithmetic in doc/operations.md "Leases") with a light heartbeat every
 * renew_ns that measures nothing. The lease runs from the send time of the
 * last renewal the controller answered OK, for lease_ns; without one the
 * server answers no data request (dispatch.c, kv_srv_lease_ok). The
 * controller refuses renewals from a node it declared down (BUSY: its
 * return is being committed) or gone (PERM: the server stops for good).
 */
#include "shardserver/heartbeat.h"
#include "common/err.h"
#include "common/log.h"
#include "common/slice.h"
#include "shardserver/ctlcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define COMP "server"

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

/* Weight of the last second in the decayed rates (about a 3 s window). */
#define LOAD_ALPHA 0.3
/* Fewer samples in a range than this give no load split key nor hot key. */
#define LOAD_MIN_SAMPLES 16u

void
kv_srv_load_note(kv_server *s, const kv_op *op, bool write)
{
	uint64_t t = atomic_fetch_add_explicit(&s->load_tick, 1, memory_order_relaxed);
	kv_bytes k = op->key;

	if (t % KV_LOAD_EVERY != 0)
		return;
	if (op->nkeys && op->keys != NULL)
		k = op->keys[0];
	else if (op->kind == KV_OP_SCAN || op->kind == KV_OP_COUNT || op->kind == KV_OP_DELRANGE)
		k = op->cursor.len ? op->cursor : op->start;
	if (atomic_exchange_explicit(&s->load_busy, true, memory_order_acquire))
		return; /* the heartbeat thread is emptying the ring: drop this one */
	kv_load_sample *x = &s->load[s->nload % KV_LOAD_SLOTS];
	x->len = (uint8_t)(k.len < KV_LOAD_KEYMAX ? k.len : KV_LOAD_KEYMAX);
	x->write = write;
	if (x->len)
		memcpy(x->key, k.p, x->len);
	s->nload++;
	atomic_store_explicit(&s->load_busy, false, memory_order_release);
}

/* Moves the ring's samples into out (capacity KV_LOAD_SLOTS) and empties
 * it. Returns the samples copied; *taken gets how many were recorded since
 * the last call (more than copied when the ring wrapped). */
static size_t
load_take(kv_server *s, kv_load_sample *out, size_t *taken)
{
	size_t n;

	while (atomic_exchange_explicit(&s->load_busy, true, memory_order_acquire))
		; /* held for one key copy at most */
	*taken = s->nload;
	n = s->nload < KV_LOAD_SLOTS ? s->nload : KV_LOAD_SLOTS;
	memcpy(out, s->load, n * sizeof(*out));
	s->nload = 0;
	atomic_store_explicit(&s->load_busy, false, memory_order_release);
	return n;
}

static int
sample_cmp(const void *a, const void *b)
{
	const kv_load_sample *x = a, *y = b;
	return kv_key_cmp(x->key, x->len, y->key, y->len);
}

/* Index of the range of rg (n sorted start, end pairs) that holds key, or
 * n. */
static size_t
range_of(const kv_buf *rg, size_t n, const uint8_t *key, size_t len)
{
	size_t lo = 0, hi = n;

	while (lo < hi) { /* the last range whose start is <= key */
		size_t mid = (lo + hi) / 2;
		if (kv_key_cmp(rg[2 * mid].data, rg[2 * mid].len, key, len) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return n;
	lo--;
	const kv_buf *en = &rg[2 * lo + 1];
	if (en->len && kv_key_cmp(key, len, en->data, en->len) >= 0)
		return n;
	return lo;
}

/* A range's figures come from the first store partitions that hold this
 * many of its keys (kv_store_range_estimate): exact below it; above it
 * off by about 1% where ten keys share all but their last byte (decimal
 * suffixes), a few % where 256 do, for an eighth of a whole walk of a
 * range of 1,000,000 keys at the default 16 partitions (doc/store.md). */
#define HB_COUNT_SAMPLE 131072u

/* Byte split keys per range: the eighths (kv_store_range_split_keys). */
#define HB_SPLITS 7
/* Load split keys per range: the eighths of the sampled load. */
#define HB_LOAD_SPLITS 7

/* Fills the statistics of one range: counts and up to HB_SPLITS quantile
 * keys (split and splitv: HB_SPLITS each). */
static void
range_stats(kv_server *s, const kv_buf *st, const kv_buf *en, kv_admin_range_stat *out,
            kv_buf *split, kv_bytes *splitv)
{
	out->split = splitv;

	if (kv_store_range_estimate(s->store, st->data, st->len, en->data, en->len, HB_COUNT_SAMPLE,
	                            &out->keys, &out->bytes, NULL) != KV_OK)
		out->keys = out->bytes = 0;
	out->start.p = st->data;
	out->start.len = st->len;
	out->end.p = en->data;
	out->end.len = en->len;
	out->nsplit = 0;
	(void)kv_store_range_split_keys(s->store, st->data, st->len, en->data, en->len, HB_SPLITS,
	                                split);
	for (size_t i = 0; i < HB_SPLITS; i++) {
		const kv_bytes *prev = out->nsplit ? &out->split[out->nsplit - 1] : NULL;
		if (split[i].len == 0 ||
		    (prev != NULL &&
		     kv_key_cmp(prev->p, prev->len, split[i].data, split[i].len) >= 0))
			continue;
		out->split[out->nsplit++] = (kv_bytes){split[i].data, split[i].len};
	}
}

/* Whether range stat a's range lies inside b's. */
static bool
inside(const kv_admin_range_stat *a, const kv_admin_range_stat *b)
{
	return kv_range_within(a->start.p, a->start.len, a->end.p, a->end.len, b->start.p,
	                       b->start.len, b->end.p, b->end.len);
}

void
kv_srv_carry_rates(const kv_admin_range_stat *ors, const double *ord, const double *owr, size_t m,
                   const kv_admin_range_stat *rs, double *rd, double *wr, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		rd[i] = wr[i] = 0;
		for (size_t j = 0; j < m; j++) {
			double share;
			if (inside(&ors[j], &rs[i]))
				share = 1; /* the same range, or a part of a merge */
			else if (!inside(&rs[i], &ors[j]))
				continue; /* new here, or overlapping in part */
			else if (ors[j].bytes == 0)
				share = 0; /* a cut of a range that held nothing */
			else if (rs[i].bytes >= ors[j].bytes)
				share = 1;
			else
				share = (double)rs[i].bytes / (double)ors[j].bytes;
			rd[i] += ord[j] * share;
			wr[i] += owr[j] * share;
		}
	}
}

/* Per-range statistics of the last count, reused between counts. */
typedef struct {
	kv_buf *rg;              /* served ranges (start, end pairs) */
	size_t n;                /* ranges */
	kv_admin_range_stat *rs; /* n statistics, borrowing rg and split */
	kv_buf *split;           /* HB_SPLITS split keys per range */
	kv_bytes *splitv;        /* views of split, what rs[i].split points at */
	double *rd, *wr;         /* n decayed read / write rates */
	kv_buf *lkey;            /* LKEYS per range: load split key, hot key, then
	                            HB_LOAD_SPLITS load quantile keys */
	kv_bytes *lsplitv;       /* HB_LOAD_SPLITS per range: what rs[i].lsplit
	                            points at */
} hb_cache;

/* Keys kept per range in hb_cache.lkey. */
#define LKEYS (2 + HB_LOAD_SPLITS)

static void
hb_cache_fini(hb_cache *c)
{
	if (c->split)
		for (size_t i = 0; i < HB_SPLITS * (c->n + 1); i++)
			kv_buf_fini(&c->split[i]);
	if (c->lkey)
		for (size_t i = 0; i < LKEYS * (c->n + 1); i++)
			kv_buf_fini(&c->lkey[i]);
	free(c->lkey);
	free(c->lsplitv);
	free(c->rd);
	free(c->wr);
	free(c->split);
	free(c->splitv);
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
 * The load quantile keys of one range from its samples smp[0..n) (sorted, n
 * at least LOAD_MIN_SAMPLES): for each eighth t of the load, the first key
 * of the run of equal samples whose start is nearest sample t * n / 8, so
 * that the samples below the key are about t eighths (a run of one hot key
 * is never cut). The first run's key (nothing below it), keys not
 * strictly inside the range and repeats are skipped; rs->lsplit gets views of keys
 * (HB_LOAD_SPLITS).
 */
static void
load_quantiles(const kv_load_sample *smp, size_t n, const kv_buf *st, kv_admin_range_stat *rs,
               kv_buf *keys)
{
	for (size_t t = 1; t <= HB_LOAD_SPLITS; t++) {
		size_t at = t * n / (HB_LOAD_SPLITS + 1), a = at, b = at;
		while (a > 0 && sample_cmp(&smp[a - 1], &smp[at]) == 0)
			a--;
		while (b < n && sample_cmp(&smp[b], &smp[at]) == 0)
			b++;
		size_t k = (at - a <= b - at || b == n) ? a : b;
		const kv_load_sample *x = &smp[k];
		const kv_bytes *prev = rs->nlsplit ? &rs->lsplit[rs->nlsplit - 1] : NULL;
		if (k == 0 || kv_key_cmp(x->key, x->len, st->data, st->len) <= 0 ||
		    (prev != NULL && kv_key_cmp(prev->p, prev->len, x->key, x->len) >= 0))
			continue;
		if (kv_buf_set(&keys[rs->nlsplit], x->key, x->len) != 0)
			return;
		rs->lsplit[rs->nlsplit] = (kv_bytes){keys[rs->nlsplit].data, keys[rs->nlsplit].len};
		rs->nlsplit++;
	}
}

/*
 * Gives the ranges of c the load of this second's samples smp[0..n) (sorted
 * by key), each standing for `each` ops over dt seconds: decayed rates, and
 * from these samples alone the load split key and the hot key.
 */
static void
load_apply(hb_cache *c, const kv_load_sample *smp, size_t n, double each, double dt)
{
	size_t i = 0;

	for (size_t r = 0; r < c->n; r++) {
		kv_admin_range_stat *rs = &c->rs[r];
		double rd = 0, wr = 0;
		size_t first, cnt;

		while (i < n && range_of(c->rg, c->n, smp[i].key, smp[i].len) < r)
			i++;
		first = i;
		while (i < n && range_of(c->rg, c->n, smp[i].key, smp[i].len) == r) {
			if (smp[i].write)
				wr += each;
			else
				rd += each;
			i++;
		}
		cnt = i - first;
		c->rd[r] = LOAD_ALPHA * rd / dt + (1 - LOAD_ALPHA) * c->rd[r];
		c->wr[r] = LOAD_ALPHA * wr / dt + (1 - LOAD_ALPHA) * c->wr[r];
		rs->reads = c->rd[r];
		rs->writes = c->wr[r];
		kv_buf *lk = &c->lkey[LKEYS * r];
		rs->load_split = (kv_bytes){0};
		rs->hot_key = (kv_bytes){0};
		rs->hot_share = 0;
		rs->lsplit = &c->lsplitv[HB_LOAD_SPLITS * r];
		rs->nlsplit = 0;
		if (cnt < LOAD_MIN_SAMPLES)
			continue;
		/* The median sample halves the load when strictly inside. */
		const kv_load_sample *m = &smp[first + cnt / 2];
		const kv_buf *st = &c->rg[2 * r];
		if (kv_key_cmp(m->key, m->len, st->data, st->len) > 0 &&
		    kv_buf_set(&lk[0], m->key, m->len) == 0)
			rs->load_split = (kv_bytes){lk[0].data, lk[0].len};
		load_quantiles(smp + first, cnt, st, rs, &lk[2]);
		/* The longest run of one key. */
		size_t best = 0, bestlen = 0;
		for (size_t j = first; j < first + cnt;) {
			size_t k = j + 1;
			while (k < first + cnt && sample_cmp(&smp[j], &smp[k]) == 0)
				k++;
			if (k - j > bestlen) {
				best = j;
				bestlen = k - j;
			}
			j = k;
		}
		if (2 * bestlen >= cnt && kv_buf_set(&lk[1], smp[best].key, smp[best].len) == 0) {
			rs->hot_key = (kv_bytes){lk[1].data, lk[1].len};
			rs->hot_share = (double)bestlen / (double)cnt;
		}
	}
}

/*
 * The heartbeat's walks sleep this long between two holds of 256 entries
 * (kv_store_thread_walk_pause), so that its counts run at a fraction of a
 * core instead of flat out beside the requests: the recount of one range
 * of 1,000,000 keys with its split keys took 30-43 ms of a core at once
 * without the pause and about 640 ms with it, on an idle node, and the
 * node's p99.9 fell by a third (bench/README.md, 2026-12-05).
 */
#define HB_WALK_PAUSE_US 50u

/*
 * Counting a range walks a sample of it (kv_store_range_estimate: the
 * first partitions that hold HB_COUNT_SAMPLE of its keys, all of a smaller
 * one), so the per-range figures are recounted every heartbeat only for
 * small stores: every
 * 1 + keys / 500000 heartbeats otherwise, and whenever the served ranges
 * change; never while no key was added or removed and no value changed
 * size (kv_store_stats.changes), as under a read load, whose requests the
 * walk would otherwise slow by passing over every key each time. Node
 * totals come from the store's counters every time.
 */
void *
kv_srv_heartbeat_main(void *arg)
{
	kv_server *s = arg;
	uint64_t last_ops = 0, last_ns = kv_now_ns(), prev_ns = last_ns, tick = 0;
	/* The store's changes when the last count began; none yet: UINT64_MAX. */
	uint64_t counted_at = UINT64_MAX;
	hb_cache cache = {0};
	kv_load_sample *smp = malloc(KV_LOAD_SLOTS * sizeof(*smp));

	kv_log_thread_name("kv-heartbeat");
	(void)kv_thread_slice(KV_BULK_SLICE_US);
	kv_store_thread_walk_pause(HB_WALK_PAUSE_US);
	while (!atomic_load(&s->stopping)) {
		kv_buf *rg = NULL;
		kv_store_stats st;
		kv_admin_resp r;
		size_t n = 0;

		/* A second, or less when a migration changed what the node holds
		 * (kv_mig_env.held_changed). */
		for (unsigned ms = 0;
		     ms < 1000 && !atomic_load(&s->stopping) && !atomic_exchange(&s->hb_now, false);
		     ms += 10)
			kv_server__nap(s, 10);
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
		bool same = ranges_equal(rg, n, cache.rg, cache.n);
		bool due = tick++ % period == 0 && st.changes != counted_at;
		if (due || !same) {
			/* The last count's figures, until the new ones have their
			 * rates: a recount of the same ranges keeps them, new
			 * ranges take theirs from the old (kv_srv_carry_rates). */
			hb_cache old = cache;
			double *rd = same ? old.rd : NULL, *wr = same ? old.wr : NULL;
			if (same)
				old.rd = old.wr = NULL;
			memset(&cache, 0, sizeof(cache));
			cache.rg = rg;
			cache.n = n;
			rg = NULL;
			cache.rs = calloc(n + 1, sizeof(*cache.rs));
			cache.split = calloc(HB_SPLITS * (n + 1), sizeof(*cache.split));
			cache.splitv = calloc(HB_SPLITS * (n + 1), sizeof(*cache.splitv));
			cache.lkey = calloc(LKEYS * (n + 1), sizeof(*cache.lkey));
			cache.lsplitv = calloc(HB_LOAD_SPLITS * (n + 1), sizeof(*cache.lsplitv));
			cache.rd = rd != NULL ? rd : calloc(n + 1, sizeof(*cache.rd));
			cache.wr = wr != NULL ? wr : calloc(n + 1, sizeof(*cache.wr));
			if (cache.rs == NULL || cache.split == NULL || cache.splitv == NULL ||
			    cache.lkey == NULL || cache.lsplitv == NULL || cache.rd == NULL ||
			    cache.wr == NULL) {
				hb_cache_fini(&cache);
				hb_cache_fini(&old);
				continue;
			}
			uint64_t t0 = kv_now_ns();
			/* Read before the walk: a change during it is counted again. */
			counted_at = st.changes;
			for (size_t i = 0; i < n; i++)
				range_stats(s, &cache.rg[2 * i], &cache.rg[2 * i + 1], &cache.rs[i],
				            &cache.split[HB_SPLITS * i],
				            &cache.splitv[HB_SPLITS * i]);
			if (!same)
				kv_srv_carry_rates(old.rs, old.rd, old.wr, old.n, cache.rs,
				                   cache.rd, cache.wr, n);
			hb_cache_fini(&old);
			KV_DEBUG(COMP, "ranges counted", "ranges=%zu keys=%llu ms=%llu", n,
			         (unsigned long long)st.keys,
			         (unsigned long long)((kv_now_ns() - t0) / 1000000u));
			kv_srv_metrics_set_ranges(s, cache.rs, cache.n);
			atomic_fetch_add_explicit(&s->range_counts, 1, memory_order_relaxed);
		}
		kv_owner_ranges_free(rg, n);
		size_t taken = 0, ns = smp != NULL ? load_take(s, smp, &taken) : 0;
		if (ns > 1)
			qsort(smp, ns, sizeof(*smp), sample_cmp);
		double dt = (double)(now - prev_ns + 1) / 1e9;
		load_apply(&cache, smp, ns,
		           ns ? (double)KV_LOAD_EVERY * (double)taken / (double)ns : 0, dt);
		prev_ns = now;
		for (size_t i = 0; i < cache.n; i++)
			cache.rs[i].ops = cache.rs[i].reads + cache.rs[i].writes;
		kv_admin_req rq = {.op = KV_ADM_HEARTBEAT,
		                   .node_id = me,
		                   .boot_id = s->boot_id,
		                   .restarted = atomic_load(&s->restarted),
		                   .epoch = atomic_load(&s->epoch),
		                   .nranges = cache.n,
		                   .ranges = cache.rs,
		                   .keys = st.keys,
		                   .bytes = st.bytes,
		                   .ops = rate,
		                   .memory = rss_bytes(),
		                   .uptime_ms = (kv_now_ns() - s->created_ns) / 1000000u};
		if (kv_server__ctl_call(s, &rq, &r, 1000) == 0) {
			if (r.err == KV_OK)
				kv_srv_restart_confirmed(s, rq.restarted);
			kv_admin_resp_fini(&r);
		}
	}
	hb_cache_fini(&cache);
	free(smp);
	return NULL;
}

void
kv_srv_restart_confirmed(kv_server *s, bool said)
{
	if (said && atomic_exchange(&s->restarted, false))
		KV_INFO("server", "restart handled by the controller: no longer saying so",
		        "node_id=%u", atomic_load(&s->node_id));
}

void
kv_srv_set_gone(kv_server *s, const char *detail)
{
	if (atomic_load(&s->gone))
		return;
	pthread_mutex_lock(&s->cfg_mu);
	snprintf(s->gone_why, sizeof(s->gone_why), "%s", detail);
	pthread_mutex_unlock(&s->cfg_mu);
	atomic_store(&s->gone, true);
	if (atomic_load(&s->leaving)) /* the end of kv_server_leave: expected */
		KV_INFO("server", "node is gone from the cluster", "node_id=%u",
		        atomic_load(&s->node_id));
	else if (atomic_load(&s->drained)) /* drained by `shardkv leave`: expected */
		KV_INFO("server", "node left the cluster: stopping", "node_id=%u detail=\"%s\"",
		        atomic_load(&s->node_id), detail);
	else
		KV_ERROR("server", "node is gone from the cluster: serving nothing more",
		         "node_id=%u detail=\"%s\"", atomic_load(&s->node_id), detail);
}

/* Whether the configuration this server follows says it is gone while it
 * is not leaving on its own (kv_server_leave ends that way by design). */
static bool
gone_in_config(kv_server *s, uint32_t me)
{
	bool gone = false;

	pthread_mutex_lock(&s->cfg_mu);
	if (s->cur != NULL && me != 0) {
		const kv_node *n = kv_config_node(s->cur, me);
		gone = n != NULL && n->state == KV_NODE_GONE;
	}
	pthread_mutex_unlock(&s->cfg_mu);
	return gone && !atomic_load(&s->leaving);
}

void *
kv_srv_lease_main(void *arg)
{
	kv_server *s = arg;
	bool held = false, busy_logged = false;

	kv_log_thread_name("kv-lease");
	while (!atomic_load(&s->stopping)) {
		uint32_t me = atomic_load(&s->node_id);
		uint64_t sent = kv_now_ns();
		kv_admin_resp r;
		char why[160];

		if (me != 0 && !atomic_load(&s->gone)) {
			kv_admin_req rq = {.op = KV_ADM_HEARTBEAT,
			                   .node_id = me,
			                   .boot_id = s->boot_id,
			                   .restarted = atomic_load(&s->restarted),
			                   .epoch = atomic_load(&s->epoch),
			                   .lease_only = true};
			uint32_t t = (uint32_t)(s->lease_ns / 2000000u);
			int rv = kv_server__ctl_call(s, &rq, &r, t ? t : 1);
			if (rv == KV_OK) {
				char lw[160];
				if (r.err == KV_OK && !kv_srv_lease_ok(s, lw, sizeof(lw)) &&
				    atomic_load(&s->epoch) < r.epoch) {
					/* The lease lapsed: the controller may have given this
					 * node's ranges to others meanwhile, in configurations
					 * up to r.epoch that it has not applied yet (a burst
					 * follows a pause). Serving again now would answer as a
					 * primary it no longer is; the next renewal, once they
					 * are applied, grants it. */
					kv_srv_restart_confirmed(s, rq.restarted);
				} else if (r.err == KV_OK) {
					kv_srv_restart_confirmed(s, rq.restarted);
					kv_srv_lease_renewed(s, sent);
					busy_logged = false;
				} else if (r.err == KV_EPERM) {
					snprintf(why, sizeof(why), "%s", r.error);
					kv_srv_set_gone(s, why);
				} else if (r.err == KV_EBUSY && !busy_logged) {
					KV_WARN("server", "lease renewal refused", "detail=\"%s\"",
					        r.error);
					busy_logged = true;
				}
				kv_admin_resp_fini(&r);
			}
		}
		if (gone_in_config(s, me))
			kv_srv_set_gone(s, "the configuration marks this node gone (removed or "
			                   "left by an operator)");
		bool ok = kv_srv_lease_ok(s, why, sizeof(why));
		if (held && !ok)
			KV_WARN("server", "lease lost: answering no data request", "detail=\"%s\"",
			        why);
		else if (!held && ok && atomic_load(&s->lease_sent_ns) != 0)
			KV_INFO("server", "lease held: serving", "node_id=%u", me);
		held = ok;
		/* The next renewal one period after this one was sent. */
		uint64_t now = kv_now_ns(), next = sent + s->renew_ns;
		if (next > now)
			kv_server__nap(s, (unsigned)((next - now + 999999u) / 1000000u));
	}
	return NULL;
}
