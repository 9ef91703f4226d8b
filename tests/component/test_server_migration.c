/*
 * test_server_migration.c - the safety of a range handover between two
 * in-process shard servers (server.h) driven by the fake controller
 * (tests/support/fake_ctl.h), at the moments that matter:
 *
 * - between the destination's fence acknowledgement and the controller's
 *   answer (the fake holds it): a source stopped there and restarted, or a
 *   migration cancelled there, keeps every key;
 * - during a slow copy (a rate limit) and while the fence is held: the
 *   destination answers MOVING with the source as hint, raw and through a
 *   client whose configuration predates an earlier move of the range;
 * - many handovers under heavy appends to few keys: no acknowledged append
 *   is lost or applied twice (the fence is atomic with writes);
 * - a write the source's exactly-once memory has forgotten, retried at the
 *   destination, is refused, not applied again (the floors travel);
 * - a destination that reads no packed chunk entries (an older server)
 *   gets every key as one KeyValue each;
 * - a key appended to throughout a paced copy: its value travels once a
 *   round of deltas, not once an append, and arrives whole.
 *
 * scripts/mutants.sh runs these against known-bad changes of the migration
 * code. Every server is destroyed by the teardown; every wait has a deadline.
 */
#define _GNU_SOURCE /* nftw */
#include "common/err.h"
#include "common/rpc.h"
#include "proto/wire.h"
#include "proto/xfer_codec.h"
#include "shardkv.h"
#include "shardserver/server.h"
#include "tests/support/fake_ctl.h"
#include "tests/support/inproc_srv.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <ftw.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define NSRV      2
#define ST_MOVING SHARDKV__STATUS__STATUS_MOVING
#define ST_WRONG  SHARDKV__STATUS__STATUS_WRONG_OWNER

typedef inproc_srv srv;

static srv srvs[NSRV];
static fake_ctl *ctl;
static char tmpdir[128];

static int
setup(void **state)
{
	(void)state;
	inproc_srv_setup(srvs, NSRV, &ctl, tmpdir, sizeof(tmpdir), "kvmig", 32);
	for (int i = 0; i < NSRV; i++)
		fake_ctl_add_node(ctl, srvs[i].url);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	inproc_srv_cleanup(srvs, NSRV, &ctl, tmpdir);
	return 0;
}

/* Both servers up at a configuration giving everything to node 1. */
static void
two_servers_node1_owns_all(void)
{
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 1, 1);
	inproc_srv_up(&srvs[0]);
	inproc_srv_up(&srvs[1]);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
}

/* Publishes [m, "") moving from `from` to `to` (migration id), at rate MB/s. */
static uint64_t
publish_move(uint64_t id, uint32_t from, uint32_t to, uint32_t rate)
{
	fake_cfg b = fake_cfg_owners(ctl, 0, "m", from, to);
	fake_cfg_mig(&b, id, "m", "", from, to);
	b.c->migs[b.c->nmigs - 1].rate_limit_mb_s = rate;
	return fake_cfg_publish(ctl, &b);
}

/* Publishes [m, "") owned by `owner`, "" .. m by node 1, no migration. */
static uint64_t
publish_owner(uint32_t owner)
{
	return fake_ctl_publish_owners(ctl, "m", 1, owner);
}

static void
key_of(char *k, size_t n, int i)
{
	snprintf(k, n, "p%05d", i);
}

/* A value of about `len` bytes that names key i and version ver. */
static void
value_of(char *v, size_t n, int i, int ver, size_t len)
{
	int w = snprintf(v, n, "v%d.%d.", ver, i);
	size_t l = len < n - 1 ? len : n - 1;
	for (size_t j = (size_t)w; j < l; j++)
		v[j] = (char)('a' + (j + (size_t)i) % 26);
	v[l > (size_t)w ? l : (size_t)w] = '\0';
}

/* Puts keys 0..n-1 (version ver) on url. */
static void
put_keys(const char *url, int n, int ver, size_t len)
{
	char k[32], v[8192];
	for (int i = 0; i < n; i++) {
		key_of(k, sizeof(k), i);
		value_of(v, sizeof(v), i, ver, len);
		res1 r = do_put(url, k, v, 0, 0);
		if (r.status != 0)
			fail_msg("put %s on %s: status %d", k, url, r.status);
	}
}

/* Checks that url serves keys 0..n-1, key i with version ver(i). The
 * comparison is on the first 255 bytes (res1.value). */
static void
check_keys(const char *url, int n, int (*ver)(int), size_t len)
{
	char k[32], v[8192];
	for (int i = 0; i < n; i++) {
		key_of(k, sizeof(k), i);
		value_of(v, sizeof(v), i, ver(i), len);
		v[255] = '\0';
		res1 r = do_get(url, k);
		if (r.status != 0)
			fail_msg("key %s lost: get on %s answers status %d", k, url, r.status);
		if (strcmp(r.value, v) != 0)
			fail_msg("key %s on %s: \"%.20s...\", expected \"%.20s...\"", k, url,
			         r.value, v);
	}
}

static int
ver1(int i)
{
	(void)i;
	return 1;
}

/* Keys rewritten during the slow copy: the even ones below rewritten_below. */
static int rewritten_below;

static int
ver_even2(int i)
{
	return i % 2 || i >= rewritten_below ? 1 : 2;
}

/* Waits until a put of a fresh key to url succeeds (the range is served). */
static void
wait_serves(const char *url, const char *key)
{
	uint64_t deadline = kv_test_now_ms() + 15000;
	res1 r;
	while ((r = do_put(url, key, "x", 0, 0)).status != 0) {
		if (kv_test_now_ms() > deadline)
			fail_msg("%s does not serve %s: status %d", url, key, r.status);
		kv_test_sleep_ms(10);
	}
}

/* Checks that a get and a put of key on url answer MOVING naming node `hint`. */
static void
expect_moving(const char *url, const char *key, uint32_t hint, const char *hint_addr)
{
	res1 g = do_get(url, key);
	res1 p = do_put(url, key, "must-not-land", 0, 0);
	if (g.status != ST_MOVING || g.hint_node != hint)
		fail_msg("get %s on %s: status %d hint %u, expected MOVING hint %u", key, url,
		         g.status, g.hint_node, hint);
	if (p.status != ST_MOVING || p.hint_node != hint)
		fail_msg("put %s on %s: status %d hint %u, expected MOVING hint %u", key, url,
		         p.status, p.hint_node, hint);
	assert_string_equal(g.hint_addr, hint_addr);
}

#define NKEYS_SMALL 300

/* Node 1 holds NKEYS_SMALL keys and moves [m, "") to node 2 (migration 1):
 * returns the move's epoch once the destination has acknowledged the fence,
 * the controller holding its answer. */
static uint64_t
small_move_held_at_the_fence(void)
{
	two_servers_node1_owns_all();
	put_keys(srvs[0].url, NKEYS_SMALL, 1, 100);
	fake_ctl_hold_fence(ctl);
	uint64_t e = publish_move(1, 1, 2, 0);
	fake_ctl_wait_fenced(ctl, 15000);
	return e;
}

/* The same move, committed and reported done; the handover is not
 * published: the configuration still lists the migration. */
static uint64_t
small_move_committed(void)
{
	two_servers_node1_owns_all();
	put_keys(srvs[0].url, NKEYS_SMALL, 1, 100);
	uint64_t e = publish_move(1, 1, 2, 0);
	fake_ctl_wait_done(ctl, 1, 20000);
	return e;
}

static void
source_stopped_between_fence_ack_and_commit_restarts_and_hands_over_every_key(void **state)
{
	(void)state;
	/* The destination has acknowledged the fence; the controller has not
	 * answered: the source dies here (no leave, its log is all it keeps). */
	small_move_held_at_the_fence();
	inproc_srv_down(&srvs[0]);
	clients_close();
	fake_ctl_release_fence(ctl, 0);
	inproc_srv_up(&srvs[0]);
	fake_ctl_wait_done(ctl, 1, 20000);
	uint64_t e = publish_owner(2);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	check_keys(srvs[1].url, NKEYS_SMALL, ver1, 100);
	res1 r = do_get(srvs[0].url, "p00000");
	assert_int_equal(r.status, ST_WRONG);
	assert_int_equal(r.hint_node, 2);
}

/* Puts key = value on url and checks it is acknowledged. */
static void
put_one(const char *url, const char *key, const char *value)
{
	res1 r = do_put(url, key, value, 0, 0);
	if (r.status != 0)
		fail_msg("put %s on %s: status %d", key, url, r.status);
}

/* Until node 1 answers WRONG_OWNER naming node 2 for key (the range handed
 * over again), checks that it never serves the key: a put it acknowledged
 * would be lost, the destination serving the range already. */
static void
expect_source_serves_nothing_until_handed_over(const char *key)
{
	uint64_t deadline = kv_test_now_ms() + 20000;
	for (;;) {
		res1 g = do_get(srvs[0].url, key);
		res1 p = do_put(srvs[0].url, key, "must-not-land", 0, 0);
		if (g.status == 0 || p.status == 0)
			fail_msg("the restarted source served %s (get %d, put %d) after the "
			         "destination's commit",
			         key, g.status, p.status);
		if (p.status == ST_WRONG && p.hint_node == 2)
			return;
		if (kv_test_now_ms() > deadline)
			fail_msg("the restarted source still answers %d for %s", p.status, key);
		kv_test_sleep_ms(10);
	}
}

/* The source restarts after the destination committed the range, while the
 * configuration still lists the migration (the controller has not published
 * the handover), and the destination is down as well: the source must not
 * serve the range again (the destination took writes after its commit), and
 * once the destination is back it learns there that the commit happened and
 * hands the range over. */
static void
source_restarted_after_the_commit_serves_nothing_of_the_range_and_hands_it_over(void **state)
{
	(void)state;
	uint64_t e = small_move_committed();
	put_one(srvs[1].url, "pz-after-commit", "w1");
	inproc_srv_down(&srvs[0]);
	inproc_srv_down(&srvs[1]);
	clients_close();
	inproc_srv_up(&srvs[0]);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	/* The destination is down: nothing can tell the source how the handover
	 * ended, so it keeps the range fenced. */
	for (uint64_t until = kv_test_now_ms() + 300; kv_test_now_ms() < until;)
		expect_moving(srvs[0].url, "p00001", 2, srvs[1].url);
	inproc_srv_up(&srvs[1]);
	expect_source_serves_nothing_until_handed_over("p00001");
	fake_ctl_wait_done_again(ctl, 1, 20000);
	e = publish_owner(2);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	check_keys(srvs[1].url, NKEYS_SMALL, ver1, 100);
	res1 r = do_get(srvs[1].url, "pz-after-commit");
	assert_int_equal(r.status, 0);
	assert_string_equal(r.value, "w1");
}

/* The destination restarts after it acknowledged the fence and before the
 * commit: the commit finds no stream there, and the source, still fenced,
 * sends the range again rather than staying fenced for good. */
static void
destination_restarted_between_fence_ack_and_commit_gets_the_range_again(void **state)
{
	(void)state;
	uint64_t e = small_move_held_at_the_fence();
	inproc_srv_down(&srvs[1]);
	clients_close();
	inproc_srv_up(&srvs[1]);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	fake_ctl_release_fence(ctl, 0);
	fake_ctl_wait_done(ctl, 1, 30000);
	e = publish_owner(2);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	check_keys(srvs[1].url, NKEYS_SMALL, ver1, 100);
}

/* The destination restarts after its commit, before the handover is
 * published: it serves the range from its log, with what it took after the
 * commit, and goes on taking writes to it. */
static void
destination_restarted_after_the_commit_serves_the_range_with_its_later_writes(void **state)
{
	(void)state;
	uint64_t e = small_move_committed();
	put_one(srvs[1].url, "pz-after-commit", "w1");
	inproc_srv_down(&srvs[1]);
	clients_close();
	inproc_srv_up(&srvs[1]);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	res1 r = do_get(srvs[1].url, "pz-after-commit");
	if (r.status != 0)
		fail_msg("the restarted destination answers %d for a key of its committed range",
		         r.status);
	assert_string_equal(r.value, "w1");
	put_one(srvs[1].url, "pz-after-restart", "w2");
	e = publish_owner(2);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	check_keys(srvs[1].url, NKEYS_SMALL, ver1, 100);
	r = do_get(srvs[1].url, "pz-after-restart");
	assert_int_equal(r.status, 0);
	assert_string_equal(r.value, "w2");
}

/* The destination dies after it acknowledged the fence, and the controller
 * answers the fence: the source sends its commit to a dead node. The
 * operator removes the destination, and the controller gives the range back
 * to the source without the migration: the source serves it again instead
 * of staying fenced. */
static void
source_fenced_towards_a_removed_destination_serves_the_range_again(void **state)
{
	(void)state;
	small_move_held_at_the_fence();
	inproc_srv_down(&srvs[1]);
	clients_close();
	fake_ctl_release_fence(ctl, 0);
	expect_moving(srvs[0].url, "p00001", 2, srvs[1].url);
	uint64_t e = publish_owner(1);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	wait_serves(srvs[0].url, "pz-after-remove");
	check_keys(srvs[0].url, NKEYS_SMALL, ver1, 100);
}

static void
migration_cancelled_between_fence_ack_and_commit_leaves_every_key_on_the_source(void **state)
{
	(void)state;
	small_move_held_at_the_fence();
	/* The fenced source answers MOVING with the destination as hint. */
	expect_moving(srvs[0].url, "p00001", 2, srvs[1].url);
	/* Cancelled meanwhile: the controller no longer lists the migration. */
	uint64_t e = publish_owner(1);
	fake_ctl_release_fence(ctl, SHARDKV__STATUS__STATUS_NOT_FOUND);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	wait_serves(srvs[0].url, "pz-after-cancel");
	check_keys(srvs[0].url, NKEYS_SMALL, ver1, 100);
	res1 r = do_get(srvs[1].url, "p00000");
	assert_int_equal(r.status, ST_WRONG);
	assert_int_equal(r.hint_node, 1);
}

/* A destination that reads no packed chunk entries (a server of an older
 * version, which would not see them) never says so, and gets every key as
 * one KeyValue each; it refuses a packed chunk, so a source that packed
 * anyway would restart its stream until the wait below gives up. */
static void
a_destination_that_reads_no_packed_entries_gets_every_key_as_entries(void **state)
{
	(void)state;
	srvs[1].cfg.chunks_unpacked = true;
	two_servers_node1_owns_all();
	put_keys(srvs[0].url, NKEYS_SMALL, 1, 300);
	publish_move(1, 1, 2, 0);
	fake_ctl_wait_done(ctl, 1, 20000);
	uint64_t e = publish_owner(2);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	check_keys(srvs[1].url, NKEYS_SMALL, ver1, 300);
	/* And back to node 1, which reads them: packed this time. */
	publish_move(2, 2, 1, 0);
	fake_ctl_wait_done(ctl, 2, 20000);
	e = publish_owner(1);
	srv_wait_ready(srvs[0].url, e, 15000, NULL);
	check_keys(srvs[0].url, NKEYS_SMALL, ver1, 300);
}

/* 900 keys of 4 KiB: about 3.6 MB, so a copy at 1 MB/s takes 3 s. */
#define NKEYS_SLOW 900
#define VLEN_SLOW  4000

static void
destination_answers_moving_naming_the_source_until_the_commit(void **state)
{
	(void)state;
	char k[32], v[8192];
	two_servers_node1_owns_all();
	put_keys(srvs[0].url, NKEYS_SLOW, 1, VLEN_SLOW);
	fake_ctl_hold_fence(ctl);
	publish_move(1, 1, 2, 1);
	/* Begin has arrived once the destination says MOVING. */
	uint64_t deadline = kv_test_now_ms() + 10000;
	res1 r;
	while ((r = do_get(srvs[1].url, "p00000")).status != ST_MOVING) {
		if (r.status != ST_WRONG || kv_test_now_ms() > deadline)
			fail_msg("destination before Begin: status %d", r.status);
		kv_test_sleep_ms(2);
	}
	/* During the copy: every key, copied or not, is MOVING there (hint:
	 * the source); writes go on at the source and reach the destination. */
	int checked = 0;
	for (int i = 0; i < NKEYS_SLOW; i += 2) {
		pthread_mutex_lock(&ctl->mu);
		bool fenced = ctl->fenced_seen > 0;
		pthread_mutex_unlock(&ctl->mu);
		if (fenced)
			break; /* a slow machine: the rest is checked at the fence */
		key_of(k, sizeof(k), i);
		value_of(v, sizeof(v), i, 2, VLEN_SLOW);
		assert_int_equal(do_put(srvs[0].url, k, v, 0, 0).status, 0);
		key_of(k, sizeof(k), (i * 7) % NKEYS_SLOW);
		expect_moving(srvs[1].url, k, 1, srvs[0].url);
		checked++;
	}
	rewritten_below = 2 * checked;
	if (checked < 20)
		fail_msg("the copy at 1 MB/s ended after %d checks: not a slow copy", checked);
	/* Held between the fence acknowledgement and the commit: still MOVING
	 * at the destination, and MOVING (hint: the destination) at the source. */
	fake_ctl_wait_fenced(ctl, 20000);
	expect_moving(srvs[1].url, "p00003", 1, srvs[0].url);
	expect_moving(srvs[1].url, "pzz-new", 1, srvs[0].url);
	expect_moving(srvs[0].url, "p00004", 2, srvs[1].url);
	fake_ctl_release_fence(ctl, 0);
	fake_ctl_wait_done(ctl, 1, 20000);
	uint64_t e = publish_owner(2);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	check_keys(srvs[1].url, NKEYS_SLOW, ver_even2, VLEN_SLOW);
	assert_int_equal(do_get(srvs[1].url, "pzz-new").status, SHARDKV__STATUS__STATUS_NOT_FOUND);
}

static void
client_configured_before_an_earlier_move_reads_every_key_while_the_range_comes_back(void **state)
{
	(void)state;
	char k[32], v[8192];
	shardkv_client *c = NULL;
	shardkv_options o = {.no_watch = true, .timeout_ms = 8000};
	two_servers_node1_owns_all();
	put_keys(srvs[0].url, NKEYS_SLOW, 1, VLEN_SLOW);
	/* The client learns epoch 1 (node 1 owns everything) and no other. */
	pthread_mutex_lock(&ctl->mu);
	ctl->getconfig_epoch = 1;
	pthread_mutex_unlock(&ctl->mu);
	assert_int_equal(shardkv_open(ctl->url, &o, &c), 0);
	shardkv_buf got = {0};
	assert_int_equal(shardkv_get(c, "p00000", 6, &got), 0);
	shardkv_free(got.data);
	/* Later fetches get the latest (as from a real controller): the client
	 * refreshes once a server's answer shows it is behind. */
	pthread_mutex_lock(&ctl->mu);
	ctl->getconfig_epoch = 0;
	pthread_mutex_unlock(&ctl->mu);
	/* An earlier move: [m, "") to node 2. */
	publish_move(1, 1, 2, 0);
	fake_ctl_wait_done(ctl, 1, 20000);
	uint64_t e = publish_owner(2);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	/* It comes back slowly; node 1 has it INCOMING while the stale client
	 * still routes it to node 1. The first get is of the last key, which
	 * the copy (in key order) has not reached yet. */
	fake_ctl_hold_fence(ctl);
	publish_move(2, 2, 1, 1);
	uint64_t deadline = kv_test_now_ms() + 10000;
	res1 r;
	while ((r = do_get(srvs[0].url, "p00000")).status != ST_MOVING) {
		if (kv_test_now_ms() > deadline)
			fail_msg("node 1 never had the range incoming: status %d", r.status);
		kv_test_sleep_ms(2);
	}
	for (int n = 0; n < 60; n++) {
		int i = NKEYS_SLOW - 1 - (n * 13) % NKEYS_SLOW;
		key_of(k, sizeof(k), i);
		value_of(v, sizeof(v), i, 1, VLEN_SLOW);
		int rv = shardkv_get(c, k, strlen(k), &got);
		if (rv != 0)
			fail_msg("client get %s during the move back: %d (%s)", k, rv,
			         shardkv_errmsg());
		if (got.len != strlen(v) || memcmp(got.data, v, got.len) != 0)
			fail_msg("client get %s during the move back: wrong value", k);
		shardkv_free(got.data);
	}
	/* After the handover the client finds every key at node 1. */
	fake_ctl_wait_fenced(ctl, 20000);
	fake_ctl_release_fence(ctl, 0);
	fake_ctl_wait_done(ctl, 2, 20000);
	for (int i = 0; i < NKEYS_SLOW; i += 97) {
		key_of(k, sizeof(k), i);
		value_of(v, sizeof(v), i, 1, VLEN_SLOW);
		assert_int_equal(shardkv_get(c, k, strlen(k), &got), 0);
		assert_int_equal(got.len, strlen(v));
		assert_memory_equal(got.data, v, got.len);
		shardkv_free(got.data);
	}
	shardkv_close(c);
}

/* The handover stress: writers append numbered tokens to few keys of the
 * moving range while it moves back and forth. */
#define NWRITERS   6
#define KEY_ROTATE 64        /* appends per key before a writer takes a new one */
#define MAX_APPS   (1 << 18) /* appends per writer at most */
#define STRESS_MS  12000u    /* how long the range moves at most */
#define HANDOVERS  200       /* handovers at most (two configurations each) */

typedef struct {
	int w;             /* writer number */
	atomic_bool *stop; /* set by the test */
	int acked;         /* appends 1..acked were acknowledged */
	int failures;      /* transport failures (retried) */
	char url[64];      /* where it sends now */
} writer;

static void *
writer_main(void *arg)
{
	writer *wr = arg;
	char k[32], tok[32];
	snprintf(wr->url, sizeof(wr->url), "%s", srvs[0].url);
	for (int seq = 1; seq < MAX_APPS && !atomic_load(wr->stop); seq++) {
		snprintf(k, sizeof(k), "q%d-%05d", wr->w, seq / KEY_ROTATE);
		snprintf(tok, sizeof(tok), "%d,", seq);
		uint64_t deadline = kv_test_now_ms() + 20000;
		for (;;) {
			/* Same request id on every retry: exactly once. */
			res1 r = do_append(wr->url, k, tok, 1000 + (uint64_t)wr->w, (uint64_t)seq);
			if (r.status == 0)
				break;
			if (kv_test_now_ms() > deadline) {
				fprintf(stderr, "writer %d: append %d unanswered (status %d)\n",
				        wr->w, seq, r.status);
				return NULL;
			}
			if (r.status == -1)
				wr->failures++;
			if ((r.status == ST_MOVING || r.status == ST_WRONG) && r.hint_addr[0])
				snprintf(wr->url, sizeof(wr->url), "%s", r.hint_addr);
			if (r.status != ST_WRONG)
				kv_test_sleep_ms(1);
		}
		wr->acked = seq;
	}
	return NULL;
}

/* The full value of key on url (malloc'd, NUL-terminated), or NULL. */
static char *
get_full(const char *url, const char *key)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__GetOp g = SHARDKV__GET_OP__INIT;
	Shardkv__Request rq = SHARDKV__REQUEST__INIT;
	Shardkv__Op *ops[1] = {&op};
	char *out = NULL;
	g.key = bd(key);
	op.op_case = SHARDKV__OP__OP_GET;
	op.get = &g;
	rq.n_ops = 1;
	rq.ops = ops;
	rq.epoch = 1;
	Shardkv__Response *r = call(url, &rq);
	if (r != NULL && r->n_results == 1 && r->results[0]->status == 0) {
		out = malloc(r->results[0]->value.len + 1);
		memcpy(out, r->results[0]->value.data, r->results[0]->value.len);
		out[r->results[0]->value.len] = '\0';
	}
	if (r)
		shardkv__response__free_unpacked(r, NULL);
	return out;
}

static void
many_handovers_under_heavy_appends_lose_and_double_no_acknowledged_append(void **state)
{
	(void)state;
	writer wrs[NWRITERS];
	pthread_t thr[NWRITERS];
	atomic_bool stop = false;
	uint32_t owner = 1;
	uint64_t id = 0, t0;

	for (int i = 0; i < NSRV; i++)
		srvs[i].cfg.fsync = KV_FSYNC_NONE;
	two_servers_node1_owns_all();
	for (int w = 0; w < NWRITERS; w++) {
		wrs[w] = (writer){.w = w, .stop = &stop};
		assert_int_equal(pthread_create(&thr[w], NULL, writer_main, &wrs[w]), 0);
	}
	t0 = kv_test_now_ms();
	while (kv_test_now_ms() - t0 < STRESS_MS && id < HANDOVERS) {
		uint32_t to = owner == 1 ? 2 : 1;
		publish_move(++id, owner, to, 0);
		fake_ctl_wait_done(ctl, id, 20000);
		owner = to;
		publish_owner(owner);
	}
	atomic_store(&stop, true);
	for (int w = 0; w < NWRITERS; w++)
		pthread_join(thr[w], NULL);
	/* Every acknowledged token once, in order, at the final owner. */
	const char *url = srvs[owner - 1].url;
	int total = 0;
	for (int w = 0; w < NWRITERS; w++) {
		int acked = wrs[w].acked;
		total += acked;
		for (int gen = 0; gen <= acked / KEY_ROTATE; gen++) {
			char k[32];
			snprintf(k, sizeof(k), "q%d-%05d", w, gen);
			char *val = get_full(url, k);
			int first = gen == 0 ? 1 : gen * KEY_ROTATE;
			int last = (gen + 1) * KEY_ROTATE - 1;
			if (last > acked)
				last = acked;
			if (first > last) {
				free(val);
				continue;
			}
			if (val == NULL)
				fail_msg("key %s lost (writer %d acked %d appends)", k, w, acked);
			char *p = val;
			for (int seq = first; seq <= last; seq++) {
				char *end;
				long n = strtol(p, &end, 10);
				if (end == p || *end != ',' || n != seq)
					fail_msg(
					    "key %s: acknowledged append %d %s (value \"%.60s\")",
					    k, seq, end == p ? "lost" : "lost or doubled", p);
				p = end + 1;
			}
			/* At most the one unacknowledged append after the last ack. */
			if (*p != '\0' && last == acked) {
				long n = strtol(p, NULL, 10);
				if (n != acked + 1)
					fail_msg("key %s: unexpected \"%.40s\" after %d", k, p,
					         acked);
			} else if (*p != '\0') {
				fail_msg("key %s: extra \"%.40s\" after %d", k, p, last);
			}
			free(val);
		}
	}
	fprintf(stderr, "%llu handovers, %d acknowledged appends\n", (unsigned long long)id, total);
	assert_true(id >= 20);
	assert_true(total > 1000);
}

/* An append at url by client 7 with request id `id`, sent as a retry
 * (Op.retry: the client sent it before). */
/* A retry (Op.retry) of client's write `id`: an append of v to k, or a put. */
static res1
retry_write(const char *url, bool append, const char *k, const char *v, uint64_t client,
            uint64_t id)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__AppendOp a = SHARDKV__APPEND_OP__INIT;
	Shardkv__PutOp p = SHARDKV__PUT_OP__INIT;
	a.key = p.key = (ProtobufCBinaryData){strlen(k), (uint8_t *)k};
	a.value = p.value = (ProtobufCBinaryData){strlen(v), (uint8_t *)v};
	if (append) {
		op.op_case = SHARDKV__OP__OP_APPEND;
		op.append = &a;
	} else {
		op.op_case = SHARDKV__OP__OP_PUT;
		op.put = &p;
	}
	op.request_id = id;
	op.retry = true;
	return one_op(url, &op, client);
}

/*
 * The exactly-once floors travel with a move: an append the source has
 * forgotten (its client's memory of 4 results wrapped), retried at the
 * destination after the range moved there, is refused as timed out (it may
 * have been applied), not applied a second time, also after the
 * destination restarts; a write above the floor is applied there as usual.
 */
static void
a_write_the_source_forgot_is_refused_at_the_destination_not_applied_again(void **state)
{
	res1 r;

	(void)state;
	for (int i = 0; i < NSRV; i++)
		srvs[i].cfg.dedup_per_client = 4;
	two_servers_node1_owns_all();
	r = do_append(srvs[0].url, "mz", "x", 7, 1);
	assert_int_equal(r.status, 0);
	/* Five newer writes of the client, outside the moving range: ids 1
	 * and 2 are forgotten (floor 2), and no entry of it moves. */
	for (uint64_t id = 2; id <= 6; id++) {
		r = do_append(srvs[0].url, "afill", "y", 7, id);
		assert_int_equal(r.status, 0);
	}
	r = retry_write(srvs[0].url, true, "mz", "x", 7, 1);
	assert_int_equal(r.status, SHARDKV__STATUS__STATUS_TIMED_OUT);
	publish_move(1, 1, 2, 0);
	fake_ctl_wait_done(ctl, 1, 20000);
	uint64_t e = publish_owner(2);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	r = retry_write(srvs[1].url, true, "mz", "x", 7, 1);
	assert_int_equal(r.status, SHARDKV__STATUS__STATUS_TIMED_OUT);
	/* The destination logged the floor: a restart keeps it. */
	inproc_srv_down(&srvs[1]);
	clients_close();
	inproc_srv_up(&srvs[1]);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	r = retry_write(srvs[1].url, true, "mz", "x", 7, 1);
	assert_int_equal(r.status, SHARDKV__STATUS__STATUS_TIMED_OUT);
	r = do_get(srvs[1].url, "mz");
	assert_int_equal(r.status, 0);
	assert_string_equal(r.value, "x");
	/* Above the floor: a new write is applied, its retry answered from
	 * memory. */
	r = do_append(srvs[1].url, "mz", "x", 7, 7);
	assert_int_equal(r.status, 0);
	r = retry_write(srvs[1].url, true, "mz", "x", 7, 7);
	assert_int_equal(r.status, 0);
	r = do_get(srvs[1].url, "mz");
	assert_string_equal(r.value, "xx");
}

/* Sends transfer message x of migration `id` to srvs[1] as node 1 in epoch
 * and returns the envelope status when refused whole, else the ack's; *seq
 * gets the highest contiguous seq the destination applied. */
static int
xfer_to_node2(kv_xfer *x, uint64_t id, uint64_t epoch, uint64_t *seq)
{
	nng_msg *req, *rep;
	int rv;

	x->migration_id = id;
	assert_int_equal(kv_xfer_encode(x, epoch, 1, (kv_bytes){0}, &req), 0);
	assert_int_equal(kv_rpc_call(client_for(srvs[1].url), req, &rep, 15000), 0);
	Shardkv__Response *r = shardkv__response__unpack(NULL, nng_msg_len(rep), nng_msg_body(rep));
	nng_msg_free(rep);
	assert_non_null(r);
	if (r->status != SHARDKV__STATUS__STATUS_OK) {
		rv = kv_err_from_wire(r->status);
	} else {
		assert_non_null(r->transfer_ack);
		rv = kv_err_from_wire(r->transfer_ack->status);
		*seq = r->transfer_ack->seq;
	}
	shardkv__response__free_unpacked(r, NULL);
	return rv;
}

/*
 * A transfer that starts again from its first message (its source
 * restarted) replaces the range at the destination, exactly-once entries
 * included: the first attempt's delta carried a put with its entry, which
 * the source then lost in a crash (an unacknowledged write), and the second
 * attempt's copy does not have it. A retry of that put at the destination
 * after the commit used to be answered "done" from the first attempt's
 * entry without the key being there (an acknowledged write lost: a
 * checker run with kills at handovers showed it once); it is refused now
 * (it may have been applied: the client's floor rose), and a new write
 * goes through.
 */
static void
a_transfer_started_again_forgets_the_exactly_once_entries_of_its_first_attempt(void **state)
{
	const uint64_t id = 77, client = 9;
	uint64_t seq = 0;
	(void)state;

	two_servers_node1_owns_all();
	uint64_t e = fake_ctl_publish_owners(ctl, NULL, 1, 1);
	srv_wait_ready(srvs[1].url, e, 15000, NULL);
	kv_xfer b = {.seq = 1,
	             .kind = KV_XFER_BEGIN,
	             .epoch = e,
	             .start = {(const uint8_t *)"m", 1},
	             .end = {NULL, 0},
	             .from_node = 1,
	             .to_node = 2};
	assert_int_equal(xfer_to_node2(&b, id, e, &seq), 0);
	kv_xfer_delta d = {
	    .seq = 1,
	    .key = {(const uint8_t *)"mk", 2},
	    .value = {(const uint8_t *)"lost", 4},
	    .has_dedup = true,
	    .dedup = {.client_id = client, .request_id = 1, .key = {(const uint8_t *)"mk", 2}}};
	kv_xfer dx = {.seq = 2, .kind = KV_XFER_DELTA, .ndelta = 1, .delta = &d};
	assert_int_equal(xfer_to_node2(&dx, id, e, &seq), 0);
	assert_int_equal(seq, 2);
	/* The source restarted: the stream starts again, and its copy holds
	 * one key, not mk. */
	assert_int_equal(xfer_to_node2(&b, id, e, &seq), 0);
	kv_xfer_kv kv = {.key = {(const uint8_t *)"ma", 2}, .value = {(const uint8_t *)"a", 1}};
	kv_xfer ch = {.seq = 2, .kind = KV_XFER_CHUNK, .nkv = 1, .kv = &kv, .last = true};
	assert_int_equal(xfer_to_node2(&ch, id, e, &seq), 0);
	kv_xfer f = {.seq = 3, .kind = KV_XFER_FENCE, .keys = 1};
	assert_int_equal(xfer_to_node2(&f, id, e, &seq), 0);
	kv_xfer c = {.seq = 4, .kind = KV_XFER_COMMIT, .epoch = e};
	assert_int_equal(xfer_to_node2(&c, id, e, &seq), 0);
	assert_string_equal(do_get(srvs[1].url, "ma").value, "a");

	res1 r = retry_write(srvs[1].url, false, "mk", "lost", client, 1);
	res1 g = do_get(srvs[1].url, "mk");
	if (r.status == 0 && g.status != 0)
		fail_msg("the retry was answered done (status 0) and mk is absent (get: %d)",
		         g.status);
	assert_int_equal(r.status, SHARDKV__STATUS__STATUS_TIMED_OUT);
	r = do_put(srvs[1].url, "mk", "new", client, 2);
	assert_int_equal(r.status, 0);
	assert_string_equal(do_get(srvs[1].url, "mk").value, "new");
}

/* Bytes of the side logs (a transfer's own log, "side-..." directories)
 * under a server's data directory. */
static uint64_t side_bytes_sum;

static int
side_bytes_cb(const char *path, const struct stat *st, int type, struct FTW *f)
{
	(void)f;
	if (type == FTW_F && strstr(path, "/side-") != NULL)
		side_bytes_sum += (uint64_t)st->st_size;
	return 0;
}

static uint64_t
side_log_bytes(const char *dir)
{
	side_bytes_sum = 0;
	assert_int_equal(nftw(dir, side_bytes_cb, 16, FTW_PHYS), 0);
	return side_bytes_sum;
}

#define GROW_APPENDS 1200
#define GROW_TOKEN   512

/*
 * One key appended to throughout a paced copy: each write's record of the
 * key makes the value of the one before it useless (the destination reads
 * only the last), so the key's value travels once a round, not once an
 * append, and the move still ends with every acknowledged append, once and
 * in order. The destination's side log, which holds every record it got,
 * says which: 1,200 appends of 512 bytes carried whole would be about 370
 * MB there.
 */
static void
a_key_appended_to_during_a_paced_copy_travels_once_a_round_and_arrives_whole(void **state)
{
	(void)state;
	char tok[GROW_TOKEN + 1], url[64];
	int acked = 0;

	srvs[1].cfg.snapshot_bytes = 1ull << 40; /* keep the adopted side log */
	two_servers_node1_owns_all();
	put_keys(srvs[0].url, 2000, 1, 1000); /* 2 MB: 2 s at 1 MB/s */
	publish_move(1, 1, 2, 1);
	snprintf(url, sizeof(url), "%s", srvs[0].url);
	for (int seq = 1; seq <= GROW_APPENDS; seq++) {
		int w = snprintf(tok, sizeof(tok), "%d,", seq);
		memset(tok + w, '.', GROW_TOKEN - (size_t)w - 1);
		tok[GROW_TOKEN - 1] = ';';
		tok[GROW_TOKEN] = '\0';
		uint64_t deadline = kv_test_now_ms() + 20000;
		for (;;) {
			res1 r = do_append(url, "m-grow", tok, 3000, (uint64_t)seq);
			if (r.status == 0)
				break;
			if (kv_test_now_ms() > deadline)
				fail_msg("append %d unanswered (status %d)", seq, r.status);
			if ((r.status == ST_MOVING || r.status == ST_WRONG) && r.hint_addr[0])
				snprintf(url, sizeof(url), "%s", r.hint_addr);
			if (r.status != ST_WRONG)
				kv_test_sleep_ms(1);
		}
		acked = seq;
	}
	fake_ctl_wait_done(ctl, 1, 30000);
	publish_owner(2);
	wait_serves(srvs[1].url, "m-served");

	char *val = get_full(srvs[1].url, "m-grow");
	if (val == NULL)
		fail_msg("m-grow lost");
	assert_int_equal(strlen(val), (size_t)acked * GROW_TOKEN);
	for (int seq = 1; seq <= acked; seq++) {
		const char *t = val + (size_t)(seq - 1) * GROW_TOKEN;
		char want[16];
		int w = snprintf(want, sizeof(want), "%d,", seq);
		if (memcmp(t, want, (size_t)w) != 0 || t[GROW_TOKEN - 1] != ';')
			fail_msg("m-grow: append %d is \"%.12s\"", seq, t);
	}
	free(val);
	uint64_t side = side_log_bytes(srvs[1].cfg.data_dir);
	fprintf(stderr, "destination's side log: %llu bytes for %d appends of %d bytes\n",
	        (unsigned long long)side, acked, GROW_TOKEN);
	assert_true(side < 64ull * 1024 * 1024);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(
	        source_stopped_between_fence_ack_and_commit_restarts_and_hands_over_every_key,
	        setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        source_restarted_after_the_commit_serves_nothing_of_the_range_and_hands_it_over,
	        setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        destination_restarted_between_fence_ack_and_commit_gets_the_range_again, setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        destination_restarted_after_the_commit_serves_the_range_with_its_later_writes,
	        setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        source_fenced_towards_a_removed_destination_serves_the_range_again, setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        migration_cancelled_between_fence_ack_and_commit_leaves_every_key_on_the_source,
	        setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        a_destination_that_reads_no_packed_entries_gets_every_key_as_entries, setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        destination_answers_moving_naming_the_source_until_the_commit, setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        client_configured_before_an_earlier_move_reads_every_key_while_the_range_comes_back,
	        setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        many_handovers_under_heavy_appends_lose_and_double_no_acknowledged_append, setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        a_write_the_source_forgot_is_refused_at_the_destination_not_applied_again, setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        a_transfer_started_again_forgets_the_exactly_once_entries_of_its_first_attempt,
	        setup, teardown),
	    cmocka_unit_test_setup_teardown(
	        a_key_appended_to_during_a_paced_copy_travels_once_a_round_and_arrives_whole, setup,
	        teardown),
	};
	signal(SIGPIPE, SIG_IGN);
	if (getenv("KV_TEST_FILTER"))
		cmocka_set_test_filter(getenv("KV_TEST_FILTER"));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
