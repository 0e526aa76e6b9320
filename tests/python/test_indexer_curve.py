"""kvpool-indexer and a kvpool master whose KV events are CURVE servers (docs/indexer.md,
"Security and limits"; docs/security.md, "KV events: CURVE"): the indexer, with its own key
pair (--curve-secret) in the master's allow-list, subscribes to a publisher registered with
its curve_server_key, hears the blocks the pool stores (as CPU), and after a kill -9 and a
restart replays them from the master's replay socket, naming the stream's topic. An indexer
without the key hears nothing (the master counts the refused handshake); a key the indexer
cannot use is refused at /register, and a secret key file others may read at start.

Real parts: kvpool-master with --kv-events-curve-*, a segment (kvpool.Client with its
own segment), kvpool-indexer, keys from deploy/make-curve-keys.sh.
"""
import json
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest

import kvpool
from conftest import TLS_DIR, Proc, master_security_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("KVPOOL_INDEXER_BIN", os.path.join(ROOT, "build", "indexer",
                                                         "kvpool-indexer"))
MASTER = os.environ.get("KVPOOL_MASTER_BIN", os.path.join(ROOT, "build", "master",
                                                           "kvpool-master"))
pytestmark = pytest.mark.skipif(not os.access(BIN, os.X_OK),
                                reason=f"no kvpool-indexer binary at {BIN}")


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def cpu(port, h):
    s, a = post(port, "/query_by_hash", {"model": "m", "block_size": 16, "seq_hashes": [h]})
    assert s == 200, a
    return a["default"].get("pool", {}).get("CPU", 0)


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(name)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("curve") / "keys"
    r = subprocess.run(["bash", os.path.join(ROOT, "deploy", "make-curve-keys.sh"), str(d),
                        "master", "indexer"], capture_output=True, text=True, timeout=60)
    if r.returncode != 0 and "zmq" in r.stderr:
        pytest.skip(f"no python3-zmq with CURVE: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    return d


@pytest.fixture(scope="module")
def pool(keys, tmp_path_factory):
    d = tmp_path_factory.mktemp("curvepool")
    allow = d / "allow.conf"
    allow.write_text((keys / "indexer.pub").read_text().strip() + " *\n")
    allow.chmod(0o600)
    from conftest import free_port
    ev, rp, http = free_port(), free_port(), free_port()
    m = Proc([MASTER, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}",
              "--http-listen", f"127.0.0.1:{http}",
              "--kv-events-bind", f"tcp://127.0.0.1:{ev}",
              "--kv-events-replay-bind", f"tcp://127.0.0.1:{rp}",
              "--kv-events-model", "m", "--kv-events-block-size", "16",
              "--kv-events-curve-secret", str(keys / "master.key"),
              "--kv-events-curve-allow", str(allow), *master_security_args()])
    c = kvpool.Client(master=m.ready, segment_size="64MiB")
    yield m, c, ev, rp, http
    c.close()
    m.stop()


def start_indexer(*args):
    p = Proc([BIN, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}", *args])
    return p, int(p.ready.rsplit(":", 1)[1])


def put_until_seen(client, port, base, tries=30):
    """Put keys ending in base+i until the indexer sees one: ZeroMQ subscribes in the
    background. The hash seen."""
    for i in range(tries):
        h = base + i
        client.put(f"cv@{h:016x}", b"x" * 64)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            if cpu(port, h) == 16:
                return h
            time.sleep(0.02)
    raise AssertionError("the indexer never saw a block of the pool")


def test_curve_publisher(keys, pool, tmp_path):
    m, client, ev, rp, http = pool
    server_key = (keys / "master.pub").read_text().strip()
    reg = {"endpoint": f"tcp://127.0.0.1:{ev}", "replay_endpoint": f"tcp://127.0.0.1:{rp}",
           "type": "kvpool", "modelname": "m", "instance_id": "pool", "block_size": 16,
           "dp_rank": 0, "curve_server_key": server_key}
    state = tmp_path / "state"
    p, port = start_indexer("--curve-secret", str(keys / "indexer.key"), "--state-dir",
                            str(state))
    try:
        assert post(port, "/register", reg)[0] == 200
        h = put_until_seen(client, port, 0x7c00000000000000)
        assert json.loads((state / "registrations.json").read_text())["kvevent_instance"][
            "0"]["curve_server_key"] == server_key
        # kill -9; the pool stores one more block meanwhile; the restarted indexer replays
        # the stream (its topic named) from its first message on
        p.stop(sig=signal.SIGKILL)
        client.put(f"cv@{h + 1000:016x}", b"y" * 64)
        p, port = start_indexer("--curve-secret", str(keys / "indexer.key"), "--state-dir",
                                str(state))
        h2 = put_until_seen(client, port, 0x7d00000000000000)
        assert cpu(port, h) == 16 and cpu(port, h + 1000) == 16 and cpu(port, h2) == 16
        assert metric(port, "kvpool_indexer_replayed_batches_total") >= 2
        assert metric(port, 'kvpool_indexer_resyncs_total{reason="gap"}') == 0
    finally:
        p.stop()


def test_without_the_key_nothing_is_heard(keys, pool):
    m, client, ev, rp, http = pool
    p, port = start_indexer()
    try:
        # the key cannot be used without a key pair of the indexer's own
        s, a = post(port, "/register", {"endpoint": f"tcp://127.0.0.1:{ev}", "type": "kvpool",
                                         "modelname": "m", "instance_id": "pool",
                                         "block_size": 16, "dp_rank": 0,
                                         "curve_server_key": "x" * 40})
        assert s == 400 and "--curve-secret" in a["error"], a
        s, a = post(port, "/register", {"endpoint": f"tcp://127.0.0.1:{ev}", "type": "kvpool",
                                         "modelname": "m", "instance_id": "pool",
                                         "block_size": 16, "dp_rank": 0})
        assert s == 200, a

        def refused():
            url, ctx = f"http://127.0.0.1:{http}/metrics", None
            if TLS_DIR is not None:  # the TLS pass: the master's HTTP is HTTPS
                ctx = ssl.create_default_context(cafile=os.path.join(TLS_DIR, "ca.crt"))
                url = "https" + url[4:]
            with urllib.request.urlopen(url, timeout=10, context=ctx) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith('kvpool_kv_events_refused_total{reason="curve"}'):
                        return float(line.split()[1])
            return 0.0
        deadline = time.monotonic() + 10
        while refused() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert refused() > 0  # the plaintext subscriber's handshake was refused
        for i in range(5):
            client.put(f"cv@{0x7e00000000000000 + i:016x}", b"z" * 64)
        time.sleep(0.3)  # nothing to wait for: nothing may come
        assert all(cpu(port, 0x7e00000000000000 + i) == 0 for i in range(5))
        assert metric(port, "kvpool_indexer_batches_total") == 0
    finally:
        p.stop()


def test_secret_key_file_checks(keys, tmp_path):
    loose = tmp_path / "loose.key"
    loose.write_text((keys / "indexer.key").read_text())
    loose.chmod(0o644)
    r = subprocess.run([BIN, "--listen", "127.0.0.1:0", "--curve-secret", str(loose)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "chmod 600" in r.stderr
    bad = tmp_path / "bad.key"
    bad.write_text("not a key\n")
    bad.chmod(0o600)
    r = subprocess.run([BIN, "--listen", "127.0.0.1:0", "--curve-secret", str(bad)],
                       capture_output=True, text=True, timeout=10)
    assert r.returncode == 2 and "not a CURVE secret key" in r.stderr
    assert (keys / "indexer.key").read_text().strip() not in r.stderr
