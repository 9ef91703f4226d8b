/*
 * test_codec.c - every message of every codec family of proto/ goes through
 * its encoder and back through its decoder, and comes out equal: the
 * configuration (config_codec.h), AdminRequest and AdminResponse
 * (admin_codec.h), the transfer messages and their ack (xfer_codec.h) and
 * Request/Response (data_codec.h). Fields are compared one by one, so a
 * field added to a struct but forgotten by one side of its codec fails here.
 *
 * Only public codec headers are included: the test sees the wire through
 * the codecs, as the client, the server and the controller do.
 */
#include "common/bytes.h"
#include "common/config.h"
#include "common/err.h"
#include "common/key.h"
#include "proto/admin_codec.h"
#include "proto/config_codec.h"
#include "proto/data_codec.h"
#include "proto/repl_codec.h"
#include "proto/xfer_codec.h"

#include <nng/nng.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define B(s)         ((kv_bytes){(const uint8_t *)(s), sizeof(s) - 1})

static void
assert_bytes(kv_bytes a, kv_bytes b)
{
	assert_int_equal(a.len, b.len);
	if (a.len)
		assert_memory_equal(a.p, b.p, a.len);
}

static void
assert_buf(const kv_buf *a, const kv_buf *b)
{
	assert_bytes((kv_bytes){a->data, a->len}, (kv_bytes){b->data, b->len});
}

static void
assert_str(const char *a, const char *b)
{
	assert_string_equal(a ? a : "", b ? b : "");
}

static void
set(kv_buf *b, const char *s)
{
	memset(b, 0, sizeof(*b));
	if (s[0])
		assert_int_equal(kv_buf_set(b, s, strlen(s)), KV_OK);
}

/* Two nodes, two ranges split at "m", one migration of [a, c) (epoch e). */
static kv_config *
sample_config(uint64_t e)
{
	kv_config *c = kv_config_new();

	assert_non_null(c);
	c->epoch = e;
	c->time_ms = 1700000000000ull + e;
	c->cluster_id = strdup("00000000c0ffee00");
	c->nodes = calloc(2, sizeof(kv_node));
	c->ranges = calloc(2, sizeof(kv_range));
	c->migs = calloc(1, sizeof(kv_migration));
	assert_true(c->cluster_id && c->nodes && c->ranges && c->migs);
	c->nodes[0] = (kv_node){.id = 1, .address = strdup("tcp://h:1"), .state = KV_NODE_ACTIVE};
	c->nodes[1] = (kv_node){.id = 2, .address = strdup("tcp://h:2"), .state = KV_NODE_JOINING};
	c->nnodes = 2;
	set(&c->ranges[0].start, "");
	set(&c->ranges[0].end, "m");
	c->ranges[0].node = 1;
	set(&c->ranges[1].start, "m");
	set(&c->ranges[1].end, "");
	c->ranges[1].node = 2;
	c->nranges = 2;
	c->migs[0] = (kv_migration){.id = 4,
	                            .epoch = e,
	                            .from = 1,
	                            .to = 2,
	                            .phase = KV_MIG_CATCHUP,
	                            .keys_copied = 10,
	                            .bytes_copied = 1000,
	                            .keys_total = 20,
	                            .bytes_total = 2000,
	                            .rate_bytes_s = 500,
	                            .eta_ms = 2000,
	                            .rate_limit_mb_s = 3,
	                            .progress_age_ms = e};
	set(&c->migs[0].start, "a");
	set(&c->migs[0].end, "c");
	c->nmigs = 1;
	assert_int_equal(kv_config_validate(c), KV_OK);
	return c;
}

static void
assert_migration(const kv_migration *a, const kv_migration *b)
{
	assert_int_equal(a->id, b->id);
	assert_int_equal(a->epoch, b->epoch);
	assert_buf(&a->start, &b->start);
	assert_buf(&a->end, &b->end);
	assert_int_equal(a->from, b->from);
	assert_int_equal(a->to, b->to);
	assert_int_equal(a->phase, b->phase);
	assert_int_equal(a->keys_copied, b->keys_copied);
	assert_int_equal(a->bytes_copied, b->bytes_copied);
	assert_int_equal(a->keys_total, b->keys_total);
	assert_int_equal(a->bytes_total, b->bytes_total);
	assert_int_equal(a->rate_bytes_s, b->rate_bytes_s);
	assert_int_equal(a->eta_ms, b->eta_ms);
	assert_int_equal(a->rate_limit_mb_s, b->rate_limit_mb_s);
	assert_int_equal(a->progress_age_ms, b->progress_age_ms);
}

static void
assert_config(const kv_config *a, const kv_config *b)
{
	assert_non_null(a);
	assert_non_null(b);
	assert_int_equal(a->epoch, b->epoch);
	assert_int_equal(a->time_ms, b->time_ms);
	assert_int_equal(a->min_insync, b->min_insync);
	assert_str(a->cluster_id, b->cluster_id);
	assert_int_equal(a->nnodes, b->nnodes);
	for (size_t i = 0; i < a->nnodes; i++) {
		assert_int_equal(a->nodes[i].id, b->nodes[i].id);
		assert_str(a->nodes[i].address, b->nodes[i].address);
		assert_int_equal(a->nodes[i].state, b->nodes[i].state);
	}
	assert_int_equal(a->nranges, b->nranges);
	for (size_t i = 0; i < a->nranges; i++) {
		assert_buf(&a->ranges[i].start, &b->ranges[i].start);
		assert_buf(&a->ranges[i].end, &b->ranges[i].end);
		assert_int_equal(a->ranges[i].node, b->ranges[i].node);
		assert_int_equal(a->ranges[i].leader_epoch, b->ranges[i].leader_epoch);
		assert_true(kv_range_same_placement(&a->ranges[i], &b->ranges[i]));
	}
	assert_int_equal(a->nmigs, b->nmigs);
	for (size_t i = 0; i < a->nmigs; i++)
		assert_migration(&a->migs[i], &b->migs[i]);
	assert_int_equal(a->npins, b->npins);
	for (size_t i = 0; i < a->npins; i++) {
		assert_buf(&a->pins[i].start, &b->pins[i].start);
		assert_buf(&a->pins[i].end, &b->pins[i].end);
	}
}

static kv_bytes
KB(const char *s)
{
	return (kv_bytes){(const uint8_t *)s, strlen(s)};
}

static void
assert_pin(const kv_config *c, size_t i, const char *start, const char *end)
{
	assert_true(i < c->npins);
	assert_int_equal(c->pins[i].start.len, strlen(start));
	assert_memory_equal(c->pins[i].start.data, start, strlen(start));
	assert_int_equal(c->pins[i].end.len, strlen(end));
	assert_memory_equal(c->pins[i].end.data, end, strlen(end));
}

/* Pins (doc/scheduler.md "Pins") are key spans kept sorted and disjoint:
 * a pin overlapping or touching others merges with them, an empty one is
 * refused, there are at most KV_MAX_PINS, and they travel with the
 * configuration through clone, pack and unpack. */
static void
pins_merge_stay_sorted_and_round_trip(void **state)
{
	kv_config *c = sample_config(7), *d = NULL, *e = NULL;
	kv_buf b = {0};

	(void)state;
	assert_int_equal(kv_config_pin(c, KB("m"), KB("p")), KV_OK);
	assert_int_equal(kv_config_pin(c, KB("b"), KB("c")), KV_OK);
	assert_int_equal(kv_config_pin(c, KB("x"), KB("")), KV_OK); /* to the end */
	assert_int_equal(c->npins, 3);
	assert_pin(c, 0, "b", "c");
	assert_pin(c, 1, "m", "p");
	assert_pin(c, 2, "x", "");
	assert_int_equal(kv_config_pin(c, KB("c"), KB("d")), KV_OK); /* touches [b, c) */
	assert_int_equal(kv_config_pin(c, KB("n"), KB("y")), KV_OK); /* spans two */
	assert_int_equal(c->npins, 2);
	assert_pin(c, 0, "b", "d");
	assert_pin(c, 1, "m", "");
	assert_int_equal(kv_config_pin(c, KB("q"), KB("b")), KV_EINVAL);
	assert_int_equal(kv_config_pin(c, KB("q"), KB("q")), KV_EINVAL);
	assert_int_equal(kv_config_validate(c), KV_OK);
	assert_true(kv_config_pinned(c, KB("a"), KB("bb"), false));
	assert_false(kv_config_pinned(c, KB("a"), KB("bb"), true));
	assert_true(kv_config_pinned(c, KB("ba"), KB("c"), true));
	assert_true(kv_config_pinned(c, KB("zz"), KB(""), true));
	assert_false(kv_config_pinned(c, KB("d"), KB("m"), false));
	assert_false(kv_config_pinned(c, KB(""), KB("b"), false));

	assert_int_equal(kv_codec_config_pack(c, &b), KV_OK);
	assert_int_equal(kv_codec_config_unpack(b.data, b.len, &d), KV_OK);
	assert_config(c, d);
	assert_non_null(e = kv_config_clone(d));
	assert_config(d, e);
	kv_config_unpin_all(e);
	assert_int_equal(e->npins, 0);
	assert_int_equal(kv_config_validate(e), KV_OK);
	kv_config_free(e);
	kv_config_free(d);
	kv_buf_fini(&b);

	/* Overlapping or unsorted pins from the wire or the disk are refused. */
	kv_buf t = c->pins[0].start;
	c->pins[0].start = c->pins[1].start;
	c->pins[1].start = t;
	assert_int_equal(kv_config_validate(c), KV_EINVAL);
	assert_int_equal(kv_codec_config_pack(c, &b), KV_OK);
	d = NULL;
	assert_int_equal(kv_codec_config_unpack(b.data, b.len, &d), KV_EPROTO);
	assert_null(d);
	kv_buf_fini(&b);
	kv_config_unpin_all(c);

	/* At most KV_MAX_PINS; a pin that would exceed them changes nothing. */
	for (int i = 0; i < KV_MAX_PINS; i++) {
		char k[2][8];
		snprintf(k[0], sizeof(k[0]), "p%03d", 2 * i);
		snprintf(k[1], sizeof(k[1]), "p%03d", 2 * i + 1);
		assert_int_equal(kv_config_pin(c, KB(k[0]), KB(k[1])), KV_OK);
	}
	assert_int_equal(kv_config_pin(c, KB("q"), KB("r")), KV_ELIMIT);
	assert_int_equal(c->npins, KV_MAX_PINS);
	assert_int_equal(kv_config_pin(c, KB("p000"), KB("p003")), KV_OK); /* merges two */
	assert_int_equal(c->npins, KV_MAX_PINS - 1);
	assert_int_equal(kv_config_validate(c), KV_OK);
	kv_config_free(c);
}

/* ------------------------------------------------------------ config */

static void
config_round_trips_through_pack_and_unpack(void **state)
{
	kv_config *c = sample_config(7), *d = NULL;
	kv_buf b = {0};

	(void)state;
	assert_int_equal(kv_codec_config_pack(c, &b), KV_OK);
	assert_int_equal(kv_codec_config_unpack(b.data, b.len, &d), KV_OK);
	assert_config(c, d);
	kv_config_free(d);
	kv_buf_fini(&b);
	/* A node that is down (doc/contract.md §2) keeps its state. */
	c->nodes[0].state = KV_NODE_DOWN;
	assert_int_equal(kv_config_validate(c), KV_OK);
	assert_int_equal(kv_codec_config_pack(c, &b), KV_OK);
	assert_int_equal(kv_codec_config_unpack(b.data, b.len, &d), KV_OK);
	assert_int_equal(d->nodes[0].state, KV_NODE_DOWN);
	assert_config(c, d);
	kv_config_free(d);
	kv_config_free(c);
	kv_buf_fini(&b);
}

/* Three nodes; range 0 has replicas {1, 3, 2} with ISR {1, 3}. */
static kv_config *
replicated_config(void)
{
	kv_config *c = sample_config(9);
	kv_node *n = realloc(c->nodes, 3 * sizeof(kv_node));

	assert_non_null(n);
	c->nodes = n;
	c->nodes[2] = (kv_node){.id = 3, .address = strdup("tcp://h:3"), .state = KV_NODE_ACTIVE};
	c->nnodes = 3;
	kv_range *r = &c->ranges[0];
	r->nreplicas = 3;
	r->replicas[0] = 1;
	r->replicas[1] = 3;
	r->replicas[2] = 2;
	r->ninsync = 2;
	r->insync[0] = 1;
	r->insync[1] = 3;
	r->leader_epoch = 8;
	c->ranges[1].leader_epoch = 5;
	c->min_insync = 2;
	assert_int_equal(kv_config_validate(c), KV_OK);
	return c;
}

static void
replica_sets_and_leader_epochs_round_trip(void **state)
{
	kv_config *c = replicated_config(), *d = NULL;
	kv_buf b = {0};

	(void)state;
	assert_int_equal(kv_codec_config_pack(c, &b), KV_OK);
	assert_int_equal(kv_codec_config_unpack(b.data, b.len, &d), KV_OK);
	assert_config(c, d);
	assert_int_equal(kv_range_nreplicas(&d->ranges[0]), 3);
	assert_int_equal(kv_range_replica(&d->ranges[0], 1), 3);
	assert_int_equal(kv_range_ninsync(&d->ranges[0]), 2);
	assert_true(kv_range_has_replica(&d->ranges[0], 2, false));
	assert_false(kv_range_has_replica(&d->ranges[0], 2, true));
	/* A single range reads as {node} in both sets. */
	assert_int_equal(kv_range_nreplicas(&d->ranges[1]), 1);
	assert_int_equal(kv_range_insync(&d->ranges[1], 0), 2);
	/* --min-insync travels with the configuration. */
	assert_int_equal(d->min_insync, 2);
	kv_config_free(d);
	kv_buf_fini(&b);
	/* So does a replacement in progress: 2 joins in place of 3. */
	c->ranges[0].nreplacing = 1;
	c->ranges[0].replacing[0] = 2;
	c->ranges[0].replaced[0] = 3;
	assert_int_equal(kv_config_validate(c), KV_OK);
	assert_int_equal(kv_codec_config_pack(c, &b), KV_OK);
	assert_int_equal(kv_codec_config_unpack(b.data, b.len, &d), KV_OK);
	assert_config(c, d);
	assert_int_equal(kv_range_replacement(&d->ranges[0], 2, true), 3);
	assert_int_equal(kv_range_replacement(&d->ranges[0], 3, false), 2);
	kv_config_free(d);
	kv_config_free(c);
	kv_buf_fini(&b);
}

static void
bad_replica_sets_are_refused(void **state)
{
	(void)state;
	/* Each case breaks one rule of config.h's invariant. */
	for (int k = 0; k < 10; k++) {
		kv_config *c = replicated_config();
		kv_range *r = &c->ranges[0];
		switch (k) {
		case 0: /* the primary is not first */
			r->replicas[0] = 3;
			r->replicas[1] = 1;
			break;
		case 1:                   /* an ISR member is not a replica */
			r->nreplicas = 2; /* {1, 3}; the ISR names 3, then 2 */
			r->insync[1] = 2;
			break;
		case 2: /* a replica twice */
			r->replicas[2] = 3;
			break;
		case 3: /* an unknown node */
			r->replicas[2] = 9;
			break;
		case 4: /* a gone node */
			c->nodes[1].state = KV_NODE_GONE;
			c->ranges[1].node = 1; /* the gone node owns no range itself */
			c->ranges[1].leader_epoch = 6;
			break;
		case 5: /* an ISR larger than the replica set */
			r->ninsync = 4;
			break;
		case 6: /* a single range with an ISR */
			c->ranges[1].ninsync = 1;
			break;
		case 7: /* a replacement that is not a replica */
			r->nreplacing = 1;
			r->replacing[0] = 9;
			r->replaced[0] = 3;
			break;
		case 8: /* a member in two replacements */
			r->nreplacing = 2;
			r->replacing[0] = 2;
			r->replaced[0] = 3;
			r->replacing[1] = 3;
			r->replaced[1] = 1;
			break;
		case 9: /* a single range with a replacement */
			c->ranges[1].nreplacing = 1;
			break;
		}
		assert_int_equal(kv_config_validate(c), KV_EINVAL);
		kv_config_free(c);
	}
}

static void
adjacent_ranges_with_the_same_placement_are_refused(void **state)
{
	kv_config *c = sample_config(3);

	(void)state;
	c->ranges[1].node = 1;
	assert_int_equal(kv_config_validate(c), KV_EINVAL);
	/* The same primary with another leader epoch is another range. */
	c->ranges[1].leader_epoch = 2;
	assert_int_equal(kv_config_validate(c), KV_OK);
	kv_config_free(c);
}

/* ------------------------------------------------------------ admin */

static void
assert_range_stat(const kv_admin_range_stat *a, const kv_admin_range_stat *b)
{
	assert_bytes(a->start, b->start);
	assert_bytes(a->end, b->end);
	assert_int_equal(a->keys, b->keys);
	assert_int_equal(a->bytes, b->bytes);
	assert_true(a->ops == b->ops);
	assert_int_equal(a->nsplit, b->nsplit);
	for (size_t i = 0; i < a->nsplit; i++)
		assert_bytes(a->split[i], b->split[i]);
	assert_true(a->reads == b->reads);
	assert_true(a->writes == b->writes);
	assert_bytes(a->load_split, b->load_split);
	assert_int_equal(a->nlsplit, b->nlsplit);
	for (size_t i = 0; i < a->nlsplit; i++)
		assert_bytes(a->lsplit[i], b->lsplit[i]);
	assert_bytes(a->hot_key, b->hot_key);
	assert_true(a->hot_share == b->hot_share);
}

static void
assert_admin_req(const kv_admin_req *a, const kv_admin_req *b)
{
	assert_int_equal(a->op, b->op);
	assert_int_equal(a->dry_run, b->dry_run);
	assert_int_equal(a->request_id, b->request_id);
	assert_int_equal(a->client_id, b->client_id);
	assert_int_equal(a->wait, b->wait);
	assert_int_equal(a->timeout_ms, b->timeout_ms);
	assert_bytes(a->auth, b->auth);
	assert_str(a->address, b->address);
	assert_int_equal(a->node_id, b->node_id);
	assert_int_equal(a->no_rebalance, b->no_rebalance);
	assert_int_equal(a->join, b->join);
	assert_int_equal(a->accept_data_loss, b->accept_data_loss);
	assert_int_equal(a->lease_only, b->lease_only);
	assert_bytes(a->start, b->start);
	assert_bytes(a->end, b->end);
	assert_int_equal(a->rate_mb_s, b->rate_mb_s);
	assert_int_equal(a->epoch, b->epoch);
	assert_int_equal(a->mig_id, b->mig_id);
	assert_int_equal(a->history, b->history);
	assert_int_equal(a->max_configs, b->max_configs);
	assert_str(a->cluster_id, b->cluster_id);
	assert_int_equal(a->boot_id, b->boot_id);
	assert_int_equal(a->nranges, b->nranges);
	for (size_t i = 0; i < a->nranges; i++)
		assert_range_stat(&a->ranges[i], &b->ranges[i]);
	assert_int_equal(a->keys, b->keys);
	assert_int_equal(a->bytes, b->bytes);
	assert_int_equal(a->memory, b->memory);
	assert_int_equal(a->uptime_ms, b->uptime_ms);
	assert_true(a->ops == b->ops);
	assert_int_equal(a->phase, b->phase);
	assert_int_equal(a->keys_copied, b->keys_copied);
	assert_int_equal(a->bytes_copied, b->bytes_copied);
	assert_int_equal(a->keys_total, b->keys_total);
	assert_int_equal(a->bytes_total, b->bytes_total);
	assert_int_equal(a->rate_bytes_s, b->rate_bytes_s);
	assert_int_equal(a->result, b->result);
	assert_str(a->error, b->error);
	assert_int_equal(a->last_seq, b->last_seq);
	assert_int_equal(a->leader_epoch, b->leader_epoch);
	assert_int_equal(a->add_node, b->add_node);
	assert_int_equal(a->remove_node, b->remove_node);
	assert_int_equal(a->unfence_node, b->unfence_node);
}

static void
every_admin_request_round_trips(void **state)
{
	kv_bytes split[3] = {B("b"), B("d"), B("f")};
	kv_bytes lsplit[3] = {B("bb"), B("c"), B("cc")};
	kv_admin_range_stat rs[2] = {
	    {.start = B(""),
	     .end = B("m"),
	     .keys = 3,
	     .bytes = 30,
	     .ops = 1.5,
	     .nsplit = 3,
	     .split = split,
	     .reads = 1.0,
	     .writes = 0.5,
	     .load_split = B("c"),
	     .hot_key = B("c"),
	     .hot_share = 0.75,
	     .nlsplit = 3,
	     .lsplit = lsplit},
	    {.start = B("m"), .end = B(""), .keys = 0, .bytes = 0, .ops = 0.25}};
	const kv_admin_req all[] = {
	    {.op = KV_ADM_JOIN,
	     .request_id = 1,
	     .client_id = 9,
	     .address = "tcp://h:3",
	     .no_rebalance = true,
	     .auth = B("secret"),
	     .wait = true,
	     .timeout_ms = 700},
	    {.op = KV_ADM_LEAVE, .request_id = 2, .node_id = 2},
	    {.op = KV_ADM_LEAVE, .request_id = 3, .address = "tcp://h:2"},
	    {.op = KV_ADM_MOVE,
	     .request_id = 4,
	     .start = B("a"),
	     .end = B("k"),
	     .node_id = 2,
	     .rate_mb_s = 5},
	    {.op = KV_ADM_MOVE, .request_id = 5, .start = B("a"), .address = "tcp://h:1"},
	    {.op = KV_ADM_REBALANCE, .request_id = 6, .rate_mb_s = 8},
	    {.op = KV_ADM_MOVE,
	     .dry_run = true,
	     .request_id = 20,
	     .start = B("c"),
	     .end = B(""),
	     .node_id = 3,
	     .rate_mb_s = 2},
	    {.op = KV_ADM_MOVE, .dry_run = true, .request_id = 21, .address = "tcp://h:1"},
	    {.op = KV_ADM_REBALANCE, .dry_run = true, .request_id = 22, .rate_mb_s = 4},
	    {.op = KV_ADM_GET_CONFIG, .request_id = 7, .epoch = 3},
	    {.op = KV_ADM_STATUS, .request_id = 8},
	    {.op = KV_ADM_CANCEL, .request_id = 9, .mig_id = 4},
	    {.op = KV_ADM_REGISTER,
	     .request_id = 10,
	     .address = "tcp://h:4",
	     .node_id = 4,
	     .join = true,
	     .no_rebalance = true,
	     .boot_id = 77,
	     .cluster_id = "c0ffee",
	     .epoch = 12},
	    {.op = KV_ADM_HEARTBEAT,
	     .request_id = 11,
	     .node_id = 1,
	     .boot_id = 77,
	     .epoch = 12,
	     .nranges = 2,
	     .ranges = rs,
	     .keys = 3,
	     .bytes = 30,
	     .memory = 1 << 20,
	     .ops = 1.75,
	     .uptime_ms = 86400123},
	    {.op = KV_ADM_PROGRESS,
	     .request_id = 12,
	     .mig_id = 4,
	     .node_id = 1,
	     .phase = KV_MIG_FENCED,
	     .keys_copied = 5,
	     .bytes_copied = 50,
	     .keys_total = 6,
	     .bytes_total = 60,
	     .rate_bytes_s = 1000},
	    {.op = KV_ADM_DONE,
	     .request_id = 13,
	     .mig_id = 4,
	     .node_id = 1,
	     .result = KV_EIO,
	     .error = "disk",
	     .keys = 6,
	     .bytes = 60,
	     .last_seq = 99},
	    {.op = KV_ADM_HEARTBEAT,
	     .request_id = 15,
	     .node_id = 3,
	     .boot_id = 7,
	     .lease_only = true},
	    {.op = KV_ADM_REMOVE, .request_id = 16, .node_id = 2, .accept_data_loss = true},
	    {.op = KV_ADM_REMOVE, .request_id = 17, .address = "tcp://h:2"},
	    {.op = KV_ADM_ISR_CHANGE,
	     .request_id = 18,
	     .node_id = 2,
	     .start = B("b"),
	     .end = B("k"),
	     .leader_epoch = 7,
	     .add_node = 3},
	    {.op = KV_ADM_ISR_CHANGE,
	     .request_id = 19,
	     .node_id = 2,
	     .leader_epoch = 7,
	     .remove_node = 1},
	    {.op = KV_ADM_ISR_CHANGE,
	     .request_id = 23,
	     .node_id = 2,
	     .start = B("a"),
	     .leader_epoch = 9,
	     .unfence_node = 1},
	    {.op = KV_ADM_WATCH,
	     .request_id = 14,
	     .epoch = 5,
	     .history = true,
	     .max_configs = 9,
	     .node_id = 3,
	     .timeout_ms = 1000},
	};

	(void)state;
	for (size_t i = 0; i < ARRAY_LEN(all); i++) {
		nng_msg *m;
		kv_admin_req d;
		char why[128];
		assert_int_equal(kv_admin_req_encode(&all[i], &m), KV_OK);
		assert_int_equal(
		    kv_admin_req_decode(nng_msg_body(m), nng_msg_len(m), &d, why, sizeof(why)),
		    KV_OK);
		assert_admin_req(&all[i], &d);
		kv_admin_req_fini(&d);
		nng_msg_free(m);
	}
}

static void
admin_request_without_a_command_is_refused(void **state)
{
	kv_admin_req q = {.op = (kv_admin_op)99};
	nng_msg *m = NULL;

	(void)state;
	assert_int_equal(kv_admin_req_encode(&q, &m), KV_EINVAL);
	assert_null(m);
}

static void
a_dry_run_of_a_command_without_one_is_refused(void **state)
{
	kv_admin_req q = {.op = KV_ADM_JOIN, .dry_run = true, .address = "tcp://h:1"};
	/* AdminRequest{version: 1, dry_run: AdminDryRun{}}: no command inside. */
	static const uint8_t empty[] = {0x08, 0x01, 0xaa, 0x01, 0x00};
	nng_msg *m = NULL;
	kv_admin_req d;
	char why[128];

	(void)state;
	assert_int_equal(kv_admin_req_encode(&q, &m), KV_EINVAL);
	assert_null(m);
	q.op = KV_ADM_STATUS;
	assert_int_equal(kv_admin_req_encode(&q, &m), KV_EINVAL);
	assert_int_equal(kv_admin_req_decode(empty, sizeof(empty), &d, why, sizeof(why)),
	                 KV_EINVAL);
	assert_non_null(strstr(why, "dry run without a command"));
	kv_admin_req_fini(&d);
}

/* A plan with a step from a node to itself, or from node 0, is refused. */
static void
a_plan_naming_no_move_is_refused(void **state)
{
	kv_migration bad[2] = {{.from = 2, .to = 2, .phase = KV_MIG_PENDING},
	                       {.from = 0, .to = 1, .phase = KV_MIG_PENDING}};
	nng_msg *m;
	kv_admin_resp d;

	(void)state;
	for (size_t i = 0; i < 2; i++) {
		kv_admin_resp r = {.request_id = 1, .epoch = 3, .plan = &bad[i], .nplan = 1};
		assert_int_equal(kv_admin_resp_encode(&r, &m), KV_OK);
		assert_int_equal(kv_admin_resp_decode(nng_msg_body(m), nng_msg_len(m), &d),
		                 KV_EPROTO);
		assert_null(d.priv);
		nng_msg_free(m);
	}
}

static void
assert_balance(const kv_admin_balance *a, size_t na, const kv_admin_balance *b, size_t nb)
{
	assert_int_equal(na, nb);
	for (size_t i = 0; i < na; i++) {
		assert_int_equal(a[i].time_ms, b[i].time_ms);
		assert_str(a[i].kind, b[i].kind);
		assert_str(a[i].reason, b[i].reason);
		assert_str(a[i].what, b[i].what);
	}
}

static void
assert_admin_resp(const kv_admin_resp *a, const kv_admin_resp *b)
{
	assert_int_equal(a->request_id, b->request_id);
	assert_int_equal(a->err, b->err);
	if (a->err != KV_OK)
		assert_str(a->error && a->error[0] ? a->error : kv_strerror(a->err), b->error);
	assert_int_equal(a->epoch, b->epoch);
	assert_int_equal(a->config != NULL, b->config != NULL);
	if (a->config)
		assert_config(a->config, b->config);
	assert_int_equal(a->nconfigs, b->nconfigs);
	for (size_t i = 0; i < a->nconfigs; i++)
		assert_config(a->configs[i], b->configs[i]);
	assert_int_equal(a->wait_ms, b->wait_ms);
	assert_int_equal(a->node_id, b->node_id);
	assert_int_equal(a->ranges_lost, b->ranges_lost);
	assert_int_equal(a->nmig_ids, b->nmig_ids);
	for (size_t i = 0; i < a->nmig_ids; i++)
		assert_int_equal(a->mig_ids[i], b->mig_ids[i]);
	assert_int_equal(a->not_leader, b->not_leader);
	assert_int_equal(a->leader_id, b->leader_id);
	if (a->not_leader)
		assert_str(a->leader_address, b->leader_address);
	assert_int_equal(a->term, b->term);
	assert_int_equal(a->commit_index, b->commit_index);
	assert_int_equal(a->nplan, b->nplan);
	for (size_t i = 0; i < a->nplan; i++)
		assert_migration(&a->plan[i], &b->plan[i]);
	assert_balance(a->balance_plan, a->nbalance_plan, b->balance_plan, b->nbalance_plan);
	assert_int_equal(a->report != NULL, b->report != NULL);
	if (a->report == NULL)
		return;
	assert_balance(a->report->balance, a->report->nbalance, b->report->balance,
	               b->report->nbalance);
	assert_int_equal(a->report->nnodes, b->report->nnodes);
	for (size_t i = 0; i < a->report->nnodes; i++) {
		const kv_admin_node_stat *x = &a->report->nodes[i], *y = &b->report->nodes[i];
		assert_int_equal(x->node_id, y->node_id);
		assert_int_equal(x->keys, y->keys);
		assert_int_equal(x->bytes, y->bytes);
		assert_int_equal(x->memory, y->memory);
		assert_int_equal(x->epoch_applied, y->epoch_applied);
		assert_int_equal(x->last_seen_ms, y->last_seen_ms);
		assert_int_equal(x->uptime_ms, y->uptime_ms);
		assert_true(x->ops == y->ops);
		assert_int_equal(x->nranges, y->nranges);
		for (size_t j = 0; j < x->nranges; j++)
			assert_range_stat(&x->ranges[j], &y->ranges[j]);
	}
	assert_int_equal(a->report->nmigs, b->report->nmigs);
	for (size_t i = 0; i < a->report->nmigs; i++)
		assert_migration(&a->report->migs[i], &b->report->migs[i]);
	if (a->report->nreplicas == 0) {
		/* A standalone controller reports itself as the one replica. */
		assert_int_equal(b->report->nreplicas, 1);
		assert_int_equal(b->report->replicas[0].id, 1);
		assert_int_equal(b->report->replicas[0].role, KV_ADMIN_ROLE_STANDALONE);
		assert_str(a->report->address, b->report->replicas[0].address);
		return;
	}
	assert_int_equal(a->report->nreplicas, b->report->nreplicas);
	for (size_t i = 0; i < a->report->nreplicas; i++) {
		const kv_admin_replica *x = &a->report->replicas[i], *y = &b->report->replicas[i];
		assert_int_equal(x->id, y->id);
		assert_str(x->address, y->address);
		assert_int_equal(x->role, y->role);
		assert_int_equal(x->term, y->term);
		assert_int_equal(x->index, y->index);
	}
}

static void
every_admin_response_round_trips(void **state)
{
	kv_config *c3 = sample_config(3), *c4 = sample_config(4);
	const kv_config *hist[2] = {c3, c4};
	kv_bytes split[1] = {B("g")};
	kv_admin_range_stat st = {.start = B(""),
	                          .end = B("m"),
	                          .keys = 5,
	                          .bytes = 50,
	                          .ops = 2.5,
	                          .nsplit = 1,
	                          .split = split};
	kv_admin_node_stat ns[2] = {{.node_id = 1,
	                             .keys = 5,
	                             .bytes = 50,
	                             .ops = 2.0,
	                             .nranges = 1,
	                             .ranges = &st,
	                             .epoch_applied = 4},
	                            {.node_id = 2,
	                             .keys = 7,
	                             .bytes = 70,
	                             .memory = 1 << 20,
	                             .last_seen_ms = 12,
	                             .uptime_ms = 3600000}};
	kv_admin_replica reps[2] = {
	    {.id = 1, .address = "tcp://c:1", .role = KV_ADMIN_ROLE_LEADER, .term = 3, .index = 9},
	    {.id = 2,
	     .address = "tcp://c:2",
	     .role = KV_ADMIN_ROLE_FOLLOWER,
	     .term = 3,
	     .index = 8}};
	kv_admin_report solo = {
	    .nnodes = 2, .nodes = ns, .nmigs = c4->nmigs, .migs = c4->migs, .address = "tcp://c:0"};
	kv_admin_balance bal[2] = {
	    {.time_ms = 1700000000000u, .kind = "move", .reason = "bytes", .what = "move [a, b)"},
	    {.kind = "hot_key", .reason = "hot_key", .what = "hot_key \"k\""}};
	kv_admin_report raft = {.nnodes = 1,
	                        .nodes = ns,
	                        .nreplicas = 2,
	                        .replicas = reps,
	                        .nbalance = 2,
	                        .balance = bal};
	uint64_t ids[2] = {6, 7};
	kv_migration plan[2] = {{.epoch = 5,
	                         .start = {(uint8_t *)"", 0},
	                         .end = {(uint8_t *)"g", 1},
	                         .from = 1,
	                         .to = 2,
	                         .phase = KV_MIG_PENDING,
	                         .keys_total = 40,
	                         .bytes_total = 4000,
	                         .rate_limit_mb_s = 3},
	                        {.epoch = 5,
	                         .start = {(uint8_t *)"g", 1},
	                         .end = {(uint8_t *)"", 0},
	                         .from = 3,
	                         .to = 2,
	                         .phase = KV_MIG_PENDING}};
	const kv_admin_resp all[] = {
	    {.request_id = 11,
	     .epoch = 4,
	     .config = c4,
	     .plan = plan,
	     .nplan = 2,
	     .balance_plan = bal + 1,
	     .nbalance_plan = 1},
	    {.request_id = 1, .epoch = 3, .config = c3},
	    {.request_id = 2, .epoch = 2, .node_id = 1, .config = c3},
	    {.request_id = 3, .epoch = 4, .configs = hist, .nconfigs = 2},
	    {.request_id = 4, .epoch = 4, .config = c4, .report = &solo},
	    {.request_id = 5, .epoch = 4, .report = &raft, .term = 3, .commit_index = 9},
	    {.request_id = 6, .epoch = 5, .mig_ids = ids, .nmig_ids = 2, .wait_ms = 14},
	    {.request_id = 7, .err = KV_ENOTFOUND, .error = "no node 9"},
	    {.request_id = 10, .epoch = 6, .node_id = 2, .ranges_lost = 3, .config = c4},
	    {.request_id = 8, .err = KV_EUNAVAIL},
	    {.request_id = 9,
	     .err = KV_EUNAVAIL,
	     .not_leader = true,
	     .leader_id = 2,
	     .leader_address = "tcp://c:2",
	     .term = 4},
	};

	(void)state;
	for (size_t i = 0; i < ARRAY_LEN(all); i++) {
		nng_msg *m;
		kv_admin_resp d;
		assert_int_equal(kv_admin_resp_encode(&all[i], &m), KV_OK);
		assert_int_equal(kv_admin_resp_decode(nng_msg_body(m), nng_msg_len(m), &d), KV_OK);
		assert_admin_resp(&all[i], &d);
		kv_admin_resp_fini(&d);
		nng_msg_free(m);
	}
	kv_config_free(c3);
	kv_config_free(c4);
}

static void
taken_configs_belong_to_the_caller_oldest_first(void **state)
{
	kv_config *c3 = sample_config(3), *c4 = sample_config(4), **got;
	const kv_config *hist[2] = {c3, c4};
	kv_admin_resp single = {.config = c4},
	              watch = {.config = c3, .configs = hist, .nconfigs = 2};
	kv_admin_resp d;
	nng_msg *m;

	(void)state;
	assert_int_equal(kv_admin_resp_encode(&watch, &m), KV_OK);
	assert_int_equal(kv_admin_resp_decode(nng_msg_body(m), nng_msg_len(m), &d), KV_OK);
	nng_msg_free(m);
	assert_int_equal(kv_admin_resp_take_configs(&d, &got), 2);
	assert_null(d.config);
	assert_int_equal(d.nconfigs, 0);
	kv_admin_resp_fini(&d);
	assert_config(c3, got[0]);
	assert_config(c4, got[1]);
	kv_config_free(got[0]);
	kv_config_free(got[1]);
	free(got);

	assert_int_equal(kv_admin_resp_encode(&single, &m), KV_OK);
	assert_int_equal(kv_admin_resp_decode(nng_msg_body(m), nng_msg_len(m), &d), KV_OK);
	nng_msg_free(m);
	assert_int_equal(kv_admin_resp_take_configs(&d, &got), 1);
	assert_config(c4, got[0]);
	kv_config_free(got[0]);
	free(got);
	assert_int_equal(kv_admin_resp_take_configs(&d, &got), 0);
	assert_null(got);
	kv_admin_resp_fini(&d);
	kv_config_free(c3);
	kv_config_free(c4);
}

static void
undecodable_admin_response_leaves_nothing_to_free(void **state)
{
	static const uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0x0f};
	kv_admin_resp d;

	(void)state;
	assert_int_equal(kv_admin_resp_decode(junk, sizeof(junk), &d), KV_EPROTO);
	assert_null(d.priv);
	kv_admin_resp_fini(&d);
}

/* ------------------------------------------------------------ data */

static void
assert_op(const kv_op *a, const kv_op *b)
{
	assert_int_equal(a->retry, b->retry);
	assert_int_equal(a->kind, b->kind);
	assert_int_equal(a->request_id, b->request_id);
	assert_bytes(a->key, b->key);
	assert_bytes(a->value, b->value);
	assert_int_equal(a->no_value, b->no_value);
	assert_int_equal(a->nkeys, b->nkeys);
	for (size_t i = 0; i < a->nkeys; i++)
		assert_bytes(a->keys[i], b->keys[i]);
	assert_int_equal(a->nvals, b->nvals);
	for (size_t i = 0; i < a->nvals; i++)
		assert_bytes(a->vals[i], b->vals[i]);
	assert_bytes(a->start, b->start);
	assert_bytes(a->end, b->end);
	assert_bytes(a->prefix, b->prefix);
	assert_bytes(a->cursor, b->cursor);
	assert_int_equal(a->limit, b->limit);
	assert_int_equal(a->keys_only, b->keys_only);
	assert_int_equal(a->max_bytes, b->max_bytes);
}

static void
every_request_op_round_trips_alone_and_in_one_batch(void **state)
{
	kv_bytes keys[3] = {B("k1"), B("k2"), B("k1")}, vals[3] = {B("v1"), B(""), B("v3")};
	kv_op ops[] = {
	    {.kind = KV_OP_GET, .request_id = 0, .key = B("k")},
	    {.kind = KV_OP_PUT, .request_id = 11, .key = B("k"), .value = B("v")},
	    {.kind = KV_OP_DEL, .request_id = 12, .key = B("k"), .no_value = true},
	    {.kind = KV_OP_APPEND, .request_id = 13, .retry = true, .key = B("k"), .value = B("+")},
	    {.kind = KV_OP_MGET, .nkeys = 3, .keys = keys},
	    {.kind = KV_OP_MPUT,
	     .request_id = 14,
	     .nkeys = 3,
	     .keys = keys,
	     .nvals = 3,
	     .vals = vals},
	    {.kind = KV_OP_SCAN,
	     .start = B("a"),
	     .end = B("z"),
	     .prefix = B("u:"),
	     .cursor = B("u:5"),
	     .limit = 10,
	     .keys_only = true,
	     .max_bytes = 4096},
	};

	(void)state;
	for (size_t i = 0; i <= ARRAY_LEN(ops); i++) {
		/* i < ARRAY_LEN: one op; then the whole batch. */
		kv_req r = {.client_id = 77,
		            .request_id = 5,
		            .epoch = 9,
		            .auth = B("tok"),
		            .timeout_ms = 1500,
		            .nops = i < ARRAY_LEN(ops) ? 1 : ARRAY_LEN(ops),
		            .ops = i < ARRAY_LEN(ops) ? &ops[i] : ops};
		kv_req d;
		nng_msg *m;
		const char *why;
		assert_int_equal(kv_data_req_encode(&r, &m), KV_OK);
		assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why),
		                 KV_OK);
		assert_int_equal(d.client_id, r.client_id);
		assert_int_equal(d.request_id, r.request_id);
		assert_int_equal(d.epoch, r.epoch);
		assert_int_equal(d.from_node, 0);
		assert_int_equal(d.timeout_ms, r.timeout_ms);
		assert_bytes(d.auth, r.auth);
		assert_false(d.has_xfer);
		assert_int_equal(d.nops, r.nops);
		for (size_t j = 0; j < r.nops; j++)
			assert_op(&r.ops[j], &d.ops[j]);
		kv_data_req_fini(&d);
		nng_msg_free(m);
	}
}

static void
requests_the_encoder_cannot_state_are_refused(void **state)
{
	kv_op empty_mget = {.kind = KV_OP_MGET};
	kv_bytes k = B("k");
	kv_op uneven = {.kind = KV_OP_MPUT, .nkeys = 1, .keys = &k, .nvals = 0};
	kv_op unknown = {.kind = KV_OP__COUNT};
	kv_op *bad[] = {&empty_mget, &uneven, &unknown};
	kv_req xfer = {.has_xfer = true};
	nng_msg *m = NULL;

	(void)state;
	for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
		kv_req r = {.nops = 1, .ops = bad[i]};
		assert_int_equal(kv_data_req_encode(&r, &m), KV_EINVAL);
	}
	assert_int_equal(kv_data_req_encode(&xfer, &m), KV_EINVAL);
	assert_null(m);
}

static void
set_buf(kv_buf *b, const char *s, size_t n)
{
	memset(b, 0, sizeof(*b));
	assert_int_equal(kv_buf_set(b, s, n), KV_OK);
}

static void
assert_result(const kv_data_result *a, const kv_data_result *b)
{
	assert_int_equal(a->status, b->status);
	assert_str(a->error, b->error);
	assert_int_equal(a->has_value, b->has_value);
	assert_buf(&a->value, &b->value);
	assert_int_equal(a->nvalues, b->nvalues);
	for (size_t i = 0; i < a->nvalues; i++) {
		assert_buf(&a->values[i], &b->values[i]);
		assert_non_null(b->values[i].data);
	}
	assert_int_equal(a->nmissing, b->nmissing);
	for (size_t i = 0; i < a->nmissing; i++)
		assert_int_equal(a->missing[i], b->missing[i]);
	assert_int_equal(a->nentries, b->nentries);
	for (size_t i = 0; i < a->nentries; i++) {
		assert_buf(&a->entries[i].key, &b->entries[i].key);
		assert_buf(&a->entries[i].value, &b->entries[i].value);
	}
	assert_int_equal(a->more, b->more);
	assert_buf(&a->next_cursor, &b->next_cursor);
	assert_int_equal(a->value_len, b->value_len);
	assert_int_equal(a->has_hint, b->has_hint);
	if (!a->has_hint)
		return;
	assert_int_equal(a->hint.epoch, b->hint.epoch);
	assert_buf(&a->hint.start, &b->hint.start);
	assert_buf(&a->hint.end, &b->hint.end);
	assert_int_equal(a->hint.node_id, b->hint.node_id);
	assert_str(a->hint.address, b->hint.address);
}

static void
every_response_shape_round_trips(void **state)
{
	kv_data_result res[6];
	kv_buf vals[2];
	uint32_t missing[1] = {1};
	kv_data_entry ents[2];
	kv_resp r, d;
	nng_msg *m;

	(void)state;
	memset(res, 0, sizeof(res));
	res[0].has_value = true; /* get */
	set_buf(&res[0].value, "val", 3);
	res[1].value_len = 42;     /* append */
	set_buf(&vals[0], "a", 1); /* mget */
	set_buf(&vals[1], "", 0);
	res[2] = (kv_data_result){.status = KV_ENOTFOUND,
	                          .error = "some keys are missing",
	                          .nvalues = 2,
	                          .values = vals,
	                          .nmissing = 1,
	                          .missing = missing};
	set_buf(&ents[0].key, "k1", 2); /* scan */
	set_buf(&ents[0].value, "v1", 2);
	set_buf(&ents[1].key, "k2", 2);
	set_buf(&ents[1].value, "", 0);
	res[3] = (kv_data_result){.nentries = 2, .entries = ents, .more = true};
	set_buf(&res[3].next_cursor, "k3", 2);
	res[4] =
	    (kv_data_result){.status = KV_EWRONGOWNER,
	                     .error = "moved",
	                     .has_hint = true,
	                     .hint = {.epoch = 8, .node_id = 2, .address = strdup("tcp://h:2")}};
	set_buf(&res[4].hint.start, "m", 1);
	set_buf(&res[4].hint.end, "", 0);
	res[5] = (kv_data_result){.status = KV_EMOVING,
	                          .has_hint = true,
	                          .hint = {.node_id = 3}}; /* not yet published: no address */
	set_buf(&res[5].hint.start, "", 0);
	set_buf(&res[5].hint.end, "q", 1);
	r = (kv_resp){.request_id = 5, .epoch = 7, .node_id = 1, .nresults = 6, .results = res};
	assert_int_equal(kv_data_resp_encode(&r, &m), KV_OK);
	assert_int_equal(kv_data_resp_decode(nng_msg_body(m), nng_msg_len(m), &d), KV_OK);
	nng_msg_free(m);
	assert_int_equal(d.request_id, 5);
	assert_int_equal(d.epoch, 7);
	assert_int_equal(d.node_id, 1);
	assert_int_equal(d.status, KV_OK);
	assert_false(d.has_ack);
	assert_int_equal(d.nresults, 6);
	for (size_t i = 0; i < 6; i++)
		assert_result(&res[i], &d.results[i]);
	kv_data_resp_fini(&d);

	/* A refused request: an envelope status and detail, no results. */
	r = (kv_resp){.request_id = 6, .epoch = 7, .status = KV_EAUTH, .error = "no"};
	assert_int_equal(kv_data_resp_encode(&r, &m), KV_OK);
	assert_int_equal(kv_data_resp_decode(nng_msg_body(m), nng_msg_len(m), &d), KV_OK);
	nng_msg_free(m);
	assert_int_equal(d.status, KV_EAUTH);
	assert_str(d.error, "no");
	assert_int_equal(d.nresults, 0);
	kv_data_resp_fini(&d);

	kv_data_result_fini(&res[0]);
	kv_data_result_fini(&res[1]);
	kv_buf_fini(&vals[0]);
	kv_buf_fini(&vals[1]);
	for (size_t i = 0; i < 2; i++) {
		kv_buf_fini(&ents[i].key);
		kv_buf_fini(&ents[i].value);
	}
	kv_buf_fini(&res[3].next_cursor);
	kv_data_result_fini(&res[4]);
	kv_data_result_fini(&res[5]);
}

static void
split_scan_entry_in_a_response_is_refused(void **state)
{
	/* A Response whose scan entry claims to be a slice (KeyValue.value_total
	 * = 9), built by hand: results(6){entries(5){key "k", value "v",
	 * value_total 9}}. */
	static const uint8_t pb[] = {0x32, 0x0a, 0x2a, 0x08, 0x0a, 0x01,
	                             'k',  0x12, 0x01, 'v',  0x20, 0x09};
	kv_resp d;

	(void)state;
	assert_int_equal(kv_data_resp_decode(pb, sizeof(pb), &d), KV_EPROTO);
	assert_null(d.pb);
	kv_data_resp_fini(&d);
}

/* ------------------------------------------------------------ transfer */

static void
assert_dedup(const kv_xfer_dedup *a, const kv_xfer_dedup *b)
{
	assert_int_equal(a->client_id, b->client_id);
	assert_int_equal(a->request_id, b->request_id);
	assert_int_equal(a->status, b->status);
	assert_int_equal(a->value_len, b->value_len);
	assert_bytes(a->value, b->value);
	assert_bytes(a->key, b->key);
	assert_int_equal(a->time_ms, b->time_ms);
}

static void
assert_xfer(const kv_xfer *a, const kv_xfer *b)
{
	assert_int_equal(a->migration_id, b->migration_id);
	assert_int_equal(a->seq, b->seq);
	assert_int_equal(a->kind, b->kind);
	assert_int_equal(a->epoch, b->epoch);
	assert_bytes(a->start, b->start);
	assert_bytes(a->end, b->end);
	assert_int_equal(a->from_node, b->from_node);
	assert_int_equal(a->to_node, b->to_node);
	assert_int_equal(a->keys, b->keys);
	assert_int_equal(a->bytes, b->bytes);
	assert_int_equal(a->nkv, b->nkv);
	for (size_t i = 0; i < a->nkv; i++) {
		assert_bytes(a->kv[i].key, b->kv[i].key);
		assert_bytes(a->kv[i].value, b->kv[i].value);
		assert_int_equal(a->kv[i].value_offset, b->kv[i].value_offset);
		assert_int_equal(a->kv[i].value_total, b->kv[i].value_total);
		assert_int_equal(a->kv[i].expire_at, b->kv[i].expire_at);
	}
	assert_int_equal(a->ndedup, b->ndedup);
	for (size_t i = 0; i < a->ndedup; i++)
		assert_dedup(&a->dedup[i], &b->dedup[i]);
	assert_int_equal(a->last, b->last);
	assert_int_equal(a->ndelta, b->ndelta);
	for (size_t i = 0; i < a->ndelta; i++) {
		const kv_xfer_delta *x = &a->delta[i], *y = &b->delta[i];
		assert_int_equal(x->seq, y->seq);
		assert_int_equal(x->del, y->del);
		assert_bytes(x->key, y->key);
		assert_bytes(x->value, y->value);
		assert_int_equal(x->value_offset, y->value_offset);
		assert_int_equal(x->value_total, y->value_total);
		assert_int_equal(x->expire_at, y->expire_at);
		assert_int_equal(x->has_dedup, y->has_dedup);
		if (x->has_dedup)
			assert_dedup(&x->dedup, &y->dedup);
	}
	assert_int_equal(a->last_write_seq, b->last_write_seq);
	assert_int_equal(a->reason, b->reason);
}

static void
every_transfer_message_round_trips(void **state)
{
	kv_xfer_kv kvs[2] = {{.key = B("a1"), .value = B("v1")},
	                     {.key = B("a2"),
	                      .value = B("lo"),
	                      .value_offset = 2,
	                      .value_total = 6,
	                      .expire_at = 1700000000123ull}};
	kv_xfer_dedup dd[1] = {{.client_id = 5,
	                        .request_id = 6,
	                        .status = KV_OK,
	                        .value_len = 4,
	                        .value = B("old"),
	                        .key = B("a1"),
	                        .time_ms = 1700000000000ull}};
	kv_xfer_delta dl[2] = {
	    {.seq = 1,
	     .key = B("a1"),
	     .value = B("new"),
	     .expire_at = 99,
	     .has_dedup = true,
	     .dedup = {.client_id = 5, .request_id = 7, .key = B("a1"), .time_ms = 1}},
	    {.seq = 2, .del = true, .key = B("a2")}};
	const kv_xfer all[] = {
	    {.migration_id = 4,
	     .seq = 1,
	     .kind = KV_XFER_BEGIN,
	     .epoch = 7,
	     .start = B("a"),
	     .end = B("c"),
	     .from_node = 1,
	     .to_node = 2,
	     .keys = 20,
	     .bytes = 2000},
	    {.migration_id = 4,
	     .seq = 2,
	     .kind = KV_XFER_CHUNK,
	     .nkv = 2,
	     .kv = kvs,
	     .ndedup = 1,
	     .dedup = dd,
	     .last = true},
	    {.migration_id = 4, .seq = 3, .kind = KV_XFER_DELTA, .ndelta = 2, .delta = dl},
	    {.migration_id = 4,
	     .seq = 4,
	     .kind = KV_XFER_FENCE,
	     .last_write_seq = 2,
	     .keys = 2,
	     .bytes = 12},
	    {.migration_id = 4, .seq = 5, .kind = KV_XFER_COMMIT, .epoch = 8},
	    {.migration_id = 4, .seq = 6, .kind = KV_XFER_ABORT, .reason = KV_ENOSPC},
	};

	(void)state;
	for (size_t i = 0; i < ARRAY_LEN(all); i++) {
		nng_msg *m;
		kv_req d;
		const char *why;
		assert_int_equal(kv_xfer_encode(&all[i], 7, 1, B("tok"), &m), KV_OK);
		assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why),
		                 KV_OK);
		assert_int_equal(d.epoch, 7);
		assert_int_equal(d.from_node, 1);
		assert_bytes(d.auth, B("tok"));
		assert_int_equal(d.nops, 0);
		assert_true(d.has_xfer);
		assert_xfer(&all[i], &d.xfer);
		kv_data_req_fini(&d);
		nng_msg_free(m);
	}
}

/* Decodes m, which must be refused with rv and a reason; frees m. */
static void
assert_decode_refused(nng_msg *m, int rv)
{
	kv_req d;
	const char *why = NULL;

	assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why), rv);
	assert_non_null(why);
	kv_data_req_fini(&d);
	nng_msg_free(m);
}

/* A chunk's entries packed in one field (kv_xfer.packed) decode to the same
 * entries as one KeyValue each: whole values, empty ones, deadlines, slices,
 * keys and values whose lengths take more than one varint byte. */
static void
packed_chunk_entries_decode_as_the_entries_they_pack(void **state)
{
	static uint8_t longkey[300], bigval[70000];
	kv_xfer_kv kvs[5] = {
	    {.key = B("a1"), .value = B("v1")},
	    {.key = B("a2"), .value = B(""), .expire_at = 1700000000123ull},
	    {.key = {longkey, sizeof(longkey)}, .value = {bigval, sizeof(bigval)}},
	    {.key = B("a4"), .value = B("lo"), .value_offset = 2, .value_total = 6},
	    {.key = B("a5"), .value = B("x"), .value_total = 1u << 20, .expire_at = UINT64_MAX}};
	kv_xfer x = {.migration_id = 4,
	             .seq = 2,
	             .kind = KV_XFER_CHUNK,
	             .nkv = ARRAY_LEN(kvs),
	             .kv = kvs,
	             .last = true};
	size_t len[2];

	(void)state;
	memset(longkey, 'k', sizeof(longkey));
	memset(bigval, 'v', sizeof(bigval));
	for (int packed = 0; packed < 2; packed++) {
		nng_msg *m;
		kv_req d;
		const char *why;
		x.packed = packed;
		assert_int_equal(kv_xfer_encode(&x, 7, 1, B(""), &m), KV_OK);
		len[packed] = nng_msg_len(m);
		assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why),
		                 KV_OK);
		assert_true(d.has_xfer);
		assert_xfer(&x, &d.xfer);
		assert_int_equal(d.xfer.packed, packed); /* the receiver sees which form came */
		kv_data_req_fini(&d);
		nng_msg_free(m);
	}
	/* No message per entry: smaller than the KeyValue form. */
	assert_true(len[1] < len[0]);
}

/* Finds a packed entry with key "KKKKK" and value "VVV" (flags 0, lengths 5
 * and 3) in an encoded chunk. */
static uint8_t *
packed_entry(nng_msg *m)
{
	static const uint8_t want[] = {0, 5, 3, 'K', 'K', 'K', 'K', 'K', 'V', 'V', 'V'};
	uint8_t *p = nng_msg_body(m);

	for (size_t i = 0; i + sizeof(want) <= nng_msg_len(m); i++)
		if (memcmp(p + i, want, sizeof(want)) == 0)
			return p + i;
	return NULL;
}

static void
packed_chunk_entries_that_do_not_parse_are_refused(void **state)
{
	kv_xfer_kv kvs[1] = {{.key = B("KKKKK"), .value = B("VVV")}};
	kv_xfer x = {.migration_id = 4,
	             .seq = 2,
	             .kind = KV_XFER_CHUNK,
	             .nkv = 1,
	             .kv = kvs,
	             .packed = true};
	/* the byte at `at` of the entry becomes v (the same length: the field's
	 * own length stays right) */
	struct {
		size_t at;
		uint8_t v;
	} cases[] = {
	    {0, 0x04}, /* an unknown flag */
	    {0, 0x01}, /* a deadline flagged: read from the key, the rest cut short */
	    {0, 0x02}, /* a slice flagged: offset and total read from the key */
	    {1, 0},    /* an empty key */
	    {1, 9},    /* a key past the field */
	    {2, 4},    /* a value past the field */
	    {2, 2},    /* the entry leaves a byte, read as the next one's flags */
	    {2, 0x83}, /* a value length that goes on into the key */
	};
	nng_msg *m;
	kv_req d;
	const char *why;

	(void)state;
	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		assert_int_equal(kv_xfer_encode(&x, 7, 1, B(""), &m), KV_OK);
		uint8_t *e = packed_entry(m);
		assert_non_null(e);
		e[cases[i].at] = cases[i].v;
		assert_decode_refused(m, KV_EINVAL);
	}
	/* Untouched, the same chunk decodes. */
	assert_int_equal(kv_xfer_encode(&x, 7, 1, B(""), &m), KV_OK);
	assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why), KV_OK);
	assert_int_equal(d.xfer.nkv, 1);
	assert_bytes(d.xfer.kv[0].key, B("KKKKK"));
	assert_bytes(d.xfer.kv[0].value, B("VVV"));
	kv_data_req_fini(&d);
	nng_msg_free(m);
}

/* More packed entries than a transfer message may carry: refused whole. */
static void
a_packed_chunk_over_the_entry_limit_is_refused(void **state)
{
	size_t n = KV_XFER_MAX_RECS + 1;
	kv_xfer_kv *kvs = calloc(n, sizeof(*kvs));
	kv_xfer x = {.migration_id = 4, .seq = 2, .kind = KV_XFER_CHUNK, .packed = true};
	nng_msg *m;
	kv_req d;
	const char *why = NULL;

	(void)state;
	assert_non_null(kvs);
	for (size_t i = 0; i < n; i++)
		kvs[i] = (kv_xfer_kv){.key = B("k")};
	x.nkv = n;
	x.kv = kvs;
	assert_int_equal(kv_xfer_encode(&x, 7, 1, B(""), &m), KV_OK);
	assert_decode_refused(m, KV_ELIMIT);
	x.nkv = n - 1;
	assert_int_equal(kv_xfer_encode(&x, 7, 1, B(""), &m), KV_OK);
	assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why), KV_OK);
	assert_int_equal(d.xfer.nkv, n - 1);
	kv_data_req_fini(&d);
	nng_msg_free(m);
	free(kvs);
}

/* kv_data_req_is_peer tells a peer's transfer or replication message from
 * a client's request by its top-level fields (kv_data_req_peer_kind: which
 * of the two), and nothing undecodable is a peer's. */
static void
peer_requests_are_told_from_client_requests_without_decoding(void **state)
{
	kv_op get = {.kind = KV_OP_GET, .key = B("k")};
	kv_req client = {
	    .client_id = 5, .request_id = 1, .epoch = 9, .auth = B("tok"), .nops = 1, .ops = &get};
	kv_xfer x = {.migration_id = 4, .seq = 5, .kind = KV_XFER_COMMIT, .epoch = 8};
	kv_repl_msg r = {.from_node = 1, .stream_id = 99, .seq = 6};
	nng_msg *m;
	(void)state;

	assert_int_equal(kv_data_req_encode(&client, &m), KV_OK);
	assert_false(kv_data_req_is_peer(nng_msg_body(m), nng_msg_len(m)));
	/* Cut anywhere, it is no peer's either. */
	for (size_t n = 0; n < nng_msg_len(m); n++)
		assert_false(kv_data_req_is_peer(nng_msg_body(m), n));
	nng_msg_free(m);
	assert_int_equal(kv_xfer_encode(&x, 7, 1, B("tok"), &m), KV_OK);
	assert_true(kv_data_req_is_peer(nng_msg_body(m), nng_msg_len(m)));
	assert_int_equal(kv_data_req_peer_kind(nng_msg_body(m), nng_msg_len(m)), KV_PEER_TRANSFER);
	nng_msg_free(m);
	assert_int_equal(kv_repl_encode(&r, 7, 1, B("tok"), &m), KV_OK);
	assert_true(kv_data_req_is_peer(nng_msg_body(m), nng_msg_len(m)));
	assert_int_equal(kv_data_req_peer_kind(nng_msg_body(m), nng_msg_len(m)), KV_PEER_REPLICATE);
	nng_msg_free(m);
	const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
	                           0xff, 0xff, 0xff, 0xff, 0xff};
	assert_false(kv_data_req_is_peer(garbage, sizeof(garbage)));
}

static void
transfer_ack_round_trips_and_a_refused_envelope_is_its_status(void **state)
{
	kv_resp r = {.request_id = 3,
	             .epoch = 7,
	             .node_id = 2,
	             .has_ack = true,
	             .ack = {.migration_id = 4,
	                     .status = KV_EINVAL,
	                     .error = "gap",
	                     .seq = 5,
	                     .keys = 6,
	                     .bytes = 70,
	                     .packed_ok = true}};
	kv_resp refused = {.request_id = 3, .status = KV_EAUTH};
	kv_xfer_ack a;
	nng_msg *m;

	(void)state;
	assert_int_equal(kv_data_resp_encode(&r, &m), KV_OK);
	assert_int_equal(kv_xfer_ack_decode(nng_msg_body(m), nng_msg_len(m), &a), KV_OK);
	nng_msg_free(m);
	assert_int_equal(a.migration_id, 4);
	assert_int_equal(a.status, KV_EINVAL);
	assert_int_equal(a.seq, 5);
	assert_int_equal(a.keys, 6);
	assert_int_equal(a.bytes, 70);
	assert_true(a.packed_ok);
	r.ack.packed_ok = false; /* an older destination: chunks go as KeyValue */
	assert_int_equal(kv_data_resp_encode(&r, &m), KV_OK);
	assert_int_equal(kv_xfer_ack_decode(nng_msg_body(m), nng_msg_len(m), &a), KV_OK);
	nng_msg_free(m);
	assert_false(a.packed_ok);
	assert_int_equal(kv_data_resp_encode(&refused, &m), KV_OK);
	assert_int_equal(kv_xfer_ack_decode(nng_msg_body(m), nng_msg_len(m), &a), KV_EAUTH);
	nng_msg_free(m);
}

static void
replicate_round_trips_and_bad_batches_are_refused(void **state)
{
	kv_repl_rec recs[2] = {
	    {.leader_epoch = 3, .lsn = 10, .start = B("m"), .payload = B("\001\000abc")},
	    {.leader_epoch = 3, .lsn = 12, .start = B(""), .payload = B("x")},
	};
	kv_repl_msg r = {
	    .from_node = 1, .stream_id = 99, .seq = 5, .commit_lsn = 9, .nrecs = 2, .recs = recs};
	kv_repl_msg empty = {.from_node = 1, .stream_id = 99, .seq = 6};
	kv_repl_msg bad[3] = {r, r, r};
	kv_repl_rec desc[2] = {recs[1], recs[0]};
	kv_repl_rec nolsn[1] = {{.lsn = 0, .payload = B("x")}};
	kv_repl_rec nopay[1] = {{.lsn = 4}};
	nng_msg *m;
	kv_req d;
	const char *why;

	(void)state;
	/* One message per record, and all of them packed in one field. */
	for (int packed = 0; packed < 2; packed++) {
		r.packed = packed;
		assert_int_equal(kv_repl_encode(&r, 7, 1, B("tok"), &m), KV_OK);
		assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why),
		                 KV_OK);
		nng_msg_free(m);
		assert_true(d.has_repl);
		assert_false(d.has_xfer);
		assert_int_equal(d.nops, 0);
		assert_int_equal(d.epoch, 7);
		assert_bytes(d.auth, B("tok"));
		assert_int_equal(d.repl.from_node, 1);
		assert_int_equal(d.repl.stream_id, 99);
		assert_int_equal(d.repl.seq, 5);
		assert_int_equal(d.repl.commit_lsn, 9);
		assert_int_equal(d.repl.nrecs, 2);
		for (size_t i = 0; i < 2; i++) {
			assert_int_equal(d.repl.recs[i].leader_epoch, recs[i].leader_epoch);
			assert_int_equal(d.repl.recs[i].lsn, recs[i].lsn);
			assert_bytes(d.repl.recs[i].start, recs[i].start);
			assert_bytes(d.repl.recs[i].payload, recs[i].payload);
		}
		kv_data_req_fini(&d);
	}
	/* An empty batch (a probe) is fine. */
	assert_int_equal(kv_repl_encode(&empty, 7, 1, B(""), &m), KV_OK);
	assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why), KV_OK);
	assert_true(d.has_repl);
	assert_int_equal(d.repl.nrecs, 0);
	kv_data_req_fini(&d);
	nng_msg_free(m);
	/* Records out of lsn order, without an lsn, without a payload. */
	bad[0].recs = desc;
	bad[1].recs = nolsn;
	bad[1].nrecs = 1;
	bad[2].recs = nopay;
	bad[2].nrecs = 1;
	for (size_t i = 0; i < 6; i++) {
		bad[i % 3].packed = i >= 3;
		assert_int_equal(kv_repl_encode(&bad[i % 3], 7, 1, B(""), &m), KV_OK);
		why = NULL;
		assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why),
		                 KV_EINVAL);
		assert_non_null(why);
		kv_data_req_fini(&d);
		nng_msg_free(m);
	}
	/* No seq. */
	empty.seq = 0;
	assert_int_equal(kv_repl_encode(&empty, 7, 1, B(""), &m), KV_OK);
	assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why), KV_EINVAL);
	kv_data_req_fini(&d);
	nng_msg_free(m);
}

/* Finds the packed record with this lsn in an encoded Replicate: its
 * header (lsn, leader epoch, start and payload lengths, big-endian). */
static uint8_t *
packed_head(nng_msg *m, uint64_t lsn)
{
	uint8_t *p = nng_msg_body(m);
	size_t n = nng_msg_len(m);
	uint8_t want[8];

	kv_put64be(want, lsn);
	for (size_t i = 0; i + 24 <= n; i++)
		if (memcmp(p + i, want, 8) == 0)
			return p + i;
	return NULL;
}

static void
packed_records_with_lengths_past_their_field_are_refused(void **state)
{
	kv_repl_rec recs[2] = {
	    {.leader_epoch = 3, .lsn = 0x0102030405060708ull, .start = B("m"), .payload = B("abc")},
	    {.leader_epoch = 3, .lsn = 0x0102030405060709ull, .start = B("m"), .payload = B("xy")},
	};
	kv_repl_msg r = {
	    .from_node = 1, .stream_id = 99, .seq = 5, .nrecs = 2, .recs = recs, .packed = true};
	/* what each case writes into which header: the start's length (16) or
	 * the payload's (20), of the first or the last record */
	struct {
		int rec, at;
		uint32_t v;
		int rv;
	} cases[] = {
	    {0, 20, 0xffffffffu, KV_EINVAL},         /* a payload past the field */
	    {0, 16, 0xfffffff0u, KV_EINVAL},         /* a start key past the field */
	    {1, 20, 1, KV_EINVAL},                   /* the last record leaves a byte: cut short */
	    {1, 20, 3, KV_EINVAL},                   /* the last payload one byte past the end */
	    {0, 16, 0, KV_EINVAL},                   /* the start key's byte read as a header */
	    {0, 16, KV_HARD_MAX_KEY + 1, KV_EINVAL}, /* a start key longer than a key */
	};
	nng_msg *m;
	kv_req d;
	const char *why;

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		assert_int_equal(kv_repl_encode(&r, 7, 1, B(""), &m), KV_OK);
		uint8_t *h = packed_head(m, recs[cases[i].rec].lsn);
		assert_non_null(h);
		kv_put32be(h + cases[i].at, cases[i].v);
		assert_decode_refused(m, cases[i].rv);
	}
	/* Untouched, the same batch decodes. */
	assert_int_equal(kv_repl_encode(&r, 7, 1, B(""), &m), KV_OK);
	assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why), KV_OK);
	assert_int_equal(d.repl.nrecs, 2);
	assert_bytes(d.repl.recs[1].payload, B("xy"));
	kv_data_req_fini(&d);
	nng_msg_free(m);
}

static void
replicate_copy_steps_and_ends_round_trip_and_mixed_batches_are_refused(void **state)
{
	kv_bytes payloads[2] = {B("\001\000abc"), B("\005\001x")};
	kv_repl_msg cp = {.from_node = 2,
	                  .stream_id = 7,
	                  .seq = 3,
	                  .copy = {.set = true,
	                           .leader_epoch = 9,
	                           .start = B("b"),
	                           .end = B("m"),
	                           .first = true,
	                           .last = false,
	                           .nrecs = 2,
	                           .recs = payloads}};
	kv_repl_msg en = {.from_node = 2,
	                  .stream_id = 7,
	                  .seq = 4,
	                  .end = {.set = true,
	                          .leader_epoch = 9,
	                          .start = B("b"),
	                          .old_primary = 1,
	                          .end_lsn = 41,
	                          .next_lsn = 50,
	                          .end = B("m")}};
	kv_repl_rec rec = {.leader_epoch = 9, .lsn = 5, .start = B("b"), .payload = B("x")};
	kv_bytes empty_pay[1] = {B("")};
	kv_repl_msg bad[4] = {cp, cp, en, en};
	nng_msg *m;
	kv_req d;
	const char *why;

	(void)state;
	assert_int_equal(kv_repl_encode(&cp, 7, 2, B(""), &m), KV_OK);
	assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why), KV_OK);
	nng_msg_free(m);
	assert_true(d.has_repl);
	assert_int_equal(d.repl.nrecs, 0);
	assert_false(d.repl.end.set);
	assert_true(d.repl.copy.set);
	assert_int_equal(d.repl.copy.leader_epoch, 9);
	assert_bytes(d.repl.copy.start, B("b"));
	assert_bytes(d.repl.copy.end, B("m"));
	assert_true(d.repl.copy.first);
	assert_false(d.repl.copy.last);
	assert_false(d.repl.copy.catchup);
	assert_int_equal(d.repl.copy.from_lsn, 0);
	assert_int_equal(d.repl.copy.next_lsn, 0);
	assert_int_equal(d.repl.breaks, 0);
	assert_int_equal(d.repl.copy.nrecs, 2);
	assert_bytes(d.repl.copy.recs[0], payloads[0]);
	assert_bytes(d.repl.copy.recs[1], payloads[1]);
	kv_data_req_fini(&d);
	/* The last step of a copy of an empty range has no records. */
	cp.copy.nrecs = 0;
	cp.copy.last = true;
	assert_int_equal(kv_repl_encode(&cp, 7, 2, B(""), &m), KV_OK);
	assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why), KV_OK);
	nng_msg_free(m);
	assert_true(d.repl.copy.set && d.repl.copy.last);
	assert_int_equal(d.repl.copy.nrecs, 0);
	kv_data_req_fini(&d);
	/* A copy's last step names its base; a catch-up step its position, and
	 * the batch the stream's breaks. */
	cp.copy.next_lsn = 77;
	cp.breaks = 3;
	assert_int_equal(kv_repl_encode(&cp, 7, 2, B(""), &m), KV_OK);
	assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why), KV_OK);
	nng_msg_free(m);
	assert_int_equal(d.repl.copy.next_lsn, 77);
	assert_int_equal(d.repl.breaks, 3);
	assert_false(d.repl.copy.catchup);
	kv_data_req_fini(&d);
	cp.copy.next_lsn = 0;
	cp.copy.catchup = true;
	cp.copy.from_lsn = 12;
	cp.copy.nrecs = 2;
	cp.copy.old_primary = 3;
	cp.copy.old_epoch = 4;
	cp.copy.old_boot = 0xabcdef01u;
	cp.copy.old_end = 41;
	cp.copy.old_at = 90;
	assert_int_equal(kv_repl_encode(&cp, 7, 2, B(""), &m), KV_OK);
	assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why), KV_OK);
	nng_msg_free(m);
	assert_true(d.repl.copy.catchup);
	assert_int_equal(d.repl.copy.from_lsn, 12);
	assert_int_equal(d.repl.copy.old_primary, 3);
	assert_int_equal(d.repl.copy.old_epoch, 4);
	assert_int_equal(d.repl.copy.old_boot, 0xabcdef01u);
	assert_int_equal(d.repl.copy.old_end, 41);
	assert_int_equal(d.repl.copy.old_at, 90);
	assert_int_equal(d.repl.copy.nrecs, 2);
	assert_bytes(d.repl.copy.recs[1], payloads[1]);
	kv_data_req_fini(&d);
	cp.copy.catchup = false;
	cp.copy.from_lsn = 0;
	cp.copy.nrecs = 0;
	cp.copy.old_primary = 0;
	cp.copy.old_epoch = cp.copy.old_boot = cp.copy.old_end = cp.copy.old_at = 0;
	cp.breaks = 0;
	assert_int_equal(kv_repl_encode(&en, 7, 2, B(""), &m), KV_OK);
	assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why), KV_OK);
	nng_msg_free(m);
	assert_true(d.repl.end.set);
	assert_false(d.repl.copy.set);
	assert_int_equal(d.repl.end.leader_epoch, 9);
	assert_bytes(d.repl.end.start, B("b"));
	assert_int_equal(d.repl.end.old_primary, 1);
	assert_int_equal(d.repl.end.end_lsn, 41);
	assert_int_equal(d.repl.end.next_lsn, 50);
	assert_bytes(d.repl.end.end, B("m"));
	kv_data_req_fini(&d);
	/* A copy with records, an empty copy record, an end with a copy, an
	 * end without its old primary. */
	bad[0].nrecs = 1;
	bad[0].recs = &rec;
	bad[1].copy.recs = empty_pay;
	bad[1].copy.nrecs = 1;
	bad[2].copy = cp.copy;
	bad[3].end.old_primary = 0;
	for (size_t i = 0; i < 4; i++) {
		assert_int_equal(kv_repl_encode(&bad[i], 7, 2, B(""), &m), KV_OK);
		assert_int_equal(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &d, &why),
		                 KV_EINVAL);
		assert_non_null(why);
		kv_data_req_fini(&d);
		nng_msg_free(m);
	}
}

static void
replicate_ack_round_trips_and_a_refused_envelope_is_its_status(void **state)
{
	kv_resp r = {.request_id = 3,
	             .epoch = 7,
	             .node_id = 2,
	             .has_rack = true,
	             .rack = {.acked_seq = 4,
	                      .acked_lsn = 40,
	                      .status = KV_ESTALE,
	                      .error = "old",
	                      .diverged = true,
	                      .caught_up = true,
	                      .position = 33,
	                      .packed_ok = true}};
	kv_resp refused = {.request_id = 3, .status = KV_EAUTH};
	kv_repl_ack a;
	kv_resp d;
	nng_msg *m;

	(void)state;
	assert_int_equal(kv_data_resp_encode(&r, &m), KV_OK);
	assert_int_equal(kv_repl_ack_decode(nng_msg_body(m), nng_msg_len(m), &a), KV_OK);
	assert_int_equal(a.acked_seq, 4);
	assert_int_equal(a.acked_lsn, 40);
	assert_int_equal(a.status, KV_ESTALE);
	assert_true(a.diverged);
	assert_true(a.caught_up);
	assert_int_equal(a.position, 33);
	assert_true(a.packed_ok);
	assert_int_equal(kv_data_resp_decode(nng_msg_body(m), nng_msg_len(m), &d), KV_OK);
	assert_true(d.has_rack);
	assert_true(d.rack.diverged);
	assert_true(d.rack.caught_up);
	assert_int_equal(d.rack.position, 33);
	assert_true(d.rack.packed_ok);
	assert_int_equal(d.rack.acked_lsn, 40);
	assert_string_equal(d.rack.error, "old");
	kv_data_resp_fini(&d);
	nng_msg_free(m);
	assert_int_equal(kv_data_resp_encode(&refused, &m), KV_OK);
	assert_int_equal(kv_repl_ack_decode(nng_msg_body(m), nng_msg_len(m), &a), KV_EAUTH);
	nng_msg_free(m);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(config_round_trips_through_pack_and_unpack),
	    cmocka_unit_test(peer_requests_are_told_from_client_requests_without_decoding),
	    cmocka_unit_test(pins_merge_stay_sorted_and_round_trip),
	    cmocka_unit_test(replica_sets_and_leader_epochs_round_trip),
	    cmocka_unit_test(bad_replica_sets_are_refused),
	    cmocka_unit_test(adjacent_ranges_with_the_same_placement_are_refused),
	    cmocka_unit_test(every_admin_request_round_trips),
	    cmocka_unit_test(admin_request_without_a_command_is_refused),
	    cmocka_unit_test(a_dry_run_of_a_command_without_one_is_refused),
	    cmocka_unit_test(a_plan_naming_no_move_is_refused),
	    cmocka_unit_test(every_admin_response_round_trips),
	    cmocka_unit_test(taken_configs_belong_to_the_caller_oldest_first),
	    cmocka_unit_test(undecodable_admin_response_leaves_nothing_to_free),
	    cmocka_unit_test(every_request_op_round_trips_alone_and_in_one_batch),
	    cmocka_unit_test(requests_the_encoder_cannot_state_are_refused),
	    cmocka_unit_test(every_response_shape_round_trips),
	    cmocka_unit_test(split_scan_entry_in_a_response_is_refused),
	    cmocka_unit_test(every_transfer_message_round_trips),
	    cmocka_unit_test(transfer_ack_round_trips_and_a_refused_envelope_is_its_status),
	    cmocka_unit_test(replicate_round_trips_and_bad_batches_are_refused),
	    cmocka_unit_test(packed_records_with_lengths_past_their_field_are_refused),
	    cmocka_unit_test(packed_chunk_entries_decode_as_the_entries_they_pack),
	    cmocka_unit_test(packed_chunk_entries_that_do_not_parse_are_refused),
	    cmocka_unit_test(a_packed_chunk_over_the_entry_limit_is_refused),
	    cmocka_unit_test(
	        replicate_copy_steps_and_ends_round_trip_and_mixed_batches_are_refused),
	    cmocka_unit_test(replicate_ack_round_trips_and_a_refused_envelope_is_its_status),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
