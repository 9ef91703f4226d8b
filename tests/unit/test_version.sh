#!/bin/sh
# test_version.sh VERSION BINARY... - every binary given prints exactly one
# line "NAME VERSION" or "NAME VERSION (commit HEX)" on stdout for --version
# (also after other flags), nothing on stderr, and exits 0.
set -u
version=$1
shift
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kv-version.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
rv=0
for b in "$@"; do
	name=$(basename "$b")
	for args in "--version" "--log-level debug --version"; do
		code=0
		# shellcheck disable=SC2086 # args split on purpose
		"$b" $args >"$tmp/out" 2>"$tmp/err" </dev/null || code=$?
		out=$(cat "$tmp/out")
		if [ "$code" -ne 0 ]; then
			echo "FAIL: $name $args exits $code: $out $(cat "$tmp/err")"
			rv=1
		elif [ "$(wc -l <"$tmp/out")" -ne 1 ] || [ -s "$tmp/err" ]; then
			echo "FAIL: $name $args prints: '$out' / stderr '$(cat "$tmp/err")'"
			rv=1
		elif ! printf '%s\n' "$out" |
			grep -Eqx "$name $(printf '%s' "$version" | sed 's/\./\\./g')( \(commit [0-9a-f]{7,40}\))?"; then
			echo "FAIL: $name $args prints '$out', want '$name $version[ (commit C)]'"
			rv=1
		else
			echo "ok: $out"
		fi
	done
done
exit $rv
