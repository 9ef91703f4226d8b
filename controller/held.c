/*
 * held.c - requests held for a later answer: long-polled watches, and
 * commands sent with --wait that are answered when their migrations end.
 *
 * A held request is on one list, oldest first; `ready` marks one whose
 * answer is known (a newer configuration, its migrations gone) and
 * deadline_ns bounds the others. One reaper thread answers them: it takes
 * the due ones off the list and fills their answers under mu (the history
 * is read), then encodes and sends them with mu released. Only the reaper
 * calls kv_rpc_reply for them (rpc.c accepts an answer even before the
 * handler that deferred the request has returned). At most max_watches
 * watches and CTL_MAX_WAITS waits are held (commands.c and dispatch.c
 * enforce the caps); stopping answers every one of them.
 *
 * The old primary first: a configuration that transfers a range's primary
 * role from P to Q (P kept in the ISR as the fence) reaches Q, and the
 * range's other replicas, only once P's next watch says P applied it, or
 * CTL_HANDOVER_HOLD_NS after it was installed. P drains the range as it
 * applies the configuration (writes refused, its backups'
 * acknowledgements awaited); a replica that applied it first would refuse
 * the records still in flight from P (an older leader epoch): Q's
 * transfer would not be clean (P copied again), another backup's end
 * would differ from Q's (that backup copied again) (doc/replication.md
 * "Primary transfer", step 0). Correctness never
 * depends on the order, only the cost of the transfer does.
 */
#include "common/err.h"
#include "common/log.h"
#include "controller/controller_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void
kv_ctl__held_unlink(kv_controller *c, struct ctl_held *h)
{
	h->prev->next = h->next;
	h->next->prev = h->prev;
	h->prev = h->next = NULL;
	if (h->kind == HELD_WATCH)
		c->nwatches--;
	else
		c->nwaits--;
}

void
kv_ctl__held_push(kv_controller *c, struct ctl_held *h)
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

void
kv_ctl__held_free(struct ctl_held *h)
{
	if (h == NULL)
		return;
	free(h->migs);
	free(h);
}

void
kv_ctl__handover_note_locked(kv_controller *c, const kv_config *next)
{
	uint64_t until = kv_now_ns() + CTL_HANDOVER_HOLD_NS;

	if (c->handover_unordered)
		return;
	for (size_t i = 0; i < next->nranges; i++) {
		const kv_range *r = &next->ranges[i];
		if (r->fence == 0 || r->fence == r->node || r->leader_epoch != next->epoch)
			continue;
		/* The new primary and every other replica: a backup that applied
		 * the configuration before the old primary refuses its records
		 * still in flight too, and is copied again. */
		for (uint32_t j = 0; j < kv_range_nreplicas(r); j++) {
			uint32_t to = kv_range_replica(r, j);
			bool seen = to == r->fence;
			for (size_t k = 0; k < CTL_HANDOVERS && !seen; k++)
				seen = c->hand[k].epoch == next->epoch &&
				       c->hand[k].from == r->fence && c->hand[k].to == to;
			if (seen)
				continue;
			c->hand[c->hand_next] = (struct ctl_handover){
			    .epoch = next->epoch, .from = r->fence, .to = to, .until_ns = until};
			c->hand_next = (c->hand_next + 1) % CTL_HANDOVERS;
		}
	}
}

/* Whether node is the old primary of a transfer in configuration epoch. */
static bool
hands_over_in(const kv_controller *c, uint32_t node, uint64_t epoch)
{
	for (size_t k = 0; k < CTL_HANDOVERS; k++)
		if (c->hand[k].epoch == epoch && c->hand[k].from == node)
			return true;
	return false;
}

bool
kv_ctl__handover_held_locked(kv_controller *c, uint32_t node, uint64_t known, uint64_t now,
                             uint64_t *until)
{
	uint64_t cur = kv_ctl__latest_locked(c)->epoch;
	bool held = false;

	if (node == 0 || c->closing)
		return false;
	for (size_t k = 0; k < CTL_HANDOVERS; k++) {
		const struct ctl_handover *t = &c->hand[k];
		if (t->epoch == 0 || t->to != node || t->epoch <= known || t->epoch > cur ||
		    now >= t->until_ns)
			continue;
		/* No report of the old primary here (a follower, or it never
		 * watched): nothing to wait for. */
		const struct ctl_stat *s = kv_ctl__stat_find_locked(c, t->from, false);
		if (s == NULL || s->epoch_watched >= t->epoch)
			continue;
		/* A node handing a role over in the same configuration is
		 * waited for by its own new primary: answered at once, so that
		 * two transfers in opposite directions never wait for each other. */
		if (hands_over_in(c, node, t->epoch))
			continue;
		held = true;
		if (t->until_ns < *until)
			*until = t->until_ns;
	}
	return held;
}

void
kv_ctl__watched_locked(kv_controller *c, uint32_t node, uint64_t known)
{
	struct ctl_stat *s = node ? kv_ctl__stat_find_locked(c, node, false) : NULL;

	if (s == NULL || known <= s->epoch_watched)
		return;
	s->epoch_watched = known;
	kv_ctl__wake_locked(c);
}

/* Marks the held requests that the latest config answers. */
void
kv_ctl__wake_locked(kv_controller *c)
{
	const kv_config *cur = kv_ctl__latest_locked(c);
	uint64_t now = kv_now_ns();
	bool any = false;

	for (struct ctl_held *h = c->held.next; h != &c->held; h = h->next) {
		if (h->ready)
			continue;
		if (h->kind == HELD_WATCH) {
			uint64_t until = UINT64_MAX;
			if (cur->epoch <= h->known)
				continue;
			if (kv_ctl__handover_held_locked(c, h->watcher, h->known, now, &until)) {
				if (!h->handover)
					c->handover_holds_total++;
				h->handover = true;
				if (until < h->deadline_ns) {
					h->deadline_ns = until;
					any = true; /* the reaper's next wake-up moves */
				}
				continue;
			}
			h->ready = true;
		} else {
			bool done = true;
			const struct ctl_fail *f = NULL;
			const kv_node *g = kv_config_node(cur, h->wait_gone);
			for (size_t i = 0; i < h->nmigs && done; i++)
				done = !kv_ctl__mig_in(cur, h->migs[i]);
			if (!done)
				continue;
			for (size_t i = 0; i < h->nmigs && f == NULL; i++)
				f = kv_ctl__fail_find_locked(c, h->migs[i]);
			/* A leave with replicas also waits for its node to be gone
			 * (a failed migration answers at once). */
			if (f == NULL && g != NULL && g->state != KV_NODE_GONE)
				continue;
			h->ready = true;
			h->wait_ms = (now - h->born_ns) / 1000000u;
			if (f != NULL) {
				h->err = f->err;
				snprintf(h->error, sizeof(h->error), "migration %llu %s",
				         (unsigned long long)f->id, f->msg);
			}
		}
		any = any || h->ready;
	}
	if (any)
		pthread_cond_signal(&c->cv);
}

/* Holds a --wait command until its migrations finish. */
int
kv_ctl__hold_wait_locked(kv_controller *c, const kv_admin_req *rq, struct ctl_ctx *x)
{
	struct ctl_held *h;
	uint64_t now = kv_now_ns();
	uint32_t t = rq->timeout_ms ? rq->timeout_ms : c->wait_max_ms;

	if (x->resp.nmig_ids == 0 && x->wait_gone == 0)
		return KV_OK; /* nothing moves: wait_ms 0 */
	if ((h = calloc(1, sizeof(*h))) == NULL ||
	    (h->migs = calloc(x->resp.nmig_ids ? x->resp.nmig_ids : 1, sizeof(uint64_t))) == NULL) {
		kv_ctl__held_free(h);
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
	h->wait_gone = x->wait_gone;
	kv_ctl__held_push(c, h);
	x->held = true;
	if (h->wait_gone)
		kv_ctl__wake_locked(c); /* it may be gone already */
	pthread_cond_signal(&c->cv);    /* the reaper learns the new deadline */
	return KV_OK;
}

/* Fills a watch answer from the history: the configs after known (history)
 * or the latest. Allocates *cfgs when it lists several. */
int
kv_ctl__watch_answer_locked(kv_controller *c, uint64_t known, bool history, uint32_t max,
                            kv_admin_resp *resp, const kv_config ***cfgs)
{
	const kv_config *cur = kv_ctl__latest_locked(c);

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

static void
reply_held(struct ctl_held *h, const kv_admin_resp *resp)
{
	nng_msg *m = NULL;

	if (kv_admin_resp_encode(resp, &m) != KV_OK)
		m = NULL; /* drop: the caller times out and retries */
	kv_rpc_reply(h->p, m);
}

void *
kv_ctl__reaper_main(void *arg)
{
	kv_controller *c = arg;

	kv_log_thread_name("kv-ctl-reaper");
	pthread_mutex_lock(&c->mu);
	for (;;) {
		uint64_t now = kv_now_ns(), wake = now + 1000000000u;
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
			kv_ctl__held_unlink(c, h);
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
					if (h->handover && !h->ready)
						c->handover_timeouts_total++;
					if (kv_ctl__watch_answer_locked(c, h->known, h->history,
					                                h->max_configs, r,
					                                &ans[k].cfgs) != KV_OK)
						r->err = KV_ENOMEM;
				} else if (!h->ready) {
					r->err = c->closing ? KV_ECLOSED : KV_ETIMEDOUT;
					r->error = c->closing ? "the controller is shutting down"
					           : h->wait_gone
					               ? "timed out waiting for the node to leave "
					                 "every replica set; it continues"
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
				kv_ctl__held_free(h);
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
