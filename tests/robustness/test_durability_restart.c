/*
 * test_durability_restart.c - crash safety of the shard server's write-ahead
 * log, snapshots and recovery, with real daemons killed with SIGKILL:
 *
 * - writers that record what was acknowledged keep running while servers
 *   are killed at random moments and restarted from their data dirs, in
 *   --fsync always and batch modes; every acknowledged put reads back with
 *   its last acknowledged (or a later unacknowledged) value, every
 *   acknowledged append token is present exactly once, and no token is
 *   present twice;
 * - a restarted server keeps its node id, its ranges and its data byte for
 *   byte (a 4 MiB value; deleted keys stay deleted);
 * - kills while a snapshot is being written, and while a rate-limited
 *   migration copies (the source, then the destination), lose nothing, nor
 *   does a kill of the destination once it serves the range;
 * - a corrupt record in the middle of the log stops the server with a
 *   message naming the file and the offset, --wal-truncate-corrupt cuts the
 *   log there, and a torn tail is dropped with a warning.
 *
 * Random choices (which server, when) come from a seed printed at the start;
 * KV_TEST_SEED=N repeats a run.
 */
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#define NCOUNT (KV_TC_MAX_SERVERS + 2)

static kv_tc tc;
static unsigned seed;   /* the run's seed (main thread's choices) */
static unsigned rstate; /* rand_r state of the main thread */

static unsigned
rnd(unsigned n)
{
	return (unsigned)rand_r(&rstate) % n;
}

/* ---------------------------------------------------------------------------
 * Writers: threads that put unique values and append unique tokens and record
 * what was acknowledged.
 *
 * Writer t owns NPUT put keys and NAPP append keys, split between two key
 * prefixes (pfx[0] for even k, pfx[1] for odd k). Every op gets the next
 * sequence number s of its writer: the put of s writes "w<t>-p<k>-s<s>|"
 * followed by filler that depends on s (so a value is checked byte for
 * byte), the append of s appends the token "w<t>.<s>;". Puts wait out any
 * restart (a long deadline), so that an unacknowledged put never lands after
 * a later acknowledged one; the appends of odd writers have a short deadline,
 * so some of them give up while a server is down: unacknowledged tokens that
 * may or may not be there, but never twice.
 * ------------------------------------------------------------------------- */

#define NWRITERS          4
#define NPUT              40
#define NAPP              8
#define MAXSEQ            400000u
#define WRITER_TIMEOUT_MS 30000u /* longer than any kill + restart */
#define SHORT_TIMEOUT_MS  250u   /* odd writers' appends: some give up during a restart */

typedef struct {
	int t;
	const char *pfx[2];
	shardkv_client *cl;     /* puts (and even writers' appends) */
	shardkv_client *cl_app; /* appends: odd writers give up early, unacknowledged */
	pthread_t thr;
	bool started;
	unsigned rs;
	uint32_t seq;             /* last sequence number used */
	uint32_t put_acked[NPUT]; /* seq of the last acknowledged put of key k; 0: none */
	uint32_t put_tried[NPUT]; /* seq of the last put tried on key k; 0: none */
	uint8_t *tok;             /* per seq: 0 not an append, 1 tried, 2 acknowledged */
	uint8_t *tok_key;         /* per seq: the append key */
	atomic_uint acked;        /* acknowledged ops */
	atomic_uint failed;       /* failed ops */
	char firstfail[256];      /* the first failure */
} writer;

static writer W[NWRITERS];
static atomic_bool writers_stop;
static int nwriters; /* started */

static size_t
put_key(char *buf, size_t len, const writer *w, unsigned k)
{
	return (size_t)snprintf(buf, len, "%sw%d-p%02u", w->pfx[k % 2], w->t, k);
}

static size_t
app_key(char *buf, size_t len, const writer *w, unsigned k)
{
	return (size_t)snprintf(buf, len, "%sw%d-a%02u", w->pfx[k % 2], w->t, k);
}

/* The value of put s of writer t to key k: 16 .. 2000 bytes. */
static size_t
put_value(char *buf, size_t len, int t, unsigned k, uint32_t s)
{
	size_t n = (size_t)snprintf(buf, len, "w%d-p%u-s%u|", t, k, s);
	size_t want = 16 + (size_t)(s * 7919u % 1985u);

	while (n < want && n + 1 < len) {
		buf[n] = (char)('a' + (s + n) % 26);
		n++;
	}
	buf[n] = 0;
	return n;
}

static void *
writer_main(void *arg)
{
	writer *w = arg;
	char key[64], val[2100];

	while (!atomic_load(&writers_stop) && w->seq + 1 < MAXSEQ) {
		uint32_t s = ++w->seq;
		unsigned r = (unsigned)rand_r(&w->rs);
		int rv;

		if (r % 4 == 0) {
			unsigned k = (r / 4) % NAPP;
			size_t kl = app_key(key, sizeof(key), w, k);
			size_t vl = (size_t)snprintf(val, sizeof(val), "w%d.%u;", w->t, s);
			w->tok[s] = 1;
			w->tok_key[s] = (uint8_t)k;
			rv = shardkv_append(w->cl_app, key, kl, val, vl, NULL);
			if (rv == 0)
				w->tok[s] = 2;
		} else {
			unsigned k = (r / 4) % NPUT;
			size_t kl = put_key(key, sizeof(key), w, k);
			size_t vl = put_value(val, sizeof(val), w->t, k, s);
			w->put_tried[k] = s;
			rv = shardkv_put(w->cl, key, kl, val, vl);
			if (rv == 0)
				w->put_acked[k] = s;
		}
		if (rv == 0) {
			atomic_fetch_add(&w->acked, 1);
		} else {
			if (atomic_fetch_add(&w->failed, 1) == 0)
				snprintf(w->firstfail, sizeof(w->firstfail), "op %u: %s (%s)", s,
				         shardkv_strerror(rv), shardkv_errmsg());
		}
	}
	return NULL;
}

/* Starts NWRITERS writers on keys under pfx0 (even keys) and pfx1 (odd). */
static void
start_writers(const char *pfx0, const char *pfx1)
{
	atomic_store(&writers_stop, false);
	for (int t = 0; t < NWRITERS; t++) {
		writer *w = &W[t];
		memset(w, 0, sizeof(*w));
		w->t = t;
		w->pfx[0] = pfx0;
		w->pfx[1] = pfx1;
		w->rs = seed * 31u + (unsigned)t;
		w->tok = calloc(MAXSEQ, 1);
		w->tok_key = calloc(MAXSEQ, 1);
		w->cl = kv_tc_client(&tc, false, WRITER_TIMEOUT_MS);
		w->cl_app = t % 2 ? kv_tc_client(&tc, false, SHORT_TIMEOUT_MS) : w->cl;
		assert_non_null(w->tok);
		assert_non_null(w->cl_app);
		assert_non_null(w->tok_key);
		assert_non_null(w->cl);
		assert_int_equal(pthread_create(&w->thr, NULL, writer_main, w), 0);
		w->started = true;
		nwriters = t + 1;
	}
}

/* Stops and joins the writers (keeps what they recorded). */
static void
stop_writers(void)
{
	atomic_store(&writers_stop, true);
	for (int t = 0; t < nwriters; t++)
		if (W[t].started) {
			pthread_join(W[t].thr, NULL);
			W[t].started = false;
		}
}

/* Frees the writers' state (after stop_writers). */
static void
free_writers(void)
{
	stop_writers();
	for (int t = 0; t < nwriters; t++) {
		if (W[t].cl_app != W[t].cl)
			shardkv_close(W[t].cl_app);
		shardkv_close(W[t].cl);
		free(W[t].tok);
		free(W[t].tok_key);
		memset(&W[t], 0, sizeof(W[t]));
	}
	nwriters = 0;
}

static unsigned
writers_acked(void)
{
	unsigned n = 0;
	for (int t = 0; t < nwriters; t++)
		n += atomic_load(&W[t].acked);
	return n;
}

/* Waits until the writers acknowledged `more` ops beyond what they had. */
static void
wait_writers_progress(unsigned more, const char *when)
{
	unsigned base = writers_acked();
	uint64_t t0 = kv_test_now_ms();

	while (writers_acked() < base + more) {
		if (kv_test_now_ms() - t0 > KV_TC_READY_MS) {
			kv_tc_dump_logs(&tc, 40);
			fail_msg("%s: the writers acknowledged only %u of %u ops in %u ms (first "
			         "failure of writer 0: %s)",
			         when, writers_acked() - base, more, KV_TC_READY_MS,
			         W[0].firstfail[0] ? W[0].firstfail : "none");
		}
		kv_test_sleep_ms(10);
	}
}

/* Appends a problem to msg (the first few are kept). */
static void problem(char *msg, size_t len, long *bad, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void
problem(char *msg, size_t len, long *bad, const char *fmt, ...)
{
	va_list ap;
	size_t n = strlen(msg);

	if ((*bad)++ < 4 && n + 2 < len) {
		va_start(ap, fmt);
		vsnprintf(msg + n, len - n, fmt, ap);
		va_end(ap);
		n = strlen(msg);
		if (n + 2 < len)
			strcat(msg, "; ");
	}
}

/*
 * Checks what writer w recorded against the cluster through cl. Returns the
 * number of problems (described in msg); *present counts the keys found.
 */
static long
verify_writer(shardkv_client *cl, const writer *w, char *msg, size_t len, unsigned *present)
{
	char key[64], want[2100];
	uint8_t *count = calloc(MAXSEQ, 1);
	long bad = 0;

	assert_non_null(count);
	for (unsigned k = 0; k < NPUT; k++) {
		shardkv_buf v = {0};
		size_t kl = put_key(key, sizeof(key), w, k);
		int rv = shardkv_get(cl, key, kl, &v);
		if (rv == SHARDKV_ENOTFOUND) {
			if (w->put_acked[k] != 0)
				problem(msg, len, &bad, "%s is missing; put s%u was acknowledged",
				        key, w->put_acked[k]);
			continue;
		}
		if (rv != 0) {
			problem(msg, len, &bad, "get %s: %s (%s)", key, shardkv_strerror(rv),
			        shardkv_errmsg());
			continue;
		}
		(*present)++;
		int t = -1;
		unsigned kk = 0, s = 0;
		if (sscanf((const char *)v.data, "w%d-p%u-s%u|", &t, &kk, &s) != 3 || t != w->t ||
		    kk != k) {
			problem(msg, len, &bad, "%s holds a foreign value '%.40s'", key,
			        (const char *)v.data);
		} else if (s < w->put_acked[k] || s > w->put_tried[k]) {
			problem(
			    msg, len, &bad,
			    "%s holds put s%u; the last acknowledged is s%u, the last tried s%u",
			    key, s, w->put_acked[k], w->put_tried[k]);
		} else {
			size_t wl = put_value(want, sizeof(want), w->t, k, s);
			if (v.len != wl || memcmp(v.data, want, wl) != 0)
				problem(msg, len, &bad,
				        "%s: the value of put s%u is damaged (%zu bytes, want %zu)",
				        key, s, v.len, wl);
		}
		shardkv_free(v.data);
	}
	for (unsigned k = 0; k < NAPP; k++) {
		shardkv_buf v = {0};
		size_t kl = app_key(key, sizeof(key), w, k);
		int rv = shardkv_get(cl, key, kl, &v);
		if (rv == SHARDKV_ENOTFOUND)
			continue; /* acknowledged tokens are checked below */
		if (rv != 0) {
			problem(msg, len, &bad, "get %s: %s (%s)", key, shardkv_strerror(rv),
			        shardkv_errmsg());
			continue;
		}
		(*present)++;
		const char *p = (const char *)v.data, *end = p + v.len;
		while (p < end) {
			const char *semi = memchr(p, ';', (size_t)(end - p));
			int t = -1;
			unsigned s = 0;
			if (semi == NULL || sscanf(p, "w%d.%u;", &t, &s) != 2 || t != w->t ||
			    s == 0 || s >= MAXSEQ) {
				problem(msg, len, &bad, "%s: unparsable token at byte %zu", key,
				        (size_t)(p - (const char *)v.data));
				break;
			}
			if (w->tok[s] == 0 || w->tok_key[s] != k)
				problem(msg, len, &bad,
				        "%s holds token s%u that was never appended to it", key, s);
			else if (count[s]++ == 1)
				problem(msg, len, &bad, "%s holds token s%u twice (%s)", key, s,
				        w->tok[s] == 2 ? "acknowledged" : "unacknowledged");
			p = semi + 1;
		}
		shardkv_free(v.data);
	}
	for (uint32_t s = 1; s <= w->seq && s < MAXSEQ; s++)
		if (w->tok[s] == 2 && count[s] == 0) {
			app_key(key, sizeof(key), w, w->tok_key[s]);
			problem(msg, len, &bad, "acknowledged token s%u is missing from %s", s,
			        key);
		}
	free(count);
	return bad;
}

/* Verifies every writer; fails the test with the problems. Returns the
 * number of writer keys present. */
static unsigned
verify_writers(const char *when)
{
	shardkv_client *cl = kv_tc_client(&tc, true, 20000);
	unsigned present = 0, acked = 0, failed = 0;
	char msg[2048] = "";
	long bad = 0;

	assert_non_null(cl);
	for (int t = 0; t < nwriters; t++) {
		bad += verify_writer(cl, &W[t], msg, sizeof(msg), &present);
		acked += atomic_load(&W[t].acked);
		failed += atomic_load(&W[t].failed);
	}
	shardkv_close(cl);
	KV_TC_ASSERT(&tc, bad == 0, "%s: %ld problems in what the writers recorded: %s", when, bad,
	             msg);
	printf("    %s: %u ops acknowledged, %u failed, %u keys checked\n", when, acked, failed,
	       present);
	return present;
}

/* ---------------------------------------------------------------------------
 * Cluster helpers
 * ------------------------------------------------------------------------- */

static int
setup_seed(void **state)
{
	const char *e = getenv("KV_TEST_SEED");
	(void)state;
	seed = e ? (unsigned)strtoul(e, NULL, 10) : (unsigned)time(NULL) ^ (unsigned)getpid();
	rstate = seed;
	printf("    seed %u (KV_TEST_SEED=%u repeats it)\n", seed, seed);
	/* One copy per range on purpose: what is checked is each server's own
	 * log, snapshots and recovery (a restarted server keeps its ranges and
	 * data). With replicas a restarted server is failed over and copied
	 * again from the new primary, which would replace what its recovery
	 * brought back; the replicated kill and restart faults are the
	 * checker's checker_replicated_* runs. */
	return kv_tc_set_controller_args(KV_TC_ONE_COPY);
}

static uint64_t t_test; /* when the running test started */

static int
setup(void **state)
{
	(void)state;
	t_test = kv_test_now_ms();
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	free_writers();
	kv_tc_destroy(&tc);
	printf("    took %llu ms\n", (unsigned long long)(kv_test_now_ms() - t_test));
	return 0;
}

/* Gives [lo, mid) to server 0 and [mid, hi) to server 1. */
static void
split_between_servers(const char *lo, const char *mid, const char *hi)
{
	char n1[16], n2[16];

	kv_tc_node_arg(&tc, 0, n1, sizeof(n1));
	kv_tc_node_arg(&tc, 1, n2, sizeof(n2));
	KV_TC_EXPECT(
	    &tc, 0,
	    shardkv_move(tc.admin, lo, strlen(lo), mid, strlen(mid), n1, 0, SHARDKV_WAIT, NULL));
	KV_TC_EXPECT(
	    &tc, 0,
	    shardkv_move(tc.admin, mid, strlen(mid), hi, strlen(hi), n2, 0, SHARDKV_WAIT, NULL));
}

/* SIGKILLs server i. */
static void
kill9(int i)
{
	int st = 0;
	KV_TC_ASSERT(&tc, kv_tc_stop_server(&tc, i, SIGKILL, KV_TC_STOP_MS, &st) == 0,
	             "server %d did not die of SIGKILL", i);
	KV_TC_ASSERT(&tc, WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
	             "server %d ended with status 0x%x before the SIGKILL", i, st);
}

/* Restarts server i from its data dir (no --join) and waits until it serves. */
static void
restart(int i)
{
	KV_TC_ASSERT(&tc, kv_tc_restart_server(&tc, i, false) == 0, "cannot restart server %d", i);
	KV_TC_ASSERT(&tc, kv_tc_wait_serving(&tc, i, KV_TC_READY_MS) == 0,
	             "server %d does not serve after its restart", i);
}

/* ---------------------------------------------------------------------------
 * Kill -9 under load
 * ------------------------------------------------------------------------- */

#define KILL_CYCLES 10

static void
kill_cycles_in_mode(const char *mode)
{
	const char *args[] = {"--fsync", mode, NULL};
	uint64_t t0 = kv_test_now_ms();

	assert_int_equal(kv_tc_start_ex(&tc, "dur-kill", 2, args), 0);
	split_between_servers("d/", "d/m", "d0");
	start_writers("d/a-", "d/n-");
	wait_writers_progress(100, "before the first kill");
	for (int cycle = 0; cycle < KILL_CYCLES; cycle++) {
		int i = (int)rnd(2);
		char when[64];
		kv_test_sleep_ms(30 + rnd(400)); /* a random moment under load */
		kill9(i);
		if (rnd(2))
			kv_test_sleep_ms(rnd(300)); /* sometimes the clients find it down */
		restart(i);
		snprintf(when, sizeof(when), "%s: after kill %d (server %d)", mode, cycle + 1, i);
		wait_writers_progress(NWRITERS * 10, when);
	}
	stop_writers();
	char when[64];
	snprintf(when, sizeof(when), "--fsync %s, %d kills", mode, KILL_CYCLES);
	verify_writers(when);
	/* Everything is on disk, not only in the survivors' memory. */
	kill9(0);
	kill9(1);
	restart(0);
	restart(1);
	snprintf(when, sizeof(when), "--fsync %s, both restarted", mode);
	verify_writers(when);
	free_writers();
	kv_tc_destroy(&tc);
	printf("    --fsync %s: %llu ms\n", mode, (unsigned long long)(kv_test_now_ms() - t0));
}

static void
acknowledged_writes_survive_kill_9_in_always_and_batch_modes(void **state)
{
	(void)state;
	kill_cycles_in_mode("always");
	kill_cycles_in_mode("batch");
}

/* ---------------------------------------------------------------------------
 * Identity, ranges and data across restarts
 * ------------------------------------------------------------------------- */

#define RN      2000u
#define RVLEN   300u
#define BIG_LEN (4u * 1024u * 1024u)

/* Per key of "r/": 0 deleted, else the generation of its value. */
static unsigned rgen[RN];

static void
big_value(uint8_t *b, size_t n, unsigned salt)
{
	uint64_t x = 0x9e3779b97f4a7c15ull * (salt + 1);
	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		b[i] = (uint8_t)x; /* every byte value, zeros included */
	}
}

/* Writes generation gen to the keys i with i % every == 0; deletes the keys
 * with i % del_every == del_rem. */
static void
r_write(shardkv_client *cl, unsigned gen, unsigned every, unsigned del_every, unsigned del_rem)
{
	char k[32], v[RVLEN + 64];

	for (unsigned i = 0; i < RN; i++) {
		size_t kl = kv_tc_key(k, sizeof(k), "r/", i);
		if (i % del_every == del_rem) {
			int rv = shardkv_del(cl, k, kl, NULL);
			KV_TC_ASSERT(&tc, rv == 0 || (rv == SHARDKV_ENOTFOUND && rgen[i] == 0),
			             "del %s: %s", k, shardkv_strerror(rv));
			rgen[i] = 0;
		} else if (i % every == 0) {
			size_t vl = kv_tc_value(v, sizeof(v), gen, i, RVLEN);
			KV_TC_EXPECT(&tc, 0, shardkv_put(cl, k, kl, v, vl));
			rgen[i] = gen;
		}
	}
}

static void
r_verify(shardkv_client *cl, const uint8_t *big, const char *when)
{
	char k[32], want[RVLEN + 64];

	for (unsigned i = 0; i < RN; i++) {
		shardkv_buf v = {0};
		size_t kl = kv_tc_key(k, sizeof(k), "r/", i);
		int rv = shardkv_get(cl, k, kl, &v);
		if (rgen[i] == 0) {
			KV_TC_ASSERT(&tc, rv == SHARDKV_ENOTFOUND,
			             "%s: deleted key %s is back ('%.30s', %s)", when, k,
			             v.data ? (char *)v.data : "", shardkv_strerror(rv));
			continue;
		}
		KV_TC_ASSERT(&tc, rv == 0, "%s: get %s: %s (%s)", when, k, shardkv_strerror(rv),
		             shardkv_errmsg());
		size_t wl = kv_tc_value(want, sizeof(want), rgen[i], i, RVLEN);
		KV_TC_ASSERT(&tc, v.len == wl && memcmp(v.data, want, wl) == 0,
		             "%s: %s = '%.40s', want '%.40s'", when, k, (char *)v.data, want);
		shardkv_free(v.data);
	}
	/* The two 4 MiB values, byte for byte (one on each server). */
	const char *bk[2] = {"r/000000-big", "r/big"};
	for (int b = 0; b < 2; b++) {
		shardkv_buf v = {0};
		KV_TC_EXPECT(&tc, 0, shardkv_get(cl, bk[b], strlen(bk[b]), &v));
		KV_TC_ASSERT(&tc,
		             v.len == BIG_LEN &&
		                 memcmp(v.data, big + (size_t)b * BIG_LEN, BIG_LEN) == 0,
		             "%s: %s is not byte-exact (%zu bytes)", when, bk[b], v.len);
		shardkv_free(v.data);
	}
	/* Appends: the exact concatenation. */
	shardkv_buf v = {0};
	KV_TC_EXPECT(&tc, 0, shardkv_get(cl, "r/app", 5, &v));
	KV_TC_ASSERT(&tc, v.len == 30 && memcmp(v.data, "a0;a1;a2;a3;a4;a5;a6;a7;a8;a9;", 30) == 0,
	             "%s: r/app = '%s'", when, (char *)v.data);
	shardkv_free(v.data);
}

/* Fails unless cfg names every server with the same id, state and ranges as
 * before. */
static void
check_same_identity(const shardkv_config *before, const shardkv_config *after, const char *when)
{
	KV_TC_ASSERT(&tc, after->nnodes == before->nnodes, "%s: %zu nodes, %zu before", when,
	             after->nnodes, before->nnodes);
	for (int i = 0; i < tc.nservers; i++) {
		uint32_t id_before = 0, id_after = 0;
		int st = 0;
		for (size_t k = 0; k < before->nnodes; k++)
			if (strcmp(before->nodes[k].address, tc.srv[i].url) == 0)
				id_before = before->nodes[k].id;
		for (size_t k = 0; k < after->nnodes; k++)
			if (strcmp(after->nodes[k].address, tc.srv[i].url) == 0) {
				id_after = after->nodes[k].id;
				st = after->nodes[k].state;
			}
		KV_TC_ASSERT(&tc,
		             id_before != 0 && id_after == id_before && st == SHARDKV_NODE_ACTIVE,
		             "%s: server %d was node %u, is node %u (%s)", when, i, id_before,
		             id_after, shardkv_node_state_name(st));
		/* Its ranges, in order. */
		size_t rb = 0, ra = 0;
		for (;;) {
			while (rb < before->nranges && before->ranges[rb].node != id_before)
				rb++;
			while (ra < after->nranges && after->ranges[ra].node != id_after)
				ra++;
			if (rb == before->nranges || ra == after->nranges) {
				KV_TC_ASSERT(&tc, rb == before->nranges && ra == after->nranges,
				             "%s: node %u has a different number of ranges", when,
				             id_after);
				break;
			}
			const shardkv_range *x = &before->ranges[rb], *y = &after->ranges[ra];
			KV_TC_ASSERT(&tc,
			             x->start.len == y->start.len && x->end.len == y->end.len &&
			                 memcmp(x->start.data, y->start.data, x->start.len) == 0 &&
			                 memcmp(x->end.data, y->end.data, x->end.len) == 0,
			             "%s: node %u owned [%s, %s) before, now [%s, %s)", when,
			             id_after, (char *)x->start.data, (char *)x->end.data,
			             (char *)y->start.data, (char *)y->end.data);
			rb++;
			ra++;
		}
		/* The restarted process knew its id from its data dir at once. */
		char needle[64];
		snprintf(needle, sizeof(needle), "node_id=%u store=", id_after);
		long starts = kv_tc_count_lines(tc.srv[i].log, "listening");
		long known = kv_tc_count_lines(tc.srv[i].log, needle);
		KV_TC_ASSERT(&tc, starts >= 2 && known == starts - 1,
		             "%s: server %d started %ld times, %ld of them as node %u (want all "
		             "restarts)",
		             when, i, starts, known, id_after);
	}
}

static void
restarted_server_keeps_node_id_ranges_and_data(void **state)
{
	const char *args[] = {"--max-value", "8388608", NULL};
	int idx[2] = {0, 1};
	uint8_t *big = malloc(2 * (size_t)BIG_LEN);
	(void)state;

	assert_non_null(big);
	assert_int_equal(kv_tc_start_ex(&tc, "dur-ident", 2, args), 0);
	shardkv_client *cl = kv_tc_client(&tc, false, 20000);
	assert_non_null(cl);
	KV_TC_EXPECT(&tc, 0, kv_tc_spread(&tc, "r/", RN, idx, 2));
	memset(rgen, 0, sizeof(rgen));
	r_write(cl, 1, 1, 7, 3);
	big_value(big, 2 * (size_t)BIG_LEN, seed);
	KV_TC_EXPECT(&tc, 0, shardkv_put(cl, "r/000000-big", 12, big, BIG_LEN));
	KV_TC_EXPECT(&tc, 0, shardkv_put(cl, "r/big", 5, big + BIG_LEN, BIG_LEN));
	for (int a = 0; a < 10; a++) {
		char tok[8];
		snprintf(tok, sizeof(tok), "a%d;", a);
		KV_TC_EXPECT(&tc, 0, shardkv_append(cl, "r/app", 5, tok, 3, NULL));
	}
	r_verify(cl, big, "before any restart");
	shardkv_config *before = kv_tc_config(&tc);
	assert_non_null(before);

	/* Both servers killed at once: nothing can come back from a peer. */
	kill9(0);
	kill9(1);
	restart(0);
	restart(1);
	shardkv_config *after = kv_tc_config(&tc);
	assert_non_null(after);
	check_same_identity(before, after, "after kill -9 of both");
	shardkv_config_free(after);
	r_verify(cl, big, "after kill -9 of both");

	/* More writes and deletes, then a clean stop (SIGINT) of one and a kill of
	 * the other; a deleted key is written again and deleted again. */
	r_write(cl, 2, 3, 11, 5);
	r_write(cl, 3, 1000, 7, 3);
	int st = 0;
	KV_TC_ASSERT(&tc, kv_tc_stop_server(&tc, 0, SIGINT, KV_TC_STOP_MS, &st) == 0,
	             "server 0 did not stop on SIGINT");
	KV_TC_ASSERT(&tc, WIFEXITED(st) && WEXITSTATUS(st) == 0,
	             "server 0 ended with status 0x%x on SIGINT", st);
	kill9(1);
	restart(1);
	restart(0);
	after = kv_tc_config(&tc);
	assert_non_null(after);
	check_same_identity(before, after, "after SIGINT of one and kill -9 of the other");
	shardkv_config_free(after);
	r_verify(cl, big, "after the second restart");
	shardkv_config_free(before);
	shardkv_close(cl);
	free(big);
}

/* ---------------------------------------------------------------------------
 * Kill while a snapshot is being written
 * ------------------------------------------------------------------------- */

#define SNAP_PRELOAD 25000u /* keys per server, so that a snapshot takes a while */
#define SNAP_VLEN    120u
#define SNAP_KILLS   6

/* Whether dir holds a snap-*.tmp not named in `stale` (NUL-separated). On
 * true its name is copied to name. */
static bool
fresh_snapshot_tmp(const char *dir, const char *stale, char *name, size_t len)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	bool found = false;

	if (d == NULL)
		return false;
	while (!found && (e = readdir(d)) != NULL) {
		size_t n = strlen(e->d_name);
		if (strncmp(e->d_name, "snap-", 5) != 0 || n < 9 ||
		    strcmp(e->d_name + n - 4, ".tmp") != 0)
			continue;
		bool old = false;
		for (const char *s = stale; *s; s += strlen(s) + 1)
			old |= strcmp(s, e->d_name) == 0;
		if (!old) {
			snprintf(name, len, "%s", e->d_name);
			found = true;
		}
	}
	closedir(d);
	return found;
}

/* Lists dir's snap-*.tmp names, NUL-separated, ending with an empty one. */
static void
list_snapshot_tmps(const char *dir, char *out, size_t len)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	size_t off = 0;

	out[0] = out[1] = 0;
	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		size_t n = strlen(e->d_name);
		if (strncmp(e->d_name, "snap-", 5) == 0 && n >= 9 &&
		    strcmp(e->d_name + n - 4, ".tmp") == 0 && off + n + 2 < len) {
			memcpy(out + off, e->d_name, n + 1);
			off += n + 1;
			out[off] = 0;
		}
	}
	closedir(d);
}

/* The largest snapshot_lsn of the "recovered" lines of a server log. */
static unsigned long long
max_recovered_snapshot_lsn(const char *log)
{
	FILE *f = fopen(log, "r");
	char line[4096];
	unsigned long long best = 0;

	if (f == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL) {
		const char *p = strstr(line, "snapshot_lsn=");
		if (strstr(line, "recovered") && p) {
			unsigned long long v = strtoull(p + 13, NULL, 10);
			if (v > best)
				best = v;
		}
	}
	fclose(f);
	return best;
}

static void
kill_during_snapshot_loses_nothing(void **state)
{
	const char *args[] = {"--snapshot-bytes", "65536", NULL};
	char msg[512], tmp[128], path[600];
	int mid_snapshot = 0;
	(void)state;

	assert_int_equal(kv_tc_start_ex(&tc, "dur-snap", 2, args), 0);
	split_between_servers("d/", "d/m", "d0");
	/* Enough keys that walking the store takes a while. */
	KV_TC_EXPECT(&tc, 0,
	             kv_tc_fill(tc.admin, "d/a-pre", SNAP_PRELOAD, 1, SNAP_VLEN, msg, sizeof(msg)));
	KV_TC_EXPECT(&tc, 0,
	             kv_tc_fill(tc.admin, "d/n-pre", SNAP_PRELOAD, 1, SNAP_VLEN, msg, sizeof(msg)));
	start_writers("d/a-", "d/n-");
	wait_writers_progress(100, "before the first kill");
	for (int k = 0; k < SNAP_KILLS; k++) {
		int i = k % 2;
		char stale[4096];
		uint64_t t0 = kv_test_now_ms();
		bool seen = false;

		list_snapshot_tmps(tc.srv[i].data, stale, sizeof(stale));
		while (!(seen = fresh_snapshot_tmp(tc.srv[i].data, stale, tmp, sizeof(tmp))) &&
		       kv_test_now_ms() - t0 < KV_TC_READY_MS)
			kv_test_sleep_ms(1);
		KV_TC_ASSERT(&tc, seen,
		             "kill %d: server %d started no snapshot in %u ms (%ld written so far)",
		             k + 1, i, KV_TC_READY_MS,
		             kv_tc_count_lines(tc.srv[i].log, "snapshot written"));
		kill9(i);
		/* Killed before the commit renamed it: the snapshot was cut short. */
		snprintf(path, sizeof(path), "%s/%s", tc.srv[i].data, tmp);
		mid_snapshot += access(path, F_OK) == 0;
		restart(i);
		char when[64];
		snprintf(when, sizeof(when), "after snapshot kill %d (server %d)", k + 1, i);
		wait_writers_progress(NWRITERS * 10, when);
	}
	stop_writers();
	long written = kv_tc_count_lines(tc.srv[0].log, "snapshot written") +
	               kv_tc_count_lines(tc.srv[1].log, "snapshot written");
	unsigned long long lsn0 = max_recovered_snapshot_lsn(tc.srv[0].log);
	unsigned long long lsn1 = max_recovered_snapshot_lsn(tc.srv[1].log);
	printf("    %d of %d kills cut a snapshot short; %ld snapshots written; recovered from "
	       "snapshot lsn %llu / %llu\n",
	       mid_snapshot, SNAP_KILLS, written, lsn0, lsn1);
	KV_TC_ASSERT(&tc, mid_snapshot > 0, "no kill happened while a snapshot was being written");
	KV_TC_ASSERT(&tc, lsn0 > 1 && lsn1 > 1,
	             "a restart never loaded a snapshot (snapshot lsn %llu / %llu)", lsn0, lsn1);

	verify_writers("snapshot kills");
	long bad = kv_tc_verify(tc.admin, "d/a-pre", SNAP_PRELOAD, 1, SNAP_VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld preloaded keys of server 0 wrong: %s", bad, msg);
	bad = kv_tc_verify(tc.admin, "d/n-pre", SNAP_PRELOAD, 1, SNAP_VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld preloaded keys of server 1 wrong: %s", bad, msg);
	kill9(0);
	kill9(1);
	restart(0);
	restart(1);
	verify_writers("snapshot kills, both restarted");
	bad = kv_tc_verify(tc.admin, "d/a-pre", SNAP_PRELOAD, 1, SNAP_VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld preloaded keys wrong after the last restart: %s", bad,
	             msg);
	bad = kv_tc_verify(tc.admin, "d/n-pre", SNAP_PRELOAD, 1, SNAP_VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld preloaded keys wrong after the last restart: %s", bad,
	             msg);
}

/* ---------------------------------------------------------------------------
 * Kill during a migration
 * ------------------------------------------------------------------------- */

#define MN        20000u
#define MVLEN     256u
#define MRATE_MBS 1u

/* Waits until a migration of the range starting at `start` is copying with
 * at least min_keys keys copied and a figure different from `not` (a fresh
 * report). Returns the keys copied, or fails. */
static uint64_t
wait_copying(const char *start, uint64_t min_keys, uint64_t not, const char *when)
{
	uint64_t t0 = kv_test_now_ms();
	char last[96] = "no migration";

	while (kv_test_now_ms() - t0 < 2 * KV_TC_READY_MS) {
		shardkv_config *st = NULL;
		uint64_t got = UINT64_MAX;
		if (shardkv_status(tc.admin, &st) == 0) {
			snprintf(last, sizeof(last), "no migration");
			for (size_t i = 0; i < st->nmigrations; i++) {
				const shardkv_migration *m = &st->migrations[i];
				if (m->start.len != strlen(start) ||
				    memcmp(m->start.data, start, m->start.len) != 0)
					continue;
				snprintf(last, sizeof(last), "%s with %" PRIu64 " keys", m->phase,
				         m->keys_copied);
				if (strcmp(m->phase, "copying") == 0 &&
				    m->keys_copied >= min_keys && m->keys_copied != not )
					got = m->keys_copied;
			}
			shardkv_config_free(st);
		}
		if (got != UINT64_MAX)
			return got;
		kv_test_sleep_ms(20);
	}
	kv_tc_dump_logs(&tc, 40);
	fail_msg("%s: the migration is %s, not copying with >= %" PRIu64 " keys", when, last,
	         min_keys);
	return 0;
}

static void
kill_during_migration_loses_nothing(void **state)
{
	int idx[1] = {0};
	char msg[512], n2[16];
	shardkv_admin_result ar;
	(void)state;

	/* One copy (setup_seed): the kills land in a migration's copy. */
	assert_int_equal(kv_tc_start(&tc, "dur-mig", 2), 0);
	KV_TC_EXPECT(&tc, 0, kv_tc_spread(&tc, "m/", MN, idx, 1));
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(tc.admin, "m/", MN, 1, MVLEN, msg, sizeof(msg)));
	/* Writers inside the moving range throughout. */
	start_writers("m/x-", "m/y-");
	wait_writers_progress(50, "before the move");
	kv_tc_node_arg(&tc, 1, n2, sizeof(n2));
	uint64_t t_move = kv_test_now_ms();
	KV_TC_EXPECT(&tc, 0, shardkv_move(tc.admin, "m/", 2, "m0", 2, n2, MRATE_MBS, 0, &ar));
	KV_TC_ASSERT(&tc, ar.nmigrations == 1, "the move started %zu migrations", ar.nmigrations);

	/* The source, mid-copy. */
	uint64_t copied = wait_copying("m/", 2000, UINT64_MAX, "before killing the source");
	printf("    killing the source at %" PRIu64 " keys copied\n", copied);
	kill9(0);
	restart(0);
	wait_writers_progress(NWRITERS * 5, "after the source's restart");
	/* The destination, mid-copy again (a fresh progress report). */
	copied = wait_copying("m/", 1000, copied, "before killing the destination");
	printf("    killing the destination at %" PRIu64 " keys copied\n", copied);
	kill9(1);
	restart(1);
	wait_writers_progress(NWRITERS * 5, "after the destination's restart");

	KV_TC_ASSERT(&tc, kv_tc_wait_settled(&tc, 90000) == 0,
	             "the move did not finish after the kills");
	printf("    the move finished %llu ms after it started\n",
	       (unsigned long long)(kv_test_now_ms() - t_move));
	wait_writers_progress(NWRITERS * 5, "after the move");
	stop_writers();

	/* The destination owns the whole range ... */
	shardkv_config *cfg = kv_tc_config(&tc);
	unsigned counts[NCOUNT];
	assert_non_null(cfg);
	kv_tc_count_owners(cfg, "m/", MN, counts, NCOUNT);
	KV_TC_ASSERT(&tc, counts[tc.srv[1].id] == MN, "the destination owns %u of %u keys",
	             counts[tc.srv[1].id], MN);
	shardkv_config_free(cfg);
	/* ... every key is there with its value, writers' data included ... */
	long bad = kv_tc_verify(tc.admin, "m/", MN, 1, MVLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld keys wrong after the move: %s", bad, msg);
	unsigned present = verify_writers("migration kills");
	/* ... exactly once: the source dropped its copy ... */
	memset(counts, 0, sizeof(counts));
	counts[tc.srv[1].id] = MN + present;
	KV_TC_ASSERT(&tc, kv_tc_wait_status_counts(&tc, counts, NCOUNT, KV_TC_READY_MS) == 0,
	             "the keys are not exactly once on the destination");
	/* ... and served by the destination itself, not the source. */
	for (unsigned i = 0; i < MN; i += 997) {
		char k[32];
		size_t kl = kv_tc_key(k, sizeof(k), "m/", i);
		kv_tc_raw_result r;
		KV_TC_EXPECT(
		    &tc, 0,
		    kv_tc_raw_op(tc.srv[1].url, 0, 0, KV_TC_RAW_GET, k, kl, NULL, 0, 5000, &r));
		KV_TC_ASSERT(&tc, r.status == 0, "the destination answers %s for %s",
		             shardkv_strerror(r.status), k);
		kv_tc_raw_free(&r);
		KV_TC_EXPECT(
		    &tc, 0,
		    kv_tc_raw_op(tc.srv[0].url, 0, 0, KV_TC_RAW_GET, k, kl, NULL, 0, 5000, &r));
		KV_TC_ASSERT(&tc, r.status == SHARDKV_EWRONGOWNER, "the source answers %s for %s",
		             shardkv_strerror(r.status), k);
		kv_tc_raw_free(&r);
	}
	/* ... and kept across a kill of the destination: what the copy brought
	 * comes back from the side log its log adopted (doc/durability.md
	 * "Migrations"), or from a snapshot taken since. */
	kill9(1);
	restart(1);
	bad = kv_tc_verify(tc.admin, "m/", MN, 1, MVLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld keys wrong after the destination's restart: %s", bad, msg);
	KV_TC_ASSERT(&tc, verify_writers("after the destination's restart") == present,
	             "the writers' keys changed across the destination's restart");
}

/* ---------------------------------------------------------------------------
 * A corrupt record; a torn tail
 * ------------------------------------------------------------------------- */

#define CN 100u /* keys written one record each */

/* Finds the newest wal-*.log of dir (highest first lsn). */
static void
newest_segment(const char *dir, char *path, size_t len)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char best[64] = "";

	assert_non_null(d);
	while ((e = readdir(d)) != NULL)
		if (strncmp(e->d_name, "wal-", 4) == 0 && strlen(e->d_name) == 24 &&
		    strcmp(e->d_name + 20, ".log") == 0 && strcmp(e->d_name, best) > 0)
			snprintf(best, sizeof(best), "%s", e->d_name);
	closedir(d);
	KV_TC_ASSERT(&tc, best[0] != 0, "no wal segment in %s", dir);
	snprintf(path, len, "%s/%s", dir, best);
}

static uint8_t *
read_all(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	uint8_t *b;

	assert_non_null(f);
	assert_int_equal(fstat(fileno(f), &st), 0);
	b = malloc((size_t)st.st_size + 1);
	assert_non_null(b);
	*n = fread(b, 1, (size_t)st.st_size, f);
	fclose(f);
	assert_int_equal(*n, (size_t)st.st_size);
	return b;
}

/* Whether needle occurs in [p, p + n). */
static bool
contains(const uint8_t *p, size_t n, const char *needle)
{
	size_t m = strlen(needle);
	for (size_t i = 0; i + m <= n; i++)
		if (memcmp(p + i, needle, m) == 0)
			return true;
	return false;
}

static uint32_t
le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Walks the records of a segment (wal.h: 32-byte header, then records of a
 * 24-byte header and a payload whose length is at +8): the offset of the
 * record whose payload contains `needle` (or of the last record when needle
 * is NULL); *rlen gets its total length. Returns -1 when none. */
static long
find_record(const uint8_t *b, size_t n, const char *needle, size_t *rlen)
{
	size_t off = 32;
	long found = -1;

	while (off + 24 <= n) {
		size_t len = le32(b + off + 8);
		if (off + 24 + len > n)
			break;
		if (needle == NULL || contains(b + off + 24, len, needle)) {
			found = (long)off;
			*rlen = 24 + len;
			if (needle)
				break;
		}
		off += 24 + len;
	}
	return found;
}

static void
c_put(shardkv_client *cl, unsigned i)
{
	char k[32], v[64];
	size_t kl = kv_tc_key(k, sizeof(k), "c/", i);
	size_t vl = kv_tc_value(v, sizeof(v), 1, i, 40);
	KV_TC_EXPECT(&tc, 0, shardkv_put(cl, k, kl, v, vl));
}

/* Checks keys [lo, hi) of "c/": present with their values, or absent. */
static void
c_check(shardkv_client *cl, unsigned lo, unsigned hi, bool present, const char *when)
{
	char k[32], want[64];

	for (unsigned i = lo; i < hi; i++) {
		shardkv_buf v = {0};
		size_t kl = kv_tc_key(k, sizeof(k), "c/", i);
		size_t wl = kv_tc_value(want, sizeof(want), 1, i, 40);
		int rv = shardkv_get(cl, k, kl, &v);
		if (present)
			KV_TC_ASSERT(&tc, rv == 0 && v.len == wl && memcmp(v.data, want, wl) == 0,
			             "%s: %s: %s '%s', want '%s'", when, k, shardkv_strerror(rv),
			             v.data ? (char *)v.data : "", want);
		else
			KV_TC_ASSERT(&tc, rv == SHARDKV_ENOTFOUND, "%s: %s should be gone: %s",
			             when, k, shardkv_strerror(rv));
		shardkv_free(v.data);
	}
}

static void
sigint_stop(int i)
{
	int st = 0;
	KV_TC_ASSERT(&tc, kv_tc_stop_server(&tc, i, SIGINT, KV_TC_STOP_MS, &st) == 0,
	             "server %d did not stop on SIGINT", i);
	KV_TC_ASSERT(&tc, WIFEXITED(st) && WEXITSTATUS(st) == 0,
	             "server %d ended with status 0x%x on SIGINT", i, st);
}

static void
corrupt_log_record_stops_the_server_unless_told_to_truncate(void **state)
{
	char seg[700], needle[64], key[32];
	const char *trunc[] = {"--wal-truncate-corrupt", NULL};
	size_t n, rlen = 0;
	(void)state;

	assert_int_equal(kv_tc_start(&tc, "dur-corrupt", 1), 0);
	shardkv_client *cl = kv_tc_client(&tc, false, 20000);
	assert_non_null(cl);
	for (unsigned i = 0; i < CN; i++)
		c_put(cl, i);
	sigint_stop(0);

	/* Flip a byte of the payload of the record of key 50. */
	newest_segment(tc.srv[0].data, seg, sizeof(seg));
	uint8_t *b = read_all(seg, &n);
	kv_tc_key(key, sizeof(key), "c/", CN / 2);
	long off = find_record(b, n, key, &rlen);
	KV_TC_ASSERT(&tc, off > 0, "no record of %s in %s", key, seg);
	free(b);
	int fd = open(seg, O_RDWR);
	assert_true(fd >= 0);
	uint8_t byte;
	off_t at = (off_t)off + (off_t)rlen - 3;
	assert_int_equal(pread(fd, &byte, 1, at), 1);
	byte ^= 0x5a;
	assert_int_equal(pwrite(fd, &byte, 1, at), 1);
	close(fd);

	/* It refuses to start, naming the file and the offset. */
	char *argv[8 + KV_TC_MAX_ARGS + 2];
	kv_tc_run_result r;
	assert_true(kv_tc_server_argv(&tc, 0, false, argv, sizeof(argv) / sizeof(argv[0])) > 0);
	assert_int_equal(kv_tc_run(argv, NULL, NULL, 0, 30000, &r), 0);
	snprintf(needle, sizeof(needle), "offset %ld", off);
	const char *at_off = strstr(r.err, needle);
	if (r.code == 0 || r.code >= 128 || strstr(r.err, seg) == NULL || at_off == NULL ||
	    (at_off[strlen(needle)] >= '0' && at_off[strlen(needle)] <= '9')) {
		kv_tc_dump_logs(&tc, 20);
		fail_msg("a corrupt record at %s offset %ld: exit %d, stderr '%s'", seg, off,
		         r.code, r.err);
	}
	kv_tc_run_free(&r);

	/* --wal-truncate-corrupt: it starts and serves what came before. */
	assert_int_equal(kv_tc_set_server_args(&tc, 0, trunc), 0);
	restart(0);
	c_check(cl, 0, CN / 2, true, "after the cut");
	c_check(cl, CN / 2, CN, false, "after the cut");
	KV_TC_ASSERT(&tc, kv_tc_count_lines(tc.srv[0].log, "cut corrupt wal") == 1,
	             "the cut was not logged");

	/* A torn tail: the last record loses its last bytes. */
	for (unsigned i = CN; i < CN + CN / 2; i++)
		c_put(cl, i);
	sigint_stop(0);
	assert_int_equal(kv_tc_set_server_args(&tc, 0, NULL), 0);
	newest_segment(tc.srv[0].data, seg, sizeof(seg));
	b = read_all(seg, &n);
	off = find_record(b, n, NULL, &rlen);
	kv_tc_key(key, sizeof(key), "c/", CN + CN / 2 - 1);
	KV_TC_ASSERT(&tc, off > 0 && (size_t)off + rlen == n && contains(b + off, rlen, key),
	             "the last record of %s is not that of %s", seg, key);
	free(b);
	assert_int_equal(truncate(seg, (off_t)n - 5), 0);
	restart(0);
	/* A warning names the file (log lines: "ts level component msg k=v"). */
	char line_needle[800];
	snprintf(line_needle, sizeof(line_needle), "dropped torn tail of wal file=%s offset=", seg);
	KV_TC_ASSERT(&tc,
	             kv_tc_count_lines(tc.srv[0].log, "warn wal dropped torn tail of wal") == 1 &&
	                 kv_tc_count_lines(tc.srv[0].log, line_needle) == 1,
	             "the torn tail of %s was not reported with a warning", seg);
	c_check(cl, 0, CN / 2, true, "after the torn tail");
	c_check(cl, CN / 2, CN, false, "after the torn tail");
	c_check(cl, CN, CN + CN / 2 - 1, true, "after the torn tail");
	c_check(cl, CN + CN / 2 - 1, CN + CN / 2, false, "after the torn tail");
	/* And it takes writes again. */
	c_put(cl, CN / 2);
	c_check(cl, CN / 2, CN / 2 + 1, true, "a write after the torn tail");
	shardkv_close(cl);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(
	        acknowledged_writes_survive_kill_9_in_always_and_batch_modes, setup, teardown),
	    cmocka_unit_test_setup_teardown(restarted_server_keeps_node_id_ranges_and_data, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(kill_during_snapshot_loses_nothing, setup, teardown),
	    cmocka_unit_test_setup_teardown(kill_during_migration_loses_nothing, setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        corrupt_log_record_stops_the_server_unless_told_to_truncate, setup, teardown),
	};
	return cmocka_run_group_tests(tests, setup_seed, NULL);
}
