/*
 * test_auth.c - the shared secret (common/auth.h): loading the token file
 * (missing, empty, too long, a directory, the trailing newline, binary
 * bytes, loose permissions), the comparison, and the rate limit of the
 * refusal log line.
 */
#include "common/auth.h"
#include "common/err.h"
#include "tests/support/testutil.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

/* Writes n bytes to DIR/name with `mode` and returns the path (static). */
static const char *
put_file(void **state, const char *name, const void *p, size_t n, mode_t mode)
{
	const char *path = kv_test_put_file(*state, name, p, n, mode);
	assert_non_null(path);
	return path;
}

/* Loads the secret of a file holding `text` (n bytes); returns the code. */
static int
load(void **state, const void *text, size_t n, kv_buf *out, char *err, size_t errlen)
{
	bool loose = true;
	const char *path = put_file(state, "token", text, n, 0600);
	int rv = kv_auth_load(path, out, &loose, err, errlen);

	if (rv == 0)
		assert_false(loose);
	return rv;
}

static void
a_missing_file_is_refused_with_its_name(void **state)
{
	const kv_test_dir *d = *state;
	char path[320], err[512] = "";
	kv_buf b = {0};
	bool loose;

	snprintf(path, sizeof(path), "%s/nope", d->path);
	assert_int_equal(kv_auth_load(path, &b, &loose, err, sizeof(err)), KV_ENOTFOUND);
	assert_non_null(strstr(err, path));
	assert_null(b.data);
	/* A directory is no token file either. */
	assert_int_equal(kv_auth_load(d->path, &b, &loose, err, sizeof(err)), KV_EINVAL);
	assert_non_null(strstr(err, "is a directory"));
	assert_int_equal(kv_auth_load("", &b, &loose, err, sizeof(err)), KV_EINVAL);
}

static void
an_empty_file_is_refused(void **state)
{
	char err[512] = "";
	kv_buf b = {0};

	assert_int_equal(load(state, "", 0, &b, err, sizeof(err)), KV_EINVAL);
	assert_non_null(strstr(err, "is empty"));
	/* A lone newline is empty too, once it is cut. */
	assert_int_equal(load(state, "\n", 1, &b, err, sizeof(err)), KV_EINVAL);
	assert_int_equal(load(state, "\r\n", 2, &b, err, sizeof(err)), KV_EINVAL);
	assert_null(b.data);
}

static void
a_file_over_the_limit_is_refused(void **state)
{
	const size_t lim = KV_AUTH_MAX_TOKEN, huge = 1024 * 1024;
	char *big = malloc(huge), err[512] = "";
	kv_buf b = {0};

	assert_non_null(big);
	memset(big, 'k', huge);
	assert_int_equal(load(state, big, lim + 1, &b, err, sizeof(err)), KV_ETOOBIG);
	assert_non_null(strstr(err, "longer than 4096 bytes"));
	/* Far over the limit: refused the same way (and not read whole). */
	assert_int_equal(load(state, big, huge, &b, err, sizeof(err)), KV_ETOOBIG);
	/* The limit itself is accepted, with or without its newline. */
	assert_int_equal(load(state, big, lim, &b, err, sizeof(err)), 0);
	assert_int_equal(b.len, lim);
	big[lim] = '\n';
	assert_int_equal(load(state, big, lim + 1, &b, err, sizeof(err)), 0);
	assert_int_equal(b.len, lim);
	/* One byte more before the newline is too long. */
	big[lim] = 'k';
	big[lim + 1] = '\n';
	assert_int_equal(load(state, big, lim + 2, &b, err, sizeof(err)), KV_ETOOBIG);
	kv_buf_fini(&b);
	free(big);
}

static void
one_trailing_newline_is_cut_and_nothing_else(void **state)
{
	char err[512] = "";
	kv_buf b = {0};

	assert_int_equal(load(state, "secret\n", 7, &b, err, sizeof(err)), 0);
	assert_int_equal(b.len, 6);
	assert_memory_equal(b.data, "secret", 6);
	assert_int_equal(load(state, "secret", 6, &b, err, sizeof(err)), 0);
	assert_int_equal(b.len, 6);
	assert_int_equal(load(state, "secret\r\n", 8, &b, err, sizeof(err)), 0);
	assert_int_equal(b.len, 6);
	/* Only one: a second newline, and spaces, belong to the secret. */
	assert_int_equal(load(state, "secret\n\n", 8, &b, err, sizeof(err)), 0);
	assert_int_equal(b.len, 7);
	assert_memory_equal(b.data, "secret\n", 7);
	assert_int_equal(load(state, " secret \n", 9, &b, err, sizeof(err)), 0);
	assert_int_equal(b.len, 8);
	assert_memory_equal(b.data, " secret ", 8);
	/* Any byte, NUL included. */
	assert_int_equal(load(state, "a\0b\xff", 4, &b, err, sizeof(err)), 0);
	assert_int_equal(b.len, 4);
	assert_memory_equal(b.data, "a\0b\xff", 4);
	kv_buf_fini(&b);
}

static void
a_file_others_can_read_is_flagged(void **state)
{
	char err[512] = "";
	kv_buf b = {0};
	bool loose = false;

	const char *p = put_file(state, "shared", "secret\n", 7, 0644);
	assert_int_equal(kv_auth_load(p, &b, &loose, err, sizeof(err)), 0);
	assert_true(loose);
	p = put_file(state, "group", "secret\n", 7, 0640);
	assert_int_equal(kv_auth_load(p, &b, &loose, err, sizeof(err)), 0);
	assert_true(loose);
	p = put_file(state, "private", "secret\n", 7, 0400);
	assert_int_equal(kv_auth_load(p, &b, &loose, err, sizeof(err)), 0);
	assert_false(loose);
	kv_buf_fini(&b);
}

static void
tokens_match_exactly(void **state)
{
	kv_buf none = {0}, want = {0};

	(void)state;
	/* No secret: everything passes. */
	assert_true(kv_auth_ok(&none, NULL, 0));
	assert_true(kv_auth_ok(&none, "x", 1));
	assert_true(kv_auth_ok(NULL, "x", 1));

	assert_int_equal(kv_buf_set(&want, "secret", 6), 0);
	assert_true(kv_auth_ok(&want, "secret", 6));
	assert_false(kv_auth_ok(&want, NULL, 0));
	assert_false(kv_auth_ok(&want, "", 0));
	assert_false(kv_auth_ok(&want, "secre", 5));
	assert_false(kv_auth_ok(&want, "secretx", 7));
	assert_false(kv_auth_ok(&want, "secreT", 6));
	assert_false(kv_auth_ok(&want, "Secret", 6));
	assert_false(kv_auth_ok(&want, "s", 1));
	/* The token's length, not a NUL, ends it. */
	assert_false(kv_auth_ok(&want, "secret\0", 7));
	kv_buf_fini(&want);
}

/* Runs fn with stderr sent to a file and returns that file's lines that
 * contain `needle`. */
static long
stderr_lines(void **state, void (*fn)(void), const char *needle)
{
	const kv_test_dir *d = *state;
	char path[320], line[4096];
	int saved = dup(STDERR_FILENO), fd;
	long n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "%s/stderr", d->path);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0 && saved >= 0);
	fflush(stderr);
	dup2(fd, STDERR_FILENO);
	close(fd);
	fn();
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	assert_non_null(f = fopen(path, "r"));
	while (fgets(line, sizeof(line), f) != NULL)
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

static void
refuse_many(void)
{
	for (int i = 0; i < 200; i++)
		kv_auth_log_refused("test", "get", NULL, i % 2 ? 3 : 0);
}

static void
refuse_one(void)
{
	kv_auth_log_refused("test", "put", NULL, 0);
}

static void
refusals_are_logged_at_a_bounded_rate(void **state)
{
	char peer[64];

	kv_auth_peer(NULL, peer, sizeof(peer));
	assert_string_equal(peer, "unknown");
	/* A flood: a burst of lines, then nothing more within the second. */
	long n = stderr_lines(state, refuse_many, "request refused: authentication failed");
	assert_true(n >= 1 && n <= 11);
	/* A second later one more line, which counts those left out. */
	char want[64];
	snprintf(want, sizeof(want), "suppressed=%ld", 200 - n);
	kv_test_sleep_ms(1100);
	assert_int_equal(stderr_lines(state, refuse_one, want), 1);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(a_missing_file_is_refused_with_its_name,
	                                    kv_test_dir_setup, kv_test_dir_teardown),
	    cmocka_unit_test_setup_teardown(an_empty_file_is_refused, kv_test_dir_setup,
	                                    kv_test_dir_teardown),
	    cmocka_unit_test_setup_teardown(a_file_over_the_limit_is_refused, kv_test_dir_setup,
	                                    kv_test_dir_teardown),
	    cmocka_unit_test_setup_teardown(one_trailing_newline_is_cut_and_nothing_else,
	                                    kv_test_dir_setup, kv_test_dir_teardown),
	    cmocka_unit_test_setup_teardown(a_file_others_can_read_is_flagged, kv_test_dir_setup,
	                                    kv_test_dir_teardown),
	    cmocka_unit_test(tokens_match_exactly),
	    cmocka_unit_test_setup_teardown(refusals_are_logged_at_a_bounded_rate,
	                                    kv_test_dir_setup, kv_test_dir_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
