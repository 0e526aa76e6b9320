"""etcd over TLS with client certificates, and etcd's user/password authentication.

Real etcd (Debian's etcd-server, 3.4) and etcdctl, certificates from deploy/make-certs.sh:
- an etcd that takes TLS clients with a certificate of its CA only (--client-cert-auth):
  a master given the CA and a client certificate leads, and a client that finds it
  through etcd:// with KVPOOL_ETCD_* in its environment puts and gets; a master without
  a client certificate, or with a CA that did not sign etcd's, never leads and its log
  says why;
- an etcd over https with authentication on (a user with readwrite on the cluster's
  prefix, simple tokens that die after 1 s idle): the master with --etcd-user and
  --etcd-password-file leads and keeps leading across re-authentications; a wrong
  password never leads, says so, and the password appears in no log, metric or error.

The masters run without TLS of their own and the clients without KVPOOL_TLS_* (this test
is about the etcd side); it adds nothing in deploy/test.sh's TLS pass and skips itself there.
"""

import os
import secrets
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request

import pytest

import kvpool
from conftest import TLS_DIR, Proc, _bin, free_port, http_get, metric

pytestmark = pytest.mark.skipif(TLS_DIR is not None,
                                reason="the etcd side only: the same in the TLS pass")

ETCD_ENV = ("KVPOOL_ETCD_CACERT", "KVPOOL_ETCD_CERT", "KVPOOL_ETCD_KEY", "KVPOOL_ETCD_USER",
            "KVPOOL_ETCD_PASSWORD_FILE")


def wait_for(cond, what, timeout=20.0, step=0.1):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(step)


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch):
    for v in ("KVPOOL_TLS_CA", "KVPOOL_TLS_CERT", "KVPOOL_TLS_KEY", "KVPOOL_TOKEN") + ETCD_ENV:
        monkeypatch.delenv(v, raising=False)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("etcd-certs")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "deploy", "make-certs.sh")
    subprocess.run([script, str(d), "kvpool"], check=True, capture_output=True,
                   env={**os.environ, "KVPOOL_TEST_CERTS": "1"})
    san = subprocess.run(["openssl", "x509", "-in", str(d / "server.crt"), "-noout", "-ext",
                          "subjectAltName"], check=True, capture_output=True, text=True).stdout
    assert "IP Address:127.0.0.1" in san, san  # etcd's certificate must name the endpoint
    return d


class Etcd:
    """A private single-member etcd serving https://127.0.0.1:PORT."""

    def __init__(self, certs, workdir, extra):
        exe = shutil.which("etcd") or "/usr/bin/etcd"
        if not os.access(exe, os.X_OK):
            pytest.fail("etcd is not installed (deploy/install-deps.sh installs etcd-server)")
        self.certs = certs
        cport, pport = free_port(), free_port()
        self.endpoint = f"127.0.0.1:{cport}"
        url, purl = f"https://{self.endpoint}", f"http://127.0.0.1:{pport}"
        self.log = workdir / "etcd.log"
        self.p = subprocess.Popen(
            [exe, "--name", "m0", "--data-dir", str(workdir / "data"),
             "--listen-client-urls", url, "--advertise-client-urls", url,
             "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
             "--initial-cluster", f"m0={purl}", "--initial-cluster-state", "new",
             "--initial-cluster-token", f"kvpool-etcd-sec-{os.getpid()}-{pport}",
             "--cert-file", str(certs / "server.crt"), "--key-file", str(certs / "server.key"),
             "--logger=zap", "--log-outputs=stderr", *extra],
            stdout=open(self.log, "wb"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        ctx = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        ctx.load_cert_chain(str(certs / "kvpool.crt"), str(certs / "kvpool.key"))

        def healthy():
            if self.p.poll() is not None:
                pytest.fail("etcd exited: " + self.log.read_text()[-2000:])
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2, context=ctx) as r:
                    return '"health":"true"' in r.read().decode()
            except (OSError, urllib.error.URLError):
                return False

        try:
            wait_for(healthy, "etcd to answer", 30, 0.2)
        except BaseException:
            self.stop()
            raise

    def ctl(self, *args, input=None):
        """etcdctl against this etcd (as root once auth is on: pass --user)."""
        exe = shutil.which("etcdctl") or "/usr/bin/etcdctl"
        return subprocess.run([exe, "--endpoints", f"https://{self.endpoint}", "--cacert",
                               str(self.certs / "ca.crt"), "--cert", str(self.certs / "kvpool.crt"),
                               "--key", str(self.certs / "kvpool.key"), *args], input=input,
                              check=True, capture_output=True, text=True, timeout=30).stdout

    def stop(self):
        if self.p.returncode is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(5)


@pytest.fixture(scope="module")
def mtls_etcd(certs, tmp_path_factory):
    """etcd that takes only clients with a certificate of our CA."""
    e = Etcd(certs, tmp_path_factory.mktemp("etcd-mtls"),
             ["--trusted-ca-file", str(certs / "ca.crt"), "--client-cert-auth"])
    yield e
    e.stop()


CLUSTER = f"sec{os.getpid()}"


@pytest.fixture(scope="module")
def auth_etcd(certs, tmp_path_factory):
    """etcd over https with authentication on; simple tokens die after 1 s idle.
    .password_file: user kvpool's password (readwrite on /kvpool/CLUSTER/ only)."""
    work = tmp_path_factory.mktemp("etcd-auth")
    e = Etcd(certs, work, ["--auth-token", "simple", "--auth-token-ttl", "1"])
    try:
        root_pw, e.password = secrets.token_hex(16), secrets.token_hex(16)
        e.root_pw = root_pw
        e.ctl("user", "add", f"root:{root_pw}")
        e.ctl("role", "add", "root")
        e.ctl("user", "grant-role", "root", "root")
        e.ctl("user", "add", f"kvpool:{e.password}")
        e.ctl("role", "add", "kvpool")
        e.ctl("role", "grant-permission", "kvpool", "--prefix=true", "readwrite",
              f"/kvpool/{CLUSTER}/")
        e.ctl("user", "grant-role", "kvpool", "kvpool")
        e.ctl("auth", "enable")
        e.password_file = work / "kvpool.password"
        fd = os.open(e.password_file, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, (e.password + "\n").encode())  # the trailing newline is stripped
        os.close(fd)
        yield e
    finally:
        e.stop()


class Master:
    def __init__(self, etcd_endpoint, args, tmp_path, name):
        self.http = free_port()
        self.log = tmp_path / f"{name}.log"
        self.proc = Proc([_bin("KVPOOL_MASTER_BIN"), "--listen", "127.0.0.1:0", "--ready-fd",
                          "{fd}", "--http-listen", f"127.0.0.1:{self.http}", "--etcd",
                          etcd_endpoint, "--cluster", CLUSTER, *args],
                         stderr=open(self.log, "wb"))

    def health(self):
        return http_get(self.http, "/health")

    def metrics(self):
        return http_get(self.http, "/metrics")[1]

    def leads(self):
        return self.health()[0] == 200

    def log_text(self):
        return self.log.read_text()

    def stop(self):
        assert self.proc.stop() == 0


def put_get_through_etcd(endpoint, env, monkeypatch):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with kvpool.Client(f"etcd://{endpoint}/{CLUSTER}", segment_size="16MiB") as c:
        data = secrets.token_bytes(5000)
        c.put("etcd-sec-key", data)
        assert c.get("etcd-sec-key") == data
        c.remove("etcd-sec-key")


def test_client_certificate(mtls_etcd, certs, tmp_path, monkeypatch):
    m = Master(mtls_etcd.endpoint,
               ["--etcd-cacert", str(certs / "ca.crt"), "--etcd-cert", str(certs / "kvpool.crt"),
                "--etcd-key", str(certs / "kvpool.key")], tmp_path, "master")
    try:
        wait_for(m.leads, "the master to lead through etcd over TLS")
        assert "connected to etcd at https://127.0.0.1:" in m.log_text()
        put_get_through_etcd(mtls_etcd.endpoint,
                             {"KVPOOL_ETCD_CACERT": str(certs / "ca.crt"),
                              "KVPOOL_ETCD_CERT": str(certs / "kvpool.crt"),
                              "KVPOOL_ETCD_KEY": str(certs / "kvpool.key")}, monkeypatch)
        # the same client without the client certificate cannot find the leader, and says why
        monkeypatch.delenv("KVPOOL_ETCD_CERT")
        monkeypatch.delenv("KVPOOL_ETCD_KEY")
        with pytest.raises(kvpool.Error) as ei:
            kvpool.Client(f"etcd://{mtls_etcd.endpoint}/{CLUSTER}", rpc_timeout_ms=1500)
        # TLS 1.3: the refusal comes as an alert or as the connection closing under libcurl
        assert "TLS: " in str(ei.value) and "our client certificate" in str(ei.value), str(ei.value)
    finally:
        m.stop()


@pytest.mark.parametrize("case", ["no-client-cert", "wrong-ca"])
def test_refused_tls(mtls_etcd, certs, tmp_path, case):
    args = {"no-client-cert": ["--etcd-cacert", str(certs / "ca.crt")],
            "wrong-ca": ["--etcd-cacert", str(certs / "rogue-ca.crt"), "--etcd-cert",
                         str(certs / "kvpool.crt"), "--etcd-key", str(certs / "kvpool.key")]}[case]
    m = Master(mtls_etcd.endpoint, args, tmp_path, case)
    try:
        wait_for(lambda: "failed (" in m.log_text(), "the master to log the etcd failure", 10)
        why = {"no-client-cert": "our client certificate",
               "wrong-ca": "certificate problem: unable to get local issuer certificate"}[case]
        log = m.log_text()
        assert "TLS: " in log and why in log, log
        wait_for(lambda: metric(m.metrics(), "kvpool_etcd_requests_failed_total",
                                {"reason": "tls"}) >= 2, "failed requests counted as tls", 10)
        assert not m.leads()
        assert metric(m.metrics(), "kvpool_leader") == 0
    finally:
        m.stop()


def test_password(auth_etcd, certs, tmp_path, monkeypatch):
    ca = str(certs / "ca.crt")
    good = Master(auth_etcd.endpoint,
                  ["--etcd-cacert", ca, "--etcd-user", "kvpool", "--etcd-password-file",
                   str(auth_etcd.password_file), "--leader-ttl", "8"], tmp_path, "good")
    try:
        wait_for(good.leads, "the master to lead with an etcd user")
        epoch = metric(good.metrics(), "kvpool_epoch")
        # simple tokens die 1-2 s after their last use (etcd checks once a second); the
        # election's keepalives go every 8/3 s, so each one finds its token gone and
        # authenticates again: leadership and epoch must not notice
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            assert good.leads(), good.log_text()
            time.sleep(0.25)
        text = good.metrics()
        assert metric(text, "kvpool_etcd_reauthentications_total") >= 1, text
        assert metric(text, "kvpool_epoch") == epoch and metric(text, "kvpool_leader") == 1
        assert metric(text, "kvpool_etcd_requests_failed_total", {"reason": "auth"}) == 0
        put_get_through_etcd(auth_etcd.endpoint,
                             {"KVPOOL_ETCD_CACERT": ca, "KVPOOL_ETCD_USER": "kvpool",
                              "KVPOOL_ETCD_PASSWORD_FILE": str(auth_etcd.password_file)},
                             monkeypatch)
    finally:
        good.stop()

    wrong_pw = "not-" + secrets.token_hex(8)
    wrong_file = tmp_path / "wrong.password"
    fd = os.open(wrong_file, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, wrong_pw.encode())
    os.close(fd)
    bad = Master(auth_etcd.endpoint,
                 ["--etcd-cacert", ca, "--etcd-user", "kvpool", "--etcd-password-file",
                  str(wrong_file)], tmp_path, "bad")
    try:
        wait_for(lambda: "failed (" in bad.log_text(), "the master to log the refusal", 10)
        assert ("authentication as user 'kvpool' failed: etcdserver: authentication failed, "
                "invalid user ID or password") in bad.log_text(), bad.log_text()
        wait_for(lambda: metric(bad.metrics(), "kvpool_etcd_requests_failed_total",
                                {"reason": "auth"}) >= 2, "failed requests counted as auth", 10)
        assert not bad.leads()
        monkeypatch.setenv("KVPOOL_ETCD_CACERT", ca)
        monkeypatch.setenv("KVPOOL_ETCD_USER", "kvpool")
        monkeypatch.setenv("KVPOOL_ETCD_PASSWORD_FILE", str(wrong_file))
        with pytest.raises(kvpool.Error) as ei:
            kvpool.Client(f"etcd://{auth_etcd.endpoint}/{CLUSTER}", rpc_timeout_ms=1500)
        err = str(ei.value)
        assert "authentication as user 'kvpool' failed" in err, err
        metrics = bad.metrics()
    finally:
        bad.stop()
    for secret in (wrong_pw, auth_etcd.password):
        for where, text in (("master log", bad.log_text()), ("good master log", good.log_text()),
                            ("metrics", metrics), ("client error", err)):
            assert secret not in text, f"a password in the {where}"


def write_secret(path, text):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, (text + "\n").encode())
    os.close(fd)


def test_password_rotation(auth_etcd, certs, tmp_path):
    """The etcd password rotated while the master leads, with no restart and no signal:
    the password file is read again at each authentication. Rotated in etcd before the
    file: authentications fail (logged, counted, no secret) until the file has it; then
    the master authenticates with it and keeps leading, same epoch, and writes to etcd."""
    ca = str(certs / "ca.crt")
    pw_file = tmp_path / "rotating.password"
    write_secret(pw_file, auth_etcd.password)
    m = Master(auth_etcd.endpoint,
               ["--etcd-cacert", ca, "--etcd-user", "kvpool", "--etcd-password-file",
                str(pw_file), "--leader-ttl", "15"], tmp_path, "rotating")
    old_pw, new_pw = auth_etcd.password, secrets.token_hex(16)
    try:
        wait_for(m.leads, "the master to lead with an etcd user")
        epoch = metric(m.metrics(), "kvpool_epoch")
        # etcd first: the master's next authentication (its token dies after 1 s idle)
        # fails with the old password
        auth_etcd.ctl("--user", f"root:{auth_etcd.root_pw}", "user", "passwd", "kvpool",
                      "--interactive=false", input=new_pw + "\n")
        auth_etcd.password = new_pw
        # (the election's keepalive, every 5 s, finds its token gone and logs the refusal)
        wait_for(lambda: "authentication as user 'kvpool' failed" in m.log_text(),
                 "an authentication refused", 15)
        assert metric(m.metrics(), "kvpool_etcd_requests_failed_total", {"reason": "auth"}) >= 1
        # then the file: the next authentication takes it
        reauth = metric(m.metrics(), "kvpool_etcd_reauthentications_total")
        write_secret(pw_file, new_pw)
        wait_for(lambda: "the password file" in m.log_text() and "changed" in m.log_text(),
                 "the master to read the new password", 15)
        wait_for(lambda: metric(m.metrics(), "kvpool_etcd_reauthentications_total") > reauth + 1,
                 "authentications with the new password", 15)
        failed = metric(m.metrics(), "kvpool_etcd_requests_failed_total", {"reason": "auth"})
        deadline = time.monotonic() + 6  # re-authentications, none refused
        while time.monotonic() < deadline:
            assert m.leads(), m.log_text()
            time.sleep(0.25)
        text = m.metrics()
        assert metric(text, "kvpool_etcd_requests_failed_total", {"reason": "auth"}) == failed
        assert metric(text, "kvpool_epoch") == epoch and metric(text, "kvpool_leader") == 1
        # it still writes to etcd: its leader key, renewed, read back as root
        out = auth_etcd.ctl("--user", f"root:{auth_etcd.root_pw}", "get", "--prefix",
                            f"/kvpool/{CLUSTER}/")
        assert out, "nothing of the cluster's in etcd"
        log = m.log_text()
    finally:
        m.stop()
    for secret in (old_pw, new_pw):
        assert secret not in log and secret not in text
