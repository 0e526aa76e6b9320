"""The insider fuzzer against a segment owner (issue 45, "the same against an owner's data
port and the shm socket"): tests/insider/insider_fuzz.c --owner (owner_frames.c) against a
`kvpool serve` owner whose DRAM segment is shared by both tenants, and which serves an SSD
segment too (its own data port; tenant B puts a third of its objects straight there), with
TLS 1.3, an ACL of two tenants and data grants on, and again without TLS (no ACL, no
grants).

The principals are test_insider_fuzz.py's. Tenant A (team-a): alice (read, write), the
canary; owna (segment) serves the segment, shared here (no --tenant).
Tenant B (team-b), the fuzzer's principals, one after the other: bob-read, bob-write,
bob-seg, bob-mix, bob-keys (b/*), bob-none, and a stranger with no credentials (no master
connection: the owner's addresses and what the principals left behind). Without TLS: one
client of the master with no token, and the stranger.

For KVPOOL_OWNER_FUZZ_SECONDS (default 60 with TLS, 30 without; longer by hand, e.g. 1800) the principals take
real grants from the master (PutStart, written and ended; GetReplicaList) for their own
keys, and send every data-plane frame (READ, WRITE, READV, WRITEV, HELLO, MAP, BIND_READ,
BIND_WRITE, UNBIND, an unknown op, a bad magic) to the owner's tcp data ports (DRAM and
SSD) and its shm socket with mutated segment ids, offsets, lengths, counts, flags, grants, grant sets and
indices, cut, trickled and half-closed frames, and bursts of connections; alice puts and
gets objects (her marker every 256 bytes) on the same segment. A violation: a call of
alice's over 1 s or wrong, her marker in any reply tenant B received (with grants on), a
MAP that hands B the segment's memory (grants on), the owner or master gone, the owner's
RSS over 256 MiB or more than 512 descriptors. The fuzzer prints the seed and the last
frames (all in owner-last.bin in the test's directory) and exits 1;
KVPOOL_OWNER_FUZZ_SEED=N replays a seed (answers steer it: close, not exact).

Tenant B also ends a quarter of its puts without writing a byte and reads them back with
the real read grant it is given (the finding this fuzzer made: the extent held part of an
object alice removed, and her marker came back within seconds). The owner now checks each
ended object's bytes once its segment holds two tenants' objects (docs/security.md, "An
object ended unwritten"): such a read is refused. KVPOOL_OWNER_FUZZ_UNWRITTEN=0 leaves
that attack out.

Without TLS the owner trusts every peer (by design): replies are not checked for alice's
marker and the fuzzer writes only to its own hard-pinned objects; what is tested is the
owner's parsing and limits under every frame. The suite's TLS pass skips both runs (they
start their own master, with and without TLS: once is enough).
"""
import os

import pytest

from conftest import TLS_DIR, Proc, _bin, free_port, shm_name, stop_all
from test_insider_fuzz import CRED_ENV, FUZZERS, PRINCIPALS, certs_and_acl, fuzz_bin, run_fuzzer

SECONDS = int(os.environ.get("KVPOOL_OWNER_FUZZ_SECONDS", "60"))
# Without TLS nothing but parsing and limits is checked (see above): half as long by default.
PLAIN_SECONDS = int(os.environ.get("KVPOOL_OWNER_FUZZ_SECONDS", "30"))

@pytest.mark.skipif(TLS_DIR is not None, reason="runs its own masters, with and without TLS")
@pytest.mark.skipif(SECONDS <= 0, reason="KVPOOL_OWNER_FUZZ_SECONDS=0")
@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])
def test_owner_fuzzer(tmp_path, tls):
    seconds = SECONDS if tls else PLAIN_SECONDS
    fuzzer = fuzz_bin()
    if fuzzer is None:
        pytest.skip("no tests/insider_fuzz next to the master binary (a pip-installed tree)")
    env = {k: v for k, v in os.environ.items() if k not in CRED_ENV}
    d = tmp_path
    master_args, serve_args, fuzz_args = [], [], []
    if tls:
        tokens = certs_and_acl(d, env, PRINCIPALS,
                               ["[tenant team-b]", "max-dram = 8MiB", "max-objects = 2000", ""])
        master_args = ["--tls-cert", str(d / "server.crt"), "--tls-key", str(d / "server.key"),
                       "--tls-ca", str(d / "ca.crt"), "--acl-file", str(d / "acl.conf")]
        serve_args = ["--tls-ca", str(d / "ca.crt"), "--token-file", str(tokens["owna"])]
        fuzz_args = ["--ca", str(d / "ca.crt"), "--canary", str(tokens["alice"])]
        fuzz_args += [a for n in FUZZERS for a in ("--principal", f"{n}={tokens[n]}")]
    else:
        fuzz_args = ["--canary", "-", "--principal", "anyone=-"]
    fuzz_args += ["--principal", "stranger=none"]
    log = open(d / "master.log", "wb")
    master = Proc([_bin("KVPOOL_MASTER_BIN"), "--listen", "127.0.0.1:0", "--ready-fd", "{fd}",
                   "--log-level", "warn", *master_args], stderr=log, env=env)
    procs = [master]
    try:
        port = free_port()
        owner = Proc([_bin("KVPOOL_CLI_BIN"), "--master", master.ready, *serve_args, "serve",
                      "--segment-size", "64MiB", "--data-host", "127.0.0.1",
                      "--data-port", str(port), "--ssd-path", str(d / "ssd.seg"),
                      "--ssd-size", "32MiB", "--ssd-buffered-io", "--ready-fd", "{fd}"],
                     env=env)
        procs.insert(0, owner)
        argv = [fuzzer, "--master", master.ready, "--pid", str(master.pid),
                "--owner", f"127.0.0.1:{port}", "--owner-shm", shm_name(owner.pid),
                "--owner-pid", str(owner.pid), "--seconds", str(seconds),
                "--dump", str(d / "owner-last.bin"), *fuzz_args]
        if os.environ.get("KVPOOL_OWNER_FUZZ_UNWRITTEN", "1") == "1":
            argv += ["--unwritten-puts", "1"]
        if os.environ.get("KVPOOL_OWNER_FUZZ_SEED"):
            argv += ["--seed", os.environ["KVPOOL_OWNER_FUZZ_SEED"]]
        run_fuzzer(argv, env, seconds, master, owner)
    finally:
        bad = stop_all(procs)
        log.close()
    assert not bad, f"children exited non-zero: {bad}"
