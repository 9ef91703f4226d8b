/*
 * cli.h - the `shardkv` command line (doc/contract.md §5), as a library so that tests
 * can drive argument parsing, output formatting and exit codes in-process.
 *
 * The CLI uses only the public API of libshardkv (client/include/shardkv.h)
 * and a few common/ utilities: no protobuf, no nng, no library internals.
 */
#ifndef KV_CLIENT_CLI_CLI_H
#define KV_CLIENT_CLI_CLI_H

#include "client/cli/cliutil.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The parsed command line. Strings point into argv. */
typedef struct {
	const char *controller;      /* -c/--controller; NULL: $SHARDKV_CONTROLLER or the default */
	bool json;                   /* --json */
	uint32_t timeout_ms;         /* --timeout; 0 when not given */
	const char *auth_token_file; /* --auth-token-file */
	const char *tls_cert;        /* --tls-cert */
	const char *tls_key;         /* --tls-key */
	const char *tls_ca;          /* --tls-ca */
	bool help;                   /* --help / -h */
	const char *cmd;             /* the command; NULL with --help alone */
	int nargs;                   /* positional arguments after the command */
	const char **args;           /* the positional arguments, in order (array owned) */
	bool wait;                   /* --wait */
	bool no_rebalance;           /* --no-rebalance */
	bool accept_data_loss;       /* --accept-data-loss */
	const char *prefix;          /* --prefix */
	long long limit;             /* --limit; -1 when not given */
	uint32_t rate_mb_s;          /* --rate */
	bool has_rate;               /* --rate was given */
} kv_cli_args;

/*
 * Parses argv (argv[0] is the program name) into *a. Returns 0, or
 * KV_CLI_USAGE with a one-line reason in err. The caller frees with
 * kv_cli_args_fini() in both cases.
 */
int kv_cli_parse(int argc, char **argv, kv_cli_args *a, char *err, size_t errlen);

/* Frees what kv_cli_parse allocated. */
void kv_cli_args_fini(kv_cli_args *a);

/* Runs the command line: prints results to out and errors to err. Returns
 * the process exit code. */
int kv_cli_main(int argc, char **argv, FILE *out, FILE *err);

#endif
