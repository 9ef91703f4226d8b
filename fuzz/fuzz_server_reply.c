/*
 * fuzz_server_reply.c - what a shard server decodes from the replies it
 * gets: an AdminResponse from the controller (kv_sc_adm_decode: register,
 * watch with configuration history, heartbeats) and a Response from a peer
 * server to a transfer message (kv_sc_ack_decode). Both run on every input.
 */
#include "common/config.h"
#include "common/err.h"
#include "fuzz/fuzz_util.h"
#include "shardserver/server_codec.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kv_adm_resp r;
	kv_sc_ack ack;
	int rv;

	rv = kv_sc_adm_decode(data, size, &r);
	if (rv == KV_OK) {
		FZ_CHECK(memchr(r.error, 0, sizeof(r.error)) != NULL);
		FZ_CHECK(r.nconfigs == 0 || r.configs != NULL);
		for (size_t i = 0; i < r.nconfigs; i++)
			FZ_CHECK(kv_config_validate(r.configs[i]) == KV_OK);
		kv_sc_adm_resp_fini(&r);
	} else {
		FZ_CHECK(r.nconfigs == 0 && r.configs == NULL);
	}
	(void)kv_sc_ack_decode(data, size, &ack);
	return 0;
}
