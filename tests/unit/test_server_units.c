/*
 * test_server_units.c - unit tests of the shard server's pure modules: the
 * ownership table (owner.h), the exactly-once table (dedup.h), the
 * request codec's validation of hostile input (proto/data_codec.h) and the
 * handover file (nodefile.h).
 */
#include "common/err.h"
#include "proto/shardkv.pb-c.h"
#include "shardserver/dedup/dedup.h"
#include "shardserver/heartbeat.h"
#include "shardserver/nodefile.h"
#include "shardserver/owner.h"
#include "tests/support/testutil.h"
#include "proto/admin_codec.h"
#include "proto/data_codec.h"

#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#define S(x) (x), strlen(x)

static const kv_owner_entry *
lookup(kv_owner *t, const char *k)
{
	const kv_owner_entry *e;
	kv_owner_rdlock(t);
	e = kv_owner_lookup_locked(t, k, strlen(k));
	kv_owner_unlock(t);
	return e;
}

static void
owner_lookup_finds_the_entry_holding_the_key(void **state)
{
	kv_owner t;
	(void)state;
	assert_int_equal(kv_owner_init(&t), 0);
	assert_null(lookup(&t, "a"));
	assert_int_equal(kv_owner_fill(&t, S(""), S(""), KV_OWN_SERVE, 0, NULL, 1, 0), 0);
	assert_int_equal(lookup(&t, "a")->state, KV_OWN_SERVE);
	assert_int_equal(lookup(&t, "")->state, KV_OWN_SERVE);
	/* Carve [g, m) out as MOVED. */
	assert_int_equal(kv_owner_set(&t, S("g"), S("m"), KV_OWN_MOVED, 2, "tcp://x:1", 5, 7, NULL),
	                 0);
	assert_int_equal(t.n, 3);
	assert_int_equal(lookup(&t, "f")->state, KV_OWN_SERVE);
	assert_int_equal(lookup(&t, "g")->state, KV_OWN_MOVED);
	assert_int_equal(lookup(&t, "g")->peer, 2);
	assert_string_equal(lookup(&t, "lzzz")->peer_addr, "tcp://x:1");
	assert_int_equal(lookup(&t, "m")->state, KV_OWN_SERVE);
	assert_int_equal(lookup(&t, "\xff\xff")->state, KV_OWN_SERVE);
	kv_owner_fini(&t);
}

static void
owner_fill_leaves_served_parts_alone(void **state)
{
	kv_owner t;
	(void)state;
	assert_int_equal(kv_owner_init(&t), 0);
	assert_int_equal(kv_owner_set(&t, S("c"), S("e"), KV_OWN_SERVE, 0, NULL, 1, 0, NULL), 0);
	assert_int_equal(kv_owner_fill(&t, S("a"), S("z"), KV_OWN_INCOMING, 3, "u", 0, 9), 0);
	assert_int_equal(lookup(&t, "b")->state, KV_OWN_INCOMING);
	assert_int_equal(lookup(&t, "d")->state, KV_OWN_SERVE);
	assert_int_equal(lookup(&t, "x")->state, KV_OWN_INCOMING);
	assert_null(lookup(&t, "z"));
	kv_owner_rdlock(&t);
	assert_true(kv_owner_covers_locked(&t, S("c"), S("e"), KV_OWN_SERVE));
	assert_false(kv_owner_covers_locked(&t, S("b"), S("e"), KV_OWN_SERVE));
	assert_false(kv_owner_covers_locked(&t, S("a"), S("z"), KV_OWN_INCOMING));
	kv_owner_unlock(&t);
	assert_int_equal(kv_owner_drop_incoming(&t, 9), 2);
	assert_null(lookup(&t, "b"));
	assert_int_equal(lookup(&t, "d")->state, KV_OWN_SERVE);
	kv_owner_fini(&t);
}

struct reader {
	kv_owner *t;
	atomic_bool holding, release;
};

/* Holds the read lock, as an op in flight does, until told to let go. */
static void *
reader_main(void *arg)
{
	struct reader *r = arg;
	kv_owner_rdlock(r->t);
	atomic_store(&r->holding, true);
	while (!atomic_load(&r->release))
		sched_yield();
	kv_owner_unlock(r->t);
	return NULL;
}

struct changer {
	kv_owner *t;
	bool claim;
	int rv;
	atomic_bool done;
};

static void *
changer_main(void *arg)
{
	struct changer *c = arg;
	if (c->claim)
		c->rv = kv_owner_claim(c->t, S("c"), S("e"), 4);
	else
		c->rv = kv_owner_fill(c->t, S("a"), S("m"), KV_OWN_SERVE, 0, NULL, 4, 0);
	atomic_store(&c->done, true);
	return NULL;
}

/* Every configuration fills the ranges a node serves again: when that
 * changes nothing, the node's requests in flight (and so every new one,
 * behind a waiting writer) are not held up. */
static void
owner_refill_that_changes_nothing_does_not_wait_for_ops_in_flight(void **state)
{
	kv_owner t;
	(void)state;
	assert_int_equal(kv_owner_init(&t), 0);
	assert_int_equal(kv_owner_set(&t, S("a"), S("m"), KV_OWN_SERVE, 0, NULL, 1, 0, NULL), 0);
	for (int claim = 0; claim < 2; claim++) {
		struct reader r = {.t = &t};
		struct changer c = {.t = &t, .claim = claim, .rv = -1};
		pthread_t rt, ct;
		uint64_t deadline;
		assert_int_equal(pthread_create(&rt, NULL, reader_main, &r), 0);
		while (!atomic_load(&r.holding))
			sched_yield();
		assert_int_equal(pthread_create(&ct, NULL, changer_main, &c), 0);
		deadline = kv_now_ns() + 10ull * 1000000000ull;
		while (!atomic_load(&c.done) && kv_now_ns() < deadline)
			sched_yield();
		bool finished = atomic_load(&c.done);
		atomic_store(&r.release, true);
		pthread_join(rt, NULL);
		pthread_join(ct, NULL);
		assert_true(finished);
		assert_int_equal(c.rv, 0);
	}
	assert_int_equal(t.n, 1);
	assert_int_equal(lookup(&t, "b")->epoch, 1); /* the entry as it was */
	/* A fill that does change the table still does. */
	assert_int_equal(kv_owner_fill(&t, S("a"), S("z"), KV_OWN_INCOMING, 3, "u", 0, 9), 0);
	assert_int_equal(lookup(&t, "x")->state, KV_OWN_INCOMING);
	assert_int_equal(lookup(&t, "b")->state, KV_OWN_SERVE);
	kv_owner_fini(&t);
}

static void
owner_served_merges_adjacent_ranges(void **state)
{
	kv_owner t;
	kv_buf *r;
	size_t n;
	(void)state;
	assert_int_equal(kv_owner_init(&t), 0);
	assert_int_equal(kv_owner_set(&t, S("a"), S("c"), KV_OWN_SERVE, 0, NULL, 1, 0, NULL), 0);
	assert_int_equal(kv_owner_set(&t, S("c"), S("f"), KV_OWN_SERVE, 0, NULL, 1, 0, NULL), 0);
	assert_int_equal(kv_owner_set(&t, S("x"), S(""), KV_OWN_SERVE, 0, NULL, 1, 0, NULL), 0);
	assert_int_equal(t.n, 2); /* [a, c) and [c, f) merged */
	assert_int_equal(kv_owner_served(&t, &r, &n), 0);
	assert_int_equal(n, 2);
	assert_memory_equal(r[0].data, "a", 1);
	assert_memory_equal(r[1].data, "f", 1);
	assert_int_equal(r[3].len, 0);
	kv_owner_ranges_free(r, n);
	assert_int_equal(kv_owner_set(&t, S("q"), S("b"), KV_OWN_SERVE, 0, NULL, 1, 0, NULL),
	                 KV_EINVAL);
	kv_owner_fini(&t);
}

static void
dedup_retry_returns_the_first_result(void **state)
{
	kv_dedup *d = kv_dedup_create(4, 16, 1000);
	kv_dedup_result r = {.status = 0, .value_len = 7}, out;
	(void)state;
	assert_non_null(d);
	assert_int_equal(kv_dedup_begin(d, 1, 10, true, 100, &out), KV_ENOTFOUND);
	/* A retry racing with the first attempt is told to wait. */
	assert_int_equal(kv_dedup_begin(d, 1, 10, true, 100, &out), KV_EBUSY);
	kv_dedup_finish(d, 1, 10, &r, S("k"), 100);
	assert_int_equal(kv_dedup_begin(d, 1, 10, true, 101, &out), 0);
	assert_int_equal(out.value_len, 7);
	kv_buf_fini(&out.value);
	/* Another client with the same request id is a different write. */
	assert_int_equal(kv_dedup_begin(d, 2, 10, true, 101, &out), KV_ENOTFOUND);
	kv_dedup_abort(d, 2, 10);
	assert_int_equal(kv_dedup_begin(d, 2, 10, true, 101, &out), KV_ENOTFOUND);
	kv_dedup_destroy(d);
}

/* A result received from another server (the old primary's record,
 * applied while this node already serves the range) for a write whose
 * retry is in progress here, refused later (its routing table still names
 * the old primary): the refusal's abort keeps the received result, so the
 * next retry is answered from memory instead of being applied again. */
static void
dedup_a_received_result_outlives_the_abort_of_a_retry_in_progress(void **state)
{
	kv_dedup *d = kv_dedup_create(0, 0, 0);
	kv_dedup_result r = {.status = 0, .value_len = 5}, out;
	(void)state;
	assert_non_null(d);
	assert_int_equal(kv_dedup_begin(d, 3, 40, true, 100, &out), KV_ENOTFOUND);
	assert_int_equal(kv_dedup_insert(d, 3, 40, &r, S("k"), 100), 0);
	kv_dedup_abort(d, 3, 40);
	assert_int_equal(kv_dedup_begin(d, 3, 40, true, 101, &out), 0);
	assert_int_equal(out.status, 0);
	assert_int_equal(out.value_len, 5);
	kv_buf_fini(&out.value);
	/* A finished entry is still kept against a later insert. */
	kv_dedup_result other = {.status = 0, .value_len = 9};
	assert_int_equal(kv_dedup_insert(d, 3, 40, &other, S("k"), 102), 0);
	assert_int_equal(kv_dedup_begin(d, 3, 40, true, 103, &out), 0);
	assert_int_equal(out.value_len, 5);
	kv_buf_fini(&out.value);
	kv_dedup_destroy(d);
}

/* Results inserted together (a backup's batch) land as one insert each
 * would: clients interleaved across stripes, a pending attempt takes its
 * result, a finished entry is kept, and an entry with a zero id is refused
 * without stopping the others. */
static void
dedup_results_inserted_together_land_as_one_insert_each_would(void **state)
{
	kv_dedup *d = kv_dedup_create(0, 0, 0);
	kv_dedup_result out;
	kv_dedup_entry v[6];
	(void)state;
	assert_non_null(d);
	assert_int_equal(kv_dedup_begin(d, 3, 42, true, 100, &out), KV_ENOTFOUND);
	for (int i = 0; i < 6; i++)
		v[i] = (kv_dedup_entry){.client = i % 3 + 1,
		                        .req = 40 + (uint64_t)i,
		                        .res = {.status = 0, .value_len = 10 + (uint64_t)i},
		                        .key = "k",
		                        .klen = 1,
		                        .time_ms = 100};
	v[4].req = 0; /* refused */
	v[5].client = 1;
	v[5].req = 40; /* (1, 40) again: the first result stays */
	v[5].res.value_len = 99;
	assert_int_equal(kv_dedup_insert_many(d, v, 6), KV_EINVAL);
	kv_dedup_abort(d, 3, 42); /* the pending attempt of (3, 42) is refused */
	for (int i = 0; i < 4; i++) {
		uint64_t c = (uint64_t)(i % 3 + 1), q = 40 + (uint64_t)i;
		assert_int_equal(kv_dedup_begin(d, c, q, true, 101, &out), 0);
		assert_int_equal(out.value_len, 10 + (uint64_t)i);
		kv_buf_fini(&out.value);
	}
	assert_int_equal(kv_dedup_begin(d, 2, 44, false, 101, &out), KV_ENOTFOUND);
	kv_dedup_abort(d, 2, 44);
	assert_int_equal(kv_dedup_insert_many(d, NULL, 0), KV_OK);
	kv_dedup_destroy(d);
}

/* The default memory holds a pipelined handle's retry: one write retried
 * after three thousand newer writes of its client (a primary transfer
 * under pipelined load; 1024 did not hold it) is answered from memory;
 * past KV_DEDUP_PER_CLIENT newer ones it is refused, never applied again. */
static void
dedup_default_memory_outlasts_a_pipelined_clients_retry(void **state)
{
	kv_dedup *d = kv_dedup_create(0, 0, 0);
	kv_dedup_result r = {.status = 0, .value_len = 3}, out;
	uint64_t id = 1;
	(void)state;
	assert_non_null(d);
	for (; id <= 3001; id++) {
		assert_int_equal(kv_dedup_begin(d, 9, id, false, 100, &out), KV_ENOTFOUND);
		kv_dedup_finish(d, 9, id, &r, S("k"), 100);
	}
	assert_int_equal(kv_dedup_begin(d, 9, 1, true, 100, &out), 0);
	assert_int_equal(out.value_len, 3);
	kv_buf_fini(&out.value);
	for (; id <= KV_DEDUP_PER_CLIENT + 1; id++) {
		assert_int_equal(kv_dedup_begin(d, 9, id, false, 100, &out), KV_ENOTFOUND);
		kv_dedup_finish(d, 9, id, &r, S("k"), 100);
	}
	assert_int_equal(kv_dedup_begin(d, 9, 1, true, 100, &out), KV_ESTALE);
	assert_int_equal(kv_dedup_begin(d, 9, 2, true, 100, &out), 0);
	kv_buf_fini(&out.value);
	kv_dedup_destroy(d);
}

static void
dedup_refuses_a_forgotten_write_instead_of_applying_it_again(void **state)
{
	kv_dedup *d = kv_dedup_create(4, 16, 1000);
	kv_dedup_result r = {0}, out;
	(void)state;
	for (uint64_t i = 1; i <= 5; i++) {
		assert_int_equal(kv_dedup_begin(d, 1, i, true, 100, &out), KV_ENOTFOUND);
		kv_dedup_finish(d, 1, i, &r, S("k"), 100);
	}
	assert_int_equal(kv_dedup_begin(d, 1, 5, true, 100, &out), 0);
	kv_buf_fini(&out.value);
	/* Request 1 was forgotten (the lowest id goes first): its retry cannot
	 * be told from a new write, so it is refused, never applied again. */
	assert_int_equal(kv_dedup_begin(d, 1, 1, true, 100, &out), KV_ESTALE);
	/* A first attempt of that id cannot have been applied: it is new. */
	assert_int_equal(kv_dedup_begin(d, 1, 1, false, 100, &out), KV_ENOTFOUND);
	kv_dedup_abort(d, 1, 1);
	/* A late write above the forgotten ids is new. */
	assert_int_equal(kv_dedup_begin(d, 1, 7, true, 100, &out), KV_ENOTFOUND);
	kv_dedup_finish(d, 1, 7, &r, S("k"), 100);
	assert_int_equal(kv_dedup_begin(d, 1, 6, true, 100, &out), KV_ENOTFOUND);
	kv_dedup_abort(d, 1, 6);
	/* Idle clients expire, and the client count stays bounded. */
	for (uint64_t c = 2; c < 200; c++)
		assert_int_equal(kv_dedup_begin(d, c, 1, true, 5000, &out), KV_ENOTFOUND);
	assert_true(kv_dedup_clients(d) <= 16 + 16);
	kv_dedup_destroy(d);
}

/* A client's memory refilled from elsewhere (a snapshot, a transfer, a copy)
 * does not know what was forgotten before it: when it is full, a write
 * below every id it holds is refused. */
static void
dedup_refilled_memory_refuses_writes_older_than_it_holds(void **state)
{
	kv_dedup *d = kv_dedup_create(4, 16, 1000);
	kv_dedup_result r = {0}, out;
	(void)state;
	for (uint64_t i = 100; i < 104; i++)
		assert_int_equal(kv_dedup_insert(d, 1, i, &r, S("k"), 100), 0);
	assert_int_equal(kv_dedup_begin(d, 1, 42, true, 100, &out), KV_ESTALE);
	assert_int_equal(kv_dedup_begin(d, 1, 101, true, 100, &out), 0);
	kv_buf_fini(&out.value);
	assert_int_equal(kv_dedup_begin(d, 1, 104, true, 100, &out), KV_ENOTFOUND);
	kv_dedup_abort(d, 1, 104);
	/* Not full: nothing is known to be forgotten, an old id is new. */
	assert_int_equal(kv_dedup_insert(d, 2, 100, &r, S("k"), 100), 0);
	assert_int_equal(kv_dedup_begin(d, 2, 42, true, 100, &out), KV_ENOTFOUND);
	kv_dedup_abort(d, 2, 42);
	kv_dedup_destroy(d);
}

/* The memory of a client grows with its writes up to the bound: 1000
 * writes in flight out of order are all new and all remembered. */
static void
dedup_remembers_up_to_its_bound_out_of_order(void **state)
{
	kv_dedup *d = kv_dedup_create(1024, 16, 1000);
	kv_dedup_result r = {0}, out;
	(void)state;
	for (uint64_t i = 0; i < 1000; i++) {
		uint64_t req = 1 + (i * 7919) % 1000; /* a permutation of 1..1000 */
		assert_int_equal(kv_dedup_begin(d, 9, req, true, 100, &out), KV_ENOTFOUND);
		kv_dedup_finish(d, 9, req, &r, S("k"), 100);
	}
	for (uint64_t req = 1; req <= 1000; req++) {
		assert_int_equal(kv_dedup_begin(d, 9, req, true, 100, &out), 0);
		kv_buf_fini(&out.value);
	}
	kv_dedup_destroy(d);
}

/* Many writes of one client through a small ring, with aborted and
 * forgotten ones among them: the memory answers exactly what the ring still
 * holds (the index follows every overwrite, abort and forget). */
static void
dedup_lookup_follows_the_ring_through_wraps_aborts_and_forgets(void **state)
{
	enum { RING = 64, N = 5000 };
	kv_dedup *d = kv_dedup_create(RING, 16, 1000);
	kv_dedup_result r = {0}, out;
	uint64_t held[RING]; /* the ids written, in ring order; 0: none */
	size_t n = 0;
	(void)state;
	memset(held, 0, sizeof(held));
	for (uint64_t req = 1; req <= N; req++) {
		assert_int_equal(kv_dedup_begin(d, 5, req, false, 100, &out), KV_ENOTFOUND);
		if (req % 7 == 0) {
			kv_dedup_abort(d, 5, req); /* its slot is empty now */
			held[n++ % RING] = 0;
			continue;
		}
		if (req % 11 == 0)
			kv_dedup_finish(d, 5, req, &r, S("gone"), 100);
		else
			kv_dedup_finish(d, 5, req, &r, S("kept"), 100);
		held[n++ % RING] = req;
		if (req % 500 == 0) {
			kv_dedup_forget_range(d, S("gone"), S("gonf"));
			for (size_t i = 0; i < RING; i++)
				if (held[i] % 11 == 0)
					held[i] = 0;
		}
		if (req % 97 != 0)
			continue;
		for (size_t i = 0; i < RING; i++) {
			if (held[i] == 0)
				continue;
			assert_int_equal(kv_dedup_begin(d, 5, held[i], true, 100, &out), 0);
			kv_buf_fini(&out.value);
		}
	}
	/* Ids no longer held are refused as forgotten, never applied again. */
	assert_int_equal(kv_dedup_begin(d, 5, 1, true, 100, &out), KV_ESTALE);
	assert_int_equal(kv_dedup_begin(d, 5, N - RING - 1, true, 100, &out), KV_ESTALE);
	kv_dedup_destroy(d);
}

/* A range's entries forgotten (a copy replaces the range): the copy's
 * source may itself have forgotten one of them (its ring wrapped), so a
 * retry of a forgotten write is refused, not applied a second time; the
 * entries the copy brings are answered, and new writes go on. */
static void
dedup_forgetting_a_range_refuses_retries_of_what_it_forgot(void **state)
{
	kv_dedup *d = kv_dedup_create(1024, 16, 1000);
	kv_dedup_result r = {.status = 0, .value_len = 3}, out;
	(void)state;
	for (uint64_t i = 1; i <= 10; i++) {
		assert_int_equal(kv_dedup_begin(d, 4, i, false, 100, &out), KV_ENOTFOUND);
		if (i % 2)
			kv_dedup_finish(d, 4, i, &r, S("a000"), 100);
		else
			kv_dedup_finish(d, 4, i, &r, S("r003"), 100);
	}
	kv_dedup_forget_range(d, S("a"), S("b"));
	/* Request 9 (key a000) was forgotten: its retry is refused. */
	assert_int_equal(kv_dedup_begin(d, 4, 9, true, 100, &out), KV_ESTALE);
	/* What the copy brings is answered. */
	assert_int_equal(kv_dedup_insert(d, 4, 7, &r, S("a000"), 100), 0);
	assert_int_equal(kv_dedup_begin(d, 4, 7, true, 100, &out), 0);
	kv_buf_fini(&out.value);
	/* The other key's entries stay, and new writes are new. */
	assert_int_equal(kv_dedup_begin(d, 4, 10, true, 100, &out), 0);
	kv_buf_fini(&out.value);
	assert_int_equal(kv_dedup_begin(d, 4, 11, true, 100, &out), KV_ENOTFOUND);
	kv_dedup_abort(d, 4, 11);
	assert_int_equal(kv_dedup_begin(d, 4, 12, false, 100, &out), KV_ENOTFOUND);
	kv_dedup_abort(d, 4, 12);
	kv_dedup_destroy(d);
}

typedef struct {
	int n;
} visit_acc;

static void
count_cb(void *arg, uint64_t client, uint64_t req, const kv_dedup_result *res, const uint8_t *key,
         size_t klen, uint64_t time_ms)
{
	(void)client, (void)req, (void)res, (void)key, (void)klen, (void)time_ms;
	((visit_acc *)arg)->n++;
}

static void
dedup_visit_range_selects_by_key(void **state)
{
	kv_dedup *d = kv_dedup_create(0, 0, 0);
	kv_dedup_result r = {0};
	visit_acc a = {0};
	(void)state;
	assert_int_equal(kv_dedup_insert(d, 1, 1, &r, S("apple"), 1), 0);
	assert_int_equal(kv_dedup_insert(d, 1, 2, &r, S("melon"), 1), 0);
	assert_int_equal(kv_dedup_insert(d, 3, 1, &r, S("zebra"), 1), 0);
	kv_dedup_visit_range(d, S("m"), S(""), count_cb, &a);
	assert_int_equal(a.n, 2);
	kv_dedup_destroy(d);
}

/* Packs a Request into a malloc'd buffer. */
static uint8_t *
pack_req(Shardkv__Request *r, size_t *n)
{
	*n = shardkv__request__get_packed_size(r);
	uint8_t *p = malloc(*n ? *n : 1);
	shardkv__request__pack(r, p);
	return p;
}

static void
codec_refuses_hostile_requests_without_crashing(void **state)
{
	kv_req rq;
	const char *why;
	uint8_t buf[512];
	(void)state;
	srand(42);
	/* Random bytes: decoded or refused, never a crash. */
	for (int i = 0; i < 20000; i++) {
		size_t n = (size_t)(rand() % (int)sizeof(buf));
		for (size_t j = 0; j < n; j++)
			buf[j] = (uint8_t)rand();
		int rv = kv_data_req_decode(buf, n, &rq, &why);
		assert_true(rv == 0 || rv == KV_EPROTO || rv == KV_EINVAL || rv == KV_ELIMIT);
		kv_data_req_fini(&rq);
	}
	/* Wrong version. */
	Shardkv__Request r = SHARDKV__REQUEST__INIT;
	size_t n;
	uint8_t *p = pack_req(&r, &n);
	assert_int_equal(kv_data_req_decode(p, n, &rq, &why), KV_EINVAL);
	assert_non_null(strstr(why, "version"));
	kv_data_req_fini(&rq);
	free(p);
	/* An op with no command. */
	Shardkv__Op op = SHARDKV__OP__INIT, *ops[1] = {&op};
	r.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	r.n_ops = 1;
	r.ops = ops;
	p = pack_req(&r, &n);
	assert_int_equal(kv_data_req_decode(p, n, &rq, &why), KV_EINVAL);
	kv_data_req_fini(&rq);
	free(p);
	/* A transfer chunk with a split value is refused. */
	Shardkv__Transfer t = SHARDKV__TRANSFER__INIT;
	Shardkv__TransferChunk c = SHARDKV__TRANSFER_CHUNK__INIT;
	Shardkv__KeyValue kv = SHARDKV__KEY_VALUE__INIT, *kvs[1] = {&kv};
	kv.key.data = (uint8_t *)"k";
	kv.key.len = 1;
	kv.value_total = 100;
	c.n_entries = 1;
	c.entries = kvs;
	t.migration_id = 1;
	t.seq = 2;
	t.msg_case = SHARDKV__TRANSFER__MSG_CHUNK;
	t.chunk = &c;
	r.n_ops = 0;
	r.ops = NULL;
	r.transfer = &t;
	p = pack_req(&r, &n);
	assert_int_equal(kv_data_req_decode(p, n, &rq, &why), KV_EINVAL);
	kv_data_req_fini(&rq);
	free(p);
	/* A valid mput with mismatched counts decodes; the dispatcher refuses it. */
	Shardkv__MPutOp mp = SHARDKV__MPUT_OP__INIT;
	ProtobufCBinaryData keys[2] = {{1, (uint8_t *)"a"}, {1, (uint8_t *)"b"}};
	mp.n_keys = 2;
	mp.keys = keys;
	op.op_case = SHARDKV__OP__OP_MPUT;
	op.mput = &mp;
	r.transfer = NULL;
	r.n_ops = 1;
	r.ops = ops;
	p = pack_req(&r, &n);
	assert_int_equal(kv_data_req_decode(p, n, &rq, &why), 0);
	assert_int_equal(rq.ops[0].kind, KV_OP_MPUT);
	assert_int_equal(rq.ops[0].nkeys, 2);
	assert_int_equal(rq.ops[0].nvals, 0);
	kv_data_req_fini(&rq);
	free(p);
}

static void
codec_response_round_trips_results_and_hints(void **state)
{
	kv_data_result res[2];
	kv_resp r = {.request_id = 9, .epoch = 4, .node_id = 2, .nresults = 2, .results = res};
	nng_msg *m;
	(void)state;
	memset(res, 0, sizeof(res));
	res[0].status = KV_EWRONGOWNER;
	res[0].has_hint = true;
	res[0].hint.epoch = 3;
	res[0].hint.node_id = 5;
	res[0].hint.address = strdup("tcp://h:1");
	kv_buf_set(&res[0].hint.start, "m", 1);
	res[1].status = 0;
	res[1].has_value = true;
	kv_buf_set(&res[1].value, "val", 3);
	assert_int_equal(kv_data_resp_encode(&r, &m), 0);
	Shardkv__Response *pb = shardkv__response__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
	assert_non_null(pb);
	assert_int_equal(pb->n_results, 2);
	assert_int_equal(pb->results[0]->status, SHARDKV__STATUS__STATUS_WRONG_OWNER);
	assert_int_equal(pb->results[0]->owner->node_id, 5);
	assert_string_equal(pb->results[0]->owner->address, "tcp://h:1");
	assert_memory_equal(pb->results[1]->value.data, "val", 3);
	shardkv__response__free_unpacked(pb, NULL);
	nng_msg_free(m);
	kv_data_result_fini(&res[0]);
	kv_data_result_fini(&res[1]);
}

/* Writes n bytes to dir/handover.ids as they are. */
static void
write_raw(const char *dir, const uint8_t *p, size_t n)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/handover.ids", dir);
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(p, 1, n, f), n);
	fclose(f);
}

static size_t
read_raw(const char *dir, uint8_t *p, size_t cap)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/handover.ids", dir);
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	size_t n = fread(p, 1, cap, f);
	fclose(f);
	return n;
}

static void
handover_file_round_trips_and_refuses_a_damaged_one(void **state)
{
	char dir[64] = "/tmp/kvhand.XXXXXX";
	kv_handover_ent in[3] = {{.id = 7, .epoch = 12, .out = true},
	                         {.id = 9, .epoch = 15, .out = false},
	                         {.id = UINT64_MAX, .epoch = 1, .out = true}};
	kv_handover_ent got[4];
	uint8_t raw[256];
	size_t n = 99, len;
	(void)state;
	assert_non_null(mkdtemp(dir));
	/* Absent: nothing to resume. */
	assert_int_equal(kv_handfile_load(dir, got, 4, &n), 0);
	assert_int_equal(n, 0);
	assert_int_equal(kv_handfile_save(dir, in, 3), 0);
	assert_int_equal(kv_handfile_load(dir, got, 4, &n), 0);
	assert_int_equal(n, 3);
	for (size_t i = 0; i < 3; i++) {
		assert_true(got[i].id == in[i].id);
		assert_true(got[i].epoch == in[i].epoch);
		assert_int_equal(got[i].out, in[i].out);
	}
	/* More entries than the caller holds. */
	assert_int_equal(kv_handfile_load(dir, got, 2, &n), KV_ECORRUPT);
	assert_int_equal(n, 0);
	len = read_raw(dir, raw, sizeof(raw));
	assert_int_equal(len, 12 + 3 * 17 + 8);
	/* Every single flipped bit, a cut and a longer file are refused. */
	for (size_t i = 0; i < len * 8; i += 7) {
		raw[i / 8] ^= (uint8_t)(1u << (i % 8));
		write_raw(dir, raw, len);
		assert_int_equal(kv_handfile_load(dir, got, 4, &n), KV_ECORRUPT);
		raw[i / 8] ^= (uint8_t)(1u << (i % 8));
	}
	write_raw(dir, raw, len - 1);
	assert_int_equal(kv_handfile_load(dir, got, 4, &n), KV_ECORRUPT);
	raw[len] = 0;
	write_raw(dir, raw, len + 1);
	assert_int_equal(kv_handfile_load(dir, got, 4, &n), KV_ECORRUPT);
	write_raw(dir, raw, 0);
	assert_int_equal(kv_handfile_load(dir, got, 4, &n), KV_ECORRUPT);
	/* An empty set is a file of its own. */
	assert_int_equal(kv_handfile_save(dir, NULL, 0), 0);
	assert_int_equal(kv_handfile_load(dir, got, 4, &n), 0);
	assert_int_equal(n, 0);
	assert_int_equal(kv_handfile_save(dir, in, KV_HANDFILE_MAX + 1), KV_EINVAL);
	kv_test_rmtree(dir);
}

/* A range's figures as a heartbeat counted them: [a, b) with `bytes`. */
static kv_admin_range_stat
stat_of(const char *a, const char *b, uint64_t bytes)
{
	return (kv_admin_range_stat){.start = {(const uint8_t *)a, strlen(a)},
	                             .end = {(const uint8_t *)b, strlen(b)},
	                             .bytes = bytes};
}

/* When the ranges a node leads change, the load rates of the ranges that
 * stay, of the parts of a cut range and of a merge carry over from the last
 * count; only a range new to the node (or a part overlapping an old range
 * in part) starts from zero. Before, every rate of the node started from
 * zero, and the balancer read the node as idle (doc/scheduler.md
 * "Settling"). */
static void
load_rates_carry_over_when_the_led_ranges_change(void **state)
{
	(void)state;
	/* Led before: [a, c) 100 bytes, [c, e) 0 bytes, [g, k) 50, [k, m) 50, [p, "") 10. */
	kv_admin_range_stat old[] = {stat_of("a", "c", 100), stat_of("c", "e", 0),
	                             stat_of("g", "k", 50), stat_of("k", "m", 50),
	                             stat_of("p", "", 10)};
	double ord[] = {10, 4, 3, 5, 7}, owr[] = {20, 8, 6, 10, 14};
	/* Now: [a, b) and [b, c) cut from [a, c) with 25 and 75 bytes; [c, d)
	 * cut from [c, e), which held nothing; [g, m) the merge of two; [n, o)
	 * new; [o, q) over [p, "") in part; [q, "") inside it, all its bytes. */
	kv_admin_range_stat now[] = {stat_of("a", "b", 25), stat_of("b", "c", 75),
	                             stat_of("c", "d", 0),  stat_of("g", "m", 100),
	                             stat_of("n", "o", 9),  stat_of("o", "q", 3),
	                             stat_of("q", "", 10)};
	/* What each range of `now` gets: 1/4 and 3/4 of [a, c)'s, none (its
	 * range held no bytes), the sum of two, none, none, all of [p, ""). */
	const double erd[] = {2.5, 7.5, 0, 8, 0, 0, 7}, ewr[] = {5, 15, 0, 16, 0, 0, 14};
	double rd[7], wr[7];
	kv_srv_carry_rates(old, ord, owr, 5, now, rd, wr, 7);
	for (int i = 0; i < 7; i++) {
		assert_float_equal(rd[i], erd[i], 1e-9);
		assert_float_equal(wr[i], ewr[i], 1e-9);
	}
	/* The same ranges keep their rates. */
	kv_srv_carry_rates(old, ord, owr, 5, old, rd, wr, 5);
	for (int i = 0; i < 5; i++) {
		assert_float_equal(rd[i], ord[i], 1e-9);
		assert_float_equal(wr[i], owr[i], 1e-9);
	}
	/* Nothing led before: everything starts from zero. */
	kv_srv_carry_rates(NULL, NULL, NULL, 0, now, rd, wr, 7);
	for (int i = 0; i < 7; i++)
		assert_true(rd[i] == 0 && wr[i] == 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(owner_lookup_finds_the_entry_holding_the_key),
	    cmocka_unit_test(owner_fill_leaves_served_parts_alone),
	    cmocka_unit_test(owner_refill_that_changes_nothing_does_not_wait_for_ops_in_flight),
	    cmocka_unit_test(owner_served_merges_adjacent_ranges),
	    cmocka_unit_test(load_rates_carry_over_when_the_led_ranges_change),
	    cmocka_unit_test(dedup_retry_returns_the_first_result),
	    cmocka_unit_test(dedup_a_received_result_outlives_the_abort_of_a_retry_in_progress),
	    cmocka_unit_test(dedup_results_inserted_together_land_as_one_insert_each_would),
	    cmocka_unit_test(dedup_default_memory_outlasts_a_pipelined_clients_retry),
	    cmocka_unit_test(dedup_refuses_a_forgotten_write_instead_of_applying_it_again),
	    cmocka_unit_test(dedup_refilled_memory_refuses_writes_older_than_it_holds),
	    cmocka_unit_test(dedup_remembers_up_to_its_bound_out_of_order),
	    cmocka_unit_test(dedup_forgetting_a_range_refuses_retries_of_what_it_forgot),
	    cmocka_unit_test(dedup_visit_range_selects_by_key),
	    cmocka_unit_test(dedup_lookup_follows_the_ring_through_wraps_aborts_and_forgets),
	    cmocka_unit_test(codec_refuses_hostile_requests_without_crashing),
	    cmocka_unit_test(codec_response_round_trips_results_and_hints),
	    cmocka_unit_test(handover_file_round_trips_and_refuses_a_damaged_one),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
