/*
 * main.c - shardkv-controller: parses the command line into an immutable
 * kv_controller_cfg (kv_controller_parse_args) and runs the controller until
 * SIGTERM/SIGINT (SPEC §5).
 *
 * Exit codes: 0 clean stop, 1 cannot start (the reason on stderr), 2 usage.
 */
#include "common/err.h"
#include "common/log.h"
#include "controller/controller.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>

int
main(int argc, char **argv)
{
	kv_controller_args a;
	sigset_t set;
	char err[512] = "";
	int rv;

	/* Before any thread exists, so that every thread inherits the mask and
	 * only sigwait() in kv_controller_run sees the signals. */
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
	rv = kv_controller_run(&a.cfg, err, sizeof(err));
	if (rv != KV_OK) {
		fprintf(stderr, "shardkv-controller: %s\n", err[0] ? err : kv_strerror(rv));
		return 1;
	}
	return 0;
}
