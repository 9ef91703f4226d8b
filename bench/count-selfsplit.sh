#!/usr/bin/env bash
# The self-split of a count step on real servers (doc/scheduler.md
# "Primary counts"): loads N sequential keys into an empty 3-node cluster
# with R = 3, lays the primaries out as run B3 of bench/README.md ended
# (with `move`, which pins: node 1 one range of 36% of the keys, node 2
# three of about 10.7%, node 3 two of 16%; 1/3/2 of 6, every piece of
# another range too large for node 1), unpins them with `rebalance`, and
# with a paced write load running, waits for the balancer. Prints the
# ranges with their primaries and leader epochs, the decisions, the write
# load's errors, the keys counted after it, and from the servers' logs the
# copies, stream restarts and dropped records.
#   KEYS=N         keys to load (default 500000), values of VALUE bytes
#   VALUE=B        value size (default 100)
#   WAIT_S=S       seconds to wait after the unpinning (default 40)
#   RATE=OPS       the write load during the wait, puts/s (default 2000)
#   BASE_PORT=P    the cluster's ports (default 7000, or a free block above)
#   SHARDKV_BIN_DIR the binaries (default: cluster.sh's choice)
set -euo pipefail
cd "$(dirname "$0")/.."
keys=${KEYS:-500000}
value=${VALUE:-100}
wait_s=${WAIT_S:-40}
rate=${RATE:-2000}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
base=${BASE_PORT:-7000}
if [ -z "${BASE_PORT:-}" ]; then
	while ! port_free "$base" || ! port_free $((base + 101)); do base=$((base + 1000)); done
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/shardkv-selfsplit.XXXXXX")
trap 'bash deploy/cluster.sh --dir "$dir" destroy >/dev/null 2>&1 || true' EXIT
ctl=$(bash deploy/cluster.sh up -n 3 --dir "$dir" --base-port "$base" --replicas 3)
export SHARDKV_CONTROLLER=$ctl
. "$dir/cluster.env"
cli="$bin/shardkv"

echo "== loading $keys keys (${value}-byte values)"
"$cli" bench --keys "$keys" --value-size "$value" --load --duration 0 --threads 4 --batch 500 |
	grep -E '^load:' | tail -1

# The key at thousandth t of the loaded keys ("" at 0 and 1000).
k() {
	if [ "$1" -eq 0 ] || [ "$1" -ge 1000 ]; then echo ""; else printf 'key:%012d' $(($1 * keys / 1000)); fi
}
# A move with retries while the range is busy (a transfer fence, a copy):
# at most 60 s.
move() {
	local until=$(($(date +%s) + 60))
	while ! "$cli" move "$1" "$2" "$3" >/dev/null 2>"$dir/move.err"; do
		if [ "$(date +%s)" -ge "$until" ]; then
			echo "move [$1, $2) -> $3 failed: $(cat "$dir/move.err")" >&2
			return 1
		fi
		sleep 0.5
	done
}
# The whole key space to node 3 first (one pin over everything), then the
# parts of nodes 1 and 2.
echo "== laying out 1/3/2 of 6 with move (pins)"
move "" "" 3
move "$(k 0)" "$(k 360)" 1
move "$(k 360)" "$(k 467)" 2
move "$(k 627)" "$(k 733)" 2
move "$(k 893)" "$(k 1000)" 2
# Every range in sync (the JSON does not show a transfer fence: a move
# refused for one is retried), at most 60 s.
until=$(($(date +%s) + 60))
while :; do
	"$cli" config --json >"$dir/config.json"
	if python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))
ok = all(len(r.get("insync", [])) == len(r.get("replicas", [])) and not r.get("fence")
         for r in c["ranges"])
sys.exit(0 if ok else 1)' "$dir/config.json"; then
		break
	fi
	if [ "$(date +%s)" -ge "$until" ]; then
		echo "ranges not in sync after 60 s" >&2
		break
	fi
	sleep 0.5
done
show() {
	"$cli" status --json >"$dir/status.json"
	KEYS=$keys python3 - "$dir/status.json" <<'PY'
import json, os, re, sys
st = json.load(open(sys.argv[1]))
n = int(os.environ["KEYS"])
def idx(b, end):
    if b == "" and end:
        return n
    m = re.match(r"key:0*(\d+)$", b)
    if m:
        return min(int(m.group(1)), n)
    return 0 if b < "key:" else n
cnt, led = {}, {}
for r in st["config"]["ranges"] if "config" in st else st["ranges"]:
    a, z = idx(r["start"], False), idx(r["end"], True)
    cnt[r["node"]] = cnt.get(r["node"], 0) + 1
    led[r["node"]] = led.get(r["node"], 0) + max(0, z - a)
    print("  [%s, %s) node %d leader_epoch %s insync %d/%d%s" % (
        r["start"] or '""', r["end"] or '""', r["node"], r.get("leader_epoch", "?"),
        len(r.get("insync", [])), len(r.get("replicas", [])),
        " fence %d" % r["fence"] if r.get("fence") else ""))
tot = sum(cnt.values())
print("primaries: " + " / ".join("%d" % cnt.get(i, 0) for i in (1, 2, 3)) +
      " of %d, most %.1f%%; keys led " % (tot, 100.0 * max(cnt.values()) / tot) +
      " / ".join("%.1f%%" % (100.0 * led.get(i, 0) / n) for i in (1, 2, 3)))
print("pins: %d" % len(st.get("pins", st.get("config", {}).get("pins", []))))
PY
}
count() { cat "$dir"/node-*.log 2>/dev/null | grep -c "$1" || true; }
counts() {
	echo "$(count 'copy of a range from its primary started')" \
		"$(count 'starting the stream again')" "$(count 'its queued records are dropped')" \
		"$(count 'handed to another primary with')"
}
echo "== before the unpinning"
show
read -r c0 r0 d0 h0 <<<"$(counts)"
epoch0=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["epoch"])' "$dir/config.json")

echo "== a write load of $rate puts/s for $((wait_s + 5)) s; rebalance (unpins); waiting $wait_s s"
"$cli" bench --keys "$keys" --value-size "$value" --mix put:1 --rate "$rate" --threads 4 \
	--duration $((wait_s + 5)) >"$dir/load.txt" 2>&1 &
loadpid=$!
sleep 2
"$cli" rebalance
sleep "$wait_s"
wait "$loadpid" || echo "the write load exited $?"
sed -n '/^summary:/q;p' "$dir/load.txt" | tail -n +2
grep -E '^summary:|^  all |^errors:' "$dir/load.txt"

echo "== after"
show
"$cli" status --json >"$dir/status.json"
python3 - "$dir/status.json" "$epoch0" <<'PY'
import json, sys
st = json.load(open(sys.argv[1]))
print("balancer decisions (latest 16, the load's included; epoch %s before the unpinning):" % sys.argv[2])
for d in st.get("balancer", []):
    print("  " + d["what"])
PY
echo "keys: $("$cli" count "" "")"
read -r c1 r1 d1 h1 <<<"$(counts)"
echo "from the servers' logs, since the unpinning: copies of a range started at replicas:" \
	"$((c1 - c0)), stream restarts: $((r1 - r0)), queued records dropped for a cut:" \
	"$((d1 - d0)), primary roles handed over: $((h1 - h0))"
