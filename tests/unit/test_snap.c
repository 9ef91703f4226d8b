/*
 * test_snap.c - snapshot files (shardserver/snap.h): round trips (many
 * small entries, entries at and past the block size, a 64 MiB value), the
 * choice of the newest snapshot, .tmp files, abort, write errors, and every
 * kind of damage, which must be KV_ECORRUPT naming the file and offset.
 * Every test uses a fresh directory under /tmp and removes it.
 */
#include "common/bytes.h"
#include "common/err.h"
#include "common/log.h"
#include "shardserver/durable/snap.h"

#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/support/testutil.h"

#define setup    kv_test_dir_setup
#define teardown kv_test_dir_teardown

static void
snap_file(char *buf, size_t len, const char *dir, uint64_t lsn, const char *ext)
{
	snprintf(buf, len, "%s/snap-%016llx%s", dir, (unsigned long long)lsn, ext);
}

static bool
exists(const char *f)
{
	struct stat st;
	return stat(f, &st) == 0;
}

static off_t
file_size(const char *f)
{
	struct stat st;
	assert_int_equal(stat(f, &st), 0);
	return st.st_size;
}

static int
count_files(const char *dir)
{
	DIR *dd = opendir(dir);
	struct dirent *e;
	int n = 0;

	assert_non_null(dd);
	while ((e = readdir(dd)) != NULL)
		if (e->d_name[0] != '.')
			n++;
	closedir(dd);
	return n;
}

static void
flip_bit(const char *f, uint64_t off)
{
	int fd = open(f, O_RDWR);
	uint8_t b;
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
	b ^= 0x04;
	assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
	close(fd);
}

static void
append_raw(const char *f, const void *p, size_t n)
{
	int fd = open(f, O_WRONLY | O_APPEND | O_CREAT, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, p, n), (ssize_t)n);
	close(fd);
}

/* ---------------------------------------------------------------- entries */

#define BIG_AT  5000u /* this entry has a 64 MiB value */
#define EDGE_AT 5001u /* this one fills a block exactly, the next one overflows it */

static uint64_t big_value = 64u * 1024u * 1024u;

/* Entry i of the test stream: type, key and value length. */
static void
entry_shape(uint64_t i, uint8_t *type, char *key, size_t *klen, size_t *vlen)
{
	*type = (uint8_t)(i % 3 == 2 ? 255 : i % 3);
	*klen = i == 7 ? 0 : (size_t)snprintf(key, 32, "key-%08llu", (unsigned long long)i);
	if (i == BIG_AT)
		*vlen = big_value;
	else if (i == EDGE_AT)
		*vlen = KV_SNAP_BLOCK - 9 - *klen;
	else if (i == EDGE_AT + 1)
		*vlen = KV_SNAP_BLOCK - 9 - *klen + 1;
	else
		*vlen = (size_t)((i * 37u) % 257u);
}

static uint8_t
val_byte(uint64_t i, size_t j)
{
	return (uint8_t)(i * 13u + j * 101u + (j >> 12));
}

/* Writes entries [0, n) as snapshot lsn. */
static void
write_snapshot(const char *dir, uint64_t lsn, uint64_t n, uint64_t *bytes)
{
	kv_snap_writer *w;
	char err[512];
	uint8_t *val = NULL;
	size_t cap = 0;

	*bytes = 0;
	assert_int_equal(kv_snap_begin(dir, lsn, &w, err, sizeof(err)), KV_OK);
	for (uint64_t i = 0; i < n; i++) {
		char key[32];
		size_t klen, vlen;
		uint8_t type;
		entry_shape(i, &type, key, &klen, &vlen);
		if (vlen > cap) {
			val = realloc(val, vlen);
			assert_non_null(val);
			cap = vlen;
		}
		for (size_t j = 0; j < vlen; j++)
			val[j] = val_byte(i, j);
		assert_int_equal(kv_snap_add(w, type, klen ? key : NULL, klen, val, vlen), KV_OK);
		*bytes += klen + vlen;
	}
	free(val);
	if (kv_snap_commit(w, err, sizeof(err)) != KV_OK)
		fail_msg("commit: %s", err);
}

struct seen {
	uint64_t n;   /* entries seen */
	uint64_t bad; /* entries that differ from the stream */
	int stop_at;  /* return KV_EINTERNAL at this entry, -1: never */
};

static int
check_entry(void *arg, uint8_t type, const uint8_t *key, size_t klen, const uint8_t *val,
            size_t vlen)
{
	struct seen *s = arg;
	char want_key[32];
	size_t wk, wv;
	uint8_t wt;

	if (s->stop_at >= 0 && s->n == (uint64_t)s->stop_at)
		return KV_EINTERNAL;
	entry_shape(s->n, &wt, want_key, &wk, &wv);
	if (type != wt || klen != wk || vlen != wv || (klen && memcmp(key, want_key, klen) != 0))
		s->bad++;
	else
		for (size_t j = 0; j < vlen; j++)
			if (val[j] != val_byte(s->n, j)) {
				s->bad++;
				break;
			}
	s->n++;
	return KV_OK;
}

static int
load(const char *dir, struct seen *s, uint64_t *lsn, uint64_t *entries, uint64_t *bytes, char *err,
     size_t errlen)
{
	memset(s, 0, sizeof(*s));
	s->stop_at = -1;
	return kv_snap_load(dir, check_entry, s, lsn, entries, bytes, err, errlen);
}

/* Offsets of the blocks of a snapshot file, the trailer last. */
static int
block_offsets(const char *f, uint64_t *offs, int max)
{
	int fd = open(f, O_RDONLY), n = 0;
	uint64_t off = KV_SNAP_HEADER_SIZE;
	uint8_t h[16];

	assert_true(fd >= 0);
	while (n < max && pread(fd, h, sizeof(h), (off_t)off) == (ssize_t)sizeof(h)) {
		offs[n++] = off;
		if (kv_get32(h + 4) == 0xffffffffu)
			break;
		off += 16 + kv_get32(h);
	}
	close(fd);
	return n;
}

/* ---------------------------------------------------------------- round trips */

static void
snapshot_round_trips_small_entries_block_edges_and_a_64_mib_value(void **state)
{
	kv_test_dir *d = *state;
	uint64_t bytes, lsn, entries, got_bytes, offs[64];
	struct seen s;
	char f[512], err[512];

	write_snapshot(d->path, 42, 20000, &bytes);
	snap_file(f, sizeof(f), d->path, 42, ".dat");
	assert_true(exists(f));
	assert_int_equal(count_files(d->path), 1);
	assert_int_equal(load(d->path, &s, &lsn, &entries, &got_bytes, err, sizeof(err)), KV_OK);
	assert_int_equal(s.bad, 0);
	assert_int_equal(s.n, 20000);
	assert_int_equal(lsn, 42);
	assert_int_equal(entries, 20000);
	assert_int_equal(got_bytes, bytes);
	/* blocks stay at 1 MiB except the ones holding a single bigger entry */
	int n = block_offsets(f, offs, 64);
	assert_true(n > 3);
	for (int i = 0; i + 1 < n; i++) {
		uint64_t len = offs[i + 1] - offs[i] - 16;
		assert_true(len <= KV_SNAP_BLOCK || len == 9 + 12 + big_value ||
		            len == KV_SNAP_BLOCK + 1);
	}
}

static void
empty_snapshot_round_trips(void **state)
{
	kv_test_dir *d = *state;
	uint64_t bytes, lsn, entries, got;
	struct seen s;
	char err[512];

	write_snapshot(d->path, 1, 0, &bytes);
	assert_int_equal(load(d->path, &s, &lsn, &entries, &got, err, sizeof(err)), KV_OK);
	assert_int_equal(lsn, 1);
	assert_int_equal(s.n, 0);
	assert_int_equal(entries, 0);
	assert_int_equal(got, 0);
}

static void
no_snapshot_loads_as_lsn_1(void **state)
{
	kv_test_dir *d = *state;
	uint64_t lsn = 99, entries = 99, bytes = 99;
	struct seen s;
	char err[512], missing[512], f[512];

	assert_int_equal(load(d->path, &s, &lsn, &entries, &bytes, err, sizeof(err)), KV_OK);
	assert_int_equal(lsn, 1);
	assert_int_equal(entries, 0);
	assert_int_equal(bytes, 0);
	snprintf(missing, sizeof(missing), "%s/nope", d->path);
	assert_int_equal(load(missing, &s, &lsn, NULL, NULL, err, sizeof(err)), KV_OK);
	assert_int_equal(lsn, 1);
	/* a .tmp alone is no snapshot */
	snap_file(f, sizeof(f), d->path, 5, ".tmp");
	append_raw(f, "garbage", 7);
	assert_int_equal(load(d->path, &s, &lsn, NULL, NULL, err, sizeof(err)), KV_OK);
	assert_int_equal(lsn, 1);
	assert_int_equal(s.n, 0);
}

static void
newest_snapshot_is_loaded_and_older_ones_are_removed(void **state)
{
	kv_test_dir *d = *state;
	uint64_t bytes, lsn;
	struct seen s;
	char f10[512], f20[512], keep[512], err[512];

	write_snapshot(d->path, 10, 3, &bytes);
	snap_file(f10, sizeof(f10), d->path, 10, ".dat");
	snprintf(keep, sizeof(keep), "%s/keep", d->path);
	assert_int_equal(link(f10, keep), 0);
	write_snapshot(d->path, 20, 5, &bytes);
	snap_file(f20, sizeof(f20), d->path, 20, ".dat");
	assert_false(exists(f10)); /* removed by the newer commit */
	assert_true(exists(f20));
	assert_int_equal(rename(keep, f10), 0);
	assert_int_equal(load(d->path, &s, &lsn, NULL, NULL, err, sizeof(err)), KV_OK);
	assert_int_equal(lsn, 20);
	assert_int_equal(s.n, 5);
	assert_int_equal(s.bad, 0);
	/* a commit never removes a newer snapshot */
	write_snapshot(d->path, 15, 2, &bytes);
	assert_true(exists(f20));
	assert_false(exists(f10));
	assert_int_equal(load(d->path, &s, &lsn, NULL, NULL, err, sizeof(err)), KV_OK);
	assert_int_equal(lsn, 20);
}

static void
tmp_files_are_ignored_and_cleaned_by_the_next_commit(void **state)
{
	kv_test_dir *d = *state;
	uint64_t bytes, lsn;
	struct seen s;
	char t30[512], t5[512], err[512];

	write_snapshot(d->path, 10, 4, &bytes);
	snap_file(t30, sizeof(t30), d->path, 30, ".tmp");
	snap_file(t5, sizeof(t5), d->path, 5, ".tmp");
	append_raw(t30, "half a snapshot", 15);
	append_raw(t5, "", 0);
	assert_int_equal(load(d->path, &s, &lsn, NULL, NULL, err, sizeof(err)), KV_OK);
	assert_int_equal(lsn, 10);
	assert_int_equal(s.n, 4);
	write_snapshot(d->path, 25, 1, &bytes);
	assert_false(exists(t30));
	assert_false(exists(t5));
	assert_int_equal(count_files(d->path), 1);
}

static void
abort_leaves_nothing_behind(void **state)
{
	kv_test_dir *d = *state;
	kv_snap_writer *w;
	uint64_t lsn;
	struct seen s;
	char err[512];

	assert_int_equal(kv_snap_begin(d->path, 7, &w, err, sizeof(err)), KV_OK);
	assert_int_equal(kv_snap_add(w, 0, "k", 1, "v", 1), KV_OK);
	assert_int_equal(count_files(d->path), 1);
	kv_snap_abort(w);
	assert_int_equal(count_files(d->path), 0);
	kv_snap_abort(NULL);
	assert_int_equal(load(d->path, &s, &lsn, NULL, NULL, err, sizeof(err)), KV_OK);
	assert_int_equal(lsn, 1);
}

static void
oversized_entries_are_rejected_and_the_writer_stays_usable(void **state)
{
	kv_test_dir *d = *state;
	kv_snap_writer *w;
	uint64_t lsn, entries;
	struct seen s;
	char err[512];
	static const uint8_t dummy[1];

	assert_int_equal(kv_snap_begin(d->path, 3, &w, err, sizeof(err)), KV_OK);
	assert_int_equal(kv_snap_add(w, 0, dummy, KV_SNAP_MAX_KEY + 1, dummy, 0), KV_EINVAL);
	assert_int_equal(kv_snap_add(w, 0, dummy, 1, dummy, (size_t)KV_SNAP_MAX_VALUE + 1),
	                 KV_EINVAL);
	assert_int_equal(kv_snap_add(w, 0, NULL, 3, NULL, 0), KV_EINVAL);
	assert_int_equal(kv_snap_add(w, 9, NULL, 0, NULL, 0), KV_OK);
	assert_int_equal(kv_snap_commit(w, err, sizeof(err)), KV_OK);
	memset(&s, 0, sizeof(s));
	assert_int_equal(kv_snap_load(d->path, NULL, NULL, &lsn, &entries, NULL, err, sizeof(err)),
	                 KV_OK);
	assert_int_equal(lsn, 3);
	assert_int_equal(entries, 1);
	assert_int_equal(kv_snap_begin(d->path, 0, &w, err, sizeof(err)), KV_EINVAL);
}

static void
callback_error_stops_the_load(void **state)
{
	kv_test_dir *d = *state;
	uint64_t bytes, lsn;
	struct seen s = {.stop_at = 3};
	char err[512];

	write_snapshot(d->path, 8, 10, &bytes);
	assert_int_equal(kv_snap_load(d->path, check_entry, &s, &lsn, NULL, NULL, err, sizeof(err)),
	                 KV_EINTERNAL);
	assert_int_equal(s.n, 3);
}

static void
write_error_leaves_no_tmp_behind(void **state)
{
	kv_test_dir *d = *state;
	struct rlimit old, small;
	struct sigaction ign = {.sa_handler = SIG_IGN}, oldsa;
	kv_snap_writer *w;
	uint8_t *val = calloc(1, 256 * 1024);
	char err[512];
	int rv = KV_OK, i;

	assert_non_null(val);
	assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
	small = old;
	small.rlim_cur = 1024 * 1024; /* writes past 1 MiB fail with EFBIG */
	assert_int_equal(sigaction(SIGXFSZ, &ign, &oldsa), 0);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
	assert_int_equal(kv_snap_begin(d->path, 4, &w, err, sizeof(err)), KV_OK);
	for (i = 0; i < 64 && rv == KV_OK; i++)
		rv = kv_snap_add(w, 0, "key", 3, val, 256 * 1024);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
	assert_int_equal(sigaction(SIGXFSZ, &oldsa, NULL), 0);
	assert_true(rv == KV_EIO || rv == KV_ENOSPC);
	assert_int_equal(count_files(d->path), 0);               /* removed at once */
	assert_int_equal(kv_snap_add(w, 0, "k", 1, "v", 1), rv); /* sticky */
	assert_int_equal(kv_snap_commit(w, err, sizeof(err)), rv);
	assert_non_null(strstr(err, "snap-0000000000000004.tmp"));
	assert_int_equal(count_files(d->path), 0);
	free(val);
}

/* ---------------------------------------------------------------- damage */

/* A snapshot of 6000 entries (several blocks, one of 3 MiB) at lsn 9: its
 * path and block offsets. */
static void
damaged_fixture(const char *dir, char *f, size_t flen, uint64_t *offs, int *n)
{
	uint64_t bytes;

	big_value = 3u * 1024u * 1024u; /* keep these files small */
	write_snapshot(dir, 9, 6000, &bytes);
	big_value = 64u * 1024u * 1024u;
	snap_file(f, flen, dir, 9, ".dat");
	*n = block_offsets(f, offs, 64);
	assert_true(*n >= 4);
}

static void
expect_corrupt(const char *dir, const char *f, uint64_t off, const char *what)
{
	uint64_t lsn = 0;
	struct seen s;
	char err[512], offs[64];

	assert_int_equal(load(dir, &s, &lsn, NULL, NULL, err, sizeof(err)), KV_ECORRUPT);
	assert_non_null(strstr(err, f));
	snprintf(offs, sizeof(offs), "offset %llu", (unsigned long long)off);
	if (strstr(err, offs) == NULL || (what && strstr(err, what) == NULL))
		fail_msg("error \"%s\" does not say \"%s\" and \"%s\"", err, offs, what);
	assert_int_equal(lsn, 1);
}

static void
flipped_bit_in_a_block_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	uint64_t offs[64];
	char f[512];
	int n;

	damaged_fixture(d->path, f, sizeof(f), offs, &n);
	flip_bit(f, offs[1] + 16 + 100);
	expect_corrupt(d->path, f, offs[1], "checksum");
}

static void
flipped_bit_in_a_block_length_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	uint64_t offs[64];
	char f[512];
	int n;

	damaged_fixture(d->path, f, sizeof(f), offs, &n);
	flip_bit(f, offs[2]);
	expect_corrupt(d->path, f, offs[2], NULL);
}

static void
flipped_bit_in_the_header_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	uint64_t offs[64];
	char f[512];
	int n;

	damaged_fixture(d->path, f, sizeof(f), offs, &n);
	flip_bit(f, 17);
	expect_corrupt(d->path, f, 0, "header");
}

static void
flipped_bit_in_the_trailer_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	uint64_t offs[64];
	char f[512];
	int n;

	damaged_fixture(d->path, f, sizeof(f), offs, &n);
	flip_bit(f, offs[n - 1] + 16 + 3);
	expect_corrupt(d->path, f, offs[n - 1], "checksum");
}

static void
truncated_file_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	uint64_t offs[64];
	char f[512];
	int n;

	damaged_fixture(d->path, f, sizeof(f), offs, &n);
	assert_int_equal(truncate(f, (off_t)offs[2] + 1000), 0);
	expect_corrupt(d->path, f, offs[2], "truncated block");
	assert_int_equal(truncate(f, (off_t)offs[2] + 5), 0);
	expect_corrupt(d->path, f, offs[2], "truncated block header");
}

static void
missing_trailer_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	uint64_t offs[64];
	char f[512];
	int n;

	damaged_fixture(d->path, f, sizeof(f), offs, &n);
	assert_int_equal(truncate(f, (off_t)offs[n - 1]), 0);
	expect_corrupt(d->path, f, offs[n - 1], "missing trailer");
}

static void
data_after_the_trailer_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	uint64_t offs[64];
	char f[512];
	int n;
	off_t size;

	damaged_fixture(d->path, f, sizeof(f), offs, &n);
	size = file_size(f);
	append_raw(f, "x", 1);
	expect_corrupt(d->path, f, (uint64_t)size, "after the trailer");
}

static void
dropped_block_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	uint64_t offs[64];
	char f[512];
	uint8_t *buf;
	off_t size;
	int n, fd;

	/* cut block 1 out: every remaining block is intact, the trailer's
	 * totals and checksum of checksums are not */
	damaged_fixture(d->path, f, sizeof(f), offs, &n);
	size = file_size(f);
	buf = malloc((size_t)size);
	assert_non_null(buf);
	fd = open(f, O_RDWR);
	assert_int_equal(pread(fd, buf, (size_t)size, 0), (ssize_t)size);
	memmove(buf + offs[1], buf + offs[2], (size_t)(size - (off_t)offs[2]));
	size -= (off_t)(offs[2] - offs[1]);
	assert_int_equal(pwrite(fd, buf, (size_t)size, 0), (ssize_t)size);
	assert_int_equal(ftruncate(fd, size), 0);
	close(fd);
	free(buf);
	expect_corrupt(d->path, f, offs[n - 1] - (offs[2] - offs[1]), "trailer");
}

static void
truncated_header_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	char f[512];

	snap_file(f, sizeof(f), d->path, 9, ".dat");
	append_raw(f, "SKVSNAP\0\1\0\0\0 \0\0\0\0\0\0\0", 20);
	expect_corrupt(d->path, f, 0, "truncated header");
}

static void
zero_length_snapshot_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	uint64_t bytes;
	char f[512];

	write_snapshot(d->path, 3, 10, &bytes);
	snap_file(f, sizeof(f), d->path, 9, ".dat");
	append_raw(f, "", 0);
	/* the newest is damaged: no fallback to snapshot 3 */
	expect_corrupt(d->path, f, 0, "truncated header");
}

static void
snapshot_named_after_another_lsn_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	uint64_t bytes;
	char f[512], g[512];

	write_snapshot(d->path, 3, 10, &bytes);
	snap_file(f, sizeof(f), d->path, 3, ".dat");
	snap_file(g, sizeof(g), d->path, 4, ".dat");
	assert_int_equal(rename(f, g), 0);
	expect_corrupt(d->path, g, 0, "lsn");
}

int
main(void)
{
	kv_log_set_level(KV_LOG_OFF);
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
	const struct CMUnitTest tests[] = {
	    T(snapshot_round_trips_small_entries_block_edges_and_a_64_mib_value),
	    T(empty_snapshot_round_trips),
	    T(no_snapshot_loads_as_lsn_1),
	    T(newest_snapshot_is_loaded_and_older_ones_are_removed),
	    T(tmp_files_are_ignored_and_cleaned_by_the_next_commit),
	    T(abort_leaves_nothing_behind),
	    T(oversized_entries_are_rejected_and_the_writer_stays_usable),
	    T(callback_error_stops_the_load),
	    T(write_error_leaves_no_tmp_behind),
	    T(flipped_bit_in_a_block_is_corruption),
	    T(flipped_bit_in_a_block_length_is_corruption),
	    T(flipped_bit_in_the_header_is_corruption),
	    T(flipped_bit_in_the_trailer_is_corruption),
	    T(truncated_file_is_corruption),
	    T(missing_trailer_is_corruption),
	    T(data_after_the_trailer_is_corruption),
	    T(dropped_block_is_corruption),
	    T(truncated_header_is_corruption),
	    T(zero_length_snapshot_is_corruption),
	    T(snapshot_named_after_another_lsn_is_corruption),
	};
#undef T
	return cmocka_run_group_tests(tests, NULL, NULL);
}
