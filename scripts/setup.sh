#!/usr/bin/env bash
# Installs the Debian 12 packages shardkv needs to build, test and run.
# Safe to run repeatedly: it installs only what is missing. Needs root (or sudo).
set -euo pipefail

# libmbedtls-dev: common/tls.c checks the --tls-* files with it (nng's own
# TLS engine on Debian). openssl: the TLS test makes its certificates with it.
# libclang-rt-14-dev: clang's sanitizer and libFuzzer runtimes (only
# recommended by clang, so --no-install-recommends would leave it out).
# libraft-dev, libuv1-dev: the replicated controller (canonical raft and the
# libuv loop its disk and TCP backend runs on). libjansson-dev: the checker
# reads history files (JSON Lines) with it. libedit-dev: line editing and
# history at the CLI's interactive prompt. python3: the Python binding
# (python/shardkv, standard library only: ctypes) and its test, and the
# free-port helpers of the shell tests.
pkgs=(build-essential cmake pkg-config clang clang-format libclang-rt-14-dev
      libprotobuf-c-dev protobuf-c-compiler libnng-dev libcmocka-dev
      liburcu-dev libxxhash-dev libmbedtls-dev openssl libraft-dev libuv1-dev libjansson-dev
      libedit-dev python3)

missing=()
for p in "${pkgs[@]}"; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
	command -v sudo >/dev/null || { echo "setup: need root to install: ${missing[*]}" >&2; exit 1; }
	SUDO=sudo
fi
echo "setup: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
