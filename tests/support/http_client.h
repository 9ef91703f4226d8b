/*
 * http_client.h - a small HTTP/1.0 client for the tests of the daemons'
 * metrics listeners (/metrics, /healthz): one request per connection to
 * 127.0.0.1, read to the end with a deadline, and the value of one sample
 * in a Prometheus text body. No cmocka here: callers assert.
 */
#ifndef KV_TESTS_SUPPORT_HTTP_CLIENT_H
#define KV_TESTS_SUPPORT_HTTP_CLIENT_H

#include <stddef.h>

#define KV_HTTP_MS  5000u      /* one request, connect to last byte */
#define KV_HTTP_MAX (1u << 20) /* the largest answer read */

/* An HTTP answer. */
typedef struct {
	int status;   /* status code; 0: no answer */
	char *raw;    /* the whole answer, NUL-terminated (owned); "" without one */
	size_t len;   /* its length */
	char *body;   /* into raw, after the head; NULL without a head */
	size_t blen;  /* body bytes */
	long clength; /* Content-Length; -1: absent */
} kv_http_answer;

/* Connects to 127.0.0.1:port. Returns the socket or -1. */
int kv_http_dial(int port);

/* Sends the n bytes of req (all of a request, possibly malformed) to
 * 127.0.0.1:port and reads the answer (at most KV_HTTP_MAX bytes, within
 * KV_HTTP_MS). raw is NULL only when out of memory. */
kv_http_answer kv_http_raw(int port, const void *req, size_t n);

/* GET path (HTTP/1.0). */
kv_http_answer kv_http_get(int port, const char *path);

/* Frees an answer and zeroes it. */
void kv_http_answer_free(kv_http_answer *a);

/* The value of sample `series` ("name" or "name{label=\"v\"}") in a
 * Prometheus text body, or NAN when absent. */
double kv_http_sample(const char *body, const char *series);

#endif
