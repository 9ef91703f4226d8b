/*
 * srv_client.h - a tiny client of the shard server wire for tests: one
 * request per call, over one cached kv_rpc_client per URL (at most 16),
 * with the protobuf structs of proto/shardkv.pb-c.h. Transport failures are
 * results (status -1), anything else unexpected fails the test.
 */
#ifndef KV_TESTS_SRV_CLIENT_H
#define KV_TESTS_SRV_CLIENT_H

#include "common/rpc.h"
#include "proto/shardkv.pb-c.h"

#include <stddef.h>
#include <stdint.h>

/* The result of one single-key op. */
typedef struct {
	int status;           /* wire status; -1: transport failure */
	char value[256];      /* value (NUL-terminated, truncated) */
	uint64_t value_len;   /* append */
	uint32_t hint_node;   /* hint */
	char hint_addr[64];   /* hint address */
	uint64_t hint_epoch;  /* hint epoch */
	char hint_start[64];  /* hint range start */
	bool current_absent;  /* conditional write: the key is absent */
	int64_t ttl_ms;       /* ttl */
	int64_t number;       /* incr */
	uint64_t count;       /* count, delrange */
	bool more;            /* scan, count, delrange */
	char next_cursor[64]; /* ... (NUL-terminated, truncated) */
	size_t next_len;      /* its length */
} res1;

/* The cached client for url (created on first use). */
kv_rpc_client *client_for(const char *url);

/* Polls url with empty requests until it answers with a node id and an
 * epoch of at least `epoch`, for at most ms. Past that it calls on_timeout
 * (when not NULL: to print a log, say) and fails the test. */
void srv_wait_ready(const char *url, uint64_t epoch, unsigned ms, void (*on_timeout)(void));

/* Closes every cached client. */
void clients_close(void);

/* Sends raw bytes; returns the unpacked Response (the caller frees it with
 * shardkv__response__free_unpacked) or NULL on transport failure. */
Shardkv__Response *call_raw(const char *url, const void *p, size_t n);

/* Packs rq (version set here) and sends it, as call_raw. */
Shardkv__Response *call(const char *url, Shardkv__Request *rq);

/* Sends one op in a request of client `client` and returns its result. */
res1 one_op(const char *url, Shardkv__Op *op, uint64_t client);

/* The bytes of a C string (borrowed). */
ProtobufCBinaryData bd(const char *s);

/* Single-key ops; reqid 0: no exactly-once. */
res1 do_put(const char *url, const char *k, const char *v, uint64_t client, uint64_t reqid);
res1 do_get(const char *url, const char *k);
res1 do_append(const char *url, const char *k, const char *v, uint64_t client, uint64_t reqid);
res1 do_del(const char *url, const char *k);

#endif
