/*
 * fuzz_replicate.c - the replication stream's decoders (proto/repl_codec.h):
 * the bytes a backup gets from a primary (a Request carrying Replicate,
 * through kv_data_req_decode) and the bytes a primary gets back (a Response
 * carrying ReplicateAck, through kv_repl_ack_decode). A Replicate that
 * decodes is encoded again with kv_repl_encode and decoded once more: both
 * decodings must agree, and what was accepted must meet the decoder's
 * promises (ids set, record count, lsns rising, payload and key bounds; a
 * copy step or an end alone, within the same bounds).
 */
#include "common/err.h"
#include "fuzz/fuzz_util.h"
#include "proto/data_codec.h"
#include "proto/repl_codec.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int
bytes_eq(kv_bytes a, kv_bytes b)
{
	return a.len == b.len && (a.len == 0 || memcmp(a.p, b.p, a.len) == 0);
}

static void
check_promises(const kv_repl_msg *m)
{
	FZ_CHECK(m->from_node != 0 && m->stream_id != 0 && m->seq != 0);
	FZ_CHECK(m->nrecs <= KV_REPL_MAX_RECS);
	for (size_t i = 0; i < m->nrecs; i++) {
		const kv_repl_rec *r = &m->recs[i];
		FZ_CHECK(r->lsn != 0 && r->payload.len >= 1 &&
		         r->payload.len <= KV_REPL_MAX_PAYLOAD);
		FZ_CHECK(r->start.len <= KV_HARD_MAX_KEY);
		FZ_CHECK(i == 0 || r->lsn > m->recs[i - 1].lsn);
	}
	/* A copy step or an end comes alone. */
	FZ_CHECK((m->nrecs != 0) + m->copy.set + m->end.set <= 1);
	if (m->copy.set) {
		FZ_CHECK(m->copy.nrecs <= KV_REPL_MAX_RECS);
		FZ_CHECK(m->copy.start.len <= KV_HARD_MAX_KEY &&
		         m->copy.end.len <= KV_HARD_MAX_KEY);
		for (size_t i = 0; i < m->copy.nrecs; i++)
			FZ_CHECK(m->copy.recs[i].len >= 1 &&
			         m->copy.recs[i].len <= KV_REPL_MAX_PAYLOAD);
	} else {
		FZ_CHECK(m->copy.nrecs == 0 && m->copy.recs == NULL);
	}
	if (m->end.set)
		FZ_CHECK(m->end.old_primary != 0 && m->end.start.len <= KV_HARD_MAX_KEY);
}

/* Whether two decodings of a batch's copy step and end agree. */
static void
check_same_markers(const kv_repl_msg *x, const kv_repl_msg *y)
{
	FZ_CHECK(x->copy.set == y->copy.set && x->end.set == y->end.set);
	FZ_CHECK(x->copy.leader_epoch == y->copy.leader_epoch && x->copy.first == y->copy.first &&
	         x->copy.last == y->copy.last && x->copy.nrecs == y->copy.nrecs);
	FZ_CHECK(bytes_eq(x->copy.start, y->copy.start) && bytes_eq(x->copy.end, y->copy.end));
	for (size_t i = 0; i < x->copy.nrecs; i++)
		FZ_CHECK(bytes_eq(x->copy.recs[i], y->copy.recs[i]));
	FZ_CHECK(x->end.leader_epoch == y->end.leader_epoch &&
	         x->end.old_primary == y->end.old_primary && x->end.end_lsn == y->end.end_lsn);
	FZ_CHECK(bytes_eq(x->end.start, y->end.start));
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	kv_req rq, again;
	kv_repl_ack ack;
	const char *why;
	nng_msg *m = NULL;
	int rv;

	/* As a primary reads an answer. */
	rv = kv_repl_ack_decode(data, size, &ack);
	FZ_CHECK(rv <= 0);
	FZ_CHECK(ack.error == NULL);
	if (rv != KV_OK)
		FZ_CHECK(ack.acked_seq == 0 && ack.acked_lsn == 0);

	/* As a backup reads a batch. */
	rv = kv_data_req_decode(data, size, &rq, &why);
	if (rv == KV_OK && rq.has_repl) {
		FZ_CHECK(rq.nops == 0 && !rq.has_xfer);
		check_promises(&rq.repl);
		FZ_CHECK(kv_repl_encode(&rq.repl, rq.epoch, rq.from_node, rq.auth, &m) == KV_OK);
		FZ_CHECK(kv_data_req_decode(nng_msg_body(m), nng_msg_len(m), &again, &why) ==
		         KV_OK);
		FZ_CHECK(again.has_repl && again.epoch == rq.epoch);
		FZ_CHECK(again.from_node == rq.from_node && bytes_eq(again.auth, rq.auth));
		FZ_CHECK(again.repl.from_node == rq.repl.from_node);
		FZ_CHECK(again.repl.stream_id == rq.repl.stream_id);
		FZ_CHECK(again.repl.seq == rq.repl.seq);
		FZ_CHECK(again.repl.commit_lsn == rq.repl.commit_lsn);
		FZ_CHECK(again.repl.nrecs == rq.repl.nrecs);
		for (size_t i = 0; i < rq.repl.nrecs; i++) {
			const kv_repl_rec *x = &rq.repl.recs[i], *y = &again.repl.recs[i];
			FZ_CHECK(x->lsn == y->lsn && x->leader_epoch == y->leader_epoch);
			FZ_CHECK(bytes_eq(x->start, y->start) && bytes_eq(x->payload, y->payload));
		}
		check_same_markers(&rq.repl, &again.repl);
		kv_data_req_fini(&again);
		nng_msg_free(m);
	}
	kv_data_req_fini(&rq);
	return 0;
}
