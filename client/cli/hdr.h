/*
 * hdr.h - a high-dynamic-range histogram of unsigned 64-bit values
 * (latencies in nanoseconds), in the log-linear layout of HdrHistogram:
 * values below 2^S are counted exactly; above, every power-of-two octave is
 * cut into 2^(S-1) equal buckets, so a recorded value is known to within a
 * relative error of 2^-(S-1) however large it is (S = 10: 0.2 %).
 *
 * Memory is fixed at creation: (2^S + (H - S + 1) * 2^(S-1)) counters for
 * values up to 2^H - 1; larger values are clamped to the top (and counted as
 * clamped). A histogram is not thread-safe: one writer, or a lock.
 */
#ifndef KV_CLIENT_CLI_HDR_H
#define KV_CLIENT_CLI_HDR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct kv_hdr kv_hdr;

/*
 * Creates an empty histogram with 2^sub_bits exact values (sub_bits 2..16)
 * and room for values up to 2^high_bits - 1 (high_bits sub_bits..63).
 * Returns NULL on a bad argument or out of memory. Free with kv_hdr_destroy().
 */
kv_hdr *kv_hdr_create(unsigned sub_bits, unsigned high_bits);

/* Frees a histogram. Accepts NULL. */
void kv_hdr_destroy(kv_hdr *h);

/* Counts `n` occurrences of value v (clamped to the largest trackable). */
void kv_hdr_record_n(kv_hdr *h, uint64_t v, uint64_t n);

/* Counts one occurrence of v. */
void kv_hdr_record(kv_hdr *h, uint64_t v);

/* Adds every count of src to dst. Returns false (and changes nothing) when
 * the two were created with different parameters. */
bool kv_hdr_merge(kv_hdr *dst, const kv_hdr *src);

/* Empties the histogram (cost proportional to the recorded value span). */
void kv_hdr_reset(kv_hdr *h);

/* Returns the number of recorded values. */
uint64_t kv_hdr_count(const kv_hdr *h);

/* Returns how many recorded values were above the trackable range. */
uint64_t kv_hdr_clamped(const kv_hdr *h);

/* Returns the exact smallest / largest recorded value (after clamping);
 * 0 when empty. */
uint64_t kv_hdr_min(const kv_hdr *h);
uint64_t kv_hdr_max(const kv_hdr *h);

/* Returns the mean of the recorded values, by bucket midpoints; 0 when empty. */
double kv_hdr_mean(const kv_hdr *h);

/*
 * Returns the value at percentile p (0..100): the largest value equivalent
 * to the ceil(p/100 * count)-th smallest recorded value (at least the first),
 * capped at kv_hdr_max(). So the result is never below the true percentile
 * and above it by at most the bucket's relative width. 0 when empty.
 */
uint64_t kv_hdr_percentile(const kv_hdr *h, double p);

/* Returns the largest value counted in the same bucket as v. */
uint64_t kv_hdr_highest_equivalent(const kv_hdr *h, uint64_t v);

/* Calls fn(arg, v, n) for every non-empty bucket in increasing order: v is
 * the bucket's largest value capped at kv_hdr_max() (as kv_hdr_percentile
 * reports it), n its count. */
void kv_hdr_foreach(const kv_hdr *h, void (*fn)(void *arg, uint64_t v, uint64_t n), void *arg);

#endif
