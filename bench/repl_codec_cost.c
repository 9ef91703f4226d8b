/*
 * repl_codec_cost.c - what a replication batch costs to encode and decode,
 * per record, with one ReplRecord message a record and with the records
 * packed in one field (Replicate.packed_records, doc/protocol.md
 * "Replication"). The primary encodes every batch once per backup and each
 * backup decodes it, so this is paid twice per write at R=3.
 *
 * Usage: shardkv-repl-codec-cost [--records N] [--payload BYTES] [--iters I]
 * (defaults 40 records, 150 bytes, 20000 batches: the batches and records
 * of the three-node pipelined bench, bench/README.md).
 */
#include "common/err.h"
#include "common/key.h"
#include "proto/data_codec.h"
#include "proto/repl_codec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Seconds on the monotonic clock. */
static double
now_s(void)
{
	return (double)kv_now_ns() * 1e-9;
}

static int
arg_num(int argc, char **argv, int *i, long lo, long hi, long *out)
{
	char *end;
	long v;

	if (*i + 1 >= argc) {
		fprintf(stderr, "shardkv-repl-codec-cost: %s needs a number\n", argv[*i]);
		return -1;
	}
	v = strtol(argv[++*i], &end, 10);
	if (*end != '\0' || v < lo || v > hi) {
		fprintf(stderr, "shardkv-repl-codec-cost: %s wants %ld..%ld\n", argv[*i - 1], lo,
		        hi);
		return -1;
	}
	*out = v;
	return 0;
}

/* Encodes and decodes iters batches of r; prints ns per record each way. */
static int
run(kv_repl_msg *r, long iters, const char *name)
{
	nng_msg *m = NULL;
	double t0 = now_s(), t1, t2;
	size_t len = 0;

	for (long i = 0; i < iters; i++) {
		if (kv_repl_encode(r, 9, 1, (kv_bytes){NULL, 0}, &m) != KV_OK)
			return -1;
		len = nng_msg_len(m);
		if (i + 1 < iters)
			nng_msg_free(m);
	}
	t1 = now_s();
	for (long i = 0; i < iters; i++) {
		kv_req q;
		const char *why = NULL;
		if (kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &q, &why) != KV_OK ||
		    q.repl.nrecs != r->nrecs) {
			fprintf(stderr, "shardkv-repl-codec-cost: decode failed: %s\n",
			        why ? why : "?");
			kv_data_req_fini(&q);
			nng_msg_free(m);
			return -1;
		}
		kv_data_req_fini(&q);
	}
	t2 = now_s();
	nng_msg_free(m);
	printf("%-8s encode %6.1f ns/record  decode %6.1f ns/record  %zu bytes a batch\n", name,
	       (t1 - t0) * 1e9 / (double)iters / (double)r->nrecs,
	       (t2 - t1) * 1e9 / (double)iters / (double)r->nrecs, len);
	return 0;
}

int
main(int argc, char **argv)
{
	long nrec = 40, plen = 150, iters = 20000;
	kv_repl_rec *recs;
	uint8_t *payload;
	int rv = 0;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--records") == 0) {
			if (arg_num(argc, argv, &i, 1, 100000, &nrec) != 0)
				return 2;
		} else if (strcmp(argv[i], "--payload") == 0) {
			if (arg_num(argc, argv, &i, 1, 1 << 20, &plen) != 0)
				return 2;
		} else if (strcmp(argv[i], "--iters") == 0) {
			if (arg_num(argc, argv, &i, 1, 100000000, &iters) != 0)
				return 2;
		} else {
			fprintf(stderr,
			        "usage: shardkv-repl-codec-cost [--records N] [--payload BYTES] "
			        "[--iters I]\n");
			return 2;
		}
	}
	recs = calloc((size_t)nrec, sizeof(*recs));
	payload = malloc((size_t)plen);
	if (recs == NULL || payload == NULL) {
		fprintf(stderr, "shardkv-repl-codec-cost: out of memory\n");
		free(recs);
		free(payload);
		return 1;
	}
	memset(payload, 'x', (size_t)plen);
	for (long i = 0; i < nrec; i++)
		recs[i] = (kv_repl_rec){.leader_epoch = 3,
		                        .lsn = 1000 + (uint64_t)i,
		                        .start = {(const uint8_t *)"key:", 4},
		                        .payload = {payload, (size_t)plen}};
	kv_repl_msg r = {
	    .from_node = 1, .stream_id = 77, .seq = 5, .nrecs = (size_t)nrec, .recs = recs};
	if (run(&r, iters, "records") != 0)
		rv = 1;
	r.packed = true;
	if (rv == 0 && run(&r, iters, "packed") != 0)
		rv = 1;
	free(recs);
	free(payload);
	return rv;
}
