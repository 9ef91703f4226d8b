#!/usr/bin/env bash
# The main job: installs what is missing, builds shardkv (Release) and runs it.
# Until the cluster commands land, this runs the local store benchmark against
# liburcu's lock-free hash table in both concurrency modes.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build-release -DCMAKE_BUILD_TYPE=Release -DKV_BUILD_TESTS=OFF >/dev/null
cmake --build build-release -j"$(nproc)" >/dev/null
keys=${KEYS:-1M}
for mode in percore striped; do
	echo "== store benchmark: $keys keys, mode $mode, random order, peer lfht"
	build-release/bin/shardkv-store-bench --keys "$keys" --mode "$mode" --order random --peer lfht
done
