/*
 * replica.c - Raft replication of the controller (replica.h), on canonical
 * raft with its libuv backend.
 *
 * DESIGN. libraft is single-threaded: every raft_* call must run on the
 * thread that runs its libuv loop. So the replica owns one loop thread.
 * Other threads hand it work through a queue (qmu) and a uv_async wake-up;
 * the loop thread calls raft_apply / raft_barrier and later the submitter's
 * done callback. The state machine callbacks (apply, snapshot, restore) also
 * run on the loop thread. A 25 ms timer copies what the status report and
 * the leader checks need (role, term, leader, indexes, per-peer match
 * index) into `info` under imu, so no other thread ever reads libraft's
 * structures.
 *
 * On disk (cfg->dir): libraft's segment files, metadata and snapshots. A
 * replica whose dir is empty bootstraps the group's configuration (every
 * peer a voter); every replica does the same, so they agree on it.
 *
 * A SNAPSHOT THE FOLLOWER DROPS. A libraft 0.15 follower that receives an
 * InstallSnapshot while it is writing a snapshot of its own (or installing
 * one) drops it without an answer (its trace says "already taking or
 * installing snapshot"). The leader keeps that follower in its snapshot
 * state and sends only heartbeats; the follower rejects them (it lacks the
 * leader's last entry) and the leader ignores each rejection as stale unless
 * it names the very index of the snapshot it sent, which stops being the
 * case as soon as the leader appends anything. Only the install-snapshot
 * timeout (libraft's default: 30 s) sends the snapshot again, and until
 * then the follower applies nothing. A replica restarted behind a leader
 * that compacted its log meets this easily: it applies the entries it still
 * shares with the leader, reaches the snapshot threshold and writes its own
 * snapshot just as the leader's arrives. So the timeout here is twice the
 * election timeout, at least 1 s (kv_repl_cfg.install_snapshot_ms): a
 * snapshot dropped, or lost with a connection, is sent again within
 * seconds. A copy sent while the first is still being installed costs one
 * transfer: the follower drops it as busy and answers the first.
 *
 * Locks: qmu protects the queue and `stopping`; imu protects `info`. Both
 * are leaves. No lock of this module is held while a callback of the
 * controller runs.
 */
#include "controller/replica.h"
#include "common/err.h"
#include "common/fileio.h"
#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <raft.h>
#include <raft/uv.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <uv.h>

enum { OP_APPLY = 1, OP_BARRIER = 2 };

/* One submission, owned by the queue, then by libraft until its callback. */
struct repl_op {
	struct repl_op *next;     /* queue link */
	int kind;                 /* OP_* */
	struct raft_buffer buf;   /* the command (raft_malloc'd) */
	struct raft_apply areq;   /* OP_APPLY request */
	struct raft_barrier breq; /* OP_BARRIER request */
	kv_repl_done_cb done;     /* the submitter's callback */
	void *arg;                /* its argument */
};

struct kv_repl {
	uv_loop_t loop;              /* the loop; run by `thread` only */
	uv_async_t wake;             /* queue or stop: wakes the loop */
	uv_timer_t tick;             /* refreshes info */
	struct raft_uv_transport tr; /* TCP transport */
	struct raft_io io;           /* libuv disk + network backend */
	struct raft raft;            /* the consensus state (loop thread only) */
	struct raft_fsm fsm;         /* adapter to cfg.fsm */
	kv_repl_fsm cb;              /* the controller's state machine */
	uint32_t id;                 /* this replica */
	size_t npeers;               /* replicas */
	pthread_t thread;            /* runs the loop */
	bool thread_started;         /* thread must be joined */
	bool loop_inited, handles_inited, tr_inited, io_inited, raft_inited;

	/* libraft's own listen and connect of tr, which tr's call under
	 * addr_mu (tr_listen, tr_connect). */
	int (*tcp_listen)(struct raft_uv_transport *t, raft_uv_accept_cb cb);
	int (*tcp_connect)(struct raft_uv_transport *t, struct raft_uv_connect *req, raft_id id,
	                   const char *address, raft_uv_connect_cb cb);

	pthread_mutex_t qmu;           /* protects the queue and stopping */
	struct repl_op *qhead, *qtail; /* submissions not yet given to libraft */
	bool stopping;                 /* stop has begun: refuse submissions */
	bool joined;                   /* the loop thread has been (or is being) joined */

	pthread_mutex_t imu; /* protects info */
	kv_repl_info info;   /* latest copy of the state */
};

/*
 * libraft 0.15 parses "host:port" with strtok (uv_ip.c uvIpParse), whose
 * position is one static pointer for the whole process: two replicas in one
 * process (the tests run three) that listen or connect at once tokenize
 * each other's buffers (ThreadSanitizer saw it). Its TCP transport's listen
 * and connect, where it parses, run under this mutex: a leaf, held for
 * those calls alone, which parse and hand the rest to the loop.
 */
static pthread_mutex_t addr_mu = PTHREAD_MUTEX_INITIALIZER;

static int
tr_listen(struct raft_uv_transport *t, raft_uv_accept_cb cb)
{
	kv_repl *r = (kv_repl *)((char *)t - offsetof(kv_repl, tr));

	pthread_mutex_lock(&addr_mu);
	int rv = r->tcp_listen(t, cb);
	pthread_mutex_unlock(&addr_mu);
	return rv;
}

static int
tr_connect(struct raft_uv_transport *t, struct raft_uv_connect *req, raft_id id,
           const char *address, raft_uv_connect_cb cb)
{
	kv_repl *r = (kv_repl *)((char *)t - offsetof(kv_repl, tr));

	pthread_mutex_lock(&addr_mu);
	int rv = r->tcp_connect(t, req, id, address, cb);
	pthread_mutex_unlock(&addr_mu);
	return rv;
}

static int
err_from_raft(int rv)
{
	switch (rv) {
	case 0:
		return KV_OK;
	case RAFT_NOMEM:
		return KV_ENOMEM;
	case RAFT_NOTLEADER:
	case RAFT_LEADERSHIPLOST:
		return KV_EUNAVAIL;
	case RAFT_SHUTDOWN:
		return KV_ECLOSED;
	default:
		return KV_EIO;
	}
}

/* ---- the state machine adapter (loop thread) ---- */

static int
fsm_apply(struct raft_fsm *fsm, const struct raft_buffer *buf, void **result)
{
	kv_repl *r = fsm->data;
	int rv = r->cb.apply(r->cb.arg, buf->base, buf->len);

	/* The result travels as a pointer-sized integer. */
	*result = (void *)(intptr_t)rv;
	return 0;
}

static int
fsm_snapshot(struct raft_fsm *fsm, struct raft_buffer *bufs[], unsigned *n_bufs)
{
	kv_repl *r = fsm->data;
	uint8_t *p = NULL;
	size_t n = 0;
	struct raft_buffer *b;
	int rv;

	if ((rv = r->cb.snapshot(r->cb.arg, &p, &n)) != KV_OK)
		return RAFT_NOMEM;
	/* libraft frees the buffers of a version 1 state machine itself. */
	if ((b = raft_malloc(sizeof(*b))) == NULL || (b->base = raft_malloc(n ? n : 1)) == NULL) {
		raft_free(b);
		free(p);
		return RAFT_NOMEM;
	}
	memcpy(b->base, p, n);
	b->len = n;
	free(p);
	*bufs = b;
	*n_bufs = 1;
	return 0;
}

static int
fsm_restore(struct raft_fsm *fsm, struct raft_buffer *buf)
{
	kv_repl *r = fsm->data;
	int rv = r->cb.restore(r->cb.arg, buf->base, buf->len);

	if (rv != KV_OK) {
		KV_ERROR("replica", "cannot restore snapshot", "err=%s", kv_errname(rv));
		return RAFT_CORRUPT;
	}
	raft_free(buf->base); /* on success the state machine owns the buffer */
	return 0;
}

/* ---- loop thread ---- */

static void
refresh_info(kv_repl *r)
{
	kv_repl_info in;
	raft_id lid = 0;
	const char *laddr = NULL;

	memset(&in, 0, sizeof(in));
	switch (raft_state(&r->raft)) {
	case RAFT_LEADER:
		in.role = KV_REPL_LEADER;
		break;
	case RAFT_FOLLOWER:
		in.role = KV_REPL_FOLLOWER;
		break;
	case RAFT_CANDIDATE:
		in.role = KV_REPL_CANDIDATE;
		break;
	default:
		in.role = KV_REPL_UNKNOWN;
	}
	raft_leader(&r->raft, &lid, &laddr);
	in.leader_id = lid <= r->npeers ? (uint32_t)lid : 0;
	in.term = r->raft.current_term;
	in.commit_index = r->raft.commit_index;
	in.applied = raft_last_applied(&r->raft);
	in.last_index = raft_last_index(&r->raft);
	in.npeers = r->npeers;
	if (in.role == KV_REPL_LEADER && r->raft.leader_state.progress != NULL) {
		for (unsigned i = 0; i < r->raft.configuration.n; i++) {
			raft_id sid = r->raft.configuration.servers[i].id;
			if (sid < 1 || sid > r->npeers)
				continue;
			in.match[sid - 1] = r->raft.leader_state.progress[i].match_index;
			in.reachable[sid - 1] = r->raft.leader_state.progress[i].recent_recv;
		}
		in.match[r->id - 1] = in.last_index;
		in.reachable[r->id - 1] = true;
	}
	pthread_mutex_lock(&r->imu);
	r->info = in;
	pthread_mutex_unlock(&r->imu);
}

static void
tick_cb(uv_timer_t *t)
{
	refresh_info(t->data);
}

static void
apply_done_cb(struct raft_apply *req, int status, void *result)
{
	struct repl_op *op = req->data;

	op->done(op->arg, err_from_raft(status), status == 0 ? (int)(intptr_t)result : 0);
	free(op);
}

static void
barrier_done_cb(struct raft_barrier *req, int status)
{
	struct repl_op *op = req->data;

	op->done(op->arg, err_from_raft(status), 0);
	free(op);
}

static void
closed_cb(uv_handle_t *h)
{
	(void)h;
}

static void
raft_closed_cb(struct raft *raft)
{
	kv_repl *r = raft->data;

	raft_uv_close(&r->io);
	raft_uv_tcp_close(&r->tr);
	uv_close((uv_handle_t *)&r->tick, closed_cb);
	uv_close((uv_handle_t *)&r->wake, closed_cb);
}

static void
wake_cb(uv_async_t *a)
{
	kv_repl *r = a->data;
	struct repl_op *q, *op;
	bool stop;

	pthread_mutex_lock(&r->qmu);
	q = r->qhead;
	r->qhead = r->qtail = NULL;
	stop = r->stopping;
	pthread_mutex_unlock(&r->qmu);
	while ((op = q) != NULL) {
		int rv;
		q = op->next;
		if (stop) {
			rv = RAFT_SHUTDOWN;
		} else if (op->kind == OP_APPLY) {
			op->areq.data = op;
			rv = raft_apply(&r->raft, &op->areq, &op->buf, 1, apply_done_cb);
		} else {
			op->breq.data = op;
			rv = raft_barrier(&r->raft, &op->breq, barrier_done_cb);
		}
		if (rv != 0) {
			if (op->kind == OP_APPLY)
				raft_free(op->buf.base);
			op->done(op->arg, err_from_raft(rv), 0);
			free(op);
		}
	}
	if (stop && !uv_is_closing((uv_handle_t *)&r->wake)) {
		uv_timer_stop(&r->tick);
		raft_close(&r->raft, raft_closed_cb);
	}
}

static void *
loop_main(void *arg)
{
	kv_repl *r = arg;

	kv_log_thread_name("kv-raft");
	uv_run(&r->loop, UV_RUN_DEFAULT);
	return NULL;
}

/* ---- public ---- */

static int
enqueue(kv_repl *r, struct repl_op *op)
{
	pthread_mutex_lock(&r->qmu);
	if (r->stopping) {
		pthread_mutex_unlock(&r->qmu);
		return KV_ECLOSED;
	}
	if (r->qtail)
		r->qtail->next = op;
	else
		r->qhead = op;
	r->qtail = op;
	pthread_mutex_unlock(&r->qmu);
	uv_async_send(&r->wake);
	return KV_OK;
}

int
kv_repl_submit(kv_repl *r, const void *p, size_t n, kv_repl_done_cb done, void *arg)
{
	struct repl_op *op = calloc(1, sizeof(*op));
	int rv;

	if (op == NULL || (op->buf.base = raft_malloc(n ? n : 1)) == NULL) {
		free(op);
		return KV_ENOMEM;
	}
	memcpy(op->buf.base, p, n);
	op->buf.len = n;
	op->kind = OP_APPLY;
	op->done = done;
	op->arg = arg;
	if ((rv = enqueue(r, op)) != KV_OK) {
		raft_free(op->buf.base);
		free(op);
	}
	return rv;
}

int
kv_repl_barrier(kv_repl *r, kv_repl_done_cb done, void *arg)
{
	struct repl_op *op = calloc(1, sizeof(*op));
	int rv;

	if (op == NULL)
		return KV_ENOMEM;
	op->kind = OP_BARRIER;
	op->done = done;
	op->arg = arg;
	if ((rv = enqueue(r, op)) != KV_OK)
		free(op);
	return rv;
}

void
kv_repl_get_info(kv_repl *r, kv_repl_info *out)
{
	pthread_mutex_lock(&r->imu);
	*out = r->info;
	pthread_mutex_unlock(&r->imu);
}

/* The install-snapshot timeout (see "A snapshot the follower drops"). */
static unsigned
install_snapshot_ms(const kv_repl_cfg *cfg)
{
	unsigned election = cfg->election_ms ? cfg->election_ms : 1000;

	if (cfg->install_snapshot_ms)
		return cfg->install_snapshot_ms;
	return election > 500 ? 2 * election : 1000;
}

int
kv_repl_create(const kv_repl_cfg *cfg, kv_repl **out, char *err, size_t errlen)
{
	struct raft_configuration conf;
	kv_repl *r;
	int rv;

	if (cfg->npeers < 1 || cfg->npeers > KV_REPL_MAX_PEERS || cfg->id < 1 ||
	    cfg->id > cfg->npeers)
		return kv_errf(err, errlen, KV_EINVAL,
		               "--id must be between 1 and %zu (at most %d peers)", cfg->npeers,
		               KV_REPL_MAX_PEERS);
	if (mkdir(cfg->dir, 0755) != 0 && errno != EEXIST)
		return kv_errf(err, errlen, kv_err_from_errno(errno), "cannot create %s: %s",
		               cfg->dir, strerror(errno));
	if ((r = calloc(1, sizeof(*r))) == NULL)
		return KV_ENOMEM;
	pthread_mutex_init(&r->qmu, NULL);
	pthread_mutex_init(&r->imu, NULL);
	r->cb = cfg->fsm;
	r->id = cfg->id;
	r->npeers = cfg->npeers;
	r->fsm.version = 1;
	r->fsm.data = r;
	r->fsm.apply = fsm_apply;
	r->fsm.snapshot = fsm_snapshot;
	r->fsm.restore = fsm_restore;
	if (uv_loop_init(&r->loop) != 0) {
		rv = kv_errf(err, errlen, KV_ENOMEM, "cannot start an event loop");
		goto fail;
	}
	r->loop_inited = true;
	uv_async_init(&r->loop, &r->wake, wake_cb);
	r->wake.data = r;
	uv_timer_init(&r->loop, &r->tick);
	r->tick.data = r;
	r->handles_inited = true;
	if ((rv = raft_uv_tcp_init(&r->tr, &r->loop)) != 0) {
		rv = kv_errf(err, errlen, KV_ENOMEM, "cannot start the raft transport");
		goto fail;
	}
	r->tr_inited = true;
	r->tcp_listen = r->tr.listen;
	r->tcp_connect = r->tr.connect;
	r->tr.listen = tr_listen;
	r->tr.connect = tr_connect;
	if ((rv = raft_uv_init(&r->io, &r->loop, cfg->dir, &r->tr)) != 0) {
		rv = kv_errf(err, errlen, KV_EIO, "cannot open raft data in %s: %s", cfg->dir,
		             r->io.errmsg);
		goto fail;
	}
	r->io_inited = true;
	if ((rv = raft_init(&r->raft, &r->io, &r->fsm, cfg->id, cfg->raft_addrs[cfg->id - 1])) !=
	    0) {
		rv =
		    kv_errf(err, errlen, KV_EINVAL, "cannot start raft: %s", raft_errmsg(&r->raft));
		goto fail;
	}
	r->raft_inited = true;
	r->raft.data = r;
	raft_set_election_timeout(&r->raft, cfg->election_ms ? cfg->election_ms : 1000);
	raft_set_heartbeat_timeout(&r->raft, cfg->heartbeat_ms ? cfg->heartbeat_ms : 100);
	raft_set_snapshot_threshold(&r->raft,
	                            cfg->snapshot_threshold ? cfg->snapshot_threshold : 256);
	raft_set_snapshot_trailing(&r->raft, cfg->snapshot_trailing ? cfg->snapshot_trailing : 64);
	raft_set_install_snapshot_timeout(&r->raft, install_snapshot_ms(cfg));
	raft_set_pre_vote(&r->raft, true);

	raft_configuration_init(&conf);
	for (size_t i = 0; i < cfg->npeers; i++) {
		if (raft_configuration_add(&conf, i + 1, cfg->raft_addrs[i], RAFT_VOTER) != 0) {
			raft_configuration_close(&conf);
			rv =
			    kv_errf(err, errlen, KV_EINVAL, "bad raft peer %s", cfg->raft_addrs[i]);
			goto fail;
		}
	}
	rv = raft_bootstrap(&r->raft, &conf);
	raft_configuration_close(&conf);
	if (rv != 0 && rv != RAFT_CANTBOOTSTRAP) {
		rv = kv_errf(err, errlen, KV_EIO, "cannot bootstrap raft in %s: %s", cfg->dir,
		             raft_errmsg(&r->raft));
		goto fail;
	}
	if ((rv = raft_start(&r->raft)) != 0) {
		const char *why = raft_errmsg(&r->raft);
		int code = strstr(why, "address already in use") || strstr(why, "in use")
		               ? KV_EADDRINUSE
		               : KV_EIO;
		rv = kv_errf(err, errlen, code, "cannot start raft on %s (data %s): %s",
		             cfg->raft_addrs[cfg->id - 1], cfg->dir, why);
		goto fail;
	}
	uv_timer_start(&r->tick, tick_cb, 0, 25);
	refresh_info(r);
	if (pthread_create(&r->thread, NULL, loop_main, r) != 0) {
		rv = kv_errf(err, errlen, KV_ENOMEM, "cannot start a thread");
		goto fail;
	}
	r->thread_started = true;
	*out = r;
	return KV_OK;
fail:
	kv_repl_destroy(r);
	return rv;
}

void
kv_repl_stop(kv_repl *r)
{
	bool join;

	pthread_mutex_lock(&r->qmu);
	r->stopping = true;
	join = r->thread_started && !r->joined;
	r->joined = true;
	pthread_mutex_unlock(&r->qmu);
	if (join) {
		uv_async_send(&r->wake);
		pthread_join(r->thread, NULL);
	}
}

void
kv_repl_destroy(kv_repl *r)
{
	if (r == NULL)
		return;
	if (r->thread_started) {
		kv_repl_stop(r);
	} else if (r->loop_inited) {
		/* Never ran: close what was opened on this thread. */
		if (r->raft_inited) {
			raft_close(&r->raft, raft_closed_cb);
		} else {
			if (r->io_inited)
				raft_uv_close(&r->io);
			if (r->tr_inited)
				raft_uv_tcp_close(&r->tr);
			if (r->handles_inited) {
				uv_close((uv_handle_t *)&r->tick, closed_cb);
				uv_close((uv_handle_t *)&r->wake, closed_cb);
			}
		}
		uv_run(&r->loop, UV_RUN_DEFAULT);
	}
	if (r->loop_inited)
		uv_loop_close(&r->loop);
	pthread_mutex_destroy(&r->qmu);
	pthread_mutex_destroy(&r->imu);
	free(r);
}
