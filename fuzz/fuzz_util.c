/*
 * fuzz_util.c - shared helpers of the harnesses (fuzz_util.h).
 */
#include "fuzz/fuzz_util.h"
#include "common/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Durability is not under test: the readers' fsyncs cost a disk flush per
 * input on a real file system, so they succeed at once. */
int
fsync(int fd)
{
	(void)fd;
	return 0;
}

int
fdatasync(int fd)
{
	(void)fd;
	return 0;
}

__attribute__((weak)) void
fz_init(void)
{
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	kv_log_set_level(KV_LOG_OFF);
	fz_init();
	return 0;
}

volatile uint8_t fz_sink;

void
fz_touch(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint8_t x = 0;

	for (size_t i = 0; i < n; i++)
		x ^= b[i];
	fz_sink = x;
}

void
fz_tmpdir(char *path, size_t len)
{
	const char *base = getenv("KV_FUZZ_TMPDIR");

	if (base == NULL || base[0] == 0)
		base = "/tmp";
	FZ_CHECK((size_t)snprintf(path, len, "%s/kvfuzz-XXXXXX", base) < len);
	if (mkdtemp(path) == NULL) {
		fprintf(stderr, "fuzz: cannot make a temporary directory: %s\n", strerror(errno));
		abort();
	}
}

void
fz_rmdir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[512];

	if (d != NULL) {
		while ((e = readdir(d)) != NULL) {
			if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
				continue;
			snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
			unlink(p);
		}
		closedir(d);
	}
	if (rmdir(dir) != 0 && errno != ENOENT) {
		fprintf(stderr, "fuzz: cannot remove %s: %s\n", dir, strerror(errno));
		abort();
	}
}

void
fz_write_file(const char *dir, const char *name, const void *p, size_t n)
{
	char path[512];
	const uint8_t *b = p;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	FZ_CHECK(fd >= 0);
	while (n > 0) {
		ssize_t k = write(fd, b, n);
		if (k < 0 && errno == EINTR)
			continue;
		FZ_CHECK(k > 0);
		b += k;
		n -= (size_t)k;
	}
	close(fd);
}

int
fz_exists(const char *dir, const char *name)
{
	char path[512];
	struct stat st;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return stat(path, &st) == 0;
}

int
fz_split_args(const uint8_t *data, size_t size, const char *prog, char **buf, char **argv)
{
	int argc = 0;

	FZ_CHECK((*buf = malloc(size + 1)) != NULL);
	memcpy(*buf, data, size);
	(*buf)[size] = 0;
	argv[argc++] = (char *)prog;
	for (size_t i = 0; i <= size && argc <= FZ_MAX_ARGS;) {
		argv[argc++] = *buf + i;
		i += strlen(*buf + i) + 1;
	}
	argv[argc] = NULL;
	return argc;
}
