/*
 * arena.c - size-class slab allocator of one partition (see arena.h).
 *
 * Invariant: every chunk handed out lies in one block of `blocks` (or is a
 * malloc'd large chunk), and a chunk on a free list is never also in use.
 * Work per call is O(1): a free-list pop, a bump, or one block allocation.
 *
 * What this module does not do: locking (its partition's holder is the only
 * user), item layout (art.h), or returning slab memory before kv_arena_fini.
 */
#include "shardserver/store/arena.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define KV_ARENA_MIN_BLOCK (64u * 1024u)
#define KV_ARENA_MAX_BLOCK (2u * 1024u * 1024u) /* a huge page: aligned, MADV_HUGEPAGE */
/* A partition's first block is KV_ARENA_MIN_BLOCK and every later one
 * KV_ARENA_MAX_BLOCK. So a partition that holds more than 64 KiB lives in
 * huge pages, where a write's walk down the tree to its leaf misses the TLB
 * far less (one node, puts 16 in flight per caller, 100,000 keys: 1.16x the
 * ops/s, bench/README.md), and a small one stays small. */
#define KV_ARENA_RUN       (16u * 1024u) /* bytes carved for a class at a time */
#define KV_ARENA_LARGE_HDR 16u           /* malloc bookkeeping we charge for */

struct kv_arena_block {
	kv_arena_block *next; /* older block */
	size_t size;          /* bytes including this header */
};

/* Maps a size to its class index and the class's chunk size. */
static inline unsigned
kv_arena__class(size_t n, size_t *csize)
{
	size_t sz;

	if (n <= 64) {
		sz = n < 8 ? 8 : (n + 1) & ~(size_t)1;
		*csize = sz;
		return (unsigned)(sz / 2 - 4); /* 0..28 */
	}
	if (n <= 512) {
		sz = (n + 15) & ~(size_t)15;
		*csize = sz;
		return (unsigned)(29 + (sz - 80) / 16); /* 29..56 */
	}
	sz = (n + 63) & ~(size_t)63;
	*csize = sz;
	return (unsigned)(57 + (sz - 576) / 64); /* 57..112 */
}

int
kv_arena_same_class(size_t n, size_t m)
{
	size_t a, b;

	if (n > KV_ARENA_MAX_SMALL || m > KV_ARENA_MAX_SMALL)
		return 0;
	return kv_arena__class(n, &a) == kv_arena__class(m, &b);
}

void
kv_arena_init(kv_arena *a, _Atomic uint64_t *used, uint64_t limit)
{
	memset(a, 0, sizeof(*a));
	a->next_block = KV_ARENA_MIN_BLOCK;
	a->used = used;
	a->limit = limit;
}

void
kv_arena_fini(kv_arena *a)
{
	kv_arena_block *b, *next;

	if (a == NULL)
		return;
	for (b = a->blocks; b != NULL; b = next) {
		next = b->next;
		atomic_fetch_sub_explicit(a->used, b->size, memory_order_relaxed);
		free(b);
	}
	a->blocks = NULL;
	a->bsize = 0;
	a->bcur = a->bend = NULL;
	if (a->spare != NULL) {
		atomic_fetch_sub_explicit(a->used, KV_ARENA_MAX_BLOCK, memory_order_relaxed);
		free(a->spare);
		a->spare = NULL;
	}
	a->self_bytes = 0;
}

/* Charges n bytes to the store-wide counter unless that passes the limit. */
static int
kv_arena__charge(kv_arena *a, size_t n)
{
	uint64_t prev = atomic_fetch_add_explicit(a->used, n, memory_order_relaxed);

	if (a->limit != 0 && prev + n > a->limit) {
		atomic_fetch_sub_explicit(a->used, n, memory_order_relaxed);
		return -1;
	}
	a->self_bytes += n;
	return 0;
}

static void
kv_arena__uncharge(kv_arena *a, size_t n)
{
	atomic_fetch_sub_explicit(a->used, n, memory_order_relaxed);
	a->self_bytes -= n;
}

/* Allocates `size` bytes (a multiple of a huge page) aligned and advised
 * as transparent huge pages; NULL when the system refuses. */
static void *
kv_arena__huge(size_t size)
{
	void *p;

	if (posix_memalign(&p, KV_ARENA_MAX_BLOCK, size) != 0)
		return NULL;
	(void)madvise(p, size, MADV_HUGEPAGE);
	return p;
}

/* Makes room for `need` bytes in the current block, allocating a new one. */
static int
kv_arena__grow(kv_arena *a, size_t need)
{
	size_t size = a->next_block;
	kv_arena_block *b;
	void *p;

	while (size < need + sizeof(kv_arena_block))
		size *= 2;
	if (size == KV_ARENA_MAX_BLOCK && a->spare != NULL) {
		p = a->spare; /* touched and charged already */
		a->spare = NULL;
		goto add;
	}
	if (kv_arena__charge(a, size) != 0) {
		/* Near the memory limit: the smallest block that holds the chunk. */
		size_t small = KV_ARENA_MIN_BLOCK;
		while (small < need + sizeof(kv_arena_block))
			small *= 2;
		if (small >= size || kv_arena__charge(a, small) != 0)
			return -1;
		size = small;
	}
	if (size >= KV_ARENA_MAX_BLOCK) {
		p = kv_arena__huge(size);
	} else {
		p = malloc(size);
	}
	if (p == NULL) {
		kv_arena__uncharge(a, size);
		return -1;
	}
add:
	b = p;
	b->next = a->blocks;
	b->size = size;
	a->blocks = b;
	a->bsize = size;
	/* Chunks start 16-aligned after the header. */
	a->bcur = (uint8_t *)p + ((sizeof(*b) + 15) & ~(size_t)15);
	a->bend = (uint8_t *)p + size;
	a->next_block = KV_ARENA_MAX_BLOCK;
	return 0;
}

int
kv_arena_wants_spare(const kv_arena *a)
{
	if (a->spare != NULL || a->spare_refused || a->bsize == 0)
		return 0;
	/* The first block: runs of a few size classes take it whole early. */
	if (a->bsize < KV_ARENA_MAX_BLOCK)
		return a->carved > a->bsize / 4;
	return (size_t)(a->bend - a->bcur) < a->bsize / 4;
}

void *
kv_arena_block_make(void)
{
	void *p = kv_arena__huge(KV_ARENA_MAX_BLOCK);

	if (p == NULL)
		return NULL;
	/* One write a page: every fault is taken here, none under a lock. */
	for (size_t off = 0; off < KV_ARENA_MAX_BLOCK; off += 4096)
		((volatile uint8_t *)p)[off] = 0;
	return p;
}

void
kv_arena_block_free(void *block)
{
	free(block);
}

int
kv_arena_spare_put(kv_arena *a, void *block)
{
	if (a->spare != NULL)
		return KV_EEXISTS;
	if (kv_arena__charge(a, KV_ARENA_MAX_BLOCK) != 0) {
		a->spare_refused = 1;
		return KV_ENOMEM;
	}
	a->spare = block;
	return KV_OK;
}

void *
kv_arena_alloc(kv_arena *a, size_t n)
{
	kv_arena_class *c;
	size_t csize, run;
	unsigned ci;
	void *p;

	if (n > KV_ARENA_MAX_SMALL) {
		if (kv_arena__charge(a, n + KV_ARENA_LARGE_HDR) != 0)
			return NULL;
		p = malloc(n);
		if (p == NULL)
			kv_arena__uncharge(a, n + KV_ARENA_LARGE_HDR);
		return p;
	}
	ci = kv_arena__class(n, &csize);
	c = &a->cls[ci];
	if (c->free != NULL) {
		p = c->free;
		memcpy(&c->free, p, sizeof(void *));
		return p;
	}
	if ((size_t)(c->end - c->cur) < csize) {
		/* A new run: a few KiB for small classes, at least 4 chunks. */
		run = csize * 4 > KV_ARENA_RUN ? csize * 4 : KV_ARENA_RUN;
		if ((size_t)(a->bend - a->bcur) < run) {
			/* Hand the rest of the block to this class rather than waste it. */
			if ((size_t)(a->bend - a->bcur) >= csize) {
				run = (size_t)(a->bend - a->bcur);
			} else if (kv_arena__grow(a, run) != 0) {
				return NULL;
			}
		}
		c->cur = a->bcur;
		c->end = a->bcur + run;
		a->bcur += run;
		/* Keep the block bump pointer 16-aligned for the next run. */
		a->bcur = (uint8_t *)(((uintptr_t)a->bcur + 15) & ~(uintptr_t)15);
		if (a->bcur > a->bend)
			a->bcur = a->bend;
	}
	p = c->cur;
	c->cur += csize;
	a->carved += csize;
	return p;
}

void
kv_arena_free(kv_arena *a, void *p, size_t n)
{
	size_t csize;
	unsigned ci;

	if (p == NULL)
		return;
	if (n > KV_ARENA_MAX_SMALL) {
		free(p);
		kv_arena__uncharge(a, n + KV_ARENA_LARGE_HDR);
		return;
	}
	ci = kv_arena__class(n, &csize);
	memcpy(p, &a->cls[ci].free, sizeof(void *));
	a->cls[ci].free = p;
}
