/*
 * art.c - adaptive radix tree (see art.h).
 *
 * Invariants:
 *  - A child slot holds NULL only in N48/N256 (unused byte); N4/N16 keep
 *    their `count` keys sorted and their children dense.
 *  - N48 uses slots 0..count-1 densely; index[b] is slot+1 or 0.
 *  - Every inner node has at least two entries (children plus term), except
 *    transiently inside kv_art_del, which collapses nodes with fewer.
 *  - All keys below a node at depth d share the node's prefix bytes
 *    [d, d + plen); the first min(plen, 8) of them are stored in the node.
 *
 * Work per operation: one root-to-leaf walk plus at most one node copy of at
 * most 256 slots (grow, shrink or split). Nothing here allocates except node
 * copies and the iterator's overflow stack.
 *
 * What this module does not do: locking, partitioning or counting keys and
 * bytes (the store does those around it), or memory accounting (the arena).
 */
#include "shardserver/store/art.h"
#include "common/err.h"
#include "common/key.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

enum { ART_N4 = 1, ART_N16 = 2, ART_N48 = 3, ART_N256 = 4 };

#define ART_MAX_PREFIX 8

typedef struct {
	uint8_t type;                   /* ART_N* */
	uint8_t pad;                    /* unused */
	uint16_t count;                 /* children in use */
	uint32_t plen;                  /* compressed prefix length */
	uint8_t prefix[ART_MAX_PREFIX]; /* its first bytes */
	void *term;                     /* leaf of the key ending here, or NULL */
} art_node;

typedef struct {
	art_node h;
	uint8_t keys[4];
	uint8_t pad[4];
	void *child[4];
} art_n4;

typedef struct {
	art_node h;
	uint8_t keys[16];
	void *child[16];
} art_n16;

typedef struct {
	art_node h;
	uint8_t index[256];
	void *child[48];
} art_n48;

typedef struct {
	art_node h;
	void *child[256];
} art_n256;

#define IS_LEAF(p)    (((uintptr_t)(p)&1u) != 0)
#define LEAF_ITEM(p)  ((uint8_t *)((uintptr_t)(p) & ~(uintptr_t)1))
#define MAKE_LEAF(it) ((void *)((uintptr_t)(it) | 1u))

/*
 * A reference to an inner node carries the node's type (bits 1-2) and
 * whether it has a prefix (bit 3); nodes are 16-aligned. A lookup through a
 * prefix-less N48 or N256 thus goes straight to the child slot without
 * touching the node header: one cache line instead of two.
 */
#define NODE(p)           ((art_node *)((uintptr_t)(p) & ~(uintptr_t)0xf))
#define REF_TYPE(p)       ((unsigned)(((uintptr_t)(p) >> 1) & 3u) + 1u)
#define REF_HAS_PREFIX(p) (((uintptr_t)(p)&8u) != 0)

static const size_t art_node_size[5] = {0, sizeof(art_n4), sizeof(art_n16), sizeof(art_n48),
                                        sizeof(art_n256)};

static inline size_t
art__write_varint(uint8_t *p, size_t v)
{
	size_t n = 0;

	while (v >= 128u) {
		p[n++] = (uint8_t)(v | 0x80u);
		v >>= 7;
	}
	p[n++] = (uint8_t)v;
	return n;
}

size_t
kv_item_write_header(uint8_t *mem, size_t klen, size_t vlen)
{
	size_t n = art__write_varint(mem, klen);

	return n + art__write_varint(mem + n, vlen);
}

void
kv_item_write(uint8_t *mem, const void *key, size_t klen, const void *val, size_t vlen)
{
	size_t n = kv_item_write_header(mem, klen, vlen);

	memcpy(mem + n, key, klen);
	if (vlen)
		memcpy(mem + n + klen, val, vlen);
}

static inline bool
art__leaf_matches(const uint8_t *it, const uint8_t *key, size_t klen)
{
	const uint8_t *k, *v;
	size_t kl, vl;

	kv_item_parse(it, &k, &kl, &v, &vl);
	return kl == klen && memcmp(k, key, klen) == 0;
}

static inline const uint8_t *
art__leaf_key(const uint8_t *it, size_t *klen)
{
	const uint8_t *k, *v;
	size_t vl;

	kv_item_parse(it, &k, klen, &v, &vl);
	return k;
}

static inline void *
node_ref(const art_node *n)
{
	return (void *)((uintptr_t)n | ((uintptr_t)(n->type - 1u) << 1) | (n->plen ? 8u : 0u));
}

static art_node *
art__alloc(kv_art *t, kv_arena *a, uint8_t type)
{
	art_node *n = kv_arena_alloc(a, art_node_size[type]);

	if (n == NULL)
		return NULL;
	memset(n, 0, art_node_size[type]);
	n->type = type;
	t->index_bytes += art_node_size[type];
	return n;
}

static void
art__free(kv_art *t, kv_arena *a, art_node *n)
{
	t->index_bytes -= art_node_size[n->type];
	kv_arena_free(a, n, art_node_size[n->type]);
}

/* Returns the slot holding the child for byte b, or NULL. */
static inline void **
art__find_t(art_node *n, unsigned type, uint8_t b)
{
	switch (type) {
	case ART_N4: {
		art_n4 *x = (art_n4 *)n;
		for (unsigned i = 0; i < n->count; i++)
			if (x->keys[i] == b)
				return &x->child[i];
		return NULL;
	}
	case ART_N16: {
		art_n16 *x = (art_n16 *)n;
#if defined(__SSE2__)
		__m128i cmp = _mm_cmpeq_epi8(_mm_set1_epi8((char)b),
		                             _mm_loadu_si128((const __m128i *)x->keys));
		unsigned mask = (unsigned)_mm_movemask_epi8(cmp) & ((1u << n->count) - 1u);
		return mask ? &x->child[__builtin_ctz(mask)] : NULL;
#else
		for (unsigned i = 0; i < n->count; i++)
			if (x->keys[i] == b)
				return &x->child[i];
		return NULL;
#endif
	}
	case ART_N48: {
		art_n48 *x = (art_n48 *)n;
		return x->index[b] ? &x->child[x->index[b] - 1] : NULL;
	}
	default: {
		art_n256 *x = (art_n256 *)n;
		return x->child[b] ? &x->child[b] : NULL;
	}
	}
}

static inline void **
art__find(art_node *n, uint8_t b)
{
	return art__find_t(n, n->type, b);
}

static inline bool
art__full(const art_node *n)
{
	switch (n->type) {
	case ART_N4:
		return n->count == 4;
	case ART_N16:
		return n->count == 16;
	case ART_N48:
		return n->count == 48;
	default:
		return false;
	}
}

/* Adds a child for byte b (absent) to a node with room. */
static void
art__add(art_node *n, uint8_t b, void *child)
{
	switch (n->type) {
	case ART_N4:
	case ART_N16: {
		uint8_t *keys = n->type == ART_N4 ? ((art_n4 *)n)->keys : ((art_n16 *)n)->keys;
		void **ch = n->type == ART_N4 ? ((art_n4 *)n)->child : ((art_n16 *)n)->child;
		unsigned i = 0;
		while (i < n->count && keys[i] < b)
			i++;
		memmove(keys + i + 1, keys + i, n->count - i);
		memmove(ch + i + 1, ch + i, (n->count - i) * sizeof(void *));
		keys[i] = b;
		ch[i] = child;
		break;
	}
	case ART_N48: {
		art_n48 *x = (art_n48 *)n;
		x->child[n->count] = child;
		x->index[b] = (uint8_t)(n->count + 1);
		break;
	}
	default:
		((art_n256 *)n)->child[b] = child;
		break;
	}
	n->count++;
}

/* Removes the child for byte b (present). */
static void
art__remove(art_node *n, uint8_t b)
{
	switch (n->type) {
	case ART_N4:
	case ART_N16: {
		uint8_t *keys = n->type == ART_N4 ? ((art_n4 *)n)->keys : ((art_n16 *)n)->keys;
		void **ch = n->type == ART_N4 ? ((art_n4 *)n)->child : ((art_n16 *)n)->child;
		unsigned i = 0;
		while (keys[i] != b)
			i++;
		memmove(keys + i, keys + i + 1, n->count - i - 1);
		memmove(ch + i, ch + i + 1, (n->count - i - 1) * sizeof(void *));
		break;
	}
	case ART_N48: {
		art_n48 *x = (art_n48 *)n;
		unsigned slot = x->index[b] - 1u, last = n->count - 1u;
		x->index[b] = 0;
		if (slot != last) {
			x->child[slot] = x->child[last];
			for (unsigned j = 0; j < 256; j++) {
				if (x->index[j] == last + 1u) {
					x->index[j] = (uint8_t)(slot + 1u);
					break;
				}
			}
		}
		x->child[last] = NULL;
		break;
	}
	default:
		((art_n256 *)n)->child[b] = NULL;
		break;
	}
	n->count--;
}

/* Runs BODY with B bound to each child byte and C to the child, in byte order. */
#define ART_FOREACH(n, B, C, BODY)                                                                 \
	do {                                                                                       \
		switch ((n)->type) {                                                               \
		case ART_N4:                                                                       \
			for (unsigned i_ = 0; i_ < (n)->count; i_++) {                             \
				uint8_t B = ((art_n4 *)(n))->keys[i_];                             \
				void *C = ((art_n4 *)(n))->child[i_];                              \
				BODY;                                                              \
			}                                                                          \
			break;                                                                     \
		case ART_N16:                                                                      \
			for (unsigned i_ = 0; i_ < (n)->count; i_++) {                             \
				uint8_t B = ((art_n16 *)(n))->keys[i_];                            \
				void *C = ((art_n16 *)(n))->child[i_];                             \
				BODY;                                                              \
			}                                                                          \
			break;                                                                     \
		case ART_N48:                                                                      \
			for (unsigned i_ = 0; i_ < 256; i_++) {                                    \
				if (((art_n48 *)(n))->index[i_] == 0)                              \
					continue;                                                  \
				uint8_t B = (uint8_t)i_;                                           \
				void *C =                                                          \
				    ((art_n48 *)(n))->child[((art_n48 *)(n))->index[i_] - 1];      \
				BODY;                                                              \
			}                                                                          \
			break;                                                                     \
		default:                                                                           \
			for (unsigned i_ = 0; i_ < 256; i_++) {                                    \
				void *C = ((art_n256 *)(n))->child[i_];                            \
				if (C == NULL)                                                     \
					continue;                                                  \
				uint8_t B = (uint8_t)i_;                                           \
				BODY;                                                              \
			}                                                                          \
			break;                                                                     \
		}                                                                                  \
	} while (0)

/* Copies node n into a fresh node of `type` (which must have room). Returns
 * the copy or NULL (n untouched). Frees n on success. */
static art_node *
art__retype(kv_art *t, kv_arena *a, art_node *n, uint8_t type)
{
	art_node *m = art__alloc(t, a, type);

	if (m == NULL)
		return NULL;
	m->plen = n->plen;
	memcpy(m->prefix, n->prefix, ART_MAX_PREFIX);
	m->term = n->term;
	ART_FOREACH(n, b, c, art__add(m, b, c));
	art__free(t, a, n);
	return m;
}

/* Returns the word of the first leaf below n (its term, else its first
 * child's, down), or NULL for a node without any (not well formed). */
static void *
art__first_leaf(const art_node *n)
{
	for (;;) {
		void *c = n->term;

		if (c == NULL) {
			ART_FOREACH(n, b, ch, {
				(void)b;
				c = ch;
				goto found;
			});
		}
	found:
		if (c == NULL || IS_LEAF(c))
			return c;
		n = NODE(c);
	}
}

/* Returns some leaf below n (every leaf below shares n's full prefix). */
static const uint8_t *
art__any_leaf(const art_node *n)
{
	void *w = art__first_leaf(n);

	return w != NULL ? LEAF_ITEM(w) : NULL;
}

/* Returns the prefix byte i of node n, which starts at key depth `depth`. */
static inline uint8_t
art__prefix_byte(const art_node *n, size_t depth, size_t i, const uint8_t **leafkey)
{
	size_t kl;

	if (i < ART_MAX_PREFIX)
		return n->prefix[i];
	if (*leafkey == NULL)
		*leafkey = art__leaf_key(art__any_leaf(n), &kl);
	return (*leafkey)[depth + i];
}

/* Returns the length of the common part of n's full prefix and key[depth..]. */
static size_t
art__prefix_mismatch(const art_node *n, const uint8_t *key, size_t klen, size_t depth)
{
	const uint8_t *leafkey = NULL;
	size_t i;

	for (i = 0; i < n->plen; i++) {
		if (depth + i >= klen || art__prefix_byte(n, depth, i, &leafkey) != key[depth + i])
			return i;
	}
	return i;
}

/* Stores min(len, 8) bytes of src as n's prefix of length len. */
static inline void
art__set_prefix(art_node *n, const uint8_t *src, size_t len)
{
	n->plen = (uint32_t)len;
	memcpy(n->prefix, src, len < ART_MAX_PREFIX ? len : ART_MAX_PREFIX);
}

/* --- leaves ------------------------------------------------------------- */

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "inline leaves assume a little-endian machine"
#endif

#define INLINE_BIT   ((uintptr_t)1 << 63)
#define IS_INLINE(p) (((uintptr_t)(p)&INLINE_BIT) != 0)

static inline size_t
inline_vlen(uintptr_t w)
{
	return (size_t)((w >> 56) & 0x7fu);
}

static inline void *
leaf_inline(const uint8_t *v, size_t vlen)
{
	uintptr_t w = 1u | INLINE_BIT | ((uintptr_t)vlen << 56);

	for (size_t i = 0; i < vlen; i++)
		w |= (uintptr_t)v[i] << (8 * (i + 1));
	return (void *)w;
}

/* Value of the leaf held in *slot (pointers into the slot or the item). */
static inline void
leaf_value(void *const *slot, const uint8_t **v, size_t *vlen)
{
	uintptr_t w = (uintptr_t)*slot;

	if (IS_INLINE(w)) {
		*v = (const uint8_t *)slot + 1;
		*vlen = inline_vlen(w);
	} else {
		const uint8_t *k;
		size_t kl;
		kv_item_parse(LEAF_ITEM(w), &k, &kl, v, vlen);
	}
}

size_t
kv_art_leaf_vlen(kv_leaf l)
{
	const uint8_t *v;
	size_t vl;
	void *w = (void *)l;

	if (l == 0)
		return 0;
	leaf_value(&w, &v, &vl);
	return vl;
}

static uint8_t *
art__item_new(kv_art *t, kv_arena *a, const uint8_t *key, size_t klen, const uint8_t *val,
              size_t vlen)
{
	size_t sz = kv_item_size(klen, vlen);
	uint8_t *it = kv_arena_alloc(a, sz);

	if (it == NULL)
		return NULL;
	if (sz > KV_ARENA_MAX_SMALL)
		t->nlarge++;
	kv_item_write(it, key, klen, val, vlen);
	return it;
}

static void
art__item_free(kv_art *t, kv_arena *a, uint8_t *it)
{
	size_t sz = kv_item_total(it);

	if (sz > KV_ARENA_MAX_SMALL)
		t->nlarge--;
	kv_arena_free(a, it, sz);
}

int
kv_art_leaf_new(kv_art *t, kv_arena *a, const uint8_t *key, size_t klen, const uint8_t *val,
                size_t vlen, kv_leaf *out)
{
	uint8_t *it = art__item_new(t, a, key, klen, val, vlen);

	if (it == NULL)
		return KV_ENOMEM;
	*out = (kv_leaf)MAKE_LEAF(it);
	return KV_OK;
}

void
kv_art_leaf_free(kv_art *t, kv_arena *a, kv_leaf l)
{
	if (l != 0 && !IS_INLINE(l))
		art__item_free(t, a, LEAF_ITEM(l));
}

/*
 * Whether a leaf for a key of length klen may be stored inline at a slot
 * whose path from the root spells `pos` bytes: the path must spell the whole
 * key, and every prefix on it must be fully stored (`safe`) so that lookups
 * verify every byte.
 */
static inline bool
inline_ok(bool safe, size_t klen, size_t pos, size_t vlen)
{
	return safe && klen == pos && vlen <= KV_ART_INLINE_MAX;
}

/* Does the leaf in *slot at a position spelling `pos` bytes hold key? */
static inline bool
leaf_matches(void *const *slot, bool safe, size_t pos, const uint8_t *key, size_t klen)
{
	uintptr_t w = (uintptr_t)*slot;

	if (IS_INLINE(w))
		return safe && klen == pos;
	return art__leaf_matches(LEAF_ITEM(w), key, klen);
}

/* --- lookup ------------------------------------------------------------- */

void
kv_art_init(kv_art *t)
{
	t->root = NULL;
	t->index_bytes = 0;
	t->nlarge = 0;
}

/*
 * Checks n's stored prefix bytes against key at *depth and moves *depth past
 * the whole prefix. Bytes past the 8 stored ones are not checked here (the
 * leaf's full key is), which makes the path unsafe for inline leaves.
 * Returns false when the key cannot be below n.
 */
static inline bool
art__skip_prefix(const art_node *n, const uint8_t *key, size_t klen, size_t *depth, bool *safe)
{
	size_t m = n->plen < ART_MAX_PREFIX ? n->plen : ART_MAX_PREFIX;

	if (*depth + n->plen > klen)
		return false;
	for (size_t i = 0; i < m; i++)
		if (n->prefix[i] != key[*depth + i])
			return false;
	if (n->plen > ART_MAX_PREFIX)
		*safe = false;
	*depth += n->plen;
	return true;
}

/*
 * Walks to the slot that holds key's leaf. Returns the slot (or NULL) and
 * sets *safe and *pos for it. Shared by find and take.
 */
static void *const *
art__lookup(const kv_art *t, const uint8_t *key, size_t klen, bool *safe_out, size_t *pos_out)
{
	void *const *ref = &t->root;
	size_t depth = 0;
	bool safe = true;

	while (*ref != NULL) {
		void *p = *ref;
		if (IS_LEAF(p)) {
			if (!leaf_matches(ref, safe, depth, key, klen))
				return NULL;
			*safe_out = safe;
			*pos_out = depth;
			return ref;
		}
		art_node *n = NODE(p);
		if (REF_HAS_PREFIX(p) && !art__skip_prefix(n, key, klen, &depth, &safe))
			return NULL;
		if (depth == klen) {
			if (n->term == NULL || !leaf_matches(&n->term, safe, depth, key, klen))
				return NULL;
			*safe_out = safe;
			*pos_out = depth;
			return &n->term;
		}
		ref = art__find_t(n, REF_TYPE(p), key[depth]);
		if (ref == NULL)
			return NULL;
		depth++;
	}
	return NULL;
}

bool
kv_art_find(const kv_art *t, const uint8_t *key, size_t klen, const uint8_t **val, size_t *vlen)
{
	bool safe;
	size_t pos;
	void *const *slot = art__lookup(t, key, klen, &safe, &pos);

	if (slot == NULL)
		return false;
	leaf_value(slot, val, vlen);
	return true;
}

/* --- batched prefetch --------------------------------------------------- */

/* Prefetches the bytes [p, p + len) of a node or item. */
static inline void
art__prefetch(const void *p, size_t len)
{
	const char *c = p;

	for (size_t off = 0; off < len; off += 64)
		__builtin_prefetch(c + off, 1, 3);
	__builtin_prefetch(c + len - 1, 1, 3);
}

/*
 * Prefetches what a descent through ref at key[depth] reads first: the
 * header (the prefix, the term), and the part of the node holding the slot
 * for key[depth] when the node has no prefix (else that byte is not known
 * before the header is read).
 */
static inline void
art__prefetch_ref(void *ref, const uint8_t *key, size_t klen, size_t depth)
{
	const uint8_t *n = (const uint8_t *)NODE(ref);
	bool known = !REF_HAS_PREFIX(ref) && depth < klen;
	unsigned b = known ? key[depth] : 0;

	switch (REF_TYPE(ref)) {
	case ART_N4:
		art__prefetch(n, sizeof(art_n4));
		break;
	case ART_N16:
		art__prefetch(n, sizeof(art_n16));
		break;
	case ART_N48:
		__builtin_prefetch(n, 0, 3);
		if (known)
			__builtin_prefetch(n + offsetof(art_n48, index) + b, 0, 3);
		break;
	default:
		__builtin_prefetch(n, 0, 3);
		if (known)
			__builtin_prefetch(n + offsetof(art_n256, child) + b * sizeof(void *), 0,
			                   3);
		break;
	}
}

/*
 * One descent in progress: the reference to visit next, already prefetched,
 * and the key depth there. An N48 takes two visits: its index, then the
 * child slot the index names (`slot`). An item takes one more: its first
 * line is prefetched when its leaf is reached, and on the next visit its
 * length (read there) says which further lines its key and value fill.
 */
typedef struct {
	void *ref;         /* node or leaf reference to visit, NULL when done */
	void *const *slot; /* N48 child slot prefetched, to read on the next visit */
	const uint8_t *it; /* item whose first line is prefetched, or NULL */
	size_t depth;      /* key depth at ref (before its prefix) */
} art_cursor;

/* Reaches the leaf word w at the end of c's descent: prefetches an item's
 * first line and keeps the cursor for its other lines. Returns whether the
 * cursor stays active. */
static inline bool
art__cursor_leaf(art_cursor *c, const void *w)
{
	c->ref = NULL;
	if (w == NULL || IS_INLINE(w))
		return false;
	c->it = LEAF_ITEM(w);
	__builtin_prefetch(c->it, 1, 3);
	return true;
}

/* Bytes of an item the walk prefetches at most: a large value's copy
 * streams anyway, and its lines would push the other keys' paths out. */
#define ART_PREFETCH_ITEM_MAX 512u

/* The item's lines after its first, up to its end (its total size read
 * from its header, which the round before brought into cache) or
 * ART_PREFETCH_ITEM_MAX. */
static inline void
art__prefetch_item_rest(const uint8_t *it)
{
	size_t total = kv_item_total(it);
	uintptr_t line = ((uintptr_t)it & ~(uintptr_t)63) + 64;
	uintptr_t end =
	    (uintptr_t)it + (total < ART_PREFETCH_ITEM_MAX ? total : ART_PREFETCH_ITEM_MAX);

	for (; line < end; line += 64)
		__builtin_prefetch((const void *)line, 1, 3);
}

void
kv_art_prefetch(const kv_art *const *trees, const uint8_t *const *keys, const size_t *klens,
                size_t n)
{
	art_cursor cur[KV_ART_PREFETCH_MAX];
	size_t active = 0;

	if (n > KV_ART_PREFETCH_MAX)
		n = KV_ART_PREFETCH_MAX;
	for (size_t i = 0; i < n; i++) {
		void *r = trees[i]->root;
		cur[i] = (art_cursor){.ref = NULL, .slot = NULL, .it = NULL, .depth = 0};
		if (r != NULL && IS_LEAF(r)) {
			active += art__cursor_leaf(&cur[i], r);
		} else if (r != NULL) {
			cur[i].ref = r;
			art__prefetch_ref(r, keys[i], klens[i], 0);
			active++;
		}
	}
	/* Rounds: every cursor moves one level per round, so the misses of a
	 * round overlap instead of following each other. A malformed path ends
	 * by depth (every step consumes a byte). */
	while (active > 0) {
		for (size_t i = 0; i < n; i++) {
			art_cursor *c = &cur[i];
			void *p = c->ref;
			const uint8_t *key = keys[i];
			size_t klen = klens[i];

			if (c->it != NULL) {
				art__prefetch_item_rest(c->it);
				c->it = NULL;
				active--;
				continue;
			}
			if (p == NULL)
				continue;
			if (c->slot != NULL) {
				p = *c->slot;
				c->slot = NULL;
				goto child;
			}
			/* An inner node (leaves end a descent as they are reached). */
			art_node *nd = NODE(p);
			if (REF_HAS_PREFIX(p))
				c->depth += nd->plen;
			if (c->depth >= klen) {
				if (!art__cursor_leaf(c, nd->term))
					active--;
				continue;
			}
			if (REF_TYPE(p) == ART_N48) {
				art_n48 *x = (art_n48 *)nd;
				unsigned ix = x->index[key[c->depth]];
				if (ix == 0)
					goto done;
				c->slot = &x->child[ix - 1];
				__builtin_prefetch(c->slot, 0, 3);
				c->depth++;
				continue;
			}
			{
				void **s = art__find_t(nd, REF_TYPE(p), key[c->depth]);
				if (s == NULL)
					goto done;
				p = *s;
				c->depth++;
			}
		child:
			c->ref = p;
			if (p == NULL || c->depth > klen)
				goto done;
			if (IS_LEAF(p)) {
				if (!art__cursor_leaf(c, p))
					active--;
				continue;
			}
			art__prefetch_ref(p, key, klen, c->depth);
			continue;
		done:
			c->ref = NULL;
			active--;
		}
	}
}

/* --- insertion ---------------------------------------------------------- */

/* Where the new leaf comes from: a value to copy, or a given leaf. */
typedef struct {
	const uint8_t *val; /* value bytes when leaf == 0 */
	size_t vlen;        /* their length */
	kv_leaf leaf;       /* a given leaf (item or inline), or 0 */
} art_src;

/* Makes the word to store for src at a position (inline when allowed).
 * Returns NULL when an item is needed and cannot be allocated. */
static void *
art__make(kv_art *t, kv_arena *a, const art_src *src, const uint8_t *key, size_t klen, bool inl)
{
	const uint8_t *v = src->val;
	size_t vl = src->vlen;
	void *w = (void *)src->leaf;

	if (src->leaf != 0)
		leaf_value(&w, &v, &vl);
	if (inl && vl <= KV_ART_INLINE_MAX)
		return leaf_inline(v, vl);
	if (src->leaf != 0 && !IS_INLINE(src->leaf))
		return (void *)src->leaf;
	uint8_t *it = art__item_new(t, a, key, klen, v, vl);
	return it ? MAKE_LEAF(it) : NULL;
}

/* After the made word is linked: a given item that was not used is freed. */
static void
art__made(kv_art *t, kv_arena *a, const art_src *src, void *made)
{
	if (src->leaf != 0 && !IS_INLINE(src->leaf) && (kv_leaf)made != src->leaf)
		art__item_free(t, a, LEAF_ITEM(src->leaf));
}

/* Undoes art__make when a later allocation failed. */
static void
art__unmake(kv_art *t, kv_arena *a, const art_src *src, void *made)
{
	if (!IS_INLINE(made) && (kv_leaf)made != src->leaf)
		art__item_free(t, a, LEAF_ITEM(made));
}

/* Whether the item leaf w's key starts with key[0, depth): false for an
 * inline leaf (its key is its position, which is what is checked). */
static bool
art__leaf_spells(const void *w, const uint8_t *key, size_t depth)
{
	size_t kl;
	const uint8_t *k;

	if (IS_INLINE(w))
		return false;
	k = art__leaf_key(LEAF_ITEM(w), &kl);
	return kl >= depth && memcmp(k, key, depth) == 0;
}

/* Whether the leaves below node n, reached at key depth `depth`, spell
 * key[0, depth) (they all spell the same bytes there): checked on the first
 * leaf found below n. */
static bool
art__node_spells(const art_node *n, const uint8_t *key, size_t depth)
{
	void *w = art__first_leaf(n);

	return w != NULL && art__leaf_spells(w, key, depth);
}

/*
 * Inserts src at key. When the key exists: with `replace_out` the old word is
 * handed back untouched; otherwise the value is rewritten (in place when the
 * item's size class allows) and the old leaf freed. *existed and *old_vlen
 * describe the old leaf.
 */
static int
art__insert(kv_art *t, kv_arena *a, const uint8_t *key, size_t klen, const art_src *src,
            kv_leaf *replace_out, bool *existed, size_t *old_vlen)
{
	void **ref = &t->root;
	size_t depth = 0;
	bool safe = true;
	void *w;

	*existed = false;
	*old_vlen = 0;
	/* First the descent of a lookup: prefixes checked by their stored bytes
	 * only, the full key at the leaf. An existing key (an overwrite, the
	 * common case) is found without reading any other leaf. Where it stops,
	 * the insert goes on from the node or leaf it stopped at, once the
	 * bytes of the long prefixes it skipped are checked against a leaf
	 * below that point (the one there, or one walked to from a node that
	 * deep); if they differ, it starts again from the root checking every
	 * prefix in full. */
	for (;;) {
		void *p = *ref;

		if (p == NULL)
			break;
		if (IS_LEAF(p)) {
			if (leaf_matches(ref, safe, depth, key, klen))
				goto replace;
			if (!safe && !art__leaf_spells(p, key, depth))
				goto restart;
			break;
		}
		art_node *n = NODE(p);
		size_t d = depth;
		bool sf = safe;
		if (REF_HAS_PREFIX(p) && !art__skip_prefix(n, key, klen, &d, &sf))
			goto stop_at_node;
		if (d == klen) {
			if (n->term != NULL && leaf_matches(&n->term, sf, d, key, klen)) {
				ref = &n->term;
				depth = d;
				safe = sf;
				goto replace;
			}
			goto stop_at_node;
		}
		void **slot = art__find_t(n, REF_TYPE(p), key[d]);
		if (slot == NULL)
			goto stop_at_node;
		ref = slot;
		depth = d + 1;
		safe = sf;
		continue;
	stop_at_node:
		if (!safe && !art__node_spells(n, key, depth))
			goto restart;
		break;
	}
	goto insert;
restart:
	ref = &t->root;
	depth = 0;
	safe = true;
insert:
	for (;;) {
		void *p = *ref;

		if (p == NULL) {
			/* Only the root can be an empty slot: never inline there. */
			if ((w = art__make(t, a, src, key, klen, false)) == NULL)
				return KV_ENOMEM;
			*ref = w;
			art__made(t, a, src, w);
			return KV_OK;
		}
		if (IS_LEAF(p)) {
			if (leaf_matches(ref, safe, depth, key, klen))
				goto replace;
			/* Split the leaf: a node holding the common part of both keys. The
			 * old key is spelled by the path when inline, else in its item. */
			size_t ol, lcp = 0;
			const uint8_t *ok = IS_INLINE(p) ? key : art__leaf_key(LEAF_ITEM(p), &ol);
			if (IS_INLINE(p))
				ol = depth;
			while (depth + lcp < klen && depth + lcp < ol &&
			       key[depth + lcp] == ok[depth + lcp])
				lcp++;
			size_t d2 = depth + lcp;
			bool safe2 = safe && lcp <= ART_MAX_PREFIX;
			bool new_term = klen == d2;
			w = art__make(t, a, src, key, klen,
			              inline_ok(safe2, klen, new_term ? d2 : d2 + 1, 0));
			if (w == NULL)
				return KV_ENOMEM;
			art_node *nn = art__alloc(t, a, ART_N4);
			if (nn == NULL) {
				art__unmake(t, a, src, w);
				return KV_ENOMEM;
			}
			art__set_prefix(nn, key + depth, lcp);
			if (ol == d2)
				nn->term = p;
			else
				art__add(nn, ok[d2], p);
			if (new_term)
				nn->term = w;
			else
				art__add(nn, key[d2], w);
			*ref = node_ref(nn);
			art__made(t, a, src, w);
			return KV_OK;
		}

		art_node *n = NODE(p);
		if (REF_HAS_PREFIX(p)) {
			size_t mm = art__prefix_mismatch(n, key, klen, depth);
			if (mm < n->plen) {
				/* The key leaves the compressed path: split the prefix. */
				const uint8_t *leafkey = NULL;
				uint8_t nb = art__prefix_byte(n, depth, mm, &leafkey);
				bool safe2 = safe && mm <= ART_MAX_PREFIX;
				bool new_term = depth + mm == klen;
				size_t pos = new_term ? depth + mm : depth + mm + 1;
				w = art__make(t, a, src, key, klen, inline_ok(safe2, klen, pos, 0));
				if (w == NULL)
					return KV_ENOMEM;
				art_node *nn = art__alloc(t, a, ART_N4);
				if (nn == NULL) {
					art__unmake(t, a, src, w);
					return KV_ENOMEM;
				}
				art__set_prefix(nn, key + depth, mm);
				/* n keeps the part after the byte it now hangs from. */
				size_t rest = n->plen - mm - 1;
				if (leafkey == NULL && n->plen > ART_MAX_PREFIX) {
					size_t kl;
					leafkey = art__leaf_key(art__any_leaf(n), &kl);
				}
				if (leafkey != NULL) {
					memcpy(n->prefix, leafkey + depth + mm + 1,
					       rest < ART_MAX_PREFIX ? rest : ART_MAX_PREFIX);
				} else {
					memmove(n->prefix, n->prefix + mm + 1, rest);
				}
				n->plen = (uint32_t)rest;
				art__add(nn, nb, node_ref(n));
				if (new_term)
					nn->term = w;
				else
					art__add(nn, key[depth + mm], w);
				*ref = node_ref(nn);
				art__made(t, a, src, w);
				return KV_OK;
			}
			if (n->plen > ART_MAX_PREFIX)
				safe = false;
			depth += n->plen;
		}
		if (depth == klen) {
			if (n->term != NULL) {
				ref = &n->term;
				goto replace;
			}
			if ((w = art__make(t, a, src, key, klen,
			                   inline_ok(safe, klen, depth, 0))) == NULL)
				return KV_ENOMEM;
			n->term = w;
			art__made(t, a, src, w);
			return KV_OK;
		}
		void **slot = art__find_t(n, REF_TYPE(p), key[depth]);
		if (slot != NULL) {
			ref = slot;
			depth++;
			continue;
		}
		if ((w = art__make(t, a, src, key, klen, inline_ok(safe, klen, depth + 1, 0))) ==
		    NULL)
			return KV_ENOMEM;
		if (art__full(n)) {
			art_node *g = art__retype(t, a, n, (uint8_t)(n->type + 1));
			if (g == NULL) {
				art__unmake(t, a, src, w);
				return KV_ENOMEM;
			}
			*ref = node_ref(g);
			n = g;
		}
		art__add(n, key[depth], w);
		art__made(t, a, src, w);
		return KV_OK;
	}

replace : {
	/* The key exists at *ref, a position spelling `depth` bytes. */
	void *o = *ref;
	bool inl = inline_ok(safe, klen, depth, 0);
	const uint8_t *ov;
	size_t ovl;

	*existed = true;
	leaf_value(ref, &ov, &ovl);
	*old_vlen = ovl;
	if (replace_out != NULL) {
		if ((w = art__make(t, a, src, key, klen, inl)) == NULL)
			return KV_ENOMEM;
		*ref = w;
		*replace_out = (kv_leaf)o;
		art__made(t, a, src, w);
		return KV_OK;
	}
	if (!(inl && src->vlen <= KV_ART_INLINE_MAX) && !IS_INLINE(o)) {
		uint8_t *it = LEAF_ITEM(o);
		if (kv_arena_same_class(kv_item_total(it), kv_item_size(klen, src->vlen))) {
			kv_item_write(it, key, klen, src->val, src->vlen);
			return KV_OK;
		}
	}
	if ((w = art__make(t, a, src, key, klen, inl)) == NULL)
		return KV_ENOMEM;
	*ref = w;
	kv_art_leaf_free(t, a, (kv_leaf)o);
	return KV_OK;
}
}

int
kv_art_upsert(kv_art *t, kv_arena *a, const uint8_t *key, size_t klen, const uint8_t *val,
              size_t vlen, bool *existed, size_t *old_vlen)
{
	art_src src = {.val = val, .vlen = vlen, .leaf = 0};
	return art__insert(t, a, key, klen, &src, NULL, existed, old_vlen);
}

int
kv_art_put_leaf(kv_art *t, kv_arena *a, const uint8_t *key, size_t klen, kv_leaf leaf, kv_leaf *old)
{
	art_src src = {.leaf = leaf};
	bool existed;
	size_t ovl;

	*old = 0;
	return art__insert(t, a, key, klen, &src, old, &existed, &ovl);
}

/* --- removal ------------------------------------------------------------ */

/*
 * Restores the node invariants of *ref after a removal below it. Returns
 * true when the node is left empty (no children, no term) for the caller to
 * unlink. Never moves an inline leaf (its key is spelled by its position),
 * and never merges prefixes past the stored 8 bytes (inline leaves below
 * must stay verifiable); both only cost some compactness.
 */
static bool
art__tidy(kv_art *t, kv_arena *a, void **ref)
{
	art_node *n = NODE(*ref);
	uint8_t smaller = 0;

	if (n->count == 0) {
		if (n->term == NULL)
			return true;
		if (!IS_INLINE(n->term)) {
			void *leaf = n->term;
			art__free(t, a, n);
			*ref = leaf;
		}
		return false;
	}
	if (n->count == 1 && n->term == NULL) {
		void *c = NULL;
		uint8_t b = 0;
		ART_FOREACH(n, bb, cc, {
			b = bb;
			c = cc;
		});
		if (IS_LEAF(c)) {
			if (IS_INLINE(c))
				return false;
			art__free(t, a, n);
			*ref = c;
			return false;
		}
		art_node *cn = NODE(c);
		if ((size_t)n->plen + 1u + cn->plen <= ART_MAX_PREFIX) {
			uint8_t buf[ART_MAX_PREFIX];
			size_t k = 0;
			for (size_t i = 0; i < n->plen; i++)
				buf[k++] = n->prefix[i];
			buf[k++] = b;
			for (size_t i = 0; i < cn->plen; i++)
				buf[k++] = cn->prefix[i];
			memcpy(cn->prefix, buf, k);
			cn->plen = n->plen + 1u + cn->plen;
			art__free(t, a, n);
			*ref = node_ref(cn);
		}
		return false;
	}
	switch (n->type) {
	case ART_N256:
		smaller = n->count < 37 ? ART_N48 : 0;
		break;
	case ART_N48:
		smaller = n->count < 12 ? ART_N16 : 0;
		break;
	case ART_N16:
		smaller = n->count < 3 ? ART_N4 : 0;
		break;
	default:
		break;
	}
	if (smaller) {
		art_node *m = art__retype(t, a, n, smaller);
		if (m != NULL) /* on ENOMEM the node just stays larger */
			*ref = node_ref(m);
	}
	return false;
}

#define ART_PATH_INLINE 64

kv_leaf
kv_art_take(kv_art *t, kv_arena *a, const uint8_t *key, size_t klen)
{
	void **inl_refs[ART_PATH_INLINE], ***refs = inl_refs;
	uint8_t inl_bytes[ART_PATH_INLINE], *bytes = inl_bytes;
	size_t nref = 0, cap = ART_PATH_INLINE, depth = 0;
	void **ref = &t->root;
	kv_leaf found = 0;
	bool safe = true;

	/* refs[i] is the slot of the i-th node on the path; bytes[i] the byte
	 * under which it hangs from refs[i-1]'s node. */
	while (*ref != NULL) {
		void *p = *ref;
		if (IS_LEAF(p)) {
			if (!leaf_matches(ref, safe, depth, key, klen))
				goto out;
			found = (kv_leaf)p;
			if (nref == 0) {
				*ref = NULL; /* the root itself */
				goto out;
			}
			art_node *parent = NODE(*refs[nref - 1]);
			if (ref == &parent->term)
				parent->term = NULL;
			else
				art__remove(parent, key[depth - 1]);
			break;
		}
		art_node *n = NODE(p);
		if (nref == cap) {
			size_t ncap = cap * 2;
			void ***nr = malloc(ncap * sizeof(*nr));
			uint8_t *nb = malloc(ncap);
			if (nr == NULL || nb == NULL) {
				free(nr);
				free(nb);
				goto out; /* cannot record the path: leave the key */
			}
			memcpy(nr, refs, nref * sizeof(*nr));
			memcpy(nb, bytes, nref);
			if (refs != inl_refs) {
				free(refs);
				free(bytes);
			}
			refs = nr;
			bytes = nb;
			cap = ncap;
		}
		refs[nref] = ref;
		bytes[nref] = depth > 0 ? key[depth - 1] : 0;
		nref++;
		if (n->plen != 0 && !art__skip_prefix(n, key, klen, &depth, &safe))
			goto out;
		if (depth == klen) {
			ref = &n->term;
			if (*ref == NULL)
				goto out;
			continue;
		}
		ref = art__find(n, key[depth]);
		if (ref == NULL)
			goto out;
		depth++;
	}
	if (found == 0)
		goto out;
	/* Tidy from the leaf's node upwards while nodes are left empty. */
	while (nref > 0) {
		void **nodeRef = refs[nref - 1];
		if (!art__tidy(t, a, nodeRef))
			break;
		art_node *empty = NODE(*nodeRef);
		art__free(t, a, empty);
		if (nref == 1) {
			*nodeRef = NULL;
			break;
		}
		art__remove(NODE(*refs[nref - 2]), bytes[nref - 1]);
		nref--;
	}
out:
	if (refs != inl_refs) {
		free(refs);
		free(bytes);
	}
	return found;
}

bool
kv_art_remove(kv_art *t, kv_arena *a, const uint8_t *key, size_t klen, size_t *old_vlen)
{
	kv_leaf l = kv_art_take(t, a, key, klen);

	if (l == 0)
		return false;
	if (old_vlen)
		*old_vlen = kv_art_leaf_vlen(l);
	kv_art_leaf_free(t, a, l);
	return true;
}

void
kv_art_clear(kv_art *t, kv_arena *a)
{
	size_t cap = 64, depth = 0;
	void **stack;

	/* Slab memory (nodes, small items) goes with the arena's blocks; only
	 * large items need a walk. */
	if (t->root == NULL || t->nlarge == 0)
		goto done;
	if (IS_LEAF(t->root)) {
		kv_art_leaf_free(t, a, (kv_leaf)t->root);
		goto done;
	}
	if ((stack = malloc(cap * sizeof(void *))) == NULL)
		goto done; /* the large items leak rather than crash */
	stack[depth++] = NODE(t->root);
	while (depth > 0) {
		art_node *n = stack[--depth];
		if (n->term)
			kv_art_leaf_free(t, a, (kv_leaf)n->term);
		ART_FOREACH(n, b, c, {
			(void)b;
			if (IS_LEAF(c)) {
				kv_art_leaf_free(t, a, (kv_leaf)c);
			} else {
				if (depth == cap) {
					void **ns = realloc(stack, cap * 2 * sizeof(void *));
					if (ns == NULL)
						continue;
					stack = ns;
					cap *= 2;
				}
				stack[depth++] = NODE(c);
			}
		});
	}
	free(stack);
done:
	t->root = NULL;
}

/* --- iteration ---------------------------------------------------------- */

void
kv_art_iter_init(kv_art_iter *it)
{
	memset(&it->path, 0, sizeof(it->path));
	it->stack = it->inl;
	it->cap = sizeof(it->inl) / sizeof(it->inl[0]);
	it->depth = 0;
	it->pending = NULL;
	it->err = 0;
}

void
kv_art_iter_fini(kv_art_iter *it)
{
	if (it->stack != it->inl)
		free(it->stack);
	kv_buf_fini(&it->path);
	it->stack = it->inl;
	it->cap = sizeof(it->inl) / sizeof(it->inl[0]);
	it->depth = 0;
}

/* Makes path[dlen .. dlen+plen) hold n's prefix and truncates it there. */
static int
art__path_node(kv_art_iter *it, const art_node *n, size_t dlen)
{
	size_t need = dlen + n->plen + 1;
	const uint8_t *leafkey = NULL;

	if (kv_buf_reserve(&it->path, need) != KV_OK) {
		it->err = KV_ENOMEM;
		return KV_ENOMEM;
	}
	for (size_t i = 0; i < n->plen; i++)
		it->path.data[dlen + i] = art__prefix_byte(n, dlen, i, &leafkey);
	it->path.len = dlen + n->plen;
	return KV_OK;
}

static int
art__push(kv_art_iter *it, void *n, int pos, size_t dlen)
{
	if (it->depth == it->cap) {
		size_t ncap = it->cap * 2;
		kv_art_frame *ns;
		if (it->stack == it->inl) {
			ns = malloc(ncap * sizeof(*ns));
			if (ns != NULL)
				memcpy(ns, it->inl, sizeof(it->inl));
		} else {
			ns = realloc(it->stack, ncap * sizeof(*ns));
		}
		if (ns == NULL) {
			it->err = KV_ENOMEM;
			return KV_ENOMEM;
		}
		it->stack = ns;
		it->cap = ncap;
	}
	if (art__path_node(it, n, dlen) != KV_OK)
		return KV_ENOMEM;
	it->stack[it->depth].n = n;
	it->stack[it->depth].pos = pos;
	it->stack[it->depth].dlen = (uint32_t)dlen;
	it->depth++;
	return KV_OK;
}

/* Compares n's full prefix with start[depth..]: <0 when every key below n is
 * smaller than start, >0 when every key below is greater, 0 when equal. */
static int
art__prefix_cmp(const art_node *n, size_t depth, const uint8_t *start, size_t slen)
{
	const uint8_t *leafkey = NULL;

	for (size_t i = 0; i < n->plen; i++) {
		if (depth + i >= slen)
			return 1;
		uint8_t pb = art__prefix_byte(n, depth, i, &leafkey);
		if (pb != start[depth + i])
			return pb < start[depth + i] ? -1 : 1;
	}
	return 0;
}

int
kv_art_iter_seek(kv_art_iter *it, const kv_art *t, const uint8_t *start, size_t slen)
{
	void *p = t->root;
	size_t depth = 0;

	it->depth = 0;
	it->pending = NULL;
	it->err = 0;
	it->path.len = 0;
	while (p != NULL) {
		if (IS_LEAF(p)) {
			/* Only the root leaf gets here: below the root a leaf is
			 * reached through its parent frame, never as `p` first. */
			size_t kl;
			const uint8_t *k = art__leaf_key(LEAF_ITEM(p), &kl);
			if (kv_key_cmp(k, kl, start, slen) >= 0)
				it->pending = p;
			return KV_OK;
		}
		art_node *n = NODE(p);
		int c = art__prefix_cmp(n, depth, start, slen);
		if (c < 0)
			return KV_OK;
		if (c > 0)
			return art__push(it, n, -1, depth);
		if (depth + n->plen == slen)
			return art__push(it, n, -1, depth);
		uint8_t b = start[depth + n->plen];
		int pos;
		void *next = NULL;
		switch (n->type) {
		case ART_N4:
		case ART_N16: {
			const uint8_t *keys =
			    n->type == ART_N4 ? ((art_n4 *)n)->keys : ((art_n16 *)n)->keys;
			void **ch =
			    n->type == ART_N4 ? ((art_n4 *)n)->child : ((art_n16 *)n)->child;
			unsigned i = 0;
			while (i < n->count && keys[i] < b)
				i++;
			if (i < n->count && keys[i] == b) {
				next = ch[i];
				pos = (int)i;
			} else {
				pos = (int)i;
			}
			break;
		}
		default: {
			void **slot = art__find(n, b);
			next = slot ? *slot : NULL;
			pos = (int)b;
			break;
		}
		}
		if (next == NULL)
			return art__push(it, n, pos, depth); /* children after b */
		if (IS_LEAF(next)) {
			/* Visit the leaf at b only when its key is >= start. An
			 * inline leaf's key is path + b, a prefix of start. */
			bool ge;
			if (IS_INLINE(next)) {
				ge = slen == depth + n->plen + 1;
			} else {
				size_t kl;
				const uint8_t *k = art__leaf_key(LEAF_ITEM(next), &kl);
				ge = kv_key_cmp(k, kl, start, slen) >= 0;
			}
			return art__push(it, n, ge ? pos : pos + 1, depth);
		}
		if (art__push(it, n, pos + 1, depth) != KV_OK)
			return KV_ENOMEM;
		it->path.data[depth + n->plen] = b;
		it->path.len = depth + n->plen + 1;
		p = next;
		depth += n->plen + 1;
	}
	return KV_OK;
}

bool
kv_art_iter_next(kv_art_iter *it, kv_art_entry *e)
{
	if (it->pending != NULL) {
		void *p = it->pending;
		it->pending = NULL;
		kv_item_parse(LEAF_ITEM(p), &e->key, &e->klen, &e->val, &e->vlen);
		return true;
	}
	while (it->depth > 0) {
		kv_art_frame *f = &it->stack[it->depth - 1];
		art_node *n = f->n;
		size_t base = f->dlen + n->plen;
		void **slot = NULL;
		int b = -1;

		it->path.len = base;
		if (f->pos < 0) {
			f->pos = 0;
			if (n->term != NULL) {
				slot = &n->term;
				goto leaf;
			}
		}
		switch (n->type) {
		case ART_N4:
			if (f->pos < n->count) {
				b = ((art_n4 *)n)->keys[f->pos];
				slot = &((art_n4 *)n)->child[f->pos++];
			}
			break;
		case ART_N16:
			if (f->pos < n->count) {
				b = ((art_n16 *)n)->keys[f->pos];
				slot = &((art_n16 *)n)->child[f->pos++];
			}
			break;
		case ART_N48: {
			art_n48 *x = (art_n48 *)n;
			while (f->pos < 256 && x->index[f->pos] == 0)
				f->pos++;
			if (f->pos < 256) {
				b = f->pos;
				slot = &x->child[x->index[f->pos++] - 1];
			}
			break;
		}
		default: {
			art_n256 *x = (art_n256 *)n;
			while (f->pos < 256 && x->child[f->pos] == NULL)
				f->pos++;
			if (f->pos < 256) {
				b = f->pos;
				slot = &x->child[f->pos++];
			}
			break;
		}
		}
		if (slot == NULL) {
			it->depth--;
			continue;
		}
		/* path has room for base + 1 bytes (art__path_node reserved it). */
		it->path.data[base] = (uint8_t)b;
		it->path.len = base + 1;
		if (!IS_LEAF(*slot)) {
			if (art__push(it, NODE(*slot), -1, base + 1) != KV_OK)
				return false;
			continue;
		}
	leaf:
		if (IS_INLINE(*slot)) {
			e->key = it->path.data;
			e->klen = it->path.len;
		} else {
			const uint8_t *v;
			size_t vl;
			kv_item_parse(LEAF_ITEM(*slot), &e->key, &e->klen, &v, &vl);
		}
		leaf_value(slot, &e->val, &e->vlen);
		return true;
	}
	return false;
}
