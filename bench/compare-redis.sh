#!/usr/bin/env bash
# bench/compare-redis.sh - shardkv against Redis on loopback, same workload.
#
#   bench/compare-redis.sh [-c CLIENTS] [-n OPS] [-r KEYS] [-d BYTES] [-P K]
#                          [-m "1 3"] [-b BIN_DIR] [-S] [-k]
#
#   -c CLIENTS  concurrent callers, each with one command or call in flight:
#               redis-benchmark -c CLIENTS (one event loop, CLIENTS
#               connections); shardkv bench --threads 1 --async CLIENTS (one
#               thread, CLIENTS callers on the async API, one handle)
#               (default 50)
#   -n OPS      operations per test, times K in the pipelined pass, so that
#               both passes last about as long (default 100000)
#   -r KEYS     key space: keys "key:" + 12 digits (16 bytes) in both
#               (default 100000)
#   -d BYTES    value size (default 100)
#   -P K        second pass with pipelining K (redis-benchmark -P K: each
#               client keeps K commands in flight) against K async ops in
#               flight per caller (shardkv bench --async CLIENTS --batch K);
#               1: no second pass (default 16)
#   -M          in the second pass, batches instead of a pipeline on the
#               shardkv side: --threads CLIENTS --batch K, each call an
#               mget/mput of K keys on a thread of its own
#   -m MODES    "1": a one-node shardkv against one redis-server; "3": a
#               three-node shardkv cluster against a three-node Redis Cluster
#               (redis-benchmark --cluster) (default "1 3")
#   -b BIN_DIR  where shardkv, shardkv-server and shardkv-controller are
#               (default $SHARDKV_BIN_DIR, build-release/bin, build/bin)
#   -p FILE     also draw the results as an SVG bar chart (ops/s per test,
#               Redis beside shardkv, with the ratio)
#   -f MODE     the shardkv servers' --fsync (default none: like Redis here,
#               which runs without persistence, shardkv then writes its log
#               without waiting for it; bench/compare-redis-aof.sh compares
#               durable writes)
#   -A          in mode 3, each pipeline or batch spreads its keys over the
#               whole key space, so over every node; by default its keys
#               share one range (shardkv bench --one-range), the shape
#               redis-benchmark --cluster runs, which keeps each client on one
#               node and each pipeline on one slot
#   -S          single-key tests with a thread per caller instead (shardkv
#               bench --threads CLIENTS --connections 1, blocking calls)
#   -k          keep the work directory (logs, JSON reports)
#
# $SHARDKV_SERVER_FLAGS, when set, is added to every shardkv-server's command
# line (e.g. "--io-loops 0" to compare with nng's threads).
#
# For each mode it starts the servers on free loopback ports, prefills the key
# space on both sides, runs SET/put and GET/get with every client waiting for
# its reply, then the pipelined/batched pass, and prints both results and
# the ratio shardkv/redis. Redis runs without persistence; the shardkv
# servers run with --fsync none unless -f says otherwise. redis-server and redis-benchmark come from
# Debian's packages; they are installed with apt-get when missing. Each
# command is bounded by `timeout`; everything started is stopped on exit,
# also on failure or Ctrl-C.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
clients=50 ops=100000 keys=100000 vsize=100 pipe=16 modes="1 3" bin=${SHARDKV_BIN_DIR:-} keep= sync= plot= mbatch= fsync=none spread=
step_timeout=${COMPARE_STEP_TIMEOUT:-300}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
die() { echo "compare-redis: $*" >&2; exit 1; }

while getopts "c:n:r:d:P:m:b:p:f:ASMkh" o; do
	case "$o" in
	c) clients=$OPTARG ;;
	n) ops=$OPTARG ;;
	r) keys=$OPTARG ;;
	d) vsize=$OPTARG ;;
	P) pipe=$OPTARG ;;
	m) modes=$OPTARG ;;
	b) bin=$OPTARG ;;
	p) plot=$OPTARG ;;
	f) fsync=$OPTARG ;;
	A) spread=1 ;;
	S) sync=1 ;;
	M) mbatch=1 ;;
	k) keep=1 ;;
	*) usage ;;
	esac
done
for v in "$clients" "$ops" "$keys" "$vsize" "$pipe"; do
	[[ $v =~ ^[0-9]+$ ]] || die "numbers expected, got '$v'"
done
if [ "$clients" -lt 1 ] || [ "$ops" -lt 1 ] || [ "$keys" -lt 1 ] || [ "$pipe" -lt 1 ]; then
	die "-c, -n, -r and -P must be positive"
fi
[ "$keys" -le 999999999999 ] || die "-r is at most 999999999999 (12 digits)"
for m in $modes; do [ "$m" = 1 ] || [ "$m" = 3 ] || die "-m takes 1 and/or 3"; done
case "$fsync" in always | batch | none) ;; *) die "-f takes always, batch or none" ;; esac

# --- tools -------------------------------------------------------------------
command -v python3 >/dev/null || die "python3 is needed for the report"
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
	[ "$(id -u)" = 0 ] || die "redis-server/redis-benchmark missing; run: apt-get install redis-server redis-tools"
	echo "compare-redis: installing redis-server and redis-tools (apt-get)" >&2
	timeout "$step_timeout" apt-get install -y -q redis-server redis-tools >/dev/null ||
		{ apt-get update -q >/dev/null && timeout "$step_timeout" apt-get install -y -q redis-server redis-tools >/dev/null; } ||
		die "apt-get install redis-server redis-tools failed"
fi

# --- processes -----------------------------------------------------------------
work=$(mktemp -d /tmp/shardkv-compare-redis-XXXXXX)
pids=()

say() { echo "compare-redis: $*" >&2; }
# stop_all, cleanup (installed on exit), free_port, wait_for
. "$here/bench/lib.sh"
find_bin

shardkv_active() { # CTL N: the configuration has N active nodes
	"$bin/shardkv" -c "$1" --timeout 1000 config --json |
		python3 -c 'import json,sys; c=json.load(sys.stdin); sys.exit(0 if sum(n["state"]=="active" for n in c["nodes"])==int(sys.argv[1]) else 1)' "$2"
}

shardkv_reported() { # CTL KEYS: the status accounts for at least KEYS keys
	"$bin/shardkv" -c "$1" --timeout 1000 status --json |
		python3 -c 'import json,sys; c=json.load(sys.stdin); sys.exit(0 if sum(n.get("keys", 0) for n in c["nodes"])>=int(sys.argv[1]) else 1)' "$2"
}

start_shardkv() { # N: sets ctl to the controller URL
	local n=$1 port i dir=$work/shardkv-$1
	mkdir -p "$dir"
	port=$(free_port 10000)
	ctl="tcp://127.0.0.1:$port"
	one_copy_flags "$bin/shardkv-controller" # Redis Cluster runs with no replicas too
	"$bin/shardkv-controller" --listen "$ctl" --data-dir "$dir/ctl" ${one_copy[@]+"${one_copy[@]}"} >/dev/null 2>"$dir/ctl.log" &
	pids+=($!)
	wait_for 30 "$bin/shardkv" -c "$ctl" --timeout 500 config || die "controller did not start (see $dir/ctl.log)"
	for ((i = 1; i <= n; i++)); do
		port=$(free_port 10000)
		"$bin/shardkv-server" --listen "tcp://127.0.0.1:$port" --controller "$ctl" \
			--data-dir "$dir/s$i" --join --fsync "$fsync" ${SHARDKV_SERVER_FLAGS-} >/dev/null 2>"$dir/s$i.log" &
		pids+=($!)
		: >"$work/$!.int"
		wait_for 30 shardkv_active "$ctl" "$i" || die "server $i did not become active (see $dir/s$i.log)"
	done
}

start_redis() { # N: sets rport to the first server's port
	local n=$1 i port first='' dir=$work/redis-$1 hosts=()
	mkdir -p "$dir"
	for ((i = 1; i <= n; i++)); do
		port=$(free_port 10000)
		[ -n "$first" ] || first=$port
		mkdir -p "$dir/r$i"
		local extra=()
		[ "$n" -gt 1 ] && extra=(--cluster-enabled yes --cluster-config-file "$dir/r$i/nodes.conf")
		redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no --daemonize no \
			--dir "$dir/r$i" --protected-mode no "${extra[@]+"${extra[@]}"}" >"$dir/r$i.log" 2>&1 &
		pids+=($!)
		wait_for 20 redis-cli -p "$port" ping || die "redis-server did not start (see $dir/r$i.log)"
		hosts+=("127.0.0.1:$port")
	done
	if [ "$n" -gt 1 ]; then
		timeout 60 redis-cli --cluster create "${hosts[@]}" --cluster-replicas 0 --cluster-yes \
			>"$dir/create.log" 2>&1 || die "redis-cli --cluster create failed (see $dir/create.log)"
		wait_for 30 sh -c "redis-cli -p $first cluster info | grep -q cluster_state:ok" ||
			die "Redis Cluster not ok"
	fi
	rport=$first
}

# --- measuring -------------------------------------------------------------------
results=$work/results.tsv
: >"$results"

# redis_run NAME PORT CLUSTER TEST P: appends "NAME redis rps p50_ms p99_ms"
redis_run() {
	local name=$1 port=$2 cl=$3 test=$4 p=$5 csv
	local args=(-h 127.0.0.1 -p "$port" -c "$clients" -n $((ops * p)) -r "$keys" -d "$vsize" -P "$p" -t "$test" --csv)
	[ "$cl" = 1 ] && args+=(--cluster)
	csv=$(timeout "$step_timeout" redis-benchmark "${args[@]}" 2>"$work/redis-bench.err" | grep -E '^"(SET|GET)' | head -n 1) ||
		die "redis-benchmark $test failed: $(tail -n 3 "$work/redis-bench.err")"
	python3 - "$name" "$csv" >>"$results" <<'EOF'
import csv, sys
row = next(csv.reader([sys.argv[2]]))
# "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
p50 = row[4] if len(row) > 6 else "nan"
p99 = row[6] if len(row) > 6 else "nan"
print(f"{sys.argv[1]}\tredis\t{float(row[1]):.0f}\t{p50}\t{p99}")
EOF
}

# shardkv_run NAME CTL MIX BATCH NODES: appends "NAME shardkv ops/s p50_ms p99_ms"
shardkv_run() {
	local name=$1 ctl=$2 mix=$3 batch=$4 nodes=$5 out callers
	out=$work/$(echo "$1" | tr ' /' '__').json
	if [ "$batch" -gt 1 ] && [ -n "$mbatch" ]; then
		callers=(--threads "$clients" --connections "$clients" --batch "$batch")
	elif [ "$batch" -gt 1 ]; then
		callers=(--threads 1 --async "$clients" --connections 1 --batch "$batch")
	elif [ -n "$sync" ]; then
		callers=(--threads "$clients" --connections 1)
	else
		callers=(--threads 1 --async "$clients" --connections 1)
	fi
	[ "$batch" -gt 1 ] && [ "$nodes" -gt 1 ] && [ -z "$spread" ] && callers+=(--one-range)
	timeout "$step_timeout" "$bin/shardkv" -c "$ctl" --json bench "${callers[@]}" \
		--keys "$keys" --key-size 16 --value-size "$vsize" \
		--mix "$mix" --ops $((ops * batch)) --out "$out" >/dev/null \
		2>"$work/shardkv-bench.err" || die "shardkv bench $mix failed: $(tail -n 3 "$work/shardkv-bench.err")"
	python3 - "$name" "$out" >>"$results" <<'EOF'
import json, sys
d = json.load(open(sys.argv[2]))
# A pipeline's latency to its first answer where measured: redis-benchmark
# times a pipeline from its write to its first reply.
l = d.get("latency_first_us", d["latency_us"])
print(f"{sys.argv[1]}\tshardkv\t{d['ops_per_sec']:.0f}\t{l['p50']/1000:.3f}\t{l['p99']/1000:.3f}")
EOF
}

for m in $modes; do
	echo "compare-redis: $m node(s): starting shardkv and redis" >&2
	start_shardkv "$m"
	start_redis "$m"
	cl=0
	[ "$m" -gt 1 ] && cl=1

	# Prefill: every key on shardkv (--load), then spread the data by size;
	# redis gets three SET passes over the random key space (unmeasured).
	timeout "$step_timeout" "$bin/shardkv" -c "$ctl" bench --threads "$clients" --keys "$keys" \
		--key-size 16 --value-size "$vsize" --load --ops 0 >"$work/load-$m.log" 2>&1 ||
		die "shardkv --load failed (see $work/load-$m.log)"
	if [ "$m" -gt 1 ]; then
		# The controller balances by the sizes the servers report in their
		# heartbeats: wait until they account for the loaded keys.
		wait_for 60 shardkv_reported "$ctl" "$keys" || die "servers never reported the loaded keys"
		timeout "$step_timeout" "$bin/shardkv" -c "$ctl" --timeout 120000 rebalance --wait \
			>>"$work/load-$m.log" 2>&1 || die "shardkv rebalance failed"
	fi
	pre=(-h 127.0.0.1 -p "$rport" -c "$clients" -n $((3 * keys)) -r "$keys" -d "$vsize" -P 16 -t set -q)
	[ "$cl" = 1 ] && pre+=(--cluster)
	timeout "$step_timeout" redis-benchmark "${pre[@]}" >/dev/null 2>&1 || die "redis prefill failed"

	echo "compare-redis: $m node(s): measuring" >&2
	redis_run "$m node SET" "$rport" "$cl" set 1
	shardkv_run "$m node SET" "$ctl" put:1 1 "$m"
	redis_run "$m node GET" "$rport" "$cl" get 1
	shardkv_run "$m node GET" "$ctl" get:1 1 "$m"
	if [ "$pipe" -gt 1 ]; then
		redis_run "$m node SET P$pipe" "$rport" "$cl" set "$pipe"
		shardkv_run "$m node SET P$pipe" "$ctl" put:1 "$pipe" "$m"
		redis_run "$m node GET P$pipe" "$rport" "$cl" get "$pipe"
		shardkv_run "$m node GET P$pipe" "$ctl" get:1 "$pipe" "$m"
	fi
	stop_all
done

cpus=$(nproc)
python3 - "$results" "$clients" "$ops" "$keys" "$vsize" "$pipe" "$cpus" "$plot" "$mbatch" "$fsync" "$spread" "$modes" <<'EOF'
import sys
path, clients, ops, keys, vsize, pipe, cpus, plot = sys.argv[1:9]
print(f"# redis-server without persistence; shardkv-server --fsync {sys.argv[10]}")
rows = {}
order = []
for line in open(path):
    name, who, rps, p50, p99 = line.rstrip("\n").split("\t")
    if name not in rows:
        rows[name] = {}
        order.append(name)
    rows[name][who] = (float(rps), p50, p99)
print(f"# shardkv bench vs redis-benchmark on loopback ({cpus} CPUs, clients and servers share them)")
print(f"# {clients} callers, {ops} ops per test ({int(ops) * int(pipe)} pipelined), {keys} keys of 16 B, values of {vsize} B;")
if len(sys.argv) > 9 and sys.argv[9]:
    print(f"# P{pipe}: redis pipelines {pipe} commands, shardkv sends mget/mput of {pipe} keys (one op per key)")
else:
    print(f"# P{pipe}: redis pipelines {pipe} commands per client, shardkv keeps {pipe} async ops in flight per caller")
if int(pipe) > 1:
    if not sys.argv[9]:
        print(f"# P{pipe} latency: a pipeline's, from its first send to its first answer, on both sides (redis-benchmark's measure)")
    if "3" not in sys.argv[12].split():
        pass
    elif sys.argv[11]:
        print(f"# 3 nodes P{pipe}: shardkv spreads each caller's {pipe} keys over the key space; redis keeps a pipeline on one slot")
    else:
        print(f"# 3 nodes P{pipe}: the keys of a pipeline share one range (shardkv bench --one-range), as redis-benchmark --cluster keeps them on one slot")
print(f"{'test':<16} {'redis ops/s':>12} {'shardkv ops/s':>14} {'ratio':>7}   {'redis p50/p99 ms':>18}   {'shardkv p50/p99 ms':>20}")
for name in order:
    r = rows[name].get("redis")
    s = rows[name].get("shardkv")
    if not r or not s:
        continue
    ratio = s[0] / r[0] if r[0] else float("nan")
    print(f"{name:<16} {r[0]:>12.0f} {s[0]:>14.0f} {ratio:>7.2f}   {r[1] + '/' + r[2]:>18}   {s[1] + '/' + s[2]:>20}")
if plot:
    names = [n for n in order if "redis" in rows[n] and "shardkv" in rows[n]]
    top = max([max(rows[n]["redis"][0], rows[n]["shardkv"][0]) for n in names] + [1])
    W, H, L, B, T = 120 + 110 * len(names), 360, 70, 70, 40
    ph = H - B - T
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<text x="{W/2}" y="20" text-anchor="middle" font-size="14">ops/s, {clients} callers, {vsize}-byte values, {cpus} CPUs shared by clients and servers</text>']
    for i in range(5):
        v = top * i / 4
        y = T + ph - ph * i / 4
        out.append(f'<line x1="{L}" x2="{W-20}" y1="{y:.1f}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L-6}" y="{y+4:.1f}" text-anchor="end">{v/1000:.0f}k</text>')
    for i, n in enumerate(names):
        x = L + 20 + 110 * i
        for j, (who, col) in enumerate((("redis", "#c44"), ("shardkv", "#37c"))):
            v = rows[n][who][0]
            h = ph * v / top
            out.append(f'<rect x="{x + 36*j}" y="{T+ph-h:.1f}" width="32" height="{h:.1f}" fill="{col}"/>')
        ratio = rows[n]["shardkv"][0] / rows[n]["redis"][0]
        out.append(f'<text x="{x+34}" y="{T+ph+16}" text-anchor="middle">{n}</text>')
        out.append(f'<text x="{x+34}" y="{T+ph+32}" text-anchor="middle">{ratio:.2f}x</text>')
    out.append(f'<rect x="{W-190}" y="30" width="12" height="12" fill="#c44"/><text x="{W-172}" y="40">redis-server</text>')
    out.append(f'<rect x="{W-100}" y="30" width="12" height="12" fill="#37c"/><text x="{W-82}" y="40">shardkv</text>')
    out.append('</svg>')
    open(plot, "w").write("\n".join(out) + "\n")
    print(f"# chart: {plot}")
EOF
