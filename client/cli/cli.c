/*
 * cli.c - the `shardkv` command line: parsing, one handler per command,
 * output formats and exit codes exactly as doc/contract.md §5 states them.
 *
 * Commands are a table (name, argument counts, options allowed, usage,
 * handler); parsing checks everything against it before any connection is
 * made, so a usage error never touches the network. Options may appear
 * before or after the command; `--` ends them (for values starting with
 * `-`). Data commands print raw bytes; admin commands print a short report,
 * or one JSON object with --json. Keys inside JSON strings map one byte to
 * one code point.
 */
#include "client/cli/bench.h"
#include "client/cli/cli.h"
#include "client/include/shardkv.h"
#include "common/auth.h"
#include "common/tls.h"
#include "common/err.h"
#include "common/key.h"
#include "common/version.h"

#include <errno.h>
#include <stdarg.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <signal.h>
#include <unistd.h>

#define DEFAULT_CONTROLLER "tcp://127.0.0.1:7000"
#define WAIT_TIMEOUT_MS    600000u /* --wait without --timeout: ten minutes */

/* Command options, as bits of cmd.opts. */
enum {
	OPT_WAIT = 1u << 0,
	OPT_NOREB = 1u << 1,
	OPT_PREFIX = 1u << 2,
	OPT_LIMIT = 1u << 3,
	OPT_RATE = 1u << 4,
	OPT_LOSS = 1u << 5,
	OPT_RAW = 1u << 6,
	OPT_DRY = 1u << 7,
	OPT_TTL = 1u << 8,
	OPT_IFABS = 1u << 9,
	OPT_IFEQ = 1u << 10,
};

/* The largest TTL (doc/contract.md §3): 2^40 ms. */
#define CLI_MAX_TTL_MS (1ull << 40)

typedef struct cli_ctx cli_ctx;
typedef int (*cmd_fn)(cli_ctx *x);

/* One CLI command. */
typedef struct {
	const char *name;  /* command word */
	int min, max;      /* positional argument counts; max -1: unbounded */
	unsigned opts;     /* OPT_* allowed */
	bool admin;        /* talks to the controller only */
	const char *usage; /* arguments, for --help and usage errors */
	const char *help;  /* one line */
	cmd_fn fn;         /* handler */
} cli_cmd;

/* What a handler works with. */
struct cli_ctx {
	kv_cli_args *a;             /* the parsed command line */
	shardkv_client *c;          /* the open handle */
	FILE *out;                  /* results */
	FILE *err;                  /* errors */
	const char *ctl;            /* the controller list in use */
	const uint8_t *token;       /* the auth token (bench opens its own handles) */
	size_t token_len;           /* its length */
	const shardkv_options *opt; /* the options of c (bench opens its own handles) */
	uint8_t *stdin_buf;         /* a value read from stdin (owned) */
	bool stdin_used;            /* `-` was already consumed */
};

static int cmd_get(cli_ctx *x);
static int cmd_put(cli_ctx *x);
static int cmd_del(cli_ctx *x);
static int cmd_append(cli_ctx *x);
static int cmd_mget(cli_ctx *x);
static int cmd_mput(cli_ctx *x);
static int cmd_keys(cli_ctx *x);
static int cmd_scan(cli_ctx *x);
static int cmd_join(cli_ctx *x);
static int cmd_leave(cli_ctx *x);
static int cmd_move(cli_ctx *x);
static int cmd_rebalance(cli_ctx *x);
static int cmd_cancel(cli_ctx *x);
static int cmd_config(cli_ctx *x);
static int cmd_status(cli_ctx *x);
static int cmd_remove(cli_ctx *x);
static int cmd_locate(cli_ctx *x);
static int cmd_check(cli_ctx *x);
static int cmd_bench(cli_ctx *x);
static int cmd_expire(cli_ctx *x);
static int cmd_persist(cli_ctx *x);
static int cmd_ttl(cli_ctx *x);
static int cmd_incr(cli_ctx *x);
static int cmd_exists(cli_ctx *x);
static int cmd_count(cli_ctx *x);
static int cmd_delrange(cli_ctx *x);

static const cli_cmd cmds[] = {
    {"get", 1, 1, OPT_RAW, false, "KEY [--raw]",
     "print the value of KEY (--raw: its bytes exactly, no newline)", cmd_get},
    {"put", 2, 2, OPT_TTL | OPT_IFABS | OPT_IFEQ, false,
     "KEY VALUE [--ttl MS] [--if-absent|--if-equal OLD]",
     "set KEY to VALUE (`-`: read VALUE from stdin)", cmd_put},
    {"del", 1, 1, OPT_RAW | OPT_IFEQ, false, "KEY [--raw] [--if-equal OLD]",
     "delete KEY and print the value it had", cmd_del},
    {"append", 2, 2, 0, false, "KEY VALUE", "append VALUE to KEY's value (creates KEY)",
     cmd_append},
    {"mget", 1, -1, 0, false, "KEY...", "print the values of the KEYs, one per line", cmd_mget},
    {"mput", 2, -1, OPT_TTL, false, "KEY VALUE [KEY VALUE...] [--ttl MS]", "set several keys",
     cmd_mput},
    {"incr", 1, 2, 0, false, "KEY [N]",
     "add N (default 1, may be negative) to the integer in KEY and print it", cmd_incr},
    {"expire", 2, 2, 0, false, "KEY MS", "make KEY expire MS milliseconds from now", cmd_expire},
    {"persist", 1, 1, 0, false, "KEY", "make KEY never expire", cmd_persist},
    {"ttl", 1, 1, 0, false, "KEY", "print the milliseconds KEY has left, -1 when none", cmd_ttl},
    {"exists", 1, 1, 0, false, "KEY", "exit 0 when KEY exists, 1 when not (prints nothing)",
     cmd_exists},
    {"count", 2, 2, 0, false, "START END", "print the number of keys of [START, END)", cmd_count},
    {"delrange", 2, 2, 0, false, "START END", "delete every key of [START, END) and print how many",
     cmd_delrange},
    {"keys", 0, 0, OPT_PREFIX | OPT_LIMIT, false, "[--prefix P] [--limit N]",
     "print every key, one per line", cmd_keys},
    {"scan", 2, 2, OPT_LIMIT, false, "START END [--limit N]",
     "print key<TAB>value for the keys of [START, END) (\"\": unbounded)", cmd_scan},
    {"join", 1, 1, OPT_WAIT | OPT_NOREB, true, "ADDR [--no-rebalance] [--wait]",
     "register the server at ADDR", cmd_join},
    {"leave", 1, 1, OPT_WAIT, true, "NODE [--wait]", "drain and remove NODE (id or address)",
     cmd_leave},
    {"move", 3, 3, OPT_WAIT | OPT_RATE | OPT_DRY, true,
     "START END NODE [--rate MB/s] [--wait | --dry-run]", "give [START, END) to NODE", cmd_move},
    {"rebalance", 0, 0, OPT_WAIT | OPT_RATE | OPT_DRY, true, "[--rate MB/s] [--wait | --dry-run]",
     "even out data across nodes", cmd_rebalance},
    {"remove", 1, 1, OPT_LOSS, true, "NODE [--accept-data-loss]",
     "forget a node that is down (a live one: use leave)", cmd_remove},
    {"cancel", 1, 1, 0, true, "MIGRATION_ID",
     "stop a migration that has not fenced (ids: shardkv status)", cmd_cancel},
    {"config", 0, 1, 0, true, "[EPOCH]", "print the configuration (default: latest)", cmd_config},
    {"status", 0, 0, 0, true, "", "print nodes, ranges, statistics and migrations", cmd_status},
    {"locate", 1, 1, 0, true, "KEY", "print the range holding KEY, its node and replicas",
     cmd_locate},
    {"check", 0, 0, 0, true, "",
     "exit 0 when every range has a live primary, else 3 and the problems", cmd_check},
    {"bench", 0, -1, 0, false, "[options]", "measure throughput and latency (shardkv bench --help)",
     cmd_bench},
};

#define NCMDS (sizeof(cmds) / sizeof(cmds[0]))

static const cli_cmd *
find_cmd(const char *name)
{
	for (size_t i = 0; i < NCMDS; i++)
		if (strcmp(cmds[i].name, name) == 0)
			return &cmds[i];
	return NULL;
}

/* Edit distance (insertions, deletions, substitutions) of two short words;
 * words of 31 bytes or more count as far from everything. */
static size_t
edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b), d[32][32];

	if (la >= 32 || lb >= 32)
		return SIZE_MAX;
	for (size_t i = 0; i <= la; i++)
		d[i][0] = i;
	for (size_t j = 0; j <= lb; j++)
		d[0][j] = j;
	for (size_t i = 1; i <= la; i++)
		for (size_t j = 1; j <= lb; j++) {
			size_t sub = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
			size_t del = d[i - 1][j] + 1, ins = d[i][j - 1] + 1;
			d[i][j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
		}
	return d[la][lb];
}

const char *
kv_cli_suggest(const char *word)
{
	const char *best = NULL;
	size_t bd = SIZE_MAX, len = strlen(word);

	for (size_t i = 0; i < NCMDS; i++) {
		size_t d = edit_distance(word, cmds[i].name);
		if (d < bd) {
			bd = d;
			best = cmds[i].name;
		}
	}
	return bd <= 2 && bd < len ? best : NULL;
}

/* Prints bytes as a quoted JSON string. */
static void
json_str(FILE *f, const void *p, size_t n)
{
	char buf[256];
	const uint8_t *s = p;

	fputc('"', f);
	/* In pieces so that long keys need no allocation: 36 bytes escape to at
	 * most 216 characters. */
	for (size_t off = 0; off < n; off += 36) {
		size_t k = n - off < 36 ? n - off : 36;
		kv_cli_json_escape(s + off, k, buf, sizeof(buf));
		fputs(buf, f);
	}
	fputc('"', f);
}

/* Prints bytes for humans: the JSON escape, quoted. */
static void
human_str(FILE *f, const void *p, size_t n)
{
	json_str(f, p, n);
}

/* ---------------------------------------------------------------------------
 * Parsing
 * ------------------------------------------------------------------------- */

static int usage_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int
usage_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return KV_CLI_USAGE;
}

static bool
parse_u64(const char *s, uint64_t max, uint64_t *out)
{
	char *e;
	unsigned long long v;

	if (s == NULL || s[0] < '0' || s[0] > '9')
		return false;
	errno = 0;
	v = strtoull(s, &e, 10);
	if (errno != 0 || *e != 0 || v > max)
		return false;
	*out = v;
	return true;
}

/* Returns the value of an option that takes one: --opt=V or --opt V. */
static const char *
opt_value(int argc, char **argv, int *i, const char *arg, size_t namelen)
{
	if (arg[namelen] == '=')
		return arg + namelen + 1;
	if (*i + 1 >= argc)
		return NULL;
	return argv[++*i];
}

/* Returns whether arg is option `name` (exactly, or with =value when takes). */
static bool
is_opt(const char *arg, const char *name, bool takes)
{
	size_t n = strlen(name);
	if (strncmp(arg, name, n) != 0)
		return false;
	return arg[n] == 0 || (takes && arg[n] == '=');
}

int
kv_cli_parse(int argc, char **argv, kv_cli_args *a, char *err, size_t errlen)
{
	const cli_cmd *cmd = NULL;
	bool opts_done = false;
	unsigned seen = 0;

	memset(a, 0, sizeof(*a));
	a->limit = -1;
	err[0] = 0;
	if (argc > 0 && (a->args = calloc((size_t)argc, sizeof(char *))) == NULL)
		return usage_err(err, errlen, "out of memory");
	for (int i = 1; i < argc; i++) {
		const char *s = argv[i];
		const char *v;
		uint64_t n;

		/* incr's N may be negative: a number is never an option there. */
		bool negnum = cmd && strcmp(cmd->name, "incr") == 0 && s[0] == '-' && s[1] >= '0' &&
		              s[1] <= '9';
		if (opts_done || s[0] != '-' || strcmp(s, "-") == 0 || negnum) {
			if (a->cmd == NULL) {
				a->cmd = s;
				if ((cmd = find_cmd(s)) == NULL && kv_cli_suggest(s) != NULL)
					return usage_err(
					    err, errlen,
					    "unknown command '%.100s': did you mean '%s'?", s,
					    kv_cli_suggest(s));
				if (cmd == NULL)
					return usage_err(
					    err, errlen,
					    "unknown command '%.100s' (try 'shardkv --help')", s);
			} else {
				a->args[a->nargs++] = s;
			}
			continue;
		}
		if (strcmp(s, "--") == 0) {
			opts_done = true;
		} else if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
			a->help = true;
		} else if (strcmp(s, "--json") == 0) {
			a->json = true;
		} else if (strcmp(s, "--version") == 0) {
			a->version = true;
		} else if (strcmp(s, "--verbose") == 0 || strcmp(s, "-v") == 0) {
			a->verbose = true;
		} else if (strcmp(s, "-c") == 0 || is_opt(s, "--controller", true)) {
			size_t nl = s[1] == 'c' ? 2 : strlen("--controller");
			if ((v = opt_value(argc, argv, &i, s, nl)) == NULL || v[0] == 0)
				return usage_err(err, errlen, "%s needs an address", s);
			a->controller = v;
		} else if (is_opt(s, "--timeout", true)) {
			if ((v = opt_value(argc, argv, &i, s, strlen("--timeout"))) == NULL ||
			    !parse_u64(v, UINT32_MAX, &n) || n == 0)
				return usage_err(
				    err, errlen,
				    "--timeout needs a positive number of milliseconds");
			a->timeout_ms = (uint32_t)n;
		} else if (is_opt(s, "--auth-token-file", true)) {
			if ((v = opt_value(argc, argv, &i, s, strlen("--auth-token-file"))) == NULL)
				return usage_err(err, errlen, "%s needs a file", s);
			a->auth_token_file = v;
		} else if (is_opt(s, "--tls-cert", true) || is_opt(s, "--tls-key", true) ||
		           is_opt(s, "--tls-ca", true)) {
			size_t nl = strchr(s, '=') ? (size_t)(strchr(s, '=') - s) : strlen(s);
			if ((v = opt_value(argc, argv, &i, s, nl)) == NULL || v[0] == 0)
				return usage_err(err, errlen, "%.*s needs a file", (int)nl, s);
			*(s[6] == 'c' && s[7] == 'e' ? &a->tls_cert
			  : s[6] == 'k'              ? &a->tls_key
			                             : &a->tls_ca) = v;
		} else if (cmd && strcmp(cmd->name, "bench") == 0) {
			a->args[a->nargs++] = s; /* bench options (--rate ...) are its own */
		} else if (strcmp(s, "--wait") == 0) {
			a->wait = true;
			seen |= OPT_WAIT;
		} else if (strcmp(s, "--dry-run") == 0) {
			a->dry_run = true;
			seen |= OPT_DRY;
		} else if (strcmp(s, "--accept-data-loss") == 0) {
			a->accept_data_loss = true;
			seen |= OPT_LOSS;
		} else if (strcmp(s, "--raw") == 0) {
			a->raw = true;
			seen |= OPT_RAW;
		} else if (strcmp(s, "--no-rebalance") == 0) {
			a->no_rebalance = true;
			seen |= OPT_NOREB;
		} else if (strcmp(s, "--if-absent") == 0) {
			a->if_absent = true;
			seen |= OPT_IFABS;
		} else if (is_opt(s, "--if-equal", true)) {
			if ((v = opt_value(argc, argv, &i, s, strlen("--if-equal"))) == NULL)
				return usage_err(err, errlen,
				                 "--if-equal needs the expected value");
			a->if_equal = v;
			seen |= OPT_IFEQ;
		} else if (is_opt(s, "--ttl", true)) {
			if ((v = opt_value(argc, argv, &i, s, strlen("--ttl"))) == NULL ||
			    !parse_u64(v, CLI_MAX_TTL_MS, &n) || n == 0)
				return usage_err(err, errlen, "--ttl needs milliseconds, 1 to %llu",
				                 (unsigned long long)CLI_MAX_TTL_MS);
			a->ttl_ms = n;
			seen |= OPT_TTL;
		} else if (is_opt(s, "--prefix", true)) {
			if ((v = opt_value(argc, argv, &i, s, strlen("--prefix"))) == NULL)
				return usage_err(err, errlen, "--prefix needs a value");
			a->prefix = v;
			seen |= OPT_PREFIX;
		} else if (is_opt(s, "--limit", true)) {
			if ((v = opt_value(argc, argv, &i, s, strlen("--limit"))) == NULL ||
			    !parse_u64(v, (uint64_t)1 << 40, &n))
				return usage_err(err, errlen, "--limit needs a number");
			a->limit = (long long)n;
			seen |= OPT_LIMIT;
		} else if (is_opt(s, "--rate", true)) {
			if ((v = opt_value(argc, argv, &i, s, strlen("--rate"))) == NULL ||
			    !parse_u64(v, UINT32_MAX, &n))
				return usage_err(err, errlen, "--rate needs a number of MB/s");
			a->rate_mb_s = (uint32_t)n;
			a->has_rate = true;
			seen |= OPT_RATE;
		} else {
			return usage_err(err, errlen, "unknown option '%s' (try 'shardkv --help')",
			                 s);
		}
	}
	if (a->help || a->version)
		return KV_CLI_OK;
	if (a->cmd == NULL) {
		a->no_command = true;
		return usage_err(err, errlen, "no command given (try 'shardkv --help')");
	}
	if (seen & ~cmd->opts) {
		static const char *names[] = {"--wait",      "--no-rebalance", "--prefix",
		                              "--limit",     "--rate",         "--accept-data-loss",
		                              "--raw",       "--dry-run",      "--ttl",
		                              "--if-absent", "--if-equal"};
		for (unsigned b = 0; b < sizeof(names) / sizeof(names[0]); b++)
			if ((seen & ~cmd->opts) & (1u << b))
				return usage_err(err, errlen, "%s: option %s does not apply",
				                 cmd->name, names[b]);
	}
	if (a->nargs < cmd->min || (cmd->max >= 0 && a->nargs > cmd->max)) {
		char u[160];
		snprintf(u, sizeof(u), "%s: %s (usage: shardkv %s %s)", cmd->name,
		         a->nargs < cmd->min ? "missing arguments" : "too many arguments",
		         cmd->name, cmd->usage);
		return usage_err(err, errlen, "%s", u);
	}
	if (a->raw && a->json)
		return usage_err(err, errlen, "%s: --raw and --json exclude each other", cmd->name);
	if (a->dry_run && a->wait)
		return usage_err(err, errlen,
		                 "%s: --wait and --dry-run exclude each other (a dry run starts "
		                 "nothing)",
		                 cmd->name);
	if (strcmp(cmd->name, "mput") == 0 && a->nargs % 2 != 0)
		return usage_err(err, errlen,
		                 "mput: the numbers of keys and values differ (every KEY needs a "
		                 "VALUE; nothing was written)");
	if (a->if_absent && a->if_equal)
		return usage_err(err, errlen, "%s: --if-absent and --if-equal exclude each other",
		                 cmd->name);
	if (strcmp(cmd->name, "expire") == 0) {
		uint64_t n;
		if (!parse_u64(a->args[1], CLI_MAX_TTL_MS, &n) || n == 0)
			return usage_err(err, errlen, "expire: MS must be 1 to %llu, not '%.100s'",
			                 (unsigned long long)CLI_MAX_TTL_MS, a->args[1]);
	}
	if (strcmp(cmd->name, "incr") == 0 && a->nargs == 2) {
		char *e;
		errno = 0;
		(void)strtoll(a->args[1], &e, 10);
		const char *d = a->args[1][0] == '-' ? a->args[1] + 1 : a->args[1];
		if (errno != 0 || e == a->args[1] || *e != 0 || *d < '0' || *d > '9')
			return usage_err(err, errlen,
			                 "incr: N must be a signed 64-bit integer, not '%.100s'",
			                 a->args[1]);
	}
	if (strcmp(cmd->name, "config") == 0 && a->nargs == 1) {
		uint64_t n;
		if (!parse_u64(a->args[0], UINT64_MAX, &n) || n == 0)
			return usage_err(err, errlen,
			                 "config: EPOCH must be a positive number, not '%s'",
			                 a->args[0]);
	}
	if (strcmp(cmd->name, "cancel") == 0) {
		uint64_t n;
		if (!parse_u64(a->args[0], UINT64_MAX, &n) || n == 0)
			return usage_err(
			    err, errlen,
			    "cancel: MIGRATION_ID must be a positive number, not '%.100s'",
			    a->args[0]);
	}
	return KV_CLI_OK;
}

void
kv_cli_args_fini(kv_cli_args *a)
{
	free(a->args);
	a->args = NULL;
}

static void
print_help(FILE *f, const cli_cmd *cmd)
{
	if (cmd && strcmp(cmd->name, "bench") == 0) {
		kv_bench_usage(f);
		return;
	}
	if (cmd) {
		fprintf(f, "usage: shardkv [global options] %s %s\n  %s\n", cmd->name, cmd->usage,
		        cmd->help);
		if (strcmp(cmd->name, "put") == 0 || strcmp(cmd->name, "append") == 0 ||
		    strcmp(cmd->name, "mput") == 0)
			fprintf(f, "  A VALUE of `-` is read from stdin (once per command).\n");
		if (cmd->opts & OPT_TTL)
			fprintf(
			    f,
			    "  --ttl MS: the keys written expire MS milliseconds later (a write\n"
			    "  without it clears an earlier expiry).\n");
		if (cmd->opts & OPT_IFEQ)
			fprintf(
			    f,
			    "  --if-absent writes only when KEY does not exist; --if-equal OLD\n"
			    "  writes (deletes) only when KEY holds exactly OLD. When the "
			    "condition\n"
			    "  does not hold nothing changes, the exit code is 1 and stderr says\n"
			    "  \"exists\" or \"mismatch\" with KEY's current value.\n");
		if (cmd->opts & OPT_DRY)
			fprintf(
			    f, "  --dry-run prints the migrations the command would start, as the\n"
			       "  controller plans them now, and changes nothing.\n");
		if (cmd->opts & OPT_WAIT)
			fprintf(
			    f, "  --wait follows the migrations until they finish (progress on a\n"
			       "  terminal, a line per second otherwise) and prints the time they\n"
			       "  took; Ctrl-C stops the waiting, not the migrations.\n");
		if (strcmp(cmd->name, "cancel") == 0)
			fprintf(f,
			        "  The range stays with its source; the destination drops what it\n"
			        "  received. Exit 1 when no such migration is in flight (unknown,\n"
			        "  finished or cancelled), 3 when it has already fenced (it then\n"
			        "  completes on its own).\n");
		return;
	}
	fprintf(f,
	        "usage: shardkv [-c|--controller ADDR] [--json] [--timeout MS] COMMAND ARGS...\n"
	        "\n"
	        "Global options:\n"
	        "  -c, --controller ADDR   controller URL(s), comma-separated "
	        "(default: $SHARDKV_CONTROLLER, else " DEFAULT_CONTROLLER ")\n"
	        "  --json                  print one JSON object\n"
	        "  --version               print the version\n"
	        "  -v, --verbose           show the library's log lines on stderr (reconnections,\n"
	        "                          redials; without it the CLI prints none)\n"
	        "  --timeout MS            per-call deadline in milliseconds (default 5000)\n"
	        "  --auth-token-file F     send the cluster's shared secret, read from F\n"
	        "                          (default: $SHARDKV_AUTH_TOKEN_FILE)\n"
	        "  --tls-ca F              TLS (tls+tcp:// addresses): the CA the servers'\n"
	        "                          certificates must be signed by ($SHARDKV_TLS_CA)\n"
	        "  --tls-cert F            this client's certificate ($SHARDKV_TLS_CERT)\n"
	        "  --tls-key F             its private key ($SHARDKV_TLS_KEY)\n"
	        "  -h, --help              this help; COMMAND --help for a command\n"
	        "\nCommands:\n");
	for (size_t i = 0; i < NCMDS; i++)
		fprintf(f, "  %-9s %-50s %s\n", cmds[i].name, cmds[i].usage, cmds[i].help);
	fprintf(f, "\nExit codes: 0 success, 1 not found or condition not met, 2 usage or invalid "
	           "request, "
	           "3 unavailable or timed out, 4 rejected, 5 internal error.\n"
	           "Use -- before values that start with '-'. With no command on a terminal,\n"
	           "shardkv opens an interactive prompt.\n");
}

/* ---------------------------------------------------------------------------
 * Helpers for handlers
 * ------------------------------------------------------------------------- */

/*
 * Reports a library error and returns the exit code: the code's message,
 * then the detail when it adds something. A refusal the cluster explained
 * (not found, exists, invalid) shows the explanation alone.
 */
static int
fail(cli_ctx *x, int err)
{
	const char *m = shardkv_errmsg(), *e = shardkv_strerror(err);

	if (err == SHARDKV_EAUTH && strncmp(m, "TLS handshake", 13) == 0)
		fprintf(x->err, "shardkv: %s: %s\n", x->a->cmd, m);
	else if (err == SHARDKV_EAUTH)
		fprintf(x->err, "shardkv: %s: authentication failed: %s%s\n", x->a->cmd,
		        m[0] && strcmp(m, e) != 0 ? m : "the cluster refused the token",
		        x->token_len ? "" : " (no --auth-token-file given)");
	else if (m[0] == 0 || strcmp(m, e) == 0)
		fprintf(x->err, "shardkv: %s: %s\n", x->a->cmd, e);
	else if (err == SHARDKV_ENOTFOUND || err == SHARDKV_EEXISTS || err == SHARDKV_EINVAL)
		fprintf(x->err, "shardkv: %s: %s\n", x->a->cmd, m);
	else if (err == SHARDKV_EUNAVAIL && strncmp(m, "cannot reach the controller at", 30) == 0)
		fprintf(x->err, "shardkv: %s: %s: %s (-c or SHARDKV_CONTROLLER sets it)\n",
		        x->a->cmd, e, m);
	else
		fprintf(x->err, "shardkv: %s: %s: %s\n", x->a->cmd, e, m);
	/* An admin command naming an unknown node is an invalid request (2),
	 * not a missing key (1). */
	if (err == SHARDKV_ENOTFOUND &&
	    (strcmp(x->a->cmd, "join") == 0 || strcmp(x->a->cmd, "leave") == 0 ||
	     strcmp(x->a->cmd, "remove") == 0 || strcmp(x->a->cmd, "move") == 0 ||
	     strcmp(x->a->cmd, "rebalance") == 0))
		return 2;
	return kv_cli_exit_code(err);
}

/* Returns a value argument's bytes; `-` reads stdin (once). */
static int
value_arg(cli_ctx *x, const char *arg, shardkv_bytes *out)
{
	size_t len = 0, cap = 0;

	if (strcmp(arg, "-") != 0) {
		out->data = arg;
		out->len = strlen(arg);
		return 0;
	}
	if (x->stdin_used) {
		fprintf(x->err, "shardkv: %s: only one VALUE can be read from stdin\n", x->a->cmd);
		return KV_CLI_USAGE;
	}
	x->stdin_used = true;
	for (;;) {
		if (len == cap) {
			size_t ncap = cap ? cap * 2 : 65536;
			uint8_t *n;
			if (ncap > (size_t)64 * 1024 * 1024 + 65536) {
				fprintf(x->err, "shardkv: %s: the value on stdin exceeds 64 MiB\n",
				        x->a->cmd);
				return KV_CLI_REJECTED;
			}
			if ((n = realloc(x->stdin_buf, ncap)) == NULL) {
				fprintf(x->err, "shardkv: %s: out of memory\n", x->a->cmd);
				return KV_CLI_INTERNAL;
			}
			x->stdin_buf = n;
			cap = ncap;
		}
		size_t got = fread(x->stdin_buf + len, 1, cap - len, stdin);
		len += got;
		if (got == 0) {
			if (ferror(stdin)) {
				fprintf(x->err, "shardkv: %s: reading stdin: %s\n", x->a->cmd,
				        strerror(errno));
				return KV_CLI_INTERNAL;
			}
			break;
		}
	}
	out->data = x->stdin_buf;
	out->len = len;
	return 0;
}

static void
print_raw(FILE *f, const void *p, size_t n)
{
	if (n)
		fwrite(p, 1, n, f);
	fputc('\n', f);
}

/* ---------------------------------------------------------------------------
 * Data commands
 * ------------------------------------------------------------------------- */

/* Prints the value of get/del: {"key": K, "value": V} with --json, the
 * bytes alone with --raw, else the bytes and a newline. */
static void
print_value(cli_ctx *x, const char *k, const shardkv_buf *v)
{
	if (x->a->json) {
		fprintf(x->out, "{\"key\": ");
		json_str(x->out, k, strlen(k));
		fprintf(x->out, ", \"value\": ");
		json_str(x->out, v->data, v->len);
		fprintf(x->out, "}\n");
	} else if (x->a->raw) {
		if (v->len)
			fwrite(v->data, 1, v->len, x->out);
	} else {
		print_raw(x->out, v->data, v->len);
	}
}

/*
 * Reports SHARDKV_ETOOBIG of a write as one specific sentence: which of the
 * key or the value is over, its size, and the limit when it is the default
 * one (a server started with --max-key/--max-value may have another, which
 * its answer does not carry).
 */
static int
fail_size(cli_ctx *x, int err, size_t klen, size_t vlen)
{
	if (err != SHARDKV_ETOOBIG)
		return fail(x, err);
	if (klen > KV_DEFAULT_MAX_KEY)
		fprintf(x->err, "shardkv: %s: key of %zu bytes is over the limit of %u bytes\n",
		        x->a->cmd, klen, KV_DEFAULT_MAX_KEY);
	else if (vlen > KV_DEFAULT_MAX_VALUE)
		fprintf(x->err, "shardkv: %s: value of %zu bytes is over the limit of %u bytes\n",
		        x->a->cmd, vlen, KV_DEFAULT_MAX_VALUE);
	else
		fprintf(x->err,
		        "shardkv: %s: key of %zu bytes or value of %zu bytes is over the server's "
		        "limit (shardkv-server --max-key/--max-value)\n",
		        x->a->cmd, klen, vlen);
	return kv_cli_exit_code(err);
}

static int
cmd_get(cli_ctx *x)
{
	const char *k = x->a->args[0];
	shardkv_buf v;
	int rv = shardkv_get(x->c, k, strlen(k), &v);

	if (rv != 0)
		return fail_size(x, rv, strlen(k), 0);
	print_value(x, k, &v);
	shardkv_free(v.data);
	return 0;
}

/*
 * A conditional write whose condition did not hold: exit 1 (doc/contract.md
 * §5), "exists" or "mismatch" and the key's current value on stderr, and
 * with --json one object on stdout: {"key": K, "written": false,
 * "condition": "exists|mismatch", "current": V or null}.
 */
static int
cond_failed(cli_ctx *x, const char *k, int rv, shardkv_buf *cur)
{
	const char *what = rv == SHARDKV_EEXISTS ? "exists" : "mismatch";

	if (x->a->json) {
		fprintf(x->out, "{\"key\": ");
		json_str(x->out, k, strlen(k));
		fprintf(x->out, ", \"written\": false, \"condition\": \"%s\", \"current\": ", what);
		if (cur->data)
			json_str(x->out, cur->data, cur->len);
		else
			fputs("null", x->out);
		fprintf(x->out, "}\n");
	}
	if (cur->data == NULL) {
		fprintf(x->err, "shardkv: %s: %s: the key is absent\n", x->a->cmd, what);
	} else {
		fprintf(x->err, "shardkv: %s: %s: current value ", x->a->cmd, what);
		human_str(x->err, cur->data, cur->len);
		fputc('\n', x->err);
	}
	shardkv_free(cur->data);
	return KV_CLI_NOTFOUND;
}

static int
cmd_put(cli_ctx *x)
{
	const char *k = x->a->args[0];
	shardkv_put_options o = {.ttl_ms = x->a->ttl_ms, .if_absent = x->a->if_absent};
	shardkv_buf cur = {0};
	shardkv_bytes v;
	int rv;

	if ((rv = value_arg(x, x->a->args[1], &v)) != 0)
		return rv;
	if (x->a->if_equal) {
		o.if_equal = true;
		o.expect = (shardkv_bytes){x->a->if_equal, strlen(x->a->if_equal)};
	}
	rv = shardkv_put_ex(x->c, k, strlen(k), v.data, v.len, &o, &cur);
	if (rv == SHARDKV_EEXISTS || rv == SHARDKV_EMISMATCH)
		return cond_failed(x, k, rv, &cur);
	if (rv != 0)
		return fail_size(x, rv, strlen(k), v.len);
	return 0;
}

static int
cmd_del(cli_ctx *x)
{
	const char *k = x->a->args[0];
	shardkv_buf v;
	int rv;

	if (x->a->if_equal) {
		/* Deleted only when it held OLD: the value it had is OLD. */
		shardkv_buf cur = {0};
		size_t n = strlen(x->a->if_equal);
		rv = shardkv_del_if_equal(x->c, k, strlen(k), x->a->if_equal, n, &cur);
		if (rv == SHARDKV_EMISMATCH)
			return cond_failed(x, k, rv, &cur);
		if (rv != 0)
			return fail_size(x, rv, strlen(k), n);
		v.data = (uint8_t *)(uintptr_t)x->a->if_equal;
		v.len = n;
		print_value(x, k, &v);
		return 0;
	}
	rv = shardkv_del(x->c, k, strlen(k), &v);

	if (rv != 0)
		return fail_size(x, rv, strlen(k), 0);
	print_value(x, k, &v);
	shardkv_free(v.data);
	return 0;
}

static int
cmd_append(cli_ctx *x)
{
	const char *k = x->a->args[0];
	shardkv_bytes v;
	int rv;

	if ((rv = value_arg(x, x->a->args[1], &v)) != 0)
		return rv;
	if ((rv = shardkv_append(x->c, k, strlen(k), v.data, v.len, NULL)) != 0)
		return fail_size(x, rv, strlen(k), v.len);
	return 0;
}

static int
cmd_mget(cli_ctx *x)
{
	size_t n = (size_t)x->a->nargs;
	shardkv_bytes *keys = calloc(n, sizeof(*keys));
	shardkv_mget_result *r = NULL;
	int rv;

	if (keys == NULL)
		return fail(x, SHARDKV_ENOMEM);
	for (size_t i = 0; i < n; i++) {
		keys[i].data = x->a->args[i];
		keys[i].len = strlen(x->a->args[i]);
	}
	rv = shardkv_mget(x->c, n, keys, &r);
	if (rv == SHARDKV_ENOTFOUND && r != NULL) {
		/* The error names the missing keys. */
		if (x->a->json) { /* the values, null where a key is missing */
			fprintf(x->out, "{\"values\": [");
			for (size_t i = 0; i < r->n; i++) {
				fputs(i ? ", " : "", x->out);
				if (r->values[i].data == NULL)
					fputs("null", x->out);
				else
					json_str(x->out, r->values[i].data, r->values[i].len);
			}
			fprintf(x->out, "]}\n");
		}
		fprintf(x->err, "shardkv: mget: key not found:");
		for (size_t i = 0; i < r->nmissing; i++) {
			fputc(' ', x->err);
			human_str(x->err, keys[r->missing[i]].data, keys[r->missing[i]].len);
		}
		fputc('\n', x->err);
		shardkv_mget_result_free(r);
		free(keys);
		return KV_CLI_NOTFOUND;
	}
	if (rv != 0) {
		size_t kmax = 0;
		for (size_t i = 0; i < n; i++)
			kmax = keys[i].len > kmax ? keys[i].len : kmax;
		free(keys);
		return fail_size(x, rv, kmax, 0);
	}
	free(keys);
	if (x->a->json) {
		fprintf(x->out, "{\"values\": [");
		for (size_t i = 0; i < r->n; i++) {
			fputs(i ? ", " : "", x->out);
			json_str(x->out, r->values[i].data, r->values[i].len);
		}
		fprintf(x->out, "]}\n");
	} else {
		for (size_t i = 0; i < r->n; i++)
			print_raw(x->out, r->values[i].data, r->values[i].len);
	}
	shardkv_mget_result_free(r);
	return 0;
}

static int
cmd_mput(cli_ctx *x)
{
	size_t n = (size_t)x->a->nargs / 2;
	shardkv_bytes *keys = calloc(n, sizeof(*keys)), *vals = calloc(n, sizeof(*vals));
	shardkv_mput_result *r = NULL;
	int rv = 0;

	if (keys == NULL || vals == NULL) {
		free(keys);
		free(vals);
		return fail(x, SHARDKV_ENOMEM);
	}
	for (size_t i = 0; i < n && rv == 0; i++) {
		keys[i].data = x->a->args[2 * i];
		keys[i].len = strlen(x->a->args[2 * i]);
		rv = value_arg(x, x->a->args[2 * i + 1], &vals[i]);
	}
	if (rv != 0)
		goto out;
	rv = shardkv_mput_ex(x->c, n, keys, n, vals, x->a->ttl_ms, &r);
	if (rv != 0 && r != NULL && r->nfailed > 0) {
		for (size_t i = 0; i < r->nfailed; i++) {
			const shardkv_node_error *e = &r->failed[i];
			fprintf(x->err,
			        "shardkv: mput: node %" PRIu32 " (%s): %s (%zu keys not written)\n",
			        e->node_id, e->address ? e->address : "?", shardkv_strerror(e->err),
			        e->nkeys);
		}
		rv = kv_cli_exit_code(rv);
	} else if (rv != 0) {
		size_t kmax = 0, vmax = 0;
		for (size_t i = 0; i < n; i++) {
			kmax = keys[i].len > kmax ? keys[i].len : kmax;
			vmax = vals[i].len > vmax ? vals[i].len : vmax;
		}
		rv = fail_size(x, rv, kmax, vmax);
	}
out:
	shardkv_mput_result_free(r);
	free(keys);
	free(vals);
	return rv;
}

/* Entries asked for per page by keys and scan: each page is printed as it
 * arrives, so memory stays bounded whatever the range holds. */
#define SCAN_PAGE 1000u

/*
 * keys and scan: reads [start, end) (keys only with a prefix for keys) page
 * by page and prints each page at once, at most --limit entries. Lines:
 * `key` or `key<TAB>value`; --json: {"keys": [...]} or {"pairs": [[K, V],
 * ...], "next": K or null}, where next is where a scan stopped by --limit
 * would resume.
 */
static int
stream_scan(cli_ctx *x, const char *start, const char *end, const char *prefix, bool keys_only)
{
	shardkv_scan_args sa = {0};
	shardkv_scan_result *r = NULL;
	uint8_t *resume = NULL; /* owned copy of the next start */
	unsigned long long left = x->a->limit >= 0 ? (unsigned long long)x->a->limit : ULLONG_MAX;
	size_t printed = 0;
	bool more = left > 0;
	int rv = 0;

	sa.start.data = start;
	sa.start.len = strlen(start);
	sa.end.data = end;
	sa.end.len = strlen(end);
	sa.prefix.data = prefix;
	sa.prefix.len = strlen(prefix);
	sa.keys_only = keys_only;
	if (x->a->json)
		fprintf(x->out, keys_only ? "{\"keys\": [" : "{\"pairs\": [");
	while (more) {
		/* Near --limit, one entry more than is printed: its key is where
		 * the scan would resume (`next`). */
		size_t show;
		sa.limit = left < SCAN_PAGE ? (size_t)left + 1 : SCAN_PAGE;
		if ((rv = shardkv_scan_ex(x->c, &sa, &r)) != 0)
			break;
		show = r->n < left ? r->n : (size_t)left;
		for (size_t i = 0; i < show; i++) {
			const shardkv_entry *en = &r->entries[i];
			if (x->a->json) {
				fputs(printed ? ", " : "", x->out);
				if (!keys_only)
					fputc('[', x->out);
				json_str(x->out, en->key.data, en->key.len);
				if (!keys_only) {
					fputs(", ", x->out);
					json_str(x->out, en->value.data, en->value.len);
					fputc(']', x->out);
				}
			} else if (keys_only) {
				print_raw(x->out, en->key.data, en->key.len);
			} else {
				if (en->key.len)
					fwrite(en->key.data, 1, en->key.len, x->out);
				fputc('\t', x->out);
				print_raw(x->out, en->value.data, en->value.len);
			}
			printed++;
		}
		left -= show;
		more = (r->more && r->next.len > 0) || r->n > show;
		free(resume);
		resume = NULL;
		if (r->n > show) {
			const shardkv_buf *k = &r->entries[show].key;
			if ((resume = malloc(k->len ? k->len : 1)) == NULL) {
				rv = SHARDKV_ENOMEM;
				break;
			}
			if (k->len)
				memcpy(resume, k->data, k->len);
			sa.start.data = resume;
			sa.start.len = k->len;
		} else if (more) {
			if ((resume = malloc(r->next.len)) == NULL) {
				rv = SHARDKV_ENOMEM;
				break;
			}
			memcpy(resume, r->next.data, r->next.len);
			sa.start.data = resume;
			sa.start.len = r->next.len;
		}
		bool got_next = r->n > show;
		shardkv_scan_result_free(r);
		r = NULL;
		if (more && left == 0 && got_next)
			break; /* stopped by --limit: `next` is the first key left out */
		fflush(x->out);
	}
	shardkv_scan_result_free(r);
	if (x->a->json && rv == 0) {
		if (keys_only) {
			fprintf(x->out, "]}\n");
		} else {
			fprintf(x->out, "], \"next\": ");
			if (more && left == 0 && resume)
				json_str(x->out, resume, sa.start.len);
			else
				fputs("null", x->out);
			fprintf(x->out, "}\n");
		}
	} else if (x->a->json) {
		fputc('\n', x->out); /* the object stays open: stderr says why */
	}
	free(resume);
	return rv ? fail(x, rv) : 0;
}

static int
cmd_keys(cli_ctx *x)
{
	return stream_scan(x, "", "", x->a->prefix ? x->a->prefix : "", true);
}

static int
cmd_scan(cli_ctx *x)
{
	return stream_scan(x, x->a->args[0], x->a->args[1], "", false);
}

static int
cmd_bench(cli_ctx *x)
{
	shardkv_options o = *x->opt;
	o.timeout_ms = x->a->timeout_ms;
	return kv_bench_main(x->a->nargs, x->a->args, x->ctl, x->c, &o, x->a->json, x->out, x->err);
}

/* ---------------------------------------------------------------------------
 * Admin commands
 * ------------------------------------------------------------------------- */

static double
seconds_since(const struct timespec *t0)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) / 1e9;
}

/* Set by SIGINT while --wait polls. */
static volatile sig_atomic_t wait_interrupted;

static void
on_sigint(int sig)
{
	(void)sig;
	wait_interrupted = 1;
}

/* Whether migration id belongs to the command (ids first .. first+n-1). */
static bool
mig_ours(const shardkv_admin_result *r, uint64_t id)
{
	return r->nmigrations && id >= r->first_mig_id && id - r->first_mig_id < r->nmigrations;
}

/* One progress line of a migration: keys, rate and ETA. */
static void
progress_line(cli_ctx *x, const shardkv_migration *m)
{
	fprintf(x->out, "  migration %" PRIu64 " %" PRIu32 " -> %" PRIu32 " %-8s keys %" PRIu64,
	        m->id, m->from, m->to, m->phase, m->keys_copied);
	if (m->keys_total)
		fprintf(x->out, "/%" PRIu64, m->keys_total);
	if (m->rate_bytes_s)
		fprintf(x->out, "  %.2f MB/s", (double)m->rate_bytes_s / 1e6);
	else
		fprintf(x->out, "  ? MB/s");
	if (m->eta_ms)
		fprintf(x->out, "  ETA %.0f s", (double)m->eta_ms / 1000.0);
	else
		fprintf(x->out, "  ETA ?");
}

/*
 * --wait: polls the status until none of the command's migrations is in
 * flight, showing their progress: redrawn in place about ten times a
 * second on a terminal, a plain line per migration and second otherwise
 * (none with --json). Ctrl-C stops the waiting, not the migrations, and
 * says how to cancel them. Returns 0, or the exit code.
 */
static int
wait_migrations(cli_ctx *x, const shardkv_admin_result *r, const struct timespec *t0)
{
	uint32_t limit_ms = x->a->timeout_ms ? x->a->timeout_ms : WAIT_TIMEOUT_MS;
	bool tty = !x->a->json && isatty(fileno(x->out));
	struct sigaction sa = {0}, old;
	size_t drawn = 0; /* lines drawn last time on a terminal */
	double last_plain = -1.0;
	int rv = 0;

	if (r->nmigrations == 0)
		return 0;
	wait_interrupted = 0;
	sa.sa_handler = on_sigint;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, &old);
	for (;;) {
		shardkv_config *cfg;
		size_t live = 0;
		double now = seconds_since(t0);

		if ((rv = shardkv_status(x->c, &cfg)) != 0) {
			rv = fail(x, rv);
			break;
		}
		for (size_t i = 0; i < cfg->nmigrations; i++)
			live += mig_ours(r, cfg->migrations[i].id);
		if (tty) {
			if (drawn)
				fprintf(x->out, "\033[%zuA", drawn);
			drawn = 0;
			for (size_t i = 0; i < cfg->nmigrations; i++) {
				if (!mig_ours(r, cfg->migrations[i].id))
					continue;
				fputs("\r\033[K", x->out);
				progress_line(x, &cfg->migrations[i]);
				fputc('\n', x->out);
				drawn++;
			}
			fputs("\033[J", x->out);
		} else if (!x->a->json && live && (last_plain < 0 || now - last_plain >= 1.0)) {
			last_plain = now;
			for (size_t i = 0; i < cfg->nmigrations; i++) {
				if (!mig_ours(r, cfg->migrations[i].id))
					continue;
				progress_line(x, &cfg->migrations[i]);
				fputc('\n', x->out);
			}
		}
		fflush(x->out);
		shardkv_config_free(cfg);
		if (live == 0)
			break;
		if (wait_interrupted) {
			fprintf(x->err,
			        "shardkv: %s: interrupted; the migration%s go%s on in the "
			        "background (progress: shardkv status; to stop one: shardkv cancel "
			        "ID, with ID",
			        x->a->cmd, r->nmigrations == 1 ? "" : "s",
			        r->nmigrations == 1 ? "es" : "");
			for (size_t i = 0; i < r->nmigrations; i++)
				fprintf(x->err, "%s%" PRIu64, i ? ", " : " ", r->first_mig_id + i);
			fprintf(x->err, ")\n");
			rv = 130;
			break;
		}
		if (now * 1000.0 >= (double)limit_ms) {
			fprintf(x->err,
			        "shardkv: %s: still migrating after %.1f s (--timeout); the "
			        "migrations go on (shardkv status)\n",
			        x->a->cmd, now);
			rv = KV_CLI_UNAVAIL;
			break;
		}
		struct timespec ts = {0, 100 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	sigaction(SIGINT, &old, NULL);
	return rv;
}

/* Prints the outcome of join/leave/move/rebalance. `what` is the human
 * sentence before " in epoch N": printed as soon as the controller accepted
 * the command, before --wait shows the progress. */
static int
admin_report(cli_ctx *x, int rv, const shardkv_admin_result *r, const char *what,
             const struct timespec *t0)
{
	double secs;

	if (rv != 0)
		return fail(x, rv);
	if (!x->a->json) {
		fprintf(x->out, "%s in epoch %" PRIu64 " (%zu migration%s)\n", what, r->epoch,
		        r->nmigrations, r->nmigrations == 1 ? "" : "s");
		fflush(x->out);
	}
	if (x->a->wait && (rv = wait_migrations(x, r, t0)) != 0)
		return rv;
	secs = seconds_since(t0);
	if (x->a->json) {
		fprintf(x->out, "{\"epoch\": %" PRIu64 ", \"command\": \"%s\", \"migrations\": %zu",
		        r->epoch, x->a->cmd, r->nmigrations);
		if (r->node_id)
			fprintf(x->out, ", \"node\": %" PRIu32, r->node_id);
		if (x->a->wait)
			fprintf(x->out, ", \"wait_ms\": %" PRIu64 ", \"wait_s\": %.3f",
			        r->wait_ms ? r->wait_ms : (uint64_t)(secs * 1000.0), secs);
		fprintf(x->out, "}\n");
		return 0;
	}
	if (x->a->wait)
		fprintf(x->out, "migrations finished in %.3f s\n", secs);
	return 0;
}

/* The library's flag is not used: admin_report waits itself, so that the
 * command's line comes as soon as it is accepted and progress follows. */
static unsigned
wait_flag(cli_ctx *x)
{
	(void)x;
	return 0;
}

/* Prints {"key": K, "NAME": N} with --json, else N alone. */
static void
print_num(cli_ctx *x, const char *k, const char *name, long long n)
{
	if (x->a->json) {
		fprintf(x->out, "{\"key\": ");
		json_str(x->out, k, strlen(k));
		fprintf(x->out, ", \"%s\": %lld}\n", name, n);
	} else {
		fprintf(x->out, "%lld\n", n);
	}
}

static int
cmd_incr(cli_ctx *x)
{
	const char *k = x->a->args[0];
	long long delta = x->a->nargs == 2 ? strtoll(x->a->args[1], NULL, 10) : 1; /* checked */
	int64_t n;
	int rv = shardkv_incr(x->c, k, strlen(k), delta, &n);

	if (rv != 0)
		return fail_size(x, rv, strlen(k), 0);
	print_num(x, k, "value", (long long)n);
	return 0;
}

static int
cmd_expire(cli_ctx *x)
{
	const char *k = x->a->args[0];
	unsigned long long ms = strtoull(x->a->args[1], NULL, 10); /* checked by the parser */
	int rv = shardkv_expire(x->c, k, strlen(k), ms);

	if (rv != 0)
		return fail_size(x, rv, strlen(k), 0);
	if (x->a->json)
		print_num(x, k, "ttl_ms", (long long)ms);
	return 0;
}

static int
cmd_persist(cli_ctx *x)
{
	const char *k = x->a->args[0];
	int rv = shardkv_persist(x->c, k, strlen(k));

	if (rv != 0)
		return fail_size(x, rv, strlen(k), 0);
	if (x->a->json)
		print_num(x, k, "ttl_ms", -1);
	return 0;
}

static int
cmd_ttl(cli_ctx *x)
{
	const char *k = x->a->args[0];
	int64_t ms;
	int rv = shardkv_ttl(x->c, k, strlen(k), &ms);

	if (rv != 0)
		return fail_size(x, rv, strlen(k), 0);
	print_num(x, k, "ttl_ms", (long long)ms);
	return 0;
}

static int
cmd_exists(cli_ctx *x)
{
	const char *k = x->a->args[0];
	int rv = shardkv_exists(x->c, k, strlen(k));

	if (rv != 0 && rv != SHARDKV_ENOTFOUND)
		return fail_size(x, rv, strlen(k), 0);
	if (x->a->json) {
		fprintf(x->out, "{\"key\": ");
		json_str(x->out, k, strlen(k));
		fprintf(x->out, ", \"exists\": %s}\n", rv == 0 ? "true" : "false");
	}
	return rv == 0 ? 0 : KV_CLI_NOTFOUND;
}

/* count and delrange: the number, or {"NAME": N} with --json. */
static int
range_cmd(cli_ctx *x, bool del)
{
	const char *st = x->a->args[0], *en = x->a->args[1];
	uint64_t n = 0;
	int rv = del ? shardkv_delrange(x->c, st, strlen(st), en, strlen(en), &n)
	             : shardkv_count(x->c, st, strlen(st), en, strlen(en), &n);

	if (rv != 0)
		return fail(x, rv);
	if (x->a->json)
		fprintf(x->out, "{\"%s\": %" PRIu64 "}\n", del ? "deleted" : "count", n);
	else
		fprintf(x->out, "%" PRIu64 "\n", n);
	return 0;
}

static int
cmd_count(cli_ctx *x)
{
	return range_cmd(x, false);
}

static int
cmd_delrange(cli_ctx *x)
{
	return range_cmd(x, true);
}

static int
cmd_join(cli_ctx *x)
{
	shardkv_admin_result r = {0};
	struct timespec t0;
	char what[600];
	int rv;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	rv = shardkv_join(x->c, x->a->args[0],
	                  wait_flag(x) | (x->a->no_rebalance ? SHARDKV_NO_REBALANCE : 0), &r);
	snprintf(what, sizeof(what), "joined %s as node %" PRIu32, x->a->args[0], r.node_id);
	return admin_report(x, rv, &r, what, &t0);
}

static int
cmd_leave(cli_ctx *x)
{
	shardkv_admin_result r = {0};
	struct timespec t0;
	char what[600];
	int rv;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	rv = shardkv_leave(x->c, x->a->args[0], wait_flag(x), &r);
	snprintf(what, sizeof(what), "node %s is leaving", x->a->args[0]);
	return admin_report(x, rv, &r, what, &t0);
}

/* Writes balancer decisions as a JSON list (doc/contract.md §5). */
static void
json_balancer(FILE *f, const shardkv_balancer_decision *d, size_t n, bool timed)
{
	fputc('[', f);
	for (size_t i = 0; i < n; i++) {
		fprintf(f, "%s{", i ? ", " : "");
		if (timed)
			fprintf(f, "\"time_ms\": %" PRIu64 ", ", d[i].time_ms);
		fprintf(f, "\"kind\": ");
		json_str(f, d[i].kind, strlen(d[i].kind));
		fprintf(f, ", \"reason\": ");
		json_str(f, d[i].reason, strlen(d[i].reason));
		fprintf(f, ", \"what\": ");
		json_str(f, d[i].what, strlen(d[i].what));
		fputc('}', f);
	}
	fputc(']', f);
}

/* Prints a dry run's plan (doc/contract.md §4): `what` is the command's
 * sentence ("rebalancing", "moving [a, b) to node 2"). */
static int
plan_report(cli_ctx *x, int rv, shardkv_plan *p, const char *what)
{
	if (rv != 0)
		return fail(x, rv);
	if (x->a->json) {
		fprintf(x->out,
		        "{\"epoch\": %" PRIu64 ", \"command\": \"%s\", \"dry_run\": true, "
		        "\"migrations\": %zu, \"plan\": [",
		        p->epoch, x->a->cmd, p->nsteps);
		for (size_t i = 0; i < p->nsteps; i++) {
			const shardkv_plan_step *s = &p->steps[i];
			fprintf(x->out, "%s{\"start\": ", i ? ", " : "");
			json_str(x->out, s->start.data, s->start.len);
			fprintf(x->out, ", \"end\": ");
			json_str(x->out, s->end.data, s->end.len);
			fprintf(x->out,
			        ", \"from\": %" PRIu32 ", \"to\": %" PRIu32 ", \"keys\": %" PRIu64
			        ", \"bytes\": %" PRIu64 "}",
			        s->from, s->to, s->keys, s->bytes);
		}
		fputc(']', x->out);
		if (strcmp(x->a->cmd, "rebalance") == 0) {
			fprintf(x->out, ", \"balancer_plan\": ");
			json_balancer(x->out, p->balancer, p->nbalancer, false);
		}
		fprintf(x->out, "}\n");
	} else {
		fprintf(
		    x->out,
		    "dry run: %s would start %zu migration%s (nothing changed, epoch stays %" PRIu64
		    ")\n",
		    what, p->nsteps, p->nsteps == 1 ? "" : "s", p->epoch);
		for (size_t i = 0; i < p->nsteps; i++) {
			const shardkv_plan_step *s = &p->steps[i];
			fprintf(x->out, "  [");
			human_str(x->out, s->start.data, s->start.len);
			fprintf(x->out, ", ");
			human_str(x->out, s->end.data, s->end.len);
			fprintf(x->out, ") %" PRIu32 " -> %" PRIu32, s->from, s->to);
			/* Estimates from the source's last heartbeat; "?" before one. */
			if (s->keys || s->bytes)
				fprintf(x->out, " keys=~%" PRIu64 " bytes=~%" PRIu64 "\n", s->keys,
				        s->bytes);
			else
				fprintf(x->out, " keys=? bytes=?\n");
		}
		if (p->nbalancer)
			fprintf(x->out, "the automatic balancer's next decisions:\n");
		for (size_t i = 0; i < p->nbalancer; i++)
			fprintf(x->out, "  %s\n", p->balancer[i].what);
	}
	shardkv_plan_free(p);
	return 0;
}

static int
cmd_move(cli_ctx *x)
{
	const char *s = x->a->args[0], *e = x->a->args[1];
	shardkv_admin_result r = {0};
	struct timespec t0;
	char what[600];
	int rv;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (x->a->dry_run) {
		shardkv_plan *p = NULL;
		rv = shardkv_move_plan(x->c, s, strlen(s), e, strlen(e), x->a->args[2],
		                       x->a->rate_mb_s, &p);
		snprintf(what, sizeof(what), "moving [%.250s, %.250s) to node %s", s, e,
		         x->a->args[2]);
		return plan_report(x, rv, p, what);
	}
	rv = shardkv_move(x->c, s, strlen(s), e, strlen(e), x->a->args[2], x->a->rate_mb_s,
	                  wait_flag(x), &r);
	snprintf(what, sizeof(what), "moving [%.250s, %.250s) to node %s", s, e, x->a->args[2]);
	return admin_report(x, rv, &r, what, &t0);
}

static int
cmd_rebalance(cli_ctx *x)
{
	shardkv_admin_result r = {0};
	struct timespec t0;
	int rv;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	if (x->a->dry_run) {
		shardkv_plan *p = NULL;
		rv = shardkv_rebalance_plan(x->c, x->a->rate_mb_s, &p);
		return plan_report(x, rv, p, "rebalancing");
	}
	rv = shardkv_rebalance(x->c, x->a->rate_mb_s, wait_flag(x), &r);
	return admin_report(x, rv, &r, "rebalancing", &t0);
}

static int
cmd_cancel(cli_ctx *x)
{
	uint64_t id = strtoull(x->a->args[0], NULL, 10); /* checked by kv_cli_parse */
	shardkv_admin_result r = {0};
	int rv = shardkv_cancel(x->c, id, &r);

	if (rv != 0)
		return fail(x, rv);
	if (x->a->json)
		fprintf(x->out,
		        "{\"epoch\": %" PRIu64 ", \"command\": \"cancel\", \"migration\": %" PRIu64
		        "}\n",
		        r.epoch, id);
	else
		fprintf(x->out, "cancelled migration %" PRIu64 " in epoch %" PRIu64 "\n", id,
		        r.epoch);
	return 0;
}

/* Node ids as a JSON array and as "1,2,3". */
static void
json_ids(FILE *f, const uint32_t *ids, size_t n)
{
	fputc('[', f);
	for (size_t i = 0; i < n && i < SHARDKV_MAX_REPLICAS; i++)
		fprintf(f, "%s%" PRIu32, i ? ", " : "", ids[i]);
	fputc(']', f);
}

static void
human_ids(FILE *f, const uint32_t *ids, size_t n)
{
	for (size_t i = 0; i < n && i < SHARDKV_MAX_REPLICAS; i++)
		fprintf(f, "%s%" PRIu32, i ? "," : "", ids[i]);
}

/* Ranges whose in-sync set is smaller than their replica set
 * (doc/contract.md §2). */
static size_t
under_replicated(const shardkv_config *cfg)
{
	size_t k = 0;

	for (size_t i = 0; i < cfg->nranges; i++)
		k += cfg->ranges[i].ninsync < cfg->ranges[i].nreplicas;
	return k;
}

static void
json_migrations(FILE *f, const shardkv_config *cfg, bool status)
{
	fprintf(f, "\"migrations\": [");
	for (size_t i = 0; i < cfg->nmigrations; i++) {
		const shardkv_migration *m = &cfg->migrations[i];
		fprintf(f, "%s{\"id\": %" PRIu64 ", \"start\": ", i ? ", " : "", m->id);
		json_str(f, m->start.data, m->start.len);
		fprintf(f, ", \"end\": ");
		json_str(f, m->end.data, m->end.len);
		fprintf(f,
		        ", \"from\": %" PRIu32 ", \"to\": %" PRIu32 ", \"phase\": \"%s\", "
		        "\"keys_copied\": %" PRIu64 ", \"bytes_copied\": %" PRIu64
		        ", \"keys_total\": %" PRIu64 ", \"bytes_total\": %" PRIu64
		        ", \"rate_bytes_s\": %" PRIu64 ", \"eta_s\": %.3f",
		        m->from, m->to, m->phase, m->keys_copied, m->bytes_copied, m->keys_total,
		        m->bytes_total, m->rate_bytes_s, (double)m->eta_ms / 1000.0);
		if (status) /* since the source's last progress report */
			fprintf(f, ", \"progress_age_ms\": %" PRIu64, m->progress_age_ms);
		fputc('}', f);
	}
	fprintf(f, "]");
}

static void
json_config(cli_ctx *x, const shardkv_config *cfg, bool status)
{
	FILE *f = x->out;

	fprintf(f, "{\"epoch\": %" PRIu64 ", \"nodes\": [", cfg->epoch);
	for (size_t i = 0; i < cfg->nnodes; i++) {
		const shardkv_node *n = &cfg->nodes[i];
		fprintf(f, "%s{\"id\": %" PRIu32 ", \"address\": ", i ? ", " : "", n->id);
		json_str(f, n->address, strlen(n->address));
		fprintf(f, ", \"state\": \"%s\"", shardkv_node_state_name(n->state));
		if (status) {
			size_t nr = 0;
			for (size_t j = 0; j < cfg->nranges; j++)
				nr += cfg->ranges[j].node == n->id;
			fprintf(f,
			        ", \"keys\": %" PRIu64 ", \"bytes\": %" PRIu64
			        ", \"ops_per_sec\": %.1f, \"memory_bytes\": %" PRIu64
			        ", \"last_seen_ms\": %" PRIu64 ", \"uptime_ms\": %" PRIu64
			        ", \"ranges\": %zu",
			        n->keys, n->bytes, n->ops_per_sec, n->memory_bytes, n->last_seen_ms,
			        n->uptime_ms, nr);
		}
		fputc('}', f);
	}
	fprintf(f, "], \"ranges\": [");
	for (size_t i = 0; i < cfg->nranges; i++) {
		const shardkv_range *r = &cfg->ranges[i];
		fprintf(f, "%s{\"start\": ", i ? ", " : "");
		json_str(f, r->start.data, r->start.len);
		fprintf(f, ", \"end\": ");
		json_str(f, r->end.data, r->end.len);
		fprintf(f, ", \"node\": %" PRIu32 ", \"replicas\": ", r->node);
		json_ids(f, r->replicas, r->nreplicas);
		fprintf(f, ", \"insync\": ");
		json_ids(f, r->insync, r->ninsync);
		fprintf(f, ", \"leader_epoch\": %" PRIu64 "}", r->leader_epoch);
	}
	/* The administrator's pins (doc/scheduler.md "Pins"). */
	fprintf(f, "], \"pins\": [");
	for (size_t i = 0; i < cfg->npins; i++) {
		fprintf(f, "%s{\"start\": ", i ? ", " : "");
		json_str(f, cfg->pins[i].start.data, cfg->pins[i].start.len);
		fprintf(f, ", \"end\": ");
		json_str(f, cfg->pins[i].end.data, cfg->pins[i].end.len);
		fputc('}', f);
	}
	fprintf(f, "], ");
	if (status)
		fprintf(f, "\"under_replicated\": %zu, \"min_insync\": %" PRIu32 ", ",
		        under_replicated(cfg), cfg->min_insync);
	json_migrations(f, cfg, status);
	if (status) {
		fprintf(f, ", \"controllers\": [");
		if (cfg->ncontrollers == 0 && strchr(x->ctl, ',') == NULL) {
			/* A standalone controller may not report itself: it is the one asked. */
			fprintf(f, "{\"id\": 1, \"address\": ");
			json_str(f, x->ctl, strlen(x->ctl));
			fprintf(f, ", \"role\": \"standalone\", \"term\": 0, \"index\": 0}");
		}
		for (size_t i = 0; i < cfg->ncontrollers; i++) {
			const shardkv_controller *c = &cfg->controllers[i];
			fprintf(f, "%s{\"id\": %" PRIu32 ", \"address\": ", i ? ", " : "", c->id);
			json_str(f, c->address ? c->address : "",
			         c->address ? strlen(c->address) : 0);
			fprintf(
			    f, ", \"role\": \"%s\", \"term\": %" PRIu64 ", \"index\": %" PRIu64 "}",
			    c->role, c->term, c->index);
		}
		fputc(']', f);
		fprintf(f, ", \"balancer\": ");
		json_balancer(f, cfg->balancer, cfg->nbalancer, true);
	}
	fprintf(f, "}\n");
}

/* Writes a duration for people: 42s, 12m05s, 3h04m, 2d03h; "?" for 0
 * (unknown). */
static void
fmt_duration(uint64_t ms, char *buf, size_t len)
{
	uint64_t s = ms / 1000u;

	if (ms == 0)
		snprintf(buf, len, "?");
	else if (s < 60)
		snprintf(buf, len, "%" PRIu64 "s", s);
	else if (s < 3600)
		snprintf(buf, len, "%" PRIu64 "m%02" PRIu64 "s", s / 60, s % 60);
	else if (s < 86400)
		snprintf(buf, len, "%" PRIu64 "h%02" PRIu64 "m", s / 3600, s / 60 % 60);
	else
		snprintf(buf, len, "%" PRIu64 "d%02" PRIu64 "h", s / 86400, s / 3600 % 24);
}

static void
human_config(cli_ctx *x, const shardkv_config *cfg, bool status)
{
	FILE *f = x->out;

	fprintf(f, "epoch %" PRIu64 "\nnodes:\n", cfg->epoch);
	for (size_t i = 0; i < cfg->nnodes; i++) {
		const shardkv_node *n = &cfg->nodes[i];
		fprintf(f, "  %" PRIu32 "  %-28s %-9s", n->id, n->address,
		        shardkv_node_state_name(n->state));
		if (status) {
			size_t nr = 0;
			for (size_t j = 0; j < cfg->nranges; j++)
				nr += cfg->ranges[j].node == n->id;
			fprintf(f, " ranges=%zu", nr);
		}
		/* memory: the server's resident memory; last_seen: the age of its
		 * last heartbeat; up: how long the server process has been running,
		 * "?" when unknown (doc/contract.md §5). */
		if (status && n->has_stats && n->state != SHARDKV_NODE_GONE) {
			char up[32];
			fmt_duration(n->uptime_ms, up, sizeof(up));
			fprintf(f,
			        " keys=%" PRIu64 " bytes=%" PRIu64
			        " ops/s=%.1f memory=%.1fMB last_seen=%.1fs up=%s",
			        n->keys, n->bytes, n->ops_per_sec, (double)n->memory_bytes / 1e6,
			        (double)n->last_seen_ms / 1000.0, up);
		}
		fputc('\n', f);
	}
	fprintf(f, "ranges:\n");
	for (size_t i = 0; i < cfg->nranges; i++) {
		const shardkv_range *r = &cfg->ranges[i];
		fprintf(f, "  [");
		human_str(f, r->start.data, r->start.len);
		fprintf(f, ", ");
		human_str(f, r->end.data, r->end.len);
		fprintf(f, ") -> node %" PRIu32, r->node);
		if (r->nreplicas > 1) {
			fprintf(f, " replicas=");
			human_ids(f, r->replicas, r->nreplicas);
			fprintf(f, " insync=");
			human_ids(f, r->insync, r->ninsync);
		}
		fprintf(f, " leader_epoch=%" PRIu64 "\n", r->leader_epoch);
	}
	/* Pins only when there are: the balancer leaves those spans alone. */
	if (cfg->npins) {
		fprintf(f, "pins (left alone by the balancer until a rebalance):\n");
		for (size_t i = 0; i < cfg->npins; i++) {
			fprintf(f, "  [");
			human_str(f, cfg->pins[i].start.data, cfg->pins[i].start.len);
			fprintf(f, ", ");
			human_str(f, cfg->pins[i].end.data, cfg->pins[i].end.len);
			fprintf(f, ")\n");
		}
	}
	if (status)
		fprintf(f,
		        "under-replicated ranges: %zu\nmin-insync: %" PRIu32
		        " (in-sync replicas a write needs)\n",
		        under_replicated(cfg), cfg->min_insync);
	fprintf(f, "migrations:%s\n", cfg->nmigrations ? "" : " none");
	for (size_t i = 0; i < cfg->nmigrations; i++) {
		const shardkv_migration *m = &cfg->migrations[i];
		fprintf(f, "  #%" PRIu64 " [", m->id);
		human_str(f, m->start.data, m->start.len);
		fprintf(f, ", ");
		human_str(f, m->end.data, m->end.len);
		fprintf(f, ") %" PRIu32 " -> %" PRIu32 " %s keys=%" PRIu64, m->from, m->to,
		        m->phase, m->keys_copied);
		if (m->keys_total)
			fprintf(f, "/%" PRIu64, m->keys_total);
		fprintf(f, " bytes=%" PRIu64, m->bytes_copied);
		if (m->bytes_total)
			fprintf(f, "/%" PRIu64, m->bytes_total);
		/* Rate and ETA come from the source's progress reports, so only a
		 * status has them; "?" until the first report. */
		if (status) {
			if (m->rate_bytes_s)
				fprintf(f, " rate=%.2fMB/s", (double)m->rate_bytes_s / 1e6);
			else
				fprintf(f, " rate=?");
			if (m->eta_ms)
				fprintf(f, " eta=%.1fs", (double)m->eta_ms / 1000.0);
			else
				fprintf(f, " eta=?");
		}
		fputc('\n', f);
	}
	if (status && cfg->ncontrollers) {
		fprintf(f, "controllers:\n");
		for (size_t i = 0; i < cfg->ncontrollers; i++) {
			const shardkv_controller *c = &cfg->controllers[i];
			fprintf(f, "  %" PRIu32 "  %-28s %s term=%" PRIu64 " index=%" PRIu64 "\n",
			        c->id, c->address ? c->address : "?", c->role, c->term, c->index);
		}
	}
	if (status && cfg->nbalancer) {
		fprintf(f, "balancer (latest decisions):\n");
		for (size_t i = 0; i < cfg->nbalancer; i++) {
			time_t t = (time_t)(cfg->balancer[i].time_ms / 1000u);
			struct tm tm;
			char when[32] = "?";
			if (gmtime_r(&t, &tm) != NULL)
				strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
			fprintf(f, "  %s  %s\n", when, cfg->balancer[i].what);
		}
	}
}

static int
cmd_config(cli_ctx *x)
{
	shardkv_config *cfg;
	uint64_t epoch = 0;
	int rv;

	if (x->a->nargs == 1)
		epoch = strtoull(x->a->args[0], NULL, 10);
	if ((rv = shardkv_config_get(x->c, epoch, &cfg)) != 0)
		return fail(x, rv);
	if (x->a->json)
		json_config(x, cfg, false);
	else
		human_config(x, cfg, false);
	shardkv_config_free(cfg);
	return 0;
}

static int
cmd_status(cli_ctx *x)
{
	shardkv_config *cfg;
	int rv;

	if ((rv = shardkv_status(x->c, &cfg)) != 0)
		return fail(x, rv);
	if (x->a->json)
		json_config(x, cfg, true);
	else
		human_config(x, cfg, true);
	shardkv_config_free(cfg);
	return 0;
}

static int
cmd_remove(cli_ctx *x)
{
	shardkv_admin_result r = {0};
	uint32_t lost = 0;
	int rv = shardkv_remove(x->c, x->a->args[0],
	                        x->a->accept_data_loss ? SHARDKV_ACCEPT_DATA_LOSS : 0, &r, &lost);

	if (rv != 0)
		return fail(x, rv);
	if (x->a->json)
		fprintf(x->out,
		        "{\"epoch\": %" PRIu64 ", \"removed\": %" PRIu32
		        ", \"ranges_lost\": %" PRIu32 "}\n",
		        r.epoch, r.node_id, lost);
	else
		fprintf(x->out,
		        "removed node %" PRIu32 " in epoch %" PRIu64 " (%" PRIu32
		        " range%s lost data)\n",
		        r.node_id, r.epoch, lost, lost == 1 ? "" : "s");
	return 0;
}

/* Returns the index of the range of cfg holding key, or -1 (empty map). */
static long
range_of(const shardkv_config *cfg, const char *key, size_t klen)
{
	long found = -1;

	for (size_t i = 0; i < cfg->nranges; i++) {
		const shardkv_buf *st = &cfg->ranges[i].start;
		size_t n = st->len < klen ? st->len : klen;
		int c = n ? memcmp(st->data, key, n) : 0;
		if (c < 0 || (c == 0 && st->len <= klen))
			found = (long)i; /* start <= key */
		else
			break;
	}
	return found;
}

static const shardkv_node *
node_of(const shardkv_config *cfg, uint32_t id)
{
	for (size_t i = 0; i < cfg->nnodes; i++)
		if (cfg->nodes[i].id == id)
			return &cfg->nodes[i];
	return NULL;
}

static int
cmd_locate(cli_ctx *x)
{
	const char *key = x->a->args[0];
	shardkv_config *cfg;
	const shardkv_range *r;
	const shardkv_node *n;
	long i;
	int rv;

	if ((rv = shardkv_config_get(x->c, 0, &cfg)) != 0)
		return fail(x, rv);
	if ((i = range_of(cfg, key, strlen(key))) < 0) {
		fprintf(x->err, "shardkv: locate: the cluster has no ranges yet (join a node)\n");
		shardkv_config_free(cfg);
		return KV_CLI_UNAVAIL;
	}
	r = &cfg->ranges[i];
	n = node_of(cfg, r->node);
	if (x->a->json) {
		fprintf(x->out, "{\"key\": ");
		json_str(x->out, key, strlen(key));
		fprintf(x->out, ", \"start\": ");
		json_str(x->out, r->start.data, r->start.len);
		fprintf(x->out, ", \"end\": ");
		json_str(x->out, r->end.data, r->end.len);
		fprintf(x->out, ", \"node\": %" PRIu32 ", \"address\": ", r->node);
		json_str(x->out, n ? n->address : "", n ? strlen(n->address) : 0);
		fprintf(x->out, ", \"state\": \"%s\", \"replicas\": ",
		        n ? shardkv_node_state_name(n->state) : "unknown");
		json_ids(x->out, r->replicas, r->nreplicas);
		fprintf(x->out, ", \"insync\": ");
		json_ids(x->out, r->insync, r->ninsync);
		fprintf(x->out, ", \"leader_epoch\": %" PRIu64 "}\n", r->leader_epoch);
	} else {
		fprintf(x->out, "key ");
		human_str(x->out, key, strlen(key));
		fprintf(x->out, " is in [");
		human_str(x->out, r->start.data, r->start.len);
		fprintf(x->out, ", ");
		human_str(x->out, r->end.data, r->end.len);
		fprintf(x->out, ")\nprimary: node %" PRIu32 " %s (%s)\nreplicas: ", r->node,
		        n ? n->address : "?", n ? shardkv_node_state_name(n->state) : "unknown");
		human_ids(x->out, r->replicas, r->nreplicas);
		fprintf(x->out, "\ninsync: ");
		human_ids(x->out, r->insync, r->ninsync);
		fprintf(x->out, "\nleader epoch: %" PRIu64 "\n", r->leader_epoch);
	}
	shardkv_config_free(cfg);
	return 0;
}

/* check: a joining or draining node not heard from for this long is a
 * problem (the lease plus its margin, common/config.h). */
#define CHECK_SILENT_MS 3000u
/* check: a migration whose source has not reported progress for this long
 * is stuck (sources report about once a second). */
#define CHECK_STUCK_MS 30000u

/* One problem found by check: printed as a line, or a JSON object. */
static void check_problem(cli_ctx *x, size_t *np, const char *kind, uint32_t node, uint64_t mig,
                          const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static void
check_problem(cli_ctx *x, size_t *np, const char *kind, uint32_t node, uint64_t mig,
              const char *fmt, ...)
{
	char line[600];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (x->a->json) {
		fprintf(x->out, "%s{\"kind\": \"%s\"", (*np)++ ? ", " : "", kind);
		if (node)
			fprintf(x->out, ", \"node\": %" PRIu32, node);
		if (mig)
			fprintf(x->out, ", \"migration\": %" PRIu64, mig);
		fprintf(x->out, ", \"detail\": ");
		json_str(x->out, line, strlen(line));
		fputc('}', x->out);
	} else {
		(*np)++;
		fprintf(x->out, "%s\n", line);
	}
}

static int
cmd_check(cli_ctx *x)
{
	shardkv_config *cfg;
	size_t np = 0, nlive = 0;
	int rv;

	if ((rv = shardkv_status(x->c, &cfg)) != 0)
		return fail(x, rv);
	if (x->a->json)
		fprintf(x->out, "{\"epoch\": %" PRIu64 ", \"problems\": [", cfg->epoch);
	for (size_t i = 0; i < cfg->nnodes; i++) {
		const shardkv_node *n = &cfg->nodes[i];
		double s = (double)n->last_seen_ms / 1000.0;
		nlive += n->state == SHARDKV_NODE_ACTIVE;
		if (n->state == SHARDKV_NODE_DOWN)
			check_problem(x, &np, "node_down", n->id, 0,
			              "node %" PRIu32 " (%s) is down: no heartbeat for %.1f s",
			              n->id, n->address, s);
		else if ((n->state == SHARDKV_NODE_JOINING || n->state == SHARDKV_NODE_DRAINING) &&
		         n->last_seen_ms > CHECK_SILENT_MS)
			check_problem(x, &np, "node_silent", n->id, 0,
			              "node %" PRIu32
			              " (%s, %s) has not sent a heartbeat for %.1f s",
			              n->id, n->address, shardkv_node_state_name(n->state), s);
	}
	for (size_t i = 0; i < cfg->nranges; i++) {
		const shardkv_range *r = &cfg->ranges[i];
		const shardkv_node *n = node_of(cfg, r->node);
		char a[300], b[300];
		bool dead =
		    n == NULL || n->state == SHARDKV_NODE_DOWN || n->state == SHARDKV_NODE_GONE;
		if (!dead && r->ninsync >= r->nreplicas)
			continue;
		kv_cli_json_escape(r->start.data, r->start.len < 40 ? r->start.len : 40, a,
		                   sizeof(a));
		kv_cli_json_escape(r->end.data, r->end.len < 40 ? r->end.len : 40, b, sizeof(b));
		if (dead)
			check_problem(
			    x, &np, "no_live_primary", r->node, 0,
			    "range [\"%s\", \"%s\") has no live primary: node %" PRIu32 " is %s", a,
			    b, r->node, n ? shardkv_node_state_name(n->state) : "unknown");
		if (r->ninsync < r->nreplicas)
			check_problem(x, &np, "under_replicated", r->node, 0,
			              "range [\"%s\", \"%s\") is under-replicated: %zu of %zu "
			              "replicas in sync",
			              a, b, r->ninsync, r->nreplicas);
	}
	for (size_t i = 0; i < cfg->nmigrations; i++) {
		const shardkv_migration *m = &cfg->migrations[i];
		const shardkv_node *f = node_of(cfg, m->from), *t = node_of(cfg, m->to);
		bool down =
		    (f && f->state == SHARDKV_NODE_DOWN) || (t && t->state == SHARDKV_NODE_DOWN);
		if (down || m->progress_age_ms > CHECK_STUCK_MS)
			check_problem(x, &np, "migration_stuck", 0, m->id,
			              "migration %" PRIu64 " (%" PRIu32 " -> %" PRIu32
			              ", %s) is stuck: %s",
			              m->id, m->from, m->to, m->phase,
			              down ? "a node it involves is down"
			                   : "no progress report for over 30 s");
	}
	if (x->a->json)
		fprintf(x->out, "], \"ok\": %s}\n", np ? "false" : "true");
	else if (np == 0)
		fprintf(x->out,
		        "ok: epoch %" PRIu64
		        ", %zu active node%s, %zu range%s, every range has a live primary and "
		        "a full in-sync set\n",
		        cfg->epoch, nlive, nlive == 1 ? "" : "s", cfg->nranges,
		        cfg->nranges == 1 ? "" : "s");
	shardkv_config_free(cfg);
	return np ? KV_CLI_UNAVAIL : 0;
}

/* ---------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------- */

/*
 * Reads the auth token file (common/auth.h: one trailing newline cut, not
 * empty, at most 4096 bytes). A file that cannot be used is a usage error
 * (2); one that group or others may read draws a warning.
 */
static int
read_token(const char *path, uint8_t **out, size_t *len, FILE *err)
{
	kv_buf b = {0};
	bool loose = false;
	char msg[512];
	int rv = kv_auth_load(path, &b, &loose, msg, sizeof(msg));

	if (rv != 0) {
		fprintf(err, "shardkv: %s\n", msg);
		return rv == KV_ENOMEM ? KV_CLI_INTERNAL : KV_CLI_USAGE;
	}
	if (loose)
		fprintf(err,
		        "shardkv: warning: --auth-token-file %s is accessible by group or others "
		        "(chmod 600 it)\n",
		        path);
	*out = b.data;
	*len = b.len;
	return 0;
}

/* Returns the file named by environment variable `name`; NULL when unset or
 * empty. */
static const char *
env_file(const char *name)
{
	const char *v = getenv(name);
	return v != NULL && v[0] != 0 ? v : NULL;
}

/* Returns the first occurrence of the NUL-terminated `needle` in the n
 * bytes at p, or NULL. */
static const char *
find_in(const char *p, size_t n, const char *needle)
{
	size_t k = strlen(needle);

	for (size_t i = 0; i + k <= n; i++)
		if (memcmp(p + i, needle, k) == 0)
			return p + i;
	return NULL;
}

/*
 * Checks the controller list before any connection: every entry must be a
 * URL SCHEME://ADDRESS, and a tcp one HOST:PORT with a numeric port.
 * Returns 0, or prints the reason and returns KV_CLI_USAGE.
 */
static int
check_controller(const char *list, bool from_env, FILE *err)
{
	const char *p = list;

	for (;;) {
		const char *end = strchr(p, ',');
		size_t n = end ? (size_t)(end - p) : strlen(p);
		const char *sep = find_in(p, n, "://");
		bool ok = sep != NULL && sep > p && (size_t)(sep - p) + 3 < n;

		for (const char *c = p; ok && c < sep; c++)
			ok = (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '+';
		if (ok && find_in(p, (size_t)(sep - p), "tcp") != NULL) {
			const char *host = sep + 3, *colon = NULL;
			for (const char *c = host; c < p + n; c++)
				if (*c == ':')
					colon = c;
			ok = colon != NULL && colon > host && colon + 1 < p + n;
			for (const char *c = colon ? colon + 1 : host; ok && c < p + n; c++)
				ok = *c >= '0' && *c <= '9';
		}
		if (!ok) {
			fprintf(err,
			        "shardkv: invalid controller address '%.*s' (%s): it must be a URL "
			        "like tcp://HOST:PORT, several separated by commas\n",
			        (int)(n > 200 ? 200 : n), p,
			        from_env ? "from $SHARDKV_CONTROLLER" : "-c/--controller");
			return KV_CLI_USAGE;
		}
		if (end == NULL)
			return 0;
		p = end + 1;
	}
}

int
kv_cli_main(int argc, char **argv, FILE *out, FILE *err)
{
	kv_cli_args a;
	cli_ctx x = {.a = &a, .out = out, .err = err};
	shardkv_options opt = {0};
	const cli_cmd *cmd;
	uint8_t *token = NULL;
	size_t token_len = 0;
	char msg[256];
	int rv;

	if ((rv = kv_cli_parse(argc, argv, &a, msg, sizeof(msg))) != 0) {
		fprintf(err, "shardkv: %s\n", msg);
		kv_cli_args_fini(&a);
		return rv;
	}
	cmd = a.cmd ? find_cmd(a.cmd) : NULL;
	if (a.version) {
		kv_version_print(out, "shardkv");
		kv_cli_args_fini(&a);
		return 0;
	}
	if (a.help) {
		print_help(out, cmd);
		kv_cli_args_fini(&a);
		return 0;
	}
	x.ctl = a.controller;
	if (x.ctl == NULL)
		x.ctl = getenv("SHARDKV_CONTROLLER");
	if (x.ctl == NULL || x.ctl[0] == 0)
		x.ctl = DEFAULT_CONTROLLER;
	if ((rv = check_controller(x.ctl, a.controller == NULL, err)) != 0) {
		kv_cli_args_fini(&a);
		return rv;
	}
	/* The secret's file may also come from the environment, like the
	 * controller; an empty variable means none. */
	if (a.auth_token_file == NULL && getenv("SHARDKV_AUTH_TOKEN_FILE") != NULL &&
	    getenv("SHARDKV_AUTH_TOKEN_FILE")[0] != 0)
		a.auth_token_file = getenv("SHARDKV_AUTH_TOKEN_FILE");
	if (a.auth_token_file &&
	    (rv = read_token(a.auth_token_file, &token, &token_len, err)) != 0) {
		kv_cli_args_fini(&a);
		return rv;
	}
	/* The TLS files too; a flag wins over its variable. */
	opt.tls_cert = a.tls_cert ? a.tls_cert : env_file("SHARDKV_TLS_CERT");
	opt.tls_key = a.tls_key ? a.tls_key : env_file("SHARDKV_TLS_KEY");
	opt.tls_ca = a.tls_ca ? a.tls_ca : env_file("SHARDKV_TLS_CA");
	{
		kv_tls_files f = {.cert = opt.tls_cert, .key = opt.tls_key, .ca = opt.tls_ca};
		if (kv_tls_files_any(&f) && kv_tls_check_files(&f, false, msg, sizeof(msg)) != 0) {
			fprintf(err, "shardkv: %s\n", msg);
			rv = KV_CLI_USAGE;
			goto out;
		}
	}
	/* Each call has the usual deadline, also with --wait: its waiting is a
	 * series of short status calls, bounded by --timeout or ten minutes. */
	opt.timeout_ms = a.timeout_ms;
	opt.auth_token = token;
	opt.auth_token_len = token_len;
	x.token = token;
	x.token_len = token_len;
	x.opt = &opt;
	/* A one-shot command has no use for a background watch. */
	opt.no_watch = true;
	/* The library's own lines (redials and the like) only when asked for:
	 * every failure reaches the user as the command's error anyway. */
	(void)shardkv_set_log_level(a.verbose ? SHARDKV_LOG_INFO : SHARDKV_LOG_OFF);
	if ((rv = shardkv_open(x.ctl, &opt, &x.c)) != 0) {
		rv = fail(&x, rv);
	} else {
		rv = cmd->fn(&x);
		if (fflush(out) != 0 && rv == 0) {
			fprintf(err, "shardkv: %s: writing the output: %s\n", a.cmd,
			        strerror(errno));
			rv = KV_CLI_INTERNAL;
		}
	}
out:
	shardkv_close(x.c);
	free(x.stdin_buf);
	if (token != NULL)
		memset(token, 0, token_len);
	free(token);
	kv_cli_args_fini(&a);
	return rv;
}
