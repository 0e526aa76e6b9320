"""KV events of kvpool-master (issue 15), end to end: a real master started with
--kv-events-bind / --kv-events-replay-bind, real `kvpool serve` segments, puts through
kvpool.Client, and a ZeroMQ subscriber here (python3-zmq, python3-msgpack) that decodes
vLLM's framing: [topic, 8-byte big-endian seq, msgpack [ts, [events], dp_rank]], with a
DEALER asking the replay socket for what it missed ([b"", start seq] -> [b"", seq,
payload]... then [b"", -1, b""]).

A SUB socket hears nothing until its subscription reached the master, so the subscriber
here never trusts itself to have heard everything: a gap in the seqs, or a quiet socket
while it waits for an event, makes it ask the replay socket from the next seq it lacks.
That is the recovery a router does, and what the replay tests exercise on purpose.
"""

import os
import subprocess
import time
import uuid

import msgpack
import pytest
import zmq

import kvpool
from conftest import Proc, free_port

END = b"\xff" * 8
MASK = (1 << 64) - 1
ENVELOPE = {"event_id", "timestamp", "event_type", "model_name", "block_size",
            "additional_salt", "lora_name", "tenant_id", "backend_id", "medium", "dp_rank"}
FIELDS = {
    "stored": ENVELOPE | {"seq_hashes", "base_block_idx", "parent_hash", "token_ids",
                          "object_key"},
    "removed": ENVELOPE | {"seq_hashes", "base_block_idx", "object_key"},
    "cleared": ENVELOPE,
}


def vllm_key(prefix, i=0):
    """A key in the vLLM store worker's format; its expected seq_hash."""
    h = uuid.uuid4().bytes + uuid.uuid4().bytes  # a 32-byte digest, as sha256's
    key = f"{prefix}vllm@Qwen/Qwen3-8B@tp_rank:0@pcp0@dcp0@pp_rank:0@group:{i % 3}@{h.hex()}"
    return key, int.from_bytes(h, "big") & MASK


def vm_rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def sanitized(pid):
    with open(f"/proc/{pid}/maps") as f:
        return "libasan" in f.read()


class Subscriber:
    """Hears the batches in seq order from 0, filling gaps from the replay socket."""

    def __init__(self, pub, replay, topic=b"kvpool", skip=(), rcvhwm=0):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.RCVHWM, rcvhwm)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.connect(pub)
        self.replay_ep = replay
        self.topic = topic
        self.skip = set(skip)  # seqs thrown away on purpose when heard live
        self.next_seq = 0
        self.batches = []  # (seq, [ts, events, dp_rank], "live" | "replay")
        self.events = []

    def close(self):
        self.sub.close()
        self.ctx.term()

    def replay(self, start):
        """[(seq, payload)] the replay socket answers for start."""
        d = self.ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 0)
        d.connect(self.replay_ep)
        try:
            d.send_multipart([b"", start.to_bytes(8, "big")])
            out = []
            while True:
                assert d.poll(5000), "the replay socket did not answer within 5 s"
                empty, seq, payload = d.recv_multipart()
                assert empty == b""
                if seq == END:
                    assert payload == b""
                    return out
                out.append((int.from_bytes(seq, "big"), payload))
        finally:
            d.close()

    def _add(self, seq, payload, how):
        assert seq == self.next_seq
        batch = msgpack.unpackb(payload, raw=False)
        assert isinstance(batch, list) and len(batch) == 3, batch
        assert isinstance(batch[0], float) and isinstance(batch[1], list)
        assert batch[1], "an empty batch"
        self.batches.append((seq, batch, how))
        self.events.extend(batch[1])
        self.next_seq += 1

    def fill(self, upto=None):
        """Take from the replay socket what follows next_seq (up to upto, exclusive)."""
        for seq, payload in self.replay(self.next_seq):
            if upto is not None and seq >= upto:
                break
            if seq == self.next_seq:
                self._add(seq, payload, "replay")

    def pump(self, timeout=0.3):
        """What the SUB socket has (waiting up to timeout); False when nothing came."""
        if not self.sub.poll(int(timeout * 1000)):
            return False
        while True:
            topic, seq_b, payload = self.sub.recv_multipart()
            assert topic == self.topic and len(seq_b) == 8
            seq = int.from_bytes(seq_b, "big")
            if seq in self.skip:
                self.skip.discard(seq)
            elif seq >= self.next_seq:
                if seq > self.next_seq:
                    self.fill(seq)
                    assert self.next_seq == seq, f"replay lacks {self.next_seq}..{seq}"
                self._add(seq, payload, "live")
            if not self.sub.poll(0):
                return True

    def wait(self, pred, timeout=20, what="events"):
        deadline = time.monotonic() + timeout
        while not pred(self.events):
            assert time.monotonic() < deadline, f"no {what} within {timeout} s: " \
                f"{len(self.events)} events heard, the last {self.events[-3:]}"
            if not self.pump():
                self.fill()  # quiet: maybe the newest batches went before we subscribed


def check_ids_and_fields(events, model="qwen3-8b", block_size=16):
    """event_id consecutive per medium from 0; every map as the contract wants."""
    last = {}
    for e in events:
        assert set(e) == FIELDS[e["event_type"]], e
        m = e["medium"]
        assert m in ("cpu", "disk")
        assert e["event_id"] == last.get(m, -1) + 1, (m, e["event_id"], last.get(m))
        last[m] = e["event_id"]
        assert e["model_name"] == model and e["block_size"] == block_size
        assert e["tenant_id"] == "acme" and e["backend_id"] == "kvpool-test"
        assert e["dp_rank"] == 0
        assert e["additional_salt"] is None and e["lora_name"] is None
        assert abs(e["timestamp"] / 1000 - time.time()) < 600
        if e["event_type"] != "cleared":
            assert isinstance(e["object_key"], str)
            assert e["base_block_idx"] is None
            assert isinstance(e["seq_hashes"], list)
        if e["event_type"] == "stored":
            assert e["parent_hash"] is None and e["token_ids"] is None
    return last


def of(events, type_, medium=None, key=None):
    return [e for e in events if e["event_type"] == type_
            and (medium is None or e["medium"] == medium)
            and (key is None or e.get("object_key") == key)]


@pytest.fixture
def events_pool(make_pool):
    """events_pool(segments=..., extra=...) -> (pool, pub endpoint, replay endpoint)."""

    def make(segments=("64MiB",), extra=()):
        pub = f"tcp://127.0.0.1:{free_port()}"
        rep = f"tcp://127.0.0.1:{free_port()}"
        pool = make_pool(segments=segments, master_args=(
            "--lease-ttl", "0", "--kv-events-bind", pub, "--kv-events-replay-bind", rep,
            "--kv-events-model", "qwen3-8b", "--kv-events-block-size", "16",
            "--kv-events-tenant", "acme", "--kv-events-backend-id", "kvpool-test", *extra))
        return pool, pub, rep

    return make


@pytest.fixture
def subscribers():
    subs = []

    def make(*a, **kw):
        s = Subscriber(*a, **kw)
        subs.append(s)
        return s

    yield make
    for s in subs:
        s.close()


def test_put_remove_remove_all(events_pool, subscribers, prefix):
    pool, pub, rep = events_pool()
    sub = subscribers(pub, rep)
    keys = [vllm_key(prefix, i) for i in range(20)]
    with kvpool.Client(pool.addr) as c:
        for k, _ in keys:
            c.put(k, b"x" * 1000)
        c.put(prefix + "plain-key", b"y")
        c.put(prefix + "decimal_123456789012", b"z")
        sub.wait(lambda ev: len(of(ev, "stored")) >= 22, what="22 stored")

        for k, h in keys:
            (e,) = of(sub.events, "stored", "cpu", k)
            assert e["seq_hashes"] == [h]
        assert of(sub.events, "stored", "cpu", prefix + "plain-key")[0]["seq_hashes"] == []
        assert of(sub.events, "stored", "cpu",
                  prefix + "decimal_123456789012")[0]["seq_hashes"] == [123456789012]

        for k, _ in keys[:5]:
            c.remove(k)
        sub.wait(lambda ev: len(of(ev, "removed")) >= 5, what="5 removed")
        for k, h in keys[:5]:
            (e,) = of(sub.events, "removed", "cpu", k)
            assert e["seq_hashes"] == [h]

        c.remove_all()
        sub.wait(lambda ev: len(of(ev, "cleared")) >= 2, what="cleared on both media")
        assert {e["medium"] for e in of(sub.events, "cleared")} == {"cpu", "disk"}
        while sub.pump(0.3):  # anything after it (there should be nothing)
            pass

    assert not of(sub.events, "stored", "disk")
    assert len(of(sub.events, "removed")) == 5  # remove_all is `cleared`, not one each
    assert sub.events[-1]["event_type"] == "cleared"
    last = check_ids_and_fields(sub.events)
    assert last["cpu"] == 22 + 5 + 1 - 1  # stored, removed, cleared; ids from 0
    assert last["disk"] == 0  # its cleared
    for seq, batch, _ in sub.batches:
        assert batch[2] == 0  # dp_rank
        assert abs(batch[0] - time.time()) < 600


def test_evictions_are_removed(events_pool, subscribers, prefix):
    pool, pub, rep = events_pool(segments=("4MiB",))
    sub = subscribers(pub, rep)
    keys = [vllm_key(prefix, i) for i in range(16)]
    with kvpool.Client(pool.addr) as c:
        for k, _ in keys:
            c.put(k, b"e" * (1 << 20))
        alive = {k for k, _ in keys if c.exists(k)}
    gone = {k for k, _ in keys} - alive
    assert gone, "nothing was evicted: make the segment smaller"
    sub.wait(lambda ev: len(of(ev, "stored")) >= 16 and len(of(ev, "removed")) >= len(gone),
             what=f"16 stored and {len(gone)} removed")
    hashes = dict(keys)
    for k in gone:
        (e,) = of(sub.events, "removed", "cpu", k)
        assert e["seq_hashes"] == [hashes[k]]
        # removed after it was stored
        assert e["event_id"] > of(sub.events, "stored", "cpu", k)[0]["event_id"]
    for k in alive:
        assert not of(sub.events, "removed", key=k)
    check_ids_and_fields(sub.events)


def test_replay_fills_what_a_subscriber_missed(events_pool, subscribers, prefix):
    pool, pub, rep = events_pool()
    with kvpool.Client(pool.addr) as c:
        # 1) a subscriber that connects late: everything so far comes from the replay
        first = [vllm_key(prefix + "a", i) for i in range(30)]
        # the master publishes on a thread of its own: a witness that hears all 30 (live or
        # by replay) proves they went out before the late subscriber connects, which
        # otherwise could hear the first batch live on a loaded machine
        witness = subscribers(pub, rep)
        for k, _ in first:
            c.put(k, b"1")
        witness.wait(lambda ev: len(of(ev, "stored")) >= 30, what="the 30 puts, published")
        late = subscribers(pub, rep)
        late.wait(lambda ev: len(of(ev, "stored")) >= 30, what="the 30 puts before it came")
        assert late.batches[0][0] == 0 and late.batches[0][2] == "replay"

        # 2) a subscriber that throws batches away on purpose gets them back: one batch
        # per put (the next put waits until `late` heard the last), seqs start..start+9
        skipper = subscribers(pub, rep)
        skipper.wait(lambda ev: len(of(ev, "stored")) >= 30, what="the first 30")
        start = skipper.next_seq
        skipper.skip = set(range(start + 2, start + 7))
        more = [vllm_key(prefix + "b", i) for i in range(10)]
        for i, (k, _) in enumerate(more):
            c.put(k, b"2")
            late.wait(lambda ev: len(of(ev, "stored")) >= 31 + i, what=f"put {i}")
        skipper.wait(lambda ev: len(of(ev, "stored")) >= 40, what="all 40")

    assert late.next_seq == start + 10 and skipper.next_seq == start + 10
    replayed = {seq for seq, _, how in skipper.batches if how == "replay"}
    assert set(range(start + 2, start + 7)) <= replayed
    assert not skipper.skip  # every one of them was heard live, and thrown away
    # both heard the same batches
    assert [b for _, b, _ in skipper.batches] == [b for _, b, _ in late.batches]
    for s in (late, skipper):
        check_ids_and_fields(s.events)
        assert [k for k, _ in first + more] == [e["object_key"] for e in of(s.events, "stored")]

    # a start older than anything: all the ring holds from seq 0, then the end marker
    got = late.replay(0)
    assert [seq for seq, _ in got] == list(range(late.next_seq))
    # past the newest: the end marker alone
    assert late.replay(late.next_seq + 100) == []


def test_flood_with_a_stalled_subscriber_stays_bounded(events_pool, subscribers, prefix):
    """200k events while one subscriber never reads: the master's RSS stays bounded, it
    still answers, and a subscriber that reads still gets consecutive batches."""
    pool, pub, rep = events_pool(extra=("--kv-events-queue", "65536"))
    stalled = zmq.Context()
    s = stalled.socket(zmq.SUB)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVHWM, 1)
    s.setsockopt(zmq.RCVBUF, 4096)
    s.setsockopt(zmq.SUBSCRIBE, b"")
    s.connect(pub)
    try:
        with kvpool.Client(pool.addr) as c:
            def flood(rounds, tag):
                for r in range(rounds):
                    keys = [f"{prefix}{tag}{r}@flood@tp_rank:0@group:0@{(r << 20) + i:032x}"
                            for i in range(1000)]
                    c.batch_put(keys, [b"f"] * len(keys))
                    c.batch_remove(keys)

            flood(5, "warm")
            rss0 = vm_rss_kib(pool.master.pid)
            t0 = time.monotonic()
            flood(100, "a")  # 100k stored + 100k removed
            took = time.monotonic() - t0
            rss1 = vm_rss_kib(pool.master.pid)
            flood(100, "b")  # as many again: no growth from here
            rss2 = vm_rss_kib(pool.master.pid)
            assert c.stat() is not None
        cli = subprocess.run([pool.cli_bin, "--master", pool.addr, "stat"], capture_output=True,
                             timeout=20)
        assert cli.returncode == 0, cli.stderr
        print(f"flood: 200k events in {took:.1f} s; master VmRSS {rss0} -> {rss1} -> {rss2} KiB")
        if not sanitized(pool.master.pid):  # ASan's quarantine and redzones say nothing here
            assert rss1 - rss0 < 200 * 1024, (rss0, rss1)
            assert rss2 - rss1 < 64 * 1024, (rss1, rss2)

        # a reading subscriber now: the replay ring answers from its oldest batch on,
        # consecutive, and live batches follow
        sub = subscribers(pub, rep)
        held = sub.replay(0)
        seqs = [seq for seq, _ in held]
        assert seqs and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert len(held) <= 4096
        sub.next_seq = seqs[-1] + 1
        with kvpool.Client(pool.addr) as c:
            k, h = vllm_key(prefix + "after")
            c.put(k, b"1")
            sub.wait(lambda ev: bool(of(ev, "stored", "cpu", k)), what="the put after")
        assert of(sub.events, "stored", "cpu", k)[0]["seq_hashes"] == [h]
    finally:
        s.close()
        stalled.term()


def test_offload_to_disk(events_pool, subscribers, prefix, tmp_path):
    """A 4 MiB DRAM segment and an SSD segment: puts past DRAM offload to SSD, which is
    `stored` on disk, then `removed` on cpu when DRAM drops the object; a remove of an
    SSD-only object is `removed` on disk."""
    pool, pub, rep = events_pool(segments=("4MiB",), extra=("--promote-on-hit", "off"))
    pool.segments.append(Proc([pool.cli_bin, "--master", pool.addr, "serve", "--segment-size",
                               "0", "--ssd-path", str(tmp_path / "seg.kvpssd"), "--ssd-size",
                               "64MiB", "--ssd-buffered-io", "--ready-fd", "{fd}"]))
    sub = subscribers(pub, rep)
    keys = [vllm_key(prefix, i) for i in range(12)]
    with kvpool.Client(pool.addr) as c:
        for k, _ in keys:
            c.put(k, bytes([len(k) % 251]) * (1 << 20))
        sub.wait(lambda ev: len(of(ev, "stored", "disk")) >= 1, what="an offload")
        on_disk = {e["object_key"] for e in of(sub.events, "stored", "disk")}
        # every offloaded object leaves DRAM: removed on cpu, after its stored on disk
        sub.wait(lambda ev: all(of(ev, "removed", "cpu", k) for k in on_disk),
                 what="removed on cpu for the offloaded")
        hashes = dict(keys)
        for k in on_disk:
            (d,) = of(sub.events, "stored", "disk", k)
            assert d["seq_hashes"] == [hashes[k]]
            assert c.get(k) == bytes([len(k) % 251]) * (1 << 20)  # still readable
        # remove one that is on disk only
        victim = next(k for k in sorted(on_disk)
                      if len(of(sub.events, "stored", "cpu", k)) == 1)
        n_removed_disk = len(of(sub.events, "removed", "disk"))
        c.remove(victim)
        sub.wait(lambda ev: len(of(ev, "removed", "disk", victim)) >= 1, what="removed on disk")
        assert len(of(sub.events, "removed", "disk")) == n_removed_disk + 1
    check_ids_and_fields(sub.events)
