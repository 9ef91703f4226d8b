/*
 * testutil.h - helpers shared by the tests: free loopback ports, clocks,
 * and (integration tests) starting and stopping real daemons.
 */
#ifndef KV_TESTS_SUPPORT_TESTUTIL_H
#define KV_TESTS_SUPPORT_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Returns a TCP port on 127.0.0.1 that was free a moment ago. */
int kv_test_free_port(void);

/* Writes "tcp://127.0.0.1:PORT" with a free port into buf. */
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

/* Forks and execs path with argv: stdin from /dev/null, stdout and stderr
 * appended to log (NULL: discarded), SIGPIPE back to default, and the child
 * killed when this process dies. Returns the pid or -1. */
pid_t kv_test_fork_exec(const char *path, char *const argv[], const char *log);

#endif
