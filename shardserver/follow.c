/*
 * follow.c - the shard server follows the controller's configurations
 * (follow.h): the watch thread registers (retrying until the controller
 * answers), then keeps one Watch(history) long poll outstanding and applies
 * every configuration strictly in epoch order (apply_config).
 *
 * Applying a configuration changes the ownership table (ranges assigned
 * here, ranges arriving, ranges moving away after a restart), starts the
 * outgoing migrations it lists and cancels the ones it dropped
 * (kv_mig_out_start, kv_mig_out_reconcile), forgets incoming streams it no
 * longer lists, and only then publishes it (s->cur and s->epoch under
 * cfg_mu, a leaf). Only the watch thread applies configurations; nothing
 * here serves requests or moves data.
 */
#include "shardserver/follow.h"
#include "common/err.h"
#include "common/log.h"
#include "shardserver/ctlcall.h"
#include "shardserver/nodefile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COMP "server"

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

/* Whether [as, ae) and [bs, be) share a key (empty end: the end of the key
 * space). */
static bool
overlaps(const kv_buf *as, const kv_buf *ae, const kv_buf *bs, const kv_buf *be)
{
	return (ae->len == 0 || kv_key_cmp(bs->data, bs->len, ae->data, ae->len) < 0) &&
	       (be->len == 0 || kv_key_cmp(as->data, as->len, be->data, be->len) < 0);
}

/*
 * Promotion (doc/replication.md "Failover"): the parts of r, a range c
 * names this node the primary of, that the previous configuration gave to
 * another primary while this node held them as a replica outside the ISR
 * are removed from the pieces p: such a copy may lack acknowledged writes,
 * and the controller never promotes one, so it is not served. A part this
 * node held in the ISR is served at once (the failover); a part it did not
 * hold at all arrives by migration, as before.
 */
static void
promotion_check(const kv_config *prev, const kv_config *c, const kv_range *r, uint32_t me,
                kv_buf *p, size_t *n, size_t cap)
{
	for (size_t i = 0; prev != NULL && i < prev->nranges; i++) {
		const kv_range *q = &prev->ranges[i];
		if (q->node == me || !overlaps(&q->start, &q->end, &r->start, &r->end) ||
		    !kv_range_has_replica(q, me, false))
			continue;
		if (kv_range_has_replica(q, me, true)) {
			if (r->leader_epoch > q->leader_epoch)
				KV_INFO(COMP, "primary after a failover: serving the range",
				        "epoch=%llu leader_epoch=%llu old_primary=%u",
				        (unsigned long long)c->epoch,
				        (unsigned long long)r->leader_epoch, q->node);
			continue;
		}
		KV_ERROR(COMP, "named primary of a range held outside the ISR: not serving it",
		         "epoch=%llu leader_epoch=%llu old_primary=%u",
		         (unsigned long long)c->epoch, (unsigned long long)r->leader_epoch,
		         q->node);
		pieces_subtract(p, n, cap, &q->start, &q->end);
	}
}

/*
 * Demotion: a range c gives to another primary while this node stays one of
 * its replicas (a failover happened while this node was cut off or paused;
 * migrations never move replicated ranges) stops being served here at once:
 * WRONG_OWNER with the new primary as hint. The data stays, as a replica
 * copy outside the ISR. An entry already MOVED gets the current primary.
 */
static void
demote(kv_server *s, const kv_config *c, uint32_t me)
{
	for (size_t i = 0; i < c->nranges; i++) {
		const kv_range *r = &c->ranges[i];
		const kv_node *np;
		bool held = false;
		if (r->node == me || !kv_range_has_replica(r, me, false))
			continue;
		kv_owner_rdlock(&s->owner);
		for (size_t j = 0; j < s->owner.n && !held; j++) {
			const kv_owner_entry *e = &s->owner.e[j];
			held = (e->state == KV_OWN_SERVE ||
			        (e->state == KV_OWN_MOVED && e->peer != r->node)) &&
			       overlaps(&e->start, &e->end, &r->start, &r->end);
		}
		kv_owner_unlock(&s->owner);
		if (!held)
			continue;
		np = kv_config_node(c, r->node);
		if (kv_owner_set(&s->owner, r->start.data, r->start.len, r->end.data, r->end.len,
		                 KV_OWN_MOVED, r->node, np ? np->address : NULL, c->epoch, 0,
		                 NULL) != 0) {
			KV_ERROR(COMP, "out of memory demoting a range", "epoch=%llu",
			         (unsigned long long)c->epoch);
			continue;
		}
		KV_WARN(COMP, "another node is the range's primary: no longer serving it",
		        "epoch=%llu primary=%u leader_epoch=%llu", (unsigned long long)c->epoch,
		        r->node, (unsigned long long)r->leader_epoch);
	}
}

/* Applies one configuration (takes c). Called only by the watch thread. */
static void
apply_config(kv_server *s, kv_config *c)
{
	uint32_t me = atomic_load(&s->node_id);
	uint64_t *drop = NULL;
	size_t ndrop = 0;
	bool new_cluster = false, tapped;

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
		if (kv_mig_in_resume(s->mig, m))
			/* Committed here before a restart: served from the log. */
			kv_owner_fill(&s->owner, m->start.data, m->start.len, m->end.data,
			              m->end.len, KV_OWN_SERVE, 0, NULL, c->epoch, 0);
		else
			kv_owner_fill(&s->owner, m->start.data, m->start.len, m->end.data,
			              m->end.len, KV_OWN_INCOMING, m->from,
			              src ? src->address : NULL, 0, m->id);
	}
	/* 3. The initial assignment: ranges of the map owned here, minus ranges
	 * arriving by migration. */
	for (size_t i = 0; i < c->nranges; i++) {
		const kv_range *r = &c->ranges[i];
		size_t cap = 2 * c->nmigs + 2 + 2 * (s->cur ? s->cur->nranges : 0), n = 1;
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
		/* s->cur is written only by this thread: no lock to read it. */
		promotion_check(s->cur, c, r, me, p, &n, cap);
		for (size_t j = 0; j < n; j++)
			if (!kv_range_is_empty(p[2 * j].data, p[2 * j].len, p[2 * j + 1].data,
			                       p[2 * j + 1].len))
				kv_owner_fill(&s->owner, p[2 * j].data, p[2 * j].len,
				              p[2 * j + 1].data, p[2 * j + 1].len, KV_OWN_SERVE, 0,
				              NULL, c->epoch, 0);
		kv_owner_ranges_free(p, cap);
	}
	/* 3a. Ranges another node now leads while this one keeps a copy. */
	demote(s, c, me);
	/* 3b. Ranges moving away from here are still ours until the handover
	 * is published; after a restart nothing in the table says so. One whose
	 * commit an earlier run may have sent is taken back fenced. */
	for (size_t i = 0; i < c->nmigs; i++) {
		const kv_migration *m = &c->migs[i];
		const kv_node *dst = kv_config_node(c, m->to);
		if (m->from != me ||
		    kv_range_is_empty(m->start.data, m->start.len, m->end.data, m->end.len))
			continue;
		if (dst != NULL)
			kv_mig_out_claim(s->mig, m, dst->address, c->epoch);
		else
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
	/* 4b. Replication: which ranges stream to which backups, and whom this
	 * node accepts records from. */
	tapped = kv_rs_streaming(s->repl);
	if (kv_rs_apply_config(s->repl, c) != 0)
		KV_ERROR(COMP, "out of memory applying config to replication", "epoch=%llu",
		         (unsigned long long)c->epoch);
	/* Writes that began before the routing table above (and so may have
	 * skipped its log tap, kv_rs_active) end before the configuration is
	 * published: a copy to a replica outside the ISR starts only after
	 * that (doc/replication.md "Catch-up"). Once a stream existed before
	 * the table, no write skipped it (the swap waited for every one), and
	 * while replication stays off nothing needs a tap: then the node's
	 * requests are not held up (kv_owner_quiesce stops new ones too). */
	if (!tapped && kv_rs_active(s->repl))
		kv_owner_quiesce(&s->owner);
	/* 5. Publish. A node an operator made leave is DRAINING first: its
	 * GONE is then the expected end, not a removal (kv_srv_set_gone). */
	{
		const kv_node *mine = me ? kv_config_node(c, me) : NULL;
		if (mine != NULL && mine->state == KV_NODE_DRAINING)
			atomic_store(&s->drained, true);
	}
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
apply_resp_configs(kv_server *s, kv_admin_resp *r)
{
	kv_config **cfgs;
	size_t n = kv_admin_resp_take_configs(r, &cfgs);

	for (size_t i = 0; i < n; i++)
		apply_config(s, cfgs[i]);
	free(cfgs);
}

/* Registers with the controller; retries until it answers or the server stops. */
static int
do_register(kv_server *s)
{
	unsigned backoff = 50;
	bool warned = false, auth_warned = false;

	while (!atomic_load(&s->stopping)) {
		char cid[128];
		kv_admin_resp r;
		pthread_mutex_lock(&s->cfg_mu);
		memcpy(cid, s->cluster_id, sizeof(cid));
		pthread_mutex_unlock(&s->cfg_mu);
		kv_admin_req rq = {.op = KV_ADM_REGISTER,
		                   .address = s->cfg->listen,
		                   .node_id = atomic_load(&s->node_id),
		                   .join = s->cfg->join,
		                   .boot_id = s->boot_id,
		                   .restarted = atomic_load(&s->restarted),
		                   .cluster_id = cid,
		                   .epoch = atomic_load(&s->epoch)};
		uint64_t sent = kv_now_ns();
		int rv = kv_server__ctl_call(s, &rq, &r, 3000);
		if (rv == 0 && r.err == 0 && r.node_id != 0) {
			uint32_t old = atomic_load(&s->node_id);
			kv_srv_lease_renewed(s, sent); /* an answered register grants the lease */
			kv_srv_restart_confirmed(s, rq.restarted);
			atomic_store(&s->node_id, r.node_id);
			KV_INFO(COMP, "registered", "node_id=%u epoch=%llu", r.node_id,
			        (unsigned long long)r.epoch);
			if (old != r.node_id)
				save_identity(s);
			apply_resp_configs(s, &r);
			kv_admin_resp_fini(&r);
			return KV_OK;
		}
		if (rv == 0 && r.err == KV_EPERM) {
			/* Removed or left: registering again cannot succeed. */
			char why[256];
			snprintf(why, sizeof(why), "%s", r.error);
			kv_admin_resp_fini(&r);
			kv_srv_set_gone(s, why);
			return KV_EPERM;
		}
		if (rv == 0 && r.err == KV_EAUTH) {
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
			        kv_errname(rv ? rv : r.err), rv ? kv_rpc_why() : r.error);
		}
		warned = true;
		if (rv == 0)
			kv_admin_resp_fini(&r);
		kv_server__nap(s, backoff);
		backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
	}
	return KV_ECLOSED;
}

void *
kv_srv_watch_main(void *arg)
{
	kv_server *s = arg;
	unsigned backoff = 50;
	uint32_t wt = s->cfg->watch_timeout_ms ? s->cfg->watch_timeout_ms : 1000;
	bool auth_warned = false;

	kv_log_thread_name("kv-watch");
	if (do_register(s) != 0)
		return NULL;
	while (!atomic_load(&s->stopping)) {
		kv_admin_resp r;
		kv_admin_req rq = {.op = KV_ADM_WATCH,
		                   .history = true,
		                   .timeout_ms = wt,
		                   .node_id = atomic_load(&s->node_id),
		                   .epoch = atomic_load(&s->epoch)};
		int rv = kv_server__ctl_call(s, &rq, &r, wt + 2000);
		if (rv == 0 && r.err == 0) {
			apply_resp_configs(s, &r);
			kv_admin_resp_fini(&r);
			backoff = 50;
			continue;
		}
		if (rv == 0) {
			/* An auth refusal repeats every second until fixed: once. */
			if (r.err != KV_EAUTH || !auth_warned)
				KV_WARN(COMP, "watch refused", "err=%s detail=\"%s\"",
				        kv_errname(r.err), r.error);
			auth_warned |= r.err == KV_EAUTH;
			kv_admin_resp_fini(&r);
		} else {
			KV_DEBUG(COMP, "watch failed", "err=%s", kv_errname(rv));
		}
		kv_server__nap(s, backoff);
		backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
	}
	return NULL;
}
