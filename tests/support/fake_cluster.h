/*
 * fake_cluster.h - a fake shardkv cluster inside the test process, for
 * testing libshardkv and the CLI without daemons (component/
 * test_client_fake.c): the shared fake controller of fake_ctl.h and
 * KV_FAKE_NSERVERS fake shard servers (get, put, del, append, mget, mput,
 * scan, expiry, conditional put/del, incr, exists, count and delrange in
 * steps of 2 keys, with ownership checks, OwnerHints and exactly-once
 * memory), each an
 * nng listener on a free loopback port.
 *
 * The fake servers implement just enough of doc/protocol.md to test the
 * client's side of it. Two configurations are kept apart: what the
 * controller hands out (published to fake_ctl, in epoch order) and `truth`,
 * what the servers serve (a test makes the client's cache stale by changing
 * the truth first). The servers check every request with cmocka
 * assertions, so a malformed request fails the test.
 *
 * The struct is open: tests read the controller's counters through `ctl`
 * (fake_ctl.h), and the counters and fault switches of `srv[i]`.
 */
#ifndef KV_TESTS_SUPPORT_FAKE_CLUSTER_H
#define KV_TESTS_SUPPORT_FAKE_CLUSTER_H

#include "common/config.h"
#include "common/rpc.h"
#include "tests/support/fake_ctl.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KV_FAKE_NSERVERS 2 /* fake shard servers, node ids 1 .. KV_FAKE_NSERVERS */
#define KV_FAKE_HELD     8 /* requests a silent server holds */

typedef struct kv_fake_cluster kv_fake_cluster;

/* One stored pair of a fake server. */
typedef struct {
	kv_buf key;      /* the key */
	kv_buf val;      /* the value */
	uint64_t exp_ns; /* kv_now_ns() at which it expires; 0: never */
} kv_fake_pair;

/* A remembered write (exactly-once). */
typedef struct {
	uint64_t client_id;  /* Request.client_id */
	uint64_t request_id; /* Op.request_id */
} kv_fake_seen;

/* A fake shard server. */
typedef struct kv_fake_server {
	kv_fake_cluster *cl;                /* the cluster it belongs to */
	uint32_t id;                        /* node id */
	char url[64];                       /* listen URL */
	kv_rpc_server *rpc;                 /* the listener */
	pthread_mutex_t mu;                 /* protects everything below */
	kv_fake_pair *kv;                   /* the data */
	size_t nkv;                         /* entries */
	kv_buf cursor;                      /* the next_cursor of the last count/delrange step */
	kv_fake_seen seen[256];             /* writes applied, by id */
	size_t nseen;                       /* entries */
	int requests;                       /* requests answered */
	int wrong_owner;                    /* WRONG_OWNER answers */
	int mput_ops;                       /* MPutOp received */
	int mget_ops;                       /* MGetOp received */
	int applied_lossy;                  /* puts of key "lossy" applied */
	int received_lossy;                 /* puts of key "lossy" received */
	uint64_t lossy_ids[8];              /* their Op.request_ids */
	bool drop_lossy;                    /* drop the reply of the first "lossy" put */
	unsigned mput_delay_ms;             /* sleep in mput (concurrency check) */
	int mput_fail;                      /* wire status to answer mput with; 0: none */
	bool silent;                        /* answer nothing: hold every request (counted) */
	int silent_seen;                    /* requests held (or, past KV_FAKE_HELD, dropped) */
	uint64_t silent_put_id;             /* the Op.request_id of the last put or mput held */
	kv_rpc_pending *held[KV_FAKE_HELD]; /* the held requests */
	size_t nheld;                       /* entries */
} kv_fake_server;

struct kv_fake_cluster {
	fake_ctl *ctl;                        /* the controller: url, history, counters */
	pthread_mutex_t mu;                   /* protects truth */
	kv_config *truth;                     /* what the servers serve */
	kv_fake_server srv[KV_FAKE_NSERVERS]; /* the servers */
	atomic_int mput_inflight;             /* delayed mputs being answered now */
	atomic_int mput_max_inflight;         /* the most at once */
};

/*
 * Starts the fake controller and servers on free loopback ports, with node 1
 * owning [, "m") and node 2 ["m", ) at epoch 5, both published (the first
 * configuration the controller has) and served.
 * On 0 *out is the cluster (the caller destroys it); returns -1 when a
 * listener cannot start.
 */
int kv_fake_cluster_create(kv_fake_cluster **out);

/* Stops the listeners and frees the cluster. Accepts NULL. */
void kv_fake_cluster_destroy(kv_fake_cluster *c);

/*
 * Returns a new configuration at `epoch` of the cluster's servers, with one
 * range owned by owner_lo when split is NULL or the owners are equal, else
 * [, split) owned by owner_lo and [split, ) by owner_hi. The caller owns it
 * (kv_config_free, or hands it to publish / set_truth). Fails the test on
 * out-of-memory.
 */
kv_config *kv_fake_cluster_config(kv_fake_cluster *c, uint64_t epoch, const char *split,
                                  uint32_t owner_lo, uint32_t owner_hi);

/* Makes cfg (taken; its epoch follows the latest published) the controller's
 * latest and answers the waiting watches (fake_cfg_publish). */
void kv_fake_cluster_publish(kv_fake_cluster *c, kv_config *cfg);

/* Makes cfg (taken) what the servers serve. */
void kv_fake_cluster_set_truth(kv_fake_cluster *c, kv_config *cfg);

/* Ends s's silence: answers every request it held with an empty message
 * (which a client that abandoned them ignores). */
void kv_fake_server_release(kv_fake_server *s);

/* Returns how many keys fake server i holds. */
size_t kv_fake_server_nkeys(kv_fake_cluster *c, int i);

#endif
