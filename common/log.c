/*
 * log.c - the structured stderr logger described in log.h.
 */
#include "common/log.h"
#include "common/err.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* The lowest level written. Set at start-up, and by a library user
 * (shardkv_set_log_level) while other threads of the process log: a
 * relaxed atomic, since only the value matters, not its order. */
static atomic_int kv_log_threshold = KV_LOG_INFO;

static const char *const kv_log_names[] = {"debug", "info", "warn", "error", "off"};

void
kv_log_set_level(enum kv_log_level level)
{
	atomic_store_explicit(&kv_log_threshold, (int)level, memory_order_relaxed);
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
	return (int)level >= atomic_load_explicit(&kv_log_threshold, memory_order_relaxed) &&
	       level < KV_LOG_OFF;
}

/* ------------------------------------------------------------------------
 * The key=value pairs. The format is expanded first into text where every
 * byte remembers whether it came from kvfmt itself (structure: keys, `=`,
 * spaces and quotes that delimit pairs) or from a conversion (data: always
 * value text). The pairs are then cut along the structure and written again
 * in logfmt, so no argument can break a line apart.
 */
#define KV_TEXT_MAX 4096u

typedef struct {
	char c[KV_TEXT_MAX];
	bool data[KV_TEXT_MAX]; /* c[i] came from a conversion */
	size_t n;
} kv_text;

static void
text_put(kv_text *t, const char *s, size_t len, bool data)
{
	for (size_t i = 0; i < len && t->n < KV_TEXT_MAX; i++) {
		t->c[t->n] = s[i];
		t->data[t->n++] = data;
	}
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
/* Prints one conversion `spec` (from '%' to its letter, with any `*`
 * already replaced by numbers) taking its argument from ap. */
static int
conv_one(char *buf, size_t cap, const char *spec, char len1, char len2, char conv, va_list *ap)
{
	switch (conv) {
	case 'd':
	case 'i':
		if (len1 == 'l' && len2 == 'l')
			return snprintf(buf, cap, spec, va_arg(*ap, long long));
		if (len1 == 'l')
			return snprintf(buf, cap, spec, va_arg(*ap, long));
		if (len1 == 'z')
			return snprintf(buf, cap, spec, va_arg(*ap, ssize_t));
		if (len1 == 'j')
			return snprintf(buf, cap, spec, va_arg(*ap, intmax_t));
		if (len1 == 't')
			return snprintf(buf, cap, spec, va_arg(*ap, ptrdiff_t));
		return snprintf(buf, cap, spec, va_arg(*ap, int));
	case 'u':
	case 'x':
	case 'X':
	case 'o':
		if (len1 == 'l' && len2 == 'l')
			return snprintf(buf, cap, spec, va_arg(*ap, unsigned long long));
		if (len1 == 'l')
			return snprintf(buf, cap, spec, va_arg(*ap, unsigned long));
		if (len1 == 'z')
			return snprintf(buf, cap, spec, va_arg(*ap, size_t));
		if (len1 == 'j')
			return snprintf(buf, cap, spec, va_arg(*ap, uintmax_t));
		if (len1 == 't')
			return snprintf(buf, cap, spec, va_arg(*ap, ptrdiff_t));
		return snprintf(buf, cap, spec, va_arg(*ap, unsigned));
	case 'c':
		return snprintf(buf, cap, spec, va_arg(*ap, int));
	case 's': {
		const char *str = va_arg(*ap, const char *);
		return snprintf(buf, cap, spec, str ? str : "(null)");
	}
	case 'p':
		return snprintf(buf, cap, spec, va_arg(*ap, void *));
	case 'f':
	case 'F':
	case 'e':
	case 'E':
	case 'g':
	case 'G':
	case 'a':
	case 'A':
		if (len1 == 'L')
			return snprintf(buf, cap, spec, va_arg(*ap, long double));
		return snprintf(buf, cap, spec, va_arg(*ap, double));
	default:
		return -1;
	}
}
#pragma GCC diagnostic pop

/* Expands kvfmt with ap into t. A conversion it does not know ends the
 * expansion (its argument types are unknown from there on). */
static void
expand(kv_text *t, const char *f, va_list *ap)
{
	char spec[64], buf[KV_TEXT_MAX];

	t->n = 0;
	while (*f && t->n < KV_TEXT_MAX) {
		size_t sn = 0;
		char len1 = 0, len2 = 0;
		int r;

		if (*f != '%' || f[1] == '%') {
			text_put(t, f, 1, false);
			f += *f == '%' ? 2 : 1;
			continue;
		}
		spec[sn++] = *f++;
		while (*f && strchr("-+ #0'", *f) && sn < 20)
			spec[sn++] = *f++;
		for (int part = 0; part < 2; part++) { /* width, then precision */
			if (part == 1) {
				if (*f != '.')
					break;
				spec[sn++] = *f++;
			}
			if (*f == '*') {
				sn += (size_t)snprintf(spec + sn, sizeof(spec) - sn, "%d",
				                       va_arg(*ap, int));
				f++;
			} else {
				while (*f >= '0' && *f <= '9' && sn < 40)
					spec[sn++] = *f++;
			}
		}
		if (*f && strchr("hlLqjzt", *f)) {
			len1 = *f;
			spec[sn++] = *f++;
			if (*f == len1 && (len1 == 'h' || len1 == 'l')) {
				len2 = *f;
				spec[sn++] = *f++;
			}
		}
		if (*f == '\0')
			return;
		spec[sn++] = *f;
		spec[sn] = '\0';
		r = conv_one(buf, sizeof(buf), spec, len1, len2, *f, ap);
		if (r < 0)
			return;
		text_put(t, buf, (size_t)r < sizeof(buf) ? (size_t)r : sizeof(buf) - 1, true);
		f++;
	}
}

/* Whether byte c may appear in a bare logfmt value. */
static bool
bare_ok(unsigned char c)
{
	return c > 0x20 && c != 0x7f && c != '"' && c != '=' && c != '\\';
}

/* Appends value v (len bytes) to out[*n..cap-1), quoted and escaped when it
 * needs to be; a value that does not fit is cut and its quote closed. */
static void
put_value(char *out, size_t cap, size_t *n, const char *v, size_t len)
{
	bool quote = len == 0;

	for (size_t i = 0; i < len && !quote; i++)
		quote = !bare_ok((unsigned char)v[i]);
	if (!quote) {
		if (*n + len < cap) {
			memcpy(out + *n, v, len);
			*n += len;
			return;
		}
		quote = true; /* cut: quoted, so the cut shows */
	}
	if (*n + 2 >= cap)
		return;
	out[(*n)++] = '"';
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)v[i];
		char e[8];
		size_t el;
		if (c == '"' || c == '\\')
			el = (size_t)snprintf(e, sizeof(e), "\\%c", c);
		else if (c == '\n')
			el = (size_t)snprintf(e, sizeof(e), "\\n");
		else if (c == '\t')
			el = (size_t)snprintf(e, sizeof(e), "\\t");
		else if (c == '\r')
			el = (size_t)snprintf(e, sizeof(e), "\\r");
		else if (c < 0x20 || c == 0x7f)
			el = (size_t)snprintf(e, sizeof(e), "\\u%04x", c);
		else {
			e[0] = (char)c;
			el = 1;
		}
		if (*n + el + 1 >= cap) /* keep room for the closing quote */
			break;
		memcpy(out + *n, e, el);
		*n += el;
	}
	out[(*n)++] = '"';
}

/* Appends key k (len bytes): a logfmt key has no space, `=`, `"` or
 * control character; such bytes become '_'. */
static void
put_key(char *out, size_t cap, size_t *n, const char *k, size_t len)
{
	if (len == 0) {
		k = "_";
		len = 1;
	}
	for (size_t i = 0; i < len && *n + 1 < cap; i++)
		out[(*n)++] = bare_ok((unsigned char)k[i]) ? k[i] : '_';
}

size_t
kv_log_format_kv(char *out, size_t cap, const char *kvfmt, va_list ap)
{
	static _Thread_local kv_text t; /* 12 KiB with val: kept off small thread stacks */
	static _Thread_local char val[KV_TEXT_MAX];
	size_t n = 0, i = 0;
	va_list cp;

	if (out == NULL || cap == 0)
		return 0;
	out[0] = '\0';
	if (kvfmt == NULL)
		return 0;
	va_copy(cp, ap);
	expand(&t, kvfmt, &cp);
	va_end(cp);
	while (i < t.n) {
		size_t ks, ke, vn = 0;
		bool has_eq = false;
		/* Between pairs: spaces (of the format, or of a conversion that
		 * prints whole pairs, as in "...%s" with " hint=\"...\""). */
		while (i < t.n && t.c[i] == ' ')
			i++;
		if (i >= t.n)
			break;
		ks = i;
		while (i < t.n && t.c[i] != ' ' && t.c[i] != '=')
			i++;
		ke = i;
		if (i < t.n && t.c[i] == '=') {
			/* A pair printed whole by a conversion (its `=` is data)
			 * is delimited by its own quotes and spaces. */
			bool whole = t.data[i];
			has_eq = true;
			i++;
			if (i < t.n && t.c[i] == '"' && (!t.data[i] || whole)) {
				/* Quoted in the format: up to its closing quote. */
				for (i++; i < t.n && !(t.c[i] == '"' && (!t.data[i] || whole)); i++)
					val[vn++] = t.c[i];
				if (i < t.n)
					i++;
				/* Anything glued to the closing quote (not a space)
				 * belongs to the value too. */
				while (i < t.n && t.c[i] != ' ')
					val[vn++] = t.c[i++];
			} else {
				/* Bare in the format: up to its next space; what
				 * conversions print is value, spaces included. */
				while (i < t.n && !(t.c[i] == ' ' && (!t.data[i] || whole)))
					val[vn++] = t.c[i++];
			}
		}
		if (n > 0 && n + 1 < cap)
			out[n++] = ' ';
		put_key(out, cap, &n, &t.c[ks], ke - ks);
		if (has_eq && n + 1 < cap) {
			out[n++] = '=';
			put_value(out, cap, &n, val, vn);
		}
		if (n + 1 >= cap)
			break;
	}
	out[n < cap ? n : cap - 1] = '\0';
	return n < cap ? n : cap - 1;
}

/* Copies a positional field (component, msg) into line: control bytes
 * become spaces, `"` becomes `'` and `=` becomes `:`, so a logfmt reader
 * sees bare words. */
static size_t
put_word(char *line, size_t cap, size_t n, const char *s)
{
	for (; *s && n + 1 < cap; s++) {
		unsigned char c = (unsigned char)*s;
		line[n++] = c < 0x20 || c == 0x7f ? ' '
		            : c == '"'            ? '\''
		            : c == '='            ? ':'
		                                  : (char)c;
	}
	return n;
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
	r = snprintf(line + n, sizeof(line) - n, ".%06ldZ %s ", ts.tv_nsec / 1000,
	             kv_log_names[level]);
	if (r > 0)
		n += (size_t)r;
	n = put_word(line, sizeof(line) - 2, n, component ? component : "-");
	line[n++] = ' ';
	n = put_word(line, sizeof(line) - 2, n, msg ? msg : "-");
	if (kvfmt != NULL && kvfmt[0] != '\0' && n < sizeof(line) - 3) {
		va_list ap;
		line[n++] = ' ';
		va_start(ap, kvfmt);
		n += kv_log_format_kv(line + n, sizeof(line) - 1 - n, kvfmt, ap);
		va_end(ap);
	}
	if (n > sizeof(line) - 1)
		n = sizeof(line) - 1;
	line[n++] = '\n';
	/* One write per line keeps lines from different threads whole. */
	(void)!write(STDERR_FILENO, line, n);
}

void
kv_log_thread_name(const char *name)
{
	char n[16];

	snprintf(n, sizeof(n), "%s", name);
	(void)prctl(PR_SET_NAME, n, 0, 0, 0);
}
