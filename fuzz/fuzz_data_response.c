/*
 * fuzz_data_response.c - the Response decoder (kv_data_resp_decode,
 * proto/data_codec.h): the bytes a shard server answers a client with, as
 * they come off the network. A decoded response must hold only bounded,
 * allocated buffers. Then the bytes go the client's way: kvc_reply_decode
 * as the request engine reads the reply to 1 to 4 ops, every result as a
 * caller may read it, and the scan entries of a one-op reply through
 * kvc_entries_merge, as the client merges the replies of several servers.
 */
#include "client/client_int.h"
#include "common/err.h"
#include "fuzz/fuzz_util.h"
#include "proto/data_codec.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void
touch_buf(const kv_buf *b, int must_have_data)
{
	if (must_have_data)
		FZ_CHECK(b->data != NULL);
	if (b->data)
		fz_touch(b->data, b->len);
	else
		FZ_CHECK(b->len == 0);
}

/* Everything a caller of the library may read in a result. */
static void
check_reply(const kv_data_result *r)
{
	if (r->has_hint) {
		touch_buf(&r->hint.start, 1);
		touch_buf(&r->hint.end, 1);
		if (r->hint.address)
			fz_touch(r->hint.address, strlen(r->hint.address));
	}
	touch_buf(&r->value, 0);
	FZ_CHECK(r->value.len <= KV_HARD_MAX_VALUE);
	for (size_t i = 0; i < r->nvalues; i++)
		touch_buf(&r->values[i], 1);
	if (r->nmissing)
		fz_touch(r->missing, r->nmissing * sizeof(*r->missing));
	for (size_t i = 0; i < r->nentries; i++) {
		touch_buf(&r->entries[i].key, 1);
		touch_buf(&r->entries[i].value, 1);
		FZ_CHECK(r->entries[i].key.len <= KV_HARD_MAX_KEY);
	}
	touch_buf(&r->next_cursor, 0);
}

/* Merges the reply's scan entries as ops.c does; the result must be
 * strictly increasing and within the limit. */
static void
merge_entries(kv_data_result *r, size_t limit)
{
	kvc_entries acc = {0};
	long got;

	if (r->nentries == 0)
		return;
	got = kvc_entries_merge(&acc, r->entries, r->nentries, limit);
	FZ_CHECK(got >= 0 && (size_t)got == acc.n && acc.n <= r->nentries);
	FZ_CHECK(limit == 0 || acc.n <= limit);
	for (size_t i = 1; i < acc.n; i++)
		FZ_CHECK(kv_key_cmp(acc.entries[i - 1].key.data, acc.entries[i - 1].key.len,
		                    acc.entries[i].key.data, acc.entries[i].key.len) < 0);
	kvc_entries_fini(&acc);
}

/* Everything a reader may touch in a decoded Response. */
static void
check_resp(const kv_resp *d)
{
	FZ_CHECK(d->nresults <= KV_DATA_MAX_OPS && (d->nresults == 0 || d->results != NULL));
	if (d->error)
		fz_touch(d->error, strlen(d->error));
	if (d->has_ack && d->ack.error)
		fz_touch(d->ack.error, strlen(d->ack.error));
	for (size_t i = 0; i < d->nresults; i++) {
		const kv_data_result *r = &d->results[i];
		if (r->error)
			fz_touch(r->error, strlen(r->error));
		if (r->has_hint) {
			touch_buf(&r->hint.start, 1);
			touch_buf(&r->hint.end, 1);
			if (r->hint.address)
				fz_touch(r->hint.address, strlen(r->hint.address));
		}
		FZ_CHECK(r->has_value == (r->value.data != NULL));
		touch_buf(&r->value, 0);
		FZ_CHECK(r->nvalues <= KV_DATA_MAX_MULTI && r->nmissing <= KV_DATA_MAX_MULTI);
		for (size_t k = 0; k < r->nvalues; k++)
			touch_buf(&r->values[k], 1);
		if (r->nmissing)
			fz_touch(r->missing, r->nmissing * sizeof(*r->missing));
		for (size_t k = 0; k < r->nentries; k++) {
			touch_buf(&r->entries[k].key, 1);
			touch_buf(&r->entries[k].value, 1);
			FZ_CHECK(r->entries[k].key.len <= KV_HARD_MAX_KEY);
		}
		touch_buf(&r->next_cursor, 0);
	}
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kv_resp d;

	if (kv_data_resp_decode(data, size, &d) == KV_OK) {
		check_resp(&d);
		kv_data_resp_fini(&d);
	} else {
		FZ_CHECK(d.pb == NULL && d.results == NULL);
	}
	for (size_t nr = 1; nr <= 4; nr++) {
		if (kvc_reply_decode(data, size, nr, &d) != KV_OK) {
			FZ_CHECK(d.pb == NULL && d.results == NULL);
			continue;
		}
		FZ_CHECK(d.status != KV_OK || d.nresults == nr);
		for (size_t i = 0; i < d.nresults; i++) {
			if (d.results[i].error)
				fz_touch(d.results[i].error, strlen(d.results[i].error));
			check_reply(&d.results[i]);
		}
		if (nr == 1 && d.nresults == 1) {
			kv_data_result *r = &d.results[0];
			merge_entries(r, r->nentries > 1 ? r->nentries - 1 : 0);
		}
		kv_data_resp_fini(&d);
	}
	return 0;
}
