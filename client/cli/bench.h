/*
 * bench.h - `shardkv bench` (doc/contract.md §7): a load generator and latency meter
 * for a shardkv cluster, built on the public client API only.
 *
 * Model: --threads T workers, each a loop that issues one call and waits for
 * its reply (closed loop), or that issues calls at intended times set by
 * --rate (open loop; latency then counts from the intended send time, so a
 * stall is charged to every call it delayed, not hidden by coordinated
 * omission). --connections C is the number of independent client handles
 * (shardkv_client, each with its own sockets to the controller and to every
 * server); worker i uses handle i % C, so C <= T and C = T (the default) gives
 * every worker its own connections. With --async C each worker instead keeps
 * C callers in flight through the asynchronous API (shardkv_get_async...),
 * each caller issuing its next call from the previous one's completion:
 * T x C concurrent callers, each with one call outstanding, without a thread
 * per caller (closed loop; get, put and del only).
 *
 * Counting: an operation is one key. A call with K keys (mget, mput, and get
 * or put when --batch K > 1 turns them into mget/mput) counts K operations;
 * del, append and scan calls count one each. Latency is measured per call,
 * including failed calls. A get/del/mget of a missing key is a miss (an
 * answered operation), not an error. Ops per node are computed by routing
 * each key through the range map that a poller fetches once a second, not
 * reported by the server that answered.
 *
 * This header exposes the parsing, the tallies and the report writers so
 * that tests can drive them without a cluster.
 */
#ifndef KV_CLIENT_CLI_BENCH_H
#define KV_CLIENT_CLI_BENCH_H

#include "client/cli/hdr.h"
#include "client/include/shardkv.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Operation types of --mix, in the order of reports. */
typedef enum {
	KV_BENCH_GET = 0,
	KV_BENCH_PUT,
	KV_BENCH_DEL,
	KV_BENCH_APPEND,
	KV_BENCH_MGET,
	KV_BENCH_MPUT,
	KV_BENCH_SCAN,
	KV_BENCH_NOPS,
} kv_bench_op;

/* Node ids above this are counted together as node 0 ("other"). */
#define KV_BENCH_MAX_NODES 64
/* Error kinds: -code for SHARDKV_E* codes 1..KV_BENCH_NERR-2; last: other. */
#define KV_BENCH_NERR 24

/* Returns the name of an op ("get" ...), or NULL out of range. */
const char *kv_bench_op_name(int op);

/* Returns a short snake_case name for a SHARDKV_E* code ("timed_out"). */
const char *kv_bench_err_name(int err);

/* The key distribution. */
typedef struct {
	bool zipf;    /* false: uniform */
	double theta; /* zipf exponent, 0 < theta < 1 */
} kv_bench_dist;

/* Everything given on the command line, checked. Strings point into argv. */
typedef struct {
	const char *controller;      /* controller list (set by the CLI) */
	uint32_t timeout_ms;         /* per-call deadline; 0: the library's default */
	unsigned threads;            /* --threads, workers */
	unsigned connections;        /* --connections, client handles (<= threads) */
	uint64_t keys;               /* --keys, key space size */
	unsigned key_size;           /* --key-size, bytes per key */
	const char *key_prefix;      /* --key-prefix: keys are it and zero-padded digits
	                                (default "key:", dropped when key_size leaves no
	                                room for it) */
	bool key_prefix_set;         /* --key-prefix given: key_size must leave room */
	size_t value_size;           /* --value-size, bytes per value */
	unsigned mix[KV_BENCH_NOPS]; /* --mix weights */
	const char *mix_str;         /* --mix as given (or the default) */
	unsigned batch;              /* --batch K */
	unsigned async;              /* --async C: callers per thread on the async API; 0: off */
	unsigned scan_limit;         /* --scan-limit: entries per scan call */
	double duration_s;           /* --duration; 0 with --ops */
	uint64_t ops;                /* --ops; 0: run for duration_s */
	bool load;                   /* --load */
	bool one_range;              /* --one-range: a call's keys share a range */
	double rate;                 /* --rate total ops/s; 0: closed loop */
	kv_bench_dist dist;          /* --dist */
	const char *dist_str;        /* --dist as given (or "uniform") */
	uint64_t seed;               /* --seed */
	const char *out_path;        /* --out FILE.json; NULL: none */
	const char *plot_path;       /* --plot FILE.svg; NULL: none */
	const char *slow_path;       /* --slow-log FILE: a line per slow call; NULL: none */
	uint64_t slow_us;            /* --slow-us: a call this slow or slower is logged */
	bool json;                   /* global --json: the summary as JSON on stdout */
	bool help;                   /* --help */
} kv_bench_params;

/*
 * Parses the bench arguments (argv[0] is the first option, not a program
 * name) over defaults. Returns 0, or KV_CLI_USAGE with a one-line reason in
 * err. Nothing is allocated.
 */
int kv_bench_parse(int argc, const char *const *argv, kv_bench_params *p, char *err, size_t errlen);

/* Parses a --mix value ("get:90,put:10") into weights[KV_BENCH_NOPS].
 * Returns 0 or KV_CLI_USAGE with the reason in err. */
int kv_bench_parse_mix(const char *s, unsigned *weights, char *err, size_t errlen);

/* Parses a --dist value ("uniform", "zipf", "zipf:0.99"). Returns 0 or
 * KV_CLI_USAGE with the reason in err. */
int kv_bench_parse_dist(const char *s, kv_bench_dist *d, char *err, size_t errlen);

/* Returns the index of the first of p's keys ("key:000..N-1": --key-prefix,
 * zero-padded digits, key_size bytes) that sorts at or after start (slen
 * bytes), in 0..p->keys. The keys of the range [a, b) are the indices
 * [first(a), first(b)): --one-range draws a call's keys among them. */
uint64_t kv_bench_first_index_at(const kv_bench_params *p, const void *start, size_t slen);

/* Open loop (--rate): when call n (0, 1, ...) of thread `id` of `threads`
 * is due, in ns after the run's start. Each thread keeps its own period
 * (threads / rate, times the ops a call carries) and thread i starts i /
 * threads of a period after thread 0: the calls of all threads arrive
 * evenly spaced, as independent clients' would, not `threads` at once. */
double kv_bench_due_ns(double rate, unsigned ops_per_call, unsigned threads, unsigned id,
                       uint64_t n);

/* Prints the options of `shardkv bench`. */
void kv_bench_usage(FILE *f);

/* Counters of a set of calls: per worker per interval, per second, in total.
 * Histograms are created lazily per op. Zero-initialise; free with
 * kv_bench_tally_fini(). Not thread-safe. */
typedef struct {
	uint64_t calls[KV_BENCH_NOPS];             /* calls issued and finished */
	uint64_t ops[KV_BENCH_NOPS];               /* answered operations (keys), misses included */
	uint64_t misses[KV_BENCH_NOPS];            /* keys not found */
	uint64_t errors[KV_BENCH_NOPS];            /* failed operations (keys) */
	uint64_t err_kind[KV_BENCH_NERR];          /* failed operations by error */
	uint64_t node_ops[KV_BENCH_MAX_NODES + 1]; /* answered ops by routed node; [0]: other */
	kv_hdr *lat[KV_BENCH_NOPS];                /* call latency in ns, per op */
	kv_hdr *first; /* --async --batch K: a pipeline's latency to its first answer (ns) */
} kv_bench_tally;

/*
 * Counts one finished call of `op` that took lat_ns: ok answered keys
 * (misses of them not found), nerr failed keys with error `err`. Returns 0
 * or SHARDKV_ENOMEM (histogram allocation).
 */
int kv_bench_tally_record(kv_bench_tally *t, int op, uint64_t lat_ns, uint64_t ok, uint64_t misses,
                          uint64_t nerr, int err);

/* Counts a pipeline's latency to its first answer (redis-benchmark's measure
 * of a pipeline). Returns 0 or SHARDKV_ENOMEM. */
int kv_bench_tally_record_first(kv_bench_tally *t, uint64_t lat_ns);

/* Adds src to dst. Returns 0 or SHARDKV_ENOMEM. */
int kv_bench_tally_merge(kv_bench_tally *dst, const kv_bench_tally *src);

/* Zeroes the counters, keeping the histograms (emptied). */
void kv_bench_tally_reset(kv_bench_tally *t);

/* Frees the histograms. */
void kv_bench_tally_fini(kv_bench_tally *t);

/* Sums of a tally. */
uint64_t kv_bench_tally_ops(const kv_bench_tally *t);
uint64_t kv_bench_tally_errors(const kv_bench_tally *t);

/* A bucket of a second's latencies: n calls took at most us microseconds
 * and more than the previous bucket's us. Buckets are at most 1% wide, so
 * that percentiles over any set of seconds can be computed from them (within
 * 1.2% above the exact value). */
typedef struct {
	double us;  /* the bucket's upper bound */
	uint64_t n; /* calls in it */
} kv_bench_bucket;

/* Fills *out (malloc'd, *nout entries; NULL and 0 when h is empty) with
 * h's counts in buckets at most 1% wide. Returns 0 or SHARDKV_ENOMEM. */
int kv_bench_buckets(const kv_hdr *h, kv_bench_bucket **out, size_t *nout);

/* One second of the run (the last one may be shorter). */
typedef struct {
	double t;                       /* seconds since the start, at the end of the interval */
	double dt;                      /* its length in seconds */
	uint64_t ops;                   /* answered operations */
	uint64_t op_ops[KV_BENCH_NOPS]; /* by op type */
	uint64_t errors;                /* failed operations */
	double p50_us, p99_us, max_us;  /* call latency */
	uint64_t epoch;                 /* configuration epoch seen by the poller; 0: unknown */
	unsigned migrations;            /* migrations in flight seen by the poller */
	size_t nhist;                   /* buckets in hist */
	kv_bench_bucket *hist;          /* the second's latencies (owned by the result) */
} kv_bench_point;

/* An admin event seen by the poller. */
typedef struct {
	double t;         /* seconds since the start */
	uint64_t epoch;   /* the epoch it was seen in */
	char kind[24];    /* join, leave, move, epoch, migration_start, migration_end */
	char detail[160]; /* human-readable detail */
} kv_bench_event;

/* A node as the last configuration named it. */
typedef struct {
	uint32_t id;           /* node id */
	char address[128];     /* its URL */
	double server_ops_sum; /* sum of the ops/s the status reported for it during the run */
	unsigned server_polls; /* how many status polls reported it */
} kv_bench_node;

/* The outcome of a run. Zero-initialise; free with kv_bench_result_fini(). */
typedef struct {
	const kv_bench_params *params;           /* the parameters (borrowed) */
	char started_at[32];                     /* UTC ISO 8601 */
	double elapsed_s;                        /* measured phase */
	kv_bench_tally total;                    /* every call of the measured phase */
	size_t npoints, cap_points;              /* series */
	kv_bench_point *points;                  /* one per second (owned) */
	size_t nevents, cap_events;              /* events */
	kv_bench_event *events;                  /* owned */
	size_t nnodes;                           /* nodes */
	kv_bench_node nodes[KV_BENCH_MAX_NODES]; /* from the last configuration */
	bool loaded;                             /* --load ran */
	uint64_t load_keys;                      /* keys written by --load */
	uint64_t load_errors;                    /* keys --load failed to write */
	double load_s;                           /* its duration */
	uint64_t backlog;                        /* open loop: calls still due at the end */
} kv_bench_result;

/* Appends a point / an event. Return 0 or SHARDKV_ENOMEM. The result takes
 * the point's hist either way. */
int kv_bench_result_add_point(kv_bench_result *r, const kv_bench_point *pt);
int kv_bench_result_add_event(kv_bench_result *r, const kv_bench_event *ev);

/* Frees what the result owns. */
void kv_bench_result_fini(kv_bench_result *r);

/* Writes the result as one JSON object (doc/contract.md §7) followed by a newline. */
void kv_bench_write_json(FILE *f, const kv_bench_result *r);

/* Writes the human summary. */
void kv_bench_write_summary(FILE *f, const kv_bench_result *r);

/* Writes an SVG drawing of ops/s and p99 over time with the events marked. */
void kv_bench_write_svg(FILE *f, const kv_bench_result *r);

/*
 * Runs `shardkv bench` with its arguments (nargs, args: the words after the
 * command) against `controller`, using `admin` (an open handle, used for
 * the configuration poll) and opening the data handles itself with `opt`
 * (the token, the TLS files and the timeout; copied, no_watch ignored).
 * Prints progress and the summary to out (with json: the JSON on out,
 * progress on err), errors to err. Returns the exit code.
 */
int kv_bench_main(int nargs, const char *const *args, const char *controller, shardkv_client *admin,
                  const shardkv_options *opt, bool json, FILE *out, FILE *err);

#endif
