/*
 * metrics.c - Prometheus text endpoint (metrics.h).
 *
 * The thread polls the listening socket and a pipe; kv_metrics_destroy
 * writes to the pipe to stop it. Every connection is served to completion
 * before the next is accepted, so a slow scraper delays only scrapes, and
 * each is bounded by a 1 s receive timeout.
 */
#include "controller/metrics.h"
#include "common/err.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

struct kv_metrics {
	int fd;           /* listening socket */
	int stop[2];      /* stop pipe: [0] polled, [1] written by destroy */
	pthread_t thread; /* the server thread */
	kv_metrics_cb cb; /* the gauges */
	void *arg;        /* its argument */
};

static void
serve(kv_metrics *m, int fd)
{
	char req[4096], body[2048], out[2600];
	const char *states[5] = {"unknown", "joining", "active", "draining", "gone"};
	struct timeval tv = {.tv_sec = 1};
	kv_metrics_sample s;
	size_t n = 0;
	int len = 0;

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
	while (n < sizeof(req) - 1 && memchr(req, '\n', n) == NULL) {
		ssize_t r = recv(fd, req + n, sizeof(req) - 1 - n, 0);
		if (r <= 0)
			return;
		n += (size_t)r;
	}
	req[n] = '\0';
	if (strncmp(req, "GET /metrics ", 13) != 0 && strncmp(req, "GET /metrics?", 13) != 0) {
		const char *nf = "HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\n"
		                 "Content-Length: 10\r\nConnection: close\r\n\r\nnot found\n";
		(void)!send(fd, nf, strlen(nf), MSG_NOSIGNAL);
		return;
	}
	m->cb(m->arg, &s);
	len = snprintf(body, sizeof(body),
	               "# HELP shardkv_controller_epoch Latest published configuration epoch.\n"
	               "# TYPE shardkv_controller_epoch gauge\n"
	               "shardkv_controller_epoch %llu\n"
	               "# HELP shardkv_controller_nodes Nodes by state.\n"
	               "# TYPE shardkv_controller_nodes gauge\n",
	               (unsigned long long)s.epoch);
	for (int i = 1; i < 5 && len > 0 && (size_t)len < sizeof(body); i++)
		len += snprintf(body + len, sizeof(body) - (size_t)len,
		                "shardkv_controller_nodes{state=\"%s\"} %llu\n", states[i],
		                (unsigned long long)s.nodes[i]);
	if (len > 0 && (size_t)len < sizeof(body))
		len += snprintf(body + len, sizeof(body) - (size_t)len,
		                "# HELP shardkv_controller_ranges Entries in the range map.\n"
		                "# TYPE shardkv_controller_ranges gauge\n"
		                "shardkv_controller_ranges %llu\n"
		                "# HELP shardkv_controller_migrations Migrations in flight.\n"
		                "# TYPE shardkv_controller_migrations gauge\n"
		                "shardkv_controller_migrations %llu\n"
		                "# HELP shardkv_controller_held_watches Watches held.\n"
		                "# TYPE shardkv_controller_held_watches gauge\n"
		                "shardkv_controller_held_watches %llu\n"
		                "# HELP shardkv_controller_held_waits Commands waiting for "
		                "migrations.\n"
		                "# TYPE shardkv_controller_held_waits gauge\n"
		                "shardkv_controller_held_waits %llu\n"
		                "# HELP shardkv_controller_uptime_seconds Seconds since start.\n"
		                "# TYPE shardkv_controller_uptime_seconds gauge\n"
		                "shardkv_controller_uptime_seconds %llu\n",
		                (unsigned long long)s.ranges, (unsigned long long)s.migrations,
		                (unsigned long long)s.watches, (unsigned long long)s.waits,
		                (unsigned long long)s.uptime_s);
	if (len < 0 || (size_t)len >= sizeof(body))
		return;
	int o = snprintf(out, sizeof(out),
	                 "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
	                 "Content-Length: %d\r\nConnection: close\r\n\r\n%s",
	                 len, body);
	if (o > 0 && (size_t)o < sizeof(out))
		(void)!send(fd, out, (size_t)o, MSG_NOSIGNAL);
}

static void *
metrics_main(void *arg)
{
	kv_metrics *m = arg;

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
		if (p[0].revents & POLLIN) {
			int fd = accept(m->fd, NULL, NULL);
			if (fd >= 0) {
				serve(m, fd);
				close(fd);
			}
		}
	}
	return NULL;
}

int
kv_metrics_create(const char *hostport, kv_metrics_cb cb, void *arg, kv_metrics **out, char *err,
                  size_t errlen)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC,
	                         .ai_socktype = SOCK_STREAM,
	                         .ai_flags = AI_PASSIVE},
	                *ai = NULL;
	char host[256];
	const char *colon = strrchr(hostport, ':');
	kv_metrics *m;
	int one = 1, rv = KV_EINVAL;

	if (colon == NULL || colon[1] == '\0' || (size_t)(colon - hostport) >= sizeof(host)) {
		snprintf(err, errlen, "invalid --metrics address %s (want HOST:PORT)", hostport);
		return KV_EINVAL;
	}
	memcpy(host, hostport, (size_t)(colon - hostport));
	host[colon - hostport] = '\0';
	if (host[0] == '[' && host[strlen(host) - 1] == ']') {
		memmove(host, host + 1, strlen(host));
		host[strlen(host) - 1] = '\0';
	}
	if (getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, &ai) != 0 || ai == NULL) {
		snprintf(err, errlen, "invalid --metrics address %s", hostport);
		return KV_EINVAL;
	}
	if ((m = calloc(1, sizeof(*m))) == NULL) {
		freeaddrinfo(ai);
		return KV_ENOMEM;
	}
	m->cb = cb;
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
	if (pipe(m->stop) != 0 || pthread_create(&m->thread, NULL, metrics_main, m) != 0) {
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
