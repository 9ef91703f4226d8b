/*
 * common/slice.h - a thread's time slice and wake-up class in the kernel's
 * scheduler.
 *
 * Linux's EEVDF scheduler (6.6 and later) lets a thread ask for its own
 * slice (sched_setattr's sched_runtime for SCHED_OTHER, 6.12 and later).
 * A thread that wakes up preempts a running one whose slice is longer than
 * its own at once, where it would otherwise wait until the running one has
 * had its slice (doc/threads.md "Bulk threads").
 */
#ifndef KV_COMMON_SLICE_H
#define KV_COMMON_SLICE_H

/* Asks for a slice of `us` microseconds (100 to 100,000) for the calling
 * thread, at its present nice value. Returns 0, KV_EINVAL (us out of that
 * range), or KV_EIO when the kernel refuses (kernels before 6.12 take the
 * call and ignore the slice). */
int kv_thread_slice(unsigned us);

/* The slice of the bulk threads: a migration's copy, apply and side log,
 * the snapshot, the heartbeat's counting walks. Longer than the default
 * (0.7 ms times 1 + log2 of the CPUs), so that a woken event loop or
 * client-facing thread preempts them at once. */
#define KV_BULK_SLICE_US 20000u

/* Makes the calling thread a batch thread (SCHED_BATCH, at its present
 * nice value, with the default slice): when it wakes up it does not
 * preempt the thread running on the CPU it wakes on, but waits until that
 * one sleeps or the scheduler's tick ends its turn. Its share of the CPU
 * is unchanged. For the threads that work for throughput in the
 * background and are woken often, where a preemption costs a switch and
 * cuts an event loop's round in two: a replication stream
 * (doc/threads.md "Batch threads"). Returns 0, or KV_EIO when the kernel
 * refuses. */
int kv_thread_batch(void);

#endif
