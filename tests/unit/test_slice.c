/*
 * test_slice.c - a thread's time slice (common/slice.h): the slice asked
 * for is the calling thread's own, other threads keep theirs, and a slice
 * outside 100 us to 100 ms is refused. Where the kernel shows no slice
 * (`se.slice` in /proc/thread-self/sched, or a kernel before 6.12 that
 * ignores it) only the answers are checked. A batch thread's class is its
 * own too, at the nice value it had.
 */
#include "common/err.h"
#include "common/slice.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <unistd.h>

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

#ifndef SCHED_BATCH
#define SCHED_BATCH 3 /* linux/sched.h */
#endif

static int
own_nice(void)
{
	return getpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid));
}

struct class_probe {
	int rv, policy_before, policy, nice_before, nice_after;
};

static void *
batch_thread(void *arg)
{
	struct class_probe *p = arg;
	struct sched_param none = {0};

	/* an ordinary thread first, whatever the test's own class (moving
	 * between the non-realtime classes needs no privilege), and a nice
	 * value of its own, so that keeping it shows */
	(void)sched_setscheduler(0, SCHED_OTHER, &none);
	(void)setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 3);
	p->policy_before = sched_getscheduler(0);
	p->nice_before = own_nice();
	p->rv = kv_thread_batch();
	p->policy = sched_getscheduler(0);
	p->nice_after = own_nice();
	return NULL;
}

static void
batch_class_is_the_calling_threads_own_at_its_nice_value(void **state)
{
	(void)state;
	struct class_probe p = {.rv = -1};
	pthread_t t;
	int mine = sched_getscheduler(0);

	assert_int_equal(pthread_create(&t, NULL, batch_thread, &p), 0);
	assert_int_equal(pthread_join(t, NULL), 0);
	if (p.rv == KV_EIO)
		skip(); /* a sandbox that refuses sched_setattr */
	assert_int_equal(p.rv, KV_OK);
	assert_int_equal(p.policy_before, SCHED_OTHER);
	assert_int_equal(p.policy, SCHED_BATCH);
	assert_int_equal(p.nice_after, p.nice_before);
	assert_int_equal(sched_getscheduler(0), mine); /* this thread's is untouched */
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
	    cmocka_unit_test(batch_class_is_the_calling_threads_own_at_its_nice_value),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
