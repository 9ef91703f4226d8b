/*
 * cli_run.c - the CLI inside the test process (cli_run.h).
 */
#include "tests/support/cli_run.h"
#include "client/cli/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int
kv_cli_run(int argc, const char *const *argv, kv_cli_run_result *r)
{
	FILE *out, *err;

	memset(r, 0, sizeof(*r));
	out = open_memstream(&r->out, &r->nout);
	err = open_memstream(&r->err, &r->nerr);
	if (out == NULL || err == NULL) {
		if (out != NULL)
			fclose(out);
		if (err != NULL)
			fclose(err);
		kv_cli_run_free(r);
		return -1;
	}
	r->rc = kv_cli_main(argc, (char **)argv, out, err);
	fclose(out);
	fclose(err);
	return 0;
}

void
kv_cli_run_free(kv_cli_run_result *r)
{
	free(r->out);
	free(r->err);
	memset(r, 0, sizeof(*r));
}
