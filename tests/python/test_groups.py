"""Object groups (Mooncake's ReplicateConfig.group_ids) against a real master and segment:
a read of one member keeps the group from eviction while its lease holds, an eviction of
one member takes the others, an upsert may not move a group (-600), group_ids of another
length than the keys are refused (-600), removal cleans the membership up."""
import os
import subprocess
import sys

import pytest

import kvpool
from mooncake.store import MooncakeDistributedStore, ReplicateConfig

MiB = 1 << 20


def _val(tag, n=MiB):
    b = tag.encode()
    return (b * (n // len(b) + 1))[:n]


def _store(pool):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "auto", "", pool.addr) == 0
    return s


def _cfg(groups):
    c = ReplicateConfig()
    c.group_ids = groups
    return c


def _fill(c, prefix, n):
    """n MiB of ungrouped objects: the pool (16 MiB) evicts to make room."""
    for i in range(n):
        c.put(f"{prefix}fill{i}", _val(f"f{i}"))


def _fill_until_eviction(c, prefix):
    """1 MiB puts until the master evicts (its object count stops growing with them)."""
    objects = c.stat()["objects"]
    i = 0
    while c.stat()["objects"] == objects + i:
        c.put(f"{prefix}fill{i}", _val(f"f{i}"))
        i += 1
        assert i < 32, "no eviction"


@pytest.fixture
def gpool(make_pool):
    # leases on (30 s: longer than the test), one 16 MiB segment
    return make_pool(segments=("16MiB",), master_args=("--lease-ttl", "30"))


def test_read_of_one_member_keeps_the_group(gpool, prefix):
    with kvpool.Client(gpool.addr) as c:
        c.put(prefix + "h1", _val("h1"), group_ids=["h"])  # group h: never read
        c.put(prefix + "h2", _val("h2"), group_ids=["h"])
        c.put(prefix + "g1", _val("g1"), group_ids=["g"])
        c.put(prefix + "g2", _val("g2"), group_ids=["g"])
        c.put(prefix + "u1", _val("u1"))                   # ungrouped, read once
        c.put(prefix + "u2", _val("u2"))                   # ungrouped, never read
        assert c.get(prefix + "g1") == _val("g1")          # leases g2 (until its TTL)
        assert c.get(prefix + "u1") == _val("u1")          # its lease ends with the read
        _fill(c, prefix, 40)                               # 40 MiB through 16 MiB
        # g2 was never read, yet it and g1 stay: bytes intact
        assert c.get(prefix + "g2") == _val("g2")
        assert c.get(prefix + "g1") == _val("g1")
        for k in ("h1", "h2", "u1", "u2"):                 # the others went
            assert not c.exists(prefix + k), k


def test_eviction_takes_the_group(gpool, prefix):
    with kvpool.Client(gpool.addr) as c:
        c.put(prefix + "a1", _val("a1"), group_ids=["a"])  # the oldest: the first victim
        c.put(prefix + "x", _val("x"))                     # ungrouped, older than a2
        c.put(prefix + "a2", _val("a2"), group_ids=["a"])
        # puts until the first eviction: a1 goes and a2 with it, x (older) stays
        _fill_until_eviction(c, prefix)
        assert c.exists(prefix + "x")
        assert c.get(prefix + "x") == _val("x")
        assert not c.exists(prefix + "a2")
        assert not c.exists(prefix + "a1")


def test_ungrouped_control(gpool, prefix):
    """The same without groups: a2 outlives x (the test above fails without groups)."""
    with kvpool.Client(gpool.addr) as c:
        c.put(prefix + "a1", _val("a1"))
        c.put(prefix + "x", _val("x"))
        c.put(prefix + "a2", _val("a2"))
        _fill_until_eviction(c, prefix)
        assert not c.exists(prefix + "a1")
        assert c.get(prefix + "a2") == _val("a2")


def test_upsert_may_not_move_a_group(pool, prefix):
    s = _store(pool)
    try:
        k = prefix + "k"
        assert s.put(k, b"v1", _cfg(["g"])) == 0
        assert s.upsert(k, b"v2", _cfg(["other"])) == -600   # moved: refused
        assert s.upsert(k, b"v2", _cfg([""])) == -600        # cleared: refused
        assert s.get(k) == b"v1"                               # untouched
        assert s.upsert(k, b"v3", _cfg(["g"])) == 0           # kept
        assert s.get(k) == b"v3"
        assert s.upsert(k, b"v4-longer", None) == 0           # none named: kept
        assert s.get(k) == b"v4-longer"
        assert s.upsert(k, b"v5", _cfg(["other"])) == -600    # still in g
        # batch upsert: each key's answer its own
        k2 = prefix + "k2"
        assert s.put(k2, b"w", _cfg(["h"])) == 0
        assert s.upsert_batch([k, k2], [b"a", b"b"], _cfg(["g", "x"])) == -600
        assert s.get(k) == b"a" and s.get(k2) == b"w"
        # an ungrouped object may not join a group by upsert either
        k3 = prefix + "k3"
        assert s.put(k3, b"u") == 0
        assert s.upsert(k3, b"u2", _cfg(["g"])) == -600
        assert s.upsert(k3, b"u2", _cfg([""])) == 0
        # the native module: kvpool.Error with INVALID_ARG
        with kvpool.Client(pool.addr) as c:
            with pytest.raises(kvpool.Error) as e:
                c.put(k, b"z", upsert=True, group_ids=["other"])
            assert e.value.status == kvpool.ERR_INVALID_ARG
    finally:
        s.close()


def test_group_ids_length_mismatch(pool, prefix):
    s = _store(pool)
    try:
        keys = [prefix + k for k in ("a", "b", "c")]
        assert s.put_batch(keys, [b"1", b"2", b"3"], _cfg(["g", "g"])) == -600
        assert s.batch_is_exist(keys) == [0, 0, 0]
        assert s.put(keys[0], b"1", _cfg(["g", "h"])) == -600
        assert s.put(keys[0], b"1", _cfg([])) == -600
        assert s.is_exist(keys[0]) == 0
        assert s.put_batch(keys, [b"1", b"2", b"3"], _cfg(["g", "", "h"])) == 0
        assert s.get(keys[1]) == b"2"
        assert s.put(prefix + "long", b"1", _cfg(["g" * 1025])) == -600
        assert s.put(prefix + "long", b"1", _cfg(["g" * 1024])) == 0
        with kvpool.Client(pool.addr) as c:
            r = c.raw.batch_put([prefix + "n1", prefix + "n2"], [b"1", b"2"],
                                  (1, None, 0, 0, 0, None, None, ("g",)))
            assert r == [kvpool.ERR_INVALID_ARG] * 2
    finally:
        s.close()


def test_removal_cleans_membership(gpool, prefix):
    with kvpool.Client(gpool.addr) as c:
        c.put(prefix + "r1", _val("r1"), group_ids=["r"])
        c.remove(prefix + "r1")
        # a new object in the same group behaves: a read of r2 protects r3
        c.put(prefix + "r2", _val("r2"), group_ids=["r"])
        c.put(prefix + "r3", _val("r3"), group_ids=["r"])
        c.put(prefix + "n", _val("n"))
        assert c.get(prefix + "r2") == _val("r2")
        _fill(c, prefix, 40)
        assert c.get(prefix + "r3") == _val("r3")
        assert not c.exists(prefix + "r1")
        assert not c.exists(prefix + "n")



def test_tensor_writes_take_groups(pool, prefix):
    torch = pytest.importorskip("torch")
    s = _store(pool)
    try:
        t = torch.arange(64, dtype=torch.float32).reshape(8, 8)
        keys = [prefix + "b0", prefix + "b1"]
        # batch: one group id per key; another count: -600 for every key, nothing stored
        assert s.batch_pub_tensor(keys, [t, t], _cfg(["g"])) == [-600, -600]
        assert s.batch_is_exist(keys) == [0, 0]
        assert s.batch_pub_tensor(keys, [t, t], _cfg(["g", "h"])) == [0, 0]
        assert s.upsert(keys[0], b"x", _cfg(["h"])) == -600  # b0 is in g
        assert s.upsert(keys[1], b"x", _cfg(["g"])) == -600  # b1 is in h
        assert torch.equal(s.get_tensor(keys[0]), t)
        # TP shards: each base key's shards in its group
        assert s.batch_pub_tensor_with_tp([prefix + "p0", prefix + "p1"], [t, t],
                                          _cfg(["g", "h"]), tp_size=2, split_dim=0) == [0, 0]
        for r in (0, 1):
            assert s.upsert(f"{prefix}p0_tp_{r}", b"x", _cfg(["h"])) == -600
            assert s.upsert(f"{prefix}p1_tp_{r}", b"x", _cfg(["g"])) == -600
        assert s.upsert(f"{prefix}p1_tp_1", b"y", _cfg(["h"])) == 0
        # one key's shards, one group id
        assert s.pub_tensor_with_tp(prefix + "one", t, _cfg(["q"]), tp_size=2, split_dim=1) == 0
        assert s.upsert(prefix + "one_tp_1", b"x", _cfg(["g"])) == -600
        # the parallelism batch: per key
        assert s.batch_put_tensor_with_parallelism([prefix + "m0", prefix + "m1"], [t, t],
                                                   config=_cfg(["g"])) == [-600, -600]
        assert s.batch_put_tensor_with_parallelism([prefix + "m0", prefix + "m1"], [t, t],
                                                   config=_cfg(["g", "h"])) == [0, 0]
        assert s.upsert(prefix + "m1", b"x", _cfg(["g"])) == -600
    finally:
        s.close()


# ---- tenants: a group is its tenant's (tests/python/test_tenants.py's ACL and principals) ----

from conftest import metric  # noqa: E402
from test_security import certs, close_all  # noqa: E402,F401 (fixtures)
from test_tenants import TenantMaster, PRINCIPALS  # noqa: E402


class _LeasedTenantMaster(TenantMaster):
    extra_args = ("--lease-ttl", "30")


def test_tenant_groups_are_apart(certs, tmp_path, monkeypatch):  # noqa: F811
    # every credential named here: none from the suite's TLS pass ($KVPOOL_TLS_*)
    for var in ("KVPOOL_TLS_CA", "KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY", "KVPOOL_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    m = _LeasedTenantMaster(certs, str(tmp_path), PRINCIPALS, {})
    try:
        m.add_segment("16MiB")
        with m.client("alice") as alice, m.client("bob") as bob:
            bob.put("b1", _val("b1"), group_ids=["g"])    # bob's "g"
            bob.put("b2", _val("b2"), group_ids=["g"])
            alice.put("a1", _val("a1"), group_ids=["g"])  # alice's "g": another group
            alice.put("a2", _val("a2"), group_ids=["g"])
            # the same key and group name in two tenants: each upsert sees its own object
            alice.put("k", b"a", group_ids=["g"])
            bob.put("k", b"b", group_ids=["h"])
            alice.put("k", b"a2", upsert=True, group_ids=["g"])
            with pytest.raises(kvpool.Error) as e:
                bob.put("k", b"b2", upsert=True, group_ids=["g"])
            assert e.value.status == kvpool.ERR_INVALID_ARG
            # alice reads a1: her a2 is leased, bob's b1/b2 (also "g") are not
            assert alice.get("a1") == _val("a1")
            for i in range(40):                            # bob's puts evict
                bob.put(f"fill{i}", _val(f"f{i}"))
            assert not bob.exists("b1") and not bob.exists("b2")
            assert alice.get("a2") == _val("a2")
            assert alice.get("a1") == _val("a1")
            # alice's k is in her "g" (leased with it); bob's, in his unleased "h", went
            assert alice.get("k") == b"a2" and not bob.exists("k")
            text = m.metrics()
            assert metric(text, "kvpool_group_refused_total") == 1  # bob's upsert
            assert metric(text, "kvpool_group_evicted_total") >= 1  # b2 with b1
            assert metric(text, "kvpool_groups") == 1               # alice's g
            assert metric(text, "kvpool_group_members") == 3        # a1, a2, k
    finally:
        close_all([m])


# ---- a master restart: the owners' records carry the group (ha/rebuild.c) ----

def test_group_survives_a_master_restart():
    import time

    from conftest import Proc, _bin, free_port, master_security_args
    port = free_port()
    argv = [_bin("KVPOOL_MASTER_BIN"), "--listen", f"127.0.0.1:{port}", "--ready-fd", "{fd}",
            "--log-level", "error", *master_security_args(), "--lease-ttl", "30"]
    master = Proc(argv)
    seg = Proc([_bin("KVPOOL_CLI_BIN"), "--master", master.ready, "serve", "--segment-size",
                "16MiB", "--ready-fd", "{fd}"])
    try:
        with kvpool.Client(master.ready) as c:
            c.put("g1", _val("g1"), group_ids=["g"])
            c.put("g2", _val("g2"), group_ids=["g"])
            c.put("u", _val("u"))
            master.kill()
            master = Proc(argv)
            deadline = time.monotonic() + 30
            while True:  # the owner remounts and offers its record back
                try:
                    if c.exists("u"):
                        break
                except kvpool.Error:
                    pass
                assert time.monotonic() < deadline, "the objects did not come back"
                time.sleep(0.1)
            assert c.get("g1") == _val("g1")  # and leases g2 (30 s)
            with pytest.raises(kvpool.Error) as e:  # still in g
                c.put("g2", b"x", upsert=True, group_ids=["h"])
            assert e.value.status == kvpool.ERR_INVALID_ARG
            with pytest.raises(kvpool.Error) as e:
                c.put("u", b"x", upsert=True, group_ids=["g"])  # still ungrouped
            assert e.value.status == kvpool.ERR_INVALID_ARG
            for i in range(40):  # pressure: g2, leased with g1, stays
                c.put(f"fill{i}", _val(f"f{i}"))
            assert c.get("g2") == _val("g2")
            assert not c.exists("u")
    finally:
        seg.stop()
        master.stop()


# ---- a big group's revoke does not hold the master's loop ----

from test_admission import Master  # noqa: E402
from test_security import poll  # noqa: E402

# alice's reader, in a process of its own (no GIL shared with bob's calls): gets her key
# until the file `stop` exists, checks every byte, prints her slowest call and the count
_READER = r"""
import os, sys, time
import kvpool
addr, key, size, stop, ready = sys.argv[1:6]
want = bytes(range(256)) * (int(size) // 256)
worst, n = 0.0, 0
with kvpool.Client(addr) as c:
    assert c.get(key) == want
    open(ready, "w").close()
    while not os.path.exists(stop):
        t = time.perf_counter()
        got = c.get(key)
        worst = max(worst, time.perf_counter() - t)
        n += 1
        if got != want:
            print("BAD BYTES", flush=True)
            sys.exit(3)
print(f"{worst:.4f} {n}", flush=True)
"""


def put_in_one_group(client, keys, vals, group):
    """Put keys (with vals) all in one group, 4096 a batch; every put must succeed."""
    for s in range(0, len(keys), 4096):
        ks = keys[s:s + 4096]
        assert set(client.batch_put(ks, vals[s:s + 4096], group_ids=[group] * len(ks))) == {0}


def test_big_group_removal_keeps_the_loop_serving(make_pool, prefix, tmp_path):
    """bob puts 65536 objects in one group and removes 49152 of them in one call while
    alice reads her own object from another process: her slowest read stays under 0.5 s
    (a member's leave scanned the group: 65536 x 49152 pointer compares held the loop
    for seconds, PutRevoke's alike), her bytes exact; the removed keys are gone, the rest
    of the group intact (its bytes, the group's member count), and the removal went on
    over several loop turns (kvpool_requests_continued_total)."""
    m = Master(make_pool, "--put-timeout", "120")
    n, gone = 65536, 49152
    keys = [f"{prefix}big/{i:06d}" for i in range(n)]
    vals = [(k[-6:] * 11)[:64].encode() for k in keys]
    with kvpool.Client(m.addr) as bob, kvpool.Client(m.addr) as alice:
        mine = bytes(range(256)) * 16
        alice.put(prefix + "alice", mine)
        put_in_one_group(bob, keys, vals, "big")
        assert metric(m.metrics(), "kvpool_group_members") == n

        stop, ready = str(tmp_path / "stop"), str(tmp_path / "ready")
        reader = subprocess.Popen([sys.executable, "-c", _READER, m.addr, prefix + "alice",
                                   str(len(mine)), stop, ready], stdout=subprocess.PIPE,
                                  text=True)
        try:
            poll(lambda: os.path.exists(ready), "alice's reader started", timeout=30)
            before = metric(m.metrics(), "kvpool_requests_continued_total",
                            {"method": "Remove"}) or 0
            assert set(bob.raw.batch_remove(keys[:gone])) == {0}  # one call
        finally:
            open(stop, "w").close()
            out, _ = reader.communicate(timeout=60)
        assert reader.returncode == 0, out
        worst, reads = out.split()
        assert float(worst) < 0.5, f"alice's slowest read took {worst} s ({reads} reads)"
        text = m.metrics()
        assert metric(text, "kvpool_requests_continued_total", {"method": "Remove"}) > before
        assert metric(text, "kvpool_group_members") == n - gone
        assert metric(text, "kvpool_groups") == 1

        # the removed keys absent, the rest of the group whole
        assert not any(bob.batch_exists(keys[:gone]))
        assert all(bob.batch_exists(keys[gone:]))
        for i in range(gone, n, 211):
            assert bob.get(keys[i]) == vals[i]
        assert alice.get(prefix + "alice") == mine


def test_big_group_eviction_keeps_the_loop_serving(make_pool, prefix, tmp_path):
    """bob fills the 16 MiB segment with a 65536-member group (192-byte objects) and then
    puts past it while alice reads her own object from another process: the eviction
    takes bob's whole group as a unit (a victim takes its group: 4096 members with it, the
    rest at the loop's next turns), her slowest read stays under 0.5 s (each member's check
    scanned the whole group: 65536^2 steps held the loop for seconds), her bytes exact, the
    rest of bob's puts intact."""
    m = Master(make_pool)
    n, size = 65536, 192
    keys = [f"{prefix}bob/{i:06d}" for i in range(n)]
    vals = [(k[-6:] * 33)[:size].encode() for k in keys]
    with kvpool.Client(m.addr) as bob, kvpool.Client(m.addr) as alice:
        mine = bytes(range(256)) * 16
        alice.put(prefix + "alice", mine)
        put_in_one_group(bob, keys, vals, "bob")
        assert metric(m.metrics(), "kvpool_group_members") == n
        evicted = metric(m.metrics(), "kvpool_group_evicted_total") or 0
        evicted_all = metric(m.metrics(), "kvpool_evictions_total") or 0

        stop, ready = str(tmp_path / "stop"), str(tmp_path / "ready")
        reader = subprocess.Popen([sys.executable, "-c", _READER, m.addr, prefix + "alice",
                                   str(len(mine)), stop, ready], stdout=subprocess.PIPE,
                                  text=True)
        try:
            poll(lambda: os.path.exists(ready), "alice's reader started", timeout=30)
            for i in range(8):  # 8 MiB more than the segment has left: eviction
                bob.put(f"{prefix}more{i}", _val(f"m{i}"))
        finally:
            open(stop, "w").close()
            out, _ = reader.communicate(timeout=60)
        assert reader.returncode == 0, out
        worst, reads = out.split()
        assert float(worst) < 0.5, f"alice's slowest read took {worst} s ({reads} reads)"
        # bob's group went as a unit: every member, the group with them (4096 members a
        # loop turn, the turns one after the other)
        poll(lambda: (metric(m.metrics(), "kvpool_group_members") or 0) == 0,
             "bob's whole group evicted", timeout=30)
        text = m.metrics()
        # the victims the puts needed went at once, each taking 4096 of its group with it;
        # the rest of the group went at the loop's next turns, with its victims
        assert metric(text, "kvpool_evictions_total") - evicted_all >= n
        assert metric(text, "kvpool_group_evicted_total") - evicted >= n // 2
        assert (metric(text, "kvpool_group_members") or 0) == 0
        assert not any(bob.batch_exists(keys))
        for i in range(8):
            assert bob.get(f"{prefix}more{i}") == _val(f"m{i}")
        assert alice.get(prefix + "alice") == mine
