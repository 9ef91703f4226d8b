#!/usr/bin/env bash
# Runs shardkv-store-bench over a matrix of configurations, several times
# each, with liburcu's cds_lfht measured in the same process run, and prints
# the medians as a Markdown table (ops/s per phase, store/lfht ratios, bytes
# per key). Usage:
#   bench/store-matrix.sh [-r RUNS] [-b BIN] CONFIG...
# where each CONFIG is "KEYS:THREADS:MODE:ORDER[:KEYSIZE:VALUESIZE]", e.g.
#   bench/store-matrix.sh -r 3 10M:1:percore:random 10M:2:percore:random
# Raw JSON lines go to bench/results/ (one file per run).
set -euo pipefail
cd "$(dirname "$0")/.."
runs=3
bin=build-release/bin/shardkv-store-bench
while getopts "r:b:" o; do
	case "$o" in
	r) runs=$OPTARG ;;
	b) bin=$OPTARG ;;
	*) echo "usage: $0 [-r RUNS] [-b BIN] KEYS:THREADS:MODE:ORDER[:KEYSIZE:VALUESIZE]..." >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -gt 0 ] || { echo "usage: $0 [-r RUNS] [-b BIN] CONFIG..." >&2; exit 2; }
[ -x "$bin" ] || { echo "$0: $bin not built (cmake --build build-release)" >&2; exit 2; }
command -v python3 >/dev/null || { echo "$0: needs python3 for the summary" >&2; exit 2; }
mkdir -p bench/results
stamp=$(date -u +%Y%m%dT%H%M%SZ)
files=()
for cfg in "$@"; do
	IFS=: read -r keys threads mode order ks vs <<<"$cfg"
	ks=${ks:-4}
	vs=${vs:-4}
	out="bench/results/store-$stamp-$keys-$threads-$mode-$order-$ks-$vs.jsonl"
	: >"$out"
	for ((i = 1; i <= runs; i++)); do
		echo "# run $i/$runs: $cfg" >&2
		"$bin" --keys "$keys" --threads "$threads" --mode "$mode" --order "$order" \
			--key-size "$ks" --value-size "$vs" --peer lfht --json | tail -n 1 >>"$out"
	done
	files+=("$out")
done
python3 - "${files[@]}" <<'PY'
import json, statistics, sys
phases = ["PUT", "UPD", "MIX", "GET", "SCAN"]
print("| keys | threads | mode | order | k/v bytes | " + " | ".join(phases) +
      " | B/key | lfht " + " | lfht ".join(phases) + " | lfht B/key | ratios " +
      " ".join(phases) + " |")
print("|" + "---|" * (5 + 2 * len(phases) + 3))
for f in sys.argv[1:]:
    rows = [json.loads(l) for l in open(f) if l.strip()]
    p = rows[0]["params"]
    def med(side, ph):
        return statistics.median(r[side]["phases"][ph]["ops_per_sec"] for r in rows)
    def medb(side):
        return statistics.median(r[side]["bytes_per_key"] for r in rows)
    st = [med("store", ph) for ph in phases]
    lf = [med("lfht", ph) for ph in phases]
    ratios = " ".join("%.2f" % (a / b) for a, b in zip(st, lf))
    fmt = lambda x: "%.2fM" % (x / 1e6)
    print("| %s | %d | %s | %s | %d/%d | %s | %.1f | %s | %.1f | %s |" % (
        p["keys"], p["threads"], p["mode"], p["order"], p["key_size"], p["value_size"],
        " | ".join(map(fmt, st)), medb("store"), " | ".join(map(fmt, lf)), medb("lfht"),
        ratios))
print("\nmedians of %d runs each; raw: %s" % (len(rows), " ".join(sys.argv[1:])))
PY
