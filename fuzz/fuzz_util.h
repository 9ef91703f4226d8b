/*
 * fuzz_util.h - what the libFuzzer harnesses of fuzz/ share: a fresh
 * temporary directory per input for the file readers, whole-file writes,
 * and the checks that turn a broken invariant into a crash the fuzzer
 * reports.
 *
 * Every harness links fuzz_util.c, which also defines LLVMFuzzerInitialize
 * (logging off) and turns fsync(2)/fdatasync(2) into no-ops: the readers
 * cut torn tails and fsync, and durability is not what is fuzzed here.
 */
#ifndef KV_FUZZ_UTIL_H
#define KV_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* Aborts (a crash libFuzzer reports, with the input) when cond is false. */
#define FZ_CHECK(cond)                                                                             \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);   \
			abort();                                                                   \
		}                                                                                  \
	} while (0)

/* Where fz_touch leaves what it read, so the reads are not optimised away. */
extern volatile uint8_t fz_sink;

/* Most arguments a harness makes of its input (fz_split_args). */
#define FZ_MAX_ARGS 64

/* Splits a NUL-terminated copy of the input at its NUL bytes into argv
 * (room for FZ_MAX_ARGS + 2 pointers), with argv[0] = prog and a final NULL;
 * returns argc. The caller frees *buf. */
int fz_split_args(const uint8_t *data, size_t size, const char *prog, char **buf, char **argv);

/* Reads every byte of [p, p + n) (so ASan sees a bad buffer at once). */
void fz_touch(const void *p, size_t n);

/* Makes a fresh empty directory $KV_FUZZ_TMPDIR/kvfuzz-XXXXXX (default
 * /tmp; scripts/fuzz.sh points it at a directory under /tmp that it removes
 * afterwards, so a crash leaves nothing behind); aborts when it cannot. */
void fz_tmpdir(char *path, size_t len);

/* Removes every entry of dir (files only: the readers make no subdirectories)
 * and dir itself. */
void fz_rmdir(const char *dir);

/* Writes n bytes to dir/name (created or replaced); aborts on failure. */
void fz_write_file(const char *dir, const char *name, const void *p, size_t n);

/* Returns whether dir/name exists. */
int fz_exists(const char *dir, const char *name);

/* Called from LLVMFuzzerInitialize after the common set-up; a harness that
 * needs more defines fz_init (the default does nothing). */
void fz_init(void);

#endif
