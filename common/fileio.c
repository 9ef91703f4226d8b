/*
 * fileio.c - whole reads and writes, directory fsyncs and error messages
 * for the on-disk formats (fileio.h).
 */
#include "common/fileio.h"
#include "common/err.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int
kv_errf(char *err, size_t errlen, int rv, const char *fmt, ...)
{
	va_list ap;

	if (err && errlen) {
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return rv;
}

int
kv_write_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n > 0) {
		ssize_t w = write(fd, b, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return kv_err_from_errno(errno);
		}
		b += w;
		n -= (size_t)w;
	}
	return KV_OK;
}

int
kv_pwrite_all(int fd, const void *p, size_t n, uint64_t off)
{
	const uint8_t *b = p;

	while (n > 0) {
		ssize_t r = pwrite(fd, b, n, (off_t)off);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return kv_err_from_errno(errno);
		}
		b += r;
		n -= (size_t)r;
		off += (uint64_t)r;
	}
	return KV_OK;
}

int
kv_writev_all(int fd, struct iovec *iov, int n)
{
	int i = 0;

	while (i < n && iov[i].iov_len == 0)
		i++;
	while (i < n) {
		ssize_t r = writev(fd, iov + i, n - i);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return kv_err_from_errno(errno);
		}
		if (r == 0)
			return KV_EIO;
		while (r > 0 && i < n) {
			if ((size_t)r >= iov[i].iov_len) {
				r -= (ssize_t)iov[i].iov_len;
				i++;
			} else {
				iov[i].iov_base = (uint8_t *)iov[i].iov_base + r;
				iov[i].iov_len -= (size_t)r;
				r = 0;
			}
		}
		while (i < n && iov[i].iov_len == 0)
			i++;
	}
	return KV_OK;
}

int
kv_pread_full(int fd, void *p, size_t n, uint64_t off)
{
	uint8_t *b = p;

	while (n > 0) {
		ssize_t r = pread(fd, b, n, (off_t)off);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return kv_err_from_errno(errno);
		if (r == 0)
			return KV_EIO; /* the file is shorter than expected */
		b += r;
		n -= (size_t)r;
		off += (uint64_t)r;
	}
	return KV_OK;
}

int
kv_fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int rv = KV_OK;

	if (fd < 0)
		return kv_err_from_errno(errno);
	if (fsync(fd) != 0)
		rv = kv_err_from_errno(errno);
	close(fd);
	return rv;
}

void
kv_fsync_parent(const char *dir)
{
	char *p = strdup(dir), *slash;

	if (p == NULL)
		return;
	while ((slash = strrchr(p, '/')) != NULL && slash[1] == '\0' && slash != p)
		*slash = '\0'; /* trailing slashes */
	slash = strrchr(p, '/');
	if (slash == NULL) {
		(void)kv_fsync_dir(".");
	} else {
		slash[slash == p ? 1 : 0] = '\0';
		(void)kv_fsync_dir(p);
	}
	free(p);
}
