"""Transfer sessions and tenants: a session sees only its own tenant's keys (the master
looks keys up in the caller's tenant at session start; the ranges then touch only the
extents it handed out). The master, ACL and principals are test_tenants.py's."""

import kvpool
from test_security import certs, no_ambient_credentials  # noqa: F401 (fixtures)
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
