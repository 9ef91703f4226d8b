/*
 * bench.c - `shardkv bench`: workers, a once-a-second reporter, a
 * configuration poller, the optional --load phase and the reports.
 *
 * Threads and what they own:
 *   - T workers. Each owns its RNG, key and value buffers and a tally of the
 *     calls it finished since the last tick, guarded by its own mutex (held
 *     for one record, or by the reporter for one merge-and-reset).
 *   - The reporter wakes at every whole second after the start: it drains the
 *     workers' tallies into that second's point and the run's total, prints
 *     the progress line and the events the poller found, and stops the run
 *     when --duration is over.
 *   - The poller fetches the status (or, failing that, the configuration)
 *     once a second on the admin handle, publishes the range map for routing
 *     (reference-counted; workers take a reference when its generation
 *     changes) and records admin events (join, leave, move, migration start
 *     and end) under the event lock.
 *   - The calling thread starts and joins them, and after the join drains
 *     the last partial second and writes the reports.
 * Lock order: a worker's lock, then nothing; the run's lock (stop/done
 * condition), the route lock and the event lock are never held together.
 *
 * The worker never blocks on the reporter for longer than one merge of its
 * own tally (a few microseconds). Nothing here knows which server answered
 * a call: per-node counts route keys through the polled range map.
 */
#include "client/cli/bench.h"
#include "client/cli/cliutil.h"
#include "common/log.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define HDR_SUB_BITS   10 /* 0.2 % relative precision */
#define HDR_HIGH_BITS  37 /* up to 137 s in ns */
#define LOAD_MAX_KEYS  1000u
#define LOAD_MAX_BYTES (4u << 20)
#define MAX_THREADS    4096u
#define MAX_KEYS       1000000000ull
#define MAX_VALUE      (1u << 20)
#define MAX_BATCH      10000u /* the servers' limit of keys per mget/mput */
#define MAX_KEY_PREFIX 64u
#define MAX_KEY_SIZE   1024u
#define ZIPF_PRIME     2654435761ull

static const char *const op_names[KV_BENCH_NOPS] = {"get",  "put",  "del", "append",
                                                    "mget", "mput", "scan"};

/* Indexed by -code; the last entry names every code beyond the table. */
static const char *const err_names[KV_BENCH_NERR] = {
    "ok",       "not_found", "invalid",     "no_memory", "too_big",    "wrong_owner",
    "stale",    "timed_out", "unavailable", "exists",    "io",         "corrupt",
    "protocol", "auth",      "closed",      "busy",      "moving",     "not_permitted",
    "no_space", "limit",     "addr_in_use", "internal",  "unknown_22", "other"};

/* Set by SIGINT/SIGTERM while a run is in progress: a signal handler can
 * reach nothing else. A lock-free atomic, so that the handler may set it and
 * every thread read it. */
static atomic_int bench_interrupted;
_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "a signal handler may only touch lock-free atomics");

static void
bench_on_signal(int sig)
{
	(void)sig;
	atomic_store(&bench_interrupted, 1);
}

const char *
kv_bench_op_name(int op)
{
	return op >= 0 && op < KV_BENCH_NOPS ? op_names[op] : NULL;
}

static int
err_index(int err)
{
	return err < 0 && -err < KV_BENCH_NERR - 1 ? -err : KV_BENCH_NERR - 1;
}

const char *
kv_bench_err_name(int err)
{
	return err_names[err_index(err)];
}

static uint64_t
now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* ---------------------------------------------------------------------------
 * Parsing
 * ------------------------------------------------------------------------- */

static int usage(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int
usage(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return KV_CLI_USAGE;
}

static bool
parse_u64(const char *s, uint64_t min, uint64_t max, uint64_t *out)
{
	char *e;
	unsigned long long v;

	if (s == NULL || s[0] < '0' || s[0] > '9')
		return false;
	errno = 0;
	v = strtoull(s, &e, 10);
	if (errno != 0 || *e != 0 || v < min || v > max)
		return false;
	*out = v;
	return true;
}

static bool
parse_double(const char *s, double min, double max, double *out)
{
	char *e;
	double v;

	if (s == NULL || !((s[0] >= '0' && s[0] <= '9') || s[0] == '.'))
		return false;
	errno = 0;
	v = strtod(s, &e);
	if (errno != 0 || *e != 0 || !(v >= min && v <= max))
		return false;
	*out = v;
	return true;
}

int
kv_bench_parse_mix(const char *s, unsigned *weights, char *err, size_t errlen)
{
	unsigned w[KV_BENCH_NOPS] = {0};
	bool seen[KV_BENCH_NOPS] = {false};
	uint64_t total = 0;
	const char *p = s;

	if (s == NULL || s[0] == 0)
		return usage(err, errlen, "bench: --mix needs OP:WEIGHT[,OP:WEIGHT...]");
	while (*p) {
		const char *colon = strchr(p, ':'), *comma = strchr(p, ',');
		const char *end = comma ? comma : p + strlen(p);
		char num[16];
		uint64_t v;
		int op = -1;

		if (colon == NULL || colon > end)
			return usage(err, errlen,
			             "bench: --mix: '%.*s' is not OP:WEIGHT (e.g. get:90,put:10)",
			             (int)(end - p), p);
		for (int i = 0; i < KV_BENCH_NOPS; i++)
			if ((size_t)(colon - p) == strlen(op_names[i]) &&
			    strncmp(p, op_names[i], (size_t)(colon - p)) == 0)
				op = i;
		if (op < 0)
			return usage(
			    err, errlen,
			    "bench: --mix: unknown op '%.*s' (get, put, del, append, mget, "
			    "mput, scan)",
			    (int)(colon - p), p);
		if (seen[op])
			return usage(err, errlen, "bench: --mix: %s given twice", op_names[op]);
		if ((size_t)(end - colon - 1) >= sizeof(num))
			return usage(err, errlen, "bench: --mix: weight of %s is too long",
			             op_names[op]);
		memcpy(num, colon + 1, (size_t)(end - colon - 1));
		num[end - colon - 1] = 0;
		if (!parse_u64(num, 0, 1000000, &v))
			return usage(
			    err, errlen,
			    "bench: --mix: weight of %s must be a number 0..1000000, not '%s'",
			    op_names[op], num);
		seen[op] = true;
		w[op] = (unsigned)v;
		total += v;
		if (comma == NULL)
			break;
		p = comma + 1;
		if (*p == 0)
			return usage(err, errlen, "bench: --mix: trailing comma");
	}
	if (total == 0)
		return usage(err, errlen, "bench: --mix: the weights add up to 0");
	memcpy(weights, w, sizeof(w));
	return 0;
}

int
kv_bench_parse_dist(const char *s, kv_bench_dist *d, char *err, size_t errlen)
{
	double theta = 0.99;

	if (s && strcmp(s, "uniform") == 0) {
		*d = (kv_bench_dist){.zipf = false, .theta = 0};
		return 0;
	}
	if (s && strncmp(s, "zipf", 4) == 0 && (s[4] == 0 || s[4] == ':')) {
		if (s[4] == ':' && (!parse_double(s + 5, 0, 1, &theta) || theta <= 0 || theta >= 1))
			return usage(err, errlen,
			             "bench: --dist zipf:THETA needs 0 < THETA < 1, not '%s'",
			             s + 5);
		*d = (kv_bench_dist){.zipf = true, .theta = theta};
		return 0;
	}
	return usage(err, errlen, "bench: --dist must be uniform or zipf[:THETA], not '%s'",
	             s ? s : "");
}

/* Returns the number of decimal digits of v (1 for 0). */
static unsigned
digits(uint64_t v)
{
	unsigned n = 1;
	while (v >= 10) {
		v /= 10;
		n++;
	}
	return n;
}

int
kv_bench_parse(int argc, const char *const *argv, kv_bench_params *p, char *err, size_t errlen)
{
	bool has_duration = false, has_ops = false, has_conns = false, has_slow_us = false;
	uint64_t n;
	double d;
	int rv;

	err[0] = 0;
	memset(p, 0, sizeof(*p));
	p->threads = 4;
	p->keys = 100000;
	p->key_size = 16;
	p->key_prefix = "key:";
	p->value_size = 100;
	p->mix_str = "get:90,put:10";
	p->batch = 1;
	p->scan_limit = 10;
	p->duration_s = 10;
	p->dist_str = "uniform";
	p->seed = 1;
	p->slow_us = 1000;
	for (int i = 0; i < argc; i++) {
		const char *s = argv[i], *v = NULL, *eq;
		char name[32];
		size_t nl;

		if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
			p->help = true;
			continue;
		}
		if (strncmp(s, "--", 2) != 0)
			return usage(err, errlen, "bench: unexpected argument '%s'", s);
		eq = strchr(s, '=');
		nl = eq ? (size_t)(eq - s) : strlen(s);
		if (nl >= sizeof(name))
			return usage(err, errlen, "bench: unknown option '%s'", s);
		memcpy(name, s, nl);
		name[nl] = 0;
		if (strcmp(name, "--load") == 0) {
			if (eq)
				return usage(err, errlen, "bench: --load takes no value");
			p->load = true;
			continue;
		}
		if (strcmp(name, "--one-range") == 0) {
			if (eq)
				return usage(err, errlen, "bench: --one-range takes no value");
			p->one_range = true;
			continue;
		}
		static const char *const with_value[] = {
		    "--threads", "--connections", "--keys",     "--key-size", "--value-size",
		    "--mix",     "--batch",       "--duration", "--ops",      "--out",
		    "--plot",    "--rate",        "--dist",     "--seed",     "--scan-limit",
		    "--async",   "--key-prefix",  "--slow-log", "--slow-us"};
		bool known = false;
		for (size_t k = 0; k < sizeof(with_value) / sizeof(with_value[0]); k++)
			known |= strcmp(name, with_value[k]) == 0;
		if (!known)
			return usage(err, errlen,
			             "bench: unknown option '%s' (try 'shardkv bench --help')", s);
		if (eq)
			v = eq + 1;
		else if (i + 1 < argc)
			v = argv[++i];
		else
			return usage(err, errlen, "bench: %s needs a value", name);

		if (strcmp(name, "--threads") == 0) {
			if (!parse_u64(v, 1, MAX_THREADS, &n))
				return usage(err, errlen, "bench: --threads needs a number 1..%u",
				             MAX_THREADS);
			p->threads = (unsigned)n;
		} else if (strcmp(name, "--connections") == 0) {
			if (!parse_u64(v, 1, MAX_THREADS, &n))
				return usage(err, errlen,
				             "bench: --connections needs a number 1..%u",
				             MAX_THREADS);
			p->connections = (unsigned)n;
			has_conns = true;
		} else if (strcmp(name, "--keys") == 0) {
			if (!parse_u64(v, 1, MAX_KEYS, &n))
				return usage(err, errlen, "bench: --keys needs a number 1..%llu",
				             MAX_KEYS);
			p->keys = n;
		} else if (strcmp(name, "--key-size") == 0) {
			if (!parse_u64(v, 1, MAX_KEY_SIZE, &n))
				return usage(err, errlen, "bench: --key-size needs 1..%u bytes",
				             MAX_KEY_SIZE);
			p->key_size = (unsigned)n;
		} else if (strcmp(name, "--key-prefix") == 0) {
			if (strlen(v) > MAX_KEY_PREFIX)
				return usage(err, errlen,
				             "bench: --key-prefix needs at most %u bytes",
				             MAX_KEY_PREFIX);
			p->key_prefix = v;
			p->key_prefix_set = true;
		} else if (strcmp(name, "--value-size") == 0) {
			if (!parse_u64(v, 0, MAX_VALUE, &n))
				return usage(err, errlen, "bench: --value-size needs 0..%u bytes",
				             MAX_VALUE);
			p->value_size = (size_t)n;
		} else if (strcmp(name, "--mix") == 0) {
			if ((rv = kv_bench_parse_mix(v, p->mix, err, errlen)) != 0)
				return rv;
			p->mix_str = v;
		} else if (strcmp(name, "--batch") == 0) {
			if (!parse_u64(v, 1, MAX_BATCH, &n))
				return usage(err, errlen, "bench: --batch needs a number 1..%u",
				             MAX_BATCH);
			p->batch = (unsigned)n;
		} else if (strcmp(name, "--async") == 0) {
			if (!parse_u64(v, 1, 4096, &n))
				return usage(err, errlen, "bench: --async needs a number 1..4096");
			p->async = (unsigned)n;
		} else if (strcmp(name, "--scan-limit") == 0) {
			if (!parse_u64(v, 1, 100000, &n))
				return usage(err, errlen, "bench: --scan-limit needs 1..100000");
			p->scan_limit = (unsigned)n;
		} else if (strcmp(name, "--duration") == 0) {
			if (!parse_double(v, 0, 7 * 86400, &d))
				return usage(
				    err, errlen,
				    "bench: --duration needs a number of seconds (at most a "
				    "week)");
			p->duration_s = d;
			has_duration = true;
		} else if (strcmp(name, "--ops") == 0) {
			if (!parse_u64(v, 0, UINT64_MAX / 2, &n))
				return usage(err, errlen, "bench: --ops needs a number");
			p->ops = n;
			has_ops = true;
		} else if (strcmp(name, "--out") == 0) {
			if (v[0] == 0)
				return usage(err, errlen, "bench: --out needs a file name");
			p->out_path = v;
		} else if (strcmp(name, "--plot") == 0) {
			if (v[0] == 0)
				return usage(err, errlen, "bench: --plot needs a file name");
			p->plot_path = v;
		} else if (strcmp(name, "--slow-log") == 0) {
			if (v[0] == 0)
				return usage(err, errlen, "bench: --slow-log needs a file name");
			p->slow_path = v;
		} else if (strcmp(name, "--slow-us") == 0) {
			if (!parse_u64(v, 0, UINT64_MAX / 1000u, &n))
				return usage(err, errlen,
				             "bench: --slow-us needs a number of microseconds");
			p->slow_us = n;
			has_slow_us = true;
		} else if (strcmp(name, "--rate") == 0) {
			if (!parse_double(v, 0, 1e9, &d) || d <= 0)
				return usage(err, errlen,
				             "bench: --rate needs a positive number of ops/s");
			p->rate = d;
		} else if (strcmp(name, "--dist") == 0) {
			if ((rv = kv_bench_parse_dist(v, &p->dist, err, errlen)) != 0)
				return rv;
			p->dist_str = v;
		} else {
			if (!parse_u64(v, 0, UINT64_MAX, &n))
				return usage(err, errlen, "bench: --seed needs a number");
			p->seed = n;
		}
	}
	if (p->help)
		return 0;
	if (has_slow_us && p->slow_path == NULL)
		return usage(err, errlen, "bench: --slow-us needs --slow-log FILE");
	if (strcmp(p->mix_str, "get:90,put:10") == 0)
		kv_bench_parse_mix(p->mix_str, p->mix, err, errlen); /* the default */
	if (has_duration && has_ops)
		return usage(err, errlen, "bench: give --duration or --ops, not both");
	if (has_ops)
		p->duration_s = 0;
	if (!has_ops && p->duration_s == 0 && !p->load)
		return usage(err, errlen, "bench: --duration 0 runs nothing (only with --load)");
	if (has_ops && p->ops == 0 && !p->load)
		return usage(err, errlen, "bench: --ops 0 runs nothing (only with --load)");
	if (!has_conns)
		p->connections = p->threads;
	if (p->connections > p->threads)
		return usage(err, errlen,
		             "bench: --connections %u > --threads %u (each connection needs a "
		             "thread to drive it)",
		             p->connections, p->threads);
	if (p->key_size < digits(p->keys - 1))
		return usage(err, errlen,
		             "bench: --key-size %u is too small for %" PRIu64
		             " distinct keys (needs %u)",
		             p->key_size, p->keys, digits(p->keys - 1));
	if (p->key_prefix_set && p->key_size < strlen(p->key_prefix) + digits(p->keys - 1))
		return usage(err, errlen,
		             "bench: --key-size %u is too small for --key-prefix of %zu bytes and "
		             "%" PRIu64 " distinct keys (needs %zu)",
		             p->key_size, strlen(p->key_prefix), p->keys,
		             strlen(p->key_prefix) + digits(p->keys - 1));
	if (p->async && (p->rate > 0 || p->mix[KV_BENCH_APPEND] || p->mix[KV_BENCH_MGET] ||
	                 p->mix[KV_BENCH_MPUT] || p->mix[KV_BENCH_SCAN]))
		return usage(err, errlen,
		             "bench: --async runs a closed loop of get, put and del only (no "
		             "--rate, append, mget, mput or scan)");
	if (p->rate > 0 && p->rate < p->threads / 1000.0)
		return usage(err, errlen, "bench: --rate %.3g is too low for %u threads", p->rate,
		             p->threads);
	return 0;
}

void
kv_bench_usage(FILE *f)
{
	fprintf(f, "usage: shardkv [-c ADDR] [--json] [--timeout MS] bench [options]\n"
	           "  Measures throughput and latency; prints a line per second, then a summary.\n"
	           "  --threads T        workers, each with one call in flight (default 4)\n"
	           "  --connections C    client handles shared round-robin by the workers, C <= T\n"
	           "                     (default T: every worker has its own)\n"
	           "  --keys N           key space: N keys \"key:000..N-1\" (default 100000)\n"
	           "  --key-size B       bytes per key (default 16)\n"
	           "  --key-prefix P     keys are P and zero-padded digits (default \"key:\"),\n"
	           "                     e.g. to aim the load at one range\n"
	           "  --value-size B     bytes per value (default 100)\n"
	           "  --mix OP:W,...     weights of get put del append mget mput scan\n"
	           "                     (default get:90,put:10)\n"
	           "  --batch K          keys per mget/mput; K > 1 also turns get and put into\n"
	           "                     mget/mput of K keys. An operation counts once per key\n"
	           "  --one-range        the keys of one call share a range: the first is drawn\n"
	           "                     by --dist, the others uniformly within its range (as\n"
	           "                     redis-benchmark --cluster keeps a pipeline on one slot)\n"
	           "  --scan-limit N     entries per scan (default 10)\n"
	           "  --dist D           uniform (default) or zipf[:THETA] (default 0.99)\n"
	           "  --duration S       run for S seconds (default 10)\n"
	           "  --ops N            run N operations instead\n"
	           "  --async C          each thread keeps C callers in flight through the async\n"
	           "                     API, each issuing its next call when the last completes\n"
	           "                     (closed loop of get/put/del; T x C callers in all); with\n"
	           "                     --batch K a call is K single-key ops in flight at once\n"
	           "                     (a pipeline of depth K), counted as K operations\n"
	           "  --rate OPS         open loop: issue OPS operations/s in total, latency from\n"
	           "                     the intended send time (default: closed loop)\n"
	           "  --load             first write all N keys (mput batches); with --duration 0\n"
	           "                     or --ops 0 only that\n"
	           "  --seed N           random seed (default 1)\n"
	           "  --out FILE.json    write the results, time series, parameters and machine\n"
	           "  --plot FILE.svg    draw ops/s and p99 over time with admin events marked\n"
	           "  --slow-log FILE    a line per call that took --slow-us or longer: when it\n"
	           "                     was due (Unix s), its latency (ms), op, node, keys and\n"
	           "                     result, tab-separated, to match with the servers' logs\n"
	           "  --slow-us US       the threshold of --slow-log (default 1000)\n"
	           "  Latency is per call, failed calls included; a missing key is a miss, not an\n"
	           "  error. Ops per node route keys through the range map polled every second.\n"
	           "  With --json the summary is printed as JSON and progress goes to stderr.\n");
}

/* ---------------------------------------------------------------------------
 * Tallies and results
 * ------------------------------------------------------------------------- */

int
kv_bench_tally_record(kv_bench_tally *t, int op, uint64_t lat_ns, uint64_t ok, uint64_t misses,
                      uint64_t nerr, int err)
{
	if (t->lat[op] == NULL && (t->lat[op] = kv_hdr_create(HDR_SUB_BITS, HDR_HIGH_BITS)) == NULL)
		return SHARDKV_ENOMEM;
	kv_hdr_record(t->lat[op], lat_ns);
	t->calls[op]++;
	t->ops[op] += ok;
	t->misses[op] += misses;
	t->errors[op] += nerr;
	if (nerr)
		t->err_kind[err_index(err)] += nerr;
	return 0;
}

int
kv_bench_tally_record_first(kv_bench_tally *t, uint64_t lat_ns)
{
	if (t->first == NULL && (t->first = kv_hdr_create(HDR_SUB_BITS, HDR_HIGH_BITS)) == NULL)
		return SHARDKV_ENOMEM;
	kv_hdr_record(t->first, lat_ns);
	return 0;
}

int
kv_bench_tally_merge(kv_bench_tally *dst, const kv_bench_tally *src)
{
	if (src->first && kv_hdr_count(src->first)) {
		if (dst->first == NULL &&
		    (dst->first = kv_hdr_create(HDR_SUB_BITS, HDR_HIGH_BITS)) == NULL)
			return SHARDKV_ENOMEM;
		kv_hdr_merge(dst->first, src->first);
	}
	for (int i = 0; i < KV_BENCH_NOPS; i++) {
		if (src->lat[i] && kv_hdr_count(src->lat[i])) {
			if (dst->lat[i] == NULL &&
			    (dst->lat[i] = kv_hdr_create(HDR_SUB_BITS, HDR_HIGH_BITS)) == NULL)
				return SHARDKV_ENOMEM;
			kv_hdr_merge(dst->lat[i], src->lat[i]);
		}
		dst->calls[i] += src->calls[i];
		dst->ops[i] += src->ops[i];
		dst->misses[i] += src->misses[i];
		dst->errors[i] += src->errors[i];
	}
	for (int i = 0; i < KV_BENCH_NERR; i++)
		dst->err_kind[i] += src->err_kind[i];
	for (int i = 0; i <= KV_BENCH_MAX_NODES; i++)
		dst->node_ops[i] += src->node_ops[i];
	return 0;
}

void
kv_bench_tally_reset(kv_bench_tally *t)
{
	kv_hdr *lat[KV_BENCH_NOPS], *first = t->first;

	memcpy(lat, t->lat, sizeof(lat));
	memset(t, 0, sizeof(*t));
	for (int i = 0; i < KV_BENCH_NOPS; i++)
		if ((t->lat[i] = lat[i]) != NULL)
			kv_hdr_reset(lat[i]);
	if ((t->first = first) != NULL)
		kv_hdr_reset(first);
}

void
kv_bench_tally_fini(kv_bench_tally *t)
{
	for (int i = 0; i < KV_BENCH_NOPS; i++) {
		kv_hdr_destroy(t->lat[i]);
		t->lat[i] = NULL;
	}
	kv_hdr_destroy(t->first);
	t->first = NULL;
}

uint64_t
kv_bench_tally_ops(const kv_bench_tally *t)
{
	uint64_t n = 0;
	for (int i = 0; i < KV_BENCH_NOPS; i++)
		n += t->ops[i];
	return n;
}

uint64_t
kv_bench_tally_errors(const kv_bench_tally *t)
{
	uint64_t n = 0;
	for (int i = 0; i < KV_BENCH_NOPS; i++)
		n += t->errors[i];
	return n;
}

/* Returns a new histogram of every op's latency (the caller destroys it), or
 * NULL when out of memory. */
static kv_hdr *
tally_all(const kv_bench_tally *t)
{
	kv_hdr *h = kv_hdr_create(HDR_SUB_BITS, HDR_HIGH_BITS);

	for (int i = 0; h && i < KV_BENCH_NOPS; i++)
		if (t->lat[i])
			kv_hdr_merge(h, t->lat[i]);
	return h;
}

typedef struct {
	kv_bench_bucket *b;
	size_t n, cap;
	double lim; /* the last bucket takes values up to this (us) */
	bool nomem;
} bucket_acc;

/* Adds the calls of one HDR bucket (largest value v ns, n calls): to the
 * last output bucket while v is within 1% of that bucket's smallest, else
 * to a new one. A bucket's bound is the largest value it took. */
static void
bucket_add(void *arg, uint64_t v, uint64_t n)
{
	bucket_acc *a = arg;
	double us = (double)v / 1000.0;

	if (a->nomem)
		return;
	if (a->n == 0 || us > a->lim) {
		if (a->n == a->cap) {
			size_t cap = a->cap ? a->cap * 2 : 64;
			kv_bench_bucket *nb = realloc(a->b, cap * sizeof(*nb));
			if (nb == NULL) {
				a->nomem = true;
				return;
			}
			a->b = nb;
			a->cap = cap;
		}
		a->b[a->n++] = (kv_bench_bucket){.us = us, .n = 0};
		a->lim = us * 1.01;
	}
	a->b[a->n - 1].us = us;
	a->b[a->n - 1].n += n;
}

int
kv_bench_buckets(const kv_hdr *h, kv_bench_bucket **out, size_t *nout)
{
	bucket_acc a = {0};

	*out = NULL;
	*nout = 0;
	if (h == NULL)
		return 0;
	kv_hdr_foreach(h, bucket_add, &a);
	if (a.nomem) {
		free(a.b);
		return SHARDKV_ENOMEM;
	}
	*out = a.b;
	*nout = a.n;
	return 0;
}

int
kv_bench_result_add_point(kv_bench_result *r, const kv_bench_point *pt)
{
	if (r->npoints == r->cap_points) {
		size_t cap = r->cap_points ? r->cap_points * 2 : 64;
		kv_bench_point *n = realloc(r->points, cap * sizeof(*n));
		if (n == NULL) {
			free(pt->hist);
			return SHARDKV_ENOMEM;
		}
		r->points = n;
		r->cap_points = cap;
	}
	r->points[r->npoints++] = *pt;
	return 0;
}

int
kv_bench_result_add_event(kv_bench_result *r, const kv_bench_event *ev)
{
	if (r->nevents == r->cap_events) {
		size_t cap = r->cap_events ? r->cap_events * 2 : 16;
		kv_bench_event *n = realloc(r->events, cap * sizeof(*n));
		if (n == NULL)
			return SHARDKV_ENOMEM;
		r->events = n;
		r->cap_events = cap;
	}
	r->events[r->nevents++] = *ev;
	return 0;
}

void
kv_bench_result_fini(kv_bench_result *r)
{
	kv_bench_tally_fini(&r->total);
	for (size_t i = 0; i < r->npoints; i++)
		free(r->points[i].hist);
	free(r->points);
	free(r->events);
	r->points = NULL;
	r->events = NULL;
	r->npoints = r->nevents = r->cap_points = r->cap_events = 0;
}

/* ---------------------------------------------------------------------------
 * Keys: generation, distribution, routing
 * ------------------------------------------------------------------------- */

/* xorshift64*: one stream per worker. */
static uint64_t
rng_next(uint64_t *s)
{
	uint64_t x = *s;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*s = x;
	return x * 0x2545F4914F6CDD1Dull;
}

static uint64_t
splitmix(uint64_t x)
{
	x += 0x9E3779B97F4A7C15ull;
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
	x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
	return x ^ (x >> 31);
}

/* Gray et al.'s Zipfian generator (as in YCSB), ranks scrambled by a
 * bijective multiplication modulo n so that the hot keys are spread over the
 * key space instead of all falling into its first range. */
typedef struct {
	uint64_t n;      /* key space */
	double theta;    /* exponent */
	double alpha;    /* 1 / (1 - theta) */
	double zetan;    /* zeta(n, theta) */
	double eta;      /* see Gray et al. */
	double half_pow; /* 1 + 0.5^theta */
} zipf_gen;

static double
zeta(uint64_t n, double theta)
{
	const uint64_t m = n < 1000000 ? n : 1000000;
	double s = 0;

	for (uint64_t i = 1; i <= m; i++)
		s += pow((double)i, -theta);
	if (n > m) /* Euler-Maclaurin tail: integral plus the trapezoid correction */
		s += (pow((double)n, 1 - theta) - pow((double)m, 1 - theta)) / (1 - theta) +
		     (pow((double)n, -theta) - pow((double)m, -theta)) / 2;
	return s;
}

static void
zipf_init(zipf_gen *z, uint64_t n, double theta)
{
	double zeta2 = 1 + pow(0.5, theta);

	z->n = n;
	z->theta = theta;
	z->alpha = 1 / (1 - theta);
	z->zetan = zeta(n, theta);
	z->half_pow = zeta2;
	z->eta = n > 2 ? (1 - pow(2.0 / (double)n, 1 - theta)) / (1 - zeta2 / z->zetan) : 0;
}

static uint64_t
zipf_next(const zipf_gen *z, double u)
{
	double uz = u * z->zetan;
	uint64_t r;

	if (z->n < 2 || uz < 1)
		r = 0;
	else if (uz < z->half_pow)
		r = 1;
	else
		r = (uint64_t)((double)z->n * pow(z->eta * u - z->eta + 1, z->alpha));
	if (r >= z->n)
		r = z->n - 1;
	return (r * ZIPF_PRIME) % z->n;
}

/* Writes key number idx: the prefix (plen bytes, 0: none) and zero-padded
 * digits filling ks bytes (ks >= plen). */
static void
key_fill(uint8_t *dst, unsigned ks, const char *prefix, size_t plen, uint64_t idx)
{
	unsigned start = (unsigned)plen;

	if (plen)
		memcpy(dst, prefix, plen);
	for (unsigned i = ks; i > start; i--) {
		dst[i - 1] = (uint8_t)('0' + idx % 10);
		idx /= 10;
	}
}

/* The range map for routing, shared by reference. */
typedef struct {
	atomic_int refs; /* holders */
	uint64_t epoch;  /* its epoch */
	size_t n;        /* ranges */
	struct {
		uint8_t *start; /* owned */
		size_t len;     /* its length */
		uint32_t node;  /* owner */
	} * r;                  /* sorted by start */
	uint64_t *first;        /* --one-range: r[i]'s first key index (n entries) */
} route_tab;

static void
route_unref(route_tab *t)
{
	if (t == NULL || atomic_fetch_sub(&t->refs, 1) != 1)
		return;
	for (size_t i = 0; i < t->n; i++)
		free(t->r[i].start);
	free(t->r);
	free(t->first);
	free(t);
}

static route_tab *
route_build(const shardkv_config *cfg)
{
	route_tab *t = calloc(1, sizeof(*t));

	if (t == NULL)
		return NULL;
	atomic_init(&t->refs, 1);
	t->epoch = cfg->epoch;
	if (cfg->nranges && (t->r = calloc(cfg->nranges, sizeof(*t->r))) == NULL) {
		free(t);
		return NULL;
	}
	for (size_t i = 0; i < cfg->nranges; i++, t->n++) {
		const shardkv_range *rg = &cfg->ranges[i];
		if ((t->r[i].start = malloc(rg->start.len + 1)) == NULL) {
			route_unref(t);
			return NULL;
		}
		if (rg->start.len)
			memcpy(t->r[i].start, rg->start.data, rg->start.len);
		t->r[i].len = rg->start.len;
		t->r[i].node = rg->node;
	}
	return t;
}

/* Returns 1 + the index of the range holding key under t: of the last range
 * whose start is <= key (0: before every range, or no map). */
static size_t
route_slot(const route_tab *t, const uint8_t *key, size_t klen)
{
	size_t lo = 0, hi = t ? t->n : 0;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		size_t l = t->r[mid].len < klen ? t->r[mid].len : klen;
		int c = l ? memcmp(t->r[mid].start, key, l) : 0;
		if (c < 0 || (c == 0 && t->r[mid].len <= klen))
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Returns the node owning key under t (0: unknown). */
static uint32_t
route_key(const route_tab *t, const uint8_t *key, size_t klen)
{
	size_t j = route_slot(t, key, klen);

	return j == 0 ? 0 : t->r[j - 1].node;
}

/* ---------------------------------------------------------------------------
 * The run
 * ------------------------------------------------------------------------- */

typedef struct bench_run bench_run;

/* One worker thread. */
typedef struct {
	bench_run *run;       /* the run */
	unsigned id;          /* 0.. */
	shardkv_client *c;    /* its handle (shared with other workers when C < T) */
	pthread_t th;         /* the thread */
	bool started;         /* th was created */
	pthread_mutex_t mu;   /* protects tally */
	kv_bench_tally tally; /* calls finished since the last drain */
	uint64_t rng;         /* RNG state */
	route_tab *rt;        /* the range map in use (a reference) */
	uint64_t rt_gen;      /* its generation */
	uint8_t *keybuf;      /* room for max(batch, load batch) keys */
	shardkv_bytes *keys;  /* views of keybuf */
	shardkv_bytes *vals;  /* views of val */
	uint8_t *val;         /* one value */
	unsigned load_batch;  /* keys per load mput */
	uint64_t backlog;     /* open loop: operations still due at the end */
	void *async;          /* --async: the callers' shared state while they run */
	int fatal;            /* SHARDKV_ENOMEM when the tally could not grow */
} bench_worker;

struct bench_run {
	const kv_bench_params *p;       /* parameters */
	kv_bench_result *res;           /* where the results go */
	size_t plen;                    /* keys start with p->key_prefix's first plen bytes
	                                   (0 or all of it) */
	zipf_gen zipf;                  /* with --dist zipf */
	unsigned nops_total;            /* sum of the mix weights */
	uint64_t t0;                    /* start of the measured phase (ns) */
	uint64_t deadline;              /* with --duration: t0 + duration (ns) */
	atomic_bool stop;               /* workers stop */
	atomic_uint_fast64_t claimed;   /* --ops / --load: operations or keys claimed */
	atomic_uint_fast64_t load_done; /* --load: keys written */
	atomic_uint_fast64_t load_err;  /* --load: keys that failed */
	FILE *prog;                     /* progress lines */
	FILE *err;                      /* error messages */
	shardkv_client *admin;          /* the poller's handle */
	unsigned nw;                    /* workers */
	bench_worker *w;                /* workers */
	unsigned nc;                    /* handles */
	shardkv_client **conns;         /* handles */

	pthread_mutex_t mu; /* protects done and signals cv */
	pthread_cond_t cv;  /* done changed */
	bool done;          /* the reporter and poller exit */

	FILE *slow;            /* --slow-log; NULL: none */
	uint64_t slow_ns;      /* its threshold */
	int64_t real_off_ns;   /* CLOCK_REALTIME - CLOCK_MONOTONIC at the start */
	pthread_mutex_t sl_mu; /* protects the writes to slow */

	pthread_mutex_t rt_mu;       /* protects rt */
	route_tab *rt;               /* the latest range map (a reference) */
	atomic_uint_fast64_t rt_gen; /* bumped on every new rt */
	atomic_uint_fast64_t epoch;  /* latest epoch seen */
	atomic_uint migrations;      /* migrations in flight seen */

	pthread_mutex_t ev_mu;    /* protects res->events, res->nodes, nodes_seen */
	size_t events_printed;    /* reporter: events already printed */
	shardkv_config *last_cfg; /* poller: the previous configuration */

	kv_bench_tally sec; /* reporter: the current second */
	uint64_t last_tick; /* reporter: end of the last point (ns) */
};

/* Waits on the run's condition until abs_ns (monotonic) or done. Returns
 * whether the run is done. */
static bool
wait_until(bench_run *r, uint64_t abs_ns)
{
	struct timespec ts = {.tv_sec = (time_t)(abs_ns / 1000000000u),
	                      .tv_nsec = (long)(abs_ns % 1000000000u)};
	bool done;

	pthread_mutex_lock(&r->mu);
	while (!r->done && now_ns() < abs_ns) {
		/* Wake every 100 ms at most so that a signal is noticed. */
		uint64_t slice = now_ns() + 100000000u;
		struct timespec s = {.tv_sec = (time_t)(slice / 1000000000u),
		                     .tv_nsec = (long)(slice % 1000000000u)};
		if (bench_interrupted)
			break;
		pthread_cond_timedwait(&r->cv, &r->mu, slice < abs_ns ? &s : &ts);
	}
	done = r->done;
	pthread_mutex_unlock(&r->mu);
	return done;
}

/* Draws a key index by --dist. */
static uint64_t
pick_index(const bench_run *r, uint64_t *rng)
{
	uint64_t x = rng_next(rng);

	if (r->p->dist.zipf)
		return zipf_next(&r->zipf, (double)(x >> 11) * 0x1.0p-53);
	return x % r->p->keys;
}

/* The bytes of the key prefix that keys carry: all of --key-prefix, or none
 * when key_size leaves no room for it. */
static size_t
key_plen(const kv_bench_params *p)
{
	return p->key_size >= strlen(p->key_prefix) + digits(p->keys - 1) ? strlen(p->key_prefix)
	                                                                  : 0;
}

uint64_t
kv_bench_first_index_at(const kv_bench_params *p, const void *start, size_t slen)
{
	uint8_t k[MAX_KEY_SIZE];
	size_t plen = key_plen(p);
	uint64_t lo = 0, hi = p->keys;

	if (p->key_size > MAX_KEY_SIZE)
		return 0;
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		size_t l = slen < p->key_size ? slen : p->key_size;
		key_fill(k, p->key_size, p->key_prefix, plen, mid);
		int c = l ? memcmp(k, start, l) : 0;
		if (c < 0 || (c == 0 && p->key_size < slen))
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Fills n keys, key_size bytes apart, for one call. The first is drawn by
 * --dist; with --one-range the others are uniform among the keys of the
 * range that holds the first under t (redis-benchmark --cluster likewise
 * keeps a pipeline on one slot), else each is drawn by --dist. */
static void
fill_call_keys(const bench_run *r, const route_tab *t, uint64_t *rng, uint8_t *keys, unsigned n)
{
	const kv_bench_params *p = r->p;
	uint64_t first = pick_index(r, rng), lo = 0, hi = p->keys;

	key_fill(keys, p->key_size, p->key_prefix, r->plen, first);
	if (p->one_range && n > 1 && t != NULL && t->first != NULL) {
		size_t j = route_slot(t, keys, p->key_size);
		if (j > 0)
			lo = t->first[j - 1];
		if (j < t->n)
			hi = t->first[j];
		if (first < lo || first >= hi) /* cannot be; stay safe */
			lo = 0, hi = p->keys;
	}
	for (unsigned i = 1; i < n; i++) {
		uint64_t idx = p->one_range ? lo + rng_next(rng) % (hi - lo) : pick_index(r, rng);
		key_fill(keys + (size_t)i * p->key_size, p->key_size, p->key_prefix, r->plen, idx);
	}
}

static int
pick_op(bench_run *r, bench_worker *w)
{
	unsigned x = (unsigned)(rng_next(&w->rng) % r->nops_total);

	for (int i = 0; i < KV_BENCH_NOPS; i++) {
		if (x < r->p->mix[i])
			return i;
		x -= r->p->mix[i];
	}
	return KV_BENCH_GET;
}

/* Number of keys a call of op carries. */
static unsigned
op_keys(const kv_bench_params *p, int op)
{
	switch (op) {
	case KV_BENCH_GET:
	case KV_BENCH_PUT:
	case KV_BENCH_MGET:
	case KV_BENCH_MPUT:
		return p->batch;
	default:
		return 1;
	}
}

/* The --slow-log name of a call's result: "ok", "miss" (a single-key call
 * whose key was missing) or the first error's name. */
static const char *
slow_result(uint64_t nerr, int err, bool miss)
{
	if (nerr)
		return err != 0 ? kv_bench_err_name(err) : "other";
	return miss ? "miss" : "ok";
}

/* Whether a call that took lat ns goes to the --slow-log. */
static bool
slow_call(const bench_run *r, uint64_t lat)
{
	return r->slow != NULL && lat >= r->slow_ns;
}

/* --slow-log: one line for a slow call (slow_call) of op that was due at
 * start (monotonic ns), took lat ns, carried n keys, went to node (the
 * first key's, by the range map; 0: unknown) and ended with res. Takes
 * only sl_mu, a leaf. */
static void
slow_note(bench_run *r, uint64_t start, uint64_t lat, int op, uint32_t node, unsigned n,
          const char *res)
{
	double at = (double)((int64_t)start + r->real_off_ns) / 1e9;
	pthread_mutex_lock(&r->sl_mu);
	fprintf(r->slow, "%.6f\t%.3f\t%s\t%u\t%u\t%s\n", at, (double)lat / 1e6,
	        kv_bench_op_name(op), node, n, res);
	pthread_mutex_unlock(&r->sl_mu);
}

/* Takes a reference to the latest range map when it changed. */
static void
refresh_route(bench_worker *w)
{
	bench_run *r = w->run;
	uint64_t gen = atomic_load_explicit(&r->rt_gen, memory_order_acquire);

	if (gen == w->rt_gen)
		return;
	pthread_mutex_lock(&r->rt_mu);
	route_tab *t = r->rt;
	if (t)
		atomic_fetch_add(&t->refs, 1);
	gen = atomic_load(&r->rt_gen);
	pthread_mutex_unlock(&r->rt_mu);
	route_unref(w->rt);
	w->rt = t;
	w->rt_gen = gen;
}

/* Issues one call of op with n keys (already in w->keys) and records it. */
static void
do_call(bench_worker *w, int op, unsigned n, uint64_t start_ns)
{
	const kv_bench_params *p = w->run->p;
	uint64_t ok = 0, miss = 0, nerr = 0, lat;
	int rv = 0;
	bool batched = n > 1 || op == KV_BENCH_MGET || op == KV_BENCH_MPUT;

	if ((op == KV_BENCH_GET || op == KV_BENCH_MGET) && batched) {
		shardkv_mget_result *mr = NULL;
		rv = shardkv_mget(w->c, n, w->keys, &mr);
		if ((rv == 0 || rv == SHARDKV_ENOTFOUND) && mr) {
			ok = n;
			miss = mr->nmissing;
			rv = 0;
		} else {
			nerr = n;
		}
		shardkv_mget_result_free(mr);
	} else if ((op == KV_BENCH_PUT || op == KV_BENCH_MPUT) && batched) {
		shardkv_mput_result *pr = NULL;
		rv = shardkv_mput(w->c, n, w->keys, n, w->vals, &pr);
		if (rv == 0) {
			ok = n;
		} else if (pr && pr->nfailed) {
			for (size_t i = 0; i < pr->nfailed; i++)
				nerr += pr->failed[i].nkeys;
			nerr = nerr > n ? n : nerr;
			ok = n - nerr;
		} else {
			nerr = n;
		}
		shardkv_mput_result_free(pr);
	} else if (op == KV_BENCH_GET) {
		shardkv_buf v;
		rv = shardkv_get(w->c, w->keys[0].data, w->keys[0].len, &v);
		if (rv == 0)
			shardkv_free(v.data);
	} else if (op == KV_BENCH_PUT) {
		rv = shardkv_put(w->c, w->keys[0].data, w->keys[0].len, w->val, p->value_size);
	} else if (op == KV_BENCH_DEL) {
		rv = shardkv_del(w->c, w->keys[0].data, w->keys[0].len, NULL);
	} else if (op == KV_BENCH_APPEND) {
		rv = shardkv_append(w->c, w->keys[0].data, w->keys[0].len, w->val, p->value_size,
		                    NULL);
	} else {
		shardkv_scan_result *sr = NULL;
		rv = shardkv_scan(w->c, w->keys[0].data, w->keys[0].len, NULL, 0, p->scan_limit,
		                  &sr);
		shardkv_scan_result_free(sr);
	}
	lat = now_ns() - start_ns;
	if (!batched) {
		if (rv == 0) {
			ok = 1;
		} else if (rv == SHARDKV_ENOTFOUND) {
			ok = miss = 1;
			rv = 0;
		} else {
			nerr = 1;
		}
	}
	refresh_route(w);
	if (slow_call(w->run, lat))
		slow_note(w->run, start_ns, lat, op,
		          route_key(w->rt, w->keys[0].data, w->keys[0].len), n,
		          slow_result(nerr, rv, !batched && miss));
	pthread_mutex_lock(&w->mu);
	if (kv_bench_tally_record(&w->tally, op, lat, ok, miss, nerr, rv) != 0)
		w->fatal = SHARDKV_ENOMEM;
	if (ok == n) {
		for (unsigned i = 0; i < n; i++) {
			uint32_t node = route_key(w->rt, w->keys[i].data, w->keys[i].len);
			w->tally.node_ops[node <= KV_BENCH_MAX_NODES ? node : 0]++;
		}
	} else if (ok) {
		w->tally.node_ops[0] += ok; /* a partial mput: which part failed is not known */
	}
	pthread_mutex_unlock(&w->mu);
}

/* --async: one of a worker's callers, with one group of --batch ops (a
 * pipeline of that depth) in flight at a time. */
typedef struct {
	bench_worker *w;            /* its worker */
	int op;                     /* the group's op */
	unsigned n;                 /* ops in the group */
	uint64_t start;             /* when it was issued (ns) */
	atomic_uint_fast64_t first; /* when its first op was answered (ns); 0: none yet */
	uint64_t rng;               /* its own RNG (completions run on library threads) */
	uint8_t *keys;              /* its keys (batch x key_size bytes) */
	atomic_uint left;           /* ops of the group not yet completed */
	atomic_uint ok;             /* answered (misses included) */
	atomic_uint miss;           /* not found */
	atomic_int err;             /* the last error, 0: none */
	atomic_uint nerr;           /* failed */
} async_caller;

/* --async: what a worker's callers share. */
typedef struct {
	pthread_mutex_t mu; /* protects active (w->mu guards w->tally and w->rt) */
	pthread_cond_t cv;  /* active fell to 0 */
	unsigned active;    /* callers with a group in flight */
} async_group;

static void async_issue(async_caller *a, bool fatal);
static void async_group_done(async_caller *a);

/* Drops the issuing thread's extra count of the group (see async_issue). */
static void
async_done_last(async_caller *a)
{
	if (atomic_fetch_sub(&a->left, 1) == 1)
		async_group_done(a);
}

/* One op of a caller's group completed; the last one records the group as
 * one call and issues the next group. */
static void
async_done(void *arg, int status, const void *val, size_t vlen)
{
	async_caller *a = arg;
	uint_fast64_t none = 0;
	(void)val;
	(void)vlen;

	if (a->n > 1 && atomic_load_explicit(&a->first, memory_order_relaxed) == 0)
		atomic_compare_exchange_strong(&a->first, &none, now_ns());
	if (status == 0 || status == SHARDKV_ENOTFOUND) {
		atomic_fetch_add(&a->ok, 1);
		if (status == SHARDKV_ENOTFOUND)
			atomic_fetch_add(&a->miss, 1);
	} else {
		atomic_store(&a->err, status);
		atomic_fetch_add(&a->nerr, 1);
	}
	if (atomic_fetch_sub(&a->left, 1) == 1)
		async_group_done(a);
}

/* Every op of the group is done: records it as one call and issues the next. */
static void
async_group_done(async_caller *a)
{
	bench_worker *w = a->w;
	unsigned ks = w->run->p->key_size;
	uint64_t lat = now_ns() - a->start;
	unsigned ok = atomic_load(&a->ok), nerr = atomic_load(&a->nerr);
	pthread_mutex_lock(&w->mu);
	refresh_route(w);
	if (kv_bench_tally_record(&w->tally, a->op, lat, ok, atomic_load(&a->miss), nerr,
	                          nerr ? atomic_load(&a->err) : 0) != 0)
		w->fatal = SHARDKV_ENOMEM;
	bool slow = slow_call(w->run, lat);
	uint32_t slow_node = slow ? route_key(w->rt, a->keys, ks) : 0;
	uint64_t first = atomic_load(&a->first);
	if (first && kv_bench_tally_record_first(&w->tally, first - a->start) != 0)
		w->fatal = SHARDKV_ENOMEM;
	if (nerr == 0) {
		for (unsigned i = 0; i < a->n; i++) {
			uint32_t node = route_key(w->rt, a->keys + (size_t)i * ks, ks);
			w->tally.node_ops[node <= KV_BENCH_MAX_NODES ? node : 0]++;
		}
	} else {
		w->tally.node_ops[0] += ok;
	}
	bool fatal = w->fatal != 0;
	pthread_mutex_unlock(&w->mu);
	if (slow)
		slow_note(w->run, a->start, lat, a->op, slow_node, a->n,
		          slow_result(nerr, nerr ? atomic_load(&a->err) : 0,
		                      a->n == 1 && atomic_load(&a->miss)));
	async_issue(a, fatal);
}

/* Issues the caller's next group, or retires it when the run is over. */
static void
async_issue(async_caller *a, bool fatal)
{
	bench_worker *w = a->w;
	bench_run *r = w->run;
	const kv_bench_params *p = r->p;
	async_group *g = (async_group *)w->async;

	while (
	    !(atomic_load_explicit(&r->stop, memory_order_relaxed) || bench_interrupted || fatal)) {
		unsigned n = p->batch, taken = 0;
		if (p->ops) {
			uint64_t prev = atomic_fetch_add(&r->claimed, n);
			if (prev >= p->ops)
				break;
			if (prev + n > p->ops)
				n = (unsigned)(p->ops - prev); /* the last group is cut to fit */
		}
		unsigned pick = (unsigned)(rng_next(&a->rng) % r->nops_total);
		a->op = KV_BENCH_GET;
		for (int i = 0; i < KV_BENCH_NOPS; i++) {
			if (pick < p->mix[i]) {
				a->op = i;
				break;
			}
			pick -= p->mix[i];
		}
		route_tab *t = NULL;
		if (p->one_range) {
			pthread_mutex_lock(&w->mu);
			refresh_route(w);
			if ((t = w->rt) != NULL)
				atomic_fetch_add(&t->refs, 1);
			pthread_mutex_unlock(&w->mu);
		}
		fill_call_keys(r, t, &a->rng, a->keys, n);
		route_unref(t);
		a->n = n;
		atomic_store(&a->first, 0);
		atomic_store(&a->ok, 0);
		atomic_store(&a->miss, 0);
		atomic_store(&a->nerr, 0);
		atomic_store(&a->err, 0);
		/* One extra count, dropped below, so that the group cannot
		 * complete before every op of it has been issued. */
		atomic_store(&a->left, n + 1);
		a->start = now_ns();
		for (unsigned i = 0; i < n; i++) {
			const uint8_t *k = a->keys + (size_t)i * p->key_size;
			int rv;
			if (a->op == KV_BENCH_PUT)
				rv = shardkv_put_async(w->c, k, p->key_size, w->val, p->value_size,
				                       async_done, a);
			else if (a->op == KV_BENCH_DEL)
				rv = shardkv_del_async(w->c, k, p->key_size, async_done, a);
			else
				rv = shardkv_get_async(w->c, k, p->key_size, async_done, a);
			if (rv != 0) {
				/* Refused at once: a failed op of the group. */
				atomic_store(&a->err, rv);
				atomic_fetch_add(&a->nerr, 1);
				atomic_fetch_sub(&a->left, 1);
				continue;
			}
			taken++;
		}
		if (taken > 0) {
			async_done_last(a);
			return;
		}
		/* Nothing taken: count the group as failed and stop on a closed
		 * handle, else go on. */
		int err = atomic_load(&a->err);
		pthread_mutex_lock(&w->mu);
		if (kv_bench_tally_record(&w->tally, a->op, now_ns() - a->start, 0, 0, n, err) != 0)
			w->fatal = SHARDKV_ENOMEM;
		fatal = w->fatal != 0;
		pthread_mutex_unlock(&w->mu);
		if (err == SHARDKV_ECLOSED)
			break;
	}
	pthread_mutex_lock(&g->mu);
	if (--g->active == 0)
		pthread_cond_broadcast(&g->cv);
	pthread_mutex_unlock(&g->mu);
}

/* --async: starts the worker's callers and waits until all have retired. */
static void *
async_worker(bench_worker *w)
{
	const kv_bench_params *p = w->run->p;
	async_group g = {.active = p->async};
	async_caller *a = calloc(p->async, sizeof(*a));
	uint8_t *keys = calloc((size_t)p->async * p->batch, p->key_size);

	if (a == NULL || keys == NULL) {
		free(a);
		free(keys);
		w->fatal = SHARDKV_ENOMEM;
		return NULL;
	}
	pthread_mutex_init(&g.mu, NULL);
	pthread_cond_init(&g.cv, NULL);
	w->async = &g;
	for (unsigned i = 0; i < p->async; i++) {
		a[i].w = w;
		a[i].rng = splitmix(w->rng + i + 1);
		a[i].keys = keys + (size_t)i * p->batch * p->key_size;
	}
	for (unsigned i = 0; i < p->async; i++)
		async_issue(&a[i], false);
	pthread_mutex_lock(&g.mu);
	while (g.active > 0)
		pthread_cond_wait(&g.cv, &g.mu);
	pthread_mutex_unlock(&g.mu);
	w->async = NULL;
	pthread_cond_destroy(&g.cv);
	pthread_mutex_destroy(&g.mu);
	free(keys);
	free(a);
	return NULL;
}

double
kv_bench_due_ns(double rate, unsigned ops_per_call, unsigned threads, unsigned id, uint64_t n)
{
	if (rate <= 0 || threads == 0)
		return 0;
	double period = 1e9 * (double)threads / rate * (double)(ops_per_call ? ops_per_call : 1);
	return period * ((double)n + (double)(id % threads) / (double)threads);
}

static void *
worker_main(void *arg)
{
	bench_worker *w = arg;
	bench_run *r = w->run;
	const kv_bench_params *p = r->p;
	if (p->async)
		return async_worker(w);
	double ns_per_op = p->rate > 0 ? 1e9 * (double)r->nw / p->rate : 0;
	/* Open loop: this worker's calls are due on its own phase of the
	 * schedule (kv_bench_due_ns), so that the workers' calls interleave. */
	double sched = (double)r->t0 +
	               (ns_per_op > 0 ? kv_bench_due_ns(p->rate, p->batch, r->nw, w->id, 0) : 0);

	while (!atomic_load_explicit(&r->stop, memory_order_relaxed) && !bench_interrupted &&
	       !w->fatal) {
		int op = pick_op(r, w);
		unsigned n = op_keys(p, op);
		uint64_t start;

		if (p->ops) {
			uint64_t prev = atomic_fetch_add(&r->claimed, n);
			if (prev >= p->ops)
				break;
			if (prev + n > p->ops && n > 1)
				n = (unsigned)(p->ops - prev); /* the last batch is cut to fit */
		}
		if (p->one_range)
			refresh_route(w);
		fill_call_keys(r, w->rt, &w->rng, w->keybuf, n);
		if (ns_per_op > 0) {
			/* Open loop: the call is due at sched whatever happened before. */
			uint64_t due = (uint64_t)sched;
			sched += ns_per_op * n;
			if (r->deadline && due >= r->deadline)
				break;
			for (uint64_t t; (t = now_ns()) < due && !atomic_load(&r->stop) &&
			                 !bench_interrupted;) {
				uint64_t left = due - t;
				struct timespec ts = {
				    0, (long)(left < 100000000u ? left : 100000000u)};
				nanosleep(&ts, NULL);
			}
			if (atomic_load(&r->stop) || bench_interrupted)
				break;
			start = due;
		} else {
			start = now_ns();
		}
		do_call(w, op, n, start);
	}
	if (ns_per_op > 0) {
		uint64_t end = r->deadline && now_ns() > r->deadline ? r->deadline : now_ns();
		if ((double)end > sched)
			w->backlog = (uint64_t)(((double)end - sched) / ns_per_op);
	}
	return NULL;
}

static void *
load_main(void *arg)
{
	bench_worker *w = arg;
	bench_run *r = w->run;
	const kv_bench_params *p = r->p;

	while (!bench_interrupted && !atomic_load(&r->stop)) {
		uint64_t first = atomic_fetch_add(&r->claimed, w->load_batch);
		if (first >= p->keys)
			break;
		size_t n =
		    p->keys - first < w->load_batch ? (size_t)(p->keys - first) : w->load_batch;
		for (size_t i = 0; i < n; i++)
			key_fill(w->keybuf + i * p->key_size, p->key_size, r->p->key_prefix,
			         r->plen, first + i);
		shardkv_mput_result *pr = NULL;
		int rv = shardkv_mput(w->c, n, w->keys, n, w->vals, &pr);
		uint64_t failed = 0;
		if (rv != 0) {
			failed = n;
			if (pr && pr->nfailed) {
				failed = 0;
				for (size_t i = 0; i < pr->nfailed; i++)
					failed += pr->failed[i].nkeys;
			}
		}
		shardkv_mput_result_free(pr);
		atomic_fetch_add(&r->load_done, n - (failed < n ? failed : n));
		atomic_fetch_add(&r->load_err, failed < n ? failed : n);
	}
	return NULL;
}

/* Drains every worker's tally into r->sec. */
static void
drain_workers(bench_run *r)
{
	for (unsigned i = 0; i < r->nw; i++) {
		bench_worker *w = &r->w[i];
		pthread_mutex_lock(&w->mu);
		if (kv_bench_tally_merge(&r->sec, &w->tally) == 0)
			kv_bench_tally_reset(&w->tally);
		pthread_mutex_unlock(&w->mu);
	}
}

static void
print_new_events(bench_run *r)
{
	pthread_mutex_lock(&r->ev_mu);
	for (; r->events_printed < r->res->nevents; r->events_printed++) {
		const kv_bench_event *e = &r->res->events[r->events_printed];
		fprintf(r->prog, "[%6.1fs] event %s at epoch %" PRIu64 ": %s\n", e->t, e->kind,
		        e->epoch, e->detail);
	}
	pthread_mutex_unlock(&r->ev_mu);
}

/* Closes the current point at time `t_ns`: drains the workers, adds the
 * point to the series and the second to the total, prints the line. */
static void
close_point(bench_run *r, uint64_t t_ns)
{
	kv_bench_point pt = {0};
	kv_hdr *h;

	drain_workers(r);
	pt.t = (double)(t_ns - r->t0) / 1e9;
	pt.dt = (double)(t_ns - r->last_tick) / 1e9;
	pt.ops = kv_bench_tally_ops(&r->sec);
	for (int i = 0; i < KV_BENCH_NOPS; i++)
		pt.op_ops[i] = r->sec.ops[i];
	pt.errors = kv_bench_tally_errors(&r->sec);
	if ((h = tally_all(&r->sec)) != NULL) {
		pt.p50_us = (double)kv_hdr_percentile(h, 50) / 1000.0;
		pt.p99_us = (double)kv_hdr_percentile(h, 99) / 1000.0;
		pt.max_us = (double)kv_hdr_max(h) / 1000.0;
		/* Out of memory the second has no buckets; its figures stay. */
		(void)kv_bench_buckets(h, &pt.hist, &pt.nhist);
		kv_hdr_destroy(h);
	}
	pt.epoch = atomic_load(&r->epoch);
	pt.migrations = atomic_load(&r->migrations);
	r->last_tick = t_ns;
	kv_bench_tally_merge(&r->res->total, &r->sec);
	kv_bench_tally_reset(&r->sec);
	if (pt.dt <= 0.001 && pt.ops == 0 && pt.errors == 0) {
		free(pt.hist);
		return; /* an empty sliver at the very end */
	}
	kv_bench_result_add_point(r->res, &pt);
	print_new_events(r);
	fprintf(r->prog,
	        "[%6.1fs] %10.0f ops/s  p50 %8.1f us  p99 %8.1f us  errors %" PRIu64
	        "  epoch %" PRIu64 "%s",
	        pt.t, pt.dt > 0 ? (double)pt.ops / pt.dt : 0, pt.p50_us, pt.p99_us, pt.errors,
	        pt.epoch, pt.migrations ? "" : "\n");
	if (pt.migrations)
		fprintf(r->prog, "  migrating %u\n", pt.migrations);
	fflush(r->prog);
}

static void *
reporter_main(void *arg)
{
	bench_run *r = arg;

	kv_log_thread_name("bench-report");
	for (uint64_t k = 1;; k++) {
		uint64_t tick = r->t0 + k * 1000000000u;
		bool at_deadline = r->deadline && tick >= r->deadline;
		if (at_deadline)
			tick = r->deadline;
		if (wait_until(r, tick) || bench_interrupted)
			break;
		if (at_deadline) {
			atomic_store(&r->stop, true);
			break;
		}
		close_point(r, tick);
	}
	atomic_store(&r->stop, true);
	return NULL;
}

/* Formats [start, end) of a range for an event detail. */
static void
range_str(char *buf, size_t len, const shardkv_buf *s, const shardkv_buf *e)
{
	char a[48], b[48];

	kv_cli_json_escape(s->data, s->len < 40 ? s->len : 40, a, sizeof(a));
	kv_cli_json_escape(e->data, e->len < 40 ? e->len : 40, b, sizeof(b));
	snprintf(buf, len, "[\"%s\", \"%s\")", a, b);
}

static const shardkv_node *
find_node(const shardkv_config *c, uint32_t id)
{
	for (size_t i = 0; c && i < c->nnodes; i++)
		if (c->nodes[i].id == id)
			return &c->nodes[i];
	return NULL;
}

static bool
has_migration(const shardkv_config *c, uint64_t id)
{
	for (size_t i = 0; c && i < c->nmigrations; i++)
		if (c->migrations[i].id == id)
			return true;
	return false;
}

static bool
ranges_differ(const shardkv_config *a, const shardkv_config *b)
{
	if (a->nranges != b->nranges)
		return true;
	for (size_t i = 0; i < a->nranges; i++) {
		const shardkv_range *x = &a->ranges[i], *y = &b->ranges[i];
		if (x->node != y->node || x->start.len != y->start.len ||
		    (x->start.len && memcmp(x->start.data, y->start.data, x->start.len) != 0))
			return true;
	}
	return false;
}

/* Records an event at time t (called with ev_mu held). */
static void
add_event_locked(bench_run *r, double t, uint64_t epoch, const char *kind, const char *detail)
{
	kv_bench_event e = {.t = t, .epoch = epoch};

	snprintf(e.kind, sizeof(e.kind), "%s", kind);
	snprintf(e.detail, sizeof(e.detail), "%s", detail);
	kv_bench_result_add_event(r->res, &e);
}

/* Takes in a new configuration: routing, node names, events. Takes cfg. */
static void
poller_take(bench_run *r, shardkv_config *cfg, bool first)
{
	const shardkv_config *old = r->last_cfg;
	double t = r->t0 ? (double)(int64_t)(now_ns() - r->t0) / 1e9 : 0;
	char d[160], rs[120];
	bool node_event = false;

	if (old == NULL || old->epoch != cfg->epoch) {
		route_tab *t2 = route_build(cfg);
		if (t2 && r->p->one_range && t2->n > 0) {
			/* Each range's first key index, for fill_call_keys. */
			if ((t2->first = malloc(t2->n * sizeof(*t2->first))) == NULL) {
				route_unref(t2);
				t2 = NULL;
			}
			for (size_t i = 0; t2 && i < t2->n; i++)
				t2->first[i] =
				    kv_bench_first_index_at(r->p, t2->r[i].start, t2->r[i].len);
		}
		if (t2) {
			pthread_mutex_lock(&r->rt_mu);
			route_tab *prev = r->rt;
			r->rt = t2;
			atomic_fetch_add(&r->rt_gen, 1);
			pthread_mutex_unlock(&r->rt_mu);
			route_unref(prev);
		}
	}
	atomic_store(&r->epoch, cfg->epoch);
	atomic_store(&r->migrations, (unsigned)cfg->nmigrations);
	pthread_mutex_lock(&r->ev_mu);
	for (size_t i = 0; i < cfg->nnodes && r->res->nnodes < KV_BENCH_MAX_NODES; i++) {
		size_t j;
		for (j = 0; j < r->res->nnodes; j++)
			if (r->res->nodes[j].id == cfg->nodes[i].id)
				break;
		if (j == r->res->nnodes)
			r->res->nnodes++;
		r->res->nodes[j].id = cfg->nodes[i].id;
		if (!first && cfg->nodes[i].has_stats) {
			/* The server's own count (every client's ops, not only ours). */
			r->res->nodes[j].server_ops_sum += cfg->nodes[i].ops_per_sec;
			r->res->nodes[j].server_polls++;
		}
		snprintf(r->res->nodes[j].address, sizeof(r->res->nodes[j].address), "%s",
		         cfg->nodes[i].address ? cfg->nodes[i].address : "");
	}
	if (!first && old) {
		for (size_t i = 0; i < cfg->nnodes; i++) {
			const shardkv_node *n = &cfg->nodes[i], *o = find_node(old, n->id);
			if (o == NULL) {
				snprintf(d, sizeof(d), "node %" PRIu32 " %s joined (%s)", n->id,
				         n->address, shardkv_node_state_name(n->state));
				add_event_locked(r, t, cfg->epoch, "join", d);
				node_event = true;
			} else if (o->state != n->state && (n->state == SHARDKV_NODE_DRAINING ||
			                                    n->state == SHARDKV_NODE_GONE)) {
				snprintf(d, sizeof(d), "node %" PRIu32 " %s is %s", n->id,
				         n->address, shardkv_node_state_name(n->state));
				add_event_locked(r, t, cfg->epoch, "leave", d);
				node_event = true;
			}
		}
		for (size_t i = 0; i < old->nnodes; i++)
			if (find_node(cfg, old->nodes[i].id) == NULL) {
				snprintf(d, sizeof(d), "node %" PRIu32 " %s removed",
				         old->nodes[i].id, old->nodes[i].address);
				add_event_locked(r, t, cfg->epoch, "leave", d);
				node_event = true;
			}
		if (old->epoch != cfg->epoch && !node_event) {
			snprintf(d, sizeof(d), "%s (epoch %" PRIu64 " -> %" PRIu64 ")",
			         ranges_differ(old, cfg) ? "range owners changed"
			                                 : "new configuration",
			         old->epoch, cfg->epoch);
			add_event_locked(r, t, cfg->epoch,
			                 ranges_differ(old, cfg) ? "move" : "epoch", d);
		}
		for (size_t i = 0; i < cfg->nmigrations; i++) {
			const shardkv_migration *m = &cfg->migrations[i];
			if (has_migration(old, m->id))
				continue;
			range_str(rs, sizeof(rs), &m->start, &m->end);
			snprintf(d, sizeof(d), "#%" PRIu64 " %s node %" PRIu32 " -> %" PRIu32,
			         m->id, rs, m->from, m->to);
			add_event_locked(r, t, cfg->epoch, "migration_start", d);
		}
		for (size_t i = 0; i < old->nmigrations; i++) {
			const shardkv_migration *m = &old->migrations[i];
			if (has_migration(cfg, m->id))
				continue;
			range_str(rs, sizeof(rs), &m->start, &m->end);
			snprintf(d, sizeof(d), "#%" PRIu64 " %s node %" PRIu32 " -> %" PRIu32,
			         m->id, rs, m->from, m->to);
			add_event_locked(r, t, cfg->epoch, "migration_end", d);
		}
	}
	pthread_mutex_unlock(&r->ev_mu);
	shardkv_config_free(r->last_cfg);
	r->last_cfg = cfg;
}

/* Fetches the status, or the configuration when the status fails. */
static int
poll_config(bench_run *r, shardkv_config **out)
{
	int rv = shardkv_status(r->admin, out);
	/* An unreachable or refusing controller would only fail again. */
	if (rv != 0 && rv != SHARDKV_EAUTH && rv != SHARDKV_EUNAVAIL && rv != SHARDKV_ETIMEDOUT)
		rv = shardkv_config_get(r->admin, 0, out);
	return rv;
}

static void *
poller_main(void *arg)
{
	bench_run *r = arg;

	kv_log_thread_name("bench-poll");
	for (;;) {
		uint64_t next = now_ns() + 1000000000u;
		shardkv_config *cfg;
		if (wait_until(r, next))
			break;
		if (poll_config(r, &cfg) != 0)
			continue;
		/* Epochs published between two polls (a short migration starts and
		 * ends in two of them): diff them one by one, at most 32. */
		uint64_t from = r->last_cfg ? r->last_cfg->epoch + 1 : cfg->epoch;
		if (cfg->epoch > from + 32)
			from = cfg->epoch - 32;
		for (uint64_t e = from; e < cfg->epoch; e++) {
			shardkv_config *mid;
			if (shardkv_config_get(r->admin, e, &mid) == 0)
				poller_take(r, mid, false);
		}
		poller_take(r, cfg, false);
	}
	return NULL;
}

/* ---------------------------------------------------------------------------
 * Reports
 * ------------------------------------------------------------------------- */

static void
json_str(FILE *f, const char *s)
{
	char buf[256];
	size_t n = strlen(s);

	fputc('"', f);
	for (size_t off = 0; off < n; off += 36) {
		size_t k = n - off < 36 ? n - off : 36;
		kv_cli_json_escape(s + off, k, buf, sizeof(buf));
		fputs(buf, f);
	}
	fputc('"', f);
}

static double
per_sec(uint64_t n, double s)
{
	return s > 0 ? (double)n / s : 0;
}

static double
us(uint64_t ns)
{
	return (double)ns / 1000.0;
}

static void
json_latency(FILE *f, const kv_hdr *h)
{
	if (h == NULL || kv_hdr_count(h) == 0) {
		fprintf(f, "{\"count\": 0, \"min\": 0, \"mean\": 0, \"p50\": 0, \"p90\": 0, "
		           "\"p99\": 0, \"p999\": 0, \"max\": 0}");
		return;
	}
	fprintf(f,
	        "{\"count\": %" PRIu64 ", \"min\": %.1f, \"mean\": %.1f, \"p50\": %.1f, "
	        "\"p90\": %.1f, \"p99\": %.1f, \"p999\": %.1f, \"max\": %.1f}",
	        kv_hdr_count(h), us(kv_hdr_min(h)), kv_hdr_mean(h) / 1000.0,
	        us(kv_hdr_percentile(h, 50)), us(kv_hdr_percentile(h, 90)),
	        us(kv_hdr_percentile(h, 99)), us(kv_hdr_percentile(h, 99.9)), us(kv_hdr_max(h)));
}

static void
first_line(char *buf, size_t len, const char *path)
{
	FILE *f = fopen(path, "r");

	buf[0] = 0;
	if (f == NULL)
		return;
	if (fgets(buf, (int)len, f) == NULL)
		buf[0] = 0;
	fclose(f);
	buf[strcspn(buf, "\n")] = 0;
}

/* Writes the machine description as a JSON object. */
static void
json_machine(FILE *f)
{
	struct utsname u;
	char host[256] = "", cpu[256] = "", os[256] = "", line[512];
	long ncpu = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES),
	     psize = sysconf(_SC_PAGESIZE);
	FILE *ci = fopen("/proc/cpuinfo", "r");

	if (gethostname(host, sizeof(host) - 1) != 0)
		host[0] = 0;
	if (ci) {
		while (fgets(line, sizeof(line), ci))
			if (strncmp(line, "model name", 10) == 0 && strchr(line, ':')) {
				const char *v = strchr(line, ':') + 1;
				while (*v == ' ' || *v == '\t')
					v++;
				snprintf(cpu, sizeof(cpu), "%s", v);
				cpu[strcspn(cpu, "\n")] = 0;
				break;
			}
		fclose(ci);
	}
	FILE *osr = fopen("/etc/os-release", "r");
	if (osr) {
		while (fgets(line, sizeof(line), osr))
			if (strncmp(line, "PRETTY_NAME=", 12) == 0) {
				char *v = line + 12;
				v[strcspn(v, "\n")] = 0;
				if (*v == '"')
					v++;
				if (*v && v[strlen(v) - 1] == '"')
					v[strlen(v) - 1] = 0;
				snprintf(os, sizeof(os), "%s", v);
			}
		fclose(osr);
	}
	if (uname(&u) != 0)
		memset(&u, 0, sizeof(u));
	first_line(line, sizeof(line), "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor");
	fprintf(f, "{\"hostname\": ");
	json_str(f, host);
	fprintf(f, ", \"os\": ");
	json_str(f, os);
	fprintf(f, ", \"kernel\": ");
	json_str(f, u.release);
	fprintf(f, ", \"arch\": ");
	json_str(f, u.machine);
	fprintf(f, ", \"cpu_model\": ");
	json_str(f, cpu);
	fprintf(f, ", \"cpus\": %ld, \"memory_bytes\": %lld, \"cpu_governor\": ", ncpu,
	        pages > 0 && psize > 0 ? (long long)pages * psize : 0LL);
	json_str(f, line);
	fprintf(f, ", \"loadavg\": ");
	first_line(line, sizeof(line), "/proc/loadavg");
	json_str(f, line);
	fputc('}', f);
}

static void
json_params(FILE *f, const kv_bench_params *p)
{
	fprintf(f, "{\"controller\": ");
	json_str(f, p->controller ? p->controller : "");
	fprintf(f,
	        ", \"threads\": %u, \"connections\": %u, \"keys\": %" PRIu64
	        ", \"key_size\": %u, \"value_size\": %zu, \"key_prefix\": ",
	        p->threads, p->connections, p->keys, p->key_size, p->value_size);
	json_str(f, p->key_prefix ? p->key_prefix : "");
	fprintf(f, ", \"mix\": {");
	for (int i = 0, k = 0; i < KV_BENCH_NOPS; i++)
		if (p->mix[i])
			fprintf(f, "%s\"%s\": %u", k++ ? ", " : "", op_names[i], p->mix[i]);
	fprintf(f, "}, \"mix_spec\": ");
	json_str(f, p->mix_str);
	fprintf(f,
	        ", \"batch\": %u, \"async\": %u, \"scan_limit\": %u, \"duration_s\": %.3f, "
	        "\"ops\": %" PRIu64 ", \"load\": %s, \"mode\": \"%s\", \"rate\": %.3f, \"dist\": ",
	        p->batch, p->async, p->scan_limit, p->duration_s, p->ops,
	        p->load ? "true" : "false", p->rate > 0 ? "open" : "closed", p->rate);
	json_str(f, p->dist_str);
	fprintf(f, ", \"one_range\": %s", p->one_range ? "true" : "false");
	fprintf(f, ", \"zipf_theta\": %.4f, \"seed\": %" PRIu64 ", \"timeout_ms\": %" PRIu32,
	        p->dist.zipf ? p->dist.theta : 0.0, p->seed, p->timeout_ms);
	fprintf(f, ", \"out\": ");
	json_str(f, p->out_path ? p->out_path : "");
	fprintf(f, ", \"plot\": ");
	json_str(f, p->plot_path ? p->plot_path : "");
	fprintf(f, ", \"slow_log\": ");
	json_str(f, p->slow_path ? p->slow_path : "");
	fprintf(f, ", \"slow_us\": %" PRIu64, p->slow_us);
	fputc('}', f);
}

void
kv_bench_write_json(FILE *f, const kv_bench_result *r)
{
	const kv_bench_tally *t = &r->total;
	uint64_t ops = kv_bench_tally_ops(t), errs = kv_bench_tally_errors(t), misses = 0,
	         calls = 0;
	kv_hdr *all = tally_all(t);
	bool first;

	for (int i = 0; i < KV_BENCH_NOPS; i++) {
		misses += t->misses[i];
		calls += t->calls[i];
	}
	fprintf(f,
	        "{\"ops_per_sec\": %.1f, \"ops\": %" PRIu64 ", \"errors\": %" PRIu64
	        ", \"misses\": %" PRIu64 ", \"calls\": %" PRIu64 ", \"duration_s\": %.6f, "
	        "\"started_at\": \"%s\", \"version\": \"%d.%d\", \"latency_us\": ",
	        per_sec(ops, r->elapsed_s), ops, errs, misses, calls, r->elapsed_s, r->started_at,
	        SHARDKV_VERSION_MAJOR, SHARDKV_VERSION_MINOR);
	json_latency(f, all);
	kv_hdr_destroy(all);
	if (t->first && kv_hdr_count(t->first)) {
		fprintf(f, ", \"latency_first_us\": ");
		json_latency(f, t->first);
	}
	fprintf(f, ", \"per_op\": {");
	first = true;
	for (int i = 0; i < KV_BENCH_NOPS; i++) {
		if (r->params && r->params->mix[i] == 0 && t->calls[i] == 0)
			continue;
		fprintf(f,
		        "%s\"%s\": {\"ops_per_sec\": %.1f, \"ops\": %" PRIu64
		        ", \"calls\": %" PRIu64 ", \"errors\": %" PRIu64 ", \"misses\": %" PRIu64
		        ", \"latency_us\": ",
		        first ? "" : ", ", op_names[i], per_sec(t->ops[i], r->elapsed_s), t->ops[i],
		        t->calls[i], t->errors[i], t->misses[i]);
		json_latency(f, t->lat[i]);
		fputc('}', f);
		first = false;
	}
	fprintf(f, "}, \"errors_by_kind\": {");
	first = true;
	for (int i = 0; i < KV_BENCH_NERR; i++)
		if (t->err_kind[i]) {
			fprintf(f, "%s\"%s\": %" PRIu64, first ? "" : ", ", err_names[i],
			        t->err_kind[i]);
			first = false;
		}
	fprintf(f, "}, \"per_node\": [");
	first = true;
	for (size_t i = 0; i < r->nnodes; i++) {
		uint32_t id = r->nodes[i].id;
		uint64_t n = id <= KV_BENCH_MAX_NODES ? t->node_ops[id] : 0;
		fprintf(f, "%s{\"id\": %" PRIu32 ", \"address\": ", first ? "" : ", ", id);
		json_str(f, r->nodes[i].address);
		fprintf(f, ", \"ops\": %" PRIu64 ", \"ops_per_sec\": %.1f", n,
		        per_sec(n, r->elapsed_s));
		if (r->nodes[i].server_polls)
			fprintf(f, ", \"server_ops_per_sec\": %.1f}",
			        r->nodes[i].server_ops_sum / r->nodes[i].server_polls);
		else
			fprintf(f, ", \"server_ops_per_sec\": null}");
		first = false;
	}
	if (t->node_ops[0])
		fprintf(f,
		        "%s{\"id\": 0, \"address\": \"unknown\", \"ops\": %" PRIu64
		        ", \"ops_per_sec\": %.1f}",
		        first ? "" : ", ", t->node_ops[0], per_sec(t->node_ops[0], r->elapsed_s));
	fprintf(f,
	        "], \"per_node_method\": \"ops: keys routed by the range map polled every second; "
	        "server_ops_per_sec: the mean of what the status reported (every client's ops)\"");
	if (r->loaded)
		fprintf(f,
		        ", \"load\": {\"keys\": %" PRIu64 ", \"errors\": %" PRIu64
		        ", \"seconds\": %.3f, \"keys_per_sec\": %.1f}",
		        r->load_keys, r->load_errors, r->load_s, per_sec(r->load_keys, r->load_s));
	else
		fprintf(f, ", \"load\": null");
	if (r->params && r->params->rate > 0)
		fprintf(f, ", \"open_loop_backlog_ops\": %" PRIu64, r->backlog);
	fprintf(f, ", \"params\": ");
	if (r->params)
		json_params(f, r->params);
	else
		fprintf(f, "{}");
	fprintf(f, ", \"machine\": ");
	json_machine(f);
	fprintf(f, ", \"series\": [");
	for (size_t i = 0; i < r->npoints; i++) {
		const kv_bench_point *pt = &r->points[i];
		fprintf(
		    f,
		    "%s{\"t\": %.3f, \"dt\": %.3f, \"ops\": %" PRIu64 ", \"ops_per_sec\": %.1f, "
		    "\"errors\": %" PRIu64 ", \"p50_us\": %.1f, \"p99_us\": %.1f, "
		    "\"max_us\": %.1f, \"epoch\": %" PRIu64 ", \"migrations\": %u, \"per_op\": {",
		    i ? ", " : "", pt->t, pt->dt, pt->ops, per_sec(pt->ops, pt->dt), pt->errors,
		    pt->p50_us, pt->p99_us, pt->max_us, pt->epoch, pt->migrations);
		first = true;
		for (int k = 0; k < KV_BENCH_NOPS; k++) {
			if (r->params && r->params->mix[k] == 0 && pt->op_ops[k] == 0)
				continue;
			fprintf(f, "%s\"%s\": %.1f", first ? "" : ", ", op_names[k],
			        per_sec(pt->op_ops[k], pt->dt));
			first = false;
		}
		fprintf(f, "}, \"hist\": [");
		for (size_t k = 0; k < pt->nhist; k++)
			fprintf(f, "%s[%.1f, %" PRIu64 "]", k ? ", " : "", pt->hist[k].us,
			        pt->hist[k].n);
		fprintf(f, "]}");
	}
	fprintf(f, "], \"events\": [");
	for (size_t i = 0; i < r->nevents; i++) {
		const kv_bench_event *e = &r->events[i];
		fprintf(f, "%s{\"t\": %.3f, \"kind\": ", i ? ", " : "", e->t);
		json_str(f, e->kind);
		fprintf(f, ", \"epoch\": %" PRIu64 ", \"detail\": ", e->epoch);
		json_str(f, e->detail);
		fputc('}', f);
	}
	fprintf(f, "]}\n");
}

static void
summary_row(FILE *f, const char *name, uint64_t ops, uint64_t calls, uint64_t errs, double s,
            const kv_hdr *h)
{
	fprintf(f, "  %-7s %11.0f %11" PRIu64 " %10" PRIu64 " %7" PRIu64, name, per_sec(ops, s),
	        ops, calls, errs);
	if (h && kv_hdr_count(h))
		fprintf(f, " %9.1f %9.1f %9.1f %9.1f %9.1f\n", us(kv_hdr_percentile(h, 50)),
		        us(kv_hdr_percentile(h, 90)), us(kv_hdr_percentile(h, 99)),
		        us(kv_hdr_percentile(h, 99.9)), us(kv_hdr_max(h)));
	else
		fprintf(f, " %9s %9s %9s %9s %9s\n", "-", "-", "-", "-", "-");
}

void
kv_bench_write_summary(FILE *f, const kv_bench_result *r)
{
	const kv_bench_tally *t = &r->total;
	uint64_t ops = kv_bench_tally_ops(t), errs = kv_bench_tally_errors(t), misses = 0,
	         calls = 0;
	kv_hdr *all = tally_all(t);
	bool any = false;

	for (int i = 0; i < KV_BENCH_NOPS; i++) {
		misses += t->misses[i];
		calls += t->calls[i];
	}
	/* The load phase's line is not repeated here: the progress stream,
	 * which is this one in human mode, printed it when loading ended. */
	if (r->loaded && r->npoints == 0 && calls == 0) {
		kv_hdr_destroy(all);
		return; /* --load only: nothing was measured */
	}
	fprintf(f,
	        "summary: %" PRIu64 " ops in %.2f s = %.0f ops/s (%" PRIu64 " calls, %" PRIu64
	        " errors, %" PRIu64 " misses)\n",
	        ops, r->elapsed_s, per_sec(ops, r->elapsed_s), calls, errs, misses);
	fprintf(f, "  %-7s %11s %11s %10s %7s %9s %9s %9s %9s %9s\n", "op", "ops/s", "ops", "calls",
	        "errors", "p50 us", "p90 us", "p99 us", "p99.9 us", "max us");
	for (int i = 0; i < KV_BENCH_NOPS; i++)
		if (t->calls[i] || (r->params && r->params->mix[i]))
			summary_row(f, op_names[i], t->ops[i], t->calls[i], t->errors[i],
			            r->elapsed_s, t->lat[i]);
	summary_row(f, "all", ops, calls, errs, r->elapsed_s, all);
	kv_hdr_destroy(all);
	if (t->first && kv_hdr_count(t->first))
		fprintf(f,
		        "pipelines to their first answer: p50 %.1f us, p99 %.1f us, p99.9 %.1f us "
		        "(the rows above: to their last)\n",
		        us(kv_hdr_percentile(t->first, 50)), us(kv_hdr_percentile(t->first, 99)),
		        us(kv_hdr_percentile(t->first, 99.9)));
	fprintf(f, "errors:");
	for (int i = 0; i < KV_BENCH_NERR; i++)
		if (t->err_kind[i]) {
			fprintf(f, "%s %s %" PRIu64, any ? "," : "", err_names[i], t->err_kind[i]);
			any = true;
		}
	fprintf(f, "%s\n", any ? "" : " none");
	fprintf(f, "per node (keys routed by the range map):\n");
	for (size_t i = 0; i < r->nnodes; i++) {
		uint32_t id = r->nodes[i].id;
		uint64_t n = id <= KV_BENCH_MAX_NODES ? t->node_ops[id] : 0;
		fprintf(f, "  node %-3" PRIu32 " %-28s %11.0f ops/s %11" PRIu64 " ops", id,
		        r->nodes[i].address, per_sec(n, r->elapsed_s), n);
		if (r->nodes[i].server_polls)
			fprintf(f, "   (server reports %.0f ops/s, all clients)",
			        r->nodes[i].server_ops_sum / r->nodes[i].server_polls);
		fputc('\n', f);
	}
	if (t->node_ops[0])
		fprintf(f, "  unrouted %-28s %11.0f ops/s %11" PRIu64 " ops\n", "",
		        per_sec(t->node_ops[0], r->elapsed_s), t->node_ops[0]);
	if (r->params && r->params->rate > 0)
		fprintf(f, "open loop: %.0f ops/s asked, %" PRIu64 " ops still due at the end\n",
		        r->params->rate, r->backlog);
	if (r->nevents) {
		fprintf(f, "events:\n");
		for (size_t i = 0; i < r->nevents; i++)
			fprintf(f, "  [%6.1fs] %s at epoch %" PRIu64 ": %s\n", r->events[i].t,
			        r->events[i].kind, r->events[i].epoch, r->events[i].detail);
	}
}

/* ---------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------- */

static void
wake_all(bench_run *r)
{
	pthread_mutex_lock(&r->mu);
	r->done = true;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

/* Creates the workers' buffers. Returns 0 or SHARDKV_ENOMEM. */
static int
workers_init(bench_run *r)
{
	const kv_bench_params *p = r->p;
	size_t per = (size_t)p->key_size + p->value_size;
	unsigned lb = (unsigned)(LOAD_MAX_BYTES / (per ? per : 1));

	lb = lb < 1 ? 1 : lb > LOAD_MAX_KEYS ? LOAD_MAX_KEYS : lb;
	if ((r->w = calloc(r->nw, sizeof(*r->w))) == NULL)
		return SHARDKV_ENOMEM;
	for (unsigned i = 0; i < r->nw; i++) {
		bench_worker *w = &r->w[i];
		unsigned nk = p->batch > lb ? p->batch : lb;
		w->run = r;
		w->id = i;
		w->c = r->conns[i % r->nc];
		w->load_batch = lb;
		w->rng = splitmix(p->seed * 0x100000001b3ull + i) | 1;
		pthread_mutex_init(&w->mu, NULL);
		w->keybuf = malloc((size_t)nk * p->key_size);
		w->keys = calloc(nk, sizeof(*w->keys));
		w->vals = calloc(nk, sizeof(*w->vals));
		w->val = malloc(p->value_size + 1);
		if (!w->keybuf || !w->keys || !w->vals || !w->val)
			return SHARDKV_ENOMEM;
		for (size_t b = 0; b < p->value_size; b++)
			w->val[b] = (uint8_t)('a' + rng_next(&w->rng) % 26);
		for (unsigned k = 0; k < nk; k++) {
			w->keys[k] =
			    (shardkv_bytes){w->keybuf + (size_t)k * p->key_size, p->key_size};
			w->vals[k] = (shardkv_bytes){w->val, p->value_size};
		}
	}
	return 0;
}

static void
workers_fini(bench_run *r)
{
	for (unsigned i = 0; r->w && i < r->nw; i++) {
		bench_worker *w = &r->w[i];
		pthread_mutex_destroy(&w->mu);
		kv_bench_tally_fini(&w->tally);
		route_unref(w->rt);
		free(w->keybuf);
		free(w->keys);
		free(w->vals);
		free(w->val);
	}
	free(r->w);
}

/* Starts every worker on fn; returns how many started. */
static unsigned
workers_start(bench_run *r, void *(*fn)(void *))
{
	unsigned n = 0;
	for (unsigned i = 0; i < r->nw; i++) {
		r->w[i].started = pthread_create(&r->w[i].th, NULL, fn, &r->w[i]) == 0;
		n += r->w[i].started;
	}
	return n;
}

static void
workers_join(bench_run *r)
{
	for (unsigned i = 0; i < r->nw; i++)
		if (r->w[i].started) {
			pthread_join(r->w[i].th, NULL);
			r->w[i].started = false;
		}
}

/* The --load phase: every key once, in mput batches, progress every second. */
static int
run_load(bench_run *r)
{
	const kv_bench_params *p = r->p;
	uint64_t t0 = now_ns(), next = t0 + 1000000000u, last_done = 0;

	atomic_store(&r->claimed, 0);
	fprintf(r->prog, "load: writing %" PRIu64 " keys with %u threads\n", p->keys, r->nw);
	fflush(r->prog);
	if (workers_start(r, load_main) != r->nw) {
		atomic_store(&r->stop, true); /* stop the ones that did start */
		workers_join(r);
		return SHARDKV_ENOMEM;
	}
	bool failed = false;
	for (;;) {
		uint64_t ok = atomic_load(&r->load_done), bad = atomic_load(&r->load_err);
		uint64_t done = ok + bad;
		if (done >= p->keys || bench_interrupted)
			break;
		/* Every worker has failed and none has written a key (no server,
		 * a wrong address): the rest would only fail the same way, one
		 * timeout after another. */
		if (ok == 0 && bad >= r->nw) {
			failed = true;
			atomic_store(&r->stop, true);
			break;
		}
		if (now_ns() >= next) {
			fprintf(r->prog,
			        "load: %" PRIu64 "/%" PRIu64 " keys (%.0f%%) %.0f keys/s, %" PRIu64
			        " errors\n",
			        done, p->keys, 100.0 * (double)done / (double)p->keys,
			        (double)(done - last_done), (uint64_t)atomic_load(&r->load_err));
			fflush(r->prog);
			last_done = done;
			next += 1000000000u;
		}
		struct timespec ts = {0, 20000000};
		nanosleep(&ts, NULL);
	}
	workers_join(r);
	r->res->loaded = true;
	r->res->load_keys = atomic_load(&r->load_done);
	r->res->load_errors = atomic_load(&r->load_err);
	r->res->load_s = (double)(now_ns() - t0) / 1e9;
	fprintf(r->prog, "load: %" PRIu64 " keys in %.2f s (%.0f keys/s), %" PRIu64 " errors\n",
	        r->res->load_keys, r->res->load_s, per_sec(r->res->load_keys, r->res->load_s),
	        r->res->load_errors);
	fflush(r->prog);
	atomic_store(&r->claimed, 0);
	atomic_store(&r->stop, false);
	return failed ? SHARDKV_EUNAVAIL : 0;
}

/* The measured phase. */
static int
run_measure(bench_run *r)
{
	const kv_bench_params *p = r->p;
	pthread_t rep, pol;
	bool rep_ok, pol_ok;

	r->t0 = now_ns();
	r->last_tick = r->t0;
	r->deadline = p->ops ? 0 : r->t0 + (uint64_t)(p->duration_s * 1e9);
	atomic_store(&r->stop, false);
	rep_ok = pthread_create(&rep, NULL, reporter_main, r) == 0;
	pol_ok = pthread_create(&pol, NULL, poller_main, r) == 0;
	if (!rep_ok || !pol_ok || workers_start(r, worker_main) != r->nw) {
		atomic_store(&r->stop, true);
		workers_join(r);
		wake_all(r);
		if (rep_ok)
			pthread_join(rep, NULL);
		if (pol_ok)
			pthread_join(pol, NULL);
		return SHARDKV_ENOMEM;
	}
	workers_join(r);
	uint64_t end = now_ns();
	wake_all(r);
	pthread_join(rep, NULL);
	pthread_join(pol, NULL);
	close_point(r, end);
	print_new_events(r);
	r->res->elapsed_s = (double)(end - r->t0) / 1e9;
	for (unsigned i = 0; i < r->nw; i++) {
		r->res->backlog += r->w[i].backlog;
		if (r->w[i].fatal)
			return r->w[i].fatal;
	}
	return 0;
}

static FILE *
open_out(const char *path, FILE *err)
{
	FILE *f = fopen(path, "w");
	if (f == NULL)
		fprintf(err, "shardkv: bench: cannot write %s: %s\n", path, strerror(errno));
	return f;
}

/* Closes an output file, reporting a write error. Returns whether it went well. */
static bool
close_out(FILE *f, const char *path, FILE *err)
{
	bool ok = !ferror(f);
	ok &= fclose(f) == 0;
	if (!ok)
		fprintf(err, "shardkv: bench: writing %s failed\n", path);
	return ok;
}

int
kv_bench_main(int nargs, const char *const *args, const char *controller, shardkv_client *admin,
              const shardkv_options *opt, bool json, FILE *out, FILE *err)
{
	kv_bench_params p = {0};
	kv_bench_result res = {0};
	bench_run r = {0};
	shardkv_config *cfg = NULL;
	FILE *fout = NULL, *fplot = NULL;
	struct sigaction sa, old_int, old_term;
	pthread_condattr_t ca;
	char msg[256];
	int rv, code = 0;

	if ((rv = kv_bench_parse(nargs, args, &p, msg, sizeof(msg))) != 0) {
		fprintf(err, "shardkv: %s\n", msg);
		return rv;
	}
	if (p.help) {
		kv_bench_usage(out);
		return 0;
	}
	p.controller = controller;
	p.timeout_ms = opt->timeout_ms;
	p.json = json;
	if (p.out_path && (fout = open_out(p.out_path, err)) == NULL)
		return KV_CLI_USAGE;
	if (p.plot_path && (fplot = open_out(p.plot_path, err)) == NULL) {
		if (fout)
			fclose(fout);
		return KV_CLI_USAGE;
	}
	if (p.slow_path && (r.slow = open_out(p.slow_path, err)) == NULL) {
		if (fout)
			fclose(fout);
		if (fplot)
			fclose(fplot);
		return KV_CLI_USAGE;
	}
	if (r.slow) {
		struct timespec rt, mt;
		clock_gettime(CLOCK_REALTIME, &rt);
		clock_gettime(CLOCK_MONOTONIC, &mt);
		r.real_off_ns = ((int64_t)rt.tv_sec - (int64_t)mt.tv_sec) * 1000000000 +
		                ((int64_t)rt.tv_nsec - (int64_t)mt.tv_nsec);
		r.slow_ns = p.slow_us * 1000u;
		fprintf(r.slow, "# due_unix_s\tlatency_ms\top\tnode\tkeys\tresult\n");
	}

	res.params = &p;
	r.p = &p;
	r.res = &res;
	r.prog = json ? err : out;
	r.err = err;
	r.admin = admin;
	r.nw = p.threads;
	r.nc = p.connections;
	r.plen = key_plen(&p);
	for (int i = 0; i < KV_BENCH_NOPS; i++)
		r.nops_total += p.mix[i];
	if (p.dist.zipf)
		zipf_init(&r.zipf, p.keys, p.dist.theta);
	pthread_mutex_init(&r.mu, NULL);
	pthread_mutex_init(&r.rt_mu, NULL);
	pthread_mutex_init(&r.ev_mu, NULL);
	pthread_mutex_init(&r.sl_mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&r.cv, &ca);
	pthread_condattr_destroy(&ca);
	{
		time_t now = time(NULL);
		struct tm tm;
		gmtime_r(&now, &tm);
		strftime(res.started_at, sizeof(res.started_at), "%Y-%m-%dT%H:%M:%SZ", &tm);
	}

	/* The cluster must answer before anything starts. */
	if ((rv = poll_config(&r, &cfg)) != 0) {
		const char *m = shardkv_errmsg();
		fprintf(err, "shardkv: bench: %s%s%s\n", shardkv_strerror(rv), m[0] ? ": " : "", m);
		code = kv_cli_exit_code(rv);
		goto out;
	}
	poller_take(&r, cfg, true);
	shardkv_set_timeout(admin, 1000);

	if ((r.conns = calloc(r.nc, sizeof(*r.conns))) == NULL) {
		code = KV_CLI_INTERNAL;
		goto out;
	}
	for (unsigned i = 0; i < r.nc; i++) {
		shardkv_options o = *opt;
		o.no_watch = false;
		if ((rv = shardkv_open(controller, &o, &r.conns[i])) != 0) {
			fprintf(err, "shardkv: bench: opening connection %u: %s\n", i,
			        shardkv_strerror(rv));
			code = kv_cli_exit_code(rv);
			goto out;
		}
	}
	if (workers_init(&r) != 0) {
		fprintf(err, "shardkv: bench: out of memory\n");
		code = KV_CLI_INTERNAL;
		goto out;
	}

	atomic_store(&bench_interrupted, 0);
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = bench_on_signal;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);

	fprintf(r.prog,
	        "bench: %s loop%s, %u threads, %u connections, %" PRIu64
	        " keys of %u B, values of %zu B, %s keys, mix %s, batch %u, ",
	        p.rate > 0 ? "open" : "closed", "", p.threads, p.connections, p.keys, p.key_size,
	        p.value_size, p.dist_str, p.mix_str, p.batch);
	if (p.ops)
		fprintf(r.prog, "%" PRIu64 " ops", p.ops);
	else
		fprintf(r.prog, "%.1f s", p.duration_s);
	if (p.rate > 0)
		fprintf(r.prog, ", %.0f ops/s asked", p.rate);
	fprintf(r.prog, ", epoch %" PRIu64 ", %zu nodes\n", cfg->epoch, res.nnodes);
	fflush(r.prog);

	if (p.load && (rv = run_load(&r)) == SHARDKV_EUNAVAIL) {
		fprintf(err, "shardkv: bench: load: every writer failed and no key was written; "
		             "stopped\n");
		code = KV_CLI_UNAVAIL;
	} else if (p.load && rv != 0) {
		code = KV_CLI_INTERNAL;
	}
	if (code == 0 && !bench_interrupted && (p.ops || p.duration_s > 0) &&
	    (rv = run_measure(&r)) != 0) {
		fprintf(err, "shardkv: bench: %s\n", shardkv_strerror(rv));
		code = KV_CLI_INTERNAL;
	}
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	if (code != 0)
		goto out;

	if (json)
		kv_bench_write_json(out, &res);
	else
		kv_bench_write_summary(out, &res);
	if (fout) {
		kv_bench_write_json(fout, &res);
		code = close_out(fout, p.out_path, err) ? 0 : KV_CLI_INTERNAL;
		fout = NULL;
	}
	if (fplot) {
		kv_bench_write_svg(fplot, &res);
		if (!close_out(fplot, p.plot_path, err))
			code = KV_CLI_INTERNAL;
		fplot = NULL;
	}
	if (r.slow) {
		if (!close_out(r.slow, p.slow_path, err))
			code = KV_CLI_INTERNAL;
		r.slow = NULL;
	}
	if (code == 0 && kv_bench_tally_ops(&res.total) == 0 &&
	    (kv_bench_tally_errors(&res.total) > 0 || (res.loaded && res.load_keys == 0))) {
		/* Nothing got through: exit with the commonest error's code. */
		int worst = KV_BENCH_NERR - 1;
		uint64_t most = 0;
		for (int i = 1; i < KV_BENCH_NERR - 1; i++)
			if (res.total.err_kind[i] > most) {
				most = res.total.err_kind[i];
				worst = i;
			}
		fprintf(err, "shardkv: bench: no operation succeeded\n");
		code = most ? kv_cli_exit_code(-worst) : KV_CLI_UNAVAIL;
	}
out:
	if (fout)
		fclose(fout);
	if (fplot)
		fclose(fplot);
	if (r.slow)
		fclose(r.slow);
	workers_fini(&r);
	for (unsigned i = 0; r.conns && i < r.nc; i++)
		shardkv_close(r.conns[i]);
	free(r.conns);
	route_unref(r.rt);
	shardkv_config_free(r.last_cfg);
	kv_bench_tally_fini(&r.sec);
	pthread_cond_destroy(&r.cv);
	pthread_mutex_destroy(&r.mu);
	pthread_mutex_destroy(&r.rt_mu);
	pthread_mutex_destroy(&r.ev_mu);
	pthread_mutex_destroy(&r.sl_mu);
	kv_bench_result_fini(&res);
	if (bench_interrupted && code == 0)
		fprintf(err, "shardkv: bench: interrupted; the summary covers the run so far\n");
	atomic_store(&bench_interrupted, 0);
	return code;
}
