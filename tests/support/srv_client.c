/*
 * srv_client.c - the tests' tiny shard server client (srv_client.h).
 * clients_mu protects the client cache.
 */
#include "tests/support/srv_client.h"
#include "tests/support/testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

static struct {
	char url[64];     /* dialed URL */
	kv_rpc_client *c; /* client */
} clients[16];
static pthread_mutex_t clients_mu = PTHREAD_MUTEX_INITIALIZER;

kv_rpc_client *
client_for(const char *url)
{
	kv_rpc_client *c = NULL;
	pthread_mutex_lock(&clients_mu);
	for (int i = 0; i < 16 && c == NULL; i++) {
		if (clients[i].c && strcmp(clients[i].url, url) == 0)
			c = clients[i].c;
		else if (clients[i].c == NULL) {
			assert_int_equal(kv_rpc_client_create(url, &clients[i].c), 0);
			snprintf(clients[i].url, sizeof(clients[i].url), "%s", url);
			c = clients[i].c;
		}
	}
	pthread_mutex_unlock(&clients_mu);
	return c;
}

void
clients_close(void)
{
	pthread_mutex_lock(&clients_mu);
	for (int i = 0; i < 16; i++) {
		kv_rpc_client_destroy(clients[i].c);
		clients[i].c = NULL;
	}
	pthread_mutex_unlock(&clients_mu);
}

/* Sends raw bytes; returns the unpacked Response or NULL on transport failure. */
Shardkv__Response *
call_raw(const char *url, const void *p, size_t n)
{
	nng_msg *req, *rep;
	Shardkv__Response *r;
	assert_int_equal(nng_msg_alloc(&req, n), 0);
	memcpy(nng_msg_body(req), p, n);
	if (kv_rpc_call(client_for(url), req, &rep, 5000) != 0)
		return NULL;
	r = shardkv__response__unpack(NULL, nng_msg_len(rep), nng_msg_body(rep));
	nng_msg_free(rep);
	assert_non_null(r);
	return r;
}

Shardkv__Response *
call(const char *url, Shardkv__Request *rq)
{
	rq->version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	size_t n = shardkv__request__get_packed_size(rq);
	uint8_t *buf = malloc(n ? n : 1);
	shardkv__request__pack(rq, buf);
	Shardkv__Response *r = call_raw(url, buf, n);
	free(buf);
	return r;
}

res1
one_op(const char *url, Shardkv__Op *op, uint64_t client)
{
	Shardkv__Request rq = SHARDKV__REQUEST__INIT;
	Shardkv__Op *ops[1] = {op};
	res1 out;
	memset(&out, 0, sizeof(out));
	rq.client_id = client;
	rq.n_ops = 1;
	rq.ops = ops;
	rq.epoch = 1;
	Shardkv__Response *r = call(url, &rq);
	if (r == NULL) {
		out.status = -1;
		return out;
	}
	if (r->status != 0 || r->n_results != 1) {
		if (r->status != SHARDKV__STATUS__STATUS_UNAVAILABLE)
			fprintf(stderr, "request refused: status %d: %s\n", r->status, r->error);
		out.status = r->status ? (int)r->status : -2;
		shardkv__response__free_unpacked(r, NULL);
		return out;
	}
	Shardkv__OpResult *x = r->results[0];
	out.status = x->status;
	snprintf(out.value, sizeof(out.value), "%.*s", (int)x->value.len, (char *)x->value.data);
	out.value_len = x->value_len;
	out.current_absent = x->current_absent;
	out.ttl_ms = x->ttl_ms;
	out.number = x->number;
	out.count = x->count;
	out.more = x->more;
	out.next_len = x->next_cursor.len;
	snprintf(out.next_cursor, sizeof(out.next_cursor), "%.*s", (int)x->next_cursor.len,
	         (char *)x->next_cursor.data);
	if (x->owner) {
		out.hint_node = x->owner->node_id;
		out.hint_epoch = x->owner->epoch;
		snprintf(out.hint_addr, sizeof(out.hint_addr), "%s", x->owner->address);
		snprintf(out.hint_start, sizeof(out.hint_start), "%.*s", (int)x->owner->start.len,
		         (char *)x->owner->start.data);
	}
	shardkv__response__free_unpacked(r, NULL);
	return out;
}

ProtobufCBinaryData
bd(const char *s)
{
	ProtobufCBinaryData d = {strlen(s), (uint8_t *)s};
	return d;
}

res1
do_put(const char *url, const char *k, const char *v, uint64_t client, uint64_t reqid)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__PutOp p = SHARDKV__PUT_OP__INIT;
	p.key = bd(k);
	p.value = bd(v);
	op.op_case = SHARDKV__OP__OP_PUT;
	op.put = &p;
	op.request_id = reqid;
	return one_op(url, &op, client);
}

res1
do_get(const char *url, const char *k)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__GetOp g = SHARDKV__GET_OP__INIT;
	g.key = bd(k);
	op.op_case = SHARDKV__OP__OP_GET;
	op.get = &g;
	return one_op(url, &op, 0);
}

res1
do_append(const char *url, const char *k, const char *v, uint64_t client, uint64_t reqid)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__AppendOp a = SHARDKV__APPEND_OP__INIT;
	a.key = bd(k);
	a.value = bd(v);
	op.op_case = SHARDKV__OP__OP_APPEND;
	op.append = &a;
	op.request_id = reqid;
	return one_op(url, &op, client);
}

res1
do_del(const char *url, const char *k)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__DelOp d = SHARDKV__DEL_OP__INIT;
	d.key = bd(k);
	op.op_case = SHARDKV__OP__OP_DEL;
	op.del = &d;
	return one_op(url, &op, 0);
}

void
srv_wait_ready(const char *url, uint64_t epoch, unsigned ms, void (*on_timeout)(void))
{
	uint64_t deadline = kv_test_now_ms() + ms;
	for (;;) {
		Shardkv__Request rq = SHARDKV__REQUEST__INIT;
		Shardkv__Response *r = call(url, &rq);
		bool ok = r && r->node_id != 0 && r->epoch >= epoch;
		if (r)
			shardkv__response__free_unpacked(r, NULL);
		if (ok)
			return;
		if (kv_test_now_ms() > deadline) {
			if (on_timeout)
				on_timeout();
			fail_msg("server %s not ready at epoch %llu", url,
			         (unsigned long long)epoch);
		}
		kv_test_sleep_ms(5);
	}
}
