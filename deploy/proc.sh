# shellcheck shell=bash
# deploy/proc.sh - starting, waiting for and stopping daemons from bash: the
# process functions of deploy/cluster.sh, also sourced by bench/lib.sh (the
# benchmark scripts), so both start, wait and stop the same way. Sourced;
# defines functions only (no traps, no variables besides proc_pid), and works
# under `set -euo pipefail`.
#
# Readiness is a poll with a deadline, never a fixed sleep; a stop is a
# signal, a bounded wait, then SIGKILL.

# proc_start LOG CMD [ARGS...]: starts CMD in the background with stdin from
# /dev/null and stdout and stderr appended to LOG; its pid is in $proc_pid.
proc_start() {
	local log=$1
	shift
	"$@" </dev/null >>"$log" 2>&1 &
	proc_pid=$!
}

# proc_alive PID...: true when one of the processes still runs.
proc_alive() {
	local p
	for p in "$@"; do
		[ -n "$p" ] && kill -0 "$p" 2>/dev/null && return 0
	done
	return 1
}

# proc_wait_ready SECONDS "PIDS" CMD [ARGS...]: polls CMD (output discarded)
# until it succeeds. Returns 0; 1 after SECONDS; 2 as soon as none of PIDS (a
# space-separated list; empty: not watched) runs any more.
proc_wait_ready() {
	local limit=$1 pids=$2 deadline
	shift 2
	deadline=$((SECONDS + limit))
	until "$@" >/dev/null 2>&1; do
		# shellcheck disable=SC2086 # the list is split on purpose
		if [ -n "$pids" ] && ! proc_alive $pids; then return 2; fi
		[ $SECONDS -lt $deadline ] || return 1
		sleep 0.05
	done
}

# proc_reap SECONDS PID...: waits up to SECONDS in all for the processes to
# exit, SIGKILLs the rest, and reaps the ones that are children of this
# shell. Returns 0, or 1 when one had to be killed.
proc_reap() {
	local limit=$1 deadline p rv=0
	shift
	deadline=$((SECONDS + limit))
	for p in "$@"; do
		while proc_alive "$p" && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
		if proc_alive "$p"; then
			kill -KILL "$p" 2>/dev/null || true
			rv=1
		fi
		{ wait "$p"; } 2>/dev/null || true
	done
	return $rv
}

# proc_stop SIG SECONDS PID...: sends SIG to every process, then
# proc_reap SECONDS PID....
proc_stop() {
	local sig=$1 limit=$2 p
	shift 2
	for p in "$@"; do kill "-$sig" "$p" 2>/dev/null || true; done
	proc_reap "$limit" "$@"
}
