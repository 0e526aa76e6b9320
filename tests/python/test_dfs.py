"""The DFS tier (docs/architecture.md, "The DFS tier"): `kvpool serve --dfs-path DIR
--dfs-size N` mounts a DFS segment, a shard file in DIR; a put with dfs_replica_num=1 gets
a replica there besides its memory ones; a client whose DFS directory is the same (dfs_path,
KVPOOL_DFS_PATH, MOONCAKE_DFS_ROOT_DIR) reads and writes that replica in the shard file
itself, one without it through the owner like an SSD replica.

Everything runs for real on 127.0.0.1 (a kvpool-master, `kvpool serve` processes killed and
stopped by their PIDs); the "shared" directory is a local one (tmp_path), the same code as
on NFS or 3FS-FUSE. Covered:
 1. the point of the tier: the memory replica's owner killed (SIGKILL), a get still returns
    the bytes, from the DFS replica, through its owner (metrics: transport "ssd");
 2. no owner in the path: a client with the directory reads and writes DFS replicas with
    the DFS owner frozen (SIGSTOP), its served counters unchanged; a client of another
    directory (another id) does not touch the files: it goes through the owner;
 3. a full DFS with --dfs-eviction off: the put is refused (POOL_FULL, "DFS full", Mooncake's
    -200), nothing of it is visible, the memory tier still takes puts without a DFS replica;
 4. refusals: dfs_replica_num 2, or with medium "ssd", or (mooncake.store) with
    replica_num 0: -600 / INVALID_ARG; no DFS segment mounted: UNSUPPORTED / -1601;
 5. the DFS owner killed and started again on the same directory: its shard comes back
    with the objects (offered back to the master), readable after the memory replica died;
 6. a tenant's max-ssd quota counts DFS bytes (test_tenants.py's TLS master and ACL);
 7. the master killed and restarted on its port: the DFS owner offers its objects again,
    read back from DFS after the memory owner died;
 8. a DFS write that fails (its owner stopped): the put fails (IO), the key stays absent;
 9. DRAM eviction: an object with a DFS replica loses only its memory replica;
10. DFS eviction (on by default): puts into a full DFS succeed; objects on DFS only go,
    least recently used first; objects with memory replicas keep them, byte-exact;
11. the DFS owner killed by PID: its objects stay, read in the shard file by a client with
    the directory (one without it gets KVP_ERR_CONNECT); a new serve of the directory takes
    the free shard file over (flock), the objects are handed to it, new DFS puts work; a
    second serve beside it gets a shard file of its own; past --segment-grace with no new
    owner the objects go; another principal's serve is handed none of them; a serve of
    another node (its own host name: unshare --uts) finds the dead node's shard file and
    takes it over; the owner frozen past --client-ttl and resumed takes its segment back;
 and the CLI: `kvpool put --dfs`, `kvpool ls` naming dram+dfs.
"""

import json
import os
import signal
import subprocess
import time

import pytest

import kvpool
from conftest import (Pool, Proc, _bin, free_port, freeze, http_get, master_metric_at,
                      master_security_args, metric, wait_recorded)
from test_security import certs  # noqa: F401 (the fixture)

KiB, MiB = 1024, 1024 * 1024
POOL_FULL = kvpool.ERR_POOL_FULL
INVALID = kvpool.ERR_INVALID_ARG
UNSUPPORTED = kvpool.STATUS["KVP_ERR_UNSUPPORTED"]


class DfsPool(Pool):
    """A master, a DFS owner (`kvpool serve --segment-size 0 --dfs-path DIR --dfs-size N
    --http-listen`) and memory segments."""

    def __init__(self, dfs_dir, dfs_size="8MiB", memory=("64MiB",), master_args=(), node=None):
        self.http_port = free_port()  # the master's /metrics
        super().__init__(segments=(), master_args=("--lease-ttl", "0", "--http-listen",
                                                   f"127.0.0.1:{self.http_port}",
                                                   *master_args))
        self.dfs_dir = str(dfs_dir)
        self.dfs_size = dfs_size
        try:
            self.dfs = self.start_dfs(node)
            for size in memory:
                self.add_segment(size)
        except Exception:
            self.close()
            raise

    def start_dfs(self, node=None):
        """node: the serve's host name (its own UTS namespace: another node's shard name)."""
        pre = ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', node] if node else []
        d = Proc([*pre, self.cli_bin, "--master", self.addr, "serve", "--segment-size", "0",
                  "--dfs-path", self.dfs_dir, "--dfs-size", self.dfs_size,
                  "--http-listen", "127.0.0.1:0", "--ready-fd", "{fd}"], lines=2)
        self.segments.append(d)
        self.dfs_name = d.lines[0]
        self.dfs_http = int(d.lines[1].rsplit(":", 1)[1])  # its HTTP port
        return d

    def master_metric(self, name, **labels):
        return master_metric_at(self.http_port, name, **labels)

    def dfs_served(self):
        """Requests the DFS owner's data server answered (kvpool_served_ops_total)."""
        status, text = http_get(self.dfs_http, "/metrics")
        assert status == 200, text
        return metric(text, "kvpool_served_ops_total", {"transport": "dfs"})


@pytest.fixture
def dfs_pool(request, tmp_path):
    made = []

    def make(**kw):
        d = tmp_path / f"dfs{len(made)}"
        # never made by kvpool: a missing mount must not become a local directory; this
        # user's, 0700, or refused (test_tier_files.py)
        d.mkdir(mode=0o700)
        p = DfsPool(d, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        for s in p.segments:
            if s.p.returncode is None:
                os.kill(s.pid, signal.SIGCONT)
        p.close()


def client_dfs(c):
    return c.metrics()["client"]["dfs"]


def client_ssd(c):
    return c.metrics()["client"]["ssd"]


def test_dfs_segment_is_named_for_its_directory(dfs_pool):
    p = dfs_pool()
    files = sorted(os.listdir(p.dfs_dir))
    assert files[0] == "kvpool-dfs.id" and files[1].endswith(".kvpdfs"), files
    dir_id = open(os.path.join(p.dfs_dir, "kvpool-dfs.id")).read().strip()
    assert len(dir_id) == 32
    assert p.dfs_name.endswith(f"/dfs/{dir_id}/{files[1]}"), p.dfs_name
    with kvpool.Client(p.addr) as c:
        segs = {s["name"]: s for s in c.stat()["segments"]}
    assert segs[p.dfs_name]["medium"] == "dfs" and segs[p.dfs_name]["size"] == 8 * MiB
    # the CLI: put --dfs, and ls shows where the replicas are
    src = os.path.join(p.dfs_dir, "..", "cli-src")
    with open(src, "wb") as f:
        f.write(os.urandom(5000))
    cli = [p.cli_bin, "--master", p.addr]
    assert subprocess.run(cli + ["put", "--dfs", "cli1", src], timeout=30).returncode == 0
    assert subprocess.run(cli + ["put", "cli2", src], timeout=30).returncode == 0
    out = subprocess.run(cli + ["ls", "--json", "^cli"], capture_output=True, timeout=30)
    assert out.returncode == 0, out.stderr
    media = {k["key"]: k["medium"] for k in json.loads(out.stdout)}
    assert media == {"cli1": "dram+dfs", "cli2": "dram"}, media
    # the master's metrics of the tier
    assert p.master_metric("kvpool_capacity_bytes", tier="dfs") == 8 * MiB
    assert p.master_metric("kvpool_segments", tier="dfs") == 1
    assert p.master_metric("kvpool_objects", tier="dfs") == 1
    assert p.master_metric("kvpool_used_bytes", tier="dfs") == 8 * KiB  # 5000 B, 4 KiB blocks
    assert p.master_metric("kvpool_dfs_puts_total") == 1
    assert p.master_metric("kvpool_dfs_full_total") == 0
    assert p.master_metric("kvpool_capacity_bytes", tier="ssd") == 0
    assert p.master_metric("kvpool_segment_capacity_bytes", segment=p.dfs_name,
                           tier="dfs") == 8 * MiB


def test_get_falls_back_to_the_dfs_replica_when_memory_owner_dies(dfs_pool):
    p = dfs_pool()
    data = os.urandom(300_001)
    with kvpool.Client(p.addr) as c:
        c.put("k1", data, dfs_replica_num=1)
        c.put("plain", b"x" * 1000)  # no DFS replica: gone with its memory
        assert c.get("k1") == data
        assert client_ssd(c)["put"] == {"ops": 1, "bytes": len(data)}  # through the owner
        assert client_ssd(c)["get"]["ops"] == 0  # memory replica read first
    mem = p.segments[-1]
    mem.kill()  # SIGKILL by PID: the memory replica's segment is dead
    deadline = time.monotonic() + 10
    with kvpool.Client(p.addr) as c:
        while True:  # the master drops the dead segment when its connection closes
            try:
                got = c.get("k1")
                break
            except kvpool.Error as e:
                assert time.monotonic() < deadline, e
                time.sleep(0.05)
        assert got == data
        assert client_ssd(c)["get"]["bytes"] >= len(data)
        assert p.master_metric("kvpool_get_hits_total", tier="dfs") >= 1
        with pytest.raises(kvpool.Error) as ei:
            c.get("plain")
        assert ei.value.status in (kvpool.ERR_NOT_FOUND, kvpool.STATUS["KVP_ERR_NO_REPLICA"],
                                   kvpool.STATUS["KVP_ERR_SEGMENT_GONE"])
    p.segments.remove(mem)


def test_client_with_the_directory_reads_and_writes_without_the_owner(dfs_pool, tmp_path):
    p = dfs_pool()
    data = os.urandom(1 * MiB + 17)
    with kvpool.Client(p.addr) as c:
        c.put("k2", data, dfs_replica_num=1)
    served0 = p.dfs_served()
    assert served0 >= 1  # that put's write went through the owner
    mem = p.segments[-1]
    mem.kill()
    p.segments.remove(mem)
    p.add_segment("64MiB")  # memory for new puts
    time.sleep(0.3)
    freeze(p.dfs.pid)  # the DFS owner can serve nothing now
    try:
        with kvpool.Client(p.addr, dfs_path=p.dfs_dir, rpc_timeout_ms=3000) as d:
            assert d.get("k2") == data
            assert client_dfs(d)["get"] == {"ops": 1, "bytes": len(data)}
            assert client_ssd(d)["get"]["ops"] == 0
            other = os.urandom(200_000)
            d.put("k3", other, dfs_replica_num=1)  # written in the shard file by this client
            assert client_dfs(d)["put"] == {"ops": 1, "bytes": len(other)}
            assert d.get("k3") == other
    finally:
        os.kill(p.dfs.pid, signal.SIGCONT)
    assert p.dfs_served() == served0  # nothing of it reached the owner
    # the bytes are in the file: with the memory owner gone, a client without the directory
    # reads k3 through the DFS owner
    mem = p.segments[-1]
    mem.kill()
    p.segments.remove(mem)
    deadline = time.monotonic() + 10
    with kvpool.Client(p.addr) as c:
        while True:
            try:
                assert c.get("k3") == other
                break
            except kvpool.Error as e:
                assert time.monotonic() < deadline, e
                time.sleep(0.05)
        assert client_ssd(c)["get"]["ops"] >= 1 and client_dfs(c)["get"]["ops"] == 0
    assert p.dfs_served() > served0
    # another directory (its own id): the client never takes our files, it reads through
    # the owner
    alien = tmp_path / "alien"
    alien.mkdir(mode=0o700)
    with kvpool.Client(p.addr, dfs_path=str(alien)) as a:
        assert a.get("k2") == data
        assert client_dfs(a)["get"]["ops"] == 0 and client_ssd(a)["get"]["ops"] == 1
    assert os.listdir(alien) == ["kvpool-dfs.id"]


def test_env_var_names_the_directory(dfs_pool, monkeypatch):
    p = dfs_pool()
    data = os.urandom(50_000)
    monkeypatch.setenv("KVPOOL_DFS_PATH", p.dfs_dir)
    with kvpool.Client(p.addr) as c:
        c.put("e1", data, dfs_replica_num=1)
        assert client_dfs(c)["put"]["ops"] == 1
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    monkeypatch.delenv("KVPOOL_DFS_PATH")
    monkeypatch.setenv("MOONCAKE_DFS_ROOT_DIR", p.dfs_dir)
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", p.addr) == 0
    try:
        cfg = ReplicateConfig()
        cfg.dfs_replica_num = 1
        assert s.put("e2", data, cfg) == 0
        assert s.get("e2") == data
        assert client_dfs(s._c)["put"]["ops"] == 1
    finally:
        s.close()


def test_full_dfs_refuses_the_put_and_leaves_nothing(dfs_pool):
    p = dfs_pool(dfs_size="1MiB", master_args=("--dfs-eviction", "off"))
    big = os.urandom(600 * KiB)
    with kvpool.Client(p.addr) as c:
        c.put("f1", big, dfs_replica_num=1)
        with pytest.raises(kvpool.Error) as ei:
            c.put("f2", big, dfs_replica_num=1)
        assert ei.value.status == POOL_FULL, ei.value
        assert "DFS full" in str(ei.value), str(ei.value)
        assert not c.exists("f2")
        with pytest.raises(kvpool.Error) as ei:
            c.get("f2")
        assert ei.value.status == kvpool.ERR_NOT_FOUND
        c.put("f2", big)  # memory still has room: without a DFS replica it fits
        assert c.get("f2") == big and c.get("f1") == big
        # a batch: each key refused alone, nothing stored for it
        st = c.batch_put(["f3", "f4"], [big, big], dfs_replica_num=1)
        assert st == [POOL_FULL, POOL_FULL], st
        assert c.batch_exists(["f3", "f4"]) == [False, False]
        c.remove("f1")  # frees the DFS room
        c.put("f3", big, dfs_replica_num=1)
        assert c.get("f3") == big
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", p.addr) == 0
    try:
        cfg = ReplicateConfig()
        cfg.dfs_replica_num = 1
        assert s.put("f5", big, cfg) == -200  # NO_AVAILABLE_HANDLE, Mooncake's full shard
        assert s.is_exist("f5") == 0
    finally:
        s.close()


def test_refusals(dfs_pool, make_pool):
    p = dfs_pool()
    with kvpool.Client(p.addr) as c:
        for kw in (dict(dfs_replica_num=2), dict(dfs_replica_num=1, medium="ssd")):
            with pytest.raises(kvpool.Error) as ei:
                c.put("r1", b"abc", **kw)
            assert ei.value.status == INVALID, kw
        assert not c.exists("r1")
    from mooncake.store import MooncakeDistributedStore, ReplicateConfig
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", p.addr) == 0
    try:
        cfg = ReplicateConfig()
        cfg.replica_num, cfg.dfs_replica_num = 0, 1  # DFS-only placement
        assert s.put("r2", b"abc", cfg) == -600
        cfg.replica_num, cfg.dfs_replica_num = 1, 2
        assert s.put("r2", b"abc", cfg) == -600
        assert s.is_exist("r2") == 0
    finally:
        s.close()
    with pytest.raises(kvpool.Error) as ei:  # a directory that is not there: said so
        kvpool.Client(p.addr, dfs_path=p.dfs_dir + "/no-such-dir")
    assert ei.value.status == INVALID and "is not a directory" in str(ei.value), ei.value
    plain = make_pool()  # no DFS segment mounted
    with kvpool.Client(plain.addr) as c:
        with pytest.raises(kvpool.Error) as ei:
            c.put("r3", b"abc", dfs_replica_num=1)
        assert ei.value.status == UNSUPPORTED
        assert "no DFS segment" in str(ei.value)
        assert not c.exists("r3")
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "", plain.addr) == 0
    try:
        cfg = ReplicateConfig()
        cfg.dfs_replica_num = 1
        assert s.put("r4", b"abc", cfg) == -1601  # DFS_SERVICE_UNAVAILABLE
    finally:
        s.close()


def test_dfs_owner_restart_brings_its_objects_back(dfs_pool):
    p = dfs_pool()
    blobs = {f"s{i}": os.urandom(10_000 + i * 4099) for i in range(20)}
    with kvpool.Client(p.addr) as c:
        assert c.batch_put(list(blobs), list(blobs.values()), dfs_replica_num=1) == [0] * 20
    wait_recorded(p.master_metric)  # the owner has recorded the entries (RECORD tasks)
    p.dfs.kill()  # kill -9: the master drops the DFS replicas, the memory ones stay
    p.segments.remove(p.dfs)
    with kvpool.Client(p.addr) as c:
        assert c.get("s3") == blobs["s3"]
    p.dfs = p.start_dfs()  # same directory: the same shard file, its objects offered back
    mem = p.segments[0]
    mem.kill()
    p.segments.remove(mem)
    deadline = time.monotonic() + 10
    with kvpool.Client(p.addr) as c:
        for k, v in blobs.items():
            while True:
                try:
                    assert c.get(k) == v
                    break
                except kvpool.Error as e:
                    assert time.monotonic() < deadline, (k, e)
                    time.sleep(0.05)


def test_tenant_quota_counts_dfs_bytes(certs, tmp_path, monkeypatch):
    from test_tenants import PRINCIPALS, TenantMaster, quota_error
    from test_security import _CRED_ENV, close_all
    for var in _CRED_ENV:  # every credential named here (the suite's TLS pass sets them)
        monkeypatch.delenv(var, raising=False)
    m = TenantMaster(certs, str(tmp_path), PRINCIPALS, {"team-a": {"max-ssd": "1MiB"}})
    try:
        m.add_segment("64MiB")
        crt, key = certs.pair(PRINCIPALS["segsrv"]["cn"])
        (tmp_path / "dfs").mkdir(mode=0o700)
        m.segments.append(Proc([_bin("KVPOOL_CLI_BIN"), "--master", m.addr, "--tls-ca", certs.ca,
                                "--tls-cert", crt, "--tls-key", key, "serve", "--segment-size",
                                "0", "--dfs-path", str(tmp_path / "dfs"), "--dfs-size", "8MiB",
                                "--ready-fd", "{fd}"]))
        blob = os.urandom(300 * KiB)
        with m.client("alice") as alice:
            for i in range(3):
                alice.put(f"q{i}", blob, dfs_replica_num=1)
            msg = quota_error(alice.put, "q3", blob, dfs_replica_num=1)
            assert "DFS" in msg and "max-ssd" in msg, msg
            assert not alice.exists("q3")
            alice.put("q3", blob)  # no DFS replica: max-dram has no limit here
            alice.remove("q0")  # refunds its DFS bytes
            alice.put("q4", blob, dfs_replica_num=1)
            assert alice.get("q4") == blob
        # another tenant: its own namespace, nothing of team-a's DFS objects
        with m.client("bob") as bob:
            with pytest.raises(kvpool.Error) as ei:
                bob.get("q4")
            assert ei.value.status == kvpool.ERR_NOT_FOUND
            bob.put("q4", b"bob's", dfs_replica_num=1)  # no quota for team-b
            assert bob.get("q4") == b"bob's"
        with m.client("alice") as alice:
            assert alice.get("q4") == blob
        text = m.metrics()
        assert m.tm("kvpool_tenant_bytes", "team-a", "ssd", text) == 3 * 300 * KiB
        assert m.tm("kvpool_tenant_puts_refused_total", "team-a", text=text) == 1
        assert m.tm("kvpool_tenant_puts_refused_total", "team-b", text=text) == 0
    finally:
        close_all([m])


def test_master_restart_keeps_dfs_replicas(tmp_path):
    """The master killed (kill -9) and started again on its port: the DFS owner mounts again
    and offers its shard's objects; with the memory owner gone meanwhile, the objects are
    read back from DFS, through the owner and in the file."""
    port, http_port = free_port(), free_port()
    argv = [_bin("KVPOOL_MASTER_BIN"), "--listen", f"127.0.0.1:{port}", "--ready-fd", "{fd}",
            "--log-level", "error", *master_security_args(), "--lease-ttl", "0",
            "--http-listen", f"127.0.0.1:{http_port}"]
    cli = _bin("KVPOOL_CLI_BIN")
    d = tmp_path / "dfs"
    d.mkdir(mode=0o700)
    procs = [Proc(argv)]
    addr = procs[0].ready
    try:
        dfs = Proc([cli, "--master", addr, "serve", "--segment-size", "0", "--dfs-path", str(d),
                    "--dfs-size", "8MiB", "--ready-fd", "{fd}"])
        mem = Proc([cli, "--master", addr, "serve", "--segment-size", "32MiB", "--ready-fd",
                    "{fd}"])
        procs = [mem, dfs] + procs
        blobs = {f"h{i}": os.urandom(30_000 + i) for i in range(8)}
        with kvpool.Client(addr) as c:
            assert c.batch_put(list(blobs), list(blobs.values()), dfs_replica_num=1) == [0] * 8
        wait_recorded(lambda name: master_metric_at(http_port, name))  # recorded by the owner
        procs[-1].kill()
        mem.kill()  # the memory replicas are gone for good
        procs[-1] = Proc(argv)
        deadline = time.monotonic() + 30
        with kvpool.Client(addr) as c, kvpool.Client(addr, dfs_path=str(d)) as direct:
            for k, v in blobs.items():
                while True:
                    try:
                        assert c.get(k) == v
                        break
                    except kvpool.Error as e:  # the owner remounting and offering
                        assert time.monotonic() < deadline, (k, e)
                        time.sleep(0.1)
                assert direct.get(k) == v
            assert client_dfs(direct)["get"]["ops"] == len(blobs)
            assert client_ssd(c)["get"]["ops"] == len(blobs)
    finally:
        for p in procs:
            p.kill()


def test_dfs_write_that_fails_leaves_no_object(dfs_pool):
    """The DFS owner stopped (SIGSTOP) under a client without the directory: its DFS write
    times out, the put fails, and the key is absent (the memory replica written alone is not
    kept: a put asked with a DFS replica is stored with it or not at all)."""
    p = dfs_pool()
    data = os.urandom(100_000)
    with kvpool.Client(p.addr, rpc_timeout_ms=1500) as c:
        c.put("w0", b"warm", dfs_replica_num=1)  # the connection to the owner is made
        freeze(p.dfs.pid)
        try:
            with pytest.raises(kvpool.Error) as ei:
                c.put("w1", data, dfs_replica_num=1)
            # the master revoked it at PutEnd (the DFS replica not written): KVP_ERR_IO
            assert ei.value.status == kvpool.STATUS["KVP_ERR_IO"], ei.value
            assert "timed out" in str(ei.value)
        finally:
            os.kill(p.dfs.pid, signal.SIGCONT)
        assert not c.exists("w1")
        with pytest.raises(kvpool.Error) as ei:
            c.get("w1")
        assert ei.value.status == kvpool.ERR_NOT_FOUND
        c.put("w1", data, dfs_replica_num=1)  # the owner back: the same put succeeds
        assert c.get("w1") == data


def test_dram_eviction_keeps_the_dfs_replica(dfs_pool):
    """DRAM full: an object with a DFS replica loses only its memory one (it stays, on DFS
    only, and reads back); objects without one are evicted."""
    p = dfs_pool(dfs_size="32MiB", memory=("8MiB",))
    keep = os.urandom(1 * MiB)
    with kvpool.Client(p.addr) as c:
        c.put("keep", keep, dfs_replica_num=1)
        for i in range(24):  # 3x the DRAM segment: the oldest go
            c.put(f"fill{i}", os.urandom(1 * MiB))
        assert not c.exists("fill0")
        listed = {k["key"]: k for k in c.list_keys("^keep$")}
        dfs_id = {s["id"] for s in c.stat()["segments"] if s["medium"] == "dfs"}
        assert set(listed["keep"]["segment_ids"]) == dfs_id, listed  # on DFS only now
        ssd0 = client_ssd(c)["get"]["ops"]
        assert c.get("keep") == keep
        assert client_ssd(c)["get"]["ops"] == ssd0 + 1  # read from DFS (through its owner)


def test_full_dfs_evicts_least_recently_used(dfs_pool):
    """DFS eviction (on by default, Mooncake's MOONCAKE_DFS_EVICTION_ENABLED): DFS puts into a
    full DFS succeed; objects on DFS only (DRAM evicted them) go, least recently used first;
    objects with a memory replica lose their DFS copy only and read back byte-exact."""
    p = dfs_pool(dfs_size="4MiB", memory=("8MiB",))
    with kvpool.Client(p.addr) as c:
        dfs_id = {s["id"] for s in c.stat()["segments"] if s["medium"] == "dfs"}
        old = {f"a{i}": os.urandom(1 * MiB - 4 * KiB) for i in range(3)}
        for k, v in old.items():
            c.put(k, v, dfs_replica_num=1)
        fill = {f"fill{i}": os.urandom(1 * MiB) for i in range(12)}
        for k, v in fill.items():  # DRAM evicts a0..a2: on DFS only now
            c.put(k, v)
        for k in old:
            listed = {x["key"]: x for x in c.list_keys(f"^{k}$")}
            assert set(listed[k]["segment_ids"]) == dfs_id, listed
        assert c.get("a1") == old["a1"]  # read: a1 is more recent than a0 and a2
        new = {f"b{i}": os.urandom(1 * MiB - 4 * KiB) for i in range(6)}
        ks = list(new)
        for k in ks[:2]:  # b0 passes the high watermark (0.9): down to 0.7, a0 and a2 go
            c.put(k, new[k], dfs_replica_num=1)
        assert [c.exists(k) for k in old] == [False, True, False]  # DFS only, LRU first
        assert c.get("a1") == old["a1"]
        for k in ks[2:]:
            c.put(k, new[k], dfs_replica_num=1)  # never POOL_FULL: the DFS makes room
        assert p.master_metric("kvpool_dfs_full_total") == 0
        assert p.master_metric("kvpool_dfs_evicted_objects_total") >= 2
        assert p.master_metric("kvpool_dfs_evictions_total") > \
            p.master_metric("kvpool_dfs_evicted_objects_total")  # copies of DRAM objects too
        with pytest.raises(kvpool.Error) as ei:
            c.get("a0")
        assert ei.value.status == kvpool.ERR_NOT_FOUND
        on_dfs = 0
        for k, v in new.items():  # all still there: in memory, some on DFS as well
            listed = {x["key"]: x for x in c.list_keys(f"^{k}$")}
            segs = set(listed[k]["segment_ids"])
            assert segs - dfs_id, (k, listed)  # a memory replica kept
            on_dfs += bool(segs & dfs_id)
            assert c.get(k) == v
        assert 0 < on_dfs < len(new), on_dfs  # the newest keep their DFS copy, the oldest lost it


def _wait_get(c, key, timeout=10):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return c.get(key)
        except kvpool.Error as e:
            assert time.monotonic() < deadline, (key, e)
            time.sleep(0.05)


def _on_dfs_only(p, prefix, n, size):
    """Objects put with a DFS replica (recorded by its owner), then their memory segment
    killed: on DFS only. Returns {key: bytes}."""
    data = {f"{prefix}{i}": os.urandom(size + i * 4099) for i in range(n)}
    with kvpool.Client(p.addr) as c:
        for k, v in data.items():
            c.put(k, v, dfs_replica_num=1)
    wait_recorded(p.master_metric)  # the owner has recorded the entries (RECORD tasks)
    mem = p.segments[-1]
    mem.kill()  # the memory replicas go
    p.segments.remove(mem)
    return data


def _shard_locked(path):
    """Does a live process hold the shard file (its owner's flock)?"""
    import fcntl
    with open(path, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
        return False


def test_dfs_owner_killed_objects_stay_and_a_new_owner_takes_over(dfs_pool):
    """The DFS owner killed by PID: its segment stays, ownerless, for --segment-grace; a
    client with the directory still reads its DFS-only objects in the shard file; a client
    without it gets an error (no owner to read through). The next `kvpool serve --dfs-path`
    of the directory takes the free shard file over: the objects are handed to it, read
    through it, and new DFS puts go there. Two owners never hold one shard file."""
    p = dfs_pool()
    shard = os.path.join(p.dfs_dir, p.dfs_name.rsplit("/", 1)[1])
    assert _shard_locked(shard)  # its owner holds it
    data = _on_dfs_only(p, "o", 6, 50_000)
    with kvpool.Client(p.addr, dfs_path=p.dfs_dir) as c:
        assert _wait_get(c, "o0") == data["o0"]
    p.dfs.kill()  # kill -9 the DFS owner
    p.segments.remove(p.dfs)
    deadline = time.monotonic() + 10
    while p.master_metric("kvpool_dfs_orphaned_total") != 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not _shard_locked(shard)  # free: the next owner may take it
    with kvpool.Client(p.addr, dfs_path=p.dfs_dir) as c:
        dfs0 = client_dfs(c)["get"]["ops"]
        for k, v in data.items():  # in the shard file, no owner needed
            assert c.get(k) == v
        assert client_dfs(c)["get"]["ops"] == dfs0 + len(data)
        assert c.exists("o1")
    with kvpool.Client(p.addr) as c:  # no directory: nobody to read through
        with pytest.raises(kvpool.Error) as ei:
            c.get("o1")
        assert ei.value.status == kvpool.STATUS["KVP_ERR_CONNECT"], ei.value  # its owner's
        assert "cannot connect" in str(ei.value), str(ei.value)
        assert c.exists("o1")  # still an object: it comes back with an owner
        with pytest.raises(kvpool.Error) as ei:  # no owner: no new DFS replica there
            c.put("n0", b"n" * 1000, dfs_replica_num=1)
        assert ei.value.status in (POOL_FULL, UNSUPPORTED), ei.value
    # a new owner of the directory (another node in production): it takes the free shard over
    p.dfs = p.start_dfs()
    assert p.dfs_name.endswith("/" + os.path.basename(shard)), p.dfs_name
    assert _shard_locked(shard)
    assert p.master_metric("kvpool_dfs_taken_over_total") == len(data)
    p.add_segment("64MiB")
    with kvpool.Client(p.addr) as c:  # through the new owner
        for k, v in data.items():
            assert _wait_get(c, k) == v
        c.put("n0", b"n" * 1000, dfs_replica_num=1)  # new DFS puts work again
        assert c.get("n0") == b"n" * 1000
        segs = {s["name"] for s in c.stat()["segments"] if s["medium"] == "dfs"}
        assert segs == {p.dfs_name}, segs  # the ownerless one is gone
    assert p.master_metric("kvpool_adopt_refused_total") in (0, None)
    # a second owner beside it never opens the same shard file: it makes one of its own
    owner = p.dfs_name
    other = p.start_dfs()
    assert other.lines[0] != owner
    assert other.lines[0].rsplit("/", 1)[1] != os.path.basename(shard)
    assert _shard_locked(shard)
    with kvpool.Client(p.addr) as c:
        assert c.get("o2") == data["o2"]


def test_ownerless_dfs_segment_goes_after_the_grace(dfs_pool):
    p = dfs_pool(master_args=("--segment-grace", "1"))
    v = os.urandom(40_000)
    with kvpool.Client(p.addr) as c:
        c.put("g1", v, dfs_replica_num=1)
    mem = p.segments[-1]
    mem.kill()
    p.segments.remove(mem)
    p.dfs.kill()
    p.segments.remove(p.dfs)
    with kvpool.Client(p.addr, dfs_path=p.dfs_dir) as c:
        assert _wait_get(c, "g1") == v  # within the grace: read in the file
        deadline = time.monotonic() + 10
        while c.exists("g1"):  # past it: the segment is unmounted, the object gone
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with pytest.raises(kvpool.Error) as ei:
            c.get("g1")
        assert ei.value.status == kvpool.ERR_NOT_FOUND


def test_another_principal_never_takes_a_shard_over(certs, tmp_path, monkeypatch):
    """With an ACL: the DFS owner (principal segsrv) killed; another principal's serve of the
    same directory (segthief, team-b) opens the free shard file but is handed none of the
    objects; segsrv's next serve is, and team-a's client reads them byte-exact."""
    from test_tenants import PRINCIPALS, TenantMaster
    from test_security import _CRED_ENV, close_all
    for var in _CRED_ENV:
        monkeypatch.delenv(var, raising=False)
    m = TenantMaster(certs, str(tmp_path), PRINCIPALS, {})
    m.metric = lambda name: metric(m.metrics(), name)
    dfs_dir = tmp_path / "dfs"
    dfs_dir.mkdir(mode=0o700)

    def serve(who):
        crt, key = certs.pair(PRINCIPALS[who]["cn"])
        s = Proc([_bin("KVPOOL_CLI_BIN"), "--master", m.addr, "--tls-ca", certs.ca,
                  "--tls-cert", crt, "--tls-key", key, "serve", "--segment-size", "0",
                  "--dfs-path", str(dfs_dir), "--dfs-size", "8MiB", "--ready-fd", "{fd}"])
        m.segments.append(s)
        return s

    try:
        m.add_segment("64MiB")
        owner = serve("segsrv")
        blobs = {f"t{i}": os.urandom(30_000 + i * 777) for i in range(4)}
        with m.client("alice") as alice:
            for k, v in blobs.items():
                alice.put(k, v, dfs_replica_num=1)
        wait_recorded(m.metric)  # RECORD tasks
        owner.kill()
        m.segments.remove(owner)
        deadline = time.monotonic() + 10
        while m.metric("kvpool_dfs_orphaned_total") != 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        shard = owner.lines[0].rsplit("/", 1)[1]
        thief = serve("segthief")
        assert thief.lines[0].endswith("/" + shard), thief.lines  # the free file: opened
        assert m.metric("kvpool_dfs_taken_over_total") == 0  # but not its principal's
        thief.kill()
        m.segments.remove(thief)
        serve("segsrv")  # its own principal: the objects are handed over
        deadline = time.monotonic() + 10
        while m.metric("kvpool_dfs_taken_over_total") != len(blobs):
            assert time.monotonic() < deadline, m.metric("kvpool_dfs_taken_over_total")
            time.sleep(0.05)
        with m.client("alice") as alice:
            for k, v in blobs.items():
                assert alice.get(k) == v
    finally:
        close_all([m])


def test_a_serve_on_another_node_takes_the_shard_over(dfs_pool):
    """The DFS owner of node "nodeb" (its own host name, shard-nodeb-0) killed: a serve on this
    node finds that free shard file in the directory and takes it over."""
    if subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs unshare --uts (root) to give a serve another host name")
    p = dfs_pool(node="nodeb")
    assert p.dfs_name.endswith("/shard-nodeb-0.kvpdfs"), p.dfs_name
    data = _on_dfs_only(p, "n", 5, 20_000)
    p.dfs.kill()
    p.segments.remove(p.dfs)
    deadline = time.monotonic() + 10
    while p.master_metric("kvpool_dfs_orphaned_total") != 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    p.dfs = p.start_dfs()  # this node's serve
    assert p.dfs_name.endswith("/shard-nodeb-0.kvpdfs"), p.dfs_name
    assert p.master_metric("kvpool_dfs_taken_over_total") == len(data)
    with kvpool.Client(p.addr) as c:  # no directory: through the new owner
        for k, v in data.items():
            assert _wait_get(c, k) == v


def test_dfs_owner_back_after_silence_takes_its_segment_back(dfs_pool):
    """The DFS owner frozen (SIGSTOP) past --client-ttl: the master drops its connection and
    keeps the segment ownerless; resumed (SIGCONT), the owner mounts again under the same
    name and takes its segment back (not refused as a name already mounted)."""
    p = dfs_pool(master_args=("--client-ttl", "1"))
    data = _on_dfs_only(p, "z", 4, 10_000)
    os.kill(p.dfs.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 15
    while p.master_metric("kvpool_dfs_orphaned_total") != 1:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.kill(p.dfs.pid, signal.SIGCONT)
    deadline = time.monotonic() + 15
    while p.master_metric("kvpool_dfs_taken_over_total") != len(data):
        assert time.monotonic() < deadline, p.master_metric("kvpool_dfs_taken_over_total")
        time.sleep(0.1)
    with kvpool.Client(p.addr) as c:  # through its owner again
        segs = [s for s in c.stat()["segments"] if s["medium"] == "dfs"]
        assert [s["name"] for s in segs] == [p.dfs_name], segs
        for k, v in data.items():
            assert _wait_get(c, k) == v
