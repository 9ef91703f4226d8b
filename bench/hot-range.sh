#!/usr/bin/env bash
# bench/hot-range.sh - a zipf load aimed at one range, with the automatic
# balancer on and off (doc/scheduler.md): how long until the hot range is
# cut and its halves are led by different nodes, and the throughput.
#
#   bench/hot-range.sh [-r RUNS] [-m MODES] [-K KEYS] [-D SECS] [-T THREADS]
#                      [-d BYTES] [-z THETA] [-R REPLICAS] [-b BIN_DIR] [-k]
#
#   -r RUNS     runs per mode (default 3), the modes alternating; the summary
#               shows medians
#   -m MODES    "on off" (default), "on" or "off": the controller's
#               --auto-balance
#   -K KEYS     hot keys (default 10000): "hot:" and zero-padded digits
#               (`shardkv bench --key-prefix hot: --key-size 16`); no other
#               key is written, so they all lie in one range at the start
#   -D SECS     the zipf bench's duration (default 60)
#   -T THREADS  its workers (default 8)
#   -d BYTES    value size (default 100)
#   -z THETA    zipf exponent (default 0.99)
#   -R REPLICAS the controller's --replicas (default 1: the halves move as
#               migrations; with 3 on 3 nodes, as primary transfers)
#   -b BIN_DIR  where shardkv, shardkv-server and shardkv-controller are
#               (default $SHARDKV_BIN_DIR, build-release/bin, build/bin)
#   -k          keep the work directory (logs, JSON reports)
#
# Each run starts a new controller and three servers on free loopback ports
# (joined with --join; with the balancer on the cluster is one range on
# node 1, off the joins cut the empty key space by width and the hot keys
# fall in one of the three ranges), loads the KEYS hot keys (`bench
# --load`), then runs `shardkv bench --dist zipf:THETA --mix get:90,put:10`
# on them for SECS seconds. Meanwhile it reads the configuration every
# 0.5 s: "split" is the time from the bench's start until the ranges
# overlapping ["hot:", "hot;") are led by at least two nodes. Reported per
# run: split time (or "-": never), ops/s over the whole run, ops/s from 30 s
# on (after the issue's deadline), the nodes leading the hot keys at the end
# and the balancer's decisions; then the medians per mode.
#
# Every command is bounded by `timeout`; everything started is stopped at
# the end of each run and on exit, also on failure or Ctrl-C.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
runs=3 modes="on off" keys=10000 dur=60 threads=8 vsize=100 theta=0.99 replicas=1
bin=${SHARDKV_BIN_DIR:-} keep=

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
die() { echo "hot-range: $*" >&2; exit 1; }
say() { echo "hot-range: $*" >&2; }

while getopts "r:m:K:D:T:d:z:R:b:kh" o; do
	case "$o" in
	r) runs=$OPTARG ;;
	m) modes=$OPTARG ;;
	K) keys=$OPTARG ;;
	D) dur=$OPTARG ;;
	T) threads=$OPTARG ;;
	d) vsize=$OPTARG ;;
	z) theta=$OPTARG ;;
	R) replicas=$OPTARG ;;
	b) bin=$OPTARG ;;
	k) keep=1 ;;
	*) usage ;;
	esac
done
for v in "$runs" "$keys" "$dur" "$threads" "$vsize" "$replicas"; do
	[[ $v =~ ^[0-9]+$ ]] && [ "$v" -ge 1 ] || die "positive numbers expected, got '$v'"
done
[ "$keys" -le 999999999999 ] || die "-K is at most 999999999999 (16-byte keys)"
[[ $theta =~ ^0\.[0-9]+$ ]] || die "-z takes a number between 0 and 1, got '$theta'"
for m in $modes; do case "$m" in on | off) ;; *) die "-m takes on and/or off, got '$m'" ;; esac; done

command -v python3 >/dev/null || die "python3 is needed for the report"

work=$(mktemp -d "${TMPDIR:-/tmp}/shardkv-hotrange-XXXXXX")
pids=()
. "$here/bench/lib.sh"
find_bin

ctl=
cli() { timeout 60 "$bin/shardkv" -c "$ctl" --timeout 5000 "$@"; }

active_nodes() { # N: the configuration has N active nodes
	cli config --json |
		python3 -c 'import json,sys; c=json.load(sys.stdin); sys.exit(0 if sum(n["state"]=="active" for n in c["nodes"])==int(sys.argv[1]) else 1)' "$1"
}

no_migrations() {
	cli config --json | python3 -c 'import json,sys; c=json.load(sys.stdin); sys.exit(0 if not c.get("migrations") else 1)'
}

# Prints the ids of the nodes leading a range that overlaps ["hot:", "hot;").
hot_leaders() {
	cli config --json | python3 -c '
import json, sys
c = json.load(sys.stdin)
lo, hi = "hot:", "hot;"
ids = sorted({r["node"] for r in c["ranges"]
              if (r["end"] == "" or r["end"] > lo) and r["start"] < hi})
print(",".join(str(i) for i in ids))'
}

results=$work/runs.tsv
: >"$results"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)

# Runs alternate between the modes, so that a machine whose load drifts
# weighs on both alike.
for ((run = 1; run <= runs; run++)); do
	for mode in $modes; do
		rw=$work/$mode-$run
		mkdir -p "$rw"
		say "$mode run $run/$runs: controller --auto-balance $mode --replicas $replicas, 3 servers"
		port=$(free_port)
		ctl="tcp://127.0.0.1:$port"
		"$bin/shardkv-controller" --listen "$ctl" --data-dir "$rw/ctl" --auto-balance "$mode" \
			--replicas "$replicas" >/dev/null 2>"$rw/ctl.log" &
		pids+=($!)
		wait_for 30 cli config || die "controller did not start (see $rw/ctl.log)"
		for i in 1 2 3; do
			a="tcp://127.0.0.1:$(free_port)"
			"$bin/shardkv-server" --listen "$a" --controller "$ctl" --data-dir "$rw/s$i" \
				--join >/dev/null 2>"$rw/s$i.log" &
			pids+=($!)
			: >"$work/$!.int"
			wait_for 30 active_nodes "$i" || die "server $i did not become active (see $rw/s$i.log)"
		done
		wait_for 60 no_migrations || die "the joins' migrations did not finish"
		cli config >"$rw/config-start.txt"
		timeout 300 "$bin/shardkv" -c "$ctl" bench --keys "$keys" --key-prefix hot: \
			--key-size 16 --value-size "$vsize" --threads 4 --batch 500 --load --ops 0 \
			>"$rw/load.txt" 2>&1 || die "the load failed (see $rw/load.txt)"
		start=$(hot_leaders)
		t0=$(date +%s.%N)
		timeout $((dur + 120)) "$bin/shardkv" -c "$ctl" --json bench --keys "$keys" \
			--key-prefix hot: --key-size 16 --value-size "$vsize" --threads "$threads" \
			--dist "zipf:$theta" --mix get:90,put:10 --duration "$dur" \
			--out "$rw/bench.json" >/dev/null 2>"$rw/bench.err" &
		bpid=$!
		pids+=("$bpid") # stopped with the rest if the script is interrupted
		split=-
		while kill -0 "$bpid" 2>/dev/null; do
			if [ "$split" = - ]; then
				now=$(hot_leaders 2>/dev/null || true)
				if [[ $now == *,* ]]; then
					split=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
					say "$mode run $run: hot keys led by nodes $now after ${split}s"
				fi
			fi
			sleep 0.5
		done
		rc=0
		wait "$bpid" || rc=$?
		unset 'pids[-1]' # the bench, started last
		[ "$rc" = 0 ] || die "shardkv bench failed (exit $rc): $(tail -n 3 "$rw/bench.err")"
		end=$(hot_leaders)
		cli status --json >"$rw/status.json"
		python3 - "$rw/bench.json" "$rw/status.json" "$mode" "$run" "$split" "$start" "$end" \
			>>"$results" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
st = json.load(open(sys.argv[2]))
mode, run, split, start, end = sys.argv[3:8]
late = [p for p in b.get("series", []) if p.get("t", 0) > 30]
late_ops = sum(p.get("ops", 0) for p in late)
late_s = sum(p.get("dt", 0) for p in late)
dec = len([d for d in st.get("balancer", []) if d.get("kind") != "hot_key"])
print("\t".join([mode, run, split, "%.0f" % b["ops_per_sec"],
                 "%.0f" % (late_ops / late_s if late_s else 0), str(b.get("errors", 0)),
                 start, end, str(dec)]))
PY
		stop_all
	done
done

say "load average at start $load_start, at end $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$results" <<'PY'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print("mode run split_s ops/s ops/s_after_30s errors leaders_start leaders_end decisions")
for r in rows:
    print(" ".join(r))
for mode in ("on", "off"):
    rs = [r for r in rows if r[0] == mode]
    if not rs:
        continue
    sp = [float(r[2]) for r in rs if r[2] != "-"]
    print("%s: median split %s s (%d of %d runs split), median ops/s %.0f, after 30 s %.0f"
          % (mode, "%.1f" % statistics.median(sp) if sp else "-", len(sp), len(rs),
             statistics.median(float(r[3]) for r in rs),
             statistics.median(float(r[4]) for r in rs)))
PY
