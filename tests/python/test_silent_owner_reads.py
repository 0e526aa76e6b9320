"""Reads of a segment whose owner fell silent and came back.

A segment whose owner stops answering for --client-ttl is dropped, and with it the read
leases on its objects; a reader on the owner's host reads through the owner's memory it
mapped (shm), which the owner keeps. When the owner mounts that memory again (a new segment
under the same name, its room free to the master), nothing new may be placed there before
the reads the drop cut short are over, or such a reader copies another object's bytes and,
reading a range (no CRC over a part), reports them as the object's.

Real processes only: kvpool-master (its /metrics on an HTTP port of its own), two `kvpool
serve` owners on 127.0.0.1, library clients here; the owner is frozen with SIGSTOP and
thawed by the PID we started.
"""

import os
import signal
import time

import kvpool
from conftest import free_port, freeze, master_metrics, metric

MiB = 1 << 20


def test_a_read_cut_short_by_a_drop_never_sees_the_next_objects_bytes(make_pool):
    """A reader holds a get session (a 4 s lease) on object A of owner S and reads a range
    of it through the memory it mapped; S is frozen until the master drops it (--client-ttl
    1), A is put again on the other owner (so S's record of the old A is not taken back),
    and S, thawed, mounts its memory again. Objects put on S then (preferred there) must not
    land where the old A was while the reader's lease runs: the session's range reads the
    old A's bytes (or fails), never theirs."""
    http = free_port()
    pool = make_pool(segments=("8MiB", "8MiB"),
                     master_args=("--lease-ttl", "4", "--client-ttl", "1", "--segment-grace",
                                  "0", "--http-listen", f"127.0.0.1:{http}"))
    segs = lambda: metric(master_metrics(http), "kvpool_segments", {"tier": "dram"})  # noqa: E731
    s, other = pool.segments
    a = b"A" * MiB
    with kvpool.Client(pool.addr) as w, kvpool.Client(pool.addr, transport="shm") as r:
        w.put("A", a, preferred_segment=s.ready)
        assert r.get_session_start(["A"]) == [0]
        buf = bytearray(4096)
        assert r.get_session_ranges(["A"], [[buf]], [[0]]) == [4096]
        assert bytes(buf) == a[:4096]
        freeze(s.pid)
        try:
            deadline = time.monotonic() + 10
            while segs() != 1:
                assert time.monotonic() < deadline, "the silent owner was not dropped"
                time.sleep(0.05)
            w.put("A", b"a" * MiB, preferred_segment=other.ready)
        finally:
            os.kill(s.pid, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while segs() != 2:
            assert time.monotonic() < deadline, "the owner did not mount again"
            time.sleep(0.05)
        time.sleep(1.0)  # past the quiet of any remount (500 ms): the reader's lease runs on
        for i in range(6):  # each lands elsewhere while S takes nothing new, or on S after
            w.put(f"B{i}", b"B" * MiB, preferred_segment=s.ready)
        buf = bytearray(4096)
        got = r.get_session_ranges(["A"], [[buf]], [[0]])
        assert got[0] < 0 or bytes(buf) == a[:4096], (got, bytes(buf[:8]))
        r.get_session_end(["A"])
