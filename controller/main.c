/*
 * main.c - shardkv-controller: parses the command line into an immutable
 * kv_controller_cfg and runs the controller until SIGTERM/SIGINT (SPEC §5).
 *
 * Exit codes: 0 clean stop, 1 cannot start (the reason on stderr), 2 usage.
 */
#include "common/err.h"
#include "common/log.h"
#include "controller/controller.h"

#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage_text[] =
    "usage: shardkv-controller --listen ADDR --data-dir DIR [--metrics HOSTPORT]\n"
    "                          [--auth-token-file F] [--tls-cert F --tls-key F --tls-ca F]\n"
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
    "  --tls-cert F        this controller's certificate (PEM); with --tls-key and\n"
    "                      --tls-ca, needed for a tls+tcp:// --listen\n"
    "  --tls-key F         its private key (PEM, unencrypted)\n"
    "  --tls-ca F          the CA (PEM) every peer's certificate must be signed by:\n"
    "                      clients without such a certificate are refused\n"
    "  --log-level L       lowest level logged to stderr (default info)\n"
    "  --help              print this text and exit\n";

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
	    {"tls-cert", required_argument, NULL, 'C'},
	    {"tls-key", required_argument, NULL, 'K'},
	    {"tls-ca", required_argument, NULL, 'R'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	kv_controller_cfg cfg = {0};
	enum kv_log_level level = KV_LOG_INFO;
	sigset_t set;
	char err[512] = "";
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
		case 'C':
		case 'K':
		case 'R':
			if (optarg[0] == '\0')
				return usage_error("missing file name for", argv[optind - 1]);
			*(o == 'C'   ? &cfg.tls.cert
			  : o == 'K' ? &cfg.tls.key
			             : &cfg.tls.ca) = optarg;
			break;
		case 'v':
			if (kv_log_parse_level(optarg, &level) != KV_OK)
				return usage_error("invalid --log-level", optarg);
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
	if (kv_tls_files_any(&cfg.tls) && kv_tls_check_files(&cfg.tls, true, err, sizeof(err)) != 0)
		return usage_error(err, NULL);
	if (kv_tls_check_url(kv_tls_files_any(&cfg.tls), "--listen", cfg.listen, err,
	                     sizeof(err)) != 0)
		return usage_error(err, NULL);
	kv_log_set_level(level);

	rv = kv_controller_run(&cfg, err, sizeof(err));
	if (rv != KV_OK) {
		fprintf(stderr, "shardkv-controller: %s\n", err[0] ? err : kv_strerror(rv));
		return 1;
	}
	return 0;
}
