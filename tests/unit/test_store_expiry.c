/*
 * test_store_expiry.c - the store's expiry, conditional writes, incr, count
 * and range delete (store.h kv_store_update, kv_store_count,
 * kv_store_delrange, kv_store_expire_sample), with an injected clock, in
 * striped and percore mode with one and with several partitions.
 */
// clang-format off
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
// clang-format on

#include "common/err.h"
#include "common/key.h"
#include "shardserver/store/store.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The injected clock, Unix ms. */
static _Atomic uint64_t now_ms = 1000000;

static uint64_t
test_clock(void *arg)
{
	(void)arg;
	return atomic_load(&now_ms);
}

typedef struct {
	kv_store_mode mode;
	unsigned parts;
} cfg;

static const cfg cfgs[] = {
    {KV_STORE_STRIPED, 1},
    {KV_STORE_STRIPED, 16},
    {KV_STORE_PERCORE, 1},
    {KV_STORE_PERCORE, 4},
};
#define NCFG (sizeof cfgs / sizeof cfgs[0])

static kv_store *
open_store(const cfg *c)
{
	kv_store_opts o;
	kv_store *s = NULL;

	kv_store_opts_init(&o);
	o.mode = c->mode;
	o.partitions = c->parts;
	o.clock = test_clock;
	assert_int_equal(kv_store_create(&o, &s), KV_OK);
	return s;
}

static bool
present(kv_store *s, const char *k)
{
	kv_buf v = {0};
	int rv = kv_store_get(s, k, strlen(k), &v);
	kv_buf_fini(&v);
	assert_true(rv == KV_OK || rv == KV_ENOTFOUND);
	return rv == KV_OK;
}

static void
put_ttl(kv_store *s, const char *k, const char *v, uint64_t at)
{
	assert_int_equal(kv_store_put_x(s, k, strlen(k), v, strlen(v), at), KV_OK);
}

static void
key_is_absent_from_its_deadline_on(void **state)
{
	(void)state;
	for (size_t i = 0; i < NCFG; i++) {
		kv_store *s = open_store(&cfgs[i]);
		uint64_t t = atomic_load(&now_ms), at = 0;
		kv_buf v = {0};

		put_ttl(s, "k", "v", t + 10);
		atomic_store(&now_ms, t + 9);
		assert_int_equal(kv_store_get_x(s, "k", 1, &v, &at), KV_OK);
		assert_int_equal(at, t + 10);
		atomic_store(&now_ms, t + 10);
		assert_false(present(s, "k"));
		/* Still in memory until reclaimed, and a scan skips it. */
		kv_store_stats st;
		kv_store_get_stats(s, &st);
		assert_int_equal(st.keys, 1);
		assert_int_equal(st.expiring, 1);
		uint64_t n = 9;
		bool more = true;
		assert_int_equal(kv_store_count(s, "", 0, "", 0, 0, &n, &more, NULL), KV_OK);
		assert_int_equal(n, 0);
		bool missing[1];
		kv_bytes keys[1] = {{(const uint8_t *)"k", 1}};
		assert_int_equal(kv_store_mget(s, 1, keys, &v, missing), KV_ENOTFOUND);
		assert_true(missing[0]);
		kv_buf_fini(&v);
		kv_store_destroy(s);
	}
}

static void
put_without_deadline_clears_it_and_append_incr_keep_it(void **state)
{
	(void)state;
	for (size_t i = 0; i < NCFG; i++) {
		kv_store *s = open_store(&cfgs[i]);
		uint64_t t = atomic_load(&now_ms), at = 0;
		kv_buf v = {0};
		kv_store_upd u = {.kind = KV_UPD_APPEND, .value = {(const uint8_t *)"x", 1}};

		put_ttl(s, "a", "1", t + 50);
		assert_int_equal(kv_store_update(s, "a", 1, &u), KV_OK);
		assert_int_equal(u.new_at, t + 50);
		u = (kv_store_upd){.kind = KV_UPD_INCR, .delta = 1};
		put_ttl(s, "n", "41", t + 60);
		assert_int_equal(kv_store_update(s, "n", 1, &u), KV_OK);
		assert_int_equal(u.number, 42);
		assert_int_equal(kv_store_get_x(s, "n", 1, &v, &at), KV_OK);
		assert_int_equal(at, t + 60);
		assert_memory_equal(v.data, "42", 2);
		put_ttl(s, "n", "7", 0);
		assert_int_equal(kv_store_get_x(s, "n", 1, &v, &at), KV_OK);
		assert_int_equal(at, 0);
		kv_store_stats st;
		kv_store_get_stats(s, &st);
		assert_int_equal(st.expiring, 1);
		/* An append to an expired key starts afresh, without a deadline. */
		atomic_store(&now_ms, t + 50);
		u = (kv_store_upd){.kind = KV_UPD_APPEND, .value = {(const uint8_t *)"y", 1}};
		assert_int_equal(kv_store_update(s, "a", 1, &u), KV_OK);
		assert_int_equal(u.newlen, 1);
		assert_int_equal(u.new_at, 0);
		atomic_store(&now_ms, t);
		kv_buf_fini(&v);
		kv_store_destroy(s);
	}
}

static void
conditional_writes_report_the_current_value(void **state)
{
	(void)state;
	for (size_t i = 0; i < NCFG; i++) {
		kv_store *s = open_store(&cfgs[i]);
		uint64_t t = atomic_load(&now_ms);
		kv_buf cur = {0};
		kv_store_upd u = {.kind = KV_UPD_PUT,
		                  .cond = KV_UPD_IF_ABSENT,
		                  .value = {(const uint8_t *)"one", 3},
		                  .cur = &cur};

		assert_int_equal(kv_store_update(s, "c", 1, &u), KV_OK);
		u.value = (kv_bytes){(const uint8_t *)"two", 3};
		assert_int_equal(kv_store_update(s, "c", 1, &u), KV_EEXISTS);
		assert_false(u.cur_absent);
		assert_int_equal(cur.len, 3);
		assert_memory_equal(cur.data, "one", 3);
		u.cond = KV_UPD_IF_EQUAL;
		u.expect = (kv_bytes){(const uint8_t *)"uno", 3};
		assert_int_equal(kv_store_update(s, "c", 1, &u), KV_EMISMATCH);
		assert_memory_equal(cur.data, "one", 3);
		u.expect = (kv_bytes){(const uint8_t *)"one", 3};
		assert_int_equal(kv_store_update(s, "c", 1, &u), KV_OK);
		/* del IF_EQUAL */
		u = (kv_store_upd){.kind = KV_UPD_DEL,
		                   .cond = KV_UPD_IF_EQUAL,
		                   .expect = {(const uint8_t *)"one", 3},
		                   .cur = &cur};
		assert_int_equal(kv_store_update(s, "c", 1, &u), KV_EMISMATCH);
		assert_memory_equal(cur.data, "two", 3);
		u.expect = (kv_bytes){(const uint8_t *)"two", 3};
		assert_int_equal(kv_store_update(s, "c", 1, &u), KV_OK);
		assert_false(present(s, "c"));
		assert_int_equal(kv_store_update(s, "c", 1, &u), KV_EMISMATCH);
		assert_true(u.cur_absent);
		/* An expired key is absent for conditions. */
		put_ttl(s, "e", "old", t + 1);
		atomic_store(&now_ms, t + 1);
		u = (kv_store_upd){.kind = KV_UPD_PUT,
		                   .cond = KV_UPD_IF_ABSENT,
		                   .value = {(const uint8_t *)"new", 3}};
		assert_int_equal(kv_store_update(s, "e", 1, &u), KV_OK);
		assert_true(present(s, "e"));
		/* IF_ABSENT is for put only. */
		u = (kv_store_upd){.kind = KV_UPD_DEL, .cond = KV_UPD_IF_ABSENT};
		assert_int_equal(kv_store_update(s, "e", 1, &u), KV_EINVAL);
		atomic_store(&now_ms, t);
		kv_buf_fini(&cur);
		kv_store_destroy(s);
	}
}

static void
incr_parses_strictly_and_refuses_overflow(void **state)
{
	static const char *bad[] = {"",
	                            "-",
	                            "+1",
	                            " 1",
	                            "1 ",
	                            "1x",
	                            "0x10",
	                            "9223372036854775808",
	                            "-9223372036854775809",
	                            "12345678901234567890"};
	int64_t n = 0;
	kv_store *s = open_store(&cfgs[0]);
	kv_store_upd u = {.kind = KV_UPD_INCR, .delta = 5};

	(void)state;
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		assert_int_equal(kv_store_parse_i64(bad[i], strlen(bad[i]), &n), KV_EINVAL);
	assert_int_equal(kv_store_parse_i64("9223372036854775807", 19, &n), KV_OK);
	assert_true(n == INT64_MAX);
	assert_int_equal(kv_store_parse_i64("-9223372036854775808", 20, &n), KV_OK);
	assert_true(n == INT64_MIN);
	assert_int_equal(kv_store_parse_i64("-0", 2, &n), KV_OK);
	assert_int_equal(n, 0);

	assert_int_equal(kv_store_update(s, "n", 1, &u), KV_OK); /* absent: 0 */
	assert_int_equal(u.number, 5);
	u.delta = -7;
	assert_int_equal(kv_store_update(s, "n", 1, &u), KV_OK);
	assert_int_equal(u.number, -2);
	put_ttl(s, "m", "9223372036854775806", 0);
	u.delta = 1;
	assert_int_equal(kv_store_update(s, "m", 1, &u), KV_OK);
	assert_true(u.number == INT64_MAX);
	assert_int_equal(kv_store_update(s, "m", 1, &u), KV_EINVAL);
	assert_non_null(u.why);
	put_ttl(s, "m", "-9223372036854775807", 0);
	u.delta = -2;
	assert_int_equal(kv_store_update(s, "m", 1, &u), KV_EINVAL);
	put_ttl(s, "t", "abc", 0);
	u.delta = 1;
	assert_int_equal(kv_store_update(s, "t", 1, &u), KV_EINVAL);
	kv_buf v = {0};
	assert_int_equal(kv_store_get(s, "t", 1, &v), KV_OK); /* nothing written */
	assert_memory_equal(v.data, "abc", 3);
	kv_buf_fini(&v);
	kv_store_destroy(s);
}

static void
expire_and_persist_need_a_live_key(void **state)
{
	(void)state;
	for (size_t i = 0; i < NCFG; i++) {
		kv_store *s = open_store(&cfgs[i]);
		uint64_t t = atomic_load(&now_ms), at = 0;
		kv_buf v = {0};
		kv_store_upd u = {.kind = KV_UPD_EXPIRE, .expire_at = t + 5};

		assert_int_equal(kv_store_update(s, "x", 1, &u), KV_ENOTFOUND);
		put_ttl(s, "x", "v", 0);
		assert_int_equal(kv_store_update(s, "x", 1, &u), KV_OK);
		assert_int_equal(kv_store_get_x(s, "x", 1, &v, &at), KV_OK);
		assert_int_equal(at, t + 5);
		u.expire_at = 0; /* persist */
		assert_int_equal(kv_store_update(s, "x", 1, &u), KV_OK);
		atomic_store(&now_ms, t + 100);
		assert_true(present(s, "x"));
		atomic_store(&now_ms, t);
		kv_buf_fini(&v);
		kv_store_destroy(s);
	}
}

static void
collect_key(void *arg, const uint8_t *key, size_t klen, bool expired)
{
	kv_buf *b = arg;
	(void)expired;
	(void)kv_buf_append(b, key, klen);
	(void)kv_buf_append(b, ",", 1);
}

static void
delrange_removes_limit_keys_per_step_in_order(void **state)
{
	(void)state;
	for (size_t i = 0; i < NCFG; i++) {
		kv_store *s = open_store(&cfgs[i]);
		char k[16];
		uint64_t n = 0, total = 0;
		bool more = false;
		kv_buf next = {0}, from = {0}, seen = {0}, rm = {0};
		int steps = 0;

		for (int j = 0; j < 100; j++) {
			snprintf(k, sizeof k, "r%03d", j);
			put_ttl(s, k, "v", 0);
		}
		put_ttl(s, "q", "outside", 0);
		put_ttl(s, "s", "outside", 0);
		/* count in steps of 30 */
		assert_int_equal(kv_store_count(s, "r", 1, "s", 1, 30, &n, &more, &next), KV_OK);
		assert_int_equal(n, 30);
		assert_true(more);
		assert_int_equal(kv_buf_set(&from, "r", 1), KV_OK);
		do {
			assert_int_equal(kv_store_delrange(s, from.data, from.len, "s", 1, 30, &rm,
			                                   &n, &more, &next),
			                 KV_OK);
			for (size_t off = 0; off < rm.len;) {
				uint32_t kl;
				memcpy(&kl, rm.data + off, 4);
				collect_key(&seen, rm.data + off + 4, kl, false);
				off += 4 + kl;
			}
			total += n;
			steps++;
			if (more)
				assert_int_equal(kv_buf_set(&from, next.data, next.len), KV_OK);
		} while (more && steps < 10);
		assert_int_equal(total, 100);
		assert_int_equal(steps, 4);
		assert_true(seen.len > 5 && memcmp(seen.data, "r000,r001,", 10) == 0);
		assert_true(present(s, "q"));
		assert_true(present(s, "s"));
		kv_store_stats st;
		kv_store_get_stats(s, &st);
		assert_int_equal(st.keys, 2);
		kv_buf_fini(&next);
		kv_buf_fini(&from);
		kv_buf_fini(&seen);
		kv_buf_fini(&rm);
		kv_store_destroy(s);
	}
}

static void
expire_sample_finds_expired_keys_and_reclaim_removes_them(void **state)
{
	(void)state;
	for (size_t i = 0; i < NCFG; i++) {
		kv_store *s = open_store(&cfgs[i]);
		uint64_t t = atomic_load(&now_ms);
		char k[16];
		kv_buf found = {0};

		for (int j = 0; j < 50; j++) {
			snprintf(k, sizeof k, "e%02d", j);
			put_ttl(s, k, "v", j % 2 ? t + 10 : t + 1000);
		}
		put_ttl(s, "plain", "v", 0);
		atomic_store(&now_ms, t + 10);
		for (unsigned p = 0; p < kv_store_partitions(s); p++) {
			size_t seen = 0;
			/* Small steps: the cursor wraps around the partition. */
			for (int r = 0; r < 40; r++)
				assert_int_equal(
				    kv_store_expire_sample(s, p, 2, collect_key, &found, &seen),
				    KV_OK);
		}
		/* Reclaim what was found: only expired keys go. */
		size_t reclaimed = 0;
		for (size_t off = 0; off < found.len;) {
			const uint8_t *c = memchr(found.data + off, ',', found.len - off);
			size_t kl = (size_t)(c - (found.data + off));
			kv_store_upd u = {.kind = KV_UPD_RECLAIM};
			if (kv_store_update(s, found.data + off, kl, &u) == KV_OK)
				reclaimed++;
			off += kl + 1;
		}
		assert_int_equal(reclaimed, 25);
		kv_store_upd u = {.kind = KV_UPD_RECLAIM};
		assert_int_equal(kv_store_update(s, "e00", 3, &u), KV_ENOTFOUND); /* live */
		assert_int_equal(kv_store_update(s, "plain", 5, &u), KV_ENOTFOUND);
		kv_store_stats st;
		kv_store_get_stats(s, &st);
		assert_int_equal(st.keys, 26);
		assert_int_equal(st.expiring, 25);
		atomic_store(&now_ms, t);
		kv_buf_fini(&found);
		kv_store_destroy(s);
	}
}

static int
step_x_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen, uint64_t at)
{
	uint64_t *sum = arg;
	(void)key;
	(void)klen;
	(void)val;
	(void)vlen;
	*sum += at;
	return 0;
}

static void
range_step_x_visits_expired_keys_with_their_deadline(void **state)
{
	(void)state;
	for (size_t i = 0; i < NCFG; i++) {
		kv_store *s = open_store(&cfgs[i]);
		uint64_t t = atomic_load(&now_ms), sum = 0;
		kv_store_cursor c;
		kv_bytes keys[2] = {{(const uint8_t *)"m1", 2}, {(const uint8_t *)"m2", 2}};
		kv_bytes vals[2] = {{(const uint8_t *)"a", 1}, {(const uint8_t *)"b", 1}};

		assert_int_equal(kv_store_mput_x(s, 2, keys, 2, vals, t + 3), KV_OK);
		put_ttl(s, "p", "v", 0);
		atomic_store(&now_ms, t + 3);
		kv_store_cursor_init(&c);
		while (!c.done)
			assert_int_equal(
			    kv_store_range_step_x(s, "", 0, "", 0, &c, 2, step_x_cb, &sum), KV_OK);
		kv_store_cursor_fini(&c);
		assert_int_equal(sum, 2 * (t + 3));
		/* mput without a deadline clears them. */
		assert_int_equal(kv_store_mput(s, 2, keys, 2, vals), KV_OK);
		assert_true(present(s, "m1"));
		kv_store_stats st;
		kv_store_get_stats(s, &st);
		assert_int_equal(st.expiring, 0);
		/* A blind delete removes an expired key but reports it absent. */
		put_ttl(s, "d", "v", t + 1);
		assert_int_equal(kv_store_del(s, "d", 1, NULL), KV_ENOTFOUND);
		kv_store_get_stats(s, &st);
		assert_int_equal(st.keys, 3);
		atomic_store(&now_ms, t);
		kv_store_destroy(s);
	}
}

/* A moving range's delete (kv_store_range_delete in steps) takes the
 * keys' deadlines with them, expired or not, and leaves the keys around
 * the range, their deadlines and the counts right. */
static void
range_delete_drops_the_deadlines_of_the_keys_it_removes(void **state)
{
	(void)state;
	for (size_t i = 0; i < NCFG; i++) {
		kv_store *s = open_store(&cfgs[i]);
		uint64_t t = atomic_load(&now_ms), deleted = 0;
		char k[64];
		int rv;

		/* Short keys (inline leaves) and long ones, every other with a
		 * deadline, one of them already past. */
		for (int j = 0; j < 600; j++) {
			snprintf(k, sizeof k,
			         j % 3 ? "r%03d" : "r%03d-a-key-longer-than-a-leaf-holds", j);
			put_ttl(s, k, "value", j % 2 ? (j == 1 ? t + 1 : t + 100000) : 0);
		}
		put_ttl(s, "q", "before", t + 100000);
		put_ttl(s, "s", "after", t + 100000);
		atomic_store(&now_ms, t + 1);
		do {
			rv = kv_store_range_delete(s, "r", 1, "s", 1, 7, &deleted);
			assert_true(rv == KV_OK || rv == KV_EBUSY);
		} while (rv == KV_EBUSY);
		assert_int_equal(deleted, 600);
		kv_store_stats st;
		kv_store_get_stats(s, &st);
		assert_int_equal(st.keys, 2);
		assert_int_equal(st.expiring, 2);
		assert_int_equal(st.bytes, 1 + 6 + 1 + 5);
		assert_false(present(s, "r000-a-key-longer-than-a-leaf-holds"));
		assert_false(present(s, "r001"));
		assert_true(present(s, "q"));
		assert_true(present(s, "s"));
		/* The same keys again get deadlines of their own, none left over. */
		put_ttl(s, "r002", "v", 0);
		kv_store_get_stats(s, &st);
		assert_int_equal(st.expiring, 2);
		atomic_store(&now_ms, t);
		kv_store_destroy(s);
	}
}

int
main(void)
{
	static const struct CMUnitTest tests[] = {
	    cmocka_unit_test(key_is_absent_from_its_deadline_on),
	    cmocka_unit_test(put_without_deadline_clears_it_and_append_incr_keep_it),
	    cmocka_unit_test(conditional_writes_report_the_current_value),
	    cmocka_unit_test(incr_parses_strictly_and_refuses_overflow),
	    cmocka_unit_test(expire_and_persist_need_a_live_key),
	    cmocka_unit_test(delrange_removes_limit_keys_per_step_in_order),
	    cmocka_unit_test(expire_sample_finds_expired_keys_and_reclaim_removes_them),
	    cmocka_unit_test(range_step_x_visits_expired_keys_with_their_deadline),
	    cmocka_unit_test(range_delete_drops_the_deadlines_of_the_keys_it_removes),
	};
	return cmocka_run_group_tests_name("store expiry", tests, NULL, NULL);
}
