"""shardkv - a Python client of a shardkv cluster, over libshardkv.

    import shardkv

    with shardkv.Client("tcp://127.0.0.1:7000") as kv:
        kv.put("greeting", "hello")
        print(kv.get("greeting"))          # b'hello'
        for key, value in kv.scan(prefix="gr"):
            print(key, value)

Keys and values are bytes; a str is accepted and encoded as UTF-8. Every
call blocks until it succeeds, fails or its deadline passes (the client's
timeout_ms, or the call's own timeout_ms keyword). Failures raise a
subclass of ShardkvError, one per code of the error table (doc/library.md).

The binding uses ctypes over libshardkv.so (doc/python.md says how the
library is found: $SHARDKV_LIB first). A Client may be shared by threads;
the calls release the GIL while they wait.
"""

import ctypes
import ctypes.util
import os
import threading

__all__ = [
    "Client", "ShardkvError", "NotFound", "Invalid", "OutOfMemory", "TooBig",
    "WrongOwner", "Stale", "Timeout", "Unavailable", "Exists", "DiskError",
    "Corrupt", "ProtocolError", "AuthError", "Closed", "Busy", "Moving",
    "PermissionDenied", "NoSpace", "LimitExceeded", "AddressInUse",
    "InternalError", "Mismatch", "MAX_TTL_MS", "set_log_level", "library_path",
]

# ---------------------------------------------------------------------------
# Errors (the table of client/include/shardkv.h)
# ---------------------------------------------------------------------------


class ShardkvError(Exception):
    """A failed shardkv call: .code is the SHARDKV_E* code (negative),
    .message the library's detail (shardkv_errmsg)."""

    code = None

    def __init__(self, code, message=""):
        self.code = code
        self.message = message
        super().__init__(message or "shardkv error %d" % code)


class NotFound(ShardkvError, KeyError):
    """The key (or one of the keys) does not exist; an unknown node or epoch."""

    def __str__(self):
        return self.message or "not found"


class Invalid(ShardkvError, ValueError):
    """An invalid argument (empty key, inverted range, ...)."""


class OutOfMemory(ShardkvError, MemoryError):
    """Out of memory."""


class TooBig(ShardkvError, ValueError):
    """A key or value over the configured limit."""


class WrongOwner(ShardkvError):
    """Routing did not converge before the deadline."""


class Stale(ShardkvError):
    """The configuration epoch is stale."""


class Timeout(ShardkvError, TimeoutError):
    """The deadline passed."""


class Unavailable(ShardkvError, ConnectionError):
    """No controller or server could be reached (or refused the connection)."""


class Exists(ShardkvError):
    """Already exists (a duplicate join; put(..., if_absent=True) on a key
    that exists: .current is its value)."""

    current = None  # a failed put(if_absent=True): the key's value (bytes)


class DiskError(ShardkvError):
    """A server's disk failed."""


class Corrupt(ShardkvError):
    """Stored data failed a checksum."""


class ProtocolError(ShardkvError):
    """A malformed or unexpected message."""


class AuthError(ShardkvError, PermissionError):
    """Authentication failed (missing or wrong token, refused TLS handshake)."""


class Closed(ShardkvError):
    """The client or a peer is shutting down."""


class Busy(ShardkvError):
    """Busy (e.g. the range is moving, the migration has fenced); try again."""


class Moving(ShardkvError):
    """The key's range is being handed over."""


class PermissionDenied(ShardkvError, PermissionError):
    """The operation is not permitted (e.g. removing a live node)."""


class NoSpace(ShardkvError):
    """A server's disk is full."""


class LimitExceeded(ShardkvError):
    """Over a configured limit (batch size, scan limit)."""


class AddressInUse(ShardkvError):
    """Address in use."""


class InternalError(ShardkvError):
    """Internal error."""


class Mismatch(ShardkvError):
    """A conditional write's condition did not hold (if_equal): .current is
    the key's value (bytes), None when the key is absent."""

    current = None


_ERRORS = {
    -1: NotFound, -2: Invalid, -3: OutOfMemory, -4: TooBig, -5: WrongOwner,
    -6: Stale, -7: Timeout, -8: Unavailable, -9: Exists, -10: DiskError,
    -11: Corrupt, -12: ProtocolError, -13: AuthError, -14: Closed, -15: Busy,
    -16: Moving, -17: PermissionDenied, -18: NoSpace, -19: LimitExceeded,
    -20: AddressInUse, -21: InternalError, -22: Mismatch,
}
for _code, _cls in _ERRORS.items():
    _cls.code = _code

# Flags of the admin commands.
WAIT = 0x1
NO_REBALANCE = 0x2
ACCEPT_DATA_LOSS = 0x4

# Log levels (shardkv_set_log_level).
LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_OFF = range(5)

# ---------------------------------------------------------------------------
# The C structs (client/include/shardkv.h)
# ---------------------------------------------------------------------------

_size_t = ctypes.c_size_t
_u32 = ctypes.c_uint32
_u64 = ctypes.c_uint64
_MAX_REPLICAS = 5


class _Options(ctypes.Structure):
    _fields_ = [("timeout_ms", _u32), ("auth_token", ctypes.c_void_p),
                ("auth_token_len", _size_t), ("no_watch", ctypes.c_bool),
                ("tls_cert", ctypes.c_char_p), ("tls_key", ctypes.c_char_p),
                ("tls_ca", ctypes.c_char_p)]


class _Bytes(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("len", _size_t)]


class _Buf(ctypes.Structure):
    _fields_ = [("data", ctypes.POINTER(ctypes.c_uint8)), ("len", _size_t)]


class _MgetResult(ctypes.Structure):
    _fields_ = [("n", _size_t), ("values", ctypes.POINTER(_Buf)),
                ("nmissing", _size_t), ("missing", ctypes.POINTER(_size_t))]


class _NodeError(ctypes.Structure):
    _fields_ = [("node_id", _u32), ("address", ctypes.c_char_p),
                ("err", ctypes.c_int), ("nkeys", _size_t)]


class _MputResult(ctypes.Structure):
    _fields_ = [("nfailed", _size_t), ("failed", ctypes.POINTER(_NodeError))]


class _Entry(ctypes.Structure):
    _fields_ = [("key", _Buf), ("value", _Buf)]


class _ScanResult(ctypes.Structure):
    _fields_ = [("n", _size_t), ("entries", ctypes.POINTER(_Entry)),
                ("more", ctypes.c_bool), ("next", _Buf)]


class _ScanArgs(ctypes.Structure):
    _fields_ = [("start", _Bytes), ("end", _Bytes), ("prefix", _Bytes),
                ("limit", _size_t), ("keys_only", ctypes.c_bool)]


class _PutOptions(ctypes.Structure):
    _fields_ = [("ttl_ms", _u64), ("if_absent", ctypes.c_bool), ("if_equal", ctypes.c_bool),
                ("expect", _Bytes)]


class _AdminResult(ctypes.Structure):
    _fields_ = [("epoch", _u64), ("node_id", _u32), ("nmigrations", _size_t),
                ("wait_ms", _u64), ("first_mig_id", _u64)]


class _Node(ctypes.Structure):
    _fields_ = [("id", _u32), ("address", ctypes.c_char_p), ("state", ctypes.c_int),
                ("keys", _u64), ("bytes", _u64), ("ops_per_sec", ctypes.c_double),
                ("memory_bytes", _u64), ("last_seen_ms", _u64),
                ("has_stats", ctypes.c_bool), ("uptime_ms", _u64)]


class _Range(ctypes.Structure):
    _fields_ = [("start", _Buf), ("end", _Buf), ("node", _u32),
                ("nreplicas", _size_t), ("replicas", _u32 * _MAX_REPLICAS),
                ("ninsync", _size_t), ("insync", _u32 * _MAX_REPLICAS),
                ("leader_epoch", _u64), ("fence", _u32)]


class _Migration(ctypes.Structure):
    _fields_ = [("id", _u64), ("start", _Buf), ("end", _Buf), ("from_", _u32),
                ("to", _u32), ("phase", ctypes.c_char_p), ("keys_copied", _u64),
                ("bytes_copied", _u64), ("keys_total", _u64), ("bytes_total", _u64),
                ("eta_ms", _u64), ("rate_bytes_s", _u64), ("progress_age_ms", _u64)]


class _PlanStep(ctypes.Structure):
    _fields_ = [("start", _Buf), ("end", _Buf), ("from_", _u32), ("to", _u32),
                ("keys", _u64), ("bytes", _u64)]


class _Plan(ctypes.Structure):
    _fields_ = [("epoch", _u64), ("nsteps", _size_t), ("steps", ctypes.POINTER(_PlanStep))]


class _Controller(ctypes.Structure):
    _fields_ = [("id", _u32), ("address", ctypes.c_char_p), ("role", ctypes.c_char_p),
                ("term", _u64), ("index", _u64)]


class _Pin(ctypes.Structure):
    _fields_ = [("start", _Buf), ("end", _Buf)]


class _Config(ctypes.Structure):
    _fields_ = [("epoch", _u64), ("nnodes", _size_t), ("nodes", ctypes.POINTER(_Node)),
                ("nranges", _size_t), ("ranges", ctypes.POINTER(_Range)),
                ("nmigrations", _size_t), ("migrations", ctypes.POINTER(_Migration)),
                ("ncontrollers", _size_t), ("controllers", ctypes.POINTER(_Controller)),
                ("nbalancer", _size_t), ("balancer", ctypes.c_void_p),
                ("npins", _size_t), ("pins", ctypes.POINTER(_Pin)),
                ("min_insync", ctypes.c_uint32)]


# ---------------------------------------------------------------------------
# Loading libshardkv
# ---------------------------------------------------------------------------


def _candidates():
    env = os.environ.get("SHARDKV_LIB")
    if env:
        return [env]  # an explicit choice is the only one tried
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    # A checkout: python/shardkv -> build*/lib next to python/.
    root = os.path.dirname(os.path.dirname(here))
    for b in ("build", "build-release"):
        out.append(os.path.join(root, b, "lib", "libshardkv.so.0"))
    # An install: PREFIX/lib/python3/dist-packages/shardkv -> PREFIX/lib.
    prefix = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here))))
    for libdir in ("lib", "lib64", os.path.join("lib", "x86_64-linux-gnu"),
                   os.path.join("lib", "aarch64-linux-gnu")):
        out.append(os.path.join(prefix, libdir, "libshardkv.so.0"))
    found = ctypes.util.find_library("shardkv")
    if found:
        out.append(found)
    out.append("libshardkv.so.0")  # the dynamic loader's own search
    return out


def _load():
    errors = []
    for path in _candidates():
        if os.sep in path and not os.path.exists(path):
            errors.append("%s: no such file" % path)
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(str(e))
    raise ImportError("libshardkv.so not found (set SHARDKV_LIB to its path): "
                      + "; ".join(errors))


_lib, _lib_path = _load()


def library_path():
    """The libshardkv.so this module uses."""
    return _lib_path


def _fn(name, restype, *argtypes):
    f = getattr(_lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


_P = ctypes.POINTER
_c = ctypes.c_void_p  # shardkv_client *
_int = ctypes.c_int
_strerror = _fn("shardkv_strerror", ctypes.c_char_p, _int)
_errmsg = _fn("shardkv_errmsg", ctypes.c_char_p)
_free = _fn("shardkv_free", None, ctypes.c_void_p)
_open = _fn("shardkv_open", _int, ctypes.c_char_p, _P(_Options), _P(_c))
_close = _fn("shardkv_close", None, _c)
_set_thread_timeout = _fn("shardkv_set_thread_timeout", None, _u32)
_set_log_level = _fn("shardkv_set_log_level", _int, _int)
_get = _fn("shardkv_get", _int, _c, ctypes.c_void_p, _size_t, _P(_Buf))
_put = _fn("shardkv_put", _int, _c, ctypes.c_void_p, _size_t, ctypes.c_void_p, _size_t)
_del = _fn("shardkv_del", _int, _c, ctypes.c_void_p, _size_t, _P(_Buf))
_append = _fn("shardkv_append", _int, _c, ctypes.c_void_p, _size_t, ctypes.c_void_p,
              _size_t, _P(_u64))
_mget = _fn("shardkv_mget", _int, _c, _size_t, _P(_Bytes), _P(_P(_MgetResult)))
_mget_free = _fn("shardkv_mget_result_free", None, _P(_MgetResult))
_mput = _fn("shardkv_mput", _int, _c, _size_t, _P(_Bytes), _size_t, _P(_Bytes),
            _P(_P(_MputResult)))
_mput_free = _fn("shardkv_mput_result_free", None, _P(_MputResult))
_iter_new = _fn("shardkv_scan_iter_new", _int, _c, _P(_ScanArgs), _size_t, _P(ctypes.c_void_p))
_iter_next = _fn("shardkv_scan_iter_next", _int, ctypes.c_void_p, _P(_P(_Entry)))
_iter_free = _fn("shardkv_scan_iter_free", None, ctypes.c_void_p)
_put_ex = _fn("shardkv_put_ex", _int, _c, ctypes.c_void_p, _size_t, ctypes.c_void_p, _size_t,
              _P(_PutOptions), _P(_Buf))
_del_if_equal = _fn("shardkv_del_if_equal", _int, _c, ctypes.c_void_p, _size_t, ctypes.c_void_p,
                    _size_t, _P(_Buf))
_mput_ex = _fn("shardkv_mput_ex", _int, _c, _size_t, _P(_Bytes), _size_t, _P(_Bytes), _u64,
               _P(_P(_MputResult)))
_expire = _fn("shardkv_expire", _int, _c, ctypes.c_void_p, _size_t, _u64)
_persist = _fn("shardkv_persist", _int, _c, ctypes.c_void_p, _size_t)
_ttl = _fn("shardkv_ttl", _int, _c, ctypes.c_void_p, _size_t, _P(ctypes.c_int64))
_incr = _fn("shardkv_incr", _int, _c, ctypes.c_void_p, _size_t, ctypes.c_int64,
            _P(ctypes.c_int64))
_exists = _fn("shardkv_exists", _int, _c, ctypes.c_void_p, _size_t)
_count = _fn("shardkv_count", _int, _c, ctypes.c_void_p, _size_t, ctypes.c_void_p, _size_t,
             _P(_u64))
_delrange = _fn("shardkv_delrange", _int, _c, ctypes.c_void_p, _size_t, ctypes.c_void_p,
                _size_t, _P(_u64))
_join = _fn("shardkv_join", _int, _c, ctypes.c_char_p, ctypes.c_uint, _P(_AdminResult))
_leave = _fn("shardkv_leave", _int, _c, ctypes.c_char_p, ctypes.c_uint, _P(_AdminResult))
_move = _fn("shardkv_move", _int, _c, ctypes.c_void_p, _size_t, ctypes.c_void_p, _size_t,
            ctypes.c_char_p, _u32, ctypes.c_uint, _P(_AdminResult))
_remove = _fn("shardkv_remove", _int, _c, ctypes.c_char_p, ctypes.c_uint, _P(_AdminResult),
              _P(_u32))
_cancel = _fn("shardkv_cancel", _int, _c, _u64, _P(_AdminResult))
_rebalance = _fn("shardkv_rebalance", _int, _c, _u32, ctypes.c_uint, _P(_AdminResult))
_move_plan = _fn("shardkv_move_plan", _int, _c, ctypes.c_void_p, _size_t, ctypes.c_void_p,
                 _size_t, ctypes.c_char_p, _u32, _P(_P(_Plan)))
_rebalance_plan = _fn("shardkv_rebalance_plan", _int, _c, _u32, _P(_P(_Plan)))
_plan_free = _fn("shardkv_plan_free", None, _P(_Plan))
_config_get = _fn("shardkv_config_get", _int, _c, _u64, _P(_P(_Config)))
_status = _fn("shardkv_status", _int, _c, _P(_P(_Config)))
_config_free = _fn("shardkv_config_free", None, _P(_Config))
_node_state_name = _fn("shardkv_node_state_name", ctypes.c_char_p, _int)


def set_log_level(level):
    """Sets what the library writes to stderr: LOG_DEBUG .. LOG_OFF, or the
    names "debug", "info", "warn", "error", "off". The default is warnings."""
    if isinstance(level, str):
        names = ("debug", "info", "warn", "error", "off")
        if level not in names:
            raise Invalid(-2, "log level %r is not one of %s" % (level, ", ".join(names)))
        level = names.index(level)
    _check(_set_log_level(int(level)))


def _check(rv):
    """Raises the exception of a failed call (rv < 0); returns rv otherwise.
    Reads the detail on the calling thread, right after the call."""
    if rv >= 0:
        return rv
    msg = (_errmsg() or b"").decode("utf-8", "replace")
    if not msg:
        msg = (_strerror(rv) or b"").decode("utf-8", "replace")
    raise _ERRORS.get(rv, ShardkvError)(rv, msg)


def _b(x, what="key"):
    """bytes of a key or value: bytes-like as is, str encoded as UTF-8."""
    if isinstance(x, str):
        return x.encode("utf-8")
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    raise TypeError("%s must be bytes or str, not %s" % (what, type(x).__name__))


def _out(buf):
    """A returned shardkv_buf as bytes (None for "absent")."""
    if not buf.data:
        return None
    return ctypes.string_at(buf.data, buf.len)


def _s(p):
    return p.decode("utf-8", "replace") if p is not None else None


def _range_dict(r):
    return {"start": _out(r.start) or b"", "end": _out(r.end) or b"", "node": r.node,
            "replicas": list(r.replicas[:r.nreplicas]),
            "insync": list(r.insync[:r.ninsync]), "leader_epoch": r.leader_epoch,
            "fence": r.fence}


def _config_dict(cfg, with_stats):
    c = cfg.contents
    nodes = []
    for i in range(c.nnodes):
        n = c.nodes[i]
        d = {"id": n.id, "address": _s(n.address),
             "state": _node_state_name(n.state).decode()}
        if with_stats:
            d["stats"] = None if not n.has_stats else {
                "keys": n.keys, "bytes": n.bytes, "ops_per_sec": n.ops_per_sec,
                "memory_bytes": n.memory_bytes, "last_seen_ms": n.last_seen_ms,
                "uptime_ms": n.uptime_ms}
        nodes.append(d)
    migrations = []
    for i in range(c.nmigrations):
        m = c.migrations[i]
        migrations.append({
            "id": m.id, "start": _out(m.start) or b"", "end": _out(m.end) or b"",
            "from": m.from_, "to": m.to, "phase": _s(m.phase),
            "keys_copied": m.keys_copied, "bytes_copied": m.bytes_copied,
            "keys_total": m.keys_total, "bytes_total": m.bytes_total,
            "eta_ms": m.eta_ms, "rate_bytes_s": m.rate_bytes_s,
            "progress_age_ms": m.progress_age_ms})
    out = {"epoch": c.epoch, "nodes": nodes,
           "ranges": [_range_dict(c.ranges[i]) for i in range(c.nranges)],
           "pins": [{"start": _out(c.pins[i].start) or b"", "end": _out(c.pins[i].end) or b""}
                    for i in range(c.npins)],
           "migrations": migrations, "min_insync": c.min_insync}
    if with_stats:
        out["controllers"] = [
            {"id": k.id, "address": _s(k.address), "role": _s(k.role), "term": k.term,
             "index": k.index}
            for k in (c.controllers[i] for i in range(c.ncontrollers))]
    return out


def _plan_dict(p):
    """A plan as {"epoch", "plan": [{"start", "end", "from", "to", "keys", "bytes"}]}."""
    c = p.contents
    steps = []
    for i in range(c.nsteps):
        s = c.steps[i]
        steps.append({"start": _out(s.start) or b"", "end": _out(s.end) or b"",
                      "from": s.from_, "to": s.to, "keys": s.keys, "bytes": s.bytes})
    return {"epoch": c.epoch, "plan": steps}


def _admin_dict(r):
    return {"epoch": r.epoch, "node_id": r.node_id, "migrations": r.nmigrations,
            "wait_ms": r.wait_ms, "first_migration_id": r.first_mig_id}


_MISSING = object()

MAX_TTL_MS = 1 << 40  # SHARDKV_MAX_TTL_MS


def _ttl_arg(ttl_ms):
    """A TTL argument checked: an int from 1 to MAX_TTL_MS."""
    ms = int(ttl_ms)
    if not 0 < ms <= MAX_TTL_MS:
        raise Invalid(-2, "ttl_ms must be 1 to %d" % MAX_TTL_MS)
    return ms


class _Deadline:
    """Gives one call its own deadline (shardkv_set_thread_timeout): set on
    the calling thread for the call, then back to the client's."""

    __slots__ = ("ms",)

    def __init__(self, ms):
        self.ms = ms

    def __enter__(self):
        if self.ms is not None:
            if self.ms <= 0:
                raise Invalid(-2, "timeout_ms must be positive")
            _set_thread_timeout(int(self.ms))

    def __exit__(self, *exc):
        if self.ms is not None:
            _set_thread_timeout(0)
        return False


class Client:
    """A handle on one cluster, named by its controller addresses
    (comma-separated, or a list).

    timeout_ms: the deadline of every call (default 5000); each method also
    takes timeout_ms= for that call alone. auth_token: the shared secret
    (bytes or str). no_watch: no background configuration watch (short-lived
    programs). tls_cert/tls_key/tls_ca: PEM files for tls+tcp:// addresses.
    """

    def __init__(self, controller, timeout_ms=None, auth_token=None, no_watch=False,
                 tls_cert=None, tls_key=None, tls_ca=None):
        if not isinstance(controller, str):
            controller = ",".join(controller)
        self._mu = threading.Lock()  # protects _h against close racing close
        self._h = None
        self._token = _b(auth_token, "auth_token") if auth_token is not None else None
        o = _Options()
        o.timeout_ms = int(timeout_ms or 0)
        if self._token is not None:
            o.auth_token = ctypes.cast(ctypes.c_char_p(self._token), ctypes.c_void_p)
            o.auth_token_len = len(self._token)
        o.no_watch = bool(no_watch)
        o.tls_cert = tls_cert.encode() if tls_cert else None
        o.tls_key = tls_key.encode() if tls_key else None
        o.tls_ca = tls_ca.encode() if tls_ca else None
        h = _c()
        _check(_open(controller.encode("utf-8"), ctypes.byref(o), ctypes.byref(h)))
        self._h = h
        self.controller = controller

    # -- life cycle --------------------------------------------------------

    def close(self):
        """Closes the handle (no call may be in progress on it). Idempotent."""
        with self._mu:
            h, self._h = self._h, None
        if h is not None and h.value:
            _close(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _handle(self):
        h = self._h
        if h is None:
            raise Closed(-14, "the client is closed")
        return h

    def set_timeout(self, timeout_ms):
        """Changes the client's per-call deadline (0: 5000 ms)."""
        _fn_set_timeout(self._handle(), int(timeout_ms))

    # -- data --------------------------------------------------------------

    def get(self, key, default=_MISSING, timeout_ms=None):
        """The value of key (bytes). Raises NotFound when it is absent,
        unless a default is given."""
        k = _b(key)
        v = _Buf()
        with _Deadline(timeout_ms):
            rv = _get(self._handle(), k, len(k), ctypes.byref(v))
            if rv == -1 and default is not _MISSING:
                return default
            _check(rv)
        try:
            return _out(v) or b""
        finally:
            _free(v.data)

    def put(self, key, value, ttl_ms=None, if_absent=False, if_equal=None, timeout_ms=None):
        """Sets key to value (applied once, even when retried).

        ttl_ms: the key expires that many ms after the write (a put without
        it clears an earlier expiry). if_absent=True: only when the key does
        not exist, else raises Exists. if_equal=OLD: only when the key holds
        exactly OLD, else raises Mismatch. Either exception carries the key's
        current value in .current (None: absent) and nothing was written."""
        k, v = _b(key), _b(value, "value")
        if ttl_ms is None and not if_absent and if_equal is None:
            with _Deadline(timeout_ms):
                _check(_put(self._handle(), k, len(k), v, len(v)))
            return
        o = _PutOptions()
        o.ttl_ms = _ttl_arg(ttl_ms) if ttl_ms is not None else 0
        o.if_absent = bool(if_absent)
        e = None
        if if_equal is not None:
            e = _b(if_equal, "if_equal")
            o.if_equal = True
            o.expect = _Bytes(ctypes.cast(ctypes.c_char_p(e), ctypes.c_void_p) if e else None,
                              len(e))
        cur = _Buf()
        with _Deadline(timeout_ms):
            rv = _put_ex(self._handle(), k, len(k), v, len(v), ctypes.byref(o),
                         ctypes.byref(cur))
            self._check_cond(rv, cur)

    @staticmethod
    def _check_cond(rv, cur):
        """_check of a conditional write: Exists / Mismatch get .current."""
        try:
            _check(rv)
        except (Exists, Mismatch) as ex:
            ex.current = _out(cur)
            raise
        finally:
            if rv in (-9, -22):
                _free(cur.data)

    def delete(self, key, if_equal=None, timeout_ms=None):
        """Deletes key and returns its value (None when a retried delete of
        a value over 4096 bytes could not learn it). Raises NotFound.
        if_equal=OLD: only when the key holds exactly OLD (returns OLD), else
        raises Mismatch with the current value in .current (None: absent)."""
        k = _b(key)
        if if_equal is not None:
            e = _b(if_equal, "if_equal")
            cur = _Buf()
            with _Deadline(timeout_ms):
                rv = _del_if_equal(self._handle(), k, len(k), e, len(e), ctypes.byref(cur))
                self._check_cond(rv, cur)
            return e
        old = _Buf()
        with _Deadline(timeout_ms):
            _check(_del(self._handle(), k, len(k), ctypes.byref(old)))
        try:
            return _out(old)
        finally:
            _free(old.data)

    def expire(self, key, ttl_ms, timeout_ms=None):
        """Makes an existing key expire ttl_ms from now. Raises NotFound."""
        k = _b(key)
        ms = _ttl_arg(ttl_ms)
        with _Deadline(timeout_ms):
            _check(_expire(self._handle(), k, len(k), ms))

    def persist(self, key, timeout_ms=None):
        """Makes an existing key never expire. Raises NotFound."""
        k = _b(key)
        with _Deadline(timeout_ms):
            _check(_persist(self._handle(), k, len(k)))

    def ttl(self, key, timeout_ms=None):
        """The ms key has left, -1 when it does not expire. Raises NotFound."""
        k = _b(key)
        n = ctypes.c_int64()
        with _Deadline(timeout_ms):
            _check(_ttl(self._handle(), k, len(k), ctypes.byref(n)))
        return n.value

    def incr(self, key, delta=1, timeout_ms=None):
        """Adds delta (a signed 64-bit int) to the decimal integer in key (an
        absent key counts as 0) and returns the new value; applied once even
        when retried. Raises Invalid when the value is not an integer or the
        sum overflows."""
        k = _b(key)
        d = int(delta)
        if not -(1 << 63) <= d < (1 << 63):
            raise Invalid(-2, "delta must fit in a signed 64-bit integer")
        n = ctypes.c_int64()
        with _Deadline(timeout_ms):
            _check(_incr(self._handle(), k, len(k), d, ctypes.byref(n)))
        return n.value

    def exists(self, key, timeout_ms=None):
        """Whether key exists (True / False)."""
        k = _b(key)
        with _Deadline(timeout_ms):
            rv = _exists(self._handle(), k, len(k))
            if rv == -1:
                return False
            _check(rv)
        return True

    def count(self, start=b"", end=b"", timeout_ms=None):
        """The number of keys of [start, end) (empty end: no bound), summed
        over every server owning part of it."""
        s, e = _b(start), _b(end)
        n = _u64()
        with _Deadline(timeout_ms):
            _check(_count(self._handle(), s, len(s), e, len(e), ctypes.byref(n)))
        return n.value

    def delrange(self, start=b"", end=b"", timeout_ms=None):
        """Deletes every key of [start, end) on every server, in steps each
        atomic on its server; returns how many were deleted."""
        s, e = _b(start), _b(end)
        n = _u64()
        with _Deadline(timeout_ms):
            _check(_delrange(self._handle(), s, len(s), e, len(e), ctypes.byref(n)))
        return n.value

    def append(self, key, value, timeout_ms=None):
        """Appends value to key's value (creating it); returns the new length."""
        k, v = _b(key), _b(value, "value")
        n = _u64()
        with _Deadline(timeout_ms):
            _check(_append(self._handle(), k, len(k), v, len(v), ctypes.byref(n)))
        return n.value

    @staticmethod
    def _bytes_array(items, what):
        keep = [_b(x, what) for x in items]
        arr = (_Bytes * max(len(keep), 1))()
        for i, x in enumerate(keep):
            arr[i].data = ctypes.cast(ctypes.c_char_p(x), ctypes.c_void_p) if x else None
            arr[i].len = len(x)
        return arr, keep

    def mget(self, keys, timeout_ms=None):
        """The values of keys, in order: bytes, or None for a missing key."""
        keys = list(keys)
        if not keys:
            return []
        arr, keep = self._bytes_array(keys, "key")
        res = _P(_MgetResult)()
        with _Deadline(timeout_ms):
            rv = _mget(self._handle(), len(keep), arr, ctypes.byref(res))
            if rv != -1:
                _check(rv)
        try:
            r = res.contents
            return [_out(r.values[i]) for i in range(r.n)]
        finally:
            _mget_free(res)

    def mput(self, items, ttl_ms=None, timeout_ms=None):
        """Writes pairs: a dict, or an iterable of (key, value). The pairs of
        each server are written atomically; with ttl_ms every key expires that
        many ms after the write. On a partial failure raises the first part's
        error with .failed = [{"node_id", "address", "error", "keys"}, ...]."""
        pairs = list(items.items()) if isinstance(items, dict) else list(items)
        if not pairs:
            return
        karr, kkeep = self._bytes_array([p[0] for p in pairs], "key")
        varr, vkeep = self._bytes_array([p[1] for p in pairs], "value")
        res = _P(_MputResult)()
        with _Deadline(timeout_ms):
            ms = _ttl_arg(ttl_ms) if ttl_ms is not None else 0
            rv = _mput_ex(self._handle(), len(kkeep), karr, len(vkeep), varr, ms,
                          ctypes.byref(res))
            try:
                _check(rv)
            except ShardkvError as e:
                e.failed = []
                if res:
                    r = res.contents
                    for i in range(r.nfailed):
                        f = r.failed[i]
                        e.failed.append({"node_id": f.node_id, "address": _s(f.address),
                                         "error": _ERRORS.get(f.err, ShardkvError).__name__,
                                         "code": f.err, "keys": f.nkeys})
                raise
            finally:
                _mput_free(res)

    def scan(self, start=b"", end=b"", prefix=b"", limit=0, keys_only=False, page=256,
             timeout_ms=None):
        """Iterates over (key, value) pairs of [start, end) in key order
        (empty end: to the end of the key space), only keys with prefix when
        given, at most limit (0: all). Pages of `page` entries are fetched as
        the iteration goes; each fetch has the call's deadline."""
        s, e, p = _b(start), _b(end), _b(prefix)
        args = _ScanArgs()
        args.start = _Bytes(ctypes.cast(ctypes.c_char_p(s), ctypes.c_void_p) if s else None, len(s))
        args.end = _Bytes(ctypes.cast(ctypes.c_char_p(e), ctypes.c_void_p) if e else None, len(e))
        args.prefix = _Bytes(ctypes.cast(ctypes.c_char_p(p), ctypes.c_void_p) if p else None,
                             len(p))
        args.limit = int(limit)
        args.keys_only = bool(keys_only)
        it = ctypes.c_void_p()
        _check(_iter_new(self._handle(), ctypes.byref(args), int(page), ctypes.byref(it)))
        return _ScanIter(self, it, keys_only, timeout_ms)

    def keys(self, prefix=b"", limit=0, timeout_ms=None):
        """The keys that start with prefix, in key order (a list)."""
        return [k for k, _ in self.scan(prefix=prefix, limit=limit, keys_only=True,
                                        timeout_ms=timeout_ms)]

    # -- admin -------------------------------------------------------------

    @staticmethod
    def _flags(wait, extra=0):
        return (WAIT if wait else 0) | extra

    def join(self, address, wait=False, no_rebalance=False, timeout_ms=None):
        """Registers the server at address; returns {"epoch", "node_id", ...}."""
        r = _AdminResult()
        with _Deadline(timeout_ms):
            _check(_join(self._handle(), address.encode(),
                         self._flags(wait, NO_REBALANCE if no_rebalance else 0),
                         ctypes.byref(r)))
        return _admin_dict(r)

    def leave(self, node, wait=False, timeout_ms=None):
        """Drains and removes node (an id or an address)."""
        r = _AdminResult()
        with _Deadline(timeout_ms):
            _check(_leave(self._handle(), str(node).encode(), self._flags(wait),
                          ctypes.byref(r)))
        return _admin_dict(r)

    def remove(self, node, accept_data_loss=False, timeout_ms=None):
        """Forgets a down node; returns the admin result with "ranges_lost"."""
        r = _AdminResult()
        lost = _u32()
        with _Deadline(timeout_ms):
            _check(_remove(self._handle(), str(node).encode(),
                           ACCEPT_DATA_LOSS if accept_data_loss else 0, ctypes.byref(r),
                           ctypes.byref(lost)))
        d = _admin_dict(r)
        d["ranges_lost"] = lost.value
        return d

    def move(self, start, end, node, rate_mb_s=0, wait=False, timeout_ms=None):
        """Gives [start, end) to node (id or address)."""
        s, e = _b(start), _b(end)
        r = _AdminResult()
        with _Deadline(timeout_ms):
            _check(_move(self._handle(), s, len(s), e, len(e), str(node).encode(),
                         int(rate_mb_s), self._flags(wait), ctypes.byref(r)))
        return _admin_dict(r)

    def move_plan(self, start, end, node, rate_mb_s=0, timeout_ms=None):
        """Dry run of move: the migrations it would start, nothing changed."""
        s, e = _b(start), _b(end)
        p = _P(_Plan)()
        with _Deadline(timeout_ms):
            _check(_move_plan(self._handle(), s, len(s), e, len(e), str(node).encode(),
                              int(rate_mb_s), ctypes.byref(p)))
        try:
            return _plan_dict(p)
        finally:
            _plan_free(p)

    def rebalance_plan(self, rate_mb_s=0, timeout_ms=None):
        """Dry run of rebalance: the migrations it would start, nothing changed."""
        p = _P(_Plan)()
        with _Deadline(timeout_ms):
            _check(_rebalance_plan(self._handle(), int(rate_mb_s), ctypes.byref(p)))
        try:
            return _plan_dict(p)
        finally:
            _plan_free(p)

    def cancel(self, migration_id, timeout_ms=None):
        """Cancels a migration that has not fenced yet."""
        r = _AdminResult()
        with _Deadline(timeout_ms):
            _check(_cancel(self._handle(), int(migration_id), ctypes.byref(r)))
        return _admin_dict(r)

    def rebalance(self, rate_mb_s=0, wait=False, timeout_ms=None):
        """Evens out data size across nodes."""
        r = _AdminResult()
        with _Deadline(timeout_ms):
            _check(_rebalance(self._handle(), int(rate_mb_s), self._flags(wait),
                              ctypes.byref(r)))
        return _admin_dict(r)

    def config(self, epoch=0, timeout_ms=None):
        """The configuration at epoch (0: the latest) as a dict: epoch, nodes,
        ranges, migrations."""
        cfg = _P(_Config)()
        with _Deadline(timeout_ms):
            _check(_config_get(self._handle(), int(epoch), ctypes.byref(cfg)))
        try:
            return _config_dict(cfg, False)
        finally:
            _config_free(cfg)

    def status(self, timeout_ms=None):
        """The latest configuration with live statistics ("stats" per node),
        migrations with progress and the controller replicas."""
        cfg = _P(_Config)()
        with _Deadline(timeout_ms):
            _check(_status(self._handle(), ctypes.byref(cfg)))
        try:
            return _config_dict(cfg, True)
        finally:
            _config_free(cfg)

    def locate(self, key, timeout_ms=None):
        """Where key lives: {"key", "start", "end", "node", "address",
        "state", "replicas", "insync", "leader_epoch", "epoch"}."""
        k = _b(key)
        cfg = self.config(timeout_ms=timeout_ms)
        for r in cfg["ranges"]:
            if k >= r["start"] and (not r["end"] or k < r["end"]):
                node = next((n for n in cfg["nodes"] if n["id"] == r["node"]), None)
                d = dict(r)
                d.update({"key": k, "address": node["address"] if node else None,
                          "state": node["state"] if node else "unknown",
                          "epoch": cfg["epoch"]})
                return d
        raise Unavailable(-8, "the cluster has no ranges yet (join a node)")


_fn_set_timeout = _fn("shardkv_set_timeout", None, _c, _u32)


class _ScanIter:
    """The iterator of Client.scan: (key, value) pairs, value b"" for a
    keys-only scan. Frees its cursor when exhausted, closed or collected."""

    def __init__(self, client, it, keys_only, timeout_ms):
        self._client = client  # keeps the handle open while iterating
        self._it = it
        self._keys_only = keys_only
        self._timeout_ms = timeout_ms

    def __iter__(self):
        return self

    def __next__(self):
        if self._it is None:
            raise StopIteration
        e = _P(_Entry)()
        with _Deadline(self._timeout_ms):
            rv = _iter_next(self._it, ctypes.byref(e))
            if rv < 0:
                _check(rv)
        if rv == 1:
            self.close()
            raise StopIteration
        ent = e.contents
        return (_out(ent.key) or b"", b"" if self._keys_only else (_out(ent.value) or b""))

    def close(self):
        it, self._it = self._it, None
        if it is not None:
            _iter_free(it)

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
