/*
 * netns_util.c - see netns_util.h.
 *
 * Namespaces are made with `ip netns add` (so that `ip netns exec` and
 * `ip -n` find them) and removed the way `ip netns del` does it: the bind
 * mount under /run/netns is detached and the file unlinked, which a signal
 * handler can do too. The namespace dies with its last process; its veth
 * ends and the bridge go with it. Processes (ip, tc, the daemons) are
 * common/proc.h's: its exit paths kill them, then remove the namespaces
 * recorded here (the exit hook).
 */
#define _GNU_SOURCE /* setns */
#include "tests/support/netns_util.h"
#include "common/proc.h"
#include "tests/support/testutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define NETNS_DIR  "/run/netns"
#define NAME_PFX   "kvnn"
#define MAX_NS     16
#define MAX_ARGS   48
#define CMD_MS     15000u /* one ip or tc command */
#define BOGUS_MAC  "02:00:00:00:00:01"
#define LOSS_MATCH "0x0005" /* IP ids with these low 5 bits are dropped (1 in 32) */

static char ns_table[MAX_NS][48]; /* namespaces to remove on exit; "" free */

/* ---------------------------------------------------------------------------
 * Exit paths (async-signal-safe)
 * ------------------------------------------------------------------------- */

static void
ns_remove(const char *ns)
{
	char path[96];
	size_t dl = sizeof(NETNS_DIR) - 1, nl = strlen(ns);

	if (dl + 1 + nl + 1 > sizeof(path))
		return;
	memcpy(path, NETNS_DIR, dl);
	path[dl] = '/';
	memcpy(path + dl + 1, ns, nl + 1);
	umount2(path, MNT_DETACH);
	unlink(path);
}

/* Removes every recorded namespace: common/proc.h's exit hook, run after
 * the children are killed. Async-signal-safe. */
static void
ns_remove_all(void)
{
	for (int i = 0; i < MAX_NS; i++)
		if (ns_table[i][0]) {
			ns_remove(ns_table[i]);
			ns_table[i][0] = '\0';
		}
}

/* The exit paths of common/proc.h, which also remove the namespaces. */
static void
install_exit(void)
{
	kv_proc_install_exit_paths(NULL);
	kv_proc_set_exit_hook(ns_remove_all);
	signal(SIGPIPE, SIG_IGN);
}

static int
ns_record(const char *ns)
{
	for (int i = 0; i < MAX_NS; i++)
		if (!ns_table[i][0]) {
			snprintf(ns_table[i], sizeof(ns_table[i]), "%s", ns);
			return 0;
		}
	return -1;
}

static void
ns_forget(const char *ns)
{
	for (int i = 0; i < MAX_NS; i++)
		if (strcmp(ns_table[i], ns) == 0)
			ns_table[i][0] = '\0';
}

/* ---------------------------------------------------------------------------
 * Running programs
 * ------------------------------------------------------------------------- */

/* Returns the path of the iproute2 program `name`, or NULL. */
static const char *
tool_path(const char *name)
{
	static const char *const dirs[] = {"/usr/sbin", "/sbin", "/usr/bin", "/bin"};
	static char found[2][64];
	int slot = strcmp(name, "ip") == 0 ? 0 : 1;

	if (found[slot][0])
		return found[slot];
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		char p[64];
		snprintf(p, sizeof(p), "%s/%s", dirs[i], name);
		if (access(p, X_OK) == 0) {
			snprintf(found[slot], sizeof(found[slot]), "%s", p);
			return found[slot];
		}
	}
	return NULL;
}

/* Starts path with argv, output appended to log (NULL: discarded). Returns
 * the pid or -1. */
static pid_t
fork_exec(const char *path, char *const argv[], const char *log)
{
	install_exit();
	return kv_proc_spawn(path, argv, log);
}

/* Runs tool (ip or tc) with the NULL-terminated args in ap; quiet: output
 * discarded. Returns 0 when it exited 0. */
static int
vrun_tool(kv_nn *n, const char *tool, bool quiet, const char *arg, va_list ap)
{
	const char *path = tool_path(tool);
	char *argv[MAX_ARGS];
	int argc = 0, st;
	pid_t pid;

	if (path == NULL)
		return -1;
	argv[argc++] = (char *)tool;
	for (const char *a = arg; a != NULL; a = va_arg(ap, const char *)) {
		if (argc == MAX_ARGS - 1)
			return -1;
		argv[argc++] = (char *)a;
	}
	argv[argc] = NULL;
	if (n && n->log[0] && !quiet) {
		FILE *f = fopen(n->log, "a");
		if (f) {
			fprintf(f, "+");
			for (int i = 0; i < argc; i++)
				fprintf(f, " %s", argv[i]);
			fprintf(f, "\n");
			fclose(f);
		}
	}
	pid = fork_exec(path, argv, quiet || n == NULL || !n->log[0] ? NULL : n->log);
	if (pid < 0 || kv_proc_reap(pid, CMD_MS, &st) != 0)
		return -1;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static int __attribute__((sentinel)) run_tool(kv_nn *n, const char *tool, const char *arg, ...)
{
	va_list ap;
	int rv;

	va_start(ap, arg);
	rv = vrun_tool(n, tool, false, arg, ap);
	va_end(ap);
	return rv;
}

static int __attribute__((sentinel)) run_quiet(kv_nn *n, const char *tool, const char *arg, ...)
{
	va_list ap;
	int rv;

	va_start(ap, arg);
	rv = vrun_tool(n, tool, true, arg, ap);
	va_end(ap);
	return rv;
}

int
kv_nn_ip(kv_nn *n, const char *arg, ...)
{
	va_list ap;
	int rv;

	va_start(ap, arg);
	rv = vrun_tool(n, "ip", false, arg, ap);
	va_end(ap);
	return rv;
}

/* ---------------------------------------------------------------------------
 * The network
 * ------------------------------------------------------------------------- */

int
kv_nn_available(char *why, size_t len)
{
	char probe[48];

	if (geteuid() != 0) {
		snprintf(why, len, "needs root to make network namespaces (euid %u)",
		         (unsigned)geteuid());
		return -1;
	}
	if (tool_path("ip") == NULL || tool_path("tc") == NULL) {
		snprintf(why, len, "needs ip and tc (Debian package iproute2)");
		return -1;
	}
	snprintf(probe, sizeof(probe), NAME_PFX "%d-probe", (int)getpid());
	install_exit();
	ns_record(probe);
	if (run_quiet(NULL, "ip", "netns", "add", probe, NULL) != 0) {
		ns_remove(probe);
		ns_forget(probe);
		snprintf(why, len,
		         "`ip netns add` fails here (no CAP_SYS_ADMIN or no netns support)");
		return -1;
	}
	ns_remove(probe);
	ns_forget(probe);
	return 0;
}

/* Removes namespaces of our prefix whose test process is gone. */
static void
sweep_stale(void)
{
	DIR *d = opendir(NETNS_DIR);
	struct dirent *e;

	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		char *end;
		long pid;

		if (strncmp(e->d_name, NAME_PFX, sizeof(NAME_PFX) - 1) != 0)
			continue;
		pid = strtol(e->d_name + sizeof(NAME_PFX) - 1, &end, 10);
		if (end == e->d_name + sizeof(NAME_PFX) - 1 || *end != '-' || pid <= 0)
			continue;
		if (pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;
		fprintf(stderr, "netns: removing %s, left behind by process %ld\n", e->d_name, pid);
		ns_remove(e->d_name);
	}
	closedir(d);
}

int
kv_nn_create(kv_nn *n, const char *log)
{
	char lg[sizeof(n->log)];

	if (strlen(log) >= sizeof(lg))
		return -1;
	memcpy(lg, log, strlen(log) + 1); /* log may point into n */
	memset(n, 0, sizeof(*n));
	memcpy(n->log, lg, sizeof(lg));
	sweep_stale();
	snprintf(n->prefix, sizeof(n->prefix), NAME_PFX "%d", (int)getpid());
	snprintf(n->sw, sizeof(n->sw), "%s-sw", n->prefix);
	install_exit();
	if (ns_record(n->sw) != 0)
		return -1;
	if (run_tool(n, "ip", "netns", "add", n->sw, NULL) != 0 ||
	    run_tool(n, "ip", "-n", n->sw, "link", "add", "br0", "type", "bridge", NULL) != 0 ||
	    run_tool(n, "ip", "-n", n->sw, "link", "set", "br0", "up", NULL) != 0) {
		fprintf(stderr, "netns: cannot make the switch namespace %s (see %s)\n", n->sw,
		        n->log);
		kv_nn_destroy(n);
		return -1;
	}
	return 0;
}

int
kv_nn_add_host(kv_nn *n, const char *name, unsigned octet)
{
	kv_nn_host *h;
	char cidr[24];

	if (n->nhosts == KV_NN_MAX_HOSTS || strlen(name) > 8 || octet == 0 || octet > 254)
		return -1;
	h = &n->hosts[n->nhosts];
	memset(h, 0, sizeof(*h));
	snprintf(h->name, sizeof(h->name), "%s", name);
	snprintf(h->ns, sizeof(h->ns), NAME_PFX "%d-%s", (int)getpid(), name);
	snprintf(h->addr, sizeof(h->addr), KV_NN_SUBNET "%u", octet);
	snprintf(h->port, sizeof(h->port), "p%d", n->nhosts);
	snprintf(cidr, sizeof(cidr), "%s/24", h->addr);
	if (ns_record(h->ns) != 0)
		return -1;
	if (run_tool(n, "ip", "netns", "add", h->ns, NULL) != 0 ||
	    run_tool(n, "ip", "-n", n->sw, "link", "add", h->port, "type", "veth", "peer", "name",
	             "eth0", "netns", h->ns, NULL) != 0 ||
	    run_tool(n, "ip", "-n", n->sw, "link", "set", h->port, "master", "br0", NULL) != 0 ||
	    run_tool(n, "ip", "-n", n->sw, "link", "set", h->port, "up", NULL) != 0 ||
	    run_tool(n, "ip", "-n", h->ns, "addr", "add", cidr, "dev", "eth0", NULL) != 0 ||
	    run_tool(n, "ip", "-n", h->ns, "link", "set", "eth0", "up", NULL) != 0 ||
	    run_tool(n, "ip", "-n", h->ns, "link", "set", "lo", "up", NULL) != 0) {
		fprintf(stderr, "netns: cannot add host %s (see %s)\n", name, n->log);
		ns_remove(h->ns);
		ns_forget(h->ns);
		return -1;
	}
	return n->nhosts++;
}

void
kv_nn_destroy(kv_nn *n)
{
	for (int i = 0; i < n->nhosts; i++) {
		ns_remove(n->hosts[i].ns);
		ns_forget(n->hosts[i].ns);
	}
	if (n->sw[0]) {
		ns_remove(n->sw);
		ns_forget(n->sw);
	}
	n->nhosts = 0;
	n->sw[0] = '\0';
}

/* ---------------------------------------------------------------------------
 * Processes
 * ------------------------------------------------------------------------- */

pid_t
kv_nn_spawn(kv_nn *n, int h, char *const argv[], const char *log)
{
	const char *ip = tool_path("ip");
	char *full[MAX_ARGS];
	int k = 0;

	if (ip == NULL || h < 0 || h >= n->nhosts)
		return -1;
	full[k++] = (char *)"ip";
	full[k++] = (char *)"netns";
	full[k++] = (char *)"exec";
	full[k++] = n->hosts[h].ns;
	for (int i = 0; argv[i]; i++) {
		if (k == MAX_ARGS - 1)
			return -1;
		full[k++] = argv[i];
	}
	full[k] = NULL;
	/* ip netns exec execs the program in place: the pid stays the same. */
	return fork_exec(ip, full, log);
}

pid_t
kv_nn_spawn_here(char *const argv[], const char *log)
{
	return fork_exec(argv[0], argv, log);
}

bool
kv_nn_exited(pid_t pid, int *status)
{
	return kv_proc_exited(pid, status);
}

int
kv_nn_stop(pid_t pid, int sig, unsigned ms, int *status)
{
	return kv_proc_stop(pid, sig, ms, status) == 0 ? 0 : -1;
}

int
kv_nn_enter(kv_nn *n, int h)
{
	char path[96];
	int fd, rv;

	if (h < 0 || h >= n->nhosts)
		return -1;
	snprintf(path, sizeof(path), NETNS_DIR "/%s", n->hosts[h].ns);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return -1;
	rv = setns(fd, CLONE_NEWNET);
	close(fd);
	return rv == 0 ? 0 : -1;
}

/* ---------------------------------------------------------------------------
 * Faults
 * ------------------------------------------------------------------------- */

int
kv_nn_link(kv_nn *n, int h, bool up)
{
	if (h < 0 || h >= n->nhosts)
		return -1;
	return run_tool(n, "ip", "-n", n->sw, "link", "set", n->hosts[h].port, up ? "up" : "down",
	                NULL);
}

int
kv_nn_impair(kv_nn *n, int h, unsigned delay_ms, unsigned loss_pct, bool *degraded)
{
	kv_nn_host *x;
	char delay[24], loss[24];

	if (h < 0 || h >= n->nhosts || loss_pct > 100)
		return -1;
	x = &n->hosts[h];
	snprintf(delay, sizeof(delay), "%ums", delay_ms);
	snprintf(loss, sizeof(loss), "%u%%", loss_pct);
	if (!n->probed || n->has_netem) {
		int rv = run_tool(n, "tc", "-n", x->ns, "qdisc", "replace", "dev", "eth0", "root",
		                  "netem", "delay", delay, "loss", loss, NULL);
		if (!n->probed) {
			n->probed = true;
			n->has_netem = rv == 0;
		}
		if (rv == 0) {
			x->netem = true;
			if (degraded)
				*degraded = false;
			return 0;
		}
		if (n->has_netem)
			return -1;
	}
	/* No sch_netem: drop 1 packet in 32 by IP id (retransmissions get new
	 * ids, so no connection stalls for good), redirected to a veth that
	 * is down. No delay. */
	if (degraded)
		*degraded = true;
	if (run_quiet(n, "ip", "-n", x->ns, "link", "show", "sink0", NULL) != 0 &&
	    run_tool(n, "ip", "-n", x->ns, "link", "add", "sink0", "type", "veth", "peer", "name",
	             "sink1", NULL) != 0)
		return -1;
	if (run_tool(n, "tc", "-n", x->ns, "qdisc", "add", "dev", "eth0", "clsact", NULL) != 0)
		return -1;
	x->lossf = true;
	return run_tool(n, "tc", "-n", x->ns, "filter", "add", "dev", "eth0", "egress", "protocol",
	                "ip", "prio", "1", "u32", "match", "u16", LOSS_MATCH, "0x001f", "at", "4",
	                "action", "mirred", "egress", "redirect", "dev", "sink0", NULL);
}

int
kv_nn_heal_impair(kv_nn *n, int h)
{
	kv_nn_host *x;
	int rv = 0;

	if (h < 0 || h >= n->nhosts)
		return -1;
	x = &n->hosts[h];
	if (x->netem &&
	    run_tool(n, "tc", "-n", x->ns, "qdisc", "del", "dev", "eth0", "root", NULL) != 0)
		rv = -1;
	if (x->lossf &&
	    run_tool(n, "tc", "-n", x->ns, "qdisc", "del", "dev", "eth0", "clsact", NULL) != 0)
		rv = -1;
	x->netem = x->lossf = false;
	return rv;
}

/* Points (on) or resets host from's neighbour entry for host to. */
static int
neigh(kv_nn *n, int from, int to, bool on)
{
	kv_nn_host *f = &n->hosts[from], *t = &n->hosts[to];

	if (on)
		return run_tool(n, "ip", "-n", f->ns, "neigh", "replace", t->addr, "lladdr",
		                BOGUS_MAC, "dev", "eth0", "nud", "permanent", NULL);
	return run_tool(n, "ip", "-n", f->ns, "neigh", "del", t->addr, "dev", "eth0", NULL);
}

int
kv_nn_partition(kv_nn *n, int a, int b, bool on)
{
	int rv = 0;

	if (a < 0 || a >= n->nhosts || b < 0 || b >= n->nhosts || a == b)
		return -1;
	if (neigh(n, a, b, on) != 0)
		rv = -1;
	if (neigh(n, b, a, on) != 0)
		rv = -1;
	return rv;
}
