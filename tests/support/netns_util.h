/*
 * netns_util.h - a small multi-host network for integration tests, made of
 * Linux network namespaces: one "switch" namespace holding a bridge, and one
 * namespace per host, each joined to the bridge by a veth pair (eth0 in the
 * host, p<N> in the switch), with a private address 10.77.0.<octet>/24.
 * Nothing is created in the namespace the test runs in: the bridge, the
 * ports and every address live in the namespaces made here, and deleting
 * the namespaces removes all of it.
 *
 * Faults: a host's switch port down and up (a pulled cable), netem delay
 * and loss on a host's eth0 (when the kernel has sch_netem; otherwise loss
 * only, by a u32 filter on the IP id redirected to a veth that is down), and
 * a partition between two hosts (static neighbour entries with an unused
 * MAC address on both sides: their frames are sent but nobody takes them,
 * so connects see their SYNs dropped, not refused).
 *
 * Every namespace made is recorded in a process-wide table, and every
 * process started is in common/proc.h's; its atexit and fatal-signal
 * handlers kill the processes and then remove the namespaces (unmounted and
 * unlinked); processes also get PR_SET_PDEATHSIG. Namespaces left behind by a test
 * process that was SIGKILLed are removed by the next kv_nn_create().
 *
 * Needs root and the `ip` and `tc` programs (iproute2). Not thread-safe:
 * one thread (the test's main thread) calls these.
 */
#ifndef KV_TESTS_SUPPORT_NETNS_UTIL_H
#define KV_TESTS_SUPPORT_NETNS_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define KV_NN_MAX_HOSTS 8
#define KV_NN_SUBNET    "10.77.0." /* every host's address is this plus its octet */

/* One host of the network. */
typedef struct {
	char name[16]; /* label given by the test ("ctl", "s1") */
	char ns[48];   /* its namespace, "<prefix>-<name>" */
	char addr[16]; /* its IPv4 address, without the prefix length */
	char port[16]; /* its veth end in the switch namespace */
	bool netem;    /* a netem qdisc is on its eth0 */
	bool lossf;    /* the fallback loss filter is on its eth0 */
} kv_nn_host;

/* A network. Zero-initialise, then kv_nn_create(). */
typedef struct {
	char prefix[24];                   /* "kvnn<pid>", unique per test process */
	char sw[48];                       /* the switch namespace */
	char log[320];                     /* where ip and tc write their output */
	int nhosts;                        /* hosts added */
	kv_nn_host hosts[KV_NN_MAX_HOSTS]; /* by index, in order of kv_nn_add_host */
	bool has_netem;                    /* the kernel has sch_netem (probed once) */
	bool probed;                       /* has_netem is known */
} kv_nn;

/*
 * Says whether namespaces can be made here: the process is root, `ip` is
 * installed and `ip netns add` works (checked with a throwaway namespace).
 * Returns 0, or -1 with the reason in why.
 */
int kv_nn_available(char *why, size_t len);

/*
 * Makes the switch namespace with a bridge, after removing namespaces left
 * behind by dead test processes. `log` (a file) receives the output of every
 * ip and tc command. Returns 0 or -1 (reason on stderr; nothing left).
 */
int kv_nn_create(kv_nn *n, const char *log);

/* Adds a host `name` (at most 8 characters) with address KV_NN_SUBNET +
 * octet. Returns its index, or -1. */
int kv_nn_add_host(kv_nn *n, const char *name, unsigned octet);

/* Removes every namespace of the network (killing what still runs in
 * them). Accepts a network that was never created. */
void kv_nn_destroy(kv_nn *n);

/*
 * Starts argv (argv[0] an absolute path) inside host h's namespace with
 * stdin from /dev/null and stdout and stderr appended to `log`; the process
 * keeps the pid returned. Returns the pid or -1.
 */
pid_t kv_nn_spawn(kv_nn *n, int h, char *const argv[], const char *log);

/*
 * Starts argv in the calling process's namespace, like kv_nn_spawn
 * otherwise (for programs started after kv_nn_enter). Returns the pid or -1.
 */
pid_t kv_nn_spawn_here(char *const argv[], const char *log);

/* Returns true when pid (from kv_nn_spawn) has exited; then *status holds
 * its waitpid status and it is forgotten. */
bool kv_nn_exited(pid_t pid, int *status);

/*
 * Sends sig to pid and waits up to ms for it to exit (SIGKILL after that).
 * On 0 *status (may be NULL) holds the waitpid status. Returns 0 or -1 (it
 * had to be killed, or was not a child).
 */
int kv_nn_stop(pid_t pid, int sig, unsigned ms, int *status);

/* Moves the calling process into host h's namespace (before it starts any
 * thread: setns applies to the calling thread only). Returns 0 or -1. */
int kv_nn_enter(kv_nn *n, int h);

/* Sets host h's switch port down (up false) or up again. Returns 0 or -1. */
int kv_nn_link(kv_nn *n, int h, bool up);

/*
 * Adds delay_ms of delay and loss_pct percent loss to everything host h
 * sends, with netem when the kernel has it; without netem, loss only (about
 * 3 %, by IP id) and *degraded (may be NULL) is set. Returns 0 or -1.
 */
int kv_nn_impair(kv_nn *n, int h, unsigned delay_ms, unsigned loss_pct, bool *degraded);

/* Removes what kv_nn_impair added. Returns 0 or -1. */
int kv_nn_heal_impair(kv_nn *n, int h);

/* Cuts (on true) or restores the path between hosts a and b, both ways.
 * Returns 0 or -1. */
int kv_nn_partition(kv_nn *n, int a, int b, bool on);

/* Runs `ip ARGS...` (NULL-terminated) with a deadline; its output goes to
 * the network's log. Returns 0 when it exited 0, else -1. */
int kv_nn_ip(kv_nn *n, const char *arg, ...) __attribute__((sentinel));

#endif
