"""A put in one round trip (PUT_COMMIT and the room the master holds ahead of a client's
puts, "holds"), as its users see it.

Real processes only: kvpool-master (its /metrics on an HTTP port of its own) and `kvpool
serve` segments on 127.0.0.1, library clients in this process or in child processes started
here; every child is killed by the PID we started and reaped.

Covered:
 1. steady state: 20 put batches of 32 keys make one master call each (put_commit; the
    client's master_rpc counters: PutStart for the first batch only, no PutEnd), every key
    reads back byte-exact; with KVPOOL_PUT_AHEAD=off (or 0) in the client's environment,
    two calls a batch (PutStart, PutEnd) and no PUT_COMMIT, no hold; a held batch on an
    owner that stopped answering (SIGSTOP) is placed anew once on the other owner (every
    key OK, read back byte-exact), or with no other owner fails with ERR_TIMEOUT after one
    failed write per key (none written to the silent owner twice); with replicas=2 and
    both owners silent, ERR_NO_REPLICA after two failed writes per key;
 2. holds are not keys: list_keys, exists, remove_by_regex, stat, kvpool_keys,
    kvpool_pending_objects and kvpool_objects see exactly the keys put while holds exist;
 3. readers racing upserting writers (read leases on): every get returns a whole value
    some writer wrote (64 KiB of one (writer, generation) word), or NOT_FOUND during an
    upsert;
 4. a client killed (kill -9) holding room gives it back at the holds' put timeout (not
    with its connection): kvpool_put_holds and kvpool_put_held_bytes go to 0, its stored
    objects stay and read back, and the pool (--no-eviction) takes exactly its capacity
    less what is stored;
 5. the master killed (kill -9) and started again on its port while a held batch is in
    flight: the put returns OK for every key (put again the two-call way after its holds
    were gone), both batches read back byte-exact; and a batch whose PUT_COMMIT the frozen
    master took with it fails cleanly (nothing of it visible, nothing acknowledged lost);
 6. holds from a master that died never land on objects the next master placed: a client
    that slept through a restart puts again, and another client's acknowledged objects
    still read back byte-exact;
 7. quotas (TLS and an ACL with [tenant] sections): a tenant's stored plus held bytes never
    pass its max-dram, held bytes stay under max-dram/8, a put is refused with ERR_QUOTA at
    the quota; holds take no place in max-objects;
 8. hostile: a raw PUT_COMMIT naming another connection's hold ids (or giving them back)
    commits nothing and frees nothing (NOT_FOUND per key); keys shaped like a hold's
    internal key are refused (BAD_KEY); a PutEnd, PutRevoke or PUT_COMMIT naming versions
    of another count than its keys' is refused (INVALID_ARG) and the master answers on;
 9. segments that go under held room: a segment that drains (its owner stopped) gives back
    only the room held on it, not a two-replica hold's extents on the other segments, and a
    held key whose commit answered IO (its written replica's segment gone) does not keep its
    hold: in both cases every acknowledged object of another client reads back byte-exact;
10. a put's last call (PUT_COMMIT, or PutEnd with KVPOOL_PUT_AHEAD=off) carried out by the
    master, its answer lost with the connection (a relay cuts it; plain pass only): sent
    again, it no longer finds the keys, and the put still reports OK for each (the master
    has them with the put's size and CRC), not PUT_REVOKED or EXISTS;
11. a put's end names its put (PutStart's version): a put session whose owner died ends with
    PUT_REVOKED, not by ending another thread's put of the same key on the shared
    connection, which returns OK and reads back its bytes.
12. a key named twice in one batch is put once, by its first entry (the others answer
    ERR_PENDING, nothing written), on held room as with two calls a batch.

In the suite's TLS pass (KVPOOL_TEST_TLS_DIR) every master runs with TLS and the suite's ACL
(its /metrics over HTTPS), clients name the admin through $KVPOOL_TLS_*, and the raw
connections of case 8 speak TLS with the admin's certificate.
"""

import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time

import pytest

import kvpool
from conftest import (TLS_DIR, Proc, _bin, free_port, freeze, master_metrics, metric,
                      master_security_args)
from test_security import _CRED_ENV, certs, frame, read_frame, varint  # noqa: F401 (fixture)

KiB, MiB = 1024, 1 << 20
ERR_QUOTA = getattr(kvpool, "ERR_QUOTA", -39)
M_PUT_COMMIT = 28


# ---- helpers ----

class HPool:
    """make_pool's pool with the master's /metrics on a port of its own."""

    def __init__(self, make_pool, segments=("64MiB",), flags=(), lease_ttl="0"):
        self.http_port = free_port()
        self.pool = make_pool(segments=segments,
                              master_args=("--lease-ttl", lease_ttl, "--http-listen",
                                           f"127.0.0.1:{self.http_port}", *flags))
        self.addr = self.pool.addr

    def metrics(self):
        return master_metrics(self.http_port)

    def m(self, name, text=None, **labels):
        return metric(text or self.metrics(), name, labels or None)


def calls(client):
    """{method: calls} of the client's master calls so far."""
    return {k: v["calls"] for k, v in client.metrics()["master_rpc"].items()}


def delta(after, before):
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


def blobs(prefix, n, size):
    return {f"{prefix}{i}": os.urandom(size) for i in range(n)}


def put_all(client, kv, **cfg):
    keys = list(kv)
    assert client.batch_put(keys, [kv[k] for k in keys], **cfg) == [0] * len(keys)


def read_back(client, kv):
    keys = list(kv)
    got = client.batch_get(keys)
    bad = [k for k, g in zip(keys, got) if g != kv[k]]
    assert not bad, f"{len(bad)} keys read back wrong, e.g. {bad[:3]}"


def poll(cond, what, timeout=10.0, step=0.02):
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(step)


def get_retrying(client, key, timeout=10.0):
    """client.get(key), retried while the owners remount after a master restart."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.get(key)
        except kvpool.Error as e:
            if time.monotonic() > deadline:
                raise AssertionError(f"{key}: {e}") from e
            time.sleep(0.05)


# ---- 1. one master call per put batch ----

def test_steady_state_is_one_master_call_per_batch(make_pool):
    """20 batches of 32 x 4 KiB new keys: PutStart once (the first batch), PUT_COMMIT once a
    batch, never PutEnd; the master says its holds were used by 19 batches' keys."""
    p = HPool(make_pool)
    kv = {}
    with kvpool.Client(p.addr) as c:
        c0 = calls(c)
        for b in range(20):
            batch = blobs(f"s{b}-", 32, 4 * KiB)
            put_all(c, batch)
            kv.update(batch)
        d = delta(calls(c), c0)
        assert d.get("put_start", 0) <= 1, d
        assert d.get("put_commit", 0) == 20, d
        assert d.get("put_end", 0) == 0 and d.get("put_revoke", 0) == 0, d
        assert sum(d.values()) <= 21 + d.get("heartbeat", 0), d  # nothing else on the way
        read_back(c, kv)
        text = p.metrics()
        assert p.m("kvpool_put_holds_used_total", text) >= 19 * 32
        assert p.m("kvpool_put_holds_gone_total", text) == 0
        assert p.m("kvpool_keys", text) == 640
        assert p.m("kvpool_put_holds", text) == 32  # the next batch's, of its size


def test_a_held_write_that_times_out_goes_to_another_owner(make_pool):
    """A batch written into holds on an owner that stopped answering (SIGSTOP), while a
    second owner has room: the writes time out once, the keys are placed anew away from the
    silent owner (PutStart with it to avoid) and the put returns OK for every key; they
    read back byte-exact while that owner is still frozen (so from the other one)."""
    p = HPool(make_pool)
    with kvpool.Client(p.addr, transport="tcp", rpc_timeout_ms=1000) as c:
        first = blobs("ta1-", 16, 4 * KiB)
        put_all(c, first)  # every hold on the only owner
        assert p.m("kvpool_put_holds") == 16
        p.pool.add_segment()
        second = blobs("ta2-", 16, 4 * KiB)
        seg = p.pool.segments[0]
        c0 = calls(c)
        freeze(seg.pid)
        try:
            put_all(c, second)
            d = delta(calls(c), c0)
            assert d.get("put_start", 0) == 1, d  # the keys placed anew, once
            read_back(c, second)  # from the owner that answers
        finally:
            os.kill(seg.pid, signal.SIGCONT)
        read_back(c, first)
        assert p.m("kvpool_keys") == 32


def placed_anew_unwritten(p, c, c0, e0, first, second, writes):
    """After a held batch `second` failed on silent owners: it was placed anew once (one
    PutStart since calls c0), `writes` writes failed in all (client errors since e0), none
    of its keys is visible, and `first` (put before) reads back byte-exact."""
    d = delta(calls(c), c0)
    assert d.get("put_start", 0) == 1, d
    assert c.metrics()["errors"]["put"] - e0 == writes
    for k in second:
        with pytest.raises(kvpool.Error) as e:
            c.get(k)
        assert e.value.status == kvpool.ERR_NOT_FOUND, (k, e.value)
    read_back(c, first)
    assert p.m("kvpool_keys") == len(first)


def test_a_held_write_that_times_out_fails_within_one_timeout(make_pool):
    """A batch written into holds on the only owner, which stopped answering (SIGSTOP):
    each key fails with KVP_ERR_TIMEOUT after the one write timeout. Placed anew (PutStart),
    it lands on that same owner again, which the client does not write to a second time
    (the call would wait a second timeout): the placement is revoked. None of its keys is
    visible, the batch before reads back byte-exact."""
    p = HPool(make_pool)
    with kvpool.Client(p.addr, transport="tcp", rpc_timeout_ms=1000) as c:
        first = blobs("to1-", 16, 4 * KiB)
        put_all(c, first)  # PutStart + PUT_COMMIT: holds for 16 more
        assert p.m("kvpool_put_holds") == 16
        second = blobs("to2-", 16, 4 * KiB)
        seg = p.pool.segments[0]
        c0, e0 = calls(c), c.metrics()["errors"]["put"]
        freeze(seg.pid)
        try:
            with pytest.raises(kvpool.Error) as e:  # every key failed the same way: raised
                c.batch_put(list(second), list(second.values()))
            assert p.m("kvpool_pending_objects") == 0  # the second placement revoked
        finally:
            os.kill(seg.pid, signal.SIGCONT)
        assert e.value.status == kvpool.ERR_TIMEOUT, e.value
        assert "timed out" in str(e.value), e.value
        # one failed (timed-out) write per key: none written to the silent owner again
        placed_anew_unwritten(p, c, c0, e0, first, second, writes=16)


def test_a_held_batch_of_two_replicas_on_two_silent_owners(make_pool):
    """replicas=2, both owners stopped answering (SIGSTOP) under a held batch: every
    write times out once; placed anew (one PutStart), the keys land on the same two
    silent owners, which the client does not write to again: each key fails with
    ERR_NO_REPLICA after one timeout (two failed writes per key, not four), nothing of it
    is visible, and the batch before reads back byte-exact."""
    p = HPool(make_pool, segments=("64MiB", "64MiB"))
    with kvpool.Client(p.addr, transport="tcp", rpc_timeout_ms=1000) as c:
        first = blobs("tr1-", 16, 4 * KiB)
        put_all(c, first, replicas=2)  # holds for 16 more of two replicas
        assert p.m("kvpool_put_holds") == 16
        second = blobs("tr2-", 16, 4 * KiB)
        c0, e0 = calls(c), c.metrics()["errors"]["put"]
        for seg in p.pool.segments:
            freeze(seg.pid)
        try:
            st = c.batch_put(list(second), list(second.values()), replicas=2)
            assert p.m("kvpool_pending_objects") == 0
        finally:
            for seg in p.pool.segments:
                os.kill(seg.pid, signal.SIGCONT)
        assert st == [kvpool.ERR_NO_REPLICA] * 16, st
        placed_anew_unwritten(p, c, c0, e0, first, second, writes=32)


@pytest.mark.parametrize("setting", ["off", "0"])
def test_put_ahead_off_makes_two_calls_a_batch(make_pool, monkeypatch, setting):
    """KVPOOL_PUT_AHEAD=off (or 0), read when the client is created: every batch makes
    PutStart and PutEnd, no PUT_COMMIT, and the master hands this client no hold."""
    p = HPool(make_pool)
    monkeypatch.setenv("KVPOOL_PUT_AHEAD", setting)
    c = kvpool.Client(p.addr)
    monkeypatch.delenv("KVPOOL_PUT_AHEAD")  # read once, at create: this client keeps it
    kv = {}
    with c:
        c0 = calls(c)
        for b in range(20):
            batch = blobs(f"o{b}-", 32, 4 * KiB)
            put_all(c, batch)
            kv.update(batch)
        d = delta(calls(c), c0)
        got = (d.get("put_start", 0), d.get("put_end", 0), d.get("put_commit", 0))
        assert got == (20, 20, 0), d
        read_back(c, kv)
        text = p.metrics()
        assert p.m("kvpool_put_holds_granted_total", text) == 0
        assert p.m("kvpool_put_holds", text) == 0
        assert p.m("kvpool_keys", text) == 640
        # a client made now (the variable unset) holds room again
        with kvpool.Client(p.addr) as c2:
            put_all(c2, blobs("o-after-", 8, 4 * KiB))
            put_all(c2, blobs("o-after2-", 8, 4 * KiB))
            assert calls(c2).get("put_commit", 0) == 2
        assert p.m("kvpool_put_holds_used_total") == 8


@pytest.mark.parametrize("ahead", ["on", "off"])
def test_a_key_named_twice_in_a_batch_is_put_once(make_pool, monkeypatch, ahead):
    """A batch naming a key twice (a, b, a, c, a): the first a, b and c are put, the later
    a's answer ERR_PENDING (that key's put is under way) and write nothing, alike on held room
    (one PUT_COMMIT, no PutStart) and with two calls a batch (KVPOOL_PUT_AHEAD=off); a reads
    back the first a's bytes. (On held room the master used to commit the last a and answer
    the first ERR_EXISTS.)"""
    p = HPool(make_pool)
    if ahead == "off":
        monkeypatch.setenv("KVPOOL_PUT_AHEAD", "off")
    c = kvpool.Client(p.addr)
    monkeypatch.delenv("KVPOOL_PUT_AHEAD", raising=False)
    with c:
        put_all(c, blobs("warm-", 5, 4 * KiB))  # room held ahead for batches like the next
        for r in range(4):
            a1, b, a2, cc, a3 = (os.urandom(4 * KiB) for _ in range(5))
            keys = [f"d{r}-a", f"d{r}-b", f"d{r}-a", f"d{r}-c", f"d{r}-a"]
            c0 = calls(c)
            st = c.batch_put(keys, [a1, b, a2, cc, a3])
            d = delta(calls(c), c0)
            assert st == [0, 0, kvpool.ERR_PENDING, 0, kvpool.ERR_PENDING], (r, st)
            if ahead == "on":
                assert d.get("put_commit", 0) == 1 and d.get("put_start", 0) == 0, d
            else:
                assert d.get("put_start", 0) == 1 and d.get("put_end", 0) == 1, d
            assert c.batch_get([f"d{r}-a", f"d{r}-b", f"d{r}-c"]) == [a1, b, cc]
        assert p.m("kvpool_keys") == 5 + 4 * 3
        assert p.m("kvpool_pending_objects") == 0


# ---- 2. holds are not keys ----

def test_holds_are_not_keys(make_pool):
    """With holds in the master, every view of keys and objects shows the keys put and
    nothing else; removing every key leaves the holds (the next batch uses them)."""
    p = HPool(make_pool)
    with kvpool.Client(p.addr) as c:
        kv = {}
        for b in range(3):
            batch = blobs(f"h{b}-", 16, 8 * KiB)
            put_all(c, batch)
            kv.update(batch)
        text = p.metrics()
        assert p.m("kvpool_put_holds", text) == 16
        assert p.m("kvpool_put_held_bytes", text) == 16 * 8 * KiB
        assert p.m("kvpool_keys", text) == 48
        assert p.m("kvpool_pending_objects", text) == 0
        assert p.m("kvpool_objects", text, tier="dram") == 48
        assert p.m("kvpool_used_bytes", text, tier="dram") == 48 * 8 * KiB

        listed = c.list_keys()
        assert sorted(e["key"] for e in listed) == sorted(kv), listed[:5]
        assert all(e["complete"] and e["size"] == 8 * KiB for e in listed)
        assert c.batch_exists(list(kv)) == [True] * 48
        st = c.stat()
        assert (st["objects"], st["pending"], st["used"]) == (48, 0, 48 * 8 * KiB), st
        assert [s["objects"] for s in st["segments"]] == [48]

        # every key matches ".*": exactly the keys put go, the holds stay
        assert c.remove_by_regex(".*", force=True) == 48
        assert c.list_keys() == []
        assert c.remove_all(force=True) == 0
        text = p.metrics()
        assert p.m("kvpool_keys", text) == 0
        assert p.m("kvpool_objects", text, tier="dram") == 0
        assert p.m("kvpool_put_holds", text) == 16
        st = c.stat()
        assert (st["objects"], st["pending"], st["used"]) == (0, 0, 0), st

        c0 = calls(c)
        again = blobs("h-again-", 16, 8 * KiB)
        put_all(c, again)
        assert delta(calls(c), c0).get("put_start", 0) == 0  # on the holds left
        read_back(c, again)
        assert sorted(e["key"] for e in c.list_keys()) == sorted(again)


# ---- 3. readers racing writers ----

VAL = 64 * KiB
WORDS = VAL // 8


def _value(writer, gen):
    return struct.pack("<Q", (writer << 40) | gen) * WORDS


def test_readers_racing_upserts_see_whole_values(make_pool):
    """4 writers upsert 6 keys (single puts and batches of all 6) with values of one
    (writer, generation) word; 4 readers get them meanwhile: every value read is whole and
    one that writer wrote (or is writing); NOT_FOUND only while an upsert replaces it. Read
    leases on (--lease-ttl 5): a replaced object's room waits for its readers."""
    p = HPool(make_pool, lease_ttl="5")
    keys = [f"race{i}" for i in range(6)]
    W, R = 4, 4
    last_gen = [0] * W  # a generation a writer started
    stop = threading.Event()
    errors, counts = [], {"reads": 0, "not_found": 0, "writes": 0, "refused": {}}
    lock = threading.Lock()

    with kvpool.Client(p.addr) as c:
        put_all(c, {k: _value(0, 0) for k in keys})

    def writer(w):
        try:
            with kvpool.Client(p.addr) as c:
                gen = 0
                while not stop.is_set():
                    gen += 1
                    last_gen[w] = gen
                    v = _value(w, gen)
                    if gen % 3 == 0:
                        rs = c.batch_put(keys, [v] * len(keys), upsert=True)
                    else:
                        k = keys[gen % len(keys)]
                        try:
                            c.put(k, v, upsert=True)
                            rs = [0]
                        except kvpool.Error as e:
                            rs = [e.status]
                    with lock:
                        for r in rs:
                            if r == 0:
                                counts["writes"] += 1
                            else:
                                counts["refused"][r] = counts["refused"].get(r, 0) + 1
        except Exception as e:  # noqa: BLE001 (reported by the test)
            errors.append(f"writer {w}: {e!r}")

    def reader(r):
        try:
            with kvpool.Client(p.addr) as c:
                i = r
                while not stop.is_set():
                    i += 1
                    k = keys[i % len(keys)]
                    try:
                        v = c.get(k)
                    except kvpool.Error as e:
                        if e.status != kvpool.ERR_NOT_FOUND:
                            errors.append(f"reader {r}: get {k}: {e.status} {e}")
                        with lock:
                            counts["not_found"] += 1
                        continue
                    word = v[:8]
                    if len(v) != VAL or v != word * WORDS:
                        errors.append(f"reader {r}: {k}: a torn or foreign value "
                                      f"({len(v)} bytes)")
                        continue
                    x = struct.unpack("<Q", word)[0]
                    w, gen = x >> 40, x & ((1 << 40) - 1)
                    if not (w < W and gen <= last_gen[w]) and x != 0:
                        errors.append(f"reader {r}: {k}: word {x:#x} no writer wrote")
                    with lock:
                        counts["reads"] += 1
        except Exception as e:  # noqa: BLE001
            errors.append(f"reader {r}: {e!r}")

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(W)]
    threads += [threading.Thread(target=reader, args=(r,)) for r in range(R)]
    for t in threads:
        t.start()
    time.sleep(4)
    stop.set()
    for t in threads:
        t.join(30)
    print(f"\nrace: {counts}")
    assert not errors, errors[:10]
    assert counts["reads"] > 200 and counts["writes"] > 200, counts
    # a racing upsert may find the key being written by another (PENDING), nothing else
    assert set(counts["refused"]) <= {kvpool.ERR_PENDING, kvpool.ERR_EXISTS}, counts
    assert p.m("kvpool_put_holds_used_total") > 100  # the held path was the one raced
    with kvpool.Client(p.addr) as c:  # at rest: every key holds a whole value
        for k in keys:
            v = get_retrying(c, k)
            assert v == v[:8] * WORDS


# ---- 4. a client killed holding room gives it back ----

_HOLDER = r"""
import sys
import kvpool
addr, prefix = sys.argv[1], sys.argv[2]
def val(k):
    return (k.encode() * (65536 // len(k) + 1))[:65536]
c = kvpool.Client(addr)
for b in range(2):
    ks = [f"{prefix}{b}-{i}" for i in range(16)]
    assert c.batch_put(ks, [val(k) for k in ks]) == [0] * 16
print("ready", flush=True)
sys.stdin.readline()  # until killed
"""


def _child_val(k):
    return (k.encode() * (65536 // len(k) + 1))[:65536]


def _start_child(script, *args):
    child = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    return child


def _reap(child):
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
    child.wait(10)


def test_a_killed_client_gives_its_holds_back(make_pool, monkeypatch):
    """A child process stores 32 x 64 KiB objects on `kvpool serve`'s 8 MiB segment and
    holds room for more; killed (kill -9): its holds go at their put timeout (not with its
    connection: a client cut off may still be writing into them), its objects stay and read
    back, and the pool (no eviction) takes exactly the 96 objects of 64 KiB its capacity has
    left, not one more."""
    p = HPool(make_pool, segments=("8MiB",),
              flags=("--client-ttl", "2", "--put-timeout", "3", "--no-eviction"))
    child = _start_child(_HOLDER, p.addr, "kc")
    try:
        assert child.stdout.readline().strip() == "ready"
        text = p.metrics()
        holds, held = p.m("kvpool_put_holds", text), p.m("kvpool_put_held_bytes", text)
        assert holds > 0 and held == holds * 64 * KiB, (holds, held)
        assert held <= 8 * MiB / 64  # the pool's bound on room held ahead
        assert p.m("kvpool_used_bytes", text, tier="dram") == 32 * 64 * KiB
        t0 = time.monotonic()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        time.sleep(1)  # its connection closed: its holds stay until their put timeout
        assert p.m("kvpool_put_holds") == holds
        poll(lambda: p.m("kvpool_put_holds") == 0, "the killed client's holds gone", 3 + 5)
        print(f"\nholds gone {time.monotonic() - t0:.2f} s after the kill")
    finally:
        _reap(child)
    text = p.metrics()
    assert p.m("kvpool_put_held_bytes", text) == 0
    assert p.m("kvpool_keys", text) == 32
    assert p.m("kvpool_used_bytes", text, tier="dram") == 32 * 64 * KiB
    monkeypatch.setenv("KVPOOL_PUT_AHEAD", "off")  # this client holds nothing itself
    with kvpool.Client(p.addr) as c:
        read_back(c, {f"kc{b}-{i}": _child_val(f"kc{b}-{i}") for b in range(2) for i in range(16)})
        fill = blobs("fill", 96, 64 * KiB)
        for s in range(0, 96, 32):
            put_all(c, dict(list(fill.items())[s:s + 32]))
        with pytest.raises(kvpool.Error) as ei:
            c.put("one-more", b"x" * 64 * KiB)
        assert ei.value.status == kvpool.ERR_POOL_FULL, ei.value
        read_back(c, fill)


# ---- 5., 6. a master restarted on its port ----

class RestartPool:
    """A master on a fixed port (and HTTP port) that can be killed and started again there,
    and one `kvpool serve` segment (it remounts and offers its record back)."""

    def __init__(self, request, size="64MiB"):
        self.port, self.http_port = free_port(), free_port()
        self.argv = [_bin("KVPOOL_MASTER_BIN"), "--listen", f"127.0.0.1:{self.port}",
                     "--ready-fd", "{fd}", "--log-level", "error", *master_security_args(),
                     "--lease-ttl", "0", "--http-listen", f"127.0.0.1:{self.http_port}"]
        self.master, self.seg = Proc(self.argv), None
        self.addr = self.master.ready
        request.addfinalizer(self.close)
        self.seg = Proc([_bin("KVPOOL_CLI_BIN"), "--master", self.addr, "serve",
                         "--segment-size", size, "--ready-fd", "{fd}"])

    def restart(self):
        """kill -9 the master (by its PID) and start a new one on the same port."""
        self.master.kill()
        self.master = Proc(self.argv)

    def m(self, name, **labels):
        return metric(master_metrics(self.http_port), name, labels or None)

    def close(self):
        """Stop both by the PIDs we started (the segment first)."""
        for p in (self.seg, self.master):
            if p is not None and p.p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)  # a test may have stopped it
                p.stop()


def test_master_restart_under_a_held_batch(request):
    """A batch written into holds is in flight (its transfer held up by the frozen segment
    owner) when the master is killed and started again on its port: the put returns OK for
    every key (its holds gone at the new master, each key put again the two-call way), and
    every key of both batches reads back byte-exact."""
    rp = RestartPool(request)
    with kvpool.Client(rp.addr, transport="tcp") as c:  # tcp: the owner's process moves bytes
        first = blobs("r1-", 16, 64 * KiB)
        put_all(c, first)  # PutStart + PUT_COMMIT: holds for 16 more
        second = blobs("r2-", 16, 64 * KiB)
        c0 = calls(c)
        freeze(rp.seg.pid)
        out = {}

        def run():
            try:
                out["r"] = c.batch_put(list(second), list(second.values()))
            except kvpool.Error as e:
                out["e"] = e

        t = threading.Thread(target=run)
        t.start()
        try:
            time.sleep(0.3)
            assert t.is_alive(), out  # its bytes wait on the owner: no master call yet
            assert delta(calls(c), c0).get("put_start", 0) == 0
            rp.restart()
        finally:
            os.kill(rp.seg.pid, signal.SIGCONT)
        t.join(30)
        assert out.get("r") == [0] * 16, out
        for k, v in {**first, **second}.items():
            assert get_retrying(c, k) == v, k
        # the commit named the old master's holds: the new one had none of them
        assert rp.m("kvpool_put_holds_gone_total") == 16
        assert rp.m("kvpool_keys") == 32


def test_commit_lost_with_the_master_fails_cleanly(request):
    """The master frozen (SIGSTOP) while a held batch's PUT_COMMIT waits on it, then killed
    and started again on its port: the commit never happened, so that put fails (each key
    reports the lost connection; OK only where the new master answered the commit's second
    try), none of its failed keys ever shows up, the acknowledged batch before it is all
    there once the owner has remounted, and the same put then succeeds."""
    rp = RestartPool(request)
    with kvpool.Client(rp.addr) as c:
        first = blobs("l1-", 16, 64 * KiB)
        put_all(c, first)
        second = blobs("l2-", 16, 64 * KiB)
        c0 = calls(c)
        freeze(rp.master.pid)
        out = {}

        def run():
            try:
                out["r"] = c.batch_put(list(second), list(second.values()))
            except kvpool.Error as e:
                out["e"] = e

        t = threading.Thread(target=run)
        t.start()
        time.sleep(0.3)
        assert t.is_alive(), out  # waiting for the commit's answer
        assert delta(calls(c), c0).get("put_start", 0) == 0  # bytes in holds, no PutStart
        rp.restart()
        t.join(30)
        assert not t.is_alive()
        rs = out["r"] if "r" in out else [out["e"].status] * 16
        print(f"\nthe put whose commit was lost: {out}")
        # each key: the lost connection reported, or OK (the new master was up in time for
        # the commit's second try: its holds gone there, the key put again)
        lost = (kvpool.ERR_CONNECT, kvpool.ERR_IO, kvpool.ERR_TRANSPORT, kvpool.ERR_TIMEOUT)
        assert set(rs) <= {0, *lost}, out
        for k, v in first.items():  # acknowledged: back with the owner's record
            assert get_retrying(c, k) == v, k
        assert c.batch_exists(list(second)) == [r == 0 for r in rs]
        read_back(c, {k: v for (k, v), r in zip(second.items(), rs) if r == 0})
        put_all(c, second, upsert=True)
        read_back(c, {**first, **second})


_SLEEPER = r"""
import sys
import kvpool
addr = sys.argv[1]
def val(k):
    return (k.encode() * (65536 // len(k) + 1))[:65536]
c = kvpool.Client(addr)
ks = [f"A1-{i}" for i in range(32)]
assert c.batch_put(ks, [val(k) for k in ks]) == [0] * 32
print("ready", flush=True)
sys.stdin.readline()
ks = [f"A2-{i}" for i in range(32)]
try:
    r = c.batch_put(ks, [val(k) for k in ks])
except kvpool.Error as e:
    r = [e.status]
print(" ".join(map(str, r)), flush=True)
sys.stdin.readline()
"""


def test_holds_of_a_dead_master_never_land_on_new_objects(request):
    """Client A (a child process) holds room for 32 objects, then stalls (SIGSTOP) while the
    master is killed and started again on its port; the owner remounts, client B stores
    200 objects. A wakes and puts 32 objects of the held size: whatever A's put returns,
    every one of B's acknowledged objects reads back byte-exact (A's bytes must not go to
    the dead master's room, which the new master gave to B)."""
    rp = RestartPool(request, size="128MiB")  # room held ahead: 1/64 of it, 2 MiB
    child = _start_child(_SLEEPER, rp.addr)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert rp.m("kvpool_put_holds") == 32
        freeze(child.pid)
        rp.restart()
        with kvpool.Client(rp.addr) as b:
            def adopted():
                try:
                    return b.batch_exists(["A1-0"]) == [True]
                except kvpool.Error:
                    return False

            poll(adopted, "the owner's record adopted")
            mine = blobs("B-", 200, 64 * KiB)
            keys = list(mine)
            for s in range(0, 200, 50):
                put_all(b, {k: mine[k] for k in keys[s:s + 50]})
            read_back(b, mine)
            child.stdin.write("go\n")
            child.stdin.flush()
            os.kill(child.pid, signal.SIGCONT)
            line = child.stdout.readline().strip()
            print(f"\nA's put after the restart: {line}")
            bad = []
            for k in keys:
                try:
                    if b.get(k) != mine[k]:
                        bad.append((k, "other bytes"))
                except kvpool.Error as e:
                    bad.append((k, str(e)))
            assert not bad, (f"{len(bad)} of B's 200 acknowledged objects no longer read back "
                             f"(A wrote into the dead master's holds): {bad[:3]}")
            if line == " ".join(["0"] * 32):
                read_back(b, {f"A2-{i}": _child_val(f"A2-{i}") for i in range(32)})
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGCONT)
        _reap(child)


# ---- 7. quotas ----

def _tenant_master(certs, tmp_path, tenants):
    from test_tenants import PRINCIPALS, TenantMaster
    m = TenantMaster(certs, str(tmp_path), PRINCIPALS, tenants)
    try:
        m.add_segment("64MiB")
    except BaseException:
        m.close()
        raise
    return m


@pytest.fixture
def tenant_master(certs, tmp_path, monkeypatch, request):
    """tenant_master(tenants) -> test_tenants.TenantMaster (its own certificates and ACL,
    whatever the pass): no credential comes from the environment."""
    for var in _CRED_ENV:
        monkeypatch.delenv(var, raising=False)
    made = []

    def make(tenants):
        d = tmp_path / f"m{len(made)}"
        d.mkdir()
        m = _tenant_master(certs, d, tenants)
        made.append(m)
        return m

    yield make
    bad = []
    for m in made:
        bad += m.close()
    assert not bad, f"children exited non-zero: {bad}"


def test_quota_counts_stored_and_held_bytes(tenant_master):
    """team-a has max-dram 4 MiB; alice puts batches of 8 x 64 KiB until ERR_QUOTA: after
    every batch the tenant's bytes (kvpool_tenant_bytes) are what it stored, and what it
    stored plus what it holds is never over 4 MiB (the quota counts both), held at most
    512 KiB (quota/8); refused once 64 objects (4 MiB) are stored."""
    quota = 4 * MiB
    m = tenant_master({"team-a": {"max-dram": "4MiB"}})
    stored = {}
    refused = None
    with m.client("alice") as alice:
        for b in range(20):
            batch = blobs(f"q{b}-", 8, 64 * KiB)
            rs = alice.batch_put(list(batch), list(batch.values()))
            stored.update((k, v) for (k, v), r in zip(batch.items(), rs) if r == 0)
            assert set(rs) <= {0, ERR_QUOTA}, rs
            text = m.metrics()
            charged = m.tm("kvpool_tenant_bytes", "team-a", "dram", text)
            held = metric(text, "kvpool_put_held_bytes")
            s = len(stored) * 64 * KiB
            print(f"batch {b}: {rs.count(0)} stored, stored {s >> 10} KiB held {held / KiB} KiB"
                  f" charged {charged / KiB} KiB")
            assert charged == s, (b, charged, s, held)
            assert s + held <= quota and held <= quota / 8, (b, s, held)
            if ERR_QUOTA in rs:
                refused = b
                break
        assert refused is not None, "the quota never refused a put"
        # the quota ends full of objects, not of room held for them: 4 MiB takes 64 objects
        # of 64 KiB; what was refused is absent, what was stored reads back
        assert len(stored) == quota // (64 * KiB), len(stored)
        read_back(alice, stored)
        assert sorted(e["key"] for e in alice.list_keys()) == sorted(stored)
        assert m.tm("kvpool_tenant_puts_refused_total", "team-a") >= 1


def test_holds_take_no_place_in_max_objects(tenant_master):
    """team-a has max-objects 40 and no byte quota: alice stores 4 batches of 8 x 4 KiB (her
    client holds room for 8 more), then another client of hers stores 8 objects: 40 objects
    stored, all OK, the 41st refused with ERR_QUOTA; the tenant's object gauge says what is
    stored after each batch (holds never count as objects)."""
    m = tenant_master({"team-a": {"max-objects": 40}})
    stored, gauges = {}, []
    with m.client("alice") as alice, m.client("alice") as alice2:
        for b in range(4):
            batch = blobs(f"n{b}-", 8, 4 * KiB)
            rs = alice.batch_put(list(batch), list(batch.values()))
            stored.update((k, v) for (k, v), r in zip(batch.items(), rs) if r == 0)
            assert rs == [0] * 8, (b, rs)
            text = m.metrics()
            gauges.append((len(stored), m.tm("kvpool_tenant_objects", "team-a", text=text),
                           metric(text, "kvpool_put_holds")))
        other = blobs("n-other-", 8, 4 * KiB)
        rs = alice2.batch_put(list(other), list(other.values()))
        assert rs == [0] * 8, (f"{rs.count(ERR_QUOTA)} of 8 refused with 32 of 40 objects "
                               f"stored, {metric(m.metrics(), 'kvpool_put_holds')} holds")
        stored.update(other)
        for c in (alice, alice2):
            with pytest.raises(kvpool.Error) as ei:
                c.put("n-41st", b"x" * 4 * KiB)
            assert ei.value.status == ERR_QUOTA, ei.value
        read_back(alice, stored)
        # (stored, the tenant's object gauge, holds) after each of alice's batches
        assert all(s == g for s, g, _ in gauges), gauges
        assert m.tm("kvpool_tenant_objects", "team-a") == 40


# ---- 9. segments that go while room on them is held ----

def fill(client, prefix, size):
    """Put `size` objects into client's pool until a put is refused; {key: bytes} of those
    acknowledged."""
    stored = {}
    for b in range(4096):
        kv = blobs(f"{prefix}{b}-", 64, size)
        sts = client.batch_put(list(kv), list(kv.values()))
        stored.update({k: v for (k, v), s in zip(kv.items(), sts) if s == 0})
        if any(s != 0 for s in sts):
            return stored
    raise AssertionError("the pool never filled")


def intact(client, kv):
    """Every key of kv reads back byte-exact: [(key, why)] of those that do not."""
    bad = []
    for k, v in kv.items():
        try:
            if client.get(k) != v:
                bad.append((k, "other bytes"))
        except kvpool.Error as e:
            bad.append((k, str(e)))
    return bad


def test_a_drain_gives_back_only_the_held_room_on_its_segment(make_pool):
    """A client holds room for two-replica puts on three segments; one owner shuts down
    (SIGTERM: its segment drains, so the master gives back the room held there). Its holds'
    extents on the other segments stay the client's: another client then fills the pool,
    the first one puts a held batch of the same shape, and every object the other client
    was told was stored reads back byte-exact (the master had given those extents away,
    and the held batch overwrote acknowledged objects)."""
    p = HPool(make_pool, segments=("16MiB", "16MiB", "16MiB"), flags=("--no-eviction",))
    with kvpool.Client(p.addr, transport="tcp") as w, \
            kvpool.Client(p.addr, transport="tcp") as x:
        first = blobs("dw1-", 8, 16 * KiB)
        put_all(w, first, replicas=2)
        assert p.m("kvpool_put_holds") == 8
        assert p.pool.segments.pop(0).stop() == 0  # drains, then exits
        poll(lambda: p.m("kvpool_segments", tier="dram") == 2, "the drained segment unmounted")
        stored = fill(x, "dx-", 16 * KiB)
        assert len(stored) > 1000
        w.exists("dw1-0")  # heard from lately: the batch goes into held room (HOLD_FRESH_MS)
        second = {f"dw2-{i}": bytes([0x21]) * (16 * KiB) for i in range(8)}
        w.batch_put(list(second), list(second.values()), replicas=2)  # room or not
        assert intact(x, stored) == []
        assert intact(w, first) == []  # each had its other replica elsewhere


def test_a_held_key_failed_for_io_does_not_keep_its_hold(make_pool):
    """replicas=2 on owners A and B; B stops answering (SIGSTOP) under a held put and A is
    killed (-9) while the write to B waits: the commit finds no written replica left and
    answers IO, the master having taken the key's hold and freed its room. The client must
    not keep that hold: a later batch written into it lands on the room the master gave
    to the object put next (here the first client's own), which then reads back wrong."""
    p = HPool(make_pool, segments=("16MiB", "16MiB"), flags=("--no-eviction",))
    with kvpool.Client(p.addr, transport="tcp", rpc_timeout_ms=1500) as w:
        put_all(w, {"iw1-0": b"\x57" * (16 * KiB)}, replicas=2)
        a, b = p.pool.segments
        freeze(b.pid)
        out = {}

        def run():  # (each put after a call: held room is used on a connection heard from
            w.exists("iw1-0")  # within the last 200 ms, object.c's HOLD_FRESH_MS)
            out["r"] = w.batch_put(["iw2-0"], [b"\x22" * (16 * KiB)], replicas=2)

        t = threading.Thread(target=run)
        t.start()
        try:
            time.sleep(0.3)  # A has its bytes; B's write waits
            a.kill()
            p.pool.segments.remove(a)  # (reaped: its -9 is ours)
            t.join(30)
        finally:
            os.kill(b.pid, signal.SIGCONT)
        assert out.get("r") == [kvpool.ERR_IO], out
        with kvpool.Client(p.addr, transport="tcp") as x:
            stored = fill(x, "ix-", 16 * KiB)
            third = {"iw3-0": b"\x33" * (16 * KiB)}
            w.exists("iw1-0")
            assert w.batch_put(list(third), list(third.values()), replicas=2) == [0]
            w.exists("iw1-0")
            w.batch_put(["iw4-0"], [b"\x44" * (16 * KiB)], replicas=2)  # room or not
            assert intact(x, stored) == []
            assert intact(x, third) == []


# ---- 10. a commit whose answer the connection lost ----

class AnswerCutter:
    """A plain-TCP relay between a client and the master that, when armed, passes one
    request of `method` to the master and then drops the master's answer and the
    connection (after `hold_s`, time for the master to carry it out): the client sees its
    connection break under a call the master made."""

    HDR = struct.Struct("<IHHQIiQ")  # magic, version, method, id, body length, status, epoch

    def __init__(self, master_addr):
        host, port = master_addr.rsplit(":", 1)
        self.master = (host, int(port))
        self.ls = socket.create_server(("127.0.0.1", 0))
        self.addr = f"127.0.0.1:{self.ls.getsockname()[1]}"
        self.armed, self.cut = None, 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                cs, _ = self.ls.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(cs,), daemon=True).start()

    @staticmethod
    def _exact(s, n):
        b = b""
        while len(b) < n:
            x = s.recv(n - len(b))
            if not x:
                return None
            b += x
        return b

    def _serve(self, cs, hold_s=0.3):
        ms = socket.create_connection(self.master)
        mute = threading.Event()

        def back():
            try:
                while (x := ms.recv(65536)):
                    if not mute.is_set():
                        cs.sendall(x)
            except OSError:
                pass

        threading.Thread(target=back, daemon=True).start()
        try:
            while (h := self._exact(cs, self.HDR.size)) is not None:
                method, n = self.HDR.unpack(h)[2], self.HDR.unpack(h)[4]
                body = self._exact(cs, n) if n else b""
                cut = method == self.armed
                if cut:
                    mute.set()
                    self.armed = None
                ms.sendall(h + (body or b""))
                if cut:
                    time.sleep(hold_s)
                    self.cut += 1
                    break
        except OSError:
            pass
        for s in (cs, ms):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self):
        self.ls.close()


@pytest.mark.parametrize("case", ["first_batch", "held_batch", "put_end"])
def test_a_commit_whose_answer_was_lost_reports_what_it_stored(make_pool, monkeypatch, case):
    """The master carries out a put's last call (PUT_COMMIT: a batch's first, not held, or
    a held one; PutEnd with KVPOOL_PUT_AHEAD=off) and the connection breaks before its
    answer arrives; the client sends the call again on a new connection, where the keys are
    no longer held or PENDING. It must not report them failed (PUT_REVOKED: "nothing is
    stored"), nor EXISTS from putting them again: the master has them with this put's size
    and CRC, so every key is OK, and reads back byte-exact."""
    if TLS_DIR:
        pytest.skip("the relay reads plain frames (the TLS pass: the same code, no relay)")
    if case == "put_end":
        monkeypatch.setenv("KVPOOL_PUT_AHEAD", "off")
    p = HPool(make_pool)
    relay = AnswerCutter(p.addr)
    try:
        with kvpool.Client(relay.addr, transport="tcp") as c, \
                kvpool.Client(p.addr, transport="tcp") as obs:
            if case == "held_batch":
                put_all(c, blobs("lc0-", 8, 4 * KiB))  # holds for the next batch
                c.exists("lc0-0")  # heard from lately: the batch goes into held room
            kv = blobs(f"lc-{case}-", 8, 4 * KiB)
            c0 = calls(c)
            relay.armed = 5 if case == "put_end" else M_PUT_COMMIT
            assert c.batch_put(list(kv), list(kv.values())) == [0] * 8
            assert relay.cut == 1
            d = delta(calls(c), c0)
            # the call (counted once, sent twice), then one look at what the master has
            assert d.get("put_end" if case == "put_end" else "put_commit", 0) == 1, d
            assert d.get("get_replica_list", 0) == 1, d
            if case == "held_batch":
                assert d.get("put_start", 0) == 0, d  # found stored, not put again
            read_back(obs, kv)
    finally:
        relay.close()


# ---- 11. a put's end names its put ----

def test_an_end_ends_only_its_own_put_of_a_key(make_pool, monkeypatch):
    """One client (one master connection for all its threads): a put session of key K on
    owner A, whose range is written; A is killed (-9), so the master drops that put and K
    is free; another thread of the same client puts K (two calls), its write held up by
    the frozen owner B. The session's end then must not end the other thread's put of K
    (the master once ended any PENDING put of the key by this connection: K visible with
    the session's CRC over bytes never written, the other put reported revoked): the
    session's end gets PUT_REVOKED, the other put returns OK, and K reads back its bytes."""
    monkeypatch.setenv("KVPOOL_PUT_AHEAD", "off")
    p = HPool(make_pool, segments=("16MiB",))
    size = 64 * KiB
    mine, theirs = b"\x52" * size, os.urandom(size)
    with kvpool.Client(p.addr, transport="tcp", rpc_timeout_ms=5000) as c:
        assert c.put_session_start(["k"], [size]) == [0]  # on A, the only owner
        assert c.put_session_ranges(["k"], [[bytearray(mine)]], [[0]]) == [size]
        a = p.pool.segments[0]
        b = p.pool.add_segment("16MiB")
        poll(lambda: p.m("kvpool_segments", tier="dram") == 2, "B mounted")
        a.kill()
        p.pool.segments.remove(a)  # (reaped: its -9 is ours)
        poll(lambda: p.m("kvpool_segments", tier="dram") == 1, "A dropped")
        freeze(b.pid)
        out = {}

        def other():
            out["r"] = c.batch_put(["k"], [theirs])

        t = threading.Thread(target=other)
        t.start()
        try:
            poll(lambda: p.m("kvpool_pending_objects") == 1, "the other put started")
            assert c.put_session_end(["k"]) == [kvpool.ERR_PUT_REVOKED]
        finally:
            os.kill(b.pid, signal.SIGCONT)
        t.join(30)
        assert out.get("r") == [0], out
        assert c.get("k") == theirs


# ---- 8. hostile: another connection's holds ----

def _pb_bytes(field, b):
    return varint(field << 3 | 2) + varint(len(b)) + b


def _pb_varint(field, v):
    return varint(field << 3) + varint(v)


def _pb_packed(field, fmt, vals):
    body = b"".join(struct.pack(fmt, v) for v in vals) if fmt else b"".join(map(varint, vals))
    return _pb_bytes(field, body)


def commit_body(keys, holds, sizes, release=(), hold_count=0, hold_size=0):
    """A PutCommitRequest (proto/kvpool.proto), encoded by hand."""
    out = b"".join(_pb_bytes(1, k) for k in keys)
    if keys:
        out += _pb_packed(2, "<Q", holds) + _pb_packed(3, "<I", [0] * len(keys))
        out += _pb_packed(5, None, sizes)
    out += _pb_bytes(6, _pb_varint(1, 1))  # config: replica_num 1
    if hold_count:
        out += _pb_bytes(8, _pb_varint(1, hold_count) + _pb_varint(2, hold_size) +
                         _pb_bytes(3, _pb_varint(1, 1)))
    if release:
        out += _pb_packed(9, "<Q", release)
    return out


def _read_varint(b, i):
    v = shift = 0
    while True:
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return v, i


def commit_answer(body):
    """(status, [per-key status], holds handed out) of a PutCommitResponse."""
    status, statuses, holds, i = 0, [], 0, 0
    while i < len(body):
        tag, i = _read_varint(body, i)
        field, wt = tag >> 3, tag & 7
        if wt == 0:
            v, i = _read_varint(body, i)
            if field == 1:
                status = v - (1 << 64) if v >> 63 else v
            elif field == 2:
                statuses.append((v >> 1) ^ -(v & 1))
        elif wt == 2:
            n, i = _read_varint(body, i)
            chunk, i = body[i:i + n], i + n
            if field == 2:
                j = 0
                while j < len(chunk):
                    v, j = _read_varint(chunk, j)
                    statuses.append((v >> 1) ^ -(v & 1))
            elif field == 3:
                holds += 1
        elif wt == 1:
            i += 8
        elif wt == 5:
            i += 4
        else:
            raise AssertionError(f"wire type {wt} in a PutCommitResponse")
    return status, statuses, holds


def raw_conn(addr):
    """A connection to the master as a client of this pass: TLS with the admin's certificate
    in the TLS pass, plain TCP otherwise."""
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    if TLS_DIR:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(os.path.join(TLS_DIR, "ca.crt"))
        ctx.load_cert_chain(os.environ.get("KVPOOL_TLS_CERT", os.path.join(TLS_DIR, "admin.crt")),
                            os.environ.get("KVPOOL_TLS_KEY", os.path.join(TLS_DIR, "admin.key")))
        s = ctx.wrap_socket(s, server_hostname=host)
    return s


def raw_commit(s, body, req_id):
    s.sendall(frame(M_PUT_COMMIT, body, req_id=req_id))
    r = read_frame(s)
    assert r is not None, "the master closed the connection"
    method, st, payload = r
    assert method & 0x7FFF == M_PUT_COMMIT, r
    return st, payload


def test_another_connections_holds_cannot_be_committed(make_pool):
    """A victim client holds room for 8 objects. Another connection's PUT_COMMIT naming hold
    ids 1..64 (the victim's among them) gets NOT_FOUND for every key and commits nothing;
    giving those ids back frees none of them; keys shaped like a hold's internal name are
    refused. The victim's next batch still goes on its 8 holds, in one call."""
    p = HPool(make_pool)
    with kvpool.Client(p.addr) as victim:
        first = blobs("v1-", 8, 4 * KiB)
        put_all(victim, first)
        assert p.m("kvpool_put_holds") == 8
        gone0 = p.m("kvpool_put_holds_gone_total")
        with raw_conn(p.addr) as s:
            ids = list(range(1, 65))
            keys = [f"evil{i}".encode() for i in ids]
            st, body = raw_commit(s, commit_body(keys, ids, [4 * KiB] * 64), 1)
            assert st == 0, (st, body)
            status, statuses, _ = commit_answer(body)
            assert status == 0 and statuses == [kvpool.ERR_NOT_FOUND] * 64, (status, statuses)
            assert p.m("kvpool_put_holds_gone_total") == gone0 + 64
            # given back by someone else: not theirs to give
            st, body = raw_commit(s, commit_body([], [], [], release=ids), 2)
            assert st == 0 and commit_answer(body)[0] == 0, (st, body)
            assert p.m("kvpool_put_holds") == 8
            # a key spelled as a hold's internal key (NUL, connection id, hold id): refused
            forged = [b"\0" + struct.pack("<QQ", conn, hid) for conn in range(1, 9)
                      for hid in range(1, 9)]
            st, body = raw_commit(s, commit_body(forged, [0] * 64, [4 * KiB] * 64), 3)
            assert st == 0, (st, body)
            assert commit_answer(body)[:2] == (0, [kvpool.ERR_BAD_KEY] * 64), commit_answer(body)
            assert p.m("kvpool_put_holds") == 8
        assert victim.batch_exists([k.decode() for k in keys]) == [False] * 64
        c0 = calls(victim)
        second = blobs("v2-", 8, 4 * KiB)
        put_all(victim, second)
        d = delta(calls(victim), c0)
        assert d.get("put_start", 0) == 0 and d.get("put_commit", 0) == 1, d
        read_back(victim, {**first, **second})
        text = p.metrics()
        assert p.m("kvpool_keys", text) == 16
        assert p.m("kvpool_put_holds_used_total", text) == 8


def test_versions_of_another_count_are_refused(make_pool):
    """PutEnd, PutRevoke and PUT_COMMIT name a version per key or none (their `versions`):
    another count is refused (INVALID_ARG for the whole request, with no message: a
    StatusesResponse carries none), and the master goes on answering."""
    p = HPool(make_pool)
    s = raw_conn(p.addr)
    keys = [b"vc-0", b"vc-1"]
    bodies = {
        5: b"".join(_pb_bytes(1, k) for k in keys) + _pb_packed(2, "<I", [0, 0]) +
        _pb_packed(4, "<Q", [7]),  # PutEnd: 2 keys, 1 version
        6: b"".join(_pb_bytes(1, k) for k in keys) + _pb_packed(3, "<Q", [7, 8, 9]),  # PutRevoke
        M_PUT_COMMIT: commit_body(keys, [0, 0], [4096, 4096]) + _pb_packed(10, "<Q", [7]),
    }
    try:
        for n, (method, body) in enumerate(bodies.items()):
            s.sendall(frame(method, body, req_id=n + 1))
            r = read_frame(s)
            assert r is not None, f"method {method}: the master closed the connection"
            got, st, payload = r
            assert got & 0x7FFF == method, r
            status = st if st != 0 else commit_answer(payload)[0]
            assert status == kvpool.ERR_INVALID_ARG, (method, st, payload)
    finally:
        s.close()
    with kvpool.Client(p.addr) as c:  # still answering
        put_all(c, blobs("vc-after-", 2, 4 * KiB))
