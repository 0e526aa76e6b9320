"""Authority follows the connection and the principal, not a number (issue 45, rows 3, 7
and 11). Played as the issue played them, against a master with TLS 1.3 and an ACL of two
tenants (team-a: alice; team-b: bob, and bobseg with only the segment role), an admin, and
a shared owner from `kvpool serve` (principal segsrv):

 3. bobseg reads the owner's client id (from its own Stat, and, to show the principal is
    checked and not only the number, from an admin's) and subscribes to the owner's record
    (SegRecord): refused NOT_OWNER, counted {reason="record"}, no change streamed to it;
    the owner keeps its stream: after a kill -9 of the master, every object alice put after
    the attack comes back from the owner's record and reads exact;
 7. bobseg mounts a segment advertising the owner's tcp endpoint (as written, and as
    localhost, 127.1, an IPv4-mapped IPv6), or its shm path: refused DENIED, counted
    {reason="endpoint"}; alice's puts all succeed;
11. the owner is cut off (frozen past --client-ttl): bobseg mounts with its name, host id
    and shm path (as an admin's Stat shows them) and offers an empty Adopt: refused DENIED,
    counted {reason="held"}; so is a mount elsewhere that claims the owner's endpoint while
    the master holds it; alice's get is a miss meanwhile, never bobseg's bytes; the owner
    thaws, mounts again and takes its objects back: alice reads her bytes.

And what a principal is handed: Stat gives a non-admin who did not mount a segment no
client id, host id, shm path or rdma address; Heartbeat gives bobseg no other owner's
descriptor, and alice the owner's without its client id; the owner's principal and an
admin still see it.

Raw protocol from Python (test_security's framing, test_data_grants' protobuf reader and
masters): every attack here is a request the library never sends.
"""
import os
import signal
import socket
import uuid

import pytest

import kvpool
from conftest import free_port, freeze, metric
from test_data_grants import GrantMaster, pb
from test_security import (PRINCIPALS, certs, close_all, frame,  # noqa: F401
                           no_ambient_credentials, poll, read_frame, tls_client_ctx,
                           tls_connect, varint)

DENIED = kvpool.ERR_DENIED
NOT_OWNER = kvpool.ERR_NOT_OWNER
M_MOUNT, M_STAT, M_HEARTBEAT, M_ADOPT, M_SEG_RECORD = 2, 11, 12, 20, 21
RESPONSE_BIT = 0x8000

# the principals: alice (team-a), bob (team-b), bobseg (team-b, segment role only;
# its certificate is make-certs.sh's segthief), the admin and the shared owner segsrv
AUTH_PRINCIPALS = {name: PRINCIPALS[name] for name in ("admin", "segsrv", "alice", "bob")}
AUTH_PRINCIPALS["bobseg"] = dict(tenant="team-b", roles="segment", cn="segthief")


# ---- protobuf writer (enough for Mount, Heartbeat, Adopt, SegRecord) ----

def f_varint(num, v):
    return varint(num << 3) + varint(v & 0xFFFFFFFFFFFFFFFF)


def f_bytes(num, b):
    b = b.encode() if isinstance(b, str) else b
    return varint(num << 3 | 2) + varint(len(b)) + b


def int32(v):
    """A decoded int32 (protobuf sends negatives as 10-byte varints)."""
    return v - (1 << 64) if v >= 1 << 63 else v


def seg_desc(name, endpoint, host_id="bobseg-host", shm_path="", size=1 << 20):
    return (f_bytes(2, name) + f_bytes(3, "dram") + f_varint(4, size) + f_bytes(6, host_id)
            + f_bytes(7, endpoint) + (f_bytes(8, shm_path) if shm_path else b""))


def mount_body(desc, client_id=0xB0B5E6, adopting=False):
    return f_varint(1, client_id) + f_bytes(2, desc) + (f_varint(3, 1) if adopting else b"")


# ---- raw connections ----

def raw(m, who):
    """A raw TLS control connection of principal `who` (a certificate principal)."""
    crt, key = m.certs.pair(AUTH_PRINCIPALS[who]["cn"])
    return tls_connect(m, tls_client_ctx(m.certs.ca, crt, key))


def call(s, method, body=b"", req_id=7):
    """One request on s: the decoded response body (the frame status must be 0)."""
    s.sendall(frame(method, body, req_id=req_id))
    r = read_frame(s)
    assert r is not None, f"method {method}: no answer"
    assert r[0] == method | RESPONSE_BIT and r[1] == 0, r
    return pb(r[2])


def status_of(resp):
    return int32(resp.get(1, [0])[0])


def stat_segments(m, who):
    """{segment id: its SegmentDesc fields} of `who`'s Stat."""
    with raw(m, who) as s:
        resp = call(s, M_STAT)
    out = {}
    for ss in resp.get(6, []):
        d = pb(pb(ss)[1][0])
        out[d[1][0]] = d
    return out


def beat_segments(m, who):
    """{segment id: its SegmentDesc fields} of the segments `who`'s Heartbeat hands out."""
    with raw(m, who) as s:
        resp = call(s, M_HEARTBEAT, f_varint(1, 42))
    return {pb(d)[1][0]: pb(d) for d in resp.get(5, [])}


def the_owner(m):
    """The shared owner's segment as an admin's Stat shows it: (id, its fields)."""
    segs = stat_segments(m, "admin")
    assert len(segs) == 1, segs
    return next(iter(segs.items()))


def s_(d, f):
    return d.get(f, [b""])[0].decode()


def claims(m, reason):
    return metric(m.metrics(), "kvpool_segment_claims_refused_total", {"reason": reason})


def try_mount(m, who, desc, adopting=False):
    """(status, message, the open connection) of a raw mount by `who`."""
    s = raw(m, who)
    resp = call(s, M_MOUNT, mount_body(desc, adopting=adopting))
    return status_of(resp), s_(resp, 3), s


def puts_and_gets(m, n, prefix):
    """alice puts n objects and reads them back: {key: bytes}."""
    objs = {f"a@{prefix}-{i}-{uuid.uuid4().hex[:6]}": os.urandom(4096 + 97 * i) for i in range(n)}
    with m.client("alice") as alice:
        for k, v in objs.items():
            alice.put(k, v)  # raises on any failure
        for k, v in objs.items():
            assert alice.get(k) == v
    return objs


def exists(c, key):
    try:
        return c.exists(key)
    except kvpool.Error:  # the master is still coming up
        return False


def master(certs, tmp_path, extra=(), port=0):
    m = GrantMaster(certs, str(tmp_path), AUTH_PRINCIPALS, extra=extra, port=port)
    try:
        m.owner = m.add_owner()
    except BaseException:
        m.close()
        raise
    return m


@pytest.fixture
def am(certs, tmp_path):
    m = master(certs, tmp_path, extra=("--client-ttl", "2"))
    yield m
    close_all([m])


# ---- what each principal is handed ----

def test_client_ids_and_owner_details_only_to_the_owner_and_admins(am):
    seg_id, owner = the_owner(am)
    assert owner[5][0] != 0 and s_(owner, 6) and s_(owner, 8)  # the admin sees them all
    for who in ("bobseg", "bob"):  # Stat: what `kvpool stat` shows, nothing to impersonate
        d = stat_segments(am, who)[seg_id]
        assert s_(d, 2) == s_(owner, 2) and s_(d, 7) == s_(owner, 7)
        assert d.get(5, [0])[0] == 0 and s_(d, 6) == "" and s_(d, 8) == ""
        assert d.get(11, [0])[0] == 0 and d.get(12, [0])[0] == 0
    # Heartbeat: nothing of another owner to bobseg (it neither reads nor writes), the
    # descriptor without its owner's client id to a reader
    assert seg_id not in beat_segments(am, "bobseg")
    d = beat_segments(am, "bob")[seg_id]
    assert d.get(5, [0])[0] == 0 and s_(d, 7) == s_(owner, 7)
    # the owner's own principal (another connection of it) and an admin: all of it
    assert beat_segments(am, "segsrv")[seg_id][5][0] == owner[5][0]
    assert beat_segments(am, "admin")[seg_id][5][0] == owner[5][0]


# ---- row 3: another principal's record stream ----

def test_seg_record_of_another_principals_segment(certs, tmp_path):
    m = master(certs, tmp_path, port=free_port())
    try:
        seg_id, owner = the_owner(m)
        before = puts_and_gets(m, 10, "rec-before")
        # what bobseg can read itself: no client id
        assert stat_segments(m, "bobseg")[seg_id].get(5, [0])[0] == 0
        refused0 = claims(m, "record")
        with raw(m, "bobseg") as s:
            for client_id in (owner[5][0], 0):  # the real one (an admin's Stat), and none
                resp = call(s, M_SEG_RECORD, f_varint(1, seg_id) + f_varint(2, client_id),
                            req_id=1)
                assert status_of(resp) == NOT_OWNER and not resp.get(2), resp
            assert claims(m, "record") == refused0 + 2
            # the owner's stream was not moved here: alice's puts stream nothing to bobseg
            after = puts_and_gets(m, 20, "rec-after")
            s.settimeout(1.0)
            with pytest.raises((socket.timeout, TimeoutError)):
                s.recv(1)
        assert "SegRecord of segment" in m.log_text()
        # the owner's record has every put: a new master adopts them all back from it
        m.restart()
        objs = {**before, **after}
        with m.client("alice") as alice:
            k0 = next(iter(after))
            poll(lambda: exists(alice, k0), "the owner's record offered to the new master", 30)
            for k, v in objs.items():
                assert alice.get(k) == v, k
    finally:
        close_all([m])


# ---- row 7: a mount advertising the owner's endpoint ----

def test_mount_claiming_the_owners_endpoint(am):
    seg_id, owner = the_owner(am)
    endpoint = s_(stat_segments(am, "bobseg")[seg_id], 7)  # public: `kvpool stat` shows it
    host, port = endpoint.rsplit(":", 1)
    assert host == "127.0.0.1"
    refused0 = claims(am, "endpoint")
    held = []
    try:
        spellings = [endpoint, f"localhost:{port}", f"127.1:{port}", f"[::ffff:127.0.0.1]:{port}",
                     f"LOCALHOST.:{port}"]
        for i, ep in enumerate(spellings):
            st, msg, s = try_mount(am, "bobseg", seg_desc(f"fake-{i}", ep))
            held.append(s)
            assert st == DENIED, (ep, st, msg)
            assert "tcp endpoint" in msg and s_(owner, 2) in msg, msg
        # the owner's shm path (as an admin sees it), at an endpoint nobody serves
        st, msg, s = try_mount(am, "bobseg", seg_desc("fake-shm", f"127.0.0.1:{free_port()}",
                                                      shm_path=s_(owner, 8)))
        held.append(s)
        assert st == DENIED and "shm path" in msg, msg
        assert claims(am, "endpoint") == refused0 + len(spellings) + 1
        # an endpoint nobody serves: no longer mounted either, now that a mount's endpoint
        # must prove it serves the segment (test_mount_proof.py); the honest owner did
        st, msg, s = try_mount(am, "bobseg", seg_desc("own", f"127.0.0.1:{free_port()}"),
                               adopting=True)
        assert st == DENIED and "proof" in msg, msg
        s.close()
        assert len(stat_segments(am, "admin")) == 1
        # alice's puts, with bobseg's refused mounts still connected: every one succeeds
        puts_and_gets(am, 10, "ep")
    finally:
        for s in held:
            s.close()
    assert am.master.p.poll() is None


# ---- row 11: a dropped segment's objects ----

def test_dropped_segment_taken_back_only_by_its_principal(am):
    seg_id, owner = the_owner(am)
    objs = puts_and_gets(am, 10, "held")
    held0, ep0 = claims(am, "held"), claims(am, "endpoint")
    freeze(am.owner.pid)
    try:
        # --client-ttl 2: the master drops the silent owner's segment and holds its objects
        poll(lambda: not stat_segments(am, "admin"), "the frozen owner's segment dropped", 15)
        # its name, host id and shm path, as an admin's Stat showed them, then an empty offer
        desc = seg_desc(s_(owner, 2), f"127.0.0.1:{free_port()}", host_id=s_(owner, 6),
                        shm_path=s_(owner, 8), size=owner[4][0])
        st, msg, s = try_mount(am, "bobseg", desc, adopting=True)
        with s:
            assert st == DENIED, (st, msg)
            assert "holds what a segment of that name held" in msg, msg
            resp = call(s, M_ADOPT, f_varint(1, seg_id) + f_varint(3, 1))
            assert status_of(resp) != 0  # nothing of the owner's to offer for
        assert claims(am, "held") == held0 + 1
        # another name, the owner's endpoint (held for it while it is away)
        st, msg, s = try_mount(am, "bobseg", seg_desc("squat", s_(owner, 7)))
        s.close()
        assert st == DENIED and "tcp endpoint" in msg, msg
        assert claims(am, "endpoint") == ep0 + 1
        # alice meanwhile: a miss, never bobseg's bytes
        with am.client("alice") as alice:
            k0 = next(iter(objs))
            assert not alice.exists(k0)
            with pytest.raises(kvpool.Error):
                alice.get(k0)
    finally:
        os.kill(am.owner.pid, signal.SIGCONT)
    # the owner comes back with its memory and takes its objects back
    with am.client("alice") as alice:
        poll(lambda: all(exists(alice, k) for k in objs), "the owner took its objects back", 30)
        for k, v in objs.items():
            assert alice.get(k) == v, k
        st = alice.stat()
        assert st["taken_back"] + st["adopted_objects"] >= len(objs), st
