/*
 * fuzz_server_args.c - the shardkv-server command line
 * (kv_server_parse_args) without starting anything: sizes with suffixes,
 * modes, the --controller list, the TLS combination.
 *
 * Input: the arguments after the program name, separated by NUL bytes (at
 * most 64).
 *
 * Checks: a refusal has a one-line reason; an accepted command line (not
 * --help) has a --listen, a --data-dir and 1 to KV_SERVER_MAX_CTL non-empty
 * controller addresses without commas, every number within the bounds its
 * flag states, and TLS files that are complete exactly when the addresses
 * are tls+tcp://; parsing the same arguments again gives the same answer.
 */
#include "common/err.h"
#include "common/key.h"
#include "common/tls.h"
#include "fuzz/fuzz_util.h"
#include "shardserver/server.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf1, *buf2, *argv1[FZ_MAX_ARGS + 2], *argv2[FZ_MAX_ARGS + 2];
	char err1[600] = "", err2[600] = "";
	kv_server_args a, b;
	int argc, rv1, rv2;

	argc = fz_split_args(data, size, "shardkv-server", &buf1, argv1);
	FZ_CHECK(fz_split_args(data, size, "shardkv-server", &buf2, argv2) == argc);
	rv1 = kv_server_parse_args(argc, argv1, &a, err1, sizeof(err1));
	rv2 = kv_server_parse_args(argc, argv2, &b, err2, sizeof(err2));
	FZ_CHECK(rv1 == rv2 && strcmp(err1, err2) == 0);
	FZ_CHECK(rv1 == KV_OK || rv1 == KV_EINVAL);
	if (rv1 != KV_OK) {
		FZ_CHECK(err1[0] != 0 && memchr(err1, 0, sizeof(err1)) != NULL);
	} else if (!a.help) {
		const kv_server_cfg *c = &a.cfg;
		bool tls = kv_tls_files_any(&c->tls);
		FZ_CHECK(c->listen != NULL && c->data_dir != NULL);
		FZ_CHECK(c->nctl >= 1 && c->nctl <= KV_SERVER_MAX_CTL && c->ctl == a.ctl);
		FZ_CHECK(b.cfg.nctl == c->nctl && b.cfg.fsync == c->fsync);
		for (size_t i = 0; i < c->nctl; i++) {
			FZ_CHECK(c->ctl[i][0] != 0 && strchr(c->ctl[i], ',') == NULL);
			FZ_CHECK(strcmp(c->ctl[i], b.cfg.ctl[i]) == 0);
			FZ_CHECK(tls == kv_tls_url(c->ctl[i]));
		}
		FZ_CHECK(tls == kv_tls_url(c->listen));
		FZ_CHECK(!tls || (c->tls.cert && c->tls.key && c->tls.ca));
		FZ_CHECK(c->threads <= 4096);
		FZ_CHECK(c->max_key <= KV_HARD_MAX_KEY && c->max_value <= KV_HARD_MAX_VALUE);
		FZ_CHECK(c->snapshot_bytes == 0 || c->snapshot_bytes >= 4096);
		FZ_CHECK(c->max_memory == 0 || c->max_memory >= (1u << 20));
		FZ_CHECK(c->max_batch <= (1u << 24));
		FZ_CHECK(c->max_message == 0 ||
		         (c->max_message >= (1u << 20) && c->max_message <= (1u << 30)));
		FZ_CHECK(c->max_connections <= (1u << 20));
		fz_touch(c->data_dir, strlen(c->data_dir));
	}
	free(buf1);
	free(buf2);
	return 0;
}
