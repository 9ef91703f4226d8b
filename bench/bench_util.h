/*
 * bench_util.h - small helpers the cost programs share (scan_cost.c,
 * range_delete_cost.c, fsync_cost.c, wal_cost.c, cpu_control.c): a seeded
 * generator, a count with a K or M suffix, a bounded integer, the monotonic
 * clock and a comparison for qsort of doubles. libc only.
 */
#ifndef KV_BENCH_UTIL_H
#define KV_BENCH_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

/* splitmix64: the next of a reproducible sequence seeded by *s. */
static inline uint64_t
bench_next_rand(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* "1000", "10K", "1.5M": the count, or 0 when it is not a positive one. */
static inline uint64_t
bench_parse_count(const char *s)
{
	char *end;
	double v = strtod(s, &end);
	if (*end == 'K' || *end == 'k')
		v *= 1e3;
	else if (*end == 'M' || *end == 'm')
		v *= 1e6;
	return v > 0 && v < 1.8e19 ? (uint64_t)v : 0;
}

/* A decimal integer in [min, max] into *out: 0, or -1 when s is not one. */
static inline int
bench_parse_long(const char *s, long min, long max, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
		return -1;
	*out = v;
	return 0;
}

/* The monotonic clock in seconds. */
static inline double
bench_now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* qsort's comparison of doubles, ascending. */
static inline int
bench_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

#endif
