/*
 * art.h - an adaptive radix tree (ART) over byte-string keys, the ordered
 * index of one store partition, and the item format its leaves point to.
 *
 * Inner nodes have 4, 16, 48 or 256 child slots and grow or shrink one step
 * at a time, so every insert or delete does work bounded by one node copy
 * (at most 256 slots): there is never a whole-table rehash. Paths with one
 * child are compressed into node prefixes (8 bytes stored, longer ones checked
 * against the leaf). A key that ends inside the tree (a proper prefix of
 * other keys) hangs from the node where it ends, as that node's `term` leaf.
 *
 * Item layout, one allocation per key:
 *
 *   | varint klen | varint vlen | key bytes | value bytes |
 *
 * (LEB128 varints; 1 byte each below 128.) Items are at least 2-aligned so a
 * child pointer tags a leaf with its low bit.
 *
 * A tree is not thread-safe; the store serialises access per partition.
 *
 * Internal to shardserver/store/: only the store's own files (and its unit
 * tests) include this header; everything else includes store.h.
 */
#ifndef KV_SHARDSERVER_STORE_ART_H
#define KV_SHARDSERVER_STORE_ART_H

#include "common/key.h"
#include "shardserver/store/arena.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
	void *root;           /* tagged pointer: NULL, a leaf, or an inner node */
	uint64_t index_bytes; /* bytes of inner nodes, for statistics */
	uint64_t nlarge;      /* items allocated outside the slabs */
} kv_art;

/* Returns the bytes an item with these lengths takes. */
static inline size_t
kv_item_varint_len(size_t v)
{
	return v < 128u ? 1 : v < 16384u ? 2 : v < 2097152u ? 3 : v < 268435456u ? 4 : 5;
}

static inline size_t
kv_item_size(size_t klen, size_t vlen)
{
	return kv_item_varint_len(klen) + kv_item_varint_len(vlen) + klen + vlen;
}

/* Writes only the two length varints; returns their size. */
size_t kv_item_write_header(uint8_t *mem, size_t klen, size_t vlen);

/* Writes an item into `mem` (kv_item_size bytes). Copies key and value. */
void kv_item_write(uint8_t *mem, const void *key, size_t klen, const void *val, size_t vlen);

/* Decodes an item; the pointers point into the item. */
static inline void
kv_item_parse(const uint8_t *it, const uint8_t **key, size_t *klen, const uint8_t **val,
              size_t *vlen)
{
	size_t v, shift;
	const uint8_t *p = it;

	if (p[0] < 128u && p[1] < 128u) {
		*klen = p[0];
		*vlen = p[1];
		p += 2;
	} else {
		v = 0;
		shift = 0;
		while (*p & 0x80u) {
			v |= (size_t)(*p++ & 0x7fu) << shift;
			shift += 7;
		}
		v |= (size_t)(*p++) << shift;
		*klen = v;
		v = 0;
		shift = 0;
		while (*p & 0x80u) {
			v |= (size_t)(*p++ & 0x7fu) << shift;
			shift += 7;
		}
		v |= (size_t)(*p++) << shift;
		*vlen = v;
	}
	*key = p;
	*val = p + *klen;
}

/* Returns the total size of an item (what kv_item_size gave at creation). */
static inline size_t
kv_item_total(const uint8_t *it)
{
	const uint8_t *k, *v;
	size_t kl, vl;

	kv_item_parse(it, &k, &kl, &v, &vl);
	return (size_t)(v - it) + vl;
}

/*
 * A leaf word: what a child slot or term holds for a key. Either an item
 * pointer with the low bit set, or, when the key is fully implied by the
 * path to the slot and the value has at most KV_ART_INLINE_MAX bytes, the
 * value itself (bit 63 set, length in bits 56..62, bytes 1..6). Inline leaves
 * are the "combined pointer/value slots" of the ART paper: no item, no second
 * cache miss.
 */
typedef uintptr_t kv_leaf;

#define KV_ART_INLINE_MAX 6u

/* A visited entry; pointers are valid until the tree changes (inline keys
 * until the iterator moves). */
typedef struct {
	const uint8_t *key; /* the key */
	size_t klen;        /* its length */
	const uint8_t *val; /* the value */
	size_t vlen;        /* its length */
} kv_art_entry;

/* Initialises an empty tree. */
void kv_art_init(kv_art *t);

/* Finds key; on true *val points at its value (valid until the next change). */
bool kv_art_find(const kv_art *t, const uint8_t *key, size_t klen, const uint8_t **val,
                 size_t *vlen);

/*
 * Inserts or overwrites key with a copy of val, in place when the old item's
 * size class allows. Sets *existed and *old_vlen (value length before).
 * Returns 0, or KV_ENOMEM with the tree unchanged.
 */
int kv_art_upsert(kv_art *t, kv_arena *a, const uint8_t *key, size_t klen, const uint8_t *val,
                  size_t vlen, bool *existed, size_t *old_vlen);

/* Most descents kv_art_prefetch interleaves. */
#define KV_ART_PREFETCH_MAX 16u

/*
 * Walks down trees[i] along keys[i] for up to KV_ART_PREFETCH_MAX keys at
 * once, one level of every key per round, prefetching each node and leaf
 * item on the way (every line of an item, its length read from its first): the cache misses of
 * different keys overlap, so the inserts or lookups that follow find their paths in cache. Changes
 * nothing; the caller holds each tree as it would for a lookup.
 */
void kv_art_prefetch(const kv_art *const *trees, const uint8_t *const *keys, const size_t *klens,
                     size_t n);

/* Removes key. Returns whether it was there; *old_vlen gets its value length. */
bool kv_art_remove(kv_art *t, kv_arena *a, const uint8_t *key, size_t klen, size_t *old_vlen);

/*
 * Leaves for all-or-nothing batches: make leaves first (the only step that
 * needs item memory), then put them; a put returns the replaced leaf without
 * freeing it, so a failed batch can put the old leaves back.
 */

/* Makes an item leaf holding a copy of key and value. Returns 0 or KV_ENOMEM. */
int kv_art_leaf_new(kv_art *t, kv_arena *a, const uint8_t *key, size_t klen, const uint8_t *val,
                    size_t vlen, kv_leaf *out);

/* Frees a leaf that is in no tree. Accepts 0. */
void kv_art_leaf_free(kv_art *t, kv_arena *a, kv_leaf l);

/* Returns the value length of a leaf (0 for 0). */
size_t kv_art_leaf_vlen(kv_leaf l);

/*
 * Puts `leaf` (from kv_art_leaf_new, or an old leaf of the same key) at key.
 * On 0 the tree owns it and *old is the replaced leaf (or 0), now the
 * caller's. Returns KV_ENOMEM with nothing changed when a node cannot be
 * allocated; replacing an existing key never allocates unless an inline old
 * leaf has to go where only items may.
 */
int kv_art_put_leaf(kv_art *t, kv_arena *a, const uint8_t *key, size_t klen, kv_leaf leaf,
                    kv_leaf *old);

/* Removes key and returns its leaf (now the caller's), or 0 when absent. */
kv_leaf kv_art_take(kv_art *t, kv_arena *a, const uint8_t *key, size_t klen);

/* Frees every large item (slab memory goes with the arena). */
void kv_art_clear(kv_art *t, kv_arena *a);

/* An in-order iterator. It is invalidated by any change to the tree. */
typedef struct {
	void *n;       /* inner node */
	int pos;       /* -1: term leaf next; else next child position */
	uint32_t dlen; /* path length where the node starts (before its prefix) */
} kv_art_frame;

typedef struct {
	kv_art_frame *stack;  /* frames, `inl` or heap */
	size_t depth;         /* frames in use */
	size_t cap;           /* frames available */
	void *pending;        /* a root leaf word to return before the stack */
	int err;              /* KV_ENOMEM once a push failed */
	kv_buf path;          /* key bytes of the current path (inline keys point here) */
	kv_art_frame inl[48]; /* inline frames for common depths */
} kv_art_iter;

void kv_art_iter_init(kv_art_iter *it);
void kv_art_iter_fini(kv_art_iter *it);

/* Positions the iterator before the first key >= start (slen 0: the first
 * key). Returns 0 or KV_ENOMEM. */
int kv_art_iter_seek(kv_art_iter *it, const kv_art *t, const uint8_t *start, size_t slen);

/* Fills *e with the next entry in key order and returns true, or returns
 * false at the end (or on ENOMEM, with it->err set). */
bool kv_art_iter_next(kv_art_iter *it, kv_art_entry *e);

#endif
