/*
 * durable.c - the server's log records, recovery and background snapshots
 * (durable.h).
 *
 * Record payload (little-endian), inside a wal.h record:
 *   u8 type (REC_*), u8 flags (bit 0: dedup fields follow; bit 1: DEL,
 *      DEDUP and MDEL end with the value a delete returned; bit 2: a
 *      deadline follows)
 *   [u64 client, u64 request, u64 value_len, u64 time_ms]   when flagged
 *   [u64 expire_at, Unix ms]                 when flagged (PUT, MPUT only)
 *   PUT:       u32 klen, key, u32 vlen, value; the key's deadline becomes
 *              expire_at, or none without the flag (records written before
 *              expiry existed read the same way)
 *   DEL:       u32 klen, key [, u32 dlen, deleted value]
 *   MPUT:      u32 n, n x (u32 klen, key, u32 vlen, value); deadline as PUT
 *   MDEL:      u32 alen, anchor key (the key of the dedup entry), u32 n,
 *              n x (u32 klen, key) [, u32 dlen, value]: a delrange step
 *              (or a reclaim), the keys are gone; the value is the step's
 *              resume cursor
 *   RANGE_DEL: u32 slen, start, u32 elen, end (empty end: no bound); the
 *              range's keys and exactly-once entries are gone
 *   DEDUP:     i32 status, u32 klen, key [, u32 dlen, deleted value]
 *              (the dedup fields are flagged)
 *   ADOPT:     u32 nlen, name: the side log side-<n> (a directory of the
 *              data dir) is replayed here, whole; only in the server's own
 *              log, never inside a side log nor from a peer
 *
 * Snapshot entries (snap.h): type SNAP_KV is a key and its value; type
 * SNAP_KVX a key with a deadline: u64 expire_at, then the value; type
 * SNAP_DEDUP is the write's key and the 36 bytes {client, request,
 * value_len, time_ms, status}, followed, for a delete whose value is
 * remembered, by one byte 1 and that value; type SNAP_FLOOR is a client's
 * exactly-once floor: the key is the client id (8 bytes, big-endian), the
 * value {floor, time_ms} (16 bytes). A server older than SNAP_FLOOR refuses
 * a snapshot that holds one as corrupt.
 *
 * The snapshot thread wakes every 200 ms and writes a snapshot when the log
 * has grown by the threshold since the last one: it cuts the log at a new
 * segment under the barrier (write side, a few microseconds; the writer
 * syncs the old segment and opens the new one after), walks the
 * store in steps of SNAP_STEP entries (one partition lock per step, copied
 * out and written with no store lock held), adds the exactly-once memory
 * (one part at a time, likewise copied out under the part's lock and
 * written after), commits the file, and drops the log segments it
 * covers. Service goes on throughout; a write that lands behind the walk is in the log after the
 * snapshot's lsn and is replayed.
 *
 * Invariant: per key, the log holds the writes in the order the store
 * applied them (the key's stripe is held around apply+log), so replaying the
 * log from a snapshot's lsn leaves every key as its last record made it.
 *
 * What this module does not do: decide what a request means or whether this
 * server owns a key (the server applies a write, then calls kv_dur_log_*),
 * answer clients, or call into the server. It uses the store and the
 * exactly-once memory (dedup.h) only to load them at recovery and to copy
 * them into snapshots.
 */
#include "shardserver/durable/durable.h"
#include "common/bytes.h"
#include "common/err.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/slice.h"
#include "shardserver/durable/snap.h"
#include "shardserver/durable/wal.h"
#include "shardserver/store/store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define COMP "durable"

enum {
	REC_PUT = 1,
	REC_DEL = 2,
	REC_MPUT = 3,
	REC_RANGE_DEL = 4,
	REC_DEDUP = 5,
	REC_MDEL = 6,
	REC_ADOPT = 7
};
enum { SNAP_KV = 0, SNAP_DEDUP = 1, SNAP_KVX = 2, SNAP_FLOOR = 3 };

#define REC_F_DEDUP  0x01u
#define REC_F_DELVAL 0x02u            /* DEL, DEDUP, MDEL: the deleted value ends the record */
#define REC_F_EXPIRY 0x04u            /* PUT, MPUT: u64 expire_at after the dedup fields */
#define HDR_MAX      (2 + 32 + 8 + 4) /* type, flags, dedup, deadline, first length */
#define SNAP_STEP    512u             /* entries copied per store step */
#define SNAP_MIN     (256u * 1024u * 1024u) /* default snapshot threshold */
#define DEDUP_VAL    36u
#define SIDE_PREFIX  "side-"
#define SIDE_NAME    22u /* "side-", 16 hex digits and the NUL */
#define SIDE_SYNC_MS 50u /* a side log's own fdatasync period */
#define SIDE_SEGMENT (1024ull * 1024u * 1024u)
#define SIDE_BUFFER  (16u * 1024u * 1024u)

/* The background snapshot's walk sleeps this long between two holds of a
 * partition (kv_store_thread_walk_pause), as the heartbeat's counts do: a
 * snapshot that a large move's side log set off right after its commit
 * otherwise ran flat out beside the requests (bench/README.md). */
#define SNAP_WALK_PAUSE_US 50u

/* An adopted side log still on disk: needed until a snapshot whose lsn is
 * past its ADOPT record is in place. */
typedef struct {
	char name[SIDE_NAME];
	uint64_t lsn; /* its ADOPT record */
} side_ref;

/* A set of side logs by name. */
typedef struct {
	side_ref *v;
	size_t n, cap;
} side_list;

/* Sets name's ADOPT lsn, adding it when absent. Returns 0 or KV_ENOMEM. */
static int
side_list_put(side_list *l, const char *name, uint64_t lsn)
{
	for (size_t i = 0; i < l->n; i++)
		if (strcmp(l->v[i].name, name) == 0) {
			l->v[i].lsn = lsn;
			return KV_OK;
		}
	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 8;
		side_ref *a = realloc(l->v, cap * sizeof(*a));
		if (a == NULL)
			return KV_ENOMEM;
		l->v = a;
		l->cap = cap;
	}
	snprintf(l->v[l->n].name, SIDE_NAME, "%s", name);
	l->v[l->n++].lsn = lsn;
	return KV_OK;
}

struct kv_dur_side {
	kv_dur *d;                 /* the server's durable state */
	kv_wal *w;                 /* the side log */
	char name[SIDE_NAME];      /* its directory in the data dir */
	atomic_uint_fast64_t last; /* last lsn appended to it */
	uint64_t bytes;            /* payload bytes appended */
	bool adopted;              /* ADOPT was appended (it may be on disk) */
	uint64_t adopt_lsn;        /* ... at this lsn of the server's log */
};

struct kv_dur {
	kv_dur_opts o;                 /* options; o.dir points at dir */
	char *dir;                     /* owned copy of the data dir */
	kv_wal *wal;                   /* the log */
	atomic_uint_fast64_t last_lsn; /* last lsn appended */

	pthread_rwlock_t barrier;               /* read: an apply+log section; write: rotate */
	pthread_mutex_t stripe[KV_DUR_STRIPES]; /* per-key write order */

	pthread_t thr;         /* snapshot thread */
	bool thr_started;      /* whether thr runs */
	pthread_mutex_t mu;    /* protects stop, stats below and wakes the thread */
	pthread_cond_t cv;     /* signalled on stop */
	bool stop;             /* the thread returns */
	uint64_t snap_log_at;  /* log bytes written when the last snapshot began */
	uint64_t last_snap_sz; /* payload bytes of the last snapshot */
	kv_dur_stats st;       /* snapshot statistics (st.wal is filled on read) */
	side_list sides;       /* adopted side logs on disk (under mu) */
	uint64_t side_bytes;   /* bytes of side logs closed since the last snapshot began (mu) */
	atomic_uint_fast64_t side_seq; /* the next side log's number */
	pthread_mutex_t snap_mu;       /* one snapshot at a time */
};

/* ------------------------------------------------------------------------
 * Stripes and the barrier
 * ------------------------------------------------------------------------ */

static uint16_t
stripe_of(const void *key, size_t klen)
{
	return (uint16_t)(kv_hash64(key, klen) & (KV_DUR_STRIPES - 1));
}

static int
u16_cmp(const void *a, const void *b)
{
	uint16_t x = *(const uint16_t *)a, y = *(const uint16_t *)b;
	return (x > y) - (x < y);
}

void
kv_dur_begin(kv_dur *d)
{
	pthread_rwlock_rdlock(&d->barrier);
}

void
kv_dur_begin_exclusive(kv_dur *d)
{
	pthread_rwlock_wrlock(&d->barrier);
}

void
kv_dur_end(kv_dur *d)
{
	pthread_rwlock_unlock(&d->barrier);
}

void
kv_dur_lock_key(kv_dur *d, const void *key, size_t klen, kv_dur_held *h)
{
	h->idx = h->inl;
	h->n = 1;
	h->inl[0] = stripe_of(key, klen);
	pthread_mutex_lock(&d->stripe[h->inl[0]]);
}

int
kv_dur_lock_keys(kv_dur *d, const kv_bytes *keys, size_t n, kv_dur_held *h)
{
	size_t k = 0;

	h->idx = h->inl;
	h->n = 0;
	if (n > sizeof(h->inl) / sizeof(h->inl[0])) {
		h->idx = malloc(n * sizeof(*h->idx));
		if (h->idx == NULL)
			return KV_ENOMEM;
	}
	for (size_t i = 0; i < n; i++)
		h->idx[i] = stripe_of(keys[i].p, keys[i].len);
	qsort(h->idx, n, sizeof(*h->idx), u16_cmp);
	for (size_t i = 0; i < n; i++)
		if (k == 0 || h->idx[k - 1] != h->idx[i])
			h->idx[k++] = h->idx[i];
	h->n = k;
	for (size_t i = 0; i < k; i++)
		pthread_mutex_lock(&d->stripe[h->idx[i]]);
	return KV_OK;
}

void
kv_dur_unlock(kv_dur *d, kv_dur_held *h)
{
	for (size_t i = h->n; i > 0; i--)
		pthread_mutex_unlock(&d->stripe[h->idx[i - 1]]);
	if (h->idx != h->inl)
		free(h->idx);
	h->idx = h->inl;
	h->n = 0;
}

/* ------------------------------------------------------------------------
 * Records
 * ------------------------------------------------------------------------ */

/* Writes type, flags and the dedup fields into hdr; returns the length. */
static size_t
rec_head_x(uint8_t *hdr, uint8_t type, const kv_dur_dedup *dd, uint64_t at)
{
	size_t n = 0;
	hdr[n++] = type;
	hdr[n++] = (uint8_t)((dd ? REC_F_DEDUP : 0) |
	                     (dd && dd->has_del_value &&
	                              (type == REC_DEL || type == REC_DEDUP || type == REC_MDEL)
	                          ? REC_F_DELVAL
	                          : 0) |
	                     (at != 0 ? REC_F_EXPIRY : 0));
	if (dd) {
		kv_put64(hdr + n, dd->client);
		kv_put64(hdr + n + 8, dd->req);
		kv_put64(hdr + n + 16, dd->value_len);
		kv_put64(hdr + n + 24, dd->time_ms);
		n += 32;
	}
	if (at != 0) {
		kv_put64(hdr + n, at);
		n += 8;
	}
	return n;
}

static size_t
rec_head(uint8_t *hdr, uint8_t type, const kv_dur_dedup *dd)
{
	return rec_head_x(hdr, type, dd, 0);
}

/* *last is the log's highest appended lsn: appends are ordered by the
 * log's mutex, but their callers come here in any order; keep the highest. */
static void
raise_last(atomic_uint_fast64_t *last, uint64_t l)
{
	uint64_t cur = atomic_load(last);
	while (cur < l && !atomic_compare_exchange_weak(last, &cur, l))
		;
}

/* Appends to log w, whose last appended lsn is *last. */
static int
append_w(kv_wal *w, atomic_uint_fast64_t *last, struct iovec *iov, int n, uint64_t *lsn,
         const kv_dur_tap *tap)
{
	uint64_t l = 0;
	int rv = kv_wal_appendv_tap(w, iov, n, &l, tap ? tap->fn : NULL, tap ? tap->arg : NULL);
	if (rv != 0)
		return rv;
	raise_last(last, l);
	if (lsn)
		*lsn = l;
	return KV_OK;
}

static int
append(kv_dur *d, struct iovec *iov, int n, uint64_t *lsn, const kv_dur_tap *tap)
{
	return append_w(d->wal, &d->last_lsn, iov, n, lsn, tap);
}

/* n records, one iov each, with one append; *first the first's lsn. */
static int
append_many(kv_dur *d, const struct iovec *recs, int n, uint64_t *first)
{
	int rv = kv_wal_append_many(d->wal, recs, n, first);
	if (rv == 0)
		raise_last(&d->last_lsn, *first + (uint64_t)n - 1);
	return rv;
}

/* The pieces of a PUT record (hdr: HDR_MAX bytes, vl: 4); returns their count. */
static int
put_iov(struct iovec *iov, uint8_t *hdr, uint8_t *vl, const void *key, size_t klen, const void *val,
        size_t vlen, const kv_dur_dedup *dd, uint64_t at)
{
	size_t h = rec_head_x(hdr, REC_PUT, dd, at);

	kv_put32(hdr + h, (uint32_t)klen);
	kv_put32(vl, (uint32_t)vlen);
	iov[0] = (struct iovec){hdr, h + 4};
	iov[1] = (struct iovec){(void *)key, klen};
	iov[2] = (struct iovec){vl, 4};
	iov[3] = (struct iovec){(void *)val, vlen};
	return 4;
}

/* The pieces of a RANGE_DEL record (hdr: HDR_MAX bytes, el: 4). */
static int
range_del_iov(struct iovec *iov, uint8_t *hdr, uint8_t *el, const void *start, size_t slen,
              const void *end, size_t elen)
{
	size_t h = rec_head(hdr, REC_RANGE_DEL, NULL);

	kv_put32(hdr + h, (uint32_t)slen);
	kv_put32(el, (uint32_t)elen);
	iov[0] = (struct iovec){hdr, h + 4};
	iov[1] = (struct iovec){(void *)start, slen};
	iov[2] = (struct iovec){el, 4};
	iov[3] = (struct iovec){(void *)end, elen};
	return 4;
}

/* The pieces of a DEDUP record (hdr: HDR_MAX + 4 bytes, dl: 4). */
static int
dedup_iov(struct iovec *iov, uint8_t *hdr, uint8_t *dl, const kv_dur_dedup *dd, int status,
          const void *key, size_t klen)
{
	size_t h = rec_head(hdr, REC_DEDUP, dd);
	bool dv = dd && dd->has_del_value;

	kv_put32(hdr + h, (uint32_t)status);
	kv_put32(hdr + h + 4, (uint32_t)klen);
	kv_put32(dl, dv ? (uint32_t)dd->del_value.len : 0);
	iov[0] = (struct iovec){hdr, h + 8};
	iov[1] = (struct iovec){(void *)key, klen};
	iov[2] = (struct iovec){dl, 4};
	iov[3] = (struct iovec){dv ? (void *)dd->del_value.p : NULL, dv ? dd->del_value.len : 0};
	return dv ? 4 : 2;
}

/* Appends the pieces to out, as one record payload. */
static int
flatten(kv_buf *out, const struct iovec *iov, int n)
{
	for (int i = 0; i < n; i++)
		if (iov[i].iov_len && kv_buf_append(out, iov[i].iov_base, iov[i].iov_len) != 0)
			return KV_ENOMEM;
	return KV_OK;
}

int
kv_dur_log_put(kv_dur *d, const void *key, size_t klen, const void *val, size_t vlen,
               const kv_dur_dedup *dd, uint64_t *lsn, const kv_dur_tap *tap)
{
	return kv_dur_log_put_x(d, key, klen, val, vlen, 0, dd, lsn, tap);
}

int
kv_dur_log_put_x(kv_dur *d, const void *key, size_t klen, const void *val, size_t vlen,
                 uint64_t expire_at, const kv_dur_dedup *dd, uint64_t *lsn, const kv_dur_tap *tap)
{
	uint8_t hdr[HDR_MAX], vl[4];
	struct iovec iov[4];
	int n = put_iov(iov, hdr, vl, key, klen, val, vlen, dd, expire_at);

	return append(d, iov, n, lsn, tap);
}

int
kv_dur_rec_put(kv_buf *out, const void *key, size_t klen, const void *val, size_t vlen)
{
	return kv_dur_rec_put_x(out, key, klen, val, vlen, 0);
}

int
kv_dur_rec_put_x(kv_buf *out, const void *key, size_t klen, const void *val, size_t vlen,
                 uint64_t expire_at)
{
	uint8_t hdr[HDR_MAX], vl[4];
	struct iovec iov[4];

	return flatten(out, iov, put_iov(iov, hdr, vl, key, klen, val, vlen, NULL, expire_at));
}

int
kv_dur_rec_range_del(kv_buf *out, const void *start, size_t slen, const void *end, size_t elen)
{
	uint8_t hdr[HDR_MAX], el[4];
	struct iovec iov[4];

	return flatten(out, iov, range_del_iov(iov, hdr, el, start, slen, end, elen));
}

int
kv_dur_rec_dedup(kv_buf *out, const kv_dur_dedup *dd, int status, const void *key, size_t klen)
{
	uint8_t hdr[HDR_MAX + 4], dl[4];
	struct iovec iov[4];

	return flatten(out, iov, dedup_iov(iov, hdr, dl, dd, status, key, klen));
}

int
kv_dur_rec_floor(kv_buf *out, uint64_t client, uint64_t floor, uint64_t time_ms)
{
	kv_dur_dedup dd = {.client = client, .req = floor, .time_ms = time_ms};

	return kv_dur_rec_dedup(out, &dd, KV_DUR_DEDUP_FLOOR, NULL, 0);
}

/* The pieces of a DEL record (hdr: HDR_MAX bytes, dl: 4); returns their count. */
static int
del_iov(struct iovec *iov, uint8_t *hdr, uint8_t *dl, const void *key, size_t klen,
        const kv_dur_dedup *dd)
{
	size_t h = rec_head(hdr, REC_DEL, dd);
	bool dv = dd && dd->has_del_value;

	kv_put32(hdr + h, (uint32_t)klen);
	kv_put32(dl, dv ? (uint32_t)dd->del_value.len : 0);
	iov[0] = (struct iovec){hdr, h + 4};
	iov[1] = (struct iovec){(void *)key, klen};
	iov[2] = (struct iovec){dl, 4};
	iov[3] = (struct iovec){dv ? (void *)dd->del_value.p : NULL, dv ? dd->del_value.len : 0};
	return dv ? 4 : 2;
}

int
kv_dur_log_del(kv_dur *d, const void *key, size_t klen, const kv_dur_dedup *dd, uint64_t *lsn,
               const kv_dur_tap *tap)
{
	uint8_t hdr[HDR_MAX], dl[4];
	struct iovec iov[4];

	return append(d, iov, del_iov(iov, hdr, dl, key, klen, dd), lsn, tap);
}

int
kv_dur_log_mput(kv_dur *d, size_t n, const kv_bytes *keys, const kv_bytes *vals,
                const kv_dur_dedup *dd, uint64_t *lsn, const kv_dur_tap *tap)
{
	return kv_dur_log_mput_x(d, n, keys, vals, 0, dd, lsn, tap);
}

int
kv_dur_log_mdel(kv_dur *d, kv_bytes anchor, size_t n, const kv_bytes *keys, const kv_dur_dedup *dd,
                uint64_t *lsn, const kv_dur_tap *tap)
{
	uint8_t hdr[HDR_MAX], tail[8], dl[4];
	size_t h = rec_head(hdr, REC_MDEL, dd);
	bool dv = dd && dd->has_del_value;
	struct iovec *iov;
	uint8_t *lens;
	int rv, k = 0;

	if (n > (size_t)INT32_MAX / 4 - 8)
		return KV_EINVAL;
	iov = malloc((2 * n + 6) * sizeof(*iov));
	lens = malloc(4 * n + 1);
	if (iov == NULL || lens == NULL) {
		free(iov);
		free(lens);
		return KV_ENOMEM;
	}
	kv_put32(hdr + h, (uint32_t)anchor.len);
	kv_put32(tail, (uint32_t)n);
	iov[k++] = (struct iovec){hdr, h + 4};
	iov[k++] = (struct iovec){(void *)anchor.p, anchor.len};
	iov[k++] = (struct iovec){tail, 4};
	for (size_t i = 0; i < n; i++) {
		kv_put32(lens + 4 * i, (uint32_t)keys[i].len);
		iov[k++] = (struct iovec){lens + 4 * i, 4};
		iov[k++] = (struct iovec){(void *)keys[i].p, keys[i].len};
	}
	if (dv) {
		kv_put32(dl, (uint32_t)dd->del_value.len);
		iov[k++] = (struct iovec){dl, 4};
		iov[k++] = (struct iovec){(void *)dd->del_value.p, dd->del_value.len};
	}
	rv = append(d, iov, k, lsn, tap);
	free(iov);
	free(lens);
	return rv;
}

/* An MPUT record appended to log w (whose last lsn is *last). */
static int
mput_w(kv_wal *w, atomic_uint_fast64_t *last, size_t n, const kv_bytes *keys, const kv_bytes *vals,
       uint64_t expire_at, const kv_dur_dedup *dd, uint64_t *lsn, const kv_dur_tap *tap)
{
	uint8_t hdr[HDR_MAX];
	size_t h = rec_head_x(hdr, REC_MPUT, dd, expire_at);
	struct iovec *iov;
	uint8_t *lens;
	int rv;

	if (n == 0 || n > (size_t)INT32_MAX / 4 - 1)
		return KV_EINVAL;
	iov = malloc((4 * n + 1) * sizeof(*iov));
	lens = malloc(8 * n);
	if (iov == NULL || lens == NULL) {
		free(iov);
		free(lens);
		return KV_ENOMEM;
	}
	kv_put32(hdr + h, (uint32_t)n);
	iov[0] = (struct iovec){hdr, h + 4};
	for (size_t i = 0; i < n; i++) {
		kv_put32(lens + 8 * i, (uint32_t)keys[i].len);
		kv_put32(lens + 8 * i + 4, (uint32_t)vals[i].len);
		iov[1 + 4 * i] = (struct iovec){lens + 8 * i, 4};
		iov[2 + 4 * i] = (struct iovec){(void *)keys[i].p, keys[i].len};
		iov[3 + 4 * i] = (struct iovec){lens + 8 * i + 4, 4};
		iov[4 + 4 * i] = (struct iovec){(void *)vals[i].p, vals[i].len};
	}
	rv = append_w(w, last, iov, (int)(4 * n + 1), lsn, tap);
	free(iov);
	free(lens);
	return rv;
}

int
kv_dur_log_mput_x(kv_dur *d, size_t n, const kv_bytes *keys, const kv_bytes *vals,
                  uint64_t expire_at, const kv_dur_dedup *dd, uint64_t *lsn, const kv_dur_tap *tap)
{
	return mput_w(d->wal, &d->last_lsn, n, keys, vals, expire_at, dd, lsn, tap);
}

int
kv_dur_log_range_del(kv_dur *d, const void *start, size_t slen, const void *end, size_t elen,
                     uint64_t *lsn)
{
	uint8_t hdr[HDR_MAX], el[4];
	struct iovec iov[4];
	int n = range_del_iov(iov, hdr, el, start, slen, end, elen);

	return append(d, iov, n, lsn, NULL);
}

int
kv_dur_log_dedup(kv_dur *d, const kv_dur_dedup *dd, int status, const void *key, size_t klen,
                 uint64_t *lsn)
{
	uint8_t hdr[HDR_MAX + 4], dl[4];
	struct iovec iov[4];
	int n = dedup_iov(iov, hdr, dl, dd, status, key, klen);

	return append(d, iov, n, lsn, NULL);
}

/* A bounds-checked reader over one record. */
typedef struct {
	const uint8_t *p; /* next byte */
	size_t n;         /* bytes left */
	bool bad;         /* ran past the end */
} rd;

/* Takes n bytes, or marks the reader bad and returns NULL. */
static const uint8_t *
rd_take(rd *r, size_t n)
{
	const uint8_t *p = r->p;
	if (r->bad || r->n < n) {
		r->bad = true;
		r->n = 0;
		return NULL;
	}
	r->p += n;
	r->n -= n;
	return p;
}

static uint32_t
rd32(rd *r)
{
	const uint8_t *p = rd_take(r, 4);
	return p ? kv_get32(p) : 0;
}

static uint64_t
rd64(rd *r)
{
	const uint8_t *p = rd_take(r, 8);
	return p ? kv_get64(p) : 0;
}

/* Takes a u32 length and that many bytes. */
static kv_bytes
rdbytes(rd *r)
{
	uint32_t len = rd32(r);
	const uint8_t *p = rd_take(r, len);
	return p ? (kv_bytes){p, len} : (kv_bytes){0};
}

/* Applies one replayed record. */
typedef struct {
	kv_store *store;
	kv_dedup *dedup;
	uint64_t records;
	uint64_t bytes;
	/* Recovery of the server's own log only (else NULL: ADOPT is refused):
	 * the data dir, whose side logs ADOPT records name. */
	const char *dir;
	bool in_side;       /* replaying a side log now (ADOPT refused) */
	side_list adopted;  /* side logs adopted by the records replayed */
	char side_err[600]; /* why a side log could not be replayed */
	/* kv_dur_apply_records: the group's exactly-once results, inserted
	 * with one call (flush_remembered) before anything else of the table
	 * runs; else NULL: each goes in at once. */
	kv_dedup_entry *pend;
	size_t npend, pcap;
} replay_ctx;

/* Whether n bytes at p name a side log: "side-" and 16 lowercase hex digits. */
static bool
side_name_ok(const uint8_t *p, size_t n)
{
	if (n != SIDE_NAME - 1 || memcmp(p, SIDE_PREFIX, strlen(SIDE_PREFIX)) != 0)
		return false;
	for (size_t i = strlen(SIDE_PREFIX); i < n; i++)
		if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
			return false;
	return true;
}

static int replay_cb(void *arg, uint64_t lsn, const uint8_t *p, size_t n);

/* An ADOPT record at lsn: replays the side log it names, whole, and notes
 * it as adopted. */
static int
replay_side(replay_ctx *c, uint64_t lsn, kv_bytes nm)
{
	char name[SIDE_NAME], path[4200];
	struct stat st;
	kv_wal_report wr;
	int rv;

	memcpy(name, nm.p, nm.len);
	name[nm.len] = '\0';
	snprintf(path, sizeof(path), "%s/%s", c->dir, name);
	if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode)) {
		snprintf(c->side_err, sizeof(c->side_err),
		         "the log record at lsn %" PRIu64
		         " adopts the side log %.400s, which is missing",
		         lsn, path);
		return KV_ECORRUPT;
	}
	c->in_side = true;
	rv = kv_wal_replay(path, 1, false, replay_cb, c, &wr, c->side_err, sizeof(c->side_err));
	c->in_side = false;
	if (rv != 0) {
		if (c->side_err[0] == '\0')
			snprintf(c->side_err, sizeof(c->side_err),
			         "replaying the side log %.400s (adopted at lsn %" PRIu64
			         ") failed: %s",
			         path, lsn, kv_strerror(rv));
		return rv;
	}
	return side_list_put(&c->adopted, name, lsn);
}

static void
remember(replay_ctx *c, const kv_dur_dedup *dd, int status, const void *key, size_t klen)
{
	kv_dedup_result r = {
	    .status = status,
	    .value_len = dd->value_len,
	    .has_value = dd->has_del_value,
	    .value = {.data = (uint8_t *)dd->del_value.p, .len = dd->del_value.len}};
	/* Failing to remember only weakens exactly-once for that request
	 * (kv_dedup_insert copies the value). */
	if (c->pend != NULL && c->npend < c->pcap) {
		c->pend[c->npend++] = (kv_dedup_entry){.client = dd->client,
		                                       .req = dd->req,
		                                       .res = r,
		                                       .key = key,
		                                       .klen = klen,
		                                       .time_ms = dd->time_ms};
		return;
	}
	(void)kv_dedup_insert(c->dedup, dd->client, dd->req, &r, key, klen, dd->time_ms);
}

/* Inserts the results remember() kept back, in their order. */
static void
flush_remembered(replay_ctx *c)
{
	if (c->npend > 0)
		(void)kv_dedup_insert_many(c->dedup, c->pend, c->npend);
	c->npend = 0;
}

static int
replay_cb(void *arg, uint64_t lsn, const uint8_t *p, size_t n)
{
	replay_ctx *c = arg;
	rd r = {.p = p, .n = n};
	kv_dur_dedup dd = {0};
	bool has_dd;
	uint8_t type;
	uint64_t at = 0;
	int rv = KV_OK;

	if (n < 2)
		return KV_ECORRUPT;
	type = p[0];
	has_dd = (p[1] & REC_F_DEDUP) != 0;
	bool has_dv = (p[1] & REC_F_DELVAL) != 0;
	bool has_at = (p[1] & REC_F_EXPIRY) != 0;
	if (has_dv && (!has_dd || (type != REC_DEL && type != REC_DEDUP && type != REC_MDEL)))
		return KV_ECORRUPT;
	if (has_at && type != REC_PUT && type != REC_MPUT)
		return KV_ECORRUPT;
	if ((p[1] & ~(REC_F_DEDUP | REC_F_DELVAL | REC_F_EXPIRY)) != 0)
		return KV_ECORRUPT;
	r.p += 2;
	r.n -= 2;
	if (has_dd) {
		dd.client = rd64(&r);
		dd.req = rd64(&r);
		dd.value_len = rd64(&r);
		dd.time_ms = rd64(&r);
	}
	if (has_at && ((at = rd64(&r)) == 0 || r.bad))
		return KV_ECORRUPT;
	switch (type) {
	case REC_PUT: {
		kv_bytes k = rdbytes(&r), v = rdbytes(&r);
		if (r.bad || k.len == 0)
			return KV_ECORRUPT;
		rv = kv_store_put_x(c->store, k.p, k.len, v.p ? v.p : (const uint8_t *)"", v.len,
		                    at);
		if (rv == 0 && has_dd)
			remember(c, &dd, 0, k.p, k.len);
		break;
	}
	case REC_DEL: {
		kv_bytes k = rdbytes(&r);
		if (has_dv) {
			dd.del_value = rdbytes(&r);
			dd.has_del_value = dd.del_value.len <= KV_DEDUP_MAX_VALUE;
		}
		if (r.bad || k.len == 0)
			return KV_ECORRUPT;
		rv = kv_store_del(c->store, k.p, k.len, NULL);
		if (rv == KV_ENOTFOUND)
			rv = KV_OK; /* already gone in the snapshot */
		if (rv == 0 && has_dd)
			remember(c, &dd, 0, k.p, k.len);
		break;
	}
	case REC_MPUT: {
		uint32_t cnt = rd32(&r);
		kv_bytes first = {0};
		for (uint32_t i = 0; i < cnt && rv == 0; i++) {
			kv_bytes k = rdbytes(&r), v = rdbytes(&r);
			if (r.bad || k.len == 0)
				return KV_ECORRUPT;
			if (i == 0)
				first = k;
			rv = kv_store_put_x(c->store, k.p, k.len, v.p ? v.p : (const uint8_t *)"",
			                    v.len, at);
		}
		if (r.bad || cnt == 0)
			return KV_ECORRUPT;
		if (rv == 0 && has_dd)
			remember(c, &dd, 0, first.p, first.len);
		break;
	}
	case REC_MDEL: {
		kv_bytes anchor = rdbytes(&r);
		uint32_t cnt = rd32(&r);
		if (r.bad || cnt > r.n / 4)
			return KV_ECORRUPT;
		for (uint32_t i = 0; i < cnt && rv == 0; i++) {
			kv_bytes k = rdbytes(&r);
			if (r.bad || k.len == 0)
				return KV_ECORRUPT;
			rv = kv_store_del(c->store, k.p, k.len, NULL);
			if (rv == KV_ENOTFOUND)
				rv = KV_OK;
		}
		if (has_dv) {
			dd.del_value = rdbytes(&r);
			dd.has_del_value = dd.del_value.len <= KV_DEDUP_MAX_VALUE;
		}
		if (r.bad)
			return KV_ECORRUPT;
		if (rv == 0 && has_dd && anchor.len > 0)
			remember(c, &dd, 0, anchor.p, anchor.len);
		break;
	}
	case REC_RANGE_DEL: {
		kv_bytes s = rdbytes(&r), e = rdbytes(&r);
		if (r.bad)
			return KV_ECORRUPT;
		flush_remembered(c); /* the entries it forgets are in the table */
		do
			rv = kv_store_range_delete(c->store, s.p, s.len, e.p, e.len, 4096, NULL);
		while (rv == KV_EBUSY);
		/* The range's exactly-once entries go with it: what replaces the
		 * range (a copy, a transfer) brings its own. */
		if (rv == KV_OK)
			kv_dedup_forget_range(c->dedup, s.p, s.len, e.p, e.len);
		break;
	}
	case REC_ADOPT: {
		kv_bytes nm = rdbytes(&r);
		if (r.bad || has_dd || c->dir == NULL || c->in_side || !side_name_ok(nm.p, nm.len))
			return KV_ECORRUPT;
		rv = replay_side(c, lsn, nm);
		break;
	}
	case REC_DEDUP: {
		int status = (int)rd32(&r);
		kv_bytes k = rdbytes(&r);
		if (has_dv) {
			dd.del_value = rdbytes(&r);
			dd.has_del_value = dd.del_value.len <= KV_DEDUP_MAX_VALUE;
		}
		if (r.bad || !has_dd)
			return KV_ECORRUPT;
		if (status == KV_DUR_DEDUP_FLOOR) { /* a copy's floor, no entry */
			if (k.len != 0)
				return KV_ECORRUPT;
			flush_remembered(c);
			(void)kv_dedup_raise_floor(c->dedup, dd.client, dd.req, dd.time_ms);
			break;
		}
		remember(c, &dd, status, k.p, k.len);
		break;
	}
	default:
		return KV_ECORRUPT;
	}
	if (r.n != 0)
		return KV_ECORRUPT;
	c->records++;
	c->bytes += n;
	return rv;
}

/* Widens the span *o (KV_DUR_SPAN_KEYS or NONE) by key k. */
static void
span_add(kv_dur_span *o, kv_bytes k)
{
	if (o->kind == KV_DUR_SPAN_NONE) {
		o->kind = KV_DUR_SPAN_KEYS;
		o->lo = o->hi = k;
		return;
	}
	if (kv_key_cmp(k.p, k.len, o->lo.p, o->lo.len) < 0)
		o->lo = k;
	if (kv_key_cmp(k.p, k.len, o->hi.p, o->hi.len) > 0)
		o->hi = k;
}

int
kv_dur_rec_span(const uint8_t *p, size_t n, kv_dur_span *out)
{
	rd r = {.p = p, .n = n};
	kv_dur_span o = {.kind = KV_DUR_SPAN_NONE};
	bool has_dd, has_dv, has_at;
	uint8_t type;

	if (n < 2 || (p[1] & ~(REC_F_DEDUP | REC_F_DELVAL | REC_F_EXPIRY)) != 0)
		return KV_ECORRUPT;
	type = p[0];
	has_dd = (p[1] & REC_F_DEDUP) != 0;
	has_dv = (p[1] & REC_F_DELVAL) != 0;
	has_at = (p[1] & REC_F_EXPIRY) != 0;
	r.p += 2;
	r.n -= 2;
	if (has_dd)
		(void)rd_take(&r, 32);
	if (has_at)
		(void)rd64(&r);
	switch (type) {
	case REC_PUT:
	case REC_DEL: {
		kv_bytes k = rdbytes(&r);
		if (r.bad || k.len == 0)
			return KV_ECORRUPT;
		span_add(&o, k);
		break;
	}
	case REC_MPUT: {
		uint32_t cnt = rd32(&r);
		for (uint32_t i = 0; i < cnt && !r.bad; i++) {
			kv_bytes k = rdbytes(&r);
			(void)rdbytes(&r);
			if (k.len == 0)
				return KV_ECORRUPT;
			span_add(&o, k);
		}
		if (r.bad || cnt == 0)
			return KV_ECORRUPT;
		break;
	}
	case REC_MDEL: {
		kv_bytes anchor = rdbytes(&r);
		uint32_t cnt = rd32(&r);
		if (r.bad || cnt > r.n / 4)
			return KV_ECORRUPT;
		if (anchor.len > 0)
			span_add(&o, anchor);
		for (uint32_t i = 0; i < cnt && !r.bad; i++) {
			kv_bytes k = rdbytes(&r);
			if (k.len == 0)
				return KV_ECORRUPT;
			span_add(&o, k);
		}
		break;
	}
	case REC_RANGE_DEL: {
		kv_bytes st = rdbytes(&r), en = rdbytes(&r);
		if (r.bad)
			return KV_ECORRUPT;
		o = (kv_dur_span){.kind = KV_DUR_SPAN_RANGE, .lo = st, .hi = en};
		break;
	}
	case REC_DEDUP: {
		(void)rd32(&r);
		kv_bytes k = rdbytes(&r);
		if (r.bad || !has_dd)
			return KV_ECORRUPT;
		if (k.len > 0)
			span_add(&o, k);
		break;
	}
	case REC_ADOPT:
		o.kind = KV_DUR_SPAN_ALL;
		break;
	default:
		return KV_ECORRUPT;
	}
	(void)has_dv; /* a deleted value, if any, is no key */
	if (r.bad)
		return KV_ECORRUPT;
	*out = o;
	return KV_OK;
}

int
kv_dur_read_log(kv_dur *d, uint64_t from_lsn, uint64_t to_lsn,
                int (*cb)(void *arg, uint64_t lsn, const uint8_t *p, size_t n), void *arg,
                char *err, size_t errlen)
{
	return kv_wal_read(d->dir, from_lsn, to_lsn, cb, arg, err, errlen);
}

int
kv_dur_replay_record_for_test(kv_store *store, kv_dedup *dedup, const uint8_t *p, size_t n)
{
	replay_ctx c = {.store = store, .dedup = dedup};
	return replay_cb(&c, 1, p, n);
}

int
kv_dur_apply_record(kv_dur *d, const uint8_t *p, size_t n, uint64_t *lsn)
{
	replay_ctx c = {.store = d->o.store, .dedup = d->o.dedup};
	struct iovec iov[1] = {{(void *)p, n}};
	int rv = replay_cb(&c, 0, p, n);

	if (rv != 0)
		return rv;
	return append(d, iov, 1, lsn, NULL);
}

/* Records applied by kv_dur_apply_records and logged with one append. */
#define APPLY_GROUP 32

int
kv_dur_apply_records(kv_dur *d, const kv_bytes *recs, size_t n, size_t *done, uint64_t *last_lsn)
{
	kv_dedup_entry pend[APPLY_GROUP];
	replay_ctx c = {
	    .store = d->o.store, .dedup = d->o.dedup, .pend = pend, .pcap = APPLY_GROUP};
	struct iovec iov[APPLY_GROUP];
	size_t i = 0;
	int rv = KV_OK;

	*done = 0;
	while (i < n && rv == KV_OK) {
		int k = 0;
		for (; i < n && k < APPLY_GROUP; i++) {
			if ((rv = replay_cb(&c, 0, recs[i].p, recs[i].len)) != KV_OK)
				break;
			iov[k++] = (struct iovec){(void *)recs[i].p, recs[i].len};
		}
		/* The group's results, with one hold of each client's stripe
		 * instead of one a record (the records' payloads, which they
		 * point into, outlive the call). */
		flush_remembered(&c);
		if (k == 0)
			break;
		uint64_t first = 0;
		int arv = append_many(d, iov, k, &first);
		if (arv != KV_OK)
			return arv; /* applied, not logged: as kv_dur_apply_record's */
		*done += (size_t)k;
		*last_lsn = first + (uint64_t)k - 1;
	}
	return rv;
}

/* ------------------------------------------------------------------------
 * Side logs (durable.h; doc/durability.md "Migrations")
 * ------------------------------------------------------------------------ */

/* Calls fn on every file of side log directory `path` (its segments; a
 * side log holds no subdirectory), logging `what` for each failure.
 * Returns false when the directory cannot be opened (errno set). */
static bool
side_each_file(const char *path, int (*fn)(int dfd, const char *file), const char *what)
{
	DIR *dp = opendir(path);
	struct dirent *e;

	if (dp == NULL)
		return false;
	while ((e = readdir(dp)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (fn(dirfd(dp), e->d_name) != 0)
			KV_WARN(COMP, what, "dir=%s file=%s err=\"%s\"", path, e->d_name,
			        strerror(errno));
	}
	closedir(dp);
	return true;
}

static int
unlink_file(int dfd, const char *file)
{
	return unlinkat(dfd, file, 0);
}

static int
sync_file_at(int dfd, const char *file)
{
	int fd = openat(dfd, file, O_RDONLY | O_CLOEXEC), rv;

	if (fd < 0)
		return -1;
	rv = fdatasync(fd);
	close(fd);
	return rv;
}

/* Removes the side log `name` of data dir `dir` (its segments, then the
 * directory). Failures are logged. */
static void
remove_side(const char *dir, const char *name)
{
	char path[4200];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (!side_each_file(path, unlink_file, "cannot remove side log file")) {
		if (errno != ENOENT)
			KV_WARN(COMP, "cannot open side log to remove it", "dir=%s err=\"%s\"",
			        path, strerror(errno));
		return;
	}
	if (rmdir(path) != 0)
		KV_WARN(COMP, "cannot remove side log", "dir=%s err=\"%s\"", path, strerror(errno));
	else
		KV_DEBUG(COMP, "side log removed", "dir=%s", path);
}

/* After a snapshot at lsn: the adopted side logs whose ADOPT record is
 * below it are in the snapshot, and go. */
static void
drop_sides_before(kv_dur *d, uint64_t lsn)
{
	side_ref gone[16];
	size_t ngone;

	do {
		ngone = 0;
		pthread_mutex_lock(&d->mu);
		for (size_t i = 0; i < d->sides.n && ngone < 16;) {
			if (d->sides.v[i].lsn < lsn) {
				gone[ngone++] = d->sides.v[i];
				d->sides.v[i] = d->sides.v[--d->sides.n];
			} else {
				i++;
			}
		}
		pthread_mutex_unlock(&d->mu);
		for (size_t i = 0; i < ngone; i++)
			remove_side(d->dir, gone[i].name);
	} while (ngone == 16);
}

/* Fsyncs the files of side log `name` of data dir `dir`, then the
 * directory. Failures are logged. */
static void
sync_side(const char *dir, const char *name)
{
	char path[4200];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if (side_each_file(path, sync_file_at, "cannot sync side log file") &&
	    kv_fsync_dir(path) != 0)
		KV_WARN(COMP, "cannot sync side log", "dir=%s", path);
}

int
kv_dur_side_open(kv_dur *d, kv_dur_side **out)
{
	kv_dur_side *s = calloc(1, sizeof(*s));
	char path[4200], err[600] = "";
	int rv;

	*out = NULL;
	if (s == NULL)
		return KV_ENOMEM;
	s->d = d;
	atomic_init(&s->last, 0);
	snprintf(s->name, sizeof(s->name), SIDE_PREFIX "%016" PRIx64,
	         (uint64_t)atomic_fetch_add(&d->side_seq, 1));
	snprintf(path, sizeof(path), "%s/%s", d->dir, s->name);
	remove_side(d->dir, s->name); /* a leftover of that name holds nothing adopted */
	kv_wal_opts wo = {.dir = path,
	                  .mode = d->o.mode == KV_FSYNC_NONE ? KV_FSYNC_NONE : KV_FSYNC_BATCH,
	                  .batch_ms = SIDE_SYNC_MS,
	                  .segment_bytes = SIDE_SEGMENT,
	                  .buffer_bytes = SIDE_BUFFER,
	                  /* with none, nothing syncs it (its close is on the
	                     transfer's commit path) */
	                  .close_unsynced = true,
	                  .bulk = true,
	                  /* its records are waited for once, at the copy's end
	                     (kv_dur_side_sync): written in big pieces, without
	                     a wake-up of its writer per group of entries */
	                  .lazy = true};
	if ((rv = kv_wal_open(&wo, 1, &s->w, err, sizeof(err))) != 0) {
		KV_WARN(COMP, "cannot open a side log", "dir=%s err=%s detail=\"%s\"", path,
		        kv_errname(rv), err);
		remove_side(d->dir, s->name);
		free(s);
		return rv;
	}
	*out = s;
	return KV_OK;
}

int
kv_dur_side_put_x(kv_dur_side *s, const void *key, size_t klen, const void *val, size_t vlen,
                  uint64_t expire_at)
{
	uint8_t hdr[HDR_MAX], vl[4];
	struct iovec iov[4];
	int n = put_iov(iov, hdr, vl, key, klen, val, vlen, NULL, expire_at);

	if (s->adopted)
		return KV_EINVAL;
	s->bytes += klen + vlen;
	return append_w(s->w, &s->last, iov, n, NULL, NULL);
}

int
kv_dur_side_mput_x(kv_dur_side *s, size_t n, const kv_bytes *keys, const kv_bytes *vals,
                   uint64_t expire_at)
{
	if (s->adopted)
		return KV_EINVAL;
	for (size_t i = 0; i < n; i++)
		s->bytes += keys[i].len + vals[i].len;
	return mput_w(s->w, &s->last, n, keys, vals, expire_at, NULL, NULL, NULL);
}

int
kv_dur_side_del(kv_dur_side *s, const void *key, size_t klen)
{
	uint8_t hdr[HDR_MAX], dl[4];
	struct iovec iov[4];

	if (s->adopted)
		return KV_EINVAL;
	s->bytes += klen;
	return append_w(s->w, &s->last, iov, del_iov(iov, hdr, dl, key, klen, NULL), NULL, NULL);
}

int
kv_dur_side_dedup(kv_dur_side *s, const kv_dur_dedup *dd, int status, const void *key, size_t klen)
{
	uint8_t hdr[HDR_MAX + 4], dl[4];
	struct iovec iov[4];
	int n = dedup_iov(iov, hdr, dl, dd, status, key, klen);

	if (s->adopted)
		return KV_EINVAL;
	s->bytes += klen + DEDUP_VAL;
	return append_w(s->w, &s->last, iov, n, NULL, NULL);
}

int
kv_dur_side_sync(kv_dur_side *s)
{
	uint64_t last = atomic_load(&s->last);

	if (last == 0)
		return KV_OK;
	return kv_wal_wait(s->w, last, s->d->o.mode != KV_FSYNC_NONE);
}

int
kv_dur_side_adopt(kv_dur_side *s)
{
	kv_dur *d = s->d;
	uint8_t hdr[2 + 4];
	struct iovec iov[2];
	uint64_t lsn = 0;
	int rv;

	if (s->adopted)
		return KV_EINVAL;
	if ((rv = kv_dur_side_sync(s)) != 0)
		return rv;
	hdr[0] = REC_ADOPT;
	hdr[1] = 0;
	kv_put32(hdr + 2, (uint32_t)strlen(s->name));
	iov[0] = (struct iovec){hdr, sizeof(hdr)};
	iov[1] = (struct iovec){s->name, strlen(s->name)};
	/* In an apply-and-log section: a snapshot that begins after the
	 * append holds everything the side log applied (doc/durability.md,
	 * invariant 2). */
	kv_dur_begin(d);
	rv = append(d, iov, 2, &lsn, NULL);
	kv_dur_end(d);
	if (rv != 0)
		return rv;
	s->adopted = true;
	s->adopt_lsn = lsn;
	return kv_dur_sync(d);
}

void
kv_dur_side_close(kv_dur_side *s)
{
	kv_dur *d;

	if (s == NULL)
		return;
	d = s->d;
	kv_wal_close(s->w);
	if (s->adopted) {
		pthread_mutex_lock(&d->mu);
		int rv = side_list_put(&d->sides, s->name, s->adopt_lsn);
		d->side_bytes += s->bytes;
		pthread_mutex_unlock(&d->mu);
		if (rv != 0) /* it stays on disk until the next start removes it */
			KV_WARN(COMP, "side log not noted for removal", "side=%s", s->name);
	} else {
		remove_side(d->dir, s->name);
	}
	free(s);
}

/* At open: keeps the side logs the replayed log adopted, removes every
 * other, and numbers new ones after every name seen. */
static int
sides_at_open(kv_dur *d, const replay_ctx *rc)
{
	DIR *dp = opendir(d->dir);
	struct dirent *e;
	uint64_t next = 1;
	int rv = KV_OK;

	if (dp == NULL)
		return KV_OK; /* the log's open reports an unusable dir */
	while ((e = readdir(dp)) != NULL) {
		size_t n = strlen(e->d_name);
		if (!side_name_ok((const uint8_t *)e->d_name, n))
			continue;
		uint64_t num = strtoull(e->d_name + strlen(SIDE_PREFIX), NULL, 16);
		if (num >= next)
			next = num + 1;
		bool kept = false;
		for (size_t i = 0; i < rc->adopted.n && !kept; i++)
			if (strcmp(rc->adopted.v[i].name, e->d_name) == 0) {
				kept = true;
				if (rv == KV_OK)
					rv = side_list_put(&d->sides, e->d_name,
					                   rc->adopted.v[i].lsn);
			}
		if (!kept)
			remove_side(d->dir, e->d_name);
	}
	closedir(dp);
	atomic_store(&d->side_seq, next);
	return rv;
}

/* ------------------------------------------------------------------------
 * Snapshots
 * ------------------------------------------------------------------------ */

static int
snap_load_cb(void *arg, uint8_t type, const uint8_t *key, size_t klen, const uint8_t *val,
             size_t vlen)
{
	replay_ctx *c = arg;

	if (klen == 0)
		return KV_ECORRUPT;
	if (type == SNAP_KV)
		return kv_store_put(c->store, key, klen, val ? val : (const uint8_t *)"", vlen);
	if (type == SNAP_KVX) {
		if (vlen < 8 || kv_get64(val) == 0)
			return KV_ECORRUPT;
		return kv_store_put_x(c->store, key, klen, vlen > 8 ? val + 8 : (const uint8_t *)"",
		                      vlen - 8, kv_get64(val));
	}
	if (type == SNAP_FLOOR) {
		if (klen != 8 || vlen != 16 || kv_get64be(key) == 0 || kv_get64(val) == 0)
			return KV_ECORRUPT;
		(void)kv_dedup_raise_floor(c->dedup, kv_get64be(key), kv_get64(val),
		                           kv_get64(val + 8));
		return KV_OK;
	}
	if (type == SNAP_DEDUP) {
		if (vlen < DEDUP_VAL || (vlen > DEDUP_VAL && val[DEDUP_VAL] != 1) ||
		    vlen > DEDUP_VAL + 1 + KV_DEDUP_MAX_VALUE)
			return KV_ECORRUPT;
		kv_dur_dedup dd = {.client = kv_get64(val),
		                   .req = kv_get64(val + 8),
		                   .value_len = kv_get64(val + 16),
		                   .time_ms = kv_get64(val + 24)};
		if (vlen > DEDUP_VAL) {
			dd.has_del_value = true;
			dd.del_value = (kv_bytes){val + DEDUP_VAL + 1, vlen - DEDUP_VAL - 1};
		}
		remember(c, &dd, (int)kv_get32(val + 32), key, klen);
		return KV_OK;
	}
	return KV_ECORRUPT;
}

/* Entries copied out of one store step. */
typedef struct {
	kv_buf keys[SNAP_STEP];
	kv_buf vals[SNAP_STEP]; /* with a deadline: u64 expire_at, then the value */
	bool dl[SNAP_STEP];     /* the entry has a deadline (SNAP_KVX) */
	size_t n;
	bool oom;
} snap_batch;

static int
snap_copy_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen,
             uint64_t at)
{
	snap_batch *b = arg;
	uint8_t a[8];
	if (b->n == SNAP_STEP)
		return 1;
	kv_put64(a, at);
	b->dl[b->n] = at != 0;
	b->vals[b->n].len = 0;
	if (kv_buf_set(&b->keys[b->n], key, klen) != 0 ||
	    (at != 0 && kv_buf_append(&b->vals[b->n], a, 8) != 0) ||
	    kv_buf_append(&b->vals[b->n], val ? val : (const uint8_t *)"", vlen) != 0) {
		b->oom = true;
		return 1;
	}
	b->n++;
	return 0;
}

/* Adds the exactly-once memory to the snapshot being written. */
typedef struct {
	kv_snap_writer *w;
	int rv;
	kv_buf part; /* one part's entries, copied under its lock (snap_dedup_cb) */
} dedup_visit;

static void
snap_dedup_cb(void *arg, uint64_t client, uint64_t req, const kv_dedup_result *res,
              const uint8_t *key, size_t klen, uint64_t time_ms)
{
	dedup_visit *v = arg;
	uint8_t val[DEDUP_VAL + 1 + KV_DEDUP_MAX_VALUE];
	size_t n = DEDUP_VAL;

	if (v->rv != 0 || klen == 0)
		return;
	kv_put64(val, client);
	kv_put64(val + 8, req);
	kv_put64(val + 16, res->value_len);
	kv_put64(val + 24, time_ms);
	kv_put32(val + 32, (uint32_t)res->status);
	if (res->has_value && res->value.len <= KV_DEDUP_MAX_VALUE) {
		val[n++] = 1;
		if (res->value.len)
			memcpy(val + n, res->value.data, res->value.len);
		n += res->value.len;
	}
	/* Copied out: the part's lock is held, and every write of the
	 * clients in it waits for it (a client's ring holds thousands). */
	uint8_t len[8];
	kv_put32(len, (uint32_t)klen);
	kv_put32(len + 4, (uint32_t)n);
	if (kv_buf_reserve(&v->part, v->part.len + sizeof(len) + klen + n) != 0) {
		v->rv = KV_ENOMEM;
		return;
	}
	kv_buf_append(&v->part, len, sizeof(len));
	kv_buf_append(&v->part, key, klen);
	kv_buf_append(&v->part, val, n);
}

/* Writes the entries snap_dedup_cb copied out of one part. */
static void
snap_dedup_flush(dedup_visit *v)
{
	for (size_t off = 0; v->rv == 0 && off + 8 <= v->part.len;) {
		uint32_t klen = kv_get32(v->part.data + off), n = kv_get32(v->part.data + off + 4);
		const uint8_t *key = v->part.data + off + 8;
		v->rv = kv_snap_add(v->w, SNAP_DEDUP, key, klen, key + klen, n);
		off += 8 + (size_t)klen + n;
	}
	v->part.len = 0;
}

/* Adds a client's floor (kv_dedup_visit_floors) to the snapshot: without
 * it a restart from the snapshot would forget that writes at or below it
 * may have been applied (a copy's or a transfer's floor, or a range
 * forgotten here), and apply their retries again. */
static void
snap_floor_cb(void *arg, uint64_t client, uint64_t floor)
{
	dedup_visit *v = arg;
	uint8_t key[8], val[16];

	if (v->rv != 0)
		return;
	kv_put64be(key, client);
	kv_put64(val, floor);
	kv_put64(val + 8, kv_unix_ms());
	v->rv = kv_snap_add(v->w, SNAP_FLOOR, key, sizeof(key), val, sizeof(val));
}

static bool
stopping(kv_dur *d)
{
	pthread_mutex_lock(&d->mu);
	bool s = d->stop;
	pthread_mutex_unlock(&d->mu);
	return s;
}

static int
snapshot(kv_dur *d, bool abortable)
{
	kv_snap_writer *w = NULL;
	kv_store_cursor c;
	snap_batch *b = NULL;
	uint64_t lsn = 0, t0 = kv_now_ns(), bytes = 0, entries = 0;
	kv_wal_stats ws;
	char err[600] = "";
	int rv;

	pthread_mutex_lock(&d->snap_mu);
	kv_wal_stats_get(d->wal, &ws);
	/* Every record before the new segment has been applied once we hold
	 * the barrier: apply+log sections hold it for reading. It is held for
	 * the cut alone, not while the writer syncs the old segment and
	 * creates the new one: writes wait microseconds, not for the disk
	 * (a request path that waits here holds up everything its event loop
	 * serves). */
	pthread_rwlock_wrlock(&d->barrier);
	rv = kv_wal_rotate_start(d->wal, &lsn);
	pthread_rwlock_unlock(&d->barrier);
	if (rv == 0)
		rv = kv_wal_rotate_wait(d->wal, lsn);
	if (rv != 0)
		goto out;
	pthread_mutex_lock(&d->mu);
	d->snap_log_at = ws.bytes;
	d->side_bytes = 0;
	pthread_mutex_unlock(&d->mu);
	if ((rv = kv_snap_begin(d->dir, lsn, &w, err, sizeof(err))) != 0)
		goto out;
	if ((b = calloc(1, sizeof(*b))) == NULL) {
		rv = KV_ENOMEM;
		goto out;
	}
	kv_store_cursor_init(&c);
	while (!c.done) {
		if (abortable && stopping(d)) {
			rv = KV_ECLOSED;
			break;
		}
		b->n = 0;
		rv =
		    kv_store_range_step_x(d->o.store, "", 0, "", 0, &c, SNAP_STEP, snap_copy_cb, b);
		if (rv == 0 && b->oom)
			rv = KV_ENOMEM;
		for (size_t i = 0; i < b->n && rv == 0; i++) {
			rv = kv_snap_add(w, b->dl[i] ? SNAP_KVX : SNAP_KV, b->keys[i].data,
			                 b->keys[i].len, b->vals[i].data, b->vals[i].len);
			bytes += b->keys[i].len + b->vals[i].len;
			entries++;
		}
		if (rv != 0)
			break;
	}
	kv_store_cursor_fini(&c);
	for (size_t i = 0; i < SNAP_STEP; i++) {
		kv_buf_fini(&b->keys[i]);
		kv_buf_fini(&b->vals[i]);
	}
	if (rv == 0) {
		dedup_visit v = {.w = w};
		for (unsigned part = 0; part < KV_DEDUP_PARTS && v.rv == 0; part++) {
			kv_dedup_visit_part(d->o.dedup, part, "", 0, "", 0, snap_dedup_cb, &v);
			snap_dedup_flush(&v);
		}
		kv_buf_fini(&v.part);
		if (v.rv == 0)
			kv_dedup_visit_floors(d->o.dedup, snap_floor_cb, &v);
		rv = v.rv;
	}
	if (rv != 0)
		goto out;
	rv = kv_snap_commit(w, err, sizeof(err));
	w = NULL;
	if (rv != 0)
		goto out;
	rv = kv_wal_drop_before(d->wal, lsn);
	drop_sides_before(d, lsn);
	uint64_t ms = (kv_now_ns() - t0) / 1000000u;
	pthread_mutex_lock(&d->mu);
	d->st.snapshots++;
	d->st.snapshot_ms = ms;
	d->st.snapshot_bytes = bytes;
	d->st.snapshot_lsn = lsn;
	d->last_snap_sz = bytes;
	pthread_mutex_unlock(&d->mu);
	KV_INFO(COMP, "snapshot written", "lsn=%llu entries=%llu bytes=%llu ms=%llu",
	        (unsigned long long)lsn, (unsigned long long)entries, (unsigned long long)bytes,
	        (unsigned long long)ms);
out:
	if (w)
		kv_snap_abort(w);
	free(b);
	if (rv != 0 && rv != KV_ECLOSED)
		KV_WARN(COMP, "snapshot failed", "err=%s detail=\"%s\"", kv_errname(rv), err);
	pthread_mutex_unlock(&d->snap_mu);
	return rv;
}

int
kv_dur_snapshot(kv_dur *d)
{
	return snapshot(d, false);
}

static void *
snap_main(void *arg)
{
	kv_dur *d = arg;
	uint64_t threshold = d->o.snapshot_bytes ? d->o.snapshot_bytes : SNAP_MIN;

	kv_log_thread_name("kv-snapshot");
	(void)kv_thread_slice(KV_BULK_SLICE_US);
	kv_store_thread_walk_pause(SNAP_WALK_PAUSE_US);
	pthread_mutex_lock(&d->mu);
	while (!d->stop) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 200 * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&d->cv, &d->mu, &ts);
		if (d->stop)
			break;
		uint64_t need = threshold;
		if (!d->o.snapshot_bytes && d->last_snap_sz > need)
			need = d->last_snap_sz; /* the log may grow as big as the data */
		uint64_t at = d->snap_log_at, side = d->side_bytes;
		pthread_mutex_unlock(&d->mu);
		kv_wal_stats ws;
		kv_wal_stats_get(d->wal, &ws);
		if (ws.health == 0 && ws.bytes - at + side >= need)
			(void)snapshot(d, true);
		pthread_mutex_lock(&d->mu);
	}
	pthread_mutex_unlock(&d->mu);
	return NULL;
}

/* ------------------------------------------------------------------------
 * Open, close
 * ------------------------------------------------------------------------ */

int
kv_dur_open(const kv_dur_opts *o, kv_dur **out, kv_dur_report *rep, char *err, size_t errlen)
{
	kv_dur *d = calloc(1, sizeof(*d));
	replay_ctx rc = {.store = o->store, .dedup = o->dedup, .dir = o->dir};
	kv_wal_report wr;
	pthread_rwlockattr_t ra;
	uint64_t t0 = kv_now_ns();
	int rv;

	memset(rep, 0, sizeof(*rep));
	if (d == NULL || (d->dir = strdup(o->dir)) == NULL) {
		free(d);
		return KV_ENOMEM;
	}
	d->o = *o;
	d->o.dir = d->dir;
	pthread_rwlockattr_init(&ra);
	pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&d->barrier, &ra);
	pthread_rwlockattr_destroy(&ra);
	for (size_t i = 0; i < KV_DUR_STRIPES; i++)
		pthread_mutex_init(&d->stripe[i], NULL);
	pthread_mutex_init(&d->mu, NULL);
	pthread_mutex_init(&d->snap_mu, NULL);
	pthread_cond_init(&d->cv, NULL);

	rv = kv_snap_load(d->dir, snap_load_cb, &rc, &rep->snap_lsn, &rep->snap_entries,
	                  &rep->snap_bytes, err, errlen);
	if (rv != 0)
		goto fail;
	rv = kv_wal_replay(d->dir, rep->snap_lsn, o->truncate_corrupt, replay_cb, &rc, &wr, err,
	                   errlen);
	if (rv != 0) {
		if (rc.side_err[0] != '\0' && err && errlen)
			snprintf(err, errlen, "%s", rc.side_err);
		else if (rv != KV_ECORRUPT && err && errlen && err[0] == '\0')
			snprintf(err, errlen, "replaying the log failed: %s", kv_strerror(rv));
		goto fail;
	}
	if ((rv = sides_at_open(d, &rc)) != 0)
		goto fail;
	rep->log_records = rc.records;
	rep->log_bytes = rc.bytes;
	rep->torn = wr.torn;
	rep->torn_bytes = wr.torn_bytes;
	snprintf(rep->torn_file, sizeof(rep->torn_file), "%s", wr.file);
	/* the server destroys its event loops before it closes this log */
	kv_wal_opts wo = {.dir = d->dir, .mode = o->mode, .round_writes = true};
	if ((rv = kv_wal_open(&wo, wr.next_lsn, &d->wal, err, errlen)) != 0)
		goto fail;
	atomic_store(&d->last_lsn, wr.next_lsn - 1);
	d->last_snap_sz = rep->snap_bytes;
	rep->elapsed_ns = kv_now_ns() - t0;
	if (pthread_create(&d->thr, NULL, snap_main, d) != 0) {
		kv_wal_close(d->wal);
		rv = KV_ENOMEM;
		goto fail;
	}
	d->thr_started = true;
	free(rc.adopted.v);
	*out = d;
	return KV_OK;
fail:
	pthread_rwlock_destroy(&d->barrier);
	for (size_t i = 0; i < KV_DUR_STRIPES; i++)
		pthread_mutex_destroy(&d->stripe[i]);
	pthread_mutex_destroy(&d->mu);
	pthread_mutex_destroy(&d->snap_mu);
	pthread_cond_destroy(&d->cv);
	free(rc.adopted.v);
	free(d->sides.v);
	free(d->dir);
	free(d);
	return rv;
}

void
kv_dur_close(kv_dur *d)
{
	if (d == NULL)
		return;
	pthread_mutex_lock(&d->mu);
	d->stop = true;
	pthread_cond_broadcast(&d->cv);
	pthread_mutex_unlock(&d->mu);
	if (d->thr_started)
		pthread_join(d->thr, NULL);
	/* With none a side log is not synced at its close (the transfer's
	 * commit path); a clean stop leaves the adopted ones on disk with the
	 * log, whose close syncs it, as in the other modes. */
	if (d->o.mode == KV_FSYNC_NONE)
		for (size_t i = 0; i < d->sides.n; i++)
			sync_side(d->dir, d->sides.v[i].name);
	kv_wal_close(d->wal);
	pthread_rwlock_destroy(&d->barrier);
	for (size_t i = 0; i < KV_DUR_STRIPES; i++)
		pthread_mutex_destroy(&d->stripe[i]);
	pthread_mutex_destroy(&d->mu);
	pthread_mutex_destroy(&d->snap_mu);
	pthread_cond_destroy(&d->cv);
	free(d->sides.v);
	free(d->dir);
	free(d);
}

/* ------------------------------------------------------------------------
 * Pass-throughs
 * ------------------------------------------------------------------------ */

kv_fsync_mode
kv_dur_mode(const kv_dur *d)
{
	return d->o.mode;
}

int
kv_dur_health(kv_dur *d)
{
	return kv_wal_health(d->wal);
}

uint64_t
kv_dur_last_lsn(kv_dur *d)
{
	return atomic_load(&d->last_lsn);
}

int
kv_dur_notify(kv_dur *d, uint64_t lsn, kv_wal_done_fn done, void *arg)
{
	return kv_wal_notify(d->wal, lsn, done, arg);
}

uint64_t
kv_dur_durable_lsn(kv_dur *d)
{
	return kv_wal_durable_lsn(d->wal);
}

/* Waits until every record so far is written, and fsynced when sync. */
static int
wait_all(kv_dur *d, bool sync)
{
	uint64_t l = atomic_load(&d->last_lsn);
	if (l == 0)
		return KV_OK;
	return kv_wal_wait(d->wal, l, sync);
}

int
kv_dur_sync(kv_dur *d)
{
	return wait_all(d, d->o.mode != KV_FSYNC_NONE);
}

int
kv_dur_fsync(kv_dur *d)
{
	return wait_all(d, true);
}

void
kv_dur_write_here(kv_dur *d)
{
	kv_wal_write_here(d->wal);
}

void
kv_dur_stats_get(kv_dur *d, kv_dur_stats *st)
{
	pthread_mutex_lock(&d->mu);
	*st = d->st;
	pthread_mutex_unlock(&d->mu);
	kv_wal_stats_get(d->wal, &st->wal);
}
