#!/usr/bin/env bash
# bench/compare-redis-aof.sh - durable writes: shardkv's write-ahead log
# against Redis's append-only file, on the same disk, plus recovery speed.
#
#   bench/compare-redis-aof.sh [-c "1 50"] [-n OPS] [-d BYTES] [-r RUNS]
#                              [-K KEYS] [-L LOAD_KEYS] [-w DIR] [-C]
#                              [-b BIN_DIR] [-k] [-s HANDLES] [-A]
#
#   -c CLIENTS  concurrent writers, one pass each: shardkv bench --threads
#               and --connections, redis-benchmark -c (default "1 50"); ""
#               skips the write passes
#   -n OPS      SET/put operations per measurement (default 50000)
#   -d BYTES    value size (default 100)
#   -r RUNS     runs of every measurement; the table shows medians and the
#               run-to-run range (default 3)
#   -K KEYS     key space of the write passes: keys "key:" + 12 digits
#               (16 bytes) in both (default 100000)
#   -L KEYS     recovery part: keys loaded into one server (16-byte keys,
#               values of -d bytes; default 10000000, about 1.2 GB of log);
#               0 skips the recovery part
#   -w DIR      parent of the work directory: every data dir, log and AOF
#               lives there (default $TMPDIR, else /tmp)
#   -C          also measure recovery with a cold page cache (sync, then
#               echo 3 > /proc/sys/vm/drop_caches before the restart; root)
#   -b BIN_DIR  where shardkv, shardkv-server and shardkv-controller are
#               (default $SHARDKV_BIN_DIR, build-release/bin, build/bin)
#   -k          keep the work directory (logs, JSON reports, data)
#   -s HANDLES  shardkv bench --connections: client handles the writers
#               share (default: one per writer, like redis-benchmark's
#               connections; 1: every writer on one handle, whose concurrent
#               ops libshardkv coalesces into shared requests)
#   -A          the writers as async callers of one thread on one handle
#               (shardkv bench --threads 1 --async CLIENTS), the shape of
#               compare-redis.sh and of redis-benchmark's one event loop,
#               instead of a thread per writer
#
# Write passes: for every run and every writer count, a fresh one-node shardkv
# (controller + one server) with --fsync always, batch and none, each followed
# by a fresh redis-server with appendfsync always, everysec and no persistence
# (--save "" --appendonly no), so each system is measured next to its peer.
# SET/put only: shardkv bench --mix put:1, redis-benchmark -t set.
#
# Recovery part (one server, --fsync batch): load -L keys with
# `shardkv bench --load` and no snapshot (--snapshot-bytes 1 TiB), SIGKILL,
# restart on the same data dir -r times and read the server's `recovered`
# line; the same with --snapshot-bytes a quarter of the data (at most
# 256 MiB, the value for the default -L) so that snapshots are taken
# during the load (their `snapshot written` lines give the cost), then a
# tenth of the keys written again with snapshots off, recovering from the
# last snapshot and that log tail. Then, on that loaded server,
# put throughput with 50 writers while snapshots run back to back (restarted
# with --snapshot-bytes 4096: every snapshot ends with more than 4 KiB of new
# log, so the next starts within 200 ms) against no snapshot at all.
#
# Every command is bounded by `timeout`; everything started is stopped on
# exit, also on failure or Ctrl-C. Ports are free loopback ports. redis-server
# and redis-benchmark come from Debian's packages, installed with apt-get
# when missing. Run it at `nice -n -15` on a shared machine.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
clients="1 50" ops=50000 vsize=100 runs=3 keys=100000 load_keys=10000000
parent=${TMPDIR:-/tmp} cold='' bin=${SHARDKV_BIN_DIR:-} keep='' handles=''
step_timeout=${COMPARE_STEP_TIMEOUT:-600}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
die() { echo "compare-redis-aof: $*" >&2; exit 1; }
say() { echo "compare-redis-aof: $*" >&2; }

while getopts "c:n:d:r:K:L:w:Cb:ks:Ah" o; do
	case "$o" in
	c) clients=$OPTARG ;;
	n) ops=$OPTARG ;;
	d) vsize=$OPTARG ;;
	r) runs=$OPTARG ;;
	K) keys=$OPTARG ;;
	L) load_keys=$OPTARG ;;
	w) parent=$OPTARG ;;
	C) cold=1 ;;
	b) bin=$OPTARG ;;
	k) keep=1 ;;
	s) handles=$OPTARG ;;
	A) async=1 ;;
	*) usage ;;
	esac
done
for v in $clients "$ops" "$vsize" "$runs" "$keys" "$load_keys" ${handles:+"$handles"}; do
	[[ $v =~ ^[0-9]+$ ]] || die "numbers expected, got '$v'"
done
for v in $clients; do [ "$v" -ge 1 ] || die "-c takes positive writer counts"; done
if [ "$ops" -lt 1 ] || [ "$runs" -lt 1 ] || [ "$keys" -lt 1 ] || [ "$vsize" -lt 1 ]; then
	die "-n, -r, -K and -d must be positive"
fi
if [ "$keys" -gt 999999999999 ] || [ "$load_keys" -gt 999999999999 ]; then
	die "-K and -L are at most 999999999999"
fi
[ -d "$parent" ] || die "-w $parent is not a directory"
if [ -n "$cold" ] && { [ "$(id -u)" != 0 ] || [ ! -w /proc/sys/vm/drop_caches ]; }; then
	die "-C needs root (writes /proc/sys/vm/drop_caches)"
fi

# --- tools -------------------------------------------------------------------
command -v python3 >/dev/null || die "python3 is needed for the report"
if ! command -v redis-server >/dev/null || ! command -v redis-benchmark >/dev/null; then
	[ "$(id -u)" = 0 ] || die "redis-server/redis-benchmark missing; run: apt-get install redis-server redis-tools"
	say "installing redis-server and redis-tools (apt-get)"
	timeout "$step_timeout" apt-get install -y -q redis-server redis-tools >/dev/null ||
		{ timeout "$step_timeout" apt-get update -q >/dev/null &&
			timeout "$step_timeout" apt-get install -y -q redis-server redis-tools >/dev/null; } ||
		die "apt-get install redis-server redis-tools failed"
fi

# --- processes -----------------------------------------------------------------
work=$(mktemp -d "$parent/shardkv-compare-aof-XXXXXX")
pids=()

# Sends SIG to one process started here, waits for it and forgets it.
stop_one() { # PID SIG
	local p=$1 sig=$2 deadline=$((SECONDS + 30)) q keep_pids=()
	kill "-$sig" "$p" 2>/dev/null || true
	while kill -0 "$p" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.02; done
	kill -KILL "$p" 2>/dev/null || true
	{ wait "$p"; } 2>/dev/null || true
	rm -f "$work/$p.int"
	for q in "${pids[@]+"${pids[@]}"}"; do [ "$q" = "$p" ] || keep_pids+=("$q"); done
	pids=("${keep_pids[@]+"${keep_pids[@]}"}")
}

. "$here/bench/lib.sh"
find_bin

# Runs `shardkv -c CTL ARGS...` (a bench writing --out OUT) for at most
# $step_timeout seconds. The CLI sometimes hangs in shardkv_close() after it
# has written its report (nng_close() never returns; see README "Durability
# figures"): 15 s after OUT is complete JSON it is killed, noted in hangs.log,
# and the run counts.
run_bench() { # OUT ERR ARGS...
	local out=$1 err=$2 p deadline=$((SECONDS + step_timeout)) done_at='' hung=''
	shift 2
	rm -f "$out"
	"$bin/shardkv" -c "$ctl" "$@" >/dev/null 2>"$err" &
	p=$!
	while kill -0 "$p" 2>/dev/null; do
		if [ -z "$done_at" ] && [ -s "$out" ] &&
			python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$out" 2>/dev/null; then
			done_at=$SECONDS
		fi
		if [ -n "$done_at" ] && [ $((SECONDS - done_at)) -ge 15 ]; then
			hung=1
			echo "$(date -u +%FT%TZ) shardkv $* hung at exit after writing $out" >>"$work/hangs.log"
			say "shardkv bench hung at exit after writing its report; killed (see $work/hangs.log)"
			kill -KILL "$p" 2>/dev/null || true
			break
		fi
		if [ $SECONDS -ge $deadline ]; then
			kill -KILL "$p" 2>/dev/null || true
			{ wait "$p"; } 2>/dev/null || true
			return 124
		fi
		sleep 0.2
	done
	local rc=0
	{ wait "$p"; } 2>/dev/null || rc=$?
	[ -n "$hung" ] && return 0
	return "$rc"
}

shardkv_active() { # CTL N: the configuration has N active nodes
	timeout 10 "$bin/shardkv" -c "$1" --timeout 1000 config --json |
		python3 -c 'import json,sys; c=json.load(sys.stdin); sys.exit(0 if sum(n["state"]=="active" for n in c["nodes"])==int(sys.argv[1]) else 1)' "$2"
}

# A get answered (found or not) by the server: exit 0 or 1, not 3.
shardkv_serves() { # CTL
	local rc=0
	timeout 10 "$bin/shardkv" -c "$1" --timeout 1000 get key:probe >/dev/null 2>&1 || rc=$?
	[ "$rc" -le 1 ]
}

start_controller() { # DIR: sets ctl
	local port
	port=$(free_port)
	ctl="tcp://127.0.0.1:$port"
	"$bin/shardkv-controller" --listen "$ctl" --data-dir "$1/ctl" >/dev/null 2>"$1/ctl.log" &
	pids+=($!)
	wait_for 30 timeout 5 "$bin/shardkv" -c "$ctl" --timeout 500 config || die "controller did not start (see $1/ctl.log)"
}

# Starts (or restarts) the server; sets spid and saddr (kept on restarts).
start_server() { # DIR FSYNC [SERVER ARGS...]
	local dir=$1 fsync=$2
	shift 2
	[ -n "${saddr:-}" ] || saddr="tcp://127.0.0.1:$(free_port)"
	"$bin/shardkv-server" --listen "$saddr" --controller "$ctl" --data-dir "$dir/s1" --join \
		--fsync "$fsync" "$@" >/dev/null 2>>"$dir/s1.log" &
	spid=$!
	pids+=("$spid")
	: >"$work/$spid.int"
}

start_shardkv() { # DIR FSYNC [SERVER ARGS...]: a controller and one active server
	mkdir -p "$1"
	saddr=
	start_controller "$1"
	start_server "$@"
	wait_for 60 shardkv_active "$ctl" 1 || die "server did not become active (see $1/s1.log)"
}

start_redis() { # DIR ARGS...: sets rport
	local dir=$1
	shift
	mkdir -p "$dir"
	rport=$(free_port)
	redis-server --bind 127.0.0.1 --port "$rport" --daemonize no --dir "$dir" \
		--protected-mode no "$@" >"$dir/redis.log" 2>&1 &
	pids+=($!)
	wait_for 20 redis-cli -p "$rport" ping || die "redis-server did not start (see $dir/redis.log)"
}

# --- the disk -------------------------------------------------------------------
fs_line=$(df -PT "$work" | awk 'NR == 2 { printf "%s (%s) mounted on %s, %s 1K-blocks free", $1, $2, $7, $5 }')
dev=$(df -P "$work" | awk 'NR == 2 { print $1 }')
dev_line=""
if [ -b "$dev" ]; then
	b=$(basename "$(readlink -f "$dev")")
	rot=$(cat "/sys/class/block/$b/queue/rotational" 2>/dev/null || echo '?')
	model=$(tr -s ' ' 2>/dev/null <"/sys/class/block/$b/device/model" || true)
	dev_line="block device $b rotational=$rot${model:+ model=$model}"
fi
say "work dir $work on $fs_line${dev_line:+; $dev_line}"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# --- write passes -----------------------------------------------------------------
results=$work/results.tsv
: >"$results"

# shardkv_pass RUN C FSYNC: appends "RUN C shardkv FSYNC ops/s p50_ms p99_ms"
shardkv_pass() {
	local run=$1 c=$2 fs=$3 dir=$work/w/r$1-c$2-shardkv-$3 out
	start_shardkv "$dir" "$fs"
	out=$dir/bench.json
	conns=$c
	if [ -n "$handles" ] && [ "$handles" -lt "$c" ]; then conns=$handles; fi
	local callers=(--threads "$c" --connections "$conns")
	if [ -n "${async-}" ]; then callers=(--threads 1 --async "$c" --connections 1); fi
	run_bench "$out" "$dir/bench.err" --json bench "${callers[@]}" \
		--keys "$keys" --key-size 16 --value-size "$vsize" --mix put:1 --ops "$ops" \
		--out "$out" ||
		die "shardkv bench ($fs, $c writers) failed: $(tail -n 3 "$dir/bench.err")"
	python3 - "$run" "$c" "$fs" "$out" >>"$results" <<'EOF'
import json, sys
run, c, fs, path = sys.argv[1:]
d = json.load(open(path))
l = d["latency_us"]
if d["errors"]:
    sys.exit(f"shardkv bench reported {d['errors']} errors")
print(f"{run}\t{c}\tshardkv\t{fs}\t{d['ops_per_sec']:.0f}\t{l['p50']/1000:.3f}\t{l['p99']/1000:.3f}")
EOF
	stop_all
}

# redis_pass RUN C NAME ARGS...: appends "RUN C redis NAME rps p50_ms p99_ms"
redis_pass() {
	local run=$1 c=$2 name=$3 dir=$work/w/r$1-c$2-redis-$3 csv
	shift 3
	start_redis "$dir" "$@"
	csv=$(timeout "$step_timeout" redis-benchmark -h 127.0.0.1 -p "$rport" -c "$c" -n "$ops" \
		-r "$keys" -d "$vsize" -t set --csv 2>"$dir/bench.err" | grep -E '^"SET' | head -n 1) ||
		die "redis-benchmark ($name, $c writers) failed: $(tail -n 3 "$dir/bench.err")"
	[ -n "$csv" ] || die "redis-benchmark printed no SET line"
	python3 - "$run" "$c" "$name" "$csv" >>"$results" <<'EOF'
import csv, sys
run, c, name, line = sys.argv[1:]
row = next(csv.reader([line]))
# "test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
p50 = row[4] if len(row) > 6 else "nan"
p99 = row[6] if len(row) > 6 else "nan"
print(f"{run}\t{c}\tredis\t{name}\t{float(row[1]):.0f}\t{p50}\t{p99}")
EOF
	stop_all
}

for ((run = 1; run <= runs; run++)); do
	for c in $clients; do
		say "run $run/$runs, $c writer(s): shardkv always, redis always, shardkv batch, redis everysec, shardkv none, redis none"
		shardkv_pass "$run" "$c" always
		redis_pass "$run" "$c" always --save '' --appendonly yes --appendfsync always
		shardkv_pass "$run" "$c" batch
		redis_pass "$run" "$c" everysec --save '' --appendonly yes --appendfsync everysec
		shardkv_pass "$run" "$c" none
		redis_pass "$run" "$c" none --save '' --appendonly no
	done
done

# --- recovery ----------------------------------------------------------------------
recovery=$work/recovery.tsv snaps=$work/snapshots.tsv during=$work/during.tsv
: >"$recovery"
: >"$snaps"
: >"$during"

# Prints the fields of the last `recovered` line of LOG as "mb secs mb_per_s
# snapshot_keys log_records".
recovered_fields() {
	grep ' recovered ' "$1" | tail -n 1 |
		sed -E 's/.*snapshot_keys=([0-9]+) log_records=([0-9]+) mb=([0-9.]+) secs=([0-9.]+) mb_per_s=([0-9.]+).*/\3\t\4\t\5\t\1\t\2/'
}

# Restarts the server after SIGKILL and waits for it to serve; appends
# "KIND CACHE RUN mb secs mb_per_s snapshot_keys log_records" to recovery.tsv.
kill_restart() { # DIR KIND CACHE RUN SNAPSHOT_BYTES
	local dir=$1 kind=$2 cache=$3 run=$4 sb=$5 before
	stop_one "$spid" KILL
	if [ "$cache" = cold ]; then
		sync
		echo 3 >/proc/sys/vm/drop_caches
	fi
	before=$(grep -c ' recovered ' "$dir/s1.log" || true)
	start_server "$dir" batch --snapshot-bytes "$sb"
	wait_for "$step_timeout" sh -c "[ \$(grep -c ' recovered ' '$dir/s1.log') -gt $before ]" ||
		die "no recovered line after a restart (see $dir/s1.log)"
	wait_for 60 shardkv_serves "$ctl" || die "restarted server does not serve (see $dir/s1.log)"
	printf '%s\t%s\t%s\t%s\n' "$kind" "$cache" "$run" "$(recovered_fields "$dir/s1.log")" >>"$recovery"
}

snap_idle() { # DATA_DIR: no snapshot is being written (LOG: DATA_DIR.log)
	! compgen -G "$1/snap-*.tmp" >/dev/null &&
		[ "$(grep -c ' wrote snapshot ' "$1.log" || true)" = "$(grep -c ' snapshot written ' "$1.log" || true)" ]
}

load() { # DIR
	run_bench "$1/load.json" "$1/load.err" --json bench --threads 8 --connections 8 \
		--keys "$load_keys" --key-size 16 --value-size "$vsize" --load --ops 0 \
		--out "$1/load.json" ||
		die "shardkv bench --load failed: $(tail -n 3 "$1/load.err")"
}

# put with 50 writers for 10 s on the loaded server; appends "RUN CONFIG
# ops/s p50_ms p99_ms snapshots_during snapshot_ms_list" to during.tsv.
put_pass() { # DIR RUN CONFIG
	local dir=$1 run=$2 cfg=$3 before out=$1/during-$2-$3.json
	before=$(grep -c 'snapshot written' "$dir/s1.log" || true)
	run_bench "$out" "$dir/during.err" --json bench --threads 50 --connections 50 \
		--keys "$load_keys" --key-size 16 --value-size "$vsize" --mix put:1 --duration 10 \
		--out "$out" ||
		die "shardkv bench during snapshots failed: $(tail -n 3 "$dir/during.err")"
	python3 - "$run" "$cfg" "$out" "$dir/s1.log" "$before" >>"$during" <<'EOF'
import json, re, sys
run, cfg, path, log, before = sys.argv[1:]
d = json.load(open(path))
l = d["latency_us"]
ms = [m.group(1) for m in (re.search(r"snapshot written .* ms=(\d+)", x) for x in open(log)) if m]
new = ms[int(before):]
print(f"{run}\t{cfg}\t{d['ops_per_sec']:.0f}\t{l['p50']/1000:.3f}\t{l['p99']/1000:.3f}\t{len(new)}\t{','.join(new) or '-'}")
EOF
}

if [ "$load_keys" -gt 0 ]; then
	# A quarter of the data, at most 256 MiB: several snapshots during the load.
	snap_bytes=$((load_keys * (16 + vsize) / 4))
	[ "$snap_bytes" -le 268435456 ] || snap_bytes=268435456
	[ "$snap_bytes" -ge 4096 ] || snap_bytes=4096
	caches=warm
	[ -n "$cold" ] && caches="warm cold"
	# 1. Only a log.
	dir=$work/recovery-log
	say "recovery: loading $load_keys keys of $vsize B (--fsync batch, no snapshot)"
	start_shardkv "$dir" batch --snapshot-bytes 1099511627776
	load "$dir"
	for ((run = 1; run <= runs; run++)); do
		for cache in $caches; do
			say "recovery from the log: run $run/$runs ($cache page cache)"
			kill_restart "$dir" log "$cache" "$run" 1099511627776
		done
	done
	stop_all
	[ -n "$keep" ] || rm -rf "$dir"

	# 2. Snapshots taken during the load, then the log after the last one.
	dir=$work/recovery-snap
	say "recovery: loading $load_keys keys of $vsize B (--fsync batch, --snapshot-bytes $snap_bytes)"
	start_shardkv "$dir" batch --snapshot-bytes "$snap_bytes"
	load "$dir"
	# Let a snapshot that the end of the load started finish (the snapshot
	# thread looks every 200 ms; a snapshot in progress has a .tmp file, and
	# logs "snapshot written" once it has also dropped the log it covers).
	for _ in 1 2; do
		sleep 0.5
		wait_for "$step_timeout" snap_idle "$dir/s1" || die "a snapshot never finished (see $dir/s1.log)"
	done
	{ grep 'snapshot written' "$dir/s1.log" || true; } |
		sed -E 's/.*lsn=([0-9]+) entries=([0-9]+) bytes=([0-9]+) ms=([0-9]+).*/\2\t\3\t\4/' >"$snaps"
	[ -s "$snaps" ] || die "no snapshot was written during the load (see $dir/s1.log)"
	# A log tail after the last snapshot: the first tenth of the keys again,
	# with snapshots off from here on.
	stop_one "$spid" INT
	start_server "$dir" batch --snapshot-bytes 1099511627776
	wait_for 600 shardkv_serves "$ctl" || die "server does not serve (see $dir/s1.log)"
	tail_keys=$((load_keys / 10 > 0 ? load_keys / 10 : 1))
	say "recovery: writing a log tail of $tail_keys keys after the last snapshot"
	run_bench "$dir/tail.json" "$dir/tail.err" --json bench --threads 8 --connections 8 \
		--keys "$tail_keys" --key-size 16 --value-size "$vsize" --load --ops 0 \
		--out "$dir/tail.json" || die "shardkv bench --load (tail) failed: $(tail -n 3 "$dir/tail.err")"
	for ((run = 1; run <= runs; run++)); do
		for cache in $caches; do
			say "recovery from a snapshot and the log: run $run/$runs ($cache page cache)"
			kill_restart "$dir" snapshot "$cache" "$run" 1099511627776
		done
	done

	# 3. Put throughput while snapshots run back to back, against none.
	for ((run = 1; run <= runs; run++)); do
		say "put throughput with and without a snapshot in progress: run $run/$runs"
		stop_one "$spid" INT
		start_server "$dir" batch --snapshot-bytes 1099511627776
		wait_for 600 shardkv_serves "$ctl" || die "server does not serve (see $dir/s1.log)"
		put_pass "$dir" "$run" nosnap
		stop_one "$spid" INT
		start_server "$dir" batch --snapshot-bytes 4096
		wait_for 600 shardkv_serves "$ctl" || die "server does not serve (see $dir/s1.log)"
		put_pass "$dir" "$run" snap
	done
	stop_all
	[ -n "$keep" ] || rm -rf "$dir"
fi

# --- report ---------------------------------------------------------------------------
cpus="$(nproc) CPUs; load average $load_start at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end"
python3 - "$results" "$recovery" "$snaps" "$during" "$runs" "$ops" "$keys" "$vsize" "$cpus" \
	"$fs_line${dev_line:+; $dev_line}" "$load_keys" <<'EOF'
import statistics as st, sys
res, rec, snaps, during, runs, ops, keys, vsize, cpus, fs, load_keys = sys.argv[1:]

def med(xs):
    return st.median(xs) if xs else float("nan")

def spread(xs, fmt="{:.0f}"):
    return (fmt.format(min(xs)) + "-" + fmt.format(max(xs))) if xs else "-"

rows = {}
for line in open(res):
    run, c, who, cfg, rps, p50, p99 = line.rstrip("\n").split("\t")
    rows.setdefault((int(c), who, cfg), []).append((int(run), float(rps), float(p50), float(p99)))

print(f"# one node, loopback ({cpus}; clients and servers share the CPUs)")
print(f"# disk: {fs}")
if rows:
    print(f"# durable SET/put: {ops} ops per measurement, {keys} keys of 16 B, values of {vsize} B; medians of {runs} runs (range in brackets)")
    print(f"{'writers':>7} {'system':<8} {'durability':<20} {'ops/s':>8} {'[min-max]':>15} {'p50 ms':>8} {'p99 ms':>8}")
label = {("shardkv", "always"): "--fsync always", ("shardkv", "batch"): "--fsync batch",
         ("shardkv", "none"): "--fsync none", ("redis", "always"): "appendfsync always",
         ("redis", "everysec"): "appendfsync everysec", ("redis", "none"): "no persistence"}
order = [("shardkv", "always"), ("redis", "always"), ("shardkv", "batch"),
         ("redis", "everysec"), ("shardkv", "none"), ("redis", "none")]
for c in sorted({k[0] for k in rows}):
    for who, cfg in order:
        r = rows.get((c, who, cfg))
        if not r:
            continue
        rps = [x[1] for x in r]
        print(f"{c:>7} {who:<8} {label[(who, cfg)]:<20} {med(rps):>8.0f} {'[' + spread(rps) + ']':>15} "
              f"{med([x[2] for x in r]):>8.3f} {med([x[3] for x in r]):>8.3f}")
    def ratio(a, b):
        ra, rb = rows.get((c,) + a), rows.get((c,) + b)
        if not ra or not rb:
            return "-"
        per = sorted(x[1] / y[1] for x, y in zip(sorted(ra), sorted(rb)) if y[1])
        return f"{med([x[1] for x in ra]) / med([x[1] for x in rb]):.2f} (per run {spread(per, '{:.2f}')})"
    print(f"{c:>7} ratios: shardkv-always/redis-always {ratio(('shardkv', 'always'), ('redis', 'always'))}; "
          f"shardkv-batch/shardkv-none {ratio(('shardkv', 'batch'), ('shardkv', 'none'))}")

if int(load_keys) == 0:
    sys.exit(0)
if rows:
    print()
print(f"# recovery of one server (--fsync batch) after SIGKILL, {load_keys} keys of 16 B with {vsize}-B values")
print(f"{'from':<10} {'cache':<6} {'MB':>8} {'secs':>8} {'MB/s':>8} {'[min-max]':>13} {'snap keys':>10} {'log records':>12}")
rr = {}
for line in open(rec):
    kind, cache, run, mb, secs, rate, sk, lr = line.rstrip("\n").split("\t")
    rr.setdefault((kind, cache), []).append((float(mb), float(secs), float(rate), int(sk), int(lr)))
for (kind, cache), r in rr.items():
    rates = [x[2] for x in r]
    print(f"{kind:<10} {cache:<6} {med([x[0] for x in r]):>8.1f} {med([x[1] for x in r]):>8.3f} "
          f"{med(rates):>8.1f} {'[' + spread(rates, '{:.1f}') + ']':>13} {r[0][3]:>10} {r[0][4]:>12}")
sl = [line.rstrip("\n").split("\t") for line in open(snaps) if line.strip()]
if sl:
    print("snapshots written during the load (entries, MB, ms, MB/s): " +
          "; ".join(f"{e} {int(b)/1e6:.0f} {ms} {int(b)/1e3/max(int(ms),1):.0f}" for e, b, ms in sl))
dd = {}
for line in open(during):
    run, cfg, rps, p50, p99, n, ms = line.rstrip("\n").split("\t")
    dd.setdefault(cfg, []).append((float(rps), float(p50), float(p99), int(n), ms))
if dd:
    print(f"# put, 50 writers, 10 s on the loaded server, with snapshots back to back vs none")
    for cfg, name in (("nosnap", "no snapshot"), ("snap", "snapshots running")):
        r = dd.get(cfg)
        if not r:
            continue
        rps = [x[0] for x in r]
        print(f"{name:<18} {med(rps):>8.0f} ops/s [{spread(rps)}] p50 {med([x[1] for x in r]):.3f} ms "
              f"p99 {med([x[2] for x in r]):.3f} ms; snapshots finished during the runs: "
              f"{', '.join(x[4] for x in r)} ms")
    if dd.get("snap") and dd.get("nosnap"):
        print(f"ratio snapshots/no snapshot: {med([x[0] for x in dd['snap']]) / med([x[0] for x in dd['nosnap']]):.2f}")
EOF
if [ -s "$work/hangs.log" ]; then
	echo "note: $(wc -l <"$work/hangs.log") shardkv bench process(es) hung in shardkv_close() after writing their report and were killed; their results count"
fi
