/*
 * batch_vs_single.c - what batching buys against a live cluster: writes and
 * reads the same keys one call per key (put/get) and then in batches
 * (mput/mget of K keys, split per server and sent concurrently by the
 * library), and prints keys per second for each.
 *
 * Usage: shardkv-batch-bench [-c CONTROLLERS] [--keys N] [--batch K] [--value-size B]
 */
#include <shardkv.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double
now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void
key_of(char *buf, size_t n, size_t i)
{
	snprintf(buf, n, "batchbench:%09zu", i);
}

static int
fail(const char *what, int rv)
{
	fprintf(stderr, "shardkv-batch-bench: %s: %s (%s)\n", what, shardkv_strerror(rv),
	        shardkv_errmsg());
	return 1;
}

int
main(int argc, char **argv)
{
	const char *ctl = getenv("SHARDKV_CONTROLLER");
	size_t nkeys = 20000, batch = 100, vsize = 100;
	shardkv_client *c;
	char(*keys)[32];
	shardkv_bytes *kb, *vb;
	char *val;
	double t;
	int rv;

	for (int i = 1; i < argc; i++) {
		if ((strcmp(argv[i], "-c") == 0 || strcmp(argv[i], "--controller") == 0) &&
		    i + 1 < argc)
			ctl = argv[++i];
		else if (strcmp(argv[i], "--keys") == 0 && i + 1 < argc)
			nkeys = strtoul(argv[++i], NULL, 10);
		else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc)
			batch = strtoul(argv[++i], NULL, 10);
		else if (strcmp(argv[i], "--value-size") == 0 && i + 1 < argc)
			vsize = strtoul(argv[++i], NULL, 10);
		else {
			fprintf(stderr, "usage: shardkv-batch-bench [-c CONTROLLERS] [--keys N] "
			                "[--batch K] [--value-size B]\n");
			return 2;
		}
	}
	if (nkeys == 0 || batch == 0 || vsize > (1u << 20)) {
		fprintf(stderr, "shardkv-batch-bench: keys and batch must be positive, "
		                "value-size at most 1 MiB\n");
		return 2;
	}
	if (ctl == NULL)
		ctl = "tcp://127.0.0.1:7000";
	keys = calloc(nkeys, sizeof(*keys));
	kb = calloc(nkeys, sizeof(*kb));
	vb = calloc(nkeys, sizeof(*vb));
	val = malloc(vsize ? vsize : 1);
	if (keys == NULL || kb == NULL || vb == NULL || val == NULL)
		return 1;
	memset(val, 'v', vsize);
	for (size_t i = 0; i < nkeys; i++) {
		key_of(keys[i], sizeof(keys[i]), i);
		kb[i].data = keys[i];
		kb[i].len = strlen(keys[i]);
		vb[i].data = val;
		vb[i].len = vsize;
	}
	if ((rv = shardkv_open(ctl, NULL, &c)) != 0)
		return fail("open", rv);
	printf("# %zu keys, %zu-byte values, batch %zu, controller %s\n", nkeys, vsize, batch, ctl);

	t = now_s();
	for (size_t i = 0; i < nkeys; i++)
		if ((rv = shardkv_put(c, kb[i].data, kb[i].len, val, vsize)) != 0)
			return fail("put", rv);
	printf("put   %10.0f keys/s\n", (double)nkeys / (now_s() - t));

	t = now_s();
	for (size_t i = 0; i < nkeys; i += batch) {
		size_t n = nkeys - i < batch ? nkeys - i : batch;
		shardkv_mput_result *r = NULL;
		if ((rv = shardkv_mput(c, n, kb + i, n, vb + i, &r)) != 0)
			return fail("mput", rv);
		shardkv_mput_result_free(r);
	}
	printf("mput  %10.0f keys/s\n", (double)nkeys / (now_s() - t));

	t = now_s();
	for (size_t i = 0; i < nkeys; i++) {
		shardkv_buf v;
		if ((rv = shardkv_get(c, kb[i].data, kb[i].len, &v)) != 0)
			return fail("get", rv);
		shardkv_free(v.data);
	}
	printf("get   %10.0f keys/s\n", (double)nkeys / (now_s() - t));

	t = now_s();
	for (size_t i = 0; i < nkeys; i += batch) {
		size_t n = nkeys - i < batch ? nkeys - i : batch;
		shardkv_mget_result *r = NULL;
		if ((rv = shardkv_mget(c, n, kb + i, &r)) != 0)
			return fail("mget", rv);
		shardkv_mget_result_free(r);
	}
	printf("mget  %10.0f keys/s\n", (double)nkeys / (now_s() - t));

	shardkv_close(c);
	free(val);
	free(vb);
	free(kb);
	free(keys);
	return 0;
}
