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
 */
#ifndef KV_SHARDSERVER_ART_H
#define KV_SHARDSERVER_ART_H

#include "shardserver/arena.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct {
	void *root;           /* tagged pointer: NULL, a leaf, or an inner node */
	uint64_t index_bytes; /* bytes of inner nodes, for statistics */
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

/* Initialises an empty tree. */
void kv_art_init(kv_art *t);

/* Returns the item with this key, or NULL. */
uint8_t *kv_art_get(const kv_art *t, const uint8_t *key, size_t klen);

/*
 * Inserts `item` (a leaf made by kv_item_write, owned by the tree from now
 * on), replacing the item with the same key. On 0, *old is the replaced item
 * (the caller frees it) or NULL. Returns KV_ENOMEM, with the tree unchanged
 * and `item` still the caller's, when a node cannot be allocated.
 */
int kv_art_put(kv_art *t, kv_arena *a, uint8_t *item, uint8_t **old);

/* Removes the item with this key and returns it (the caller frees it), or
 * returns NULL when absent. Never fails: when a smaller node cannot be
 * allocated the node is simply not shrunk. */
uint8_t *kv_art_del(kv_art *t, kv_arena *a, const uint8_t *key, size_t klen);

/* Frees every inner node and calls free_item on every item. */
void kv_art_clear(kv_art *t, kv_arena *a, void (*free_item)(void *arg, uint8_t *item), void *arg);

/* An in-order iterator. It is invalidated by any change to the tree. */
typedef struct {
	void *n; /* inner node */
	int pos; /* -1: term leaf next; else next child position */
} kv_art_frame;

typedef struct {
	kv_art_frame *stack;  /* frames, `inl` or heap */
	size_t depth;         /* frames in use */
	size_t cap;           /* frames available */
	uint8_t *pending;     /* a leaf to return before the stack */
	int err;              /* KV_ENOMEM once a push failed */
	kv_art_frame inl[48]; /* inline frames for common depths */
} kv_art_iter;

void kv_art_iter_init(kv_art_iter *it);
void kv_art_iter_fini(kv_art_iter *it);

/* Positions the iterator before the first key >= start (slen 0: the first
 * key). Returns 0 or KV_ENOMEM. */
int kv_art_iter_seek(kv_art_iter *it, const kv_art *t, const uint8_t *start, size_t slen);

/* Returns the next item in key order, or NULL at the end (or on ENOMEM, with
 * it->err set). */
uint8_t *kv_art_iter_next(kv_art_iter *it);

#endif
