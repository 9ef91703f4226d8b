/*
 * commands.c - the controller's commands (doc/contract.md §4, §5; doc/protocol.md):
 * join, leave, move, rebalance, cancel and the servers' register, heartbeat
 * and migration reports, config, status and watch. Each runs with mu held,
 * reads the latest configuration and fills the answer in a struct ctl_ctx
 * that the dispatcher encodes.
 *
 * A command that changes something asks placement.c for the next
 * configuration and publishes it: standalone, it appends it to the config
 * log (fsync) and only then installs it in the history; replicated, it
 * commits it through Raft (fsm.c), whose apply installs it on every
 * replica. Nobody sees a configuration before it is durable. Refusals are
 * a KV_E* code with a reason in x->msg; nothing changes then. What is
 * common to every command (authentication, dedup of retries, leadership,
 * the caps on held requests) is done once by the dispatcher.
 */
#include "common/err.h"
#include "common/lease.h"
#include "common/log.h"
#include "controller/controller_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

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

/*
 * Makes `next` (taken) durable and publishes it. On error writes the reason
 * into msg; nothing changes.
 */
static int
publish_locked(kv_controller *c, kv_config *next, const char *why, char *msg, size_t msglen)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	kv_buf buf = {0};
	int rv;

	next->epoch = cur->epoch + 1;
	next->time_ms = kv_unix_ms();
	/* --min-insync reaches the servers in every configuration; with one
	 * replica per range it stays as it was (0 reads as 1). */
	if (c->replicas >= 2)
		next->min_insync = c->min_insync;
	if (c->cluster_id[0] == '\0')
		random_cluster_id(c->cluster_id); /* replicated: the first change names it */
	if (next->cluster_id == NULL && (next->cluster_id = strdup(c->cluster_id)) == NULL) {
		rv = KV_ENOMEM;
		goto err;
	}
	const char *rule = NULL;
	size_t at = 0;
	if (kv_config_check(next, &rule, &at) != KV_OK) {
		snprintf(msg, msglen, "internal error: the planned configuration is invalid");
		KV_ERROR("controller", "planned configuration is invalid",
		         "epoch=%llu why=%s rule=\"%s\" at=%zu", (unsigned long long)next->epoch,
		         why, rule, at);
		/* The ranges around the one at fault, to find the step that made
		 * it (at is a range index for the range rules). */
		for (size_t i = at > 2 ? at - 2 : 0; i < next->nranges && i <= at + 2; i++) {
			const kv_range *r = &next->ranges[i];
			char a[96], b[96];
			kv_place_fmt_key(r->start.data, r->start.len, a, sizeof(a));
			kv_place_fmt_key(r->end.data, r->end.len, b, sizeof(b));
			char sets[256];
			size_t o = 0;
			for (uint32_t j = 0; j < r->nreplicas && o < sizeof(sets); j++)
				o += (size_t)snprintf(sets + o, sizeof(sets) - o, "%sr%u",
				                      j ? "," : "", r->replicas[j]);
			for (uint32_t j = 0; j < r->ninsync && o < sizeof(sets); j++)
				o += (size_t)snprintf(sets + o, sizeof(sets) - o, ",i%u",
				                      r->insync[j]);
			for (uint32_t j = 0; j < r->nreplacing && o < sizeof(sets); j++)
				o += (size_t)snprintf(sets + o, sizeof(sets) - o, ",%u>%u",
				                      r->replacing[j], r->replaced[j]);
			if (o == 0)
				sets[0] = '\0';
			KV_ERROR("controller", "planned range",
			         "i=%zu start=%s end=%s node=%u leader_epoch=%llu fence=%u sets=%s",
			         i, a, b, r->node, (unsigned long long)r->leader_epoch, r->fence,
			         sets);
		}
		rv = KV_EINTERNAL;
		goto err;
	}
	if ((rv = kv_ctl__hist_reserve_locked(c, 1)) != KV_OK)
		goto err;
	if ((rv = kv_codec_config_pack(next, &buf)) != KV_OK)
		goto err;
	if (c->repl != NULL) {
		rv = kv_ctl__propose_locked(c, &buf, next->epoch, msg, msglen);
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
	kv_ctl__install_locked(c, next);
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
void
kv_ctl__answer_published(struct ctl_ctx *x, const kv_config *prev, const kv_config *cfg)
{
	size_t n = 0;

	x->resp.epoch = cfg->epoch;
	x->resp.config = cfg;
	free(x->migs);
	/* Out of memory: the ids are not reported (the command is done). */
	x->migs = calloc(cfg->nmigs ? cfg->nmigs : 1, sizeof(uint64_t));
	for (size_t i = 0; x->migs && i < cfg->nmigs; i++)
		if (!kv_ctl__mig_in(prev, cfg->migs[i].id))
			x->migs[n++] = cfg->migs[i].id;
	x->resp.mig_ids = x->migs;
	x->resp.nmig_ids = n;
}

static int
refuse(struct ctl_ctx *x, int err, const kv_place_ctx *px)
{
	snprintf(x->msg, sizeof(x->msg), "%s", px->msg[0] ? px->msg : kv_strerror(err));
	return err;
}

/*
 * Answers a dry run (doc/contract.md §4) with the migrations that next
 * (taken; NULL: nothing to change) adds to prev, each with the estimates of
 * its source's data, and publishes nothing: the answer's epoch is prev's.
 */
static int
answer_plan_locked(kv_controller *c, struct ctl_ctx *x, const kv_config *prev, kv_config *next,
                   const char *why)
{
	size_t n = 0;

	x->resp.epoch = prev->epoch;
	x->resp.config = prev;
	if (next != NULL) {
		if ((x->plan = calloc(next->nmigs ? next->nmigs : 1, sizeof(*x->plan))) == NULL) {
			kv_config_free(next);
			return KV_ENOMEM;
		}
		x->plan_cfg = next;
		for (size_t i = 0; i < next->nmigs; i++) {
			kv_migration *m = &x->plan[n];
			if (kv_ctl__mig_in(prev, next->migs[i].id))
				continue;
			*m = next->migs[i]; /* its bytes stay next's */
			m->id = 0;          /* not reserved: the real run assigns it */
			kv_ctl__estimate_locked(c, m->from, (kv_bytes){m->start.data, m->start.len},
			                        (kv_bytes){m->end.data, m->end.len}, &m->keys_total,
			                        &m->bytes_total);
			n++;
		}
	}
	x->resp.plan = x->plan;
	x->resp.nplan = n;
	KV_INFO("controller", "dry run planned", "cmd=%s epoch=%llu migrations=%zu", why,
	        (unsigned long long)prev->epoch, n);
	return KV_OK;
}

/* Runs a planning result: publishes it (if anything changed) and answers;
 * a dry run only answers the plan. */
static int
commit_locked(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x, kv_place_ctx *px, int rv,
              kv_config *next, const char *why)
{
	const kv_config *prev = kv_ctl__latest_locked(c);

	if (rv != KV_OK)
		return refuse(x, rv, px);
	if (rq->dry_run)
		return answer_plan_locked(c, x, prev, next, why);
	if (next == NULL) { /* nothing to change */
		x->resp.epoch = prev->epoch;
		x->resp.config = prev;
		return KV_OK;
	}
	if ((rv = publish_locked(c, next, why, x->msg, sizeof(x->msg))) != KV_OK)
		return rv;
	kv_ctl__answer_published(x, prev, kv_ctl__latest_locked(c));
	if (rq->wait)
		return kv_ctl__hold_wait_locked(c, rq, x);
	return KV_OK;
}

/*
 * kv_place_ctx.serving (called with mu held): whether a configuration that
 * node may still act on - from the one its last heartbeat said it applied
 * (never heard from by this leader: the first) to the latest - names it
 * primary of a key of [start, end). Until it has applied the configuration
 * that deposed it, a live old primary may serve reads there, so it leaves
 * no ISR (doc/replication.md, "Primary transfer"). A node silent for the
 * down delay serves nothing: its lease has run out ("Liveness and
 * leases"), as when it is declared down.
 */
static bool
serving_cb(void *arg, uint32_t node, kv_bytes start, kv_bytes end)
{
	kv_controller *c = arg;
	const struct ctl_stat *s = kv_ctl__stat_find_locked(c, node, false);
	uint64_t from = s != NULL && s->epoch_applied > 0 ? s->epoch_applied : 1;

	if (kv_lease_down_due(kv_ctl__live_seen_locked(c, node), c->down_ns, kv_now_ns()))
		return false;

	for (uint64_t e = from; e <= c->nhist; e++) {
		const kv_config *h = c->hist[e - 1];
		long i = kv_config_find_range(h, start.p, start.len);
		for (; i >= 0 && (size_t)i < h->nranges; i++) {
			const kv_range *r = &h->ranges[i];
			if (end.len && kv_key_cmp(r->start.data, r->start.len, end.p, end.len) >= 0)
				break;
			if (r->node == node)
				return true;
		}
	}
	return false;
}

static void
ctx_init(kv_controller *c, kv_place_ctx *px)
{
	memset(px, 0, sizeof(*px));
	px->next_mig_id = c->next_mig_id;
	px->replicas = c->replicas;
	px->serving = serving_cb;
	px->serving_arg = c;
}

static int
with_points(kv_controller *c, const kv_config *cur, kv_place_ctx *px, kv_place_point **pts)
{
	size_t n = 0;
	int rv = kv_ctl__points_locked(c, cur, pts, &n);

	ctx_init(c, px);
	px->points = *pts;
	px->npoints = n;
	return rv;
}

int
kv_ctl__cmd_join(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	kv_place_point *pts = NULL;
	kv_config *next = NULL;
	kv_place_ctx px;
	uint32_t id = 0;
	int rv;

	if ((rv = with_points(c, cur, &px, &pts)) != KV_OK)
		return rv;
	/* With the balancer on, a cluster with next to no data starts as one
	 * range and splits as data arrives (doc/scheduler.md "A new cluster"). */
	if (c->auto_balance)
		px.join_floor_bytes = kv_sched_bytes_floor(&c->sched_p);
	rv = kv_place_join(cur, rq->address, !rq->no_rebalance, &px, &next, &id);
	free(pts);
	if (rv == KV_OK) {
		struct ctl_stat *s = kv_ctl__stat_find_locked(c, id, true);
		KV_INFO("controller", "node joined", "node=%u address=%s rebalance=%d", id,
		        rq->address, !rq->no_rebalance);
		x->resp.node_id = id;
		/* A new node is as fresh as its join: counted from now. */
		if (s != NULL)
			s->last_seen_ns = kv_now_ns();
	}
	return commit_locked(c, rq, x, &px, rv, next, "join");
}

static int
node_of(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x, uint32_t *id)
{
	kv_place_ctx px = {0};
	int rv = kv_place_find_node(kv_ctl__latest_locked(c), rq->node_id, rq->address, &px, id);

	return rv == KV_OK ? KV_OK : refuse(x, rv, &px);
}

int
kv_ctl__cmd_leave(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	kv_place_point *pts = NULL;
	kv_config *next = NULL;
	kv_place_ctx px;
	uint32_t id;
	int rv;

	if ((rv = node_of(c, rq, x, &id)) != KV_OK)
		return rv;
	if (kv_config_node(cur, id)->state == KV_NODE_DOWN) {
		/* Its ranges cannot be copied from a node that does not answer. */
		snprintf(x->msg, sizeof(x->msg),
		         "node %u is down: restart it, or forget it with remove "
		         "(doc/contract.md §4)",
		         id);
		return KV_EBUSY; /* not KV_EUNAVAIL, which callers retry */
	}
	if ((rv = with_points(c, cur, &px, &pts)) != KV_OK)
		return rv;
	rv = kv_place_leave(cur, id, &px, &next);
	free(pts);
	if (rv == KV_OK)
		KV_INFO("controller", "node leaving", "node=%u", id);
	/* With replicas, --wait lasts until the node is gone: its replacements
	 * are in sync and it is in no replica set. */
	if (rv == KV_OK && next != NULL && kv_config_node(next, id)->state != KV_NODE_GONE)
		x->wait_gone = id;
	x->resp.node_id = id;
	return commit_locked(c, rq, x, &px, rv, next, "leave");
}

int
kv_ctl__cmd_move(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	kv_config *next = NULL;
	kv_place_ctx px;
	uint32_t id;
	int rv;

	if ((rv = node_of(c, rq, x, &id)) != KV_OK)
		return rv;
	ctx_init(c, &px);
	px.rate_limit_mb_s = rq->rate_mb_s;
	rv = kv_place_move(cur, rq->start, rq->end, id, &px, &next);
	if (rv == KV_OK && next != NULL && !rq->dry_run) {
		char a[96], b[96];
		kv_place_fmt_key(rq->start.p, rq->start.len, a, sizeof(a));
		kv_place_fmt_key(rq->end.p, rq->end.len, b, sizeof(b));
		KV_INFO("controller", "range moving", "start=%s end=%s node=%u", a, b, id);
	}
	/* An administrator's move pins the range against the balancer until
	 * the next rebalance, in the configuration it publishes, so that the
	 * pin survives a change of leader (doc/scheduler.md "Pins"). A move to
	 * the node that owns the range already changes nothing, and pins
	 * nothing (doc/contract.md §4). */
	if (rv == KV_OK && !rq->dry_run && next != NULL) {
		int prv = kv_config_pin(next, rq->start, rq->end);
		if (prv == KV_ENOMEM) {
			kv_config_free(next);
			next = NULL;
			rv = prv;
		} else if (prv != KV_OK) {
			KV_WARN("controller", "range not pinned against the balancer",
			        "node=%u pins=%zu error=%s", id, next->npins, kv_strerror(prv));
		}
	}
	return commit_locked(c, rq, x, &px, rv, next, "move");
}

static void balance_dry_locked(kv_controller *c, const kv_config *cur, struct ctl_ctx *x);

int
kv_ctl__cmd_rebalance(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	kv_place_point *pts = NULL;
	kv_config *next = NULL;
	kv_place_ctx px;
	int rv;

	if ((rv = with_points(c, cur, &px, &pts)) != KV_OK)
		return rv;
	px.rate_limit_mb_s = rq->rate_mb_s;
	rv = kv_place_rebalance(cur, &px, &next);
	free(pts);
	/* Rebalance unpins every range (doc/scheduler.md "Pins"): the balancer
	 * may move them again. With nothing to move, the unpinning is
	 * published alone. */
	if (rv == KV_OK && !rq->dry_run && next == NULL && cur->npins > 0 &&
	    (next = kv_config_clone(cur)) == NULL)
		rv = KV_ENOMEM;
	if (rv == KV_OK && !rq->dry_run && next != NULL)
		kv_config_unpin_all(next);
	rv = commit_locked(c, rq, x, &px, rv, next, "rebalance");
	if (rv == KV_OK && rq->dry_run && c->auto_balance)
		balance_dry_locked(c, cur, x);
	return rv;
}

/* Describes decision d into buf (for the log and status). */
static void
sched_describe(const kv_sched_decision *d, char *buf, size_t len)
{
	char a[96], b[96];

	kv_place_fmt_key(d->start.data, d->start.len, a, sizeof(a));
	kv_place_fmt_key(d->end.data, d->end.len, b, sizeof(b));
	if (d->kind == KV_SCHED_HOT)
		snprintf(buf, len, "hot_key %s on node %u: %.0f ops/s, not split", a, d->from,
		         d->ops);
	else
		snprintf(buf, len, "%s [%s, %s) node %u -> %u: %s%s, %llu bytes, %.0f ops/s",
		         kv_sched_kind_name(d->kind), a, b, d->from, d->to,
		         kv_sched_why_name(d->why), d->split ? ", split" : "",
		         (unsigned long long)d->bytes, d->ops);
}

/*
 * Plans the balancer's next decisions on cur (doc/scheduler.md). With
 * commit the planner's memory advances (cool-downs, hot windows). *out
 * gets the configuration that carries the moves and transfers out (NULL:
 * none), built by kv_place_move one decision after another; a decision
 * placement refuses (a range changed meanwhile) is dropped. d[0..*n) are
 * the decisions kept.
 */
static int
balance_plan_locked(kv_controller *c, const kv_config *cur, bool commit, kv_sched_decision *d,
                    size_t cap, size_t *n, kv_config **out)
{
	kv_sched_fig *f = calloc(cur->nranges + 1, sizeof(*f));
	kv_config *w = NULL;
	size_t k = 0;
	int rv;

	*out = NULL;
	*n = 0;
	if (f == NULL)
		return KV_ENOMEM;
	kv_ctl__figs_locked(c, cur, 5000000000u, f);
	rv = kv_sched_plan(c->sched, cur, f, &c->sched_p, kv_unix_ms(), commit, d, cap, n);
	free(f);
	if (rv != KV_OK)
		return rv;
	for (size_t i = 0; i < *n; i++) {
		const kv_config *base = w != NULL ? w : cur;
		kv_config *next = NULL;
		kv_place_ctx px;
		if (d[i].kind == KV_SCHED_HOT) {
			d[k++] = d[i];
			continue;
		}
		ctx_init(c, &px);
		for (size_t m = 0; w != NULL && m < w->nmigs; m++)
			if (w->migs[m].id >= px.next_mig_id)
				px.next_mig_id = w->migs[m].id + 1;
		if (d[i].kind == KV_SCHED_SPLIT)
			rv = kv_place_split(base, (kv_bytes){d[i].start.data, d[i].start.len}, &px,
			                    &next);
		else
			rv = kv_place_move(base, (kv_bytes){d[i].start.data, d[i].start.len},
			                   (kv_bytes){d[i].end.data, d[i].end.len}, d[i].to, &px,
			                   &next);
		if (rv != KV_OK || next == NULL) {
			if (rv != KV_OK)
				KV_DEBUG("controller", "balancer decision refused by placement",
				         "detail=\"%s\"", px.msg);
			kv_sched_decisions_fini(&d[i], 1);
			if (rv == KV_ENOMEM) {
				kv_sched_decisions_fini(d, k);
				kv_sched_decisions_fini(d + i + 1, *n - i - 1);
				*n = 0;
				kv_config_free(w);
				return rv;
			}
			rv = KV_OK;
			continue;
		}
		next->epoch = cur->epoch; /* the next step plans the same epoch */
		kv_config_free(w);
		w = next;
		d[k++] = d[i];
	}
	*n = k;
	*out = w;
	return KV_OK;
}

/* rebalance --dry-run: the balancer's next decisions on cur, planned
 * without advancing its memory, into x's balance plan (doc/scheduler.md).
 * Out of memory the plan stays empty. */
static void
balance_dry_locked(kv_controller *c, const kv_config *cur, struct ctl_ctx *x)
{
	kv_sched_decision d[8];
	kv_config *next = NULL;
	size_t n = 0;

	if (cur->nranges == 0 || balance_plan_locked(c, cur, false, d, 8, &n, &next) != KV_OK)
		return;
	kv_config_free(next);
	for (size_t i = 0; i < n && i < CTL_SCHED_RECENT; i++) {
		sched_describe(&d[i], x->btext[i], sizeof(x->btext[i]));
		x->bal[i] = (kv_admin_balance){.kind = kv_sched_kind_name(d[i].kind),
		                               .reason = kv_sched_why_name(d[i].why),
		                               .what = x->btext[i]};
	}
	x->resp.balance_plan = x->bal;
	x->resp.nbalance_plan = n < CTL_SCHED_RECENT ? n : CTL_SCHED_RECENT;
	kv_sched_decisions_fini(d, n);
}

int
kv_ctl__cmd_balance(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	kv_sched_decision d[8];
	kv_config *next = NULL;
	size_t n = 0;
	int rv;

	(void)rq;
	x->resp.epoch = cur->epoch;
	c->balance_next_ns = kv_now_ns() + CTL_BALANCE_EVERY_NS;
	if (cur->nranges == 0)
		return KV_OK;
	if ((rv = balance_plan_locked(c, cur, true, d, 8, &n, &next)) != KV_OK)
		return rv;
	if (next != NULL &&
	    (rv = publish_locked(c, next, "auto-balance", x->msg, sizeof(x->msg))) != KV_OK) {
		kv_sched_decisions_fini(d, n);
		return rv;
	}
	for (size_t i = 0; i < n; i++) {
		struct ctl_sched_rec *rec = &c->sched_recent[c->sched_next++ % CTL_SCHED_RECENT];
		sched_describe(&d[i], rec->text, sizeof(rec->text));
		rec->unix_ms = kv_unix_ms();
		rec->kind = kv_sched_kind_name(d[i].kind);
		rec->reason = kv_sched_why_name(d[i].why);
		c->sched_total[d[i].kind][d[i].why]++;
		if (d[i].split)
			c->sched_splits[d[i].why]++;
		KV_INFO("controller", "auto-balance", "decision=\"%s\" epoch=%llu", rec->text,
		        (unsigned long long)kv_ctl__latest_locked(c)->epoch);
	}
	kv_sched_decisions_fini(d, n);
	return KV_OK;
}

int
kv_ctl__cmd_get_config(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = kv_ctl__latest_locked(c);

	if (rq->epoch > cur->epoch) {
		snprintf(x->msg, sizeof(x->msg), "epoch %llu was never published (latest is %llu)",
		         (unsigned long long)rq->epoch, (unsigned long long)cur->epoch);
		return KV_ENOTFOUND;
	}
	x->resp.epoch = cur->epoch;
	x->resp.config = rq->epoch ? c->hist[rq->epoch - 1] : cur;
	return KV_OK;
}

int
kv_ctl__cmd_status(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	uint64_t now = kv_now_ns();
	(void)rq;

	x->nstat = calloc(cur->nnodes ? cur->nnodes : 1, sizeof(*x->nstat));
	x->rmigs = calloc(cur->nmigs ? cur->nmigs : 1, sizeof(*x->rmigs));
	if (x->nstat == NULL || x->rmigs == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < cur->nnodes; i++) {
		const struct ctl_stat *s = kv_ctl__stat_find_locked(c, cur->nodes[i].id, false);
		kv_admin_node_stat *n = &x->nstat[i];
		n->node_id = cur->nodes[i].id;
		/* A gone node holds nothing; its last heartbeat is history. */
		if (cur->nodes[i].state == KV_NODE_GONE)
			continue;
		/* Not heard from since this leader started: at least that long. */
		n->last_seen_ms = (now - kv_ctl__live_seen_locked(c, n->node_id)) / 1000000u;
		if (s == NULL)
			continue;
		n->keys = s->keys;
		n->bytes = s->bytes;
		n->memory = s->memory;
		n->ops = s->ops;
		/* Its uptime now, if it still runs: as reported, plus the time
		 * since. A down node's is unknown. */
		if (s->uptime_ms != 0 && cur->nodes[i].state != KV_NODE_DOWN)
			n->uptime_ms = s->uptime_ms + (now - s->stats_ns) / 1000000u;
		n->epoch_applied = s->epoch_applied;
		n->nranges = s->nranges;
		n->ranges = s->ranges;
	}
	for (size_t i = 0; i < cur->nmigs; i++) {
		kv_migration *m = &x->rmigs[i];
		const struct ctl_prog *p = kv_ctl__prog_find_locked(c, cur->migs[i].id, false);
		*m = cur->migs[i];
		m->progress_age_ms =
		    (now - (p && p->last_ns > c->live_since_ns ? p->last_ns : c->live_since_ns)) /
		    1000000u;
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
	/* The balancer's latest decisions, oldest first (doc/scheduler.md). */
	for (size_t i = 0; i < CTL_SCHED_RECENT; i++) {
		const struct ctl_sched_rec *rec =
		    &c->sched_recent[(c->sched_next + i) % CTL_SCHED_RECENT];
		size_t k = x->report.nbalance;
		if (rec->unix_ms == 0)
			continue;
		snprintf(x->btext[k], sizeof(x->btext[k]), "%s", rec->text);
		x->bal[k] = (kv_admin_balance){.time_ms = rec->unix_ms,
		                               .kind = rec->kind,
		                               .reason = rec->reason,
		                               .what = x->btext[k]};
		x->report.nbalance++;
	}
	x->report.balance = x->bal;
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
	const kv_config *cur = kv_ctl__latest_locked(c);
	kv_config *next = NULL;
	kv_place_ctx px = {0};
	int rv;

	px.next_mig_id = c->next_mig_id;
	rv = kv_place_finish(cur, id, ok, &px, &next);
	if (rv != KV_OK)
		return refuse(x, rv, &px);
	if (!ok)
		kv_ctl__fail_record_locked(c, id, err, detail);
	(void)rq;
	if ((rv = publish_locked(c, next, why, x->msg, sizeof(x->msg))) != KV_OK)
		return rv;
	x->resp.epoch = kv_ctl__latest_locked(c)->epoch;
	x->resp.config = kv_ctl__latest_locked(c);
	return KV_OK;
}

/* Whether the phase of migration id is unknown here (p: its progress
 * record, NULL when none): its source has not reported to this leader
 * (replicated), or not since this controller started with it in flight
 * (standalone). It may be fenced already. */
static bool
mig_phase_unknown_locked(const kv_controller *c, uint64_t id, const struct ctl_prog *p)
{
	return p == NULL && (c->repl != NULL || id <= c->mig_unknown_max);
}

int
kv_ctl__cmd_cancel(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_migration *m = kv_ctl__mig_find(kv_ctl__latest_locked(c), rq->mig_id);
	const struct ctl_prog *p = kv_ctl__prog_find_locked(c, rq->mig_id, false);

	if (m == NULL) {
		snprintf(x->msg, sizeof(x->msg), "migration %llu is not in flight",
		         (unsigned long long)rq->mig_id);
		return KV_ENOTFOUND;
	}
	if (mig_phase_unknown_locked(c, rq->mig_id, p)) {
		/* A new leader, or a restarted controller, has not heard from the
		 * source yet: the migration may be fenced already, and cancelling
		 * it then would lose writes. */
		snprintf(x->msg, sizeof(x->msg),
		         "migration %llu has not reported its progress to this %s yet; "
		         "retry in a few seconds",
		         (unsigned long long)rq->mig_id,
		         c->repl != NULL ? "leader" : "controller since it started");
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

/* Whether node is in the ISR of a range that has another in-sync member. */
static bool
in_a_shared_isr(const kv_config *cur, uint32_t node)
{
	for (size_t i = 0; i < cur->nranges; i++) {
		const kv_range *r = &cur->ranges[i];
		uint32_t n = kv_range_ninsync(r);
		if (n < 2)
			continue;
		for (uint32_t j = 0; j < n; j++)
			if (kv_range_insync(r, j) == node)
				return true;
	}
	return false;
}

/* Commits the failover of a restarted node: its ranges get another in-sync
 * primary and it leaves every ISR, keeping its state (active or draining;
 * the primaries catch it up from its own data, or copy it, before it is
 * in sync again). Sets x->resp.node_id. */
static int
restart_failover_locked(kv_controller *c, const kv_config *cur, uint32_t id, struct ctl_ctx *x)
{
	kv_place_failover_stats fst;
	kv_node_state st = KV_NODE_DOWN;
	const kv_node *was = kv_config_node(cur, id);
	kv_node_state back = was != NULL ? was->state : KV_NODE_ACTIVE;
	kv_config *next = NULL;
	int rv;

	memset(&fst, 0, sizeof(fst));
	if ((rv = kv_place_set_state(cur, &id, &st, 1, &next)) != KV_OK)
		return rv;
	if ((rv = kv_place_failover(next, &fst)) != KV_OK) {
		kv_config_free(next);
		return rv;
	}
	for (size_t i = 0; i < next->nnodes; i++)
		if (next->nodes[i].id == id)
			next->nodes[i].state = back;
	if ((rv = publish_locked(c, next, "restart", x->msg, sizeof(x->msg))) != KV_OK)
		return rv;
	c->failovers_total += fst.failovers;
	c->isr_shrinks_total += fst.shrinks;
	KV_WARN("controller", "node restarted: its ranges failed over, it rejoins once caught up",
	        "node=%u failovers=%u isr_shrinks=%u", id, fst.failovers, fst.shrinks);
	x->resp.node_id = id;
	return KV_OK;
}

/*
 * Whether a message of node n's process `boot` that says it restarted
 * (`restarted`) names a restart still to fail over (doc/replication.md
 * "Failover"): not yet handled by this controller, and the node, active or
 * draining, is in the ISR of a range with another in-sync member. A
 * restart that needs nothing (a single copy, a node already taken out of
 * every shared ISR by a `down`) is marked handled at once.
 */
static bool
restart_unhandled_locked(const kv_config *cur, const kv_node *n, struct ctl_stat *s, bool restarted,
                         uint64_t boot)
{
	if (!restarted || boot == s->restart_done)
		return false;
	if ((n->state == KV_NODE_ACTIVE || n->state == KV_NODE_DRAINING) &&
	    in_a_shared_isr(cur, n->id))
		return true;
	s->restart_done = boot;
	if (s->restart_pending == boot)
		s->restart_pending = 0;
	return false;
}

/* Fails over the restarts that renewals reported before their node's
 * registration (kv_ctl__cmd_heartbeat): one configuration each. */
static int
restarts_locked(kv_controller *c, struct ctl_ctx *x)
{
	for (size_t i = 0; i < c->nstats; i++) {
		struct ctl_stat *s = &c->stats[i];
		const kv_config *cur = kv_ctl__latest_locked(c);
		const kv_node *n = kv_config_node(cur, s->id);
		uint64_t boot = s->restart_pending;
		int rv;
		if (boot == 0)
			continue;
		if (n == NULL || !restart_unhandled_locked(cur, n, s, true, boot)) {
			s->restart_pending = 0;
			continue;
		}
		if ((rv = restart_failover_locked(c, cur, s->id, x)) != KV_OK)
			return rv;
		s = &c->stats[i];
		s->restart_done = boot;
		s->restart_pending = 0;
	}
	return KV_OK;
}

int
kv_ctl__cmd_register(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
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
			/* KV_EPERM tells the server to stop for good (doc/contract.md §2). */
			snprintf(x->msg, sizeof(x->msg),
			         "node %u is gone (it left or was removed from the cluster); start "
			         "it with an empty data dir and --join",
			         n->id);
			return KV_EPERM;
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
			cur = kv_ctl__latest_locked(c);
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
		if ((rv = kv_ctl__cmd_join(c, &j, x)) != KV_OK)
			return rv;
		cur = kv_ctl__latest_locked(c);
		n = kv_config_node(cur, x->resp.node_id);
	}
	bool restarted = false;
	if ((s = kv_ctl__stat_find_locked(c, n->id, true)) != NULL) {
		if (s->boot_id != rq->boot_id)
			s->uptime_ms = 0; /* a new process: unknown until it reports */
		/* The server says so (Register.restarted); a server that does not
		 * is known restarted by a boot id this controller saw change. */
		restarted = restart_unhandled_locked(
		    cur, n, s, rq->restarted || (s->boot_id != 0 && s->boot_id != rq->boot_id),
		    rq->boot_id);
		s->boot_id = rq->boot_id;
		s->epoch_applied = rq->epoch;
		s->last_seen_ns = kv_now_ns();
	}
	if (restarted) {
		/* The process restarted before anyone declared it down. What it
		 * logs may be behind what its in-sync backups acknowledged (its
		 * log is synced by its own --fsync mode; an acknowledgement needs
		 * every ISR member), so it must not lead or count as in sync on
		 * what it has: the same configuration as a failure and a return
		 * (doc/replication.md, "Failover"). Its old process is gone, so no
		 * lease of it can still be running. It is answered only after
		 * that configuration, the first it applies. */
		uint32_t id = n->id;
		if ((rv = restart_failover_locked(c, cur, id, x)) != KV_OK)
			return rv;
		if ((s = kv_ctl__stat_find_locked(c, id, false)) != NULL) {
			s->restart_done = rq->boot_id;
			s->restart_pending = 0;
		}
		cur = kv_ctl__latest_locked(c);
		n = kv_config_node(cur, id);
	}
	if (n->state == KV_NODE_DOWN) {
		/* Back before it is answered: a lease is granted to live nodes only. */
		kv_config *next = NULL;
		uint32_t id = n->id;
		kv_node_state st = KV_NODE_ACTIVE;
		if ((rv = kv_place_set_state(cur, &id, &st, 1, &next)) != KV_OK)
			return rv;
		if ((rv = publish_locked(c, next, "node back", x->msg, sizeof(x->msg))) != KV_OK)
			return rv;
		KV_INFO("controller", "node is back", "node=%u via=register", id);
		cur = kv_ctl__latest_locked(c);
		n = kv_config_node(cur, id);
	}
	KV_INFO("controller", "node registered", "node=%u address=%s boot_id=%llx", n->id,
	        n->address, (unsigned long long)rq->boot_id);
	x->resp.node_id = n->id;
	x->resp.epoch = cur->epoch;
	x->resp.config = cur;
	return KV_OK;
}

int
kv_ctl__cmd_heartbeat(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	const kv_node *n = kv_config_node(cur, rq->node_id);
	struct ctl_stat *s;
	int rv;

	if (n == NULL) {
		snprintf(x->msg, sizeof(x->msg), "node %u is not a member of the cluster",
		         rq->node_id);
		return KV_ENOTFOUND;
	}
	if (n->state == KV_NODE_GONE) {
		/* KV_EPERM tells the server to stop for good (doc/contract.md §2). */
		snprintf(x->msg, sizeof(x->msg),
		         "node %u is gone (it left or was removed from the cluster)", n->id);
		return KV_EPERM;
	}
	if ((s = kv_ctl__stat_find_locked(c, n->id, true)) == NULL)
		return KV_ENOMEM;
	if (!rq->lease_only) {
		if ((rv = kv_ctl__stat_store(s, rq)) != KV_OK)
			return rv;
		s->keys = rq->keys;
		s->bytes = rq->bytes;
		s->memory = rq->memory;
		s->ops = rq->ops;
		s->uptime_ms = rq->uptime_ms;
		s->stats_ns = kv_now_ns();
	}
	bool restarted = restart_unhandled_locked(cur, n, s, rq->restarted, rq->boot_id);
	s->boot_id = rq->boot_id;
	s->epoch_applied = rq->epoch;
	s->last_seen_ns = kv_now_ns();
	if (restarted) {
		/* A restarted process whose renewal came before its registration
		 * (it knows its node id from its data dir), or that this leader
		 * hears from first: no lease until the liveness thread has
		 * committed its failover, as its registration would
		 * (doc/replication.md "Failover"). */
		s->restart_pending = rq->boot_id;
		pthread_cond_broadcast(&c->pcv);
		snprintf(x->msg, sizeof(x->msg),
		         "node %u restarted: its failover is being committed, renew again shortly",
		         n->id);
		return KV_EBUSY;
	}
	if (n->state == KV_NODE_DOWN) {
		/* No lease for a node declared down: the liveness thread commits
		 * its return, and the next renewal after that is granted. */
		pthread_cond_broadcast(&c->pcv);
		snprintf(x->msg, sizeof(x->msg),
		         "node %u is down; its return is being committed, renew again shortly",
		         n->id);
		return KV_EBUSY;
	}
	x->resp.epoch = cur->epoch;
	return KV_OK;
}

int
kv_ctl__cmd_progress(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_migration *m = kv_ctl__mig_find(kv_ctl__latest_locked(c), rq->mig_id);
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
	if ((p = kv_ctl__prog_find_locked(c, m->id, true)) == NULL)
		return KV_ENOMEM;
	/* Never back from FENCED: a source that restarts after its fence was
	 * confirmed copies again, and a cancel then would lose the writes the
	 * destination may already have taken. */
	if (rq->phase >= KV_MIG_PENDING && rq->phase <= KV_MIG_FENCED && p->phase != KV_MIG_FENCED)
		p->phase = rq->phase;
	p->keys_copied = rq->keys_copied;
	p->bytes_copied = rq->bytes_copied;
	p->keys_total = rq->keys_total;
	p->bytes_total = rq->bytes_total;
	p->rate_bytes_s = rq->rate_bytes_s;
	p->last_ns = kv_now_ns();
	x->resp.epoch = kv_ctl__latest_locked(c)->epoch;
	return KV_OK;
}

/*
 * The keys and bytes status shows per node are those of the node's last
 * heartbeat, up to a second old: right after a migration they would still
 * show the range on its source (and, if the copy came after its last
 * report, not on its destination). Until each reports again (at once, as
 * servers do after a migration), the copied figures move from the one to
 * the other. The destination's store holds what it received, so a report
 * it sent after the copy began counts them already.
 */
static void
stats_moved_locked(kv_controller *c, uint32_t src, uint32_t dst, uint64_t copy_ns, uint64_t keys,
                   uint64_t bytes)
{
	struct ctl_stat *from = kv_ctl__stat_find_locked(c, src, false);
	struct ctl_stat *to = kv_ctl__stat_find_locked(c, dst, false);

	if (from != NULL && from->stats_ns != 0) {
		from->keys -= keys < from->keys ? keys : from->keys;
		from->bytes -= bytes < from->bytes ? bytes : from->bytes;
	}
	/* A node that never reported (a new one) holds what it received. */
	if (to != NULL && (to->stats_ns == 0 || (copy_ns != 0 && to->stats_ns < copy_ns))) {
		to->keys += keys;
		to->bytes += bytes;
	}
}

int
kv_ctl__cmd_done(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	const kv_migration *m = kv_ctl__mig_find(cur, rq->mig_id);
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
		const struct ctl_prog *p = kv_ctl__prog_find_locked(c, m->id, false);
		uint64_t copy_ns = p != NULL ? p->born_ns : 0; /* about when the copy began */
		uint32_t from = m->from, to = m->to;
		int rv;
		KV_INFO("controller", "migration done",
		        "migration=%llu from=%u to=%u keys=%llu "
		        "bytes=%llu",
		        (unsigned long long)m->id, m->from, m->to, (unsigned long long)rq->keys,
		        (unsigned long long)rq->bytes);
		rv = finish_locked(c, rq, x, rq->mig_id, true, KV_OK, "", "migration done");
		if (rv == KV_OK)
			stats_moved_locked(c, from, to, copy_ns, rq->keys, rq->bytes);
		return rv;
	}
	snprintf(detail, sizeof(detail), "failed: %s%s%.120s", kv_strerror(rq->result),
	         rq->error && rq->error[0] ? ": " : "", rq->error ? rq->error : "");
	KV_WARN("controller", "migration failed", "migration=%llu from=%u to=%u err=%s",
	        (unsigned long long)m->id, m->from, m->to, kv_errname(rq->result));
	return finish_locked(c, rq, x, rq->mig_id, false, rq->result, detail, "migration failed");
}

int
kv_ctl__cmd_watch(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	struct ctl_held *h;
	uint64_t now = kv_now_ns();
	uint32_t t =
	    rq->timeout_ms && rq->timeout_ms < c->watch_max_ms ? rq->timeout_ms : c->watch_max_ms;

	uint64_t until = UINT64_MAX;
	bool handover = false;

	/* A server's watch names the epoch it applied. */
	kv_ctl__watched_locked(c, rq->node_id, rq->epoch);
	if ((cur->epoch > rq->epoch &&
	     !(handover = kv_ctl__handover_held_locked(c, rq->node_id, rq->epoch, now, &until))) ||
	    c->closing)
		return kv_ctl__watch_answer_locked(c, rq->epoch, rq->history, rq->max_configs,
		                                   &x->resp, &x->cfgs);
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
	if (until < h->deadline_ns)
		h->deadline_ns = until;
	h->known = rq->epoch;
	h->history = rq->history;
	h->max_configs = rq->max_configs;
	h->watcher = rq->node_id;
	h->handover = handover;
	c->handover_holds_total += handover;
	kv_ctl__held_push(c, h);
	pthread_cond_signal(&c->cv);
	x->held = true;
	return KV_OK;
}

int
kv_ctl__cmd_remove(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	kv_place_point *pts = NULL;
	kv_config *next = NULL;
	kv_place_ctx px;
	uint64_t *failed;
	size_t nfailed = 0;
	uint32_t id, lost = 0;
	int rv;

	if ((rv = node_of(c, rq, x, &id)) != KV_OK)
		return rv;
	if ((failed = calloc(cur->nmigs ? cur->nmigs : 1, sizeof(*failed))) == NULL)
		return KV_ENOMEM;
	if ((rv = with_points(c, cur, &px, &pts)) != KV_OK) {
		free(failed);
		return rv;
	}
	/* A joining or draining node keeps its state when silent; silent for
	 * the down delay, it may be removed like a down one. */
	bool silent = kv_lease_down_due(kv_ctl__live_seen_locked(c, id), c->down_ns, kv_now_ns());
	rv = kv_place_remove(cur, id, silent, rq->accept_data_loss, &px, &next, &lost, failed,
	                     &nfailed);
	free(pts);
	if (rv != KV_OK) {
		free(failed);
		return refuse(x, rv, &px);
	}
	/* A migration into the node whose fence was confirmed may have been
	 * committed there: the node may hold the only copy of what that range
	 * took since, and failing the migration gives the range back to its
	 * source without it. The same when this leader, or this restarted
	 * controller, has not heard from the source yet (it may be fenced
	 * already). */
	for (size_t i = 0; i < cur->nmigs; i++) {
		const kv_migration *m = &cur->migs[i];
		const struct ctl_prog *p = kv_ctl__prog_find_locked(c, m->id, false);
		bool unknown = mig_phase_unknown_locked(c, m->id, p);
		if (m->to != id || (!unknown && (p == NULL || p->phase < KV_MIG_FENCED)))
			continue;
		if (rq->accept_data_loss) {
			lost++;
			continue;
		}
		snprintf(x->msg, sizeof(x->msg),
		         unknown ? "node %u is receiving a range in migration %llu, which has not "
		                   "reported its progress to this controller yet; retry in a few "
		                   "seconds, or add --accept-data-loss"
		                 : "node %u may already serve a range it was receiving (migration "
		                   "%llu was fenced): its writes since would be lost (add "
		                   "--accept-data-loss to give the range back to its source, or "
		                   "restart the node)",
		         id, (unsigned long long)m->id);
		kv_config_free(next);
		free(failed);
		return unknown ? KV_EBUSY : KV_EPERM;
	}
	for (size_t i = 0; i < nfailed; i++)
		kv_ctl__fail_record_locked(c, failed[i], KV_EUNAVAIL, "its node was removed");
	free(failed);
	if ((rv = publish_locked(c, next, "remove", x->msg, sizeof(x->msg))) != KV_OK)
		return rv;
	if (lost > 0)
		KV_WARN("controller", "node removed, data lost", "node=%u ranges_lost=%u", id,
		        lost);
	else
		KV_INFO("controller", "node removed", "node=%u", id);
	x->resp.epoch = kv_ctl__latest_locked(c)->epoch;
	x->resp.config = kv_ctl__latest_locked(c);
	x->resp.node_id = id;
	x->resp.ranges_lost = lost;
	return KV_OK;
}

int
kv_ctl__cmd_isr_change(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	kv_config *next = NULL;
	kv_place_ctx px;
	uint32_t changed = 0;
	char a[96], b[96];
	int rv;

	ctx_init(c, &px);
	/* The transfer fence found in sync ends without a copy
	 * (doc/replication.md "Primary transfer"): a request of its own. */
	bool unfence = rq->unfence_node != 0;
	if (unfence && (rq->add_node != 0 || rq->remove_node != 0)) {
		snprintf(x->msg, sizeof(x->msg),
		         "an ISR change names exactly one of add_node, remove_node and "
		         "unfence_node");
		return KV_EINVAL;
	}
	if (unfence)
		rv = kv_place_unfence(cur, rq->node_id, rq->start, rq->end, rq->leader_epoch,
		                      rq->unfence_node, &px, &next, &changed);
	else
		rv = kv_place_isr_change(cur, rq->node_id, rq->start, rq->end, rq->leader_epoch,
		                         rq->add_node, rq->remove_node, &px, &next, &changed);
	if (rv != KV_OK)
		return refuse(x, rv, &px);
	if (next == NULL) { /* in effect already (a retry) */
		x->resp.epoch = cur->epoch;
		x->resp.config = cur;
		return KV_OK;
	}
	if ((rv = publish_locked(c, next,
	                         unfence        ? "fence in sync"
	                         : rq->add_node ? "isr expand"
	                                        : "isr shrink",
	                         x->msg, sizeof(x->msg))) != KV_OK)
		return rv;
	if (unfence)
		c->unfenced_total += changed;
	else if (rq->add_node)
		c->isr_expands_total += changed;
	else
		c->isr_shrinks_total += changed;
	kv_place_fmt_key(rq->start.p, rq->start.len, a, sizeof(a));
	kv_place_fmt_key(rq->end.p, rq->end.len, b, sizeof(b));
	KV_INFO("controller",
	        unfence        ? "transfer fence in sync: it stays in the ISR, the fence ends"
	        : rq->add_node ? "ISR expanded"
	                       : "ISR shrunk",
	        "start=%s end=%s primary=%u member=%u ranges=%u epoch=%llu", a, b, rq->node_id,
	        unfence        ? rq->unfence_node
	        : rq->add_node ? rq->add_node
	                       : rq->remove_node,
	        changed, (unsigned long long)kv_ctl__latest_locked(c)->epoch);
	kv_ctl__answer_published(x, cur, kv_ctl__latest_locked(c));
	return KV_OK;
}

uint64_t
kv_ctl__live_seen_locked(kv_controller *c, uint32_t id)
{
	const struct ctl_stat *s = kv_ctl__stat_find_locked(c, id, false);

	return kv_lease_heard(s != NULL ? s->last_seen_ns : 0, c->live_since_ns);
}

/* Fills the liveness changes due now (ids[k], states[k]); returns their
 * number. ids and states have room for every node. */
static size_t
live_plan_locked(kv_controller *c, uint64_t now, uint32_t *ids, kv_node_state *states)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	size_t k = 0;

	for (size_t i = 0; i < cur->nnodes; i++) {
		const kv_node *n = &cur->nodes[i];
		const struct ctl_stat *s = kv_ctl__stat_find_locked(c, n->id, false);
		uint64_t seen = kv_ctl__live_seen_locked(c, n->id);
		/* Only an active node goes down: joining and draining ones keep
		 * their state (status shows how long they have been silent). */
		if (n->state == KV_NODE_ACTIVE && kv_lease_down_due(seen, c->down_ns, now)) {
			ids[k] = n->id;
			states[k++] = KV_NODE_DOWN;
		} else if (n->state == KV_NODE_DOWN && s != NULL &&
		           s->last_seen_ns > c->live_since_ns &&
		           now - s->last_seen_ns < c->lease_ns) {
			ids[k] = n->id;
			states[k++] = KV_NODE_ACTIVE;
		}
	}
	return k;
}

/* Fills ids with the down nodes not heard from for down_ns + --down-after
 * (so down for longer than --down-after); returns their number. ids has
 * room for every node. */
static size_t
expired_locked(kv_controller *c, uint64_t now, uint32_t *ids)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	uint64_t after = c->down_ns + (uint64_t)c->down_after_s * 1000000000u;
	size_t k = 0;

	for (size_t i = 0; i < cur->nnodes; i++)
		if (cur->nodes[i].state == KV_NODE_DOWN &&
		    kv_lease_down_due(kv_ctl__live_seen_locked(c, cur->nodes[i].id), after, now))
			ids[k++] = cur->nodes[i].id;
	return k;
}

/* Whether the repairs may have something to do: a range being repaired, a
 * node leaving or down past --down-after with replicated ranges. Looked
 * at every CTL_REPAIR_EVERY_NS at most. */
static bool
repair_due_locked(kv_controller *c, uint64_t now)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	uint64_t after = c->down_ns + (uint64_t)c->down_after_s * 1000000000u;
	bool replicated = false;

	if (c->replicas < 2 || now < c->repair_next_ns)
		return false;
	for (size_t i = 0; i < cur->nranges; i++) {
		if (cur->ranges[i].nreplacing > 0)
			return true;
		replicated = replicated || cur->ranges[i].nreplicas > 0;
	}
	for (size_t i = 0; replicated && i < cur->nnodes; i++) {
		const kv_node *n = &cur->nodes[i];
		if (n->state == KV_NODE_DRAINING ||
		    (n->state == KV_NODE_DOWN &&
		     kv_lease_down_due(kv_ctl__live_seen_locked(c, n->id), after, now)))
			return true;
	}
	return false;
}

bool
kv_ctl__live_due_locked(kv_controller *c, uint64_t now)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	uint32_t *ids = calloc(cur->nnodes + 1, sizeof(*ids));
	kv_node_state *st = calloc(cur->nnodes + 1, sizeof(*st));
	bool due = ids && st && live_plan_locked(c, now, ids, st) > 0;

	free(ids);
	free(st);
	for (size_t i = 0; !due && i < c->nstats; i++)
		due = c->stats[i].restart_pending != 0;
	return due || repair_due_locked(c, now);
}

/* The repairs (doc/replication.md, "Repair"): plans them on the latest
 * configuration and publishes the result, if any. */
static int
repair_locked(kv_controller *c, struct ctl_ctx *x, uint64_t now)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	uint32_t *exp = calloc(cur->nnodes + 1, sizeof(*exp));
	kv_place_point *pts = NULL;
	kv_place_repair_stats st;
	kv_config *next = NULL;
	kv_place_ctx px;
	size_t k;
	int rv;

	c->repair_next_ns = now + CTL_REPAIR_EVERY_NS;
	if (exp == NULL)
		return KV_ENOMEM;
	k = expired_locked(c, now, exp);
	if ((rv = with_points(c, cur, &px, &pts)) == KV_OK)
		rv = kv_place_repair(cur, exp, k, &px, &next, &st);
	free(pts);
	free(exp);
	if (rv != KV_OK || next == NULL)
		return rv;
	if ((rv = publish_locked(c, next, "repair", x->msg, sizeof(x->msg))) != KV_OK)
		return rv;
	c->replacements_total += st.added;
	KV_INFO("controller", "ranges repaired",
	        "replacements=%u dropped=%u transfers=%u nodes_gone=%u epoch=%llu", st.added,
	        st.dropped, st.transfers, st.gone,
	        (unsigned long long)kv_ctl__latest_locked(c)->epoch);
	if (st.short_of > 0)
		KV_WARN("controller", "ranges short of a replica",
		        "count=%u note=no active node can hold another replica", st.short_of);
	return KV_OK;
}

int
kv_ctl__cmd_liveness(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	uint64_t now = kv_now_ns();
	uint32_t *ids = calloc(cur->nnodes + 1, sizeof(*ids));
	kv_node_state *st = calloc(cur->nnodes + 1, sizeof(*st));
	kv_config *next = NULL;
	kv_place_failover_stats fst;
	bool down = false;
	size_t k;
	int rv = KV_ENOMEM;

	(void)rq;
	memset(&fst, 0, sizeof(fst));
	if (ids == NULL || st == NULL)
		goto out;
	/* Restarts first: a node's return or down below is planned on the
	 * configuration that took it out of every shared ISR. */
	if ((rv = restarts_locked(c, x)) != KV_OK)
		KV_WARN("controller", "restart failover not published, retrying",
		        "err=%s msg=\"%s\"", kv_errname(rv), x->msg);
	rv = KV_OK;
	cur = kv_ctl__latest_locked(c);
	x->resp.epoch = cur->epoch;
	if ((k = live_plan_locked(c, now, ids, st)) == 0)
		goto repair;
	if ((rv = kv_place_set_state(cur, ids, st, k, &next)) != KV_OK)
		goto out;
	for (size_t i = 0; i < k; i++)
		if (st[i] == KV_NODE_DOWN)
			down = true;
	/* The configuration that declares a node down also fails its ranges
	 * over (doc/replication.md, "Failover"): by now the node's lease has
	 * certainly run out (down_ns > its lease, counted from this leader's
	 * start at the earliest). */
	if (down && (rv = kv_place_failover(next, &fst)) != KV_OK) {
		kv_config_free(next);
		goto out;
	}
	if ((rv = publish_locked(c, next, "liveness", x->msg, sizeof(x->msg))) != KV_OK)
		goto out;
	c->failovers_total += fst.failovers;
	c->isr_shrinks_total += fst.shrinks;
	for (size_t i = 0; i < fst.nev; i++)
		KV_WARN("controller", "range failed over",
		        "start=%s end=%s from=%u to=%u leader_epoch=%llu", fst.ev[i].start,
		        fst.ev[i].end, fst.ev[i].from, fst.ev[i].to,
		        (unsigned long long)fst.ev[i].leader_epoch);
	if (fst.failovers > fst.nev)
		KV_WARN("controller", "more ranges failed over", "count=%u",
		        fst.failovers - (uint32_t)fst.nev);
	if (fst.stuck > 0)
		KV_WARN("controller", "ranges without a live in-sync replica",
		        "count=%u note=unavailable until their primary returns", fst.stuck);
	for (size_t i = 0; i < k; i++) {
		uint64_t age = (now - kv_ctl__live_seen_locked(c, ids[i])) / 1000000u;
		if (st[i] == KV_NODE_DOWN) {
			c->downs_total++;
			KV_WARN("controller", "node declared down",
			        "node=%u last_seen_ms=%llu limit_ms=%llu", ids[i],
			        (unsigned long long)age,
			        (unsigned long long)(c->down_ns / 1000000u));
		} else {
			KV_INFO("controller", "node is back", "node=%u via=heartbeat", ids[i]);
		}
	}
repair:
	if (repair_due_locked(c, now))
		rv = repair_locked(c, x, now);
	x->resp.epoch = kv_ctl__latest_locked(c)->epoch;
out:
	free(ids);
	free(st);
	return rv;
}
