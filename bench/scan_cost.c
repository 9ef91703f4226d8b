/*
 * scan_cost.c - shows what a bounded scan costs as the store grows: loads N
 * keys (4-byte big-endian integers, 4-byte values), then times scans of
 * `limit` entries from random start keys, for several N and limits. The
 * cost per scan should follow the limit (the size of the answer) and stay
 * flat as N grows; that is the point of an ordered index.
 *
 * Usage: shardkv-scan-cost [--partitions P] [--scans S] N... (default 1M 10M)
 */
#include "bench/bench_util.h"
#include "common/err.h"
#include "shardserver/store/store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int
count_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen)
{
	(void)key;
	(void)klen;
	(void)val;
	(void)vlen;
	(*(uint64_t *)arg)++;
	return 0;
}

int
main(int argc, char **argv)
{
	static const size_t limits[] = {10, 100, 1000};
	const char *defaults[] = {"1M", "10M"};
	const char **sizes = defaults;
	unsigned partitions = 16;
	uint64_t scans = 20000;
	int nsizes = 2, i = 1;

	for (; i < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
		if (i + 1 >= argc) {
			fprintf(stderr, "shardkv-scan-cost: %s needs a value\n", argv[i]);
			return 2;
		}
		if (strcmp(argv[i], "--partitions") == 0)
			partitions = (unsigned)atoi(argv[i + 1]);
		else if (strcmp(argv[i], "--scans") == 0)
			scans = bench_parse_count(argv[i + 1]);
		else {
			fprintf(stderr,
			        "usage: shardkv-scan-cost [--partitions P] [--scans S] N...\n");
			return 2;
		}
	}
	if (i < argc) {
		sizes = (const char **)(argv + i);
		nsizes = argc - i;
	}
	printf("# scan cost: striped store, %u partitions, %llu scans per point\n", partitions,
	       (unsigned long long)scans);
	printf("keys limit ns_per_scan ns_per_entry\n");
	for (int si = 0; si < nsizes; si++) {
		uint64_t n = bench_parse_count(sizes[si]), rng = 42;
		kv_store_opts o;
		kv_store *s;

		kv_store_opts_init(&o);
		o.partitions = partitions;
		if (n == 0 || n > 0xffffffffull || kv_store_create(&o, &s) != KV_OK) {
			fprintf(stderr, "shardkv-scan-cost: bad size %s\n", sizes[si]);
			return 2;
		}
		for (uint64_t k = 0; k < n; k++) {
			uint8_t key[4] = {(uint8_t)(k >> 24), (uint8_t)(k >> 16), (uint8_t)(k >> 8),
			                  (uint8_t)k};
			if (kv_store_put(s, key, 4, key, 4) != KV_OK)
				return 1;
		}
		for (size_t li = 0; li < sizeof(limits) / sizeof(limits[0]); li++) {
			uint64_t seen = 0, t0 = kv_now_ns(), dt;
			for (uint64_t j = 0; j < scans; j++) {
				uint64_t k = bench_next_rand(&rng) % n;
				uint8_t key[4] = {(uint8_t)(k >> 24), (uint8_t)(k >> 16),
				                  (uint8_t)(k >> 8), (uint8_t)k};
				if (kv_store_scan(s, key, 4, NULL, 0, limits[li], true, count_cb,
				                  &seen, NULL) != KV_OK)
					return 1;
			}
			dt = kv_now_ns() - t0;
			printf("%llu %zu %.0f %.1f\n", (unsigned long long)n, limits[li],
			       (double)dt / (double)scans, seen ? (double)dt / (double)seen : 0.0);
		}
		kv_store_destroy(s);
	}
	return 0;
}
