/*
 * fuzz_admin_response.c - the decoder of every AdminResponse a controller
 * sends (kv_admin_resp_decode): to a shard server (register, watch with
 * configuration history, heartbeats, migration reports) and to a client or
 * the CLI (configuration, status report, leader redirect). A decoded
 * response must hold only validated configurations and bounded arrays, and
 * taking its configurations must leave nothing behind.
 */
#include "common/config.h"
#include "common/err.h"
#include "fuzz/fuzz_util.h"
#include "proto/admin_codec.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
check_report(const kv_admin_report *rep)
{
	FZ_CHECK(rep->nnodes == 0 || rep->nodes != NULL);
	FZ_CHECK(rep->nmigs == 0 || rep->migs != NULL);
	FZ_CHECK(rep->nreplicas == 0 || rep->replicas != NULL);
	for (size_t i = 0; i < rep->nnodes; i++) {
		const kv_admin_node_stat *n = &rep->nodes[i];
		FZ_CHECK(n->nranges == 0 || n->ranges != NULL);
		for (size_t j = 0; j < n->nranges; j++) {
			const kv_admin_range_stat *s = &n->ranges[j];
			FZ_CHECK(s->start.len <= KV_HARD_MAX_KEY && s->end.len <= KV_HARD_MAX_KEY);
			fz_touch(s->start.p, s->start.len);
			fz_touch(s->end.p, s->end.len);
			for (size_t k = 0; k < s->nsplit; k++)
				fz_touch(s->split[k].p, s->split[k].len);
		}
	}
	for (size_t i = 0; i < rep->nmigs; i++) {
		FZ_CHECK(rep->migs[i].phase >= KV_MIG_PENDING &&
		         rep->migs[i].phase <= KV_MIG_FAILED);
		fz_touch(rep->migs[i].start.data, rep->migs[i].start.len);
	}
	for (size_t i = 0; i < rep->nreplicas; i++)
		if (rep->replicas[i].address)
			fz_touch(rep->replicas[i].address, strlen(rep->replicas[i].address));
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kv_admin_resp r;
	kv_config **cfgs;
	size_t n, want;
	int rv;

	rv = kv_admin_resp_decode(data, size, &r);
	if (rv != KV_OK) {
		FZ_CHECK(rv == KV_EPROTO || rv == KV_ENOMEM);
		FZ_CHECK(r.priv == NULL && r.config == NULL && r.nconfigs == 0);
		return 0;
	}
	FZ_CHECK(r.error != NULL);
	fz_touch(r.error, strlen(r.error));
	FZ_CHECK(!r.not_leader || r.err == KV_EUNAVAIL);
	if (r.leader_address)
		fz_touch(r.leader_address, strlen(r.leader_address));
	FZ_CHECK(r.nmig_ids == 0 || r.mig_ids != NULL);
	FZ_CHECK(r.nconfigs == 0 || r.configs != NULL);
	if (r.config)
		FZ_CHECK(kv_config_validate(r.config) == KV_OK);
	for (size_t i = 0; i < r.nconfigs; i++)
		FZ_CHECK(kv_config_validate(r.configs[i]) == KV_OK);
	if (r.report)
		check_report(r.report);
	/* What the server does with a watch or register answer. */
	want = r.nconfigs ? r.nconfigs : r.config != NULL;
	n = kv_admin_resp_take_configs(&r, &cfgs);
	FZ_CHECK(n == want || (n == 0 && want == 1)); /* 0: out of memory */
	FZ_CHECK(r.config == NULL && r.nconfigs == 0);
	for (size_t i = 0; i < n; i++)
		kv_config_free(cfgs[i]);
	free(cfgs);
	kv_admin_resp_fini(&r);
	return 0;
}
