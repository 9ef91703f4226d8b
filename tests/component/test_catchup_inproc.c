/*
 * test_catchup_inproc.c - replicas outside the ISR are copied, catch up and
 * join the ISR (doc/replication.md "Catch-up", "ISR changes" Expand,
 * "Reconciliation"), with real shard servers in the test process:
 *
 * - a replica a join adds is copied while writes go on, joins the ISR at
 *   its primary's request, and once the primary stops it serves every
 *   acknowledged write (real controller, --replicas 2, --min-insync 1);
 * - the exactly-once memory travels with the copy: a write applied before
 *   the join, retried at the new primary, is answered, not applied again;
 * - an old primary that comes back after a failover is copied again (keys
 *   deleted while it was away are gone from it) and rejoins the ISR;
 * - after a failover, an in-sync backup that has every record of the old
 *   primary the new one has answers its end in sync and stays in the ISR;
 * - a backup holding a record the new primary lacks (fake controller, which
 *   publishes what a real one would) answers the new primary's end as
 *   diverged, is taken out of the ISR at its request, copied again (the
 *   record is gone), and asked back into the ISR;
 * - two failovers back to back under writes: nothing acknowledged lost,
 *   and the two stopped servers, back with their data, end holding
 *   exactly what the last primary holds.
 *
 * Every wait polls with a deadline.
 */
#include "common/err.h"
#include "shardserver/server.h"
#include "tests/support/fake_ctl.h"
#include "tests/support/inproc_cluster.h"
#include "tests/support/inproc_srv.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define PATIENCE INPROC_CLUSTER_PATIENCE_MS
#define CLIENT   0xc0ffu /* the raw client's id (exactly-once) */
#define NW       4000    /* keys the writer may touch */

static inproc_cluster jn = {.o = {.name = "kvjoin", .replicas = 2, .min_insync = 1}};
static inproc_cluster eo = {.o = {.name = "kvonce", .replicas = 2, .min_insync = 1}};
static inproc_cluster rs = {.o = {.name = "kvback", .replicas = 2, .min_insync = 1}};

/* Waits until the controller's one range has `n` in-sync members with
 * `primary` its primary; returns that configuration's epoch. */
static uint64_t
wait_isr(inproc_cluster *c, uint32_t primary, uint32_t n)
{
	uint64_t t0 = kv_test_now_ms();

	for (;;) {
		kv_config *cfg = inproc_cluster_config(c);
		bool ok = cfg && cfg->nranges == 1 && cfg->ranges[0].node == primary &&
		          kv_range_ninsync(&cfg->ranges[0]) == n;
		uint64_t e = cfg ? cfg->epoch : 0;
		kv_config_free(cfg);
		if (ok)
			return e;
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the range never had primary %u and %u in-sync members", primary,
			         n);
		kv_test_sleep_ms(20);
	}
}

/* Waits until url serves key with value want (the new primary after a
 * failover). */
static void
wait_serves(const char *url, const char *key, const char *want)
{
	uint64_t t0 = kv_test_now_ms();
	res1 r;

	for (;;) {
		r = do_get(url, key);
		if (r.status == 0) {
			assert_string_equal(r.value, want);
			return;
		}
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("%s never served %s (last status %d)", url, key, r.status);
		kv_test_sleep_ms(20);
	}
}

/* Waits until url answers a read as the primary (found or not found). */
static void
wait_serves_any(const char *url)
{
	uint64_t t0 = kv_test_now_ms();
	res1 r;

	for (;;) {
		r = do_get(url, "probe");
		if (r.status == 0 || r.status == SHARDKV__STATUS__STATUS_NOT_FOUND)
			return;
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("%s never served (last status %d)", url, r.status);
		kv_test_sleep_ms(20);
	}
}

/* Waits until server s holds key (present: with value want) or not. */
static void
wait_holds(kv_server *s, const char *key, const char *want, bool present)
{
	uint64_t t0 = kv_test_now_ms();

	while (inproc_srv_holds(s, key, want) != present) {
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("key %s never became %s", key, present ? "present" : "absent");
		kv_test_sleep_ms(10);
	}
}

/*
 * A put (val) or a delete (val NULL) at url until it is answered: a
 * refusal that applied nothing (unavailable while the node's lease is
 * renewed late on a loaded machine, wrong owner or stale epoch while a
 * configuration arrives, busy) is retried; a transport failure may have
 * applied it, so a delete retried after one may find the key gone.
 */
static void
write_until_ok(const char *url, const char *key, const char *val)
{
	uint64_t t0 = kv_test_now_ms();
	bool maybe = false;
	res1 r;

	for (;;) {
		r = val ? do_put(url, key, val, 0, 0) : do_del(url, key);
		if (r.status == 0 ||
		    (val == NULL && maybe && r.status == SHARDKV__STATUS__STATUS_NOT_FOUND))
			return;
		maybe |= r.status == -1 || r.status == SHARDKV__STATUS__STATUS_TIMED_OUT;
		if (r.status != -1 && r.status != SHARDKV__STATUS__STATUS_TIMED_OUT &&
		    r.status != SHARDKV__STATUS__STATUS_UNAVAILABLE &&
		    r.status != SHARDKV__STATUS__STATUS_WRONG_OWNER &&
		    r.status != SHARDKV__STATUS__STATUS_STALE_EPOCH &&
		    r.status != SHARDKV__STATUS__STATUS_BUSY)
			fail_msg("%s %s at %s: status %d", val ? "put" : "delete", key, url,
			         r.status);
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("%s %s at %s never answered (last status %d)",
			         val ? "put" : "delete", key, url, r.status);
		kv_test_sleep_ms(20);
	}
}

/* A writer: puts and deletes until told to stop, remembering what was
 * acknowledged. It writes to urls[0]; with several urls it follows the
 * primary, going on to the next one after a failure. */
typedef struct {
	const char *urls[3]; /* where it writes */
	unsigned nurls;      /* how many (0 counts as 1) */
	char prefix;         /* its keys are "<prefix>NNNN" ('w' when 0) */
	atomic_bool stop;
	int state[NW]; /* 0: never written; v > 0: value v acknowledged; -1: deleted; -2: unknown */
	atomic_uint acked, failed;
} writer;

static void *
writer_main(void *arg)
{
	writer *w = arg;
	char key[16], val[16];
	unsigned at = 0;

	for (unsigned i = 1; !atomic_load(&w->stop); i++) {
		unsigned k = (i * 7919u) % NW;
		res1 r;
		snprintf(key, sizeof(key), "%c%04u", w->prefix ? w->prefix : 'w', k);
		if (i % 5 == 0 && w->state[k] > 0) {
			r = do_del(w->urls[at], key);
			w->state[k] = r.status == 0 ? -1 : -2;
		} else {
			snprintf(val, sizeof(val), "%u", i);
			r = do_put(w->urls[at], key, val, 0, 0);
			w->state[k] = r.status == 0 ? (int)i : -2;
		}
		if (r.status == 0) {
			atomic_fetch_add(&w->acked, 1);
		} else {
			atomic_fetch_add(&w->failed, 1);
			if (w->nurls > 1) { /* look for the primary elsewhere */
				at = (at + 1) % w->nurls;
				kv_test_sleep_ms(5);
			}
		}
	}
	return NULL;
}

/* Checks that server s holds exactly what w had acknowledged (through s's
 * store, or through url's answers when url is set); returns the keys
 * checked. */
static unsigned
check_writer(const writer *w, kv_server *s, const char *url)
{
	char key[16], val[16];
	unsigned checked = 0;

	for (unsigned k = 0; k < NW; k++) {
		if (w->state[k] == 0 || w->state[k] == -2)
			continue;
		snprintf(key, sizeof(key), "%c%04u", w->prefix ? w->prefix : 'w', k);
		if (url != NULL) {
			res1 r = do_get(url, key);
			if (w->state[k] == -1) {
				if (r.status != SHARDKV__STATUS__STATUS_NOT_FOUND)
					fail_msg("%s: deleted (acknowledged), read status %d", key,
					         r.status);
			} else {
				snprintf(val, sizeof(val), "%d", w->state[k]);
				if (r.status != 0 || strcmp(r.value, val) != 0)
					fail_msg("%s: status %d value %s, acknowledged %s", key,
					         r.status, r.value, val);
			}
		} else if (w->state[k] == -1) {
			if (inproc_srv_holds(s, key, NULL))
				fail_msg("%s: deleted (acknowledged) but still held", key);
		} else {
			snprintf(val, sizeof(val), "%d", w->state[k]);
			if (!inproc_srv_holds(s, key, val))
				fail_msg("%s: acknowledged value %s not held", key, val);
		}
		checked++;
	}
	return checked;
}

static void
a_joined_replica_catches_up_under_writes_and_a_failover_to_it_loses_nothing(void **state)
{
	static writer w;
	pthread_t t;
	char key[16];
	uint64_t t0;

	(void)state;
	memset(&w, 0, sizeof(w));
	inproc_cluster_srv_up(&jn, 0);
	srv_wait_ready(jn.srv[0].url, 1, PATIENCE, NULL);
	/* Data before the join: the copy carries it. */
	for (int i = 0; i < 300; i++) {
		snprintf(key, sizeof(key), "w%04d", i);
		write_until_ok(jn.srv[0].url, key, "0");
		w.state[i] = -2; /* overwritten below, or checked as "0" */
	}
	w.urls[0] = jn.srv[0].url;
	assert_int_equal(pthread_create(&t, NULL, writer_main, &w), 0);
	kv_test_sleep_ms(100);
	/* The join: node 2 becomes a replica outside the ISR, is copied while
	 * the writer goes on, and joins the ISR. */
	t0 = kv_test_now_ms();
	inproc_cluster_srv_up(&jn, 1);
	wait_isr(&jn, 1, 2);
	print_message("node 2 joined the ISR %llu ms after it started\n",
	              (unsigned long long)(kv_test_now_ms() - t0));
	kv_test_sleep_ms(200); /* writes acknowledged with node 2 in the ISR */
	atomic_store(&w.stop, true);
	pthread_join(t, NULL);
	print_message("writer: %u acknowledged, %u failed\n", w.acked, w.failed);
	assert_true(w.acked > 0);
	/* Every acknowledged write is on node 2 already. */
	check_writer(&w, jn.srv[1].s, NULL);

	/* The primary stops: node 2 is promoted and serves all of it (waited
	 * for first: the loop below waits only when its key was last put, and
	 * a deleted key reads as not owned until the promotion). */
	inproc_srv_down(&jn.srv[0]);
	wait_serves_any(jn.srv[1].url);
	for (unsigned k = 0; k < NW; k++)
		if (w.state[k] > 0 || w.state[k] == -1) {
			char v[16];
			snprintf(key, sizeof(key), "w%04u", k);
			if (w.state[k] > 0) {
				snprintf(v, sizeof(v), "%d", w.state[k]);
				wait_serves(jn.srv[1].url, key, v);
			}
			break;
		}
	assert_true(check_writer(&w, NULL, jn.srv[1].url) > 0);
}

static void
the_exactly_once_memory_travels_with_the_copy(void **state)
{
	res1 r;

	(void)state;
	inproc_cluster_srv_up(&eo, 0);
	srv_wait_ready(eo.srv[0].url, 1, PATIENCE, NULL);
	/* Applied before node 2 exists: only the copy can carry its memory. */
	r = do_append(eo.srv[0].url, "once", "x", CLIENT, 77);
	assert_int_equal(r.status, 0);
	assert_int_equal(r.value_len, 1);
	inproc_cluster_srv_up(&eo, 1);
	wait_isr(&eo, 1, 2);
	inproc_srv_down(&eo.srv[0]);
	wait_serves(eo.srv[1].url, "once", "x");
	/* The retry (same client and request id) is answered, not applied. */
	r = do_append(eo.srv[1].url, "once", "x", CLIENT, 77);
	assert_int_equal(r.status, 0);
	assert_int_equal(r.value_len, 1);
	r = do_get(eo.srv[1].url, "once");
	assert_int_equal(r.status, 0);
	assert_string_equal(r.value, "x");
	/* A new request id is applied. */
	r = do_append(eo.srv[1].url, "once", "y", CLIENT, 78);
	assert_int_equal(r.status, 0);
	assert_int_equal(r.value_len, 2);
}

static void
a_restarted_old_primary_is_copied_again_and_rejoins_the_isr(void **state)
{
	char key[16];
	uint64_t t0;

	(void)state;
	inproc_cluster_srv_up(&rs, 0);
	srv_wait_ready(rs.srv[0].url, 1, PATIENCE, NULL);
	inproc_cluster_srv_up(&rs, 1);
	wait_isr(&rs, 1, 2);
	for (int i = 0; i < 20; i++) {
		snprintf(key, sizeof(key), "s%02d", i);
		write_until_ok(rs.srv[0].url, key, "old");
	}
	/* Node 1 stops; node 2 takes over, deletes half the keys and writes
	 * new ones while node 1 is away. */
	inproc_srv_down(&rs.srv[0]);
	wait_serves(rs.srv[1].url, "s00", "old");
	for (int i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "s%02d", i);
		write_until_ok(rs.srv[1].url, key, NULL);
		snprintf(key, sizeof(key), "n%02d", i);
		write_until_ok(rs.srv[1].url, key, "new");
	}
	assert_true(inproc_srv_holds(rs.srv[1].s, "n00", "new"));
	/* Node 1 comes back with its own data: it is copied again and joins
	 * the ISR of the range node 2 now leads. */
	t0 = kv_test_now_ms();
	inproc_cluster_srv_up(&rs, 0);
	wait_isr(&rs, 2, 2);
	print_message("the old primary rejoined the ISR %llu ms after it started\n",
	              (unsigned long long)(kv_test_now_ms() - t0));
	for (int i = 0; i < 20; i++) {
		snprintf(key, sizeof(key), "s%02d", i);
		if (inproc_srv_holds(rs.srv[0].s, key, "old") != (i >= 10))
			fail_msg("%s: %s on the old primary", key,
			         i >= 10 ? "missing" : "deleted meanwhile but still held");
	}
	for (int i = 0; i < 10; i++) {
		snprintf(key, sizeof(key), "n%02d", i);
		if (!inproc_srv_holds(rs.srv[0].s, key, "new"))
			fail_msg("%s: written while the old primary was away, missing on it", key);
	}
	/* And it is a full member again: writes reach it. */
	write_until_ok(rs.srv[1].url, "after", "1");
	if (!inproc_srv_holds(rs.srv[0].s, "after", "1"))
		fail_msg("a write acknowledged with the old primary in the ISR is not on it");
}

static inproc_cluster r3 = {.o = {.name = "kvthree", .nsrv = 3, .replicas = 3, .min_insync = 1}};

/* Waits until the one range has another primary than `old`; returns it. */
static uint32_t
wait_new_primary(inproc_cluster *c, uint32_t old)
{
	uint64_t t0 = kv_test_now_ms();

	for (;;) {
		kv_config *cfg = inproc_cluster_config(c);
		uint32_t p = cfg && cfg->nranges == 1 ? cfg->ranges[0].node : old;
		kv_config_free(cfg);
		if (p != old)
			return p;
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("node %u never lost the range", old);
		kv_test_sleep_ms(20);
	}
}

static void
an_in_sync_backup_with_the_new_primarys_records_stays_in_the_isr(void **state)
{
	char key[16];
	kv_config *cfg;
	uint32_t q, b;

	(void)state;
	inproc_cluster_srv_up(&r3, 0);
	srv_wait_ready(r3.srv[0].url, 1, PATIENCE, NULL);
	inproc_cluster_srv_up(&r3, 1);
	/* Node ids follow registration order: server 2 registers before
	 * server 3 starts, so srv[id - 1] is node id's server below. */
	srv_wait_ready(r3.srv[1].url, 1, PATIENCE, NULL);
	inproc_cluster_srv_up(&r3, 2);
	wait_isr(&r3, 1, 3);
	for (int i = 0; i < 20; i++) {
		snprintf(key, sizeof(key), "k%02d", i);
		write_until_ok(r3.srv[0].url, key, "v");
	}
	/* Both backups acknowledged every record of node 1: when it stops,
	 * the new primary's end of its leader epoch equals the other's. */
	inproc_srv_down(&r3.srv[0]);
	q = wait_new_primary(&r3, 1);
	b = q == 2 ? 3 : 2;
	wait_serves(r3.srv[q - 1].url, "k00", "v");
	/* A write completes only once the end is answered in sync, or once a
	 * diverged backup has left the ISR (until then it is refused as busy,
	 * and retried): the backup is still there. */
	write_until_ok(r3.srv[q - 1].url, "after", "1");
	cfg = inproc_cluster_config(&r3);
	assert_non_null(cfg);
	assert_int_equal(cfg->ranges[0].node, q);
	assert_int_equal(kv_range_ninsync(&cfg->ranges[0]), 2);
	assert_true(kv_range_has_replica(&cfg->ranges[0], b, true));
	kv_config_free(cfg);
	assert_true(inproc_srv_holds(r3.srv[b - 1].s, "after", "1"));
	assert_true(inproc_srv_holds(r3.srv[b - 1].s, "k19", "v"));
}

/*
 * Two failovers back to back under writes: node 1 (the primary) stops,
 * and the node that takes over stops as soon as the configuration names
 * it, before it has necessarily served or finished its reconciliation;
 * the third takes over. Writers follow the primary all along. The last
 * primary serves every acknowledged write; the two stopped servers come
 * back with their data (each may hold records of its own leader epoch
 * nobody else took: writes in flight when it stopped), are copied again
 * or caught up, rejoin the ISR, and end holding exactly what the last
 * primary holds, key for key.
 */
static inproc_cluster bb = {.o = {.name = "kvb2b", .nsrv = 3, .replicas = 3, .min_insync = 1}};

#define NFW 3 /* writers following the primary */

static void
two_failovers_back_to_back_lose_nothing_and_every_replica_ends_equal(void **state)
{
	static writer w[NFW];
	pthread_t thr[NFW];
	char key[16];
	uint32_t q, b;

	(void)state;
	inproc_cluster_srv_up(&bb, 0);
	srv_wait_ready(bb.srv[0].url, 1, PATIENCE, NULL);
	inproc_cluster_srv_up(&bb, 1);
	srv_wait_ready(bb.srv[1].url, 1, PATIENCE, NULL); /* node ids 1, 2, 3 in order */
	inproc_cluster_srv_up(&bb, 2);
	wait_isr(&bb, 1, 3);
	for (int i = 0; i < NFW; i++) {
		memset(&w[i], 0, sizeof(w[i]));
		for (int j = 0; j < 3; j++)
			w[i].urls[j] = bb.srv[j].url;
		w[i].nurls = 3;
		w[i].prefix = (char)('a' + i);
		assert_int_equal(pthread_create(&thr[i], NULL, writer_main, &w[i]), 0);
	}
	kv_test_sleep_ms(300);
	/* First failover: node 1 stops under the writes. */
	inproc_srv_down(&bb.srv[0]);
	q = wait_new_primary(&bb, 1);
	/* Second, at once: the new primary stops as soon as it is named. */
	inproc_srv_down(&bb.srv[q - 1]);
	b = 5 - q; /* the third node (ids 2 and 3 remain) */
	{
		uint64_t t0 = kv_test_now_ms();
		for (;;) {
			kv_config *cfg = inproc_cluster_config(&bb);
			bool led = cfg && cfg->ranges[0].node == b;
			kv_config_free(cfg);
			if (led)
				break;
			if (kv_test_now_ms() - t0 > PATIENCE)
				fail_msg("node %u never took the range after node %u stopped", b,
				         q);
			kv_test_sleep_ms(20);
		}
	}
	wait_serves_any(bb.srv[b - 1].url);
	/* Every writer gets writes through at the last primary. */
	unsigned before[NFW];
	for (int i = 0; i < NFW; i++)
		before[i] = atomic_load(&w[i].acked);
	for (uint64_t t0 = kv_test_now_ms();;) {
		bool all = true;
		for (int i = 0; i < NFW; i++)
			all = all && atomic_load(&w[i].acked) >= before[i] + 50;
		if (all)
			break;
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("the writers made no progress at node %u", b);
		kv_test_sleep_ms(20);
	}
	unsigned acked = 0, checked = 0;
	for (int i = 0; i < NFW; i++) {
		atomic_store(&w[i].stop, true);
		pthread_join(thr[i], NULL);
		acked += atomic_load(&w[i].acked);
	}
	for (int i = 0; i < NFW; i++)
		checked += check_writer(&w[i], NULL, bb.srv[b - 1].url);
	print_message("%u writes acknowledged, %u keys checked at node %u after two failovers\n",
	              acked, checked, b);
	assert_true(checked > 0);
	/* Both come back with their data and rejoin the ISR of node b. */
	inproc_cluster_srv_up(&bb, 0);
	inproc_cluster_srv_up(&bb, (int)q - 1);
	wait_isr(&bb, b, 3);
	/* Every replica holds what the primary serves, key for key: nothing
	 * a stopped primary alone had taken survives on it. */
	for (int i = 0; i < NFW; i++) {
		for (unsigned k = 0; k < NW; k++) {
			snprintf(key, sizeof(key), "%c%04u", w[i].prefix, k);
			res1 r = do_get(bb.srv[b - 1].url, key);
			assert_true(r.status == 0 || r.status == SHARDKV__STATUS__STATUS_NOT_FOUND);
			for (uint32_t n = 1; n <= 3; n++) {
				if (n == b)
					continue;
				bool held = r.status == 0
				                ? inproc_srv_holds(bb.srv[n - 1].s, key, r.value)
				                : !inproc_srv_holds(bb.srv[n - 1].s, key, NULL);
				if (!held)
					fail_msg("%s: node %u differs from the primary (%s)", key,
					         n, r.status == 0 ? r.value : "absent");
			}
		}
	}
}

/* Divergence: three servers under the fake controller. */
static inproc_srv dv[3];
static fake_ctl *dctl;
static char dtmp[128];

static int
dv_setup(void **state)
{
	(void)state;
	inproc_srv_setup(dv, 3, &dctl, dtmp, sizeof(dtmp), "kvdiverge", 16);
	return 0;
}

static int
dv_teardown(void **state)
{
	(void)state;
	inproc_srv_cleanup(dv, 3, &dctl, dtmp);
	return 0;
}

/* Publishes the key space with replicas rep[0..3) (rep[0] the primary), ISR
 * isr[0..nisr) and leader epoch le (0: the new configuration's epoch). */
static uint64_t
dv_publish(const uint32_t *rep, const uint32_t *isr, uint32_t nisr, uint64_t le)
{
	return fake_ctl_publish_replicas(dctl, rep, 3, isr, nisr, le);
}

/* Waits until the fake controller has seen more than `after` IsrChange
 * requests of the kind, the last naming node. */
static void
wait_isr_request(bool add, unsigned after, uint32_t node)
{
	uint64_t t0 = kv_test_now_ms();

	for (;;) {
		pthread_mutex_lock(&dctl->mu);
		bool ok = add ? dctl->isr_adds > after && dctl->isr_added == node
		              : dctl->isr_removes > after && dctl->isr_removed == node;
		pthread_mutex_unlock(&dctl->mu);
		if (ok)
			return;
		if (kv_test_now_ms() - t0 > PATIENCE)
			fail_msg("no IsrChange{%s %u} arrived", add ? "add" : "remove", node);
		kv_test_sleep_ms(10);
	}
}

static void
a_backup_with_divergent_records_is_dropped_and_copied_again(void **state)
{
	const uint32_t r123[3] = {1, 2, 3}, r231[3] = {2, 3, 1}, i23[2] = {2, 3}, i2[1] = {2};
	unsigned removes, adds;
	uint64_t e, le;

	(void)state;
	for (int i = 0; i < 3; i++)
		fake_ctl_add_node(dctl, dv[i].url);
	e = dv_publish(r123, r123, 3, 0);
	for (int i = 0; i < 3; i++)
		inproc_srv_up(&dv[i]);
	for (int i = 0; i < 3; i++)
		srv_wait_ready(dv[i].url, e, PATIENCE, NULL);
	assert_int_equal(do_put(dv[0].url, "a", "1", CLIENT, 1).status, 0);
	assert_true(inproc_srv_holds(dv[1].s, "a", "1") && inproc_srv_holds(dv[2].s, "a", "1"));

	/* Node 2 stops; a write reaches node 3 but not node 2 and is never
	 * acknowledged (node 2 is still in the ISR). */
	inproc_srv_down(&dv[1]);
	assert_int_equal(do_put(dv[0].url, "b", "1", CLIENT, 2).status,
	                 SHARDKV__STATUS__STATUS_TIMED_OUT);
	wait_holds(dv[2].s, "b", "1", true);
	/* Node 1 stops for good; node 2 comes back and is made primary with
	 * node 3 in the ISR: node 3 holds a record node 2 lacks. */
	inproc_srv_down(&dv[0]);
	inproc_srv_up(&dv[1]);
	pthread_mutex_lock(&dctl->mu);
	removes = dctl->isr_removes;
	adds = dctl->isr_adds;
	pthread_mutex_unlock(&dctl->mu);
	e = dv_publish(r231, i23, 2, 0);
	le = e;
	srv_wait_ready(dv[1].url, e, PATIENCE, NULL);
	srv_wait_ready(dv[2].url, e, PATIENCE, NULL);
	/* Node 2's end of the old leader epoch makes node 3 answer diverged,
	 * and node 2 asks for node 3 to leave the ISR. */
	wait_isr_request(false, removes, 3);
	assert_true(inproc_srv_holds(dv[2].s, "b", "1"));
	e = dv_publish(r231, i2, 1, le);
	srv_wait_ready(dv[2].url, e, PATIENCE, NULL);
	/* The copy replaces node 3's copy of the range wholesale (its first
	 * step drops what node 3 held, so "a" may be missing for a moment). */
	wait_holds(dv[2].s, "b", NULL, false);
	wait_holds(dv[2].s, "a", "1", true);
	/* Caught up, node 3 is asked back into the ISR. */
	wait_isr_request(true, adds, 3);
	assert_int_equal(do_put(dv[1].url, "c", "1", CLIENT, 3).status, 0);
	wait_holds(dv[2].s, "c", "1", true);
	assert_int_equal(do_get(dv[1].url, "b").status, SHARDKV__STATUS__STATUS_NOT_FOUND);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    INPROC_CLUSTER_TEST(
	        a_joined_replica_catches_up_under_writes_and_a_failover_to_it_loses_nothing, &jn),
	    INPROC_CLUSTER_TEST(the_exactly_once_memory_travels_with_the_copy, &eo),
	    INPROC_CLUSTER_TEST(a_restarted_old_primary_is_copied_again_and_rejoins_the_isr, &rs),
	    INPROC_CLUSTER_TEST(an_in_sync_backup_with_the_new_primarys_records_stays_in_the_isr,
	                        &r3),
	    cmocka_unit_test_setup_teardown(
	        a_backup_with_divergent_records_is_dropped_and_copied_again, dv_setup, dv_teardown),
	    INPROC_CLUSTER_TEST(
	        two_failovers_back_to_back_lose_nothing_and_every_replica_ends_equal, &bb),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
