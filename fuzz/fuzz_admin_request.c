/*
 * fuzz_admin_request.c - the controller's request decoder: the bytes of an
 * AdminRequest from the CLI, a client or a shard server (register,
 * heartbeat with range statistics, migration reports, watch) through
 * kv_admin_req_decode.
 */
#include "common/err.h"
#include "proto/admin_codec.h"
#include "fuzz/fuzz_util.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kv_admin_req r;
	char msg[256];
	int rv;

	msg[0] = 0;
	rv = kv_admin_req_decode(data, size, &r, msg, sizeof(msg));
	if (rv != KV_OK) {
		FZ_CHECK(msg[0] != 0);
		FZ_CHECK(r.priv == NULL && r.ranges == NULL);
	} else {
		FZ_CHECK(r.priv != NULL);
		FZ_CHECK(r.nranges == 0 || r.ranges != NULL);
		for (size_t i = 0; i < r.nranges; i++) {
			const kv_admin_range_stat *s = &r.ranges[i];
			FZ_CHECK(s->nsplit == 0 || s->split != NULL);
			/* The controller reads every byte it was given. */
			fz_touch(s->start.p, s->start.len);
			fz_touch(s->end.p, s->end.len);
			for (size_t j = 0; j < s->nsplit; j++)
				fz_touch(s->split[j].p, s->split[j].len);
		}
		if (r.address)
			fz_touch(r.address, strlen(r.address));
		if (r.cluster_id)
			fz_touch(r.cluster_id, strlen(r.cluster_id));
		if (r.error)
			fz_touch(r.error, strlen(r.error));
		fz_touch(r.start.p, r.start.len);
		fz_touch(r.end.p, r.end.len);
	}
	/* The controller finishes every request this way, decoded or not. */
	kv_admin_req_fini(&r);
	return 0;
}
