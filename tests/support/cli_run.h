/*
 * cli_run.h - runs the shardkv CLI inside the test process (kv_cli_main of
 * client/cli/cli.h) with its stdout and stderr captured in memory, for the
 * CLI's unit tests and the client tests against a cluster.
 */
#ifndef KV_TESTS_SUPPORT_CLI_RUN_H
#define KV_TESTS_SUPPORT_CLI_RUN_H

#include <stddef.h>

/* What one run printed and returned. Free with kv_cli_run_free(). */
typedef struct {
	int rc;      /* exit code */
	char *out;   /* stdout, NUL-terminated (owned) */
	size_t nout; /* its length */
	char *err;   /* stderr, NUL-terminated (owned) */
	size_t nerr; /* its length */
	int level;   /* the log level the CLI had set when it returned (enum
	              * kv_log_level); the process's level is restored after */
} kv_cli_run_result;

/* Runs kv_cli_main(argc, argv) with both streams captured into *r. Returns
 * 0, or -1 (r zeroed) when the capture cannot be set up. */
int kv_cli_run(int argc, const char *const *argv, kv_cli_run_result *r);

/* Frees what kv_cli_run captured. Accepts a zeroed result. */
void kv_cli_run_free(kv_cli_run_result *r);

#endif
