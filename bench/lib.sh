# shellcheck shell=bash disable=SC2154
# bench/lib.sh - process handling shared by the benchmark scripts that start
# their own cluster (compare-redis.sh, compare-redis-aof.sh,
# migration-under-load.sh). Sourced;
# the script defines `work` (its work directory), `pids` (the processes it
# started; a file $work/PID.int marks a shardkv-server, stopped with SIGINT),
# `keep` (non-empty: keep $work) and `say`. Installs the exit traps.

# Stops every process started here: shardkv servers with SIGINT (SIGTERM would
# drain them), the rest with SIGTERM, SIGKILL after 5 s.
stop_all() {
	local p deadline=$((SECONDS + 5))
	for p in "${pids[@]+"${pids[@]}"}"; do
		if [ -f "$work/$p.int" ]; then kill -INT "$p" 2>/dev/null || true; else kill -TERM "$p" 2>/dev/null || true; fi
	done
	for p in "${pids[@]+"${pids[@]}"}"; do
		while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
		kill -KILL "$p" 2>/dev/null || true
		{ wait "$p"; } 2>/dev/null || true
		rm -f "$work/$p.int"
	done
	pids=()
}

cleanup() {
	stop_all
	if [ -n "$keep" ]; then say "logs and reports kept in $work"; else rm -rf "$work"; fi
}

# Prints a TCP port on 127.0.0.1 that is free.
free_port() {
	python3 - <<'EOF'
import socket, random
while True:
    p = random.randint(20000, 60000)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        s.close()
        continue
    s.close()
    print(p)
    break
EOF
}

# Polls `cmd...` until it succeeds, at most $1 seconds.
wait_for() {
	local limit=$1 deadline
	shift
	deadline=$((SECONDS + limit))
	until "$@" >/dev/null 2>&1; do
		[ $SECONDS -lt $deadline ] || return 1
		sleep 0.1
	done
}

trap cleanup EXIT
trap 'exit 130' INT TERM
