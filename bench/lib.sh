# shellcheck shell=bash disable=SC2154
# bench/lib.sh - process handling shared by the benchmark scripts that start
# their own cluster (compare-redis.sh, compare-redis-aof.sh,
# migration-under-load.sh). Sourced;
# the script defines `work` (its work directory), `pids` (the processes it
# started; a file $work/PID.int marks a shardkv-server, stopped with SIGINT),
# `keep` (non-empty: keep $work) and `say`; it may keep the clients it runs
# in the background in `benches` (stopped first, with SIGTERM). Installs the
# exit traps.

# proc_start, proc_wait_ready, proc_reap, proc_stop: the process functions of
# deploy/cluster.sh.
# shellcheck source=deploy/proc.sh
. "$(dirname "${BASH_SOURCE[0]}")/../deploy/proc.sh"

# Stops every process started here: shardkv servers with SIGINT (SIGTERM would
# drain them), the rest with SIGTERM, SIGKILL after 5 s.
stop_all() {
	local p
	for p in "${benches[@]+"${benches[@]}"}"; do kill -TERM "$p" 2>/dev/null || true; done
	proc_reap 5 "${benches[@]+"${benches[@]}"}" || true
	benches=()
	for p in "${pids[@]+"${pids[@]}"}"; do
		if [ -f "$work/$p.int" ]; then kill -INT "$p" 2>/dev/null || true; else kill -TERM "$p" 2>/dev/null || true; fi
	done
	proc_reap 5 "${pids[@]+"${pids[@]}"}" || true
	for p in "${pids[@]+"${pids[@]}"}"; do rm -f "$work/$p.int"; done
	pids=()
}

cleanup() {
	stop_all
	if [ -n "$keep" ]; then say "logs and reports kept in $work"; else rm -rf "$work"; fi
}

# Prints a TCP port on 127.0.0.1 that is free, and whose port + OFFSET is
# free too for each OFFSET given (e.g. Redis Cluster's bus at +10000, or
# the servers of deploy/cluster.sh at +101..). All of them lie below the
# kernel's default range of local ports for outgoing connections (from
# 32768), where a connection could take one meanwhile, and under
# deploy/cluster.sh's limit of 64000 for a base port.
free_port() {
	python3 - "$@" <<'EOF'
import socket, random, sys
offsets = [0] + [int(a) for a in sys.argv[1:]]
while True:
    p = random.randint(10000, 32767 - max(offsets))
    ok = True
    for q in offsets:
        s = socket.socket()
        try:
            s.bind(("127.0.0.1", p + q))
        except OSError:
            ok = False
        s.close()
        if not ok:
            break
    if ok:
        print(p)
        break
EOF
}

# Sum of the CPU ticks (user + system) of the processes named by pid.
ticks() {
	local p t=0
	for p in "$@"; do
		t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
	done
	echo "$t"
}

# Sets one_copy to the controller flags that keep one copy per range
# (`--replicas 1`) and leave the layout alone (`--auto-balance off`), each
# only when the controller has it: the benchmarks that compare against
# unreplicated peers or measure migrations run with one copy, while the
# controller's default is 3 (doc/contract.md §2), on the layout they make
# (the balancer, on by default, would move ranges while they load). $1: the
# controller binary.
one_copy_flags() {
	one_copy=()
	if "$1" --help 2>/dev/null | grep -q -- '--replicas'; then one_copy=(--replicas 1); fi
	# The layouts the scripts measure stay as they make them: no automatic balancing.
	if "$1" --help 2>/dev/null | grep -q -- '--auto-balance'; then one_copy+=(--auto-balance off); fi
}

# Sets bin, when it is empty, to build-release/bin or build/bin (the first
# with a shardkv-server), and stops the script unless shardkv,
# shardkv-server and shardkv-controller are there.
find_bin() {
	local d b
	if [ -z "$bin" ]; then
		for d in "$here/build-release/bin" "$here/build/bin"; do
			[ -x "$d/shardkv-server" ] && { bin=$d; break; }
		done
	fi
	[ -n "$bin" ] || die "no shardkv binaries (build with cmake, or give -b BIN_DIR)"
	for b in shardkv shardkv-server shardkv-controller; do
		[ -x "$bin/$b" ] || die "$bin/$b is missing"
	done
}

# Polls `cmd...` until it succeeds, at most $1 seconds.
wait_for() {
	local limit=$1
	shift
	proc_wait_ready "$limit" "" "$@"
}

trap cleanup EXIT
trap 'exit 130' INT TERM
