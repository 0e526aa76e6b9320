"""The insider fuzzer (issue 45, "an insider fuzzer, not only a list"): tests/insider/
insider_fuzz.c against a real master with TLS 1.3 and an ACL of two tenants.

Tenant A (team-a): alice (read, write), the canary, and owna, whose `kvpool serve --tenant
team-a` serves a segment dedicated to team-a. Tenant B (team-b), the fuzzer's principals,
one after the other: bob-read, bob-write, bob-seg (segment), bob-mix (read, write,
segment), bob-keys (read, write, keys b/*) and bob-none (no role); team-b has quotas (8 MiB
of DRAM, 2000 objects). Every principal is named by a token (in a file, never in argv).

For KVPOOL_INSIDER_SECONDS (default 60; longer by hand, e.g. 1800) the fuzzer sends every
method of the master's table with mutated bodies, sizes, ids, keys, patterns, unknown
fields and garbled frames, while alice puts, gets, lists and removes and the master's RSS
and descriptors are sampled: any call of alice's over 1 s, a wrong or missing object, her
key marker in anything team-b receives, the master's RSS over 256 MiB or more than 256
descriptors, or a request of team-b's left unanswered is a violation: the fuzzer prints the
seed and the last requests (all of them in insider-last.bin in the test's directory) and
exits 1. KVPOOL_INSIDER_SEED=N replays a seed (answers steer it too: close, not exact).

It always runs its own TLS master, so the suite's TLS pass skips it (once is enough), and a
pip-installed tree without the build's tests/insider_fuzz skips it too.
"""
import hashlib
import os
import subprocess
import uuid

import pytest

from conftest import TLS_DIR, Proc, _bin, stop_all

SECONDS = int(os.environ.get("KVPOOL_INSIDER_SECONDS", "60"))

# name -> (tenant, roles, keys); every one named by a token
PRINCIPALS = {
    "alice": ("team-a", "read, write", None),
    "owna": ("team-a", "segment", None),
    "bob-read": ("team-b", "read", None),
    "bob-write": ("team-b", "write", None),
    "bob-seg": ("team-b", "segment", None),
    "bob-mix": ("team-b", "read, write, segment", None),
    "bob-keys": ("team-b", "read, write", "b/*"),
    "bob-none": ("team-b", None, None),
}
FUZZERS = [n for n in PRINCIPALS if n.startswith("bob-")]
CRED_ENV = ("KVPOOL_TLS_CA", "KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY", "KVPOOL_TOKEN")


def fuzz_bin():
    path = os.environ.get("KVPOOL_INSIDER_FUZZ_BIN")
    if not path:
        master = os.environ.get("KVPOOL_MASTER_BIN", "")
        path = os.path.join(os.path.dirname(os.path.dirname(master)), "tests", "insider_fuzz")
    return path if os.access(path, os.X_OK) else None


def run_fuzzer(argv, env, seconds, master, owner):
    """Run the fuzzer (argv) for its seconds: no violation, the master and owner still up."""
    run = subprocess.run(argv, env=env, capture_output=True, timeout=seconds + 120)
    out, err = run.stdout.decode(), run.stderr.decode()
    print(out)
    assert run.returncode == 0, f"{out}\n{err[-6000:]}"
    assert " 0 violations" in out, out
    assert master.p.poll() is None, "the master exited"
    assert owner.p.poll() is None, "the owner exited"


def certs_and_acl(d, env, principals, extra):
    """deploy/make-certs.sh's certificates in d and an ACL (d/acl.conf) naming each principal
    of principals (name -> (tenant, roles, keys)) by a fresh token, then the lines extra:
    {name: the token's file}."""
    r = subprocess.run(["bash", os.path.join(os.path.dirname(__file__), "..", "..", "deploy",
                                             "make-certs.sh"), str(d)],
                       env=env, capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    acl = []
    tokens = {}
    for name, (tenant, roles, keys) in principals.items():
        tok = f"{name}-{uuid.uuid4().hex}"
        tokens[name] = d / f"{name}.token"
        tokens[name].write_text(tok)
        acl += [f"[principal {name}]", f"tenant = {tenant}",
                f"token-sha256 = {hashlib.sha256(tok.encode()).hexdigest()}"]
        if roles:
            acl.append(f"roles = {roles}")
        if keys:
            acl.append(f"keys = {keys}")
        acl.append("")
    (d / "acl.conf").write_text("\n".join(acl + extra))
    return tokens


@pytest.mark.skipif(TLS_DIR is not None, reason="runs its own TLS master: once is enough")
@pytest.mark.skipif(SECONDS <= 0, reason="KVPOOL_INSIDER_SECONDS=0")
def test_insider_fuzzer(tmp_path):
    fuzzer = fuzz_bin()
    if fuzzer is None:
        pytest.skip("no tests/insider_fuzz next to the master binary (a pip-installed tree)")
    env = {k: v for k, v in os.environ.items() if k not in CRED_ENV}
    d = tmp_path
    tokens = certs_and_acl(d, env, PRINCIPALS,
                           ["[tenant team-b]", "max-dram = 8MiB", "max-objects = 2000", ""])
    log = open(d / "master.log", "wb")
    master = Proc([_bin("KVPOOL_MASTER_BIN"), "--listen", "127.0.0.1:0", "--ready-fd", "{fd}",
                   "--log-level", "warn", "--tls-cert", str(d / "server.crt"),
                   "--tls-key", str(d / "server.key"), "--tls-ca", str(d / "ca.crt"),
                   "--acl-file", str(d / "acl.conf")], stderr=log, env=env)
    procs = [master]
    try:
        owner = Proc([_bin("KVPOOL_CLI_BIN"), "--master", master.ready, "--tls-ca",
                      str(d / "ca.crt"), "--token-file", str(tokens["owna"]), "serve",
                      "--segment-size", "64MiB", "--tenant", "team-a", "--ready-fd", "{fd}"],
                     env=env)
        procs.insert(0, owner)
        argv = [fuzzer, "--master", master.ready, "--ca", str(d / "ca.crt"),
                "--pid", str(master.pid), "--canary", str(tokens["alice"]),
                "--seconds", str(SECONDS), "--dump", str(d / "insider-last.bin")]
        if os.environ.get("KVPOOL_INSIDER_SEED"):
            argv += ["--seed", os.environ["KVPOOL_INSIDER_SEED"]]
        for name in FUZZERS:
            argv += ["--principal", f"{name}={tokens[name]}"]
        run_fuzzer(argv, env, SECONDS, master, owner)
    finally:
        bad = stop_all(procs)
        log.close()
    assert not bad, f"children exited non-zero: {bad}"
