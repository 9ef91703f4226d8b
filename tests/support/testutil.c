/*
 * testutil.c - see testutil.h.
 */
#include "tests/support/testutil.h"
#include "common/proc.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

int
kv_test_free_port(void)
{
	return kv_proc_free_port();
}

void
kv_test_free_url(char *buf, size_t len)
{
	if (kv_proc_free_url(buf, len) != 0 && len > 0)
		buf[0] = 0;
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

	kv_test_rmtree(d->path);
	free(d);
	return 0;
}

const char *
kv_test_put_file(const kv_test_dir *d, const char *name, const void *p, size_t n, mode_t mode)
{
	static char path[320];
	int fd;
	bool ok;

	snprintf(path, sizeof(path), "%s/%s", d->path, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return NULL;
	ok = write(fd, p, n) == (ssize_t)n && fchmod(fd, mode) == 0;
	return close(fd) == 0 && ok ? path : NULL;
}

/* Removes everything in the directory open as dfd (taken; closed), which
 * is `path`, depth first, without following links. */
static void
rm_below(int dfd, const char *path)
{
	DIR *d = fdopendir(dfd);
	struct dirent *e;

	if (d == NULL) {
		close(dfd);
		return;
	}
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (unlinkat(dirfd(d), e->d_name, 0) == 0)
			continue;
		int sub =
		    openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub >= 0)
			rm_below(sub, e->d_name);
		if (unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) != 0)
			fprintf(stderr, "cannot remove %s/%s\n", path, e->d_name);
	}
	closedir(d);
}

void
kv_test_rmtree(const char *path)
{
	if (path == NULL || path[0] == 0)
		return;
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd >= 0)
		rm_below(fd, path);
	if (fd >= 0 ? rmdir(path) != 0 : unlink(path) != 0 && errno != ENOENT)
		fprintf(stderr, "cannot remove %s\n", path);
}

int
kv_test_stop_procs(void **state)
{
	(void)state;
	kv_proc_stop_all(KV_TEST_STOP_MS);
	return 0;
}
