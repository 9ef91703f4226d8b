/*
 * main.c - shardkv-checker: runs concurrent clients against a live cluster
 * while a driver reconfigures it at random, records the history of every
 * operation and checks it (history.h): no acknowledged append lost or
 * duplicated, appends in real-time order, every read linearizable per key,
 * every mget atomic with respect to every mput. The history, with the
 * driver's steps as nemesis events, is written to a history file.
 * Prints "N reconfigurations, M operations, V violations" (or the first
 * violations with their histories) and exits 0 only when V is 0.
 *
 * Exit codes: 0 no violation; 1 violations (or a daemon crashed); 2 usage;
 * 3 the cluster could not be started, reached or read back.
 */
#include "checker/checker.h"
#include "checker/histfile.h"
#include "common/proc.h"
#include "common/version.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SETTLE_MS     20000u /* wait for migrations to finish after the run */
#define FINAL_READ_MS 20000u /* the final reads, all keys together, at most this long */
#define ADMIN_MS      15000u /* deadline of admin calls (--wait steps) */
#define FINAL_OP_MS   2000u  /* deadline of each final read */
#define START_MS      30000u /* a spawned server becomes active */
#define SHOW_MAX      5      /* violations printed in full */

static void
usage(FILE *f)
{
	fprintf(
	    f,
	    "usage: shardkv-checker [-c CONTROLLERS | --spawn DIR [--servers N] [--kill]\n"
	    "                       [--kill-interval MS] [--pause MS [--pause-interval MS]]\n"
	    "                       [--kill-no-restart] [--wipe] [--fault-interval MS]\n"
	    "                       [--replicas R]\n"
	    "                       [--fsync MODE] [--controllers C [--kill-controller]\n"
	    "                       [--kill-controller-in-failover]]]\n"
	    "                       [--clients N] [--keys K] [--duration S]\n"
	    "                       [--reconfig-interval MS] [--no-reconfig] [--seed S]\n"
	    "                       [--op-timeout MS] [--max-ops N] [--fill N [--fill-size B]]\n"
	    "                       [--multi G] [--async N] [--handles H] [--hot PCT]\n"
	    "                       [--move-rate MB] [--deletes PCT] [--scans PCT [--scan-limit "
	    "N]]\n"
	    "                       [--cas PCT]\n"
	    "                       [--history FILE] [--keep] [--json] [-v]\n"
	    "       shardkv-checker --check FILE\n"
	    "\n"
	    "Runs N clients doing appends of unique tokens, puts/gets/deletes of unique\n"
	    "values, (with --scans) scans and (with --multi) mputs/mgets on K keys while\n"
	    "moving ranges, rebalancing and (with --spawn) joining and removing servers\n"
	    "at random, then checks the recorded history: every acknowledged append\n"
	    "exactly once and in real-time order, every read and delete linearizable per\n"
	    "key, every mget atomic with respect to every mput.\n"
	    "\n"
	    "  -c, --controller ADDRS  the cluster to test (default $SHARDKV_CONTROLLER or\n"
	    "                          tcp://127.0.0.1:7000); moves and rebalances only\n"
	    "  --spawn DIR             start a controller and servers under DIR/run-XXXXXX\n"
	    "                          (daemons from $SHARDKV_BIN_DIR or beside the checker)\n"
	    "  --servers N             servers to start with --spawn (default 3)\n"
	    "  --kill                  also SIGKILL and restart servers with their data dir\n"
	    "  --kill-interval MS      besides the steps, SIGKILL a server every ~MS ms while one\n"
	    "                          of its threads writes or syncs its log (writes logged,\n"
	    "                          not yet answered) and restart it at once, so that the\n"
	    "                          clients' retries reach it; steps then never --wait\n"
	    "  --kill-at-handover      aim those kills at a migration's handover instead: the\n"
	    "                          server that has just logged its fence as a source or\n"
	    "                          the commit as a destination (waits up to 1 s for one;\n"
	    "                          no kill when none comes)\n"
	    "  --pause MS              SIGSTOP the owner of one of the checker's keys for MS ms\n"
	    "                          (longer than its 2 s lease, say 3000-5000), then SIGCONT;\n"
	    "                          checks that nothing on its keys succeeded while it was\n"
	    "                          stopped and reports when they served again\n"
	    "  --pause-interval MS     mean time between two pauses' starts (default 2 x --pause)\n"
	    "  --kill-no-restart       SIGKILL a server for good, `remove` its node once it is\n"
	    "                          down and join a replacement (needs --replicas 2 or more)\n"
	    "  --wipe                  SIGKILL a server, delete its data dir and start it again\n"
	    "                          as a new node (needs --replicas 2 or more)\n"
	    "  --fault-interval MS     mean time between those faults (default 10000)\n"
	    "  --replicas R            pass --replicas R to the spawned controller(s), if they\n"
	    "                          accept it (refused otherwise; default 3, the\n"
	    "                          controller's default, or 1 for a controller without it)\n"
	    "  --fsync MODE            spawned servers' --fsync (always, batch, none)\n"
	    "  --split-bytes N         pass --split-bytes N to the spawned controller(s): the\n"
	    "                          balancer moves pieces of at most N bytes (k, m, g), so a\n"
	    "                          small N makes it cut ranges often\n"
	    "  --controllers C         spawn C controller replicas (Raft; 3 or 5) instead of one\n"
	    "  --kill-controller       with --controllers 3+: SIGKILL the controller leader a few\n"
	    "                          ms into a move or rebalance, restart it a moment later\n"
	    "  --kill-controller-in-failover  with --controllers 3+ and --kill-no-restart or\n"
	    "                          --wipe: SIGKILL the controller leader during each\n"
	    "                          failover (0-4.5 s after the server's SIGKILL, or once its\n"
	    "                          node is seen down), restart it a moment later; the run\n"
	    "                          fails unless a new leader finishes every failover\n"
	    "  --clients N             concurrent clients (default 4)\n"
	    "  --keys K                keys, half appended to, half put/get (default 16)\n"
	    "  --duration S            seconds of load (default 30)\n"
	    "  --reconfig-interval MS  mean pause between reconfiguration steps (default 400)\n"
	    "  --no-reconfig           load and check only\n"
	    "  --seed S                random seed (default: from the clock; printed)\n"
	    "  --op-timeout MS         per-operation deadline (default 5000; 50-200 makes many\n"
	    "                          ops time out: recorded as indeterminate, retried by the\n"
	    "                          library with the same request id until then)\n"
	    "  --multi G               also mput/mget G groups of 2-4 registers that one range\n"
	    "                          holds (default 0)\n"
	    "  --async N               per client, N more single-key ops in flight through the\n"
	    "                          async API (get, put), each slot a process (default 0)\n"
	    "  --handles H             per client, spread its ops over H handles (default 1)\n"
	    "  --hot PCT               PCT%% of ops pick a key the driver is moving (default 50)\n"
	    "  --move-rate MB          pace half the moves and rebalances that do not wait at\n"
	    "                          MB MB/s, so that copies last (default 0: unpaced)\n"
	    "  --deletes PCT           PCT%% of single-key ops delete a register (default 5)\n"
	    "  --scans PCT             PCT%% of blocking ops scan 1-4 registers (default 0)\n"
	    "  --scan-limit N          entries a scan asks for at most (default 100)\n"
	    "  --cas PCT               PCT%% of ops (blocking and async) compare-and-set one\n"
	    "                          of 8 counters (from the value the process last saw to\n"
	    "                          a new one) or take (if absent) or release (if equal)\n"
	    "                          one of 4 locks (default 0)\n"
	    "  --max-ops N             record at most N operations (default %u)\n"
	    "  --fill N                write N filler keys among the checker's keys first, so\n"
	    "                          that moved ranges carry data (default 0)\n"
	    "  --fill-size B           value size of the filler keys (default 1000)\n"
	    "  --keep                  keep the spawned cluster's directory\n"
	    "  --json                  print the summary as one JSON object on stdout\n"
	    "  --history FILE          write the run's history there as JSON Lines, with the\n"
	    "                          driver's steps as \"nemesis\" events (default:\n"
	    "                          DIR/history-SEED.jsonl with --spawn, moved into\n"
	    "                          the kept cluster directory when the run fails;\n"
	    "                          else ./shardkv-history-SEED.jsonl)\n"
	    "  --check FILE            check the history in FILE (from any source) and exit:\n"
	    "                          0 valid, 1 violations, 2 malformed file\n"
	    "  --tls-cert F, --tls-key F, --tls-ca F\n"
	    "                          TLS client certificate, key and CA for a tls+tcp://\n"
	    "                          cluster (-c only; default $SHARDKV_TLS_CERT, _KEY, _CA)\n"
	    "  -v, --verbose           log every reconfiguration step\n"
	    "  --version               print \"shardkv-checker VERSION [(commit C)]\" and exit\n"
	    "\n"
	    "Exit: 0 no violation, 1 violations or a daemon crash, 2 usage, 3 the cluster\n"
	    "could not be started, reached or read back.\n",
	    CHK_DEFAULT_OPS);
}

static int __attribute__((format(printf, 1, 2))) usage_error(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "shardkv-checker: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, " (see --help)\n");
	return 2;
}

/* Parses an unsigned integer in [lo, hi]. */
static bool
parse_num(const char *s, uint64_t lo, uint64_t hi, uint64_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 0);
	if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

enum {
	OPT_CLIENTS = 256,
	OPT_KEYS,
	OPT_DURATION,
	OPT_INTERVAL,
	OPT_SEED,
	OPT_SPAWN,
	OPT_SERVERS,
	OPT_KILL,
	OPT_NO_RECONFIG,
	OPT_JSON,
	OPT_KEEP,
	OPT_OP_TIMEOUT,
	OPT_MAX_OPS,
	OPT_FILL,
	OPT_FILL_SIZE,
	OPT_FSYNC,
	OPT_TLS_CERT,
	OPT_TLS_KEY,
	OPT_TLS_CA,
	OPT_CONTROLLERS,
	OPT_KILL_CTL,
	OPT_KILL_CTL_FO,
	OPT_HISTORY,
	OPT_CHECK,
	OPT_MULTI,
	OPT_ASYNC,
	OPT_HANDLES,
	OPT_HOT,
	OPT_MOVE_RATE,
	OPT_DELETES,
	OPT_CAS,
	OPT_SCANS,
	OPT_SCAN_LIMIT,
	OPT_KILL_INTERVAL,
	OPT_KILL_AT_HANDOVER,
	OPT_PAUSE,
	OPT_PAUSE_INTERVAL,
	OPT_KILL_NO_RESTART,
	OPT_WIPE,
	OPT_FAULT_INTERVAL,
	OPT_REPLICAS,
	OPT_SPLIT_BYTES,
};

static int
parse_opts(int argc, char **argv, chk_opts *o, bool *seeded)
{
	static const struct option longs[] = {
	    {"controller", required_argument, NULL, 'c'},
	    {"clients", required_argument, NULL, OPT_CLIENTS},
	    {"keys", required_argument, NULL, OPT_KEYS},
	    {"duration", required_argument, NULL, OPT_DURATION},
	    {"reconfig-interval", required_argument, NULL, OPT_INTERVAL},
	    {"seed", required_argument, NULL, OPT_SEED},
	    {"spawn", required_argument, NULL, OPT_SPAWN},
	    {"servers", required_argument, NULL, OPT_SERVERS},
	    {"kill", no_argument, NULL, OPT_KILL},
	    {"kill-interval", required_argument, NULL, OPT_KILL_INTERVAL},
	    {"kill-at-handover", no_argument, NULL, OPT_KILL_AT_HANDOVER},
	    {"pause", required_argument, NULL, OPT_PAUSE},
	    {"pause-interval", required_argument, NULL, OPT_PAUSE_INTERVAL},
	    {"kill-no-restart", no_argument, NULL, OPT_KILL_NO_RESTART},
	    {"wipe", no_argument, NULL, OPT_WIPE},
	    {"fault-interval", required_argument, NULL, OPT_FAULT_INTERVAL},
	    {"replicas", required_argument, NULL, OPT_REPLICAS},
	    {"split-bytes", required_argument, NULL, OPT_SPLIT_BYTES},
	    {"fsync", required_argument, NULL, OPT_FSYNC},
	    {"controllers", required_argument, NULL, OPT_CONTROLLERS},
	    {"kill-controller", no_argument, NULL, OPT_KILL_CTL},
	    {"kill-controller-in-failover", no_argument, NULL, OPT_KILL_CTL_FO},
	    {"history", required_argument, NULL, OPT_HISTORY},
	    {"check", required_argument, NULL, OPT_CHECK},
	    {"no-reconfig", no_argument, NULL, OPT_NO_RECONFIG},
	    {"json", no_argument, NULL, OPT_JSON},
	    {"keep", no_argument, NULL, OPT_KEEP},
	    {"op-timeout", required_argument, NULL, OPT_OP_TIMEOUT},
	    {"max-ops", required_argument, NULL, OPT_MAX_OPS},
	    {"fill", required_argument, NULL, OPT_FILL},
	    {"fill-size", required_argument, NULL, OPT_FILL_SIZE},
	    {"tls-cert", required_argument, NULL, OPT_TLS_CERT},
	    {"tls-key", required_argument, NULL, OPT_TLS_KEY},
	    {"tls-ca", required_argument, NULL, OPT_TLS_CA},
	    {"multi", required_argument, NULL, OPT_MULTI},
	    {"async", required_argument, NULL, OPT_ASYNC},
	    {"handles", required_argument, NULL, OPT_HANDLES},
	    {"hot", required_argument, NULL, OPT_HOT},
	    {"move-rate", required_argument, NULL, OPT_MOVE_RATE},
	    {"deletes", required_argument, NULL, OPT_DELETES},
	    {"cas", required_argument, NULL, OPT_CAS},
	    {"scans", required_argument, NULL, OPT_SCANS},
	    {"scan-limit", required_argument, NULL, OPT_SCAN_LIMIT},
	    {"verbose", no_argument, NULL, 'v'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	uint64_t v;
	int ch;

	*seeded = false;
	opterr = 0;
	while ((ch = getopt_long(argc, argv, ":c:vh", longs, NULL)) != -1) {
		switch (ch) {
		case 'c':
			o->controllers = optarg;
			break;
		case OPT_TLS_CERT:
		case OPT_TLS_KEY:
		case OPT_TLS_CA:
			if (optarg[0] == 0)
				return usage_error("missing file name for %s", argv[optind - 1]);
			*(ch == OPT_TLS_CERT  ? &o->tls_cert
			  : ch == OPT_TLS_KEY ? &o->tls_key
			                      : &o->tls_ca) = optarg;
			break;
		case OPT_CLIENTS:
			if (!parse_num(optarg, 1, CHK_MAX_CLIENTS, &v))
				return usage_error("--clients wants 1 to 256, not '%s'", optarg);
			o->clients = (unsigned)v;
			break;
		case OPT_KEYS:
			if (!parse_num(optarg, 2, CHK_MAX_KEYS, &v))
				return usage_error("--keys wants 2 to 4096, not '%s'", optarg);
			o->keys = (unsigned)v;
			break;
		case OPT_DURATION: {
			char *end;
			double d = strtod(optarg, &end);
			if (end == optarg || *end || !(d > 0) || d > 7 * 86400.0)
				return usage_error("--duration wants seconds (> 0), not '%s'",
				                   optarg);
			o->duration_s = d;
			break;
		}
		case OPT_INTERVAL:
			if (!parse_num(optarg, 1, 3600000, &v))
				return usage_error(
				    "--reconfig-interval wants milliseconds, not '%s'", optarg);
			o->reconfig_ms = (unsigned)v;
			break;
		case OPT_SEED:
			if (!parse_num(optarg, 0, UINT64_MAX, &v))
				return usage_error("--seed wants an unsigned integer, not '%s'",
				                   optarg);
			o->seed = v;
			*seeded = true;
			break;
		case OPT_SPAWN:
			if (optarg[0] == 0)
				return usage_error("--spawn wants a directory");
			o->spawn_dir = optarg;
			break;
		case OPT_SERVERS:
			if (!parse_num(optarg, 1, 8, &v))
				return usage_error("--servers wants 1 to 8, not '%s'", optarg);
			o->servers = (unsigned)v;
			break;
		case OPT_KILL:
			o->kill = true;
			break;
		case OPT_KILL_INTERVAL:
			if (!parse_num(optarg, 100, 3600000, &v))
				return usage_error(
				    "--kill-interval wants 100 to 3600000 milliseconds, not '%s'",
				    optarg);
			o->kill_ms = (unsigned)v;
			break;
		case OPT_KILL_AT_HANDOVER:
			o->kill_handover = true;
			break;
		case OPT_PAUSE:
			if (!parse_num(optarg, 100, 600000, &v))
				return usage_error(
				    "--pause wants 100 to 600000 milliseconds, not '%s'", optarg);
			o->pause_ms = (unsigned)v;
			break;
		case OPT_PAUSE_INTERVAL:
		case OPT_FAULT_INTERVAL:
			if (!parse_num(optarg, 100, 3600000, &v))
				return usage_error("%s wants 100 to 3600000 milliseconds, not '%s'",
				                   argv[optind - 1], optarg);
			*(ch == OPT_PAUSE_INTERVAL ? &o->pause_iv_ms : &o->fault_iv_ms) =
			    (unsigned)v;
			break;
		case OPT_KILL_NO_RESTART:
			o->kill_no_restart = true;
			break;
		case OPT_WIPE:
			o->wipe = true;
			break;
		case OPT_REPLICAS:
			if (!parse_num(optarg, 1, 9, &v))
				return usage_error("--replicas wants 1 to 9, not '%s'", optarg);
			o->replicas = (unsigned)v;
			break;
		case OPT_SPLIT_BYTES: {
			size_t l = strlen(optarg), d = strspn(optarg, "0123456789");
			bool sfx = d + 1 == l && strchr("kmgKMG", optarg[d]) != NULL;
			if (d == 0 || d > 12 || (d != l && !sfx) || strspn(optarg, "0") == d)
				return usage_error(
				    "--split-bytes wants a size such as 65536 or 256k, "
				    "not '%s'",
				    optarg);
			o->split_bytes = optarg;
			break;
		}
		case OPT_CONTROLLERS:
			if (!parse_num(optarg, 1, CHK_MAX_CTLS, &v))
				return usage_error("--controllers wants 1 to 5, not '%s'", optarg);
			o->nctl = (unsigned)v;
			break;
		case OPT_KILL_CTL_FO:
			o->kill_ctl_failover = true;
			break;
		case OPT_KILL_CTL:
			o->kill_ctl = true;
			break;
		case OPT_HISTORY:
		case OPT_CHECK:
			if (optarg[0] == 0)
				return usage_error("%s wants a file name", argv[optind - 1]);
			*(ch == OPT_HISTORY ? &o->history : &o->check) = optarg;
			break;
		case OPT_FSYNC:
			if (strcmp(optarg, "always") != 0 && strcmp(optarg, "batch") != 0 &&
			    strcmp(optarg, "none") != 0)
				return usage_error("--fsync wants always, batch or none, not '%s'",
				                   optarg);
			o->fsync = optarg;
			break;
		case OPT_NO_RECONFIG:
			o->no_reconfig = true;
			break;
		case OPT_JSON:
			o->json = true;
			break;
		case OPT_KEEP:
			o->keep = true;
			break;
		case OPT_OP_TIMEOUT:
			if (!parse_num(optarg, 1, 600000, &v))
				return usage_error("--op-timeout wants milliseconds, not '%s'",
				                   optarg);
			o->op_timeout_ms = (unsigned)v;
			break;
		case OPT_MAX_OPS:
			if (!parse_num(optarg, 1, 100000000, &v))
				return usage_error("--max-ops wants 1 to 100000000, not '%s'",
				                   optarg);
			o->max_ops = (size_t)v;
			break;
		case OPT_FILL:
			if (!parse_num(optarg, 0, 10000000, &v))
				return usage_error("--fill wants 0 to 10000000 keys, not '%s'",
				                   optarg);
			o->fill = (unsigned)v;
			break;
		case OPT_FILL_SIZE:
			if (!parse_num(optarg, 0, 1 << 20, &v))
				return usage_error("--fill-size wants 0 to 1048576 bytes, not '%s'",
				                   optarg);
			o->fill_size = (unsigned)v;
			break;
		case OPT_MULTI:
			if (!parse_num(optarg, 0, CHK_MAX_GROUPS, &v))
				return usage_error("--multi wants 0 to %d groups, not '%s'",
				                   CHK_MAX_GROUPS, optarg);
			o->groups = (unsigned)v;
			break;
		case OPT_ASYNC:
			if (!parse_num(optarg, 0, CHK_MAX_ASYNC, &v))
				return usage_error("--async wants 0 to %d, not '%s'", CHK_MAX_ASYNC,
				                   optarg);
			o->async = (unsigned)v;
			break;
		case OPT_HANDLES:
			if (!parse_num(optarg, 1, CHK_MAX_HANDLES, &v))
				return usage_error("--handles wants 1 to %d, not '%s'",
				                   CHK_MAX_HANDLES, optarg);
			o->handles = (unsigned)v;
			break;
		case OPT_HOT:
			if (!parse_num(optarg, 0, 100, &v))
				return usage_error("--hot wants 0 to 100, not '%s'", optarg);
			o->hot_pct = (unsigned)v;
			break;
		case OPT_MOVE_RATE:
			if (!parse_num(optarg, 0, 100000, &v))
				return usage_error("--move-rate wants MB/s, not '%s'", optarg);
			o->move_rate = (unsigned)v;
			break;
		case OPT_DELETES:
		case OPT_SCANS:
		case OPT_CAS:
			if (!parse_num(optarg, 0, 100, &v))
				return usage_error("%s wants 0 to 100, not '%s'", argv[optind - 1],
				                   optarg);
			*(ch == OPT_DELETES ? &o->del_pct
			  : ch == OPT_SCANS ? &o->scan_pct
			                    : &o->cas_pct) = (unsigned)v;
			break;
		case OPT_SCAN_LIMIT:
			if (!parse_num(optarg, 1, 100000, &v))
				return usage_error("--scan-limit wants 1 to 100000, not '%s'",
				                   optarg);
			o->scan_limit = (unsigned)v;
			break;
		case 'v':
			o->verbose = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case ':':
			return usage_error("%s needs a value", argv[optind - 1]);
		default:
			return usage_error("unknown option '%s'", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return usage_error("unexpected argument '%s'", argv[optind]);
	if (o->tls_cert == NULL && getenv("SHARDKV_TLS_CERT") && getenv("SHARDKV_TLS_CERT")[0])
		o->tls_cert = getenv("SHARDKV_TLS_CERT");
	if (o->tls_key == NULL && getenv("SHARDKV_TLS_KEY") && getenv("SHARDKV_TLS_KEY")[0])
		o->tls_key = getenv("SHARDKV_TLS_KEY");
	if (o->tls_ca == NULL && getenv("SHARDKV_TLS_CA") && getenv("SHARDKV_TLS_CA")[0])
		o->tls_ca = getenv("SHARDKV_TLS_CA");
	if ((o->tls_cert || o->tls_key || o->tls_ca) && o->spawn_dir)
		return usage_error("TLS (--tls-*) works with -c only: --spawn starts plain "
		                   "tcp:// daemons");
	if (o->spawn_dir && o->controllers)
		return usage_error("-c and --spawn exclude each other");
	if (o->check && (o->spawn_dir || o->controllers || o->history))
		return usage_error("--check reads a history: no -c, --spawn or --history with it");
	if (o->kill && !o->spawn_dir)
		return usage_error("--kill needs --spawn");
	if (o->kill_ms && !o->spawn_dir)
		return usage_error("--kill-interval needs --spawn");
	if (o->kill_handover && !o->kill_ms)
		return usage_error("--kill-at-handover needs --kill-interval");
	if (o->fsync && !o->spawn_dir)
		return usage_error("--fsync needs --spawn");
	if (o->nctl > 1 && !o->spawn_dir)
		return usage_error("--controllers needs --spawn");
	if (o->kill_ctl && o->nctl < 3)
		return usage_error("--kill-controller needs --controllers 3 or more");
	if (o->kill_ctl_failover && (o->nctl < 3 || (!o->kill_no_restart && !o->wipe)))
		return usage_error(
		    "--kill-controller-in-failover needs --controllers 3 or more and "
		    "--kill-no-restart or --wipe");
	if ((o->pause_ms || o->pause_iv_ms) && !o->spawn_dir)
		return usage_error("--pause needs --spawn");
	if (o->pause_iv_ms && !o->pause_ms)
		return usage_error("--pause-interval needs --pause");
	if (o->pause_ms && o->pause_iv_ms == 0)
		o->pause_iv_ms = o->pause_ms > 1800000u ? 3600000u : 2 * o->pause_ms;
	if (o->replicas && !o->spawn_dir)
		return usage_error("--replicas needs --spawn");
	if (o->split_bytes && !o->spawn_dir)
		return usage_error("--split-bytes needs --spawn");
	/* The spawned controller's own default (doc/contract.md §2), passed on
	 * so that the driver knows it (1 if that controller has no --replicas). */
	if (o->spawn_dir && o->replicas == 0) {
		o->replicas = 3;
		o->replicas_default = true;
	}
	if ((o->kill_no_restart || o->wipe || o->fault_iv_ms) && !o->spawn_dir)
		return usage_error("--kill-no-restart, --wipe and --fault-interval need --spawn");
	if (o->fault_iv_ms && !o->kill_no_restart && !o->wipe)
		return usage_error("--fault-interval needs --kill-no-restart or --wipe");
	const char *ocf = getenv("SHARDKV_CHECKER_ONE_COPY_FAULTS");
	o->one_copy_faults = ocf && strcmp(ocf, "1") == 0 && (o->kill_no_restart || o->wipe);
	if (o->one_copy_faults && o->replicas <= 1)
		fprintf(stderr,
		        "shardkv-checker: SHARDKV_CHECKER_ONE_COPY_FAULTS=1: %s with one copy per "
		        "range: the node's ranges are removed with --accept-data-loss, so the run "
		        "is expected to report lost writes\n",
		        o->kill_no_restart ? "--kill-no-restart" : "--wipe");
	else if ((o->kill_no_restart || o->wipe) && o->replicas <= 1)
		return usage_error(
		    "%s needs ranges with more than one copy (--replicas 2 or more): with one "
		    "copy a node killed for good (or wiped) simply takes its ranges' data with it, "
		    "which the history would show as lost writes, not as a fault handled",
		    o->kill_no_restart ? "--kill-no-restart" : "--wipe");
	if (o->fault_iv_ms == 0)
		o->fault_iv_ms = 10000;
	return 0;
}

/* Waits until the server at url is an active node of the configuration
 * and nothing moves. */
static int
wait_active(shardkv_client *admin, chk_cluster *cl, int i)
{
	uint64_t t0 = chk_now_ns();

	while (chk_now_ns() - t0 < (uint64_t)START_MS * 1000000u && !chk_stop_requested) {
		shardkv_config *cfg = NULL;
		bool ok = false;
		if (shardkv_config_get(admin, 0, &cfg) == 0) {
			for (size_t k = 0; k < cfg->nnodes; k++)
				ok |= strcmp(cfg->nodes[k].address, cl->srv[i].url) == 0 &&
				      cfg->nodes[k].state == SHARDKV_NODE_ACTIVE;
			ok &= cfg->nmigrations == 0;
			shardkv_config_free(cfg);
		}
		if (ok)
			return 0;
		if (chk_cluster_poll_exit(cl, i)) {
			fprintf(stderr, "checker: server %s exited at start\n", cl->srv[i].url);
			kv_proc_print_log_tail(cl->srv[i].log, 20);
			return -1;
		}
		struct timespec ts = {0, 20000000};
		nanosleep(&ts, NULL);
	}
	fprintf(stderr, "checker: server %s not active after %u ms\n", cl->srv[i].url, START_MS);
	kv_proc_print_log_tail(cl->srv[i].log, 20);
	return -1;
}

/* Waits until no migration is in flight. Returns how many still are. */
static size_t
wait_settled(shardkv_client *admin, unsigned ms)
{
	uint64_t t0 = chk_now_ns();
	size_t last = 0;

	while (chk_now_ns() - t0 < (uint64_t)ms * 1000000u) {
		shardkv_config *cfg = NULL;
		if (shardkv_config_get(admin, 0, &cfg) == 0) {
			last = cfg->nmigrations;
			shardkv_config_free(cfg);
			if (last == 0)
				return 0;
		}
		struct timespec ts = {0, 50000000};
		nanosleep(&ts, NULL);
	}
	return last;
}

static void
json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20 || ch >= 0x7f)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

/* Everything the summary reports. */
typedef struct {
	uint64_t seed;              /* the seed */
	double seconds;             /* how long the load ran */
	size_t nops;                /* operations recorded */
	uint64_t failed;            /* of which failed */
	const uint64_t *errs;       /* failed by -err */
	const chk_driver_stats *ds; /* the driver's counters */
	const chk_result *res;      /* the check */
	const chk_key *keys;        /* for the violations */
	size_t unsettled;           /* migrations in flight after the settle wait */
	size_t unread;              /* keys the final reads could not read */
	const char *dir;            /* the spawned cluster's directory, or NULL */
	chk_workload_more more;     /* indeterminate ops, multi-key and async counts */
	size_t failed_puts_seen;    /* failed puts that a read saw */
	chk_pause_check pc;         /* --pause: the operations on the paused servers' keys */
} summary;

static int
u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* How many failed puts (indeterminate) some read saw: those took effect
 * although the client gave up on them (a late apply, or a lost answer). */
static size_t
failed_puts_seen(const chk_op *ops, size_t nops)
{
	uint64_t *v = malloc((nops + 1) * sizeof(*v));
	bool *seen;
	size_t n = 0, count = 0;

	if (v == NULL)
		return 0;
	for (size_t i = 0; i < nops; i++)
		if (ops[i].kind == CHK_PUT && ops[i].status == CHK_FAILED)
			v[n++] = ops[i].val;
	qsort(v, n, sizeof(*v), u64_cmp);
	if ((seen = calloc(n + 1, sizeof(*seen))) == NULL) {
		free(v);
		return 0;
	}
	for (size_t i = 0; i < nops && n; i++) {
		if (ops[i].kind != CHK_GET || ops[i].status != CHK_OK || ops[i].val == 0)
			continue;
		uint64_t *p = bsearch(&ops[i].val, v, n, sizeof(*v), u64_cmp);
		if (p != NULL && !seen[p - v]) {
			seen[p - v] = true;
			count++;
		}
	}
	free(seen);
	free(v);
	return count;
}

/* The time window of a violation's operations; false when it names none. */
static bool
violation_window(const chk_op *ops, size_t nops, const chk_violation *v, uint64_t *lo, uint64_t *hi)
{
	size_t idx[2] = {v->op, v->other};

	*lo = UINT64_MAX;
	*hi = 0;
	for (int j = 0; j < 2; j++) {
		if (idx[j] >= nops)
			continue;
		const chk_op *o = &ops[idx[j]];
		uint64_t end = o->complete == CHK_NEVER ? o->ret : o->complete;
		*lo = o->invoke < *lo ? o->invoke : *lo;
		*hi = end > *hi ? end : *hi;
	}
	return *lo != UINT64_MAX;
}

/* Prints a violation, its history and the nemesis events around it. */
static void
show_violation(const chk_key *keys, const chk_op *ops, size_t nops, const chk_violation *v,
               uint64_t t0, const chk_nemesis *nem, size_t nnem)
{
	uint64_t lo, hi;

	chk_print_violation(stderr, keys, ops, nops, v, t0, 24);
	if (nnem && violation_window(ops, nops, v, &lo, &hi))
		chk_print_nemesis(stderr, nem, nnem, lo, hi, t0, 16);
}

/* Checks the history in file `path` (--check). Returns the exit code. */
static int
check_file(const char *path)
{
	FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "r");
	chk_histfile *h = NULL;
	chk_result res;
	char err[512];

	if (f == NULL) {
		fprintf(stderr, "shardkv-checker: cannot open %s: %s\n", path, strerror(errno));
		return 2;
	}
	int rv = chk_histfile_read(f, &h, err, sizeof(err));
	if (f != stdin)
		fclose(f);
	if (rv != 0) {
		fprintf(stderr, "shardkv-checker: %s: %s\n", path,
		        rv == -2 ? "out of memory" : err);
		return 2;
	}
	const chk_key *keys;
	const chk_op *ops;
	size_t nkeys, nops;
	chk_histfile_history(h, &keys, &nkeys, &ops, &nops);
	if (chk_check(keys, nkeys, ops, nops, &res) != 0) {
		fprintf(stderr, "shardkv-checker: out of memory while checking\n");
		chk_histfile_free(h);
		return 2;
	}
	const chk_nemesis *nem;
	size_t nnem;
	chk_histfile_nemesis(h, &nem, &nnem);
	for (size_t i = 0; i < res.nkept && i < SHOW_MAX; i++) {
		const chk_violation *v = &res.v[i];
		show_violation(keys, ops, nops, v, 0, nem, nnem);
		if (v->op < nops && v->other < nops)
			fprintf(stderr, "  (lines %zu and %zu of %s)\n",
			        chk_histfile_line(h, v->op), chk_histfile_line(h, v->other), path);
		else if (v->op < nops || v->other < nops)
			fprintf(stderr, "  (line %zu of %s)\n",
			        chk_histfile_line(h, v->op < nops ? v->op : v->other), path);
		fputc('\n', stderr);
	}
	if (res.registers_unchecked)
		printf("%zu registers with deletes not checked: their search hit its bound\n",
		       res.registers_unchecked);
	printf("%zu operations on %zu keys, %zu reads checked, %zu mgets checked, %zu nemesis "
	       "events, %zu violations (values are shown by identity, c1.N, in the order the "
	       "file first wrote them)\n",
	       nops, nkeys, res.reads_checked, res.mgets_checked, nnem, res.nviolations);
	chk_histfile_free(h);
	return res.nviolations ? 1 : 0;
}

/* Writes the run's history (--history, or the default path, which goes to
 * path[0..cap) when written; empty otherwise). A failure to write it is
 * reported, not fatal: the run is still checked. */
static void
write_history(const chk_opts *o, const chk_cluster *cl, chk_workload *w, const chk_key *keys,
              size_t nkeys, const chk_op *ops, size_t nops, const chk_nemesis *nem, size_t nnem,
              char *written, size_t cap)
{
	char path[4200];

	written[0] = '\0';
	if (o->history)
		snprintf(path, sizeof(path), "%s", o->history);
	else if (cl)
		snprintf(path, sizeof(path), "%s/history-%" PRIu64 ".jsonl", o->spawn_dir, o->seed);
	else
		snprintf(path, sizeof(path), "shardkv-history-%" PRIu64 ".jsonl", o->seed);
	FILE *f = fopen(path, "w");
	const chk_scan *scans = NULL;
	size_t nscans = 0;
	if (w)
		chk_workload_scans(w, &scans, &nscans);
	if (f == NULL ||
	    chk_histfile_write(f, keys, nkeys, ops, nops, scans, nscans, nem, nnem) != 0 ||
	    fclose(f) != 0) {
		fprintf(stderr, "checker: cannot write the history to %s: %s\n", path,
		        strerror(errno));
		return;
	}
	chk_log("history written to %s", path);
	if (!o->history)
		snprintf(written, cap, "%s", path);
}

static void
print_json(const summary *s)
{
	FILE *f = stdout;
	const chk_driver_stats *d = s->ds;

	fprintf(f,
	        "{\"seed\": %" PRIu64 ", \"duration_s\": %.1f, \"reconfigurations\": %" PRIu64
	        ", \"operations\": %zu, \"violations\": %zu, \"failed_operations\": %" PRIu64,
	        s->seed, s->seconds, d->reconfigs, s->nops, s->res->nviolations, s->failed);
	fprintf(f,
	        ", \"steps\": {\"moves\": %" PRIu64 ", \"rebalances\": %" PRIu64
	        ", \"joins\": %" PRIu64 ", \"leaves\": %" PRIu64 ", \"kills\": %" PRIu64
	        ", \"restarts\": %" PRIu64 ", \"noops\": %" PRIu64 ", \"busy\": %" PRIu64
	        ", \"failed\": %" PRIu64 ", \"waited\": %" PRIu64 ", \"wait_timeouts\": %" PRIu64
	        ", \"migrations\": %" PRIu64 ", \"controller_kills\": %" PRIu64
	        ", \"kills_in_log\": %" PRIu64 ", \"kills_at_handover\": %" PRIu64 "}",
	        d->moves, d->rebalances, d->joins, d->leaves, d->kills, d->restarts, d->noops,
	        d->busy, d->failed, d->waited, d->wait_timeouts, d->migrations, d->ctl_kills,
	        d->kills_in_log, d->kills_at_handover);
	fprintf(f,
	        ", \"appends_acked\": %zu, \"appends_failed\": %zu, \"appends_failed_applied\": "
	        "%zu, \"tokens\": %zu, \"reads_checked\": %zu, \"puts_acked\": %zu, "
	        "\"puts_failed\": %zu, \"crashes\": %" PRIu64
	        ", \"unsettled_migrations\": %zu, \"unread_keys\": %zu",
	        s->res->appends_acked, s->res->appends_failed, s->res->appends_failed_applied,
	        s->res->tokens, s->res->reads_checked, s->res->writes_acked, s->res->writes_failed,
	        d->crashes, s->unsettled, s->unread);
	fprintf(f,
	        ", \"indeterminate_operations\": %" PRIu64 ", \"timeouts\": %" PRIu64
	        ", \"mputs\": %" PRIu64 ", \"mgets\": %" PRIu64 ", \"mgets_checked\": %zu"
	        ", \"multi_skipped\": %" PRIu64 ", \"gate_leaks\": %" PRIu64
	        ", \"multi_not_atomic\": %" PRIu64 ", \"async_operations\": %" PRIu64
	        ", \"hot_operations\": %" PRIu64 ", \"failed_puts_seen\": %zu",
	        s->more.indeterminate, s->more.timeouts, s->more.mputs, s->more.mgets,
	        s->res->mgets_checked, s->more.mk_skipped, d->gate_leaks, s->more.mk_loose,
	        s->more.async_ops, s->more.hot_ops, s->failed_puts_seen);
	fprintf(f,
	        ", \"deletes\": %" PRIu64 ", \"deletes_acked\": %zu, \"deletes_failed\": %zu"
	        ", \"scans\": %" PRIu64 ", \"registers_searched\": %zu"
	        ", \"registers_unchecked\": %zu",
	        s->more.dels, s->res->deletes_acked, s->res->deletes_failed, s->more.scans,
	        s->res->registers_searched, s->res->registers_unchecked);
	fprintf(f,
	        ", \"cas\": %" PRIu64 ", \"cas_applied\": %zu, \"cas_mismatched\": %zu"
	        ", \"cas_failed\": %zu",
	        s->more.cas, s->res->cas_applied, s->res->cas_mismatched, s->res->cas_failed);
	fprintf(f,
	        ", \"faults\": {\"pauses\": %" PRIu64 ", \"paused_down\": %" PRIu64
	        ", \"paused_back\": %" PRIu64 ", \"paused_keys\": %" PRIu64
	        ", \"acked_while_stopped\": %" PRIu64 ", \"held_over_pause\": %" PRIu64
	        ", \"failed_while_paused\": %" PRIu64 ", \"unavailable_while_paused\": %" PRIu64
	        ", \"served_again\": %" PRIu64 ", \"back_ms_max\": %" PRIu64
	        ", \"killed_for_good\": %" PRIu64 ", \"removed\": %" PRIu64
	        ", \"replacements\": %" PRIu64 ", \"failover_controller_kills\": %" PRIu64
	        ", \"failover_controller_kills_before_down\": %" PRIu64
	        ", \"failovers_unfinished\": %" PRIu64 "}",
	        d->pauses, d->pause_downs, d->pause_backs, s->pc.keys, s->pc.acked_paused,
	        s->pc.held, s->pc.failed, s->pc.unavailable, s->pc.served_again, s->pc.back_ms_max,
	        d->dead_kills, d->removes, d->replacements, d->fo_ctl_kills, d->fo_ctl_before_down,
	        d->fo_unfinished);
	fprintf(f, ", \"errors\": {");
	bool first = true;
	for (int e = 0; e < 32; e++)
		if (s->errs[e]) {
			fprintf(f, "%s\"%s\": %" PRIu64, first ? "" : ", ",
			        e ? shardkv_strerror(-e) : "other", s->errs[e]);
			first = false;
		}
	fprintf(f, "}, \"first_violations\": [");
	for (size_t i = 0; i < s->res->nkept; i++) {
		const chk_violation *v = &s->res->v[i];
		fprintf(f, "%s{\"kind\": ", i ? ", " : "");
		json_str(f, chk_violation_name(v->kind));
		fprintf(f, ", \"key\": ");
		json_str(f, s->keys[v->key].name);
		fprintf(f, ", \"message\": ");
		json_str(f, v->msg);
		fprintf(f, "}");
	}
	fprintf(f, "]");
	if (s->dir) {
		fprintf(f, ", \"dir\": ");
		json_str(f, s->dir);
	}
	fprintf(f, "}\n");
}

static void
print_text(const summary *s)
{
	const chk_driver_stats *d = s->ds;
	const chk_result *r = s->res;
	FILE *f = stdout;

	fprintf(f,
	        "seed %" PRIu64 ", %.1f s: %" PRIu64 " moves, %" PRIu64 " rebalances, %" PRIu64
	        " joins, %" PRIu64 " leaves, %" PRIu64 " kills (%" PRIu64
	        " in a log write, %" PRIu64 " at a handover), %" PRIu64
	        " controller leader kills (%" PRIu64 " restarts); %" PRIu64 " migrations; %" PRIu64
	        " steps waited; %" PRIu64 " busy, %" PRIu64 " failed, %" PRIu64 " no-op steps\n",
	        s->seed, s->seconds, d->moves, d->rebalances, d->joins, d->leaves, d->kills,
	        d->kills_in_log, d->kills_at_handover, d->ctl_kills, d->restarts, d->migrations,
	        d->waited, d->busy, d->failed, d->noops);
	fprintf(f,
	        "appends: %zu acknowledged, %zu failed (%zu of them applied), %zu tokens; puts: "
	        "%zu acknowledged, %zu failed; %zu reads checked\n",
	        r->appends_acked, r->appends_failed, r->appends_failed_applied, r->tokens,
	        r->writes_acked, r->writes_failed, r->reads_checked);
	fprintf(f,
	        "multi-key: %" PRIu64 " mputs, %" PRIu64 " mgets (%zu checked), %" PRIu64
	        " skipped at the gate, %" PRIu64 " gate leaks (%" PRIu64
	        " parts not atomic); %" PRIu64 " async ops, %" PRIu64 " ops on moving keys\n",
	        s->more.mputs, s->more.mgets, r->mgets_checked, s->more.mk_skipped, d->gate_leaks,
	        s->more.mk_loose, s->more.async_ops, s->more.hot_ops);
	fprintf(f,
	        "deletes: %zu returned, %zu failed; %" PRIu64 " scans; %zu registers with "
	        "deletes searched, %zu cut off at the bound (unchecked)\n",
	        r->deletes_acked, r->deletes_failed, s->more.scans, r->registers_searched,
	        r->registers_unchecked);
	if (s->more.cas)
		fprintf(f,
		        "cas: %" PRIu64 " issued, %zu applied, %zu refused (the value differed), "
		        "%zu of unknown outcome\n",
		        s->more.cas, r->cas_applied, r->cas_mismatched, r->cas_failed);
	fprintf(f,
	        "indeterminate operations: %" PRIu64 " (failed writes; %zu failed puts and %zu "
	        "failed appends took effect); %" PRIu64 " timeouts\n",
	        s->more.indeterminate, s->failed_puts_seen, r->appends_failed_applied,
	        s->more.timeouts);
	if (s->failed) {
		fprintf(f, "failed operations: %" PRIu64 " (", s->failed);
		bool first = true;
		for (int e = 0; e < 32; e++)
			if (s->errs[e]) {
				fprintf(f, "%s%s: %" PRIu64, first ? "" : ", ",
				        e ? shardkv_strerror(-e) : "other", s->errs[e]);
				first = false;
			}
		fprintf(f, ")\n");
	}
	if (d->pauses)
		fprintf(f,
		        "pauses: %" PRIu64 " (node seen down %" PRIu64
		        " times, active again %" PRIu64 "); on %" PRIu64
		        " keys of paused servers: %" PRIu64
		        " operations succeeded while stopped, %" PRIu64
		        " begun then succeeded after SIGCONT, %" PRIu64 " failed (%" PRIu64
		        " unavailable); served again after %" PRIu64 " pauses, at most %" PRIu64
		        " ms after SIGCONT\n",
		        d->pauses, d->pause_downs, d->pause_backs, s->pc.keys, s->pc.acked_paused,
		        s->pc.held, s->pc.failed, s->pc.unavailable, s->pc.served_again,
		        s->pc.back_ms_max);
	if (d->dead_kills)
		fprintf(f,
		        "servers killed for good or wiped: %" PRIu64 "; %" PRIu64
		        " nodes removed, %" PRIu64 " servers joined in their place\n",
		        d->dead_kills, d->removes, d->replacements);
	if (d->fo_ctl_kills || d->fo_unfinished)
		fprintf(f,
		        "controller leaders killed in a failover: %" PRIu64 " (%" PRIu64
		        " before the node was seen down); failovers left unfinished: %" PRIu64 "\n",
		        d->fo_ctl_kills, d->fo_ctl_before_down, d->fo_unfinished);
	if (d->crashes)
		fprintf(
		    f, "%" PRIu64 " daemon crashes or exits without draining (see the log above)\n",
		    d->crashes);
	if (d->wait_timeouts)
		fprintf(f, "%" PRIu64 " --wait steps did not finish within %u ms\n",
		        d->wait_timeouts, ADMIN_MS);
	if (s->unsettled)
		fprintf(f, "%zu migrations still in flight %u ms after the load stopped\n",
		        s->unsettled, SETTLE_MS);
	if (s->unread)
		fprintf(f,
		        "%zu keys could not be read back: their appends are checked against "
		        "their longest read only\n",
		        s->unread);
	fprintf(f, "%" PRIu64 " reconfigurations, %zu operations, %zu violations\n", d->reconfigs,
	        s->nops, r->nviolations);
}

int
main(int argc, char **argv)
{
	chk_opts o = {.clients = 4,
	              .keys = 16,
	              .duration_s = 30,
	              .reconfig_ms = 400,
	              .servers = 3,
	              .op_timeout_ms = 5000,
	              .max_ops = CHK_DEFAULT_OPS,
	              .fill_size = 1000,
	              .handles = 1,
	              .hot_pct = 50,
	              .del_pct = 5,
	              .scan_limit = 100};
	chk_cluster *cl = NULL;
	shardkv_client *admin = NULL;
	char hist[4200] = ""; /* the history's default path, once written */
	chk_workload *w = NULL;
	chk_driver *d = NULL;
	chk_result res;
	bool seeded;
	int rc = 3;
	char prefix[64];

	if (kv_version_requested(argc, argv)) {
		kv_version_print(stdout, "shardkv-checker");
		return 0;
	}
	chk_log_start();
	if ((rc = parse_opts(argc, argv, &o, &seeded)) != 0)
		return rc;
	if (o.check)
		return check_file(o.check);
	rc = 3;
	if (!seeded) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		o.seed =
		    ((uint64_t)ts.tv_sec * 1000003u) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid();
		o.seed %= 1000000000u;
	}
	chk_install_signals();

	/* The cluster. */
	int crv = 0;
	const char *controllers = o.controllers;
	if (o.spawn_dir) {
		if ((cl = calloc(1, sizeof(*cl))) == NULL ||
		    (crv = chk_cluster_create(cl, o.spawn_dir, o.fsync, o.split_bytes, o.nctl,
		                              o.replicas)) != 0) {
			/* A controller from before --replicas keeps one copy. */
			if (crv == -2 && o.replicas_default && !o.kill_no_restart && !o.wipe) {
				o.replicas = 1;
				crv = chk_cluster_create(cl, o.spawn_dir, o.fsync, o.split_bytes,
				                         o.nctl, 0);
			}
			if (crv == -2)
				rc = 2;
			if (crv != 0)
				goto out;
		}
		controllers = cl->ctl_url;
	} else if (controllers == NULL) {
		controllers = getenv("SHARDKV_CONTROLLER");
		if (controllers == NULL || controllers[0] == 0)
			controllers = "tcp://127.0.0.1:7000";
	}
	shardkv_options ao = {.timeout_ms = ADMIN_MS,
	                      .no_watch = true,
	                      .tls_cert = o.tls_cert,
	                      .tls_key = o.tls_key,
	                      .tls_ca = o.tls_ca};
	if (shardkv_open(controllers, &ao, &admin) != 0) {
		fprintf(stderr, "checker: cannot open a client on %s: %s\n", controllers,
		        shardkv_errmsg());
		goto out;
	}
	if (cl) {
		for (unsigned i = 0; i < o.servers; i++) {
			int k = chk_cluster_add_server(cl, true);
			if (k < 0 || wait_active(admin, cl, k) != 0)
				goto out;
		}
		chk_log("cluster of %u servers up in %s (controller %s)", o.servers, cl->dir,
		        cl->ctl_url);
	} else {
		shardkv_config *cfg = NULL;
		shardkv_set_timeout(admin, 5000);
		int rv = shardkv_config_get(admin, 0, &cfg);
		if (rv != 0) {
			fprintf(stderr, "checker: cannot reach the cluster at %s: %s (%s)\n",
			        controllers, shardkv_strerror(rv), shardkv_errmsg());
			goto out;
		}
		chk_log("cluster at %s: epoch %" PRIu64 ", %zu nodes", controllers, cfg->epoch,
		        cfg->nnodes);
		shardkv_config_free(cfg);
		shardkv_set_timeout(admin, ADMIN_MS);
	}

	/* A key prefix of this run, so runs against one cluster never mix. */
	chk_rng pr = {o.seed ^ chk_now_ns() ^ ((uint64_t)getpid() << 20)};
	snprintf(prefix, sizeof(prefix), "chk-%08" PRIx64 "/", chk_rng_next(&pr) & 0xffffffffu);
	chk_log("seed %" PRIu64
	        ", %u clients, %u keys and %u groups under %s, %.1f s, reconfiguration every ~%u "
	        "ms%s; %u async, %u handles per client, op timeout %u ms",
	        o.seed, o.clients, o.keys, o.groups, prefix, o.duration_s, o.reconfig_ms,
	        o.no_reconfig ? " (off)" : "", o.async, o.handles, o.op_timeout_ms);
	if ((w = chk_workload_create(&o, controllers, prefix)) == NULL ||
	    (d = chk_driver_create(&o, admin, cl, w)) == NULL)
		goto out;

	if (o.fill) {
		uint64_t tf = chk_now_ns();
		int rv = chk_workload_fill(w, admin, o.fill, o.fill_size);
		if (rv != 0) {
			fprintf(stderr, "checker: writing the filler keys failed: %s (%s)\n",
			        shardkv_strerror(rv), shardkv_errmsg());
			goto out;
		}
		chk_log("wrote %u filler keys of %u bytes in %.1f s", o.fill, o.fill_size,
		        (double)(chk_now_ns() - tf) / 1e9);
	}

	/* The run. */
	uint64_t t0 = chk_now_ns();
	uint64_t deadline = t0 + (uint64_t)(o.duration_s * 1e9);
	uint64_t next_progress = t0 + 5000000000u;
	if (chk_workload_start(w, deadline) != 0)
		goto out;
	while (chk_now_ns() < deadline && !chk_stop_requested) {
		unsigned ms = chk_driver_tick(d, true);
		uint64_t now = chk_now_ns();
		if (now >= deadline)
			break;
		if (now >= next_progress) {
			uint64_t n, f;
			chk_workload_counts(w, &n, &f);
			chk_log("%" PRIu64 " operations (%" PRIu64 " failed), %" PRIu64
			        " reconfigurations (%" PRIu64 " busy)",
			        n, f, chk_driver_get_stats(d)->reconfigs,
			        chk_driver_get_stats(d)->busy);
			next_progress = now + 5000000000u;
		}
		if (now + (uint64_t)ms * 1000000u > deadline)
			ms = (unsigned)((deadline - now) / 1000000u) + 1;
		struct timespec ts = {ms / 1000u, (long)(ms % 1000u) * 1000000L};
		nanosleep(&ts, NULL);
	}
	chk_workload_stop(w);
	double seconds = (double)(chk_now_ns() - t0) / 1e9;

	/* Let the cluster come to rest, then read every key back. */
	chk_log("load stopped; waiting for migrations to finish");
	chk_driver_settle_procs(d);
	size_t unsettled = wait_settled(admin, SETTLE_MS);
	chk_driver_settle_procs(d);
	chk_log("reading every key back");
	/* 2 s whatever --op-timeout: with a deadline as short as 150 ms a read
	 * routed by the admin handle's stale cache to a server that has left
	 * can keep failing (unavailable) instead of refreshing the route. */
	shardkv_set_timeout(admin, FINAL_OP_MS);
	size_t unread = chk_workload_final_reads(w, admin, FINAL_READ_MS);
	chk_log("checking the history");

	const chk_key *keys;
	const chk_op *ops;
	size_t nkeys, nops;
	chk_workload_history(w, &keys, &nkeys, &ops, &nops);
	if (ops == NULL || chk_check(keys, nkeys, ops, nops, &res) != 0) {
		fprintf(stderr, "checker: out of memory while checking\n");
		goto out;
	}
	chk_pause_check pc;
	chk_driver_pause_check(d, keys, nkeys, ops, nops, &pc);
	const chk_nemesis *nem;
	size_t nnem;
	chk_driver_nemesis(d, &nem, &nnem);
	write_history(&o, cl, w, keys, nkeys, ops, nops, nem, nnem, hist, sizeof(hist));
	uint64_t n_unused, failed;
	chk_workload_counts(w, &n_unused, &failed);
	summary s = {.seed = o.seed,
	             .seconds = seconds,
	             .nops = nops,
	             .failed = failed,
	             .errs = chk_workload_errors(w),
	             .ds = chk_driver_get_stats(d),
	             .res = &res,
	             .keys = keys,
	             .unsettled = unsettled,
	             .unread = unread,
	             .dir = cl && (o.keep || res.nviolations) ? cl->dir : NULL};
	chk_workload_more_counts(w, &s.more);
	s.pc = pc;
	s.failed_puts_seen = failed_puts_seen(ops, nops);
	for (size_t i = 0; i < res.nkept && i < SHOW_MAX; i++) {
		show_violation(keys, ops, nops, &res.v[i], t0, nem, nnem);
		fputc('\n', stderr);
	}
	if (res.nviolations > SHOW_MAX)
		fprintf(stderr, "... and %zu more violations\n", res.nviolations - SHOW_MAX);
	if (cl) {
		for (int i = 0; i < cl->nservers; i++)
			if (cl->srv[i].crashed)
				kv_proc_print_log_tail(cl->srv[i].log, 30);
	}
	if (o.json)
		print_json(&s);
	else
		print_text(&s);
	if (res.nviolations || s.ds->crashes || pc.acked_paused || s.ds->fo_unfinished)
		rc = 1;
	else if (unread)
		rc = 3;
	else
		rc = 0;
out:
	if (cl && cl->dir[0] && (rc != 0 || o.keep)) {
		/* The default history is named by the seed only: kept beside the
		 * cluster's logs, a failed run's is not overwritten by the next
		 * run of the same seed. */
		char kept[4300];
		snprintf(kept, sizeof(kept), "%s/history.jsonl", cl->dir);
		if (rc != 0 && hist[0] != '\0' && rename(hist, kept) == 0)
			fprintf(stderr, "checker: the history is kept as %s\n", kept);
		fprintf(stderr, "checker: the cluster's data and logs are kept in %s\n", cl->dir);
	}
	if (o.verbose)
		chk_log("stopping");
	/* The driver first: it lifts its multi-key gate in the workload. */
	chk_driver_destroy(d);
	chk_workload_destroy(w);
	shardkv_close(admin);
	if (cl) {
		chk_cluster_destroy(cl, rc == 0 && !o.keep);
		free(cl);
	}
	if (o.verbose)
		chk_log("done");
	return rc;
}
