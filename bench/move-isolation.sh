#!/usr/bin/env bash
# bench/move-isolation.sh - what repeated moves cost one node's requests,
# with that node (and its bench) on a CPU of its own or sharing both.
#
#   bench/move-isolation.sh [-r ROUNDS] [-m "none data big"] [-n NODE] [-P]
#                           [-R MB/s] [-D SECS] [-b BIN_DIR] [-k]
#
#   -r ROUNDS  rounds; each runs every mode once, in turn (default 3)
#   -m MODES   what happens every ~2.6 s during a bench (default "none data"):
#              none  `shardkv config` (a CLI process, nothing moves)
#              data  ["", "00020000") (20,000 keys, 2.2 MB) moves between
#                    nodes 1 and 2, in turn
#              big   ["", "key:") (1,000,000 keys, 108 MB) moves between
#                    nodes 1 and 2, in turn
#   -n NODE    the node whose requests are measured: 3 (default; takes no
#              part in any move) or 2 (source or destination of every move)
#   -P         pin: NODE's server and the bench on CPU 1, the other servers,
#              the controller and the moves' CLI on CPU 0 (taskset); as if
#              NODE had a machine (of one core) to itself
#   -R MB/s    pace the moves' copy (`move --rate`; default: not paced)
#   -D SECS    each bench's length (default 40; moves from 5 s to SECS - 4 s)
#   -b BIN_DIR where shardkv, shardkv-server and shardkv-controller are
#   -k         keep the work directory (logs, every bench's --out report)
#
# Layout: a controller (--replicas 1 --auto-balance off) and three servers
# (--fsync batch) on free loopback ports; ["", "key:") on node 1 with
# 1,000,000 keys of 8 bytes and 100-byte values, ["key:",
# "key:000000200000") on node 2 and the rest on node 3, with 300,000 keys of
# 16 bytes. Each run: an open-loop bench (2,000 ops/s, 16 threads, get:90,
# put:10) on 100,000 of NODE's keys, and the mode's action every ~2.6 s;
# after it, the moved keys go back to node 1 (not measured).
#
# Reported per run, from the bench's per-second series: the median p99 of
# the seconds that overlap an action (from 50 ms before its start to 300 ms
# after its end: "hit") and of the other seconds ("quiet"), the p99 of every
# call pooled over each set (from the per-second buckets), and each set's
# largest per-second max; then the medians per mode. The first second and
# the last three are left out. Everything started is stopped on exit.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
rounds=3 modes="none data" node=3 pin='' dur=40 bin=${SHARDKV_BIN_DIR:-} keep= rate=

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0" >&2; exit 2; }
die() { echo "move-isolation: $*" >&2; exit 1; }
say() { echo "move-isolation: $*" >&2; }

while getopts "r:m:n:PR:D:b:kh" o; do
	case "$o" in
	r) rounds=$OPTARG ;;
	m) modes=$OPTARG ;;
	n) node=$OPTARG ;;
	P) pin=1 ;;
	R) rate=$OPTARG ;;
	D) dur=$OPTARG ;;
	b) bin=$OPTARG ;;
	k) keep=1 ;;
	*) usage ;;
	esac
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "-r wants a positive number"
[ -z "$rate" ] || [[ $rate =~ ^[1-9][0-9]*$ ]] || die "-R wants a positive number of MB/s"
paced=(${rate:+--rate "$rate"})
if ! [[ $dur =~ ^[0-9]+$ ]] || [ "$dur" -lt 15 ]; then die "-D wants at least 15"; fi
case "$node" in 2 | 3) ;; *) die "-n takes 2 or 3" ;; esac
for m in $modes; do case "$m" in none | data | big) ;; *) die "unknown mode '$m'" ;; esac; done
[ -n "$modes" ] || die "-m names no mode"
command -v python3 >/dev/null || die "python3 is needed for the report"
[ -z "$pin" ] || command -v taskset >/dev/null || die "-P needs taskset (util-linux)"
[ -z "$pin" ] || [ "$(nproc)" -ge 2 ] || die "-P needs two CPUs"

work=$(mktemp -d "${TMPDIR:-/tmp}/shardkv-isolation-XXXXXX")
pids=()
. "$here/bench/lib.sh"
find_bin

cli() { timeout 120 "$bin/shardkv" -c "$ctl" "$@"; }
no_migrations() {
	cli status --json | python3 -c 'import json,sys; c=json.load(sys.stdin); sys.exit(0 if not c.get("migrations") else 1)'
}
active() {
	cli config --json 2>/dev/null |
		python3 -c 'import json,sys; c=json.load(sys.stdin); sys.exit(0 if sum(n["state"]=="active" for n in c["nodes"])==int(sys.argv[1]) else 1)' "$1"
}

say "work dir $work"
ctl="tcp://127.0.0.1:$(free_port)"
one_copy_flags "$bin/shardkv-controller"
"$bin/shardkv-controller" --listen "$ctl" --data-dir "$work/ctl" ${one_copy[@]+"${one_copy[@]}"} >/dev/null 2>"$work/ctl.log" &
pids+=($!)
wait_for 30 cli config || die "controller did not start (see $work/ctl.log)"
spid=()
for i in 1 2 3; do
	"$bin/shardkv-server" --listen "tcp://127.0.0.1:$(free_port)" --controller "$ctl" \
		--data-dir "$work/s$i" --join >/dev/null 2>"$work/s$i.log" &
	pids+=($!)
	spid[i]=$!
	: >"$work/$!.int"
	wait_for 30 active "$i" || die "server $i did not become active (see $work/s$i.log)"
done
wait_for 60 no_migrations || die "the joins' migrations did not finish"
# A move to the node that owns a range already pins nothing: via node 2.
for m in "\"\" key: 2" "\"\" key: 1" "key: key:000000200000 2" "key:000000200000 \"\" 3"; do
	eval "cli --timeout 60000 move $m --wait" >>"$work/setup.log" 2>&1 || die "setup move failed (see $work/setup.log)"
done
cli bench --threads 8 --keys 1000000 --key-size 8 --value-size 100 --load --ops 0 >>"$work/setup.log" 2>&1 ||
	die "load failed (see $work/setup.log)"
cli bench --threads 8 --keys 300000 --key-size 16 --value-size 100 --load --ops 0 >>"$work/setup.log" 2>&1 ||
	die "load failed (see $work/setup.log)"
prefix=key:000000$((node - 1))
pin0=() pin1=()
if [ -n "$pin" ]; then
	for i in 1 2 3; do
		if [ "$i" = "$node" ]; then taskset -a -p -c 1 "${spid[i]}" >/dev/null; else taskset -a -p -c 0 "${spid[i]}" >/dev/null; fi
	done
	taskset -a -p -c 0 "${pids[0]}" >/dev/null
	pin0=(taskset -c 0) pin1=(taskset -c 1)
fi

for ((r = 1; r <= rounds; r++)); do
	for mode in $modes; do
		tag=$mode-$r
		say "round $r/$rounds: $mode"
		t0=$EPOCHREALTIME
		"${pin1[@]}" "$bin/shardkv" -c "$ctl" --json bench --threads 16 --keys 100000 --key-prefix "$prefix" \
			--key-size 16 --value-size 100 --mix get:90,put:10 --rate 2000 --duration "$dur" --seed "$r" \
			--out "$work/$tag.json" >/dev/null 2>"$work/$tag.err" &
		bp=$!
		: >"$work/$tag.actions"
		sleep 5
		to=2
		while kill -0 "$bp" 2>/dev/null && python3 -c "import sys,time; sys.exit(0 if time.time() - $t0 < $dur - 4 else 1)"; do
			s=$EPOCHREALTIME
			case $mode in
			none) "${pin0[@]}" "$bin/shardkv" -c "$ctl" config >/dev/null 2>&1 || true ;;
			data) "${pin0[@]}" "$bin/shardkv" -c "$ctl" --timeout 60000 move "" 00020000 "$to" "${paced[@]}" --wait >/dev/null 2>&1 || true ;;
			big) "${pin0[@]}" "$bin/shardkv" -c "$ctl" --timeout 60000 move "" key: "$to" "${paced[@]}" --wait >/dev/null 2>&1 || true ;;
			esac
			echo "$s $EPOCHREALTIME" >>"$work/$tag.actions"
			to=$((3 - to))
			sleep 2.5
		done
		wait "$bp" || die "the bench failed (see $work/$tag.err)"
		echo "$t0" >"$work/$tag.t0"
		cli --timeout 60000 move "" key: 1 --wait >/dev/null 2>&1 || die "the move back failed"
		wait_for 60 no_migrations || die "the move back did not finish"
	done
done

python3 - "$work" "$rounds" "$modes" "$node" "${pin:+pinned}" <<'EOF'
import json, os, statistics as st, sys
work, rounds, modes, node, pinned = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4], sys.argv[5]

def pooled(pts, q=99):
    bs, n = [], 0
    for p in pts:
        bs += p.get("hist", [])
        n += sum(c for _, c in p.get("hist", []))
    if n == 0:
        return float("nan")
    rank, seen = -(-q * n // 100), 0
    for us, c in sorted(bs):
        seen += c
        if seen >= rank:
            return us / 1000
    return bs[-1][0] / 1000

print(f"# node {node}'s requests (100,000 keys, 2,000 ops/s, get:90,put:10), "
      f"{'node ' + node + ' and its bench on CPU 1, the rest on CPU 0' if pinned else 'every process on both CPUs'}")
print("mode  round  actions  action ms  hit p99  quiet p99  change  pooled hit  pooled quiet  change  max hit  max quiet")
per = {}
for m in modes:
    for r in range(1, rounds + 1):
        tag = f"{m}-{r}"
        d = json.load(open(f"{work}/{tag}.json"))
        t0 = float(open(f"{work}/{tag}.t0").read())
        acts = [tuple(map(float, l.split())) for l in open(f"{work}/{tag}.actions")]
        dur = d["params"]["duration_s"]
        hit, quiet = [], []
        for p in d["series"][1:]:
            a, b = t0 + p["t"] - p["dt"], t0 + p["t"]
            if p["t"] > dur - 3:
                continue
            (hit if any(a < e + 0.3 and b > s - 0.05 for s, e in acts) else quiet).append(p)
        h = st.median(p["p99_us"] for p in hit) / 1000 if hit else float("nan")
        q = st.median(p["p99_us"] for p in quiet) / 1000 if quiet else float("nan")
        ph, pq = pooled(hit), pooled(quiet)
        mh = max((p["max_us"] for p in hit), default=0) / 1000
        mq = max((p["max_us"] for p in quiet), default=0) / 1000
        am = st.median(1000 * (e - s) for s, e in acts) if acts else 0
        per.setdefault(m, []).append((h / q - 1, ph / pq - 1))
        print(f"{m:5s} {r:6d} {len(acts):8d} {am:10.0f} {h:8.3f} {q:10.3f} {100 * (h / q - 1):+6.0f}% "
              f"{ph:11.3f} {pq:13.3f} {100 * (ph / pq - 1):+6.0f}% {mh:8.1f} {mq:10.1f}")
for m, xs in per.items():
    print(f"{m}: median change of the per-second p99 {100 * st.median(x for x, _ in xs):+.0f}%, "
          f"of the pooled p99 {100 * st.median(y for _, y in xs):+.0f}%")
EOF
