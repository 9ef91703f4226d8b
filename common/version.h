/*
 * version.h - `--version` of the daemons and tools: "NAME VERSION" with the
 * git commit when the build had one, e.g. "shardkv-server 0.1.0 (commit
 * 1a2b3c4d5e6f)". KV_VERSION and KV_GIT_COMMIT come from kv_version.h,
 * which the build writes (cmake/kv_version.cmake); a target whose sources
 * include this header depends on the kv_version target.
 */
#ifndef KV_COMMON_VERSION_H
#define KV_COMMON_VERSION_H

#include "kv_version.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

/* Whether argv asks for --version (before a "--" that ends the options). */
static inline bool
kv_version_requested(int argc, char **argv)
{
	for (int i = 1; i < argc && argv[i] != NULL; i++) {
		if (strcmp(argv[i], "--") == 0)
			return false;
		if (strcmp(argv[i], "--version") == 0)
			return true;
	}
	return false;
}

/* Prints "NAME VERSION[ (commit C)]" and a newline on f. */
static inline void
kv_version_print(FILE *f, const char *name)
{
	if (KV_GIT_COMMIT[0] != '\0')
		fprintf(f, "%s %s (commit %s)\n", name, KV_VERSION, KV_GIT_COMMIT);
	else
		fprintf(f, "%s %s\n", name, KV_VERSION);
}

#endif
