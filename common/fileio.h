/*
 * fileio.h - the small file helpers every on-disk format here needs: whole
 * writes and reads that retry short transfers and EINTR, directory fsyncs
 * that make a created or renamed file's entry durable, and the formatted
 * error message that names a file and offset. Errors come back as KV_E*
 * codes (kv_err_from_errno).
 */
#ifndef KV_COMMON_FILEIO_H
#define KV_COMMON_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

/* Writes vsnprintf(fmt, ...) into err (when err and errlen are set) and
 * returns rv, so that `return kv_errf(err, errlen, KV_EIO, "...")` both
 * explains and fails. */
int kv_errf(char *err, size_t errlen, int rv, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Writes all n bytes at the file offset. Returns 0 or a KV_E* code. */
int kv_write_all(int fd, const void *p, size_t n);

/* Writes all n bytes at offset off. Returns 0 or a KV_E* code. */
int kv_pwrite_all(int fd, const void *p, size_t n, uint64_t off);

/* Writes every byte of iov[0..n) (advancing iov in place). Returns 0 or a
 * KV_E* code. */
int kv_writev_all(int fd, struct iovec *iov, int n);

/* Reads exactly n bytes at offset off; a file that ends first is KV_EIO.
 * Returns 0 or a KV_E* code. */
int kv_pread_full(int fd, void *p, size_t n, uint64_t off);

/* fsyncs a directory, making entries created or renamed in it durable.
 * Returns 0 or a KV_E* code. */
int kv_fsync_dir(const char *dir);

/* fsyncs the parent of dir (best effort), so a newly created dir survives. */
void kv_fsync_parent(const char *dir);

#endif
