"""mooncake.engine's `_on_cuda` forms with CUDA device memory (issue 48): two transfer
engines of this process, initiator and target, on tcp and shm; the initiator's buffers are
device memory, the target's registered host memory. Device -> remote host and remote host
-> device byte-exact (through the library's GPU path: client/transfer/staging.c, staged in
pinned host buffers), a range the target did not register refused (RuntimeError,
KVP_ERR_OUT_OF_RANGE, the target's and the device's bytes intact), a host pointer moved as
Mooncake moves it (whatever address it is given), and the call waits for the caller's
stream first. And a target whose registered memory is device memory (vLLM's KV caches):
host and device -> it and back byte-exact on tcp and shm (not the one-copy path), its
ranges outside refused, a failed device copy there an error while it keeps serving.

Run as tests/gpu/test_gpu_python.py is (tests/gpu/run_gpu_python.sh): in CI's gpu-fake
phase against the test double of the driver (tests/gpu/fake_cuda.c, whose device memory
crashes the process when the CPU touches it), in the `gpu` suite on a real GPU.
"""

import ctypes
import importlib.util
import mmap
import os

import numpy as np
import pytest

from kvpool import _kvpool
from mooncake import engine as engine_mod
from mooncake.engine import TransferEngine

_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location(
    "kvp_gpu_python", os.path.join(_here, "test_gpu_python.py"))
_gpu = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_gpu)

S = _kvpool.STATUS
REGION = 8 << 20
# small, odd, one over the stager's 1 MiB buffers, several of them
SIZES = (1, 4096, 65536 + 13, (1 << 20) + 4097, (3 << 20) + 5)


@pytest.fixture(scope="module")
def cuda():
    c = _gpu.Cuda()
    L = c.lib
    L.cuStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
    L.cuStreamDestroy_v2.argtypes = [ctypes.c_void_p]
    L.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
    L.cuMemcpyHtoDAsync_v2.argtypes = [_gpu.CUdeviceptr, ctypes.c_void_p, ctypes.c_size_t,
                                       ctypes.c_void_p]
    yield c
    c.free_all()


class Pair:
    """A target engine serving REGION bytes of host memory, and an initiator."""

    def __init__(self, proto):
        self.proto = proto
        self.target = TransferEngine()
        assert self.target.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "") == 0
        self.mem = mmap.mmap(-1, REGION)
        self.host = np.frombuffer(self.mem, np.uint8)
        self.base = self.host.ctypes.data
        assert self.target.register_memory(self.base, REGION) == 0
        self.name = f"127.0.0.1:{self.target.get_rpc_port()}"
        self.init = TransferEngine()
        assert self.init.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "") == 0

    def close(self):
        self.init.close()
        self.target.close()
        del self.host
        self.mem.close()


@pytest.fixture(params=["tcp", "shm"])
def pair(request):
    p = Pair(request.param)
    yield p
    p.close()


def pattern(n, seed):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


def layout(sizes, gap=4096):
    """Offsets of sizes in the target's region, gap bytes apart."""
    offs, at = [], gap
    for n in sizes:
        offs.append(at)
        at += n + gap
    assert at <= REGION
    return offs


def test_support_cuda_says_a_driver_loads():
    assert engine_mod.SUPPORT_CUDA is True


def test_device_to_remote_host_and_back(pair, cuda):
    cuda.current()
    srcs = [pattern(n, 10 + i) for i, n in enumerate(SIZES)]
    dev = [cuda.upload(a) for a in srcs]
    offs = layout(SIZES)
    remotes = [pair.base + o for o in offs]
    before = cuda.staged()
    assert pair.init.batch_transfer_write_on_cuda(
        pair.name, dev, remotes, [a.nbytes for a in srcs]) is None
    assert pair.init.last_status == 0
    expect = np.zeros(REGION, np.uint8)
    for o, a in zip(offs, srcs):
        expect[o:o + a.nbytes] = a
    assert np.array_equal(pair.host, expect)  # the ranges, nothing between them
    if before is not None:  # device memory went through the staging copies
        assert cuda.staged()[0] - before[0] >= len(SIZES)
    # remote host -> device: other bytes there first, so the read cannot pass by chance
    for o, a in zip(offs, srcs):
        pair.host[o:o + a.nbytes] = 255 - a
    back = [cuda.zeros(a.nbytes + 64) for a in srcs]
    before = cuda.staged()
    assert pair.init.batch_transfer_read_on_cuda(
        pair.name, back, remotes, [a.nbytes for a in srcs]) is None
    for d, a in zip(back, srcs):
        got = cuda.download(d, a.nbytes + 64)
        assert np.array_equal(got[: a.nbytes], 255 - a)
        assert not got[a.nbytes:].any()  # nothing past the range
    if before is not None:
        assert cuda.staged()[1] - before[1] >= len(SIZES)
    # the single forms
    one = pattern(70000, 99)
    d1 = cuda.upload(one)
    assert pair.init.transfer_write_on_cuda(pair.name, d1, pair.base + 16, one.nbytes) is None
    assert np.array_equal(pair.host[16:16 + one.nbytes], one)
    d2 = cuda.zeros(one.nbytes)
    assert pair.init.transfer_read_on_cuda(pair.name, d2, pair.base + 16, one.nbytes, 0) is None
    assert np.array_equal(cuda.download(d2, one.nbytes), one)
    # the sync form takes device buffers too: the transfer engine stages them in pinned host
    # buffers, which the peer's transport moves (on shm the one-copy path, which reaches the
    # staging buffers, never the device's memory: the fake driver's crashes if the CPU does)
    again = pattern(300000, 77)
    d3 = cuda.upload(again)
    assert pair.init.batch_transfer_sync_write(pair.name, [d3], [pair.base + 8192],
                                               [again.nbytes]) == 0
    assert np.array_equal(pair.host[8192:8192 + again.nbytes], again)
    t = pair.target.metrics()
    assert (t["served_cma_writes"] + t["served_lease_writes"] > 0) == (pair.proto == "shm"), t
    m = pair.init.metrics()
    assert m["writes"] >= len(SIZES) + 1 and m["reads"] >= len(SIZES) + 1 and m["failures"] == 0


def test_out_of_range_remote_refused(pair, cuda):
    cuda.current()
    src = pattern(8192, 5)
    dev = cuda.upload(src)
    pair.host[:] = 7
    refused = pair.target.metrics()["refused_range"]
    for remote in (pair.base + REGION - 4096,  # runs past the end
                   pair.base - 8192):          # before the region
        with pytest.raises(RuntimeError, match="transfer_write_on_cuda.*KVP_ERR_OUT_OF_RANGE"):
            pair.init.transfer_write_on_cuda(pair.name, dev, remote, src.nbytes)
        assert pair.init.last_status == S["KVP_ERR_OUT_OF_RANGE"]
    assert (pair.host == 7).all()  # not a byte of it
    dst = cuda.zeros(8192)
    with pytest.raises(RuntimeError, match="batch_transfer_read_on_cuda.*KVP_ERR_OUT_OF_RANGE"):
        pair.init.batch_transfer_read_on_cuda(pair.name, [dst], [pair.base + REGION - 1], [8192])
    assert not cuda.download(dst, 8192).any()
    assert pair.target.metrics()["refused_range"] >= refused + 3
    # lists of different lengths: RuntimeError, as Mooncake
    with pytest.raises(RuntimeError, match="different size"):
        pair.init.batch_transfer_write_on_cuda(pair.name, [dev, dev], [pair.base], [1, 1])
    assert (pair.host == 7).all()


def test_host_pointer_moves_as_host_memory(pair, cuda):
    """Mooncake's _on_cuda forms move whatever address they are given (its transports
    take host memory): so do these."""
    cuda.current()
    src = pattern(100000, 3)
    assert pair.init.transfer_write_on_cuda(pair.name, src.ctypes.data, pair.base + 100,
                                            src.nbytes) is None
    assert np.array_equal(pair.host[100:100 + src.nbytes], src)
    out = np.zeros(src.nbytes, np.uint8)
    pair.init.batch_transfer_read_on_cuda(pair.name, [out.ctypes.data], [pair.base + 100],
                                          [src.nbytes])
    assert np.array_equal(out, src)
    # device and host ranges in one batch
    a, b = pattern(5000, 1), pattern(6000, 2)
    da = cuda.upload(a)
    pair.init.batch_transfer_write_on_cuda(pair.name, [da, b.ctypes.data],
                                           [pair.base + 200000, pair.base + 300000],
                                           [a.nbytes, b.nbytes])
    assert np.array_equal(pair.host[200000:205000], a)
    assert np.array_equal(pair.host[300000:306000], b)


def test_waits_for_the_callers_stream(pair, cuda):
    """What the caller's stream wrote to the device is what moves: the library waits for
    the stream before it copies (the test double runs each queued copy after a delay)."""
    cuda.current()
    L = cuda.lib
    stream = ctypes.c_void_p()
    cuda.check(L.cuStreamCreate(ctypes.byref(stream), 0), "cuStreamCreate")
    try:
        n = 1 << 20
        dev = cuda.zeros(n)
        fresh = pattern(n, 42)
        # on the test double, each queued copy runs 300 ms late (the library's staging
        # copies too, on their own streams: without the wait they would still overtake it)
        if cuda.fake:
            L.fake_cuda_set_delay_us.argtypes = [ctypes.c_uint]
            L.fake_cuda_set_delay_us(300000)
        try:
            cuda.check(L.cuMemcpyHtoDAsync_v2(dev, fresh.ctypes.data, n, stream),
                       "cuMemcpyHtoDAsync_v2")
            pair.init.transfer_write_on_cuda(pair.name, dev, pair.base, n, stream.value)
        finally:
            if cuda.fake:
                L.fake_cuda_set_delay_us(0)
        assert np.array_equal(pair.host[:n], fresh)
        # the default stream (0) is waited for in the current context
        if cuda.fake:
            before = L.fake_cuda_counter(b"default_syncs")
            pair.init.transfer_write_on_cuda(pair.name, dev, pair.base, 1)
            assert L.fake_cuda_counter(b"default_syncs") == before + 1
    finally:
        L.cuStreamSynchronize(stream)
        L.cuStreamDestroy_v2(stream)


@pytest.mark.parametrize("proto", ["tcp", "shm"])
def test_device_memory_registered_on_the_target(cuda, proto):
    """vLLM's connector registers its KV caches, device memory, on both sides: the target
    serves its registered device memory through pinned staging (a host or device initiator
    buffer, write and read, byte-exact, ranges outside refused with its bytes intact); on
    shm the one-copy path cannot reach it and the socket frames carry it."""
    cuda.current()
    n = (2 << 20) + 12345  # over two of the target's 1 MiB staging chunks
    target, init = TransferEngine(), TransferEngine()
    try:
        assert target.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "") == 0
        assert init.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "") == 0
        kv = cuda.zeros(n)
        assert target.register_memory(kv, n) == 0
        name = f"127.0.0.1:{target.get_rpc_port()}"
        assert init.get_first_buffer_address(name) == kv
        # host -> the target's device memory (the sync form, as the connector calls it)
        a = pattern(n, 21)
        assert init.batch_transfer_sync_write(name, [a.ctypes.data], [kv], [n]) == 0
        assert np.array_equal(cuda.download(kv, n), a)
        # device -> the target's device memory, in pieces, with the CUDA form
        b = pattern(n, 22)
        src = cuda.upload(b)
        cut = [0, 4096, 1 << 20, n]
        init.batch_transfer_write_on_cuda(name, [src + s for s in cut[:-1]],
                                          [kv + s for s in cut[:-1]],
                                          [e - s for s, e in zip(cut, cut[1:])])
        assert np.array_equal(cuda.download(kv, n), b)
        # the target's device memory -> host and -> device
        h = np.zeros(n, np.uint8)
        assert init.transfer_sync_read(name, h.ctypes.data, kv, n) == 0
        assert np.array_equal(h, b)
        d = cuda.zeros(n)
        init.transfer_read_on_cuda(name, d, kv + 0, n)
        assert np.array_equal(cuda.download(d, n), b)
        # outside what it registered: refused, its bytes intact
        assert init.transfer_sync_write(name, a.ctypes.data, kv + n - 10, 4096) == -1
        assert init.last_status == S["KVP_ERR_OUT_OF_RANGE"]
        assert np.array_equal(cuda.download(kv, n), b)
        m = target.metrics()
        assert m["served_cma_writes"] == 0 and m["served_cma_reads"] == 0
        assert m["served_writes"] >= 4 and m["served_reads"] >= 2 and m["refused_range"] >= 1
        assert target.unregister_memory(kv) == 0
        assert init.transfer_sync_write(name, a.ctypes.data, kv, 1) == -1
    finally:
        init.close()
        target.close()


@pytest.mark.parametrize("proto", ["tcp", "shm"])
def test_many_small_runs_into_a_targets_device_and_host_memory(cuda, proto):
    """vLLM's block writes: many runs of 64 KiB and odd sizes in one batch, to places of a
    target's registered device memory and of its host memory in turn, so that one request
    carries both and the target's staging packs many runs into one pinned buffer (more
    bytes than its two buffers hold: they are reused); written, then read back into host
    memory and into device memory, byte-exact, the bytes between the runs untouched."""
    cuda.current()
    n = 8 << 20
    target, init = TransferEngine(), TransferEngine()
    try:
        assert target.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "") == 0
        assert init.initialize("127.0.0.1", "P2PHANDSHAKE", proto, "") == 0
        kv = cuda.zeros(n)
        mem = mmap.mmap(-1, n)
        host = np.frombuffer(mem, np.uint8)
        assert target.batch_register_memory([kv, host.ctypes.data], [n, n]) == 0
        name = f"127.0.0.1:{target.get_rpc_port()}"
        sizes = [65536, 1, 4097, 65536 + 13, 300001, 65536, 7] * 8 + [(3 << 20) + 5]
        offs = layout(sizes, gap=513)
        src = pattern(sum(sizes), 41)
        at = np.cumsum([0] + sizes)
        locs = [src.ctypes.data + int(a) for a in at[:-1]]
        rems = [(kv if i % 2 == 0 else host.ctypes.data) + o for i, o in enumerate(offs)]
        assert init.batch_transfer_sync_write(name, locs, rems, sizes) == 0
        dev_img = cuda.download(kv, n)
        want_dev, want_host = np.zeros(n, np.uint8), np.zeros(n, np.uint8)
        for i, (o, k) in enumerate(zip(offs, sizes)):
            (want_dev if i % 2 == 0 else want_host)[o:o + k] = src[at[i]:at[i] + k]
        assert np.array_equal(dev_img, want_dev)
        assert np.array_equal(host, want_host)
        # read back: into host memory, then into device memory
        back = np.zeros_like(src)
        blocs = [back.ctypes.data + int(a) for a in at[:-1]]
        assert init.batch_transfer_sync_read(name, blocs, rems, sizes) == 0
        assert np.array_equal(back, src)
        d = cuda.zeros(src.nbytes)
        init.batch_transfer_read_on_cuda(name, [d + int(a) for a in at[:-1]], rems, sizes)
        assert np.array_equal(cuda.download(d, src.nbytes), src)
        del host
        mem.close()
    finally:
        init.close()
        target.close()


def test_target_device_copy_failure_is_an_error_and_it_keeps_serving(cuda):
    """On the test double: the target's copy to its device fails (as a driver fault):
    the write is KVP_ERR_IO at the initiator, and the next one is served byte-exact."""
    if not cuda.fake:
        pytest.skip("needs the test double of the driver to fail a copy")
    cuda.current()
    L = cuda.lib
    L.fake_cuda_fail_copy.argtypes = [ctypes.c_long, ctypes.c_int]
    n = 1 << 20
    target, init = TransferEngine(), TransferEngine()
    try:
        assert target.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        assert init.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        kv = cuda.zeros(n)
        assert target.register_memory(kv, n) == 0
        name = f"127.0.0.1:{target.get_rpc_port()}"
        a = pattern(n, 31)
        L.fake_cuda_fail_copy(1, 700)  # CUDA_ERROR_ILLEGAL_ADDRESS, the next copy issued
        try:
            assert init.transfer_sync_write(name, a.ctypes.data, kv, n) == -1
        finally:
            L.fake_cuda_fail_copy(0, 0)
        assert init.last_status == S["KVP_ERR_IO"]
        assert init.transfer_sync_write(name, a.ctypes.data, kv, n) == 0
        assert np.array_equal(cuda.download(kv, n), a)
    finally:
        init.close()
        target.close()
