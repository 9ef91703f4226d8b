/*
 * make-corpus-server.c - the shard server's seeds for the corpus generator
 * (make-corpus.c): requests and transfers it decodes, the replies it sends,
 * the messages it sends the controller, and its log, log records and
 * snapshots, all written by the server's own encoders and writers.
 */
#include "client/client_int.h"
#include "common/bytes.h"
#include "common/config.h"
#include "common/err.h"
#include "common/key.h"
#include "fuzz/fuzz_util.h"
#include "fuzz/make-corpus.h"
#include "shardserver/dedup/dedup.h"
#include "shardserver/durable/durable.h"
#include "proto/admin_codec.h"
#include "proto/data_codec.h"
#include "proto/repl_codec.h"
#include "shardserver/durable/snap.h"
#include "shardserver/store/store.h"
#include "shardserver/durable/wal.h"

#include <stdlib.h>
#include <string.h>

static void
seeds_requests(void)
{
	const char *h = "fuzz_data_request";
	kv_bytes keys[3] = {B("a"), B("b"), B("user:1")}, vals[3] = {B("1"), B(""), B("three")};
	nng_msg *m;
	struct {
		const char *name;
		kv_op op;
	} ops[] = {
	    {"get", {.kind = KV_OP_GET, .key = B("user:1")}},
	    {"put", {.kind = KV_OP_PUT, .request_id = 9, .key = B("user:1"), .value = B("alice")}},
	    {"del", {.kind = KV_OP_DEL, .request_id = 10, .key = B("user:1")}},
	    {"append", {.kind = KV_OP_APPEND, .request_id = 11, .key = B("log"), .value = B("x")}},
	    {"mget", {.kind = KV_OP_MGET, .nkeys = 3, .keys = keys}},
	    {"mput",
	     {.kind = KV_OP_MPUT,
	      .request_id = 12,
	      .nkeys = 3,
	      .keys = keys,
	      .nvals = 3,
	      .vals = vals}},
	    {"scan",
	     {.kind = KV_OP_SCAN,
	      .start = B("a"),
	      .end = B("z"),
	      .prefix = B("u"),
	      .cursor = B("user:0\x00"),
	      .limit = 10,
	      .keys_only = true}},
	};
	kv_req env = {.client_id = 77, .request_id = 5, .epoch = 7, .timeout_ms = 5000, .nops = 1};

	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
		env.ops = &ops[i].op;
		seed_msg(h, ops[i].name, kv_data_req_encode(&env, &m), m);
	}
	kv_op batch[3] = {ops[0].op, ops[1].op, ops[3].op};
	env.ops = batch;
	env.nops = 3;
	seed_msg(h, "batch", kv_data_req_encode(&env, &m), m);

	/* Range transfer, as a source server sends it. */
	kv_xfer_kv kv[3] = {
	    {.key = B("a1"), .value = B("v1")},
	    {.key = B("a2"), .value = B("")},
	    {.key = B("a3"), .value = B("sli"), .value_offset = 0, .value_total = 6}};
	kv_xfer_dedup dd[1] = {{.client_id = 77,
	                        .request_id = 9,
	                        .status = KV_OK,
	                        .value_len = 3,
	                        .value = B("old"),
	                        .key = B("a1"),
	                        .time_ms = 1700000000000ull}};
	kv_xfer_delta delta[2] = {{.seq = 1, .key = B("a4"), .value = B("v4")},
	                          {.seq = 2, .del = true, .key = B("a1"), .has_dedup = true}};
	delta[1].dedup = dd[0];
	kv_xfer xs[] = {
	    {.migration_id = 4,
	     .seq = 1,
	     .kind = KV_XFER_BEGIN,
	     .epoch = 7,
	     .start = B("a"),
	     .end = B("c"),
	     .from_node = 1,
	     .to_node = 2,
	     .keys = 20,
	     .bytes = 2000},
	    {.migration_id = 4,
	     .seq = 2,
	     .kind = KV_XFER_CHUNK,
	     .nkv = 3,
	     .kv = kv,
	     .ndedup = 1,
	     .dedup = dd,
	     .last = true},
	    {.migration_id = 4, .seq = 3, .kind = KV_XFER_DELTA, .ndelta = 2, .delta = delta},
	    {.migration_id = 4,
	     .seq = 4,
	     .kind = KV_XFER_FENCE,
	     .last_write_seq = 2,
	     .keys = 20,
	     .bytes = 2000},
	    {.migration_id = 4, .seq = 5, .kind = KV_XFER_COMMIT, .epoch = 8},
	    {.migration_id = 4, .seq = 6, .kind = KV_XFER_ABORT, .reason = KV_ETIMEDOUT},
	};
	static const char *xnames[] = {"xfer-begin", "xfer-chunk",  "xfer-delta",
	                               "xfer-fence", "xfer-commit", "xfer-abort"};
	for (size_t i = 0; i < sizeof(xs) / sizeof(xs[0]); i++)
		seed_msg(h, xnames[i], kv_xfer_encode(&xs[i], 7, 1, (kv_bytes){0}, &m), m);
	xs[1].packed = true; /* the chunk's entries in one field */
	seed_msg(h, "xfer-chunk-packed", kv_xfer_encode(&xs[1], 7, 1, (kv_bytes){0}, &m), m);
}

/* Responses of a shard server: to clients (results) and to peers (acks). */
static void
seeds_responses(void)
{
	kv_buf v = {0}, vals[2] = {{0}, {0}}, k1 = {0}, k2 = {0}, cur = {0};
	uint32_t missing[1] = {1};
	kv_data_entry ents[2];
	nng_msg *m;

	set_buf(&v, "alice");
	set_buf(&vals[0], "1");
	set_buf(&vals[1], "");
	set_buf(&k1, "user:1");
	set_buf(&k2, "user:2");
	set_buf(&cur, "user:2");
	ents[0] = (kv_data_entry){k1, v};
	ents[1] = (kv_data_entry){k2, vals[0]};
	kv_data_result rs[] = {
	    {.status = KV_OK, .has_value = true, .value = v},
	    {.status = KV_ENOTFOUND},
	    {.status = KV_EWRONGOWNER,
	     .error = "not the owner",
	     .has_hint = true,
	     .hint = {.epoch = 8, .node_id = 2, .address = "tcp://127.0.0.1:7102"}},
	    {.status = KV_OK, .nvalues = 2, .values = vals, .nmissing = 1, .missing = missing},
	    {.status = KV_OK, .nentries = 2, .entries = ents, .more = true, .next_cursor = cur},
	    {.status = KV_OK, .value_len = 42},
	};
	static const char *names[] = {"get", "not-found", "wrong-owner", "mget", "scan", "append"};
	set_buf(&rs[2].hint.start, "g");
	for (size_t i = 0; i < sizeof(rs) / sizeof(rs[0]); i++) {
		kv_resp r = {
		    .request_id = 5, .epoch = 7, .node_id = 1, .nresults = 1, .results = &rs[i]};
		seed_msg("fuzz_data_response", names[i], kv_data_resp_encode(&r, &m), m);
	}
	kv_resp batch = {.request_id = 6, .epoch = 7, .node_id = 1, .nresults = 3, .results = rs};
	seed_msg("fuzz_data_response", "batch", kv_data_resp_encode(&batch, &m), m);
	kv_resp refused = {.request_id = 7, .status = KV_ESTALE, .error = "stale epoch"};
	seed_msg("fuzz_data_response", "refused", kv_data_resp_encode(&refused, &m), m);

	kv_resp ack = {.request_id = 8,
	               .epoch = 7,
	               .node_id = 2,
	               .has_ack = true,
	               .ack = {.migration_id = 4, .seq = 3, .keys = 12, .bytes = 1200}};
	seed_msg("fuzz_xfer_ack", "xfer-ack", kv_data_resp_encode(&ack, &m), m);
	kv_buf_fini(&v);
	kv_buf_fini(&vals[0]);
	kv_buf_fini(&vals[1]);
	kv_buf_fini(&k1);
	kv_buf_fini(&k2);
	kv_buf_fini(&cur);
	kv_buf_fini(&rs[2].hint.start);
}

/* What a shard server sends the controller. */
static void
seeds_server_admin(void)
{
	const char *h = "fuzz_admin_request";
	nng_msg *m;
	kv_bytes split[3] = {B("b"), B("d"), B("f")};
	kv_admin_range_stat rs[2] = {{.start = B(""),
	                              .end = B("g"),
	                              .keys = 10,
	                              .bytes = 100,
	                              .ops = 1.5,
	                              .nsplit = 3,
	                              .split = split},
	                             {.start = B("g"), .end = B(""), .keys = 3, .bytes = 30}};
	kv_admin_req as[] = {
	    {.op = KV_ADM_REGISTER,
	     .client_id = 5,
	     .request_id = 1,
	     .address = "tcp://127.0.0.1:7101",
	     .join = true,
	     .boot_id = 123,
	     .cluster_id = "00000000c0ffee00"},
	    {.op = KV_ADM_WATCH,
	     .request_id = 2,
	     .epoch = 3,
	     .history = true,
	     .node_id = 1,
	     .timeout_ms = 500},
	    {.op = KV_ADM_HEARTBEAT,
	     .request_id = 3,
	     .node_id = 1,
	     .boot_id = 123,
	     .epoch = 7,
	     .nranges = 2,
	     .ranges = rs,
	     .keys = 13,
	     .bytes = 130,
	     .ops = 2.5,
	     .memory = 1 << 20},
	    {.op = KV_ADM_PROGRESS,
	     .request_id = 4,
	     .node_id = 1,
	     .mig_id = 4,
	     .phase = KV_MIG_CATCHUP,
	     .keys_copied = 5,
	     .bytes_copied = 50,
	     .keys_total = 10,
	     .bytes_total = 100,
	     .rate_bytes_s = 1000},
	    {.op = KV_ADM_DONE,
	     .request_id = 5,
	     .node_id = 1,
	     .mig_id = 4,
	     .result = KV_OK,
	     .keys = 10,
	     .bytes = 100,
	     .last_seq = 9},
	    {.op = KV_ADM_LEAVE, .request_id = 6, .node_id = 3},
	};
	static const char *anames[] = {"srv-register", "srv-watch", "srv-heartbeat",
	                               "srv-progress", "srv-done",  "srv-leave"};
	for (size_t i = 0; i < sizeof(as) / sizeof(as[0]); i++)
		seed_msg(h, anames[i], kv_admin_req_encode(&as[i], &m), m);
}

static void
seeds_wal(void)
{
	const char *h = "fuzz_wal_replay";
	char dir[256], name[64];
	kv_wal_opts o = {.mode = KV_FSYNC_NONE};
	kv_wal *w;
	uint64_t lsn, next;
	uint8_t *a, *b;
	size_t na, nb;
	char err[256];

	fz_tmpdir(dir, sizeof(dir));
	o.dir = dir;
	if (kv_wal_open(&o, 1, &w, err, sizeof(err)) != KV_OK)
		die(err);
	for (int i = 0; i < 4; i++) {
		char rec[32];
		int n = snprintf(rec, sizeof(rec), "record %d", i + 1);
		struct iovec iov = {rec, (size_t)n};
		if (kv_wal_appendv(w, &iov, 1, &lsn) != KV_OK)
			die("append");
	}
	if (kv_wal_rotate(w, &next) != KV_OK)
		die("rotate");
	for (int i = 0; i < 2; i++) {
		struct iovec iov[2] = {{"two ", 4}, {"pieces", 6}};
		if (kv_wal_appendv(w, iov, 2, &lsn) != KV_OK)
			die("append");
	}
	if (kv_wal_wait(w, lsn, true) != KV_OK)
		die("wait");
	kv_wal_close(w);
	a = read_file(dir, "wal-0000000000000001.log", &na);
	snprintf(name, sizeof(name), "wal-%016llx.log", (unsigned long long)next);
	b = read_file(dir, name, &nb);
	fz_rmdir(dir);

	uint8_t *ab = malloc(na + nb + 7);
	if (ab == NULL)
		die("out of memory");
	memcpy(ab, a, na);
	memcpy(ab + na, b, nb);
	seed_ctl(h, "one-segment", 0x00, a, na);
	seed_ctl(h, "one-segment-fix-cut", 0x05, a, na);
	seed_ctl(h, "two-segments", 0x00, ab, na + nb);
	seed_ctl(h, "two-segments-from-3", 2 << 3, ab, na + nb);
	memcpy(ab + na + nb, "\x09\x00\x00torn", 7);
	seed_ctl(h, "torn-tail", 0x00, ab, na + nb + 7);
	seed_ctl(h, "header-only", 0x00, a, KV_WAL_HEADER_SIZE);
	seed_ctl(h, "recycled-older-records", 0x43, ab, na + nb);
	seed_ctl(h, "recycled-older-records-cut", 0x47, ab, na + nb);
	free(a);
	free(b);
	free(ab);
}

/* Log records as the shard server writes them (durable.c), taken out of the
 * log segment they land in. */
static void
seeds_dur(void)
{
	const char *h = "fuzz_dur_record";
	char dir[256], err[256];
	kv_store *s;
	kv_dedup *d;
	kv_dur *dur;
	kv_dur_report rep;
	kv_dur_dedup dd = {.client = 77, .req = 9, .value_len = 5, .time_ms = 1700000000000ull};
	kv_bytes ks[2] = {B("k1"), B("k2")}, vs[2] = {B("v1"), B("")};
	uint8_t *seg, *all;
	size_t n, nall = 0;

	fz_tmpdir(dir, sizeof(dir));
	if (kv_store_create(NULL, &s) != KV_OK || (d = kv_dedup_create(0, 0, 0)) == NULL)
		die("store");
	kv_dur_opts o = {.dir = dir, .mode = KV_FSYNC_NONE, .store = s, .dedup = d};
	if (kv_dur_open(&o, &dur, &rep, err, sizeof(err)) != KV_OK)
		die(err);
	if (kv_dur_log_put(dur, "user:1", 6, "alice", 5, NULL, NULL, NULL) != KV_OK ||
	    kv_dur_log_put(dur, "user:2", 6, "bob", 3, &dd, NULL, NULL) != KV_OK ||
	    kv_dur_log_del(dur, "user:1", 6, &dd, NULL, NULL) != KV_OK ||
	    kv_dur_log_mput(dur, 2, ks, vs, &dd, NULL, NULL) != KV_OK ||
	    kv_dur_log_range_del(dur, "k", 1, "k2", 2, NULL) != KV_OK ||
	    kv_dur_log_range_del(dur, "user:", 5, "", 0, NULL) != KV_OK ||
	    kv_dur_log_dedup(dur, &dd, KV_ENOTFOUND, "gone", 4, NULL) != KV_OK ||
	    kv_dur_sync(dur) != KV_OK)
		die("log");
	kv_dur_close(dur);
	kv_dedup_destroy(d);
	kv_store_destroy(s);
	seg = read_file(dir, "wal-0000000000000001.log", &n);
	fz_rmdir(dir);

	static const char *names[] = {"put",       "put-dedup",      "del-dedup", "mput-dedup",
	                              "range-del", "range-del-open", "dedup"};
	if ((all = malloc(n)) == NULL)
		die("out of memory");
	size_t off = KV_WAL_HEADER_SIZE;
	for (size_t i = 0; off + KV_WAL_RECORD_HEADER <= n; i++) {
		uint32_t len = kv_get32(seg + off + 8);
		uint8_t one[512];
		if (i >= sizeof(names) / sizeof(names[0]) || len + 2 > sizeof(one))
			die("unexpected log contents");
		kv_put16(one, (uint16_t)len);
		memcpy(one + 2, seg + off + KV_WAL_RECORD_HEADER, len);
		seed(h, names[i], one, len + 2);
		memcpy(all + nall, one, len + 2);
		nall += len + 2;
		off += KV_WAL_RECORD_HEADER + len;
	}
	seed(h, "all", all, nall);
	free(all);
	free(seg);
}

static void
seeds_snap(void)
{
	const char *h = "fuzz_snap_load";
	char dir[256], err[256];
	kv_snap_writer *w;
	uint8_t *f;
	size_t n;

	for (int full = 0; full < 2; full++) {
		fz_tmpdir(dir, sizeof(dir));
		if (kv_snap_begin(dir, 5, &w, err, sizeof(err)) != KV_OK)
			die(err);
		if (full) {
			uint8_t dd[36] = {77, 0, 0, 0, 0, 0, 0, 0, 9};
			if (kv_snap_add(w, 0, "user:1", 6, "alice", 5) != KV_OK ||
			    kv_snap_add(w, 0, "user:2", 6, "", 0) != KV_OK ||
			    kv_snap_add(w, 1, "user:1", 6, dd, sizeof(dd)) != KV_OK)
				die("snap add");
		}
		if (kv_snap_commit(w, err, sizeof(err)) != KV_OK)
			die(err);
		f = read_file(dir, "snap-0000000000000005.dat", &n);
		fz_rmdir(dir);
		seed_ctl(h, full ? "entries" : "empty", 0x00, f, n);
		seed_ctl(h, full ? "entries-fix-neighbours" : "empty-fix-neighbours", 0x03, f, n);
		free(f);
	}
}

/* The replication stream: a batch a backup gets, and the answers. */
static void
seeds_replicate(void)
{
	const char *h = "fuzz_replicate";
	static const uint8_t put[] = {1, 0, 2, 0, 0, 0, 'k', '1', 1, 0, 0, 0, 'v'};
	kv_repl_rec recs[2] = {
	    {.leader_epoch = 3, .lsn = 10, .start = B("k"), .payload = {put, sizeof(put)}},
	    {.leader_epoch = 3, .lsn = 11, .start = B(""), .payload = {put, sizeof(put)}}};
	kv_repl_msg r = {.from_node = 1,
	                 .stream_id = 5ull << 32 | 1,
	                 .seq = 2,
	                 .commit_lsn = 9,
	                 .nrecs = 2,
	                 .recs = recs};
	kv_resp ok = {.request_id = 1, .has_rack = true, .rack = {.acked_seq = 2, .acked_lsn = 11}};
	kv_resp gap = {
	    .request_id = 2,
	    .has_rack = true,
	    .rack = {.acked_seq = 1, .acked_lsn = 9, .status = KV_EBUSY, .error = "gap"}};
	kv_bytes cpay[1] = {{put, sizeof(put)}};
	kv_repl_msg cp = {.from_node = 1,
	                  .stream_id = 5ull << 32 | 2,
	                  .seq = 1,
	                  .copy = {.set = true,
	                           .leader_epoch = 3,
	                           .start = B("k"),
	                           .end = B("z"),
	                           .first = true,
	                           .last = true,
	                           .nrecs = 1,
	                           .recs = cpay}};
	kv_repl_msg en = {
	    .from_node = 2,
	    .stream_id = 6ull << 32 | 1,
	    .seq = 1,
	    .end = {
	        .set = true, .leader_epoch = 4, .start = B("k"), .old_primary = 1, .end_lsn = 11}};
	kv_resp dv = {.request_id = 3,
	              .has_rack = true,
	              .rack = {.acked_seq = 1, .acked_lsn = 0, .diverged = true}};
	nng_msg *m;

	seed_msg(h, "replicate", kv_repl_encode(&r, 4, 1, B("tok"), &m), m);
	r.packed = true;
	seed_msg(h, "replicate-packed", kv_repl_encode(&r, 4, 1, B("tok"), &m), m);
	seed_msg(h, "copy", kv_repl_encode(&cp, 4, 1, B(""), &m), m);
	seed_msg(h, "end", kv_repl_encode(&en, 4, 2, B(""), &m), m);
	seed_msg(h, "ack-diverged", kv_data_resp_encode(&dv, &m), m);
	seed_msg(h, "ack", kv_data_resp_encode(&ok, &m), m);
	seed_msg(h, "ack-gap", kv_data_resp_encode(&gap, &m), m);
}

void
kvmc_server_seeds(void)
{
	seeds_replicate();
	seeds_requests();
	seeds_responses();
	seeds_server_admin();
	seeds_wal();
	seeds_dur();
	seeds_snap();
}
