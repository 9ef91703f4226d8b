/*
 * mem.h - zeroed arrays through the allocator's per-thread cache.
 *
 * glibc's calloc (Debian 12's 2.36) never takes a chunk from the calling
 * thread's cache: every call goes to an arena under the arena's lock. On
 * the request path, a decoded request's arrays, a reply held for the log
 * and the backups, that was 2.4% of a server's samples under pipelined
 * writes at three copies (`_int_malloc` under `calloc`, bench/README.md).
 * kv_zalloc is malloc and memset: the same zeroed memory, from the
 * thread's cache when a chunk there fits.
 */
#ifndef KV_COMMON_MEM_H
#define KV_COMMON_MEM_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* n zeroed objects of size bytes, as calloc(n, size): NULL when out of
 * memory or when n * size overflows. Free with free(). */
static inline void *
kv_zalloc(size_t n, size_t size)
{
	void *p;

	if (size != 0 && n > SIZE_MAX / size)
		return NULL;
	if ((p = malloc(n * size)) != NULL) {
		/* Hides where p came from: gcc otherwise folds the malloc and
		 * memset back into a calloc. */
		__asm__("" : "+r"(p));
		memset(p, 0, n * size);
	}
	return p;
}

#endif
