/*
 * fsync_cost.c - what an fdatasync after a small write costs on a disk,
 * when the write grows the file and when it lands in zeros written ahead
 * (the two ways the write-ahead log can write; doc/durability.md "The
 * log").
 *
 *   shardkv-fsync-cost [--dir DIR] [--rounds N] [--bytes B] [--ahead KIB]
 *                      [--fallocate]
 *
 * Creates DIR/fsync-cost.dat, then N rounds of a B-byte pwrite at the end
 * of the records and an fdatasync. --ahead KIB: before a write that would
 * pass the zeros' end, write KIB KiB of zeros there (0: every write grows
 * the file); --fallocate: fallocate the whole file first instead. Prints
 * one line: the average, p50, p99, p99.9 and max per round, in us. The
 * file is removed at the end.
 */
#define _GNU_SOURCE
#include "bench/bench_util.h"
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int
usage(void)
{
	fprintf(stderr, "usage: shardkv-fsync-cost [--dir DIR] [--rounds N] [--bytes B] "
	                "[--ahead KIB] [--fallocate]\n");
	return 2;
}

int
main(int argc, char **argv)
{
	const char *dir = ".";
	long rounds = 10000, bytes = 3700, ahead_kib = 0;
	int falloc = 0;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--fallocate") == 0) {
			falloc = 1;
			continue;
		}
		if (i + 1 >= argc)
			return usage();
		const char *v = argv[++i];
		if (strcmp(a, "--dir") == 0)
			dir = v;
		else if (strcmp(a, "--rounds") == 0 ? bench_parse_long(v, 1, 10000000, &rounds) != 0
		         : strcmp(a, "--bytes") == 0 ? bench_parse_long(v, 1, 1 << 24, &bytes) != 0
		         : strcmp(a, "--ahead") == 0
		             ? bench_parse_long(v, 0, 1 << 20, &ahead_kib) != 0
		             : 1)
			return usage();
	}

	char path[4096];
	if (snprintf(path, sizeof(path), "%s/fsync-cost.dat", dir) >= (int)sizeof(path))
		return usage();
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		fprintf(stderr, "shardkv-fsync-cost: cannot create %s: %s\n", path,
		        strerror(errno));
		return 1;
	}
	size_t ahead = (size_t)ahead_kib * 1024;
	char *buf = malloc((size_t)bytes);
	char *zeros = calloc(1, ahead ? ahead : 1);
	double *lat = malloc((size_t)rounds * sizeof(double));
	int rc = 1;
	if (buf == NULL || zeros == NULL || lat == NULL) {
		fprintf(stderr, "shardkv-fsync-cost: out of memory\n");
		goto out;
	}
	memset(buf, 'x', (size_t)bytes);
	if (falloc && (fallocate(fd, 0, 0, (off_t)(rounds * bytes)) != 0 || fsync(fd) != 0)) {
		fprintf(stderr, "shardkv-fsync-cost: fallocate: %s\n", strerror(errno));
		goto out;
	}
	off_t off = 0, zend = 0;
	double t0 = bench_now_s();
	for (long i = 0; i < rounds; i++) {
		if (ahead > 0 && off + bytes > zend) {
			if (pwrite(fd, zeros, ahead, zend) != (ssize_t)ahead)
				goto io;
			zend += (off_t)ahead;
		}
		double a = bench_now_s();
		if (pwrite(fd, buf, (size_t)bytes, off) != (ssize_t)bytes || fdatasync(fd) != 0)
			goto io;
		lat[i] = bench_now_s() - a;
		off += bytes;
	}
	double total = bench_now_s() - t0;
	qsort(lat, (size_t)rounds, sizeof(double), bench_cmp_double);
	printf("rounds=%ld bytes=%ld ahead_kib=%ld fallocate=%d avg_us=%.1f p50_us=%.0f "
	       "p99_us=%.0f p999_us=%.0f max_us=%.0f\n",
	       rounds, bytes, ahead_kib, falloc, total / (double)rounds * 1e6,
	       lat[rounds / 2] * 1e6, lat[rounds * 99 / 100] * 1e6, lat[rounds * 999 / 1000] * 1e6,
	       lat[rounds - 1] * 1e6);
	rc = 0;
	goto out;
io:
	fprintf(stderr, "shardkv-fsync-cost: write or sync of %s: %s\n", path, strerror(errno));
out:
	close(fd);
	unlink(path);
	free(buf);
	free(zeros);
	free(lat);
	return rc;
}
