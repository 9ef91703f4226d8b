/*
 * batch.c - the pure parts of multi-key and range operations: which keys go
 * to which node, which node serves which piece of a scanned range, and how
 * per-server scan pages are merged into one ordered result.
 *
 * Everything here works on a configuration snapshot passed in, does no I/O
 * and takes no lock, so it is tested with hand-built configurations
 * (tests/test_client_batch.c). Routing always goes through kv_config_route,
 * so a range in migration is sent to its source, as doc/protocol.md says.
 */
#include "client/client_int.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

int
kvc_split_keys(const kv_config *cfg, size_t n, const kv_bytes *keys, kvc_part **parts,
               size_t *nparts)
{
	uint32_t *node = NULL;
	kvc_part *p = NULL;
	size_t np = 0;

	if (n == 0) {
		*parts = NULL;
		*nparts = 0;
		return KV_OK;
	}
	if ((node = malloc(n * sizeof(*node))) == NULL)
		return KV_ENOMEM;
	/* Distinct nodes, in ascending id order (insertion sort: few nodes). */
	for (size_t i = 0; i < n; i++) {
		size_t j;
		node[i] = kv_config_route(cfg, keys[i].p, keys[i].len);
		for (j = 0; j < np && p[j].node < node[i]; j++)
			;
		if (j < np && p[j].node == node[i]) {
			p[j].n++;
			continue;
		}
		kvc_part *q = realloc(p, (np + 1) * sizeof(*p));
		if (q == NULL)
			goto err;
		p = q;
		memmove(&p[j + 1], &p[j], (np - j) * sizeof(*p));
		p[j].node = node[i];
		p[j].n = 1;
		p[j].idx = NULL;
		np++;
	}
	for (size_t j = 0; j < np; j++) {
		if ((p[j].idx = malloc(p[j].n * sizeof(size_t))) == NULL)
			goto err;
		p[j].n = 0;
	}
	for (size_t i = 0; i < n; i++) {
		size_t j = 0;
		while (p[j].node != node[i])
			j++;
		p[j].idx[p[j].n++] = i;
	}
	free(node);
	*parts = p;
	*nparts = np;
	return KV_OK;
err:
	kvc_parts_free(p, np);
	free(node);
	return KV_ENOMEM;
}

void
kvc_parts_free(kvc_part *parts, size_t nparts)
{
	if (parts == NULL)
		return;
	for (size_t i = 0; i < nparts; i++)
		free(parts[i].idx);
	free(parts);
}

/* Compares two range ends, where empty means "end of the key space". */
static int
end_cmp(const void *a, size_t alen, const void *b, size_t blen)
{
	if (alen == 0 || blen == 0)
		return (alen == 0) - (blen == 0);
	return kv_key_cmp(a, alen, b, blen);
}

int
kvc_scan_plan(const kv_config *cfg, kv_bytes start, kv_bytes end, kvc_span **spans, size_t *nspans)
{
	kvc_span *s = NULL;
	size_t ns = 0;
	kv_buf cur = {0};

	if (kv_range_is_empty(start.p, start.len, end.p, end.len))
		return KV_EINVAL;
	if (cfg->nranges == 0)
		return KV_EUNAVAIL;
	if (kv_buf_set(&cur, start.p, start.len) != KV_OK)
		return KV_ENOMEM;
	for (;;) {
		long ri = kv_config_find_range(cfg, cur.data, cur.len);
		const kv_buf *nb = &cfg->ranges[ri].end; /* the next boundary */
		kvc_span *q;

		for (size_t i = 0; i < cfg->nmigs; i++) {
			const kv_migration *m = &cfg->migs[i];
			if (m->phase >= KV_MIG_DONE)
				continue;
			if (kv_key_cmp(m->start.data, m->start.len, cur.data, cur.len) > 0) {
				if (end_cmp(m->start.data, m->start.len, nb->data, nb->len) < 0)
					nb = &m->start;
			} else if (kv_range_contains(m->start.data, m->start.len, m->end.data,
			                             m->end.len, cur.data, cur.len)) {
				if (end_cmp(m->end.data, m->end.len, nb->data, nb->len) < 0)
					nb = &m->end;
			}
		}
		bool last = end_cmp(end.p, end.len, nb->data, nb->len) <= 0;
		if ((q = realloc(s, (ns + 1) * sizeof(*s))) == NULL)
			goto err;
		s = q;
		memset(&s[ns], 0, sizeof(s[ns]));
		s[ns].node = kv_config_route(cfg, cur.data, cur.len);
		s[ns].start = cur;
		memset(&cur, 0, sizeof(cur));
		ns++;
		if (last) {
			if (end.len && kv_buf_set(&s[ns - 1].end, end.p, end.len) != KV_OK)
				goto err;
			break;
		}
		if (kv_buf_set(&s[ns - 1].end, nb->data, nb->len) != KV_OK ||
		    kv_buf_set(&cur, nb->data, nb->len) != KV_OK)
			goto err;
	}
	*spans = s;
	*nspans = ns;
	return KV_OK;
err:
	kv_buf_fini(&cur);
	kvc_spans_free(s, ns);
	return KV_ENOMEM;
}

void
kvc_spans_free(kvc_span *spans, size_t n)
{
	if (spans == NULL)
		return;
	for (size_t i = 0; i < n; i++) {
		kv_buf_fini(&spans[i].start);
		kv_buf_fini(&spans[i].end);
	}
	free(spans);
}

long
kvc_entries_merge(kvc_entries *acc, kv_data_entry *src, size_t nsrc, size_t limit)
{
	long added = 0;

	for (size_t i = 0; i < nsrc; i++) {
		if (limit && acc->n >= limit)
			break;
		if (acc->n > 0) {
			const kv_buf *last = &acc->entries[acc->n - 1].key;
			if (kv_key_cmp(src[i].key.data, src[i].key.len, last->data, last->len) <= 0)
				continue;
		}
		if (acc->n == acc->cap) {
			size_t cap = acc->cap ? acc->cap * 2 : 64;
			kv_data_entry *e = realloc(acc->entries, cap * sizeof(*e));
			if (e == NULL)
				return KV_ENOMEM;
			acc->entries = e;
			acc->cap = cap;
		}
		acc->entries[acc->n++] = src[i];
		memset(&src[i], 0, sizeof(src[i]));
		added++;
	}
	return added;
}

void
kvc_entries_fini(kvc_entries *e)
{
	if (e == NULL)
		return;
	for (size_t i = 0; i < e->n; i++) {
		kv_buf_fini(&e->entries[i].key);
		kv_buf_fini(&e->entries[i].value);
	}
	free(e->entries);
	memset(e, 0, sizeof(*e));
}
