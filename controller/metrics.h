/*
 * metrics.h - a tiny HTTP listener that serves the controller's gauges in
 * Prometheus text format at http://HOST:PORT/metrics (SPEC §5).
 *
 * One thread accepts one connection at a time, reads the request line
 * (bounded: 4 KiB, 1 s), answers, and closes. Anything but GET /metrics is
 * a 404. The numbers come from a callback, called on that thread.
 */
#ifndef KV_CONTROLLER_METRICS_H
#define KV_CONTROLLER_METRICS_H

#include <stddef.h>
#include <stdint.h>

/* The gauges. */
typedef struct {
	uint64_t epoch;      /* latest published epoch */
	uint64_t nodes[5];   /* nodes by kv_node_state (index 1..4) */
	uint64_t ranges;     /* entries in the range map */
	uint64_t migrations; /* migrations in flight */
	uint64_t watches;    /* watches held */
	uint64_t waits;      /* --wait commands held */
	uint64_t uptime_s;   /* seconds since start */
} kv_metrics_sample;

/* Fills a sample; called on the metrics thread. */
typedef void (*kv_metrics_cb)(void *arg, kv_metrics_sample *s);

typedef struct kv_metrics kv_metrics;

/*
 * Listens on hostport ("127.0.0.1:9100", ":9100" or "[::1]:9100") and starts
 * the thread. Returns 0, KV_EINVAL (bad address) or KV_EADDRINUSE, with a
 * one-line reason in err. The caller stops it with kv_metrics_destroy().
 */
int kv_metrics_create(const char *hostport, kv_metrics_cb cb, void *arg, kv_metrics **out,
                      char *err, size_t errlen);

/* Stops the thread and closes the socket. Accepts NULL. */
void kv_metrics_destroy(kv_metrics *m);

#endif
