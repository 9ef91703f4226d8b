/*
 * test_copyrate_inproc.c - the copy of a range to a replica outside the
 * ISR keeps to the primary's --copy-rate (doc/replication.md "Catch-up"),
 * with a real controller (--replicas 2, --min-insync 1) and two real
 * shard servers in the test process:
 *
 * - node 1 holds NKEYS values of VSIZE bytes and copies at RATE MB/s; node
 *   2 joins: it is in the ISR no sooner than the copy's bytes at that rate
 *   allow, less one step (the last step is sent at once and charged after).
 *   Only that lower bound is asserted; the time is printed.
 * - the same with --min-insync 2: the range takes no write until node 2
 *   is in sync, so its copy is not held back by the rate (counted as
 *   urgent bytes; no time is asserted, it is printed).
 *
 * Every wait polls with a deadline.
 */
#include "common/err.h"
#include "shardserver/server.h"
#include "shardserver/server_int.h" /* the server's kv_rs, for its copy counters */
#include "tests/support/inproc_cluster.h"
#include "tests/support/inproc_srv.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <stdio.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#define PATIENCE INPROC_CLUSTER_PATIENCE_MS
#define NKEYS    600
#define VSIZE    10000
#define RATE     2u              /* MB/s */
#define STEP     (1100u * 1000u) /* a copy step's bytes at the most, encoded */

static inproc_cluster cr = {.o = {.name = "kvcopyrate", .replicas = 2, .min_insync = 1}};
static inproc_cluster cu = {.o = {.name = "kvcopyurgent", .replicas = 2, .min_insync = 2}};

/* Whether every range has two in-sync members. */
static bool
all_in_sync(inproc_cluster *c)
{
	kv_config *cfg = inproc_cluster_config(c);
	bool ok = cfg != NULL && cfg->nranges > 0;

	for (size_t i = 0; ok && i < cfg->nranges; i++)
		ok = kv_range_ninsync(&cfg->ranges[i]) == 2;
	kv_config_free(cfg);
	return ok;
}

/* Node 1 alone (a single copy: it takes writes) stores NKEYS values and
 * copies at RATE; node 2 joins and is copied. Returns the milliseconds
 * until both were in sync; *bytes gets the keys' and values' bytes, *st
 * node 1's replication counters then. */
static uint64_t
load_and_copy(inproc_cluster *c, uint64_t *bytes, kv_rs_stats *st)
{
	static char val[VSIZE + 1];
	char key[16];
	uint64_t t0, ms;

	memset(val, 'v', VSIZE);
	*bytes = 0;
	c->srv[0].cfg.copy_rate_mb_s = RATE;
	inproc_cluster_srv_up(c, 0);
	srv_wait_ready(c->srv[0].url, 1, PATIENCE, NULL);
	for (int k = 0; k < NKEYS; k++) {
		snprintf(key, sizeof(key), "c%04d", k);
		assert_int_equal(do_put(c->srv[0].url, key, val, 0, 0).status, 0);
		*bytes += strlen(key) + VSIZE;
	}
	t0 = kv_test_now_ms();
	inproc_cluster_srv_up(c, 1);
	while (!all_in_sync(c)) {
		if (kv_test_now_ms() - t0 > PATIENCE + *bytes / (RATE * 1000u))
			fail_msg("node 2 never joined the ISR");
		kv_test_sleep_ms(10);
	}
	ms = kv_test_now_ms() - t0;
	kv_rs_stats_get(c->srv[0].s->repl, st);
	print_message("copy of %llu bytes at %u MB/s (min-insync %u): in the ISR after %llu ms, "
	              "%llu of %llu bytes sent urgent, %llu holds\n",
	              (unsigned long long)*bytes, RATE, c->o.min_insync, (unsigned long long)ms,
	              (unsigned long long)st->copy_urgent_bytes, (unsigned long long)st->copy_bytes,
	              (unsigned long long)st->copy_holds);
	assert_true(inproc_srv_holds(c->srv[1].s, "c0599", val));
	return ms;
}

static void
a_replica_copy_keeps_to_the_copy_rate(void **state)
{
	uint64_t bytes;
	kv_rs_stats st;

	(void)state;
	uint64_t ms = load_and_copy(&cr, &bytes, &st);
	/* A lower bound only: never an upper bound on time. */
	assert_true(ms >= (bytes - STEP) / (RATE * 1000u));
	assert_int_equal(st.copy_urgent_bytes, 0);
	assert_true(st.copy_bytes >= bytes);
	assert_true(st.copy_holds > 0);
}

static void
a_copy_that_restores_min_insync_is_not_held_back_by_the_copy_rate(void **state)
{
	uint64_t bytes;
	kv_rs_stats st;

	(void)state;
	(void)load_and_copy(&cu, &bytes, &st);
	assert_true(st.copy_bytes >= bytes);
	assert_int_equal(st.copy_urgent_bytes, st.copy_bytes);
	assert_int_equal(st.copy_holds, 0);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    INPROC_CLUSTER_TEST(a_replica_copy_keeps_to_the_copy_rate, &cr),
	    INPROC_CLUSTER_TEST(a_copy_that_restores_min_insync_is_not_held_back_by_the_copy_rate,
	                        &cu),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
