#!/usr/bin/env bash
# bench/migration-under-load.sh - move a 1,000,000-key range between two
# servers of a 3-node cluster while clients keep reading and writing it.
#
#   bench/migration-under-load.sh [-r RUNS] [-K KEYS] [-O KEYS] [-d BYTES]
#                                 [-R OPS] [-T THREADS] [-B SECS] [-A SECS]
#                                 [-M SECS] [-m MB/s] [-f MODE] [-x ARGS]
#                                 [-o PREFIX] [-n KEYS] [-p FILE.svg]
#                                 [-C COMMAND] [-b BIN_DIR] [-k]
#
#   -r RUNS     measured moves (default 3); the table shows medians and the
#               run-to-run range
#   -K KEYS     keys of the moving range (default 1000000): 8-byte keys
#               "00000000".."00999999" (`shardkv bench --key-size 8`, digits
#               only), all in the range ["", "key:")
#   -O KEYS     keys of the other ranges (default 1000000): 16-byte keys
#               "key:000000000000".., split in two ranges on nodes 2 and 3
#   -d BYTES    value size (default 100)
#   -R OPS      open-loop rate of each of the two benches, ops/s (default 2000)
#   -T THREADS  workers (and connections) of each bench (default 16)
#   -B SECS     load before the move (default 10)
#   -A SECS     load after the move at least (default 10)
#   -M SECS     longest move the benches make room for (default 20): each
#               bench runs B + M + A seconds
#   -m MB/s     `shardkv move --rate` (default 0: no limit, the servers'
#               default)
#   -f MODE     the servers' --fsync (default batch, their default)
#   -x ARGS     more shardkv-server arguments, split on spaces (e.g.
#               "--snapshot-bytes 1099511627776")
#   -o PREFIX   aim the other ranges' bench at keys PREFIX + digits only
#               (`shardkv bench --key-prefix`, 16-byte keys), e.g.
#               "key:0000005" for 100,000 keys of node 3, which takes no
#               part in the move (default "key:": every other key)
#   -n KEYS     with -o, the other bench's key count (default -O)
#   -p FILE.svg where to copy the moving-range bench's --plot of the last
#               run; FILE-other.svg gets the other ranges' (default: none)
#   -C COMMAND  a control: in place of each measured move, run COMMAND
#               (bash -c, in the work directory) and measure it as a move;
#               nothing moves. shardkv-cpu-control (bench/cpu_control.c)
#               makes loads with no shardkv code in them, e.g. -C
#               "$PWD/build-release/bin/shardkv-cpu-control copy --bytes
#               108000000 --rate 265": the bare copy of the range's bytes
#               from one process to another and into a synced file, at a
#               move's rate (bench/README.md)
#   -b BIN_DIR  where shardkv, shardkv-server and shardkv-controller are
#               (default $SHARDKV_BIN_DIR, build-release/bin, build/bin)
#   -k          keep the work directory (logs, JSON reports, plots)
#
# Layout: a controller and three servers on free loopback ports. Before any
# data, the ranges are placed with `shardkv move`: ["", "key:") on node 1,
# ["key:", "key:000000500000") on node 2 (500,000 of the other keys with the
# default -O), the rest on node 3. Then both key sets are loaded with
# `shardkv bench --load`. Each run starts two open-loop benches (--mix
# get:90,put:10 --rate OPS, --out with the per-second series, --plot): one on
# the moving range's keys, one on the other keys. After B seconds it runs
# `shardkv move "" key: 2 --wait` (node 1 to node 2), and the benches go on
# for the rest of their time. Between runs the range goes back to node 1
# without load (not measured) and the script waits until node 2 has deleted
# its copy, so every run moves node 1 -> node 2 from the same state.
#
# Reported per run, then as medians: the --wait time and the range's bytes
# (from `shardkv status` before the move) as MB/s and keys/s; the source's
# log times (migration started, fenced ... fence_us=, committed ... ms=,
# moved range deleted); errors; and from each bench's series the largest
# per-second max latency and p99 in the seconds that overlap the move,
# against the median per-second p99 before and after it; and the p99 of
# every call pooled over the seconds before the move, over the move's, and
# from the move's start to the end of the source's delete of the moved
# range (from the series' per-second latency buckets).
#
# Every command is bounded by `timeout`; everything started is stopped on
# exit, also on failure or Ctrl-C. Run it at `nice -n -15` on a shared machine.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
runs=3 mkeys=1000000 okeys=1000000 vsize=100 rate=2000 threads=16 before=10 after=10 allow=20
move_rate=0 fsync=batch xargs='' plot='' bin=${SHARDKV_BIN_DIR:-} keep=
oprefix=key: onkeys= control=
step_timeout=${MIGRATION_STEP_TIMEOUT:-600}

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
die() { echo "migration-under-load: $*" >&2; exit 1; }
say() { echo "migration-under-load: $*" >&2; }

while getopts "r:K:O:d:R:T:B:A:M:m:f:x:o:n:p:C:b:kh" o; do
	case "$o" in
	r) runs=$OPTARG ;;
	K) mkeys=$OPTARG ;;
	O) okeys=$OPTARG ;;
	d) vsize=$OPTARG ;;
	R) rate=$OPTARG ;;
	T) threads=$OPTARG ;;
	B) before=$OPTARG ;;
	A) after=$OPTARG ;;
	M) allow=$OPTARG ;;
	m) move_rate=$OPTARG ;;
	f) fsync=$OPTARG ;;
	x) xargs=$OPTARG ;;
	o) oprefix=$OPTARG ;;
	n) onkeys=$OPTARG ;;
	p) plot=$OPTARG ;;
	C) control=$OPTARG ;;
	b) bin=$OPTARG ;;
	k) keep=1 ;;
	*) usage ;;
	esac
done
onkeys=${onkeys:-$okeys}
for v in "$runs" "$mkeys" "$okeys" "$vsize" "$rate" "$threads" "$before" "$after" "$allow" "$move_rate" "$onkeys"; do
	[[ $v =~ ^[0-9]+$ ]] || die "numbers expected, got '$v'"
done
if [ "$runs" -lt 1 ] || [ "$mkeys" -lt 1 ] || [ "$okeys" -lt 2 ] || [ "$vsize" -lt 1 ] ||
	[ "$rate" -lt 1 ] || [ "$threads" -lt 1 ] || [ "$before" -lt 2 ] || [ "$after" -lt 2 ]; then
	die "-r, -K, -R, -T and -d must be positive, -O at least 2, -B and -A at least 2"
fi
[ "$mkeys" -le 99999999 ] || die "-K is at most 99999999 (8-digit keys)"
[ "$okeys" -le 999999999999 ] || die "-O is at most 999999999999"
case "$oprefix" in key:*) ;; *) die "-o must start with key: (the other ranges' keys)" ;; esac
[ ${#oprefix} -lt 16 ] || die "-o leaves no digits of a 16-byte key"
[ "$onkeys" -ge 1 ] || die "-n must be positive"
case "$fsync" in always | batch | none) ;; *) die "-f takes always, batch or none" ;; esac
if [ -n "$plot" ]; then
	case "$plot" in *.svg) ;; *) die "-p wants a FILE.svg" ;; esac
	[ -d "$(dirname "$plot")" ] || die "-p: no directory $(dirname "$plot")"
	plot=$(cd "$(dirname "$plot")" && pwd)/$(basename "$plot")
fi

command -v python3 >/dev/null || die "python3 is needed for the report"

# --- processes -----------------------------------------------------------------
work=$(mktemp -d "${TMPDIR:-/tmp}/shardkv-migration-XXXXXX")
pids=() benches=()

. "$here/bench/lib.sh"
find_bin

cli() { timeout "$step_timeout" "$bin/shardkv" -c "$ctl" --timeout 5000 "$@"; }

shardkv_active() { # N: the configuration has N active nodes
	cli config --json |
		python3 -c 'import json,sys; c=json.load(sys.stdin); sys.exit(0 if sum(n["state"]=="active" for n in c["nodes"])==int(sys.argv[1]) else 1)' "$1"
}

# Prints the field F ("keys", "bytes") of node N in the status.
node_stat() { # N F
	cli status --json | python3 -c 'import json,sys; c=json.load(sys.stdin); print(next(n.get(sys.argv[2], 0) for n in c["nodes"] if n["id"]==int(sys.argv[1])))' "$1" "$2"
}

no_migrations() {
	cli status --json | python3 -c 'import json,sys; c=json.load(sys.stdin); sys.exit(0 if not c.get("migrations") else 1)'
}

node_keys_le() { # N MAX: node N reports at most MAX keys
	[ "$(node_stat "$1" keys)" -le "$2" ]
}

node_keys_ge() { # N MIN
	[ "$(node_stat "$1" keys)" -ge "$2" ]
}

# Runs `shardkv -c CTL ARGS...` (a bench writing --out OUT) in the background;
# sets bpid. bench_wait then waits for it at most $step_timeout seconds. The
# CLI sometimes hangs in shardkv_close() after it has written its report
# (nng_close() never returns; see README "Durability figures"): 15 s after
# OUT is complete JSON it is killed, noted in hangs.log, and the run counts.
bench_start() { # OUT ERR ARGS...
	local out=$1 err=$2
	shift 2
	rm -f "$out"
	"$bin/shardkv" -c "$ctl" "$@" >/dev/null 2>"$err" &
	bpid=$!
	benches+=("$bpid") # stopped with the rest if the script ends early (bench/lib.sh)
}

bench_forget() { # PID: it has ended
	local b left=()
	for b in "${benches[@]+"${benches[@]}"}"; do [ "$b" = "$1" ] || left+=("$b"); done
	benches=("${left[@]+"${left[@]}"}")
}

bench_wait() { # PID OUT ERR
	local p=$1 out=$2 err=$3 deadline=$((SECONDS + step_timeout)) done_at='' rc=0
	while kill -0 "$p" 2>/dev/null; do
		if [ -z "$done_at" ] && [ -s "$out" ] &&
			python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$out" 2>/dev/null; then
			done_at=$SECONDS
		fi
		if [ -n "$done_at" ] && [ $((SECONDS - done_at)) -ge 15 ]; then
			echo "$(date -u +%FT%TZ) bench writing $out hung at exit" >>"$work/hangs.log"
			say "shardkv bench hung at exit after writing its report; killed (see $work/hangs.log)"
			kill -KILL "$p" 2>/dev/null || true
			{ wait "$p"; } 2>/dev/null || true
			bench_forget "$p"
			return 0
		fi
		if [ $SECONDS -ge $deadline ]; then
			kill -KILL "$p" 2>/dev/null || true
			{ wait "$p"; } 2>/dev/null || true
			bench_forget "$p"
			die "shardkv bench did not finish in ${step_timeout}s (see $err)"
		fi
		sleep 0.2
	done
	{ wait "$p"; } 2>/dev/null || rc=$?
	bench_forget "$p"
	[ "$rc" = 0 ] || die "shardkv bench failed (exit $rc): $(tail -n 3 "$err")"
}

# Writes "TID PID COMM TICKS ROLE" for every thread of the daemons started
# here and of the processes given as PID=ROLE (utime + stime in clock
# ticks; a line "PPID PID PROCESS TICKS ROLE" per process, which also
# counts its threads that have exited), then "time NOW". Bash builtins
# only: no process is started next to the move.
cpu_snap() { # FILE [PID=ROLE...]
	local out=$1 p t role i comm list=() f=()
	shift
	for i in "${!pids[@]}"; do list+=("${pids[i]}=${roles[i]:-?}"); done
	list+=("$@")
	{
		for i in "${list[@]}"; do
			p=${i%%=*} role=${i#*=}
			read -r -a f <"/proc/$p/stat" 2>/dev/null || continue
			echo "P$p $p PROCESS $((f[13] + f[14])) $role"
			for t in /proc/"$p"/task/*; do
				read -r comm <"$t/comm" 2>/dev/null || continue
				read -r -a f <"$t/stat" 2>/dev/null || continue
				# comm in stat is one word here (no thread name has a space)
				echo "${t##*/} $p ${comm// /_} $((f[13] + f[14])) $role"
			done
		done
		echo "time ${EPOCHREALTIME/,/.}"
	} >"$out" 2>/dev/null || true
}
roles=()

# --- cluster -------------------------------------------------------------------------
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
say "work dir $work; starting a controller and 3 servers (--fsync $fsync${xargs:+ $xargs})"
port=$(free_port)
ctl="tcp://127.0.0.1:$port"
one_copy_flags "$bin/shardkv-controller" # with replicas a move copies nothing: measure migrations
"$bin/shardkv-controller" --listen "$ctl" --data-dir "$work/ctl" ${one_copy[@]+"${one_copy[@]}"} >/dev/null 2>"$work/ctl.log" &
pids+=($!)
roles+=(controller)
wait_for 30 cli config || die "controller did not start (see $work/ctl.log)"
addr=()
for i in 1 2 3; do
	a="tcp://127.0.0.1:$(free_port)"
	# shellcheck disable=SC2086 # -x ARGS is split on purpose
	"$bin/shardkv-server" --listen "$a" --controller "$ctl" --data-dir "$work/s$i" --join \
		--fsync "$fsync" $xargs >/dev/null 2>"$work/s$i.log" &
	pids+=($!)
	roles+=("node$i")
	: >"$work/$!.int"
	wait_for 30 shardkv_active "$i" || die "server $i did not become active (see $work/s$i.log)"
	addr[i]=$a
done
# Node ids by address (registration order makes them 1, 2, 3; check it).
for i in 1 2 3; do
	id=$(cli config --json | python3 -c 'import json,sys; c=json.load(sys.stdin); print(next(n["id"] for n in c["nodes"] if n["address"]==sys.argv[1]))' "${addr[i]}")
	[ "$id" = "$i" ] || die "server $i registered as node $id"
done

split=$(printf 'key:%012d' $((okeys / 2)))
say "placing [\"\", key:) on node 1, [key:, $split) on node 2, [$split, \"\") on node 3"
wait_for 60 no_migrations || die "the joins' migrations did not finish"
cli --timeout 60000 move "" "key:" 1 --wait >>"$work/setup.log" 2>&1 || die "setup move failed (see $work/setup.log)"
cli --timeout 60000 move "key:" "$split" 2 --wait >>"$work/setup.log" 2>&1 || die "setup move failed (see $work/setup.log)"
cli --timeout 60000 move "$split" "" 3 --wait >>"$work/setup.log" 2>&1 || die "setup move failed (see $work/setup.log)"
cli config >>"$work/setup.log"

say "loading $mkeys keys of 8 B and $okeys keys of 16 B, values of $vsize B"
bench_start "$work/load-moving.json" "$work/load-moving.err" --json bench --threads 8 --keys "$mkeys" \
	--key-size 8 --value-size "$vsize" --load --ops 0 --out "$work/load-moving.json"
bench_wait "$bpid" "$work/load-moving.json" "$work/load-moving.err"
bench_start "$work/load-other.json" "$work/load-other.err" --json bench --threads 8 --keys "$okeys" \
	--key-size 16 --value-size "$vsize" --load --ops 0 --out "$work/load-other.json"
bench_wait "$bpid" "$work/load-other.json" "$work/load-other.err"
wait_for 60 node_keys_ge 1 "$mkeys" || die "node 1 never reported $mkeys keys"
cli status >>"$work/setup.log"

# The readings of /proc for the CPU table (about 16 ms of CPU for some 200
# threads) are taken by a helper started here, long before any move, at
# SCHED_IDLE (nice 19 where that is refused): it runs on a CPU only while
# no other thread wants it, and gives the CPU up at once when one does. A
# reading taken by the script itself at the move's start and end, with its
# forks, took the CPUs from the benches in the very seconds measured.
mkfifo "$work/snap.req" "$work/snap.done"
(
	chrt -i -p 0 "$BASHPID" >/dev/null 2>&1 || renice -n 19 -p "$BASHPID" >/dev/null 2>&1 || true
	while read -r f a b; do
		cpu_snap "$f" "$a" "$b"
		echo ok
	done <"$work/snap.req" >"$work/snap.done"
) &
benches+=("$!") # stopped with the rest (bench/lib.sh)
exec {snap_w}>"$work/snap.req" {snap_r}<"$work/snap.done"
snap() { # FILE PID=ROLE PID=ROLE: the helper's reading, waited for (builtins only)
	echo "$1 $2 $3" >&"$snap_w"
	read -r _ <&"$snap_r"
}

# --- runs -------------------------------------------------------------------------------
results=$work/runs.tsv
: >"$results"
dur=$((before + allow + after))
mix=get:90,put:10

for ((run = 1; run <= runs; run++)); do
	say "run $run/$runs: two benches at $rate ops/s each for ${dur}s; move after ${before}s"
	rb=$(node_stat 1 bytes)
	rk=$(node_stat 1 keys)
	src_lines=$(wc -l <"$work/s1.log")
	dst_lines=$(wc -l <"$work/s2.log")
	ta=$(date +%s.%N)
	bench_start "$work/run$run-moving.json" "$work/run$run-moving.err" --json bench \
		--threads "$threads" --keys "$mkeys" --key-size 8 --value-size "$vsize" --mix "$mix" \
		--rate "$rate" --duration "$dur" --seed "$run" \
		--out "$work/run$run-moving.json" --plot "$work/run$run-moving.svg"
	pa=$bpid
	tb=$(date +%s.%N)
	bench_start "$work/run$run-other.json" "$work/run$run-other.err" --json bench \
		--threads "$threads" --keys "$onkeys" --key-prefix "$oprefix" --key-size 16 \
		--value-size "$vsize" --mix "$mix" \
		--rate "$rate" --duration "$dur" --seed "$run" \
		--out "$work/run$run-other.json" --plot "$work/run$run-other.svg"
	pb=$bpid
	sleep "$before"
	mv_args=(move "" "key:" 2 --wait)
	[ "$move_rate" -gt 0 ] && mv_args+=(--rate "$move_rate")
	# Nothing but the move's own command starts a process in the move's
	# seconds: the times are bash's, the readings of /proc the helper's.
	snap "$work/run$run-cpu0" "$pa=bench-moving" "$pb=bench-other"
	t0=${EPOCHREALTIME/,/.}
	if [ -n "$control" ]; then
		(cd "$work" && timeout "$step_timeout" bash -c "$control") >"$work/run$run-control.txt" 2>"$work/run$run-move.err" ||
			die "the control failed: $(cat "$work/run$run-move.err")"
		t1=${EPOCHREALTIME/,/.}
		echo '{}' >"$work/run$run-move.json"
	else
		cli --json --timeout $((step_timeout * 1000)) "${mv_args[@]}" >"$work/run$run-move.json" 2>"$work/run$run-move.err" ||
			die "shardkv move failed: $(cat "$work/run$run-move.err")"
		t1=${EPOCHREALTIME/,/.}
	fi
	snap "$work/run$run-cpu1" "$pa=bench-moving" "$pb=bench-other"
	bench_wait "$pa" "$work/run$run-moving.json" "$work/run$run-moving.err"
	bench_wait "$pb" "$work/run$run-other.json" "$work/run$run-other.err"
	tail -n +"$((src_lines + 1))" "$work/s1.log" >"$work/run$run-src.log"
	tail -n +"$((dst_lines + 1))" "$work/s2.log" >"$work/run$run-dst.log"
	printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$run" "$ta" "$tb" "$t0" "$t1" "$rb" "$rk" >>"$results"

	# Back to node 1, without load, and wait until both ends are clean.
	if [ "$run" -lt "$runs" ] && [ -z "$control" ]; then
		say "run $run/$runs: moving the range back to node 1 (not measured)"
		wait_for 120 node_keys_le 1 0 || die "node 1 kept the moved range"
		cli --timeout $((step_timeout * 1000)) move "" "key:" 1 --wait >>"$work/setup.log" 2>&1 ||
			die "move back failed (see $work/setup.log)"
		wait_for 120 node_keys_le 2 $((okeys - okeys / 2)) || die "node 2 kept the range after the move back"
		wait_for 60 node_keys_ge 1 "$mkeys" || die "node 1 never reported $mkeys keys again"
		sleep 2
	fi
done

if [ -n "$plot" ]; then
	cp "$work/run$runs-moving.svg" "$plot"
	cp "$work/run$runs-other.svg" "${plot%.svg}-other.svg"
	say "plots: $plot (moving range), ${plot%.svg}-other.svg (other ranges), run $runs"
fi

# --- report ---------------------------------------------------------------------------------
python3 - "$work" "$runs" "$mkeys" "$onkeys keys $oprefix..." "$vsize" "$rate" "$threads" "$fsync${xargs:+ $xargs}" "$move_rate" \
	"$(nproc) CPUs; load average $load_start at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end" "$control" <<'EOF'
import json, os, re, statistics as st, sys
from datetime import datetime, timezone
work, runs, mkeys, okeys, vsize, rate, threads, fsync, move_rate, cpus, control = sys.argv[1:]

def ts(line):
    t = line.split(" ", 1)[0]
    return datetime.strptime(t, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc).timestamp()

def first(lines, pat):
    for l in lines:
        m = re.search(pat, l)
        if m:
            return ts(l), m
    return None, None

def med(xs):
    xs = [x for x in xs if x is not None]
    return st.median(xs) if xs else float("nan")

def rng(xs, f="{:.1f}"):
    xs = [x for x in xs if x is not None]
    return f"{f.format(min(xs))}-{f.format(max(xs))}" if xs else "-"

def windows(path, launch, m0, m1):
    """Per-second points split by the move [m0, m1] (seconds since launch)."""
    d = json.load(open(path))
    pts = d["series"]
    b = [p for p in pts if launch + p["t"] <= m0]
    du = [p for p in pts if launch + p["t"] - p["dt"] < m1 and launch + p["t"] > m0]
    a = [p for p in pts if launch + p["t"] - p["dt"] >= m1]
    return d, b, du, a

def pts_until(d, launch, m0, m1):
    """Points that overlap [m0, m1] (seconds since the epoch)."""
    return [p for p in d["series"] if launch + p["t"] - p["dt"] < m1 and launch + p["t"] > m0]

def quiet(b, k):
    """The 'during' statistic without a move: the largest per-second p99 of
    k consecutive seconds before the move (its first second, the benches'
    start, left out), as the median over every such window."""
    xs = [p["p99_us"] for p in b[1:]]
    if k < 1 or len(xs) < k:
        return float("nan")
    return st.median(max(xs[i:i + k]) for i in range(len(xs) - k + 1)) / 1000

def pooled(pts, q=99):
    """The q-th percentile (ms) of every call of the points, from their
    per-second buckets ("hist": [[us, n], ...], at most 1% wide); None
    without them (an older shardkv bench)."""
    bs, n = [], 0
    for p in pts:
        if "hist" not in p:
            return None
        bs += p["hist"]
        n += sum(c for _, c in p["hist"])
    if n == 0:
        return None
    rank, seen = -(-q * n // 100), 0
    for us, c in sorted(bs):
        seen += c
        if seen >= rank:
            return us / 1000
    return bs[-1][0] / 1000

def cpu(path):
    """{tid: (pid, comm, ticks, role)} from cpu_snap's file."""
    out = {}
    try:
        for l in open(path):
            x = l.split()
            if len(x) == 5:
                out[x[0]] = (x[1], x[2], int(x[3]), x[4])
            elif len(x) == 2 and x[0] == "time":
                out["time"] = float(x[1])
    except OSError:
        pass
    return out

def cpu_window(run):
    """CPU ms over the move by role (the process, its threads alive at the end)."""
    a, b = cpu(f"{work}/run{run}-cpu0"), cpu(f"{work}/run{run}-cpu1")
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    procs, threads = {}, {}
    span = (b.pop("time", 0) - a.pop("time", 0)) * 1000
    for tid, (pid, comm, t, role) in b.items():
        d = (t - a[tid][2]) * tick if tid in a else t * tick
        if comm == "PROCESS":
            procs[role] = procs.get(role, 0) + d
        else:
            threads[(role, comm)] = threads.get((role, comm), 0) + d
    return procs, threads, span

rows = []
for line in open(f"{work}/runs.tsv"):
    run, ta, tb, t0, t1, rb, rk = line.split()
    ta, tb, t0, t1, rb, rk = float(ta), float(tb), float(t0), float(t1), int(rb), int(rk)
    mv = json.load(open(f"{work}/run{run}-move.json"))
    wait_s = mv.get("wait_s", t1 - t0)
    src = open(f"{work}/run{run}-src.log").read().splitlines()
    dst = open(f"{work}/run{run}-dst.log").read().splitlines()
    s_start, _ = first(src, r" migration started ")
    c_start, _ = first(src, r" copy started ")
    f_t, fm = first(src, r" fenced .*fence_us=(\d+)")
    cm_t, cm = first(src, r" migration committed .*keys=(\d+) ms=(\d+)")
    del_t, _ = first(src, r" moved range deleted ")
    r = {"run": int(run), "wait_s": wait_s, "bytes": rb, "keys": rk,
         "mb_s": rb / 1e6 / wait_s if wait_s else None, "keys_s": rk / wait_s if wait_s else None,
         "fence_ms": int(fm.group(1)) / 1000 if fm else None,
         "copy_s": (f_t - c_start) if f_t and c_start else None,
         "commit_ms": int(cm.group(2)) if cm else None,
         "delete_s": (del_t - cm_t) if del_t and cm_t else None}
    for name, launch in (("moving", ta), ("other", tb)):
        d, b, du, a = windows(f"{work}/run{run}-{name}.json", launch, t0, t1)
        r[name] = {
            "errors": d["errors"], "errors_during": sum(p["errors"] for p in du),
            "kinds": d.get("errors_by_kind", {}),
            "max_during_ms": max((p["max_us"] for p in du), default=0) / 1000,
            "max_all_ms": d["latency_us"]["max"] / 1000,
            "p99_before": med([p["p99_us"] for p in b]) / 1000,
            "p99_during": max((p["p99_us"] for p in du), default=float("nan")) / 1000,
            "p99_after": med([p["p99_us"] for p in a]) / 1000,
            "max_before_ms": max((p["max_us"] for p in b), default=0) / 1000,
            "p99_quiet": quiet(b, len(du)),
            # every call of the window in one p99: before (first second
            # left out), the move's seconds, and the move's seconds through
            # the source's delete of the moved range
            "pp_before": pooled(b[1:]),
            "pp_during": pooled(du),
            "pp_delete": pooled(pts_until(d, launch, t0, del_t if del_t else t1)),
            "ops_s": d["ops_per_sec"], "npts": (len(b), len(du), len(a))}
    r["cpu"] = cpu_window(run)
    rows.append(r)

print(f"# moving [\"\", \"key:\") ({mkeys} keys of 8 B, values of {vsize} B) from node 1 to node 2 of a 3-node")
print(f"# loopback cluster ({cpus};")
print(f"# 3 servers, the controller and both benches share the CPUs), --fsync {fsync},")
print(f"# move --rate {move_rate or 'unlimited'}; two open-loop benches --mix get:90,put:10 --rate {rate} --threads {threads}:")
print(f"# 'moving' on the range's keys, 'other' on {okeys} (nodes 2 and 3 hold key:..). Per-second series: 'during' = the")
print(f"# seconds that overlap the move (max of per-second p99 and max), before/after = median of per-second p99.")
if control:
    print(f"# CONTROL: nothing moved; in each move's place ran: {control}")
    print(f"# ('wait s' is its time, 'MB/s' the range's bytes over it; the CPU table leaves its processes out):")
    for r in rows:
        out = open(f"{work}/run{r['run']}-control.txt").read().strip().replace("\n", "; ")
        print(f"#   run {r['run']}: {out}")
print()
print(f"{'run':>3} {'wait s':>7} {'MB':>7} {'MB/s':>7} {'keys/s':>9} {'copy s':>7} {'fence ms':>9} {'commit ms':>10} {'delete s':>9}")
for r in rows:
    def f(x, fmt):
        return fmt.format(x) if x is not None else "-"
    print(f"{r['run']:>3} {r['wait_s']:>7.3f} {r['bytes']/1e6:>7.1f} {f(r['mb_s'], '{:.1f}'):>7} {f(r['keys_s'], '{:.0f}'):>9} "
          f"{f(r['copy_s'], '{:.3f}'):>7} {f(r['fence_ms'], '{:.3f}'):>9} {f(r['commit_ms'], '{}'):>10} {f(r['delete_s'], '{:.2f}'):>9}")
print(f"med {med([r['wait_s'] for r in rows]):>7.3f} {med([r['bytes']/1e6 for r in rows]):>7.1f} "
      f"{med([r['mb_s'] for r in rows]):>7.1f} {med([r['keys_s'] for r in rows]):>9.0f} {med([r['copy_s'] for r in rows]):>7.3f} "
      f"{med([r['fence_ms'] for r in rows]):>9.3f} {med([r['commit_ms'] for r in rows]):>10.0f} {med([r['delete_s'] for r in rows]):>9.2f}")
print(f"range: wait {rng([r['wait_s'] for r in rows], '{:.3f}')} s, MB/s {rng([r['mb_s'] for r in rows])}, "
      f"fence {rng([r['fence_ms'] for r in rows], '{:.3f}')} ms")
print()
print(f"{'bench':<7} {'run':>3} {'ops/s':>7} {'errors':>6} {'max during ms':>14} {'max before ms':>14} {'p99 before':>11} {'p99 during':>11} {'p99 quiet':>10} {'p99 after':>10} {'pts b/d/a':>10}")
for name in ("moving", "other"):
    for r in rows:
        x = r[name]
        print(f"{name:<7} {r['run']:>3} {x['ops_s']:>7.0f} {x['errors']:>6} {x['max_during_ms']:>14.2f} {x['max_before_ms']:>14.2f} "
              f"{x['p99_before']:>11.3f} {x['p99_during']:>11.3f} {x['p99_quiet']:>10.3f} {x['p99_after']:>10.3f} {'/'.join(map(str, x['npts'])):>10}"
              + (f"  {x['kinds']}" if x['kinds'] else ""))
    xs = [r[name] for r in rows]
    print(f"{name:<7} {'med':>3} {med([x['ops_s'] for x in xs]):>7.0f} {sum(x['errors'] for x in xs):>6} "
          f"{med([x['max_during_ms'] for x in xs]):>14.2f} {med([x['max_before_ms'] for x in xs]):>14.2f} "
          f"{med([x['p99_before'] for x in xs]):>11.3f} {med([x['p99_during'] for x in xs]):>11.3f} "
          f"{med([x['p99_quiet'] for x in xs]):>10.3f} {med([x['p99_after'] for x in xs]):>10.3f}")
print()
print("p99 of every call in a window, pooled from the per-second buckets (ms): 'before' = the seconds before the")
print("move (the first left out), 'move' = the move's seconds, 'to delete' = from the move's start to the end of the")
print("source's delete of the moved range:")
print(f"{'bench':<7} {'run':>3} {'before':>8} {'move':>8} {'vs before':>10} {'to delete':>10} {'vs before':>10}")
def pct(a, b):
    return f"{(a / b - 1) * 100:+.0f}%" if a is not None and b else "-"
def fm(x):
    return f"{x:.3f}" if x is not None else "-"
for name in ("moving", "other"):
    for r in rows:
        x = r[name]
        print(f"{name:<7} {r['run']:>3} {fm(x['pp_before']):>8} {fm(x['pp_during']):>8} {pct(x['pp_during'], x['pp_before']):>10} "
              f"{fm(x['pp_delete']):>10} {pct(x['pp_delete'], x['pp_before']):>10}")
    xs = [r[name] for r in rows]
    pb, pd, pe = (med([x[k] for x in xs]) for k in ("pp_before", "pp_during", "pp_delete"))
    print(f"{name:<7} {'med':>3} {pb:>8.3f} {pd:>8.3f} {pct(pd, pb):>10} {pe:>10.3f} {pct(pe, pb):>10}")
print()
print("('p99 quiet': the 'during' statistic over the same number of seconds before the move, as the median")
print(" over every such window: what the largest of that many quiet seconds' p99 is without a move)")
print()
print("CPU over the move, ms (utime + stime from /proc, between the move's start and its --wait's end;")
print("'CPUs': the sum over the window's length, in CPUs busy with these processes):")
roles = sorted({k for r in rows for k in r["cpu"][0]})
print(f"{'run':>3} {'window ms':>9} " + " ".join(f"{k:>13}" for k in roles) + f" {'sum':>7} {'CPUs':>5}")
for r in rows:
    procs, span = r["cpu"][0], r["cpu"][2]
    tot = sum(procs.values())
    print(f"{r['run']:>3} {span:>9.0f} " + " ".join(f"{procs.get(k, 0):>13.0f}" for k in roles)
          + f" {tot:>7.0f} {tot / span if span > 0 else float('nan'):>5.2f}")
top = {}
for r in rows:
    for k, v in r["cpu"][1].items():
        top[k] = top.get(k, 0) + v / len(rows)
print("threads alive at the end, mean ms per run: " + ", ".join(
    f"{role} {comm} {v:.0f}" for (role, comm), v in sorted(top.items(), key=lambda kv: -kv[1])[:10]))
print()
mx = max(max(r["moving"]["max_during_ms"], r["other"]["max_during_ms"]) for r in rows)
errs = sum(r["moving"]["errors"] + r["other"]["errors"] for r in rows)
ob = med([r["other"]["p99_before"] for r in rows])
od = med([r["other"]["p99_during"] for r in rows])
mbs = med([r["mb_s"] for r in rows])
print("targets:" if not control else "targets (CONTROL: no move was made; the figures are the control's):")
print(f"  longest wait < 50 ms: {mx:.1f} ms (largest per-second max in the move's seconds, both benches, all runs): "
      f"{'met' if mx < 50 else 'missed'}")
print(f"  0 errors: {errs}: {'met' if errs == 0 else 'missed'}")
print(f"  other ranges' p99 within 20% of no migration: {od:.3f} ms during vs {ob:.3f} ms before "
      f"({(od / ob - 1) * 100:+.0f}%): {'met' if od <= 1.2 * ob else 'missed'}")
oq = med([r["other"]["p99_quiet"] for r in rows])
print(f"    the same statistic over quiet seconds (p99 quiet): {oq:.3f} ms; during against it {(od / oq - 1) * 100:+.0f}%")
opb = med([r["other"]["pp_before"] for r in rows])
opd = med([r["other"]["pp_during"] for r in rows])
ope = med([r["other"]["pp_delete"] for r in rows])
print(f"    every call's p99, pooled: {opd:.3f} ms over the move, {ope:.3f} ms through the delete, vs {opb:.3f} ms "
      f"before ({(opd / opb - 1) * 100:+.0f}%, {(ope / opb - 1) * 100:+.0f}%): "
      f"{'met' if max(opd, ope) <= 1.2 * opb else 'missed'}")
print(f"  migration > 100 MB/s: {mbs:.1f} MB/s ({med([r['keys_s'] for r in rows]):.0f} keys/s; Redis Cluster ~13k keys/s): "
      f"{'met' if mbs > 100 else 'missed'}")
EOF
if [ -s "$work/hangs.log" ]; then
	echo "note: $(wc -l <"$work/hangs.log") shardkv bench process(es) hung in shardkv_close() after writing their report and were killed; their results count"
fi
