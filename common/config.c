/*
 * config.c - configuration values: copy, free, validate, look up (config.h).
 */
#include "common/config.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

kv_config *
kv_config_new(void)
{
	return calloc(1, sizeof(kv_config));
}

void
kv_config_free(kv_config *c)
{
	if (c == NULL)
		return;
	for (size_t i = 0; i < c->nnodes; i++)
		free(c->nodes[i].address);
	for (size_t i = 0; i < c->nranges; i++) {
		kv_buf_fini(&c->ranges[i].start);
		kv_buf_fini(&c->ranges[i].end);
	}
	for (size_t i = 0; i < c->nmigs; i++) {
		kv_buf_fini(&c->migs[i].start);
		kv_buf_fini(&c->migs[i].end);
	}
	kv_config_unpin_all(c);
	free(c->nodes);
	free(c->ranges);
	free(c->migs);
	free(c->cluster_id);
	free(c);
}

static int
buf_copy(kv_buf *dst, const kv_buf *src)
{
	memset(dst, 0, sizeof(*dst));
	return src->len ? kv_buf_set(dst, src->data, src->len) : KV_OK;
}

kv_config *
kv_config_clone(const kv_config *c)
{
	kv_config *n = kv_config_new();

	if (n == NULL)
		return NULL;
	n->epoch = c->epoch;
	n->time_ms = c->time_ms;
	n->min_insync = c->min_insync;
	if (c->cluster_id && (n->cluster_id = strdup(c->cluster_id)) == NULL)
		goto err;
	if (c->nnodes && (n->nodes = calloc(c->nnodes, sizeof(kv_node))) == NULL)
		goto err;
	for (size_t i = 0; i < c->nnodes; i++, n->nnodes++) {
		n->nodes[i] = c->nodes[i];
		n->nodes[i].address = NULL;
		if (c->nodes[i].address &&
		    (n->nodes[i].address = strdup(c->nodes[i].address)) == NULL)
			goto err;
	}
	if (c->nranges && (n->ranges = calloc(c->nranges, sizeof(kv_range))) == NULL)
		goto err;
	for (size_t i = 0; i < c->nranges; i++, n->nranges++) {
		n->ranges[i] = c->ranges[i];
		if (buf_copy(&n->ranges[i].start, &c->ranges[i].start) != KV_OK ||
		    buf_copy(&n->ranges[i].end, &c->ranges[i].end) != KV_OK) {
			n->nranges++;
			goto err;
		}
	}
	if (c->nmigs && (n->migs = calloc(c->nmigs, sizeof(kv_migration))) == NULL)
		goto err;
	for (size_t i = 0; i < c->nmigs; i++, n->nmigs++) {
		n->migs[i] = c->migs[i];
		if (buf_copy(&n->migs[i].start, &c->migs[i].start) != KV_OK ||
		    buf_copy(&n->migs[i].end, &c->migs[i].end) != KV_OK) {
			n->nmigs++;
			goto err;
		}
	}
	if (c->npins && (n->pins = calloc(c->npins, sizeof(kv_span))) == NULL)
		goto err;
	for (size_t i = 0; i < c->npins; i++, n->npins++)
		if (buf_copy(&n->pins[i].start, &c->pins[i].start) != KV_OK ||
		    buf_copy(&n->pins[i].end, &c->pins[i].end) != KV_OK) {
			n->npins++;
			goto err;
		}
	return n;
err:
	kv_config_free(n);
	return NULL;
}

/* Orders two span ends, an empty one being the end of the key space. */
static int
end_cmp(const void *a, size_t al, const void *b, size_t bl)
{
	if (al == 0 || bl == 0)
		return (al == 0) - (bl == 0);
	return kv_key_cmp(a, al, b, bl);
}

int
kv_config_pin(kv_config *c, kv_bytes start, kv_bytes end)
{
	kv_buf ns = {0}, ne = {0};
	const void *sp = start.p, *ep = end.p;
	size_t sl = start.len, el = end.len, keep = 0;
	kv_span *v;

	if (kv_range_is_empty(start.p, start.len, end.p, end.len))
		return KV_EINVAL;
	/* The new span grows over every pin it overlaps or touches. */
	for (size_t i = 0; i < c->npins; i++) {
		const kv_span *q = &c->pins[i];
		bool apart =
		    (q->end.len && kv_key_cmp(q->end.data, q->end.len, start.p, start.len) < 0) ||
		    (end.len && kv_key_cmp(end.p, end.len, q->start.data, q->start.len) < 0);
		if (apart) {
			keep++;
			continue;
		}
		if (kv_key_cmp(q->start.data, q->start.len, sp, sl) < 0) {
			sp = q->start.data;
			sl = q->start.len;
		}
		if (end_cmp(q->end.data, q->end.len, ep, el) > 0) {
			ep = q->end.data;
			el = q->end.len;
		}
	}
	if (keep + 1 > KV_MAX_PINS)
		return KV_ELIMIT;
	if ((v = calloc(keep + 1, sizeof(*v))) == NULL ||
	    (sl && kv_buf_set(&ns, sp, sl) != KV_OK) || (el && kv_buf_set(&ne, ep, el) != KV_OK)) {
		free(v);
		kv_buf_fini(&ns);
		kv_buf_fini(&ne);
		return KV_ENOMEM;
	}
	size_t k = 0;
	bool placed = false;
	for (size_t i = 0; i < c->npins; i++) {
		kv_span *q = &c->pins[i];
		bool apart =
		    (q->end.len && kv_key_cmp(q->end.data, q->end.len, ns.data, ns.len) < 0) ||
		    (ne.len && kv_key_cmp(ne.data, ne.len, q->start.data, q->start.len) < 0);
		if (!apart) {
			kv_buf_fini(&q->start);
			kv_buf_fini(&q->end);
			continue;
		}
		if (!placed && kv_key_cmp(ns.data, ns.len, q->start.data, q->start.len) < 0) {
			v[k++] = (kv_span){ns, ne};
			placed = true;
		}
		v[k++] = *q;
	}
	if (!placed)
		v[k++] = (kv_span){ns, ne};
	free(c->pins);
	c->pins = v;
	c->npins = k;
	return KV_OK;
}

void
kv_config_unpin_all(kv_config *c)
{
	for (size_t i = 0; i < c->npins; i++) {
		kv_buf_fini(&c->pins[i].start);
		kv_buf_fini(&c->pins[i].end);
	}
	free(c->pins);
	c->pins = NULL;
	c->npins = 0;
}

bool
kv_config_pinned(const kv_config *c, kv_bytes start, kv_bytes end, bool covered)
{
	for (size_t i = 0; i < c->npins; i++) {
		const kv_span *q = &c->pins[i];
		if (covered) {
			if (kv_key_cmp(q->start.data, q->start.len, start.p, start.len) <= 0 &&
			    end_cmp(end.p, end.len, q->end.data, q->end.len) <= 0)
				return true;
		} else if ((q->end.len == 0 ||
		            kv_key_cmp(start.p, start.len, q->end.data, q->end.len) < 0) &&
		           (end.len == 0 ||
		            kv_key_cmp(q->start.data, q->start.len, end.p, end.len) < 0)) {
			return true;
		}
	}
	return false;
}

const kv_node *
kv_config_node(const kv_config *c, uint32_t id)
{
	size_t lo = 0, hi = c->nnodes;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (c->nodes[mid].id == id)
			return &c->nodes[mid];
		if (c->nodes[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

const kv_node *
kv_config_node_by_address(const kv_config *c, const char *address)
{
	for (size_t i = 0; i < c->nnodes; i++)
		if (c->nodes[i].state != KV_NODE_GONE && c->nodes[i].address &&
		    strcmp(c->nodes[i].address, address) == 0)
			return &c->nodes[i];
	return NULL;
}

void
kv_range_set_single(kv_range *r, uint32_t node)
{
	r->node = node;
	r->nreplicas = r->ninsync = 0;
	memset(r->replicas, 0, sizeof(r->replicas));
	memset(r->insync, 0, sizeof(r->insync));
	r->nreplacing = 0;
	memset(r->replacing, 0, sizeof(r->replacing));
	memset(r->replaced, 0, sizeof(r->replaced));
	r->fence = 0;
}

uint32_t
kv_range_replacement(const kv_range *r, uint32_t node, bool replacing)
{
	for (uint32_t i = 0; i < r->nreplacing && i < KV_MAX_REPLICAS; i++)
		if ((replacing ? r->replacing[i] : r->replaced[i]) == node)
			return replacing ? r->replaced[i] : r->replacing[i];
	return 0;
}

bool
kv_range_has_replica(const kv_range *r, uint32_t node, bool in_isr)
{
	uint32_t n = in_isr ? kv_range_ninsync(r) : kv_range_nreplicas(r);

	for (uint32_t i = 0; i < n && i < KV_MAX_REPLICAS; i++)
		if ((in_isr ? kv_range_insync(r, i) : kv_range_replica(r, i)) == node)
			return true;
	return false;
}

bool
kv_range_same_placement(const kv_range *a, const kv_range *b)
{
	if (a->node != b->node || kv_range_nreplicas(a) != kv_range_nreplicas(b) ||
	    kv_range_ninsync(a) != kv_range_ninsync(b) || a->leader_epoch != b->leader_epoch ||
	    a->fence != b->fence)
		return false;
	for (uint32_t i = 0; i < kv_range_nreplicas(a) && i < KV_MAX_REPLICAS; i++)
		if (!kv_range_has_replica(b, kv_range_replica(a, i), false))
			return false;
	for (uint32_t i = 0; i < kv_range_ninsync(a) && i < KV_MAX_REPLICAS; i++)
		if (!kv_range_has_replica(b, kv_range_insync(a, i), true))
			return false;
	if (a->nreplacing != b->nreplacing)
		return false;
	for (uint32_t i = 0; i < a->nreplacing && i < KV_MAX_REPLICAS; i++)
		if (kv_range_replacement(b, a->replacing[i], true) != a->replaced[i])
			return false;
	return true;
}

/* The replica set and ISR of one range against the invariant of config.h. */
static int
range_sets_check(const kv_config *c, const kv_range *r)
{
	if (r->nreplicas == 0)
		return r->ninsync == 0 && r->nreplacing == 0 && r->fence == 0 ? KV_OK : KV_EINVAL;
	if (r->fence != 0 && (r->fence == r->node || !kv_range_has_replica(r, r->fence, true)))
		return KV_EINVAL;
	if (r->nreplicas < 2 || r->nreplicas > KV_MAX_REPLICAS || r->ninsync < 1 ||
	    r->ninsync > r->nreplicas || r->replicas[0] != r->node || r->insync[0] != r->node)
		return KV_EINVAL;
	for (uint32_t i = 0; i < r->nreplicas; i++) {
		const kv_node *nd = kv_config_node(c, r->replicas[i]);
		if (nd == NULL || nd->state == KV_NODE_GONE)
			return KV_EINVAL;
		for (uint32_t j = 0; j < i; j++)
			if (r->replicas[j] == r->replicas[i])
				return KV_EINVAL;
	}
	for (uint32_t i = 0; i < r->ninsync; i++) {
		if (!kv_range_has_replica(r, r->insync[i], false))
			return KV_EINVAL;
		for (uint32_t j = 0; j < i; j++)
			if (r->insync[j] == r->insync[i])
				return KV_EINVAL;
	}
	/* A replacement pairs two distinct replicas; no member is in two
	 * pairs. */
	if (r->nreplacing >= r->nreplicas)
		return KV_EINVAL;
	for (uint32_t i = 0; i < r->nreplacing; i++) {
		uint32_t a = r->replacing[i], b = r->replaced[i];
		if (a == b || !kv_range_has_replica(r, a, false) ||
		    !kv_range_has_replica(r, b, false))
			return KV_EINVAL;
		for (uint32_t j = 0; j < i; j++)
			if (r->replacing[j] == a || r->replaced[j] == a || r->replacing[j] == b ||
			    r->replaced[j] == b)
				return KV_EINVAL;
	}
	return KV_OK;
}

int
kv_config_validate(const kv_config *c)
{
	const char *why;
	size_t at;

	return kv_config_check(c, &why, &at);
}

int
kv_config_check(const kv_config *c, const char **why, size_t *at)
{
	*why = NULL;
	*at = 0;
	if (c == NULL) {
		*why = "no configuration";
		return KV_EINVAL;
	}
	for (size_t i = 0; i < c->nnodes; i++) {
		*at = i;
		if (c->nodes[i].id == 0 || c->nodes[i].address == NULL ||
		    c->nodes[i].state < KV_NODE_JOINING || c->nodes[i].state > KV_NODE_DOWN) {
			*why = "a node without an id, an address or a known state";
			return KV_EINVAL;
		}
		if (i > 0 && c->nodes[i - 1].id >= c->nodes[i].id) {
			*why = "nodes not sorted by id";
			return KV_EINVAL;
		}
	}
	for (size_t i = 0; i < c->nranges; i++) {
		const kv_range *r = &c->ranges[i];
		*at = i;
		if (kv_config_node(c, r->node) == NULL) {
			*why = "a range's primary is not a node of the configuration";
			return KV_EINVAL;
		}
		if (range_sets_check(c, r) != KV_OK) {
			*why =
			    "a range's replica set, ISR, replacements or fence break the invariant";
			return KV_EINVAL;
		}
		if (i == 0 && r->start.len != 0) {
			*why = "the first range does not start at the beginning of the key space";
			return KV_EINVAL;
		}
		if (i > 0) {
			const kv_range *p = &c->ranges[i - 1];
			if (p->end.len == 0 ||
			    kv_key_cmp(p->end.data, p->end.len, r->start.data, r->start.len) != 0) {
				*why = "a range does not start where the one before ends";
				return KV_EINVAL;
			}
			if (kv_range_same_placement(p, r)) {
				*why = "two adjacent ranges with the same placement (not merged)";
				return KV_EINVAL;
			}
		}
		if (kv_range_is_empty(r->start.data, r->start.len, r->end.data, r->end.len)) {
			*why = "an empty range";
			return KV_EINVAL;
		}
		if (i + 1 == c->nranges && r->end.len != 0) {
			*why = "the last range does not end at the end of the key space";
			return KV_EINVAL;
		}
	}
	for (size_t i = 0; i < c->nmigs; i++) {
		const kv_migration *m = &c->migs[i];
		*at = i;
		if (kv_config_node(c, m->from) == NULL || kv_config_node(c, m->to) == NULL ||
		    m->from == m->to) {
			*why = "a migration between unknown or equal nodes";
			return KV_EINVAL;
		}
		if (kv_range_is_empty(m->start.data, m->start.len, m->end.data, m->end.len)) {
			*why = "a migration of an empty range";
			return KV_EINVAL;
		}
	}
	if (c->npins > KV_MAX_PINS) {
		*at = c->npins;
		*why = "too many pins";
		return KV_EINVAL;
	}
	for (size_t i = 0; i < c->npins; i++) {
		const kv_span *q = &c->pins[i];
		*at = i;
		if (kv_range_is_empty(q->start.data, q->start.len, q->end.data, q->end.len)) {
			*why = "an empty pin";
			return KV_EINVAL;
		}
		if (i > 0 && (c->pins[i - 1].end.len == 0 ||
		              kv_key_cmp(c->pins[i - 1].end.data, c->pins[i - 1].end.len,
		                         q->start.data, q->start.len) >= 0)) {
			*why = "pins not sorted, overlapping or adjacent";
			return KV_EINVAL;
		}
	}
	return KV_OK;
}

long
kv_config_find_range(const kv_config *c, const void *key, size_t klen)
{
	size_t lo = 0, hi = c->nranges;

	if (c->nranges == 0)
		return -1;
	/* The last range whose start is <= key. */
	while (hi - lo > 1) {
		size_t mid = lo + (hi - lo) / 2;
		const kv_range *r = &c->ranges[mid];
		if (kv_key_cmp(r->start.data, r->start.len, key, klen) <= 0)
			lo = mid;
		else
			hi = mid;
	}
	return (long)lo;
}

const kv_migration *
kv_config_migration_for(const kv_config *c, const void *key, size_t klen)
{
	for (size_t i = 0; i < c->nmigs; i++) {
		const kv_migration *m = &c->migs[i];
		if (m->phase >= KV_MIG_DONE)
			continue;
		if (kv_range_contains(m->start.data, m->start.len, m->end.data, m->end.len, key,
		                      klen))
			return m;
	}
	return NULL;
}

uint32_t
kv_config_route(const kv_config *c, const void *key, size_t klen)
{
	const kv_migration *m = kv_config_migration_for(c, key, klen);
	long i;

	if (m != NULL)
		return m->from;
	i = kv_config_find_range(c, key, klen);
	return i < 0 ? 0 : c->ranges[i].node;
}

const char *
kv_node_state_name(kv_node_state s)
{
	switch (s) {
	case KV_NODE_JOINING:
		return "joining";
	case KV_NODE_ACTIVE:
		return "active";
	case KV_NODE_DRAINING:
		return "draining";
	case KV_NODE_GONE:
		return "gone";
	case KV_NODE_DOWN:
		return "down";
	default:
		return "unknown";
	}
}

const char *
kv_mig_phase_name(kv_mig_phase p)
{
	switch (p) {
	case KV_MIG_PENDING:
		return "pending";
	case KV_MIG_COPYING:
		return "copying";
	case KV_MIG_CATCHUP:
		return "catchup";
	case KV_MIG_FENCED:
		return "fenced";
	case KV_MIG_DONE:
		return "done";
	case KV_MIG_CANCELLED:
		return "cancelled";
	case KV_MIG_FAILED:
		return "failed";
	default:
		return "unknown";
	}
}
