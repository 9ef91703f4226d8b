/*
 * main.c - the `shardkv` command line program; everything is in cli.c.
 */
#include "client/cli/cli.h"

#include <signal.h>
#include <stdio.h>

int
main(int argc, char **argv)
{
	/* A closed pipe (`shardkv keys | head`) is an error on write, not a signal. */
	signal(SIGPIPE, SIG_IGN);
	return kv_cli_main(argc, argv, stdout, stderr);
}
