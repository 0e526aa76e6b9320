"""kvpool-indexer's budgets per tenant and bounded batches (docs/indexer.md, "Budgets per
tenant"): a tenant flooding the index past --max-blocks evicts only its own blocks, never
another tenant's prefix; a clear or a resync costs what its publisher holds, not the whole
index; a large batch is applied in slices, so that another tenant's /query never waits for
all of it (an unregister in the middle of one included), nor for all of an unregister's
purge; with an ACL the series naming tenants go to an admin only.

Real parts: the kvpool-indexer binary (KVPOOL_INDEXER_BIN, else build/indexer/
kvpool-indexer) and publishers on 127.0.0.1 that frame their batches as vLLM's
ZmqEventPublisher does ([topic, seq as 8 bytes big-endian, msgpack]).
"""
import json
import os
import threading
import time
import urllib.error
import urllib.request

import msgpack
import pytest
import zmq

from conftest import Proc
from test_security import certs, no_ambient_credentials  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("KVPOOL_INDEXER_BIN", os.path.join(ROOT, "build", "indexer",
                                                         "kvpool-indexer"))
BS = 4

pytestmark = pytest.mark.skipif(not os.access(BIN, os.X_OK),
                                reason=f"no kvpool-indexer binary at {BIN}")


class Publisher:
    """vLLM's PUB socket (no replay: nothing here is lost)."""

    def __init__(self):
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.SNDHWM, 0)
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.seq = 0

    @property
    def endpoint(self):
        return f"tcp://127.0.0.1:{self.port}"

    def pack(self, events):
        return msgpack.packb([time.time(), events])

    def send_packed(self, payload):
        self.pub.send_multipart([b"kv", self.seq.to_bytes(8, "big"), payload])
        self.seq += 1

    def send(self, events):
        self.send_packed(self.pack(events))

    def close(self):
        self.ctx.destroy(linger=0)


def http(port, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            text = r.read().decode()
            return r.status, (json.loads(text) if path != "/metrics" else text)
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read().decode())


def metrics(port):
    s, text = http(port, "/metrics")
    assert s == 200
    return text


def metric(port, name, text=None):
    """The value of the line NAME (labels included in name), 0 when absent."""
    text = metrics(port) if text is None else text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def applied(port):
    return metric(port, "kvpool_indexer_batches_total")


def wait_for(cond, what, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def start(*args):
    p = Proc([BIN, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}", *args])
    return p, int(p.ready.rsplit(":", 1)[1])


def register(port, pub, tenant, instance):
    s, a = http(port, "/register", dict(endpoint=pub.endpoint, type="vLLM", modelname="m",
                                        tenant_id=tenant, instance_id=instance,
                                        block_size=BS, dp_rank=0))
    assert s == 200, a


def synced(port, pub):
    """Publish empty batches until the indexer has applied one (ZeroMQ's slow joiner)."""
    before = applied(port)

    def seen():
        pub.send([])
        time.sleep(0.02)
        return applied(port) > before
    wait_for(seen, "the indexer to take a batch")


def send_and_wait(port, pub, events_or_payload):
    want = applied(port) + 1
    if isinstance(events_or_payload, bytes):
        pub.send_packed(events_or_payload)
    else:
        pub.send(events_or_payload)
    wait_for(lambda: applied(port) >= want, "the batch to be applied", timeout=60)


def stored(hashes, tokens=None, parent=None):
    return ["BlockStored", list(hashes), parent, [] if tokens is None else tokens, BS, None,
            None]


def query_hashes(port, tenant, hashes):
    s, a = http(port, "/query_by_hash", {"model": "m", "block_size": BS, "tenant_id": tenant,
                                         "seq_hashes": list(hashes)})
    assert s == 200, a
    return a[tenant]


def engine_hashes(base, n):
    """n 32-byte vLLM-like block hashes (the indexer maps them to its standard ones)."""
    return [b"\x0a" * 24 + (base + i).to_bytes(8, "big") for i in range(n)]


def test_one_tenant_cannot_evict_another():
    """team-b floods 2.5 x --max-blocks unique blocks after team-a stored a prefix of 1 000
    blocks: team-a's prompt still matches all its tokens, the evictions are team-b's own
    (counted per tenant), and the index stays within --max-blocks."""
    a_pub, b_pub = Publisher(), Publisher()
    p, port = start("--max-blocks", "20000")
    try:
        register(port, a_pub, "team-a", "engine-a")
        register(port, b_pub, "team-b", "engine-b")
        synced(port, a_pub)
        synced(port, b_pub)
        tokens = [(7919 * i + 13) & 0xFFFFFFFF for i in range(1000 * BS)]
        send_and_wait(port, a_pub, [stored(engine_hashes(0, 1000), tokens)])

        def a_tokens():
            s, r = http(port, "/query", {"model": "m", "block_size": BS,
                                         "tenant_id": "team-a", "token_ids": tokens})
            assert s == 200, r
            return r["team-a"]["engine-a"]["longest_matched"]
        assert a_tokens() == 4000
        n = 0
        for _ in range(25):  # 25 batches of 2 000 unique blocks: 50 000
            send_and_wait(port, b_pub, [stored(range(10 ** 9 + n, 10 ** 9 + n + 2000))])
            n += 2000
        assert a_tokens() == 4000
        text = metrics(port)
        assert metric(port, "kvpool_indexer_blocks", text) <= 20000
        evicted_b = metric(port, 'kvpool_indexer_tenant_evicted_blocks_total{tenant="team-b"}',
                           text)
        assert evicted_b >= 50000 - 19000, text
        assert metric(port, 'kvpool_indexer_tenant_evicted_blocks_total{tenant="team-a"}',
                      text) == 0
        assert metric(port, 'kvpool_indexer_tenant_blocks{tenant="team-a"}', text) == 1000
        assert metric(port, "kvpool_indexer_evicted_blocks_total", text) == evicted_b
        # team-b's newest blocks are there: it evicted its own least recently stored
        last = list(range(10 ** 9 + n - 100, 10 ** 9 + n))
        assert query_hashes(port, "team-b", last)["engine-b"]["GPU"] == 100 * BS
        assert query_hashes(port, "team-b", [10 ** 9])["engine-b"]["GPU"] == 0
    finally:
        p.stop()
        a_pub.close()
        b_pub.close()


def test_max_blocks_per_tenant():
    """--max-blocks-per-tenant: a tenant keeps at most that many blocks, well under
    --max-blocks; the other tenant's blocks stay."""
    a_pub, b_pub = Publisher(), Publisher()
    p, port = start("--max-blocks", "100000", "--max-blocks-per-tenant", "3000")
    try:
        register(port, a_pub, "team-a", "engine-a")
        register(port, b_pub, "team-b", "engine-b")
        synced(port, a_pub)
        synced(port, b_pub)
        send_and_wait(port, a_pub, [stored(range(1, 2001))])
        send_and_wait(port, b_pub, [stored(range(10 ** 9, 10 ** 9 + 10000))])
        text = metrics(port)
        assert metric(port, 'kvpool_indexer_tenant_blocks{tenant="team-b"}', text) == 3000
        assert metric(port, 'kvpool_indexer_tenant_blocks{tenant="team-a"}', text) == 2000
        assert metric(port, "kvpool_indexer_tenant_block_budget", text) == 3000
        assert metric(port, 'kvpool_indexer_tenant_evicted_blocks_total{tenant="team-b"}',
                      text) == 7000
        assert query_hashes(port, "team-a", range(1, 2001))["engine-a"]["GPU"] == 2000 * BS
    finally:
        p.stop()
        a_pub.close()
        b_pub.close()


class Prober:
    """team-a's /query_by_hash in a loop on a thread of its own, each answer's latency kept
    (and checked: team-a's prefix is matched whole every time)."""

    def __init__(self, port, hashes):
        self.port, self.hashes = port, hashes
        self.lat, self.bad, self.at = [], [], []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            got = query_hashes(self.port, "team-a", self.hashes)["engine-a"]["GPU"]
            self.lat.append(time.monotonic() - t0)
            self.at.append(t0)
            if got != len(self.hashes) * BS:
                self.bad.append(got)

    def __enter__(self):
        self.t.start()
        wait_for(lambda: len(self.lat) >= 20, "the first queries")
        return self

    def __exit__(self, *exc):
        time.sleep(0.2)  # a few more queries after the batch
        self.stop.set()
        self.t.join(30)

    def p99(self):
        s = sorted(self.lat)
        return s[min(len(s) - 1, int(len(s) * 0.99))]


A_BLOCKS = 200000


def team_a_holding(port, a_pub):
    """team-a holds A_BLOCKS blocks, stored in batches of 50 000."""
    for k in range(0, A_BLOCKS, 50000):
        send_and_wait(port, a_pub, [stored(range(1 + k, 1 + k + 50000))])
    assert metric(port, 'kvpool_indexer_tenant_blocks{tenant="team-a"}') == A_BLOCKS


def test_store_clear_pairs_cost_what_the_publisher_holds():
    """The hostile batch, sent 10 times: 2 500 [BlockStored, AllBlocksCleared] pairs from
    team-b's publisher while team-a holds 200 000 blocks. Each clear costs what team-b's
    publisher holds (one block), not a walk of every node: team-a's queries answered
    meanwhile stay fast and whole, and each batch is applied as sent (team-b ends holding
    only its last block)."""
    a_pub, b_pub = Publisher(), Publisher()
    p, port = start()
    try:
        register(port, a_pub, "team-a", "engine-a")
        register(port, b_pub, "team-b", "engine-b")
        synced(port, a_pub)
        synced(port, b_pub)
        team_a_holding(port, a_pub)
        events = []
        for i in range(2500):
            events += [stored([5 * 10 ** 9 + i]), ["AllBlocksCleared"]]
        events.append(stored([7 * 10 ** 9]))
        payload = b_pub.pack(events)  # packed before the prober starts (the GIL)
        visits = metric(port, "kvpool_indexer_purge_visits_total")
        with Prober(port, range(1, 65)) as pr:
            for _ in range(10):
                send_and_wait(port, b_pub, payload)
        assert not pr.bad, pr.bad[:5]
        assert pr.p99() < 0.050, (pr.p99(), max(pr.lat), len(pr.lat))
        assert max(pr.lat) < 1.0, (max(pr.lat), len(pr.lat))
        # 25 000 clears of one block each (two for the first of a batch: the last batch's
        # block too): about one entry looked at each, not 200 000
        assert metric(port, "kvpool_indexer_purge_visits_total") - visits <= 2 * 10 * 2500
        assert metric(port, 'kvpool_indexer_tenant_blocks{tenant="team-b"}') == 1
        assert query_hashes(port, "team-b", [7 * 10 ** 9])["engine-b"]["GPU"] == BS
        assert query_hashes(port, "team-b", [5 * 10 ** 9 + 2499])["engine-b"]["GPU"] == 0
        assert query_hashes(port, "team-a", range(1, 1 + A_BLOCKS, 1000)[:1])[
            "engine-a"]["GPU"] == BS
        assert metric(port, "kvpool_indexer_blocks") == A_BLOCKS + 1
    finally:
        p.stop()
        a_pub.close()
        b_pub.close()


def test_large_batch_applied_in_slices():
    """One batch of team-b's storing 1 000 000 blocks, clearing them and storing them again:
    the indexer lets the write lock go between slices, so team-a's queries during it stay
    fast (before, one waited for all of it: about 2 s here); the batch is applied in order and
    whole (team-b holds the 1 000 000 after it)."""
    a_pub, b_pub = Publisher(), Publisher()
    p, port = start()
    try:
        register(port, a_pub, "team-a", "engine-a")
        register(port, b_pub, "team-b", "engine-b")
        synced(port, a_pub)
        synced(port, b_pub)
        team_a_holding(port, a_pub)
        big = range(10 ** 10, 10 ** 10 + 1000000)
        payload = b_pub.pack([stored(big), ["AllBlocksCleared"], stored(big)])
        slices = metric(port, "kvpool_indexer_write_slices_total")
        with Prober(port, range(1, 65)) as pr:
            send_and_wait(port, b_pub, payload)
        assert not pr.bad, pr.bad[:5]
        # the slices are about a millisecond; what is left of the tail is the tables'
        # growth and this machine's other work
        assert max(pr.lat) < 0.5, (max(pr.lat), len(pr.lat))
        assert pr.p99() < 0.100, (pr.p99(), max(pr.lat), len(pr.lat))
        assert metric(port, "kvpool_indexer_write_slices_total") - slices >= 100
        text = metrics(port)
        assert metric(port, 'kvpool_indexer_tenant_blocks{tenant="team-b"}', text) == 1000000
        assert metric(port, "kvpool_indexer_blocks", text) == A_BLOCKS + 1000000
        ends = [10 ** 10, 10 ** 10 + 999999]
        for h in ends:
            assert query_hashes(port, "team-b", [h])["engine-b"]["GPU"] == BS
    finally:
        p.stop()
        a_pub.close()
        b_pub.close()


def test_unregister_during_a_sliced_batch():
    """team-b unregisters while its batch of 1 000 000 blocks is being applied (the lock let
    go between slices): the rest of the batch is dropped, team-b's blocks all go, the indexer
    keeps serving, and team-a's blocks are intact."""
    a_pub, b_pub = Publisher(), Publisher()
    p, port = start()
    try:
        register(port, a_pub, "team-a", "engine-a")
        register(port, b_pub, "team-b", "engine-b")
        synced(port, a_pub)
        synced(port, b_pub)
        send_and_wait(port, a_pub, [stored(range(1, 1001))])
        payload = b_pub.pack([stored(range(10 ** 10, 10 ** 10 + 1000000))])
        want = applied(port) + 1
        slices = metric(port, "kvpool_indexer_write_slices_total")
        b_pub.send_packed(payload)
        wait_for(lambda: metric(port, "kvpool_indexer_write_slices_total") > slices + 5,
                 "the batch to be under way")
        s, a = http(port, "/unregister", {"instance_id": "engine-b", "tenant_id": "team-b"})
        assert s == 200, a
        wait_for(lambda: applied(port) >= want, "the batch to end", timeout=60)
        wait_for(lambda: metric(port, 'kvpool_indexer_tenant_blocks{tenant="team-b"}') == 0,
                 "team-b's blocks to be purged")
        assert metric(port, "kvpool_indexer_blocks") == 1000
        assert query_hashes(port, "team-a", range(1, 1001))["engine-a"]["GPU"] == 1000 * BS
        s, a = http(port, "/query_by_hash", {"model": "m", "block_size": BS,
                                             "tenant_id": "team-b", "seq_hashes": [10 ** 10]})
        assert s == 200 and a == {"team-b": {}}, a
        assert p.p.poll() is None
    finally:
        p.stop()
        a_pub.close()
        b_pub.close()


B_BLOCKS = 2000000


def test_unregister_of_millions_of_blocks_lets_queries_in():
    """team-b holds 2 000 000 blocks and unregisters while team-a queries in a loop: when the
    answer comes the registration and its blocks are gone from answers, and the blocks are
    purged after it a slice at a time, the write lock let go between slices, so no query of
    team-a's waits for all of it (before, one waited for the whole purge, 0.9-1.4 s here,
    and the unregister's HTTP thread held the other connections it served as long). team-a's
    blocks stay whole, and team-b's name can be registered again."""
    a_pub, b_pub = Publisher(), Publisher()
    p, port = start()
    try:
        register(port, a_pub, "team-a", "engine-a")
        register(port, b_pub, "team-b", "engine-b")
        synced(port, a_pub)
        synced(port, b_pub)
        send_and_wait(port, a_pub, [stored(range(1, 1001))])
        send_and_wait(port, b_pub, [stored(range(10 ** 10, 10 ** 10 + B_BLOCKS))])
        assert metric(port, 'kvpool_indexer_tenant_blocks{tenant="team-b"}') == B_BLOCKS
        slices = metric(port, "kvpool_indexer_write_slices_total")
        with Prober(port, range(1, 65)) as pr:
            t0 = time.monotonic()
            s, a = http(port, "/unregister", {"instance_id": "engine-b", "tenant_id": "team-b"})
            assert s == 200 and a["removed_instances"] == ["engine-b|team-b|0"], a
            ends = [10 ** 10, 10 ** 10 + B_BLOCKS - 1]
            s, a = http(port, "/query_by_hash", {"model": "m", "block_size": BS,
                                                 "tenant_id": "team-b", "seq_hashes": ends})
            assert s == 200 and a == {"team-b": {}}, a
            wait_for(lambda: metric(
                port, 'kvpool_indexer_tenant_blocks{tenant="team-b"}') == 0, "the purge")
            t1 = time.monotonic()
        assert not pr.bad, pr.bad[:5]
        during = [lat for at, lat in zip(pr.at, pr.lat) if t0 <= at + lat and at <= t1]
        # a slice is about a millisecond: the queries during the purge took 20 ms at most
        # here, once in a few runs one waits 100-130 ms for this loaded 2-core VM's scheduler
        top = sorted(during)[-5:]
        assert max(pr.lat) < 0.200, (max(pr.lat), top, len(during), t1 - t0)
        assert pr.p99() < 0.050, (pr.p99(), top, len(during), t1 - t0)
        assert len(during) >= 3, (len(during), t1 - t0)  # queries overlapped the purge
        # 2 000 000 held entries, about 8 192 a slice
        assert metric(port, "kvpool_indexer_write_slices_total") - slices >= 200
        assert metric(port, "kvpool_indexer_blocks") == 1000
        assert metric(port, "kvpool_indexer_registrations_unregistering") == 0
        assert query_hashes(port, "team-a", range(1, 1001))["engine-a"]["GPU"] == 1000 * BS
        s, a = http(port, "/unregister", {"instance_id": "engine-b", "tenant_id": "team-b"})
        assert s == 404, a
        # the name is free again: registered anew, it holds nothing of the old one's
        register(port, b_pub, "team-b", "engine-b")
        assert query_hashes(port, "team-b", [10 ** 10])["engine-b"]["GPU"] == 0
        assert p.p.poll() is None
    finally:
        p.stop()
        a_pub.close()
        b_pub.close()


def test_tenant_series_only_for_an_admin(certs, tmp_path):  # noqa: F811
    """With an ACL, the series that name tenants (their blocks and evictions) go to an
    admin's scrape only: a stranger and a tenant's own router get every other series."""
    from test_indexer_security import PRINCIPALS, acl_text, call
    acl = tmp_path / "acl.conf"
    acl.write_text(acl_text(PRINCIPALS))
    pub = Publisher()
    p = Proc([BIN, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}", "--tls-cert",
              certs.server_crt, "--tls-key", certs.server_key, "--tls-ca", certs.ca,
              "--tls-crl", certs.crl, "--acl-file", str(acl), "--max-blocks", "100"])
    port = int(p.ready.rsplit(":", 1)[1])
    try:
        s, a = call(certs, port, "/register", dict(endpoint=pub.endpoint, type="vLLM",
                                                   modelname="m", instance_id="engine-a",
                                                   block_size=BS, dp_rank=0), who="router-a")
        assert s == 200, a

        def blocks():
            pub.send([stored(range(1, 301))])  # past --max-blocks: evicted, counted
            time.sleep(0.05)
            _, text = call(certs, port, "/metrics", who="admin")
            return 'kvpool_indexer_tenant_blocks{tenant="team-a"} 100' in text
        wait_for(blocks, "team-a's blocks")
        _, text = call(certs, port, "/metrics", who="admin")
        assert 'kvpool_indexer_tenant_evicted_blocks_total{tenant="team-a"}' in text
        for who in (None, "router-a", "reader-a"):
            _, text = call(certs, port, "/metrics", who=who)
            assert "kvpool_indexer_blocks 100" in text
            assert "team-a" not in text, who
            assert "kvpool_indexer_tenant_blocks" not in text, who
            assert "kvpool_indexer_tenant_evicted_blocks_total" not in text, who
    finally:
        p.stop()
        pub.close()
