/*
 * main.c - shardkv-server: parses flags into an immutable kv_server_cfg
 * (kv_server_parse_args), creates and starts the server (server.h) and
 * turns signals into its life cycle.
 *
 * DESIGN. SIGTERM and SIGINT are blocked first thing in main, before the
 * server starts any thread (so every thread inherits the mask, and a
 * signal sent while the server starts waits for the loop), and taken here
 * with sigtimedwait. SIGTERM runs the graceful leave (kv_server_leave: drain,
 * then stop); SIGINT stops at once and keeps the ranges for a restart; a
 * second signal during the leave cuts it short. SIGPIPE and SIGXFSZ are
 * ignored (a file size limit is an I/O error, not a death). Exit codes:
 * every usage error exits 2 with one line naming the problem; a server that
 * cannot start, or stops with writes not on disk, exits 1 (the reason was
 * logged); a node the controller says is gone (removed, or left by
 * `shardkv leave`) stops and exits 4; a clean stop exits 0.
 */
#include "common/err.h"
#include "common/log.h"
#include "common/version.h"
#include "shardserver/server.h"

#include <signal.h>
#include <stdio.h>
#include <time.h>

#define COMP "server"

/* Waits for a signal of set up to ms. Returns the signal or 0. */
static int
wait_signal(const sigset_t *set, unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000u, .tv_nsec = (long)(ms % 1000u) * 1000000L};
	int sig = sigtimedwait(set, NULL, &ts);
	return sig > 0 ? sig : 0;
}

/* kv_server_wait_cb of the graceful leave: a second signal cuts it short. */
static bool
second_signal(void *arg, unsigned ms)
{
	return wait_signal(arg, ms) != 0;
}

int
main(int argc, char **argv)
{
	kv_server_args a;
	kv_server *s = NULL;
	sigset_t set;
	char err[600];
	int rv;

	/* First of all: a SIGTERM that comes while the server starts (a
	 * supervisor that stops it at once) is then taken by the loop below
	 * and drains, instead of killing the process by its default action. */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	if (kv_version_requested(argc, argv)) {
		kv_version_print(stdout, "shardkv-server");
		return 0;
	}
	if (kv_server_parse_args(argc, argv, &a, err, sizeof(err)) != KV_OK) {
		fprintf(stderr, "shardkv-server: %s (see --help)\n", err);
		return 2;
	}
	if (a.help) {
		fputs(kv_server_usage, stdout);
		return 0;
	}
	kv_log_set_level(a.level);
	signal(SIGPIPE, SIG_IGN);
	signal(SIGXFSZ, SIG_IGN);

	if (kv_server_create(&a.cfg, &s, err, sizeof(err)) != KV_OK)
		return 1;
	if (kv_server_start(s) != KV_OK) {
		kv_server_destroy(s);
		return 1;
	}
	for (;;) {
		int sig = wait_signal(&set, 500);
		if (sig == 0 && kv_server_gone(s, err, sizeof(err))) {
			/* Removed or left: no restart can bring this node back. */
			fprintf(stderr, "shardkv-server: node is gone from the cluster: %s\n", err);
			kv_server_stop(s);
			kv_server_destroy(s);
			return 4;
		}
		if (sig == 0)
			continue;
		/* SIGTERM leaves the cluster gracefully (drains); SIGINT only
		 * stops the process, keeping the node's ranges for a restart. */
		KV_INFO(COMP, "signal received", "sig=%s", sig == SIGTERM ? "TERM" : "INT");
		if (sig == SIGTERM) {
			kv_server_leave_result lr =
			    kv_server_leave(s, a.cfg.leave_timeout_ms, second_signal, &set);
			if (lr == KV_LEAVE_CUT_ASKING)
				KV_WARN(COMP, "second signal, stopping without leaving", NULL);
			else if (lr == KV_LEAVE_CUT_DRAINING)
				KV_WARN(COMP, "second signal, stopping without draining", NULL);
		}
		break;
	}
	rv = kv_server_stop(s);
	kv_server_destroy(s);
	return rv == KV_OK ? 0 : 1;
}
