/*
 * test_wire.c - the wire schema and the wire <-> KV_E* status translation.
 *
 * Status codes are enumerated from their own tables (KV_ERR_MAP and the
 * generated Status descriptor), so a code added on either side without its
 * counterpart fails here. Messages are checked by packing, unpacking and
 * packing again: equal bytes mean nothing was lost or reordered.
 */
#include "common/err.h"
#include "proto/shardkv.pb-c.h"
#include "proto/wire.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Every KV_E* code of common/err.h, from its own table. */
#define KV__ERR_VALUE(name, value, msg) KV_E##name,
static const int all_errs[] = {KV_OK, KV_ERR_MAP(KV__ERR_VALUE)};
#undef KV__ERR_VALUE

static bool
is_wire_status(int status)
{
	return protobuf_c_enum_descriptor_get_value(&shardkv__status__descriptor, status) != NULL;
}

static ProtobufCBinaryData
bin(const char *s, size_t len)
{
	ProtobufCBinaryData b = {.len = len, .data = (uint8_t *)s};
	return b;
}

static void
assert_bin_equal(ProtobufCBinaryData a, ProtobufCBinaryData b)
{
	assert_int_equal(a.len, b.len);
	if (a.len > 0)
		assert_memory_equal(a.data, b.data, a.len);
}

/*
 * Packs `msg` into a heap buffer. The caller frees *out with free().
 */
static size_t
pack_message(const ProtobufCMessage *msg, uint8_t **out)
{
	size_t len = protobuf_c_message_get_packed_size(msg);
	uint8_t *buf = malloc(len ? len : 1);
	assert_non_null(buf);
	assert_int_equal(protobuf_c_message_pack(msg, buf), len);
	*out = buf;
	return len;
}

/*
 * Unpacks `len` bytes as `desc`, packs the result again and checks the bytes
 * are the same. Returns the unpacked message; the caller frees it with
 * protobuf_c_message_free_unpacked().
 */
static ProtobufCMessage *
unpack_and_repack(const ProtobufCMessageDescriptor *desc, const uint8_t *buf, size_t len)
{
	ProtobufCMessage *msg = protobuf_c_message_unpack(desc, NULL, len, buf);
	assert_non_null(msg);
	uint8_t *again = NULL;
	size_t again_len = pack_message(msg, &again);
	assert_int_equal(again_len, len);
	assert_memory_equal(again, buf, len);
	free(again);
	return msg;
}

static void
every_kv_error_round_trips_through_its_own_wire_status(void **state)
{
	(void)state;
	int seen[64] = {0};

	for (size_t i = 0; i < ARRAY_LEN(all_errs); i++) {
		int err = all_errs[i];
		int status = kv_wire_from_err(err);

		assert_true(is_wire_status(status));
		assert_int_equal(kv_err_from_wire(status), err);
		/* Only KV_EINTERNAL itself may leave as STATUS_INTERNAL. */
		if (err != KV_EINTERNAL)
			assert_int_not_equal(status, SHARDKV__STATUS__STATUS_INTERNAL);
		assert_in_range(status, 0, ARRAY_LEN(seen) - 1);
		assert_int_equal(seen[status]++, 0);
	}
}

/*
 * The mapping stated a second time, independently of proto/wire.c, so that two
 * swapped rows (which would still round-trip) are caught.
 */
static void
each_kv_error_maps_to_the_wire_status_of_the_same_meaning(void **state)
{
	(void)state;
	static const struct {
		int err;
		int status;
	} pairs[] = {
	    {KV_OK, SHARDKV__STATUS__STATUS_OK},
	    {KV_ENOTFOUND, SHARDKV__STATUS__STATUS_NOT_FOUND},
	    {KV_EINVAL, SHARDKV__STATUS__STATUS_INVALID},
	    {KV_ENOMEM, SHARDKV__STATUS__STATUS_NO_MEMORY},
	    {KV_ETOOBIG, SHARDKV__STATUS__STATUS_TOO_BIG},
	    {KV_EWRONGOWNER, SHARDKV__STATUS__STATUS_WRONG_OWNER},
	    {KV_ESTALE, SHARDKV__STATUS__STATUS_STALE_EPOCH},
	    {KV_ETIMEDOUT, SHARDKV__STATUS__STATUS_TIMED_OUT},
	    {KV_EUNAVAIL, SHARDKV__STATUS__STATUS_UNAVAILABLE},
	    {KV_EEXISTS, SHARDKV__STATUS__STATUS_EXISTS},
	    {KV_EIO, SHARDKV__STATUS__STATUS_IO_ERROR},
	    {KV_ECORRUPT, SHARDKV__STATUS__STATUS_CORRUPT},
	    {KV_EPROTO, SHARDKV__STATUS__STATUS_PROTOCOL_ERROR},
	    {KV_EAUTH, SHARDKV__STATUS__STATUS_AUTH_FAILED},
	    {KV_ECLOSED, SHARDKV__STATUS__STATUS_CLOSED},
	    {KV_EBUSY, SHARDKV__STATUS__STATUS_BUSY},
	    {KV_EMOVING, SHARDKV__STATUS__STATUS_MOVING},
	    {KV_EPERM, SHARDKV__STATUS__STATUS_PERMISSION},
	    {KV_ENOSPC, SHARDKV__STATUS__STATUS_NO_SPACE},
	    {KV_ELIMIT, SHARDKV__STATUS__STATUS_LIMIT},
	    {KV_EADDRINUSE, SHARDKV__STATUS__STATUS_ADDR_IN_USE},
	    {KV_EINTERNAL, SHARDKV__STATUS__STATUS_INTERNAL},
	    {KV_EMISMATCH, SHARDKV__STATUS__STATUS_MISMATCH},
	};

	assert_int_equal(ARRAY_LEN(pairs), ARRAY_LEN(all_errs));
	for (size_t i = 0; i < ARRAY_LEN(pairs); i++) {
		assert_int_equal(kv_wire_from_err(pairs[i].err), pairs[i].status);
		assert_int_equal(kv_err_from_wire(pairs[i].status), pairs[i].err);
	}
}

static void
every_wire_status_except_not_leader_round_trips_through_kv_error(void **state)
{
	(void)state;
	const ProtobufCEnumDescriptor *d = &shardkv__status__descriptor;

	assert_true(d->n_values > 0);
	for (unsigned i = 0; i < d->n_values; i++) {
		int status = d->values[i].value;
		int err = kv_err_from_wire(status);

		/* Every status reads as a code of the table, never as an unknown one. */
		assert_string_not_equal(kv_errname(err), "EUNKNOWN");
		if (status == SHARDKV__STATUS__STATUS_NOT_LEADER)
			continue;
		assert_int_equal(kv_wire_from_err(err), status);
	}
}

static void
not_leader_status_reads_as_eunavail(void **state)
{
	(void)state;
	assert_int_equal(kv_err_from_wire(SHARDKV__STATUS__STATUS_NOT_LEADER), KV_EUNAVAIL);
}

static void
unknown_wire_status_reads_as_eproto(void **state)
{
	(void)state;
	assert_int_equal(kv_err_from_wire(-1), KV_EPROTO);
	assert_int_equal(kv_err_from_wire(1000), KV_EPROTO);
}

static void
unknown_kv_error_leaves_as_internal_status(void **state)
{
	(void)state;
	assert_int_equal(kv_wire_from_err(1), SHARDKV__STATUS__STATUS_INTERNAL);
	assert_int_equal(kv_wire_from_err(KV_ERR_MIN - 1), SHARDKV__STATUS__STATUS_INTERNAL);
}

/* The keys and values of the mixed batch; the binary ones hold NUL and 0xff bytes. */
static const char key_a[] = "user:\0\xff:a";
static const char val_a[] = "value\0with\0nuls";

static void
request_with_mixed_op_batch_packs_and_unpacks_identically(void **state)
{
	(void)state;
	Shardkv__GetOp get = SHARDKV__GET_OP__INIT;
	get.key = bin(key_a, sizeof(key_a) - 1);

	Shardkv__PutOp put = SHARDKV__PUT_OP__INIT;
	put.key = bin("k1", 2);
	put.value = bin(val_a, sizeof(val_a) - 1);

	Shardkv__DelOp del = SHARDKV__DEL_OP__INIT;
	del.key = bin("k2", 2);
	del.no_value = 1;

	Shardkv__AppendOp append = SHARDKV__APPEND_OP__INIT;
	append.key = bin("log", 3);
	append.value = bin("", 0);

	ProtobufCBinaryData mget_keys[] = {bin("a", 1), bin(key_a, sizeof(key_a) - 1), bin("a", 1)};
	Shardkv__MGetOp mget = SHARDKV__MGET_OP__INIT;
	mget.n_keys = ARRAY_LEN(mget_keys);
	mget.keys = mget_keys;

	ProtobufCBinaryData mput_keys[] = {bin("x", 1), bin("y", 1)};
	ProtobufCBinaryData mput_vals[] = {bin("1", 1), bin("", 0)};
	Shardkv__MPutOp mput = SHARDKV__MPUT_OP__INIT;
	mput.n_keys = ARRAY_LEN(mput_keys);
	mput.keys = mput_keys;
	mput.n_values = ARRAY_LEN(mput_vals);
	mput.values = mput_vals;

	Shardkv__ScanOp scan = SHARDKV__SCAN_OP__INIT;
	scan.start = bin("b", 1);
	scan.end = bin("", 0);
	scan.limit = 100;
	scan.keys_only = 1;
	scan.prefix = bin("b/", 2);
	scan.cursor = bin("b/7\0", 4);
	scan.max_bytes = 1 << 20;

	Shardkv__Op ops[7];
	for (size_t i = 0; i < ARRAY_LEN(ops); i++) {
		shardkv__op__init(&ops[i]);
		ops[i].request_id = 1000 + i;
	}
	ops[0].op_case = SHARDKV__OP__OP_GET;
	ops[0].get = &get;
	ops[1].op_case = SHARDKV__OP__OP_PUT;
	ops[1].put = &put;
	ops[2].op_case = SHARDKV__OP__OP_DEL;
	ops[2].del = &del;
	ops[3].op_case = SHARDKV__OP__OP_APPEND;
	ops[3].append = &append;
	ops[4].op_case = SHARDKV__OP__OP_MGET;
	ops[4].mget = &mget;
	ops[5].op_case = SHARDKV__OP__OP_MPUT;
	ops[5].mput = &mput;
	ops[6].op_case = SHARDKV__OP__OP_SCAN;
	ops[6].scan = &scan;
	Shardkv__Op *op_ptrs[ARRAY_LEN(ops)];
	for (size_t i = 0; i < ARRAY_LEN(ops); i++)
		op_ptrs[i] = &ops[i];

	Shardkv__Request req = SHARDKV__REQUEST__INIT;
	req.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	req.client_id = UINT64_C(0xfeedfacecafebeef);
	req.request_id = 42;
	req.epoch = 7;
	req.auth_token = bin("secret", 6);
	req.timeout_ms = 2500;
	req.n_ops = ARRAY_LEN(op_ptrs);
	req.ops = op_ptrs;

	uint8_t *buf = NULL;
	size_t len = pack_message(&req.base, &buf);
	Shardkv__Request *got =
	    (Shardkv__Request *)unpack_and_repack(&shardkv__request__descriptor, buf, len);

	assert_int_equal(got->version, SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1);
	assert_true(got->client_id == req.client_id);
	assert_int_equal(got->request_id, 42);
	assert_int_equal(got->epoch, 7);
	assert_int_equal(got->timeout_ms, 2500);
	assert_bin_equal(got->auth_token, req.auth_token);
	assert_null(got->transfer);
	assert_int_equal(got->n_ops, ARRAY_LEN(ops));
	for (size_t i = 0; i < ARRAY_LEN(ops); i++) {
		assert_int_equal(got->ops[i]->request_id, 1000 + i);
		assert_int_equal(got->ops[i]->op_case, ops[i].op_case);
	}
	assert_bin_equal(got->ops[0]->get->key, get.key);
	assert_bin_equal(got->ops[1]->put->key, put.key);
	assert_bin_equal(got->ops[1]->put->value, put.value);
	assert_bin_equal(got->ops[2]->del->key, del.key);
	assert_true(got->ops[2]->del->no_value);
	assert_bin_equal(got->ops[3]->append->value, append.value);
	assert_int_equal(got->ops[4]->mget->n_keys, ARRAY_LEN(mget_keys));
	for (size_t i = 0; i < ARRAY_LEN(mget_keys); i++)
		assert_bin_equal(got->ops[4]->mget->keys[i], mget_keys[i]);
	assert_int_equal(got->ops[5]->mput->n_keys, ARRAY_LEN(mput_keys));
	assert_int_equal(got->ops[5]->mput->n_values, ARRAY_LEN(mput_vals));
	for (size_t i = 0; i < ARRAY_LEN(mput_keys); i++) {
		assert_bin_equal(got->ops[5]->mput->keys[i], mput_keys[i]);
		assert_bin_equal(got->ops[5]->mput->values[i], mput_vals[i]);
	}
	const Shardkv__ScanOp *s = got->ops[6]->scan;
	assert_bin_equal(s->start, scan.start);
	assert_int_equal(s->end.len, 0);
	assert_int_equal(s->limit, 100);
	assert_true(s->keys_only);
	assert_bin_equal(s->prefix, scan.prefix);
	assert_bin_equal(s->cursor, scan.cursor);
	assert_int_equal(s->max_bytes, 1 << 20);

	shardkv__request__free_unpacked(got, NULL);
	free(buf);
}

static void
response_with_owner_hint_and_mget_misses_round_trips(void **state)
{
	(void)state;
	Shardkv__OwnerHint hint = SHARDKV__OWNER_HINT__INIT;
	hint.epoch = 9;
	hint.start = bin("m", 1);
	hint.node_id = 3;
	hint.address = "tcp://127.0.0.1:7103";

	Shardkv__OpResult moved = SHARDKV__OP_RESULT__INIT;
	moved.status = kv_wire_from_err(KV_EWRONGOWNER);
	moved.owner = &hint;
	moved.error = "key owned by node 3";

	ProtobufCBinaryData values[] = {bin("v0", 2), bin("", 0)};
	uint32_t missing[] = {1};
	Shardkv__OpResult mget = SHARDKV__OP_RESULT__INIT;
	mget.status = kv_wire_from_err(KV_ENOTFOUND);
	mget.n_values = ARRAY_LEN(values);
	mget.values = values;
	mget.n_missing = ARRAY_LEN(missing);
	mget.missing = missing;

	Shardkv__KeyValue kv = SHARDKV__KEY_VALUE__INIT;
	kv.key = bin("n", 1);
	kv.value = bin("nv", 2);
	Shardkv__KeyValue *entries[] = {&kv};
	Shardkv__OpResult scan = SHARDKV__OP_RESULT__INIT;
	scan.n_entries = 1;
	scan.entries = entries;
	scan.more = 1;
	scan.next_cursor = bin("n\0", 2);

	Shardkv__OpResult *results[] = {&moved, &mget, &scan};
	Shardkv__Response resp = SHARDKV__RESPONSE__INIT;
	resp.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	resp.request_id = 42;
	resp.epoch = 9;
	resp.node_id = 2;
	resp.n_results = ARRAY_LEN(results);
	resp.results = results;

	uint8_t *buf = NULL;
	size_t len = pack_message(&resp.base, &buf);
	Shardkv__Response *got =
	    (Shardkv__Response *)unpack_and_repack(&shardkv__response__descriptor, buf, len);

	assert_int_equal(got->status, SHARDKV__STATUS__STATUS_OK);
	assert_int_equal(got->n_results, 3);
	assert_int_equal(kv_err_from_wire(got->results[0]->status), KV_EWRONGOWNER);
	assert_non_null(got->results[0]->owner);
	assert_int_equal(got->results[0]->owner->node_id, 3);
	assert_string_equal(got->results[0]->owner->address, hint.address);
	assert_int_equal(kv_err_from_wire(got->results[1]->status), KV_ENOTFOUND);
	assert_int_equal(got->results[1]->n_missing, 1);
	assert_int_equal(got->results[1]->missing[0], 1);
	assert_true(got->results[2]->more);
	assert_bin_equal(got->results[2]->next_cursor, scan.next_cursor);

	shardkv__response__free_unpacked(got, NULL);
	free(buf);
}

static void
transfer_chunk_with_split_value_round_trips(void **state)
{
	(void)state;
	static char big[3000];
	memset(big, 'v', sizeof(big));

	Shardkv__KeyValue first = SHARDKV__KEY_VALUE__INIT;
	first.key = bin("big", 3);
	first.value = bin(big, 1000);
	first.value_total = sizeof(big);
	Shardkv__KeyValue rest = SHARDKV__KEY_VALUE__INIT;
	rest.key = bin("big", 3);
	rest.value = bin(big + 1000, sizeof(big) - 1000);
	rest.value_offset = 1000;
	rest.value_total = sizeof(big);
	Shardkv__KeyValue *entries[] = {&first, &rest};

	Shardkv__OpResult cached = SHARDKV__OP_RESULT__INIT;
	cached.value_len = sizeof(big);
	Shardkv__DedupEntry dedup = SHARDKV__DEDUP_ENTRY__INIT;
	dedup.client_id = 5;
	dedup.request_id = 77;
	dedup.result = &cached;
	dedup.key = bin("big", 3);
	Shardkv__DedupEntry *dedups[] = {&dedup};

	Shardkv__TransferChunk chunk = SHARDKV__TRANSFER_CHUNK__INIT;
	chunk.n_entries = ARRAY_LEN(entries);
	chunk.entries = entries;
	chunk.n_dedup = ARRAY_LEN(dedups);
	chunk.dedup = dedups;
	chunk.last = 1;

	Shardkv__Transfer xfer = SHARDKV__TRANSFER__INIT;
	xfer.migration_id = 12;
	xfer.seq = 2;
	xfer.msg_case = SHARDKV__TRANSFER__MSG_CHUNK;
	xfer.chunk = &chunk;

	Shardkv__Request req = SHARDKV__REQUEST__INIT;
	req.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	req.epoch = 8;
	req.from_node = 1;
	req.transfer = &xfer;

	uint8_t *buf = NULL;
	size_t len = pack_message(&req.base, &buf);
	Shardkv__Request *got =
	    (Shardkv__Request *)unpack_and_repack(&shardkv__request__descriptor, buf, len);

	assert_int_equal(got->n_ops, 0);
	assert_non_null(got->transfer);
	assert_int_equal(got->transfer->msg_case, SHARDKV__TRANSFER__MSG_CHUNK);
	const Shardkv__TransferChunk *c = got->transfer->chunk;
	assert_int_equal(c->n_entries, 2);
	assert_int_equal(c->entries[0]->value_offset, 0);
	assert_int_equal(c->entries[1]->value_offset, 1000);
	assert_int_equal(c->entries[0]->value.len + c->entries[1]->value.len,
	                 c->entries[1]->value_total);
	assert_int_equal(c->n_dedup, 1);
	assert_int_equal(c->dedup[0]->result->value_len, sizeof(big));
	assert_true(c->last);

	shardkv__request__free_unpacked(got, NULL);
	free(buf);
}

/* Inputs that are not a valid encoding of any message. */
static void
unpacking_garbage_returns_null(void **state)
{
	(void)state;
	static const struct {
		const char *what;
		const char *bytes;
		size_t len;
	} cases[] = {
	    {"all 0xff", "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", 12},
	    {"field number 0", "\x00\x01", 2},
	    {"wire type 7", "\x0f\x01", 2},
	    {"unterminated varint", "\x08\x80\x80\x80", 4},
	    {"length past the end", "\x2a\x10\x61\x62", 4},
	    {"huge length", "\x2a\xff\xff\xff\xff\x0f", 6},
	    {"sub-message past the end", "\x32\x05\x12\x10\x0a\x01k", 7},
	    {"group start", "\x0b\x0c", 2},
	};

	for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
		const uint8_t *p = (const uint8_t *)cases[i].bytes;
		Shardkv__Request *req = shardkv__request__unpack(NULL, cases[i].len, p);
		if (req != NULL)
			fail_msg("Request accepted garbage: %s", cases[i].what);
		Shardkv__AdminRequest *adm = shardkv__admin_request__unpack(NULL, cases[i].len, p);
		if (adm != NULL)
			fail_msg("AdminRequest accepted garbage: %s", cases[i].what);
	}
}

/*
 * Random bytes and every truncation of a valid request either decode or
 * return NULL; they never crash, and whatever decodes is freed (ASan checks
 * the leaks).
 */
static void
unpacking_random_and_truncated_bytes_never_crashes(void **state)
{
	(void)state;
	uint64_t x = UINT64_C(0x9e3779b97f4a7c15);
	uint8_t buf[256];

	for (int round = 0; round < 20000; round++) {
		size_t len = (size_t)(round % (int)sizeof(buf));
		for (size_t i = 0; i < len; i++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			buf[i] = (uint8_t)x;
		}
		Shardkv__Request *req = shardkv__request__unpack(NULL, len, buf);
		shardkv__request__free_unpacked(req, NULL);
		Shardkv__Response *resp = shardkv__response__unpack(NULL, len, buf);
		shardkv__response__free_unpacked(resp, NULL);
		Shardkv__AdminRequest *adm = shardkv__admin_request__unpack(NULL, len, buf);
		shardkv__admin_request__free_unpacked(adm, NULL);
		Shardkv__AdminResponse *aresp = shardkv__admin_response__unpack(NULL, len, buf);
		shardkv__admin_response__free_unpacked(aresp, NULL);
	}

	Shardkv__PutOp put = SHARDKV__PUT_OP__INIT;
	put.key = bin("key", 3);
	put.value = bin("value", 5);
	Shardkv__Op op = SHARDKV__OP__INIT;
	op.request_id = 3;
	op.op_case = SHARDKV__OP__OP_PUT;
	op.put = &put;
	Shardkv__Op *ops[] = {&op};
	Shardkv__Request req = SHARDKV__REQUEST__INIT;
	req.version = SHARDKV__PROTOCOL_VERSION__PROTOCOL_VERSION_1;
	req.auth_token = bin("token", 5);
	req.n_ops = 1;
	req.ops = ops;
	uint8_t *packed = NULL;
	size_t len = pack_message(&req.base, &packed);
	int refused = 0;
	for (size_t cut = 0; cut < len; cut++) {
		Shardkv__Request *got = shardkv__request__unpack(NULL, cut, packed);
		refused += got == NULL;
		shardkv__request__free_unpacked(got, NULL);
	}
	/* Cutting inside the ops field (the last one) must be refused. */
	assert_true(refused > 0);
	free(packed);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(every_kv_error_round_trips_through_its_own_wire_status),
	    cmocka_unit_test(each_kv_error_maps_to_the_wire_status_of_the_same_meaning),
	    cmocka_unit_test(every_wire_status_except_not_leader_round_trips_through_kv_error),
	    cmocka_unit_test(not_leader_status_reads_as_eunavail),
	    cmocka_unit_test(unknown_wire_status_reads_as_eproto),
	    cmocka_unit_test(unknown_kv_error_leaves_as_internal_status),
	    cmocka_unit_test(request_with_mixed_op_batch_packs_and_unpacks_identically),
	    cmocka_unit_test(response_with_owner_hint_and_mget_misses_round_trips),
	    cmocka_unit_test(transfer_chunk_with_split_value_round_trips),
	    cmocka_unit_test(unpacking_garbage_returns_null),
	    cmocka_unit_test(unpacking_random_and_truncated_bytes_never_crashes),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
