/*
 * main.c - the `shardkv` command line program; everything is in cli.c, and
 * the interactive prompt, opened here when there is no command and a
 * terminal, in repl.c.
 */
#include "client/cli/cli.h"

#include <signal.h>
#include <stdio.h>
#include <unistd.h>

int
main(int argc, char **argv)
{
	kv_cli_args a;
	char msg[256];
	bool prompt;

	/* A closed pipe (`shardkv keys | head`) is an error on write, not a signal. */
	signal(SIGPIPE, SIG_IGN);
	prompt = kv_cli_parse(argc, argv, &a, msg, sizeof(msg)) != 0 && a.no_command &&
	         isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
	kv_cli_args_fini(&a);
	if (prompt)
		return kv_cli_repl(argc, argv, stdout, stderr);
	return kv_cli_main(argc, argv, stdout, stderr);
}
