#!/usr/bin/env python3
"""deploy/py-bench.py: the Python module's speed next to the C client's.

Starts its own kvpool-master and one `kvpool serve` segment on 127.0.0.1, then per point
measures the `kvpool` module (one Client per transport, page-aligned numpy buffers registered as
the C bench registers its own; --plain-numpy: np.zeros arrays as numpy places them) and `kvpool-bench data` (a subprocess against the same master,
--loop of the same op, --json) in turns: Python, C, Python, C, ... (--rounds of --duration
seconds each), so that the machine's drift hits both alike. Rates are objects per second of
time spent in the call (the C bench's definition; its warm-up batch is not counted, nor is
Python's), summed over the rounds of each side; `ratio` (Python / C) is the median of the
rounds' ratios, `ratio_pooled` the ratio of the summed rates. Points and the issue's targets:

  get    batch_get_into of 32 x 1 MiB, shm and tcp     Python >= 0.9 x the C rate
  exist  batch_exists of 128 keys (4 KiB objects), tcp  Python >= 0.8 x the C rate
  tensor mooncake.store's batch_get_tensor_into of 64 float32 tensors of 1 MiB into
         preallocated (registered, page-aligned) tensors, shm and tcp, next to the C
         bench's batch get of 64 x 1 MiB      Python >= 0.9 x the C rate
         (each tensor object is 304 bytes of header more; needs torch, else skipped)

Prints a table and writes --json (default py-bench.json):
  {"machine": {...}, "params": {...}, "results": [{"mode": "python", "op", "transport",
   "size", "batch", "py_objs_per_s", "c_objs_per_s", "py_gbps", "c_gbps", "ratio",
   "ratio_pooled", "round_ratios", "py_p50_us", "c_p50_us", "target_ratio", "target", "target_met"}, ...]}

Binaries: $KVPOOL_MASTER_BIN, $KVPOOL_CLI_BIN, $KVPOOL_BENCH_BIN, else BUILD/master/kvpool-master,
BUILD/client/kvpool, BUILD/client/kvpool-bench (--build, default build/ of this repository);
the module from BUILD/client/python unless `kvpool` imports already. Needs numpy: when this
interpreter lacks it, the script runs itself again with /usr/bin/python3.

    /usr/bin/python3 deploy/py-bench.py [--build DIR] [--duration S] [--rounds N] [--json FILE]
                                        [--plain-numpy] [--only get|exist|tensor]

Exits non-zero on any failed call, wrong bytes or a failed C run; a missed target is
printed (MISSED) and recorded, not a failure.
"""

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

try:
    import numpy as np
except ImportError:
    if os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3") and \
            os.access("/usr/bin/python3", os.X_OK):
        os.execv("/usr/bin/python3", ["/usr/bin/python3", os.path.abspath(__file__)] + sys.argv[1:])
    sys.exit("py-bench: numpy is missing (deploy/install-deps.sh)")

MIB = 1 << 20
# (op, transports, size, batch, target ratio Python / C)
POINTS = [
    ("get", ("shm", "tcp"), MIB, 32, 0.9),
    ("exist", ("tcp",), 4096, 128, 0.8),
    ("tensor", ("shm", "tcp"), MIB, 64, 0.9),
]


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="meson build directory (default: build/ of this repository)")
    ap.add_argument("--duration", type=float, default=2.0, help="seconds per slice (default 2)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="Python/C slice pairs per point (default 5)")
    ap.add_argument("--segment-size", default="1GiB", help="the serve segment (default 1GiB)")
    ap.add_argument("--json", default="py-bench.json", help="output (default py-bench.json)")
    ap.add_argument("--only", choices=sorted({p[0] for p in POINTS}),
                    help="measure only this point (default: all)")
    ap.add_argument("--plain-numpy", action="store_true",
                    help="get into np.zeros arrays as numpy places them (1 MiB ones start 3696 B "
                         "into a page here) instead of page-aligned numpy arrays")
    a = ap.parse_args()
    if a.duration <= 0 or a.rounds < 1:
        ap.error("--duration must be > 0 and --rounds >= 1")
    return a


def find_bin(env, rel, build):
    path = os.environ.get(env) or os.path.join(build, rel)
    if not os.access(path, os.X_OK):
        sys.exit(f"py-bench: no {rel} at {path} (build first, or set {env})")
    return path


class Proc:
    """A child started with --ready-fd: .ready is the line it wrote (as tests/python does)."""

    def __init__(self, argv, timeout=15.0):
        r, w = os.pipe()
        argv = [a if a != "{fd}" else str(w) for a in argv]
        self.argv = argv
        self.p = subprocess.Popen(argv, pass_fds=(w,), stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL)
        os.close(w)
        buf = b""
        deadline = time.monotonic() + timeout
        try:
            while b"\n" not in buf:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([r], [], [], left)[0]:
                    break
                chunk = os.read(r, 256)
                if not chunk:
                    break
                buf += chunk
        finally:
            os.close(r)
        if b"\n" not in buf:
            self.stop(signal.SIGKILL)
            raise RuntimeError(f"{argv[0]} did not become ready: {buf!r}")
        self.ready = buf.split(b"\n", 1)[0].decode()

    def stop(self, sig=signal.SIGTERM):
        if self.p.returncode is not None:
            return self.p.returncode
        os.kill(self.p.pid, sig)  # our own child, by its PID
        try:
            return self.p.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(self.p.pid, signal.SIGKILL)
            return self.p.wait(5)


def fmt_size(n):
    return f"{n // MIB}MiB" if n >= MIB and n % MIB == 0 else f"{n // 1024}KiB"


def get_buffer(size, plain):
    """A zeroed uint8 array of `size` bytes: page-aligned (a view into a slightly larger
    array), as the C bench's buffers are (posix_memalign), or wherever numpy puts it (plain:
    1 MiB arrays start 3696 bytes into a page). The copy into a buffer at the extent's offset
    modulo 4 KiB (page-aligned) has a path of its own in common/crc32c.c: until it had one,
    it stalled under memory load, and page-aligned buffers measured ~0.6-0.9x plain ones."""
    if plain:
        return np.zeros(size, np.uint8)
    raw = np.empty(size + 4096, np.uint8)
    off = (-raw.ctypes.data) % 4096
    a = raw[off:off + size]
    a.fill(0)
    return a


def py_slice(c, op, keys, bufs, size, duration):
    """One Python slice: objects, seconds in the call, per-batch latencies."""
    batch = len(keys)
    expect = [size] * batch
    call = (lambda: c.batch_get_into(keys, bufs)) if op == "get" else \
        (lambda: c.batch_exists(keys))
    want = expect if op == "get" else [True] * batch
    if call() != want:  # warm-up, not counted
        raise RuntimeError(f"python {op}: warm-up batch failed")
    objs, busy, lat = 0, 0.0, []
    end = time.monotonic() + duration
    while time.monotonic() < end or len(lat) < 3:
        t0 = time.perf_counter()
        r = call()
        t1 = time.perf_counter()
        if r != want:
            raise RuntimeError(f"python {op}: {r[:4]}... (expected {want[0]} per key)")
        if op == "get":  # the C bench checks each object's first and last byte, untimed
            for i, b in enumerate(bufs):
                if b[0] != (i * 31 + 7) % 256 or b[-1] != (i * 31 + 7) % 256:
                    raise RuntimeError(f"python get: wrong bytes in {keys[i]}")
        objs += batch
        busy += t1 - t0
        lat.append(t1 - t0)
    return objs, busy, lat


def tensor_slice(store, keys, dests, duration):
    """One Python slice of batch_get_tensor_into(keys, tensors): objects, seconds, latencies."""
    def call():
        r = store.batch_get_tensor_into(keys, dests)
        if len(r) != len(dests) or any(a is not b for a, b in zip(r, dests)):
            raise RuntimeError(f"python tensor get: {r[:2]}...")
    call()  # warm-up, not counted
    objs, busy, lat = 0, 0.0, []
    end = time.monotonic() + duration
    while time.monotonic() < end or len(lat) < 3:
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        for i, d in enumerate(dests):  # untimed, as the C bench's check
            if d[0].item() != float(i) or d[-1].item() != float(i):
                raise RuntimeError(f"python tensor get: wrong values in {keys[i]}")
        objs += len(keys)
        busy += t1 - t0
        lat.append(t1 - t0)
    return objs, busy, lat


def tensor_setup(master, tr, size, batch, plain):
    """A mooncake.store store on transport tr (its protocol "tcp", else auto: shm on this
    host), 64 float32 tensors put, and page-aligned registered destination tensors."""
    import torch
    from mooncake.store import MooncakeDistributedStore
    s = MooncakeDistributedStore()
    if s.setup("127.0.0.1", "", 0, 0, "tcp" if tr == "tcp" else "auto", "", master) != 0:
        raise RuntimeError("mooncake.store setup failed")
    keys = [f"pybench@{tr}@tensor@{i}" for i in range(batch)]
    src = [torch.full((size // 4,), float(i)) for i in range(batch)]
    if s.batch_put_tensor(keys, src) != [0] * batch:
        raise RuntimeError("python put_tensor failed")
    dests = [torch.from_numpy(get_buffer(size, plain).view(np.float32)) for _ in range(batch)]
    for d in dests:
        if s.register_buffer(d.data_ptr(), size) != 0:
            raise RuntimeError("register_buffer failed")
    return s, keys, dests


def c_slice(bench, master, op, transport, size, batch, duration, tmp):
    """One `kvpool-bench data` slice: objects, seconds in the op, p50, machine."""
    out = os.path.join(tmp, "c.json")
    argv = [bench, "data", "--master", master, "--transport", transport, "--sizes", str(size),
            "--batch", str(batch), "--loop", op, "--duration", str(duration), "--quiet",
            "--json", out]
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{p.stdout}")
    doc = json.load(open(out))
    rs = [r for r in doc["results"] if r["mode"] == "data" and r["op"] == op]
    if len(rs) != 1:
        raise RuntimeError(f"kvpool-bench gave {len(rs)} {op} results")
    r = rs[0]
    objs = r["batches"] * r["batch"]
    busy = objs / r["objs_per_s"] if r["objs_per_s"] > 0 else 0
    return objs, busy, r["p50_us"], doc["machine"]


def record(results, op, tr, size, batch, target, py_o, py_b, c_o, c_b, py_lat, c_p50, ratios,
           a, py_call, py_buffers):
    """Print one point's line and append its result."""
    py_rate = py_o / py_b if py_b > 0 else 0
    c_rate = c_o / c_b if c_b > 0 else 0
    # the median of the rounds' ratios: one slice that the machine slowed down
    # (a shared 2-core VM) moves it less than the pooled rates
    ratio = float(np.median(ratios))
    pooled = py_rate / c_rate if c_rate > 0 else 0
    py_p50 = float(np.median(py_lat)) * 1e6
    c_med = float(np.median(c_p50))
    met = ratio >= target
    gb = (lambda r: r * size / 1e9) if op in ("get", "tensor") else (lambda r: 0.0)
    print(f"{op:<6} {tr:<4} {fmt_size(size):>6} {batch:>5} {py_rate:>10.0f} "
          f"{c_rate:>10.0f} {ratio:>5.2f}x {py_p50:>8.1f} {c_med:>8.1f}  "
          + " ".join(f"{x:.2f}" for x in ratios)
          + f"  target >= {target:.1f}x: {'met' if met else 'MISSED'}")
    results.append({
        "mode": "python", "op": op, "transport": tr, "size": size, "batch": batch,
        "py_call": py_call, "py_buffers": py_buffers,
        "py_objs_per_s": py_rate, "c_objs_per_s": c_rate,
        "py_gbps": gb(py_rate), "c_gbps": gb(c_rate), "ratio": ratio,
        "ratio_pooled": pooled,
        "round_ratios": ratios, "rounds": a.rounds, "slice_s": a.duration,
        "py_p50_us": py_p50, "c_p50_us": c_med, "target_ratio": target,
        "target": f"issue {28 if op == 'tensor' else 14}: Python >= {target:g}x the C client",
        "target_met": "yes" if met else "no"})


def main():
    a = parse_args()
    build = os.path.abspath(a.build)
    master_bin = find_bin("KVPOOL_MASTER_BIN", "master/kvpool-master", build)
    cli_bin = find_bin("KVPOOL_CLI_BIN", "client/kvpool", build)
    bench = find_bin("KVPOOL_BENCH_BIN", "client/kvpool-bench", build)
    try:
        import kvpool
        kvpool.Client  # an empty kvpool/ left on the path imports as a namespace package
    except (ImportError, AttributeError):
        sys.modules.pop("kvpool", None)
        sys.path.insert(0, os.path.join(build, "client", "python"))
        import kvpool

    procs = []
    results, machine, failed = [], None, False
    tmp = tempfile.mkdtemp(prefix="py-bench.")
    try:
        m = Proc([master_bin, "--listen", "127.0.0.1:0", "--ready-fd", "{fd}",
                  "--log-level", "warn"])
        procs.append(m)
        master = m.ready
        procs.append(Proc([cli_bin, "--master", master, "serve", "--segment-size",
                           a.segment_size, "--ready-fd", "{fd}"]))
        print(f"== python module vs C client against {master} ({a.rounds} x {a.duration:g} s "
              f"per side, interleaved; {kvpool.__file__}) ==")
        print(f"{'op':<6} {'tr':<4} {'size':>6} {'batch':>5} {'py obj/s':>10} {'C obj/s':>10} "
              f"{'py/C':>6} {'py p50':>8} {'C p50':>8}  rounds py/C")
        for op, transports, size, batch, target in POINTS:
            if a.only and op != a.only:
                continue
            if op == "tensor":
                try:
                    import torch  # noqa: F401
                except ImportError:
                    print("tensor: skipped (no torch; Debian: python3-torch)")
                    continue
            for tr in transports:
                if op == "tensor":
                    s, keys, dests = tensor_setup(master, tr, size, batch, a.plain_numpy)
                    try:
                        py_o = py_b = c_o = c_b = 0.0
                        py_lat, c_p50, ratios = [], [], []
                        for _ in range(a.rounds):
                            o1, b1, lat = tensor_slice(s, keys, dests, a.duration)
                            o2, b2, p50, machine = c_slice(bench, master, "get", tr, size,
                                                           batch, a.duration, tmp)
                            py_o, py_b, c_o, c_b = py_o + o1, py_b + b1, c_o + o2, c_b + b2
                            py_lat += lat
                            c_p50.append(p50)
                            ratios.append((o1 / b1) / (o2 / b2) if b1 > 0 and b2 > 0 else 0)
                        s.batch_remove(keys, True)
                    finally:
                        for d in dests:
                            s.unregister_buffer(d.data_ptr())
                        s.close()
                    record(results, op, tr, size, batch, target, py_o, py_b, c_o, c_b, py_lat,
                           c_p50, ratios, a, "mooncake.store batch_get_tensor_into",
                           "page-aligned torch tensors")
                    continue
                c = kvpool.Client(master, transport=tr)
                keys = [f"pybench@{tr}@{op}@{i}" for i in range(batch)]
                src = [np.full(size, (i * 31 + 7) % 256, np.uint8) for i in range(batch)]
                bufs = [get_buffer(size, a.plain_numpy) for _ in range(batch)] \
                    if op == "get" else []
                for b in bufs:
                    c.register_buffer(b)
                try:
                    st = c.batch_put(keys, src)
                    if any(s != 0 for s in st):
                        raise RuntimeError(f"python put: {st}")
                    py_o = py_b = c_o = c_b = 0.0
                    py_lat, c_p50, ratios = [], [], []
                    for _ in range(a.rounds):
                        o1, b1, lat = py_slice(c, op, keys, bufs, size, a.duration)
                        o2, b2, p50, machine = c_slice(bench, master, op, tr, size, batch,
                                                       a.duration, tmp)
                        py_o, py_b, c_o, c_b = py_o + o1, py_b + b1, c_o + o2, c_b + b2
                        py_lat += lat
                        c_p50.append(p50)
                        ratios.append((o1 / b1) / (o2 / b2) if b1 > 0 and b2 > 0 else 0)
                    c.batch_remove(keys, force=True)
                finally:
                    for b in bufs:
                        c.unregister_buffer(b)
                    c.close()
                record(results, op, tr, size, batch, target, py_o, py_b, c_o, c_b, py_lat,
                       c_p50, ratios, a, "batch_get_into" if op == "get" else "batch_exists",
                       ("np.zeros" if a.plain_numpy else "page-aligned numpy")
                       if op == "get" else "none")
    except (RuntimeError, kvpool.Error, OSError) as e:
        print(f"py-bench: {e}", file=sys.stderr)
        failed = True
    finally:
        for p in reversed(procs):
            rc = p.stop()
            if rc != 0:
                print(f"py-bench: {p.argv[0]} exited with {rc}", file=sys.stderr)
                failed = True
        for f in os.listdir(tmp):
            os.unlink(os.path.join(tmp, f))
        os.rmdir(tmp)
    doc = {"machine": machine or {},
           "params": {"mode": "python", "duration_s": a.duration, "rounds": a.rounds,
                      "segment_size": a.segment_size, "python": sys.version.split()[0],
                      "plain_numpy": a.plain_numpy,
                      "numpy": np.__version__},
           "results": results}
    with open(a.json, "w") as f:
        json.dump(doc, f, indent=1)
    if failed:
        print("py-bench: FAILED (errors above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
