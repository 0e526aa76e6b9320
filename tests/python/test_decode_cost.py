"""Protobuf amplification in a large request (issue 45, an untried surface): a request
near the frame limit made mostly of unknown fields, of empty repeated entries (keys, Adopt
entries) or of empty sub-messages must not make the master allocate far more than the
frame's size, nor stall its loop; nor may a small one whose decode is quadratic (one
singular sub-message sent 40 000 times: protobuf-c merges each into the one before).
Before the fix a 60 MB Exist of empty keys took the
master's peak RSS to 1.5 GB, one of unknown fields to 1.9 GB and 4 s of loop, an Adopt of
empty entries to 3.6 GB and 8 s.

The master walks the body's fields before protobuf-c decodes it (master/auth/decode_cost.h)
and refuses what would decode into more than 16 MiB + 2 x the body, or carries more than
1024 unknown fields: KVP_ERR_TOO_MANY with why, counted
kvpool_requests_refused_total{reason="decode_cost"}. Checked: the master's peak RSS
(VmHWM) grows by little more than the frames it buffers, a client of another principal is
answered within 1 s throughout and reads its bytes exact, and a request just inside the
budget is still decoded and answered.

Both passes: in the suite's TLS pass the attacker is a principal with a certificate (the
admin's: Adopt needs the segment role), else a plain connection.
"""
import os
import threading
import time

import kvpool
from conftest import metric
from test_admission import Master
from test_security import frame, read_frame

M_HEARTBEAT, M_EXIST, M_ADOPT, M_PUT_START = 12, 8, 20, 4
ERR_TOO_MANY = -23
MiB = 1 << 20
BODY = 60 * MiB  # near the frame limit (64 MiB)


def hwm_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


class Canary:
    """Another principal's gets, timed, in a thread until stop()."""

    def __init__(self, client, key, data):
        self.c, self.key, self.data = client, key, data
        self.worst, self.n, self.bad = 0.0, 0, []
        self._stop = threading.Event()
        self.t = threading.Thread(target=self._run)
        self.t.start()

    def _run(self):
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                ok = self.c.get(self.key) == self.data
            except Exception as e:  # noqa: BLE001 (reported below)
                ok, self.bad = False, self.bad + [repr(e)]
            self.worst = max(self.worst, time.monotonic() - t0)
            self.n += 1
            if not ok:
                self.bad.append("wrong bytes")
            self._stop.wait(0.02)

    def stop(self):
        self._stop.set()
        self.t.join(30)


def test_amplifying_bodies_are_refused_before_decoding(make_pool):
    m = Master(make_pool)
    key, data = "dc/canary", os.urandom(100_000)
    varint1 = bytes([15 << 3 | 0, 1])  # an unknown varint field (number 15): 2 bytes
    attacks = [
        ("Heartbeat of unknown fields", M_HEARTBEAT, varint1 * (BODY // 2)),
        ("Exist of empty keys", M_EXIST, bytes([1 << 3 | 2, 0]) * (BODY // 2)),
        ("Adopt of empty entries", M_ADOPT, bytes([2 << 3 | 2, 0]) * (BODY // 2)),
        # a small one: a singular sub-message (PutConfig, one avoid_segments) 40 000 times,
        # merged into the one before each time (k^2)
        ("PutStart of one PutConfig 40 000 times", M_PUT_START,
         bytes([3 << 3 | 2, 2, 7 << 3 | 0, 1]) * 40000),
        # a few unknown fields carrying most of the frame: one copy of their bytes, no more
        ("Exist of 8 big unknown fields", M_EXIST,
         (bytes([15 << 3 | 2]) + bytes([0x80, 0x80, 0x80, 0x3]) + bytes(6 * MiB)) * 8),
    ]
    refused = 3 * (len(attacks) - 1)
    with kvpool.Client(m.addr, rpc_timeout_ms=3000) as alice:
        alice.put(key, data)
        s = m.authenticated("127.0.0.3")
        assert s is not None
        base = hwm_kib(m.pid)
        canary = Canary(alice, key, data)
        try:
            answers = []
            for name, method, body in attacks:
                for i in range(3):
                    s.sendall(frame(method, body, req_id=i + 1))
                    r = read_frame(s)
                    assert r is not None, f"{name}: the master closed the connection"
                    answers.append((name, r[1], r[2][:160]))
        finally:
            canary.stop()
        grown = (hwm_kib(m.pid) - base) / 1024
        print(f"decode_cost: peak RSS +{grown:.0f} MiB, {canary.n} gets, the slowest "
              f"{canary.worst * 1000:.0f} ms")
        for name, status, why in answers[:refused]:
            assert status == ERR_TOO_MANY, (name, status, why)
            assert b"refused before decoding" in why, why
        # the last attack fits the budget: decoded (unknown fields copied once), answered
        for name, status, why in answers[refused:]:
            assert status == 0, (name, status, why)
        # what it buffers (one 60 MB frame at a time) and a copy of the big fields, no more
        assert grown < 200, f"the master's peak RSS grew by {grown:.0f} MiB"
        assert not canary.bad, canary.bad
        assert canary.n >= 5 and canary.worst < 1.0, \
            f"{canary.n} gets, the slowest {canary.worst:.2f} s"
        assert metric(m.metrics(), "kvpool_requests_refused_total",
                      {"reason": "decode_cost"}) == refused
        # the connection and the master still serve
        s.sendall(frame(1))
        assert read_frame(s)[1] == 0
        s.close()
        assert alice.get(key) == data
