/*
 * range_delete_cost.c - what deleting a moved range costs the store: loads
 * N keys of the range ["", "key:") (8 decimal digits, "00000000".., as
 * bench/migration-under-load.sh moves) and as many keys after it
 * ("key:" and 12 digits), 100-byte values, inserted in key order or
 * shuffled, then times kv_store_range_delete over the range in steps of S
 * keys until it is empty, as a source deletes a range it moved
 * (shardserver/migrate_out.c). One fresh store a round; prints each
 * round's time and the median.
 *
 * Usage: shardkv-range-delete-cost [--partitions P] [--rounds R]
 *                                  [--step S] [--random] [N]   (default 1M)
 */
#include "bench/bench_util.h"
#include "common/err.h"
#include "common/key.h"
#include "shardserver/store/store.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static int
usage(void)
{
	fprintf(stderr, "usage: shardkv-range-delete-cost [--partitions P] [--rounds R] "
	                "[--step S] [--random] [N]\n");
	return 2;
}

int
main(int argc, char **argv)
{
	unsigned partitions = 16, rounds = 5;
	uint64_t n = 1000000, step = 1000, *order = NULL, *ns;
	bool shuffle = false;
	uint8_t val[100];
	int i = 1;

	for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
		if (strcmp(argv[i], "--random") == 0) {
			shuffle = true;
			continue;
		}
		if (i + 1 >= argc)
			return usage();
		if (strcmp(argv[i], "--partitions") == 0)
			partitions = (unsigned)bench_parse_count(argv[i + 1]);
		else if (strcmp(argv[i], "--rounds") == 0)
			rounds = (unsigned)bench_parse_count(argv[i + 1]);
		else if (strcmp(argv[i], "--step") == 0)
			step = bench_parse_count(argv[i + 1]);
		else
			return usage();
		i++;
	}
	if (i < argc)
		n = bench_parse_count(argv[i++]);
	if (i < argc || n == 0 || n > 100000000u || step == 0 || rounds == 0 || rounds > 100)
		return usage();
	if ((order = malloc(n * sizeof(*order))) == NULL ||
	    (ns = malloc(rounds * sizeof(*ns))) == NULL)
		return 1;
	memset(val, 'v', sizeof(val));
	printf("# range delete: %llu keys of [\"\", \"key:\") and as many after it, %s order, "
	       "striped store, %u partitions, steps of %llu keys\n",
	       (unsigned long long)n, shuffle ? "random" : "key", partitions,
	       (unsigned long long)step);
	printf("round ms ns_per_key steps\n");
	for (unsigned r = 0; r < rounds; r++) {
		uint64_t rng = 42 + r, deleted = 0, steps = 0, t0;
		kv_store_opts o;
		kv_store *s;
		char key[24];
		int rv;

		kv_store_opts_init(&o);
		o.partitions = partitions;
		if (kv_store_create(&o, &s) != KV_OK) {
			fprintf(stderr, "shardkv-range-delete-cost: cannot create the store\n");
			return 1;
		}
		for (uint64_t k = 0; k < n; k++)
			order[k] = k;
		for (uint64_t k = n - 1; shuffle && k > 0; k--) {
			uint64_t j = bench_next_rand(&rng) % (k + 1), t = order[k];
			order[k] = order[j];
			order[j] = t;
		}
		for (uint64_t k = 0; k < n; k++) {
			snprintf(key, sizeof(key), "%08llu", (unsigned long long)order[k]);
			if (kv_store_put(s, key, 8, val, sizeof(val)) != KV_OK)
				return 1;
			snprintf(key, sizeof(key), "key:%012llu", (unsigned long long)order[k]);
			if (kv_store_put(s, key, 16, val, sizeof(val)) != KV_OK)
				return 1;
		}
		t0 = kv_now_ns();
		do {
			rv = kv_store_range_delete(s, "", 0, "key:", 4, step, &deleted);
			steps++;
		} while (rv == KV_EBUSY);
		ns[r] = kv_now_ns() - t0;
		kv_store_stats st;
		kv_store_get_stats(s, &st);
		if (rv != KV_OK || deleted != n || st.keys != n) {
			fprintf(stderr,
			        "shardkv-range-delete-cost: deleted %llu of %llu (%s), %llu left\n",
			        (unsigned long long)deleted, (unsigned long long)n, kv_errname(rv),
			        (unsigned long long)st.keys);
			return 1;
		}
		printf("%u %.1f %.1f %llu\n", r + 1, (double)ns[r] / 1e6, (double)ns[r] / (double)n,
		       (unsigned long long)steps);
		kv_store_destroy(s);
	}
	qsort(ns, rounds, sizeof(*ns), cmp_u64);
	printf("median %.1f ms, %.1f ns a key\n", (double)ns[rounds / 2] / 1e6,
	       (double)ns[rounds / 2] / (double)n);
	free(order);
	free(ns);
	return 0;
}
