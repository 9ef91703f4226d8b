/*
 * two_node_cluster.c - see two_node_cluster.h.
 */
#include "tests/support/two_node_cluster.h"
#include "client/include/shardkv.h"
#include "tests/support/testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

/* The cluster the atexit handler stops. */
static test_cluster *live;

void
test_cluster_stop(test_cluster *tc)
{
	/* SIGTERM first (servers drain), SIGKILL after a deadline. */
	for (int i = 0; i < 1 + NSERVERS; i++)
		if (tc->pids[i] > 0)
			kill(tc->pids[i], SIGTERM);
	uint64_t t0 = kv_test_now_ms();
	for (int i = 0; i < 1 + NSERVERS; i++) {
		while (tc->pids[i] > 0) {
			pid_t r = waitpid(tc->pids[i], NULL, WNOHANG);
			if (r == tc->pids[i] || (r < 0 && errno != EINTR)) {
				tc->pids[i] = 0;
				break;
			}
			if (kv_test_now_ms() - t0 > 3000) {
				kill(tc->pids[i], SIGKILL);
				waitpid(tc->pids[i], NULL, 0);
				tc->pids[i] = 0;
				break;
			}
			kv_test_sleep_ms(5);
		}
	}
}

static void
stop_live(void)
{
	if (live != NULL)
		test_cluster_stop(live);
}

/* Starts bin_dir/argv[0] with stderr to `log`. Returns the pid. */
static pid_t
start(const char *bin_dir, char *const argv[], const char *log)
{
	char path[512];
	pid_t pid;

	snprintf(path, sizeof(path), "%s/%s", bin_dir, argv[0]);
	pid = fork();
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (fd >= 0)
			dup2(fd, 2);
		if (null >= 0) {
			dup2(null, 0);
			dup2(null, 1);
		}
		execv(path, argv);
		_exit(127);
	}
	return pid;
}

void
test_cluster_print_logs(const test_cluster *tc)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "tail -n 20 %s/*.log >&2", tc->dir);
	if (system(cmd) != 0)
		fprintf(stderr, "(no logs)\n");
}

int
test_cluster_start(test_cluster *tc, const char *bin_dir, const char *tag)
{
	static bool registered;
	char path[512], data[512];

	if (!registered) {
		atexit(stop_live);
		registered = true;
	}
	live = tc;
	snprintf(tc->dir, sizeof(tc->dir), "/tmp/shardkv-%s-XXXXXX", tag);
	if (mkdtemp(tc->dir) == NULL)
		return -1;
	kv_test_free_url(tc->ctl_url, sizeof(tc->ctl_url));
	snprintf(data, sizeof(data), "%s/ctl", tc->dir);
	snprintf(path, sizeof(path), "%s/ctl.log", tc->dir);
	char *cargv[] = {"shardkv-controller", "--listen", tc->ctl_url, "--data-dir", data, NULL};
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
	/* Ready when the configuration has both servers active and a range map
	 * that gives each a range. */
	shardkv_options o = {.timeout_ms = 500, .no_watch = true};
	shardkv_client *c;
	if (shardkv_open(tc->ctl_url, &o, &c) != 0) {
		test_cluster_stop(tc);
		return -1;
	}
	bool ready = false;
	for (uint64_t t0 = kv_test_now_ms(); !ready && kv_test_now_ms() - t0 < 15000;) {
		shardkv_config *cfg = NULL;
		if (shardkv_config_get(c, 0, &cfg) == 0) {
			size_t active = 0;
			for (size_t i = 0; i < cfg->nnodes; i++)
				active += cfg->nodes[i].state == SHARDKV_NODE_ACTIVE;
			ready = active == NSERVERS && cfg->nranges >= 2 && cfg->nmigrations == 0;
			shardkv_config_free(cfg);
		}
		if (!ready)
			kv_test_sleep_ms(20);
	}
	shardkv_close(c);
	if (!ready) {
		fprintf(stderr, "cluster not ready within 15 s\n");
		test_cluster_print_logs(tc);
		test_cluster_stop(tc);
		return -1;
	}
	return 0;
}

void
test_cluster_destroy(test_cluster *tc)
{
	char cmd[600];

	test_cluster_stop(tc);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tc->dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tc->dir);
}
