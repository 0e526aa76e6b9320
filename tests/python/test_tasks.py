"""Copy and move tasks (Mooncake's create_copy_task / create_move_task / query_task) with
real processes: a kvpool-master, `kvpool serve` segments named as Mooncake's clients name
theirs, and a client that asks. The bytes are checked where a user would: after a copy,
each source is killed in turn and a get still returns the object's bytes from the copies;
after a move, the source segment's death loses nothing. Faults: the owner that is to run a
task dies before it does; a target dies; nothing half-done is ever visible."""

import os
import signal
import time

import pytest

import kvpool
from conftest import Pool, Proc, _bin, free_port, freeze, master_security_args, stop_all

TASK_FAILED, TASK_SUCCESS = kvpool.TASK_FAILED, kvpool.TASK_SUCCESS


def make_world(request, names, master_args=("--lease-ttl", "0")):
    """A master and a 32 MiB segment per name (their owners' Procs), and a client."""
    pool = Pool(segments=(), master_args=master_args)
    segs = {}
    try:
        for name in names:
            segs[name] = Proc([pool.cli_bin, "--master", pool.addr, "serve", "--segment-size",
                               "32MiB", "--name", name, "--ready-fd", "{fd}"])
            pool.segments.append(segs[name])
    except Exception:
        pool.close()
        raise
    c = kvpool.Client(pool.addr)

    def fin():
        c.close()
        pool.close()

    request.addfinalizer(fin)
    return pool, segs, c


@pytest.fixture
def world(request):
    """Three segments named as Mooncake's clients name theirs, localhost:10001..3."""
    return make_world(request, [f"localhost:1000{i}" for i in (1, 2, 3)])


def segment_ids(c):
    return {s["name"]: s["id"] for s in c.stat()["segments"]}


def replica_segments(c, key):
    ids = {v: k for k, v in segment_ids(c).items()}
    [entry] = c.list_keys("^" + key + "$")
    return sorted(ids.get(i, "?") for i in entry["segment_ids"][:entry["replicas"]])


def test_copy_then_the_source_dies(world):
    pool, segs, c = world
    data = os.urandom(2 << 20)
    c.put("copied", data, preferred_segment="localhost:10001")
    tid = c.copy_task("copied", ["localhost:10002", "localhost:10003"])
    assert isinstance(tid, tuple) and len(tid) == 2
    r = c.wait_task(tid)
    assert r["status"] == TASK_SUCCESS, r
    assert r["kind"] == kvpool.COPY_TASK and r["assigned"] == "localhost:10001"
    assert r["message"] == "" and r["updated_ms"] >= r["created_ms"] > 0
    assert replica_segments(c, "copied") == ["localhost:10001", "localhost:10002",
                                             "localhost:10003"]
    # each copy holds the bytes: the source goes, then the second; the third answers
    segs["localhost:10001"].kill()
    assert c.get("copied") == data
    segs["localhost:10002"].kill()
    assert c.get("copied") == data
    assert replica_segments(c, "copied") == ["localhost:10003"]


def test_move_then_the_source_dies(world):
    pool, segs, c = world
    data = os.urandom(1 << 20)
    c.put("moved", data, preferred_segment="localhost:10001")
    tid = c.move_task("moved", "localhost:10001", "localhost:10003")
    r = c.wait_task(tid)
    assert r["status"] == TASK_SUCCESS and r["kind"] == kvpool.MOVE_TASK, r
    assert replica_segments(c, "moved") == ["localhost:10003"]
    segs["localhost:10001"].kill()
    assert c.get("moved") == data


def test_refusals_say_why(world):
    pool, segs, c = world
    c.put("k", b"x" * 4096, preferred_segment="localhost:10001")
    with pytest.raises(kvpool.Error) as e:
        c.copy_task("no-such-key", ["localhost:10002"])
    assert e.value.status == kvpool.ERR_NOT_FOUND
    with pytest.raises(kvpool.Error) as e:
        c.copy_task("k", ["localhost:10002", "unknown_segment_1"])
    assert e.value.status == kvpool.ERR_INVALID_ARG
    assert "unknown_segment_1" in str(e.value)
    with pytest.raises(kvpool.Error) as e:
        c.move_task("k", "localhost:10002", "localhost:10003")  # no replica there
    assert e.value.status == kvpool.ERR_INVALID_ARG
    with pytest.raises(kvpool.Error) as e:
        c.move_task("k", "localhost:10001", "localhost:10001")
    assert e.value.status == kvpool.ERR_INVALID_ARG
    with pytest.raises(kvpool.Error) as e:
        c.query_task((12345, 67890))
    assert e.value.status == kvpool.ERR_NOT_FOUND
    assert replica_segments(c, "k") == ["localhost:10001"]


def test_the_runner_dies_before_it_runs(world):
    """The owner of the source is frozen (so it cannot take the task), then killed: the
    task fails, naming it, and the object is not copied anywhere."""
    pool, segs, c = world
    c.put("stuck", os.urandom(65536), preferred_segment="localhost:10001")
    c.put("other", b"o" * 100, preferred_segment="localhost:10002")
    owner = segs["localhost:10001"]
    freeze(owner.pid)
    try:
        tid = c.copy_task("stuck", ["localhost:10002"])
        assert c.query_task(tid)["status"] == kvpool.TASK_PENDING
    finally:
        owner.kill()  # SIGKILL reaches a stopped process
    r = c.wait_task(tid, timeout_s=60)
    assert r["status"] == TASK_FAILED, r
    assert "localhost:10001" in r["message"]
    # nothing of it on the target: the segment holds exactly the other object
    ids = segment_ids(c)
    entries = c.list_keys()
    on_target = [e["key"] for e in entries if ids["localhost:10002"] in e["segment_ids"]]
    assert on_target == ["other"]


def test_a_target_that_dies_fails_the_copy_whole(world):
    """A copy to two segments, one of which dies before the copy starts: the task fails,
    and the surviving target does not keep a replica either (all or nothing)."""
    pool, segs, c = world
    data = os.urandom(1 << 20)
    c.put("whole", data, preferred_segment="localhost:10001")
    owner = segs["localhost:10001"]
    freeze(owner.pid)
    try:
        tid = c.copy_task("whole", ["localhost:10002", "localhost:10003"])
        segs["localhost:10003"].kill()
        # the master has dropped the dead target's segment before the owner runs again
        for _ in range(200):
            if "localhost:10003" not in segment_ids(c):
                break
            time.sleep(0.05)
    finally:
        os.kill(owner.pid, signal.SIGCONT)
    r = c.wait_task(tid, timeout_s=60)
    assert r["status"] == TASK_FAILED, r
    assert replica_segments(c, "whole") == ["localhost:10001"]
    assert c.get("whole") == data


def test_through_mooncake_store(world):
    """Mooncake's calls: a store set up as "localhost:PORT" is that segment; a copy to it
    and the replica descriptors naming it; query_task's QueryTaskResponse; an unknown id
    is -1400 TASK_NOT_FOUND; a hostname without a port gets one in Mooncake's range."""
    from mooncake.store import MooncakeDistributedStore, TaskStatus, TaskType
    pool, segs, c = world
    s = MooncakeDistributedStore()
    assert s.setup("localhost:10009", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", pool.addr) == 0
    try:
        assert s.get_hostname() == "localhost:10009"
        data = os.urandom(300000)
        c.put("mc", data, preferred_segment="localhost:10001")
        tid, err = s.create_copy_task("mc", ["localhost:10009"])
        assert err == 0 and tid != (0, 0)
        deadline = time.monotonic() + 30
        while True:
            resp, err = s.query_task(tid)
            assert err == 0
            if resp.status in (TaskStatus.SUCCESS, TaskStatus.FAILED) or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert resp.status == TaskStatus.SUCCESS and resp.type == TaskType.REPLICA_COPY
        assert resp.id == tid
        ends = sorted(d.get_memory_descriptor().buffer_descriptor.transport_endpoint
                      for d in s.get_replica_desc("mc"))
        assert ends == ["localhost:10001", "localhost:10009"]
        segs["localhost:10001"].kill()
        assert s.get("mc") == data  # from the copy in this store's own segment
        assert s.query_task((7, 7)) == (None, -1400)
        assert s.create_copy_task("nope", ["localhost:10009"]) == ((0, 0), -704)
        assert s.create_copy_task("mc", ["unknown_segment_1"]) == ((0, 0), -600)
        assert s.create_move_task("mc", "localhost:10009", "localhost:10009")[1] == -600
    finally:
        s.close()
    t = MooncakeDistributedStore()
    assert t.setup("localhost", "P2PHANDSHAKE", 16 << 20, 16 << 20, "tcp", "", pool.addr) == 0
    try:
        host, port = t.get_hostname().split(":")
        assert host == "localhost" and 12300 <= int(port) < 14300
    finally:
        t.close()


@pytest.fixture
def hot_world(request):
    """The hot-key fanout on (20 reads a second, 2 replicas more at most); three segments."""
    return make_world(request, ["hot:1", "hot:2", "hot:3"],
                      ("--lease-ttl", "0", "--hot-key-reads", "20", "--hot-key-replicas", "2"))


def read_until(c, key, data, want, timeout_s, rate=True):
    """Read key (about 60 times a second when rate) until it has `want` replicas."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if rate:
            for _ in range(6):
                assert c.get(key) == data
        if len(replica_segments(c, key)) == want:
            return True
        time.sleep(0.1)
    return False


def test_a_hot_key_gets_replicas_and_loses_them_when_it_cools(hot_world):
    pool, segs, c = hot_world
    data = os.urandom(1 << 20)
    c.put("hot-key", data, preferred_segment="hot:1")
    c.put("cold-key", b"c" * 4096, preferred_segment="hot:1")
    assert c.get("cold-key") == b"c" * 4096
    # read often: a replica on each other segment (two more at most)
    assert read_until(c, "hot-key", data, 3, 20), replica_segments(c, "hot-key")
    assert replica_segments(c, "hot-key") == ["hot:1", "hot:2", "hot:3"]
    assert replica_segments(c, "cold-key") == ["hot:1"]  # read once: never copied
    # the copies hold the bytes: the first segment goes, the key is still read
    segs["hot:1"].kill()
    assert c.get("hot-key") == data
    # no more reads: it cools, and gives back what it was given but its last copy
    assert read_until(c, "hot-key", data, 1, 30, rate=False), replica_segments(c, "hot-key")
    assert c.get("hot-key") == data
    used = {s["name"]: s["used"] for s in c.stat()["segments"]}
    assert sorted(used.values()) == [0, 1 << 20]  # nothing left behind on the other one


def test_a_segment_per_replica(world):
    """preferred_segment as a list (Mooncake's preferred_segments): replica i on the i-th
    segment; the kvpool module's and mooncake.store's forms."""
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    pool, segs, c = world
    for order in (["localhost:10002", "localhost:10003"], ["localhost:10003", "localhost:10001"]):
        for i in range(4):
            key = f"placed/{order[0]}/{i}"
            c.put(key, b"p" * 3000, replicas=2, preferred_segment=order)
            assert replica_segments(c, key) == sorted(order)
    s = MooncakeDistributedStore()
    assert s.setup("", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", pool.addr) == 0
    try:
        cfg = ReplicateConfig()
        cfg.replica_num = 2
        cfg.preferred_segments = ["localhost:10001", "localhost:10003"]
        for i in range(4):
            assert s.put(f"mc-placed/{i}", b"q" * 2048, cfg) == 0
            assert replica_segments(c, f"mc-placed/{i}") == ["localhost:10001", "localhost:10003"]
            assert s.get(f"mc-placed/{i}") == b"q" * 2048
    finally:
        s.close()


def test_a_task_of_a_master_that_restarted_is_reported_failed():
    """The master dies (kill -9) with a task waiting for its runner (frozen), and a new one
    takes its port: the task is reported FAILED, saying why, not unknown; nothing of it
    became a replica (the owner's object comes back alone). mooncake.store sees the same."""
    from mooncake.store import MooncakeDistributedStore, TaskStatus
    port = free_port()
    argv = [_bin("KVPOOL_MASTER_BIN"), "--listen", f"127.0.0.1:{port}", "--ready-fd", "{fd}",
            "--log-level", "error", *master_security_args(), "--lease-ttl", "0"]
    cli = _bin("KVPOOL_CLI_BIN")
    procs = [Proc(argv)]
    addr = procs[0].ready
    c = s = None
    try:
        segs = [Proc([cli, "--master", addr, "serve", "--segment-size", "16MiB", "--name",
                      f"r:{i}", "--ready-fd", "{fd}"]) for i in (1, 2)]
        procs = segs + procs
        c = kvpool.Client(addr)
        data = os.urandom(100000)
        c.put("before", data, preferred_segment="r:1")
        freeze(segs[0].pid)
        tid = c.copy_task("before", ["r:2"])
        procs[-1].kill()
        procs[-1] = Proc(argv)
        os.kill(segs[0].pid, signal.SIGCONT)
        deadline = time.monotonic() + 30
        while True:
            try:
                r = c.query_task(tid)
                break
            except kvpool.Error:  # reconnecting to the new master
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert r["status"] == TASK_FAILED and "restart" in r["message"], r
        s = MooncakeDistributedStore()
        assert s.setup("", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", addr) == 0
        resp, err = s.query_task(tid)
        assert err == 0 and resp.status == TaskStatus.FAILED
        # the owner offers its object back: one replica, the bytes intact, no copy on r:2
        while time.monotonic() < deadline:
            try:
                if replica_segments(c, "before") == ["r:1"]:
                    break
            except (kvpool.Error, ValueError):
                pass
            time.sleep(0.1)
        assert replica_segments(c, "before") == ["r:1"]
        assert c.get("before") == data
        with pytest.raises(kvpool.Error) as e:
            c.query_task((tid[0] ^ 1, tid[1]))  # made up: unknown
        assert e.value.status == kvpool.ERR_NOT_FOUND
    finally:
        if s is not None:
            s.close()
        if c is not None:
            c.close()
        stop_all(procs)
