/*
 * fuzz_xfer_ack.c - what the source of a migration decodes from the
 * destination: the Response to a transfer message, through
 * kv_xfer_ack_decode. A refused envelope or a missing ack is an error code;
 * an ack is copied out whole.
 */
#include "common/err.h"
#include "fuzz/fuzz_util.h"
#include "proto/xfer_codec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kv_xfer_ack ack;
	int rv;

	rv = kv_xfer_ack_decode(data, size, &ack);
	FZ_CHECK(rv <= 0);
	FZ_CHECK(ack.error == NULL);
	if (rv != KV_OK)
		FZ_CHECK(ack.migration_id == 0 && ack.seq == 0);
	return 0;
}
