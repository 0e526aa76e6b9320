"""Copy and move tasks under an ACL's tenants, against a real master: one tenant's flood of
tasks neither refuses another tenant's creates nor erases its finished tasks.

The attack reported: bob (tenant team-b) created copy tasks of his own object as fast as he
could, their runner never starting them; alice (team-a) was refused 48 of her 56 creates
(KVP_ERR_TOO_MANY) and her finished task vanished from query_task, for the master kept 4096
live and 4096 ended tasks over all tenants. Now each tenant holds at most its share (the ACL
here names 4 tenants, "default" included: 4096 / 4 = 1024) of live tasks and of ended ones
kept, its own oldest going first. The masters, ACL and principals are test_tenants.py's and
test_security.py's; the segments are `kvpool serve` processes named here, so that tasks can
name them, and the runner of bob's tasks is frozen (SIGSTOP) while he floods, then killed,
which fails every task it was to run at once."""

import contextlib
import os

import pytest

import kvpool
from conftest import Proc, freeze, metric
from test_security import certs, no_ambient_credentials  # noqa: F401 (fixtures)
from test_tenants import PRINCIPALS, make_master  # noqa: F401 (fixture)

TOO_MANY = kvpool.ERR_TOO_MANY
SHARE = 4096 // 4  # tenants: default, team-a, team-b, team-c


def serve(m, name):
    """A 16 MiB segment named `name` for master m (principal segsrv), stopped with m."""
    crt, key = m.certs.pair(PRINCIPALS["segsrv"]["cn"])
    s = Proc([m.cli_bin, "--master", m.addr, "--tls-ca", m.certs.ca, "--tls-cert", crt,
              "--tls-key", key, "serve", "--segment-size", "16MiB", "--name", name,
              "--ready-fd", "{fd}"])
    m.segments.append(s)
    return s


@contextlib.contextmanager
def frozen(m, seg):
    """seg's server frozen (SIGSTOP) inside, killed on the way out whatever happened: the
    master then fails every task it was to run."""
    freeze(seg.pid)
    try:
        yield
    finally:
        seg.kill()
        m.segments.remove(seg)


def flood(bob, key, target, most):
    """bob creates copy tasks of key until refused (at most `most`): (ids, the refusal)."""
    ids = []
    for _ in range(most):
        try:
            ids.append(bob.copy_task(key, [target]))
        except kvpool.Error as e:
            return ids, e
    return ids, None


def test_a_tenants_task_flood_leaves_another_tenant_alone(make_master):
    m = make_master(segments=())
    first = serve(m, "tt:1")
    serve(m, "tt:2")
    with m.client("alice") as alice, m.client("bob") as bob:
        data = os.urandom(4096)
        alice.put("a@obj", data, preferred_segment="tt:1")
        done = alice.copy_task("a@obj", ["tt:2"])
        assert alice.wait_task(done)["status"] == kvpool.TASK_SUCCESS
        bob.put("b@obj", b"b" * 4096, preferred_segment="tt:1")

        # the attack: the runner of his tasks frozen, bob floods until refused, and alice
        # creates 56 tasks (their runner the same: all 1080 fail when it is killed)
        with frozen(m, first):
            ids, refused = flood(bob, "b@obj", "tt:2", 5000)
            mine = [alice.copy_task("a@obj", ["tt:2"]) for _ in range(56)]  # all created
        assert len(mine) == 56
        assert refused is not None and refused.status == TOO_MANY, refused
        assert len(ids) == SHARE, len(ids)
        why = str(refused)
        assert "team-b" in why and f"at most {SHARE} a tenant" in why, why
        assert bob.wait_task(ids[-1])["status"] == kvpool.TASK_FAILED
        assert alice.wait_task(mine[-1])["status"] == kvpool.TASK_FAILED

        # four more rounds: bob's ended tasks (5 x 1024 in all, more than the master's
        # 4096) trim his own, never alice's
        last = []
        for r in range(2, 6):
            seg = serve(m, f"tt:{r + 1}")
            bob.put(f"b@obj{r}", b"b" * 4096, preferred_segment=f"tt:{r + 1}")
            with frozen(m, seg):
                last, refused = flood(bob, f"b@obj{r}", "tt:2", SHARE + 1)
            assert len(last) == SHARE and refused.status == TOO_MANY, (len(last), refused)
            assert bob.wait_task(last[-1])["status"] == kvpool.TASK_FAILED
        # his next create trims his ended tasks to his share: the last round's are kept
        bob.put("b@last", b"b" * 4096, preferred_segment="tt:2")
        bob.copy_task("b@last", ["tt:2"])
        for tid in ids[:8]:
            with pytest.raises(kvpool.Error) as e:
                bob.query_task(tid)
            assert e.value.status == kvpool.ERR_NOT_FOUND, e.value
        for tid in last[:8] + last[-8:]:
            assert bob.query_task(tid)["status"] == kvpool.TASK_FAILED

        # the victim: her finished task still answered, and those that failed
        r = alice.query_task(done)
        assert r["status"] == kvpool.TASK_SUCCESS and r["assigned"] == "tt:1", r
        for tid in mine:
            assert alice.query_task(tid)["status"] == kvpool.TASK_FAILED
        assert alice.get("a@obj") == data

    text = m.metrics()
    assert metric(text, "kvpool_tasks_refused_total", {"reason": "tenant"}) == 5
    assert metric(text, "kvpool_tasks_refused_total", {"reason": "master"}) == 0
    assert metric(text, "kvpool_tasks_live", None) <= 1
