#!/usr/bin/env bash
# bench/redis-replication-cost.sh - what two replicas cost Redis itself on
# this machine: pipelined SETs to a master alone, then to the same master
# with two replicas (`replicaof`), in turn, the load of the R=3 target
# (bench/replicated-writes.sh) on the peer.
#
#   bench/redis-replication-cost.sh [-r ROUNDS] [-c CLIENTS] [-n OPS]
#                                   [-K KEYS] [-d BYTES] [-P K] [-R REPLICAS] [-k]
#
#   -r ROUNDS    rounds, each the master alone then with its replicas
#                (default 3)
#   -c CLIENTS   redis-benchmark -c (default 50)
#   -n OPS       SETs per run (default 2000000)
#   -K KEYS      key space, redis-benchmark -r (default 100000)
#   -d BYTES     value size (default 100)
#   -P K         commands in flight per client (default 16)
#   -R REPLICAS  replicas in the second run (default 2: three copies)
#   -k           keep the work directory (logs)
#
# Each round starts a fresh master without persistence (`--save ""
# --appendonly no`), writes every key once, and measures `redis-benchmark
# -t set -P K` alone; then starts the replicas, waits until each has the
# master's offset, and measures the same load again. Redis acknowledges a
# write before any replica has it, so after the run the script waits until
# every replica's offset is the master's: "until replicated" is the SETs
# over the run's time plus that wait, the figure comparable with a store
# that answers only once its backups hold the write. The CPU time of each
# Redis process over the run (and the wait) comes from /proc. Everything
# started is stopped on exit. Run it at `nice -n -15` on a shared machine.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
rounds=3 clients=50 ops=2000000 keys=100000 vsize=100 pipe=16 nrep=2 keep=
step_timeout=${COMPARE_STEP_TIMEOUT:-300}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
die() { echo "redis-replication-cost: $*" >&2; exit 1; }

while getopts "r:c:n:K:d:P:R:kh" o; do
	case "$o" in
	r) rounds=$OPTARG ;;
	c) clients=$OPTARG ;;
	n) ops=$OPTARG ;;
	K) keys=$OPTARG ;;
	d) vsize=$OPTARG ;;
	P) pipe=$OPTARG ;;
	R) nrep=$OPTARG ;;
	k) keep=1 ;;
	*) usage ;;
	esac
done
for v in "$rounds" "$clients" "$ops" "$keys" "$vsize" "$pipe" "$nrep"; do
	[[ $v =~ ^[0-9]+$ ]] && [ "$v" -ge 1 ] || die "positive numbers expected, got '$v'"
done
[ "$nrep" -le 8 ] || die "-R takes 1 to 8 replicas"
command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null &&
	command -v redis-cli >/dev/null ||
	die "redis-server/redis-benchmark/redis-cli missing; run: apt-get install redis-server redis-tools"

work=$(mktemp -d /tmp/shardkv-redis-repl-XXXXXX)
pids=()
say() { echo "redis-replication-cost: $*" >&2; }
# stop_all, cleanup (installed on exit), free_port, ticks
. "$here/bench/lib.sh"

offset() { # PORT ROLE_FIELD
	redis-cli -p "$1" info replication | tr -d '\r' | awk -F: -v f="$2" '$1 == f { print $2 }'
}
start_redis() { # PORT DIR [replicaof args]
	mkdir -p "$2"
	redis-server --bind 127.0.0.1 --port "$1" --save '' --appendonly no --dir "$2" \
		--protected-mode no "${@:3}" >"$2/log" 2>&1 &
	pids+=($!)
	local deadline=$((SECONDS + 20))
	until redis-cli -p "$1" ping 2>/dev/null | grep -q PONG; do
		[ $SECONDS -lt $deadline ] || die "redis on port $1 did not start (see $2/log)"
		sleep 0.05
	done
}
in_sync() { # MASTER_PORT REPLICA_PORTS...: every replica's offset is the master's
	local m r
	m=$(offset "$1" master_repl_offset)
	for r in "${@:2}"; do
		[ "$(redis-cli -p "$r" info replication | tr -d '\r' | grep -c '^master_link_status:up')" = 1 ] ||
			return 1
		[ "$(offset "$r" slave_repl_offset)" = "$m" ] || return 1
	done
}
bench_set() { # PORT: prints ops/s and wall seconds
	local t0 t1 csv
	t0=$(date +%s.%N)
	csv=$(timeout "$step_timeout" redis-benchmark -h 127.0.0.1 -p "$1" -c "$clients" -n "$ops" \
		-r "$keys" -d "$vsize" -P "$pipe" -t set --csv 2>/dev/null | grep -E '^"SET' | head -n 1) ||
		die "redis-benchmark failed"
	t1=$(date +%s.%N)
	python3 -c 'import csv,sys; r=next(csv.reader([sys.argv[1]])); print(f"{float(r[1]):.0f} {float(sys.argv[3])-float(sys.argv[2]):.3f} {r[6]}")' \
		"$csv" "$t0" "$t1"
}

hz=$(getconf CLK_TCK)
results=$work/results.txt
: >"$results"
for round in $(seq 1 "$rounds"); do
	m=$(free_port)
	start_redis "$m" "$work/r$round-m"
	timeout "$step_timeout" redis-benchmark -h 127.0.0.1 -p "$m" -c "$clients" -n $((3 * keys)) \
		-r "$keys" -d "$vsize" -P 16 -t set -q >/dev/null 2>&1 || die "prefill failed"
	mpid=${pids[-1]}
	c0=$(ticks "$mpid")
	read -r alone alone_s alone_p99 < <(bench_set "$m")
	c1=$(ticks "$mpid")
	alone_us=$(python3 -c "print(f'{($c1-$c0)/$hz*1e6/$ops:.2f}')")

	reps=() rpids=()
	for i in $(seq 1 "$nrep"); do
		r=$(free_port)
		start_redis "$r" "$work/r$round-s$i" --replicaof 127.0.0.1 "$m"
		reps+=("$r")
		rpids+=("${pids[-1]}")
	done
	deadline=$((SECONDS + 60))
	until in_sync "$m" "${reps[@]}"; do
		[ $SECONDS -lt $deadline ] || die "the replicas did not sync (see $work)"
		sleep 0.05
	done
	c0=$(ticks "$mpid")
	r0=$(ticks "${rpids[@]}")
	read -r repl repl_s repl_p99 < <(bench_set "$m")
	t0=$(date +%s.%N)
	deadline=$((SECONDS + 120))
	until in_sync "$m" "${reps[@]}"; do
		[ $SECONDS -lt $deadline ] || die "the replicas did not catch up (see $work)"
		sleep 0.01
	done
	t1=$(date +%s.%N)
	c1=$(ticks "$mpid")
	r1=$(ticks "${rpids[@]}")
	python3 - "$round" "$alone" "$alone_p99" "$alone_us" "$repl" "$repl_s" "$repl_p99" "$t0" "$t1" \
		"$((c1 - c0))" "$((r1 - r0))" "$hz" "$ops" "$nrep" >>"$results" <<'PY'
import sys
rnd, alone, ap99, aus, repl, rs, rp99, t0, t1, mt, rt, hz, ops, nrep = sys.argv[1:15]
wait = float(t1) - float(t0)
until = int(ops) / (float(rs) + wait)
mus = int(mt) / int(hz) * 1e6 / int(ops)
rus = int(rt) / int(hz) * 1e6 / int(ops) / int(nrep)
print(f"{rnd} {alone} {ap99} {aus} {repl} {rp99} {wait*1000:.0f} {until:.0f} {mus:.2f} {rus:.2f}")
PY
	say "round $round: $(tail -n 1 "$results")"
	stop_all
done

python3 - "$results" "$clients" "$pipe" "$keys" "$vsize" "$nrep" "$(nproc)" <<'PY'
import statistics, sys
path, clients, pipe, keys, vsize, nrep, cpus = sys.argv[1:8]
rows = [l.split() for l in open(path) if l.strip()]
print(f"# redis-benchmark -t set -c {clients} -P {pipe} -r {keys} -d {vsize}; master alone, then with {nrep} replicas; {cpus} CPUs shared by all")
print(f"{'round':>5} {'alone ops/s':>12} {'p99 ms':>7} {'us CPU':>7} {'replicated':>11} {'p99 ms':>7} {'catch-up ms':>12} {'until replicated':>17} {'ratio':>6} {'master us':>10} {'replica us':>11}")
ratios = []
for r in rows:
    rnd, alone, ap99, aus, repl, rp99, wait, until, mus, rus = r
    ratio = float(until) / float(alone)
    ratios.append(ratio)
    print(f"{rnd:>5} {alone:>12} {ap99:>7} {aus:>7} {repl:>11} {rp99:>7} {wait:>12} {until:>17} {ratio:>6.2f} {mus:>10} {rus:>11}")
print(f"median ratio (until replicated / alone): {statistics.median(ratios):.2f}")
print("('us CPU': the master's CPU time a SET alone; 'master us' / 'replica us': with the replicas, the master's and each replica's CPU time a SET over the run and the catch-up)")
PY
