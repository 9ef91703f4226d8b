/*
 * test_rpc.c - request/reply plumbing: echo, deferred answers, timeouts,
 * address in use; an async call whose send the caller waits for gets its
 * reply through its callback, and a send that finds no connection fails
 * before the call returns.
 */
#include "common/err.h"
#include "common/rpc.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

struct defer_state {
	pthread_mutex_t mu;
	kv_rpc_pending *kept; /* the deferred request, protected by mu */
};

static int
echo_handler(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p)
{
	struct defer_state *d = arg;
	nng_msg *m;

	if (nng_msg_len(req) == 5 && memcmp(nng_msg_body(req), "defer", 5) == 0) {
		pthread_mutex_lock(&d->mu);
		d->kept = p;
		pthread_mutex_unlock(&d->mu);
		return KV_RPC_DEFERRED;
	}
	if (nng_msg_len(req) == 4 && memcmp(nng_msg_body(req), "drop", 4) == 0)
		return KV_EINVAL;
	if (nng_msg_alloc(&m, 0) != 0)
		return KV_ENOMEM;
	nng_msg_append(m, nng_msg_body(req), nng_msg_len(req));
	*reply = m;
	return 0;
}

static nng_msg *
msg_of(const char *s)
{
	nng_msg *m;
	assert_int_equal(nng_msg_alloc(&m, 0), 0);
	nng_msg_append(m, s, strlen(s));
	return m;
}

static void
call_returns_the_reply_of_the_handler(void **state)
{
	struct defer_state d = {.mu = PTHREAD_MUTEX_INITIALIZER};
	char url[64];
	kv_rpc_server *srv;
	kv_rpc_client *cli;
	nng_msg *reply;
	(void)state;

	kv_test_free_url(url, sizeof(url));
	kv_rpc_server_opts o = {.url = url, .handler = echo_handler, .arg = &d};
	assert_int_equal(kv_rpc_server_create(&o, &srv), KV_OK);
	assert_int_equal(kv_rpc_client_create(url, &cli), KV_OK);
	for (int i = 0; i < 100; i++) {
		char buf[32];
		snprintf(buf, sizeof(buf), "hello %d", i);
		assert_int_equal(kv_rpc_call(cli, msg_of(buf), &reply, 5000), KV_OK);
		assert_int_equal(nng_msg_len(reply), strlen(buf));
		assert_memory_equal(nng_msg_body(reply), buf, strlen(buf));
		nng_msg_free(reply);
	}
	kv_rpc_client_destroy(cli);
	kv_rpc_server_destroy(srv);
}

struct caller {
	kv_rpc_client *cli;
	int rv;
	nng_msg *reply;
};

static void *
call_defer(void *arg)
{
	struct caller *c = arg;
	c->rv = kv_rpc_call(c->cli, msg_of("defer"), &c->reply, 5000);
	return NULL;
}

static void
deferred_request_is_answered_by_kv_rpc_reply(void **state)
{
	struct defer_state d = {.mu = PTHREAD_MUTEX_INITIALIZER};
	char url[64];
	kv_rpc_server *srv;
	struct caller c = {0};
	pthread_t t;
	kv_rpc_pending *p = NULL;
	(void)state;

	kv_test_free_url(url, sizeof(url));
	kv_rpc_server_opts o = {.url = url, .handler = echo_handler, .arg = &d};
	assert_int_equal(kv_rpc_server_create(&o, &srv), KV_OK);
	assert_int_equal(kv_rpc_client_create(url, &c.cli), KV_OK);
	assert_int_equal(pthread_create(&t, NULL, call_defer, &c), 0);
	for (uint64_t deadline = kv_test_now_ms() + 5000; p == NULL;) {
		pthread_mutex_lock(&d.mu);
		p = d.kept;
		pthread_mutex_unlock(&d.mu);
		assert_true(kv_test_now_ms() < deadline);
		kv_test_sleep_ms(1);
	}
	kv_rpc_reply(p, msg_of("later"));
	pthread_join(t, NULL);
	assert_int_equal(c.rv, KV_OK);
	assert_int_equal(nng_msg_len(c.reply), 5);
	assert_memory_equal(nng_msg_body(c.reply), "later", 5);
	nng_msg_free(c.reply);
	kv_rpc_client_destroy(c.cli);
	kv_rpc_server_destroy(srv);
}

static void
dropped_request_times_out_at_the_client(void **state)
{
	struct defer_state d = {.mu = PTHREAD_MUTEX_INITIALIZER};
	char url[64];
	kv_rpc_server *srv;
	kv_rpc_client *cli;
	nng_msg *reply = NULL;
	(void)state;

	kv_test_free_url(url, sizeof(url));
	kv_rpc_server_opts o = {.url = url, .handler = echo_handler, .arg = &d};
	assert_int_equal(kv_rpc_server_create(&o, &srv), KV_OK);
	assert_int_equal(kv_rpc_client_create(url, &cli), KV_OK);
	assert_int_equal(kv_rpc_call(cli, msg_of("drop"), &reply, 200), KV_ETIMEDOUT);
	assert_null(reply);
	kv_rpc_client_destroy(cli);
	kv_rpc_server_destroy(srv);
}

static void
call_without_server_is_unavailable(void **state)
{
	char url[64];
	kv_rpc_client *cli;
	nng_msg *reply = NULL;
	(void)state;

	kv_test_free_url(url, sizeof(url));
	assert_int_equal(kv_rpc_client_create(url, &cli), KV_OK);
	assert_int_equal(kv_rpc_call(cli, msg_of("x"), &reply, 200), KV_EUNAVAIL);
	kv_rpc_client_destroy(cli);
}

static void
second_listener_on_same_address_gets_eaddrinuse(void **state)
{
	struct defer_state d = {.mu = PTHREAD_MUTEX_INITIALIZER};
	char url[64];
	kv_rpc_server *a, *b = NULL;
	(void)state;

	kv_test_free_url(url, sizeof(url));
	kv_rpc_server_opts o = {.url = url, .handler = echo_handler, .arg = &d};
	assert_int_equal(kv_rpc_server_create(&o, &a), KV_OK);
	assert_int_equal(kv_rpc_server_create(&o, &b), KV_EADDRINUSE);
	assert_null(b);
	kv_rpc_server_destroy(a);
}

/* What an async caller's callback saw. */
struct async_seen {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int calls;      /* callbacks */
	int rv;         /* the last one's result */
	nng_msg *reply; /* and reply */
};

static void
async_seen_done(void *arg, int rv, nng_msg *reply)
{
	struct async_seen *s = arg;
	pthread_mutex_lock(&s->mu);
	s->calls++;
	s->rv = rv;
	s->reply = reply;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
}

static void
async_call_with_a_waited_send_gets_its_reply_or_fails_at_once(void **state)
{
	struct defer_state d = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct async_seen s = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
	char url[64], dead[64];
	kv_rpc_server *srv;
	kv_rpc_client *cli, *nowhere;
	kv_rpc_async *a, *b;
	(void)state;

	kv_test_free_url(url, sizeof(url));
	kv_rpc_server_opts o = {.url = url, .handler = echo_handler, .arg = &d};
	assert_int_equal(kv_rpc_server_create(&o, &srv), KV_OK);
	assert_int_equal(kv_rpc_client_create(url, &cli), KV_OK);
	assert_int_equal(kv_rpc_async_create(cli, async_seen_done, &s, &a), KV_OK);
	for (int i = 0; i < 20; i++) {
		char buf[32];
		snprintf(buf, sizeof(buf), "waited %d", i);
		kv_rpc_async_call_wait_send(a, msg_of(buf), 5000);
		pthread_mutex_lock(&s.mu);
		while (s.calls == i)
			pthread_cond_wait(&s.cv, &s.mu); /* the test's timeout bounds it */
		assert_int_equal(s.calls, i + 1);
		assert_int_equal(s.rv, KV_OK);
		assert_non_null(s.reply);
		assert_int_equal(nng_msg_len(s.reply), strlen(buf));
		assert_memory_equal(nng_msg_body(s.reply), buf, strlen(buf));
		nng_msg_free(s.reply);
		s.reply = NULL;
		pthread_mutex_unlock(&s.mu);
	}
	kv_rpc_async_destroy(a);

	/* Nothing listens: the send waits connect_wait, then done runs on this
	 * thread before the call returns. */
	kv_test_free_url(dead, sizeof(dead));
	assert_int_equal(kv_rpc_client_create(dead, &nowhere), KV_OK);
	kv_rpc_client_connect_wait(nowhere, 50);
	s.calls = 0;
	assert_int_equal(kv_rpc_async_create(nowhere, async_seen_done, &s, &b), KV_OK);
	kv_rpc_async_call_wait_send(b, msg_of("lost"), 5000);
	pthread_mutex_lock(&s.mu);
	assert_int_equal(s.calls, 1);
	assert_int_equal(s.rv, KV_EUNAVAIL);
	assert_null(s.reply);
	pthread_mutex_unlock(&s.mu);
	kv_rpc_async_destroy(b);
	kv_rpc_client_destroy(nowhere);
	kv_rpc_client_destroy(cli);
	kv_rpc_server_destroy(srv);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(call_returns_the_reply_of_the_handler),
	    cmocka_unit_test(deferred_request_is_answered_by_kv_rpc_reply),
	    cmocka_unit_test(dropped_request_times_out_at_the_client),
	    cmocka_unit_test(call_without_server_is_unavailable),
	    cmocka_unit_test(second_listener_on_same_address_gets_eaddrinuse),
	    cmocka_unit_test(async_call_with_a_waited_send_gets_its_reply_or_fails_at_once),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
