/*
 * test_client_json.c - JSON strings of the CLI: every byte maps to one code
 * point, so keys with arbitrary bytes survive a round trip through any JSON
 * parser.
 */
#include "client/cli/cli.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void
printable_ascii_is_copied_verbatim(void **state)
{
	char out[64];
	(void)state;
	assert_int_equal(kv_cli_json_escape("user:42 ~x", 10, out, sizeof(out)), 10);
	assert_string_equal(out, "user:42 ~x");
}

static void
quote_and_backslash_are_escaped(void **state)
{
	char out[64];
	(void)state;
	assert_int_equal(kv_cli_json_escape("a\"b\\c", 5, out, sizeof(out)), 7);
	assert_string_equal(out, "a\\\"b\\\\c");
}

static void
control_and_high_bytes_become_u00xx(void **state)
{
	const uint8_t in[] = {0x00, 0x0a, 0x1f, 0x7f, 0x80, 0xff, 'z'};
	char out[64];
	(void)state;
	assert_int_equal(kv_cli_json_escape(in, sizeof(in), out, sizeof(out)), 6 * 6 + 1);
	assert_string_equal(out, "\\u0000\\u000a\\u001f\\u007f\\u0080\\u00ffz");
}

/* Decodes the escape back; every escaped byte must map to one code point < 256. */
static size_t
unescape(const char *s, uint8_t *out)
{
	size_t n = 0;
	while (*s) {
		if (*s != '\\') {
			out[n++] = (uint8_t)*s++;
			continue;
		}
		s++;
		if (*s == 'u') {
			char hex[5] = {s[1], s[2], s[3], s[4], 0};
			unsigned long cp = strtoul(hex, NULL, 16);
			assert_true(cp < 256);
			out[n++] = (uint8_t)cp;
			s += 5;
		} else {
			assert_true(*s == '"' || *s == '\\');
			out[n++] = (uint8_t)*s++;
		}
	}
	return n;
}

static void
every_byte_value_round_trips(void **state)
{
	uint8_t in[256], back[256];
	char out[256 * 6 + 1];
	(void)state;
	for (int i = 0; i < 256; i++)
		in[i] = (uint8_t)i;
	size_t len = kv_cli_json_escape(in, sizeof(in), out, sizeof(out));
	assert_int_equal(len, strlen(out));
	for (size_t i = 0; i < len; i++) /* only printable ASCII on the output */
		assert_true(out[i] >= 0x20 && out[i] < 0x7f);
	assert_int_equal(unescape(out, back), 256);
	assert_memory_equal(in, back, 256);
}

static void
small_buffer_is_truncated_and_terminated(void **state)
{
	char out[4];
	(void)state;
	assert_int_equal(kv_cli_json_escape("\x01xyz", 4, out, sizeof(out)), 9);
	assert_string_equal(out, "\\u0");
	assert_int_equal(kv_cli_json_escape("abc", 3, NULL, 0), 3);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(printable_ascii_is_copied_verbatim),
	    cmocka_unit_test(quote_and_backslash_are_escaped),
	    cmocka_unit_test(control_and_high_bytes_become_u00xx),
	    cmocka_unit_test(every_byte_value_round_trips),
	    cmocka_unit_test(small_buffer_is_truncated_and_terminated),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
