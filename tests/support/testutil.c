/*
 * testutil.c - see testutil.h.
 */
#include "tests/support/testutil.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int
kv_test_free_port(void)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;

	if (fd < 0)
		return -1;
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	a.sin_port = 0;
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return port;
}

void
kv_test_free_url(char *buf, size_t len)
{
	snprintf(buf, len, "tcp://127.0.0.1:%d", kv_test_free_port());
}

uint64_t
kv_test_now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void
kv_test_sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000u, .tv_nsec = (long)(ms % 1000u) * 1000000L};
	nanosleep(&ts, NULL);
}

int
kv_test_dir_setup(void **state)
{
	kv_test_dir *d = calloc(1, sizeof(*d));

	if (d == NULL)
		return -1;
	snprintf(d->path, sizeof(d->path), "/tmp/kv_test_XXXXXX");
	if (mkdtemp(d->path) == NULL) {
		free(d);
		return -1;
	}
	*state = d;
	return 0;
}

int
kv_test_dir_teardown(void **state)
{
	kv_test_dir *d = *state;
	DIR *dd = opendir(d->path);
	struct dirent *e;

	if (dd != NULL) {
		while ((e = readdir(dd)) != NULL)
			if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
				unlinkat(dirfd(dd), e->d_name, 0);
		closedir(dd);
	}
	rmdir(d->path);
	free(d);
	return 0;
}

pid_t
kv_test_fork_exec(const char *path, char *const argv[], const char *log)
{
	pid_t parent = getpid(), pid = fork();

	if (pid != 0)
		return pid < 0 ? -1 : pid;
	int fd = open(log ? log : "/dev/null", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(126); /* the parent died before prctl */
	if (null >= 0)
		dup2(null, 0);
	if (fd >= 0) {
		dup2(fd, 1);
		dup2(fd, 2);
	}
	signal(SIGPIPE, SIG_DFL);
	execv(path, argv);
	_exit(127);
}
