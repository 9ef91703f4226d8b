/*
 * wal.c - the write-ahead log (wal.h).
 *
 * Appending: appenders frame a record (header with a zero checksum, then the
 * payload) at the end of the current buffer `cur` under `mu` and take the
 * next lsn, so the byte order in the buffers is the lsn order. The single
 * writer thread moves `cur` (the pointer, never the bytes) into its list of
 * pending chunks, fills in the checksums outside the lock, writes all
 * pending chunks with one pwritev(2) at the segment's good end, fdatasyncs
 * by the policy, and then completes the notifications the new written or
 * synced lsn covers, calling them outside the lock. Appenders that arrive
 * while the writer is in write or fsync fill the next `cur`: that is the
 * group commit. An appender wakes the writer only when it sleeps: a busy
 * writer looks for more before it sleeps. With NONE, where nothing waits
 * for the bytes, the writer also lets a buffer fill for up to
 * WAL_LINGER_NS (or WAL_LAZY_BYTES) before it takes it, unless someone
 * waits for it (a notification, kv_wal_wait, a rotation, close): a wake-up
 * and a pwritev per request cost a server about a tenth of its cycles under
 * pipelined writes. A lazy BATCH log (kv_wal_opts.lazy: a migration's side
 * log, which nothing waits for record by record) lets its buffer fill the
 * same way, and syncs by its period as BATCH does.
 *
 * Round writes (BATCH with round_writes, the server's own log): an append
 * made in an event loop's round (common/defer.h) leaves the write to the
 * round's end, where round_end does the writer's take and write on the
 * loop's thread and completes the notifications it covers, so that the
 * round's answers go out with it; the writer leaves such a buffer alone
 * (cur_due) unless it waits over WAL_ROUND_NS or holds a record of another
 * thread (cur_urgent). Whoever does a round owns the writer's fields
 * (round_busy). The writer keeps the syncs, switches, rotations and
 * failures.
 *
 * Failure and retry: the writer owns the bytes until they are safe - written
 * (NONE) or fsynced (ALWAYS, BATCH) - and only then recycles the chunks. A
 * failed write or fsync leaves the chunks in place, cuts the file back to
 * its last good offset, sets the sticky health error and retries later from
 * that offset; after a failed fsync every unsynced byte is rewritten, since
 * the kernel may have dropped the dirty pages. So the file only ever holds a
 * prefix of the lsn sequence, and no record is lost while the process lives.
 *
 * Segments: the writer switches to a new segment when the current one has
 * grown past segment_bytes and more data arrives, or on kv_wal_rotate(). A
 * switch first writes and fsyncs everything that belongs to the old segment
 * (NONE: writes only; the OS decides when it reaches the disk), then
 * creates the new file (header, fsync, dir fsync) and only then closes the
 * old one.
 *
 * Zeros ahead (ALWAYS): the writer keeps a megabyte or more of zeros
 * written after the records (zero_ahead), so that most writes land inside
 * the file and their fdatasync carries no journal commit. Replay therefore
 * reads a segment's records up to where only zeros follow; a switch and a
 * close cut the zeros off, recovery cuts those a crash left. BATCH appends:
 * its sync runs beside the writes and no answer waits for it, while zeros
 * would cost every record a second write into the page cache (and a
 * megabyte's write inside an event loop's round now and then).
 *
 * Recycled segments (ALWAYS, BATCH): kv_wal_drop_before renames up to
 * WAL_SPARES_MAX of the segments a snapshot made obsolete to spares
 * (`spare-<lsn>.wal`) instead of removing them, and a switch makes a spare
 * the new segment (recycle_segment): a header of version
 * KV_WAL_VERSION_RECYCLED, synced, then a rename. The writer then writes
 * over the older records, into pages the page cache holds and blocks the
 * file system has allocated, instead of into a new file's: no page
 * allocation, no block reservation, no size change for the fdatasync to
 * commit. Replay ends such a segment at its first record that is not its
 * own (wal.h). A switch and a close cut the older records after the last
 * one written, as they cut zeros. NONE removes its segments: they are
 * never synced, and a removed file's unwritten pages are dropped where a
 * kept one's would be written back. An open removes the spares a previous
 * process left: every spare is a segment of this process's log, all of
 * whose records are below the lsns it writes.
 *
 * Locking: one mutex, `mu`, protects the fields marked "mu" below: the
 * append buffer, the lsn counter, the rotation request, the published
 * positions, health, the notification heap, the buffer pool and the
 * counters; the durable position and the health are also published in
 * atomics for readers that take no lock (every write asks the health).
 * The fields marked "writer" belong to the thread doing a round (the writer
 * thread, or a loop in round_end: round_busy, set under mu), which uses
 * them without the lock; with no round in progress they are read under mu
 * (fixed fields are set before the thread starts).
 * Conditions: `work` wakes the writer (data, requests, close, test hook);
 * `progress` wakes appenders waiting for buffer space and threads in
 * kv_wal_wait() and kv_wal_rotate() (after every writer round). Callbacks
 * run without the lock.
 *
 * The segment header and the record checksum are the shared framing of
 * common/frame.h. What this module does not do: interpret record payloads
 * (durable.c does), decide when to snapshot, or answer clients (completions
 * are the caller's callbacks).
 */
#define _GNU_SOURCE /* renameat2 */
#include "shardserver/durable/wal.h"
#include "common/bytes.h"
#include "common/defer.h"
#include "common/err.h"
#include "common/fileio.h"
#include "common/frame.h"
#include "common/key.h"
#include "common/log.h"
#include "common/slice.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define WAL_PATH_MAX   4096
#define WAL_NAME_LEN   24                   /* "wal-" 16 hex ".log" */
#define WAL_SPARE_LEN  26                   /* "spare-" 16 hex ".wal" */
#define WAL_SPARES_MAX 8                    /* dropped segments kept for reuse */
#define WAL_READ_CHUNK (1u << 20)           /* replay reads ahead this much */
#define WAL_MAX_CHUNKS 64                   /* pending buffers the writer holds */
#define WAL_CHUNK_MIN  (64u * 1024u)        /* first allocation of a buffer */
#define WAL_POOL_MAX   2                    /* spare buffers kept */
#define WAL_POOL_CAP   (8u * 1024u * 1024u) /* ... if not bigger than this */
#define WAL_FIRE_BATCH 128                  /* callbacks collected per unlock */
#define WAL_RETRY_MIN  (100ull * 1000000ull)
#define WAL_RETRY_MAX  (1000ull * 1000000ull)
#define WAL_CLOSE_WAIT (3000ull * 1000000ull)
#define WAL_DEF_BATCH  10u

enum { AS_IDLE = 0, AS_POSTED, AS_RUNNING, AS_DONE }; /* kv_wal.as_state */
#define WAL_DEF_SEGMENT (64ull * 1024ull * 1024ull)
#define WAL_DEF_BUFFER  (64ull * 1024ull * 1024ull)
#define WAL_LINGER_NS   (2ull * 1000000ull) /* NONE: a buffer waits this long, at most */
#define WAL_LAZY_BYTES  (256u * 1024u)      /* NONE: ... or this much (BATCH: round_end's most) */
#define WAL_ROUND_NS    (1ull * 1000000ull) /* round_writes: cur waits this long for a round's end */
#define WAL_MERGE_MAX   (16u * 1024u)       /* a taken buffer this small is copied into the last */
#define WAL_ZERO_AHEAD  (1024u * 1024u)     /* ALWAYS, BATCH: zeros written ahead of the records */
#define WAL_ZERO_PIECE  (64u * 1024u)       /* ... from a buffer of this many */

static const char wal_magic[8] = {'S', 'K', 'V', 'W', 'A', 'L', '\0', '\0'};

/* A buffer of whole framed records. */
struct chunk {
	uint8_t *data;     /* records, back to back */
	size_t len;        /* bytes in use */
	size_t cap;        /* bytes allocated */
	uint64_t last_lsn; /* lsn of the last record (pending chunks only) */
	size_t hashed;     /* bytes whose checksums are filled in (pending chunks only) */
};

/* A requested notification. */
struct note {
	uint64_t lsn;
	kv_wal_done_fn fn;
	void *arg;
};

struct kv_wal {
	/* fixed at open */
	char *dir;              /* data dir */
	kv_fsync_mode mode;     /* policy */
	uint64_t batch_ns;      /* BATCH: fsync interval */
	uint64_t segment_bytes; /* switch segments past this */
	uint64_t buffer_bytes;  /* appenders block at this much unwritten */
	bool round_writes;      /* BATCH: round_end writes a loop's appends */
	bool close_unsynced;    /* NONE: a close does not fsync (kv_wal_opts) */
	bool bulk;              /* the writer is a bulk thread (kv_wal_opts) */
	bool lazy;              /* BATCH: cur fills as with NONE (kv_wal_opts) */
	int spares_max;         /* dropped segments kept for reuse, at most */
	pthread_t thread;       /* the writer */

	pthread_mutex_t mu;
	pthread_cond_t work;     /* the writer waits here */
	pthread_cond_t progress; /* appenders, waiters and rotate wait here */

	/* mu */
	struct chunk cur;     /* records not yet taken by the writer */
	uint64_t cur_records; /* ... how many */
	uint64_t cur_since;   /* ... when the first of them came (monotonic ns) */
	bool sleeping;        /* the writer waits on `work` */
	bool lingering;       /* ... NONE, lazy: only for cur to fill (or its time) */
	bool timed;           /* ... and wakes by itself */
	bool round_busy;      /* a round (writer's or round_end's) owns the writer fields */
	bool held;            /* the writer waits for round_end's round to end */
	bool kicked;          /* `work` was signalled during the writer's sleep */
	bool cur_urgent;      /* round_writes: cur holds a record no round's end will write */
	unsigned waiters;     /* threads in kv_wal_wait */
	uint64_t next_lsn;    /* lsn of the next append */
	struct chunk rot;     /* records before a requested rotation, not yet taken */
	bool rot_pending;     /* a kv_wal_rotate() is in progress */
	bool rot_taken;       /* ... and the writer has taken `rot` */
	uint64_t rot_req;     /* ... the first lsn of the segment it asked for */
	uint64_t sync_req;    /* kv_wal_wait(sync) wants every record <= this fsynced */
	uint64_t written_lsn; /* published: every record <= this written */
	uint64_t synced_lsn;  /* published: every record <= this fsynced */
	_Atomic uint64_t durable_pub;    /* durable_lsn() of the two above, read without mu */
	_Atomic int health_pub;          /* health, read without mu (kv_wal_health) */
	uint64_t unwritten;              /* published: pending bytes the writer has not written */
	uint64_t seg_first;              /* published: first lsn of the open segment */
	int health;                      /* sticky I/O error, 0 when healthy */
	uint64_t retry_at;               /* unhealthy: next retry (monotonic ns) */
	uint64_t backoff;                /* ... current retry interval */
	int fault;                       /* test hook: fail writes with this */
	bool closing;                    /* kv_wal_close() has begun */
	bool stopped;                    /* the writer thread has exited */
	struct note *notes;              /* min-heap on lsn */
	size_t nnotes;                   /* ... entries */
	size_t notes_cap;                /* ... allocated */
	struct chunk pool[WAL_POOL_MAX]; /* spare buffers */
	int npool;                       /* ... how many */
	uint64_t st_records;             /* appended records */
	uint64_t st_bytes;               /* ... their payload bytes */
	uint64_t st_writes;              /* published writer counter */
	uint64_t st_fsyncs;              /* published writer counter */
	uint64_t st_segments;            /* segments started */
	uint64_t st_reused;              /* ... of them made of a spare */
	/* BATCH's periodic fsync, on the syncer thread (mu): */
	int as_state;         /* AS_IDLE, AS_POSTED (by the writer), AS_RUNNING, AS_DONE */
	int as_rv;            /* AS_DONE: its result */
	int as_fault;         /* AS_POSTED: the test hook's error, taken for the fsync's */
	uint64_t as_lsn;      /* every record <= this is synced when it succeeds */
	int as_chunks;        /* the pending chunks it makes safe (a prefix) */
	bool as_stop;         /* kv_wal_close: the syncer exits */
	bool as_hold;         /* test hook: a posted fsync waits before it begins */
	bool as_held;         /* ... and one waits now */
	pthread_cond_t as_cv; /* the syncer waits here */
	pthread_t syncer;     /* BATCH only */
	bool has_syncer;

	/* writer */
	int fd;                              /* the open segment */
	uint64_t w_seg_first;                /* its first lsn */
	uint64_t pend_off;                   /* file offset of chunks[0] */
	struct chunk chunks[WAL_MAX_CHUNKS]; /* taken, not yet safe */
	int nchunks;                         /* ... how many */
	uint64_t pend_total;                 /* their bytes */
	uint64_t pend_written;               /* ... of which written (a prefix) */
	uint64_t seg_size;                   /* pend_off + pend_total */
	uint64_t file_end;                   /* the file's size: records, then zeros */
	bool no_zeros;               /* a zero fill failed: append, until the next segment */
	uint64_t w_written;          /* every record <= this written */
	uint64_t w_synced;           /* every record <= this fsynced */
	uint64_t last_sync;          /* time of the last fsync (ns) */
	uint64_t switch_to;          /* switch to a segment at this lsn, 0: no */
	uint64_t n_writes, n_fsyncs; /* counters */

	/* mu: dropped segments kept for reuse (not with NONE), each
	 * `spare-<id>.wal` with id its first lsn as a segment */
	uint64_t spares[WAL_SPARES_MAX];
	int nspares;
};

/* ---------------------------------------------------------------- helpers */

static void
seg_path(char *buf, size_t len, const char *dir, uint64_t first)
{
	snprintf(buf, len, "%s/wal-%016llx.log", dir, (unsigned long long)first);
}

static void
spare_path(char *buf, size_t len, const char *dir, uint64_t id)
{
	snprintf(buf, len, "%s/spare-%016llx.wal", dir, (unsigned long long)id);
}

/* Parses PREFIX "<16 lower-case hex digits>" SUFFIX; returns whether name is
 * one, with a non-zero number. */
static bool
parse_hex_name(const char *name, const char *prefix, const char *suffix, uint64_t *out)
{
	size_t np = strlen(prefix), ns = strlen(suffix);
	uint64_t v = 0;

	if (strlen(name) != np + 16 + ns || strncmp(name, prefix, np) != 0 ||
	    strcmp(name + np + 16, suffix) != 0)
		return false;
	for (size_t i = np; i < np + 16; i++) {
		char c = name[i];
		int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
		if (d < 0)
			return false;
		v = (v << 4) | (uint64_t)d;
	}
	*out = v;
	return v > 0;
}

/* Parses "wal-<16 lower-case hex digits>.log"; returns whether it is one. */
static bool
parse_seg_name(const char *name, uint64_t *first)
{
	return parse_hex_name(name, "wal-", ".log", first);
}

static int
cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Lists the first lsns of DIR's segments, ascending. A missing dir has none. */
static int
list_segments(const char *dir, uint64_t **out, size_t *n, char *err, size_t errlen)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	uint64_t *v = NULL, first;
	size_t cnt = 0, cap = 0;

	*out = NULL;
	*n = 0;
	if (d == NULL) {
		if (errno == ENOENT)
			return KV_OK;
		return kv_errf(err, errlen, kv_err_from_errno(errno), "cannot list wal dir %s: %s",
		               dir, strerror(errno));
	}
	errno = 0;
	while ((e = readdir(d)) != NULL) {
		if (!parse_seg_name(e->d_name, &first))
			continue;
		if (cnt == cap) {
			size_t ncap = cap ? 2 * cap : 16;
			uint64_t *nv = realloc(v, ncap * sizeof(*v));
			if (nv == NULL) {
				free(v);
				closedir(d);
				return KV_ENOMEM;
			}
			v = nv;
			cap = ncap;
		}
		v[cnt++] = first;
	}
	closedir(d);
	if (cnt > 1)
		qsort(v, cnt, sizeof(*v), cmp_u64);
	*out = v;
	*n = cnt;
	return KV_OK;
}

static void
encode_header(uint8_t h[KV_WAL_HEADER_SIZE], uint64_t first, uint32_t version)
{
	kv_frame_header_init(h, wal_magic, version, KV_WAL_HEADER_SIZE);
	kv_put64(h + 16, first);
	kv_frame_header_seal(h, KV_WAL_HEADER_SIZE);
}

/*
 * Creates segment DIR/wal-<first>.log with its header, durable with its dir
 * entry. An existing file of that name that holds no record (a crash while
 * creating it, or a log closed without appends) is reused; one that holds
 * records is KV_EEXISTS. Returns the descriptor in *fdp.
 */
static int
create_segment(const char *dir, uint64_t first, int *fdp, char *err, size_t errlen)
{
	char path[WAL_PATH_MAX];
	uint8_t h[KV_WAL_HEADER_SIZE];
	struct stat st;
	int fd, rv;

	seg_path(path, sizeof(path), dir, first);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
	if (fd < 0 && errno == EEXIST) {
		if (stat(path, &st) != 0)
			return kv_errf(err, errlen, kv_err_from_errno(errno), "cannot stat %s: %s",
			               path, strerror(errno));
		if (st.st_size > (off_t)KV_WAL_HEADER_SIZE)
			return kv_errf(err, errlen, KV_EEXISTS,
			               "wal segment %s already holds records", path);
		fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
	}
	if (fd < 0)
		return kv_errf(err, errlen, kv_err_from_errno(errno),
		               "cannot create wal segment %s: %s", path, strerror(errno));
	encode_header(h, first, KV_WAL_VERSION);
	rv = kv_pwrite_all(fd, h, sizeof(h), 0);
	if (rv == KV_OK && fsync(fd) != 0)
		rv = kv_err_from_errno(errno);
	if (rv == KV_OK)
		rv = kv_fsync_dir(dir);
	if (rv != KV_OK) {
		close(fd);
		unlink(path);
		return kv_errf(err, errlen, rv, "cannot create wal segment %s: %s", path,
		               kv_strerror(rv));
	}
	*fdp = fd;
	return KV_OK;
}

/*
 * Makes spare `id` segment DIR/wal-<first>.log: writes a recycled segment's
 * header over its first bytes and syncs it, then renames the file (never
 * over an existing one) and syncs the dir. Its older records stay after the
 * header until the writer overwrites them; replay ends a recycled segment at
 * the first record that is not its own. A crash before the rename leaves a
 * spare, which the next open removes. On failure the spare (or the new
 * segment) is removed and the caller creates a segment afresh. Returns the
 * descriptor in *fdp and the file's size in *size.
 */
static int
recycle_segment(const char *dir, uint64_t id, uint64_t first, int *fdp, uint64_t *size)
{
	char from[WAL_PATH_MAX], to[WAL_PATH_MAX];
	uint8_t h[KV_WAL_HEADER_SIZE];
	bool renamed = false;
	struct stat st;
	int fd, rv = KV_OK;

	spare_path(from, sizeof(from), dir, id);
	seg_path(to, sizeof(to), dir, first);
	encode_header(h, first, KV_WAL_VERSION_RECYCLED);
	if ((fd = open(from, O_WRONLY | O_CLOEXEC)) < 0)
		rv = kv_err_from_errno(errno);
	if (rv == KV_OK)
		rv = kv_pwrite_all(fd, h, sizeof(h), 0);
	if (rv == KV_OK && (fdatasync(fd) != 0 || fstat(fd, &st) != 0))
		rv = kv_err_from_errno(errno);
	if (rv == KV_OK && renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) != 0)
		rv = kv_err_from_errno(errno);
	renamed = rv == KV_OK;
	if (rv == KV_OK)
		rv = kv_fsync_dir(dir);
	if (rv != KV_OK) {
		if (fd >= 0)
			close(fd);
		unlink(renamed ? to : from);
		return rv;
	}
	*fdp = fd;
	*size = (uint64_t)st.st_size;
	return KV_OK;
}

/* Removes the spares of DIR (a previous process's; best effort, a spare
 * left is never read). */
static void
remove_spares(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[WAL_PATH_MAX];
	uint64_t id;
	size_t n = 0;

	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		if (!parse_hex_name(e->d_name, "spare-", ".wal", &id))
			continue;
		spare_path(path, sizeof(path), dir, id);
		if (unlink(path) == 0)
			n++;
		else
			KV_WARN("wal", "cannot remove a spare wal segment", "file=%s err=\"%s\"",
			        path, strerror(errno));
	}
	closedir(d);
	if (n > 0)
		kv_fsync_dir(dir);
}

/* Wakes the writer (signals `work`). mu held. */
static void
wake_writer_locked(kv_wal *w)
{
	w->kicked = true;
	pthread_cond_signal(&w->work);
}

static void
wait_until(pthread_cond_t *c, pthread_mutex_t *mu, uint64_t ns)
{
	struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
	                      .tv_nsec = (long)(ns % 1000000000ull)};
	pthread_cond_timedwait(c, mu, &ts);
}

/* ---------------------------------------------------------------- fsync mode */

int
kv_fsync_mode_parse(const char *s, kv_fsync_mode *out)
{
	if (s == NULL)
		return KV_EINVAL;
	if (strcmp(s, "always") == 0)
		*out = KV_FSYNC_ALWAYS;
	else if (strcmp(s, "batch") == 0)
		*out = KV_FSYNC_BATCH;
	else if (strcmp(s, "none") == 0)
		*out = KV_FSYNC_NONE;
	else
		return KV_EINVAL;
	return KV_OK;
}

const char *
kv_fsync_mode_name(kv_fsync_mode m)
{
	switch (m) {
	case KV_FSYNC_ALWAYS:
		return "always";
	case KV_FSYNC_BATCH:
		return "batch";
	case KV_FSYNC_NONE:
		return "none";
	}
	return "unknown";
}

/* ---------------------------------------------------------------- replay */

/* A read-ahead window over one file, so records are read with few preads
 * and the torn-tail scan can look at any offset. */
struct reader {
	int fd;
	uint64_t size; /* file size */
	uint8_t *buf;  /* window */
	size_t cap;    /* ... allocated */
	uint64_t boff; /* file offset of buf[0] */
	size_t blen;   /* bytes valid in buf */
};

/* Points *p at bytes [off, off + n) of the file (off + n <= size). */
static int
rd_get(struct reader *r, uint64_t off, size_t n, const uint8_t **p)
{
	size_t want, got = 0;

	if (off >= r->boff && off + n <= r->boff + r->blen) {
		*p = r->buf + (off - r->boff);
		return KV_OK;
	}
	want = n > WAL_READ_CHUNK ? n : WAL_READ_CHUNK;
	if (want > r->size - off)
		want = (size_t)(r->size - off);
	if (want > r->cap) {
		uint8_t *nb = realloc(r->buf, want);
		if (nb == NULL)
			return KV_ENOMEM;
		r->buf = nb;
		r->cap = want;
	}
	r->blen = 0;
	while (got < want) {
		ssize_t k = pread(r->fd, r->buf + got, want - got, (off_t)(off + got));
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return kv_err_from_errno(errno);
		if (k == 0)
			return KV_EIO; /* the file shrank under us */
		got += (size_t)k;
	}
	r->boff = off;
	r->blen = want;
	*p = r->buf;
	return KV_OK;
}

/* Checks the record at off. Returns 1 when it is intact (*len, *lsn set), 0
 * when not, or an error. */
static int
rec_intact(struct reader *r, uint64_t off, uint32_t *len, uint64_t *lsn)
{
	const uint8_t *p;
	uint32_t n;
	int rv;

	if (r->size - off < KV_WAL_RECORD_HEADER)
		return 0;
	if ((rv = rd_get(r, off, KV_WAL_RECORD_HEADER, &p)) != KV_OK)
		return rv;
	n = kv_get32(p + 8);
	if (n == 0 || n > KV_WAL_MAX_RECORD || kv_get32(p + 12) != 0 ||
	    (uint64_t)n > r->size - off - KV_WAL_RECORD_HEADER)
		return 0;
	*len = n;
	*lsn = kv_get64(p + 16);
	if ((rv = rd_get(r, off, KV_WAL_RECORD_HEADER + (size_t)n, &p)) != KV_OK)
		return rv;
	return kv_get64(p) == kv_frame_sum(p + 8, 16 + (size_t)n) ? 1 : 0;
}

/* Returns 1 when an intact record with a plausible lsn (>= expect) starts
 * anywhere after offset bad, 0 when none does, or an error. */
static int
intact_after(struct reader *r, uint64_t bad, uint64_t expect)
{
	uint64_t span = (r->size - bad) / KV_WAL_RECORD_HEADER + 1;

	for (uint64_t off = bad + 1; off + KV_WAL_RECORD_HEADER <= r->size; off++) {
		const uint8_t *p;
		uint64_t lsn;
		uint32_t len;
		int rv = rd_get(r, off, KV_WAL_RECORD_HEADER, &p);
		if (rv != KV_OK)
			return rv;
		/* cheap filters first: only plausible headers are hashed */
		if (kv_get32(p + 12) != 0 || kv_get32(p + 8) == 0)
			continue;
		lsn = kv_get64(p + 16);
		if (lsn < expect || lsn - expect > span)
			continue;
		if ((rv = rec_intact(r, off, &len, &lsn)) != 0)
			return rv;
	}
	return 0;
}

static bool
all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != 0)
			return false;
	return true;
}

/* Returns 1 when bytes [off, size) of the file are all zero, 0 when not, or
 * an error. */
static int
zeros_to_end(struct reader *r, uint64_t off)
{
	while (off < r->size) {
		uint64_t n = r->size - off < WAL_READ_CHUNK ? r->size - off : WAL_READ_CHUNK;
		const uint8_t *p;
		int rv = rd_get(r, off, (size_t)n, &p);
		if (rv != KV_OK)
			return rv;
		if (!all_zero(p, (size_t)n))
			return 0;
		off += n;
	}
	return 1;
}

/* Copies path into rep->file (cut to fit). */
static void
report_file(kv_wal_report *rep, const char *path)
{
	size_t n = strlen(path);

	if (n >= sizeof(rep->file))
		n = sizeof(rep->file) - 1;
	memcpy(rep->file, path, n);
	rep->file[n] = '\0';
}

/* State of one replay, for the cut and the messages. */
struct replay {
	const char *dir;
	const uint64_t *segs; /* first lsns, ascending */
	size_t nsegs;
	kv_wal_report *rep;
	char *err;
	size_t errlen;
	bool stop;       /* the log was cut, or to_lsn was read: read no further */
	bool ro;         /* kv_wal_read: never write, truncate or remove; no segment is the last */
	uint64_t to_lsn; /* kv_wal_read: the last record read (0: none) */
};

/*
 * Handles damage at (segment i, offset off): without truncate_corrupt a
 * KV_ECORRUPT naming both; with it, cuts the log there - truncates segment
 * i to off (removes it when off is 0) and removes every later segment - and
 * returns 0 with rp->stop set.
 */
static int
damage(struct replay *rp, bool cut, size_t i, uint64_t off, uint64_t fsize, const char *what)
{
	char path[WAL_PATH_MAX];
	kv_wal_report *rep = rp->rep;
	uint64_t dropped = 0;
	int rv = KV_OK;

	seg_path(path, sizeof(path), rp->dir, rp->segs[i]);
	report_file(rep, path);
	rep->offset = off;
	if (!cut)
		return kv_errf(rp->err, rp->errlen, KV_ECORRUPT,
		               "wal segment %s: %s at offset %llu", path, what,
		               (unsigned long long)off);
	if (off == 0) {
		if (unlink(path) != 0 && errno != ENOENT)
			rv = kv_err_from_errno(errno);
	} else {
		int fd = open(path, O_WRONLY | O_CLOEXEC);
		if (fd < 0 || ftruncate(fd, (off_t)off) != 0 || fsync(fd) != 0)
			rv = kv_err_from_errno(errno);
		if (fd >= 0)
			close(fd);
	}
	dropped += fsize - off;
	for (size_t j = i + 1; rv == KV_OK && j < rp->nsegs; j++) {
		struct stat st;
		seg_path(path, sizeof(path), rp->dir, rp->segs[j]);
		if (stat(path, &st) == 0)
			dropped += (uint64_t)st.st_size;
		if (unlink(path) != 0 && errno != ENOENT)
			rv = kv_err_from_errno(errno);
	}
	if (rv == KV_OK)
		rv = kv_fsync_dir(rp->dir);
	if (rv != KV_OK)
		return kv_errf(rp->err, rp->errlen, rv, "cannot cut wal at %s offset %llu: %s",
		               rep->file, (unsigned long long)off, kv_strerror(rv));
	rep->torn = true;
	rep->torn_bytes = dropped;
	kv_errf(rp->err, rp->errlen, KV_OK,
	        "wal segment %s: %s at offset %llu; cut the log there, dropping %llu bytes",
	        rep->file, what, (unsigned long long)off, (unsigned long long)dropped);
	KV_ERROR("wal", "cut corrupt wal", "file=%s offset=%llu dropped=%llu what=\"%s\"",
	         rep->file, (unsigned long long)off, (unsigned long long)dropped, what);
	rp->stop = true;
	return KV_OK;
}

/* Cuts the torn tail of the last segment at off (fd open for writing); of
 * a recycled segment, the older records after its own go with it. */
static int
cut_torn(struct replay *rp, int fd, const char *path, uint64_t off, uint64_t size, bool recycled)
{
	kv_wal_report *rep = rp->rep;

	if (ftruncate(fd, (off_t)off) != 0 || fsync(fd) != 0)
		return kv_errf(rp->err, rp->errlen, kv_err_from_errno(errno),
		               "cannot truncate torn tail of %s at offset %llu: %s", path,
		               (unsigned long long)off, strerror(errno));
	rep->torn = true;
	rep->torn_bytes = size - off;
	rep->offset = off;
	report_file(rep, path);
	KV_WARN("wal", "dropped torn tail of wal", "file=%s offset=%llu bytes=%llu recycled=%d",
	        path, (unsigned long long)off, (unsigned long long)(size - off), recycled);
	return KV_OK;
}

/*
 * Reads segment i. *expect is the lsn its first record must have (0: not
 * known, the header says) and becomes the lsn after its last record.
 * Returns 0 (with rp->stop set when the log was cut there) or an error.
 */
static int
replay_segment(struct replay *rp, size_t i, uint64_t from_lsn, bool cut, kv_wal_replay_cb cb,
               void *arg, uint64_t *expect)
{
	char path[WAL_PATH_MAX];
	bool last = !rp->ro && i + 1 == rp->nsegs, recycled;
	struct reader r = {.fd = -1};
	struct stat st;
	const uint8_t *h;
	uint64_t off;
	int rv;

	seg_path(path, sizeof(path), rp->dir, rp->segs[i]);
	r.fd = open(path, (rp->ro ? O_RDONLY : O_RDWR) | O_CLOEXEC);
	if (r.fd < 0 || fstat(r.fd, &st) != 0) {
		rv = kv_errf(rp->err, rp->errlen, kv_err_from_errno(errno),
		             "cannot open wal segment %s: %s", path, strerror(errno));
		goto out;
	}
	r.size = (uint64_t)st.st_size;
	if (r.size == KV_WAL_HEADER_SIZE && last) {
		/* a header that never reached the disk (some file systems
		 * show zeros after a crash): there is no record to lose */
		if ((rv = rd_get(&r, 0, KV_WAL_HEADER_SIZE, &h)) != KV_OK) {
			kv_errf(rp->err, rp->errlen, rv, "cannot read wal segment %s: %s", path,
			        kv_strerror(rv));
			goto out;
		}
		if (all_zero(h, KV_WAL_HEADER_SIZE))
			r.size = 0;
	}
	if (r.size < KV_WAL_HEADER_SIZE) {
		if (!last) {
			rv = damage(rp, cut, i, 0, r.size, "segment shorter than its header");
			goto out;
		}
		/* a crash while creating the newest segment */
		if (unlink(path) != 0) {
			rv =
			    kv_errf(rp->err, rp->errlen, kv_err_from_errno(errno),
			            "cannot remove torn wal segment %s: %s", path, strerror(errno));
			goto out;
		}
		if ((rv = kv_fsync_dir(rp->dir)) != KV_OK) {
			kv_errf(rp->err, rp->errlen, rv, "cannot fsync wal dir %s: %s", rp->dir,
			        kv_strerror(rv));
			goto out;
		}
		rp->rep->torn = true;
		rp->rep->torn_bytes = (uint64_t)st.st_size;
		rp->rep->offset = 0;
		report_file(rp->rep, path);
		KV_WARN("wal", "removed torn wal segment", "file=%s size=%llu", path,
		        (unsigned long long)st.st_size);
		if (*expect == 0)
			*expect = rp->segs[i];
		rv = KV_OK;
		goto out;
	}
	if ((rv = rd_get(&r, 0, KV_WAL_HEADER_SIZE, &h)) != KV_OK) {
		kv_errf(rp->err, rp->errlen, rv, "cannot read wal segment %s: %s", path,
		        kv_strerror(rv));
		goto out;
	}
	recycled = kv_frame_header_version(h) == KV_WAL_VERSION_RECYCLED;
	if (kv_frame_header_check(h, wal_magic, recycled ? KV_WAL_VERSION_RECYCLED : KV_WAL_VERSION,
	                          KV_WAL_HEADER_SIZE) != KV_FRAME_OK ||
	    kv_get64(h + 16) != rp->segs[i]) {
		rv = damage(rp, cut, i, 0, r.size, "bad segment header");
		goto out;
	}
	if (*expect != 0 && rp->segs[i] != *expect) {
		char what[128];
		snprintf(what, sizeof(what),
		         "log has a gap: segment starts at lsn %llu, expected %llu",
		         (unsigned long long)rp->segs[i], (unsigned long long)*expect);
		rv = damage(rp, cut, i, 0, r.size, what);
		goto out;
	}
	*expect = rp->segs[i];
	off = KV_WAL_HEADER_SIZE;
	while (off < r.size) {
		uint64_t lsn = 0;
		uint32_t len = 0;
		const uint8_t *p;

		rv = rec_intact(&r, off, &len, &lsn);
		if (rv < 0) {
			kv_errf(rp->err, rp->errlen, rv,
			        "cannot read wal segment %s at offset %llu: %s", path,
			        (unsigned long long)off, kv_strerror(rv));
			goto out;
		}
		if (rv == 0 || (recycled && lsn < rp->segs[i])) {
			/* not a record of this segment: the end of its records
			 * (zeros, a torn tail, a recycled segment's older
			 * records) or damage */
			int z = rv == 0 ? zeros_to_end(&r, off) : 0;
			if (z < 0) {
				rv =
				    kv_errf(rp->err, rp->errlen, z,
				            "cannot read wal segment %s: %s", path, kv_strerror(z));
				goto out;
			}
			if (z == 1) {
				/* the zeros the writer keeps ahead of its records
				 * (a crash left them): the end of the segment */
				if (last && ftruncate(r.fd, (off_t)off) != 0)
					KV_WARN("wal", "cannot cut zeros after the wal's end",
					        "file=%s offset=%llu err=\"%s\"", path,
					        (unsigned long long)off, strerror(errno));
				break;
			}
			if (recycled && !last) {
				/* older records follow this segment's own; the
				 * next segment must start where they end */
				if (i + 1 == rp->nsegs || *expect == rp->segs[i + 1])
					break;
				char what[160];
				snprintf(what, sizeof(what),
				         "recycled segment's records end before lsn %llu, the next "
				         "segment starts at %llu",
				         (unsigned long long)*expect,
				         (unsigned long long)rp->segs[i + 1]);
				rv = damage(rp, cut, i, off, r.size, what);
				goto out;
			}
			if (last) {
				int after = intact_after(&r, off, *expect);
				if (after < 0) {
					rv = kv_errf(rp->err, rp->errlen, after,
					             "cannot read wal segment %s: %s", path,
					             kv_strerror(after));
					goto out;
				}
				if (after == 0) {
					rv = cut_torn(rp, r.fd, path, off, r.size, recycled);
					goto out;
				}
			}
			if (rv == 0) {
				rv = damage(rp, cut, i, off, r.size,
				            "corrupt record (bad length or checksum)");
			} else {
				char what[160];
				snprintf(
				    what, sizeof(what),
				    "record of lsn %llu, older than its recycled segment, before "
				    "records of its own",
				    (unsigned long long)lsn);
				rv = damage(rp, cut, i, off, r.size, what);
			}
			goto out;
		}
		if (lsn != *expect) {
			char what[128];
			snprintf(what, sizeof(what), "record has lsn %llu, expected %llu",
			         (unsigned long long)lsn, (unsigned long long)*expect);
			rv = damage(rp, cut, i, off, r.size, what);
			goto out;
		}
		if (lsn >= from_lsn) {
			if ((rv = rd_get(&r, off + KV_WAL_RECORD_HEADER, len, &p)) != KV_OK) {
				kv_errf(rp->err, rp->errlen, rv, "cannot read wal segment %s: %s",
				        path, kv_strerror(rv));
				goto out;
			}
			if (cb != NULL && (rv = cb(arg, lsn, p, len)) != KV_OK) {
				kv_errf(rp->err, rp->errlen, rv,
				        "wal record lsn %llu (%s offset %llu) rejected: %s",
				        (unsigned long long)lsn, path, (unsigned long long)off,
				        kv_strerror(rv));
				goto out;
			}
			rp->rep->records++;
			rp->rep->bytes += len;
		}
		(*expect)++;
		off += KV_WAL_RECORD_HEADER + len;
		if (rp->to_lsn != 0 && lsn >= rp->to_lsn) {
			rp->stop = true;
			break;
		}
	}
	rv = KV_OK;
out:
	if (r.fd >= 0)
		close(r.fd);
	free(r.buf);
	return rv;
}

int
kv_wal_replay(const char *dir, uint64_t from_lsn, bool truncate_corrupt, kv_wal_replay_cb cb,
              void *arg, kv_wal_report *rep, char *err, size_t errlen)
{
	kv_wal_report dummy;
	struct replay rp;
	uint64_t *segs = NULL, expect = 0;
	size_t nsegs = 0, start;
	int rv;

	if (rep == NULL)
		rep = &dummy;
	memset(rep, 0, sizeof(*rep));
	rep->next_lsn = from_lsn;
	if (err && errlen)
		err[0] = '\0';
	if (dir == NULL || from_lsn == 0 || strlen(dir) + WAL_NAME_LEN + 2 > WAL_PATH_MAX)
		return kv_errf(err, errlen, KV_EINVAL, "bad wal replay arguments");
	if ((rv = list_segments(dir, &segs, &nsegs, err, errlen)) != KV_OK)
		return rv;
	if (nsegs == 0)
		return KV_OK;
	/* the last segment that starts at or below from_lsn; earlier ones hold
	 * only records below from_lsn and are not opened */
	start = nsegs;
	for (size_t i = 0; i < nsegs && segs[i] <= from_lsn; i++)
		start = i;
	if (start == nsegs) {
		uint64_t first = segs[0];
		seg_path(rep->file, sizeof(rep->file), dir, first);
		free(segs);
		return kv_errf(err, errlen, KV_ECORRUPT,
		               "wal in %s: log starts at %llu, need %llu (first segment %s)", dir,
		               (unsigned long long)first, (unsigned long long)from_lsn, rep->file);
	}
	rp = (struct replay){
	    .dir = dir, .segs = segs, .nsegs = nsegs, .rep = rep, .err = err, .errlen = errlen};
	for (size_t i = start; i < nsegs; i++) {
		rv = replay_segment(&rp, i, from_lsn, truncate_corrupt, cb, arg, &expect);
		if (rv != KV_OK || rp.stop)
			break;
	}
	free(segs);
	if (rv != KV_OK)
		return rv;
	rep->next_lsn = expect > from_lsn ? expect : from_lsn;
	return KV_OK;
}

int
kv_wal_read(const char *dir, uint64_t from_lsn, uint64_t to_lsn, kv_wal_replay_cb cb, void *arg,
            char *err, size_t errlen)
{
	kv_wal_report rep;
	struct replay rp;
	uint64_t *segs = NULL, expect = 0;
	size_t nsegs = 0, start;
	int rv = KV_OK;

	memset(&rep, 0, sizeof(rep));
	if (err && errlen)
		err[0] = '\0';
	if (dir == NULL || from_lsn == 0 || to_lsn < from_lsn ||
	    strlen(dir) + WAL_NAME_LEN + 2 > WAL_PATH_MAX)
		return kv_errf(err, errlen, KV_EINVAL, "bad wal read arguments");
	if ((rv = list_segments(dir, &segs, &nsegs, err, errlen)) != KV_OK)
		return rv;
	/* Segments starting after to_lsn (the live one among them) are never
	 * opened. */
	while (nsegs > 0 && segs[nsegs - 1] > to_lsn)
		nsegs--;
	start = nsegs;
	for (size_t i = 0; i < nsegs && segs[i] <= from_lsn; i++)
		start = i;
	if (start == nsegs) {
		free(segs);
		return kv_errf(err, errlen, KV_ECORRUPT, "wal in %s: no segment holds lsn %llu",
		               dir, (unsigned long long)from_lsn);
	}
	rp = (struct replay){.dir = dir,
	                     .segs = segs,
	                     .nsegs = nsegs,
	                     .rep = &rep,
	                     .err = err,
	                     .errlen = errlen,
	                     .ro = true,
	                     .to_lsn = to_lsn};
	for (size_t i = start; i < nsegs; i++) {
		rv = replay_segment(&rp, i, from_lsn, false, cb, arg, &expect);
		if (rv != KV_OK || rp.stop)
			break;
	}
	free(segs);
	if (rv == KV_OK && expect != to_lsn + 1)
		rv = kv_errf(err, errlen, KV_ECORRUPT, "wal in %s ends at lsn %llu, need %llu", dir,
		             (unsigned long long)(expect ? expect - 1 : 0),
		             (unsigned long long)to_lsn);
	return rv;
}

/* ---------------------------------------------------------------- buffers */

static void
chunk_free(struct chunk *c)
{
	free(c->data);
	memset(c, 0, sizeof(*c));
}

/* Makes c hold at least need bytes, growing by doubling. */
static int
chunk_reserve(struct chunk *c, size_t need)
{
	size_t cap = c->cap ? c->cap : WAL_CHUNK_MIN;
	uint8_t *p;

	if (need <= c->cap)
		return KV_OK;
	while (cap < need)
		cap *= 2;
	if ((p = realloc(c->data, cap)) == NULL)
		return KV_ENOMEM;
	c->data = p;
	c->cap = cap;
	return KV_OK;
}

/* Keeps an emptied buffer for reuse, or frees it. mu held. */
static void
pool_put_locked(kv_wal *w, struct chunk *c)
{
	if (c->data != NULL && w->npool < WAL_POOL_MAX && c->cap <= WAL_POOL_CAP) {
		c->len = 0;
		c->last_lsn = 0;
		c->hashed = 0;
		w->pool[w->npool++] = *c;
		memset(c, 0, sizeof(*c));
	} else {
		chunk_free(c);
	}
}

/* ---------------------------------------------------------------- notifications */

/* Adds to the min-heap on lsn. mu held. */
static int
notes_push_locked(kv_wal *w, uint64_t lsn, kv_wal_done_fn fn, void *arg)
{
	size_t i;

	if (w->nnotes == w->notes_cap) {
		size_t ncap = w->notes_cap ? 2 * w->notes_cap : 64;
		struct note *nn = realloc(w->notes, ncap * sizeof(*nn));
		if (nn == NULL)
			return KV_ENOMEM;
		w->notes = nn;
		w->notes_cap = ncap;
	}
	i = w->nnotes++;
	while (i > 0) {
		size_t parent = (i - 1) / 2;
		if (w->notes[parent].lsn <= lsn)
			break;
		w->notes[i] = w->notes[parent];
		i = parent;
	}
	w->notes[i] = (struct note){.lsn = lsn, .fn = fn, .arg = arg};
	return KV_OK;
}

/* Removes and returns the lowest lsn. mu held, heap not empty. */
static struct note
notes_pop_locked(kv_wal *w)
{
	struct note top = w->notes[0], last = w->notes[--w->nnotes];
	size_t i = 0, n = w->nnotes;

	if (n == 0)
		return top;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && w->notes[c + 1].lsn < w->notes[c].lsn)
			c++;
		if (w->notes[c].lsn >= last.lsn)
			break;
		w->notes[i] = w->notes[c];
		i = c;
	}
	w->notes[i] = last;
	return top;
}

/* Calls every notification with lsn <= durable with 0 and, when rest is
 * non-zero, every other one with rest - in lsn order, without the lock (it
 * is dropped and retaken per batch). mu held on entry and on return. */
static void
complete_locked(kv_wal *w, uint64_t durable, int rest)
{
	struct note fire[WAL_FIRE_BATCH];
	int status[WAL_FIRE_BATCH];

	for (;;) {
		size_t n = 0;
		while (n < WAL_FIRE_BATCH && w->nnotes > 0 &&
		       (rest != KV_OK || w->notes[0].lsn <= durable)) {
			status[n] = w->notes[0].lsn <= durable ? KV_OK : rest;
			fire[n++] = notes_pop_locked(w);
		}
		if (n == 0)
			return;
		pthread_mutex_unlock(&w->mu);
		for (size_t i = 0; i < n; i++)
			fire[i].fn(fire[i].arg, status[i]);
		pthread_mutex_lock(&w->mu);
	}
}

static uint64_t
durable_lsn(const kv_wal *w, uint64_t written, uint64_t synced)
{
	return w->mode == KV_FSYNC_ALWAYS ? synced : written;
}

/* ---------------------------------------------------------------- the writer */

/* Whether the written-but-unsynced bytes must be fsynced now, and at once
 * on the writer's thread. sync_req and closing are the caller's copies of
 * the mu fields. */
static bool
sync_forced(const kv_wal *w, uint64_t sync_req, bool closing)
{
	bool none = w->mode == KV_FSYNC_NONE;
	return w->mode == KV_FSYNC_ALWAYS || (w->switch_to != 0 && !none) ||
	       (closing && !(none && w->close_unsynced)) || sync_req > w->w_synced ||
	       w->nchunks == WAL_MAX_CHUNKS;
}

/* Whether the written-but-unsynced bytes must be fsynced now. sync_req,
 * closing and as_state are the caller's copies of the mu fields. BATCH's
 * periodic fsync already running on the syncer is not due again. */
static bool
sync_due(const kv_wal *w, uint64_t now, uint64_t sync_req, bool closing, int as_state)
{
	if (w->w_written <= w->w_synced)
		return false;
	if (sync_forced(w, sync_req, closing))
		return true;
	return w->mode == KV_FSYNC_BATCH && as_state == AS_IDLE &&
	       now >= w->last_sync + w->batch_ns;
}

/* Whether cur's records should be taken now: at once, but with NONE (and a
 * lazy BATCH log) only once the buffer is big or old enough, or someone
 * waits for it. mu held. */
static bool
cur_due(const kv_wal *w, uint64_t now)
{
	if (w->cur.len == 0)
		return false;
	if (w->round_writes && !w->cur_urgent)
		/* the end of the round that appended it writes it
		 * (round_end); the writer only once it waited too long, or for
		 * someone who waits */
		return w->cur.len >= WAL_LAZY_BYTES || now >= w->cur_since + WAL_ROUND_NS ||
		       w->waiters > 0 || w->closing || w->rot_pending ||
		       w->sync_req > w->written_lsn;
	return (w->mode != KV_FSYNC_NONE && !w->lazy) || w->cur.len >= WAL_LAZY_BYTES ||
	       now >= w->cur_since + WAL_LINGER_NS || w->nnotes > 0 || w->waiters > 0 ||
	       w->closing || w->rot_pending || w->sync_req > w->written_lsn;
}

/* Whether the writer has something to do. mu held. */
static bool
has_work_locked(const kv_wal *w, uint64_t now)
{
	if (w->switch_to != 0 || w->pend_written < w->pend_total)
		return true;
	if (w->nchunks < WAL_MAX_CHUNKS && ((w->rot_pending && !w->rot_taken) || cur_due(w, now)))
		return true;
	return w->as_state == AS_DONE || sync_due(w, now, w->sync_req, w->closing, w->as_state);
}

static void
push_chunk(kv_wal *w, struct chunk *c, uint64_t last_lsn)
{
	struct chunk *d = &w->chunks[w->nchunks++];

	*d = *c;
	d->last_lsn = last_lsn;
	d->hashed = 0;
	w->pend_total += d->len;
	w->seg_size += d->len;
	memset(c, 0, sizeof(*c));
}

/* Moves what the writer should write next from the shared buffers into its
 * pending chunks, or decides on a segment switch. mu held. */
static void
take_locked(kv_wal *w)
{
	if (w->switch_to != 0 || w->nchunks == WAL_MAX_CHUNKS)
		return; /* finish the switch first; or make room with an fsync */
	if (w->rot_pending && !w->rot_taken) {
		if (w->rot.len > 0)
			push_chunk(w, &w->rot, w->rot_req - 1);
		else
			chunk_free(&w->rot);
		w->switch_to = w->rot_req;
		w->rot_taken = true;
		w->unwritten = w->pend_total - w->pend_written;
		return;
	}
	if (w->cur.len == 0)
		return;
	if (w->seg_size >= w->segment_bytes && w->seg_size > KV_WAL_HEADER_SIZE) {
		w->switch_to = w->next_lsn - w->cur_records;
		return;
	}
	struct chunk *last = w->nchunks > 0 ? &w->chunks[w->nchunks - 1] : NULL;
	if (last != NULL && w->cur.len <= WAL_MERGE_MAX && last->cap - last->len >= w->cur.len &&
	    (w->as_state == AS_IDLE || w->nchunks > w->as_chunks)) {
		/* Small rounds (one a request) would fill the chunk list in
		 * a few ms and force a sync on the writer: copy the records
		 * behind the last chunk's instead (not into a chunk a sync in
		 * flight will recycle), and keep cur's buffer. */
		memcpy(last->data + last->len, w->cur.data, w->cur.len);
		last->len += w->cur.len;
		last->last_lsn = w->next_lsn - 1;
		w->pend_total += w->cur.len;
		w->seg_size += w->cur.len;
		w->cur.len = 0;
	} else {
		push_chunk(w, &w->cur, w->next_lsn - 1);
		if (w->npool > 0)
			w->cur = w->pool[--w->npool];
	}
	w->cur_records = 0;
	w->cur_urgent = false;
	w->unwritten = w->pend_total - w->pend_written;
}

/* Fills in the record checksums of newly taken chunks. */
static void
hash_chunks(kv_wal *w)
{
	for (int i = 0; i < w->nchunks; i++) {
		struct chunk *c = &w->chunks[i];
		for (size_t off = c->hashed; off < c->len;) {
			uint8_t *p = c->data + off;
			size_t n = kv_get32(p + 8);
			kv_put64(p, kv_frame_sum(p + 8, 16 + n));
			off += KV_WAL_RECORD_HEADER + n;
		}
		c->hashed = c->len;
	}
}

/* Writes the first `limit` bytes described by iov at off. */
static int
pwritev_all(int fd, struct iovec *iov, int n, uint64_t off, uint64_t limit)
{
	uint64_t acc = 0;
	int m = 0, i = 0;

	for (; m < n && acc < limit; m++) {
		if (iov[m].iov_len > limit - acc)
			iov[m].iov_len = (size_t)(limit - acc);
		acc += iov[m].iov_len;
	}
	n = m;
	while (i < n) {
		ssize_t r = pwritev(fd, iov + i, n - i, (off_t)off); /* n <= 64 < IOV_MAX */
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return kv_err_from_errno(errno);
		}
		if (r == 0)
			return KV_EIO;
		off += (uint64_t)r;
		while (r > 0 && i < n) {
			if ((size_t)r >= iov[i].iov_len) {
				r -= (ssize_t)iov[i].iov_len;
				i++;
			} else {
				iov[i].iov_base = (uint8_t *)iov[i].iov_base + r;
				iov[i].iov_len -= (size_t)r;
				r = 0;
			}
		}
		while (i < n && iov[i].iov_len == 0)
			i++;
	}
	return KV_OK;
}

/*
 * ALWAYS: before a write that would grow the file to `end`, writes
 * zeros from there to the next WAL_ZERO_AHEAD boundary past end, plus
 * WAL_ZERO_AHEAD. An fdatasync after a write that grows the file also
 * commits the file system's journal (the size, the new blocks); after one
 * inside the file only the data and a cache flush: here about half the
 * time, and the fsync is what a durable write waits for. The zeros cost a
 * second write of the log's bytes, and one sync in a megabyte's worth
 * carries the growth. Replay reads zeros after the last record as the end
 * of the segment. Best effort: a failed fill (a full disk, a file size
 * limit) is cut off again and the writer appends until the next segment.
 */
static void
zero_ahead(kv_wal *w, uint64_t end)
{
	static uint8_t zeros[WAL_ZERO_PIECE];
	struct iovec iov[2 * WAL_ZERO_AHEAD / WAL_ZERO_PIECE + 1];
	uint64_t to, off;
	int n = 0, rv;

	if (w->mode != KV_FSYNC_ALWAYS || w->no_zeros || end <= w->file_end)
		return;
	to = (end / WAL_ZERO_AHEAD + 2) * WAL_ZERO_AHEAD;
	for (off = end; off < to; n++) {
		size_t k = WAL_ZERO_PIECE - (size_t)(off % WAL_ZERO_PIECE);
		iov[n] = (struct iovec){.iov_base = zeros, .iov_len = k};
		off += k;
	}
	if ((rv = pwritev_all(w->fd, iov, n, end, to - end)) != KV_OK) {
		if (ftruncate(w->fd, (off_t)w->file_end) != 0) {
			/* zeros past the records are the end of a segment */
		}
		w->no_zeros = true;
		KV_WARN("wal", "cannot write zeros ahead of the wal, appending", "dir=%s err=%s",
		        w->dir, kv_errname(rv));
		return;
	}
	w->file_end = to;
}

/* Cuts the zeros after the segment's last written record. */
static void
cut_zeros(kv_wal *w)
{
	uint64_t good = w->pend_off + w->pend_written;

	if (w->fd >= 0 && w->file_end > good && ftruncate(w->fd, (off_t)good) == 0)
		w->file_end = good;
}

/* Removes the spares: on a full disk their space serves better free. mu
 * not held. */
static void
release_spares(kv_wal *w)
{
	uint64_t ids[WAL_SPARES_MAX];
	char path[WAL_PATH_MAX];
	int n;

	pthread_mutex_lock(&w->mu);
	n = w->nspares;
	memcpy(ids, w->spares, sizeof(ids[0]) * (size_t)n);
	w->nspares = 0;
	pthread_mutex_unlock(&w->mu);
	for (int i = 0; i < n; i++) {
		spare_path(path, sizeof(path), w->dir, ids[i]);
		unlink(path);
	}
	if (n > 0)
		KV_WARN("wal", "removed the spare wal segments: the disk is full",
		        "dir=%s count=%d", w->dir, n);
}

/* Writes the unwritten pending bytes at the segment's good end. On failure
 * cuts the file back to that end, so a retry starts clean (and, on a full
 * disk, removes the spares). */
static int
write_pending(kv_wal *w, int fault)
{
	struct iovec iov[WAL_MAX_CHUNKS];
	uint64_t skip = w->pend_written, left = w->pend_total - w->pend_written;
	uint64_t good = w->pend_off + w->pend_written;
	int n = 0, rv;

	for (int i = 0; i < w->nchunks; i++) {
		struct chunk *c = &w->chunks[i];
		if (skip >= c->len) {
			skip -= c->len;
			continue;
		}
		iov[n].iov_base = c->data + skip;
		iov[n].iov_len = c->len - (size_t)skip;
		n++;
		skip = 0;
	}
	if (fault == KV_OK)
		zero_ahead(w, good + left);
	rv = pwritev_all(w->fd, iov, n, good, fault != KV_OK ? left / 2 : left);
	if (rv == KV_OK && fault != KV_OK)
		rv = fault;
	if (rv != KV_OK) {
		if (ftruncate(w->fd, (off_t)good) == 0)
			w->file_end = good;
		/* else the retry overwrites from `good` anyway */
		if (rv == KV_ENOSPC)
			release_spares(w);
		return rv;
	}
	if (good + left > w->file_end)
		w->file_end = good + left;
	w->pend_written = w->pend_total;
	w->w_written = w->chunks[w->nchunks - 1].last_lsn;
	w->n_writes++;
	return KV_OK;
}

/* fdatasync calls of every log of the process (kv_wal_test_fsyncs): a
 * log's own count dies with it at close. */
static atomic_uint_fast64_t all_fsyncs;

static int
sync_file(kv_wal *w, int fault)
{
	if (fault != KV_OK)
		return fault;
	if (fdatasync(w->fd) != 0)
		return kv_err_from_errno(errno);
	w->n_fsyncs++;
	atomic_fetch_add(&all_fsyncs, 1);
	return KV_OK;
}

/* Recycles the first k pending chunks, which are safe now (written and
 * synced by the syncer while the writer went on). */
static void
drop_chunk_prefix(kv_wal *w, int k)
{
	uint64_t bytes = 0;

	pthread_mutex_lock(&w->mu);
	for (int i = 0; i < k; i++) {
		bytes += w->chunks[i].len;
		pool_put_locked(w, &w->chunks[i]);
	}
	pthread_mutex_unlock(&w->mu);
	memmove(&w->chunks[0], &w->chunks[k], (size_t)(w->nchunks - k) * sizeof(w->chunks[0]));
	memset(&w->chunks[w->nchunks - k], 0, (size_t)k * sizeof(w->chunks[0]));
	w->nchunks -= k;
	w->pend_off += bytes;
	w->pend_total -= bytes;
	w->pend_written -= bytes;
}

/* Takes the result of the syncer's fsync, waiting for it when wait is set
 * (or when nothing else may go on: a switch, close, a forced sync). A
 * failed fsync leaves every unsynced byte to rewrite. Writer thread. */
static int
async_collect(kv_wal *w, bool wait)
{
	pthread_mutex_lock(&w->mu);
	if (w->as_state == AS_IDLE) {
		pthread_mutex_unlock(&w->mu);
		return KV_OK;
	}
	while (wait && w->as_state != AS_DONE)
		pthread_cond_wait(&w->work, &w->mu);
	if (w->as_state != AS_DONE) {
		pthread_mutex_unlock(&w->mu);
		return KV_OK;
	}
	int rv = w->as_rv, k = w->as_chunks;
	uint64_t lsn = w->as_lsn;
	w->as_state = AS_IDLE;
	pthread_mutex_unlock(&w->mu);
	if (rv != KV_OK) {
		/* the kernel may have dropped the dirty pages */
		w->pend_written = 0;
		return rv;
	}
	w->n_fsyncs++;
	if (lsn > w->w_synced)
		w->w_synced = lsn;
	drop_chunk_prefix(w, k);
	return KV_OK;
}

/* Hands BATCH's periodic fsync of everything written to the syncer, so
 * that the records appended meanwhile are written without waiting for it
 * (a slow fdatasync, under another process's or a snapshot's writeback,
 * would otherwise hold up every reply behind it). Writer thread; every
 * pending chunk is written. */
static void
async_post(kv_wal *w, int fault)
{
	pthread_mutex_lock(&w->mu);
	w->as_state = AS_POSTED;
	w->as_fault = fault;
	w->as_lsn = w->w_written;
	w->as_chunks = w->nchunks;
	pthread_cond_signal(&w->as_cv);
	pthread_mutex_unlock(&w->mu);
	w->last_sync = kv_now_ns();
}

static void *
syncer_main(void *arg)
{
	kv_wal *w = arg;

	kv_log_thread_name("kv-wal-sync");
	pthread_mutex_lock(&w->mu);
	for (;;) {
		while (w->as_state != AS_POSTED && !w->as_stop)
			pthread_cond_wait(&w->as_cv, &w->mu);
		if (w->as_state != AS_POSTED)
			break;
		w->as_state = AS_RUNNING;
		while (w->as_hold && !w->as_stop) {
			w->as_held = true;
			pthread_cond_wait(&w->as_cv, &w->mu);
		}
		w->as_held = false;
		int fd = w->fd, fault = w->as_fault;
		pthread_mutex_unlock(&w->mu);
		int rv = fault != KV_OK       ? fault
		         : fdatasync(fd) != 0 ? kv_err_from_errno(errno)
		                              : KV_OK;
		pthread_mutex_lock(&w->mu);
		w->as_rv = rv;
		w->as_state = AS_DONE;
		wake_writer_locked(w);
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

/* Recycles the pending chunks, which are safe now. */
static void
drop_chunks(kv_wal *w)
{
	pthread_mutex_lock(&w->mu);
	for (int i = 0; i < w->nchunks; i++)
		pool_put_locked(w, &w->chunks[i]);
	pthread_mutex_unlock(&w->mu);
	w->pend_off += w->pend_total;
	w->pend_total = 0;
	w->pend_written = 0;
	w->nchunks = 0;
}

/* Starts the segment at switch_to; the old one is written and (but with
 * NONE) synced. */
static int
switch_segment(kv_wal *w, int fault)
{
	uint64_t spare = 0, size = KV_WAL_HEADER_SIZE;
	bool reused = false;
	char err[256];
	int fd, rv;

	if (fault != KV_OK)
		return fault;
	pthread_mutex_lock(&w->mu);
	if (w->nspares > 0)
		spare = w->spares[--w->nspares];
	pthread_mutex_unlock(&w->mu);
	if (spare != 0) {
		rv = recycle_segment(w->dir, spare, w->switch_to, &fd, &size);
		reused = rv == KV_OK;
		if (!reused)
			KV_WARN("wal", "cannot reuse a dropped wal segment, creating one",
			        "dir=%s err=%s", w->dir, kv_errname(rv));
	}
	if (!reused &&
	    (rv = create_segment(w->dir, w->switch_to, &fd, err, sizeof(err))) != KV_OK) {
		KV_ERROR("wal", "cannot start wal segment", "err=\"%s\"", err);
		return rv;
	}
	cut_zeros(w);
	close(w->fd);
	w->fd = fd;
	w->w_seg_first = w->switch_to;
	w->pend_off = KV_WAL_HEADER_SIZE;
	w->seg_size = KV_WAL_HEADER_SIZE;
	w->file_end = size;
	w->no_zeros = false;
	w->switch_to = 0;
	pthread_mutex_lock(&w->mu);
	w->st_segments++;
	w->st_reused += reused;
	pthread_mutex_unlock(&w->mu);
	KV_DEBUG("wal", "started wal segment", "dir=%s first_lsn=%llu recycled=%d", w->dir,
	         (unsigned long long)w->w_seg_first, reused);
	return KV_OK;
}

/* Publishes the writer's positions (and with set_health its health) and
 * wakes the waiters. mu held. */
static void
publish_locked(kv_wal *w, bool set_health, int rv)
{
	w->written_lsn = w->w_written;
	w->synced_lsn = w->w_synced;
	atomic_store_explicit(&w->durable_pub, durable_lsn(w, w->written_lsn, w->synced_lsn),
	                      memory_order_release);
	w->unwritten = w->pend_total - w->pend_written;
	w->seg_first = w->w_seg_first;
	w->st_writes = w->n_writes;
	w->st_fsyncs = w->n_fsyncs;
	if (w->rot_taken && w->w_seg_first >= w->rot_req) {
		w->rot_pending = false;
		w->rot_taken = false;
	}
	if (set_health && rv == KV_OK && w->health != KV_OK) {
		KV_INFO("wal", "wal writes recovered", "dir=%s", w->dir);
		w->health = KV_OK;
		atomic_store_explicit(&w->health_pub, KV_OK, memory_order_release);
		w->backoff = 0;
	} else if (set_health && rv != KV_OK) {
		if (w->health == KV_OK)
			KV_ERROR("wal", "wal write failed, retrying", "dir=%s err=%s", w->dir,
			         kv_errname(rv));
		w->health = rv;
		atomic_store_explicit(&w->health_pub, rv, memory_order_release);
		w->backoff = w->backoff == 0                  ? WAL_RETRY_MIN
		             : w->backoff * 2 > WAL_RETRY_MAX ? WAL_RETRY_MAX
		                                              : w->backoff * 2;
		w->retry_at = kv_now_ns() + w->backoff;
	}
	pthread_cond_broadcast(&w->progress);
}

/* One round outside the lock: write, fsync by the policy, switch segments.
 * sync_req and closing are copies of the mu fields. */
static int
writer_round(kv_wal *w, int fault, uint64_t sync_req, bool closing)
{
	bool wrote = false;
	int rv;

	if ((rv = async_collect(w, false)) != KV_OK)
		return rv;
	hash_chunks(w);
	if (w->pend_written < w->pend_total) {
		if ((rv = write_pending(w, fault)) != KV_OK)
			return rv;
		wrote = true;
		if (w->mode == KV_FSYNC_NONE)
			drop_chunks(w);
	}
	if (sync_due(w, kv_now_ns(), sync_req, closing, AS_IDLE)) {
		if (wrote && w->mode != KV_FSYNC_ALWAYS) {
			/* the write is what BATCH and NONE promise: complete
			 * before the fsync, not after it */
			pthread_mutex_lock(&w->mu);
			publish_locked(w, false, KV_OK);
			complete_locked(w, w->w_written, KV_OK);
			pthread_mutex_unlock(&w->mu);
		}
		if (w->has_syncer && !sync_forced(w, sync_req, closing)) {
			/* BATCH's periodic fsync: on the syncer, one at a time */
			pthread_mutex_lock(&w->mu);
			bool idle = w->as_state == AS_IDLE;
			pthread_mutex_unlock(&w->mu);
			if (idle && w->pend_written == w->pend_total)
				async_post(w, fault);
			return KV_OK;
		}
		/* At once, here: the syncer's fsync (if any) first. */
		if ((rv = async_collect(w, true)) != KV_OK)
			return rv;
		if (w->w_written <= w->w_synced)
			goto synced;
		if ((rv = sync_file(w, fault)) != KV_OK) {
			/* the kernel may have dropped the dirty pages: rewrite
			 * every unsynced byte we still hold */
			if (w->mode != KV_FSYNC_NONE)
				w->pend_written = 0;
			return rv;
		}
		w->w_synced = w->w_written;
		w->last_sync = kv_now_ns();
	synced:
		if (w->mode != KV_FSYNC_NONE)
			drop_chunks(w);
	}
	if (w->switch_to != 0 && w->nchunks == 0 &&
	    (w->w_written == w->w_synced || w->mode == KV_FSYNC_NONE))
		return switch_segment(w, fault);
	return KV_OK;
}

/*
 * round_writes (BATCH): the end of a round (common/defer.h: an event
 * loop's, a backup's Replicate) in which this thread appended
 * (kv_wal_appendv_tap left this to it instead of waking the writer), or a
 * thread about to wait for its records. Writes what is appended, here, and
 * completes the notifications the write covers: their answers then go out
 * with the round's others, and neither the writer's wake-up nor a hand-off
 * back to the loop is paid (one pwritev per round of the loop, as Redis
 * writes its AOF once per turn of its loop). Everything else stays the
 * writer's - the periodic sync, a segment switch, a rotation, a failure
 * and its retries, a full chunk list - and it is woken for them: for the
 * sync, once when it sleeps without a deadline while written bytes are
 * not synced.
 */
void
kv_wal_write_here(kv_wal *w)
{
	bool wrote = false;
	int rv = KV_OK;

	if (w == NULL || !w->round_writes)
		return;
	pthread_mutex_lock(&w->mu);
	if (!w->round_busy && !w->closing && w->health == KV_OK && w->fault == KV_OK &&
	    w->as_state != AS_DONE && w->switch_to == 0 && !w->rot_pending &&
	    w->pend_written == w->pend_total && w->cur.len > 0) {
		take_locked(w);
		if (w->switch_to == 0 && w->pend_written < w->pend_total) {
			w->round_busy = true;
			pthread_mutex_unlock(&w->mu);
			hash_chunks(w);
			rv = write_pending(w, KV_OK);
			pthread_mutex_lock(&w->mu);
			publish_locked(w, true, rv);
			w->round_busy = false;
			wrote = true;
		}
	}
	if (!wrote && w->cur.len > 0)
		w->cur_urgent = true; /* the writer's, then */
	/* the writer fields only while no other round owns them (a second
	 * loop's round_end: it looks when it ends) */
	if (w->sleeping && (w->held || w->closing ||
	                    (!w->round_busy && (has_work_locked(w, kv_now_ns()) ||
	                                        (!w->timed && w->w_written > w->w_synced)))))
		wake_writer_locked(w);
	if (wrote)
		complete_locked(w, durable_lsn(w, w->w_written, w->w_synced), rv);
	pthread_mutex_unlock(&w->mu);
}

static void
round_end(void *arg)
{
	kv_wal_write_here(arg);
}

static void *
writer_main(void *arg)
{
	kv_wal *w = arg;
	uint64_t close_by = 0;

	kv_log_thread_name("kv-wal-writer");
	if (w->bulk)
		(void)kv_thread_slice(KV_BULK_SLICE_US);
	pthread_mutex_lock(&w->mu);
	for (;;) {
		uint64_t now = kv_now_ns(), sync_req;
		bool closing;
		int fault, rv;

		if (w->closing && close_by == 0)
			close_by = now + WAL_CLOSE_WAIT;
		if (w->round_busy) {
			/* a loop's round_end writes; it wakes us when done */
			w->sleeping = w->held = true;
			w->timed = w->kicked = false;
			pthread_cond_wait(&w->work, &w->mu);
			w->sleeping = w->held = w->kicked = false;
			continue;
		}
		if (w->health != KV_OK) {
			if (w->closing && now >= close_by)
				break; /* give up on a failed disk */
			if (now < w->retry_at) {
				uint64_t until = w->retry_at;
				if (w->closing && close_by < until)
					until = close_by;
				wait_until(&w->work, &w->mu, until);
				continue;
			}
		} else if (!has_work_locked(w, now)) {
			if (w->closing)
				break;
			w->sleeping = true;
			w->timed = w->kicked = false;
			if (w->as_state == AS_POSTED || w->as_state == AS_RUNNING) {
				/* the syncer signals `work` when it is done */
				pthread_cond_wait(&w->work, &w->mu);
			} else if (w->mode == KV_FSYNC_BATCH && w->w_written > w->w_synced) {
				uint64_t until = w->last_sync + w->batch_ns;
				uint64_t cur_by =
				    w->cur_since + (w->lazy ? WAL_LINGER_NS : WAL_ROUND_NS);
				if (w->cur.len > 0 && cur_by < until)
					until = cur_by; /* cur_due */
				w->timed = true;
				w->lingering = w->lazy; /* appends wake it when cur is full */
				wait_until(&w->work, &w->mu, until);
				w->lingering = false;
			} else if (w->cur.len > 0 && w->nchunks < WAL_MAX_CHUNKS) {
				/* NONE, lazy: let cur fill; round_writes: let a
				 * round's end write it (cur_due) */
				w->lingering = true;
				w->timed = true;
				wait_until(&w->work, &w->mu,
				           w->cur_since +
				               (w->round_writes ? WAL_ROUND_NS : WAL_LINGER_NS));
				w->lingering = false;
			} else {
				pthread_cond_wait(&w->work, &w->mu);
			}
			w->sleeping = w->kicked = false;
			continue;
		}
		take_locked(w);
		fault = w->fault;
		sync_req = w->sync_req;
		closing = w->closing;
		w->round_busy = true;
		pthread_mutex_unlock(&w->mu);

		rv = writer_round(w, fault, sync_req, closing);

		pthread_mutex_lock(&w->mu);
		publish_locked(w, true, rv);
		w->round_busy = false;
		complete_locked(w, durable_lsn(w, w->w_written, w->w_synced), rv);
	}
	if (w->health != KV_OK || w->cur.len + w->rot.len + w->pend_total > 0)
		KV_ERROR("wal", "closing wal with unwritten records", "dir=%s err=%s bytes=%llu",
		         w->dir, kv_errname(w->health),
		         (unsigned long long)(w->cur.len + w->rot.len + w->pend_total -
		                              w->pend_written));
	w->stopped = true;
	pthread_cond_broadcast(&w->progress);
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

/* ---------------------------------------------------------------- API */

/* Stops and joins the syncer, if it runs. */
static void
stop_syncer(kv_wal *w)
{
	if (!w->has_syncer)
		return;
	pthread_mutex_lock(&w->mu);
	w->as_stop = true;
	pthread_cond_signal(&w->as_cv);
	pthread_mutex_unlock(&w->mu);
	pthread_join(w->syncer, NULL);
	w->has_syncer = false;
}

int
kv_wal_open(const kv_wal_opts *o, uint64_t next_lsn, kv_wal **out, char *err, size_t errlen)
{
	pthread_condattr_t ca;
	struct stat st;
	uint64_t *segs = NULL;
	size_t nsegs = 0;
	kv_wal *w;
	int rv, rc;

	if (o == NULL || o->dir == NULL || o->dir[0] == '\0' || out == NULL || next_lsn == 0 ||
	    (o->mode != KV_FSYNC_ALWAYS && o->mode != KV_FSYNC_BATCH && o->mode != KV_FSYNC_NONE) ||
	    strlen(o->dir) + WAL_SPARE_LEN + 2 > WAL_PATH_MAX)
		return kv_errf(err, errlen, KV_EINVAL, "bad wal options");
	if (stat(o->dir, &st) != 0) {
		if (errno != ENOENT || mkdir(o->dir, 0755) != 0)
			return kv_errf(err, errlen, kv_err_from_errno(errno),
			               "cannot create wal dir %s: %s", o->dir, strerror(errno));
		kv_fsync_parent(o->dir);
	} else if (!S_ISDIR(st.st_mode)) {
		return kv_errf(err, errlen, KV_EINVAL, "wal dir %s is not a directory", o->dir);
	}
	remove_spares(o->dir);
	if ((rv = list_segments(o->dir, &segs, &nsegs, err, errlen)) != KV_OK)
		return rv;
	for (size_t i = 0; i < nsegs; i++) {
		if (segs[i] > next_lsn) {
			char path[WAL_PATH_MAX];
			seg_path(path, sizeof(path), o->dir, segs[i]);
			free(segs);
			return kv_errf(err, errlen, KV_EEXISTS,
			               "wal segment %s lies beyond the next lsn %llu", path,
			               (unsigned long long)next_lsn);
		}
	}
	/* What recovery read counts as synced from here on (synced_lsn below,
	 * and the replica positions that name it), but a killed process's last
	 * segment may still be in the page cache only: fsync the segments
	 * (those the writer closed are clean, and cost nothing). */
	for (size_t i = 0; i < nsegs; i++) {
		char path[WAL_PATH_MAX];
		int fd;
		seg_path(path, sizeof(path), o->dir, segs[i]);
		if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 || fsync(fd) != 0) {
			rv = kv_errf(err, errlen, kv_err_from_errno(errno),
			             "cannot fsync wal segment %s: %s", path, strerror(errno));
			if (fd >= 0)
				close(fd);
			free(segs);
			return rv;
		}
		close(fd);
	}
	free(segs);

	if ((w = calloc(1, sizeof(*w))) == NULL || (w->dir = strdup(o->dir)) == NULL) {
		free(w);
		return KV_ENOMEM;
	}
	w->mode = o->mode;
	w->batch_ns = (uint64_t)(o->batch_ms ? o->batch_ms : WAL_DEF_BATCH) * 1000000ull;
	w->segment_bytes = o->segment_bytes ? o->segment_bytes : WAL_DEF_SEGMENT;
	w->buffer_bytes = o->buffer_bytes ? o->buffer_bytes : WAL_DEF_BUFFER;
	w->close_unsynced = o->close_unsynced;
	w->bulk = o->bulk;
	w->lazy = o->lazy && o->mode == KV_FSYNC_BATCH;
	w->spares_max = o->mode == KV_FSYNC_NONE || o->no_spares ? 0 : WAL_SPARES_MAX;
	w->round_writes = o->round_writes && o->mode == KV_FSYNC_BATCH;
	pthread_mutex_init(&w->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&w->work, &ca);
	pthread_cond_init(&w->progress, &ca);
	pthread_cond_init(&w->as_cv, &ca);
	pthread_condattr_destroy(&ca);
	w->fd = -1;
	if ((rv = create_segment(w->dir, next_lsn, &w->fd, err, errlen)) != KV_OK)
		goto err;
	w->next_lsn = next_lsn;
	w->seg_first = w->w_seg_first = next_lsn;
	w->written_lsn = w->synced_lsn = w->w_written = w->w_synced = next_lsn - 1;
	atomic_store(&w->durable_pub, next_lsn - 1);
	w->pend_off = w->seg_size = w->file_end = KV_WAL_HEADER_SIZE;
	w->st_segments = 1;
	w->last_sync = kv_now_ns();
	if (w->mode == KV_FSYNC_BATCH) {
		if ((rc = pthread_create(&w->syncer, NULL, syncer_main, w)) != 0) {
			rv = kv_errf(err, errlen, kv_err_from_errno(rc),
			             "cannot start wal syncer: %s", strerror(rc));
			goto err;
		}
		w->has_syncer = true;
	}
	if ((rc = pthread_create(&w->thread, NULL, writer_main, w)) != 0) {
		rv = kv_errf(err, errlen, kv_err_from_errno(rc), "cannot start wal writer: %s",
		             strerror(rc));
		goto err;
	}
	KV_INFO("wal", "opened wal", "dir=%s next_lsn=%llu fsync=%s", w->dir,
	        (unsigned long long)next_lsn, kv_fsync_mode_name(w->mode));
	*out = w;
	return KV_OK;
err:
	stop_syncer(w);
	if (w->fd >= 0)
		close(w->fd);
	pthread_cond_destroy(&w->work);
	pthread_cond_destroy(&w->progress);
	pthread_cond_destroy(&w->as_cv);
	pthread_mutex_destroy(&w->mu);
	free(w->dir);
	free(w);
	return rv;
}

int
kv_wal_appendv(kv_wal *w, const struct iovec *iov, int n, uint64_t *lsn)
{
	return kv_wal_appendv_tap(w, iov, n, lsn, NULL, NULL);
}

/* Waits (w->mu held) until the buffer may take `bytes` more, and makes
 * room for them in cur. Returns 0, KV_ECLOSED or KV_ENOMEM (w->mu held
 * still). */
static int
reserve_locked(kv_wal *w, size_t bytes)
{
	for (;;) {
		if (w->closing)
			return KV_ECLOSED;
		if (w->health != KV_OK || w->cur.len + w->rot.len + w->unwritten < w->buffer_bytes)
			break;
		if (w->sleeping) /* a round's appends left it asleep (round_end) */
			wake_writer_locked(w);
		pthread_cond_wait(&w->progress, &w->mu);
	}
	if (w->cur.data == NULL && w->npool > 0)
		w->cur = w->pool[--w->npool];
	return chunk_reserve(&w->cur, w->cur.len + bytes);
}

/* Writes the header of the next record (payload `len` bytes) at the end of
 * cur, whose room reserve_locked made, and numbers it; returns where its
 * payload goes. w->mu held. */
static uint8_t *
record_locked(kv_wal *w, size_t len)
{
	uint8_t *p = w->cur.data + w->cur.len;

	kv_put64(p, 0); /* the writer fills in the checksum */
	kv_put32(p + 8, (uint32_t)len);
	kv_put32(p + 12, 0);
	kv_put64(p + 16, w->next_lsn);
	if (w->cur.len == 0)
		w->cur_since = kv_now_ns();
	w->cur.len += KV_WAL_RECORD_HEADER + len;
	w->cur_records++;
	w->next_lsn++;
	w->st_records++;
	w->st_bytes += len;
	return p + KV_WAL_RECORD_HEADER;
}

/* After appends (w->mu held): whose the write of cur is now, and whether
 * the writer must wake for it. */
static void
appended_locked(kv_wal *w)
{
	/* A writer at work looks again before it sleeps; one waiting for cur
	 * to fill needs no wake-up until it is full. With round_writes an
	 * append in an event loop's round leaves the write to the round's
	 * end (round_end) while cur is small, and the writer leaves cur to it
	 * (cur_due); any other append makes cur the writer's (cur_urgent). */
	bool left = w->round_writes && w->cur.len < WAL_LAZY_BYTES && kv_defer(round_end, w);
	if (w->round_writes && !left)
		w->cur_urgent = true;
	if (w->sleeping && !left &&
	    (!w->lingering || w->cur.len >= WAL_LAZY_BYTES || w->cur_urgent))
		wake_writer_locked(w);
}

int
kv_wal_appendv_tap(kv_wal *w, const struct iovec *iov, int n, uint64_t *lsn, kv_dur_tap_fn tap,
                   void *arg)
{
	size_t total = 0;
	uint8_t *p;
	int rv;

	if (w == NULL || lsn == NULL || n <= 0 || iov == NULL)
		return KV_EINVAL;
	for (int i = 0; i < n; i++) {
		if (iov[i].iov_len > KV_WAL_MAX_RECORD - total ||
		    (iov[i].iov_len > 0 && iov[i].iov_base == NULL))
			return KV_EINVAL;
		total += iov[i].iov_len;
	}
	if (total == 0)
		return KV_EINVAL;

	pthread_mutex_lock(&w->mu);
	if ((rv = reserve_locked(w, KV_WAL_RECORD_HEADER + total)) != KV_OK) {
		pthread_mutex_unlock(&w->mu);
		return rv;
	}
	*lsn = w->next_lsn;
	p = record_locked(w, total);
	for (int i = 0; i < n; i++) {
		if (iov[i].iov_len > 0)
			memcpy(p, iov[i].iov_base, iov[i].iov_len);
		p += iov[i].iov_len;
	}
	if (tap != NULL)
		tap(arg, *lsn, p - total, total);
	appended_locked(w);
	pthread_mutex_unlock(&w->mu);
	return KV_OK;
}

int
kv_wal_append_many(kv_wal *w, const struct iovec *recs, int n, uint64_t *first_lsn)
{
	size_t bytes = 0;
	int rv;

	if (w == NULL || first_lsn == NULL || n <= 0 || recs == NULL)
		return KV_EINVAL;
	for (int i = 0; i < n; i++) {
		if (recs[i].iov_len == 0 || recs[i].iov_len > KV_WAL_MAX_RECORD ||
		    recs[i].iov_base == NULL)
			return KV_EINVAL;
		bytes += KV_WAL_RECORD_HEADER + recs[i].iov_len;
	}

	pthread_mutex_lock(&w->mu);
	if ((rv = reserve_locked(w, bytes)) != KV_OK) {
		pthread_mutex_unlock(&w->mu);
		return rv;
	}
	*first_lsn = w->next_lsn;
	for (int i = 0; i < n; i++)
		memcpy(record_locked(w, recs[i].iov_len), recs[i].iov_base, recs[i].iov_len);
	appended_locked(w);
	pthread_mutex_unlock(&w->mu);
	return KV_OK;
}

int
kv_wal_health(kv_wal *w)
{
	/* Every write asks (the server refuses writes while the log fails):
	 * an atomic, not the mutex the log writer and appenders share. */
	return atomic_load_explicit(&w->health_pub, memory_order_acquire);
}

int
kv_wal_notify(kv_wal *w, uint64_t lsn, kv_wal_done_fn done, void *arg)
{
	int rv = KV_OK, status = KV_OK;

	if (w == NULL || done == NULL)
		return KV_EINVAL;
	pthread_mutex_lock(&w->mu);
	if (lsn == 0 || lsn >= w->next_lsn)
		rv = KV_EINVAL;
	else if (w->closing)
		rv = KV_ECLOSED;
	else if (lsn <= durable_lsn(w, w->written_lsn, w->synced_lsn))
		status = KV_OK;
	else if (w->health != KV_OK)
		status = w->health;
	else {
		rv = notes_push_locked(w, lsn, done, arg);
		if (rv == KV_OK && w->lingering && !w->round_writes)
			wake_writer_locked(w); /* cur is due now (cur_due) */
		pthread_mutex_unlock(&w->mu);
		return rv;
	}
	pthread_mutex_unlock(&w->mu);
	if (rv == KV_OK)
		done(arg, status);
	return rv;
}

int
kv_wal_wait(kv_wal *w, uint64_t lsn, bool sync)
{
	int rv;

	pthread_mutex_lock(&w->mu);
	if (lsn >= w->next_lsn) {
		pthread_mutex_unlock(&w->mu);
		return KV_EINVAL;
	}
	w->waiters++;
	if (w->sleeping)
		wake_writer_locked(w); /* cur is due now (cur_due, round_end) */
	for (;;) {
		if ((sync ? w->synced_lsn : w->written_lsn) >= lsn) {
			rv = KV_OK;
			break;
		}
		if (w->health != KV_OK) {
			rv = w->health;
			break;
		}
		if (w->stopped) {
			rv = KV_ECLOSED;
			break;
		}
		if (sync && w->sync_req < lsn) {
			w->sync_req = lsn;
			wake_writer_locked(w);
		}
		pthread_cond_wait(&w->progress, &w->mu);
	}
	w->waiters--;
	pthread_mutex_unlock(&w->mu);
	return rv;
}

int
kv_wal_rotate_start(kv_wal *w, uint64_t *first_lsn)
{
	uint64_t target = 0;
	int rv = KV_OK;

	pthread_mutex_lock(&w->mu);
	while (!w->closing && w->rot_pending && w->health == KV_OK)
		pthread_cond_wait(&w->progress, &w->mu);
	if (w->closing) {
		rv = KV_ECLOSED;
	} else if (w->rot_pending) {
		rv = w->health;
	} else if (w->next_lsn == w->seg_first) {
		target = w->next_lsn; /* the open segment holds no record yet */
	} else {
		/* records before the rotation point go to the old segment:
		 * hand them to the writer separately from later appends */
		target = w->next_lsn;
		w->rot = w->cur;
		memset(&w->cur, 0, sizeof(w->cur));
		w->cur_records = 0;
		w->rot_req = target;
		w->rot_pending = true;
		w->rot_taken = false;
		wake_writer_locked(w);
	}
	pthread_mutex_unlock(&w->mu);
	if (rv == KV_OK && first_lsn != NULL)
		*first_lsn = target;
	return rv;
}

int
kv_wal_rotate_wait(kv_wal *w, uint64_t first_lsn)
{
	int rv;

	pthread_mutex_lock(&w->mu);
	while (w->seg_first < first_lsn && w->health == KV_OK && !w->stopped)
		pthread_cond_wait(&w->progress, &w->mu);
	rv = w->seg_first >= first_lsn ? KV_OK : w->health != KV_OK ? w->health : KV_ECLOSED;
	pthread_mutex_unlock(&w->mu);
	return rv;
}

int
kv_wal_rotate(kv_wal *w, uint64_t *first_lsn)
{
	uint64_t target = 0;
	int rv = kv_wal_rotate_start(w, &target);

	if (rv == KV_OK)
		rv = kv_wal_rotate_wait(w, target);
	if (rv == KV_OK && first_lsn != NULL)
		*first_lsn = target;
	return rv;
}

/*
 * Keeps the dropped segment at path (first lsn first) as a spare for a
 * later switch, unless the log keeps no spares (NONE, whose segments are
 * never synced: a removed file's unwritten pages are dropped, a kept
 * one's would be written back; no_spares) or holds spares_max. Returns
 * whether it handled the segment (kept it, or removed it when another
 * drop filled the spares meanwhile); false leaves it to the caller.
 */
static bool
keep_spare(kv_wal *w, const char *path, uint64_t first)
{
	char sp[WAL_PATH_MAX];
	bool room, kept = false;

	if (w->spares_max == 0)
		return false;
	pthread_mutex_lock(&w->mu);
	room = w->nspares < w->spares_max;
	pthread_mutex_unlock(&w->mu);
	spare_path(sp, sizeof(sp), w->dir, first);
	if (!room || rename(path, sp) != 0)
		return false;
	pthread_mutex_lock(&w->mu);
	if (w->nspares < w->spares_max) {
		w->spares[w->nspares++] = first;
		kept = true;
	}
	pthread_mutex_unlock(&w->mu);
	if (!kept)
		unlink(sp);
	return true;
}

int
kv_wal_drop_before(kv_wal *w, uint64_t lsn)
{
	uint64_t *segs = NULL, open_first;
	size_t nsegs = 0, removed = 0;
	char path[WAL_PATH_MAX], err[256];
	int rv;

	if ((rv = list_segments(w->dir, &segs, &nsegs, err, sizeof(err))) != KV_OK)
		return rv;
	pthread_mutex_lock(&w->mu);
	open_first = w->seg_first;
	pthread_mutex_unlock(&w->mu);
	for (size_t i = 0; i + 1 < nsegs; i++) {
		if (segs[i] >= open_first || segs[i + 1] > lsn)
			break;
		seg_path(path, sizeof(path), w->dir, segs[i]);
		if (keep_spare(w, path, segs[i])) {
			removed++;
			continue;
		}
		if (unlink(path) != 0 && errno != ENOENT) {
			rv = kv_err_from_errno(errno);
			KV_ERROR("wal", "cannot remove wal segment", "file=%s err=%s", path,
			         strerror(errno));
			break;
		}
		removed++;
	}
	free(segs);
	if (removed > 0) {
		int frv = kv_fsync_dir(w->dir);
		if (rv == KV_OK)
			rv = frv;
		KV_DEBUG("wal", "dropped wal segments", "dir=%s count=%zu before_lsn=%llu", w->dir,
		         removed, (unsigned long long)lsn);
	}
	return rv;
}

void
kv_wal_stats_get(kv_wal *w, kv_wal_stats *st)
{
	pthread_mutex_lock(&w->mu);
	st->records = w->st_records;
	st->bytes = w->st_bytes;
	st->writes = w->st_writes;
	st->fsyncs = w->st_fsyncs;
	st->segments = w->st_segments;
	st->reused = w->st_reused;
	st->next_lsn = w->next_lsn;
	st->written_lsn = w->written_lsn;
	st->synced_lsn = w->synced_lsn;
	st->health = w->health;
	pthread_mutex_unlock(&w->mu);
}

void
kv_wal_close(kv_wal *w)
{
	if (w == NULL)
		return;
	pthread_mutex_lock(&w->mu);
	w->closing = true;
	wake_writer_locked(w);
	pthread_cond_broadcast(&w->progress);
	pthread_mutex_unlock(&w->mu);
	pthread_join(w->thread, NULL);
	stop_syncer(w); /* its fsync in flight, if any, ends first */

	pthread_mutex_lock(&w->mu);
	complete_locked(w, durable_lsn(w, w->written_lsn, w->synced_lsn), KV_ECLOSED);
	pthread_mutex_unlock(&w->mu);
	cut_zeros(w);
	if (w->fd >= 0)
		close(w->fd);
	for (int i = 0; i < w->nchunks; i++)
		chunk_free(&w->chunks[i]);
	for (int i = 0; i < w->npool; i++)
		chunk_free(&w->pool[i]);
	chunk_free(&w->cur);
	chunk_free(&w->rot);
	free(w->notes);
	pthread_cond_destroy(&w->work);
	pthread_cond_destroy(&w->progress);
	pthread_cond_destroy(&w->as_cv);
	pthread_mutex_destroy(&w->mu);
	free(w->dir);
	free(w);
}

void
kv_wal_test_fail_writes(kv_wal *w, int err)
{
	pthread_mutex_lock(&w->mu);
	w->fault = err > 0 ? kv_err_from_errno(err) : err;
	if (err == 0)
		w->retry_at = 0;
	wake_writer_locked(w);
	pthread_mutex_unlock(&w->mu);
}

void
kv_wal_test_hold_syncs(kv_wal *w, bool hold)
{
	pthread_mutex_lock(&w->mu);
	w->as_hold = hold;
	pthread_cond_broadcast(&w->as_cv);
	pthread_mutex_unlock(&w->mu);
}

uint64_t
kv_wal_test_fsyncs(void)
{
	return atomic_load(&all_fsyncs);
}

bool
kv_wal_test_writer_sleeps(kv_wal *w)
{
	pthread_mutex_lock(&w->mu);
	bool sleeps = w->sleeping && !w->kicked && !w->held && !w->round_busy;
	pthread_mutex_unlock(&w->mu);
	return sleeps;
}

bool
kv_wal_test_syncs_held(kv_wal *w)
{
	pthread_mutex_lock(&w->mu);
	bool held = w->as_held;
	pthread_mutex_unlock(&w->mu);
	return held;
}

uint64_t
kv_wal_durable_lsn(kv_wal *w)
{
	return atomic_load_explicit(&w->durable_pub, memory_order_acquire);
}
