/*
 * cli_run.c - the CLI inside the test process (cli_run.h).
 */
#include "tests/support/cli_run.h"
#include "client/cli/cli.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The lowest level the process's logger prints now. */
static enum kv_log_level
level_now(void)
{
	for (int l = KV_LOG_DEBUG; l < KV_LOG_OFF; l++)
		if (kv_log_enabled((enum kv_log_level)l))
			return (enum kv_log_level)l;
	return KV_LOG_OFF;
}

int
kv_cli_run(int argc, const char *const *argv, kv_cli_run_result *r)
{
	FILE *out, *err;
	enum kv_log_level level = level_now();

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
	r->level = (int)level_now();
	/* The CLI sets the process's log level for itself (off unless
	 * verbose): the servers and controllers of the test go on logging as
	 * before, so that a failure's output shows what they did. */
	kv_log_set_level(level);
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
