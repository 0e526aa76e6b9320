#!/usr/bin/env python3
"""A kvpool-bench that dies leaves nothing running: start a --local data point (its own
kvpool-master and kvpool serve), wait until both are up, SIGKILL the bench by its PID, and
check that the master and segment it spawned end by themselves within 20 s (they are sent
SIGTERM when the bench dies). Any still running then is killed by its PID and the test
fails. About 3 s.

    tests/bench/no_orphans.py KVPOOL_BENCH OUT_DIR
"""
import os
import signal
import subprocess
import sys
import time

bench, out = sys.argv[1], sys.argv[2]


def children(pid):
    """The PIDs whose parent is pid (a scan of /proc: no procps needed)."""
    kids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # the fields after the command's closing parenthesis: state, ppid, ...
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == pid:
            kids.append(int(d))
    return kids


def running(pid):
    """Alive and not a zombie (a reaped or exited process is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


p = subprocess.Popen([bench, "data", "--local", "--segment-size", "64MiB", "--transport", "tcp",
                      "--sizes", "4KiB", "--batch", "8", "--duration", "30", "--quiet",
                      "--json", out + "/bench-no-orphans.json"],
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
kids = []
deadline = time.monotonic() + 20
while time.monotonic() < deadline and len(kids) < 2:
    time.sleep(0.1)
    kids = [k for k in children(p.pid) if running(k)]
names = {}
for k in kids:
    try:
        with open(f"/proc/{k}/cmdline", "rb") as f:
            names[k] = os.path.basename(f.read().split(b"\0")[0].decode())
    except OSError:
        names[k] = "?"
failed = 0
if len(kids) < 2:
    print(f"FAIL: the bench started {len(kids)} processes ({names}), not a master and a segment")
    failed += 1
p.send_signal(signal.SIGKILL)
p.wait()
left = list(kids)
deadline = time.monotonic() + 20
while left and time.monotonic() < deadline:
    time.sleep(0.1)
    left = [k for k in left if running(k)]
for k in left:
    print(f"FAIL: {names.get(k)} (pid {k}) still runs 20 s after its bench was killed")
    os.kill(k, signal.SIGKILL)
    failed += 1
if not failed:
    print(f"ok: {', '.join(sorted(names.values()))} ended with their bench")
sys.exit(1 if failed else 0)
