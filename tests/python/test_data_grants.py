"""Data grants (issue 25, tcp): with TLS on the master, every tcp request to a segment's
data server must carry a grant the master sealed for that extent, op and time; the owner
checks it with no call to the master. Attacked here as a stranger on the network would:
raw TCP to the owner's data port, with no grant, forged and bit-flipped grants, a read
grant used to write, a range past the grant, another segment, an expired grant, another
principal's grant (or no HELLO, or a forged HELLO), a grant from before a master restart,
a write grant after its put ended. Every
attack must get KVP_ERR_DENIED and a closed connection, with nothing read or written: the
victim's bytes read back exact, and the owner's /metrics counts each refusal.

Real parts on 127.0.0.1: kvpool-master with TLS and an ACL (test_security's SecureMaster),
`kvpool serve` mounting over mutual TLS with --http-listen, a library client forced onto
tcp, and a raw TLS control connection that asks GetReplicaList for a real grant (the
positive control: with that grant a raw READ returns the victim's bytes).
"""
import hashlib
import hmac
import os
import signal
import socket
import struct
import time
import uuid

import pytest

import kvpool
from conftest import Proc, free_port, metric
from test_security import (M_AUTH, PRINCIPALS, SecureMaster, auth_body,  # noqa: F401
                           certs, close_all, frame, keys_body, no_ambient_credentials,
                           read_frame, recv_exact, tls_client_ctx, tls_connect, varint)

DENIED = kvpool.ERR_DENIED
SEGMENT_GONE = kvpool.ERR_SEGMENT_GONE
NOT_FOUND = kvpool.ERR_NOT_FOUND
M_PUT_START, M_PUT_END, M_GET_REPLICA_LIST, M_HEARTBEAT, M_LEASE_RELEASE = 4, 5, 7, 12, 18
DATA_MAGIC = 0x4450564B
READ, WRITE, READV, WRITEV, HELLO = 1, 2, 3, 4, 5
F_GRANT, F_GRANT_SET, F_GRANT_SAME = 1, 2, 4
REQ = struct.Struct("<IHHQQQ")  # magic op flags segment_id offset length (32 bytes)
RESP = struct.Struct("<IiQ")     # magic status length (16 bytes)
VEC = struct.Struct("<QQQ")
GRANT_LEN = 80
SET_HDR = struct.Struct("<BBHIQQQQQ16s")  # version op reserved count segment expiry epoch nonce principal mac
EXT = struct.Struct("<QQQ")  # offset length version


class SetGrant:
    """A replica's extent of the grant set its answer's segment descriptor carries: the set
    (a 64-byte header and 24 bytes per extent, docs/protocol.md "Grant sets") and which
    extent is the replica's. Sent as flag F_GRANT_SET, the set, then a u32 index per entry."""

    def __init__(self, blob, index):
        self.blob, self.index = bytes(blob), index

    def __eq__(self, other):
        return isinstance(other, SetGrant) and (self.blob, self.index) == (other.blob, other.index)

    def __bool__(self):
        return True

    def wire(self, n=1):
        return self.blob + struct.pack("<I", self.index) * n

    def header(self):
        return SET_HDR.unpack_from(self.blob)

    def extent(self, i=None):
        return EXT.unpack_from(self.blob, SET_HDR.size + EXT.size * (self.index if i is None else i))


# ---- a protobuf reader: enough for GetReplicaListResponse ----

def _varint(b, i):
    n = shift = 0
    while True:
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return n, i


def pb(b):
    """{field number: [values]}: varints as ints, length-delimited as bytes."""
    out, i = {}, 0
    while i < len(b):
        key, i = _varint(b, i)
        f, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
        elif wt == 1:
            v, i = struct.unpack_from("<Q", b, i)[0], i + 8
        elif wt == 5:
            v, i = struct.unpack_from("<I", b, i)[0], i + 4
        elif wt == 2:
            n, i = _varint(b, i)
            v, i = bytes(b[i:i + n]), i + n
        else:
            raise AssertionError(f"wire type {wt}")
        out.setdefault(f, []).append(v)
    return out


class Replica:
    """One replica as the master handed it to a principal: its extent, its grant, and
    the principal's connection key and tag for the segment (for the HELLO)."""

    def __init__(self, raw, descs):
        m = pb(raw)
        self.segment_id = m[1][0]
        self.offset = m.get(2, [0])[0]
        self.length = m[3][0]
        self.grant = m.get(4, [b""])[0]
        d = descs[self.segment_id]
        if not self.grant and m.get(5, [0])[0]:  # its extent of its segment's grant set
            assert m[5][0] == d["_pos"] + 1
            self.grant = SetGrant(d[18][0], m.get(6, [0])[0])
        host, port = d[7][0].decode().rsplit(":", 1)
        self.endpoint = (host, int(port))
        self.conn_key = d.get(13, [b""])[0]
        self.conn_tag = d.get(14, [0])[0]
        self.seg_size = d[4][0]
        self.shm_path = d.get(8, [b""])[0].decode()
        self.shm_grant = d.get(15, [b""])[0]  # a MAP grant (the shm hand-off), or none


def descs_of(resp):
    """An answer's segment descriptors by id, each with its position (a replica's grant_set
    names its descriptor by position + 1)."""
    descs = {}
    for pos, d in enumerate(resp.get(3, [])):
        dm = pb(d)
        dm["_pos"] = pos
        descs[dm[1][0]] = dm
    return descs


def replicas_of(master, key, who="bob", principals=PRINCIPALS):
    """The replicas (with grants) GetReplicaList gives principal `who` (of the key's tenant)
    for key, over a raw TLS connection with its certificate or token."""
    p = principals[who]
    if "cn" in p:
        crt, k = master.certs.pair(p["cn"])
        ctx = tls_client_ctx(master.certs.ca, crt, k)
    else:
        ctx = tls_client_ctx(master.certs.ca)
    with tls_connect(master, ctx) as s:
        if "cn" not in p:
            s.sendall(frame(M_AUTH, auth_body(p["token"])))
            a = read_frame(s)
            assert a is not None and a[1] == 0, a
        s.sendall(frame(M_GET_REPLICA_LIST, keys_body(key), req_id=2))
        r = read_frame(s)
    assert r is not None and r[1] == 0, r
    resp = pb(r[2])
    descs = descs_of(resp)
    res = pb(resp[2][0])
    assert res.get(1, [0])[0] == 0, res
    return [Replica(x, descs) for x in res[4]]


# ---- raw data requests ----

def hello_proof(conn_key, challenge, segment_id, tag):
    msg = b"kvpool hello".ljust(16, b"\0") + challenge + struct.pack("<QQ", segment_id, tag)
    return hmac.new(conn_key, msg, hashlib.sha256).digest()


def hello(s, segment_id, tag, conn_key, verdict=False):
    """Prove principal `tag` on data connection s. The owner answers a proof that passes
    with nothing (the requests follow it at once) and one that fails with DENIED and a
    close: 0 once the proof is sent; with verdict, the owner's answer to it (blocking: for
    proofs that must fail; None: closed). A status answered before any challenge (a HELLO
    for another segment) is returned as it is."""
    s.sendall(REQ.pack(DATA_MAGIC, HELLO, 0, segment_id, tag, 0))
    h = recv_exact(s, RESP.size)
    if len(h) < RESP.size:
        return None
    magic, status, length = RESP.unpack(h)
    assert magic == DATA_MAGIC, magic
    if status != 0:
        return status
    assert length == 32, length
    challenge = recv_exact(s, 32)
    s.sendall(hello_proof(conn_key, challenge, segment_id, tag))
    if not verdict:
        return 0
    h = recv_exact(s, RESP.size)
    return RESP.unpack(h)[1] if len(h) == RESP.size else None


def connect(endpoint):
    """A raw tcp connection to an owner, with Nagle off as the library's own: a request
    sent right behind a HELLO's proof (which the owner does not answer) would otherwise wait
    for the delayed ACK of the proof, 40 ms a connection."""
    s = socket.create_connection(endpoint, timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def data_conn(rep, as_=None):
    """A raw data connection to rep's owner, proven as the principal of `as_` (a Replica
    handed to that principal; default rep's own), or as nobody (as_=False)."""
    s = connect(rep.endpoint)
    who = rep if as_ is None else as_
    if who:
        assert hello(s, who.segment_id, who.conn_tag, who.conn_key) == 0
    return s


def reply(s):
    """(status, payload) of the next reply, or None when the owner just closed."""
    h = recv_exact(s, RESP.size)
    if len(h) < RESP.size:
        return None
    magic, status, length = RESP.unpack(h)
    assert magic == DATA_MAGIC
    return status, (recv_exact(s, length) if status == 0 else b"")


def closed(s, wait=5):
    s.settimeout(wait)
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False  # still open


def grant_wire(grant, n=1):
    """(flags, the bytes after the header or entries) for a grant: None, a single 80-byte
    grant's bytes, or a SetGrant."""
    if grant is None:
        return 0, b""
    if isinstance(grant, SetGrant):
        return F_GRANT_SET, grant.wire(n)
    return F_GRANT, grant


def request(rep, op, offset, length, grant=None, payload=b"", segment_id=None, as_=None):
    """One raw READ/WRITE on a connection proven as rep's principal (as_: see data_conn);
    (status, payload, closed-after)."""
    seg = rep.segment_id if segment_id is None else segment_id
    flags, tail = grant_wire(grant)
    hdr = REQ.pack(DATA_MAGIC, op, flags, seg, offset, length)
    with data_conn(rep, as_) as s:
        try:
            s.sendall(hdr + tail + payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before the payload was all in: the reply (if any) says why
        r = reply(s)
        if r is None:
            return None, b"", True
        # served, or told the segment is gone (a read): the connection stays open
        return r[0], r[1], r[0] != 0 and closed(s, 1 if r[0] == SEGMENT_GONE else 5)


def refused(r):
    status, payload, was_closed = r
    return status in (DENIED, None) and payload == b"" and was_closed


# ---- fixtures ----

class GrantMaster(SecureMaster):
    """SecureMaster with extra flags for kvpool-master (e.g. a short lease)."""

    def __init__(self, certs, workdir, principals, extra=(), port=0):
        self.extra = list(extra)
        self.listen_port = port
        super().__init__(certs, workdir, principals)

    def restart(self):
        """kill -9 the master (by its PID) and start a new one on the same port: a new
        epoch, whose segments mount again, with new keys."""
        assert self.listen_port, "restart needs a fixed port"
        self.master.stop(sig=signal.SIGKILL)
        self.master = self._start_master(self.certs)

    def _start_master(self, certs):
        argv = [self.master_bin, "--listen", f"127.0.0.1:{self.listen_port}",
                "--ready-fd", "{fd}",
                "--log-level", "info", "--lease-ttl", "0",
                "--http-listen", f"127.0.0.1:{self.http_port}",
                "--tls-cert", certs.server_crt, "--tls-key", certs.server_key,
                "--tls-ca", certs.ca, "--tls-crl", certs.crl,
                "--acl-file", self.acl_path] + self.extra
        return Proc(argv, stderr=self._log)

    def add_owner(self, size="64MiB", extra=()):
        """`kvpool serve` (principal segsrv) with /metrics on a port of its own; extra: more
        of its flags (an SSD segment)."""
        crt, key = self.certs.pair(PRINCIPALS["segsrv"]["cn"])
        port = free_port()
        s = Proc([self.cli_bin, "--master", self.addr, "--tls-ca", self.certs.ca,
                  "--tls-cert", crt, "--tls-key", key, "serve", "--segment-size", size,
                  "--http-listen", f"127.0.0.1:{port}", "--ready-fd", "{fd}", *extra], lines=2)
        self.segments.append(s)
        self.owner_http = port
        return s

    def owner_refused(self):
        import urllib.request
        with urllib.request.urlopen(f"http://127.0.0.1:{self.owner_http}/metrics",
                                    timeout=10) as r:
            text = r.read().decode()
        return metric(text, "kvpool_connections_refused_total", {"reason": "grant"})


@pytest.fixture(scope="module")
def gm(certs, tmp_path_factory):
    m = GrantMaster(certs, str(tmp_path_factory.mktemp("grants")), PRINCIPALS)
    try:
        m.add_owner()
    except BaseException:
        m.close()
        raise
    yield m
    close_all([m])


@pytest.fixture
def victim(gm):
    """bob's object, put over tcp (grants on the wire): (key, bytes, its replica)."""
    key = f"b@grant-victim-{uuid.uuid4().hex[:8]}"
    data = os.urandom(64 * 1024)
    with gm.client("bob", transport="tcp") as bob:
        bob.put(key, data)
        assert bob.get(key) == data
    (rep,) = replicas_of(gm, key)
    return key, data, rep


def intact(gm, key, data):
    with gm.client("bob", transport="tcp") as bob:
        assert bob.get(key) == data


# ---- cases ----

def test_honest_tcp_round_trips_carry_grants(gm, victim):
    key, data, rep = victim
    # the master sealed a grant set for the answer's extents on this segment: this one
    assert isinstance(rep.grant, SetGrant)
    version, op, _, count, seg, _, _, _, principal, _ = rep.grant.header()
    assert (version, op, count, seg, principal) == (2, READ, 1, rep.segment_id, rep.conn_tag)
    off, length, version = rep.grant.extent()
    assert (off, length) == (rep.offset, rep.length) and version > 0  # the object's version
    assert gm.owner_refused() == 0      # the library's own requests all passed
    # several objects in one batch (vectored requests with a grant per entry)
    keys = [f"b@grant-batch-{i}-{uuid.uuid4().hex[:6]}" for i in range(40)]
    vals = [os.urandom(1000 + 37 * i) for i in range(40)]
    with gm.client("bob", transport="tcp") as bob:
        assert all(s == 0 for s in bob.batch_put(keys, vals))
        assert bob.batch_get(keys) == vals
    assert gm.owner_refused() == 0


def test_heartbeat_hands_the_connection_key_a_get_does(gm, victim):
    """A Heartbeat that brings the segment table (after any mount or unmount: every owner
    remounts after a failover) gives each descriptor as a get's answer does, the caller's
    connection key and tag included. A client takes a descriptor that differs from the one
    it knows as a new segment: a keyless one, taken between a get's answer and its transfer,
    had the library open data connections with no HELLO, whose reads the owner refused (the
    failover bench with TLS lost every resident object of a round to it)."""
    key, data, rep = victim
    crt, k = gm.certs.pair(PRINCIPALS["bob"]["cn"])
    with tls_connect(gm, tls_client_ctx(gm.certs.ca, crt, k)) as s:
        s.sendall(frame(M_HEARTBEAT, b"", req_id=3))  # segments_version 0: the whole table
        r = read_frame(s)
    assert r is not None and r[1] == 0, r
    resp = pb(r[2])
    assert resp.get(4, [0])[0] > 0  # the table's version
    d = {pb(x)[1][0]: pb(x) for x in resp.get(5, [])}[rep.segment_id]  # its segments
    assert d.get(13, [b""])[0] == rep.conn_key and len(rep.conn_key) == 32
    assert d.get(14, [0])[0] == rep.conn_tag != 0
    assert d[7][0].decode() == "%s:%d" % rep.endpoint
    # and the key proves bob's principal to the owner: a read with the get's grant passes
    hb = Replica.__new__(Replica)
    hb.__dict__.update(rep.__dict__, conn_key=d[13][0], conn_tag=d[14][0])
    status, payload, _ = request(hb, READ, rep.offset, rep.length, rep.grant)
    assert status == 0 and payload == data


def test_past_a_sets_limit_single_grants(gm):
    """A batch naming more extents of one segment than a set holds (8192): the rest get
    grants of their own in the same answer, and puts and gets of all of them pass."""
    keys = [f"b@grant-many-{i}-{uuid.uuid4().hex[:6]}" for i in range(8300)]
    vals = [i.to_bytes(4, "little") * 16 for i in range(8300)]
    before = gm.owner_refused()
    with gm.client("bob", transport="tcp") as bob:
        assert all(s == 0 for s in bob.batch_put(keys, vals))
        assert bob.batch_get(keys) == vals
        bob.batch_remove(keys)
    assert gm.owner_refused() == before


def test_with_its_grant_a_raw_read_returns_the_bytes(gm, victim):
    """The positive control: the checks refuse forgeries, not everything."""
    key, data, rep = victim
    status, payload, _ = request(rep, READ, rep.offset, rep.length, rep.grant)
    assert status == 0 and payload == data
    # a part of the extent
    status, payload, _ = request(rep, READ, rep.offset + 100, 200, rep.grant)
    assert status == 0 and payload == data[100:300]


def test_no_grant_nothing_read_or_written(gm, victim):
    key, data, rep = victim
    before = gm.owner_refused()
    assert refused(request(rep, READ, rep.offset, rep.length))
    assert refused(request(rep, WRITE, rep.offset, 4096, payload=b"\xee" * 4096))
    # vectored, no grants
    body = VEC.pack(rep.segment_id, rep.offset, 4096)
    with data_conn(rep) as s:
        s.sendall(REQ.pack(DATA_MAGIC, WRITEV, 0, 0, 1, 4096) + body + b"\xee" * 4096)
        r = reply(s)
        assert r is None or r[0] == DENIED
        assert closed(s)
    intact(gm, key, data)
    assert gm.owner_refused() == before + 3


def flipped_set_request(rep, bit):
    """rep's grant set on the wire (the set, then the entry's index) with one bit flipped;
    a flip in the count gets the extents it now announces (zeros), so that the owner reads
    a whole set and answers (a count past the limit or zero is refused from the header)."""
    w = bytearray(rep.grant.wire())
    w[bit // 8] ^= 1 << (bit % 8)
    count = struct.unpack_from("<I", w, 4)[0]
    if 1 < count <= 8192:
        w[-4:-4] = bytes(EXT.size * (count - 1))
    hdr = REQ.pack(DATA_MAGIC, READ, F_GRANT_SET, rep.segment_id, rep.offset, rep.length)
    with data_conn(rep) as s:
        s.sendall(hdr + bytes(w))
        r = reply(s)
        if r is None:
            return None, b"", True
        return r[0], r[1], r[0] != 0 and closed(s)


def test_forged_and_bit_flipped_grants(gm, victim):
    """Every single-bit flip of a real grant set (its header, its extent and the entry's
    index), 500 random single grants and 500 random sets: none taken (10^6 random grants
    and sets against the checks themselves: tests/unit/common/test_grant.c)."""
    key, data, rep = victim
    before = gm.owner_refused()
    taken = 0
    tried = 0
    for bit in range(len(rep.grant.wire()) * 8):
        taken += not refused(flipped_set_request(rep, bit))
        tried += 1
    for _ in range(500):
        taken += not refused(request(rep, READ, rep.offset, rep.length, os.urandom(GRANT_LEN)))
        tried += 1
    for _ in range(500):  # a random set of one extent naming the request's range
        h = bytearray(os.urandom(SET_HDR.size))
        h[0], h[1] = 2, READ
        struct.pack_into("<IQ", h, 4, 1, rep.segment_id)
        forged = SetGrant(bytes(h) + EXT.pack(rep.offset, rep.length, 0), 0)
        taken += not refused(request(rep, READ, rep.offset, rep.length, forged))
        tried += 1
    assert taken == 0
    assert gm.owner_refused() == before + tried
    # and the owner still serves an honest client
    intact(gm, key, data)


def test_grant_needs_its_principals_connection(gm, victim):
    """bob's real grant: refused on a connection that proved no principal, and on one
    proven as alice (a principal of another tenant, with her own key for this segment);
    a HELLO naming bob's tag with alice's key, or a made-up key, is refused itself."""
    key, data, rep = victim
    assert rep.conn_key and rep.conn_tag
    akey = f"a@grant-alice-{uuid.uuid4().hex[:8]}"
    with gm.client("alice", transport="tcp") as alice:
        alice.put(akey, b"alice's")
    (arep,) = replicas_of(gm, akey, who="alice")
    assert arep.segment_id == rep.segment_id and arep.conn_tag != rep.conn_tag
    assert arep.conn_key != rep.conn_key
    before = gm.owner_refused()
    assert refused(request(rep, READ, rep.offset, rep.length, rep.grant, as_=False))
    assert refused(request(rep, READ, rep.offset, rep.length, rep.grant, as_=arep))
    assert refused(request(rep, WRITE, rep.offset, 4096, rep.grant, b"\xee" * 4096, as_=arep))
    for wrong_key in (arep.conn_key, os.urandom(32)):
        with connect(rep.endpoint) as s:
            assert hello(s, rep.segment_id, rep.conn_tag, wrong_key, verdict=True) in (DENIED, None)
            assert closed(s)
    assert gm.owner_refused() == before + 5
    # the library sends its first requests right behind its proof, not waiting for a
    # verdict: a read sent behind a proof that fails is not served (DENIED in its place,
    # or the close; nothing of the object either way)
    flags, tail = grant_wire(rep.grant)
    with connect(rep.endpoint) as s:
        assert hello(s, rep.segment_id, rep.conn_tag, arep.conn_key) == 0
        try:
            s.sendall(REQ.pack(DATA_MAGIC, READ, flags, rep.segment_id, rep.offset,
                               rep.length) + tail)
            r = reply(s)
        except (BrokenPipeError, ConnectionResetError):
            r = None
        assert r in (None, (DENIED, b"")), r
        assert closed(s)
    assert gm.owner_refused() == before + 6
    # and with bob's own HELLO the same grant is taken
    status, payload, _ = request(rep, READ, rep.offset, rep.length, rep.grant)
    assert status == 0 and payload == data
    intact(gm, key, data)


def test_grant_set_named_again_on_its_connection(gm, victim):
    """A set taken on a connection is named again by its index alone (F_GRANT_SAME) on that
    connection only: first on a fresh connection, or with an index past the set, refused."""
    key, data, rep = victim
    with data_conn(rep) as s:
        flags, tail = grant_wire(rep.grant)
        s.sendall(REQ.pack(DATA_MAGIC, READ, flags, rep.segment_id, rep.offset, 100) + tail)
        assert reply(s) == (0, data[:100])
        idx = struct.pack("<I", rep.grant.index)
        s.sendall(REQ.pack(DATA_MAGIC, READ, F_GRANT_SAME, rep.segment_id, rep.offset + 100,
                           200) + idx)
        assert reply(s) == (0, data[100:300])
        # vectored, both entries inside the one extent the set names
        body = VEC.pack(rep.segment_id, rep.offset, 10) + VEC.pack(rep.segment_id,
                                                                   rep.offset + 20, 10)
        s.sendall(REQ.pack(DATA_MAGIC, READV, F_GRANT_SAME, 0, 2, 20) + body + idx * 2)
        assert reply(s) == (0, data[:10] + data[20:30])
        # a set again on the same connection (its extents and indices read at once, into
        # the room the first one made), then one with an extent changed: refused, closed
        s.sendall(REQ.pack(DATA_MAGIC, READ, flags, rep.segment_id, rep.offset + 5, 50) + tail)
        assert reply(s) == (0, data[5:55])
        bad = bytearray(tail)
        bad[SET_HDR.size + 8] ^= 0x01  # the first extent's length
        s.sendall(REQ.pack(DATA_MAGIC, READ, flags, rep.segment_id, rep.offset, 100)
                  + bytes(bad))
        r = reply(s)
        assert r is None or r[0] == DENIED
        assert closed(s)
    before = gm.owner_refused()
    with data_conn(rep) as s:  # nothing taken on this connection yet
        s.sendall(REQ.pack(DATA_MAGIC, READ, F_GRANT_SAME, rep.segment_id, rep.offset, 100)
                  + struct.pack("<I", rep.grant.index))
        r = reply(s)
        assert r is None or r[0] == DENIED
        assert closed(s)
    with data_conn(rep) as s:  # an index past the set's one extent
        flags, tail = grant_wire(rep.grant)
        s.sendall(REQ.pack(DATA_MAGIC, READ, flags, rep.segment_id, rep.offset, 100) + tail)
        assert reply(s) == (0, data[:100])
        s.sendall(REQ.pack(DATA_MAGIC, READ, F_GRANT_SAME, rep.segment_id, rep.offset, 100)
                  + struct.pack("<I", 1))
        r = reply(s)
        assert r is None or r[0] == DENIED
        assert closed(s)
    # a set announcing more extents than any master seals: refused from its header
    with data_conn(rep) as s:
        h = bytearray(rep.grant.blob[:SET_HDR.size])
        struct.pack_into("<I", h, 4, 8193)
        s.sendall(REQ.pack(DATA_MAGIC, READ, F_GRANT_SET, rep.segment_id, rep.offset, 100)
                  + bytes(h))
        r = reply(s)
        assert r is None or r[0] == DENIED
        assert closed(s)
    assert gm.owner_refused() == before + 3
    intact(gm, key, data)


def get_replicas_raw(s, key, missing_ok=False):
    """GetReplicaList of one key on control connection s: (its Replica, its lease id).
    missing_ok: a key the master does not list gives (None, None) (NOT_FOUND, exactly)."""
    s.sendall(frame(M_GET_REPLICA_LIST, keys_body(key), req_id=21))
    r = read_frame(s)
    assert r is not None and r[1] == 0, r
    resp = pb(r[2])
    res = pb(resp[2][0])
    code = res.get(1, [0])[0]
    if missing_ok and code == (NOT_FOUND & 0xFFFFFFFFFFFFFFFF):
        return None, None
    assert code == 0, res
    return Replica(res[4][0], descs_of(resp)), res.get(5, [0])[0]


def test_read_grant_refused_once_a_later_object_is_at_its_extent(gm):
    """A reader that hands its lease back keeps its read grant until its expiry; the
    object removed and its extent given to a new object (another tenant's, in a shared
    segment), the old grant reads none of the new object's bytes once the owner's record
    has it."""
    key = f"b@grant-old-{uuid.uuid4().hex[:8]}"
    old = os.urandom(8192)
    with gm.client("bob", transport="tcp") as bob:
        bob.put(key, old)
    with bob_control(gm) as s:
        rep, lease = get_replicas_raw(s, key)
        if lease:  # (none when the master grants no read leases)
            s.sendall(frame(M_LEASE_RELEASE, b"\x0a\x08" + struct.pack("<Q", lease),
                            req_id=22))
        status, payload, _ = request(rep, READ, rep.offset, rep.length, rep.grant)
        assert status == 0 and payload == old
    with gm.client("bob", transport="tcp") as bob:
        bob.remove(key)
    # new objects of the same size until one lands on the old extent (first fit: soon)
    new_keys, landed = [], None
    with gm.client("alice", transport="tcp") as alice:
        for i in range(64):
            k = f"a@grant-new-{i}-{uuid.uuid4().hex[:6]}"
            alice.put(k, bytes([i]) * 8192)
            new_keys.append(k)
            (r,) = replicas_of(gm, k, who="alice")
            if r.segment_id == rep.segment_id and r.offset == rep.offset:
                landed = k
                break
    assert landed is not None, "no new object landed on the old extent"
    before = gm.owner_refused()
    deadline = time.monotonic() + 5  # the owner's record learns of it within milliseconds
    while not refused(request(rep, READ, rep.offset, rep.length, rep.grant)):
        assert time.monotonic() < deadline, "the old read grant still reads the new object"
        time.sleep(0.05)
    assert gm.owner_refused() > before
    with gm.client("alice", transport="tcp") as alice:
        assert alice.get(landed) == bytes([len(new_keys) - 1]) * 8192


def test_read_grant_refused_once_a_later_put_writes_at_its_extent(gm):
    """The same reader, but the new object's put is still pending: the old read grant
    gets what the extent held before the new put wrote (the bytes it was granted), and is
    refused from the new put's first write on, before its PutEnd: none of the new
    object's bytes reach it."""
    key = f"b@grant-pend-{uuid.uuid4().hex[:8]}"
    old = os.urandom(8192)
    with gm.client("bob", transport="tcp") as bob:
        bob.put(key, old)
    with bob_control(gm) as s:
        rep, lease = get_replicas_raw(s, key)
        if lease:
            s.sendall(frame(M_LEASE_RELEASE, b"\x0a\x08" + struct.pack("<Q", lease),
                            req_id=22))
    with gm.client("bob", transport="tcp") as bob:
        bob.remove(key)
    with tls_connect(gm, tls_client_ctx(gm.certs.ca)) as s:
        s.sendall(frame(M_AUTH, auth_body(PRINCIPALS["alice"]["token"])))
        a = read_frame(s)
        assert a is not None and a[1] == 0, a
        landed = None
        for i in range(64):  # raw puts of the same size until one is given the old extent
            kk = f"a@grant-pnew-{i}-{uuid.uuid4().hex[:6]}"
            w = put_start_raw(s, kk, len(old))
            if w.segment_id == rep.segment_id and w.offset == rep.offset:
                landed = (kk, w)
                break
            d = bytes([i]) * len(old)
            assert request(w, WRITE, w.offset, len(d), w.grant, d)[0] == 0
            put_end_raw(s, kk, crc32c(d))
        assert landed is not None, "no new object landed on the old extent"
        kk, w = landed
        # nothing written by the new put yet: the extent holds what the grant was for
        status, payload, _ = request(rep, READ, rep.offset, rep.length, rep.grant)
        assert status == 0 and payload == old
        new = os.urandom(len(old))
        assert request(w, WRITE, w.offset, len(new), w.grant, new)[0] == 0
        before = gm.owner_refused()
        assert refused(request(rep, READ, rep.offset, rep.length, rep.grant))
        assert refused(request(rep, READ, rep.offset + 4096, 4096, rep.grant))
        assert gm.owner_refused() == before + 2
        # the new put's own write grant still works until its end, and its object is whole
        assert request(w, WRITE, w.offset, len(new), w.grant, new)[0] == 0
        put_end_raw(s, kk, crc32c(new))
    with gm.client("alice", transport="tcp") as alice:
        assert alice.get(kk) == new


def test_read_grant_cannot_write(gm, victim):
    key, data, rep = victim
    assert refused(request(rep, WRITE, rep.offset, 4096, rep.grant, b"\xee" * 4096))
    intact(gm, key, data)


def test_range_segment_and_overflow(gm, victim):
    key, data, rep = victim
    # one byte past the extent, a range before it, one wrapping past 2^64
    assert refused(request(rep, READ, rep.offset, rep.length + 1, rep.grant))
    if rep.offset > 0:
        assert refused(request(rep, READ, rep.offset - 64, 128, rep.grant))
    assert refused(request(rep, READ, 2**64 - 16, 32, rep.grant))
    # the header names another segment than the owner's: what an owner without grants
    # says of it (a client's descriptor from before the segment mounted again), and
    # nothing read; not counted as a refusal
    before = gm.owner_refused()
    status, payload, _ = request(rep, READ, rep.offset, rep.length, rep.grant,
                                 segment_id=rep.segment_id ^ 1)
    assert status == SEGMENT_GONE and payload == b""
    status, payload, was_closed = request(rep, WRITE, rep.offset, 4096, rep.grant,
                                          b"\xee" * 4096, segment_id=rep.segment_id ^ 1)
    assert status in (SEGMENT_GONE, None) and payload == b"" and was_closed
    assert gm.owner_refused() == before
    # a write grant of one object used on its neighbour's extent
    key2 = f"b@grant-n-{uuid.uuid4().hex[:8]}"
    data2 = os.urandom(64 * 1024)
    with gm.client("bob", transport="tcp") as bob:
        bob.put(key2, data2)
    (rep2,) = replicas_of(gm, key2)
    if rep2.segment_id == rep.segment_id:
        assert refused(request(rep, READ, rep2.offset, rep2.length, rep.grant))
    intact(gm, key, data)
    intact(gm, key2, data2)


def master_with_object(certs, tmp_path, extra=(), port=0, name="own", size=8192):
    """A GrantMaster of the test's own (kvpool-master flags `extra`; `port` 0: any, a fixed
    one for restart) with an owner, and an object of bob's (`size` bytes, key
    b@grant-NAME-...) put over tcp: (master, key, bytes, its replica)."""
    m = GrantMaster(certs, str(tmp_path), PRINCIPALS, extra=extra, port=port)
    try:
        m.add_owner()
        key = f"b@grant-{name}-{uuid.uuid4().hex[:8]}"
        data = os.urandom(size)
        with m.client("bob", transport="tcp") as bob:
            bob.put(key, data)
        (rep,) = replicas_of(m, key)
        return m, key, data, rep
    except BaseException:
        close_all([m])
        raise


def test_expired_grant(certs, tmp_path):
    """A master whose read grants live 1 s (--lease-ttl 1): refused 1 s + the clock slack
    (1 s) later, taken before."""
    m, key, data, rep = master_with_object(certs, tmp_path, ["--lease-ttl", "1"])
    try:
        status, payload, _ = request(rep, READ, rep.offset, rep.length, rep.grant)
        assert status == 0 and payload == data
        time.sleep(2.3)
        assert refused(request(rep, READ, rep.offset, rep.length, rep.grant))
        assert m.owner_refused() == 1
        with m.client("bob", transport="tcp") as bob:  # a fresh grant works
            assert bob.get(key) == data
    finally:
        close_all([m])


def test_grants_off_serves_as_before(certs, tmp_path):
    """--data-grants off: the owner takes requests with no grant (as without TLS), and the
    master says so in its log."""
    m, key, data, rep = master_with_object(certs, tmp_path, ["--data-grants", "off"])
    try:
        assert rep.grant == b""
        assert rep.conn_key == b""
        status, payload, _ = request(rep, READ, rep.offset, rep.length, as_=False)
        assert status == 0 and payload == data
        assert "data grants off" in m.log_text()
    finally:
        close_all([m])


def test_grant_from_before_a_master_restart(certs, tmp_path):
    """kill -9 of the master and a new one on the same port: the owner mounts again under
    a new epoch and key; the grant and the connection key of before are refused, the new
    master's work, and the object (adopted back from the owner's record) reads exact. An
    honest client that still holds the old descriptor is told the segment is gone (not
    refused): what it sends names the old segment id."""
    m, key, data, old = master_with_object(certs, tmp_path, port=free_port(), name="epoch",
                                           size=16384)
    try:
        status, payload, _ = request(old, READ, old.offset, old.length, old.grant)
        assert status == 0 and payload == data
        m.restart()
        deadline = time.monotonic() + 30
        new = None
        while time.monotonic() < deadline:
            try:
                (new,) = replicas_of(m, key)
                break
            except (AssertionError, OSError, ValueError):
                time.sleep(0.2)  # the owner is mounting again and offering its objects
        assert new is not None, "the object did not come back after the restart"
        assert new.grant != old.grant and new.conn_key != old.conn_key
        assert new.segment_id != old.segment_id
        before = m.owner_refused()
        # the old grant under the old segment id, on a connection proven with the new key,
        # and a HELLO naming the old segment: gone, nothing read, not counted
        status, payload, _ = request(old, READ, old.offset, old.length, old.grant, as_=new)
        assert status == SEGMENT_GONE and payload == b""
        with connect(old.endpoint) as s:
            assert hello(s, old.segment_id, old.conn_tag, old.conn_key) == SEGMENT_GONE
        assert m.owner_refused() == before
        # the old grant under the new segment id; a HELLO with the old key: refused
        assert refused(request(old, READ, old.offset, old.length, old.grant,
                               segment_id=new.segment_id, as_=new))
        with connect(old.endpoint) as s:
            assert hello(s, new.segment_id, old.conn_tag, old.conn_key, verdict=True) in (
                DENIED, None)
        assert m.owner_refused() == before + 2
        status, payload, _ = request(new, READ, new.offset, new.length, new.grant)
        assert status == 0 and payload == data
        with m.client("bob", transport="tcp") as bob:
            assert bob.get(key) == data
    finally:
        close_all([m])


def _crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_CRC_T = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC_T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def bob_control(m):
    crt, k = m.certs.pair(PRINCIPALS["bob"]["cn"])
    return tls_connect(m, tls_client_ctx(m.certs.ca, crt, k))


def put_start_raw(s, key, size, medium=""):
    """A raw PutStart of one key (PutConfig.medium: "ssd" straight to the SSD tier): its
    replica (with the write grant) as a Replica."""
    kb = key.encode()
    sizes = varint(size)
    body = b"\x0a" + varint(len(kb)) + kb + b"\x12" + varint(len(sizes)) + sizes
    if medium:
        cfg = b"\x32" + varint(len(medium)) + medium.encode()
        body += b"\x1a" + varint(len(cfg)) + cfg
    s.sendall(frame(M_PUT_START, body, req_id=11))
    r = read_frame(s)
    assert r is not None and r[1] == 0, r
    resp = pb(r[2])
    descs = descs_of(resp)
    res = pb(resp[2][0])
    assert res.get(1, [0])[0] == 0, res
    return Replica(res[2][0], descs)


def put_end_raw(s, key, crc):
    kb = key.encode()
    body = b"\x0a" + varint(len(kb)) + kb + b"\x12\x04" + struct.pack("<I", crc)
    s.sendall(frame(M_PUT_END, body, req_id=12))
    r = read_frame(s)
    assert r is not None and r[1] == 0, r
    st = pb(r[2])
    assert st.get(1, [0])[0] == 0, st


def test_an_object_ended_unwritten_on_ssd_reads_nothing_of_the_extents_last_object(certs,
                                                                                   tmp_path):
    """The same on an SSD segment (a put straight to its file): alice's object written there
    and removed, then bob's put at its extent ended without a byte written. The SSD owner,
    its segment's objects two tenants', reads each put's extent back at its RECORD and
    checks it against the declared CRC: bob's is not recorded, its extent zeroed, its
    offset reported bad, and his reads (which wait for the RECORD) refused."""
    m = GrantMaster(certs, str(tmp_path), PRINCIPALS)
    try:
        m.add_owner(size="0", extra=("--ssd-path", str(tmp_path / "ssd.seg"),
                                     "--ssd-size", "64MiB"))
        size = 8192
        mark = b"alice-" + uuid.uuid4().hex.encode()
        secret = (mark * (size // len(mark) + 1))[:size]
        with m.client("alice", transport="tcp") as alice:
            old = f"a@ssd-{uuid.uuid4().hex[:8]}"
            alice.put(old, secret, medium="ssd")
            assert alice.get(old) == secret
            (rep_a,) = replicas_of(m, old, who="alice")
            alice.remove(old)
        landed = None
        with bob_control(m) as s:
            for i in range(64):
                k = f"b@unwritten-{i}-{uuid.uuid4().hex[:6]}"
                w = put_start_raw(s, k, size, "ssd")
                put_end_raw(s, k, 0)  # not a byte written
                if w.segment_id == rep_a.segment_id and w.offset == rep_a.offset:
                    landed = k
                    break
            assert landed is not None, "no put of bob's landed on alice's old extent"
            # the owner's check may already have run and the master dropped the object
            # (NOT_FOUND): then there is no replica to read; else its read is refused
            rep, _ = get_replicas_raw(s, landed, missing_ok=True)
            if rep is not None:
                status, payload, _ = request(rep, READ, rep.offset, rep.length, rep.grant)
                assert mark not in payload, "bob read the bytes of alice's removed object"
                assert status == DENIED and payload == b"", status
        with m.client("bob", transport="tcp") as bob:  # the master dropped the bad copy
            deadline = time.monotonic() + 5
            while bob.exists(landed):
                assert time.monotonic() < deadline, "the unwritten object is still listed"
                time.sleep(0.05)
            with pytest.raises(kvpool.Error) as ei:
                bob.get(landed)
            assert ei.value.status == NOT_FOUND
        # the owner zeroed the extent before it reported it bad: alice's bytes are nowhere
        # in the segment's file
        assert mark not in (tmp_path / "ssd.seg").read_bytes(), "alice's bytes left on disk"
    finally:
        close_all([m])


def write_grant_ends(gm, medium=""):
    key = f"b@grant-end-{uuid.uuid4().hex[:8]}"
    d1, d2 = os.urandom(4096), os.urandom(4096)
    with bob_control(gm) as s:
        rep = put_start_raw(s, key, len(d1), medium)
        assert isinstance(rep.grant, SetGrant) and rep.grant.header()[1] == WRITE
        assert rep.grant.extent()[2] > 0  # the put's object version: PutEnd ends the grant
        status, _, _ = request(rep, WRITE, rep.offset, len(d1), rep.grant, d1)
        assert status == 0
        put_end_raw(s, key, crc32c(d1))
    with gm.client("bob", transport="tcp") as bob:
        assert bob.get(key) == d1  # the library's get comes after the record was sent
    # the owner applies the record within milliseconds of the put's end: probe with the
    # bytes already there (harmless if still taken) until the grant is refused
    deadline = time.monotonic() + 5
    while not refused(request(rep, WRITE, rep.offset, len(d1), rep.grant, d1)):
        assert time.monotonic() < deadline, "a write grant still taken 5 s after its PutEnd"
        time.sleep(0.05)
    before = gm.owner_refused()
    assert refused(request(rep, WRITE, rep.offset, len(d2), rep.grant, d2))
    assert gm.owner_refused() == before + 1
    with gm.client("bob", transport="tcp") as bob:
        assert bob.get(key) == d1
    return rep


def test_write_grant_ends_at_put_end(gm):
    """A write grant works while its put is pending and is refused once the owner's
    record has the put's end (the master streams it to the owner before the writer hears
    of it); the bytes written under it stay as they were acknowledged."""
    write_grant_ends(gm)


def test_write_grant_ends_at_put_end_with_segment_records_off(certs, tmp_path):
    """--segment-records off (nothing adopted after a master restart): the owner still gets
    the record's put ends, which end write grants."""
    m = GrantMaster(certs, str(tmp_path), PRINCIPALS, extra=("--segment-records", "off"))
    try:
        m.add_owner()
        write_grant_ends(m)
    finally:
        close_all([m])


def test_write_grant_ends_at_put_end_on_ssd(certs, tmp_path):
    """The same on an SSD segment (the only segment: the put goes straight to its file):
    refused once the owner recorded the put in the file (the master's RECORD task, sent at
    the put's end)."""
    m = GrantMaster(certs, str(tmp_path), PRINCIPALS)
    try:
        m.add_owner(size="0", extra=("--ssd-path", str(tmp_path / "ssd.seg"),
                                     "--ssd-size", "64MiB"))
        rep = write_grant_ends(m, "ssd")
        assert rep.seg_size == 64 << 20 and rep.shm_path == ""  # the SSD segment
    finally:
        close_all([m])


# ---- rdma memory windows' frames (wire.h BIND_READ 7, BIND_WRITE 8, UNBIND 9) on an owner
# that serves no windows: what a stranger, a forger and an honest principal get. The windows
# themselves are bound and used in the Soft-RoCE VM (tests/rdma/test_rdma_security.c). ----

BIND_READ, BIND_WRITE, UNBIND = 7, 8, 9
INVALID_ARG, PROTOCOL = kvpool.ERR_INVALID_ARG, kvpool.ERR_PROTOCOL


def bind_request(rep, op, grant, qp=1, as_=None):
    """One BIND of rep's extent for queue pair qp; (status, payload, closed-after)."""
    flags, tail = grant_wire(grant)
    body = VEC.pack(rep.segment_id, rep.offset, rep.length)
    with data_conn(rep, as_) as s:
        s.sendall(REQ.pack(DATA_MAGIC, op, flags, qp, 1, rep.length) + body + tail)
        r = reply(s)
        if r is None:
            return None, b"", True
        return r[0], r[1], closed(s, 1)


def test_window_frames_on_an_owner_without_windows(gm, victim):
    key, data, rep = victim
    before = gm.owner_refused()
    # no grant, a read grant used to bind for writing, a bit-flipped set: refused, closed,
    # counted, as the same grants on a READV/WRITEV
    assert refused(bind_request(rep, BIND_READ, None))
    assert refused(bind_request(rep, BIND_WRITE, rep.grant))
    bad = bytearray(rep.grant.blob)
    bad[40] ^= 1
    assert refused(bind_request(rep, BIND_READ, SetGrant(bytes(bad), rep.grant.index)))
    assert gm.owner_refused() == before + 3
    # an honest principal's valid grant: this owner binds no windows, says so, goes on
    status, payload, was_closed = bind_request(rep, BIND_READ, rep.grant)
    assert status == INVALID_ARG and payload == b"" and not was_closed
    # absurd counts: a protocol error, closed before anything is read
    with data_conn(rep) as s:
        s.sendall(REQ.pack(DATA_MAGIC, BIND_READ, F_GRANT_SET, 1, 0, 0))
        r = reply(s)
        assert r is not None and r[0] == PROTOCOL and closed(s)
    with data_conn(rep) as s:
        s.sendall(REQ.pack(DATA_MAGIC, UNBIND, 0, 1, 100000, 0))
        r = reply(s)
        assert r is not None and r[0] == PROTOCOL and closed(s)
    # an UNBIND from a connection that proved no principal: closed, nothing answered
    with data_conn(rep, as_=False) as s:
        s.sendall(REQ.pack(DATA_MAGIC, UNBIND, 0, 1, 1, 0) + struct.pack("<II", 1, 0))
        assert closed(s)
    assert gm.owner_refused() == before + 3
    intact(gm, key, data)


def test_an_object_ended_unwritten_reads_nothing_of_the_extents_last_object(gm):
    """Found by the owner fuzzer (tests/insider/owner_frames.c, --unwritten-puts): bob ends
    a put without writing a byte of it (PutEnd takes the client's word that it wrote) and
    reads his object back with the read grant GetReplicaList gives him. The extent was
    alice's object's until she removed it: what the owner returns must not be her bytes.
    The owner, its segment holding two tenants' objects, checks each ended object's bytes
    against the CRC its writer declared (client/segment/seg_record.c): bob's does not
    match, so it is never served (his read refused) and the extent is zeroed. A second
    try, writing half of it and declaring the CRC of his half and her bytes (as if her
    bytes were still there to be confirmed by a guess), is refused too: zeros are there."""
    size = 8192
    mark = b"alice-" + uuid.uuid4().hex.encode()
    secret = (mark * (size // len(mark) + 1))[:size]
    with gm.client("alice", transport="tcp") as alice:
        old = f"a@unwritten-{uuid.uuid4().hex[:8]}"
        alice.put(old, secret)
        (rep_a,) = replicas_of(gm, old, who="alice")
        alice.remove(old)
    landed = None
    with bob_control(gm) as s:
        for i in range(64):  # raw puts of her size until one is given her old extent
            k = f"b@unwritten-{i}-{uuid.uuid4().hex[:6]}"
            w = put_start_raw(s, k, size)
            if w.segment_id == rep_a.segment_id and w.offset == rep_a.offset:
                landed = k
                put_end_raw(s, k, 0)  # not a byte written
                break
            d = bytes([i]) * size
            assert request(w, WRITE, w.offset, size, w.grant, d)[0] == 0
            put_end_raw(s, k, crc32c(d))
        assert landed is not None, "no put of bob's landed on alice's old extent"
        rep, _ = get_replicas_raw(s, landed)
        status, payload, _ = request(rep, READ, rep.offset, rep.length, rep.grant)
        assert mark not in payload, "bob read the bytes of alice's removed object"
        assert status == DENIED and payload == b"", status
        # again at the zeroed extent: half written, the rest guessed as hers
        with gm.client("bob", transport="tcp") as bob:
            bob.remove(landed)
        half = b"b" * (size // 2)
        again = None
        for i in range(64):
            k = f"b@half-{i}-{uuid.uuid4().hex[:6]}"
            w = put_start_raw(s, k, size)
            if w.segment_id == rep_a.segment_id and w.offset == rep_a.offset:
                assert request(w, WRITE, w.offset, size // 2, w.grant, half)[0] == 0
                put_end_raw(s, k, crc32c(half + secret[size // 2:]))  # a guess of hers: wrong
                again = k
                break
            put_end_raw(s, k, 0)
        assert again is not None, "no later put of bob's landed on the extent"
        rep, _ = get_replicas_raw(s, again)
        status, payload, _ = request(rep, READ, rep.offset, rep.length, rep.grant)
        assert mark not in payload and status == DENIED, status
