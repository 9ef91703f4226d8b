#!/usr/bin/env bash
# mutants.sh - the mutation check (doc/testing.md "Mutation check").
#
# Applies known-bad changes ("mutants", defined in scripts/mutants.txt) one
# at a time to a scratch copy of the committed tree (git archive HEAD; the
# caller's working tree is never touched), rebuilds incrementally in one
# build folder reused across mutants, runs the tests listed for each mutant
# and prints one line per mutant:
#
#   <name>  caught by <test>        a listed test failed: good
#   <name>  SURVIVED                every listed test passed: a gap
#   <name>  does not apply: ...     an anchor is missing or ambiguous
#   <name>  does not build          the mutant does not compile
#
# Exits 0 only when every mutant selected was caught. Not run in CI (it takes
# tens of minutes); run it by hand after changing code a mutant touches or
# a test that should catch one.
#
# Usage: scripts/mutants.sh [-k] [-l] [-f FILE] [-r REV] [NAME...]
#   NAME...  run only these mutants (default: all)
#   -r REV   check the tree of commit REV instead of HEAD (a listed test that
#            REV does not have is skipped: an older tree shows what survived)
#   -l       list the mutants and exit
#   -k       keep the scratch folder (its path is printed)
#   -f FILE  mutant definitions (default: scripts/mutants.txt)
#   MUTANTS_JOBS=N  build parallelism (default 2)
set -u

root=$(git rev-parse --show-toplevel 2>/dev/null) || {
	echo "mutants.sh: run it inside the repository" >&2
	exit 2
}
defs=$root/scripts/mutants.txt
keep=0
list=0
rev=HEAD
while getopts "klf:r:h" opt; do
	case $opt in
	k) keep=1 ;;
	l) list=1 ;;
	f) defs=$OPTARG ;;
	r) rev=$OPTARG ;;
	h)
		sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	*) exit 2 ;;
	esac
done
shift $((OPTIND - 1))
jobs=${MUTANTS_JOBS:-2}

# The definitions parser and the patcher. `list FILE` prints one line per
# mutant: name, tab, tests (space separated), tab, about. `apply FILE NAME
# SRC SAVE` copies every file the mutant touches to SAVE (once) and
# replaces each anchor, which must occur exactly once, or exits 3 with the
# reason on stdout. `restore SRC SAVE` copies the saved files back (with a
# new mtime, so the next build recompiles them).
py() {
	python3 - "$@" <<'EOF'
import os, shutil, sys

def parse(path):
    muts, cur, mode, lineno = [], None, None, 0
    def fail(msg):
        sys.exit("%s:%d: %s" % (path, lineno, msg))
    for raw in open(path, encoding="utf-8"):
        lineno += 1
        line = raw.rstrip("\n")
        if mode in ("anchor", "replace") and line.startswith("|"):
            cur["hunks"][-1][mode].append(line[1:])
            continue
        if not line.strip() or line.startswith("#"):
            continue
        key, _, val = line.partition(" ")
        val = val.strip()
        if key == "mutant":
            if cur is not None:
                fail("mutant %s has no end" % cur["name"])
            cur = {"name": val, "about": "", "tests": [], "hunks": []}
            mode = None
        elif cur is None:
            fail("%r outside a mutant" % line)
        elif key == "about:":
            cur["about"] = val
        elif key == "tests:":
            cur["tests"] = val.split()
        elif key == "file:":
            cur["hunks"].append({"file": val, "anchor": [], "replace": []})
            mode = None
        elif key in ("anchor:", "replace:"):
            if not cur["hunks"]:
                fail("%s before file:" % key)
            mode = key[:-1]
        elif key == "end":
            if not cur["tests"] or not cur["hunks"]:
                fail("mutant %s needs tests: and at least one file:" % cur["name"])
            for h in cur["hunks"]:
                if not h["anchor"]:
                    fail("mutant %s: empty anchor in %s" % (cur["name"], h["file"]))
            muts.append(cur)
            cur, mode = None, None
        else:
            fail("unknown line %r" % line)
    if cur is not None:
        fail("mutant %s has no end" % cur["name"])
    return muts

cmd = sys.argv[1]
if cmd == "list":
    for m in parse(sys.argv[2]):
        print("%s\t%s\t%s" % (m["name"], " ".join(m["tests"]), m["about"]))
elif cmd == "apply":
    muts = {m["name"]: m for m in parse(sys.argv[2])}
    m, src, save = muts[sys.argv[3]], sys.argv[4], sys.argv[5]
    texts = {}
    for h in m["hunks"]:
        path = os.path.join(src, h["file"])
        if h["file"] not in texts:
            if not os.path.exists(path):
                print("no file %s" % h["file"])
                sys.exit(3)
            texts[h["file"]] = open(path, encoding="utf-8").read()
        anchor = "\n".join(h["anchor"]) + "\n"
        n = texts[h["file"]].count(anchor)
        if n != 1:
            print("anchor %r found %d times in %s" % (h["anchor"][0].strip(), n, h["file"]))
            sys.exit(3)
        texts[h["file"]] = texts[h["file"]].replace(anchor, "\n".join(h["replace"]) + "\n")
    for f, t in texts.items():
        keep = os.path.join(save, f)
        if not os.path.exists(keep):
            os.makedirs(os.path.dirname(keep), exist_ok=True)
            shutil.copyfile(os.path.join(src, f), keep)
        with open(os.path.join(src, f), "w", encoding="utf-8") as out:
            out.write(t)
elif cmd == "restore":
    src, save = sys.argv[2], sys.argv[3]
    for d, _, files in os.walk(save):
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), save)
            shutil.copyfile(os.path.join(d, f), os.path.join(src, rel))
            os.unlink(os.path.join(d, f))
EOF
}

table=$(py list "$defs") || exit 2
if [ "$list" = 1 ]; then
	printf '%s\n' "$table" | awk -F'\t' '{printf "%-28s %s\n      tests: %s\n", $1, $3, $2}'
	exit 0
fi
if [ $# -gt 0 ]; then
	for n in "$@"; do
		printf '%s\n' "$table" | cut -f1 | grep -qx -- "$n" || {
			echo "mutants.sh: no mutant $n (see -l)" >&2
			exit 2
		}
	done
fi

tmp=$(mktemp -d /tmp/kv-mutants.XXXXXX)
cleanup() {
	if [ "$keep" = 1 ]; then
		echo "scratch folder kept: $tmp"
	else
		rm -rf "$tmp"
	fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
src=$tmp/src
bld=$tmp/build
save=$tmp/orig
mkdir -p "$src" "$save" "$tmp/runs"
git -C "$root" archive "$rev" | tar -x -C "$src" || exit 2

echo "mutation check of $(git -C "$root" rev-parse --short "$rev") in $tmp"
# Warnings are not errors here: a mutant is judged by the tests, and a
# mutant that leaves a helper unused must still build.
if ! cmake -S "$src" -B "$bld" -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$tmp/cmake.log" 2>&1 ||
	! cmake --build "$bld" -j"$jobs" >"$tmp/build.log" 2>&1; then
	echo "the unmutated tree does not build (log: $tmp/build.log)"
	keep=1
	exit 2
fi

# Runs one test entry; returns 0 when it passes. Entries:
#   NAME           ctest test NAME (exact)
#   NAME@FILTER    the same with KV_TEST_FILTER=FILTER (cmocka test names)
#   checker:ARGS   shardkv-checker --spawn DIR ARGS (ARGS comma separated)
run_test() {
	local t=$1 log=$2
	case $t in
	checker:*) ;;
	*)
		if ! ctest --test-dir "$bld" -N -R "^${t%%@*}\$" | grep -q '^Total Tests: 1$'; then
			echo "no test ${t%%@*} in this tree: skipped" >"$log"
			return 0
		fi
		;;
	esac
	case $t in
	checker:*)
		local args
		args=${t#checker:}
		# shellcheck disable=SC2086
		SHARDKV_BIN_DIR=$bld/bin timeout 300 "$bld/bin/shardkv-checker" \
			--spawn "$tmp/runs" ${args//,/ } >"$log" 2>&1
		;;
	*@*)
		KV_TEST_FILTER=${t#*@} ctest --test-dir "$bld" --no-tests=error \
			-R "^${t%%@*}\$" --output-on-failure >"$log" 2>&1
		;;
	*)
		ctest --test-dir "$bld" --no-tests=error -R "^$t\$" --output-on-failure \
			>"$log" 2>&1
		;;
	esac
}

survived=0
total=0
while IFS=$'\t' read -r name tests _; do
	if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx -- "$name"; then
		continue
	fi
	total=$((total + 1))
	t0=$(date +%s)
	why=$(py apply "$defs" "$name" "$src" "$save")
	rc=$?
	if [ $rc -ne 0 ]; then
		printf '%-34s does not apply: %s\n' "$name" "$why"
		survived=$((survived + 1))
		py restore "$src" "$save"
		continue
	fi
	if ! cmake --build "$bld" -j"$jobs" >"$tmp/build-$name.log" 2>&1; then
		printf '%-34s does not build (log: %s)\n' "$name" "$tmp/build-$name.log"
		keep=1
		survived=$((survived + 1))
		py restore "$src" "$save"
		continue
	fi
	result=SURVIVED
	for t in $tests; do
		if ! run_test "$t" "$tmp/test-$name-${t%%[@:]*}.log"; then
			result="caught by $t"
			break
		fi
	done
	printf '%-34s %s (%ss)\n' "$name" "$result" "$(($(date +%s) - t0))"
	[ "$result" = SURVIVED ] && survived=$((survived + 1))
	py restore "$src" "$save"
done <<<"$table"

# Leave the build folder at the unmutated tree (with -k it is reused by hand).
cmake --build "$bld" -j"$jobs" >"$tmp/build.log" 2>&1
echo "$((total - survived)) of $total mutants caught"
[ "$survived" -eq 0 ]
