#!/usr/bin/env bash
# The automatic balancer's figure (doc/scheduler.md): loads N sequential
# keys into an empty 3-node cluster with no admin command, waits, and prints
# each node's share of the bytes (by the servers' own counts) and of the
# primaries (ranges it leads, and keys routed to it), and how many transfers
# were clean and how many copies the replicas started (from their logs).
#   KEYS=N         keys to load (default 2000000), values of VALUE bytes
#   VALUE=B        value size (default 100)
#   WAIT_S=S       seconds to wait after the load (default 60)
#   REPLICAS=R     the controller's --replicas (default: the controller's)
#   BASE_PORT=P    the cluster's ports (default 7000, or a free block above)
#   SHARDKV_BIN_DIR the binaries (default: cluster.sh's choice)
set -euo pipefail
cd "$(dirname "$0")/.."
keys=${KEYS:-2000000}
value=${VALUE:-100}
wait_s=${WAIT_S:-60}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
base=${BASE_PORT:-7000}
if [ -z "${BASE_PORT:-}" ]; then
	while ! port_free "$base" || ! port_free $((base + 101)); do base=$((base + 1000)); done
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/shardkv-balance.XXXXXX")
trap 'bash deploy/cluster.sh --dir "$dir" destroy >/dev/null 2>&1 || true' EXIT
ctl=$(bash deploy/cluster.sh up -n 3 --dir "$dir" --base-port "$base" \
	${REPLICAS:+--replicas "$REPLICAS"})
export SHARDKV_CONTROLLER=$ctl
. "$dir/cluster.env"
cli="$bin/shardkv"

echo "== loading $keys keys (${value}-byte values), no admin command"
t0=$(date +%s)
"$cli" bench --keys "$keys" --value-size "$value" --load --duration 0 --threads 4 --batch 500 |
	grep -E '^load:' || true
echo "loaded in $(($(date +%s) - t0)) s; waiting $wait_s s"
sleep "$wait_s"

"$cli" status --json >"$dir/status.json"
# Bytes by the servers' own counts; primaries by range and by the share of
# the loaded keys (bench keys are key: and a zero-padded index) they lead.
KEYS=$keys python3 - "$dir/status.json" <<'PY' | tee "$dir/report.txt"
import json, os, re, sys
st = json.load(open(sys.argv[1]))
n = int(os.environ["KEYS"])
tb = sum(x.get("bytes", 0) for x in st["nodes"]) or 1
def idx(b, end):
    if b == "" and end:
        return n
    m = re.match(r"key:0*(\d+)$", b)
    if m:
        return min(int(m.group(1)), n)
    return 0 if b < "key:" else n
led, nled = {}, {}
for r in st["ranges"]:
    a, z = idx(r["start"], False), idx(r["end"], True)
    led[r["node"]] = led.get(r["node"], 0) + max(0, z - a)
    nled[r["node"]] = nled.get(r["node"], 0) + 1
print("ranges: %d" % len(st["ranges"]))
full = sum(1 for r in st["ranges"] if len(r.get("insync", [])) >= len(r.get("replicas", [])))
print("ranges with every replica in sync: %d of %d" % (full, len(st["ranges"])))
for x in st["nodes"]:
    i = x["id"]
    print("node %d: bytes %d (%.1f%%), primary of %d ranges holding %.1f%% of the keys"
          % (i, x.get("bytes", 0), 100.0 * x.get("bytes", 0) / tb, nled.get(i, 0),
             100.0 * led.get(i, 0) / n))
print("balancer decisions (latest 16):")
for d in st.get("balancer", []):
    print("  " + d["what"])
PY
# What the transfers cost the replicas, from the servers' logs
# (doc/replication.md "Primary transfer"): copies include the joins' own.
count() { cat "$dir"/node-*.log 2>/dev/null | grep -c "$1" || true; }
echo "transfers clean: $(count 'handed to another primary with nothing outstanding')," \
	"unclean: $(count 'handed to another primary with records outstanding');" \
	"copies of a range started at replicas: $(count 'copy of a range from its primary started')"
# The self-splits of count steps (doc/scheduler.md "Primary counts") and
# what the replication streams made of them: restarts after a refusal,
# queued records dropped for a cut.
echo "self-splits: $(grep -c '^  split ' "$dir/report.txt" || true) of the latest 16 decisions;" \
	"stream restarts: $(count 'starting the stream again')," \
	"records dropped for a cut: $(count 'its queued records are dropped')"
