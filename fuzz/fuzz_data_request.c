/*
 * fuzz_data_request.c - the Request decoder (proto/data_codec.h): the bytes
 * of a Request as a client (ops) or a peer server (range transfer) sends
 * them, through kv_data_req_decode. What decodes is encoded again
 * (kv_data_req_encode for ops the encoder can state, kv_xfer_encode for a
 * transfer) and decoded once more: both decodings must agree.
 */
#include "common/err.h"
#include "fuzz/fuzz_util.h"
#include "proto/data_codec.h"
#include "proto/xfer_codec.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int
bytes_eq(kv_bytes a, kv_bytes b)
{
	return a.len == b.len && (a.len == 0 || memcmp(a.p, b.p, a.len) == 0);
}

static void
dedup_eq(const kv_xfer_dedup *a, const kv_xfer_dedup *b)
{
	FZ_CHECK(a->client_id == b->client_id && a->request_id == b->request_id);
	FZ_CHECK(a->status == b->status && a->value_len == b->value_len);
	FZ_CHECK(a->time_ms == b->time_ms);
	FZ_CHECK(bytes_eq(a->key, b->key) && bytes_eq(a->value, b->value));
}

static void
xfer_eq(const kv_xfer *a, const kv_xfer *b)
{
	FZ_CHECK(a->migration_id == b->migration_id && a->seq == b->seq && a->kind == b->kind);
	switch (a->kind) {
	case KV_XFER_BEGIN:
		FZ_CHECK(a->epoch == b->epoch && a->from_node == b->from_node &&
		         a->to_node == b->to_node && a->keys == b->keys && a->bytes == b->bytes);
		FZ_CHECK(bytes_eq(a->start, b->start) && bytes_eq(a->end, b->end));
		break;
	case KV_XFER_CHUNK:
		FZ_CHECK(a->last == b->last && a->nkv == b->nkv && a->ndedup == b->ndedup);
		for (size_t i = 0; i < a->nkv; i++) {
			FZ_CHECK(bytes_eq(a->kv[i].key, b->kv[i].key));
			FZ_CHECK(bytes_eq(a->kv[i].value, b->kv[i].value));
			FZ_CHECK(a->kv[i].value_offset == b->kv[i].value_offset);
			FZ_CHECK(a->kv[i].value_total == b->kv[i].value_total);
		}
		for (size_t i = 0; i < a->ndedup; i++)
			dedup_eq(&a->dedup[i], &b->dedup[i]);
		break;
	case KV_XFER_DELTA:
		FZ_CHECK(a->ndelta == b->ndelta);
		for (size_t i = 0; i < a->ndelta; i++) {
			const kv_xfer_delta *x = &a->delta[i], *y = &b->delta[i];
			FZ_CHECK(x->seq == y->seq && x->del == y->del);
			FZ_CHECK(bytes_eq(x->key, y->key) && bytes_eq(x->value, y->value));
			FZ_CHECK(x->value_offset == y->value_offset);
			FZ_CHECK(x->value_total == y->value_total);
			FZ_CHECK(x->has_dedup == y->has_dedup);
			if (x->has_dedup)
				dedup_eq(&x->dedup, &y->dedup);
		}
		break;
	case KV_XFER_FENCE:
		FZ_CHECK(a->last_write_seq == b->last_write_seq && a->keys == b->keys &&
		         a->bytes == b->bytes);
		break;
	case KV_XFER_COMMIT:
		FZ_CHECK(a->epoch == b->epoch);
		break;
	case KV_XFER_ABORT:
		FZ_CHECK(a->reason == b->reason);
		break;
	}
}

/* A transfer entry as xfer_codec.h promises it to migrate_in.c. */
static void
check_kv(kv_bytes key, kv_bytes value, uint64_t offset, uint64_t total)
{
	FZ_CHECK(key.len >= 1 && key.len <= KV_HARD_MAX_KEY);
	FZ_CHECK(value.len <= KV_HARD_MAX_VALUE);
	if (total == 0) {
		FZ_CHECK(offset == 0);
	} else {
		FZ_CHECK(total <= KV_HARD_MAX_VALUE && value.len >= 1);
		FZ_CHECK(offset <= total && value.len <= total - offset);
	}
	fz_touch(key.p, key.len);
	fz_touch(value.p, value.len);
}

static void
check_dedup(const kv_xfer_dedup *d)
{
	FZ_CHECK(d->client_id != 0 && d->request_id != 0 && d->key.len <= KV_HARD_MAX_KEY);
	fz_touch(d->key.p, d->key.len);
	fz_touch(d->value.p, d->value.len);
}

static void
check_xfer(const kv_xfer *x)
{
	FZ_CHECK(x->migration_id != 0 && x->seq != 0);
	switch (x->kind) {
	case KV_XFER_BEGIN:
		FZ_CHECK(x->start.len <= KV_HARD_MAX_KEY && x->end.len <= KV_HARD_MAX_KEY);
		FZ_CHECK(!kv_range_is_empty(x->start.p, x->start.len, x->end.p, x->end.len));
		break;
	case KV_XFER_CHUNK:
		FZ_CHECK(x->nkv <= KV_XFER_MAX_RECS && x->ndedup <= KV_XFER_MAX_RECS);
		for (size_t i = 0; i < x->nkv; i++)
			check_kv(x->kv[i].key, x->kv[i].value, x->kv[i].value_offset,
			         x->kv[i].value_total);
		for (size_t i = 0; i < x->ndedup; i++)
			check_dedup(&x->dedup[i]);
		break;
	case KV_XFER_DELTA:
		FZ_CHECK(x->ndelta <= KV_XFER_MAX_RECS);
		for (size_t i = 0; i < x->ndelta; i++) {
			const kv_xfer_delta *d = &x->delta[i];
			check_kv(d->key, d->value, d->value_offset, d->value_total);
			if (d->has_dedup)
				check_dedup(&d->dedup);
		}
		break;
	case KV_XFER_FENCE:
	case KV_XFER_COMMIT:
	case KV_XFER_ABORT:
		break;
	default:
		FZ_CHECK(!"unknown transfer kind");
	}
}

/* Two decodings of the same ops. */
static void
ops_eq(const kv_req *a, const kv_req *b)
{
	FZ_CHECK(a->client_id == b->client_id && a->request_id == b->request_id &&
	         a->epoch == b->epoch && a->from_node == b->from_node &&
	         a->timeout_ms == b->timeout_ms && a->nops == b->nops && !b->has_xfer);
	FZ_CHECK(bytes_eq(a->auth, b->auth));
	for (size_t i = 0; i < a->nops; i++) {
		const kv_op *x = &a->ops[i], *y = &b->ops[i];
		FZ_CHECK(x->kind == y->kind && x->request_id == y->request_id &&
		         x->nkeys == y->nkeys && x->nvals == y->nvals && x->limit == y->limit &&
		         x->keys_only == y->keys_only && x->max_bytes == y->max_bytes);
		if (x->kind == KV_OP_DEL)
			FZ_CHECK(x->no_value == y->no_value);
		FZ_CHECK(bytes_eq(x->key, y->key));
		FZ_CHECK(bytes_eq(x->value, y->value));
		FZ_CHECK(bytes_eq(x->start, y->start));
		FZ_CHECK(bytes_eq(x->end, y->end));
		FZ_CHECK(bytes_eq(x->prefix, y->prefix));
		FZ_CHECK(bytes_eq(x->cursor, y->cursor));
		for (size_t k = 0; k < x->nkeys; k++)
			FZ_CHECK(bytes_eq(x->keys[k], y->keys[k]));
		for (size_t k = 0; k < x->nvals; k++)
			FZ_CHECK(bytes_eq(x->vals[k], y->vals[k]));
	}
}

/* What the dispatcher relies on after a successful decode. */
static void
check_ops(const kv_req *r)
{
	FZ_CHECK(r->nops <= KV_DATA_MAX_OPS);
	for (size_t i = 0; i < r->nops; i++) {
		const kv_op *op = &r->ops[i];
		FZ_CHECK(op->kind >= KV_OP_GET && op->kind < KV_OP__COUNT);
		if (op->kind == KV_OP_MGET || op->kind == KV_OP_MPUT) {
			FZ_CHECK(op->nkeys <= KV_DATA_MAX_MULTI && op->nvals <= KV_DATA_MAX_MULTI);
			for (size_t k = 0; k < op->nkeys; k++)
				FZ_CHECK(op->keys[k].len == 0 || op->keys[k].p != NULL);
		}
		if (op->kind == KV_OP_SCAN)
			FZ_CHECK(op->start.len <= KV_HARD_MAX_KEY &&
			         op->end.len <= KV_HARD_MAX_KEY &&
			         op->prefix.len <= KV_HARD_MAX_KEY);
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kv_req r, r2;
	const char *why = NULL;
	nng_msg *m = NULL;
	int rv;

	rv = kv_data_req_decode(data, size, &r, &why);
	if (rv != KV_OK) {
		FZ_CHECK(why != NULL || rv == KV_ENOMEM);
		kv_data_req_fini(&r);
		return 0;
	}
	check_ops(&r);
	if (!r.has_xfer && kv_data_req_encode(&r, &m) == KV_OK) {
		rv = kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &r2, &why);
		FZ_CHECK(rv == KV_OK);
		ops_eq(&r, &r2);
		kv_data_req_fini(&r2);
		nng_msg_free(m);
	}
	if (r.has_xfer) {
		FZ_CHECK(r.nops == 0);
		check_xfer(&r.xfer);
		FZ_CHECK(kv_xfer_encode(&r.xfer, r.epoch, r.from_node, r.auth, &m) == KV_OK);
		rv = kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &r2, &why);
		FZ_CHECK(rv == KV_OK);
		FZ_CHECK(r2.has_xfer && r2.epoch == r.epoch && r2.from_node == r.from_node);
		xfer_eq(&r.xfer, &r2.xfer);
		kv_data_req_fini(&r2);
		nng_msg_free(m);
	}
	kv_data_req_fini(&r);
	return 0;
}
