/*
 * repl.c - the replication stream (repl.h; doc/replication.md "Writes").
 *
 * DESIGN.
 *
 * Routing table. kv_rs_apply_config builds an immutable array of routes,
 * one per range of the configuration (start, end, primary, leader epoch,
 * ISR, and - for ranges this node leads - the streams of its in-sync
 * backups), and swaps it in under tab_lock (write). Writes hold tab_lock
 * for reading from kv_rs_write_begin to kv_rs_write_end, so the route a
 * log tap points to stays valid through the append; backups hold it while
 * they check records.
 *
 * Streams (primary side). One per backup node, never freed before
 * kv_rs_destroy (a stream no route uses just idles). The log tap
 * (tap_fn, under the log's mutex) copies each record into the queue of
 * every in-sync backup of its range, so a queue is in lsn order. The
 * stream thread sends batches from `unsent` with up to WINDOW requests in
 * flight: on a link of its own to a tcp:// backup (kv_link; the thread
 * reads the answers itself, link_pump, sleeping in poll on the link and
 * `efd`), else through kv_rpc_async callers whose answers arrive on nng
 * threads (call_done). A record appended in an event loop's round wakes
 * the thread at the round's end (kv_defer), once for the round. The
 * answers (call_answer) advance the watermark `acked_lsn` and `unacked`, the
 * first record not acknowledged, whose lsn is published in the atomic
 * `pending` for the lock-free kv_rs_covered. Any failure (timeout, gap,
 * refusal) makes the stream start again: once nothing is in flight, a new
 * stream id (boot_id << 32 | generation), seq 1, from `unacked`. A stream id
 * never carries two different batches under one seq, so a backup can
 * answer a repeated seq from memory. A batch's records go packed in one
 * field (Replicate.packed_records) once an answer of the generation said
 * the backup reads them (stream.packed); before that, a message each.
 *
 * Backup side. One `insrc` per primary node: the stream id it follows, the
 * next seq, the last primary lsn applied and the local lsn that logged it.
 * Batches apply under in_mu, in seq order (a later one waits up to
 * GAP_WAIT_MS for its predecessor, then is refused), record by record, and
 * the answer waits until the local log holds the last applied record.
 *
 * Waiting replies. kv_rs_notify parks (lsn, done) in the waiter list; a
 * sweep after every acknowledgement, and every POLL_MS from each stream
 * thread, completes those covered or past their deadline.
 *
 * Copies (catch-up). kv_rs.jobs lists the copies in progress, one per
 * (replica, range), under tab_lock; a job's copy marker sits in its
 * stream's queue (entry.kind ENT_COPY) before the range's records, and the
 * stream thread sends the copy when it reaches it (send_copy_locked),
 * starting again from the first step in every new generation. Markers
 * leave the queue only on their own last answer (marker_done_locked); the
 * watermark never passes one. Answers complete in any order: a marker's
 * last answer that comes while an earlier marker is unanswered is kept on
 * the entry (done_early, for its generation) and applied when the marker
 * becomes the first unacknowledged entry (settle_locked). ENT_END markers carry a new primary's end
 * of the previous leader epoch the same way. A stream counts for the commit point (stream.counts)
 * while its backup is in the ISR of a range this node leads or about to join one.
 *
 * Catch-up from a replica's own data (doc/replication.md, the section of
 * that name; catchup.h). Primary side: the tap also adds every record of a
 * replicated range led here to kv_rs.buf (buf_mu, CU_MAX bytes); install
 * takes the buffered records of the range (by reference, into the job) and
 * flags the copy marker entry.cu: the stream sends them as catch-up steps
 * (send_catchup_locked) instead of the copy, and turns back to the copy in
 * a new generation when the replica refuses (call_done). Every time a
 * stream stops carrying a range it carried, stream.breaks grows
 * (note_breaks_locked and the drops); every batch carries it. Backup side:
 * kv_rs.pos (in_mu) holds this node's positions, made by a copy's or
 * catch-up's last step, moved by record batches while no break came,
 * forgotten (on disk first) before a copy drops their range, cut to the
 * configuration; the positions thread (pos_main) writes them to
 * repl-positions, never past the log's synced lsn.
 *
 * Transfers (doc/replication.md "Primary transfer"). Before a
 * configuration that hands a range led here to a backup is applied, the
 * range refuses writes (route.draining) while its backups acknowledge its
 * records (drain, at most DRAIN_MS). At the apply, kv_rs.demos records
 * whether the new primary had every record of it (route.last_lsn, the
 * range's last record queued); that decides this node's answer to the new
 * primary's end. The new primary, on an in-sync answer from the old
 * primary, asks the controller to end the fence (stream.unfence).
 *
 * Lock order (doc/threads.md): tab_lock (read or write) -> [dur barrier,
 * stripes, store, log mutex] -> stream.mu; in_mu -> tab_lock -> [dur]
 * (apply_config takes in_mu, then tab_lock for writing); wmu is a leaf,
 * and callbacks run with no lock of ours held.
 */
#include "shardserver/repl/repl.h"
#include "common/defer.h"
#include "common/err.h"
#include "common/fileio.h"
#include "common/log.h"
#include "common/rpc.h"
#include "common/slice.h"
#include "proto/repl_codec.h"
#include "shardserver/repl/catchup.h"
#include "shardserver/repl/recent.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define COMP "repl"

#define WINDOW          8                    /* Replicate requests in flight per stream */
#define BATCH_RECS      1024u                /* records per Replicate */
#define BATCH_BYTES     (4u * 1024u * 1024u) /* payload bytes per Replicate (at least one record) */
#define CALL_MS         2000u                /* a Replicate's answer deadline */
#define CONNECT_MS      250u                 /* a link's connect and handshake, at most */
#define POLL_MS         50                   /* stream threads wake at least this often */
#define RETRY_MS        100u                 /* pause before a stream starts again */
#define REFUSALS_LOGGED 10u                  /* refusals in a row before they are logged */
#define REFUSAL_LOG_MS  5000u                /* at most one such line per stream this often */
#define GAP_WAIT_MS     50                   /* a backup waits this long for a missing batch */
#define END_WAIT_MS     50                   /* ... for the old primary's records up to an end */
#define MAX_STREAMS     64u                  /* backups one node streams to */
#define SPARE_RECS      1024u                /* acknowledged record entries a stream keeps */
#define SPARE_DATA      256u                 /* data bytes a record entry has, at least */
#define RECENT          1024u                /* entries a stream remembers for prefetches */
#define AHEAD           8u                   /* entries a walk brings in ahead of itself */
#define BATCH_AHEAD     128u                 /* entries a batch's walk brings in at its start */
#define MAX_SOURCES     64u                  /* primaries one node follows */
#define DEFAULT_WAIT    3000u                /* default env.wait_ms */
#define SHRINK_MS       1000u /* a backup silent this long with records outstanding: shrink */
#define ASK_AGAIN_MS    500u  /* pause between two shrink requests for one backup */
#define COPY_RECS       1024u /* records per copy step */
#define COPY_BYTES      (1024u * 1024u) /* key and value bytes per copy step (at least one) */
#define CATCH_MAX       (256u * 1024u * 1024u) /* queued bytes a stream outside every ISR may hold */
#define EXPAND_MS       1000u                  /* pause between two expand requests for one range */
#define INSTALL_MS      1000u /* pause before copying again after a queue overflow */
#define DRAIN_MS        30u   /* longest a range handed to another primary refuses writes first */
/* Payload bytes of recent records kept for catch-ups from a replica's own
 * data (doc/replication.md "Catch-up from the replica's own data"). */
#define CU_MAX            (64u * 1024u * 1024u)
#define POS_SAVE_MS       100u  /* the positions file is written at most this often */
#define POS_FSYNC_NONE_MS 1000u /* --fsync none: the log synced for positions this often */
#define POS_FILE          "repl-positions" /* ... in the data dir */

/* What a queue entry is. */
enum {
	ENT_REC = 0, /* a log record of a range this node leads */
	ENT_COPY,    /* marker: copy the range (start, end) before what follows */
	ENT_END,     /* marker: this node's end of the previous leader epoch of a range */
	ENT_DEAD,    /* a marker no longer wanted (its copy was dropped): skipped */
};

/* One queued record. */
typedef struct entry {
	/* What a walk of the queue reads comes first (the first 72 bytes). */
	struct entry *next;    /* the next in lsn order */
	uint64_t lsn;          /* ENT_REC: the primary's lsn */
	uint64_t leader_epoch; /* its range's leader epoch */
	int kind;              /* ENT_* */
	uint64_t qseq;         /* its place in the queue (stream.nqueued when pushed) */
	size_t slen;           /* bytes of the range start at data */
	size_t plen;           /* payload bytes after it (ENT_COPY, ENT_END: the range end) */
	size_t elen;           /* ENT_REC: bytes of its range's end after the payload */
	size_t cap;            /* ENT_REC: bytes at data (a spare is reused when they fit) */
	uint64_t mid;          /* markers: id, in queue order (stream.next_mid) */
	uint32_t old_primary;  /* ENT_END: the previous primary */
	uint64_t end_lsn;      /* ENT_END: its last lsn applied here; 0: unknown */
	/* Markers: the last answer arrived while an earlier marker was still
	 * unanswered (answers complete in any order), in generation done_gen;
	 * done_div: it answered the end as diverged. Applied once the marker
	 * reaches the head of the unacknowledged entries in that generation. */
	bool done_early;
	bool done_div;
	uint64_t done_gen;
	bool cu; /* ENT_COPY: a catch-up from the replica's own data is offered */
	/* ENT_COPY: the range had fewer in-sync members than it needs for
	 * writes when the copy was queued: its steps are not held for
	 * --copy-rate (copy_hold_ms), since the range takes no write until a
	 * replica is back in sync. */
	bool urgent;
	/* ... its first step (the probe) was sent in generation cu_gen; once
	 * answered (cu_known), only the records after cu_after follow. */
	uint64_t cu_gen;
	bool cu_known;
	uint64_t cu_after;
	uint64_t base; /* ENT_COPY, ENT_END: the log's last lsn when it was queued */
	uint64_t brk;  /* ENT_END: the stream's breaks when it was queued */
	/* ENT_COPY with cu, to the range's previous primary (old_primary, 0:
	 * none): this node's end of its leader epoch old_epoch, for its start
	 * old_boot, applied up to end_lsn at this node's lsn old_at
	 * (doc/replication.md "Case (b): the old primary"). */
	uint64_t old_epoch, old_boot, old_at;
	uint8_t data[]; /* start, then payload, then (ENT_REC) the range end */
} entry;

typedef struct stream stream;

/* A request in flight on a stream. */
typedef struct {
	stream *s;     /* its stream */
	int slot;      /* index in calls */
	uint64_t gen;  /* the generation it was sent in */
	entry *marker; /* a copy step or an end: its marker */
	uint64_t mid;  /* ... its id (a later entry may get its address) */
	bool last;     /* ... the marker's last request */
	bool cu;       /* ... a catch-up step */
	bool first;    /* ... its first */
} call_arg;

/* A range whose backup answered an end as diverged: it must leave the ISR
 * (then it is copied again). */
typedef struct diverged {
	struct diverged *next;
	kv_buf start, end;
	uint64_t leader_epoch;
} diverged;

struct stream {
	kv_rs *g;       /* owner */
	uint32_t node;  /* the backup */
	char addr[256]; /* its address (immutable after creation) */
	pthread_t thr;  /* the stream thread */
	bool started;   /* thr runs */
	/* The connection: a link (tcp://, no TLS: answers read by this
	 * thread) or nng's client (answers on nng's threads). */
	bool use_link;                /* immutable after creation */
	kv_link *link;                /* thread only: the link, NULL until made */
	uint32_t call_id[WINDOW];     /* thread only: request id of each link call */
	uint64_t call_due[WINDOW];    /* thread only: its answer deadline (monotonic) */
	uint32_t next_id;             /* thread only: id of the next link call */
	int efd;                      /* eventfd the thread polls with the link; -1: none */
	kv_rpc_client *cli;           /* thread only: nng's client, NULL until made */
	kv_rpc_async *calls[WINDOW];  /* thread only (and destroy): async callers */
	call_arg cargs[WINDOW];       /* argument of each caller */
	atomic_uint_fast64_t pending; /* lsn of the first unacknowledged record; UINT64_MAX: none */
	atomic_uint_fast64_t hole;    /* lsn of a record the queue could not take (no memory); 0 */
	/* Times the stream stopped carrying a range it carried (Replicate.breaks). */
	atomic_uint_fast64_t breaks;
	pthread_mutex_t mu;        /* protects everything below */
	pthread_cond_t cv;         /* signalled on a new record or an answer (stream_wake_locked) */
	bool asleep;               /* the thread polls efd (link): wake it there */
	entry *head, *tail;        /* the queue, lsn order; entries before unacked are freed
	                              by the thread */
	entry *unacked;            /* first record not acknowledged */
	entry *unsent;             /* first record not sent in this generation */
	uint64_t acked_lsn;        /* the backup's watermark */
	uint64_t gen;              /* generation: names the stream id */
	uint64_t next_seq;         /* seq of the next batch of this generation */
	bool busy[WINDOW];         /* caller in use */
	int inflight;              /* callers in use */
	bool need_reset;           /* start again once nothing is in flight */
	uint64_t retry_ns;         /* not before this (monotonic) */
	bool warned;               /* a refusal was logged in this generation */
	unsigned refusals;         /* refusals and failures since the last answer taken */
	uint64_t refusal_log_ns;   /* when the last run of them was logged (monotonic) */
	uint64_t progress_ns;      /* last acknowledgement progress, or when records became
	                              outstanding (monotonic) */
	uint64_t ask_ns;           /* no shrink request before this (monotonic) */
	uint64_t refused_epoch;    /* configuration epoch of the last refused request */
	uint64_t tail_lsn;         /* lsn of the last record queued */
	uint64_t qbytes;           /* bytes queued (unacknowledged entries and before) */
	entry *spare;              /* acknowledged record entries kept for the next records
	                              (linked by next), at most SPARE_RECS */
	unsigned nspare;           /* ... how many */
	bool overflow;             /* the queue outgrew CATCH_MAX while not counting */
	uint64_t next_mid;         /* id of the next marker */
	uint64_t done_mid;         /* the last marker the backup completed */
	bool want_install;         /* a range led here has this node outside its ISR, uncopied */
	uint64_t want_epoch;       /* ... install once this configuration is published */
	uint64_t install_ns;       /* ... not before this (monotonic) */
	entry *copying;            /* thread: the copy marker being sent, or NULL */
	uint64_t copy_gen;         /* thread: ... in this generation */
	bool copy_dedup;           /* thread: its exactly-once entries are sent */
	size_t copy_doff;          /* thread: ... up to here */
	kv_buf *copy_dd;           /* thread: its exactly-once records */
	size_t copy_ndd, copy_cap; /* thread: ... count, capacity */
	bool copy_dd_short;        /* thread: ... one could not be made (no memory) */
	kv_store_cursor copy_cur;  /* thread: its position in the store */
	uint64_t copy_logged;      /* thread: the marker whose copy was last logged */
	size_t cu_off;             /* thread: catch-up records of `copying` sent */
	/* A copy, a catch-up or an end answered in sync completed on this
	 * stream since this start: only then may the backup hold a position
	 * from this start, and a catch-up is offered (mu). */
	bool seeded;
	/* The backup answered in this generation that it reads packed records
	 * (kv_repl_ack.packed_ok): batches go packed. A new generation (a new
	 * connection, maybe another binary) asks again (mu). */
	bool packed;
	diverged *div;       /* ranges to have the backup leave the ISR of */
	uint64_t div_ns;     /* no removal request before this (monotonic) */
	diverged *unfence;   /* ranges whose fence (this backup) answered the end in
	                        sync: ask the controller to end the fence */
	uint64_t unfence_ns; /* no unfence request before this (monotonic) */
	uint64_t expand_ns;  /* thread: next expand check (monotonic) */
	/* Whether the commit point waits for this backup: it is in the ISR of
	 * a range this node leads, or about to join one (an expand). */
	atomic_bool counts;
	/* Ends sent to the backup and not answered in sync, plus ranges it
	 * diverged on and is still in the ISR of: the commit point waits while
	 * non-zero (doc/replication.md "Reconciliation"). */
	atomic_uint unreconciled;
	/* The last RECENT entries queued, by qseq modulo RECENT: a walk of the
	 * queue prefetches from here the entries it will reach (prefetch_ahead_locked; mu).
	 * An entry freed or reused since is still named here: only ever a
	 * prefetch's address, never read through. */
	uintptr_t recent[RECENT];
	uint64_t nqueued; /* entries ever queued: the next qseq */
};

/* The copy of a range to a replica outside its ISR, from the marker on
 * (doc/replication.md "Catch-up"). Listed in kv_rs.jobs (tab_lock); state
 * under its stream's mu. */
typedef enum {
	JOB_COPYING, /* the marker is queued */
	JOB_LIVE,    /* copied; catching up to `target` */
	JOB_EXPAND,  /* counted for the commit point; asks the controller once `target` is acked */
} job_state;

typedef struct job {
	struct job *next;
	stream *s;             /* the replica's stream */
	kv_buf start, end;     /* the range */
	uint64_t leader_epoch; /* its leader epoch */
	uint64_t mid;          /* its copy marker */
	job_state state;       /* s->mu */
	uint64_t target;       /* s->mu: the lsn to reach before the next state */
	uint64_t ask_ns;       /* s->mu: no expand request before this (monotonic) */
	bool keep;             /* apply_config: matched a route */
	/* A catch-up offered instead of the copy (install): the buffered records
	 * of the range after cu_from, up to base (the log's last lsn then).
	 * Immutable until job_free. */
	kv_cu_rec **cu;
	size_t ncu;
	uint64_t cu_from;
	uint64_t base;
} job;

/* One range of the configuration. */
typedef struct {
	kv_buf start, end;                  /* the range */
	uint32_t primary;                   /* its primary */
	uint64_t leader_epoch;              /* its leader epoch */
	uint32_t ninsync;                   /* ISR size (1 for a single range) */
	uint32_t insync[KV_MAX_REPLICAS];   /* the ISR */
	uint32_t min_insync;                /* writes need at least this many */
	uint32_t nbackups;                  /* this node leads it: ISR members but this one */
	stream *backups[KV_MAX_REPLICAS];   /* ... their streams */
	uint32_t nreplicas;                 /* the replica set (1 for a single range) */
	uint32_t replicas[KV_MAX_REPLICAS]; /* ... */
	bool copy[KV_MAX_REPLICAS];         /* ... this node leads it and copies that one: outside
	                                       the ISR and not down */
	uint32_t ncatch;                    /* this node leads it: replicas outside the ISR being
	                                       copied (tab_lock write to change) */
	stream *catch[KV_MAX_REPLICAS];     /* ... their streams */
	uint32_t fence;                     /* the transfer fence (Range.fence); 0: none */
	/* The lsn of the last record of the range queued on its streams, under
	 * this routing table or an earlier one (written by the tap under the
	 * log's mutex; carried over to the next table under tab_lock write). */
	atomic_uint_fast64_t last_lsn;
	/* The lsn of the last record of the range this node logged as its
	 * primary, under this table or an earlier one (also a multi-key write
	 * over several ranges, tap_span_fn; carried over like last_lsn): an old
	 * lead's `last` (doc/replication.md "Case (b): the old primary"). */
	atomic_uint_fast64_t own_lsn;
	/* Its primary role is being handed to an in-sync backup (a transfer in
	 * the configuration being applied): writes are refused until the
	 * backup has acknowledged the range's records (drain). Set under
	 * tab_lock write on the table in use; a new table starts without it. */
	bool draining;
	/* The node's catch-up buffer and its lock (kv_rs.buf, buf_mu), for the tap. */
	kv_cu_buf *buf;
	pthread_mutex_t *buf_mu;
} route;

/* A range this node led and another primary now leads, with this node in its
 * ISR (a primary transfer, doc/replication.md "Primary transfer"): whether
 * the new primary had every record of it when this node applied the
 * configuration (clean), which decides this node's answer to the new
 * primary's end. Listed in kv_rs.demos (in_mu). */
typedef struct demo {
	struct demo *next;
	kv_buf start, end;     /* the range in that configuration */
	uint32_t primary;      /* its new primary */
	uint64_t leader_epoch; /* its new leader epoch */
	bool clean;            /* nothing of it was outstanding on the stream to primary */
	uint64_t mark;         /* that stream's watermark then; 0: nothing acknowledged */
} demo;

/* This node's end of the previous leader epoch of a range it leads after a
 * failover (doc/replication.md "Case (b): the old primary"): its state of
 * the range at its lsn `at` is the effect of every record of old_primary
 * (start old_boot) of the range up to end_lsn. Listed in kv_rs.qends
 * (tab_lock write to change), while this node leads part of it at
 * leader_epoch. */
typedef struct qend {
	struct qend *next;
	kv_buf start, end;     /* the range when the end was taken */
	uint64_t leader_epoch; /* its leader epoch here */
	uint32_t old_primary;  /* the previous primary */
	uint64_t old_epoch;    /* ... its leader epoch */
	uint64_t old_boot;     /* ... its start whose records were applied up to end_lsn */
	uint64_t end_lsn;      /* the highest lsn of old_primary applied here then */
	uint64_t at;           /* this node's last lsn then */
} qend;

/* A range this node led and lost to a failover (another primary at a
 * higher leader epoch, this node a replica outside the ISR), in this start
 * (doc/replication.md "Case (b): the old primary"): its data of the range
 * is its state when it lost it, every record of the range it logged as
 * primary at old_epoch having lsn <= last. Listed in kv_rs.leds (in_mu)
 * while every range of the configuration overlapping it has that primary
 * and leader epoch with this node a replica, and no copy or catch-up of it
 * began. */
typedef struct led {
	struct led *next;
	kv_buf start, end;     /* the part of the range */
	uint32_t primary;      /* its new primary */
	uint64_t leader_epoch; /* its new leader epoch */
	uint64_t old_epoch;    /* the leader epoch it had here */
	uint64_t last;         /* the last lsn of a record of it logged here */
	/* Made at this start's first configuration for a range this node was
	 * outside the ISR of (old_epoch and last unknown): its data of it is
	 * what recovery left, the previous start's records up to
	 * kv_rs.rst_last (doc/replication.md "After a restart"). */
	bool restart;
} led;

#define MAX_QENDS 1024u /* ends kept (the oldest go first: a copy instead) */
#define MAX_LEDS  1024u /* old leads kept (past it: a copy instead) */

/* A primary this node backs up. */
typedef struct {
	uint32_t from;       /* its node id; 0: free slot */
	uint64_t stream_id;  /* the stream followed */
	uint64_t next_seq;   /* the batch expected next */
	uint64_t last_lsn;   /* the primary's lsn of the last record applied */
	uint64_t last_local; /* the local lsn that logged it */
	uint64_t max_lsn;    /* the highest lsn of the primary applied since this start */
	uint64_t max_boot;   /* ... the start (stream id's upper half) of the record that set it */
	uint64_t breaks;     /* Replicate.breaks of the last batch applied */
	bool breaks_known;   /* ... one was applied in this start */
	uint64_t cp_breaks;  /* ... at the first step of the copy or catch-up in progress */
	bool cu_on;          /* a catch-up in progress was accepted */
	kv_recent *recent;   /* the spans of the records applied last; NULL: none known */
	uint64_t end_stall;  /* max_lsn when a wait for an end last ran out (its stream
	                        stood still): no wait again until it moves */
} insrc;

/* A reply waiting for the commit point. */
typedef struct waiter {
	struct waiter *next;
	uint64_t lsn;         /* covered when every stream has it */
	uint64_t deadline_ns; /* monotonic */
	kv_wal_done_fn done;
	void *arg;
} waiter;

struct kv_rs {
	kv_rs_env env;        /* immutable */
	atomic_bool stopping; /* kv_rs_stop ran */

	pthread_rwlock_t tab_lock; /* protects routes, nroutes, jobs, qends (write: to change) */
	route *routes;             /* sorted by start */
	size_t nroutes;
	job *jobs;   /* copies to replicas outside the ISR */
	qend *qends; /* this node's ends of previous leader epochs, newest first */
	size_t nqends;

	pthread_mutex_t smu;          /* protects stream creation (streams, nstreams writes) */
	stream *streams[MAX_STREAMS]; /* published before nstreams grows */
	atomic_size_t nstreams;       /* streams usable (lock-free reads) */
	atomic_bool short_isr;        /* a range this node leads has too small an ISR */
	atomic_bool replica;          /* a replicated range lists this node among its replicas */
	/* Demotion fence (kv_rs_fenced): the monotonic time of the last
	 * demotion; 0: none. Written by the configuration thread only. */
	atomic_uint_fast64_t fence_ns;

	pthread_mutex_t in_mu; /* protects src, demos, leds and the backup-side counters */
	pthread_cond_t in_cv;  /* a batch was applied */
	insrc src[MAX_SOURCES];
	demo *demos; /* ranges this node lost to a primary transfer, still current */
	size_t ndemos;
	led *leds; /* ranges this node lost to a failover, data untouched since */
	size_t nleds;
	/* A restart (doc/replication.md "After a restart"; set by kv_rs_create,
	 * then read-only but rst_first, in_mu): the previous start's boot
	 * (lower half, as in stream ids; 0: not usable), the last lsn recovery
	 * replayed, the spans of its last records, and whether no configuration
	 * was applied yet. */
	uint64_t rst_boot;
	uint64_t rst_last;
	kv_cu_tail rst_tail;
	bool rst_first;

	pthread_mutex_t wmu; /* protects waiters */
	waiter *waiters;

	atomic_uint_fast64_t st_batches, st_packed, st_resends, st_applied, st_refused, st_asks,
	    st_demotions;
	atomic_uint_fast64_t st_copies, st_copy_recs, st_expand_asks, st_copied, st_diverged;
	/* env.copy_rate_mb_s: no copy step leaves before this (monotonic); each
	 * step sent moves it on by its bytes at that rate (copy_charge). */
	atomic_uint_fast64_t copy_next_ns;
	atomic_uint_fast64_t st_clean_demos, st_unclean_demos, st_ends_in_sync, st_unfence_asks;
	atomic_uint_fast64_t st_ends_ahead; /* ends answered in sync past them (recent.h) */
	atomic_uint_fast64_t st_catchups, st_cu_refused, st_copy_bytes, st_copy_urgent_bytes;
	atomic_uint_fast64_t st_copy_holds;

	/* Primary side: recent records of replicated ranges led here, for
	 * catch-ups. buf_mu protects buf; a leaf (the tap takes it under the
	 * log's mutex, install under tab_lock). */
	pthread_mutex_t buf_mu;
	kv_cu_buf buf;
	/* Backup side (in_mu): this node's positions and their file. */
	kv_cu_pos_set pos;
	char *pos_path;        /* NULL: no data dir, positions are not kept */
	char *pos_dir;         /* the data dir (a copy) */
	bool pos_dirty;        /* the file does not hold every position at its lsn yet */
	uint64_t pos_save_ns;  /* the file was last written (monotonic) */
	pthread_cond_t pos_cv; /* wakes the positions thread (kv_rs_stop) */
	pthread_t pos_thr;     /* writes the file every POS_SAVE_MS while pos_dirty */
	bool pos_started;
};

/* ------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------ */

static void
deadline_in(struct timespec *ts, unsigned ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

uint32_t
kv_rs_min_insync(const kv_config *c)
{
	/* The controller's --min-insync, published with every configuration
	 * (0 in configurations from before it existed: the primary alone). */
	return c->min_insync ? c->min_insync : 1;
}

/* Whether bound b is the key k (an empty end bound is the empty key). */
static bool
key_is(const kv_buf *b, const kv_bytes *k)
{
	return b->len == k->len && kv_key_cmp(b->data, b->len, k->p, k->len) == 0;
}

/* The route containing key, or NULL. Caller holds tab_lock. */
static const route *
find_route(const kv_rs *g, const void *key, size_t klen)
{
	size_t lo = 0, hi = g->nroutes;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const route *r = &g->routes[mid];
		if (kv_key_cmp(r->start.data, r->start.len, key, klen) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == 0)
		return NULL;
	const route *r = &g->routes[lo - 1];
	if (r->end.len && kv_key_cmp(key, klen, r->end.data, r->end.len) >= 0)
		return NULL;
	return r;
}

static void
routes_free(route *r, size_t n)
{
	for (size_t i = 0; r && i < n; i++) {
		kv_buf_fini(&r[i].start);
		kv_buf_fini(&r[i].end);
	}
	free(r);
}

/* ------------------------------------------------------------------------
 * Waiters
 * ------------------------------------------------------------------------ */

bool
kv_rs_covered(kv_rs *g, uint64_t lsn)
{
	size_t n = atomic_load_explicit(&g->nstreams, memory_order_acquire);

	for (size_t i = 0; i < n; i++) {
		stream *s = g->streams[i];
		uint64_t h;
		/* A replica outside every ISR (being copied) never counts. */
		if (!atomic_load_explicit(&s->counts, memory_order_relaxed))
			continue;
		h = atomic_load(&s->hole);
		if (atomic_load(&s->pending) <= lsn || (h != 0 && h <= lsn) ||
		    atomic_load_explicit(&s->unreconciled, memory_order_relaxed) != 0)
			return false;
	}
	return true;
}

/* Completes the waiters that are covered, past their deadline, or all of
 * them with `force` (non-zero). Called with no lock held. */
static void
sweep(kv_rs *g, int force)
{
	waiter *done = NULL, **pp;
	uint64_t now = kv_now_ns();

	pthread_mutex_lock(&g->wmu);
	pp = &g->waiters;
	while (*pp) {
		waiter *w = *pp;
		if (force || kv_rs_covered(g, w->lsn) || now >= w->deadline_ns) {
			*pp = w->next;
			w->next = done;
			done = w;
		} else {
			pp = &w->next;
		}
	}
	pthread_mutex_unlock(&g->wmu);
	while (done) {
		waiter *w = done;
		done = w->next;
		int st = force ? force : kv_rs_covered(g, w->lsn) ? KV_OK : KV_ETIMEDOUT;
		w->done(w->arg, st);
		free(w);
	}
}

int
kv_rs_notify(kv_rs *g, uint64_t lsn, kv_wal_done_fn done, void *arg)
{
	waiter *w;
	unsigned ms = g->env.wait_ms ? g->env.wait_ms : DEFAULT_WAIT;

	if (atomic_load(&g->stopping))
		return KV_ECLOSED;
	if (kv_rs_covered(g, lsn)) {
		done(arg, KV_OK);
		return KV_OK;
	}
	/* malloc: calloc skips the thread's cache (common/mem.h), and every
	 * field is set here. */
	if ((w = malloc(sizeof(*w))) == NULL)
		return KV_ENOMEM;
	*w = (waiter){.lsn = lsn,
	              .deadline_ns = kv_now_ns() + (uint64_t)ms * 1000000u,
	              .done = done,
	              .arg = arg};
	pthread_mutex_lock(&g->wmu);
	w->next = g->waiters;
	g->waiters = w;
	pthread_mutex_unlock(&g->wmu);
	/* An acknowledgement may have come between the check and the push;
	 * a stop too. */
	sweep(g, atomic_load(&g->stopping) ? KV_ECLOSED : 0);
	return KV_OK;
}

/* ------------------------------------------------------------------------
 * Primary side: the tap and the streams
 * ------------------------------------------------------------------------ */

/* Frees the ranges s's backup diverged on (caller holds s->mu, or no
 * other thread runs). */
static void
div_free_all(stream *s)
{
	for (int k = 0; k < 2; k++) {
		diverged **l = k ? &s->unfence : &s->div;
		while (*l) {
			diverged *d = *l;
			*l = d->next;
			kv_buf_fini(&d->start);
			kv_buf_fini(&d->end);
			free(d);
		}
	}
}

/* A new entry for [m's range) at m's leader epoch, or NULL when out of
 * memory. */
static diverged *
div_new(const entry *m)
{
	diverged *d = calloc(1, sizeof(*d));

	if (d == NULL || kv_buf_set(&d->start, m->data, m->slen) != 0 ||
	    kv_buf_set(&d->end, m->data + m->slen, m->plen) != 0) {
		if (d) {
			kv_buf_fini(&d->start);
			kv_buf_fini(&d->end);
		}
		free(d);
		return NULL;
	}
	d->leader_epoch = m->leader_epoch;
	return d;
}

/* Wakes the stream thread (a new record, an answer, a stop). Caller holds
 * s->mu. */
static void
stream_wake_locked(stream *s)
{
	pthread_cond_signal(&s->cv);
	if (s->asleep) {
		s->asleep = false;
		(void)eventfd_write(s->efd, 1);
	}
}

/* Wakes the stream thread (kv_defer: at the end of a round). */
static void
stream_kick(void *arg)
{
	stream *s = arg;

	pthread_mutex_lock(&s->mu);
	stream_wake_locked(s);
	pthread_mutex_unlock(&s->mu);
}

/* Asks the cache for the entries `from` to `to` places after e in s's
 * queue, four lines each (the header and the start of the data: what a
 * walk and a batch's encoding read). The queue is a list of entries
 * written on other threads: a walk that met each in turn waited a memory
 * miss per record (most of the stream thread's own time in its walks).
 * Caller holds s->mu. */
static inline void
prefetch_ahead_locked(const stream *s, const entry *e, unsigned from, unsigned to)
{
	for (unsigned j = from; j <= to; j++) {
		const char *p = (const char *)s->recent[(e->qseq + j) & (RECENT - 1)];
		if (p == NULL)
			continue;
		__builtin_prefetch(p);
		__builtin_prefetch(p + 128);
		__builtin_prefetch(p + 192);
		__builtin_prefetch(p + 256);
	}
}

/* Appends e to s's queue and wakes the stream thread, or on an event loop
 * leaves the wake to the end of its round (common/defer.h): the thread
 * then sends the round's records in one batch, woken once. Caller holds
 * s->mu. */
static void
push_locked(stream *s, entry *e)
{
	e->next = NULL;
	e->qseq = s->nqueued++;
	s->recent[e->qseq & (RECENT - 1)] = (uintptr_t)e;
	if (s->tail)
		s->tail->next = e;
	else
		s->head = e;
	s->tail = e;
	s->qbytes += sizeof(*e) + e->slen + e->plen + e->elen;
	if (s->unacked == NULL) {
		s->unacked = e;
		s->progress_ns = kv_now_ns();
	}
	/* The first unacknowledged record (markers may be ahead of it). */
	if (e->kind == ENT_REC && atomic_load(&s->pending) == UINT64_MAX)
		atomic_store(&s->pending, e->lsn);
	if (s->unsent == NULL)
		s->unsent = e;
	if (!kv_defer(stream_kick, s))
		stream_wake_locked(s);
}

/* Queues a marker (ENT_COPY: [start, end); ENT_END: start). Caller holds
 * s->mu. Returns it, or NULL when out of memory. */
static entry *
push_marker_locked(stream *s, int kind, const kv_buf *start, const kv_buf *end,
                   uint64_t leader_epoch)
{
	size_t el = end ? end->len : 0;
	entry *e = malloc(sizeof(*e) + start->len + el);

	if (e == NULL)
		return NULL;
	*e = (entry){.lsn = s->tail_lsn, .leader_epoch = leader_epoch, .kind = kind};
	e->mid = ++s->next_mid;
	e->slen = start->len;
	e->plen = el;
	if (start->len)
		memcpy(e->data, start->data, start->len);
	if (el)
		memcpy(e->data + start->len, end->data, el);
	push_locked(s, e);
	return e;
}

/* The log tap: queues the record for every in-sync backup of its range.
 * Runs under the log's mutex, in lsn order. */
static void
tap_fn(void *arg, uint64_t lsn, const uint8_t *p, size_t n)
{
	route *r = arg;

	atomic_store_explicit(&r->last_lsn, lsn, memory_order_relaxed);
	atomic_store_explicit(&r->own_lsn, lsn, memory_order_relaxed);
	if (r->nreplicas > 1) {
		kv_bytes st = {r->start.data, r->start.len}, en = {r->end.data, r->end.len};
		pthread_mutex_lock(r->buf_mu);
		kv_cu_buf_add(r->buf, lsn, r->leader_epoch, &st, &en, p, n);
		pthread_mutex_unlock(r->buf_mu);
	}
	for (uint32_t i = 0; i < r->nbackups + r->ncatch; i++) {
		stream *s = i < r->nbackups ? r->backups[i] : r->catch[i - r->nbackups];
		entry *e;
		if (i >= r->nbackups && !atomic_load(&s->counts)) {
			/* A replica being copied: the queue is bounded (a replica that
			 * is down would otherwise hold every record); past the bound
			 * the copy starts again later. */
			bool over;
			pthread_mutex_lock(&s->mu);
			over = s->overflow || s->qbytes > CATCH_MAX;
			s->overflow = over;
			pthread_mutex_unlock(&s->mu);
			if (over) {
				atomic_fetch_add(&s->breaks, 1);
				continue;
			}
		}
		size_t need = r->start.len + n + r->end.len;
		pthread_mutex_lock(&s->mu);
		e = s->spare;
		if (e != NULL && e->cap >= need) {
			s->spare = e->next;
			s->nspare--;
			/* The next record's spare, last touched by the stream
			 * thread: on its way while this one is filled. */
			if (s->spare != NULL) {
				__builtin_prefetch(s->spare, 1);
				__builtin_prefetch((const char *)s->spare + 128, 1);
				__builtin_prefetch((const char *)s->spare + 192, 1);
			}
		} else {
			/* 256, 512 or 1024 bytes, so that spares fit the next
			 * records of about the same size; larger ones exactly. */
			size_t cap = SPARE_DATA;
			while (cap < need && cap < 4 * SPARE_DATA)
				cap *= 2;
			if (cap < need)
				cap = need;
			if ((e = malloc(sizeof(*e) + cap)) != NULL)
				e->cap = cap;
		}
		if (e == NULL) {
			pthread_mutex_unlock(&s->mu);
			/* The stream can never cover this lsn: replies that need it
			 * time out rather than claim a copy that does not exist. */
			uint_fast64_t zero = 0;
			atomic_compare_exchange_strong(&s->hole, &zero, lsn);
			atomic_fetch_add(&s->breaks, 1);
			continue;
		}
		size_t cap = e->cap;
		*e = (entry){
		    .lsn = lsn, .leader_epoch = r->leader_epoch, .kind = ENT_REC, .cap = cap};
		e->slen = r->start.len;
		e->plen = n;
		e->elen = r->end.len;
		if (r->start.len)
			memcpy(e->data, r->start.data, r->start.len);
		memcpy(e->data + r->start.len, p, n);
		if (r->end.len)
			memcpy(e->data + r->start.len + n, r->end.data, r->end.len);
		s->tail_lsn = lsn;
		push_locked(s, e);
		pthread_mutex_unlock(&s->mu);
	}
}

/* The log tap of a write over several replicated ranges without backups
 * (kv_rs_write_begin): only the catch-up buffer takes its record, under
 * the span of those ranges. Runs under the log's mutex. */
static void
tap_span_fn(void *arg, uint64_t lsn, const uint8_t *p, size_t n)
{
	kv_rs_op *op = arg;
	kv_rs *g = op->g;

	pthread_mutex_lock(&g->buf_mu);
	kv_cu_buf_add(&g->buf, lsn, op->span_epoch, &op->span_start, &op->span_end, p, n);
	pthread_mutex_unlock(&g->buf_mu);
	/* The op holds tab_lock (read): the routes stay. */
	for (size_t i = 0; i < g->nroutes; i++) {
		route *r = &g->routes[i];
		if ((op->span_end.len == 0 || kv_key_cmp(r->start.data, r->start.len,
		                                         op->span_end.p, op->span_end.len) < 0) &&
		    (r->end.len == 0 ||
		     kv_key_cmp(op->span_start.p, op->span_start.len, r->end.data, r->end.len) < 0))
			atomic_store_explicit(&r->own_lsn, lsn, memory_order_relaxed);
	}
}

/* The lsn of the first unacknowledged record, or UINT64_MAX. Caller holds
 * s->mu. */
static uint64_t
first_unacked_locked(const stream *s)
{
	for (const entry *e = s->unacked; e; e = e->next)
		if (e->kind == ENT_REC)
			return e->lsn;
	return UINT64_MAX;
}

static void marker_done_locked(stream *s, entry *m, bool div);

/* End m was not reconciled: the backup leaves the ISR of the parts of m's
 * range this node leads at m's leader epoch, and is copied again; until it
 * has, s->unreconciled stays up (the entry in s->div holds it; out of
 * memory, it is let go). Caller holds s->mu. */
static void
end_diverged_locked(stream *s, const entry *m)
{
	diverged *d = div_new(m);

	if (d == NULL) {
		atomic_fetch_sub(&s->unreconciled, 1);
	} else {
		d->next = s->div;
		s->div = d;
		s->div_ns = 0;
	}
	atomic_fetch_add(&s->g->st_diverged, 1);
}

/* Passes the entries the watermark covers (records up to acked_lsn, dead
 * markers, markers answered early in this generation) and publishes
 * `pending`. A live marker stops it: only its own answer passes it
 * (call_done). Caller holds s->mu. */
static void
settle_locked(stream *s)
{
	for (;;) {
		if (s->unacked)
			prefetch_ahead_locked(s, s->unacked, 1, AHEAD);
		while (s->unacked &&
		       ((s->unacked->kind == ENT_REC && s->unacked->lsn <= s->acked_lsn) ||
		        s->unacked->kind == ENT_DEAD)) {
			prefetch_ahead_locked(s, s->unacked, AHEAD + 1, AHEAD + 1);
			if (s->unsent == s->unacked)
				s->unsent = s->unacked->next;
			s->unacked = s->unacked->next;
		}
		entry *m = s->unacked;
		if (m == NULL || m->kind == ENT_REC || !m->done_early || m->done_gen != s->gen)
			break;
		/* Its last answer came before an earlier marker's: the backup
		 * applied the batches of this generation in order, so it holds
		 * everything before it too. */
		marker_done_locked(s, m, m->done_div);
	}
	atomic_store(&s->pending, first_unacked_locked(s));
}

/* Moves the watermark to lsn. Caller holds s->mu. Returns whether it moved. */
static bool
advance_locked(stream *s, uint64_t lsn)
{
	if (lsn <= s->acked_lsn)
		return false;
	s->acked_lsn = lsn;
	s->progress_ns = kv_now_ns();
	settle_locked(s);
	return true;
}

/* The backup completed marker m, the first unacknowledged entry (its
 * copy's last step, or the end; div: the end was answered as diverged). Moves past it
 * without settling what follows. Caller holds s->mu. */
static void
marker_done_locked(stream *s, entry *m, bool div)
{
	if (m->kind == ENT_END) {
		if (div) {
			end_diverged_locked(s, m);
			KV_WARN(COMP,
			        "backup diverged from this primary's end of the previous leader "
			        "epoch: it leaves the ISR and is copied again",
			        "node=%u leader_epoch=%llu end_lsn=%llu", s->node,
			        (unsigned long long)m->leader_epoch,
			        (unsigned long long)m->end_lsn);
		} else {
			atomic_fetch_sub(&s->unreconciled, 1);
			if (m->old_primary == s->node) {
				/* The old primary itself, kept as the transfer fence, had
				 * exactly this node's records of the range: it stays in the
				 * ISR and the fence may end (doc/replication.md "Primary
				 * transfer"). Out of memory the fence stays (the range is not
				 * moved again) until the old primary leaves the ISR. */
				diverged *d = div_new(m);
				atomic_fetch_add(&s->g->st_ends_in_sync, 1);
				if (d != NULL) {
					d->next = s->unfence;
					s->unfence = d;
					s->unfence_ns = 0;
				}
				KV_INFO(
				    COMP,
				    "old primary answered this primary's end in sync: it stays in "
				    "the ISR without a copy",
				    "node=%u leader_epoch=%llu end_lsn=%llu", s->node,
				    (unsigned long long)m->leader_epoch,
				    (unsigned long long)m->end_lsn);
			}
		}
	} else if (m->cu) {
		atomic_fetch_add(&s->g->st_catchups, 1);
		KV_INFO(COMP, "replica outside the ISR caught up from its own data, without a copy",
		        "node=%u", s->node);
	} else {
		atomic_fetch_add(&s->g->st_copied, 1);
		KV_INFO(COMP, "range copied to a replica outside the ISR", "node=%u", s->node);
	}
	if (m->kind == ENT_COPY || !div)
		s->seeded = true;
	s->done_mid = m->mid;
	if (s->unsent == m)
		s->unsent = m->next;
	s->unacked = m->next;
}

/* Whether marker m (id mid) is still among the unacknowledged entries
 * sent in this generation (a dropped queue freed it, and a marker queued
 * since may have its address: the id tells them apart). Caller holds s->mu.
 * The walk is short: what precedes a sent marker and is unacknowledged is
 * in flight. */
static bool
queued_locked(const stream *s, const entry *m, uint64_t mid)
{
	for (const entry *e = s->unacked; e != NULL && e != s->unsent; e = e->next)
		if (e == m && e->mid == mid)
			return true;
	return false;
}

/* Whether the marker of call ca is s->unsent (itself, not a later marker
 * at its address). Caller holds s->mu. */
static bool
unsent_is_locked(const stream *s, const call_arg *ca)
{
	return ca->marker != NULL && s->unsent == ca->marker && s->unsent->mid == ca->mid;
}

/* The answer to one Replicate: rv 0 with its n bytes at p, or the call's
 * failure. On nng's thread (call_done) or the stream thread (a link's),
 * with no lock held. */
static void
call_answer(call_arg *ca, int rv, const uint8_t *p, size_t n)
{
	stream *s = ca->s;
	kv_repl_ack a = {0};
	char detail[128] = ""; /* the backup's reason for a refusal */
	bool moved = false;

	if (rv == 0)
		rv = kv_repl_ack_decode_detail(p, n, &a, detail, sizeof(detail));
	pthread_mutex_lock(&s->mu);
	s->busy[ca->slot] = false;
	s->inflight--;
	if (rv == 0 && a.status == KV_OK) {
		moved = advance_locked(s, a.acked_lsn);
		if (a.packed_ok && ca->gen == s->gen)
			s->packed = true;
		bool refused = false;
		if (ca->marker != NULL && ca->cu && ca->first && ca->gen == s->gen && !a.diverged &&
		    unsent_is_locked(s, ca) && ca->marker->cu && ca->marker->cu_gen == ca->gen) {
			/* The probe's answer: the replica's position. */
			ca->marker->cu_known = true;
			ca->marker->cu_after = a.position;
		}
		if (ca->marker != NULL && ca->cu && ca->gen == s->gen &&
		    (a.diverged || (ca->last && !a.caught_up)) &&
		    (unsent_is_locked(s, ca) || queued_locked(s, ca->marker, ca->mid))) {
			/* The replica holds no position the catch-up can start from
			 * (or does not know catch-ups): the copy, from its first step,
			 * in a new generation. */
			refused = true;
			if (ca->marker->cu) {
				ca->marker->cu = false;
				atomic_fetch_add(&s->g->st_cu_refused, 1);
				KV_INFO(COMP,
				        "replica refused a catch-up from its own data: copying the "
				        "range instead",
				        "node=%u leader_epoch=%llu", s->node,
				        (unsigned long long)ca->marker->leader_epoch);
			}
			s->copying = NULL;
			if (!s->need_reset) {
				s->need_reset = true;
				s->retry_ns = kv_now_ns();
			}
		}
		if (ca->marker != NULL && !refused) {
			/* A copy step is progress too (no shrink during a long copy). */
			s->progress_ns = kv_now_ns();
			if (ca->last && ca->gen == s->gen &&
			    queued_locked(s, ca->marker, ca->mid)) {
				/* Answers complete in any order: one that comes before
				 * an earlier marker's is kept on its marker, which the
				 * settling passes in queue order. */
				ca->marker->done_early = true;
				ca->marker->done_div = a.diverged;
				ca->marker->done_gen = ca->gen;
				settle_locked(s);
				moved = true;
			}
		}
		s->warned = false;
		s->refusals = 0;
	} else if (ca->gen == s->gen && !s->need_reset) {
		int why = rv ? rv : a.status;
		uint64_t now = kv_now_ns();
		if (rv == 0 && a.status == KV_ESTALE && ca->marker != NULL &&
		    (unsent_is_locked(s, ca) || queued_locked(s, ca->marker, ca->mid)) &&
		    ca->marker->kind == ENT_END) {
			/* The backup's configuration gives the end's start to a later
			 * leader epoch (its range, or the part of it the end names,
			 * went to another primary before the backup took the end).
			 * Sent again it would be refused again, holding every entry
			 * behind it for good: it is not sent again, and counts as not
			 * reconciled for the parts this node still leads (copied
			 * again), which is never wrong. */
			entry *m = ca->marker;
			m->kind = ENT_DEAD;
			end_diverged_locked(s, m);
			KV_WARN(
			    COMP,
			    "backup refused an end as of a deposed leader epoch: it is dropped, "
			    "and the backup leaves the ISR of the parts still led here",
			    "node=%u leader_epoch=%llu why=\"%s\"", s->node,
			    (unsigned long long)m->leader_epoch, detail);
		}
		s->need_reset = true;
		s->retry_ns = now + RETRY_MS * 1000000ull;
		if (!s->warned && why != KV_EBUSY)
			KV_WARN(COMP, "backup refused or did not answer, starting the stream again",
			        "node=%u err=%s why=\"%s\"", s->node, kv_errname(why), detail);
		s->warned = true;
		/* A busy backup is retried quietly; one that stays busy is not
		 * normal, and its reason is the first thing to know. */
		if (++s->refusals >= REFUSALS_LOGGED &&
		    now - s->refusal_log_ns >= REFUSAL_LOG_MS * 1000000ull) {
			/* What was refused: a marker is read only while queued. */
			const entry *m =
			    ca->marker != NULL && (unsent_is_locked(s, ca) ||
			                           queued_locked(s, ca->marker, ca->mid))
			        ? ca->marker
			        : NULL;
			s->refusal_log_ns = now;
			KV_INFO(COMP, "backup keeps refusing the stream; starting it again",
			        "node=%u times=%u err=%s why=\"%s\" what=%s start=\"%.*s\" "
			        "leader_epoch=%llu",
			        s->node, s->refusals, kv_errname(why), detail,
			        ca->marker == NULL   ? "records"
			        : m == NULL          ? "marker"
			        : m->kind == ENT_END ? "end"
			        : ca->cu             ? "catch-up"
			                             : "copy",
			        /* An empty start has no byte at data (the
			         * entry's end): a sanitizer's printf reads one. */
			        m ? (int)m->slen : 0, m && m->slen ? (const char *)m->data : "",
			        m ? (unsigned long long)m->leader_epoch : 0ull);
		}
	}
	stream_wake_locked(s);
	pthread_mutex_unlock(&s->mu);
	if (moved)
		sweep(s->g, 0);
}

/* The answer to one Replicate on nng's client (nng thread). */
static void
call_done(void *arg, int rv, nng_msg *reply)
{
	if (rv == 0) {
		call_answer(arg, 0, nng_msg_body(reply), nng_msg_len(reply));
		nng_msg_free(reply);
	} else {
		call_answer(arg, rv, NULL, 0);
	}
}

/* Whether the stream has its connection (thread only). */
static bool
stream_connected(const stream *s)
{
	return s->use_link ? s->link != NULL : s->cli != NULL;
}

/* Closes the link and fails its calls in flight with rv (thread only, no
 * lock held): the stream starts again (call_answer) on a new connection. */
static void
link_fail(stream *s, int rv)
{
	kv_link_close(s->link);
	s->link = NULL;
	for (int i = 0; i < WINDOW; i++) {
		pthread_mutex_lock(&s->mu);
		bool busy = s->busy[i];
		pthread_mutex_unlock(&s->mu);
		if (busy)
			call_answer(&s->cargs[i], rv, NULL, 0);
	}
}

/* Takes the link's answers, writes what waits for the kernel and fails
 * calls past their deadline (thread only, no lock held). */
static void
link_pump(stream *s)
{
	uint64_t now;
	int rv = 0;

	if (s->link == NULL)
		return;
	if (kv_link_want_write(s->link))
		rv = kv_link_flush(s->link);
	while (rv == 0) {
		bool got;
		uint32_t id;
		const uint8_t *p;
		size_t n;
		if ((rv = kv_link_recv(s->link, &got, &id, &p, &n)) != 0 || !got)
			break;
		for (int i = 0; i < WINDOW; i++) {
			/* busy is this thread's to set and clear on a link */
			if (s->busy[i] && s->call_id[i] == id) {
				call_answer(&s->cargs[i], 0, p, n);
				break;
			}
		}
	}
	if (rv != 0) {
		link_fail(s, rv == KV_EPROTO ? KV_EPROTO : KV_EUNAVAIL);
		return;
	}
	now = kv_now_ns();
	for (int i = 0; i < WINDOW; i++)
		if (s->busy[i] && now >= s->call_due[i]) {
			/* One late answer: the connection is not to be trusted with
			 * the others either. */
			link_fail(s, KV_ETIMEDOUT);
			return;
		}
}

/* Connects (thread only). Returns 0 or an error. */
static int
stream_connect(stream *s)
{
	int rv;

	if (s->use_link)
		return s->link != NULL ? KV_OK : kv_link_open(s->addr, CONNECT_MS, 0, &s->link);
	if (s->cli != NULL)
		return KV_OK;
	if ((rv = kv_rpc_client_create_tls(s->addr, s->g->env.tls, &s->cli)) != 0)
		return rv;
	for (int i = 0; i < WINDOW; i++) {
		if ((rv = kv_rpc_async_create(s->cli, call_done, &s->cargs[i], &s->calls[i])) != 0)
			return rv;
	}
	return KV_OK;
}

/* Sends r (its records, copy or end filled in) as the next batch of the
 * generation; marker/last name what a copy step or an end belongs to.
 * Caller holds s->mu and a free slot exists; it is released while encoding
 * and sending (only this thread frees entries). */
static void
send_locked(stream *s, kv_repl_msg *r, entry *marker, bool last)
{
	kv_rs *g = s->g;
	int slot = 0;
	nng_msg *msg = NULL;

	while (s->busy[slot])
		slot++;
	s->busy[slot] = true;
	s->inflight++;
	s->cargs[slot].gen = s->gen;
	s->cargs[slot].marker = marker;
	s->cargs[slot].mid = marker != NULL ? marker->mid : 0;
	s->cargs[slot].last = last;
	s->cargs[slot].cu = r->copy.set && r->copy.catchup;
	s->cargs[slot].first = r->copy.set && r->copy.first;
	r->from_node = g->env.node_id(g->env.arg);
	r->stream_id = (g->env.boot_id << 32) | (s->gen & 0xffffffffu);
	r->seq = s->next_seq++;
	pthread_mutex_unlock(&s->mu);
	int rv = kv_repl_encode(r, g->env.epoch(g->env.arg), r->from_node, g->env.auth, &msg);
	atomic_fetch_add(&g->st_batches, 1);
	if (rv == 0 && s->use_link) {
		s->call_id[slot] = s->next_id++ & 0x7fffffffu;
		s->call_due[slot] = kv_now_ns() + CALL_MS * 1000000ull;
		rv = s->link != NULL ? kv_link_send(s->link, s->call_id[slot], nng_msg_body(msg),
		                                    nng_msg_len(msg))
		                     : KV_ECLOSED;
		nng_msg_free(msg);
		if (rv != 0)
			link_fail(s, KV_EUNAVAIL); /* this call too: it is busy */
		pthread_mutex_lock(&s->mu);
		return;
	}
	if (rv == 0) {
		kv_rpc_async_call(s->calls[slot], msg, CALL_MS);
		pthread_mutex_lock(&s->mu);
		return;
	}
	pthread_mutex_lock(&s->mu);
	s->busy[slot] = false;
	s->inflight--;
	s->need_reset = true;
	s->retry_ns = kv_now_ns() + RETRY_MS * 1000000ull;
}

/* Sends the records from s->unsent up to the next marker. Caller holds
 * s->mu (released while sending). */
static void
send_batch_locked(stream *s)
{
	kv_repl_rec *rp;
	size_t n = 0, bytes = 0, cap = BATCH_RECS;
	entry *e = s->unsent;
	kv_repl_msg r = {0};

	rp = malloc(cap * sizeof(*rp));
	if (rp == NULL)
		return;
	if (e) {
		/* The entries queued behind e, up to BATCH_AHEAD, in one pass
		 * before the walk: a prefetch inside the walk made gcc 12 at -O3
		 * drop its n < cap bound (doc/testing.md). */
		uint64_t behind = s->nqueued - e->qseq - 1;
		prefetch_ahead_locked(s, e, 1,
		                      (unsigned)(behind < BATCH_AHEAD ? behind : BATCH_AHEAD));
	}
	while (e && e->kind == ENT_REC && n < cap && (n == 0 || bytes + e->plen <= BATCH_BYTES)) {
		rp[n++] = (kv_repl_rec){.leader_epoch = e->leader_epoch,
		                        .lsn = e->lsn,
		                        .start = {e->data, e->slen},
		                        .payload = {e->data + e->slen, e->plen}};
		bytes += e->plen;
		e = e->next;
	}
	s->unsent = e;
	r.nrecs = n;
	r.recs = rp;
	r.packed = s->packed;
	if (r.packed)
		atomic_fetch_add(&s->g->st_packed, 1);
	r.breaks = atomic_load(&s->breaks);
	send_locked(s, &r, NULL, false);
	free(rp);
}

/* Sends the end marker at s->unsent. Caller holds s->mu. */
static void
send_end_locked(stream *s)
{
	entry *m = s->unsent;
	kv_repl_msg r = {.end = {.set = true,
	                         .leader_epoch = m->leader_epoch,
	                         .start = {m->data, m->slen},
	                         .old_primary = m->old_primary,
	                         .end_lsn = m->end_lsn,
	                         .next_lsn = m->base + 1,
	                         .end = {m->data + m->slen, m->plen}}};

	r.breaks = m->brk; /* a break after it shows in the batches behind it */
	s->unsent = m->next;
	send_locked(s, &r, m, true);
}

/* A copy step being assembled: log record payloads. */
typedef struct {
	kv_buf *recs; /* COPY_RECS + 1 buffers, reused */
	size_t n;     /* records */
	size_t bytes; /* their key and value bytes */
	bool oom;
} step_acc;

/* Store visitor of a copy step: every entry visited is taken; stops once
 * the step is full. */
static int
copy_cb(void *arg, const uint8_t *key, size_t klen, const uint8_t *val, size_t vlen, uint64_t at)
{
	step_acc *a = arg;

	a->recs[a->n].len = 0;
	/* With its deadline: the backup's copy expires when the primary's does. */
	if (kv_dur_rec_put_x(&a->recs[a->n], key, klen, vlen ? val : (const uint8_t *)"", vlen,
	                     at) != 0) {
		a->oom = true;
		return 1;
	}
	a->n++;
	a->bytes += klen + vlen;
	return a->n >= COPY_RECS || a->bytes >= COPY_BYTES;
}

/* Exactly-once visitor of a copy: each entry as a DEDUP record. */
/* The next record slot of the copy's exactly-once records (emptied), or
 * NULL when it cannot grow (copy_dd_short is then set). */
static kv_buf *
copy_dd_next(stream *s)
{
	if (s->copy_ndd == s->copy_cap) {
		size_t nc = s->copy_cap ? 2 * s->copy_cap : 64;
		kv_buf *nb = realloc(s->copy_dd, nc * sizeof(*nb));
		if (nb == NULL) {
			s->copy_dd_short = true;
			return NULL;
		}
		memset(nb + s->copy_cap, 0, (nc - s->copy_cap) * sizeof(*nb));
		s->copy_dd = nb;
		s->copy_cap = nc;
	}
	s->copy_dd[s->copy_ndd].len = 0;
	return &s->copy_dd[s->copy_ndd];
}

static void
copy_dedup_cb(void *arg, uint64_t client, uint64_t req, const kv_dedup_result *res,
              const uint8_t *key, size_t klen, uint64_t time_ms)
{
	stream *s = arg;
	kv_dur_dedup dd = {.client = client,
	                   .req = req,
	                   .value_len = res->value_len,
	                   .time_ms = time_ms,
	                   .has_del_value = res->has_value,
	                   .del_value = {res->value.data, res->value.len}};
	kv_buf *b = copy_dd_next(s);

	if (b != NULL && kv_dur_rec_dedup(b, &dd, res->status, key, klen) == 0)
		s->copy_ndd++;
	else
		s->copy_dd_short = true;
}

/* Adds a client's floor to the copy: the replica must refuse, like this
 * node, a retry of a write this node may have forgotten (its ring wrapped,
 * or a range was replaced here), since it cannot be answered from the
 * entries the copy brings. The floor is the client's, over every key. */
static void
copy_floor_cb(void *arg, uint64_t client, uint64_t floor)
{
	stream *s = arg;
	kv_buf *b = copy_dd_next(s);

	/* Unix ms, the memory's clock: a monotonic time here made the replica
	 * see the client idle for decades and drop it, floor and all, at its
	 * next expiry pass. */
	if (b != NULL && kv_dur_rec_floor(b, client, floor, kv_unix_ms()) == 0)
		s->copy_ndd++;
	else
		s->copy_dd_short = true;
}

/* Whether the copy of marker m is still wanted (its job exists). Takes
 * tab_lock; caller holds nothing. */
static bool
job_exists(kv_rs *g, stream *s, uint64_t mid)
{
	bool found = false;

	pthread_rwlock_rdlock(&g->tab_lock);
	for (job *j = g->jobs; j && !found; j = j->next)
		found = j->s == s && j->mid == mid;
	pthread_rwlock_unlock(&g->tab_lock);
	return found;
}

/*
 * --copy-rate (env.copy_rate_mb_s): the copy steps of every stream share
 * one schedule, g->copy_next_ns. A step is sent only once that time has
 * come (copy_hold_ms: the stream thread waits on its condition variable,
 * s->mu released, never asleep with a lock held), and moves the schedule
 * on by its encoded bytes at the rate, from now or from where it stood if
 * that is later (time unused is not saved up). So a copy of N bytes takes
 * at least (N - its last step) / rate; two streams may each send one step
 * at the same moment.
 */
static void
copy_charge(kv_rs *g, const entry *m, size_t bytes)
{
	uint64_t rate = (uint64_t)g->env.copy_rate_mb_s * 1000000u;
	uint64_t cost, now, old, nv;

	atomic_fetch_add(&g->st_copy_bytes, bytes);
	if (m->urgent)
		atomic_fetch_add(&g->st_copy_urgent_bytes, bytes);
	if (rate == 0)
		return;
	cost = (uint64_t)((double)bytes * 1e9 / (double)rate);
	now = kv_now_ns();
	old = atomic_load(&g->copy_next_ns);
	do
		nv = (old > now ? old : now) + cost;
	while (!atomic_compare_exchange_weak(&g->copy_next_ns, &old, nv));
}

/* Whether the catch-up at s->unsent waits for the answer to its probe
 * (call_done signals it). Caller holds s->mu. */
static bool
cu_waiting_locked(const stream *s)
{
	const entry *m = s->unsent;

	return m != NULL && m->kind == ENT_COPY && m->cu && s->copying == m &&
	       s->copy_gen == s->gen && m->cu_gen == s->gen && !m->cu_known;
}

/* Milliseconds (at least 1) the copy step at s->unsent must wait for the
 * copy rate; 0: none is due or it may go now. Caller holds s->mu. */
static unsigned
copy_hold_ms(stream *s, uint64_t now)
{
	uint64_t next;

	if (s->g->env.copy_rate_mb_s == 0 || s->unsent == NULL || s->unsent->kind != ENT_COPY ||
	    s->unsent->urgent)
		return 0;
	next = atomic_load(&s->g->copy_next_ns);
	return next > now ? (unsigned)((next - now + 999999u) / 1000000u) : 0;
}

/*
 * Sends the next step of the catch-up offered at marker m, the entry at
 * s->unsent (doc/replication.md "Catch-up from the replica's own data"):
 * the buffered records of the range taken at install, COPY_RECS records or
 * COPY_BYTES at most per step, in lsn order; the first names the position
 * the replica must hold, the last the base. Starts again from the first
 * step in every new generation. Caller holds s->mu (released while the
 * step is gathered and sent).
 */
static void
send_catchup_locked(stream *s, entry *m, uint64_t breaks)
{
	kv_rs *g = s->g;
	bool first = false, last = false, found = false;
	size_t n = 0, bytes = 0, off;
	uint64_t from = 0, base = 0;
	uint64_t after = 0;
	kv_buf *recs;
	int rv = KV_OK;

	if (s->copying != m || s->copy_gen != s->gen) {
		/* The probe: no records; the replica answers with its position. */
		first = true;
		s->copying = m;
		s->copy_gen = s->gen;
		s->cu_off = 0;
		m->cu_gen = s->gen;
		m->cu_known = false;
		m->cu_after = 0;
	} else if (!m->cu_known) {
		return; /* the probe's answer comes first (cu_waiting_locked) */
	}
	after = m->cu_after;
	off = s->cu_off;
	pthread_mutex_unlock(&s->mu);
	recs = calloc(COPY_RECS, sizeof(*recs));
	pthread_rwlock_rdlock(&g->tab_lock);
	for (job *j = g->jobs; j && recs && !found; j = j->next) {
		if (j->s != s || j->mid != m->mid)
			continue;
		found = true;
		from = j->cu_from;
		base = j->base;
		/* The replica has every record up to its position. */
		while (!first && off < j->ncu && j->cu[off]->lsn <= after)
			off++;
		while (!first && off + n < j->ncu && n < COPY_RECS &&
		       (n == 0 || bytes + j->cu[off + n]->plen <= COPY_BYTES)) {
			kv_bytes pl = kv_cu_payload(j->cu[off + n]);
			if (kv_buf_set(&recs[n], pl.p, pl.len) != 0) {
				rv = KV_ENOMEM;
				break;
			}
			bytes += pl.len;
			n++;
		}
		last = off + n == j->ncu;
	}
	pthread_rwlock_unlock(&g->tab_lock);
	if (recs == NULL)
		rv = KV_ENOMEM;
	pthread_mutex_lock(&s->mu);
	if (rv == KV_OK && found && s->unsent == m) {
		kv_bytes *rb = calloc(n ? n : 1, sizeof(*rb));
		if (rb != NULL) {
			for (size_t i = 0; i < n; i++)
				rb[i] = (kv_bytes){recs[i].data, recs[i].len};
			kv_bytes st = {m->data, m->slen}, en = {m->data + m->slen, m->plen};
			kv_repl_msg r = {.copy = {.set = true,
			                          .leader_epoch = m->leader_epoch,
			                          .start = st,
			                          .end = en,
			                          .first = first,
			                          .last = last,
			                          .catchup = true,
			                          .from_lsn = from,
			                          .next_lsn = last ? base + 1 : 0,
			                          .old_primary = first ? m->old_primary : 0,
			                          .old_epoch = first ? m->old_epoch : 0,
			                          .old_boot = first ? m->old_boot : 0,
			                          .old_end = first ? m->end_lsn : 0,
			                          .old_at = first ? m->old_at : 0,
			                          .nrecs = n,
			                          .recs = rb},
			                 .breaks = breaks};
			if (first && s->copy_logged != m->mid)
				KV_INFO(COMP, "catching a replica up from its own data",
				        "node=%u leader_epoch=%llu from_lsn=%llu base=%llu "
				        "old_primary=%u old_end=%llu old_at=%llu",
				        s->node, (unsigned long long)m->leader_epoch,
				        (unsigned long long)from, (unsigned long long)base,
				        m->old_primary, (unsigned long long)m->end_lsn,
				        (unsigned long long)m->old_at);
			s->copy_logged = m->mid;
			s->cu_off = off + n;
			if (last)
				s->unsent = m->next;
			atomic_fetch_add(&g->st_copy_recs, n);
			copy_charge(g, m, bytes);
			send_locked(s, &r, m, last);
			free(rb);
		} else {
			rv = KV_ENOMEM;
		}
	}
	if ((rv != KV_OK || !found) && s->unsent == m) {
		/* Out of memory (or the job went: the next look skips it): the
		 * copy instead, from its first step. */
		if (rv != KV_OK)
			m->cu = false;
		s->copying = NULL;
		s->need_reset = true;
		s->retry_ns = kv_now_ns() + RETRY_MS * 1000000ull;
	}
	for (size_t i = 0; recs && i < COPY_RECS; i++)
		kv_buf_fini(&recs[i]);
	free(recs);
}

/*
 * Sends the next step of the copy marker at s->unsent (doc/replication.md
 * "Catch-up"): the first step drops the range at the replica and carries
 * the range's exactly-once entries, the next ones its keys and values in
 * key order, COPY_RECS records or COPY_BYTES at most, each read from the
 * store under one partition lock at a time; the last is flagged. A copy
 * starts again from its first step in every new generation. Caller holds
 * s->mu (released while reading the store and sending).
 */
static void
send_copy_locked(stream *s)
{
	kv_rs *g = s->g;
	entry *m = s->unsent;
	uint64_t mid = m->mid;
	kv_bytes st = {m->data, m->slen}, en = {m->data + m->slen, m->plen};
	step_acc a = {0};
	bool first = false;
	int rv = KV_OK;

	/* Read before the job is looked up: a break after it shows in the
	 * batches that follow (the replica then keeps its position still). */
	uint64_t breaks = atomic_load(&s->breaks);
	pthread_mutex_unlock(&s->mu);
	bool wanted = job_exists(g, s, mid);
	pthread_mutex_lock(&s->mu);
	if (s->unsent != m)
		return; /* the queue was dropped meanwhile */
	if (!wanted) {
		/* Dropped (the range changed or left): skip it. */
		m->kind = ENT_DEAD;
		s->unsent = m->next;
		settle_locked(s);
		return;
	}
	if (m->cu) {
		send_catchup_locked(s, m, breaks);
		return;
	}
	if (s->copying != m || s->copy_gen != s->gen) {
		first = true;
		s->copying = m;
		s->copy_gen = s->gen;
		s->copy_dedup = false;
		s->copy_doff = 0;
		kv_store_cursor_fini(&s->copy_cur);
		kv_store_cursor_init(&s->copy_cur);
	}
	pthread_mutex_unlock(&s->mu);
	if ((a.recs = calloc(COPY_RECS + 1, sizeof(*a.recs))) == NULL) {
		rv = KV_ENOMEM;
		goto out;
	}
	if (first) {
		for (size_t i = 0; i < s->copy_ndd; i++)
			kv_buf_fini(&s->copy_dd[i]);
		s->copy_ndd = 0;
		s->copy_dd_short = false;
		kv_dedup_visit_range(g->env.dedup, st.p, st.len, en.p, en.len, copy_dedup_cb, s);
		kv_dedup_visit_floors(g->env.dedup, copy_floor_cb, s);
		if (s->copy_dd_short) {
			/* An entry or floor could not be taken along (no memory):
			 * the copy would let the replica apply a retry twice. */
			rv = KV_ENOMEM;
			goto out;
		}
		atomic_fetch_add(&g->st_copies, 1);
		/* Once per marker: a replica that is down is tried again and again. */
		if (s->copy_logged != mid)
			KV_INFO(COMP, "copying a range to a replica outside the ISR",
			        "node=%u leader_epoch=%llu dedup=%zu", s->node,
			        (unsigned long long)m->leader_epoch, s->copy_ndd);
		s->copy_logged = mid;
	}
	if (!s->copy_dedup) {
		while (s->copy_doff < s->copy_ndd && a.n < COPY_RECS) {
			a.recs[a.n++] = s->copy_dd[s->copy_doff];
			s->copy_dd[s->copy_doff++] = (kv_buf){0};
		}
		s->copy_dedup = s->copy_doff == s->copy_ndd;
	}
	if (s->copy_dedup && a.n < COPY_RECS && !s->copy_cur.done) {
		rv = kv_store_range_step_x(g->env.store, st.p, st.len, en.p, en.len, &s->copy_cur,
		                           COPY_RECS - a.n, copy_cb, &a);
		if (rv == KV_OK && a.oom)
			rv = KV_ENOMEM;
	}
out:
	pthread_mutex_lock(&s->mu);
	if (rv != KV_OK || s->unsent != m) {
		if (rv != KV_OK) {
			s->copying = NULL; /* start the copy again */
			s->need_reset = true;
			s->retry_ns = kv_now_ns() + RETRY_MS * 1000000ull;
		}
	} else {
		kv_bytes *rb = calloc(a.n ? a.n : 1, sizeof(*rb));
		bool last = s->copy_dedup && s->copy_cur.done;
		size_t bytes = 0;
		if (rb == NULL) {
			s->copying = NULL;
			s->need_reset = true;
			s->retry_ns = kv_now_ns() + RETRY_MS * 1000000ull;
		} else {
			for (size_t i = 0; i < a.n; i++) {
				rb[i] = (kv_bytes){a.recs[i].data, a.recs[i].len};
				bytes += a.recs[i].len;
			}
			kv_repl_msg r = {.copy = {.set = true,
			                          .leader_epoch = m->leader_epoch,
			                          .start = st,
			                          .end = en,
			                          .first = first,
			                          .last = last,
			                          .next_lsn = last ? m->base + 1 : 0,
			                          .nrecs = a.n,
			                          .recs = rb},
			                 .breaks = breaks};
			if (last)
				s->unsent = m->next;
			atomic_fetch_add(&g->st_copy_recs, a.n);
			copy_charge(g, m, bytes);
			send_locked(s, &r, m, last);
			free(rb);
		}
	}
	for (size_t i = 0; a.recs && i <= COPY_RECS; i++)
		kv_buf_fini(&a.recs[i]);
	free(a.recs);
}

/* IsrChange requests to send: the ranges, copied. */
typedef struct {
	kv_buf start, end;
	uint64_t leader_epoch;
} isr_ask;

typedef struct {
	isr_ask *v;
	size_t n, cap;
} ask_list;

/* Adds [start, end) at leader_epoch to l (dropped when out of memory: the
 * request is made again later). */
static void
asks_add(ask_list *l, const kv_buf *start, const kv_buf *end, uint64_t leader_epoch)
{
	isr_ask *a;

	if (l->n == l->cap) {
		size_t nc = l->cap ? 2 * l->cap : 4;
		isr_ask *nv = realloc(l->v, nc * sizeof(*nv));
		if (nv == NULL)
			return;
		l->v = nv;
		l->cap = nc;
	}
	a = &l->v[l->n];
	*a = (isr_ask){.leader_epoch = leader_epoch};
	if (kv_buf_set(&a->start, start->data, start->len) != 0 ||
	    kv_buf_set(&a->end, end->data, end->len) != 0) {
		kv_buf_fini(&a->start);
		kv_buf_fini(&a->end);
		return;
	}
	l->n++;
}

/* What asks_send asks for. */
enum { ASK_REMOVE, ASK_ADD, ASK_UNFENCE };

/* Sends IsrChange{add} (ASK_ADD), {remove} (ASK_REMOVE) or {unfence}
 * (ASK_UNFENCE) of s's node for every range of l, counting each in *count
 * and logging msg, then frees l. Called with no lock held. Returns whether
 * the controller refused one for this configuration (KV_ESTALE or
 * KV_EINVAL). */
static bool
asks_send(stream *s, ask_list *l, int kind, atomic_uint_fast64_t *count, const char *msg)
{
	kv_rs *g = s->g;
	bool refused = false, add = kind != ASK_REMOVE;

	for (size_t i = 0; i < l->n; i++) {
		isr_ask *a = &l->v[i];
		kv_bytes st = {a->start.data, a->start.len};
		kv_bytes en = {a->end.data, a->end.len};
		int (*fn)(void *, const kv_bytes *, const kv_bytes *, uint64_t, uint32_t) =
		    kind == ASK_ADD      ? g->env.isr_add
		    : kind == ASK_REMOVE ? g->env.isr_remove
		                         : g->env.isr_unfence;
		int rv = fn ? fn(g->env.arg, &st, &en, a->leader_epoch, s->node) : KV_EINVAL;
		atomic_fetch_add(count, 1);
		if (add)
			KV_INFO(COMP, msg, "node=%u leader_epoch=%llu result=%s", s->node,
			        (unsigned long long)a->leader_epoch, kv_errname(rv));
		else
			KV_WARN(COMP, msg, "node=%u leader_epoch=%llu result=%s", s->node,
			        (unsigned long long)a->leader_epoch, kv_errname(rv));
		refused |= rv == KV_ESTALE || rv == KV_EINVAL;
		kv_buf_fini(&a->start);
		kv_buf_fini(&a->end);
	}
	free(l->v);
	*l = (ask_list){0};
	return refused;
}

/* Asks the controller to take s's backup out of the ISR of every range this
 * node leads with it (doc/replication.md "ISR changes", Shrink). Called by
 * the stream thread with no lock held. */
static void
ask_shrink(stream *s)
{
	kv_rs *g = s->g;
	uint32_t me = g->env.node_id(g->env.arg);
	uint64_t epoch = g->env.epoch(g->env.arg);
	ask_list l = {0};
	bool refused;

	pthread_rwlock_rdlock(&g->tab_lock);
	for (size_t i = 0; i < g->nroutes; i++) {
		const route *r = &g->routes[i];
		bool with = false;
		for (uint32_t j = 0; j < r->nbackups; j++)
			with |= r->backups[j] == s;
		if (with && r->primary == me)
			asks_add(&l, &r->start, &r->end, r->leader_epoch);
	}
	pthread_rwlock_unlock(&g->tab_lock);
	refused = asks_send(s, &l, ASK_REMOVE, &g->st_asks,
	                    "in-sync backup silent: asked the controller to shrink the ISR");
	/* A replica about to join an ISR that went silent: count it no more. */
	pthread_rwlock_rdlock(&g->tab_lock);
	pthread_mutex_lock(&s->mu);
	bool backup = false;
	for (size_t i = 0; i < g->nroutes; i++)
		for (uint32_t j = 0; j < g->routes[i].nbackups; j++)
			backup |= g->routes[i].backups[j] == s;
	for (job *j = g->jobs; j; j = j->next)
		if (j->s == s && j->state == JOB_EXPAND)
			j->state = JOB_LIVE;
	atomic_store(&s->counts, backup);
	pthread_mutex_unlock(&s->mu);
	pthread_rwlock_unlock(&g->tab_lock);
	if (refused) {
		pthread_mutex_lock(&s->mu);
		s->refused_epoch = epoch;
		pthread_mutex_unlock(&s->mu);
	}
}

/* Whether s should ask for a shrink now (caller holds s->mu); moves the
 * next ask on when it should. */
static bool
shrink_due_locked(stream *s, uint64_t now)
{
	kv_rs *g = s->g;

	if (g->env.isr_remove == NULL || atomic_load(&g->stopping) || s->unacked == NULL ||
	    !atomic_load(&s->counts) || now < s->ask_ns ||
	    now - s->progress_ns < SHRINK_MS * 1000000ull ||
	    (s->refused_epoch != 0 && s->refused_epoch == g->env.epoch(g->env.arg)))
		return false;
	s->ask_ns = now + ASK_AGAIN_MS * 1000000ull;
	return true;
}

/* Whether node is a replica of r outside its ISR. */
static bool
outside_isr(const route *r, uint32_t node)
{
	bool rep = false, in = false;

	for (uint32_t i = 0; i < r->nreplicas; i++)
		rep |= r->replicas[i] == node;
	for (uint32_t i = 0; i < r->ninsync; i++)
		in |= r->insync[i] == node;
	return rep && !in;
}

/* Whether this node, t's primary, copies t to node (t.copy). */
static bool
wants_copy(const route *t, uint32_t node)
{
	for (uint32_t i = 0; i < t->nreplicas; i++)
		if (t->replicas[i] == node)
			return t->copy[i];
	return false;
}

static void
job_free(job *j)
{
	kv_cu_release(j->cu, j->ncu);
	kv_buf_fini(&j->start);
	kv_buf_fini(&j->end);
	free(j);
}

static const qend *qend_find(const kv_rs *g, const route *r, uint32_t to);

/*
 * Starts the copies s's replica needs (doc/replication.md "Catch-up"): for
 * every range this node leads with that replica outside its ISR and not
 * being copied, under the routing table's write lock (no write is between
 * its apply and its log append), the range's records start going to the
 * stream (route.catch) and a copy marker is queued before them. Called by
 * the stream thread with no lock held.
 */
static void
install(stream *s)
{
	kv_rs *g = s->g;
	uint32_t me = g->env.node_id(g->env.arg);

	pthread_rwlock_wrlock(&g->tab_lock);
	/* No write is between its apply and its log append: every record up
	 * to base was tapped, every later one is queued behind the markers. */
	uint64_t base = kv_dur_last_lsn(g->env.dur);
	pthread_mutex_lock(&s->mu);
	s->want_install = false;
	for (size_t i = 0; i < g->nroutes && me != 0; i++) {
		route *r = &g->routes[i];
		bool has = false;
		job *j;
		entry *m;
		if (r->primary != me || !wants_copy(r, s->node))
			continue;
		for (uint32_t k = 0; k < r->ncatch; k++)
			has |= r->catch[k] == s;
		if (has || r->ncatch == KV_MAX_REPLICAS)
			continue;
		if ((j = calloc(1, sizeof(*j))) == NULL ||
		    kv_buf_set(&j->start, r->start.data, r->start.len) != 0 ||
		    kv_buf_set(&j->end, r->end.data, r->end.len) != 0 ||
		    (m = push_marker_locked(s, ENT_COPY, &r->start, &r->end, r->leader_epoch)) ==
		        NULL) {
			if (j)
				job_free(j);
			s->want_install = true;
			s->install_ns = kv_now_ns() + INSTALL_MS * 1000000ull;
			continue;
		}
		j->s = s;
		j->leader_epoch = r->leader_epoch;
		j->mid = m->mid;
		j->state = JOB_COPYING;
		j->base = m->base = base;
		m->urgent = r->ninsync < r->min_insync;
		/* A catch-up from the replica's own data when the buffer holds
		 * every record of the range after its trim point, all of this
		 * range at this leader epoch (doc/replication.md "Catch-up from
		 * the replica's own data"); else the copy. */
		kv_bytes rs = {r->start.data, r->start.len}, re = {r->end.data, r->end.len};
		/* The range's previous primary may hold this node's state at its
		 * end of that leader epoch, without a position (case (b)). */
		const qend *qe = qend_find(g, r, s->node);
		pthread_mutex_lock(&g->buf_mu);
		m->cu = (s->seeded || qe != NULL) &&
		        kv_cu_buf_select(&g->buf, &rs, &re, r->leader_epoch, &j->cu, &j->ncu,
		                         &j->cu_from) == KV_OK;
		pthread_mutex_unlock(&g->buf_mu);
		if (m->cu && qe != NULL && qe->at >= j->cu_from) {
			m->old_primary = qe->old_primary;
			m->old_epoch = qe->old_epoch;
			m->old_boot = qe->old_boot;
			m->end_lsn = qe->end_lsn;
			m->old_at = qe->at;
		} else if (m->cu && !s->seeded) {
			/* The buffer no longer reaches back to the end: a copy. */
			kv_cu_release(j->cu, j->ncu);
			j->cu = NULL;
			j->ncu = 0;
			m->cu = false;
		}
		j->next = g->jobs;
		g->jobs = j;
		r->catch[r->ncatch++] = s;
	}
	pthread_mutex_unlock(&s->mu);
	pthread_rwlock_unlock(&g->tab_lock);
}

/* The queue of a stream that counts for no ISR outgrew CATCH_MAX (its
 * replica is down or slow): drop its copies and its queue, and copy again
 * after INSTALL_MS. Called by the stream thread with no lock held. */
static void
uninstall(stream *s)
{
	kv_rs *g = s->g;

	pthread_rwlock_wrlock(&g->tab_lock);
	for (size_t i = 0; i < g->nroutes; i++) {
		route *r = &g->routes[i];
		uint32_t k = 0;
		for (uint32_t j = 0; j < r->ncatch; j++)
			if (r->catch[j] != s)
				r->catch[k++] = r->catch[j];
		r->ncatch = k;
	}
	for (job **pp = &g->jobs; *pp;) {
		job *j = *pp;
		if (j->s == s) {
			*pp = j->next;
			job_free(j);
		} else {
			pp = &j->next;
		}
	}
	pthread_mutex_lock(&s->mu);
	atomic_fetch_add(&s->breaks, 1);
	if (!atomic_load(&s->counts)) {
		s->unacked = s->unsent = NULL;
		atomic_store(&s->pending, UINT64_MAX);
	}
	s->overflow = false;
	s->copying = NULL;
	s->want_install = true;
	s->install_ns = kv_now_ns() + INSTALL_MS * 1000000ull;
	pthread_mutex_unlock(&s->mu);
	pthread_rwlock_unlock(&g->tab_lock);
	KV_WARN(COMP, "replica outside the ISR fell too far behind: its copy starts again later",
	        "node=%u", s->node);
}

/*
 * Expand (doc/replication.md "ISR changes"): a copied replica that has
 * acknowledged the position the stream had when its copy completed starts
 * counting for the commit point; once it has acknowledged every record
 * queued before that, this node asks the controller to add it to the ISR
 * (again every EXPAND_MS until the configuration arrives). Called by the
 * stream thread with no lock held.
 */
static void
expand(stream *s)
{
	kv_rs *g = s->g;
	uint64_t now = kv_now_ns();
	ask_list l = {0};
	bool wr = false, flip = false;

again:
	if (wr)
		pthread_rwlock_wrlock(&g->tab_lock);
	else
		pthread_rwlock_rdlock(&g->tab_lock);
	pthread_mutex_lock(&s->mu);
	uint64_t first = first_unacked_locked(s);
	for (job *j = g->jobs; j; j = j->next) {
		if (j->s != s)
			continue;
		if (j->state == JOB_COPYING && j->mid <= s->done_mid) {
			j->state = JOB_LIVE;
			j->target = s->tail_lsn;
		}
		if (j->state == JOB_LIVE && first > j->target && g->env.isr_add != NULL) {
			/* From here every reply waits for this replica too. Under the
			 * write lock no write is between its apply and its log append:
			 * every write the copy saw is queued at or below the new
			 * target, so once the replica has it, its state is exactly
			 * the primary's records up to its position (what
			 * reconciliation compares). */
			flip = true;
			if (!wr)
				continue;
			atomic_store(&s->counts, true);
			j->state = JOB_EXPAND;
			j->target = s->tail_lsn;
			j->ask_ns = 0;
		}
		if (j->state != JOB_EXPAND || first <= j->target || now < j->ask_ns ||
		    g->env.isr_add == NULL)
			continue;
		asks_add(&l, &j->start, &j->end, j->leader_epoch);
		j->ask_ns = now + EXPAND_MS * 1000000ull;
	}
	pthread_mutex_unlock(&s->mu);
	pthread_rwlock_unlock(&g->tab_lock);
	if (flip && !wr) {
		wr = true;
		goto again;
	}
	asks_send(s, &l, ASK_ADD, &g->st_expand_asks,
	          "replica caught up: asked the controller to add it to the ISR");
}

/* Whether [as, ae) and [bs, be) share a key (empty end: the end of the key
 * space). */
static bool
overlap(const kv_buf *as, const kv_buf *ae, const kv_buf *bs, const kv_buf *be)
{
	return (ae->len == 0 || kv_key_cmp(bs->data, bs->len, ae->data, ae->len) < 0) &&
	       (be->len == 0 || kv_key_cmp(as->data, as->len, be->data, be->len) < 0);
}

/* Asks the controller to take s's replica out of the ISR of every range it
 * diverged on (reconciliation); again every ASK_AGAIN_MS until the
 * configuration without it arrives. Called by the stream thread with no
 * lock held. */
static void
ask_diverged(stream *s)
{
	kv_rs *g = s->g;
	uint32_t me = g->env.node_id(g->env.arg);
	ask_list l = {0};

	/* An entry whose leader epoch no route here has any more is obsolete:
	 * a backup answered `diverged` to a reconciliation marker after a
	 * newer configuration had made another primary (or this one again,
	 * with a newer leader epoch, which reconciles on its own). The
	 * controller refuses its removal as stale forever, and it would hold
	 * the commit point (s->unreconciled) forever: forget it. The
	 * configuration's own pass (kv_rs_apply_config) misses it when the
	 * answer arrived after that configuration. Lock order: tab_lock, then
	 * the stream's mutex. */
	pthread_rwlock_rdlock(&g->tab_lock);
	pthread_mutex_lock(&s->mu);
	for (diverged **pp = &s->div; *pp;) {
		diverged *d = *pp;
		bool still = false;
		for (size_t k = 0; k < g->nroutes && !still; k++)
			for (uint32_t b = 0; b < g->routes[k].nbackups && !still; b++)
				still = g->routes[k].backups[b] == s &&
				        g->routes[k].primary == me &&
				        g->routes[k].leader_epoch == d->leader_epoch &&
				        overlap(&g->routes[k].start, &g->routes[k].end, &d->start,
				                &d->end);
		if (still) {
			pp = &d->next;
			continue;
		}
		*pp = d->next;
		KV_INFO(COMP,
		        "a diverged backup's entry is obsolete (newer leader epoch): forgotten",
		        "node=%u leader_epoch=%llu", s->node, (unsigned long long)d->leader_epoch);
		kv_buf_fini(&d->start);
		kv_buf_fini(&d->end);
		free(d);
		atomic_fetch_sub(&s->unreconciled, 1);
	}
	/* Ask for the parts still led here only: a cut since may have given
	 * part of an entry's range to another primary, and the controller
	 * refuses (as stale, for good) a change naming a range of which any
	 * part has another primary. */
	for (diverged *d = s->div; d; d = d->next)
		for (size_t k = 0; k < g->nroutes; k++) {
			const route *r = &g->routes[k];
			bool member = false;
			for (uint32_t b = 0; b < r->nbackups; b++)
				member |= r->backups[b] == s;
			if (!member || r->primary != me || r->leader_epoch != d->leader_epoch ||
			    !overlap(&r->start, &r->end, &d->start, &d->end))
				continue;
			const kv_buf *st = kv_key_cmp(r->start.data, r->start.len, d->start.data,
			                              d->start.len) >= 0
			                       ? &r->start
			                       : &d->start;
			const kv_buf *en =
			    r->end.len == 0 ? &d->end
			    : d->end.len == 0
			        ? &r->end
			        : (kv_key_cmp(r->end.data, r->end.len, d->end.data, d->end.len) <= 0
			               ? &r->end
			               : &d->end);
			asks_add(&l, st, en, d->leader_epoch);
		}
	pthread_rwlock_unlock(&g->tab_lock);
	s->div_ns = kv_now_ns() + ASK_AGAIN_MS * 1000000ull;
	pthread_mutex_unlock(&s->mu);
	asks_send(s, &l, ASK_REMOVE, &s->g->st_asks,
	          "diverged backup: asked the controller to take it out of the ISR");
}

/* The part of [as, ae) within [bs, be) (they overlap): *st, *en point at
 * bounds of either. */
static void
intersect(const kv_buf *as, const kv_buf *ae, const kv_buf *bs, const kv_buf *be, const kv_buf **st,
          const kv_buf **en)
{
	*st = kv_key_cmp(as->data, as->len, bs->data, bs->len) >= 0 ? as : bs;
	*en = ae->len == 0   ? be
	      : be->len == 0 ? ae
	                     : (kv_key_cmp(ae->data, ae->len, be->data, be->len) <= 0 ? ae : be);
}

/* Whether route r, led here by me, still has s's backup as the fence of
 * the transfer that entry d names. */
static bool
fence_of(const route *r, uint32_t me, const stream *s, const diverged *d)
{
	bool member = false;

	for (uint32_t b = 0; b < r->nbackups; b++)
		member |= r->backups[b] == s;
	return member && r->primary == me && r->fence == s->node &&
	       r->leader_epoch == d->leader_epoch &&
	       overlap(&r->start, &r->end, &d->start, &d->end);
}

/*
 * The old primary, kept as the transfer fence, answered this node's end in
 * sync: asks the controller to end the fence (IsrChange{unfence}, again
 * every ASK_AGAIN_MS until a configuration without it arrives), for the
 * parts still led here with that fence. An entry no route needs any more is
 * forgotten. When the controller refuses (the member left the ISR, or the
 * range changed meanwhile), the entry becomes a diverged one: the member
 * leaves the ISR and is copied, as before this check existed. Called by the
 * stream thread with no lock held.
 */
static void
ask_unfence(stream *s)
{
	kv_rs *g = s->g;
	uint32_t me = g->env.node_id(g->env.arg);
	ask_list l = {0};
	bool refused;

	pthread_rwlock_rdlock(&g->tab_lock);
	pthread_mutex_lock(&s->mu);
	for (diverged **pp = &s->unfence; *pp;) {
		diverged *d = *pp;
		bool still = false;
		for (size_t k = 0; k < g->nroutes; k++) {
			const route *r = &g->routes[k];
			const kv_buf *st, *en;
			if (!fence_of(r, me, s, d))
				continue;
			still = true;
			intersect(&r->start, &r->end, &d->start, &d->end, &st, &en);
			asks_add(&l, st, en, d->leader_epoch);
		}
		if (still) {
			pp = &d->next;
			continue;
		}
		*pp = d->next;
		kv_buf_fini(&d->start);
		kv_buf_fini(&d->end);
		free(d);
	}
	s->unfence_ns = kv_now_ns() + ASK_AGAIN_MS * 1000000ull;
	pthread_mutex_unlock(&s->mu);
	pthread_rwlock_unlock(&g->tab_lock);
	if (l.n == 0) {
		free(l.v);
		return;
	}
	refused = asks_send(s, &l, ASK_UNFENCE, &g->st_unfence_asks,
	                    "old primary in sync: asked the controller to end the transfer fence");
	if (!refused)
		return;
	/* Today's path: the fence leaves the ISR (ask_diverged forgets what is
	 * obsolete) and is copied again. */
	pthread_rwlock_rdlock(&g->tab_lock);
	pthread_mutex_lock(&s->mu);
	while (s->unfence) {
		diverged *d = s->unfence;
		s->unfence = d->next;
		d->next = s->div;
		s->div = d;
		s->div_ns = 0;
		atomic_fetch_add(&s->unreconciled, 1);
		atomic_fetch_add(&g->st_diverged, 1);
	}
	pthread_mutex_unlock(&s->mu);
	pthread_rwlock_unlock(&g->tab_lock);
}

static void *
stream_main(void *arg)
{
	stream *s = arg;
	kv_rs *g = s->g;

	kv_log_thread_name("kv-repl-stream");
	(void)kv_thread_batch();
	pthread_mutex_lock(&s->mu);
	while (!atomic_load(&g->stopping)) {
		struct timespec ts;
		/* Free what the backup has. */
		uint64_t now = kv_now_ns();
		/* (No prefetch: settle_locked walked these entries just now.) */
		while (s->head && s->head != s->unacked) {
			entry *e = s->head;
			s->head = e->next;
			s->qbytes -= sizeof(*e) + e->slen + e->plen + e->elen;
			if (s->copying == e)
				s->copying = NULL;
			if (e->kind == ENT_REC && e->cap <= 4 * SPARE_DATA &&
			    s->nspare < SPARE_RECS) {
				/* Kept for tap_fn: no free here and malloc there
				 * (two threads) per record. */
				e->next = s->spare;
				s->spare = e;
				s->nspare++;
			} else {
				free(e);
			}
		}
		if (s->head == NULL)
			s->tail = NULL;
		if (s->overflow) {
			pthread_mutex_unlock(&s->mu);
			uninstall(s);
			pthread_mutex_lock(&s->mu);
			continue;
		}
		if (s->want_install && now >= s->install_ns &&
		    g->env.epoch(g->env.arg) >= s->want_epoch) {
			/* Once the configuration is published, every write begun
			 * before this stream existed has ended (the server's
			 * configuration thread waits for them): none can miss the tap. */
			pthread_mutex_unlock(&s->mu);
			install(s);
			pthread_mutex_lock(&s->mu);
			continue;
		}
		if (s->use_link && s->link != NULL && s->inflight > 0) {
			/* Answers first: they free the window and the queue. */
			pthread_mutex_unlock(&s->mu);
			link_pump(s);
			pthread_mutex_lock(&s->mu);
		}
		if (s->need_reset && s->inflight == 0 && now >= s->retry_ns) {
			s->gen++;
			s->next_seq = 1;
			s->packed = false;
			s->unsent = s->unacked;
			s->need_reset = false;
			atomic_fetch_add(&g->st_resends, 1);
		}
		unsigned hold = copy_hold_ms(s, now);
		if (!s->need_reset && s->unsent && s->inflight < WINDOW && hold == 0 &&
		    !cu_waiting_locked(s)) {
			if (!stream_connected(s)) {
				pthread_mutex_unlock(&s->mu);
				int rv = stream_connect(s);
				pthread_mutex_lock(&s->mu);
				if (rv != 0) {
					s->need_reset = true;
					s->retry_ns = kv_now_ns() + RETRY_MS * 1000000ull;
				}
				/* Look again: with s->mu released, a configuration may
				 * have dropped the queue (s->unsent NULL) or reset it. */
				continue;
			}
			if (s->unsent->kind == ENT_REC)
				send_batch_locked(s);
			else if (s->unsent->kind == ENT_END)
				send_end_locked(s);
			else if (s->unsent->kind == ENT_COPY)
				send_copy_locked(s);
			else
				s->unsent = s->unsent->next; /* ENT_DEAD */
			continue;
		}
		if (s->div != NULL && now >= s->div_ns) {
			pthread_mutex_unlock(&s->mu);
			ask_diverged(s);
			pthread_mutex_lock(&s->mu);
			continue;
		}
		if (s->unfence != NULL && now >= s->unfence_ns) {
			pthread_mutex_unlock(&s->mu);
			ask_unfence(s);
			pthread_mutex_lock(&s->mu);
			continue;
		}
		if (now >= s->expand_ns) {
			s->expand_ns = now + POLL_MS * 1000000ull;
			pthread_mutex_unlock(&s->mu);
			expand(s);
			pthread_mutex_lock(&s->mu);
		}
		if (shrink_due_locked(s, kv_now_ns())) {
			pthread_mutex_unlock(&s->mu);
			ask_shrink(s);
			pthread_mutex_lock(&s->mu);
			continue;
		}
		if (hold)
			atomic_fetch_add(&g->st_copy_holds, 1);
		unsigned wait_ms = hold && hold < (unsigned)POLL_MS ? hold : (unsigned)POLL_MS;
		if (s->use_link) {
			/* Answers come on the link: wait for them, a wake-up or the
			 * poll period, whichever is first. */
			struct pollfd pf[2] = {{.fd = s->efd, .events = POLLIN}};
			int npf = 1;
			if (s->link != NULL) {
				pf[1] = (struct pollfd){
				    .fd = kv_link_fd(s->link),
				    .events = POLLIN | (kv_link_want_write(s->link) ? POLLOUT : 0)};
				npf = 2;
			}
			s->asleep = true;
			pthread_mutex_unlock(&s->mu);
			(void)poll(pf, (nfds_t)npf, (int)wait_ms);
			if (pf[0].revents & POLLIN) {
				eventfd_t v;
				(void)eventfd_read(s->efd, &v);
			}
			link_pump(s);
			sweep(g, 0);
			pthread_mutex_lock(&s->mu);
			s->asleep = false;
			continue;
		}
		deadline_in(&ts, wait_ms);
		pthread_cond_timedwait(&s->cv, &s->mu, &ts);
		pthread_mutex_unlock(&s->mu);
		sweep(g, 0);
		pthread_mutex_lock(&s->mu);
	}
	pthread_mutex_unlock(&s->mu);
	return NULL;
}

/* The stream to node, made (and its thread started) when new. Called by
 * the configuration thread. Returns NULL when out of memory or streams. */
static stream *
stream_get(kv_rs *g, uint32_t node, const char *addr)
{
	stream *s = NULL;
	size_t n;

	pthread_mutex_lock(&g->smu);
	n = atomic_load(&g->nstreams);
	for (size_t i = 0; i < n; i++)
		if (g->streams[i]->node == node) {
			s = g->streams[i];
			goto out;
		}
	if (n == MAX_STREAMS || addr == NULL || addr[0] == '\0' ||
	    (s = calloc(1, sizeof(*s))) == NULL)
		goto out;
	s->g = g;
	s->node = node;
	snprintf(s->addr, sizeof(s->addr), "%s", addr);
	atomic_init(&s->pending, UINT64_MAX);
	atomic_init(&s->hole, 0);
	atomic_init(&s->counts, false);
	atomic_init(&s->unreconciled, 0);
	kv_store_cursor_init(&s->copy_cur);
	s->gen = 1;
	s->next_seq = 1;
	s->efd = -1;
	for (int i = 0; i < WINDOW; i++)
		s->cargs[i] = (call_arg){.s = s, .slot = i};
	/* A link where one can go (answers read by the stream thread: no
	 * hand-off to nng's threads and back per batch); nng's client for TLS. */
	s->use_link = g->env.tls == NULL && kv_link_url_ok(addr) &&
	              (s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) >= 0;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->cv, NULL);
	if (pthread_create(&s->thr, NULL, stream_main, s) != 0) {
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->cv);
		if (s->efd >= 0)
			close(s->efd);
		free(s);
		s = NULL;
		goto out;
	}
	s->started = true;
	g->streams[n] = s;
	atomic_store_explicit(&g->nstreams, n + 1, memory_order_release);
	KV_INFO(COMP, "stream to backup started", "node=%u addr=%s", node, addr);
out:
	pthread_mutex_unlock(&g->smu);
	return s;
}

bool
kv_rs_active(kv_rs *g)
{
	return atomic_load_explicit(&g->nstreams, memory_order_relaxed) != 0 ||
	       atomic_load_explicit(&g->short_isr, memory_order_relaxed) ||
	       atomic_load_explicit(&g->replica, memory_order_relaxed);
}

bool
kv_rs_streaming(kv_rs *g)
{
	return atomic_load_explicit(&g->nstreams, memory_order_acquire) != 0;
}

int
kv_rs_write_begin(kv_rs *g, const kv_bytes *keys, size_t n, kv_rs_op *op, const char **why)
{
	const route *r;
	bool span = false;

	*op = (kv_rs_op){0};
	pthread_rwlock_rdlock(&g->tab_lock);
	r = n ? find_route(g, keys[0].p, keys[0].len) : NULL;
	for (size_t i = 0; r && i < n; i++) {
		const route *o = i ? find_route(g, keys[i].p, keys[i].len) : r;
		if (o == NULL)
			continue;
		if (o->nreplicas > 1 && o->primary != g->env.node_id(g->env.arg)) {
			/* The server serves the range (its owner table changed
			 * first) but the routing table still names another primary:
			 * this node is taking the range over and the configuration
			 * is still being applied. Taken now, the write would skip the
			 * backups, and a record of the old primary could still be
			 * applied after it (doc/replication.md "Failover"). */
			pthread_rwlock_unlock(&g->tab_lock);
			*why = "this node is becoming the range's primary (its configuration is "
			       "being applied): retry";
			return KV_EBUSY;
		}
		if (o->draining) {
			pthread_rwlock_unlock(&g->tab_lock);
			*why = "the range's primary role is being handed to another replica: retry";
			return KV_EBUSY;
		}
		if (o->ninsync < o->min_insync) {
			pthread_rwlock_unlock(&g->tab_lock);
			*why = "the range has fewer in-sync replicas than the minimum: writes are "
			       "refused until the set grows";
			return KV_EUNAVAIL;
		}
		if (o != r && (o->nbackups || r->nbackups || o->ncatch || r->ncatch)) {
			pthread_rwlock_unlock(&g->tab_lock);
			*why = "a multi-key write to replicated ranges must stay within one range";
			return KV_EINVAL;
		}
		if (o != r && (o->nreplicas > 1 || r->nreplicas > 1)) {
			/* No stream takes it, but the catch-up buffer must: under
			 * the span of every range it touches, so that no catch-up
			 * of one of them is offered while it is buffered (a copy
			 * instead; the library splits multi-key writes per node,
			 * not per range). */
			if (!span) {
				op->span_start = (kv_bytes){r->start.data, r->start.len};
				op->span_end = (kv_bytes){r->end.data, r->end.len};
				op->span_epoch = r->leader_epoch;
				span = true;
			}
			if (kv_key_cmp(o->start.data, o->start.len, op->span_start.p,
			               op->span_start.len) < 0)
				op->span_start = (kv_bytes){o->start.data, o->start.len};
			if (op->span_end.len != 0 &&
			    (o->end.len == 0 || kv_key_cmp(o->end.data, o->end.len, op->span_end.p,
			                                   op->span_end.len) > 0))
				op->span_end = (kv_bytes){o->end.data, o->end.len};
		}
	}
	op->g = g;
	if (span) {
		op->tap = (kv_dur_tap){.fn = tap_span_fn, .arg = op};
		return KV_OK;
	}
	/* Every record of a replicated range goes through the tap, backups or
	 * not: the catch-up buffer must hold them all. */
	if (r && (r->nbackups || r->ncatch || r->nreplicas > 1))
		op->tap = (kv_dur_tap){.fn = tap_fn, .arg = (void *)r};
	return KV_OK;
}

void
kv_rs_write_end(kv_rs_op *op)
{
	if (op->g == NULL)
		return;
	pthread_rwlock_unlock(&op->g->tab_lock);
	op->g = NULL;
}

/* Whether every entry of s queued up to the record at lsn `last` is
 * acknowledged: the first unacknowledged one is a later record, or a marker
 * queued after it (a marker's lsn is the last record queued before it; the
 * watermark never passes a live marker); nothing up to it is a record the
 * queue could not take; the backup diverged on nothing and has no end
 * unanswered; it counts for the commit point. Records of other ranges
 * queued later may be outstanding. Caller holds s->mu. */
static bool
passed_locked(const stream *s, uint64_t last)
{
	const entry *e = s->unacked;
	uint64_t h = atomic_load(&s->hole);
	bool marker = e != NULL && (e->kind == ENT_COPY || e->kind == ENT_END);

	return (e == NULL || (marker ? e->lsn >= last : e->lsn > last)) && (h == 0 || h > last) &&
	       atomic_load(&s->unreconciled) == 0 && s->div == NULL && atomic_load(&s->counts);
}

/* Whether a range that old led here with backups has another primary in nr. */
static bool
demoted(const route *old, size_t oldn, const route *nr, size_t n, uint32_t me)
{
	for (size_t i = 0; i < oldn; i++) {
		if (old[i].primary != me || old[i].nbackups == 0)
			continue;
		for (size_t j = 0; j < n; j++)
			if (nr[j].primary != me &&
			    overlap(&old[i].start, &old[i].end, &nr[j].start, &nr[j].end))
				return true;
	}
	return false;
}

/* Whether a range led here with at least its M in-sync members in old has
 * fewer in nr: the writes waiting for it must not be acknowledged now that
 * the commit point stops counting the members that left (doc/contract.md
 * §2: a write is acknowledged only while the ISR has at least M members). */
static bool
shrunk_below_min(const route *old, size_t oldn, const route *nr, size_t n, uint32_t me)
{
	for (size_t j = 0; j < n; j++) {
		if (nr[j].primary != me || nr[j].ninsync >= nr[j].min_insync)
			continue;
		for (size_t i = 0; i < oldn; i++)
			if (old[i].primary == me && old[i].ninsync >= old[i].min_insync &&
			    overlap(&old[i].start, &old[i].end, &nr[j].start, &nr[j].end))
				return true;
	}
	return false;
}

bool
kv_rs_fenced(kv_rs *g, uint64_t t0_ns)
{
	uint64_t f = atomic_load_explicit(&g->fence_ns, memory_order_relaxed);

	return f != 0 && t0_ns <= f;
}

/* The stream to node if one exists (no creation). */
static stream *
stream_find(kv_rs *g, uint32_t node)
{
	size_t n = atomic_load(&g->nstreams);

	for (size_t i = 0; i < n; i++)
		if (g->streams[i]->node == node)
			return g->streams[i];
	return NULL;
}

/* The state of primary `from`, or NULL when this node follows none of
 * that id (0: none). Caller holds in_mu. */
static insrc *
src_of(kv_rs *g, uint32_t from)
{
	if (from == 0)
		return NULL;
	for (size_t i = 0; i < MAX_SOURCES; i++)
		if (g->src[i].from == from)
			return &g->src[i];
	return NULL;
}

/* The highest lsn of primary `from` applied here since this start; 0:
 * none. Caller holds in_mu. */
static uint64_t
applied_from(kv_rs *g, uint32_t from)
{
	const insrc *in = src_of(g, from);
	return in != NULL ? in->max_lsn : 0;
}

/* Whether two routes name the same range. */
static bool
same_range(const kv_buf *as, const kv_buf *ae, const kv_buf *bs, const kv_buf *be)
{
	return kv_key_cmp(as->data, as->len, bs->data, bs->len) == 0 && ae->len == be->len &&
	       kv_key_cmp(ae->data, ae->len, be->data, be->len) == 0;
}

/* Whether [is, ie) lies inside [os, oe) (empty end: none). */
static bool
inside_of(const kv_buf *is, const kv_buf *ie, const kv_buf *os, const kv_buf *oe)
{
	return kv_range_within(is->data, is->len, ie->data, ie->len, os->data, os->len, oe->data,
	                       oe->len);
}

static void
qend_free(qend *e)
{
	kv_buf_fini(&e->start);
	kv_buf_fini(&e->end);
	free(e);
}

/*
 * This node now leads t after a failover (doc/replication.md "Case (b):
 * the old primary"): keeps its end of the previous leader epoch of t when
 * every old route overlapping t was led by one other node at one leader
 * epoch below t's, with this node in its ISR and no transfer fence (a
 * route still fenced was handed to its primary before that primary was
 * known to hold every record of the fence, the old primary: the other
 * ISR members may hold records it lacks, so its epoch did not begin from
 * their state), and this node applied a record of it (the end is known).
 * Caller holds in_mu (no record of the old primary is being applied) and
 * tab_lock for writing (no write of t is in its tap).
 */
static void
qend_note_locked(kv_rs *g, const route *old, size_t oldn, const route *t, uint32_t me)
{
	uint32_t prev = 0;
	uint64_t pe = 0;
	insrc *in = NULL;
	qend *e;

	for (size_t o = 0; o < oldn; o++) {
		const route *q = &old[o];
		bool was_in = false;
		if (!overlap(&q->start, &q->end, &t->start, &t->end))
			continue;
		for (uint32_t k = 0; k < q->ninsync; k++)
			was_in |= q->insync[k] == me;
		if (q->primary == me || q->primary == 0 || q->nreplicas < 2 || !was_in ||
		    q->fence != 0 || q->leader_epoch >= t->leader_epoch ||
		    (prev != 0 && q->primary != prev) || (prev != 0 && q->leader_epoch != pe)) {
			if (q->primary != me && q->primary != 0 &&
			    q->leader_epoch < t->leader_epoch)
				KV_INFO(COMP,
				        "primary after a failover: no end kept for the old primary",
				        "leader_epoch=%llu old_primary=%u in_isr=%d replicas=%u "
				        "fence=%u",
				        (unsigned long long)t->leader_epoch, q->primary, was_in,
				        q->nreplicas, q->fence);
			return;
		}
		prev = q->primary;
		pe = q->leader_epoch;
	}
	in = src_of(g, prev);
	if (in == NULL || in->max_lsn == 0) {
		if (prev != 0)
			KV_INFO(
			    COMP, "primary after a failover: no end kept for the old primary",
			    "leader_epoch=%llu old_primary=%u why=\"no record of it applied since "
			    "this start or its last copy\"",
			    (unsigned long long)t->leader_epoch, prev);
		return;
	}
	if (prev != 0)
		KV_INFO(COMP, "primary after a failover: end kept for the old primary's return",
		        "leader_epoch=%llu old_primary=%u old_boot=%llu end_lsn=%llu",
		        (unsigned long long)t->leader_epoch, prev, (unsigned long long)in->max_boot,
		        (unsigned long long)in->max_lsn);
	/* An older end overlapping t is no longer this node's. */
	for (qend **pp = &g->qends; *pp;) {
		qend *x = *pp;
		if (overlap(&x->start, &x->end, &t->start, &t->end)) {
			*pp = x->next;
			qend_free(x);
			g->nqends--;
		} else {
			pp = &x->next;
		}
	}
	if ((e = calloc(1, sizeof(*e))) == NULL ||
	    kv_buf_set(&e->start, t->start.data, t->start.len) != 0 ||
	    kv_buf_set(&e->end, t->end.data, t->end.len) != 0) {
		if (e)
			qend_free(e);
		return;
	}
	e->leader_epoch = t->leader_epoch;
	e->old_primary = prev;
	e->old_epoch = pe;
	e->old_boot = in->max_boot;
	e->end_lsn = in->max_lsn;
	e->at = kv_dur_last_lsn(g->env.dur);
	e->next = g->qends;
	g->qends = e;
	if (++g->nqends > MAX_QENDS) {
		/* The oldest goes: its replica is copied instead. */
		qend **pp = &g->qends;
		while ((*pp)->next)
			pp = &(*pp)->next;
		qend_free(*pp);
		*pp = NULL;
		g->nqends--;
	}
}

/* Drops the ends of ranges this node no longer leads at their leader
 * epoch (any part). Caller holds tab_lock for writing. */
static void
qends_prune_locked(kv_rs *g, uint32_t me)
{
	for (qend **pp = &g->qends; *pp;) {
		qend *x = *pp;
		bool keep = false;
		for (size_t i = 0; i < g->nroutes && !keep; i++) {
			const route *t = &g->routes[i];
			keep = t->primary == me && t->leader_epoch == x->leader_epoch &&
			       overlap(&x->start, &x->end, &t->start, &t->end);
		}
		if (keep) {
			pp = &x->next;
			continue;
		}
		*pp = x->next;
		qend_free(x);
		g->nqends--;
	}
}

/* The end this node keeps for a catch-up of r to node `to`: its previous
 * primary, covering r at r's leader epoch; NULL when none. Caller holds
 * tab_lock. */
static const qend *
qend_find(const kv_rs *g, const route *r, uint32_t to)
{
	for (const qend *x = g->qends; x; x = x->next)
		if (x->old_primary == to && x->leader_epoch == r->leader_epoch &&
		    inside_of(&r->start, &r->end, &x->start, &x->end))
			return x;
	return NULL;
}

/*
 * The parts of apply_config under the routing table's write lock (and
 * in_mu): copies in progress carry over to the new routes (same range,
 * same leader epoch, the replica still outside the ISR) and the others end;
 * replicas outside the ISR without a copy get one (from their stream
 * thread); a range this node now leads after a failover sends its end of
 * the previous leader epoch to each in-sync backup (reconciliation);
 * diverged backups that left the ISR are reconciled; and whether each
 * stream counts for the commit point.
 */
static void
carry_over_locked(kv_rs *g, const route *old, size_t oldn, const kv_config *c, uint32_t me,
                  bool restarted)
{
	route *nr = g->routes;
	size_t nn = g->nroutes, ns = atomic_load(&g->nstreams);

	for (job *j = g->jobs; j; j = j->next)
		j->keep = false;
	for (size_t i = 0; i < nn && me != 0; i++) {
		route *t = &nr[i];
		if (t->primary != me)
			continue;
		for (job *j = g->jobs; j; j = j->next)
			if (!j->keep && j->leader_epoch == t->leader_epoch &&
			    same_range(&j->start, &j->end, &t->start, &t->end) &&
			    wants_copy(t, j->s->node) && t->ncatch < KV_MAX_REPLICAS) {
				j->keep = true;
				t->catch[t->ncatch++] = j->s;
			}
		for (uint32_t k = 0; k < t->nreplicas; k++) {
			stream *s;
			bool has = false;
			if (t->replicas[k] == me || !wants_copy(t, t->replicas[k]) ||
			    (s = stream_find(g, t->replicas[k])) == NULL)
				continue;
			for (uint32_t x = 0; x < t->ncatch; x++)
				has |= t->catch[x] == s;
			if (has)
				continue;
			pthread_mutex_lock(&s->mu);
			s->want_install = true;
			s->want_epoch = c->epoch;
			stream_wake_locked(s);
			pthread_mutex_unlock(&s->mu);
		}
		/* Case (b) of the catch-up from a replica's own data: the end is
		 * kept for the old primary's return, backups or not. */
		if (old != NULL)
			qend_note_locked(g, old, oldn, t, me);
		/* Promotion: this node's end of the previous leader epoch. The
		 * first configuration after a restart (the log held records), which
		 * may already name this node primary, knows no previous one: the
		 * end is unknown. A node that starts empty holds nothing to
		 * reconcile. */
		for (size_t o = 0; o < (old ? oldn : restarted ? 1 : 0) && t->nbackups; o++) {
			const route *q = old ? &old[o] : t;
			if (old != NULL && (q->primary == me || q->primary == 0 ||
			                    q->leader_epoch >= t->leader_epoch ||
			                    !overlap(&q->start, &q->end, &t->start, &t->end)))
				continue;
			uint64_t end_lsn = old ? applied_from(g, q->primary) : 0;
			/* Every record of the range in the new leader epoch comes after
			 * it (no write of the range is in its tap now). */
			uint64_t base = kv_dur_last_lsn(g->env.dur);
			for (uint32_t b = 0; b < t->nbackups; b++) {
				stream *s = t->backups[b];
				pthread_mutex_lock(&s->mu);
				entry *m = push_marker_locked(s, ENT_END, &t->start, &t->end,
				                              t->leader_epoch);
				if (m != NULL) {
					m->old_primary = q->primary;
					m->end_lsn = end_lsn;
					m->base = base;
					m->brk = atomic_load(&s->breaks);
					atomic_fetch_add(&s->unreconciled, 1);
				}
				pthread_mutex_unlock(&s->mu);
			}
			KV_INFO(COMP, "primary after a failover: reconciling the in-sync backups",
			        "leader_epoch=%llu old_primary=%u end_lsn=%llu backups=%u",
			        (unsigned long long)t->leader_epoch, q->primary,
			        (unsigned long long)end_lsn, t->nbackups);
			break;
		}
	}
	qends_prune_locked(g, me);
	for (job **pp = &g->jobs; *pp;) {
		job *j = *pp;
		if (j->keep) {
			pp = &j->next;
			continue;
		}
		*pp = j->next;
		job_free(j);
	}
	for (size_t i = 0; i < ns; i++) {
		stream *s = g->streams[i];
		bool backup = false, expanding = false;
		for (size_t k = 0; k < nn; k++)
			for (uint32_t b = 0; b < nr[k].nbackups; b++)
				backup |= nr[k].backups[b] == s;
		pthread_mutex_lock(&s->mu);
		for (job *j = g->jobs; j; j = j->next)
			expanding |= j->s == s && j->state == JOB_EXPAND;
		for (diverged **pp = &s->div; *pp;) {
			diverged *d = *pp;
			bool still = false;
			for (size_t k = 0; k < nn && !still; k++)
				for (uint32_t b = 0; b < nr[k].nbackups; b++)
					still |=
					    nr[k].backups[b] == s && nr[k].primary == me &&
					    nr[k].leader_epoch == d->leader_epoch &&
					    overlap(&nr[k].start, &nr[k].end, &d->start, &d->end);
			if (still) {
				pp = &d->next;
				continue;
			}
			*pp = d->next;
			kv_buf_fini(&d->start);
			kv_buf_fini(&d->end);
			free(d);
			atomic_fetch_sub(&s->unreconciled, 1);
		}
		atomic_store(&s->counts, backup || expanding);
		pthread_mutex_unlock(&s->mu);
	}
}

static void
demo_free(demo *d)
{
	kv_buf_fini(&d->start);
	kv_buf_fini(&d->end);
	free(d);
}

#define MAX_DEMOS 1024u /* transfers remembered; past that, the oldest is diverged */

/*
 * The primary transfers in configuration nr (doc/replication.md "Primary
 * transfer"): for each range another node q now leads, keeping this node in
 * its ISR, where every part was led here with q in sync, records whether
 * the transfer is clean: the stream to q has nothing of the range
 * outstanding (every entry queued up to the range's last record is
 * acknowledged: records, ends and copies; no record up to it that the queue
 * could not take; q diverged on nothing and has no end unanswered). Then q
 * applied every record this
 * node logged for the range before q took the range over (a record of the
 * old leader epoch that q acknowledged was applied before q applied the
 * new configuration: q refuses it afterwards), and from this moment this
 * node writes nothing of the range (kv_rs_write_begin refuses it): both
 * hold the same records of it. Records no current range needs are
 * forgotten. Caller holds in_mu and tab_lock for writing (no write is
 * between its apply and its log append), old being the routes before nr.
 */
static void
demos_note_locked(kv_rs *g, const route *old, size_t oldn, const route *nr, size_t n, uint32_t me)
{
	for (demo **pp = &g->demos; *pp;) {
		demo *d = *pp;
		bool still = false;
		for (size_t k = 0; k < n && !still; k++)
			still = nr[k].primary == d->primary &&
			        nr[k].leader_epoch == d->leader_epoch &&
			        overlap(&nr[k].start, &nr[k].end, &d->start, &d->end);
		if (still) {
			pp = &d->next;
			continue;
		}
		*pp = d->next;
		demo_free(d);
		g->ndemos--;
	}
	for (size_t k = 0; k < n && old != NULL; k++) {
		const route *t = &nr[k];
		bool mine = false, clean = true, in = false;
		stream *q = NULL;
		uint64_t mark = 0;
		if (t->primary == me || t->primary == 0 || t->nreplicas < 2)
			continue;
		for (uint32_t i = 0; i < t->ninsync; i++)
			in |= t->insync[i] == me;
		uint64_t last = 0; /* the range's last record queued */
		for (size_t o = 0; o < oldn; o++) {
			const route *r = &old[o];
			bool with = false;
			if (!overlap(&r->start, &r->end, &t->start, &t->end))
				continue;
			if (r->primary != me) {
				clean = false; /* part of it came from another primary */
				continue;
			}
			mine = true;
			uint64_t l = atomic_load_explicit(&r->last_lsn, memory_order_relaxed);
			if (l > last)
				last = l;
			for (uint32_t b = 0; b < r->nbackups; b++)
				if (r->backups[b]->node == t->primary) {
					with = true;
					q = r->backups[b];
				}
			clean &= with && r->leader_epoch < t->leader_epoch;
		}
		if (!mine || !in)
			continue;
		if (q != NULL && clean) {
			pthread_mutex_lock(&q->mu);
			clean = passed_locked(q, last);
			mark = q->acked_lsn;
			pthread_mutex_unlock(&q->mu);
		}
		clean &= q != NULL;
		atomic_fetch_add(clean ? &g->st_clean_demos : &g->st_unclean_demos, 1);
		KV_INFO(COMP,
		        clean ? "range handed to another primary with nothing outstanding: this "
		                "node stays in sync"
		              : "range handed to another primary with records outstanding: this "
		                "node will be copied again",
		        "primary=%u leader_epoch=%llu acked_lsn=%llu", t->primary,
		        (unsigned long long)t->leader_epoch, (unsigned long long)mark);
		demo *d = calloc(1, sizeof(*d));
		if (d == NULL || kv_buf_set(&d->start, t->start.data, t->start.len) != 0 ||
		    kv_buf_set(&d->end, t->end.data, t->end.len) != 0) {
			if (d)
				demo_free(d);
			continue; /* unknown: the end is answered diverged */
		}
		d->primary = t->primary;
		d->leader_epoch = t->leader_epoch;
		d->clean = clean;
		d->mark = mark;
		d->next = g->demos;
		g->demos = d;
		if (++g->ndemos > MAX_DEMOS) {
			/* The oldest goes (its end is then answered diverged). */
			demo **lp = &g->demos;
			while ((*lp)->next)
				lp = &(*lp)->next;
			demo_free(*lp);
			*lp = NULL;
			g->ndemos--;
		}
	}
}

/* Whether this node's own records of route t (led by `from` at
 * leader_epoch, from a primary transfer away from this node) are exactly
 * from's: every part of t is covered by a clean transfer record, none by an
 * unclean one. end_lsn is from's end (0: it applied no record of this node
 * since it started, or since a copy from it): a record whose stream to from
 * had an acknowledgement (mark) then says from restarted since, and does
 * not count. Caller holds in_mu and tab_lock. */
static bool
demo_in_sync(const kv_rs *g, const route *t, uint32_t from, uint64_t leader_epoch, uint64_t end_lsn)
{
	const kv_buf *pos = &t->start;

	for (const demo *d = g->demos; d; d = d->next)
		if (!d->clean && d->primary == from && d->leader_epoch == leader_epoch &&
		    overlap(&d->start, &d->end, &t->start, &t->end))
			return false;
	for (size_t guard = 0; guard <= g->ndemos; guard++) {
		const demo *hit = NULL;
		for (const demo *d = g->demos; d && hit == NULL; d = d->next)
			if (d->clean && (end_lsn != 0 || d->mark == 0) && d->primary == from &&
			    d->leader_epoch == leader_epoch &&
			    kv_key_cmp(d->start.data, d->start.len, pos->data, pos->len) <= 0 &&
			    (d->end.len == 0 ||
			     kv_key_cmp(pos->data, pos->len, d->end.data, d->end.len) < 0))
				hit = d;
		if (hit == NULL)
			return false;
		if (hit->end.len == 0 ||
		    (t->end.len != 0 &&
		     kv_key_cmp(hit->end.data, hit->end.len, t->end.data, t->end.len) >= 0))
			return true;
		pos = &hit->end;
	}
	return false;
}

/*
 * A configuration that gives part of a range this node led to another
 * primary (a cut: `move` or the balancer's transfer of part of a range,
 * doc/replication.md "Moves and rebalance with replicas"). The records
 * queued under the old range name it by its start, which may now be the
 * other part: a backup that applied the configuration refuses them (older
 * leader epoch) and would refuse them again on every resend, holding up
 * every later record of the stream, the parts this node keeps included; or
 * it would apply under a part this node keeps a record whose key is in the
 * moved part, after the new primary took it over. Their writes have failed
 * (the demotion fence, kv_rs_fenced), so they are dropped here, under the
 * routing table's write lock (no write is between its apply and its log
 * append). A backup that had such records outstanding may lack some of a
 * part this node keeps, which this node serves: it leaves that part's ISR
 * (the diverged path, which holds the commit point until it has) and is
 * copied again. Caller holds tab_lock for writing.
 */
static void
drop_cut_locked(kv_rs *g, const route *old, size_t oldn, uint32_t me)
{
	const route *nr = g->routes;
	size_t nn = g->nroutes, ns = atomic_load(&g->nstreams);

	for (size_t i = 0; i < ns; i++) {
		stream *s = g->streams[i];
		size_t dropped = 0;
		pthread_mutex_lock(&s->mu);
		for (entry *e = s->unacked; e; e = e->next) {
			const route *ro = NULL;
			bool cut = false;
			if (e->kind != ENT_REC || e->lsn <= s->acked_lsn)
				continue;
			for (size_t o = 0; o < oldn && ro == NULL; o++)
				if (old[o].primary == me &&
				    old[o].leader_epoch == e->leader_epoch &&
				    kv_key_cmp(old[o].start.data, old[o].start.len, e->data,
				               e->slen) == 0)
					ro = &old[o];
			if (ro == NULL)
				continue;
			/* The range the record was queued under, whole: a split
			 * since (keeping this node and the leader epoch) leaves ro
			 * only its first piece, and the record's key may lie in a
			 * later piece given away now. A backup that applied this
			 * configuration would apply it under ro's piece there. */
			kv_buf es = {.data = e->data, .len = e->slen},
			       ee = {.data = e->data + e->slen + e->plen, .len = e->elen};
			for (size_t k = 0; k < nn && !cut; k++)
				cut = nr[k].primary != me &&
				      (overlap(&ro->start, &ro->end, &nr[k].start, &nr[k].end) ||
				       overlap(&es, &ee, &nr[k].start, &nr[k].end));
			if (!cut)
				continue;
			e->kind = ENT_DEAD;
			dropped++;
			/* The parts kept here: the backup leaves their ISR. The record
			 * names only its range's start at queue time: that range may
			 * have been cut since, keeping this node its primary and the
			 * leader epoch (ro is then only its first piece, and the
			 * record's key may lie in a later one). So every part led here
			 * at the record's leader epoch from its start on counts: at
			 * worst a backup is copied once more than needed. */
			for (size_t k = 0; k < nn; k++) {
				bool member = false, listed = false;
				if (nr[k].primary != me ||
				    (!overlap(&ro->start, &ro->end, &nr[k].start, &nr[k].end) &&
				     (nr[k].leader_epoch != e->leader_epoch ||
				      (nr[k].end.len != 0 &&
				       kv_key_cmp(nr[k].end.data, nr[k].end.len, e->data,
				                  e->slen) <= 0))))
					continue;
				for (uint32_t b = 0; b < nr[k].nbackups; b++)
					member |= nr[k].backups[b] == s;
				for (diverged *d = s->div; d && !listed; d = d->next)
					listed = d->leader_epoch == nr[k].leader_epoch &&
					         same_range(&d->start, &d->end, &nr[k].start,
					                    &nr[k].end);
				if (!member || listed)
					continue;
				diverged *d = calloc(1, sizeof(*d));
				if (d == NULL ||
				    kv_buf_set(&d->start, nr[k].start.data, nr[k].start.len) != 0 ||
				    kv_buf_set(&d->end, nr[k].end.data, nr[k].end.len) != 0) {
					/* Without the record of it the commit point cannot be held:
					 * count the backup as missing for good. */
					if (d)
						kv_buf_fini(&d->start);
					free(d);
					uint_fast64_t zero = 0;
					atomic_compare_exchange_strong(&s->hole, &zero, e->lsn);
					continue;
				}
				d->leader_epoch = nr[k].leader_epoch;
				d->next = s->div;
				s->div = d;
				s->div_ns = 0;
				atomic_fetch_add(&s->unreconciled, 1);
			}
		}
		if (dropped) {
			atomic_fetch_add(&s->breaks, 1);
			if (s->unsent != NULL && s->unsent->kind == ENT_DEAD)
				s->unsent = s->unsent->next;
			settle_locked(s);
			stream_wake_locked(s);
			KV_WARN(
			    COMP,
			    "part of a range this node led has another primary: its queued "
			    "records are dropped, the backup leaves the ISR of the parts kept here",
			    "node=%u records=%zu", s->node, dropped);
		}
		pthread_mutex_unlock(&s->mu);
	}
}

/*
 * The drain of a primary transfer (doc/replication.md "Primary transfer"):
 * when configuration nr hands a range this node leads with backups to one
 * of them, keeping this node in its ISR, the range refuses writes from now
 * on (route.draining; under tab_lock write, so every write of it has
 * queued its record) and this waits, at most DRAIN_MS, until its backups,
 * the new primary among them, have acknowledged every record of the
 * range, so that the transfer is clean (demos_note_locked), this node
 * stays in sync, and neither the new primary's reconciliation nor a cut
 * (drop_cut_locked) has another backup copied again. A new
 * primary that applied nr first refuses the records still in flight (an
 * older leader epoch): the wait then ends at DRAIN_MS and the transfer is
 * not clean. Called by the configuration thread, holding nothing.
 */
static void
drain(kv_rs *g, const route *nr, size_t n, uint32_t me)
{
	stream *qs[MAX_STREAMS];
	uint64_t last[MAX_STREAMS];
	size_t nq = 0;

	pthread_rwlock_wrlock(&g->tab_lock);
	for (size_t o = 0; o < g->nroutes; o++) {
		route *r = &g->routes[o];
		if (r->primary != me || r->nbackups == 0)
			continue;
		for (size_t k = 0; k < n; k++) {
			const route *t = &nr[k];
			bool in = false;
			stream *q = NULL;
			if (t->primary == me || t->primary == 0 || t->nreplicas < 2 ||
			    t->leader_epoch <= r->leader_epoch ||
			    !overlap(&r->start, &r->end, &t->start, &t->end))
				continue;
			for (uint32_t i = 0; i < t->ninsync; i++)
				in |= t->insync[i] == me;
			for (uint32_t b = 0; b < r->nbackups; b++)
				if (r->backups[b]->node == t->primary)
					q = r->backups[b];
			if (!in || q == NULL)
				continue;
			r->draining = true;
			/* Every backup: one that lacks a record of the range when
			 * this node applies nr is copied again (its end differs from
			 * the new primary's, and the records a cut drops). */
			uint64_t l = atomic_load_explicit(&r->last_lsn, memory_order_relaxed);
			for (uint32_t b = 0; b < r->nbackups; b++) {
				size_t j = 0;
				while (j < nq && qs[j] != r->backups[b])
					j++;
				if (j == nq) {
					if (nq == MAX_STREAMS)
						continue;
					qs[nq] = r->backups[b];
					last[nq++] = 0;
				}
				if (l > last[j])
					last[j] = l;
			}
		}
	}
	pthread_rwlock_unlock(&g->tab_lock);
	if (nq == 0)
		return;
	uint64_t t0 = kv_now_ns(), until = t0 + DRAIN_MS * 1000000ull;
	bool done = false;
	while (!done && !atomic_load(&g->stopping)) {
		done = true;
		for (size_t j = 0; j < nq && done; j++) {
			pthread_mutex_lock(&qs[j]->mu);
			done = passed_locked(qs[j], last[j]);
			pthread_mutex_unlock(&qs[j]->mu);
		}
		if (done || kv_now_ns() >= until)
			break;
		struct timespec ts = {.tv_sec = 0, .tv_nsec = 500000};
		nanosleep(&ts, NULL);
	}
	KV_INFO(COMP,
	        done ? "primary role handed over: the new primary has every record of the range"
	             : "primary role handed over before the new primary acknowledged every "
	               "record of the range",
	        "streams=%zu waited_us=%llu", nq, (unsigned long long)((kv_now_ns() - t0) / 1000u));
}

/* Whether route t sends its records to stream s (an in-sync backup, or a
 * replica being copied). */
static bool
route_feeds(const route *t, const stream *s)
{
	for (uint32_t k = 0; k < t->nbackups + t->ncatch; k++)
		if ((k < t->nbackups ? t->backups[k] : t->catch[k - t->nbackups]) == s)
			return true;
	return false;
}

/*
 * Counts a break on every stream that the old routes fed with a range the
 * new ones (already in place, under tab_lock write and in_mu) no longer
 * feed it with, whole, at the same leader epoch (doc/replication.md
 * "Catch-up from the replica's own data"): its backup's positions stop
 * moving with the stream.
 */
static void
note_breaks_locked(kv_rs *g, const route *old, size_t oldn, uint32_t me)
{
	size_t ns = atomic_load(&g->nstreams);

	for (size_t i = 0; i < ns; i++) {
		stream *s = g->streams[i];
		bool brk = false;
		for (size_t o = 0; o < oldn && !brk; o++) {
			const route *q = &old[o];
			if (q->primary != me || !route_feeds(q, s))
				continue;
			for (size_t k = 0; k < g->nroutes && !brk; k++) {
				const route *t = &g->routes[k];
				if (!overlap(&q->start, &q->end, &t->start, &t->end))
					continue;
				brk = t->primary != me || t->leader_epoch != q->leader_epoch ||
				      !route_feeds(t, s);
			}
		}
		if (brk)
			atomic_fetch_add(&s->breaks, 1);
	}
}

/* Writes the positions file (doc/replication.md "Catch-up from the
 * replica's own data"): each position at the last lsn whose records the
 * log has fsynced; sync: fsynced itself before it replaces the old one (a
 * position removed must be gone from the disk before its range changes).
 * Caller holds in_mu. Returns 0 or an error (the old file stays). */
static int
pos_save_locked(kv_rs *g, bool sync)
{
	kv_dur_stats ds;
	kv_buf f = {0};
	char tmp[4200];
	int fd, rv;

	if (g->pos_path == NULL)
		return KV_OK;
	kv_dur_stats_get(g->env.dur, &ds);
	for (size_t i = 0; i < g->pos.n; i++) {
		/* A position whose last records are not synced yet is saved at
		 * the value it had at the previous write, once that is synced. */
		kv_cu_pos *p = &g->pos.v[i];
		if (p->local <= ds.wal.synced_lsn) {
			p->saved = p->lsn;
			p->has_saved = true;
			continue;
		}
		if (p->has_cand && p->cand_local <= ds.wal.synced_lsn &&
		    (!p->has_saved || p->cand_lsn > p->saved)) {
			p->saved = p->cand_lsn;
			p->has_saved = true;
		}
		p->cand_lsn = p->lsn;
		p->cand_local = p->local;
		p->has_cand = true;
	}
	if ((rv = kv_cu_pos_encode(&g->pos, &f)) != KV_OK) {
		kv_buf_fini(&f);
		return rv;
	}
	snprintf(tmp, sizeof(tmp), "%s.tmp", g->pos_path);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rv = kv_err_from_errno(errno);
	} else {
		rv = kv_write_all(fd, f.data, f.len);
		if (rv == KV_OK && sync && fdatasync(fd) != 0)
			rv = kv_err_from_errno(errno);
		close(fd);
		if (rv == KV_OK && rename(tmp, g->pos_path) != 0)
			rv = kv_err_from_errno(errno);
		if (rv == KV_OK && sync)
			rv = kv_fsync_dir(g->pos_dir);
	}
	kv_buf_fini(&f);
	if (rv != KV_OK) {
		KV_WARN(COMP, "cannot write the replica positions file", "path=%s err=%s",
		        g->pos_path, kv_errname(rv));
		return rv;
	}
	g->pos_dirty = false;
	for (size_t i = 0; i < g->pos.n; i++)
		g->pos_dirty |= !g->pos.v[i].has_saved || g->pos.v[i].saved != g->pos.v[i].lsn;
	g->pos_save_ns = kv_now_ns();
	return KV_OK;
}

static void
led_free(led *d)
{
	kv_buf_fini(&d->start);
	kv_buf_fini(&d->end);
	free(d);
}

/* Forgets every old lead overlapping [start, end): this node's data of it
 * is about to change. Caller holds in_mu. */
static void
led_forget_locked(kv_rs *g, const kv_bytes *start, const kv_bytes *end)
{
	kv_buf s = {.data = (uint8_t *)start->p, .len = start->len};
	kv_buf e = {.data = (uint8_t *)end->p, .len = end->len};

	for (led **pp = &g->leds; *pp;) {
		led *d = *pp;
		if (overlap(&d->start, &d->end, &s, &e)) {
			*pp = d->next;
			led_free(d);
			g->nleds--;
		} else {
			pp = &d->next;
		}
	}
}

/*
 * The old leads after the routing table just put in place (tab_lock write,
 * in_mu; doc/replication.md "Case (b): the old primary"): one stays while
 * every route overlapping it has its primary and leader epoch and lists
 * this node among its replicas; each part of a range this node led in the
 * old table (replicated) that the new one gives to another primary at a
 * higher leader epoch, with this node a replica outside its ISR, becomes
 * one, with the last lsn this node logged for the old range (no write of
 * the old routes is between its apply and its log append now).
 */
static void
leds_note_locked(kv_rs *g, const route *old, size_t oldn, uint32_t me)
{
	for (led **pp = &g->leds; *pp;) {
		led *d = *pp;
		bool keep = true;
		for (size_t i = 0; i < g->nroutes && keep; i++) {
			const route *t = &g->routes[i];
			bool member = false;
			if (!overlap(&d->start, &d->end, &t->start, &t->end))
				continue;
			for (uint32_t k = 0; k < t->nreplicas; k++)
				member |= t->replicas[k] == me;
			keep = member && t->primary == d->primary &&
			       t->leader_epoch == d->leader_epoch;
		}
		if (keep) {
			pp = &d->next;
			continue;
		}
		*pp = d->next;
		led_free(d);
		g->nleds--;
	}
	for (size_t o = 0; o < oldn; o++) {
		const route *q = &old[o];
		if (q->primary != me || q->nreplicas < 2)
			continue;
		for (size_t i = 0; i < g->nroutes; i++) {
			const route *t = &g->routes[i];
			const kv_buf *st, *en;
			led *d;
			if (t->primary == me || t->primary == 0 ||
			    t->leader_epoch <= q->leader_epoch || !outside_isr(t, me) ||
			    !overlap(&q->start, &q->end, &t->start, &t->end))
				continue;
			/* A record the queue to the new primary could not take (out of
			 * memory) may be missing there below its end: a copy. */
			stream *qs = stream_find(g, t->primary);
			if (qs != NULL && atomic_load(&qs->hole) != 0)
				continue;
			if (g->nleds >= MAX_LEDS || (d = calloc(1, sizeof(*d))) == NULL)
				continue; /* a copy instead */
			intersect(&q->start, &q->end, &t->start, &t->end, &st, &en);
			if (kv_buf_set(&d->start, st->data, st->len) != 0 ||
			    kv_buf_set(&d->end, en->data, en->len) != 0) {
				led_free(d);
				continue;
			}
			d->primary = t->primary;
			d->leader_epoch = t->leader_epoch;
			d->old_epoch = q->leader_epoch;
			d->last = atomic_load_explicit(&q->own_lsn, memory_order_relaxed);
			d->next = g->leds;
			g->leds = d;
			g->nleds++;
			KV_INFO(COMP, "a range this node led has another primary (failover)",
			        "primary=%u leader_epoch=%llu old_leader_epoch=%llu last_lsn=%llu",
			        d->primary, (unsigned long long)d->leader_epoch,
			        (unsigned long long)d->old_epoch, (unsigned long long)d->last);
		}
	}
}

/*
 * At this start's first configuration (tab_lock write, in_mu), after a
 * restart (doc/replication.md "After a restart"): when nothing was logged
 * since recovery, each replicated range led by another node with this one
 * a replica outside its ISR becomes an old lead of the restart kind: this
 * node's data of it is what recovery left, and nothing writes it here
 * before a copy or catch-up from its primary (leds_note_locked drops it
 * when the range's primary or leader epoch changes).
 */
static void
rst_leds_locked(kv_rs *g, uint32_t me)
{
	if (g->rst_boot == 0 || kv_dur_last_lsn(g->env.dur) != g->rst_last)
		return;
	for (size_t i = 0; i < g->nroutes; i++) {
		const route *t = &g->routes[i];
		bool member = false;
		led *d;
		for (uint32_t k = 0; k < t->nreplicas; k++)
			member |= t->replicas[k] == me;
		if (!member || t->nreplicas < 2 || t->primary == me || t->primary == 0 ||
		    !outside_isr(t, me))
			continue;
		if (g->nleds >= MAX_LEDS || (d = calloc(1, sizeof(*d))) == NULL)
			return; /* a copy instead */
		if (kv_buf_set(&d->start, t->start.data, t->start.len) != 0 ||
		    kv_buf_set(&d->end, t->end.data, t->end.len) != 0) {
			led_free(d);
			return;
		}
		d->primary = t->primary;
		d->leader_epoch = t->leader_epoch;
		d->restart = true;
		d->next = g->leds;
		g->leds = d;
		g->nleds++;
		KV_INFO(COMP, "restart: a range outside its ISR keeps the data recovery left",
		        "primary=%u leader_epoch=%llu last_lsn=%llu", d->primary,
		        (unsigned long long)d->leader_epoch, (unsigned long long)g->rst_last);
	}
}

/*
 * Case (b) of the catch-up from a replica's own data (doc/replication.md
 * "Case (b): the old primary"): whether this node, with no position from
 * the sender of catch-up c, holds the sender's state of c's range at
 * c->old_at: it is c->old_primary in start c->old_boot, an old lead from
 * the sender at c's leader epoch, of old leader epoch c->old_epoch, covers
 * the range, and it logged nothing of it past the sender's end
 * (c->old_end). Returns NULL when it does, else why not. Caller holds in_mu.
 */
static const char *
led_holds_locked(kv_rs *g, uint32_t me, uint32_t from, const kv_repl_copy *c)
{
	kv_buf s = {.data = (uint8_t *)c->start.p, .len = c->start.len};
	kv_buf e = {.data = (uint8_t *)c->end.p, .len = c->end.len};

	if (c->old_primary != me || c->old_end == 0 || c->old_at < c->from_lsn)
		return "no usable end";
	/* An end of this start, or of the previous one after a restart. */
	bool prev = g->rst_boot != 0 && c->old_boot == g->rst_boot;
	if (!prev && c->old_boot != (g->env.boot_id & 0xffffffffu))
		return "the end is of an earlier start of this node";
	for (const led *d = g->leds; d; d = d->next) {
		if (d->restart != prev || d->primary != from ||
		    d->leader_epoch != c->leader_epoch || (!prev && d->old_epoch != c->old_epoch) ||
		    !inside_of(&s, &e, &d->start, &d->end))
			continue;
		if (prev) {
			/* The data is the previous start's records up to rst_last:
			 * the new primary's state at old_at when they hold every
			 * record up to the end and none of the range after it. */
			if (c->old_end > g->rst_last)
				return "this node's log lost records of its previous start up to "
				       "the end";
			int t = kv_cu_tail_touches(&g->rst_tail, c->old_end, g->rst_last, &c->start,
			                           &c->end);
			if (t < 0)
				return "this node cannot read its log's records past the end";
			if (t > 0)
				return "this node's log holds records of the range past the end";
			return NULL;
		}
		/* No record past the end: else an unacknowledged tail the new
		 * primary never had is here, and only a copy takes it back. */
		if (d->last > c->old_end)
			return "this node logged records of the range past the end";
		return NULL;
	}
	return "no old lead from the sender covers the range at that leader epoch";
}

/* Cuts this node's positions to the ranges it backs up in the routing
 * table just put in place (tab_lock write, in_mu); a part removed is gone
 * from the file before the configuration takes effect. */
static void
pos_reshape_locked(kv_rs *g, uint32_t me)
{
	kv_cu_range *r;
	size_t n = 0;
	bool dropped = false;

	if (g->pos.n == 0)
		return;
	r = calloc(g->nroutes ? g->nroutes : 1, sizeof(*r));
	for (size_t i = 0; r && i < g->nroutes; i++) {
		const route *t = &g->routes[i];
		bool member = false;
		for (uint32_t k = 0; k < t->nreplicas; k++)
			member |= t->replicas[k] == me;
		if (!member || t->primary == me || t->nreplicas < 2)
			continue;
		r[n++] = (kv_cu_range){.start = {t->start.data, t->start.len},
		                       .end = {t->end.data, t->end.len},
		                       .primary = t->primary,
		                       .leader_epoch = t->leader_epoch};
	}
	if (r == NULL || kv_cu_pos_reshape(&g->pos, r, n, &dropped) != KV_OK) {
		kv_cu_pos_set_fini(&g->pos);
		dropped = true;
	}
	free(r);
	if (dropped && pos_save_locked(g, true) != KV_OK) {
		/* The file may still name a removed part: forget everything, and
		 * try once more to say so. */
		kv_cu_pos_set_fini(&g->pos);
		if (g->pos_path != NULL && unlink(g->pos_path) != 0 && errno != ENOENT)
			KV_ERROR(COMP, "cannot remove the replica positions file", "path=%s",
			         g->pos_path);
	}
	g->pos_dirty |= !dropped;
}

int
kv_rs_apply_config(kv_rs *g, const kv_config *c)
{
	uint32_t me = g->env.node_id(g->env.arg);
	route *nr = calloc(c->nranges ? c->nranges : 1, sizeof(*nr));
	route *old;
	size_t oldn;
	bool short_isr = false, replica = false;

	if (nr == NULL)
		return KV_ENOMEM;
	for (size_t i = 0; i < c->nranges; i++) {
		const kv_range *r = &c->ranges[i];
		route *t = &nr[i];
		if (kv_buf_set(&t->start, r->start.data, r->start.len) != 0 ||
		    kv_buf_set(&t->end, r->end.data, r->end.len) != 0) {
			routes_free(nr, c->nranges);
			return KV_ENOMEM;
		}
		t->primary = r->node;
		t->leader_epoch = r->leader_epoch;
		t->fence = r->fence;
		t->buf = &g->buf;
		t->buf_mu = &g->buf_mu;
		t->ninsync = kv_range_ninsync(r);
		for (uint32_t j = 0; j < t->ninsync && j < KV_MAX_REPLICAS; j++)
			t->insync[j] = kv_range_insync(r, j);
		t->nreplicas = kv_range_nreplicas(r);
		for (uint32_t j = 0; j < t->nreplicas && j < KV_MAX_REPLICAS; j++)
			t->replicas[j] = kv_range_replica(r, j);
		/* Never more than the range's replicas (doc/contract.md §2). */
		t->min_insync = r->nreplicas ? kv_rs_min_insync(c) : 1;
		if (t->min_insync > kv_range_nreplicas(r))
			t->min_insync = kv_range_nreplicas(r);
		for (uint32_t j = 0; me != 0 && t->nreplicas > 1 && j < t->nreplicas; j++)
			replica |= t->replicas[j] == me;
		if (r->node != me || me == 0)
			continue;
		short_isr |= t->ninsync < t->min_insync;
		for (uint32_t j = 0; j < t->ninsync; j++) {
			const kv_node *nd;
			stream *s;
			if (t->insync[j] == me)
				continue;
			nd = kv_config_node(c, t->insync[j]);
			s = stream_get(g, t->insync[j], nd ? nd->address : NULL);
			if (s == NULL) {
				/* Without a stream no write of the range could be acknowledged
				 * truthfully: count the member as missing. */
				KV_ERROR(COMP, "cannot stream to an in-sync backup", "node=%u",
				         t->insync[j]);
				t->min_insync = UINT32_MAX;
				short_isr = true;
				continue;
			}
			t->backups[t->nbackups++] = s;
		}
		/* Replicas outside the ISR get a stream: their copy starts from it
		 * once this configuration is published. Not while one is down: it
		 * would only queue records and read the range again and again; it
		 * is copied once it is back. */
		for (uint32_t j = 0; j < t->nreplicas; j++) {
			const kv_node *nd = kv_config_node(c, t->replicas[j]);
			if (t->replicas[j] == me || !outside_isr(t, t->replicas[j]) || nd == NULL ||
			    nd->state == KV_NODE_DOWN)
				continue;
			t->copy[j] = true;
			if (stream_get(g, t->replicas[j], nd ? nd->address : NULL) == NULL)
				KV_ERROR(COMP, "cannot stream to a replica outside the ISR",
				         "node=%u", t->replicas[j]);
		}
	}
	/* A transfer away from this node waits first (briefly) for the new
	 * primary to have every record of the range. */
	if (me != 0)
		drain(g, nr, c->nranges, me);
	kv_dur_stats ds;
	kv_dur_stats_get(g->env.dur, &ds);
	pthread_mutex_lock(&g->in_mu);
	pthread_rwlock_wrlock(&g->tab_lock);
	old = g->routes;
	oldn = g->nroutes;
	/* Before anything is dropped from the queues or queued on them. */
	if (me != 0)
		demos_note_locked(g, old, oldn, nr, c->nranges, me);
	/* Each range's last record queued, from the routes its records were
	 * queued under (no write is in its tap now). */
	for (size_t k = 0, o = 0; k < c->nranges; k++) {
		/* Both tables are sorted by start, their ranges disjoint. */
		while (o < oldn && old[o].end.len != 0 &&
		       kv_key_cmp(old[o].end.data, old[o].end.len, nr[k].start.data,
		                  nr[k].start.len) <= 0)
			o++;
		for (size_t j = o; j < oldn; j++) {
			if (nr[k].end.len != 0 && kv_key_cmp(old[j].start.data, old[j].start.len,
			                                     nr[k].end.data, nr[k].end.len) >= 0)
				break;
			uint64_t l = atomic_load_explicit(&old[j].last_lsn, memory_order_relaxed);
			uint64_t w = atomic_load_explicit(&old[j].own_lsn, memory_order_relaxed);
			if (!overlap(&old[j].start, &old[j].end, &nr[k].start, &nr[k].end))
				continue;
			if (l > atomic_load_explicit(&nr[k].last_lsn, memory_order_relaxed))
				atomic_store_explicit(&nr[k].last_lsn, l, memory_order_relaxed);
			if (w > atomic_load_explicit(&nr[k].own_lsn, memory_order_relaxed))
				atomic_store_explicit(&nr[k].own_lsn, w, memory_order_relaxed);
		}
	}
	/* An ISR that falls below M: the writes in flight fail (timeout-class:
	 * they may have been applied), set before the members that left stop
	 * holding up the commit point. */
	if (me != 0 && shrunk_below_min(old, oldn, nr, c->nranges, me)) {
		atomic_store(&g->fence_ns, kv_now_ns());
		KV_WARN(COMP, "an ISR fell below --min-insync: writes in flight fail", "epoch=%llu",
		        (unsigned long long)c->epoch);
	}
	/* Demotion: the fence before the swap. From carry_over_locked on, the
	 * backups of a range given away stop counting for the commit point
	 * (stream.counts) and drop_cut_locked drops their records; a stream
	 * thread's sweep in between would complete a write waiting on them as
	 * acknowledged, though the new primary may never have had it (a lost
	 * write, seen when the positions file's fsync below held this window
	 * open for milliseconds; doc/replication.md "Primary transfer"). */
	bool deposed = me != 0 && demoted(old, oldn, nr, c->nranges, me);
	if (deposed)
		atomic_store(&g->fence_ns, kv_now_ns());
	g->routes = nr;
	g->nroutes = c->nranges;
	atomic_store(&g->short_isr, short_isr);
	atomic_store(&g->replica, replica);
	carry_over_locked(g, old, oldn, c, me, old == NULL && ds.wal.next_lsn > 1);
	if (deposed)
		drop_cut_locked(g, old, oldn, me);
	if (me != 0)
		note_breaks_locked(g, old, oldn, me);
	if (me != 0)
		pos_reshape_locked(g, me);
	if (me != 0)
		leds_note_locked(g, old, oldn, me);
	if (g->rst_first && me != 0)
		rst_leds_locked(g, me);
	g->rst_first = false;
	pthread_rwlock_unlock(&g->tab_lock);
	pthread_mutex_unlock(&g->in_mu);
	/* Demotion: a range this node led with backups has another primary
	 * (a failover while it was cut off or paused). What it logged for the
	 * range may be missing at the new primary, and the backups that have
	 * not acknowledged it are about to leave every stream: the replies of
	 * writes that began before now must fail, not succeed (kv_rs_fenced).
	 * Every write of the old routes has logged (the swap waited for them);
	 * a later one is refused by the ownership table. */
	if (deposed) {
		atomic_store(&g->fence_ns, kv_now_ns());
		atomic_fetch_add(&g->st_demotions, 1);
		KV_WARN(COMP, "a range this node led has another primary: writes in flight fail",
		        "epoch=%llu", (unsigned long long)c->epoch);
	}
	routes_free(old, oldn);
	/* A backup no range streams to any more (left the ISR, or the range
	 * left this node) holds up nothing: what it has not acknowledged is no
	 * longer needed for the commit point. No write taps it now: they all
	 * began after the swap. A replica being copied keeps its queue. */
	size_t ns = atomic_load(&g->nstreams);
	pthread_rwlock_rdlock(&g->tab_lock);
	for (size_t i = 0; i < ns; i++) {
		stream *s = g->streams[i];
		bool used = false;
		for (size_t j = 0; j < g->nroutes && !used; j++) {
			const route *t = &g->routes[j];
			for (uint32_t k = 0; k < t->nbackups + t->ncatch; k++)
				used |= (k < t->nbackups ? t->backups[k]
				                         : t->catch[k - t->nbackups]) == s;
			used |= t->primary == me && wants_copy(t, s->node);
		}
		if (used)
			continue;
		pthread_mutex_lock(&s->mu);
		if (s->unacked != NULL)
			KV_INFO(COMP, "backup left every in-sync set: its queue is dropped",
			        "node=%u", s->node);
		s->unacked = NULL;
		s->unsent = NULL;
		s->want_install = false;
		atomic_store(&s->pending, UINT64_MAX);
		atomic_store(&s->hole, 0);
		atomic_store(&s->unreconciled, 0);
		div_free_all(s);
		stream_wake_locked(s);
		pthread_mutex_unlock(&s->mu);
	}
	pthread_rwlock_unlock(&g->tab_lock);
	sweep(g, 0);
	return KV_OK;
}

/* ------------------------------------------------------------------------
 * Backup side
 * ------------------------------------------------------------------------ */

/* Whether this node may apply r from node `from`. Caller holds tab_lock. */
static int
check_rec(kv_rs *g, uint32_t me, uint32_t from, const kv_repl_rec *r, const char **why)
{
	const route *t = find_route(g, r->start.p, r->start.len);
	bool member = false;

	if (t == NULL) {
		*why = "no range of this node's configuration holds the record";
		return KV_EWRONGOWNER;
	}
	if (r->leader_epoch < t->leader_epoch) {
		*why = "leader epoch older than this node's configuration: the sender is no "
		       "longer the primary";
		return KV_ESTALE;
	}
	if (r->leader_epoch > t->leader_epoch) {
		if (g->env.hurry)
			g->env.hurry(g->env.arg);
		*why = "leader epoch newer than this node's configuration; retry";
		return KV_EBUSY;
	}
	if (t->primary != from) {
		*why = "the sender is not the range's primary in this node's configuration";
		return KV_EWRONGOWNER;
	}
	/* A replica outside the ISR takes the records that follow its copy
	 * (the primary sends none before it). */
	for (uint32_t i = 0; i < t->nreplicas; i++)
		member |= t->replicas[i] == me;
	if (!member || me == from) {
		*why = "this node is not a backup of the range";
		return KV_EWRONGOWNER;
	}
	return KV_OK;
}

/* Whether this node may apply copy step c, or end e, from node `from`
 * (caller holds tab_lock): the sender leads the range at that leader
 * epoch in this node's configuration, and for a copy the range has the
 * same bounds and this node is a replica outside its ISR (an in-sync
 * replica is never emptied). */
static int
check_marker(kv_rs *g, uint32_t me, uint32_t from, uint64_t leader_epoch, const kv_bytes *start,
             const kv_bytes *end, const char **why)
{
	const route *t = find_route(g, start->p, start->len);

	if (t == NULL) {
		*why = "no range of this node's configuration holds the marker's start";
		return KV_EBUSY;
	}
	/* An end names the range it was queued for, and a merge or a cut
	 * applied since may have left its start inside a range. What it
	 * reconciles is the sender's end of the previous primary's records
	 * (applied_from), not the bounds: when the range holding its start is
	 * the sender's at that leader epoch, it applies. Refused, it would hold
	 * every entry behind it for good (the stream starts again at the same
	 * end). A copy needs its range exactly. An older leader epoch is
	 * answered as such below. */
	if (!key_is(&t->start, start) && leader_epoch >= t->leader_epoch &&
	    (end != NULL || leader_epoch != t->leader_epoch || t->primary != from)) {
		*why = "no range of this node's configuration starts there";
		return KV_EBUSY;
	}
	if (leader_epoch < t->leader_epoch) {
		*why = "leader epoch older than this node's configuration: the sender is no "
		       "longer the primary";
		return KV_ESTALE;
	}
	if (leader_epoch > t->leader_epoch || t->primary != from) {
		if (g->env.hurry)
			g->env.hurry(g->env.arg);
		*why = "the sender is not the range's primary in this node's configuration; retry";
		return KV_EBUSY;
	}
	if (end == NULL)
		return KV_OK;
	if (!key_is(&t->end, end)) {
		*why = "the copied range has other bounds in this node's configuration; retry";
		return KV_EBUSY;
	}
	if (!outside_isr(t, me)) {
		if (g->env.hurry)
			g->env.hurry(g->env.arg);
		*why = "this node is not a replica outside the range's ISR in its configuration";
		return KV_EBUSY;
	}
	return KV_OK;
}

/* A record of a batch and the keys it touches (KV_DUR_SPAN_ALL: its
 * payload did not say). */
typedef struct {
	size_t idx;
	kv_dur_span sp;
} warm_span;

/*
 * Before a batch's records are applied one by one: brings the index paths
 * of the keys of the records from `from` on above after_lsn (up to
 * KV_STORE_PREFETCH_GROUP of them) into cache at once (kv_store_prefetch),
 * so that their applies do not stall on one cache miss after another, and
 * keeps their spans in ws (*nws of them, in order) for the backup's memory
 * of what it applied (recent.h). Returns the index of the first record not
 * covered.
 */
static size_t
warm_recs(kv_rs *g, const kv_repl_msg *m, size_t from, uint64_t after_lsn, warm_span *ws,
          size_t *nws)
{
	kv_bytes keys[KV_STORE_PREFETCH_GROUP];
	size_t n = 0, i;

	*nws = 0;
	for (i = from; i < m->nrecs && *nws < KV_STORE_PREFETCH_GROUP; i++) {
		warm_span *w = &ws[*nws];
		if (m->recs[i].lsn <= after_lsn)
			continue;
		w->idx = i;
		if (kv_dur_rec_span(m->recs[i].payload.p, m->recs[i].payload.len, &w->sp) != KV_OK)
			w->sp.kind = KV_DUR_SPAN_ALL;
		if (w->sp.kind == KV_DUR_SPAN_KEYS)
			keys[n++] = w->sp.lo;
		(*nws)++;
	}
	kv_store_prefetch(g->env.store, n, keys);
	return i;
}

/* Applies one record payload and logs it; *l gets the local lsn. */
static int
apply_one(kv_rs *g, const uint8_t *p, size_t n, uint64_t *l, const char **why)
{
	int st;

	kv_dur_begin(g->env.dur);
	st = kv_dur_apply_record(g->env.dur, p, n, l);
	kv_dur_end(g->env.dur);
	if (st != KV_OK) {
		*why = st == KV_ECORRUPT ? "malformed record payload"
		                         : "the record could not be applied or logged";
		if (st == KV_ECORRUPT)
			st = KV_EINVAL;
	}
	return st;
}

/*
 * Applies the records of batch m from *i on, up to a group whose keys
 * warm_recs brings into cache at once, and logs them with one append
 * (kv_dur_apply_records); *i moves past them. A record at or below the
 * stream's last lsn is skipped; one this node may not apply (check_rec)
 * ends the batch after the ones before it. Caller holds in_mu and
 * tab_lock. Returns 0 or the first error (*why says it).
 */
static int
apply_group(kv_rs *g, uint32_t me, const kv_repl_msg *m, insrc *in, size_t *i, const char **why)
{
	kv_bytes pay[KV_STORE_PREFETCH_GROUP];
	const kv_repl_rec *rr[KV_STORE_PREFETCH_GROUP];
	const kv_dur_span *sps[KV_STORE_PREFETCH_GROUP];
	warm_span ws[KV_STORE_PREFETCH_GROUP];
	size_t nws, w = 0;
	size_t end = warm_recs(g, m, *i, in->last_lsn, ws, &nws), k = 0, done = 0;
	uint64_t seen = in->last_lsn, l = 0;
	int st = KV_OK, ast = KV_OK;
	static const kv_dur_span any = {.kind = KV_DUR_SPAN_ALL};

	for (; *i < end && k < KV_STORE_PREFETCH_GROUP; (*i)++) {
		const kv_repl_rec *r = &m->recs[*i];
		if (r->lsn <= seen)
			continue;
		if ((st = check_rec(g, me, m->from_node, r, why)) != KV_OK)
			break;
		while (w < nws && ws[w].idx < *i)
			w++;
		sps[k] = w < nws && ws[w].idx == *i ? &ws[w].sp : &any;
		pay[k] = r->payload;
		rr[k++] = r;
		seen = r->lsn;
	}
	if (k > 0) {
		kv_dur_begin(g->env.dur);
		ast = kv_dur_apply_records(g->env.dur, pay, k, &done, &l);
		kv_dur_end(g->env.dur);
	}
	if (done > 0) {
		/* lsns rise through a batch: the last applied is the highest */
		const kv_repl_rec *r = rr[done - 1];
		for (size_t j = 0; j < done && in->recent != NULL; j++)
			kv_recent_add(in->recent, rr[j]->lsn, sps[j]);
		in->last_lsn = r->lsn;
		in->last_local = l;
		if (r->lsn > in->max_lsn) {
			in->max_lsn = r->lsn;
			in->max_boot = m->stream_id >> 32;
		}
		atomic_fetch_add(&g->st_applied, done);
	}
	if (ast != KV_OK) {
		*why = ast == KV_ECORRUPT ? "malformed record payload"
		                          : "the record could not be applied or logged";
		return ast == KV_ECORRUPT ? KV_EINVAL : ast;
	}
	return st;
}

/* Applies a copy step (caller holds in_mu and tab_lock): the first drops
 * the range (logged, so a restart does not bring it back), then each
 * record. */
static int
apply_copy(kv_rs *g, const kv_repl_copy *c, insrc *in, const char **why)
{
	uint64_t l = 0;
	int st = KV_OK;

	if (c->first) {
		kv_buf rd = {0};
		if (kv_dur_rec_range_del(&rd, c->start.p, c->start.len, c->end.p, c->end.len) !=
		    0) {
			kv_buf_fini(&rd);
			*why = "out of memory";
			return KV_ENOMEM;
		}
		st = apply_one(g, rd.data, rd.len, &l, why);
		kv_buf_fini(&rd);
		if (st != KV_OK)
			return st;
		in->last_local = l;
		/* The copy may show writes whose records have not arrived yet: the
		 * position in this primary's records is unknown until later
		 * records raise it (reconciliation compares it). */
		in->max_lsn = 0;
		if (in->recent != NULL)
			kv_recent_clear(in->recent);
		KV_INFO(COMP,
		        "copy of a range from its primary started: what was held of it is "
		        "dropped",
		        "from=%u leader_epoch=%llu", in->from, (unsigned long long)c->leader_epoch);
	}
	for (size_t i = 0; i < c->nrecs && st == KV_OK; i++) {
		if ((st = apply_one(g, c->recs[i].p, c->recs[i].len, &l, why)) == KV_OK)
			in->last_local = l;
	}
	if (st == KV_OK && c->last)
		KV_INFO(COMP, "copy of a range from its primary complete",
		        "from=%u leader_epoch=%llu", in->from, (unsigned long long)c->leader_epoch);
	return st;
}

/* A batch from `from` counted a break its last one did not: every
 * position from it stops moving with the stream. Caller holds in_mu. */
static void
pos_freeze_locked(kv_rs *g, uint32_t from)
{
	for (size_t i = 0; i < g->pos.n; i++)
		if (g->pos.v[i].from == from)
			g->pos.v[i].live = false;
}

/* The records of a batch from (from, boot) are applied up to its lsn
 * `last` (local lsn `local`): the live positions from it move there.
 * Caller holds in_mu. */
static void
pos_advance_locked(kv_rs *g, uint32_t from, uint64_t boot, uint64_t last, uint64_t local)
{
	for (size_t i = 0; i < g->pos.n; i++) {
		kv_cu_pos *p = &g->pos.v[i];
		if (!p->live || p->from != from || p->boot != boot || last <= p->lsn)
			continue;
		p->lsn = last;
		p->local = local;
		g->pos_dirty = true;
	}
}

/*
 * Applies a catch-up step (caller holds in_mu and tab_lock; check_marker
 * passed): the first decides, from this node's positions, whether the
 * records after c.from_lsn make its data the primary's; a refused
 * catch-up (*div) changes nothing, and the primary copies instead. The
 * last step of an accepted one leaves the position at the base, live
 * when no break came meanwhile (*caught).
 */
static int
apply_catchup(kv_rs *g, uint32_t me, const kv_repl_msg *m, insrc *in, bool *div, bool *caught,
              uint64_t *position, const char **why)
{
	const kv_repl_copy *c = &m->copy;
	uint64_t boot = m->stream_id >> 32, l = 0;
	int st = KV_OK;
	long i;

	if (c->first) {
		i = kv_cu_pos_find(&g->pos, m->from_node, boot, c->leader_epoch, &c->start, &c->end,
		                   c->from_lsn);
		if (i < 0 && c->old_primary == me) {
			/* Case (b): this node led the range before the sender. When
			 * it holds the sender's state at old_at, that is a position,
			 * saved once the log has synced what it holds now. */
			const char *no = led_holds_locked(g, me, m->from_node, c);
			if (no == NULL &&
			    kv_cu_pos_put(&g->pos, m->from_node, boot, c->leader_epoch, &c->start,
			                  &c->end, c->old_at, kv_dur_last_lsn(g->env.dur),
			                  false) == KV_OK) {
				g->pos_dirty = true;
				i = kv_cu_pos_find(&g->pos, m->from_node, boot, c->leader_epoch,
				                   &c->start, &c->end, c->from_lsn);
			}
			KV_INFO(COMP, "old primary: the new primary's end of its leader epoch",
			        "from=%u old_epoch=%llu old_end=%llu old_at=%llu accepted=%d "
			        "prev_start=%d why=\"%s\"",
			        m->from_node, (unsigned long long)c->old_epoch,
			        (unsigned long long)c->old_end, (unsigned long long)c->old_at,
			        i >= 0, g->rst_boot != 0 && c->old_boot == g->rst_boot,
			        no ? no : "it logged nothing of the range past the end");
		}
		/* Accepted or not, the data of the range changes next. */
		led_forget_locked(g, &c->start, &c->end);
		in->cu_on = i >= 0;
		in->cp_breaks = m->breaks;
		*position = i >= 0 ? g->pos.v[i].lsn : 0;
		/* As after a copy's first step: the data may now hold records
		 * whose predecessors in the stream have not arrived. */
		in->max_lsn = 0;
		if (in->recent != NULL)
			kv_recent_clear(in->recent);
		KV_INFO(COMP,
		        i >= 0
		            ? "catch-up from this node's own data accepted"
		            : "catch-up from this node's own data refused: no position covers it",
		        "from=%u leader_epoch=%llu from_lsn=%llu position=%llu", m->from_node,
		        (unsigned long long)c->leader_epoch, (unsigned long long)c->from_lsn,
		        (unsigned long long)(i >= 0 ? g->pos.v[i].lsn : 0));
	}
	if (!in->cu_on) {
		*div = true;
		return KV_OK;
	}
	for (size_t k = 0; k < c->nrecs && st == KV_OK; k++)
		if ((st = apply_one(g, c->recs[k].p, c->recs[k].len, &l, why)) == KV_OK)
			in->last_local = l;
	if (st != KV_OK) {
		in->cu_on = false;
		return st;
	}
	if (c->last) {
		uint64_t lsn = c->next_lsn ? c->next_lsn - 1 : 0;
		in->cu_on = false;
		i = kv_cu_pos_find(&g->pos, m->from_node, boot, c->leader_epoch, &c->start, &c->end,
		                   c->from_lsn);
		uint64_t local = in->last_local;
		if (i >= 0 && g->pos.v[i].lsn > lsn)
			lsn = g->pos.v[i].lsn;
		/* Not saved before the log has synced what the position it
		 * replaces needed (case (b): this node's own records of the range,
		 * logged before the first step, perhaps above every local lsn of
		 * the catch-up's records). */
		if (i >= 0 && g->pos.v[i].local > local)
			local = g->pos.v[i].local;
		/* The data is the primary's either way; without a position the
		 * next return is a copy. */
		if (kv_cu_pos_put(&g->pos, m->from_node, boot, c->leader_epoch, &c->start, &c->end,
		                  lsn, local, m->breaks == in->cp_breaks) == KV_OK)
			g->pos_dirty = true;
		*caught = true;
		KV_INFO(COMP, "caught up from this node's own data, without a copy",
		        "from=%u leader_epoch=%llu position=%llu", m->from_node,
		        (unsigned long long)c->leader_epoch, (unsigned long long)lsn);
	}
	return st;
}

/* Finds or makes the state of primary `from`. Caller holds in_mu. */
static insrc *
src_get(kv_rs *g, uint32_t from)
{
	insrc *in = src_of(g, from);

	for (size_t i = 0; in == NULL && i < MAX_SOURCES; i++)
		if (g->src[i].from == 0) {
			in = &g->src[i];
			/* Without its ring (out of memory) every doubt makes a copy.
			 * (A sender that says it is node 0 gets a free slot as is.) */
			if (from != 0)
				*in = (insrc){.from = from, .recent = kv_recent_new()};
		}
	return in;
}

/* Blocks until the local log holds lsn by its mode. */
typedef struct {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	bool done;
	int st;
} dwait;

static void
dwait_cb(void *arg, int st)
{
	dwait *w = arg;
	pthread_mutex_lock(&w->mu);
	w->done = true;
	w->st = st;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
}

static int
wait_durable(kv_dur *d, uint64_t lsn)
{
	dwait w = {.done = false};
	int rv;

	if (lsn == 0 || kv_dur_durable_lsn(d) >= lsn)
		return KV_OK;
	kv_dur_write_here(d); /* --fsync batch: no hand-off to the log writer and back */
	if (kv_dur_durable_lsn(d) >= lsn)
		return KV_OK;
	pthread_mutex_init(&w.mu, NULL);
	pthread_cond_init(&w.cv, NULL);
	rv = kv_dur_notify(d, lsn, dwait_cb, &w);
	if (rv == 0) {
		pthread_mutex_lock(&w.mu);
		while (!w.done)
			pthread_cond_wait(&w.cv, &w.mu);
		rv = w.st;
		pthread_mutex_unlock(&w.mu);
	}
	pthread_mutex_destroy(&w.mu);
	pthread_cond_destroy(&w.cv);
	return rv;
}

/* kv_rs_handle (nowait NULL) and kv_rs_handle_nowait: with nowait, a
 * message that would wait (a copy, a catch-up, an end, a batch ahead of
 * its predecessor, in_mu taken) is refused with KV_EBUSY before anything
 * changes, and the answer's wait for the log is left to the caller
 * (*nowait: the local lsn it waits for; a plain batch never sets
 * need_sync). Returns 0 otherwise. */
static int
handle(kv_rs *g, const kv_req *rq, kv_repl_ack *ack, uint64_t *nowait)
{
	const kv_repl_msg *m = &rq->repl;
	uint32_t me = g->env.node_id(g->env.arg);
	const char *why = NULL;
	uint64_t local = 0;
	struct timespec ts;
	insrc *in;
	int st = KV_OK;
	bool div = false, caught = false, need_sync = false;
	uint64_t cu_pos = 0;

	memset(ack, 0, sizeof(*ack));
	ack->packed_ok = true; /* every answer: this node reads packed records */
	if (me == 0 || m->from_node != rq->from_node) {
		ack->status = KV_EINVAL;
		ack->error = me == 0 ? "this node has not registered yet"
		                     : "Replicate.from_node differs from Request.from_node";
		atomic_fetch_add(&g->st_refused, 1);
		return KV_OK;
	}
	if (nowait == NULL)
		pthread_mutex_lock(&g->in_mu);
	else if (pthread_mutex_trylock(&g->in_mu) != 0)
		return KV_EBUSY;
	if ((in = src_get(g, m->from_node)) == NULL) {
		pthread_mutex_unlock(&g->in_mu);
		ack->status = KV_ELIMIT;
		ack->error = "this node follows too many primaries";
		atomic_fetch_add(&g->st_refused, 1);
		return KV_OK;
	}
	if (nowait != NULL && (m->copy.set || m->end.set ||
	                       (in->stream_id == m->stream_id && m->seq > in->next_seq))) {
		pthread_mutex_unlock(&g->in_mu);
		return KV_EBUSY;
	}
	deadline_in(&ts, GAP_WAIT_MS);
	while (in->stream_id == m->stream_id && m->seq > in->next_seq &&
	       pthread_cond_timedwait(&g->in_cv, &g->in_mu, &ts) == 0)
		;
	if (m->end.set && m->end.end_lsn != 0 && m->end.old_primary != me) {
		/* A new primary's end: the old primary's records up to it may still
		 * be on their way here on its own stream, which goes on with its
		 * other ranges. Only a record of this range among them makes this
		 * copy differ (reconciliation below); one refused on the way stops
		 * that stream short of the end. */
		insrc *o = src_of(g, m->end.old_primary);
		deadline_in(&ts, END_WAIT_MS);
		/* After an old primary's failure, one wait for each of its ranges'
		 * ends would add up: a stream that stood still through one is not
		 * waited for again until it moves. */
		while (o != NULL && o->max_lsn != 0 && o->max_lsn < m->end.end_lsn &&
		       o->max_lsn != o->end_stall) {
			if (pthread_cond_timedwait(&g->in_cv, &g->in_mu, &ts) != 0) {
				if (o->max_lsn < m->end.end_lsn)
					o->end_stall = o->max_lsn;
				break;
			}
		}
	}
	if (in->stream_id != m->stream_id) {
		/* A new stream starts at seq 1; one of the same start must have a
		 * higher generation (a late batch of an old one is refused). */
		bool new_boot = (m->stream_id >> 32) != (in->stream_id >> 32);
		if (m->seq != 1 || (!new_boot && m->stream_id < in->stream_id)) {
			st = KV_EBUSY;
			why = "unknown or old stream: start again at seq 1";
			goto answer;
		}
		in->stream_id = m->stream_id;
		in->next_seq = 1;
		if (new_boot) {
			in->last_lsn = 0;
			if (in->recent != NULL)
				kv_recent_clear(in->recent);
		}
	}
	if (m->seq > in->next_seq) {
		st = KV_EBUSY;
		why = "a batch is missing: resend after acked_seq";
		goto answer;
	}
	if (m->seq == in->next_seq) {
		uint64_t boot = m->stream_id >> 32;
		if (in->breaks_known && m->breaks != in->breaks)
			pos_freeze_locked(g, m->from_node);
		in->breaks = m->breaks;
		in->breaks_known = true;
		pthread_rwlock_rdlock(&g->tab_lock);
		for (size_t i = 0; i < m->nrecs && st == KV_OK;)
			st = apply_group(g, me, m, in, &i, &why);
		if (st == KV_OK && m->nrecs > 0)
			pos_advance_locked(g, m->from_node, boot, in->last_lsn, in->last_local);
		if (st == KV_OK && m->copy.set &&
		    (st = check_marker(g, me, m->from_node, m->copy.leader_epoch, &m->copy.start,
		                       &m->copy.end, &why)) == KV_OK) {
			if (m->copy.catchup) {
				st = apply_catchup(g, me, m, in, &div, &caught, &cu_pos, &why);
				need_sync = caught;
			} else {
				if (m->copy.first) {
					/* The range is dropped next: no position may name it
					 * on disk by then (doc/replication.md "Catch-up from
					 * the replica's own data"). */
					in->cp_breaks = m->breaks;
					led_forget_locked(g, &m->copy.start, &m->copy.end);
					if (kv_cu_pos_forget(&g->pos, &m->copy.start,
					                     &m->copy.end) > 0 &&
					    pos_save_locked(g, true) != KV_OK) {
						st = KV_EIO;
						why =
						    "the replica positions file cannot be written";
					}
				}
				if (st == KV_OK)
					st = apply_copy(g, &m->copy, in, &why);
				if (st == KV_OK && m->copy.last && m->copy.next_lsn != 0) {
					/* The copy shows every write up to its base; every
					 * later record of the range follows it. */
					if (kv_cu_pos_put(&g->pos, m->from_node, boot,
					                  m->copy.leader_epoch, &m->copy.start,
					                  &m->copy.end, m->copy.next_lsn - 1,
					                  in->last_local,
					                  m->breaks == in->cp_breaks) == KV_OK)
						g->pos_dirty = true;
					need_sync = true;
				}
			}
		}
		if (st == KV_OK && m->end.set &&
		    (st = check_marker(g, me, m->from_node, m->end.leader_epoch, &m->end.start,
		                       NULL, &why)) == KV_OK) {
			/* Reconciliation: the positions in the old leader epoch must be
			 * known, and this node's not below the new primary's, else this
			 * copy may lack records the new primary has. Past it, only the
			 * old primary's records of other ranges may have been applied
			 * here, else this copy holds records the new primary lacks
			 * (doc/replication.md "Reconciliation after a transfer"). */
			const insrc *o = src_of(g, m->end.old_primary);
			uint64_t mine = o != NULL ? o->max_lsn : 0;
			div = mine == 0 || m->end.end_lsn == 0 || mine < m->end.end_lsn ||
			      (mine > m->end.end_lsn &&
			       (o->recent == NULL ||
			        kv_recent_touches(o->recent, m->end.end_lsn, mine, m->end.start,
			                          m->end.end)));
			if (!div && mine > m->end.end_lsn && m->end.old_primary != me)
				atomic_fetch_add(&g->st_ends_ahead, 1);
			if (m->end.old_primary == me) {
				/* This node is the old primary (a primary transfer): it
				 * applied none of its own records from a stream, but when
				 * nothing of the range was outstanding on its stream to the
				 * new primary as it applied the transfer, both hold the same
				 * records (demos_note_locked). */
				const route *t = find_route(g, m->end.start.p, m->end.start.len);
				div =
				    t == NULL || !demo_in_sync(g, t, m->from_node,
				                               m->end.leader_epoch, m->end.end_lsn);
				mine = div ? 0 : m->end.end_lsn;
			}
			const route *er = find_route(g, m->end.start.p, m->end.start.len);
			bool exact = er != NULL && key_is(&er->start, &m->end.start) &&
			             key_is(&er->end, &m->end.end);
			if (!div && m->end.next_lsn != 0 && exact) {
				/* This node holds the new primary's state of the range at
				 * its end, and every record of the range in the new leader
				 * epoch follows the end: a position (doc/replication.md
				 * "Catch-up from the replica's own data"); only for a range
				 * of this node's configuration (an end that outlived its
				 * range to a merge or a cut leaves none). */
				if (kv_cu_pos_put(&g->pos, m->from_node, boot, m->end.leader_epoch,
				                  &m->end.start, &m->end.end, m->end.next_lsn - 1,
				                  in->last_local, true) == KV_OK)
					g->pos_dirty = true;
			}
			KV_INFO(COMP, "new primary's end of the previous leader epoch",
			        "from=%u old_primary=%u end_lsn=%llu mine=%llu diverged=%d",
			        m->from_node, m->end.old_primary,
			        (unsigned long long)m->end.end_lsn, (unsigned long long)mine, div);
		}
		pthread_rwlock_unlock(&g->tab_lock);
		if (st == KV_OK)
			in->next_seq = m->seq + 1;
		pthread_cond_broadcast(&g->in_cv);
	}
	/* else: a batch applied before (seq < next_seq): its records are in. */
answer:
	ack->acked_seq = in->next_seq - 1;
	ack->acked_lsn = in->last_lsn;
	ack->diverged = div;
	ack->caught_up = caught;
	ack->position = cu_pos;
	local = in->last_local;
	pthread_mutex_unlock(&g->in_mu);
	if (nowait != NULL)
		*nowait = st == KV_OK ? local : 0;
	else if (st == KV_OK && (st = wait_durable(g->env.dur, local)) != KV_OK)
		why = "the write-ahead log cannot be written";
	/* Positions reach the file once the log has synced what they cover: at
	 * once after a copy or a catch-up, else from the positions thread. */
	if (st == KV_OK && g->pos_path != NULL && need_sync) {
		(void)kv_dur_sync(g->env.dur);
		pthread_mutex_lock(&g->in_mu);
		(void)pos_save_locked(g, false);
		pthread_mutex_unlock(&g->in_mu);
	}
	ack->status = st;
	ack->error = why;
	if (st != KV_OK) {
		atomic_fetch_add(&g->st_refused, 1);
		KV_DEBUG(COMP, "replicate refused", "from=%u seq=%llu err=%s why=\"%s\"",
		         m->from_node, (unsigned long long)m->seq, kv_errname(st), why ? why : "");
	}
	return KV_OK;
}

void
kv_rs_handle(kv_rs *g, const kv_req *rq, kv_repl_ack *ack)
{
	(void)handle(g, rq, ack, NULL);
}

int
kv_rs_handle_nowait(kv_rs *g, const kv_req *rq, kv_repl_ack *ack, uint64_t *lsn)
{
	*lsn = 0;
	return handle(g, rq, ack, lsn);
}

/* ------------------------------------------------------------------------
 * Life cycle
 * ------------------------------------------------------------------------ */

/* The positions thread: writes the file every POS_SAVE_MS while a
 * position is not in it at its lsn (a position whose records the log has
 * not synced yet goes in one round later). */
static void *
pos_main(void *arg)
{
	kv_rs *g = arg;

	kv_log_thread_name("kv-repl-pos");
	pthread_mutex_lock(&g->in_mu);
	uint64_t next_fsync = 0;
	while (!atomic_load(&g->stopping)) {
		struct timespec ts;
		deadline_in(&ts, POS_SAVE_MS);
		pthread_cond_timedwait(&g->pos_cv, &g->in_mu, &ts);
		if (!g->pos_dirty || atomic_load(&g->stopping))
			continue;
		uint64_t now = kv_now_ns();
		if (kv_dur_mode(g->env.dur) == KV_FSYNC_NONE && now >= next_fsync) {
			/* With --fsync none the log syncs nothing itself, and a
			 * position names only synced records: sync for them, at
			 * most every POS_FSYNC_NONE_MS. */
			next_fsync = now + POS_FSYNC_NONE_MS * 1000000ull;
			pthread_mutex_unlock(&g->in_mu);
			(void)kv_dur_fsync(g->env.dur);
			pthread_mutex_lock(&g->in_mu);
		}
		(void)pos_save_locked(g, false);
	}
	pthread_mutex_unlock(&g->in_mu);
	return NULL;
}

/* Reads the positions file, if any: positions from before this start,
 * none live. A damaged file counts as none. */
static void
pos_load(kv_rs *g)
{
	int fd = open(g->pos_path, O_RDONLY | O_CLOEXEC);
	uint8_t *p = NULL;
	off_t sz;
	int rv;

	if (fd < 0)
		return;
	sz = lseek(fd, 0, SEEK_END);
	if (sz > 0 && sz <= 64 * 1024 * 1024 && (p = malloc((size_t)sz)) != NULL &&
	    kv_pread_full(fd, p, (size_t)sz, 0) == KV_OK) {
		rv = kv_cu_pos_decode(p, (size_t)sz, &g->pos);
		if (rv != KV_OK)
			KV_WARN(COMP, "replica positions file unreadable: every return is copied",
			        "path=%s err=%s", g->pos_path, kv_errname(rv));
		else
			KV_INFO(COMP, "replica positions loaded", "positions=%zu", g->pos.n);
	}
	free(p);
	close(fd);
}

#define RST_TAIL_RECS 65536u      /* a restart: the last records summarised ... */
#define RST_TAIL_KEYS (16u << 20) /* ... with at most this many key bytes */

static int
rst_span_cb(void *arg, uint64_t lsn, const uint8_t *p, size_t n)
{
	kv_dur_span sp;
	int rv = kv_dur_rec_span(p, n, &sp);

	if (rv != KV_OK)
		return rv;
	return kv_cu_tail_add(arg, lsn, (int)sp.kind, sp.lo, sp.hi);
}

/*
 * A restart (doc/replication.md "After a restart"): keeps the previous
 * start's boot and last recovered lsn, and reads the keys of the last
 * RST_TAIL_RECS records recovery replayed (never those the snapshot
 * folded) from the log's closed segments, before the server serves
 * anything: no lock held, at most one segment (64 MiB) plus those records
 * read once. Unreadable: an empty summary (only an end at the last lsn is
 * then usable).
 */
static void
rst_load(kv_rs *g)
{
	uint64_t last = g->env.rec_last, from = g->env.rec_snap_lsn ? g->env.rec_snap_lsn : 1;
	char err[600] = "";
	int rv = KV_OK;

	g->rst_first = true;
	kv_cu_tail_init(&g->rst_tail, last + 1, 0);
	if (g->env.prev_boot == 0 || g->env.dur == NULL ||
	    (g->env.prev_boot & 0xffffffffu) == (g->env.boot_id & 0xffffffffu))
		return;
	g->rst_boot = g->env.prev_boot & 0xffffffffu;
	g->rst_last = last;
	if (last >= RST_TAIL_RECS && from < last - RST_TAIL_RECS + 1)
		from = last - RST_TAIL_RECS + 1;
	if (from <= last) {
		kv_cu_tail_init(&g->rst_tail, from, RST_TAIL_KEYS);
		rv = kv_dur_read_log(g->env.dur, from, last, rst_span_cb, &g->rst_tail, err,
		                     sizeof(err));
		if (rv != KV_OK) {
			kv_cu_tail_fini(&g->rst_tail);
			kv_cu_tail_init(&g->rst_tail, last + 1, 0);
		}
	}
	KV_INFO(COMP, "restart: the previous start's records, for an old primary's return",
	        "prev_boot=%llu last_lsn=%llu tail_from=%llu tail_to=%llu err=%s detail=\"%s\"",
	        (unsigned long long)g->rst_boot, (unsigned long long)last,
	        (unsigned long long)g->rst_tail.from, (unsigned long long)g->rst_tail.to,
	        kv_errname(rv), err);
}

int
kv_rs_create(const kv_rs_env *env, kv_rs **out)
{
	kv_rs *g = calloc(1, sizeof(*g));

	if (g == NULL)
		return KV_ENOMEM;
	g->env = *env;
	/* Writer-preferring, as the log's barrier: a steady flow of writes
	 * (readers) must not hold a new configuration back. No thread takes it
	 * for reading twice. */
	pthread_rwlockattr_t ra;
	pthread_rwlockattr_init(&ra);
	pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
	pthread_rwlock_init(&g->tab_lock, &ra);
	pthread_rwlockattr_destroy(&ra);
	pthread_mutex_init(&g->smu, NULL);
	pthread_mutex_init(&g->in_mu, NULL);
	pthread_cond_init(&g->in_cv, NULL);
	pthread_mutex_init(&g->wmu, NULL);
	pthread_mutex_init(&g->buf_mu, NULL);
	pthread_cond_init(&g->pos_cv, NULL);
	atomic_init(&g->nstreams, 0);
	/* Records logged before this start are not in the buffer. */
	kv_cu_buf_init(&g->buf, CU_MAX, kv_dur_last_lsn(env->dur));
	rst_load(g);
	if (env->dir != NULL) {
		size_t n = strlen(env->dir) + sizeof(POS_FILE) + 2;
		if ((g->pos_path = malloc(n)) == NULL || (g->pos_dir = strdup(env->dir)) == NULL) {
			kv_rs_destroy(g);
			return KV_ENOMEM;
		}
		snprintf(g->pos_path, n, "%s/%s", env->dir, POS_FILE);
		pos_load(g);
		if (pthread_create(&g->pos_thr, NULL, pos_main, g) != 0) {
			kv_rs_destroy(g);
			return KV_ENOMEM;
		}
		g->pos_started = true;
	}
	*out = g;
	return KV_OK;
}

void
kv_rs_stop(kv_rs *g)
{
	if (g == NULL)
		return;
	atomic_store(&g->stopping, true);
	sweep(g, KV_ECLOSED);
	pthread_mutex_lock(&g->in_mu);
	pthread_cond_signal(&g->pos_cv);
	pthread_mutex_unlock(&g->in_mu);
	size_t n = atomic_load(&g->nstreams);
	for (size_t i = 0; i < n; i++) {
		stream *s = g->streams[i];
		pthread_mutex_lock(&s->mu);
		stream_wake_locked(s);
		pthread_mutex_unlock(&s->mu);
	}
}

void
kv_rs_destroy(kv_rs *g)
{
	if (g == NULL)
		return;
	kv_rs_stop(g);
	if (g->pos_started) {
		/* Joined before in_mu, which it waits on, is destroyed. A clean
		 * stop leaves every position in the file at its lsn (the log is
		 * still open here). */
		pthread_join(g->pos_thr, NULL);
		g->pos_started = false;
		if (g->pos_dirty && kv_dur_fsync(g->env.dur) == KV_OK) {
			pthread_mutex_lock(&g->in_mu);
			(void)pos_save_locked(g, false);
			pthread_mutex_unlock(&g->in_mu);
		}
	}
	size_t n = atomic_load(&g->nstreams);
	for (size_t i = 0; i < n; i++) {
		stream *s = g->streams[i];
		uint64_t until = kv_now_ns() + (CALL_MS + 500ull) * 1000000ull;
		if (s->started)
			pthread_join(s->thr, NULL);
		/* Calls in flight end by their deadline; closing under one can hang.
		 * A link's calls end with it. */
		kv_link_close(s->link);
		s->link = NULL;
		pthread_mutex_lock(&s->mu);
		while (!s->use_link && s->inflight > 0 && kv_now_ns() < until) {
			struct timespec ts;
			deadline_in(&ts, 10);
			pthread_cond_timedwait(&s->cv, &s->mu, &ts);
		}
		pthread_mutex_unlock(&s->mu);
		for (int j = 0; j < WINDOW; j++)
			kv_rpc_async_destroy(s->calls[j]);
		kv_rpc_client_destroy(s->cli);
		while (s->head) {
			entry *e = s->head;
			s->head = e->next;
			free(e);
		}
		while (s->spare) {
			entry *e = s->spare;
			s->spare = e->next;
			free(e);
		}
		div_free_all(s);
		for (size_t k = 0; k < s->copy_cap; k++)
			kv_buf_fini(&s->copy_dd[k]);
		free(s->copy_dd);
		kv_store_cursor_fini(&s->copy_cur);
		pthread_mutex_destroy(&s->mu);
		pthread_cond_destroy(&s->cv);
		if (s->efd >= 0)
			close(s->efd);
		free(s);
	}
	routes_free(g->routes, g->nroutes);
	kv_cu_tail_fini(&g->rst_tail);
	while (g->leds) {
		led *d = g->leds;
		g->leds = d->next;
		led_free(d);
	}
	while (g->qends) {
		qend *x = g->qends;
		g->qends = x->next;
		qend_free(x);
	}
	while (g->demos) {
		demo *d = g->demos;
		g->demos = d->next;
		demo_free(d);
	}
	while (g->jobs) {
		job *j = g->jobs;
		g->jobs = j->next;
		job_free(j);
	}
	sweep(g, KV_ECLOSED);
	pthread_rwlock_destroy(&g->tab_lock);
	pthread_mutex_destroy(&g->smu);
	pthread_mutex_destroy(&g->in_mu);
	pthread_cond_destroy(&g->in_cv);
	pthread_mutex_destroy(&g->wmu);
	pthread_mutex_destroy(&g->buf_mu);
	pthread_cond_destroy(&g->pos_cv);
	kv_cu_buf_fini(&g->buf);
	kv_cu_pos_set_fini(&g->pos);
	for (size_t i = 0; i < MAX_SOURCES; i++)
		kv_recent_free(g->src[i].recent);
	free(g->pos_path);
	free(g->pos_dir);
	free(g);
}

size_t
kv_rs_lag_get(kv_rs *g, kv_rs_lag *out, size_t max)
{
	size_t n = atomic_load(&g->nstreams);
	uint64_t now = kv_now_ns();

	for (size_t i = 0; i < n && i < max; i++) {
		stream *s = g->streams[i];
		kv_rs_lag l = {.node = s->node};
		pthread_mutex_lock(&s->mu);
		for (const entry *e = s->unacked; e; e = e->next)
			l.records += e->kind == ENT_REC;
		if (s->tail_lsn > s->acked_lsn)
			l.lsns = s->tail_lsn - s->acked_lsn;
		if (l.records > 0 && now > s->progress_ns)
			l.ms = (now - s->progress_ns) / 1000000u;
		pthread_mutex_unlock(&s->mu);
		out[i] = l;
	}
	return n;
}

void
kv_rs_stats_get(kv_rs *g, kv_rs_stats *st)
{
	size_t n = atomic_load(&g->nstreams);

	memset(st, 0, sizeof(*st));
	st->streams = n;
	for (size_t i = 0; i < n; i++) {
		stream *s = g->streams[i];
		pthread_mutex_lock(&s->mu);
		for (entry *e = s->unacked; e; e = e->next)
			st->queued++;
		pthread_mutex_unlock(&s->mu);
	}
	st->sent_batches = atomic_load(&g->st_batches);
	st->sent_packed = atomic_load(&g->st_packed);
	st->resends = atomic_load(&g->st_resends);
	st->applied = atomic_load(&g->st_applied);
	st->refused = atomic_load(&g->st_refused);
	st->shrink_asks = atomic_load(&g->st_asks);
	st->demotions = atomic_load(&g->st_demotions);
	st->copies = atomic_load(&g->st_copies);
	st->copied = atomic_load(&g->st_copied);
	st->copy_recs = atomic_load(&g->st_copy_recs);
	st->expand_asks = atomic_load(&g->st_expand_asks);
	st->diverged = atomic_load(&g->st_diverged);
	st->clean_demotions = atomic_load(&g->st_clean_demos);
	st->unclean_demotions = atomic_load(&g->st_unclean_demos);
	st->ends_in_sync = atomic_load(&g->st_ends_in_sync);
	st->ends_ahead_in_sync = atomic_load(&g->st_ends_ahead);
	st->unfence_asks = atomic_load(&g->st_unfence_asks);
	st->catchups = atomic_load(&g->st_catchups);
	st->catchup_refusals = atomic_load(&g->st_cu_refused);
	st->copy_bytes = atomic_load(&g->st_copy_bytes);
	st->copy_urgent_bytes = atomic_load(&g->st_copy_urgent_bytes);
	st->copy_holds = atomic_load(&g->st_copy_holds);
}
