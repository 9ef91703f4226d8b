/*
 * test_client_batch.c - routing and merging of libshardkv with hand-built
 * configurations: mget/mput keys split per node with indexes in key order,
 * scans cut at every range and migration boundary, per-server scan pages
 * merged in key order with the limit; a Response read as the reply to a
 * request of n ops (kvc_reply_decode). And what needs no server: a library
 * that writes no info lines to its user's stderr unless asked; a controller
 * address where nothing listens reported as refused, naming it, well before
 * the deadline; a per-thread deadline that replaces the handle's; async
 * mget/mput/scan that complete once with the call's error; scan cursors
 * that check their arguments.
 */
#include "client/client_int.h"
#include "common/err.h"
#include "common/log.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void
set(kv_buf *b, const char *s)
{
	assert_int_equal(kv_buf_set(b, s, strlen(s)), KV_OK);
}

/*
 * Three nodes; ranges ["", "g") -> 1, ["g", "p") -> 2, ["p", "") -> 3;
 * with `mig`, [“h”, “k”) is moving from 2 to 3 (the map already names 3 for
 * it, as the controller publishes).
 */
static kv_config *
make_config(bool mig)
{
	kv_config *c = kv_config_new();
	assert_non_null(c);
	c->epoch = 7;
	c->nnodes = 3;
	c->nodes = calloc(3, sizeof(kv_node));
	for (uint32_t i = 0; i < 3; i++) {
		char addr[64];
		snprintf(addr, sizeof(addr), "tcp://127.0.0.1:%u", 7101 + i);
		c->nodes[i].id = i + 1;
		c->nodes[i].address = strdup(addr);
		c->nodes[i].state = KV_NODE_ACTIVE;
	}
	if (!mig) {
		c->nranges = 3;
		c->ranges = calloc(3, sizeof(kv_range));
		set(&c->ranges[0].start, "");
		set(&c->ranges[0].end, "g");
		c->ranges[0].node = 1;
		set(&c->ranges[1].start, "g");
		set(&c->ranges[1].end, "p");
		c->ranges[1].node = 2;
		set(&c->ranges[2].start, "p");
		set(&c->ranges[2].end, "");
		c->ranges[2].node = 3;
	} else {
		c->nranges = 5;
		c->ranges = calloc(5, sizeof(kv_range));
		const char *b[] = {"", "g", "h", "k", "p", ""};
		const uint32_t o[] = {1, 2, 3, 2, 3};
		for (int i = 0; i < 5; i++) {
			set(&c->ranges[i].start, b[i]);
			set(&c->ranges[i].end, b[i + 1]);
			c->ranges[i].node = o[i];
		}
		c->nmigs = 1;
		c->migs = calloc(1, sizeof(kv_migration));
		c->migs[0].id = 1;
		c->migs[0].epoch = 7;
		set(&c->migs[0].start, "h");
		set(&c->migs[0].end, "k");
		c->migs[0].from = 2;
		c->migs[0].to = 3;
		c->migs[0].phase = KV_MIG_COPYING;
	}
	assert_int_equal(kv_config_validate(c), KV_OK);
	return c;
}

static kv_bytes
B(const char *s)
{
	return (kv_bytes){(const uint8_t *)s, strlen(s)};
}

static void
split_groups_keys_per_node_in_key_order(void **state)
{
	kv_config *c = make_config(false);
	kv_bytes keys[] = {B("zeta"), B("apple"), B("hat"), B("banana"), B("zoo"), B("g")};
	kvc_part *p;
	size_t np;
	(void)state;

	assert_int_equal(kvc_split_keys(c, 6, keys, &p, &np), KV_OK);
	assert_int_equal(np, 3);
	assert_int_equal(p[0].node, 1); /* apple, banana */
	assert_int_equal(p[0].n, 2);
	assert_int_equal(p[0].idx[0], 1);
	assert_int_equal(p[0].idx[1], 3);
	assert_int_equal(p[1].node, 2); /* hat, g */
	assert_int_equal(p[1].n, 2);
	assert_int_equal(p[1].idx[0], 2);
	assert_int_equal(p[1].idx[1], 5);
	assert_int_equal(p[2].node, 3); /* zeta, zoo */
	assert_int_equal(p[2].n, 2);
	assert_int_equal(p[2].idx[0], 0);
	assert_int_equal(p[2].idx[1], 4);
	kvc_parts_free(p, np);
	kv_config_free(c);
}

static void
split_of_keys_on_one_node_is_one_part(void **state)
{
	kv_config *c = make_config(false);
	kv_bytes keys[] = {B("a"), B("b"), B("a")}; /* duplicates allowed */
	kvc_part *p;
	size_t np;
	(void)state;

	assert_int_equal(kvc_split_keys(c, 3, keys, &p, &np), KV_OK);
	assert_int_equal(np, 1);
	assert_int_equal(p[0].node, 1);
	assert_int_equal(p[0].n, 3);
	for (size_t i = 0; i < 3; i++)
		assert_int_equal(p[0].idx[i], i);
	kvc_parts_free(p, np);
	kv_config_free(c);
}

static void
split_sends_moving_keys_to_the_migration_source(void **state)
{
	kv_config *c = make_config(true);
	kv_bytes keys[] = {B("i"), B("l"), B("q")};
	kvc_part *p;
	size_t np;
	(void)state;

	assert_int_equal(kvc_split_keys(c, 3, keys, &p, &np), KV_OK);
	assert_int_equal(np, 2);
	assert_int_equal(p[0].node, 2); /* i (moving 2 -> 3, still at 2) and l */
	assert_int_equal(p[0].n, 2);
	assert_int_equal(p[1].node, 3);
	assert_int_equal(p[1].idx[0], 2);
	kvc_parts_free(p, np);
	kv_config_free(c);
}

static void
assert_span(const kvc_span *s, const char *start, const char *end, uint32_t node)
{
	assert_int_equal(s->start.len, strlen(start));
	if (s->start.len)
		assert_memory_equal(s->start.data, start, s->start.len);
	assert_int_equal(s->end.len, strlen(end));
	if (s->end.len)
		assert_memory_equal(s->end.data, end, s->end.len);
	assert_int_equal(s->node, node);
}

static void
scan_plan_cuts_at_range_boundaries(void **state)
{
	kv_config *c = make_config(false);
	kvc_span *s;
	size_t n;
	(void)state;

	assert_int_equal(kvc_scan_plan(c, B(""), B(""), &s, &n), KV_OK);
	assert_int_equal(n, 3);
	assert_span(&s[0], "", "g", 1);
	assert_span(&s[1], "g", "p", 2);
	assert_span(&s[2], "p", "", 3);
	kvc_spans_free(s, n);

	assert_int_equal(kvc_scan_plan(c, B("b"), B("h"), &s, &n), KV_OK);
	assert_int_equal(n, 2);
	assert_span(&s[0], "b", "g", 1);
	assert_span(&s[1], "g", "h", 2);
	kvc_spans_free(s, n);

	assert_int_equal(kvc_scan_plan(c, B("q"), B("r"), &s, &n), KV_OK);
	assert_int_equal(n, 1);
	assert_span(&s[0], "q", "r", 3);
	kvc_spans_free(s, n);

	assert_int_equal(kvc_scan_plan(c, B("r"), B("q"), &s, &n), KV_EINVAL);
	kv_config_free(c);
}

static void
scan_plan_routes_moving_part_to_the_source(void **state)
{
	kv_config *c = make_config(true);
	kvc_span *s;
	size_t n;
	(void)state;

	assert_int_equal(kvc_scan_plan(c, B("a"), B("z"), &s, &n), KV_OK);
	assert_int_equal(n, 5);
	assert_span(&s[0], "a", "g", 1);
	assert_span(&s[1], "g", "h", 2);
	assert_span(&s[2], "h", "k", 2); /* owned by 3 in the map, moving from 2 */
	assert_span(&s[3], "k", "p", 2);
	assert_span(&s[4], "p", "z", 3);
	kvc_spans_free(s, n);
	kv_config_free(c);
}

/* Builds n heap entries from keys. */
static kv_data_entry *
entries(const char **keys, size_t n)
{
	kv_data_entry *e = calloc(n, sizeof(*e));
	for (size_t i = 0; i < n; i++) {
		set(&e[i].key, keys[i]);
		set(&e[i].value, "v");
	}
	return e;
}

static void
free_entries(kv_data_entry *e, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		kv_buf_fini(&e[i].key);
		kv_buf_fini(&e[i].value);
	}
	free(e);
}

static void
assert_keys(const kvc_entries *acc, const char **want, size_t n)
{
	assert_int_equal(acc->n, n);
	for (size_t i = 0; i < n; i++) {
		assert_int_equal(acc->entries[i].key.len, strlen(want[i]));
		assert_memory_equal(acc->entries[i].key.data, want[i], strlen(want[i]));
	}
}

static void
merge_concatenates_server_pages_in_key_order(void **state)
{
	const char *a[] = {"apple", "banana"}, *b[] = {"grape", "hat"}, *c[] = {"zoo"};
	const char *want[] = {"apple", "banana", "grape", "hat", "zoo"};
	kvc_entries acc = {0};
	kv_data_entry *ea = entries(a, 2), *eb = entries(b, 2), *ec = entries(c, 1);
	(void)state;

	assert_int_equal(kvc_entries_merge(&acc, ea, 2, 0), 2);
	assert_int_equal(kvc_entries_merge(&acc, eb, 2, 0), 2);
	assert_int_equal(kvc_entries_merge(&acc, ec, 1, 0), 1);
	assert_keys(&acc, want, 5);
	free_entries(ea, 2);
	free_entries(eb, 2);
	free_entries(ec, 1);
	kvc_entries_fini(&acc);
}

static void
merge_drops_keys_repeated_after_a_config_change(void **state)
{
	const char *a[] = {"a", "b", "c"}, *b[] = {"b", "c", "d"};
	const char *want[] = {"a", "b", "c", "d"};
	kvc_entries acc = {0};
	kv_data_entry *ea = entries(a, 3), *eb = entries(b, 3);
	(void)state;

	assert_int_equal(kvc_entries_merge(&acc, ea, 3, 0), 3);
	assert_int_equal(kvc_entries_merge(&acc, eb, 3, 0), 1);
	assert_keys(&acc, want, 4);
	free_entries(ea, 3);
	free_entries(eb, 3);
	kvc_entries_fini(&acc);
}

static void
merge_stops_at_the_limit(void **state)
{
	const char *a[] = {"a", "b"}, *b[] = {"c", "d", "e"};
	const char *want[] = {"a", "b", "c"};
	kvc_entries acc = {0};
	kv_data_entry *ea = entries(a, 2), *eb = entries(b, 3);
	(void)state;

	assert_int_equal(kvc_entries_merge(&acc, ea, 2, 3), 2);
	assert_int_equal(kvc_entries_merge(&acc, eb, 3, 3), 1);
	assert_keys(&acc, want, 3);
	/* Entries not taken stay with the caller. */
	assert_non_null(eb[1].key.data);
	assert_null(eb[0].key.data);
	free_entries(ea, 2);
	free_entries(eb, 3);
	kvc_entries_fini(&acc);
}

static void
merge_orders_binary_keys_bytewise(void **state)
{
	kvc_entries acc = {0};
	kv_data_entry *e = calloc(3, sizeof(*e));
	(void)state;

	assert_int_equal(kv_buf_set(&e[0].key, "a", 1), KV_OK);
	assert_int_equal(kv_buf_set(&e[1].key, "a\0", 2), KV_OK); /* a prefix sorts first */
	assert_int_equal(kv_buf_set(&e[2].key, "\xff", 1), KV_OK);
	assert_int_equal(kvc_entries_merge(&acc, e, 3, 0), 3);
	assert_int_equal(acc.entries[1].key.len, 2);
	free_entries(e, 3);
	kvc_entries_fini(&acc);
}

/* Packs a Response into bytes (*msg owns them). */
static void
pack(const kv_resp *r, nng_msg **msg)
{
	assert_int_equal(kv_data_resp_encode(r, msg), KV_OK);
}

static void
reply_with_a_result_per_op_decodes(void **state)
{
	kv_data_result res[2] = {
	    {.status = KV_OK, .has_value = true},
	    {.status = KV_EWRONGOWNER, .error = "not mine", .has_hint = true},
	};
	kv_resp r = {.request_id = 9, .epoch = 12, .node_id = 2, .nresults = 2, .results = res};
	kv_resp d;
	nng_msg *m;

	(void)state;
	set(&res[0].value, "v1");
	set(&res[1].hint.start, "a");
	set(&res[1].hint.end, "m");
	res[1].hint.node_id = 3;
	res[1].hint.epoch = 13;
	pack(&r, &m);
	assert_int_equal(kvc_reply_decode(nng_msg_body(m), nng_msg_len(m), 2, &d), KV_OK);
	assert_int_equal(d.status, KV_OK);
	assert_int_equal(d.epoch, 12);
	assert_int_equal(d.nresults, 2);
	assert_int_equal(d.results[0].value.len, 2);
	assert_memory_equal(d.results[0].value.data, "v1", 2);
	assert_int_equal(d.results[1].status, KV_EWRONGOWNER);
	assert_string_equal(d.results[1].error, "not mine");
	assert_true(d.results[1].has_hint);
	assert_int_equal(d.results[1].hint.node_id, 3);
	assert_memory_equal(d.results[1].hint.end.data, "m", 1);
	kv_data_resp_fini(&d);
	for (size_t i = 0; i < 2; i++)
		kv_data_result_fini(&res[i]);
	nng_msg_free(m);
}

static void
reply_with_a_result_count_that_differs_is_a_protocol_error(void **state)
{
	kv_data_result res[1] = {{.status = KV_OK}};
	kv_resp r = {.epoch = 1, .nresults = 1, .results = res};
	kv_resp d;
	nng_msg *m;

	(void)state;
	pack(&r, &m);
	assert_int_equal(kvc_reply_decode(nng_msg_body(m), nng_msg_len(m), 2, &d), KV_EPROTO);
	assert_null(d.pb);
	assert_null(d.results);
	r.nresults = 0;
	nng_msg_free(m);
	pack(&r, &m);
	assert_int_equal(kvc_reply_decode(nng_msg_body(m), nng_msg_len(m), 1, &d), KV_EPROTO);
	assert_int_equal(kvc_reply_decode("\xff\xff\xff", 3, 1, &d), KV_EPROTO);
	assert_null(d.pb);
	nng_msg_free(m);
}

static void
refused_reply_needs_no_results(void **state)
{
	kv_resp r = {.epoch = 20, .status = KV_ESTALE, .error = "epoch 3 is stale"};
	kv_resp d;
	nng_msg *m;

	(void)state;
	pack(&r, &m);
	assert_int_equal(kvc_reply_decode(nng_msg_body(m), nng_msg_len(m), 2, &d), KV_OK);
	assert_int_equal(d.status, KV_ESTALE);
	assert_int_equal(d.epoch, 20);
	assert_string_equal(d.error, "epoch 3 is stale");
	assert_int_equal(d.nresults, 0);
	kv_data_resp_fini(&d);
	nng_msg_free(m);
}

/* ---------------------------------------------------------------------------
 * Without a server
 * ------------------------------------------------------------------------- */

/* A loopback TCP socket bound to a free port; listening when `listen_too`
 * (connections are queued by the kernel and never served). Returns the fd
 * and the port in *port. */
static int
loopback_socket(bool listen_too, int *port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
	if (listen_too)
		assert_int_equal(listen(fd, 16), 0);
	*port = ntohs(a.sin_port);
	return fd;
}

/* A controller URL on a loopback port where nothing listens. The port is
 * bound without listening while the test runs, so nobody else takes it. */
static int
refused_url(char *url, size_t len)
{
	int port, fd = loopback_socket(false, &port);
	snprintf(url, len, "tcp://127.0.0.1:%d", port);
	return fd;
}

static uint64_t
now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static shardkv_client *
open_on(const char *url, uint32_t timeout_ms)
{
	shardkv_options o = {.timeout_ms = timeout_ms, .no_watch = true};
	shardkv_client *c = NULL;
	assert_int_equal(shardkv_open(url, &o, &c), 0);
	return c;
}

/* Must run first: the default level is set by the first shardkv_open. */
static void
library_writes_no_info_lines_by_default(void **state)
{
	char url[64];
	int fd = refused_url(url, sizeof(url));
	shardkv_client *c = open_on(url, 3000);

	(void)state;
	assert_false(kv_log_enabled(KV_LOG_INFO));
	assert_true(kv_log_enabled(KV_LOG_WARN));
	/* What a failing call writes to stderr: nothing at info. */
	char path[] = "/tmp/kv-libquiet.XXXXXX";
	int out = mkstemp(path), saved = dup(2);
	assert_true(out >= 0 && saved >= 0);
	fflush(stderr);
	dup2(out, 2);
	kv_log(KV_LOG_INFO, "rpc", "redialing", "url=%s", url);
	shardkv_buf v;
	int rv = shardkv_get(c, "a", 1, &v);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	assert_int_equal(rv, SHARDKV_EUNAVAIL);
	assert_int_equal(lseek(out, 0, SEEK_END), 0);
	close(out);
	unlink(path);
	shardkv_close(c);
	close(fd);
	/* The program may ask for more, and for an invalid level gets EINVAL. */
	assert_int_equal(shardkv_set_log_level(SHARDKV_LOG_INFO), 0);
	assert_true(kv_log_enabled(KV_LOG_INFO));
	assert_int_equal(shardkv_set_log_level(7), SHARDKV_EINVAL);
	assert_int_equal(shardkv_set_log_level(SHARDKV_LOG_WARN), 0);
	assert_false(kv_log_enabled(KV_LOG_INFO));
}

static void
refused_controller_is_reported_well_before_the_deadline(void **state)
{
	char url[64];
	int fd = refused_url(url, sizeof(url));
	shardkv_client *c = open_on(url, 10000);
	shardkv_buf v;
	shardkv_config *cfg;

	(void)state;
	uint64_t t0 = now_ms();
	assert_int_equal(shardkv_get(c, "a", 1, &v), SHARDKV_EUNAVAIL);
	assert_true(now_ms() - t0 < 3000);
	assert_non_null(strstr(shardkv_errmsg(), url));
	assert_non_null(strstr(shardkv_errmsg(), "refused"));
	/* An admin call likewise. */
	t0 = now_ms();
	assert_int_equal(shardkv_status(c, &cfg), SHARDKV_EUNAVAIL);
	assert_true(now_ms() - t0 < 3000);
	assert_non_null(strstr(shardkv_errmsg(), "refused"));
	shardkv_close(c);
	close(fd);
}

static void
refused_among_several_controllers_needs_every_one_refused(void **state)
{
	char u1[64], u2[64], both[140];
	int f1 = refused_url(u1, sizeof(u1)), f2 = refused_url(u2, sizeof(u2));
	shardkv_buf v;

	(void)state;
	snprintf(both, sizeof(both), "%s,%s", u1, u2);
	shardkv_client *c = open_on(both, 10000);
	uint64_t t0 = now_ms();
	assert_int_equal(shardkv_get(c, "a", 1, &v), SHARDKV_EUNAVAIL);
	assert_true(now_ms() - t0 < 3000);
	assert_non_null(strstr(shardkv_errmsg(), "refused"));
	shardkv_close(c);
	close(f1);
	close(f2);
}

static void
thread_timeout_replaces_the_handles_deadline(void **state)
{
	int port, fd = loopback_socket(true, &port); /* accepts, never answers */
	char url[64];
	shardkv_buf v;

	(void)state;
	snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
	shardkv_client *c = open_on(url, 20000);
	assert_int_equal(shardkv_thread_timeout(), 0);
	shardkv_set_thread_timeout(300);
	assert_int_equal(shardkv_thread_timeout(), 300);
	uint64_t t0 = now_ms();
	int rv = shardkv_get(c, "a", 1, &v);
	shardkv_set_thread_timeout(0);
	assert_true(rv == SHARDKV_EUNAVAIL || rv == SHARDKV_ETIMEDOUT);
	assert_true(now_ms() - t0 < 10000); /* the handle's 20 s did not apply */
	shardkv_close(c);
	close(fd);
}

typedef struct {
	atomic_int calls;
	int status;
	bool result;
} multi_seen;

static void
mget_seen(void *arg, int status, shardkv_mget_result *r)
{
	multi_seen *s = arg;
	s->status = status;
	s->result = r != NULL;
	shardkv_mget_result_free(r);
	atomic_fetch_add(&s->calls, 1);
}

static void
mput_seen(void *arg, int status, shardkv_mput_result *r)
{
	multi_seen *s = arg;
	s->status = status;
	s->result = r != NULL;
	shardkv_mput_result_free(r);
	atomic_fetch_add(&s->calls, 1);
}

static void
scan_seen(void *arg, int status, shardkv_scan_result *r)
{
	multi_seen *s = arg;
	s->status = status;
	s->result = r != NULL;
	shardkv_scan_result_free(r);
	atomic_fetch_add(&s->calls, 1);
}

static void
async_multi_ops_complete_once_with_the_calls_error(void **state)
{
	char url[64];
	int fd = refused_url(url, sizeof(url));
	shardkv_client *c = open_on(url, 10000);
	shardkv_bytes keys[2] = {{"a", 1}, {"b", 1}}, vals[2] = {{"1", 1}, {"2", 1}};
	shardkv_scan_args sa = {.prefix = {"a", 1}};
	multi_seen m1 = {0}, m2 = {0}, m3 = {0};

	(void)state;
	/* Refused arguments: an error now and no callback. */
	assert_int_equal(shardkv_mget_async(c, 0, keys, mget_seen, &m1), SHARDKV_EINVAL);
	assert_int_equal(shardkv_mput_async(c, 2, keys, 1, vals, mput_seen, &m2), SHARDKV_EINVAL);
	assert_int_equal(shardkv_scan_async(c, NULL, scan_seen, &m3), SHARDKV_EINVAL);
	assert_int_equal(shardkv_mget_async(c, 2, keys, NULL, NULL), SHARDKV_EINVAL);
	assert_int_equal(shardkv_mget_async(c, 2, keys, mget_seen, &m1), 0);
	assert_int_equal(shardkv_mput_async(c, 2, keys, 2, vals, mput_seen, &m2), 0);
	assert_int_equal(shardkv_scan_async(c, &sa, scan_seen, &m3), 0);
	/* shardkv_close waits for all three: refused, or cut short by the close. */
	shardkv_close(c);
	assert_int_equal(atomic_load(&m1.calls), 1);
	assert_int_equal(atomic_load(&m2.calls), 1);
	assert_int_equal(atomic_load(&m3.calls), 1);
	assert_true(m1.status == SHARDKV_EUNAVAIL || m1.status == SHARDKV_ECLOSED);
	assert_true(m2.status == SHARDKV_EUNAVAIL || m2.status == SHARDKV_ECLOSED);
	assert_true(m3.status == SHARDKV_EUNAVAIL || m3.status == SHARDKV_ECLOSED);
	assert_false(m1.result);
	assert_false(m3.result);
	close(fd);
}

static void
scan_cursor_checks_its_arguments(void **state)
{
	char url[64];
	int fd = refused_url(url, sizeof(url));
	shardkv_client *c = open_on(url, 10000);
	shardkv_scan_args inverted = {.start = {"b", 1}, .end = {"a", 1}};
	shardkv_scan_args all = {0};
	shardkv_scan_iter *it = NULL;
	const shardkv_entry *e;

	(void)state;
	assert_int_equal(shardkv_scan_iter_new(c, &inverted, 0, &it), SHARDKV_EINVAL);
	assert_int_equal(shardkv_scan_iter_new(NULL, &all, 0, &it), SHARDKV_EINVAL);
	assert_int_equal(shardkv_scan_iter_next(NULL, &e), SHARDKV_EINVAL);
	/* A failed page is an error the caller may retry; the cursor stays. */
	assert_int_equal(shardkv_scan_iter_new(c, &all, 0, &it), 0);
	assert_int_equal(shardkv_scan_iter_next(it, &e), SHARDKV_EUNAVAIL);
	shardkv_scan_iter_free(it);
	shardkv_scan_iter_free(NULL);
	shardkv_close(c);
	close(fd);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(library_writes_no_info_lines_by_default),
	    cmocka_unit_test(refused_controller_is_reported_well_before_the_deadline),
	    cmocka_unit_test(refused_among_several_controllers_needs_every_one_refused),
	    cmocka_unit_test(thread_timeout_replaces_the_handles_deadline),
	    cmocka_unit_test(async_multi_ops_complete_once_with_the_calls_error),
	    cmocka_unit_test(scan_cursor_checks_its_arguments),
	    cmocka_unit_test(split_groups_keys_per_node_in_key_order),
	    cmocka_unit_test(split_of_keys_on_one_node_is_one_part),
	    cmocka_unit_test(split_sends_moving_keys_to_the_migration_source),
	    cmocka_unit_test(scan_plan_cuts_at_range_boundaries),
	    cmocka_unit_test(scan_plan_routes_moving_part_to_the_source),
	    cmocka_unit_test(merge_concatenates_server_pages_in_key_order),
	    cmocka_unit_test(merge_drops_keys_repeated_after_a_config_change),
	    cmocka_unit_test(merge_stops_at_the_limit),
	    cmocka_unit_test(merge_orders_binary_keys_bytewise),
	    cmocka_unit_test(reply_with_a_result_per_op_decodes),
	    cmocka_unit_test(reply_with_a_result_count_that_differs_is_a_protocol_error),
	    cmocka_unit_test(refused_reply_needs_no_results),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
