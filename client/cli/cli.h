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
	bool dry_run;                /* --dry-run (move, rebalance) */
	bool no_rebalance;           /* --no-rebalance */
	bool accept_data_loss;       /* --accept-data-loss */
	const char *prefix;          /* --prefix */
	long long limit;             /* --limit; -1 when not given */
	uint32_t rate_mb_s;          /* --rate */
	bool has_rate;               /* --rate was given */
	bool raw;                    /* --raw: get/del print the value's bytes, no newline */
	bool version;                /* --version */
	bool verbose;                /* -v/--verbose: the library's log lines on stderr */
	bool no_command;             /* parsing failed only for want of a command */
	uint64_t ttl_ms;             /* --ttl MS (put, mput); 0 when not given */
	bool if_absent;              /* --if-absent (put) */
	const char *if_equal;        /* --if-equal OLD (put, del); NULL when not given */
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
 * the process exit code. (The program opens the interactive prompt,
 * kv_cli_repl, instead when there is no command and a terminal.) */
int kv_cli_main(int argc, char **argv, FILE *out, FILE *err);

/*
 * Splits one line of the interactive prompt into words the way a shell
 * would for simple cases: blanks separate words, '...' keeps everything
 * literally, "..." keeps everything but \" and \\, and a backslash outside
 * quotes escapes the next character. words[0] is set to "shardkv", so the
 * result is an argv for kv_cli_main. Returns the word count (>= 1), or -1
 * with a reason in err (unterminated quote, too many words, out of
 * memory). The caller frees *argv and *buf with free() when >= 1.
 */
int kv_cli_split_line(const char *line, char ***argv, char **buf, char *err, size_t errlen);

/*
 * The interactive prompt (client/cli/repl.c): reads lines with editing and
 * history, and runs each as `shardkv OPTIONS LINE` (OPTIONS: argv's global
 * options) through kv_cli_main. `quit`, `exit` or end of input leave it.
 * Returns 0.
 */
int kv_cli_repl(int argc, char **argv, FILE *out, FILE *err);

/*
 * Returns the command closest to `word` by edit distance when it is close
 * enough to be a likely typo (at most 2 edits and less than half the
 * word), else NULL.
 */
const char *kv_cli_suggest(const char *word);

#endif
