/*
 * histfile.h - history files: a recorded history written as JSON Lines
 * (doc/contract.md §9), and a history from any source read back into the
 * model of history.h, so that chk_check judges both alike.
 *
 * A file is one event per line, in the order the events happened: an
 * "invoke" of an operation by a process, then its "ok", "fail" or "info"
 * by the same process. Reading maps the file's keys and values onto the
 * model's: each key gets an index, each value written to a register key an
 * identity of its own, each appended token (a string that ends with ';' and
 * holds no other ';') an identity, and each read is rewritten in those
 * identities, so uniqueness and concatenation are what the file said.
 */
#ifndef KV_CHECKER_HISTFILE_H
#define KV_CHECKER_HISTFILE_H

#include "checker/history.h"

#include <stddef.h>
#include <stdio.h>

/* One step of the reconfiguration driver (a "nemesis" event of the file):
 * written as a line when it began and one when it ended, with "process":
 * "nemesis" and "type": "info". Plain data. */
typedef struct {
	uint64_t start; /* when the step began (ns) */
	uint64_t end;   /* when it ended (ns); 0: only its start is known */
	char f[16];     /* "move", "rebalance", "join", "leave", "kill", "restart", ... */
	char args[320]; /* JSON members of its "value" without braces ("\"node\": 3"); may be "" */
	char result[128]; /* JSON members the end line adds ("\"result\": \"ok\""); may be "" */
} chk_nemesis;

/* One scan, as the file names it: its parts are the ops of kind CHK_SCAN
 * with its txn (one per register of its range up to `cut`; those that read
 * "not found" are the keys it passed over). Plain data, strings borrowed. */
typedef struct {
	uint32_t txn;      /* the txn of its parts */
	uint32_t limit;    /* the entries it asked for at most (0: no limit) */
	const char *start; /* its range [start, end); "" end: to the end */
	const char *end;
	const char *cut; /* NULL, or the last key it returned when its limit stopped it
	                    (keys after it were not looked at) */
} chk_scan;

/*
 * Writes ops (any order) over keys to f as JSON Lines, events sorted by
 * time, with the nemesis events nem[0..nnem) (any order; NULL when none)
 * merged in by time. Each scan's parts (ops of kind CHK_SCAN, consecutive
 * in ops) are one "scan" event, described by the entry of scans[0..nscans)
 * with their txn (a scan without one is left out). Values are spelled as the workload wrote them; a
 * read of an append key is the prefix of the key's final value it read (or, when its bytes are not
 * such a prefix, a string naming its length). A failed write is an "info" (it may have taken
 * effect), a failed read a "fail", and a read of an append key whose final value was not read back
 * an "info" (its bytes are not kept, so the file cannot name them). Returns 0, or -1 when memory
 * ran out or a write failed (errno tells).
 */
int chk_histfile_write(FILE *f, const chk_key *keys, size_t nkeys, const chk_op *ops, size_t nops,
                       const chk_scan *scans, size_t nscans, const chk_nemesis *nem, size_t nnem);

/* A history read from a file: its keys, operations and the storage behind
 * them. */
typedef struct chk_histfile chk_histfile;

/*
 * Reads a history from f. On 0 the caller owns *out and frees it with
 * chk_histfile_free(). On -1 the file is malformed, and err holds the line
 * and the reason; on -2 memory ran out. Never trusts the file: every field
 * is checked, and an operation the model does not know yet ("cas") is
 * refused by name. A "scan" becomes one CHK_SCAN op per register of the
 * file in its range (doc/contract.md §9); an append key whose last read
 * began before its last append completed is checked against its longest
 * read (chk_key.final_partial). Lines of "process": "nemesis" are not operations:
 * they are kept as nemesis events (each line one event, start = end = its
 * time) for reports and do not enter the check.
 */
int chk_histfile_read(FILE *f, chk_histfile **out, char *err, size_t errlen);

/* The history in the model's terms; valid until chk_histfile_free(). */
void chk_histfile_history(const chk_histfile *h, const chk_key **keys, size_t *nkeys,
                          const chk_op **ops, size_t *nops);

/* The nemesis events of the file, in file order; valid until
 * chk_histfile_free(). */
void chk_histfile_nemesis(const chk_histfile *h, const chk_nemesis **nem, size_t *nnem);

/*
 * Prints the nemesis events of nem[0..nnem) that overlap [lo - 1 s, hi + 1 s]
 * (at most `max_lines`), one per line, times in ms relative to t0. Prints
 * nothing when none do.
 */
void chk_print_nemesis(FILE *f, const chk_nemesis *nem, size_t nnem, uint64_t lo, uint64_t hi,
                       uint64_t t0, size_t max_lines);

/* The file's line of op's invoke event (from 1). */
size_t chk_histfile_line(const chk_histfile *h, size_t op);

/* Frees h; accepts NULL. */
void chk_histfile_free(chk_histfile *h);

#endif
