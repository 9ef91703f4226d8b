#!/usr/bin/env bash
# Primary transfers under writes (doc/replication.md "Primary transfer"):
# a 3-node cluster with --replicas 3 and one range, `shardkv bench` writing
# and reading for DURATION s while `shardkv move "" "" N` hands the range to
# the next node every second, MOVES times. Prints the transfers the old
# primaries logged as clean ("nothing outstanding") and unclean, the copies
# of a range the replicas started, the ends of a
# previous leader epoch that found a backup diverged (these three counted
# from the load's start: the joins' copies are not among them), and the
# bench's errors.
#   MOVES=N          moves (default 20)      DURATION=S  bench seconds (default 25)
#   RANGES=3         three ranges instead of one, each led by its own node
#                    (the keys 33333 and 66666 the cuts);
#                    the first is the one handed on, so its old primary
#                    goes on writing a range of its own (doc/replication.md
#                    "Reconciliation after a transfer")
#   LOAD=pipelined   the load of bench/replicated-writes.sh (one caller
#                    loop, 50 callers, 16 puts a call) instead of 4 threads
#                    of 4 callers, half gets
#   KEY_SIZE=K       the bench's keys, "key:" and K-4 digits (default 16;
#                    the cuts of RANGES=3 follow)
#   BASE_PORT=P      the cluster's ports (default a free block above 7000)
#   SHARDKV_BIN_DIR  the binaries (default: cluster.sh's choice)
set -euo pipefail
cd "$(dirname "$0")/.."
moves=${MOVES:-20}
duration=${DURATION:-25}
ranges=${RANGES:-1}
load=${LOAD:-mixed}
ksize=${KEY_SIZE:-16}
case "$ksize" in '' | *[!0-9]*) echo "transfer-moves.sh: KEY_SIZE is a number of bytes" >&2; exit 2 ;; esac
[ "$ksize" -ge 10 ] && [ "$ksize" -le 200 ] || { echo "transfer-moves.sh: KEY_SIZE is 10 to 200" >&2; exit 2; }
cut1=$(printf 'key:%0*d' $((ksize - 4)) 33333)
cut2=$(printf 'key:%0*d' $((ksize - 4)) 66666)
case "$ranges" in 1 | 3) ;; *) echo "transfer-moves.sh: RANGES is 1 or 3" >&2; exit 2 ;; esac
case "$load" in mixed | pipelined) ;; *) echo "transfer-moves.sh: LOAD is mixed or pipelined" >&2; exit 2 ;; esac
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

# The ranges on three in-sync replicas each, no fence.
in_sync() {
	"$cli" --json config | python3 -c 'import json, sys
r = json.load(sys.stdin)["ranges"]
sys.exit(0 if len(r) == int(sys.argv[1]) and all(len(x.get("insync", [])) == 3 and not x.get("fence") for x in r) else 1)' "$1"
}
for _ in $(seq 1 150); do in_sync 1 && break; sleep 0.2; done
in_sync 1 || { echo "transfer-moves.sh: the range never reached three in-sync replicas" >&2; exit 1; }
first_end=""
if [ "$ranges" = 3 ]; then
	first_end=$cut1
	# Cuts, each handed to its node (a move to the node that leads it
	# already is refused at once: the loop goes on).
	for step in "$cut2||3|2" "$cut1|$cut2|2|3" "|$cut1|1|3"; do
		IFS='|' read -r s e n want <<<"$step"
		for _ in $(seq 1 20); do "$cli" move "$s" "$e" "$n" >/dev/null 2>&1 && break; sleep 0.1; done
		for _ in $(seq 1 150); do in_sync "$want" && break; sleep 0.2; done
	done
	in_sync 3 || { echo "transfer-moves.sh: the three ranges never reached three in-sync replicas" >&2; exit 1; }
fi

if [ "$load" = pipelined ]; then
	shape=(--threads 1 --async 50 --batch 16 --connections 1 --mix put:100)
else
	shape=(--threads 4 --async 4 --mix get:1,put:1)
fi
t0=$(date -u +%Y-%m-%dT%H:%M:%S.%6NZ) # the counts below are of the load's time
"$cli" bench --keys 100000 --key-size "$ksize" --value-size 100 --duration "$duration" "${shape[@]}" >"$dir/bench.txt" 2>&1 &
bp=$!
sleep 2
accepted=0 n=2
for _ in $(seq 1 "$moves"); do
	# A move is refused busy while the previous transfer's fence stands.
	for _ in $(seq 1 50); do
		if "$cli" move "" "$first_end" "$n" >/dev/null 2>&1; then
			accepted=$((accepted + 1))
			break
		fi
		sleep 0.1
	done
	n=$((n % 3 + 1))
	sleep 1
done
wait "$bp" || true
count() { cat "$dir"/node-*.log | awk -v t0="$t0" '$1 >= t0' | grep -c "$1" || true; }
echo "moves accepted: $accepted of $moves"
echo "clean transfers: $(count 'handed to another primary with nothing outstanding')"
echo "unclean transfers: $(count 'handed to another primary with records outstanding')"
echo "copies started: $(count 'copy of a range from its primary started')"
echo "backups found diverged by a new primary's end: $(count 'backup diverged from this primary')"
grep -E '^errors' "$dir/bench.txt" || true
grep -E '^  node ' "$dir/bench.txt" || true
