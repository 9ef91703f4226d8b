/*
 * main.c - shardkv-server: parses flags into an immutable kv_server_cfg
 * (kv_server_parse_args) and calls kv_server_run (server.h).
 *
 * DESIGN. Nothing here but the exit codes: every usage error exits 2 with
 * one line naming the problem; a server that cannot start exits 1 (the
 * reason was logged by kv_server_run); a clean stop exits 0.
 */
#include "common/err.h"
#include "common/log.h"
#include "shardserver/server.h"

#include <stdio.h>

int
main(int argc, char **argv)
{
	kv_server_args a;
	char err[600];

	if (kv_server_parse_args(argc, argv, &a, err, sizeof(err)) != KV_OK) {
		fprintf(stderr, "shardkv-server: %s (see --help)\n", err);
		return 2;
	}
	if (a.help) {
		fputs(kv_server_usage, stdout);
		return 0;
	}
	kv_log_set_level(a.level);
	return kv_server_run(&a.cfg) == 0 ? 0 : 1;
}
