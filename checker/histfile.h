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

/*
 * Writes ops (any order) over keys to f as JSON Lines, events sorted by
 * time. Values are spelled as the workload wrote them; a read of an append
 * key is the prefix of the key's final value it read (or, when its bytes
 * are not such a prefix, a string naming its length). A failed write is an
 * "info" (it may have taken effect), a failed read a "fail". Returns 0, or
 * -1 when memory ran out or a write failed (errno tells).
 */
int chk_histfile_write(FILE *f, const chk_key *keys, size_t nkeys, const chk_op *ops, size_t nops);

/* A history read from a file: its keys, operations and the storage behind
 * them. */
typedef struct chk_histfile chk_histfile;

/*
 * Reads a history from f. On 0 the caller owns *out and frees it with
 * chk_histfile_free(). On -1 the file is malformed, and err holds the line
 * and the reason; on -2 memory ran out. Never trusts the file: every field
 * is checked, and an operation the model does not know yet ("del", "cas")
 * is refused by name.
 */
int chk_histfile_read(FILE *f, chk_histfile **out, char *err, size_t errlen);

/* The history in the model's terms; valid until chk_histfile_free(). */
void chk_histfile_history(const chk_histfile *h, const chk_key **keys, size_t *nkeys,
                          const chk_op **ops, size_t *nops);

/* The file's line of op's invoke event (from 1). */
size_t chk_histfile_line(const chk_histfile *h, size_t op);

/* Frees h; accepts NULL. */
void chk_histfile_free(chk_histfile *h);

#endif
