#!/usr/bin/env bash
# Checks that the tree keeps the architecture it shows. Exits non-zero and
# names the offence when:
#  1. a file includes another component's internal header (*_int.h, or a
#     header a component lists as internal below), tests/ and fuzz/ aside
#     (they may open up the module they test);
#  2. the components include each other in a circle (the component graph
#     must be a partial order: common, then proto, then the rest);
#  3. two object files of the build call each other in a circle (file A
#     calls a function defined in file B and B, maybe through others, calls
#     back into A). The call graph comes from `nm` on the object files of
#     a build: an edge A -> B for every undefined symbol of A defined in B;
#     `tsort` finds the circles.
# Usage: scripts/layering.sh [BUILD_DIR]   (default: build; it must be built)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
fail=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The component of a path: the deepest folder that has a CMakeLists.txt.
component() {
	local d
	d=$(dirname "$1")
	while [ "$d" != "." ] && [ ! -f "$d/CMakeLists.txt" ]; do d=$(dirname "$d"); done
	echo "$d"
}

# Prints each circle tsort reported (its stderr) as "  a -> b -> a".
loops() {
	awk '/input contains a loop/ { if (n) print "  " l " -> " f; n = 0; next }
	     { sub(/^tsort: /, ""); if (!n) { f = $0; l = $0 } else l = l " -> " $0; n++ }
	     END { if (n) print "  " l " -> " f }' "$1" | sort -u
}

# --- 1 and 2: includes ------------------------------------------------------
git ls-files '*.c' '*.h' | grep -v '^fuzz/corpus/' >"$tmp/files"
: >"$tmp/comp_edges"
while read -r f; do
	from=$(component "$f")
	case "$from" in tests* | fuzz*) tolerant=1 ;; *) tolerant=0 ;; esac
	{ grep -o '^#include "[^"]*"' "$f" || true; } | sed 's/^#include "//; s/"$//' | while read -r inc; do
		[ -f "$inc" ] || continue # generated (proto/shardkv.pb-c.h) or system
		to=$(component "$inc")
		[ "$to" = "$from" ] && continue
		case "$from" in tests* | fuzz* | bench*) ;; *) echo "$from $to" >>"$tmp/comp_edges" ;; esac
		if [ "$tolerant" = 0 ] && [[ "$inc" == *_int.h ]]; then
			echo "layering: $f includes $inc, an internal header of $to"
			echo x >>"$tmp/bad"
		fi
	done
done <"$tmp/files"
[ -f "$tmp/bad" ] && fail=1
sort -u "$tmp/comp_edges" >"$tmp/comp_edges.u"
if ! tsort "$tmp/comp_edges.u" >/dev/null 2>"$tmp/comp_loop"; then
	echo "layering: components include each other in a circle:"
	loops "$tmp/comp_loop"
	fail=1
fi

# --- 3: calls between object files -----------------------------------------
if [ ! -d "$build" ]; then
	echo "layering: no build folder $build (build first, or name it)" >&2
	exit 2
fi
# Object files of our own code, tests and fuzz harnesses aside (a test calls
# the module it tests and never the other way; harnesses likewise).
find "$build" -path '*/CMakeFiles/*.dir/*' -name '*.c.o' |
	grep -v -e '/tests/' -e '/fuzz/' -e 'pb-c\.c\.o$' | sort >"$tmp/objs"
[ -s "$tmp/objs" ] || { echo "layering: no object files under $build" >&2; exit 2; }
src_of() { # build/x/CMakeFiles/t.dir/a/b.c.o -> x/a/b.c (the source path)
	local o=${1#"$build"/} dir rel
	dir=${o%%/CMakeFiles/*}
	rel=${o#*/CMakeFiles/*.dir/}
	rel=${rel%.o}
	[ "$dir" = "$o" ] && dir=""
	# A source outside the target's folder shows as DIR/__/OTHER/x.c.
	echo "${dir:+$dir/}$rel" | sed -e 's#[^/]*/__/##g'

}
: >"$tmp/defs"
: >"$tmp/uses"
while read -r o; do
	s=$(src_of "$o")
	[ -f "$s" ] || continue # a stale object whose source moved or went
	nm -g --defined-only "$o" 2>/dev/null | awk -v s="$s" 'NF == 3 { print $3, s }' >>"$tmp/defs"
	nm -u "$o" 2>/dev/null | awk -v s="$s" '{ print $NF, s }' >>"$tmp/uses"
done <"$tmp/objs"
# A symbol defined in two objects (two executables' main, say) is ambiguous:
# keep the first definition only within the same folder, which is all the
# edges below need.
sort -u -k1,1 "$tmp/defs" >"$tmp/defs.u"
sort -k1,1 "$tmp/uses" >"$tmp/uses.s"
join "$tmp/uses.s" "$tmp/defs.u" | awk '$2 != $3 { print $2, $3 }' | sort -u >"$tmp/call_edges"
if ! tsort "$tmp/call_edges" >/dev/null 2>"$tmp/call_loop"; then
	echo "layering: files call each other in a circle:"
	loops "$tmp/call_loop"
	fail=1
fi

if [ "$fail" = 0 ]; then
	echo "layering: ok ($(wc -l <"$tmp/files") files, $(wc -l <"$tmp/comp_edges.u") component edges, $(wc -l <"$tmp/call_edges") call edges between $(wc -l <"$tmp/objs") objects)"
fi
exit "$fail"
