/*
 * metrics.h - a tiny HTTP listener that serves a daemon's metrics in
 * Prometheus text format at http://HOST:PORT/metrics (doc/contract.md §5), shared by
 * shardkv-controller and shardkv-server.
 *
 * One thread accepts one connection at a time, reads the request head
 * (bounded: 4 KiB and 1 s), answers and closes. "GET /metrics" (with or
 * without a query string) is answered with the metrics: the render
 * callback's text, then the process figures and shardkv_build_info that
 * every daemon exports (kv_metrics_write_process). "GET /healthz" is
 * answered 200 "ok" while the daemon's health callback says so (always,
 * without one), else 503 with the reason. Any other request line gets a
 * 404, an over-long one a 400, and a client that sends no complete line in
 * time is dropped. The callbacks run on that thread, once per request.
 */
#ifndef KV_COMMON_METRICS_H
#define KV_COMMON_METRICS_H

#include "common/key.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Appends the daemon's metrics, in Prometheus text format, to out. Returns
 * 0, or a negative KV_E* code (the scrape is then answered with a 500). */
typedef int (*kv_metrics_render_fn)(void *arg, kv_buf *out);

/* Whether the daemon is healthy, for /healthz: 0, or a negative KV_E* code
 * with a one-line reason in why (answered 503). */
typedef int (*kv_metrics_health_fn)(void *arg, char *why, size_t whylen);

typedef struct kv_metrics kv_metrics;

/*
 * Listens on hostport ("127.0.0.1:9100", ":9100" or "[::1]:9100"; the port
 * must be numeric) and starts the thread, which calls render(arg, out) for
 * every scrape until kv_metrics_destroy() returns. Returns 0, KV_EINVAL (bad
 * address), KV_EADDRINUSE or KV_ENOMEM, with a one-line reason in err.
 */
int kv_metrics_create(const char *hostport, kv_metrics_render_fn render, void *arg,
                      kv_metrics **out, char *err, size_t errlen);

/* kv_metrics_create() with a health callback for /healthz (NULL: always
 * healthy while the listener runs); both callbacks get arg. */
int kv_metrics_create_ex(const char *hostport, kv_metrics_render_fn render,
                         kv_metrics_health_fn health, void *arg, kv_metrics **out, char *err,
                         size_t errlen);

/* Stops the thread (waiting for a scrape in progress) and closes the socket.
 * Accepts NULL. */
void kv_metrics_destroy(kv_metrics *m);

/*
 * Writing the text. A render callback fills an array of samples and hands
 * it to kv_metrics_write(), which prints the HELP and TYPE lines of a
 * family before its first sample. The samples of one family must be
 * adjacent in the array (Prometheus requires a family to be contiguous).
 */
#define KV_METRIC_COUNTER "counter"
#define KV_METRIC_GAUGE   "gauge"

typedef struct {
	const char *name;   /* metric family name, e.g. "shardkv_server_keys" */
	const char *type;   /* KV_METRIC_COUNTER or KV_METRIC_GAUGE */
	const char *help;   /* one line of HELP text, no newline */
	const char *label;  /* name of this sample's one label, or NULL for none */
	const char *lvalue; /* its value (escaped on output) */
	bool real;          /* the value is f, else u */
	uint64_t u;         /* integer value */
	double f;           /* real value */
} kv_metric;

/* Appends n samples to out. Returns 0 or KV_ENOMEM. */
int kv_metrics_write(kv_buf *out, const kv_metric *m, size_t n);

/*
 * Appends the figures every daemon exports besides its own (doc/metrics.md):
 * shardkv_build_info{version,commit} 1, process_cpu_seconds_total,
 * process_resident_memory_bytes, process_open_fds, process_max_fds and
 * process_start_time_seconds (read from /proc; a figure that cannot be read
 * is left out). Returns 0 or KV_ENOMEM.
 */
int kv_metrics_write_process(kv_buf *out);

/*
 * A latency histogram that many threads fill without a lock: one relaxed
 * atomic add per bucket hit, one for the sum. The buckets are fixed (50 us
 * to 30 s, 1-2.5-5 per decade; listed in metrics.c and doc/metrics.md), so
 * histograms of every daemon and op aggregate in Prometheus.
 * Zero-initialised is empty.
 */
#define KV_LAT_BUCKETS 18 /* finite bounds; one more bucket counts the rest */

typedef struct {
	atomic_uint_fast64_t bucket[KV_LAT_BUCKETS + 1]; /* not cumulative; last: > max bound */
	atomic_uint_fast64_t sum_ns;
} kv_lat_hist;

/* Counts one observation of ns nanoseconds. */
void kv_lat_hist_observe(kv_lat_hist *h, uint64_t ns);

/*
 * Appends a histogram family `name` (a name ending in "_seconds"): its HELP
 * and TYPE lines, then for each of the n histograms, labelled
 * label="lvalues[i]", the cumulative name_bucket{...,le="..."} lines, name_sum
 * and name_count. A histogram is read bucket by bucket while others may
 * add to it, so a scrape can be off by the observations made meanwhile;
 * count is the total of the buckets read, so it always equals the +Inf
 * bucket. Returns 0 or KV_ENOMEM.
 */
int kv_metrics_write_hist(kv_buf *out, const char *name, const char *help, const char *label,
                          const char *const *lvalues, const kv_lat_hist *const *h, size_t n);

#endif
