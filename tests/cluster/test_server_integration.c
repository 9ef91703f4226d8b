/*
 * test_server_integration.c - shard servers on free loopback ports against
 * the fake controller (tests/support/fake_ctl.h: Register, Watch with crafted
 * configurations, Heartbeat, MigrationProgress, MigrationDone, Leave), and
 * checks serving, owner hints, migrations between two servers,
 * simultaneous swaps, exactly-once retries and restarts.
 *
 * Servers run inside this process through their life cycle (server.h)
 * wherever a test does not need a process of its own; the tests of the
 * binary itself (flags and exit codes, SIGTERM's graceful leave) start the
 * real shardkv-server (KV_SERVER_BIN).
 *
 * Every wait polls with a deadline; every server and process is stopped by
 * the per-test teardown, whatever the outcome.
 */
#include "common/config.h"
#include "common/err.h"
#include "common/proc.h"
#include "common/rpc.h"
#include "proto/shardkv.pb-c.h"
#include "shardserver/server.h"
#include "tests/support/fake_ctl.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#ifndef KV_SERVER_BIN
#error "KV_SERVER_BIN must name the shardkv-server binary"
#endif

#define MAX_NODES FAKE_CTL_MAX_NODES

static uint64_t
now_ms(void)
{
	return kv_test_now_ms();
}

/* ------------------------------------------------------------------------
 * Servers: in this process, or the binary
 * ------------------------------------------------------------------------ */

typedef struct {
	pid_t pid;           /* the binary's process; 0: not running */
	kv_server *s;        /* the in-process server; NULL: none */
	kv_server_cfg cfg;   /* its flags (in-process) */
	const char *ctlv[1]; /* its --controller (in-process) */
	char url[64];        /* --listen */
	char dir[200];       /* --data-dir */
	char log[220];       /* the binary's stderr */
} srv_proc;

static srv_proc procs[MAX_NODES];
static const char *store_mode = "striped"; /* --store of the servers started */
static fake_ctl *ctl;
static char tmpdir[128];

static void dump_logs(void);

/* Starts the binary (common/proc.h: its output appended to p->log, killed
 * on every exit path of the test). */
static void
proc_start(srv_proc *p, const char *ctl_url)
{
	char *argv[] = {(char *)KV_SERVER_BIN,
	                "--listen",
	                p->url,
	                "--controller",
	                (char *)ctl_url,
	                "--data-dir",
	                p->dir,
	                "--join",
	                "--log-level",
	                "info",
	                "--store",
	                (char *)store_mode,
	                NULL};
	p->pid = kv_proc_spawn(KV_SERVER_BIN, argv, p->log);
	assert_true(p->pid > 0);
}

/* Waits up to ms for the binary to exit by itself; fails with its log
 * otherwise. Returns its wait status. */
static int
proc_wait_exit(srv_proc *p, unsigned ms, const char *what)
{
	int st = -1;
	if (kv_proc_wait(p->pid, ms, &st) != 0) {
		dump_logs();
		fail_msg("%s", what);
	}
	p->pid = 0;
	return st;
}

/* Creates and starts an in-process server with the flags proc_start gives
 * the binary (--join, --store store_mode, the default --fsync). */
static void
node_start(srv_proc *p, const char *ctl_url)
{
	char err[256];
	int rv;

	p->ctlv[0] = ctl_url;
	p->cfg = (kv_server_cfg){
	    .listen = p->url,
	    .ctl = p->ctlv,
	    .nctl = 1,
	    .data_dir = p->dir,
	    .join = true,
	    .store_mode = strcmp(store_mode, "percore") == 0 ? KV_STORE_PERCORE : KV_STORE_STRIPED,
	    .fsync = KV_FSYNC_BATCH};
	if ((rv = kv_server_create(&p->cfg, &p->s, err, sizeof(err))) != 0)
		fail_msg("cannot create server %s: %s: %s", p->url, kv_errname(rv), err);
	assert_int_equal(kv_server_start(p->s), 0);
}

/* Stops and destroys an in-process server (none: -1). Returns what
 * kv_server_stop returned. */
static int
node_stop(srv_proc *p)
{
	int rv;

	if (p->s == NULL)
		return -1;
	rv = kv_server_stop(p->s);
	kv_server_destroy(p->s);
	p->s = NULL;
	return rv;
}

/* Stops a server: SIGTERM, then SIGKILL after 10 s. Returns its exit status. */
static int
proc_stop(srv_proc *p)
{
	int st = -1;
	if (p->pid <= 0)
		return -1;
	kv_proc_stop(p->pid, SIGTERM, 10000, &st);
	p->pid = 0;
	return st;
}

static int
setup(void **state)
{
	(void)state;
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvsrvtest.XXXXXX");
	assert_non_null(mkdtemp(tmpdir));
	store_mode = getenv("KV_TEST_STORE") ? getenv("KV_TEST_STORE") : "striped";
	ctl = fake_ctl_start();
	for (int i = 0; i < MAX_NODES; i++) {
		memset(&procs[i], 0, sizeof(procs[i]));
		kv_test_free_url(procs[i].url, sizeof(procs[i].url));
		snprintf(procs[i].dir, sizeof(procs[i].dir), "%s/n%d", tmpdir, i + 1);
		snprintf(procs[i].log, sizeof(procs[i].log), "%s/n%d.log", tmpdir, i + 1);
	}
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	clients_close();
	for (int i = 0; i < MAX_NODES; i++) {
		proc_stop(&procs[i]);
		node_stop(&procs[i]);
	}
	fake_ctl_stop(ctl);
	ctl = NULL;
	if (getenv("KV_TEST_KEEP") == NULL)
		kv_test_rmtree(tmpdir);
	return 0;
}

/* Prints the server logs (after a failure). */
static void
dump_logs(void)
{
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "tail -n 40 %s/*.log >&2", tmpdir);
	if (system(cmd) != 0)
		fprintf(stderr, "no logs\n");
}

/* Follows WRONG_OWNER hints and retries MOVING/UNAVAILABLE until a final
 * answer; *url is updated to the server that answered. */
static res1
routed(char *url, size_t ulen, bool put, const char *k, const char *v, uint64_t client,
       uint64_t reqid)
{
	uint64_t deadline = now_ms() + 20000;
	for (;;) {
		res1 r = put ? do_put(url, k, v, client, reqid) : do_get(url, k);
		if (r.status == SHARDKV__STATUS__STATUS_WRONG_OWNER && r.hint_addr[0]) {
			snprintf(url, ulen, "%s", r.hint_addr);
		} else if (r.status != SHARDKV__STATUS__STATUS_MOVING &&
		           r.status != SHARDKV__STATUS__STATUS_UNAVAILABLE &&
		           r.status != SHARDKV__STATUS__STATUS_BUSY && r.status != -1) {
			return r;
		}
		if (now_ms() > deadline) {
			dump_logs();
			fail_msg("no final answer for %s (last status %d)", k, r.status);
		}
		kv_test_sleep_ms(1);
	}
}

/* Polls until the server answers a ping with at least `epoch`. */
static void
wait_ready(const char *url, uint64_t epoch)
{
	srv_wait_ready(url, epoch, 15000, dump_logs);
}

/* Makes procs[0 .. known) the fake controller's nodes 1 .., publishes the
 * owners (split, lo, hi) of fake_cfg_owners, starts the first `up` of them
 * in this process and waits until they serve that epoch. Returns it. */
static uint64_t
nodes_up(int known, int up, const char *split, uint32_t lo, uint32_t hi)
{
	for (int i = 0; i < known; i++)
		fake_ctl_add_node(ctl, procs[i].url);
	uint64_t e = fake_ctl_publish_owners(ctl, split, lo, hi);
	for (int i = 0; i < up; i++)
		node_start(&procs[i], ctl->url);
	for (int i = 0; i < up; i++)
		wait_ready(procs[i].url, e);
	return e;
}

/* Writes n keys fmt%05d = "v%d" with batches of 100 puts. */
static void
load_keys(const char *url, const char *prefix, int n)
{
	for (int base = 0; base < n; base += 100) {
		Shardkv__Request rq = SHARDKV__REQUEST__INIT;
		Shardkv__Op op[100], *ops[100];
		Shardkv__PutOp p[100];
		char k[100][32], v[100][32];
		int m = n - base < 100 ? n - base : 100;
		for (int i = 0; i < m; i++) {
			Shardkv__Op oi = SHARDKV__OP__INIT;
			Shardkv__PutOp pi = SHARDKV__PUT_OP__INIT;
			op[i] = oi;
			p[i] = pi;
			snprintf(k[i], sizeof(k[i]), "%s%05d", prefix, base + i);
			snprintf(v[i], sizeof(v[i]), "v%d", base + i);
			p[i].key = bd(k[i]);
			p[i].value = bd(v[i]);
			op[i].op_case = SHARDKV__OP__OP_PUT;
			op[i].put = &p[i];
			ops[i] = &op[i];
		}
		rq.n_ops = (size_t)m;
		rq.ops = ops;
		Shardkv__Response *r = call(url, &rq);
		assert_non_null(r);
		assert_int_equal(r->n_results, m);
		for (int i = 0; i < m; i++)
			assert_int_equal(r->results[i]->status, 0);
		shardkv__response__free_unpacked(r, NULL);
	}
}

static void
check_keys(const char *url, const char *prefix, int n)
{
	for (int base = 0; base < n; base += 100) {
		Shardkv__Request rq = SHARDKV__REQUEST__INIT;
		Shardkv__Op op[100], *ops[100];
		Shardkv__GetOp g[100];
		char k[100][32], v[32];
		int m = n - base < 100 ? n - base : 100;
		for (int i = 0; i < m; i++) {
			Shardkv__Op oi = SHARDKV__OP__INIT;
			Shardkv__GetOp gi = SHARDKV__GET_OP__INIT;
			op[i] = oi;
			g[i] = gi;
			snprintf(k[i], sizeof(k[i]), "%s%05d", prefix, base + i);
			g[i].key = bd(k[i]);
			op[i].op_case = SHARDKV__OP__OP_GET;
			op[i].get = &g[i];
			ops[i] = &op[i];
		}
		rq.n_ops = (size_t)m;
		rq.ops = ops;
		Shardkv__Response *r = call(url, &rq);
		if (r == NULL || r->n_results != (size_t)m) {
			dump_logs();
			fail_msg("get %s%05d.. on %s: no answer", prefix, base, url);
		}
		for (int i = 0; i < m; i++) {
			const Shardkv__OpResult *o = r->results[i];
			snprintf(v, sizeof(v), "v%d", base + i);
			if (o->status != 0 || o->value.len != strlen(v) ||
			    memcmp(o->value.data, v, o->value.len) != 0) {
				dump_logs();
				fail_msg("%s on %s: status %d value '%.*s'", k[i], url, o->status,
				         (int)o->value.len, (const char *)o->value.data);
			}
		}
		shardkv__response__free_unpacked(r, NULL);
	}
}

/* ------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------ */

static void
server_serves_after_first_config_and_hints_other_owners(void **state)
{
	(void)state;
	nodes_up(2, 1, "m", 1, 2); /* node 2 never started */
	const char *u = procs[0].url;

	assert_int_equal(do_put(u, "apple", "red", 0, 0).status, 0);
	assert_string_equal(do_get(u, "apple").value, "red");
	assert_int_equal(do_get(u, "banana").status, SHARDKV__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(do_append(u, "apple", "!", 0, 0).value_len, 4);
	res1 d = do_del(u, "apple");
	assert_int_equal(d.status, 0);
	assert_string_equal(d.value, "red!");
	assert_int_equal(do_del(u, "apple").status, SHARDKV__STATUS__STATUS_NOT_FOUND);

	res1 w = do_put(u, "zebra", "x", 0, 0);
	assert_int_equal(w.status, SHARDKV__STATUS__STATUS_WRONG_OWNER);
	assert_int_equal(w.hint_node, 2);
	assert_string_equal(w.hint_addr, procs[1].url);
	assert_string_equal(w.hint_start, "m");
	assert_int_equal(w.hint_epoch, 1);

	/* Too-big key, hostile bytes, wrong version: errors, never a crash. */
	char big[2000];
	memset(big, 'k', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	assert_int_equal(do_put(u, big, "v", 0, 0).status, SHARDKV__STATUS__STATUS_TOO_BIG);
	Shardkv__Response *r = call_raw(u, "\xff\xff\xff\xff garbage", 12);
	assert_non_null(r);
	assert_int_equal(r->status, SHARDKV__STATUS__STATUS_PROTOCOL_ERROR);
	shardkv__response__free_unpacked(r, NULL);

	/* mget / mput all-or-nothing, and refused when a key lives elsewhere. */
	Shardkv__Request rq = SHARDKV__REQUEST__INIT;
	Shardkv__Op op = SHARDKV__OP__INIT, *ops[1] = {&op};
	Shardkv__MPutOp mp = SHARDKV__MPUT_OP__INIT;
	ProtobufCBinaryData ks[2] = {bd("a1"), bd("a2")}, vs[2] = {bd("1"), bd("2")};
	mp.n_keys = 2;
	mp.keys = ks;
	mp.n_values = 2;
	mp.values = vs;
	op.op_case = SHARDKV__OP__OP_MPUT;
	op.mput = &mp;
	rq.n_ops = 1;
	rq.ops = ops;
	r = call(u, &rq);
	assert_int_equal(r->results[0]->status, 0);
	shardkv__response__free_unpacked(r, NULL);
	ks[1] = bd("zz");
	r = call(u, &rq);
	assert_int_equal(r->results[0]->status, SHARDKV__STATUS__STATUS_WRONG_OWNER);
	shardkv__response__free_unpacked(r, NULL);
	assert_int_equal(do_get(u, "zz").status, SHARDKV__STATUS__STATUS_WRONG_OWNER);
	mp.n_values = 1;
	ks[1] = bd("a3");
	r = call(u, &rq);
	assert_int_equal(r->results[0]->status, SHARDKV__STATUS__STATUS_INVALID);
	shardkv__response__free_unpacked(r, NULL);
	assert_int_equal(do_get(u, "a3").status, SHARDKV__STATUS__STATUS_NOT_FOUND);

	Shardkv__MGetOp mg = SHARDKV__MGET_OP__INIT;
	ProtobufCBinaryData gk[3] = {bd("a2"), bd("bogus"), bd("a1")};
	mg.n_keys = 3;
	mg.keys = gk;
	op.op_case = SHARDKV__OP__OP_MGET;
	op.mget = &mg;
	r = call(u, &rq);
	assert_int_equal(r->results[0]->status, SHARDKV__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(r->results[0]->n_missing, 1);
	assert_int_equal(r->results[0]->missing[0], 1);
	shardkv__response__free_unpacked(r, NULL);

	/* Scan is clipped at the end of the served range, with a cursor there. */
	load_keys(u, "c", 30);
	Shardkv__ScanOp sc = SHARDKV__SCAN_OP__INIT;
	sc.limit = 10;
	op.op_case = SHARDKV__OP__OP_SCAN;
	op.scan = &sc;
	r = call(u, &rq);
	assert_int_equal(r->results[0]->status, 0);
	assert_int_equal(r->results[0]->n_entries, 10);
	assert_true(r->results[0]->more);
	shardkv__response__free_unpacked(r, NULL);
	sc.limit = 0;
	sc.start = bd("c");
	r = call(u, &rq);
	assert_int_equal(r->results[0]->n_entries, 30);
	assert_true(r->results[0]->more);
	assert_memory_equal(r->results[0]->next_cursor.data, "m", 1);
	shardkv__response__free_unpacked(r, NULL);

	assert_int_equal(node_stop(&procs[0]), 0);
	clients_close();
}

static void
retried_append_is_applied_once(void **state)
{
	(void)state;
	nodes_up(1, 1, NULL, 1, 1);
	const char *u = procs[0].url;
	res1 a = do_append(u, "log", "x", 77, 1);
	assert_int_equal(a.status, 0);
	assert_int_equal(a.value_len, 1);
	a = do_append(u, "log", "x", 77, 1); /* the retry */
	assert_int_equal(a.status, 0);
	assert_int_equal(a.value_len, 1);
	assert_string_equal(do_get(u, "log").value, "x");
	assert_int_equal(do_append(u, "log", "y", 77, 2).value_len, 2);
	assert_int_equal(do_append(u, "log", "y", 78, 1).value_len, 3); /* other client */
	assert_string_equal(do_get(u, "log").value, "xyy");
	clients_close();
}

/* Writer thread: keeps writing key = counter through hints. */
typedef struct {
	const char *key;    /* the key written */
	char start_url[64]; /* first server tried */
	atomic_bool stop;   /* stop writing */
	atomic_bool pause;  /* pause requested */
	atomic_bool paused; /* writer is paused */
	atomic_long acked;  /* last acknowledged counter, -1 none */
	atomic_long writes; /* writes acknowledged */
	int failed;         /* a write got a final error */
} writer;

static void *
writer_main(void *arg)
{
	writer *w = arg;
	char url[64], val[32];
	snprintf(url, sizeof(url), "%s", w->start_url);
	for (long i = 0; !atomic_load(&w->stop); i++) {
		while (atomic_load(&w->pause) && !atomic_load(&w->stop)) {
			atomic_store(&w->paused, true);
			kv_test_sleep_ms(1);
		}
		atomic_store(&w->paused, false);
		snprintf(val, sizeof(val), "%ld", i);
		uint64_t deadline = now_ms() + 20000;
		res1 r;
		for (;;) {
			r = do_put(url, w->key, val, 0, 0);
			if (r.status == SHARDKV__STATUS__STATUS_WRONG_OWNER && r.hint_addr[0])
				snprintf(url, sizeof(url), "%s", r.hint_addr);
			else if (r.status == 0 || now_ms() > deadline)
				break;
			kv_test_sleep_ms(1);
		}
		if (r.status != 0) {
			w->failed = r.status;
			break;
		}
		atomic_store(&w->acked, i);
		atomic_fetch_add(&w->writes, 1);
	}
	atomic_store(&w->paused, true);
	return NULL;
}

static void
writer_pause(writer *w)
{
	uint64_t deadline = now_ms() + 20000;
	atomic_store(&w->pause, true);
	while (!atomic_load(&w->paused)) {
		if (now_ms() > deadline)
			fail_msg("writer does not pause");
		kv_test_sleep_ms(1);
	}
}

static void
migration_moves_data_written_before_and_during_the_copy(void **state)
{
	(void)state;
	nodes_up(2, 2, NULL, 1, 1);
	load_keys(procs[0].url, "k", 20000);
	load_keys(procs[0].url, "a", 100);

	writer w = {.key = "kw"};
	snprintf(w.start_url, sizeof(w.start_url), "%s", procs[0].url);
	atomic_store(&w.acked, -1);
	pthread_t wt;
	assert_int_equal(pthread_create(&wt, NULL, writer_main, &w), 0);
	while (atomic_load(&w.writes) < 20)
		kv_test_sleep_ms(1);

	fake_cfg b = fake_cfg_owners(ctl, 0, "k", 1, 2);
	fake_cfg_mig(&b, 1, "k", "", 1, 2);
	fake_cfg_publish(ctl, &b);
	fake_ctl_wait_done(ctl, 1, 60000);
	fake_ctl_publish_owners(ctl, "k", 1, 2);
	long before = atomic_load(&w.writes);
	while (atomic_load(&w.writes) < before + 20)
		kv_test_sleep_ms(1);
	atomic_store(&w.stop, true);
	pthread_join(wt, NULL);
	assert_int_equal(w.failed, 0);

	check_keys(procs[1].url, "k", 20000);
	check_keys(procs[0].url, "a", 100);
	char v[32];
	snprintf(v, sizeof(v), "%ld", atomic_load(&w.acked));
	assert_string_equal(do_get(procs[1].url, "kw").value, v);
	res1 r = do_get(procs[0].url, "k00001");
	assert_int_equal(r.status, SHARDKV__STATUS__STATUS_WRONG_OWNER);
	assert_int_equal(r.hint_node, 2);
	assert_string_equal(r.hint_addr, procs[1].url);
	r = do_get(procs[1].url, "a00001");
	assert_int_equal(r.status, SHARDKV__STATUS__STATUS_WRONG_OWNER);
	assert_int_equal(r.hint_node, 1);
	pthread_mutex_lock(&ctl->mu);
	unsigned hb = ctl->heartbeats;
	uint64_t hbkeys = ctl->hb_range_keys;
	pthread_mutex_unlock(&ctl->mu);
	assert_true(hb > 0);
	assert_true(hbkeys > 0);
	clients_close();
}

static void
write_acknowledged_after_a_move_is_never_replaced_by_migrated_data(void **state)
{
	(void)state;
	nodes_up(2, 2, NULL, 1, 1);
	load_keys(procs[0].url, "x", 2000);

	writer w = {.key = "x"};
	snprintf(w.start_url, sizeof(w.start_url), "%s", procs[0].url);
	atomic_store(&w.acked, -1);
	pthread_t wt;
	assert_int_equal(pthread_create(&wt, NULL, writer_main, &w), 0);
	long last_seen = -1;
	char url[64];
	snprintf(url, sizeof(url), "%s", procs[0].url);
	for (uint64_t round = 1; round <= 20; round++) {
		uint32_t from = round % 2 ? 1 : 2, to = round % 2 ? 2 : 1;
		fake_cfg b = fake_cfg_owners(ctl, 0, NULL, to, to);
		fake_cfg_mig(&b, round, "", "", from, to);
		fake_cfg_publish(ctl, &b);
		fake_ctl_wait_done(ctl, round, 60000);
		fake_ctl_publish_owners(ctl, NULL, to, to);
		/* Let the writer reach the new owner, then compare. */
		long before = atomic_load(&w.writes);
		while (atomic_load(&w.writes) < before + 5 && w.failed == 0)
			kv_test_sleep_ms(1);
		writer_pause(&w);
		res1 r = routed(url, sizeof(url), false, "x", NULL, 0, 0);
		assert_int_equal(r.status, 0);
		long got = strtol(r.value, NULL, 10);
		if (got != atomic_load(&w.acked) || got < last_seen) {
			dump_logs();
			fail_msg("round %llu: read %ld, last acknowledged %ld, previous read %ld",
			         (unsigned long long)round, got, atomic_load(&w.acked), last_seen);
		}
		assert_string_equal(url, procs[to - 1].url);
		last_seen = got;
		check_keys(procs[to - 1].url, "x", 2000);
		atomic_store(&w.pause, false);
	}
	atomic_store(&w.stop, true);
	pthread_join(wt, NULL);
	assert_int_equal(w.failed, 0);
	clients_close();
}

static void
two_servers_swapping_ranges_at_the_same_time_both_complete(void **state)
{
	(void)state;
	nodes_up(2, 2, "m", 1, 2);
	load_keys(procs[0].url, "a", 10000);
	load_keys(procs[1].url, "n", 10000);
	for (uint64_t round = 0; round < 4; round++) {
		uint32_t left = round % 2 ? 1 : 2, right = round % 2 ? 2 : 1;
		fake_cfg b = fake_cfg_owners(ctl, 0, "m", left, right);
		fake_cfg_mig(&b, 10 + 2 * round, "", "m", right, left);
		fake_cfg_mig(&b, 11 + 2 * round, "m", "", left, right);
		fake_cfg_publish(ctl, &b);
		fake_ctl_wait_done(ctl, 10 + 2 * round, 60000);
		fake_ctl_wait_done(ctl, 11 + 2 * round, 60000);
		fake_ctl_publish_owners(ctl, "m", left, right);
		check_keys(procs[left - 1].url, "a", 10000);
		check_keys(procs[right - 1].url, "n", 10000);
		assert_int_equal(do_get(procs[right - 1].url, "a00000").status,
		                 SHARDKV__STATUS__STATUS_WRONG_OWNER);
	}
	clients_close();
}

static void
server_refuses_bad_flags_and_busy_ports(void **state)
{
	(void)state;
	int st;
	char *argv[] = {(char *)KV_SERVER_BIN, "--listen", NULL};
	procs[0].pid = kv_proc_spawn(KV_SERVER_BIN, argv, NULL);
	assert_true(procs[0].pid > 0);
	st = proc_wait_exit(&procs[0], 10000, "server with a bad flag did not exit");
	assert_int_equal(WEXITSTATUS(st), 2);
	/* A listen address already taken: exit 1. */
	fake_ctl_add_node(ctl, ctl->url);
	snprintf(procs[0].url, sizeof(procs[0].url), "%s", ctl->url);
	proc_start(&procs[0], ctl->url);
	st = proc_wait_exit(&procs[0], 10000, "server with a busy port did not exit");
	assert_int_equal(WEXITSTATUS(st), 1);
}

static void
destination_down_delays_only_its_migration(void **state)
{
	(void)state;
	uint64_t e = nodes_up(2, 1, NULL, 1, 1); /* node 2, the destination, starts late */
	load_keys(procs[0].url, "a", 500);
	load_keys(procs[0].url, "t", 500);
	fake_cfg b = fake_cfg_owners(ctl, 0, "m", 1, 2);
	fake_cfg_mig(&b, 1, "m", "", 1, 2);
	e = fake_cfg_publish(ctl, &b);
	wait_ready(procs[0].url, e);
	/* The source keeps serving both ranges, reads and writes, while it retries. */
	uint64_t until = now_ms() + 1500;
	while (now_ms() < until) {
		assert_int_equal(do_put(procs[0].url, "a00001", "v1", 0, 0).status, 0);
		assert_int_equal(do_put(procs[0].url, "t00001", "v1", 0, 0).status, 0);
		assert_string_equal(do_get(procs[0].url, "t00002").value, "v2");
		kv_test_sleep_ms(10);
	}
	assert_false(fake_ctl_done(ctl, 1));
	node_start(&procs[1], ctl->url);
	fake_ctl_wait_done(ctl, 1, 30000);
	fake_ctl_publish_owners(ctl, "m", 1, 2);
	assert_string_equal(do_get(procs[1].url, "t00001").value, "v1");
	assert_string_equal(do_get(procs[1].url, "t00499").value, "v499");
	assert_string_equal(do_get(procs[0].url, "a00001").value, "v1");
	clients_close();
}

static void
transfer_out_of_order_is_refused_and_the_server_survives(void **state)
{
	(void)state;
	uint64_t e = nodes_up(1, 1, NULL, 1, 1);
	Shardkv__Request rq = SHARDKV__REQUEST__INIT;
	Shardkv__Transfer t = SHARDKV__TRANSFER__INIT;
	Shardkv__TransferChunk c = SHARDKV__TRANSFER_CHUNK__INIT;
	Shardkv__TransferBegin bg = SHARDKV__TRANSFER_BEGIN__INIT;
	rq.transfer = &t;
	rq.epoch = e;
	t.migration_id = 5;
	t.seq = 3;
	t.msg_case = SHARDKV__TRANSFER__MSG_CHUNK;
	t.chunk = &c;
	Shardkv__Response *r = call(procs[0].url, &rq);
	assert_non_null(r->transfer_ack);
	assert_int_equal(r->transfer_ack->status, SHARDKV__STATUS__STATUS_INVALID);
	shardkv__response__free_unpacked(r, NULL);
	/* A Begin naming another destination, or a range this node serves. */
	t.seq = 1;
	t.msg_case = SHARDKV__TRANSFER__MSG_BEGIN;
	t.begin = &bg;
	bg.epoch = e;
	bg.start = bd("a");
	bg.from_node = 7;
	bg.to_node = 9;
	r = call(procs[0].url, &rq);
	assert_int_equal(r->transfer_ack->status, SHARDKV__STATUS__STATUS_INVALID);
	shardkv__response__free_unpacked(r, NULL);
	bg.to_node = 1;
	r = call(procs[0].url, &rq);
	assert_int_equal(r->transfer_ack->status, SHARDKV__STATUS__STATUS_INVALID);
	shardkv__response__free_unpacked(r, NULL);
	/* From a future epoch: busy until that configuration is applied. */
	bg.epoch = e + 5;
	r = call(procs[0].url, &rq);
	assert_int_equal(r->transfer_ack->status, SHARDKV__STATUS__STATUS_BUSY);
	shardkv__response__free_unpacked(r, NULL);
	assert_int_equal(do_put(procs[0].url, "still", "here", 0, 0).status, 0);
	clients_close();
}

static void
sigterm_drains_the_node_before_it_exits(void **state)
{
	(void)state;
	ctl->accept_leave = true;
	fake_ctl_add_node(ctl, procs[0].url);
	fake_ctl_add_node(ctl, procs[1].url);
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 1, 1);
	proc_start(&procs[0], ctl->url);
	node_start(&procs[1], ctl->url);
	wait_ready(procs[0].url, e);
	wait_ready(procs[1].url, e);
	load_keys(procs[0].url, "l", 3000);
	kill(procs[0].pid, SIGTERM);
	fake_ctl_wait_leave(ctl, 1, 10000);
	/* Still serving while draining. */
	assert_int_equal(do_get(procs[0].url, "l00007").status, 0);
	fake_ctl_drain(ctl, 1, 2, 1, 30000);
	int st = proc_wait_exit(&procs[0], 15000, "drained server did not exit");
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	check_keys(procs[1].url, "l", 3000);
	clients_close();
}

/* The binary's exit code after a stop by signal: SIGTERM whose leave the
 * controller refuses, and SIGINT (no leave at all), both exit 0. */
static void
sigterm_with_a_refused_leave_and_sigint_both_exit_zero(void **state)
{
	(void)state;
	int st;
	fake_ctl_add_node(ctl, procs[0].url);
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 1, 1);
	proc_start(&procs[0], ctl->url);
	wait_ready(procs[0].url, e);
	st = proc_stop(&procs[0]);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	pthread_mutex_lock(&ctl->mu);
	assert_int_equal(ctl->leave_from, 1);
	pthread_mutex_unlock(&ctl->mu);
	clients_close();
	proc_start(&procs[0], ctl->url);
	wait_ready(procs[0].url, e);
	kill(procs[0].pid, SIGINT);
	st = proc_wait_exit(&procs[0], 10000, "server did not exit on SIGINT");
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	clients_close();
}

/* A second signal during the graceful leave stops the binary at once,
 * without draining, and it still exits 0. */
static void
second_sigterm_cuts_the_drain_short(void **state)
{
	(void)state;
	int st;
	ctl->accept_leave = true;
	fake_ctl_add_node(ctl, procs[0].url);
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 1, 1);
	proc_start(&procs[0], ctl->url);
	wait_ready(procs[0].url, e);
	kill(procs[0].pid, SIGTERM);
	fake_ctl_wait_leave(ctl, 1, 10000);
	/* Draining now: nothing will ever mark the node gone. */
	kv_test_sleep_ms(200);
	assert_false(kv_proc_exited(procs[0].pid, &st));
	kill(procs[0].pid, SIGTERM);
	st = proc_wait_exit(&procs[0], 5000, "second SIGTERM did not stop the server");
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "grep -q 'second signal, stopping without draining' '%s'",
	         procs[0].log);
	assert_int_equal(system(cmd), 0);
	clients_close();
}

static void
restart_with_the_data_dir_resumes_the_node_id(void **state)
{
	(void)state;
	fake_ctl_add_node(ctl, procs[1].url); /* node 1 is someone else */
	fake_ctl_publish_owners(ctl, NULL, 1, 1);
	node_start(&procs[0], ctl->url);
	wait_ready(procs[0].url, 1);
	assert_int_equal(node_stop(&procs[0]), 0);
	pthread_mutex_lock(&ctl->mu);
	unsigned regs = ctl->registers;
	assert_int_equal(ctl->last_resume, 0);
	/* Forget the address, so only the stored id can name the node. */
	snprintf(ctl->addrs[1], sizeof(ctl->addrs[1]), "tcp://forgotten");
	pthread_mutex_unlock(&ctl->mu);
	node_start(&procs[0], ctl->url);
	assert_int_equal(fake_ctl_wait_register(ctl, regs, 10000), 2);
	clients_close();
}

/* Load generator of the throughput measurement (KV_SERVER_BENCH=1). */
typedef struct {
	const char *url;   /* server */
	unsigned batch;    /* ops per request */
	atomic_bool *stop; /* stop flag */
	uint64_t ops;      /* ops done */
	unsigned seed;     /* rand_r state */
} bench_thr;

static void *
bench_main(void *arg)
{
	bench_thr *t = arg;
	kv_rpc_client *c;
	assert_int_equal(kv_rpc_client_create(t->url, &c), 0);
	while (!atomic_load(t->stop)) {
		Shardkv__Request rq = SHARDKV__REQUEST__INIT;
		Shardkv__Op op[64], *ops[64];
		Shardkv__GetOp g[64];
		Shardkv__PutOp p[64];
		char k[64][16];
		for (unsigned i = 0; i < t->batch; i++) {
			Shardkv__Op oi = SHARDKV__OP__INIT;
			Shardkv__GetOp gi = SHARDKV__GET_OP__INIT;
			Shardkv__PutOp pi = SHARDKV__PUT_OP__INIT;
			op[i] = oi;
			g[i] = gi;
			p[i] = pi;
			snprintf(k[i], sizeof(k[i]), "b%05d", rand_r(&t->seed) % 100000);
			if (rand_r(&t->seed) % 10 == 0) {
				p[i].key = bd(k[i]);
				p[i].value = bd("0123456789abcdef0123456789abcdef");
				op[i].op_case = SHARDKV__OP__OP_PUT;
				op[i].put = &p[i];
			} else {
				g[i].key = bd(k[i]);
				op[i].op_case = SHARDKV__OP__OP_GET;
				op[i].get = &g[i];
			}
			ops[i] = &op[i];
		}
		rq.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
		rq.n_ops = t->batch;
		rq.ops = ops;
		size_t n = shardkv__request__get_packed_size(&rq);
		nng_msg *req, *rep;
		assert_int_equal(nng_msg_alloc(&req, n), 0);
		shardkv__request__pack(&rq, nng_msg_body(req));
		if (kv_rpc_call(c, req, &rep, 5000) == 0) {
			nng_msg_free(rep);
			t->ops += t->batch;
		}
	}
	kv_rpc_client_destroy(c);
	return NULL;
}

static void
server_throughput_bench(void **state)
{
	(void)state;
	if (getenv("KV_SERVER_BENCH") == NULL)
		skip();
	if (getenv("KV_SERVER_BENCH_STORE"))
		store_mode = getenv("KV_SERVER_BENCH_STORE");
	unsigned nthr = getenv("KV_SERVER_BENCH_CLIENTS")
	                    ? (unsigned)atoi(getenv("KV_SERVER_BENCH_CLIENTS"))
	                    : 16;
	unsigned batch =
	    getenv("KV_SERVER_BENCH_BATCH") ? (unsigned)atoi(getenv("KV_SERVER_BENCH_BATCH")) : 1;
	nodes_up(1, 1, NULL, 1, 1);
	load_keys(procs[0].url, "b", 100000);
	atomic_bool stop = false;
	bench_thr t[64];
	pthread_t th[64];
	for (unsigned i = 0; i < nthr && i < 64; i++) {
		t[i] =
		    (bench_thr){.url = procs[0].url, .batch = batch, .stop = &stop, .seed = i + 1};
		pthread_create(&th[i], NULL, bench_main, &t[i]);
	}
	kv_test_sleep_ms(5000);
	atomic_store(&stop, true);
	uint64_t total = 0;
	for (unsigned i = 0; i < nthr && i < 64; i++) {
		pthread_join(th[i], NULL);
		total += t[i].ops;
	}
	printf("bench store=%s clients=%u batch=%u ops/s=%.0f\n", store_mode, nthr, batch,
	       (double)total / 5.0);
	clients_close();
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(server_refuses_bad_flags_and_busy_ports, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(server_serves_after_first_config_and_hints_other_owners,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(retried_append_is_applied_once, setup, teardown),
	    cmocka_unit_test_setup_teardown(migration_moves_data_written_before_and_during_the_copy,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        write_acknowledged_after_a_move_is_never_replaced_by_migrated_data, setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        two_servers_swapping_ranges_at_the_same_time_both_complete, setup, teardown),
	    cmocka_unit_test_setup_teardown(destination_down_delays_only_its_migration, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(
	        transfer_out_of_order_is_refused_and_the_server_survives, setup, teardown),
	    cmocka_unit_test_setup_teardown(sigterm_drains_the_node_before_it_exits, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(sigterm_with_a_refused_leave_and_sigint_both_exit_zero,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(second_sigterm_cuts_the_drain_short, setup, teardown),
	    cmocka_unit_test_setup_teardown(restart_with_the_data_dir_resumes_the_node_id, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(server_throughput_bench, setup, teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	if (getenv("KV_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KV_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
