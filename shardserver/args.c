/*
 * args.c - the shardkv-server command line (server.h: kv_server_parse_args),
 * apart from main so that it can be tested and fuzzed without starting a
 * server. Nothing is opened or read here: the files named by flags are read
 * by kv_server_create.
 */
#include "common/err.h"
#include "common/key.h"
#include "common/log.h"
#include "common/tls.h"
#include "shardserver/server.h"

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char kv_server_usage[] =
    "usage: shardkv-server --listen ADDR --controller ADDR[,ADDR...] --data-dir DIR [--join]\n"
    "                      [--threads N] [--store striped|percore] [--fsync always|batch|none]\n"
    "                      [--max-key BYTES] [--max-value BYTES] [--metrics HOSTPORT]\n"
    "                      [--snapshot-bytes N] [--wal-truncate-corrupt] [--auth-token-file F]\n"
    "                      [--copy-rate MB/S] [--io-loops N]\n"
    "                      [--tls-cert F --tls-key F --tls-ca F]\n"
    "                      [--log-level debug|info|warn|error|off] [--version] [--help]\n"
    "\n"
    "  --listen ADDR        nng URL to serve requests on, e.g. tcp://127.0.0.1:7101\n"
    "  --controller ADDRS   the controller's URL (comma-separated replicas)\n"
    "  --data-dir DIR       directory for the node identity, log and snapshots (created if "
    "missing)\n"
    "  --join               register as a new node on the first start\n"
    "  --threads N          percore store: partition owner threads (default: one per CPU);\n"
    "                       striped store: ignored\n"
    "  --io-loops N         event loops that read requests and answer them (tcp:// only;\n"
    "                       default: one per CPU); 0: nng's own threads instead\n"
    "  --store MODE         striped (default) or percore\n"
    "  --fsync MODE         always: acknowledge a write once it is on disk; batch (default):\n"
    "                       fsync every 10 ms, a process crash loses nothing; none: the OS "
    "decides\n"
    "  --snapshot-bytes N   log growth that triggers a background snapshot (default 256 MiB,\n"
    "                       or the size of the last snapshot when larger)\n"
    "  --wal-truncate-corrupt  cut the log at a corrupt record instead of refusing to start\n"
    "  --max-key BYTES      largest key accepted (default 1024, at most 65536)\n"
    "  --max-value BYTES    largest value accepted (default 1 MiB, at most 64 MiB)\n"
    "  --max-memory BYTES   refuse puts and appends (out of memory) once the store holds\n"
    "                       this much; reads and deletes go on (default: no bound)\n"
    "  --max-batch N        operations per request, each key of mget/mput counted\n"
    "                       (default 65536)\n"
    "  --max-message BYTES  largest request accepted (default 80M, at least 1M)\n"
    "  --max-connections N  connections at once; more are closed (default 4096)\n"
    "  --copy-rate MB/S     pace the copies this node sends to replicas outside an ISR\n"
    "                       (catch-up, repair, replacements), all together, in 10^6\n"
    "                       bytes per second (default 20; 0: unlimited)\n"
    "  Sizes take a K, M or G suffix (powers of 1024).\n"
    "  --metrics HOSTPORT   serve Prometheus text at http://HOSTPORT/metrics, e.g.\n"
    "                       127.0.0.1:9101 (see doc/metrics.md); the server refuses to\n"
    "                       start when it cannot listen there\n"
    "  --auth-token-file F  the cluster's shared secret (the file's bytes, one trailing\n"
    "                       newline cut; at most 4096): requests without it are refused,\n"
    "                       and it is sent to the controller and to other servers\n"
    "  --tls-cert F         this server's certificate (PEM); with --tls-key and --tls-ca,\n"
    "                       needed for tls+tcp:// addresses, and then every address must\n"
    "                       be one. It is also the client certificate this server shows\n"
    "                       the controller and other servers\n"
    "  --tls-key F          its private key (PEM, unencrypted)\n"
    "  --tls-ca F           the CA (PEM) every peer's certificate must be signed by\n"
    "  --log-level L        lowest level logged (default info)\n"
    "  --version            print \"shardkv-server VERSION [(commit C)]\" and exit\n"
    "\n"
    "SIGTERM drains the node (its ranges move to other servers) and then exits;\n"
    "SIGINT exits at once and keeps the node's ranges for a restart.\n"
    "A node the controller says is gone (removed, or left by `shardkv leave`)\n"
    "stops and exits 4.\n";

/* Writes "WHAT[ 'ARG']" into err and returns KV_EINVAL. */
static int
usage(char *err, size_t errlen, const char *what, const char *arg)
{
	if (arg)
		snprintf(err, errlen, "%s '%s'", what, arg);
	else
		snprintf(err, errlen, "%s", what);
	return KV_EINVAL;
}

/* Parses a positive number with an optional K, M or G suffix (powers of
 * 1024) into *out when it is at most max. Returns 0 or -1. */
static int
parse_size(const char *s, size_t max, size_t *out)
{
	char *end;
	unsigned long long v, mul = 1;

	if (s[0] < '0' || s[0] > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0)
		return -1;
	if (*end == 'k' || *end == 'K')
		mul = 1ull << 10;
	else if (*end == 'm' || *end == 'M')
		mul = 1ull << 20;
	else if (*end == 'g' || *end == 'G')
		mul = 1ull << 30;
	if (mul != 1)
		end++;
	if (*end != '\0' || v == 0 || v > max / mul)
		return -1;
	*out = (size_t)(v * mul);
	return 0;
}

/* Parses a decimal number from 0 to max, without a suffix, into *out.
 * Returns 0 or -1. */
static int
parse_count(const char *s, size_t max, size_t *out)
{
	char *end;
	unsigned long long v;

	if (s[0] < '0' || s[0] > '9')
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || *end != '\0' || v > max)
		return -1;
	*out = (size_t)v;
	return 0;
}

/* Long options without a short letter. */
enum { OPT_TLS_CERT = 1000, OPT_TLS_KEY, OPT_TLS_CA, OPT_COPY_RATE, OPT_IO_LOOPS };

int
kv_server_parse_args(int argc, char **argv, kv_server_args *out, char *err, size_t errlen)
{
	static const struct option opts[] = {
	    {"listen", required_argument, NULL, 'l'},
	    {"controller", required_argument, NULL, 'c'},
	    {"data-dir", required_argument, NULL, 'd'},
	    {"join", no_argument, NULL, 'j'},
	    {"threads", required_argument, NULL, 't'},
	    {"store", required_argument, NULL, 's'},
	    {"fsync", required_argument, NULL, 'f'},
	    {"max-key", required_argument, NULL, 'k'},
	    {"max-value", required_argument, NULL, 'v'},
	    {"metrics", required_argument, NULL, 'm'},
	    {"log-level", required_argument, NULL, 'L'},
	    {"snapshot-bytes", required_argument, NULL, 'S'},
	    {"max-memory", required_argument, NULL, 'M'},
	    {"max-batch", required_argument, NULL, 'B'},
	    {"max-message", required_argument, NULL, 'G'},
	    {"max-connections", required_argument, NULL, 'C'},
	    {"wal-truncate-corrupt", no_argument, NULL, 'T'},
	    {"auth-token-file", required_argument, NULL, 'A'},
	    {"tls-cert", required_argument, NULL, OPT_TLS_CERT},
	    {"tls-key", required_argument, NULL, OPT_TLS_KEY},
	    {"tls-ca", required_argument, NULL, OPT_TLS_CA},
	    {"copy-rate", required_argument, NULL, OPT_COPY_RATE},
	    {"io-loops", required_argument, NULL, OPT_IO_LOOPS},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	kv_server_args *a = out;
	char *ctl_list = NULL;
	char terr[512];
	size_t n;
	int c;

	memset(a, 0, sizeof(*a));
	a->cfg.fsync = KV_FSYNC_BATCH;
	a->cfg.copy_rate_mb_s = KV_SERVER_COPY_RATE_MB_S;
	a->level = KV_LOG_INFO;
	if (argc < 1 || argv == NULL)
		return usage(err, errlen, "no arguments", NULL);
	/* 0, not 1: glibc then starts afresh, so that this can run more than
	 * once in a process (tests, the fuzzer). */
	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'l':
			a->cfg.listen = optarg;
			break;
		case 'c':
			ctl_list = optarg;
			break;
		case 'd':
			a->cfg.data_dir = optarg;
			break;
		case 'j':
			a->cfg.join = true;
			break;
		case 't':
			if (parse_size(optarg, 4096, &n) != 0)
				return usage(err, errlen, "--threads wants 1..4096, not", optarg);
			a->cfg.threads = (unsigned)n;
			break;
		case OPT_IO_LOOPS:
			if (strcmp(optarg, "0") == 0) {
				a->cfg.io_nng = true;
				break;
			}
			if (parse_size(optarg, 256, &n) != 0)
				return usage(err, errlen, "--io-loops wants 0..256, not", optarg);
			a->cfg.io_loops = (unsigned)n;
			break;
		case 's':
			if (strcmp(optarg, "striped") == 0)
				a->cfg.store_mode = KV_STORE_STRIPED;
			else if (strcmp(optarg, "percore") == 0)
				a->cfg.store_mode = KV_STORE_PERCORE;
			else
				return usage(err, errlen, "--store wants striped or percore, not",
				             optarg);
			break;
		case 'f':
			if (kv_fsync_mode_parse(optarg, &a->cfg.fsync) != 0)
				return usage(err, errlen,
				             "--fsync wants always, batch or none, not", optarg);
			break;
		case 'S':
			if (parse_size(optarg, SIZE_MAX, &n) != 0 || n < 4096)
				return usage(err, errlen,
				             "--snapshot-bytes wants a size >= 4096, not", optarg);
			a->cfg.snapshot_bytes = n;
			break;
		case 'T':
			a->cfg.wal_truncate_corrupt = true;
			break;
		case 'A':
			if (optarg[0] == '\0')
				return usage(err, errlen, "--auth-token-file needs a file name",
				             NULL);
			a->cfg.auth_token_file = optarg;
			break;
		case OPT_TLS_CERT:
		case OPT_TLS_KEY:
		case OPT_TLS_CA:
			if (optarg[0] == '\0')
				return usage(err, errlen, "missing file name for",
				             argv[optind - 1]);
			*(c == OPT_TLS_CERT  ? &a->cfg.tls.cert
			  : c == OPT_TLS_KEY ? &a->cfg.tls.key
			                     : &a->cfg.tls.ca) = optarg;
			break;
		case 'M':
			if (parse_size(optarg, SIZE_MAX, &n) != 0 || n < (1u << 20))
				return usage(err, errlen, "--max-memory wants a size >= 1M, not",
				             optarg);
			a->cfg.max_memory = n;
			break;
		case 'B':
			if (parse_size(optarg, 1u << 24, &n) != 0)
				return usage(err, errlen, "--max-batch wants 1..16777216, not",
				             optarg);
			a->cfg.max_batch = n;
			break;
		case 'G':
			if (parse_size(optarg, 1u << 30, &n) != 0 || n < (1u << 20))
				return usage(err, errlen, "--max-message wants 1M..1G, not",
				             optarg);
			a->cfg.max_message = n;
			break;
		case OPT_COPY_RATE:
			if (parse_count(optarg, 100000, &n) != 0)
				return usage(err, errlen, "--copy-rate wants 0..100000 (MB/s), not",
				             optarg);
			a->cfg.copy_rate_mb_s = (uint32_t)n;
			break;
		case 'C':
			if (parse_size(optarg, 1u << 20, &n) != 0)
				return usage(err, errlen, "--max-connections wants 1..1048576, not",
				             optarg);
			a->cfg.max_connections = (unsigned)n;
			break;
		case 'k':
			if (parse_size(optarg, KV_HARD_MAX_KEY, &a->cfg.max_key) != 0)
				return usage(err, errlen, "--max-key wants 1..65536, not", optarg);
			break;
		case 'v':
			if (parse_size(optarg, KV_HARD_MAX_VALUE, &a->cfg.max_value) != 0)
				return usage(err, errlen, "--max-value wants 1..67108864, not",
				             optarg);
			break;
		case 'm':
			a->cfg.metrics = optarg;
			break;
		case 'L':
			if (kv_log_parse_level(optarg, &a->level) != 0)
				return usage(err, errlen,
				             "--log-level wants debug, info, warn, error or "
				             "off, not",
				             optarg);
			break;
		case 'h':
			a->help = true;
			return KV_OK;
		default:
			return usage(err, errlen, "unknown or incomplete option", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return usage(err, errlen, "unexpected argument", argv[optind]);
	if (a->cfg.listen == NULL)
		return usage(err, errlen, "--listen is required", NULL);
	if (ctl_list == NULL)
		return usage(err, errlen, "--controller is required", NULL);
	if (a->cfg.data_dir == NULL)
		return usage(err, errlen, "--data-dir is required", NULL);
	n = 0;
	for (char *save = NULL, *tok = strtok_r(ctl_list, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (n == sizeof(a->ctl) / sizeof(a->ctl[0]))
			return usage(err, errlen, "too many controller addresses", NULL);
		a->ctl[n++] = tok;
	}
	if (n == 0)
		return usage(err, errlen, "--controller is empty", NULL);
	a->cfg.ctl = a->ctl;
	a->cfg.nctl = n;
	if (kv_tls_files_any(&a->cfg.tls) &&
	    kv_tls_check_files(&a->cfg.tls, true, terr, sizeof(terr)) != 0)
		return usage(err, errlen, terr, NULL);
	for (size_t i = 0; i <= n; i++)
		if (kv_tls_check_url(kv_tls_files_any(&a->cfg.tls),
		                     i < n ? "--controller" : "--listen",
		                     i < n ? a->ctl[i] : a->cfg.listen, terr, sizeof(terr)) != 0)
			return usage(err, errlen, terr, NULL);
	return KV_OK;
}
