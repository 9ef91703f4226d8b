/*
 * test_cluster_auth.c - the shared secret (--auth-token-file, doc/contract.md §5) with
 * real daemons: a controller and two servers started with the secret serve
 * the library and the `shardkv` binary that send it, for data and admin
 * commands alike; without it or with a wrong one, data and admin commands
 * are refused (SHARDKV_EAUTH, exit code 4, "authentication failed") and
 * nothing changes (the epoch stays, the key is not written); the controller
 * logs each refusal with the peer's address; a Request sent straight to a
 * server (ops, a ping, a range transfer) without the secret is refused by the
 * server itself; a move between two servers holding the secret completes
 * (--wait); and a server started without the secret cannot register (a
 * clear line in its log, no node added) until it is restarted with it.
 */
#include "common/err.h"
#include "common/rpc.h"
#include "proto/shardkv.pb-c.h"
#include "proto/wire.h"
#include "proto/admin_codec.h"
#include "proto/data_codec.h"
#include "tests/support/cluster_util.h"
#include "tests/support/testutil.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#ifndef KV_CLI_BIN
#error "KV_CLI_BIN must name the shardkv binary"
#endif

#define TOKEN     "s3cret-token-of-the-test-cluster"
#define CLIENT_MS 10000u /* library calls; a refusal is immediate */
#define RAW_MS    5000u  /* one hand-made request */
#define MOVE_KEYS 300u   /* keys in the range that moves */

static kv_tc tc;
static char tokdir[64];    /* holds the secret files; removed at teardown */
static char good_file[96]; /* TOKEN plus a newline, mode 0600 */
static char bad_file[96];  /* another secret */
static char empty_file[96];

/* Writes `text` to path with mode 0600. */
static int
write_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	if (f == NULL)
		return -1;
	fputs(text, f);
	if (fclose(f) != 0)
		return -1;
	return chmod(path, 0600);
}

static int
setup(void **state)
{
	(void)state;
	snprintf(tokdir, sizeof(tokdir), "/tmp/shardkv-auth-XXXXXX");
	if (mkdtemp(tokdir) == NULL)
		return -1;
	snprintf(good_file, sizeof(good_file), "%s/token", tokdir);
	snprintf(bad_file, sizeof(bad_file), "%s/wrong", tokdir);
	snprintf(empty_file, sizeof(empty_file), "%s/empty", tokdir);
	if (write_file(good_file, TOKEN "\n") != 0 ||
	    write_file(bad_file, "not-the-token\n") != 0 || write_file(empty_file, "") != 0)
		return -1;
	if (kv_tc_set_auth(good_file, TOKEN) != 0)
		return -1;
	const char *args[] = {"--auth-token-file", good_file, NULL};
	/* The layout stays as the tests make it: the last test checks that a
	 * refused registration publishes nothing, which a balancer decision
	 * (e.g. evening out the primaries after the move test) would blur. */
	const char *ctl_args[] = {"--auto-balance", "off", NULL};
	if (kv_tc_set_controller_args(ctl_args) != 0)
		return -1;
	return kv_tc_start_ex(&tc, "cluster-auth", 2, args);
}

static int
teardown(void **state)
{
	(void)state;
	kv_tc_destroy(&tc);
	kv_tc_set_auth(NULL, NULL);
	kv_test_rmtree(tokdir);
	return 0;
}

/* ---------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------- */

/* A client sending `token` (NULL: none). */
static shardkv_client *
client_with(const char *token)
{
	shardkv_options o = {.timeout_ms = CLIENT_MS, .no_watch = true};
	shardkv_client *c = NULL;

	if (token) {
		o.auth_token = token;
		o.auth_token_len = strlen(token);
	}
	assert_int_equal(shardkv_open(tc.ctl_url, &o, &c), 0);
	return c;
}

/* The latest epoch, asked with the secret. */
static uint64_t
epoch_now(void)
{
	shardkv_config *cfg = kv_tc_config(&tc);
	uint64_t e;

	assert_non_null(cfg);
	e = cfg->epoch;
	shardkv_config_free(cfg);
	return e;
}

/* Runs `shardkv -c CONTROLLER ARGS...` (NULL-terminated) with extra
 * environment entries `env` (may be NULL). */
static void
run_cli(kv_tc_run_result *r, char *const env[], const char *arg, ...)
{
	va_list ap;

	va_start(ap, arg);
	int rv = kv_tc_cliv(r, tc.ctl_url, env, NULL, 0, 60000, arg, ap);
	va_end(ap);
	assert_int_equal(rv, 0);
}

/* Fails unless the CLI run exited with `code` (and, for 4, said why). */
static void
expect_exit(kv_tc_run_result *r, int code, const char *what)
{
	if (r->code != code)
		fail_msg("%s: exit %d, want %d (stdout '%s', stderr '%s')", what, r->code, code,
		         r->out, r->err);
	if (code == 4 && strstr(r->err, "authentication failed") == NULL)
		fail_msg("%s: stderr does not say why: '%s'", what, r->err);
	if (code == 4 && strchr(r->err, '\n') != strrchr(r->err, '\n'))
		fail_msg("%s: more than one line on stderr: '%s'", what, r->err);
	kv_tc_run_free(r);
}

/* Sends a Request (one put of key=val when key is set, else a ping) with
 * `token` (NULL: none) straight to server i; returns its envelope status,
 * or the op's status when the envelope is OK. */
static int
raw_request(int i, const char *token, const char *key, const char *val)
{
	Shardkv__Request rq = SHARDKV__REQUEST__INIT;
	Shardkv__Op op = SHARDKV__OP__INIT, *ops[1] = {&op};
	Shardkv__PutOp put = SHARDKV__PUT_OP__INIT;
	kv_rpc_client *cl = NULL;
	nng_msg *req, *rep;
	int rv;

	rq.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	rq.request_id = 7;
	rq.timeout_ms = RAW_MS;
	if (token)
		rq.auth_token = (ProtobufCBinaryData){strlen(token), (uint8_t *)token};
	if (key) {
		put.key = (ProtobufCBinaryData){strlen(key), (uint8_t *)key};
		put.value = (ProtobufCBinaryData){strlen(val), (uint8_t *)val};
		op.op_case = SHARDKV__OP__OP_PUT;
		op.put = &put;
		rq.n_ops = 1;
		rq.ops = ops;
	}
	assert_int_equal(nng_msg_alloc(&req, shardkv__request__get_packed_size(&rq)), 0);
	shardkv__request__pack(&rq, nng_msg_body(req));
	assert_int_equal(kv_rpc_client_create(tc.srv[i].url, &cl), 0);
	assert_int_equal(kv_rpc_call(cl, req, &rep, RAW_MS), 0);
	kv_rpc_client_destroy(cl);
	Shardkv__Response *r = shardkv__response__unpack(NULL, nng_msg_len(rep), nng_msg_body(rep));
	nng_msg_free(rep);
	assert_non_null(r);
	if (r->status != SHARDKV__STATUS__STATUS_OK) {
		rv = kv_err_from_wire(r->status);
		/* A refused peer learns nothing about the cluster. */
		if (rv == KV_EAUTH) {
			assert_int_equal(r->epoch, 0);
			assert_int_equal(r->node_id, 0);
		}
	} else {
		rv = r->n_results == 1 ? kv_err_from_wire(r->results[0]->status) : KV_OK;
	}
	shardkv__response__free_unpacked(r, NULL);
	return rv;
}

/* Sends one transfer message with `token` (NULL: none) to server i and
 * returns the envelope status when refused whole, else the ack's status. */
static int
raw_transfer(int i, const kv_xfer *x, const char *token)
{
	kv_bytes auth = {(const uint8_t *)token, token ? strlen(token) : 0};
	kv_rpc_client *cl = NULL;
	kv_xfer_ack ack;
	nng_msg *req, *rep;
	int rv;

	assert_int_equal(kv_xfer_encode(x, epoch_now(), tc.srv[0].id, auth, &req), 0);
	assert_int_equal(kv_rpc_client_create(tc.srv[i].url, &cl), 0);
	assert_int_equal(kv_rpc_call(cl, req, &rep, RAW_MS), 0);
	kv_rpc_client_destroy(cl);
	rv = kv_xfer_ack_decode(nng_msg_body(rep), nng_msg_len(rep), &ack);
	nng_msg_free(rep);
	return rv != 0 ? rv : ack.status;
}

/* ---------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------- */

/* The library and the CLI with the secret: data and admin commands work. */
static void
the_right_token_serves_data_and_admin_commands(void **state)
{
	shardkv_client *c = client_with(TOKEN);
	shardkv_config *st = NULL;
	shardkv_buf v = {0};
	kv_tc_run_result r;
	char *env[] = {NULL, NULL};
	char envbuf[160];

	(void)state;
	KV_TC_EXPECT(&tc, 0, shardkv_put(c, "ok/lib", 6, "one", 3));
	KV_TC_EXPECT(&tc, 0, shardkv_get(c, "ok/lib", 6, &v));
	assert_int_equal(v.len, 3);
	assert_memory_equal(v.data, "one", 3);
	shardkv_free(v.data);
	KV_TC_EXPECT(&tc, 0, shardkv_status(c, &st));
	assert_int_equal(st->nnodes, 2);
	shardkv_config_free(st);
	shardkv_close(c);

	run_cli(&r, NULL, "--auth-token-file", good_file, "put", "ok/cli", "two", NULL);
	expect_exit(&r, 0, "put with the token");
	run_cli(&r, NULL, "--auth-token-file", good_file, "get", "ok/cli", NULL);
	assert_string_equal(r.out, "two\n");
	expect_exit(&r, 0, "get with the token");
	run_cli(&r, NULL, "--auth-token-file", good_file, "--json", "status", NULL);
	assert_non_null(strstr(r.out, "\"epoch\""));
	expect_exit(&r, 0, "status with the token");
	/* The file may also come from the environment. */
	snprintf(envbuf, sizeof(envbuf), "SHARDKV_AUTH_TOKEN_FILE=%s", good_file);
	env[0] = envbuf;
	run_cli(&r, env, "get", "ok/lib", NULL);
	assert_string_equal(r.out, "one\n");
	expect_exit(&r, 0, "get with the token file from the environment");
}

/* Without the secret or with a wrong one, nothing is served or changed. */
static void
a_missing_or_wrong_token_is_refused_and_changes_nothing(void **state)
{
	const char *tokens[] = {NULL, "not-the-token", TOKEN "x", "s3cret"};
	uint64_t epoch = epoch_now();
	shardkv_buf v = {0};
	kv_tc_run_result r;
	char node[16];

	(void)state;
	kv_tc_node_arg(&tc, 1, node, sizeof(node));
	for (size_t k = 0; k < sizeof(tokens) / sizeof(tokens[0]); k++) {
		shardkv_client *c = client_with(tokens[k]);
		shardkv_config *cfg = NULL;
		KV_TC_EXPECT(&tc, SHARDKV_EAUTH, shardkv_put(c, "no/lib", 6, "x", 1));
		KV_TC_EXPECT(&tc, SHARDKV_EAUTH, shardkv_get(c, "ok/lib", 6, &v));
		KV_TC_EXPECT(&tc, SHARDKV_EAUTH, shardkv_config_get(c, 0, &cfg));
		KV_TC_EXPECT(&tc, SHARDKV_EAUTH, shardkv_status(c, &cfg));
		KV_TC_EXPECT(&tc, SHARDKV_EAUTH,
		             shardkv_move(c, "a", 1, "b", 1, node, 0, SHARDKV_WAIT, NULL));
		KV_TC_EXPECT(&tc, SHARDKV_EAUTH, shardkv_rebalance(c, 0, 0, NULL));
		KV_TC_EXPECT(&tc, SHARDKV_EAUTH,
		             shardkv_join(c, "tcp://127.0.0.1:9", SHARDKV_NO_REBALANCE, NULL));
		shardkv_close(c);
	}

	/* The CLI: no token, a wrong one; data and admin commands exit 4. */
	run_cli(&r, NULL, "put", "no/cli", "x", NULL);
	expect_exit(&r, 4, "put without a token");
	run_cli(&r, NULL, "get", "ok/cli", NULL);
	expect_exit(&r, 4, "get without a token");
	run_cli(&r, NULL, "status", NULL);
	expect_exit(&r, 4, "status without a token");
	run_cli(&r, NULL, "--auth-token-file", bad_file, "put", "no/cli", "x", NULL);
	expect_exit(&r, 4, "put with a wrong token");
	run_cli(&r, NULL, "--auth-token-file", bad_file, "move", "a", "b", node, "--wait", NULL);
	expect_exit(&r, 4, "move with a wrong token");
	run_cli(&r, NULL, "--auth-token-file", bad_file, "rebalance", NULL);
	expect_exit(&r, 4, "rebalance with a wrong token");
	run_cli(&r, NULL, "--auth-token-file", bad_file, "config", NULL);
	expect_exit(&r, 4, "config with a wrong token");
	/* A token file that cannot be used is a usage error, before any call. */
	run_cli(&r, NULL, "--auth-token-file", empty_file, "get", "ok/cli", NULL);
	assert_non_null(strstr(r.err, "is empty"));
	expect_exit(&r, 2, "an empty token file");

	/* Nothing changed. */
	assert_int_equal(epoch_now(), epoch);
	shardkv_client *c = client_with(TOKEN);
	KV_TC_EXPECT(&tc, SHARDKV_ENOTFOUND, shardkv_get(c, "no/lib", 6, &v));
	KV_TC_EXPECT(&tc, SHARDKV_ENOTFOUND, shardkv_get(c, "no/cli", 6, &v));
	shardkv_config *cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	assert_int_equal(cfg->nnodes, 2);
	assert_int_equal(cfg->nmigrations, 0);
	shardkv_config_free(cfg);
	shardkv_close(c);

	/* The controller said so, with the peer. */
	KV_TC_ASSERT(&tc,
	             kv_tc_count_lines(tc.ctl_log, "request refused: authentication failed") > 0,
	             "no refusal in the controller's log");
	KV_TC_ASSERT(&tc, kv_tc_count_lines(tc.ctl_log, "peer=127.0.0.1:") > 0,
	             "the controller's refusals do not name the peer");
	KV_TC_ASSERT(&tc, kv_tc_count_lines(tc.ctl_log, "token=wrong") > 0,
	             "no refusal of a wrong token in the controller's log");
}

/* A server checks the secret itself: ops and pings sent straight to it. */
static void
a_server_refuses_requests_without_the_token(void **state)
{
	shardkv_client *c = client_with(TOKEN);
	shardkv_config *cfg = kv_tc_config(&tc);
	shardkv_buf v = {0};
	int i;

	(void)state;
	/* The server that owns the key, so that only the token can refuse it. */
	assert_non_null(cfg);
	uint32_t owner = kv_tc_owner(cfg, "raw/k", 5);
	shardkv_config_free(cfg);
	i = tc.srv[0].id == owner ? 0 : 1;
	assert_int_equal(tc.srv[i].id, owner);

	assert_int_equal(raw_request(i, NULL, "raw/k", "x"), KV_EAUTH);
	assert_int_equal(raw_request(i, "wrong", "raw/k", "x"), KV_EAUTH);
	assert_int_equal(raw_request(i, NULL, NULL, NULL), KV_EAUTH);
	KV_TC_EXPECT(&tc, SHARDKV_ENOTFOUND, shardkv_get(c, "raw/k", 5, &v));
	/* The same request with the token is served. */
	assert_int_equal(raw_request(i, TOKEN, "raw/k", "y"), KV_OK);
	assert_int_equal(raw_request(i, TOKEN, NULL, NULL), KV_OK);
	KV_TC_EXPECT(&tc, 0, shardkv_get(c, "raw/k", 5, &v));
	assert_int_equal(v.len, 1);
	assert_memory_equal(v.data, "y", 1);
	shardkv_free(v.data);
	shardkv_close(c);
	KV_TC_ASSERT(
	    &tc, kv_tc_wait_log_line(tc.srv[i].log, "request refused: authentication failed", 5000),
	    "no refusal in the server's log");
}

/* A transfer message without the secret is refused and opens no stream. */
static void
a_transfer_without_the_token_is_refused(void **state)
{
	const uint64_t mig = 0x7e57a07000000001ull; /* never used by the controller */
	kv_xfer begin = {.migration_id = mig,
	                 .seq = 1,
	                 .kind = KV_XFER_BEGIN,
	                 .epoch = epoch_now(),
	                 .start = {(const uint8_t *)"zz/", 3},
	                 .end = {(const uint8_t *)"zz0", 3},
	                 .from_node = tc.srv[0].id,
	                 .to_node = tc.srv[1].id};
	kv_xfer fence = {.migration_id = mig, .seq = 2, .kind = KV_XFER_FENCE};

	(void)state;
	assert_int_equal(raw_transfer(1, &begin, NULL), KV_EAUTH);
	assert_int_equal(raw_transfer(1, &begin, "not-the-token"), KV_EAUTH);
	/* No stream was opened: the next message of it is unknown there. */
	assert_int_equal(raw_transfer(1, &fence, TOKEN), KV_EINVAL);
	KV_TC_ASSERT(&tc, kv_tc_wait_log_line(tc.srv[1].log, "cmd=transfer", 5000),
	             "no transfer refusal in the destination's log");
}

/* Two servers with the secret move a range between them. */
static void
a_move_between_servers_with_the_token_completes(void **state)
{
	shardkv_client *c = client_with(TOKEN);
	kv_tc_run_result r;
	char msg[256], node[16];
	shardkv_config *cfg;

	(void)state;
	KV_TC_EXPECT(&tc, 0, kv_tc_fill(c, "mv/", MOVE_KEYS, 1, 100, msg, sizeof(msg)));
	cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	uint32_t from = kv_tc_owner(cfg, "mv/000000", 9);
	shardkv_config_free(cfg);
	int to = tc.srv[0].id == from ? 1 : 0;
	kv_tc_node_arg(&tc, to, node, sizeof(node));

	run_cli(&r, NULL, "--auth-token-file", good_file, "move", "mv/", "mv0", node, "--wait",
	        NULL);
	if (r.code != 0)
		kv_tc_dump_logs(&tc, 40);
	expect_exit(&r, 0, "move --wait with the token");
	cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	assert_int_equal(kv_tc_owner(cfg, "mv/000000", 9), tc.srv[to].id);
	assert_int_equal(cfg->nmigrations, 0);
	shardkv_config_free(cfg);
	long bad = kv_tc_verify(c, "mv/", MOVE_KEYS, 1, 100, msg, sizeof(msg));
	KV_TC_ASSERT(&tc, bad == 0, "after the move: %ld bad keys (%s)", bad, msg);
	shardkv_close(c);
}

/* A server without the secret cannot register; with it, it joins. */
static void
a_server_without_the_token_cannot_join(void **state)
{
	/* With replicas an earlier test's move may still have its old primary
	 * copied and added back to the ISR (configurations of their own):
	 * wait for that before taking the epoch that must not change. */
	KV_TC_ASSERT(&tc, kv_tc_wait_in_sync(&tc, KV_TC_READY_MS) == 0, "ranges not in sync");
	uint64_t epoch = epoch_now();
	int saved = tc.nargs, i;
	shardkv_config *cfg;

	(void)state;
	tc.nargs = 0; /* this one starts without --auth-token-file */
	i = kv_tc_add_server(&tc, true);
	tc.nargs = saved;
	assert_true(i >= 0);
	KV_TC_ASSERT(&tc,
	             kv_tc_wait_log_line(tc.srv[i].log,
	                                 "controller refused registration: authentication failed",
	                                 KV_TC_READY_MS),
	             "the server did not log its refusal");
	KV_TC_ASSERT(&tc, kv_tc_wait_log_line(tc.ctl_log, "cmd=register", KV_TC_READY_MS),
	             "the controller did not log the refused registration");
	cfg = kv_tc_config(&tc);
	assert_non_null(cfg);
	for (size_t k = 0; k < cfg->nnodes; k++)
		assert_string_not_equal(cfg->nodes[k].address, tc.srv[i].url);
	assert_int_equal(cfg->epoch, epoch);
	shardkv_config_free(cfg);

	/* Restarted with the secret, the same server joins. */
	const char *args[] = {"--auth-token-file", good_file, NULL};
	assert_int_equal(kv_tc_stop_server(&tc, i, SIGKILL, KV_TC_STOP_MS, NULL), 0);
	assert_int_equal(kv_tc_set_server_args(&tc, i, args), 0);
	assert_int_equal(kv_tc_restart_server(&tc, i, true), 0);
	KV_TC_ASSERT(&tc, kv_tc_wait_node_state(&tc, i, SHARDKV_NODE_ACTIVE, KV_TC_READY_MS) == 0,
	             "the server did not join with the token");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(the_right_token_serves_data_and_admin_commands),
	    cmocka_unit_test(a_missing_or_wrong_token_is_refused_and_changes_nothing),
	    cmocka_unit_test(a_server_refuses_requests_without_the_token),
	    cmocka_unit_test(a_transfer_without_the_token_is_refused),
	    cmocka_unit_test(a_move_between_servers_with_the_token_completes),
	    cmocka_unit_test(a_server_without_the_token_cannot_join),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
