/*
 * util.c - the small services every part of shardkv-checker uses: the
 * monotonic clock, the random generator, the log line and the stop flag.
 * Nothing here knows about the cluster or the history.
 */
#include "checker/checker.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

volatile sig_atomic_t chk_stop_requested;
static uint64_t t_start; /* chk_log's origin: chk_log_start */

uint64_t
chk_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t
chk_rng_next(chk_rng *r)
{
	uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

uint64_t
chk_rng_below(chk_rng *r, uint64_t n)
{
	return n ? chk_rng_next(r) % n : 0;
}

void
chk_log(const char *fmt, ...)
{
	va_list ap;
	char buf[2048];

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(stderr, "checker: %7.2fs %s\n", (double)(chk_now_ns() - t_start) / 1e9, buf);
}

void
chk_log_start(void)
{
	t_start = chk_now_ns();
}

bool
chk_in_range(const void *key, size_t klen, const void *start, size_t sl, const void *end, size_t el)
{
	int cs = sl ? memcmp(start, key, sl < klen ? sl : klen) : 0;
	if (!(cs < 0 || (cs == 0 && sl <= klen)))
		return false;
	int ce = el ? memcmp(key, end, klen < el ? klen : el) : -1;
	return el == 0 || ce < 0 || (ce == 0 && klen < el);
}

size_t
chk_config_range(const shardkv_config *cfg, const void *key, size_t klen)
{
	for (size_t i = 0; i < cfg->nranges; i++) {
		const shardkv_range *r = &cfg->ranges[i];
		if (chk_in_range(key, klen, r->start.data, r->start.len, r->end.data, r->end.len))
			return i;
	}
	return SIZE_MAX;
}

bool
chk_config_moving(const shardkv_config *cfg, const void *key, size_t klen)
{
	for (size_t i = 0; cfg != NULL && i < cfg->nmigrations; i++) {
		const shardkv_migration *m = &cfg->migrations[i];
		if (chk_in_range(key, klen, m->start.data, m->start.len, m->end.data, m->end.len))
			return true;
	}
	return false;
}
