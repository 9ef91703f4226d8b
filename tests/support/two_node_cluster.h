/*
 * two_node_cluster.h - a controller and two joined servers, real processes
 * on free loopback ports, for the client library's cluster tests
 * (test_client_cluster, test_client_bench_cluster). The richer
 * cluster_util.h serves the other cluster tests.
 */
#ifndef KV_TESTS_SUPPORT_TWO_NODE_CLUSTER_H
#define KV_TESTS_SUPPORT_TWO_NODE_CLUSTER_H

#include <sys/types.h>

#define NSERVERS 2

/* The processes of one test cluster. */
typedef struct {
	char dir[256];              /* temporary directory */
	char ctl_url[64];           /* controller URL */
	char srv_url[NSERVERS][64]; /* server URLs */
	pid_t pids[1 + NSERVERS];   /* started processes; 0: none */
} test_cluster;

/* Starts the controller and servers from bin_dir with data and logs under a
 * new /tmp/shardkv-TAG-XXXXXX, and waits (at most 15 s) until both servers
 * are active with a range each. Returns 0, or -1 with everything stopped.
 * The processes are in common/proc.h's table, whose exit paths kill them
 * when a failed assertion ends the test, so no daemon is left behind. */
int test_cluster_start(test_cluster *tc, const char *bin_dir, const char *tag);

/* Stops every process (SIGTERM, then SIGKILL after 3 s). */
void test_cluster_stop(test_cluster *tc);

/* Stops every process and removes the directory. */
void test_cluster_destroy(test_cluster *tc);

/* Prints the last lines of every log to stderr. */
void test_cluster_print_logs(const test_cluster *tc);

#endif
