/*
 * test_owncatchup_inproc.c - a replica that comes back catches up from its
 * own data (doc/replication.md "Catch-up from the replica's own data"): a
 * real controller with --replicas 3 (--min-insync 2) and three real shard
 * servers in the test process, one range.
 *
 * - A backup stopped and started again on its data dir, with writes to
 *   the range while it is away, is back in the ISR holding every
 *   acknowledged write, and its primary sent it no copy: the primary's
 *   shardkv_replica_copies_total is unchanged and
 *   shardkv_replica_catchups_total is one more.
 * - A running backup's position reaches its positions file and moves
 *   there with the writes, with no stop (ctest runs this file again with
 *   KV_TEST_FSYNC=none, whose log syncs nothing by itself).
 * - A backup whose range got another primary while it was away (a `move`
 *   to the third server, a new leader epoch) holds no position from the
 *   new primary, which copies it, and it holds every acknowledged write.
 * - A backup whose positions file is gone refuses the catch-up its primary
 *   offers and is copied (refusals and copies one more each), losing
 *   nothing.
 * - A backup of a range that moved to another primary while it stayed in
 *   the ISR (it answered the new primary's end of the old leader epoch in
 *   sync) holds a position from the new primary: stopped and started
 *   again, it is caught up without a copy.
 * - A primary handed a configuration that gives its range away while a
 *   write waits for a silent backup, and that drops one of its own
 *   positions as a replica (the positions file is rewritten and fsynced
 *   while the configuration is applied), never lets that write count as
 *   acknowledged before its demotion fence: the write fails, and a thread
 *   watching the commit point (kv_rs_covered, kv_rs_fenced) all along
 *   never sees it covered unfenced (fake controller, two servers).
 * - A record queued for a replica that is down, under a range since split
 *   (same primary and leader epoch) and whose piece holding the key is
 *   then given to another primary, is dropped from the queue: the
 *   replica, back, never applies it under the piece its old range's start
 *   now names (fake controller, three servers).
 * - Case (b), the old primary (fake controller, three servers; the
 *   failover is the configuration a controller publishes once the old
 *   primary's lease has run out): an old primary failed over after writes
 *   is caught up by the new primary without a copy (catch-ups one more,
 *   copies unchanged, at the new primary) and holds every acknowledged
 *   write, those of the new primary too. One that logged a write the new
 *   primary never applied (the new primary applied the failover before
 *   that record reached it: an unacknowledged tail) is copied and no
 *   longer holds the tail's value. One restarted before it returns (its
 *   lsns may be reused by the new process) is copied, losing nothing. One
 *   made primary by a transfer while it was down, then failed over before
 *   the transfer's fence ended, is copied on its return and holds the
 *   fence's write that the new primary acknowledged.
 *
 * Every wait polls with a deadline; the servers' metrics listeners and
 * every port are picked free at run time on 127.0.0.1.
 */
#include "common/err.h"
#include "shardserver/repl/catchup.h"
#include "shardserver/server_int.h" /* the server's kv_rs, for the commit point */
#include "tests/support/fake_ctl.h"
#include "tests/support/http_client.h"
#include "tests/support/inproc_cluster.h"
#include "tests/support/inproc_srv.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <dirent.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define NSRV     3
#define NKEYS    300
#define DEADLINE 30000u /* ms: any wait */

static inproc_cluster cl = {.o = {.name = "kvowncu", .nsrv = NSRV, .replicas = 3}};
static char mport[NSRV][32];  /* each server's --metrics */
static unsigned acked[NKEYS]; /* the value of key i last acknowledged (0: none) */
static unsigned next_val = 1;
static uint64_t reqid = 1;

/* Sample `name` of server i's /metrics (0 when absent). */
static uint64_t
srv_metric(int i, const char *name)
{
	int port = atoi(strrchr(mport[i], ':') + 1);
	kv_http_answer a = kv_http_get(port, "/metrics");
	assert_int_equal(a.status, 200);
	double v = kv_http_sample(a.body, name);
	kv_http_answer_free(&a);
	return isnan(v) ? 0 : (uint64_t)v;
}

/* The range's configuration when it is on all three, in sync, with no
 * fence (the caller frees it), or NULL. */
static kv_config *
all_in_sync(void)
{
	kv_config *cfg = inproc_cluster_config(&cl);

	if (cfg != NULL && cfg->nranges == 1 && kv_range_ninsync(&cfg->ranges[0]) == NSRV &&
	    cfg->ranges[0].fence == 0)
		return cfg;
	kv_config_free(cfg);
	return NULL;
}

/* Waits for all_in_sync; returns the range's primary. */
static uint32_t
wait_all_in_sync(const char *when)
{
	for (uint64_t t0 = kv_test_now_ms();;) {
		kv_config *cfg = all_in_sync();
		if (cfg != NULL) {
			uint32_t p = cfg->ranges[0].node;
			kv_config_free(cfg);
			return p;
		}
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("%s: the range is not on three in-sync replicas after %u ms", when,
			         DEADLINE);
		kv_test_sleep_ms(20);
	}
}

/* Server index of node n (servers start in order: node i+1 is srv[i]). */
static int
idx_of(uint32_t n)
{
	return (int)n - 1;
}

/* Writes keys [from, to) on node p's server until each is acknowledged
 * (a write waiting for a backup that stopped fails until the ISR shrinks;
 * it is written again with a new value). */
static void
write_keys(uint32_t p, int from, int to)
{
	char key[16], val[16];

	for (int i = from; i < to; i++) {
		uint64_t t0 = kv_test_now_ms();
		snprintf(key, sizeof(key), "c:%04d", i);
		for (;;) {
			unsigned v = next_val++;
			snprintf(val, sizeof(val), "%u", v);
			res1 r = do_put(cl.srv[idx_of(p)].url, key, val, 0, 0);
			if (r.status == KV_OK) {
				acked[i] = v;
				break;
			}
			/* Unknown outcome: the key is written again before it counts. */
			acked[i] = 0;
			if (kv_test_now_ms() - t0 > DEADLINE)
				fail_msg("%s: not acknowledged within %u ms (status %d)", key,
				         DEADLINE, r.status);
			kv_test_sleep_ms(20);
		}
	}
}

/* Fails unless server i holds every acknowledged write. */
static void
holds_everything(int i)
{
	char key[16], val[16];
	int n = 0;

	for (int k = 0; k < NKEYS; k++) {
		if (acked[k] == 0)
			continue;
		snprintf(key, sizeof(key), "c:%04d", k);
		snprintf(val, sizeof(val), "%u", acked[k]);
		if (!inproc_srv_holds(cl.srv[i].s, key, val))
			fail_msg("node %d lacks %s=%s", i + 1, key, val);
		n++;
	}
	assert_true(n > 0);
}

/* Starts the three servers with metrics listeners, one after the other (so
 * each later one is copied once and holds a position), and waits for the
 * range to be in sync on all three. Returns its primary. */
static uint32_t
three_in_sync(void)
{
	for (int i = 0; i < NSRV; i++) {
		snprintf(mport[i], sizeof(mport[i]), "127.0.0.1:%d", kv_test_free_port());
		cl.srv[i].cfg.metrics = mport[i];
		inproc_cluster_srv_up(&cl, i);
		inproc_cluster_wait_node_state(&cl, (uint32_t)i + 1, KV_NODE_ACTIVE);
	}
	return wait_all_in_sync("at the start");
}

/* Restarts node b on its data dir once its range has left its ISR. */
static uint64_t
restart(uint32_t b)
{
	uint64_t t0 = kv_test_now_ms();

	inproc_cluster_srv_up(&cl, idx_of(b));
	wait_all_in_sync("after the restart");
	return kv_test_now_ms() - t0;
}

/* Moves the range to node q (retrying while the controller is busy). */
static void
move_to(uint32_t q)
{
	char why[300] = "";

	for (uint64_t t0 = kv_test_now_ms();;) {
		kv_admin_req mv = {.op = KV_ADM_MOVE, .request_id = ++reqid, .node_id = q};
		kv_config *cfg = inproc_cluster_config(&cl);
		bool done = cfg != NULL && cfg->ranges[0].node == q;
		kv_config_free(cfg);
		if (done)
			return;
		(void)inproc_cluster_admin(&cl, &mv, NULL, NULL, why, sizeof(why));
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("the range never moved to node %u: %s", q, why);
		kv_test_sleep_ms(50);
	}
}

/* write_keys on a thread of its own. */
struct writes {
	uint32_t p;
	int from, to;
	atomic_bool done;
};

static void *
writes_main(void *arg)
{
	struct writes *w = arg;

	write_keys(w->p, w->from, w->to);
	atomic_store(&w->done, true);
	return NULL;
}

static void
a_restarted_backup_catches_up_from_its_own_data_without_a_copy(void **state)
{
	(void)state;
	uint32_t p = three_in_sync();
	uint32_t b = p == 1 ? 2 : 1;
	uint32_t o = 6 - p - b; /* the other backup */
	uint64_t batches = srv_metric(idx_of(p), "shardkv_replication_batches_total");
	uint64_t applied_b = srv_metric(idx_of(b), "shardkv_replication_records_applied_total");
	uint64_t applied_o = srv_metric(idx_of(o), "shardkv_replication_records_applied_total");
	write_keys(p, 0, NKEYS / 2);
	/* Each write reached both backups as a record; one at a time, each
	 * took a batch of its own to each. */
	uint64_t sent = srv_metric(idx_of(p), "shardkv_replication_batches_total") - batches;
	assert_true(sent >= NKEYS / 2);
	assert_true(srv_metric(idx_of(b), "shardkv_replication_records_applied_total") -
	                applied_b >=
	            NKEYS / 2);
	assert_true(srv_metric(idx_of(o), "shardkv_replication_records_applied_total") -
	                applied_o >=
	            NKEYS / 2);
	uint64_t copies = srv_metric(idx_of(p), "shardkv_replica_copies_total");
	uint64_t cus = srv_metric(idx_of(p), "shardkv_replica_catchups_total");

	inproc_srv_down(&cl.srv[idx_of(b)]);
	/* Overwrites and new keys while it is away (acknowledged by the other
	 * two once the silent one has left the ISR). Until it has left, the
	 * primary shows it behind: records, lsns and seconds. */
	char lag_rec[64], lag_lsn[64], lag_s[64];
	snprintf(lag_rec, sizeof(lag_rec), "shardkv_replication_lag_records{backup=\"%u\"}", b);
	snprintf(lag_lsn, sizeof(lag_lsn), "shardkv_replication_lag_lsns{backup=\"%u\"}", b);
	snprintf(lag_s, sizeof(lag_s), "shardkv_replication_lag_seconds{backup=\"%u\"}", b);
	struct writes wr = {.p = p, .from = NKEYS / 4, .to = NKEYS};
	pthread_t wt;
	assert_int_equal(pthread_create(&wt, NULL, writes_main, &wr), 0);
	uint64_t behind = 0, lsns = 0;
	double secs = 0;
	for (uint64_t t0 = kv_test_now_ms();
	     !atomic_load(&wr.done) && kv_test_now_ms() - t0 < DEADLINE;) {
		int port = atoi(strrchr(mport[idx_of(p)], ':') + 1);
		kv_http_answer a = kv_http_get(port, "/metrics");
		double r = a.status == 200 ? kv_http_sample(a.body, lag_rec) : NAN;
		double l = a.status == 200 ? kv_http_sample(a.body, lag_lsn) : NAN;
		double sec = a.status == 200 ? kv_http_sample(a.body, lag_s) : NAN;
		kv_http_answer_free(&a);
		if (!isnan(r) && r > (double)behind) {
			behind = (uint64_t)r;
			lsns = isnan(l) ? 0 : (uint64_t)l;
		}
		if (!isnan(sec) && sec > secs)
			secs = sec;
		kv_test_sleep_ms(10);
	}
	pthread_join(wt, NULL);
	print_message("node %u shown behind by up to %llu records (%llu lsns), %.3f s\n", b,
	              (unsigned long long)behind, (unsigned long long)lsns, secs);
	assert_true(behind > 0);
	assert_true(lsns >= behind);
	assert_true(secs > 0);
	uint64_t ms = restart(b);
	print_message("backup back in the ISR %llu ms after its restart\n", (unsigned long long)ms);
	assert_int_equal(srv_metric(idx_of(p), "shardkv_replica_copies_total"), copies);
	assert_int_equal(srv_metric(idx_of(p), "shardkv_replica_catchups_total"), cus + 1);
	write_keys(p, 0, 10);
	/* Back in the ISR with every write acknowledged: nothing behind. */
	for (uint64_t t0 = kv_test_now_ms(); srv_metric(idx_of(p), lag_rec) != 0;) {
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("node %u still shown behind after its catch-up", b);
		kv_test_sleep_ms(20);
	}
	for (int i = 0; i < NSRV; i++)
		holds_everything(i);
}

/* The highest lsn a position in server i's positions file holds now (0:
 * no file, or none in it). */
static uint64_t
saved_position(int i)
{
	static uint8_t buf[1 << 20];
	char path[600];
	kv_cu_pos_set set = {0};
	uint64_t lsn = 0;
	size_t n;
	FILE *f;

	snprintf(path, sizeof(path), "%s/repl-positions", cl.srv[i].dir);
	if ((f = fopen(path, "rb")) == NULL)
		return 0;
	n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	if (kv_cu_pos_decode(buf, n, &set) == KV_OK)
		for (size_t k = 0; k < set.n; k++)
			if (set.v[k].lsn > lsn)
				lsn = set.v[k].lsn;
	kv_cu_pos_set_fini(&set);
	return lsn;
}

/* A running backup's position reaches its file and moves there with the
 * writes, at every --fsync (registered again at none, where the log syncs
 * nothing by itself and the positions thread syncs for them): a crash, not
 * only a clean stop, leaves it a position to catch up from. */
static void
a_running_backups_position_reaches_its_file_and_moves_with_the_writes(void **state)
{
	(void)state;
	uint32_t p = three_in_sync();
	int b = idx_of(p == 1 ? 2 : 1);
	uint64_t first = 0, t0;

	write_keys(p, 0, NKEYS / 2);
	for (t0 = kv_test_now_ms(); (first = saved_position(b)) == 0;) {
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("no position in node %d's file after %u ms", b + 1, DEADLINE);
		kv_test_sleep_ms(20);
	}
	write_keys(p, NKEYS / 2, NKEYS);
	for (t0 = kv_test_now_ms(); saved_position(b) <= first;) {
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("node %d's position stays at %llu after %u ms of later writes",
			         b + 1, (unsigned long long)first, DEADLINE);
		kv_test_sleep_ms(20);
	}
}

static void
a_backup_whose_range_changed_primary_is_copied_and_loses_nothing(void **state)
{
	(void)state;
	uint32_t p = three_in_sync();
	uint32_t b = p == 1 ? 2 : 1, q = 6 - p - b;
	write_keys(p, 0, NKEYS / 2);

	inproc_srv_down(&cl.srv[idx_of(b)]);
	write_keys(p, NKEYS / 4, NKEYS / 2);
	/* The role moves to q (a new leader epoch) while b is away. */
	move_to(q);
	write_keys(q, NKEYS / 2, NKEYS);
	uint64_t copies = srv_metric(idx_of(q), "shardkv_replica_copies_total");
	uint64_t cus = srv_metric(idx_of(q), "shardkv_replica_catchups_total");
	restart(b);
	assert_int_equal(srv_metric(idx_of(q), "shardkv_replica_catchups_total"), cus);
	assert_true(srv_metric(idx_of(q), "shardkv_replica_copies_total") > copies);
	for (int i = 0; i < NSRV; i++)
		holds_everything(i);
}

static void
a_backup_kept_in_sync_across_a_move_catches_up_from_the_new_primary(void **state)
{
	(void)state;
	uint32_t p = three_in_sync();
	uint32_t b = p == 1 ? 2 : 1, q = 6 - p - b;
	write_keys(p, 0, NKEYS / 2);
	move_to(q);
	wait_all_in_sync("after the move");
	write_keys(q, NKEYS / 4, NKEYS / 2);
	uint64_t copies = srv_metric(idx_of(q), "shardkv_replica_copies_total");
	uint64_t cus = srv_metric(idx_of(q), "shardkv_replica_catchups_total");

	inproc_srv_down(&cl.srv[idx_of(b)]);
	write_keys(q, NKEYS / 2, NKEYS);
	restart(b);
	assert_int_equal(srv_metric(idx_of(q), "shardkv_replica_copies_total"), copies);
	assert_int_equal(srv_metric(idx_of(q), "shardkv_replica_catchups_total"), cus + 1);
	for (int i = 0; i < NSRV; i++)
		holds_everything(i);
}

static void
a_backup_that_lost_its_positions_refuses_the_catch_up_and_is_copied(void **state)
{
	char path[300];
	(void)state;
	uint32_t p = three_in_sync();
	uint32_t b = p == 1 ? 2 : 1;
	write_keys(p, 0, NKEYS / 2);
	uint64_t copies = srv_metric(idx_of(p), "shardkv_replica_copies_total");
	uint64_t cus = srv_metric(idx_of(p), "shardkv_replica_catchups_total");
	uint64_t refused = srv_metric(idx_of(p), "shardkv_replica_catchup_refusals_total");

	inproc_srv_down(&cl.srv[idx_of(b)]);
	snprintf(path, sizeof(path), "%s/repl-positions", cl.srv[idx_of(b)].dir);
	assert_int_equal(remove(path), 0);
	write_keys(p, NKEYS / 4, NKEYS);
	restart(b);
	assert_int_equal(srv_metric(idx_of(p), "shardkv_replica_catchups_total"), cus);
	assert_int_equal(srv_metric(idx_of(p), "shardkv_replica_catchup_refusals_total"),
	                 refused + 1);
	assert_int_equal(srv_metric(idx_of(p), "shardkv_replica_copies_total"), copies + 1);
	for (int i = 0; i < NSRV; i++)
		holds_everything(i);
}

/* The demotion fence: two servers under the fake controller. */
static inproc_srv fv[2];
static fake_ctl *fctl;
static char ftmp[128];

static int
fv_setup(void **state)
{
	(void)state;
	inproc_srv_setup(fv, 2, &fctl, ftmp, sizeof(ftmp), "kvfence", 16);
	return 0;
}

static int
fv_teardown(void **state)
{
	(void)state;
	inproc_srv_cleanup(fv, 2, &fctl, ftmp);
	return 0;
}

/* Publishes ["", "m") with replicas r1[0..n1), ISR i1[0..ni1), leader epoch
 * le1 and ["m", ) likewise (0: the configuration's epoch; one replica: led
 * by r2[0] alone, unreplicated); returns the epoch. */
static uint64_t
fv_publish(const uint32_t *r1, uint32_t n1, const uint32_t *i1, uint32_t ni1, uint64_t le1,
           const uint32_t *r2, uint32_t n2, const uint32_t *i2, uint32_t ni2, uint64_t le2)
{
	fake_cfg b = fake_cfg_new(fctl);
	fake_cfg_range(&b, "", r1[0]);
	fake_cfg_replicas(&b, r1, n1, i1, ni1, le1);
	fake_cfg_range(&b, "m", r2[0]);
	if (n2 > 1)
		fake_cfg_replicas(&b, r2, n2, i2, ni2, le2);
	return fake_cfg_publish(fctl, &b);
}

/* Watches node 1's commit point while it is demoted: from the moment the
 * write waits for its backup until told to stop, the commit point may
 * cover everything (no stream counting, nothing outstanding) only once the
 * demotion fence holds every reply begun before the write. */
typedef struct {
	kv_rs *rs;
	uint64_t t0; /* before the write was sent (monotonic ns) */
	atomic_bool stop;
	atomic_bool waiting; /* the write is seen waiting for the backup */
	atomic_uint seen;    /* covered and not fenced */
} fence_watch;

static void *
fence_watch_main(void *arg)
{
	fence_watch *w = arg;

	while (!atomic_load(&w->stop) && kv_rs_covered(w->rs, UINT64_MAX - 1))
		kv_test_sleep_ms(1);
	atomic_store(&w->waiting, true);
	while (!atomic_load(&w->stop))
		if (kv_rs_covered(w->rs, UINT64_MAX - 1) && !kv_rs_fenced(w->rs, w->t0))
			atomic_fetch_add(&w->seen, 1);
	return NULL;
}

/* A put of key to val with an exactly-once id, on a thread of its own. */
typedef struct {
	const char *url, *key, *val;
	int status;
} put_call;

static void *
put_main(void *arg)
{
	put_call *c = arg;
	c->status = do_put(c->url, c->key, c->val, 0xfe, 1).status;
	return NULL;
}

static void
a_write_waiting_on_a_range_given_away_is_never_acknowledged_before_the_fence(void **state)
{
	const uint32_t r12[2] = {1, 2}, r21[2] = {2, 1}, i2[1] = {2};
	unsigned adds;
	uint64_t e, le2;
	pthread_t pt, wt;
	put_call pc = {.url = fv[0].url, .key = "f", .val = "1", .status = -1};
	static fence_watch w;

	(void)state;
	memset(&w, 0, sizeof(w));
	for (int i = 0; i < 2; i++)
		fake_ctl_add_node(fctl, fv[i].url);
	/* Node 1 leads ["", "m") with node 2 in sync; node 2 leads ["m", ) with
	 * node 1 outside its ISR, so node 2 copies it to node 1, which then
	 * holds a position from node 2. */
	pthread_mutex_lock(&fctl->mu);
	adds = fctl->isr_adds;
	pthread_mutex_unlock(&fctl->mu);
	e = fv_publish(r12, 2, r12, 2, 0, r21, 2, i2, 1, 0);
	le2 = e;
	for (int i = 0; i < 2; i++)
		inproc_srv_up(&fv[i]);
	for (int i = 0; i < 2; i++)
		srv_wait_ready(fv[i].url, e, DEADLINE, NULL);
	assert_int_equal(do_put(fv[0].url, "a", "1", 0, 0).status, 0);
	assert_int_equal(do_put(fv[1].url, "x", "1", 0, 0).status, 0);
	for (uint64_t t0 = kv_test_now_ms();;) {
		pthread_mutex_lock(&fctl->mu);
		bool asked = fctl->isr_adds > adds && fctl->isr_added == 1;
		pthread_mutex_unlock(&fctl->mu);
		if (asked)
			break; /* the copy is complete: node 1 holds its position */
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("node 2 never asked for node 1 in the ISR of [m, )");
		kv_test_sleep_ms(10);
	}

	/* Node 2 goes silent: a write to node 1 waits for it. */
	inproc_srv_down(&fv[1]);
	w.rs = fv[0].s->repl;
	w.t0 = kv_now_ns();
	assert_int_equal(pthread_create(&wt, NULL, put_main, &pc), 0);
	assert_int_equal(pthread_create(&pt, NULL, fence_watch_main, &w), 0);
	for (uint64_t t0 = kv_test_now_ms(); !atomic_load(&w.waiting);) {
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("the write never waited for the backup");
		kv_test_sleep_ms(1);
	}
	/* ["", "m") goes to node 2 (node 1 is demoted) and ["m", ) is no longer
	 * replicated: node 1's position there is dropped, the positions file
	 * rewritten and fsynced while the configuration is applied. */
	e = fv_publish(r21, 2, r21, 2, 0, i2, 1, i2, 1, le2);
	srv_wait_ready(fv[0].url, e, DEADLINE, NULL);
	assert_int_equal(pthread_join(wt, NULL), 0);
	atomic_store(&w.stop, true);
	assert_int_equal(pthread_join(pt, NULL), 0);
	print_message("write status %d; covered unfenced %u times\n", pc.status,
	              atomic_load(&w.seen));
	assert_int_not_equal(pc.status, 0);
	assert_int_equal(atomic_load(&w.seen), 0);
}

/* The cut of a split range: three servers under the fake controller. */
static inproc_srv cv[3];
static fake_ctl *cctl;
static char ctmp[128];

static int
cv_setup(void **state)
{
	(void)state;
	inproc_srv_setup(cv, 3, &cctl, ctmp, sizeof(ctmp), "kvcut", 16);
	return 0;
}

static int
cv_teardown(void **state)
{
	(void)state;
	inproc_srv_cleanup(cv, 3, &cctl, ctmp);
	return 0;
}

static uint64_t
cv_queued(void)
{
	kv_rs_stats st;
	kv_rs_stats_get(cv[0].s->repl, &st);
	return st.queued;
}

static void
a_record_of_a_split_range_whose_piece_moved_is_dropped_for_a_replica_that_was_down(void **state)
{
	const uint32_t r123[3] = {1, 2, 3}, r12[2] = {1, 2}, r21[2] = {2, 1}, i12[2] = {1, 2};
	uint64_t e, le, adds;
	fake_cfg b;

	(void)state;
	for (int i = 0; i < 3; i++)
		fake_ctl_add_node(cctl, cv[i].url);
	/* Node 1 leads the key space with node 2 in sync and node 3, never
	 * started, outside the ISR: its copy waits, the records queue. */
	e = fake_ctl_publish_replicas(cctl, r123, 3, i12, 2, 0);
	le = e;
	inproc_srv_up(&cv[0]);
	inproc_srv_up(&cv[1]);
	srv_wait_ready(cv[0].url, e, DEADLINE, NULL);
	srv_wait_ready(cv[1].url, e, DEADLINE, NULL);
	for (uint64_t t0 = kv_test_now_ms(); cv_queued() == 0;) {
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("node 1 never queued a copy for node 3");
		kv_test_sleep_ms(10);
	}
	assert_int_equal(do_put(cv[0].url, "h", "old", 0, 0).status, 0);
	assert_true(cv_queued() >= 2); /* the copy marker and the record */
	/* A split: ["", "g") and ["g", ) both led by node 1 at the same leader
	 * epoch, node 3 a replica of the first only. */
	b = fake_cfg_new(cctl);
	fake_cfg_range(&b, "", 1);
	fake_cfg_replicas(&b, r123, 3, i12, 2, le);
	fake_cfg_range(&b, "g", 1);
	fake_cfg_replicas(&b, r12, 2, i12, 2, le);
	e = fake_cfg_publish(cctl, &b);
	srv_wait_ready(cv[0].url, e, DEADLINE, NULL);
	/* ["g", ) goes to node 2: the record of "h" was queued under ["", ),
	 * whose start now names ["", "g"). */
	b = fake_cfg_new(cctl);
	fake_cfg_range(&b, "", 1);
	fake_cfg_replicas(&b, r123, 3, i12, 2, le);
	fake_cfg_range(&b, "g", 2);
	fake_cfg_replicas(&b, r21, 2, r21, 2, 0);
	e = fake_cfg_publish(cctl, &b);
	srv_wait_ready(cv[0].url, e, DEADLINE, NULL);
	srv_wait_ready(cv[1].url, e, DEADLINE, NULL);
	assert_int_equal(do_put(cv[1].url, "h", "new", 0, 0).status, 0);
	/* Node 3 starts: node 1 copies ["", "g") to it and asks for it in the
	 * ISR; it never held "h" (not a replica of ["g", )). */
	pthread_mutex_lock(&cctl->mu);
	adds = cctl->isr_adds;
	pthread_mutex_unlock(&cctl->mu);
	inproc_srv_up(&cv[2]);
	for (uint64_t t0 = kv_test_now_ms();;) {
		pthread_mutex_lock(&cctl->mu);
		bool asked = cctl->isr_adds > adds && cctl->isr_added == 3;
		pthread_mutex_unlock(&cctl->mu);
		if (asked)
			break;
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("node 1 never asked for node 3 in the ISR");
		kv_test_sleep_ms(10);
	}
	if (inproc_srv_holds(cv[2].s, "h", NULL))
		fail_msg("node 3 applied a record of [\"g\", ) from node 1 after the move");
	assert_true(inproc_srv_holds(cv[1].s, "h", "new"));
}

/* Case (b), the old primary: three servers under the fake controller. */
static inproc_srv ov[3];
static fake_ctl *octl;
static char otmp[128];

static int
ov_setup(void **state)
{
	(void)state;
	memset(acked, 0, sizeof(acked));
	inproc_srv_setup(ov, 3, &octl, otmp, sizeof(otmp), "kvoldp", 16);
	return 0;
}

static int
ov_teardown(void **state)
{
	(void)state;
	inproc_srv_cleanup(ov, 3, &octl, otmp);
	return 0;
}

static kv_rs_stats
ov_stats(int i)
{
	kv_rs_stats st;
	kv_rs_stats_get(ov[i].s->repl, &st);
	return st;
}

/* Writes keys [from, to) on ov[i] (acknowledged at once, or the test fails). */
static void
ov_write(int i, int from, int to)
{
	char key[16], val[16];

	for (int k = from; k < to; k++) {
		unsigned v = next_val++;
		snprintf(key, sizeof(key), "c:%04d", k);
		snprintf(val, sizeof(val), "%u", v);
		res1 r = do_put(ov[i].url, key, val, 0, 0);
		if (r.status != KV_OK)
			fail_msg("%s on node %d: status %d", key, i + 1, r.status);
		acked[k] = v;
	}
}

/* The first acknowledged write ov[i] lacks (its key in key), or false when
 * it holds them all. */
static bool
ov_lacks(int i, char *key, size_t keylen, char *val, size_t vallen)
{
	int n = 0;

	for (int k = 0; k < NKEYS; k++) {
		if (acked[k] == 0)
			continue;
		snprintf(key, keylen, "c:%04d", k);
		snprintf(val, vallen, "%u", acked[k]);
		if (!inproc_srv_holds(ov[i].s, key, val))
			return true;
		n++;
	}
	assert_true(n > 0);
	return false;
}

/* Fails unless ov[i] comes to hold every acknowledged write within the
 * deadline. A replica asked back into the ISR may still be applying the
 * records its primary streams after the catch-up's marker, and with two
 * ranges the other range's primary may have asked first. */
static void
ov_holds_everything(int i)
{
	char key[16], val[16];

	for (uint64_t t0 = kv_test_now_ms(); ov_lacks(i, key, sizeof(key), val, sizeof(val));) {
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("node %d lacks %s=%s", i + 1, key, val);
		kv_test_sleep_ms(10);
	}
}

/* Waits until the fake controller is asked to add node n to the ISR
 * (after `adds` such requests): its primary copied or caught it up. */
static void
ov_wait_isr_add(unsigned adds, uint32_t n)
{
	for (uint64_t t0 = kv_test_now_ms();;) {
		pthread_mutex_lock(&octl->mu);
		bool asked = octl->isr_adds > adds && octl->isr_added == n;
		pthread_mutex_unlock(&octl->mu);
		if (asked)
			return;
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("node %u was never asked into the ISR", n);
		kv_test_sleep_ms(10);
	}
}

static unsigned
ov_isr_adds(void)
{
	pthread_mutex_lock(&octl->mu);
	unsigned n = octl->isr_adds;
	pthread_mutex_unlock(&octl->mu);
	return n;
}

/* The failover of the whole key space to node 2 (node 1 a replica outside
 * the ISR; reps/isr list the rest), at a new leader epoch; not published. */
static fake_cfg
ov_failover(const uint32_t *reps, uint32_t nrep, const uint32_t *isr, uint32_t nisr)
{
	fake_cfg b = fake_cfg_new(octl);
	fake_cfg_range(&b, "", 2);
	fake_cfg_replicas(&b, reps, nrep, isr, nisr, 0);
	return b;
}

/* Nodes 1..n hold the whole key space, led by node 1 with every replica in
 * sync, and node 1 writes the first half of the keys. Returns the epoch. */
static uint64_t
ov_start(int n)
{
	const uint32_t r[3] = {1, 2, 3};
	for (int i = 0; i < n; i++)
		fake_ctl_add_node(octl, ov[i].url);
	uint64_t e = fake_ctl_publish_replicas(octl, r, (uint32_t)n, r, (uint32_t)n, 0);
	for (int i = 0; i < n; i++)
		inproc_srv_up(&ov[i]);
	for (int i = 0; i < n; i++)
		srv_wait_ready(ov[i].url, e, DEADLINE, NULL);
	ov_write(0, 0, NKEYS / 2);
	return e;
}

/* Nodes 1..3 up with two ranges: [, m) on replicas lo[0..nlo) (lo[0] its
 * primary, all in sync) and [m, ) on hi[0..nhi); node 1 writes the first
 * half of the keys (all in [, m)). Returns the epoch. */
static uint64_t
ov_start_split(const uint32_t *lo, uint32_t nlo, const uint32_t *hi, uint32_t nhi)
{
	for (int i = 0; i < 3; i++)
		fake_ctl_add_node(octl, ov[i].url);
	fake_cfg a = fake_cfg_new(octl);
	fake_cfg_range(&a, "", lo[0]);
	fake_cfg_replicas(&a, lo, nlo, lo, nlo, 0);
	fake_cfg_range(&a, "m", hi[0]);
	fake_cfg_replicas(&a, hi, nhi, hi, nhi, 0);
	uint64_t e = fake_cfg_publish(octl, &a);
	for (int i = 0; i < 3; i++)
		inproc_srv_up(&ov[i]);
	for (int i = 0; i < 3; i++)
		srv_wait_ready(ov[i].url, e, DEADLINE, NULL);
	ov_write(0, 0, NKEYS / 2);
	return e;
}

/* Node 2's counters since q0 show the old primary caught up (one catch-up,
 * no refusal, no copy) or refused and copied. */
static void
ov_expect(const kv_rs_stats *q0, bool caught_up)
{
	kv_rs_stats q1 = ov_stats(1);
	print_message(
	    "node 2: catch-ups %llu -> %llu, refusals %llu -> %llu, copies %llu -> %llu\n",
	    (unsigned long long)q0->catchups, (unsigned long long)q1.catchups,
	    (unsigned long long)q0->catchup_refusals, (unsigned long long)q1.catchup_refusals,
	    (unsigned long long)q0->copies, (unsigned long long)q1.copies);
	assert_int_equal(q1.catchups, q0->catchups + (caught_up ? 1 : 0));
	assert_int_equal(q1.catchup_refusals, q0->catchup_refusals + (caught_up ? 0 : 1));
	assert_int_equal(q1.copies, q0->copies + (caught_up ? 0 : 1));
}

static void
an_old_primary_failed_over_catches_up_from_its_own_data_without_a_copy(void **state)
{
	const uint32_t r231[3] = {2, 3, 1}, i23[2] = {2, 3};
	(void)state;
	uint64_t e = ov_start(3);

	/* Node 1's lease has run out: node 2 leads at a new leader epoch,
	 * node 1 a replica outside the ISR. */
	unsigned adds = ov_isr_adds();
	kv_rs_stats q0 = ov_stats(1);
	fake_cfg b = ov_failover(r231, 3, i23, 2);
	e = fake_cfg_publish(octl, &b);
	for (int i = 0; i < 3; i++)
		srv_wait_ready(ov[i].url, e, DEADLINE, NULL);
	/* Overwrites and new keys at the new primary, acknowledged by node 3. */
	ov_write(1, NKEYS / 4, NKEYS);
	ov_wait_isr_add(adds, 1);
	ov_expect(&q0, true);
	for (int i = 0; i < 3; i++)
		ov_holds_everything(i);
}

/* Node 2 applies the failover b before node 1 does, and node 1, still
 * primary in its own eyes, logs a write of "t" whose record node 2 refuses:
 * a tail past node 2's end. Returns the writer (joined by the caller). */
static pthread_t
ov_tail(fake_cfg *b, put_call *c)
{
	pthread_t t;

	assert_int_equal(kv_rs_apply_config(ov[1].s->repl, b->c), KV_OK);
	assert_int_equal(pthread_create(&t, NULL, put_main, c), 0);
	for (uint64_t t0 = kv_test_now_ms(); !inproc_srv_holds(ov[0].s, "t", "tail");) {
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("node 1 never applied the tail's write");
		kv_test_sleep_ms(1);
	}
	return t;
}

static void
an_old_primary_with_a_tail_the_new_primary_lacks_is_copied_and_serves_none_of_it(void **state)
{
	const uint32_t r21[2] = {2, 1}, i2[1] = {2};
	put_call c = {.url = ov[0].url, .key = "t", .val = "tail", .status = -1};
	(void)state;
	uint64_t e = ov_start(2);

	unsigned adds = ov_isr_adds();
	kv_rs_stats q0 = ov_stats(1);
	fake_cfg b = ov_failover(r21, 2, i2, 1);
	pthread_t t = ov_tail(&b, &c);
	e = fake_cfg_publish(octl, &b);
	for (int i = 0; i < 2; i++)
		srv_wait_ready(ov[i].url, e, DEADLINE, NULL);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_not_equal(c.status, KV_OK);
	ov_wait_isr_add(adds, 1);
	if (inproc_srv_holds(ov[0].s, "t", NULL))
		fail_msg("the old primary still holds the tail's write after its return");
	ov_expect(&q0, false);
	for (int i = 0; i < 2; i++)
		ov_holds_everything(i);
}

/* Node 1 leads the whole key space on all three servers and writes the
 * first half of the keys; then it stops (its lease runs out) and node 2
 * leads at a new leader epoch with node 3, node 1 a replica outside the
 * ISR. Returns the failover's configuration epoch; *q0 gets node 2's
 * counters before it. */
static uint64_t
ov_stop_and_fail_over(kv_rs_stats *q0)
{
	const uint32_t r231[3] = {2, 3, 1}, i23[2] = {2, 3};
	ov_start(3);
	*q0 = ov_stats(1);
	inproc_srv_down(&ov[0]);
	fake_cfg b = ov_failover(r231, 3, i23, 2);
	uint64_t e = fake_cfg_publish(octl, &b);
	for (int i = 1; i < 3; i++)
		srv_wait_ready(ov[i].url, e, DEADLINE, NULL);
	return e;
}

static void
a_restarted_old_primary_with_no_tail_is_caught_up_without_a_copy_and_holds_every_write(void **state)
{
	(void)state;
	unsigned adds = ov_isr_adds();
	kv_rs_stats q0;
	uint64_t e = ov_stop_and_fail_over(&q0);
	/* New keys and overwrites at the new primary while node 1 is down. */
	ov_write(1, NKEYS / 4, NKEYS);
	inproc_srv_up(&ov[0]);
	srv_wait_ready(ov[0].url, e, DEADLINE, NULL);
	ov_wait_isr_add(adds, 1);
	ov_expect(&q0, true);
	for (int i = 0; i < 3; i++)
		ov_holds_everything(i);
}

static void
a_restarted_old_primary_whose_log_holds_only_other_ranges_past_the_end_is_caught_up(void **state)
{
	/* [, m) on nodes 1 and 2, [m, ) on nodes 1 and 3: node 2 never
	 * applies node 1's records of [m, ), node 3 none of [, m). */
	const uint32_t r12[2] = {1, 2}, r13[2] = {1, 3}, r21[2] = {2, 1}, i2[1] = {2},
	               r31[2] = {3, 1}, i3[1] = {3};
	char key[16];
	(void)state;
	uint64_t e = ov_start_split(r12, 2, r13, 2);
	/* The last records of node 1's log are of [m, ): past node 2's end. */
	for (int k = 0; k < 20; k++) {
		snprintf(key, sizeof(key), "t:%04d", k);
		assert_int_equal(do_put(ov[0].url, key, "y", 0, 0).status, KV_OK);
	}
	unsigned adds = ov_isr_adds();
	kv_rs_stats q0 = ov_stats(1);
	inproc_srv_down(&ov[0]);
	fake_cfg b = fake_cfg_new(octl);
	fake_cfg_range(&b, "", 2);
	fake_cfg_replicas(&b, r21, 2, i2, 1, 0);
	fake_cfg_range(&b, "m", 3);
	fake_cfg_replicas(&b, r31, 2, i3, 1, 0);
	e = fake_cfg_publish(octl, &b);
	for (int i = 1; i < 3; i++)
		srv_wait_ready(ov[i].url, e, DEADLINE, NULL);
	ov_write(1, NKEYS / 4, NKEYS);
	inproc_srv_up(&ov[0]);
	srv_wait_ready(ov[0].url, e, DEADLINE, NULL);
	for (uint64_t t0 = kv_test_now_ms();
	     ov_stats(1).catchups + ov_stats(1).copies == q0.catchups + q0.copies;) {
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("node 2 never caught node 1 up nor copied it");
		kv_test_sleep_ms(10);
	}
	ov_wait_isr_add(adds, 1);
	ov_expect(&q0, true);
	for (int i = 0; i < 2; i++)
		ov_holds_everything(i);
}

/*
 * A transfer to a node that died before it took the old primary's last
 * records (doc/replication.md "A transfer to a node that dies before its
 * fence"): [, m) led by node 1 with nodes 2 and 3 in sync, [m, ) led by
 * node 3 with node 2 in sync (node 2 applies node 3's records, so it has an
 * end for node 3). Node 3 stops; node 1's record of "b" reaches node 2,
 * with its exactly-once entry, not node 3. A transfer makes node 3 the
 * primary of [, m) (fence: node 1), which hands the range over with the
 * record outstanding: the write fails. Node 3 is failed over to node 2
 * before its fence ends, and the write's retry at node 2 is answered from
 * the entry: acknowledged. Node 3 restarts and must be copied, not caught
 * up from its own data, and hold the write.
 */
static void
a_transfer_target_failed_over_before_its_fence_is_copied_and_holds_the_fences_writes(void **state)
{
	const uint32_t r123[3] = {1, 2, 3}, r32[2] = {3, 2}, r312[3] = {3, 1, 2},
	               r213[3] = {2, 1, 3}, i2[1] = {2};
	put_call c = {.url = ov[0].url, .key = "b", .val = "acked", .status = -1};
	pthread_t t;
	(void)state;

	uint64_t e1 = ov_start_split(r123, 3, r32, 2);
	assert_int_equal(do_put(ov[2].url, "n", "1", 0, 0).status, KV_OK);

	/* Node 3 stops; the write reaches node 2 only and waits. */
	inproc_srv_down(&ov[2]);
	assert_int_equal(pthread_create(&t, NULL, put_main, &c), 0);
	for (uint64_t t0 = kv_test_now_ms(); !inproc_srv_holds(ov[1].s, "b", "acked");) {
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("node 2 never applied node 1's record of the write");
		kv_test_sleep_ms(1);
	}
	/* The transfer of [, m) to node 3, node 1 its fence. */
	fake_cfg tr = fake_cfg_new(octl);
	fake_cfg_range(&tr, "", 3);
	fake_cfg_replicas(&tr, r312, 3, r312, 3, 0);
	tr.c->ranges[0].fence = 1;
	fake_cfg_range(&tr, "m", 3);
	fake_cfg_replicas(&tr, r32, 2, r32, 2, e1);
	uint64_t e2 = fake_cfg_publish(octl, &tr);
	for (int i = 0; i < 2; i++)
		srv_wait_ready(ov[i].url, e2, DEADLINE, NULL);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_not_equal(c.status, KV_OK);

	/* Node 3 is failed over to node 2 before its fence ends. */
	unsigned adds = ov_isr_adds();
	kv_rs_stats q0 = ov_stats(1);
	fake_cfg f = fake_cfg_new(octl);
	fake_cfg_range(&f, "", 2);
	fake_cfg_replicas(&f, r213, 3, i2, 1, 0);
	fake_cfg_range(&f, "m", 2);
	fake_cfg_replicas(&f, (const uint32_t[]){2, 3}, 2, i2, 1, 0);
	uint64_t e3 = fake_cfg_publish(octl, &f);
	for (int i = 0; i < 2; i++)
		srv_wait_ready(ov[i].url, e3, DEADLINE, NULL);
	/* The write's retry, same ids: answered from node 2's entry. */
	c.url = ov[1].url;
	for (uint64_t t0 = kv_test_now_ms();; kv_test_sleep_ms(10)) {
		put_main(&c);
		if (c.status == KV_OK)
			break;
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("the write's retry at node 2: status %d", c.status);
	}
	inproc_srv_up(&ov[2]);
	srv_wait_ready(ov[2].url, e3, DEADLINE, NULL);
	ov_wait_isr_add(adds, 3);
	for (uint64_t t0 = kv_test_now_ms(); !inproc_srv_holds(ov[2].s, "b", "acked");) {
		if (kv_test_now_ms() - t0 > DEADLINE)
			fail_msg("node 3 joined the ISR without the acknowledged write");
		kv_test_sleep_ms(10);
	}
	kv_rs_stats q1 = ov_stats(1);
	print_message("node 2: catch-ups %llu -> %llu, copies %llu -> %llu\n",
	              (unsigned long long)q0.catchups, (unsigned long long)q1.catchups,
	              (unsigned long long)q0.copies, (unsigned long long)q1.copies);
	for (int i = 0; i < 3; i++)
		ov_holds_everything(i);
}

/* Cuts the last `bytes` bytes of the newest log segment of dir: the torn
 * tail a crash leaves of records written but not yet synced. */
static void
cut_newest_segment(const char *dir, long bytes)
{
	char best[64] = "", path[400];
	DIR *d = opendir(dir);
	struct dirent *de;

	assert_non_null(d);
	while ((de = readdir(d)) != NULL)
		if (strncmp(de->d_name, "wal-", 4) == 0 && strlen(de->d_name) < sizeof(best) &&
		    strcmp(de->d_name, best) > 0)
			snprintf(best, sizeof(best), "%s", de->d_name);
	closedir(d);
	assert_true(best[0] != '\0');
	snprintf(path, sizeof(path), "%s/%s", dir, best);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_true(st.st_size > 32 + bytes);
	assert_int_equal(truncate(path, st.st_size - bytes), 0);
}

static void
a_restarted_old_primary_whose_log_lost_records_below_the_end_is_copied(void **state)
{
	(void)state;
	unsigned adds = ov_isr_adds();
	kv_rs_stats q0;
	uint64_t e = ov_stop_and_fail_over(&q0);
	/* Node 1's last record (of a key the new primary does not write
	 * again) is lost: its log now ends below the new primary's end. */
	cut_newest_segment(ov[0].dir, 4);
	ov_write(1, NKEYS / 2, NKEYS);
	inproc_srv_up(&ov[0]);
	srv_wait_ready(ov[0].url, e, DEADLINE, NULL);
	ov_wait_isr_add(adds, 1);
	ov_expect(&q0, false);
	for (int i = 0; i < 3; i++)
		ov_holds_everything(i);
}

static void
a_restarted_old_primary_whose_log_holds_a_record_of_the_range_past_the_end_is_copied(void **state)
{
	const uint32_t r21[2] = {2, 1}, i2[1] = {2};
	put_call c = {.url = ov[0].url, .key = "t", .val = "tail", .status = -1};
	(void)state;
	uint64_t e = ov_start(2);

	unsigned adds = ov_isr_adds();
	kv_rs_stats q0 = ov_stats(1);
	fake_cfg b = ov_failover(r21, 2, i2, 1);
	pthread_t t = ov_tail(&b, &c);
	/* Node 1 stops with the tail in its log and starts again after the
	 * failover: a new start, whose recovered log holds the tail. */
	inproc_srv_down(&ov[0]);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_not_equal(c.status, KV_OK);
	e = fake_cfg_publish(octl, &b);
	srv_wait_ready(ov[1].url, e, DEADLINE, NULL);
	inproc_srv_up(&ov[0]);
	srv_wait_ready(ov[0].url, e, DEADLINE, NULL);
	ov_wait_isr_add(adds, 1);
	if (inproc_srv_holds(ov[0].s, "t", NULL))
		fail_msg("the restarted old primary still holds the tail's write");
	ov_expect(&q0, false);
	for (int i = 0; i < 2; i++)
		ov_holds_everything(i);
}

static int
setup(void **state)
{
	memset(acked, 0, sizeof(acked));
	return inproc_cluster_setup(state);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_prestate_setup_teardown(
	        a_restarted_backup_catches_up_from_its_own_data_without_a_copy, setup,
	        inproc_cluster_teardown, &cl),
	    cmocka_unit_test_prestate_setup_teardown(
	        a_running_backups_position_reaches_its_file_and_moves_with_the_writes, setup,
	        inproc_cluster_teardown, &cl),
	    cmocka_unit_test_prestate_setup_teardown(
	        a_backup_whose_range_changed_primary_is_copied_and_loses_nothing, setup,
	        inproc_cluster_teardown, &cl),
	    cmocka_unit_test_prestate_setup_teardown(
	        a_backup_kept_in_sync_across_a_move_catches_up_from_the_new_primary, setup,
	        inproc_cluster_teardown, &cl),
	    cmocka_unit_test_prestate_setup_teardown(
	        a_backup_that_lost_its_positions_refuses_the_catch_up_and_is_copied, setup,
	        inproc_cluster_teardown, &cl),
	    cmocka_unit_test_setup_teardown(
	        a_write_waiting_on_a_range_given_away_is_never_acknowledged_before_the_fence,
	        fv_setup, fv_teardown),
	    cmocka_unit_test_setup_teardown(
	        a_record_of_a_split_range_whose_piece_moved_is_dropped_for_a_replica_that_was_down,
	        cv_setup, cv_teardown),
	    cmocka_unit_test_setup_teardown(
	        an_old_primary_failed_over_catches_up_from_its_own_data_without_a_copy, ov_setup,
	        ov_teardown),
	    cmocka_unit_test_setup_teardown(
	        an_old_primary_with_a_tail_the_new_primary_lacks_is_copied_and_serves_none_of_it,
	        ov_setup, ov_teardown),
	    cmocka_unit_test_setup_teardown(
	        a_transfer_target_failed_over_before_its_fence_is_copied_and_holds_the_fences_writes,
	        ov_setup, ov_teardown),
	    cmocka_unit_test_setup_teardown(
	        a_restarted_old_primary_with_no_tail_is_caught_up_without_a_copy_and_holds_every_write,
	        ov_setup, ov_teardown),
	    cmocka_unit_test_setup_teardown(
	        a_restarted_old_primary_whose_log_holds_only_other_ranges_past_the_end_is_caught_up,
	        ov_setup, ov_teardown),
	    cmocka_unit_test_setup_teardown(
	        a_restarted_old_primary_whose_log_lost_records_below_the_end_is_copied, ov_setup,
	        ov_teardown),
	    cmocka_unit_test_setup_teardown(
	        a_restarted_old_primary_whose_log_holds_a_record_of_the_range_past_the_end_is_copied,
	        ov_setup, ov_teardown),
	};
	cmocka_set_message_output(CM_OUTPUT_STDOUT);
	if (getenv("KV_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KV_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
