#!/usr/bin/env bash
# test_cluster_sh.sh SOURCE_DIR BIN_DIR - deploy/cluster.sh as an operator
# uses it: `--help` prints the usage on stdout and exits 0; `up --metrics`
# gives every daemon a metrics port of its own, prints it, lists it in
# prometheus-targets.json (valid JSON) and each answers /healthz with 200
# "ok"; after `shardkv leave 2`, `cluster.sh restart 2` fails with exit 4 and
# says the node is gone, instead of waiting on a server that retries.
# Every process is stopped on every path (`cluster.sh destroy` in the trap).
set -euo pipefail
src=$1 bin=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kv-clustersh.XXXXXX")
export SHARDKV_BIN_DIR=$bin SHARDKV_CLUSTER_DIR=$tmp/c SHARDKV_WAIT_S=30
cs() { bash "$src/deploy/cluster.sh" "$@"; }
cleanup() { cs destroy >/dev/null 2>&1 || true; rm -rf "$tmp"; }
trap cleanup EXIT
trap 'exit 1' INT TERM
fail() {
	echo "FAIL: $*" >&2
	for f in "$tmp"/c/*.log; do [ -f "$f" ] && { echo "== $f" >&2; tail -n 15 "$f" >&2; }; done
	exit 1
}

# A base port whose ports the cluster uses (controller, servers, metrics)
# are free now.
base=$(python3 - <<'PY'
import random, socket
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
for _ in range(200):
    # Below the ephemeral range (32768 on), where outgoing connections
    # cannot take a port between the check and the start.
    b = random.randrange(10000, 32000)
    if all(free(b + d) for d in (0, 101, 102, 300, 401, 402)):
        print(b); break
PY
)
[ -n "$base" ] || fail "no free base port"

out=$(cs --help) || fail "--help exits $?"
case "$out" in *"cluster.sh up"*"--metrics"*) ;; *) fail "--help does not show up --metrics: $out" ;; esac
rc=0
cs bogus >/dev/null 2>&1 || rc=$?
[ $rc -eq 2 ] || fail "an unknown command exits $rc, not 2"

cs up -n 2 --base-port "$base" --metrics >"$tmp/up.out" 2>"$tmp/up.err" ||
	{ cat "$tmp/up.err" >&2; fail "up --metrics failed"; }
cat "$tmp/up.err"
for p in $((base + 300)) $((base + 401)) $((base + 402)); do
	grep -q "http://127.0.0.1:$p/metrics" "$tmp/up.err" || fail "up does not print metrics port $p"
	body=$(python3 -c 'import sys, urllib.request
print(urllib.request.urlopen("http://127.0.0.1:%s/healthz" % sys.argv[1], timeout=5).read().decode(), end="")' "$p") ||
		fail "no /healthz on $p"
	[ "$body" = ok ] || fail "/healthz on $p says '$body'"
done
python3 - "$tmp/c/prometheus-targets.json" "$base" <<'PY' || fail "bad prometheus-targets.json"
import json, sys
groups = json.load(open(sys.argv[1]))
base = int(sys.argv[2])
jobs = {g["labels"]["job"]: g["targets"] for g in groups}
assert jobs["shardkv-controller"] == ["127.0.0.1:%d" % (base + 300)], jobs
assert jobs["shardkv-server"] == ["127.0.0.1:%d" % (base + 401), "127.0.0.1:%d" % (base + 402)], jobs
PY
out=$(cs metrics) || fail "cluster.sh metrics exits $?"
case "$out" in
*"node 2: http://127.0.0.1:$((base + 402))/metrics"*) ;;
*) fail "cluster.sh metrics does not list node 2: $out" ;;
esac

# Node 2 leaves; its server stops by itself (exit 4 is reaped by nobody).
"$bin/shardkv" -c "tcp://127.0.0.1:$base" leave 2 --wait >/dev/null || fail "shardkv leave 2"
pid=$(cat "$tmp/c/node-2.pid")
for _ in $(seq 1 200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "the server of node 2 still runs after its leave"

rc=0
cs restart 2 >"$tmp/restart.out" 2>"$tmp/restart.err" || rc=$?
cat "$tmp/restart.err"
[ $rc -eq 4 ] || fail "restart of a node that left exits $rc, not 4"
grep -q "its node is gone from the cluster" "$tmp/restart.err" || fail "restart does not say the node is gone"
grep -q "cluster.sh add" "$tmp/restart.err" || fail "restart does not say what to do"
echo "ok"
