"""Transfer sessions, tenants and roles: a session sees only its own tenant's keys (the
master looks keys up in the caller's tenant at session start; the ranges then touch only
the extents it handed out), and starts only what the caller's roles and key patterns allow
(refusals counted in /metrics). The masters, ACLs and principals are test_tenants.py's and
test_security.py's."""

import kvpool
from test_security import DENIED, certs, no_ambient_credentials, poll, sec  # noqa: F401
from test_tenants import make_master  # noqa: F401 (fixture)


def test_sessions_per_tenant(make_master):
    m = make_master()
    key = "shared@sess-1"
    a, b = b"A" * 5000, b"B" * 3000
    with m.client("alice") as alice, m.client("bob") as bob:
        assert alice.put_session_start([key], [len(a)]) == [0]
        # bob's tenant has no such key, pending or not: its own session starts
        assert bob.get_session_start([key]) == [kvpool.ERR_NOT_FOUND]
        assert bob.put_session_start([key], [len(b)]) == [0]
        assert alice.put_session_ranges([key], [[a]], [[0]]) == [len(a)]
        assert bob.put_session_ranges([key], [[b]], [[0]]) == [len(b)]
        assert bob.put_session_end([key]) == [0]
        # alice's put is not visible to anyone yet, bob's only to bob's tenant
        assert not alice.batch_exists([key])[0] and bob.batch_exists([key])[0]
        assert alice.put_session_end([key]) == [0]
        out_a, out_b = bytearray(len(a)), bytearray(len(b))
        assert alice.get_session_start([key]) == [0]
        assert bob.get_session_start([key]) == [0]
        assert alice.get_session_ranges([key], [[out_a]], [[0]]) == [len(a)]
        assert bob.get_session_ranges([key], [[out_b]], [[0]]) == [len(b)]
        assert bytes(out_a) == a and bytes(out_b) == b
        # a range past bob's object (shorter than alice's) is refused, not read from hers
        assert bob.get_session_ranges([key], [[out_a]], [[0]]) == [kvpool.ERR_INVALID_ARG]
        alice.get_session_end([key])
        bob.get_session_end([key])
        # carol (a third tenant) cannot end or revoke what alice or bob started: she has
        # no session, and the master has no put of hers
        with m.client("carol") as carol:
            assert carol.put_session_revoke([key]) == [kvpool.ERR_INVALID_ARG]


def test_sessions_need_the_roles(sec):
    """A reader may not start a put session, alice (keys a@*) not on another's key: DENIED,
    counted by reason; nothing is reserved. A reader's get session works on its own keys
    and finds nothing of another tenant's."""
    role0, key0 = sec.req_refused("role"), sec.req_refused("key")
    with sec.client("reader") as reader, sec.client("alice") as alice:
        assert reader._c.put_session_start(["r@x"], [100]) == [DENIED]
        assert alice._c.put_session_start(["b@x"], [100]) == [DENIED]
        assert alice.put_session_start(["a@sess"], [3]) == [0]
        assert alice.put_session_ranges(["a@sess"], [[b"abc"]], [[0]]) == [3]
        assert alice.put_session_end(["a@sess"]) == [0]
        assert reader._c.get_session_start(["a@sess"]) == [kvpool.ERR_NOT_FOUND]
        poll(lambda: sec.req_refused("role") >= role0 + 1, "the reader's put counted (role)")
        poll(lambda: sec.req_refused("key") >= key0 + 1, "alice's b@ key counted (key)")
        assert not reader.batch_exists(["r@x"])[0]  # nothing reserved or stored
        alice.remove("a@sess")
