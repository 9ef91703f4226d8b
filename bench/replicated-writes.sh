#!/usr/bin/env bash
# bench/replicated-writes.sh - throughput with three copies of every range
# against one copy, on three local nodes, in turn: pipelined writes (the
# R=3 target), blocking writes, or pipelined reads.
#
#   bench/replicated-writes.sh [-r ROUNDS] [-d SECONDS] [-w SECONDS] [-a CALLERS]
#                              [-s pipelined|blocking|reads] [-E] [-b BIN_DIR] [-k]
#
#   -r ROUNDS   rounds, each one R=1 run then one R=3 run (default 3)
#   -d SECONDS  the measured load of each run (default 8)
#   -w SECONDS  the load before it, while the balancer spreads ranges and
#               primaries over the nodes (default 10)
#   -a CALLERS  the bench's callers, each with a batch of 16 ops in flight
#               (default 50, the target's load; the warm-up, and -s
#               pipelined and reads)
#   -s SHAPE    the measured load: pipelined (default) writes as above;
#               blocking: 50 threads, one write each in flight (`--threads
#               50 --mix put:100`); reads: the pipelined shape with `--mix
#               get:100` over the keys the warm-up wrote
#   -E          the R=1 runs over three times the keys (300,000), so that
#               each node holds as many keys as at R=3, where every node
#               holds every key: what R=3 costs beyond the data a node holds
#   -b BIN_DIR  where shardkv, shardkv-server and shardkv-controller are
#               (default $SHARDKV_BIN_DIR, build-release/bin, build/bin)
#   -k          keep the clusters' directories (logs)
#
# Each run starts a fresh cluster (`deploy/cluster.sh up -n 3 --replicas R --metrics`,
# the servers' defaults: --fsync batch), runs the write load of the R=3
# target of bench/README.md (`shardkv bench --threads 1 --async CALLERS
# --connections 1 --batch 16 --mix put:100 --keys 100000 --key-size 16
# --value-size 100`) for the warm-up, then the load of SHAPE for the measured
# seconds,
# and reads the servers' CPU time from /proc over the measured load. It
# prints per run the ops a second, the servers' CPU microseconds per
# op, the calls' p50 and p99 latency (a batch of 16 ops is one call),
# the records a `Replicate` carried on average (the servers'
# shardkv_replication_* counters; "-" at R=1), the balancer's events during
# the measured load and each node's share; then the medians and the ratio
# of the R=3 median to the R=1 one.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
rounds=3
dur=8
warm=10
bin=${SHARDKV_BIN_DIR:-}
callers=50
shape=pipelined
keep=
equal=
while getopts "r:d:w:a:s:Eb:k" o; do
	case $o in
	r) rounds=$OPTARG ;;
	d) dur=$OPTARG ;;
	w) warm=$OPTARG ;;
	a) callers=$OPTARG ;;
	s) shape=$OPTARG ;;
	E) equal=1 ;;
	b) bin=$OPTARG ;;
	k) keep=1 ;;
	*) sed -n '2,39p' "$0" >&2; exit 2 ;;
	esac
done
for v in "$rounds" "$dur" "$warm" "$callers"; do
	[[ $v =~ ^[0-9]+$ ]] || { echo "replicated-writes.sh: counts and seconds are whole numbers, not '$v'" >&2; exit 2; }
done
[ "$dur" -gt 0 ] || { echo "replicated-writes.sh: -d must be above 0" >&2; exit 2; }
[ "$callers" -gt 0 ] || { echo "replicated-writes.sh: -a must be above 0" >&2; exit 2; }
case $shape in
pipelined | blocking | reads) ;;
*) echo "replicated-writes.sh: -s wants pipelined, blocking or reads, not '$shape'" >&2; exit 2 ;;
esac

die() { echo "replicated-writes.sh: $*" >&2; exit 1; }
say() { echo "replicated-writes.sh: $*" >&2; }
work=$(mktemp -d /tmp/shardkv-replw.XXXXXX)
pids=()
# free_port, find_bin; its cleanup is replaced below (the clusters are
# deploy/cluster.sh's).
. "$here/bench/lib.sh"
find_bin
bin=$(cd "$bin" && pwd)
dir=
cleanup() {
	if [ -n "$dir" ] && [ -f "$dir/cluster.env" ]; then
		SHARDKV_BIN_DIR=$bin bash "$here/deploy/cluster.sh" down --dir "$dir" >/dev/null 2>&1 || true
	fi
	if [ -n "$keep" ]; then say "clusters kept in $work"; else rm -rf "$work"; fi
}

# counters NAME...: each counter's sum over the three servers' /metrics
# (bash's /dev/tcp: no HTTP client needed), one line.
counters() {
	local n name out=()
	for name in "$@"; do
		local sum=0 v
		for n in 1 2 3; do
			v=$( (exec 3<>"/dev/tcp/127.0.0.1/$((base + 400 + n))" &&
				printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3 &&
				awk -v k="$name" '$1 == k { print $2 }' <&3) 2>/dev/null || true)
			sum=$((sum + ${v:-0}))
		done
		out+=("$sum")
	done
	echo "${out[*]}"
}

# run R N: one run; appends "R rate us_per_write" to $work/results.
run() {
	local r=$1 n=$2 base hz t0 t1 rate us ev shares bat0 rec0 bat1 rec1 perbatch
	dir=$work/r$r-$n
	# deploy/cluster.sh: the controller at base, server N at base+100+N,
	# their metrics at base+300 and base+400+N.
	base=$(free_port 101 102 103 300 401 402 403)
	SHARDKV_BIN_DIR=$bin bash "$here/deploy/cluster.sh" up -n 3 --replicas "$r" --metrics --dir "$dir" \
		--base-port "$base" >"$work/up.log" 2>&1 || { cat "$work/up.log" >&2; exit 1; }
	local -a spids
	mapfile -t spids < <(cat "$dir"/node-*.pid)
	local -a c=("$bin/shardkv" --controller "tcp://127.0.0.1:$base" bench)
	local keys=100000
	[ -z "$equal" ] || [ "$r" -ne 1 ] || keys=300000
	local -a kv=(--keys "$keys" --key-size 16 --value-size 100)
	local -a w=("${c[@]}" --threads 1 --async "$callers" --connections 1 --batch 16 --mix put:100 "${kv[@]}")
	local -a b
	case $shape in
	pipelined) b=("${w[@]}") ;;
	blocking) b=("${c[@]}" --threads 50 --mix put:100 "${kv[@]}") ;;
	reads) b=("${c[@]}" --threads 1 --async "$callers" --connections 1 --batch 16 --mix get:100 "${kv[@]}") ;;
	esac
	[ "$warm" -eq 0 ] || "${w[@]}" --duration "$warm" >"$dir/warm.txt" 2>&1
	read -r bat0 rec0 <<<"$(counters shardkv_replication_batches_total shardkv_replication_records_applied_total)"
	t0=$(ticks "${spids[@]}")
	"${b[@]}" --duration "$dur" >"$dir/bench.txt" 2>&1
	t1=$(ticks "${spids[@]}")
	read -r bat1 rec1 <<<"$(counters shardkv_replication_batches_total shardkv_replication_records_applied_total)"
	perbatch=-
	[ $((bat1 - bat0)) -gt 0 ] && perbatch=$(( (rec1 - rec0) / (bat1 - bat0) ))
	hz=$(getconf CLK_TCK)
	rate=$(sed -n 's/^summary: .* = \([0-9]*\) ops\/s.*/\1/p' "$dir/bench.txt")
	[ -n "$rate" ] && [ "$rate" -gt 0 ] || die "no rate in $dir/bench.txt"
	us=$(awk -v d=$((t1 - t0)) -v hz="$hz" -v r="$rate" -v s="$dur" 'BEGIN { printf "%.2f", d / hz * 1e6 / (r * s) }')
	ev=$(grep -c '^\[.*\] event' "$dir/bench.txt" || true)
	shares=$(awk '/^  node [0-9]/ { printf "%s ", $4 }' "$dir/bench.txt")
	lat=$(awk '$1 == "all" { printf "%.2f/%.2f", $6 / 1000, $8 / 1000 }' "$dir/bench.txt")
	printf 'round %d  R=%d  %6d keys  %8d ops/s  %5s us of server CPU an op  p50/p99 %s ms  %s records a batch  %s balancer events  per node: %s\n' \
		"$n" "$r" "$keys" "$rate" "$us" "$lat" "$perbatch" "$ev" "$shares"
	echo "$r $rate $us" >>"$work/results"
	SHARDKV_BIN_DIR=$bin bash "$here/deploy/cluster.sh" down --dir "$dir" >/dev/null 2>&1 || true
	dir=
}

for n in $(seq 1 "$rounds"); do
	run 1 "$n"
	run 3 "$n"
done

median() { sort -n | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
m1=$(awk '$1 == 1 { print $2 }' "$work/results" | median)
m3=$(awk '$1 == 3 { print $2 }' "$work/results" | median)
c1=$(awk '$1 == 1 { print $3 }' "$work/results" | median)
c3=$(awk '$1 == 3 { print $3 }' "$work/results" | median)
awk -v a="$m1" -v b="$m3" -v c="$c1" -v d="$c3" 'BEGIN {
	printf "medians: R=1 %d ops/s (%.2f us an op), R=3 %d ops/s (%.2f us an op); R=3 / R=1 = %.2f\n", a, c, b, d, b / a }'
