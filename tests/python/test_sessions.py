"""Transfer sessions (Mooncake's batch_get_session_* / batch_put_session_* and the
*_multi_buffer_ranges calls), against a real kvpool-master and `kvpool serve` segments on
127.0.0.1.

Covered: Mooncake's own doc example (4 layers x 2 keys, bytes checked, and the whole object
read back CRC-checked); a put session of 2 replicas read from each replica (the other's
owner killed, tcp); each of Mooncake's error codes (no session, a range past the object,
lists of different lengths, a second start, range calls after end and revoke, a missing
key, an end with bytes never written); revoke leaves nothing; end makes the object visible
and not before; a lease that ends (-707, the session dropped); a put past the master's put
timeout (-500, nothing visible); a client frozen mid-session and then killed (the master's
put timeout revokes its put: the key absent, free for another writer); concurrent range
calls from threads with an end waiting for them; tenants (a session sees only its
tenant's keys); the native kvpool.Client API.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import kvpool
from mooncake.store import MooncakeDistributedStore, ReplicateConfig

OK, INVALID, NOT_FOUND, LEASE_EXPIRED, WRITE_FAIL, EXISTS = 0, -600, -704, -707, -500, -705


def ptr(a):
    return a.ctypes.data


def new_store(addr, protocol="auto"):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, protocol, "", addr) == OK
    return s


def layered(store, keys, page, layers, seed=0):
    """Put keys through a put session, one range per layer; the source arrays."""
    src = [np.random.default_rng(seed + i).integers(0, 256, page, dtype=np.uint8)
           for i in range(layers)]
    assert store.batch_put_session_start(keys, [page * layers] * len(keys)) == [OK] * len(keys)
    for layer in range(layers):
        rcs = store.batch_put_from_multi_buffer_ranges(
            keys, [[ptr(src[layer])] for _ in keys], [[page] for _ in keys],
            [[layer * page] for _ in keys])
        assert rcs == [page] * len(keys)
    return src


def test_mooncake_doc_example(store, prefix):
    page, layers = 1024, 4
    keys = [prefix + "block0", prefix + "block1"]
    src = [np.full(page, i + 1, dtype=np.uint8) for i in range(layers)]
    dst = [np.zeros(page, dtype=np.uint8) for _ in range(layers)]
    for buf in src + dst:
        assert store.register_buffer(ptr(buf), buf.nbytes) == OK

    assert all(rc == 0 for rc in store.batch_put_session_start(keys, [page * layers] * 2))
    for layer in range(layers):
        ptrs = [[ptr(src[layer])] for _ in keys]
        rcs = store.batch_put_from_multi_buffer_ranges(keys, ptrs, [[page]] * 2,
                                                       [[layer * page]] * 2)
        assert rcs == [page, page]
        # not visible while the session is open
        assert [store.is_exist(k) for k in keys] == [0, 0]
    assert store.batch_put_session_end(keys) == [OK, OK]
    assert [store.is_exist(k) for k in keys] == [1, 1]

    assert store.batch_get_session_start(keys) == [OK, OK]
    for layer in range(layers):
        ptrs = [[ptr(dst[layer])] for _ in keys]
        rcs = store.batch_get_into_multi_buffer_ranges(keys, ptrs, [[page]] * 2,
                                                       [[layer * page]] * 2)
        assert rcs == [page, page]
        assert (dst[layer] == layer + 1).all()
    assert store.batch_get_session_end(keys) == 0

    # the whole object, CRC-checked: the CRC the session's ranges made is the object's
    whole = np.zeros(page * layers, dtype=np.uint8)
    for k in keys:
        whole[:] = 0
        assert store.get_into(k, ptr(whole), whole.nbytes) == page * layers
        assert all((whole[i * page:(i + 1) * page] == i + 1).all() for i in range(layers))
    for buf in src + dst:
        store.unregister_buffer(ptr(buf))


def test_ranges_many_buffers_any_order(store, prefix):
    """Several buffers per key per call, layers written out of order, reads of pieces that
    straddle layers."""
    key = prefix + "k"
    page = 4096
    data = np.random.default_rng(1).integers(0, 256, page * 8, dtype=np.uint8)
    assert store.batch_put_session_start([key], [data.nbytes]) == [OK]
    for layers in ([5, 1], [7, 0, 3], [2, 6], [4]):
        ptrs = [[ptr(data[i * page:]) for i in layers]]
        assert store.batch_put_from_multi_buffer_ranges(
            [key], ptrs, [[page] * len(layers)], [[i * page for i in layers]]) == \
            [page * len(layers)]
    assert store.batch_put_session_end([key]) == [OK]
    out = np.zeros(3000 * 3, dtype=np.uint8)
    offs = [100, page - 7, 7 * page + 1000]
    assert store.batch_get_session_start([key]) == [OK]
    rc = store.batch_get_into_multi_buffer_ranges(
        [key], [[ptr(out), ptr(out[3000:]), ptr(out[6000:])]], [[3000, 3000, 3000]], [offs])
    assert rc == [9000]
    for j, o in enumerate(offs):
        assert (out[j * 3000:(j + 1) * 3000] == data[o:o + 3000]).all()
    assert store.batch_get_session_end([key]) == 0
    got = np.zeros(data.nbytes, dtype=np.uint8)
    assert store.get_into(key, ptr(got), got.nbytes) == data.nbytes
    assert (got == data).all()


def test_error_codes(store, prefix):
    page = 512
    k1, k2, missing = prefix + "a", prefix + "b", prefix + "missing"
    buf = np.arange(page, dtype=np.uint8)
    out = np.zeros(page, dtype=np.uint8)
    # no session at all
    assert store.batch_get_into_multi_buffer_ranges([k1], [[ptr(out)]], [[page]], [[0]]) == \
        [INVALID]
    assert store.batch_put_from_multi_buffer_ranges([k1], [[ptr(buf)]], [[page]], [[0]]) == \
        [INVALID]
    assert store.batch_put_session_end([k1]) == [INVALID]
    assert store.batch_put_session_revoke([k1]) == [INVALID]
    assert store.batch_get_session_end([k1]) == 0  # Mooncake: 0 whatever the keys
    # sizes of another length; a missing key
    assert store.batch_put_session_start([k1, k2], [page]) == [INVALID, INVALID]
    cfg = ReplicateConfig()
    cfg.group_ids = ["g"]  # one group id for two keys
    assert store.batch_put_session_start([k1, k2], [page, page], cfg) == [INVALID, INVALID]
    assert store.batch_get_session_start([missing]) == [NOT_FOUND]

    assert store.batch_put_session_start([k1, k2], [2 * page, 2 * page]) == [OK, OK]
    # a second start of a key in a session; the other key of the batch still starts
    assert store.batch_put_session_start([k1, prefix + "c"], [page, page]) == [INVALID, OK]
    assert store.batch_put_session_revoke([prefix + "c"]) == [OK]
    # a range past the object's size (and one whose offset + size wraps)
    assert store.batch_put_from_multi_buffer_ranges([k1], [[ptr(buf)]], [[page]],
                                                    [[page + 1]]) == [INVALID]
    assert store.batch_put_from_multi_buffer_ranges([k1], [[ptr(buf)]], [[page]],
                                                    [[2 ** 64 - 10]]) == [INVALID]
    # lists of different lengths: all keys when the four differ, one key when its own do
    assert store.batch_put_from_multi_buffer_ranges([k1, k2], [[ptr(buf)]], [[page]] * 2,
                                                    [[0]] * 2) == [INVALID, INVALID]
    assert store.batch_put_from_multi_buffer_ranges(
        [k1, k2], [[ptr(buf)], [ptr(buf)]], [[page], [page]], [[0, page], [0]]) == \
        [INVALID, page]
    for k in (k1, k2):
        assert store.batch_put_from_multi_buffer_ranges([k], [[ptr(buf)]], [[page]],
                                                        [[page]]) == [page]
    assert store.batch_put_from_multi_buffer_ranges([k1], [[ptr(buf)]], [[page]], [[0]]) == \
        [page]
    assert store.batch_put_session_end([k1, k2]) == [OK, OK]
    # after end: no put session; a new start of an existing key: Mooncake's -705
    assert store.batch_put_from_multi_buffer_ranges([k1], [[ptr(buf)]], [[page]], [[0]]) == \
        [INVALID]
    assert store.batch_put_session_end([k1]) == [INVALID]
    assert store.batch_put_session_start([k1], [page]) == [EXISTS]

    assert store.batch_get_session_start([k1, missing]) == [OK, NOT_FOUND]
    assert store.batch_get_into_multi_buffer_ranges([k1], [[ptr(out)]], [[page]],
                                                    [[page + 1]]) == [INVALID]
    assert store.batch_get_into_multi_buffer_ranges([k1, missing], [[ptr(out)]] * 2,
                                                    [[page]] * 2, [[page]] * 2) == \
        [page, INVALID]
    assert (out == buf).all()
    assert store.batch_get_into_multi_buffer_ranges([k1], [[ptr(out)]], [[page]], [[0], [0]]) \
        == [INVALID]
    assert store.batch_get_session_end([k1]) == 0
    assert store.batch_get_into_multi_buffer_ranges([k1], [[ptr(out)]], [[page]], [[0]]) == \
        [INVALID]
    # bad input never raises
    assert store.batch_get_into_multi_buffer_ranges([k1], None, None, None) == [INVALID]


def test_end_needs_every_byte(store, prefix):
    """An end with bytes never written is refused and the session stays open (kvpool keeps
    a CRC per object; Mooncake would publish the unwritten bytes); rewriting a range is
    fine."""
    key, page = prefix + "holes", 1000
    a = np.full(page, 7, dtype=np.uint8)
    b = np.full(page, 9, dtype=np.uint8)
    assert store.batch_put_session_start([key], [3 * page]) == [OK]
    for off in (0, 2 * page):
        assert store.batch_put_from_multi_buffer_ranges([key], [[ptr(a)]], [[page]],
                                                        [[off]]) == [page]
    assert store.batch_put_session_end([key]) == [INVALID]
    assert store.is_exist(key) == 0
    # the same range again (a retried layer), then the missing one
    assert store.batch_put_from_multi_buffer_ranges([key], [[ptr(b)]], [[page]], [[0]]) == [page]
    assert store.batch_put_from_multi_buffer_ranges([key], [[ptr(a)]], [[page]], [[page]]) == \
        [page]
    # and a layer rewritten after its neighbours were written (the CRC follows the new bytes)
    assert store.batch_put_from_multi_buffer_ranges([key], [[ptr(b)]], [[page]], [[page]]) == \
        [page]
    assert store.batch_put_session_end([key]) == [OK]
    out = np.zeros(3 * page, dtype=np.uint8)
    assert store.get_into(key, ptr(out), out.nbytes) == 3 * page
    assert (out[:2 * page] == 9).all() and (out[2 * page:] == 7).all()

    # 200 ranges of 10 bytes: more than are kept apart, merged as they touch
    k3 = prefix + "many"
    assert store.batch_put_session_start([k3], [2000]) == [OK]
    src = np.random.default_rng(3).integers(0, 256, 2000, dtype=np.uint8)
    order = np.random.default_rng(4).permutation(200)
    for lo in range(0, 200, 50):
        sel = order[lo:lo + 50]
        assert store.batch_put_from_multi_buffer_ranges(
            [k3], [[ptr(src[10 * j:]) for j in sel]], [[10] * 50],
            [[10 * int(j) for j in sel]]) == [500]
    assert store.batch_put_session_end([k3]) == [OK]
    got = np.zeros(2000, dtype=np.uint8)
    assert store.get_into(k3, ptr(got), 2000) == 2000
    assert (got == src).all()

    # an overlap that is not the same range: the CRC is not known, end refuses
    k2 = prefix + "overlap"
    assert store.batch_put_session_start([k2], [2 * page]) == [OK]
    assert store.batch_put_from_multi_buffer_ranges([k2], [[ptr(a), ptr(a)]], [[page, page]],
                                                    [[0, page]]) == [2 * page]
    assert store.batch_put_from_multi_buffer_ranges([k2], [[ptr(b)]], [[10]], [[5]]) == [10]
    assert store.batch_put_session_end([k2]) == [INVALID]
    assert store.batch_put_session_revoke([k2]) == [OK]
    assert store.is_exist(k2) == 0


def test_revoke_leaves_nothing(store, prefix):
    key, n = prefix + "rev", 1 << 20
    buf = np.ones(n, dtype=np.uint8)
    assert store.batch_put_session_start([key], [n]) == [OK]
    assert store.batch_put_from_multi_buffer_ranges([key], [[ptr(buf)]], [[n]], [[0]]) == [n]
    assert store.batch_put_session_revoke([key]) == [OK]
    assert store.is_exist(key) == 0
    assert store.get_size(key) == NOT_FOUND
    # after revoke: no session; the key is free again
    assert store.batch_put_from_multi_buffer_ranges([key], [[ptr(buf)]], [[n]], [[0]]) == \
        [INVALID]
    assert store.batch_put_session_revoke([key]) == [INVALID]
    assert store.batch_put_session_start([key], [n]) == [OK]
    assert store.batch_put_from_multi_buffer_ranges([key], [[ptr(buf)]], [[n]], [[0]]) == [n]
    assert store.batch_put_session_end([key]) == [OK]
    assert store.get_size(key) == n


@pytest.mark.parametrize("kill", [0, 1])
def test_two_replicas_each_read(make_pool, prefix, kill):
    """replica_num=2: both replicas written by the session; with one owner killed the other
    replica serves the whole object (CRC-checked) and a get session's ranges (tcp, so a
    dead owner's memory is not read through a mapping)."""
    pool = make_pool(segments=("32MiB", "32MiB"))
    s = new_store(pool.addr, "tcp")
    try:
        key, page, layers = prefix + "r2", 8192, 4
        cfg = ReplicateConfig()
        cfg.replica_num = 2
        src = [np.random.default_rng(i).integers(0, 256, page, dtype=np.uint8)
               for i in range(layers)]
        assert s.batch_put_session_start([key], [page * layers], cfg) == [OK]
        for layer in range(layers):
            assert s.batch_put_from_multi_buffer_ranges(
                [key], [[ptr(src[layer])]], [[page]], [[layer * page]]) == [page]
        assert s.batch_put_session_end([key]) == [OK]
        reps = s.get_replica_desc(key)
        assert len(reps) == 2, reps
        assert s.batch_get_session_start([key]) == [OK]
        pool.segments.pop(kill).kill()  # killed on purpose: not a bad exit
        out = np.zeros(page, dtype=np.uint8)
        for layer in reversed(range(layers)):
            out[:] = 0
            assert s.batch_get_into_multi_buffer_ranges([key], [[ptr(out)]], [[page]],
                                                        [[layer * page]]) == [page]
            assert (out == src[layer]).all()
        assert s.batch_get_session_end([key]) == 0
        whole = np.zeros(page * layers, dtype=np.uint8)
        assert s.get_into(key, ptr(whole), whole.nbytes) == whole.nbytes
        assert (whole == np.concatenate(src)).all()
    finally:
        s.close()


@pytest.mark.parametrize("protocol", ["tcp", "auto"])
def test_owner_gone_under_get_session(make_pool, prefix, protocol):
    """The only replica's owner killed while a get session is open: each range read either
    fails with a negative code or (shm: the owner's memory still mapped here, nobody left
    to change it) returns the object's own bytes; never other bytes, never a hang."""
    pool = make_pool()
    s = new_store(pool.addr, protocol)
    try:
        key, page = prefix + "gone", 64 * 1024
        src = layered(s, [key], page, 4)
        assert s.batch_put_session_end([key]) == [OK]
        assert s.batch_get_session_start([key]) == [OK]
        pool.segments.pop().kill()  # killed on purpose: not a bad exit
        out = np.zeros(page, dtype=np.uint8)
        for layer in range(4):
            out[:] = 0
            rc = s.batch_get_into_multi_buffer_ranges([key], [[ptr(out)]], [[page]],
                                                      [[layer * page]])
            assert rc == [page] and (out == src[layer]).all() or rc[0] < 0, rc
            if protocol == "tcp":
                assert rc[0] < 0, rc
        assert s.batch_get_session_end([key]) == 0
    finally:
        s.close()


def test_lease_expiry(make_pool, prefix):
    pool = make_pool(master_args=("--lease-ttl", "1"))
    s = new_store(pool.addr)
    try:
        key, page = prefix + "lease", 4096
        layered(s, [key], page, 2)
        assert s.batch_put_session_end([key]) == [OK]
        out = np.zeros(page, dtype=np.uint8)
        assert s.batch_get_session_start([key]) == [OK]
        assert s.batch_get_into_multi_buffer_ranges([key], [[ptr(out)]], [[page]], [[0]]) == \
            [page]
        # the lease holds the object against removal while the session is open
        assert s.remove(key) == -706
        time.sleep(1.2)
        out[:] = 0
        assert s.batch_get_into_multi_buffer_ranges([key], [[ptr(out)]], [[page]], [[0]]) == \
            [LEASE_EXPIRED]
        assert not out.any()  # nothing read past the lease
        # the session was dropped with it
        assert s.batch_get_into_multi_buffer_ranges([key], [[ptr(out)]], [[page]], [[0]]) == \
            [INVALID]
        assert s.batch_get_session_start([key]) == [OK]  # a new one works
        assert s.batch_get_into_multi_buffer_ranges([key], [[ptr(out)]], [[page]],
                                                    [[page]]) == [page]
        assert s.batch_get_session_end([key]) == 0
        assert s.remove(key) == OK  # the lease was handed back at the end
    finally:
        s.close()


def test_put_past_the_put_timeout(make_pool, prefix):
    pool = make_pool(master_args=("--lease-ttl", "0", "--put-timeout", "2"))
    s = new_store(pool.addr)
    try:
        key, page = prefix + "late", 4096
        buf = np.ones(page, dtype=np.uint8)
        assert s.batch_put_session_start([key], [2 * page]) == [OK]
        assert s.batch_put_from_multi_buffer_ranges([key], [[ptr(buf)]], [[page]], [[0]]) == \
            [page]
        time.sleep(2.5)
        # past the deadline nothing is written (its extent may hold another object now)
        assert s.batch_put_from_multi_buffer_ranges([key], [[ptr(buf)]], [[page]],
                                                    [[page]]) == [WRITE_FAIL]
        assert s.batch_put_session_end([key]) == [INVALID]  # bytes never written
        assert s.batch_put_session_revoke([key]) == [OK]  # the master had dropped it
        assert s.is_exist(key) == 0
    finally:
        s.close()


CHILD = textwrap.dedent("""
    import sys, numpy as np
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "auto", "", sys.argv[1]) == 0
    key, page = sys.argv[2], 4096
    buf = np.full(page, 5, dtype=np.uint8)
    assert s.batch_put_session_start([key], [2 * page]) == [0]
    assert s.batch_put_from_multi_buffer_ranges([key], [[buf.ctypes.data]], [[page]],
                                                [[0]]) == [page]
    print("half", flush=True)
    sys.stdin.read()
""")


def test_client_dies_mid_put_session(make_pool, prefix):
    """A client frozen with a put session open (its connection alive): the master's put
    timeout revokes the put, the key stays absent and is free for another writer; then the
    client is killed: nothing changes."""
    pool = make_pool(master_args=("--lease-ttl", "0", "--put-timeout", "2"))
    key = prefix + "orphan"
    child = subprocess.Popen([sys.executable, "-c", CHILD, pool.addr, key],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env=dict(os.environ))
    s = new_store(pool.addr)
    try:
        assert child.stdout.readline().strip() == b"half"
        os.kill(child.pid, signal.SIGSTOP)
        assert s.is_exist(key) == 0
        # the child's put is PENDING: another writer waits (Mooncake's -703 becomes a 0)
        deadline = time.monotonic() + 6
        while True:
            rc = s.batch_put_session_start([key], [4096])
            if rc == [OK] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert rc == [OK], rc
        assert s.is_exist(key) == 0
        buf = np.full(4096, 3, dtype=np.uint8)
        assert s.batch_put_from_multi_buffer_ranges([key], [[ptr(buf)]], [[4096]], [[0]]) == \
            [4096]
        assert s.batch_put_session_end([key]) == [OK]
        os.kill(child.pid, signal.SIGKILL)
        child.wait(5)
        out = np.zeros(4096, dtype=np.uint8)
        assert s.get_into(key, ptr(out), 4096) == 4096
        assert (out == 3).all()
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(5)
        s.close()


def test_client_killed_mid_put_session(make_pool, prefix):
    """Killed outright: its connection closes, the master revokes the put at once."""
    pool = make_pool()
    key = prefix + "killed"
    child = subprocess.Popen([sys.executable, "-c", CHILD, pool.addr, key],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    s = new_store(pool.addr)
    try:
        assert child.stdout.readline().strip() == b"half"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(5)
        deadline = time.monotonic() + 5
        while s.batch_put_session_start([key], [100]) != [OK]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        assert s.is_exist(key) == 0
        assert s.batch_put_session_revoke([key]) == [OK]
        assert s.is_exist(key) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(5)
        s.close()


def test_threads(store, prefix):
    """Range calls from 4 threads at once on their own keys, and an end from the main
    thread waiting for those in flight on a shared key."""
    page, layers = 64 * 1024, 16
    shared = prefix + "shared"
    data = np.random.default_rng(7).integers(0, 256, page * layers, dtype=np.uint8)
    assert store.batch_put_session_start([shared], [data.nbytes]) == [OK]
    errors = []

    def worker(t):
        try:
            key = f"{prefix}w{t}"
            src = layered(store, [key], page, 4, seed=100 + t)
            assert store.batch_put_session_end([key]) == [OK]
            out = np.zeros(page, dtype=np.uint8)
            assert store.batch_get_session_start([key]) == [OK]
            for layer in range(4):
                assert store.batch_get_into_multi_buffer_ranges(
                    [key], [[ptr(out)]], [[page]], [[layer * page]]) == [page]
                assert (out == src[layer]).all()
            assert store.batch_get_session_end([key]) == 0
            # layers t, t+4, ... of the shared key
            for layer in range(t, layers, 4):
                assert store.batch_put_from_multi_buffer_ranges(
                    [shared], [[ptr(data[layer * page:])]], [[page]], [[layer * page]]) == \
                    [page]
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert store.batch_put_session_end([shared]) == [OK]
    out = np.zeros(data.nbytes, dtype=np.uint8)
    assert store.get_into(shared, ptr(out), out.nbytes) == data.nbytes
    assert (out == data).all()


def test_native_client(pool, prefix):
    with kvpool.Client(pool.addr) as c:
        keys = [prefix + "n0", prefix + "n1"]
        a, b = bytearray(b"x" * 3000), bytearray(b"y" * 5000)
        assert c.put_session_start(keys, [8000, 8000]) == [0, 0]
        assert c.put_session_ranges(keys, [[a, b], [b, a]], [[0, 3000], [0, 5000]]) == \
            [8000, 8000]
        assert c.put_session_end(keys) == [0, 0]
        assert c.batch_get(keys) == [bytes(a + b), bytes(b + a)]
        out = bytearray(10)
        assert c.get_session_start(keys) == [0, 0]
        assert c.get_session_ranges([keys[1]], [[out]], [[4995]]) == [10]
        assert bytes(out) == b"yyyyyxxxxx"
        c.get_session_end(keys)
        assert c.get_session_ranges([keys[1]], [[out]], [[0]]) == [kvpool.ERR_INVALID_ARG]
