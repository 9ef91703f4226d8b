/*
 * history.h - the model of the history checker: a recorded history of
 * appends, puts, deletes, gets and scans on a fixed set of keys, and the
 * checks that decide whether a cluster could have produced it.
 *
 * Every value written is unique: the value identity `chk_val_id(client,
 * seq)` is spelled "c<client>.<seq>" (a register value) or "c<client>.<seq>;"
 * (an append token), so a read names the write it observed. Times are
 * CLOCK_MONOTONIC nanoseconds of one process. An operation that failed (a
 * timeout, an unreachable server) may still take effect at any later time;
 * its completion is CHK_NEVER.
 *
 * The module does no I/O except chk_print_*(); it neither allocates per
 * operation nor keeps state between calls, so tests feed it hand-made
 * histories.
 */
#ifndef KV_CHECKER_HISTORY_H
#define KV_CHECKER_HISTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* The completion time of an operation that failed or whose outcome is unknown. */
#define CHK_NEVER UINT64_MAX

/* How many violations chk_result keeps in detail (all are counted). */
#define CHK_MAX_KEPT 16

/* The default bound of the search of one register with deletes: states
 * (sets of linearized operations with a value) it visits at most. */
#define CHK_SEARCH_STATES 1000000u

/* The kind of an operation. */
typedef enum {
	CHK_APPEND = 1, /* append of the token of `val` */
	CHK_PUT = 2,    /* put of the register value `val` */
	CHK_GET = 3,    /* get; what it read is in status, val, len, hash */
	CHK_DEL = 4,    /* delete of a register; what it deleted is in status and val, like a
	                   get's read (CHK_NOTFOUND: it found no key) */
	CHK_SCAN = 5,   /* one register's part of a scan, read like a get (a key the scan
	                   did not return is CHK_NOTFOUND); the parts of one scan share
	                   `txn` but, unlike an mget's, are not atomic together */
	CHK_CAS = 6,    /* compare-and-set of a register: when it holds `hash` (the expected
	                   identity, 0: absent) it becomes `val` (0: absent, a delete if
	                   equal); CHK_OK applied, CHK_MISMATCH not (it held another value:
	                   `len`, 0 absent, CHK_CUR_UNKNOWN when not known), CHK_FAILED
	                   unknown */
} chk_kind;

/* A CHK_CAS with CHK_MISMATCH whose current value is not known. */
#define CHK_CUR_UNKNOWN UINT64_MAX

/* What an operation returned. */
typedef enum {
	CHK_OK = 0,       /* acknowledged (a get, scan or delete found the key) */
	CHK_NOTFOUND = 1, /* a get, scan or delete found no key */
	CHK_FAILED = 2,   /* failed or timed out: a write (or delete) may or may not take
	                     effect */
	CHK_GARBAGE = 3,  /* a get or delete of a register read bytes that name no value */
	CHK_MISMATCH = 4, /* a cas whose condition did not hold: nothing written */
} chk_status;

/* One recorded operation. 64 bytes, plain data. A multi-key operation is
 * recorded as one op per key, tied by `txn`. */
typedef struct {
	uint64_t invoke;   /* when the call began (ns) */
	uint64_t complete; /* when it returned (ns); CHK_NEVER when it failed */
	uint64_t ret;      /* when it returned (ns), also when it failed (history files) */
	uint64_t val;      /* append/put: the identity written; get, scan or delete of a
	                      register: the one read (deleted) */
	uint64_t len;      /* append: the value length it returned (0: not known); get of an
	                      append key: bytes read */
	uint64_t hash;     /* get of an append key: chk_hash() of the bytes read */
	uint32_t key;      /* index into the key table */
	uint32_t client;   /* the client that ran it (0: the checker's final reads) */
	uint8_t kind;      /* chk_kind */
	uint8_t status;    /* chk_status */
	int16_t err;       /* the client's error code when status is CHK_FAILED */
	uint32_t txn;      /* 0: a single-key op; else the ops with this id are one mput
	                      (puts), one mget (gets) or one scan (CHK_SCAN parts), with
	                      equal times; with CHK_TXN_LOOSE set, an mput or mget whose
	                      keys did not all live on one node during the call */
} chk_op;

/* The bit of chk_op.txn that marks an mput or mget not atomic: its keys did
 * not all live on one node while it ran (a configuration split them), so
 * by the contract each key's part is only a single-key op. Such an op is
 * still one call (one line in a history file, with "atomic": false); the
 * check leaves it out of the atomicity check. Ids stay below this bit. */
#define CHK_TXN_LOOSE 0x80000000u

/* A time during which the keys of one group (keys [first, first + n)) may
 * not all have lived on one node while mputs and mgets of it could run. */
typedef struct {
	uint32_t first, n; /* the group's keys */
	uint64_t from, to; /* ns, on the ops' clock */
} chk_loose_win;

/*
 * Marks CHK_TXN_LOOSE every mput and mget part (txn set, CHK_PUT or CHK_GET)
 * on a key of a window's group whose call overlaps the window: from its
 * invocation to its completion, or without end when it failed (a failed
 * mput may still land, in part, later). Returns the parts marked.
 */
size_t chk_loosen(chk_op *ops, size_t nops, const chk_loose_win *win, size_t nwin);

/* One key of the history. */
typedef struct {
	const char *name;        /* for reports */
	bool append;             /* true: an append key (tokens); false: a register (put/get) */
	bool final_known;        /* append keys: the final value was read after the run */
	bool final_found;        /* ... and the key existed */
	const uint8_t *final;    /* ... its bytes (borrowed) */
	size_t final_len;        /* ... and length */
	uint64_t final_invoke;   /* when that final read began (history files; 0: unknown) */
	uint64_t final_complete; /* ... and returned */
	bool final_partial;      /* the final read failed: `final` is the longest value a
	                            get read (between final_invoke and final_complete), so
	                            only appends completed before it began must be in it */
} chk_key;

/* The kinds of violation. */
typedef enum {
	CHK_V_LOST = 1,      /* an acknowledged append is missing from the final value */
	CHK_V_DUPLICATE,     /* a token appears more than once */
	CHK_V_REORDER,       /* tokens out of real-time order */
	CHK_V_APPEND_LEN,    /* an append's returned length disagrees with its token's place */
	CHK_V_UNKNOWN_TOKEN, /* the final value holds bytes that no append of this key wrote */
	CHK_V_STALE_READ,    /* a read returned a value already overwritten (or not yet there) */
	CHK_V_FUTURE_READ,   /* a read returned a write that began after the read ended */
	CHK_V_NEVER_WRITTEN, /* a read returned a value no write of this key wrote */
	CHK_V_NOT_PREFIX,    /* a read of an append key is not a prefix of the final value */
	CHK_V_BAD_HISTORY,   /* the history itself is malformed (a recorder bug) */
	CHK_V_UNORDERED,     /* no order of a register's writes explains what its reads saw */
	CHK_V_FRACTURED,     /* an mget saw part of an mput's writes, not all */
	CHK_V_TXN_CYCLE,     /* the write orders that mgets imply contradict each other */
} chk_violation_kind;

/* One violation: its kind, the key, the operations involved and a sentence. */
typedef struct {
	int kind;      /* chk_violation_kind */
	uint32_t key;  /* key index */
	size_t op;     /* the operation found wrong (index into ops); SIZE_MAX: none */
	size_t other;  /* the operation it conflicts with; SIZE_MAX: none */
	char msg[256]; /* what is wrong, in one sentence */
} chk_violation;

/* What chk_check() found. */
typedef struct {
	size_t nviolations;            /* all violations found */
	size_t nkept;                  /* those kept in v[] (the first ones) */
	chk_violation v[CHK_MAX_KEPT]; /* the first violations */
	size_t appends_acked;          /* acknowledged appends */
	size_t appends_failed;         /* failed appends */
	size_t appends_failed_applied; /* failed appends that did take effect */
	size_t tokens;                 /* tokens in the final values */
	size_t reads_checked;          /* gets that were checked */
	size_t writes_acked;           /* acknowledged puts */
	size_t writes_failed;          /* failed puts */
	size_t keys_unchecked;         /* append keys without a final value (nor any read) */
	size_t deletes_acked;          /* deletes that returned (a value or not found) */
	size_t deletes_failed;         /* deletes of unknown outcome */
	size_t registers_searched;     /* registers with deletes checked by the search */
	size_t registers_unchecked;    /* ... whose search hit its bound: not checked */
	size_t mgets_checked;          /* mgets whose atomicity was checked */
	size_t mputs;                  /* mputs in the history */
	size_t cas_applied;            /* cas operations acknowledged as applied */
	size_t cas_mismatched;         /* cas operations refused: the condition did not hold */
	size_t cas_failed;             /* cas operations of unknown outcome */
} chk_result;

/* The identity of value `seq` of client `client` (both from 1). */
static inline uint64_t
chk_val_id(uint32_t client, uint32_t seq)
{
	return ((uint64_t)client << 32) | seq;
}

/* Writes the register spelling of id ("c<client>.<seq>") into buf and
 * returns its length (snprintf semantics). */
int chk_format_val(char *buf, size_t len, uint64_t id);

/* Parses a register value. Returns true and sets *id when `p` is exactly
 * the spelling of a value identity. */
bool chk_parse_val(const void *p, size_t n, uint64_t *id);

/* FNV-1a of n bytes, continued from h (start with CHK_HASH_INIT). */
#define CHK_HASH_INIT 0xcbf29ce484222325ull
uint64_t chk_hash(uint64_t h, const void *p, size_t n);

/*
 * Checks the history `ops` over `keys`. Fills *res (zeroed first). Returns
 * 0, or -1 when memory ran out (nothing was checked then).
 *
 * Append keys: every acknowledged append appears exactly once in the final
 * value; failed appends at most once; nothing else appears; the order of the
 * tokens respects real time (an append that completed before another began
 * comes first); an append's returned length is where its token ends; a get
 * reads a prefix of the final value that holds every append completed
 * before it began, none begun after it ended, and no fewer tokens than a
 * get that completed before it began. With final_partial (the final read
 * failed and `final` is the longest read), an acknowledged append need be
 * in it only when it completed before that read began.
 *
 * Registers: complete per-key linearizability of puts and gets with unique
 * values. A get returns a value put to that key by a put that began before
 * the get ended, and some order of the puts (each at a point inside its
 * call; a failed put at any point after it began, or never) explains every
 * read, not-found being the value before the first put. Common anomalies
 * (a stale or future read) are named as such; the rest are
 * CHK_V_UNORDERED, found with Gibbons and Korach's zones in O(n log n).
 *
 * Registers with deletes: a delete writes "absent" and returns what it
 * removed, so "absent" is no unique value and the zones do not apply. Such
 * a register is decided by a search over the orders of its operations
 * (Wing and Gong, with Lowe's memo of visited states: the set of operations
 * placed and the register's value), complete and exact: every get and
 * delete returns the value the order gives it at its place, every
 * acknowledged operation is placed inside its call, a failed put or delete
 * anywhere after it began or never. The search visits at most
 * `max_states` states per register; one that needs more is counted in
 * registers_unchecked, never reported valid or violated.
 *
 * Compare-and-set (CHK_CAS): a register with one is decided by the same
 * search as one with deletes: an applied cas is placed where the register
 * holds its expected value and writes its own (or "absent"), a refused one
 * where it holds another value (the current value it was told, when
 * known), one of unknown outcome where it holds the expected value or
 * never. Values written by cas are unique like those of puts.
 *
 * Scans: each key's part of a scan (CHK_SCAN) is checked as a get of that
 * key over the scan's call, "not found" for a key the scan passed over.
 *
 * Multi-key operations (ops tied by `txn`, register keys only): each key's
 * part is checked as a single-key op, and every mget sees (except loose ones,
 * CHK_TXN_LOOSE, with loose mputs counting as single puts), for every mput,
 * all or none of the mput's writes to the keys it read: where it read the
 * mput's value on one key, on another key of the mput it read that value or
 * one written after it, never "absent" or a value put before the mput
 * began (CHK_V_FRACTURED; "absent" on a key with deletes is left to the
 * key's own check, since a delete after the mput may explain it). Reading a value put after the
 * mput orders the mput first on that key; those orders must not form a circle (CHK_V_TXN_CYCLE).
 */
int chk_check(const chk_key *keys, size_t nkeys, const chk_op *ops, size_t nops, chk_result *res);

/* chk_check with the search of registers with deletes bounded by
 * `max_states` (chk_check: CHK_SEARCH_STATES). */
int chk_check_bounded(const chk_key *keys, size_t nkeys, const chk_op *ops, size_t nops,
                      size_t max_states, chk_result *res);

/* Returns a short name of a violation kind ("lost append"). */
const char *chk_violation_name(int kind);

/*
 * Prints a violation and the history around it: the operations on its key
 * that overlap the time window of the operations involved (at most
 * `max_lines`), times in ms relative to `t0`.
 */
void chk_print_violation(FILE *f, const chk_key *keys, const chk_op *ops, size_t nops,
                         const chk_violation *v, uint64_t t0, size_t max_lines);

/* Prints one operation on one line ("c3 append k/a000 c3.17; -> ok len=42
 * [12.345, 12.512] ms"). */
void chk_print_op(FILE *f, const chk_key *keys, const chk_op *op, uint64_t t0);

#endif
