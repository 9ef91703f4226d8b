/*
 * controller.c - the controller's life cycle (controller.h): create opens
 * the state, start starts the threads and the listener, stop answers what
 * is held and stops them, destroy frees.
 *
 * The rest of the controller is in the files controller_int.h lists:
 * dispatch.c (requests in, answers out), commands.c, history.c, held.c,
 * fsm.c (Raft), stats.c, migrations.c and metrics_ctl.c. This file owns no
 * logic of its own beyond the order of starting and stopping, which is
 * what keeps stop from waiting on anything that cannot end: the metrics
 * listener first, then (marking `closing`, so nothing more is held or
 * changed) raft, the proposer, the reaper and last the rpc server, whose
 * remaining handlers answer at once. Nothing here is process-wide: no
 * signals (main.c), no globals.
 */
#include "common/err.h"
#include "common/lease.h"
#include "common/log.h"
#include "controller/controller_int.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

_Static_assert(KV_CONTROLLER_MAX_PEERS == KV_REPL_MAX_PEERS,
               "--peers (args.c) and raft agree on the most replicas");

int
kv_controller_raft_addr(const char *url, char *out, size_t outlen)
{
	const char *hp, *colon;
	char *end;
	unsigned long port;

	/* tls+tcp:// too: TLS is the controller's listener only; raft's own
	 * transport (raft_uv_tcp) is plain TCP either way. */
	if (url != NULL && strncmp(url, "tcp://", 6) == 0)
		hp = url + 6;
	else if (url != NULL && strncmp(url, "tls+tcp://", 10) == 0)
		hp = url + 10;
	else
		return KV_EINVAL;
	if ((colon = strrchr(hp, ':')) == NULL || colon == hp || colon[1] < '0' || colon[1] > '9' ||
	    strchr(hp, '/') != NULL)
		return KV_EINVAL; /* (strtoul would take "-5" or " 5") */
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno != 0 || *end != '\0' || port == 0 || port > 65535 - 1000)
		return KV_EINVAL;
	if ((size_t)snprintf(out, outlen, "%.*s:%lu", (int)(colon - hp), hp, port + 1000) >= outlen)
		return KV_EINVAL;
	return KV_OK;
}

/* Checks the replication flags and keeps what kv_controller_start needs to
 * start the Raft replica: the peers' controller URLs and raft addresses.
 * Its state (history, cluster id, dedup) comes from raft's snapshot and
 * log, not config.log. */
static int
repl_prepare(kv_controller *c, const kv_controller_cfg *cfg, char *err, size_t errlen)
{
	if (cfg->npeers > KV_REPL_MAX_PEERS)
		return kv_errf(err, errlen, KV_EINVAL, "--peers lists %zu controllers (at most %d)",
		               cfg->npeers, KV_REPL_MAX_PEERS);
	if (cfg->id < 1 || cfg->id > cfg->npeers)
		return kv_errf(err, errlen, KV_EINVAL, "--id %u does not index --peers (1 .. %zu)",
		               cfg->id, cfg->npeers);
	if ((c->peers = calloc(cfg->npeers, sizeof(*c->peers))) == NULL)
		return KV_ENOMEM;
	c->npeers = cfg->npeers;
	c->self_id = cfg->id;
	c->election_ms = cfg->election_ms;
	c->snapshot_threshold = cfg->snapshot_threshold;
	for (size_t i = 0; i < cfg->npeers; i++) {
		if ((c->peers[i] = strdup(cfg->peers[i])) == NULL)
			return KV_ENOMEM;
		if (cfg->raft_peers != NULL) {
			snprintf(c->raft_addr[i], sizeof(c->raft_addr[i]), "%s",
			         cfg->raft_peers[i]);
		} else if (kv_controller_raft_addr(cfg->peers[i], c->raft_addr[i],
		                                   sizeof(c->raft_addr[i])) != KV_OK) {
			return kv_errf(err, errlen, KV_EINVAL,
			               "cannot derive a raft address from peer %s (need "
			               "tcp:// or tls+tcp://HOST:PORT with PORT <= 64535, or "
			               "--raft-peers)",
			               cfg->peers[i]);
		}
	}
	if ((c->empty->cluster_id = strdup("")) == NULL)
		return KV_ENOMEM;
	if (mkdir(c->data_dir, 0755) != 0 && errno != EEXIST)
		return kv_errf(err, errlen, kv_err_from_errno(errno), "cannot create %s: %s",
		               c->data_dir, strerror(errno));
	if ((size_t)snprintf(c->raft_dir, sizeof(c->raft_dir), "%s/raft", c->data_dir) >=
	    sizeof(c->raft_dir))
		return kv_errf(err, errlen, KV_EINVAL, "--data-dir is too long");
	return KV_OK;
}

/* Starts the Raft replica (which restores its snapshot and replays its log
 * into the history) and the proposer thread. */
static int
repl_start(kv_controller *c, char *err, size_t errlen)
{
	const char *ra[KV_REPL_MAX_PEERS];
	int rv;

	for (size_t i = 0; i < c->npeers; i++)
		ra[i] = c->raft_addr[i];
	kv_repl_cfg rc = {
	    .id = c->self_id,
	    .npeers = c->npeers,
	    .raft_addrs = ra,
	    .dir = c->raft_dir,
	    .election_ms = c->election_ms,
	    .snapshot_threshold = c->snapshot_threshold,
	    .snapshot_trailing = c->snapshot_threshold ? (c->snapshot_threshold + 3) / 4 : 0,
	    .fsm = kv_ctl__fsm(c),
	};
	if ((rv = kv_repl_create(&rc, &c->repl, err, errlen)) != KV_OK)
		return rv;
	if (pthread_create(&c->proposer, NULL, kv_ctl__proposer_main, c) != 0)
		return kv_errf(err, errlen, KV_ENOMEM, "cannot start a thread");
	c->proposer_started = true;
	KV_INFO("controller", "raft replica started", "id=%u peers=%zu raft=%s dir=%s epoch=%llu",
	        c->self_id, c->npeers, ra[c->self_id - 1], c->raft_dir,
	        (unsigned long long)kv_controller_epoch(c));
	return KV_OK;
}

int
kv_controller_create(const kv_controller_cfg *cfg, kv_controller **out, char *err, size_t errlen)
{
	kv_controller *c;
	pthread_condattr_t ca;
	kv_clog_info info;
	int rv;

	if (cfg == NULL || cfg->listen == NULL || cfg->data_dir == NULL || out == NULL) {
		snprintf(err, errlen, "--listen and --data-dir are required");
		return KV_EINVAL;
	}
	if ((c = calloc(1, sizeof(*c))) == NULL)
		return KV_ENOMEM;
	c->started_ns = kv_now_ns();
	c->held.next = c->held.prev = &c->held;
	c->next_mig_id = 1;
	c->watch_max_ms = cfg->watch_max_ms ? cfg->watch_max_ms : 60000;
	c->wait_max_ms = cfg->wait_max_ms ? cfg->wait_max_ms : 600000;
	c->contexts = cfg->contexts ? cfg->contexts : 1024;
	c->max_watches = cfg->max_watches ? cfg->max_watches : c->contexts * 3 / 4;
	if (c->max_watches + CTL_MAX_WAITS + 16 > c->contexts)
		c->max_watches =
		    c->contexts > CTL_MAX_WAITS + 32 ? c->contexts - CTL_MAX_WAITS - 16 : 1;
	{
		uint64_t lease = cfg->lease_ms ? cfg->lease_ms : KV_LEASE_MS;
		uint64_t margin = cfg->lease_margin_ms ? cfg->lease_margin_ms : KV_LEASE_MARGIN_MS;
		/* Replicated, a deposed leader may renew leases for up to one
		 * election timeout after its successor started counting. */
		uint64_t elect = cfg->npeers > 0 ? (cfg->election_ms ? cfg->election_ms : 1000) : 0;
		c->lease_ns = lease * 1000000u;
		c->down_ns =
		    kv_lease_down_ns(lease * 1000000u, margin * 1000000u, elect * 1000000u);
		c->live_tick_ns = c->lease_ns / 8;
		if (c->live_tick_ns > 100000000u)
			c->live_tick_ns = 100000000u;
		if (c->live_tick_ns < 5000000u)
			c->live_tick_ns = 5000000u;
		c->down_after_s = cfg->down_after_s ? cfg->down_after_s : 60;
	}
	c->replicas = cfg->replicas ? cfg->replicas : 1;
	c->auto_balance = cfg->auto_balance;
	kv_sched_params_default(&c->sched_p);
	if (cfg->split_bytes)
		c->sched_p.split_bytes = cfg->split_bytes;
	if (cfg->split_ops)
		c->sched_p.split_ops = cfg->split_ops;
	if (cfg->max_migrations)
		c->sched_p.max_migrations = cfg->max_migrations;
	c->sched_p.cut_replicated = cfg->balance_cut_replicated;
	c->handover_unordered = cfg->handover_unordered;
	c->min_insync = cfg->min_insync ? cfg->min_insync : (c->replicas < 2 ? c->replicas : 2);
	if (c->replicas > KV_MAX_REPLICAS || c->min_insync > c->replicas) {
		snprintf(
		    err, errlen,
		    "--replicas must be 1 to %d and --min-insync 1 to --replicas (got %u and %u)",
		    KV_MAX_REPLICAS, c->replicas, c->min_insync);
		free(c);
		return KV_EINVAL;
	}
	if ((c->sched = kv_sched_new()) == NULL) {
		free(c);
		return KV_ENOMEM;
	}
	pthread_mutex_init(&c->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cv, &ca);
	pthread_cond_init(&c->pcv, &ca);
	pthread_condattr_destroy(&ca);
	if ((c->listen = strdup(cfg->listen)) == NULL ||
	    (c->data_dir = strdup(cfg->data_dir)) == NULL || (c->empty = kv_config_new()) == NULL ||
	    (cfg->metrics != NULL && (c->metrics_addr = strdup(cfg->metrics)) == NULL)) {
		rv = KV_ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto err;
	}
	if (cfg->auth_token_file != NULL) {
		bool loose = false;
		if ((rv = kv_auth_load(cfg->auth_token_file, &c->auth, &loose, err, errlen)) != 0) {
			rv = KV_EINVAL;
			goto err;
		}
		if (loose)
			KV_WARN("controller", "auth token file is accessible by group or others",
			        "file=%s hint=\"chmod 600 it\"", cfg->auth_token_file);
	}
	if (kv_tls_files_any(&cfg->tls) &&
	    (rv = kv_tls_create(&cfg->tls, true, &c->tls, err, errlen)) != KV_OK)
		goto err;
	if ((rv = kv_tls_check_url(c->tls != NULL, "--listen", c->listen, err, errlen)) != KV_OK)
		goto err;
	if (cfg->npeers > 0) {
		if ((rv = repl_prepare(c, cfg, err, errlen)) != KV_OK)
			goto err;
	} else {
		rv = kv_clog_open(c->data_dir, kv_ctl__replay_cb, c, &c->log, &info, err, errlen);
		if (rv != KV_OK)
			goto err;
		snprintf(c->cluster_id, sizeof(c->cluster_id), "%s", kv_clog_cluster_id(c->log));
		if ((c->empty->cluster_id = strdup(c->cluster_id)) == NULL) {
			rv = KV_ENOMEM;
			goto err;
		}
		KV_INFO("controller", "config log opened",
		        "file=%s records=%llu epoch=%zu cluster=%s created=%d dropped_bytes=%llu",
		        kv_clog_path(c->log), (unsigned long long)info.records, c->nhist,
		        c->cluster_id, info.created, (unsigned long long)info.dropped_bytes);
	}
	*out = c;
	return KV_OK;
err:
	kv_controller_destroy(c);
	return rv;
}

int
kv_controller_start(kv_controller *c, char *err, size_t errlen)
{
	int rv;

	if (c->started || c->closing) { /* (no thread runs yet: no lock needed) */
		snprintf(err, errlen, "the controller was started or stopped before");
		return KV_EINVAL;
	}
	c->started = true;
	if (c->npeers > 0 && (rv = repl_start(c, err, errlen)) != KV_OK)
		goto err;
	if (pthread_create(&c->reaper, NULL, kv_ctl__reaper_main, c) != 0) {
		rv = KV_ENOMEM;
		snprintf(err, errlen, "cannot start a thread");
		goto err;
	}
	c->reaper_started = true;
	/* A freshly started controller has heard from nobody: it counts every
	 * node as seen now, so it declares nothing down for a full down_ns. */
	c->live_since_ns = kv_now_ns();
	pthread_mutex_lock(&c->mu);
	const kv_config *at_start = kv_ctl__latest_locked(c);
	for (size_t i = 0; at_start != NULL && i < at_start->nmigs; i++)
		if (at_start->migs[i].id > c->mig_unknown_max)
			c->mig_unknown_max = at_start->migs[i].id;
	pthread_mutex_unlock(&c->mu);
	if (pthread_create(&c->live_thr, NULL, kv_ctl__liveness_main, c) != 0) {
		rv = KV_ENOMEM;
		snprintf(err, errlen, "cannot start a thread");
		goto err;
	}
	c->live_started = true;
	kv_rpc_server_opts o = {.url = c->listen,
	                        .contexts = c->contexts,
	                        .handler = kv_ctl__handle,
	                        .arg = c,
	                        .tls = c->tls};
	if ((rv = kv_rpc_server_create(&o, &c->rpc)) != KV_OK) {
		if (rv == KV_EADDRINUSE)
			snprintf(err, errlen, "cannot listen on %s: address in use", c->listen);
		else
			snprintf(err, errlen, "cannot listen on %s: %s", c->listen,
			         kv_strerror(rv));
		goto err;
	}
	if (c->metrics_addr && (rv = kv_metrics_create(c->metrics_addr, kv_ctl__metrics_render, c,
	                                               &c->metrics, err, errlen)) != KV_OK)
		goto err;
	KV_INFO("controller", "listening",
	        "address=%s epoch=%llu metrics=%s auth=%s tls=%s lease_ms=%llu down_ms=%llu "
	        "down_after_s=%u replicas=%u min_insync=%u",
	        c->listen, (unsigned long long)kv_controller_epoch(c),
	        c->metrics_addr ? c->metrics_addr : "off", c->auth.len ? "token" : "off",
	        c->tls ? "mutual" : "off", (unsigned long long)(c->lease_ns / 1000000u),
	        (unsigned long long)(c->down_ns / 1000000u), c->down_after_s, c->replicas,
	        c->min_insync);
	return KV_OK;
err:
	kv_controller_stop(c);
	return rv;
}

void
kv_controller_stop(kv_controller *c)
{
	if (c == NULL)
		return;
	kv_metrics_destroy(c->metrics);
	c->metrics = NULL;
	pthread_mutex_lock(&c->mu);
	c->closing = true;
	pthread_cond_signal(&c->cv);
	pthread_cond_broadcast(&c->pcv);
	pthread_mutex_unlock(&c->mu);
	/* Replicated: stop raft first (a proposal in flight completes with
	 * KV_ECLOSED), then the proposer (it answers what is queued), then the
	 * reaper (it answers what the proposer held). */
	if (c->repl != NULL)
		kv_repl_stop(c->repl);
	if (c->proposer_started)
		pthread_join(c->proposer, NULL);
	c->proposer_started = false;
	if (c->live_started)
		pthread_join(c->live_thr, NULL);
	c->live_started = false;
	if (c->reaper_started)
		pthread_join(c->reaper, NULL);
	c->reaper_started = false;
	/* Handlers still running see `closing`: they answer at once and hold
	 * nothing, so the server's wait for them is short. */
	kv_rpc_server_destroy(c->rpc);
	c->rpc = NULL;
}

void
kv_controller_destroy(kv_controller *c)
{
	if (c == NULL)
		return;
	kv_controller_stop(c);
	/* Requests held after the reaper stopped (none: closing refuses them). */
	while (c->held.next != &c->held) {
		struct ctl_held *h = c->held.next;
		kv_ctl__held_unlink(c, h);
		kv_ctl__held_free(h);
	}
	kv_clog_close(c->log);
	kv_repl_destroy(c->repl);
	for (size_t i = 0; i < c->npeers; i++)
		free(c->peers[i]);
	free(c->peers);
	for (size_t i = 0; i < c->nhist; i++)
		kv_config_free(c->hist[i]);
	free(c->hist);
	kv_config_free(c->empty);
	for (size_t i = 0; i < c->nstats; i++)
		kv_ctl__stat_clear(&c->stats[i]);
	free(c->stats);
	kv_sched_free(c->sched);
	free(c->prog);
	for (size_t i = 0; i < CTL_DEDUP; i++)
		free(c->dedup[i].reply);
	pthread_cond_destroy(&c->cv);
	pthread_cond_destroy(&c->pcv);
	pthread_mutex_destroy(&c->mu);
	free(c->listen);
	free(c->data_dir);
	free(c->metrics_addr);
	if (c->auth.data != NULL)
		memset(c->auth.data, 0, c->auth.len);
	kv_buf_fini(&c->auth);
	kv_tls_destroy(c->tls);
	free(c);
}
