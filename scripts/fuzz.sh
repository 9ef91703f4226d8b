#!/usr/bin/env bash
# Builds the libFuzzer harnesses of fuzz/ (clang, -DKV_FUZZ=ON: ASan+UBSan and
# coverage instrumentation, in build-fuzz/) and runs each one, one after the
# other, from its seed corpus in fuzz/corpus/<harness>/. By default every
# harness gets an equal share of about 60 seconds. Exits non-zero when a
# harness crashes (or leaks, or times out), after printing the reproducer.
#
# Usage: scripts/fuzz.sh [-t SECONDS] [--no-build] [--corpus] [HARNESS...]
#   -t SECONDS   seconds per harness (default: 60 / number of harnesses)
#   --no-build   use the harnesses already in build-fuzz/
#   --corpus     rewrite the generated seeds of fuzz/corpus/ (kv-fuzz-make-corpus),
#                then stop
#   HARNESS      run only these (names as in build-fuzz/fuzz/harnesses.txt)
#
# New inputs a run finds go to build-fuzz/fuzz-out/corpus/<harness>/ (never
# into the repository), crashes to build-fuzz/fuzz-out/artifacts/<harness>/.
# Reproduce one with: build-fuzz/fuzz/<harness> <file>. fuzz/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."

secs=""
build=1
regen=0
only=()
while [ $# -gt 0 ]; do
	case "$1" in
	-t)
		[ $# -ge 2 ] && [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -gt 0 ] ||
			{ echo "fuzz.sh: -t needs a positive number of seconds" >&2; exit 2; }
		secs="$2"
		shift 2
		;;
	--no-build) build=0; shift ;;
	--corpus) regen=1; shift ;;
	-h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	-*) echo "usage: scripts/fuzz.sh [-t SECONDS] [--no-build] [--corpus] [HARNESS...]" >&2; exit 2 ;;
	*) only+=("$1"); shift ;;
	esac
done

bdir=build-fuzz
if [ "$build" = 1 ]; then
	bash scripts/setup.sh
	echo "== build ($bdir, clang, KV_FUZZ=ON)"
	cmake -S . -B "$bdir" -DCMAKE_C_COMPILER=clang -DKV_FUZZ=ON -DKV_BUILD_TESTS=OFF \
		-DKV_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	nice -n 10 cmake --build "$bdir" --target kv_fuzz -j"$(nproc)" >/dev/null
fi
[ -f "$bdir/fuzz/harnesses.txt" ] || { echo "fuzz.sh: no harnesses in $bdir (build first)" >&2; exit 2; }

if [ "$regen" = 1 ]; then
	# Overwrites the generated seeds; files added by hand (regress-*) stay.
	"$bdir/fuzz/kv-fuzz-make-corpus" fuzz/corpus
	echo "fuzz/corpus regenerated:"
	for d in fuzz/corpus/*/; do
		echo "  $(basename "$d"): $(ls "$d" | wc -l) files"
	done
	exit 0
fi

mapfile -t all <"$bdir/fuzz/harnesses.txt"
if [ ${#only[@]} -gt 0 ]; then
	for h in "${only[@]}"; do
		printf '%s\n' "${all[@]}" | grep -qx "$h" || { echo "fuzz.sh: no harness $h" >&2; exit 2; }
	done
	list=("${only[@]}")
else
	list=("${all[@]}")
fi
[ -n "$secs" ] || secs=$(( 60 / ${#list[@]} > 0 ? 60 / ${#list[@]} : 1 ))

# Inputs larger than a few pages find nothing more in a decoder; the file
# readers get room for several records or blocks.
max_len() {
	case "$1" in
	fuzz_wal_replay | fuzz_snap_load | fuzz_clog_open) echo 16384 ;;
	fuzz_cli) echo 1024 ;;
	*) echo 4096 ;;
	esac
}

out="$bdir/fuzz-out"
mkdir -p "$out"
# The file harnesses make one directory per input under here; removed at exit
# so that an input that crashed leaves nothing in /tmp.
export KV_FUZZ_TMPDIR
KV_FUZZ_TMPDIR=$(mktemp -d /tmp/kvfuzz-run.XXXXXX)
trap 'rm -rf "$KV_FUZZ_TMPDIR"' EXIT
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"

echo "== fuzzing ${#list[@]} harnesses, ${secs}s each"
failed=()
for h in "${list[@]}"; do
	work="$out/corpus/$h"
	art="$out/artifacts/$h"
	log="$out/$h.log"
	mkdir -p "$work" "$art"
	rc=0
	nice -n 10 "$bdir/fuzz/$h" -max_total_time="$secs" -max_len="$(max_len "$h")" \
		-timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$art/" "$work" "fuzz/corpus/$h" >"$log" 2>&1 || rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
	rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
	cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | grep -oE 'cov: [0-9]+ ft: [0-9]+ corp: [0-9]+' || true)
	if [ "$rc" -eq 0 ]; then
		printf '  %-20s ok     execs=%-9s exec/s=%-6s %s\n' "$h" "${execs:-?}" "${rate:-?}" "$cov"
		continue
	fi
	failed+=("$h")
	printf '  %-20s FAILED (exit %d)\n' "$h" "$rc"
	grep -E 'ERROR: |SUMMARY: |check failed|runtime error' "$log" | head -5 | sed 's/^/    /'
	repro=$(grep -oE 'Test unit written to .*' "$log" | tail -1 | sed 's/^Test unit written to //')
	if [ -n "$repro" ]; then
		echo "    reproducer: $repro"
		echo "    reproduce:  $bdir/fuzz/$h $repro"
	fi
	echo "    log: $log"
done

if [ ${#failed[@]} -gt 0 ]; then
	echo "== fuzzing FAILED: ${failed[*]}" >&2
	exit 1
fi
echo "== fuzzing passed"
