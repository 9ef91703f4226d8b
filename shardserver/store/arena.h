/*
 * arena.h - the slab allocator of one store partition.
 *
 * Chunks are carved from blocks (a first one of 64 KiB, then 2 MiB ones
 * aligned and advised as transparent huge pages) in size classes: 2-byte steps up to 64
 * bytes, 16-byte steps up to 512, 64-byte steps up to 4096. Freed chunks go
 * to their class's free list and are reused by the same class; larger
 * allocations go to malloc. Chunk alignment: 2 bytes for odd-multiple-of-2
 * classes, 8 for classes that are multiples of 8, 16 above 64 bytes.
 *
 * An arena is not thread-safe: it belongs to one partition and is used under
 * that partition's lock (striped) or by its owner thread (percore). The only
 * shared state is the store-wide byte counter `used`, updated atomically per
 * block, never per chunk.
 *
 * Internal to shardserver/store/: only the store's own files (and its unit
 * tests) include this header; everything else includes store.h.
 */
#ifndef KV_SHARDSERVER_STORE_ARENA_H
#define KV_SHARDSERVER_STORE_ARENA_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define KV_ARENA_MAX_SMALL 4096u /* largest size served from slabs */
#define KV_ARENA_NCLASSES  113u  /* number of size classes up to KV_ARENA_MAX_SMALL */

typedef struct kv_arena_block kv_arena_block;

typedef struct {
	void *free;   /* singly linked free chunks (next pointer in the first 8 bytes) */
	uint8_t *cur; /* bump pointer in the current run */
	uint8_t *end; /* end of the current run */
} kv_arena_class;

typedef struct {
	kv_arena_class cls[KV_ARENA_NCLASSES]; /* per size class state */
	kv_arena_block *blocks;                /* every block, for kv_arena_fini */
	uint8_t *bcur;                         /* bump pointer in the newest block */
	uint8_t *bend;                         /* end of the newest block */
	size_t next_block;                     /* size of the next block to allocate */
	_Atomic uint64_t *used;                /* store-wide bytes taken from the system */
	uint64_t limit;                        /* 0 or the most `*used` may reach */
	uint64_t self_bytes;                   /* bytes this arena took from the system */
} kv_arena;

/* Prepares an empty arena that accounts into `*used` (not NULL) and fails
 * allocations that would take `*used` past `limit` (0: no limit). */
void kv_arena_init(kv_arena *a, _Atomic uint64_t *used, uint64_t limit);

/* Returns every block and large allocation to the system. Large allocations
 * still live must have been freed by the caller first. */
void kv_arena_fini(kv_arena *a);

/* Returns a chunk of at least n (>= 1) bytes, or NULL when the system or the
 * limit refuses. The caller frees it with kv_arena_free(a, p, n), same n. */
void *kv_arena_alloc(kv_arena *a, size_t n);

/* Returns a chunk obtained from kv_arena_alloc(a, n). Accepts NULL. */
void kv_arena_free(kv_arena *a, void *p, size_t n);

/* Returns whether kv_arena_alloc(a, n) and kv_arena_alloc(a, m) give chunks
 * of the same size class (so an item can be rewritten in place). */
int kv_arena_same_class(size_t n, size_t m);

#endif
