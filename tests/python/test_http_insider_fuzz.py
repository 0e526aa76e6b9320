"""The insider fuzzer's HTTP and ZeroMQ half (tests/insider/http_fuzz.py; docs/operations.md,
"The insider fuzzer"): against a real kvpool-indexer (TLS 1.3 and an ACL of two tenants)
and a real kvpool-master's HTTPS port (--http-listen with TLS and the ACL).

Tenant A (team-a) is the canary: against the indexer router-a registers once, publishes a
known prefix and queries it throughout (each query within 1 s and answered as at the start;
B's forged prefix never answered as A's; A's registrations unchanged; a second
registration half way through answered and subscribed); against the master alice puts,
reads back byte-exact, checks and removes through the kvpool package and asks /health on
a fresh TLS connection, each call within 1 s, and team-a's quota reads the same before and
after. Tenant B's principals (read, write, read and write, none, a client certificate),
a stranger and a wrong token send mutated requests to every route with every method,
mutated bodies and headers, cut and trickled requests, bursts and held connections; against
the indexer B's publishers also send mutated KV event batches. Any of A's markers in what
B received, the daemon gone, its RSS or descriptors past the caps is a violation.

An open finding is passed as --known while it is open and reproduced by a strict xfail
below, so that its fix shows (XPASS) and both the mark and the --known go. B's unfinished
bodies take only team-b's body budget, never team-a's: a canary call answered 503 for it is
a violation (test_one_tenants_unfinished_bodies_leave_others_served).
B's mute replay endpoint runs (replays are asynchronous, capped per tenant: A's
registrations and queries never wait on B's;
test_one_tenants_replay_gaps_leave_others_subscribed).

KVPOOL_HTTP_FUZZ_SECONDS (default 20 per target; longer by hand), KVPOOL_HTTP_FUZZ_SEED.
Each run's workers' last requests are kept in the test's directory (http-fuzz-worker*.json).
It runs its own TLS daemons, so the suite's TLS pass skips it (once is enough).
"""
import hashlib
import os
import subprocess
import sys
import uuid

import pytest

from conftest import TLS_DIR, Proc, _bin, free_port, stop_all

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FUZZ = os.path.join(ROOT, "tests", "insider", "http_fuzz.py")
SECONDS = float(os.environ.get("KVPOOL_HTTP_FUZZ_SECONDS", "20"))
INDEXER = os.environ.get("KVPOOL_INDEXER_BIN", os.path.join(ROOT, "build", "indexer",
                                                             "kvpool-indexer"))
CRED_ENV = ("KVPOOL_TLS_CA", "KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY", "KVPOOL_TOKEN")

pytestmark = [pytest.mark.skipif(TLS_DIR is not None,
                                 reason="runs its own TLS daemons: once is enough"),
              pytest.mark.skipif(SECONDS <= 0, reason="KVPOOL_HTTP_FUZZ_SECONDS=0")]

# tenant B: name -> roles (None: no role); each named by a token, and "bob" by a certificate
FUZZERS = {"b-read": "read", "b-write": "write", "b-rw": "read, write", "b-none": None}


def setup_dir(d, env, tenant_a):
    """Certificates (deploy/make-certs.sh, client CN bob) and an ACL in d: tenant A's
    principals tenant_a (name -> roles, None: no tenant), tenant B's FUZZERS and bob.
    -> {name: "token:FILE" or "cert:CRT,KEY"}."""
    r = subprocess.run(["bash", os.path.join(ROOT, "deploy", "make-certs.sh"), str(d), "bob"],
                       env=env, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    acl, creds = [], {}
    for name, (tenant, roles) in {**tenant_a, **{n: ("team-b", r) for n, r in
                                                 FUZZERS.items()}}.items():
        tok = f"{name}-{uuid.uuid4().hex}"
        (d / f"{name}.token").write_text(tok)
        creds[name] = f"token:{d / f'{name}.token'}"
        acl += [f"[principal {name}]", f"token-sha256 = {hashlib.sha256(tok.encode()).hexdigest()}"]
        acl += [f"tenant = {tenant}"] if tenant else []
        acl += [f"roles = {roles}"] if roles else []
        acl.append("")
    acl += ["[principal bob]", "tenant = team-b", "roles = read, write", "cert-cn = bob", ""]
    creds["bob"] = f"cert:{d / 'bob.crt'},{d / 'bob.key'}"
    (d / "acl.conf").write_text("\n".join(acl))
    return creds


def fuzz(d, env, target, argv):
    args = [sys.executable, FUZZ, target, "--ca", str(d / "ca.crt"), "--seconds", str(SECONDS),
            "--dump", str(d), *argv]
    if os.environ.get("KVPOOL_HTTP_FUZZ_SEED"):
        args += ["--seed", os.environ["KVPOOL_HTTP_FUZZ_SEED"]]
    run = subprocess.run(args, env=env, capture_output=True, timeout=SECONDS + 180)
    out, err = run.stdout.decode(), run.stderr.decode()
    print(out)
    assert run.returncode == 0, f"{out}\n{err[-6000:]}"
    assert " 0 violations" in out, out


def principals(creds):
    return [f"--principal={n}={creds[n]}" for n in (*FUZZERS, "bob")]


def test_http_fuzz_indexer(tmp_path):
    if not os.access(INDEXER, os.X_OK):
        pytest.skip(f"no kvpool-indexer binary at {INDEXER}")
    env = {k: v for k, v in os.environ.items() if k not in CRED_ENV}
    d = tmp_path
    creds = setup_dir(d, env, {"router-a": ("team-a", "read, write")})
    log = open(d / "indexer.log", "wb")
    idx = Proc([INDEXER, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}", "--log-level", "warn",
                "--tls-cert", str(d / "server.crt"), "--tls-key", str(d / "server.key"),
                "--tls-ca", str(d / "ca.crt"), "--acl-file", str(d / "acl.conf"),
                "--max-blocks", "200000"], stderr=log, env=env)
    try:
        fuzz(d, env, "indexer", ["--addr", idx.ready, "--pid", str(idx.pid),
                                 f"--canary=router-a={creds['router-a']}",
                                 "--zmq-writer", "b-rw",
                                 *principals(creds)])
        assert idx.p.poll() is None, "the indexer exited"
    finally:
        rc = idx.stop()
        log.close()
    assert rc == 0, (d / "indexer.log").read_text()[-4000:]


def test_http_fuzz_master(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in CRED_ENV}
    d = tmp_path
    creds = setup_dir(d, env, {"alice": ("team-a", "read, write"), "owna": ("team-a", "segment"),
                               "admin": (None, "admin")})
    with open(d / "acl.conf", "a") as f:
        f.write("\n[tenant team-a]\nmax-dram = 32MiB\n\n[tenant team-b]\nmax-dram = 8MiB\n")
    http = f"127.0.0.1:{free_port()}"
    log = open(d / "master.log", "wb")
    master = Proc([_bin("KVPOOL_MASTER_BIN"), "--listen", "127.0.0.1:0", "--ready-fd", "{fd}",
                   "--log-level", "warn", "--lease-ttl", "0", "--http-listen", http,
                   "--tls-cert", str(d / "server.crt"), "--tls-key", str(d / "server.key"),
                   "--tls-ca", str(d / "ca.crt"), "--acl-file", str(d / "acl.conf")],
                  stderr=log, env=env)
    procs = [master]
    try:
        owner = Proc([_bin("KVPOOL_CLI_BIN"), "--master", master.ready, "--tls-ca",
                      str(d / "ca.crt"), "--token-file", str(d / "owna.token"), "serve",
                      "--segment-size", "64MiB", "--tenant", "team-a", "--ready-fd", "{fd}"],
                     env=env)
        procs.insert(0, owner)
        fuzz(d, env, "master", ["--addr", http, "--master", master.ready, "--pid",
                                str(master.pid), f"--canary=alice={creds['alice']}",
                                f"--admin=admin={creds['admin']}",
                                *principals(creds)])
        assert master.p.poll() is None, "the master exited"
        assert owner.p.poll() is None, "the owner exited"
    finally:
        bad = stop_all(procs)
        log.close()
    assert not bad, f"{bad}: {(d / 'master.log').read_text()[-4000:]}"


def test_one_tenants_unfinished_bodies_leave_others_served(tmp_path):
    """What the fuzzer found, as a reproducer: b-read (team-b, role read) opens five
    connections from addresses of its own, each a /query head announcing 16 MiB and 1 KiB
    of it (the fifth over team-b's budget of bodies being received); router-a's /query must
    still be answered: the budget is per tenant."""
    import socket
    import ssl
    import time

    if not os.access(INDEXER, os.X_OK):
        pytest.skip(f"no kvpool-indexer binary at {INDEXER}")
    env = {k: v for k, v in os.environ.items() if k not in CRED_ENV}
    d = tmp_path
    setup_dir(d, env, {"router-a": ("team-a", "read, write")})
    idx = Proc([INDEXER, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}", "--log-level", "error",
                "--tls-cert", str(d / "server.crt"), "--tls-key", str(d / "server.key"),
                "--acl-file", str(d / "acl.conf")], env=env)
    host, port = idx.ready.rsplit(":", 1)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(str(d / "ca.crt"))

    def conn(src):
        return ctx.wrap_socket(socket.create_connection((host, int(port)), 10,
                                                        source_address=(src, 0)),
                               server_hostname=host)

    held = []
    try:
        btok = (d / "b-read.token").read_text()
        for i in range(5):
            s = conn(f"127.0.0.{2 + i}")
            s.sendall(f"POST /query HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {btok}\r\n"
                      f"Content-Length: {16 << 20}\r\n\r\n".encode() + b" " * 1024)
            held.append(s)
        body = b'{"model": "m", "block_size": 16, "token_ids": [' + b"1," * 15 + b"1]}"
        atok = (d / "router-a.token").read_text()
        deadline = time.monotonic() + 5
        while True:  # the reservations land on the server's threads: poll, bounded
            with conn("127.0.0.1") as s:
                s.sendall(f"POST /query HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {atok}\r\n"
                          f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                          + body)
                answer = b""
                while b"\r\n\r\n" not in answer:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    answer += chunk
            if not answer.startswith(b"HTTP/1.1 200") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
    finally:
        for s in held:
            s.close()
        assert idx.stop() == 0


def test_one_tenants_replay_gaps_leave_others_subscribed(tmp_path):
    """What the fuzzer found: b-rw (team-b) registers four publishers whose replay endpoints
    never answer and publishes a gap in every batch of each, and keeps two more /register
    calls of its own in flight. Meanwhile A's /health and /query answer within 1 s each,
    router-a's new publisher is subscribed and its blocks answered within 5 s, and B's gaps
    end as the docs say: each asked of its replay endpoint, then resynchronized (counted)."""
    import threading
    import time

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from vllm_publisher import Publisher, stored
    import json
    import re
    import socket
    import ssl

    if not os.access(INDEXER, os.X_OK):
        pytest.skip(f"no kvpool-indexer binary at {INDEXER}")
    env = {k: v for k, v in os.environ.items() if k not in CRED_ENV}
    d = tmp_path
    setup_dir(d, env, {"router-a": ("team-a", "read, write")})
    idx = Proc([INDEXER, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}", "--log-level", "error",
                "--tls-cert", str(d / "server.crt"), "--tls-key", str(d / "server.key"),
                "--acl-file", str(d / "acl.conf")], env=env)
    host, port = idx.ready.rsplit(":", 1)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(str(d / "ca.crt"))

    def call(method, path, who=None, body=None):
        """-> (status, body bytes, seconds)"""
        t0 = time.monotonic()
        data = json.dumps(body).encode() if body is not None else b""
        auth = f"Authorization: Bearer {(d / f'{who}.token').read_text()}\r\n" if who else ""
        with ctx.wrap_socket(socket.create_connection((host, int(port)), 10),
                             server_hostname=host) as s:
            s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Length: "
                      f"{len(data)}\r\nConnection: close\r\n\r\n".encode() + data)
            out = b""
            while True:
                c = s.recv(65536)
                if not c:
                    break
                out += c
        head, _, rest = out.partition(b"\r\n\r\n")
        return int(head.split()[1]), rest, time.monotonic() - t0

    def register(who, pub, inst, model="m"):
        st, out, _ = call("POST", "/register", who, {
            "endpoint": pub.endpoint, "replay_endpoint": pub.replay_endpoint, "type": "vLLM",
            "modelname": model, "instance_id": inst, "block_size": 16, "dp_rank": 0})
        assert st == 200, out

    pubs, extra, stop = [], [], threading.Event()

    def gaps():
        while not stop.is_set():
            for p in pubs:
                p.skip(1)
                p.publish([stored([1], block_size=16)])
            time.sleep(0.05)

    def b_register(i):
        q = Publisher(block_size=16)
        q.replay_mute = True
        extra.append(q)
        register("b-rw", q, f"bx{i}")

    flood = threading.Thread(target=gaps, daemon=True)
    a = None
    try:
        for i in range(4):
            p = Publisher(block_size=16)
            p.replay_mute = True
            register("b-rw", p, f"b{i}")
            p.wait_subscribed()
            pubs.append(p)
        flood.start()
        # B's replays are asked and pending: each publisher's gaps reach its replay endpoint
        deadline = time.monotonic() + 5
        while not all(len(p.replay_requests) >= 2 for p in pubs):
            assert time.monotonic() < deadline, [p.replay_requests for p in pubs]
            time.sleep(0.05)
        regs = [threading.Thread(target=b_register, args=(i,), daemon=True) for i in range(2)]
        for t in regs:
            t.start()
        for _ in range(5):
            st, out, dt = call("GET", "/health")
            assert st == 200 and dt < 1.0, (st, out, dt)
        a = Publisher(block_size=16)
        t0 = time.monotonic()
        register("router-a", a, "a0", model="ma")
        assert time.monotonic() - t0 < 1.0
        a.wait_subscribed(timeout=5)

        def matched(toks, within):
            """A's /query, each within 1 s, until toks' 64 tokens are matched (within s)."""
            t1 = time.monotonic()
            while True:
                st, out, dt = call("POST", "/query", "router-a",
                                   {"model": "ma", "block_size": 16, "token_ids": toks})
                assert st == 200 and dt < 1.0, (st, out, dt)
                got = json.loads(out).get("team-a", {}).get("a0", {}).get("longest_matched")
                if got == 64:
                    return
                assert time.monotonic() - t1 < within, out
                time.sleep(0.05)

        toks = list(range(100, 164))
        a.publish([stored([11, 12, 13, 14], None, toks, block_size=16)])
        matched(toks, 5.0 - (time.monotonic() - t0))
        # A's own gap is replayed at once, whatever B's replays pending and queued: the lost
        # batch's blocks answered, and no resync (A's first blocks still there)
        toks2 = list(range(200, 264))
        a.publish([stored([21, 22, 23, 24], None, toks2, block_size=16)], pub=False)
        a.publish([stored([31], None, list(range(300, 316)), block_size=16)])
        matched(toks2, 2.0)
        assert a.replay_requests == [1]
        matched(toks, 0.0)
        for t in regs:
            t.join(5)
            assert not t.is_alive(), "B's /register did not return"
        # B's gaps each asked of its (mute) replay endpoint in turn, then resynchronized when
        # the replay timed out (--replay-timeout, 1 s): counted, and B's replays go on
        deadline = time.monotonic() + 10
        while True:
            st, out, _ = call("GET", "/metrics", "router-a")
            m = re.search(rb'kvpool_indexer_resyncs_total\{reason="gap"\} (\d+)', out)
            assert st == 200 and m, out[:2000]
            if int(m.group(1)) >= 6:
                break
            assert time.monotonic() < deadline, m.group(0)
            time.sleep(0.1)
    finally:
        stop.set()
        flood.join(5)
        for p in pubs + extra + ([a] if a else []):
            p.close()
        assert idx.stop() == 0
