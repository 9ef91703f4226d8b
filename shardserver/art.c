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
 */
#include "shardserver/art.h"
#include "common/err.h"
#include "common/key.h"

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

void
kv_art_init(kv_art *t)
{
	t->root = NULL;
	t->index_bytes = 0;
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
art__find(art_node *n, uint8_t b)
{
	switch (n->type) {
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

/* Returns some leaf below n (every leaf below shares n's full prefix). */
static const uint8_t *
art__any_leaf(const art_node *n)
{
	for (;;) {
		void *c = NULL;

		if (n->term != NULL)
			return LEAF_ITEM(n->term);
		ART_FOREACH(n, b, ch, {
			(void)b;
			c = ch;
			goto found;
		});
	found:
		if (c == NULL)
			return NULL; /* unreachable for a well-formed tree */
		if (IS_LEAF(c))
			return LEAF_ITEM(c);
		n = c;
	}
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

uint8_t *
kv_art_get(const kv_art *t, const uint8_t *key, size_t klen)
{
	void *p = t->root;
	size_t depth = 0;

	while (p != NULL) {
		if (IS_LEAF(p)) {
			uint8_t *it = LEAF_ITEM(p);
			return art__leaf_matches(it, key, klen) ? it : NULL;
		}
		art_node *n = p;
		if (n->plen != 0) {
			size_t m = n->plen < ART_MAX_PREFIX ? n->plen : ART_MAX_PREFIX;
			if (depth + n->plen > klen)
				return NULL;
			for (size_t i = 0; i < m; i++)
				if (n->prefix[i] != key[depth + i])
					return NULL;
			/* Bytes past the stored ones are checked at the leaf. */
			depth += n->plen;
		}
		if (depth == klen) {
			if (n->term == NULL)
				return NULL;
			uint8_t *it = LEAF_ITEM(n->term);
			return art__leaf_matches(it, key, klen) ? it : NULL;
		}
		void **slot = art__find(n, key[depth]);
		if (slot == NULL)
			return NULL;
		p = *slot;
		depth++;
	}
	return NULL;
}

/* Stores min(len, 8) bytes of key[from..from+len) as n's prefix. */
static inline void
art__set_prefix(art_node *n, const uint8_t *src, size_t len)
{
	n->plen = (uint32_t)len;
	memcpy(n->prefix, src, len < ART_MAX_PREFIX ? len : ART_MAX_PREFIX);
}

int
kv_art_put(kv_art *t, kv_arena *a, uint8_t *item, uint8_t **old)
{
	void **ref = &t->root;
	size_t klen, depth = 0;
	const uint8_t *key = art__leaf_key(item, &klen);

	*old = NULL;
	for (;;) {
		void *p = *ref;

		if (p == NULL) {
			*ref = MAKE_LEAF(item);
			return KV_OK;
		}
		if (IS_LEAF(p)) {
			uint8_t *cur = LEAF_ITEM(p);
			size_t ol, lcp = 0;
			const uint8_t *ok = art__leaf_key(cur, &ol);

			if (ol == klen && memcmp(ok, key, klen) == 0) {
				*ref = MAKE_LEAF(item);
				*old = cur;
				return KV_OK;
			}
			/* Split the leaf: a node holding the common part of both keys. */
			while (depth + lcp < klen && depth + lcp < ol &&
			       key[depth + lcp] == ok[depth + lcp])
				lcp++;
			art_node *nn = art__alloc(t, a, ART_N4);
			if (nn == NULL)
				return KV_ENOMEM;
			art__set_prefix(nn, key + depth, lcp);
			size_t d2 = depth + lcp;
			if (ol == d2)
				nn->term = p;
			else
				art__add(nn, ok[d2], p);
			if (klen == d2)
				nn->term = MAKE_LEAF(item);
			else
				art__add(nn, key[d2], MAKE_LEAF(item));
			*ref = nn;
			return KV_OK;
		}

		art_node *n = p;
		if (n->plen != 0) {
			size_t mm = art__prefix_mismatch(n, key, klen, depth);
			if (mm < n->plen) {
				/* The key leaves the compressed path: split the prefix. */
				const uint8_t *leafkey = NULL;
				uint8_t nb = art__prefix_byte(n, depth, mm, &leafkey);
				art_node *nn = art__alloc(t, a, ART_N4);
				if (nn == NULL)
					return KV_ENOMEM;
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
				art__add(nn, nb, n);
				if (depth + mm == klen)
					nn->term = MAKE_LEAF(item);
				else
					art__add(nn, key[depth + mm], MAKE_LEAF(item));
				*ref = nn;
				return KV_OK;
			}
			depth += n->plen;
		}
		if (depth == klen) {
			/* The full path was verified above, so a term leaf has this key. */
			*old = n->term ? LEAF_ITEM(n->term) : NULL;
			n->term = MAKE_LEAF(item);
			return KV_OK;
		}
		void **slot = art__find(n, key[depth]);
		if (slot != NULL) {
			ref = slot;
			depth++;
			continue;
		}
		if (art__full(n)) {
			art_node *g = art__retype(t, a, n, (uint8_t)(n->type + 1));
			if (g == NULL)
				return KV_ENOMEM;
			*ref = g;
			n = g;
		}
		art__add(n, key[depth], MAKE_LEAF(item));
		return KV_OK;
	}
}

/* Restores the node invariants of *ref after a removal: shrink a sparse
 * node, replace a node with a single entry by that entry. */
static void
art__tidy(kv_art *t, kv_arena *a, void **ref)
{
	art_node *n = *ref;
	uint8_t smaller = 0;

	if (n->count == 0) {
		/* Only the term leaf can be left (a node always had two entries). */
		void *leaf = n->term;
		art__free(t, a, n);
		*ref = leaf;
		return;
	}
	if (n->count == 1 && n->term == NULL) {
		void *c = NULL;
		uint8_t b = 0;
		ART_FOREACH(n, bb, cc, {
			b = bb;
			c = cc;
		});
		if (!IS_LEAF(c)) {
			/* Merge: child prefix = n prefix + b + child prefix. */
			art_node *cn = c;
			uint8_t buf[ART_MAX_PREFIX];
			size_t k = 0;
			for (size_t i = 0; i < n->plen && i < ART_MAX_PREFIX; i++)
				buf[k++] = n->prefix[i];
			if (k < ART_MAX_PREFIX)
				buf[k++] = b;
			for (size_t i = 0; i < cn->plen && k < ART_MAX_PREFIX; i++)
				buf[k++] = cn->prefix[i];
			memcpy(cn->prefix, buf, k);
			cn->plen = n->plen + 1u + cn->plen;
		}
		art__free(t, a, n);
		*ref = c;
		return;
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
			*ref = m;
	}
}

uint8_t *
kv_art_del(kv_art *t, kv_arena *a, const uint8_t *key, size_t klen)
{
	void **ref = &t->root;
	size_t depth = 0;
	void *p = *ref;

	if (p == NULL)
		return NULL;
	if (IS_LEAF(p)) {
		if (!art__leaf_matches(LEAF_ITEM(p), key, klen))
			return NULL;
		*ref = NULL;
		return LEAF_ITEM(p);
	}
	for (;;) {
		art_node *n = p;
		if (n->plen != 0) {
			size_t m = n->plen < ART_MAX_PREFIX ? n->plen : ART_MAX_PREFIX;
			if (depth + n->plen > klen)
				return NULL;
			for (size_t i = 0; i < m; i++)
				if (n->prefix[i] != key[depth + i])
					return NULL;
			depth += n->plen;
		}
		if (depth == klen) {
			if (n->term == NULL || !art__leaf_matches(LEAF_ITEM(n->term), key, klen))
				return NULL;
			uint8_t *it = LEAF_ITEM(n->term);
			n->term = NULL;
			art__tidy(t, a, ref);
			return it;
		}
		void **slot = art__find(n, key[depth]);
		if (slot == NULL)
			return NULL;
		void *c = *slot;
		if (IS_LEAF(c)) {
			uint8_t *it = LEAF_ITEM(c);
			if (!art__leaf_matches(it, key, klen))
				return NULL;
			art__remove(n, key[depth]);
			art__tidy(t, a, ref);
			return it;
		}
		ref = slot;
		p = c;
		depth++;
	}
}

static void
art__clear_node(kv_art *t, kv_arena *a, void *p, void (*free_item)(void *, uint8_t *), void *arg)
{
	if (p == NULL)
		return;
	if (IS_LEAF(p)) {
		if (free_item)
			free_item(arg, LEAF_ITEM(p));
		return;
	}
	/* An explicit stack: the depth is bounded only by the key length. */
	size_t cap = 64, depth = 0;
	void **stack = malloc(cap * sizeof(void *));
	if (stack == NULL)
		return; /* leak rather than crash; arena blocks are freed anyway */
	stack[depth++] = p;
	while (depth > 0) {
		art_node *n = stack[--depth];
		if (n->term && free_item)
			free_item(arg, LEAF_ITEM(n->term));
		ART_FOREACH(n, b, c, {
			(void)b;
			if (IS_LEAF(c)) {
				if (free_item)
					free_item(arg, LEAF_ITEM(c));
			} else {
				if (depth == cap) {
					void **ns = realloc(stack, cap * 2 * sizeof(void *));
					if (ns == NULL)
						continue;
					stack = ns;
					cap *= 2;
				}
				stack[depth++] = c;
			}
		});
		art__free(t, a, n);
	}
	free(stack);
}

void
kv_art_clear(kv_art *t, kv_arena *a, void (*free_item)(void *arg, uint8_t *item), void *arg)
{
	art__clear_node(t, a, t->root, free_item, arg);
	t->root = NULL;
}

/* --- iteration ---------------------------------------------------------- */

void
kv_art_iter_init(kv_art_iter *it)
{
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
	it->stack = it->inl;
	it->cap = sizeof(it->inl) / sizeof(it->inl[0]);
	it->depth = 0;
}

static int
art__push(kv_art_iter *it, void *n, int pos)
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
	it->stack[it->depth].n = n;
	it->stack[it->depth].pos = pos;
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
	while (p != NULL) {
		if (IS_LEAF(p)) {
			size_t kl;
			const uint8_t *k = art__leaf_key(LEAF_ITEM(p), &kl);
			if (kv_key_cmp(k, kl, start, slen) >= 0)
				it->pending = LEAF_ITEM(p);
			return KV_OK;
		}
		art_node *n = p;
		int c = art__prefix_cmp(n, depth, start, slen);
		if (c < 0)
			return KV_OK;
		if (c > 0)
			return art__push(it, n, -1);
		depth += n->plen;
		if (depth == slen)
			return art__push(it, n, -1);
		uint8_t b = start[depth];
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
				pos = (int)i + 1;
			} else {
				pos = (int)i;
			}
			break;
		}
		default: {
			void **slot = art__find(n, b);
			next = slot ? *slot : NULL;
			pos = (int)b + 1;
			break;
		}
		}
		if (art__push(it, n, pos) != KV_OK)
			return KV_ENOMEM;
		p = next;
		depth++;
	}
	return KV_OK;
}

uint8_t *
kv_art_iter_next(kv_art_iter *it)
{
	if (it->pending != NULL) {
		uint8_t *r = it->pending;
		it->pending = NULL;
		return r;
	}
	while (it->depth > 0) {
		kv_art_frame *f = &it->stack[it->depth - 1];
		art_node *n = f->n;
		void *c = NULL;

		if (f->pos < 0) {
			f->pos = 0;
			if (n->term != NULL)
				return LEAF_ITEM(n->term);
		}
		switch (n->type) {
		case ART_N4:
			if (f->pos < n->count)
				c = ((art_n4 *)n)->child[f->pos++];
			break;
		case ART_N16:
			if (f->pos < n->count)
				c = ((art_n16 *)n)->child[f->pos++];
			break;
		case ART_N48: {
			art_n48 *x = (art_n48 *)n;
			while (f->pos < 256 && x->index[f->pos] == 0)
				f->pos++;
			if (f->pos < 256)
				c = x->child[x->index[f->pos++] - 1];
			break;
		}
		default: {
			art_n256 *x = (art_n256 *)n;
			while (f->pos < 256 && x->child[f->pos] == NULL)
				f->pos++;
			if (f->pos < 256)
				c = x->child[f->pos++];
			break;
		}
		}
		if (c == NULL) {
			it->depth--;
			continue;
		}
		if (IS_LEAF(c))
			return LEAF_ITEM(c);
		if (art__push(it, c, -1) != KV_OK)
			return NULL;
	}
	return NULL;
}
