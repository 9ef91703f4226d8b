/*
 * fuzz_admin_response.c - the decoder of every AdminResponse a controller
 * sends (kv_admin_resp_decode, proto/admin_codec.h): to a shard server
 * (register, watch with configuration history, heartbeats, migration
 * reports) and to a client or the CLI (configuration, status report, leader
 * redirect). A decoded response must hold only validated configurations and
 * bounded arrays, and taking its configurations must leave nothing behind.
 * The newest configuration is then used as the client uses it: keys are
 * split per node (kvc_split_keys) and scans are planned over it
 * (kvc_scan_plan), with their results checked against kv_config_route.
 */
#include "client/client_int.h"
#include "common/config.h"
#include "common/err.h"
#include "fuzz/fuzz_util.h"
#include "proto/admin_codec.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Keys to route: fixed ones and every range and migration boundary. */
static size_t
probe_keys(const kv_config *c, kv_bytes *keys, size_t cap)
{
	static const char *fixed[] = {"\x01", "a", "m", "user:1", "z", "\xff\xff"};
	size_t n = 0;

	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]) && n < cap; i++)
		keys[n++] = (kv_bytes){(const uint8_t *)fixed[i], strlen(fixed[i])};
	for (size_t i = 0; i < c->nranges && n + 2 <= cap; i++) {
		if (c->ranges[i].start.len)
			keys[n++] = (kv_bytes){c->ranges[i].start.data, c->ranges[i].start.len};
		if (c->ranges[i].end.len)
			keys[n++] = (kv_bytes){c->ranges[i].end.data, c->ranges[i].end.len};
	}
	for (size_t i = 0; i < c->nmigs && n + 2 <= cap; i++) {
		if (c->migs[i].start.len)
			keys[n++] = (kv_bytes){c->migs[i].start.data, c->migs[i].start.len};
		if (c->migs[i].end.len)
			keys[n++] = (kv_bytes){c->migs[i].end.data, c->migs[i].end.len};
	}
	return n;
}

static void
check_split(const kv_config *c, const kv_bytes *keys, size_t n)
{
	kvc_part *parts = NULL;
	size_t nparts = 0, total = 0;

	FZ_CHECK(kvc_split_keys(c, n, keys, &parts, &nparts) == KV_OK);
	for (size_t p = 0; p < nparts; p++) {
		FZ_CHECK(p == 0 || parts[p - 1].node < parts[p].node);
		for (size_t i = 0; i < parts[p].n; i++) {
			size_t k = parts[p].idx[i];
			FZ_CHECK(k < n && (i == 0 || parts[p].idx[i - 1] < k));
			FZ_CHECK(kv_config_route(c, keys[k].p, keys[k].len) == parts[p].node);
		}
		total += parts[p].n;
	}
	FZ_CHECK(total == n);
	kvc_parts_free(parts, nparts);
}

/* A plan must cut [start, end) into adjacent non-empty spans in key order,
 * each served by the node its first key routes to. */
static void
check_plan(const kv_config *c, kv_bytes start, kv_bytes end)
{
	kvc_span *sp = NULL;
	size_t ns = 0;
	int rv = kvc_scan_plan(c, start, end, &sp, &ns);

	if (kv_range_is_empty(start.p, start.len, end.p, end.len)) {
		FZ_CHECK(rv == KV_EINVAL);
		return;
	}
	if (c->nranges == 0) {
		FZ_CHECK(rv == KV_EUNAVAIL);
		return;
	}
	FZ_CHECK(rv == KV_OK && ns > 0);
	for (size_t i = 0; i < ns; i++) {
		const kvc_span *s = &sp[i];
		if (i == 0)
			FZ_CHECK(kv_key_cmp(s->start.data, s->start.len, start.p, start.len) == 0);
		else
			FZ_CHECK(kv_key_cmp(s->start.data, s->start.len, sp[i - 1].end.data,
			                    sp[i - 1].end.len) == 0);
		FZ_CHECK(!kv_range_is_empty(s->start.data, s->start.len, s->end.data, s->end.len));
		FZ_CHECK(i + 1 == ns || s->end.len != 0);
		FZ_CHECK(s->node == kv_config_route(c, s->start.data, s->start.len));
	}
	if (ns > 0)
		FZ_CHECK(kv_key_cmp(sp[ns - 1].end.data, sp[ns - 1].end.len, end.p, end.len) == 0);
	kvc_spans_free(sp, ns);
}

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

/* What the client does with the newest configuration of an answer. */
static void
route_like_the_client(const kv_config *c)
{
	kv_bytes keys[32];
	size_t n = probe_keys(c, keys, sizeof(keys) / sizeof(keys[0]));

	check_split(c, keys, n);
	check_plan(c, (kv_bytes){NULL, 0}, (kv_bytes){NULL, 0});
	for (size_t i = 0; i + 1 < n; i++)
		check_plan(c, keys[i], keys[i + 1]);
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
	if (r.config || r.nconfigs)
		route_like_the_client(r.config ? r.config : r.configs[r.nconfigs - 1]);
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
