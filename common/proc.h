/*
 * proc.h - the child processes of a test program or of shardkv-checker: one
 * process table for fork+exec with the output captured to a log, readiness
 * waits with a deadline, stopping with a signal and SIGKILL after a bound,
 * reaping, and a kill-all that runs on every exit path; plus free loopback
 * ports for the children to listen on.
 *
 * Every child started here is recorded in a process-wide table (the one
 * mutable global of the module: the exit paths need it). kv_proc_kill_all()
 * SIGKILLs and reaps whatever is in it; kv_proc_install_exit_paths() makes
 * it run at exit() (a failed assertion that ends the process, a return from
 * main) and on fatal signals, and every child also gets PR_SET_PDEATHSIG, so
 * no path leaves a daemon behind, not even SIGKILL of the parent (a ctest
 * timeout). Readiness is always a poll with a deadline, never a fixed sleep.
 *
 * Library kv_proc (libc only), not kv_common: shardkv-checker links the
 * static libshardkv, which carries its own copies of kv_common's objects,
 * so it cannot link kv_common beside it; the tests link both.
 *
 * Not thread-safe: one thread (the one that spawns; normally main) calls
 * these, except kv_proc_kill_all(), which is async-signal-safe. The death
 * signal follows the thread that forked: fork from a thread that lives as
 * long as the children should.
 */
#ifndef KV_COMMON_PROC_H
#define KV_COMMON_PROC_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define KV_PROC_MAX 128 /* children alive at a time */

/*
 * Installs, once per process (later calls do nothing): atexit of
 * kv_proc_kill_all(), and handlers that kill every child and then die of
 * the signal for SIGHUP, SIGQUIT, SIGABRT, SIGSEGV and SIGBUS, and for
 * SIGINT and SIGTERM when `on_stop` is NULL; otherwise those two call
 * on_stop(sig), a signal handler of the caller's (which may end with
 * kv_proc_die(sig)). kv_proc_spawn*() call it with NULL.
 */
void kv_proc_install_exit_paths(void (*on_stop)(int sig));

/* Kills every child (kv_proc_kill_all), then dies of `sig` by its default
 * action. Async-signal-safe: for signal handlers. */
void kv_proc_die(int sig);

/*
 * Sets a function that kv_proc_kill_all() calls after the children are
 * gone (for what they leave behind, such as network namespaces); NULL:
 * none. It must be async-signal-safe.
 */
void kv_proc_set_exit_hook(void (*hook)(void));

/*
 * Forks and execs `path` with argv (argv[0] may differ from path): stdin
 * from /dev/null, stdout and stderr appended to `log` (NULL: /dev/null).
 * The child has default signal handling and no other descriptor of this
 * process, and dies with the calling thread. Records it in the table.
 * Returns its pid, or -1 with errno set (the log cannot be opened, the
 * table is full, fork failed).
 */
pid_t kv_proc_spawn(const char *path, char *const argv[], const char *log);

/*
 * kv_proc_spawn() with the environment `envp` (NULL: this process's) and
 * the child's descriptors 0, 1 and 2 taken from fds[0..2] (which stay open
 * in the caller; the caller closes them). Returns the pid or -1.
 */
pid_t kv_proc_spawn_stdio(const char *path, char *const argv[], char *const envp[],
                          const int fds[3]);

/*
 * Returns true when child `pid` has exited (or is no child of ours, or pid
 * is not positive); then *status (may be NULL) holds its waitpid status
 * (0 when unknown) and it is forgotten. Does not block.
 */
bool kv_proc_exited(pid_t pid, int *status);

/*
 * Waits up to `ms` for child `pid` to exit. Returns 0 when it did (*status,
 * may be NULL, set; forgotten), KV_ETIMEDOUT when it still runs (still
 * recorded), KV_EINVAL when it is no child of ours (forgotten).
 */
int kv_proc_wait(pid_t pid, unsigned ms, int *status);

/*
 * kv_proc_wait(), and on the deadline SIGKILL and reap it: returns 0 when it
 * exited by itself, KV_ETIMEDOUT when it had to be killed (*status is then
 * the status of the kill), KV_EINVAL when it is no child of ours. Either way
 * it is gone and forgotten afterwards.
 */
int kv_proc_reap(pid_t pid, unsigned ms, int *status);

/* Sends `sig` to child `pid`, then kv_proc_reap(pid, ms, status). */
int kv_proc_stop(pid_t pid, int sig, unsigned ms, int *status);

/*
 * Stops every recorded child: SIGTERM to all, then waits up to `ms` in all
 * for them to exit and SIGKILLs the rest (for a test's teardown).
 */
void kv_proc_stop_all(unsigned ms);

/* SIGKILLs and reaps every recorded child, then runs the exit hook.
 * Async-signal-safe. */
void kv_proc_kill_all(void);

/* Says whether `arg` is ready: 0 ready, > 0 not yet, < 0 give up (that value
 * is returned by kv_proc_wait_ready). */
typedef int kv_proc_ready_cb(void *arg);

/*
 * Calls ready(arg) every `poll_ms` until it returns 0 or `ms` have passed.
 * When pid > 0 and that child exits meanwhile, gives up at once: *status
 * (may be NULL) holds its waitpid status and it is forgotten. Returns 0,
 * KV_ETIMEDOUT, KV_ECLOSED (the child exited), or ready's negative value.
 */
int kv_proc_wait_ready(pid_t pid, unsigned ms, unsigned poll_ms, kv_proc_ready_cb *ready, void *arg,
                       int *status);

/* Returns a TCP port on 127.0.0.1 that was free a moment ago, or -1. It
 * lies below the kernel's ephemeral range (no outgoing connection takes it
 * while a server restarts on it) and is claimed for this process's lifetime
 * (no other process using this function gets it). Thread-safe. */
int kv_proc_free_port(void);

/* Writes "tcp://127.0.0.1:PORT" with a free port into buf. Returns 0, or -1
 * (no port, or len too small). */
int kv_proc_free_url(char *buf, size_t len);

/* Prints the last `lines` lines (from the last 64 KiB) of the log `path` to
 * stderr under a header line; nothing when it cannot be read. */
void kv_proc_print_log_tail(const char *path, int lines);

#endif
