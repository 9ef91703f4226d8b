/*
 * key.c - byte buffers, prefix ranges, hashing and the monotonic clock.
 */
#include "common/key.h"
#include "common/err.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <xxhash.h>

int
kv_buf_reserve(kv_buf *b, size_t n)
{
	size_t cap;
	uint8_t *p;

	if (b == NULL)
		return KV_EINVAL;
	if (n <= b->cap)
		return KV_OK;
	cap = b->cap ? b->cap : 64;
	while (cap < n) {
		if (cap > SIZE_MAX / 2)
			return KV_ENOMEM;
		cap *= 2;
	}
	p = realloc(b->data, cap);
	if (p == NULL)
		return KV_ENOMEM;
	b->data = p;
	b->cap = cap;
	return KV_OK;
}

int
kv_buf_set(kv_buf *b, const void *p, size_t n)
{
	int rv = kv_buf_reserve(b, n ? n : 1);
	if (rv != KV_OK)
		return rv;
	if (n)
		memcpy(b->data, p, n);
	b->len = n;
	return KV_OK;
}

int
kv_buf_append(kv_buf *b, const void *p, size_t n)
{
	int rv;

	if (b == NULL || n > SIZE_MAX - b->len)
		return KV_EINVAL;
	rv = kv_buf_reserve(b, b->len + n);
	if (rv != KV_OK)
		return rv;
	if (n)
		memcpy(b->data + b->len, p, n);
	b->len += n;
	return KV_OK;
}

void
kv_buf_fini(kv_buf *b)
{
	if (b == NULL)
		return;
	free(b->data);
	b->data = NULL;
	b->len = b->cap = 0;
}

void
kv_prefix_end(const void *prefix, size_t plen, uint8_t *out, size_t *outlen)
{
	const uint8_t *p = prefix;
	size_t n = plen;

	/* Drop trailing 0xff bytes, then increment the last remaining byte. */
	while (n > 0 && p[n - 1] == 0xff)
		n--;
	if (n == 0) {
		*outlen = 0;
		return;
	}
	memcpy(out, p, n);
	out[n - 1]++;
	*outlen = n;
}

uint64_t
kv_hash64(const void *p, size_t n)
{
	return XXH3_64bits(p, n);
}

uint64_t
kv_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t
kv_unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* CLOCK_MONOTONIC_COARSE's resolution in ns, 0: not read yet, UINT64_MAX:
 * the clock is not there. */
static atomic_uint_fast64_t kv_coarse_res;

uint64_t
kv_now_late_ns(void)
{
	uint64_t res = atomic_load_explicit(&kv_coarse_res, memory_order_relaxed);
	struct timespec ts;

	if (res == 0) {
		res = UINT64_MAX;
		if (clock_getres(CLOCK_MONOTONIC_COARSE, &ts) == 0 && ts.tv_sec == 0 &&
		    ts.tv_nsec > 0)
			res = (uint64_t)ts.tv_nsec;
		atomic_store_explicit(&kv_coarse_res, res, memory_order_relaxed);
	}
	if (res == UINT64_MAX || clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
		return kv_now_ns();
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + res;
}
