#!/bin/sh
# test_install_pkgconfig.sh BUILD_DIR SOURCE_DIR CC [EXTRA] - an outside program
# built against an installed libshardkv: installs the build into a temporary
# prefix (`cmake --install --prefix`), then compiles and links
# client/example.c with nothing but what `pkg-config shardkv` prints for that
# prefix, and checks that the program loads the installed shared library.
# EXTRA: flags a sanitizer build's library needs of every program linking it
# (-fsanitize=...); empty otherwise.
# Fails when the installed shardkv.pc points anywhere but into the prefix.
set -eu
build=$1 src=$2 cc=${3:-cc} extra=${4:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kv-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT INT TERM
fail() { echo "FAIL: $*" >&2; exit 1; }

# The prefix is moved after the install: the .pc must follow the files,
# not remember where they were put.
cmake --install "$build" --prefix "$tmp/inst" >"$tmp/install.log" 2>&1 ||
	{ cat "$tmp/install.log" >&2; fail "cmake --install failed"; }
mv "$tmp/inst" "$tmp/moved"
prefix=$tmp/moved
pc=$(find "$prefix" -name shardkv.pc | head -n 1)
[ -n "$pc" ] || fail "no shardkv.pc under $prefix"
pcdir=$(dirname "$pc")
flags=$(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs shardkv) ||
	fail "pkg-config cannot read $pc"
echo "pkg-config --cflags --libs shardkv: $flags"
case "$flags" in
*/usr/local*) fail "flags name /usr/local, not the install prefix: $flags" ;;
esac
libdir=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=libdir shardkv)
incdir=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=includedir shardkv)
[ -f "$incdir/shardkv.h" ] || fail "includedir $incdir has no shardkv.h"
ls "$libdir"/libshardkv.so* >/dev/null 2>&1 || fail "libdir $libdir has no libshardkv.so"

# shellcheck disable=SC2086 # the flags are split on purpose
"$cc" -o "$tmp/example" "$src/client/example.c" $flags $extra 2>"$tmp/cc.log" ||
	{ cat "$tmp/cc.log" >&2; fail "example.c does not build with: $flags"; }
# The loader, given the prefix's libdir, finds libshardkv there.
found=$(LD_LIBRARY_PATH=$libdir ldd "$tmp/example" | grep 'libshardkv' || true)
case "$found" in
*"$libdir"/libshardkv.so*) ;;
*) fail "the example does not load the installed library: ${found:-(not linked)}" ;;
esac
echo "ok: example.c built and linked against $prefix ($found)"
