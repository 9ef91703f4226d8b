#!/usr/bin/env bash
# bench/recount-cost.sh - what a node's statistics cost under a steady
# write load: the CPU of its heartbeat thread (the per-range counts and
# split keys it recounts every `1 + keys / 500000` heartbeats while writes
# change the store, doc/store.md) against the whole server's, over a
# window of a light open-loop write load on a node that holds many keys.
#
#   bench/recount-cost.sh [-K KEYS] [-R OPS] [-d SECS] [-b BIN_DIR]
#
#   -K KEYS     the key space, loaded first and then written and deleted
#               over (default 1000000; 8-byte decimal keys, 100-byte values)
#   -R OPS      the write load's rate, ops/s (default 2000)
#   -d SECS     the measured window (default 30)
#   -b BIN_DIR  where shardkv, shardkv-server and shardkv-controller are
#               (default $SHARDKV_BIN_DIR, build-release/bin, build/bin)
#
# One node (`deploy/cluster.sh up -n 1 --metrics`, the servers' defaults),
# loaded for 8 s with the pipelined write load of `shardkv bench --mix
# put:100 --keys KEYS`, then `--threads 4 --rate OPS --mix put:50,del:50`
# over the same keys for SECS + 2 s (keys come and go, as the store's
# change counter needs for a recount: overwrites of the same size are no
# change); the
# heartbeat thread's and the process's utime + stime come from /proc over
# SECS of it. Prints them, the recounts (shardkv_server_range_counts_total)
# and the node's keys against its range's counted keys. Stops what it
# started on every path.
set -euo pipefail

keys=1000000 rate=2000 secs=30 bin=${SHARDKV_BIN_DIR:-}
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
die() { echo "recount-cost: $*" >&2; exit 1; }

while getopts "K:R:d:b:h" o; do
	case "$o" in
	K) keys=$OPTARG ;;
	R) rate=$OPTARG ;;
	d) secs=$OPTARG ;;
	b) bin=$OPTARG ;;
	*) usage ;;
	esac
done
[[ $keys =~ ^[1-9][0-9]*$ ]] || die "-K wants a positive number of keys"
[[ $rate =~ ^[1-9][0-9]*$ ]] || die "-R wants a positive rate"
[[ $secs =~ ^[1-9][0-9]*$ ]] || die "-d wants a positive number of seconds"
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -z "$bin" ]; then
	for d in "$root/build-release/bin" "$root/build/bin"; do [ -x "$d/shardkv-server" ] && bin=$d && break; done
fi
[ -n "$bin" ] && [ -x "$bin/shardkv-server" ] && [ -x "$bin/shardkv" ] || die "no shardkv binaries (build first, or -b BIN_DIR)"
bin=$(cd "$bin" && pwd)

# shellcheck source=bench/lib.sh
. "$root/bench/lib.sh"
dir=$(mktemp -d /tmp/recount-cost.XXXXXX)
load=''
finish() {
	[ -z "$load" ] || kill -TERM "$load" 2>/dev/null || true
	SHARDKV_BIN_DIR=$bin bash "$root/deploy/cluster.sh" down --dir "$dir" >/dev/null 2>&1 || true
	rm -rf "$dir"
}
trap finish EXIT
base=$(free_port 101 102 103 300 401 402 403)
SHARDKV_BIN_DIR=$bin bash "$root/deploy/cluster.sh" up -n 1 --metrics --dir "$dir" --base-port "$base" >"$dir/up.log" 2>&1 ||
	die "cannot start the cluster: $(tail -3 "$dir/up.log")"
ctl=$(tail -1 "$dir/up.log")
metrics=$(grep -o 'node 1: .*metrics http://[^ )]*' "$dir/up.log" | grep -o 'http://[^ )]*$')
pid=$(cat "$dir/node-1.pid")
common=(--keys "$keys" --key-size 8 --value-size 100)
echo "recount-cost: loading $keys keys for 8 s" >&2
"$bin/shardkv" -c "$ctl" bench --threads 1 --async 50 --batch 16 "${common[@]}" --mix put:100 \
	--duration 8 >/dev/null
tid=''
for t in /proc/"$pid"/task/*; do
	[ "$(cat "$t/comm")" = kv-heartbeat ] && tid=${t##*/} && break
done
[ -n "$tid" ] || die "no kv-heartbeat thread in the server"
ticks() { awk '{ print $14 + $15 }' "$1"; }
echo "recount-cost: $rate writes/s for $((secs + 2)) s, measuring $secs s" >&2
"$bin/shardkv" -c "$ctl" bench --threads 4 --rate "$rate" "${common[@]}" --mix put:50,del:50 \
	--duration $((secs + 2)) >/dev/null &
load=$!
sleep 1
h0=$(ticks "/proc/$pid/task/$tid/stat") p0=$(ticks "/proc/$pid/stat")
sleep "$secs"
h1=$(ticks "/proc/$pid/task/$tid/stat") p1=$(ticks "/proc/$pid/stat")
wait "$load" || die "the write load failed"
load=''
hz=$(getconf CLK_TCK)
m=$(curl -s "$metrics")
hb=$(((h1 - h0) * 1000 / hz)) all=$(((p1 - p0) * 1000 / hz))
echo "heartbeat thread: $hb ms of CPU in $secs s ($(awk -v a="$hb" -v s="$secs" 'BEGIN { printf "%.1f", a / (s * 10) }')% of a core); the whole server: $all ms"
echo "recounts so far: $(awk '/^shardkv_server_range_counts_total/ { print $2 }' <<<"$m")"
echo "node keys: $(awk '/^shardkv_server_keys / { print $2 }' <<<"$m"); its range, as counted: $(awk '/^shardkv_server_range_keys/ { print $NF }' <<<"$m")"
