/*
 * test_expiry_inproc.c - expiry, conditional writes, incr, exists, count and
 * delrange through shard servers inside the test process, against the fake
 * controller, with the servers' expiry clock injected
 * (kv_server_cfg.clock): the new ops' answers and their exactly-once on
 * retry; a key's expiry kept through a restart (log replay, then a
 * snapshot) and through a migration (bulk copy, and writes during a slow
 * copy that travel as deltas), after a failover, in a replica's catch-up
 * copy from its primary's store, and an expired key reclaimed as a
 * logged delete; a big delrange in steps while other requests are served.
 *
 * Every server a test creates is destroyed by the teardown, whatever the
 * outcome; every wait polls with a deadline.
 */
#include "common/err.h"
#include "shardserver/server.h"
#include "tests/support/fake_ctl.h"
#include "tests/support/inproc_srv.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <dirent.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define NSRV 2

static inproc_srv srvs[NSRV];
static fake_ctl *ctl;
static char tmpdir[128];

/* The servers' expiry clock, Unix ms. */
static _Atomic uint64_t clock_ms;

static uint64_t
test_clock(void *arg)
{
	(void)arg;
	return atomic_load(&clock_ms);
}

static int
setup(void **state)
{
	(void)state;
	inproc_srv_setup(srvs, NSRV, &ctl, tmpdir, sizeof(tmpdir), "kvexpiry", 16);
	atomic_store(&clock_ms, 1700000000000ull);
	for (int i = 0; i < NSRV; i++) {
		srvs[i].cfg.clock = test_clock;
		srvs[i].cfg.clock_arg = NULL;
	}
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	inproc_srv_cleanup(srvs, NSRV, &ctl, tmpdir);
	return 0;
}

static void
advance(uint64_t ms)
{
	atomic_fetch_add(&clock_ms, ms);
}

/* put with a TTL and a condition. */
static res1
put_x(const char *u, const char *k, const char *v, uint64_t ttl, Shardkv__Cond cond,
      const char *expect, uint64_t client, uint64_t reqid)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__PutOp p = SHARDKV__PUT_OP__INIT;
	p.key = bd(k);
	p.value = bd(v);
	p.ttl_ms = ttl;
	p.cond = cond;
	if (expect)
		p.expect = bd(expect);
	op.op_case = SHARDKV__OP__OP_PUT;
	op.put = &p;
	op.request_id = reqid;
	return one_op(u, &op, client);
}

static res1
del_if(const char *u, const char *k, const char *expect)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__DelOp d = SHARDKV__DEL_OP__INIT;
	d.key = bd(k);
	d.cond = SHARDKV__COND__COND_IF_EQUAL;
	d.expect = bd(expect);
	op.op_case = SHARDKV__OP__OP_DEL;
	op.del = &d;
	return one_op(u, &op, 0);
}

static res1
incr(const char *u, const char *k, int64_t delta, uint64_t client, uint64_t reqid)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__IncrOp x = SHARDKV__INCR_OP__INIT;
	x.key = bd(k);
	x.delta = delta;
	op.op_case = SHARDKV__OP__OP_INCR;
	op.incr = &x;
	op.request_id = reqid;
	return one_op(u, &op, client);
}

static res1
ttl(const char *u, const char *k)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__TtlOp x = SHARDKV__TTL_OP__INIT;
	x.key = bd(k);
	op.op_case = SHARDKV__OP__OP_TTL;
	op.ttl = &x;
	return one_op(u, &op, 0);
}

static res1
exists(const char *u, const char *k)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__ExistsOp x = SHARDKV__EXISTS_OP__INIT;
	x.key = bd(k);
	op.op_case = SHARDKV__OP__OP_EXISTS;
	op.exists = &x;
	return one_op(u, &op, 0);
}

static res1
expire(const char *u, const char *k, uint64_t ms, bool persist)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__ExpireOp x = SHARDKV__EXPIRE_OP__INIT;
	x.key = bd(k);
	x.ttl_ms = ms;
	x.persist = persist;
	op.op_case = SHARDKV__OP__OP_EXPIRE;
	op.expire = &x;
	return one_op(u, &op, 0);
}

static res1
count_from(const char *u, const char *start, const char *end, const void *cursor, size_t clen,
           uint32_t limit)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__CountOp x = SHARDKV__COUNT_OP__INIT;
	x.start = bd(start);
	x.end = bd(end);
	x.cursor = (ProtobufCBinaryData){clen, (uint8_t *)cursor};
	x.limit = limit;
	op.op_case = SHARDKV__OP__OP_COUNT;
	op.count = &x;
	return one_op(u, &op, 0);
}

static res1
count(const char *u, const char *start, const char *end, const char *cursor, uint32_t limit)
{
	return count_from(u, start, end, cursor, strlen(cursor), limit);
}

static res1
delrange(const char *u, const char *start, const char *end, const void *cursor, size_t clen,
         uint32_t limit, uint64_t client, uint64_t reqid)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__DelRangeOp x = SHARDKV__DEL_RANGE_OP__INIT;
	x.start = bd(start);
	x.end = bd(end);
	x.cursor = (ProtobufCBinaryData){clen, (uint8_t *)cursor};
	x.limit = limit;
	op.op_case = SHARDKV__OP__OP_DELRANGE;
	op.delrange = &x;
	op.request_id = reqid;
	return one_op(u, &op, client);
}

/* Starts server 0 alone, owning everything; returns its URL. */
static const char *
one_server_up(void)
{
	fake_ctl_add_node(ctl, srvs[0].url);
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 1, 1);
	inproc_srv_up(&srvs[0]);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	return srvs[0].url;
}

/* Restarts server 0 on its data dir and waits until it serves `key`. */
static void
restart_until_served(const char *key)
{
	inproc_srv_down(&srvs[0]);
	clients_close();
	pthread_mutex_lock(&ctl->mu);
	unsigned regs = ctl->registers;
	pthread_mutex_unlock(&ctl->mu);
	inproc_srv_up(&srvs[0]);
	fake_ctl_wait_register(ctl, regs, 10000);
	uint64_t deadline = kv_test_now_ms() + 10000;
	res1 r;
	while ((r = exists(srvs[0].url, key)).status != 0 && kv_test_now_ms() < deadline)
		kv_test_sleep_ms(10);
	assert_int_equal(r.status, 0);
}

static void
new_ops_answer_as_the_protocol_says_and_retries_get_the_first_answer(void **state)
{
	(void)state;
	const char *u = one_server_up();
	res1 r;

	/* Conditional put and del. */
	assert_int_equal(put_x(u, "c", "one", 0, SHARDKV__COND__COND_IF_ABSENT, NULL, 0, 0).status,
	                 0);
	r = put_x(u, "c", "two", 0, SHARDKV__COND__COND_IF_ABSENT, NULL, 0, 0);
	assert_int_equal(r.status, SHARDKV__STATUS__STATUS_EXISTS);
	assert_false(r.current_absent);
	assert_string_equal(r.value, "one");
	r = put_x(u, "c", "two", 0, SHARDKV__COND__COND_IF_EQUAL, "uno", 0, 0);
	assert_int_equal(r.status, SHARDKV__STATUS__STATUS_MISMATCH);
	assert_string_equal(r.value, "one");
	r = put_x(u, "nope", "two", 0, SHARDKV__COND__COND_IF_EQUAL, "uno", 0, 0);
	assert_int_equal(r.status, SHARDKV__STATUS__STATUS_MISMATCH);
	assert_true(r.current_absent);
	assert_int_equal(put_x(u, "c", "two", 0, SHARDKV__COND__COND_IF_EQUAL, "one", 0, 0).status,
	                 0);
	assert_int_equal(del_if(u, "c", "one").status, SHARDKV__STATUS__STATUS_MISMATCH);
	r = del_if(u, "c", "two");
	assert_int_equal(r.status, 0);
	assert_string_equal(r.value, "two");
	assert_int_equal(exists(u, "c").status, SHARDKV__STATUS__STATUS_NOT_FOUND);

	/* incr: exactly once on retry, strict, overflow refused. */
	assert_int_equal(incr(u, "n", 5, 77, 1).number, 5);
	assert_int_equal(incr(u, "n", 5, 77, 1).number, 5); /* the retry */
	assert_int_equal(incr(u, "n", -7, 77, 2).number, -2);
	assert_string_equal(do_get(u, "n").value, "-2");
	assert_int_equal(do_put(u, "big", "9223372036854775807", 0, 0).status, 0);
	assert_int_equal(incr(u, "big", 1, 0, 0).status, SHARDKV__STATUS__STATUS_INVALID);
	assert_int_equal(do_put(u, "txt", "12a", 0, 0).status, 0);
	assert_int_equal(incr(u, "txt", 1, 0, 0).status, SHARDKV__STATUS__STATUS_INVALID);
	assert_string_equal(do_get(u, "txt").value, "12a");

	/* ttl, expire, persist, and expiry on the injected clock. */
	assert_int_equal(ttl(u, "txt").ttl_ms, -1);
	assert_int_equal(ttl(u, "none").status, SHARDKV__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(expire(u, "none", 100, false).status, SHARDKV__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(expire(u, "txt", 100, false).status, 0);
	assert_int_equal(ttl(u, "txt").ttl_ms, 100);
	assert_int_equal(expire(u, "txt", 0, true).status, 0);
	assert_int_equal(ttl(u, "txt").ttl_ms, -1);
	assert_int_equal(put_x(u, "t", "v", 1000, 0, NULL, 0, 0).status, 0);
	assert_int_equal(incr(u, "n", 1, 0, 0).status, 0);
	advance(999);
	assert_int_equal(ttl(u, "t").ttl_ms, 1);
	assert_int_equal(exists(u, "t").status, 0);
	advance(1);
	assert_int_equal(exists(u, "t").status, SHARDKV__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(do_get(u, "t").status, SHARDKV__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(put_x(u, "t", "w", 0, SHARDKV__COND__COND_IF_ABSENT, NULL, 0, 0).status,
	                 0);

	/* count and a delrange retried get their first answer. */
	char k[16];
	for (int i = 0; i < 50; i++) {
		snprintf(k, sizeof k, "r%02d", i);
		assert_int_equal(do_put(u, k, "v", 0, 0).status, 0);
	}
	r = count(u, "r", "s", "", 20);
	assert_int_equal(r.count, 20);
	assert_true(r.more);
	r = count_from(u, "r", "s", r.next_cursor, r.next_len, 0);
	assert_int_equal(r.count, 30);
	assert_false(r.more);
	res1 a = delrange(u, "r", "s", "", 0, 20, 78, 1);
	assert_int_equal(a.status, 0);
	assert_int_equal(a.count, 20);
	assert_true(a.more);
	res1 b = delrange(u, "r", "s", "", 0, 20, 78, 1); /* the retry */
	assert_int_equal(b.count, 20);
	assert_true(b.more);
	assert_int_equal(b.next_len, a.next_len);
	assert_memory_equal(b.next_cursor, a.next_cursor, a.next_len);
	assert_int_equal(count(u, "r", "s", "", 0).count, 30);
	inproc_srv_down(&srvs[0]);
}

/* The name of the newest committed snapshot in dir into out ("" when none):
 * names carry the lsn in fixed-width hex, so the largest is the newest. */
static void
newest_snapshot(const char *dir, char *out, size_t cap)
{
	DIR *d = opendir(dir);
	struct dirent *e;

	out[0] = '\0';
	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL)
		if (strncmp(e->d_name, "snap-", 5) == 0 && strstr(e->d_name, ".dat") != NULL &&
		    strcmp(e->d_name, out) > 0)
			snprintf(out, cap, "%s", e->d_name);
	closedir(d);
}

/* Whether dir holds a committed snapshot file. */
static bool
has_snapshot(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	bool found = false;

	if (d == NULL)
		return false;
	while (!found && (e = readdir(d)) != NULL)
		found = strncmp(e->d_name, "snap-", 5) == 0 && strstr(e->d_name, ".dat") != NULL;
	closedir(d);
	return found;
}

static void
expiry_survives_a_restart_through_the_log_and_a_snapshot(void **state)
{
	(void)state;
	srvs[0].cfg.snapshot_bytes = 1; /* a snapshot every time the thread looks */
	const char *u = one_server_up();
	assert_int_equal(put_x(u, "e1", "v", 5000, 0, NULL, 0, 0).status, 0);
	assert_int_equal(put_x(u, "e2", "v", 5000, 0, NULL, 0, 0).status, 0);
	assert_int_equal(put_x(u, "p", "v", 0, 0, NULL, 0, 0).status, 0);
	assert_int_equal(put_x(u, "cleared", "v", 5000, 0, NULL, 0, 0).status, 0);
	assert_int_equal(do_put(u, "cleared", "w", 0, 0).status, 0); /* a put clears it */
	assert_int_equal(incr(u, "ctr", 1, 0, 0).status, 0);
	assert_int_equal(expire(u, "ctr", 5000, false).status, 0);
	assert_int_equal(incr(u, "ctr", 1, 0, 0).status, 0); /* incr keeps it */
	assert_int_equal(incr(u, "once", 40, 81, 1).number, 40);
	assert_int_equal(do_put(u, "z1", "v", 0, 0).status, 0);
	assert_int_equal(do_put(u, "z2", "v", 0, 0).status, 0);
	res1 d = delrange(u, "z", "", "", 0, 1, 81, 2);
	assert_int_equal(d.count, 1);
	assert_true(d.more);
	restart_until_served("p");
	u = srvs[0].url;
	/* Retries after the restart get the first answers from the log. */
	assert_int_equal(incr(u, "once", 40, 81, 1).number, 40);
	res1 d2 = delrange(u, "z", "", "", 0, 1, 81, 2);
	assert_int_equal(d2.status, 0);
	assert_int_equal(d2.count, 1);
	assert_true(d2.more);
	assert_int_equal(d2.next_len, d.next_len);
	assert_memory_equal(d2.next_cursor, d.next_cursor, d.next_len);
	assert_int_equal(exists(u, "z2").status, 0);
	assert_int_equal(ttl(u, "e1").ttl_ms, 5000);
	assert_int_equal(ttl(u, "cleared").ttl_ms, -1);
	assert_int_equal(ttl(u, "ctr").ttl_ms, 5000);
	/* A write grows the log past the threshold: a snapshot follows. */
	assert_int_equal(do_put(u, "after", "v", 0, 0).status, 0);
	uint64_t deadline = kv_test_now_ms() + 10000;
	while (!has_snapshot(srvs[0].dir)) {
		if (kv_test_now_ms() > deadline)
			fail_msg("no snapshot written");
		kv_test_sleep_ms(20);
	}
	restart_until_served("p");
	u = srvs[0].url;
	assert_int_equal(ttl(u, "e2").ttl_ms, 5000);
	assert_int_equal(ttl(u, "ctr").ttl_ms, 5000);
	advance(5000);
	assert_int_equal(exists(u, "e1").status, SHARDKV__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(exists(u, "ctr").status, SHARDKV__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(exists(u, "cleared").status, 0);
	inproc_srv_down(&srvs[0]);
}

static void
an_expired_key_is_reclaimed_as_a_logged_delete(void **state)
{
	(void)state;
	const char *u = one_server_up();
	char k[16];
	for (int i = 0; i < 100; i++) {
		snprintf(k, sizeof k, "x%03d", i);
		assert_int_equal(put_x(u, k, "v", 1000, 0, NULL, 0, 0).status, 0);
	}
	assert_int_equal(do_put(u, "keep", "v", 0, 0).status, 0);
	advance(1000);
	/* The reclaim removes them from memory: set the clock back and they
	 * stay gone, also after a restart (the deletes are in the log). */
	uint64_t deadline = kv_test_now_ms() + 15000;
	for (;;) {
		atomic_fetch_sub(&clock_ms, 1000);
		int left = 0;
		for (int i = 0; i < 100; i++) {
			snprintf(k, sizeof k, "x%03d", i);
			left += exists(u, k).status == 0;
		}
		atomic_fetch_add(&clock_ms, 1000);
		if (left == 0)
			break;
		if (kv_test_now_ms() > deadline)
			fail_msg("%d expired keys never reclaimed", left);
		kv_test_sleep_ms(50);
	}
	atomic_fetch_sub(&clock_ms, 1000);
	restart_until_served("keep");
	u = srvs[0].url;
	assert_int_equal(exists(u, "x000").status, SHARDKV__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(count(u, "x", "y", "", 0).count, 0);
	inproc_srv_down(&srvs[0]);
}

static void
a_moved_range_keeps_its_keys_expiry(void **state)
{
	(void)state;
	fake_ctl_add_node(ctl, srvs[0].url);
	fake_ctl_add_node(ctl, srvs[1].url);
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 1, 1);
	inproc_srv_up(&srvs[0]);
	inproc_srv_up(&srvs[1]);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	char k[32];
	for (int i = 0; i < 100; i++) {
		snprintf(k, sizeof(k), "p%03d", i);
		assert_int_equal(put_x(srvs[0].url, k, "v", i % 2 ? 3000 : 0, 0, NULL, 0, 0).status,
		                 0);
	}
	fake_cfg b = fake_cfg_owners(ctl, 0, "m", 1, 2);
	fake_cfg_mig(&b, 1, "m", "", 1, 2);
	fake_cfg_publish(ctl, &b);
	fake_ctl_wait_done(ctl, 1, 30000);
	e = fake_ctl_publish_owners(ctl, "m", 1, 2);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	const char *u = srvs[1].url;
	for (int i = 0; i < 100; i++) {
		snprintf(k, sizeof(k), "p%03d", i);
		res1 r = ttl(u, k);
		assert_int_equal(r.status, 0);
		assert_int_equal(r.ttl_ms, i % 2 ? 3000 : -1);
	}
	advance(3000);
	assert_int_equal(count(u, "p", "q", "", 0).count, 50);
	inproc_srv_down(&srvs[1]);
	inproc_srv_down(&srvs[0]);
}

static void
writes_during_a_slow_copy_carry_their_expiry_to_the_destination(void **state)
{
	(void)state;
	fake_ctl_add_node(ctl, srvs[0].url);
	fake_ctl_add_node(ctl, srvs[1].url);
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 1, 1);
	inproc_srv_up(&srvs[0]);
	inproc_srv_up(&srvs[1]);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	static char big[1001];
	memset(big, 'x', 1000);
	char k[32];
	for (int i = 0; i < 2000; i++) {
		snprintf(k, sizeof(k), "p%04d", i);
		assert_int_equal(do_put(srvs[0].url, k, big, 0, 0).status, 0);
	}
	/* About 2 MB at 1 MB/s: the writes below land during the copy and
	 * travel as deltas. */
	fake_cfg b = fake_cfg_owners(ctl, 0, "m", 1, 2);
	fake_cfg_mig(&b, 1, "m", "", 1, 2);
	b.c->migs[0].rate_limit_mb_s = 1;
	fake_cfg_publish(ctl, &b);
	int written = 0;
	for (int i = 0; i < 2000; i += 20) {
		snprintf(k, sizeof(k), "p%04d", i);
		res1 r = put_x(srvs[0].url, k, "new", 5000 + (uint64_t)i, 0, NULL, 0, 0);
		if (r.status != 0)
			break; /* fenced: the rest stay as they were */
		r = incr(srvs[0].url, "p-n", 1, 0, 0);
		if (r.status != 0)
			break;
		written++;
		kv_test_sleep_ms(5);
	}
	fake_ctl_wait_done(ctl, 1, 30000);
	e = fake_ctl_publish_owners(ctl, "m", 1, 2);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	assert_true(written > 0);
	const char *u = srvs[1].url;
	for (int i = 0; i < written * 20; i += 20) {
		snprintf(k, sizeof(k), "p%04d", i);
		res1 r = ttl(u, k);
		assert_int_equal(r.status, 0);
		assert_int_equal(r.ttl_ms, 5000 + i);
		assert_string_equal(do_get(u, k).value, "new");
	}
	snprintf(k, sizeof(k), "p%04d", written * 20 + 20);
	if (written * 20 + 20 < 2000)
		assert_int_equal(ttl(u, k).ttl_ms, -1);
	inproc_srv_down(&srvs[1]);
	inproc_srv_down(&srvs[0]);
}

/* Gets and puts on other keys while a delrange runs. */
typedef struct {
	const char *url;
	atomic_bool stop;
	atomic_int ops;
	int failed;
} bystander;

static void *
bystander_main(void *arg)
{
	bystander *b = arg;
	char k[16];
	while (!atomic_load(&b->stop)) {
		snprintf(k, sizeof k, "b%d", atomic_load(&b->ops) % 10);
		if (do_put(b->url, k, "v", 0, 0).status != 0 || do_get(b->url, k).status != 0)
			b->failed++;
		atomic_fetch_add(&b->ops, 1);
	}
	return NULL;
}

static void
a_big_delrange_runs_in_steps_while_other_requests_are_served(void **state)
{
	(void)state;
	const char *u = one_server_up();
	enum {
		N = 20000,
		BATCH = 40
	}; /* keys per mput: under ThreadSanitizer a thread may hold 64 locks */
	static char kbuf[BATCH][16];
	for (int i = 0; i < N; i += BATCH) {
		Shardkv__Op op = SHARDKV__OP__INIT;
		Shardkv__MPutOp m = SHARDKV__MPUT_OP__INIT;
		ProtobufCBinaryData keys[BATCH], vals[BATCH];
		for (int j = 0; j < BATCH; j++) {
			snprintf(kbuf[j], sizeof kbuf[j], "d%06d", i + j);
			keys[j] = bd(kbuf[j]);
			vals[j] = bd("value");
		}
		m.n_keys = BATCH;
		m.keys = keys;
		m.n_values = BATCH;
		m.values = vals;
		op.op_case = SHARDKV__OP__OP_MPUT;
		op.mput = &m;
		assert_int_equal(one_op(u, &op, 0).status, 0);
	}
	bystander b = {.url = u};
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, bystander_main, &b), 0);
	uint64_t deadline = kv_test_now_ms() + 15000;
	while (atomic_load(&b.ops) == 0 && kv_test_now_ms() < deadline)
		kv_test_sleep_ms(1); /* the bystander is under way before the first step */
	char cur[64] = "";
	size_t clen = 0;
	uint64_t total = 0;
	int steps = 0;
	for (;;) {
		res1 r = delrange(u, "d", "e", cur, clen, 1000, 79, (uint64_t)steps + 1);
		assert_int_equal(r.status, 0);
		assert_true(r.count <= 1000);
		total += r.count;
		steps++;
		if (!r.more)
			break;
		memcpy(cur, r.next_cursor, r.next_len);
		clen = r.next_len;
		if (steps > 100)
			break;
	}
	atomic_store(&b.stop, true);
	pthread_join(t, NULL);
	assert_int_equal(total, N);
	assert_int_equal(steps, N / 1000);
	assert_int_equal(b.failed, 0);
	assert_true(atomic_load(&b.ops) > 0);
	assert_int_equal(count(u, "d", "e", "", 0).count, 0);
	int ops = atomic_load(&b.ops);
	assert_int_equal(count(u, "b", "c", "", 0).count, ops < 10 ? ops : 10);
	/* The steps are in the log: gone after a restart. */
	restart_until_served("b0");
	assert_int_equal(count(srvs[0].url, "d", "e", "", 0).count, 0);
	inproc_srv_down(&srvs[0]);
}

/* The backup's copy of key, read as the store has it (expiry applies). */
static bool
copy_has(inproc_srv *v, const char *key)
{
	kv_buf val = {0};
	int rv = kv_server_get_for_test(v->s, key, strlen(key), &val);
	kv_buf_fini(&val);
	return rv == 0;
}

static void
after_a_failover_the_new_primary_keeps_every_expiry(void **state)
{
	const uint32_t r12[2] = {1, 2}, r21[2] = {2, 1}, only2[1] = {2};
	(void)state;
	fake_ctl_add_node(ctl, srvs[0].url);
	fake_ctl_add_node(ctl, srvs[1].url);
	uint64_t e = fake_ctl_publish_replicas(ctl, r12, 2, r12, 2, 0);
	inproc_srv_up(&srvs[0]);
	inproc_srv_up(&srvs[1]);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	const char *u = srvs[0].url;
	assert_int_equal(put_x(u, "t1", "v", 2000, 0, NULL, 0, 0).status, 0);
	assert_int_equal(put_x(u, "late", "v", 500, 0, NULL, 0, 0).status, 0);
	assert_int_equal(put_x(u, "gone", "v", 100, 0, NULL, 0, 0).status, 0);
	assert_int_equal(incr(u, "n", 3, 0, 0).status, 0);
	assert_int_equal(expire(u, "n", 2000, false).status, 0);
	assert_int_equal(incr(u, "n", 3, 0, 0).status, 0);
	char k[16];
	for (int i = 0; i < 30; i++) {
		snprintf(k, sizeof k, "r%02d", i);
		assert_int_equal(do_put(u, k, "v", 0, 0).status, 0);
	}
	res1 d = delrange(u, "r", "s", "", 0, 20, 0, 0);
	assert_int_equal(d.count, 20);
	/* "gone" expires and the primary reclaims it: the delete reaches the
	 * backup (seen with the clock set back). */
	advance(100);
	uint64_t deadline = kv_test_now_ms() + 15000;
	for (;;) {
		atomic_fetch_sub(&clock_ms, 100);
		bool there = copy_has(&srvs[1], "gone");
		atomic_fetch_add(&clock_ms, 100);
		if (!there)
			break;
		if (kv_test_now_ms() > deadline)
			fail_msg("the reclaim never reached the backup");
		kv_test_sleep_ms(20);
	}
	assert_true(copy_has(&srvs[1], "t1"));
	assert_false(copy_has(&srvs[1], "r05"));
	assert_true(copy_has(&srvs[1], "r25"));
	advance(400); /* "late" has expired on the primary's clock, maybe not reclaimed */

	/* Node 1 is lost: node 2 leads alone. */
	inproc_srv_down(&srvs[0]);
	e = fake_ctl_publish_replicas(ctl, r21, 2, only2, 1, 0);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	u = srvs[1].url;
	deadline = kv_test_now_ms() + 15000;
	res1 r;
	while ((r = ttl(u, "t1")).status != 0 && kv_test_now_ms() < deadline)
		kv_test_sleep_ms(10);
	assert_int_equal(r.status, 0);
	assert_int_equal(r.ttl_ms, 1500);
	assert_int_equal(ttl(u, "n").ttl_ms, 1500);
	assert_string_equal(do_get(u, "n").value, "6");
	assert_int_equal(do_get(u, "late").status, SHARDKV__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(exists(u, "gone").status, SHARDKV__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(count(u, "r", "s", "", 0).count, 10);
	advance(1500);
	assert_int_equal(do_get(u, "t1").status, SHARDKV__STATUS__STATUS_NOT_FOUND);
	assert_int_equal(exists(u, "n").status, SHARDKV__STATUS__STATUS_NOT_FOUND);
	inproc_srv_down(&srvs[1]);
}

/* Waits until v's store holds key (expiry applies), or fails the test. */
static void
wait_copy_has(inproc_srv *v, const char *key)
{
	uint64_t deadline = kv_test_now_ms() + 15000;
	while (!copy_has(v, key)) {
		if (kv_test_now_ms() > deadline)
			fail_msg("the replica never got %s", key);
		kv_test_sleep_ms(10);
	}
}

static void
a_replica_copied_from_its_primary_gets_every_deadline(void **state)
{
	const uint32_t r12[2] = {1, 2}, only1[1] = {1};
	(void)state;
	srvs[0].cfg.snapshot_bytes = 1; /* the log is cut: the replica needs a copy */
	fake_ctl_add_node(ctl, srvs[0].url);
	fake_ctl_add_node(ctl, srvs[1].url);
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 1, 1);
	inproc_srv_up(&srvs[0]);
	inproc_srv_up(&srvs[1]);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	const char *u = srvs[0].url;
	char k[16];
	for (int i = 0; i < 200; i++) {
		snprintf(k, sizeof k, "c%03d", i);
		assert_int_equal(put_x(u, k, "v", i % 2 ? 1000 : 0, 0, NULL, 0, 0).status, 0);
	}
	/* A snapshot begun after every write above cuts the log before them. */
	char before[300], now[300];
	newest_snapshot(srvs[0].dir, before, sizeof before);
	assert_int_equal(do_put(u, "marker", "v", 0, 0).status, 0);
	uint64_t deadline = kv_test_now_ms() + 15000;
	for (;;) {
		newest_snapshot(srvs[0].dir, now, sizeof now);
		if (strcmp(now, before) > 0)
			break;
		if (kv_test_now_ms() > deadline)
			fail_msg("no snapshot written after the writes");
		kv_test_sleep_ms(20);
	}
	/* Node 2 becomes a replica outside the ISR: its primary copies the
	 * range to it, every key from the store (none from the log). */
	e = fake_ctl_publish_replicas(ctl, r12, 2, only1, 1, 0);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	wait_copy_has(&srvs[1], "c199");
	wait_copy_has(&srvs[1], "c198");
	/* With the primary gone, the copy alone judges the deadlines. */
	inproc_srv_down(&srvs[0]);
	advance(1000);
	for (int i = 0; i < 200; i++) {
		snprintf(k, sizeof k, "c%03d", i);
		assert_int_equal(copy_has(&srvs[1], k), i % 2 == 0);
	}
	inproc_srv_down(&srvs[1]);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(
	        new_ops_answer_as_the_protocol_says_and_retries_get_the_first_answer, setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        expiry_survives_a_restart_through_the_log_and_a_snapshot, setup, teardown),
	    cmocka_unit_test_setup_teardown(an_expired_key_is_reclaimed_as_a_logged_delete, setup,
	                                    teardown),
	    cmocka_unit_test_setup_teardown(a_moved_range_keeps_its_keys_expiry, setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        writes_during_a_slow_copy_carry_their_expiry_to_the_destination, setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        a_big_delrange_runs_in_steps_while_other_requests_are_served, setup, teardown),
	    cmocka_unit_test_setup_teardown(after_a_failover_the_new_primary_keeps_every_expiry,
	                                    setup, teardown),
	    cmocka_unit_test_setup_teardown(a_replica_copied_from_its_primary_gets_every_deadline,
	                                    setup, teardown),
	};
	return cmocka_run_group_tests_name("expiry and new ops in process", tests, NULL, NULL);
}
