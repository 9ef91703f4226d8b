/*
 * cluster_util.c - see cluster_util.h.
 *
 * Every child process is started through common/proc.h, whose table and
 * exit paths stop it on an early exit of the test program (a failed
 * assertion that ends the process, exit(), a termination signal);
 * PR_SET_PDEATHSIG covers SIGKILL of the test process.
 */
#include "tests/support/cluster_util.h"
#include "common/err.h"
#include "common/proc.h"
#include "common/rpc.h"
#include "proto/shardkv.pb-c.h"
#include "proto/wire.h"
#include "tests/support/ctl_client.h"
#include "tests/support/testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef KV_CONTROLLER_BIN
#error "KV_CONTROLLER_BIN must name the shardkv-controller binary"
#endif
#ifndef KV_SERVER_BIN
#error "KV_SERVER_BIN must name the shardkv-server binary"
#endif

extern char **environ;

/* ---------------------------------------------------------------------------
 * Processes (common/proc.h keeps the table and the exit paths)
 * ------------------------------------------------------------------------- */

#define ADMIN_TIMEOUT_MS 30000u /* the helpers' client: admin calls with --wait */

static uint64_t t_first; /* kv_tc_elapsed_ms origin */

uint64_t
kv_tc_elapsed_ms(void)
{
	if (t_first == 0)
		t_first = kv_test_now_ms();
	return kv_test_now_ms() - t_first;
}

/* The exit paths, and SIGPIPE ignored (kv_tc_run writes to a child's stdin
 * that may close early). */
static void
install_cleanup(void)
{
	kv_proc_install_exit_paths(NULL);
	signal(SIGPIPE, SIG_IGN);
}

/* Starts a daemon: stdin from /dev/null, stdout and stderr appended to
 * `log`. Returns the pid or -1. */
static pid_t
spawn(const char *path, char *const argv[], const char *log)
{
	install_cleanup();
	return kv_proc_spawn(path, argv, log);
}

/* Waits up to ms for pid to exit; SIGKILL after that (with the threads'
 * stacks first when KV_TC_GDB is set). Returns 0 when it exited on its own
 * (status set) or -1. */
static int
reap(pid_t pid, unsigned ms, int *status)
{
	int rv = kv_proc_wait(pid, ms, status);

	if (rv != KV_ETIMEDOUT)
		return rv == 0 ? 0 : -1;
	fprintf(stderr, "cluster: pid %d did not exit within %u ms; killing it\n", (int)pid, ms);
	if (getenv("KV_TC_GDB")) {
		char cmd[200];
		snprintf(cmd, sizeof(cmd),
		         "gdb -p %d -batch -ex 'thread apply all bt' 2>/dev/null | "
		         "sed -n '/^Thread 1 /,$p' >&2",
		         (int)pid);
		if (system(cmd) != 0)
			fprintf(stderr, "cluster: gdb failed\n");
	}
	kv_proc_reap(pid, 0, NULL);
	return -1;
}

/* Sends sig to *pid and reaps it (SIGKILL after ms); *pid becomes 0.
 * Returns 0 when it exited on its own (status set), -1 otherwise or when
 * nothing runs. */
static int
stop(pid_t *pid, int sig, unsigned ms, int *status)
{
	int rv;

	if (*pid <= 0)
		return -1;
	kill(*pid, sig);
	rv = reap(*pid, ms, status);
	*pid = 0;
	return rv;
}

/* Makes the cluster's temporary directory /tmp/shardkv-TAG-XXXXXX. Returns 0
 * or -1 (c->dir empty). */
static int
make_dir(kv_tc *c, const char *tag)
{
	kv_tc_elapsed_ms();
	snprintf(c->dir, sizeof(c->dir), "/tmp/shardkv-%s-XXXXXX", tag);
	if (mkdtemp(c->dir) == NULL) {
		fprintf(stderr, "cluster: mkdtemp %s: %s\n", c->dir, strerror(errno));
		c->dir[0] = 0;
		return -1;
	}
	return 0;
}

/* ---------------------------------------------------------------------------
 * Authentication (kv_tc_set_auth, for test_cluster_auth.c): the secret every
 * cluster made afterwards uses. The hooks that read it are marked "auth:"
 * in start_controller_proc, kv_tc_create_ex, kv_tc_client and raw_pack.
 * ------------------------------------------------------------------------- */

static char tc_auth_file[320]; /* the controller's --auth-token-file; "": none */
static char tc_auth[256];      /* the token the helpers send; "": none */

int
kv_tc_set_auth(const char *file, const char *token)
{
	if ((file && strlen(file) >= sizeof(tc_auth_file)) ||
	    (token && strlen(token) >= sizeof(tc_auth))) {
		fprintf(stderr, "cluster: auth file name or token too long\n");
		return -1;
	}
	snprintf(tc_auth_file, sizeof(tc_auth_file), "%s", file ? file : "");
	snprintf(tc_auth, sizeof(tc_auth), "%s", token ? token : "");
	return 0;
}

/* ---------------------------------------------------------------------------
 * TLS (kv_tc_set_tls, for test_cluster_tls.c): the files every cluster made
 * afterwards uses. The hooks that read them are marked "tls:".
 * ------------------------------------------------------------------------- */

static char tc_tls_srv[3][320]; /* the daemons' --tls-cert, --tls-key, --tls-ca; "": off */
static char tc_tls_cli[2][320]; /* the helpers' client certificate and key; "": none */
static kv_tls *tc_tls;          /* the helpers' raw-op configuration, made on first use */

int
kv_tc_set_tls(const char *cert, const char *key, const char *ca, const char *client_cert,
              const char *client_key)
{
	const char *in[5] = {cert, key, ca, client_cert, client_key};

	for (int i = 0; i < 5; i++) {
		char *to = i < 3 ? tc_tls_srv[i] : tc_tls_cli[i - 3];
		if (in[i] && strlen(in[i]) >= sizeof(tc_tls_srv[0])) {
			fprintf(stderr, "cluster: TLS file name too long\n");
			return -1;
		}
		snprintf(to, sizeof(tc_tls_srv[0]), "%s", in[i] ? in[i] : "");
	}
	kv_tls_destroy(tc_tls);
	tc_tls = NULL;
	return 0;
}

/* Makes url (from kv_test_free_url) a tls+tcp:// one when TLS is on. */
static void
tc_tls_url(char *url, size_t len)
{
	size_t n = strlen(url);

	if (tc_tls_srv[2][0] == 0 || strncmp(url, "tcp://", 6) != 0 || n + 4 >= len)
		return;
	memmove(url + 4, url, n + 1);
	memcpy(url, "tls+", 4);
}

/* Appends the daemons' TLS flags to argv at *n (6 entries) when TLS is on. */
static void
tc_tls_args(char **argv, size_t *n)
{
	static const char *const flags[3] = {"--tls-cert", "--tls-key", "--tls-ca"};

	if (tc_tls_srv[2][0] == 0)
		return;
	for (int i = 0; i < 3; i++) {
		argv[(*n)++] = (char *)flags[i];
		argv[(*n)++] = tc_tls_srv[i];
	}
}

/* Sets the helpers' token and TLS files in client options. */
static void
tc_auth_opts(shardkv_options *o)
{
	o->auth_token = tc_auth[0] ? tc_auth : NULL;
	o->auth_token_len = strlen(tc_auth);
	o->tls_ca = tc_tls_srv[2][0] ? tc_tls_srv[2] : NULL; /* tls: */
	o->tls_cert = tc_tls_cli[0][0] ? tc_tls_cli[0] : NULL;
	o->tls_key = tc_tls_cli[1][0] ? tc_tls_cli[1] : NULL;
}

/* ---------------------------------------------------------------------------
 * The cluster
 * ------------------------------------------------------------------------- */

/* Copies a NULL-terminated flag list into args. Returns the count or -1. */
static int
copy_args(char (*args)[KV_TC_ARG_LEN], const char *const *from)
{
	int n = 0;

	for (; from && from[n]; n++) {
		if (n == KV_TC_MAX_ARGS || strlen(from[n]) >= KV_TC_ARG_LEN) {
			fprintf(stderr, "cluster: too many or too long server flags\n");
			return -1;
		}
		snprintf(args[n], KV_TC_ARG_LEN, "%s", from[n]);
	}
	return n;
}

/* Extra flags of the standalone controller of every cluster created
 * afterwards (kv_tc_set_controller_args), copied into it at its creation. */
static char tc_sctl_args[KV_TC_MAX_ARGS][KV_TC_ARG_LEN];
static int tc_nsctl_args;

int
kv_tc_set_controller_args(const char *const *args)
{
	int n = copy_args(tc_sctl_args, args);

	tc_nsctl_args = n < 0 ? 0 : n;
	return n < 0 ? -1 : 0;
}

int
kv_tc_start_one_copy(kv_tc *c, const char *tag, int nservers)
{
	int rv;

	if (kv_tc_set_controller_args(KV_TC_ONE_COPY) != 0)
		return -1;
	rv = kv_tc_start(c, tag, nservers);
	kv_tc_set_controller_args(NULL);
	return rv;
}

static int
start_controller_proc(kv_tc *c)
{
	char *argv[14 + KV_TC_MAX_ARGS] = {"shardkv-controller", "--listen", c->ctl_url,
	                                   "--data-dir", c->ctl_data};
	size_t n = 5;
	if (tc_auth_file[0]) { /* auth: */
		argv[n++] = "--auth-token-file";
		argv[n++] = tc_auth_file;
	}
	tc_tls_args(argv, &n); /* tls: */
	for (int i = 0; i < c->nctl_args; i++)
		argv[n++] = c->ctl_args[i];
	c->ctl_pid = spawn(KV_CONTROLLER_BIN, argv, c->ctl_log);
	return c->ctl_pid > 0 ? 0 : -1;
}

/* kv_proc_ready_cb: the controller answers a status request. */
static int
controller_answers(void *arg)
{
	kv_tc *c = arg;
	shardkv_config *cfg = NULL;
	int rv = shardkv_status(c->admin, &cfg);

	shardkv_config_free(cfg);
	return rv == 0 ? 0 : 1;
}

/* Waits until the controller answers a status request. */
static int
wait_controller(kv_tc *c, unsigned ms)
{
	int rv;

	shardkv_set_timeout(c->admin, 500);
	rv = kv_proc_wait_ready(c->ctl_pid, ms, 20, controller_answers, c, NULL);
	shardkv_set_timeout(c->admin, ADMIN_TIMEOUT_MS);
	if (rv == KV_ECLOSED) {
		c->ctl_pid = 0;
		fprintf(stderr, "cluster: the controller exited at start\n");
	} else if (rv != 0) {
		fprintf(stderr, "cluster: the controller did not answer within %u ms\n", ms);
	}
	return rv == 0 ? 0 : -1;
}

int
kv_tc_create(kv_tc *c, const char *tag)
{
	return kv_tc_create_ex(c, tag, NULL);
}

int
kv_tc_create_ex(kv_tc *c, const char *tag, const char *const *server_args)
{
	shardkv_options o = {.timeout_ms = ADMIN_TIMEOUT_MS, .no_watch = true};

	tc_auth_opts(&o); /* auth: */
	memset(c, 0, sizeof(*c));
	if ((c->nargs = copy_args(c->args, server_args)) < 0) {
		c->nargs = 0;
		return -1;
	}
	memcpy(c->ctl_args, tc_sctl_args, sizeof(c->ctl_args));
	c->nctl_args = tc_nsctl_args;
	if (make_dir(c, tag) != 0)
		return -1;
	kv_test_free_url(c->ctl_url, sizeof(c->ctl_url));
	tc_tls_url(c->ctl_url, sizeof(c->ctl_url)); /* tls: */
	snprintf(c->ctl_data, sizeof(c->ctl_data), "%s/ctl", c->dir);
	snprintf(c->ctl_log, sizeof(c->ctl_log), "%s/ctl.log", c->dir);
	if (shardkv_open(c->ctl_url, &o, &c->admin) != 0)
		goto err;
	if (start_controller_proc(c) != 0 || wait_controller(c, KV_TC_READY_MS) != 0)
		goto err;
	return 0;
err:
	kv_tc_dump_logs(c, 30);
	kv_tc_destroy(c);
	return -1;
}

int
kv_tc_server_argv(kv_tc *c, int i, bool join, char **argv, size_t max)
{
	kv_tc_server *s = &c->srv[i];
	size_t n = 0;

	if (max < 8 + (size_t)s->nargs + 2 + (tc_tls_srv[2][0] ? 6 : 0))
		return -1;
	argv[n++] = KV_SERVER_BIN;
	argv[n++] = "--listen";
	argv[n++] = s->url;
	argv[n++] = "--controller";
	argv[n++] = c->ctl_url;
	argv[n++] = "--data-dir";
	argv[n++] = s->data;
	tc_tls_args(argv, &n); /* tls: */
	for (int k = 0; k < s->nargs; k++)
		argv[n++] = s->args[k];
	if (join)
		argv[n++] = "--join";
	argv[n] = NULL;
	return (int)n;
}

static int
start_server_proc(kv_tc *c, int i, bool join)
{
	kv_tc_server *s = &c->srv[i];
	char *argv[8 + KV_TC_MAX_ARGS + 2 + 6];

	if (kv_tc_server_argv(c, i, join, argv, sizeof(argv) / sizeof(argv[0])) < 0)
		return -1;
	argv[0] = "shardkv-server";
	s->pid = spawn(KV_SERVER_BIN, argv, s->log);
	return s->pid > 0 ? 0 : -1;
}

int
kv_tc_set_server_args(kv_tc *c, int i, const char *const *args)
{
	int n;

	if (i < 0 || i >= c->nservers || (n = copy_args(c->srv[i].args, args)) < 0)
		return -1;
	c->srv[i].nargs = n;
	return 0;
}

int
kv_tc_add_server(kv_tc *c, bool join)
{
	int i = c->nservers;
	kv_tc_server *s;

	if (i >= KV_TC_MAX_SERVERS)
		return -1;
	s = &c->srv[i];
	memset(s, 0, sizeof(*s));
	kv_test_free_url(s->url, sizeof(s->url));
	tc_tls_url(s->url, sizeof(s->url)); /* tls: */
	char dir[sizeof(c->dir)];
	memcpy(dir, c->dir, sizeof(dir));
	snprintf(s->data, sizeof(s->data), "%s/s%d", dir, i + 1);
	snprintf(s->log, sizeof(s->log), "%s/s%d.log", dir, i + 1);
	memcpy(s->args, c->args, sizeof(s->args));
	s->nargs = c->nargs;
	c->nservers++;
	if (start_server_proc(c, i, join) != 0)
		return -1;
	return i;
}

int
kv_tc_restart_server(kv_tc *c, int i, bool join)
{
	if (i < 0 || i >= c->nservers || c->srv[i].pid > 0)
		return -1;
	return start_server_proc(c, i, join);
}

int
kv_tc_wait_node_state(kv_tc *c, int i, int state, unsigned ms)
{
	uint64_t t0 = kv_test_now_ms();
	int last = 0;

	while (kv_test_now_ms() - t0 < ms) {
		shardkv_config *cfg = kv_tc_config(c);
		if (cfg) {
			for (size_t k = 0; k < cfg->nnodes; k++)
				if (strcmp(cfg->nodes[k].address, c->srv[i].url) == 0) {
					c->srv[i].id = cfg->nodes[k].id;
					last = cfg->nodes[k].state;
				}
			shardkv_config_free(cfg);
			if (last == state)
				return 0;
		}
		kv_test_sleep_ms(20);
	}
	fprintf(stderr, "cluster: server %d (%s) is %s, not %s, after %u ms\n", i, c->srv[i].url,
	        shardkv_node_state_name(last), shardkv_node_state_name(state), ms);
	return -1;
}

int
kv_tc_wait_settled(kv_tc *c, unsigned ms)
{
	uint64_t t0 = kv_test_now_ms();
	size_t last = 0;

	while (kv_test_now_ms() - t0 < ms) {
		shardkv_config *cfg = kv_tc_config(c);
		if (cfg) {
			last = cfg->nmigrations;
			shardkv_config_free(cfg);
			if (last == 0)
				return 0;
		}
		kv_test_sleep_ms(20);
	}
	fprintf(stderr, "cluster: %zu migrations still in flight after %u ms\n", last, ms);
	return -1;
}

/* Waits until server i is in the in-sync set of at least one range (owns
 * it, with one copy; with replicas, a backup joins the ISR once copied), or
 * holds nothing while every range has the controller's default three
 * replicas (a join adds the newcomer only to ranges short of replicas), and
 * nothing moves. */
static int
wait_owns_range(kv_tc *c, int i, unsigned ms)
{
	uint64_t t0 = kv_test_now_ms();

	while (kv_test_now_ms() - t0 < ms) {
		shardkv_config *cfg = kv_tc_config(c);
		bool ok = false;
		if (cfg) {
			bool full = cfg->nranges > 0;
			for (size_t r = 0; r < cfg->nranges; r++)
				full = full && cfg->ranges[r].nreplicas >= 3 &&
				       cfg->ranges[r].ninsync == cfg->ranges[r].nreplicas;
			ok = cfg->nmigrations == 0 &&
			     (kv_tc_ninsync_of(cfg, c->srv[i].id) > 0 || full);
			shardkv_config_free(cfg);
		}
		if (ok)
			return 0;
		kv_test_sleep_ms(20);
	}
	fprintf(stderr, "cluster: server %d is in sync for no range after %u ms\n", i, ms);
	return -1;
}

int
kv_tc_wait_in_sync(kv_tc *c, unsigned ms)
{
	uint64_t t0 = kv_test_now_ms();

	while (kv_test_now_ms() - t0 < ms) {
		shardkv_config *cfg = kv_tc_config(c);
		bool ok = cfg != NULL && cfg->nmigrations == 0;
		for (size_t r = 0; ok && r < cfg->nranges; r++)
			ok = cfg->ranges[r].ninsync == cfg->ranges[r].nreplicas &&
			     cfg->ranges[r].fence == 0;
		shardkv_config_free(cfg);
		if (ok)
			return 0;
		kv_test_sleep_ms(20);
	}
	fprintf(stderr, "cluster: ranges still out of sync or moving after %u ms\n", ms);
	return -1;
}

int
kv_tc_move(shardkv_client *admin, const char *start, size_t sl, const char *end, size_t el,
           const char *node, unsigned flags, shardkv_admin_result *res)
{
	uint64_t t0 = kv_test_now_ms();
	int rv;

	while ((rv = shardkv_move(admin, start, sl, end, el, node, 0, flags, res)) ==
	           SHARDKV_EBUSY &&
	       kv_test_now_ms() - t0 < KV_TC_READY_MS)
		kv_test_sleep_ms(20);
	return rv;
}

int
kv_tc_start(kv_tc *c, const char *tag, int nservers)
{
	return kv_tc_start_ex(c, tag, nservers, NULL);
}

/* Joins `nservers` servers one after the other, each waited for until it is
 * active, owns a range and nothing moves. On failure prints the logs and
 * destroys the cluster. Returns 0 or -1. */
static int
join_servers(kv_tc *c, int nservers)
{
	for (int k = 0; k < nservers; k++) {
		int i = kv_tc_add_server(c, true);
		if (i < 0 ||
		    kv_tc_wait_node_state(c, i, SHARDKV_NODE_ACTIVE, KV_TC_READY_MS) != 0 ||
		    wait_owns_range(c, i, KV_TC_READY_MS) != 0 ||
		    kv_tc_wait_in_sync(c, KV_TC_READY_MS) != 0) {
			kv_tc_dump_logs(c, 30);
			kv_tc_destroy(c);
			return -1;
		}
	}
	return 0;
}

int
kv_tc_start_ex(kv_tc *c, const char *tag, int nservers, const char *const *server_args)
{
	if (kv_tc_create_ex(c, tag, server_args) != 0)
		return -1;
	return join_servers(c, nservers);
}

int
kv_tc_start_replicated(kv_tc *c, const char *tag, int nctl, const char *const *ctl_args,
                       int nservers)
{
	if (kv_tc_create_replicated(c, tag, nctl, ctl_args) != 0)
		return -1;
	return join_servers(c, nservers);
}

int
kv_tc_stop_server(kv_tc *c, int i, int sig, unsigned ms, int *status)
{
	return stop(&c->srv[i].pid, sig, ms, status);
}

int
kv_tc_stop_controller(kv_tc *c, int sig, unsigned ms, int *status)
{
	return stop(&c->ctl_pid, sig, ms, status);
}

int
kv_tc_start_controller(kv_tc *c)
{
	if (c->ctl_pid > 0)
		return -1;
	if (start_controller_proc(c) != 0)
		return -1;
	return wait_controller(c, KV_TC_READY_MS);
}

/* ---------------------------------------------------------------------------
 * Replicated control plane
 * ------------------------------------------------------------------------- */

static char tc_ctl_args[KV_TC_MAX_ARGS][KV_TC_ARG_LEN]; /* extra controller flags */
static int tc_nctl_args;

int
kv_tc_start_replica(kv_tc *c, int k)
{
	char id[16], raft[KV_TC_MAX_CTLS * 33];
	char *argv[16 + KV_TC_MAX_ARGS];
	size_t n = 0;

	if (k < 0 || k >= c->nctl || c->rpid[k] > 0)
		return -1;
	raft[0] = 0;
	for (int i = 0; i < c->nctl; i++)
		snprintf(raft + strlen(raft), sizeof(raft) - strlen(raft), "%s%s", i ? "," : "",
		         c->rraft[i]);
	snprintf(id, sizeof(id), "%d", k + 1);
	argv[n++] = "shardkv-controller";
	argv[n++] = "--id";
	argv[n++] = id;
	argv[n++] = "--peers";
	argv[n++] = c->ctl_url;
	argv[n++] = "--raft-peers";
	argv[n++] = raft;
	argv[n++] = "--listen";
	argv[n++] = c->rurl[k];
	argv[n++] = "--data-dir";
	argv[n++] = c->rdata[k];
	for (int i = 0; i < tc_nctl_args; i++)
		argv[n++] = tc_ctl_args[i];
	argv[n] = NULL;
	c->rpid[k] = spawn(KV_CONTROLLER_BIN, argv, c->rlog[k]);
	return c->rpid[k] > 0 ? 0 : -1;
}

int
kv_tc_stop_replica(kv_tc *c, int k, int sig, unsigned ms)
{
	if (k < 0 || k >= c->nctl)
		return -1;
	return stop(&c->rpid[k], sig, ms, NULL);
}

int
kv_tc_wait_leader(kv_tc *c, unsigned ms)
{
	uint64_t t0 = kv_test_now_ms();

	while (kv_test_now_ms() - t0 < ms) {
		shardkv_config *cfg = NULL;
		if (shardkv_status(c->admin, &cfg) == 0) {
			for (size_t i = 0; i < cfg->ncontrollers; i++)
				if (strcmp(cfg->controllers[i].role, "leader") == 0 &&
				    cfg->controllers[i].id >= 1 &&
				    (int)cfg->controllers[i].id <= c->nctl &&
				    c->rpid[cfg->controllers[i].id - 1] > 0) {
					int k = (int)cfg->controllers[i].id - 1;
					shardkv_config_free(cfg);
					return k;
				}
		}
		shardkv_config_free(cfg);
		kv_test_sleep_ms(20);
	}
	fprintf(stderr, "cluster: no controller leader within %u ms\n", ms);
	return -1;
}

long long
kv_tc_replica_epoch(kv_tc *c, int k)
{
	shardkv_options o = {.timeout_ms = 1000, .no_watch = true};
	shardkv_client *cl = NULL;
	shardkv_config *cfg = NULL;
	long long e = -1;

	tc_auth_opts(&o); /* auth: */
	if (shardkv_open(c->rurl[k], &o, &cl) != 0)
		return -1;
	if (shardkv_config_get(cl, 0, &cfg) == 0)
		e = (long long)cfg->epoch;
	shardkv_config_free(cfg);
	shardkv_close(cl);
	return e;
}

/* A free port p whose neighbour is not needed: raft gets its own. */
static void
free_hostport(char *buf, size_t len)
{
	snprintf(buf, len, "127.0.0.1:%d", kv_test_free_port());
}

int
kv_tc_create_replicated(kv_tc *c, const char *tag, int nctl, const char *const *ctl_args)
{
	shardkv_options o = {.timeout_ms = ADMIN_TIMEOUT_MS, .no_watch = true};

	tc_auth_opts(&o); /* auth: */
	memset(c, 0, sizeof(*c));
	if (nctl < 1 || nctl > KV_TC_MAX_CTLS ||
	    (tc_nctl_args = copy_args(tc_ctl_args, ctl_args)) < 0) {
		tc_nctl_args = 0;
		return -1;
	}
	if (make_dir(c, tag) != 0)
		return -1;
	c->nctl = nctl;
	for (int k = 0; k < nctl; k++) {
		kv_test_free_url(c->rurl[k], sizeof(c->rurl[k]));
		free_hostport(c->rraft[k], sizeof(c->rraft[k]));
		snprintf(c->rdata[k], sizeof(c->rdata[k]), "%s/ctl%d", c->dir, k + 1);
		snprintf(c->rlog[k], sizeof(c->rlog[k]), "%s/ctl%d.log", c->dir, k + 1);
		snprintf(c->ctl_url + strlen(c->ctl_url), sizeof(c->ctl_url) - strlen(c->ctl_url),
		         "%s%s", k ? "," : "", c->rurl[k]);
	}
	if (shardkv_open(c->ctl_url, &o, &c->admin) != 0)
		goto err;
	for (int k = 0; k < nctl; k++)
		if (kv_tc_start_replica(c, k) != 0)
			goto err;
	if (kv_tc_wait_leader(c, KV_TC_READY_MS) < 0)
		goto err;
	return 0;
err:
	kv_tc_dump_logs(c, 30);
	kv_tc_destroy(c);
	return -1;
}

void
kv_tc_destroy(kv_tc *c)
{

	/* Servers first (SIGKILL: no drain starts), then the controller. */
	for (int i = 0; i < c->nservers; i++)
		if (c->srv[i].pid > 0)
			kv_tc_stop_server(c, i, SIGKILL, KV_TC_STOP_MS, NULL);
	shardkv_close(c->admin);
	c->admin = NULL;
	if (c->ctl_pid > 0)
		kv_tc_stop_controller(c, SIGTERM, KV_TC_STOP_MS, NULL);
	for (int k = 0; k < c->nctl; k++)
		if (c->rpid[k] > 0)
			kv_tc_stop_replica(c, k, SIGTERM, KV_TC_STOP_MS);
	if (c->dir[0] && getenv("KV_TC_KEEP") == NULL) {
		kv_test_rmtree(c->dir);
	} else if (c->dir[0]) {
		fprintf(stderr, "cluster: kept %s\n", c->dir);
	}
	c->dir[0] = 0;
}

void
kv_tc_dump_logs(const kv_tc *c, int lines)
{
	char cmd[700];

	if (c->dir[0] == 0)
		return;
	fflush(stdout);
	snprintf(cmd, sizeof(cmd), "tail -v -n %d '%s'/*.log >&2", lines, c->dir);
	if (system(cmd) != 0)
		fprintf(stderr, "(no logs in %s)\n", c->dir);
}

shardkv_client *
kv_tc_client(const kv_tc *c, bool no_watch, uint32_t timeout_ms)
{
	shardkv_options o = {.timeout_ms = timeout_ms, .no_watch = no_watch};
	shardkv_client *cl = NULL;

	tc_auth_opts(&o); /* auth: */
	if (shardkv_open(c->ctl_url, &o, &cl) != 0)
		return NULL;
	return cl;
}

shardkv_config *
kv_tc_config(kv_tc *c)
{
	shardkv_config *cfg = NULL;

	if (shardkv_config_get(c->admin, 0, &cfg) != 0)
		return NULL;
	return cfg;
}

/* memcmp order, a shorter prefix first. */
static int
key_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
	int r = memcmp(a, b, alen < blen ? alen : blen);
	if (r != 0)
		return r;
	return alen < blen ? -1 : alen > blen;
}

uint32_t
kv_tc_owner(const shardkv_config *cfg, const void *key, size_t klen)
{
	for (size_t r = 0; r < cfg->nranges; r++) {
		const shardkv_range *rg = &cfg->ranges[r];
		if (key_cmp(key, klen, rg->start.data, rg->start.len) < 0)
			continue;
		if (rg->end.len == 0 || key_cmp(key, klen, rg->end.data, rg->end.len) < 0)
			return rg->node;
	}
	return 0;
}

const shardkv_node *
kv_tc_node(const shardkv_config *cfg, uint32_t id)
{
	for (size_t i = 0; i < cfg->nnodes; i++)
		if (cfg->nodes[i].id == id)
			return &cfg->nodes[i];
	return NULL;
}

size_t
kv_tc_nranges_of(const shardkv_config *cfg, uint32_t id)
{
	size_t n = 0;
	for (size_t r = 0; r < cfg->nranges; r++)
		n += cfg->ranges[r].node == id;
	return n;
}

size_t
kv_tc_ninsync_of(const shardkv_config *cfg, uint32_t id)
{
	size_t n = 0;
	for (size_t r = 0; r < cfg->nranges; r++)
		for (size_t k = 0; k < cfg->ranges[r].ninsync; k++)
			n += cfg->ranges[r].insync[k] == id;
	return n;
}

void
kv_tc_node_arg(const kv_tc *c, int i, char *buf, size_t len)
{
	snprintf(buf, len, "%" PRIu32, c->srv[i].id);
}

/* ---------------------------------------------------------------------------
 * Numbered keys
 * ------------------------------------------------------------------------- */

size_t
kv_tc_key(char *buf, size_t len, const char *prefix, unsigned i)
{
	int n = snprintf(buf, len, "%s%06u", prefix, i);
	return n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
}

size_t
kv_tc_value(char *buf, size_t len, unsigned gen, unsigned i, size_t vlen)
{
	int n = snprintf(buf, len, "g%u-%u-", gen, i);
	size_t k = n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;

	while (k < vlen && k + 1 < len) {
		buf[k] = (char)('a' + (i + k) % 26);
		k++;
	}
	buf[k] = 0;
	return k;
}

#define BATCH    500
#define KEYLEN   64
#define VALUECAP 4096

int
kv_tc_fill(shardkv_client *cl, const char *prefix, unsigned n, unsigned gen, size_t vlen, char *msg,
           size_t msglen)
{
	shardkv_bytes *keys = calloc(BATCH, sizeof(*keys)), *vals = calloc(BATCH, sizeof(*vals));
	char *kb = malloc((size_t)BATCH * KEYLEN), *vb = malloc((size_t)BATCH * VALUECAP);
	int rv = 0;

	if (!keys || !vals || !kb || !vb) {
		rv = SHARDKV_ENOMEM;
		goto out;
	}
	for (unsigned base = 0; base < n && rv == 0; base += BATCH) {
		unsigned m = n - base < BATCH ? n - base : BATCH;
		shardkv_mput_result *res = NULL;
		for (unsigned j = 0; j < m; j++) {
			char *k = kb + (size_t)j * KEYLEN, *v = vb + (size_t)j * VALUECAP;
			keys[j] = (shardkv_bytes){k, kv_tc_key(k, KEYLEN, prefix, base + j)};
			vals[j] = (shardkv_bytes){v, kv_tc_value(v, VALUECAP, gen, base + j, vlen)};
		}
		rv = shardkv_mput(cl, m, keys, m, vals, &res);
		if (rv != 0)
			snprintf(msg, msglen, "mput of %s[%u..%u) gen %u: %s (%s)", prefix, base,
			         base + m, gen, shardkv_strerror(rv), shardkv_errmsg());
		shardkv_mput_result_free(res);
	}
out:
	free(keys);
	free(vals);
	free(kb);
	free(vb);
	return rv;
}

long
kv_tc_verify(shardkv_client *cl, const char *prefix, unsigned n, unsigned gen, size_t vlen,
             char *msg, size_t msglen)
{
	shardkv_bytes *keys = calloc(BATCH, sizeof(*keys));
	char *kb = malloc((size_t)BATCH * KEYLEN), want[VALUECAP];
	long bad = 0;

	msg[0] = 0;
	if (!keys || !kb) {
		bad = SHARDKV_ENOMEM;
		goto out;
	}
	for (unsigned base = 0; base < n; base += BATCH) {
		unsigned m = n - base < BATCH ? n - base : BATCH;
		shardkv_mget_result *res = NULL;
		for (unsigned j = 0; j < m; j++) {
			char *k = kb + (size_t)j * KEYLEN;
			keys[j] = (shardkv_bytes){k, kv_tc_key(k, KEYLEN, prefix, base + j)};
		}
		int rv = shardkv_mget(cl, m, keys, &res);
		if (rv != 0 && rv != SHARDKV_ENOTFOUND) {
			snprintf(msg, msglen, "mget of %s[%u..%u): %s (%s)", prefix, base, base + m,
			         shardkv_strerror(rv), shardkv_errmsg());
			bad = rv;
			goto out;
		}
		for (unsigned j = 0; j < m; j++) {
			size_t wl = kv_tc_value(want, sizeof(want), gen, base + j, vlen);
			const shardkv_buf *v = &res->values[j];
			if (v->data != NULL && v->len == wl && memcmp(v->data, want, wl) == 0)
				continue;
			if (bad++ == 0)
				snprintf(msg, msglen, "key %.*s: got %s%.40s%s, want %.40s",
				         (int)keys[j].len, (const char *)keys[j].data,
				         v->data ? "'" : "(missing)",
				         v->data ? (char *)v->data : "", v->data ? "'" : "", want);
		}
		shardkv_mget_result_free(res);
	}
out:
	free(keys);
	free(kb);
	return bad;
}

void
kv_tc_count_owners(const shardkv_config *cfg, const char *prefix, unsigned n, unsigned *counts,
                   size_t ncounts)
{
	char k[KEYLEN];

	memset(counts, 0, ncounts * sizeof(*counts));
	for (unsigned i = 0; i < n; i++) {
		size_t kl = kv_tc_key(k, sizeof(k), prefix, i);
		uint32_t o = kv_tc_owner(cfg, k, kl);
		if (o < ncounts)
			counts[o]++;
	}
}

int
kv_tc_spread(kv_tc *c, const char *prefix, unsigned n, const int *idx, int k)
{
	char s[KEYLEN], e[KEYLEN], node[16];
	size_t plen = strlen(prefix);

	for (int j = 0; j < k; j++) {
		size_t sl =
		    kv_tc_key(s, sizeof(s), prefix, (unsigned)((uint64_t)j * n / (unsigned)k));
		size_t el;
		if (j + 1 < k) {
			el = kv_tc_key(e, sizeof(e), prefix,
			               (unsigned)((uint64_t)(j + 1) * n / (unsigned)k));
		} else {
			/* The end of the prefix: its last byte plus one. */
			memcpy(e, prefix, plen);
			e[plen - 1]++;
			el = plen;
		}
		kv_tc_node_arg(c, idx[j], node, sizeof(node));
		/* With replicas a move to a replica outside the ISR (still being
		 * copied, or copied again after the last change of primary) is
		 * refused busy until it is in sync. */
		int rv = kv_tc_move(c->admin, s, sl, e, el, node, SHARDKV_WAIT, NULL);
		if (rv != 0) {
			fprintf(stderr, "cluster: move [%.*s, %.*s) to node %s: %s (%s)\n", (int)sl,
			        s, (int)el, e, node, shardkv_strerror(rv), shardkv_errmsg());
			return rv;
		}
	}
	return 0;
}

int
kv_tc_wait_status_keys(kv_tc *c, uint64_t keys, unsigned ms)
{
	uint64_t t0 = kv_test_now_ms(), last = 0;

	while (kv_test_now_ms() - t0 < ms) {
		shardkv_config *st = NULL;
		if (shardkv_status(c->admin, &st) == 0) {
			last = 0;
			for (size_t i = 0; i < st->nnodes; i++)
				if (st->nodes[i].state != SHARDKV_NODE_GONE)
					last += st->nodes[i].keys;
			shardkv_config_free(st);
			if (last == keys)
				return 0;
		}
		kv_test_sleep_ms(50);
	}
	fprintf(stderr, "cluster: status reports %" PRIu64 " keys, not %" PRIu64 ", after %u ms\n",
	        last, keys, ms);
	return -1;
}

int
kv_tc_wait_status_counts(kv_tc *c, const unsigned *counts, size_t ncounts, unsigned ms)
{
	uint64_t t0 = kv_test_now_ms();
	char last[256] = "";

	while (kv_test_now_ms() - t0 < ms) {
		shardkv_config *st = NULL;
		bool ok = false;
		if (shardkv_status(c->admin, &st) == 0) {
			size_t off = 0;
			ok = true;
			for (size_t id = 1; id < ncounts; id++) {
				const shardkv_node *n = kv_tc_node(st, (uint32_t)id);
				/* A gone node reports nothing any more; its last
				 * figures may be stale. */
				if (n && n->state == SHARDKV_NODE_GONE)
					continue;
				uint64_t have = n ? n->keys : 0;
				ok &= have == counts[id];
				if (n && off < sizeof(last))
					off += (size_t)snprintf(last + off, sizeof(last) - off,
					                        " node %zu: %" PRIu64 "/%u", id,
					                        have, counts[id]);
			}
			shardkv_config_free(st);
		}
		if (ok)
			return 0;
		kv_test_sleep_ms(50);
	}
	fprintf(stderr, "cluster: status keys (have/want):%s after %u ms\n", last, ms);
	return -1;
}

/* ---------------------------------------------------------------------------
 * Raw requests and migrations
 * ------------------------------------------------------------------------- */

/* Packs a Request with the single op `op` into a new message. */
static int
raw_pack(uint64_t client_id, Shardkv__Op *op, unsigned ms, nng_msg **out)
{
	Shardkv__Request rq = SHARDKV__REQUEST__INIT;
	Shardkv__Op *ops[1] = {op};
	size_t n;

	rq.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	rq.client_id = client_id;
	rq.request_id = op->request_id;
	rq.n_ops = 1;
	rq.ops = ops;
	rq.timeout_ms = ms;
	rq.auth_token = (ProtobufCBinaryData){strlen(tc_auth), (uint8_t *)tc_auth}; /* auth: */
	n = shardkv__request__get_packed_size(&rq);
	if (nng_msg_alloc(out, n) != 0)
		return SHARDKV_ENOMEM;
	shardkv__request__pack(&rq, nng_msg_body(*out));
	return 0;
}

/* Fills out from a decoded Response to a one-op request. */
static int
raw_result(const Shardkv__Response *r, kv_tc_raw_result *out)
{
	const Shardkv__OpResult *x;

	out->node_id = r->node_id;
	if (r->status != SHARDKV__STATUS__STATUS_OK) {
		out->status = kv_err_from_wire((int)r->status);
		return 0;
	}
	if (r->n_results != 1)
		return SHARDKV_EPROTO;
	x = r->results[0];
	out->status = kv_err_from_wire((int)x->status);
	out->value_len = x->value_len;
	out->value_unknown = x->value_unknown;
	if (x->owner)
		out->hint_node = x->owner->node_id;
	if (x->value.len || x->status == SHARDKV__STATUS__STATUS_OK) {
		if ((out->value.data = malloc(x->value.len + 1)) == NULL)
			return SHARDKV_ENOMEM;
		if (x->value.len)
			memcpy(out->value.data, x->value.data, x->value.len);
		out->value.data[x->value.len] = 0;
		out->value.len = x->value.len;
	}
	return 0;
}

int
kv_tc_raw_op(const char *url, uint64_t client_id, uint64_t request_id, kv_tc_raw_kind kind,
             const void *key, size_t klen, const void *val, size_t vlen, unsigned ms,
             kv_tc_raw_result *out)
{
	Shardkv__Op op = SHARDKV__OP__INIT;
	Shardkv__GetOp g = SHARDKV__GET_OP__INIT;
	Shardkv__PutOp p = SHARDKV__PUT_OP__INIT;
	Shardkv__AppendOp a = SHARDKV__APPEND_OP__INIT;
	Shardkv__DelOp d = SHARDKV__DEL_OP__INIT;
	ProtobufCBinaryData k = {klen, (uint8_t *)key}, v = {vlen, (uint8_t *)val};
	kv_rpc_client *cl = NULL;
	Shardkv__Response *r;
	nng_msg *req, *rep;
	int rv;

	memset(out, 0, sizeof(*out));
	op.request_id = request_id;
	switch (kind) {
	case KV_TC_RAW_GET:
		g.key = k;
		op.op_case = SHARDKV__OP__OP_GET;
		op.get = &g;
		break;
	case KV_TC_RAW_PUT:
		p.key = k;
		p.value = v;
		op.op_case = SHARDKV__OP__OP_PUT;
		op.put = &p;
		break;
	case KV_TC_RAW_APPEND:
		a.key = k;
		a.value = v;
		op.op_case = SHARDKV__OP__OP_APPEND;
		op.append = &a;
		break;
	case KV_TC_RAW_DEL:
		d.key = k;
		op.op_case = SHARDKV__OP__OP_DEL;
		op.del = &d;
		break;
	default:
		return SHARDKV_EINVAL;
	}
	/* A connection per call: these are rare, and nothing is left open. */
	if (kv_tls_url(url) && tc_tls == NULL) { /* tls: */
		kv_tls_files f = {.cert = tc_tls_cli[0][0] ? tc_tls_cli[0] : NULL,
		                  .key = tc_tls_cli[1][0] ? tc_tls_cli[1] : NULL,
		                  .ca = tc_tls_srv[2]};
		char terr[512];
		if ((rv = kv_tls_create(&f, false, &tc_tls, terr, sizeof(terr))) != 0) {
			fprintf(stderr, "cluster: %s\n", terr);
			return rv;
		}
	}
	if ((rv = kv_rpc_client_create_tls(url, tc_tls, &cl)) != 0)
		return rv;
	if ((rv = raw_pack(client_id, &op, ms, &req)) != 0) {
		kv_rpc_client_destroy(cl);
		return rv;
	}
	rv = kv_rpc_call(cl, req, &rep, ms);
	kv_rpc_client_destroy(cl);
	if (rv != 0)
		return rv;
	r = shardkv__response__unpack(NULL, nng_msg_len(rep), nng_msg_body(rep));
	nng_msg_free(rep);
	if (r == NULL)
		return SHARDKV_EPROTO;
	rv = raw_result(r, out);
	shardkv__response__free_unpacked(r, NULL);
	if (rv != 0)
		kv_tc_raw_free(out);
	return rv;
}

int
kv_tc_raw_pins(const char *url, unsigned ms, uint64_t *epoch, size_t *npins, char *start,
               size_t *start_len, char *end, size_t *end_len)
{
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminGetConfig g = SHARDKV__ADMIN_GET_CONFIG__INIT;
	Shardkv__AdminResponse *r;
	kv_rpc_client *cl = NULL;
	int rv;

	*epoch = 0;
	*npins = 0;
	*start_len = *end_len = 0;
	rq.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	rq.auth_token = (ProtobufCBinaryData){strlen(tc_auth), (uint8_t *)tc_auth}; /* auth: */
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_GET_CONFIG;
	rq.get_config = &g;
	if ((rv = kv_rpc_client_create(url, &cl)) != 0)
		return rv;
	r = ctl_client_call(cl, &rq, ms, &rv);
	kv_rpc_client_destroy(cl);
	if (r == NULL)
		return rv;
	if ((rv = ctl_client_err(r)) == 0 && r->config == NULL)
		rv = SHARDKV_EPROTO;
	if (rv == 0) {
		const Shardkv__Config *c = r->config;
		*epoch = c->epoch;
		*npins = c->n_pins;
		if (c->n_pins > 0) {
			*start_len = c->pins[0]->start.len < 64 ? c->pins[0]->start.len : 64;
			*end_len = c->pins[0]->end.len < 64 ? c->pins[0]->end.len : 64;
			if (*start_len)
				memcpy(start, c->pins[0]->start.data, *start_len);
			if (*end_len)
				memcpy(end, c->pins[0]->end.data, *end_len);
		}
	}
	ctl_client_free(r);
	return rv;
}

int
kv_tc_raw_join(const char *url, uint64_t client_id, uint64_t request_id, const char *address,
               unsigned ms, kv_tc_raw_admin *out)
{
	Shardkv__AdminRequest rq = SHARDKV__ADMIN_REQUEST__INIT;
	Shardkv__AdminJoin j = SHARDKV__ADMIN_JOIN__INIT;
	Shardkv__AdminResponse *r;
	kv_rpc_client *cl = NULL;
	int rv;

	memset(out, 0, sizeof(*out));
	rq.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	rq.client_id = client_id;
	rq.request_id = request_id;
	rq.auth_token = (ProtobufCBinaryData){strlen(tc_auth), (uint8_t *)tc_auth}; /* auth: */
	j.address = (char *)address;
	rq.cmd_case = SHARDKV__ADMIN_REQUEST__CMD_JOIN;
	rq.join = &j;
	if ((rv = kv_rpc_client_create(url, &cl)) != 0)
		return rv;
	r = ctl_client_call(cl, &rq, ms, &rv);
	kv_rpc_client_destroy(cl);
	if (r == NULL)
		return rv;
	out->not_leader = r->status == SHARDKV__STATUS__STATUS_NOT_LEADER;
	out->status = ctl_client_err(r);
	out->epoch = r->epoch;
	out->node_id = r->node_id;
	ctl_client_free(r);
	return 0;
}

void
kv_tc_raw_free(kv_tc_raw_result *r)
{
	free(r->value.data);
	r->value.data = NULL;
	r->value.len = 0;
}

int
kv_tc_wait_migration(kv_tc *c, uint64_t id, const char *phase, uint64_t min_keys, unsigned ms,
                     shardkv_migration *out)
{
	uint64_t t0 = kv_test_now_ms();
	char last[64] = "no status";

	while (kv_test_now_ms() - t0 < ms) {
		shardkv_config *st = NULL;
		const shardkv_migration *m = NULL;
		bool ok = false;
		if (shardkv_status(c->admin, &st) == 0) {
			for (size_t i = 0; i < st->nmigrations; i++)
				if (st->migrations[i].id == id)
					m = &st->migrations[i];
			if (m == NULL) {
				shardkv_config_free(st);
				fprintf(stderr, "cluster: migration %" PRIu64 " is not in flight\n",
				        id);
				return -1;
			}
			snprintf(last, sizeof(last), "%s with %" PRIu64 " keys", m->phase,
			         m->keys_copied);
			ok = strcmp(m->phase, phase) == 0 && m->keys_copied >= min_keys;
			if (ok && out) {
				*out = *m;
				out->start = out->end = (shardkv_buf){0};
			}
			shardkv_config_free(st);
		}
		if (ok)
			return 0;
		kv_test_sleep_ms(20);
	}
	fprintf(stderr,
	        "cluster: migration %" PRIu64 " is %s, not %s with %" PRIu64 " keys, after %u ms\n",
	        id, last, phase, min_keys, ms);
	return -1;
}

/* What kv_tc_wait_serving() polls. */
typedef struct {
	kv_tc *c;       /* the cluster */
	int i;          /* the server's index */
	char last[160]; /* its last answer, for the message */
} serving_wait;

/* kv_proc_ready_cb: server w->i answers a read of a key of its range. */
static int
server_serves(void *arg)
{
	serving_wait *w = arg;
	kv_tc_server *s = &w->c->srv[w->i];
	shardkv_config *cfg = kv_tc_config(w->c);
	const shardkv_range *own = NULL;

	if (cfg == NULL)
		return 1;
	for (size_t k = 0; k < cfg->nnodes; k++)
		if (strcmp(cfg->nodes[k].address, s->url) == 0)
			s->id = cfg->nodes[k].id;
	for (size_t r = 0; r < cfg->nranges && own == NULL; r++)
		if (s->id != 0 && cfg->ranges[r].node == s->id)
			own = &cfg->ranges[r];
	/* A key of the range: its start, or one zero byte. */
	char key[KEYLEN] = {0};
	size_t klen = 1;
	if (own && own->start.len > 0 && own->start.len <= sizeof(key)) {
		memcpy(key, own->start.data, own->start.len);
		klen = own->start.len;
	}
	shardkv_config_free(cfg);
	kv_tc_raw_result r;
	int rv = kv_tc_raw_op(s->url, 0, 0, KV_TC_RAW_GET, key, klen, NULL, 0, 1000, &r);
	bool ok = rv == 0 && (own == NULL || r.status == 0 || r.status == SHARDKV_ENOTFOUND ||
	                      r.status == SHARDKV_EMOVING);
	snprintf(w->last, sizeof(w->last), "%s",
	         rv != 0 ? shardkv_strerror(rv) : shardkv_strerror(r.status));
	kv_tc_raw_free(&r);
	return ok ? 0 : 1;
}

int
kv_tc_wait_serving(kv_tc *c, int i, unsigned ms)
{
	kv_tc_server *s = &c->srv[i];
	serving_wait w = {.c = c, .i = i, .last = "no answer yet"};
	int st = 0, rv;

	if (s->pid <= 0) {
		fprintf(stderr, "cluster: server %d is not running\n", i);
		return -1;
	}
	rv = kv_proc_wait_ready(s->pid, ms, 20, server_serves, &w, &st);
	if (rv == KV_ECLOSED) {
		s->pid = 0;
		fprintf(stderr, "cluster: server %d exited while starting (%s %d)\n", i,
		        WIFEXITED(st) ? "exit code" : "signal",
		        WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
		kv_tc_dump_logs(c, 30);
		return -1;
	}
	if (rv != 0) {
		fprintf(stderr, "cluster: server %d does not serve after %u ms (last answer: %s)\n",
		        i, ms, w.last);
		return -1;
	}
	return 0;
}

long
kv_tc_count_lines(const char *path, const char *needle)
{
	FILE *f = fopen(path, "r");
	char line[4096];
	long n = 0;

	if (f == NULL)
		return -1;
	while (fgets(line, sizeof(line), f) != NULL)
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

bool
kv_tc_wait_log_line(const char *path, const char *needle, unsigned ms)
{
	uint64_t t0 = kv_test_now_ms();

	for (;;) {
		if (kv_tc_count_lines(path, needle) > 0)
			return true;
		if (kv_test_now_ms() - t0 >= ms)
			return false;
		kv_test_sleep_ms(50);
	}
}

/* ---------------------------------------------------------------------------
 * Running a program
 * ------------------------------------------------------------------------- */

/* Appends n bytes to a growing NUL-terminated buffer. */
static int
grow_append(char **buf, size_t *len, size_t *cap, const char *p, size_t n)
{
	if (*len + n + 1 > *cap) {
		size_t nc = *cap ? *cap : 4096;
		while (*len + n + 1 > nc)
			nc *= 2;
		char *b = realloc(*buf, nc);
		if (b == NULL)
			return -1;
		*buf = b;
		*cap = nc;
	}
	memcpy(*buf + *len, p, n);
	*len += n;
	(*buf)[*len] = 0;
	return 0;
}

static int
pipe_cloexec(int fds[2])
{
	if (pipe(fds) != 0)
		return -1;
	fcntl(fds[0], F_SETFD, FD_CLOEXEC);
	fcntl(fds[1], F_SETFD, FD_CLOEXEC);
	return 0;
}

/* Whether `entry` (NAME=VALUE) names a variable that env sets. */
static bool
env_overridden(char *const env[], const char *entry)
{
	const char *eq = strchr(entry, '=');
	size_t n = eq ? (size_t)(eq - entry) : strlen(entry);

	for (size_t i = 0; env && env[i]; i++)
		if (strncmp(env[i], entry, n) == 0 && env[i][n] == '=')
			return true;
	return false;
}

int
kv_tc_run(char *const argv[], char *const env[], const void *in, size_t inlen, unsigned ms,
          kv_tc_run_result *r)
{
	int pin[2] = {-1, -1}, pout[2] = {-1, -1}, perr[2] = {-1, -1}, child_fds[3];
	size_t capo = 0, cape = 0, off = 0;
	uint64_t t0 = kv_test_now_ms();
	pid_t pid;
	char **envp = NULL;
	size_t nenv = 0;
	int st = 0;

	memset(r, 0, sizeof(*r));
	r->code = -1;
	install_cleanup();
	if (pipe_cloexec(pin) != 0 || pipe_cloexec(pout) != 0 || pipe_cloexec(perr) != 0)
		goto err;
	/* The environment is built before the fork: the child only calls
	 * async-signal-safe functions. */
	for (size_t i = 0; environ[i]; i++)
		nenv++;
	for (size_t i = 0; env && env[i]; i++)
		nenv++;
	if ((envp = calloc(nenv + 1, sizeof(*envp))) == NULL)
		goto err;
	nenv = 0;
	for (size_t i = 0; env && env[i]; i++)
		envp[nenv++] = env[i];
	for (size_t i = 0; environ[i]; i++)
		if (!env_overridden(env, environ[i]))
			envp[nenv++] = environ[i];
	child_fds[0] = pin[0];
	child_fds[1] = pout[1];
	child_fds[2] = perr[1];
	if ((pid = kv_proc_spawn_stdio(argv[0], argv, envp, child_fds)) < 0)
		goto err;
	free(envp);
	envp = NULL;
	close(pin[0]);
	close(pout[1]);
	close(perr[1]);
	pin[0] = pout[1] = perr[1] = -1;
	if (inlen == 0) {
		close(pin[1]);
		pin[1] = -1;
	}
	/* Feed stdin and drain stdout/stderr until both close or the deadline. */
	while (pout[0] >= 0 || perr[0] >= 0) {
		struct pollfd fds[3];
		int nf = 0, left = (int)ms - (int)(kv_test_now_ms() - t0);
		if (left <= 0) {
			kill(pid, SIGKILL);
			break;
		}
		if (pout[0] >= 0)
			fds[nf++] = (struct pollfd){.fd = pout[0], .events = POLLIN};
		if (perr[0] >= 0)
			fds[nf++] = (struct pollfd){.fd = perr[0], .events = POLLIN};
		if (pin[1] >= 0)
			fds[nf++] = (struct pollfd){.fd = pin[1], .events = POLLOUT};
		if (poll(fds, (nfds_t)nf, left) < 0 && errno != EINTR)
			break;
		for (int k = 0; k < nf; k++) {
			char buf[8192];
			if (fds[k].revents == 0)
				continue;
			if (fds[k].fd == pin[1]) {
				ssize_t w = write(pin[1], (const char *)in + off, inlen - off);
				if (w > 0)
					off += (size_t)w;
				if (w < 0 || off == inlen) {
					close(pin[1]);
					pin[1] = -1;
				}
				continue;
			}
			ssize_t n = read(fds[k].fd, buf, sizeof(buf));
			bool is_out = fds[k].fd == pout[0];
			if (n <= 0) {
				close(fds[k].fd);
				if (is_out)
					pout[0] = -1;
				else
					perr[0] = -1;
				continue;
			}
			if (is_out)
				grow_append(&r->out, &r->nout, &capo, buf, (size_t)n);
			else
				grow_append(&r->err, &r->nerr, &cape, buf, (size_t)n);
		}
	}
	for (int k = 0; k < 2; k++) {
		int *fd = k == 0 ? &pout[0] : &perr[0];
		if (*fd >= 0)
			close(*fd);
		*fd = -1;
	}
	if (pin[1] >= 0)
		close(pin[1]);
	if (reap(pid, ms, &st) != 0)
		st = SIGKILL; /* reported as killed below */
	if (WIFEXITED(st))
		r->code = WEXITSTATUS(st);
	else
		r->code = 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : SIGKILL);
	if (r->out == NULL)
		grow_append(&r->out, &r->nout, &capo, "", 0);
	if (r->err == NULL)
		grow_append(&r->err, &r->nerr, &cape, "", 0);
	return 0;
err:
	free(envp);
	for (int k = 0; k < 2; k++) {
		if (pin[k] >= 0)
			close(pin[k]);
		if (pout[k] >= 0)
			close(pout[k]);
		if (perr[k] >= 0)
			close(perr[k]);
	}
	return -1;
}

int
kv_tc_cliv(kv_tc_run_result *r, const char *url, char *const env[], const void *in, size_t inlen,
           unsigned ms, const char *arg, va_list ap)
{
	char *argv[KV_TC_CLI_MAX_ARGS + 4];
	int n = 0;

	argv[n++] = KV_CLI_BIN;
	if (url != NULL) {
		argv[n++] = "-c";
		argv[n++] = (char *)url;
	}
	for (const char *a = arg; a != NULL; a = va_arg(ap, const char *)) {
		if (n == KV_TC_CLI_MAX_ARGS + 3)
			return -1;
		argv[n++] = (char *)a;
	}
	argv[n] = NULL;
	return kv_tc_run(argv, env, in, inlen, ms, r);
}

int
kv_tc_cli(kv_tc_run_result *r, const char *url, char *const env[], const void *in, size_t inlen,
          unsigned ms, const char *arg, ...)
{
	va_list ap;
	int rv;

	va_start(ap, arg);
	rv = kv_tc_cliv(r, url, env, in, inlen, ms, arg, ap);
	va_end(ap);
	return rv;
}

void
kv_tc_run_free(kv_tc_run_result *r)
{
	free(r->out);
	free(r->err);
	r->out = r->err = NULL;
}
