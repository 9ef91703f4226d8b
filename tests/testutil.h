/*
 * testutil.h - helpers shared by the tests: free loopback ports, clocks,
 * and (integration tests) starting and stopping real daemons.
 */
#ifndef KV_TESTS_TESTUTIL_H
#define KV_TESTS_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* Returns a TCP port on 127.0.0.1 that was free a moment ago. */
int kv_test_free_port(void);

/* Writes "tcp://127.0.0.1:PORT" with a free port into buf. */
void kv_test_free_url(char *buf, size_t len);

/* Monotonic milliseconds. */
uint64_t kv_test_now_ms(void);

/* Sleeps for ms milliseconds (polling loops only, never as a readiness wait). */
void kv_test_sleep_ms(unsigned ms);

#endif
