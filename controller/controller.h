/*
 * controller.h - the shardkv controller: keeps the configuration history,
 * answers admin commands, server reports and watches (SPEC §4, §5;
 * doc/protocol.md).
 *
 * Standalone (one replica, no --id/--peers). Every configuration is made
 * durable in the config log (clog.h) before anyone can see it.
 */
#ifndef KV_CONTROLLER_CONTROLLER_H
#define KV_CONTROLLER_CONTROLLER_H

#include "common/log.h"
#include "common/tls.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Immutable start-up configuration (from the command line). */
typedef struct {
	const char *listen;    /* nng URL to serve AdminRequest on */
	const char *data_dir;  /* where the config log lives (created if missing) */
	const char *metrics;   /* HOST:PORT for Prometheus text at /metrics; NULL: off */
	unsigned contexts;     /* concurrent requests; 0: 1024 */
	uint32_t watch_max_ms; /* longest a watch is held; 0: 60000 */
	uint32_t wait_max_ms;  /* default bound on --wait; 0: 600000 */
	unsigned max_watches;  /* watches held at once; 0: contexts * 3 / 4 */
	/* --auth-token-file: the shared secret every request must carry
	 * (common/auth.h); NULL: none. */
	const char *auth_token_file;
	/* --tls-cert, --tls-key, --tls-ca (common/tls.h): all three with a
	 * tls+tcp:// --listen, none with another; NULL: not given. */
	kv_tls_files tls;
} kv_controller_cfg;

typedef struct kv_controller kv_controller;

/* The parsed command line of shardkv-controller. */
typedef struct {
	kv_controller_cfg cfg;   /* strings point into argv */
	enum kv_log_level level; /* --log-level (default info) */
	bool help;               /* --help: print kv_controller_usage, exit 0 */
} kv_controller_args;

/* The --help text. */
extern const char kv_controller_usage[];

/*
 * Parses the command line (argv[0] is the program) into *out without
 * opening or reading anything. Checks what flags alone can tell: required
 * flags, --log-level, the --tls-* combination and the --listen scheme. On
 * KV_EINVAL err holds a one-line reason (main prints it and exits 2) and
 * *out is untouched. May reorder argv (getopt) and can be called again.
 */
int kv_controller_parse_args(int argc, char **argv, kv_controller_args *out, char *err,
                             size_t errlen);

/*
 * Opens the data dir, replays the log, and starts serving. On error writes a
 * one-line reason into err and returns KV_EADDRINUSE (listen address taken),
 * KV_EINVAL (bad URL), KV_ECORRUPT (damaged log), KV_EBUSY (data dir in use),
 * KV_EINVAL (unusable --auth-token-file or TLS files) or another KV_E* code. The caller
 * stops it with kv_controller_destroy().
 */
int kv_controller_create(const kv_controller_cfg *cfg, kv_controller **out, char *err,
                         size_t errlen);

/* Returns the latest published epoch (0 before the first join). Thread-safe. */
uint64_t kv_controller_epoch(kv_controller *c);

/* Answers every held request (watches with the current config, waits with
 * STATUS_CLOSED), stops serving and frees everything. Accepts NULL. */
void kv_controller_destroy(kv_controller *c);

/*
 * Runs a controller until SIGTERM or SIGINT. The caller must block those
 * signals in every thread first (main does, before any thread starts).
 * Returns 0 after a clean stop, or the error of kv_controller_create with
 * the reason in err.
 */
int kv_controller_run(const kv_controller_cfg *cfg, char *err, size_t errlen);

#endif
