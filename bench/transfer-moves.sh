#!/usr/bin/env bash
# Primary transfers under writes (doc/replication.md "Primary transfer"):
# a 3-node cluster with --replicas 3 and one range, `shardkv bench` writing
# and reading for DURATION s while `shardkv move "" "" N` hands the range to
# the next node every second, MOVES times. Prints the transfers the old
# primaries logged as clean ("nothing outstanding") and unclean, the copies
# of a range the replicas started (the joins' included) and the bench's
# errors.
#   MOVES=N          moves (default 20)      DURATION=S  bench seconds (default 25)
#   BASE_PORT=P      the cluster's ports (default a free block above 7000)
#   SHARDKV_BIN_DIR  the binaries (default: cluster.sh's choice)
set -euo pipefail
cd "$(dirname "$0")/.."
moves=${MOVES:-20}
duration=${DURATION:-25}
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
base=${BASE_PORT:-7000}
if [ -z "${BASE_PORT:-}" ]; then
	while ! port_free "$base" || ! port_free $((base + 103)); do base=$((base + 1000)); done
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/shardkv-transfers.XXXXXX")
trap 'bash deploy/cluster.sh --dir "$dir" destroy >/dev/null 2>&1 || true' EXIT
ctl=$(bash deploy/cluster.sh up -n 3 --dir "$dir" --base-port "$base" --replicas 3)
export SHARDKV_CONTROLLER=$ctl
. "$dir/cluster.env"
cli="$bin/shardkv"

# The one range on three in-sync replicas, no fence.
in_sync() {
	"$cli" --json config | python3 -c 'import json, sys
r = json.load(sys.stdin)["ranges"]
sys.exit(0 if len(r) == 1 and len(r[0].get("insync", [])) == 3 and not r[0].get("fence") else 1)'
}
for _ in $(seq 1 150); do in_sync && break; sleep 0.2; done
in_sync || { echo "transfer-moves.sh: the range never reached three in-sync replicas" >&2; exit 1; }

"$cli" bench --keys 100000 --value-size 100 --duration "$duration" --threads 4 --async 4 \
	--mix get:1,put:1 >"$dir/bench.txt" 2>&1 &
bp=$!
sleep 2
accepted=0 n=2
for _ in $(seq 1 "$moves"); do
	# A move is refused busy while the previous transfer's fence stands.
	for _ in $(seq 1 50); do
		if "$cli" move "" "" "$n" >/dev/null 2>&1; then
			accepted=$((accepted + 1))
			break
		fi
		sleep 0.1
	done
	n=$((n % 3 + 1))
	sleep 1
done
wait "$bp" || true
count() { cat "$dir"/node-*.log | grep -c "$1" || true; }
echo "moves accepted: $accepted of $moves"
echo "clean transfers: $(count 'handed to another primary with nothing outstanding')"
echo "unclean transfers: $(count 'handed to another primary with records outstanding')"
echo "copies started: $(count 'copy of a range from its primary started')"
grep -E '^errors' "$dir/bench.txt" || true
grep -E '^  node ' "$dir/bench.txt" || true
