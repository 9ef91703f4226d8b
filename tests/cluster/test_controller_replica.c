/*
 * test_controller_replica.c - the replicated controller's start-up: the raft
 * address derived from a peer URL, flags that cannot work refused with a
 * reason (exit 2 for usage, 1 for a start-up failure), and a one-replica
 * Raft group that starts, stops cleanly and starts again from its raft data
 * in DATA_DIR/raft.
 */
#include "common/err.h"
#include "controller/controller.h"
#include "tests/support/testutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

static void
raft_address_is_the_peer_port_plus_1000(void **state)
{
	char out[64];
	(void)state;

	assert_int_equal(kv_controller_raft_addr("tcp://127.0.0.1:7000", out, sizeof(out)), 0);
	assert_string_equal(out, "127.0.0.1:8000");
	assert_int_equal(kv_controller_raft_addr("tcp://ctl-1.example:64535", out, sizeof(out)), 0);
	assert_string_equal(out, "ctl-1.example:65535");
	/* A TLS listener: raft's own transport is plain TCP on port + 1000. */
	assert_int_equal(kv_controller_raft_addr("tls+tcp://10.0.0.1:7000", out, sizeof(out)), 0);
	assert_string_equal(out, "10.0.0.1:8000");
}

static void
raft_address_of_a_bad_peer_is_refused(void **state)
{
	static const char *const bad[] = {
	    "ipc:///tmp/x",          "tcp://127.0.0.1",
	    "tcp://127.0.0.1:",      "tcp://:7000",
	    "tcp://127.0.0.1:64536", "tcp://127.0.0.1:0",
	    "tcp://127.0.0.1:70x",   "tcp://127.0.0.1:7000/path",
	    "tcp://127.0.0.1:-5",    "",
	    "tls+tcp://127.0.0.1",   "tls://127.0.0.1:7000",
	};
	char out[64];
	(void)state;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(kv_controller_raft_addr(bad[i], out, sizeof(out)), KV_EINVAL);
	assert_int_equal(kv_controller_raft_addr("tcp://127.0.0.1:7000", out, 8), KV_EINVAL);
}

/* Runs the controller binary with `args` (a shell word list) and returns its
 * exit code; its stderr goes to `errf`. */
static int
run_ctl(const char *args, const char *errf)
{
	char cmd[2048];
	int st;

	snprintf(cmd, sizeof(cmd), "timeout 10 %s %s >/dev/null 2>%s", KV_CONTROLLER_BIN, args,
	         errf);
	st = system(cmd);
	return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool
file_has(const char *path, const char *needle)
{
	char buf[4096] = "";
	FILE *f = fopen(path, "r");
	size_t n;

	if (f == NULL)
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	return strstr(buf, needle) != NULL;
}

static void
replicated_flags_that_cannot_work_are_refused_with_a_reason(void **state)
{
	kv_test_dir *d = *state;
	char errf[300], args[1024];

	snprintf(errf, sizeof(errf), "%s/err", d->path);
	snprintf(args, sizeof(args),
	         "--id 4 --peers tcp://127.0.0.1:1,tcp://127.0.0.1:2,tcp://127.0.0.1:3 "
	         "--listen tcp://127.0.0.1:1 --data-dir %s/a",
	         d->path);
	assert_int_equal(run_ctl(args, errf), 2);
	assert_true(file_has(errf, "--id is larger than the number of --peers"));
	snprintf(args, sizeof(args), "--id 1 --listen tcp://127.0.0.1:1 --data-dir %s/a", d->path);
	assert_int_equal(run_ctl(args, errf), 2);
	assert_true(file_has(errf, "--id and --peers go together"));
	snprintf(args, sizeof(args),
	         "--id 1 --peers tcp://127.0.0.1:1,,tcp://127.0.0.1:3 --listen tcp://127.0.0.1:1 "
	         "--data-dir %s/a",
	         d->path);
	assert_int_equal(run_ctl(args, errf), 2);
	assert_true(file_has(errf, "tcp://127.0.0.1:1,,tcp://127.0.0.1:3"));
	snprintf(args, sizeof(args),
	         "--id 1 --peers tcp://127.0.0.1:1,tcp://127.0.0.1:2 --raft-peers 127.0.0.1:5 "
	         "--listen tcp://127.0.0.1:1 --data-dir %s/a",
	         d->path);
	assert_int_equal(run_ctl(args, errf), 2);
	assert_true(file_has(errf, "--raft-peers must list as many"));
	/* Parses, but cannot start: exit 1 and why. */
	snprintf(args, sizeof(args),
	         "--id 1 --peers tcp://127.0.0.1:65000 --listen tcp://127.0.0.1:65000 "
	         "--data-dir %s/a",
	         d->path);
	assert_int_equal(run_ctl(args, errf), 1);
	assert_true(file_has(errf, "cannot derive a raft address"));
}

static void
one_replica_group_starts_stops_and_restarts_from_its_raft_data(void **state)
{
	kv_test_dir *d = *state;
	char url[64], raft[64], dir[300], err[256] = "";
	const char *peers[1], *rpeers[1];
	kv_controller *c = NULL;
	kv_controller_cfg cfg = {0};

	kv_test_free_url(url, sizeof(url));
	snprintf(raft, sizeof(raft), "127.0.0.1:%d", kv_test_free_port());
	snprintf(dir, sizeof(dir), "%s/ctl", d->path);
	peers[0] = url;
	rpeers[0] = raft;
	cfg.listen = url;
	cfg.data_dir = dir;
	cfg.id = 1;
	cfg.npeers = 1;
	cfg.peers = peers;
	cfg.raft_peers = rpeers;
	for (int round = 0; round < 2; round++) {
		assert_int_equal(kv_controller_create(&cfg, &c, err, sizeof(err)), 0);
		assert_int_equal(kv_controller_start(c, err, sizeof(err)), 0);
		assert_int_equal(kv_controller_epoch(c), 0);
		kv_controller_stop(c);
		kv_controller_destroy(c);
		c = NULL;
	}
	/* Its raft data is where the README says. */
	snprintf(dir, sizeof(dir), "%s/ctl/raft/metadata1", d->path);
	FILE *f = fopen(dir, "r");
	assert_non_null(f);
	fclose(f);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(raft_address_is_the_peer_port_plus_1000),
	    cmocka_unit_test(raft_address_of_a_bad_peer_is_refused),
	    cmocka_unit_test_setup_teardown(
	        replicated_flags_that_cannot_work_are_refused_with_a_reason, kv_test_dir_setup,
	        kv_test_dir_teardown),
	    cmocka_unit_test_setup_teardown(
	        one_replica_group_starts_stops_and_restarts_from_its_raft_data, kv_test_dir_setup,
	        kv_test_dir_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
