/*
 * test_controller_clog.c - the configuration log: round trip, recovery from
 * a torn tail, detection of damage in the middle, and odd file states
 * (zero length, truncated header, foreign file, second opener).
 */
#include "common/err.h"
#include "common/log.h"
#include "controller/clog.h"

#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

struct seen {
	size_t n;         /* records seen */
	char rec[16][64]; /* their payloads, NUL-terminated */
	uint64_t off[16]; /* their offsets */
};

static int
collect(void *arg, const uint8_t *p, size_t n, uint64_t offset)
{
	struct seen *s = arg;
	if (s->n < 16 && n < 64) {
		memcpy(s->rec[s->n], p, n);
		s->rec[s->n][n] = '\0';
		s->off[s->n] = offset;
	}
	s->n++;
	return KV_OK;
}

struct dir {
	char path[256];
	char file[300];
};

static int
setup(void **state)
{
	struct dir *d = calloc(1, sizeof(*d));
	snprintf(d->path, sizeof(d->path), "/tmp/kv_clog_test_XXXXXX");
	if (mkdtemp(d->path) == NULL)
		return -1;
	snprintf(d->file, sizeof(d->file), "%s/%s", d->path, KV_CLOG_FILE);
	*state = d;
	return 0;
}

static int
teardown(void **state)
{
	struct dir *d = *state;
	unlink(d->file);
	rmdir(d->path);
	free(d);
	return 0;
}

static void
write_records(const char *dir, int n)
{
	kv_clog *l;
	char err[256];
	assert_int_equal(kv_clog_open(dir, NULL, NULL, &l, NULL, err, sizeof(err)), KV_OK);
	for (int i = 0; i < n; i++) {
		char rec[32];
		snprintf(rec, sizeof(rec), "config-%d", i + 1);
		assert_int_equal(kv_clog_append(l, rec, strlen(rec)), KV_OK);
	}
	kv_clog_close(l);
}

static off_t
file_size(const char *f)
{
	struct stat st;
	assert_int_equal(stat(f, &st), 0);
	return st.st_size;
}

static void
append_raw(const char *f, const void *p, size_t n)
{
	int fd = open(f, O_WRONLY | O_APPEND);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, p, n), (ssize_t)n);
	close(fd);
}

static void
records_round_trip_in_order(void **state)
{
	struct dir *d = *state;
	struct seen s = {0};
	kv_clog_info info;
	kv_clog *l;
	char err[256], cid[32];

	assert_int_equal(kv_clog_open(d->path, collect, &s, &l, &info, err, sizeof(err)), KV_OK);
	assert_int_equal(info.created, 1);
	assert_int_equal(strlen(kv_clog_cluster_id(l)), 16);
	snprintf(cid, sizeof(cid), "%s", kv_clog_cluster_id(l));
	assert_int_equal(kv_clog_append(l, "one", 3), KV_OK);
	assert_int_equal(kv_clog_append(l, "two", 3), KV_OK);
	assert_int_equal(kv_clog_append(l, "three", 5), KV_OK);
	assert_int_equal(kv_clog_append(l, "", 0), KV_EINVAL);
	kv_clog_close(l);

	assert_int_equal(kv_clog_open(d->path, collect, &s, &l, &info, err, sizeof(err)), KV_OK);
	assert_int_equal(info.created, 0);
	assert_int_equal(info.records, 3);
	assert_int_equal(info.dropped_bytes, 0);
	assert_int_equal(s.n, 3);
	assert_string_equal(s.rec[0], "one");
	assert_string_equal(s.rec[1], "two");
	assert_string_equal(s.rec[2], "three");
	assert_int_equal(s.off[0], KV_CLOG_HEADER_SIZE);
	assert_string_equal(kv_clog_cluster_id(l), cid);
	kv_clog_close(l);
}

static void
torn_tail_is_dropped_and_appends_continue(void **state)
{
	struct dir *d = *state;
	struct seen s = {0};
	kv_clog_info info;
	kv_clog *l;
	char err[256];
	off_t good;
	/* a frame that claims 100 bytes of payload but has only 5 */
	const uint8_t torn[] = {100, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 'a', 'b', 'c', 'd', 'e'};

	write_records(d->path, 2);
	good = file_size(d->file);
	append_raw(d->file, torn, sizeof(torn));
	assert_int_equal(kv_clog_open(d->path, collect, &s, &l, &info, err, sizeof(err)), KV_OK);
	assert_int_equal(s.n, 2);
	assert_int_equal(info.dropped_bytes, sizeof(torn));
	assert_int_equal(file_size(d->file), good);
	assert_int_equal(kv_clog_append(l, "config-3", 8), KV_OK);
	kv_clog_close(l);
	memset(&s, 0, sizeof(s));
	assert_int_equal(kv_clog_open(d->path, collect, &s, &l, &info, err, sizeof(err)), KV_OK);
	assert_int_equal(s.n, 3);
	assert_string_equal(s.rec[2], "config-3");
	kv_clog_close(l);
}

static void
last_record_with_bad_checksum_is_dropped(void **state)
{
	struct dir *d = *state;
	struct seen s = {0};
	kv_clog_info info;
	kv_clog *l;
	char err[256];
	int fd;

	write_records(d->path, 3);
	fd = open(d->file, O_WRONLY);
	assert_int_equal(pwrite(fd, "X", 1, file_size(d->file) - 1), 1);
	close(fd);
	assert_int_equal(kv_clog_open(d->path, collect, &s, &l, &info, err, sizeof(err)), KV_OK);
	assert_int_equal(s.n, 2);
	assert_true(info.dropped_bytes > 0);
	kv_clog_close(l);
}

static void
corrupt_middle_record_stops_the_open_naming_file_and_offset(void **state)
{
	struct dir *d = *state;
	struct seen s = {0};
	kv_clog *l = NULL;
	char err[256] = "", want[64];
	int fd;

	write_records(d->path, 3);
	fd = open(d->file, O_WRONLY);
	/* first record's payload starts at header + 12 */
	assert_int_equal(pwrite(fd, "Z", 1, KV_CLOG_HEADER_SIZE + 12 + 2), 1);
	close(fd);
	assert_int_equal(kv_clog_open(d->path, collect, &s, &l, NULL, err, sizeof(err)),
	                 KV_ECORRUPT);
	assert_null(l);
	assert_int_equal(s.n, 0);
	assert_non_null(strstr(err, d->file));
	snprintf(want, sizeof(want), "offset %u", KV_CLOG_HEADER_SIZE);
	assert_non_null(strstr(err, want));
}

static void
corrupt_length_in_the_middle_is_detected(void **state)
{
	struct dir *d = *state;
	char err[256] = "";
	kv_clog *l = NULL;
	int fd;

	write_records(d->path, 3);
	fd = open(d->file, O_WRONLY);
	assert_int_equal(pwrite(fd, "\xff\xff\xff\x7f", 4, KV_CLOG_HEADER_SIZE), 4);
	close(fd);
	assert_int_equal(kv_clog_open(d->path, NULL, NULL, &l, NULL, err, sizeof(err)),
	                 KV_ECORRUPT);
	assert_non_null(strstr(err, "bad length"));
}

/* A length field damaged to a value that runs past the end of the file is
 * not a torn last append when intact records follow it (found by
 * fuzz/fuzz_clog_open): cutting there dropped every later configuration. */
static void
length_past_the_end_before_intact_records_is_detected(void **state)
{
	struct dir *d = *state;
	struct seen s = {0};
	char err[256] = "", want[64];
	kv_clog *l = NULL;
	off_t size;
	int fd;

	write_records(d->path, 3);
	size = file_size(d->file);
	fd = open(d->file, O_WRONLY);
	/* 584 bytes of payload: more than the file has after the first frame */
	assert_int_equal(pwrite(fd, "\x48\x02\x00\x00", 4, KV_CLOG_HEADER_SIZE), 4);
	close(fd);
	assert_int_equal(kv_clog_open(d->path, collect, &s, &l, NULL, err, sizeof(err)),
	                 KV_ECORRUPT);
	assert_null(l);
	assert_int_equal(s.n, 0);
	snprintf(want, sizeof(want), "offset %u", KV_CLOG_HEADER_SIZE);
	assert_non_null(strstr(err, want));
	assert_non_null(strstr(err, "intact records follow"));
	assert_int_equal(file_size(d->file), size); /* nothing was cut */
}

/* The same with a length that ends exactly at the end of the file: its
 * checksum fails where the file ends, like a torn last append, but the
 * record after it is intact. */
static void
length_reaching_the_end_over_intact_records_is_detected(void **state)
{
	struct dir *d = *state;
	struct seen s = {0};
	char err[256] = "", want[64];
	kv_clog *l = NULL;
	off_t size;
	int fd;

	write_records(d->path, 3); /* frames of 12 + 8 bytes ("config-N") */
	size = file_size(d->file);
	fd = open(d->file, O_WRONLY);
	/* the second record now claims its own payload and the third frame */
	assert_int_equal(pwrite(fd, "\x1c\x00\x00\x00", 4, KV_CLOG_HEADER_SIZE + 20), 4);
	close(fd);
	assert_int_equal(KV_CLOG_HEADER_SIZE + 20 + 12 + 28, size);
	assert_int_equal(kv_clog_open(d->path, collect, &s, &l, NULL, err, sizeof(err)),
	                 KV_ECORRUPT);
	assert_null(l);
	assert_int_equal(s.n, 1);
	snprintf(want, sizeof(want), "offset %u", KV_CLOG_HEADER_SIZE + 20);
	assert_non_null(strstr(err, want));
	assert_non_null(strstr(err, "intact records follow"));
	assert_int_equal(file_size(d->file), size);
}

static void
zero_length_file_is_initialised(void **state)
{
	struct dir *d = *state;
	kv_clog_info info;
	kv_clog *l;
	char err[256];
	int fd = open(d->file, O_CREAT | O_WRONLY, 0644);

	close(fd);
	assert_int_equal(kv_clog_open(d->path, NULL, NULL, &l, &info, err, sizeof(err)), KV_OK);
	assert_int_equal(info.created, 1);
	assert_int_equal(info.records, 0);
	assert_int_equal(file_size(d->file), KV_CLOG_HEADER_SIZE);
	kv_clog_close(l);
}

static void
truncated_header_is_reinitialised(void **state)
{
	struct dir *d = *state;
	kv_clog_info info;
	kv_clog *l;
	char err[256];

	write_records(d->path, 0);
	assert_int_equal(truncate(d->file, 20), 0);
	assert_int_equal(kv_clog_open(d->path, NULL, NULL, &l, &info, err, sizeof(err)), KV_OK);
	assert_int_equal(info.created, 1);
	assert_int_equal(kv_clog_append(l, "x", 1), KV_OK);
	kv_clog_close(l);
	assert_int_equal(file_size(d->file), KV_CLOG_HEADER_SIZE + 12 + 1);
}

static void
damaged_header_is_refused(void **state)
{
	struct dir *d = *state;
	char err[256] = "";
	kv_clog *l = NULL;
	int fd;

	write_records(d->path, 1);
	fd = open(d->file, O_WRONLY);
	assert_int_equal(pwrite(fd, "Q", 1, 20), 1); /* inside the cluster id */
	close(fd);
	assert_int_equal(kv_clog_open(d->path, NULL, NULL, &l, NULL, err, sizeof(err)),
	                 KV_ECORRUPT);
	assert_non_null(strstr(err, "header"));
}

static void
foreign_file_is_refused(void **state)
{
	struct dir *d = *state;
	char err[256] = "";
	kv_clog *l = NULL;
	int fd = open(d->file, O_CREAT | O_WRONLY, 0644);

	assert_int_equal(write(fd, "hello, this is not a config log at all!!!!!!!!!!!!!", 51), 51);
	close(fd);
	assert_int_equal(kv_clog_open(d->path, NULL, NULL, &l, NULL, err, sizeof(err)), KV_EINVAL);
	assert_non_null(strstr(err, "not a shardkv config log"));
	assert_int_equal(file_size(d->file), 51); /* untouched */
}

static void
second_open_of_one_dir_is_busy(void **state)
{
	struct dir *d = *state;
	char err[256] = "";
	kv_clog *a, *b = NULL;

	assert_int_equal(kv_clog_open(d->path, NULL, NULL, &a, NULL, err, sizeof(err)), KV_OK);
	assert_int_equal(kv_clog_open(d->path, NULL, NULL, &b, NULL, err, sizeof(err)), KV_EBUSY);
	assert_non_null(strstr(err, "another controller"));
	assert_null(b);
	kv_clog_close(a);
}

static void
missing_dir_is_created_and_uncreatable_dir_is_an_error(void **state)
{
	struct dir *d = *state;
	char sub[300], file[400], err[256] = "";
	kv_clog *l = NULL;

	snprintf(sub, sizeof(sub), "%s/sub", d->path);
	assert_int_equal(kv_clog_open(sub, NULL, NULL, &l, NULL, err, sizeof(err)), KV_OK);
	kv_clog_close(l);
	snprintf(file, sizeof(file), "%s/%s", sub, KV_CLOG_FILE);
	unlink(file);
	rmdir(sub);
	l = NULL;
	assert_int_not_equal(
	    kv_clog_open("/proc/definitely/not/here", NULL, NULL, &l, NULL, err, sizeof(err)),
	    KV_OK);
	assert_null(l);
	assert_non_null(strstr(err, "cannot create data dir"));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(records_round_trip_in_order, setup, teardown),
	    cmocka_unit_test_setup_teardown(torn_tail_is_dropped_and_appends_continue, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(last_record_with_bad_checksum_is_dropped, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(
	        corrupt_middle_record_stops_the_open_naming_file_and_offset, setup, teardown),
	    cmocka_unit_test_setup_teardown(corrupt_length_in_the_middle_is_detected, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(length_past_the_end_before_intact_records_is_detected,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(length_reaching_the_end_over_intact_records_is_detected,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(zero_length_file_is_initialised, setup, teardown),
	    cmocka_unit_test_setup_teardown(truncated_header_is_reinitialised, setup, teardown),
	    cmocka_unit_test_setup_teardown(damaged_header_is_refused, setup, teardown),
	    cmocka_unit_test_setup_teardown(foreign_file_is_refused, setup, teardown),
	    cmocka_unit_test_setup_teardown(second_open_of_one_dir_is_busy, setup, teardown),
	    cmocka_unit_test_setup_teardown(missing_dir_is_created_and_uncreatable_dir_is_an_error,
	                                    setup, teardown),
	};
	kv_log_set_level(KV_LOG_ERROR);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
