/*
 * test_cluster_cancel.c - cancelling a migration, with real daemons: a move
 * held back by a rate limit is cancelled while it copies; the range stays
 * with its source (configuration and status), every key still reads back,
 * writes to the range succeed, the destination drops what it had received,
 * and a second cancel is refused as not found. Also: unknown ids through the
 * library and the `shardkv cancel` command (exit codes, human and JSON
 * output, the migration id and rate in `shardkv status`).
 */
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#ifndef KV_CLI_BIN
#error "KV_CLI_BIN must name the shardkv binary"
#endif

#define NCOUNT (KV_TC_MAX_SERVERS + 2)

/* The moving data: N keys of VLEN bytes (about 20 MB), copied at RATE_MB_S,
 * so a move would take about 20 s: long enough to be cancelled mid-copy. */
#define N         20000u
#define VLEN      1024u
#define RATE_MB_S 1u
#define NWRITES   500u /* keys written into the range after the cancel */

static kv_tc tc;

static int
setup2(void **state)
{
	(void)state;
	/* One copy on purpose: a cancel stops a migration, which a move
	 * starts only with one copy per range. */
	return kv_tc_start_one_copy(&tc, "cluster-cancel", 2);
}

static int
teardown(void **state)
{
	(void)state;
	kv_tc_destroy(&tc);
	return 0;
}

/* Gives prefix's keys to server 0, writes N keys there, and starts a slow
 * move of [prefix, prefix-end) to server 1. Returns the migration id. */
static uint64_t
start_slow_move(const char *prefix, const char *end)
{
	int idx[1] = {0};
	char msg[512], n2[16];
	shardkv_admin_result ar;

	KV_TC_EXPECT(&tc, 0, kv_tc_spread(&tc, prefix, N, idx, 1));
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(tc.admin, prefix, N, 1, VLEN, msg, sizeof(msg)));
	kv_tc_node_arg(&tc, 1, n2, sizeof(n2));
	KV_TC_EXPECT(&tc, 0,
	             shardkv_move(tc.admin, prefix, strlen(prefix), end, strlen(end), n2, RATE_MB_S,
	                          0, &ar));
	KV_TC_ASSERT(&tc, ar.nmigrations == 1 && ar.first_mig_id != 0,
	             "the move started %zu migrations (first id %" PRIu64 ")", ar.nmigrations,
	             ar.first_mig_id);
	/* Copying, with data on its way: the cancel happens mid-copy. */
	KV_TC_ASSERT(
	    &tc,
	    kv_tc_wait_migration(&tc, ar.first_mig_id, "copying", 1, KV_TC_READY_MS, NULL) == 0,
	    "migration %" PRIu64 " never showed progress", ar.first_mig_id);
	return ar.first_mig_id;
}

/* Waits until the status reports at least `keys` keys on server i. */
static bool
wait_node_keys_at_least(int i, uint64_t keys, unsigned ms)
{
	uint64_t t0 = kv_test_now_ms();

	while (kv_test_now_ms() - t0 < ms) {
		shardkv_config *st = NULL;
		uint64_t have = 0;
		if (shardkv_status(tc.admin, &st) == 0) {
			const shardkv_node *n = kv_tc_node(st, tc.srv[i].id);
			have = n ? n->keys : 0;
			shardkv_config_free(st);
		}
		if (have >= keys)
			return true;
		kv_test_sleep_ms(50);
	}
	return false;
}

static void
a_cancelled_move_leaves_the_range_and_its_data_on_the_source(void **state)
{
	char msg[512];
	unsigned counts[NCOUNT];
	shardkv_admin_result cr;
	shardkv_config *cfg;
	(void)state;

	uint64_t id = start_slow_move("cx/", "cx0");
	/* The destination holds part of the range (its heartbeat says so), so
	 * that dropping it below is observable. */
	KV_TC_ASSERT(&tc, wait_node_keys_at_least(1, 1000, KV_TC_READY_MS),
	             "the destination never reported received keys");
	shardkv_config *before = kv_tc_config(&tc);
	assert_non_null(before);

	KV_TC_EXPECT(&tc, 0, shardkv_cancel(tc.admin, id, &cr));
	KV_TC_ASSERT(&tc, cr.epoch > before->epoch,
	             "the cancel published epoch %" PRIu64 ", not after %" PRIu64, cr.epoch,
	             before->epoch);
	shardkv_config_free(before);

	/* The configuration gives every key back to server 0 ... */
	cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	kv_tc_count_owners(cfg, "cx/", N, counts, NCOUNT);
	KV_TC_ASSERT(&tc, counts[tc.srv[0].id] == N,
	             "after the cancel node %u owns %u of %u keys (node %u: %u)", tc.srv[0].id,
	             counts[tc.srv[0].id], N, tc.srv[1].id, counts[tc.srv[1].id]);
	assert_int_equal(cfg->nmigrations, 0);
	shardkv_config_free(cfg);
	/* ... and the status lists no migration. */
	shardkv_config *st = NULL;
	KV_TC_EXPECT(&tc, 0, shardkv_status(tc.admin, &st));
	KV_TC_ASSERT(&tc, st->nmigrations == 0, "status lists %zu migrations after the cancel",
	             st->nmigrations);
	shardkv_config_free(st);

	/* Every key reads back with its value, and the range takes writes. */
	long bad = kv_tc_verify(tc.admin, "cx/", N, 1, VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld keys wrong after the cancel: %s", bad, msg);
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(tc.admin, "cx/w", NWRITES, 2, 100, msg, sizeof(msg)));
	bad = kv_tc_verify(tc.admin, "cx/w", NWRITES, 2, 100, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld keys written after the cancel are wrong: %s", bad, msg);

	/* The destination dropped what it had received: its heartbeats come
	 * down to no keys, the source's to all of them. */
	memset(counts, 0, sizeof(counts));
	counts[tc.srv[0].id] = N + NWRITES;
	KV_TC_ASSERT(&tc, kv_tc_wait_status_counts(&tc, counts, NCOUNT, KV_TC_READY_MS) == 0,
	             "the destination kept keys of the cancelled migration");

	/* The migration is over: a second cancel finds nothing. */
	KV_TC_EXPECT(&tc, SHARDKV_ENOTFOUND, shardkv_cancel(tc.admin, id, NULL));
	KV_TC_ASSERT(&tc, strstr(shardkv_errmsg(), "not in flight") != NULL, "second cancel: '%s'",
	             shardkv_errmsg());
	/* The range can still move afterwards (nothing was left half-done). */
	char n2[16];
	kv_tc_node_arg(&tc, 1, n2, sizeof(n2));
	KV_TC_EXPECT(&tc, 0, shardkv_move(tc.admin, "cx/", 3, "cx0", 3, n2, 0, SHARDKV_WAIT, NULL));
	bad = kv_tc_verify(tc.admin, "cx/", N, 1, VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld keys wrong after moving the range again: %s", bad, msg);
}

static void
cancelling_an_unknown_migration_is_not_found(void **state)
{
	shardkv_config *before = kv_tc_config(&tc), *after;
	(void)state;

	assert_non_null(before);
	KV_TC_EXPECT(&tc, SHARDKV_ENOTFOUND, shardkv_cancel(tc.admin, 987654321, NULL));
	KV_TC_EXPECT(&tc, SHARDKV_EINVAL, shardkv_cancel(tc.admin, 0, NULL));
	after = kv_tc_config(&tc);
	assert_non_null(after);
	/* A refused cancel changes nothing. */
	assert_int_equal(after->epoch, before->epoch);
	shardkv_config_free(before);
	shardkv_config_free(after);
}

/* Runs `shardkv -c CONTROLLER ARGS...` (NULL-terminated) and captures it. */
static void
run_cli(kv_tc_run_result *r, const char *arg, ...)
{
	va_list ap;

	va_start(ap, arg);
	int rv = kv_tc_cliv(r, tc.ctl_url, NULL, NULL, 0, 30000, arg, ap);
	va_end(ap);
	assert_int_equal(rv, 0);
}

/* Fails with the output unless the run exited with `code` and its stdout
 * (or stderr when `on_err`) contains `needle` (NULL: anything). */
static void
check_cli(kv_tc_run_result *r, const char *what, int code, bool on_err, const char *needle)
{
	const char *text = on_err ? r->err : r->out;
	if (r->code != code || (needle && strstr(text, needle) == NULL)) {
		kv_tc_dump_logs(&tc, 20);
		fail_msg("shardkv %s: exit %d (want %d), stdout '%s', stderr '%s' (want '%s')",
		         what, r->code, code, r->out, r->err, needle ? needle : "*");
	}
	kv_tc_run_free(r);
}

static void
the_cli_lists_migration_ids_and_cancels_them(void **state)
{
	kv_tc_run_result r;
	char id[24], hash[64], json[96];
	(void)state;

	uint64_t mid = start_slow_move("cy/", "cy0");
	snprintf(id, sizeof(id), "%" PRIu64, mid);

	/* The status names the migration by id, with its progress and rate. */
	KV_TC_ASSERT(&tc, kv_tc_wait_migration(&tc, mid, "copying", 1, KV_TC_READY_MS, NULL) == 0,
	             "migration %s is not copying", id);
	run_cli(&r, "status", NULL);
	snprintf(hash, sizeof(hash), "  #%s [\"cy/\", \"cy0\") ", id);
	if (r.code != 0 || strstr(r.out, hash) == NULL || strstr(r.out, " copying keys=") == NULL ||
	    strstr(r.out, " rate=") == NULL || strstr(r.out, " eta=") == NULL) {
		kv_tc_dump_logs(&tc, 20);
		fail_msg("status lacks '%s', the phase, rate or eta: '%s'", hash, r.out);
	}
	kv_tc_run_free(&r);
	run_cli(&r, "--json", "status", NULL);
	snprintf(json, sizeof(json), "{\"id\": %s, \"start\": \"cy/\"", id);
	if (r.code != 0 || strstr(r.out, json) == NULL ||
	    strstr(r.out, "\"rate_bytes_s\": ") == NULL) {
		kv_tc_dump_logs(&tc, 20);
		fail_msg("status --json lacks '%s' or rate_bytes_s: '%s'", json, r.out);
	}
	kv_tc_run_free(&r);

	/* Cancel with --json: one object that starts with the epoch. */
	run_cli(&r, "--json", "cancel", id, NULL);
	snprintf(json, sizeof(json), "\"command\": \"cancel\", \"migration\": %s}\n", id);
	check_cli(&r, "--json cancel", 0, false, json);
	run_cli(&r, "--json", "cancel", id, NULL);
	check_cli(&r, "cancel (again)", 1, true, "not in flight");
	run_cli(&r, "cancel", "987654321", NULL);
	check_cli(&r, "cancel 987654321", 1, true, "shardkv: cancel: migration 987654321");
	run_cli(&r, "cancel", "x1", NULL);
	check_cli(&r, "cancel x1", 2, true, "MIGRATION_ID");
	run_cli(&r, "status", NULL);
	check_cli(&r, "status", 0, false, "migrations: none\n");

	/* The human form, on another slow move. */
	mid = start_slow_move("cz/", "cz0");
	snprintf(id, sizeof(id), "%" PRIu64, mid);
	run_cli(&r, "cancel", id, NULL);
	char want[64];
	snprintf(want, sizeof(want), "cancelled migration %s in epoch ", id);
	check_cli(&r, "cancel", 0, false, want);
	char msg[512];
	long bad = kv_tc_verify(tc.admin, "cz/", N, 1, VLEN, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "%ld keys wrong after the CLI cancel: %s", bad, msg);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(a_cancelled_move_leaves_the_range_and_its_data_on_the_source),
	    cmocka_unit_test(cancelling_an_unknown_migration_is_not_found),
	    cmocka_unit_test(the_cli_lists_migration_ids_and_cancels_them),
	};
	return cmocka_run_group_tests(tests, setup2, teardown);
}
