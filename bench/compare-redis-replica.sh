#!/usr/bin/env bash
# bench/compare-redis-replica.sh - replicated writes: shardkv with two
# replicas against Redis with one replica (replicaof), same load.
#
#   bench/compare-redis-replica.sh [-c CLIENTS] [-n OPS] [-r KEYS] [-d BYTES]
#                                  [-P K] [-f MODE] [-b BIN_DIR] [-k]
#
#   -c CLIENTS  concurrent callers (redis-benchmark -c; shardkv bench
#               --threads 1 --async CLIENTS) (default 50)
#   -n OPS      operations per test (times K when pipelined) (default 100000)
#   -r KEYS     key space, keys of 16 bytes (default 100000)
#   -d BYTES    value size (default 100)
#   -P K        second pass with K in flight per caller; 1: none (default 16)
#   -f MODE     the shardkv servers' --fsync (default batch)
#   -b BIN_DIR  shardkv binaries (default $SHARDKV_BIN_DIR, build-release/bin,
#               build/bin)
#   -k          keep the work directory
#
# shardkv: a controller with --replicas 2 --min-insync 2 and two servers, so
# every write is acknowledged only once both hold it. Redis: a master
# without persistence and one replica (`replicaof`); Redis acknowledges a
# write before it reaches the replica, so its figures are an upper bound
# for a store that may lose acknowledged writes on failover (doc/replication.md).
# (redis-benchmark cannot follow each write with WAIT, so there is no
# Redis figure with acknowledgement after replication.) Everything started
# is stopped on exit.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
clients=50 ops=100000 keys=100000 vsize=100 pipe=16 bin=${SHARDKV_BIN_DIR:-} keep= fsync=batch
step_timeout=${COMPARE_STEP_TIMEOUT:-300}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
die() { echo "compare-redis-replica: $*" >&2; exit 1; }

while getopts "c:n:r:d:P:f:b:kh" o; do
	case "$o" in
	c) clients=$OPTARG ;;
	n) ops=$OPTARG ;;
	r) keys=$OPTARG ;;
	d) vsize=$OPTARG ;;
	P) pipe=$OPTARG ;;
	f) fsync=$OPTARG ;;
	b) bin=$OPTARG ;;
	k) keep=1 ;;
	*) usage ;;
	esac
done
for v in "$clients" "$ops" "$keys" "$vsize" "$pipe"; do
	[[ $v =~ ^[0-9]+$ ]] && [ "$v" -ge 1 ] || die "positive numbers expected, got '$v'"
done
case "$fsync" in always | batch | none) ;; *) die "-f takes always, batch or none" ;; esac
command -v redis-server >/dev/null && command -v redis-benchmark >/dev/null ||
	die "redis-server/redis-benchmark missing; run: apt-get install redis-server redis-tools"
if [ -z "$bin" ]; then
	for d in "$here/build-release/bin" "$here/build/bin"; do
		[ -x "$d/shardkv-server" ] && { bin=$d; break; }
	done
fi
[ -n "$bin" ] || die "no shardkv binaries (build with cmake, or give -b BIN_DIR)"

work=$(mktemp -d /tmp/shardkv-compare-replica-XXXXXX)
pids=()
say() { echo "compare-redis-replica: $*" >&2; }
# stop_all, cleanup (installed on exit), free_port, wait_for
. "$here/bench/lib.sh"

ctl_json() { "$bin/shardkv" -c "$ctl" --timeout 1000 --json "$@"; }
replicated() { # every range has its two replicas in sync
	ctl_json status | python3 -c 'import json,sys; s=json.load(sys.stdin); sys.exit(0 if s.get("under_replicated",1)==0 and all(len(r.get("insync",[]))==2 for r in s["ranges"]) else 1)'
}
active() { # N active nodes
	ctl_json config | python3 -c 'import json,sys; c=json.load(sys.stdin); sys.exit(0 if sum(n["state"]=="active" for n in c["nodes"])==int(sys.argv[1]) else 1)' "$1"
}

port=$(free_port)
ctl="tcp://127.0.0.1:$port"
"$bin/shardkv-controller" --listen "$ctl" --data-dir "$work/ctl" --replicas 2 --min-insync 2 \
	>/dev/null 2>"$work/ctl.log" &
pids+=($!)
wait_for 30 "$bin/shardkv" -c "$ctl" --timeout 500 config || die "controller did not start"
for i in 1 2; do
	port=$(free_port)
	"$bin/shardkv-server" --listen "tcp://127.0.0.1:$port" --controller "$ctl" \
		--data-dir "$work/s$i" --join --fsync "$fsync" >/dev/null 2>"$work/s$i.log" &
	pids+=($!)
	: >"$work/$!.int"
	wait_for 30 active "$i" || die "server $i did not become active (see $work/s$i.log)"
done
rm=$(free_port)
rr=$(free_port)
mkdir -p "$work/rm" "$work/rr"
redis-server --bind 127.0.0.1 --port "$rm" --save '' --appendonly no --dir "$work/rm" \
	--protected-mode no >"$work/rm.log" 2>&1 &
pids+=($!)
redis-server --bind 127.0.0.1 --port "$rr" --save '' --appendonly no --dir "$work/rr" \
	--protected-mode no --replicaof 127.0.0.1 "$rm" >"$work/rr.log" 2>&1 &
pids+=($!)
wait_for 20 sh -c "redis-cli -p $rr info replication | grep -q master_link_status:up" ||
	die "the Redis replica did not connect (see $work/rr.log)"

timeout "$step_timeout" "$bin/shardkv" -c "$ctl" bench --threads 4 --keys "$keys" --key-size 16 \
	--value-size "$vsize" --load --ops 0 >"$work/load.log" 2>&1 || die "shardkv --load failed"
wait_for 120 replicated || die "shardkv ranges not in sync after the load"
timeout "$step_timeout" redis-benchmark -h 127.0.0.1 -p "$rm" -c "$clients" -n $((3 * keys)) -r "$keys" \
	-d "$vsize" -P 16 -t set -q >/dev/null 2>&1 || die "redis prefill failed"

results=$work/results.tsv
: >"$results"
redis_run() { # NAME TEST P
	local csv
	csv=$(timeout "$step_timeout" redis-benchmark -h 127.0.0.1 -p "$rm" -c "$clients" -n $((ops * $3)) \
		-r "$keys" -d "$vsize" -P "$3" -t "$2" --csv 2>/dev/null | grep -E '^"(SET|GET)' | head -n 1) ||
		die "redis-benchmark $2 failed"
	python3 -c 'import csv,sys; r=next(csv.reader([sys.argv[2]])); print(f"{sys.argv[1]}\tredis\t{float(r[1]):.0f}\t{r[4]}\t{r[6]}")' "$1" "$csv" >>"$results"
}
shardkv_run() { # NAME MIX P
	local out=$work/$(echo "$1" | tr ' ' '_').json callers=(--threads 1 --async "$clients" --connections 1)
	[ "$3" -gt 1 ] && callers+=(--batch "$3")
	timeout "$step_timeout" "$bin/shardkv" -c "$ctl" --json bench "${callers[@]}" --keys "$keys" \
		--key-size 16 --value-size "$vsize" --mix "$2" --ops $((ops * $3)) --out "$out" \
		>/dev/null 2>"$work/bench.err" || die "shardkv bench $2 failed: $(tail -n 3 "$work/bench.err")"
	python3 -c 'import json,sys; d=json.load(open(sys.argv[2])); l=d["latency_us"]; print("%s\tshardkv\t%.0f\t%.3f\t%.3f" % (sys.argv[1], d["ops_per_sec"], l["p50"]/1000, l["p99"]/1000))' "$1" "$out" >>"$results"
}

say "measuring"
redis_run "SET" set 1
shardkv_run "SET" put:1 1
redis_run "GET" get 1
shardkv_run "GET" get:1 1
if [ "$pipe" -gt 1 ]; then
	redis_run "SET P$pipe" set "$pipe"
	shardkv_run "SET P$pipe" put:1 "$pipe"
	redis_run "GET P$pipe" get "$pipe"
	shardkv_run "GET P$pipe" get:1 "$pipe"
fi
lag=$(redis-cli -p "$rm" info replication | tr -d '\r' | grep -E '^slave0:' || true)

python3 - "$results" "$clients" "$keys" "$vsize" "$fsync" "$(nproc)" "$lag" <<'PY'
import sys
path, clients, keys, vsize, fsync, cpus, lag = sys.argv[1:8]
print(f"# shardkv: 2 servers, --replicas 2 --min-insync 2, --fsync {fsync}; redis: master + 1 replica (replicaof), no persistence")
print(f"# {clients} callers, {keys} keys of 16 B, values of {vsize} B, loopback, {cpus} CPUs shared by clients and servers")
rows, order = {}, []
for line in open(path):
    name, who, rps, p50, p99 = line.rstrip("\n").split("\t")
    if name not in rows:
        rows[name] = {}
        order.append(name)
    rows[name][who] = (float(rps), p50, p99)
print(f"{'test':<10} {'redis ops/s':>12} {'shardkv ops/s':>14} {'ratio':>7}   {'redis p50/p99 ms':>18}   {'shardkv p50/p99 ms':>20}")
for n in order:
    r, s = rows[n].get("redis"), rows[n].get("shardkv")
    if r and s:
        print(f"{n:<10} {r[0]:>12.0f} {s[0]:>14.0f} {s[0]/r[0]:>7.2f}   {r[1]+'/'+r[2]:>18}   {s[1]+'/'+s[2]:>20}")
print(f"# redis replica after the run: {lag}")
PY
