/*
 * hdr.c - the log-linear latency histogram of hdr.h.
 *
 * Layout: counts[0 .. 2^S) hold the values 0 .. 2^S - 1 exactly. A value v
 * with highest set bit h >= S falls in octave o = h - S; its bucket inside
 * the octave is the S bits below and including bit h (2^(S-1) buckets, each
 * 2^(o+1) values wide), at counts[2^S + o * 2^(S-1) + (v >> (o+1)) - 2^(S-1)].
 * The histogram also keeps the exact min and max and the span of non-empty
 * buckets, so merging and resetting touch only that span.
 */
#include "client/cli/hdr.h"

#include <stdlib.h>
#include <string.h>

struct kv_hdr {
	unsigned sub_bits;  /* S */
	unsigned high_bits; /* values < 2^high_bits are tracked */
	size_t ncounts;     /* counters */
	uint64_t total;     /* recorded values */
	uint64_t clamped;   /* values above the range, counted at the top */
	uint64_t min, max;  /* exact extremes (after clamping); valid when total > 0 */
	size_t lo, hi;      /* non-empty counters are within [lo, hi]; valid when total > 0 */
	uint64_t counts[];  /* ncounts counters */
};

static size_t
index_of(const kv_hdr *h, uint64_t v)
{
	unsigned s = h->sub_bits, top;
	uint64_t half = (uint64_t)1 << (s - 1);

	if (v < ((uint64_t)1 << s))
		return (size_t)v;
	top = 63u - (unsigned)__builtin_clzll(v);
	return (size_t)(((uint64_t)1 << s) + (uint64_t)(top - s) * half + (v >> (top - s + 1)) -
	                half);
}

/* Returns the lowest value of counter i; *width its number of values. */
static uint64_t
lowest_of(const kv_hdr *h, size_t i, uint64_t *width)
{
	unsigned s = h->sub_bits;
	uint64_t full = (uint64_t)1 << s, half = full >> 1, o, sub;

	if (i < full) {
		*width = 1;
		return i;
	}
	o = (i - full) / half;
	sub = half + (i - full) % half;
	*width = (uint64_t)1 << (o + 1);
	return sub << (o + 1);
}

kv_hdr *
kv_hdr_create(unsigned sub_bits, unsigned high_bits)
{
	kv_hdr *h;
	size_t n;

	if (sub_bits < 2 || sub_bits > 16 || high_bits < sub_bits || high_bits > 63)
		return NULL;
	n = ((size_t)1 << sub_bits) +
	    (size_t)(high_bits - sub_bits) * ((size_t)1 << (sub_bits - 1));
	if ((h = calloc(1, sizeof(*h) + n * sizeof(uint64_t))) == NULL)
		return NULL;
	h->sub_bits = sub_bits;
	h->high_bits = high_bits;
	h->ncounts = n;
	return h;
}

void
kv_hdr_destroy(kv_hdr *h)
{
	free(h);
}

void
kv_hdr_record_n(kv_hdr *h, uint64_t v, uint64_t n)
{
	uint64_t vmax = (((uint64_t)1 << (h->high_bits - 1)) << 1) - 1;
	size_t i;

	if (n == 0)
		return;
	if (v > vmax) {
		v = vmax;
		h->clamped += n;
	}
	i = index_of(h, v);
	h->counts[i] += n;
	if (h->total == 0) {
		h->min = h->max = v;
		h->lo = h->hi = i;
	} else {
		if (v < h->min)
			h->min = v;
		if (v > h->max)
			h->max = v;
		if (i < h->lo)
			h->lo = i;
		if (i > h->hi)
			h->hi = i;
	}
	h->total += n;
}

void
kv_hdr_record(kv_hdr *h, uint64_t v)
{
	kv_hdr_record_n(h, v, 1);
}

bool
kv_hdr_merge(kv_hdr *dst, const kv_hdr *src)
{
	if (dst->sub_bits != src->sub_bits || dst->high_bits != src->high_bits)
		return false;
	if (src->total == 0)
		return true;
	for (size_t i = src->lo; i <= src->hi; i++)
		dst->counts[i] += src->counts[i];
	if (dst->total == 0) {
		dst->min = src->min;
		dst->max = src->max;
		dst->lo = src->lo;
		dst->hi = src->hi;
	} else {
		dst->min = src->min < dst->min ? src->min : dst->min;
		dst->max = src->max > dst->max ? src->max : dst->max;
		dst->lo = src->lo < dst->lo ? src->lo : dst->lo;
		dst->hi = src->hi > dst->hi ? src->hi : dst->hi;
	}
	dst->total += src->total;
	dst->clamped += src->clamped;
	return true;
}

void
kv_hdr_reset(kv_hdr *h)
{
	if (h->total)
		memset(&h->counts[h->lo], 0, (h->hi - h->lo + 1) * sizeof(uint64_t));
	h->total = h->clamped = h->min = h->max = 0;
	h->lo = h->hi = 0;
}

uint64_t
kv_hdr_count(const kv_hdr *h)
{
	return h->total;
}

uint64_t
kv_hdr_clamped(const kv_hdr *h)
{
	return h->clamped;
}

uint64_t
kv_hdr_min(const kv_hdr *h)
{
	return h->total ? h->min : 0;
}

uint64_t
kv_hdr_max(const kv_hdr *h)
{
	return h->total ? h->max : 0;
}

double
kv_hdr_mean(const kv_hdr *h)
{
	double sum = 0;
	uint64_t w;

	if (h->total == 0)
		return 0;
	for (size_t i = h->lo; i <= h->hi; i++)
		if (h->counts[i]) {
			uint64_t low = lowest_of(h, i, &w);
			sum += (double)h->counts[i] * ((double)low + (double)(w - 1) / 2.0);
		}
	return sum / (double)h->total;
}

uint64_t
kv_hdr_highest_equivalent(const kv_hdr *h, uint64_t v)
{
	uint64_t vmax = (((uint64_t)1 << (h->high_bits - 1)) << 1) - 1, w, low;

	if (v > vmax)
		v = vmax;
	low = lowest_of(h, index_of(h, v), &w);
	return low + (w - 1);
}

uint64_t
kv_hdr_percentile(const kv_hdr *h, double p)
{
	uint64_t rank, seen = 0, w;
	double r;

	if (h->total == 0)
		return 0;
	if (p < 0)
		p = 0;
	if (p > 100)
		p = 100;
	r = p / 100.0 * (double)h->total;
	rank = (uint64_t)r;
	if ((double)rank < r)
		rank++; /* ceil */
	if (rank == 0)
		rank = 1;
	if (rank > h->total)
		rank = h->total;
	for (size_t i = h->lo; i <= h->hi; i++) {
		seen += h->counts[i];
		if (seen >= rank) {
			uint64_t v = lowest_of(h, i, &w) + (w - 1);
			return v < h->max ? v : h->max;
		}
	}
	return h->max;
}

void
kv_hdr_foreach(const kv_hdr *h, void (*fn)(void *arg, uint64_t v, uint64_t n), void *arg)
{
	uint64_t w;

	if (h->total == 0)
		return;
	for (size_t i = h->lo; i <= h->hi; i++)
		if (h->counts[i] != 0) {
			uint64_t v = lowest_of(h, i, &w) + (w - 1);
			fn(arg, v < h->max ? v : h->max, h->counts[i]);
		}
}
