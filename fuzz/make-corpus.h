/*
 * make-corpus.h - what the two files of the seed corpus generator share
 * (make-corpus.c, make-corpus-server.c).
 */
#ifndef KV_FUZZ_MAKE_CORPUS_H
#define KV_FUZZ_MAKE_CORPUS_H

#include "common/config.h"
#include "common/key.h"

#include <nng/nng.h>
#include <stddef.h>
#include <stdint.h>

#define B(s) ((kv_bytes){(const uint8_t *)(s), sizeof(s) - 1})

/* The corpus directory (argv[1]). */
extern const char *kvmc_root;

/* Prints what failed and exits 1. */
void die(const char *what) __attribute__((noreturn));

/* Writes root/harness/name. */
void seed(const char *harness, const char *name, const void *p, size_t n);

/* The same with a control byte in front (the file harnesses). */
void seed_ctl(const char *harness, const char *name, uint8_t ctl, const void *p, size_t n);

/* Writes the body of m (dies unless rv is 0) and frees m. */
void seed_msg(const char *harness, const char *name, int rv, nng_msg *m);

/* Reads dir/name whole (dies on failure); the caller frees. */
uint8_t *read_file(const char *dir, const char *name, size_t *n);

/* Sets b to the bytes of s (no allocation for ""). */
void set_buf(kv_buf *b, const char *s);

/* Sample configurations: three nodes, three ranges and a migration in
 * epoch e; one node owning everything in epoch 2. */
kv_config *make_config(uint64_t e);
kv_config *make_config1(void);

/* make-corpus-server.c: the shard server's seeds. */
void kvmc_server_seeds(void);

#endif
