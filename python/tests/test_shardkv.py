#!/usr/bin/env python3
"""test_shardkv.py - the Python binding (python/shardkv) against a real
cluster: a controller and two servers started with deploy/cluster.sh on free
loopback ports (--dir in a temporary directory, `destroy` on every path),
plus one server started here unjoined for join/leave.

Every call of shardkv.Client is covered: get/put/delete/append, mget/mput,
the conditional writes, expire/persist/ttl, incr, exists, count/delrange,
scan (an iterator over several pages) and keys, join/leave/move/rebalance/
cancel/remove/status/config/locate, the per-call deadline, the context
manager; and the mapping of the error table to exceptions (NotFound,
Invalid, TooBig, Unavailable, Exists, PermissionDenied, Closed, ...).

Environment: SHARDKV_LIB (libshardkv.so), SHARDKV_BIN_DIR (the daemons and
the CLI), SHARDKV_SRC (the source tree, for deploy/cluster.sh); ctest sets
them (tests/cluster/tests.cmake). Run by hand:

    SHARDKV_LIB=build/lib/libshardkv.so SHARDKV_BIN_DIR=build/bin \\
        PYTHONPATH=python python3 python/tests/test_shardkv.py
"""

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.environ.get("SHARDKV_SRC", os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(SRC, "python"))

import shardkv  # noqa: E402

BIN = os.environ.get("SHARDKV_BIN_DIR", os.path.join(SRC, "build", "bin"))
WAIT_S = 30


def free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_base():
    """A base port whose cluster ports (controller, servers 1..3) are free
    now, below the ephemeral range so no outgoing connection takes one."""
    for _ in range(200):
        b = random.randrange(10000, 32000)
        if all(free(b + d) for d in (0, 101, 102, 103)):
            return b
    raise RuntimeError("no free base port")


def refusing_url():
    """A loopback URL where nothing listens (the socket is bound, not
    listening, so the port stays ours). Returns (url, socket)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return "tcp://127.0.0.1:%d" % s.getsockname()[1], s


class Cluster:
    """deploy/cluster.sh on a temporary directory; destroy() on every path."""

    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="kv-python.")
        self.dir = os.path.join(self.tmp, "c")
        self.env = dict(os.environ, SHARDKV_BIN_DIR=BIN, SHARDKV_WAIT_S=str(WAIT_S))
        self.env.pop("SHARDKV_CLUSTER_DIR", None)
        self.base = free_base()
        self.extra = None  # the unjoined server started by a test

    def cs(self, *args, check=True):
        return subprocess.run(
            ["bash", os.path.join(SRC, "deploy", "cluster.sh"), "--dir", self.dir] + list(args),
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            timeout=120, check=check)

    def up(self):
        r = self.cs("up", "-n", "2", "--base-port", str(self.base), check=False)
        if r.returncode != 0:
            raise RuntimeError("cluster.sh up failed (%d): %s" % (r.returncode, r.stderr))
        self.ctl = r.stdout.strip().splitlines()[-1]
        return self.ctl

    def start_unjoined(self):
        """A third server, running but not registered (for join)."""
        addr = "tcp://127.0.0.1:%d" % (self.base + 103)
        data = os.path.join(self.tmp, "extra")
        os.makedirs(data, exist_ok=True)
        self.extra_log = open(os.path.join(self.tmp, "extra.log"), "w")
        self.extra = subprocess.Popen(
            [os.path.join(BIN, "shardkv-server"), "--listen", addr, "--controller", self.ctl,
             "--data-dir", data], stdout=self.extra_log, stderr=subprocess.STDOUT)
        return addr

    def stop_extra(self):
        if self.extra is not None:
            if self.extra.poll() is None:
                self.extra.send_signal(signal.SIGINT)
                try:
                    self.extra.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    self.extra.kill()
                    self.extra.wait()
            self.extra = None
            self.extra_log.close()

    def logs(self):
        out = []
        for d in (self.dir, self.tmp):
            if os.path.isdir(d):
                for f in sorted(os.listdir(d)):
                    if f.endswith(".log"):
                        with open(os.path.join(d, f), errors="replace") as fh:
                            out.append("== %s\n%s" % (f, "".join(fh.readlines()[-15:])))
        return "\n".join(out)

    def destroy(self):
        if self.tmp is None:
            return  # already
        try:
            self.stop_extra()
        finally:
            self.cs("destroy", check=False)
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


def wait_until(pred, what, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.05)


class BindingTest(unittest.TestCase):
    cluster = None

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster()
        cluster = cls.cluster

        def on_signal(signum, frame):
            # Killed (ctest's timeout, ^C): the daemons go first.
            cluster.destroy()
            os._exit(128 + signum)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        try:
            cls.ctl = cls.cluster.up()
        except BaseException:
            sys.stderr.write(cls.cluster.logs())
            cls.cluster.destroy()
            raise
        cls.kv = shardkv.Client(cls.ctl, timeout_ms=10000)

    @classmethod
    def tearDownClass(cls):
        try:
            cls.kv.close()
        finally:
            cls.cluster.destroy()
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)

    # -- data ------------------------------------------------------------

    def test_put_then_get_returns_bytes_for_bytes_and_str(self):
        kv = self.kv
        kv.put(b"data:bin\x00\xff", b"\x00\x01\xfe")
        self.assertEqual(kv.get(b"data:bin\x00\xff"), b"\x00\x01\xfe")
        kv.put("data:text", "h\u00e9llo")
        self.assertEqual(kv.get("data:text"), "h\u00e9llo".encode("utf-8"))
        kv.put("data:empty", b"")
        self.assertEqual(kv.get("data:empty"), b"")
        kv.put(bytearray(b"data:ba"), memoryview(b"v"))
        self.assertEqual(kv.get(b"data:ba"), b"v")

    def test_get_of_a_missing_key_raises_not_found_or_gives_the_default(self):
        with self.assertRaises(shardkv.NotFound) as cm:
            self.kv.get("data:missing")
        self.assertEqual(cm.exception.code, -1)
        self.assertIsInstance(cm.exception, KeyError)
        self.assertIsInstance(cm.exception, shardkv.ShardkvError)
        self.assertIsNone(self.kv.get("data:missing", None))
        self.assertEqual(self.kv.get("data:missing", b"d"), b"d")

    def test_delete_returns_the_old_value_then_not_found(self):
        self.kv.put("data:del", "old")
        self.assertEqual(self.kv.delete("data:del"), b"old")
        with self.assertRaises(shardkv.NotFound):
            self.kv.delete("data:del")
        with self.assertRaises(shardkv.NotFound):
            self.kv.get("data:del")

    def test_append_creates_and_returns_the_new_length(self):
        self.assertEqual(self.kv.append("data:app", "ab"), 2)
        self.assertEqual(self.kv.append("data:app", b"cde"), 5)
        self.assertEqual(self.kv.get("data:app"), b"abcde")

    def test_mput_then_mget_in_key_order_with_none_for_missing(self):
        self.kv.mput({"m:a": "1", "m:z": "26"})
        self.kv.mput([(b"m:b", b"2"), ("m:y", b"25")])
        self.assertEqual(self.kv.mget(["m:a", "m:missing", b"m:z", "m:b", "m:y"]),
                         [b"1", None, b"26", b"2", b"25"])
        self.assertEqual(self.kv.mget([]), [])
        self.kv.mput({})

    def test_conditional_put_and_delete_carry_the_current_value(self):
        kv = self.kv
        kv.put("cond:lock", "me", if_absent=True)
        with self.assertRaises(shardkv.Exists) as cm:
            kv.put("cond:lock", "you", if_absent=True)
        self.assertEqual(cm.exception.current, b"me")
        self.assertEqual(cm.exception.code, -9)
        kv.put("cond:lock", "you", if_equal="me")
        with self.assertRaises(shardkv.Mismatch) as cm:
            kv.put("cond:lock", "x", if_equal="me")
        self.assertEqual(cm.exception.current, b"you")
        self.assertEqual(cm.exception.code, -22)
        with self.assertRaises(shardkv.Mismatch) as cm:
            kv.put("cond:none", "x", if_equal="me")
        self.assertIsNone(cm.exception.current)
        with self.assertRaises(shardkv.Mismatch) as cm:
            kv.delete("cond:lock", if_equal="me")
        self.assertEqual(cm.exception.current, b"you")
        self.assertEqual(kv.delete("cond:lock", if_equal="you"), b"you")
        self.assertFalse(kv.exists("cond:lock"))
        with self.assertRaises(shardkv.Invalid):
            kv.put("cond:k", "v", if_absent=True, if_equal="x")

    def test_expiry_ttl_persist_and_exists(self):
        kv = self.kv
        kv.put("ttl:a", "v", ttl_ms=60000)
        self.assertTrue(0 < kv.ttl("ttl:a") <= 60000)
        kv.persist("ttl:a")
        self.assertEqual(kv.ttl("ttl:a"), -1)
        self.assertTrue(kv.exists("ttl:a"))
        kv.expire("ttl:a", 1)
        deadline = time.monotonic() + 10
        while kv.exists("ttl:a") and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertFalse(kv.exists("ttl:a"))
        with self.assertRaises(shardkv.NotFound):
            kv.ttl("ttl:a")
        with self.assertRaises(shardkv.NotFound):
            kv.expire("ttl:a", 100)
        kv.mput({"ttl:m1": "1", "ttl:m2": "2"}, ttl_ms=60000)
        self.assertTrue(0 < kv.ttl("ttl:m2") <= 60000)
        for bad in (0, -5, shardkv.MAX_TTL_MS + 1, 1 << 70):
            with self.assertRaises(shardkv.Invalid):
                kv.put("ttl:bad", "v", ttl_ms=bad)
            with self.assertRaises(shardkv.Invalid):
                kv.expire("ttl:m1", bad)
        self.assertFalse(kv.exists("ttl:bad"))

    def test_incr_counts_and_refuses_a_non_integer(self):
        kv = self.kv
        self.assertEqual(kv.incr("incr:n"), 1)
        self.assertEqual(kv.incr("incr:n", -6), -5)
        self.assertEqual(kv.get("incr:n"), b"-5")
        kv.put("incr:word", "abc")
        with self.assertRaises(shardkv.Invalid):
            kv.incr("incr:word")
        with self.assertRaises(shardkv.Invalid):
            kv.incr("incr:n", 1 << 63)

    def test_count_and_delrange_cover_every_server(self):
        kv = self.kv
        keys = ["range:%03d" % i for i in range(40)]
        kv.mput({k: "v" for k in keys})
        self.assertEqual(kv.count("range:", "range;"), 40)
        self.assertEqual(kv.count("range:010", "range:020"), 10)
        self.assertEqual(kv.delrange("range:", "range:030"), 30)
        self.assertEqual(kv.count("range:", "range;"), 10)
        self.assertEqual(kv.delrange("range:", "range;"), 10)
        self.assertEqual(kv.count("range:", "range;"), 0)

    def test_scan_iterates_every_page_in_key_order(self):
        keys = ["scan:%03d" % i for i in range(25)]
        self.kv.mput({k: "v" + k for k in keys})
        got = list(self.kv.scan(start="scan:", end="scan;", page=4))
        self.assertEqual([k for k, _ in got], [k.encode() for k in keys])
        self.assertEqual([v for _, v in got], [("v" + k).encode() for k in keys])
        got = list(self.kv.scan(prefix="scan:01", page=3))
        self.assertEqual([k for k, _ in got], [("scan:%03d" % i).encode() for i in range(10, 20)])
        got = list(self.kv.scan(prefix="scan:", limit=7, page=3))
        self.assertEqual(len(got), 7)
        got = list(self.kv.scan(prefix="scan:", keys_only=True, limit=2))
        self.assertEqual(got, [(b"scan:000", b""), (b"scan:001", b"")])
        self.assertEqual(self.kv.keys("scan:02"), [("scan:%03d" % i).encode() for i in range(20, 25)])
        self.assertEqual(self.kv.keys("scan:none"), [])
        # A scan abandoned half-way frees its cursor.
        it = self.kv.scan(prefix="scan:", page=2)
        self.assertEqual(next(it)[0], b"scan:000")
        it.close()
        self.assertEqual(list(it), [])

    def test_scan_resumes_after_keys_at_the_servers_key_limit(self):
        # The servers' default --max-key is 1024; the cursor keeps resume
        # keys of any length itself.
        big = [b"big:" + bytes([65 + i]) * 1020 for i in range(3)]
        self.kv.mput([(k, b"x") for k in big])
        self.assertEqual([k for k, _ in self.kv.scan(prefix=b"big:", page=1)], big)

    def test_calls_from_several_threads_share_one_client(self):
        errors = []

        def work(t):
            try:
                for i in range(30):
                    k = "thr:%d:%d" % (t, i)
                    self.kv.put(k, k)
                    if self.kv.get(k) != k.encode():
                        errors.append(k)
            except Exception as e:  # reported below
                errors.append(repr(e))

        ths = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        self.assertEqual(errors, [])

    # -- errors ----------------------------------------------------------

    def test_bad_arguments_raise_invalid_and_too_big(self):
        with self.assertRaises(shardkv.Invalid) as cm:
            self.kv.put("", "v")
        self.assertEqual(cm.exception.code, -2)
        self.assertIsInstance(cm.exception, ValueError)
        with self.assertRaises(shardkv.Invalid):
            list(self.kv.scan(start="b", end="a"))
        with self.assertRaises(shardkv.TooBig) as cm:
            self.kv.put(b"k" * (64 * 1024 + 1), "v")
        self.assertEqual(cm.exception.code, -4)
        with self.assertRaises(TypeError):
            self.kv.put(3, "v")
        with self.assertRaises(shardkv.Invalid):
            self.kv.get("k", timeout_ms=0)

    def test_every_code_of_the_error_table_has_its_exception(self):
        seen = set()
        for code in range(-1, -22, -1):
            cls = shardkv._ERRORS[code]
            self.assertTrue(issubclass(cls, shardkv.ShardkvError))
            self.assertEqual(cls.code, code)
            seen.add(cls)
            with self.assertRaises(cls):
                shardkv._check(code)
        self.assertEqual(len(seen), 21)
        with self.assertRaises(shardkv.ShardkvError):
            shardkv._check(-99)  # an unknown code: the base class

    def test_refused_controller_raises_unavailable_well_before_the_deadline(self):
        url, s = refusing_url()
        try:
            with shardkv.Client(url, timeout_ms=10000, no_watch=True) as c:
                t0 = time.monotonic()
                with self.assertRaises(shardkv.Unavailable) as cm:
                    c.get("a")
                self.assertLess(time.monotonic() - t0, 3.0)
                self.assertIn(url, cm.exception.message)
                self.assertIsInstance(cm.exception, ConnectionError)
        finally:
            s.close()

    def test_per_call_deadline_applies_to_that_call_only(self):
        s = socket.socket()  # accepts connections, never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        try:
            url = "tcp://127.0.0.1:%d" % s.getsockname()[1]
            with shardkv.Client(url, timeout_ms=30000, no_watch=True) as c:
                t0 = time.monotonic()
                with self.assertRaises((shardkv.Timeout, shardkv.Unavailable)):
                    c.get("a", timeout_ms=300)
                self.assertLess(time.monotonic() - t0, 15.0)  # not the client's 30 s
        finally:
            s.close()
        # The thread's deadline is back to the client's.
        self.assertEqual(self.kv.get("data:missing", None), None)

    def test_calls_on_a_closed_client_raise_closed(self):
        c = shardkv.Client(self.ctl)
        with c:
            c.put("closed:k", "v")
        with self.assertRaises(shardkv.Closed):
            c.get("closed:k")
        c.close()  # again: nothing

    def test_auth_token_is_accepted_as_str_or_bytes(self):
        # The cluster runs without authentication: a token is sent and ignored.
        with shardkv.Client(self.ctl, auth_token="secret") as c:
            c.put("auth:k", "v")
        with shardkv.Client([self.ctl], auth_token=b"secret") as c:
            self.assertEqual(c.get("auth:k"), b"v")

    def test_log_level_names_and_values(self):
        shardkv.set_log_level("info")
        shardkv.set_log_level(shardkv.LOG_WARN)
        with self.assertRaises(shardkv.Invalid):
            shardkv.set_log_level("loud")
        with self.assertRaises(shardkv.Invalid):
            shardkv.set_log_level(9)
        self.assertTrue(os.path.exists(shardkv.library_path()) or
                        "/" not in shardkv.library_path())

    # -- admin -----------------------------------------------------------

    def test_status_and_config_are_dicts_of_the_cluster(self):
        st = self.kv.status()
        self.assertGreater(st["epoch"], 0)
        self.assertEqual(len([n for n in st["nodes"] if n["state"] == "active"]), 2)
        self.assertTrue(all(n["address"].startswith("tcp://127.0.0.1:") for n in st["nodes"]))
        self.assertIn("controllers", st)
        self.assertIn("stats", st["nodes"][0])
        for n in st["nodes"]:
            if n["stats"] is not None:
                self.assertIn("uptime_ms", n["stats"])
        cfg = self.kv.config()
        self.assertGreaterEqual(cfg["epoch"], 1)
        self.assertEqual(cfg["ranges"][0]["start"], b"")
        self.assertEqual(cfg["ranges"][-1]["end"], b"")
        self.assertNotIn("controllers", cfg)
        self.assertEqual(cfg["min_insync"], 2)  # the controller's default
        old = self.kv.config(epoch=1)
        self.assertEqual(old["epoch"], 1)
        with self.assertRaises(shardkv.NotFound):
            self.kv.config(epoch=10 ** 9)

    def test_locate_names_the_range_and_node_of_a_key(self):
        loc = self.kv.locate("some-key")
        self.assertEqual(loc["key"], b"some-key")
        self.assertLessEqual(loc["start"], b"some-key")
        self.assertTrue(loc["end"] == b"" or b"some-key" < loc["end"])
        self.assertTrue(loc["address"].startswith("tcp://"))
        self.assertIn(loc["node"], loc["replicas"])

    def test_move_then_rebalance_keeps_the_data(self):
        self.kv.put("mv:k", "v")
        loc = self.kv.locate("mv:k")
        other = next(n["id"] for n in self.kv.config()["nodes"] if n["id"] != loc["node"])
        # The dry run names the migration the move then starts (none with
        # replicas, the default: the primary role moves to an in-sync
        # replica), and changes nothing.
        epoch = self.kv.config()["epoch"]
        p = self.kv.move_plan(loc["start"], loc["end"], other)
        self.assertEqual(p["epoch"], epoch)
        want = [] if other in loc["replicas"] else [(loc["start"], loc["end"], loc["node"], other)]
        self.assertEqual([(s["start"], s["end"], s["from"], s["to"]) for s in p["plan"]], want)
        self.assertEqual(self.kv.config()["epoch"], epoch)
        self.assertIn("plan", self.kv.rebalance_plan())
        r = self.kv.move(loc["start"], loc["end"], other, wait=True)
        self.assertGreater(r["epoch"], 0)
        self.assertEqual(self.kv.locate("mv:k")["node"], other)
        self.assertEqual(self.kv.get("mv:k"), b"v")
        # The move pinned its range against the balancer until a rebalance.
        self.assertIn({"start": loc["start"], "end": loc["end"]}, self.kv.config()["pins"])
        r = self.kv.rebalance(wait=True)
        self.assertGreater(r["epoch"], 0)
        self.assertEqual(self.kv.config()["pins"], [])
        self.assertEqual(self.kv.get("mv:k"), b"v")

    def test_cancel_of_an_unknown_migration_is_not_found(self):
        with self.assertRaises(shardkv.Invalid):
            self.kv.cancel(0)
        with self.assertRaises(shardkv.NotFound):
            self.kv.cancel(987654321)

    def test_join_then_leave_of_a_new_server(self):
        addr = self.cluster.start_unjoined()
        try:
            with self.assertRaises(shardkv.Exists):
                self.kv.join(self.kv.config()["nodes"][0]["address"])
            # The server must be listening before the controller probes it.
            r = wait_until(lambda: self._try_join(addr), "the new server to join")
            self.assertGreater(r["node_id"], 0)
            st = self.kv.status()
            self.assertIn(addr, [n["address"] for n in st["nodes"]])
            # A live node cannot be removed (leave drains it instead).
            with self.assertRaises(shardkv.PermissionDenied):
                self.kv.remove(r["node_id"])
            self.kv.leave(r["node_id"], wait=True)
            states = {n["address"]: n["state"] for n in self.kv.config()["nodes"]}
            self.assertNotEqual(states.get(addr), "active")
        finally:
            self.cluster.stop_extra()

    def _try_join(self, addr):
        try:
            return self.kv.join(addr, wait=True)
        except shardkv.Unavailable:
            return None


if __name__ == "__main__":
    unittest.main(verbosity=2)
