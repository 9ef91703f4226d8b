#!/usr/bin/env python3
"""bench/backup-return.py - how long a backup SIGKILLed and started again
on its data dir takes to be back in the ISR, and what its primary sends it.

    bench/backup-return.py [--keys K] [--value-size B] [--away S]
                           [--fsync MODE] [--copy-rate MB/S] [--forget]
                           [--bin DIR] [--keep] [--json FILE]

Starts a 3-node cluster with deploy/cluster.sh (controller --replicas 3,
--auto-balance off), loads K keys "key:" + 12 digits with B-byte values
(one range, led by one node, the other two its backups), then runs a
`shardkv bench` put load over the keys while it SIGKILLs one backup,
waits S seconds and starts it again on its data dir. It reports:

  - the time from the restart to the configuration that has the node back
    in the range's ISR (`shardkv status --json`, polled every 50 ms);
  - what the primary sent to replicas outside the ISR meanwhile (its
    /metrics: shardkv_replica_copy_bytes_total, copies started, catch-ups
    from the replica's own data, refusals).

--forget removes the backup's positions file (repl-positions in its data
dir) before the restart: it then refuses the catch-up and is copied in
full, as every returning replica was before catch-ups from a replica's own
data existed (plus the one refused step): the "before" figure.

Everything it starts is stopped on exit (cluster.sh destroy).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from failover import free_base  # noqa: E402 (the same free ports as failover.py)


def metric(port, name):
    """Sample `name` of the /metrics page on 127.0.0.1:port (0 when absent)."""
    body = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read()
    for line in body.decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=200000)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--away", type=float, default=3.0)
    ap.add_argument("--fsync", default="batch")
    ap.add_argument("--copy-rate", type=int, default=None)
    ap.add_argument("--forget", action="store_true")
    ap.add_argument("--bin", default=os.environ.get("SHARDKV_BIN_DIR", ""))
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    bindir = a.bin or next((d for d in (os.path.join(ROOT, "build-release/bin"),
                                        os.path.join(ROOT, "build/bin"))
                            if os.path.exists(os.path.join(d, "shardkv"))), "")
    if not bindir:
        raise SystemExit("backup-return.py: no binaries (build first or pass --bin)")
    bindir = os.path.abspath(bindir)

    work = tempfile.mkdtemp(prefix="kvreturn.")
    wrap = os.path.join(work, "bin")
    os.mkdir(wrap)
    os.symlink(os.path.join(bindir, "shardkv"), os.path.join(wrap, "shardkv"))
    base = free_base()
    srv = os.path.join(wrap, "shardkv-server")
    with open(srv, "w") as f:
        f.write('#!/bin/sh\nexec %s "$@" --fsync %s %s\n'
                % (os.path.join(bindir, "shardkv-server"), a.fsync,
                   "--copy-rate %d" % a.copy_rate if a.copy_rate is not None else ""))
    os.chmod(srv, 0o755)
    ctl = os.path.join(wrap, "shardkv-controller")
    with open(ctl, "w") as f:
        f.write('#!/bin/sh\nexec %s "$@" --auto-balance off\n'
                % os.path.join(bindir, "shardkv-controller"))
    os.chmod(ctl, 0o755)
    env = dict(os.environ, SHARDKV_BIN_DIR=wrap)
    cdir = os.path.join(work, "cluster")
    cs = [os.path.join(ROOT, "deploy/cluster.sh")]
    url = "tcp://127.0.0.1:%d" % base
    cli = [os.path.join(bindir, "shardkv"), "-c", url]
    load = None

    def run(args):
        return subprocess.run(args, env=env, check=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)

    def status():
        return json.loads(run(cli + ["--json", "--timeout", "2000", "status"]).stdout)

    def wait(pred, limit, what, poll=0.1):
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit:
            try:
                st = status()
                if pred(st):
                    return st
            except (subprocess.CalledProcessError, ValueError, KeyError, TypeError):
                pass
            time.sleep(poll)
        raise SystemExit("backup-return.py: %s not within %d s" % (what, limit))

    def all_in_sync(st):
        return st.get("under_replicated", 1) == 0 and all(
            len(r.get("insync", [])) == 3 for r in st["ranges"])

    res = {}
    try:
        run(cs + ["up", "-n", "3", "--metrics", "--dir", cdir, "--base-port", str(base)])
        run(cli + ["bench", "--load", "--keys", str(a.keys), "--value-size", str(a.value_size),
                   "--threads", "4", "--duration", "0"])
        st = wait(all_in_sync, 300, "the load replicated")
        prim = st["ranges"][0]["node"]
        backup = next(n for n in (1, 2, 3) if n != prim)
        mport = base + 400 + prim  # cluster.sh --metrics: server N on PORT+400+N
        print("ranges:", [(r["start"], r["end"], r["node"], r.get("insync")) for r in st["ranges"]],
              "backup killed:", backup, flush=True)
        names = ("shardkv_replica_copy_bytes_total", "shardkv_replica_copies_total",
                 "shardkv_replica_catchups_total", "shardkv_replica_catchup_refusals_total")
        before = {n: metric(mport, n) for n in names}
        dur = int(a.away) + 40
        load = subprocess.Popen(cli + ["bench", "--keys", str(a.keys), "--threads", "2",
                                       "--value-size", str(a.value_size), "--mix", "put:100",
                                       "--duration", str(dur)],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(2)
        run(cs + ["kill", str(backup), "--dir", cdir])
        time.sleep(a.away)
        if a.forget:
            pf = os.path.join(cdir, "node-%d" % backup, "repl-positions")
            if os.path.exists(pf):
                os.unlink(pf)
        t0 = time.monotonic()
        run(cs + ["restart", str(backup), "--dir", cdir])
        # Out of the ISR first (the restart is failed over), then back in.
        wait(lambda st: any(backup not in r.get("insync", []) for r in st["ranges"]), 60,
             "the restarted backup out of the ISR", 0.05)
        wait(all_in_sync, 600, "the backup back in every ISR", 0.05)
        rejoin = time.monotonic() - t0
        after = {n: metric(mport, n) for n in names}
        d = {n: after[n] - before[n] for n in names}
        res = {"keys": a.keys, "value_size": a.value_size, "away_s": a.away, "forget": a.forget,
               "rejoin_s": rejoin, "bytes_sent": d[names[0]], "copies": d[names[1]],
               "catchups": d[names[2]], "refusals": d[names[3]]}
        print("back in every ISR %.2f s after the restart; primary sent %.1f MB in copy or "
              "catch-up steps (copies %d, catch-ups %d, refusals %d)" % (
                  rejoin, res["bytes_sent"] / 1e6, res["copies"], res["catchups"],
                  res["refusals"]), flush=True)
    finally:
        if load is not None and load.poll() is None:
            load.terminate()
            load.wait()
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
