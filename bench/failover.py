#!/usr/bin/env python3
"""bench/failover.py - per-range unavailability after kill -9 of a primary.

    bench/failover.py [-k KILLS] [-R REPLICAS] [-n NODES] [--keys K]
                      [--load-threads T] [--fsync MODE] [--bin DIR]
                      [--keep] [--json FILE]

Starts a cluster with deploy/cluster.sh (NODES servers, the controller's
--replicas REPLICAS) on free loopback ports, loads K keys, keeps a
background `shardkv bench` load running, and then KILLS times:

  1. picks a key at random and the node that is its primary (`locate`),
  2. reads and writes the key once (the client has the configuration),
  3. SIGKILLs that node (cluster.sh kill N) and, with the same client
     handle, one get of the key with a 10 s deadline, then one put: the
     time from the kill to each success is the range's read and write
     unavailability as a client sees it (failure detection, the failover
     configuration, the new primary applying it, the client following it),
  4. restarts the node (cluster.sh restart N) and waits until no range is
     under-replicated (the node caught up and is back in every ISR) before
     the next kill; that wait is reported as the repair time.

Prints one line per kill and the medians and maxima; --json writes them.
Everything it starts is stopped on exit (cluster.sh destroy).
"""
import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))


def free_base():
    """A base port P with P..P+5 and P+100..P+110 free on 127.0.0.1."""
    for _ in range(200):
        p = random.randint(20000, 50000)
        ok = True
        for q in list(range(p, p + 6)) + list(range(p + 100, p + 111)):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", q))
            except OSError:
                ok = False
            finally:
                s.close()
            if not ok:
                break
        if ok:
            return p
    raise SystemExit("failover.py: no free ports found")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-k", "--kills", type=int, default=20)
    ap.add_argument("-R", "--replicas", type=int, default=3)
    ap.add_argument("-n", "--nodes", type=int, default=3)
    ap.add_argument("--keys", type=int, default=10000)
    ap.add_argument("--load-threads", type=int, default=2)
    ap.add_argument("--fsync", default="batch")
    ap.add_argument("--bin", default=os.environ.get("SHARDKV_BIN_DIR", ""))
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    bindir = a.bin or next((d for d in (os.path.join(ROOT, "build-release/bin"),
                                        os.path.join(ROOT, "build/bin"))
                            if os.path.exists(os.path.join(d, "shardkv"))), "")
    if not bindir:
        raise SystemExit("failover.py: no binaries (build first or pass --bin)")
    bindir = os.path.abspath(bindir)
    if not os.environ.get("SHARDKV_LIB"):
        lib = os.path.join(os.path.dirname(bindir), "lib", "libshardkv.so.0")
        if os.path.exists(lib):
            os.environ["SHARDKV_LIB"] = lib
    import shardkv  # noqa: E402 (after SHARDKV_LIB is set)

    work = tempfile.mkdtemp(prefix="kvfailover.")
    wrap = os.path.join(work, "bin")
    os.mkdir(wrap)
    for b in ("shardkv", "shardkv-controller"):
        os.symlink(os.path.join(bindir, b), os.path.join(wrap, b))
    with open(os.path.join(wrap, "shardkv-server"), "w") as f:
        f.write('#!/bin/sh\nexec %s "$@" --fsync %s\n' % (os.path.join(bindir, "shardkv-server"), a.fsync))
    os.chmod(os.path.join(wrap, "shardkv-server"), 0o755)
    env = dict(os.environ, SHARDKV_BIN_DIR=wrap)
    cdir = os.path.join(work, "cluster")
    cs = [os.path.join(ROOT, "deploy/cluster.sh")]
    base = free_base()
    url = "tcp://127.0.0.1:%d" % base
    cli = [os.path.join(bindir, "shardkv"), "-c", url]
    load = None
    results = []

    def run(args, **kw):
        return subprocess.run(args, env=env, check=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, **kw)

    def status():
        out = run(cli + ["--json", "status"]).stdout
        return json.loads(out)

    def wait_replicated(limit):
        t0 = time.monotonic()
        while time.monotonic() - t0 < limit:
            try:
                st = status()
                if st.get("under_replicated", 1) == 0 and all(
                        n["state"] == "active" for n in st["nodes"] if n["state"] != "gone"):
                    return time.monotonic() - t0
            except (subprocess.CalledProcessError, ValueError):
                pass
            time.sleep(0.1)
        return None

    try:
        run(cs + ["up", "-n", str(a.nodes), "--replicas", str(a.replicas), "--dir", cdir,
                  "--base-port", str(base)])
        run(cli + ["bench", "--load", "--keys", str(a.keys), "--threads", "4", "--duration", "0"])
        if wait_replicated(120) is None:
            raise SystemExit("failover.py: ranges still under-replicated 120 s after the load")
        load = subprocess.Popen(cli + ["bench", "--keys", str(a.keys), "--threads", str(a.load_threads),
                                       "--mix", "get:80,put:20", "--duration", "100000"],
                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        kv = shardkv.Client(url, timeout_ms=10000)
        for i in range(a.kills):
            key = b"failover:%06d" % random.randrange(1000000)
            node = kv.locate(key)["node"]
            kv.put(key, b"before-%d" % i)
            kv.get(key)
            t0 = time.monotonic()
            run(cs + ["kill", str(node), "--dir", cdir])
            try:
                kv.get(key)
                t_read = time.monotonic() - t0
                kv.put(key, b"after-%d" % i)
                t_write = time.monotonic() - t0
            except shardkv.ShardkvError as e:
                t_read = t_write = None
                print("kill %d: node %d: the key did not serve again within 10 s: %s" % (i + 1, node, e))
            run(cs + ["restart", str(node), "--dir", cdir])
            rep = wait_replicated(120)
            results.append({"node": node, "read_s": t_read, "write_s": t_write, "repair_s": rep})
            print("kill %d: node %d: read again after %s s, write after %s s, back in sync after %s s" % (
                i + 1, node, "%.2f" % t_read if t_read is not None else "-",
                "%.2f" % t_write if t_write is not None else "-",
                "%.1f" % rep if rep is not None else "- (not within 120)"), flush=True)
            if rep is None:
                break
        kv.close()
    finally:
        if load is not None:
            load.terminate()
            load.wait()
        subprocess.run(cs + ["destroy", "--dir", cdir], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        if a.keep:
            print("work directory kept:", work)
        else:
            shutil.rmtree(work, ignore_errors=True)

    def summary(name):
        xs = [r[name] for r in results if r[name] is not None]
        if not xs:
            return None
        return {"median": statistics.median(xs), "max": max(xs), "n": len(xs)}

    s = {k: summary(k) for k in ("read_s", "write_s", "repair_s")}
    for k, v in s.items():
        if v:
            print("%s: median %.2f s, max %.2f s over %d kills" % (k, v["median"], v["max"], v["n"]))
    failed = sum(1 for r in results if r["read_s"] is None)
    if failed:
        print("kills after which the key never served again within 10 s: %d" % failed)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"kills": results, "summary": s, "replicas": a.replicas, "nodes": a.nodes,
                       "fsync": a.fsync}, f, indent=1)
    return 1 if failed or len(results) < a.kills else 0


if __name__ == "__main__":
    sys.exit(main())
