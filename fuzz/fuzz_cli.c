/*
 * fuzz_cli.c - the `shardkv` command line without a network: argument
 * parsing (kv_cli_parse, and kv_bench_parse for `shardkv bench`), every
 * path of kv_cli_main that ends before it connects (usage errors and
 * --help), and the JSON escaping of the output (kv_cli_json_escape).
 *
 * Input: the arguments after the program name, separated by NUL bytes (at
 * most 64). kv_cli_main runs only when the parse already shows that it
 * stops before connecting, and prints into memory.
 */
#include "client/cli/bench.h"
#include "client/cli/cli.h"
#include "fuzz/fuzz_util.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

void
fz_init(void)
{
	/* kv_cli_main reads these only after the point where the harness
	 * stops, but keep the process free of outside settings anyway. */
	unsetenv("SHARDKV_CONTROLLER");
	unsetenv("SHARDKV_AUTH_TOKEN_FILE");
	unsetenv("SHARDKV_TLS_CERT");
	unsetenv("SHARDKV_TLS_KEY");
	unsetenv("SHARDKV_TLS_CA");
}

static void
check_escape(const uint8_t *p, size_t n)
{
	char small[8], *full;
	size_t len = kv_cli_json_escape(p, n, NULL, 0);

	FZ_CHECK(len >= n && len <= 6 * n);
	FZ_CHECK(kv_cli_json_escape(p, n, small, sizeof(small)) == len);
	FZ_CHECK(strlen(small) == (len < sizeof(small) ? len : sizeof(small) - 1));
	FZ_CHECK((full = malloc(len + 1)) != NULL);
	FZ_CHECK(kv_cli_json_escape(p, n, full, len + 1) == len);
	FZ_CHECK(strlen(full) == len && strncmp(full, small, strlen(small)) == 0);
	for (size_t i = 0; i < len; i++)
		FZ_CHECK(full[i] >= 0x20 && full[i] < 0x7f);
	free(full);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *buf, *argv[FZ_MAX_ARGS + 2], err[256];
	int argc = 0, rv;
	kv_cli_args a;

	check_escape(data, size);
	argc = fz_split_args(data, size, "shardkv", &buf, argv);

	rv = kv_cli_parse(argc, argv, &a, err, sizeof(err));
	FZ_CHECK(memchr(err, 0, sizeof(err)) != NULL);
	FZ_CHECK(rv == KV_CLI_OK || (rv == KV_CLI_USAGE && err[0] != 0));
	if (rv == KV_CLI_OK) {
		FZ_CHECK(a.nargs >= 0 && a.nargs < argc);
		for (int i = 0; i < a.nargs; i++)
			fz_touch(a.args[i], strlen(a.args[i]));
		if (a.cmd && strcmp(a.cmd, "bench") == 0) {
			kv_bench_params p;
			char berr[256];
			berr[0] = 0;
			int brv = kv_bench_parse(a.nargs, (const char *const *)a.args, &p, berr,
			                         sizeof(berr));
			FZ_CHECK(brv == 0 || berr[0] != 0);
		}
	}
	/* With --tls-* flags kv_cli_main goes on to read the files and could
	 * connect: only usage errors and --help end early. */
	int early = rv != KV_CLI_OK || a.help;
	kv_cli_args_fini(&a);
	for (int i = 1; i < argc; i++) {
		unsigned w[KV_BENCH_NOPS];
		kv_bench_dist d;
		(void)kv_bench_parse_mix(argv[i], w, err, sizeof(err));
		(void)kv_bench_parse_dist(argv[i], &d, err, sizeof(err));
	}
	if (early) {
		char *ob = NULL, *eb = NULL;
		size_t on = 0, en = 0;
		FILE *out = open_memstream(&ob, &on), *errf = open_memstream(&eb, &en);
		FZ_CHECK(out != NULL && errf != NULL);
		int mrv = kv_cli_main(argc, argv, out, errf);
		fclose(out);
		fclose(errf);
		FZ_CHECK(mrv == rv || (rv == KV_CLI_OK && (mrv == 0 || mrv == KV_CLI_USAGE)));
		FZ_CHECK(mrv == 0 || en > 0);
		free(ob);
		free(eb);
	}
	free(buf);
	return 0;
}
