"""Names are what they look like: a tenant or segment name with a NUL or a control character
is refused, never cut short or kept; a segment name with a space at either end is refused;
`kvpool stat` prints what a name really is.

Everything runs for real on 127.0.0.1: kvpool-master (with TLS 1.3 and an ACL,
test_tenants.py's TenantMaster, for the tenant quota API on its HTTPS port; with neither
for the mounts, /metrics on a plain HTTP port), `kvpool serve` segments and library
clients mounting segments of their own.

Covered:
 1. the tenant quota API: PUT, DELETE and GET of ?tenant_id= with %00 (`zz-nul%00b`, which
    once became tenant `zz-nul`), a tab, an escape, a DEL: 400 INVALID_PARAMS saying so,
    no tenant made (neither the whole name nor the part before the NUL), each counted in
    kvpool_names_refused_total{reason="tenant"}; a good PUT afterwards still works;
    the ACL file: a principal, tenant or cert-cn with a NUL, a tab or another control
    character refuses the file at start, naming the line (so `ali\\0ce` never becomes
    principal `ali`);
 2. segment names at mount: a tab, a newline, an escape, a DEL, a space at either end,
    through the library and through `kvpool serve --name`: KVP_ERR_INVALID_ARG with the
    master's message (the name escaped), counted in
    kvpool_names_refused_total{reason="segment"}; the master serves on (a good mount, a
    put and a get after them);
 3. `kvpool stat`: segments named `seg-a`, `Seg-A` (case: two segments, printed as they
    are) and `seg-a` with a no-break space at its end (not ASCII whitespace, so taken)
    print apart: the last quoted, its bytes escaped (`"seg-a\\xc2\\xa0"`).
"""

import subprocess
import urllib.parse

import pytest

import kvpool
from conftest import Proc, _bin, free_port, http_get, metric, stop_all
from test_security import certs, no_ambient_credentials  # noqa: F401 (fixtures)
from test_tenant_quotas import call, mc_error, ok
from test_tenants import make_master  # noqa: F401 (fixture)

BODY = {"requested_quota_bytes": 1 << 20}


# ---- 1. the tenant quota API ----

def test_quota_api_refuses_nul_and_control_characters(make_master):
    m = make_master()
    before = {d["tenant_id"] for d in ok(m, "GET")}
    bad = ["zz-nul%00b", "zz-nul%00", "%00zz", "zz%09tab", "zz%1B%5B31m", "zz%7F", "zz%0A"]
    for i, q in enumerate(bad):
        for method, body in (("PUT", BODY), ("DELETE", None), ("GET", None)):
            msg = mc_error(call(m, method, f"tenant_id={q}", body), 400, -600)
            assert "NUL or control character" in msg, (method, q, msg)
        assert metric(m.metrics(), "kvpool_names_refused_total",
                      {"reason": "tenant"}) == 3 * (i + 1)
    after = {d["tenant_id"] for d in ok(m, "GET")}
    assert after == before, after
    mc_error(call(m, "GET", "tenant_id=zz-nul"), 404, -704)  # never made
    # a good name is taken as before
    d = ok(m, "PUT", "tenant_id=" + urllib.parse.quote("zz-ok"), BODY)
    assert d["tenant_id"] == "zz-ok"


# ---- 1b. the ACL file ----

ACL_LINES = {
    "[principal ali\x00ce]": "a NUL byte in the line",
    "[principal ali\tce]": "a principal's name holds a tab",
    "[principal ali\x1bce]": "a control character in the line",
    "[tenant team\x00x]": "a NUL byte in the line",
    "cert-cn = ali\x7fce": "a control character in the line",
    "tenant = team-a\x00b": "a NUL byte in the line",
}


def test_acl_file_refuses_nul_and_control_characters(certs, tmp_path):
    for i, (line, why) in enumerate(ACL_LINES.items()):
        head = "" if line.startswith("[") else "[principal alice]\n"
        body = head + line + "\nroles = read\ntoken-sha256 = " + "ab" * 32 + "\n"
        acl = tmp_path / f"acl{i}.ini"
        acl.write_bytes(body.encode("latin-1"))
        r = subprocess.run([_bin("KVPOOL_MASTER_BIN"), "--listen", "127.0.0.1:0",
                            "--tls-cert", certs.server_crt, "--tls-key", certs.server_key,
                            "--tls-ca", certs.ca, "--acl-file", str(acl)],
                           capture_output=True, timeout=60)
        err = r.stderr.decode("utf-8", "replace")
        assert r.returncode != 0, (line, err)
        want_line = 1 if line.startswith("[") else 2
        assert f"{acl}:{want_line}: {why}" in err, (line, err)


# ---- 2. and 3. segment names ----

@pytest.fixture
def plain_master(request):
    """A master with no TLS and no ACL and /metrics on plain HTTP: (address, HTTP port)."""
    port = free_port()
    master = Proc([_bin("KVPOOL_MASTER_BIN"), "--listen", "127.0.0.1:0", "--ready-fd", "{fd}",
                   "--log-level", "error", "--lease-ttl", "0", "--http-listen",
                   f"127.0.0.1:{port}"])

    def fin():
        bad = stop_all([master])
        assert not bad, f"the master exited non-zero: {bad}"

    request.addfinalizer(fin)
    return master.ready, port


def refused_segments(port):
    status, text = http_get(port, "/metrics")
    assert status == 200
    return metric(text, "kvpool_names_refused_total", {"reason": "segment"})


BAD_SEGMENT_NAMES = {
    "seg\tx": ("seg\\x09x", "holds a control character"),
    "seg\nx": ("seg\\x0ax", "holds a control character"),
    "seg\x1b[31mx": ("seg\\x1b[31mx", "holds a control character"),
    "seg\x7f": ("seg\\x7f", "holds a control character"),
    "seg ": ("seg ", "starts or ends with a space"),
    " seg": (" seg", "starts or ends with a space"),
}


def test_mount_refuses_names_that_are_not_what_they_look_like(plain_master):
    addr, port = plain_master
    n = 0
    for name, (shown, why) in BAD_SEGMENT_NAMES.items():
        with pytest.raises(kvpool.Error) as ei:
            kvpool.Client(addr, segment_size="16MiB", segment_name=name)
        n += 1
        msg = str(ei.value)
        assert ei.value.status == kvpool.ERR_INVALID_ARG, msg
        assert f'segment name "{shown}" {why}' in msg, msg
        assert refused_segments(port) == n
    # kvpool serve: the same refusal, said on stderr, a failed exit
    r = subprocess.run([_bin("KVPOOL_CLI_BIN"), "--master", addr, "serve", "--segment-size",
                        "16MiB", "--name", "seg\tserve"], capture_output=True, timeout=60)
    assert r.returncode != 0
    assert b'segment name "seg\\x09serve" holds a control character' in r.stderr, r.stderr
    assert refused_segments(port) == n + 1
    # the master serves on
    with kvpool.Client(addr, segment_size="16MiB", segment_name="seg-fine") as c:
        c.put("names@1", b"bytes")
        assert c.get("names@1") == b"bytes"


def test_stat_shows_what_a_name_is(plain_master):
    addr, _ = plain_master
    names = ["seg-a", "Seg-A", "seg-a\u00a0"]
    clients = [kvpool.Client(addr, segment_size="16MiB", segment_name=n) for n in names]
    try:
        r = subprocess.run([_bin("KVPOOL_CLI_BIN"), "--master", addr, "stat"],
                           capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        out = r.stdout.decode()
        print("\n" + out)
        firsts = [line.split("  ")[0] for line in out.splitlines()]
        assert "seg-a" in firsts and "Seg-A" in firsts, firsts
        assert '"seg-a\\xc2\\xa0"' in firsts, firsts
    finally:
        for c in clients:
            c.close()
