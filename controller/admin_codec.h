/*
 * admin_codec.h - the controller's side of the AdminRequest/AdminResponse
 * wire messages, as plain C values. admin_codec.c is the only controller file
 * that includes the generated protobuf header (STYLE §8); everything else
 * sees the structs below.
 *
 * A decoded request borrows its strings and bytes from the unpacked message
 * it keeps in `priv`, so it lives until kv_admin_req_fini().
 */
#ifndef KV_CONTROLLER_ADMIN_CODEC_H
#define KV_CONTROLLER_ADMIN_CODEC_H

#include "common/config.h"
#include "common/key.h"

#include <nng/nng.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The commands, numbered as the AdminRequest oneof. */
typedef enum {
	KV_ADM_JOIN = 7,
	KV_ADM_LEAVE = 8,
	KV_ADM_MOVE = 9,
	KV_ADM_REBALANCE = 10,
	KV_ADM_GET_CONFIG = 11,
	KV_ADM_STATUS = 12,
	KV_ADM_CANCEL = 13,
	KV_ADM_REGISTER = 14,
	KV_ADM_HEARTBEAT = 15,
	KV_ADM_PROGRESS = 16,
	KV_ADM_DONE = 17,
	KV_ADM_WATCH = 18,
} kv_admin_op;

/* Live statistics of one range (Heartbeat.ranges, NodeStats.ranges). */
typedef struct {
	kv_bytes start;  /* the range as the node owns it */
	kv_bytes end;    /* empty: end of the key space */
	uint64_t keys;   /* keys in it */
	uint64_t bytes;  /* key + value bytes in it */
	double ops;      /* op rate */
	size_t nsplit;   /* entries in split */
	kv_bytes *split; /* split keys, in key order */
} kv_admin_range_stat;

/* A decoded AdminRequest. Pointers borrow from the unpacked message. */
typedef struct {
	kv_admin_op op;      /* which command */
	uint64_t request_id; /* echoed */
	uint64_t client_id;  /* sender id; 0: none */
	bool wait;           /* answer when the migrations have finished */
	uint32_t timeout_ms; /* bound on wait and watch; 0: default */
	kv_bytes auth;       /* AdminRequest.auth_token (common/auth.h); empty: none */
	/* join, register: the address; leave, move: the node by address or id */
	const char *address; /* may be NULL */
	uint32_t
	    node_id; /* node ref id; heartbeat/progress/done/watch sender; register resume id */
	bool no_rebalance;   /* join, register */
	bool join;           /* register: join if unknown */
	kv_bytes start, end; /* move */
	uint32_t rate_mb_s;  /* move, rebalance */
	uint64_t epoch;  /* get_config: epoch; watch: known epoch; heartbeat/register: applied */
	uint64_t mig_id; /* cancel, progress, done */
	bool history;    /* watch */
	uint32_t max_configs;   /* watch */
	const char *cluster_id; /* register; may be NULL */
	uint64_t boot_id;       /* register, heartbeat */
	/* heartbeat */
	size_t nranges;               /* entries in ranges */
	kv_admin_range_stat *ranges;  /* owned array; its bytes are borrowed */
	uint64_t keys, bytes, memory; /* heartbeat totals; done: keys/bytes moved */
	double ops;                   /* heartbeat op rate */
	/* progress */
	kv_mig_phase phase;
	uint64_t keys_copied, bytes_copied, keys_total, bytes_total, rate_bytes_s;
	/* done */
	int result;        /* done: KV_OK or the failure's KV_E* code */
	const char *error; /* done: detail; may be NULL */
	void *priv;        /* the unpacked message */
} kv_admin_req;

/* Per node statistics for the status report. */
typedef struct {
	uint32_t node_id;
	uint64_t keys, bytes, memory, epoch_applied, last_seen_ms;
	double ops;
	size_t nranges;
	const kv_admin_range_stat *ranges;
} kv_admin_node_stat;

/* Controller replica roles (ReplicaRole). */
enum {
	KV_ADMIN_ROLE_UNKNOWN = 0,
	KV_ADMIN_ROLE_STANDALONE = 1,
	KV_ADMIN_ROLE_LEADER = 2,
	KV_ADMIN_ROLE_FOLLOWER = 3,
	KV_ADMIN_ROLE_CANDIDATE = 4,
};

/* One controller replica in the status report. */
typedef struct {
	uint32_t id;         /* --id */
	const char *address; /* its --peers URL */
	int role;            /* KV_ADMIN_ROLE_* */
	uint64_t term;       /* its term; 0 standalone or unknown */
	uint64_t index;      /* its log index; 0 standalone */
} kv_admin_replica;

/* The status report. Everything borrowed. */
typedef struct {
	size_t nnodes;
	const kv_admin_node_stat *nodes;
	size_t nmigs;
	const kv_migration *migs; /* with live progress */
	const char *address;      /* this controller's --listen */
	/* Controller replicas; 0: a standalone controller at `address`. */
	size_t nreplicas;
	const kv_admin_replica *replicas;
} kv_admin_report;

/* An AdminResponse. Everything borrowed. */
typedef struct {
	uint64_t request_id;
	int err;           /* KV_OK or KV_E* */
	const char *error; /* detail; NULL: kv_strerror(err) when err != 0 */
	uint64_t epoch;
	const kv_config *config;         /* may be NULL */
	const kv_config *const *configs; /* watch with history */
	size_t nconfigs;
	const kv_admin_report *report; /* status; may be NULL */
	uint64_t wait_ms;
	uint32_t node_id;
	const uint64_t *mig_ids;
	size_t nmig_ids;
	/* Replicated controllers only. not_leader answers STATUS_NOT_LEADER
	 * (err must be KV_EUNAVAIL) with the leader as known (id 0: none). */
	bool not_leader;
	uint32_t leader_id;         /* the leader's --id; 0: unknown */
	const char *leader_address; /* its URL; may be NULL */
	uint64_t term;              /* the answering replica's term */
	uint64_t commit_index;      /* the answering replica's commit index */
} kv_admin_resp;

/*
 * Decodes and checks an AdminRequest. Returns 0; KV_EPROTO for bytes that do
 * not decode; KV_EINVAL for a wrong protocol version or no command. On error
 * writes the reason into msg and still fills out->request_id when it could.
 * On 0 the caller calls kv_admin_req_fini().
 */
int kv_admin_decode(const void *p, size_t n, kv_admin_req *out, char *msg, size_t msglen);

/* Frees what kv_admin_decode kept. Accepts a zeroed request. */
void kv_admin_req_fini(kv_admin_req *r);

/* Packs a response into a new nng message (*out is the caller's). Returns 0
 * or KV_ENOMEM. */
int kv_admin_encode(const kv_admin_resp *r, nng_msg **out);

/* Packs / unpacks a configuration for the config log. */
int kv_admin_config_pack(const kv_config *c, kv_buf *out);
int kv_admin_config_unpack(const uint8_t *p, size_t n, kv_config **out);

#endif
