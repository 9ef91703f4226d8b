/*
 * wal_cost.c - what the write-ahead log costs a record, with the segments a
 * snapshot made obsolete reused (spares) and with them removed, in turn in
 * one process (doc/durability.md "The log").
 *
 *   shardkv-wal-cost [--dir DIR] [--mode batch|always] [--mib M] [--bytes B]
 *                    [--drop-mib D] [--runs R]
 *
 * A run opens a log in a fresh directory under DIR (default /tmp), appends
 * M MiB (default 1536) of B-byte records (default 150: a put of a 16-byte
 * key and a 100-byte value with its exactly-once fields) from one thread,
 * and every D MiB (default 256, the server's --snapshot-bytes default)
 * rotates and drops every segment before the rotation, as a snapshot does;
 * then waits until every record is synced and closes the log. Segments are
 * the server's 64 MiB. Runs alternate: with spares (the server's default),
 * then without (kv_wal_opts.no_spares), R times each (default 5). Prints
 * each run's CPU time of the process (user and system, every thread) per
 * record and its records a second, then the medians of each and their
 * ratio. The directories are removed.
 */
#include "bench/bench_util.h"
#include "common/err.h"
#include "common/log.h"
#include "shardserver/durable/wal.h"

#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MIB (1024.0 * 1024.0)

static double
cpu_s(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static double
median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), bench_cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static int
usage(void)
{
	fprintf(stderr, "usage: shardkv-wal-cost [--dir DIR] [--mode batch|always] [--mib M] "
	                "[--bytes B] [--drop-mib D] [--runs R]\n");
	return 2;
}

/* Removes dir and the files in it. */
static void
rm_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[1300];

	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		unlink(path);
	}
	closedir(d);
	rmdir(dir);
}

/* One run; *cpu_us gets the CPU a record, *rate the records a second. */
static int
run(const char *base, kv_fsync_mode mode, bool spares, uint64_t total, size_t bytes, uint64_t drop,
    double *cpu_us, double *rate)
{
	char dir[1024], err[256];
	kv_wal_opts o = {.mode = mode, .no_spares = !spares};
	uint8_t *rec = malloc(bytes);
	uint64_t n = total / bytes, lsn = 0, since = 0, at;
	kv_wal *w = NULL;
	double t0, c0;
	int rv;

	if (rec == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < bytes; i++)
		rec[i] = (uint8_t)(i * 31u + 7u);
	snprintf(dir, sizeof(dir), "%s/shardkv-wal-cost.XXXXXX", base);
	if (mkdtemp(dir) == NULL) {
		fprintf(stderr, "shardkv-wal-cost: cannot create a dir in %s: %s\n", base,
		        strerror(errno));
		free(rec);
		return KV_EIO;
	}
	o.dir = dir;
	t0 = bench_now_s();
	c0 = cpu_s();
	if ((rv = kv_wal_open(&o, 1, &w, err, sizeof(err))) != KV_OK) {
		fprintf(stderr, "shardkv-wal-cost: %s\n", err);
		goto out;
	}
	for (uint64_t i = 0; i < n && rv == KV_OK; i++) {
		struct iovec iov = {rec, bytes};
		rec[0] = (uint8_t)i; /* not the same bytes every time */
		rv = kv_wal_appendv(w, &iov, 1, &lsn);
		since += bytes;
		if (rv == KV_OK && since >= drop) {
			since = 0;
			if ((rv = kv_wal_rotate(w, &at)) == KV_OK)
				rv = kv_wal_drop_before(w, at);
		}
	}
	if (rv == KV_OK)
		rv = kv_wal_wait(w, lsn, true);
	kv_wal_close(w);
	if (rv != KV_OK) {
		fprintf(stderr, "shardkv-wal-cost: %s\n", kv_strerror(rv));
		goto out;
	}
	*cpu_us = (cpu_s() - c0) * 1e6 / (double)n;
	*rate = (double)n / (bench_now_s() - t0);
out:
	rm_dir(dir);
	free(rec);
	return rv;
}

int
main(int argc, char **argv)
{
	const char *dir = "/tmp";
	kv_fsync_mode mode = KV_FSYNC_BATCH;
	long mib = 1536, bytes = 150, drop_mib = 256, runs = 5;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (v == NULL)
			return usage();
		if (strcmp(a, "--dir") == 0)
			dir = v;
		else if (strcmp(a, "--mode") == 0) {
			if (kv_fsync_mode_parse(v, &mode) != KV_OK || mode == KV_FSYNC_NONE)
				return usage();
		} else if (strcmp(a, "--mib") == 0) {
			if (bench_parse_long(v, 1, 1 << 20, &mib) != 0)
				return usage();
		} else if (strcmp(a, "--bytes") == 0) {
			if (bench_parse_long(v, 1, 1 << 20, &bytes) != 0)
				return usage();
		} else if (strcmp(a, "--drop-mib") == 0) {
			if (bench_parse_long(v, 1, 1 << 20, &drop_mib) != 0)
				return usage();
		} else if (strcmp(a, "--runs") == 0) {
			if (bench_parse_long(v, 1, 100, &runs) != 0)
				return usage();
		} else {
			return usage();
		}
		i++;
	}
	kv_log_set_level(KV_LOG_WARN);

	double *cpu[2], *rate[2];
	for (int k = 0; k < 2; k++) {
		cpu[k] = calloc((size_t)runs, sizeof(double));
		rate[k] = calloc((size_t)runs, sizeof(double));
		if (cpu[k] == NULL || rate[k] == NULL)
			return 1;
	}
	printf("%s, %ld MiB of %ld-byte records a run, a drop every %ld MiB\n",
	       kv_fsync_mode_name(mode), mib, bytes, drop_mib);
	for (long r = 0; r < runs; r++) {
		for (int k = 0; k < 2; k++) {
			if (run(dir, mode, k == 0, (uint64_t)(mib * MIB), (size_t)bytes,
			        (uint64_t)(drop_mib * MIB), &cpu[k][r], &rate[k][r]) != KV_OK)
				return 1;
			printf("run %ld  %-9s  %6.3f us of CPU a record  %9.0f records/s\n", r + 1,
			       k == 0 ? "spares" : "no spares", cpu[k][r], rate[k][r]);
			fflush(stdout);
		}
	}
	double cs = median(cpu[0], (int)runs), cn = median(cpu[1], (int)runs);
	double rs = median(rate[0], (int)runs), rn = median(rate[1], (int)runs);
	printf("medians: spares %.3f us a record, %.0f records/s; no spares %.3f us, %.0f "
	       "records/s; CPU spares / no spares = %.2f, rate = %.2f\n",
	       cs, rs, cn, rn, cs / cn, rs / rn);
	for (int k = 0; k < 2; k++) {
		free(cpu[k]);
		free(rate[k]);
	}
	return 0;
}
