/*
 * test_log_format.c - the logger's key=value pairs are logfmt whatever the
 * arguments hold (common/log.h): values with quotes, backslashes, spaces,
 * `=` and control characters are quoted and escaped, plain values stay
 * bare, a conversion that prints whole pairs still gives separate pairs, a
 * cut value keeps its closing quote, and a whole kv_log() line stays one
 * line. A small logfmt reader checks that every value reads back as given.
 * A thread names itself (kv_log_thread_name), cut to 15 bytes.
 */
#include "common/log.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

static size_t fmt(char *out, size_t cap, const char *kvfmt, ...)
    __attribute__((format(printf, 3, 4)));

static size_t
fmt(char *out, size_t cap, const char *kvfmt, ...)
{
	va_list ap;
	va_start(ap, kvfmt);
	size_t n = kv_log_format_kv(out, cap, kvfmt, ap);
	va_end(ap);
	return n;
}

/* A logfmt reader: the value of `key` in s, unescaped, into v (cap bytes).
 * Returns its length, or -1 when the key is missing or s is malformed. */
static long
logfmt_get(const char *s, const char *key, char *v, size_t cap)
{
	size_t klen = strlen(key);

	while (*s) {
		const char *k = s;
		size_t n = 0;
		bool match;
		while (*s == ' ')
			s++;
		k = s;
		while (*s && *s != '=' && *s != ' ' && *s != '"')
			s++;
		if (*s == '"')
			return -1; /* a quote in a key */
		match = (size_t)(s - k) == klen && memcmp(k, key, klen) == 0;
		if (*s != '=')
			continue; /* a bare key */
		s++;
		if (*s == '"') {
			for (s++; *s && *s != '"'; s++) {
				char c = *s;
				if (c == '\\') {
					s++;
					if (*s == 'n')
						c = '\n';
					else if (*s == 't')
						c = '\t';
					else if (*s == 'r')
						c = '\r';
					else if (*s == 'u') {
						unsigned u;
						if (sscanf(s + 1, "%4x", &u) != 1)
							return -1;
						c = (char)u;
						s += 4;
					} else if (*s == '"' || *s == '\\')
						c = *s;
					else
						return -1;
				} else if ((unsigned char)c < 0x20) {
					return -1; /* a raw control byte */
				}
				if (match && n + 1 < cap)
					v[n++] = c;
			}
			if (*s != '"')
				return -1; /* unterminated */
			s++;
			if (*s && *s != ' ')
				return -1; /* glued to the next pair */
		} else {
			for (; *s && *s != ' '; s++) {
				if (*s == '"' || *s == '=' || (unsigned char)*s < 0x20)
					return -1;
				if (match && n + 1 < cap)
					v[n++] = *s;
			}
		}
		if (match) {
			v[n] = '\0';
			return (long)n;
		}
	}
	return -1;
}

static void
quotes_in_a_quoted_value_are_escaped(void **state)
{
	char out[512], v[256];
	(void)state;
	const char *m = "invalid address \"foo\" (want an nng URL such as tcp://host:port)";
	fmt(out, sizeof(out), "cmd=%s err=%s msg=\"%s\"", "join", "EINVAL", m);
	assert_string_equal(out, "cmd=join err=EINVAL msg=\"invalid address \\\"foo\\\" (want an "
	                         "nng URL such as tcp://host:port)\"");
	assert_int_equal(logfmt_get(out, "msg", v, sizeof(v)), (long)strlen(m));
	assert_string_equal(v, m);
	assert_int_equal(logfmt_get(out, "err", v, sizeof(v)), 6);
	assert_string_equal(v, "EINVAL");
}

static void
plain_values_stay_bare(void **state)
{
	char out[256];
	(void)state;
	fmt(out, sizeof(out), "node=%u address=%s detail=\"%s\" n=%llu sz=%zu f=%.1f x=%x", 4u,
	    "tcp://127.0.0.1:7104", "ok", 12345678901ull, (size_t)7, 2.25, 255u);
	assert_string_equal(out, "node=4 address=tcp://127.0.0.1:7104 detail=ok n=12345678901 "
	                         "sz=7 f=2.2 x=ff");
}

static void
spaces_equals_and_empty_values_are_quoted(void **state)
{
	char out[256], v[64];
	(void)state;
	fmt(out, sizeof(out), "err=%s dir=%s why=\"%s\"", "a b=c", "", "x=y");
	assert_string_equal(out, "err=\"a b=c\" dir=\"\" why=\"x=y\"");
	assert_int_equal(logfmt_get(out, "dir", v, sizeof(v)), 0);
	assert_int_equal(logfmt_get(out, "why", v, sizeof(v)), 3);
}

static void
backslashes_and_control_characters_are_escaped(void **state)
{
	char out[256], v[64];
	const char raw[] = "a\\b\n\t\r\x01\x7f\"";
	(void)state;
	fmt(out, sizeof(out), "file=%s", raw);
	assert_string_equal(out, "file=\"a\\\\b\\n\\t\\r\\u0001\\u007f\\\"\"");
	assert_null(strchr(out, '\n'));
	assert_int_equal(logfmt_get(out, "file", v, sizeof(v)), (long)strlen(raw));
	assert_string_equal(v, raw);
}

static void
a_conversion_printing_pairs_gives_separate_pairs(void **state)
{
	char out[256], v[64];
	(void)state;
	/* shardserver/server.c appends an optional hint this way. */
	fmt(out, sizeof(out), "dir=%s err=%s detail=\"%s\"%s", "/d", "ECORRUPT", "bad crc",
	    " hint=\"--wal-truncate-corrupt cuts the log\"");
	assert_string_equal(out, "dir=/d err=ECORRUPT detail=\"bad crc\" "
	                         "hint=\"--wal-truncate-corrupt cuts the log\"");
	assert_int_equal(logfmt_get(out, "hint", v, sizeof(v)), 35);
	fmt(out, sizeof(out), "dir=%s detail=\"%s\"%s", "/d", "x", "");
	assert_string_equal(out, "dir=/d detail=x");
}

static void
printf_details_are_kept(void **state)
{
	char out[256];
	(void)state;
	fmt(out, sizeof(out), "a=%5d b=%-3s| c=%.3s d=%*d e=100%% f=%c g=%lld h=%hhu", 42, "x",
	    "abcdef", 4, 7, 'q', -5ll, (unsigned char)200);
	assert_string_equal(out, "a=\"   42\" b=\"x  |\" c=abc d=\"   7\" e=100% f=q g=-5 h=200");
	const char *volatile np = NULL; /* not known NULL at compile time */
	fmt(out, sizeof(out), "s=%s", np);
	assert_string_equal(out, "s=(null)");
	assert_int_equal(fmt(out, sizeof(out), NULL), 0);
	assert_string_equal(out, "");
}

static void
a_value_too_long_is_cut_with_its_quote_closed(void **state)
{
	static char big[6000], out[300], v[400];
	(void)state;
	memset(big, '"', sizeof(big) - 1);
	size_t n = fmt(out, sizeof(out), "id=%u detail=\"%s\"", 9u, big);
	assert_true(n < sizeof(out));
	assert_int_equal(strlen(out), n);
	assert_int_equal(out[n - 1], '"');
	assert_true(logfmt_get(out, "detail", v, sizeof(v)) > 100);
	for (size_t i = 0; v[i]; i++)
		assert_int_equal(v[i], '"');
	/* Tiny buffers never overflow and stay terminated. */
	for (size_t cap = 1; cap < 24; cap++) {
		char small[24];
		memset(small, 'Z', sizeof(small));
		n = fmt(small, cap, "k=%s", "a \"b\" c");
		assert_true(n < cap);
		assert_int_equal(small[n], '\0');
		assert_int_equal(small[cap < sizeof(small) ? cap : sizeof(small) - 1], 'Z');
	}
}

static void
every_byte_reads_back(void **state)
{
	char raw[256], out[2048], v[512];
	(void)state;
	srand(7);
	for (int round = 0; round < 500; round++) {
		size_t len = (size_t)(rand() % 60);
		for (size_t i = 0; i < len; i++) {
			raw[i] = (char)(1 + rand() % 255); /* %s stops at NUL */
		}
		raw[len] = '\0';
		fmt(out, sizeof(out), "a=%s b=\"%s\" c=%d", raw, raw, round);
		assert_null(strchr(out, '\n'));
		assert_int_equal(logfmt_get(out, "a", v, sizeof(v)), (long)len);
		assert_memory_equal(v, raw, len);
		assert_int_equal(logfmt_get(out, "b", v, sizeof(v)), (long)len);
		assert_memory_equal(v, raw, len);
		assert_true(logfmt_get(out, "c", v, sizeof(v)) > 0);
		assert_int_equal(atoi(v), round);
	}
}

static void
a_whole_line_stays_one_line(void **state)
{
	char path[] = "/tmp/kv-log-XXXXXX", buf[8192], v[128];
	int fd = mkstemp(path), saved = dup(STDERR_FILENO);
	ssize_t n;
	(void)state;
	assert_true(fd >= 0 && saved >= 0);
	assert_int_equal(dup2(fd, STDERR_FILENO), STDERR_FILENO);
	kv_log(KV_LOG_WARN, "controller", "bad\nmsg \"x\"=y", "cmd=%s msg=\"%s\"", "join",
	       "invalid address \"foo\"\nsecond line");
	assert_int_equal(dup2(saved, STDERR_FILENO), STDERR_FILENO);
	close(saved);
	n = pread(fd, buf, sizeof(buf) - 1, 0);
	close(fd);
	unlink(path);
	assert_true(n > 0);
	buf[n] = '\0';
	assert_int_equal(strchr(buf, '\n') - buf, n - 1); /* one newline, at the end */
	buf[n - 1] = '\0';
	assert_non_null(strstr(buf, " warn controller bad msg 'x':y cmd=join msg="));
	assert_true(logfmt_get(strstr(buf, "cmd="), "msg", v, sizeof(v)) > 0);
	assert_string_equal(v, "invalid address \"foo\"\nsecond line");
}

/* A thread's name shows in its comm, cut to the kernel's 15 bytes. */
static void
a_thread_names_itself_and_a_long_name_is_cut(void **state)
{
	char got[17] = {0};

	(void)state;
	kv_log_thread_name("kv-test-name");
	assert_int_equal(prctl(PR_GET_NAME, got, 0, 0, 0), 0);
	assert_string_equal(got, "kv-test-name");
	kv_log_thread_name("kv-a-name-longer-than-fifteen");
	assert_int_equal(prctl(PR_GET_NAME, got, 0, 0, 0), 0);
	assert_string_equal(got, "kv-a-name-longe");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(quotes_in_a_quoted_value_are_escaped),
	    cmocka_unit_test(plain_values_stay_bare),
	    cmocka_unit_test(spaces_equals_and_empty_values_are_quoted),
	    cmocka_unit_test(backslashes_and_control_characters_are_escaped),
	    cmocka_unit_test(a_conversion_printing_pairs_gives_separate_pairs),
	    cmocka_unit_test(printf_details_are_kept),
	    cmocka_unit_test(a_value_too_long_is_cut_with_its_quote_closed),
	    cmocka_unit_test(every_byte_reads_back),
	    cmocka_unit_test(a_whole_line_stays_one_line),
	    cmocka_unit_test(a_thread_names_itself_and_a_long_name_is_cut),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
