/*
 * test_netns_faults.c - a cluster spread over network namespaces (one per
 * host: a controller host, three server hosts and a client host, on one
 * bridge; tests/netns_util.h) runs shardkv-checker from the client host
 * while the network misbehaves, in cycles until the checker's load ends:
 *
 *   1. a server host's link goes down for LINK_DOWN_S, then up again;
 *   2. another server host gets netem delay 50 ms and loss 5 % for
 *      IMPAIR_S (loss only, about 3 %, on kernels without sch_netem);
 *   3. two server hosts are partitioned from each other (their packets to
 *      each other vanish: SYNs dropped, not refused), a range of the first
 *      is moved to the second while they cannot talk, and after
 *      PARTITION_S the partition heals.
 *
 * The checker's own reconfigurations (moves, rebalances) run throughout.
 * The test asserts that the checker finds no violation (nothing
 * acknowledged lost or duplicated, reads linearizable), that no daemon
 * died, and that once the network has healed the cluster recovers by itself:
 * every migration finishes, every node is active, and every range serves a
 * write and a read.
 *
 * A second case cuts one server off from the controller only (its clients
 * still reach it) and checks its lease as doc/replication.md describes it:
 * it served before the cut, refuses data requests as unavailable ("lease
 * expired") within LEASE_REFUSE_MS of the cut (the lease is 2 s; the
 * deadline is generous on purpose: the time taken is logged, not asserted
 * tightly), the controller declares it down, and once the link is back it
 * serves again within LEASE_BACK_MS.
 *
 * Two cases run the controller with --replicas 3 (so --min-insync 2) and
 * wait until the test key's range has all three servers in sync:
 *  - its primary is cut off from both backups only: no write begun after
 *    the cut is acknowledged (none can reach a backup), the ISR shrinks
 *    within ISR_SHRINK_MS, and after the heal writes succeed again, every
 *    replica is back in sync and the key holds the last acknowledged write
 *    (or a later attempt's);
 *  - its primary is cut off from the controller only: it stops serving
 *    before a configuration naming another primary can be seen, the new
 *    primary takes writes, and after the heal the old primary is back in
 *    sync and nothing acknowledged is lost.
 *
 * Each case runs in a process of its own
 * (a process enters the client host's namespace once); KV_TEST_FILTER
 * ('pattern*') picks cases.
 *
 * Needs root (network namespaces); skips with the reason otherwise. Run by
 * hand for longer: KV_NETNS_DURATION=300 build/tests/test_netns_faults
 * (seconds of load; default 50), KV_NETNS_SEED=N (checker seed),
 * KV_NETNS_LINK_DOWN_S, KV_NETNS_IMPAIR_S, KV_NETNS_PARTITION_S (fault
 * lengths; default 4, 5, 16), and KV_NETNS_KEEP=1 keeps the logs and data
 * dirs.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include "client/include/shardkv.h"
#include "common/proc.h"
#include "tests/support/netns_util.h"
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <errno.h>
#include <fnmatch.h>
#include <ftw.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#ifndef KV_CONTROLLER_BIN
#error "KV_CONTROLLER_BIN must name the shardkv-controller binary"
#endif
#ifndef KV_SERVER_BIN
#error "KV_SERVER_BIN must name the shardkv-server binary"
#endif
#ifndef KV_CHECKER_BIN
#error "KV_CHECKER_BIN must name the shardkv-checker binary"
#endif

#define SKIP_EXIT         77 /* ctest's SKIP_RETURN_CODE in tests/netns.cmake */
#define NSERVERS          3
#define CTL_PORT          7000
#define SRV_PORT          7100
#define DEFAULT_DURATION  45u    /* seconds of checker load: one fault cycle */
#define DEFAULT_SEED      7777u  /* checker seed */
#define READY_MS          30000u /* a daemon answers / a server is active */
#define LINK_DOWN_S       4u     /* default fault lengths */
#define IMPAIR_S          5u
#define PARTITION_S       16u    /* long enough for SYN retransmission backoff */
#define HEAL_MIGRATION_MS 8000u  /* a migration stalled by a partition ends after the heal */
#define GAP_MS            2000u  /* quiet time after each fault */
#define CHECKER_EXTRA_S   90u    /* settle + final reads + slack after the load */
#define RECOVER_MS        60000u /* after the checker: migrations done, ranges serve */
#define OP_TIMEOUT_MS     3000u  /* the test's own client calls */
#define LEASE_REFUSE_MS   10000u /* cut off from the controller: refuses within this */
#define LEASE_DOWN_MS     15000u /* ... and the controller says down within this */
#define LEASE_BACK_MS     30000u /* healed: serves again within this (TCP backoff included) */
#define LEASE_KEY         "netns-lease/k" /* in a range of its own on s1 */
#define REPL_KEY          "netns-repl/k"  /* the replicated cases' key */
#define REPL_CUT_MS       8000u           /* a replicated case's cut lasts this long */
#define ISR_SHRINK_MS     8000u           /* the primary's ISR shrinks within this of a cut */

static struct {
	kv_nn net;
	bool started;      /* the cluster was built (teardown has work) */
	bool skipped;      /* no namespaces here: exit SKIP_EXIT */
	char dir[256];     /* logs and data dirs */
	char net_log[320]; /* ip and tc output */
	char ctl_log[320]; /* the controller's stderr */
	char srv_log[NSERVERS][320];
	char chk_log[320]; /* the checker's stdout and stderr */
	int hctl, hcli;    /* host indexes */
	int hsrv[NSERVERS];
	char ctl_url[64];
	char srv_url[NSERVERS][64];
	unsigned replicas; /* the controller's --replicas (0: its default, 3) */
	pid_t ctl_pid;
	pid_t srv_pid[NSERVERS];
	uint32_t node[NSERVERS];   /* node ids */
	shardkv_client *admin;     /* the test's client, on the client host */
	unsigned part_moves;       /* moves accepted while their ends were partitioned */
	unsigned part_moves_stuck; /* of those, still in flight when the partition healed */
	bool degraded;             /* no netem here: loss without delay */
	unsigned link_down_ms;     /* fault lengths (KV_NETNS_*_S) */
	unsigned impair_ms;
	unsigned partition_ms;
} g;

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void
note(const char *fmt, ...)
{
	static uint64_t t0;
	va_list ap;
	char buf[512];

	if (t0 == 0)
		t0 = kv_test_now_ms();
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(stderr, "netns: %7.2fs %s\n", (double)(kv_test_now_ms() - t0) / 1000.0, buf);
}

static void
tail_file(const char *path, int lines)
{
	kv_proc_print_log_tail(path, lines);
}

static void
dump_logs(void)
{
	tail_file(g.net_log, 20);
	tail_file(g.ctl_log, 30);
	for (int i = 0; i < NSERVERS; i++)
		tail_file(g.srv_log[i], 30);
	tail_file(g.chk_log, 40);
}

#define NS_ASSERT(cond, ...)                                                                       \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			dump_logs();                                                               \
			fail_msg(__VA_ARGS__);                                                     \
		}                                                                                  \
	} while (0)

static unsigned
env_num(const char *name, unsigned dflt, unsigned lo, unsigned hi)
{
	const char *s = getenv(name);
	char *end;
	unsigned long v;

	if (s == NULL || !*s)
		return dflt;
	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || *end || v < lo || v > hi) {
		fprintf(stderr, "netns: ignoring %s=%s (want %u to %u)\n", name, s, lo, hi);
		return dflt;
	}
	return (unsigned)v;
}

/* Fails the test when a daemon has exited. */
static void
assert_daemons_alive(void)
{
	int st;

	if (g.ctl_pid > 0 && kv_nn_exited(g.ctl_pid, &st)) {
		g.ctl_pid = 0;
		NS_ASSERT(false, "the controller exited (status 0x%x)", st);
	}
	for (int i = 0; i < NSERVERS; i++)
		if (g.srv_pid[i] > 0 && kv_nn_exited(g.srv_pid[i], &st)) {
			g.srv_pid[i] = 0;
			NS_ASSERT(false, "server s%d exited (status 0x%x)", i + 1, st);
		}
}

/* Sleeps ms while watching the daemons (and the checker: returns early,
 * with *chk_status set, when it exits). */
static bool
hold(unsigned ms, pid_t chk, int *chk_status)
{
	uint64_t end = kv_test_now_ms() + ms;

	while (kv_test_now_ms() < end) {
		assert_daemons_alive();
		if (chk > 0 && kv_nn_exited(chk, chk_status))
			return false;
		kv_test_sleep_ms(50);
	}
	return true;
}

/* ---------------------------------------------------------------------------
 * Building the cluster
 * ------------------------------------------------------------------------- */

static pid_t
start_server(int i)
{
	char data[320];
	char *argv[] = {(char *)KV_SERVER_BIN,
	                (char *)"--listen",
	                g.srv_url[i],
	                (char *)"--controller",
	                g.ctl_url,
	                (char *)"--data-dir",
	                data,
	                (char *)"--fsync",
	                (char *)"batch",
	                (char *)"--join",
	                NULL};

	snprintf(data, sizeof(data), "%s/s%d", g.dir, i + 1);
	return kv_nn_spawn(&g.net, g.hsrv[i], argv, g.srv_log[i]);
}

/* Waits until server i is an active node and no migration is in flight;
 * records its node id. */
static int
wait_active(int i, unsigned ms)
{
	uint64_t end = kv_test_now_ms() + ms;

	while (kv_test_now_ms() < end) {
		shardkv_config *cfg = NULL;
		assert_daemons_alive();
		if (shardkv_config_get(g.admin, 0, &cfg) == 0) {
			bool ok = false;
			for (size_t k = 0; k < cfg->nnodes; k++)
				if (cfg->nodes[k].address &&
				    strcmp(cfg->nodes[k].address, g.srv_url[i]) == 0 &&
				    cfg->nodes[k].state == SHARDKV_NODE_ACTIVE) {
					g.node[i] = cfg->nodes[k].id;
					ok = cfg->nmigrations == 0;
				}
			shardkv_config_free(cfg);
			if (ok)
				return 0;
		}
		kv_test_sleep_ms(100);
	}
	return -1;
}

/* Builds the network and the cluster; skips the test when namespaces
 * cannot be made here. */
static void
build_cluster(void)
{
	char why[160], data[320];
	shardkv_options o = {.timeout_ms = OP_TIMEOUT_MS, .no_watch = true};
	char nrep[8];
	char *ctl_argv[] = {(char *)KV_CONTROLLER_BIN, (char *)"--listen", g.ctl_url,
	                    (char *)"--data-dir", data, g.replicas ? (char *)"--replicas" : NULL,
	                    nrep,
	                    /* one copy: the moves need ranges on every node,
	                     * which the joins make only with the balancer off
	                     * (doc/scheduler.md "A new cluster") */
	                    g.replicas == 1 ? (char *)"--auto-balance" : NULL, (char *)"off", NULL};
	uint64_t end;

	if (kv_nn_available(why, sizeof(why)) != 0) {
		print_message("netns: skipped: %s\n", why);
		g.skipped = true;
		skip();
	}
	snprintf(g.dir, sizeof(g.dir), "/tmp/kv_netns_XXXXXX");
	assert_non_null(mkdtemp(g.dir));
	snprintf(g.net_log, sizeof(g.net_log), "%s/net.log", g.dir);
	snprintf(g.ctl_log, sizeof(g.ctl_log), "%s/controller.log", g.dir);
	snprintf(g.chk_log, sizeof(g.chk_log), "%s/checker.log", g.dir);
	g.started = true;
	assert_int_equal(kv_nn_create(&g.net, g.net_log), 0);
	g.hctl = kv_nn_add_host(&g.net, "ctl", 1);
	for (int i = 0; i < NSERVERS; i++) {
		char name[8];
		snprintf(name, sizeof(name), "s%d", i + 1);
		g.hsrv[i] = kv_nn_add_host(&g.net, name, 11 + (unsigned)i);
		NS_ASSERT(g.hsrv[i] >= 0, "cannot add host %s", name);
		snprintf(g.srv_url[i], sizeof(g.srv_url[i]), "tcp://%s:%d",
		         g.net.hosts[g.hsrv[i]].addr, SRV_PORT);
		snprintf(g.srv_log[i], sizeof(g.srv_log[i]), "%s/server-s%d.log", g.dir, i + 1);
	}
	g.hcli = kv_nn_add_host(&g.net, "cli", 100);
	NS_ASSERT(g.hctl >= 0 && g.hcli >= 0, "cannot add the controller and client hosts");
	snprintf(g.ctl_url, sizeof(g.ctl_url), "tcp://%s:%d", g.net.hosts[g.hctl].addr, CTL_PORT);
	note("network %s: controller %s, servers %s %s %s, client %s (logs in %s)", g.net.prefix,
	     g.ctl_url, g.srv_url[0], g.srv_url[1], g.srv_url[2], g.net.hosts[g.hcli].addr, g.dir);

	snprintf(data, sizeof(data), "%s/ctl", g.dir);
	snprintf(nrep, sizeof(nrep), "%u", g.replicas);
	g.ctl_pid = kv_nn_spawn(&g.net, g.hctl, ctl_argv, g.ctl_log);
	NS_ASSERT(g.ctl_pid > 0, "cannot start the controller");
	/* From here on this process is the client host: its own calls and the
	 * checker it starts go over the bridge. No thread exists yet (nng
	 * starts its threads on the first shardkv_open). */
	NS_ASSERT(kv_nn_enter(&g.net, g.hcli) == 0, "cannot enter the client namespace");
	NS_ASSERT(shardkv_open(g.ctl_url, &o, &g.admin) == 0, "shardkv_open failed");
	end = kv_test_now_ms() + READY_MS;
	for (;;) {
		shardkv_config *cfg = NULL;
		assert_daemons_alive();
		if (shardkv_config_get(g.admin, 0, &cfg) == 0) {
			shardkv_config_free(cfg);
			break;
		}
		NS_ASSERT(kv_test_now_ms() < end, "the controller did not answer in %u ms",
		          READY_MS);
		kv_test_sleep_ms(100);
	}
	for (int i = 0; i < NSERVERS; i++) {
		g.srv_pid[i] = start_server(i);
		NS_ASSERT(g.srv_pid[i] > 0, "cannot start server s%d", i + 1);
		NS_ASSERT(wait_active(i, READY_MS) == 0, "server s%d not active in %u ms", i + 1,
		          READY_MS);
		note("server s%d is node %" PRIu32, i + 1, g.node[i]);
	}
}

/* ---------------------------------------------------------------------------
 * Faults
 * ------------------------------------------------------------------------- */

/* Moves a range that node a owns (and that is not moving) to node b.
 * Returns the migration id, or 0 when no move was accepted. */
static uint64_t
move_between(int a, int b)
{
	uint64_t end = kv_test_now_ms() + 3000;
	char to[16];

	snprintf(to, sizeof(to), "%" PRIu32, g.node[b]);
	while (kv_test_now_ms() < end) {
		shardkv_config *cfg = NULL;
		shardkv_admin_result res;
		int rv = -1;

		if (shardkv_config_get(g.admin, 0, &cfg) == 0) {
			for (size_t r = 0; r < cfg->nranges && rv != 0; r++) {
				const shardkv_range *x = &cfg->ranges[r];
				if (x->node != g.node[a])
					continue;
				memset(&res, 0, sizeof(res));
				rv = shardkv_move(g.admin, x->start.data, x->start.len, x->end.data,
				                  x->end.len, to, 0, 0, &res);
			}
			shardkv_config_free(cfg);
		}
		if (rv == 0 && res.nmigrations > 0)
			return res.first_mig_id;
		kv_test_sleep_ms(100);
	}
	return 0;
}

/* Returns true when the status still lists migration id. */
static bool
migration_listed(uint64_t id)
{
	shardkv_config *st = NULL;
	bool found = false;

	if (shardkv_status(g.admin, &st) != 0)
		return false;
	for (size_t m = 0; m < st->nmigrations; m++)
		if (st->migrations[m].id == id)
			found = true;
	shardkv_config_free(st);
	return found;
}

/* One cycle of faults (the fault lengths plus 3 * GAP_MS); k rotates the hosts. Returns false
 * when the checker exited meanwhile (*chk_status set). */
static bool
fault_cycle(unsigned k, pid_t chk, int *chk_status)
{
	int down = (int)(k % NSERVERS), slow = (int)((k + 1) % NSERVERS);
	int pa = (int)((k + 2) % NSERVERS), pb = (int)(k % NSERVERS);
	uint64_t mig, healed;

	note("cycle %u: link of s%d down", k, down + 1);
	NS_ASSERT(kv_nn_link(&g.net, g.hsrv[down], false) == 0, "link down failed");
	if (!hold(g.link_down_ms, chk, chk_status))
		return false;
	NS_ASSERT(kv_nn_link(&g.net, g.hsrv[down], true) == 0, "link up failed");
	note("cycle %u: link of s%d up", k, down + 1);
	if (!hold(GAP_MS, chk, chk_status))
		return false;

	NS_ASSERT(kv_nn_impair(&g.net, g.hsrv[slow], 50, 5, &g.degraded) == 0, "impair failed");
	note("cycle %u: s%d sends with %s", k, slow + 1,
	     g.degraded ? "~3% loss (no sch_netem in this kernel: no delay)"
	                : "netem delay 50ms loss 5%");
	if (!hold(g.impair_ms, chk, chk_status))
		return false;
	NS_ASSERT(kv_nn_heal_impair(&g.net, g.hsrv[slow]) == 0, "removing the impairment failed");
	note("cycle %u: s%d's link healthy again", k, slow + 1);
	if (!hold(GAP_MS, chk, chk_status))
		return false;

	NS_ASSERT(kv_nn_partition(&g.net, g.hsrv[pa], g.hsrv[pb], true) == 0, "partition failed");
	mig = move_between(pa, pb);
	note("cycle %u: s%d and s%d partitioned; move s%d -> s%d: %s (migration %" PRIu64 ")", k,
	     pa + 1, pb + 1, pa + 1, pb + 1, mig ? "accepted" : "not accepted", mig);
	if (mig)
		g.part_moves++;
	if (!hold(g.partition_ms, chk, chk_status))
		return false;
	if (mig && migration_listed(mig))
		g.part_moves_stuck++;
	NS_ASSERT(kv_nn_partition(&g.net, g.hsrv[pa], g.hsrv[pb], false) == 0,
	          "healing the partition failed");
	healed = kv_test_now_ms();
	if (mig && migration_listed(mig)) {
		/* The source must reach the destination soon after the heal, not
		 * when its connect's SYN backoff next fires. */
		while (migration_listed(mig)) {
			NS_ASSERT(kv_test_now_ms() - healed < HEAL_MIGRATION_MS,
			          "migration %" PRIu64 " s%d -> s%d still in flight %u ms after "
			          "the partition healed",
			          mig, pa + 1, pb + 1, HEAL_MIGRATION_MS);
			if (!hold(100, chk, chk_status))
				return false;
		}
		note("cycle %u: partition healed; migration %" PRIu64 " finished %" PRIu64
		     " ms later",
		     k, mig, kv_test_now_ms() - healed);
	} else {
		note("cycle %u: partition healed", k);
	}
	return hold(GAP_MS, chk, chk_status);
}

/* ---------------------------------------------------------------------------
 * After the faults
 * ------------------------------------------------------------------------- */

/* Waits until every node is active and no migration is in flight. */
static int
wait_recovered(unsigned ms, char *why, size_t len)
{
	uint64_t end = kv_test_now_ms() + ms;

	snprintf(why, len, "no configuration");
	while (kv_test_now_ms() < end) {
		shardkv_config *st = NULL;
		assert_daemons_alive();
		if (shardkv_status(g.admin, &st) == 0) {
			size_t active = 0;
			for (size_t k = 0; k < st->nnodes; k++)
				if (st->nodes[k].state == SHARDKV_NODE_ACTIVE)
					active++;
			snprintf(why, len, "%zu of %zu nodes active, %zu migrations in flight",
			         active, st->nnodes, st->nmigrations);
			bool ok =
			    active == NSERVERS && st->nnodes == NSERVERS && st->nmigrations == 0;
			shardkv_config_free(st);
			if (ok)
				return 0;
		}
		kv_test_sleep_ms(200);
	}
	return -1;
}

/* Writes and reads back one key in every range of the latest
 * configuration (the range's start, or "\x01" for the first). Retries
 * each until the deadline. Returns the number of ranges that never served. */
static size_t
check_every_range(unsigned ms, size_t *nranges)
{
	shardkv_config *cfg = NULL;
	uint64_t end = kv_test_now_ms() + ms;
	size_t bad = 0;

	*nranges = 0;
	if (shardkv_config_get(g.admin, 0, &cfg) != 0)
		return 1;
	*nranges = cfg->nranges;
	for (size_t r = 0; r < cfg->nranges; r++) {
		const shardkv_range *x = &cfg->ranges[r];
		const void *key = x->start.len ? (const void *)x->start.data : "\x01";
		size_t klen = x->start.len ? x->start.len : 1;
		char val[64];
		bool ok = false;

		snprintf(val, sizeof(val), "netns-after-heal-%zu", r);
		while (!ok && kv_test_now_ms() < end) {
			shardkv_buf got = {0};
			if (shardkv_put(g.admin, key, klen, val, strlen(val)) == 0 &&
			    shardkv_get(g.admin, key, klen, &got) == 0) {
				ok = got.len == strlen(val) && memcmp(got.data, val, got.len) == 0;
				shardkv_free(got.data);
			}
			if (!ok)
				kv_test_sleep_ms(100);
		}
		if (!ok) {
			note("range %zu (owner %" PRIu32 ") does not serve", r, x->node);
			bad++;
		}
	}
	shardkv_config_free(cfg);
	return bad;
}

/* Reads the checker's summary line ("N reconfigurations, M operations, V
 * violations") from its log into buf. Returns 0 when found. */
static int
checker_summary(char *buf, size_t len)
{
	FILE *f = fopen(g.chk_log, "r");
	char line[1024];
	int rv = -1;

	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (strstr(line, " violations") && strstr(line, " operations")) {
			size_t l = strcspn(line, "\n");
			if (l >= len)
				l = len - 1;
			memcpy(buf, line, l);
			buf[l] = '\0';
			rv = 0;
		}
	fclose(f);
	return rv;
}

/* ---------------------------------------------------------------------------
 * The test
 * ------------------------------------------------------------------------- */

static void
checker_finds_nothing_lost_under_link_loss_delay_and_partition(void **state)
{
	unsigned duration = env_num("KV_NETNS_DURATION", DEFAULT_DURATION, 10, 86400);
	unsigned seed = env_num("KV_NETNS_SEED", DEFAULT_SEED, 0, 0xffffffffu);
	char dur[16], sd[16], summary[256], why[160];
	char *chk_argv[] = {(char *)KV_CHECKER_BIN,
	                    (char *)"-c",
	                    g.ctl_url,
	                    (char *)"--duration",
	                    dur,
	                    (char *)"--seed",
	                    sd,
	                    (char *)"--clients",
	                    (char *)"4",
	                    (char *)"--reconfig-interval",
	                    (char *)"500",
	                    (char *)"--fill",
	                    (char *)"200",
	                    NULL};
	uint64_t t0, load_end, end, cycle_ms;
	int chk_status = 0;
	bool chk_done = false;
	pid_t chk;
	unsigned k = 0;
	size_t nranges, bad;

	(void)state;
	g.link_down_ms = 1000u * env_num("KV_NETNS_LINK_DOWN_S", LINK_DOWN_S, 1, 3600);
	g.impair_ms = 1000u * env_num("KV_NETNS_IMPAIR_S", IMPAIR_S, 1, 3600);
	g.partition_ms = 1000u * env_num("KV_NETNS_PARTITION_S", PARTITION_S, 1, 3600);
	cycle_ms = (uint64_t)g.link_down_ms + g.impair_ms + g.partition_ms + 3u * GAP_MS;
	/* One copy on purpose: the move made while its two ends are
	 * partitioned is a migration, which needs one copy per range. */
	g.replicas = 1;
	build_cluster();
	snprintf(dur, sizeof(dur), "%u", duration);
	snprintf(sd, sizeof(sd), "%u", seed);
	note("checker: %u s of load, seed %u", duration, seed);
	t0 = kv_test_now_ms();
	chk = kv_nn_spawn_here(chk_argv, g.chk_log);
	NS_ASSERT(chk > 0, "cannot start the checker");
	load_end = t0 + (uint64_t)duration * 1000u;

	/* Let the checker fill and start its load, then run fault cycles while
	 * a whole one still fits in the load. */
	if (!hold(3000, chk, &chk_status))
		chk_done = true;
	while (!chk_done && kv_test_now_ms() + cycle_ms <= load_end) {
		if (!fault_cycle(k++, chk, &chk_status))
			chk_done = true;
	}
	note("%u fault cycles done; %u moves accepted across a partition, %u of them still in "
	     "flight when it healed",
	     k, g.part_moves, g.part_moves_stuck);

	end = load_end + CHECKER_EXTRA_S * 1000u;
	while (!chk_done) {
		if (!hold(200, chk, &chk_status))
			chk_done = true;
		else if (kv_test_now_ms() > end) {
			kv_nn_stop(chk, SIGKILL, 5000, NULL);
			NS_ASSERT(false, "the checker did not finish %u s after its load",
			          CHECKER_EXTRA_S);
		}
	}
	NS_ASSERT(checker_summary(summary, sizeof(summary)) == 0, "no summary from the checker");
	note("checker: %s (exit status 0x%x)", summary, chk_status);
	NS_ASSERT(WIFEXITED(chk_status) && WEXITSTATUS(chk_status) == 0,
	          "the checker failed (status 0x%x): %s", chk_status, summary);
	NS_ASSERT(strstr(summary, " 0 violations") != NULL, "violations: %s", summary);
	NS_ASSERT(k >= 1, "no fault cycle fit in %u s of load", duration);
	NS_ASSERT(g.part_moves >= 1, "no move was accepted while its ends were partitioned");

	/* The network is whole again: the cluster must settle by itself. */
	NS_ASSERT(wait_recovered(RECOVER_MS, why, sizeof(why)) == 0,
	          "the cluster did not recover in %u ms after the network healed: %s", RECOVER_MS,
	          why);
	bad = check_every_range(RECOVER_MS, &nranges);
	NS_ASSERT(bad == 0, "%zu of %zu ranges do not serve after the network healed", bad,
	          nranges);
	note("recovered: every node active, no migration in flight, %zu ranges serve", nranges);
}

/* One get of key sent straight to the server at url (no library retry):
 * returns 0 (found or not), the wire status otherwise, -1 on a transport
 * failure; the error text in why. */
static int
direct_get(const char *url, const char *key, uint64_t epoch, char *why, size_t whylen)
{
	Shardkv__GetOp gop = SHARDKV__GET_OP__INIT;
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__Op *ops[1] = {&op};
	Shardkv__Request rq = SHARDKV__REQUEST__INIT;
	Shardkv__Response *r;
	int st;

	gop.key = bd(key);
	op.op_case = SHARDKV__OP__OP_GET;
	op.get = &gop;
	rq.n_ops = 1;
	rq.ops = ops;
	rq.epoch = epoch;
	why[0] = 0;
	if ((r = call(url, &rq)) == NULL)
		return -1;
	st = r->status ? (int)r->status : r->n_results == 1 ? (int)r->results[0]->status : -2;
	if (st == SHARDKV__STATUS__STATUS_NOT_FOUND)
		st = 0;
	snprintf(why, whylen, "%s", r->error ? r->error : "");
	shardkv__response__free_unpacked(r, NULL);
	return st;
}

/* Node `id`'s state in the latest configuration (and its epoch), or -1. */
static int
node_state(uint32_t id, uint64_t *epoch)
{
	shardkv_config *cfg = NULL;
	int st = -1;

	if (shardkv_config_get(g.admin, 0, &cfg) != 0)
		return -1;
	for (size_t k = 0; k < cfg->nnodes; k++)
		if (cfg->nodes[k].id == id)
			st = cfg->nodes[k].state;
	if (epoch)
		*epoch = cfg->epoch;
	shardkv_config_free(cfg);
	return st;
}

static void
server_cut_off_from_the_controller_only_refuses_at_lease_end_and_serves_after_heal(void **state)
{
	char why[256], to[16];
	shardkv_admin_result res;
	uint64_t epoch = 0, t_cut, t_refused = 0, t_down = 0, t_heal, t_back = 0, t_active = 0;
	unsigned served_after_cut = 0;
	int st;

	(void)state;
	/* One copy on purpose: the cut-off server must serve its own keys
	 * again after the heal; with replicas they fail over (the replicated
	 * case is primary_cut_off_from_the_controller_only_*). */
	g.replicas = 1;
	build_cluster();
	/* A range of its own on s1, so that the key's owner is known. */
	snprintf(to, sizeof(to), "%" PRIu32, g.node[0]);
	memset(&res, 0, sizeof(res));
	NS_ASSERT(shardkv_move(g.admin, "netns-lease/", 12, "netns-lease0", 12, to, 0, SHARDKV_WAIT,
	                       &res) == 0,
	          "moving the test's range to s1 failed: %s", shardkv_errmsg());
	NS_ASSERT(shardkv_put(g.admin, LEASE_KEY, strlen(LEASE_KEY), "v", 1) == 0,
	          "put before the cut failed: %s", shardkv_errmsg());
	NS_ASSERT(node_state(g.node[0], &epoch) == SHARDKV_NODE_ACTIVE, "s1 is not active");
	/* It serves before the cut, straight from the client host. */
	st = direct_get(g.srv_url[0], LEASE_KEY, epoch, why, sizeof(why));
	NS_ASSERT(st == 0, "s1 did not serve before the cut: status %d (%s)", st, why);

	NS_ASSERT(kv_nn_partition(&g.net, g.hctl, g.hsrv[0], true) == 0, "partition failed");
	t_cut = kv_test_now_ms();
	note("lease: s1 (node %" PRIu32 ") cut off from the controller; its clients still reach it",
	     g.node[0]);
	while ((t_refused == 0 || t_down == 0) && kv_test_now_ms() - t_cut < LEASE_DOWN_MS) {
		assert_daemons_alive();
		if (t_refused == 0) {
			st = direct_get(g.srv_url[0], LEASE_KEY, epoch, why, sizeof(why));
			if (st == 0) {
				served_after_cut++;
			} else {
				NS_ASSERT(
				    st == SHARDKV__STATUS__STATUS_UNAVAILABLE &&
				        strstr(why, "lease expired") != NULL,
				    "s1 answered status %d (%s) after the cut, not unavailable "
				    "(lease expired)",
				    st, why);
				t_refused = kv_test_now_ms();
				note("lease: s1 refused %" PRIu64 " ms after the cut: %s",
				     t_refused - t_cut, why);
				/* Writes too. */
				res1 w = do_put(g.srv_url[0], LEASE_KEY, "w", 0, 0);
				NS_ASSERT(w.status == SHARDKV__STATUS__STATUS_UNAVAILABLE,
				          "a put to s1 after its lease got status %d", w.status);
			}
		}
		if (t_down == 0 && node_state(g.node[0], NULL) == SHARDKV_NODE_DOWN) {
			t_down = kv_test_now_ms();
			note("lease: the controller says node %" PRIu32 " is down, %" PRIu64
			     " ms after the cut",
			     g.node[0], t_down - t_cut);
		}
		kv_test_sleep_ms(50);
	}
	NS_ASSERT(t_refused != 0 && t_refused - t_cut <= LEASE_REFUSE_MS,
	          "s1 still served %u ms after it was cut off from the controller",
	          LEASE_REFUSE_MS);
	NS_ASSERT(t_down != 0, "the controller did not declare s1 down within %u ms",
	          LEASE_DOWN_MS);

	NS_ASSERT(kv_nn_partition(&g.net, g.hctl, g.hsrv[0], false) == 0,
	          "healing the partition failed");
	t_heal = kv_test_now_ms();
	while ((t_back == 0 || t_active == 0) && kv_test_now_ms() - t_heal < LEASE_BACK_MS) {
		assert_daemons_alive();
		if (t_back == 0 &&
		    direct_get(g.srv_url[0], LEASE_KEY, epoch, why, sizeof(why)) == 0)
			t_back = kv_test_now_ms();
		if (t_active == 0 && node_state(g.node[0], NULL) == SHARDKV_NODE_ACTIVE)
			t_active = kv_test_now_ms();
		kv_test_sleep_ms(50);
	}
	NS_ASSERT(t_back != 0, "s1 did not serve again within %u ms of the heal (last: %s)",
	          LEASE_BACK_MS, why);
	NS_ASSERT(t_active != 0, "node %" PRIu32 " not active again within %u ms of the heal",
	          g.node[0], LEASE_BACK_MS);
	note("lease: refused %" PRIu64 " ms after the cut (%u gets served before that), down "
	     "after %" PRIu64 " ms; after the heal active again in %" PRIu64
	     " ms, serving again in %" PRIu64 " ms",
	     t_refused - t_cut, served_after_cut, t_down - t_cut, t_active - t_heal,
	     t_back - t_heal);
	clients_close();
}

/* ---------------------------------------------------------------------------
 * Replicated ranges (the controller's --replicas 3, --min-insync 2)
 * ------------------------------------------------------------------------- */

/* Whether key lies in [r->start, r->end). */
static bool
range_has(const shardkv_range *r, const char *key)
{
	size_t kl = strlen(key);
	size_t sl = r->start.len, el = r->end.len;
	int c = memcmp(r->start.data ? (const char *)r->start.data : "", key, sl < kl ? sl : kl);

	if (c > 0 || (c == 0 && sl > kl))
		return false;
	if (el == 0)
		return true;
	c = memcmp(r->end.data, key, el < kl ? el : kl);
	return c > 0 || (c == 0 && el > kl);
}

/* The range of key in the latest configuration (copied, bounds dropped) and
 * the configuration's epoch. Returns 0 or -1. */
static int
range_of_key(const char *key, shardkv_range *out, uint64_t *epoch)
{
	shardkv_config *cfg = NULL;
	int rv = -1;

	if (shardkv_config_get(g.admin, 0, &cfg) != 0)
		return -1;
	for (size_t k = 0; k < cfg->nranges; k++)
		if (range_has(&cfg->ranges[k], key)) {
			*out = cfg->ranges[k];
			out->start = (shardkv_buf){0};
			out->end = (shardkv_buf){0};
			rv = 0;
		}
	if (epoch)
		*epoch = cfg->epoch;
	shardkv_config_free(cfg);
	return rv;
}

/* The server index of node id, or -1. */
static int
srv_of_node(uint32_t id)
{
	for (int i = 0; i < NSERVERS; i++)
		if (g.node[i] == id)
			return i;
	return -1;
}

/* Waits until key's range has all NSERVERS nodes as replicas and in sync.
 * Returns 0 (r filled) or -1. */
static int
wait_fully_in_sync(const char *key, unsigned ms, shardkv_range *r)
{
	uint64_t end = kv_test_now_ms() + ms;

	while (kv_test_now_ms() < end) {
		assert_daemons_alive();
		if (range_of_key(key, r, NULL) == 0 && r->nreplicas == NSERVERS &&
		    r->ninsync == NSERVERS)
			return 0;
		kv_test_sleep_ms(100);
	}
	return -1;
}

/* The number in a value "xN" (N >= 0), or -1. */
static long
value_seq(const char *v)
{
	char *end;
	long n;

	if (v == NULL || v[0] == 0 || v[1] < '0' || v[1] > '9')
		return -1;
	n = strtol(v + 1, &end, 10);
	return *end == 0 ? n : -1;
}

/* Reads key through the library and checks it holds the value of write
 * number last_ok or of a later attempt (an unacknowledged write may have
 * been applied), never an earlier one. */
static void
assert_read_not_older(const char *key, long last_ok, long attempts, unsigned ms)
{
	uint64_t end = kv_test_now_ms() + ms;
	shardkv_buf v = {0};
	int rv;

	while ((rv = shardkv_get(g.admin, key, strlen(key), &v)) != 0 && kv_test_now_ms() < end)
		kv_test_sleep_ms(100);
	NS_ASSERT(rv == 0, "the final read of %s failed: %s", key, shardkv_errmsg());
	long n = value_seq((const char *)v.data);
	NS_ASSERT(n >= last_ok && n < attempts,
	          "%s reads '%s' after the heal: the last acknowledged write was number %ld "
	          "(of %ld attempted)",
	          key, (const char *)v.data, last_ok, attempts);
	note("repl: %s reads write %ld; the last acknowledged was %ld", key, n, last_ok);
	shardkv_free(v.data);
}

/* Builds the cluster with --replicas 3, waits until REPL_KEY's range has
 * every server in sync (r), and returns the index of its primary. */
static int
repl_cluster_up(shardkv_range *r)
{
	g.replicas = 3;
	build_cluster();
	NS_ASSERT(wait_fully_in_sync(REPL_KEY, RECOVER_MS, r) == 0,
	          "the range of %s did not get %d in-sync replicas in %u ms", REPL_KEY, NSERVERS,
	          RECOVER_MS);
	int p = srv_of_node(r->node);
	NS_ASSERT(p >= 0, "the primary %" PRIu32 " is none of the test's servers", r->node);
	return p;
}

/* Puts n values "<tag><seq>" to REPL_KEY, each of which must succeed. */
static void
repl_put_all(char tag, int n, long *seq, long *last_ok)
{
	char val[32];

	for (int i = 0; i < n; i++, (*seq)++) {
		snprintf(val, sizeof(val), "%c%ld", tag, *seq);
		NS_ASSERT(shardkv_put(g.admin, REPL_KEY, strlen(REPL_KEY), val, strlen(val)) == 0,
		          "put before the cut failed: %s", shardkv_errmsg());
		*last_ok = *seq;
	}
}

static void
primary_cut_off_from_its_backups_only_acknowledges_nothing_without_them(void **state)
{
	shardkv_range r;
	char val[32];
	long seq = 0, last_ok = -1;
	uint64_t t_cut, t_shrink = 0, t_heal, t_ok = 0;
	unsigned failed_in_cut = 0;
	int p, b[2], nb = 0;

	(void)state;
	p = repl_cluster_up(&r);
	for (int i = 0; i < NSERVERS; i++)
		if (i != p)
			b[nb++] = i;
	repl_put_all('a', 20, &seq, &last_ok);
	NS_ASSERT(kv_nn_partition(&g.net, g.hsrv[p], g.hsrv[b[0]], true) == 0 &&
	              kv_nn_partition(&g.net, g.hsrv[p], g.hsrv[b[1]], true) == 0,
	          "partition failed");
	t_cut = kv_test_now_ms();
	note("repl: s%d (primary of %s) cut off from its backups s%d and s%d", p + 1, REPL_KEY,
	     b[0] + 1, b[1] + 1);
	while (kv_test_now_ms() - t_cut < REPL_CUT_MS) {
		uint64_t t0 = kv_test_now_ms();
		assert_daemons_alive();
		snprintf(val, sizeof(val), "a%ld", seq);
		int rv = shardkv_put(g.admin, REPL_KEY, strlen(REPL_KEY), val, strlen(val));
		seq++;
		/* A write begun after the cut can reach no backup: with
		 * --min-insync 2 it must never be acknowledged. */
		NS_ASSERT(rv != 0 || t0 < t_cut + 100,
		          "a write begun %" PRIu64 " ms after the primary lost its backups was "
		          "acknowledged",
		          t0 - t_cut);
		if (rv == 0)
			last_ok = seq - 1;
		else
			failed_in_cut++;
		if (t_shrink == 0 && range_of_key(REPL_KEY, &r, NULL) == 0 &&
		    r.ninsync < NSERVERS) {
			t_shrink = kv_test_now_ms();
			note("repl: the ISR shrank to %zu member(s) %" PRIu64 " ms after the cut",
			     r.ninsync, t_shrink - t_cut);
		}
	}
	NS_ASSERT(t_shrink != 0 && t_shrink - t_cut <= ISR_SHRINK_MS,
	          "the ISR of %s did not shrink within %u ms of the cut", REPL_KEY, ISR_SHRINK_MS);
	NS_ASSERT(kv_nn_partition(&g.net, g.hsrv[p], g.hsrv[b[0]], false) == 0 &&
	              kv_nn_partition(&g.net, g.hsrv[p], g.hsrv[b[1]], false) == 0,
	          "healing the partition failed");
	t_heal = kv_test_now_ms();
	while (t_ok == 0 && kv_test_now_ms() - t_heal < RECOVER_MS) {
		assert_daemons_alive();
		snprintf(val, sizeof(val), "a%ld", seq);
		if (shardkv_put(g.admin, REPL_KEY, strlen(REPL_KEY), val, strlen(val)) == 0) {
			t_ok = kv_test_now_ms();
			last_ok = seq;
		}
		seq++;
	}
	NS_ASSERT(t_ok != 0, "no write succeeded within %u ms of the heal: %s", RECOVER_MS,
	          shardkv_errmsg());
	NS_ASSERT(wait_fully_in_sync(REPL_KEY, RECOVER_MS, &r) == 0,
	          "the backups did not get back in sync within %u ms of the heal", RECOVER_MS);
	note("repl: %u writes refused during the cut; after the heal writes in %" PRIu64
	     " ms, all %d replicas in sync in %" PRIu64 " ms",
	     failed_in_cut, t_ok - t_heal, NSERVERS, kv_test_now_ms() - t_heal);
	assert_read_not_older(REPL_KEY, last_ok, seq, RECOVER_MS);
	clients_close();
}

static void
primary_cut_off_from_the_controller_only_stops_before_its_replacement_serves(void **state)
{
	shardkv_range r;
	char val[32], why[256];
	long seq = 0, last_ok = -1;
	uint64_t epoch = 0, t_cut, t_p_last = 0, t_new = 0, t_write = 0, t_heal;
	uint32_t q = 0;
	int p;

	(void)state;
	p = repl_cluster_up(&r);
	repl_put_all('c', 10, &seq, &last_ok);
	NS_ASSERT(range_of_key(REPL_KEY, &r, &epoch) == 0, "no range for %s", REPL_KEY);
	NS_ASSERT(kv_nn_partition(&g.net, g.hctl, g.hsrv[p], true) == 0, "partition failed");
	t_cut = kv_test_now_ms();
	note("repl: s%d (primary of %s) cut off from the controller", p + 1, REPL_KEY);
	while ((t_new == 0 || t_write == 0) && kv_test_now_ms() - t_cut < LEASE_DOWN_MS + 5000) {
		assert_daemons_alive();
		/* The old primary, asked directly from the client host. */
		int st = direct_get(g.srv_url[p], REPL_KEY, epoch, why, sizeof(why));
		uint64_t now = kv_test_now_ms();
		if (st == 0) {
			NS_ASSERT(t_new == 0,
			          "s%d still served %s %" PRIu64
			          " ms after a configuration gave the range to node %" PRIu32,
			          p + 1, REPL_KEY, now - t_new, q);
			t_p_last = now;
		}
		if (t_new == 0 && range_of_key(REPL_KEY, &r, NULL) == 0 && r.node != g.node[p]) {
			t_new = kv_test_now_ms();
			q = r.node;
			note("repl: node %" PRIu32 " is the new primary %" PRIu64
			     " ms after the cut; s%d last served %" PRIu64 " ms after it",
			     q, t_new - t_cut, p + 1, t_p_last ? t_p_last - t_cut : 0);
		}
		if (t_new != 0) {
			snprintf(val, sizeof(val), "c%ld", seq);
			if (shardkv_put(g.admin, REPL_KEY, strlen(REPL_KEY), val, strlen(val)) ==
			    0) {
				last_ok = seq;
				if (t_write == 0)
					t_write = kv_test_now_ms();
			} else {
				snprintf(why, sizeof(why), "%s", shardkv_errmsg());
			}
			seq++;
		}
		kv_test_sleep_ms(20);
	}
	NS_ASSERT(t_new != 0, "no failover within %u ms of the cut", LEASE_DOWN_MS + 5000);
	NS_ASSERT(t_p_last < t_new, "the old primary served after its replacement was chosen");
	NS_ASSERT(t_write != 0, "the new primary took no write (last error: %s)", why);
	note("repl: the new primary took a write %" PRIu64 " ms after the cut", t_write - t_cut);
	NS_ASSERT(kv_nn_partition(&g.net, g.hctl, g.hsrv[p], false) == 0,
	          "healing the partition failed");
	t_heal = kv_test_now_ms();
	NS_ASSERT(wait_fully_in_sync(REPL_KEY, RECOVER_MS, &r) == 0,
	          "s%d did not get back in sync within %u ms of the heal", p + 1, RECOVER_MS);
	note("repl: s%d back in sync %" PRIu64 " ms after the heal", p + 1,
	     kv_test_now_ms() - t_heal);
	assert_read_not_older(REPL_KEY, last_ok, seq, RECOVER_MS);
	clients_close();
}

static int
rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	remove(path);
	return 0;
}

static int
teardown(void **state)
{
	(void)state;
	if (!g.started)
		return 0;
	shardkv_close(g.admin);
	g.admin = NULL;
	/* Servers are scratch: SIGKILL, so that none starts a drain. */
	for (int i = 0; i < NSERVERS; i++)
		if (g.srv_pid[i] > 0)
			kv_nn_stop(g.srv_pid[i], SIGKILL, 5000, NULL);
	if (g.ctl_pid > 0)
		kv_nn_stop(g.ctl_pid, SIGTERM, 5000, NULL);
	kv_nn_destroy(&g.net);
	if (getenv("KV_NETNS_KEEP") == NULL)
		nftw(g.dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	else
		fprintf(stderr, "netns: kept %s\n", g.dir);
	g.started = false;
	return 0;
}

/* Runs one case in a child process: a process enters the client host's
 * namespace once, and the library's threads stay in it. Returns 0 passed,
 * SKIP_EXIT skipped, else failed. */
static int
run_case(const struct CMUnitTest *t)
{
	pid_t pid = fork();
	int st = 0;

	if (pid < 0)
		return 1;
	if (pid == 0) {
		const struct CMUnitTest one[] = {*t};
		int failed = _cmocka_run_group_tests(t->name, one, 1, NULL, NULL);
		/* ctest shows the test as skipped (SKIP_RETURN_CODE), not passed. */
		exit(failed == 0 && g.skipped ? SKIP_EXIT : failed ? 1 : 0);
	}
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_teardown(
	        server_cut_off_from_the_controller_only_refuses_at_lease_end_and_serves_after_heal,
	        teardown),
	    cmocka_unit_test_teardown(
	        checker_finds_nothing_lost_under_link_loss_delay_and_partition, teardown),
	    cmocka_unit_test_teardown(
	        primary_cut_off_from_its_backups_only_acknowledges_nothing_without_them, teardown),
	    cmocka_unit_test_teardown(
	        primary_cut_off_from_the_controller_only_stops_before_its_replacement_serves,
	        teardown),
	};
	const char *filter = getenv("KV_TEST_FILTER");
	int failed = 0, ran = 0, skipped = 0;

	for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
		if (filter && *filter && fnmatch(filter, tests[i].name, 0) != 0)
			continue;
		int rc = run_case(&tests[i]);
		ran++;
		skipped += rc == SKIP_EXIT;
		failed += rc != 0 && rc != SKIP_EXIT;
	}
	if (failed)
		return 1;
	return ran > 0 && skipped == ran ? SKIP_EXIT : 0;
}
