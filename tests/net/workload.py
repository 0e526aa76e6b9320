"""A client host's workload for the network test bed (tests/net/netbed.py), with a log a
checker reads afterwards (tests/net/checker.py).

    python3 workload.py run MASTER LOG PREFIX [--size N] [--transport T] [--timeout-ms N]
                            [--stop FILE] [--duration S] [--replicas N]
    python3 workload.py verify MASTER LOG PREFIX LOG_OF_RUN...

`run` puts PREFIX-0, PREFIX-1, ... (each key's value is a function of the key alone:
value(key)), and after each put gets one key put before (acknowledged or not), until FILE
exists or S seconds have passed (each put asks for --replicas copies, default 1). Beside them it keeps N registers, PREFIX-reg-0 ..
PREFIX-reg-(N-1) (--registers, default 4): each round upserts one of them in turn with its next
version (the value, reg_value(key, version), names the version in its first bytes) and gets
one of those upserted so far. `verify` gets every key any run log tried to put or upsert.
Every call is one JSON line in LOG: op, key, t0 and t1 (CLOCK_REALTIME seconds), ok, the
error code and message when not ok, for a get the SHA-256 of the bytes it returned, for an
upsert the version it wrote and for a get of a register the version the bytes name.
"""

import argparse
import hashlib
import json
import os
import random
import sys
import time

import kvpool


def value(key, size):
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def is_register(key):
    return "-reg-" in key


def reg_value(key, version, size):
    """A register's value at a version: "KEY#VERSION#" then bytes derived from both."""
    head = f"{key}#{version}#".encode()
    seed = hashlib.sha256(head).digest()
    return (head + seed * (size // len(seed) + 1))[:size]


def reg_version(b):
    """The version a register's bytes name (None: they name none)."""
    parts = bytes(b[:200]).split(b"#")
    try:
        return int(parts[1]) if len(parts) >= 3 else None
    except ValueError:
        return None


def digest(b):
    return hashlib.sha256(b).hexdigest()


class Log:
    def __init__(self, path):
        self.f = open(path, "a", buffering=1)

    def call(self, op, key, fn, **extra):
        t0 = time.time()
        rec = {"op": op, "key": key, "t0": t0, **extra}
        try:
            out = fn()
            rec["ok"] = True
            if op == "get":
                rec["sha256"] = digest(out)
                rec["len"] = len(out)
                if is_register(key):
                    rec["ver"] = reg_version(out)
        except kvpool.Error as e:
            rec["ok"] = False
            rec["code"] = e.status
            rec["name"] = e.name
            rec["err"] = str(e)[:300]
        rec["t1"] = time.time()
        self.f.write(json.dumps(rec) + "\n")
        return rec


def client(a):
    return kvpool.Client(a.master, transport=a.transport, rpc_timeout_ms=a.timeout_ms)


def run(a):
    log = Log(a.log)
    rng = random.Random(a.prefix)
    end = time.monotonic() + a.duration
    tried = []
    regs = [f"{a.prefix}-reg-{j}" for j in range(a.registers)]
    version = [0] * a.registers
    with client(a) as c:
        i = 0
        while time.monotonic() < end and not (a.stop and os.path.exists(a.stop)):
            key = f"{a.prefix}-{i}"
            data = value(key, a.size)
            log.call("put", key, lambda: c.put(key, data, replicas=a.replicas))
            tried.append(key)
            k = rng.choice(tried)
            log.call("get", k, lambda: c.get(k))
            if regs:
                j = i % len(regs)
                version[j] += 1  # every attempt a new version, acknowledged or not
                r, v = regs[j], version[j]
                log.call("upsert", r, lambda: c.put(r, reg_value(r, v, a.size), upsert=True),
                         ver=v)
                r = rng.choice(regs[:i + 1])  # one upserted before
                log.call("get", r, lambda: c.get(r))
            i += 1
            if a.pace:
                time.sleep(a.pace)


def verify(a):
    log = Log(a.log)
    keys = []
    for path in a.runs:
        with open(path) as f:
            for line in f:
                r = json.loads(line)
                if r["op"] in ("put", "upsert") and r["key"] not in keys:
                    keys.append(r["key"])
    with client(a) as c:
        for k in keys:
            log.call("get", k, lambda: c.get(k))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("run", "verify"))
    p.add_argument("master")
    p.add_argument("log")
    p.add_argument("prefix")
    p.add_argument("runs", nargs="*")
    p.add_argument("--size", type=int, default=16384)
    p.add_argument("--transport", default="tcp")
    p.add_argument("--timeout-ms", type=int, default=2000)
    p.add_argument("--stop")
    p.add_argument("--duration", type=float, default=60)
    p.add_argument("--pace", type=float, default=0.002)
    p.add_argument("--registers", type=int, default=4)
    p.add_argument("--replicas", type=int, default=1)
    a = p.parse_args()
    run(a) if a.mode == "run" else verify(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
