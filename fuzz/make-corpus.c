/*
 * make-corpus.c - writes the seed corpus of every harness (fuzz/corpus/)
 * from real encoded messages and files: the same encoders and writers the
 * daemons and the client use, never hand-made bytes. The output is
 * deterministic, so running it again changes nothing in git. This file has
 * the controller's and the client's seeds (the controller's and the shard
 * server's codec headers cannot meet in one file); make-corpus-server.c
 * has the shard server's.
 *
 * Usage: kv-fuzz-make-corpus DIR   (scripts/fuzz.sh --corpus runs it on
 * fuzz/corpus). Creates DIR/<harness>/ and writes one small file per seed.
 */
#include "client/client_int.h"
#include "common/bytes.h"
#include "common/config.h"
#include "common/err.h"
#include "common/key.h"
#include "common/log.h"
#include "proto/admin_codec.h"
#include "controller/clog.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/make-corpus.h"
#include "proto/config_codec.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *kvmc_root;

void
die(const char *what)
{
	fprintf(stderr, "make-corpus: %s\n", what);
	exit(1);
}

void
seed(const char *harness, const char *name, const void *p, size_t n)
{
	char dir[512];

	snprintf(dir, sizeof(dir), "%s/%s", kvmc_root, harness);
	if (mkdir(dir, 0755) != 0 && errno != EEXIST)
		die("cannot create a corpus directory");
	fz_write_file(dir, name, p, n);
}

/* A seed with a control byte in front (the file harnesses). */
void
seed_ctl(const char *harness, const char *name, uint8_t ctl, const void *p, size_t n)
{
	uint8_t *b = malloc(n + 1);

	if (b == NULL)
		die("out of memory");
	b[0] = ctl;
	if (n)
		memcpy(b + 1, p, n);
	seed(harness, name, b, n + 1);
	free(b);
}

void
seed_msg(const char *harness, const char *name, int rv, nng_msg *m)
{
	if (rv != KV_OK)
		die(name);
	seed(harness, name, nng_msg_body(m), nng_msg_len(m));
	nng_msg_free(m);
}

uint8_t *
read_file(const char *dir, const char *name, size_t *n)
{
	char path[512];
	struct stat st;
	uint8_t *b;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if ((fd = open(path, O_RDONLY)) < 0 || fstat(fd, &st) != 0)
		die(path);
	if ((b = malloc((size_t)st.st_size + 1)) == NULL ||
	    read(fd, b, (size_t)st.st_size) != (ssize_t)st.st_size)
		die(path);
	close(fd);
	*n = (size_t)st.st_size;
	return b;
}

/* ------------------------------------------------------------ configurations */

void
set_buf(kv_buf *b, const char *s)
{
	memset(b, 0, sizeof(*b));
	if (s[0] && kv_buf_set(b, s, strlen(s)) != KV_OK)
		die("out of memory");
}

/* Three nodes, three ranges, one migration in flight (epoch e). */
kv_config *
make_config(uint64_t e)
{
	static const char *addr[] = {"tcp://127.0.0.1:7101", "tcp://127.0.0.1:7102",
	                             "tcp://127.0.0.1:7103"};
	static const char *cut[] = {"", "g", "user:5", ""};
	kv_config *c = kv_config_new();

	if (c == NULL || (c->nodes = calloc(3, sizeof(kv_node))) == NULL ||
	    (c->ranges = calloc(3, sizeof(kv_range))) == NULL ||
	    (c->migs = calloc(1, sizeof(kv_migration))) == NULL ||
	    (c->cluster_id = strdup("00000000c0ffee00")) == NULL)
		die("out of memory");
	c->epoch = e;
	c->time_ms = 1700000000000ull + e;
	for (int i = 0; i < 3; i++) {
		c->nodes[i].id = (uint32_t)i + 1;
		c->nodes[i].state = i == 2 ? KV_NODE_JOINING : KV_NODE_ACTIVE;
		if ((c->nodes[i].address = strdup(addr[i])) == NULL)
			die("out of memory");
		c->ranges[i].node = (uint32_t)(i % 2) + 1;
		set_buf(&c->ranges[i].start, cut[i]);
		set_buf(&c->ranges[i].end, cut[i + 1]);
	}
	c->ranges[2].node = 3;
	c->nnodes = c->nranges = 3;
	c->migs[0] = (kv_migration){.id = 4,
	                            .epoch = e,
	                            .from = 1,
	                            .to = 2,
	                            .phase = KV_MIG_COPYING,
	                            .keys_copied = 10,
	                            .bytes_copied = 1000,
	                            .keys_total = 20,
	                            .bytes_total = 2000,
	                            .rate_bytes_s = 500,
	                            .eta_ms = 2000,
	                            .rate_limit_mb_s = 1};
	set_buf(&c->migs[0].start, "a");
	set_buf(&c->migs[0].end, "c");
	c->nmigs = 1;
	if (kv_config_validate(c) != KV_OK)
		die("the sample configuration is not valid");
	return c;
}

/* One node owning everything. */
kv_config *
make_config1(void)
{
	kv_config *c = kv_config_new();

	if (c == NULL || (c->nodes = calloc(1, sizeof(kv_node))) == NULL ||
	    (c->ranges = calloc(1, sizeof(kv_range))) == NULL ||
	    (c->nodes[0].address = strdup("tcp://127.0.0.1:7101")) == NULL)
		die("out of memory");
	c->epoch = 2;
	c->nodes[0].id = 1;
	c->nodes[0].state = KV_NODE_ACTIVE;
	c->ranges[0].node = 1;
	c->nnodes = c->nranges = 1;
	return c;
}

static void
seeds_config(void)
{
	kv_config *cs[3] = {kv_config_new(), make_config1(), make_config(7)};
	static const char *names[] = {"empty", "one-node", "three-nodes-moving"};
	kv_buf b = {0};

	cs[0]->epoch = 1;
	for (int i = 0; i < 3; i++) {
		if (kv_codec_config_pack(cs[i], &b) != KV_OK)
			die("pack");
		seed("fuzz_config", names[i], b.data, b.len);
		kv_config_free(cs[i]);
	}
	kv_buf_fini(&b);
}

/* ------------------------------------------------------------ controller */

static void
seeds_admin_requests(void)
{
	const char *h = "fuzz_admin_request";
	nng_msg *m;
	kv_admin_req qs[] = {
	    {.op = KV_ADM_JOIN, .request_id = 1, .address = "tcp://127.0.0.1:7104"},
	    {.op = KV_ADM_LEAVE, .request_id = 2, .node_id = 2, .wait = true},
	    {.op = KV_ADM_MOVE,
	     .request_id = 3,
	     .address = "tcp://127.0.0.1:7103",
	     .start = B("user:0"),
	     .end = B("user:5"),
	     .rate_mb_s = 10},
	    {.op = KV_ADM_REBALANCE, .request_id = 4, .client_id = 99},
	    {.op = KV_ADM_GET_CONFIG, .request_id = 5, .epoch = 4},
	    {.op = KV_ADM_STATUS, .request_id = 6},
	    {.op = KV_ADM_WATCH, .request_id = 7, .epoch = 3, .timeout_ms = 1000},
	    {.op = KV_ADM_CANCEL, .request_id = 8, .mig_id = 6},
	    {.op = KV_ADM_MOVE,
	     .dry_run = true,
	     .request_id = 9,
	     .node_id = 2,
	     .start = B("user:0"),
	     .end = B("user:5")},
	    {.op = KV_ADM_REBALANCE, .dry_run = true, .request_id = 10},
	};
	static const char *names[] = {
	    "join",   "leave", "move",   "rebalance",    "config",
	    "status", "watch", "cancel", "move-dry-run", "rebalance-dry-run"};
	for (size_t i = 0; i < sizeof(qs) / sizeof(qs[0]); i++)
		seed_msg(h, names[i], kv_admin_req_encode(&qs[i], &m), m);
}

/* AdminResponses: what clients and shard servers decode. */
static void
seeds_admin_responses(void)
{
	kv_config *c3 = make_config(3), *c4 = make_config(4), *c1 = make_config1();
	const kv_config *hist[2] = {c3, c4};
	kv_admin_range_stat st = {.start = B(""), .end = B("g"), .keys = 5, .bytes = 50};
	kv_admin_node_stat ns[2] = {
	    {.node_id = 1, .keys = 5, .bytes = 50, .ops = 2.0, .nranges = 1, .ranges = &st},
	    {.node_id = 2, .keys = 7, .bytes = 70, .memory = 1 << 20, .last_seen_ms = 12}};
	kv_admin_report rep = {.nnodes = 2,
	                       .nodes = ns,
	                       .nmigs = c4->nmigs,
	                       .migs = c4->migs,
	                       .address = "tcp://127.0.0.1:7000"};
	uint64_t ids[2] = {6, 7};
	kv_migration plan[1] = {{.epoch = 5,
	                         .start = {(uint8_t *)"user:0", 6},
	                         .end = {(uint8_t *)"user:5", 6},
	                         .from = 1,
	                         .to = 2,
	                         .phase = KV_MIG_PENDING,
	                         .keys_total = 40,
	                         .bytes_total = 4000}};
	struct {
		const char *name;
		kv_admin_resp r;
	} rs[] = {
	    {"config", {.request_id = 1, .epoch = 3, .config = c3}},
	    {"register", {.request_id = 2, .epoch = 2, .node_id = 1, .config = c1}},
	    {"watch-history", {.request_id = 3, .epoch = 4, .configs = hist, .nconfigs = 2}},
	    {"status", {.request_id = 4, .epoch = 4, .config = c4, .report = &rep}},
	    {"move", {.request_id = 5, .epoch = 5, .mig_ids = ids, .nmig_ids = 2, .wait_ms = 14}},
	    {"refused", {.request_id = 6, .err = KV_ENOTFOUND, .error = "no node 9"}},
	    {"unavailable", {.request_id = 7, .err = KV_EUNAVAIL}},
	    {"dry-run-plan", {.request_id = 8, .epoch = 4, .config = c4, .plan = plan, .nplan = 1}},
	};

	for (size_t i = 0; i < sizeof(rs) / sizeof(rs[0]); i++) {
		nng_msg *m;
		seed_msg("fuzz_admin_response", rs[i].name, kv_admin_resp_encode(&rs[i].r, &m), m);
	}
	kv_config_free(c1);
	kv_config_free(c3);
	kv_config_free(c4);
}

static void
seeds_clog(void)
{
	const char *h = "fuzz_clog_open";
	char dir[256], err[256];
	kv_clog *l;
	kv_buf b = {0};
	uint8_t *f;
	size_t n;

	fz_tmpdir(dir, sizeof(dir));
	if (kv_clog_open(dir, NULL, NULL, &l, NULL, err, sizeof(err)) != KV_OK)
		die(err);
	for (uint64_t e = 1; e <= 3; e++) {
		kv_config *c = e == 1 ? kv_config_new() : e == 2 ? make_config1() : make_config(3);
		c->epoch = e;
		if (kv_codec_config_pack(c, &b) != KV_OK ||
		    kv_clog_append(l, b.data, b.len) != KV_OK)
			die("clog append");
		kv_config_free(c);
	}
	kv_buf_fini(&b);
	kv_clog_close(l);
	f = read_file(dir, KV_CLOG_FILE, &n);
	fz_rmdir(dir);
	/* A fixed cluster id, so that the seeds do not change on every run. */
	memcpy(f + 16, "00000000c0ffee00\0\0\0\0\0\0\0\0", 24);
	kv_put64(f + 40, kv_hash64(f, 40));
	seed_ctl(h, "three-epochs", 0x00, f, n);
	seed_ctl(h, "header-only", 0x00, f, KV_CLOG_HEADER_SIZE);
	uint8_t *t = malloc(n + 5);
	if (t == NULL)
		die("out of memory");
	memcpy(t, f, n);
	memcpy(t + n, "\x20\x00\x00\x00\x01", 5);
	seed_ctl(h, "torn-tail", 0x01, t, n + 5);
	free(t);
	free(f);
}

/* ------------------------------------------------------------ command line */

static void
seeds_cli(void)
{
	static const struct {
		const char *name;
		const char *args;
		size_t len;
	} cl[] = {
#define A(name, s) {name, s, sizeof(s) - 1}
	    A("get", "get\0user:1"),
	    A("put", "put\0user:1\0alice"),
	    A("mput-odd", "mput\0a\0b\0c"),
	    A("config-json", "--json\0config\04"),
	    A("move-wait", "move\0user:0\0user:5\03\0--wait\0--rate=10"),
	    A("scan", "scan\0a\0z\0--limit\010\0--prefix\0user:"),
	    A("cancel-bad", "cancel\0six"),
	    A("tls", "--tls-cert=c.pem\0status"),
	    A("timeout-zero", "--timeout\00\0get\0k"),
	    A("help", "--help"),
	    A("help-cmd", "join\0--help"),
	    A("bench", "bench\0--threads\04\0--mix\0get:90,put:10\0--dist\0zipf:0.9\0--duration\0"
	               "1\0--key-size=16"),
	    A("bench-help", "bench\0--help"),
	    A("unknown", "frobnicate\0--json"),
	    A("controller", "-c\0tcp://127.0.0.1:7000\0--no-rebalance\0join\0tcp://x:1"),
#undef A
	};
	for (size_t i = 0; i < sizeof(cl) / sizeof(cl[0]); i++)
		seed("fuzz_cli", cl[i].name, cl[i].args, cl[i].len);
}

/* The daemons' command lines and the shared secret's file. */
static void
seeds_daemons(void)
{
	static const struct {
		const char *harness;
		const char *name;
		const char *args;
		size_t len;
	} dl[] = {
#define A(h, name, s) {h, name, s, sizeof(s) - 1}
	    A("fuzz_controller_args", "plain",
	      "--listen\0tcp://127.0.0.1:7000\0--data-dir\0/tmp/c\0--metrics\0127.0.0.1:9100"),
	    A("fuzz_controller_args", "tls",
	      "--listen=tls+tcp://127.0.0.1:7000\0--data-dir=/tmp/c\0--tls-cert\0c.pem\0"
	      "--tls-key\0k.pem\0--tls-ca\0ca.pem\0--auth-token-file\0tok"),
	    A("fuzz_controller_args", "tls-no-key",
	      "--listen\0tls+tcp://127.0.0.1:7000\0--data-dir\0d\0--tls-cert\0c\0--tls-ca\0a"),
	    A("fuzz_controller_args", "help", "--log-level\0debug\0--help"),
	    A("fuzz_controller_args", "missing", "--listen"),
	    A("fuzz_controller_args", "raft",
	      "--id\0002\0--peers\0tcp://10.0.0.1:7000,tcp://10.0.0.2:7000,tcp://10.0.0.3:7000\0"
	      "--raft-peers\00010.0.0.1:9000,10.0.0.2:9000,10.0.0.3:9000\0"
	      "--snapshot-threshold\00064\0--election-timeout\000500\0"
	      "--listen\0tcp://10.0.0.2:7000\0--data-dir\0d"),
	    A("fuzz_controller_args", "raft-tls",
	      "--id\0001\0--peers\0tls+tcp://a:7000,tls+tcp://b:7000,tls+tcp://c:7000\0--listen\0"
	      "tls+tcp://a:7000\0--data-dir\0d\0--tls-cert\0c\0--tls-key\0k\0--tls-ca\0a"),
	    A("fuzz_server_args", "plain",
	      "--listen\0tcp://127.0.0.1:7101\0--controller\0tcp://127.0.0.1:7000,tcp://127.0.0.1:"
	      "7001\0--data-dir\0/tmp/s\0--join\0--threads\04\0--store\0percore\0--fsync\0always"),
	    A("fuzz_server_args", "sizes",
	      "--listen\0tcp://a:1\0--controller\0tcp://b:2\0--data-dir\0d\0--max-key\02K\0"
	      "--max-value\064M\0--max-memory\01G\0--max-batch\0100\0--max-message\08m\0"
	      "--max-connections\010\0--snapshot-bytes\04096\0--wal-truncate-corrupt"),
	    A("fuzz_server_args", "tls",
	      "--listen\0tls+tcp://127.0.0.1:7101\0--controller\0tls+tcp://127.0.0.1:7000\0"
	      "--data-dir\0d\0--tls-cert\0c\0--tls-key\0k\0--tls-ca\0a"),
	    A("fuzz_server_args", "tls-mixed",
	      "--listen\0tls+tcp://127.0.0.1:7101\0--controller\0tcp://127.0.0.1:7000\0"
	      "--data-dir\0d\0--tls-cert\0c\0--tls-key\0k\0--tls-ca\0a"),
	    A("fuzz_server_args", "commas", "--listen\0x\0--controller\0,,\0--data-dir\0d"),
	    A("fuzz_auth_token", "line", "s3cret-token\n"),
	    A("fuzz_auth_token", "crlf", "s3cret\r\n"),
	    A("fuzz_auth_token", "binary", "\x00\x01\xff\n\n"),
	    A("fuzz_auth_token", "newline", "\n"),
#undef A
	};
	for (size_t i = 0; i < sizeof(dl) / sizeof(dl[0]); i++)
		seed(dl[i].harness, dl[i].name, dl[i].args, dl[i].len);
}

int
main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
		return 2;
	}
	kvmc_root = argv[1];
	kv_log_set_level(KV_LOG_OFF);
	if (mkdir(kvmc_root, 0755) != 0 && errno != EEXIST)
		die("cannot create the corpus directory");
	seeds_config();
	seeds_admin_requests();
	seeds_admin_responses();
	seeds_clog();
	seeds_cli();
	seeds_daemons();
	kvmc_server_seeds();
	return 0;
}
