/*
 * dispatch.c - from request to answer: the command table, the checks
 * every request goes through once (decoding, the auth token, the command,
 * leadership, the dedup memories, the caps on held requests), running the
 * command under mu and encoding its answer; and, replicated, the proposer
 * thread that runs the mutating commands one at a time at the leader.
 *
 * nng threads run kv_ctl__handle. Standalone, every command runs there
 * with mu held (the config log's write and fsync included). Replicated,
 * watches run on any replica, config on a follower that has the epoch,
 * everything else at the leader only (NOT_LEADER names it otherwise); the
 * mutating commands are queued for the proposer, which plans each on the
 * state the previous one committed and waits for its commit with mu
 * released. A retried change (same client id and request id) is answered
 * with the first answer (this replica's memory) or with what the
 * replicated record says it did (a leader that died before answering).
 */
#include "common/err.h"
#include "common/log.h"
#include "controller/controller_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A mutating request waiting for the proposer thread (replicated mode). */
struct ctl_job {
	struct ctl_job *next;      /* queue link */
	kv_rpc_pending *p;         /* the request slot */
	kv_admin_req rq;           /* the decoded request (owned) */
	const struct ctl_cmd *cmd; /* its command */
};

/* What the dispatcher does for a command, besides running it. */
enum {
	CTL_ADMIN = 1u << 0,   /* an operator command (doc/contract.md §4) */
	CTL_SERVER = 1u << 1,  /* sent by shard servers */
	CTL_MUTATES = 1u << 2, /* may publish a configuration: deduplicated by
	                          client id, refused while stopping, and
	                          (replicated) run by the proposer thread */
	CTL_WAITS = 1u << 3,   /* honours AdminRequest.wait (capped) */
	CTL_LEADER = 1u << 4,  /* replicated: only the leader runs it, others
	                          answer NOT_LEADER */
	CTL_READ = 1u << 5,    /* with CTL_LEADER: a follower answers from what
	                          it has applied when it has the asked epoch */
	CTL_PLACES = 1u << 6,  /* places data by size: a new leader first waits
	                          (bounded) for the servers' heartbeats */
	CTL_QUIET = 1u << 7,   /* frequent: log at debug level only */
};

/* The controller's commands: op, name, handler, flags. */
struct ctl_cmd {
	kv_admin_op op;   /* AdminRequest command */
	const char *name; /* for the log */
	kv_ctl_cmd_fn fn; /* commands.c */
	unsigned flags;   /* CTL_* */
};

static const struct ctl_cmd ctl_cmds[] = {
    {KV_ADM_JOIN, "join", kv_ctl__cmd_join,
     CTL_ADMIN | CTL_MUTATES | CTL_LEADER | CTL_WAITS | CTL_PLACES},
    {KV_ADM_LEAVE, "leave", kv_ctl__cmd_leave,
     CTL_ADMIN | CTL_MUTATES | CTL_LEADER | CTL_WAITS | CTL_PLACES},
    {KV_ADM_MOVE, "move", kv_ctl__cmd_move, CTL_ADMIN | CTL_MUTATES | CTL_LEADER | CTL_WAITS},
    {KV_ADM_REBALANCE, "rebalance", kv_ctl__cmd_rebalance,
     CTL_ADMIN | CTL_MUTATES | CTL_LEADER | CTL_WAITS | CTL_PLACES},
    {KV_ADM_GET_CONFIG, "config", kv_ctl__cmd_get_config, CTL_LEADER | CTL_READ | CTL_QUIET},
    {KV_ADM_STATUS, "status", kv_ctl__cmd_status, CTL_ADMIN | CTL_LEADER},
    {KV_ADM_CANCEL, "cancel", kv_ctl__cmd_cancel, CTL_ADMIN | CTL_MUTATES | CTL_LEADER},
    {KV_ADM_REGISTER, "register", kv_ctl__cmd_register, CTL_SERVER | CTL_MUTATES | CTL_LEADER},
    {KV_ADM_HEARTBEAT, "heartbeat", kv_ctl__cmd_heartbeat, CTL_SERVER | CTL_LEADER | CTL_QUIET},
    {KV_ADM_PROGRESS, "migration-progress", kv_ctl__cmd_progress,
     CTL_SERVER | CTL_LEADER | CTL_QUIET},
    {KV_ADM_DONE, "migration-done", kv_ctl__cmd_done, CTL_SERVER | CTL_MUTATES | CTL_LEADER},
    {KV_ADM_ISR_CHANGE, "isr-change", kv_ctl__cmd_isr_change,
     CTL_SERVER | CTL_MUTATES | CTL_LEADER},
    {KV_ADM_REMOVE, "remove", kv_ctl__cmd_remove,
     CTL_ADMIN | CTL_MUTATES | CTL_LEADER | CTL_PLACES},
    /* Any replica holds watches and answers them from what it applied. */
    {KV_ADM_WATCH, "watch", kv_ctl__cmd_watch, CTL_QUIET},
};

/* The liveness change: not in the table, so nothing from the network runs
 * it; the liveness thread queues it (a job without a request slot). */
static const struct ctl_cmd ctl_liveness = {0, "liveness", kv_ctl__cmd_liveness, CTL_MUTATES};
/* The balancer's round (doc/scheduler.md): the same, every
 * CTL_BALANCE_EVERY_NS with --auto-balance on; it places data, so a new
 * leader runs it only once the heartbeats came in. */
static const struct ctl_cmd ctl_balance = {0, "auto-balance", kv_ctl__cmd_balance,
                                           CTL_MUTATES | CTL_PLACES};

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

	kv_ctl__answer_published(x, prev, cfg);
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
	/* A dry run changes nothing: no dedup memory either way. */
	bool dedup =
	    cmd != NULL && (cmd->flags & CTL_MUTATES) && rq->client_id != 0 && !rq->dry_run;

	if (rv == KV_OK && dedup) {
		const struct ctl_dedup *d = dedup_find_locked(c, rq->client_id, rq->request_id);
		const struct ctl_rdedup *rd =
		    c->repl ? kv_ctl__rdedup_find_locked(c, rq->client_id, rq->request_id) : NULL;
		if (d != NULL) {
			rv = nng_msg_alloc(reply, d->len) == 0 ? KV_OK : KV_ENOMEM;
			if (rv == KV_OK)
				memcpy(nng_msg_body(*reply), d->reply, d->len);
			return rv;
		}
		if (rd != NULL) {
			answer_rdedup_locked(c, rq, rd, x);
			return kv_admin_resp_encode(&x->resp, reply);
		}
	}
	if (rv == KV_OK) {
		if (c->closing && (cmd->flags & CTL_MUTATES)) {
			snprintf(x->msg, sizeof(x->msg), "the controller is shutting down");
			rv = KV_ECLOSED;
		} else if (rq->dry_run && rq->op != KV_ADM_MOVE && rq->op != KV_ADM_REBALANCE) {
			snprintf(x->msg, sizeof(x->msg), "%s has no dry run", cmd->name);
			rv = KV_EINVAL;
		} else if (rq->dry_run && rq->wait) {
			/* Nothing starts, so there is nothing to wait for. */
			snprintf(x->msg, sizeof(x->msg), "--wait and --dry-run exclude each other");
			rv = KV_EINVAL;
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
		x->resp.epoch = authed ? kv_ctl__latest_locked(c)->epoch : 0;
		x->resp.err = rv;
		x->resp.error = x->msg;
		x->held = false;
	}
	rv = KV_OK;
	if (!x->held)
		rv = kv_admin_resp_encode(&x->resp, reply);
	if (!x->held && rv == KV_OK && dedup)
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
	free(x->plan);
	kv_config_free(x->plan_cfg);
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
	return kv_admin_resp_encode(&r, reply);
}

int
kv_ctl__handle(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p)
{
	kv_controller *c = arg;
	kv_admin_req rq;
	struct ctl_ctx x;
	const struct ctl_cmd *cmd = NULL;
	bool authed;
	int rv;

	memset(&x, 0, sizeof(x));
	x.p = p;
	rv = kv_admin_req_decode(nng_msg_body(req), nng_msg_len(req), &rq, x.msg, sizeof(x.msg));
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
	if (rv == KV_OK && c->repl != NULL && (cmd->flags & CTL_LEADER)) {
		kv_repl_info in;
		kv_repl_get_info(c->repl, &in);
		/* A follower serves configs it has; one it has not applied yet may
		 * exist, so only the leader may say "never published". */
		if ((cmd->flags & CTL_READ) &&
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
void *
kv_ctl__proposer_main(void *arg)
{
	kv_controller *c = arg;

	kv_log_thread_name("kv-ctl-propose");
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
			if (kv_ctl__repl_wait_locked(c, NULL, &res) == KV_OK) {
				c->barrier_term = in.term;
				c->leader_since_ns = kv_now_ns();
			}
			kv_repl_get_info(c->repl, &in);
		}
		/* Placement by data size needs the servers' heartbeats, which a
		 * new leader has only after a second: commands that place data
		 * wait for them (bounded) rather than plan on empty statistics. */
		if (!c->closing && (j->cmd->flags & CTL_PLACES)) {
			uint64_t ready = c->leader_since_ns + CTL_STATS_GRACE_NS;
			while (!c->closing && kv_now_ns() < ready) {
				struct timespec ts = {.tv_sec = (time_t)(ready / 1000000000u),
				                      .tv_nsec = (long)(ready % 1000000000u)};
				pthread_cond_timedwait(&c->pcv, &c->mu, &ts);
			}
		}
		if (j->cmd == &ctl_liveness)
			c->live_queued = false;
		if (j->cmd == &ctl_balance)
			c->balance_queued = false;
		if (j->p == NULL &&
		    (c->closing || in.role != KV_REPL_LEADER || c->barrier_term != in.term)) {
			answered = true; /* an internal job: nobody to answer */
		} else if (!c->closing &&
		           (in.role != KV_REPL_LEADER || c->barrier_term != in.term)) {
			pthread_mutex_unlock(&c->mu);
			rv = answer_not_leader(c, &in, j->rq.request_id, &reply);
			pthread_mutex_lock(&c->mu);
			answered = true;
		}
		if (!answered)
			rv = exec_locked(c, j->cmd, &j->rq, true, KV_OK, &x, &reply);
		pthread_mutex_unlock(&c->mu);
		ctx_fini(&x);
		if (j->p == NULL)
			nng_msg_free(reply); /* (NULL when not encoded) */
		else if (!x.held)
			kv_rpc_reply(j->p, rv == KV_OK ? reply : NULL);
		kv_admin_req_fini(&j->rq);
		free(j);
		pthread_mutex_lock(&c->mu);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

/*
 * The liveness thread: at the leader, every live_tick_ns, checks whether a
 * node must be declared down or back (kv_ctl__live_due_locked) and runs the
 * liveness change: standalone here, replicated through the proposer (one
 * job queued at a time; it decides again on the state it runs on). A
 * replica that becomes leader starts counting from that moment
 * (live_since_ns), so it declares nothing for a full down_ns.
 */
/* Queues a job without a request slot for the proposer. Returns false
 * out of memory. */
static bool
queue_internal_locked(kv_controller *c, const struct ctl_cmd *cmd)
{
	struct ctl_job *j = calloc(1, sizeof(*j));
	if (j == NULL)
		return false;
	j->cmd = cmd;
	if (c->jobs_tail)
		c->jobs_tail->next = j;
	else
		c->jobs = j;
	c->jobs_tail = j;
	pthread_cond_broadcast(&c->pcv);
	return true;
}

/* Runs (standalone) or queues (replicated) the balancer's round when it is
 * due, at the leader (the caller checked), with --auto-balance on. A
 * standalone controller waits CTL_STATS_GRACE_NS after its start for the
 * heartbeats. */
static void
balance_due_locked(kv_controller *c)
{
	uint64_t now = kv_now_ns();

	if (!c->auto_balance || c->balance_queued || now < c->balance_next_ns ||
	    now - c->started_ns < CTL_STATS_GRACE_NS)
		return;
	c->balance_next_ns = now + CTL_BALANCE_EVERY_NS;
	if (c->repl == NULL) {
		struct ctl_ctx x;
		memset(&x, 0, sizeof(x));
		if (ctl_balance.fn(c, NULL, &x) != KV_OK)
			KV_WARN("controller", "auto-balance change not published", "msg=\"%s\"",
			        x.msg);
		ctx_fini(&x);
		return;
	}
	c->balance_queued = queue_internal_locked(c, &ctl_balance);
}

void *
kv_ctl__liveness_main(void *arg)
{
	kv_controller *c = arg;

	kv_log_thread_name("kv-ctl-liveness");
	pthread_mutex_lock(&c->mu);
	while (!c->closing) {
		uint64_t wake = kv_now_ns() + c->live_tick_ns;
		struct timespec ts = {.tv_sec = (time_t)(wake / 1000000000u),
		                      .tv_nsec = (long)(wake % 1000000000u)};
		/* pcv: also woken by a heartbeat from a down node. */
		pthread_cond_timedwait(&c->pcv, &c->mu, &ts);
		if (c->closing)
			break;
		if (c->repl != NULL) {
			kv_repl_info in;
			pthread_mutex_unlock(&c->mu);
			kv_repl_get_info(c->repl, &in);
			pthread_mutex_lock(&c->mu);
			if (in.role != KV_REPL_LEADER) {
				c->live_term = 0;
				continue;
			}
			if (c->live_term != in.term) {
				c->live_term = in.term;
				c->live_since_ns = kv_now_ns();
				KV_INFO("controller", "liveness: leading, counting from now",
				        "term=%llu down_after_ms=%llu", (unsigned long long)in.term,
				        (unsigned long long)(c->down_ns / 1000000u));
				continue;
			}
		}
		balance_due_locked(c);
		if (c->live_queued || !kv_ctl__live_due_locked(c, kv_now_ns()))
			continue;
		if (c->repl == NULL) {
			struct ctl_ctx x;
			memset(&x, 0, sizeof(x));
			if (ctl_liveness.fn(c, NULL, &x) != KV_OK)
				KV_WARN("controller", "liveness change not published", "msg=\"%s\"",
				        x.msg);
			ctx_fini(&x);
			continue;
		}
		struct ctl_job *j = calloc(1, sizeof(*j));
		if (j == NULL)
			continue;
		j->cmd = &ctl_liveness;
		if (c->jobs_tail)
			c->jobs_tail->next = j;
		else
			c->jobs = j;
		c->jobs_tail = j;
		c->live_queued = true;
		pthread_cond_broadcast(&c->pcv);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}
