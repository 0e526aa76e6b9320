#!/usr/bin/env python3
"""The insider fuzzer's HTTP and ZeroMQ half (docs/operations.md, "The insider fuzzer"):
tenant B's principals and strangers against a real kvpool-indexer (its HTTP API and its
ZeroMQ input) or a real kvpool-master's HTTPS port, while tenant A's canary works and is
checked throughout.

    http_fuzz.py indexer --addr HOST:PORT --ca CA --pid PID --canary router-a=token:FILE \\
        --principal NAME=token:FILE|cert:CRT,KEY|wrong|none ... --zmq-writer NAME \\
        [--seconds N] [--seed N] [--dump DIR] [--rss-max-mib N] [--fds-max N]
    http_fuzz.py master --addr HOST:PORT (the HTTPS port) --master HOST:PORT (the control
        port) --ca CA --pid PID --canary alice=token:FILE --admin admin=token:FILE \\
        --principal ... [the same options]

Workers (processes of their own, so that the canary's timings are not the fuzzer's GIL):
each draws a principal of B (or a stranger: no credential, a wrong token) and a source
address (127.0.0.1, the canary's own, or another of 127.0.0.0/8: a peer of its own), then
one of: a request to any route with any method, mutated JSON bodies (deep nesting, huge
numbers, long strings, wrong types, duplicate keys, NUL and control characters, invalid
UTF-8, truncated), mutated headers (Content-Length that lies, chunked, absurd header
sizes, bad Authorization), a request cut or trickled, a burst of connections, connections
held with an unfinished head or body (a head that alone can be refused, for no credential,
a wrong one or no role, must be answered before its body comes), and once a run a flood
of 1100 connections trickling a TLS ClientHello. With the indexer, one more worker is B's
publisher: it registers its own instances (and one naming A's publisher with its own
replay endpoint) and sends mutated KV event batches (vLLM's msgpack, array and map, and
the standardized envelope: random ops, huge counts, wrong types, clear/store floods,
frames and seqs that lie, a replay that forges, a replay that never answers).

A violation (exit status 1, with the seed and each worker's last requests in --dump):
a canary call over 1 s (unless the host's load explains the excess: HostLoad), failing
or answered otherwise than at the start; A's markers (its replay endpoint, its key names,
its tenant's series) in anything B received that B did not send itself, or an indexer
answer to B naming another tenant; a well-framed request of B's left unanswered for 10 s
with its connection open; the daemon gone, its RSS over --rss-max-mib or its descriptors
over --fds-max. The last line sums the run up.
"""

import argparse
import collections
import json
import multiprocessing
import os
import random
import socket
import ssl
import sys
import threading
import time
import urllib.parse

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

CANARY_MAX_S = 1.0
ANSWER_MAX_S = 10.0
BS = 16  # the canary's block size (tokens)
CURVE_KEY = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"  # a well-formed Z85 public key


# ---- principals ----

class Cred:
    """A principal's credential: a bearer token, a client certificate, a wrong token or
    none (a stranger)."""

    def __init__(self, name, spec):
        self.name = name
        self.token = self.cert = None
        kind, _, arg = spec.partition(":")
        if kind == "token":
            with open(arg) as f:
                self.token = f.read().strip()
        elif kind == "cert":
            self.cert = tuple(arg.split(",", 1))
        elif kind == "wrong":
            self.token = "wrong-" + os.urandom(12).hex()
        elif kind != "none":
            raise SystemExit(f"bad principal {name}={spec}")
        self.spec = spec

    def ctx(self, ca):
        c = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        c.load_verify_locations(ca)
        if self.cert:
            c.load_cert_chain(*self.cert)
        return c


def parse_principal(s):
    name, _, spec = s.partition("=")
    return Cred(name, spec)


# ---- HTTP over TLS, by hand ----

def connect(addr, ctx, src="127.0.0.1", timeout=10.0, handshake=True):
    host, port = addr.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=timeout,
                                   source_address=(src, 0))
    if not handshake:
        return raw
    try:
        return ctx.wrap_socket(raw, server_hostname=host)
    except BaseException:
        raw.close()
        raise


def read_answer(s, deadline, head_only=False):
    """(status or None, raw bytes, how): one HTTP answer read until complete, the peer's
    close ("closed") or the deadline ("timeout")."""
    buf = b""

    def more():
        nonlocal buf
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()
        s.settimeout(left)
        chunk = s.recv(65536)
        if not chunk:
            raise EOFError()
        buf += chunk

    try:
        while b"\r\n\r\n" not in buf:
            more()
        head, _, body = buf.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        hdrs = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(b":")
            hdrs[k.strip().lower()] = v.strip()
        if head_only or status in (204, 304) or (status or 0) < 200:
            return status, buf, "done"
        if b"content-length" in hdrs:
            n = int(hdrs[b"content-length"])
            while len(buf) - len(head) - 4 < n:
                more()
        elif b"chunked" in hdrs.get(b"transfer-encoding", b"").lower():
            while not buf.endswith(b"0\r\n\r\n"):
                more()
        else:
            try:
                while True:
                    more()
            except EOFError:
                pass
        return status, buf, "done"
    except EOFError:
        return (None if b"\r\n\r\n" not in buf else _status(buf)), buf, "closed"
    except socket.timeout:
        return None, buf, "timeout"
    except (ssl.SSLError, OSError):
        return None, buf, "closed"


def _status(buf):
    parts = buf.split(b"\r\n", 1)[0].split(b" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None


def request_bytes(method, path, body=b"", headers=None, token=None, close=True):
    h = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1"]
    if token is not None:
        h.append(f"Authorization: Bearer {token}")
    if body or method in ("POST", "PUT"):
        h.append(f"Content-Length: {len(body)}")
        h.append("Content-Type: application/json")
    if close:
        h.append("Connection: close")
    for k, v in (headers or {}).items():
        h.append(f"{k}: {v}")
    return ("\r\n".join(h) + "\r\n\r\n").encode("latin-1", "replace") + body


def https(addr, ctx, method, path, body=None, token=None, src="127.0.0.1", timeout=10.0):
    """(status, parsed JSON or text, seconds) of one request on a fresh TLS connection."""
    t0 = time.monotonic()
    data = b"" if body is None else json.dumps(body).encode()
    with connect(addr, ctx, src, timeout) as s:
        s.sendall(request_bytes(method, path, data, token=token))
        status, raw, how = read_answer(s, t0 + timeout, head_only=method == "HEAD")
    dt = time.monotonic() - t0
    text = raw.partition(b"\r\n\r\n")[2].decode("utf-8", "replace")
    if status is not None and text[:1] in "{[":
        try:
            return status, json.loads(text), dt
        except ValueError:
            pass
    return status, text, dt


# ---- the daemon's resources ----

class Monitor(threading.Thread):
    """Samples the daemon's RSS and descriptors every 50 ms; a violation past the caps or
    when it is gone."""

    def __init__(self, pid, rss_max_mib, fds_max, violate, stop):
        super().__init__(daemon=True)
        self.pid, self.rss_max, self.fds_max = pid, rss_max_mib << 10, fds_max
        self.violate, self.stop = violate, stop
        self.max_rss = self.max_fds = 0

    def sample(self):
        try:
            with open(f"/proc/{self.pid}/status") as f:
                st = f.read()
            if "\nState:\tZ" in st:
                raise FileNotFoundError
            rss = int(st.split("VmRSS:")[1].split()[0])
            fds = len(os.listdir(f"/proc/{self.pid}/fd"))
        except (FileNotFoundError, ProcessLookupError, IndexError):
            self.violate(f"the daemon (pid {self.pid}) is gone")
            return False
        self.max_rss, self.max_fds = max(self.max_rss, rss), max(self.max_fds, fds)
        if rss > self.rss_max:
            self.violate(f"the daemon's RSS {rss >> 10} MiB is over {self.rss_max >> 10} MiB")
        if fds > self.fds_max:
            self.violate(f"the daemon holds {fds} descriptors, over {self.fds_max}")
        return True

    def run(self):
        while not self.stop.is_set() and self.sample():
            time.sleep(0.05)


class HostLoad:
    """What the host's other load took from a canary call: the run-queue wait (schedstat's
    second field) of the daemon's thread that waited most, plus the canary thread's own,
    over the call. A call over CANARY_MAX_S whose excess that wait accounts for was slowed
    by a busy machine (other builds and tests on two cores), not by B: it is counted and
    shown, and a violation only past CANARY_HARD_S."""

    def __init__(self, pid):
        self.pid = pid

    def _waits(self, pid):
        out = {}
        try:
            for tid in os.listdir(f"/proc/{pid}/task"):
                try:
                    with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                        out[tid] = int(f.read().split()[1])
                except (OSError, IndexError, ValueError):
                    pass
        except OSError:
            pass
        return out

    def snap(self):
        me = threading.get_native_id()
        try:
            with open(f"/proc/self/task/{me}/schedstat") as f:
                own = int(f.read().split()[1])
        except (OSError, IndexError, ValueError):
            own = 0
        return self._waits(self.pid), own

    @staticmethod
    def waited(a, b):
        """Seconds of run-queue wait between snapshots a and b."""
        d = max([b[0][t] - a[0].get(t, 0) for t in b[0]] or [0])
        return (d + b[1] - a[1]) / 1e9


CANARY_HARD_S = 5.0


def judge_slow(what, dt, load, s0, violate, known):
    """A canary call of dt seconds: a violation past CANARY_MAX_S unless host load explains
    the excess (then counted in known["slow under host load"]), always past CANARY_HARD_S."""
    if dt <= CANARY_MAX_S:
        return
    waited = HostLoad.waited(s0, load.snap())
    if dt - waited <= CANARY_MAX_S and dt <= CANARY_HARD_S:
        known["slow under host load"] += 1
        known["slowest under host load ms"] = max(known["slowest under host load ms"],
                                                  int(dt * 1000))
        return
    violate(f"canary {what} took {dt:.3f} s (from {time.time() - dt:.3f}; "
            f"{waited:.3f} s of it waiting for a CPU)")


# ---- mutations ----

HUGE_NUMBERS = ["1e999999", "18446744073709551616", "-9223372036854775809", "1.5e308",
                "-0", "0.0000000000000000000001", "99999999999999999999999999999999",
                "4294967296", "-1", "65536", "65537", "1" * 400, "NaN", "Infinity", "0x10",
                "01", "1e", "--1", "4294967295"]
ODD_STRINGS = ["", " ", "team-a", "team-a\u0000", "TEAM-A", "team-a ", "team-b\t",
               "default", "\u0000", "\x07\x1b[31m", "../../etc/passwd", "%00", "\ud800",
               "\u202e", "a" * 256, "a" * 70000, "tcp://127.0.0.1:1", "ipc:///tmp/x",
               "ipc://@abstract", "inproc://x", "tcp://[::1]:5", "tcp://10.255.255.1:1",
               "tcp://localhost:0", "tcp://*:9", "tcp://127.0.0.1:99999", "udp://x:1",
               "tcp://" + "a" * 300 + ":1"]


def deep(n, kind="["):
    return kind * n if kind == "[" else '{"a":' * n


def odd_value(rnd):
    k = rnd.randrange(8)
    if k == 0:
        return rnd.choice(HUGE_NUMBERS)
    if k == 1:
        return json.dumps(rnd.choice(ODD_STRINGS))
    if k == 2:
        return rnd.choice(["null", "true", "false", "[]", "{}", '""', "[[[[1]]]]",
                           '{"a":1}'])
    if k == 3:
        return "[" + ",".join(str(rnd.choice([0, 1, 2**32 - 1, 2**32, -1, 2**64]))
                              for _ in range(rnd.choice([1, 10, 1000, 30000]))) + "]"
    if k == 4:
        return deep(rnd.choice([33, 100, 5000, 200000]))
    if k == 5:
        return '"' + "\\u0000" * rnd.randrange(1, 64) + '"'
    if k == 6:
        return '"' + rnd.choice(["\\ud800", "\\udc00x", "\\uZZZZ", "\\", "\\x41"]) + '"'
    return str(rnd.randrange(-2**70, 2**70))


def mutate_json(rnd, base):
    """Bytes of a body built from the dict base and mutated."""
    k = rnd.randrange(16)
    d = dict(base)
    if k == 0:  # valid, unchanged
        return json.dumps(d).encode()
    if k == 1:  # a field of an odd value
        key = rnd.choice(list(d) + ["extra", "tenant_id", "x" * 300])
        parts = [f"{json.dumps(a)}:{json.dumps(b)}" for a, b in d.items() if a != key]
        parts.append(f"{json.dumps(key)}:{odd_value(rnd)}")
        rnd.shuffle(parts)
        return ("{" + ",".join(parts) + "}").encode("utf-8", "surrogatepass")
    if k == 2:  # a field left out
        if d:
            d.pop(rnd.choice(list(d)))
        return json.dumps(d).encode()
    if k == 3:  # duplicate keys, the second naming tenant A or an odd value
        key = rnd.choice(list(d) or ["tenant_id"])
        return (json.dumps(d)[:-1] + f',{json.dumps(key)}:'
                + rnd.choice(['"team-a"', odd_value(rnd)]) + "}").encode()
    if k == 4:  # deep nesting
        n = rnd.choice([31, 32, 33, 64, 10000, 1 << 20])
        return (deep(n, rnd.choice(["[", "{"])) + ("]" * n if rnd.random() < 0.5 else "")).encode()
    if k == 5:  # truncated
        b = json.dumps(d).encode()
        return b[:rnd.randrange(len(b) + 1)]
    if k == 6:  # raw invalid UTF-8 and control bytes in a string
        b = json.dumps(d).encode()
        bad = rnd.choice([b"\xff\xfe", b"\xc0\xaf", b"\xed\xa0\x80", b"\x00", b"\x01\x1f",
                          b"\xf8\x88\x80\x80\x80", b"\x80"])
        i = b.find(b'"', 1)
        return b[:i + 1] + bad + b[i + 1:] if i > 0 else bad + b
    if k == 7:  # a long string
        key = rnd.choice(list(d) or ["instance_id"])
        d[key] = "x" * rnd.choice([255, 256, 4096, 1 << 20])
        return json.dumps(d).encode()
    if k == 8:  # not an object
        return rnd.choice([b"", b"null", b"[]", b"1", b'"x"', b"{", b"}", b"\x00" * 16,
                           os.urandom(rnd.randrange(1, 512)), b"{}" * 1000, b"{} {}"])
    if k == 9:  # many keys (the token cap)
        n = rnd.choice([1000, 100000])
        return ("{" + ",".join(f'"k{i}":{i}' for i in range(n)) + "}").encode()
    if k == 10:  # whitespace, comments, trailing commas
        return rnd.choice([b" " * 100000 + json.dumps(d).encode(),
                           json.dumps(d).encode()[:-1] + b",}",
                           b"/*c*/" + json.dumps(d).encode(),
                           json.dumps(d).encode() + b"garbage"])
    if k == 11:  # wrong types for every field
        return json.dumps({a: rnd.choice([[b], {"v": b}, None, True, 1.5, str(b)])
                           for a, b in d.items()}).encode()
    if k == 12:  # numbers as floats and exponents
        return json.dumps({a: (float(b) if isinstance(b, int) else b)
                           for a, b in d.items()}).encode().replace(b".0", b"e0")
    return json.dumps(d).encode()


def mutate_headers(rnd, req, body):
    """The request's bytes with its headers mutated: (bytes, well_framed)."""
    head, _, _ = req.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    k = rnd.randrange(14)
    framed = True
    drop_cl = [ln for ln in lines if not ln.lower().startswith(b"content-length")]
    if k == 0:  # Content-Length says more than sent
        lines = drop_cl + [b"Content-Length: %d" % (len(body) + rnd.choice([1, 100, 1 << 24,
                                                                           1 << 30]))]
        framed = False
    elif k == 1:  # ... less (the rest is a second, garbled request)
        lines = drop_cl + [b"Content-Length: %d" % rnd.randrange(max(1, len(body)))]
        framed = False
    elif k == 2:  # absurd or two Content-Lengths
        lines = drop_cl + rnd.choice([[b"Content-Length: -1"], [b"Content-Length: abc"],
                                      [b"Content-Length: 99999999999999999999999"],
                                      [b"Content-Length: %d" % len(body),
                                       b"Content-Length: %d" % (len(body) + 5)]])
        framed = False
    elif k == 3:  # chunked
        chunks = b""
        i = 0
        while i < len(body):
            part = body[i:i + rnd.randrange(1, 4096)]
            chunks += b"%x\r\n" % len(part) + part + b"\r\n"
            i += len(part)
        end = rnd.choice([b"0\r\n\r\n", b"ffffffffffffffff\r\n", b"zz\r\n", b"0\r\nX: y\r\n\r\n"])
        framed = end in (b"0\r\n\r\n", b"0\r\nX: y\r\n\r\n")
        lines = [ln for ln in drop_cl if not ln.lower().startswith(b"connection")]
        lines += [b"Transfer-Encoding: chunked", b"Connection: close"]
        return b"\r\n".join(lines) + b"\r\n\r\n" + chunks + end, framed
    elif k == 4:  # a huge header
        lines.append(b"X-Big: " + b"a" * rnd.choice([8000, 60000, 70000, 1 << 20]))
        framed = False  # 431 or closed, both fine
    elif k == 5:  # many headers
        lines += [b"X-H%d: v" % i for i in range(rnd.choice([100, 1000, 10000]))]
        framed = False
    elif k == 6:  # bad Authorization
        lines = [ln for ln in lines if not ln.lower().startswith(b"authorization")]
        lines.append(b"Authorization: " + rnd.choice([
            b"Bearer", b"Bearer ", b"Basic dXNlcjpwYXNz", b"Bearer " + b"t" * 1024,
            b"Bearer " + b"t" * 60000, b"bearer x", b"Bearer a b", b"Bearer \x00tok",
            b"Bearer \xff\xfe", b"Negotiate x", b"Bearer  " + os.urandom(8).hex().encode()]))
        if rnd.random() < 0.3:
            lines.append(b"Authorization: Bearer second")
        framed = not any(b"60000" in ln or len(ln) > 50000 or b"\x00" in ln for ln in lines)
    elif k == 7:  # HTTP/1.0, HTTP/2.0, HTTP/9
        lines[0] = lines[0].rsplit(b" ", 1)[0] + b" " + rnd.choice(
            [b"HTTP/1.0", b"HTTP/2.0", b"HTTP/9.9", b"HTTP/1.1 x", b"http/1.1"])
        framed = False
    elif k == 8:  # a garbled request line
        lines[0] = rnd.choice([b"GET", b"", b"GET /\x00 HTTP/1.1", b"\x16\x03\x01",
                               b"GET " + b"/" * 70000 + b" HTTP/1.1", os.urandom(40)])
        framed = False
    elif k == 9:  # Expect: 100-continue
        lines.append(b"Expect: 100-continue")
    elif k == 10:  # header folding, odd separators
        lines.append(rnd.choice([b" folded", b"NoColon", b"X-A:\x00b", b": empty",
                                 b"X-A : b"]))
        framed = False
    elif k == 11:  # keep-alive and a second request pipelined
        lines = [ln for ln in lines if not ln.lower().startswith(b"connection")]
        return b"\r\n".join(lines) + b"\r\n\r\n" + body + req, False
    elif k == 12:  # a bare LF head
        return b"\n".join(lines) + b"\n\n" + body, False
    return b"\r\n".join(lines) + b"\r\n\r\n" + body, framed


def random_path(rnd, routes):
    k = rnd.randrange(10)
    p = rnd.choice(routes)
    if k < 6:
        return p
    return rnd.choice([p + "/", p.upper(), "/" + p, p + "?x=" + "y" * 5000, p + "%00",
                       p + "#f", "/", "*", "/../" + p, "/" + "a" * 3000, "/%2e%2e/",
                       "/no/such", p + "?" + "&".join(f"k{i}=v" for i in range(500)),
                       p.replace("/", "%2F")])


METHODS = ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH", "TRACE", "CONNECT",
           "get", "PoSt", "X" * 200, "GET\x00"]


# ---- a worker: one process of B's HTTP requests ----

class Worker:
    def __init__(self, wid, kind, args, shared, routes_fn, markers, stop, out):
        self.wid, self.kind, self.args, self.stop, self.out = wid, kind, args, stop, out
        self.rnd = random.Random(args.seed * 1000 + wid)
        self.creds = [parse_principal(p) for p in args.principal]
        self.creds += [Cred("stranger", "none"), Cred("wrong-token", "wrong")]
        self.ctxs = {c.name: c.ctx(args.ca) for c in self.creds}
        self.routes_fn = routes_fn
        self.markers = [(m.encode(), hard) for m, hard in markers]
        self.shared = shared
        self.last = collections.deque(maxlen=64)
        self.timeline = collections.deque(maxlen=4096)  # (time, what): to place a slow call
        self.flooded = False
        self.flood_at = time.monotonic() + args.seconds * 0.3
        self.stats = collections.Counter()

    def violate(self, msg):
        self.out.put(("violation", f"worker {self.wid}: {msg}"))

    def src(self):
        return "127.0.0.1" if self.rnd.random() < 0.3 else f"127.0.0.{self.rnd.randrange(2, 10)}"

    def check_leak(self, cred, sent, got):
        for m, hard in self.markers:
            if m not in got or m in sent:
                continue
            if not hard:  # a name, not data: counted and shown, not a violation
                if not self.stats[f"soft marker {m!r}"]:
                    self.last.append({"soft marker": m.decode(),
                                      "got": got[:2000].decode("latin-1")})
                self.stats[f"soft marker {m!r}"] += 1
                continue
            if m in got and m not in sent:
                self.violate(f"{cred.name} received tenant A's marker {m!r} it did not send:"
                             f" request {sent[:600]!r} -> {got[:1500]!r}")

    def check_tenants(self, cred, sent, got):
        """An indexer's answer to B names B's tenant only: /instances lists team-b's
        registrations, /query answers under "team-b"."""
        try:
            a = json.loads(got.partition(b"\r\n\r\n")[2])
        except ValueError:
            return
        if not isinstance(a, dict):
            return
        bad = [i for i in a.get("instances", []) if i.get("tenant_id") != "team-b"]
        if bad or "team-a" in a:
            self.violate(f"{cred.name} was answered another tenant's: request {sent[:600]!r}"
                         f" -> {got[:1500]!r}")

    def one(self):
        rnd = self.rnd
        cred = rnd.choice(self.creds)
        method, path, body_obj = self.routes_fn(rnd, self.shared)
        if rnd.random() < 0.15:
            method = rnd.choice(METHODS)
        if rnd.random() < 0.2:
            path = random_path(rnd, [path.split("?")[0]])
        body = b"" if body_obj is None else (
            mutate_json(rnd, body_obj) if rnd.random() < 0.7 else json.dumps(body_obj).encode())
        req = request_bytes(method, path, body, token=cred.token)
        framed = True
        if rnd.random() < 0.35:
            req, framed = mutate_headers(rnd, req, body)
        mode = rnd.choices(["whole", "cut", "trickle", "burst", "hold", "bodyhold", "flood"],
                           [70, 8, 6, 3, 2, 2, 0.2])[0]
        if self.wid == 0 and not self.flooded and time.monotonic() > self.flood_at:
            mode = "flood"  # at least one per run
        self.stats[f"mode {mode}"] += 1
        self.timeline.append((round(time.time(), 3), mode, cred.name, path[:40]))
        self.last.append({"who": cred.name, "mode": mode, "req": req[:4096].decode("latin-1")})
        if mode == "burst":
            return self.burst(cred)
        if mode == "flood":
            return self.flood()
        if mode in ("hold", "bodyhold"):
            return self.hold(cred, mode == "bodyhold")
        t0 = time.monotonic()
        try:
            s = connect(self.args.addr, self.ctxs[cred.name], self.src(), 10.0)
        except (OSError, ssl.SSLError) as e:
            self.stats[f"connect failed {type(e).__name__}"] += 1
            return
        with s:
            try:
                if mode == "cut":
                    s.sendall(req[:rnd.randrange(len(req))])
                    if rnd.random() < 0.5:
                        s.shutdown(socket.SHUT_WR)
                    framed = False
                elif mode == "trickle":
                    i = 0
                    end = time.monotonic() + rnd.uniform(0.2, 2.0)
                    while i < len(req) and time.monotonic() < end:
                        n = rnd.randrange(1, 8)
                        s.sendall(req[i:i + n])
                        i += n
                        time.sleep(rnd.uniform(0, 0.05))
                    if i < len(req):
                        s.sendall(req[i:])
                else:
                    s.sendall(req)
            except (OSError, ssl.SSLError):
                self.stats["closed while sending"] += 1
                return
            wait = ANSWER_MAX_S if framed else rnd.uniform(0.05, 1.0)
            status, got, how = read_answer(s, time.monotonic() + wait,
                                           head_only=method == "HEAD")
        self.stats[f"answer {status}"] += 1
        self.stats[f"route {path.split('?')[0][:24]}"] += 1
        if got:
            self.check_leak(cred, req, got)
            if self.kind == "indexer" and status == 200:
                self.check_tenants(cred, req, got)
        if framed and how == "timeout" and mode == "whole" and status is None:
            self.violate(f"{cred.name}'s well-framed request unanswered for "
                         f"{time.monotonic() - t0:.1f} s: {req[:600]!r}")
        if status is not None and status >= 500 and status not in (503, 505):
            self.stats["5xx"] += 1
            self.last.append({"note": f"status {status}", "got": got[:1000].decode("latin-1")})
        if self.kind == "indexer" and status is not None and status >= 400 and \
                got.partition(b"\r\n\r\n")[2][:1] not in (b"{", b""):
            if not self.stats[f"non-JSON refusal {status}"]:
                self.last.append({"non-JSON refusal": got[:1000].decode("latin-1")})
            self.stats[f"non-JSON refusal {status}"] += 1

    def burst(self, cred):
        """A burst of connections: some complete a handshake, some never start it."""
        socks = []
        src = self.src()
        n = self.rnd.choice([16, 64, 128])
        for _ in range(n):
            try:
                socks.append(connect(self.args.addr, self.ctxs[cred.name], src, 5.0,
                                     handshake=self.rnd.random() < 0.3))
            except (OSError, ssl.SSLError):
                self.stats["burst refused"] += 1
        time.sleep(self.rnd.uniform(0.1, 1.0))
        for s in socks:
            s.close()
        self.stats["burst connections"] += len(socks)

    def flood(self):
        """More connections than the server holds (1100, from eight addresses of their own),
        each trickling the first bytes of a TLS ClientHello for 4 s: the canary, from its own
        address, must still get in (a slowloris on the whole pool)."""
        self.flooded = True
        try:
            import resource
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4096)), hard))
        except (ImportError, ValueError, OSError):
            pass
        socks = []
        for i in range(1100):
            try:
                s = connect(self.args.addr, None, f"127.0.0.{2 + i % 8}", 2.0, handshake=False)
                s.sendall(b"\x16\x03\x01")
                socks.append(s)
            except OSError:
                self.stats["flood refused"] += 1
        hello = b"\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(32)
        for j in range(8):
            if self.stop.is_set():
                break
            for s in socks:
                try:
                    s.sendall(hello[j:j + 1])
                except OSError:
                    pass
            time.sleep(0.5)
        for s in socks:
            s.close()
        self.stats["flood connections"] += len(socks)

    def hold(self, cred, body):
        """Connections held with an unfinished head (a byte now and then) or, body=True,
        most of a large body sent before any credential is checked."""
        socks = []
        src = self.src()
        n = self.rnd.choice([4, 8, 16]) if body else self.rnd.choice([16, 64, 128])
        size = self.rnd.choice([16 << 20, (16 << 20) - 1, 4 << 10])
        sent = 0
        # a principal the server can refuse from the head alone: no credential, a wrong
        # one, no role at all; its body must never be read (answered before it comes)
        early = cred.token is None and cred.cert is None or cred.name in ("wrong-token",
                                                                          "b-none")
        for i in range(n):
            try:
                s = connect(self.args.addr, self.ctxs[cred.name], src, 5.0)
                if body:
                    path = self.rnd.choice(self.args.post_paths)
                    req = request_bytes("POST" if "quota" not in path else "PUT", path,
                                        token=cred.token, close=False)
                    req = req.replace(b"Content-Length: 0", b"Content-Length: %d" % size)
                    s.sendall(req)
                    # (the master reads a quota body of at most 4 KiB before it looks at the
                    # credential, on its loop: bounded, and its documented behaviour)
                    if early and i == 0 and (self.kind == "indexer" or size > 4096):
                        self.refused_from_head(cred, s, req)
                    chunk = b" " * (64 << 10)
                    s.settimeout(2.0)
                    for _ in range(self.rnd.choice([1, 4])):
                        s.sendall(chunk)
                        sent += len(chunk)
                else:
                    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
                socks.append(s)
            except (OSError, ssl.SSLError):
                self.stats["hold refused"] += 1
        end = time.monotonic() + self.rnd.uniform(1.0, 4.0)
        while time.monotonic() < end and not self.stop.is_set():
            for s in socks:
                try:
                    s.sendall(b"X-T: 1\r\n" if not body else b" ")
                except (OSError, ssl.SSLError):
                    pass
            time.sleep(0.5)
        for s in socks:
            s.close()
        self.stats["held connections"] += len(socks)
        self.stats["held body bytes"] += sent

    def refused_from_head(self, cred, s, req):
        """A request whose head alone is refusable (no credential, a wrong one, no role)
        is answered before any byte of its body: else a stranger's body is being read."""
        status, got, how = read_answer(s, time.monotonic() + 3.0, head_only=True)
        self.stats[f"refused from the head {status}"] += 1
        if status is None and how == "timeout":
            self.violate(f"{cred.name}'s request was not refused from its head: its body is "
                         f"being waited for (3 s): {req[:400]!r}")

    def run(self):
        end = time.monotonic() + self.args.seconds
        try:
            while time.monotonic() < end and not self.stop.is_set():
                self.stats["requests"] += 1
                try:
                    self.one()
                except (OSError, ssl.SSLError) as e:
                    self.stats[f"error {type(e).__name__}"] += 1
        finally:
            if self.args.dump:
                with open(os.path.join(self.args.dump, f"http-fuzz-worker{self.wid}.json"),
                          "w") as f:
                    json.dump({"last": list(self.last), "timeline": list(self.timeline)}, f,
                              indent=1)
            self.out.put(("stats", dict(self.stats)))


# ---- the indexer ----

def indexer_routes(rnd, shared):
    """(method, path, body) of a request of B's to the indexer, before mutation."""
    model = rnd.choice([shared["model_a"], "m-b", ""])
    inst = rnd.choice([shared["inst_a"], f"b-{rnd.randrange(64)}", "x" * 300])
    ep = rnd.choice([shared["ep_a"], "tcp://127.0.0.1:%d" % rnd.randrange(1, 65536),
                     rnd.choice(ODD_STRINGS)])
    tenant = rnd.choice([None, None, "team-b", "team-a", "", "default", "TEAM-B"])
    k = rnd.randrange(7)
    body = None
    if k == 0:
        path = "/register"
        body = {"endpoint": ep, "replay_endpoint": rnd.choice([shared["ep_b"], ep]),
                "type": rnd.choice(["vLLM", "SGLang", "kvpool", "Mooncake", "x"]),
                "modelname": model, "instance_id": inst,
                "block_size": rnd.choice([16, 1, 0, 65537]),
                "dp_rank": rnd.choice([0, 1, 65535, 65536, -1])}
        if rnd.random() < 0.2:
            body["curve_server_key"] = rnd.choice(["a" * 40, "", "x" * 41, CURVE_KEY])
    elif k == 1:
        path = "/unregister"
        body = {"instance_id": inst}
        if rnd.random() < 0.5:
            body["dp_rank"] = rnd.choice([0, 1, -1])
    elif k in (2, 3):
        path = rnd.choice(["/query", "/query_by_hash"])
        toks = rnd.choice([shared["tokens_a"], shared["tokens_f"],
                           [rnd.randrange(2**32) for _ in range(64)]])
        body = {"model": model, "block_size": BS, "token_ids": toks}
        if path == "/query_by_hash":
            body = {"model": model, "block_size": BS,
                    "seq_hashes": [rnd.randrange(2**64) for _ in range(rnd.choice([1, 100]))]}
        if rnd.random() < 0.3:
            body["instance_id"] = inst
        if rnd.random() < 0.2:
            body["lora_id"] = rnd.choice([-1, 0, 2**63, "x"])
    elif k == 4:
        path = "/instances"
    elif k == 5:
        path = rnd.choice(["/health", "/metrics"])
    else:
        path = random_path(rnd, ["/register", "/query", "/instances", "/nope", "/query_by_hash"])
    if body is not None and tenant is not None:
        body["tenant_id"] = tenant
    return ("GET" if body is None else "POST"), path, body


def standard_tokens(seed, nblocks):
    r = random.Random(seed)
    return [r.randrange(2**31) for _ in range(nblocks * BS)]


class IndexerCanary(threading.Thread):
    """Tenant A: registers once, publishes a known prefix, then queries it throughout."""

    def __init__(self, args, shared, violate, stop):
        super().__init__(daemon=True)
        self.args, self.shared, self.violate, self.stop = args, shared, violate, stop
        self.cred = parse_principal(args.canary)
        self.ctx = self.cred.ctx(args.ca)
        self.ops = 0
        self.slowest = 0.0
        self.late_ok = None
        self.known = collections.Counter()
        self.load = HostLoad(args.pid)

    def call(self, method, path, body=None, what=""):
        s0 = self.load.snap()
        try:
            status, a, dt = https(self.args.addr, self.ctx, method, path, body,
                                  self.cred.token, timeout=5.0)
        except (OSError, ssl.SSLError) as e:
            self.violate(f"canary {what or path}: {type(e).__name__}: {e}")
            return None, None
        self.ops += 1
        self.slowest = max(self.slowest, dt)
        judge_slow(what or path, dt, self.load, s0, self.violate, self.known)
        if status != 200:
            self.violate(f"canary {what or path}: status {status}: {str(a)[:500]}")
        return status, a

    def query(self, model, tokens):
        return self.call("POST", "/query", {"model": model, "block_size": BS,
                                            "token_ids": tokens}, f"query {model}")[1]

    def register(self, pub, inst, model):
        self.call("POST", "/register", {"endpoint": pub.endpoint, "replay_endpoint":
                                        pub.replay_endpoint, "type": "vLLM", "modelname": model,
                                        "instance_id": inst, "block_size": BS, "dp_rank": 0},
                  f"register {inst}")

    def publish_prefix(self, pub, tokens, seed):
        from vllm_publisher import stored
        r = random.Random(seed)
        hashes = [r.randrange(1, 2**63) for _ in range(len(tokens) // BS)]
        pub.publish([stored(hashes, None, tokens, block_size=BS)])

    def setup(self):
        from vllm_publisher import Publisher
        sh = self.shared
        self.pub = Publisher(block_size=BS)
        self.register(self.pub, sh["inst_a"], sh["model_a"])
        self.pub.wait_subscribed()
        self.publish_prefix(self.pub, sh["tokens_a"], 1)
        deadline = time.monotonic() + 10
        want = len(sh["tokens_a"])
        while True:
            a = self.query(sh["model_a"], sh["tokens_a"])
            try:
                if a["team-a"][sh["inst_a"]]["longest_matched"] == want:
                    break
            except (KeyError, TypeError):
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"the canary's prefix never answered: {a}")
            time.sleep(0.02)
        self.baseline = a
        _, inst = self.call("GET", "/instances")
        self.instances = self.pubs_of(inst)

    @staticmethod
    def pubs_of(inst):
        return sorted((i["instance_id"], i["tenant_id"], p["endpoint"], p["replay_endpoint"],
                       p["type"]) for i in inst["instances"] for p in i["publishers"])

    def late_registration(self):
        """A second registration of A's once B has registered what it could: it must be
        answered at once and subscribed (a registration that cannot be served is refused,
        never a silent 200)."""
        from vllm_publisher import Publisher
        sh = self.shared
        self.pub2 = Publisher(block_size=BS)
        self.register(self.pub2, sh["inst_a"] + "-late", sh["model_a"] + "-late")
        try:
            self.pub2.wait_subscribed(timeout=5)
        except AssertionError as e:
            self.violate(f"canary's late registration never subscribed: {e}")
            return
        self.publish_prefix(self.pub2, sh["tokens_a"], 2)
        self.late_ok = time.monotonic() + 5  # the deadline for its answer
        self.instances = None

    def round(self, i):
        sh = self.shared
        a = self.query(sh["model_a"], sh["tokens_a"])
        if a is not None and a != self.baseline:
            self.violate(f"canary's prefix answered {json.dumps(a)[:800]}, "
                         f"not {json.dumps(self.baseline)[:800]}")
        f = self.query(sh["model_a"], sh["tokens_f"])
        if f is not None and any(v.get("longest_matched") for v in f.get("team-a", {}).values()):
            self.violate(f"B's forged prefix answered as tenant A's: {json.dumps(f)[:800]}")
        if f is not None and set(f) != {"team-a"}:
            self.violate(f"a query of A's answered another tenant: {json.dumps(f)[:800]}")
        if i % 5 == 0:
            self.call("GET", "/health")
            _, inst = self.call("GET", "/instances")
            if inst is not None:
                now = self.pubs_of(inst)
                if self.instances is None and self.late_ok is not None:
                    self.instances = now
                if self.instances is not None and now != self.instances:
                    self.violate(f"A's registrations changed: {now} (were {self.instances})")
        if self.late_ok is not None:
            b = self.query(sh["model_a"] + "-late", sh["tokens_a"])
            if b is None:
                return
            got = ((b or {}).get("team-a", {}).get(sh["inst_a"] + "-late", {})
                   .get("longest_matched"))
            if got == len(sh["tokens_a"]):
                self.late_ok = 0.0 if self.late_ok else self.late_ok
            elif self.late_ok == 0.0 or time.monotonic() > self.late_ok:
                self.violate(f"the late registration's prefix answered {json.dumps(b)[:500]}")
                self.late_ok = None
        if i % 40 == 20:
            # a batch shown only to the replay ring: the next shows a gap, the indexer asks
            # A's replay endpoint (B's, if B could rewrite it), then the same blocks again
            from vllm_publisher import stored
            r = random.Random(1)
            hashes = [r.randrange(1, 2**63) for _ in range(len(sh["tokens_a"]) // BS)]
            self.pub.publish([stored(hashes, None, sh["tokens_a"], block_size=BS)], pub=False)
            self.pub.publish([])

    def run(self):
        i = 0
        half = time.monotonic() + self.args.seconds / 2
        try:
            while not self.stop.is_set():
                if self.late_ok is None and self.instances is not None and \
                        time.monotonic() > half and not hasattr(self, "pub2"):
                    self.late_registration()
                self.round(i)
                i += 1
                time.sleep(0.02)
        except Exception as e:  # noqa: BLE001 - any failure of the canary is a violation
            self.violate(f"canary: {type(e).__name__}: {e}")


def zmq_worker(args, shared, stop, out):
    """B's publishers: register B's instances (one naming A's publisher with B's replay
    endpoint) and send mutated KV event batches."""
    from vllm_publisher import Publisher, cleared, envelope, removed, stored
    rnd = random.Random(args.seed * 1000 + 999)
    cred = next(parse_principal(p) for p in args.principal
                if p.split("=", 1)[0] == args.zmq_writer)
    ctx = cred.ctx(args.ca)
    stats = collections.Counter()
    pubs = [Publisher(block_size=BS, encoding=e) for e in ("array", "map", "array")]
    # a replay endpoint that reads requests and never answers: the indexer's replays of it
    # end at --replay-timeout while A's registrations and queries go on (left out with
    # --known replay-stall, for an indexer that still waits on it)
    pubs[2].replay_mute = "replay-stall" not in args.known
    timeline = collections.deque(maxlen=4096)

    def reg(body):
        try:
            st, a, _ = https(args.addr, ctx, "POST", "/register", body, cred.token)
        except (OSError, ssl.SSLError):
            st, a = None, None
        stats[f"register {st}"] += 1
        if st is not None and st != 200 and not (isinstance(a, dict) and a.get("error")):
            out.put(("violation", f"zmq: /register refused without a JSON error: {st} {a!r}"))
        return st

    for i, p in enumerate(pubs):
        reg({"endpoint": p.endpoint, "replay_endpoint": p.replay_endpoint, "type": "vLLM",
             "modelname": shared["model_a"], "instance_id": f"b-pub-{i}", "block_size": BS,
             "dp_rank": 0})
    # the hijack: A's publisher, B's replay endpoint (whose ring forges a clear and B's blocks)
    reg({"endpoint": shared["ep_a"], "replay_endpoint": pubs[0].replay_endpoint, "type": "vLLM",
         "modelname": shared["model_a"], "instance_id": "b-hijack", "block_size": BS,
         "dp_rank": 0, "tenant_id": rnd.choice(["team-b", "team-a"])})
    forged = [stored([rnd.randrange(2**63) for _ in range(len(shared["tokens_f"]) // BS)], None,
                     shared["tokens_f"], block_size=BS)]
    for p in pubs:
        try:
            p.wait_subscribed(timeout=5)
        except AssertionError:
            stats["never subscribed"] += 1
    pubs[0].buffer.extend((s, pubs[0].encode([cleared()] + forged)) for s in range(0, 4096, 64))
    end = time.monotonic() + args.seconds
    churn = 0
    while time.monotonic() < end and not stop.is_set():
        p = rnd.choice(pubs)
        k = rnd.randrange(14)
        stats[f"batch kind {k}"] += 1
        timeline.append((round(time.time(), 3), k))
        try:
            if k == 0:  # the forged prefix, in B's own tenant
                p.publish(forged)
            elif k == 1:  # a flood of unique blocks (eviction pressure)
                n = rnd.choice([512, 2048, 8192])
                p.publish([stored([rnd.randrange(2**63) for _ in range(n)], None, None,
                                  block_size=BS)])
                stats["flood blocks"] += n
            elif k == 2:  # [stored, cleared] pairs
                n = rnd.choice([100, 2500])
                p.publish([stored([rnd.randrange(2**63)], None, None, block_size=BS),
                           cleared()] * n)
            elif k == 3:  # envelopes naming tenant A
                p.publish([envelope(rnd.choice(["stored", "removed", "cleared"]),
                                    [rnd.randrange(2**63) for _ in range(8)],
                                    tenant_id=rnd.choice(["team-a", "team-b", "default", ""]),
                                    token_ids=shared["tokens_f"][:8 * BS], block_size=BS,
                                    model_name=shared["model_a"])])
            elif k == 4:  # removes of hashes anyone might hold
                p.publish([removed([rnd.randrange(2**64) for _ in range(64)],
                                   medium=rnd.choice([None, "cpu", "disk", "x" * 40]))])
            elif k == 5:  # media past the cap
                p.publish([stored([rnd.randrange(2**63)], medium=f"m{rnd.randrange(100)}",
                                  block_size=BS) for _ in range(16)])
            elif k == 6:  # raw garbage payloads
                p.publish_raw(rnd.choice([os.urandom(rnd.randrange(1, 4096)), b"",
                                          b"\xdd\xff\xff\xff\xff" + b"\xc0" * 8,  # array32 lies
                                          b"\x92\xcb" + b"\x00" * 8 + b"\xdd\x7f\xff\xff\xff",
                                          b"\x91" * 100000 + b"\xc0",  # deep nesting
                                          b"\x92\x00\x90" + b"trailing"]))
            elif k == 7:  # wrong types in events
                ev = rnd.choice([["BlockStored", "notalist"], ["BlockStored", [1.5, "x"], 0, 7],
                                 ["BlockStored", [b"\x00" * 100], None, [2**40]],
                                 ["BlockRemoved", {"a": 1}], ["Unknown", 1, 2], [1, 2, 3],
                                 {"type": "BlockStored", "block_hashes": [[1]]},
                                 {"event_type": "stored", "seq_hashes": "x"}, None, 7,
                                 ["BlockStored", [1] * 10, None, list(range(10 * BS)), 0]])
                import msgpack
                p.publish_raw(msgpack.packb([time.time(), [ev] * rnd.choice([1, 1000])],
                                            use_bin_type=True))
            elif k == 8:  # seq games: a gap, a restart, a duplicate
                g = rnd.randrange(3)
                if g == 0:
                    p.skip(rnd.choice([1, 1000, 2**40]))
                elif g == 1:
                    p.restart()
                else:
                    p.seq = max(0, p.seq - 1)
                p.publish(forged)
            elif k == 9:  # frames that lie
                import zmq
                p.pub.send_multipart(rnd.choice([[p.topic], [p.topic, b"\x00" * 3, b"x"],
                                                 [p.topic, b"\x00" * 8, b"x", b"y"],
                                                 [b"", b"\xff" * 8, b"\x90"]]), zmq.NOBLOCK)
            elif k == 10:  # a big batch of many events
                p.publish([stored([rnd.randrange(2**63)], block_size=BS)] * 20000)
            elif k == 11:  # churn: register and unregister endpoints that are not there
                churn += 1
                inst = f"b-churn-{churn % 32}"
                reg({"endpoint": f"tcp://127.0.0.1:{rnd.randrange(1024, 65536)}",
                     "type": "vLLM", "modelname": "m-b", "instance_id": inst,
                     "block_size": BS, "dp_rank": 0})
                if rnd.random() < 0.5:
                    https(args.addr, ctx, "POST", "/unregister", {"instance_id": inst},
                          cred.token)
            elif k == 12:  # a block under a parent the indexer never mapped
                p.publish([stored([rnd.randrange(2**63)], rnd.randrange(2**63),
                                  shared["tokens_f"][:BS], block_size=BS)])
            else:  # the hijack again, and the replay ring forging
                pubs[0].buffer.append((rnd.randrange(2**16), pubs[0].encode([cleared()] + forged)))
                reg({"endpoint": shared["ep_a"], "replay_endpoint": pubs[0].replay_endpoint,
                     "type": rnd.choice(["vLLM", "kvpool"]), "modelname": shared["model_a"],
                     "instance_id": f"b-hijack-{rnd.randrange(4)}", "block_size": BS,
                     "dp_rank": 0, "curve_server_key": CURVE_KEY
                     if rnd.random() < 0.2 else None})
            stats["batches"] += 1
        except (OSError, ssl.SSLError) as e:
            stats[f"error {type(e).__name__}"] += 1
        time.sleep(0.005)
    for p in pubs:
        p.close()
    if args.dump:
        with open(os.path.join(args.dump, "http-fuzz-zmq.json"), "w") as f:
            json.dump({"timeline": list(timeline)}, f)
    out.put(("stats", {f"zmq {k}": v for k, v in stats.items()}))


# ---- the master ----

def master_routes(rnd, shared):
    views = ["/metrics", "/health", "/api/v1/stat", "/api/v1/segments", "/get_all_segments",
             "/get_all_keys"]
    k = rnd.randrange(6)
    if k == 0:
        return "GET", rnd.choice(views), None
    if k == 1:
        q = {"regex": rnd.choice(["^a@", "a@cnry", ".*", "(.*){2,246}", "^b@", "[", "a" * 2000,
                                  "\x00", "(a|)*" * 20]),
             "limit": rnd.choice(["1", "1000", "1001", "0", "-1", "x", "99999999999999999999"]),
             "cursor": rnd.choice(["0", "1", "18446744073709551615", "18446744073709551616", "z"])}
        q = {a: b for a, b in q.items() if rnd.random() < 0.8}
        return "GET", "/api/v1/keys?" + urllib.parse.urlencode(q), None
    if k == 2:
        seg = rnd.choice(shared.get("segments", []) + ["", "x" * 300, "%00", "nope"])
        return "GET", "/query_segment?segment=" + urllib.parse.quote(seg), None
    if k in (3, 4):
        tenant = rnd.choice(["team-a", "team-b", "", "team-a%00", "team-a%20", "x" * 300,
                             "%ff", "default"])
        path = "/api/v1/tenant_quotas" + ("" if rnd.random() < 0.2 else f"?tenant_id={tenant}")
        method = rnd.choice(["GET", "PUT", "PUT", "DELETE", "HEAD", "POST"])
        body = {"requested_quota_bytes": rnd.choice([1, 0, 2**63 - 1, 2**63, 2**64, -1,
                                                     1 << 20])} if method == "PUT" else None
        return method, path, body
    if rnd.random() < 0.3:  # Mooncake's drain job API: an admin's, never B's or a stranger's
        seg = rnd.choice(shared.get("segments", []) + ["", "nope", "x" * 300])
        return rnd.choice([
            ("POST", "/api/v1/drain_jobs", {"segments": [seg], "max_concurrency": 1}),
            ("POST", "/api/v1/drain_jobs/cancel?job_id=" + rnd.choice(["", "x", "0" * 36]), None),
            ("GET", "/api/v1/segments/status?segment=" + urllib.parse.quote(seg), None),
            ("GET", "/api/v1/drain_jobs/query?job_id=00000000-0000-4000-8000-000000000000",
             None)])
    return "GET", random_path(rnd, views + ["/api/v1/tenant_quotas", "/api/v1/keys"]), None


class MasterCanary(threading.Thread):
    """Tenant A: puts, reads back byte-exact, checks and removes through the kvpool
    package, and asks /health on a fresh TLS connection, each call timed."""

    def __init__(self, args, shared, violate, stop):
        super().__init__(daemon=True)
        self.args, self.shared, self.violate, self.stop = args, shared, violate, stop
        self.cred = parse_principal(args.canary)
        self.hctx = self.cred.ctx(args.ca)
        self.ops = 0
        self.slowest = 0.0
        self.known = collections.Counter()
        self.load = HostLoad(args.pid)

    def timed(self, what, fn, *a):
        s0 = self.load.snap()
        t0 = time.monotonic()
        try:
            r = fn(*a)
        except Exception as e:  # noqa: BLE001 - any failure of the canary is a violation
            self.violate(f"canary {what}: {type(e).__name__}: {e}")
            return None
        dt = time.monotonic() - t0
        self.ops += 1
        self.slowest = max(self.slowest, dt)
        judge_slow(what, dt, self.load, s0, self.violate, self.known)
        return r

    def run(self):
        import kvpool
        kw = dict(tls_ca=self.args.ca, token=self.cred.token) if self.cred.token else \
            dict(tls_ca=self.args.ca, tls_cert=self.cred.cert[0], tls_key=self.cred.cert[1])
        marker = self.shared["key_marker"].encode()
        live = collections.deque()
        i = 0
        try:
            with kvpool.Client(self.args.master, **kw) as c:
                while not self.stop.is_set():
                    key = f"{self.shared['key_marker']}-{i}"
                    val = (marker + b"|%08d|" % i).ljust(256, b".") * 16
                    self.timed(f"put {key}", c.put, key, val)
                    live.append((key, val))
                    k2, v2 = live[random.randrange(len(live))]
                    got = self.timed(f"get {k2}", c.get, k2)
                    if got is not None and got != v2:
                        self.violate(f"canary get {k2}: {len(got)} bytes, not its own")
                    if self.timed(f"exists {k2}", c.exists, k2) is False:
                        self.violate(f"canary exists {k2}: False")
                    if len(live) > 16:
                        self.timed("remove", c.remove, live.popleft()[0])
                    st = self.timed("/health", lambda: https(self.args.addr, self.hctx, "GET",
                                                             "/health", timeout=5.0))
                    if st is not None and st[0] != 200:
                        self.violate(f"canary /health: {st[0]} {st[1]!r}")
                    i += 1
                    time.sleep(0.02)
        except Exception as e:  # noqa: BLE001
            self.violate(f"canary: {type(e).__name__}: {e}")


def admin_quotas(args):
    cred = parse_principal(args.admin)
    out = {}
    for t in ("team-a", "team-b"):
        st, a, _ = https(args.addr, cred.ctx(args.ca), "GET",
                         f"/api/v1/tenant_quotas?tenant_id={t}", token=cred.token)
        policy = a.get("data", a) if isinstance(a, dict) else a
        if isinstance(policy, dict):  # what B could change, not what A's puts charge
            policy = {k: v for k, v in policy.items() if k not in ("charged_bytes", "over_quota")}
        out[t] = (st, policy)
    return out


# ---- the run ----

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("target", choices=("indexer", "master"))
    ap.add_argument("--addr", required=True, help="the HTTPS port, HOST:PORT")
    ap.add_argument("--master", help="the master's control port (target master)")
    ap.add_argument("--ca", required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--canary", required=True, help="NAME=token:FILE|cert:CRT,KEY of tenant A")
    ap.add_argument("--admin", help="an admin (target master: A's quotas before and after)")
    ap.add_argument("--principal", action="append", default=[],
                    help="NAME=token:FILE|cert:CRT,KEY|wrong|none of tenant B")
    ap.add_argument("--zmq-writer", help="B's principal that registers B's publishers")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dump", help="a directory for each worker's last requests")
    ap.add_argument("--rss-max-mib", type=int, default=256)
    ap.add_argument("--fds-max", type=int, default=1536,
                    help="the daemon's descriptors at most (its HTTP server holds 1024 "
                         "connections and the flood asks for more)")
    ap.add_argument("--known", action="append", default=[],
                    help="an attack left out while its finding is open: replay-stall (B's mute "
                         "replay endpoint, for an indexer whose ZeroMQ thread still waits on "
                         "a replay: A's calls and new registrations would stall)")
    args = ap.parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    run = f"{random.Random(args.seed).getrandbits(32):08x}"
    shared = {"run": run}
    if args.target == "indexer":
        args.post_paths = ["/register", "/unregister", "/query", "/query_by_hash"]
        shared.update(model_a=f"model-a-{run}", inst_a=f"canary-a-{run}",
                      tokens_a=standard_tokens(args.seed, 32),
                      tokens_f=standard_tokens(args.seed + 1, 32), ep_b="tcp://127.0.0.1:1")
        routes, Canary = indexer_routes, IndexerCanary
    else:
        args.post_paths = ["/api/v1/tenant_quotas?tenant_id=team-b",
                           "/api/v1/tenant_quotas?tenant_id=team-a"]
        shared.update(key_marker=f"a@cnry{run}")
        routes, Canary = master_routes, MasterCanary
    violations = []
    stop = threading.Event()
    lock = threading.Lock()

    def violate(msg):
        with lock:
            violations.append(msg)
            print(f"VIOLATION: {msg}", flush=True)
        stop.set()

    mon = Monitor(args.pid, args.rss_max_mib, args.fds_max, violate, stop)
    mon.sample()
    canary = Canary(args, shared, violate, stop)
    quotas = None
    if args.target == "indexer":
        canary.setup()
        shared.update(ep_a=canary.pub.endpoint, replay_a=canary.pub.replay_endpoint)
        # B names A's instance id, model and publisher in its own registrations (allowed:
        # they are then B's); A's replay endpoint it never learns, and answers are checked
        # for other tenants' entries (Worker.check_tenants)
        markers = [(canary.pub.replay_endpoint, True), ('"team-a"', False)]
    else:
        markers = [(shared["key_marker"], True), ('tenant="team-a"', True)]
        if args.admin:
            quotas = admin_quotas(args)
    # the workers: fork before our threads start
    mp = multiprocessing.get_context("fork")
    out = mp.Queue()
    pstop = mp.Event()
    procs = []
    for w in range(args.workers):
        procs.append(mp.Process(target=lambda w=w: Worker(w, args.target, args, shared, routes,
                                                         markers, pstop, out).run(), daemon=True))
    if args.target == "indexer" and args.zmq_writer:
        procs.append(mp.Process(target=zmq_worker, args=(args, shared, pstop, out), daemon=True))
    for p in procs:
        p.start()
    mon.start()
    canary.start()
    stats = collections.Counter()
    end = time.monotonic() + args.seconds
    done = 0
    while done < len(procs):
        try:
            kind, v = out.get(timeout=0.2)
        except Exception:  # noqa: BLE001 - queue.Empty
            if stop.is_set() or time.monotonic() > end + 60:
                pstop.set()
            if time.monotonic() > end + 90:
                violate("workers did not finish")
                break
            continue
        if kind == "violation":
            violate(v)
            pstop.set()
        else:
            stats.update(v)
            done += 1
    stop.set()
    pstop.set()
    canary.join(10)
    mon.join(2)
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
    mon.sample()
    if quotas is not None:
        after = admin_quotas(args)
        if after != quotas:
            violate(f"tenant quotas changed: {quotas} -> {after}")
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(stats.items()))
    print(f"http-fuzz {args.target}: seed {args.seed}; {summary}; canary {canary.ops} calls, "
          f"slowest {canary.slowest * 1000:.0f} ms"
          + "".join(f", {k}: {v}" for k, v in sorted(canary.known.items()))
          + f"; daemon RSS max {mon.max_rss >> 10} MiB, "
          f"descriptors max {mon.max_fds}; {len(violations)} violations", flush=True)
    if violations and args.dump:
        with open(os.path.join(args.dump, "http-fuzz-violations.txt"), "w") as f:
            f.write("\n".join(violations) + "\n")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
