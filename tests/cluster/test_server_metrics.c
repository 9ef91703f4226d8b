/*
 * test_server_metrics.c - the shard server's /metrics endpoint, with real
 * daemons: a shardkv-controller and one shardkv-server started with
 * --metrics on free loopback ports, driven through libshardkv and scraped
 * with a plain socket. Checks that the op, key and log counters follow the
 * traffic, that the answer is valid Prometheus text (every sample line is
 * `name{labels} value` and belongs to a family with HELP and TYPE), that
 * other paths get a 404, that hostile requests (garbage, an endless line, a
 * silent client) neither kill the server nor block scrapes for long, that a
 * server refuses to start on a bad or busy --metrics address, and that the
 * migration figures follow a range moving to a second server.
 *
 * Every wait is a poll with a deadline; the processes die with the test
 * (PR_SET_PDEATHSIG) and are stopped by the group teardown.
 */
#include "client/include/shardkv.h"
#include "common/proc.h"
#include "tests/support/http_client.h"
#include "tests/support/testutil.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#ifndef KV_SERVER_BIN
#error "KV_SERVER_BIN must name the shardkv-server binary"
#endif
#ifndef KV_CONTROLLER_BIN
#error "KV_CONTROLLER_BIN must name the shardkv-controller binary"
#endif

#define READY_MS 20000u /* a daemon answers / a range is served */
#define NKEYS    100u   /* keys written by the traffic test */
#define MAX_KEY  100u   /* the server's --max-key */

/* The cluster shared by the tests of the group. */
static struct {
	char dir[128];      /* temporary directory */
	char ctl_url[64];   /* controller --listen */
	char srv_url[64];   /* server --listen */
	int mport;          /* server --metrics port */
	char srv_log[200];  /* server stderr */
	char srv2_url[64];  /* second server --listen (migration test) */
	pid_t ctl, srv;     /* the processes; 0: not running */
	pid_t srv2;         /* the second server; 0: not started */
	shardkv_client *cl; /* a client of the cluster */
} g;

/* ------------------------------------------------------------------------
 * Processes
 * ------------------------------------------------------------------------ */

/* Starts argv[0] with its output appended to log (common/proc.h: stopped on
 * every exit path). Returns the pid or -1. */
static pid_t
spawn(const char *const argv[], const char *log)
{
	return kv_proc_spawn(argv[0], (char *const *)argv, log);
}

/* Waits up to ms for pid to exit. Returns its wait status, or -1 (still
 * running: it is killed). */
static int
wait_exit(pid_t pid, unsigned ms)
{
	int st = 0;

	return kv_proc_reap(pid, ms, &st) == 0 ? st : -1;
}

static bool
alive(pid_t pid)
{
	return pid > 0 && !kv_proc_exited(pid, NULL);
}

/* Prints the tail of a log (after a failure). */
static void
dump(const char *log)
{
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "tail -n 30 '%s' >&2", log);
	if (system(cmd) != 0)
		fprintf(stderr, "no log %s\n", log);
}

/* ------------------------------------------------------------------------
 * HTTP
 * ------------------------------------------------------------------------ */

/* Scrapes /metrics; fails the test unless it is a complete 200 answer. */
static kv_http_answer
scrape(void)
{
	kv_http_answer a = kv_http_get(g.mport, "/metrics");
	if (a.status != 200) {
		dump(g.srv_log);
		fail_msg("scrape answered %d: %.200s", a.status, a.raw);
	}
	assert_non_null(a.body);
	assert_int_equal(a.clength, (long)a.blen);
	return a;
}

/* Scrapes until `series` has a value >= min, or the deadline. Returns it. */
static double
wait_sample(const char *series, double min, unsigned ms)
{
	uint64_t deadline = kv_test_now_ms() + ms;
	double v = NAN;

	for (;;) {
		kv_http_answer a = kv_http_get(g.mport, "/metrics");
		if (a.status == 200)
			v = kv_http_sample(a.body, series);
		kv_http_answer_free(&a);
		if ((!isnan(v) && v >= min) || kv_test_now_ms() > deadline)
			return v;
		kv_test_sleep_ms(50);
	}
}

/* ------------------------------------------------------------------------
 * Prometheus text format
 * ------------------------------------------------------------------------ */

#define MAX_FAMILIES 128

typedef struct {
	char name[128]; /* family name */
	bool help;      /* has a HELP line */
	bool type;      /* has a TYPE line */
	bool closed;    /* another family's lines came after its samples */
	bool hist;      /* TYPE histogram */
	int samples;    /* sample lines */
} family;

static family *
family_of(family *f, size_t *n, const char *name, size_t len)
{
	for (size_t i = 0; i < *n; i++)
		if (strlen(f[i].name) == len && memcmp(f[i].name, name, len) == 0)
			return &f[i];
	assert_true(*n < MAX_FAMILIES && len < sizeof(f[0].name));
	memset(&f[*n], 0, sizeof(f[*n]));
	memcpy(f[*n].name, name, len);
	return &f[(*n)++];
}

static bool
name_char(char c, bool first)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
	       (!first && c >= '0' && c <= '9');
}

/* Length of the metric or label name at p (0: none). */
static size_t
name_len(const char *p)
{
	size_t n = 0;
	while (name_char(p[n], n == 0))
		n++;
	return n;
}

/* Checks one sample line; returns its name's length. */
static size_t
check_sample(const char *line)
{
	const char *p = line;
	size_t nl = name_len(p);
	char *end;

	if (nl == 0)
		fail_msg("sample without a name: %s", line);
	p += nl;
	if (*p == '{') {
		p++;
		for (;;) {
			size_t ll = name_len(p);
			if (ll == 0 || p[ll] != '=' || p[ll + 1] != '"')
				fail_msg("bad label in: %s", line);
			p += ll + 2;
			while (*p && *p != '"')
				p += (*p == '\\' && p[1]) ? 2 : 1;
			if (*p != '"')
				fail_msg("unterminated label value in: %s", line);
			p++;
			if (*p == ',') {
				p++;
				continue;
			}
			if (*p != '}')
				fail_msg("bad label list in: %s", line);
			p++;
			break;
		}
	}
	if (*p != ' ' || p[1] == '\0')
		fail_msg("no value in: %s", line);
	errno = 0;
	(void)strtod(p + 1, &end);
	if (errno != 0 || end == p + 1 || *end != '\0')
		fail_msg("bad value in: %s", line);
	return nl;
}

/* Checks the whole body: lines, families, HELP and TYPE, contiguity. */
static void
check_format(const char *body)
{
	family fam[MAX_FAMILIES];
	size_t nfam = 0;
	family *cur = NULL;
	char line[1024];

	assert_true(strlen(body) > 0 && body[strlen(body) - 1] == '\n');
	for (const char *p = body; *p;) {
		const char *eol = strchr(p, '\n');
		size_t len = (size_t)(eol - p);
		assert_true(len < sizeof(line));
		memcpy(line, p, len);
		line[len] = '\0';
		p = eol + 1;
		if (strncmp(line, "# HELP ", 7) == 0 || strncmp(line, "# TYPE ", 7) == 0) {
			size_t nl = name_len(line + 7);
			assert_true(nl > 0 && line[7 + nl] == ' ' && line[8 + nl] != '\0');
			family *f = family_of(fam, &nfam, line + 7, nl);
			if (f->samples > 0)
				fail_msg("HELP/TYPE after the samples of %s", f->name);
			if (line[2] == 'H') {
				f->help = true;
			} else {
				const char *t = line + 8 + nl;
				assert_true(strcmp(t, "counter") == 0 || strcmp(t, "gauge") == 0 ||
				            strcmp(t, "histogram") == 0);
				f->type = true;
				f->hist = strcmp(t, "histogram") == 0;
			}
			if (cur != NULL && cur != f)
				cur->closed = true;
			cur = f;
			continue;
		}
		if (line[0] == '#')
			fail_msg("unexpected comment: %s", line);
		size_t nl = check_sample(line);
		/* A histogram's samples are NAME_bucket, NAME_sum, NAME_count. */
		static const char *const sfx[] = {"_bucket", "_sum", "_count"};
		for (size_t i = 0; cur != NULL && cur->hist && i < 3; i++) {
			size_t sl = strlen(sfx[i]), cl = strlen(cur->name);
			if (nl == cl + sl && memcmp(line, cur->name, cl) == 0 &&
			    memcmp(line + cl, sfx[i], sl) == 0)
				nl = cl;
		}
		family *f = family_of(fam, &nfam, line, nl);
		if (!f->help || !f->type)
			fail_msg("%s has a sample before its HELP and TYPE", f->name);
		if (f->closed)
			fail_msg("the samples of %s are not contiguous", f->name);
		if (cur != NULL && cur != f)
			cur->closed = true;
		cur = f;
		f->samples++;
	}
	for (size_t i = 0; i < nfam; i++)
		if (fam[i].samples == 0)
			fail_msg("%s has HELP/TYPE but no sample", fam[i].name);
}

/* Checks the latency histogram of `op`: buckets cumulative and ordered by
 * bound, the +Inf bucket equal to _count, at least `min` requests, a
 * positive sum. */
static void
check_histogram(const char *body, const char *op, double min)
{
	const char *name = "shardkv_server_request_duration_seconds";
	char want[200];
	const char *p = body;
	double prev_le = 0, prev = 0, inf = NAN;
	int buckets = 0;

	snprintf(want, sizeof(want), "\n%s_bucket{op=\"%s\",le=\"", name, op);
	while ((p = strstr(p, want)) != NULL) {
		char *end;
		p += strlen(want);
		double le = strncmp(p, "+Inf", 4) == 0 ? INFINITY : strtod(p, &end);
		const char *v = strstr(p, "} ");
		assert_non_null(v);
		double n = strtod(v + 2, NULL);
		if (buckets > 0) {
			assert_true(le > prev_le);
			assert_true(n >= prev);
		}
		prev_le = le;
		prev = n;
		if (isinf(le))
			inf = n;
		buckets++;
	}
	assert_true(buckets >= 10);
	assert_false(isnan(inf));
	snprintf(want, sizeof(want), "%s_count{op=\"%s\"}", name, op);
	assert_true(kv_http_sample(body, want) == inf);
	assert_true(inf >= min);
	snprintf(want, sizeof(want), "%s_sum{op=\"%s\"}", name, op);
	assert_true(kv_http_sample(body, want) > 0);
}

/* ------------------------------------------------------------------------
 * Fixture
 * ------------------------------------------------------------------------ */

static int
group_setup(void **state)
{
	char cdata[200], sdata[200], clog[200], mhost[32], maxkey[16];
	(void)state;

	memset(&g, 0, sizeof(g));
	snprintf(g.dir, sizeof(g.dir), "/tmp/kvmetrics.XXXXXX");
	if (mkdtemp(g.dir) == NULL)
		return -1;
	kv_test_free_url(g.ctl_url, sizeof(g.ctl_url));
	kv_test_free_url(g.srv_url, sizeof(g.srv_url));
	g.mport = kv_test_free_port();
	snprintf(cdata, sizeof(cdata), "%s/ctl", g.dir);
	snprintf(sdata, sizeof(sdata), "%s/srv", g.dir);
	snprintf(clog, sizeof(clog), "%s/ctl.log", g.dir);
	snprintf(g.srv_log, sizeof(g.srv_log), "%s/srv.log", g.dir);
	snprintf(mhost, sizeof(mhost), "127.0.0.1:%d", g.mport);
	snprintf(maxkey, sizeof(maxkey), "%u", MAX_KEY);

	/* One copy per range on purpose: migration_counters_follow_a_move
	 * counts a migration's bytes, and a move migrates only with one copy
	 * (the other tests use one server, where R makes no difference). */
	const char *ca[] = {KV_CONTROLLER_BIN, "--listen", g.ctl_url, "--data-dir", cdata,
	                    "--replicas",      "1",        NULL};
	g.ctl = spawn(ca, clog);
	const char *sa[] = {KV_SERVER_BIN, "--listen", g.srv_url, "--controller", g.ctl_url,
	                    "--data-dir",  sdata,      "--join",  "--max-key",    maxkey,
	                    "--metrics",   mhost,      NULL};
	g.srv = spawn(sa, g.srv_log);
	if (g.ctl <= 0 || g.srv <= 0)
		return -1;
	/* Ready when the server has registered and applied a configuration. */
	if (!(wait_sample("shardkv_server_node_id", 1, READY_MS) >= 1) ||
	    !(wait_sample("shardkv_server_epoch", 1, READY_MS) >= 1)) {
		dump(clog);
		dump(g.srv_log);
		return -1;
	}
	shardkv_options o = {.timeout_ms = 5000};
	return shardkv_open(g.ctl_url, &o, &g.cl) == 0 ? 0 : -1;
}

static int
group_teardown(void **state)
{
	(void)state;

	shardkv_close(g.cl);
	if (g.srv2 > 0) {
		kill(g.srv2, SIGKILL); /* scratch data: no drain */
		wait_exit(g.srv2, 5000);
	}
	if (g.srv > 0) {
		kill(g.srv, SIGKILL);
		wait_exit(g.srv, 5000);
	}
	if (g.ctl > 0) {
		kill(g.ctl, SIGTERM);
		wait_exit(g.ctl, 5000);
	}
	if (getenv("KV_TEST_KEEP") == NULL)
		kv_test_rmtree(g.dir);
	return 0;
}

/* ------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------ */

static void
counters_follow_the_traffic_and_the_text_is_valid(void **state)
{
	char k[32], v[32], big[MAX_KEY + 50];
	uint64_t deadline = kv_test_now_ms() + READY_MS;
	int rv;
	(void)state;

	/* The first write waits until the server serves the key space. */
	while ((rv = shardkv_put(g.cl, "m000", 4, "v", 1)) != 0) {
		if (kv_test_now_ms() > deadline) {
			dump(g.srv_log);
			fail_msg("first put: %s", shardkv_strerror(rv));
		}
		kv_test_sleep_ms(50);
	}
	for (unsigned i = 0; i < NKEYS; i++) {
		int kl = snprintf(k, sizeof(k), "m%03u", i);
		int vl = snprintf(v, sizeof(v), "value-%u", i);
		assert_int_equal(shardkv_put(g.cl, k, (size_t)kl, v, (size_t)vl), 0);
	}
	for (unsigned i = 0; i < NKEYS; i++) {
		shardkv_buf b;
		int kl = snprintf(k, sizeof(k), "m%03u", i);
		assert_int_equal(shardkv_get(g.cl, k, (size_t)kl, &b), 0);
		shardkv_free(b.data);
	}
	assert_int_equal(shardkv_del(g.cl, "m000", 4, NULL), 0);
	assert_int_equal(shardkv_append(g.cl, "n-app", 5, "x", 1, NULL), 0);
	shardkv_bytes mk[2] = {{"n-a", 3}, {"n-b", 3}}, mv[2] = {{"1", 1}, {"2", 1}};
	assert_int_equal(shardkv_mput(g.cl, 2, mk, 2, mv, NULL), 0);
	shardkv_mget_result *mr = NULL;
	assert_int_equal(shardkv_mget(g.cl, 2, mk, &mr), 0);
	shardkv_mget_result_free(mr);
	shardkv_scan_result *sr = NULL;
	assert_int_equal(shardkv_scan(g.cl, "m", 1, "n", 1, 10, &sr), 0);
	shardkv_scan_result_free(sr);
	/* A key over --max-key: refused by the server, counted as too_big. */
	memset(big, 'k', sizeof(big));
	assert_int_equal(shardkv_put(g.cl, big, sizeof(big), "v", 1), SHARDKV_ETOOBIG);

	kv_http_answer a = scrape();
	check_format(a.body);
	const char *b = a.body;
	assert_true(kv_http_sample(b, "shardkv_server_ops_total{op=\"put\"}") >= NKEYS + 2);
	assert_true(kv_http_sample(b, "shardkv_server_ops_total{op=\"get\"}") >= NKEYS);
	assert_true(kv_http_sample(b, "shardkv_server_ops_total{op=\"del\"}") >= 1);
	assert_true(kv_http_sample(b, "shardkv_server_ops_total{op=\"append\"}") >= 1);
	assert_true(kv_http_sample(b, "shardkv_server_ops_total{op=\"mput\"}") >= 1);
	assert_true(kv_http_sample(b, "shardkv_server_ops_total{op=\"mget\"}") >= 1);
	assert_true(kv_http_sample(b, "shardkv_server_ops_total{op=\"scan\"}") >= 1);
	assert_true(kv_http_sample(b, "shardkv_server_errors_total{status=\"too_big\"}") >= 1);
	assert_false(
	    isnan(kv_http_sample(b, "shardkv_server_errors_total{status=\"wrong_owner\"}")));
	assert_false(isnan(kv_http_sample(b, "shardkv_server_errors_total{status=\"moving\"}")));
	assert_false(isnan(kv_http_sample(b, "shardkv_server_errors_total{status=\"no_space\"}")));
	assert_false(isnan(kv_http_sample(b, "shardkv_server_errors_total{status=\"other\"}")));
	assert_true(isnan(kv_http_sample(b, "shardkv_server_errors_total{status=\"not_found\"}")));
	/* m001..m099, n-app, n-a, n-b */
	assert_true(kv_http_sample(b, "shardkv_server_keys") >= NKEYS + 2);
	assert_true(kv_http_sample(b, "shardkv_server_bytes") > 0);
	assert_true(kv_http_sample(b, "shardkv_server_memory_bytes") > 0);
	assert_true(kv_http_sample(b, "shardkv_server_epoch") >= 1);
	assert_true(kv_http_sample(b, "shardkv_server_node_id") >= 1);
	assert_true(kv_http_sample(b, "shardkv_server_requests_inflight") >= 0);
	assert_true(kv_http_sample(b, "shardkv_wal_records_total") >= NKEYS);
	assert_true(kv_http_sample(b, "shardkv_wal_bytes_total") > 0);
	assert_true(kv_http_sample(b, "shardkv_wal_writes_total") > 0);
	assert_true(kv_http_sample(b, "shardkv_wal_fsyncs_total") >= 0);
	assert_true(kv_http_sample(b, "shardkv_wal_segments_total") >= 1);
	assert_true(kv_http_sample(b, "shardkv_wal_segments_reused_total") >= 0);
	assert_true(kv_http_sample(b, "shardkv_wal_healthy") == 1);
	assert_true(kv_http_sample(b, "shardkv_snapshots_total") >= 0);
	assert_true(kv_http_sample(b, "shardkv_snapshot_last_duration_seconds") >= 0);
	assert_true(kv_http_sample(b, "shardkv_snapshot_last_bytes") >= 0);
	assert_true(kv_http_sample(b, "shardkv_migrations_out_active") == 0);
	assert_true(kv_http_sample(b, "shardkv_migration_bytes_copied_total") == 0);
	assert_true(kv_http_sample(b, "shardkv_server_connections") >= 1);
	check_histogram(b, "put", NKEYS + 2);
	check_histogram(b, "get", NKEYS);
	check_histogram(b, "scan", 1);
	check_histogram(b, "del", 1);
	/* The heartbeat's count of the one range this server serves. */
	assert_true(wait_sample("shardkv_server_range_keys{range=\"[, )\"}", NKEYS + 2, READY_MS) >=
	            NKEYS + 2);
	double puts = kv_http_sample(b, "shardkv_server_ops_total{op=\"put\"}");
	kv_http_answer_free(&a);

	/* Counters only grow. */
	assert_int_equal(shardkv_put(g.cl, "m001", 4, "w", 1), 0);
	a = scrape();
	assert_true(kv_http_sample(a.body, "shardkv_server_ops_total{op=\"put\"}") >= puts + 1);
	kv_http_answer_free(&a);
}

static void
other_paths_get_404_and_hostile_requests_do_no_harm(void **state)
{
	kv_http_answer a;
	char *junk;
	(void)state;

	a = kv_http_get(g.mport, "/");
	assert_int_equal(a.status, 404);
	kv_http_answer_free(&a);
	a = kv_http_get(g.mport, "/metricsx");
	assert_int_equal(a.status, 404);
	kv_http_answer_free(&a);
	a = kv_http_raw(g.mport, "POST /metrics HTTP/1.0\r\n\r\n", 26);
	assert_int_equal(a.status, 404);
	kv_http_answer_free(&a);

	/* Binary garbage with a line end: a 404, nothing more. */
	static const char garbage[] = "\x00\xff\x13GET\r\x7f\n\n";
	a = kv_http_raw(g.mport, garbage, sizeof(garbage) - 1);
	assert_int_equal(a.status, 404);
	kv_http_answer_free(&a);
	/* A line that never ends: cut at the bound with a 400. */
	junk = malloc(8 * 1024);
	assert_non_null(junk);
	memset(junk, 'A', 8 * 1024);
	a = kv_http_raw(g.mport, junk, 8 * 1024);
	assert_true(a.status == 400 || a.status == 0); /* 0: the reset won the race */
	kv_http_answer_free(&a);
	free(junk);
	/* Connect and leave at once. */
	int fd = kv_http_dial(g.mport);
	assert_true(fd >= 0);
	close(fd);
	/* A silent client holds the listener for its timeout only. */
	int idle = kv_http_dial(g.mport);
	assert_true(idle >= 0);
	kv_test_sleep_ms(50);
	uint64_t t0 = kv_test_now_ms();
	a = scrape();
	assert_true(kv_test_now_ms() - t0 < 4000);
	kv_http_answer_free(&a);
	close(idle);

	/* The server is alive and serving. */
	assert_true(alive(g.srv));
	shardkv_buf v;
	assert_int_equal(shardkv_put(g.cl, "h", 1, "ok", 2), 0);
	assert_int_equal(shardkv_get(g.cl, "h", 1, &v), 0);
	shardkv_free(v.data);
	a = scrape();
	check_format(a.body);
	kv_http_answer_free(&a);
}

/* Starts a second server with --metrics `addr`; expects exit 1 and `why`
 * in its log. */
static void
refuses(const char *addr, const char *why, const char *tag)
{
	char url[64], data[200], log[200], buf[8192];
	FILE *f;

	kv_test_free_url(url, sizeof(url));
	snprintf(data, sizeof(data), "%s/%s", g.dir, tag);
	snprintf(log, sizeof(log), "%s/%s.log", g.dir, tag);
	const char *argv[] = {KV_SERVER_BIN, "--listen", url,         "--controller", g.ctl_url,
	                      "--data-dir",  data,       "--metrics", addr,           NULL};
	pid_t pid = spawn(argv, log);
	assert_true(pid > 0);
	int st = wait_exit(pid, READY_MS);
	assert_true(st != -1 && WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 1);
	assert_non_null(f = fopen(log, "r"));
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	if (strstr(buf, why) == NULL)
		fail_msg("log of --metrics %s lacks \"%s\":\n%s", addr, why, buf);
}

static void
bad_or_busy_metrics_address_refuses_to_start(void **state)
{
	char busy[32];
	(void)state;

	refuses("no-port-here", "invalid --metrics address no-port-here", "bad1");
	refuses("127.0.0.1:http", "invalid --metrics address", "bad2");
	refuses("tcp://127.0.0.1:1", "invalid --metrics address", "bad3");
	snprintf(busy, sizeof(busy), "127.0.0.1:%d", g.mport); /* the first server's */
	refuses(busy, "cannot serve metrics", "busy");
	assert_true(alive(g.srv));
}

/* The node of cfg's range map that owns key, or 0. */
static uint32_t
owner_of(const shardkv_config *cfg, const char *key)
{
	uint32_t node = 0;
	size_t kl = strlen(key);

	for (size_t i = 0; i < cfg->nranges; i++) {
		const shardkv_buf *st = &cfg->ranges[i].start;
		size_t n = st->len < kl ? st->len : kl;
		int c = n ? memcmp(st->data, key, n) : 0;
		if (c < 0 || (c == 0 && st->len <= kl))
			node = cfg->ranges[i].node;
	}
	return node;
}

/* Whether the latest configuration has the node at `addr` active and no
 * migration; sets *id to its node id. */
static bool
settled_with(const char *addr, uint32_t *id)
{
	shardkv_config *cfg = NULL;
	bool ok = false;

	if (shardkv_config_get(g.cl, 0, &cfg) != 0)
		return false;
	for (size_t i = 0; i < cfg->nnodes; i++)
		if (strcmp(cfg->nodes[i].address, addr) == 0 &&
		    cfg->nodes[i].state == SHARDKV_NODE_ACTIVE) {
			*id = cfg->nodes[i].id;
			ok = true;
		}
	ok &= cfg->nmigrations == 0;
	shardkv_config_free(cfg);
	return ok;
}

/* Reads for ms milliseconds (the server's only traffic meanwhile). */
static void
read_for(unsigned ms)
{
	uint64_t end = kv_test_now_ms() + ms;

	while (kv_test_now_ms() < end) {
		shardkv_buf v;
		assert_int_equal(shardkv_get(g.cl, "m001", 4, &v), 0);
		shardkv_free(v.data);
	}
}

/* The heartbeat counts the served ranges' keys after writes, and not while
 * only reads come (that walk passes over every key). */
static void
range_counts_stop_while_only_reads_come(void **state)
{
	const char *series = "shardkv_server_range_counts_total";
	double c0, c1;
	(void)state;

	c0 = wait_sample(series, 0, READY_MS);
	assert_false(isnan(c0));
	assert_int_equal(shardkv_put(g.cl, "rc-new", 6, "v", 1), 0);
	/* A count after the write; one more may follow when the walk began
	 * before the write was applied. */
	assert_true(wait_sample(series, c0 + 1, READY_MS) >= c0 + 1);
	read_for(2500);
	c1 = wait_sample(series, 0, READY_MS);
	read_for(3500); /* three heartbeats and more */
	assert_true(wait_sample(series, 0, READY_MS) == c1);
	/* A new key is counted again. */
	assert_int_equal(shardkv_put(g.cl, "rc-new2", 7, "v", 1), 0);
	assert_true(wait_sample(series, c1 + 1, READY_MS) >= c1 + 1);
	assert_int_equal(shardkv_del(g.cl, "rc-new", 6, NULL), 0);
	assert_int_equal(shardkv_del(g.cl, "rc-new2", 7, NULL), 0);
}

static void
migration_counters_follow_a_move(void **state)
{
	char data[200], log[200];
	shardkv_config *cfg = NULL;
	uint64_t deadline = kv_test_now_ms() + READY_MS;
	uint32_t id2 = 0;
	(void)state;

	kv_test_free_url(g.srv2_url, sizeof(g.srv2_url));
	snprintf(data, sizeof(data), "%s/srv2", g.dir);
	snprintf(log, sizeof(log), "%s/srv2.log", g.dir);
	const char *argv[] = {KV_SERVER_BIN,  "--listen", g.srv2_url,
	                      "--controller", g.ctl_url,  "--data-dir",
	                      data,           "--join",   NULL};
	g.srv2 = spawn(argv, log);
	assert_true(g.srv2 > 0);
	/* The join may rebalance on its own; wait until it has settled. */
	while (!settled_with(g.srv2_url, &id2)) {
		if (kv_test_now_ms() > deadline) {
			dump(log);
			fail_msg("the second server did not become active");
		}
		kv_test_sleep_ms(50);
	}
	/* Make sure the first server has sent the m keys to the second. */
	assert_int_equal(shardkv_config_get(g.cl, 0, &cfg), 0);
	uint32_t owner = owner_of(cfg, "m050");
	shardkv_config_free(cfg);
	if (owner != id2)
		assert_int_equal(
		    shardkv_move(g.cl, "m", 1, "n", 1, g.srv2_url, 0, SHARDKV_WAIT, NULL), 0);
	assert_true(wait_sample("shardkv_migration_bytes_copied_total", 1, READY_MS) >= 1);
	/* Every outgoing task ends once its migration is done. */
	deadline = kv_test_now_ms() + READY_MS;
	for (;;) {
		kv_http_answer a = scrape();
		double active = kv_http_sample(a.body, "shardkv_migrations_out_active");
		check_format(a.body);
		kv_http_answer_free(&a);
		if (active == 0)
			break;
		if (kv_test_now_ms() > deadline)
			fail_msg("shardkv_migrations_out_active stays %g", active);
		kv_test_sleep_ms(50);
	}
	/* The data is readable where it went. */
	shardkv_buf v;
	assert_int_equal(shardkv_get(g.cl, "m050", 4, &v), 0);
	shardkv_free(v.data);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(counters_follow_the_traffic_and_the_text_is_valid),
	    cmocka_unit_test(other_paths_get_404_and_hostile_requests_do_no_harm),
	    cmocka_unit_test(bad_or_busy_metrics_address_refuses_to_start),
	    cmocka_unit_test(range_counts_stop_while_only_reads_come),
	    cmocka_unit_test(migration_counters_follow_a_move),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
