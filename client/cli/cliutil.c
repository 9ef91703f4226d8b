/*
 * cliutil.c - what the command handlers (cli.c) and the load generator
 * (bench.c) share: the mapping of library error codes to exit codes and the
 * byte-per-code-point JSON escape. Neither file calls the other for these,
 * so cli.c calls into bench.c and bench.c calls neither back.
 */
#include "client/cli/cliutil.h"
#include "client/include/shardkv.h"

#include <stdint.h>

int
kv_cli_exit_code(int err)
{
	switch (err) {
	case SHARDKV_OK:
		return KV_CLI_OK;
	case SHARDKV_ENOTFOUND:
	case SHARDKV_EMISMATCH: /* a condition not met */
		return KV_CLI_NOTFOUND;
	case SHARDKV_EINVAL:
	case SHARDKV_EEXISTS:
		return KV_CLI_USAGE;
	case SHARDKV_ETIMEDOUT:
	case SHARDKV_EUNAVAIL:
	case SHARDKV_ECLOSED:
	case SHARDKV_EBUSY:
	case SHARDKV_EMOVING:
	case SHARDKV_EWRONGOWNER:
	case SHARDKV_ESTALE:
		return KV_CLI_UNAVAIL;
	case SHARDKV_ETOOBIG:
	case SHARDKV_ELIMIT:
	case SHARDKV_EAUTH:
	case SHARDKV_EPERM:
	case SHARDKV_ENOMEM: /* a server's --max-memory */
	case SHARDKV_ENOSPC: /* a server's disk is full */
		return KV_CLI_REJECTED;
	default:
		return KV_CLI_INTERNAL;
	}
}

size_t
kv_cli_json_escape(const void *p, size_t n, char *out, size_t cap)
{
	static const char hex[] = "0123456789abcdef";
	const uint8_t *s = p;
	size_t len = 0;

	for (size_t i = 0; i < n; i++) {
		char tmp[7];
		size_t k = 0;
		uint8_t b = s[i];
		if (b == '"' || b == '\\') {
			tmp[k++] = '\\';
			tmp[k++] = (char)b;
		} else if (b >= 0x20 && b < 0x7f) {
			tmp[k++] = (char)b;
		} else {
			tmp[k++] = '\\';
			tmp[k++] = 'u';
			tmp[k++] = '0';
			tmp[k++] = '0';
			tmp[k++] = hex[b >> 4];
			tmp[k++] = hex[b & 15];
		}
		for (size_t j = 0; j < k; j++, len++)
			if (cap && len < cap - 1)
				out[len] = tmp[j];
	}
	if (cap)
		out[len < cap - 1 ? len : cap - 1] = 0;
	return len;
}
