/*
 * xfer_codec.c - the transfer family (xfer_codec.h).
 *
 * It also holds the replication family (repl_codec.h: Replicate and
 * ReplicateAck), which shares the Request/Response envelope helpers and
 * must link into every library that carries data_codec.c.
 *
 * DESIGN. Decoding walks the unpacked Transfer once, checking everything a
 * peer could get wrong before copying pointers into plain C structs, so
 * migrate_in.c never sees an unchecked field; the Request envelope around it
 * is data_codec.c's. Encoding builds a temporary message tree that borrows
 * the caller's bytes, packs it straight into an nng message body, and frees
 * only the tree's own arrays (never with free_unpacked).
 */
#include "proto/xfer_codec.h"
#include "proto/repl_codec.h"
#include "common/bytes.h"
#include "common/err.h"
#include "proto/codec_int.h"
#include "proto/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Returns whether a byte field fits the hard key limit. */
static bool
key_ok(ProtobufCBinaryData d)
{
	return d.len <= KV_HARD_MAX_KEY;
}

static int
decode_dedup(const Shardkv__DedupEntry *d, kv_xfer_dedup *out)
{
	memset(out, 0, sizeof(*out));
	if (d == NULL || d->client_id == 0 || d->request_id == 0 || !key_ok(d->key))
		return KV_EINVAL;
	out->client_id = d->client_id;
	out->request_id = d->request_id;
	out->key = kv_codec__bytes(d->key);
	out->time_ms = d->time_ms;
	if (d->result) {
		out->status = kv_err_from_wire(d->result->status);
		out->value_len = d->result->value_len;
		out->value = kv_codec__bytes(d->result->value);
	}
	out->has_value = d->has_value;
	if (out->has_value && out->value.len > KV_HARD_MAX_VALUE)
		return KV_EINVAL;
	return KV_OK;
}

/*
 * Decodes one transfer entry. A whole entry (value_total 0) must have offset
 * 0; a slice must carry at least one byte and lie inside a total of at most
 * KV_HARD_MAX_VALUE (the server's own --max-value is checked by migrate_in.c).
 * Sets *why and returns KV_EINVAL otherwise.
 */
static int
decode_kv(const Shardkv__KeyValue *kv, kv_xfer_kv *out, const char **why)
{
	if (kv == NULL || kv->key.len == 0 || !key_ok(kv->key) ||
	    kv->value.len > KV_HARD_MAX_VALUE) {
		*why = "bad transfer entry (key or value size)";
		return KV_EINVAL;
	}
	if (kv->value_total == 0 && kv->value_offset != 0) {
		*why = "bad transfer entry (offset without value_total)";
		return KV_EINVAL;
	}
	if (kv->value_total != 0 && (kv->value_total > KV_HARD_MAX_VALUE || kv->value.len == 0 ||
	                             kv->value_offset > kv->value_total ||
	                             kv->value.len > kv->value_total - kv->value_offset)) {
		*why = "bad value slice (empty, or outside value_total, or value_total over the "
		       "hard limit)";
		return KV_EINVAL;
	}
	out->key = kv_codec__bytes(kv->key);
	out->value = kv_codec__bytes(kv->value);
	out->value_offset = kv->value_offset;
	out->value_total = kv->value_total;
	return KV_OK;
}

/* ------------------------------------------------------------------------
 * TransferChunk.packed_entries: per entry a flags byte, the key's and the
 * value's lengths as varints, the flagged varints (deadline; value_offset
 * and value_total), then the key and the value (shardkv.proto).
 * ------------------------------------------------------------------------ */

#define PK_DEADLINE 0x01u /* a deadline follows the lengths */
#define PK_SLICE    0x02u /* value_offset and value_total follow */
#define PK_VARINT   10u   /* the longest varint of a uint64_t */

static size_t
varint_len(uint64_t v)
{
	size_t n = 1;

	while (v >= 0x80) {
		v >>= 7;
		n++;
	}
	return n;
}

static uint8_t *
varint_put(uint8_t *p, uint64_t v)
{
	while (v >= 0x80) {
		*p++ = (uint8_t)(v | 0x80);
		v >>= 7;
	}
	*p++ = (uint8_t)v;
	return p;
}

/* Reads a varint at p[*off..n); false when it is cut short or longer than
 * a uint64_t's. */
static bool
varint_get(const uint8_t *p, size_t n, size_t *off, uint64_t *v)
{
	uint64_t r = 0;

	for (unsigned shift = 0, i = 0; i < PK_VARINT && *off < n; i++, shift += 7) {
		uint8_t b = p[(*off)++];
		if (i == PK_VARINT - 1 && b > 1)
			return false; /* past 64 bits */
		r |= (uint64_t)(b & 0x7f) << shift;
		if ((b & 0x80) == 0) {
			*v = r;
			return true;
		}
	}
	return false;
}

/* Bytes of the entries packed. */
static size_t
kvs_packed_size(const kv_xfer_kv *kv, size_t n)
{
	size_t b = 0;

	for (size_t i = 0; i < n; i++) {
		b += 1 + varint_len(kv[i].key.len) + varint_len(kv[i].value.len) + kv[i].key.len +
		     kv[i].value.len;
		if (kv[i].expire_at)
			b += varint_len(kv[i].expire_at);
		if (kv[i].value_total)
			b += varint_len(kv[i].value_offset) + varint_len(kv[i].value_total);
	}
	return b;
}

static void
pack_kvs(const kv_xfer_kv *kv, size_t n, uint8_t *p)
{
	for (size_t i = 0; i < n; i++) {
		const kv_xfer_kv *e = &kv[i];
		*p++ =
		    (uint8_t)((e->expire_at ? PK_DEADLINE : 0) | (e->value_total ? PK_SLICE : 0));
		p = varint_put(p, e->key.len);
		p = varint_put(p, e->value.len);
		if (e->expire_at)
			p = varint_put(p, e->expire_at);
		if (e->value_total) {
			p = varint_put(p, e->value_offset);
			p = varint_put(p, e->value_total);
		}
		memcpy(p, e->key.p, e->key.len);
		p += e->key.len;
		if (e->value.len)
			memcpy(p, e->value.p, e->value.len);
		p += e->value.len;
	}
}

/* Reads one packed entry at p[*off..n) into *out (pointing into p) with the
 * checks of decode_kv. */
static int
unpack_kv(const uint8_t *p, size_t n, size_t *off, kv_xfer_kv *out, const char **why)
{
	uint64_t kl, vl, at = 0, vo = 0, vt = 0;
	uint8_t f;

	if (*off >= n)
		goto cut;
	f = p[(*off)++];
	if (f & ~(PK_DEADLINE | PK_SLICE)) {
		*why = "bad packed transfer entry (unknown flags)";
		return KV_EINVAL;
	}
	if (!varint_get(p, n, off, &kl) || !varint_get(p, n, off, &vl) ||
	    ((f & PK_DEADLINE) && !varint_get(p, n, off, &at)) ||
	    ((f & PK_SLICE) && (!varint_get(p, n, off, &vo) || !varint_get(p, n, off, &vt))))
		goto cut;
	if (kl == 0 || kl > KV_HARD_MAX_KEY || vl > KV_HARD_MAX_VALUE) {
		*why = "bad transfer entry (key or value size)";
		return KV_EINVAL;
	}
	if (kl + vl > n - *off)
		goto cut;
	if ((f & PK_DEADLINE) && at == 0) {
		*why = "bad packed transfer entry (a deadline of 0)";
		return KV_EINVAL;
	}
	if ((f & PK_SLICE) &&
	    (vt == 0 || vt > KV_HARD_MAX_VALUE || vl == 0 || vo > vt || vl > vt - vo)) {
		*why = "bad value slice (empty, or outside value_total, or value_total over the "
		       "hard limit)";
		return KV_EINVAL;
	}
	out->key = (kv_bytes){p + *off, (size_t)kl};
	out->value = (kv_bytes){vl ? p + *off + kl : NULL, (size_t)vl};
	out->expire_at = at;
	out->value_offset = vo;
	out->value_total = vt;
	*off += kl + vl;
	return KV_OK;
cut:
	*why = "packed transfer entries cut short";
	return KV_EINVAL;
}

/* The entries packed in p[0..n) into x->kv, pointing into p: counted and
 * checked whole first, then taken. */
static int
unpack_kvs(const uint8_t *p, size_t n, kv_xfer *x, const char **why)
{
	size_t cnt = 0, off = 0;
	kv_xfer_kv e;
	int rv;

	while (off < n) {
		if ((rv = unpack_kv(p, n, &off, &e, why)) != 0)
			return rv;
		if (++cnt > KV_XFER_MAX_RECS) {
			*why = "chunk too large";
			return KV_ELIMIT;
		}
	}
	if ((x->kv = calloc(cnt, sizeof(*x->kv))) == NULL)
		return KV_ENOMEM;
	for (off = 0; x->nkv < cnt; x->nkv++)
		(void)unpack_kv(p, n, &off, &x->kv[x->nkv], why);
	return KV_OK;
}

int
kv_xfer__from_pb(const Shardkv__Transfer *t, kv_xfer *x, const char **why)
{
	int rv;

	memset(x, 0, sizeof(*x));
	x->migration_id = t->migration_id;
	x->seq = t->seq;
	if (t->migration_id == 0 || t->seq == 0) {
		*why = "transfer without migration id or seq";
		return KV_EINVAL;
	}
	switch (t->msg_case) {
	case SHARDKV__TRANSFER__MSG_BEGIN:
		x->kind = KV_XFER_BEGIN;
		x->epoch = t->begin->epoch;
		x->start = kv_codec__bytes(t->begin->start);
		x->end = kv_codec__bytes(t->begin->end);
		x->from_node = t->begin->from_node;
		x->to_node = t->begin->to_node;
		x->keys = t->begin->keys_total;
		x->bytes = t->begin->bytes_total;
		if (!key_ok(t->begin->start) || !key_ok(t->begin->end) ||
		    kv_range_is_empty(x->start.p, x->start.len, x->end.p, x->end.len)) {
			*why = "bad transfer range";
			return KV_EINVAL;
		}
		return KV_OK;
	case SHARDKV__TRANSFER__MSG_CHUNK: {
		const Shardkv__TransferChunk *c = t->chunk;
		x->kind = KV_XFER_CHUNK;
		x->last = c->last;
		if (c->n_entries > KV_XFER_MAX_RECS || c->n_dedup > KV_XFER_MAX_RECS ||
		    c->n_floors > KV_XFER_MAX_RECS) {
			*why = "chunk too large";
			return KV_ELIMIT;
		}
		if (c->n_entries && (x->kv = calloc(c->n_entries, sizeof(*x->kv))) == NULL)
			return KV_ENOMEM;
		if (c->n_dedup && (x->dedup = calloc(c->n_dedup, sizeof(*x->dedup))) == NULL)
			return KV_ENOMEM;
		if (c->n_expire_at != 0 && c->n_expire_at != c->n_entries) {
			*why = "chunk expiries do not match its entries";
			return KV_EINVAL;
		}
		if (c->packed_entries.len != 0) {
			if (c->n_entries != 0) {
				*why = "chunk with both entries and packed entries";
				return KV_EINVAL;
			}
			if ((rv = unpack_kvs(c->packed_entries.data, c->packed_entries.len, x,
			                     why)) != 0)
				return rv;
			x->packed = true;
		}
		for (size_t i = 0; i < c->n_entries; i++, x->nkv++) {
			if ((rv = decode_kv(c->entries[i], &x->kv[i], why)) != 0)
				return rv;
			x->kv[i].expire_at = c->n_expire_at ? c->expire_at[i] : 0;
		}
		for (size_t i = 0; i < c->n_dedup; i++, x->ndedup++)
			if ((rv = decode_dedup(c->dedup[i], &x->dedup[i])) != 0) {
				*why = "bad dedup entry";
				return rv;
			}
		if (c->n_floors && (x->floors = calloc(c->n_floors, sizeof(*x->floors))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < c->n_floors; i++, x->nfloors++) {
			const Shardkv__ClientFloor *f = c->floors[i];
			if (f == NULL || f->client_id == 0 || f->floor == 0) {
				*why = "bad exactly-once floor";
				return KV_EINVAL;
			}
			x->floors[i] =
			    (kv_xfer_floor){.client_id = f->client_id, .floor = f->floor};
		}
		return KV_OK;
	}
	case SHARDKV__TRANSFER__MSG_DELTA: {
		const Shardkv__TransferDelta *d = t->delta;
		x->kind = KV_XFER_DELTA;
		if (d->n_records > KV_XFER_MAX_RECS) {
			*why = "delta too large";
			return KV_ELIMIT;
		}
		if (d->n_records && (x->delta = calloc(d->n_records, sizeof(*x->delta))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < d->n_records; i++, x->ndelta++) {
			const Shardkv__DeltaRecord *r = d->records[i];
			kv_xfer_delta *o = &x->delta[i];
			kv_xfer_kv kv;
			if (r->op != SHARDKV__DELTA_OP__DELTA_OP_PUT &&
			    r->op != SHARDKV__DELTA_OP__DELTA_OP_DEL) {
				*why = "bad delta op";
				return KV_EINVAL;
			}
			if ((rv = decode_kv(r->kv, &kv, why)) != 0)
				return rv;
			o->seq = r->seq;
			o->del = r->op == SHARDKV__DELTA_OP__DELTA_OP_DEL;
			o->key = kv.key;
			o->value = kv.value;
			o->value_offset = kv.value_offset;
			o->value_total = kv.value_total;
			o->expire_at = o->del ? 0 : r->expire_at;
			if (r->dedup) {
				if ((rv = decode_dedup(r->dedup, &o->dedup)) != 0) {
					*why = "bad dedup entry";
					return rv;
				}
				o->has_dedup = true;
			}
		}
		return KV_OK;
	}
	case SHARDKV__TRANSFER__MSG_FENCE:
		x->kind = KV_XFER_FENCE;
		x->last_write_seq = t->fence->last_write_seq;
		x->keys = t->fence->keys;
		x->bytes = t->fence->bytes;
		return KV_OK;
	case SHARDKV__TRANSFER__MSG_COMMIT:
		x->kind = KV_XFER_COMMIT;
		x->epoch = t->commit->epoch;
		return KV_OK;
	case SHARDKV__TRANSFER__MSG_ABORT:
		x->kind = KV_XFER_ABORT;
		x->reason = kv_err_from_wire(t->abort->reason);
		return KV_OK;
	default:
		*why = "transfer without a message";
		return KV_EINVAL;
	}
}

void
kv_xfer__fini(kv_xfer *x)
{
	if (x == NULL)
		return;
	free(x->kv);
	free(x->dedup);
	free(x->floors);
	free(x->delta);
	memset(x, 0, sizeof(*x));
}

static void
fill_dedup(Shardkv__DedupEntry *d, Shardkv__OpResult *res, const kv_xfer_dedup *s)
{
	Shardkv__DedupEntry dinit = SHARDKV__DEDUP_ENTRY__INIT;
	Shardkv__OpResult rinit = SHARDKV__OP_RESULT__INIT;
	*d = dinit;
	*res = rinit;
	d->client_id = s->client_id;
	d->request_id = s->request_id;
	d->key = kv_codec__pb(s->key);
	d->time_ms = s->time_ms;
	res->status = kv_wire_from_err(s->status);
	res->value_len = s->value_len;
	res->value = kv_codec__pb(s->value);
	d->has_value = s->has_value;
	d->result = res;
}

int
kv_xfer_encode(const kv_xfer *x, uint64_t epoch, uint32_t from_node, kv_bytes auth, nng_msg **out)
{
	Shardkv__Request m = SHARDKV__REQUEST__INIT;
	Shardkv__Transfer t = SHARDKV__TRANSFER__INIT;
	Shardkv__TransferBegin b = SHARDKV__TRANSFER_BEGIN__INIT;
	Shardkv__TransferChunk c = SHARDKV__TRANSFER_CHUNK__INIT;
	Shardkv__TransferDelta d = SHARDKV__TRANSFER_DELTA__INIT;
	Shardkv__TransferFence f = SHARDKV__TRANSFER_FENCE__INIT;
	Shardkv__TransferCommit cm = SHARDKV__TRANSFER_COMMIT__INIT;
	Shardkv__TransferAbort ab = SHARDKV__TRANSFER_ABORT__INIT;
	Shardkv__KeyValue *kvs = NULL, **kvp = NULL;
	Shardkv__DedupEntry *des = NULL, **dep = NULL;
	Shardkv__OpResult *dres = NULL;
	Shardkv__ClientFloor *fls = NULL, **flp = NULL;
	Shardkv__DeltaRecord *recs = NULL, **recp = NULL;
	uint64_t *ats = NULL;
	uint8_t *packed = NULL;
	size_t nd = x->kind == KV_XFER_DELTA ? x->ndelta : x->ndedup;
	int rv = KV_ENOMEM;

	m.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	m.epoch = epoch;
	m.from_node = from_node;
	m.auth_token = kv_codec__pb(auth);
	m.transfer = &t;
	t.migration_id = x->migration_id;
	t.seq = x->seq;
	if (nd) {
		des = calloc(nd, sizeof(*des));
		dep = calloc(nd, sizeof(*dep));
		dres = calloc(nd, sizeof(*dres));
		if (des == NULL || dep == NULL || dres == NULL)
			goto cleanup;
	}
	switch (x->kind) {
	case KV_XFER_BEGIN:
		t.msg_case = SHARDKV__TRANSFER__MSG_BEGIN;
		t.begin = &b;
		b.epoch = x->epoch;
		b.start = kv_codec__pb(x->start);
		b.end = kv_codec__pb(x->end);
		b.from_node = x->from_node;
		b.to_node = x->to_node;
		b.keys_total = x->keys;
		b.bytes_total = x->bytes;
		break;
	case KV_XFER_CHUNK:
		t.msg_case = SHARDKV__TRANSFER__MSG_CHUNK;
		t.chunk = &c;
		c.last = x->last;
		if (x->nkv && x->packed) {
			/* in one field: no message per entry either side */
			size_t n = kvs_packed_size(x->kv, x->nkv);
			if ((packed = malloc(n)) == NULL)
				goto cleanup;
			pack_kvs(x->kv, x->nkv, packed);
			c.packed_entries = (ProtobufCBinaryData){.len = n, .data = packed};
		} else if (x->nkv) {
			Shardkv__KeyValue kinit = SHARDKV__KEY_VALUE__INIT;
			kvs = calloc(x->nkv, sizeof(*kvs));
			kvp = calloc(x->nkv, sizeof(*kvp));
			if (kvs == NULL || kvp == NULL)
				goto cleanup;
			for (size_t i = 0; i < x->nkv; i++) {
				kvs[i] = kinit;
				kvs[i].key = kv_codec__pb(x->kv[i].key);
				kvs[i].value = kv_codec__pb(x->kv[i].value);
				kvs[i].value_offset = x->kv[i].value_offset;
				kvs[i].value_total = x->kv[i].value_total;
				kvp[i] = &kvs[i];
				if (x->kv[i].expire_at != 0 && ats == NULL &&
				    (ats = calloc(x->nkv, sizeof(*ats))) == NULL)
					goto cleanup;
				if (ats != NULL)
					ats[i] = x->kv[i].expire_at;
			}
			c.n_entries = x->nkv;
			c.entries = kvp;
			c.n_expire_at = ats ? x->nkv : 0;
			c.expire_at = ats;
		}
		for (size_t i = 0; i < x->ndedup; i++) {
			fill_dedup(&des[i], &dres[i], &x->dedup[i]);
			dep[i] = &des[i];
		}
		c.n_dedup = x->ndedup;
		c.dedup = dep;
		if (x->nfloors) {
			Shardkv__ClientFloor finit = SHARDKV__CLIENT_FLOOR__INIT;
			fls = calloc(x->nfloors, sizeof(*fls));
			flp = calloc(x->nfloors, sizeof(*flp));
			if (fls == NULL || flp == NULL)
				goto cleanup;
			for (size_t i = 0; i < x->nfloors; i++) {
				fls[i] = finit;
				fls[i].client_id = x->floors[i].client_id;
				fls[i].floor = x->floors[i].floor;
				flp[i] = &fls[i];
			}
			c.n_floors = x->nfloors;
			c.floors = flp;
		}
		break;
	case KV_XFER_DELTA: {
		Shardkv__DeltaRecord rinit = SHARDKV__DELTA_RECORD__INIT;
		Shardkv__KeyValue kinit = SHARDKV__KEY_VALUE__INIT;
		t.msg_case = SHARDKV__TRANSFER__MSG_DELTA;
		t.delta = &d;
		if (x->ndelta) {
			recs = calloc(x->ndelta, sizeof(*recs));
			recp = calloc(x->ndelta, sizeof(*recp));
			kvs = calloc(x->ndelta, sizeof(*kvs));
			if (recs == NULL || recp == NULL || kvs == NULL)
				goto cleanup;
		}
		for (size_t i = 0; i < x->ndelta; i++) {
			const kv_xfer_delta *s = &x->delta[i];
			recs[i] = rinit;
			kvs[i] = kinit;
			recs[i].seq = s->seq;
			recs[i].op = s->del ? SHARDKV__DELTA_OP__DELTA_OP_DEL
			                    : SHARDKV__DELTA_OP__DELTA_OP_PUT;
			kvs[i].key = kv_codec__pb(s->key);
			kvs[i].value = kv_codec__pb(s->value);
			kvs[i].value_offset = s->value_offset;
			kvs[i].value_total = s->value_total;
			recs[i].expire_at = s->del ? 0 : s->expire_at;
			recs[i].kv = &kvs[i];
			if (s->has_dedup) {
				fill_dedup(&des[i], &dres[i], &s->dedup);
				recs[i].dedup = &des[i];
			}
			recp[i] = &recs[i];
		}
		d.n_records = x->ndelta;
		d.records = recp;
		break;
	}
	case KV_XFER_FENCE:
		t.msg_case = SHARDKV__TRANSFER__MSG_FENCE;
		t.fence = &f;
		f.last_write_seq = x->last_write_seq;
		f.keys = x->keys;
		f.bytes = x->bytes;
		break;
	case KV_XFER_COMMIT:
		t.msg_case = SHARDKV__TRANSFER__MSG_COMMIT;
		t.commit = &cm;
		cm.epoch = x->epoch;
		break;
	case KV_XFER_ABORT:
		t.msg_case = SHARDKV__TRANSFER__MSG_ABORT;
		t.abort = &ab;
		ab.reason = kv_wire_from_err(x->reason);
		break;
	}
	rv = kv_codec__pack(&m.base, out);
cleanup:
	free(packed);
	free(ats);
	free(kvs);
	free(kvp);
	free(des);
	free(dep);
	free(dres);
	free(fls);
	free(flp);
	free(recs);
	free(recp);
	return rv;
}

/* Unpacks a server-to-server answer: 0 with *out (the caller frees it with
 * shardkv__response__free_unpacked) when it is OK, else the request's error
 * (KV_EPROTO when it is not a Response). */
static int
peer_response(const void *p, size_t n, Shardkv__Response **out)
{
	Shardkv__Response *r = shardkv__response__unpack(NULL, n, p);
	int rv;

	*out = NULL;
	if (r == NULL)
		return KV_EPROTO;
	if (r->status != SHARDKV__STATUS__STATUS_OK) {
		rv = kv_err_from_wire(r->status);
		shardkv__response__free_unpacked(r, NULL);
		return rv;
	}
	*out = r;
	return KV_OK;
}

int
kv_xfer_ack_decode(const void *p, size_t n, kv_xfer_ack *ack)
{
	Shardkv__Response *r;
	int rv;

	memset(ack, 0, sizeof(*ack));
	if ((rv = peer_response(p, n, &r)) != KV_OK)
		return rv;
	if (r->transfer_ack == NULL) {
		rv = KV_EPROTO;
	} else {
		ack->migration_id = r->transfer_ack->migration_id;
		ack->status = kv_err_from_wire(r->transfer_ack->status);
		ack->seq = r->transfer_ack->seq;
		ack->keys = r->transfer_ack->keys;
		ack->bytes = r->transfer_ack->bytes;
		ack->packed_ok = r->transfer_ack->packed_entries;
		ack->committed = r->transfer_ack->committed;
	}
	shardkv__response__free_unpacked(r, NULL);
	return rv;
}

/* ------------------------------------------------------------------------
 * Replication (repl_codec.h)
 * ------------------------------------------------------------------------ */

/* Replicate.packed_records: per record, lsn, leader epoch (8 bytes each),
 * the start key's and the payload's lengths (4 bytes each), big-endian,
 * then the two. */
#define PACKED_HEAD 24u

/* Bytes of r's records packed. */
static size_t
packed_size(const kv_repl_msg *r)
{
	size_t n = 0;

	for (size_t i = 0; i < r->nrecs; i++)
		n += PACKED_HEAD + r->recs[i].start.len + r->recs[i].payload.len;
	return n;
}

static void
pack_recs(const kv_repl_msg *r, uint8_t *p)
{
	for (size_t i = 0; i < r->nrecs; i++) {
		const kv_repl_rec *x = &r->recs[i];
		kv_put64be(p, x->lsn);
		kv_put64be(p + 8, x->leader_epoch);
		kv_put32be(p + 16, (uint32_t)x->start.len);
		kv_put32be(p + 20, (uint32_t)x->payload.len);
		p += PACKED_HEAD;
		if (x->start.len)
			memcpy(p, x->start.p, x->start.len);
		p += x->start.len;
		if (x->payload.len)
			memcpy(p, x->payload.p, x->payload.len);
		p += x->payload.len;
	}
}

/* The records packed in p[0..n) into r->recs, pointing into p: checked
 * whole first (the limits of ReplRecord, lsns strictly increasing), then
 * taken. */
static int
unpack_recs(const uint8_t *p, size_t n, kv_repl_msg *r, const char **why)
{
	size_t cnt = 0, off = 0;
	uint64_t prev = 0;

	while (off < n) {
		if (n - off < PACKED_HEAD) {
			*why = "packed replicated records cut short";
			return KV_EINVAL;
		}
		uint64_t lsn = kv_get64be(p + off);
		size_t sl = kv_get32be(p + off + 16), pl = kv_get32be(p + off + 20);
		off += PACKED_HEAD;
		if (lsn == 0 || pl == 0 || pl > KV_REPL_MAX_PAYLOAD || sl > KV_HARD_MAX_KEY ||
		    sl + pl > n - off) {
			*why = "bad replicated record (lsn, payload or start key)";
			return KV_EINVAL;
		}
		if (cnt > 0 && lsn <= prev) {
			*why = "replicated records out of lsn order";
			return KV_EINVAL;
		}
		if (++cnt > KV_REPL_MAX_RECS) {
			*why = "too many records in one replicate";
			return KV_ELIMIT;
		}
		prev = lsn;
		off += sl + pl;
	}
	if ((r->recs = calloc(cnt, sizeof(*r->recs))) == NULL)
		return KV_ENOMEM;
	for (off = 0; r->nrecs < cnt; r->nrecs++) {
		kv_repl_rec *x = &r->recs[r->nrecs];
		size_t sl = kv_get32be(p + off + 16), pl = kv_get32be(p + off + 20);
		x->lsn = kv_get64be(p + off);
		x->leader_epoch = kv_get64be(p + off + 8);
		off += PACKED_HEAD;
		x->start = (kv_bytes){sl ? p + off : NULL, sl};
		x->payload = (kv_bytes){p + off + sl, pl};
		off += sl + pl;
	}
	return KV_OK;
}

int
kv_repl__from_pb(const Shardkv__Replicate *m, kv_repl_msg *r, const char **why)
{
	memset(r, 0, sizeof(*r));
	if (m->from_node == 0 || m->stream_id == 0 || m->seq == 0) {
		*why = "replicate without from_node, stream_id or seq";
		return KV_EINVAL;
	}
	if (m->n_records > KV_REPL_MAX_RECS) {
		*why = "too many records in one replicate";
		return KV_ELIMIT;
	}
	r->from_node = m->from_node;
	r->stream_id = m->stream_id;
	r->seq = m->seq;
	r->commit_lsn = m->commit_lsn;
	r->breaks = m->breaks;
	if ((m->copy != NULL) + (m->end != NULL) + (m->n_records != 0) +
	        (m->packed_records.len != 0) >
	    1) {
		*why = "replicate with more than one of records, packed records, copy and end";
		return KV_EINVAL;
	}
	if (m->end != NULL) {
		if (m->end->start_key.len > KV_HARD_MAX_KEY ||
		    m->end->end_key.len > KV_HARD_MAX_KEY || m->end->old_primary == 0) {
			*why = "bad replicate end (start key or old primary)";
			return KV_EINVAL;
		}
		r->end = (kv_repl_end){.set = true,
		                       .leader_epoch = m->end->leader_epoch,
		                       .start = kv_codec__bytes(m->end->start_key),
		                       .old_primary = m->end->old_primary,
		                       .end_lsn = m->end->end_lsn,
		                       .next_lsn = m->end->next_lsn,
		                       .end = kv_codec__bytes(m->end->end_key)};
		return KV_OK;
	}
	if (m->copy != NULL) {
		const Shardkv__ReplCopy *c = m->copy;
		if (c->start_key.len > KV_HARD_MAX_KEY || c->end_key.len > KV_HARD_MAX_KEY) {
			*why = "bad replicate copy (range bounds)";
			return KV_EINVAL;
		}
		if (c->n_records > KV_REPL_MAX_RECS) {
			*why = "too many records in one copy step";
			return KV_ELIMIT;
		}
		r->copy = (kv_repl_copy){.set = true,
		                         .leader_epoch = c->leader_epoch,
		                         .start = kv_codec__bytes(c->start_key),
		                         .end = kv_codec__bytes(c->end_key),
		                         .first = c->first,
		                         .last = c->last,
		                         .catchup = c->catchup,
		                         .from_lsn = c->from_lsn,
		                         .next_lsn = c->next_lsn,
		                         .old_primary = c->old_primary,
		                         .old_epoch = c->old_epoch,
		                         .old_boot = c->old_boot,
		                         .old_end = c->old_end,
		                         .old_at = c->old_at};
		if (c->n_records == 0)
			return KV_OK;
		if ((r->copy.recs = calloc(c->n_records, sizeof(*r->copy.recs))) == NULL)
			return KV_ENOMEM;
		for (size_t i = 0; i < c->n_records; i++) {
			if (c->records[i].len == 0 || c->records[i].len > KV_REPL_MAX_PAYLOAD) {
				*why = "bad copy record (empty or too large)";
				return KV_EINVAL;
			}
			r->copy.recs[i] = kv_codec__bytes(c->records[i]);
			r->copy.nrecs++;
		}
		return KV_OK;
	}
	if (m->packed_records.len != 0)
		return unpack_recs(m->packed_records.data, m->packed_records.len, r, why);
	if (m->n_records == 0)
		return KV_OK;
	if ((r->recs = calloc(m->n_records, sizeof(*r->recs))) == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < m->n_records; i++) {
		const Shardkv__ReplRecord *x = m->records[i];
		if (x == NULL || x->lsn == 0 || x->payload.len == 0 ||
		    x->payload.len > KV_REPL_MAX_PAYLOAD || x->start_key.len > KV_HARD_MAX_KEY) {
			*why = "bad replicated record (lsn, payload or start key)";
			return KV_EINVAL;
		}
		if (i > 0 && x->lsn <= r->recs[i - 1].lsn) {
			*why = "replicated records out of lsn order";
			return KV_EINVAL;
		}
		r->recs[i] = (kv_repl_rec){.leader_epoch = x->leader_epoch,
		                           .lsn = x->lsn,
		                           .start = kv_codec__bytes(x->start_key),
		                           .payload = kv_codec__bytes(x->payload)};
		r->nrecs++;
	}
	return KV_OK;
}

void
kv_repl__fini(kv_repl_msg *r)
{
	free(r->recs);
	r->recs = NULL;
	r->nrecs = 0;
	free(r->copy.recs);
	r->copy.recs = NULL;
	r->copy.nrecs = 0;
}

int
kv_repl_encode(const kv_repl_msg *r, uint64_t epoch, uint32_t from_node, kv_bytes auth,
               nng_msg **out)
{
	Shardkv__Request m = SHARDKV__REQUEST__INIT;
	Shardkv__Replicate rp = SHARDKV__REPLICATE__INIT;
	Shardkv__ReplCopy cp = SHARDKV__REPL_COPY__INIT;
	Shardkv__ReplEnd en = SHARDKV__REPL_END__INIT;
	Shardkv__ReplRecord *recs = NULL, **recp = NULL;
	uint8_t *packed = NULL;
	ProtobufCBinaryData *cr = NULL;
	int rv = KV_ENOMEM;

	if (r->copy.set) {
		if (r->copy.nrecs && (cr = calloc(r->copy.nrecs, sizeof(*cr))) == NULL)
			goto out;
		for (size_t i = 0; i < r->copy.nrecs; i++)
			cr[i] = kv_codec__pb(r->copy.recs[i]);
		cp.leader_epoch = r->copy.leader_epoch;
		cp.start_key = kv_codec__pb(r->copy.start);
		cp.end_key = kv_codec__pb(r->copy.end);
		cp.first = r->copy.first;
		cp.last = r->copy.last;
		cp.catchup = r->copy.catchup;
		cp.from_lsn = r->copy.from_lsn;
		cp.next_lsn = r->copy.next_lsn;
		cp.old_primary = r->copy.old_primary;
		cp.old_epoch = r->copy.old_epoch;
		cp.old_boot = r->copy.old_boot;
		cp.old_end = r->copy.old_end;
		cp.old_at = r->copy.old_at;
		cp.n_records = r->copy.nrecs;
		cp.records = cr;
		rp.copy = &cp;
	}
	if (r->end.set) {
		en.leader_epoch = r->end.leader_epoch;
		en.start_key = kv_codec__pb(r->end.start);
		en.old_primary = r->end.old_primary;
		en.end_lsn = r->end.end_lsn;
		en.next_lsn = r->end.next_lsn;
		en.end_key = kv_codec__pb(r->end.end);
		rp.end = &en;
	}
	if (r->nrecs && r->packed) {
		/* in one field: no message per record either side */
		size_t n = packed_size(r);
		if ((packed = malloc(n)) == NULL)
			goto out;
		pack_recs(r, packed);
		rp.packed_records = (ProtobufCBinaryData){.len = n, .data = packed};
	} else if (r->nrecs) {
		recs = calloc(r->nrecs, sizeof(*recs));
		recp = calloc(r->nrecs, sizeof(*recp));
		if (recs == NULL || recp == NULL)
			goto out;
		for (size_t i = 0; i < r->nrecs; i++) {
			shardkv__repl_record__init(&recs[i]);
			recs[i].leader_epoch = r->recs[i].leader_epoch;
			recs[i].lsn = r->recs[i].lsn;
			recs[i].start_key = kv_codec__pb(r->recs[i].start);
			recs[i].payload = kv_codec__pb(r->recs[i].payload);
			recp[i] = &recs[i];
		}
		rp.n_records = r->nrecs;
		rp.records = recp;
	}
	rp.from_node = r->from_node;
	rp.stream_id = r->stream_id;
	rp.seq = r->seq;
	rp.commit_lsn = r->commit_lsn;
	rp.breaks = r->breaks;
	m.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	m.epoch = epoch;
	m.from_node = from_node;
	m.auth_token = kv_codec__pb(auth);
	m.replicate = &rp;
	rv = kv_codec__pack(&m.base, out);
out:
	free(recs);
	free(recp);
	free(packed);
	free(cr);
	return rv;
}

int
kv_repl_ack_decode(const void *p, size_t n, kv_repl_ack *ack)
{
	return kv_repl_ack_decode_detail(p, n, ack, NULL, 0);
}

int
kv_repl_ack_decode_detail(const void *p, size_t n, kv_repl_ack *ack, char *detail, size_t cap)
{
	Shardkv__Response *r;
	int rv;

	memset(ack, 0, sizeof(*ack));
	if (cap > 0)
		detail[0] = '\0';
	if ((rv = peer_response(p, n, &r)) != KV_OK)
		return rv;
	if (r->replicate_ack == NULL) {
		rv = KV_EPROTO;
	} else {
		ack->acked_seq = r->replicate_ack->acked_seq;
		ack->acked_lsn = r->replicate_ack->acked_lsn;
		ack->status = kv_err_from_wire(r->replicate_ack->status);
		ack->diverged = r->replicate_ack->diverged;
		ack->caught_up = r->replicate_ack->caught_up;
		ack->position = r->replicate_ack->position;
		ack->packed_ok = r->replicate_ack->packed_records;
		if (cap > 0 && r->replicate_ack->error != NULL)
			snprintf(detail, cap, "%s", r->replicate_ack->error);
	}
	shardkv__response__free_unpacked(r, NULL);
	return rv;
}
