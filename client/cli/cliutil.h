/*
 * cliutil.h - exit codes and JSON escaping shared by the command line
 * (cli.c) and `shardkv bench` (bench.c). A leaf: it calls nothing else of
 * the CLI.
 */
#ifndef KV_CLIENT_CLI_CLIUTIL_H
#define KV_CLIENT_CLI_CLIUTIL_H

#include <stddef.h>

/* Exit codes of doc/contract.md §5. */
enum {
	KV_CLI_OK = 0,
	KV_CLI_NOTFOUND = 1,
	KV_CLI_USAGE = 2,
	KV_CLI_UNAVAIL = 3,
	KV_CLI_REJECTED = 4,
	KV_CLI_INTERNAL = 5,
};

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
