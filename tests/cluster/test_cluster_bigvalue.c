/*
 * test_cluster_bigvalue.c - migrations of large values, with real daemons:
 * a 64 MiB value (and values just over the transfer budget) moves between
 * two servers in slices and reads back byte-exact from the destination only,
 * with the peak memory growth of both servers measured and bounded; a 20 MiB
 * value written during a rate-limited copy travels as sliced delta records;
 * and a destination refuses malformed slice sequences sent to it directly
 * (TransferChunk/TransferDelta through kv_xfer_encode) while accepting a
 * valid one with a resent (duplicate) slice in the middle.
 *
 * The servers are started here rather than by kv_tc_start because they need
 * --max-value above the 1 MiB default; they are recorded in kv_tc.srv so
 * that kv_tc_destroy stops them, and die with this process (PDEATHSIG).
 */
#include "common/err.h"
#include "common/rpc.h"
#include "proto/shardkv.pb-c.h"
#include "proto/wire.h"
#include "proto/admin_codec.h"
#include "proto/data_codec.h"
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

/* Sanitizer builds keep freed memory in quarantine: no memory bound there. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif

#define MIB        (1024u * 1024u)
#define BIG        (64u * MIB) /* the largest value a server accepts */
#define CLIENT_MS  60000u      /* client timeout: 64 MiB puts and gets */
#define MOVE_MS    120000u     /* a move, with --wait */
#define RAW_MS     20000u      /* one raw request */
#define RANGE_LO   "bv/"       /* the range that moves */
#define RANGE_HI   "bv0"
#define SMALL_KEYS 100 /* small keys on each side of the big ones */

static kv_tc tc;
static void raw_close(void);
static uint8_t *bufs[2]; /* large test buffers, freed by teardown */

/* ------------------------------------------------------------------------
 * Servers with options
 * ------------------------------------------------------------------------ */

/* A controller and two servers with --max-value `max_value`, joined one
 * after the other (kv_tc_start_ex). One copy per range on purpose: the
 * large values must travel in slices through migrations, which a move
 * makes only with one copy. */
static int
start_cluster(const char *tag, const char *max_value)
{
	const char *const args[] = {"--max-value", max_value, NULL};
	if (kv_tc_set_controller_args(KV_TC_ONE_COPY) != 0)
		return -1;
	int rv = kv_tc_start_ex(&tc, tag, 2, args);
	kv_tc_set_controller_args(NULL);
	return rv;
}

static int
setup_big(void **state)
{
	(void)state;
	return start_cluster("bigvalue", "67108864");
}

static int
setup_small(void **state)
{
	(void)state;
	return start_cluster("bigvalue-proto", "4194304");
}

static int
teardown(void **state)
{
	(void)state;
	raw_close(); /* the next test's cluster has other URLs */
	for (int i = 0; i < 2; i++) {
		free(bufs[i]);
		bufs[i] = NULL;
	}
	kv_tc_destroy(&tc);
	return 0;
}

/* Moves [RANGE_LO, RANGE_HI) to server i and waits for the migration. */
static void
move_range(int i, uint32_t rate_mb_s, unsigned flags)
{
	char node[16];
	kv_tc_node_arg(&tc, i, node, sizeof(node));
	KV_TC_EXPECT(&tc, 0,
	             shardkv_move(tc.admin, RANGE_LO, strlen(RANGE_LO), RANGE_HI, strlen(RANGE_HI),
	                          node, rate_mb_s, flags, NULL));
}

/* ------------------------------------------------------------------------
 * Values
 * ------------------------------------------------------------------------ */

/* Fills buf with n pseudo-random bytes determined by seed (xorshift64*). */
static void
fill_value(uint8_t *buf, size_t n, uint64_t seed)
{
	uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
	for (size_t i = 0; i < n; i += 8) {
		x ^= x >> 12;
		x ^= x << 25;
		x ^= x >> 27;
		uint64_t v = x * 0x2545F4914F6CDD1Dull;
		memcpy(buf + i, &v, n - i < 8 ? n - i : 8);
	}
}

/* FNV-1a, 64 bits. */
static uint64_t
hash64(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

/* One value of the test: its key, length and seed. */
typedef struct {
	char key[32];
	size_t len;
	uint64_t seed;
} tval;

static size_t
make_values(tval *v, size_t cap, const size_t *big_lens, size_t nbig)
{
	size_t n = 0;
	for (unsigned i = 0; i < SMALL_KEYS && n < cap; i++, n++) {
		snprintf(v[n].key, sizeof(v[n].key), RANGE_LO "a%03u", i);
		v[n].len = 10 + (i * 37) % 2000;
		v[n].seed = n + 1;
	}
	for (size_t i = 0; i < nbig && n < cap; i++, n++) {
		snprintf(v[n].key, sizeof(v[n].key), RANGE_LO "m%02zu", i);
		v[n].len = big_lens[i];
		v[n].seed = n + 1;
	}
	for (unsigned i = 0; i < SMALL_KEYS && n < cap; i++, n++) {
		snprintf(v[n].key, sizeof(v[n].key), RANGE_LO "z%03u", i);
		v[n].len = 10 + (i * 53) % 3000;
		v[n].seed = n + 1;
	}
	return n;
}

/* Writes value v through the client. */
static void
put_value(shardkv_client *cl, const tval *v)
{
	uint8_t *buf = malloc(v->len ? v->len : 1);
	assert_non_null(buf);
	fill_value(buf, v->len, v->seed);
	int rv = shardkv_put(cl, v->key, strlen(v->key), buf, v->len);
	free(buf);
	KV_TC_EXPECT(&tc, 0, rv);
}

/* ------------------------------------------------------------------------
 * Raw requests to one server
 * ------------------------------------------------------------------------ */

static kv_rpc_client *raw_cli[2];

static kv_rpc_client *
raw_client(int i)
{
	if (raw_cli[i] == NULL)
		assert_int_equal(kv_rpc_client_create(tc.srv[i].url, &raw_cli[i]), 0);
	return raw_cli[i];
}

static void
raw_close(void)
{
	for (int i = 0; i < 2; i++) {
		kv_rpc_client_destroy(raw_cli[i]);
		raw_cli[i] = NULL;
	}
}

/* Sends a get for key to server i only (no routing). Returns the op's KV_E*
 * status; on 0 *val (malloc'd) and *vlen hold the value. */
static int
raw_get(int i, const char *key, uint8_t **val, size_t *vlen)
{
	Shardkv__Request rq = SHARDKV__REQUEST__INIT;
	Shardkv__Op op = SHARDKV__OP__INIT, *ops[1] = {&op};
	Shardkv__GetOp g = SHARDKV__GET_OP__INIT;
	nng_msg *req, *rep;
	int rv;

	g.key.data = (uint8_t *)key;
	g.key.len = strlen(key);
	op.op_case = SHARDKV__OP__OP_GET;
	op.get = &g;
	rq.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	rq.n_ops = 1;
	rq.ops = ops;
	assert_int_equal(nng_msg_alloc(&req, shardkv__request__get_packed_size(&rq)), 0);
	shardkv__request__pack(&rq, nng_msg_body(req));
	if ((rv = kv_rpc_call(raw_client(i), req, &rep, RAW_MS)) != 0)
		return rv;
	Shardkv__Response *r = shardkv__response__unpack(NULL, nng_msg_len(rep), nng_msg_body(rep));
	nng_msg_free(rep);
	assert_non_null(r);
	if (r->status != SHARDKV__STATUS__STATUS_OK || r->n_results != 1) {
		rv = r->status ? kv_err_from_wire(r->status) : KV_EPROTO;
	} else {
		rv = kv_err_from_wire(r->results[0]->status);
		if (rv == 0) {
			*vlen = r->results[0]->value.len;
			*val = malloc(*vlen ? *vlen : 1);
			assert_non_null(*val);
			memcpy(*val, r->results[0]->value.data, *vlen);
		}
	}
	shardkv__response__free_unpacked(r, NULL);
	return rv;
}

/* Reads every value from server i and compares hashes; every one must be
 * there byte-exact. */
static void
check_values_on(int i, const tval *v, size_t n)
{
	size_t maxlen = 0;
	for (size_t k = 0; k < n; k++)
		maxlen = v[k].len > maxlen ? v[k].len : maxlen;
	uint8_t *want = bufs[0] = malloc(maxlen ? maxlen : 1);
	assert_non_null(want);
	for (size_t k = 0; k < n; k++) {
		uint8_t *got = NULL;
		size_t glen = 0;
		int rv = raw_get(i, v[k].key, &got, &glen);
		fill_value(want, v[k].len, v[k].seed);
		uint64_t hw = hash64(want, v[k].len), hg = rv == 0 ? hash64(got, glen) : 0;
		bool ok = rv == 0 && glen == v[k].len && hg == hw && memcmp(got, want, glen) == 0;
		free(got);
		KV_TC_ASSERT(&tc, ok,
		             "%s on server %d: %s, %zu bytes (want %zu), hash %016llx (want "
		             "%016llx)",
		             v[k].key, i, kv_errname(rv), glen, v[k].len, (unsigned long long)hg,
		             (unsigned long long)hw);
	}
	free(want);
	bufs[0] = NULL;
}

/* Every key must be refused by server i as not its own. */
static void
check_not_served_by(int i, const tval *v, size_t n)
{
	for (size_t k = 0; k < n; k++) {
		uint8_t *got = NULL;
		size_t glen = 0;
		int rv = raw_get(i, v[k].key, &got, &glen);
		free(got);
		KV_TC_ASSERT(&tc, rv == KV_EWRONGOWNER, "%s on server %d: %s, want EWRONGOWNER",
		             v[k].key, i, kv_errname(rv));
	}
}

/* ------------------------------------------------------------------------
 * Memory of the servers
 * ------------------------------------------------------------------------ */

/* Returns a "Vm...:" field of /proc/PID/status in KiB, or -1. */
static long
proc_kib(pid_t pid, const char *field)
{
	char path[64], line[256];
	long v = -1;
	size_t fl = strlen(field);
	snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
	FILE *f = fopen(path, "r");
	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strncmp(line, field, fl) == 0 && line[fl] == ':') {
			v = strtol(line + fl + 1, NULL, 10);
			break;
		}
	fclose(f);
	return v;
}

/* Resets VmHWM to the current RSS (Linux >= 4.0). Returns whether it did. */
static bool
reset_hwm(pid_t pid)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/clear_refs", (int)pid);
	FILE *f = fopen(path, "w");
	if (f == NULL)
		return false;
	bool ok = fputs("5", f) >= 0;
	return fclose(f) == 0 && ok;
}

/* Samples VmRSS of the two servers until stopped, keeping the maximum. */
typedef struct {
	pid_t pid[2];
	long max_kib[2];
	atomic_bool stop;
} rss_sampler;

static void *
rss_main(void *arg)
{
	rss_sampler *r = arg;
	while (!atomic_load(&r->stop)) {
		for (int i = 0; i < 2; i++) {
			long v = proc_kib(r->pid[i], "VmRSS");
			if (v > r->max_kib[i])
				r->max_kib[i] = v;
		}
		kv_test_sleep_ms(2);
	}
	return NULL;
}

/* ------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------ */

/* Returns the value of "name=N" in the last line of server i's log that
 * contains `what`, or -1. */
static long long
log_field(int i, const char *what, const char *name)
{
	char line[2048];
	long long v = -1;
	FILE *f = fopen(tc.srv[i].log, "r");
	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		const char *p;
		if (strstr(line, what) && (p = strstr(line, name)) != NULL &&
		    p[strlen(name)] == '=')
			v = strtoll(p + strlen(name) + 1, NULL, 10);
	}
	fclose(f);
	return v;
}

static void
a_64mib_value_moves_in_slices_and_reads_back_byte_exact(void **state)
{
	/* Around the budget of one transfer message (1 MiB), and far above. */
	const size_t big[] = {MIB, MIB + 7, 3 * MIB + MIB / 2, BIG};
	tval v[2 * SMALL_KEYS + 4];
	size_t n = make_values(v, 2 * SMALL_KEYS + 4, big, 4);
	shardkv_client *cl = kv_tc_client(&tc, false, CLIENT_MS);
	(void)state;

	assert_non_null(cl);
	move_range(0, 0, SHARDKV_WAIT);
	for (size_t k = 0; k < n; k++)
		put_value(cl, &v[k]);
	check_values_on(0, v, n);

	/* Memory before the move, then the peak during it. */
	rss_sampler rs = {.pid = {tc.srv[0].pid, tc.srv[1].pid}};
	long before[2], hwm[2];
	bool hwm_ok = true;
	for (int i = 0; i < 2; i++) {
		hwm_ok = reset_hwm(rs.pid[i]) && hwm_ok;
		before[i] = proc_kib(rs.pid[i], "VmRSS");
		rs.max_kib[i] = before[i];
	}
	pthread_t thr;
	assert_int_equal(pthread_create(&thr, NULL, rss_main, &rs), 0);
	uint64_t t0 = kv_test_now_ms();
	move_range(1, 0, SHARDKV_WAIT);
	uint64_t ms = kv_test_now_ms() - t0;
	atomic_store(&rs.stop, true);
	pthread_join(thr, NULL);
	for (int i = 0; i < 2; i++)
		hwm[i] = proc_kib(rs.pid[i], "VmHWM");
	printf("move of %zu keys incl. a 64 MiB value: %llu ms\n", n, (unsigned long long)ms);
	for (int i = 0; i < 2; i++)
		printf("%s: VmRSS before %ld KiB, sampled peak +%ld KiB, VmHWM%s +%ld KiB\n",
		       i == 0 ? "source     " : "destination", before[i], rs.max_kib[i] - before[i],
		       hwm_ok ? "" : " (not reset)", hwm[i] - before[i]);
	fflush(stdout);

	check_values_on(1, v, n);
	check_not_served_by(0, v, n);
	/* Through the library too (routed by the new configuration). */
	shardkv_buf got = {0};
	KV_TC_EXPECT(&tc, 0,
	             shardkv_get(cl, v[SMALL_KEYS + 3].key, strlen(v[SMALL_KEYS + 3].key), &got));
	assert_int_equal(got.len, BIG);
	shardkv_free(got.data);
	/* The destination assembled every value over the budget from slices. */
	long long split = log_field(1, "incoming range committed", "split_chunk_values");
	KV_TC_ASSERT(&tc, split == 3, "destination assembled %lld split values, want 3", split);
	/*
	 * Bound: the destination holds the value being assembled, the store's
	 * copy and the write-ahead log's copy of the record until it is
	 * written; the source the value being sliced. About one more value's
	 * worth is left for allocator slack and the messages in flight.
	 */
	if (hwm_ok && !SANITIZED)
		for (int i = 0; i < 2; i++)
			KV_TC_ASSERT(&tc, hwm[i] - before[i] < (long)(4 * BIG / 1024),
			             "server %d grew by %ld KiB during the move", i,
			             hwm[i] - before[i]);
	shardkv_close(cl);
}

/* Returns the phase of the migration in flight (static), or NULL. */
static const char *
migration_phase(void)
{
	shardkv_config *st = NULL;
	const char *ph = NULL;
	if (shardkv_status(tc.admin, &st) == 0 && st->nmigrations > 0)
		ph = st->migrations[0].phase;
	shardkv_config_free(st);
	return ph;
}

static void
a_20mib_write_during_the_copy_travels_as_sliced_deltas(void **state)
{
	const size_t big[] = {40 * MIB, 2 * MIB + 5};
	tval v[2 * SMALL_KEYS + 3];
	size_t n = make_values(v, 2 * SMALL_KEYS + 3, big, 2);
	shardkv_client *cl = kv_tc_client(&tc, false, CLIENT_MS);
	(void)state;

	assert_non_null(cl);
	move_range(0, 0, SHARDKV_WAIT);
	for (size_t k = 0; k < n; k++)
		put_value(cl, &v[k]);

	/* About 8 s of copy at 5 MB/s; the writes land in its first second. */
	move_range(1, 5, 0);
	uint64_t t0 = kv_test_now_ms();
	const char *ph;
	while ((ph = migration_phase()) == NULL || strcmp(ph, "copying") != 0) {
		KV_TC_ASSERT(&tc, kv_test_now_ms() - t0 < KV_TC_READY_MS,
		             "the migration is not copying (phase %s)", ph ? ph : "none");
		kv_test_sleep_ms(10);
	}
	/* A new 20 MiB key, a big value replaced, a small one replaced. */
	v[n] = (tval){.len = 20 * MIB, .seed = 1000};
	snprintf(v[n].key, sizeof(v[n].key), RANGE_LO "n-delta");
	n++;
	v[SMALL_KEYS + 1].seed = 2000;
	v[SMALL_KEYS + 1].len = 3 * MIB + 1;
	v[5].seed = 3000;
	put_value(cl, &v[n - 1]);
	put_value(cl, &v[SMALL_KEYS + 1]);
	put_value(cl, &v[5]);
	ph = migration_phase();
	KV_TC_ASSERT(&tc, ph && strcmp(ph, "copying") == 0,
	             "the copy ended before the writes (phase %s): raise the value or lower "
	             "the rate",
	             ph ? ph : "none");
	KV_TC_ASSERT(&tc, kv_tc_wait_settled(&tc, MOVE_MS) == 0, "the move did not finish");

	check_values_on(1, v, n);
	check_not_served_by(0, v, n);
	long long sd = log_field(1, "incoming range committed", "split_delta_values");
	long long sc = log_field(1, "incoming range committed", "split_chunk_values");
	KV_TC_ASSERT(&tc, sd == 2 && sc >= 1,
	             "destination assembled %lld split delta values (want 2) and %lld split "
	             "chunk values",
	             sd, sc);
	shardkv_close(cl);
}

/* ------------------------------------------------------------------------
 * Hand-made transfer streams
 * ------------------------------------------------------------------------ */

#define MIG_ID 0x7e57000000000001ull /* never used by the controller in a test */

/* The stream being sent to server 1 (index 1). */
static struct {
	uint64_t epoch; /* the migration's epoch */
	uint64_t seq;   /* last seq the destination acknowledged */
	char err[256];  /* error text of the last answer */
} st;

/* Sends one transfer message to server 1 and returns the envelope status
 * when the request was refused whole, else the ack's status; st.err holds
 * the detail. */
static int
xfer(kv_xfer *x)
{
	nng_msg *req, *rep;
	int rv;

	x->migration_id = MIG_ID;
	assert_int_equal(kv_xfer_encode(x, st.epoch, tc.srv[0].id, (kv_bytes){0}, &req), 0);
	assert_int_equal(kv_rpc_call(raw_client(1), req, &rep, RAW_MS), 0);
	Shardkv__Response *r = shardkv__response__unpack(NULL, nng_msg_len(rep), nng_msg_body(rep));
	nng_msg_free(rep);
	assert_non_null(r);
	st.err[0] = 0;
	if (r->status != SHARDKV__STATUS__STATUS_OK) {
		rv = kv_err_from_wire(r->status);
		snprintf(st.err, sizeof(st.err), "%s", r->error ? r->error : "");
	} else {
		assert_non_null(r->transfer_ack);
		rv = kv_err_from_wire(r->transfer_ack->status);
		snprintf(st.err, sizeof(st.err), "%s",
		         r->transfer_ack->error ? r->transfer_ack->error : "");
		st.seq = r->transfer_ack->seq;
	}
	shardkv__response__free_unpacked(r, NULL);
	return rv;
}

/* A chunk at the next seq with one entry: key, bytes [off, off + len) of
 * val, total (0: whole). */
static int
chunk1(const char *key, const uint8_t *val, uint64_t off, size_t len, uint64_t total, bool last)
{
	kv_xfer_kv kv = {.key = {(const uint8_t *)key, strlen(key)},
	                 .value = {val + off, len},
	                 .value_offset = off,
	                 .value_total = total};
	kv_xfer x = {.seq = st.seq + 1, .kind = KV_XFER_CHUNK, .nkv = 1, .kv = &kv, .last = last};
	return xfer(&x);
}

/* Expects `rv` to be `want` with `why` in the detail. */
#define EXPECT_REFUSED(rv, want, why)                                                              \
	do {                                                                                       \
		int r_ = (rv);                                                                     \
		KV_TC_ASSERT(&tc, r_ == (want) && strstr(st.err, (why)) != NULL,                   \
		             "line %d: got %s \"%s\", want %s \"%s\"", __LINE__, kv_errname(r_),   \
		             st.err, kv_errname(want), (why));                                     \
	} while (0)

static void
malformed_slice_sequences_are_refused_and_a_resent_slice_is_harmless(void **state)
{
	const size_t vsize = 3 * MIB + 10, bsize = 5 * MIB;
	uint8_t *val = bufs[0] = malloc(vsize), *big = bufs[1] = calloc(1, bsize);
	(void)state;

	assert_non_null(val);
	assert_non_null(big);
	fill_value(val, vsize, 77);
	move_range(0, 0, SHARDKV_WAIT);
	shardkv_config *cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	st.epoch = cfg->epoch;
	shardkv_config_free(cfg);

	/* Server 1 takes a stream for a range server 0 serves (as a source would
	 * open it); BUSY until it has applied the epoch. */
	kv_xfer b = {.seq = 1,
	             .kind = KV_XFER_BEGIN,
	             .epoch = st.epoch,
	             .start = {(const uint8_t *)RANGE_LO, strlen(RANGE_LO)},
	             .end = {(const uint8_t *)RANGE_HI, strlen(RANGE_HI)},
	             .from_node = tc.srv[0].id,
	             .to_node = tc.srv[1].id};
	uint64_t t0 = kv_test_now_ms();
	int rv;
	while ((rv = xfer(&b)) == KV_EBUSY && kv_test_now_ms() - t0 < KV_TC_READY_MS)
		kv_test_sleep_ms(20);
	KV_TC_ASSERT(&tc, rv == 0 && st.seq == 1, "begin: %s %s", kv_errname(rv), st.err);

	const char *k1 = RANGE_LO "k1", *k2 = RANGE_LO "k2";
	size_t tot = 10;
	/* Not from offset 0. */
	EXPECT_REFUSED(chunk1(k1, val, 4, 6, tot, false), KV_EPROTO, "offset 0");
	/* A gap; the partial value is dropped, so the next slice has nothing to continue. */
	assert_int_equal(chunk1(k1, val, 0, 4, tot, false), 0);
	EXPECT_REFUSED(chunk1(k1, val, 5, 5, tot, false), KV_EPROTO, "not contiguous");
	EXPECT_REFUSED(chunk1(k1, val, 4, 6, tot, false), KV_EPROTO, "offset 0");
	/* The total changes. */
	assert_int_equal(chunk1(k1, val, 0, 4, tot, false), 0);
	EXPECT_REFUSED(chunk1(k1, val, 4, 6, tot + 1, false), KV_EPROTO, "value_total differs");
	/* Another key, then a whole entry, before the value is complete. */
	assert_int_equal(chunk1(k1, val, 0, 4, tot, false), 0);
	EXPECT_REFUSED(chunk1(k2, val, 4, 6, tot, false), KV_EPROTO, "interleaved");
	assert_int_equal(chunk1(k1, val, 0, 4, tot, false), 0);
	EXPECT_REFUSED(chunk1(k2, val, 0, 4, 0, false), KV_EPROTO, "interleaved");
	/* Over this server's --max-value (4 MiB), then over the hard limit. */
	EXPECT_REFUSED(chunk1(k1, big, 0, MIB, bsize, false), KV_EPROTO, "max value");
	EXPECT_REFUSED(chunk1(k1, big, 0, MIB, BIG + 1, false), KV_EINVAL, "slice");
	/* An empty slice; a slice past its total. */
	EXPECT_REFUSED(chunk1(k1, val, 0, 0, tot, false), KV_EINVAL, "slice");
	EXPECT_REFUSED(chunk1(k1, val, 8, 4, tot, false), KV_EINVAL, "slice");
	/* The copy ends, or the fence comes, inside a value. */
	EXPECT_REFUSED(chunk1(k1, val, 0, 4, tot, true), KV_EPROTO, "ended inside");
	assert_int_equal(chunk1(k1, val, 0, 4, tot, false), 0);
	kv_xfer f = {.seq = st.seq + 1, .kind = KV_XFER_FENCE};
	EXPECT_REFUSED(xfer(&f), KV_EPROTO, "incomplete at the fence");
	/* Deltas: a split delete; dedup before the last slice; a chunk value
	 * continued by a delta record. */
	kv_xfer_delta d[2] = {{.seq = 9,
	                       .del = true,
	                       .key = {(const uint8_t *)k1, strlen(k1)},
	                       .value = {val, 4},
	                       .value_total = tot}};
	kv_xfer dx = {.seq = st.seq + 1, .kind = KV_XFER_DELTA, .ndelta = 1, .delta = d};
	EXPECT_REFUSED(xfer(&dx), KV_EPROTO, "delete");
	d[0].del = false;
	d[0].has_dedup = true;
	d[0].dedup = (kv_xfer_dedup){.client_id = 5, .request_id = 6, .key = d[0].key};
	dx.seq = st.seq + 1;
	EXPECT_REFUSED(xfer(&dx), KV_EPROTO, "dedup");
	d[0].has_dedup = false;
	assert_int_equal(chunk1(k1, val, 0, 4, tot, false), 0);
	d[0].value_offset = 4;
	d[0].value = (kv_bytes){val + 4, 6};
	dx.seq = st.seq + 1;
	EXPECT_REFUSED(xfer(&dx), KV_EPROTO, "interleaved");
	/* After all that, the server still serves its own keys. */
	shardkv_client *cl = kv_tc_client(&tc, false, CLIENT_MS);
	assert_non_null(cl);
	KV_TC_EXPECT(&tc, 0, shardkv_put(cl, "other", 5, "x", 1));
	shardkv_close(cl);

	/*
	 * A valid stream with a resend: k1 (3 MiB + 10) in four chunk slices,
	 * the second one sent twice (as after a lost ack: the duplicate seq is
	 * acknowledged, not applied, so the offsets still line up); then k2 as
	 * a delta put in two slices, dedup on the last, also with a resend.
	 */
	tot = vsize;
	uint64_t off = 0;
	for (int p = 0; off < tot; p++) {
		size_t len = tot - off < MIB ? tot - off : MIB;
		assert_int_equal(chunk1(k1, val, off, len, tot, false), 0);
		if (p == 1) {
			kv_xfer_kv kv = {.key = {(const uint8_t *)k1, strlen(k1)},
			                 .value = {val + off, len},
			                 .value_offset = off,
			                 .value_total = tot};
			kv_xfer dup = {.seq = st.seq, .kind = KV_XFER_CHUNK, .nkv = 1, .kv = &kv};
			uint64_t acked = st.seq;
			assert_int_equal(xfer(&dup), 0);
			assert_int_equal(st.seq, acked);
		}
		off += len;
	}
	kv_xfer last = {.seq = st.seq + 1, .kind = KV_XFER_CHUNK, .last = true};
	assert_int_equal(xfer(&last), 0);
	d[0] = (kv_xfer_delta){.seq = 10,
	                       .key = {(const uint8_t *)k2, strlen(k2)},
	                       .value = {val, 2 * MIB},
	                       .value_total = 3 * MIB};
	d[1] = (kv_xfer_delta){.seq = 10,
	                       .key = {(const uint8_t *)k2, strlen(k2)},
	                       .value = {val + 2 * MIB, MIB},
	                       .value_offset = 2 * MIB,
	                       .value_total = 3 * MIB};
	dx = (kv_xfer){.seq = st.seq + 1, .kind = KV_XFER_DELTA, .ndelta = 1, .delta = &d[0]};
	assert_int_equal(xfer(&dx), 0);
	assert_int_equal(xfer(&dx), 0); /* duplicate */
	d[1].has_dedup = true;
	d[1].dedup = (kv_xfer_dedup){.client_id = 5, .request_id = 6, .key = d[1].key};
	dx = (kv_xfer){.seq = st.seq + 1, .kind = KV_XFER_DELTA, .ndelta = 1, .delta = &d[1]};
	assert_int_equal(xfer(&dx), 0);
	f.seq = st.seq + 1;
	assert_int_equal(xfer(&f), 0);
	/* Commit: server 1 now serves the range (the controller does not know:
	 * the cluster is thrown away after this test). */
	kv_xfer c = {.seq = st.seq + 1, .kind = KV_XFER_COMMIT, .epoch = st.epoch};
	assert_int_equal(xfer(&c), 0);
	uint8_t *got = NULL;
	size_t glen = 0;
	assert_int_equal(raw_get(1, k1, &got, &glen), 0);
	KV_TC_ASSERT(&tc, glen == tot && memcmp(got, val, tot) == 0, "k1 reassembled wrong");
	free(got);
	assert_int_equal(raw_get(1, k2, &got, &glen), 0);
	KV_TC_ASSERT(&tc, glen == 3 * MIB && memcmp(got, val, glen) == 0, "k2 reassembled wrong");
	free(got);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(a_64mib_value_moves_in_slices_and_reads_back_byte_exact,
	                                    setup_big, teardown),
	    cmocka_unit_test_setup_teardown(a_20mib_write_during_the_copy_travels_as_sliced_deltas,
	                                    setup_big, teardown),
	    cmocka_unit_test_setup_teardown(
	        malformed_slice_sequences_are_refused_and_a_resent_slice_is_harmless, setup_small,
	        teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
