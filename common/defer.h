/*
 * defer.h - work left to the end of a thread's round.
 *
 * A thread that runs rounds (an event loop of rpc_tcp.c: read what has
 * arrived, run the handlers, write the answers) brackets each round with
 * kv_defer_begin() and kv_defer_end(). Code running inside the round may
 * leave a function to its end instead of waking another thread to do the
 * work now: the log's writes of --fsync batch, for instance, are done
 * once for every request of the round, on the loop's thread, before the
 * round's answers are written (shardserver/durable/wal.c).
 *
 * The state is per thread; nothing here locks. A function left to the end
 * runs once per round however often it was left, with no lock of the
 * caller held, in the order first left.
 */
#ifndef KV_COMMON_DEFER_H
#define KV_COMMON_DEFER_H

#include <stdbool.h>

typedef void (*kv_defer_fn)(void *arg);

/* Starts a round on this thread. A round begun inside another is part of
 * it: its end runs nothing, the outer one's end runs everything. */
void kv_defer_begin(void);

/* Leaves fn(arg) to the end of this thread's round. Returns false when the
 * thread is in no round or its list is full (a handful of entries): the
 * caller then does the work, or hands it off, itself. */
bool kv_defer(kv_defer_fn fn, void *arg);

/* Ends the round and runs what was left, in order. While they run the
 * thread is in no round: what they would leave, they do themselves. */
void kv_defer_end(void);

#endif
