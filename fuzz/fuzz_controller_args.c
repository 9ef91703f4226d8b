/*
 * fuzz_controller_args.c - the shardkv-controller command line
 * (kv_controller_parse_args) without starting anything.
 *
 * Input: the arguments after the program name, separated by NUL bytes (at
 * most 64).
 *
 * Checks: a refusal has a one-line reason; an accepted command line (not
 * --help) has a --listen and a --data-dir, and its TLS files are complete
 * (cert, key and CA) exactly when --listen is a tls+tcp:// URL, and so
 * are the --peers URLs; --id indexes --peers, --raft-peers has as many
 * entries and the split lists live in the returned struct; parsing the
 * same arguments again (getopt state is reset) gives the same answer.
 */
#include "common/err.h"
#include "common/tls.h"
#include "controller/controller.h"
#include "fuzz/fuzz_util.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf1, *buf2, *argv1[FZ_MAX_ARGS + 2], *argv2[FZ_MAX_ARGS + 2];
	char err1[512] = "", err2[512] = "";
	kv_controller_args a, b;
	int argc, rv1, rv2;

	argc = fz_split_args(data, size, "shardkv-controller", &buf1, argv1);
	FZ_CHECK(fz_split_args(data, size, "shardkv-controller", &buf2, argv2) == argc);
	rv1 = kv_controller_parse_args(argc, argv1, &a, err1, sizeof(err1));
	rv2 = kv_controller_parse_args(argc, argv2, &b, err2, sizeof(err2));
	FZ_CHECK(rv1 == rv2 && strcmp(err1, err2) == 0);
	FZ_CHECK(rv1 == KV_OK || rv1 == KV_EINVAL);
	if (rv1 != KV_OK) {
		FZ_CHECK(err1[0] != 0 && memchr(err1, 0, sizeof(err1)) != NULL);
	} else if (!a.help) {
		FZ_CHECK(b.help == a.help && b.level == a.level);
		FZ_CHECK(a.cfg.listen != NULL && a.cfg.listen[0] != 0);
		FZ_CHECK(a.cfg.data_dir != NULL && a.cfg.data_dir[0] != 0);
		FZ_CHECK(strcmp(a.cfg.listen, b.cfg.listen) == 0);
		bool tls = kv_tls_files_any(&a.cfg.tls);
		FZ_CHECK(tls == kv_tls_url(a.cfg.listen));
		FZ_CHECK(!tls || (a.cfg.tls.cert && a.cfg.tls.key && a.cfg.tls.ca));
		fz_touch(a.cfg.data_dir, strlen(a.cfg.data_dir));
		if (a.cfg.metrics)
			fz_touch(a.cfg.metrics, strlen(a.cfg.metrics));
		if (a.cfg.auth_token_file)
			FZ_CHECK(a.cfg.auth_token_file[0] != 0);
		/* Replication: --id indexes --peers; --raft-peers matches it; the
		 * lists point into the struct they were returned in. */
		FZ_CHECK((a.cfg.id == 0) == (a.cfg.npeers == 0));
		FZ_CHECK(a.cfg.id <= a.cfg.npeers && a.cfg.npeers <= KV_CONTROLLER_MAX_PEERS);
		FZ_CHECK(a.cfg.npeers == b.cfg.npeers && a.cfg.id == b.cfg.id);
		FZ_CHECK((a.cfg.peers != NULL) == (a.cfg.npeers != 0));
		FZ_CHECK(a.cfg.raft_peers == NULL || a.cfg.npeers != 0);
		for (size_t i = 0; i < a.cfg.npeers; i++) {
			FZ_CHECK(a.cfg.peers[i] >= a.peers_buf &&
			         a.cfg.peers[i] < a.peers_buf + sizeof(a.peers_buf));
			FZ_CHECK(a.cfg.peers[i][0] != 0 && strchr(a.cfg.peers[i], ',') == NULL);
			FZ_CHECK(strcmp(a.cfg.peers[i], b.cfg.peers[i]) == 0);
			FZ_CHECK(kv_tls_url(a.cfg.peers[i]) == tls);
			if (a.cfg.raft_peers != NULL) {
				FZ_CHECK(a.cfg.raft_peers[i] >= a.raft_buf &&
				         a.cfg.raft_peers[i] < a.raft_buf + sizeof(a.raft_buf));
				FZ_CHECK(a.cfg.raft_peers[i][0] != 0);
			}
		}
	}
	free(buf1);
	free(buf2);
	return 0;
}
