/*
 * fuzz_config.c - the configuration codec (proto/config_codec.c): the bytes of a
 * packed Config, as the controller reads them back from its config log and
 * every component receives them inside AdminResponses, through
 * kv_codec_config_unpack. A configuration that decodes must be valid, pack
 * to bytes that decode to the same configuration (packing twice gives the
 * same bytes), and route every key to a range that contains it.
 */
#include "common/config.h"
#include "common/err.h"
#include "fuzz/fuzz_util.h"
#include "proto/config_codec.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int
buf_eq(const kv_buf *a, const kv_buf *b)
{
	return a->len == b->len && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}

static void
config_eq(const kv_config *a, const kv_config *b)
{
	FZ_CHECK(a->epoch == b->epoch && a->time_ms == b->time_ms);
	FZ_CHECK((a->cluster_id == NULL) == (b->cluster_id == NULL));
	FZ_CHECK(a->cluster_id == NULL || strcmp(a->cluster_id, b->cluster_id) == 0);
	FZ_CHECK(a->nnodes == b->nnodes && a->nranges == b->nranges && a->nmigs == b->nmigs);
	for (size_t i = 0; i < a->nnodes; i++) {
		FZ_CHECK(a->nodes[i].id == b->nodes[i].id &&
		         a->nodes[i].state == b->nodes[i].state);
		FZ_CHECK(strcmp(a->nodes[i].address, b->nodes[i].address) == 0);
	}
	for (size_t i = 0; i < a->nranges; i++) {
		FZ_CHECK(a->ranges[i].node == b->ranges[i].node);
		FZ_CHECK(buf_eq(&a->ranges[i].start, &b->ranges[i].start));
		FZ_CHECK(buf_eq(&a->ranges[i].end, &b->ranges[i].end));
	}
	for (size_t i = 0; i < a->nmigs; i++) {
		const kv_migration *x = &a->migs[i], *y = &b->migs[i];
		FZ_CHECK(x->id == y->id && x->epoch == y->epoch && x->from == y->from &&
		         x->to == y->to && x->phase == y->phase);
		FZ_CHECK(x->keys_copied == y->keys_copied && x->bytes_copied == y->bytes_copied &&
		         x->keys_total == y->keys_total && x->bytes_total == y->bytes_total &&
		         x->rate_bytes_s == y->rate_bytes_s && x->eta_ms == y->eta_ms &&
		         x->rate_limit_mb_s == y->rate_limit_mb_s);
		FZ_CHECK(buf_eq(&x->start, &y->start) && buf_eq(&x->end, &y->end));
	}
}

/* Routes key: the range found must contain it and its owner must exist. */
static void
check_route(const kv_config *c, const void *key, size_t klen)
{
	long ri = kv_config_find_range(c, key, klen);
	uint32_t node = kv_config_route(c, key, klen);

	if (c->nranges == 0) {
		/* no map: only a migration in flight can name a node */
		FZ_CHECK(ri == -1);
		FZ_CHECK(node == 0 || kv_config_node(c, node) != NULL);
		return;
	}
	FZ_CHECK(ri >= 0 && (size_t)ri < c->nranges);
	FZ_CHECK(kv_range_contains(c->ranges[ri].start.data, c->ranges[ri].start.len,
	                           c->ranges[ri].end.data, c->ranges[ri].end.len, key, klen));
	FZ_CHECK(kv_config_node(c, node) != NULL);
	FZ_CHECK(kv_config_node(c, c->ranges[ri].node) != NULL);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kv_config *c = NULL, *c2 = NULL, *cl;
	kv_buf b1 = {0}, b2 = {0};
	int rv;

	rv = kv_codec_config_unpack(data, size, &c);
	if (rv != KV_OK) {
		FZ_CHECK(rv == KV_EPROTO || rv == KV_ENOMEM);
		return 0;
	}
	FZ_CHECK(kv_config_validate(c) == KV_OK);
	FZ_CHECK(kv_codec_config_pack(c, &b1) == KV_OK);
	FZ_CHECK(kv_codec_config_unpack(b1.data, b1.len, &c2) == KV_OK);
	config_eq(c, c2);
	FZ_CHECK(kv_codec_config_pack(c2, &b2) == KV_OK);
	FZ_CHECK(buf_eq(&b1, &b2));
	FZ_CHECK((cl = kv_config_clone(c)) != NULL);
	config_eq(c, cl);

	/* The input's own bytes as keys, and every boundary. */
	for (size_t i = 0; i < size && i < 8; i++)
		check_route(c, data + i, size - i < 16 ? size - i : 16);
	for (size_t i = 0; i < c->nranges; i++)
		if (c->ranges[i].start.len)
			check_route(c, c->ranges[i].start.data, c->ranges[i].start.len);
	for (size_t i = 0; i < c->nmigs; i++) {
		if (c->migs[i].start.len)
			check_route(c, c->migs[i].start.data, c->migs[i].start.len);
		if (c->migs[i].end.len)
			check_route(c, c->migs[i].end.data, c->migs[i].end.len);
	}
	for (size_t i = 0; i < c->nnodes; i++) {
		FZ_CHECK(kv_config_node(c, c->nodes[i].id) == &c->nodes[i]);
		(void)kv_config_node_by_address(c, c->nodes[i].address);
		(void)kv_node_state_name(c->nodes[i].state);
	}
	kv_buf_fini(&b1);
	kv_buf_fini(&b2);
	kv_config_free(c);
	kv_config_free(c2);
	kv_config_free(cl);
	return 0;
}
