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
	static const char *const states[] = {"joining", "active", "draining", "gone", "down"};
	kv_controller *c = arg;
	uint64_t nodes[6] = {0}, epoch, ranges, migs, watches, waits, uptime, downs, under = 0;
	uint64_t failovers, shrinks, expands, unfenced, replacements, hholds, htimeouts;
	uint64_t sched[5][KV_SCHED_WHY_MAX], splits[KV_SCHED_WHY_MAX];
	const kv_config *cur;
	size_t nlive = 0;
	struct {
		char id[16];
		double age;
	} *live = NULL;
	kv_metric *all = NULL;
	int rv;

	pthread_mutex_lock(&c->mu);
	cur = kv_ctl__latest_locked(c);
	epoch = cur->epoch;
	for (size_t i = 0; i < cur->nnodes; i++)
		nodes[cur->nodes[i].state < 6 ? cur->nodes[i].state : 0]++;
	/* Heartbeat age per node not gone, at the leader (bounded by the node
	 * count); out of memory it is left out. */
	if (cur->nnodes && (live = calloc(cur->nnodes, sizeof(*live))) != NULL)
		for (size_t i = 0; i < cur->nnodes; i++) {
			if (cur->nodes[i].state == KV_NODE_GONE)
				continue;
			snprintf(live[nlive].id, sizeof(live[nlive].id), "%u", cur->nodes[i].id);
			live[nlive++].age =
			    (double)(kv_now_ns() - kv_ctl__live_seen_locked(c, cur->nodes[i].id)) /
			    1e9;
		}
	downs = c->downs_total;
	failovers = c->failovers_total;
	shrinks = c->isr_shrinks_total;
	expands = c->isr_expands_total;
	unfenced = c->unfenced_total;
	hholds = c->handover_holds_total;
	htimeouts = c->handover_timeouts_total;
	replacements = c->replacements_total;
	memcpy(sched, c->sched_total, sizeof(sched));
	memcpy(splits, c->sched_splits, sizeof(splits));
	ranges = cur->nranges;
	/* Under-replicated (doc/contract.md §2): fewer replicas than R (as many
	 * as the active nodes allow), or an ISR smaller than the replicas. */
	{
		uint32_t want = c->replicas ? c->replicas : 1, active = 0;
		for (size_t i = 0; i < cur->nnodes; i++)
			active += cur->nodes[i].state == KV_NODE_ACTIVE;
		if (want > active)
			want = active;
		for (size_t i = 0; i < cur->nranges; i++) {
			const kv_range *r = &cur->ranges[i];
			under += kv_range_nreplicas(r) < want ||
			         kv_range_ninsync(r) < kv_range_nreplicas(r);
		}
	}
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
	    {"shardkv_controller_nodes", KV_METRIC_GAUGE, "Nodes by state.", "state", states[4],
	     .u = nodes[5]},
	    {"shardkv_controller_nodes_declared_down_total", KV_METRIC_COUNTER,
	     "Nodes this controller declared down (missed heartbeats past the lease).", .u = downs},
	    {"shardkv_controller_failovers_total", KV_METRIC_COUNTER,
	     "Ranges this controller gave a new primary because theirs was declared down.",
	     .u = failovers},
	    {"shardkv_controller_isr_shrinks_total", KV_METRIC_COUNTER,
	     "Ranges whose in-sync replica set lost a member (down node or primary's request).",
	     .u = shrinks},
	    {"shardkv_controller_isr_expands_total", KV_METRIC_COUNTER,
	     "Ranges whose in-sync replica set gained a member (primary's request).", .u = expands},
	    {"shardkv_controller_fences_in_sync_total", KV_METRIC_COUNTER,
	     "Ranges whose old primary, kept as the transfer fence, was found in sync by the new "
	     "primary and stayed in the in-sync set without a copy.",
	     .u = unfenced},
	    {"shardkv_controller_handover_holds_total", KV_METRIC_COUNTER,
	     "Watches of a range's new primary held until its old primary had applied the "
	     "transfer (doc/replication.md \"Primary transfer\").",
	     .u = hholds},
	    {"shardkv_controller_handover_hold_timeouts_total", KV_METRIC_COUNTER,
	     "Of those, watches answered after the longest wait (100 ms) without the old "
	     "primary's report.",
	     .u = htimeouts},
	    {"shardkv_controller_replacements_total", KV_METRIC_COUNTER,
	     "Replicas added in place of a leaving node or one down past --down-after.",
	     .u = replacements},
	    {"shardkv_controller_ranges", KV_METRIC_GAUGE, "Entries in the range map.",
	     .u = ranges},
	    {"shardkv_controller_ranges_under_replicated", KV_METRIC_GAUGE,
	     "Ranges with fewer replicas than --replicas allows, or an in-sync set smaller "
	     "than their replicas.",
	     .u = under},
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
	size_t nm = sizeof(m) / sizeof(m[0]) - (c->repl ? 0 : 4);
	/* The balancer's decisions (doc/scheduler.md), by reason. */
	kv_metric bal[] = {
	    {"shardkv_controller_balance_moves_total", KV_METRIC_COUNTER,
	     "Single ranges the balancer moved (data migrates), by reason.", "reason", "bytes",
	     .u = sched[KV_SCHED_MOVE][KV_SCHED_WHY_BYTES]},
	    {"shardkv_controller_balance_moves_total", KV_METRIC_COUNTER,
	     "Single ranges the balancer moved (data migrates), by reason.", "reason", "ops",
	     .u = sched[KV_SCHED_MOVE][KV_SCHED_WHY_OPS]},
	    {"shardkv_controller_balance_moves_total", KV_METRIC_COUNTER,
	     "Single ranges the balancer moved (data migrates), by reason.", "reason", "primaries",
	     .u = sched[KV_SCHED_MOVE][KV_SCHED_WHY_PRIMARIES]},
	    {"shardkv_controller_balance_transfers_total", KV_METRIC_COUNTER,
	     "Primary roles the balancer gave to an in-sync replica, by reason.", "reason", "bytes",
	     .u = sched[KV_SCHED_TRANSFER][KV_SCHED_WHY_BYTES]},
	    {"shardkv_controller_balance_transfers_total", KV_METRIC_COUNTER,
	     "Primary roles the balancer gave to an in-sync replica, by reason.", "reason", "ops",
	     .u = sched[KV_SCHED_TRANSFER][KV_SCHED_WHY_OPS]},
	    {"shardkv_controller_balance_transfers_total", KV_METRIC_COUNTER,
	     "Primary roles the balancer gave to an in-sync replica, by reason.", "reason",
	     "primaries", .u = sched[KV_SCHED_TRANSFER][KV_SCHED_WHY_PRIMARIES]},
	    {"shardkv_controller_balance_splits_total", KV_METRIC_COUNTER,
	     "Moves, transfers and self-splits of the balancer that cut a range, by reason.",
	     "reason", "bytes", .u = splits[KV_SCHED_WHY_BYTES]},
	    {"shardkv_controller_balance_splits_total", KV_METRIC_COUNTER,
	     "Moves, transfers and self-splits of the balancer that cut a range, by reason.",
	     "reason", "ops", .u = splits[KV_SCHED_WHY_OPS]},
	    {"shardkv_controller_balance_splits_total", KV_METRIC_COUNTER,
	     "Moves, transfers and self-splits of the balancer that cut a range, by reason.",
	     "reason", "primaries", .u = splits[KV_SCHED_WHY_PRIMARIES]},
	    {"shardkv_controller_balance_merges_total", KV_METRIC_COUNTER,
	     "Small cold ranges the balancer moved onto their neighbour's node.", "reason", "cold",
	     .u = sched[KV_SCHED_MERGE][KV_SCHED_WHY_COLD]},
	    {"shardkv_controller_balance_hot_keys_total", KV_METRIC_COUNTER,
	     "Hot single keys the balancer reported (never split).",
	     .u = sched[KV_SCHED_HOT][KV_SCHED_WHY_HOTKEY]},
	};
	size_t nbal = sizeof(bal) / sizeof(bal[0]);
	if ((all = calloc(nm + nbal + nlive + 1, sizeof(*all))) == NULL) {
		free(live);
		return KV_ENOMEM;
	}
	memcpy(all, m, nm * sizeof(*m));
	memcpy(all + nm, bal, nbal * sizeof(*bal));
	nm += nbal;
	/* Only the leader hears heartbeats: a follower reports no ages. */
	for (size_t i = 0; i < nlive && (c->repl == NULL || in.role == KV_REPL_LEADER); i++)
		all[nm++] = (kv_metric){"shardkv_controller_node_heartbeat_age_seconds",
		                        KV_METRIC_GAUGE,
		                        "Seconds since the node's last heartbeat reached this "
		                        "leader (since it became leader, if none).",
		                        "node",
		                        live[i].id,
		                        .real = true,
		                        .f = live[i].age};
	rv = kv_metrics_write(out, all, nm);
	free(all);
	free(live);
	return rv;
}
