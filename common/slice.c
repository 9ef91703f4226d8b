/*
 * common/slice.c - a thread's time slice (slice.h).
 */
#include "common/slice.h"
#include "common/err.h"

#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

/* sched_setattr's argument (linux/sched/types.h; glibc 2.36 has no wrapper). */
struct kv_sched_attr {
	uint32_t size;
	uint32_t sched_policy;
	uint64_t sched_flags;
	int32_t sched_nice;
	uint32_t sched_priority;
	uint64_t sched_runtime;
	uint64_t sched_deadline;
	uint64_t sched_period;
	uint32_t sched_util_min;
	uint32_t sched_util_max;
};

/* linux/sched.h's value; glibc's sched.h names it only with _GNU_SOURCE */
#ifndef SCHED_BATCH
#define SCHED_BATCH 3
#endif

/* The calling thread's nice value into *nice. Returns 0 or KV_EIO. */
static int
own_nice(int *nice)
{
	pid_t tid = (pid_t)syscall(SYS_gettid);

	errno = 0;
	*nice = getpriority(PRIO_PROCESS, (id_t)tid);
	return errno != 0 ? KV_EIO : KV_OK;
}

int
kv_thread_slice(unsigned us)
{
	int nice;

	if (us < 100 || us > 100000)
		return KV_EINVAL;
	if (own_nice(&nice) != 0)
		return KV_EIO;
	struct kv_sched_attr a = {.size = sizeof(a),
	                          .sched_policy = SCHED_OTHER,
	                          .sched_nice = nice,
	                          .sched_runtime = (uint64_t)us * 1000u};
	if (syscall(SYS_sched_setattr, 0, &a, 0) != 0)
		return KV_EIO;
	return KV_OK;
}

int
kv_thread_batch(void)
{
	int nice;

	if (own_nice(&nice) != 0)
		return KV_EIO;
	struct kv_sched_attr a = {
	    .size = sizeof(a), .sched_policy = SCHED_BATCH, .sched_nice = nice};
	if (syscall(SYS_sched_setattr, 0, &a, 0) != 0)
		return KV_EIO;
	return KV_OK;
}
