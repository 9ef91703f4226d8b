/*
 * test_durability_diskfull.c - a shard server whose data dir fills up, with
 * real daemons: writes are refused with a clear error (libshardkv's
 * SHARDKV_ENOSPC or SHARDKV_EIO, the `shardkv` command exits non-zero with
 * the server's explanation), reads keep working, nothing acknowledged is
 * lost; once space returns writes are accepted again within a deadline; and
 * after a kill -9 and a restart every acknowledged write is there.
 *
 * The data dir is a tmpfs of 8 MiB that the test mounts (as root) in a mount
 * namespace of its own, so that the mount disappears with the process
 * whatever happens; the teardown unmounts it on every path. Without root (or
 * with KV_TEST_NO_MOUNT=1) the server's file size is limited instead, with
 * prlimit(2) RLIMIT_FSIZE on its pid; the server must then survive the
 * SIGXFSZ that the kernel sends. When neither works the test is skipped.
 */
#define _GNU_SOURCE /* unshare, CLONE_NEWNS */

#include "common/proc.h"
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#ifndef KV_CLI_BIN
#error "KV_CLI_BIN must name the shardkv binary"
#endif

#define FS_SIZE     "size=8m"
#define FREE_LEFT   (512u * 1024u)    /* bytes left free next to the filler */
#define NBASE       200u              /* keys written before the disk fills */
#define NAFTER      200u              /* keys written after space returns */
#define NKEYS       6000u             /* key slots */
#define VLEN        4000u             /* value bytes */
#define RECOVER_MS  20000u            /* writes accepted again after space returns */
#define WAL_MESSAGE "write-ahead log" /* every refusal names the log */
#define REFUSED_MSG "the write-ahead log cannot be written" /* refused before applying */
#define MAYBE_MSG   "may or may not survive"                /* applied, not on disk */

static kv_tc tc;
static char mnt[400];      /* the server's data dir */
static char filler[480];   /* the filler file (tmpfs mode) */
static bool mounted;       /* mnt is a tmpfs we mounted */
static bool use_rlimit;    /* no mount: RLIMIT_FSIZE on the server */
static bool own_namespace; /* mounts are private to this process */

/* Per key: 0 never written, 1 tried and refused (or unknown), 2 acknowledged. */
static unsigned char state[NKEYS];

static size_t
fkey(char *buf, size_t len, unsigned i)
{
	return kv_tc_key(buf, len, "f/", i);
}

static size_t
fvalue(char *buf, size_t len, unsigned i)
{
	return kv_tc_value(buf, len, 1, i, VLEN);
}

/* Puts key i; records the outcome. Returns the libshardkv code. */
static int
put_key(shardkv_client *cl, unsigned i)
{
	char k[32], v[VLEN + 64];
	size_t kl = fkey(k, sizeof(k), i), vl = fvalue(v, sizeof(v), i);
	int rv;

	if (state[i] != 2)
		state[i] = 1;
	rv = shardkv_put(cl, k, kl, v, vl);
	if (rv == 0)
		state[i] = 2;
	return rv;
}

/* Fails unless every acknowledged key reads back exactly and every refused
 * one is either absent or exact. Returns how many were checked. */
static unsigned
check_keys(shardkv_client *cl, const char *when)
{
	char k[32], want[VLEN + 64];
	unsigned checked = 0;

	for (unsigned i = 0; i < NKEYS; i++) {
		shardkv_buf v = {0};
		if (state[i] == 0)
			continue;
		size_t kl = fkey(k, sizeof(k), i), wl = fvalue(want, sizeof(want), i);
		int rv = shardkv_get(cl, k, kl, &v);
		if (rv == SHARDKV_ENOTFOUND && state[i] == 1)
			continue;
		KV_TC_ASSERT(&tc, rv == 0, "%s: get %s (%s): %s (%s)", when, k,
		             state[i] == 2 ? "acknowledged" : "refused", shardkv_strerror(rv),
		             shardkv_errmsg());
		KV_TC_ASSERT(&tc, v.len == wl && memcmp(v.data, want, wl) == 0,
		             "%s: %s holds %zu bytes '%.30s', want '%.30s'", when, k, v.len,
		             (char *)v.data, want);
		shardkv_free(v.data);
		checked++;
	}
	return checked;
}

/* Fails when the server process has died. */
static void
check_server_alive(const char *when)
{
	int st = 0;

	if (tc.srv[0].pid > 0 && kv_proc_exited(tc.srv[0].pid, &st)) {
		tc.srv[0].pid = 0;
		kv_tc_dump_logs(&tc, 40);
		if (WIFSIGNALED(st) && WTERMSIG(st) == SIGXFSZ)
			fail_msg("%s: the server died of SIGXFSZ at its file size limit (it should "
			         "ignore SIGXFSZ and report an I/O error)",
			         when);
		fail_msg("%s: the server died (status 0x%x)", when, st);
	}
}

/* Sets the server's soft RLIMIT_FSIZE (RLIM_INFINITY: none). */
static int
limit_server_files(rlim_t soft)
{
	struct rlimit rl = {.rlim_cur = soft, .rlim_max = RLIM_INFINITY};
	return prlimit(tc.srv[0].pid, RLIMIT_FSIZE, &rl, NULL);
}

/* The size of the largest wal segment of the data dir. */
static off_t
largest_segment(void)
{
	DIR *d = opendir(mnt);
	struct dirent *e;
	off_t best = 0;

	assert_non_null(d);
	while ((e = readdir(d)) != NULL) {
		struct stat st;
		char p[700];
		if (strncmp(e->d_name, "wal-", 4) != 0)
			continue;
		snprintf(p, sizeof(p), "%s/%s", mnt, e->d_name);
		if (stat(p, &st) == 0 && st.st_size > best)
			best = st.st_size;
	}
	closedir(d);
	return best;
}

/* Takes all but FREE_LEFT bytes of the file system (or of the file size
 * limit). */
static void
fill_disk(void)
{
	if (use_rlimit) {
		rlim_t lim = (rlim_t)largest_segment() + FREE_LEFT;
		KV_TC_ASSERT(&tc, limit_server_files(lim) == 0, "prlimit: %s", strerror(errno));
		return;
	}
	struct statvfs sv;
	assert_int_equal(statvfs(mnt, &sv), 0);
	uint64_t avail = (uint64_t)sv.f_bavail * sv.f_frsize;
	KV_TC_ASSERT(&tc, avail > FREE_LEFT, "only %" PRIu64 " bytes free on %s", avail, mnt);
	uint64_t left = avail - FREE_LEFT;
	int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	static char chunk[1 << 16];
	memset(chunk, 0x55, sizeof(chunk));
	while (left > 0) {
		size_t n = left < sizeof(chunk) ? (size_t)left : sizeof(chunk);
		ssize_t w = write(fd, chunk, n);
		KV_TC_ASSERT(&tc, w > 0, "writing the filler: %s", strerror(errno));
		left -= (uint64_t)w;
	}
	close(fd);
}

static void
free_disk(void)
{
	if (use_rlimit)
		KV_TC_ASSERT(&tc, limit_server_files(RLIM_INFINITY) == 0, "prlimit: %s",
		             strerror(errno));
	else
		assert_int_equal(unlink(filler), 0);
}

/* ---------------------------------------------------------------------------
 * Setup: the mount (or the limit), then the cluster
 * ------------------------------------------------------------------------- */

static void
unmount_data_dir(void)
{
	if (!mounted)
		return;
	if (umount2(mnt, 0) != 0 && umount2(mnt, MNT_DETACH) != 0)
		fprintf(stderr, "cannot unmount %s: %s\n", mnt, strerror(errno));
	mounted = false;
}

static int
teardown(void **state_)
{
	(void)state_;
	/* The server holds files on the mount: stop it first. */
	for (int i = 0; i < tc.nservers; i++)
		if (tc.srv[i].pid > 0)
			kv_tc_stop_server(&tc, i, SIGKILL, KV_TC_STOP_MS, NULL);
	unmount_data_dir();
	kv_tc_destroy(&tc);
	return 0;
}

static int
setup(void **state_)
{
	(void)state_;
	memset(state, 0, sizeof(state));
	use_rlimit = mounted = false;
	if (kv_tc_create(&tc, "dur-diskfull") != 0)
		return -1;
	/* kv_tc_add_server gives server 0 the data dir DIR/s1: mount it first. */
	snprintf(mnt, sizeof(mnt), "%s/s1", tc.dir);
	snprintf(filler, sizeof(filler), "%s/filler", mnt);
	if (mkdir(mnt, 0755) != 0) {
		fprintf(stderr, "mkdir %s: %s\n", mnt, strerror(errno));
		kv_tc_destroy(&tc);
		return -1;
	}
	if (getenv("KV_TEST_NO_MOUNT") == NULL && mount("tmpfs", mnt, "tmpfs", 0, FS_SIZE) == 0) {
		mounted = true;
		printf("    data dir on a tmpfs of %s%s\n", &FS_SIZE[5],
		       own_namespace ? " (private mount namespace)" : "");
	} else {
		use_rlimit = true;
		printf("    no tmpfs (%s): RLIMIT_FSIZE on the server instead\n",
		       getenv("KV_TEST_NO_MOUNT") ? "KV_TEST_NO_MOUNT" : strerror(errno));
	}
	int i = kv_tc_add_server(&tc, true);
	if (i != 0 || strcmp(tc.srv[0].data, mnt) != 0 ||
	    kv_tc_wait_node_state(&tc, 0, SHARDKV_NODE_ACTIVE, KV_TC_READY_MS) != 0 ||
	    kv_tc_wait_serving(&tc, 0, KV_TC_READY_MS) != 0) {
		kv_tc_dump_logs(&tc, 30);
		teardown(NULL);
		return -1;
	}
	return 0;
}

/* ---------------------------------------------------------------------------
 * The test
 * ------------------------------------------------------------------------- */

/* Fails unless rv is the disk's refusal with the server's explanation. */
static void
check_refusal(int rv, const char *what)
{
	const char *m = shardkv_errmsg();
	KV_TC_ASSERT(&tc, rv == SHARDKV_ENOSPC || rv == SHARDKV_EIO,
	             "%s on a full disk returned %s (%s), want no-space or I/O error", what,
	             shardkv_strerror(rv), m);
	KV_TC_ASSERT(&tc, strstr(m, WAL_MESSAGE) != NULL,
	             "%s on a full disk: the message '%s' does not name the %s", what, m,
	             WAL_MESSAGE);
}

/*
 * Writes NBASE acknowledged keys, fills the disk, and writes on until the log
 * refuses one. Returns the next unused key.
 */
static unsigned
fill_until_refused(shardkv_client *cl)
{
	unsigned next = 0;
	int rv = 0;

	for (; next < NBASE; next++)
		KV_TC_EXPECT(&tc, 0, put_key(cl, next));
	fill_disk();
	while (next < NKEYS && (rv = put_key(cl, next)) == 0)
		next++;
	KV_TC_ASSERT(&tc, rv != 0, "%u writes of %u bytes fitted on a full disk", next - NBASE,
	             VLEN);
	KV_TC_ASSERT(&tc, rv == SHARDKV_ENOSPC || rv == SHARDKV_EIO,
	             "the write that met the full disk returned %s (%s)", shardkv_strerror(rv),
	             shardkv_errmsg());
	check_server_alive("at the full disk");
	printf("    %u writes fitted after filling the disk; then %s (%s)\n", next - NBASE,
	       shardkv_strerror(rv), shardkv_errmsg());
	return next + 1;
}

/* Waits until a write is accepted again after space returned; returns the
 * next unused key. */
static unsigned
wait_writes_accepted(shardkv_client *cl, unsigned next)
{
	uint64_t t0 = kv_test_now_ms();
	int rv;

	while ((rv = put_key(cl, next)) != 0) {
		KV_TC_ASSERT(&tc, rv == SHARDKV_ENOSPC || rv == SHARDKV_EIO,
		             "a write after space returned: %s (%s)", shardkv_strerror(rv),
		             shardkv_errmsg());
		KV_TC_ASSERT(&tc, kv_test_now_ms() - t0 < RECOVER_MS,
		             "writes are still refused %u ms after space returned: %s", RECOVER_MS,
		             shardkv_errmsg());
		next++;
		kv_test_sleep_ms(50);
	}
	printf("    writes accepted again %llu ms after space returned\n",
	       (unsigned long long)(kv_test_now_ms() - t0));
	return next + 1;
}

/* SIGKILLs the server, restarts it from its data dir and waits. */
static void
kill_and_restart(void)
{
	int st = 0;
	KV_TC_ASSERT(&tc, kv_tc_stop_server(&tc, 0, SIGKILL, KV_TC_STOP_MS, &st) == 0,
	             "the server did not die of SIGKILL");
	KV_TC_ASSERT(&tc, kv_tc_restart_server(&tc, 0, false) == 0, "cannot restart the server");
	KV_TC_ASSERT(&tc, kv_tc_wait_serving(&tc, 0, KV_TC_READY_MS) == 0,
	             "the server does not serve after its restart");
}

static void
a_full_disk_refuses_writes_keeps_reads_and_recovers_when_space_returns(void **state_)
{
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	unsigned next;
	int rv;
	(void)state_;

	if (use_rlimit) {
		struct rlimit rl;
		if (prlimit(tc.srv[0].pid, RLIMIT_FSIZE, NULL, &rl) != 0)
			skip(); /* neither a tmpfs nor a file size limit can be had here */
	}
	assert_non_null(cl);
	next = fill_until_refused(cl);
	/* Every kind of write is refused now, with the explanation. */
	for (int k = 0; k < 5; k++, next++)
		check_refusal(put_key(cl, next), "put");
	check_refusal(shardkv_append(cl, "f/app", 5, "x", 1, NULL), "append");
	check_refusal(shardkv_del(cl, "f/000000", 8, NULL), "del");
	{
		char k0[32], k1[32], v0[VLEN + 64], v1[VLEN + 64];
		shardkv_bytes keys[2] = {{k0, fkey(k0, sizeof(k0), next)},
		                         {k1, fkey(k1, sizeof(k1), next + 1)}};
		shardkv_bytes vals[2] = {{v0, fvalue(v0, sizeof(v0), next)},
		                         {v1, fvalue(v1, sizeof(v1), next + 1)}};
		shardkv_mput_result *mr = NULL;
		state[next] = state[next + 1] = 1;
		rv = shardkv_mput(cl, 2, keys, 2, vals, &mr);
		shardkv_mput_result_free(mr);
		KV_TC_ASSERT(&tc, rv == SHARDKV_ENOSPC || rv == SHARDKV_EIO,
		             "mput on a full disk returned %s (%s)", shardkv_strerror(rv),
		             shardkv_errmsg());
		next += 2;
	}
	/* The command line tool exits non-zero with the server's explanation. */
	{
		char *argv[] = {KV_CLI_BIN, "-c", tc.ctl_url, "put", "f/cli", "value", NULL};
		kv_tc_run_result r;
		assert_int_equal(kv_tc_run(argv, NULL, NULL, 0, 30000, &r), 0);
		if (r.code == 0 || r.code >= 128 || strstr(r.err, WAL_MESSAGE) == NULL) {
			kv_tc_dump_logs(&tc, 20);
			fail_msg("shardkv put on a full disk: exit %d, stderr '%s'", r.code, r.err);
		}
		printf("    shardkv put: exit %d: %s", r.code, r.err);
		kv_tc_run_free(&r);
	}
	/* Reads go on: every acknowledged write reads back. */
	unsigned checked = check_keys(cl, "while the disk is full");
	KV_TC_ASSERT(&tc, checked >= NBASE, "only %u keys checked", checked);
	shardkv_scan_result *sr = NULL;
	KV_TC_EXPECT(&tc, 0, shardkv_keys(cl, "f/", 2, &sr));
	KV_TC_ASSERT(&tc, sr->n >= NBASE, "a scan of a full disk's server found %zu keys", sr->n);
	shardkv_scan_result_free(sr);
	check_server_alive("while the disk is full");

	/* Space returns: writes are accepted again within the deadline (the log
	 * retries by itself). */
	free_disk();
	next = wait_writes_accepted(cl, next);
	for (unsigned k = 0; k < NAFTER; k++, next++)
		KV_TC_EXPECT(&tc, 0, put_key(cl, next));
	KV_TC_EXPECT(&tc, 0, shardkv_append(cl, "f/app", 5, "y", 1, NULL));
	check_keys(cl, "after space returned");

	/* A crash now loses nothing that was acknowledged. */
	kill_and_restart();
	checked = check_keys(cl, "after kill -9 and restart");
	shardkv_buf v = {0};
	KV_TC_EXPECT(&tc, 0, shardkv_get(cl, "f/app", 5, &v));
	/* The refused append never happened; the later one did, once. */
	KV_TC_ASSERT(&tc, v.len == 1 && v.data[0] == 'y', "f/app = '%s', want 'y'", (char *)v.data);
	shardkv_free(v.data);
	printf("    %u keys checked after the restart\n", checked);
	shardkv_close(cl);
}

/*
 * A write refused because the log cannot be written was never applied: the
 * server must say so ("cannot be written ... refused"), not that it "may or
 * may not survive a restart" (that is for a write applied in memory whose
 * record then failed), and the key must indeed never appear.
 */
static void
a_write_refused_by_a_full_disk_is_reported_as_not_applied(void **state_)
{
	shardkv_client *cl = kv_tc_client(&tc, false, 10000);
	unsigned next, refused;
	char m[512];
	(void)state_;

	if (use_rlimit) {
		struct rlimit rl;
		if (prlimit(tc.srv[0].pid, RLIMIT_FSIZE, NULL, &rl) != 0)
			skip();
	}
	assert_non_null(cl);
	next = fill_until_refused(cl);
	refused = next++;
	int rv = put_key(cl, refused);
	snprintf(m, sizeof(m), "%s", shardkv_errmsg());
	check_refusal(rv, "put");
	free_disk();
	next = wait_writes_accepted(cl, next);
	kill_and_restart();
	char k[32];
	shardkv_buf v = {0};
	size_t kl = fkey(k, sizeof(k), refused);
	rv = shardkv_get(cl, k, kl, &v);
	shardkv_free(v.data);
	KV_TC_ASSERT(&tc, rv == SHARDKV_ENOTFOUND, "the refused write of %s was applied (%s)", k,
	             shardkv_strerror(rv));
	KV_TC_ASSERT(&tc, strstr(m, REFUSED_MSG) != NULL && strstr(m, MAYBE_MSG) == NULL,
	             "a write refused before it was applied is reported as '%s', want '%s ...'", m,
	             REFUSED_MSG);
	check_keys(cl, "after the restart");
	shardkv_close(cl);
}

int
main(void)
{
	/* A mount namespace of our own (needs root): the tmpfs mounted in it goes
	 * away with this process and its children, even on SIGKILL. */
	if (getenv("KV_TEST_NO_MOUNT") == NULL && unshare(CLONE_NEWNS) == 0 &&
	    mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0)
		own_namespace = true;
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(
	        a_full_disk_refuses_writes_keeps_reads_and_recovers_when_space_returns, setup,
	        teardown),
	    cmocka_unit_test_setup_teardown(
	        a_write_refused_by_a_full_disk_is_reported_as_not_applied, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
