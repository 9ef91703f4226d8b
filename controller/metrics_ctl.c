/*
 * metrics_ctl.c - the controller's gauges for /metrics (common/metrics.c
 * serves them with --metrics): epoch, nodes by state, ranges, migrations,
 * held requests, uptime and, replicated, the replica's Raft state.
 *
 * The metrics thread calls the renderer: it copies the numbers under mu and
 * formats them with mu released. The metric names are part of the
 * interface (doc/metrics.md); this file changes nothing.
 */
#include "common/err.h"
#include "common/log.h"
#include "controller/controller_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Renders the gauges for /metrics (on the metrics thread): reads them under
 * mu, formats with mu released. The names are part of the interface. */
int
kv_ctl__metrics_render(void *arg, kv_buf *out)
{
	static const char *const states[] = {"joining", "active", "draining", "gone"};
	kv_controller *c = arg;
	uint64_t nodes[5] = {0}, epoch, ranges, migs, watches, waits, uptime;
	const kv_config *cur;

	pthread_mutex_lock(&c->mu);
	cur = kv_ctl__latest_locked(c);
	epoch = cur->epoch;
	for (size_t i = 0; i < cur->nnodes; i++)
		nodes[cur->nodes[i].state < 5 ? cur->nodes[i].state : 0]++;
	ranges = cur->nranges;
	migs = cur->nmigs;
	watches = c->nwatches;
	waits = c->nwaits;
	uptime = (kv_now_ns() - c->started_ns) / 1000000000u;
	pthread_mutex_unlock(&c->mu);
	kv_repl_info in = {0};
	if (c->repl != NULL)
		kv_repl_get_info(c->repl, &in);

	kv_metric m[] = {
	    {"shardkv_controller_epoch", KV_METRIC_GAUGE, "Latest published configuration epoch.",
	     .u = epoch},
	    {"shardkv_controller_nodes", KV_METRIC_GAUGE, "Nodes by state.", "state", states[0],
	     .u = nodes[1]},
	    {"shardkv_controller_nodes", KV_METRIC_GAUGE, "Nodes by state.", "state", states[1],
	     .u = nodes[2]},
	    {"shardkv_controller_nodes", KV_METRIC_GAUGE, "Nodes by state.", "state", states[2],
	     .u = nodes[3]},
	    {"shardkv_controller_nodes", KV_METRIC_GAUGE, "Nodes by state.", "state", states[3],
	     .u = nodes[4]},
	    {"shardkv_controller_ranges", KV_METRIC_GAUGE, "Entries in the range map.",
	     .u = ranges},
	    {"shardkv_controller_migrations", KV_METRIC_GAUGE, "Migrations in flight.", .u = migs},
	    {"shardkv_controller_held_watches", KV_METRIC_GAUGE, "Watches held.", .u = watches},
	    {"shardkv_controller_held_waits", KV_METRIC_GAUGE, "Commands waiting for migrations.",
	     .u = waits},
	    {"shardkv_controller_uptime_seconds", KV_METRIC_GAUGE, "Seconds since start.",
	     .u = uptime},
	    {"shardkv_controller_raft_leader", KV_METRIC_GAUGE,
	     "1 when this replica is the Raft leader (replicated controllers only).",
	     .u = in.role == KV_REPL_LEADER},
	    {"shardkv_controller_raft_term", KV_METRIC_GAUGE, "Current Raft term.", .u = in.term},
	    {"shardkv_controller_raft_commit_index", KV_METRIC_GAUGE, "Raft commit index.",
	     .u = in.commit_index},
	    {"shardkv_controller_raft_applied_index", KV_METRIC_GAUGE,
	     "Raft index applied to the configuration history.", .u = in.applied},
	};
	/* A standalone controller has no Raft gauges. */
	return kv_metrics_write(out, m, sizeof(m) / sizeof(m[0]) - (c->repl ? 0 : 4));
}
