#!/usr/bin/env bash
# bench/cpu-per-op.sh - CPU time per operation of one shard server and of
# the bench client, under pipelined load on loopback.
#
#   bench/cpu-per-op.sh [-m put:1|get:1] [-n OPS] [-r RUNS] [-b BIN_DIR]
#                       [-k] [-- SERVER_ARGS...]
#
#   -m MIX      the bench's --mix (default put:1)
#   -n OPS      operations measured per run (default 1600000)
#   -r RUNS     runs, each with a fresh controller and server (default 3)
#   -b BIN_DIR  where shardkv, shardkv-server and shardkv-controller are
#               (default $SHARDKV_BIN_DIR, build-release/bin, build/bin)
#   -k          keep the work directory (logs)
#   SERVER_ARGS more shardkv-server arguments (e.g. --io-loops 0)
#
# Each run starts a controller (one copy per range, no balancer) and one
# server with --fsync none, loads 100,000 keys of 16 bytes with 64-byte
# values, then runs `shardkv bench --threads 1 --async 50 --connections 1
# --batch 16` (50 callers with 16 ops in flight each, the P16 shape of
# compare-redis.sh) for OPS operations, with `perf stat -e
# task-clock,context-switches` on the server (-p) and on the client. It
# prints per run: ops/s, and for each side CPU microseconds and context
# switches per operation. Needs perf.
set -euo pipefail

mix=put:1
ops=1600000
runs=3
bin=${SHARDKV_BIN_DIR:-}
keep=
while getopts "m:n:r:b:k" o; do
	case $o in
	m) mix=$OPTARG ;;
	n) ops=$OPTARG ;;
	r) runs=$OPTARG ;;
	b) bin=$OPTARG ;;
	k) keep=1 ;;
	*) sed -n '2,22p' "$0" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ "${1-}" = "--" ] && shift
here=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "$bin" ]; then
	for d in "$here/build-release/bin" "$here/build/bin"; do
		[ -x "$d/shardkv-server" ] && { bin=$d; break; }
	done
fi
for b in shardkv shardkv-server shardkv-controller; do
	[ -x "$bin/$b" ] || { echo "cpu-per-op: $bin/$b is missing" >&2; exit 1; }
done
command -v perf >/dev/null || { echo "cpu-per-op: perf is missing (apt-get install linux-perf)" >&2; exit 1; }

work=$(mktemp -d /tmp/shardkv-cpu-per-op-XXXXXX)
pids=()
say() { echo "cpu-per-op: $*" >&2; }
# shellcheck source=bench/lib.sh
. "$here/bench/lib.sh"

bench_args=(--threads 1 --async 50 --connections 1 --batch 16 --keys 100000 --key-size 16
	--value-size 64)
echo "# $mix, $ops ops per run, 100000 keys of 16 B, values of 64 B, 50 callers x 16 in flight; server args: ${*:-none}"
echo "run   ops/s      server us/op  server cs/op  client us/op  client cs/op"
for ((r = 1; r <= runs; r++)); do
	dir="$work/run$r"
	mkdir -p "$dir"
	port=$(free_port)
	ctl="tcp://127.0.0.1:$port"
	one_copy_flags "$bin/shardkv-controller"
	"$bin/shardkv-controller" --listen "$ctl" --data-dir "$dir/ctl" ${one_copy[@]+"${one_copy[@]}"} >/dev/null 2>"$dir/ctl.log" &
	cpid=$!
	pids+=("$cpid")
	wait_for 30 "$bin/shardkv" -c "$ctl" --timeout 500 config || { say "controller did not start (see $dir/ctl.log)"; exit 1; }
	port=$(free_port)
	"$bin/shardkv-server" --listen "tcp://127.0.0.1:$port" --controller "$ctl" --data-dir "$dir/s1" \
		--join --fsync none "$@" >/dev/null 2>"$dir/s1.log" &
	spid=$!
	pids+=("$spid")
	: >"$work/$spid.int"
	wait_for 30 "$bin/shardkv" -c "$ctl" --timeout 500 put cpu-per-op-warm x || { say "server did not start (see $dir/s1.log)"; exit 1; }
	"$bin/shardkv" -c "$ctl" bench "${bench_args[@]}" --mix put:1 --ops 100000 --load >/dev/null 2>"$dir/load.err"
	perf stat -x, -e task-clock,context-switches -p "$spid" -o "$dir/server.stat" &
	ppid=$!
	sleep 0.2
	perf stat -x, -e task-clock,context-switches -o "$dir/client.stat" -- \
		"$bin/shardkv" -c "$ctl" --json bench "${bench_args[@]}" --mix "$mix" --ops "$ops" \
		>"$dir/bench.json" 2>"$dir/bench.err"
	kill -INT "$ppid"
	wait "$ppid" 2>/dev/null || true
	kill -INT "$spid" "$cpid" 2>/dev/null || true
	wait "$spid" "$cpid" 2>/dev/null || true
	pids=()
	python3 - "$dir" "$r" "$ops" <<'EOF'
import json, sys
d, r, ops = sys.argv[1], sys.argv[2], int(sys.argv[3])
b = json.load(open(d + "/bench.json"))
def stat(f):
    out = {}
    for line in open(f):
        p = line.strip().split(",")
        if len(p) > 3 and p[0] and p[0][0].isdigit():
            out[p[2]] = float(p[0])
    return out
s, c = stat(d + "/server.stat"), stat(d + "/client.stat")
print(f"{r:>3} {b['ops_per_sec']:>9.0f} {s['task-clock'] * 1000 / ops:>13.3f} {s['context-switches'] / ops:>13.4f}"
      f" {c['task-clock'] * 1000 / ops:>13.3f} {c['context-switches'] / ops:>13.4f}")
EOF
done
