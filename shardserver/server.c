/*
 * server.c - the shard server's life cycle (server.h): create (options,
 * auth, TLS, data dir, node file, store, recovery, controller clients, the
 * migration set), start (metrics, the --listen endpoint, the watch and
 * heartbeat threads), the graceful leave, stop and destroy.
 *
 * DESIGN. The server is split along its jobs, each in its own file:
 * request dispatch (dispatch.c), following configurations (follow.c),
 * heartbeats (heartbeat.c), the node file (nodefile.c), calls to the
 * controller (ctlcall.c), /metrics (metrics_srv.c), flags (args.c), range
 * transfer (migrate_out.c, migrate_in.c behind migrate.h) and signals
 * (main.c). They share struct kv_server (server_int.h); this file owns its
 * life cycle. Nothing here is process-wide: signals belong to main.c, and
 * several servers can run in one process.
 *
 * Stop order matters (nng 1.5 hangs closing a socket a thread still
 * receives on, and held replies use the log): refuse new requests, wait for
 * the ones taken, stop the metrics listener, close the endpoint, join the
 * watch, heartbeat and migration threads, close the controller clients,
 * close the log. Threads and locks: doc/threads.md.
 */
#include "shardserver/server.h"
#include "common/auth.h"
#include "common/err.h"
#include "common/log.h"
#include "shardserver/ctlcall.h"
#include "shardserver/dispatch.h"
#include "shardserver/follow.h"
#include "shardserver/expire.h"
#include "shardserver/heartbeat.h"
#include "shardserver/nodefile.h"
#include "shardserver/server_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define COMP "server"

/* ------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------ */

static uint64_t
rand64(void)
{
	uint64_t v = 0;
	if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v))
		v = kv_now_ns() ^ ((uint64_t)getpid() << 32);
	return v ? v : 1;
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

bool
kv_server_gone(kv_server *s, char *why, size_t whylen)
{
	if (!atomic_load(&s->gone))
		return false;
	pthread_mutex_lock(&s->cfg_mu);
	if (whylen > 0)
		snprintf(why, whylen, "%s", s->gone_why);
	pthread_mutex_unlock(&s->cfg_mu);
	return true;
}

kv_server_leave_result
kv_server_leave(kv_server *s, uint32_t timeout_ms, kv_server_wait_cb wait, void *arg)
{
	uint32_t me = atomic_load(&s->node_id);
	uint32_t limit = timeout_ms ? timeout_ms : 60000;
	kv_admin_resp r;
	int rv;

	uint64_t deadline = kv_now_ns() + (uint64_t)limit * 1000000u;

	/* Leave even when serving nothing, or the node would stay active and be
	 * picked as a migration destination after it exited. While the node is
	 * the destination of a migration in flight the controller answers BUSY:
	 * keep serving and ask again until the deadline. */
	if (!s->started || s->stopped)
		return KV_LEAVE_NOT_RUNNING;
	if (me == 0)
		return KV_LEAVE_UNREGISTERED;
	kv_admin_req rq = {.op = KV_ADM_LEAVE, .node_id = me};
	for (;;) {
		/* Already left (an operator's `shardkv leave`, finished): a stop,
		 * not a refusal. */
		if (atomic_load(&s->gone)) {
			KV_INFO(COMP, "already left the cluster: stopping", "node_id=%u", me);
			return KV_LEAVE_DRAINED;
		}
		rv = kv_server__ctl_call(s, &rq, &r, 2000);
		if (rv == 0 && r.err == 0)
			break;
		/* Already draining (an operator's leave in progress): wait for
		 * the drain as if this leave had been accepted. */
		if (rv == 0 && r.err == KV_EEXISTS) {
			KV_INFO(COMP, "already leaving the cluster", "node_id=%u detail=\"%s\"", me,
			        r.error);
			break;
		}
		/* Gone at the controller before this server heard of it (the
		 * controller's kv_place_leave answers "has already left"). */
		if (rv == 0 && r.err == KV_EINVAL && r.error != NULL &&
		    strstr(r.error, "has already left") != NULL) {
			KV_INFO(COMP, "already left the cluster: stopping", "node_id=%u", me);
			kv_admin_resp_fini(&r);
			return KV_LEAVE_DRAINED;
		}
		bool busy = rv == 0 && r.err == KV_EBUSY;
		if (!busy || kv_now_ns() >= deadline) {
			KV_WARN(COMP, "leave not accepted, stopping now", "err=%s detail=\"%s\"",
			        kv_errname(rv ? rv : r.err), rv ? "" : r.error);
			if (rv == 0)
				kv_admin_resp_fini(&r);
			return KV_LEAVE_REFUSED;
		}
		kv_admin_resp_fini(&r);
		if (leave_wait(s, wait, arg, 200))
			return KV_LEAVE_CUT_ASKING;
	}
	kv_admin_resp_fini(&r);
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

/* Refuses new requests and waits up to ms until every request taken has
 * been answered; false when some are still waiting. */
static bool
drain_requests(kv_server *s, unsigned ms)
{
	uint64_t deadline = kv_now_ns() + (uint64_t)ms * 1000000ull;

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

/* A migration changed what the node holds: report it at once, so that the
 * controller's status does not show the counts of before the migration. */
static void
mig_held_changed(void *arg)
{
	kv_server *s = arg;

	atomic_store(&s->hb_now, true);
}

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

/* kv_rs_env.hurry: a peer knows a newer leader epoch. The watch's long
 * poll already returns as soon as the controller has a newer
 * configuration, so this only records that one is expected. */
static void
repl_hurry(void *arg)
{
	kv_server *s = arg;
	KV_DEBUG(COMP, "a peer names a newer leader epoch", "epoch=%llu",
	         (unsigned long long)atomic_load(&s->epoch));
}

/* IsrChange for [start, end) led here at leader_epoch: add `add`, remove
 * `remove` or end the transfer fence `unfence` (doc/replication.md "ISR
 * changes", "Primary transfer"). The configuration with the change arrives
 * through the watch; the answer only says whether to ask again. */
static int
repl_isr_change(kv_server *s, const kv_bytes *start, const kv_bytes *end, uint64_t leader_epoch,
                uint32_t add, uint32_t remove, uint32_t unfence)
{
	kv_admin_resp r;
	kv_admin_req rq = {.op = KV_ADM_ISR_CHANGE,
	                   .node_id = atomic_load(&s->node_id),
	                   .start = *start,
	                   .end = *end,
	                   .leader_epoch = leader_epoch,
	                   .add_node = add,
	                   .remove_node = remove,
	                   .unfence_node = unfence};
	int rv = kv_server__ctl_call(s, &rq, &r, 1000);

	if (rv != 0)
		return rv;
	rv = r.err;
	if (rv != 0)
		KV_WARN(COMP,
		        add       ? "controller refused the ISR expand"
		        : unfence ? "controller refused to end the transfer fence"
		                  : "controller refused the ISR shrink",
		        "node=%u err=%s detail=\"%s\"",
		        add      ? add
		        : remove ? remove
		                 : unfence,
		        kv_errname(rv), r.error ? r.error : "");
	kv_admin_resp_fini(&r);
	return rv;
}

/* kv_rs_env.isr_remove: a backup that stopped acknowledging, or diverged. */
static int
repl_isr_remove(void *arg, const kv_bytes *start, const kv_bytes *end, uint64_t leader_epoch,
                uint32_t node)
{
	return repl_isr_change(arg, start, end, leader_epoch, 0, node, 0);
}

/* kv_rs_env.isr_add: a copied replica that caught up. */
static int
repl_isr_add(void *arg, const kv_bytes *start, const kv_bytes *end, uint64_t leader_epoch,
             uint32_t node)
{
	return repl_isr_change(arg, start, end, leader_epoch, node, 0, 0);
}

/* kv_rs_env.isr_unfence: the old primary, kept as the transfer fence, is
 * in sync. */
static int
repl_isr_unfence(void *arg, const kv_bytes *start, const kv_bytes *end, uint64_t leader_epoch,
                 uint32_t node)
{
	return repl_isr_change(arg, start, end, leader_epoch, 0, 0, node);
}

static int
mig_ctl_call(void *arg, kv_admin_req *rq, kv_admin_resp *resp, uint32_t timeout_ms)
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
	s->created_ns = kv_now_ns();
	s->lease_ns = (uint64_t)(cfg->lease_ms ? cfg->lease_ms : KV_LEASE_MS) * 1000000u;
	s->renew_ns =
	    (uint64_t)(cfg->lease_renew_ms ? cfg->lease_renew_ms : KV_LEASE_RENEW_MS) * 1000000u;
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
	/* A node id from the data dir: this process is a restart of that
	 * node, which may lack records it acknowledged before (its --fsync
	 * mode). It says so until the controller answers OK, which it does
	 * only once it took the node out of every ISR it shares. */
	atomic_store(&s->restarted, id != 0);
	if (rv == KV_ENOTFOUND && (rv = kv_nodefile_save(cfg->data_dir, 0, "")) != 0) {
		KV_ERROR(COMP, "cannot write to data dir", "dir=%s err=%s", cfg->data_dir,
		         kv_strerror(rv));
		set_err(err, errlen, "cannot write to data dir");
		goto err_after_alloc;
	}
	if (kv_owner_init(&s->owner) != 0 ||
	    (s->dedup = kv_dedup_create(cfg->dedup_per_client, 0, 0)) == NULL) {
		rv = KV_ENOMEM;
		goto err_after_alloc;
	}
	kv_store_opts_init(&so);
	so.mode = cfg->store_mode;
	so.max_key = s->max_key;
	so.max_value = s->max_value;
	so.clock = cfg->clock;
	so.clock_arg = cfg->clock_arg;
	if (cfg->store_mode == KV_STORE_PERCORE && cfg->threads)
		so.partitions = cfg->threads;
	if ((rv = kv_store_create(&so, &s->store)) != 0) {
		KV_ERROR(COMP, "cannot create store", "err=%s", kv_strerror(rv));
		set_err(err, errlen, "cannot create store");
		goto err_after_owner;
	}
	/* The previous start's boot id, and this one's in its place before
	 * anything is logged (doc/replication.md "After a restart"). Their
	 * lower halves, which name the starts in stream ids, differ. */
	uint64_t prev_boot = 0;
	kv_bootfile_load(cfg->data_dir, &prev_boot);
	while ((s->boot_id & 0xffffffffu) == 0 ||
	       (s->boot_id & 0xffffffffu) == (prev_boot & 0xffffffffu))
		s->boot_id = rand64();
	if ((rv = kv_bootfile_save(cfg->data_dir, s->boot_id)) != 0) {
		KV_ERROR(COMP, "cannot write to data dir", "dir=%s err=%s", cfg->data_dir,
		         kv_strerror(rv));
		set_err(err, errlen, "cannot write to data dir");
		goto err_after_store;
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
	uint64_t rec_last = kv_dur_last_lsn(s->dur);
	if (drep.torn && cfg->wal_truncate_corrupt)
		prev_boot = 0; /* the cut may have taken synced records: copied */
	if (drep.torn && cfg->wal_truncate_corrupt) {
		/* The cut may have taken records the log had synced: this node's
		 * positions as a replica may claim them (doc/replication.md
		 * "Catch-up from the replica's own data"). Its returns are copied. */
		char pp[600];
		snprintf(pp, sizeof(pp), "%s/repl-positions", cfg->data_dir);
		if (unlink(pp) != 0 && errno != ENOENT) {
			KV_ERROR(COMP, "cannot remove the replica positions file", "path=%s", pp);
			set_err(err, errlen, "cannot remove the replica positions file");
			rv = KV_EIO;
			goto err_after_dur;
		}
	}
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
	                  .chunks_unpacked = cfg->chunks_unpacked,
	                  .data_dir = cfg->data_dir,
	                  .arg = s,
	                  .node_id = mig_node_id,
	                  .epoch = mig_epoch,
	                  .ctl_call = mig_ctl_call,
	                  .node_addr = mig_node_addr,
	                  .held_changed = mig_held_changed};
	if ((rv = kv_mig_create(&env, &s->mig)) != 0) {
		set_err(err, errlen,
		        rv == KV_ENOMEM ? "out of memory"
		                        : "cannot read the handover file (DATA_DIR/handover.ids)");
		goto err_after_ctl;
	}
	kv_rs_env renv = {.dur = s->dur,
	                  .store = s->store,
	                  .dedup = s->dedup,
	                  .tls = s->tls,
	                  .auth = kv_server__auth(s),
	                  .arg = s,
	                  .boot_id = s->boot_id,
	                  .prev_boot = id != 0 ? prev_boot : 0,
	                  .rec_snap_lsn = drep.snap_lsn,
	                  .rec_last = rec_last,
	                  .dir = cfg->data_dir,
	                  .copy_rate_mb_s = cfg->copy_rate_mb_s,
	                  .node_id = mig_node_id,
	                  .epoch = mig_epoch,
	                  .hurry = repl_hurry,
	                  .isr_remove = repl_isr_remove,
	                  .isr_add = cfg->no_expand ? NULL : repl_isr_add,
	                  .isr_unfence = repl_isr_unfence};
	if ((rv = kv_rs_create(&renv, &s->repl)) != 0) {
		kv_mig_destroy(s->mig);
		goto err_after_ctl;
	}
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

/* The event loops of --io-loops: one per CPU by default, at most 16. */
static unsigned
io_loops(const kv_server_cfg *cfg)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	if (cfg->io_loops)
		return cfg->io_loops;
	return n < 1 ? 1u : n > 16 ? 16u : (unsigned)n;
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
	                         .handler = kv_srv_rpc_handler,
	                         .arg = s,
	                         .tls = s->tls,
	                         .loops = cfg->io_nng ? 0 : io_loops(cfg)};
	if ((rv = kv_rpc_server_create(&ro, &s->rpc)) != 0) {
		KV_ERROR(COMP, "cannot listen", "addr=%s err=%s", cfg->listen, kv_strerror(rv));
		kv_srv_metrics_stop(s);
		return rv;
	}
	atomic_store(&s->rpc_pub, s->rpc);
	KV_INFO(COMP, "listening",
	        "addr=%s node_id=%u store=%s io_loops=%u contexts=%u metrics=%s auth=%s tls=%s",
	        cfg->listen, atomic_load(&s->node_id),
	        cfg->store_mode == KV_STORE_PERCORE ? "percore" : "striped",
	        strncmp(cfg->listen, "tcp", 3) == 0 ? ro.loops : 0u, ro.contexts,
	        cfg->metrics ? cfg->metrics : "off", s->auth.len ? "token" : "off",
	        s->tls ? "mutual" : "off");
	s->started = true;
	if (pthread_create(&s->watch_thr, NULL, kv_srv_watch_main, s) == 0)
		s->watch_started = true;
	if (pthread_create(&s->hb_thr, NULL, kv_srv_heartbeat_main, s) == 0)
		s->hb_started = true;
	if (pthread_create(&s->lease_thr, NULL, kv_srv_lease_main, s) == 0)
		s->lease_started = true;
	if (pthread_create(&s->exp_thr, NULL, kv_srv_expire_main, s) == 0)
		s->exp_started = true;
	if (!s->watch_started || !s->hb_started || !s->lease_started || !s->exp_started) {
		kv_server_stop(s);
		return KV_ENOMEM;
	}
	return KV_OK;
}

/*
 * Stop order: refuse new requests and let the ones taken finish while the
 * backups still receive their records (up to 1 s: a write this node
 * answers before it stops is then held by every in-sync backup alike, so
 * none of them diverges from the next primary and has to be copied
 * again); stop replication (replies still waiting for backups fail), wait
 * for the rest (their held replies use the log), stop the metrics listener
 * (it walks the migration list), close the rpc server, join the watch and
 * heartbeat threads, join the migration threads, close the controller
 * clients, close the log.
 */
int
kv_server_stop(kv_server *s)
{
	if (s->stopped)
		return s->stop_rv;
	s->stopped = true;
	atomic_store(&s->stopping, true);
	kv_mig_stop(s->mig);
	if (s->started)
		(void)drain_requests(s, 1000);
	kv_rs_stop(s->repl); /* replies still waiting for backups fail now */
	if (s->started && !drain_requests(s, 10000)) {
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
	if (s->lease_started)
		pthread_join(s->lease_thr, NULL);
	if (s->exp_started)
		pthread_join(s->exp_thr, NULL);
	kv_mig_destroy(s->mig);
	s->mig = NULL;
	{
		kv_rs_stats rs;
		kv_rs_stats_get(s->repl, &rs);
		if (rs.streams || rs.applied || rs.refused || rs.demotions)
			KV_INFO(COMP, "replication",
			        "streams=%llu unacked=%llu batches=%llu restarts=%llu "
			        "applied=%llu refused=%llu shrink_asks=%llu demotions=%llu "
			        "copies=%llu copied=%llu copy_records=%llu expand_asks=%llu "
			        "diverged=%llu",
			        (unsigned long long)rs.streams, (unsigned long long)rs.queued,
			        (unsigned long long)rs.sent_batches, (unsigned long long)rs.resends,
			        (unsigned long long)rs.applied, (unsigned long long)rs.refused,
			        (unsigned long long)rs.shrink_asks,
			        (unsigned long long)rs.demotions, (unsigned long long)rs.copies,
			        (unsigned long long)rs.copied, (unsigned long long)rs.copy_recs,
			        (unsigned long long)rs.expand_asks,
			        (unsigned long long)rs.diverged);
	}
	kv_rs_destroy(s->repl);
	s->repl = NULL;
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

int
kv_server_get_for_test(kv_server *s, const void *key, size_t klen, kv_buf *val)
{
	return kv_store_get(s->store, key, klen, val);
}
