/*
 * test_durable_side.c - the side logs of incoming range transfers
 * (shardserver/durable/durable.h, doc/durability.md "Migrations"): an
 * adopted side log is replayed where its ADOPT record is, before the writes
 * that follow it; a snapshot past the ADOPT removes it; a side log that was
 * never adopted is never replayed and does not outlive its handle or a
 * restart; an ADOPT whose side log is gone stops recovery and names it; an
 * ADOPT record is refused from anywhere but the server's own log.
 */
#include "common/bytes.h"
#include "common/err.h"
#include "shardserver/dedup/dedup.h"
#include "shardserver/durable/durable.h"
#include "shardserver/durable/wal.h"
#include "shardserver/store/store.h"
#include "tests/support/testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

typedef struct {
	kv_store *store;
	kv_dedup *dedup;
	kv_dur *dur;
} node;

static int
node_try_open(node *n, const char *dir, kv_fsync_mode mode, char *err, size_t errlen)
{
	kv_dur_opts o = {.dir = dir, .mode = mode};
	kv_dur_report rep;

	memset(n, 0, sizeof(*n));
	assert_int_equal(kv_store_create(NULL, &n->store), KV_OK);
	assert_non_null(n->dedup = kv_dedup_create(0, 0, 0));
	o.store = n->store;
	o.dedup = n->dedup;
	int rv = kv_dur_open(&o, &n->dur, &rep, err, errlen);
	if (rv != KV_OK) {
		kv_dedup_destroy(n->dedup);
		kv_store_destroy(n->store);
	}
	return rv;
}

static void
node_open(node *n, const char *dir)
{
	char err[700] = "";
	if (node_try_open(n, dir, KV_FSYNC_BATCH, err, sizeof(err)) != KV_OK)
		fail_msg("open: %s", err);
}

static void
node_close(node *n)
{
	kv_dur_close(n->dur);
	kv_dedup_destroy(n->dedup);
	kv_store_destroy(n->store);
}

/* A client write: applied, then logged in the server's log. */
static void
put_main(node *n, const char *k, const char *v)
{
	assert_int_equal(kv_store_put(n->store, k, strlen(k), v, strlen(v)), KV_OK);
	kv_dur_begin(n->dur);
	assert_int_equal(kv_dur_log_put(n->dur, k, strlen(k), v, strlen(v), NULL, NULL, NULL),
	                 KV_OK);
	kv_dur_end(n->dur);
}

/* What a transfer receives: applied, then logged in the side log. */
static void
put_side(node *n, kv_dur_side *s, const char *k, const char *v)
{
	assert_int_equal(kv_store_put(n->store, k, strlen(k), v, strlen(v)), KV_OK);
	assert_int_equal(kv_dur_side_put_x(s, k, strlen(k), v, strlen(v), 0), KV_OK);
}

static bool
has(node *n, const char *k, const char *want)
{
	kv_buf v = {0};
	int rv = kv_store_get(n->store, k, strlen(k), &v);
	bool ok = rv == KV_OK && want != NULL && v.len == strlen(want) &&
	          memcmp(v.data, want, v.len) == 0;
	if (rv == KV_ENOTFOUND && want == NULL)
		ok = true;
	kv_buf_fini(&v);
	return ok;
}

/* The side logs in dir (names into out, up to max). */
static size_t
sides(const char *dir, char out[][64], size_t max)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	size_t n = 0;

	assert_non_null(d);
	while ((e = readdir(d)) != NULL)
		if (strncmp(e->d_name, "side-", 5) == 0) {
			if (n < max)
				snprintf(out[n], 64, "%.60s", e->d_name);
			n++;
		}
	closedir(d);
	return n;
}

/* --fsync none: a side log is not synced at its close (the transfer's
 * commit path); the node's clean close syncs the adopted ones with its
 * log, and a reopen replays them. */
static void
a_none_nodes_adopted_side_log_survives_its_clean_close(void **state)
{
	kv_test_dir *d = *state;
	char err[700] = "";
	kv_dur_side *s = NULL;
	node n;

	assert_int_equal(node_try_open(&n, d->path, KV_FSYNC_NONE, err, sizeof(err)), KV_OK);
	put_main(&n, "a", "1");
	assert_int_equal(kv_dur_side_open(n.dur, &s), KV_OK);
	put_side(&n, s, "m1", "x");
	put_side(&n, s, "m2", "y");
	assert_int_equal(kv_dur_side_adopt(s), KV_OK);
	kv_dur_side_close(s);
	put_main(&n, "b", "2");
	node_close(&n);

	assert_int_equal(node_try_open(&n, d->path, KV_FSYNC_NONE, err, sizeof(err)), KV_OK);
	assert_true(has(&n, "a", "1"));
	assert_true(has(&n, "m1", "x"));
	assert_true(has(&n, "m2", "y"));
	assert_true(has(&n, "b", "2"));
	node_close(&n);
}

/* A transfer that logs m1..m3 (m1 deleted again) and an exactly-once entry
 * in a side log and adopts it. */
static void
transfer_in(node *n)
{
	kv_bytes keys[2] = {{(const uint8_t *)"m2", 2}, {(const uint8_t *)"m3", 2}};
	kv_bytes vals[2] = {{(const uint8_t *)"two", 3}, {(const uint8_t *)"three", 5}};
	kv_dur_dedup dd = {.client = 7, .req = 3, .value_len = 5, .time_ms = 1000};
	kv_dedup_result r = {.value_len = 5};
	kv_dur_side *s = NULL;

	assert_int_equal(kv_dur_side_open(n->dur, &s), KV_OK);
	put_side(n, s, "m1", "one");
	assert_int_equal(kv_store_mput(n->store, 2, keys, 2, vals), KV_OK);
	assert_int_equal(kv_dur_side_mput_x(s, 2, keys, vals, 0), KV_OK);
	assert_int_equal(kv_store_del(n->store, "m1", 2, NULL), KV_OK);
	assert_int_equal(kv_dur_side_del(s, "m1", 2), KV_OK);
	assert_int_equal(kv_dedup_insert(n->dedup, 7, 3, &r, "m3", 2, 1000), KV_OK);
	assert_int_equal(kv_dur_side_dedup(s, &dd, 0, "m3", 2), KV_OK);
	assert_int_equal(kv_dur_side_adopt(s), KV_OK);
	/* Nothing is logged in it once adopted. */
	assert_int_equal(kv_dur_side_put_x(s, "late", 4, "x", 1, 0), KV_EINVAL);
	assert_int_equal(kv_dur_side_adopt(s), KV_EINVAL);
	kv_dur_side_close(s);
}

static void
check_transfer(node *n)
{
	kv_dedup_result out;

	assert_true(has(n, "m1", NULL));
	assert_true(has(n, "m3", "three"));
	assert_true(has(n, "late", NULL));
	memset(&out, 0, sizeof(out));
	/* The retry of the transfer's remembered write is answered from memory. */
	assert_int_equal(kv_dedup_begin(n->dedup, 7, 3, true, 2000, &out), 0);
	assert_int_equal(out.value_len, 5);
	kv_buf_fini(&out.value);
}

static void
an_adopted_side_log_is_replayed_where_it_was_adopted(void **state)
{
	const kv_test_dir *d = *state;
	char names[4][64];
	node n;

	node_open(&n, d->path);
	put_main(&n, "a", "before");
	transfer_in(&n);
	/* A client write after the commit overwrites what the copy brought. */
	put_main(&n, "m2", "newer");
	node_close(&n);
	assert_int_equal(sides(d->path, names, 4), 1);

	node_open(&n, d->path);
	assert_true(has(&n, "a", "before"));
	assert_true(has(&n, "m2", "newer"));
	check_transfer(&n);
	assert_int_equal(sides(d->path, names, 4), 1);
	/* A snapshot past the ADOPT holds the range: the side log goes. */
	assert_int_equal(kv_dur_snapshot(n.dur), KV_OK);
	assert_int_equal(sides(d->path, names, 4), 0);
	node_close(&n);

	node_open(&n, d->path);
	assert_true(has(&n, "m2", "newer"));
	check_transfer(&n);
	node_close(&n);
}

static void
a_side_log_never_adopted_is_not_replayed_and_goes(void **state)
{
	const kv_test_dir *d = *state;
	char names[4][64];
	kv_dur_side *s = NULL;
	node n;

	node_open(&n, d->path);
	assert_int_equal(kv_dur_side_open(n.dur, &s), KV_OK);
	put_side(&n, s, "x", "copied");
	assert_int_equal(sides(d->path, names, 4), 1);
	kv_dur_side_close(s); /* an abandoned transfer */
	assert_int_equal(sides(d->path, names, 4), 0);
	node_close(&n);

	/* A leftover of a process that stopped mid-transfer: another side log
	 * with records, never adopted, is removed at the next start and not
	 * replayed. */
	node_open(&n, d->path);
	assert_int_equal(kv_dur_side_open(n.dur, &s), KV_OK);
	put_side(&n, s, "y", "copied");
	assert_int_equal(kv_dur_side_adopt(s), KV_OK);
	kv_dur_side_close(s);
	node_close(&n);
	assert_int_equal(sides(d->path, names, 4), 1);
	char from[512], to[512];
	snprintf(from, sizeof(from), "%s/%s", d->path, names[0]);
	snprintf(to, sizeof(to), "%s/side-00000000000000ff", d->path);
	/* Make the adopted one look like the leftover: the log names it, the
	 * copy under another name is not named by anything. */
	char cmd[1200];
	snprintf(cmd, sizeof(cmd), "cp -r '%s' '%s'", from, to);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(sides(d->path, names, 4), 2);

	node_open(&n, d->path);
	assert_true(has(&n, "x", NULL));
	assert_true(has(&n, "y", "copied"));
	assert_int_equal(sides(d->path, names, 4), 1);
	assert_string_not_equal(names[0], "side-00000000000000ff");
	/* New side logs are numbered after every name seen. */
	assert_int_equal(kv_dur_side_open(n.dur, &s), KV_OK);
	assert_int_equal(sides(d->path, names, 4), 2);
	bool newer = strcmp(names[0], "side-00000000000000ff") > 0 ||
	             strcmp(names[1], "side-00000000000000ff") > 0;
	assert_true(newer);
	kv_dur_side_close(s);
	node_close(&n);
}

static void
an_adopt_whose_side_log_is_gone_stops_recovery_naming_it(void **state)
{
	const kv_test_dir *d = *state;
	char names[4][64], path[512], err[700] = "";
	node n;

	node_open(&n, d->path);
	transfer_in(&n);
	node_close(&n);
	assert_int_equal(sides(d->path, names, 4), 1);
	snprintf(path, sizeof(path), "%s/%s", d->path, names[0]);
	kv_test_rmtree(path);
	assert_int_equal(node_try_open(&n, d->path, KV_FSYNC_BATCH, err, sizeof(err)), KV_ECORRUPT);
	print_message("%s\n", err);
	assert_non_null(strstr(err, names[0]));
	assert_non_null(strstr(err, "missing"));
}

static void
an_adopt_record_from_a_peer_is_refused(void **state)
{
	const char *name = "side-0000000000000001";
	uint8_t p[64] = {7, 0};
	kv_store *st = NULL;
	kv_dedup *dd = kv_dedup_create(0, 0, 0);
	size_t n = 6 + strlen(name);

	(void)state;
	kv_put32(p + 2, (uint32_t)strlen(name));
	memcpy(p + 6, name, strlen(name));
	assert_non_null(dd);
	assert_int_equal(kv_store_create(NULL, &st), KV_OK);
	assert_int_equal(kv_dur_replay_record_for_test(st, dd, p, n), KV_ECORRUPT);
	kv_store_destroy(st);
	kv_dedup_destroy(dd);
}

static void
an_adopt_record_inside_a_side_log_is_corruption(void **state)
{
	const kv_test_dir *d = *state;
	char names[4][64], path[512], err[700] = "", werr[300] = "";
	uint8_t p[64] = {7, 0};
	kv_dur_side *s = NULL;
	kv_wal_report rep;
	kv_wal *w = NULL;
	uint64_t lsn = 0;
	node n;

	node_open(&n, d->path);
	assert_int_equal(kv_dur_side_open(n.dur, &s), KV_OK);
	put_side(&n, s, "k", "v");
	assert_int_equal(kv_dur_side_adopt(s), KV_OK);
	kv_dur_side_close(s);
	node_close(&n);
	assert_int_equal(sides(d->path, names, 4), 1);
	/* Forge a side log that adopts itself. */
	snprintf(path, sizeof(path), "%s/%s", d->path, names[0]);
	assert_int_equal(kv_wal_replay(path, 1, false, NULL, NULL, &rep, werr, sizeof(werr)),
	                 KV_OK);
	kv_wal_opts wo = {.dir = path, .mode = KV_FSYNC_NONE};
	assert_int_equal(kv_wal_open(&wo, rep.next_lsn, &w, werr, sizeof(werr)), KV_OK);
	kv_put32(p + 2, (uint32_t)strlen(names[0]));
	memcpy(p + 6, names[0], strlen(names[0]));
	struct iovec iov = {p, 6 + strlen(names[0])};
	assert_int_equal(kv_wal_appendv(w, &iov, 1, &lsn), KV_OK);
	kv_wal_close(w);
	assert_int_equal(node_try_open(&n, d->path, KV_FSYNC_NONE, err, sizeof(err)), KV_ECORRUPT);
	print_message("%s\n", err);
	assert_non_null(strstr(err, names[0]));
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(an_adopted_side_log_is_replayed_where_it_was_adopted,
	                                    kv_test_dir_setup, kv_test_dir_teardown),
	    cmocka_unit_test_setup_teardown(a_side_log_never_adopted_is_not_replayed_and_goes,
	                                    kv_test_dir_setup, kv_test_dir_teardown),
	    cmocka_unit_test_setup_teardown(
	        an_adopt_whose_side_log_is_gone_stops_recovery_naming_it, kv_test_dir_setup,
	        kv_test_dir_teardown),
	    cmocka_unit_test_setup_teardown(a_none_nodes_adopted_side_log_survives_its_clean_close,
	                                    kv_test_dir_setup, kv_test_dir_teardown),
	    cmocka_unit_test(an_adopt_record_from_a_peer_is_refused),
	    cmocka_unit_test_setup_teardown(an_adopt_record_inside_a_side_log_is_corruption,
	                                    kv_test_dir_setup, kv_test_dir_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
