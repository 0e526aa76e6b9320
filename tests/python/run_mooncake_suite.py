#!/usr/bin/env python3
"""Run Mooncake Store's own Python tests against kvpool's `mooncake` package.

The tests are unchanged copies of Mooncake's (../shared/peers/mooncake-tests,
its README says where each comes from). For each file this starts a fresh
kvpool-master, and for the dummy-client tests one `kvpool serve` (the memory
Mooncake's standalone client holds for them), runs the file with pytest and
prints one line per file: passed / failed / errors / skipped. test_multi_dummy_clients
runs as Mooncake's CI runs it, two processes at once (--client-id client1 and client2),
its counts summed.

    PYTHONPATH=build/client/python KVPOOL_MASTER_BIN=$PWD/build/master/kvpool-master \\
    KVPOOL_CLI_BIN=$PWD/build/client/kvpool python3 tests/python/run_mooncake_suite.py \\
        [--tests DIR] [--timeout S] [--verbose] [FILE ...]

Every address a test reads from the environment (MASTER_SERVER,
MOONCAKE_MASTER, LOCAL_HOSTNAME, ...) is set to this run's; the dummy-client
tests hard-code Mooncake's standalone client at 127.0.0.1:50052, which is
rewritten in a copy to the master's address (kvpool's setup_dummy connects to
the master). Mooncake's pure-Python mooncake.structured_object_store (in the
tests' mooncake-python/) goes on the path after kvpool's package. Children are
stopped by the PIDs started here.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from conftest import Pool  # noqa: E402  (the fixtures' process handling)

DEFAULT_TESTS = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "peers",
                                              "mooncake-tests"))
DUMMY_FILES = ("test_dummy_client.py", "test_multi_dummy_clients.py")
# Run as Mooncake's scripts/run_tests.sh runs it: two processes at once, each with its
# --client-id (its module reads sys.argv, so through unittest, not pytest).
PAIRED = {"test_multi_dummy_clients.py": ("client1", "client2")}
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed|deselected)")


def counts(output):
    """{passed, failed, error, skipped} from pytest's last summary line."""
    out = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    lines = [ln for ln in output.splitlines() if re.search(r"\b(passed|failed|error|skipped|"
                                                            r"no tests ran)\b", ln)]
    if not lines:
        return None
    for n, what in SUMMARY.findall(lines[-1]):
        what = "error" if what.startswith("error") else what
        if what in out:
            out[what] += int(n)
    return out


def unittest_counts(output):
    """{passed, failed, error, skipped} from unittest's "Ran N tests" and verdict lines."""
    ran = re.search(r"^Ran (\d+) tests?", output, re.M)
    if not ran:
        return None
    out = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    for what, n in re.findall(r"(failures|errors|skipped)=(\d+)", output):
        out[{"failures": "failed", "errors": "error", "skipped": "skipped"}[what]] += int(n)
    out["passed"] = int(ran.group(1)) - out["failed"] - out["error"] - out["skipped"]
    return out


def run_file(name, src, work, timeout, verbose):
    # Mooncake's CI runs its standalone client (memory for the dummy clients) only for
    # those tests; every other store contributes its own segment and is alone with it.
    pool = Pool(segments=("1GiB",) if name in DUMMY_FILES else (),
                master_args=("--lease-ttl", "1"))
    try:
        path = os.path.join(work, name)
        with open(os.path.join(src, name)) as f:
            text = f.read()
        if name in DUMMY_FILES:
            text = text.replace("127.0.0.1:50052", pool.addr)
        with open(path, "w") as f:
            f.write(text)
        pp = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = {**os.environ,
               "PYTHONPATH": os.pathsep.join(pp + [os.path.join(src, "mooncake-python")]),
               "MASTER_SERVER": pool.addr, "MOONCAKE_MASTER": pool.addr,
               "PROTOCOL": "tcp", "MOONCAKE_PROTOCOL": "tcp",
               "LOCAL_HOSTNAME": "127.0.0.1", "MOONCAKE_LOCAL_HOSTNAME": "127.0.0.1",
               "MC_METADATA_SERVER": "P2PHANDSHAKE",
               "MOONCAKE_TE_META_DATA_SERVER": "P2PHANDSHAKE",
               "DEFAULT_KV_LEASE_TTL": "1000"}
        if name in PAIRED:
            procs = [subprocess.Popen([sys.executable, path, "--client-id", cid], cwd=work,
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                     for cid in PAIRED[name]]
            outputs, total, rc = [], {"passed": 0, "failed": 0, "error": 0, "skipped": 0}, 0
            for p in procs:
                try:
                    o = p.communicate(timeout=timeout)[0].decode(errors="replace")
                except subprocess.TimeoutExpired:
                    p.kill()
                    o = p.communicate()[0].decode(errors="replace")
                outputs.append(o)
                c = unittest_counts(o)
                if c is None:
                    total["error"] += 1
                else:
                    for k in total:
                        total[k] += c[k]
                rc = rc or p.returncode
            output, result = "\n".join(outputs), total
        else:
            argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs",
                    "--rootdir", work, path]
            try:
                r = subprocess.run(argv, cwd=work, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, timeout=timeout)
                output, rc = r.stdout.decode(errors="replace"), r.returncode
            except subprocess.TimeoutExpired as e:
                output, rc = (e.stdout or b"").decode(errors="replace"), "timeout"
            result = counts(output)
    finally:
        bad = pool.close()
    if verbose:
        print(output)
    return result, rc, bad, output


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tests", default=DEFAULT_TESTS, help="the copies of Mooncake's tests")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per file")
    ap.add_argument("--verbose", action="store_true", help="print each file's pytest output")
    ap.add_argument("files", nargs="*", help="test files (default: every test_*.py there)")
    a = ap.parse_args()
    files = a.files or sorted(f for f in os.listdir(a.tests)
                              if f.startswith("test_") and f.endswith(".py"))
    total = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
    with tempfile.TemporaryDirectory(prefix="mooncake-suite-") as work:
        for name in files:
            c, rc, bad, output = run_file(os.path.basename(name), a.tests, work, a.timeout,
                                          a.verbose)
            if c is None:
                tail = " | ".join(output.strip().splitlines()[-3:])
                print(f"{name}: no result (rc {rc}): {tail}", flush=True)
                total["error"] += 1
                continue
            for k in total:
                total[k] += c[k]
            extra = f" (children exited non-zero: {bad})" if bad else ""
            print(f"{name}: {c['passed']} passed, {c['failed']} failed, {c['error']} errors, "
                  f"{c['skipped']} skipped{extra}", flush=True)
            shutil.rmtree(os.path.join(work, "__pycache__"), ignore_errors=True)
    print(f"total: {total['passed']} passed, {total['failed']} failed, {total['error']} errors, "
          f"{total['skipped']} skipped")
    return 0 if total["failed"] == 0 and total["error"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
