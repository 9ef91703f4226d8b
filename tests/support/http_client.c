/*
 * http_client.c - see http_client.h.
 */
#include "tests/support/http_client.h"
#include "tests/support/testutil.h"

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int
kv_http_dial(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
		close(fd);
		fd = -1;
	}
	return fd;
}

/* Reads until EOF, the buffer's end or the deadline. Returns the bytes
 * read (buf NUL-terminated). */
static size_t
read_all(int fd, char *buf, size_t cap, uint64_t deadline)
{
	size_t n = 0;

	while (n < cap - 1) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		uint64_t now = kv_test_now_ms();
		if (now >= deadline || poll(&p, 1, (int)(deadline - now)) <= 0)
			break;
		ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
		if (r <= 0)
			break;
		n += (size_t)r;
	}
	buf[n] = '\0';
	return n;
}

kv_http_answer
kv_http_raw(int port, const void *req, size_t n)
{
	kv_http_answer a = {.clength = -1};
	uint64_t deadline = kv_test_now_ms() + KV_HTTP_MS;
	int fd;

	if ((a.raw = malloc(KV_HTTP_MAX)) == NULL)
		return a;
	a.raw[0] = '\0';
	if ((fd = kv_http_dial(port)) < 0)
		return a;
	if (n > 0 && send(fd, req, n, MSG_NOSIGNAL) != (ssize_t)n) {
		close(fd);
		return a;
	}
	a.len = read_all(fd, a.raw, KV_HTTP_MAX, deadline);
	close(fd);
	if (sscanf(a.raw, "HTTP/1.%*d %d", &a.status) != 1)
		a.status = 0;
	char *end = strstr(a.raw, "\r\n\r\n");
	if (end != NULL) {
		a.body = end + 4;
		a.blen = a.len - (size_t)(a.body - a.raw);
		char *cl = strstr(a.raw, "Content-Length: ");
		if (cl != NULL && cl < end)
			a.clength = strtol(cl + 16, NULL, 10);
	}
	return a;
}

kv_http_answer
kv_http_get(int port, const char *path)
{
	char req[512];
	int n = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: test\r\n\r\n", path);

	return kv_http_raw(port, req, n > 0 && (size_t)n < sizeof(req) ? (size_t)n : 0);
}

void
kv_http_answer_free(kv_http_answer *a)
{
	free(a->raw);
	memset(a, 0, sizeof(*a));
}

double
kv_http_sample(const char *body, const char *series)
{
	char want[256];
	const char *p;

	if (body == NULL)
		return NAN;
	snprintf(want, sizeof(want), "\n%s ", series);
	if ((p = strstr(body, want)) == NULL)
		return NAN;
	return strtod(p + strlen(want), NULL);
}
