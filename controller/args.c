/*
 * args.c - the shardkv-controller command line (controller.h:
 * kv_controller_parse_args), apart from main so that it can be tested and
 * fuzzed without starting a controller. Nothing is opened or read here: the
 * files named by flags are read by kv_controller_create.
 */
#include "common/err.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/tls.h"
#include "controller/controller.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

const char kv_controller_usage[] =
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
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	kv_controller_args a = {.level = KV_LOG_INFO};
	char terr[512];
	int o;

	if (argc < 1 || argv == NULL)
		return kv_errf(err, errlen, KV_EINVAL, "no arguments");
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
		case 'h':
			a.help = true;
			*out = a;
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
	*out = a;
	return KV_OK;
}
