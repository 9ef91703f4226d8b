/*
 * auth.c - the shared secret: loading, constant-time checking, and the
 * rate-limited log line for refused requests (auth.h).
 */
#include "common/auth.h"
#include "common/err.h"
#include "common/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int
kv_auth_load(const char *path, kv_buf *out, bool *loose, char *err, size_t errlen)
{
	/* One byte more than the limit tells "too long" from "exactly the
	 * limit", and two more leave room for a trailing "\r\n". */
	const size_t cap = KV_AUTH_MAX_TOKEN + 2;
	uint8_t *buf = NULL;
	struct stat st;
	size_t n = 0;
	int fd, rv;

	*loose = false;
	if (path == NULL || path[0] == '\0') {
		snprintf(err, errlen, "--auth-token-file needs a file name");
		return KV_EINVAL;
	}
	/* O_NONBLOCK: opening a FIFO with no writer must not hang the start;
	 * it is cleared again before reading. */
	if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) < 0) {
		rv = kv_err_from_errno(errno);
		snprintf(err, errlen, "cannot read --auth-token-file %s: %s", path,
		         strerror(errno));
		return rv;
	}
	if (fstat(fd, &st) != 0) {
		rv = kv_err_from_errno(errno);
		snprintf(err, errlen, "cannot read --auth-token-file %s: %s", path,
		         strerror(errno));
		goto out;
	}
	if (S_ISDIR(st.st_mode)) {
		rv = KV_EINVAL;
		snprintf(err, errlen, "--auth-token-file %s is a directory", path);
		goto out;
	}
	if (S_ISREG(st.st_mode))
		*loose = (st.st_mode & (S_IRWXG | S_IRWXO)) != 0;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	if ((buf = malloc(cap + 1)) == NULL) {
		rv = KV_ENOMEM;
		snprintf(err, errlen, "out of memory reading --auth-token-file %s", path);
		goto out;
	}
	while (n <= cap) {
		ssize_t r = read(fd, buf + n, cap + 1 - n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			rv = kv_err_from_errno(errno);
			snprintf(err, errlen, "cannot read --auth-token-file %s: %s", path,
			         strerror(errno));
			goto out;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	if (n > 0 && buf[n - 1] == '\n') {
		n--;
		if (n > 0 && buf[n - 1] == '\r')
			n--;
	}
	if (n == 0) {
		rv = KV_EINVAL;
		snprintf(err, errlen, "--auth-token-file %s is empty", path);
		goto out;
	}
	if (n > KV_AUTH_MAX_TOKEN) {
		rv = KV_ETOOBIG;
		snprintf(err, errlen, "--auth-token-file %s is longer than %u bytes", path,
		         KV_AUTH_MAX_TOKEN);
		goto out;
	}
	if ((rv = kv_buf_set(out, buf, n)) != 0)
		snprintf(err, errlen, "out of memory reading --auth-token-file %s", path);
out:
	if (buf != NULL) {
		/* The secret does not outlive its use in freed memory. */
		memset(buf, 0, cap + 1);
		__asm__ __volatile__("" : : "r"(buf) : "memory");
	}
	free(buf);
	close(fd);
	return rv;
}

bool
kv_auth_ok(const kv_buf *want, const void *got, size_t len)
{
	const uint8_t *g = got;
	unsigned d;

	if (want == NULL || want->len == 0)
		return true;
	/* Every byte of the secret is compared whatever the token holds; the
	 * branch on len depends on the token's length only, which is public. */
	d = len != want->len;
	for (size_t i = 0; i < want->len; i++) {
		uint8_t b = len > 0 ? g[i < len ? i : 0] : 0;
		d |= (unsigned)(want->data[i] ^ b);
		/* Keeps the compiler from turning the loop into an early exit. */
		__asm__ __volatile__("" : "+r"(d));
	}
	return d == 0;
}

void
kv_auth_peer(nng_msg *req, char *buf, size_t len)
{
	nng_pipe p = NNG_PIPE_INITIALIZER;
	nng_sockaddr sa;
	char ip[INET6_ADDRSTRLEN];

	snprintf(buf, len, "unknown");
	if (req != NULL)
		p = nng_msg_get_pipe(req);
	if (nng_pipe_id(p) <= 0 || nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) != 0)
		return;
	switch (sa.s_family) {
	case NNG_AF_INET:
		if (inet_ntop(AF_INET, &sa.s_in.sa_addr, ip, sizeof(ip)))
			snprintf(buf, len, "%s:%u", ip, (unsigned)ntohs(sa.s_in.sa_port));
		break;
	case NNG_AF_INET6:
		if (inet_ntop(AF_INET6, sa.s_in6.sa_addr, ip, sizeof(ip)))
			snprintf(buf, len, "[%s]:%u", ip, (unsigned)ntohs(sa.s_in6.sa_port));
		break;
	case NNG_AF_IPC:
		snprintf(buf, len, "ipc:%s", sa.s_ipc.sa_path);
		break;
	case NNG_AF_INPROC:
		snprintf(buf, len, "inproc:%s", sa.s_inproc.sa_name);
		break;
	default:
		break;
	}
}

/*
 * The rate limit of kv_auth_log_refused, process-wide: a bucket of
 * REFUSED_BURST lines that refills by one line per second, so a few
 * misconfigured peers are each seen at once while a flood costs one line a
 * second.
 */
#define REFUSED_BURST       10u
#define REFUSED_INTERVAL_NS 1000000000ull

static pthread_mutex_t refused_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t refused_tokens_ns; /* bucket level, in ns of refill: a line costs an interval */
static uint64_t refused_last_ns;   /* when the bucket was last refilled; 0: never */
static uint64_t refused_dropped;   /* refusals not logged since the last line */

void
kv_auth_log_refused(const char *component, const char *what, nng_msg *req, size_t token_len)
{
	const uint64_t full = REFUSED_BURST * REFUSED_INTERVAL_NS;
	uint64_t now = kv_now_ns(), dropped = 0;
	bool log = false;
	char peer[160];

	pthread_mutex_lock(&refused_mu);
	if (refused_last_ns == 0)
		refused_tokens_ns = full;
	else if (now > refused_last_ns)
		refused_tokens_ns += now - refused_last_ns;
	if (refused_tokens_ns > full)
		refused_tokens_ns = full;
	refused_last_ns = now;
	if (refused_tokens_ns >= REFUSED_INTERVAL_NS) {
		refused_tokens_ns -= REFUSED_INTERVAL_NS;
		dropped = refused_dropped;
		refused_dropped = 0;
		log = true;
	} else {
		refused_dropped++;
	}
	pthread_mutex_unlock(&refused_mu);
	if (!log)
		return;
	kv_auth_peer(req, peer, sizeof(peer));
	KV_WARN(component, "request refused: authentication failed",
	        "cmd=%s peer=%s token=%s suppressed=%llu", what ? what : "?", peer,
	        token_len ? "wrong" : "missing", (unsigned long long)dropped);
}
