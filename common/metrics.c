/*
 * metrics.c - the Prometheus text endpoint (metrics.h).
 *
 * The thread polls the listening socket and a pipe; kv_metrics_destroy
 * writes to the pipe to stop it. Every connection is served to completion
 * before the next is accepted, so a slow or hostile client delays only
 * scrapes, and never for longer than REQ_MS to send its request head plus
 * SEND_MS to take the answer. The request is read into a fixed buffer: a
 * client cannot make the thread allocate. Sockets are polled, never waited
 * on without a deadline, and written with MSG_NOSIGNAL.
 */
#include "common/metrics.h"
#include "common/err.h"
#include "common/log.h"
#include "kv_version.h"

#include <dirent.h>
#include <sys/resource.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define REQ_MAX       4096u /* request head bytes kept; more is a 400 */
#define REQ_MS        1000  /* time a client has to send its request head */
#define SEND_MS       2000  /* time a client has to take the answer */
#define ACCEPT_NAP_MS 100   /* pause after a failed accept (e.g. out of fds) */

/* Bodies of the error answers. */
#define TOO_LONG  "request too long\n"
#define NOT_FOUND "not found\n"
#define FAILED    "cannot render metrics\n"
#define HEALTHY   "ok\n"

struct kv_metrics {
	int fd;                      /* listening socket */
	int stop[2];                 /* stop pipe: [0] polled, [1] written by destroy */
	pthread_t thread;            /* the server thread */
	kv_metrics_render_fn render; /* produces the text */
	kv_metrics_health_fn health; /* /healthz; NULL: healthy */
	void *arg;                   /* their argument */
};

static int64_t
now_ms(void)
{
	return (int64_t)(kv_now_ns() / 1000000u);
}

/* Whether the n bytes at p hold a blank line ending the request head,
 * looking only at bytes from `from` on (earlier ones were checked). */
static bool
head_complete(const char *p, size_t from, size_t n)
{
	for (size_t i = from; i < n; i++) {
		if (p[i] != '\n')
			continue;
		if (i + 1 < n && p[i + 1] == '\n')
			return true;
		if (i + 2 < n && p[i + 1] == '\r' && p[i + 2] == '\n')
			return true;
	}
	return false;
}

/* Reads the request head into req until its blank line, EOF, an error, the
 * buffer's end or the deadline, whichever comes first. Returns its length. */
static size_t
read_head(int fd, char *req, size_t cap)
{
	int64_t deadline = now_ms() + REQ_MS;
	size_t n = 0;

	while (n < cap) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int64_t left = deadline - now_ms();
		if (left <= 0)
			break;
		int r = poll(&p, 1, (int)left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		ssize_t got = recv(fd, req + n, cap - n, MSG_DONTWAIT);
		if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
			continue;
		if (got <= 0)
			break;
		size_t from = n > 2 ? n - 2 : 0;
		n += (size_t)got;
		if (head_complete(req, from, n))
			break;
	}
	return n;
}

/* Sends n bytes by the deadline. Returns 0 or KV_ETIMEDOUT / KV_EIO. */
static int
send_all(int fd, const void *buf, size_t n, int64_t deadline)
{
	const char *p = buf;

	while (n > 0) {
		struct pollfd pf = {.fd = fd, .events = POLLOUT};
		int64_t left = deadline - now_ms();
		if (left <= 0)
			return KV_ETIMEDOUT;
		int r = poll(&pf, 1, (int)left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return KV_EIO;
		if (r == 0)
			return KV_ETIMEDOUT;
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
			continue;
		if (w <= 0)
			return KV_EIO;
		p += w;
		n -= (size_t)w;
	}
	return KV_OK;
}

/* Sends one HTTP/1.0 answer; a failure ends the connection and is not
 * reported (the scraper sees a short answer). */
static void
answer(int fd, const char *status, const char *ctype, const void *body, size_t len)
{
	int64_t deadline = now_ms() + SEND_MS;
	char hdr[256];
	int h = snprintf(hdr, sizeof(hdr),
	                 "HTTP/1.0 %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
	                 "Connection: close\r\n\r\n",
	                 status, ctype, len);

	if (h <= 0 || (size_t)h >= sizeof(hdr))
		return;
	if (send_all(fd, hdr, (size_t)h, deadline) == KV_OK && len > 0)
		(void)send_all(fd, body, len, deadline);
}

static void
serve(kv_metrics *m, int fd)
{
	static const char text[] = "text/plain; charset=utf-8";
	char req[REQ_MAX];
	size_t n = read_head(fd, req, sizeof(req));
	const char *eol = memchr(req, '\n', n);

	if (eol == NULL) {
		/* No request line: too long, or the client went quiet or away. */
		if (n == sizeof(req))
			answer(fd, "400 Bad Request", text, TOO_LONG, sizeof(TOO_LONG) - 1);
		return;
	}
	if (n >= 13 &&
	    (memcmp(req, "GET /healthz ", 13) == 0 || memcmp(req, "GET /healthz?", 13) == 0)) {
		char why[256] = "", msg[300];
		if (m->health == NULL || m->health(m->arg, why, sizeof(why)) == KV_OK) {
			answer(fd, "200 OK", text, HEALTHY, sizeof(HEALTHY) - 1);
		} else {
			int len = snprintf(msg, sizeof(msg), "unavailable: %s\n",
			                   why[0] ? why : "unhealthy");
			answer(fd, "503 Service Unavailable", text, msg,
			       len > 0 && (size_t)len < sizeof(msg) ? (size_t)len
			                                            : sizeof(msg) - 1);
		}
		return;
	}
	if (n < 13 ||
	    (memcmp(req, "GET /metrics ", 13) != 0 && memcmp(req, "GET /metrics?", 13) != 0)) {
		answer(fd, "404 Not Found", text, NOT_FOUND, sizeof(NOT_FOUND) - 1);
		return;
	}
	kv_buf body = {0};
	if (m->render(m->arg, &body) == KV_OK && kv_metrics_write_process(&body) == KV_OK)
		answer(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", body.data,
		       body.len);
	else
		answer(fd, "500 Internal Server Error", text, FAILED, sizeof(FAILED) - 1);
	kv_buf_fini(&body);
}

static void *
metrics_main(void *arg)
{
	kv_metrics *m = arg;

	kv_log_thread_name("kv-metrics");
	for (;;) {
		struct pollfd p[2] = {{.fd = m->fd, .events = POLLIN},
		                      {.fd = m->stop[0], .events = POLLIN}};
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		if (p[1].revents)
			break;
		if (!(p[0].revents & POLLIN))
			continue;
		int fd = accept(m->fd, NULL, NULL);
		if (fd < 0) {
			/* Out of descriptors or memory: the socket stays readable,
			 * so pause instead of spinning (still honouring stop). */
			if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED &&
			    poll(&p[1], 1, ACCEPT_NAP_MS) > 0)
				break;
			continue;
		}
		(void)fcntl(fd, F_SETFD, FD_CLOEXEC);
		serve(m, fd);
		shutdown(fd, SHUT_WR);
		close(fd);
	}
	return NULL;
}

int
kv_metrics_create(const char *hostport, kv_metrics_render_fn render, void *arg, kv_metrics **out,
                  char *err, size_t errlen)
{
	return kv_metrics_create_ex(hostport, render, NULL, arg, out, err, errlen);
}

int
kv_metrics_create_ex(const char *hostport, kv_metrics_render_fn render, kv_metrics_health_fn health,
                     void *arg, kv_metrics **out, char *err, size_t errlen)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
	                         .ai_socktype = SOCK_STREAM,
	                         .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
	                *ai = NULL;
	char host[256];
	const char *colon = hostport ? strrchr(hostport, ':') : NULL;
	size_t hlen;
	kv_metrics *m;
	int one = 1, rv = KV_EINVAL;

	if (render == NULL || out == NULL)
		return KV_EINVAL;
	if (colon == NULL || colon[1] == '\0' || (size_t)(colon - hostport) >= sizeof(host)) {
		snprintf(err, errlen, "invalid --metrics address %s (want HOST:PORT)",
		         hostport ? hostport : "(null)");
		return KV_EINVAL;
	}
	hlen = (size_t)(colon - hostport);
	memcpy(host, hostport, hlen);
	host[hlen] = '\0';
	if (hlen >= 2 && host[0] == '[' && host[hlen - 1] == ']') {
		memmove(host, host + 1, hlen - 2);
		host[hlen - 2] = '\0';
	}
	if (getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, &ai) != 0 || ai == NULL) {
		snprintf(err, errlen, "invalid --metrics address %s (want HOST:PORT)", hostport);
		return KV_EINVAL;
	}
	if ((m = calloc(1, sizeof(*m))) == NULL) {
		freeaddrinfo(ai);
		snprintf(err, errlen, "out of memory");
		return KV_ENOMEM;
	}
	m->render = render;
	m->health = health;
	m->arg = arg;
	m->stop[0] = m->stop[1] = -1;
	m->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (m->fd < 0) {
		snprintf(err, errlen, "cannot serve metrics on %s: %s", hostport, strerror(errno));
		goto err;
	}
	setsockopt(m->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(m->fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(m->fd, 16) != 0) {
		rv = errno == EADDRINUSE ? KV_EADDRINUSE : KV_EINVAL;
		snprintf(err, errlen, "cannot serve metrics on %s: %s", hostport, strerror(errno));
		goto err;
	}
	if (pipe(m->stop) != 0) {
		m->stop[0] = m->stop[1] = -1;
		rv = KV_ENOMEM;
		snprintf(err, errlen, "cannot start the metrics thread: %s", strerror(errno));
		goto err;
	}
	(void)fcntl(m->stop[0], F_SETFD, FD_CLOEXEC);
	(void)fcntl(m->stop[1], F_SETFD, FD_CLOEXEC);
	if (pthread_create(&m->thread, NULL, metrics_main, m) != 0) {
		rv = KV_ENOMEM;
		snprintf(err, errlen, "cannot start the metrics thread");
		goto err;
	}
	freeaddrinfo(ai);
	*out = m;
	return KV_OK;
err:
	freeaddrinfo(ai);
	if (m->fd >= 0)
		close(m->fd);
	if (m->stop[0] >= 0) {
		close(m->stop[0]);
		close(m->stop[1]);
	}
	free(m);
	return rv;
}

void
kv_metrics_destroy(kv_metrics *m)
{
	if (m == NULL)
		return;
	(void)!write(m->stop[1], "x", 1);
	pthread_join(m->thread, NULL);
	close(m->stop[0]);
	close(m->stop[1]);
	close(m->fd);
	free(m);
}

/* ------------------------------------------------------------------------
 * Text format
 * ------------------------------------------------------------------------ */

static int
put(kv_buf *out, const char *s)
{
	return kv_buf_append(out, s, strlen(s));
}

/* Appends s with backslash and newline escaped, and '"' too when quoted
 * (label values); HELP text escapes only the first two. */
static int
put_escaped(kv_buf *out, const char *s, bool quoted)
{
	int rv = KV_OK;

	for (; *s && rv == KV_OK; s++) {
		if (*s == '\\')
			rv = put(out, "\\\\");
		else if (*s == '\n')
			rv = put(out, "\\n");
		else if (*s == '"' && quoted)
			rv = put(out, "\\\"");
		else
			rv = kv_buf_append(out, s, 1);
	}
	return rv;
}

/* Appends one sample's value as Prometheus spells it. */
static int
put_value(kv_buf *out, const kv_metric *m)
{
	char v[64];

	if (!m->real)
		snprintf(v, sizeof(v), "%" PRIu64, m->u);
	else if (isnan(m->f))
		snprintf(v, sizeof(v), "NaN");
	else if (isinf(m->f))
		snprintf(v, sizeof(v), "%cInf", m->f > 0 ? '+' : '-');
	else
		snprintf(v, sizeof(v), "%.15g", m->f);
	return put(out, v);
}

/* HELP and TYPE lines of m's family. */
static int
write_head(kv_buf *out, const kv_metric *m)
{
	int rv;

	if ((rv = put(out, "# HELP ")) != KV_OK || (rv = put(out, m->name)) != KV_OK ||
	    (rv = put(out, " ")) != KV_OK || (rv = put_escaped(out, m->help, false)) != KV_OK ||
	    (rv = put(out, "\n# TYPE ")) != KV_OK || (rv = put(out, m->name)) != KV_OK ||
	    (rv = put(out, " ")) != KV_OK || (rv = put(out, m->type)) != KV_OK)
		return rv;
	return put(out, "\n");
}

/* One sample line: name{label="value"} value. */
static int
write_sample(kv_buf *out, const kv_metric *m)
{
	int rv;

	if ((rv = put(out, m->name)) != KV_OK)
		return rv;
	if (m->label != NULL &&
	    ((rv = put(out, "{")) != KV_OK || (rv = put(out, m->label)) != KV_OK ||
	     (rv = put(out, "=\"")) != KV_OK ||
	     (rv = put_escaped(out, m->lvalue ? m->lvalue : "", true)) != KV_OK ||
	     (rv = put(out, "\"}")) != KV_OK))
		return rv;
	if ((rv = put(out, " ")) != KV_OK || (rv = put_value(out, m)) != KV_OK)
		return rv;
	return put(out, "\n");
}

int
kv_metrics_write(kv_buf *out, const kv_metric *m, size_t n)
{
	int rv = KV_OK;

	for (size_t i = 0; i < n && rv == KV_OK; i++) {
		if (i == 0 || strcmp(m[i].name, m[i - 1].name) != 0)
			rv = write_head(out, &m[i]);
		if (rv == KV_OK)
			rv = write_sample(out, &m[i]);
	}
	return rv;
}

/* ------------------------------------------------------------------------
 * Process figures and build information
 * ------------------------------------------------------------------------ */

/* Reads up to cap - 1 bytes of a small /proc file into buf. Returns the
 * length, or -1. */
static ssize_t
read_small(const char *path, char *buf, size_t cap)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, cap - 1);
	close(fd);
	if (n >= 0)
		buf[n] = '\0';
	return n;
}

/* The process start, in seconds since the epoch: its start time in clock
 * ticks after boot (/proc/self/stat, field 22) plus the boot time
 * (/proc/stat, btime). Returns -1 when either cannot be read. */
static double
start_time_s(void)
{
	char buf[4096];
	const char *p;
	unsigned long long ticks = 0, btime = 0;
	long hz = sysconf(_SC_CLK_TCK);

	if (hz <= 0 || read_small("/proc/self/stat", buf, sizeof(buf)) <= 0 ||
	    (p = strrchr(buf, ')')) == NULL)
		return -1;
	/* After ") ": field 3 (state) onwards; starttime is field 22. */
	p++;
	for (int field = 3; field <= 22 && p; field++) {
		while (*p == ' ')
			p++;
		if (field == 22) {
			ticks = strtoull(p, NULL, 10);
			break;
		}
		p = strchr(p, ' ');
	}
	if (ticks == 0 || read_small("/proc/stat", buf, sizeof(buf)) <= 0 ||
	    (p = strstr(buf, "\nbtime ")) == NULL)
		return -1;
	btime = strtoull(p + 7, NULL, 10);
	return btime ? (double)btime + (double)ticks / (double)hz : -1;
}

/* Open descriptors (entries of /proc/self/fd, without the one reading it),
 * or -1. */
static long
open_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	long n = 0;

	if (d == NULL)
		return -1;
	while ((e = readdir(d)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(d);
	return n > 0 ? n - 1 : 0;
}

int
kv_metrics_write_process(kv_buf *out)
{
	kv_metric m[6];
	size_t n = 0;
	struct rusage ru;
	struct rlimit rl;
	char buf[256];
	double start;
	long fds;
	int rv;

	if (getrusage(RUSAGE_SELF, &ru) == 0)
		m[n++] =
		    (kv_metric){.name = "process_cpu_seconds_total",
		                .type = KV_METRIC_COUNTER,
		                .help = "User and system CPU time spent, in seconds.",
		                .real = true,
		                .f = (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
		                     (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6};
	if (read_small("/proc/self/statm", buf, sizeof(buf)) > 0) {
		unsigned long long size = 0, rss = 0;
		long page = sysconf(_SC_PAGESIZE);
		if (sscanf(buf, "%llu %llu", &size, &rss) == 2 && page > 0)
			m[n++] = (kv_metric){.name = "process_resident_memory_bytes",
			                     .type = KV_METRIC_GAUGE,
			                     .help = "Resident memory size in bytes.",
			                     .u = rss * (unsigned long long)page};
	}
	if ((fds = open_fds()) >= 0)
		m[n++] = (kv_metric){.name = "process_open_fds",
		                     .type = KV_METRIC_GAUGE,
		                     .help = "Open file descriptors.",
		                     .u = (uint64_t)fds};
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		m[n++] = (kv_metric){.name = "process_max_fds",
		                     .type = KV_METRIC_GAUGE,
		                     .help = "Limit of open file descriptors.",
		                     .u = (uint64_t)rl.rlim_cur};
	if ((start = start_time_s()) > 0)
		m[n++] = (kv_metric){.name = "process_start_time_seconds",
		                     .type = KV_METRIC_GAUGE,
		                     .help = "Start time of the process since the Unix epoch, in "
		                             "seconds.",
		                     .real = true,
		                     .f = start};
	if ((rv = kv_metrics_write(out, m, n)) != KV_OK)
		return rv;
	/* Two labels, which kv_metric does not carry: written here. The values
	 * are the build's own (digits, dots, hex), never escaped. */
	if ((rv = put(out, "# HELP shardkv_build_info The version and git commit this binary was "
	                   "built from (commit empty: not built from a git checkout).\n"
	                   "# TYPE shardkv_build_info gauge\nshardkv_build_info{version=\"")) !=
	        KV_OK ||
	    (rv = put_escaped(out, KV_VERSION, true)) != KV_OK ||
	    (rv = put(out, "\",commit=\"")) != KV_OK ||
	    (rv = put_escaped(out, KV_GIT_COMMIT, true)) != KV_OK)
		return rv;
	return put(out, "\"} 1\n");
}

/* ------------------------------------------------------------------------
 * Latency histograms
 * ------------------------------------------------------------------------ */

/* Upper bounds of the finite buckets, in microseconds. */
static const uint32_t lat_bounds_us[KV_LAT_BUCKETS] = {
    50,    100,    250,    500,    1000,    2500,    5000,    10000,    25000,
    50000, 100000, 250000, 500000, 1000000, 2500000, 5000000, 10000000, 30000000,
};

void
kv_lat_hist_observe(kv_lat_hist *h, uint64_t ns)
{
	uint64_t us = ns / 1000;
	size_t i = 0;

	while (i < KV_LAT_BUCKETS && us > lat_bounds_us[i])
		i++;
	atomic_fetch_add_explicit(&h->bucket[i], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
}

/* name_suffix{label="lvalue"[,le="le"]} value */
static int
write_hist_line(kv_buf *out, const char *name, const char *suffix, const char *label,
                const char *lvalue, const char *le, const char *value)
{
	int rv;

	if ((rv = put(out, name)) != KV_OK || (rv = put(out, suffix)) != KV_OK ||
	    (rv = put(out, "{")) != KV_OK || (rv = put(out, label)) != KV_OK ||
	    (rv = put(out, "=\"")) != KV_OK || (rv = put_escaped(out, lvalue, true)) != KV_OK ||
	    (rv = put(out, "\"")) != KV_OK)
		return rv;
	if (le != NULL && ((rv = put(out, ",le=\"")) != KV_OK || (rv = put(out, le)) != KV_OK ||
	                   (rv = put(out, "\"")) != KV_OK))
		return rv;
	if ((rv = put(out, "} ")) != KV_OK || (rv = put(out, value)) != KV_OK)
		return rv;
	return put(out, "\n");
}

int
kv_metrics_write_hist(kv_buf *out, const char *name, const char *help, const char *label,
                      const char *const *lvalues, const kv_lat_hist *const *h, size_t n)
{
	kv_metric head = {.name = name, .type = "histogram", .help = help};
	char le[32], v[32];
	int rv = write_head(out, &head);

	for (size_t i = 0; i < n && rv == KV_OK; i++) {
		uint64_t cum = 0;
		for (size_t b = 0; b <= KV_LAT_BUCKETS && rv == KV_OK; b++) {
			cum += atomic_load_explicit(&h[i]->bucket[b], memory_order_relaxed);
			if (b < KV_LAT_BUCKETS)
				snprintf(le, sizeof(le), "%.15g", lat_bounds_us[b] / 1e6);
			else
				snprintf(le, sizeof(le), "+Inf");
			snprintf(v, sizeof(v), "%" PRIu64, cum);
			rv = write_hist_line(out, name, "_bucket", label, lvalues[i], le, v);
		}
		if (rv != KV_OK)
			break;
		snprintf(v, sizeof(v), "%.9g",
		         (double)atomic_load_explicit(&h[i]->sum_ns, memory_order_relaxed) / 1e9);
		if ((rv = write_hist_line(out, name, "_sum", label, lvalues[i], NULL, v)) != KV_OK)
			break;
		snprintf(v, sizeof(v), "%" PRIu64, cum);
		rv = write_hist_line(out, name, "_count", label, lvalues[i], NULL, v);
	}
	return rv;
}
