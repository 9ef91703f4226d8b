/*
 * log.c - the structured stderr logger described in log.h.
 */
#include "common/log.h"
#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

/* Set once at start-up, read-only afterwards. */
static enum kv_log_level kv_log_threshold = KV_LOG_INFO;

static const char *const kv_log_names[] = {"debug", "info", "warn", "error", "off"};

void
kv_log_set_level(enum kv_log_level level)
{
	kv_log_threshold = level;
}

int
kv_log_parse_level(const char *s, enum kv_log_level *out)
{
	if (s == NULL || out == NULL)
		return KV_EINVAL;
	for (int i = 0; i <= KV_LOG_OFF; i++) {
		if (strcasecmp(s, kv_log_names[i]) == 0) {
			*out = (enum kv_log_level)i;
			return KV_OK;
		}
	}
	return KV_EINVAL;
}

int
kv_log_enabled(enum kv_log_level level)
{
	return level >= kv_log_threshold && level < KV_LOG_OFF;
}

void
kv_log(enum kv_log_level level, const char *component, const char *msg, const char *kvfmt, ...)
{
	char line[4096];
	struct timespec ts;
	struct tm tm;
	size_t n;
	int r;

	if (!kv_log_enabled(level))
		return;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
	r = snprintf(line + n, sizeof(line) - n, ".%06ldZ %s %s %s", ts.tv_nsec / 1000,
	             kv_log_names[level], component ? component : "-", msg ? msg : "-");
	if (r > 0)
		n += (size_t)r < sizeof(line) - n ? (size_t)r : sizeof(line) - n - 1;
	if (kvfmt != NULL && kvfmt[0] != '\0' && n < sizeof(line) - 2) {
		va_list ap;
		line[n++] = ' ';
		va_start(ap, kvfmt);
		r = vsnprintf(line + n, sizeof(line) - n, kvfmt, ap);
		va_end(ap);
		if (r > 0)
			n += (size_t)r < sizeof(line) - n ? (size_t)r : sizeof(line) - n - 1;
	}
	if (n >= sizeof(line) - 1)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	/* One write per line keeps lines from different threads whole. */
	(void)!write(STDERR_FILENO, line, n);
}
