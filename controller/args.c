/*
 * args.c - the shardkv-controller command line (controller.h:
 * kv_controller_parse_args), apart from main so that it can be tested and
 * fuzzed without starting a controller. Nothing is opened or read here: the
 * files named by flags are read by kv_controller_create.
 */
#include "common/err.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/config.h"
#include "common/tls.h"
#include "controller/controller.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char kv_controller_usage[] =
    "usage: shardkv-controller --listen ADDR --data-dir DIR [--metrics HOSTPORT]\n"
    "                          [--auth-token-file F] [--tls-cert F --tls-key F --tls-ca F]\n"
    "                          [--id I --peers ADDR1,ADDR2,ADDR3 [--raft-peers H:P,...]\n"
    "                           [--snapshot-threshold N] [--election-timeout MS]]\n"
    "                          [--down-after SECONDS] [--replicas R [--min-insync M]]\n"
    "                          [--auto-balance on|off] [--split-bytes N] [--split-ops N]\n"
    "                          [--max-migrations K]\n"
    "                          [--log-level debug|info|warn|error|off] [--version] [--help]\n"
    "\n"
    "Keeps the shardkv cluster configuration (nodes, range map, migrations) and\n"
    "serves admin commands, server reports and watches.\n"
    "\n"
    "  --listen ADDR       nng URL to listen on, e.g. tcp://127.0.0.1:7000\n"
    "  --data-dir DIR      directory of the configuration log (created if missing)\n"
    "  --metrics HOSTPORT  serve Prometheus text at http://HOSTPORT/metrics\n"
    "  --auth-token-file F the cluster's shared secret (the file's bytes, one trailing\n"
    "                      newline cut; at most 4096): every request without it is\n"
    "                      refused, servers' registrations and heartbeats included\n"
    "  --tls-cert F        this controller's certificate (PEM); with --tls-key and\n"
    "                      --tls-ca, needed for a tls+tcp:// --listen\n"
    "  --tls-key F         its private key (PEM, unencrypted)\n"
    "  --tls-ca F          the CA (PEM) every peer's certificate must be signed by:\n"
    "                      clients without such a certificate are refused\n"
    "  --id I              replicated control plane: this replica's number, which\n"
    "                      indexes --peers from 1\n"
    "  --peers LIST        every replica's controller URL, comma-separated, the same\n"
    "                      list and order on every replica (3 or 5; at most 9);\n"
    "                      changes are committed by a majority through Raft\n"
    "  --raft-peers LIST   HOST:PORT each replica's Raft transport listens on, in the\n"
    "                      order of --peers (default: the peer's host and port + 1000);\n"
    "                      plain TCP, also with --tls-*\n"
    "  --snapshot-threshold N  Raft log entries between snapshots (default 256)\n"
    "  --election-timeout MS   Raft election timeout (default 1000)\n"
    "  --down-after S      how long a node may stay down before its replicas get\n"
    "                      replacements on other nodes (default 60, 1 to 86400;\n"
    "                      with --replicas 2 or more)\n"
    "  --replicas R        replicas per range, primary included (1 to 5, default 3):\n"
    "                      ranges gain replicas on nodes that join, and a range whose\n"
    "                      primary is declared down fails over to an in-sync replica\n"
    "  --min-insync M      a write is acknowledged only while the range's in-sync set\n"
    "                      has at least M members (1 to R, default the smaller of 2\n"
    "                      and R); published in every configuration\n"
    "  --auto-balance on|off  move ranges and primaries on its own so that bytes and\n"
    "                      ops/s per node stay even (default on; doc/scheduler.md)\n"
    "  --split-bytes N     largest piece the balancer moves at once, bytes with an\n"
    "                      optional k, m or g (KiB, MiB, GiB) suffix (default 64m)\n"
    "  --split-ops N       ops/s above which a range counts as hot (default 20000)\n"
    "  --max-migrations K  balancer migrations in flight cluster-wide (default 2)\n"
    "  --log-level L       lowest level logged to stderr (default info)\n"
    "  --version           print \"shardkv-controller VERSION [(commit C)]\" and exit\n"
    "  --help              print this text and exit\n";

/* Splits a copy of the comma-separated list s into buf and at most
 * KV_CONTROLLER_MAX_PEERS non-empty items. Returns the count, or 0 for an
 * empty item, too many or a list too long for buf. */
static size_t
split_list(const char *s, char *buf, size_t buflen, const char **out)
{
	size_t n = 0, len = strlen(s);

	if (len >= buflen)
		return 0;
	memcpy(buf, s, len + 1);
	for (char *p = buf;; p++) {
		char *comma = strchr(p, ',');
		if (comma)
			*comma = '\0';
		if (*p == '\0' || n == KV_CONTROLLER_MAX_PEERS)
			return 0;
		out[n++] = p;
		if (comma == NULL)
			return n;
		p = comma;
	}
}

/* Parses a positive decimal no larger than max. */
static bool
parse_uint(const char *s, unsigned long max, unsigned *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || s[0] == '-' || v == 0 || v > max)
		return false;
	*out = (unsigned)v;
	return true;
}

/* Parses a size in bytes with an optional k, m or g suffix (powers of
 * 1024), from 4 KiB to 64 GiB. */
static bool
parse_size(const char *s, uint64_t *out)
{
	char *end;
	unsigned long long v;
	uint64_t mul = 1;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || end == s || s[0] == '-')
		return false;
	if (*end == 'k' || *end == 'K')
		mul = 1024u;
	else if (*end == 'm' || *end == 'M')
		mul = 1024u * 1024u;
	else if (*end == 'g' || *end == 'G')
		mul = 1024u * 1024u * 1024u;
	else if (*end != '\0')
		return false;
	if (mul != 1 && end[1] != '\0')
		return false;
	if (v > (64ull << 30) / mul || v * mul < 4096u)
		return false;
	*out = v * mul;
	return true;
}

/* Copies a into *out, pointing out's lists at its own buffers. */
static void
args_copy(kv_controller_args *out, const kv_controller_args *a)
{
	*out = *a;
	for (size_t i = 0; i < KV_CONTROLLER_MAX_PEERS; i++) {
		if (a->peers[i] != NULL)
			out->peers[i] = out->peers_buf + (a->peers[i] - a->peers_buf);
		if (a->raft_peers[i] != NULL)
			out->raft_peers[i] = out->raft_buf + (a->raft_peers[i] - a->raft_buf);
	}
	out->cfg.peers = a->cfg.peers != NULL ? out->peers : NULL;
	out->cfg.raft_peers = a->cfg.raft_peers != NULL ? out->raft_peers : NULL;
}

int
kv_controller_parse_args(int argc, char **argv, kv_controller_args *out, char *err, size_t errlen)
{
	static const struct option opts[] = {
	    {"listen", required_argument, NULL, 'l'},
	    {"data-dir", required_argument, NULL, 'd'},
	    {"metrics", required_argument, NULL, 'm'},
	    {"log-level", required_argument, NULL, 'v'},
	    {"auth-token-file", required_argument, NULL, 'A'},
	    {"tls-cert", required_argument, NULL, 'C'},
	    {"tls-key", required_argument, NULL, 'K'},
	    {"tls-ca", required_argument, NULL, 'R'},
	    {"id", required_argument, NULL, 'i'},
	    {"peers", required_argument, NULL, 'p'},
	    {"raft-peers", required_argument, NULL, 'r'},
	    {"snapshot-threshold", required_argument, NULL, 's'},
	    {"election-timeout", required_argument, NULL, 'e'},
	    {"down-after", required_argument, NULL, 'D'},
	    {"replicas", required_argument, NULL, 'N'},
	    {"min-insync", required_argument, NULL, 'M'},
	    {"auto-balance", required_argument, NULL, 'B'},
	    {"split-bytes", required_argument, NULL, 'S'},
	    {"split-ops", required_argument, NULL, 'O'},
	    {"max-migrations", required_argument, NULL, 'X'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	kv_controller_args a; /* copied to *out on success only */
	char terr[512];
	size_t nraft = 0;
	unsigned id = 0;
	int o;

	if (argc < 1 || argv == NULL)
		return kv_errf(err, errlen, KV_EINVAL, "no arguments");
	memset(&a, 0, sizeof(a));
	a.level = KV_LOG_INFO;
	a.cfg.auto_balance = true; /* --auto-balance on */
	/* --replicas defaults to 3 (doc/contract.md §2): a range has as many
	 * copies as the nodes that can hold them until enough join. The
	 * embedded controller's 0 stays one copy (controller.h). */
	a.cfg.replicas = 3;
	/* 0, not 1: glibc then starts afresh, so that this can run more than
	 * once in a process (tests, the fuzzer). */
	optind = 0;
	opterr = 0;
	while ((o = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (o) {
		case 'l':
			a.cfg.listen = optarg;
			break;
		case 'd':
			a.cfg.data_dir = optarg;
			break;
		case 'm':
			a.cfg.metrics = optarg;
			break;
		case 'A':
			if (optarg[0] == '\0')
				return kv_errf(err, errlen, KV_EINVAL,
				               "--auth-token-file needs a file name");
			a.cfg.auth_token_file = optarg;
			break;
		case 'C':
		case 'K':
		case 'R':
			if (optarg[0] == '\0')
				return kv_errf(err, errlen, KV_EINVAL, "missing file name for %s",
				               argv[optind - 1]);
			*(o == 'C'   ? &a.cfg.tls.cert
			  : o == 'K' ? &a.cfg.tls.key
			             : &a.cfg.tls.ca) = optarg;
			break;
		case 'v':
			if (kv_log_parse_level(optarg, &a.level) != KV_OK)
				return kv_errf(err, errlen, KV_EINVAL, "invalid --log-level %s",
				               optarg);
			break;
		case 'i':
			if (!parse_uint(optarg, KV_CONTROLLER_MAX_PEERS, &id))
				return kv_errf(err, errlen, KV_EINVAL,
				               "--id must be a number from 1 to %d, not %s",
				               KV_CONTROLLER_MAX_PEERS, optarg);
			break;
		case 'p':
			if (strlen(optarg) >= sizeof(a.peers_buf))
				return kv_errf(err, errlen, KV_EINVAL, "--peers is too long");
			memset(a.peers, 0, sizeof(a.peers));
			if ((a.cfg.npeers = split_list(optarg, a.peers_buf, sizeof(a.peers_buf),
			                               a.peers)) == 0)
				return kv_errf(err, errlen, KV_EINVAL,
				               "--peers needs 1 to %d comma-separated URLs, not %s",
				               KV_CONTROLLER_MAX_PEERS, optarg);
			a.cfg.peers = a.peers;
			break;
		case 'r':
			if (strlen(optarg) >= sizeof(a.raft_buf))
				return kv_errf(err, errlen, KV_EINVAL, "--raft-peers is too long");
			memset(a.raft_peers, 0, sizeof(a.raft_peers));
			if ((nraft = split_list(optarg, a.raft_buf, sizeof(a.raft_buf),
			                        a.raft_peers)) == 0)
				return kv_errf(
				    err, errlen, KV_EINVAL,
				    "--raft-peers needs 1 to %d comma-separated HOST:PORT, not %s",
				    KV_CONTROLLER_MAX_PEERS, optarg);
			a.cfg.raft_peers = a.raft_peers;
			break;
		case 's':
			if (!parse_uint(optarg, 1000000, &a.cfg.snapshot_threshold))
				return kv_errf(err, errlen, KV_EINVAL,
				               "invalid --snapshot-threshold %s", optarg);
			break;
		case 'e':
			if (!parse_uint(optarg, 600000, &a.cfg.election_ms) ||
			    a.cfg.election_ms < 50)
				return kv_errf(err, errlen, KV_EINVAL,
				               "--election-timeout must be 50 to 600000 ms, not %s",
				               optarg);
			break;
		case 'D':
			if (!parse_uint(optarg, 86400, &a.cfg.down_after_s) ||
			    a.cfg.down_after_s < 1)
				return kv_errf(err, errlen, KV_EINVAL,
				               "--down-after must be 1 to 86400 seconds, not %s",
				               optarg);
			break;
		case 'N':
			if (!parse_uint(optarg, KV_MAX_REPLICAS, &a.cfg.replicas))
				return kv_errf(err, errlen, KV_EINVAL,
				               "--replicas must be a number from 1 to %d, not %s",
				               KV_MAX_REPLICAS, optarg);
			break;
		case 'M':
			if (!parse_uint(optarg, KV_MAX_REPLICAS, &a.cfg.min_insync))
				return kv_errf(err, errlen, KV_EINVAL,
				               "--min-insync must be a number from 1 to %d, not %s",
				               KV_MAX_REPLICAS, optarg);
			break;
		case 'B':
			if (strcmp(optarg, "on") != 0 && strcmp(optarg, "off") != 0)
				return kv_errf(err, errlen, KV_EINVAL,
				               "--auto-balance must be on or off, not %s", optarg);
			a.cfg.auto_balance = strcmp(optarg, "on") == 0;
			break;
		case 'S':
			if (!parse_size(optarg, &a.cfg.split_bytes))
				return kv_errf(
				    err, errlen, KV_EINVAL,
				    "--split-bytes must be 4k to 64g (bytes, k, m or g), not %s",
				    optarg);
			break;
		case 'O':
			if (!parse_uint(optarg, 100000000, &a.cfg.split_ops))
				return kv_errf(
				    err, errlen, KV_EINVAL,
				    "--split-ops must be a number from 1 to 100000000, not %s",
				    optarg);
			break;
		case 'X':
			if (!parse_uint(optarg, 64, &a.cfg.max_migrations))
				return kv_errf(
				    err, errlen, KV_EINVAL,
				    "--max-migrations must be a number from 1 to 64, not %s",
				    optarg);
			break;
		case 'h':
			a.help = true;
			args_copy(out, &a);
			return KV_OK;
		case ':':
			return kv_errf(err, errlen, KV_EINVAL, "missing value for option %s",
			               argv[optind - 1]);
		default:
			return kv_errf(err, errlen, KV_EINVAL, "unknown option %s",
			               argv[optind - 1]);
		}
	}
	if (optind < argc)
		return kv_errf(err, errlen, KV_EINVAL, "unexpected argument %s", argv[optind]);
	if (a.cfg.listen == NULL || a.cfg.listen[0] == '\0')
		return kv_errf(err, errlen, KV_EINVAL, "--listen ADDR is required");
	if (a.cfg.data_dir == NULL || a.cfg.data_dir[0] == '\0')
		return kv_errf(err, errlen, KV_EINVAL, "--data-dir DIR is required");
	if ((kv_tls_files_any(&a.cfg.tls) &&
	     kv_tls_check_files(&a.cfg.tls, true, terr, sizeof(terr)) != 0) ||
	    kv_tls_check_url(kv_tls_files_any(&a.cfg.tls), "--listen", a.cfg.listen, terr,
	                     sizeof(terr)) != 0)
		return kv_errf(err, errlen, KV_EINVAL, "%s", terr);
	if (a.cfg.min_insync > (a.cfg.replicas ? a.cfg.replicas : 1))
		return kv_errf(err, errlen, KV_EINVAL,
		               "--min-insync %u is larger than --replicas %u: a write could never "
		               "be acknowledged",
		               a.cfg.min_insync, a.cfg.replicas ? a.cfg.replicas : 1);
	if ((id != 0) != (a.cfg.npeers != 0))
		return kv_errf(err, errlen, KV_EINVAL, "--id and --peers go together");
	if (id > a.cfg.npeers)
		return kv_errf(err, errlen, KV_EINVAL, "--id is larger than the number of --peers");
	if (a.cfg.raft_peers != NULL && a.cfg.npeers == 0)
		return kv_errf(err, errlen, KV_EINVAL, "--raft-peers needs --id and --peers");
	if (a.cfg.raft_peers != NULL && nraft != a.cfg.npeers)
		return kv_errf(err, errlen, KV_EINVAL,
		               "--raft-peers must list as many addresses as --peers");
	/* Clients are sent to a peer's URL: it must be as encrypted as ours. */
	for (size_t i = 0; i < a.cfg.npeers; i++)
		if (kv_tls_check_url(kv_tls_files_any(&a.cfg.tls), "--peers", a.cfg.peers[i], terr,
		                     sizeof(terr)) != 0)
			return kv_errf(err, errlen, KV_EINVAL, "%s", terr);
	a.cfg.id = id;
	args_copy(out, &a);
	return KV_OK;
}
