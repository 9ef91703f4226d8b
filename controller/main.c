/*
 * main.c - shardkv-controller: parses the command line into an immutable
 * kv_controller_cfg and runs the controller until SIGTERM/SIGINT (SPEC §5).
 *
 * Exit codes: 0 clean stop, 1 cannot start (the reason on stderr), 2 usage.
 */
#include "common/err.h"
#include "common/log.h"
#include "controller/controller.h"

#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "usage: shardkv-controller --listen ADDR --data-dir DIR [--metrics HOSTPORT]\n"
    "                          [--auth-token-file F]\n"
    "                          [--id I --peers ADDR1,ADDR2,ADDR3 [--raft-peers H:P,...]\n"
    "                           [--snapshot-threshold N] [--election-timeout MS]]\n"
    "                          [--log-level debug|info|warn|error|off] [--help]\n"
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
    "  --id I              replicated control plane: this replica's number, which\n"
    "                      indexes --peers from 1\n"
    "  --peers LIST        every replica's controller URL, comma-separated, the same\n"
    "                      list and order on every replica (3 or 5; at most 9);\n"
    "                      changes are committed by a majority through Raft\n"
    "  --raft-peers LIST   HOST:PORT each replica's Raft transport listens on, in the\n"
    "                      order of --peers (default: the peer's host and port + 1000)\n"
    "  --snapshot-threshold N  Raft log entries between snapshots (default 256)\n"
    "  --election-timeout MS   Raft election timeout (default 1000)\n"
    "  --log-level L       lowest level logged to stderr (default info)\n"
    "  --help              print this text and exit\n";

#define MAX_PEERS 9

/* Splits a comma-separated list in place into at most MAX_PEERS non-empty
 * items. Returns the count, or 0 for an empty item or too many. */
static size_t
split_list(char *s, const char **out)
{
	size_t n = 0;

	for (char *p = s;; p++) {
		char *comma = strchr(p, ',');
		if (comma)
			*comma = '\0';
		if (*p == '\0' || n == MAX_PEERS)
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

/* Prints "shardkv-controller: WHAT ARG (see --help)" and returns 2. */
static int
usage_error(const char *what, const char *arg)
{
	fprintf(stderr, "shardkv-controller: %s%s%s (see --help)\n", what, arg ? " " : "",
	        arg ? arg : "");
	return 2;
}

int
main(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"listen", required_argument, NULL, 'l'},
	    {"data-dir", required_argument, NULL, 'd'},
	    {"metrics", required_argument, NULL, 'm'},
	    {"log-level", required_argument, NULL, 'v'},
	    {"auth-token-file", required_argument, NULL, 'A'},
	    {"id", required_argument, NULL, 'i'},
	    {"peers", required_argument, NULL, 'p'},
	    {"raft-peers", required_argument, NULL, 'r'},
	    {"snapshot-threshold", required_argument, NULL, 's'},
	    {"election-timeout", required_argument, NULL, 'e'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	kv_controller_cfg cfg = {0};
	enum kv_log_level level = KV_LOG_INFO;
	sigset_t set;
	char err[512] = "";
	const char *peers[MAX_PEERS], *raft_peers[MAX_PEERS];
	size_t nraft = 0;
	char peers_buf[4096], raft_buf[4096]; /* split copies of the lists */
	unsigned id = 0;
	int o, rv;

	/* Before any thread exists, so that every thread inherits the mask and
	 * only sigwait() in kv_controller_run sees the signals. */
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	opterr = 0;
	while ((o = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
		switch (o) {
		case 'l':
			cfg.listen = optarg;
			break;
		case 'd':
			cfg.data_dir = optarg;
			break;
		case 'm':
			cfg.metrics = optarg;
			break;
		case 'A':
			if (optarg[0] == '\0')
				return usage_error("--auth-token-file needs a file name", NULL);
			cfg.auth_token_file = optarg;
			break;
		case 'v':
			if (kv_log_parse_level(optarg, &level) != KV_OK)
				return usage_error("invalid --log-level", optarg);
			break;
		case 'i':
			if (!parse_uint(optarg, MAX_PEERS, &id))
				return usage_error("--id must be a number from 1 to 9, not",
				                   optarg);
			break;
		case 'p':
			/* Split a copy: argv stays intact for the error message. */
			if (strlen(optarg) >= sizeof(peers_buf))
				return usage_error("--peers is too long", NULL);
			memcpy(peers_buf, optarg, strlen(optarg) + 1);
			if ((cfg.npeers = split_list(peers_buf, peers)) == 0)
				return usage_error("--peers needs 1 to 9 comma-separated URLs, not",
				                   optarg);
			cfg.peers = peers;
			break;
		case 'r':
			if (strlen(optarg) >= sizeof(raft_buf))
				return usage_error("--raft-peers is too long", NULL);
			memcpy(raft_buf, optarg, strlen(optarg) + 1);
			if ((nraft = split_list(raft_buf, raft_peers)) == 0)
				return usage_error(
				    "--raft-peers needs 1 to 9 comma-separated HOST:PORT, not",
				    optarg);
			cfg.raft_peers = raft_peers;
			break;
		case 's':
			if (!parse_uint(optarg, 1000000, &cfg.snapshot_threshold))
				return usage_error("invalid --snapshot-threshold", optarg);
			break;
		case 'e':
			if (!parse_uint(optarg, 600000, &cfg.election_ms) || cfg.election_ms < 50)
				return usage_error(
				    "--election-timeout must be 50 to 600000 ms, not", optarg);
			break;
		case 'h':
			fputs(usage_text, stdout);
			return 0;
		case ':':
			return usage_error("missing value for option", argv[optind - 1]);
		default:
			return usage_error("unknown option", argv[optind - 1]);
		}
	}
	if (optind < argc)
		return usage_error("unexpected argument", argv[optind]);
	if (cfg.listen == NULL || cfg.listen[0] == '\0')
		return usage_error("--listen ADDR is required", NULL);
	if (cfg.data_dir == NULL || cfg.data_dir[0] == '\0')
		return usage_error("--data-dir DIR is required", NULL);
	if ((id != 0) != (cfg.npeers != 0))
		return usage_error("--id and --peers go together", NULL);
	if (id > cfg.npeers)
		return usage_error("--id is larger than the number of --peers", NULL);
	if (cfg.raft_peers != NULL && nraft != cfg.npeers)
		return usage_error("--raft-peers must list as many addresses as --peers", NULL);
	if (cfg.raft_peers != NULL && cfg.npeers == 0)
		return usage_error("--raft-peers needs --id and --peers", NULL);
	cfg.id = id;
	kv_log_set_level(level);

	rv = kv_controller_run(&cfg, err, sizeof(err));
	if (rv != KV_OK) {
		fprintf(stderr, "shardkv-controller: %s\n", err[0] ? err : kv_strerror(rv));
		return 1;
	}
	return 0;
}
