"""The SSD and DFS tiers' files on disk are this user's alone (docs/operations.md, "SSD
segments" and "DFS segments"; common/private_path.h): what `kvpool serve --ssd-path` / `--dfs-path` creates is mode
0600 whatever the umask, and an existing file or directory that its group or others may
read or write is refused at start, named with the fix, and left untouched, as the DRAM
segment's --segment-file is.

The reported attack: the SSD segment file and the DFS shard files were created 0644, and
uid 65534 read a tenant's bytes from both. Everything runs for real on 127.0.0.1 (a
kvpool-master, `kvpool serve` processes stopped by their PIDs):
 1. SSD: a serve started with umask 0 creates its file 0600 (as root: uid 65534 cannot
    read it); stopped and the file chmod 644 (and 640, 604), a serve is refused, naming the
    file and `chmod 600 FILE`, the file unchanged; chmod 600, the next serve brings the
    objects back;
 2. DFS: with umask 0, the id file and the shard file are 0600 and no temporary file is
    left, the directory stays 0700, for puts through the owner and written in place by a
    client with the directory; a directory its group or others may use is refused to a
    serve and to a client (`chmod 700 DIR`), nothing made in a new one; a looser id file or
    shard file in a 0700 directory is refused (`chmod 600 FILE`); fixed, both start again.
"""

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import time

import pytest

import kvpool
from conftest import Proc, free_port, master_metric_at, wait_recorded
from test_dfs import DfsPool

MiB = 1024 * 1024
DENIED = kvpool.ERR_DENIED


@contextlib.contextmanager
def umask(mask):
    """The umask of this process, so of the children it starts meanwhile."""
    was = os.umask(mask)
    try:
        yield
    finally:
        os.umask(was)


def mode(path):
    return stat.S_IMODE(os.stat(path).st_mode)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def refused(argv, *wanted):
    """Run a serve that must not start: its stderr, which says each of wanted."""
    r = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
    err = r.stderr.decode()
    assert r.returncode != 0, f"{argv} started: {err}"
    for w in wanted:
        assert w in err, f"{w!r} not in {err!r}"
    return err


def nobody_reads(path):
    """As root with setpriv: uid 65534 (nobody) cannot open path. Else nothing checked."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return
    r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                        "cat", path], capture_output=True, timeout=30)
    assert r.returncode != 0 and b"Permission denied" in r.stderr, (r.returncode, r.stderr)


@pytest.fixture
def open_dir():
    """A directory others may pass through (0711, outside pytest's 0700 tree), so that only
    the file's own mode keeps uid 65534 out."""
    d = tempfile.mkdtemp(prefix="kvpool-tier-")
    os.chmod(d, 0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_ssd_file_is_private_and_a_looser_one_is_refused(make_pool, open_dir):
    http_port = free_port()
    p = make_pool(segments=(), master_args=("--lease-ttl", "0", "--http-listen",
                                            f"127.0.0.1:{http_port}"))
    path = os.path.join(open_dir, "seg.kvpssd")
    argv = [p.cli_bin, "--master", p.addr, "serve", "--segment-size", "0", "--ssd-path", path,
            "--ssd-size", "8MiB", "--ssd-buffered-io"]
    with umask(0):
        owner = Proc([*argv, "--ready-fd", "{fd}"])
    p.segments.append(owner)
    data = {f"tier/ssd/{i}": os.urandom(100_000 + i) for i in range(4)}
    with kvpool.Client(p.addr, transport="tcp") as c:
        for k, v in data.items():
            c.put(k, v, medium="ssd")
    assert mode(path) == 0o600, oct(mode(path))
    nobody_reads(path)
    wait_recorded(lambda name: master_metric_at(http_port, name))  # RECORD tasks answered
    assert owner.stop() == 0
    p.segments.remove(owner)

    before = digest(path)
    for loose in (0o644, 0o640, 0o604):
        os.chmod(path, loose)
        refused(argv, f"{path} may be read or written by others (mode {loose:04o}",
                f"mode 0600 or narrower (chmod 600 {path})")
        assert mode(path) == loose and digest(path) == before  # untouched
    os.chmod(path, 0o600)
    p.segments.append(Proc([*argv, "--ready-fd", "{fd}"]))
    deadline = time.monotonic() + 10
    with kvpool.Client(p.addr, transport="tcp") as c:  # its objects offered back
        for k, v in data.items():
            while True:
                try:
                    assert c.get(k) == v
                    break
                except kvpool.Error as e:
                    assert time.monotonic() < deadline, (k, e)
                    time.sleep(0.05)


def test_dfs_files_are_private_and_looser_ones_are_refused(tmp_path):
    d = tmp_path / "dfs"
    d.mkdir(mode=0o700)
    with umask(0):
        p = DfsPool(d, memory=("16MiB",))
    try:
        payload = os.urandom(300_000)
        with umask(0):
            with kvpool.Client(p.addr) as c:  # through the DFS owner
                c.put("tier/dfs/owner", payload, dfs_replica_num=1)
            with kvpool.Client(p.addr, dfs_path=str(d)) as c:  # in the shard file itself
                c.put("tier/dfs/direct", payload, dfs_replica_num=1)
                assert c.metrics()["client"]["dfs"]["put"]["ops"] == 1
        names = sorted(os.listdir(d))
        shard = p.dfs_name.rsplit("/", 1)[1]
        assert names == ["kvpool-dfs.id", shard], names  # no temporary file left
        for n in names:
            assert mode(d / n) == 0o600, (n, oct(mode(d / n)))
        assert mode(d) == 0o700

        argv = [p.cli_bin, "--master", p.addr, "serve", "--segment-size", "0", "--dfs-path",
                str(d), "--dfs-size", "8MiB"]
        # the directory: a serve and a client refuse it as long as others may use it
        for loose in (0o750, 0o705, 0o777):
            os.chmod(d, loose)
            refused(argv, f"DFS directory {d} may be read or written by others",
                    f"mode 0700 or narrower (chmod 700 {d})")
            with pytest.raises(kvpool.Error) as e:
                kvpool.Client(p.addr, dfs_path=str(d))
            assert e.value.status == DENIED and f"chmod 700 {d}" in str(e.value), e.value
        os.chmod(d, 0o700)
        # the files kvpool keeps there
        for name in ("kvpool-dfs.id", shard):
            f = d / name
            before = digest(f)
            os.chmod(f, 0o644)
            refused(argv, f"DFS file {f} may be read or written by others (mode 0644",
                    f"mode 0600 or narrower (chmod 600 {f})")
            with pytest.raises(kvpool.Error) as e:
                kvpool.Client(p.addr, dfs_path=str(d))
            assert e.value.status == DENIED and f"chmod 600 {f}" in str(e.value), e.value
            assert mode(f) == 0o644 and digest(f) == before
            os.chmod(f, 0o600)
        assert sorted(os.listdir(d)) == names  # nothing made meanwhile

        # a new directory others may read: nothing is made in it
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        os.chmod(fresh, 0o755)
        refused([*argv[:-4], "--dfs-path", str(fresh), "--dfs-size", "8MiB"],
                f"chmod 700 {fresh}")
        assert os.listdir(fresh) == []

        # fixed: a second owner starts (its own shard, 0600) and reads back what is there
        with umask(0):
            second = Proc([*argv, "--ready-fd", "{fd}"])
        p.segments.append(second)
        for n in os.listdir(d):
            assert mode(d / n) == 0o600, (n, oct(mode(d / n)))
        with kvpool.Client(p.addr, dfs_path=str(d)) as c:
            assert c.get("tier/dfs/owner") == payload
            assert c.get("tier/dfs/direct") == payload
    finally:
        os.chmod(d, 0o700)
        bad = p.close()
    assert not bad, f"children exited non-zero: {bad}"
