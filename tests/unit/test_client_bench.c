/*
 * test_client_bench.c - `shardkv bench` (doc/contract.md §7).
 *
 * Built twice from this file. Without KV_BENCH_CLUSTER (test_client_bench):
 * the latency histogram against a sorted-array reference, --mix and --dist
 * parsing, usage errors (exit 2, one line, before any network use) and the
 * shape of the JSON report, all without a cluster. With KV_BENCH_CLUSTER
 * (test_client_bench_cluster): short runs against real daemons (one
 * controller and two servers on free loopback ports, started and stopped like
 * test_client_cluster.c does), checking the JSON file they write.
 *
 * A tiny JSON parser below reads the reports back, so the checks are on
 * parsed values, not on substrings.
 */
#include "client/cli/bench.h"
#include "client/cli/cli.h"
#include "client/cli/hdr.h"
#include "client/include/shardkv.h"
#include "common/key.h"
#include "tests/support/cli_run.h"
#include "tests/support/testutil.h"
#include "tests/support/two_node_cluster.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#define ARGC(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---------------------------------------------------------------------------
 * A minimal JSON reader: objects, arrays, strings (escapes kept raw),
 * numbers, true/false/null. Enough to check report shapes.
 * ------------------------------------------------------------------------- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jnode {
	jtype type;          /* kind */
	double num;          /* J_NUM, J_BOOL (0/1) */
	char *str;           /* J_STR (raw, escapes not decoded) */
	char *key;           /* member name inside an object */
	size_t n;            /* J_ARR, J_OBJ: children */
	struct jnode **kids; /* children */
} jnode;

static void
jfree(jnode *j)
{
	if (j == NULL)
		return;
	for (size_t i = 0; i < j->n; i++)
		jfree(j->kids[i]);
	free(j->kids);
	free(j->str);
	free(j->key);
	free(j);
}

static void
jskip(const char **p)
{
	while (**p == ' ' || **p == '\n' || **p == '\t' || **p == '\r')
		(*p)++;
}

static char *
jstring(const char **p)
{
	const char *s = ++*p;
	while (**p && **p != '"') {
		if (**p == '\\' && (*p)[1])
			(*p)++;
		(*p)++;
	}
	if (**p != '"')
		return NULL;
	char *r = strndup(s, (size_t)(*p - s));
	(*p)++;
	return r;
}

static jnode *jvalue(const char **p);

static bool
jadd(jnode *parent, jnode *kid)
{
	jnode **k = realloc(parent->kids, (parent->n + 1) * sizeof(*k));
	if (k == NULL)
		return false;
	parent->kids = k;
	k[parent->n++] = kid;
	return true;
}

static jnode *
jvalue(const char **p)
{
	jnode *j = calloc(1, sizeof(*j));
	jskip(p);
	if (**p == '{' || **p == '[') {
		bool obj = **p == '{';
		char close = obj ? '}' : ']';
		j->type = obj ? J_OBJ : J_ARR;
		(*p)++;
		jskip(p);
		if (**p == close) {
			(*p)++;
			return j;
		}
		for (;;) {
			char *key = NULL;
			jskip(p);
			if (obj) {
				if (**p != '"' || (key = jstring(p)) == NULL)
					goto bad;
				jskip(p);
				if (**p != ':') {
					free(key);
					goto bad;
				}
				(*p)++;
			}
			jnode *kid = jvalue(p);
			if (kid == NULL) {
				free(key);
				goto bad;
			}
			kid->key = key;
			if (!jadd(j, kid)) {
				jfree(kid);
				goto bad;
			}
			jskip(p);
			if (**p == ',') {
				(*p)++;
				continue;
			}
			if (**p == close) {
				(*p)++;
				return j;
			}
			goto bad;
		}
	}
	if (**p == '"') {
		j->type = J_STR;
		if ((j->str = jstring(p)) == NULL)
			goto bad;
		return j;
	}
	if (strncmp(*p, "true", 4) == 0 || strncmp(*p, "false", 5) == 0) {
		j->type = J_BOOL;
		j->num = **p == 't';
		*p += **p == 't' ? 4 : 5;
		return j;
	}
	if (strncmp(*p, "null", 4) == 0) {
		j->type = J_NULL;
		*p += 4;
		return j;
	}
	char *e;
	j->type = J_NUM;
	j->num = strtod(*p, &e);
	if (e == *p || !isfinite(j->num))
		goto bad;
	*p = e;
	return j;
bad:
	jfree(j);
	return NULL;
}

/* Parses a whole document (trailing whitespace allowed); NULL when invalid. */
static jnode *
jparse(const char *s)
{
	const char *p = s;
	jnode *j = jvalue(&p);
	if (j == NULL)
		return NULL;
	jskip(&p);
	if (*p != 0) {
		jfree(j);
		return NULL;
	}
	return j;
}

/* Returns the member at a dotted path ("latency_us.p99"), or NULL. */
static const jnode *
jget(const jnode *j, const char *path)
{
	char buf[128];
	snprintf(buf, sizeof(buf), "%s", path);
	for (char *save = NULL, *tok = strtok_r(buf, ".", &save); tok && j;
	     tok = strtok_r(NULL, ".", &save)) {
		const jnode *found = NULL;
		if (j->type != J_OBJ)
			return NULL;
		for (size_t i = 0; i < j->n && !found; i++)
			if (strcmp(j->kids[i]->key, tok) == 0)
				found = j->kids[i];
		j = found;
	}
	return j;
}

/* Asserts a number at path and returns it. */
static double
jnum(const jnode *j, const char *path)
{
	const jnode *n = jget(j, path);
	if (n == NULL || n->type != J_NUM)
		fail_msg("JSON lacks number %s", path);
	return n->num;
}

static const jnode *
jtyped(const jnode *j, const char *path, jtype t)
{
	const jnode *n = jget(j, path);
	if (n == NULL || n->type != t)
		fail_msg("JSON lacks %s of type %d", path, (int)t);
	return n;
}

/* ---------------------------------------------------------------------------
 * Running the CLI in-process
 * ------------------------------------------------------------------------- */

/* Output of one in-process run (cli_run.h). */
typedef kv_cli_run_result run_result;

static run_result
run(int argc, const char **argv)
{
	run_result r;
	assert_int_equal(kv_cli_run(argc, argv, &r), 0);
	return r;
}

#ifndef KV_BENCH_CLUSTER

/* ---------------------------------------------------------------------------
 * Histogram
 * ------------------------------------------------------------------------- */

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static uint64_t
rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* Checks every interesting percentile of h against the sorted values. */
static void
check_percentiles(const kv_hdr *h, const uint64_t *sorted, size_t n, unsigned sub_bits)
{
	static const double ps[] = {0, 0.1, 1, 10, 25, 50, 75, 90, 99, 99.9, 99.99, 100};
	double tol = ldexp(1.0, -(int)(sub_bits - 1));

	for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) {
		double r = ps[i] / 100.0 * (double)n;
		size_t rank = (size_t)ceil(r);
		rank = rank < 1 ? 1 : rank > n ? n : rank;
		uint64_t want = sorted[rank - 1], got = kv_hdr_percentile(h, ps[i]);
		if (got < want || (double)got > (double)want * (1 + tol) + 1)
			fail_msg("p%g: got %" PRIu64 ", reference %" PRIu64 " (tolerance %g)",
			         ps[i], got, want, tol);
	}
	assert_int_equal(kv_hdr_min(h), sorted[0]);
	assert_int_equal(kv_hdr_max(h), sorted[n - 1]);
	assert_int_equal(kv_hdr_count(h), n);
}

static void
histogram_percentiles_match_a_sorted_reference(void **state)
{
	const size_t n = 200000;
	uint64_t *v = malloc(n * sizeof(*v)), seed = 0x9e3779b97f4a7c15ull;
	(void)state;

	assert_non_null(v);
	/* Three shapes: uniform over six decades, a latency-like log-normal-ish
	 * mix with a far tail, and small exact values. */
	for (int shape = 0; shape < 3; shape++) {
		for (unsigned sub_bits = 4; sub_bits <= 10; sub_bits += 6) {
			kv_hdr *h = kv_hdr_create(sub_bits, 37);
			assert_non_null(h);
			for (size_t i = 0; i < n; i++) {
				uint64_t x = rnd(&seed);
				if (shape == 0)
					v[i] = x % 1000000000ull;
				else if (shape == 1)
					v[i] = (uint64_t)(50000.0 *
					                  exp((double)(x % 10000) / 2000.0)) +
					       (x % 1000 == 0 ? 5000000000ull : 0);
				else
					v[i] = x % 100;
				kv_hdr_record(h, v[i]);
			}
			qsort(v, n, sizeof(*v), cmp_u64);
			check_percentiles(h, v, n, sub_bits);
			kv_hdr_destroy(h);
		}
	}
	free(v);
}

static void
histogram_merge_equals_recording_into_one(void **state)
{
	kv_hdr *a = kv_hdr_create(10, 37), *b = kv_hdr_create(10, 37), *all = kv_hdr_create(10, 37);
	kv_hdr *other = kv_hdr_create(8, 37);
	uint64_t seed = 42;
	(void)state;

	for (int i = 0; i < 50000; i++) {
		uint64_t x = rnd(&seed) % 100000000;
		kv_hdr_record(i % 2 ? a : b, x);
		kv_hdr_record(all, x);
	}
	assert_true(kv_hdr_merge(a, b));
	assert_false(kv_hdr_merge(a, other)); /* different shapes do not mix */
	for (double p = 0; p <= 100; p += 0.5)
		assert_int_equal(kv_hdr_percentile(a, p), kv_hdr_percentile(all, p));
	assert_int_equal(kv_hdr_count(a), 50000);
	assert_true(fabs(kv_hdr_mean(a) - kv_hdr_mean(all)) < 1e-6 * kv_hdr_mean(all));
	kv_hdr_reset(a);
	assert_int_equal(kv_hdr_count(a), 0);
	assert_int_equal(kv_hdr_percentile(a, 99), 0);
	assert_int_equal(kv_hdr_max(a), 0);
	kv_hdr_record(a, 7);
	assert_int_equal(kv_hdr_percentile(a, 50), 7);
	kv_hdr_destroy(a);
	kv_hdr_destroy(b);
	kv_hdr_destroy(all);
	kv_hdr_destroy(other);
}

static int
cmp_bucket(const void *a, const void *b)
{
	double x = ((const kv_bench_bucket *)a)->us, y = ((const kv_bench_bucket *)b)->us;
	return x < y ? -1 : x > y;
}

/* The bench's per-second buckets: pooled over many seconds they give the
 * percentiles of all the values, within 1.2% above (bench/README.md's
 * migration figures pool the seconds of a move). */
static void
histogram_buckets_pool_to_the_percentiles_of_all_values(void **state)
{
	const size_t secs = 20, per = 3000, n = secs * per;
	uint64_t *v = malloc(n * sizeof(*v)), seed = 7;
	kv_bench_bucket *pool = NULL;
	size_t npool = 0;
	(void)state;

	assert_non_null(v);
	for (size_t s = 0; s < secs; s++) {
		kv_hdr *h = kv_hdr_create(10, 37);
		kv_bench_bucket *b;
		size_t nb;
		assert_non_null(h);
		for (size_t i = 0; i < per; i++) {
			uint64_t x = rnd(&seed);
			/* 30 us .. 30 ms, with a slow tail in every fifth second */
			v[s * per + i] =
			    30000 + x % 300000 + (s % 5 == 0 && x % 50 == 0 ? x % 30000000 : 0);
			kv_hdr_record(h, v[s * per + i]);
		}
		assert_int_equal(kv_bench_buckets(h, &b, &nb), 0);
		uint64_t sum = 0;
		for (size_t k = 0; k < nb; k++) {
			sum += b[k].n;
			assert_true(b[k].n > 0);
			if (k > 0)
				assert_true(b[k].us > b[k - 1].us);
		}
		assert_int_equal(sum, per);
		assert_true(b[nb - 1].us * 1000.0 <= (double)kv_hdr_max(h) + 0.5);
		pool = realloc(pool, (npool + nb) * sizeof(*pool));
		assert_non_null(pool);
		memcpy(pool + npool, b, nb * sizeof(*b));
		npool += nb;
		free(b);
		kv_hdr_destroy(h);
	}
	qsort(v, n, sizeof(*v), cmp_u64);
	qsort(pool, npool, sizeof(*pool), cmp_bucket);
	static const double ps[] = {50, 90, 99, 99.9, 100};
	for (size_t i = 0; i < sizeof(ps) / sizeof(ps[0]); i++) {
		size_t rank = (size_t)ceil(ps[i] / 100.0 * (double)n);
		double want = (double)v[rank - 1] / 1000.0, got = 0;
		/* the smallest bound with at least rank calls at or below it */
		uint64_t cnt = 0;
		for (size_t k = 0; k < npool && got == 0; k++)
			if ((cnt += pool[k].n) >= rank)
				got = pool[k].us;
		if (got < want - 0.001 || got > want * 1.012 + 0.001)
			fail_msg("p%g pooled from the buckets: %.1f us, exact %.1f us", ps[i], got,
			         want);
	}
	free(pool);
	free(v);
}

static void
histogram_clamps_values_above_its_range(void **state)
{
	kv_hdr *h = kv_hdr_create(10, 20);
	(void)state;

	assert_null(kv_hdr_create(1, 20));
	assert_null(kv_hdr_create(10, 64));
	kv_hdr_record(h, UINT64_MAX);
	kv_hdr_record_n(h, 5, 3);
	assert_int_equal(kv_hdr_count(h), 4);
	assert_int_equal(kv_hdr_clamped(h), 1);
	assert_int_equal(kv_hdr_max(h), (1u << 20) - 1);
	assert_int_equal(kv_hdr_percentile(h, 50), 5);
	assert_int_equal(kv_hdr_percentile(h, 100), (1u << 20) - 1);
	kv_hdr_destroy(h);
}

/* ---------------------------------------------------------------------------
 * Parsing
 * ------------------------------------------------------------------------- */

static void
mix_parses_weights_and_rejects_bad_specs(void **state)
{
	unsigned w[KV_BENCH_NOPS];
	char err[256];
	(void)state;

	assert_int_equal(kv_bench_parse_mix("get:90,put:10", w, err, sizeof(err)), 0);
	assert_int_equal(w[KV_BENCH_GET], 90);
	assert_int_equal(w[KV_BENCH_PUT], 10);
	assert_int_equal(w[KV_BENCH_SCAN], 0);
	assert_int_equal(kv_bench_parse_mix("scan:1,mput:2,mget:3,append:4,del:5,put:0,get:7", w,
	                                    err, sizeof(err)),
	                 0);
	assert_int_equal(w[KV_BENCH_SCAN], 1);
	assert_int_equal(w[KV_BENCH_MPUT], 2);
	assert_int_equal(w[KV_BENCH_MGET], 3);
	assert_int_equal(w[KV_BENCH_APPEND], 4);
	assert_int_equal(w[KV_BENCH_DEL], 5);
	assert_int_equal(w[KV_BENCH_GET], 7);

	static const struct {
		const char *spec, *needle;
	} bad[] = {
	    {"", "--mix needs"},          {"get", "not OP:WEIGHT"},
	    {"get:x", "weight of get"},   {"frob:1", "unknown op"},
	    {"get:1,get:2", "twice"},     {"get:0,put:0", "add up to 0"},
	    {"get:1,", "trailing comma"}, {"get:-1", "weight of get"},
	    {"get:1,,put:1", "not OP"},   {"get:99999999", "weight"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		w[0] = 12345;
		assert_int_equal(kv_bench_parse_mix(bad[i].spec, w, err, sizeof(err)),
		                 KV_CLI_USAGE);
		if (strstr(err, bad[i].needle) == NULL)
			fail_msg("--mix '%s': '%s' lacks '%s'", bad[i].spec, err, bad[i].needle);
		assert_int_equal(w[0], 12345); /* untouched on error */
	}
}

static void
dist_parses_uniform_and_zipf(void **state)
{
	kv_bench_dist d;
	char err[256];
	(void)state;

	assert_int_equal(kv_bench_parse_dist("uniform", &d, err, sizeof(err)), 0);
	assert_false(d.zipf);
	assert_int_equal(kv_bench_parse_dist("zipf", &d, err, sizeof(err)), 0);
	assert_true(d.zipf);
	assert_true(fabs(d.theta - 0.99) < 1e-12);
	assert_int_equal(kv_bench_parse_dist("zipf:0.5", &d, err, sizeof(err)), 0);
	assert_true(fabs(d.theta - 0.5) < 1e-12);
	const char *bad[] = {"zipf:1", "zipf:0", "zipf:1.5", "zipf:abc",
	                     "zipf:",  "normal", "",         "zipfx"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(kv_bench_parse_dist(bad[i], &d, err, sizeof(err)), KV_CLI_USAGE);
}

static void
parse_fills_defaults_and_reads_every_option(void **state)
{
	kv_bench_params p;
	char err[256];
	(void)state;

	assert_int_equal(kv_bench_parse(0, NULL, &p, err, sizeof(err)), 0);
	assert_int_equal(p.threads, 4);
	assert_int_equal(p.connections, 4);
	assert_int_equal(p.mix[KV_BENCH_GET], 90);
	assert_int_equal(p.mix[KV_BENCH_PUT], 10);
	assert_int_equal(p.batch, 1);
	assert_true(p.duration_s == 10);
	assert_false(p.dist.zipf);
	assert_string_equal(p.key_prefix, "key:");
	assert_null(p.slow_path);
	assert_int_equal(p.slow_us, 1000);

	const char *argv[] = {"--slow-log",
	                      "/tmp/x.tsv",
	                      "--slow-us",
	                      "250",
	                      "--key-prefix",
	                      "hot:",
	                      "--threads",
	                      "8",
	                      "--connections=2",
	                      "--keys",
	                      "5000",
	                      "--key-size",
	                      "12",
	                      "--value-size",
	                      "0",
	                      "--mix",
	                      "mget:1,scan:1",
	                      "--batch",
	                      "16",
	                      "--ops",
	                      "777",
	                      "--load",
	                      "--rate",
	                      "2500.5",
	                      "--dist",
	                      "zipf:0.8",
	                      "--seed",
	                      "9",
	                      "--out",
	                      "/tmp/x.json",
	                      "--plot",
	                      "/tmp/x.svg",
	                      "--scan-limit",
	                      "3",
	                      "--one-range"};
	assert_false(p.one_range);
	assert_int_equal(kv_bench_parse(ARGC(argv), argv, &p, err, sizeof(err)), 0);
	assert_int_equal(p.threads, 8);
	assert_int_equal(p.connections, 2);
	assert_int_equal(p.keys, 5000);
	assert_int_equal(p.key_size, 12);
	assert_int_equal(p.value_size, 0);
	assert_int_equal(p.mix[KV_BENCH_GET], 0);
	assert_int_equal(p.mix[KV_BENCH_MGET], 1);
	assert_int_equal(p.batch, 16);
	assert_int_equal(p.ops, 777);
	assert_true(p.duration_s == 0);
	assert_true(p.load);
	assert_true(p.rate == 2500.5);
	assert_true(p.dist.zipf);
	assert_int_equal(p.seed, 9);
	assert_string_equal(p.out_path, "/tmp/x.json");
	assert_string_equal(p.plot_path, "/tmp/x.svg");
	assert_string_equal(p.slow_path, "/tmp/x.tsv");
	assert_int_equal(p.slow_us, 250);
	assert_int_equal(p.scan_limit, 3);
	assert_string_equal(p.key_prefix, "hot:");
	assert_true(p.key_prefix_set);
	assert_true(p.one_range);
	const char *bad[] = {"--one-range=yes"};
	assert_int_equal(kv_bench_parse(ARGC(bad), bad, &p, err, sizeof(err)), KV_CLI_USAGE);
	assert_non_null(strstr(err, "--one-range takes no value"));
}

/* Counts the keys of p (built here as the bench builds them) that sort
 * before start: the index the bench must find. */
static uint64_t
keys_before(const kv_bench_params *p, bool with_prefix, const char *start, size_t slen)
{
	uint64_t n = 0;
	char k[64];

	for (uint64_t i = 0; i < p->keys; i++) {
		if (with_prefix)
			snprintf(k, sizeof(k), "%s%0*llu", p->key_prefix,
			         (int)(p->key_size - strlen(p->key_prefix)), (unsigned long long)i);
		else
			snprintf(k, sizeof(k), "%0*llu", (int)p->key_size, (unsigned long long)i);
		size_t l = slen < p->key_size ? slen : p->key_size;
		int c = memcmp(k, start, l);
		n += c < 0 || (c == 0 && p->key_size < slen);
	}
	return n;
}

/* --one-range draws a call's keys among the indices [first(a), first(b)) of
 * the range [a, b): those must be exactly the keys that sort in it, for
 * bounds of any length, with the prefix and without it. */
static void
one_range_bounds_hold_exactly_the_keys_of_a_range(void **state)
{
	kv_bench_params p;
	char err[256], start[32];
	uint64_t seed = 42;
	(void)state;

	const char *with[] = {"--keys", "1000"};
	assert_int_equal(kv_bench_parse(ARGC(with), with, &p, err, sizeof(err)), 0);
	assert_int_equal(kv_bench_first_index_at(&p, "", 0), 0);
	assert_int_equal(kv_bench_first_index_at(&p, "key:000000000500", 16), 500);
	assert_int_equal(kv_bench_first_index_at(&p, "key:0000000005", 14), 500);
	assert_int_equal(kv_bench_first_index_at(&p, "key:000000000500\0", 17), 501);
	assert_int_equal(kv_bench_first_index_at(&p, "key:1", 5), 1000);
	assert_int_equal(kv_bench_first_index_at(&p, "a", 1), 0);
	assert_int_equal(kv_bench_first_index_at(&p, "z", 1), 1000);
	for (int i = 0; i < 300; i++) {
		/* "key:" and 0..14 characters, mostly digits. */
		size_t len = 4 + rnd(&seed) % 15;
		memcpy(start, "key:", 4);
		for (size_t j = 4; j < len; j++) {
			uint64_t x = rnd(&seed) % 12;
			start[j] = x < 10 ? (char)('0' + (j < 13 ? 0 : x)) : x == 10 ? '/' : ':';
		}
		uint64_t want = keys_before(&p, true, start, len);
		if (kv_bench_first_index_at(&p, start, len) != want)
			fail_msg("'%.*s': got %llu, want %llu", (int)len, start,
			         (unsigned long long)kv_bench_first_index_at(&p, start, len),
			         (unsigned long long)want);
	}
	/* --key-size 3 leaves no room for "key:": keys are "000".."999". */
	const char *bare[] = {"--keys", "1000", "--key-size", "3"};
	assert_int_equal(kv_bench_parse(ARGC(bare), bare, &p, err, sizeof(err)), 0);
	for (int i = 0; i < 200; i++) {
		size_t len = 1 + rnd(&seed) % 4;
		for (size_t j = 0; j < len; j++)
			start[j] = (char)('0' + rnd(&seed) % 10);
		uint64_t want = keys_before(&p, false, start, len);
		if (kv_bench_first_index_at(&p, start, len) != want)
			fail_msg("'%.*s': got %llu, want %llu", (int)len, start,
			         (unsigned long long)kv_bench_first_index_at(&p, start, len),
			         (unsigned long long)want);
	}
}

/* Asserts exit 2, nothing on stdout, one line on stderr naming `needle`. */
static void
assert_bench_usage_error(int argc, const char **argv, const char *needle)
{
	run_result r = run(argc, argv);
	if (r.rc != KV_CLI_USAGE || r.nout != 0 || r.nerr == 0 || r.err[r.nerr - 1] != '\n' ||
	    memchr(r.err, '\n', r.nerr - 1) != NULL || strstr(r.err, needle) == NULL)
		fail_msg("%s %s: rc %d out '%s' err '%s' (want 2 and '%s')", argv[1], argv[2], r.rc,
		         r.out, r.err, needle);
	kv_cli_run_free(&r);
}

static void
bench_usage_errors_exit_2_with_one_line(void **state)
{
	(void)state;
	/* An unreachable controller: a usage error must be reported before any
	 * network use, so these return at once. */
#define BENCH_USAGE(needle, ...)                                                                   \
	do {                                                                                       \
		const char *a_[] = {"shardkv", "-c", "tcp://127.0.0.1:1", "bench", __VA_ARGS__};   \
		assert_bench_usage_error(ARGC(a_), a_, needle);                                    \
	} while (0)
	BENCH_USAGE("--threads needs", "--threads", "0");
	BENCH_USAGE("--threads needs", "--threads", "many");
	BENCH_USAGE("needs a value", "--threads");
	BENCH_USAGE("unknown op", "--mix", "get:50,frob:50");
	BENCH_USAGE("add up to 0", "--mix", "get:0");
	BENCH_USAGE("zipf", "--dist", "zipf:2");
	BENCH_USAGE("--dist must be", "--dist", "gaussian");
	BENCH_USAGE("not both", "--duration", "5", "--ops", "10");
	BENCH_USAGE("--slow-us needs --slow-log", "--slow-us", "500");
	BENCH_USAGE("--slow-us needs a number", "--slow-log", "f.tsv", "--slow-us", "soon");
	BENCH_USAGE("--slow-log needs a file name", "--slow-log", "");
	BENCH_USAGE("--connections 8 > --threads 4", "--threads", "4", "--connections", "8");
	BENCH_USAGE("unknown option", "--frobnicate");
	BENCH_USAGE("too small", "--keys", "100000", "--key-size", "3");
	BENCH_USAGE("too small for --key-prefix", "--key-prefix", "hotter:", "--keys", "100000",
	            "--key-size", "10");
	BENCH_USAGE("--key-prefix needs at most", "--key-prefix",
	            "0123456789012345678901234567890123456789012345678901234567890123456789");
	BENCH_USAGE("--rate needs", "--rate", "0");
	BENCH_USAGE("--batch needs", "--batch", "10001");
	BENCH_USAGE("--value-size needs", "--value-size", "2000000");
	BENCH_USAGE("unexpected argument", "extra");
	BENCH_USAGE("only with --load", "--duration", "0");
	BENCH_USAGE("--load takes no value", "--load=yes");
	BENCH_USAGE("cannot write", "--out", "/nonexistent-dir/x.json");
#undef BENCH_USAGE
}

static void
bench_help_lists_the_options(void **state)
{
	const char *argv[] = {"shardkv", "bench", "--help"};
	(void)state;
	run_result r = run(ARGC(argv), argv);
	assert_int_equal(r.rc, 0);
	assert_non_null(strstr(r.out, "--connections C"));
	assert_non_null(strstr(r.out, "--rate OPS"));
	assert_non_null(strstr(r.out, "--plot FILE.svg"));
	kv_cli_run_free(&r);
}

/* ---------------------------------------------------------------------------
 * Reports
 * ------------------------------------------------------------------------- */

/* A result as a run would leave it: 3 s, gets and puts, two nodes, one event. */
static void
fake_result(kv_bench_result *r, kv_bench_params *p)
{
	const char *argv[] = {"--threads", "2", "--mix", "get:80,put:20", "--duration", "3"};
	char err[256];

	assert_int_equal(kv_bench_parse(ARGC(argv), argv, p, err, sizeof(err)), 0);
	p->controller = "tcp://127.0.0.1:7000";
	memset(r, 0, sizeof(*r));
	r->params = p;
	snprintf(r->started_at, sizeof(r->started_at), "2026-01-01T00:00:00Z");
	r->elapsed_s = 3.0;
	for (int s = 0; s < 3; s++) {
		kv_bench_tally t = {0};
		for (int i = 0; i < 1000; i++) {
			int op = i % 5 == 0 ? KV_BENCH_PUT : KV_BENCH_GET;
			assert_int_equal(kv_bench_tally_record(&t, op, 100000 + (uint64_t)i * 100,
			                                       1, i % 100 == 0, 0, 0),
			                 0);
			t.node_ops[1 + i % 2]++;
		}
		assert_int_equal(kv_bench_tally_record(&t, KV_BENCH_GET, 5000000000ull, 0, 0, 1,
		                                       SHARDKV_ETIMEDOUT),
		                 0);
		kv_bench_point pt = {.t = s + 1.0,
		                     .dt = 1.0,
		                     .ops = kv_bench_tally_ops(&t),
		                     .errors = kv_bench_tally_errors(&t),
		                     .p50_us = 150,
		                     .p99_us = 199,
		                     .max_us = 5000000,
		                     .epoch = 3};
		pt.op_ops[KV_BENCH_GET] = t.ops[KV_BENCH_GET];
		pt.op_ops[KV_BENCH_PUT] = t.ops[KV_BENCH_PUT];
		assert_int_equal(kv_bench_result_add_point(r, &pt), 0);
		assert_int_equal(kv_bench_tally_merge(&r->total, &t), 0);
		kv_bench_tally_fini(&t);
	}
	kv_bench_event ev = {.t = 1.5, .epoch = 4};
	snprintf(ev.kind, sizeof(ev.kind), "migration_start");
	snprintf(ev.detail, sizeof(ev.detail), "#1 [\"a\", \"\\\"q\") node 1 -> 2");
	assert_int_equal(kv_bench_result_add_event(r, &ev), 0);
	r->nnodes = 2;
	r->nodes[0].id = 1;
	snprintf(r->nodes[0].address, sizeof(r->nodes[0].address), "tcp://127.0.0.1:7101");
	r->nodes[1].id = 2;
	snprintf(r->nodes[1].address, sizeof(r->nodes[1].address), "tcp://127.0.0.1:7102");
}

static void
json_report_has_the_spec_shape(void **state)
{
	kv_bench_params p;
	kv_bench_result r;
	char *buf = NULL;
	size_t len = 0;
	(void)state;

	fake_result(&r, &p);
	FILE *f = open_memstream(&buf, &len);
	kv_bench_write_json(f, &r);
	fclose(f);
	jnode *j = jparse(buf);
	if (j == NULL)
		fail_msg("not JSON: %s", buf);
	assert_int_equal(j->type, J_OBJ);
	assert_true(jnum(j, "ops") == 3000);
	assert_true(jnum(j, "ops_per_sec") == 1000);
	assert_true(jnum(j, "errors") == 3);
	assert_true(jnum(j, "misses") == 30);
	assert_true(jnum(j, "calls") == 3003);
	double p50 = jnum(j, "latency_us.p50"), p99 = jnum(j, "latency_us.p99");
	double p999 = jnum(j, "latency_us.p999"), mx = jnum(j, "latency_us.max");
	assert_true(p50 >= 149 && p50 <= 151);
	assert_true(p50 <= p99 && p99 <= p999 && p999 <= mx);
	assert_true(mx >= 5000000 && mx <= 5000000 * 1.002);
	jnum(j, "latency_us.p90");
	assert_true(jnum(j, "per_op.get.ops_per_sec") == 800);
	assert_true(jnum(j, "per_op.put.ops_per_sec") == 200);
	assert_true(jnum(j, "per_op.get.errors") == 3);
	jnum(j, "per_op.put.latency_us.p99");
	assert_null(jget(j, "per_op.scan"));      /* not in the mix, never called */
	assert_null(jget(j, "latency_first_us")); /* no pipeline was measured */
	assert_true(jnum(j, "errors_by_kind.timed_out") == 3);
	const jnode *nodes = jtyped(j, "per_node", J_ARR);
	assert_int_equal(nodes->n, 2);
	assert_true(jnum(nodes->kids[0], "ops") == 1500);
	assert_true(jnum(nodes->kids[1], "ops_per_sec") == 500);
	assert_true(jnum(j, "params.threads") == 2);
	assert_true(jnum(j, "params.connections") == 2);
	assert_true(jnum(j, "params.mix.get") == 80);
	assert_true(jnum(j, "params.batch") == 1);
	assert_true(jnum(j, "params.duration_s") == 3);
	assert_string_equal(jtyped(j, "params.controller", J_STR)->str, "tcp://127.0.0.1:7000");
	jtyped(j, "machine.hostname", J_STR);
	assert_true(jnum(j, "machine.cpus") >= 1);
	const jnode *series = jtyped(j, "series", J_ARR);
	assert_int_equal(series->n, 3);
	assert_true(jnum(series->kids[2], "t") == 3);
	assert_true(jnum(series->kids[0], "ops_per_sec") == 1000);
	jnum(series->kids[0], "p99_us");
	jnum(series->kids[0], "per_op.get");
	const jnode *events = jtyped(j, "events", J_ARR);
	assert_int_equal(events->n, 1);
	assert_string_equal(jtyped(events->kids[0], "kind", J_STR)->str, "migration_start");
	assert_int_equal(jtyped(j, "load", J_NULL)->type, J_NULL);
	jfree(j);
	free(buf);

	/* The summary names every column the spec asks for. */
	f = open_memstream(&buf, &len);
	kv_bench_write_summary(f, &r);
	fclose(f);
	for (const char *const *w =
	         (const char *const[]){"ops/s", "p50", "p90", "p99", "p99.9", "max", "timed_out 3",
	                               "node 1", "node 2", "migration_start", NULL};
	     *w; w++)
		if (strstr(buf, *w) == NULL)
			fail_msg("summary lacks '%s':\n%s", *w, buf);
	free(buf);

	/* The plot is well-formed enough to hold the series and the event. */
	f = open_memstream(&buf, &len);
	kv_bench_write_svg(f, &r);
	fclose(f);
	assert_non_null(strstr(buf, "<svg"));
	assert_non_null(strstr(buf, "<polyline"));
	assert_non_null(strstr(buf, "migration_start"));
	assert_non_null(strstr(buf, "&quot;q"));
	assert_non_null(strstr(buf, "</svg>\n"));
	free(buf);
	kv_bench_result_fini(&r);
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* --rate: every thread keeps its own steady period, and the threads' calls
 * interleave evenly instead of all falling due at the same instant. */
static void
open_loop_threads_arrive_evenly_spaced(void **state)
{
	(void)state;
	enum { T = 16, N = 50 };
	const struct {
		double rate;
		unsigned per_call;
	} cases[] = {{2000, 1}, {2000, 8}, {400, 1}, {7, 1}};
	static double due[T * N];

	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		double rate = cases[c].rate;
		unsigned k = cases[c].per_call;
		double gap = 1e9 * (double)k / rate; /* between two calls of the run */
		for (unsigned id = 0; id < T; id++) {
			for (unsigned n = 0; n < N; n++) {
				due[id * N + n] = kv_bench_due_ns(rate, k, T, id, n);
				if (n > 0) /* a thread's own period */
					assert_true(fabs(due[id * N + n] - due[id * N + n - 1] -
					                 gap * T) < 1e-6 * gap * T);
			}
		}
		assert_true(kv_bench_due_ns(rate, k, T, 0, 0) == 0);
		qsort(due, T * N, sizeof(due[0]), cmp_double);
		for (size_t i = 1; i < T * N; i++)
			if (fabs(due[i] - due[i - 1] - gap) > 1e-6 * gap)
				fail_msg("rate %g x%u: calls %zu and %zu %.0f ns apart, not %.0f",
				         rate, k, i - 1, i, due[i] - due[i - 1], gap);
	}
	/* One thread: its calls are simply one period apart. */
	assert_true(kv_bench_due_ns(100, 1, 1, 0, 3) == 3e7);
	/* No rate: nothing is scheduled. */
	assert_true(kv_bench_due_ns(0, 1, 4, 2, 5) == 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(histogram_percentiles_match_a_sorted_reference),
	    cmocka_unit_test(open_loop_threads_arrive_evenly_spaced),
	    cmocka_unit_test(histogram_merge_equals_recording_into_one),
	    cmocka_unit_test(histogram_buckets_pool_to_the_percentiles_of_all_values),
	    cmocka_unit_test(histogram_clamps_values_above_its_range),
	    cmocka_unit_test(mix_parses_weights_and_rejects_bad_specs),
	    cmocka_unit_test(dist_parses_uniform_and_zipf),
	    cmocka_unit_test(parse_fills_defaults_and_reads_every_option),
	    cmocka_unit_test(one_range_bounds_hold_exactly_the_keys_of_a_range),
	    cmocka_unit_test(bench_usage_errors_exit_2_with_one_line),
	    cmocka_unit_test(bench_help_lists_the_options),
	    cmocka_unit_test(json_report_has_the_spec_shape),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}

#else /* KV_BENCH_CLUSTER */

/* ---------------------------------------------------------------------------
 * Against real daemons
 * ------------------------------------------------------------------------- */

#ifndef KV_BIN_DIR
#error "KV_BIN_DIR must name the directory of the built binaries"
#endif

static test_cluster tc;

static char *
slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *buf = NULL;
	size_t len = 0;
	FILE *m;

	if (f == NULL)
		return NULL;
	m = open_memstream(&buf, &len);
	for (int c; (c = fgetc(f)) != EOF;)
		fputc(c, m);
	fclose(m);
	fclose(f);
	return buf;
}

static void
print_logs(void)
{
	test_cluster_print_logs(&tc);
}

static int
setup(void **state)
{
	(void)state;
	return test_cluster_start(&tc, KV_BIN_DIR, "client-bench");
}

static int
teardown(void **state)
{
	(void)state;
	test_cluster_destroy(&tc);
	return 0;
}

/* Runs a bench that must succeed with --json: returns its report (the
 * caller frees it with jfree, and *r with kv_cli_run_free). */
static jnode *
run_report(int argc, const char **argv, run_result *r)
{
	*r = run(argc, argv);
	if (r->rc != 0) {
		print_logs();
		fail_msg("bench rc %d\nout: %s\nerr: %s", r->rc, r->out, r->err);
	}
	jnode *j = jparse(r->out);
	if (j == NULL)
		fail_msg("stdout is not JSON: %s", r->out);
	return j;
}

static void
duration_run_writes_the_json_report(void **state)
{
	char out[512], plot[512];
	(void)state;

	snprintf(out, sizeof(out), "%s/bench.json", tc.dir);
	snprintf(plot, sizeof(plot), "%s/bench.svg", tc.dir);
	/* Keys "k..." fall on both sides of the split the two servers got. */
	const char *argv[] = {
	    "shardkv", "-c",         tc.ctl_url, "--timeout", "5000",
	    "bench",   "--duration", "2",        "--threads", "2",
	    "--keys",  "2000",       "--load",   "--mix",     "get:70,put:20,mget:5,scan:5",
	    "--batch", "1",          "--out",    out,         "--plot",
	    plot};
	run_result r = run(ARGC(argv), argv);
	if (r.rc != 0) {
		print_logs();
		fail_msg("bench rc %d\nout: %s\nerr: %s", r.rc, r.out, r.err);
	}
	/* A progress line per second, then the summary. */
	assert_non_null(strstr(r.out, "[   1.0s]"));
	assert_non_null(strstr(r.out, "summary: "));
	assert_non_null(strstr(r.out, "per node"));
	char *text = slurp(out);
	assert_non_null(text);
	jnode *j = jparse(text);
	if (j == NULL)
		fail_msg("not JSON: %s", text);
	double ops = jnum(j, "ops");
	assert_true(ops > 0);
	assert_true(jnum(j, "errors") == 0);
	assert_true(jnum(j, "ops_per_sec") > 0);
	assert_true(fabs(jnum(j, "ops_per_sec") - ops / jnum(j, "duration_s")) < 0.001 * ops);
	assert_true(jnum(j, "duration_s") >= 2 && jnum(j, "duration_s") < 10);
	assert_true(jnum(j, "latency_us.p50") > 0);
	assert_true(jnum(j, "latency_us.p50") <= jnum(j, "latency_us.p99"));
	assert_true(jnum(j, "latency_us.p99") <= jnum(j, "latency_us.p999"));
	assert_true(jnum(j, "latency_us.p999") <= jnum(j, "latency_us.max"));
	assert_true(jnum(j, "per_op.get.ops_per_sec") > 0);
	assert_true(jnum(j, "per_op.put.ops") > 0);
	jnum(j, "per_op.mget.ops");
	jnum(j, "per_op.scan.ops");
	/* Everything was loaded, so nothing is missing. */
	assert_true(jnum(j, "misses") == 0);
	assert_true(jnum(j, "load.keys") == 2000);
	assert_true(jnum(j, "params.threads") == 2);
	assert_true(jnum(j, "params.keys") == 2000);
	assert_string_equal(jtyped(j, "params.controller", J_STR)->str, tc.ctl_url);
	const jnode *series = jtyped(j, "series", J_ARR);
	assert_true(series->n >= 2);
	assert_true(jnum(series->kids[0], "ops_per_sec") > 0);
	assert_true(jnum(series->kids[0], "epoch") > 0);
	/* Every answered op is routed to one of the two servers. */
	const jnode *nodes = jtyped(j, "per_node", J_ARR);
	assert_int_equal(nodes->n, NSERVERS);
	double sum = 0;
	for (size_t i = 0; i < nodes->n; i++)
		sum += jnum(nodes->kids[i], "ops");
	assert_true(sum == ops);
	jtyped(j, "machine", J_OBJ);
	jtyped(j, "events", J_ARR);
	jfree(j);
	free(text);
	text = slurp(plot);
	assert_non_null(text);
	assert_non_null(strstr(text, "<polyline"));
	free(text);
	kv_cli_run_free(&r);
}

static void
ops_run_counts_each_key_of_a_batch(void **state)
{
	(void)state;
	/* --ops 600 with --batch 4 and only mput: 150 calls of 4 keys; with
	 * --json the report is on stdout and progress on stderr. */
	const char *argv[] = {
	    "shardkv", "-c",     tc.ctl_url, "--json", "bench",     "--ops", "600",
	    "--batch", "4",      "--mix",    "mput:1", "--threads", "3",     "--connections",
	    "1",       "--keys", "1000",     "--dist", "zipf:0.9"};
	run_result r;
	jnode *j = run_report(ARGC(argv), argv, &r);
	assert_true(jnum(j, "ops") == 600);
	assert_true(jnum(j, "calls") == 150);
	assert_true(jnum(j, "per_op.mput.ops") == 600);
	assert_true(jnum(j, "params.connections") == 1);
	assert_string_equal(jtyped(j, "params.dist", J_STR)->str, "zipf:0.9");
	assert_non_null(strstr(r.err, "bench: closed loop"));
	jfree(j);
	kv_cli_run_free(&r);
}

/* --one-range with pipelined puts over keys on both servers: every key is
 * answered and counted on a node, and the report says how the keys were drawn. */
static void
one_range_run_answers_and_routes_every_key(void **state)
{
	(void)state;
	const char *argv[] = {"shardkv", "-c",      tc.ctl_url, "--json", "bench", "--ops",
	                      "1600",    "--batch", "8",        "--mix",  "put:1", "--threads",
	                      "1",       "--async", "4",        "--keys", "2000",  "--one-range"};
	run_result r;
	jnode *j = run_report(ARGC(argv), argv, &r);
	assert_true(jnum(j, "ops") == 1600);
	assert_true(jnum(j, "errors") == 0);
	assert_true(jtyped(j, "params.one_range", J_BOOL)->num == 1);
	/* Pipelines of 8: each also timed to its first answer, never later
	 * than its last. */
	assert_true(jnum(j, "latency_first_us.count") == 200);
	assert_true(jnum(j, "latency_first_us.min") <= jnum(j, "latency_us.min"));
	assert_true(jnum(j, "latency_first_us.max") <= jnum(j, "latency_us.max"));
	const jnode *nodes = jtyped(j, "per_node", J_ARR);
	double sum = 0;
	for (size_t i = 0; i < nodes->n; i++)
		sum += jnum(nodes->kids[i], "ops");
	assert_true(sum == 1600);
	jfree(j);
	kv_cli_run_free(&r);
}

static void
open_loop_run_keeps_the_asked_rate(void **state)
{
	(void)state;
	const char *argv[] = {"shardkv", "-c",  tc.ctl_url,  "--json", "bench",  "--duration", "2",
	                      "--rate",  "400", "--threads", "2",      "--keys", "500"};
	run_result r;
	jnode *j = run_report(ARGC(argv), argv, &r);
	/* 400 ops/s for 2 s, give or take the last call in flight. */
	assert_true(jnum(j, "ops") >= 760 && jnum(j, "ops") <= 802);
	assert_string_equal(jtyped(j, "params.mode", J_STR)->str, "open");
	jnum(j, "open_loop_backlog_ops");
	jfree(j);
	kv_cli_run_free(&r);
}

/* The Unix time in seconds (to the millisecond). */
static double
unix_now(void)
{
	return (double)kv_unix_ms() / 1e3;
}

/* Reads a --slow-log file: checks its header and every line's fields
 * against the run's window; returns the number of calls listed. */
static size_t
check_slow_log(const char *path, double from, double to)
{
	FILE *f = fopen(path, "r");
	char line[512];
	size_t n = 0;

	assert_non_null(f);
	assert_non_null(fgets(line, sizeof(line), f));
	assert_string_equal(line, "# due_unix_s\tlatency_ms\top\tnode\tkeys\tresult\n");
	while (fgets(line, sizeof(line), f) != NULL) {
		double due, ms;
		char op[16], res[32];
		unsigned node, keys;
		if (sscanf(line, "%lf\t%lf\t%15s\t%u\t%u\t%31s", &due, &ms, op, &node, &keys,
		           res) != 6)
			fail_msg("malformed --slow-log line: %s", line);
		assert_true(due >= from - 0.01 && due <= to + 0.01);
		assert_true(ms >= 0 && ms <= (to - from) * 1000 + 10);
		assert_true(strcmp(op, "get") == 0 || strcmp(op, "put") == 0);
		assert_true(node >= 1 && node <= NSERVERS);
		assert_int_equal(keys, 1);
		assert_true(strcmp(res, "ok") == 0 || strcmp(res, "miss") == 0);
		n++;
	}
	fclose(f);
	return n;
}

/* --slow-log lists every call at or over --slow-us, when it was due (Unix
 * time, to match with the servers' logs), its latency, op, node, keys and
 * result; a threshold no call reaches leaves the header alone. */
static void
slow_log_lists_every_call_at_or_over_its_threshold(void **state)
{
	(void)state;
	char path[] = "/tmp/kv-slow-log-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	close(fd);

	const char *every[] = {"shardkv", "-c",         tc.ctl_url,  "--json",    "bench",
	                       "--ops",   "300",        "--threads", "2",         "--keys",
	                       "500",     "--slow-log", path,        "--slow-us", "0"};
	run_result r;
	double from = unix_now();
	jnode *j = run_report(ARGC(every), every, &r);
	double to = unix_now();
	assert_true(jnum(j, "ops") == 300);
	assert_string_equal(jtyped(j, "params.slow_log", J_STR)->str, path);
	assert_true(jnum(j, "params.slow_us") == 0);
	jfree(j);
	kv_cli_run_free(&r);
	assert_int_equal(check_slow_log(path, from, to), 300);

	const char *none[] = {"shardkv", "-c",         tc.ctl_url,  "--json",    "bench",
	                      "--ops",   "100",        "--threads", "2",         "--keys",
	                      "500",     "--slow-log", path,        "--slow-us", "60000000"};
	from = unix_now();
	j = run_report(ARGC(none), none, &r);
	to = unix_now();
	assert_true(jnum(j, "ops") == 100);
	jfree(j);
	kv_cli_run_free(&r);
	assert_int_equal(check_slow_log(path, from, to), 0);
	unlink(path);
}

static void
unreachable_cluster_exits_3(void **state)
{
	char url[64];
	(void)state;
	kv_test_free_url(url, sizeof(url));
	const char *argv[] = {"shardkv", "-c", url, "--timeout", "300", "bench", "--duration", "1"};
	run_result r = run(ARGC(argv), argv);
	assert_int_equal(r.rc, KV_CLI_UNAVAIL);
	assert_int_equal(r.nout, 0);
	kv_cli_run_free(&r);
}

/* A load that writes nothing (every server stopped) stops once each writer
 * has failed, instead of failing key after key for the whole key space,
 * and exits 3. */
static void
load_that_writes_nothing_stops_and_exits_3(void **state)
{
	(void)state;
	for (int i = 1; i <= NSERVERS; i++)
		assert_int_equal(kill(tc.pids[i], SIGSTOP), 0);
	const char *argv[] = {"shardkv", "-c",     tc.ctl_url, "--timeout", "300",
	                      "bench",   "--ops",  "10",       "--threads", "2",
	                      "--keys",  "100000", "--load",   "--batch",   "1"};
	run_result r = run(ARGC(argv), argv);
	for (int i = 1; i <= NSERVERS; i++)
		kill(tc.pids[i], SIGCONT);
	assert_int_equal(r.rc, KV_CLI_UNAVAIL);
	assert_non_null(strstr(r.err, "no key was written"));
	kv_cli_run_free(&r);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(duration_run_writes_the_json_report),
	    cmocka_unit_test(ops_run_counts_each_key_of_a_batch),
	    cmocka_unit_test(one_range_run_answers_and_routes_every_key),
	    cmocka_unit_test(open_loop_run_keeps_the_asked_rate),
	    cmocka_unit_test(slow_log_lists_every_call_at_or_over_its_threshold),
	    cmocka_unit_test(unreachable_cluster_exits_3),
	    cmocka_unit_test(
	        load_that_writes_nothing_stops_and_exits_3), /* last: stops the servers */
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, setup, teardown);
}

#endif /* KV_BENCH_CLUSTER */
