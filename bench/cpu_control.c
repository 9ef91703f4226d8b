/*
 * cpu_control.c - loads with no shardkv code in them, to stand in for a
 * move in bench/migration-under-load.sh (-C): what the same work costs the
 * other ranges when any program does it on the same CPUs.
 *
 *   shardkv-cpu-control copy --bytes N [--rate MB/s] [--chunk B] [--sink file|none] [--dir DIR]
 *   shardkv-cpu-control write --bytes N [--rate MB/s] [--chunk B] [--dir DIR]
 *   shardkv-cpu-control burn --cpu-ms MS --secs S [--procs P] [--nice N]
 *
 * copy: two processes, as a move's source and destination are: one sends
 * N bytes over a loopback TCP connection in chunks of B bytes (default 1
 * MiB), at most --rate MB/s (default 0: as fast as it can); the other
 * receives them and writes them to DIR/cpu-control.dat (default DIR: .),
 * with an fdatasync at every 8 MiB and at the end, as a move's side log is
 * written (--sink none: it drops them). The bare copy of a range's bytes.
 *
 * write: one process writes N bytes to that file as the receiver does: the
 * copy's disk half alone.
 *
 * burn: P processes (default 2) that together spend MS ms of CPU in user
 * space, spread evenly over S seconds: each spins for its share of every
 * millisecond and sleeps the rest, at nice N from the caller's (default 0).
 *
 * Prints one line: the work, the wall time and the CPU time the processes
 * used (ms, getrusage of the children). Every child ends with the program;
 * the file is removed at the end. Exit status 0, 1 when a child failed, 2
 * on a usage error.
 */
#define _GNU_SOURCE
#include "bench/bench_util.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SYNC_EVERY (8u << 20) /* bytes between two fdatasyncs of the sink */

/* Sleeps until the monotonic time t (seconds). */
static void
sleep_until(double t)
{
	struct timespec ts = {.tv_sec = (time_t)t,
	                      .tv_nsec = (long)((t - (double)(time_t)t) * 1e9)};
	while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
		;
}

/* After `done` bytes, waits until they are due at `mbs` MB/s from t0. */
static void
pace(double t0, uint64_t done, double mbs)
{
	if (mbs > 0)
		sleep_until(t0 + (double)done / (mbs * 1e6));
}

static double
children_cpu_ms(void)
{
	struct rusage r;
	getrusage(RUSAGE_CHILDREN, &r);
	return (double)(r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1e3 +
	       (double)(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e3;
}

static int
usage(void)
{
	fprintf(stderr,
	        "usage: shardkv-cpu-control copy --bytes N [--rate MB/s] [--chunk B] "
	        "[--sink file|none] [--dir DIR]\n"
	        "       shardkv-cpu-control write --bytes N [--rate MB/s] [--chunk B] [--dir DIR]\n"
	        "       shardkv-cpu-control burn --cpu-ms MS --secs S [--procs P] [--nice N]\n");
	return 2;
}

static int
num(const char *s, double min, double max, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno != 0 || end == s || *end != '\0' || !(v >= min && v <= max))
		return -1;
	*out = v;
	return 0;
}

/* Writes n bytes of p at offset `before` of the sink; an fdatasync when an
 * 8 MiB boundary is passed. */
static int
sink_write(int fd, const char *p, size_t n, uint64_t before)
{
	size_t off = 0;
	while (off < n) {
		ssize_t w = write(fd, p + off, n - off);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		off += (size_t)w;
	}
	if ((before + n) / SYNC_EVERY != before / SYNC_EVERY && fdatasync(fd) != 0)
		return -1;
	return 0;
}

static int
open_sink(const char *path)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		fprintf(stderr, "shardkv-cpu-control: cannot create %s: %s\n", path,
		        strerror(errno));
	return fd;
}

static void
fill(char *p, size_t n)
{
	uint64_t x = 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		p[i] = (char)x;
	}
}

/* The receiving process: n bytes from the connection, into the sink. */
static int
receive(int ls, uint64_t n, size_t chunk, const char *path)
{
	int c = accept(ls, NULL, NULL), fd = -1;
	char *buf = malloc(chunk);
	uint64_t got = 0;

	if (c < 0 || buf == NULL || (path != NULL && (fd = open_sink(path)) < 0))
		return 1;
	while (got < n) {
		size_t want = n - got < chunk ? (size_t)(n - got) : chunk;
		ssize_t r = recv(c, buf, want, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		if (fd >= 0 && sink_write(fd, buf, (size_t)r, got) != 0)
			return 1;
		got += (uint64_t)r;
	}
	if (fd >= 0 && (fdatasync(fd) != 0 || close(fd) != 0))
		return 1;
	close(c);
	free(buf);
	return got == n ? 0 : 1;
}

/* The sending process: n bytes in chunks, paced. */
static int
send_all(uint16_t port, uint64_t n, size_t chunk, double mbs, double t0)
{
	int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET,
	                        .sin_port = htons(port),
	                        .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	char *buf = malloc(chunk);
	uint64_t sent = 0;

	if (s < 0 || buf == NULL || connect(s, (struct sockaddr *)&a, sizeof(a)) != 0)
		return 1;
	fill(buf, chunk);
	while (sent < n) {
		size_t want = n - sent < chunk ? (size_t)(n - sent) : chunk, off = 0;
		while (off < want) {
			ssize_t w = send(s, buf + off, want - off, MSG_NOSIGNAL);
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				return 1;
			off += (size_t)w;
		}
		sent += want;
		pace(t0, sent, mbs);
	}
	close(s);
	free(buf);
	return 0;
}

static int
reap(pid_t p)
{
	int st;
	while (waitpid(p, &st, 0) < 0)
		if (errno != EINTR)
			return 1;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
}

static int
run_copy(uint64_t n, double mbs, size_t chunk, const char *path)
{
	int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t al = sizeof(a);

	if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof(a)) != 0 || listen(ls, 1) != 0 ||
	    getsockname(ls, (struct sockaddr *)&a, &al) != 0) {
		fprintf(stderr, "shardkv-cpu-control: no loopback socket: %s\n", strerror(errno));
		return 1;
	}
	double t0 = bench_now_s();
	pid_t rp = fork();
	if (rp == 0)
		_exit(receive(ls, n, chunk, path));
	close(ls);
	pid_t sp = rp < 0 ? -1 : fork();
	if (sp == 0)
		_exit(send_all(ntohs(a.sin_port), n, chunk, mbs, t0));
	int bad = rp < 0 || sp < 0;
	if (sp > 0)
		bad |= reap(sp);
	if (rp > 0)
		bad |= reap(rp);
	double wall = bench_now_s() - t0;
	printf("copy %llu bytes in %.0f ms (%.1f MB/s), CPU %.0f ms%s\n", (unsigned long long)n,
	       wall * 1e3, (double)n / 1e6 / wall, children_cpu_ms(), bad ? ", FAILED" : "");
	return bad;
}

static int
write_all(uint64_t n, double mbs, size_t chunk, const char *path, double t0)
{
	char *buf = malloc(chunk);
	int fd = open_sink(path);
	uint64_t done = 0;

	if (buf == NULL || fd < 0)
		return 1;
	fill(buf, chunk);
	while (done < n) {
		size_t want = n - done < chunk ? (size_t)(n - done) : chunk;
		if (sink_write(fd, buf, want, done) != 0)
			return 1;
		done += want;
		pace(t0, done, mbs);
	}
	free(buf);
	return fdatasync(fd) != 0 || close(fd) != 0;
}

static int
run_write(uint64_t n, double mbs, size_t chunk, const char *path)
{
	double t0 = bench_now_s();
	pid_t p = fork();
	if (p == 0)
		_exit(write_all(n, mbs, chunk, path, t0));
	int bad = p < 0 || reap(p);
	double wall = bench_now_s() - t0;
	printf("write %llu bytes in %.0f ms (%.1f MB/s), CPU %.0f ms%s\n", (unsigned long long)n,
	       wall * 1e3, (double)n / 1e6 / wall, children_cpu_ms(), bad ? ", FAILED" : "");
	return bad;
}

static void
spin(double share, double end, int nice_by)
{
	if (nice_by != 0) {
		errno = 0;
		if (nice(nice_by) == -1 && errno != 0)
			_exit(1);
	}
	for (double next = bench_now_s(); next < end;) {
		double stop = next + share * 1e-3;
		while (bench_now_s() < stop)
			;
		next += 1e-3;
		sleep_until(next);
	}
	_exit(0);
}

static int
run_burn(double cpu_ms, double secs, int procs, int nice_by)
{
	double share = cpu_ms / (double)procs / (secs * 1e3); /* of each ms, per process */
	pid_t pid[64];
	int bad = 0, n = 0;

	if (share > 1) {
		fprintf(
		    stderr,
		    "shardkv-cpu-control: %.0f ms of CPU do not fit in %d processes over %g s\n",
		    cpu_ms, procs, secs);
		return 2;
	}
	double t0 = bench_now_s();
	for (; n < procs; n++) {
		pid[n] = fork();
		if (pid[n] == 0)
			spin(share, t0 + secs, nice_by);
		if (pid[n] < 0) {
			bad = 1;
			break;
		}
	}
	for (int i = 0; i < n; i++)
		bad |= reap(pid[i]);
	printf("burn %.0f ms of CPU over %g s in %d processes: %.0f ms, CPU %.0f ms%s\n", cpu_ms,
	       secs, procs, (bench_now_s() - t0) * 1e3, children_cpu_ms(), bad ? ", FAILED" : "");
	return bad;
}

int
main(int argc, char **argv)
{
	double bytes = 0, rate = 0, chunk = 1 << 20, cpu_ms = 0, secs = 0, procs = 2, nice_by = 0;
	const char *dir = ".", *sink = "file";
	char path[4096];

	if (argc < 2)
		return usage();
	const char *mode = argv[1];
	for (int i = 2; i < argc; i += 2) {
		const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (v == NULL)
			return usage();
		if (strcmp(a, "--dir") == 0)
			dir = v;
		else if (strcmp(a, "--sink") == 0 &&
		         (strcmp(v, "file") == 0 || strcmp(v, "none") == 0))
			sink = v;
		else if (strcmp(a, "--bytes") == 0    ? num(v, 1, 1e13, &bytes) != 0
		         : strcmp(a, "--rate") == 0   ? num(v, 0, 1e6, &rate) != 0
		         : strcmp(a, "--chunk") == 0  ? num(v, 1, 1 << 30, &chunk) != 0
		         : strcmp(a, "--cpu-ms") == 0 ? num(v, 0.001, 1e7, &cpu_ms) != 0
		         : strcmp(a, "--secs") == 0   ? num(v, 0.001, 1e5, &secs) != 0
		         : strcmp(a, "--procs") == 0  ? num(v, 1, 64, &procs) != 0
		         : strcmp(a, "--nice") == 0   ? num(v, -39, 39, &nice_by) != 0
		                                      : 1)
			return usage();
	}
	if ((size_t)snprintf(path, sizeof(path), "%s/cpu-control.dat", dir) >= sizeof(path))
		return usage();
	int rv;
	if (strcmp(mode, "copy") == 0 && bytes > 0)
		rv = run_copy((uint64_t)bytes, rate, (size_t)chunk,
		              strcmp(sink, "file") == 0 ? path : NULL);
	else if (strcmp(mode, "write") == 0 && bytes > 0)
		rv = run_write((uint64_t)bytes, rate, (size_t)chunk, path);
	else if (strcmp(mode, "burn") == 0 && cpu_ms > 0 && secs > 0)
		return run_burn(cpu_ms, secs, (int)procs, (int)nice_by);
	else
		return usage();
	unlink(path);
	return rv;
}
