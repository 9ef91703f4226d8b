/*
 * config_codec.c - configuration <-> protobuf (config_codec.h), and the
 * helpers every codec of proto/ shares (codec_int.h).
 *
 * Decoding copies everything out of the unpacked message, which is freed
 * before returning; encoding builds a tree that borrows the config's bytes
 * and frees only the tree's own nodes.
 */
#include "proto/config_codec.h"
#include "common/err.h"
#include "proto/codec_int.h"

#include <stdlib.h>
#include <string.h>

static int
bytes_from_pb(kv_buf *dst, ProtobufCBinaryData b, size_t max)
{
	memset(dst, 0, sizeof(*dst));
	if (b.len > max)
		return KV_EPROTO;
	return b.len ? kv_buf_set(dst, b.data, b.len) : KV_OK;
}

static inline ProtobufCBinaryData
bytes_to_pb(const kv_buf *b)
{
	ProtobufCBinaryData d = {.len = b->len, .data = b->data};
	return d;
}

/* A range's primary, replica set, ISR and leader epoch. A range that
 * names no sets, or only its primary in both, is single (config.h);
 * kv_config_validate checks the rest. */
static int
range_sets_from_pb(const Shardkv__Range *r, kv_range *x)
{
	x->leader_epoch = r->leader_epoch;
	x->node = r->node_id;
	if ((r->n_replicas == 0 && r->n_insync == 0) ||
	    (r->n_replicas == 1 && r->n_insync == 1 && r->replicas[0] == r->node_id &&
	     r->insync[0] == r->node_id)) {
		kv_range_set_single(x, r->node_id);
		return KV_OK;
	}
	if (r->n_replicas < 2 || r->n_replicas > KV_MAX_REPLICAS || r->n_insync < 1 ||
	    r->n_insync > r->n_replicas)
		return KV_EPROTO;
	x->nreplicas = (uint32_t)r->n_replicas;
	x->ninsync = (uint32_t)r->n_insync;
	memcpy(x->replicas, r->replicas, r->n_replicas * sizeof(uint32_t));
	memcpy(x->insync, r->insync, r->n_insync * sizeof(uint32_t));
	if (r->n_replacing != r->n_replaced || r->n_replacing >= r->n_replicas)
		return KV_EPROTO;
	x->nreplacing = (uint32_t)r->n_replacing;
	if (r->n_replacing) { /* protobuf-c leaves an empty array NULL: no memcpy from NULL */
		memcpy(x->replacing, r->replacing, r->n_replacing * sizeof(uint32_t));
		memcpy(x->replaced, r->replaced, r->n_replaced * sizeof(uint32_t));
	}
	x->fence = r->fence;
	return KV_OK;
}

int
kv_codec_config_from_pb(const Shardkv__Config *pb, kv_config **out)
{
	kv_config *c;
	int rv = KV_ENOMEM;

	if (pb == NULL || out == NULL)
		return KV_EINVAL;
	if ((c = kv_config_new()) == NULL)
		return KV_ENOMEM;
	c->epoch = pb->epoch;
	c->time_ms = pb->time_ms;
	c->min_insync = pb->min_insync;
	if (pb->cluster_id && pb->cluster_id[0] && (c->cluster_id = strdup(pb->cluster_id)) == NULL)
		goto err;
	if (pb->n_nodes && (c->nodes = calloc(pb->n_nodes, sizeof(kv_node))) == NULL)
		goto err;
	for (size_t i = 0; i < pb->n_nodes; i++, c->nnodes++) {
		const Shardkv__Node *n = pb->nodes[i];
		if (n->address == NULL || strlen(n->address) > 1024) {
			rv = KV_EPROTO;
			goto err;
		}
		c->nodes[i].id = n->id;
		c->nodes[i].state = (kv_node_state)n->state;
		if ((c->nodes[i].address = strdup(n->address)) == NULL)
			goto err;
	}
	if (pb->n_ranges && (c->ranges = calloc(pb->n_ranges, sizeof(kv_range))) == NULL)
		goto err;
	for (size_t i = 0; i < pb->n_ranges; i++) {
		const Shardkv__Range *r = pb->ranges[i];
		c->nranges++;
		if ((rv = range_sets_from_pb(r, &c->ranges[i])) != KV_OK)
			goto err;
		if ((rv = bytes_from_pb(&c->ranges[i].start, r->start, KV_HARD_MAX_KEY)) != KV_OK ||
		    (rv = bytes_from_pb(&c->ranges[i].end, r->end, KV_HARD_MAX_KEY)) != KV_OK)
			goto err;
	}
	if (pb->n_migrations &&
	    (c->migs = calloc(pb->n_migrations, sizeof(kv_migration))) == NULL) {
		rv = KV_ENOMEM;
		goto err;
	}
	for (size_t i = 0; i < pb->n_migrations; i++) {
		c->nmigs++;
		if ((rv = kv_codec_migration_from_pb(pb->migrations[i], &c->migs[i])) != KV_OK)
			goto err;
	}
	if (pb->n_pins > KV_MAX_PINS) {
		rv = KV_EPROTO;
		goto err;
	}
	if (pb->n_pins && (c->pins = calloc(pb->n_pins, sizeof(kv_span))) == NULL) {
		rv = KV_ENOMEM;
		goto err;
	}
	for (size_t i = 0; i < pb->n_pins; i++) {
		c->npins++;
		if (pb->pins[i] == NULL) {
			rv = KV_EPROTO;
			goto err;
		}
		if ((rv = bytes_from_pb(&c->pins[i].start, pb->pins[i]->start, KV_HARD_MAX_KEY)) !=
		        KV_OK ||
		    (rv = bytes_from_pb(&c->pins[i].end, pb->pins[i]->end, KV_HARD_MAX_KEY)) !=
		        KV_OK)
			goto err;
	}
	if (kv_config_validate(c) != KV_OK) {
		rv = KV_EPROTO;
		goto err;
	}
	*out = c;
	return KV_OK;
err:
	kv_config_free(c);
	return rv == KV_ENOMEM || rv == KV_EPROTO ? rv : KV_EPROTO;
}

int
kv_codec__pack(const ProtobufCMessage *m, nng_msg **out)
{
	size_t n = protobuf_c_message_get_packed_size(m);
	nng_msg *msg;

	if (nng_msg_alloc(&msg, n) != 0)
		return KV_ENOMEM;
	protobuf_c_message_pack(m, nng_msg_body(msg));
	*out = msg;
	return KV_OK;
}

int
kv_codec_migration_from_pb(const Shardkv__Migration *m, kv_migration *x)
{
	int rv;

	memset(x, 0, sizeof(*x));
	if (m == NULL)
		return KV_EPROTO;
	x->id = m->id;
	x->epoch = m->epoch;
	x->from = m->from_node;
	x->to = m->to_node;
	x->phase = (kv_mig_phase)m->phase;
	x->keys_copied = m->keys_copied;
	x->bytes_copied = m->bytes_copied;
	x->keys_total = m->keys_total;
	x->bytes_total = m->bytes_total;
	x->rate_bytes_s = m->rate_bytes_s;
	x->eta_ms = m->eta_ms;
	x->progress_age_ms = m->progress_age_ms;
	x->rate_limit_mb_s = m->rate_limit_mb_s;
	if (x->phase < KV_MIG_PENDING || x->phase > KV_MIG_FAILED)
		return KV_EPROTO;
	if ((rv = bytes_from_pb(&x->start, m->start, KV_HARD_MAX_KEY)) != KV_OK ||
	    (rv = bytes_from_pb(&x->end, m->end, KV_HARD_MAX_KEY)) != KV_OK)
		return rv;
	return KV_OK;
}

void
kv_codec_migration_to_pb(const kv_migration *m, Shardkv__Migration *pb)
{
	shardkv__migration__init(pb);
	pb->id = m->id;
	pb->epoch = m->epoch;
	pb->start = bytes_to_pb(&m->start);
	pb->end = bytes_to_pb(&m->end);
	pb->from_node = m->from;
	pb->to_node = m->to;
	pb->phase = (Shardkv__MigrationPhase)m->phase;
	pb->keys_copied = m->keys_copied;
	pb->bytes_copied = m->bytes_copied;
	pb->keys_total = m->keys_total;
	pb->bytes_total = m->bytes_total;
	pb->rate_limit_mb_s = m->rate_limit_mb_s;
	pb->rate_bytes_s = m->rate_bytes_s;
	pb->eta_ms = m->eta_ms;
	pb->progress_age_ms = m->progress_age_ms;
}

Shardkv__Config *
kv_codec_config_to_pb(const kv_config *c)
{
	Shardkv__Config *pb = calloc(1, sizeof(*pb));

	if (pb == NULL)
		return NULL;
	shardkv__config__init(pb);
	pb->epoch = c->epoch;
	pb->time_ms = c->time_ms;
	pb->min_insync = c->min_insync;
	if (c->cluster_id)
		pb->cluster_id = c->cluster_id;
	pb->nodes = calloc(c->nnodes ? c->nnodes : 1, sizeof(*pb->nodes));
	pb->ranges = calloc(c->nranges ? c->nranges : 1, sizeof(*pb->ranges));
	pb->migrations = calloc(c->nmigs ? c->nmigs : 1, sizeof(*pb->migrations));
	pb->pins = calloc(c->npins ? c->npins : 1, sizeof(*pb->pins));
	if (pb->nodes == NULL || pb->ranges == NULL || pb->migrations == NULL || pb->pins == NULL)
		goto err;
	for (size_t i = 0; i < c->nnodes; i++, pb->n_nodes++) {
		Shardkv__Node *n = malloc(sizeof(*n));
		if (n == NULL)
			goto err;
		shardkv__node__init(n);
		n->id = c->nodes[i].id;
		n->address = c->nodes[i].address;
		n->state = (Shardkv__NodeState)c->nodes[i].state;
		pb->nodes[i] = n;
	}
	for (size_t i = 0; i < c->nranges; i++, pb->n_ranges++) {
		Shardkv__Range *r = malloc(sizeof(*r));
		if (r == NULL)
			goto err;
		shardkv__range__init(r);
		r->start = bytes_to_pb(&c->ranges[i].start);
		r->end = bytes_to_pb(&c->ranges[i].end);
		r->node_id = c->ranges[i].node;
		/* The arrays are borrowed from the config, like the bytes; a range
		 * whose only replica is its primary sends neither (the form
		 * configurations had before replica sets). */
		if (c->ranges[i].nreplicas > 0) {
			r->n_replicas = c->ranges[i].nreplicas;
			r->replicas = (uint32_t *)c->ranges[i].replicas;
			r->n_insync = c->ranges[i].ninsync;
			r->insync = (uint32_t *)c->ranges[i].insync;
			r->n_replacing = r->n_replaced = c->ranges[i].nreplacing;
			r->replacing = (uint32_t *)c->ranges[i].replacing;
			r->replaced = (uint32_t *)c->ranges[i].replaced;
			r->fence = c->ranges[i].fence;
		}
		r->leader_epoch = c->ranges[i].leader_epoch;
		pb->ranges[i] = r;
	}
	for (size_t i = 0; i < c->nmigs; i++, pb->n_migrations++) {
		Shardkv__Migration *m = malloc(sizeof(*m));
		if (m == NULL)
			goto err;
		kv_codec_migration_to_pb(&c->migs[i], m);
		pb->migrations[i] = m;
	}
	for (size_t i = 0; i < c->npins; i++, pb->n_pins++) {
		Shardkv__KeySpan *k = malloc(sizeof(*k));
		if (k == NULL)
			goto err;
		shardkv__key_span__init(k);
		k->start = bytes_to_pb(&c->pins[i].start);
		k->end = bytes_to_pb(&c->pins[i].end);
		pb->pins[i] = k;
	}
	return pb;
err:
	kv_codec_config_pb_free(pb);
	return NULL;
}

void
kv_codec_config_pb_free(Shardkv__Config *pb)
{
	if (pb == NULL)
		return;
	for (size_t i = 0; i < pb->n_nodes; i++)
		free(pb->nodes[i]);
	for (size_t i = 0; i < pb->n_ranges; i++)
		free(pb->ranges[i]);
	for (size_t i = 0; i < pb->n_migrations; i++)
		free(pb->migrations[i]);
	for (size_t i = 0; i < pb->n_pins; i++)
		free(pb->pins[i]);
	free(pb->pins);
	free(pb->nodes);
	free(pb->ranges);
	free(pb->migrations);
	free(pb);
}

int
kv_codec_config_pack(const kv_config *c, kv_buf *out)
{
	Shardkv__Config *pb = kv_codec_config_to_pb(c);
	size_t n;
	int rv;

	if (pb == NULL)
		return KV_ENOMEM;
	n = shardkv__config__get_packed_size(pb);
	rv = kv_buf_reserve(out, n ? n : 1);
	if (rv == KV_OK)
		out->len = shardkv__config__pack(pb, out->data);
	kv_codec_config_pb_free(pb);
	return rv;
}

int
kv_codec_config_unpack(const uint8_t *p, size_t n, kv_config **out)
{
	Shardkv__Config *pb = shardkv__config__unpack(NULL, n, p);
	int rv;

	if (pb == NULL)
		return KV_EPROTO;
	rv = kv_codec_config_from_pb(pb, out);
	shardkv__config__free_unpacked(pb, NULL);
	return rv;
}
