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
 *
 * Every wait polls with a deadline.
 */
#include "common/err.h"
#include "shardserver/server.h"
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

static void
a_replica_copy_keeps_to_the_copy_rate(void **state)
{
	static char val[VSIZE + 1];
	char key[16];
	uint64_t t0, ms, bytes = 0;

	(void)state;
	memset(val, 'v', VSIZE);
	cr.srv[0].cfg.copy_rate_mb_s = RATE;
	inproc_cluster_srv_up(&cr, 0);
	srv_wait_ready(cr.srv[0].url, 1, PATIENCE, NULL);
	for (int k = 0; k < NKEYS; k++) {
		snprintf(key, sizeof(key), "c%04d", k);
		assert_int_equal(do_put(cr.srv[0].url, key, val, 0, 0).status, 0);
		bytes += strlen(key) + VSIZE;
	}
	t0 = kv_test_now_ms();
	inproc_cluster_srv_up(&cr, 1);
	while (!all_in_sync(&cr)) {
		if (kv_test_now_ms() - t0 > PATIENCE + bytes / (RATE * 1000u))
			fail_msg("node 2 never joined the ISR");
		kv_test_sleep_ms(10);
	}
	ms = kv_test_now_ms() - t0;
	print_message("copy of %llu bytes at %u MB/s: in the ISR after %llu ms\n",
	              (unsigned long long)bytes, RATE, (unsigned long long)ms);
	/* A lower bound only: never an upper bound on time. */
	assert_true(ms >= (bytes - STEP) / (RATE * 1000u));
	assert_true(inproc_srv_holds(cr.srv[1].s, "c0599", val));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    INPROC_CLUSTER_TEST(a_replica_copy_keeps_to_the_copy_rate, &cr),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
