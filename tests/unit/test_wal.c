/*
 * test_wal.c - the write-ahead log (shardserver/wal.h).
 *
 * Built twice (tests/durability.cmake): test_wal runs the format and
 * recovery cases - round trips across segments, torn tails of every shape,
 * corruption in the middle, bad and missing segments, replay from an lsn,
 * rotation and dropping; test_wal_concurrency (KV_WAL_TEST_CONCURRENCY)
 * runs the cases with many threads and the writer's failure handling, and
 * also runs under ThreadSanitizer. Every test uses a fresh directory under
 * /tmp and removes it. Assertions are on counts and contents, never on
 * timing; waits for the writer are bounded polls. Worker threads never call
 * cmocka assertions: they count failures, checked after joining them.
 */
#include "common/defer.h"
#include "common/err.h"
#include "common/key.h"
#include "common/log.h"
#include "shardserver/durable/wal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "tests/support/testutil.h"

/* helpers only one of the two builds uses */
#define HELPER __attribute__((unused)) static

#define HDR KV_WAL_HEADER_SIZE
#define RH  KV_WAL_RECORD_HEADER

#define setup    kv_test_dir_setup
#define teardown kv_test_dir_teardown

HELPER void
seg_file(char *buf, size_t len, const char *dir, uint64_t first)
{
	snprintf(buf, len, "%s/wal-%016llx.log", dir, (unsigned long long)first);
}

HELPER off_t
file_size(const char *f)
{
	struct stat st;
	assert_int_equal(stat(f, &st), 0);
	return st.st_size;
}

HELPER bool
exists(const char *f)
{
	struct stat st;
	return stat(f, &st) == 0;
}

/* The files of dir whose names start with prefix. */
static int
count_named(const char *dir, const char *prefix)
{
	DIR *dd = opendir(dir);
	struct dirent *e;
	int n = 0;

	assert_non_null(dd);
	while ((e = readdir(dd)) != NULL)
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
			n++;
	closedir(dd);
	return n;
}

static int
count_segments(const char *dir)
{
	return count_named(dir, "wal-");
}

HELPER int
count_spares(const char *dir)
{
	return count_named(dir, "spare-");
}

HELPER uint32_t
header_version(const char *f)
{
	uint8_t h[HDR];
	int fd = open(f, O_RDONLY);

	assert_true(fd >= 0);
	assert_int_equal(pread(fd, h, sizeof(h), 0), (ssize_t)sizeof(h));
	close(fd);
	return (uint32_t)h[8] | (uint32_t)h[9] << 8 | (uint32_t)h[10] << 16 | (uint32_t)h[11] << 24;
}

HELPER void
flip_bit(const char *f, uint64_t off)
{
	int fd = open(f, O_RDWR);
	uint8_t b;
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
	b ^= 0x10;
	assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
	close(fd);
}

HELPER void
truncate_to(const char *f, off_t size)
{
	assert_int_equal(truncate(f, size), 0);
}

HELPER void
append_raw(const char *f, const void *p, size_t n)
{
	int fd = open(f, O_WRONLY | O_APPEND | O_CREAT, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, p, n), (ssize_t)n);
	close(fd);
}

/* ---------------------------------------------------------------- records */

static uint64_t big_lsn; /* this lsn gets a 3 MiB payload; 0: none */

/* Deterministic payload size and bytes of a record. */
static size_t
rec_len(uint64_t lsn)
{
	if (lsn == big_lsn)
		return 3u * 1024u * 1024u + 17u;
	return 1 + (size_t)((lsn * 7919u) % 3000u);
}

static uint8_t
rec_byte(uint64_t lsn, size_t i)
{
	return (uint8_t)(lsn * 131u + i * 7u);
}

static uint8_t *
make_payload(uint64_t lsn, size_t *n)
{
	uint8_t *p;
	*n = rec_len(lsn);
	p = malloc(*n);
	assert_non_null(p);
	for (size_t i = 0; i < *n; i++)
		p[i] = rec_byte(lsn, i);
	return p;
}

/* Offset of record lsn in a segment starting at first. */
HELPER uint64_t
rec_off(uint64_t first, uint64_t lsn)
{
	uint64_t off = HDR;
	for (uint64_t l = first; l < lsn; l++)
		off += RH + rec_len(l);
	return off;
}

static void
append_one(kv_wal *w, uint64_t expect_lsn)
{
	size_t n;
	uint8_t *p = make_payload(expect_lsn, &n);
	struct iovec iov[2] = {{p, n / 2}, {p + n / 2, n - n / 2}};
	uint64_t lsn = 0;

	assert_int_equal(kv_wal_appendv(w, iov, 2, &lsn), KV_OK);
	assert_int_equal(lsn, expect_lsn);
	free(p);
}

static kv_wal *
open_log(const char *dir, kv_fsync_mode mode, uint64_t next)
{
	kv_wal_opts o = {.dir = dir, .mode = mode};
	kv_wal *w = NULL;
	char err[512];
	int rv = kv_wal_open(&o, next, &w, err, sizeof(err));
	if (rv != KV_OK)
		fail_msg("kv_wal_open: %s: %s", kv_errname(rv), err);
	return w;
}

/*
 * Writes segments holding counts[0], counts[1], ... records, starting at
 * lsn first (each segment after the first made with kv_wal_rotate).
 */
HELPER void
write_segments(const char *dir, uint64_t first, const int *counts, int nseg)
{
	kv_wal *w = open_log(dir, KV_FSYNC_NONE, first);
	uint64_t lsn = first, at;

	for (int s = 0; s < nseg; s++) {
		if (s > 0) {
			assert_int_equal(kv_wal_rotate(w, &at), KV_OK);
			assert_int_equal(at, lsn);
		}
		for (int i = 0; i < counts[s]; i++)
			append_one(w, lsn++);
	}
	kv_wal_close(w);
}

/* What a replay saw. */
struct got {
	uint64_t n;     /* records */
	uint64_t first; /* first lsn */
	uint64_t last;  /* last lsn */
	uint64_t bad;   /* records out of order or with wrong bytes */
	uint64_t bytes; /* payload bytes */
};

static int
collect(void *arg, uint64_t lsn, const uint8_t *p, size_t n)
{
	struct got *g = arg;

	if (g->n == 0)
		g->first = lsn;
	else if (lsn != g->last + 1)
		g->bad++;
	g->last = lsn;
	g->n++;
	g->bytes += n;
	if (n != rec_len(lsn))
		g->bad++;
	else
		for (size_t i = 0; i < n; i++)
			if (p[i] != rec_byte(lsn, i)) {
				g->bad++;
				break;
			}
	return KV_OK;
}

static int
replay(const char *dir, uint64_t from, bool cut, struct got *g, kv_wal_report *rep, char *err,
       size_t errlen)
{
	memset(g, 0, sizeof(*g));
	return kv_wal_replay(dir, from, cut, collect, g, rep, err, errlen);
}

/* Replays from from and expects success with records [first, last]. */
static void
expect_records(const char *dir, uint64_t from, uint64_t first, uint64_t last)
{
	struct got g;
	kv_wal_report rep;
	char err[512];
	int rv = replay(dir, from, false, &g, &rep, err, sizeof(err));
	if (rv != KV_OK)
		fail_msg("replay: %s: %s", kv_errname(rv), err);
	assert_int_equal(g.bad, 0);
	assert_int_equal(g.n, last + 1 - first);
	if (g.n > 0) {
		assert_int_equal(g.first, first);
		assert_int_equal(g.last, last);
	}
	assert_int_equal(rep.records, g.n);
	assert_int_equal(rep.bytes, g.bytes);
	assert_int_equal(rep.next_lsn, last + 1 > from ? last + 1 : from);
}

/* Waits until the log has written lsn, closes it and expects records 1 to
 * lsn on disk. */
HELPER void
close_written(kv_wal *w, const char *dir, uint64_t lsn)
{
	assert_int_equal(kv_wal_wait(w, lsn, false), KV_OK);
	kv_wal_close(w);
	expect_records(dir, 1, 1, lsn);
}

#ifndef KV_WAL_TEST_CONCURRENCY

/* ---------------------------------------------------------------- round trip */

static void
fsync_modes_parse_and_name(void **state)
{
	kv_fsync_mode m;
	(void)state;
	assert_int_equal(kv_fsync_mode_parse("always", &m), KV_OK);
	assert_int_equal(m, KV_FSYNC_ALWAYS);
	assert_int_equal(kv_fsync_mode_parse("batch", &m), KV_OK);
	assert_int_equal(m, KV_FSYNC_BATCH);
	assert_int_equal(kv_fsync_mode_parse("none", &m), KV_OK);
	assert_int_equal(m, KV_FSYNC_NONE);
	assert_int_equal(kv_fsync_mode_parse("sometimes", &m), KV_EINVAL);
	assert_int_equal(kv_fsync_mode_parse(NULL, &m), KV_EINVAL);
	assert_string_equal(kv_fsync_mode_name(KV_FSYNC_ALWAYS), "always");
	assert_string_equal(kv_fsync_mode_name(KV_FSYNC_BATCH), "batch");
	assert_string_equal(kv_fsync_mode_name(KV_FSYNC_NONE), "none");
}

static void
replay_returns_records_in_order_across_segments(void **state)
{
	kv_test_dir *d = *state;
	/* batches stay under buffer_bytes, so segments end near segment_bytes */
	kv_wal_opts o = {.dir = d->path,
	                 .mode = KV_FSYNC_BATCH,
	                 .segment_bytes = 256 * 1024,
	                 .buffer_bytes = 64 * 1024};
	uint8_t one = 1;
	struct iovec empty = {&one, 0}, huge = {&one, (size_t)KV_WAL_MAX_RECORD + 1};
	uint64_t lsn = 0;
	kv_wal_stats st;
	kv_wal *w;
	char err[512];

	big_lsn = 300;
	assert_int_equal(kv_wal_open(&o, 1, &w, err, sizeof(err)), KV_OK);
	assert_int_equal(kv_wal_appendv(w, &empty, 1, &lsn), KV_EINVAL);
	assert_int_equal(kv_wal_appendv(w, &huge, 1, &lsn), KV_EINVAL);
	assert_int_equal(kv_wal_appendv(w, NULL, 0, &lsn), KV_EINVAL);
	for (uint64_t i = 1; i <= 1000; i++)
		append_one(w, i);
	assert_int_equal(kv_wal_wait(w, 1000, true), KV_OK);
	kv_wal_stats_get(w, &st);
	assert_int_equal(st.records, 1000);
	assert_int_equal(st.next_lsn, 1001);
	assert_int_equal(st.written_lsn, 1000);
	assert_int_equal(st.synced_lsn, 1000);
	assert_int_equal(st.health, KV_OK);
	kv_wal_close(w);
	assert_true(count_segments(d->path) >= 5);
	expect_records(d->path, 1, 1, 1000);
	big_lsn = 0;
}

static void
records_appended_together_get_consecutive_lsns_and_replay_alone(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = open_log(d->path, KV_FSYNC_BATCH, 1);
	uint8_t *p[40];
	struct iovec recs[40];
	size_t n;
	uint64_t first = 0;
	uint8_t one = 1;

	append_one(w, 1);
	for (int i = 0; i < 40; i++) {
		p[i] = make_payload(2 + (uint64_t)i, &n);
		recs[i] = (struct iovec){p[i], n};
	}
	assert_int_equal(kv_wal_append_many(w, recs, 40, &first), KV_OK);
	assert_int_equal(first, 2);
	/* one bad record refuses the whole call: nothing of it is logged */
	struct iovec bad[2] = {recs[0], {&one, 0}};
	assert_int_equal(kv_wal_append_many(w, bad, 2, &first), KV_EINVAL);
	assert_int_equal(kv_wal_append_many(w, recs, 0, &first), KV_EINVAL);
	append_one(w, 42);
	close_written(w, d->path, 42);
	for (int i = 0; i < 40; i++)
		free(p[i]);
}

static void
replay_from_an_lsn_inside_a_segment_starts_there(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {10, 10, 10};

	write_segments(d->path, 1, counts, 3);
	expect_records(d->path, 15, 15, 30);
	expect_records(d->path, 11, 11, 30);
	expect_records(d->path, 30, 30, 30);
	/* past the end: nothing to replay, the log continues at from_lsn */
	expect_records(d->path, 31, 31, 30);
	expect_records(d->path, 40, 40, 39);
}

static void
segments_below_from_lsn_are_not_read(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {10, 10};
	char f[512];

	write_segments(d->path, 1, counts, 2);
	seg_file(f, sizeof(f), d->path, 1);
	flip_bit(f, rec_off(1, 5) + RH + 1);
	expect_records(d->path, 11, 11, 20);
	expect_records(d->path, 12, 12, 20);
}

static void
empty_or_missing_dir_replays_nothing_and_starts_at_from_lsn(void **state)
{
	kv_test_dir *d = *state;
	char missing[512];

	expect_records(d->path, 1, 1, 0);
	expect_records(d->path, 7, 7, 6);
	snprintf(missing, sizeof(missing), "%s/nope", d->path);
	expect_records(missing, 3, 3, 2);
}

static void
log_closed_without_appends_reopens_at_the_same_lsn(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = open_log(d->path, KV_FSYNC_ALWAYS, 1);
	kv_wal_close(w);
	expect_records(d->path, 1, 1, 0);
	w = open_log(d->path, KV_FSYNC_ALWAYS, 1); /* reuses the empty segment */
	append_one(w, 1);
	kv_wal_close(w);
	expect_records(d->path, 1, 1, 1);
	assert_int_equal(count_segments(d->path), 1);
}

static void
open_refuses_segments_at_or_beyond_next_lsn_that_hold_records(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {5};
	kv_wal_opts o = {.dir = d->path, .mode = KV_FSYNC_NONE};
	kv_wal *w = NULL;
	char err[512];

	write_segments(d->path, 10, counts, 1);
	assert_int_equal(kv_wal_open(&o, 10, &w, err, sizeof(err)), KV_EEXISTS);
	assert_non_null(strstr(err, "wal-000000000000000a.log"));
	assert_int_equal(kv_wal_open(&o, 3, &w, err, sizeof(err)), KV_EEXISTS);
	assert_int_equal(kv_wal_open(&o, 0, &w, err, sizeof(err)), KV_EINVAL);
	expect_records(d->path, 10, 10, 14);
}

static void
close_flushes_buffered_records(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = open_log(d->path, KV_FSYNC_NONE, 1);

	for (uint64_t i = 1; i <= 500; i++)
		append_one(w, i);
	kv_wal_close(w);
	expect_records(d->path, 1, 1, 500);
}

/* With BATCH the periodic fsync runs beside the writes: a record appended
 * while an fsync is in progress (held here, as a disk slow to sync would)
 * is written, and answered, without waiting for it; only its own sync waits
 * for the release. Then both are on disk after a reopen. */
static void
batch_writes_go_on_while_an_fsync_is_in_progress(void **state)
{
	kv_test_dir *d = *state;
	kv_wal_opts o = {.dir = d->path, .mode = KV_FSYNC_BATCH, .batch_ms = 1};
	kv_wal *w = NULL;
	char err[512];
	kv_wal_stats st;

	assert_int_equal(kv_wal_open(&o, 1, &w, err, sizeof(err)), KV_OK);
	kv_wal_test_hold_syncs(w, true);
	append_one(w, 1);
	assert_int_equal(kv_wal_wait(w, 1, false), KV_OK);
	/* The fsync of record 1 is taken by the syncer and held there. */
	for (uint64_t end = kv_now_ns() + 5000000000ull; !kv_wal_test_syncs_held(w);) {
		assert_true(kv_now_ns() < end);
		struct timespec ts = {0, 1000000L};
		nanosleep(&ts, NULL);
	}
	for (uint64_t i = 2; i <= 50; i++) {
		append_one(w, i);
		assert_int_equal(kv_wal_wait(w, i, false), KV_OK);
	}
	assert_true(kv_wal_test_syncs_held(w));
	kv_wal_stats_get(w, &st);
	assert_true(st.written_lsn >= 50);
	assert_true(st.synced_lsn < 1);
	kv_wal_test_hold_syncs(w, false);
	assert_int_equal(kv_wal_wait(w, 50, true), KV_OK);
	kv_wal_stats_get(w, &st);
	assert_true(st.synced_lsn >= 50);
	for (uint64_t i = 51; i <= 300; i++)
		append_one(w, i);
	kv_wal_close(w);
	expect_records(d->path, 1, 1, 300);
}

/* With NONE a record nobody waits for still reaches the file on its own
 * (the writer lets the buffer fill only for a bounded time), and a
 * notification or a wait for it is answered without more appends. */
static void
none_writes_a_lone_record_without_being_asked(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = open_log(d->path, KV_FSYNC_NONE, 1);
	uint64_t deadline = kv_now_ns() + 5ull * 1000000000ull;

	append_one(w, 1);
	while (kv_wal_durable_lsn(w) < 1 && kv_now_ns() < deadline) {
		struct timespec ts = {0, 1000000L};
		nanosleep(&ts, NULL);
	}
	assert_true(kv_wal_durable_lsn(w) >= 1);
	append_one(w, 2);
	close_written(w, d->path, 2);
}

/* A lazy BATCH log (kv_wal_opts.lazy: a migration's side log) lets its
 * append buffer fill before the writer takes it: a burst of appends
 * reaches the file in a few big writes, not in one write per wake-up of
 * the writer; a wait is answered without more appends, and a record that
 * nobody waits for is still written and synced by itself. */
static void
lazy_batch_log_writes_a_burst_in_few_writes(void **state)
{
	kv_test_dir *d = *state;
	kv_wal_opts o = {.dir = d->path, .mode = KV_FSYNC_BATCH, .lazy = true};
	const uint64_t total = 400; /* about 600 KB: a few buffers of 256 KiB */
	uint64_t deadline = kv_now_ns() + 5ull * 1000000000ull;
	kv_wal_stats st;
	kv_wal *w = NULL;
	char err[512];

	assert_int_equal(kv_wal_open(&o, 1, &w, err, sizeof(err)), KV_OK);
	for (uint64_t l = 1; l <= total; l++)
		append_one(w, l);
	assert_int_equal(kv_wal_wait(w, total, true), KV_OK);
	kv_wal_stats_get(w, &st);
	print_message("%llu records in %llu writes, %llu fsyncs\n", (unsigned long long)total,
	              (unsigned long long)st.writes, (unsigned long long)st.fsyncs);
	assert_true(st.writes >= 1);
	assert_true(st.writes <= total / 20);
	append_one(w, total + 1);
	while (kv_wal_durable_lsn(w) < total + 1 && kv_now_ns() < deadline) {
		struct timespec ts = {0, 1000000L};
		nanosleep(&ts, NULL);
	}
	assert_true(kv_wal_durable_lsn(w) >= total + 1);
	close_written(w, d->path, total + 1);
}

static void
records_bigger_than_the_buffer_are_accepted(void **state)
{
	kv_test_dir *d = *state;
	kv_wal_opts o = {.dir = d->path, .mode = KV_FSYNC_BATCH, .buffer_bytes = 100};
	kv_wal *w;
	char err[512];

	assert_int_equal(kv_wal_open(&o, 1, &w, err, sizeof(err)), KV_OK);
	for (uint64_t i = 1; i <= 200; i++)
		append_one(w, i);
	kv_wal_close(w);
	expect_records(d->path, 1, 1, 200);
}

/* ---------------------------------------------------------------- read-only reads */

static int
read_log(const char *dir, uint64_t from, uint64_t to, struct got *g, char *err, size_t errlen)
{
	memset(g, 0, sizeof(*g));
	return kv_wal_read(dir, from, to, collect, g, err, errlen);
}

static void
read_returns_exactly_the_records_asked_and_never_cuts_a_torn_tail(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {10, 10, 10};
	const uint8_t half[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
	char f[600], err[512];
	struct got g;

	write_segments(d->path, 1, counts, 3);
	/* The newest segment ends in half a record, as a live log's may. */
	seg_file(f, sizeof(f), d->path, 21);
	append_raw(f, half, sizeof(half));
	off_t size = file_size(f);

	assert_int_equal(read_log(d->path, 5, 20, &g, err, sizeof(err)), KV_OK);
	assert_int_equal(g.bad, 0);
	assert_int_equal(g.n, 16);
	assert_int_equal(g.first, 5);
	assert_int_equal(g.last, 20);
	assert_int_equal(read_log(d->path, 15, 25, &g, err, sizeof(err)), KV_OK);
	assert_int_equal(g.n, 11);
	assert_int_equal(g.last, 25);
	/* Past the last record: an error, and the torn tail is still there. */
	assert_int_equal(read_log(d->path, 25, 31, &g, err, sizeof(err)), KV_ECORRUPT);
	assert_int_equal(file_size(f), size);
	assert_int_equal(read_log(d->path, 20, 10, &g, err, sizeof(err)), KV_EINVAL);
	/* A segment dropped (after a snapshot): the records are missing. */
	seg_file(f, sizeof(f), d->path, 1);
	assert_int_equal(unlink(f), 0);
	assert_int_equal(read_log(d->path, 5, 12, &g, err, sizeof(err)), KV_ECORRUPT);
	assert_int_equal(read_log(d->path, 11, 12, &g, err, sizeof(err)), KV_OK);
	assert_int_equal(g.n, 2);
}

/* ---------------------------------------------------------------- torn tails */

/* Checks a replay that drops a torn tail at off of file f. */
static void
expect_torn(const char *dir, const char *f, uint64_t off, uint64_t bytes, uint64_t last)
{
	struct got g;
	kv_wal_report rep;
	char err[512];
	int rv = replay(dir, 1, false, &g, &rep, err, sizeof(err));
	if (rv != KV_OK)
		fail_msg("replay: %s: %s", kv_errname(rv), err);
	assert_true(rep.torn);
	assert_string_equal(rep.file, f);
	assert_int_equal(rep.offset, off);
	assert_int_equal(rep.torn_bytes, bytes);
	assert_int_equal(g.bad, 0);
	assert_int_equal(g.n, last);
	assert_int_equal(rep.next_lsn, last + 1);
	assert_int_equal(file_size(f), (off_t)off);
}

/* After a torn tail was dropped, the log continues with contiguous lsns. */
static void
expect_appendable(const char *dir, uint64_t next, uint64_t total)
{
	kv_wal *w = open_log(dir, KV_FSYNC_ALWAYS, next);
	for (uint64_t l = next; l <= total; l++)
		append_one(w, l);
	kv_wal_close(w);
	expect_records(dir, 1, 1, total);
}

static void
torn_last_record_is_dropped_at_every_cut_and_log_continues(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {5};
	char f[512];
	uint64_t end5 = rec_off(1, 6), off5 = rec_off(1, 5);
	uint64_t cuts[] = {1,
	                   2,
	                   7,
	                   rec_len(5) - 1,
	                   rec_len(5),
	                   rec_len(5) + 1,
	                   rec_len(5) + 10,
	                   rec_len(5) + RH - 1};

	seg_file(f, sizeof(f), d->path, 1);
	for (size_t c = 0; c < sizeof(cuts) / sizeof(cuts[0]); c++) {
		write_segments(d->path, 1, counts, 1);
		truncate_to(f, (off_t)(end5 - cuts[c]));
		expect_torn(d->path, f, off5, RH + rec_len(5) - cuts[c], 4);
		expect_appendable(d->path, 5, 9);
		teardown(state);
		assert_int_equal(setup(state), 0);
		d = *state;
		seg_file(f, sizeof(f), d->path, 1);
	}
}

/* The zeros a writer keeps ahead of its records, left by a crash: the end
 * of the log, not a torn tail; replay cuts them. */
static void
zeros_after_the_last_record_end_the_log_and_are_cut(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {3};
	static uint8_t zeros[3u << 20];
	kv_wal_report rep;
	struct got g;
	char f[512], err[512];

	write_segments(d->path, 1, counts, 1);
	seg_file(f, sizeof(f), d->path, 1);
	append_raw(f, zeros, sizeof(zeros));
	int rv = replay(d->path, 1, false, &g, &rep, err, sizeof(err));
	if (rv != KV_OK)
		fail_msg("replay: %s: %s", kv_errname(rv), err);
	assert_false(rep.torn);
	assert_int_equal(g.n, 3);
	assert_int_equal(rep.next_lsn, 4);
	assert_int_equal(file_size(f), (off_t)rec_off(1, 4));
	expect_appendable(d->path, 4, 6);
}

/* Half a record, then zeros: the half record is torn, and the zeros go with
 * it. */
static void
zeros_after_half_a_record_are_part_of_the_torn_tail(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {3};
	const uint8_t half[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
	static uint8_t zeros[4096];
	char f[512];

	write_segments(d->path, 1, counts, 1);
	seg_file(f, sizeof(f), d->path, 1);
	append_raw(f, half, sizeof(half));
	append_raw(f, zeros, sizeof(zeros));
	expect_torn(d->path, f, rec_off(1, 4), sizeof(half) + sizeof(zeros), 3);
	expect_appendable(d->path, 4, 6);
}

/* Zeros after the records of an older segment (its writer switched before
 * the cut reached the disk) end that segment; records lost under zeros
 * leave a gap before the next segment, which is corruption. */
static void
zeros_end_an_older_segment_and_lost_records_are_a_gap(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {5, 5};
	static uint8_t zeros[8192];
	char f[512], err[512];
	struct got g;
	kv_wal_report rep;

	write_segments(d->path, 1, counts, 2);
	seg_file(f, sizeof(f), d->path, 1);
	append_raw(f, zeros, sizeof(zeros));
	expect_records(d->path, 1, 1, 10);
	assert_int_equal(file_size(f), (off_t)rec_off(1, 6) + (off_t)sizeof(zeros));
	assert_int_equal(read_log(d->path, 2, 8, &g, err, sizeof(err)), KV_OK);
	assert_int_equal(g.n, 7);

	truncate_to(f, (off_t)rec_off(1, 4));
	append_raw(f, zeros, sizeof(zeros));
	assert_int_equal(replay(d->path, 1, false, &g, &rep, err, sizeof(err)), KV_ECORRUPT);
	assert_non_null(strstr(err, "gap"));
	assert_int_equal(read_log(d->path, 2, 8, &g, err, sizeof(err)), KV_ECORRUPT);
}

/* Reads all of file f into a new buffer. */
static uint8_t *
slurp(const char *f, size_t *n)
{
	FILE *fp = fopen(f, "rb");
	uint8_t *b;

	assert_non_null(fp);
	*n = (size_t)file_size(f);
	b = malloc(*n + 1);
	assert_non_null(b);
	assert_int_equal(fread(b, 1, *n, fp), *n);
	fclose(fp);
	return b;
}

/* A zero fill the file system refuses (here the file size limit, as a full
 * disk would) is cut off again: the writer appends without zeros and loses
 * nothing. */
static void
refused_zero_fill_falls_back_to_appending(void **state)
{
	kv_test_dir *d = *state;
	void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
	struct rlimit old, lim;
	char f[512];

	assert_int_equal(getrlimit(RLIMIT_FSIZE, &old), 0);
	lim = old;
	lim.rlim_cur = 512u * 1024u;
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &lim), 0);
	kv_wal *w = open_log(d->path, KV_FSYNC_ALWAYS, 1);
	seg_file(f, sizeof(f), d->path, 1);
	for (uint64_t l = 1; l <= 20; l++)
		append_one(w, l);
	assert_int_equal(kv_wal_wait(w, 20, true), KV_OK);
	assert_int_equal(file_size(f), (off_t)rec_off(1, 21));
	for (uint64_t l = 21; l <= 40; l++)
		append_one(w, l);
	assert_int_equal(kv_wal_wait(w, 40, true), KV_OK);
	assert_int_equal(file_size(f), (off_t)rec_off(1, 41));
	kv_wal_close(w);
	assert_int_equal(setrlimit(RLIMIT_FSIZE, &old), 0);
	signal(SIGXFSZ, prev);
	expect_records(d->path, 1, 1, 40);
}

/* ALWAYS keeps zeros written ahead of the records (its syncs, which answers
 * wait for, then change no file size); BATCH, whose syncs no answer waits
 * for, and NONE append. A crash's image of the live segment replays to
 * exactly its records; a close cuts the zeros. */
static void
always_log_writes_zeros_ahead_and_close_cuts_them(void **state)
{
	kv_test_dir *d = *state;
	const kv_fsync_mode modes[] = {KV_FSYNC_ALWAYS, KV_FSYNC_BATCH, KV_FSYNC_NONE};
	uint64_t next = 1;

	for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		kv_wal *w = open_log(d->path, modes[m], next);
		uint64_t first = next, end = rec_off(first, first + 5);
		char f[512];
		size_t n;

		for (uint64_t l = first; l < first + 5; l++)
			append_one(w, l);
		next = first + 5;
		assert_int_equal(kv_wal_wait(w, next - 1, true), KV_OK);
		seg_file(f, sizeof(f), d->path, first);
		uint8_t *img = slurp(f, &n);
		if (modes[m] != KV_FSYNC_ALWAYS) {
			assert_int_equal(n, end);
		} else {
			assert_true(n >= end + (1u << 20));
			for (size_t i = end; i < n; i++)
				if (img[i] != 0)
					fail_msg("byte %zu of %zu after the records is not zero", i,
					         n);
		}
		kv_wal_close(w);
		assert_int_equal(file_size(f), (off_t)end);
		/* the image a crash would have left */
		truncate_to(f, 0);
		append_raw(f, img, n);
		free(img);
		expect_records(d->path, 1, 1, next - 1);
		assert_int_equal(file_size(f), (off_t)end);
	}
}

static void
partial_record_header_at_the_end_is_a_torn_tail(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {3};
	uint8_t part[10] = {1, 2, 3, 4, 5, 6, 7, 8, 100, 0};
	char f[512];

	write_segments(d->path, 1, counts, 1);
	seg_file(f, sizeof(f), d->path, 1);
	append_raw(f, part, sizeof(part));
	expect_torn(d->path, f, rec_off(1, 4), sizeof(part), 3);
	expect_appendable(d->path, 4, 5);
}

static void
flipped_bit_in_the_last_record_is_a_torn_tail(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {4, 6};
	char f[512];

	write_segments(d->path, 1, counts, 2);
	seg_file(f, sizeof(f), d->path, 5);
	flip_bit(f, rec_off(5, 10) + RH + rec_len(10) / 2);
	expect_torn(d->path, f, rec_off(5, 10), RH + rec_len(10), 9);
	expect_appendable(d->path, 10, 12);
}

static void
flipped_bit_in_the_last_record_length_is_a_torn_tail(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {4};
	char f[512];

	write_segments(d->path, 1, counts, 1);
	seg_file(f, sizeof(f), d->path, 1);
	flip_bit(f, rec_off(1, 4) + 8); /* length field */
	expect_torn(d->path, f, rec_off(1, 4), RH + rec_len(4), 3);
}

static void
short_last_segment_header_is_a_torn_creation(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {3};
	uint8_t part[20] = {'S', 'K', 'V', 'W', 'A', 'L', 0, 0, 1};
	kv_wal_report rep;
	struct got g;
	char f[512], err[512];

	write_segments(d->path, 1, counts, 1);
	seg_file(f, sizeof(f), d->path, 4);
	append_raw(f, part, sizeof(part));
	assert_int_equal(replay(d->path, 1, false, &g, &rep, err, sizeof(err)), KV_OK);
	assert_true(rep.torn);
	assert_string_equal(rep.file, f);
	assert_int_equal(rep.offset, 0);
	assert_int_equal(rep.torn_bytes, sizeof(part));
	assert_int_equal(g.n, 3);
	assert_int_equal(rep.next_lsn, 4);
	assert_false(exists(f));
	expect_appendable(d->path, 4, 6);
}

static void
zero_length_last_segment_is_removed(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {3};
	kv_wal_report rep;
	struct got g;
	char f[512], err[512];

	write_segments(d->path, 1, counts, 1);
	seg_file(f, sizeof(f), d->path, 4);
	append_raw(f, "", 0);
	assert_int_equal(replay(d->path, 1, false, &g, &rep, err, sizeof(err)), KV_OK);
	assert_true(rep.torn);
	assert_int_equal(rep.torn_bytes, 0);
	assert_false(exists(f));
	assert_int_equal(rep.next_lsn, 4);
	/* the same when it is the only segment replay starts from */
	append_raw(f, "", 0);
	assert_int_equal(replay(d->path, 4, false, &g, &rep, err, sizeof(err)), KV_OK);
	assert_true(rep.torn);
	assert_int_equal(g.n, 0);
	assert_int_equal(rep.next_lsn, 4);
	assert_false(exists(f));
}

/* ---------------------------------------------------------------- corruption */

/* Expects KV_ECORRUPT at file f, offset off. */
static void expect_corrupt(const char *dir, uint64_t from, const char *f, uint64_t off,
                           const char *what);

static void
expect_corrupt_at(const char *dir, const char *f, uint64_t off)
{
	expect_corrupt(dir, 1, f, off, NULL);
}

static void
zeroed_header_of_the_last_segment_is_a_torn_creation(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {3};
	uint8_t zeros[HDR] = {0};
	kv_wal_report rep;
	struct got g;
	char f[512], err[512];

	write_segments(d->path, 1, counts, 1);
	seg_file(f, sizeof(f), d->path, 4);
	append_raw(f, zeros, sizeof(zeros));
	assert_int_equal(replay(d->path, 1, false, &g, &rep, err, sizeof(err)), KV_OK);
	assert_true(rep.torn);
	assert_int_equal(rep.torn_bytes, HDR);
	assert_false(exists(f));
	assert_int_equal(rep.next_lsn, 4);
	/* with a record after it, the same header is corruption */
	append_raw(f, zeros, sizeof(zeros));
	append_raw(f, zeros, sizeof(zeros));
	expect_corrupt_at(d->path, f, 0);
}

struct stopper {
	uint64_t n;
	int code;
};

static int
stop_at_third(void *arg, uint64_t lsn, const uint8_t *p, size_t n)
{
	struct stopper *s = arg;
	(void)lsn;
	(void)p;
	(void)n;
	return ++s->n == 3 ? s->code : KV_OK;
}

static void
callback_code_stops_the_replay(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {3, 3};
	struct stopper s = {0, KV_EINTERNAL};
	kv_wal_report rep;
	char err[512];

	write_segments(d->path, 1, counts, 2);
	assert_int_equal(
	    kv_wal_replay(d->path, 1, false, stop_at_third, &s, &rep, err, sizeof(err)),
	    KV_EINTERNAL);
	assert_int_equal(s.n, 3);
	assert_non_null(strstr(err, "lsn 3"));
	s = (struct stopper){0, 7}; /* any non-zero code, even a positive one */
	assert_int_equal(
	    kv_wal_replay(d->path, 1, false, stop_at_third, &s, &rep, err, sizeof(err)), 7);
	expect_records(d->path, 1, 1, 6);
}

/* Expects KV_ECORRUPT naming file f and offset off. */
static void
expect_corrupt(const char *dir, uint64_t from, const char *f, uint64_t off, const char *what)
{
	kv_wal_report rep;
	struct got g;
	char err[512], offs[64];

	assert_int_equal(replay(dir, from, false, &g, &rep, err, sizeof(err)), KV_ECORRUPT);
	assert_string_equal(rep.file, f);
	assert_int_equal(rep.offset, off);
	assert_non_null(strstr(err, f));
	snprintf(offs, sizeof(offs), "offset %llu", (unsigned long long)off);
	assert_non_null(strstr(err, offs));
	if (what != NULL && strstr(err, what) == NULL)
		fail_msg("error \"%s\" does not say \"%s\"", err, what);
}

static void
flipped_bit_in_a_middle_record_is_corruption_naming_file_and_offset(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {6};
	char f[512];

	write_segments(d->path, 1, counts, 1);
	seg_file(f, sizeof(f), d->path, 1);
	flip_bit(f, rec_off(1, 3) + RH + 2);
	expect_corrupt(d->path, 1, f, rec_off(1, 3), "corrupt record");
	/* also when replay starts after the bad record: it is still read */
	expect_corrupt(d->path, 5, f, rec_off(1, 3), NULL);
	assert_int_equal(file_size(f), (off_t)rec_off(1, 7)); /* nothing cut */
}

static void
truncate_corrupt_cuts_the_log_at_a_bad_middle_record(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {6, 4};
	kv_wal_report rep;
	struct got g;
	char f[512], f2[512], err[512];

	write_segments(d->path, 1, counts, 2);
	seg_file(f, sizeof(f), d->path, 1);
	seg_file(f2, sizeof(f2), d->path, 7);
	flip_bit(f, rec_off(1, 3) + 9); /* length field */
	expect_corrupt(d->path, 1, f, rec_off(1, 3), NULL);
	assert_int_equal(replay(d->path, 1, true, &g, &rep, err, sizeof(err)), KV_OK);
	assert_true(rep.torn);
	assert_string_equal(rep.file, f);
	assert_int_equal(rep.offset, rec_off(1, 3));
	assert_int_equal(rep.torn_bytes,
	                 rec_off(1, 7) - rec_off(1, 3) + rec_off(7, 11)); /* + all of f2 */
	assert_non_null(strstr(err, f));
	assert_int_equal(g.n, 2);
	assert_int_equal(g.bad, 0);
	assert_int_equal(rep.next_lsn, 3);
	assert_int_equal(file_size(f), (off_t)rec_off(1, 3));
	assert_false(exists(f2));
	expect_appendable(d->path, 3, 8);
}

static void
bad_record_in_a_segment_before_the_last_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {4, 4};
	char f[512];

	write_segments(d->path, 1, counts, 2);
	seg_file(f, sizeof(f), d->path, 1);
	flip_bit(f, rec_off(1, 4) + RH); /* its last record */
	expect_corrupt(d->path, 1, f, rec_off(1, 4), NULL);
	/* and a torn tail there too */
	truncate_to(f, (off_t)rec_off(1, 5) - 3);
	expect_corrupt(d->path, 1, f, rec_off(1, 4), NULL);
}

static void
segment_named_after_another_lsn_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {3};
	char f[512], g[512];

	write_segments(d->path, 1, counts, 1);
	seg_file(f, sizeof(f), d->path, 1);
	seg_file(g, sizeof(g), d->path, 2);
	assert_int_equal(rename(f, g), 0);
	expect_corrupt(d->path, 2, g, 0, "bad segment header");
}

static void
record_with_a_wrong_lsn_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {3};
	char f[512], g[512];
	uint8_t *buf;
	off_t n;
	int fd;

	/* a copy of segment 1 with a valid header claiming lsn 4: its first
	 * record has a good checksum but lsn 1 */
	write_segments(d->path, 1, counts, 1);
	seg_file(f, sizeof(f), d->path, 1);
	seg_file(g, sizeof(g), d->path, 4);
	n = file_size(f);
	buf = malloc((size_t)n);
	assert_non_null(buf);
	fd = open(f, O_RDONLY);
	assert_int_equal(read(fd, buf, (size_t)n), (ssize_t)n);
	close(fd);
	buf[16] = 4;
	uint64_t sum = kv_hash64(buf, 24);
	for (int i = 0; i < 8; i++)
		buf[24 + i] = (uint8_t)(sum >> (8 * i));
	append_raw(g, buf, (size_t)n);
	free(buf);
	expect_corrupt(d->path, 1, g, HDR, "record has lsn 1, expected 4");
}

static void
flipped_bit_in_a_segment_header_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {3, 3};
	char f[512];

	write_segments(d->path, 1, counts, 2);
	seg_file(f, sizeof(f), d->path, 4);
	flip_bit(f, 17);
	expect_corrupt(d->path, 1, f, 0, "bad segment header");
	seg_file(f, sizeof(f), d->path, 1);
	flip_bit(f, 2);
	expect_corrupt(d->path, 1, f, 0, "bad segment header");
}

static void
truncated_header_of_a_middle_segment_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {3, 3, 3};
	kv_wal_report rep;
	struct got g;
	char f[512], f3[512], err[512];

	write_segments(d->path, 1, counts, 3);
	seg_file(f, sizeof(f), d->path, 4);
	seg_file(f3, sizeof(f3), d->path, 7);
	truncate_to(f, 20);
	expect_corrupt(d->path, 1, f, 0, "shorter than its header");
	truncate_to(f, 0);
	expect_corrupt(d->path, 1, f, 0, "shorter than its header");
	/* with truncate_corrupt: that segment and the later ones go */
	assert_int_equal(replay(d->path, 1, true, &g, &rep, err, sizeof(err)), KV_OK);
	assert_true(rep.torn);
	assert_int_equal(g.n, 3);
	assert_int_equal(rep.next_lsn, 4);
	assert_false(exists(f));
	assert_false(exists(f3));
	expect_appendable(d->path, 4, 6);
}

static void
missing_middle_segment_is_a_gap(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {3, 3, 3};
	char f[512];

	write_segments(d->path, 1, counts, 3);
	seg_file(f, sizeof(f), d->path, 4);
	assert_int_equal(unlink(f), 0);
	seg_file(f, sizeof(f), d->path, 7);
	expect_corrupt(d->path, 1, f, 0, "gap");
	/* replay from inside the missing range: the segment before covers it */
	expect_corrupt(d->path, 5, f, 0, "gap");
	/* but from the last segment on, nothing is missing */
	expect_records(d->path, 7, 7, 9);
}

static void
log_starting_after_from_lsn_is_missing_records(void **state)
{
	kv_test_dir *d = *state;
	const int counts[] = {3};
	kv_wal_report rep;
	struct got g;
	char f[512], err[512];

	write_segments(d->path, 5, counts, 1);
	seg_file(f, sizeof(f), d->path, 5);
	assert_int_equal(replay(d->path, 1, false, &g, &rep, err, sizeof(err)), KV_ECORRUPT);
	assert_non_null(strstr(err, "log starts at 5, need 1"));
	assert_string_equal(rep.file, f);
	assert_int_equal(replay(d->path, 4, true, &g, &rep, err, sizeof(err)), KV_ECORRUPT);
	assert_non_null(strstr(err, "log starts at 5, need 4"));
	assert_int_equal(g.n, 0);
	expect_records(d->path, 5, 5, 7);
	expect_records(d->path, 6, 6, 7);
}

/* ---------------------------------------------------------------- rotate, drop */

static void
rotate_starts_a_segment_at_the_next_lsn(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = open_log(d->path, KV_FSYNC_BATCH, 1);
	uint64_t at = 0;
	char f[512];

	assert_int_equal(kv_wal_rotate(w, &at), KV_OK); /* empty: nothing to do */
	assert_int_equal(at, 1);
	assert_int_equal(count_segments(d->path), 1);
	for (uint64_t l = 1; l <= 5; l++)
		append_one(w, l);
	assert_int_equal(kv_wal_rotate(w, &at), KV_OK);
	assert_int_equal(at, 6);
	seg_file(f, sizeof(f), d->path, 6);
	assert_true(exists(f));
	assert_int_equal(file_size(f), HDR);
	assert_int_equal(kv_wal_rotate(w, &at), KV_OK); /* still empty */
	assert_int_equal(at, 6);
	assert_int_equal(count_segments(d->path), 2);
	/* the old segment was fsynced by the rotation */
	kv_wal_stats st;
	kv_wal_stats_get(w, &st);
	assert_int_equal(st.synced_lsn, 5);
	for (uint64_t l = 6; l <= 8; l++)
		append_one(w, l);
	kv_wal_close(w);
	seg_file(f, sizeof(f), d->path, 1);
	assert_int_equal(file_size(f), (off_t)rec_off(1, 6));
	expect_records(d->path, 1, 1, 8);
	expect_records(d->path, 6, 6, 8);
}

static void
drop_before_removes_only_fully_covered_segments(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = open_log(d->path, KV_FSYNC_ALWAYS, 1);
	uint64_t at, lsn = 1;
	char f[512];

	for (int s = 0; s < 4; s++) {
		if (s > 0)
			assert_int_equal(kv_wal_rotate(w, &at), KV_OK);
		for (int i = 0; i < 5; i++)
			append_one(w, lsn++);
	}
	/* segments start at 1, 6, 11, 16 (open) */
	assert_int_equal(kv_wal_drop_before(w, 5), KV_OK); /* 1 holds 5 */
	assert_int_equal(count_segments(d->path), 4);
	assert_int_equal(kv_wal_drop_before(w, 6), KV_OK);
	assert_int_equal(count_segments(d->path), 3);
	seg_file(f, sizeof(f), d->path, 1);
	assert_false(exists(f));
	assert_int_equal(kv_wal_drop_before(w, 13), KV_OK); /* 6..10 go, 11 holds 11, 12 */
	assert_int_equal(count_segments(d->path), 2);
	assert_int_equal(kv_wal_drop_before(w, 1000), KV_OK); /* never the open one */
	assert_int_equal(count_segments(d->path), 1);
	seg_file(f, sizeof(f), d->path, 16);
	assert_true(exists(f));
	append_one(w, lsn++);
	kv_wal_close(w);
	expect_records(d->path, 16, 16, 21);
	expect_records(d->path, 18, 18, 21);
}

/* ---------------------------------------------------------------- recycled segments */

/* Puts the bytes of f back to img (n bytes). */
static void
restore(const char *f, const uint8_t *img, size_t n)
{
	truncate_to(f, 0);
	append_raw(f, img, n);
}

/*
 * A log of mode in DIR whose segments 1, 21, 41, 61 and 81 (20 records
 * each) a drop made obsolete, then segment 101 (records 101, 102), 103
 * (103) and 104 (104, 105), the log still open, every record written and
 * synced. Returns the log.
 */
static kv_wal *
recycling_log(const char *dir, kv_fsync_mode mode)
{
	kv_wal *w = open_log(dir, mode, 1);
	uint64_t at, lsn = 1;

	for (int s = 0; s < 5; s++) {
		if (s > 0)
			assert_int_equal(kv_wal_rotate(w, &at), KV_OK);
		for (int i = 0; i < 20; i++)
			append_one(w, lsn++);
	}
	assert_int_equal(kv_wal_rotate(w, &at), KV_OK);
	assert_int_equal(at, 101);
	assert_int_equal(kv_wal_drop_before(w, 101), KV_OK);
	assert_int_equal(count_segments(dir), 1);
	append_one(w, lsn++);
	append_one(w, lsn++);
	assert_int_equal(kv_wal_rotate(w, &at), KV_OK);
	append_one(w, lsn++);
	assert_int_equal(kv_wal_rotate(w, &at), KV_OK);
	append_one(w, lsn++);
	append_one(w, lsn++);
	assert_int_equal(kv_wal_wait(w, 105, true), KV_OK);
	return w;
}

/* A synced log keeps the segments a drop made obsolete and makes its next
 * segments of them: a crash leaves the older records after the last
 * segment's own, which replay cuts like a torn tail; a close cuts them
 * itself; the next open removes the spares left. */
static void
a_dropped_segment_is_reused_and_replay_ends_at_its_own_records(void **state)
{
	kv_test_dir *d = *state;
	const kv_fsync_mode modes[] = {KV_FSYNC_BATCH, KV_FSYNC_ALWAYS};

	for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++) {
		kv_wal *w = recycling_log(d->path, modes[m]);
		uint64_t end = rec_off(104, 106);
		kv_wal_report rep;
		struct got g;
		char f[512], err[512];
		size_t n;

		/* five dropped and kept, two of them now segments 103, 104 */
		assert_int_equal(count_spares(d->path), 3);
		kv_wal_stats st;
		kv_wal_stats_get(w, &st);
		assert_int_equal(st.segments, 8); /* 1, 21, 41, 61, 81, 101, 103, 104 */
		assert_int_equal(st.reused, 2);
		seg_file(f, sizeof(f), d->path, 101);
		assert_int_equal(header_version(f), KV_WAL_VERSION);
		seg_file(f, sizeof(f), d->path, 103);
		assert_int_equal(header_version(f), KV_WAL_VERSION_RECYCLED);
		assert_int_equal(file_size(f), (off_t)rec_off(103, 104)); /* cut at the switch */
		seg_file(f, sizeof(f), d->path, 104);
		assert_int_equal(header_version(f), KV_WAL_VERSION_RECYCLED);
		uint8_t *img = slurp(f, &n);
		assert_true(n > end); /* the older records are still there */
		kv_wal_close(w);
		assert_int_equal(file_size(f), (off_t)end);
		expect_records(d->path, 101, 101, 105);

		/* the image a crash would have left */
		restore(f, img, n);
		free(img);
		int rv = replay(d->path, 101, false, &g, &rep, err, sizeof(err));
		if (rv != KV_OK)
			fail_msg("replay: %s: %s", kv_errname(rv), err);
		assert_int_equal(g.bad, 0);
		assert_int_equal(g.n, 5);
		assert_int_equal(rep.next_lsn, 106);
		assert_true(rep.torn);
		assert_string_equal(rep.file, f);
		assert_int_equal(rep.offset, end);
		assert_int_equal(rep.torn_bytes, n - end);
		assert_int_equal(file_size(f), (off_t)end);

		/* the log goes on after it; the open removes the spares */
		w = open_log(d->path, modes[m], 106);
		assert_int_equal(count_spares(d->path), 0);
		append_one(w, 106);
		kv_wal_close(w);
		expect_records(d->path, 101, 101, 106);

		teardown(state);
		assert_int_equal(setup(state), 0);
		d = *state;
	}
}

/* NONE never syncs its segments: a drop removes them. */
static void
a_none_log_keeps_no_dropped_segment(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = recycling_log(d->path, KV_FSYNC_NONE);
	kv_wal_stats st;
	char f[512];

	assert_int_equal(count_spares(d->path), 0);
	kv_wal_stats_get(w, &st);
	assert_int_equal(st.segments, 8);
	assert_int_equal(st.reused, 0);
	seg_file(f, sizeof(f), d->path, 104);
	assert_int_equal(header_version(f), KV_WAL_VERSION);
	kv_wal_close(w);
	expect_records(d->path, 101, 101, 105);
}

/* A drop keeps at most eight spares; the other segments it drops are
 * removed. */
static void
a_drop_keeps_at_most_eight_spares(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = open_log(d->path, KV_FSYNC_BATCH, 1);
	uint64_t at = 0, lsn = 1;

	for (int s = 0; s < 10; s++) {
		append_one(w, lsn++);
		assert_int_equal(kv_wal_rotate(w, &at), KV_OK);
	}
	assert_int_equal(count_segments(d->path), 11);
	assert_int_equal(kv_wal_drop_before(w, at), KV_OK);
	assert_int_equal(count_segments(d->path), 1);
	assert_int_equal(count_spares(d->path), 8);
	append_one(w, lsn++);
	kv_wal_close(w);
	expect_records(d->path, at, at, lsn - 1);
}

/* A full disk removes the spares: their space serves better free. */
static void
a_full_disk_removes_the_spares(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = recycling_log(d->path, KV_FSYNC_BATCH);

	assert_int_equal(count_spares(d->path), 3);
	kv_wal_test_fail_writes(w, KV_ENOSPC);
	append_one(w, 106);
	assert_int_equal(kv_wal_wait(w, 106, true), KV_ENOSPC);
	assert_int_equal(count_spares(d->path), 0);
	kv_wal_test_fail_writes(w, 0);
	for (int i = 0; i < 3000 && kv_wal_health(w) != KV_OK; i++)
		usleep(10 * 1000);
	assert_int_equal(kv_wal_wait(w, 106, true), KV_OK);
	kv_wal_close(w);
	expect_records(d->path, 101, 101, 106);
}

/* The bytes of record lsn of segment first in DIR (*n of them). */
static uint8_t *
record_bytes(const char *dir, uint64_t first, uint64_t lsn, size_t *n)
{
	char f[512];
	size_t len;
	uint8_t *seg, *r;

	seg_file(f, sizeof(f), dir, first);
	seg = slurp(f, &len);
	*n = RH + rec_len(lsn);
	assert_true(rec_off(first, lsn) + *n <= len);
	r = malloc(*n);
	assert_non_null(r);
	memcpy(r, seg + rec_off(first, lsn), *n);
	free(seg);
	return r;
}

/* A recycled segment before the last may still hold older records after
 * its own (its cut at the switch never reached the disk): they end it when
 * the next segment starts after its last record; when records are missing
 * before the next segment, that is corruption where its records end. */
static void
older_records_end_a_recycled_segment_before_the_last(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = recycling_log(d->path, KV_FSYNC_BATCH);
	uint8_t *old;
	size_t nold;
	char f[512];

	kv_wal_close(w);
	old = record_bytes(d->path, 101, 101, &nold); /* an older lsn than 103 */
	seg_file(f, sizeof(f), d->path, 103);
	append_raw(f, old + 5, 30); /* a piece of a record */
	append_raw(f, old, nold);   /* a whole one */
	expect_records(d->path, 101, 101, 105);

	/* record 103 lost: the older record follows the header */
	truncate_to(f, HDR);
	append_raw(f, old, nold);
	expect_corrupt(d->path, 101, f, HDR,
	               "recycled segment's records end before lsn 103, the next segment starts "
	               "at 104");
	free(old);
}

/* In the last segment, an older record followed by one of the segment's
 * own is corruption, not a tail. */
static void
an_own_record_after_older_ones_in_the_last_segment_is_corruption(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = recycling_log(d->path, KV_FSYNC_BATCH);
	uint8_t *old, *r105;
	size_t nold, n105;
	char f[512];

	kv_wal_close(w);
	old = record_bytes(d->path, 101, 102, &nold);
	r105 = record_bytes(d->path, 104, 105, &n105);
	seg_file(f, sizeof(f), d->path, 104);
	truncate_to(f, (off_t)rec_off(104, 105));
	append_raw(f, old, nold);
	append_raw(f, r105, n105);
	expect_corrupt(d->path, 101, f, rec_off(104, 105),
	               "record of lsn 102, older than its recycled segment");
	free(old);
	free(r105);
}

#else /* KV_WAL_TEST_CONCURRENCY */

/* ---------------------------------------------------------------- concurrency */

#define THREADS    8
#define PER_THREAD 2000
#define REC_BYTES  24

struct counters {
	atomic_uint_fast64_t ok;    /* notifications with status 0 */
	atomic_uint_fast64_t err;   /* ... with the expected error */
	atomic_uint_fast64_t other; /* ... with anything else */
	int expect_err;             /* the expected error */
};

static void
count_done(void *arg, int status)
{
	struct counters *c = arg;
	if (status == KV_OK)
		atomic_fetch_add(&c->ok, 1);
	else if (status == c->expect_err)
		atomic_fetch_add(&c->err, 1);
	else
		atomic_fetch_add(&c->other, 1);
}

/* A record of thread t, sequence s: both in the payload, to check later. */
static void
thread_payload(uint8_t *p, uint32_t t, uint32_t s)
{
	memset(p, 0, REC_BYTES);
	memcpy(p, &t, 4);
	memcpy(p + 4, &s, 4);
	for (int i = 8; i < REC_BYTES; i++)
		p[i] = (uint8_t)(t * 17 + s * 3 + (uint32_t)i);
}

struct seq_check {
	uint32_t next[THREADS]; /* next sequence per thread */
	uint64_t n, last, bad;
	bool any_start;     /* a thread's records may start at any sequence */
	bool seen[THREADS]; /* ... and this one's first was seen */
};

static int
check_seq(void *arg, uint64_t lsn, const uint8_t *p, size_t n)
{
	struct seq_check *c = arg;
	uint8_t want[REC_BYTES];
	uint32_t t, s;

	if (c->n > 0 && lsn != c->last + 1)
		c->bad++;
	c->last = lsn;
	c->n++;
	if (n != REC_BYTES) {
		c->bad++;
		return KV_OK;
	}
	memcpy(&t, p, 4);
	memcpy(&s, p + 4, 4);
	thread_payload(want, t, s);
	if (t < THREADS && c->any_start && !c->seen[t]) {
		c->seen[t] = true;
		c->next[t] = s;
	}
	if (t >= THREADS || s != c->next[t] || memcmp(p, want, REC_BYTES) != 0)
		c->bad++;
	else
		c->next[t]++;
	return KV_OK;
}

struct worker {
	kv_wal *w;
	uint32_t id;
	uint32_t count;
	struct counters *c;
	atomic_uint_fast64_t *failures;
	bool wait_every; /* wait for durability every 50 appends */
};

static void *
append_worker(void *p)
{
	struct worker *a = p;
	uint8_t rec[REC_BYTES];
	uint64_t lsn = 0;

	for (uint32_t s = 0; s < a->count; s++) {
		struct iovec iov = {rec, sizeof(rec)};
		thread_payload(rec, a->id, s);
		if (kv_wal_appendv(a->w, &iov, 1, &lsn) != KV_OK ||
		    kv_wal_notify(a->w, lsn, count_done, a->c) != KV_OK) {
			atomic_fetch_add(a->failures, 1);
			continue;
		}
		if (a->wait_every && s % 50 == 49 && kv_wal_wait(a->w, lsn, true) != KV_OK)
			atomic_fetch_add(a->failures, 1);
	}
	return NULL;
}

static void
expect_thread_records(const char *dir, uint64_t total)
{
	struct seq_check c = {{0}};
	kv_wal_report rep;
	char err[512];
	int rv = kv_wal_replay(dir, 1, false, check_seq, &c, &rep, err, sizeof(err));
	if (rv != KV_OK)
		fail_msg("replay: %s: %s", kv_errname(rv), err);
	assert_false(rep.torn);
	assert_int_equal(c.bad, 0);
	assert_int_equal(c.n, total);
	assert_int_equal(rep.next_lsn, total + 1);
	for (int t = 0; t < THREADS; t++)
		assert_int_equal(c.next[t], total / THREADS);
}

static void
run_workers(kv_wal *w, struct counters *c, uint32_t per_thread, bool wait_every)
{
	pthread_t th[THREADS];
	struct worker a[THREADS];
	atomic_uint_fast64_t failures = 0;

	for (uint32_t t = 0; t < THREADS; t++) {
		a[t] = (struct worker){.w = w,
		                       .id = t,
		                       .count = per_thread,
		                       .c = c,
		                       .failures = &failures,
		                       .wait_every = wait_every};
		assert_int_equal(pthread_create(&th[t], NULL, append_worker, &a[t]), 0);
	}
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	assert_int_equal(atomic_load(&failures), 0);
}

static void
group_commit_makes_every_record_durable_with_fewer_fsyncs(void **state)
{
	kv_test_dir *d = *state;
	struct counters c = {0};
	uint64_t total = (uint64_t)THREADS * PER_THREAD;
	kv_wal *w = open_log(d->path, KV_FSYNC_ALWAYS, 1);
	kv_wal_stats st;

	run_workers(w, &c, PER_THREAD, true);
	assert_int_equal(kv_wal_wait(w, total, true), KV_OK);
	kv_wal_stats_get(w, &st);
	assert_int_equal(st.records, total);
	assert_int_equal(st.synced_lsn, total);
	assert_int_equal(st.health, KV_OK);
	print_message("%llu records, %llu writes, %llu fsyncs\n", (unsigned long long)total,
	              (unsigned long long)st.writes, (unsigned long long)st.fsyncs);
	assert_true(st.fsyncs > 0);
	assert_true(st.fsyncs < total);
	assert_true(st.writes < total);
	kv_wal_close(w);
	assert_int_equal(atomic_load(&c.ok), total);
	assert_int_equal(atomic_load(&c.other), 0);
	expect_thread_records(d->path, total);
}

static void
rotation_and_dropping_while_appending_keep_lsns_contiguous(void **state)
{
	kv_test_dir *d = *state;
	struct counters c = {0};
	kv_wal_opts o = {.dir = d->path,
	                 .mode = KV_FSYNC_NONE,
	                 .segment_bytes = 16 * 1024,
	                 .buffer_bytes = 4096};
	uint64_t total = (uint64_t)THREADS * 500;
	pthread_t th[THREADS];
	struct worker a[THREADS];
	atomic_uint_fast64_t failures = 0;
	kv_wal *w;
	char err[512];

	assert_int_equal(kv_wal_open(&o, 1, &w, err, sizeof(err)), KV_OK);
	for (uint32_t t = 0; t < THREADS; t++) {
		a[t] =
		    (struct worker){.w = w, .id = t, .count = 500, .c = &c, .failures = &failures};
		assert_int_equal(pthread_create(&th[t], NULL, append_worker, &a[t]), 0);
	}
	for (int i = 0; i < 20; i++) {
		uint64_t at;
		assert_int_equal(kv_wal_rotate(w, &at), KV_OK);
		assert_int_equal(kv_wal_drop_before(w, 1), KV_OK); /* keeps everything */
	}
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	assert_int_equal(atomic_load(&failures), 0);
	kv_wal_close(w);
	assert_int_equal(atomic_load(&c.ok), total);
	assert_true(count_segments(d->path) > 2);
	expect_thread_records(d->path, total);
}

/* Segments dropped while threads append become later segments (BATCH):
 * every record from the last drop on replays, in order, and the spares
 * stay at most eight. */
static void
dropped_segments_reused_while_appending_lose_nothing(void **state)
{
	kv_test_dir *d = *state;
	struct counters c = {0};
	kv_wal_opts o = {.dir = d->path,
	                 .mode = KV_FSYNC_BATCH,
	                 .segment_bytes = 4 * 1024,
	                 .buffer_bytes = 4096};
	uint64_t total = (uint64_t)THREADS * 500, from = 1, at, lsn;
	pthread_t th[THREADS];
	struct worker a[THREADS];
	atomic_uint_fast64_t failures = 0;
	uint8_t rec[REC_BYTES];
	struct iovec iov = {rec, sizeof(rec)};
	struct seq_check sc = {.any_start = true};
	kv_wal_report rep;
	kv_wal *w;
	char err[512], f[512];

	assert_int_equal(kv_wal_open(&o, 1, &w, err, sizeof(err)), KV_OK);
	for (uint32_t t = 0; t < THREADS; t++) {
		a[t] = (struct worker){.w = w,
		                       .id = t,
		                       .count = 500,
		                       .c = &c,
		                       .failures = &failures,
		                       .wait_every = true};
		assert_int_equal(pthread_create(&th[t], NULL, append_worker, &a[t]), 0);
	}
	for (int i = 0; i < 40; i++) {
		assert_int_equal(kv_wal_rotate(w, &at), KV_OK);
		assert_int_equal(kv_wal_drop_before(w, from), KV_OK);
		assert_true(count_spares(d->path) <= 8);
		from = at;
	}
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	assert_int_equal(atomic_load(&failures), 0);
	/* one switch into a spare for certain: drop every closed segment,
	 * then switch after one more record (thread 0's next) */
	assert_int_equal(kv_wal_rotate(w, &at), KV_OK);
	assert_int_equal(kv_wal_drop_before(w, at), KV_OK);
	assert_true(count_spares(d->path) >= 1);
	from = at;
	thread_payload(rec, 0, 500);
	assert_int_equal(kv_wal_appendv(w, &iov, 1, &lsn), KV_OK);
	assert_int_equal(lsn, total + 1);
	assert_int_equal(kv_wal_rotate(w, &at), KV_OK);
	assert_int_equal(at, total + 2);
	seg_file(f, sizeof(f), d->path, at);
	assert_int_equal(header_version(f), KV_WAL_VERSION_RECYCLED);
	kv_wal_close(w);
	assert_int_equal(atomic_load(&c.ok), total);

	assert_int_equal(
	    kv_wal_replay(d->path, from, false, check_seq, &sc, &rep, err, sizeof(err)), KV_OK);
	assert_false(rep.torn);
	assert_int_equal(sc.bad, 0);
	assert_int_equal(sc.n, total + 2 - from);
	assert_int_equal(rep.next_lsn, total + 2);
}

/* --fsync none syncs nothing of its own: segment switches (by size and by
 * kv_wal_rotate) write the old segment and start the next without an
 * fdatasync, and every record still replays in order; an explicit sync
 * request is still honoured. */
static void
a_none_log_switches_segments_without_syncing_them(void **state)
{
	kv_test_dir *d = *state;
	kv_wal_opts o = {.dir = d->path, .mode = KV_FSYNC_NONE, .segment_bytes = 16 * 1024};
	kv_wal_stats st;
	kv_wal *w;
	uint64_t lsn = 1, at;
	char err[512];

	assert_int_equal(kv_wal_open(&o, 1, &w, err, sizeof(err)), KV_OK);
	for (int r = 0; r < 4; r++) {
		for (int i = 0; i < 50; i++)
			append_one(w, lsn++);
		assert_int_equal(kv_wal_wait(w, lsn - 1, false), KV_OK);
		assert_int_equal(kv_wal_rotate(w, &at), KV_OK);
		assert_int_equal(at, lsn);
	}
	kv_wal_stats_get(w, &st);
	assert_true(count_segments(d->path) >= 5); /* the four rotations at least */
	assert_int_equal(st.fsyncs, 0);
	assert_int_equal(st.written_lsn, lsn - 1);
	assert_int_equal(kv_wal_wait(w, lsn - 1, true), KV_OK);
	kv_wal_stats_get(w, &st);
	assert_true(st.fsyncs >= 1);
	assert_int_equal(st.synced_lsn, lsn - 1);
	kv_wal_close(w);
	expect_records(d->path, 1, 1, lsn - 1);
}

/* A --fsync none log opened with close_unsynced (a migration's side log,
 * closed on the transfer's commit path) writes what is left at its close
 * but does not fsync it; without the option a close still syncs. */
static void
a_none_log_with_close_unsynced_closes_without_a_sync(void **state)
{
	kv_test_dir *d = *state;
	char sub[4200], err[512];
	kv_wal *w;
	uint64_t lsn = 1, before;

	for (int unsynced = 1; unsynced >= 0; unsynced--) {
		snprintf(sub, sizeof(sub), "%s/%s", d->path, unsynced ? "side" : "plain");
		kv_wal_opts o = {.dir = sub, .mode = KV_FSYNC_NONE, .close_unsynced = unsynced};
		assert_int_equal(kv_wal_open(&o, 1, &w, err, sizeof(err)), KV_OK);
		for (lsn = 1; lsn <= 100; lsn++)
			append_one(w, lsn);
		before = kv_wal_test_fsyncs();
		kv_wal_close(w);
		if (unsynced)
			assert_int_equal(kv_wal_test_fsyncs(), before);
		else
			assert_true(kv_wal_test_fsyncs() > before);
		expect_records(sub, 1, 1, 100);
	}
}

/* A flag a notification sets, to wait for without sleeping blindly. */
struct flag {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool set;
	int status;
	pthread_t thread; /* where the notification ran */
};

static void
flag_done(void *arg, int status)
{
	struct flag *f = arg;
	pthread_mutex_lock(&f->mu);
	f->set = true;
	f->thread = pthread_self();
	f->status = status;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

/* Waits for the flag, at most 30 s (a liveness bound, not a timing check). */
static bool
flag_wait(struct flag *f)
{
	struct timespec ts;
	bool set;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += 30;
	pthread_mutex_lock(&f->mu);
	while (!f->set && pthread_cond_timedwait(&f->cv, &f->mu, &ts) == 0)
		;
	set = f->set;
	pthread_mutex_unlock(&f->mu);
	return set;
}

static void
batch_notifications_fire_without_waiting_for_fsync(void **state)
{
	kv_test_dir *d = *state;
	kv_wal_opts o = {.dir = d->path, .mode = KV_FSYNC_BATCH, .batch_ms = 600000};
	struct flag f = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, -1};
	kv_wal_stats st;
	kv_wal *w;
	char err[512];

	assert_int_equal(kv_wal_open(&o, 1, &w, err, sizeof(err)), KV_OK);
	append_one(w, 1);
	append_one(w, 2);
	assert_int_equal(kv_wal_notify(w, 2, flag_done, &f), KV_OK);
	assert_true(flag_wait(&f));
	assert_int_equal(f.status, KV_OK);
	kv_wal_stats_get(w, &st);
	assert_int_equal(st.fsyncs, 0); /* the interval is ten minutes */
	assert_int_equal(st.written_lsn, 2);
	assert_int_equal(st.synced_lsn, 0);
	assert_int_equal(kv_wal_wait(w, 2, false), KV_OK);
	assert_int_equal(kv_wal_wait(w, 2, true), KV_OK); /* forces the fsync */
	kv_wal_stats_get(w, &st);
	assert_int_equal(st.fsyncs, 1);
	assert_int_equal(st.synced_lsn, 2);
	assert_int_equal(kv_wal_wait(w, 3, false), KV_EINVAL);
	assert_int_equal(kv_wal_notify(w, 3, flag_done, &f), KV_EINVAL);
	kv_wal_close(w);
	expect_records(d->path, 1, 1, 2);
}

/* Waits (bounded poll, 30 s) until the writer sleeps. */
static void
until_writer_sleeps(kv_wal *w)
{
	for (int i = 0; i < 30000 && !kv_wal_test_writer_sleeps(w); i++)
		usleep(1000);
	assert_true(kv_wal_test_writer_sleeps(w));
}

static kv_wal *
open_round_log(const char *dir, uint32_t batch_ms)
{
	kv_wal_opts o = {
	    .dir = dir, .mode = KV_FSYNC_BATCH, .batch_ms = batch_ms, .round_writes = true};
	kv_wal *w = NULL;
	char err[512];
	int rv = kv_wal_open(&o, 1, &w, err, sizeof(err));
	if (rv != KV_OK)
		fail_msg("kv_wal_open: %s: %s", kv_errname(rv), err);
	return w;
}

/* BATCH with round_writes: what a loop's round appends while the writer
 * sleeps is written at the round's end, on the round's thread, and the
 * notifications it covers fire there, before kv_defer_end returns. Outside
 * a round the writer is woken; a wait inside a round is not left hanging. */
static void
batch_appends_of_a_round_are_written_at_its_end_on_its_thread(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = open_round_log(d->path, 600000);
	kv_wal_stats st;

	for (uint64_t r = 0; r < 2; r++) {
		struct flag h = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, -1};
		until_writer_sleeps(w);
		kv_defer_begin();
		append_one(w, 2 * r + 1);
		append_one(w, 2 * r + 2);
		assert_int_equal(kv_wal_notify(w, 2 * r + 2, flag_done, &h), KV_OK);
		kv_wal_stats_get(w, &st);
		assert_int_equal(st.written_lsn, 2 * r);
		assert_false(h.set);
		kv_defer_end();
		assert_true(h.set); /* on this thread: no lock needed to look */
		assert_int_equal(h.status, KV_OK);
		assert_true(pthread_equal(h.thread, pthread_self()));
		kv_wal_stats_get(w, &st);
		assert_int_equal(st.written_lsn, 2 * r + 2);
		assert_int_equal(st.fsyncs, 0); /* the interval is ten minutes */
	}

	/* outside a round: the writer is woken and writes it */
	struct flag f = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, -1};
	until_writer_sleeps(w);
	append_one(w, 5);
	assert_int_equal(kv_wal_notify(w, 5, flag_done, &f), KV_OK);
	assert_true(flag_wait(&f));
	assert_int_equal(f.status, KV_OK);

	/* a wait in a round, after an append left to its end */
	until_writer_sleeps(w);
	kv_defer_begin();
	append_one(w, 6);
	assert_int_equal(kv_wal_wait(w, 6, false), KV_OK);
	kv_defer_end();

	/* a round's thread writes its records before its end, to wait for
	 * them (a backup's Replicate) */
	until_writer_sleeps(w);
	kv_defer_begin();
	append_one(w, 7);
	kv_wal_write_here(w);
	kv_wal_stats_get(w, &st);
	assert_int_equal(st.written_lsn, 7);
	kv_defer_end();
	kv_wal_close(w);
	expect_records(d->path, 1, 1, 7);
}

/* A round that appends more than the log buffers (the appends block for
 * room) or than a round's end writes wakes the writer: it neither hangs
 * nor loses a record. */
static void
a_round_appending_past_the_buffer_wakes_the_writer(void **state)
{
	kv_test_dir *d = *state;
	kv_wal_opts o = {.dir = d->path,
	                 .mode = KV_FSYNC_BATCH,
	                 .buffer_bytes = 64u * 1024u,
	                 .round_writes = true};
	kv_wal *w = NULL;
	char err[512];

	assert_int_equal(kv_wal_open(&o, 1, &w, err, sizeof(err)), KV_OK);
	until_writer_sleeps(w);
	kv_defer_begin();
	for (uint64_t l = 1; l <= 300; l++) /* about 450 KB */
		append_one(w, l);
	kv_defer_end();
	close_written(w, d->path, 300);
}

/* The writer still syncs on its interval what rounds wrote without it. */
static void
round_written_records_are_synced_on_the_interval(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = open_round_log(d->path, 20);
	kv_wal_stats st = {0};

	until_writer_sleeps(w);
	kv_defer_begin();
	append_one(w, 1);
	kv_defer_end();
	kv_wal_stats_get(w, &st);
	assert_int_equal(st.written_lsn, 1);
	for (int i = 0; i < 30000 && st.synced_lsn < 1; i++) {
		usleep(1000);
		kv_wal_stats_get(w, &st);
	}
	assert_int_equal(st.synced_lsn, 1);
	kv_wal_close(w);
	expect_records(d->path, 1, 1, 1);
}

struct rounder {
	kv_wal *w;
	uint32_t id;
	struct counters *c;
	atomic_uint_fast64_t *failures;
};

/* Appends PER_THREAD records: in rounds of 1 to 5 appends on even
 * threads, plainly on odd ones. */
static void *
round_worker(void *p)
{
	struct rounder *a = p;
	uint8_t rec[REC_BYTES];
	uint64_t lsn = 0;
	uint32_t s = 0;

	while (s < PER_THREAD) {
		uint32_t k = 1 + s % 5;
		bool round = a->id % 2 == 0;
		if (round)
			kv_defer_begin();
		for (uint32_t i = 0; i < k && s < PER_THREAD; i++, s++) {
			struct iovec iov = {rec, sizeof(rec)};
			thread_payload(rec, a->id, s);
			if (kv_wal_appendv(a->w, &iov, 1, &lsn) != KV_OK ||
			    kv_wal_notify(a->w, lsn, count_done, a->c) != KV_OK)
				atomic_fetch_add(a->failures, 1);
		}
		if (round)
			kv_defer_end();
	}
	return NULL;
}

/* Rounds on several threads, plain appends and the writer's periodic
 * syncs at once: every record once, in order per thread, every
 * notification fired with success. */
static void
rounds_on_many_threads_and_plain_appends_lose_nothing(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = open_round_log(d->path, 1);
	struct counters c = {0};
	uint64_t total = (uint64_t)THREADS * PER_THREAD;
	atomic_uint_fast64_t failures = 0;
	pthread_t th[THREADS];
	struct rounder a[THREADS];

	for (uint32_t t = 0; t < THREADS; t++) {
		a[t] = (struct rounder){.w = w, .id = t, .c = &c, .failures = &failures};
		assert_int_equal(pthread_create(&th[t], NULL, round_worker, &a[t]), 0);
	}
	for (int t = 0; t < THREADS; t++)
		pthread_join(th[t], NULL);
	assert_int_equal(atomic_load(&failures), 0);
	assert_int_equal(kv_wal_wait(w, total, true), KV_OK);
	for (int i = 0; i < 30000 && atomic_load(&c.ok) < total; i++)
		usleep(1000);
	assert_int_equal(atomic_load(&c.ok), total);
	assert_int_equal(atomic_load(&c.other), 0);
	kv_wal_close(w);
	expect_thread_records(d->path, total);
}

/* Records the order in which notifications fire. */
struct order {
	pthread_mutex_t mu;
	uint64_t fired[128];
	int n;
	int bad; /* fired with a non-zero status */
};

struct order_arg {
	struct order *o;
	uint64_t lsn;
};

static void
order_done(void *arg, int status)
{
	struct order_arg *a = arg;
	pthread_mutex_lock(&a->o->mu);
	if (status != KV_OK)
		a->o->bad++;
	if (a->o->n < 128)
		a->o->fired[a->o->n] = a->lsn;
	a->o->n++;
	pthread_mutex_unlock(&a->o->mu);
}

/* Blocks the writer thread (inside a notification) until released; a
 * notification that fires inline, on the test thread, only says so. */
struct gate {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	pthread_t test_thread;
	bool entered, open, inline_call;
};

static void
gate_done(void *arg, int status)
{
	struct gate *g = arg;
	(void)status;
	pthread_mutex_lock(&g->mu);
	if (pthread_equal(pthread_self(), g->test_thread)) {
		g->inline_call = true;
		pthread_mutex_unlock(&g->mu);
		return;
	}
	g->entered = true;
	pthread_cond_broadcast(&g->cv);
	while (!g->open)
		pthread_cond_wait(&g->cv, &g->mu);
	pthread_mutex_unlock(&g->mu);
}

static void
notifications_registered_out_of_lsn_order_fire_in_lsn_order(void **state)
{
	kv_test_dir *d = *state;
	struct gate g = {PTHREAD_MUTEX_INITIALIZER,
	                 PTHREAD_COND_INITIALIZER,
	                 pthread_self(),
	                 false,
	                 false,
	                 false};
	struct order o = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct order_arg args[99];
	kv_wal *w = open_log(d->path, KV_FSYNC_ALWAYS, 1);
	uint64_t k = 0;

	/* hold the writer in lsn k's notification while k+1..k+99 queue up
	 * (k: the first record whose notification did not fire inline) */
	for (;;) {
		append_one(w, ++k);
		assert_int_equal(kv_wal_notify(w, k, gate_done, &g), KV_OK);
		pthread_mutex_lock(&g.mu);
		bool was_inline = g.inline_call;
		g.inline_call = false;
		pthread_mutex_unlock(&g.mu);
		if (!was_inline)
			break;
		assert_true(k < 1000);
	}
	pthread_mutex_lock(&g.mu);
	while (!g.entered)
		pthread_cond_wait(&g.cv, &g.mu);
	pthread_mutex_unlock(&g.mu);
	for (uint64_t l = k + 1; l <= k + 99; l++)
		append_one(w, l);
	for (int i = 98; i >= 0; i--) {
		args[i] = (struct order_arg){&o, k + 1 + (uint64_t)i};
		assert_int_equal(kv_wal_notify(w, k + 1 + (uint64_t)i, order_done, &args[i]),
		                 KV_OK);
	}
	pthread_mutex_lock(&o.mu);
	assert_int_equal(o.n, 0); /* none durable yet: all queued */
	pthread_mutex_unlock(&o.mu);
	pthread_mutex_lock(&g.mu);
	g.open = true;
	pthread_cond_broadcast(&g.cv);
	pthread_mutex_unlock(&g.mu);
	assert_int_equal(kv_wal_wait(w, k + 99, true), KV_OK);
	kv_wal_close(w);
	assert_int_equal(o.n, 99);
	assert_int_equal(o.bad, 0);
	for (int i = 0; i < 99; i++)
		assert_int_equal(o.fired[i], k + 1 + (uint64_t)i);
	expect_records(d->path, 1, 1, k + 99);
}

static void
injected_enospc_reports_errors_and_recovers_without_losing_records(void **state)
{
	kv_test_dir *d = *state;
	struct counters c = {.expect_err = KV_ENOSPC};
	kv_wal *w = open_log(d->path, KV_FSYNC_ALWAYS, 1);
	uint64_t lsn = 1;
	kv_wal_stats st;

	for (; lsn <= 10; lsn++)
		append_one(w, lsn);
	assert_int_equal(kv_wal_wait(w, 10, true), KV_OK);

	kv_wal_test_fail_writes(w, KV_ENOSPC);
	for (; lsn <= 30; lsn++) {
		append_one(w, lsn);
		assert_int_equal(kv_wal_notify(w, lsn, count_done, &c), KV_OK);
	}
	/* every notification fires with the error: the failed write reports
	 * them, or they are registered after it and fire inline */
	for (int i = 0; i < 3000 && atomic_load(&c.err) < 20; i++)
		usleep(10 * 1000);
	assert_int_equal(atomic_load(&c.err), 20);
	assert_int_equal(atomic_load(&c.ok), 0);
	assert_int_equal(kv_wal_health(w), KV_ENOSPC);
	assert_int_equal(kv_wal_wait(w, 30, true), KV_ENOSPC);
	assert_int_equal(kv_wal_notify(w, 30, count_done, &c), KV_OK);
	assert_int_equal(atomic_load(&c.err), 21); /* inline */
	/* appends still buffer while unhealthy (the caller refuses new ones) */
	for (; lsn <= 40; lsn++)
		append_one(w, lsn);
	kv_wal_stats_get(w, &st);
	assert_int_equal(st.health, KV_ENOSPC);
	assert_int_equal(st.synced_lsn, 10);

	kv_wal_test_fail_writes(w, 0);
	for (int i = 0; i < 3000 && kv_wal_health(w) != KV_OK; i++)
		usleep(10 * 1000);
	assert_int_equal(kv_wal_health(w), KV_OK);
	assert_int_equal(kv_wal_wait(w, 40, true), KV_OK);
	assert_int_equal(kv_wal_notify(w, 25, count_done, &c), KV_OK);
	assert_int_equal(atomic_load(&c.ok), 1); /* inline: durable now */
	append_one(w, lsn);
	kv_wal_close(w);
	assert_int_equal(atomic_load(&c.other), 0);
	expect_records(d->path, 1, 1, 41);
}

static void
failed_fsync_rewrites_unsynced_records_exactly_once(void **state)
{
	kv_test_dir *d = *state;
	kv_wal_opts o = {.dir = d->path, .mode = KV_FSYNC_BATCH, .batch_ms = 600000};
	kv_wal_report rep;
	kv_wal_stats st;
	struct got g;
	kv_wal *w;
	char err[512];

	assert_int_equal(kv_wal_open(&o, 1, &w, err, sizeof(err)), KV_OK);
	for (uint64_t l = 1; l <= 10; l++)
		append_one(w, l);
	assert_int_equal(kv_wal_wait(w, 10, false), KV_OK); /* written, not synced */
	kv_wal_test_fail_writes(w, EIO);                    /* an errno works too */
	assert_int_equal(kv_wal_wait(w, 10, true), KV_EIO);
	assert_int_equal(kv_wal_health(w), KV_EIO);
	for (uint64_t l = 11; l <= 15; l++)
		append_one(w, l);
	kv_wal_test_fail_writes(w, 0);
	for (int i = 0; i < 3000 && kv_wal_health(w) != KV_OK; i++)
		usleep(10 * 1000);
	assert_int_equal(kv_wal_wait(w, 15, true), KV_OK);
	kv_wal_stats_get(w, &st);
	assert_int_equal(st.synced_lsn, 15);
	kv_wal_close(w);
	assert_int_equal(replay(d->path, 1, false, &g, &rep, err, sizeof(err)), KV_OK);
	assert_false(rep.torn);
	assert_int_equal(g.n, 15);
	assert_int_equal(g.bad, 0);
}

static void
close_completes_pending_notifications(void **state)
{
	kv_test_dir *d = *state;
	struct counters c = {.expect_err = KV_ECLOSED};
	kv_wal *w = open_log(d->path, KV_FSYNC_ALWAYS, 1);

	for (uint64_t l = 1; l <= 200; l++) {
		append_one(w, l);
		assert_int_equal(kv_wal_notify(w, l, count_done, &c), KV_OK);
	}
	kv_wal_close(w);
	assert_int_equal(atomic_load(&c.ok), 200);
	expect_records(d->path, 1, 1, 200);
}

static void
close_on_a_failed_disk_gives_up_and_leaves_a_clean_prefix(void **state)
{
	kv_test_dir *d = *state;
	kv_wal *w = open_log(d->path, KV_FSYNC_ALWAYS, 1);
	struct flag f = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, false, -1};
	kv_wal_report rep;
	struct got g;
	char err[512];

	append_one(w, 1);
	assert_int_equal(kv_wal_wait(w, 1, true), KV_OK);
	kv_wal_test_fail_writes(w, KV_EIO);
	append_one(w, 2);
	assert_int_equal(kv_wal_notify(w, 2, flag_done, &f), KV_OK);
	assert_true(flag_wait(&f));
	assert_int_equal(f.status, KV_EIO);
	append_one(w, 3);
	kv_wal_close(w); /* gives up after a few seconds */
	/* the half-written batch was cut back: no torn tail, only record 1 */
	assert_int_equal(replay(d->path, 1, false, &g, &rep, err, sizeof(err)), KV_OK);
	assert_false(rep.torn);
	assert_int_equal(g.n, 1);
	assert_int_equal(g.bad, 0);
}

#endif /* KV_WAL_TEST_CONCURRENCY */

int
main(void)
{
	kv_log_set_level(KV_LOG_OFF);
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
	const struct CMUnitTest tests[] = {
#ifndef KV_WAL_TEST_CONCURRENCY
	    T(fsync_modes_parse_and_name),
	    T(replay_returns_records_in_order_across_segments),
	    T(read_returns_exactly_the_records_asked_and_never_cuts_a_torn_tail),
	    T(records_appended_together_get_consecutive_lsns_and_replay_alone),
	    T(replay_from_an_lsn_inside_a_segment_starts_there),
	    T(segments_below_from_lsn_are_not_read),
	    T(empty_or_missing_dir_replays_nothing_and_starts_at_from_lsn),
	    T(log_closed_without_appends_reopens_at_the_same_lsn),
	    T(open_refuses_segments_at_or_beyond_next_lsn_that_hold_records),
	    T(close_flushes_buffered_records),
	    T(none_writes_a_lone_record_without_being_asked),
	    T(lazy_batch_log_writes_a_burst_in_few_writes),
	    T(batch_writes_go_on_while_an_fsync_is_in_progress),
	    T(records_bigger_than_the_buffer_are_accepted),
	    T(torn_last_record_is_dropped_at_every_cut_and_log_continues),
	    T(zeros_after_the_last_record_end_the_log_and_are_cut),
	    T(zeros_after_half_a_record_are_part_of_the_torn_tail),
	    T(zeros_end_an_older_segment_and_lost_records_are_a_gap),
	    T(always_log_writes_zeros_ahead_and_close_cuts_them),
	    T(refused_zero_fill_falls_back_to_appending),
	    T(partial_record_header_at_the_end_is_a_torn_tail),
	    T(flipped_bit_in_the_last_record_is_a_torn_tail),
	    T(flipped_bit_in_the_last_record_length_is_a_torn_tail),
	    T(short_last_segment_header_is_a_torn_creation),
	    T(zero_length_last_segment_is_removed),
	    T(zeroed_header_of_the_last_segment_is_a_torn_creation),
	    T(callback_code_stops_the_replay),
	    T(flipped_bit_in_a_middle_record_is_corruption_naming_file_and_offset),
	    T(truncate_corrupt_cuts_the_log_at_a_bad_middle_record),
	    T(bad_record_in_a_segment_before_the_last_is_corruption),
	    T(segment_named_after_another_lsn_is_corruption),
	    T(record_with_a_wrong_lsn_is_corruption),
	    T(flipped_bit_in_a_segment_header_is_corruption),
	    T(truncated_header_of_a_middle_segment_is_corruption),
	    T(missing_middle_segment_is_a_gap),
	    T(log_starting_after_from_lsn_is_missing_records),
	    T(rotate_starts_a_segment_at_the_next_lsn),
	    T(drop_before_removes_only_fully_covered_segments),
	    T(a_dropped_segment_is_reused_and_replay_ends_at_its_own_records),
	    T(a_none_log_keeps_no_dropped_segment),
	    T(a_drop_keeps_at_most_eight_spares),
	    T(a_full_disk_removes_the_spares),
	    T(older_records_end_a_recycled_segment_before_the_last),
	    T(an_own_record_after_older_ones_in_the_last_segment_is_corruption),
#else
	    T(group_commit_makes_every_record_durable_with_fewer_fsyncs),
	    T(a_none_log_switches_segments_without_syncing_them),
	    T(a_none_log_with_close_unsynced_closes_without_a_sync),
	    T(rotation_and_dropping_while_appending_keep_lsns_contiguous),
	    T(dropped_segments_reused_while_appending_lose_nothing),
	    T(batch_notifications_fire_without_waiting_for_fsync),
	    T(batch_appends_of_a_round_are_written_at_its_end_on_its_thread),
	    T(round_written_records_are_synced_on_the_interval),
	    T(a_round_appending_past_the_buffer_wakes_the_writer),
	    T(rounds_on_many_threads_and_plain_appends_lose_nothing),
	    T(notifications_registered_out_of_lsn_order_fire_in_lsn_order),
	    T(injected_enospc_reports_errors_and_recovers_without_losing_records),
	    T(failed_fsync_rewrites_unsynced_records_exactly_once),
	    T(close_completes_pending_notifications),
	    T(close_on_a_failed_disk_gives_up_and_leaves_a_clean_prefix),
#endif
	};
#undef T
	return cmocka_run_group_tests(tests, NULL, NULL);
}
