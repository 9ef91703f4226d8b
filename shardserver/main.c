/*
 * main.c - shardkv-server: parses flags into an immutable kv_server_cfg and
 * calls kv_server_run (server.h).
 *
 * DESIGN. Nothing here but flag parsing: every usage error exits 2 with one
 * line naming the problem; a server that cannot start exits 1 (the reason
 * was logged by kv_server_run); a clean stop exits 0.
 */
#include "common/err.h"
#include "common/key.h"
#include "common/log.h"
#include "shardserver/server.h"

#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "usage: shardkv-server --listen ADDR --controller ADDR[,ADDR...] --data-dir DIR [--join]\n"
    "                      [--threads N] [--store striped|percore] [--fsync always|batch|none]\n"
    "                      [--max-key BYTES] [--max-value BYTES] [--metrics HOSTPORT]\n"
    "                      [--snapshot-bytes N] [--wal-truncate-corrupt] [--auth-token-file F]\n"
    "                      [--tls-cert F --tls-key F --tls-ca F]\n"
    "                      [--log-level debug|info|warn|error|off] [--help]\n"
    "\n"
    "  --listen ADDR        nng URL to serve requests on, e.g. tcp://127.0.0.1:7101\n"
    "  --controller ADDRS   the controller's URL (comma-separated replicas)\n"
    "  --data-dir DIR       directory for the node identity, log and snapshots (created if "
    "missing)\n"
    "  --join               register as a new node on the first start\n"
    "  --threads N          percore store: partition owner threads (default: one per CPU);\n"
    "                       striped store: ignored (requests run on nng's worker threads)\n"
    "  --store MODE         striped (default) or percore\n"
    "  --fsync MODE         always: acknowledge a write once it is on disk; batch (default):\n"
    "                       fsync every 10 ms, a process crash loses nothing; none: the OS "
    "decides\n"
    "  --snapshot-bytes N   log growth that triggers a background snapshot (default 64 MiB,\n"
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
    "\n"
    "SIGTERM drains the node (its ranges move to other servers) and then exits;\n"
    "SIGINT exits at once and keeps the node's ranges for a restart.\n";

/* Prints "shardkv-server: WHAT[ 'ARG']" and returns the usage exit code. */
static int
usage_error(const char *what, const char *arg)
{
	if (arg)
		fprintf(stderr, "shardkv-server: %s '%s' (see --help)\n", what, arg);
	else
		fprintf(stderr, "shardkv-server: %s (see --help)\n", what);
	return 2;
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

/* Long options without a short letter. */
enum { OPT_TLS_CERT = 1000, OPT_TLS_KEY, OPT_TLS_CA };

int
main(int argc, char **argv)
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
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	kv_server_cfg cfg = {.fsync = KV_FSYNC_BATCH};
	enum kv_log_level level = KV_LOG_INFO;
	char *ctl_list = NULL;
	const char *ctl[16];
	char terr[512];
	size_t n;
	int c, rv;

	opterr = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'l':
			cfg.listen = optarg;
			break;
		case 'c':
			ctl_list = optarg;
			break;
		case 'd':
			cfg.data_dir = optarg;
			break;
		case 'j':
			cfg.join = true;
			break;
		case 't':
			if (parse_size(optarg, 4096, &n) != 0)
				return usage_error("--threads wants 1..4096, not", optarg);
			cfg.threads = (unsigned)n;
			break;
		case 's':
			if (strcmp(optarg, "striped") == 0)
				cfg.store_mode = KV_STORE_STRIPED;
			else if (strcmp(optarg, "percore") == 0)
				cfg.store_mode = KV_STORE_PERCORE;
			else
				return usage_error("--store wants striped or percore, not", optarg);
			break;
		case 'f':
			if (kv_fsync_mode_parse(optarg, &cfg.fsync) != 0)
				return usage_error("--fsync wants always, batch or none, not",
				                   optarg);
			break;
		case 'S':
			if (parse_size(optarg, SIZE_MAX, &n) != 0 || n < 4096)
				return usage_error("--snapshot-bytes wants a size >= 4096, not",
				                   optarg);
			cfg.snapshot_bytes = n;
			break;
		case 'T':
			cfg.wal_truncate_corrupt = true;
			break;
		case 'A':
			if (optarg[0] == '\0')
				return usage_error("--auth-token-file needs a file name", NULL);
			cfg.auth_token_file = optarg;
			break;
		case OPT_TLS_CERT:
		case OPT_TLS_KEY:
		case OPT_TLS_CA:
			if (optarg[0] == '\0')
				return usage_error("missing file name for", argv[optind - 1]);
			*(c == OPT_TLS_CERT  ? &cfg.tls.cert
			  : c == OPT_TLS_KEY ? &cfg.tls.key
			                     : &cfg.tls.ca) = optarg;
			break;
		case 'M':
			if (parse_size(optarg, SIZE_MAX, &n) != 0 || n < (1u << 20))
				return usage_error("--max-memory wants a size >= 1M, not", optarg);
			cfg.max_memory = n;
			break;
		case 'B':
			if (parse_size(optarg, 1u << 24, &n) != 0)
				return usage_error("--max-batch wants 1..16777216, not", optarg);
			cfg.max_batch = n;
			break;
		case 'G':
			if (parse_size(optarg, 1u << 30, &n) != 0 || n < (1u << 20))
				return usage_error("--max-message wants 1M..1G, not", optarg);
			cfg.max_message = n;
			break;
		case 'C':
			if (parse_size(optarg, 1u << 20, &n) != 0)
				return usage_error("--max-connections wants 1..1048576, not",
				                   optarg);
			cfg.max_connections = (unsigned)n;
			break;
		case 'k':
			if (parse_size(optarg, KV_HARD_MAX_KEY, &cfg.max_key) != 0)
				return usage_error("--max-key wants 1..65536, not", optarg);
			break;
		case 'v':
			if (parse_size(optarg, KV_HARD_MAX_VALUE, &cfg.max_value) != 0)
				return usage_error("--max-value wants 1..67108864, not", optarg);
			break;
		case 'm':
			cfg.metrics = optarg;
			break;
		case 'L':
			if (kv_log_parse_level(optarg, &level) != 0)
				return usage_error("--log-level wants debug, info, warn, error or "
				                   "off, not",
				                   optarg);
			break;
		case 'h':
			fputs(usage_text, stdout);
			return 0;
		default:
			return usage_error("unknown or incomplete option", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return usage_error("unexpected argument", argv[optind]);
	if (cfg.listen == NULL)
		return usage_error("--listen is required", NULL);
	if (ctl_list == NULL)
		return usage_error("--controller is required", NULL);
	if (cfg.data_dir == NULL)
		return usage_error("--data-dir is required", NULL);
	n = 0;
	for (char *save = NULL, *tok = strtok_r(ctl_list, ",", &save); tok;
	     tok = strtok_r(NULL, ",", &save)) {
		if (n == sizeof(ctl) / sizeof(ctl[0]))
			return usage_error("too many controller addresses", NULL);
		ctl[n++] = tok;
	}
	if (n == 0)
		return usage_error("--controller is empty", NULL);
	cfg.ctl = ctl;
	cfg.nctl = n;
	if (kv_tls_files_any(&cfg.tls) &&
	    kv_tls_check_files(&cfg.tls, true, terr, sizeof(terr)) != 0)
		return usage_error(terr, NULL);
	for (size_t i = 0; i <= n; i++)
		if (kv_tls_check_url(kv_tls_files_any(&cfg.tls),
		                     i < n ? "--controller" : "--listen",
		                     i < n ? ctl[i] : cfg.listen, terr, sizeof(terr)) != 0)
			return usage_error(terr, NULL);
	kv_log_set_level(level);
	rv = kv_server_run(&cfg);
	return rv == 0 ? 0 : 1;
}
