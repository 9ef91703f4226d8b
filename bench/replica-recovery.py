#!/usr/bin/env python3
"""bench/replica-recovery.py - copy rate of a replaced replica under load,
and its effect on another range's latency.

    bench/replica-recovery.py [--keys K] [--value-size B] [--probe-keys P]
                              [--down-after S] [--fsync MODE] [--copy-rate MB/S]
                              [--bin DIR]
                              [--keep] [--json FILE]

Starts a 3-node cluster with deploy/cluster.sh (controller --replicas 2
--down-after S --auto-balance off, so that the balancer leaves the layout
below alone), loads K keys "key:" + 12 digits with B-byte values, and
shapes two ranges:

    B = ["", key:P)   primary node 3, backup node 2   (the other range)
    A = [key:P, "")   primary node 1, backup node 2   (the one repaired)

Then, with two loads running (`shardkv bench` get:90,put:10 over all K keys,
and a probe `shardkv bench` get:90,put:10 over the first P keys, which all
lie in B), it SIGKILLs node 1. Node 2 becomes A's primary at once and, S
seconds later, the controller gives A a replacement replica on node 3,
which node 2 copies to it while both loads go on. It reports:

  - the copy: A's payload bytes (keys x (16 + B)) over the time from the
    configuration that adds node 3 to A's replicas to the one that takes
    it into A's ISR (polled every 100 ms), in MB/s;
  - the probe's p99 (its per-second series) before the kill, and during
    the copy: B's replica set is not touched, but its primary receives
    the copy and its backup sends it;
  - errors of both loads.

--copy-rate passes the servers' --copy-rate (MB/s; 0: unlimited); without
it they run with their default.

Everything it starts is stopped on exit (cluster.sh destroy).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from failover import free_base  # noqa: E402 (the same free ports as failover.py)


def key(i):
    return "key:%012d" % i


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=1000000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--probe-keys", type=int, default=50000)
    ap.add_argument("--down-after", type=int, default=2)
    ap.add_argument("--fsync", default="batch")
    ap.add_argument("--copy-rate", type=int, default=None)
    ap.add_argument("--bin", default=os.environ.get("SHARDKV_BIN_DIR", ""))
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    if not 0 < a.probe_keys < a.keys:
        raise SystemExit("replica-recovery.py: --probe-keys must be between 0 and --keys")

    bindir = a.bin or next((d for d in (os.path.join(ROOT, "build-release/bin"),
                                        os.path.join(ROOT, "build/bin"))
                            if os.path.exists(os.path.join(d, "shardkv"))), "")
    if not bindir:
        raise SystemExit("replica-recovery.py: no binaries (build first or pass --bin)")
    bindir = os.path.abspath(bindir)

    work = tempfile.mkdtemp(prefix="kvrecovery.")
    wrap = os.path.join(work, "bin")
    os.mkdir(wrap)
    os.symlink(os.path.join(bindir, "shardkv"), os.path.join(wrap, "shardkv"))
    srv_extra = "--fsync %s" % a.fsync
    if a.copy_rate is not None:
        srv_extra += " --copy-rate %d" % a.copy_rate
    for b, extra in (("shardkv-server", srv_extra),
                     ("shardkv-controller", "--down-after %d --auto-balance off" % a.down_after)):
        with open(os.path.join(wrap, b), "w") as f:
            f.write('#!/bin/sh\nexec %s "$@" %s\n' % (os.path.join(bindir, b), extra))
        os.chmod(os.path.join(wrap, b), 0o755)
    env = dict(os.environ, SHARDKV_BIN_DIR=wrap)
    cdir = os.path.join(work, "cluster")
    cs = [os.path.join(ROOT, "deploy/cluster.sh")]
    base = free_base()
    url = "tcp://127.0.0.1:%d" % base
    cli = [os.path.join(bindir, "shardkv"), "-c", url]
    loads = []
    out_all = os.path.join(work, "all.json")
    out_probe = os.path.join(work, "probe.json")
    split = key(a.probe_keys)

    def run(args, **kw):
        return subprocess.run(args, env=env, check=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, **kw)

    def status():
        return json.loads(run(cli + ["--json", "--timeout", "2000", "status"]).stdout)

    def range_a(st):
        for r in st["ranges"]:
            if r["start"] == split:
                return r
        return None

    def range_b(st):
        for r in st["ranges"]:
            if r["start"] == "":
                return r
        return None

    def wait(pred, limit, what):
        t0 = time.monotonic()
        st = None
        while time.monotonic() - t0 < limit:
            try:
                st = status()
                if pred(st):
                    return st
            except (subprocess.CalledProcessError, ValueError, KeyError, TypeError):
                pass
            time.sleep(0.1)
        if st is not None:
            print("last ranges:", [(r["start"], r["end"], r["node"], r.get("replicas"),
                                    r.get("insync")) for r in st.get("ranges", [])])
        raise SystemExit("replica-recovery.py: %s not within %d s" % (what, limit))

    res = {}
    try:
        run(cs + ["up", "-n", "3", "--replicas", "2", "--dir", cdir, "--base-port", str(base)])
        run(cli + ["bench", "--load", "--keys", str(a.keys), "--value-size", str(a.value_size),
                   "--threads", "4", "--duration", "0"])
        wait(lambda st: st.get("under_replicated", 1) == 0, 300, "the load replicated")
        run(cli + ["--timeout", "300000", "move", "", split, "3", "--wait"])
        st = wait(lambda st: st.get("under_replicated", 1) == 0 and range_a(st) is not None
                  and range_a(st)["node"] == 1 and sorted(range_a(st)["insync"]) == [1, 2]
                  and range_b(st)["node"] == 3 and sorted(range_b(st)["replicas"]) == [2, 3],
                  300, "ranges A on (1, 2) and B on (3, 2)")
        print("layout:", [(r["start"], r["end"], r["node"], r.get("replicas")) for r in st["ranges"]],
              flush=True)
        dur = 60
        common = ["--value-size", str(a.value_size), "--mix", "get:90,put:10",
                  "--duration", str(dur)]
        loads.append(subprocess.Popen(cli + ["--json", "bench", "--keys", str(a.keys), "--threads", "1",
                                             "--async", "20", "--out", out_all] + common,
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        loads.append(subprocess.Popen(cli + ["--json", "bench", "--keys", str(a.probe_keys), "--threads",
                                             "2", "--out", out_probe] + common,
                                      env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        t_start = time.monotonic()
        time.sleep(10)  # the baseline seconds of both loads
        t_kill = time.monotonic()
        run(cs + ["kill", "1", "--dir", cdir])
        st = wait(lambda st: range_a(st) is not None and 3 in range_a(st).get("replicas", []),
                  60, "a replacement replica for A")
        t_copy0 = time.monotonic()
        st = wait(lambda st: range_a(st) is not None and 3 in range_a(st).get("insync", []),
                  300, "the replacement in A's ISR")
        t_copy1 = time.monotonic()
        for p in loads:
            p.wait(timeout=dur + 120)
        nkeys_a = a.keys - a.probe_keys
        payload = nkeys_a * (16 + a.value_size)
        copy_s = t_copy1 - t_copy0
        probe = json.load(open(out_probe))
        allj = json.load(open(out_all))
        series = probe.get("series", [])

        def p99s(t0, t1):
            """The probe's per-second p99s (ms) of the seconds within [t0, t1)."""
            return [pt["p99_us"] / 1000.0 for pt in series
                    if t0 <= t_start + pt["t"] < t1 and pt.get("ops", 0) > 0]

        before = p99s(t_start + 2, t_kill)
        during = p99s(t_copy0, t_copy1 + 1)
        res = {"copy_rate": a.copy_rate, "keys_a": nkeys_a, "payload_bytes": payload,
               "copy_s": copy_s,
               "copy_mb_s": payload / copy_s / 1e6 if copy_s > 0 else None,
               "replacement_after_kill_s": t_copy0 - t_kill,
               "probe_p99_ms_before": before, "probe_p99_ms_during": during,
               "probe_errors": probe.get("errors"), "all_errors": allj.get("errors"),
               "probe_ops_per_sec": probe.get("ops_per_sec"), "all_ops_per_sec": allj.get("ops_per_sec")}
        print("replacement replica configured %.1f s after the kill" % res["replacement_after_kill_s"])
        print("copy of A: %d keys, %.1f MB payload in %.2f s: %.1f MB/s" % (
            nkeys_a, payload / 1e6, copy_s, res["copy_mb_s"] or 0))
        if before and during:
            print("probe (range B) p99 per second: before the kill median %.2f ms (max %.2f); "
                  "during the copy median %.2f ms (max %.2f)" % (
                      statistics.median(before), max(before), statistics.median(during), max(during)))
        else:
            print("probe series too short: before %s during %s" % (before, during))
        print("errors: load %s, probe %s" % (res["all_errors"], res["probe_errors"]))
    finally:
        for p in loads:
            if p.poll() is None:
                p.terminate()
                p.wait()
        subprocess.run(cs + ["destroy", "--dir", cdir], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        if a.keep:
            print("work directory kept:", work)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
