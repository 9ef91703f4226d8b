/*
 * cli.h - the `shardkv` command line (SPEC §5), as a library so that tests
 * can drive argument parsing, output formatting and exit codes in-process.
 *
 * The CLI uses only the public API of libshardkv (client/include/shardkv.h):
 * no protobuf, no nng.
 */
#ifndef KV_CLIENT_CLI_H
#define KV_CLIENT_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes of SPEC §5. */
enum {
	KV_CLI_OK = 0,
	KV_CLI_NOTFOUND = 1,
	KV_CLI_USAGE = 2,
	KV_CLI_UNAVAIL = 3,
	KV_CLI_REJECTED = 4,
	KV_CLI_INTERNAL = 5,
};

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

/* Returns the exit code for a SHARDKV_E* code (0 for 0). */
int kv_cli_exit_code(int err);

/*
 * Writes `n` bytes as the body of a JSON string (no quotes): printable ASCII
 * as is except `"` and `\`, which are escaped, every other byte as \u00XX,
 * so each byte maps to one code point. Writes at most cap-1 characters and a
 * NUL into out (when cap > 0); returns the length of the full escape.
 */
size_t kv_cli_json_escape(const void *p, size_t n, char *out, size_t cap);

#endif
