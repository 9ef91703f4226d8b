/*
 * test_rpc.c - request/reply plumbing: echo, deferred answers, timeouts,
 * address in use; an async call whose send the caller waits for gets its
 * reply through its callback, and a send that finds no connection fails
 * before the call returns. Each of these runs against both servers: nng's
 * threads and the event loops (kv_rpc_server_opts.loops). Then the event
 * loops alone: many calls in flight past the per-connection bound, answered
 * out of order from other threads; a handler that asks to wait runs again
 * where it may; the wire itself, spoken over a plain socket (the request id
 * echoed; a peer of another protocol, an oversized or truncated message
 * disconnected); the connection bound; a peer that sends and never reads
 * is not read either. Links: every answer reaches its id whatever the
 * order and size, from either server; a peer that is absent, speaks
 * another protocol, stays silent past the deadline or closes fails the
 * open; an oversized answer and the server's end fail the link.
 */
#include "common/bytes.h"
#include "common/err.h"
#include "common/rpc.h"
#include "tests/support/testutil.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

/* The server kind of the group running: 0 nng's threads, else loops. */
static unsigned g_loops;

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
	kv_rpc_server_opts o = {.url = url, .handler = echo_handler, .arg = &d, .loops = g_loops};
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
	kv_rpc_server_opts o = {.url = url, .handler = echo_handler, .arg = &d, .loops = g_loops};
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
	kv_rpc_server_opts o = {.url = url, .handler = echo_handler, .arg = &d, .loops = g_loops};
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
a_client_of_a_malformed_address_is_refused_at_create(void **state)
{
	kv_rpc_client *cli = NULL;
	(void)state;

	/* A tcp:// client dials only when first used; its address is checked
	 * at once all the same. */
	assert_int_equal(kv_rpc_client_create("tcp://127.0.0.1", &cli), KV_EINVAL);
	assert_int_equal(kv_rpc_client_create("tcp://*:5", &cli), KV_EINVAL);
	assert_int_equal(kv_rpc_client_create("nope://127.0.0.1:5", &cli), KV_EINVAL);
	assert_null(cli);
}

static void
second_listener_on_same_address_gets_eaddrinuse(void **state)
{
	struct defer_state d = {.mu = PTHREAD_MUTEX_INITIALIZER};
	char url[64];
	kv_rpc_server *a, *b = NULL;
	(void)state;

	kv_test_free_url(url, sizeof(url));
	kv_rpc_server_opts o = {.url = url, .handler = echo_handler, .arg = &d, .loops = g_loops};
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
async_call_with_a_waited_send_gets_its_reply_or_fails_after_the_connect_wait(void **state)
{
	struct defer_state d = {.mu = PTHREAD_MUTEX_INITIALIZER};
	struct async_seen s = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
	char url[64], dead[64];
	kv_rpc_server *srv;
	kv_rpc_client *cli, *nowhere;
	kv_rpc_async *a, *b;
	(void)state;

	kv_test_free_url(url, sizeof(url));
	kv_rpc_server_opts o = {.url = url, .handler = echo_handler, .arg = &d, .loops = g_loops};
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

	/* Nothing listens: the call waits connect_wait for a connection, then
	 * fails unavailable, long before its timeout (with nng's socket done
	 * runs on this thread before the call returns; on a link, on the
	 * link's thread). */
	kv_test_free_url(dead, sizeof(dead));
	assert_int_equal(kv_rpc_client_create(dead, &nowhere), KV_OK);
	kv_rpc_client_connect_wait(nowhere, 50);
	s.calls = 0;
	assert_int_equal(kv_rpc_async_create(nowhere, async_seen_done, &s, &b), KV_OK);
	uint64_t t0 = kv_test_now_ms();
	kv_rpc_async_call_wait_send(b, msg_of("lost"), 5000);
	pthread_mutex_lock(&s.mu);
	while (s.calls == 0)
		pthread_cond_wait(&s.cv, &s.mu); /* the test's timeout bounds it */
	assert_true(kv_test_now_ms() - t0 < 4000);
	assert_int_equal(s.calls, 1);
	assert_int_equal(s.rv, KV_EUNAVAIL);
	assert_null(s.reply);
	pthread_mutex_unlock(&s.mu);
	kv_rpc_async_destroy(b);
	kv_rpc_client_destroy(nowhere);
	kv_rpc_client_destroy(cli);
	kv_rpc_server_destroy(srv);
}

/* Waits (5 s at most) until s has seen `calls` callbacks; returns the
 * milliseconds it took. */
static uint64_t
async_wait_calls(struct async_seen *s, int calls)
{
	uint64_t t0 = kv_test_now_ms();
	pthread_mutex_lock(&s->mu);
	while (s->calls < calls) {
		pthread_mutex_unlock(&s->mu);
		assert_true(kv_test_now_ms() - t0 < 5000);
		kv_test_sleep_ms(1);
		pthread_mutex_lock(&s->mu);
	}
	pthread_mutex_unlock(&s->mu);
	return kv_test_now_ms() - t0;
}

/* Takes the request the echo handler kept ("defer"), 5 s at most. */
static kv_rpc_pending *
take_kept(struct defer_state *d)
{
	for (uint64_t end = kv_test_now_ms() + 5000;;) {
		pthread_mutex_lock(&d->mu);
		kv_rpc_pending *p = d->kept;
		d->kept = NULL;
		pthread_mutex_unlock(&d->mu);
		if (p != NULL)
			return p;
		assert_true(kv_test_now_ms() < end);
		kv_test_sleep_ms(1);
	}
}

/* An echo server of the group's kind, a client of it and one async caller
 * whose callbacks s records. */
struct echo_rig {
	struct defer_state d;
	struct async_seen s;
	kv_rpc_server_opts o;
	char url[64];
	kv_rpc_server *srv;
	kv_rpc_client *cli;
	kv_rpc_async *a;
};

static void
echo_rig_up(struct echo_rig *r)
{
	*r = (struct echo_rig){
	    .d = {.mu = PTHREAD_MUTEX_INITIALIZER},
	    .s = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER}};
	kv_test_free_url(r->url, sizeof(r->url));
	r->o = (kv_rpc_server_opts){
	    .url = r->url, .handler = echo_handler, .arg = &r->d, .loops = g_loops};
	assert_int_equal(kv_rpc_server_create(&r->o, &r->srv), KV_OK);
	assert_int_equal(kv_rpc_client_create(r->url, &r->cli), KV_OK);
	assert_int_equal(kv_rpc_async_create(r->cli, async_seen_done, &r->s, &r->a), KV_OK);
}

static void
echo_rig_down(struct echo_rig *r)
{
	kv_rpc_async_destroy(r->a);
	kv_rpc_client_destroy(r->cli);
	kv_rpc_server_destroy(r->srv);
}

/* The last callback of r's caller brought an answer of text. */
static void
echo_rig_got(struct echo_rig *r, const char *text)
{
	assert_int_equal(r->s.rv, KV_OK);
	assert_int_equal(nng_msg_len(r->s.reply), strlen(text));
	assert_memory_equal(nng_msg_body(r->s.reply), text, strlen(text));
	nng_msg_free(r->s.reply);
	r->s.reply = NULL;
}

static void
an_async_call_past_its_timeout_fails_and_its_late_answer_goes_to_nobody(void **state)
{
	static struct echo_rig r;
	(void)state;

	echo_rig_up(&r);
	kv_rpc_async_call(r.a, msg_of("defer"), 200);
	kv_rpc_pending *p = take_kept(&r.d);
	uint64_t ms = async_wait_calls(&r.s, 1);
	assert_true(ms < 2000);
	assert_int_equal(r.s.rv, KV_ETIMEDOUT);
	assert_null(r.s.reply);
	/* The answer comes after all: the next call gets its own. */
	kv_rpc_reply(p, msg_of("late"));
	kv_rpc_async_call(r.a, msg_of("fresh"), 5000);
	async_wait_calls(&r.s, 2);
	echo_rig_got(&r, "fresh");
	echo_rig_down(&r);
}

static void
a_lost_connection_fails_its_calls_at_once_and_the_next_call_connects_again(void **state)
{
	static struct echo_rig r;
	(void)state;

	echo_rig_up(&r);
	kv_rpc_async_call(r.a, msg_of("defer"), 10000);
	kv_rpc_pending *p = take_kept(&r.d);
	assert_true(kv_rpc_client_connected(r.cli));
	/* The server drops the request and goes: with a link the call fails
	 * unavailable when the connection does, not at its timeout (nng's
	 * socket keeps it until then). */
	kv_rpc_reply(p, NULL);
	kv_rpc_server_destroy(r.srv);
	uint64_t ms = async_wait_calls(&r.s, 1);
	if (kv_link_url_ok(r.url)) {
		assert_true(ms < 5000);
		assert_int_equal(r.s.rv, KV_EUNAVAIL);
	}
	/* A server again on the address: a call finds it. */
	assert_int_equal(kv_rpc_server_create(&r.o, &r.srv), KV_OK);
	int calls = r.s.calls;
	for (uint64_t end = kv_test_now_ms() + 5000;; kv_test_sleep_ms(10)) {
		kv_rpc_async_call(r.a, msg_of("again"), 1000);
		async_wait_calls(&r.s, ++calls);
		if (r.s.rv == KV_OK)
			break;
		assert_true(kv_test_now_ms() < end);
	}
	echo_rig_got(&r, "again");
	echo_rig_down(&r);
}

static void
destroying_an_async_caller_ends_its_call(void **state)
{
	static struct echo_rig r;
	kv_rpc_async *b;
	(void)state;

	echo_rig_up(&r);
	assert_int_equal(kv_rpc_async_create(r.cli, async_seen_done, &r.s, &b), KV_OK);
	kv_rpc_async_call(b, msg_of("defer"), 10000);
	kv_rpc_pending *p = take_kept(&r.d);
	/* Its callback has run when the destroy returns. */
	kv_rpc_async_destroy(b);
	pthread_mutex_lock(&r.s.mu);
	assert_int_equal(r.s.calls, 1);
	assert_int_equal(r.s.rv, KV_ECLOSED);
	pthread_mutex_unlock(&r.s.mu);
	/* Another caller of the client is unharmed, and the answer of the
	 * destroyed one goes to nobody. */
	kv_rpc_reply(p, msg_of("gone"));
	kv_rpc_async_call(r.a, msg_of("other"), 5000);
	async_wait_calls(&r.s, 2);
	echo_rig_got(&r, "other");
	echo_rig_down(&r);
}

/* ------------------------------------------------------------------------
 * The event loops alone
 * ------------------------------------------------------------------------ */

/* Answers "later:N" requests from a thread of its own, in the reverse of
 * their arrival, and echoes the rest at once. */
struct later_state {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	kv_rpc_pending *p[512];
	nng_msg *m[512];
	int n;
	bool stop;
	atomic_int blocking_seen; /* handler calls that could block */
};

static int
later_handler(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p)
{
	struct later_state *st = arg;
	nng_msg *m;

	if (nng_msg_len(req) >= 5 && memcmp(nng_msg_body(req), "block", 5) == 0) {
		if (!kv_rpc_can_block(p))
			return KV_RPC_BLOCKING;
		atomic_fetch_add(&st->blocking_seen, 1);
	}
	if (nng_msg_alloc(&m, 0) != 0)
		return KV_ENOMEM;
	nng_msg_append(m, nng_msg_body(req), nng_msg_len(req));
	if (nng_msg_len(req) >= 6 && memcmp(nng_msg_body(req), "later:", 6) == 0) {
		pthread_mutex_lock(&st->mu);
		assert_true(st->n < 512);
		st->p[st->n] = p;
		st->m[st->n++] = m;
		pthread_cond_broadcast(&st->cv);
		pthread_mutex_unlock(&st->mu);
		return KV_RPC_DEFERRED;
	}
	*reply = m;
	return 0;
}

static void *
later_answerer(void *arg)
{
	struct later_state *st = arg;

	pthread_mutex_lock(&st->mu);
	while (!st->stop) {
		if (st->n == 0) {
			pthread_cond_wait(&st->cv, &st->mu);
			continue;
		}
		/* Let a few gather, then answer newest first. */
		pthread_mutex_unlock(&st->mu);
		kv_test_sleep_ms(1);
		pthread_mutex_lock(&st->mu);
		while (st->n > 0) {
			st->n--;
			kv_rpc_reply(st->p[st->n], st->m[st->n]);
		}
	}
	pthread_mutex_unlock(&st->mu);
	return NULL;
}

/* Stops later_answerer (thread ans) of st. */
static void
later_stop(struct later_state *st, pthread_t ans)
{
	pthread_mutex_lock(&st->mu);
	st->stop = true;
	pthread_cond_broadcast(&st->cv);
	pthread_mutex_unlock(&st->mu);
	pthread_join(ans, NULL);
}

struct flight {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done, ok;
	char want[200][32];
	kv_rpc_async *a[200];
};

struct flight_slot {
	struct flight *f;
	int i;
};

static void
flight_done(void *arg, int rv, nng_msg *reply)
{
	struct flight_slot *fs = arg;
	struct flight *f = fs->f;
	bool good = rv == 0 && reply != NULL && nng_msg_len(reply) == strlen(f->want[fs->i]) &&
	            memcmp(nng_msg_body(reply), f->want[fs->i], nng_msg_len(reply)) == 0;
	if (reply)
		nng_msg_free(reply);
	pthread_mutex_lock(&f->mu);
	f->done++;
	f->ok += good;
	pthread_cond_broadcast(&f->cv);
	pthread_mutex_unlock(&f->mu);
}

static void
calls_in_flight_past_the_bound_are_all_answered_out_of_order(void **state)
{
	struct later_state st = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
	static struct flight f = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
	static struct flight_slot fs[200];
	char url[64];
	kv_rpc_server *srv;
	kv_rpc_client *cli;
	pthread_t ans;
	(void)state;

	kv_test_free_url(url, sizeof(url));
	/* 8 waiting answers per connection at most: 200 in flight makes the
	 * loop stop reading and go on as answers leave. */
	kv_rpc_server_opts o = {
	    .url = url, .handler = later_handler, .arg = &st, .loops = 2, .contexts = 8};
	assert_int_equal(kv_rpc_server_create(&o, &srv), KV_OK);
	assert_int_equal(pthread_create(&ans, NULL, later_answerer, &st), 0);
	assert_int_equal(kv_rpc_client_create(url, &cli), KV_OK);
	for (int round = 0; round < 3; round++) {
		f.done = f.ok = 0;
		for (int i = 0; i < 200; i++) {
			fs[i] = (struct flight_slot){.f = &f, .i = i};
			if (round == 0)
				assert_int_equal(
				    kv_rpc_async_create(cli, flight_done, &fs[i], &f.a[i]), KV_OK);
			snprintf(f.want[i], sizeof(f.want[i]), "%s:%d:%d",
			         i % 3 == 0   ? "later"
			         : i % 3 == 1 ? "now"
			                      : "block",
			         round, i);
			kv_rpc_async_call(f.a[i], msg_of(f.want[i]), 10000);
		}
		pthread_mutex_lock(&f.mu);
		while (f.done < 200)
			pthread_cond_wait(&f.cv, &f.mu); /* the test's timeout bounds it */
		assert_int_equal(f.ok, 200);
		pthread_mutex_unlock(&f.mu);
	}
	/* Every "block" request ran again where it could wait. */
	assert_int_equal(atomic_load(&st.blocking_seen), 3 * 66);
	for (int i = 0; i < 200; i++)
		kv_rpc_async_destroy(f.a[i]);
	kv_rpc_client_destroy(cli);
	kv_rpc_server_destroy(srv);
	later_stop(&st, ans);
}

/* A plain TCP connection to the server of url. */
static int
raw_connect(const char *url)
{
	const char *colon = strrchr(url, ':');
	struct sockaddr_in a = {.sin_family = AF_INET,
	                        .sin_port = htons((uint16_t)atoi(colon + 1))};
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	assert_true(fd >= 0);
	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

static void
raw_send(int fd, const void *b, size_t n)
{
	assert_int_equal(send(fd, b, n, MSG_NOSIGNAL), (ssize_t)n);
}

/* Reads exactly n bytes within 5 s; false on end of stream. */
static bool
raw_recv(int fd, uint8_t *b, size_t n)
{
	size_t got = 0;
	while (got < n) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		assert_int_equal(poll(&pf, 1, 5000), 1);
		ssize_t r = recv(fd, b + got, n - got, 0);
		if (r <= 0)
			return false;
		got += (size_t)r;
	}
	return true;
}

static const uint8_t hello_req[8] = {0, 'S', 'P', 0, 0, 0x30, 0, 0};

static void
the_wire_is_nngs_and_bad_peers_are_disconnected(void **state)
{
	struct later_state st = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
	char url[64];
	kv_rpc_server *srv;
	uint8_t b[64];
	int fd;
	(void)state;

	kv_test_free_url(url, sizeof(url));
	kv_rpc_server_opts o = {
	    .url = url, .handler = later_handler, .arg = &st, .loops = 1, .max_msg = 1000};
	assert_int_equal(kv_rpc_server_create(&o, &srv), KV_OK);

	/* A REQ peer: the greeting names REP; two requests in one write (two
	 * hops of backtrace in the second) come back with their words. */
	fd = raw_connect(url);
	uint8_t out[64], *w = out;
	memcpy(w, hello_req, 8);
	w += 8;
	kv_put64be(w, 4 + 2);
	memcpy(w + 8, "\x80\x00\x00\x07hi", 6);
	w += 14;
	kv_put64be(w, 8 + 3);
	memcpy(w + 8, "\x00\x00\x00\x01\x80\x00\x00\x09yes", 11);
	w += 19;
	raw_send(fd, out, (size_t)(w - out));
	assert_true(raw_recv(fd, b, 8));
	assert_memory_equal(b, "\0SP\0\0\x31\0\0", 8);
	assert_true(raw_recv(fd, b, 8 + 6));
	assert_memory_equal(b, "\0\0\0\0\0\0\0\x06\x80\0\0\x07hi", 14);
	assert_true(raw_recv(fd, b, 8 + 11));
	assert_memory_equal(b, "\0\0\0\0\0\0\0\x0b\0\0\0\x01\x80\0\0\x09yes", 19);
	/* Over max_msg: disconnected. */
	kv_put64be(out, 5000);
	raw_send(fd, out, 8);
	assert_false(raw_recv(fd, b, 1));
	close(fd);

	/* A peer of another protocol (PUB, 0x20): disconnected. */
	fd = raw_connect(url);
	raw_send(fd, "\0SP\0\0\x20\0\0", 8);
	assert_true(raw_recv(fd, b, 8));
	assert_false(raw_recv(fd, b, 1));
	close(fd);

	/* A message too short for its backtrace: disconnected. */
	fd = raw_connect(url);
	memcpy(out, hello_req, 8);
	kv_put64be(out + 8, 3);
	memcpy(out + 16, "\0\0\0", 3);
	raw_send(fd, out, 19);
	assert_true(raw_recv(fd, b, 8));
	assert_false(raw_recv(fd, b, 1));
	close(fd);

	/* A peer that goes away with answers still to come: the deferred
	 * answer given later is dropped, nothing else happens. */
	fd = raw_connect(url);
	memcpy(out, hello_req, 8);
	kv_put64be(out + 8, 4 + 7);
	memcpy(out + 16, "\x80\0\0\x01later:x", 11);
	raw_send(fd, out, 27);
	for (uint64_t end = kv_test_now_ms() + 5000;;) {
		pthread_mutex_lock(&st.mu);
		int n = st.n;
		pthread_mutex_unlock(&st.mu);
		if (n == 1)
			break;
		assert_true(kv_test_now_ms() < end);
		kv_test_sleep_ms(1);
	}
	close(fd);
	for (uint64_t end = kv_test_now_ms() + 5000; kv_rpc_server_conns(srv) != 0;) {
		assert_true(kv_test_now_ms() < end);
		kv_test_sleep_ms(1);
	}
	kv_rpc_reply(st.p[0], st.m[0]);
	kv_rpc_server_destroy(srv);
}

static atomic_int big_calls;

/* Answers every request with 64 KiB. */
static int
big_handler(void *arg, nng_msg *req, nng_msg **reply, kv_rpc_pending *p)
{
	nng_msg *m;
	(void)arg;
	(void)req;
	(void)p;
	atomic_fetch_add(&big_calls, 1);
	if (nng_msg_alloc(&m, 64 * 1024) != 0)
		return KV_ENOMEM;
	memset(nng_msg_body(m), 'x', 64 * 1024);
	*reply = m;
	return 0;
}

static void
a_peer_that_never_reads_is_not_read_either(void **state)
{
	char url[64];
	kv_rpc_server *srv;
	enum { N = 1000 };
	static uint8_t out[8 + N * 13];
	uint8_t b[8 + 4 + 64 * 1024];
	(void)state;

	atomic_store(&big_calls, 0);
	kv_test_free_url(url, sizeof(url));
	kv_rpc_server_opts o = {.url = url, .handler = big_handler, .loops = 1, .contexts = 8};
	assert_int_equal(kv_rpc_server_create(&o, &srv), KV_OK);
	int fd = raw_connect(url);
	memcpy(out, hello_req, 8);
	for (int i = 0; i < N; i++) {
		uint8_t *f = out + 8 + (size_t)i * 13;
		kv_put64be(f, 5);
		f[8] = 0x80;
		f[9] = (uint8_t)(i >> 16);
		f[10] = (uint8_t)(i >> 8);
		f[11] = (uint8_t)i;
		f[12] = 'q';
	}
	raw_send(fd, out, sizeof(out));
	/* 1000 answers of 64 KiB are far more than the kernel's buffers hold:
	 * the server stops reading once 8 wait to be written. */
	int last = -1;
	for (uint64_t end = kv_test_now_ms() + 10000;;) {
		kv_test_sleep_ms(300);
		int now = atomic_load(&big_calls);
		if (now == last)
			break;
		last = now;
		assert_true(kv_test_now_ms() < end);
	}
	assert_true(last < N);
	/* Reading lets it go on: every request is answered. */
	assert_true(raw_recv(fd, b, 8));
	for (int i = 0; i < N; i++) {
		assert_true(raw_recv(fd, b, 8 + 4 + 64 * 1024));
		assert_int_equal(b[8], 0x80);
		assert_int_equal((b[9] << 16) | (b[10] << 8) | b[11], i);
	}
	assert_int_equal(atomic_load(&big_calls), N);
	close(fd);
	kv_rpc_server_destroy(srv);
}

static void
connections_past_the_bound_are_closed(void **state)
{
	struct later_state st = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
	char url[64];
	kv_rpc_server *srv;
	int fd[3];
	uint8_t b[8];
	(void)state;

	kv_test_free_url(url, sizeof(url));
	kv_rpc_server_opts o = {
	    .url = url, .handler = later_handler, .arg = &st, .loops = 2, .max_conns = 2};
	assert_int_equal(kv_rpc_server_create(&o, &srv), KV_OK);
	for (int i = 0; i < 3; i++)
		fd[i] = raw_connect(url);
	/* Two are greeted, one is closed: which one depends on which loop
	 * accepted first. */
	int greeted = 0, refused = -1, kept = -1;
	for (int i = 0; i < 3; i++) {
		if (raw_recv(fd[i], b, 8)) {
			greeted++;
			kept = i;
		} else {
			refused = i;
		}
	}
	assert_int_equal(greeted, 2);
	assert_true(refused >= 0);
	assert_int_equal(kv_rpc_server_conns(srv), 2);
	/* One goes: a new one is taken. */
	close(fd[kept]);
	close(fd[refused]);
	for (uint64_t end = kv_test_now_ms() + 5000; kv_rpc_server_conns(srv) != 1;) {
		assert_true(kv_test_now_ms() < end);
		kv_test_sleep_ms(1);
	}
	int again = raw_connect(url);
	assert_true(raw_recv(again, b, 8));
	close(again);
	for (int i = 0; i < 3; i++)
		if (i != kept && i != refused)
			close(fd[i]);
	kv_rpc_server_destroy(srv);
}

/* ------------------------------------------------------------------------
 * Links (a REQ connection driven by its owner's thread)
 * ------------------------------------------------------------------------ */

/* Takes answers from l until `want` have come (5 s at most), checking each
 * against the body sent under its id. */
static void
link_take(kv_link *l, char (*sent)[32], uint8_t *big, size_t bigsz, bool *seen, int want)
{
	int got = 0;
	uint64_t end = kv_test_now_ms() + 5000;

	while (got < want) {
		struct pollfd pf = {.fd = kv_link_fd(l),
		                    .events = POLLIN | (kv_link_want_write(l) ? POLLOUT : 0)};
		assert_true(kv_test_now_ms() < end);
		assert_true(poll(&pf, 1, 100) >= 0);
		assert_int_equal(kv_link_flush(l), KV_OK);
		for (;;) {
			bool one;
			uint32_t id;
			const uint8_t *b;
			size_t n;
			assert_int_equal(kv_link_recv(l, &one, &id, &b, &n), KV_OK);
			if (!one)
				break;
			assert_true(id < 200);
			assert_false(seen[id]);
			seen[id] = true;
			if (sent[id][0] == 0) { /* a big one */
				assert_int_equal(n, bigsz);
				assert_memory_equal(b, big, bigsz);
			} else {
				assert_int_equal(n, strlen(sent[id]));
				assert_memory_equal(b, sent[id], n);
			}
			got++;
		}
	}
}

static void
a_link_gets_every_answer_by_its_id_in_any_order(void **state)
{
	struct later_state st = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
	static char sent[200][32];
	static bool seen[200];
	size_t bigsz = 3u << 20; /* past the socket's buffers: partial writes */
	uint8_t *big = malloc(bigsz);
	char url[64];
	kv_rpc_server *srv;
	kv_link *l;
	pthread_t ans;
	(void)state;

	assert_non_null(big);
	for (size_t i = 0; i < bigsz; i++)
		big[i] = (uint8_t)(i * 7 + i / 251);
	kv_test_free_url(url, sizeof(url));
	kv_rpc_server_opts o = {
	    .url = url, .handler = later_handler, .arg = &st, .loops = g_loops, .contexts = 16};
	assert_int_equal(kv_rpc_server_create(&o, &srv), KV_OK);
	assert_int_equal(pthread_create(&ans, NULL, later_answerer, &st), 0);
	assert_int_equal(kv_link_open(url, 2000, 0, &l), KV_OK);
	for (int round = 0; round < 2; round++) {
		memset(seen, 0, sizeof(seen));
		/* Answered now, later (newest first) or on a worker; every tenth
		 * is 3 MiB. */
		for (uint32_t i = 0; i < 200; i++) {
			if (i % 10 == 9) {
				sent[i][0] = 0;
				assert_int_equal(kv_link_send(l, i, big, bigsz), KV_OK);
				continue;
			}
			snprintf(sent[i], sizeof(sent[i]), "%s:%d:%u",
			         i % 3 == 0   ? "later"
			         : i % 3 == 1 ? "now"
			                      : "block",
			         round, i);
			assert_int_equal(kv_link_send(l, i, sent[i], strlen(sent[i])), KV_OK);
		}
		link_take(l, sent, big, bigsz, seen, 200);
	}
	kv_link_close(l);
	kv_rpc_server_destroy(srv);
	later_stop(&st, ans);
	free(big);
}

/* A listener on a free loopback port that accepts and then, per mode,
 * answers as a REQ peer (0), says nothing (1) or closes (2). */
struct fake_peer {
	int lfd, mode;
	pthread_t thr;
};

static void *
fake_peer_main(void *arg)
{
	struct fake_peer *fp = arg;
	uint8_t b[8];
	int fd = accept(fp->lfd, NULL, NULL);

	if (fd < 0)
		return NULL;
	if (fp->mode != 2)
		(void)recv(fd, b, sizeof(b), MSG_WAITALL);
	if (fp->mode == 0)
		(void)send(fd, hello_req, sizeof(hello_req), MSG_NOSIGNAL);
	if (fp->mode != 2) {
		struct pollfd pf = {.fd = fd, .events = POLLIN};
		(void)poll(&pf, 1, 3000); /* until the link gives up */
	}
	close(fd);
	return NULL;
}

static void
fake_peer_start(struct fake_peer *fp, int mode, char *url, size_t len)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t alen = sizeof(a);

	inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
	fp->mode = mode;
	fp->lfd = socket(AF_INET, SOCK_STREAM, 0);
	assert_true(fp->lfd >= 0);
	assert_int_equal(bind(fp->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(fp->lfd, 4), 0);
	assert_int_equal(getsockname(fp->lfd, (struct sockaddr *)&a, &alen), 0);
	snprintf(url, len, "tcp://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
	assert_int_equal(pthread_create(&fp->thr, NULL, fake_peer_main, fp), 0);
}

static void
fake_peer_stop(struct fake_peer *fp)
{
	pthread_join(fp->thr, NULL);
	close(fp->lfd);
}

static void
a_link_to_a_wrong_or_silent_peer_fails_in_its_time(void **state)
{
	struct fake_peer fp;
	char url[64];
	kv_link *l = NULL;
	uint64_t t0;
	(void)state;

	/* Nothing listens. */
	kv_test_free_url(url, sizeof(url));
	assert_int_equal(kv_link_open(url, 1000, 0, &l), KV_EUNAVAIL);
	assert_null(l);
	/* Not an address a link dials. */
	assert_false(kv_link_url_ok("tls+tcp://127.0.0.1:1"));
	assert_int_equal(kv_link_open("tls+tcp://127.0.0.1:1", 1000, 0, &l), KV_EINVAL);
	assert_int_equal(kv_link_open("tcp://127.0.0.1", 1000, 0, &l), KV_EINVAL);
	assert_int_equal(kv_link_open("tcp://*:5", 1000, 0, &l), KV_EINVAL);
	/* Another protocol's header. */
	fake_peer_start(&fp, 0, url, sizeof(url));
	assert_int_equal(kv_link_open(url, 2000, 0, &l), KV_EPROTO);
	fake_peer_stop(&fp);
	/* A peer that never answers the header: the deadline. */
	fake_peer_start(&fp, 1, url, sizeof(url));
	t0 = kv_test_now_ms();
	assert_int_equal(kv_link_open(url, 300, 0, &l), KV_ETIMEDOUT);
	assert_true(kv_test_now_ms() - t0 >= 290);
	fake_peer_stop(&fp);
	/* One that closes. */
	fake_peer_start(&fp, 2, url, sizeof(url));
	assert_int_equal(kv_link_open(url, 2000, 0, &l), KV_EUNAVAIL);
	fake_peer_stop(&fp);
	assert_null(l);
}

/* Reads l until it fails (5 s at most), with no answer coming first;
 * returns the failure. */
static int
link_failure(kv_link *l)
{
	bool one = false;
	uint32_t id;
	const uint8_t *b;
	size_t n;
	int rv;

	for (uint64_t end = kv_test_now_ms() + 5000;;) {
		struct pollfd pf = {.fd = kv_link_fd(l), .events = POLLIN};
		assert_true(kv_test_now_ms() < end);
		(void)poll(&pf, 1, 100);
		if ((rv = kv_link_recv(l, &one, &id, &b, &n)) != KV_OK)
			return rv;
		assert_false(one);
	}
}

static void
a_link_fails_on_an_oversized_answer_and_on_the_servers_end(void **state)
{
	struct later_state st = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
	char url[64], body[100];
	kv_rpc_server *srv;
	kv_link *l;
	(void)state;

	memset(body, 'x', sizeof(body));
	memcpy(body, "now", 3);
	kv_test_free_url(url, sizeof(url));
	kv_rpc_server_opts o = {.url = url, .handler = later_handler, .arg = &st, .loops = 1};
	assert_int_equal(kv_rpc_server_create(&o, &srv), KV_OK);
	/* Answers of 64 bytes at most: the echo of 100 breaks the link. */
	assert_int_equal(kv_link_open(url, 2000, 64, &l), KV_OK);
	assert_int_equal(kv_link_send(l, 1, body, sizeof(body)), KV_OK);
	assert_int_equal(link_failure(l), KV_EPROTO);
	assert_int_equal(kv_link_send(l, 2, body, 3), KV_ECLOSED);
	kv_link_close(l);
	/* The server goes: the link says so. */
	assert_int_equal(kv_link_open(url, 2000, 0, &l), KV_OK);
	kv_rpc_server_destroy(srv);
	assert_int_equal(link_failure(l), KV_ECLOSED);
	kv_link_close(l);
}

static int
nng_group(void **state)
{
	(void)state;
	g_loops = 0;
	return 0;
}

static int
loops_group(void **state)
{
	(void)state;
	g_loops = 2;
	return 0;
}

int
main(void)
{
	const struct CMUnitTest both[] = {
	    cmocka_unit_test(call_returns_the_reply_of_the_handler),
	    cmocka_unit_test(deferred_request_is_answered_by_kv_rpc_reply),
	    cmocka_unit_test(dropped_request_times_out_at_the_client),
	    cmocka_unit_test(call_without_server_is_unavailable),
	    cmocka_unit_test(second_listener_on_same_address_gets_eaddrinuse),
	    cmocka_unit_test(a_client_of_a_malformed_address_is_refused_at_create),
	    cmocka_unit_test(
	        async_call_with_a_waited_send_gets_its_reply_or_fails_after_the_connect_wait),
	    cmocka_unit_test(
	        an_async_call_past_its_timeout_fails_and_its_late_answer_goes_to_nobody),
	    cmocka_unit_test(
	        a_lost_connection_fails_its_calls_at_once_and_the_next_call_connects_again),
	    cmocka_unit_test(destroying_an_async_caller_ends_its_call),
	};
	const struct CMUnitTest loops[] = {
	    cmocka_unit_test(calls_in_flight_past_the_bound_are_all_answered_out_of_order),
	    cmocka_unit_test(the_wire_is_nngs_and_bad_peers_are_disconnected),
	    cmocka_unit_test(connections_past_the_bound_are_closed),
	    cmocka_unit_test(a_peer_that_never_reads_is_not_read_either),
	};
	const struct CMUnitTest links[] = {
	    cmocka_unit_test(a_link_gets_every_answer_by_its_id_in_any_order),
	    cmocka_unit_test(a_link_to_a_wrong_or_silent_peer_fails_in_its_time),
	    cmocka_unit_test(a_link_fails_on_an_oversized_answer_and_on_the_servers_end),
	};
	const struct CMUnitTest links_nng[] = {
	    cmocka_unit_test(a_link_gets_every_answer_by_its_id_in_any_order),
	};
	int failed = cmocka_run_group_tests_name("nng threads", both, nng_group, NULL);
	failed += cmocka_run_group_tests_name("event loops", both, loops_group, NULL);
	failed += cmocka_run_group_tests_name("event loops alone", loops, NULL, NULL);
	failed += cmocka_run_group_tests_name("links, nng's server", links_nng, nng_group, NULL);
	failed += cmocka_run_group_tests_name("links", links, loops_group, NULL);
	return failed;
}
