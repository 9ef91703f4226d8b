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
 * The spare block. A block's memory is fresh: its first touch costs page
 * faults (a huge page zeroed at once; on a virtual machine, often the host's
 * faults too: about 20 ms a 2 MiB block on the 2-vCPU machine of
 * bench/README.md, from a first move's extra second and its requests' waits),
 * and the touch happens in kv_arena_alloc, under the partition's lock, where
 * every request for the partition waits for it. So an arena in use asks for
 * its next block ahead (kv_arena_wants_spare); the holder makes one after it
 * lets go of the lock (kv_arena_block_make: allocated and touched page by
 * page), hands it over
 * under the lock (kv_arena_spare_put), and the next growth takes it
 * without a fault. Where no spare is ready (a batch that outruns it, a
 * percore partition, a spare refused by the memory limit), the arena grows
 * as before, under the lock.
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
	/* What kv_arena_wants_spare reads after every write, together at the
	 * arena's start: the newest block's size is kept here, not read from
	 * the block's header, which is a cache miss once the block is in use. */
	void *spare;                           /* NULL or a touched block, charged, not in use */
	int spare_refused;                     /* the limit refused a spare: ask for none again */
	uint8_t *bcur;                         /* bump pointer in the newest block */
	uint8_t *bend;                         /* end of the newest block */
	size_t bsize;                          /* size of the newest block; 0: none yet */
	uint64_t carved;                       /* bytes of chunks handed out from runs */
	kv_arena_block *blocks;                /* every block, for kv_arena_fini */
	size_t next_block;                     /* size of the next block to allocate */
	_Atomic uint64_t *used;                /* store-wide bytes taken from the system */
	uint64_t limit;                        /* 0 or the most `*used` may reach */
	uint64_t self_bytes;                   /* bytes this arena took from the system */
	kv_arena_class cls[KV_ARENA_NCLASSES]; /* per size class state */
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

/* Returns whether the arena wants a spare block: it has none, the limit
 * has not refused one, and its newest block is filling: the first, small
 * one has a quarter of its bytes in chunks (its runs, a few KiB per size
 * class, take it whole long before it is full), a 2 MiB one has three
 * quarters carved into runs. A partition that holds less than 16 KiB never
 * has one. */
int kv_arena_wants_spare(const kv_arena *a);

/* Allocates a block of the size that kv_arena_spare_put takes and touches
 * every page of it; with no lock held. NULL when the system refuses. */
void *kv_arena_block_make(void);

/* Frees a block from kv_arena_block_make that no arena took. */
void kv_arena_block_free(void *block);

/* Makes `block` (from kv_arena_block_make) the arena's spare and charges
 * it: 0. KV_EEXISTS when it has one already, KV_ENOMEM when the limit
 * refuses it (the arena then asks for none again); the caller frees the
 * block. */
int kv_arena_spare_put(kv_arena *a, void *block);

/* Returns whether kv_arena_alloc(a, n) and kv_arena_alloc(a, m) give chunks
 * of the same size class (so an item can be rewritten in place). */
int kv_arena_same_class(size_t n, size_t m);

#endif
