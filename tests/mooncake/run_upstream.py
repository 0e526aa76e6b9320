#!/usr/bin/python3
"""Run Mooncake Store's own Python tests, unchanged, against kvpool (issue 47).

The tests are the copies in ../shared/peers/mooncake-tests (their README: which files,
from which Mooncake commit, what they read from the environment). Each file runs the way
Mooncake's CI runs it (scripts/run_tests.sh, .github/workflows/ci.yml): as a script, under
its own unittest main, here against a kvpool-master of its own on 127.0.0.1 (a free port,
handed to the tests through MASTER_SERVER / MOONCAKE_MASTER), with kvpool's `mooncake`
package first on the path and Mooncake's pure-Python modules (mooncake-python/) after it.
The two dummy-client files expect Mooncake's standalone client at 127.0.0.1:50052: they
run from a copy with that address rewritten to the master's, with a `kvpool serve` of
1 GiB giving the memory (the only change the suite's README allows).

Each file's unittest summary ("Ran N tests", "OK (skipped=S)" / "FAILED (failures=F,
errors=E, skipped=S)") is read; a file that ends before its summary (an import error, a
crash, the timeout) counts as not run, with its last lines shown. A skip whose reason
names hardware kvpool's CI lacks (CUDA, a GPU, RDMA, an NPU) is listed as such; any other
skip is listed as a skip to fix. Files that Mooncake runs with failfast stop at their first
failure: their tests after it are not run, and not counted. The last line is "N passed, N failed" as .ci/run's
counters read it: passed = tests that passed, failed = failures + errors + files not run
+ skips not for hardware.

Usage: tests/mooncake/run_upstream.py [--suite DIR] [--only FILE ...] [--timeout S]
Environment: KVPOOL_MASTER_BIN, KVPOOL_CLI_BIN (default: build/), PYTHON (default:
/usr/bin/python3).
"""
import argparse
import concurrent.futures
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
# conftest imports the kvpool module: from $PYTHONPATH (deploy/test.sh sets it to the build
# tree's), else build/'s, as the files' own runs below get it
sys.path.append(os.path.join(ROOT, "build", "client", "python"))
from conftest import Proc, free_port  # noqa: E402  (the tests' way to start a daemon)

# (file, how): scripts = one of Mooncake's scripts/ tests, which its CI runs with
# LOCAL_HOSTNAME=127.0.0.1 (mooncake-wheel/tests' run with the default, "localhost");
# dummy = from a copy with Mooncake's standalone client address rewritten,
# a `kvpool serve` giving the memory; runs = argv of each concurrent run (Mooncake's CI
# runs test_multi_dummy_clients.py twice at once, as client1 and client2); master = more
# arguments of its master. Every master runs as Mooncake's CI runs its own
# (`mooncake_master --default_kv_lease_ttl=500`: --lease-ttl 0.5, no lease on put: at this
# commit Mooncake's PutEnd grants a lease of 0 ms, only reads and exists lease).
# test_batch_replica_clear.py is not in Mooncake's CI, and its
# test_clear_mixed_expired_and_active expects a put to leave a lease, which Mooncake's own
# master at this commit does not: it runs with --lease-on-put, kvpool's switch for that.
FILES = [
    ("test_distributed_object_store.py", {}),
    ("test_replicated_distributed_object_store.py", {}),
    ("test_put_get_tensor.py", {}),
    ("test_safetensor_functions.py", {}),
    ("test_batch_replica_clear.py", {"master": ["--lease-on-put"]}),
    ("test_dummy_client.py", {"dummy": True}),
    ("test_multi_dummy_clients.py",
     {"dummy": True, "runs": [["--client-id", "client1"], ["--client-id", "client2"]]}),
    ("test_upsert_api.py", {"scripts": True}),
    ("test_async_store.py", {"scripts": True}),
    ("test_copy_move_api.py", {"scripts": True}),
    ("test_tensor_api.py", {"scripts": True, "runs": [["-n", "1"]]}),
]

HARDWARE = re.compile(r"cuda|gpu|rdma|npu|ascend|infiniband|\bib\b|nvlink", re.I)
SUMMARY = re.compile(r"^(OK|FAILED)(?: \((.*)\))?\s*$", re.M)
RAN = re.compile(r"^Ran (\d+) tests? in ", re.M)
VERBOSE = re.compile(r"^(\w+) \(([\w.]+)\)(?:\n.*?)? \.\.\. (ok|FAIL|ERROR|skipped '(.*)'|"
                     r"expected failure|unexpected success)\s*$", re.M)
REPORT = re.compile(r"^(FAIL|ERROR): (\w+) \(([\w.]+)\)", re.M)


def start(argv, timeout=15.0):
    """A daemon started with --ready-fd (tests/python/conftest.py's Proc): (it, the
    first line it wrote)."""
    p = Proc(argv, timeout=timeout, stderr=subprocess.DEVNULL)
    return p, p.ready


def stop(p):
    """Stop a daemon we started, by its PID."""
    p.stop(timeout=15.0)


def parse(out):
    """Counts of one unittest run: dict(ran, failures, errors, skipped, summary, skips,
    bad) where skips = [(test, reason)] and bad = [test ids that failed or errored]."""
    res = {"ran": None, "failures": 0, "errors": 0, "skipped": 0, "summary": False,
           "skips": [], "bad": []}
    ran = RAN.findall(out)
    summ = SUMMARY.findall(out)
    if ran and summ:
        res["ran"] = int(ran[-1])
        res["summary"] = True
        for part in (summ[-1][1] or "").split(","):
            if "=" in part:
                k, v = part.strip().split("=", 1)
                if k in ("failures", "errors", "skipped"):
                    res[k] = int(v)
    for name, cls, verdict, reason in VERBOSE.findall(out):
        if verdict.startswith("skipped"):
            res["skips"].append((test_id(name, cls), reason))
    for kind, name, cls in REPORT.findall(out):
        t = test_id(name, cls)
        if t not in res["bad"]:  # one test's subtests fail apart: counted once
            res["bad"].append(t)
    return res


def test_id(name, cls):
    """Class.test of unittest's "test (module.Class)" or, from Python 3.11,
    "test (module.Class.test)"."""
    cls = cls.split(".", 1)[1] if cls.startswith("__main__.") else cls
    return cls if cls.endswith("." + name) else f"{cls}.{name}"


def run_file(suite, name, how, master_bin, cli_bin, python, timeout, work):
    port = free_port()
    master, addr = start([master_bin, "--listen", f"127.0.0.1:{port}", "--ready-fd", "{fd}",
                          "--log-level", "error", "--lease-ttl", "0.5",
                          *how.get("master", [])])
    serve = None
    try:
        path = os.path.join(suite, name)
        cwd = suite
        if how.get("dummy"):
            serve, _ = start([cli_bin, "--master", addr, "serve", "--segment-size", "1GiB",
                              "--ready-fd", "{fd}"])
            cwd = tempfile.mkdtemp(dir=work)
            with open(path) as f:
                text = f.read()
            path = os.path.join(cwd, name)
            with open(path, "w") as f:
                f.write(text.replace("127.0.0.1:50052", addr))
        env = dict(os.environ)
        env.update({
            "MASTER_SERVER": addr, "MOONCAKE_MASTER": addr,
            "MC_METADATA_SERVER": "P2PHANDSHAKE", "MOONCAKE_TE_META_DATA_SERVER": "P2PHANDSHAKE",
            "PROTOCOL": "tcp", "MOONCAKE_PROTOCOL": "tcp", "DEVICE_NAME": "",
            "DEFAULT_KV_LEASE_TTL": "500",
            "PYTHONPATH": os.pathsep.join(
                [os.path.join(ROOT, "build/client/python"),
                 os.path.join(suite, "mooncake-python")] +
                ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])),
            "PYTHONUNBUFFERED": "1",
        })
        # -v: unittest's verbose lines name each skip's reason (a file's own argparse
        # passes what it does not know on to unittest, or ignores it)
        runs = [[*argv, "-v"] for argv in how.get("runs", [[]])]
        if how.get("scripts"):
            env["LOCAL_HOSTNAME"] = "127.0.0.1"
        else:
            env.pop("LOCAL_HOSTNAME", None)
        procs = []
        for argv in runs:
            log = tempfile.TemporaryFile(dir=work)
            procs.append((subprocess.Popen([python, path, *argv], cwd=cwd, env=env,
                                           stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT,
                                           start_new_session=True), log))
        deadline = time.monotonic() + timeout
        results = []
        for p, log in procs:
            timed_out = False
            try:
                p.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(p.pid, signal.SIGKILL)  # the group of the run we started
                p.wait(5)
            log.seek(0)
            out = log.read().decode(errors="replace")
            log.close()
            r = parse(out)
            r["rc"], r["timed_out"], r["tail"] = p.returncode, timed_out, out[-1500:]
            results.append(r)
        return results
    finally:
        if serve is not None:
            stop(serve)
        stop(master)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", default=os.path.join(ROOT, "..", "shared", "peers",
                                                    "mooncake-tests"))
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--verbose", action="store_true", help="each file's output tail")
    ap.add_argument("--jobs", type=int, default=1, help="files run at once (default 1)")
    a = ap.parse_args()
    suite = os.path.abspath(a.suite)
    if not os.path.isdir(suite):
        print(f"no Mooncake test suite at {suite}")
        print("0 passed, 1 failed")
        return 1
    master_bin = os.environ.get("KVPOOL_MASTER_BIN") or os.path.join(
        ROOT, "build/master/kvpool-master")
    cli_bin = os.environ.get("KVPOOL_CLI_BIN") or os.path.join(ROOT, "build/client/kvpool")
    python = os.environ.get("PYTHON", "/usr/bin/python3")
    work = tempfile.mkdtemp(prefix="kvpool-mooncake-")
    passed = failed = 0
    hw_skips, other_skips = [], []
    try:
        todo = [(name, how) for name, how in FILES if not a.only or name in a.only]

        def one(item):
            # each file against a master of its own (segment names are per master), so
            # files run side by side; most of their time is sleeps (lease TTLs)
            name, how = item
            t0 = time.monotonic()
            try:
                return run_file(suite, name, how, master_bin, cli_bin, python, a.timeout,
                                work), time.monotonic() - t0
            except RuntimeError as e:
                return e, time.monotonic() - t0

        with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as pool:
            done = list(pool.map(one, todo))
        for (name, how), (results, dt) in zip(todo, done):
            if isinstance(results, RuntimeError):
                print(f"{name}: not run: {results}")
                failed += 1
                continue
            for k, r in enumerate(results):
                label = name if len(results) == 1 else f"{name} #{k + 1}"
                if not r["summary"]:
                    why = "timed out" if r["timed_out"] else f"exit {r['rc']}, no summary"
                    print(f"{label}: NOT RUN ({why}, {dt:.0f} s); its last lines:")
                    print("    " + "\n    ".join(r["tail"].strip().split("\n")[-12:]))
                    failed += 1
                    continue
                # tests that failed or errored, each once (its subtests are reported apart)
                bad = len(r["bad"]) or min(r["ran"], r["failures"] + r["errors"])
                ok = max(0, r["ran"] - bad - r["skipped"])
                print(f"{label}: {ok} passed, {bad} failed, {r['skipped']} skipped of "
                      f"{r['ran']} run ({dt:.0f} s)")
                for b in r["bad"]:
                    print(f"    failed: {b}")
                for test, reason in r["skips"]:
                    (hw_skips if HARDWARE.search(reason) else other_skips).append(
                        (label, test, reason))
                # skips whose reasons verbosity 1 hides: not hardware until shown to be
                unnamed = r["skipped"] - len(r["skips"])
                other_skips.extend([(label, "(unnamed)", "no reason shown")] * unnamed)
                passed += ok
                failed += bad
                if a.verbose:
                    print("    " + "\n    ".join(r["tail"].strip().split("\n")[-20:]))
        if hw_skips:
            print(f"skipped for hardware kvpool's CI lacks ({len(hw_skips)}):")
            for label, test, reason in hw_skips:
                print(f"    {label}: {test}: {reason}")
        if other_skips:
            print(f"skipped for other reasons, counted as failed ({len(other_skips)}):")
            for label, test, reason in other_skips:
                print(f"    {label}: {test}: {reason}")
        failed += len(other_skips)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
