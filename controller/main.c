/*
 * main.c - shardkv-controller: parses the command line into an immutable
 * kv_controller_cfg (kv_controller_parse_args), starts the controller and
 * stops it on SIGTERM/SIGINT (doc/contract.md §5). This is the only place that deals
 * with signals.
 *
 * Exit codes: 0 clean stop, 1 cannot start (the reason on stderr), 2 usage.
 */
#include "common/err.h"
#include "common/log.h"
#include "common/version.h"
#include "controller/controller.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>

int
main(int argc, char **argv)
{
	kv_controller_args a;
	kv_controller *c = NULL;
	sigset_t set;
	char err[512] = "";
	int sig = 0, rv;

	if (kv_version_requested(argc, argv)) {
		kv_version_print(stdout, "shardkv-controller");
		return 0;
	}
	/* Before any thread exists, so that every thread inherits the mask and
	 * only the sigwait() below sees the signals. */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (kv_controller_parse_args(argc, argv, &a, err, sizeof(err)) != KV_OK) {
		fprintf(stderr, "shardkv-controller: %s (see --help)\n", err);
		return 2;
	}
	if (a.help) {
		fputs(kv_controller_usage, stdout);
		return 0;
	}
	kv_log_set_level(a.level);
	if ((rv = kv_controller_create(&a.cfg, &c, err, sizeof(err))) != KV_OK ||
	    (rv = kv_controller_start(c, err, sizeof(err))) != KV_OK) {
		kv_controller_destroy(c);
		fprintf(stderr, "shardkv-controller: %s\n", err[0] ? err : kv_strerror(rv));
		return 1;
	}
	while (sigwait(&set, &sig) != 0)
		;
	KV_INFO("controller", "stopping", "signal=%s", sig == SIGINT ? "SIGINT" : "SIGTERM");
	kv_controller_stop(c);
	kv_controller_destroy(c);
	KV_INFO("controller", "stopped", NULL);
	return 0;
}
