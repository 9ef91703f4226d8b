/*
 * admin_codec.h - the admin family: AdminRequest and AdminResponse between
 * the controller and its callers (the CLI and clients: admin commands and
 * config queries, remove; shard servers: register, heartbeat (statistics or
 * lease renewal), migration reports, ISR changes,
 * watch), as plain C values. One struct per message serves both ends: the
 * sender fills a kv_admin_req and calls kv_admin_req_encode, the controller
 * gets the same struct from kv_admin_req_decode; the controller fills a
 * kv_admin_resp and calls kv_admin_resp_encode, the caller gets the same
 * struct from kv_admin_resp_decode.
 *
 * To encode, every pointer is borrowed from the caller and only read. A
 * decoded struct borrows its strings and bytes from the unpacked message it
 * keeps in `priv` (with the arrays the decoder allocated), so it lives until
 * the matching *_fini.
 */
#ifndef KV_PROTO_ADMIN_CODEC_H
#define KV_PROTO_ADMIN_CODEC_H

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
	KV_ADM_REMOVE = 19,
	KV_ADM_ISR_CHANGE = 20,
	/* AdminDryRun (21) is not an op of its own: it decodes as KV_ADM_MOVE or
	 * KV_ADM_REBALANCE with kv_admin_req.dry_run set. */
} kv_admin_op;

/* Live statistics of one range (Heartbeat.ranges, NodeStats.ranges). */
typedef struct {
	kv_bytes start;      /* the range as the node owns it */
	kv_bytes end;        /* empty: end of the key space */
	uint64_t keys;       /* keys in it */
	uint64_t bytes;      /* key + value bytes in it */
	double ops;          /* op rate */
	size_t nsplit;       /* entries in split */
	kv_bytes *split;     /* split keys, in key order */
	double reads;        /* decayed read op rate (sampled) */
	double writes;       /* decayed write op rate (sampled) */
	kv_bytes load_split; /* halves the sampled load; empty: none */
	kv_bytes hot_key;    /* one key with at least half of the load; empty: none */
	double hot_share;    /* hot_key's share of the load, 0..1 */
	size_t nlsplit;      /* entries in lsplit */
	kv_bytes *lsplit;    /* keys cutting the sampled load into about equal
	                        parts, in key order (heartbeats only); none: 0 */
} kv_admin_range_stat;

/* A decoded AdminRequest. Pointers borrow from the unpacked message. */
typedef struct {
	kv_admin_op op;      /* which command */
	uint64_t request_id; /* echoed */
	uint64_t client_id;  /* sender id; 0: none */
	bool wait;           /* answer when the migrations have finished */
	/* move, rebalance: plan only, publish nothing (AdminDryRun; any other
	 * op with dry_run set does not encode) */
	bool dry_run;
	uint32_t timeout_ms; /* bound on wait and watch; 0: default */
	kv_bytes auth;       /* AdminRequest.auth_token (common/auth.h); empty: none */
	/* join, register: the address; leave, move: the node by address (when
	 * node_id is 0) or by id */
	const char *address; /* may be NULL */
	uint32_t node_id; /* node ref; heartbeat/progress/done/watch: sender; register: resume id */
	bool no_rebalance;     /* join, register */
	bool join;             /* register: join if unknown */
	bool accept_data_loss; /* remove: give away ranges only the node held */
	bool lease_only;       /* heartbeat: a lease renewal without statistics */
	kv_bytes start, end;   /* move, isr_change */
	uint32_t rate_mb_s;    /* move, rebalance */
	uint64_t epoch;  /* get_config: epoch; watch: known epoch; heartbeat/register: applied */
	uint64_t mig_id; /* cancel, progress, done */
	bool history;    /* watch */
	uint32_t max_configs;   /* watch */
	const char *cluster_id; /* register; may be NULL */
	uint64_t boot_id;       /* register, heartbeat */
	bool restarted; /* register, heartbeat: this process recovered the node from its data
	                   dir and has had no OK answer to a message carrying this yet */
	/* heartbeat */
	size_t nranges;              /* entries in ranges */
	kv_admin_range_stat *ranges; /* owned array; its bytes are borrowed */
	uint64_t keys;               /* heartbeat: total keys; done: keys moved */
	uint64_t bytes;              /* heartbeat: total bytes; done: bytes moved */
	uint64_t memory;             /* heartbeat: resident memory */
	double ops;                  /* heartbeat: op rate */
	uint64_t uptime_ms;          /* heartbeat: since the server started; 0: unknown */
	/* progress */
	kv_mig_phase phase;    /* progress: the phase reached */
	uint64_t keys_copied;  /* progress: keys acknowledged so far */
	uint64_t bytes_copied; /* progress: bytes acknowledged so far */
	uint64_t keys_total;   /* progress: estimate; 0: unknown */
	uint64_t bytes_total;  /* progress: estimate; 0: unknown */
	uint64_t rate_bytes_s; /* progress: measured copy rate */
	/* done */
	int result;        /* done: KV_OK or the failure's KV_E* code */
	const char *error; /* done: detail; may be NULL */
	uint64_t last_seq; /* done: the last Transfer.seq acknowledged */
	/* isr_change (node_id: the asking primary; start, end: the range) */
	uint64_t leader_epoch; /* the leader epoch the primary acts on */
	uint32_t add_node;     /* the replica to add to the ISR; 0: none */
	uint32_t remove_node;  /* the member to remove from the ISR; 0: none */
	uint32_t unfence_node; /* the fence found in sync: the fence ends; 0: none */
	void *priv;            /* decoded: the unpacked message; NULL to encode */
} kv_admin_req;

/* Per node statistics for the status report (NodeStats). */
typedef struct {
	uint32_t node_id;                  /* Node.id */
	uint64_t keys;                     /* keys on the node */
	uint64_t bytes;                    /* key + value bytes on the node */
	uint64_t memory;                   /* resident memory */
	uint64_t epoch_applied;            /* the epoch it routes with */
	uint64_t last_seen_ms;             /* since its last heartbeat */
	uint64_t uptime_ms;                /* the server's uptime now; 0: unknown */
	double ops;                        /* recent op rate */
	size_t nranges;                    /* entries in ranges */
	const kv_admin_range_stat *ranges; /* per-range detail */
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

/* One decision of the automatic balancer (BalancerDecision). */
typedef struct {
	uint64_t time_ms;   /* Unix ms it was published; 0 in a plan */
	const char *kind;   /* "move", "transfer", "merge", "hot_key" */
	const char *reason; /* "bytes", "ops", "cold", "hot_key" */
	const char *what;   /* printable detail */
} kv_admin_balance;

/* Most balancer decisions in a decoded answer. */
#define KV_ADMIN_MAX_BALANCE 64u

/* The status report (StatusReport). Everything borrowed. */
typedef struct {
	size_t nnodes;                   /* entries in nodes */
	const kv_admin_node_stat *nodes; /* one per node */
	size_t nmigs;                    /* entries in migs */
	const kv_migration *migs;        /* with live progress */
	const char *address;             /* encode: this controller's --listen; decoded: NULL */
	/* Controller replicas; 0: a standalone controller at `address`. */
	size_t nreplicas;
	const kv_admin_replica *replicas;
	size_t nbalance;                 /* entries in balance */
	const kv_admin_balance *balance; /* the balancer's latest decisions, oldest first */
} kv_admin_report;

/* An AdminResponse. Everything borrowed (see the top of this file). */
typedef struct {
	uint64_t request_id;                  /* AdminRequest.request_id, echoed */
	int err;                              /* KV_OK or KV_E* */
	const char *error;                    /* detail; NULL: kv_strerror(err) when err != 0 */
	uint64_t epoch;                       /* the controller's latest (or new) epoch */
	const kv_config *config;              /* may be NULL */
	const kv_config *const *configs;      /* watch with history, oldest first */
	size_t nconfigs;                      /* entries in configs */
	const kv_admin_report *report;        /* status; may be NULL */
	uint64_t wait_ms;                     /* with wait: how long the migrations took */
	uint32_t node_id;                     /* join, register: the node's id */
	const uint64_t *mig_ids;              /* migrations created by the command */
	size_t nmig_ids;                      /* entries in mig_ids */
	uint32_t ranges_lost;                 /* remove: ranges whose only copy was on the node */
	const kv_migration *plan;             /* dry run: the migrations it would start */
	size_t nplan;                         /* entries in plan */
	const kv_admin_balance *balance_plan; /* rebalance dry run: the balancer's next */
	size_t nbalance_plan;                 /* entries in balance_plan */
	/* Replicated controllers only. not_leader answers STATUS_NOT_LEADER
	 * (err must be KV_EUNAVAIL) with the leader as known (id 0: none). */
	bool not_leader;
	uint32_t leader_id;         /* the leader's --id; 0: unknown */
	const char *leader_address; /* its URL; may be NULL */
	uint64_t term;              /* the answering replica's term */
	uint64_t commit_index;      /* the answering replica's commit index */
	void *priv;                 /* decoded: what the decoder keeps; NULL to encode */
} kv_admin_resp;

/* The most migrations a dry run's plan may list in a decoded answer (the
 * controller plans at most 64 per command). */
#define KV_ADMIN_MAX_PLAN 4096u

/*
 * Decodes and checks an AdminRequest. Returns 0; KV_EPROTO for bytes that do
 * not decode; KV_EINVAL for a wrong protocol version or no command; KV_ENOMEM.
 * On error writes the reason into msg and still fills out->request_id when it
 * could. On 0 and on error alike the caller calls kv_admin_req_fini().
 */
int kv_admin_req_decode(const void *p, size_t n, kv_admin_req *out, char *msg, size_t msglen);

/* Frees what kv_admin_req_decode kept; keeps request_id. Accepts a zeroed
 * request. */
void kv_admin_req_fini(kv_admin_req *r);

/* Packs a request into a new nng message; reads r only (r->priv is ignored);
 * on 0 *out is the caller's. Returns 0, KV_EINVAL (op unknown, or dry_run
 * with an op other than move and rebalance) or KV_ENOMEM. */
int kv_admin_req_encode(const kv_admin_req *r, nng_msg **out);

/* Packs a response into a new nng message; reads r only; on 0 *out is the
 * caller's. Returns 0 or KV_ENOMEM. */
int kv_admin_resp_encode(const kv_admin_resp *r, nng_msg **out);

/*
 * Decodes and validates an AdminResponse: every configuration passes
 * kv_config_validate, sizes are bounded (a plan has at most
 * KV_ADMIN_MAX_PLAN migrations, each naming two different nodes). STATUS_NOT_LEADER reads as err
 * KV_EUNAVAIL with not_leader set. On 0 the caller calls
 * kv_admin_resp_fini(); on error nothing is left to free. Returns 0,
 * KV_EPROTO or KV_ENOMEM.
 */
int kv_admin_resp_decode(const void *p, size_t n, kv_admin_resp *out);

/*
 * Takes the configurations out of a decoded response, oldest first:
 * AdminResponse.configs, or AdminResponse.config alone when configs is
 * empty. Returns their number; *out (NULL when 0) then belongs to the caller,
 * who frees each entry with kv_config_free() and the array with free(). The
 * response no longer points at them.
 */
size_t kv_admin_resp_take_configs(kv_admin_resp *r, kv_config ***out);

/*
 * Takes the newest configuration out of a decoded response:
 * AdminResponse.config, or the last of AdminResponse.configs when config is
 * absent. Returns it (the caller frees it with kv_config_free()) or NULL
 * when there is none; the response no longer points at it.
 */
kv_config *kv_admin_resp_take_config(kv_admin_resp *r);

/* Frees what kv_admin_resp_decode kept. Accepts a zeroed response. */
void kv_admin_resp_fini(kv_admin_resp *r);

#endif
