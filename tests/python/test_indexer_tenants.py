"""kvpool-indexer's subscriptions belong to a tenant (docs/indexer.md, "Security and limits"):

- a registration of tenant B naming tenant A's publisher endpoint gets a subscription of its
  own: B can neither change the replay endpoint or CURVE key of A's, nor have the batches its
  own replay server answers applied to A's registrations; after B unregisters and after a
  restart from --state-dir A's blocks still answer as before and B's forged ones never as A's;
  B's curve_server_key on A's plain publisher leaves A's subscription in clear;
- per-tenant caps on registrations and on subscriptions: past them /register answers 429
  naming the cap, counted, and other tenants still register and have their events applied;
  the subscriber's socket limit covers more than libzmq's default 1023; a registration whose
  socket cannot be made (out of descriptors) is answered 503, never a silent 200;
- the indexer dials tcp:// only (ipc://, abstract ipc://@, inproc:// and the rest: 400), and
  --publisher-allow limits the addresses it dials (400, counted).

Real parts: the kvpool-indexer binary, a vLLM-framed ZeroMQ publisher with its replay ROUTER
(test_indexer_daemon.py's), a hostile replay ROUTER, TLS and the ACL (test_security.py's
certificates) for the principals router-a and router-b.
"""
import json
import os
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

import msgpack
import pytest
import zmq

from conftest import Proc
from test_indexer_daemon import (BIN, END, Publisher, http, metric, start, synced,  # noqa: F401
                                 wait_for)
from test_security import acl_text, certs, no_ambient_credentials  # noqa: F401

pytestmark = pytest.mark.skipif(not os.access(BIN, os.X_OK),
                                reason=f"no kvpool-indexer binary at {BIN}")

_RUN = uuid.uuid4().hex[:8]
PRINCIPALS = {
    "router-a": dict(tenant="team-a", roles="read, write", token=f"ta-{_RUN}-tok"),
    "router-b": dict(tenant="team-b", roles="read, write", token=f"tb-{_RUN}-tok"),
}
BS = 4
A_TOKENS = list(range(1, 17))          # A's 4 real blocks: 16 tokens
FORGED = list(range(1000, 1032))       # B's 8 forged blocks
REG = dict(type="vLLM", modelname="m", block_size=BS, dp_rank=0)


def call(certs, port, path, body=None, who=None):  # noqa: F811
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(certs.ca)
    headers = {"Authorization": f"Bearer {PRINCIPALS[who]['token']}"} if who else {}
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=data, headers=headers,
                                 method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=20, context=ctx) as r:
            text = r.read().decode()
            return r.status, (text if path == "/metrics" else json.loads(text))
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())


class HostileReplay:
    """B's replay server: whatever it is asked, it answers AllBlocksCleared and 8 forged
    BlockStored at seq 0, as vLLM's replay ROUTER frames them."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.asked = 0
        self.stop = False
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    @property
    def endpoint(self):
        return f"tcp://127.0.0.1:{self.port}"

    def _serve(self):
        forged = msgpack.packb([time.time(), [
            ["AllBlocksCleared"],
            ["BlockStored", [bytes([0xee, i]) * 16 for i in range(8)], None, FORGED, BS,
             None, None]]])
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self.stop:
            if not poller.poll(50):
                continue
            frames = self.router.recv_multipart()
            self.asked += 1
            self.router.send_multipart([frames[0], b"", (0).to_bytes(8, "big"), forged])
            self.router.send_multipart([frames[0], b"", END, b""])

    def close(self):
        self.stop = True
        self.t.join(5)
        self.ctx.destroy(linger=0)


def start_acl(certs, acl, state):  # noqa: F811
    p = Proc([BIN, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}", "--tls-cert",
              certs.server_crt, "--tls-key", certs.server_key, "--acl-file", str(acl),
              "--state-dir", str(state)])
    return p, int(p.ready.rsplit(":", 1)[1])


def answer(certs, port, who, tokens):  # noqa: F811
    s, a = call(certs, port, "/query", {"model": "m", "block_size": BS, "token_ids": tokens},
                who=who)
    assert s == 200, a
    (tenant, insts), = a.items()
    return insts


def a_gpu(certs, port, tokens=A_TOKENS):  # noqa: F811
    return answer(certs, port, "router-a", tokens).get("engine-a", {}).get("GPU")


def a_sees_no_forgery(certs, port):  # noqa: F811
    insts = answer(certs, port, "router-a", FORGED)
    assert all(v["longest_matched"] == 0 for v in insts.values()), insts


def publisher_of(certs, port, who, instance):  # noqa: F811
    s, inst = call(certs, port, "/instances", who=who)
    assert s == 200, inst
    return [i for i in inst["instances"] if i["instance_id"] == instance][0]["publishers"][0]


def a_batches_flow(certs, port, pub):  # noqa: F811
    """A's publisher sends a batch that stores nothing new until the indexer took one."""
    before = metric_tls(certs, port)

    def seen():
        pub.send([])
        time.sleep(0.02)
        return metric_tls(certs, port) > before
    wait_for(seen, "the indexer to take a batch of A's publisher")


def metric_tls(certs, port):  # noqa: F811
    _, text = call(certs, port, "/metrics")
    return sum(float(ln.split()[1]) for ln in text.splitlines()
               if ln.startswith(("kvpool_indexer_batches_total ",
                                 "kvpool_indexer_replayed_batches_total ")))


def test_replay_hijack_across_tenants(certs, tmp_path):  # noqa: F811
    acl = tmp_path / "acl.conf"
    acl.write_text(acl_text(PRINCIPALS))
    state = tmp_path / "state"
    pub, evil = Publisher(), HostileReplay()
    p, port = start_acl(certs, acl, state)
    try:
        s, a = call(certs, port, "/register", dict(REG, instance_id="engine-a",
                                                   endpoint=pub.endpoint,
                                                   replay_endpoint=pub.replay), who="router-a")
        assert s == 200, a
        a_batches_flow(certs, port, pub)
        pub.send([["BlockStored", [bytes([0xaa, i]) * 16 for i in range(4)], None, A_TOKENS, BS,
                   None, None]])
        wait_for(lambda: a_gpu(certs, port) == 16, "A's 4 blocks")

        # the attack: B registers its own instance naming A's publisher, with its own replay
        s, a = call(certs, port, "/register", dict(REG, instance_id="engine-b",
                                                   endpoint=pub.endpoint,
                                                   replay_endpoint=evil.endpoint),
                    who="router-b")
        assert s == 200, a  # B may follow any publisher it reaches, in its own tenant
        assert publisher_of(certs, port, "router-a", "engine-a")["replay_endpoint"] == pub.replay
        # B's subscription joins late: its first batch asks B's replay server, which answers
        # with the forgery
        wait_for(lambda: (pub.send([]), time.sleep(0.05), evil.asked > 0)[2],
                 "B's replay server to be asked")
        for _ in range(3):
            pub.send([])
        b_answer = lambda: answer(certs, port, "router-b", FORGED).get("engine-b", {})  # noqa
        wait_for(lambda: b_answer().get("GPU") == 32, "the forgery applied to B's own index")
        # A's blocks intact, B's forged hashes not A's, A's replay endpoint still A's
        assert a_gpu(certs, port) == 16
        a_sees_no_forgery(certs, port)
        assert publisher_of(certs, port, "router-a", "engine-a")["replay_endpoint"] == pub.replay
        _, text = call(certs, port, "/metrics")
        assert "kvpool_indexer_subscriptions 2" in text  # one per tenant

        # a restart from --state-dir keeps them apart (B still registered)
        p.stop(sig=signal.SIGKILL)
        saved = json.loads((state / "registrations.json").read_text())["kvevent_instance"]
        by_tenant = {e["tenant_id"]: e["replay_endpoint"] for e in saved.values()}
        assert by_tenant == {"team-a": pub.replay, "team-b": evil.endpoint}
        asked = evil.asked
        p, port = start_acl(certs, acl, state)
        assert publisher_of(certs, port, "router-a", "engine-a")["replay_endpoint"] == pub.replay
        a_batches_flow(certs, port, pub)  # A's blocks come back by A's own replay
        wait_for(lambda: a_gpu(certs, port) == 16, "A's blocks replayed after the restart")
        wait_for(lambda: evil.asked > asked, "B's subscription to replay from B's server")
        for _ in range(3):
            pub.send([])
        wait_for(lambda: b_answer().get("GPU") == 32, "B's forgery in B's index again")
        assert a_gpu(certs, port) == 16
        a_sees_no_forgery(certs, port)

        # B unregisters: A's subscription, replay endpoint and blocks stay
        s, a = call(certs, port, "/unregister", {"instance_id": "engine-b"}, who="router-b")
        assert s == 200, a
        pub.send([])
        assert a_gpu(certs, port) == 16
        a_sees_no_forgery(certs, port)
        assert publisher_of(certs, port, "router-a", "engine-a")["replay_endpoint"] == pub.replay
        pub.send([["BlockRemoved", [bytes([0xaa, 3]) * 16], None]])
        wait_for(lambda: a_gpu(certs, port) == 12, "A's events still applied to A")
    finally:
        p.stop()
        pub.close()
        evil.close()


def refused(port, reason):
    return metric(port, f'kvpool_indexer_registrations_refused_total{{reason="{reason}"}}')


def ep(n):
    """An endpoint nobody listens on (ZeroMQ keeps trying it)."""
    return f"tcp://127.0.0.1:{n}"


def test_per_tenant_caps(tmp_path):
    pub = Publisher()
    p, port = start("--max-subscriptions-per-tenant", "3", "--max-registrations-per-tenant", "5")
    try:
        for i in range(3):
            s, a = http(port, "/register", dict(REG, instance_id=f"b{i}", tenant_id="b",
                                                endpoint=ep(20001 + i)))
            assert s == 200, a
        field0 = metric(port, 'kvpool_indexer_http_refused_total{reason="field"}')
        s, a = http(port, "/register", dict(REG, instance_id="b3", tenant_id="b",
                                            endpoint=ep(20004)))
        assert s == 429 and "--max-subscriptions-per-tenant" in a["error"], (s, a)
        assert refused(port, "tenant_subscriptions") == 1
        # more registrations on B's endpoints: up to its registration cap
        for i in range(3, 5):
            s, a = http(port, "/register", dict(REG, instance_id=f"b{i}", tenant_id="b",
                                                endpoint=ep(20001)))
            assert s == 200, a
        s, a = http(port, "/register", dict(REG, instance_id="b5", tenant_id="b",
                                            endpoint=ep(20001)))
        assert s == 429 and "--max-registrations-per-tenant" in a["error"], (s, a)
        assert refused(port, "tenant_registrations") == 1
        assert metric(port, 'kvpool_indexer_http_refused_total{reason="field"}') == field0 + 2
        _, inst = http(port, "/instances")
        assert sorted(i["instance_id"] for i in inst["instances"]) == [f"b{i}" for i in range(5)]
        # the other tenant registers, is subscribed and its events applied
        s, a = http(port, "/register", dict(REG, instance_id="engine-a", endpoint=pub.endpoint))
        assert s == 200, a
        synced(port, pub)
        pub.send([["BlockStored", [bytes([0xaa, i]) * 16 for i in range(4)], None, A_TOKENS, BS,
                   None, None]])

        def a_gpu_plain():
            _, ans = http(port, "/query", {"model": "m", "block_size": BS, "token_ids": A_TOKENS})
            return ans["default"].get("engine-a", {}).get("GPU")
        wait_for(lambda: a_gpu_plain() == 16, "A's blocks")
        # unregistering frees B's room
        assert http(port, "/unregister", {"instance_id": "b0", "tenant_id": "b"})[0] == 200
        s, a = http(port, "/register", dict(REG, instance_id="b3", tenant_id="b",
                                            endpoint=ep(20004)))
        assert s == 429 and "--max-subscriptions-per-tenant" in a["error"]  # b3, b4 hold 20001
        assert http(port, "/unregister", {"instance_id": "b1", "tenant_id": "b"})[0] == 200
        assert http(port, "/register", dict(REG, instance_id="b3", tenant_id="b",
                                            endpoint=ep(20004)))[0] == 200
    finally:
        p.stop()
        pub.close()


def test_past_libzmq_default_socket_limit(tmp_path):
    """1 100 subscriptions (libzmq's default context stops at 1 023 sockets): every one
    answered 200 is subscribed, and another tenant's registration after them is served."""
    pub = Publisher()
    p, port = start("--max-subscriptions-per-tenant", "1100")
    try:
        for i in range(1100):
            s, a = http(port, "/register", dict(REG, instance_id=f"b{i}", tenant_id="b",
                                                endpoint=ep(30000 + i)))
            assert s == 200, (i, a)
        assert metric(port, "kvpool_indexer_subscriptions") == 1100
        assert refused(port, "subscribe") == 0
        s, a = http(port, "/register", dict(REG, instance_id="engine-a", endpoint=pub.endpoint))
        assert s == 200, a
        synced(port, pub)
        pub.send([["BlockStored", [bytes([0xaa, i]) * 16 for i in range(4)], None, A_TOKENS, BS,
                   None, None]])

        def a_gpu_plain():
            _, ans = http(port, "/query", {"model": "m", "block_size": BS, "token_ids": A_TOKENS})
            return ans["default"].get("engine-a", {}).get("GPU")
        wait_for(lambda: a_gpu_plain() == 16, "A's blocks")
    finally:
        p.stop()
        pub.close()


def test_socket_that_cannot_be_made_is_refused(tmp_path):
    """Out of descriptors (ulimit -n 64 that the indexer cannot raise): a registration whose
    ZeroMQ socket cannot be made is answered 503 and undone, counted; never a silent 200."""
    code = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64)); "
            "os.execv(sys.argv[1], sys.argv[1:])")
    p = Proc([sys.executable, "-c", code, BIN, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}",
              "--max-subscriptions-per-tenant", "4096"])
    port = int(p.ready.rsplit(":", 1)[1])
    try:
        ok, refused_at = [], None
        for i in range(100):
            s, a = http(port, "/register", dict(REG, instance_id=f"b{i}", tenant_id="b",
                                                endpoint=ep(40000 + i)))
            if s == 503:
                assert "cannot subscribe" in a["error"], a
                refused_at = i
                break
            assert s == 200, (i, a)
            ok.append(f"b{i}")
        assert refused_at is not None, "every registration answered 200 with 64 descriptors"
        assert refused(port, "subscribe") >= 1
        _, inst = http(port, "/instances")
        assert sorted(i["instance_id"] for i in inst["instances"]) == sorted(ok)
        assert metric(port, "kvpool_indexer_subscriptions") == len(ok)
        assert p.p.poll() is None  # still serving
        # room again: once b0's and b1's sockets are closed (ZeroMQ frees their descriptors
        # on its own thread), a registration is served
        for inst in ("b0", "b1"):
            assert http(port, "/unregister", {"instance_id": inst, "tenant_id": "b"})[0] == 200
        wait_for(lambda: http(port, "/register", dict(REG, instance_id="again", tenant_id="b",
                                                      endpoint=ep(40000)))[0] == 200,
                 "a registration served once descriptors are free")
        assert "again" in [i["instance_id"] for i in http(port, "/instances")[1]["instances"]]
    finally:
        p.stop()


BAD_ENDPOINTS = ["ipc:///tmp/kvpool-idx.sock", "ipc://@kvpool-abstract", "inproc://x",
                 "udp://127.0.0.1:5", "pgm://eth0;239.1.1.1:5", "ws://127.0.0.1:5",
                 "tcp://*:5555", "tcp://127.0.0.1:0", "tcp://127.0.0.1:65536", "tcp://127.0.0.1",
                 "tcp://127.0.0.1;127.0.0.2:5555", "tcp://[::1:5555", "tcp://[zz]:5555",
                 "tcp://-h:5555", "tcp://127.0.0.1:5555x", "TCP://127.0.0.1:5555", "tcp://:5"]


def test_tcp_only(tmp_path):
    p, port = start()
    try:
        for bad in BAD_ENDPOINTS:
            for field in ("endpoint", "replay_endpoint"):
                body = dict(REG, instance_id="x", endpoint=ep(5555))
                body[field] = bad
                s, a = http(port, "/register", body)
                assert s == 400 and "must be tcp://HOST:PORT" in a["error"], (bad, field, s, a)
        assert refused(port, "endpoint") == 2 * len(BAD_ENDPOINTS)
        assert http(port, "/instances")[1] == {"instances": []}
        assert metric(port, "kvpool_indexer_subscriptions") == 0
        for good in ("tcp://localhost:5555", "tcp://[::1]:5555", "tcp://127.0.0.1:5555"):
            assert http(port, "/register", dict(REG, instance_id="x", endpoint=good))[0] == 200
    finally:
        p.stop()


def test_publisher_allow_list(tmp_path):
    pub = Publisher()
    p, port = start("--publisher-allow", "127.0.0.0/8,fd00::/8")
    try:
        for body in (dict(endpoint="tcp://10.1.2.3:5555"),
                     dict(endpoint="tcp://localhost:5555"),  # a name: not with an allow-list
                     dict(endpoint="tcp://[::1]:5555"),
                     dict(endpoint=pub.endpoint, replay_endpoint="tcp://192.168.0.1:5558")):
            s, a = http(port, "/register", dict(REG, instance_id="engine-a", **body))
            assert s == 400 and "--publisher-allow" in a["error"], (body, s, a)
        assert refused(port, "publisher_allow") == 4
        assert http(port, "/instances")[1] == {"instances": []}
        s, a = http(port, "/register", dict(REG, instance_id="engine-a", endpoint=pub.endpoint,
                                            replay_endpoint=pub.replay))
        assert s == 200, a
        s, a = http(port, "/register", dict(REG, instance_id="v6", endpoint="tcp://[fd01::5]:5"))
        assert s == 200, a
        synced(port, pub)
        pub.send([["BlockStored", [bytes([0xaa, i]) * 16 for i in range(4)], None, A_TOKENS, BS,
                   None, None]])

        def gpu():
            _, ans = http(port, "/query", {"model": "m", "block_size": BS, "token_ids": A_TOKENS})
            return ans["default"].get("engine-a", {}).get("GPU")
        wait_for(lambda: gpu() == 16, "the allowed publisher's blocks")
    finally:
        p.stop()
        pub.close()
    for bad in ("10.0.0.0/33", "example.com", "10.0.0.1/", "::1/129", "1.2.3.4/x", ",,"):
        r = subprocess.run([BIN, "--listen", "127.0.0.1:0", "--publisher-allow", bad],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and "--publisher-allow" in r.stderr, (bad, r.stderr)


def test_another_tenants_curve_key_leaves_a_alone(tmp_path):
    """B names A's (plain) publisher with a curve_server_key: before, the shared subscription
    was made again over CURVE and A heard nothing more; now only B's own one is."""
    pub = Publisher()
    _, secret = zmq.curve_keypair()
    key = tmp_path / "indexer.key"
    key.write_bytes(secret + b"\n")
    key.chmod(0o600)
    state = tmp_path / "state"
    p, port = start("--curve-secret", str(key), "--state-dir", str(state))

    def gpu(tenant):
        _, ans = http(port, "/query", {"model": "m", "block_size": BS, "token_ids": A_TOKENS,
                                       "tenant_id": tenant})
        return ans[tenant].get("engine-a", {}).get("GPU")
    try:
        s, a = http(port, "/register", dict(REG, instance_id="engine-a", tenant_id="a",
                                            endpoint=pub.endpoint, replay_endpoint=pub.replay))
        assert s == 200, a
        synced(port, pub)
        pub.send([["BlockStored", [bytes([0xaa, i]) * 16 for i in range(4)], None, A_TOKENS, BS,
                   None, None]])
        wait_for(lambda: gpu("a") == 16, "A's blocks")
        other = zmq.curve_keypair()[0].decode()
        s, a = http(port, "/register", dict(REG, instance_id="engine-b", tenant_id="b",
                                            endpoint=pub.endpoint, curve_server_key=other))
        assert s == 200, a
        saved = json.loads((state / "registrations.json").read_text())["kvevent_instance"]
        keys = {e["tenant_id"]: e.get("curve_server_key") for e in saved.values()}
        assert keys == {"a": None, "b": other}
        pub.send([["BlockRemoved", [bytes([0xaa, 3]) * 16], None]])
        wait_for(lambda: gpu("a") == 12, "A's publisher still heard in clear")
    finally:
        p.stop()
        pub.close()
