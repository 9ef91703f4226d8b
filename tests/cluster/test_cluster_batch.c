/*
 * test_cluster_batch.c - mget and mput over keys spread across four real
 * servers: values come back in key order from every node, and while a range
 * moves back and forth under concurrent batches, no batch fails, an mget of
 * keys that live on one node never sees an mput half-applied, every mget
 * sees at least what was acknowledged before it started (and nothing that
 * was never written), and the final values are the last ones written. And
 * the parts of an mget/mput go out on the servers' connections without a
 * thread per part (pthread_create is wrapped to count the threads made).
 */
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>

/* Every thread the process makes goes through here (-Wl,--wrap). */
int __real_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg);

static atomic_uint threads_made;

int
__wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*fn)(void *), void *arg)
{
	atomic_fetch_add(&threads_made, 1);
	return __real_pthread_create(t, a, fn, arg);
}

/* The threads the process has now, from /proc/self/task. */
static unsigned
threads_now(void)
{
	DIR *d = opendir("/proc/self/task");
	unsigned n = 0;

	assert_non_null(d);
	for (struct dirent *e; (e = readdir(d)) != NULL;)
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

#define NCOUNT (KV_TC_MAX_SERVERS + 2)
#define NODES  4

static kv_tc tc;

static int
setup4(void **state)
{
	int idx[NODES] = {0, 1, 2, 3};
	(void)state;
	/* One copy on purpose: the batches must span four owners, one slice
	 * each, moved there (and back and forth) by migrations. */
	if (kv_tc_start_one_copy(&tc, "cluster-batch", NODES) != 0)
		return -1;
	/* mb/ in four slices, one per server: mb/000000.. on server 1, etc. */
	if (kv_tc_spread(&tc, "mb/", 400, idx, NODES) != 0) {
		kv_tc_destroy(&tc);
		return -1;
	}
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	kv_tc_destroy(&tc);
	return 0;
}

static void
mget_and_mput_span_four_nodes_in_key_order(void **state)
{
	enum { N = 400, VLEN = 30 };
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	unsigned counts[NCOUNT];
	char msg[512];
	(void)state;

	assert_non_null(cl);
	shardkv_config *cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	kv_tc_count_owners(cfg, "mb/", N, counts, NCOUNT);
	shardkv_config_free(cfg);
	for (int i = 0; i < NODES; i++)
		assert_int_equal(counts[tc.srv[i].id], N / NODES);

	/* One mput of all 400 pairs, in an order that interleaves the nodes. */
	shardkv_bytes keys[N], vals[N];
	char kb[N][32], vb[N][64];
	for (unsigned j = 0; j < N; j++) {
		unsigned i = (j % NODES) * (N / NODES) + j / NODES;
		keys[j] = (shardkv_bytes){kb[j], kv_tc_key(kb[j], sizeof(kb[j]), "mb/", i)};
		vals[j] = (shardkv_bytes){vb[j], kv_tc_value(vb[j], sizeof(vb[j]), 9, i, VLEN)};
	}
	shardkv_mput_result *mr = NULL;
	KV_TC_EXPECT(&tc, 0, shardkv_mput(cl, N, keys, N, vals, &mr));
	assert_non_null(mr);
	assert_int_equal(mr->nfailed, 0);
	shardkv_mput_result_free(mr);
	shardkv_mget_result *gr = NULL;
	KV_TC_EXPECT(&tc, 0, shardkv_mget(cl, N, keys, &gr));
	assert_int_equal(gr->n, N);
	assert_int_equal(gr->nmissing, 0);
	for (unsigned j = 0; j < N; j++) {
		assert_int_equal(gr->values[j].len, vals[j].len);
		assert_memory_equal(gr->values[j].data, vals[j].data, vals[j].len);
	}
	shardkv_mget_result_free(gr);

	/* A missing key on each node: ENOTFOUND names exactly those. */
	shardkv_bytes mixed[8];
	char mk[4][32];
	for (int i = 0; i < NODES; i++) {
		mixed[2 * i] = keys[i];
		snprintf(mk[i], sizeof(mk[i]), "mb/%06u-x", (unsigned)i * (N / NODES) + 7);
		mixed[2 * i + 1] = (shardkv_bytes){mk[i], strlen(mk[i])};
	}
	KV_TC_EXPECT(&tc, SHARDKV_ENOTFOUND, shardkv_mget(cl, 8, mixed, &gr));
	assert_non_null(gr);
	assert_int_equal(gr->nmissing, 4);
	for (size_t i = 0; i < 4; i++) {
		assert_int_equal(gr->missing[i], 2 * i + 1);
		assert_null(gr->values[2 * i + 1].data);
		assert_memory_equal(gr->values[2 * i].data, vals[i].data, vals[i].len);
	}
	shardkv_mget_result_free(gr);

	/* A count mismatch writes nothing. */
	KV_TC_EXPECT(&tc, SHARDKV_EINVAL, shardkv_mput(cl, 4, mixed, 3, vals, NULL));
	shardkv_buf v;
	KV_TC_EXPECT(&tc, SHARDKV_ENOTFOUND, shardkv_get(cl, mk[0], strlen(mk[0]), &v));
	long bad = kv_tc_verify(cl, "mb/", N, 9, VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld keys wrong: %s", bad, msg);
	shardkv_close(cl);
}

/*
 * Two groups of keys: `one` lives in the slice of server 4 (so on one node
 * at any time, even while that slice moves), `all` has keys on every node.
 * The writer writes generation g to both groups with one mput each, then
 * publishes g as acknowledged; readers check every mget against that.
 */
#define ONE 40
#define ALL 40

typedef struct {
	shardkv_client *w, *r; /* the writer's and the reader's clients */
	atomic_int stop;       /* set by the main thread */
	atomic_uint started;   /* the generation the writer is writing */
	atomic_uint acked;     /* the last generation both mputs acknowledged */
	atomic_long mgets;     /* mgets checked */
	atomic_long failures;  /* failed calls or inconsistent mgets */
	char first[512];       /* the first failure */
	char one[ONE][32];     /* keys of `one` */
	char all[ALL][32];     /* keys of `all` */
} load;

static void load_fail(load *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void
load_fail(load *l, const char *fmt, ...)
{
	if (atomic_fetch_add(&l->failures, 1) == 0) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(l->first, sizeof(l->first), fmt, ap);
		va_end(ap);
	}
}

static void
group_keys(char (*k)[32], unsigned n, shardkv_bytes *out)
{
	for (unsigned i = 0; i < n; i++)
		out[i] = (shardkv_bytes){k[i], strlen(k[i])};
}

static void *
writer_main(void *arg)
{
	load *l = arg;
	shardkv_bytes k1[ONE], k2[ALL], v1[ONE], v2[ALL];
	char vb[ONE > ALL ? ONE : ALL][24];

	group_keys(l->one, ONE, k1);
	group_keys(l->all, ALL, k2);
	for (unsigned g = 1; !atomic_load(&l->stop); g++) {
		atomic_store(&l->started, g);
		for (unsigned i = 0; i < ONE || i < ALL; i++) {
			snprintf(vb[i], sizeof(vb[i]), "%u", g);
			if (i < ONE)
				v1[i] = (shardkv_bytes){vb[i], strlen(vb[i])};
			if (i < ALL)
				v2[i] = (shardkv_bytes){vb[i], strlen(vb[i])};
		}
		shardkv_mput_result *mr = NULL;
		int rv = shardkv_mput(l->w, ONE, k1, ONE, v1, &mr);
		if (rv == 0) {
			shardkv_mput_result_free(mr);
			mr = NULL;
			rv = shardkv_mput(l->w, ALL, k2, ALL, v2, &mr);
		}
		if (rv != 0) {
			load_fail(l, "mput gen %u: %s (%s), %zu nodes failed", g,
			          shardkv_strerror(rv), shardkv_errmsg(), mr ? mr->nfailed : 0);
			shardkv_mput_result_free(mr);
			return NULL; /* the generations would no longer be comparable */
		}
		shardkv_mput_result_free(mr);
		atomic_store(&l->acked, g);
	}
	return NULL;
}

/* Checks the values of one mget against [lo, hi]; same: all equal. */
static void
check_gens(load *l, const char *group, const shardkv_mget_result *r, unsigned lo, unsigned hi,
           bool same)
{
	unsigned first = 0;

	for (size_t i = 0; i < r->n; i++) {
		const shardkv_buf *v = &r->values[i];
		unsigned g = v->data ? (unsigned)strtoul((const char *)v->data, NULL, 10) : 0;
		if (g < lo || g > hi) {
			load_fail(l, "mget %s: key %zu has generation %u outside [%u, %u]", group,
			          i, g, lo, hi);
			return;
		}
		if (i == 0)
			first = g;
		else if (same && g != first) {
			load_fail(l,
			          "mget %s on one node saw generations %u and %u: an mput was "
			          "half-applied",
			          group, first, g);
			return;
		}
	}
}

static void *
reader_main(void *arg)
{
	load *l = arg;
	shardkv_bytes k1[ONE], k2[ALL];

	group_keys(l->one, ONE, k1);
	group_keys(l->all, ALL, k2);
	while (!atomic_load(&l->stop)) {
		for (int grp = 0; grp < 2; grp++) {
			shardkv_mget_result *r = NULL;
			unsigned lo = atomic_load(&l->acked);
			int rv = grp == 0 ? shardkv_mget(l->r, ONE, k1, &r)
			                  : shardkv_mget(l->r, ALL, k2, &r);
			unsigned hi = atomic_load(&l->started);
			if (rv != 0) {
				load_fail(l, "mget %s: %s (%s)", grp ? "all" : "one",
				          shardkv_strerror(rv), shardkv_errmsg());
				shardkv_mget_result_free(r);
				continue;
			}
			check_gens(l, grp ? "all" : "one", r, lo, hi, grp == 0);
			atomic_fetch_add(&l->mgets, 1);
			shardkv_mget_result_free(r);
		}
	}
	return NULL;
}

static void
batches_stay_atomic_per_node_while_a_range_moves_back_and_forth(void **state)
{
	enum { MOVES = 8 };
	static load l;
	pthread_t wt, rt;
	char n1[16], n4[16], s4[32], msg[512];
	(void)state;

	memset(&l, 0, sizeof(l));
	/* `one`: 40 keys of server 4's slice [mb/000300, mb0); `all`: 10 keys
	 * in each slice. */
	for (unsigned i = 0; i < ONE; i++)
		kv_tc_key(l.one[i], sizeof(l.one[i]), "mb/", 300 + i * 2);
	for (unsigned i = 0; i < ALL; i++)
		kv_tc_key(l.all[i], sizeof(l.all[i]), "mb/", (i % NODES) * 100 + i / NODES * 3 + 1);
	l.w = kv_tc_client(&tc, false, 10000);
	l.r = kv_tc_client(&tc, false, 10000);
	assert_non_null(l.w);
	assert_non_null(l.r);
	/* Generation 0 everywhere, so that every key exists. */
	{
		shardkv_bytes k[ONE + ALL], v[ONE + ALL];
		group_keys(l.one, ONE, k);
		group_keys(l.all, ALL, k + ONE);
		for (unsigned i = 0; i < ONE + ALL; i++)
			v[i] = (shardkv_bytes){"0", 1};
		KV_TC_EXPECT(&tc, 0, shardkv_mput(l.w, ONE + ALL, k, ONE + ALL, v, NULL));
	}
	/* Bulk in the moving slice, moved at a limited rate, so that each move
	 * takes a while and the batches meet its copy, catch-up and fence. */
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(l.w, "mb/000399/fill/", 10000, 1, 200, msg, sizeof(msg)));
	assert_int_equal(pthread_create(&wt, NULL, writer_main, &l), 0);
	assert_int_equal(pthread_create(&rt, NULL, reader_main, &l), 0);

	/* Server 4's slice goes to server 1 and back, MOVES times. */
	kv_tc_node_arg(&tc, 0, n1, sizeof(n1));
	kv_tc_node_arg(&tc, 3, n4, sizeof(n4));
	size_t sl = kv_tc_key(s4, sizeof(s4), "mb/", 300);
	int moved = 0;
	uint64_t move_ms = 0;
	for (int m = 0; m < MOVES; m++) {
		/* Let the load run a little between the moves. */
		long before = atomic_load(&l.mgets);
		for (uint64_t t0 = kv_test_now_ms();
		     atomic_load(&l.mgets) - before < 20 && kv_test_now_ms() - t0 < 5000;)
			kv_test_sleep_ms(5);
		shardkv_admin_result ar;
		uint64_t t_move = kv_test_now_ms();
		int rv =
		    shardkv_move(tc.admin, s4, sl, "mb0", 3, m % 2 ? n4 : n1, 2, SHARDKV_WAIT, &ar);
		move_ms += kv_test_now_ms() - t_move;
		if (rv != 0) {
			load_fail(&l, "move %d: %s (%s)", m, shardkv_strerror(rv),
			          shardkv_errmsg());
			break;
		}
		moved += ar.nmigrations > 0;
	}
	long before = atomic_load(&l.mgets);
	for (uint64_t t0 = kv_test_now_ms();
	     atomic_load(&l.mgets) - before < 20 && kv_test_now_ms() - t0 < 5000;)
		kv_test_sleep_ms(5);
	atomic_store(&l.stop, 1);
	pthread_join(wt, NULL);
	pthread_join(rt, NULL);
	fprintf(stderr, "%d moves in %llu ms, %u generations written, %ld mgets checked\n", moved,
	        (unsigned long long)move_ms, atomic_load(&l.acked), atomic_load(&l.mgets));
	KV_TC_ASSERT(&tc, atomic_load(&l.failures) == 0, "%ld failures; first: %s",
	             atomic_load(&l.failures), l.first);
	assert_int_equal(moved, MOVES);
	assert_true(atomic_load(&l.acked) > 0);

	/* The final values are the last generation, read by a new client. */
	shardkv_client *fresh = kv_tc_client(&tc, true, 10000);
	shardkv_bytes k[ONE + ALL];
	shardkv_mget_result *r = NULL;
	assert_non_null(fresh);
	group_keys(l.one, ONE, k);
	group_keys(l.all, ALL, k + ONE);
	KV_TC_EXPECT(&tc, 0, shardkv_mget(fresh, ONE + ALL, k, &r));
	snprintf(msg, sizeof(msg), "%u", atomic_load(&l.acked));
	for (unsigned i = 0; i < ONE + ALL; i++)
		KV_TC_ASSERT(&tc,
		             r->values[i].len == strlen(msg) &&
		                 memcmp(r->values[i].data, msg, r->values[i].len) == 0,
		             "key %s holds '%s', want the last generation %s",
		             (const char *)k[i].data, (const char *)r->values[i].data, msg);
	shardkv_mget_result_free(r);
	shardkv_close(fresh);
	shardkv_close(l.w);
	shardkv_close(l.r);
}

static void
mget_and_mput_over_four_nodes_make_no_thread(void **state)
{
	enum { N = 100, ROUNDS = 20 };
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	shardkv_bytes keys[N], vals[N];
	char kb[N][32], vb[N][64];
	(void)state;

	assert_non_null(cl);
	for (unsigned i = 0; i < N; i++) {
		unsigned at = i * 4; /* 100 of the 400 spread keys: 25 per node */
		keys[i] = (shardkv_bytes){kb[i], kv_tc_key(kb[i], sizeof(kb[i]), "mb/", at)};
		vals[i] = (shardkv_bytes){vb[i], kv_tc_value(vb[i], sizeof(vb[i]), 3, at, 20)};
	}
	/* The first call fetches the configuration, starts the watch thread and
	 * connects to the four servers; the calls after it make no thread. */
	KV_TC_EXPECT(&tc, 0, shardkv_mput(cl, N, keys, N, vals, NULL));
	unsigned made = atomic_load(&threads_made), before = threads_now();
	assert_true(made > 0); /* the wrap counts: the watch thread went through it */
	for (int r = 0; r < ROUNDS; r++) {
		shardkv_mget_result *mg = NULL;
		shardkv_mput_result *mp = NULL;
		KV_TC_EXPECT(&tc, 0, shardkv_mput(cl, N, keys, N, vals, &mp));
		assert_int_equal(mp->nfailed, 0);
		shardkv_mput_result_free(mp);
		KV_TC_EXPECT(&tc, 0, shardkv_mget(cl, N, keys, &mg));
		assert_int_equal(mg->nmissing, 0);
		for (unsigned i = 0; i < N; i++) {
			assert_int_equal(mg->values[i].len, vals[i].len);
			assert_memory_equal(mg->values[i].data, vals[i].data, vals[i].len);
		}
		shardkv_mget_result_free(mg);
	}
	KV_TC_ASSERT(&tc, atomic_load(&threads_made) == made,
	             "%u threads were made by %d mget/mput rounds over %d nodes",
	             atomic_load(&threads_made) - made, ROUNDS, NODES);
	KV_TC_ASSERT(&tc, threads_now() == before, "threads: %u before, %u after", before,
	             threads_now());
	shardkv_close(cl);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(mget_and_mput_span_four_nodes_in_key_order, setup4,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(
	        batches_stay_atomic_per_node_while_a_range_moves_back_and_forth, setup4, teardown),
	    cmocka_unit_test_setup_teardown(mget_and_mput_over_four_nodes_make_no_thread, setup4,
	                                    teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
