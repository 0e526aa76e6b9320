"""The GPU path's speed on a real GPU, next to the limits measured in the same run.

Puts from and gets into CUDA device memory (the library stages them through pinned host
memory, client/mem/gpu.c and client/transfer/staging.c) against a real kvpool-master and
one `kvpool serve` segment on this host, over shm and tcp; beside them the same batches
from and into host memory (what the GPU path adds), and the limits: the driver's own
copies between device and host memory, pageable and pinned. Every get's bytes are checked
(copied back to the host) once per transport and direction before the timed rounds.

    KVPOOL_MASTER_BIN=build/master/kvpool-master KVPOOL_CLI_BIN=build/client/kvpool \\
      PYTHONPATH=build/client/python python3 tests/gpu/bench_gpu.py [--json FILE]

Figures: GB/s (10^9 bytes a second) of object bytes, the median of ROUNDS rounds of one
batch of N_OBJ objects of OBJ bytes each. Needs numpy and the CUDA driver (libcuda.so.1,
or $KVPOOL_CUDA_LIB); no pytest.
"""

import argparse
import ctypes
import importlib.util
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

import kvpool

_here = os.path.dirname(os.path.abspath(__file__))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# The test's driver wrapper and the pytest fixtures' Pool (a master and its segments).
_gpu = _load("kvp_gpu_test", os.path.join(_here, "test_gpu_python.py"))
_fixtures = _load("kvp_pool_fixtures_bench", os.path.join(_here, "..", "python", "conftest.py"))

OBJ = 4 << 20
N_OBJ = 48
ROUNDS = 5


def gbps(nbytes, seconds):
    return round(nbytes / seconds / 1e9, 2)


def median_time(fn, rounds=ROUNDS):
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def limits(cuda, total):
    """The driver's copies of `total` bytes, device <-> pageable and pinned host memory."""
    L = cuda.lib
    host = np.ones(total, np.uint8)
    dev = cuda.alloc(total)
    out = {}
    out["htod_pageable"] = gbps(total, median_time(
        lambda: cuda.check(L.cuMemcpyHtoD_v2(dev, host.ctypes.data, total), "HtoD")))
    out["dtoh_pageable"] = gbps(total, median_time(
        lambda: cuda.check(L.cuMemcpyDtoH_v2(host.ctypes.data, dev, total), "DtoH")))
    pinned = ctypes.c_void_p()
    L.cuMemHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
    L.cuMemFreeHost.argtypes = [ctypes.c_void_p]
    cuda.check(L.cuMemHostAlloc(ctypes.byref(pinned), total, 0), "cuMemHostAlloc")
    try:
        out["htod_pinned"] = gbps(total, median_time(
            lambda: cuda.check(L.cuMemcpyHtoD_v2(dev, pinned.value, total), "HtoD")))
        out["dtoh_pinned"] = gbps(total, median_time(
            lambda: cuda.check(L.cuMemcpyDtoH_v2(pinned.value, dev, total), "DtoH")))
    finally:
        L.cuMemFreeHost(pinned.value)
    return out


def run_transport(pool, cuda, transport):
    total = OBJ * N_OBJ
    srcs = [np.random.default_rng(i).integers(0, 256, OBJ, dtype=np.uint8) for i in range(N_OBJ)]
    dev_src = [cuda.upload(a) for a in srcs]
    dev_dst = [cuda.alloc(OBJ) for _ in range(N_OBJ)]
    host_dst = [np.zeros(OBJ, np.uint8) for _ in range(N_OBJ)]
    keys = [f"bench-gpu-{transport}-{i}" for i in range(N_OBJ)]
    dev_bufs = [(d, OBJ) for d in dev_src]
    out = {}
    with kvpool.Client(pool.addr, transport=transport) as c:
        # checked once: device -> pool -> device, every byte
        assert c.batch_put(keys, dev_bufs) == [0] * N_OBJ
        assert c.batch_get_into(keys, [(d, OBJ) for d in dev_dst]) == [OBJ] * N_OBJ
        for d, a in zip(dev_dst, srcs):
            assert np.array_equal(cuda.download(d, OBJ), a), "wrong bytes from the GPU path"

        def put(bufs):
            def f():
                assert c.batch_remove(keys) == [0] * N_OBJ
                t0 = time.perf_counter()
                assert c.batch_put(keys, bufs) == [0] * N_OBJ
                return time.perf_counter() - t0
            return statistics.median(f() for _ in range(ROUNDS))

        out["put_from_device"] = gbps(total, put(dev_bufs))
        out["put_from_host"] = gbps(total, put(srcs))
        out["get_into_device"] = gbps(total, median_time(
            lambda: c.batch_get_into(keys, [(d, OBJ) for d in dev_dst])))
        out["get_into_host"] = gbps(total, median_time(lambda: c.batch_get_into(keys, host_dst)))
        assert all(np.array_equal(h, a) for h, a in zip(host_dst, srcs))
        assert c.batch_remove(keys) == [0] * N_OBJ
    return out


# The transfer engine (mooncake.engine, issue 48) in vLLM's shape: the prefill's KV cache
# (registered device memory) written into the decode's (registered device memory) as a
# batch of runs, and each end in host memory instead, beside it.
TE_SHAPES = ((64 << 10, 512), (1 << 20, 128))


def run_te(cuda, proto):
    import mmap
    from mooncake.engine import TransferEngine
    total = max(n * k for n, k in TE_SHAPES)
    target, init = TransferEngine(), TransferEngine()
    out = {}
    try:
        assert target.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "") == 0
        assert init.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "") == 0
        name = f"127.0.0.1:{target.get_rpc_port()}"
        region = mmap.mmap(-1, total)
        t_host = np.frombuffer(region, np.uint8)
        t_dev = cuda.zeros(total)
        src = np.random.default_rng(7).integers(0, 256, total, dtype=np.uint8)
        i_dev = cuda.upload(src)
        zero = np.zeros(total, np.uint8)
        assert target.batch_register_memory([t_host.ctypes.data, t_dev], [total, total]) == 0
        assert init.batch_register_memory([src.ctypes.data, i_dev], [total, total]) == 0
        ends = {"host": (src.ctypes.data, t_host.ctypes.data),
                "device": (i_dev, t_dev)}
        for run, k in TE_SHAPES:
            offs = [i * run for i in range(k)]
            for a, b in (("host", "host"), ("device", "host"), ("host", "device"),
                         ("device", "device")):
                lbase, rbase = ends[a][0], ends[b][1]
                locs = [lbase + o for o in offs]
                rems = [rbase + o for o in offs]
                lens = [run] * k
                # checked once: every byte at the target
                if b == "host":
                    t_host[:] = 0
                else:
                    cuda.check(cuda.lib.cuMemcpyHtoD_v2(t_dev, zero.ctypes.data, total), "HtoD")
                assert init.batch_transfer_sync_write(name, locs, rems, lens) == 0
                got = t_host[:run * k] if b == "host" else cuda.download(t_dev, run * k)
                assert np.array_equal(got, src[:run * k]), f"te {proto} {a}->{b}: wrong bytes"
                key = f"{run / 1024:g}KiBx{k} {a}->{b}"
                out["write " + key] = gbps(run * k, median_time(
                    lambda: init.batch_transfer_sync_write(name, locs, rems, lens)))
                out["read " + key] = gbps(run * k, median_time(
                    lambda: init.batch_transfer_sync_read(name, locs, rems, lens)))
        del t_host
        region.close()
    finally:
        init.close()
        target.close()
    return out


def gpu_name(cuda):
    try:
        get = cuda.lib.cuDeviceGetName
    except AttributeError:  # the test double has none
        return "unknown"
    name = ctypes.create_string_buffer(256)
    get.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    get(name, 256, 0)
    return name.value.decode()


def main():
    global OBJ, N_OBJ, TE_SHAPES
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--objects", type=int, default=N_OBJ, help="objects a batch")
    ap.add_argument("--size", type=int, default=OBJ, help="bytes an object")
    ap.add_argument("--te-shapes", default=None,
                    help="the transfer engine's batches, RUN_BYTES:RUNS,... (default "
                    + ",".join(f"{n}:{k}" for n, k in TE_SHAPES) + ")")
    args = ap.parse_args()
    OBJ, N_OBJ = args.size, args.objects
    if args.te_shapes:
        TE_SHAPES = tuple(tuple(int(x) for x in p.split(":")) for p in args.te_shapes.split(","))
    cuda = _gpu.Cuda()
    cuda.current()
    pool = _fixtures.Pool(segments=("1GiB",))
    try:
        res = {"gpu": gpu_name(cuda), "cpu_count": os.cpu_count(),
               "machine": platform.machine(), "object_bytes": OBJ, "objects": N_OBJ,
               "rounds": ROUNDS, "unit": "GB/s", "limits": limits(cuda, OBJ * N_OBJ)}
        for t in ("shm", "tcp"):
            res[t] = run_transport(pool, cuda, t)
        for t in ("shm", "tcp"):
            res["te_" + t] = run_te(cuda, t)
    finally:
        bad = pool.close()
        cuda.free_all()
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
