/*
 * test_controller_placement.c - range placement as pure functions: join
 * splits, move carves and merges, leave balances, rebalance moves little,
 * finished and failed migrations, and refusals that change nothing.
 */
#include "common/config.h"
#include "common/err.h"
#include "controller/placement.h"
#include "proto/config_codec.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

/* ---- helpers ---- */

static kv_bytes
B(const char *s)
{
	kv_bytes b = {(const uint8_t *)s, s ? strlen(s) : 0};
	return b;
}

static void
setbuf_str(kv_buf *b, const char *s)
{
	memset(b, 0, sizeof(*b));
	if (s && s[0])
		assert_int_equal(kv_buf_set(b, s, strlen(s)), KV_OK);
}

/* A config with nodes 1..nnodes (all active) and ranges split at cuts[],
 * owned by owners[] (ncuts + 1 entries). */
static kv_config *
make(size_t nnodes, const char *const *cuts, size_t ncuts, const uint32_t *owners)
{
	kv_config *c = kv_config_new();
	assert_non_null(c);
	c->epoch = 5;
	c->nodes = calloc(nnodes, sizeof(kv_node));
	for (size_t i = 0; i < nnodes; i++) {
		char a[64];
		snprintf(a, sizeof(a), "tcp://127.0.0.1:%zu", 7101 + i);
		c->nodes[i].id = (uint32_t)i + 1;
		c->nodes[i].address = strdup(a);
		c->nodes[i].state = KV_NODE_ACTIVE;
	}
	c->nnodes = nnodes;
	if (owners != NULL) {
		c->ranges = calloc(ncuts + 1, sizeof(kv_range));
		for (size_t i = 0; i <= ncuts; i++) {
			setbuf_str(&c->ranges[i].start, i ? cuts[i - 1] : NULL);
			setbuf_str(&c->ranges[i].end, i < ncuts ? cuts[i] : NULL);
			c->ranges[i].node = owners[i];
		}
		c->nranges = ncuts + 1;
	}
	assert_int_equal(kv_config_validate(c), KV_OK);
	return c;
}

static void
add_mig(kv_config *c, uint64_t id, const char *s, const char *e, uint32_t from, uint32_t to)
{
	c->migs = realloc(c->migs, (c->nmigs + 1) * sizeof(kv_migration));
	kv_migration *m = &c->migs[c->nmigs++];
	memset(m, 0, sizeof(*m));
	m->id = id;
	m->epoch = c->epoch;
	setbuf_str(&m->start, s);
	setbuf_str(&m->end, e);
	m->from = from;
	m->to = to;
	m->phase = KV_MIG_PENDING;
}

static uint32_t
owner(const kv_config *c, const char *key)
{
	long i = kv_config_find_range(c, key, strlen(key));
	return i < 0 ? 0 : c->ranges[i].node;
}

/* n points "kNNN" of `each` bytes, keys spaced from `from`. */
struct pts {
	kv_place_point p[400];
	char keys[400][8];
	size_t n;
};

static void
pts_add(struct pts *s, const char *prefix, int from, int to, uint64_t each)
{
	for (int i = from; i < to; i++) {
		snprintf(s->keys[s->n], sizeof(s->keys[0]), "%s%03d", prefix, i);
		s->p[s->n].key = B(s->keys[s->n]);
		s->p[s->n].bytes = each;
		s->n++;
	}
}

static kv_place_ctx
ctx_of(struct pts *s)
{
	kv_place_ctx x;
	memset(&x, 0, sizeof(x));
	x.next_mig_id = 10;
	if (s) {
		x.points = s->p;
		x.npoints = s->n;
	}
	return x;
}

static uint64_t
within(uint64_t a, uint64_t b)
{
	return a > b ? a - b : b - a;
}

/* ---- join ---- */

static void
first_join_owns_the_whole_key_space(void **state)
{
	kv_config *c = kv_config_new(), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	uint32_t id = 0;
	(void)state;

	assert_int_equal(kv_place_join(c, "tcp://127.0.0.1:7101", true, &x, &n, &id), KV_OK);
	assert_int_equal(id, 1);
	assert_int_equal(n->epoch, 1);
	assert_int_equal(n->nranges, 1);
	assert_int_equal(n->ranges[0].node, 1);
	assert_int_equal(n->nodes[0].state, KV_NODE_ACTIVE);
	assert_int_equal(n->nmigs, 0);
	assert_int_equal(kv_config_validate(n), KV_OK);
	kv_config_free(n);
	kv_config_free(c);
}

static void
join_of_empty_cluster_gives_newcomer_half_the_printable_key_space(void **state)
{
	uint32_t o1[] = {1};
	kv_config *c = make(1, NULL, 0, o1), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	uint32_t id = 0;
	int per[3] = {0};
	(void)state;

	assert_int_equal(kv_place_join(c, "tcp://127.0.0.1:7102", true, &x, &n, &id), KV_OK);
	assert_int_equal(id, 2);
	assert_int_equal(kv_config_validate(n), KV_OK);
	assert_int_equal(n->nmigs, 1);
	assert_int_equal(n->migs[0].from, 1);
	assert_int_equal(n->migs[0].to, 2);
	assert_int_equal(n->migs[0].id, 10);
	assert_int_equal(x.next_mig_id, 11);
	assert_int_equal(kv_config_node(n, 2)->state, KV_NODE_JOINING);
	/* Every printable first byte: each node owns about half of them. */
	for (int b = 0x20; b < 0x7f; b++) {
		char k[2] = {(char)b, 0};
		per[owner(n, k)]++;
	}
	assert_true(per[1] >= 40 && per[1] <= 55);
	assert_true(per[2] >= 40 && per[2] <= 55);
	kv_config_free(n);
	kv_config_free(c);
}

static void
join_splits_at_reported_split_keys_by_size(void **state)
{
	uint32_t o1[] = {1};
	kv_config *c = make(1, NULL, 0, o1), *n = NULL;
	struct pts s = {.n = 0};
	kv_place_ctx x;
	uint32_t id = 0;
	(void)state;

	pts_add(&s, "k", 0, 100, 10); /* 1000 bytes over k000..k099 */
	x = ctx_of(&s);
	assert_int_equal(kv_place_join(c, "tcp://127.0.0.1:7102", true, &x, &n, &id), KV_OK);
	assert_int_equal(n->nmigs, 1);
	/* the cut is one of the reported keys */
	const kv_migration *m = &n->migs[0];
	const kv_buf *cut = m->start.len ? &m->start : &m->end;
	assert_true(cut->len == 4 && cut->data[0] == 'k');
	assert_true(within(kv_place_node_bytes(n, &x, 2), 500) <= 50);
	assert_true(within(kv_place_node_bytes(n, &x, 1), 500) <= 50);
	kv_config_free(n);
	kv_config_free(c);
}

static void
join_with_data_that_cannot_be_cut_falls_back_to_key_space(void **state)
{
	uint32_t o1[] = {1};
	kv_config *c = make(1, NULL, 0, o1), *n = NULL;
	struct pts s = {.n = 0};
	kv_place_ctx x;
	uint32_t id = 0;
	(void)state;

	s.p[0].key = B("");
	s.p[0].bytes = 500; /* one range, no split keys */
	s.n = 1;
	x = ctx_of(&s);
	assert_int_equal(kv_place_join(c, "tcp://127.0.0.1:7102", true, &x, &n, &id), KV_OK);
	assert_int_equal(n->nmigs, 1);
	assert_int_equal(n->nranges, 2);
	kv_config_free(n);
	kv_config_free(c);
}

static void
join_with_balancer_on_and_no_data_registers_and_moves_nothing(void **state)
{
	uint32_t o1[] = {1};
	kv_config *c = make(1, NULL, 0, o1), *n = NULL, *n3 = NULL;
	struct pts s = {.n = 0};
	kv_place_ctx x = ctx_of(NULL);
	uint32_t id = 0;
	(void)state;

	x.join_floor_bytes = 1048576;
	assert_int_equal(kv_place_join(c, "tcp://127.0.0.1:7102", true, &x, &n, &id), KV_OK);
	assert_int_equal(id, 2);
	assert_int_equal(kv_config_validate(n), KV_OK);
	assert_int_equal(n->nmigs, 0);
	assert_int_equal(n->nranges, 1);
	assert_int_equal(n->ranges[0].node, 1);
	assert_int_equal(kv_config_node(n, 2)->state, KV_NODE_ACTIVE);
	/* Some data, under the floor per node: still nothing moves. */
	pts_add(&s, "k", 0, 100, 20000); /* 2 MB over three nodes */
	x = ctx_of(&s);
	x.join_floor_bytes = 1048576;
	assert_int_equal(kv_place_join(n, "tcp://127.0.0.1:7103", true, &x, &n3, &id), KV_OK);
	assert_int_equal(n3->nmigs, 0);
	assert_int_equal(n3->nranges, 1);
	kv_config_free(n3);
	kv_config_free(n);
	kv_config_free(c);
}

static void
join_with_balancer_on_and_data_above_the_floor_takes_a_share(void **state)
{
	uint32_t o1[] = {1};
	kv_config *c = make(1, NULL, 0, o1), *n = NULL;
	struct pts s = {.n = 0};
	kv_place_ctx x;
	uint32_t id = 0;
	(void)state;

	pts_add(&s, "k", 0, 100, 30000); /* 3 MB, 1.5 MB per node */
	x = ctx_of(&s);
	x.join_floor_bytes = 1048576;
	assert_int_equal(kv_place_join(c, "tcp://127.0.0.1:7102", true, &x, &n, &id), KV_OK);
	assert_int_equal(n->nmigs, 1);
	assert_true(within(kv_place_node_bytes(n, &x, 2), 1500000) <= 150000);
	kv_config_free(n);
	kv_config_free(c);
}

static void
join_with_balancer_on_never_cuts_by_key_space_width(void **state)
{
	uint32_t o1[] = {1};
	kv_config *c = make(1, NULL, 0, o1), *n = NULL;
	struct pts s = {.n = 0};
	kv_place_ctx x;
	uint32_t id = 0;
	(void)state;

	s.p[0].key = B("");
	s.p[0].bytes = 5000000; /* one range, no split keys */
	s.n = 1;
	x = ctx_of(&s);
	x.join_floor_bytes = 1048576;
	assert_int_equal(kv_place_join(c, "tcp://127.0.0.1:7102", true, &x, &n, &id), KV_OK);
	assert_int_equal(n->nmigs, 0);
	assert_int_equal(n->nranges, 1);
	assert_int_equal(kv_config_node(n, 2)->state, KV_NODE_ACTIVE);
	kv_config_free(n);
	kv_config_free(c);
}

static void
third_join_takes_a_third_from_both(void **state)
{
	const char *cuts[] = {"k050"};
	uint32_t own[] = {1, 2};
	kv_config *c = make(2, cuts, 1, own), *n = NULL;
	struct pts s = {.n = 0};
	kv_place_ctx x;
	uint32_t id = 0;
	(void)state;

	pts_add(&s, "k", 0, 100, 30); /* 3000 bytes, 1500 each */
	x = ctx_of(&s);
	assert_int_equal(kv_place_join(c, "tcp://127.0.0.1:7103", true, &x, &n, &id), KV_OK);
	assert_int_equal(id, 3);
	assert_int_equal(kv_config_validate(n), KV_OK);
	assert_true(within(kv_place_node_bytes(n, &x, 3), 1000) <= 100);
	assert_true(within(kv_place_node_bytes(n, &x, 1), 1000) <= 100);
	assert_true(within(kv_place_node_bytes(n, &x, 2), 1000) <= 100);
	for (size_t i = 0; i < n->nmigs; i++)
		assert_int_equal(n->migs[i].to, 3);
	kv_config_free(n);
	kv_config_free(c);
}

static void
duplicate_join_is_refused_and_changes_nothing(void **state)
{
	uint32_t o1[] = {1};
	kv_config *c = make(1, NULL, 0, o1), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	uint32_t id = 0;
	(void)state;

	assert_int_equal(kv_place_join(c, "tcp://127.0.0.1:7101", true, &x, &n, &id), KV_EEXISTS);
	assert_null(n);
	assert_int_equal(id, 0);
	assert_non_null(strstr(x.msg, "already registered as node 1"));
	assert_int_equal(kv_place_join(c, "not a url", true, &x, &n, &id), KV_EINVAL);
	assert_null(n);
	assert_int_equal(c->epoch, 5);
	assert_int_equal(c->nnodes, 1);
	kv_config_free(c);
}

static void
join_without_rebalance_registers_only(void **state)
{
	uint32_t o1[] = {1};
	kv_config *c = make(1, NULL, 0, o1), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	uint32_t id = 0;
	(void)state;

	assert_int_equal(kv_place_join(c, "tcp://127.0.0.1:7102", false, &x, &n, &id), KV_OK);
	assert_int_equal(n->nmigs, 0);
	assert_int_equal(n->nranges, 1);
	assert_int_equal(kv_config_node(n, 2)->state, KV_NODE_ACTIVE);
	kv_config_free(n);
	kv_config_free(c);
}

static void
join_of_gone_address_gets_a_new_id(void **state)
{
	uint32_t o[] = {1};
	kv_config *c = make(2, NULL, 0, o), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	uint32_t id = 0;
	(void)state;

	c->nodes[1].state = KV_NODE_GONE;
	assert_int_equal(kv_place_join(c, "tcp://127.0.0.1:7102", false, &x, &n, &id), KV_OK);
	assert_int_equal(id, 3);
	kv_config_free(n);
	kv_config_free(c);
}

/* ---- move ---- */

static void
a_new_primary_gets_the_new_epoch_as_leader_epoch(void **state)
{
	const char *cuts[] = {"g", "p"};
	uint32_t own[] = {1, 2, 1};
	kv_config *c = make(3, cuts, 2, own), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	c->ranges[0].leader_epoch = 2;
	c->ranges[1].leader_epoch = 3;
	c->ranges[2].leader_epoch = 4;
	/* [a, b) leaves node 1 for node 3; the rest of [, g) stays on 1. */
	assert_int_equal(kv_place_move(c, B("a"), B("b"), 3, &x, &n), KV_OK);
	assert_int_equal(kv_config_validate(n), KV_OK);
	assert_int_equal(n->nranges, 5); /* [,a)1 [a,b)3 [b,g)1 [g,p)2 [p,)1 */
	assert_int_equal(n->ranges[0].leader_epoch, 2);
	assert_int_equal(n->ranges[1].node, 3);
	assert_int_equal(n->ranges[1].leader_epoch, 6);
	assert_int_equal(n->ranges[2].leader_epoch, 2);
	assert_int_equal(n->ranges[3].leader_epoch, 3);
	assert_int_equal(n->ranges[4].leader_epoch, 4);
	kv_config_free(n);
	kv_config_free(c);
}

static void
move_carves_from_every_owner_and_merges(void **state)
{
	const char *cuts[] = {"g", "p"};
	uint32_t own[] = {1, 2, 3};
	kv_config *c = make(3, cuts, 2, own), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	assert_int_equal(kv_place_move(c, B("e"), B("r"), 3, &x, &n), KV_OK);
	assert_int_equal(kv_config_validate(n), KV_OK);
	assert_int_equal(n->nranges, 2); /* [,e)1 [e,)3 */
	assert_int_equal(n->ranges[0].node, 1);
	assert_int_equal(n->ranges[1].node, 3);
	assert_memory_equal(n->ranges[1].start.data, "e", 1);
	assert_int_equal(n->nmigs, 2);
	assert_int_equal(n->migs[0].from, 1);
	assert_int_equal(n->migs[0].to, 3);
	assert_memory_equal(n->migs[0].start.data, "e", 1);
	assert_memory_equal(n->migs[0].end.data, "g", 1);
	assert_int_equal(n->migs[1].from, 2);
	assert_memory_equal(n->migs[1].start.data, "g", 1);
	assert_memory_equal(n->migs[1].end.data, "p", 1);
	assert_int_equal(n->migs[0].epoch, 6);
	kv_config_free(n);
	kv_config_free(c);
}

static void
move_inside_one_range_splits_it_in_three(void **state)
{
	uint32_t own[] = {1};
	kv_config *c = make(2, NULL, 0, own), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	assert_int_equal(kv_place_move(c, B("b"), B("c"), 2, &x, &n), KV_OK);
	assert_int_equal(n->nranges, 3);
	assert_int_equal(owner(n, "a"), 1);
	assert_int_equal(owner(n, "b"), 2);
	assert_int_equal(owner(n, "bzzz"), 2);
	assert_int_equal(owner(n, "c"), 1);
	assert_int_equal(n->nmigs, 1);
	kv_config_free(n);
	kv_config_free(c);
}

static void
move_refusals_change_nothing(void **state)
{
	const char *cuts[] = {"m"};
	uint32_t own[] = {1, 2};
	kv_config *c = make(3, cuts, 1, own), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	assert_int_equal(kv_place_move(c, B("b"), B("b"), 2, &x, &n), KV_EINVAL);
	assert_non_null(strstr(x.msg, "empty or inverted"));
	assert_int_equal(kv_place_move(c, B("c"), B("b"), 2, &x, &n), KV_EINVAL);
	assert_int_equal(kv_place_move(c, B("a"), B("b"), 9, &x, &n), KV_ENOTFOUND);
	c->nodes[2].state = KV_NODE_DRAINING;
	assert_int_equal(kv_place_move(c, B("a"), B("b"), 3, &x, &n), KV_EINVAL);
	assert_non_null(strstr(x.msg, "not active"));
	add_mig(c, 4, "k", "m", 1, 2);
	c->ranges[0].end.data[0] = 'k'; /* [,k)1 [k,)2 with [k,m) moving */
	c->ranges[1].start.data[0] = 'k';
	assert_int_equal(kv_config_validate(c), KV_OK);
	assert_int_equal(kv_place_move(c, B("a"), B("l"), 1, &x, &n), KV_EBUSY);
	assert_non_null(strstr(x.msg, "range is moving"));
	assert_null(n);
	assert_int_equal(x.next_mig_id, 10);
	/* next to the migration is fine */
	assert_int_equal(kv_place_move(c, B("m"), B("n"), 1, &x, &n), KV_OK);
	assert_non_null(n);
	assert_int_equal(n->nmigs, 2);
	kv_config_free(n);
	kv_config_free(c);
}

static void
move_to_current_owner_changes_nothing(void **state)
{
	const char *cuts[] = {"m"};
	uint32_t own[] = {1, 2};
	kv_config *c = make(2, cuts, 1, own), *n = (kv_config *)1;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	assert_int_equal(kv_place_move(c, B("a"), B("c"), 1, &x, &n), KV_OK);
	assert_null(n);
	kv_config_free(c);
}

/* ---- leave ---- */

static void
leave_spreads_ranges_over_remaining_nodes_balanced(void **state)
{
	const char *cuts[] = {"b", "c"};
	uint32_t own[] = {1, 2, 3};
	kv_config *c = make(3, cuts, 2, own), *n = NULL;
	struct pts s = {.n = 0};
	kv_place_ctx x;
	(void)state;

	pts_add(&s, "a", 0, 100, 30); /* node 1: 3000 */
	pts_add(&s, "b", 0, 10, 100); /* node 2: 1000 */
	pts_add(&s, "c", 0, 10, 100); /* node 3: 1000 */
	x = ctx_of(&s);
	assert_int_equal(kv_place_leave(c, 1, &x, &n), KV_OK);
	assert_int_equal(kv_config_validate(n), KV_OK);
	assert_int_equal(kv_config_node(n, 1)->state, KV_NODE_DRAINING);
	assert_int_equal(kv_place_node_bytes(n, &x, 1), 0);
	assert_true(within(kv_place_node_bytes(n, &x, 2), 2500) <= 100);
	assert_true(within(kv_place_node_bytes(n, &x, 3), 2500) <= 100);
	for (size_t i = 0; i < n->nmigs; i++)
		assert_int_equal(n->migs[i].from, 1);
	kv_config_free(n);
	kv_config_free(c);
}

static void
leave_refusals_change_nothing(void **state)
{
	const char *cuts[] = {"m"};
	uint32_t own[] = {1, 2};
	kv_config *c = make(2, cuts, 1, own), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	assert_int_equal(kv_place_leave(c, 7, &x, &n), KV_ENOTFOUND);
	c->nodes[1].state = KV_NODE_DRAINING;
	assert_int_equal(kv_place_leave(c, 1, &x, &n), KV_EINVAL);
	assert_non_null(strstr(x.msg, "last active node"));
	c->nodes[1].state = KV_NODE_ACTIVE;
	add_mig(c, 3, "m", "n", 1, 2);
	assert_int_equal(kv_place_leave(c, 2, &x, &n), KV_EBUSY);
	assert_non_null(strstr(x.msg, "destination of migration 3"));
	assert_null(n);
	kv_config_free(c);
}

static void
leave_of_node_that_owns_nothing_makes_it_gone(void **state)
{
	uint32_t own[] = {1};
	kv_config *c = make(2, NULL, 0, own), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	assert_int_equal(kv_place_leave(c, 2, &x, &n), KV_OK);
	assert_int_equal(kv_config_node(n, 2)->state, KV_NODE_GONE);
	assert_int_equal(n->nmigs, 0);
	kv_config *n2 = NULL;
	assert_int_equal(kv_place_leave(n, 2, &x, &n2), KV_EINVAL);
	assert_non_null(strstr(x.msg, "already left"));
	kv_config_free(n);
	kv_config_free(c);
}

/* ---- finish ---- */

static void
finished_drain_makes_the_node_gone(void **state)
{
	const char *cuts[] = {"m"};
	uint32_t own[] = {1, 2};
	kv_config *c = make(2, cuts, 1, own), *n = NULL, *n2 = NULL;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	assert_int_equal(kv_place_leave(c, 2, &x, &n), KV_OK);
	assert_int_equal(n->nmigs, 1);
	assert_int_equal(n->nranges, 1);
	assert_int_equal(kv_place_finish(n, n->migs[0].id, true, &x, &n2), KV_OK);
	assert_int_equal(n2->nmigs, 0);
	assert_int_equal(n2->epoch, n->epoch + 1);
	assert_int_equal(kv_config_node(n2, 2)->state, KV_NODE_GONE);
	kv_config *n3 = NULL;
	assert_int_equal(kv_place_finish(n2, 99, true, &x, &n3), KV_ENOTFOUND);
	assert_null(n3);
	kv_config_free(n2);
	kv_config_free(n);
	kv_config_free(c);
}

static void
failed_migration_returns_the_range_to_its_source(void **state)
{
	uint32_t own[] = {1};
	kv_config *c = make(2, NULL, 0, own), *n = NULL, *n2 = NULL;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	assert_int_equal(kv_place_move(c, B("b"), B("c"), 2, &x, &n), KV_OK);
	assert_int_equal(owner(n, "b"), 2);
	assert_int_equal(kv_place_finish(n, n->migs[0].id, false, &x, &n2), KV_OK);
	assert_int_equal(kv_config_validate(n2), KV_OK);
	assert_int_equal(n2->nranges, 1);
	assert_int_equal(owner(n2, "b"), 1);
	assert_int_equal(n2->nmigs, 0);
	kv_config_free(n2);
	kv_config_free(n);
	kv_config_free(c);
}

/* ---- rebalance ---- */

static void
rebalance_moves_only_the_excess(void **state)
{
	const char *cuts[] = {"b", "c"};
	uint32_t own[] = {1, 2, 3};
	kv_config *c = make(3, cuts, 2, own), *n = NULL;
	struct pts s = {.n = 0};
	kv_place_ctx x;
	(void)state;

	pts_add(&s, "a", 0, 100, 20); /* node 1: 2000 */
	pts_add(&s, "b", 0, 100, 10); /* node 2: 1000 */
	pts_add(&s, "c", 0, 1, 1);    /* node 3: ~0 */
	x = ctx_of(&s);
	assert_int_equal(kv_place_rebalance(c, &x, &n), KV_OK);
	assert_non_null(n);
	assert_int_equal(kv_config_validate(n), KV_OK);
	for (size_t i = 0; i < n->nmigs; i++) {
		assert_int_equal(n->migs[i].from, 1); /* node 2 is at the mean: untouched */
		assert_int_equal(n->migs[i].to, 3);
	}
	assert_true(within(kv_place_node_bytes(n, &x, 1), 1000) <= 60);
	assert_true(within(kv_place_node_bytes(n, &x, 2), 1000) <= 60);
	assert_true(within(kv_place_node_bytes(n, &x, 3), 1000) <= 60);
	kv_config_free(n);
	kv_config_free(c);
}

static void
rebalance_of_a_balanced_cluster_moves_nothing(void **state)
{
	const char *cuts[] = {"b", "c"};
	uint32_t own[] = {1, 2, 3};
	kv_config *c = make(3, cuts, 2, own), *n = (kv_config *)1;
	struct pts s = {.n = 0};
	kv_place_ctx x;
	(void)state;

	pts_add(&s, "a", 0, 10, 100);
	pts_add(&s, "b", 0, 10, 102);
	pts_add(&s, "c", 0, 10, 98);
	x = ctx_of(&s);
	assert_int_equal(kv_place_rebalance(c, &x, &n), KV_OK);
	assert_null(n);
	kv_config_free(c);
}

static void
rebalance_skips_ranges_in_flight(void **state)
{
	uint32_t own[] = {1};
	kv_config *c = make(2, NULL, 0, own), *n = NULL;
	struct pts s = {.n = 0};
	kv_place_ctx x;
	(void)state;

	pts_add(&s, "a", 0, 100, 10);
	add_mig(c, 3, "", "", 2, 1); /* the whole space is moving to 1 */
	x = ctx_of(&s);
	assert_int_equal(kv_place_rebalance(c, &x, &n), KV_OK);
	assert_null(n);
	kv_config_free(c);
}

static uint64_t rng = 88172645463325252ull;

static uint32_t
rnd(uint32_t n)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng % n);
}

/* Checks that next keeps every migration of cur that it still lists, and
 * that no key inside a migration of cur changed owner. */
static void
assert_in_flight_untouched(const kv_config *cur, const kv_config *next)
{
	for (size_t i = 0; i < cur->nmigs; i++) {
		const kv_migration *m = &cur->migs[i];
		char probe[80];
		size_t n = m->start.len < 70 ? m->start.len : 70;
		if (n > 0)
			memcpy(probe, m->start.data, n);
		/* the start key and a key just after it */
		for (int k = 0; k < 2; k++) {
			size_t len = n + (size_t)k;
			if (k)
				probe[n] = '\0';
			if (!kv_range_contains(m->start.data, m->start.len, m->end.data, m->end.len,
			                       probe, len))
				continue;
			long a = kv_config_find_range(cur, probe, len);
			long b = kv_config_find_range(next, probe, len);
			bool still = false;
			for (size_t j = 0; j < next->nmigs; j++)
				still = still || next->migs[j].id == m->id;
			if (still)
				assert_int_equal(cur->ranges[a].node, next->ranges[b].node);
		}
	}
}

static void
random_commands_keep_the_map_valid_and_leave_moving_ranges_alone(void **state)
{
	kv_config *c = kv_config_new();
	uint64_t next_mig = 1;
	int applied = 0, finished = 0;
	(void)state;

	for (int step = 0; step < 600; step++) {
		struct pts s = {.n = 0};
		kv_place_ctx x;
		kv_config *n = NULL;
		uint32_t id = 0, nn = (uint32_t)c->nnodes;
		int rv = KV_OK;
		char a[8], b[8];

		for (int q = 0; q < 40; q++) {
			snprintf(s.keys[s.n], sizeof(s.keys[0]), "%c%c", 'a' + rnd(26),
			         'a' + rnd(26));
			s.p[s.n].key = B(s.keys[s.n]);
			s.p[s.n].bytes = 1 + rnd(1000);
			s.n++;
		}
		x = ctx_of(rnd(4) ? &s : NULL);
		x.next_mig_id = next_mig;
		switch (nn == 0 ? 0 : rnd(6)) {
		case 0: {
			char addr[64];
			snprintf(addr, sizeof(addr), "tcp://10.0.0.%u:7000", rnd(12));
			rv = kv_place_join(c, addr, rnd(3) != 0, &x, &n, &id);
			break;
		}
		case 1:
			rv = kv_place_leave(c, 1 + rnd(nn), &x, &n);
			break;
		case 2:
			snprintf(a, sizeof(a), "%c", 'a' + rnd(26));
			snprintf(b, sizeof(b), "%c%c", 'a' + rnd(26), 'a' + rnd(26));
			rv = kv_place_move(c, B(a), rnd(5) ? B(b) : B(""), 1 + rnd(nn), &x, &n);
			break;
		case 3:
			rv = kv_place_rebalance(c, &x, &n);
			break;
		default:
			if (c->nmigs)
				rv = kv_place_finish(c, c->migs[rnd((uint32_t)c->nmigs)].id,
				                     rnd(4) != 0, &x, &n);
			break;
		}
		assert_true(rv == KV_OK || rv == KV_EEXISTS || rv == KV_EINVAL || rv == KV_EBUSY ||
		            rv == KV_ENOTFOUND);
		if (rv != KV_OK || n == NULL) {
			assert_null(n);
			continue;
		}
		assert_int_equal(kv_config_validate(n), KV_OK);
		assert_int_equal(n->epoch, c->epoch + 1);
		assert_in_flight_untouched(c, n);
		for (size_t i = 0; i < n->nmigs; i++) {
			const kv_node *to = kv_config_node(n, n->migs[i].to);
			assert_true(to->state == KV_NODE_ACTIVE || to->state == KV_NODE_JOINING);
			/* the map names the destination of every migration */
			long r =
			    kv_config_find_range(n, n->migs[i].start.data, n->migs[i].start.len);
			assert_int_equal(n->ranges[r].node, n->migs[i].to);
		}
		for (size_t i = 0; i < n->nnodes; i++)
			if (n->nodes[i].state == KV_NODE_GONE)
				for (size_t r = 0; r < n->nranges; r++)
					assert_int_not_equal(n->ranges[r].node, n->nodes[i].id);
		assert_true(x.next_mig_id >= next_mig);
		next_mig = x.next_mig_id;
		applied++;
		finished += n->nmigs < c->nmigs;
		kv_config_free(c);
		c = n;
	}
	print_message("applied %d commands, %d finished migrations, %zu nodes, %zu ranges\n",
	              applied, finished, c->nnodes, c->nranges);
	assert_true(applied > 150);
	assert_true(finished > 30);
	kv_config_free(c);
}

static void
midpoint_lies_strictly_inside(void **state)
{
	uint8_t k[8];
	size_t n = 0;
	(void)state;

	assert_true(kv_place_midpoint(B(""), B(""), k, &n));
	assert_true(n > 0 && k[0] > 0x40 && k[0] < 0x60);
	assert_true(kv_place_midpoint(B("a"), B("b"), k, &n));
	assert_true(kv_key_cmp(k, n, "a", 1) > 0 && kv_key_cmp(k, n, "b", 1) < 0);
	assert_false(kv_place_midpoint(B("a"), B("a\x01"), k, &n));
}

/* ---- remove ---- */

static void
remove_refuses_a_node_that_is_not_down(void **state)
{
	static const char *const cuts[] = {"m"};
	static const uint32_t own[] = {1, 2};
	kv_config *c = make(3, cuts, 1, own), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	uint64_t failed[4];
	size_t nf = 9;
	uint32_t lost = 9;
	(void)state;

	assert_int_equal(kv_place_remove(c, 2, false, true, &x, &n, &lost, failed, &nf), KV_EPERM);
	assert_null(n);
	assert_non_null(strstr(x.msg, "node 2 is active: use leave"));
	assert_int_equal(kv_place_remove(c, 7, false, true, &x, &n, &lost, failed, &nf),
	                 KV_ENOTFOUND);
	/* A draining node keeps its state when silent: silent, it may go. */
	c->nodes[1].state = KV_NODE_DRAINING;
	assert_int_equal(kv_place_remove(c, 2, false, true, &x, &n, &lost, failed, &nf), KV_EPERM);
	assert_int_equal(kv_place_remove(c, 2, true, true, &x, &n, &lost, failed, &nf), KV_OK);
	assert_int_equal(kv_config_node(n, 2)->state, KV_NODE_GONE);
	kv_config_free(n);
	c->nodes[1].state = KV_NODE_ACTIVE;
	assert_int_equal(kv_place_remove(c, 2, true, true, &x, &n, &lost, failed, &nf), KV_EPERM);
	kv_config_free(c);
}

static void
remove_of_a_down_node_with_ranges_needs_the_data_loss_flag(void **state)
{
	static const char *const cuts[] = {"g", "m", "t"};
	static const uint32_t own[] = {1, 2, 3, 2};
	kv_config *c = make(3, cuts, 3, own), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	uint64_t failed[4];
	size_t nf = 0;
	uint32_t lost = 0;
	(void)state;

	c->nodes[1].state = KV_NODE_DOWN;
	assert_int_equal(kv_place_remove(c, 2, false, false, &x, &n, &lost, failed, &nf), KV_EPERM);
	assert_null(n);
	assert_non_null(strstr(x.msg, "holds the only copy of 2 ranges"));
	kv_config_free(c);
}

static void
remove_with_data_loss_gives_the_ranges_to_the_least_loaded_active_node(void **state)
{
	static const char *const cuts[] = {"g", "m", "t"};
	static const uint32_t own[] = {1, 2, 3, 2};
	kv_config *c = make(3, cuts, 3, own), *n = NULL;
	struct pts p = {0};
	kv_place_ctx x;
	uint64_t failed[4];
	size_t nf = 0;
	uint32_t lost = 0;
	(void)state;

	pts_add(&p, "a", 0, 10, 1000); /* node 1 holds more than node 3 */
	pts_add(&p, "n", 0, 2, 1000);
	x = ctx_of(&p);
	c->nodes[1].state = KV_NODE_DOWN;
	assert_int_equal(kv_place_remove(c, 2, false, true, &x, &n, &lost, failed, &nf), KV_OK);
	assert_non_null(n);
	assert_int_equal(lost, 2);
	assert_int_equal(nf, 0);
	assert_int_equal(n->epoch, c->epoch + 1);
	assert_int_equal(kv_config_node(n, 2)->state, KV_NODE_GONE);
	assert_int_equal(owner(n, "h"), 3);
	assert_int_equal(owner(n, "z"), 3);
	assert_int_equal(owner(n, "a"), 1);
	/* [m, t) and [t, "") merged with their new owner's neighbours. */
	assert_int_equal(n->nranges, 2);
	assert_int_equal(kv_config_validate(n), KV_OK);
	kv_config_free(n);
	kv_config_free(c);
}

static void
remove_fails_the_migrations_of_the_node(void **state)
{
	static const char *const cuts[] = {"m"};
	static const uint32_t own[] = {1, 2};
	kv_config *c = make(2, cuts, 1, own), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	uint64_t failed[4];
	size_t nf = 0;
	uint32_t lost = 0;
	(void)state;

	/* [a, c) was moving from 1 to 2 (the map names 2 already). */
	kv_buf_fini(&c->ranges[0].end);
	setbuf_str(&c->ranges[0].end, "a");
	c->ranges = realloc(c->ranges, 3 * sizeof(kv_range));
	memmove(&c->ranges[2], &c->ranges[1], sizeof(kv_range));
	memset(&c->ranges[1], 0, sizeof(kv_range));
	setbuf_str(&c->ranges[1].start, "a");
	setbuf_str(&c->ranges[1].end, "m");
	c->ranges[1].node = 2;
	c->nranges = 3;
	c->ranges[2].node = 1; /* [m, "") back to 1: 2 owns only [a, m) */
	add_mig(c, 3, "a", "c", 1, 2);
	assert_int_equal(kv_config_validate(c), KV_OK);
	c->nodes[1].state = KV_NODE_DOWN;
	assert_int_equal(kv_place_remove(c, 2, false, true, &x, &n, &lost, failed, &nf), KV_OK);
	assert_int_equal(nf, 1);
	assert_int_equal(failed[0], 3);
	assert_int_equal(n->nmigs, 0);
	/* [a, c) went back to its source; [c, m) had no other copy. */
	assert_int_equal(lost, 1);
	assert_int_equal(n->nranges, 1);
	assert_int_equal(owner(n, "b"), 1);
	assert_int_equal(n->epoch, c->epoch + 1);
	kv_config_free(n);
	kv_config_free(c);
}

static void
set_state_marks_nodes_down_and_back(void **state)
{
	kv_config *c = make(2, NULL, 0, NULL), *n = NULL;
	uint32_t ids[] = {2};
	kv_node_state st[] = {KV_NODE_DOWN};
	(void)state;

	assert_int_equal(kv_place_set_state(c, ids, st, 1, &n), KV_OK);
	assert_int_equal(kv_config_node(n, 2)->state, KV_NODE_DOWN);
	assert_int_equal(kv_config_node(n, 1)->state, KV_NODE_ACTIVE);
	assert_int_equal(n->epoch, c->epoch + 1);
	assert_string_equal(kv_node_state_name(KV_NODE_DOWN), "down");
	kv_config_free(n);
	ids[0] = 9;
	assert_int_equal(kv_place_set_state(c, ids, st, 1, &n), KV_ENOTFOUND);
	kv_config_free(c);
}

/* ---- replica sets (doc/replication.md) ---- */

/* Gives range i the replica set reps (primary first) and ISR isr. */
static void
set_repl(kv_config *c, size_t i, const uint32_t *reps, uint32_t nreps, const uint32_t *isr,
         uint32_t nisr, uint64_t le)
{
	kv_range *r = &c->ranges[i];
	r->node = reps[0];
	r->nreplicas = nreps;
	memcpy(r->replicas, reps, nreps * sizeof(uint32_t));
	r->ninsync = nisr;
	memcpy(r->insync, isr, nisr * sizeof(uint32_t));
	r->leader_epoch = le;
}

/* Joins `address` with x->replicas = R; frees c, returns the next config. */
static kv_config *
join_r(kv_config *c, const char *address, uint32_t R)
{
	kv_place_ctx x = ctx_of(NULL);
	kv_config *n = NULL;
	uint32_t id = 0;

	x.replicas = R;
	assert_int_equal(kv_place_join(c, address, true, &x, &n, &id), KV_OK);
	assert_int_equal(kv_config_validate(n), KV_OK);
	kv_config_free(c);
	return n;
}

/* Every range: primary unchanged from `primary`, ISR {primary}, and the
 * replica count per node within one of each other. */
static void
assert_spread(const kv_config *n, uint32_t want_replicas)
{
	uint32_t cnt[8] = {0}, lo = UINT32_MAX, hi = 0;

	for (size_t i = 0; i < n->nranges; i++) {
		const kv_range *r = &n->ranges[i];
		assert_int_equal(kv_range_nreplicas(r), want_replicas);
		assert_int_equal(kv_range_ninsync(r), 1);
		assert_int_equal(kv_range_insync(r, 0), r->node);
		for (uint32_t j = 0; j < kv_range_nreplicas(r); j++)
			cnt[kv_range_replica(r, j)]++;
	}
	for (size_t i = 0; i < n->nnodes; i++) {
		uint32_t v = cnt[n->nodes[i].id];
		lo = v < lo ? v : lo;
		hi = v > hi ? v : hi;
	}
	assert_true(hi - lo <= 1);
}

static void
joins_with_two_replicas_add_the_newcomer_outside_the_isr(void **state)
{
	kv_config *c = kv_config_new();
	(void)state;

	c = join_r(c, "tcp://127.0.0.1:7101", 2);
	assert_int_equal(c->nranges, 1);
	assert_int_equal(c->ranges[0].nreplicas, 0); /* the first node holds it alone */
	c = join_r(c, "tcp://127.0.0.1:7102", 2);
	assert_int_equal(c->nranges, 1);
	assert_int_equal(c->nmigs, 0); /* nothing migrates */
	assert_int_equal(c->ranges[0].node, 1);
	assert_int_equal(kv_range_nreplicas(&c->ranges[0]), 2);
	assert_int_equal(kv_range_replica(&c->ranges[0], 1), 2);
	assert_int_equal(kv_range_ninsync(&c->ranges[0]), 1); /* not in the ISR */
	assert_int_equal(kv_config_node(c, 2)->state, KV_NODE_ACTIVE);
	uint64_t le = c->ranges[0].leader_epoch;
	/* A third node finds every range full. */
	c = join_r(c, "tcp://127.0.0.1:7103", 2);
	assert_int_equal(kv_range_nreplicas(&c->ranges[0]), 2);
	assert_int_equal(c->ranges[0].leader_epoch, le);
	kv_config_free(c);
}

static void
joins_with_three_replicas_fill_every_range(void **state)
{
	kv_config *c = kv_config_new();
	(void)state;

	c = join_r(c, "tcp://127.0.0.1:7101", 3);
	c = join_r(c, "tcp://127.0.0.1:7102", 3);
	c = join_r(c, "tcp://127.0.0.1:7103", 3);
	assert_int_equal(c->nranges, 1);
	assert_spread(c, 3);
	c = join_r(c, "tcp://127.0.0.1:7104", 3);
	assert_spread(c, 3);
	kv_config_free(c);
}

static void
a_join_spreads_new_replicas_evenly_over_single_ranges(void **state)
{
	static const char *const cuts[] = {"f", "m", "t"};
	static const uint32_t own[] = {1, 2, 1, 2};
	kv_config *c = make(2, cuts, 3, own);
	(void)state;

	c = join_r(c, "tcp://127.0.0.1:7103", 2);
	assert_int_equal(c->nranges, 4);
	assert_spread(c, 2);
	/* Primaries stay where they were. */
	assert_int_equal(owner(c, "a"), 1);
	assert_int_equal(owner(c, "g"), 2);
	assert_int_equal(owner(c, "n"), 1);
	assert_int_equal(owner(c, "u"), 2);
	kv_config_free(c);
}

static void
one_replica_joins_plan_exactly_as_before(void **state)
{
	static const char *const cuts[] = {"m"};
	static const uint32_t own[] = {1, 2};
	kv_config *c = make(2, cuts, 1, own), *a = NULL, *b = NULL;
	kv_place_ctx x = ctx_of(NULL), y = ctx_of(NULL);
	uint32_t id;
	(void)state;

	y.replicas = 1;
	assert_int_equal(kv_place_join(c, "tcp://127.0.0.1:7200", true, &x, &a, &id), KV_OK);
	assert_int_equal(kv_place_join(c, "tcp://127.0.0.1:7200", true, &y, &b, &id), KV_OK);
	assert_int_equal(a->nranges, b->nranges);
	assert_int_equal(a->nmigs, b->nmigs);
	assert_true(a->nmigs > 0);
	for (size_t i = 0; i < a->nranges; i++) {
		assert_true(kv_range_same_placement(&a->ranges[i], &b->ranges[i]));
		assert_int_equal(b->ranges[i].nreplicas, 0);
	}
	kv_config_free(a);
	kv_config_free(b);
	kv_config_free(c);
}

/* Nodes 1..3; [, m) replicas {1, 2, 3} ISR {1, 2, 3} at leader epoch 3;
 * [m, ) replicas {2, 1, 3} ISR {2, 1} at leader epoch 4. */
static kv_config *
replicated3_on(size_t nodes)
{
	static const char *const cuts[] = {"m"};
	static const uint32_t own[] = {1, 2};
	static const uint32_t r0[] = {1, 2, 3}, r1[] = {2, 1, 3};
	kv_config *c = make(nodes, cuts, 1, own);

	set_repl(c, 0, r0, 3, r0, 3, 3);
	set_repl(c, 1, r1, 3, r1, 2, 4);
	assert_int_equal(kv_config_validate(c), KV_OK);
	return c;
}

static kv_config *
replicated3(void)
{
	return replicated3_on(3);
}

static kv_config *
down(const kv_config *c, uint32_t node, kv_place_failover_stats *st)
{
	kv_config *n = NULL;
	kv_node_state s = KV_NODE_DOWN;

	assert_int_equal(kv_place_set_state(c, &node, &s, 1, &n), KV_OK);
	assert_int_equal(kv_place_failover(n, st), KV_OK);
	assert_int_equal(kv_config_validate(n), KV_OK);
	return n;
}

static void
failover_promotes_the_live_isr_member_leading_fewest_ranges(void **state)
{
	kv_config *c = replicated3(), *n;
	kv_place_failover_stats st;
	(void)state;

	n = down(c, 1, &st);
	/* [, m): 2 leads one range already, 3 none: 3 takes over. */
	assert_int_equal(owner(n, "a"), 3);
	assert_int_equal(n->ranges[0].leader_epoch, n->epoch);
	assert_true(kv_range_has_replica(&n->ranges[0], 1, false)); /* still a replica */
	assert_false(kv_range_has_replica(&n->ranges[0], 1, true));
	assert_true(kv_range_has_replica(&n->ranges[0], 2, true));
	/* [m, ): 1 leaves the ISR; primary and leader epoch stay. */
	assert_int_equal(owner(n, "z"), 2);
	assert_int_equal(n->ranges[1].leader_epoch, 4);
	assert_false(kv_range_has_replica(&n->ranges[1], 1, true));
	assert_true(kv_range_has_replica(&n->ranges[1], 1, false));
	assert_int_equal(st.failovers, 1);
	assert_int_equal(st.shrinks, 2);
	assert_int_equal(st.stuck, 0);
	assert_int_equal(st.nev, 1);
	assert_int_equal(st.ev[0].from, 1);
	assert_int_equal(st.ev[0].to, 3);
	assert_int_equal(st.ev[0].leader_epoch, n->epoch);
	assert_string_equal(st.ev[0].start, "\"\"");
	assert_string_equal(st.ev[0].end, "\"m\"");
	kv_config_free(n);
	kv_config_free(c);
}

static void
failover_without_a_live_isr_member_keeps_the_primary(void **state)
{
	static const char *const cuts[] = {"m"};
	static const uint32_t own[] = {1, 2};
	static const uint32_t r0[] = {1, 2};
	kv_config *c = make(2, cuts, 1, own), *n;
	kv_place_failover_stats st;
	(void)state;

	set_repl(c, 0, r0, 2, r0, 1, 3); /* ISR {1} */
	assert_int_equal(kv_config_validate(c), KV_OK);
	n = down(c, 1, &st);
	assert_int_equal(owner(n, "a"), 1);
	assert_int_equal(n->ranges[0].leader_epoch, 3);
	assert_int_equal(st.failovers, 0);
	assert_int_equal(st.stuck, 1);
	kv_config_free(n);
	/* A single range led by a down node is left alone too. */
	n = down(c, 2, &st);
	assert_int_equal(owner(n, "z"), 2);
	assert_int_equal(st.failovers, 0);
	kv_config_free(n);
	kv_config_free(c);
}

static void
two_down_nodes_leave_every_isr_and_ranges_fail_over_to_the_third(void **state)
{
	kv_config *c = replicated3(), *n = NULL;
	uint32_t ids[] = {1, 2};
	kv_node_state s[] = {KV_NODE_DOWN, KV_NODE_DOWN};
	kv_place_failover_stats st;
	(void)state;

	assert_int_equal(kv_place_set_state(c, ids, s, 2, &n), KV_OK);
	assert_int_equal(kv_place_failover(n, &st), KV_OK);
	assert_int_equal(kv_config_validate(n), KV_OK);
	/* [, m) has 3 in its ISR; [m, ) has no live ISR member: stays on 2,
	 * and 1 (down) leaves its ISR. */
	assert_int_equal(owner(n, "a"), 3);
	assert_int_equal(kv_range_ninsync(&n->ranges[0]), 1);
	assert_int_equal(owner(n, "z"), 2);
	assert_int_equal(kv_range_ninsync(&n->ranges[1]), 1);
	assert_int_equal(st.failovers, 1);
	assert_int_equal(st.stuck, 1);
	kv_config_free(n);
	kv_config_free(c);
}

static void
isr_change_refusals_change_nothing(void **state)
{
	kv_config *c = replicated3(), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	uint32_t ch = 0;
	(void)state;

	/* neither or both of add and remove */
	assert_int_equal(kv_place_isr_change(c, 1, B("a"), B("c"), 3, 0, 0, &x, &n, &ch),
	                 KV_EINVAL);
	assert_int_equal(kv_place_isr_change(c, 1, B("a"), B("c"), 3, 2, 3, &x, &n, &ch),
	                 KV_EINVAL);
	/* not the primary, or a stale leader epoch */
	assert_int_equal(kv_place_isr_change(c, 2, B("a"), B("c"), 3, 0, 3, &x, &n, &ch),
	                 KV_ESTALE);
	assert_non_null(strstr(x.msg, "not the primary"));
	assert_int_equal(kv_place_isr_change(c, 1, B("a"), B("c"), 2, 0, 3, &x, &n, &ch),
	                 KV_ESTALE);
	assert_non_null(strstr(x.msg, "leader epoch"));
	/* a range that spills over into another primary's range */
	assert_int_equal(kv_place_isr_change(c, 1, B("a"), B("z"), 3, 0, 3, &x, &n, &ch),
	                 KV_ESTALE);
	/* the primary is never removed; a non-replica is never added */
	assert_int_equal(kv_place_isr_change(c, 1, B("a"), B("c"), 3, 0, 1, &x, &n, &ch),
	                 KV_EINVAL);
	assert_int_equal(kv_place_isr_change(c, 1, B("a"), B("c"), 3, 9, 0, &x, &n, &ch),
	                 KV_EINVAL);
	assert_non_null(strstr(x.msg, "not a replica"));
	/* empty range, no primary named */
	assert_int_equal(kv_place_isr_change(c, 1, B("c"), B("a"), 3, 0, 3, &x, &n, &ch),
	                 KV_EINVAL);
	assert_int_equal(kv_place_isr_change(c, 0, B("a"), B("c"), 3, 0, 3, &x, &n, &ch),
	                 KV_EINVAL);
	/* a down node does not join an ISR */
	c->ranges[1].ninsync = 1;
	c->nodes[2].state = KV_NODE_DOWN;
	assert_int_equal(kv_place_isr_change(c, 2, B("n"), B("p"), 4, 3, 0, &x, &n, &ch), KV_EBUSY);
	c->nodes[2].state = KV_NODE_ACTIVE;
	/* a single range has no ISR to change */
	kv_range_set_single(&c->ranges[1], 2);
	assert_int_equal(kv_place_isr_change(c, 2, B("n"), B("p"), 4, 1, 0, &x, &n, &ch),
	                 KV_EINVAL);
	assert_non_null(strstr(x.msg, "not replicated"));
	assert_null(n);
	kv_config_free(c);
}

static void
isr_change_splits_commits_and_merges_back(void **state)
{
	kv_config *c = replicated3(), *n = NULL, *m = NULL, *o = NULL;
	kv_place_ctx x = ctx_of(NULL);
	uint32_t ch = 0;
	(void)state;

	/* remove 3 from the ISR of [c, f) only: [, c) [c, f) [f, m) [m, ) */
	assert_int_equal(kv_place_isr_change(c, 1, B("c"), B("f"), 3, 0, 3, &x, &n, &ch), KV_OK);
	assert_non_null(n);
	assert_int_equal(ch, 1);
	assert_int_equal(n->epoch, c->epoch + 1);
	assert_int_equal(kv_config_validate(n), KV_OK);
	assert_int_equal(n->nranges, 4);
	assert_false(kv_range_has_replica(&n->ranges[1], 3, true));
	assert_true(kv_range_has_replica(&n->ranges[0], 3, true));
	assert_true(kv_range_has_replica(&n->ranges[2], 3, true));
	assert_int_equal(n->ranges[1].leader_epoch, 3);
	/* asked again: in effect already, nothing to commit */
	assert_int_equal(kv_place_isr_change(n, 1, B("c"), B("f"), 3, 0, 3, &x, &m, &ch), KV_OK);
	assert_null(m);
	/* 3 back in: the pieces merge into one range again */
	assert_int_equal(kv_place_isr_change(n, 1, B(""), B("m"), 3, 3, 0, &x, &m, &ch), KV_OK);
	assert_int_equal(ch, 1);
	assert_int_equal(kv_config_validate(m), KV_OK);
	assert_int_equal(m->nranges, 2);
	/* 3 joins the ISR of [m, ) */
	assert_int_equal(kv_place_isr_change(m, 2, B("m"), B(""), 4, 3, 0, &x, &o, &ch), KV_OK);
	assert_int_equal(kv_range_ninsync(&o->ranges[1]), 3);
	assert_int_equal(kv_config_validate(o), KV_OK);
	kv_config_free(o);
	kv_config_free(m);
	kv_config_free(n);
	kv_config_free(c);
}

static void
remove_drops_the_node_from_replica_sets_and_refuses_lost_isrs(void **state)
{
	kv_config *c = replicated3(), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	uint64_t failed[4];
	size_t nf = 0;
	uint32_t lost = 0;
	static const uint32_t r1[] = {2, 1, 3};
	(void)state;

	/* [m, ) has ISR {2}: removing 2 would lose its acknowledged writes. */
	set_repl(c, 1, r1, 3, r1, 1, 4);
	c->nodes[1].state = KV_NODE_DOWN;
	assert_int_equal(kv_place_remove(c, 2, false, false, &x, &n, &lost, failed, &nf), KV_EPERM);
	assert_non_null(strstr(x.msg, "holds the only copy of 1 range"));
	assert_null(n);
	/* With the flag: an out-of-sync replica leads it, alone in the ISR. */
	assert_int_equal(kv_place_remove(c, 2, false, true, &x, &n, &lost, failed, &nf), KV_OK);
	assert_int_equal(kv_config_validate(n), KV_OK);
	assert_int_equal(lost, 1);
	assert_int_equal(owner(n, "z"), 1);
	assert_int_equal(n->ranges[1].leader_epoch, n->epoch);
	assert_int_equal(kv_range_ninsync(&n->ranges[1]), 1);
	for (size_t i = 0; i < n->nranges; i++)
		assert_false(kv_range_has_replica(&n->ranges[i], 2, false));
	/* [, m) led by 1 keeps its leader epoch. */
	assert_int_equal(owner(n, "a"), 1);
	assert_int_equal(n->ranges[0].leader_epoch, 3);
	kv_config_free(n);
	/* Led by the removed node with another ISR member: no loss. */
	kv_config_free(c);
	c = replicated3();
	c->nodes[1].state = KV_NODE_DOWN;
	assert_int_equal(kv_place_remove(c, 2, false, false, &x, &n, &lost, failed, &nf), KV_OK);
	assert_int_equal(lost, 0);
	assert_int_equal(owner(n, "z"), 1);
	assert_int_equal(kv_config_validate(n), KV_OK);
	kv_config_free(n);
	kv_config_free(c);
}

static void
remove_with_replicas_refills_the_replica_sets(void **state)
{
	static const char *const cuts[] = {"m"};
	static const uint32_t own[] = {1, 2};
	static const uint32_t r0[] = {1, 2}, r1[] = {2, 1};
	kv_config *c = make(3, cuts, 1, own), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	uint64_t failed[4];
	size_t nf = 0;
	uint32_t lost = 0;
	(void)state;

	set_repl(c, 0, r0, 2, r0, 2, 3);
	set_repl(c, 1, r1, 2, r1, 2, 3);
	c->nodes[1].state = KV_NODE_DOWN;
	x.replicas = 2;
	assert_int_equal(kv_place_remove(c, 2, false, false, &x, &n, &lost, failed, &nf), KV_OK);
	assert_int_equal(kv_config_validate(n), KV_OK);
	/* Both ranges now led by 1, with 3 as a new replica outside the ISR. */
	for (size_t i = 0; i < n->nranges; i++) {
		assert_int_equal(n->ranges[i].node, 1);
		assert_true(kv_range_has_replica(&n->ranges[i], 3, false));
		assert_false(kv_range_has_replica(&n->ranges[i], 3, true));
	}
	kv_config_free(n);
	kv_config_free(c);
}

static kv_bytes
kb(const kv_buf *b)
{
	kv_bytes r = {b->data, b->len};
	return r;
}

static void
rebalance_spreads_replicas_and_primaries_of_replicated_ranges(void **state)
{
	static const char *const cuts[] = {"f", "m", "t"};
	static const uint32_t own[] = {1, 2, 1, 2};
	static const uint32_t r12[] = {1, 2};
	kv_config *c = make(4, cuts, 3, own), *n = NULL, *again = NULL;
	kv_place_ctx x = ctx_of(NULL);
	uint32_t led[5] = {0}, pairs = 0;
	(void)state;

	for (size_t i = 0; i < 4; i++)
		set_repl(c, i, r12, 2, r12, 2, 3 + i); /* leader epochs keep them apart */
	assert_int_equal(kv_config_validate(c), KV_OK);
	x.replicas = 2;
	assert_int_equal(kv_place_rebalance(c, &x, &n), KV_OK);
	assert_non_null(n);
	assert_int_equal(kv_config_validate(n), KV_OK);
	assert_int_equal(n->nmigs, 0);
	for (size_t i = 0; i < 4; i++) {
		/* one key of each of the four ranges (two may have merged) */
		static const char *const probe[] = {"a", "g", "n", "u"};
		const kv_range *r = &n->ranges[kv_config_find_range(n, probe[i], 1)];
		led[r->node]++;
		if (r->nreplacing > 0) {
			/* backups of 2 move to 3 and 4, outside the ISR */
			assert_int_equal(r->replaced[0], 2);
			assert_false(kv_range_has_replica(r, r->replacing[0], true));
			pairs++;
		}
		if (r->node != 1) {
			/* a transfer: the old primary stays in the ISR */
			assert_int_equal(r->leader_epoch, n->epoch);
			assert_true(kv_range_has_replica(r, 1, true));
		}
	}
	assert_int_equal(pairs, 2);
	assert_int_equal(led[1], 2);
	assert_int_equal(led[2], 2);
	/* Again and again: each result is valid, and it stops (a range being
	 * replaced takes no further step). */
	for (int i = 0;; i++) {
		assert_true(i < 8);
		assert_int_equal(kv_place_rebalance(n, &x, &again), KV_OK);
		if (again == NULL)
			break;
		assert_int_equal(kv_config_validate(again), KV_OK);
		kv_config_free(n);
		n = again;
	}
	kv_config_free(n);
	kv_config_free(c);
}

static void
rebalance_of_balanced_replicas_changes_nothing(void **state)
{
	kv_config *c = replicated3(), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	x.replicas = 3;
	assert_int_equal(kv_place_rebalance(c, &x, &n), KV_OK);
	assert_null(n);
	kv_config_free(c);
}

/* replicated3() with a fourth active node that holds nothing. */
static kv_config *
replicated3_and_a_spare(void)
{
	return replicated3_on(4);
}

/* The primary asks to add `node` to the ISR of the range holding key. */
static kv_config *
expand(kv_config *c, const char *key, uint32_t node, kv_place_ctx *x)
{
	const kv_range *r = &c->ranges[kv_config_find_range(c, key, strlen(key))];
	kv_config *n = NULL;
	uint32_t ch = 0;

	assert_int_equal(kv_place_isr_change(c, r->node, kb(&r->start), kb(&r->end),
	                                     r->leader_epoch, node, 0, x, &n, &ch),
	                 KV_OK);
	assert_non_null(n);
	assert_int_equal(kv_config_validate(n), KV_OK);
	kv_config_free(c);
	return n;
}

static bool
serving_yes(void *arg, uint32_t node, kv_bytes start, kv_bytes end)
{
	(void)start;
	(void)end;
	return node == *(uint32_t *)arg;
}

static void
move_to_an_in_sync_replica_transfers_the_primary_role_at_once(void **state)
{
	kv_config *c = replicated3(), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	const kv_range *r;
	(void)state;

	/* [b, d) inside [, m): led by 1, 3 in its ISR. */
	assert_int_equal(kv_place_move(c, B("b"), B("d"), 3, &x, &n), KV_OK);
	assert_int_equal(kv_config_validate(n), KV_OK);
	assert_int_equal(n->nmigs, 0);
	r = &n->ranges[kv_config_find_range(n, "c", 1)];
	assert_int_equal(r->node, 3);
	assert_int_equal(r->leader_epoch, n->epoch);
	assert_true(kv_range_has_replica(r, 1, true)); /* the transfer fence */
	assert_int_equal(owner(n, "a"), 1);
	assert_int_equal(owner(n, "e"), 1);
	kv_config_free(n);
	/* 3 is outside the ISR of [m, ): not until it is in sync. */
	assert_int_equal(kv_place_move(c, B("x"), B(""), 3, &x, &n), KV_EBUSY);
	assert_null(n);
	kv_config_free(c);
}

/* The old primary of a transfer stays in the ISR as the fence: until it has
 * left the ISR and joined it again after a copy (what it applied and failed
 * at its demotion is still in its store), the range's role moves in no
 * planned transfer, and a failover gives it to the fence only when no other
 * member is live. */
static void
the_old_primary_kept_as_the_fence_leads_again_only_after_a_copy(void **state)
{
	kv_config *c = replicated3(), *n = NULL, *t = NULL;
	kv_place_ctx x = ctx_of(NULL);
	kv_place_failover_stats st;
	uint32_t ch = 0;
	const kv_range *r;
	(void)state;

	/* [, m) led by 1 with ISR {1, 2, 3}: handed to 2. */
	assert_int_equal(kv_place_move(c, B(""), B("m"), 2, &x, &n), KV_OK);
	r = &n->ranges[kv_config_find_range(n, "a", 1)];
	assert_int_equal(r->node, 2);
	assert_int_equal(r->fence, 1);
	assert_true(kv_range_has_replica(r, 1, true));
	/* Round trip through the wire form: the fence is kept. */
	{
		kv_buf wire = {0};
		kv_config *back = NULL;
		assert_int_equal(kv_codec_config_pack(n, &wire), KV_OK);
		assert_int_equal(kv_codec_config_unpack(wire.data, wire.len, &back), KV_OK);
		assert_int_equal(back->ranges[kv_config_find_range(back, "a", 1)].fence, 1);
		kv_config_free(back);
		kv_buf_fini(&wire);
	}
	/* Moved back at once: refused. */
	assert_int_equal(kv_place_move(n, B(""), B("m"), 1, &x, &t), KV_EBUSY);
	assert_null(t);
	/* The new primary fails: 3 takes over, not the fence, which stays one;
	 * then 3 fails too: the fence leads as the last resort. */
	t = down(n, 2, &st);
	r = &t->ranges[kv_config_find_range(t, "a", 1)];
	assert_int_equal(r->node, 3);
	assert_int_equal(r->fence, 1);
	{
		kv_config *u = down(t, 3, &st);
		r = &u->ranges[kv_config_find_range(u, "a", 1)];
		assert_int_equal(r->node, 1);
		assert_int_equal(r->fence, 0);
		kv_config_free(u);
	}
	kv_config_free(t);
	/* No other planned transfer either while the fence is there. */
	assert_int_equal(kv_place_move(n, B(""), B("m"), 3, &x, &t), KV_EBUSY);
	assert_null(t);
	/* The fence leaves the ISR (the new primary reconciled it) ... */
	r = &n->ranges[kv_config_find_range(n, "a", 1)];
	assert_int_equal(kv_place_isr_change(n, 2, kb(&r->start), kb(&r->end), r->leader_epoch, 0,
	                                     1, &x, &t, &ch),
	                 KV_OK);
	assert_non_null(t);
	assert_int_equal(kv_config_validate(t), KV_OK);
	r = &t->ranges[kv_config_find_range(t, "a", 1)];
	assert_int_equal(r->fence, 0);
	assert_false(kv_range_has_replica(r, 1, true));
	kv_config_free(n);
	/* ... and joins it again after its copy: it may lead again. */
	n = expand(t, "a", 1, &x);
	assert_int_equal(kv_place_move(n, B(""), B("m"), 1, &x, &t), KV_OK);
	r = &t->ranges[kv_config_find_range(t, "a", 1)];
	assert_int_equal(r->node, 1);
	assert_int_equal(r->fence, 2);
	kv_config_free(t);
	kv_config_free(n);
	kv_config_free(c);
}

/* The fence found in sync by the new primary (IsrChange.unfence_node,
 * doc/replication.md "Primary transfer"): the fence ends, the old primary
 * stays in the ISR and may lead again at once; a request from another node,
 * at another leader epoch, naming another member or after the member left
 * the ISR is refused stale; a retry is in effect. */
static void
the_fence_found_in_sync_ends_and_stays_in_the_isr(void **state)
{
	kv_config *c = replicated3(), *n = NULL, *t = NULL, *u = NULL;
	kv_place_ctx x = ctx_of(NULL);
	uint32_t ch = 0;
	const kv_range *r;
	(void)state;

	assert_int_equal(kv_place_move(c, B(""), B("m"), 2, &x, &n), KV_OK);
	r = &n->ranges[kv_config_find_range(n, "a", 1)];
	assert_int_equal(r->fence, 1);
	kv_bytes st = kb(&r->start), en = kb(&r->end);
	uint64_t le = r->leader_epoch;
	/* Refused: not the primary, another leader epoch, not the fence. */
	assert_int_equal(kv_place_unfence(n, 3, st, en, le, 1, &x, &t, &ch), KV_ESTALE);
	assert_int_equal(kv_place_unfence(n, 2, st, en, le - 1, 1, &x, &t, &ch), KV_ESTALE);
	assert_int_equal(kv_place_unfence(n, 2, st, en, le, 3, &x, &t, &ch), KV_ESTALE);
	assert_int_equal(kv_place_unfence(n, 2, st, en, le, 2, &x, &t, &ch), KV_EINVAL);
	assert_null(t);
	/* Granted: the fence ends, the member stays. */
	assert_int_equal(kv_place_unfence(n, 2, st, en, le, 1, &x, &t, &ch), KV_OK);
	assert_non_null(t);
	assert_int_equal(ch, 1);
	assert_int_equal(kv_config_validate(t), KV_OK);
	r = &t->ranges[kv_config_find_range(t, "a", 1)];
	assert_int_equal(r->fence, 0);
	assert_int_equal(r->node, 2);
	assert_int_equal(r->leader_epoch, le);
	assert_true(kv_range_has_replica(r, 1, true));
	/* A retry is in effect (no configuration). */
	assert_int_equal(kv_place_unfence(t, 2, st, en, le, 1, &x, &u, &ch), KV_OK);
	assert_null(u);
	/* The role may move straight back. */
	assert_int_equal(kv_place_move(t, B(""), B("m"), 1, &x, &u), KV_OK);
	assert_int_equal(u->ranges[kv_config_find_range(u, "a", 1)].node, 1);
	kv_config_free(u);
	kv_config_free(t);
	/* Once the fence has left the ISR it is not ended in sync. */
	r = &n->ranges[kv_config_find_range(n, "a", 1)];
	assert_int_equal(kv_place_isr_change(n, 2, st, en, r->leader_epoch, 0, 1, &x, &t, &ch),
	                 KV_OK);
	assert_int_equal(kv_place_unfence(t, 2, st, en, le, 1, &x, &u, &ch), KV_OK);
	assert_null(u); /* no fence left: in effect, the member stays out */
	assert_false(kv_range_has_replica(&t->ranges[kv_config_find_range(t, "a", 1)], 1, true));
	kv_config_free(t);
	kv_config_free(n);
	kv_config_free(c);
}

/* A move while the primary still replaces the member it took over from
 * (which leaves once it may) is refused busy: a second pair naming the
 * primary would break the one-pair-per-member rule (it was an internal
 * error: "the planned configuration is invalid"). */
static void
move_while_the_primary_still_replaces_its_predecessor_is_busy(void **state)
{
	kv_config *c = replicated3_on(5), *n = NULL, *t = NULL;
	kv_place_ctx x = ctx_of(NULL);
	kv_place_repair_stats st;
	uint32_t busy = 1;
	(void)state;

	x.replicas = 3;
	/* 1 may not leave yet (it may still serve: the fence rule). */
	x.serving = serving_yes;
	x.serving_arg = &busy;
	assert_int_equal(kv_place_move(c, B(""), B("m"), 4, &x, &n), KV_OK);
	kv_config_free(c);
	n = expand(n, "a", 4, &x);
	assert_int_equal(kv_place_repair(n, NULL, 0, &x, &t, &st), KV_OK);
	assert_non_null(t);
	kv_config_free(n);
	n = t;
	assert_int_equal(n->ranges[0].node, 4);
	assert_int_equal(kv_range_replacement(&n->ranges[0], 4, true), 1);
	assert_int_equal(kv_place_move(n, B(""), B("m"), 5, &x, &t), KV_EBUSY);
	assert_null(t);
	kv_config_free(n);
}

static void
move_to_a_new_node_replaces_the_primary_through_the_isr(void **state)
{
	kv_config *c = replicated3_and_a_spare(), *n = NULL, *t = NULL;
	kv_place_ctx x = ctx_of(NULL);
	kv_place_repair_stats st;
	const kv_range *r;
	(void)state;

	x.replicas = 3;
	assert_int_equal(kv_place_move(c, B(""), B("m"), 4, &x, &n), KV_OK);
	assert_int_equal(kv_config_validate(n), KV_OK);
	r = &n->ranges[0];
	assert_int_equal(r->node, 1);
	assert_false(kv_range_has_replica(r, 4, true));
	assert_int_equal(kv_range_replacement(r, 4, true), 1);
	kv_config_free(c);
	/* A second move is in effect already. */
	assert_int_equal(kv_place_move(n, B(""), B("m"), 4, &x, &t), KV_OK);
	assert_null(t);
	n = expand(n, "a", 4, &x);
	/* In the ISR: the next repair hands it the role, the old primary kept
	 * in the ISR; the one after drops it. */
	assert_int_equal(kv_place_repair(n, NULL, 0, &x, &t, &st), KV_OK);
	assert_non_null(t);
	assert_int_equal(st.transfers, 1);
	r = &t->ranges[0];
	assert_int_equal(r->node, 4);
	assert_int_equal(r->leader_epoch, t->epoch);
	assert_true(kv_range_has_replica(r, 1, true));
	kv_config_free(n);
	n = t;

	assert_int_equal(kv_place_repair(n, NULL, 0, &x, &t, &st), KV_OK);
	assert_non_null(t);
	assert_int_equal(kv_config_validate(t), KV_OK);
	r = &t->ranges[0];
	assert_int_equal(r->node, 4);
	assert_false(kv_range_has_replica(r, 1, false));
	assert_int_equal(kv_range_nreplicas(r), 3);
	assert_int_equal(r->nreplacing, 0);
	assert_int_equal(kv_config_node(t, 1)->state, KV_NODE_ACTIVE);
	kv_config_free(t);
	kv_config_free(n);
}

static void
leave_of_a_backup_adds_replacements_and_ends_when_they_are_in_sync(void **state)
{
	kv_config *c = replicated3_and_a_spare(), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	x.replicas = 3;
	assert_int_equal(kv_place_leave(c, 3, &x, &n), KV_OK);
	assert_int_equal(kv_config_validate(n), KV_OK);
	assert_int_equal(kv_config_node(n, 3)->state, KV_NODE_DRAINING);
	assert_int_equal(n->nmigs, 0);
	for (size_t i = 0; i < n->nranges; i++) {
		const kv_range *r = &n->ranges[i];
		/* No primary changes; 4 joins outside the ISR in place of 3. */
		assert_int_equal(r->node, c->ranges[i].node);
		assert_int_equal(r->leader_epoch, c->ranges[i].leader_epoch);
		assert_true(kv_range_has_replica(r, 3, false));
		assert_true(kv_range_has_replica(r, 4, false));
		assert_false(kv_range_has_replica(r, 4, true));
		assert_int_equal(kv_range_replacement(r, 4, true), 3);
	}
	/* A second leave has nothing more to do. */
	kv_config *again = NULL;
	assert_int_equal(kv_place_leave(n, 3, &x, &again), KV_EEXISTS);
	assert_null(again);
	kv_config_free(c);
	/* Each expand drops 3 from that range; the last makes 3 gone. */
	n = expand(n, "a", 4, &x);
	assert_false(kv_range_has_replica(&n->ranges[0], 3, false));
	assert_int_equal(n->ranges[0].nreplacing, 0);
	assert_int_equal(kv_config_node(n, 3)->state, KV_NODE_DRAINING);
	n = expand(n, "x", 4, &x);
	for (size_t i = 0; i < n->nranges; i++)
		assert_int_equal(kv_range_nreplicas(&n->ranges[i]), 3);
	assert_int_equal(kv_config_node(n, 3)->state, KV_NODE_GONE);
	kv_config_free(n);
}

static void
leave_of_a_primary_transfers_the_role_and_keeps_the_old_primary_in_the_isr(void **state)
{
	kv_config *c = replicated3_and_a_spare(), *n = NULL, *t = NULL;
	kv_place_ctx x = ctx_of(NULL);
	kv_place_repair_stats st;
	uint32_t old = 1, ch = 0;
	const kv_range *r;
	(void)state;

	x.replicas = 3;
	assert_int_equal(kv_place_leave(c, 1, &x, &n), KV_OK);
	assert_int_equal(kv_config_validate(n), KV_OK);
	r = &n->ranges[kv_config_find_range(n, "a", 1)];
	assert_int_equal(r->node, 2);
	assert_int_equal(r->leader_epoch, n->epoch);
	assert_true(kv_range_has_replica(r, 1, true)); /* the transfer fence */
	assert_int_equal(kv_range_replacement(r, 4, true), 1);
	/* [m, ) was led by 2 already: only the replacement. */
	r = &n->ranges[kv_config_find_range(n, "x", 1)];
	assert_int_equal(r->node, 2);
	assert_int_equal(r->leader_epoch, 4);
	kv_config_free(c);

	/* While 1 may still serve [, m) as its primary it stays in the ISR:
	 * neither the primary's shrink nor the expand of 4 removes it. */
	x.serving = serving_yes;
	x.serving_arg = &old;
	r = &n->ranges[kv_config_find_range(n, "a", 1)];
	assert_int_equal(kv_place_isr_change(n, 2, kb(&r->start), kb(&r->end), r->leader_epoch, 0,
	                                     1, &x, &t, &ch),
	                 KV_EBUSY);
	assert_null(t);
	n = expand(n, "a", 4, &x);
	r = &n->ranges[kv_config_find_range(n, "a", 1)];
	assert_true(kv_range_has_replica(r, 1, true));
	assert_true(kv_range_has_replica(r, 4, true));
	n = expand(n, "x", 4, &x);
	assert_int_equal(kv_place_repair(n, NULL, 0, &x, &t, &st), KV_OK);
	assert_null(t);
	/* Once it has applied the transfer, the repair drops it everywhere and
	 * it is gone. */
	x.serving = NULL;
	assert_int_equal(kv_place_repair(n, NULL, 0, &x, &t, &st), KV_OK);
	assert_non_null(t);
	assert_int_equal(kv_config_validate(t), KV_OK);
	assert_int_equal(st.dropped, 2); /* from both ranges */
	assert_int_equal(st.gone, 1);
	assert_int_equal(kv_config_node(t, 1)->state, KV_NODE_GONE);
	for (size_t i = 0; i < t->nranges; i++) {
		assert_int_equal(kv_range_nreplicas(&t->ranges[i]), 3);
		assert_false(kv_range_has_replica(&t->ranges[i], 1, false));
	}
	kv_config_free(t);
	kv_config_free(n);
}

/* Plays every primary: adds to the ISR each replica outside it (the copy
 * has caught up), one range at a time. Returns the next configuration
 * (c is freed), or c when every replica is in sync. */
static kv_config *
expand_all(kv_config *c, kv_place_ctx *x)
{
	for (size_t i = 0; i < c->nranges; i++) {
		const kv_range *r = &c->ranges[i];
		for (uint32_t j = 0; j < kv_range_nreplicas(r); j++) {
			uint32_t m = kv_range_replica(r, j);
			const kv_node *nd = kv_config_node(c, m);
			if (kv_range_has_replica(r, m, true) || nd->state == KV_NODE_DOWN)
				continue;
			char key[64];
			snprintf(key, sizeof(key), "%.*s", (int)r->start.len,
			         (const char *)r->start.data);
			return expand(c, key, m, x);
		}
	}
	return c;
}

static void
every_node_of_a_replicated_cluster_can_leave_in_turn(void **state)
{
	static const char *const cuts[] = {"d", "h", "m", "q", "u"};
	static const uint32_t own[] = {1, 2, 3, 4, 5, 6};
	static const char *const probes[] = {"a", "e", "i", "n", "r", "v"};
	kv_config *c = make(7, cuts, 5, own), *n;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	/* Three replicas of each range, all in sync; node 7 holds nothing. */
	for (size_t i = 0; i < 6; i++) {
		uint32_t rs[3] = {(uint32_t)i + 1, (uint32_t)(i + 1) % 6 + 1,
		                  (uint32_t)(i + 2) % 6 + 1};
		set_repl(c, i, rs, 3, rs, 3, 5);
	}
	assert_int_equal(kv_config_validate(c), KV_OK);
	x.replicas = 3;
	/* Nodes 1 to 4 leave one after the other; 5, 6 and 7 remain. */
	for (uint32_t node = 1; node <= 4; node++) {
		assert_int_equal(kv_place_leave(c, node, &x, &n), KV_OK);
		assert_int_equal(kv_config_validate(n), KV_OK);
		kv_config_free(c);
		c = n;
		for (int round = 0; kv_config_node(c, node)->state != KV_NODE_GONE; round++) {
			kv_place_repair_stats st;
			assert_true(round < 64);
			c = expand_all(c, &x);
			assert_int_equal(kv_place_repair(c, NULL, 0, &x, &n, &st), KV_OK);
			if (n != NULL) {
				assert_int_equal(kv_config_validate(n), KV_OK);
				kv_config_free(c);
				c = n;
			}
		}
		/* Every key keeps three replicas once the replacements are in. */
		c = expand_all(c, &x);
		for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
			const kv_range *r =
			    &c->ranges[kv_config_find_range(c, probes[i], strlen(probes[i]))];
			assert_false(kv_range_has_replica(r, node, false));
			assert_int_equal(kv_range_nreplicas(r), 3);
		}
	}
	kv_config_free(c);
}

static void
leave_refuses_a_primary_without_another_live_isr_member(void **state)
{
	static const char *const cuts[] = {"m"};
	static const uint32_t own[] = {1, 2};
	static const uint32_t r0[] = {1, 2, 3}, i0[] = {1}, r1[] = {2, 1, 3};
	kv_config *c = make(4, cuts, 1, own), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	set_repl(c, 0, r0, 3, i0, 1, 3);
	set_repl(c, 1, r1, 3, r1, 3, 4);
	x.replicas = 3;
	assert_int_equal(kv_place_leave(c, 1, &x, &n), KV_EBUSY);
	assert_non_null(strstr(x.msg, "no other active in-sync replica"));
	assert_null(n);
	kv_config_free(c);
}

static void
leave_with_no_node_to_replace_drops_the_backup_short_of_a_replica(void **state)
{
	kv_config *c = replicated3(), *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	x.replicas = 3;
	assert_int_equal(kv_place_leave(c, 3, &x, &n), KV_OK);
	assert_int_equal(kv_config_validate(n), KV_OK);
	for (size_t i = 0; i < n->nranges; i++)
		assert_int_equal(kv_range_nreplicas(&n->ranges[i]), 2);
	assert_int_equal(kv_config_node(n, 3)->state, KV_NODE_GONE);
	kv_config_free(n);
	kv_config_free(c);
}

static void
a_down_member_past_down_after_is_replaced_and_dropped_on_expand(void **state)
{
	kv_config *c = replicated3_and_a_spare(), *d, *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	kv_place_repair_stats st;
	kv_place_failover_stats fs;
	uint32_t three = 3;
	(void)state;

	x.replicas = 3;
	d = down(c, 3, &fs);
	kv_config_free(c);
	/* Not past --down-after yet: nothing to do. */
	assert_int_equal(kv_place_repair(d, NULL, 0, &x, &n, &st), KV_OK);
	assert_null(n);
	assert_int_equal(kv_place_repair(d, &three, 1, &x, &n, &st), KV_OK);
	assert_non_null(n);
	assert_int_equal(kv_config_validate(n), KV_OK);
	assert_int_equal(st.added, 2);
	assert_int_equal(kv_config_node(n, 3)->state, KV_NODE_DOWN);
	for (size_t i = 0; i < n->nranges; i++) {
		assert_int_equal(kv_range_replacement(&n->ranges[i], 4, true), 3);
		assert_false(kv_range_has_replica(&n->ranges[i], 4, true));
		assert_int_equal(n->ranges[i].leader_epoch, d->ranges[i].leader_epoch);
	}
	kv_config_free(d);
	/* Done once: a second pass changes nothing. */
	assert_int_equal(kv_place_repair(n, &three, 1, &x, &d, &st), KV_OK);
	assert_null(d);
	n = expand(n, "a", 4, &x);
	n = expand(n, "x", 4, &x);
	for (size_t i = 0; i < n->nranges; i++) {
		assert_false(kv_range_has_replica(&n->ranges[i], 3, false));
		assert_int_equal(kv_range_nreplicas(&n->ranges[i]), 3);
		assert_int_equal(kv_range_ninsync(&n->ranges[i]), 3);
	}
	/* Still down, not gone, until remove. */
	assert_int_equal(kv_config_node(n, 3)->state, KV_NODE_DOWN);
	kv_config_free(n);
}

static void
a_down_member_with_no_node_to_replace_it_stays(void **state)
{
	kv_config *c = replicated3(), *d, *n = NULL;
	kv_place_ctx x = ctx_of(NULL);
	kv_place_repair_stats st;
	kv_place_failover_stats fs;
	uint32_t three = 3;
	(void)state;

	x.replicas = 3;
	d = down(c, 3, &fs);
	assert_int_equal(kv_place_repair(d, &three, 1, &x, &n, &st), KV_OK);
	assert_null(n);
	assert_int_equal(st.short_of, 2);
	kv_config_free(d);
	kv_config_free(c);
}

static void
replacements_go_to_the_node_with_the_least_data(void **state)
{
	static const char *const cuts[] = {"m"};
	static const uint32_t own[] = {1, 2};
	static const uint32_t r0[] = {1, 2, 3}, r1[] = {2, 4, 5};
	kv_config *c = make(5, cuts, 1, own), *n = NULL;
	struct pts p = {0};
	kv_place_ctx x;
	(void)state;

	set_repl(c, 0, r0, 3, r0, 3, 3);
	set_repl(c, 1, r1, 3, r1, 3, 3);
	assert_int_equal(kv_config_validate(c), KV_OK);
	/* [m, ) holds far more data: 4 and 5 hold more than 1 and 2. */
	pts_add(&p, "a", 0, 10, 100);
	pts_add(&p, "x", 0, 10, 10000);
	x = ctx_of(&p);
	x.replicas = 3;
	c->nodes[2].state = KV_NODE_DOWN;
	uint32_t three = 3;
	kv_place_repair_stats st;
	assert_int_equal(kv_place_repair(c, &three, 1, &x, &n, &st), KV_OK);
	assert_non_null(n);
	assert_int_equal(kv_config_validate(n), KV_OK);
	/* 4 and 5 hold the same bytes; the lower id wins the tie. */
	assert_int_equal(kv_range_replacement(&n->ranges[0], 4, true), 3);
	kv_config_free(n);
	kv_config_free(c);
}

static void
moving_a_single_range_keeps_the_replica_sets_of_the_others(void **state)
{
	static const char *const cuts[] = {"g", "m"};
	static const uint32_t own[] = {1, 2, 3};
	static const uint32_t r0[] = {1, 2};
	kv_config *c = make(3, cuts, 2, own), *n = NULL, *f = NULL;
	kv_place_ctx x = ctx_of(NULL);
	(void)state;

	set_repl(c, 0, r0, 2, r0, 2, 3);
	assert_int_equal(kv_config_validate(c), KV_OK);
	assert_int_equal(kv_place_move(c, B("h"), B("j"), 3, &x, &n), KV_OK);
	assert_int_equal(kv_config_validate(n), KV_OK);
	assert_true(kv_range_same_placement(&n->ranges[0], &c->ranges[0]));
	assert_int_equal(owner(n, "i"), 3);
	/* and so does the failed migration that gives the range back */
	assert_int_equal(kv_place_finish(n, n->migs[0].id, false, &x, &f), KV_OK);
	assert_int_equal(kv_config_validate(f), KV_OK);
	assert_true(kv_range_same_placement(&f->ranges[0], &c->ranges[0]));
	assert_int_equal(owner(f, "i"), 2);
	kv_config_free(f);
	kv_config_free(n);
	kv_config_free(c);
}

/* Random joins, downs, returns, ISR changes, removes, leaves, repairs and
 * the commands that refuse replicated ranges, with 2 or 3 replicas: every result is valid,
 * no key's leader epoch goes down and a key whose primary changes gets the
 * new epoch, only the primary of a range may be down in its ISR, and a
 * range whose primary is down has it alone in its ISR. */
#define STEPS 3000

static void
random_replicated_commands_keep_the_replica_invariants(void **state)
{
	static const char *const probes[] = {"", "b", "f", "k", "p", "t", "x", "zz"};
	static const char *const cuts[] = {"f", "m", "t"};
	static const uint32_t own[] = {1, 2, 3, 4};
	kv_config *c = make(4, cuts, 3, own);
	int applied = 0, failovers = 0, changes = 0;
	uint64_t next_mig = 10; /* migration ids are never reused */
	(void)state;

	for (int step = 0; step < STEPS; step++) {
		kv_place_ctx x = ctx_of(NULL);
		kv_place_failover_stats st;
		kv_config *n = NULL;
		uint32_t id = 0, nn = (uint32_t)c->nnodes, lost, ch;
		uint64_t failed[64];
		size_t nf;
		int rv = KV_OK;
		char a[8], b[8];

		x.replicas = 2 + (uint32_t)(step / 1000 % 2);
		snprintf(a, sizeof(a), "%c", 'a' + rnd(26));
		snprintf(b, sizeof(b), "%c%c", 'a' + rnd(26), 'a' + rnd(26));
		uint32_t live = 0;
		for (size_t i = 0; i < c->nnodes; i++)
			live += c->nodes[i].state != KV_NODE_GONE;
		x.next_mig_id = next_mig;
		switch (rnd(10)) {
		case 0: {
			char addr[64];
			if (live >= 6)
				break;
			snprintf(addr, sizeof(addr), "tcp://10.0.0.%u:7000", rnd(8));
			rv = kv_place_join(c, addr, rnd(5) != 0, &x, &n, &id);
			break;
		}
		case 1:
		case 2: { /* down or back */
			uint32_t nd =
			    rnd(2) ? c->ranges[rnd((uint32_t)c->nranges)].node : 1 + rnd(nn);
			kv_node_state s = rnd(2) ? KV_NODE_DOWN : KV_NODE_ACTIVE;
			const kv_node *k = kv_config_node(c, nd);
			if (k->state == KV_NODE_GONE ||
			    (s == KV_NODE_DOWN) != (k->state == KV_NODE_ACTIVE))
				break;
			rv = kv_place_set_state(c, &nd, &s, 1, &n);
			if (rv == KV_OK && s == KV_NODE_DOWN) {
				assert_int_equal(kv_place_failover(n, &st), KV_OK);
				failovers += (int)st.failovers;
			}
			break;
		}
		case 3:
		case 4: { /* ISR change from a range's primary, mostly at its leader epoch */
			/* the whole range, or [a, a "m") inside or across ranges */
			bool whole = rnd(2);
			const kv_range *r = whole ? &c->ranges[rnd((uint32_t)c->nranges)]
			                          : &c->ranges[kv_config_find_range(c, a, 1)];
			uint32_t m = kv_range_replica(r, rnd(kv_range_nreplicas(r)));
			uint64_t le = r->leader_epoch - (rnd(6) == 0);
			bool add = rnd(2);
			snprintf(b, sizeof(b), "%sm", a);
			rv = kv_place_isr_change(c, r->node, whole ? kb(&r->start) : B(a),
			                         whole ? kb(&r->end) : B(b), le, add ? m : 0,
			                         add ? 0 : m, &x, &n, &ch);
			changes += n != NULL;
			break;
		}
		case 5:
			rv = kv_place_remove(c, 1 + rnd(nn), false, rnd(2), &x, &n, &lost, failed,
			                     &nf);
			break;
		case 6:
			rv = kv_place_move(c, B(a), rnd(5) ? B(b) : B(""), 1 + rnd(nn), &x, &n);
			break;
		case 7:
			rv = kv_place_leave(c, 1 + rnd(nn), &x, &n);
			break;
		case 8: { /* repairs, with a random node past --down-after */
			uint32_t ex = 1 + rnd(nn);
			rv = kv_place_repair(c, &ex, rnd(2), &x, &n, NULL);
			break;
		}
		default:
			rv = kv_place_rebalance(c, &x, &n);
			break;
		}
		assert_true(rv == KV_OK || rv == KV_EEXISTS || rv == KV_EINVAL || rv == KV_EBUSY ||
		            rv == KV_ENOTFOUND || rv == KV_EPERM || rv == KV_ESTALE);
		if (rv != KV_OK || n == NULL) {
			assert_null(n);
			continue;
		}
		next_mig = x.next_mig_id;
		assert_int_equal(kv_config_validate(n), KV_OK);
		assert_int_equal(n->epoch, c->epoch + 1);
		for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
			long p = kv_config_find_range(c, probes[i], strlen(probes[i]));
			long q = kv_config_find_range(n, probes[i], strlen(probes[i]));
			if (p < 0)
				continue;
			assert_true(n->ranges[q].leader_epoch >= c->ranges[p].leader_epoch);
			if (n->ranges[q].node != c->ranges[p].node)
				assert_int_equal(n->ranges[q].leader_epoch, n->epoch);
		}
		for (size_t i = 0; i < n->nranges; i++) {
			const kv_range *r = &n->ranges[i];
			for (uint32_t j = 1; j < kv_range_ninsync(r); j++)
				assert_int_not_equal(
				    kv_config_node(n, kv_range_insync(r, j))->state, KV_NODE_DOWN);
			/* A down primary keeps no other ISR member but the fence,
			 * which is never promoted (the range waits for it). */
			if (kv_config_node(n, r->node)->state == KV_NODE_DOWN)
				assert_true(kv_range_ninsync(r) == 1 ||
				            (kv_range_ninsync(r) == 2 && r->fence != 0 &&
				             kv_range_insync(r, 1) == r->fence));
			/* The fence is an ISR member other than the primary. */
			if (r->fence != 0) {
				assert_int_not_equal(r->fence, r->node);
				assert_true(kv_range_has_replica(r, r->fence, true));
			}
		}
		applied++;
		kv_config_free(c);
		c = n;
	}
	print_message("applied %d commands, %d failovers, %d ISR changes, %zu nodes, %zu ranges\n",
	              applied, failovers, changes, c->nnodes, c->nranges);
	assert_true(applied > 300);
	assert_true(failovers > 5);
	assert_true(changes > 20);
	kv_config_free(c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(first_join_owns_the_whole_key_space),
	    cmocka_unit_test(remove_refuses_a_node_that_is_not_down),
	    cmocka_unit_test(remove_of_a_down_node_with_ranges_needs_the_data_loss_flag),
	    cmocka_unit_test(
	        remove_with_data_loss_gives_the_ranges_to_the_least_loaded_active_node),
	    cmocka_unit_test(remove_fails_the_migrations_of_the_node),
	    cmocka_unit_test(set_state_marks_nodes_down_and_back),
	    cmocka_unit_test(join_of_empty_cluster_gives_newcomer_half_the_printable_key_space),
	    cmocka_unit_test(join_splits_at_reported_split_keys_by_size),
	    cmocka_unit_test(join_with_data_that_cannot_be_cut_falls_back_to_key_space),
	    cmocka_unit_test(join_with_balancer_on_and_no_data_registers_and_moves_nothing),
	    cmocka_unit_test(join_with_balancer_on_and_data_above_the_floor_takes_a_share),
	    cmocka_unit_test(join_with_balancer_on_never_cuts_by_key_space_width),
	    cmocka_unit_test(third_join_takes_a_third_from_both),
	    cmocka_unit_test(duplicate_join_is_refused_and_changes_nothing),
	    cmocka_unit_test(join_without_rebalance_registers_only),
	    cmocka_unit_test(join_of_gone_address_gets_a_new_id),
	    cmocka_unit_test(move_carves_from_every_owner_and_merges),
	    cmocka_unit_test(a_new_primary_gets_the_new_epoch_as_leader_epoch),
	    cmocka_unit_test(move_inside_one_range_splits_it_in_three),
	    cmocka_unit_test(move_refusals_change_nothing),
	    cmocka_unit_test(move_to_current_owner_changes_nothing),
	    cmocka_unit_test(leave_spreads_ranges_over_remaining_nodes_balanced),
	    cmocka_unit_test(leave_refusals_change_nothing),
	    cmocka_unit_test(leave_of_node_that_owns_nothing_makes_it_gone),
	    cmocka_unit_test(finished_drain_makes_the_node_gone),
	    cmocka_unit_test(failed_migration_returns_the_range_to_its_source),
	    cmocka_unit_test(rebalance_moves_only_the_excess),
	    cmocka_unit_test(rebalance_of_a_balanced_cluster_moves_nothing),
	    cmocka_unit_test(rebalance_skips_ranges_in_flight),
	    cmocka_unit_test(random_commands_keep_the_map_valid_and_leave_moving_ranges_alone),
	    cmocka_unit_test(midpoint_lies_strictly_inside),
	    cmocka_unit_test(joins_with_two_replicas_add_the_newcomer_outside_the_isr),
	    cmocka_unit_test(joins_with_three_replicas_fill_every_range),
	    cmocka_unit_test(a_join_spreads_new_replicas_evenly_over_single_ranges),
	    cmocka_unit_test(one_replica_joins_plan_exactly_as_before),
	    cmocka_unit_test(failover_promotes_the_live_isr_member_leading_fewest_ranges),
	    cmocka_unit_test(failover_without_a_live_isr_member_keeps_the_primary),
	    cmocka_unit_test(two_down_nodes_leave_every_isr_and_ranges_fail_over_to_the_third),
	    cmocka_unit_test(isr_change_refusals_change_nothing),
	    cmocka_unit_test(isr_change_splits_commits_and_merges_back),
	    cmocka_unit_test(remove_drops_the_node_from_replica_sets_and_refuses_lost_isrs),
	    cmocka_unit_test(remove_with_replicas_refills_the_replica_sets),
	    cmocka_unit_test(rebalance_spreads_replicas_and_primaries_of_replicated_ranges),
	    cmocka_unit_test(rebalance_of_balanced_replicas_changes_nothing),
	    cmocka_unit_test(move_to_an_in_sync_replica_transfers_the_primary_role_at_once),
	    cmocka_unit_test(the_old_primary_kept_as_the_fence_leads_again_only_after_a_copy),
	    cmocka_unit_test(the_fence_found_in_sync_ends_and_stays_in_the_isr),
	    cmocka_unit_test(move_while_the_primary_still_replaces_its_predecessor_is_busy),
	    cmocka_unit_test(move_to_a_new_node_replaces_the_primary_through_the_isr),
	    cmocka_unit_test(leave_of_a_backup_adds_replacements_and_ends_when_they_are_in_sync),
	    cmocka_unit_test(
	        leave_of_a_primary_transfers_the_role_and_keeps_the_old_primary_in_the_isr),
	    cmocka_unit_test(every_node_of_a_replicated_cluster_can_leave_in_turn),
	    cmocka_unit_test(leave_refuses_a_primary_without_another_live_isr_member),
	    cmocka_unit_test(leave_with_no_node_to_replace_drops_the_backup_short_of_a_replica),
	    cmocka_unit_test(a_down_member_past_down_after_is_replaced_and_dropped_on_expand),
	    cmocka_unit_test(a_down_member_with_no_node_to_replace_it_stays),
	    cmocka_unit_test(replacements_go_to_the_node_with_the_least_data),
	    cmocka_unit_test(moving_a_single_range_keeps_the_replica_sets_of_the_others),
	    cmocka_unit_test(random_replicated_commands_keep_the_replica_invariants),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
