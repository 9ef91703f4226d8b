/*
 * test_slice.c - a thread's time slice (common/slice.h): the slice asked
 * for is the calling thread's own, other threads keep theirs, and a slice
 * outside 100 us to 100 ms is refused. Where the kernel shows no slice
 * (`se.slice` in /proc/thread-self/sched, or a kernel before 6.12 that
 * ignores it) only the answers are checked.
 */
#include "common/err.h"
#include "common/slice.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/utsname.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

/* The calling thread's slice in ns from the kernel, or 0 when not shown. */
static uint64_t
own_slice_ns(void)
{
	FILE *f = fopen("/proc/thread-self/sched", "r");
	char line[256];
	uint64_t v = 0;

	if (f == NULL)
		return 0;
	while (fgets(line, sizeof(line), f) != NULL) {
		unsigned long long x;
		if (strncmp(line, "se.slice", 8) == 0 && sscanf(line + 8, " : %llu", &x) == 1) {
			v = x;
			break;
		}
	}
	fclose(f);
	return v;
}

/* Whether the kernel keeps a slice asked for (6.12 and later). */
static bool
kernel_keeps_slices(void)
{
	struct utsname u;
	unsigned maj = 0, min = 0;

	if (uname(&u) != 0 || sscanf(u.release, "%u.%u", &maj, &min) != 2)
		return false;
	return maj > 6 || (maj == 6 && min >= 12);
}

struct probe {
	int rv;
	uint64_t before, after;
};

static void *
bulk_thread(void *arg)
{
	struct probe *p = arg;
	p->before = own_slice_ns();
	p->rv = kv_thread_slice(KV_BULK_SLICE_US);
	p->after = own_slice_ns();
	return NULL;
}

static void
bulk_slice_is_the_calling_threads_own(void **state)
{
	(void)state;
	struct probe p = {.rv = -1};
	pthread_t t;
	uint64_t mine = own_slice_ns();

	assert_int_equal(pthread_create(&t, NULL, bulk_thread, &p), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	assert_int_equal(p.rv, KV_OK);
	if (p.after == 0 || !kernel_keeps_slices())
		skip();
	assert_int_equal(p.after, (uint64_t)KV_BULK_SLICE_US * 1000u);
	assert_int_not_equal(p.before, p.after);
	assert_int_equal(own_slice_ns(), mine); /* this thread's is untouched */
}

static void
slice_out_of_range_is_refused(void **state)
{
	(void)state;
	uint64_t mine = own_slice_ns();

	assert_int_equal(kv_thread_slice(0), KV_EINVAL);
	assert_int_equal(kv_thread_slice(99), KV_EINVAL);
	assert_int_equal(kv_thread_slice(100001), KV_EINVAL);
	assert_int_equal(own_slice_ns(), mine);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(bulk_slice_is_the_calling_threads_own),
	    cmocka_unit_test(slice_out_of_range_is_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
