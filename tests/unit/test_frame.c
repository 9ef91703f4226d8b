/*
 * test_frame.c - the shared on-disk framing (common/frame.h): headers
 * written before the module existed (bytes taken from a write-ahead log
 * segment, a snapshot and a config log) are accepted and reproduced byte
 * for byte, every kind of header damage is told apart, and the streaming
 * checksum equals the one-shot one.
 */
#include "common/bytes.h"
#include "common/frame.h"

#include <stdint.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

static const char wal_magic[8] = {'S', 'K', 'V', 'W', 'A', 'L', '\0', '\0'};
static const char snap_magic[8] = {'S', 'K', 'V', 'S', 'N', 'A', 'P', '\0'};
static const char clog_magic[8] = {'S', 'K', 'V', 'C', 'L', 'O', 'G', '\0'};

/* The header of wal-0000000000000001.log (first lsn 1, format version 1). */
static const uint8_t wal_header[32] = {
    0x53, 0x4b, 0x56, 0x57, 0x41, 0x4c, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x3f, 0x94, 0x90, 0x3e, 0x43, 0xba, 0x54, 0x4a};

/* The header of snap-0000000000000007.dat (lsn 7, format version 1). */
static const uint8_t snap_header[32] = {
    0x53, 0x4b, 0x56, 0x53, 0x4e, 0x41, 0x50, 0x00, 0x01, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00,
    0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xde, 0x5b, 0xec, 0xa2, 0x41, 0x5a, 0x56, 0x1e};

/* The header of a config.log (cluster id 5401aa2fc5870778, version 1). */
static const uint8_t clog_header[48] = {
    0x53, 0x4b, 0x56, 0x43, 0x4c, 0x4f, 0x47, 0x00, 0x01, 0x00, 0x00, 0x00, 0x30, 0x00, 0x00, 0x00,
    0x35, 0x34, 0x30, 0x31, 0x61, 0x61, 0x32, 0x66, 0x63, 0x35, 0x38, 0x37, 0x30, 0x37, 0x37, 0x38,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x43, 0x02, 0x3f, 0x16, 0x9a, 0x99, 0x22, 0xd4};

static void
existing_headers_are_accepted(void **state)
{
	(void)state;
	assert_int_equal(kv_frame_header_check(wal_header, wal_magic, 1, 32), KV_FRAME_OK);
	assert_int_equal(kv_frame_header_check(snap_header, snap_magic, 1, 32), KV_FRAME_OK);
	assert_int_equal(kv_frame_header_check(clog_header, clog_magic, 1, 48), KV_FRAME_OK);
}

static void
existing_headers_are_reproduced_byte_for_byte(void **state)
{
	uint8_t h[48];

	(void)state;
	kv_frame_header_init(h, wal_magic, 1, 32);
	kv_put64(h + 16, 1);
	assert_int_equal(kv_frame_header_seal(h, 32), kv_get64(wal_header + 24));
	assert_memory_equal(h, wal_header, 32);

	kv_frame_header_init(h, snap_magic, 1, 32);
	kv_put64(h + 16, 7);
	kv_frame_header_seal(h, 32);
	assert_memory_equal(h, snap_header, 32);

	kv_frame_header_init(h, clog_magic, 1, 48);
	memcpy(h + 16, "5401aa2fc5870778", 16);
	kv_frame_header_seal(h, 48);
	assert_memory_equal(h, clog_header, 48);
}

static void
header_damage_is_named_in_check_order(void **state)
{
	uint8_t h[32];

	(void)state;
	memcpy(h, wal_header, sizeof(h));
	assert_int_equal(kv_frame_header_check(h, snap_magic, 1, 32), KV_FRAME_BAD_MAGIC);
	assert_int_equal(kv_frame_header_check(h, wal_magic, 2, 32), KV_FRAME_BAD_VERSION);
	assert_int_equal(kv_frame_header_check(h, wal_magic, 1, 40), KV_FRAME_BAD_SIZE);
	h[16] ^= 0x01; /* a format field */
	assert_int_equal(kv_frame_header_check(h, wal_magic, 1, 32), KV_FRAME_BAD_SUM);
	memcpy(h, wal_header, sizeof(h));
	h[31] ^= 0x80; /* the checksum itself */
	assert_int_equal(kv_frame_header_check(h, wal_magic, 1, 32), KV_FRAME_BAD_SUM);
	/* a wrong version with a wrong checksum reports the version first */
	kv_put32(h + 8, 9);
	assert_int_equal(kv_frame_header_check(h, wal_magic, 1, 32), KV_FRAME_BAD_VERSION);
	assert_int_equal(kv_frame_header_version(h), 9);
	assert_int_equal(kv_frame_header_size(h), 32);
}

static void
streaming_checksum_equals_one_shot(void **state)
{
	static uint8_t buf[300000];
	kv_frame_sum_state *st = kv_frame_sum_create();

	(void)state;
	assert_non_null(st);
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(i * 131u + (i >> 9));
	kv_frame_sum_update(st, buf, 8);
	kv_frame_sum_update(st, buf + 8, 1000);
	kv_frame_sum_update(st, buf + 1008, sizeof(buf) - 1008);
	assert_true(kv_frame_sum_digest(st) == kv_frame_sum(buf, sizeof(buf)));
	kv_frame_sum_reset(st);
	assert_true(kv_frame_sum_digest(st) == kv_frame_sum("", 0));
	kv_frame_sum_update(st, buf, 24);
	assert_true(kv_frame_sum_digest(st) == kv_frame_sum(buf, 24));
	kv_frame_sum_destroy(st);
	kv_frame_sum_destroy(NULL);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(existing_headers_are_accepted),
	    cmocka_unit_test(existing_headers_are_reproduced_byte_for_byte),
	    cmocka_unit_test(header_damage_is_named_in_check_order),
	    cmocka_unit_test(streaming_checksum_equals_one_shot),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
