/*
 * testutil.h - helpers shared by the tests of every layer: free loopback
 * ports, clocks, scratch directories, and a cmocka teardown that stops every
 * child process. Starting and stopping processes is common/proc.h.
 */
#ifndef KV_TESTS_SUPPORT_TESTUTIL_H
#define KV_TESTS_SUPPORT_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Returns a TCP port on 127.0.0.1 that was free a moment ago
 * (kv_proc_free_port). */
int kv_test_free_port(void);

/* Writes "tcp://127.0.0.1:PORT" with a free port into buf
 * (kv_proc_free_url). */
void kv_test_free_url(char *buf, size_t len);

/* Monotonic milliseconds. */
uint64_t kv_test_now_ms(void);

/* Sleeps for ms milliseconds (polling loops only, never as a readiness wait). */
void kv_test_sleep_ms(unsigned ms);

/* A fresh, empty directory for one test: kv_test_dir_setup makes
 * /tmp/kv_test_XXXXXX and stores a kv_test_dir in *state (a cmocka setup);
 * kv_test_dir_teardown removes the files in it and the directory. */
typedef struct {
	char path[256];
} kv_test_dir;
int kv_test_dir_setup(void **state);
int kv_test_dir_teardown(void **state);

/* Writes n bytes to the file `name` of d (created or truncated) with
 * `mode`; returns its path (in a static buffer, valid until the next call)
 * or NULL when it cannot be written. */
const char *kv_test_put_file(const kv_test_dir *d, const char *name, const void *p, size_t n,
                             mode_t mode);

/* Removes path and everything below it (links are not followed); says on
 * stderr what it cannot remove. Accepts NULL and "". */
void kv_test_rmtree(const char *path);

/* A cmocka (group) teardown: stops every child of common/proc.h's table
 * (SIGTERM, SIGKILL after KV_TEST_STOP_MS). Always returns 0. */
#define KV_TEST_STOP_MS 5000u
int kv_test_stop_procs(void **state);

#endif
