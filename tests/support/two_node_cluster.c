/*
 * two_node_cluster.c - see two_node_cluster.h.
 *
 * The processes are started, waited for and stopped through common/proc.h,
 * whose exit paths also stop them when a failed assertion ends the test.
 */
#include "tests/support/two_node_cluster.h"
#include "client/include/shardkv.h"
#include "common/err.h"
#include "common/proc.h"
#include "tests/support/testutil.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define READY_MS 15000u /* both servers active with a range each */
#define STOP_MS  3000u  /* SIGTERM to exit, before SIGKILL */

void
test_cluster_stop(test_cluster *tc)
{
	/* SIGTERM to all first (servers drain in parallel), then reap each
	 * within what is left of one deadline. */
	uint64_t t0 = kv_test_now_ms();

	for (int i = 0; i < 1 + NSERVERS; i++)
		if (tc->pids[i] > 0)
			kill(tc->pids[i], SIGTERM);
	for (int i = 0; i < 1 + NSERVERS; i++) {
		uint64_t used = kv_test_now_ms() - t0;
		if (tc->pids[i] > 0)
			kv_proc_reap(tc->pids[i], used < STOP_MS ? (unsigned)(STOP_MS - used) : 0,
			             NULL);
		tc->pids[i] = 0;
	}
}

/* Starts bin_dir/argv[0] with its output appended to `log`. Returns the pid
 * or -1. */
static pid_t
start(const char *bin_dir, char *const argv[], const char *log)
{
	char path[512];

	snprintf(path, sizeof(path), "%s/%s", bin_dir, argv[0]);
	return kv_proc_spawn(path, argv, log);
}

void
test_cluster_print_logs(const test_cluster *tc)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "tail -n 20 %s/*.log >&2", tc->dir);
	if (system(cmd) != 0)
		fprintf(stderr, "(no logs)\n");
}

/* kv_proc_ready_cb: the configuration has both servers active and a range
 * map that gives each a range. */
static int
both_serve(void *arg)
{
	shardkv_client *c = arg;
	shardkv_config *cfg = NULL;
	bool ready = false;

	if (shardkv_config_get(c, 0, &cfg) == 0) {
		size_t active = 0;
		for (size_t i = 0; i < cfg->nnodes; i++)
			active += cfg->nodes[i].state == SHARDKV_NODE_ACTIVE;
		ready = active == NSERVERS && cfg->nranges >= 2 && cfg->nmigrations == 0;
		shardkv_config_free(cfg);
	}
	return ready ? 0 : 1;
}

int
test_cluster_start(test_cluster *tc, const char *bin_dir, const char *tag)
{
	char path[512], data[512];

	snprintf(tc->dir, sizeof(tc->dir), "/tmp/shardkv-%s-XXXXXX", tag);
	if (mkdtemp(tc->dir) == NULL)
		return -1;
	kv_test_free_url(tc->ctl_url, sizeof(tc->ctl_url));
	snprintf(data, sizeof(data), "%s/ctl", tc->dir);
	snprintf(path, sizeof(path), "%s/ctl.log", tc->dir);
	/* One copy per range on purpose: the client tests route between two
	 * owners of half the key space each, which the second join's migration
	 * makes (with replicas it would only become a replica). The balancer
	 * is off: with it on, a join into an empty cluster moves nothing
	 * (doc/scheduler.md "A new cluster"). */
	char *cargv[] = {"shardkv-controller", "--listen", tc->ctl_url,      "--data-dir", data,
	                 "--replicas",         "1",        "--auto-balance", "off",        NULL};
	if ((tc->pids[0] = start(bin_dir, cargv, path)) < 0)
		return -1;
	for (int i = 0; i < NSERVERS; i++) {
		char sdata[512], slog[512];
		kv_test_free_url(tc->srv_url[i], sizeof(tc->srv_url[i]));
		snprintf(sdata, sizeof(sdata), "%s/s%d", tc->dir, i + 1);
		snprintf(slog, sizeof(slog), "%s/s%d.log", tc->dir, i + 1);
		char *sargv[] = {"shardkv-server",
		                 "--listen",
		                 tc->srv_url[i],
		                 "--controller",
		                 tc->ctl_url,
		                 "--data-dir",
		                 sdata,
		                 "--join",
		                 NULL};
		if ((tc->pids[1 + i] = start(bin_dir, sargv, slog)) < 0) {
			test_cluster_stop(tc);
			return -1;
		}
	}
	shardkv_options o = {.timeout_ms = 500, .no_watch = true};
	shardkv_client *c;
	if (shardkv_open(tc->ctl_url, &o, &c) != 0) {
		test_cluster_stop(tc);
		return -1;
	}
	int rv = kv_proc_wait_ready(tc->pids[0], READY_MS, 20, both_serve, c, NULL);
	shardkv_close(c);
	if (rv != 0) {
		if (rv == KV_ECLOSED)
			tc->pids[0] = 0;
		fprintf(stderr, "cluster not ready within %u s%s\n", READY_MS / 1000,
		        rv == KV_ECLOSED ? " (the controller exited)" : "");
		test_cluster_print_logs(tc);
		test_cluster_stop(tc);
		return -1;
	}
	return 0;
}

void
test_cluster_destroy(test_cluster *tc)
{
	test_cluster_stop(tc);
	kv_test_rmtree(tc->dir);
}
