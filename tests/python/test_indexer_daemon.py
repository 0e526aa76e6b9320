"""kvpool-indexer as a daemon (docs/indexer.md, "Options"): --state-dir keeps the
registrations across a kill -9 and the restarted indexer replays what each publisher still
holds; the Conductor's JSON config (current and older entry forms, a bad file refused at
start); --instance-ttl reports a silent publisher stale; protected mode refuses a request
from another address of this host.

Real parts: the kvpool-indexer binary (KVPOOL_INDEXER_BIN, else build/indexer/
kvpool-indexer), and a publisher on 127.0.0.1 that frames its batches as vLLM's
ZmqEventPublisher does ([topic, seq as 8 bytes big-endian, msgpack]) and answers replays on
a ROUTER as vLLM does (written from vLLM's kv_events.py; vLLM is not installable here).
"""
import json
import os
import select
import signal
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.request

import msgpack
import pytest
import zmq

from conftest import Proc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("KVPOOL_INDEXER_BIN", os.path.join(ROOT, "build", "indexer",
                                                         "kvpool-indexer"))
END = (-1).to_bytes(8, "big", signed=True)

pytestmark = pytest.mark.skipif(not os.access(BIN, os.X_OK),
                                reason=f"no kvpool-indexer binary at {BIN}")


def xxh3(data, seed=0):
    import xxhash
    return xxhash.xxh3_64_intdigest(data, seed)


def std_hashes(tokens, bs, seed=0):
    out, prev = [], None
    for i in range(len(tokens) // bs):
        loc = xxh3(struct.pack(f"<{bs}I", *tokens[i * bs:(i + 1) * bs]), seed)
        prev = loc if prev is None else xxh3(struct.pack("<QQ", prev, loc), seed)
        out.append(prev)
    return out


class Publisher:
    """vLLM's PUB + replay ROUTER, the batches kept for replay."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.router = self.ctx.socket(zmq.ROUTER)
        self.rport = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.seq, self.buf, self.lock = 0, [], threading.Lock()
        self.stop = False
        self.t = threading.Thread(target=self._serve, daemon=True)
        self.t.start()

    @property
    def endpoint(self):
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def replay(self):
        return f"tcp://127.0.0.1:{self.rport}"

    def _serve(self):
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self.stop:
            if not poller.poll(50):
                continue
            ident, _, start = self.router.recv_multipart()
            start = int.from_bytes(start, "big")
            with self.lock:
                held = list(self.buf)
            for seq, payload in held:
                if seq >= start:
                    self.router.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
            self.router.send_multipart([ident, b"", END, b""])

    def send(self, events):
        payload = msgpack.packb([time.time(), events])
        with self.lock:
            seq = self.seq
            self.seq += 1
            self.buf.append((seq, payload))
        self.pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])

    def close(self):
        self.stop = True
        self.t.join(5)
        self.ctx.destroy(linger=0)


def http(port, path, body=None, host="127.0.0.1"):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://{host}:{port}{path}", data=data,
                                 method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
            return r.status, (json.loads(text) if path != "/metrics" else text)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())


def metric(port, name):
    _, text = http(port, "/metrics")
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def start(*args, listen="127.0.0.1:0"):
    p = Proc([BIN, "--listen", listen, "--ready-fd", "{fd}", *args])
    return p, int(p.ready.rsplit(":", 1)[1])


def wait_for(cond, what, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def synced(port, pub):
    """Publish empty batches until the indexer has applied one (ZeroMQ's slow joiner)."""
    before = metric(port, "kvpool_indexer_batches_total") + metric(
        port, "kvpool_indexer_replayed_batches_total")

    def seen():
        pub.send([])
        time.sleep(0.02)
        return metric(port, "kvpool_indexer_batches_total") + metric(
            port, "kvpool_indexer_replayed_batches_total") > before
    wait_for(seen, "the indexer to take a batch")


REG = dict(type="vLLM", modelname="m", instance_id="engine-a", block_size=4, dp_rank=0)
TOKENS = list(range(1, 17))  # 4 blocks of 4


def gpu_tokens(port):
    s, a = http(port, "/query", {"model": "m", "block_size": 4, "token_ids": TOKENS})
    assert s == 200, a
    return a["default"]["engine-a"]["GPU"] if "engine-a" in a["default"] else None


def test_state_dir_survives_a_kill(tmp_path):
    state = tmp_path / "state"
    pub = Publisher()
    p, port = start("--state-dir", str(state))
    try:
        s, a = http(port, "/register", dict(REG, endpoint=pub.endpoint,
                                            replay_endpoint=pub.replay))
        assert s == 200, a
        f = state / "registrations.json"
        assert f.exists() and (f.stat().st_mode & 0o777) == 0o600
        synced(port, pub)
        pub.send([["BlockStored", [b"\x01" * 32, b"\x02" * 32, b"\x03" * 32], None,
                   TOKENS[:12], 4, None, None]])
        wait_for(lambda: gpu_tokens(port) == 12, "the stored blocks")
        p.stop(sig=signal.SIGKILL)
        # the blocks were stored while nobody listened: replayed from the publisher
        p, port = start("--state-dir", str(state))
        s, inst = http(port, "/instances")
        assert [i["instance_id"] for i in inst["instances"]] == ["engine-a"], inst
        assert inst["instances"][0]["publishers"][0]["replay_endpoint"] == pub.replay
        # its first batch has seq > 0: everything from seq 0 is replayed before it
        synced(port, pub)
        wait_for(lambda: gpu_tokens(port) == 12, "the replayed blocks")
        pub.send([["BlockRemoved", [b"\x03" * 32], None]])
        wait_for(lambda: gpu_tokens(port) == 8, "the replayed blocks, less the removed one")
        assert metric(port, "kvpool_indexer_replayed_batches_total") >= 2
        assert metric(port, "kvpool_indexer_resyncs_total{reason=\"gap\"}") == 0
        # unregistering is written too: a restart knows nothing of engine-a
        s, _ = http(port, "/unregister", {"instance_id": "engine-a"})
        assert s == 200
        p.stop()
        p, port = start("--state-dir", str(state))
        assert http(port, "/instances")[1] == {"instances": []}
    finally:
        p.stop()
        pub.close()


def test_state_file_that_does_not_parse_stops_the_start(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    (state / "registrations.json").write_text("{not json")
    r = subprocess.run([BIN, "--listen", "127.0.0.1:0", "--state-dir", str(state)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2
    assert "cannot be read back" in r.stderr


def test_conductor_config(tmp_path):
    pub = Publisher()
    cfg = tmp_path / "conductor_config.json"
    cfg.write_text(json.dumps({
        "http_server_port": 0,
        "kvevent_instance": {
            "engine-a": {"endpoint": pub.endpoint, "replay_endpoint": pub.replay,
                         "type": "vLLM", "modelname": "m", "block_size": 4, "dp_rank": 0,
                         "tenant_id": ""},
            "old-form": {"ip": "127.0.0.1", "port": pub.port, "type": "Mooncake",
                         "modelname": "m", "lora_id": -1, "block_size": 4,
                         "instance_id": "engine-b"},
        }}))
    p = Proc([BIN, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}"],
             env={"CONDUCTOR_CONFIG_PATH": str(cfg)})
    port = int(p.ready.rsplit(":", 1)[1])
    try:
        _, inst = http(port, "/instances")
        got = sorted((i["instance_id"], i["tenant_id"], i["publishers"][0]["endpoint"],
                      i["publishers"][0]["type"]) for i in inst["instances"])
        assert got == [("engine-a", "default", pub.endpoint, "vLLM"),
                       ("engine-b", "default", pub.endpoint, "Mooncake")]
        assert metric(port, "kvpool_indexer_subscriptions") == 1  # one endpoint, one socket
    finally:
        p.stop()
        pub.close()
    for bad, says in ((b"[1]", "not a JSON object"),
                      (b'{"kvevent_instance": {"x": {"type": "vLLM"}}}', "is required"),
                      (b'{"http_server_port": 70000}', "http_server_port")):
        cfg.write_bytes(bad)
        r = subprocess.run([BIN, "--listen", "127.0.0.1:0", "--config", str(cfg)],
                           capture_output=True, text=True, timeout=10)
        assert r.returncode == 2 and says in r.stderr, (bad, r.stderr)


def test_instance_ttl(tmp_path):
    pub = Publisher()
    p, port = start("--instance-ttl", "0.3")
    try:
        assert http(port, "/register", dict(REG, endpoint=pub.endpoint))[0] == 200
        synced(port, pub)

        def stale():
            return http(port, "/instances")[1]["instances"][0]["publishers"][0]["stale"]
        assert not stale()
        wait_for(stale, "the publisher to go stale")
        assert metric(port, "kvpool_indexer_stale_publishers") == 1
        pub.send([])
        wait_for(lambda: not stale(), "a batch to make it fresh")
        assert metric(port, "kvpool_indexer_stale_publishers") == 0
    finally:
        p.stop()
        pub.close()


def other_address():
    """An address of this host that is not loopback (None: none)."""
    try:
        out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True,
                             text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        addr = line.split()[3].split("/")[0]
        if not addr.startswith("127."):
            return addr
    return None


def test_protected_mode_refuses_another_address():
    addr = other_address()
    if addr is None:
        pytest.skip("this host has no address but loopback")
    p, port = start(listen="0.0.0.0:0")
    try:
        s, a = http(port, "/health", host=addr)
        assert s == 403 and "protected mode" in a["error"]
        assert http(port, "/health")[0] == 200  # from loopback
        assert metric(port, 'kvpool_indexer_http_refused_total{reason="peer"}') == 1
    finally:
        p.stop()
    p, port = start("--auth", "none", listen="0.0.0.0:0")
    try:
        assert http(port, "/health", host=addr)[0] == 200
    finally:
        p.stop()


def test_a_body_over_the_limit_is_refused_before_it_is_read():
    p, port = start()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % (17 << 20))
            head = s.recv(4096)  # answered at the header: no byte of the body was sent
        assert head.startswith(b"HTTP/1.1 413"), head
        assert metric(port, 'kvpool_indexer_http_refused_total{reason="body"}') == 1
        # a chunked body that grows past it and never ends: counted, dropped as it comes,
        # and the connection closed after 64 MiB more (libmicrohttpd cannot answer in the
        # middle of a body; one that ends gets its 413: test_indexer.py)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"POST /query HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"%x\r\n%s\r\n" % (1 << 20, b" " * (1 << 20))
            sent = 0
            # send until the answer comes (more would draw a reset that discards it)
            try:
                while not select.select([s], [], [], 0.05)[0] and sent < 120:
                    s.sendall(chunk)
                    sent += 1
            except (BrokenPipeError, ConnectionResetError):
                pass  # the close came while a chunk was on its way (seen so under load)
            try:
                head = s.recv(4096)
            except ConnectionResetError:
                head = b""
        assert 16 + 64 <= sent < 120, sent
        assert head == b"" or head.startswith(b"HTTP/1.1 413"), head
        assert metric(port, 'kvpool_indexer_http_refused_total{reason="body"}') == 2
        assert http(port, "/health")[0] == 200
    finally:
        p.stop()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_memory_bounded_under_a_flood():
    """A publisher that stores far more blocks (and engine hashes) than --max-blocks: the
    index keeps at most that many, counts what it evicts, and its memory stops growing."""
    pub = Publisher()
    p, port = start("--max-blocks", "20000")
    try:
        assert http(port, "/register", dict(REG, endpoint=pub.endpoint))[0] == 200
        synced(port, pub)
        base = metric(port, "kvpool_indexer_batches_total")
        rss = []
        n = 0
        for rnd in range(3):
            for _ in range(100):  # 100 batches of 1000 blocks: 100 000 per round
                ev = [["BlockStored", list(range(n, n + 500)), None, [], 4, None, None]]
                toks = [t & 0xFFFFFFFF for t in range(4 * n, 4 * (n + 500))]
                ev.append(["BlockStored", [b"\x07" * 24 + (n + 10 ** 9 + i).to_bytes(8, "big")
                                           for i in range(500)], None, toks, 4, None, None])
                pub.send(ev)
                n += 500
            want = base + (rnd + 1) * 100
            wait_for(lambda: metric(port, "kvpool_indexer_batches_total") >= want,
                     "the flood to be applied", timeout=60)
            rss.append(rss_kib(p.pid))
        assert metric(port, "kvpool_indexer_blocks") <= 20000
        assert metric(port, "kvpool_indexer_engine_hashes") <= 20000
        assert metric(port, "kvpool_indexer_evicted_blocks_total") >= 300000 - 20000
        assert metric(port, "kvpool_indexer_engine_hashes_evicted_total") > 0
        # the last two rounds add 200 000 blocks each: the memory does not follow them
        assert rss[2] - rss[0] < 8 * 1024, rss
        assert rss[2] < 128 * 1024, rss
    finally:
        p.stop()
        pub.close()
