/*
 * proc.c - the process table of proc.h.
 *
 * `table` holds the pid of every child started and not yet reaped (0: a
 * free slot). Only the spawning thread writes it, and the exit paths read it
 * (atexit, or a signal handler on that thread or another one): a slot is a
 * single pid_t store, and a pid the handler reaps twice only fails with
 * ECHILD. The child side of a fork only makes async-signal-safe calls, since
 * the parent may have threads (nng's, the checker's clients).
 *
 * What it does not do: restart children, read their output (that is the
 * caller's, through the log or the descriptors of kv_proc_spawn_stdio), or
 * know what "ready" means for a daemon (kv_proc_wait_ready's callback does).
 */
#include "common/proc.h"
#include "common/err.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define POLL_MS    5     /* kv_proc_wait's polling interval */
#define MAX_FD_CAP 65536 /* descriptors closed in a child, at most */

static volatile pid_t table[KV_PROC_MAX]; /* children alive; 0: free slot */
static bool exit_paths;                   /* kv_proc_install_exit_paths ran */
static void (*volatile exit_hook)(void);  /* run by kv_proc_kill_all */

static uint64_t
now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void
sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000u, .tv_nsec = (long)(ms % 1000u) * 1000000L};
	nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------------------
 * The table and the exit paths
 * ------------------------------------------------------------------------- */

/* Records pid. Returns 0, or -1 when the table is full. */
static int
table_add(pid_t pid)
{
	for (int i = 0; i < KV_PROC_MAX; i++)
		if (table[i] == 0) {
			table[i] = pid;
			return 0;
		}
	return -1;
}

static void
table_del(pid_t pid)
{
	for (int i = 0; i < KV_PROC_MAX; i++)
		if (table[i] == pid)
			table[i] = 0;
}

void
kv_proc_kill_all(void)
{
	int saved = errno;

	for (int i = 0; i < KV_PROC_MAX; i++)
		if (table[i] > 0)
			kill(table[i], SIGKILL);
	for (int i = 0; i < KV_PROC_MAX; i++) {
		pid_t p = table[i];
		if (p > 0) {
			while (waitpid(p, NULL, 0) < 0 && errno == EINTR)
				;
			table[i] = 0;
		}
	}
	if (exit_hook)
		exit_hook();
	errno = saved;
}

void
kv_proc_die(int sig)
{
	kv_proc_kill_all();
	signal(sig, SIG_DFL);
	raise(sig);
}

void
kv_proc_install_exit_paths(void (*on_stop)(int sig))
{
	static const int fatal[] = {SIGHUP, SIGQUIT, SIGABRT, SIGSEGV, SIGBUS};
	struct sigaction sa;

	if (exit_paths)
		return;
	exit_paths = true;
	atexit(kv_proc_kill_all);
	memset(&sa, 0, sizeof(sa));
	sigemptyset(&sa.sa_mask);
	sa.sa_handler = kv_proc_die;
	for (size_t i = 0; i < sizeof(fatal) / sizeof(fatal[0]); i++)
		sigaction(fatal[i], &sa, NULL);
	if (on_stop)
		sa.sa_handler = on_stop;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
}

void
kv_proc_set_exit_hook(void (*hook)(void))
{
	exit_hook = hook;
}

/* ---------------------------------------------------------------------------
 * Starting
 * ------------------------------------------------------------------------- */

pid_t
kv_proc_spawn_stdio(const char *path, char *const argv[], char *const envp[], const int fds[3])
{
	static const int reset[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGPIPE};
	long open_max = sysconf(_SC_OPEN_MAX);
	int max_fd = open_max < 0 || open_max > MAX_FD_CAP ? MAX_FD_CAP : (int)open_max;
	char *const *env = envp ? envp : environ;
	pid_t parent = getpid(), pid;
	sigset_t none;

	kv_proc_install_exit_paths(NULL);
	sigemptyset(&none);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		if (getppid() != parent)
			_exit(126); /* the parent died before prctl */
		for (int k = 0; k < 3; k++) {
			if (fds[k] == k)
				fcntl(k, F_SETFD, 0); /* keep it across exec */
			else
				dup2(fds[k], k);
		}
		/* The parent's sockets, pipes and logs stay with the parent. */
		for (int k = 3; k < max_fd; k++)
			close(k);
		for (size_t i = 0; i < sizeof(reset) / sizeof(reset[0]); i++)
			signal(reset[i], SIG_DFL);
		sigprocmask(SIG_SETMASK, &none, NULL);
		execve(path, argv, env);
		_exit(127);
	}
	if (table_add(pid) != 0) {
		/* Never leave a child that the exit paths do not know. */
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		errno = EAGAIN;
		return -1;
	}
	return pid;
}

pid_t
kv_proc_spawn(const char *path, char *const argv[], const char *log)
{
	int null = open("/dev/null", O_RDONLY | O_CLOEXEC), out, e;
	pid_t pid = -1;

	if (null < 0)
		return -1;
	out = open(log ? log : "/dev/null", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (out >= 0) {
		int fds[3] = {null, out, out};
		pid = kv_proc_spawn_stdio(path, argv, NULL, fds);
	}
	e = errno;
	if (out >= 0)
		close(out);
	close(null);
	errno = e;
	return pid;
}

/* ---------------------------------------------------------------------------
 * Waiting and stopping
 * ------------------------------------------------------------------------- */

bool
kv_proc_exited(pid_t pid, int *status)
{
	int st = 0;
	pid_t r;

	if (status)
		*status = 0;
	if (pid <= 0)
		return true;
	while ((r = waitpid(pid, &st, WNOHANG)) < 0 && errno == EINTR)
		;
	if (r == 0)
		return false;
	table_del(pid);
	if (r == pid && status)
		*status = st;
	return true;
}

int
kv_proc_wait(pid_t pid, unsigned ms, int *status)
{
	uint64_t t0 = now_ms();

	if (pid <= 0)
		return KV_EINVAL;
	for (;;) {
		int st = 0;
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid) {
			table_del(pid);
			if (status)
				*status = st;
			return 0;
		}
		if (r < 0 && errno != EINTR) {
			table_del(pid);
			return KV_EINVAL;
		}
		if (now_ms() - t0 >= ms)
			return KV_ETIMEDOUT;
		sleep_ms(POLL_MS);
	}
}

int
kv_proc_reap(pid_t pid, unsigned ms, int *status)
{
	int rv = kv_proc_wait(pid, ms, status), st = 0;

	if (rv != KV_ETIMEDOUT)
		return rv;
	kill(pid, SIGKILL);
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	table_del(pid);
	if (status)
		*status = st;
	return KV_ETIMEDOUT;
}

int
kv_proc_stop(pid_t pid, int sig, unsigned ms, int *status)
{
	if (pid <= 0)
		return KV_EINVAL;
	kill(pid, sig);
	return kv_proc_reap(pid, ms, status);
}

void
kv_proc_stop_all(unsigned ms)
{
	uint64_t t0 = now_ms();

	for (int i = 0; i < KV_PROC_MAX; i++)
		if (table[i] > 0)
			kill(table[i], SIGTERM);
	for (int i = 0; i < KV_PROC_MAX; i++) {
		pid_t p = table[i];
		uint64_t used = now_ms() - t0;
		if (p > 0)
			kv_proc_reap(p, used < ms ? (unsigned)(ms - used) : 0, NULL);
	}
}

int
kv_proc_wait_ready(pid_t pid, unsigned ms, unsigned poll_ms, kv_proc_ready_cb *ready, void *arg,
                   int *status)
{
	uint64_t t0 = now_ms();

	for (;;) {
		int rv = ready(arg);
		if (rv <= 0)
			return rv;
		if (pid > 0 && kv_proc_exited(pid, status))
			return KV_ECLOSED;
		if (now_ms() - t0 >= ms)
			return KV_ETIMEDOUT;
		sleep_ms(poll_ms);
	}
}

/* ---------------------------------------------------------------------------
 * Ports and logs
 * ------------------------------------------------------------------------- */

/*
 * Free ports. A port the kernel hands out for bind(0) comes from the
 * ephemeral range (ip_local_port_range), the same range every outgoing
 * connection of every process on the machine takes its local port from: a
 * server stopped and restarted on the same address may find it held by some
 * client's connection in the meantime. So ports are taken from below that
 * range, where only explicit binds land, and each is claimed for the life of
 * this process by an flock on a file named after it, so that two processes
 * choosing at once (ctest -j) never get the same one. Where the range leaves
 * no room below it, bind(0) is the fallback.
 */
#define PORT_FLOOR 10000 /* lowest port handed out */
#define PORT_TRIES 256   /* candidates tried before the fallback */

static pthread_mutex_t port_mu = PTHREAD_MUTEX_INITIALIZER; /* protects port_next */
static unsigned port_next;                                  /* next candidate offset */

/* The lowest port of the ephemeral range, or 32768 if unreadable. */
static int
ephemeral_low(void)
{
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	int lo = 32768, hi;

	if (f != NULL) {
		if (fscanf(f, "%d %d", &lo, &hi) != 2 || lo < 1 || lo > 65535)
			lo = 32768;
		fclose(f);
	}
	return lo;
}

/* 0 if a listener could bind 127.0.0.1:port right now. */
static int
try_bind(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1, rv;

	if (fd < 0)
		return -1;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	rv = bind(fd, (struct sockaddr *)&a, sizeof(a));
	close(fd);
	return rv == 0 ? 0 : -1;
}

/* Claims port for this process's lifetime; 0 on success. */
static int
claim(int port)
{
	char dir[200], path[260];
	const char *tmp = getenv("TMPDIR");
	int fd;

	snprintf(dir, sizeof(dir), "%s/shardkv-ports", tmp != NULL && tmp[0] == '/' ? tmp : "/tmp");
	if (mkdir(dir, 01777) == 0)
		(void)chmod(dir, 01777); /* past the umask: shared by every user */
	else if (errno != EEXIST)
		return -1;
	snprintf(path, sizeof(path), "%s/%d", dir, port);
	fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
	if (fd < 0)
		return -1;
	if (flock(fd, LOCK_EX | LOCK_NB) != 0 || try_bind(port) != 0) {
		close(fd);
		return -1;
	}
	return 0; /* fd stays open: the claim lasts until this process exits */
}

static int
bind_any(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

	if (fd < 0)
		return -1;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

int
kv_proc_free_port(void)
{
	int lo = ephemeral_low(), span = lo - PORT_FLOOR;

	if (span < 1024)
		return bind_any();
	pthread_mutex_lock(&port_mu);
	if (port_next == 0) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		port_next = (unsigned)getpid() * 2654435761u ^ (unsigned)ts.tv_nsec;
	}
	for (int i = 0; i < PORT_TRIES; i++) {
		int port = PORT_FLOOR + (int)(port_next++ % (unsigned)span);
		if (claim(port) == 0) {
			pthread_mutex_unlock(&port_mu);
			return port;
		}
	}
	pthread_mutex_unlock(&port_mu);
	return bind_any();
}

int
kv_proc_free_url(char *buf, size_t len)
{
	int port = kv_proc_free_port(), n;

	if (port < 0)
		return -1;
	n = snprintf(buf, len, "tcp://127.0.0.1:%d", port);
	return n > 0 && (size_t)n < len ? 0 : -1;
}

void
kv_proc_print_log_tail(const char *path, int lines)
{
	FILE *f = fopen(path, "r");
	long pos;
	int seen = 0;
	char buf[1024];

	if (f == NULL)
		return;
	if (fseek(f, 0, SEEK_END) == 0 && (pos = ftell(f)) > 0) {
		/* Walk back over `lines` newlines, at most 64 KiB. */
		long lim = pos > 65536 ? pos - 65536 : 0;
		while (pos > lim && seen <= lines) {
			pos--;
			if (fseek(f, pos, SEEK_SET) != 0)
				break;
			if (fgetc(f) == '\n')
				seen++;
		}
		if (fseek(f, seen > lines ? pos + 1 : pos, SEEK_SET) != 0)
			rewind(f);
	}
	fprintf(stderr, "---- last lines of %s\n", path);
	while (fgets(buf, sizeof(buf), f))
		fputs(buf, stderr);
	fclose(f);
}
