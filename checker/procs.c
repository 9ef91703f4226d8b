/*
 * procs.c - the cluster that `shardkv-checker --spawn DIR` starts: one
 * shardkv-controller and shardkv-server processes on free loopback ports,
 * each with its own data directory and log under DIR/run-XXXXXX.
 *
 * Every child is started through common/proc.h, whose process table (the
 * one mutable global besides the stop flag: the exit paths need it) atexit
 * and the fatal signal handlers empty with SIGKILL; every child has
 * PR_SET_PDEATHSIG, so no path leaves a daemon behind, not even SIGKILL of
 * the checker. Children are forked from the main thread only: the death
 * signal follows the thread that forked.
 */
#define _XOPEN_SOURCE 700 /* nftw */
#include "checker/checker.h"
#include "common/err.h"
#include "common/proc.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define STOP_MS  5000u  /* a daemon exits after SIGINT/SIGTERM */
#define HELP_MS  5000u  /* `shardkv-controller --help` answers */
#define READY_MS 20000u /* the controller answers */

_Static_assert(KV_PROC_MAX >= CHK_MAX_SERVERS + CHK_MAX_CTLS + 1,
               "common/proc.h's table holds every daemon of a run");

/* The first SIGINT/SIGTERM asks for an early end (the history is still
 * checked); a second one kills everything. */
static void
on_stop(int sig)
{
	if (chk_stop_requested)
		kv_proc_die(sig);
	chk_stop_requested = 1;
}

void
chk_install_signals(void)
{
	/* atexit and SIGHUP, SIGQUIT, SIGABRT, SIGSEGV, SIGBUS kill every
	 * child; SIGINT and SIGTERM go to on_stop. */
	kv_proc_install_exit_paths(on_stop);
}

static bool
is_exec(const char *dir, const char *name)
{
	char p[1100];
	snprintf(p, sizeof(p), "%s/%.60s", dir, name);
	return access(p, X_OK) == 0;
}

/* Finds the daemons: $SHARDKV_BIN_DIR, else the checker's directory. */
static int
find_bindir(chk_cluster *c)
{
	const char *env = getenv("SHARDKV_BIN_DIR");
	char self[1024];
	ssize_t n;

	if (env && strlen(env) >= sizeof(c->bindir) - 64) {
		fprintf(stderr, "checker: SHARDKV_BIN_DIR is too long\n");
		return -1;
	}
	if (env && env[0]) {
		snprintf(c->bindir, sizeof(c->bindir), "%s", env);
	} else {
		if ((n = readlink("/proc/self/exe", self, sizeof(self) - 64)) <= 0) {
			fprintf(stderr, "checker: cannot find my own path: %s\n", strerror(errno));
			return -1;
		}
		self[n] = 0;
		char *slash = strrchr(self, '/');
		if (slash)
			*slash = 0;
		memcpy(c->bindir, self, sizeof(c->bindir));
	}
	if (!is_exec(c->bindir, "shardkv-controller") || !is_exec(c->bindir, "shardkv-server")) {
		fprintf(stderr,
		        "checker: no shardkv-controller and shardkv-server in %s (set "
		        "SHARDKV_BIN_DIR)\n",
		        c->bindir);
		return -1;
	}
	return 0;
}

static int
start_controller(chk_cluster *c)
{
	char bin[1100], data[1100];
	snprintf(bin, sizeof(bin), "%s/shardkv-controller", c->bindir);
	snprintf(data, sizeof(data), "%s/ctl", c->dir);
	char *argv[] = {"shardkv-controller",
	                "--listen",
	                c->ctl_url,
	                "--data-dir",
	                data,
	                NULL,
	                NULL,
	                NULL,
	                NULL,
	                NULL};
	int n = 5;
	if (c->replicas[0]) {
		argv[n++] = "--replicas";
		argv[n++] = c->replicas;
	}
	if (c->split_bytes[0]) {
		argv[n++] = "--split-bytes";
		argv[n++] = c->split_bytes;
	}
	c->ctl_pid = kv_proc_spawn(bin, argv, c->ctl_log);
	return c->ctl_pid > 0 ? 0 : -1;
}

/* Starts controller replica k of a replicated control plane. */
static int
start_replica(chk_cluster *c, int k)
{
	char bin[1100], data[1100], id[16], raft[CHK_MAX_CTLS * 33] = "";

	for (int i = 0; i < c->nctl; i++)
		snprintf(raft + strlen(raft), sizeof(raft) - strlen(raft), "%s%s", i ? "," : "",
		         c->rraft[i]);
	snprintf(bin, sizeof(bin), "%s/shardkv-controller", c->bindir);
	snprintf(data, sizeof(data), "%s/ctl%d", c->dir, k + 1);
	snprintf(id, sizeof(id), "%d", k + 1);
	char *argv[] = {"shardkv-controller",
	                "--id",
	                id,
	                "--peers",
	                c->ctl_url,
	                "--raft-peers",
	                raft,
	                "--listen",
	                c->rurl[k],
	                "--data-dir",
	                data,
	                "--election-timeout",
	                "600",
	                NULL,
	                NULL,
	                NULL,
	                NULL,
	                NULL};
	int n = 13;
	if (c->replicas[0]) {
		argv[n++] = "--replicas";
		argv[n++] = c->replicas;
	}
	if (c->split_bytes[0]) {
		argv[n++] = "--split-bytes";
		argv[n++] = c->split_bytes;
	}
	c->rpid[k] = kv_proc_spawn(bin, argv, c->rlog[k]);
	c->rkilled[k] = false;
	return c->rpid[k] > 0 ? 0 : -1;
}

void
chk_cluster_kill_replica(chk_cluster *c, int k, uint64_t restart_ns)
{
	if (k < 0 || k >= c->nctl || c->rpid[k] <= 0)
		return;
	kill(c->rpid[k], SIGKILL);
	c->rkilled[k] = true;
	c->rrestart_ns[k] = restart_ns;
}

int
chk_cluster_restart_replicas(chk_cluster *c, bool now)
{
	int n = 0;

	for (int k = 0; k < c->nctl && c->nctl > 1; k++) {
		if (!c->rkilled[k])
			continue;
		if (c->rpid[k] > 0) { /* not reaped yet */
			if (!kv_proc_exited(c->rpid[k], NULL))
				continue;
			c->rpid[k] = 0;
		}
		if ((now || chk_now_ns() >= c->rrestart_ns[k]) && start_replica(c, k) == 0)
			n++;
	}
	return n;
}

/* What wait_controller() polls. */
typedef struct {
	chk_cluster *c;     /* the cluster */
	shardkv_client *cl; /* a client of its controller(s) */
} ctl_wait;

/* kv_proc_ready_cb: the controller answers (replicated: one leads); gives
 * up when it exited. */
static int
controller_answers(void *arg)
{
	ctl_wait *w = arg;
	shardkv_config *cfg = NULL;
	int rv = w->c->nctl > 1 ? shardkv_status(w->cl, &cfg) : shardkv_config_get(w->cl, 0, &cfg);

	shardkv_config_free(cfg);
	if (rv == 0)
		return 0;
	if (!chk_cluster_controller_alive(w->c)) {
		fprintf(stderr, "checker: the controller exited at start\n");
		kv_proc_print_log_tail(w->c->ctl_log, 20);
		return KV_ECLOSED;
	}
	return 1;
}

/* Polls until the controller answers (replicated: until one leads). */
static int
wait_controller(chk_cluster *c)
{
	shardkv_options o = {.timeout_ms = 500, .no_watch = true};
	ctl_wait w = {.c = c};
	int rv;

	if (shardkv_open(c->ctl_url, &o, &w.cl) != 0)
		return -1;
	rv = kv_proc_wait_ready(0, READY_MS, 20, controller_answers, &w, NULL);
	shardkv_close(w.cl);
	return rv == 0 ? 0 : -1;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw);

bool
chk_cluster_controller_accepts(chk_cluster *c, const char *opt)
{
	char bin[1100], out[1100], buf[16384];
	char *argv[] = {"shardkv-controller", "--help", NULL};
	bool found = false;
	int st = 0;

	if (c->dir[0] == 0)
		return false;
	snprintf(bin, sizeof(bin), "%s/shardkv-controller", c->bindir);
	snprintf(out, sizeof(out), "%s/ctl-help.txt", c->dir);
	pid_t pid = kv_proc_spawn(bin, argv, out);
	if (pid <= 0 || kv_proc_reap(pid, HELP_MS, &st) != 0)
		return false;
	FILE *f = fopen(out, "r");
	if (f == NULL)
		return false;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = 0;
	/* An option of the usage text: the name followed by a space, '=' or
	 * the end of a word. */
	size_t ol = strlen(opt);
	for (const char *p = strstr(buf, opt); p && !found; p = strstr(p + 1, opt))
		found = p[ol] == ' ' || p[ol] == '=' || p[ol] == '\n' || p[ol] == ']';
	remove(out);
	return found;
}

int
chk_cluster_create(chk_cluster *c, const char *dir, const char *fsync, const char *split_bytes,
                   unsigned nctl, unsigned replicas)
{
	memset(c, 0, sizeof(*c));
	if (split_bytes)
		snprintf(c->split_bytes, sizeof(c->split_bytes), "%s", split_bytes);
	c->nctl = nctl > 1 && nctl <= CHK_MAX_CTLS ? (int)nctl : 1;
	if (fsync)
		snprintf(c->fsync, sizeof(c->fsync), "%s", fsync);
	chk_install_signals();
	if (find_bindir(c) != 0)
		return -1;
	if (strlen(dir) > 900) {
		fprintf(stderr, "checker: --spawn directory name too long\n");
		return -1;
	}
	if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
		fprintf(stderr, "checker: mkdir %s: %s\n", dir, strerror(errno));
		return -1;
	}
	snprintf(c->dir, sizeof(c->dir), "%s/run-XXXXXX", dir);
	if (mkdtemp(c->dir) == NULL) {
		fprintf(stderr, "checker: mkdtemp %s: %s\n", c->dir, strerror(errno));
		c->dir[0] = 0;
		return -1;
	}
	snprintf(c->ctl_log, sizeof(c->ctl_log), "%s/ctl.log", c->dir);
	if (replicas > 0) {
		if (!chk_cluster_controller_accepts(c, "--replicas")) {
			fprintf(
			    stderr,
			    "checker: %s/shardkv-controller does not accept --replicas: ranges "
			    "have one copy in this build, so --replicas %u cannot be passed on\n",
			    c->bindir, replicas);
			nftw(c->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); /* nothing started */
			c->dir[0] = 0;
			return -2;
		}
		snprintf(c->replicas, sizeof(c->replicas), "%u", replicas);
	}
	if (c->nctl > 1) {
		for (int k = 0; k < c->nctl; k++) {
			char u[64];
			if (kv_proc_free_url(c->rurl[k], sizeof(c->rurl[k])) != 0 ||
			    kv_proc_free_url(u, sizeof(u)) != 0)
				return -1;
			snprintf(c->rraft[k], sizeof(c->rraft[k]), "%s", u + 6); /* HOST:PORT */
			snprintf(c->rlog[k], sizeof(c->rlog[k]), "%s/ctl%d.log", c->dir, k + 1);
			snprintf(c->ctl_url + strlen(c->ctl_url),
			         sizeof(c->ctl_url) - strlen(c->ctl_url), "%s%s", k ? "," : "",
			         c->rurl[k]);
		}
		for (int k = 0; k < c->nctl; k++)
			if (start_replica(c, k) != 0)
				return -1;
		if (wait_controller(c) != 0) {
			fprintf(
			    stderr,
			    "checker: the controllers did not elect a leader (logs %s/ctl*.log)\n",
			    c->dir);
			return -1;
		}
		return 0;
	}
	if (kv_proc_free_url(c->ctl_url, sizeof(c->ctl_url)) != 0 || start_controller(c) != 0 ||
	    wait_controller(c) != 0) {
		fprintf(stderr, "checker: the controller did not start (log %s)\n", c->ctl_log);
		return -1;
	}
	return 0;
}

static int
start_server(chk_cluster *c, int i, bool join)
{
	chk_server *s = &c->srv[i];
	char bin[1100];
	snprintf(bin, sizeof(bin), "%s/shardkv-server", c->bindir);
	char *argv[12] = {"shardkv-server", "--listen",   s->url, "--controller",
	                  c->ctl_url,       "--data-dir", s->data};
	int n = 7;
	if (c->fsync[0]) {
		argv[n++] = "--fsync";
		argv[n++] = c->fsync;
	}
	if (join)
		argv[n++] = "--join";
	argv[n] = NULL;
	s->pid = kv_proc_spawn(bin, argv, s->log);
	if (s->pid <= 0)
		return -1;
	s->state = CHK_SRV_RUNNING;
	return 0;
}

int
chk_cluster_add_server(chk_cluster *c, bool join)
{
	int i = c->nservers;
	chk_server *s;

	/* Reuse the slot of a server that exited as asked, so that long runs
	 * keep joining; slots of crashed servers keep their log path. */
	for (int k = 0; k < c->nservers; k++)
		if (c->srv[k].state == CHK_SRV_STOPPED && c->srv[k].pid == 0 &&
		    !c->srv[k].crashed) {
			i = k;
			break;
		}
	if (i >= CHK_MAX_SERVERS)
		return -1;
	s = &c->srv[i];
	memset(s, 0, sizeof(*s));
	if (kv_proc_free_url(s->url, sizeof(s->url)) != 0)
		return -1;
	char dir[sizeof(c->dir)];
	memcpy(dir, c->dir, sizeof(dir));
	c->nstarted++;
	snprintf(s->data, sizeof(s->data), "%s/s%d", dir, c->nstarted);
	snprintf(s->log, sizeof(s->log), "%s/s%d.log", dir, c->nstarted);
	if (i == c->nservers)
		c->nservers++;
	if (start_server(c, i, join) != 0) {
		s->state = CHK_SRV_STOPPED;
		return -1;
	}
	return i;
}

int
chk_cluster_restart_server(chk_cluster *c, int i)
{
	if (i < 0 || i >= c->nservers || c->srv[i].pid > 0)
		return -1;
	return start_server(c, i, false);
}

int
chk_cluster_start_server(chk_cluster *c, int i, bool join)
{
	if (i < 0 || i >= c->nservers || c->srv[i].pid > 0)
		return -1;
	return start_server(c, i, join);
}

int
chk_cluster_kill_server(chk_cluster *c, int i)
{
	if (i < 0 || i >= c->nservers || c->srv[i].pid <= 0)
		return -1;
	kill(c->srv[i].pid, SIGKILL);
	/* SIGKILL ends a stopped process too; the reap cannot time out
	 * unless the kernel is stuck. */
	kv_proc_reap(c->srv[i].pid, STOP_MS, &c->srv[i].exit_status);
	c->srv[i].pid = 0;
	return 0;
}

long
chk_cluster_server_syscall(chk_cluster *c, int i, const long *nrs, size_t n)
{
	char path[96], buf[128];
	struct dirent *e;
	long found = -1;
	DIR *dir;

	if (i < 0 || i >= c->nservers || c->srv[i].pid <= 0)
		return -1;
	int pid = (int)c->srv[i].pid;
	snprintf(path, sizeof(path), "/proc/%d/task", pid);
	if ((dir = opendir(path)) == NULL)
		return -1;
	while (found < 0 && (e = readdir(dir)) != NULL) {
		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%d/task/%.20s/syscall", pid, e->d_name);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t r = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (r <= 0)
			continue;
		buf[r] = 0;
		/* "NR ARGS... SP PC" inside a call; "running", or "-1 SP PC"
		 * outside one. */
		char *end;
		errno = 0;
		long nr = strtol(buf, &end, 10);
		if (errno != 0 || end == buf || *end != ' ')
			continue;
		for (size_t k = 0; k < n && found < 0; k++)
			if (nr == nrs[k])
				found = nr;
	}
	closedir(dir);
	return found;
}

bool
chk_cluster_server_listens(chk_cluster *c, int i)
{
	struct sockaddr_in sa = {.sin_family = AF_INET};
	char host[64];
	int port = 0, fd;
	bool ok;

	if (i < 0 || i >= c->nservers || c->srv[i].pid <= 0 ||
	    sscanf(c->srv[i].url, "tcp://%63[^:]:%d", host, &port) != 2 || port <= 0 ||
	    port > 65535 || inet_pton(AF_INET, host, &sa.sin_addr) != 1)
		return false;
	sa.sin_port = htons((uint16_t)port);
	if ((fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0)
		return false;
	/* Loopback: accepted into the backlog or refused at once. */
	ok = connect(fd, (const struct sockaddr *)&sa, sizeof(sa)) == 0;
	close(fd);
	return ok;
}

void
chk_cluster_signal(chk_cluster *c, int i, int sig)
{
	if (i >= 0 && i < c->nservers && c->srv[i].pid > 0)
		kill(c->srv[i].pid, sig);
}

bool
chk_cluster_poll_exit(chk_cluster *c, int i)
{
	chk_server *s = &c->srv[i];
	int st = 0;

	if (s->pid <= 0)
		return true;
	if (!kv_proc_exited(s->pid, &st))
		return false;
	s->pid = 0;
	s->exit_status = st;
	return true;
}

bool
chk_cluster_controller_alive(chk_cluster *c)
{
	int st = 0;

	if (c->nctl > 1) {
		/* Replicated: a replica that exits without being killed crashed. */
		bool any = false;
		for (int k = 0; k < c->nctl; k++) {
			if (c->rpid[k] <= 0 || c->rkilled[k]) {
				continue;
			}
			if (!kv_proc_exited(c->rpid[k], &st)) {
				any = true;
				continue;
			}
			c->rpid[k] = 0;
			c->ctl_crashed = true;
		}
		return any && !c->ctl_crashed;
	}
	if (c->ctl_pid <= 0)
		return false;
	if (!kv_proc_exited(c->ctl_pid, &st))
		return true;
	c->ctl_pid = 0;
	c->ctl_crashed = true;
	return false;
}

static int
rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	(void)ftw;
	remove(path); /* best effort: keep going */
	return 0;
}

int
chk_cluster_wipe_server(chk_cluster *c, int i)
{
	if (i < 0 || i >= c->nservers || c->srv[i].pid > 0 || c->srv[i].data[0] == 0)
		return -1;
	if (nftw(c->srv[i].data, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 && errno != ENOENT)
		return -1;
	if (access(c->srv[i].data, F_OK) == 0)
		return -1;
	/* A new node gets a new address: the old node keeps its own in the
	 * configuration until it is removed. */
	return kv_proc_free_url(c->srv[i].url, sizeof(c->srv[i].url)) == 0 ? 0 : -1;
}

void
chk_cluster_destroy(chk_cluster *c, bool remove)
{
	for (int i = 0; i < c->nservers; i++)
		if (c->srv[i].pid > 0) {
			/* A server stopped by --pause would not see SIGINT. */
			kill(c->srv[i].pid, SIGCONT);
			kill(c->srv[i].pid, SIGINT);
		}
	for (int i = 0; i < c->nservers; i++)
		if (c->srv[i].pid > 0) {
			kv_proc_reap(c->srv[i].pid, STOP_MS, NULL);
			c->srv[i].pid = 0;
		}
	if (c->ctl_pid > 0) {
		kill(c->ctl_pid, SIGTERM);
		kv_proc_reap(c->ctl_pid, STOP_MS, NULL);
		c->ctl_pid = 0;
	}
	for (int k = 0; k < c->nctl && c->nctl > 1; k++)
		if (c->rpid[k] > 0)
			kill(c->rpid[k], c->rkilled[k] ? SIGKILL : SIGTERM);
	for (int k = 0; k < c->nctl && c->nctl > 1; k++)
		if (c->rpid[k] > 0) {
			kv_proc_reap(c->rpid[k], STOP_MS, NULL);
			c->rpid[k] = 0;
		}
	if (remove && c->dir[0])
		nftw(c->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}
