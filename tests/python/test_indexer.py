"""kvpool-indexer (issue 46) end to end, against docs/indexer.md.

Real processes on 127.0.0.1: the kvpool-indexer binary ($KVPOOL_INDEXER_BIN, else
build/indexer/kvpool-indexer of this repository), engine publishers speaking vLLM's
exact framing (vllm_publisher.py, a double written from vLLM's kv_events.py), a real
kvpool master publishing its KV events, and a reference model of the document's
semantics (indexer_model.py) that every /query and /query_by_hash answer is compared
with, exactly.

No sleeps where an event can be waited on: a publisher knows when the indexer's
subscription reached it (its XPUB sees the subscribe message), and the tests wait for
the indexer to have applied a batch by polling GET /instances (each publisher's last
seq) or /metrics, each wait bounded by a deadline.
"""

import http.client
import json
import os
import random
import select
import socket
import time
from pathlib import Path

import msgpack
import pytest
import xxhash

import indexer_model as im
from conftest import Proc, free_port, master_security_args, metric
from vllm_publisher import (MASK, Publisher, cleared, digest32, envelope, removed,
                            stored)

ROOT = Path(__file__).resolve().parents[2]
INDEXER_BIN = os.environ.get("KVPOOL_INDEXER_BIN") or str(ROOT / "build/indexer/kvpool-indexer")

pytestmark = pytest.mark.skipif(
    not os.access(INDEXER_BIN, os.X_OK),
    reason=f"no kvpool-indexer binary at {INDEXER_BIN} (build it, or set KVPOOL_INDEXER_BIN)")

BODY_LIMIT = 16 << 20


# ---------------------------------------------------------------- the daemon


class Indexer:
    """A kvpool-indexer started with --ready-fd, and an HTTP client to it."""

    def __init__(self, *args, listen=True, env=None):
        self.args = args
        self.proc = Proc([INDEXER_BIN, *(["--listen", "127.0.0.1:0"] if listen else []),
                          "--ready-fd", "{fd}", "--log-level", "error", *args], env=env)
        self.port = int(self.proc.ready.rsplit(":", 1)[1])
        self.conn = None

    def close(self):
        if self.conn is not None:
            self.conn.close()
        return self.proc.stop()

    def request(self, method, path, body=None, headers=None, timeout=30.0):
        """(status, body parsed as JSON when it is JSON, else text)."""
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        h = {"Content-Type": "application/json"} if body is not None else {}
        h.update(headers or {})
        for attempt in range(2):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port,
                                                           timeout=timeout)
                elif self.conn.sock is not None:
                    self.conn.sock.settimeout(timeout)
                self.conn.request(method, path, body=body, headers=h)
                r = self.conn.getresponse()
                data = r.read()
                if r.will_close:
                    self.conn.close()
                    self.conn = None
                break
            except (ConnectionError, http.client.HTTPException):
                # a kept-alive connection the server closed meanwhile: once more, anew
                if self.conn is not None:
                    self.conn.close()
                self.conn = None
                if attempt:
                    raise
        try:
            return r.status, json.loads(data)
        except ValueError:
            return r.status, data.decode(errors="replace")

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def get(self, path):
        return self.request("GET", path)

    def ok(self, path, body):
        st, ans = self.post(path, body)
        assert st == 200, (path, body if len(str(body)) < 500 else "...", st, ans)
        return ans

    def alive(self):
        assert self.proc.p.poll() is None, f"kvpool-indexer exited: {self.proc.p.returncode}"
        st, ans = self.get("/health")
        assert (st, ans) == (200, {"status": "ok"}), (st, ans)

    def metrics(self):
        st, text = self.get("/metrics")
        assert st == 200
        return text

    def metric(self, name, labels=None, text=None):
        return metric(text if text is not None else self.metrics(), name, labels) or 0.0

    def metric_sum(self, name, text=None):
        """The sum of every sample of name (all label sets)."""
        total = 0.0
        for line in (text if text is not None else self.metrics()).splitlines():
            if line.startswith(name + "{") or line.startswith(name + " "):
                total += float(line.rpartition(" ")[2])
        return total

    def instances(self):
        st, ans = self.get("/instances")
        assert st == 200, (st, ans)
        return ans

    def publisher_entries(self, endpoint, inst=None):
        """Every publisher object of GET /instances whose endpoint is endpoint."""
        out = []

        def walk(x):
            if isinstance(x, dict):
                if x.get("endpoint") == endpoint:
                    out.append(x)
                for v in x.values():
                    walk(v)
            elif isinstance(x, list):
                for v in x:
                    walk(v)

        walk(self.instances() if inst is None else inst)
        return out

    def wait(self, pred, what, timeout=10.0):
        deadline = time.monotonic() + timeout
        while True:
            v = pred()
            if v:
                return v
            assert time.monotonic() < deadline, f"no {what} within {timeout} s"
            time.sleep(0.01)

    def wait_seq(self, pub, timeout=10.0):
        """Wait until the indexer applied pub's batches up to its last seq."""
        want = pub.last_seq

        def done():
            entries = self.publisher_entries(pub.endpoint)
            return entries and all(e.get("seq", e.get("last_seq")) == want for e in entries)

        self.wait(done, f"seq {want} of {pub.endpoint} applied", timeout)

    def wait_metric(self, name, labels, at_least, timeout=10.0):
        return self.wait(lambda: self.metric(name, labels) >= at_least or None,
                         f"{name}{labels or ''} >= {at_least}", timeout)


@pytest.fixture
def indexer():
    made = []

    def make(*args, **kw):
        ix = Indexer(*args, **kw)
        made.append(ix)
        return ix

    yield make
    bad = []
    for ix in made:
        rc = ix.close()
        if rc != 0:
            bad.append(rc)
    assert not bad, f"kvpool-indexer exited {bad}"


@pytest.fixture
def publishers():
    made = []

    def make(**kw):
        p = Publisher(**kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


class World:
    """An indexer, the model, and publishers: every registration and every batch goes
    to both, so that the answers can be compared."""

    def __init__(self, ix, seed=0):
        self.ix = ix
        self.model = im.Model(seed)
        self.pubs = []

    def register(self, pub, instance, rank=0, tenant="default", scope=("m", "", 16, ""),
                 type_="vLLM", replay=True, omit_defaults=False):
        model, lora, bs, salt = scope
        body = {"endpoint": pub.endpoint, "type": type_, "modelname": model,
                "instance_id": instance, "block_size": bs, "dp_rank": rank}
        if replay and pub.replay_endpoint:
            body["replay_endpoint"] = pub.replay_endpoint
        if not (omit_defaults and tenant == "default"):
            body["tenant_id"] = tenant
        if not (omit_defaults and lora == ""):
            body["lora_name"] = lora
        if not (omit_defaults and salt == ""):
            body["additionalsalt"] = salt
        ans = self.ix.ok("/register", body)
        assert ans == {"status": "registered successfully", "instance_id": instance}, ans
        self.model.register(instance, tenant, rank, scope, pub.endpoint, type_)
        if pub not in self.pubs and isinstance(pub, Publisher):
            self.pubs.append(pub)

    def send(self, publisher, events, dp_rank=None, **kw):
        s = publisher.publish(events, dp_rank, **kw)
        self.model.apply_batch(publisher.endpoint, events, dp_rank)
        return s

    def settle(self, pubs=None):
        for p in pubs or self.pubs:
            if p.last_seq >= 0:
                self.ix.wait_seq(p)

    def query_body(self, tenant, scope, instance, rng=None, **extra):
        model, lora, bs, salt = scope
        body = {"model": model, "block_size": bs, **extra}
        rng = rng or random
        if tenant != "default" or rng.random() < 0.5:
            body["tenant_id"] = tenant
        if lora or rng.random() < 0.3:
            body["lora_name"] = lora
        if salt or rng.random() < 0.3:
            body["cache_salt"] = salt
        if instance is not None:
            body["instance_id"] = instance
        return body

    def query(self, tenant, scope, tokens, instance=None, rng=None):
        """(indexer's /query answer, the model's)."""
        ans = self.ix.ok("/query", self.query_body(tenant, scope, instance, rng,
                                                    token_ids=tokens))
        return ans, self.model.query(tenant, scope, tokens, instance)

    def query_hashes(self, tenant, scope, hashes, instance=None, rng=None, legacy=False):
        field = "block_hash" if legacy else "seq_hashes"
        ans = self.ix.ok("/query_by_hash", self.query_body(tenant, scope, instance, rng,
                                                            **{field: hashes}))
        return ans, self.model.query_hashes(tenant, scope, hashes, instance)

    def check(self, tenant, scope, tokens=None, hashes=None, instance=None, rng=None,
              legacy=False):
        """One query compared with the model; a mismatch is re-asked for up to 1 s (the
        indexer may still be applying), then reported."""
        deadline = time.monotonic() + 1.0
        while True:
            if tokens is not None:
                got, want = self.query(tenant, scope, tokens, instance, rng)
            else:
                got, want = self.query_hashes(tenant, scope, hashes, instance, rng, legacy)
            if got == want or time.monotonic() > deadline:
                return got, want
            time.sleep(0.02)


def tokens_of(rng, nblocks, bs=16):
    return [rng.randrange(1 << 32) for _ in range(nblocks * bs)]


def assert_same(got, want, what=""):
    assert got == want, f"{what}\n indexer: {json.dumps(got, sort_keys=True)}\n" \
                        f"   model: {json.dumps(want, sort_keys=True)}"


# ---------------------------------------------------------------- the HTTP API


REG = {"endpoint": "tcp://127.0.0.1:1", "replay_endpoint": "tcp://127.0.0.1:2", "type": "vLLM",
       "modelname": "m", "lora_name": "", "tenant_id": "default", "instance_id": "i1",
       "block_size": 16, "dp_rank": 0, "additionalsalt": ""}


def without(d, k):
    return {x: v for x, v in d.items() if x != k}


def test_api_answers_and_errors(indexer):
    ix = indexer()
    ix.alive()
    port_a, port_b = free_port(), free_port()
    ep_a, ep_b = f"tcp://127.0.0.1:{port_a}", f"tcp://127.0.0.1:{port_b}"

    # registrations: the answer, /instances, one subscription per tenant and endpoint
    assert ix.ok("/register", {**REG, "endpoint": ep_a}) == \
        {"status": "registered successfully", "instance_id": "i1"}
    # only the required fields: defaults for the rest
    assert ix.ok("/register", {"endpoint": ep_a, "type": "SGLang", "modelname": "m",
                               "instance_id": "i2", "block_size": 16, "dp_rank": 1}) == \
        {"status": "registered successfully", "instance_id": "i2"}
    ix.ok("/register", {**REG, "endpoint": ep_b, "type": "kvpool", "instance_id": "i2",
                        "dp_rank": 1})
    ix.ok("/register", {**REG, "endpoint": ep_b, "instance_id": "i3", "tenant_id": "acme",
                        "lora_name": "sql", "additionalsalt": "w8a8", "block_size": 32})
    inst = ix.instances()
    text = json.dumps(inst)
    for v in ("i1", "i2", "i3", "acme", "sql", "w8a8", ep_a, ep_b, "tcp://127.0.0.1:2"):
        assert v in text, (v, inst)
    assert len(ix.publisher_entries(ep_a, inst)) == 2  # i1|default|0, i2|default|1
    assert len(ix.publisher_entries(ep_b, inst)) == 2  # i2|default|1, i3|acme|0
    m = ix.metrics()
    assert ix.metric("kvpool_indexer_registrations", text=m) == 3
    assert ix.metric("kvpool_indexer_subscriptions", text=m) == 3  # one per tenant and endpoint

    # a query answers every registered instance of the scope, hits or not
    ans = ix.ok("/query", {"model": "m", "block_size": 16, "token_ids": list(range(40))})
    zero = {"longest_matched": 0, "GPU": 0, "CPU": 0, "DISK": 0}
    assert ans == {"default": {
        "i1": {**zero, "DP": {"0": 0}, "rank_matches": {"0": {"gpu": 0, "cpu": 0, "disk": 0}}},
        "i2": {**zero, "DP": {"1": 0}, "rank_matches": {"1": {"gpu": 0, "cpu": 0, "disk": 0}}}}}
    ans = ix.ok("/query_by_hash", {"model": "m", "lora_name": "sql", "cache_salt": "w8a8",
                                   "tenant_id": "acme", "block_size": 32, "seq_hashes": [1, 2]})
    assert ans == {"acme": {"i3": {**zero, "DP": {"0": 0},
                                   "rank_matches": {"0": {"gpu": 0, "cpu": 0, "disk": 0}}}}}
    ans = ix.ok("/query", {"model": "m", "block_size": 16, "token_ids": [], "instance_id": "i2"})
    assert list(ans["default"]) == ["i2"]

    refused0 = ix.metric_sum("kvpool_indexer_http_refused_total")

    def refused(method, path, body, code, json_error=True):
        st, ans = ix.request(method, path, body)
        assert st == code, (method, path, str(body)[:200], st, ans)
        assert not json_error or isinstance(ans, dict) and isinstance(ans.get("error"), str) and ans["error"], \
            (method, path, str(body)[:200], ans)
        ix.alive()

    bad_json = [b"", b"{", b"{\"endpoint\": }", b"not json", b"[]", b"null", b"42",
                b"\"register\"", b"{\"a\": 1} trailing", b"\xff\xfe{}"]
    for b in bad_json:
        for path in ("/register", "/unregister", "/query", "/query_by_hash"):
            refused("POST", path, b, 400)

    for field in ("endpoint", "type", "modelname", "instance_id", "block_size", "dp_rank"):
        refused("POST", "/register", without(REG, field), 400)
    wrong = [("endpoint", 5), ("endpoint", None), ("endpoint", ["tcp://127.0.0.1:1"]),
             ("replay_endpoint", 3), ("type", 1), ("type", None), ("modelname", 2),
             ("modelname", {}), ("lora_name", 1), ("tenant_id", 7), ("tenant_id", []),
             ("instance_id", 5), ("instance_id", None), ("block_size", "16"),
             ("block_size", 16.5), ("block_size", True), ("block_size", None),
             ("dp_rank", "0"), ("dp_rank", 0.5), ("dp_rank", False), ("dp_rank", [0]),
             ("additionalsalt", []),
             # absurd values
             ("block_size", 0), ("block_size", -16), ("block_size", 65537),
             ("block_size", 1 << 40), ("block_size", 1e300), ("dp_rank", -1),
             ("dp_rank", 65536), ("dp_rank", 1 << 63), ("endpoint", ""),
             ("endpoint", "http://127.0.0.1:1"), ("endpoint", "tcp://"),
             ("endpoint", "tcp://127.0.0.1:1" + "1" * 600), ("replay_endpoint", "nonsense")]
    for field, value in wrong:
        refused("POST", "/register", {**REG, field: value}, 400)
    # names the document sets no limit for: registered, or refused cleanly
    for field in ("modelname", "instance_id", "tenant_id", "lora_name", "additionalsalt"):
        body = {**REG, "instance_id": "long", field: "x" * 5000}
        st, ans = ix.post("/register", body)
        assert st in (200, 400), (field, st, ans)
        if st == 200:
            ix.ok("/unregister", {"instance_id": body["instance_id"],
                                  "tenant_id": body["tenant_id"]})
        else:
            assert isinstance(ans, dict) and "error" in ans, ans
        ix.alive()

    refused("POST", "/unregister", {}, 400)
    refused("POST", "/unregister", {"instance_id": 5}, 400)
    refused("POST", "/unregister", {"instance_id": "i1", "dp_rank": "0"}, 400)
    refused("POST", "/unregister", {"instance_id": "i1", "tenant_id": 3}, 400)
    refused("POST", "/unregister", {"instance_id": "nobody"}, 404)
    refused("POST", "/unregister", {"instance_id": "i1", "dp_rank": 7}, 404)
    refused("POST", "/unregister", {"instance_id": "i1", "tenant_id": "acme"}, 404)

    Q = {"model": "m", "block_size": 16, "token_ids": [1, 2, 3]}
    for field in ("model", "block_size", "token_ids"):
        refused("POST", "/query", without(Q, field), 400)
    for field, value in [("token_ids", "123"), ("token_ids", [1, -1]), ("token_ids", [1 << 32]),
                         ("token_ids", [1.5]), ("token_ids", ["1"]), ("token_ids", [None]),
                         ("token_ids", [[1]]), ("token_ids", {"0": 1}), ("model", 3),
                         ("block_size", 0), ("block_size", "16"), ("block_size", 65537),
                         ("tenant_id", 1), ("instance_id", 1), ("cache_salt", 2),
                         ("lora_name", 3)]:
        refused("POST", "/query", {**Q, field: value}, 400)
    refused("POST", "/query", {**Q, "lora_name": "sql", "lora_id": "sql"}, 400)
    H = {"model": "m", "block_size": 16, "seq_hashes": [1, 2, 3]}
    refused("POST", "/query_by_hash", without(H, "seq_hashes"), 400)
    for value in ([-1], [1 << 64], [1.5], ["1"], "1", [None]):
        refused("POST", "/query_by_hash", {**H, "seq_hashes": value}, 400)
        refused("POST", "/query_by_hash", {**without(H, "seq_hashes"), "block_hash": value},
                400)

    for method, path in [("GET", "/register"), ("GET", "/unregister"), ("GET", "/query"),
                         ("GET", "/query_by_hash"), ("POST", "/health"), ("POST", "/instances"),
                         ("POST", "/metrics")]:
        refused(method, path, None if method == "GET" else b"{}", 405)
    for method, path in [("PUT", "/register"), ("DELETE", "/query"), ("PUT", "/health")]:
        refused(method, path, None if method == "DELETE" else b"{}", 405)
    for method, path in [("GET", "/nope"), ("POST", "/nope"), ("GET", "/query/x")]:
        refused(method, path, None if method == "GET" else b"{}", 404)

    assert ix.metric_sum("kvpool_indexer_http_refused_total") > refused0
    # nothing of the refused requests was applied
    m = ix.metrics()
    assert ix.metric("kvpool_indexer_registrations", text=m) == 3
    assert ix.metric("kvpool_indexer_subscriptions", text=m) == 3

    # query_by_hash's legacy field: the same answer
    assert ix.ok("/query_by_hash", {"model": "m", "block_size": 16, "block_hash": [5, 6]}) == \
        ix.ok("/query_by_hash", {"model": "m", "block_size": 16, "seq_hashes": [5, 6]})

    # another scope replaces the registration; the same endpoint updates it
    ix.ok("/register", {**REG, "endpoint": ep_a, "modelname": "other"})
    ans = ix.ok("/query", {"model": "m", "block_size": 16, "token_ids": []})
    assert list(ans["default"]) == ["i2"]
    ans = ix.ok("/query", {"model": "other", "block_size": 16, "token_ids": []})
    assert list(ans["default"]) == ["i1"]

    # unregister: one rank, every rank, the tenant's; an endpoint nobody names is closed
    ix.ok("/register", {**REG, "endpoint": ep_a, "instance_id": "i4", "dp_rank": 0})
    ix.ok("/register", {**REG, "endpoint": ep_a, "instance_id": "i4", "dp_rank": 5})
    ix.ok("/register", {**REG, "endpoint": ep_a, "instance_id": "i4", "dp_rank": 9})
    assert ix.ok("/unregister", {"instance_id": "i4", "dp_rank": 5}) == \
        {"status": "unregistered successfully", "removed_instances": ["i4|default|5"]}
    ans = ix.ok("/unregister", {"instance_id": "i4", "tenant_id": "default"})
    assert ans["status"] == "unregistered successfully"
    assert sorted(ans["removed_instances"]) == ["i4|default|0", "i4|default|9"]
    refused("POST", "/unregister", {"instance_id": "i4"}, 404)
    assert ix.ok("/unregister", {"instance_id": "i3", "tenant_id": "acme"}) == \
        {"status": "unregistered successfully", "removed_instances": ["i3|acme|0"]}
    assert ix.metric("kvpool_indexer_subscriptions") == 2  # ep_b: still i2's
    assert ix.ok("/unregister", {"instance_id": "i2"})["removed_instances"] == ["i2|default|1"]
    m = ix.metrics()
    assert ix.metric("kvpool_indexer_registrations", text=m) == 1
    assert ix.metric("kvpool_indexer_subscriptions", text=m) == 1
    assert ix.publisher_entries(ep_b) == []
    ix.alive()


def test_405_of_other_methods_is_json(indexer):
    ix = indexer()
    for method, path in [("PUT", "/register"), ("DELETE", "/query"), ("PUT", "/health"),
                         ("PATCH", "/query")]:
        st, ans = ix.request(method, path, b"{}")
        assert st == 405 and isinstance(ans, dict) and isinstance(ans.get("error"), str), \
            (method, path, st, ans)
    ix.alive()


# ---------------------------------------------------------------- the document's example


def test_doc_query_example(indexer, publishers):
    """docs/indexer.md's /query answer, reproduced: engine-a's rank 0 holds 8 blocks on
    GPU (a vLLM engine: bytes hashes, token ids), its rank 1 is served by a kvpool pool
    that holds all 16 on CPU (standard hashes)."""
    ix = indexer()
    w = World(ix)
    rng = random.Random(46)
    scope = ("qwen3-8b", "", 16, "")
    e0 = publishers(encoding="array", hash_kind="bytes")
    pool = publishers(encoding="array")
    w.register(e0, "engine-a", 0, scope=scope, omit_defaults=True)
    w.register(pool, "engine-a", 1, scope=scope, type_="kvpool")
    e0.wait_subscribed()
    pool.wait_subscribed()
    toks = tokens_of(rng, 18) + [7, 8, 9]
    std = im.seq_hashes(toks, 16)
    eng = [rng.getrandbits(64) for _ in range(8)]
    w.send(e0, [stored(eng[:3], None, toks[:48], lora_name=None),
                stored(eng[3:8], eng[2], toks[48:128], medium="GPU")], dp_rank=0)
    w.send(pool, [envelope("stored", std[:10], medium="cpu", model_name="qwen3-8b")])
    w.send(pool, [envelope("stored", std[10:16], medium="cpu", model_name="qwen3-8b")])
    w.settle()
    want = {"default": {"engine-a": {
        "longest_matched": 256, "GPU": 128, "CPU": 256, "DISK": 0,
        "DP": {"0": 128, "1": 256},
        "rank_matches": {"0": {"gpu": 128, "cpu": 128, "disk": 128},
                         "1": {"gpu": 0, "cpu": 256, "disk": 256}}}}}
    assert w.model.query("default", scope, toks) == want  # the model agrees with the doc
    got, _ = w.check("default", scope, toks)
    assert_same(got, want, "the doc's /query example")
    got, _ = w.check("default", scope, hashes=std)
    assert_same(got, want, "/query_by_hash of the same prompt")
    got, _ = w.check("default", scope, hashes=std, legacy=True)
    assert_same(got, want, "/query_by_hash with block_hash")
    got, _ = w.check("default", scope, toks, instance="engine-a")
    assert_same(got, want, "narrowed to engine-a")
    # a partial block counts for nothing; a prompt that diverges in block 5
    got, want = w.check("default", scope, toks[:16 * 9 + 15])
    assert_same(got, want)
    assert got["default"]["engine-a"]["longest_matched"] == 144
    bent = list(toks)
    bent[16 * 5 + 3] ^= 1
    got, want = w.check("default", scope, bent)
    assert_same(got, want)
    assert got["default"]["engine-a"]["GPU"] == 80
    # the engine's hashes are mapped: it removes by them, and the rank-0 path shortens
    w.send(e0, [removed([eng[4]], medium="GPU")], dp_rank=0)
    w.settle()
    got, want = w.check("default", scope, toks)
    assert_same(got, want, "after BlockRemoved of an engine hash")
    assert got["default"]["engine-a"]["GPU"] == 64
    assert got["default"]["engine-a"]["rank_matches"]["0"] == {"gpu": 64, "cpu": 64,
                                                                "disk": 64}


def test_unplaced_and_seed(indexer, publishers):
    """A stored event whose parent the indexer never mapped is not indexed (counted);
    the hash seed is honoured."""
    ix = indexer("--hash-seed", "987654321")
    w = World(ix, seed=987654321)
    rng = random.Random(7)
    scope = ("m", "", 4, "")
    e = publishers(encoding="map", hash_kind="bytes", block_size=4)
    w.register(e, "x", 0, scope=scope)
    e.wait_subscribed()
    toks = tokens_of(rng, 6, 4)
    eng = [rng.getrandbits(64) for _ in range(6)]
    w.send(e, [stored(eng[:2], None, toks[:8], block_size=4),
               stored(eng[3:5], 12345, toks[12:20], block_size=4),  # parent never mapped
               stored(eng[2:3], eng[1], toks[8:12], block_size=4, medium="disk")])
    w.settle()
    assert w.model.unplaced == 2
    got, want = w.check("default", scope, toks)
    assert_same(got, want)
    a = got["default"]["x"]
    assert a["longest_matched"] == 12 and a["GPU"] == 8 and a["DISK"] == 0
    std = im.seq_hashes(toks, 4, 987654321)
    got, want = w.check("default", scope, hashes=std[2:])
    assert_same(got, want)
    assert got["default"]["x"]["DISK"] == 4
    assert ix.metric("kvpool_indexer_unplaced_blocks_total") == 2
    # with seed 0 the same tokens hash otherwise: no hit
    assert im.seq_hashes(toks, 4, 0)[0] != im.seq_hashes(toks, 4, 987654321)[0]
    got, want = w.check("default", scope, hashes=im.seq_hashes(toks, 4, 0))
    assert_same(got, want)
    assert got["default"]["x"]["longest_matched"] == 0


def test_other_media_when_they_have_a_run(indexer, publishers):
    """A medium beyond GPU/CPU/DISK ("nvme" upper-cased) in an answer."""
    ix = indexer()
    w = World(ix)
    rng = random.Random(8)
    e = publishers()
    w.register(e, "x", 0)
    e.wait_subscribed()
    toks, std = prompt(rng, 3)
    w.send(e, [stored(std[1:3], medium="nvme"), stored(std[:1])])
    w.settle()
    got, want = w.check("default", SCOPE, hashes=std[1:])
    assert_same(got, want)
    assert got["default"]["x"]["NVME"] == 32 and got["default"]["x"]["GPU"] == 0


def test_other_media_named_when_held(indexer, publishers):
    """A medium beyond GPU/CPU/DISK is named (0) when the instance holds any block there."""
    ix = indexer()
    w = World(ix)
    rng = random.Random(8)
    e = publishers()
    w.register(e, "x", 0)
    e.wait_subscribed()
    toks, std = prompt(rng, 3)
    w.send(e, [stored(std[1:3], medium="nvme"), stored(std[:1])])
    w.settle()
    # h0 on GPU only, h1 and h2 on NVME: "NVME": 0 in the answer
    got, want = w.check("default", SCOPE, hashes=std)
    assert_same(got, want)
    assert got["default"]["x"]["NVME"] == 0
    # any block, not only the prompt's
    got, want = w.check("default", SCOPE, hashes=[12345])
    assert_same(got, want)
    assert got["default"]["x"]["NVME"] == 0


def test_at_most_8_media(indexer, publishers):
    """GPU, CPU, DISK and five more names; an event naming a ninth is counted and
    dropped, the rest of its batch applied."""
    ix = indexer()
    w = World(ix)
    e = publishers()
    w.register(e, "x", 0)
    e.wait_subscribed()
    names = ["m1", "m2", "M3", "m4", "m5"]
    w.send(e, [stored([1], medium=m) for m in names])
    w.settle()
    e.publish([stored([2], medium="m6"), stored([3], medium="m1"), stored([4], medium="gpu")])
    w.model.apply_batch(e.endpoint, [stored([3], medium="m1"), stored([4], medium="gpu")])
    ix.wait_seq(e)
    got, want = w.check("default", SCOPE, hashes=[1])
    assert_same(got, want)
    assert sorted(got["default"]["x"]) == sorted(
        ["longest_matched", "GPU", "CPU", "DISK", "M1", "M2", "M3", "M4", "M5", "DP",
         "rank_matches"])
    for h in (2, 3, 4):
        got, want = w.check("default", SCOPE, hashes=[h])
        assert_same(got, want)
    assert ix.metric("kvpool_indexer_media_dropped_total") == 1


# ---------------------------------------------------------------- random workloads


class Engine:
    """What one engine (or one DP rank of it) holds, to generate valid vLLM events: it
    stores a prompt's blocks from its first missing one (the parent it names is one it
    holds, so mapped), offloads held runs to CPU, removes held blocks, clears."""

    def __init__(self, name, bs, media, engine_hashes=True, tokens=True):
        self.name = name
        self.bs = bs
        self.media = media  # [(wire medium, model medium)]
        self.held = {}  # model medium -> set of std hashes
        self.engine_hashes = engine_hashes
        self.tokens = tokens

    def eng(self, std):
        if not self.engine_hashes:
            return std
        return xxhash.xxh3_64_intdigest(self.name.encode() + std.to_bytes(8, "little"))

    def any_held(self):
        return set().union(*self.held.values()) if self.held else set()

    def event(self, rng, prompts):
        r = rng.random()
        if r < 0.62 or not self.any_held():
            toks, std = rng.choice(prompts)
            have = self.any_held()
            i = next((k for k, h in enumerate(std) if h not in have), len(std))
            if i == len(std):
                return self.remove(rng)
            j = rng.randint(i + 1, len(std))
            wire, m = rng.choice(self.media)
            self.held.setdefault(m, set()).update(std[i:j])
            return stored([self.eng(h) for h in std[i:j]],
                          self.eng(std[i - 1]) if i else None,
                          toks[i * self.bs:j * self.bs] if self.tokens else None,
                          medium=wire, block_size=self.bs)
        if r < 0.7 and len(self.media) > 1:
            # offload a held run (all of it held somewhere) to another medium
            toks, std = rng.choice(prompts)
            have = self.any_held()
            k = next((k for k, h in enumerate(std) if h not in have), len(std))
            if k == 0:
                return self.remove(rng)
            a = rng.randrange(k)
            b = rng.randint(a + 1, k)
            wire, m = rng.choice(self.media[1:])
            self.held.setdefault(m, set()).update(std[a:b])
            return stored([self.eng(h) for h in std[a:b]], self.eng(std[a - 1]) if a else None,
                          toks[a * self.bs:b * self.bs] if self.tokens else None,
                          medium=wire, block_size=self.bs)
        if r < 0.995:
            return self.remove(rng)
        self.held = {}
        return cleared()

    def remove(self, rng):
        media = [(w, m) for w, m in self.media if self.held.get(m)]
        if not media:
            return removed([rng.getrandbits(64)])  # nothing held: a remove of nothing
        wire, m = rng.choice(media)
        hs = rng.sample(sorted(self.held[m]), min(len(self.held[m]), rng.randint(1, 3)))
        self.held[m] -= set(hs)
        return removed([self.eng(h) for h in hs], medium=wire)


class Pool:
    """A kvpool pool publishing envelopes: blocks of any depth, on cpu / disk, per
    tenant; it names some blocks by an engine's hash (as a master reads them from its
    keys): hashes mapped before this phase began (`mapped`, std -> engine hash), held
    by the engine or not (the map outlives the block), so that the answers do not
    depend on how the indexer interleaves the engine's stream and the pool's."""

    def __init__(self):
        self.held = {}  # (tenant, medium) -> set of std hashes

    def event(self, rng, prompts_by_tenant, mapped):
        tenant = rng.choice(sorted(prompts_by_tenant))
        medium = rng.choice(["cpu", "disk"])
        key = (tenant, medium)
        s = self.held.setdefault(key, set())
        r = rng.random()

        def name(h):
            engs = mapped.get(tenant, {}).get(h)
            return engs if engs is not None and rng.random() < 0.5 else h

        if r < 0.6 or not s:
            toks, std = rng.choice(prompts_by_tenant[tenant])
            a = rng.randrange(len(std))
            b = rng.randint(a + 1, len(std))
            s.update(std[a:b])
            return envelope("stored", [name(h) for h in std[a:b]], medium=medium,
                            tenant_id=tenant, model_name="m1")
        if r < 0.99:
            hs = rng.sample(sorted(s), min(len(s), rng.randint(1, 4)))
            s -= set(hs)
            return envelope("removed", [name(h) for h in hs], medium=medium, tenant_id=tenant,
                            model_name="m1")
        s.clear()
        return envelope("cleared", medium=medium, tenant_id=tenant, model_name="m1")


def make_prompts(rng, bs, n=24):
    """Prompts sharing prefixes: roots, children of roots, grandchildren."""
    prompts = []
    roots = [tokens_of(rng, rng.randint(1, 3), bs) for _ in range(5)]
    for _ in range(n):
        base = rng.choice(roots + [p for p, _ in prompts])
        toks = base + tokens_of(rng, rng.randint(1, 4), bs)
        if rng.random() < 0.1:  # the extreme token values
            toks[-1] = (1 << 32) - 1
            toks[-2] = 0
        prompts.append((toks, None))
    return [t for t, _ in prompts]


def random_prompt(rng, prompts, bs):
    toks = list(rng.choice(prompts))
    r = rng.random()
    if r < 0.3:
        toks = toks[:rng.randrange(len(toks) + 1)]  # partial blocks included
    elif r < 0.5:
        toks += [rng.randrange(1 << 32) for _ in range(rng.randrange(3 * bs))]
    elif r < 0.65 and toks:
        toks[rng.randrange(len(toks))] ^= 1 << rng.randrange(32)
    return toks


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_workloads_match_the_model(indexer, publishers, seed):
    rng = random.Random(seed)
    hseed = [0, 0xDEADBEEF][seed % 2]
    ix = indexer("--hash-seed", str(hseed))
    w = World(ix, seed=hseed)
    bs = 16
    A = ("m1", "", bs, "")          # tenant default: instance a (2 DP ranks) + the pool
    B = ("m1", "sql", bs, "")       # LoRA: instances b and b2 (one endpoint)
    C = ("m1", "", bs, "w8a8")      # salted: instance d
    Aacme = ("m1", "", bs, "")      # tenant acme: instance c, an engine and the pool

    # vLLM, DP 0 and 1 (array-like, or the map form in one seed)
    p1 = publishers(encoding="map" if seed == 2 else "array", hash_kind="bytes")
    # vLLM newer, LoRA (int hashes, or bytes in one seed)
    p2 = publishers(encoding="map", hash_kind="bytes" if seed == 3 else "int")
    p3 = publishers(encoding="array", hash_kind="int")            # a kvpool pool
    p4 = publishers(encoding=rng.choice(["array", "map"]), hash_kind="int")  # standard
    p4.trim_trailing = True
    for rank in (0, 1):
        w.register(p1, "a", rank, scope=A)
        w.register(p3, "a", rank, scope=A, type_="kvpool")
    w.register(p2, "b", 0, scope=B)
    w.register(p2, "b2", 0, scope=B, omit_defaults=True)
    w.register(p3, "c", 0, tenant="acme", scope=Aacme, type_="kvpool")
    w.register(p4, "c", 0, tenant="acme", scope=Aacme, type_="SGLang")
    w.register(p4, "d", 0, scope=C, type_="SGLang")
    for p in w.pubs:
        p.wait_subscribed()

    def with_hashes(prompts):
        return [(t, im.seq_hashes(t, bs, hseed)) for t in prompts]

    prompts = {"default": with_hashes(make_prompts(rng, bs)),
               "acme": with_hashes(make_prompts(rng, bs))}
    # the pool also holds some of the engines' prompts in tenant default
    lora_prompts = with_hashes(make_prompts(rng, bs))
    salt_prompts = with_hashes(make_prompts(rng, bs))
    e1 = [Engine("p1r0", bs, [(None, "GPU"), ("CPU", "CPU")]),
          Engine("p1r1", bs, [("GPU", "GPU"), ("cpu", "CPU")])]
    e2 = Engine("p2", bs, [(None, "GPU"), ("gpu", "GPU")])
    e4c = Engine("p4", bs, [(None, "GPU")], engine_hashes=False, tokens=False)
    pool = Pool()

    qrng = random.Random(seed + 1000)  # queries draw from their own generator

    def check_all(nq):
        rng = qrng
        bad = []
        targets = [("default", A, prompts["default"], [None, "a"]),
                   ("default", B, lora_prompts, [None, "b", "b2"]),
                   ("default", C, salt_prompts, [None, "d"]),
                   ("acme", Aacme, prompts["acme"], [None, "c"])]
        for i in range(nq):
            tenant, scope, ps, insts = targets[i % len(targets)]
            inst = rng.choice(insts)
            toks = random_prompt(rng, [t for t, _ in ps], bs)
            got, want = w.check(tenant, scope, toks, instance=inst, rng=rng)
            if got != want:
                bad.append(("query", tenant, scope, inst, len(toks), got, want))
            hs = im.seq_hashes(random_prompt(rng, [t for t, _ in ps], bs), bs, hseed)
            if hs and rng.random() < 0.2:
                hs.insert(rng.randrange(len(hs)), rng.getrandbits(64))
            got, want = w.check(tenant, scope, hashes=hs, instance=inst, rng=rng,
                                legacy=rng.random() < 0.2)
            if got != want:
                bad.append(("query_by_hash", tenant, scope, inst, len(hs), got, want))
        assert not bad, f"{len(bad)} of {2 * nq} answers differ from the model; the first:\n" \
            + "\n".join(json.dumps(b, default=str) for b in bad[:3])

    events = 0
    phases = 6
    for phase in range(phases):
        # engine hashes the pool may name: those mapped before this phase
        mp = w.model.maps.get(("default",) + A, {})
        mapped = {"default": {std: eng for eng, std in sorted(mp.items())}}
        for k in range(60):
            rank = rng.randrange(2)
            evs = [e1[rank].event(rng, prompts["default"]) for _ in range(rng.randint(1, 4))]
            if k == 30 and phase in (2, 3):  # an AllBlocksCleared of one rank
                evs.append(cleared())
                e1[rank].held = {}
            w.send(p1, evs, dp_rank=rank)
            events += len(evs)
        for _ in range(45):
            evs = [e2.event(rng, lora_prompts) for _ in range(rng.randint(1, 4))]
            for ev in evs:
                if ev.kind == "stored":
                    ev.lora_name = "sql"
                    ev.lora_id = 1
            # a DP rank p2 is registered under (0: only that rank, the same here) or not
            w.send(p2, evs, dp_rank=rng.choice([None, 0, 7]))
            events += len(evs)
        for _ in range(45):
            evs = [pool.event(rng, {"default": prompts["default"], "acme": prompts["acme"]},
                              mapped) for _ in range(rng.randint(1, 4))]
            w.send(p3, evs, dp_rank=0)
            events += len(evs)
        for _ in range(40):
            # p4 serves c (acme) and d (salted): its prompts from both
            ps = prompts["acme"] if rng.random() < 0.5 else salt_prompts
            evs = [e4c.event(rng, ps) for _ in range(rng.randint(1, 3))]
            w.send(p4, evs)
            events += len(evs)
        w.settle()
        check_all(12 if phase < phases - 1 else 120)

    m = ix.metrics()
    assert events > 2500, events
    assert ix.metric_sum("kvpool_indexer_resyncs_total", text=m) == 0
    # a subscription per (tenant, endpoint), each taking its publisher's batches
    subs = {(r.key[1], e) for r in w.model.regs.values() for e in r.publishers}
    assert ix.metric("kvpool_indexer_batches_total", text=m) == \
        sum(p.seq * sum(e == p.endpoint for _, e in subs) for p in w.pubs)
    holders = sum(len(s) for media in w.model.held.values() for s in media.values())
    assert ix.metric("kvpool_indexer_block_holders", text=m) == holders
    assert ix.metric("kvpool_indexer_registrations", text=m) == len(w.model.regs)
    assert ix.metric("kvpool_indexer_subscriptions", text=m) == len(subs)
    assert ix.metric("kvpool_indexer_unplaced_blocks_total", text=m) == 0

    # unregistering a's rank 1 drops its blocks, rank 0 keeps its own
    ans = ix.ok("/unregister", {"instance_id": "a", "dp_rank": 1})
    assert ans["removed_instances"] == w.model.unregister("a", "default", 1)
    check_all(8)


def test_engine_hash_remembered_after_its_block(indexer, publishers):
    """The engine-hash map outlives the block: a pool's event naming an engine hash
    after the engine removed the block still finds it (an offload whose put ends after
    the GPU evicted the block)."""
    ix = indexer()
    w = World(ix)
    rng = random.Random(9)
    e = publishers(hash_kind="bytes")
    pool = publishers()
    w.register(e, "x", 0)
    w.register(pool, "x", 0, type_="kvpool")
    e.wait_subscribed()
    pool.wait_subscribed()
    toks, std = prompt(rng, 4)
    eng = [rng.getrandbits(64) for _ in range(4)]
    w.send(e, [stored(eng, None, toks)])  # the engine stores, with its hashes and tokens
    w.settle()
    w.send(e, [removed(eng)])  # its GPU evicts them
    w.settle()
    # then the pool's puts end: the master names them by the hash in their keys
    w.send(pool, [envelope("stored", eng, medium="cpu", model_name="m")])
    w.settle()
    got, want = w.check("default", SCOPE, toks)
    assert_same(got, want)
    assert got["default"]["x"]["CPU"] == 64 and got["default"]["x"]["GPU"] == 0
    # and removes by it
    w.send(pool, [envelope("removed", eng[2:], medium="cpu", model_name="m")])
    w.settle()
    got, want = w.check("default", SCOPE, toks)
    assert_same(got, want)
    assert got["default"]["x"]["CPU"] == 32


# ---------------------------------------------------------------- order and recovery


def simple_world(indexer, publishers, replay=True, **kw):
    ix = indexer()
    w = World(ix)
    p = publishers(replay=replay, **kw)
    w.register(p, "g", 0, replay=replay)
    p.wait_subscribed()
    return ix, w, p


SCOPE = ("m", "", 16, "")


def prompt(rng, n):
    toks = tokens_of(rng, n)
    return toks, im.seq_hashes(toks, 16)


def test_gap_healed_by_replay(indexer, publishers):
    ix, w, p = simple_world(indexer, publishers, encoding="map", hash_kind="bytes")
    rng = random.Random(11)
    toks, std = prompt(rng, 12)
    eng = [rng.getrandbits(64) for _ in range(12)]
    w.send(p, [stored(eng[:4], None, toks[:64])])
    w.settle()
    # batch 1 never reaches the SUB socket; batch 2 shows the gap
    w.send(p, [stored(eng[4:6], eng[3], toks[64:96])], pub=False)
    w.send(p, [stored(eng[6:8], eng[5], toks[96:128])])
    w.settle()
    got, want = w.check("default", SCOPE, toks)
    assert_same(got, want, "after a gap healed by replay")
    assert got["default"]["g"]["GPU"] == 128
    # three batches lost in a row: a remove, a store whose parent only the lost ones
    # mapped, a clear-free store; then the live one
    w.send(p, [removed([eng[1]])], pub=False)
    w.send(p, [stored(eng[8:10], eng[7], toks[128:160], medium="CPU")], pub=False)
    w.send(p, [stored(eng[10:11], eng[9], toks[160:176], medium="CPU")], pub=False)
    w.send(p, [stored(eng[11:12], eng[10], toks[176:192], medium="CPU")])
    w.settle()
    got, want = w.check("default", SCOPE, toks)
    assert_same(got, want, "after three batches replayed")
    assert got["default"]["g"]["GPU"] == 16
    m = ix.metrics()
    assert ix.metric_sum("kvpool_indexer_resyncs_total", text=m) == 0
    assert ix.metric("kvpool_indexer_replayed_batches_total", text=m) >= 4
    assert p.replay_requests[:2] == [1, 3]
    assert all(e.get("resyncs", 0) == 0 for e in ix.publisher_entries(p.endpoint))


def test_gap_without_replay_resyncs(indexer, publishers):
    ix, w, p = simple_world(indexer, publishers, replay=False)
    rng = random.Random(12)
    toks, std = prompt(rng, 6)
    w.send(p, [stored(std[:3])])
    w.settle()
    p.skip()  # seq 1 lost for good; no replay endpoint to ask
    s = p.publish([stored(std[3:5])])
    w.model.resync(p.endpoint)
    w.model.apply_batch(p.endpoint, [stored(std[3:5])])
    ix.wait_metric("kvpool_indexer_resyncs_total", {"reason": "gap"}, 1)
    ix.wait_seq(p)
    assert s == 2
    got, want = w.check("default", SCOPE, hashes=std)
    assert_same(got, want, "after an unhealable gap")
    assert got["default"]["g"]["longest_matched"] == 0  # the earlier blocks are gone
    got, want = w.check("default", SCOPE, hashes=std[3:5])
    assert_same(got, want)
    assert got["default"]["g"]["GPU"] == 32  # the batch that showed the gap, applied
    assert [e.get("resyncs") for e in ix.publisher_entries(p.endpoint)] == [1]


def test_gap_the_replay_cannot_fill_resyncs(indexer, publishers):
    """The replay socket answers, but without the first missing seq; then a replay
    socket that never answers (the indexer waits 1 s)."""
    ix, w, p = simple_world(indexer, publishers)
    rng = random.Random(13)
    toks, std = prompt(rng, 8)
    w.send(p, [stored(std[:2])])
    w.settle()
    p.publish([stored(std[2:4])], pub=False, buffer=False)  # lost everywhere
    # the replay has this one only (the same as the next: whether the indexer applies
    # it after the resync or not, the answer is the same)
    p.publish([stored(std[5:6])], pub=False)
    p.publish([stored(std[5:6])])
    w.model.resync(p.endpoint)
    w.model.apply_batch(p.endpoint, [stored(std[5:6])])
    ix.wait_metric("kvpool_indexer_resyncs_total", {"reason": "gap"}, 1)
    ix.wait_seq(p)
    assert p.replay_requests and p.replay_requests[0] == 1
    got, want = w.check("default", SCOPE, hashes=std[5:6])
    assert_same(got, want)
    got, want = w.check("default", SCOPE, hashes=std)
    assert_same(got, want)
    assert got["default"]["g"]["longest_matched"] == 0
    # a mute replay socket
    w.send(p, [stored(std[:1])])
    w.settle()
    p.replay_mute = True
    p.publish([stored(std[1:2])], pub=False)
    p.publish([stored(std[2:3])])
    w.model.resync(p.endpoint)
    w.model.apply_batch(p.endpoint, [stored(std[2:3])])
    ix.wait_metric("kvpool_indexer_resyncs_total", {"reason": "gap"}, 2, timeout=10)
    ix.wait_seq(p)
    got, want = w.check("default", SCOPE, hashes=std[2:3])
    assert_same(got, want, "after a mute replay socket")
    got, want = w.check("default", SCOPE, hashes=std)
    assert_same(got, want)
    assert ix.metric("kvpool_indexer_resyncs_total", {"reason": "gap"}) == 2


def test_publisher_restart_resyncs(indexer, publishers):
    ix, w, p = simple_world(indexer, publishers, hash_kind="bytes")
    other = publishers()
    w.register(other, "g", 0, type_="kvpool")  # another publisher of the same registration
    other.wait_subscribed()
    rng = random.Random(14)
    toks, std = prompt(rng, 6)
    for i in range(3):
        w.send(p, [stored(std[2 * i:2 * i + 2], medium="gpu")])
    w.send(other, [envelope("stored", std, medium="disk", model_name="m")])
    w.settle()
    got, want = w.check("default", SCOPE, toks)
    assert_same(got, want)
    assert got["default"]["g"]["GPU"] == 96
    # the engine restarts on the same port: seq back to 0
    p.restart(rebind=True)
    p.wait_subscribed(p.subscriptions + 1)
    p.publish([stored(std[:1])])
    w.model.resync(p.endpoint)
    w.model.apply_batch(p.endpoint, [stored(std[:1])])
    ix.wait_metric("kvpool_indexer_resyncs_total", {"reason": "restart"}, 1)
    ix.wait_seq(p)
    got, want = w.check("default", SCOPE, toks)
    assert_same(got, want, "after a publisher restart")
    a = got["default"]["g"]
    assert a["GPU"] == 16 and a["DISK"] == 96  # the other publisher keeps its blocks
    # and it goes on from there
    w.send(p, [stored(std[1:3])])
    w.settle()
    got, want = w.check("default", SCOPE, toks)
    assert_same(got, want)
    assert got["default"]["g"]["GPU"] == 48
    assert ix.metric_sum("kvpool_indexer_resyncs_total") == 1


def test_malformed_payloads_resync(indexer, publishers):
    ix, w, p = simple_world(indexer, publishers)
    rng = random.Random(15)
    toks, std = prompt(rng, 6)
    good = msgpack.packb([time.time(), [["BlockStored", [std[0]], None, [], 16, None, None,
                                         None]]])
    garbage = [
        b"\xc1 not msgpack at all",
        msgpack.packb("a string"),
        msgpack.packb([time.time()]),
        msgpack.packb([time.time(), "events"]),
        msgpack.packb([time.time(), [["BlockStored", "hashes", None, [], 16]]]),
        msgpack.packb([time.time(), [["BlockRemoved", [1.5]]]]),
        msgpack.packb({"ts": 1.0, "events": [{"type": "BlockStored", "block_hashes": {}}]}),
        msgpack.packb([time.time(), [["BlockStored", [std[1]], None, [], 16]]]) + b"\x00",
        good[:-3],  # a valid first event, the batch cut short: nothing of it applies
        msgpack.packb([time.time(), [["BlockStored", [std[1]], None, [], 16], 17]]),
    ]
    n = 0
    for junk in garbage:
        w.send(p, [stored(std[:3])])
        w.settle()
        got, want = w.check("default", SCOPE, hashes=std)
        assert_same(got, want)
        assert got["default"]["g"]["GPU"] == 48
        p.publish_raw(junk)
        n += 1
        w.model.resync(p.endpoint)
        ix.wait_metric("kvpool_indexer_resyncs_total", {"reason": "malformed"}, n)
        ix.wait_seq(p)
        got, want = w.check("default", SCOPE, hashes=std)
        assert_same(got, want, f"after the malformed payload {junk[:40]!r}")
        assert got["default"]["g"]["longest_matched"] == 0, junk
        ix.alive()
    # the stream goes on
    w.send(p, [stored(std[3:6])])
    w.settle()
    got, want = w.check("default", SCOPE, hashes=std[3:])
    assert_same(got, want)
    assert got["default"]["g"]["GPU"] == 48
    m = ix.metrics()
    assert ix.metric("kvpool_indexer_resyncs_total", {"reason": "malformed"}, text=m) == n
    assert ix.metric("kvpool_indexer_resyncs_total", {"reason": "gap"}, text=m) == 0
    assert p.replay_requests == []


def test_malformed_batch_counted_once(indexer, publishers):
    """A batch that does not decode is one resync; the next seq follows it, no replay."""
    ix, w, p = simple_world(indexer, publishers)
    w.send(p, [stored([1, 2])])
    w.settle()
    p.publish_raw(b"\xc1 not msgpack")  # seq 1, kept in the replay buffer as vLLM does
    w.model.resync(p.endpoint)
    ix.wait_metric("kvpool_indexer_resyncs_total", {"reason": "malformed"}, 1)
    w.send(p, [stored([3])])  # seq 2: consecutive
    w.settle()
    got, want = w.check("default", SCOPE, hashes=[3])
    assert_same(got, want)
    assert (ix.metric("kvpool_indexer_resyncs_total", {"reason": "malformed"}),
            p.replay_requests) == (1, [])


def test_malformed_batch_not_undone_by_replay(indexer, publishers):
    """What came before a resync is never asked for again: the blocks it dropped stay
    dropped."""
    ix, w, p = simple_world(indexer, publishers)
    w.send(p, [stored([1, 2])])  # seq 0: blocks 1, 2
    w.settle()
    # seq 1: a batch that does not decode (it might have removed 1 and 2), not in the buffer
    p.publish_raw(b"\xc1 not msgpack", buffer=False)
    w.model.resync(p.endpoint)
    w.send(p, [stored([3])])  # seq 2
    w.settle()
    got, want = w.check("default", SCOPE, hashes=[1, 2])
    assert_same(got, want)


def test_register_again_updates_the_replay_endpoint(indexer, publishers):
    """The same endpoint registered again for the same key and scope: its replay
    endpoint and type change, its blocks stay; a gap then heals through the new one."""
    ix = indexer()
    w = World(ix)
    p = publishers()
    body = {"endpoint": p.endpoint, "replay_endpoint": f"tcp://127.0.0.1:{free_port()}",
            "type": "SGLang", "modelname": "m", "instance_id": "g", "block_size": 16,
            "dp_rank": 0}
    ix.ok("/register", body)
    w.model.register("g", "default", 0, SCOPE, p.endpoint, "SGLang")
    w.pubs.append(p)
    p.wait_subscribed()
    rng = random.Random(18)
    toks, std = prompt(rng, 4)
    w.send(p, [stored(std[:2])])
    w.settle()
    n = p.subscriptions
    w.register(p, "g", 0)  # vLLM, the real replay endpoint
    [e] = ix.publisher_entries(p.endpoint)
    assert (e.get("replay_endpoint"), e.get("type")) == (p.replay_endpoint, "vLLM"), e
    assert ix.metric("kvpool_indexer_subscriptions") == 1
    try:
        # kvpool-indexer makes the subscription's socket anew for its new replay endpoint:
        # wait for it (an indexer that keeps the socket loses nothing meanwhile)
        p.wait_subscribed(n + 1, timeout=2)
    except AssertionError:
        pass
    w.send(p, [stored(std[2:3])], pub=False)
    w.send(p, [stored(std[3:4])])
    w.settle()
    got, want = w.check("default", SCOPE, toks)
    assert_same(got, want)
    assert got["default"]["g"]["GPU"] == 64
    # asked from the gap (2), or from 0 by a subscription made anew
    assert p.replay_requests and p.replay_requests[0] <= 2, p.replay_requests
    assert ix.metric_sum("kvpool_indexer_resyncs_total") == 0


def test_max_blocks_evicts_the_least_recently_stored(indexer, publishers):
    ix = indexer("--max-blocks", "8")
    w = World(ix)
    p = publishers()
    w.register(p, "g", 0)
    p.wait_subscribed()
    hs = [1000 + i for i in range(12)]
    w.send(p, [stored([h]) for h in hs[:8]])
    w.settle()
    w.send(p, [stored([h]) for h in hs[8:11]])  # 3 more: hs[0..2] go
    w.settle()
    w.send(p, [stored([hs[3]])])  # hs[3] stored again: now the most recent
    w.send(p, [stored([hs[11]])])  # so hs[4] goes
    w.settle()

    def present(h):
        return ix.ok("/query_by_hash", {"model": "m", "block_size": 16,
                                        "seq_hashes": [h]})["default"]["g"]["GPU"] == 16

    assert [h for h in hs if present(h)] == [hs[3]] + hs[5:12]
    m = ix.metrics()
    assert ix.metric("kvpool_indexer_evicted_blocks_total", text=m) == 4
    assert ix.metric("kvpool_indexer_blocks", text=m) == 8
    assert ix.metric("kvpool_indexer_block_holders", text=m) == 8


def test_conductor_config_file(indexer, publishers, tmp_path):
    """--config (and CONDUCTOR_CONFIG_PATH): the Conductor's JSON, http_server_port and
    kvevent_instance (name -> a /register object; the name is the instance id when the
    object has none; ip + port stand for endpoint)."""
    p1 = publishers()
    p2 = publishers(encoding="map")
    host, port = p1.endpoint[len("tcp://"):].rsplit(":", 1)
    http_port = free_port()
    cfg = {"http_server_port": http_port, "kvevent_instance": {
        "engine-a": {"ip": host, "port": int(port), "type": "vLLM", "modelname": "m",
                     "block_size": 16, "dp_rank": 0, "replay_endpoint": p1.replay_endpoint},
        "second": {"endpoint": p2.endpoint, "type": "SGLang", "modelname": "m",
                   "instance_id": "engine-b", "block_size": 16, "dp_rank": 1,
                   "tenant_id": "acme"}}}
    path = tmp_path / "conductor.json"
    path.write_text(json.dumps(cfg))
    rng = random.Random(19)
    toks, std = prompt(rng, 3)
    for how in ("flag", "env"):
        if how == "flag":
            ix = indexer("--config", str(path), listen=False)
        else:
            ix = indexer(listen=False, env={"CONDUCTOR_CONFIG_PATH": str(path)})
        assert ix.port == http_port
        w = World(ix)
        w.model.register("engine-a", "default", 0, SCOPE, p1.endpoint, "vLLM")
        w.model.register("engine-b", "acme", 1, SCOPE, p2.endpoint, "SGLang")
        w.pubs += [p1, p2]
        p1.wait_subscribed(p1.subscriptions + 1)
        p2.wait_subscribed(p2.subscriptions + 1)
        p1.restart()
        p2.restart()
        w.send(p1, [stored(std)])
        w.send(p2, [stored(std[:2])])
        w.settle()
        for tenant in ("default", "acme"):
            got, want = w.check(tenant, SCOPE, toks)
            assert_same(got, want, f"{how}: {tenant}")
        assert w.model.query("default", SCOPE, toks)["default"]["engine-a"]["GPU"] == 48
        assert w.model.query("acme", SCOPE, toks)["acme"]["engine-b"]["DP"] == {"1": 32}
        assert ix.close() == 0


def test_indexer_restart_keeps_registrations(indexer, publishers, tmp_path):
    """--state-dir: a restarted indexer registers again, subscribes, and replays what
    each publisher still holds (from seq 0) when it hears from it."""
    state = str(tmp_path / "state")
    os.mkdir(state, 0o700)
    ix = indexer("--state-dir", state)
    w = World(ix)
    p = publishers(hash_kind="bytes")
    w.register(p, "g", 0)
    p.wait_subscribed()
    rng = random.Random(20)
    toks, std = prompt(rng, 6)
    eng = [rng.getrandbits(64) for _ in range(6)]
    w.send(p, [stored(eng[:3], None, toks[:48])])
    w.send(p, [stored(eng[3:5], eng[2], toks[48:80]), removed([eng[0]])])
    w.settle()
    assert ix.close() == 0
    ix2 = indexer("--state-dir", state)
    assert [r.get("instance_id") for r in ix2.instances()["instances"]] == ["g"]
    p.wait_subscribed(p.subscriptions + 1)
    w.ix = ix2
    w.send(p, [stored(eng[5:6], eng[4], toks[80:96])])
    w.settle()
    got, want = w.check("default", SCOPE, toks)
    assert_same(got, want, "after the indexer's restart")
    got, want = w.check("default", SCOPE, hashes=std[1:])
    assert_same(got, want)
    assert got["default"]["g"]["GPU"] == 80  # h[1..5]: h[0] alone was removed
    assert got["default"]["g"]["longest_matched"] == 80
    assert p.replay_requests == [0]


# ---------------------------------------------------------------- a real kvpool master


def test_kvpool_master_as_a_second_publisher(indexer, publishers):
    master_bin = os.environ.get("KVPOOL_MASTER_BIN")
    if not master_bin or not os.access(master_bin, os.X_OK):
        pytest.skip("KVPOOL_MASTER_BIN does not name a kvpool-master")
    import kvpool

    model_name = "Qwen/Qwen3-8B"
    pub_ep = f"tcp://127.0.0.1:{free_port()}"
    rep_ep = f"tcp://127.0.0.1:{free_port()}"
    master = Proc([master_bin, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}",
                   "--log-level", "error", "--lease-ttl", "0", "--kv-events-bind", pub_ep,
                   "--kv-events-replay-bind", rep_ep, "--kv-events-model", model_name,
                   "--kv-events-block-size", "16", *master_security_args()])
    client = None
    try:
        client = kvpool.Client(master=master.ready, segment_size="64MiB")
        ix = indexer()
        w = World(ix)
        scope = (model_name, "", 16, "")
        e = publishers(encoding="array", hash_kind="bytes")
        w.register(e, "eng", 0, scope=scope)

        class MasterEndpoint:
            endpoint, replay_endpoint = pub_ep, rep_ep

        w.register(MasterEndpoint, "eng", 0, scope=scope, type_="kvpool")
        # the same master for an instance of another tenant: its events (tenant_id
        # "default") do not apply there
        w.register(MasterEndpoint, "other", 0, tenant="acme", scope=scope, type_="kvpool")
        e.wait_subscribed()

        def key(h):
            return f"vllm@{model_name}@tp_rank:0@pcp0@dcp0@pp_rank:0@group:0@" + \
                digest32(h).hex()

        def master_event(kind, hashes):
            w.model.apply_batch(pub_ep, [envelope(kind, hashes, medium="cpu",
                                                  tenant_id="default")], 0)

        def hash_query(hashes):
            return ix.ok("/query_by_hash", {"model": model_name, "block_size": 16,
                                            "seq_hashes": hashes})["default"]["eng"]

        # the master's subscription: put probe objects until the indexer shows one on CPU
        deadline = time.monotonic() + 15
        while True:
            hp = random.getrandbits(64)
            client.put(key(hp), b"probe")
            master_event("stored", [hp])
            t = time.monotonic() + 1.0
            while time.monotonic() < t and hash_query([hp])["CPU"] != 16:
                time.sleep(0.02)
            if hash_query([hp])["CPU"] == 16:
                break
            assert time.monotonic() < deadline, "the indexer never heard the master"

        rng = random.Random(16)
        toks, std = prompt(rng, 5)
        eng = [rng.getrandbits(64) for _ in range(4)]
        w.send(e, [stored(eng, None, toks[:64])])
        w.settle()
        for h in eng:
            client.put(key(h), b"kv" * 100)
            master_event("stored", [h])

        def until(pred, what):
            ix.wait(lambda: pred(w.query("default", scope, toks)[0]["default"]["eng"]), what)
            got, want = w.check("default", scope, toks)
            assert_same(got, want, what)
            return got["default"]["eng"]

        a = until(lambda a: a["CPU"] == 64, "the pool's blocks on CPU")
        got, want = w.check("acme", scope, hashes=[hp] + eng)
        assert_same(got, want, "tenant acme")
        assert got["acme"]["other"]["CPU"] == 0
        assert a == {"longest_matched": 64, "GPU": 64, "CPU": 64, "DISK": 0, "DP": {"0": 64},
                     "rank_matches": {"0": {"gpu": 64, "cpu": 64, "disk": 64}}}
        # the engine drops them from GPU: CPU stays
        w.send(e, [removed(eng, medium="GPU")])
        w.settle()
        got, want = w.check("default", scope, toks)
        assert_same(got, want, "after the engine's BlockRemoved")
        assert got["default"]["eng"] == {
            "longest_matched": 64, "GPU": 0, "CPU": 64, "DISK": 0, "DP": {"0": 64},
            "rank_matches": {"0": {"gpu": 0, "cpu": 64, "disk": 64}}}
        # the pool loses the second object: the CPU run stops at it
        client.remove(key(eng[1]))
        master_event("removed", [eng[1]])
        a = until(lambda a: a["CPU"] == 16, "the second object's removal")
        for h in (eng[0], eng[2], eng[3]):
            client.remove(key(h))
            master_event("removed", [h])
        a = until(lambda a: a["CPU"] == 0, "the objects' removal")
        assert a["longest_matched"] == 0
        assert ix.metric_sum("kvpool_indexer_resyncs_total") == 0
    finally:
        if client is not None:
            client.close()
        assert master.stop() == 0


# ---------------------------------------------------------------- hostile input


def raw_http(port, head, body_chunks, timeout=30.0):
    """Send a request by hand (a body too large to be read whole); (status, text) of
    what came back, status None when the connection ended without an answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(head)
            for c in body_chunks:
                # an answer already (the server refused before the body's end): stop
                # writing, or our writes into a closed socket may reset the connection
                # and lose the answer
                if select.select([s], [], [], 0)[0]:
                    break
                s.sendall(c)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server may answer and close before reading it all
        data = b""
        try:
            while True:
                c = s.recv(65536)
                if not c:
                    break
                data += c
                if b"\r\n\r\n" in data:
                    hdr, _, rest = data.partition(b"\r\n\r\n")
                    cl = [ln for ln in hdr.split(b"\r\n") if ln.lower().startswith(b"content-length:")]
                    if cl and len(rest) >= int(cl[0].split(b":")[1]):
                        break
        except (ConnectionResetError, socket.timeout):
            pass
    finally:
        s.close()
    if not data.startswith(b"HTTP/1."):
        return None, data
    return int(data.split(b" ", 2)[1]), data.partition(b"\r\n\r\n")[2].decode(errors="replace")


CHUNKED_HEAD = (b"POST /register HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n")


def big_chunks(size, step=1 << 20):
    return [b"%x\r\n" % step + b" " * step + b"\r\n" for _ in range(size // step)] + \
        [b"0\r\n\r\n"]


def test_chunked_body_over_the_limit_413(indexer):
    ix = indexer()
    st, body = raw_http(ix.port, CHUNKED_HEAD, big_chunks(BODY_LIMIT + (1 << 20)))
    assert st == 413, (st, body[:200])


DEEP = (b"[" * 200_000 + b"]" * 200_000, b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        b'{"model": "m", "block_size": 16, "token_ids": ' + b"[" * 50_000 + b"]" * 50_000 + b"}")


def many_tokens_body():
    """A /query with as many token ids as fit under the limit (about 8 M)."""
    n = (BODY_LIMIT - 100) // 2
    body = b'{"model":"m","block_size":16,"token_ids":[' + b"0," * (n - 1) + b"0]}"
    assert len(body) <= BODY_LIMIT
    return body


def test_413_for_values_and_nesting(indexer):
    """413 for a body of more than 2^20 JSON values or nested deeper than 32; 2^20
    values and 32 levels are taken."""
    ix = indexer()
    ix.ok("/register", {**REG})
    for b in DEEP + (many_tokens_body(),):
        st, ans = ix.post("/query", b, timeout=60)
        assert st == 413 and ans["error"], (b[:60], len(b), st, ans)
        ix.alive()
    # at the limits: 2^20 values in all (the object, the values of "model" and
    # "block_size", the token list, the tokens) are taken; nesting 32 deep is taken
    # (the object and 31 arrays), 33 is not
    def tokens(n):
        return b'{"model":"m","block_size":16,"token_ids":[' + b"0," * (n - 1) + b"0]}"

    st, ans = ix.post("/query", tokens((1 << 20) - 4), timeout=60)
    assert st == 200, (st, ans)
    st, ans = ix.post("/query", tokens((1 << 20) + 100), timeout=60)
    assert st == 413, (st, ans)
    st, ans = ix.post("/query", b'{"model":"m","block_size":16,"token_ids":' + b"[" * 31 +
                      b"]" * 31 + b"}")
    assert st == 400, (st, ans)  # nested, but not too deep: token ids that are not integers
    st, ans = ix.post("/query", b'{"model":"m","block_size":16,"token_ids":' + b"[" * 32 +
                      b"]" * 32 + b"}")
    assert st == 413, (st, ans)
    ix.alive()


def test_hostile_http(indexer):
    ix = indexer()
    ix.ok("/register", {**REG, "endpoint": f"tcp://127.0.0.1:{free_port()}"})
    port = ix.port
    big = BODY_LIMIT + (1 << 20)
    # a body over 16 MiB, announced by Content-Length
    chunk = b" " * (1 << 20)
    st, body = raw_http(port, b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                              b"\r\nContent-Length: %d\r\n\r\n" % big,
                        [chunk] * (big >> 20))
    assert st == 413, (st, body[:200])
    assert json.loads(body)["error"]
    ix.alive()
    # ... and sent chunked: refused (with an answer: test_chunked_body_over_the_limit_413)
    refused = ix.metric_sum("kvpool_indexer_http_refused_total")
    st, body = raw_http(port, CHUNKED_HEAD, big_chunks(BODY_LIMIT + (1 << 20)))
    assert st in (413, None), (st, body[:200])
    assert ix.metric_sum("kvpool_indexer_http_refused_total") == refused + 1
    ix.alive()
    assert ix.metric("kvpool_indexer_registrations") == 1
    # deep nesting: 413
    for b in DEEP:
        st, ans = ix.post("/query", b)
        assert st == 413 and ans["error"], (st, ans)
        ix.alive()
    # as many token ids as fit under the limit (16 MiB / 2 bytes: about 8 M): more than
    # 2^20 values, 413
    t0 = time.monotonic()
    st, ans = ix.post("/query", many_tokens_body(), timeout=60)
    assert st == 413 and ans["error"], (st, str(ans)[:200])
    assert time.monotonic() - t0 < 30
    ix.alive()
    # 600 000 hashes of 20 digits (12.6 MB, under 2^20 values): answered
    body = b'{"model":"m","block_size":16,"seq_hashes":[' + \
        b",".join(b"%d" % (MASK - i) for i in range(600_000)) + b"]}"
    assert len(body) <= BODY_LIMIT
    st, ans = ix.post("/query_by_hash", body, timeout=60)
    assert st == 200 and ans["default"]["i1"]["longest_matched"] == 0, (st, str(ans)[:200])
    ix.alive()
    # numbers and strings that are not what they seem
    for b in (b'{"model":"m","block_size":16,"token_ids":[1e400]}',
              b'{"model":"m","block_size":16,"token_ids":[18446744073709551616]}',
              b'{"model":"m","block_size":16,"token_ids":[NaN]}',
              b'{"model":"m","block_size":16,"token_ids":[4294967296.0]}',
              b'{"model":"m","block_size":16e99,"token_ids":[1]}'):
        st, ans = ix.post("/query", b)
        assert st == 400, (b, st, ans)
        ix.alive()
    for b in (b'{"model":"m\\u0000x","block_size":16,"token_ids":[1]}',
              b'{"model":"\xff\xfe","block_size":16,"token_ids":[1]}',
              b'{"model":"m","block_size":16,"token_ids":[1],"model":"n"}'):
        st, ans = ix.post("/query", b)
        assert 200 <= st < 500 and st not in (404, 405), (b, st, ans)
        ix.alive()
    assert ix.metric_sum("kvpool_indexer_http_refused_total") >= 2


def vm_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_msgpack_bombs(indexer, publishers):
    """Payloads announcing absurd lengths: counted as malformed, nothing applied, the
    daemon alive and its memory flat."""
    ix, w, p = simple_world(indexer, publishers)
    rng = random.Random(17)
    toks, std = prompt(rng, 4)
    ts = msgpack.packb(1.0)
    bombs = [
        b"\xdd\xff\xff\xff\xff",                                    # array32 of 4 G
        b"\xdf\xff\xff\xff\xff",                                    # map32 of 4 G
        b"\x92" + ts + b"\xdd\xff\xff\xff\xff",                     # 4 G events
        b"\x92" + ts + b"\x91\xdd\xff\xff\xff\xff",                 # an event of 4 G fields
        b"\x92" + ts + b"\x91\x95\xabBlockStored\xdd\xff\xff\xff\xff",  # 4 G hashes
        b"\x92" + ts + b"\x91\x95\xabBlockStored\x91\x01\xc0\xdd\x7f\xff\xff\xff",  # tokens
        b"\x92" + ts + b"\x91\xdb\xff\xff\xff\xff",                 # str32 of 4 G
        b"\x92" + ts + b"\x91\xc6\xff\xff\xff\xff",                 # bin32 of 4 G
        b"\x91" * 100_000,                                          # deep nesting
        b"\x92" + ts + b"\xdc\xff\xff" + b"\x91" * 65535,           # 64 K one-element events
        b"\x82\xa2ts" + ts + b"\xa6events\xdd\xff\xff\xff\xff",     # the map form
    ]
    rss0 = None
    n = 0
    for bomb in bombs:
        w.send(p, [stored(std[:2])])
        w.settle()
        if rss0 is None:
            rss0 = vm_rss_kib(ix.proc.pid)
        p.publish_raw(bomb)
        n += 1
        w.model.resync(p.endpoint)
        ix.wait_metric("kvpool_indexer_resyncs_total", {"reason": "malformed"}, n)
        ix.wait_seq(p)
        got, want = w.check("default", SCOPE, hashes=std)
        assert_same(got, want, f"after the bomb {bomb[:24]!r}")
        assert got["default"]["g"]["longest_matched"] == 0
        ix.alive()
    assert vm_rss_kib(ix.proc.pid) - rss0 < 200 * 1024
    w.send(p, [stored(std)])
    w.settle()
    got, want = w.check("default", SCOPE, hashes=std)
    assert_same(got, want)
    assert got["default"]["g"]["GPU"] == 64
    m = ix.metrics()
    assert ix.metric("kvpool_indexer_resyncs_total", {"reason": "malformed"}, text=m) == n
    assert ix.metric("kvpool_indexer_resyncs_total", {"reason": "gap"}, text=m) == 0
    assert p.replay_requests == []
    assert ix.metric("kvpool_indexer_resyncs_total", {"reason": "restart"}, text=m) == 0
